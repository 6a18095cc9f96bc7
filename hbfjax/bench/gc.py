"""GC simulation throughput: simulated host page writes per second, many streams at once.

GPU scale (scale 1): 1,024 streams × 4,096 blocks × 64 pages, uniform overwrites at spare factor
0.15 with greedy victims, after a sequential fill and two drive writes of warm-up (outside the
timing). On a GPU the bench also times the CPU formulations and bigger chunks (``GPU_EXTRA``).
The reference is ``hbfjax.flash.erase.reference``: the same policy written the usual way, one host
write and one victim at a time in NumPy/Python, one stream; it times its own writes after its fill
and one drive write of warm-up. Stalled chunks (host waiting for GC) write nothing and are not
counted as writes. On a CPU the measured streams run ``MAP_STREAMS_CPU`` at a time (``lax.map``
inside the one jit, as ``batch.compiled(map_streams=...)``): the same work and results, with each
group's block arrays in cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from hbfjax import batch
from hbfjax.bench._profile import maybe_profile
from hbfjax.bench._timing import row, time_compiled
from hbfjax.flash.erase import formulation, gc, gc_overwrite as ow
from hbfjax.flash.erase.reference import overwrite_waf

SPARE = 0.15
PAGES = 64
MEASURE_CHUNKS = 32
SLACK_PAGES = 4 * PAGES  # GC hysteresis above the reserve (one chunk of the default variant)
MAP_STREAMS_CPU = 8  # streams per lax.map step on a CPU: ~0.5 MB of block array and l2p map each


@dataclass(frozen=True)
class Variant:
    """How the simulation is cut into scan steps (same policy, same workload; WAF moves slightly
    because a bigger chunk needs a bigger free-pool reserve)."""

    chunk_pages: int  # host writes per stream per scan step
    victims_per_gc: int  # victims per reclaim round
    gc_rounds: int  # reclaim rounds per step

    @property
    def label(self) -> str:
        return f"chunk {self.chunk_pages}, {self.gc_rounds}x{self.victims_per_gc} victims"


# Measured on every machine: one amortised GC round of up to 16 victims per 4 blocks of host writes
# (at WAF ≈ 3.5 a chunk needs ≈ 14 greedy victims).
DEFAULT = Variant(chunk_pages=4 * PAGES, victims_per_gc=16, gc_rounds=1)
# Also measured on a GPU, where a scan step costs kernel launches whatever its size: 4× the writes
# per step, with the victims in one round of 64 (a sort-based top_k) or four rounds of 16.
GPU_EXTRA = (Variant(16 * PAGES, 64, 1), Variant(16 * PAGES, 16, 4))


def _logical_pages(blocks: int) -> int:
    """Logical pages of a device of ``blocks`` × PAGES at spare factor SPARE."""
    return int(round((1 - SPARE) * blocks * PAGES))


def _reference_s_per_write(blocks: int, logical: int, host_writes: int = 30_000) -> float:
    """Seconds per host write of the sequential reference in steady state (after one drive write)."""
    res = overwrite_waf(blocks, PAGES, logical, "greedy", host_writes=host_writes, warmup_writes=logical,
                        reserve_blocks=3)
    return res["measured_s"] / host_writes


def _measure_variant(variant: Variant, streams: int, blocks: int, formulations: tuple[str, ...],
                     ref_s_per_write: float, scale: float) -> list[dict]:
    """Warm up (two drive writes), then time ``MEASURE_CHUNKS`` chunks once per formulation."""
    bc = gc.BlockConfig(n_blocks=blocks, pages_per_block=PAGES, victim="greedy",
                        victims_per_gc=variant.victims_per_gc)
    logical = _logical_pages(blocks)
    warm_chunks = 2 * logical // variant.chunk_pages  # two drive writes: past the post-fill transient
    cfg = ow.OverwriteConfig(blocks=bc, logical_pages=logical, chunk_pages=variant.chunk_pages, warmup_chunks=0,
                             measure_chunks=MEASURE_CHUNKS, gc_rounds=variant.gc_rounds)
    knobs = ow.OverwriteKnobs.make(cfg, slack_pages=SLACK_PAGES)
    seed = jnp.uint32(0)
    ids = batch.stream_ids(0, streams)

    @jax.jit
    def warm(ids):
        def one(i):
            s = ow.filled_state(cfg)
            return ow.rollout((seed, i), s, knobs, cfg, warm_chunks, measuring=False)
        return jax.vmap(one)(ids)

    per_chunk = batch.cpu_map_streams(MAP_STREAMS_CPU)

    def measure(state, ids, cfg):
        one = jax.vmap(lambda s, i: ow.rollout((seed, i), s, knobs, cfg, MEASURE_CHUNKS, measuring=True))
        if not per_chunk or streams % per_chunk:
            return one(state, ids)
        # On a CPU, a few streams at a time (one lax.map step each) keep their block arrays in cache.
        split = lambda a: a.reshape((-1, per_chunk) + a.shape[1:])  # noqa: E731
        out = jax.lax.map(lambda x: one(*x), jax.tree_util.tree_map(split, (state, ids)))
        return jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), out)

    state = jax.block_until_ready(warm(ids))
    native = formulations[0]
    rows = []
    fn = jax.jit(measure, static_argnums=2)
    for name in formulations:
        # the formulation is a static config field: each one is its own trace
        cfg_f = dataclasses.replace(cfg, blocks=dataclasses.replace(bc, formulation=name))
        compile_s, run_s = time_compiled(lambda: fn(state, ids, cfg_f), repeats=2)
        out = fn(state, ids, cfg_f)
        label = f"gc greedy {streams}x{blocks}x{PAGES}"
        label += "" if variant == DEFAULT else f" ({variant.label})"
        label += "" if name == native else f" ({name} formulation)"
        maybe_profile(label, lambda: fn(state, ids, cfg_f))
        host = float((out.blocks.host_pages - state.blocks.host_pages).sum())
        mig = float((out.blocks.migrated_pages - state.blocks.migrated_pages).sum())
        rows.append(row(label, host, "host page writes", compile_s, run_s, ref_s_per_write, streams=streams,
                        blocks=blocks, pages_per_block=PAGES, spare_factor=SPARE, waf=(host + mig) / max(host, 1.0),
                        stalled_chunks=int((out.stalled_chunks - state.stalled_chunks).sum()),
                        overflow=bool(out.blocks.overflow.any()), formulation=name, scale=scale,
                        **dataclasses.asdict(variant)))
    return rows


def run(scale: float) -> list[dict]:
    streams = max(8, int(1024 * scale))
    blocks = max(64, int(4096 * scale))
    ref = _reference_s_per_write(blocks, _logical_pages(blocks))
    if formulation.cpu_form("auto"):
        return _measure_variant(DEFAULT, streams, blocks, ("cpu",), ref, scale)
    # On a GPU also time the CPU formulations (bit-identical results): which is faster there is measured.
    return [r for v in (DEFAULT,) + GPU_EXTRA for r in _measure_variant(v, streams, blocks, ("gpu", "cpu"), ref, scale)]
