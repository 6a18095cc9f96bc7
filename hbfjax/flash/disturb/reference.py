"""A sequential NumPy reference of the read-disturb / refresh mechanism (``reclaim``), for the tests.

Written from the mechanism's description, not from the vectorised engine: plain loops over blocks,
one move at a time, a dict of NumPy arrays for the state (the engine's ``DisturbState`` field names,
so a test compares them field by field). No JAX: ``config`` and ``knobs`` are read by attribute
(``reclaim.DisturbConfig`` and ``reclaim.DisturbKnobs`` work, their leaves through ``np.asarray``).

One step (boundary ``now = step + 1`` after the step's reads):

1. each data block's reads go to its physical block's counter;
2. scan the blocks in address order: a held block whose counter is >= N is due for relocation; else
   one whose age ``now − written`` is >= the refresh interval in steps is due for refresh;
3. the erased blocks of each group (a plane, or the whole device under the least-worn policy) are
   listed by (erases, index) *as they are before the step's moves*; the due blocks take them in
   order, relocations first (address order), then refreshes (address order); a due block whose group
   has no erased block left waits (deferred);
4. each move copies the valid pages (a read on the source plane, a program on the destination plane),
   sets the destination's counter to ``count − N`` (relocation) or 0 (refresh) and its program time
   to ``now``, and erases the source.
"""

from __future__ import annotations

import numpy as np

FIELDS = ("data_of", "valid_pages", "read_count", "written_step", "erases", "step", "relocations", "refreshes",
          "relocated_pages", "refresh_pages", "read_pages", "prog_pages", "deferred_moves")


def _knob(knobs, name):
    return np.asarray(getattr(knobs, name))


def refresh_interval_steps(knobs, config) -> float:
    """The refresh interval in whole steps, ⌈T / step_s⌉ (a ratio within a relative 2^-18 above a whole
    number counts as that number); inf when off."""
    hours = float(_knob(knobs, "refresh_hours"))
    if hours <= 0:
        return float("inf")
    return float(np.ceil(hours * 3600.0 / config.step_s * (1.0 - 2.0**-18)))


def init_state(config, knobs, start_counters=None, start_written=None) -> dict:
    """The device at time 0: data block d in its home block (plane d mod P, slot d div P) with K valid
    pages. Counters and last-program boundaries per data block are 0 (a fresh device) unless given
    (the engine's steady start hashes them; the reference takes them as given)."""
    p, bp, n = config.planes, config.blocks_per_plane, config.data_blocks
    b = p * bp
    k = int(_knob(knobs, "pages_per_block"))
    st = {"data_of": np.full(b, -1, np.int64), "valid_pages": np.zeros(b, np.int64),
          "read_count": np.zeros(b, np.int64), "written_step": np.zeros(b, np.int64), "erases": np.zeros(b, np.int64),
          "step": 0, "relocations": 0, "refreshes": 0, "relocated_pages": 0, "refresh_pages": 0, "host_reads": 0,
          "read_pages": np.zeros(p, np.int64), "prog_pages": np.zeros(p, np.int64), "rewrite_wall_us": 0.0,
          "deferred_moves": 0}
    for d in range(n):
        home = (d % p) * bp + d // p
        st["data_of"][home] = d
        st["valid_pages"][home] = k
        if start_counters is not None:
            st["read_count"][home] = int(start_counters[d])
        if start_written is not None:
            st["written_step"][home] = int(start_written[d])
    return st


def step(state: dict, reads, knobs, config) -> dict:
    """One step of the mechanism (a new dict; ``state`` is not changed)."""
    st = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in state.items()}
    p, bp = config.planes, config.blocks_per_plane
    b = p * bp
    n_thr = int(_knob(knobs, "threshold_reads"))
    anywhere = int(_knob(knobs, "destination")) == 1
    t_read, t_prog = float(_knob(knobs, "t_read_us")), float(_knob(knobs, "t_prog_us"))
    ts = refresh_interval_steps(knobs, config)
    now = st["step"] + 1

    for i in range(b):  # 1. reads
        d = st["data_of"][i]
        if d >= 0:
            st["read_count"][i] += int(reads[d])
    st["host_reads"] += int(np.sum(reads))

    relocate, refresh = [], []  # 2. due blocks, address order
    for i in range(b):
        if st["data_of"][i] < 0:
            continue
        if st["read_count"][i] >= n_thr:
            relocate.append(i)
        elif now - st["written_step"][i] >= ts:
            refresh.append(i)

    group = (lambda i: 0) if anywhere else (lambda i: i // bp)
    pools: dict[int, list[int]] = {}  # 3. erased blocks per group, least-worn first, before any move
    for i in sorted((i for i in range(b) if st["data_of"][i] < 0), key=lambda i: (st["erases"][i], i)):
        pools.setdefault(group(i), []).append(i)
    taken: dict[int, int] = {}
    moves = []
    for kind, blocks in (("relocate", relocate), ("refresh", refresh)):
        for i in blocks:
            g = group(i)
            pool = pools.get(g, [])
            if taken.get(g, 0) < len(pool):
                moves.append((kind, i, pool[taken.get(g, 0)]))
                taken[g] = taken.get(g, 0) + 1
            else:
                st["deferred_moves"] += 1

    before = {k: st[k].copy() for k in ("data_of", "valid_pages", "read_count")}
    read_now, prog_now = np.zeros(p, np.int64), np.zeros(p, np.int64)
    for kind, src, dst in moves:  # 4. copy, erase
        v = int(before["valid_pages"][src])
        st["data_of"][dst] = before["data_of"][src]
        st["valid_pages"][dst] = v
        st["read_count"][dst] = before["read_count"][src] - n_thr if kind == "relocate" else 0
        st["written_step"][dst] = now
        st["data_of"][src], st["valid_pages"][src], st["read_count"][src] = -1, 0, 0
        st["erases"][src] += 1
        read_now[src // bp] += v
        prog_now[dst // bp] += v
        if kind == "relocate":
            st["relocations"] += 1
            st["relocated_pages"] += v
        else:
            st["refreshes"] += 1
            st["refresh_pages"] += v
    st["read_pages"] += read_now
    st["prog_pages"] += prog_now
    st["rewrite_wall_us"] += float(np.max(read_now * t_read + prog_now * t_prog))
    st["step"] = now
    return st


def run(state: dict, reads_per_step, knobs, config) -> list[dict]:
    """The states after each step of ``reads_per_step`` (an iterable of per-data-block read counts)."""
    states = []
    for reads in reads_per_step:
        state = step(state, reads, knobs, config)
        states.append(state)
    return states


def valid_pages_of_data(state: dict, config) -> np.ndarray:
    """Valid pages of each data block (where it is held now): conserved by every move."""
    out = np.zeros(config.data_blocks, np.int64)
    for i, d in enumerate(state["data_of"]):
        if d >= 0:
            out[d] += state["valid_pages"][i]
    return out
