"""Read disturb, read reclaim and time-based refresh of one HBF stream (issue 26), written for one stream.

Every read of a NAND page disturbs the other pages of its block, so a block that has been read many
times must be rewritten elsewhere (*read reclaim*); data must also be rewritten periodically against
retention loss (*refresh*). The OCP HBF specification v0.7 (2026-08) asks the host to refresh every
24–48 h and after a product-specific read count; the public artifact cited in issue 26 reclaims a
block after 10^6 reads and budgets 10^5 P/E cycles per block. Those are this module's sources
(``SOURCES``); anything else is marked *assumed*.

The device of one stream: ``planes`` planes of ``blocks_per_plane`` physical blocks each (block ``i`` on
plane ``i // blocks_per_plane``); ``data_blocks`` of them hold data (of any kind: the mechanism only
sees reads per block), the others are erased and form each plane's finite pool of fresh blocks. Data
block ``d`` starts on plane ``d % planes`` (round robin). One ``step`` covers ``step_s`` seconds:

1. **reads**: ``reads_this_step[d]`` page reads of data block ``d`` add to the read counter of the
   physical block that holds it (a read of any page counts for its block);
2. **due blocks**: a block whose counter has reached the threshold ``N`` is due for relocation; a
   block whose last program is ``refresh_hours`` or more ago is due for refresh (relocation first);
3. **moves**: every due block takes a fresh block, in priority order (relocations before refreshes,
   each in block-address order, as an FTL's patrol scan; assumed): the least-worn erased block (fewest
   erases, then lowest index) on *its own plane* (``destination = 0``) or *anywhere* (``1``). Its valid
   pages are read on the source plane (tR each) and programmed on the destination plane (tPROG each),
   the old block is erased (+1 erase) and joins the pool at the end of the step. A relocated block's
   counter starts at ``count − N`` (the reads after the threshold crossing fall on the new block, so the
   long-run relocation rate is exactly reads / N whatever the step); a refreshed one starts at 0. A
   due block that finds no fresh block in its group waits for the next step (``deferred_moves``);
4. **time**: a plane reads and programs one page per page-round, planes in parallel: a step's
   rewrites occupy each plane ``read_pages × tR + prog_pages × tPROG`` and the step's wall time is the
   busiest plane's (``rewrite_wall_us``).

Static (``DisturbConfig``, part of jit's cache key): the geometry (it sets array shapes), the step
length and count (the scan), the read workload's law and the starting state. Traced
(``DisturbKnobs``): the threshold, the refresh interval, pages per block (only a count: no array has
a page axis), the destination policy, tR, tPROG and the read workload's rate and per-block shares, so
a sweep over any of them is one compilation (``batch.stack_knobs``). Counts are integers; the times
are linear in tR and tPROG and differentiable in reverse mode (``jax.grad`` through the scan).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum, unique
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.validate import INT32_MAX, require, require_choice, require_int, require_real

WORKLOADS = ("poisson", "deterministic")  # Poisson page reads per block and step | a constant rate
STARTS = ("steady", "fresh")  # counters and ages of a device in use (assumed) | just programmed, counters 0
DESTINATIONS = ("same-plane", "least-worn")  # the traced flag's value is the index
SAME_PLANE, LEAST_WORN = 0, 1
RELOCATE, REFRESH, IDLE = 0, 1, 2  # what a physical block is due for (the order is the move priority)
MAX_PHYSICAL_BLOCKS = 2**24
MAX_READS_PER_STEP = 2**30  # total page reads of one step: every int32 sum of them fits
WIDE_BITS = 20  # the host-read total is kept as int32 (hi, lo) with lo < 2^20: no int32 wrap over long runs
SECONDS_PER_HOUR = 3600.0
REFRESH_SNAP = 2.0**-18  # relative tolerance of the refresh interval's rounding to whole steps
POISSON_EXACT_MEAN = 24.0  # Poisson draws by inverse CDF up to this mean, a rounded normal above it
POISSON_TERMS = 64  # inverse-CDF terms: P(X > 64 | mean 24) < 1e-11

DEFAULT_THRESHOLD_READS = 1_000_000
DEFAULT_PE_CYCLES = 100_000
OCP_REFRESH_HOURS = (24.0, 48.0)
SOURCES = {
    "threshold_reads": "issue 26: a public artifact models HBF read reclaim after 10^6 reads per block",
    "pe_cycles": "issue 26: the same artifact's 10^5 P/E cycles (as HBFlex §3.3's 100K budget, hardware.py)",
    "refresh_hours": "OCP HBF specification v0.7 (2026-08): the host refreshes every 24–48 h (off unless given)",
    "pages_per_block": "hbflex preset (HBFlex §3: 512 pages per block)",
    "t_read_us": "hbflex preset (HBFlex §3: tR 4 µs)",
    "t_prog_us": "hbflex preset (HBFlex §3: tPROG 75 µs)",
    "destination": "assumed: the least-worn erased block anywhere (dynamic wear levelling)",
    "start": "assumed: a device in use, each block at a uniform phase of its rewrite cycle (renewal, N ≫ 1)",
}


@unique
class DisturbSalt(IntEnum):
    """Hash salts of this module's draws. ``hbfjax.salts.Salt`` is the registry; these values are free
    there (checked below, at import) and belong in it: moving them with the same values keeps every result."""

    READS_U = 160  # uniform of data block d's Poisson reads in step s (words: step, block)
    READS_ANGLE = 161  # its normal approximation's second hash (same words)
    START_COUNTER = 162  # a steady start's read counter of data block d (words: block)


if {int(s) for s in DisturbSalt} & {int(s) for s in Salt}:  # pragma: no cover - an import-time guard
    raise RuntimeError("hbfjax.flash.disturb.reclaim: a DisturbSalt value is already a hbfjax.salts.Salt value")


@dataclass(frozen=True)
class DisturbConfig:
    """Static geometry, run length and workload law of one stream (sets shapes and the scan)."""

    planes: int  # P
    blocks_per_plane: int  # physical blocks per plane, data and erased
    data_blocks: int  # L: blocks holding data; the other P × blocks_per_plane − L are the erased pool
    step_s: float  # seconds per step (reads, then moves)
    steps: int  # steps per run
    workload: str = "poisson"  # poisson | deterministic (reads per block and step)
    start: str = "steady"  # steady | fresh

    def __post_init__(self) -> None:
        c = type(self).__name__
        for name, lo in (("planes", 1), ("blocks_per_plane", 2), ("data_blocks", 1), ("steps", 1)):
            object.__setattr__(self, name, require_int(c, name, getattr(self, name), lo))
        object.__setattr__(self, "step_s", require_real(c, "step_s", self.step_s, 0.0, lo_open=True))
        require(self.physical_blocks <= MAX_PHYSICAL_BLOCKS, c, "blocks_per_plane", self.blocks_per_plane,
                f"planes × blocks_per_plane must be <= {MAX_PHYSICAL_BLOCKS} (int32 block indices)")
        most = self.planes * (self.blocks_per_plane - 1)
        require(self.data_blocks <= most, c, "data_blocks", self.data_blocks,
                f"must be <= planes × (blocks_per_plane − 1) = {most}: every plane keeps an erased block to "
                "relocate into")
        require((self.steps + 1) * self.physical_blocks <= INT32_MAX, c, "steps", self.steps,
                f"(steps + 1) × physical blocks ({self.physical_blocks}) must be <= {INT32_MAX} (the int32 sort "
                "keys of the erased pool); use fewer, longer steps")
        require_choice(c, "workload", self.workload, WORKLOADS)
        require_choice(c, "start", self.start, STARTS)

    @property
    def physical_blocks(self) -> int:
        return self.planes * self.blocks_per_plane

    @property
    def free_blocks(self) -> int:
        return self.physical_blocks - self.data_blocks

    @property
    def simulated_s(self) -> float:
        return self.steps * self.step_s

    def home_block(self, d):
        """Physical block that data block ``d`` starts in: plane ``d % P``, slot ``d // P``."""
        return (d % self.planes) * self.blocks_per_plane + d // self.planes


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DisturbKnobs:
    """Traced values of the mechanism and its read workload (sweeping them never recompiles). L = data blocks."""

    threshold_reads: jax.Array  # int32[] N: a block whose read counter reaches N is relocated
    refresh_hours: jax.Array  # float32[] T: a block not programmed for T hours is rewritten; 0 = refresh off
    pages_per_block: jax.Array  # int32[] K: valid pages of each data block, the pages one rewrite copies
    destination: jax.Array  # int32[] 0 = least-worn erased block of the same plane, 1 = least-worn anywhere
    t_read_us: jax.Array  # float32[] tR of one page read (one page-round of a plane)
    t_prog_us: jax.Array  # float32[] tPROG of one page program
    reads_per_s: jax.Array  # float32[] host page reads per second over the stream's data blocks
    read_share: jax.Array  # float32[L] fraction of those reads that goes to each data block (sums to 1)

    @classmethod
    def make(cls, config: DisturbConfig, *, threshold_reads=DEFAULT_THRESHOLD_READS, refresh_hours=0.0,
             pages_per_block=512, destination="least-worn", t_read_us=4.0, t_prog_us=75.0, reads_per_s=0.0,
             read_share=None) -> "DisturbKnobs":
        """Validated knobs; ``read_share`` (default uniform) is normalised to sum 1, ``destination`` is a
        name of ``DESTINATIONS`` or its index."""
        c = cls.__name__
        n = require_int(c, "threshold_reads", threshold_reads, 1, MAX_READS_PER_STEP)
        t = require_real(c, "refresh_hours", refresh_hours, 0.0)
        require(t == 0.0 or t * SECONDS_PER_HOUR >= config.step_s, c, "refresh_hours", refresh_hours,
                f"must be 0 (off) or at least one step ({config.step_s:g} s)")
        k = require_int(c, "pages_per_block", pages_per_block, 1)
        moves = config.steps * config.free_blocks  # a step moves at most one block per erased block
        require(moves * k <= INT32_MAX, c, "pages_per_block", pages_per_block,
                f"steps × erased blocks × pages_per_block = {moves} × {k} rewrite pages at most must be "
                f"<= {INT32_MAX} (int32 page counters)")
        if isinstance(destination, str):
            destination = DESTINATIONS.index(require_choice(c, "destination", destination, DESTINATIONS))
        dest = require_int(c, "destination", destination, 0, 1)
        tr = require_real(c, "t_read_us", t_read_us, 0.0, lo_open=True)
        tp = require_real(c, "t_prog_us", t_prog_us, 0.0, lo_open=True)
        rate = require_real(c, "reads_per_s", reads_per_s, 0.0)
        require(rate * config.step_s <= MAX_READS_PER_STEP, c, "reads_per_s", reads_per_s,
                f"reads per step (reads_per_s × step_s {config.step_s:g} s) must be <= {MAX_READS_PER_STEP}")
        share = np.full(config.data_blocks, 1.0 / config.data_blocks) if read_share is None else \
            np.asarray(read_share, np.float64)
        require(share.shape == (config.data_blocks,), c, "read_share", share.shape,
                f"must hold one share per data block ({config.data_blocks})")
        require(bool(np.all(np.isfinite(share)) and np.all(share >= 0) and share.sum() > 0), c, "read_share",
                "…", "shares must be finite, >= 0 and not all 0")
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
        return cls(threshold_reads=i32(n), refresh_hours=f32(t), pages_per_block=i32(k), destination=i32(dest),
                   t_read_us=f32(tr), t_prog_us=f32(tp), reads_per_s=f32(rate),
                   read_share=f32(share / share.sum()))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DisturbState:
    """One stream's blocks and totals. B = planes × blocks_per_plane physical blocks, L = data blocks,
    P = planes. Times are step boundaries: boundary ``s`` is ``s × step_s`` seconds."""

    data_of: jax.Array  # int32[B] data block held by each physical block; −1 = erased (in the pool)
    valid_pages: jax.Array  # int32[B] valid pages of each physical block (0 when erased)
    read_count: jax.Array  # int32[B] page reads since the block was programmed (the read-disturb counter)
    written_step: jax.Array  # int32[B] boundary at which the block was last programmed (≤ 0 before the run)
    erases: jax.Array  # int32[B] erase count of each physical block
    step: jax.Array  # int32[] steps done
    reads_hi: jax.Array  # int32[] host page reads ÷ 2^WIDE_BITS
    reads_lo: jax.Array  # int32[] host page reads mod 2^WIDE_BITS
    relocations: jax.Array  # int32[] read-disturb relocations done
    refreshes: jax.Array  # int32[] refresh rewrites done
    relocated_pages: jax.Array  # int32[] valid pages copied by relocations (each a read and a program)
    refresh_pages: jax.Array  # int32[] valid pages copied by refreshes
    read_pages: jax.Array  # int32[P] rewrite page reads on each plane (source planes)
    prog_pages: jax.Array  # int32[P] rewrite page programs on each plane (destination planes)
    rewrite_wall_us: jax.Array  # float32[] Σ over steps of the busiest plane's rewrite time
    deferred_moves: jax.Array  # int32[] Σ over steps of due blocks that found no erased block in their group


