"""hbfjax: batched, compiled, differentiable Monte Carlo of High-Bandwidth Flash memory for LLM inference.

Layers (DESIGN.md §2), bottom up: base modules (``rng``, ``salts``, ``clock``, ``hardware``, ``validate``,
``stats``, ``relax``, ``invariants``); ``flash`` (HBF physics: reads, programs, erase); ``memory`` (HBM,
links, SRAM, delivery paths, organisations as data); ``workload`` (models, GPU timing, routing,
requests, traces); ``serve`` (the engine of parts and the named systems); ``batch`` and ``cluster``
(vmap/shard over streams and knob points, processes); ``tune`` (gradient tuning); ``sweep`` (grids,
tables, capacity search, the serving drivers); the front: ``cli``, ``commands``, ``bench``.
"""

__version__ = "0.1.0"
