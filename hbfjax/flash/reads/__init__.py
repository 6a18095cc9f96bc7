"""Reads: how a read's pages collide on planes (HBFlex §3.1, §5.2, §6.4–6.5).

``collide`` (placement, plane loads, hot-plane offload, one read), ``workingset`` (attention reads of an
active KV working set), ``analytic`` (exact balls-into-bins maximum load), ``reference`` (plain NumPy).
"""
