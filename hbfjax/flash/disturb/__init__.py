"""Read disturb and refresh (issue 26): per-block read counters, read reclaim and time-based refresh.

``reclaim`` (the mechanism for one stream: counters, relocation, refresh, plane time, ``simulate`` for
``hbfjax.batch.run``) and ``reference`` (a sequential NumPy version of the same step, for the tests);
``counters`` (per-block counters of blocks whose data dies, the serving engine's KV blocks on sampled
planes) and ``cohorts`` (one counter per cohort of blocks written, read and dead together: a request's KV).
"""
