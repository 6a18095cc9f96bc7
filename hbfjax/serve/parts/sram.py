"""The ``sram`` part: the package's base-die SRAM, shared by prefetched weights, buffered KV, offloaded hot
pages and a GC migration buffer (HBFlex §4.1, §5.2, §5.3).

:func:`plan` is the run's SRAM budget, which the ``reads`` part (the offload's cap) and the ``writes``
part (the KV buffer's budget, the prefetch held) read; the part itself books each pass's use:
``sram_peak_bytes`` = min(others, SRAM) + the KV buffer's peak, where others = prefetch + offloaded
pages + the GC buffer, and ``sram_overflow_passes`` where the others alone exceed the SRAM.

Without a split (``ServeKnobs.sram_shares`` None) the KV buffer gets what the others leave. With a
split (issue 13's ``hbflex-sram`` problem; HBFlex §5.2–5.3 state none: every choice here is ours) the
GC buffer is set aside first, and of the rest (``usable``):

* offload ``shares[0]``: at most ``shares[0] × usable`` bytes of a layer read's hot-plane excess
  are served from SRAM; a fraction ρ = min(1, cap / excess) of the excess is, and the wave keeps
  the rest on its planes: waves = w_f + (1 − ρ)(w_0 − w_f), between the wave without offload
  (the package's law at f = 0, the same quantile) and with the policy's f (assumed linear in the
  unserved share; ``parts.reads``);
* prefetch ``shares[1]``: it holds π = min(1, cap / prefetch group) of the prefetch group
  (:func:`prefetch_bytes`), and a layer's write window is π · (all operators' idle time) +
  (1 − π) · (the longest one's) (``hbf_writes.window_us``; the paper gives only π = 0 and 1).
  Prefetch hiding the weights' read latency itself is not modelled (the engine's layer times
  already overlap weight delivery with compute);
* KV ``shares[2]``: the window-aware writeback's SRAM KV budget (``hbf_writes``), overflow forced.

No pass overflows the SRAM under a split: every user is held to its share. Relaxed runs
(``ServeRelax.sram_pages``, a temperature in pages) turn the caps into ``soft_min``.
"""

from __future__ import annotations

import numpy as np
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.memory import hbf_packages
from hbfjax.relax import soft_min
from hbfjax.serve import layer_time
from hbfjax.serve.part import Part
from hbfjax.validate import require

GC_BUFFER_BLOCKS = 1  # SRAM held for GC migration: one erase block's pages (assumed)


def prefetch_bytes(model) -> float:
    """SRAM that weight prefetch holds (HBFlex §5.3): the larger of its two groups, fetched one at a time —
    one routed expert's projections, or a layer's Q projections (MLA: ``q_a`` and ``q_b``; a fused GQA
    ``qkv`` counted whole). DeepSeek-V4-Pro: 66 and 112 MB from the preset (the paper: ≈ 63 and 106 MB)."""
    kind = "moe" if model.is_moe else "dense"
    expert = layer_time.expert_bytes(model) if model.is_moe else 0.0
    q = sum(l.in_features * l.out_features * l.bytes_per_param for l in model.linears(kind)
            if l.op == "qkv_proj" and l.name in ("q_a", "q_b", "qkv", "q"))
    return float(max(expert, q))


def capped(need, cap, temperature, unit):
    """min(need, cap), relaxed as ``soft_min`` at ``temperature`` in ``unit`` s (None: exact)."""
    if temperature is None:
        return jnp.minimum(need, cap)
    return soft_min(need / unit, cap / unit, temperature) * unit


class SramPlan(NamedTuple):
    """The run's SRAM budget (float32[] bytes; the caps None without a split)."""

    total_bytes: jax.Array  # the package's SRAM
    prefetch_bytes: jax.Array  # what weight prefetch holds (capped by its share under a split)
    gc_buffer_bytes: jax.Array  # one erase block of pages for GC migration
    offload_cap_bytes: jax.Array | None  # split: the offload's share
    kv_cap_bytes: jax.Array | None  # split: the KV buffer's share
    prefetch_held: jax.Array | None  # split: π, the share of the prefetch group the SRAM holds
    temperature_pages: jax.Array | None  # relaxed caps (ServeRelax.sram_pages); None: exact


def gc_buffer_bytes(page_bytes, pages_per_block: int):
    """Bytes of SRAM held for GC migration: :data:`GC_BUFFER_BLOCKS` erase blocks of ``pages_per_block``
    pages (traced or host ``page_bytes``)."""
    return GC_BUFFER_BLOCKS * pages_per_block * page_bytes


def plan(knobs, config) -> SramPlan:
    """The SRAM budget of the module docstring for this organisation, policy, model and split."""
    org, policy = knobs.org, knobs.policy
    page = org.page_bytes
    sram = hbf_packages.sram_bytes(org)
    prefetch = policy.prefetch * prefetch_bytes(config.model)
    gc_buffer = gc_buffer_bytes(page, config.blocks.pages_per_block)
    temperature = None if knobs.relax is None else knobs.relax.sram_pages
    require(knobs.sram_shares is not None or temperature is None, "ServeKnobs", "relax.sram_pages", temperature,
            "relaxes the SRAM split's caps: give sram_shares")
    if knobs.sram_shares is None:
        return SramPlan(sram, prefetch, gc_buffer, None, None, None, temperature)
    usable = jnp.maximum(sram - gc_buffer, 0.0)
    cap_offload, cap_prefetch, cap_kv = (knobs.sram_shares[k] * usable for k in range(3))
    held_bytes = capped(prefetch, cap_prefetch, temperature, page)
    held = jnp.where(prefetch > 0, held_bytes / jnp.maximum(prefetch, 1e-30), 0.0)
    return SramPlan(sram, held_bytes, gc_buffer, cap_offload, cap_kv, held, temperature)


def others_bytes(p: SramPlan, offloaded_bytes) -> jax.Array:
    """float32[] SRAM the users other than the KV buffer hold in a pass."""
    return p.prefetch_bytes + offloaded_bytes + p.gc_buffer_bytes


class SramTotals(NamedTuple):
    """Per-run totals of the SRAM's use (float32[] each)."""

    sram_overflow_passes: jax.Array  # passes whose prefetch + offload + GC buffer exceeded the SRAM
    sram_peak_bytes: jax.Array  # most SRAM used in a pass (a running maximum)

    PEAKS = ("sram_peak_bytes",)


def part(knobs, config, run) -> Part:
    p = plan(knobs, config)

    def writes(s, view, reads, times, record):
        others = others_bytes(p, reads.sram_bytes)
        add = SramTotals(sram_overflow_passes=(others > p.total_bytes).astype(jnp.float32),
                         sram_peak_bytes=jnp.minimum(others, p.total_bytes) + record.sram_kv_peak_bytes)
        return s, record, add

    return Part(init=lambda: (), writes=writes, totals=SramTotals)


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream: the SRAM's peak use and the passes whose users other than
    the KV buffer exceeded it."""
    return {"sram_peak_bytes": np.asarray(own.totals.sram_peak_bytes, np.float64),
            "sram_overflow_passes": np.asarray(own.totals.sram_overflow_passes, np.float64)}