def refresh_steps(knobs: DisturbKnobs, config: DisturbConfig) -> jax.Array:
    """float32[] the refresh interval in whole steps, ⌈T / step_s⌉ (a block is due once its age reaches
    T); +inf when refresh is off (``refresh_hours = 0``). A ratio within a relative 2^-18 above a whole
    number counts as that number: float32 rounding (XLA divides by a constant as a multiplication by its
    reciprocal) never adds a step to 24 h / 60 s."""
    t = knobs.refresh_hours * SECONDS_PER_HOUR / jnp.float32(config.step_s)
    return jnp.where(knobs.refresh_hours > 0, jnp.ceil(t * (1.0 - REFRESH_SNAP)), jnp.inf)


def init_state(words: tuple, knobs: DisturbKnobs, config: DisturbConfig) -> DisturbState:
    """The device at time 0: data block d in its home block with K valid pages, the rest erased.

    ``fresh``: every counter 0, every block programmed at 0. ``steady`` (assumed: a device in use, each
    block at a uniform phase of its rewrite cycle, the stationary law of a renewal process with N ≫ 1):
    c_d uniform on {0, …, N − 1} (hashed from ``words``), u = c_d / N; a block read at λ_d pages per step
    is rewritten every min(N / λ_d, T_steps) steps. If N / λ_d ≤ T_steps (relocation first, or refresh
    off) its counter is c_d and its age c_d / λ_d steps; else its age is u · T_steps and its counter
    ⌊u · λ_d · T_steps⌋ (< N). With refresh off every age is 0 (it matters for nothing).
    """
    b, n_data = config.physical_blocks, config.data_blocks
    d = jnp.arange(n_data, dtype=jnp.int32)
    home = config.home_block(d)
    if config.start == "steady":
        n = knobs.threshold_reads
        c = rng.below(rng.mix(*words, d, DisturbSalt.START_COUNTER), n).astype(jnp.int32)
        u = c.astype(jnp.float32) / n.astype(jnp.float32)
        lam = knobs.reads_per_s * knobs.read_share * jnp.float32(config.step_s)  # reads per step
        ts = refresh_steps(knobs, config)
        refresh_on = jnp.isfinite(ts)
        interval = jnp.where(refresh_on, ts, 0.0)
        relocation_first = ~refresh_on | (lam * interval >= n.astype(jnp.float32))
        count = jnp.where(relocation_first, c, jnp.floor(u * lam * interval).astype(jnp.int32))
        age = jnp.where(relocation_first, c.astype(jnp.float32) / jnp.maximum(lam, 1e-30), u * interval)
        written = -jnp.floor(jnp.where(refresh_on, age, 0.0)).astype(jnp.int32)
    else:
        count = jnp.zeros(n_data, jnp.int32)
        written = jnp.zeros(n_data, jnp.int32)
    zeros_b = jnp.zeros(b, jnp.int32)
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return DisturbState(
        data_of=jnp.full(b, -1, jnp.int32).at[home].set(d),
        valid_pages=zeros_b.at[home].set(knobs.pages_per_block), read_count=zeros_b.at[home].set(count),
        written_step=zeros_b.at[home].set(written), erases=zeros_b, step=i32(0), reads_hi=i32(0), reads_lo=i32(0),
        relocations=i32(0), refreshes=i32(0), relocated_pages=i32(0), refresh_pages=i32(0),
        read_pages=jnp.zeros(config.planes, jnp.int32), prog_pages=jnp.zeros(config.planes, jnp.int32),
        rewrite_wall_us=jnp.float32(0), deferred_moves=i32(0))


