"""A straightforward sequential NumPy/Python GC simulator: the baseline ``hbfjax.bench.gc`` times.

Same policy as ``gc_overwrite`` (log-structured append, free pool kept at a reserve, victim by
greedy / FIFO / random), one host write at a time, one victim at a time — the way a simple
single-threaded FTL simulator is written. Also a cross-check of the batched WAF in the tests.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np


def overwrite_waf(n_blocks: int, pages_per_block: int, logical_pages: int, victim: str, host_writes: int,
                  warmup_writes: int, reserve_blocks: int = 3, seed: int = 0) -> dict:
    """Uniform overwrites after a sequential fill; returns measured host writes, migrations, WAF and the
    wall time of the measured (post-warm-up) writes, ``measured_s``."""
    b, k = n_blocks, pages_per_block
    rs = np.random.default_rng(seed)
    owner = np.full((b, k), -1, np.int64)
    valid = np.zeros(b, np.int64)
    opened = np.zeros(b, np.int64)
    closed = np.zeros(b, bool)
    free = deque(range(b))
    l2p = np.zeros(logical_pages, np.int64)
    state = {"blk": -1, "ptr": k, "n_opened": 0, "migrated": 0}

    def program(tag: int) -> int:
        if state["ptr"] == k:
            if state["blk"] >= 0:
                closed[state["blk"]] = True
            blk = free.popleft()
            state["blk"], state["ptr"] = blk, 0
            opened[blk] = state["n_opened"]
            state["n_opened"] += 1
        blk, ptr = state["blk"], state["ptr"]
        owner[blk, ptr] = tag
        valid[blk] += 1
        state["ptr"] += 1
        return blk * k + ptr

    def collect() -> None:
        if victim == "greedy":
            v = int(np.argmin(np.where(closed, valid, k + 1)))
        elif victim == "fifo":
            v = int(np.argmin(np.where(closed, opened, np.iinfo(np.int64).max)))
        else:
            v = int(rs.choice(np.flatnonzero(closed)))
        for tag in owner[v][owner[v] >= 0]:
            l2p[tag] = program(int(tag))
            state["migrated"] += 1
        owner[v] = -1
        valid[v] = 0
        closed[v] = False
        free.append(v)

    for lp in range(logical_pages):
        l2p[lp] = program(lp)
    migrated0 = 0
    pages = rs.integers(0, logical_pages, size=warmup_writes + host_writes)
    t_measure = time.perf_counter()
    for i, lp in enumerate(pages):
        if i == warmup_writes:
            migrated0 = state["migrated"]
            t_measure = time.perf_counter()
        while len(free) < reserve_blocks:
            collect()
        old = l2p[lp]
        owner[old // k, old % k] = -1
        valid[old // k] -= 1
        l2p[lp] = program(int(lp))
    migrated = state["migrated"] - migrated0
    return {"host_writes": host_writes, "migrated_pages": migrated, "waf": (host_writes + migrated) / host_writes,
            "measured_s": time.perf_counter() - t_measure}
