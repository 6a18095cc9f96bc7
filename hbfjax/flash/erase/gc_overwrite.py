"""Logical-page overwrite workload: the textbook GC case with known analytic WAF (DESIGN.md §4, §8).

The device is filled once with every logical page (sequentially, not counted), then host writes
overwrite logical pages uniformly, or hot/cold (a fraction r of writes to a fraction f of pages).
Each chunk of ``chunk_pages`` host writes runs one amortised GC phase first, then programs the
chunk as one batch (duplicates inside a chunk: only the last copy stays valid). Warm-up drive
writes run before the measured ones and are reported apart.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.flash.erase import formulation, gc
from hbfjax.flash.erase.gc import BlockConfig, BlockState, require
from hbfjax.validate import INT32_MAX

WORKLOADS = ("uniform", "hotcold")


@dataclass(frozen=True)
class OverwriteConfig:
    """Static shape of an overwrite run: device, logical size, chunking and run length."""

    blocks: BlockConfig
    logical_pages: int  # L_max: size of the logical→physical map; the run's L is a knob ≤ L_max
    chunk_pages: int  # host writes per scan step (one GC phase each)
    warmup_chunks: int  # chunks before measuring (the first fill is set up directly, not simulated)
    measure_chunks: int
    workload: str = "uniform"
    gc_rounds: int = 2  # reclaim calls per chunk (each up to victims_per_gc victims)

    def __post_init__(self) -> None:
        c = type(self).__name__
        phys = self.blocks.physical_pages
        require(self.workload in WORKLOADS, c, "workload", self.workload, f"must be one of {WORKLOADS}")
        require(self.blocks.n_classes == 1, c, "blocks.n_classes", self.blocks.n_classes,
                "the overwrite workload uses one allocation class")
        require(1 <= self.logical_pages, c, "logical_pages", self.logical_pages, "must be >= 1")
        reserve = self.reserve_pages_min
        require(self.logical_pages + reserve < phys, c, "logical_pages", self.logical_pages,
                f"leaves {phys - self.logical_pages} spare pages; GC needs more than {reserve} "
                f"(one chunk + one victim + an open block) of {phys} physical pages")
        require(self.chunk_pages >= 1, c, "chunk_pages", self.chunk_pages, "must be >= 1")
        require(self.warmup_chunks >= 0, c, "warmup_chunks", self.warmup_chunks, "must be >= 0")
        require(self.measure_chunks >= 1, c, "measure_chunks", self.measure_chunks, "must be >= 1")
        require(self.gc_rounds >= 1, c, "gc_rounds", self.gc_rounds, "must be >= 1")
        per_chunk = self.chunk_pages + self.gc_rounds * self.blocks.victims_per_gc * self.blocks.pages_per_block
        chunks = self.warmup_chunks + self.measure_chunks
        require(chunks * per_chunk <= INT32_MAX, c, "measure_chunks", self.measure_chunks,
                f"(warmup_chunks {self.warmup_chunks} + measure_chunks) × {per_chunk} page programs per chunk at "
                f"most (chunk_pages + gc_rounds × victims_per_gc × pages_per_block) must be <= {INT32_MAX}, so "
                "every int32 page counter fits")

    @property
    def reserve_pages_min(self) -> int:
        """Free-pool pages GC restores: a chunk of host writes plus room to migrate one victim."""
        k = self.blocks.pages_per_block
        return (math.ceil(self.chunk_pages / k) + 2) * k

    @property
    def spare_factor(self) -> float:
        return 1.0 - self.logical_pages / self.blocks.physical_pages


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class OverwriteKnobs:
    """Tunable values (traced: sweeping them never recompiles)."""

    gc_trigger_used: jax.Array  # float32[] GC starts when used pages exceed this fraction of physical
    gc_target_used: jax.Array  # float32[] GC reclaims until used ≤ this fraction
    hot_fraction: jax.Array  # float32[] f: fraction of logical pages that are hot
    hot_write_fraction: jax.Array  # float32[] r: fraction of writes that go to hot pages
    logical_pages: jax.Array  # int32[] L ≤ config.logical_pages: spare factor s = 1 − L / physical

    @classmethod
    def make(cls, config: OverwriteConfig, hot_fraction: float = 0.2, hot_write_fraction: float = 0.8,
             slack_pages: int | None = None, logical_pages: int | None = None) -> "OverwriteKnobs":
        """Watermarks: GC when the pool drops below the reserve + slack, refilling it to reserve + slack.

        GC runs before each chunk, so a pool at the reserve always holds the chunk; slack (default one
        block) is the hysteresis. Both are small so the effective spare factor stays near the nominal one.
        """
        phys = config.blocks.physical_pages
        reserve = config.reserve_pages_min
        slack = max(config.blocks.pages_per_block, config.chunk_pages) if slack_pages is None else slack_pages
        lp = config.logical_pages if logical_pages is None else int(logical_pages)
        require(1 <= lp <= config.logical_pages, "OverwriteKnobs", "logical_pages", lp,
                f"must be in [1, config.logical_pages = {config.logical_pages}]")
        for name, v in (("hot_fraction", hot_fraction), ("hot_write_fraction", hot_write_fraction)):
            require(0.0 < v < 1.0, "OverwriteKnobs", name, v, "must be in (0, 1)")
        require(slack >= 0, "OverwriteKnobs", "slack_pages", slack, "must be >= 0")
        # The host writes a chunk only once GC has refilled the free pool to reserve + slack pages of
        # whole free blocks; at best the valid pages fill ceil(L / K) blocks (the open block among them).
        k = config.blocks.pages_per_block
        room = (config.blocks.n_blocks - math.ceil(lp / k)) * k
        require(room >= reserve + slack, "OverwriteKnobs", "logical_pages", lp,
                f"leaves at best {room} pages in whole free blocks ({config.blocks.n_blocks} blocks − ceil(L / {k}) "
                f"holding valid pages); the host writes only when reserve {reserve} + slack {slack} pages are "
                f"free, so it needs at least {reserve + slack} (a larger spare factor)")
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(gc_trigger_used=f32(1 - (reserve + slack) / phys), gc_target_used=f32(1 - (reserve + slack) / phys),
                   hot_fraction=f32(hot_fraction), hot_write_fraction=f32(hot_write_fraction),
                   logical_pages=jnp.asarray(lp, jnp.int32))



@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class OverwriteState:
    blocks: BlockState
    l2p: jax.Array  # int32[L] physical page (block·K + offset) of each logical page
    chunk: jax.Array  # int32[] chunks done
    free_pages_sum: jax.Array  # float32[] Σ over measured chunks of mean free pages (pre/post GC)
    stalled_chunks: jax.Array  # int32[] chunks the host waited for GC


def filled_state(config: OverwriteConfig, logical_pages=None) -> OverwriteState:
    """The device after the first sequential fill: logical page i at physical page i (i < L)."""
    bc = config.blocks
    k = bc.pages_per_block
    st = gc.init_state(bc)
    lpages = jnp.arange(config.logical_pages, dtype=jnp.int32)
    n = config.logical_pages if logical_pages is None else logical_pages
    st, blk, off = gc.append(st, lpages, jnp.zeros_like(lpages), lpages < n, bc)
    l2p = jnp.where(lpages < n, blk * k + off, -1)
    return OverwriteState(blocks=dataclasses.replace(st, host_pages=jnp.int32(0)), l2p=l2p,
                          chunk=jnp.int32(0), free_pages_sum=jnp.float32(0),
                          stalled_chunks=jnp.int32(0))


def draw_logical(words: tuple, chunk, knobs: OverwriteKnobs, config: OverwriteConfig) -> jax.Array:
    """int32[chunk_pages] logical pages written in this chunk (uniform or hot/cold, counter hash)."""
    i = jnp.arange(config.chunk_pages, dtype=jnp.int32)
    n = knobs.logical_pages
    if config.workload == "uniform":
        return rng.uniform_index(rng.mix(*words, chunk, i, Salt.OVERWRITE_UNIFORM), n)
    n_hot = jnp.clip(jnp.floor(knobs.hot_fraction * n).astype(jnp.int32), 1, n - 1)
    hot = rng.uniform01(rng.mix(*words, chunk, i, Salt.OVERWRITE_HOT)) < knobs.hot_write_fraction
    u = rng.mix(*words, chunk, i, Salt.OVERWRITE_PAGE)
    return jnp.where(hot, rng.uniform_index(u, n_hot), n_hot + rng.uniform_index(u, n - n_hot))


def _remap(l2p, moved, k):
    owners, blk, page, mask = moved
    return l2p.at[jnp.where(mask, owners, l2p.shape[0])].set(blk * k + page, mode="drop")


def step(words: tuple, state: OverwriteState, knobs: OverwriteKnobs, config: OverwriteConfig,
         measuring: jax.Array) -> OverwriteState:
    """One chunk: GC phase (masked when not triggered), then ``chunk_pages`` host overwrites."""
    bc = config.blocks
    k = bc.pages_per_block
    st = state.blocks
    free_pre = gc.free_pages(st, bc)
    target = gc.gc_target_pages(st, knobs.gc_trigger_used, knobs.gc_target_used, bc)
    st, l2p = gc.collect(words, st, config.gc_rounds, target, bc,
                         on_move=lambda l2p, moved: _remap(l2p, moved, k), carry=state.l2p)
    free_post = gc.free_pages(st, bc)

    # The host waits (this chunk programs nothing) while GC has not freed room for the chunk,
    # as a real FTL throttles writes; it happens after the sequential fill, when victims are full.
    # Room for the chunk plus one full victim's migration next time, and a pool GC has refilled to
    # its target: a host that writes as soon as a chunk fits keeps the pool too small for GC batches.
    pool_post = gc.free_blocks(st) * k
    go = (free_post >= config.chunk_pages + k) & (pool_post >= target)
    lp = draw_logical(words, state.chunk, knobs, config)
    last, first, old, l2p = formulation.duplicates(lp, l2p, cpu=bc.cpu_formulation)
    last, first = last & go, first & go
    old_blk = jnp.where(first, old // k, bc.n_blocks)
    owner = st.owner.at[old_blk, old % k].set(-1, mode="drop")
    valid = st.valid.at[old_blk].add(-1, mode="drop")
    st = dataclasses.replace(st, owner=owner, valid=valid)
    st, blk, off = gc.append(st, jnp.where(last, lp, -1), jnp.zeros_like(lp), jnp.broadcast_to(go, lp.shape), bc)
    l2p = l2p.at[jnp.where(last, lp, l2p.shape[0])].set(formulation.after_read(blk * k + off, old), mode="drop")
    st = dataclasses.replace(st, host_pages=st.host_pages + jnp.where(go, config.chunk_pages, 0))
    free_mean = 0.5 * (free_pre + free_post).astype(jnp.float32)
    return OverwriteState(blocks=st, l2p=l2p, chunk=state.chunk + 1,
                          free_pages_sum=state.free_pages_sum + jnp.where(measuring, free_mean, 0.0),
                          stalled_chunks=state.stalled_chunks + (~go).astype(jnp.int32))


def rollout(words: tuple, state: OverwriteState, knobs: OverwriteKnobs, config: OverwriteConfig, n_chunks: int,
            measuring: bool) -> OverwriteState:
    """``n_chunks`` steps in one ``lax.scan`` (``simulate`` runs warm-up and measurement as one scan)."""
    return jax.lax.scan(lambda s, _: (step(words, s, knobs, config, jnp.asarray(measuring)), None), state, None,
                        length=n_chunks)[0]


def counters(state: OverwriteState) -> dict:
    return {**gc.block_counters(state.blocks), "stalled_chunks": state.stalled_chunks}


class OverwriteOutput(NamedTuple):
    """One stream's measured part (counters are deltas over the measured chunks)."""

    host_writes: jax.Array  # i32[] host page programs
    migrated_pages: jax.Array  # i32[] GC page programs
    gc_invocations: jax.Array  # i32[] reclaim calls that erased a block
    erases: jax.Array  # i32[] block erases
    stalled_chunks: jax.Array  # i32[] chunks the host waited for GC
    warmup_host_writes: jax.Array  # i32[] the fill and the warm-up chunks
    mean_free_pages: jax.Array  # f32[] free pages, mean over measured chunks
    overflow: jax.Array  # bool[] the free pool ran dry
    erases_per_block_mean: jax.Array  # f32[]
    erases_per_block_max: jax.Array  # i32[]
    erases_per_block_spread: jax.Array  # i32[] max − min


def simulate(stream_id, seed, knobs: OverwriteKnobs, inputs: None, config: OverwriteConfig) -> OverwriteOutput:
    """One stream (for ``hbfjax.batch.run``; no inputs): fill, warm up, measure."""
    words = (seed, stream_id)
    state, before, d, erases = gc.warm_then_measure(
        filled_state(config, knobs.logical_pages), lambda s, m: step(words, s, knobs, config, m), counters,
        lambda s: s.blocks.erases, config.warmup_chunks, config.measure_chunks)
    return OverwriteOutput(**d, warmup_host_writes=before["host_writes"] + knobs.logical_pages,
                           mean_free_pages=state.free_pages_sum / config.measure_chunks,
                           overflow=state.blocks.overflow, **erases)
