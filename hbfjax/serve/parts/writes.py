"""The ``writes`` part: all-HBF programming of new KV — immediate, in stripes, or inside read-free
windows with weight prefetch (HBFlex §3.2, §5.3; ``hbfjax.serve.hbf_writes``).

An organisation whose decode KV lives in HBF (``OrgKnobs.place[decode_kv, hbf]`` at least one half:
HBFlex, Naive HBF) programs every new token's KV through ``hbf_writes.pass_writes``, which replaces
the tiers part's DASH write path in the pass's ``Writes`` (stall, bytes, program time); any other
organisation (DASH's, FlashAccel's, H3's: decode KV appended in HBM and written back in page waves)
keeps the tiers part's. The choice is a traced select, so organisations of both kinds share one
compilation. The SRAM KV budget is what prefetch, the pass's offloaded pages and the GC buffer leave
(``parts.sram``), or the KV share of an SRAM split; ``forced_writebacks`` counts layers whose KV
overflowed it.

Knobs read: ``org`` (planes, page, tPROG, program bandwidth, placement), ``policy`` (buffered,
window_aware, prefetch, block_first, group_size as the stripe), the SRAM split.
"""

from __future__ import annotations

import numpy as np
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.memory import hbf_packages
from hbfjax.memory.organisations import DECODE_KV, HBF
from hbfjax.serve import hbf_writes
from hbfjax.serve.part import Part
from hbfjax.serve.parts import sram


def write_knobs(org, policy) -> hbf_writes.WriteKnobs:
    """The all-HBF write path's knobs from the organisation and policy (the SRAM budget set per pass)."""
    return hbf_writes.WriteKnobs(
        buffered=policy.buffered, window_aware=policy.window_aware, prefetch=policy.prefetch,
        block_first=policy.block_first,
        stripe_pages=policy.group_size, planes=hbf_packages.planes(org), page_bytes=org.page_bytes,
        t_prog_us=org.t_prog_us, write_gbps=org.hbf_stacks * org.hbf_write_gbps,
        sram_kv_budget_bytes=hbf_packages.sram_bytes(org))


class WriteTotals(NamedTuple):
    """Per-run sums of the writes part (float32[])."""

    forced_writebacks: jax.Array  # layers whose buffered KV overflowed the SRAM budget (window policy)


def part(knobs, config, run) -> Part:
    org, policy, model = knobs.org, knobs.policy, config.model
    budget = sram.plan(knobs, config)
    base = write_knobs(org, policy)
    all_hbf = org.place[DECODE_KV, HBF] >= 0.5  # new KV programmed straight into HBF
    per_token, per_token_layer = float(model.kv_bytes_per_token), float(model.kv_bytes_per_token_layer)

    def writes(state, view, reads, times, record):
        b = view.batch
        if budget.kv_cap_bytes is None:
            left = jnp.maximum(budget.total_bytes - sram.others_bytes(budget, reads.sram_bytes), 0.0)
            wk = dataclasses.replace(base, sram_kv_budget_bytes=left)
        else:
            wk = dataclasses.replace(base, sram_kv_budget_bytes=budget.kv_cap_bytes,
                                     prefetch=policy.prefetch * budget.prefetch_held)
        decode = b.decode_mask.sum(dtype=jnp.int32)
        chunks = jnp.where(b.chunk_mask, b.chunk_tokens, 0).astype(jnp.int32)
        chunk = chunks.sum(dtype=jnp.int32)
        state, w = hbf_writes.pass_writes(state, times, decode, chunk, decode, per_token_layer, wk,
                                          budget.temperature_pages, max_chunk_tokens=chunks.max())
        pick = lambda hbf, other: jnp.where(all_hbf, jnp.asarray(hbf, jnp.float32), other)  # noqa: E731
        record = record._replace(stall_us=pick(w.stall_us.sum(), record.stall_us),
                                 prefill_write_bytes=pick(chunk * per_token, record.prefill_write_bytes),
                                 writeback_bytes=pick(decode * per_token, record.writeback_bytes),
                                 program_busy_us=pick(w.program_busy_us, record.program_busy_us),
                                 sram_kv_peak_bytes=w.buffer_peak_bytes)
        return state, record, WriteTotals(forced_writebacks=w.forced_writebacks)

    return Part(init=hbf_writes.init_state, writes=writes, totals=WriteTotals)


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream: exposed write stall per iteration (HBFlex Fig. 18) and the
    layers whose buffered KV overflowed the SRAM budget."""
    iterations = np.maximum(np.asarray(out.iterations, np.float64), 1.0)
    return {"write_stall_us_per_iteration": np.asarray(out.totals.write_stall_us, np.float64) / iterations,
            "forced_writebacks": np.asarray(own.totals.forced_writebacks, np.float64)}