def add_wide(hi: jax.Array, lo: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(hi, lo) + n for a total kept as hi · 2^WIDE_BITS + lo (n ≤ 2^30: lo + n never wraps int32)."""
    lo = lo + n
    return hi + (lo >> WIDE_BITS), lo & ((1 << WIDE_BITS) - 1)


def wide_value(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """float32 value of a wide total (relative error ≤ 6e-8)."""
    return hi.astype(jnp.float32) * float(1 << WIDE_BITS) + lo.astype(jnp.float32)


def add_reads(state: DisturbState, reads: jax.Array, config: DisturbConfig) -> DisturbState:
    """Count ``reads`` (int32[L] page reads per data block) on the blocks that hold them (a gather)."""
    require(reads.shape == (config.data_blocks,), "disturb.step", "reads_this_step", reads.shape,
            f"must be int32[{config.data_blocks}] page reads per data block")
    reads = reads.astype(jnp.int32)
    hi, lo = add_wide(state.reads_hi, state.reads_lo, reads.sum())
    held = state.data_of >= 0
    count = state.read_count + jnp.where(held, reads[jnp.maximum(state.data_of, 0)], 0)
    return dataclasses.replace(state, read_count=count, reads_hi=hi, reads_lo=lo)


def due(state: DisturbState, knobs: DisturbKnobs, config: DisturbConfig) -> jax.Array:
    """int32[B] RELOCATE (counter ≥ N), else REFRESH (age ≥ T), else IDLE, of every physical block,
    evaluated at the boundary after this step's reads."""
    held = state.data_of >= 0
    age = (state.step + 1 - state.written_step).astype(jnp.float32)
    relocate = held & (state.read_count >= knobs.threshold_reads)
    refresh = held & (age >= refresh_steps(knobs, config))
    return jnp.where(relocate, RELOCATE, jnp.where(refresh, REFRESH, IDLE)).astype(jnp.int32)


def groups(knobs: DisturbKnobs, config: DisturbConfig) -> jax.Array:
    """int32[B] the group of each physical block: its plane (``destination = 0``) or 0 (``1``: the device)."""
    plane = jnp.arange(config.physical_blocks, dtype=jnp.int32) // config.blocks_per_plane
    return jnp.where(knobs.destination == LEAST_WORN, 0, plane)


def erased_pool(state: DisturbState, knobs: DisturbKnobs, config: DisturbConfig):
    """The erased blocks sorted by (group, erases, index): (blocks int32[E], start int32[P], count int32[P])
    of each group in it, with E = B − L the pool's size (constant: every move takes one erased block and
    erases one). Compacted first (a cumulative sum), then one sort of E packed int32 keys below
    (steps + 1) · B (``DisturbConfig`` checks that it fits): erases · B + block for the device,
    (plane · (steps + 1) + erases) · blocks_per_plane + slot for planes (erases ≤ steps: one a step at most)."""
    b, e, p, bp = config.physical_blocks, config.free_blocks, config.planes, config.blocks_per_plane
    span = config.steps + 1
    free = state.data_of < 0
    pos = jnp.cumsum(free.astype(jnp.int32)) - 1
    blocks = jnp.zeros(e, jnp.int32).at[jnp.where(free, pos, e)].set(jnp.arange(b, dtype=jnp.int32), mode="drop")
    erases = jnp.minimum(state.erases[blocks], config.steps)  # only a state set by hand holds more
    anywhere = knobs.destination == LEAST_WORN
    key = jnp.sort(jnp.where(anywhere, erases * b + blocks, ((blocks // bp) * span + erases) * bp + blocks % bp))
    plane = key // (span * bp)
    blocks = jnp.where(anywhere, key % b, plane * bp + key % bp)
    count = jnp.zeros(p, jnp.int32).at[jnp.where(anywhere, 0, plane)].add(1)
    return blocks, jnp.cumsum(count) - count, count


def exclusive_ranks(x: jax.Array, knobs: DisturbKnobs, config: DisturbConfig) -> tuple[jax.Array, jax.Array]:
    """(rank, total) int32[B]: for each block, the number of blocks with ``x`` set before it (block order)
    in its group, and the number in its group (``x`` int32[B] of 0/1; cumulative sums, no sort)."""
    p, bp = config.planes, config.blocks_per_plane
    x = x.reshape(p, bp)
    in_plane = jnp.cumsum(x, axis=1) - x
    plane_total = x.sum(axis=1)
    before_plane = jnp.cumsum(plane_total) - plane_total
    anywhere = knobs.destination == LEAST_WORN
    rank = jnp.where(anywhere, in_plane + before_plane[:, None], in_plane).reshape(-1)
    total = jnp.where(anywhere, plane_total.sum(), jnp.broadcast_to(plane_total[:, None], (p, bp))).reshape(-1)
    return rank, total


def due_ranks(kind: jax.Array, knobs: DisturbKnobs, config: DisturbConfig) -> jax.Array:
    """int32[B] rank (0, 1, …) of each due block among its group's due blocks: relocations before
    refreshes, each in block order (an FTL's patrol scan over block addresses; assumed)."""
    r_reloc, n_reloc = exclusive_ranks((kind == RELOCATE).astype(jnp.int32), knobs, config)
    r_refresh, _ = exclusive_ranks((kind == REFRESH).astype(jnp.int32), knobs, config)
    return jnp.where(kind == RELOCATE, r_reloc, n_reloc + r_refresh)


def plan_moves(state: DisturbState, kind: jax.Array, knobs: DisturbKnobs,
               config: DisturbConfig) -> tuple[jax.Array, jax.Array]:
    """(move bool[B], dst int32[B]): which due blocks move this step and where to (``B`` when not).

    Groups: each plane (``destination = 0``) or the whole device (``1``). In each group the r-th due
    block in priority order takes the r-th erased block by (erases, index), while erased blocks last.
    """
    pool, pool_start, pool_count = erased_pool(state, knobs, config)
    rank = due_ranks(kind, knobs, config)
    group = groups(knobs, config)
    move = (kind != IDLE) & (rank < pool_count[group])
    dst = pool[jnp.clip(pool_start[group] + rank, 0, config.free_blocks - 1)]
    return move, jnp.where(move, dst, config.physical_blocks)


def apply_moves(state: DisturbState, kind: jax.Array, move: jax.Array, dst: jax.Array, knobs: DisturbKnobs,
                config: DisturbConfig) -> DisturbState:
    """Copy each moving block's valid pages to its destination, erase it, and count pages and plane time.

    One scatter (the source of each destination block); the rest are gathers and per-plane sums.
    """
    b, p, bp = config.physical_blocks, config.planes, config.blocks_per_plane
    now = state.step + 1
    relocate, refresh = move & (kind == RELOCATE), move & (kind == REFRESH)
    v = jnp.where(move, state.valid_pages, 0)
    carry = jnp.where(relocate, state.read_count - knobs.threshold_reads, 0)
    src_of = jnp.full(b, b, jnp.int32).at[dst].set(jnp.arange(b, dtype=jnp.int32), mode="drop")
    incoming, src = src_of < b, jnp.minimum(src_of, b - 1)
    data_of = jnp.where(incoming, state.data_of[src], jnp.where(move, -1, state.data_of))
    valid = jnp.where(incoming, state.valid_pages[src], jnp.where(move, 0, state.valid_pages))
    count = jnp.where(incoming, carry[src], jnp.where(move, 0, state.read_count))
    written = jnp.where(incoming, now, state.written_step)
    read_now = v.reshape(p, bp).sum(axis=1)
    prog_now = jnp.where(incoming, state.valid_pages[src], 0).reshape(p, bp).sum(axis=1)
    busy_us = read_now.astype(jnp.float32) * knobs.t_read_us + prog_now.astype(jnp.float32) * knobs.t_prog_us
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    return dataclasses.replace(
        state, data_of=data_of, valid_pages=valid, read_count=count, written_step=written,
        erases=state.erases + i32(move), relocations=state.relocations + i32(relocate).sum(),
        refreshes=state.refreshes + i32(refresh).sum(),
        relocated_pages=state.relocated_pages + jnp.where(relocate, v, 0).sum(),
        refresh_pages=state.refresh_pages + jnp.where(refresh, v, 0).sum(),
        read_pages=state.read_pages + read_now, prog_pages=state.prog_pages + prog_now,
        rewrite_wall_us=state.rewrite_wall_us + jnp.max(busy_us),
        deferred_moves=state.deferred_moves + i32((kind != IDLE) & ~move).sum())


def step(words: tuple, state: DisturbState, reads_this_step: jax.Array, knobs: DisturbKnobs,
         config: DisturbConfig) -> DisturbState:
    """One step: count the reads, relocate and refresh the due blocks, advance the clock.

    ``words`` (the stream's hash words) is unused: the mechanism draws nothing (the reads come in);
    it is kept so every mechanism's step has the same signature.
    """
    del words
    state = add_reads(state, reads_this_step, config)
    kind = due(state, knobs, config)
    move, dst = plan_moves(state, kind, knobs, config)
    state = apply_moves(state, kind, move, dst, knobs, config)
    return dataclasses.replace(state, step=state.step + 1)


def poisson(h_u: jax.Array, h_angle: jax.Array, mean: jax.Array) -> jax.Array:
    """int32 Poisson variates of ``mean`` (float32 ≥ 0) from uint32 hashes: the inverse CDF over
    ``POISSON_TERMS`` terms up to ``POISSON_EXACT_MEAN``, a rounded normal above it (mean preserved)."""
    mean = jnp.asarray(mean, jnp.float32)
    u = rng.uniform01(h_u)

    def term(k, c):  # (variate so far, pmf(k), cdf(k)): the variate counts the cdf(k) <= u
        x, pmf, cdf = c
        pmf = pmf * mean / (k + 1.0)
        return x + (u >= cdf), pmf, cdf + pmf

    def inverse_cdf(_):
        pmf0 = jnp.exp(-jnp.minimum(mean, POISSON_EXACT_MEAN))
        return jax.lax.fori_loop(0, POISSON_TERMS, term, (jnp.zeros(mean.shape, jnp.int32), pmf0, pmf0))[0]

    exact = mean <= POISSON_EXACT_MEAN
    # the 64-term loop only when some mean needs it (the means are knobs: under a vmap over streams the
    # predicate is not batched, so this stays a branch)
    small = jax.lax.cond(jnp.any(exact), inverse_cdf, lambda _: jnp.zeros(mean.shape, jnp.int32), None)
    large = jnp.maximum(jnp.round(mean + jnp.sqrt(mean) * rng.normal(h_u, h_angle)), 0.0)
    return jnp.where(exact, small, large.astype(jnp.int32))


def draw_reads(words: tuple, s: jax.Array, frac: jax.Array, knobs: DisturbKnobs,
               config: DisturbConfig) -> tuple[jax.Array, jax.Array]:
    """(int32[L] page reads per data block in step ``s``, the carried fraction float32[L]).

    Per-block rate λ_d = reads_per_s × read_share[d]. ``poisson``: independent Poisson(λ_d · step_s)
    draws (``frac`` unused); ``deterministic``: ⌊frac + λ_d · step_s⌋ with the remainder carried, so
    block d receives exactly ⌊λ_d t⌋ reads by time t when λ_d · step_s is a short binary fraction.
    """
    mean = knobs.reads_per_s * knobs.read_share * jnp.float32(config.step_s)
    if config.workload == "deterministic":
        total = frac + mean
        n = jnp.floor(total)
        return n.astype(jnp.int32), total - n
    d = jnp.arange(config.data_blocks, dtype=jnp.int32)
    return poisson(rng.mix(*words, s, d, DisturbSalt.READS_U), rng.mix(*words, s, d, DisturbSalt.READS_ANGLE),
                   mean), frac


def rollout(words: tuple, state: DisturbState, knobs: DisturbKnobs, config: DisturbConfig) -> DisturbState:
    """``config.steps`` steps of drawn reads in one ``lax.scan`` (compiled once)."""
    def body(carry, s):
        st, frac = carry
        reads, frac = draw_reads(words, s, frac, knobs, config)
        return (step(words, st, reads, knobs, config), frac), None

    frac0 = jnp.zeros(config.data_blocks, jnp.float32)
    (state, _), _ = jax.lax.scan(body, (state, frac0), jnp.arange(config.steps, dtype=jnp.int32))
    return state


def phys_of(state: DisturbState, config: DisturbConfig) -> jax.Array:
    """int32[L] the physical block holding each data block (the inverse of ``data_of``)."""
    b, n = config.physical_blocks, config.data_blocks
    return jnp.zeros(n, jnp.int32).at[jnp.where(state.data_of >= 0, state.data_of, n)].set(
        jnp.arange(b, dtype=jnp.int32), mode="drop")


def page_counts(state: DisturbState, config: DisturbConfig) -> dict:
    """Conservation terms: valid pages (int32[]), data blocks held (= L) and erased blocks (= B − L),
    and whether every data block is held by exactly one physical block (bool[])."""
    n = config.data_blocks
    held = state.data_of >= 0
    copies = jnp.zeros(n, jnp.int32).at[jnp.where(held, state.data_of, n)].add(1, mode="drop")
    return {"valid_pages": state.valid_pages.sum(), "held_blocks": held.sum().astype(jnp.int32),
            "erased_blocks": (~held).sum().astype(jnp.int32), "each_data_block_once": jnp.all(copies == 1)}


class DisturbOutput(NamedTuple):
    """One stream's totals over the run. P = planes."""

    host_reads: jax.Array  # f32[] host page reads
    relocations: jax.Array  # i32[] read-disturb relocations
    refreshes: jax.Array  # i32[] refresh rewrites
    relocated_pages: jax.Array  # i32[] pages copied by relocations
    refresh_pages: jax.Array  # i32[] pages copied by refreshes
    erases: jax.Array  # i32[] block erases (one per relocation or refresh)
    erases_per_block_max: jax.Array  # i32[] most-erased physical block
    erases_per_block_min: jax.Array  # i32[] least-erased physical block
    read_pages: jax.Array  # i32[P] rewrite page reads per plane
    prog_pages: jax.Array  # i32[P] rewrite page programs per plane
    rewrite_read_us: jax.Array  # f32[] Σ planes rewrite read time (read_pages × tR)
    rewrite_prog_us: jax.Array  # f32[] Σ planes rewrite program time (prog_pages × tPROG)
    rewrite_wall_us: jax.Array  # f32[] Σ steps busiest plane's rewrite time (each step's rewrites at once: grows
    #                             with step_s, a burst bound; the per-plane times above do not depend on it)
    deferred_moves: jax.Array  # i32[] Σ steps of due blocks that waited for an erased block
    valid_pages: jax.Array  # i32[] valid pages at the end (conserved: L × K)
    each_data_block_once: jax.Array  # bool[] every data block still held by exactly one physical block


def summary(state: DisturbState, knobs: DisturbKnobs, config: DisturbConfig) -> DisturbOutput:
    counts = page_counts(state, config)
    return DisturbOutput(
        host_reads=wide_value(state.reads_hi, state.reads_lo), relocations=state.relocations,
        refreshes=state.refreshes, relocated_pages=state.relocated_pages, refresh_pages=state.refresh_pages,
        erases=state.erases.sum(), erases_per_block_max=state.erases.max(), erases_per_block_min=state.erases.min(),
        read_pages=state.read_pages, prog_pages=state.prog_pages,
        rewrite_read_us=(state.read_pages.astype(jnp.float32) * knobs.t_read_us).sum(),
        rewrite_prog_us=(state.prog_pages.astype(jnp.float32) * knobs.t_prog_us).sum(),
        rewrite_wall_us=state.rewrite_wall_us, deferred_moves=state.deferred_moves,
        valid_pages=counts["valid_pages"], each_data_block_once=counts["each_data_block_once"])


def simulate(stream_id, seed, knobs: DisturbKnobs, inputs: None, config: DisturbConfig) -> DisturbOutput:
    """One stream (for ``hbfjax.batch.run``; no inputs): start, ``steps`` steps of drawn reads, totals."""
    del inputs
    words = (seed, stream_id)
    state = rollout(words, init_state(words, knobs, config), knobs, config)
    return summary(state, knobs, config)


# --- closed forms (host floats) ----------------------------------------------------------------------

def renewal_rates(reads_per_s, read_share, threshold_reads: float, refresh_hours: float = 0.0) -> dict:
    """Long-run rewrite rates per second from renewal theory, for N ≫ 1 (host NumPy).

    A block read at λ_d pages/s is rewritten when N reads or T hours have passed since its last program,
    whichever comes first; for N ≫ 1 the time to N reads is N/λ_d (law of large numbers), so it is
    relocated at λ_d/N per second if N/λ_d < T, else refreshed at 1/T (renewal reward theorem).
    With refresh off (T = 0) every block is relocated at λ_d/N exactly (elementary renewal theorem).
    """
    lam = np.asarray(reads_per_s, np.float64) * np.asarray(read_share, np.float64)
    n = float(threshold_reads)
    if refresh_hours <= 0:
        return {"relocations_per_s": float(np.sum(lam / n)), "refreshes_per_s": 0.0}
    t = refresh_hours * SECONDS_PER_HOUR
    reloc = lam * t > n
    return {"relocations_per_s": float(np.sum(np.where(reloc, lam / n, 0.0))),
            "refreshes_per_s": float(np.sum(np.where(reloc, 0.0, 1.0 / t)))}


def constant_rate(rate_per_s: float, threshold_reads: float, seconds: float, physical_blocks: int,
                  pe_cycles: float, data_blocks: int = 1) -> dict:
    """The deterministic case: ``data_blocks`` blocks each read at a constant ``rate_per_s`` pages/s with
    threshold N, counters from 0, no refresh. Each relocates every N/r s: ⌊r t / N⌋ relocations by t;
    erases per physical block per second r·L/(N·B); lifetime P/E · N · B / (r · L) seconds."""
    period = threshold_reads / rate_per_s
    per_block = np.floor(rate_per_s * seconds / threshold_reads)
    erase_rate = rate_per_s * data_blocks / (threshold_reads * physical_blocks)
    return {"period_s": period, "relocations": float(per_block * data_blocks),
            "relocations_per_s": data_blocks / period, "erases_per_block_per_s": erase_rate,
            "lifetime_s": pe_cycles / erase_rate}
