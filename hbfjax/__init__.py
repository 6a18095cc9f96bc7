"""hbfjax: batched, compiled, differentiable Monte Carlo of High-Bandwidth Flash memory for LLM inference.

Layers (DESIGN.md §2): ``flash`` (physics), ``batch`` (vmap/shard over streams and knob points),
``cli`` (the ``hbfjax`` command). Hardware presets live in ``hardware``.
"""

__version__ = "0.1.0"
