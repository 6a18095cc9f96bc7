"""Throughput benchmarks (``make bench`` / ``python -m hbfjax.bench``).

Each module ``hbfjax/bench/<name>.py`` exposes ``run(scale: float) -> list[dict]``: rows with at least
``benchmark``, ``events``, ``unit``, ``compile_s``, ``run_s``, ``events_per_s``, ``reference_events_per_s``
and ``speedup_vs_reference`` (the same work done by a plain NumPy/Python reference in the same run).
"""
