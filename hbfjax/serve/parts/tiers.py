"""The ``tiers`` part: where each running request's KV lives, HBM or HBF, and the DASH write path
(DASH §V-A1, §V-B "Direct Prefill Write", "HBM-to-HBF KV Writeback", "Parallel HBM/HBF Read").

State: ``kv_tiers.KvTiers`` (per slot, the KV tokens held in HBM; the rest of the request's KV is in
HBF). At each boundary a slot that holds a new request (or none) starts empty, and the HBM-resident KV
of each finished request is reported in ``Admission.retired_hbm_tokens`` (a retained request's KV then
moves to HBF: ``parts.sessions``). Per pass:

* reads: the HBM share of the KV that the decode and chunk attention read (``kv_tiers.read_shares``),
  and each slot's HBF-resident tokens; relaxed runs add the HBM budget's straight-through derivative
  (``kv_tiers.budget_straight_through``);
* writes: the pass's new tokens placed by the organisation's placement and written back in page waves
  once the HBM KV budget is exceeded (``kv_tiers.book``), their writes laid on the layers' windows and
  what exceeds a window exposed (``layer_time.kv_writes``).

:func:`batcher_knobs` gives the batcher the tier capacities it admits into: the HBM KV budget, and the
HBF KV room where running requests' KV may live in HBF (``PolicyKnobs.hbf_request_kv``; H3: HBM only).
Knobs read: ``org``, ``hbm_kv_budget_bytes`` (through ``RunView.capacity``), ``policy.hbf_request_kv``.
"""

from __future__ import annotations

import jax.numpy as jnp

from hbfjax.serve import kv_tiers, layer_time
from hbfjax.serve.part import Part, RunView
from hbfjax.serve.state import BatcherKnobs


def hbf_resident_tokens(kv: kv_tiers.KvTiers, kv_tokens) -> jnp.ndarray:
    """int32[B] HBF-resident KV tokens of each slot."""
    return jnp.where(kv.request >= 0, kv_tokens - kv.hbm_tokens, 0)


def admission_capacity(capacity: kv_tiers.Capacity, batcher: BatcherKnobs) -> BatcherKnobs:
    """The batcher's knobs with its tier capacities the organisation's (HBM budget, HBF room), cut
    to the batcher's own total where that is smaller."""
    cap = batcher.kv_capacity_tokens.sum()
    hbm = jnp.minimum(capacity.hbm_budget_tokens, cap)
    hbf = jnp.minimum(capacity.hbf_tokens, cap - hbm)
    tiers = batcher.kv_capacity_tokens.shape[0]
    caps = jnp.zeros(tiers, jnp.int32).at[0].set(hbm).at[min(1, tiers - 1)].add(hbf)
    return BatcherKnobs(chunk_tokens=batcher.chunk_tokens, token_budget=batcher.token_budget, kv_capacity_tokens=caps)


def batcher_knobs(knobs, run: RunView) -> BatcherKnobs:
    """The batcher's tier capacities: the HBM KV budget, and the HBF KV room where running requests'
    KV may live in HBF (module docstring)."""
    hbf = jnp.where(knobs.policy.hbf_request_kv > 0, run.room_tokens, 0)
    return admission_capacity(run.capacity._replace(hbf_tokens=hbf), knobs.batcher)


def part(knobs, config, run: RunView) -> Part:
    org, model, capacity = knobs.org, config.model, run.capacity
    relax_us = knobs.delivery_relax_us

    def admit(kv, view, record):
        retired = jnp.where(view.finished, kv.hbm_tokens, 0)
        return (kv_tiers.sync(kv, view.state.slots.request),
                record._replace(retired_hbm_tokens=record.retired_hbm_tokens + retired), None)

    def reads(kv, view, record):
        shares = kv_tiers.read_shares(kv, view.kv_tokens, view.batch)
        if relax_us is not None:
            shares = kv_tiers.budget_straight_through(shares, kv, view.kv_tokens, view.batch, capacity,
                                                      knobs.hbm_kv_budget_bytes, float(model.kv_bytes_per_token))
        return kv, record._replace(hbm_share=shares, hbf_tokens=hbf_resident_tokens(kv, view.kv_tokens)), None

    def writes(kv, view, reads_record, times, record):
        b = view.batch
        new_kv, moves = kv_tiers.book(kv, view.kv_tokens, b, org, capacity)
        w = layer_time.kv_writes(times, moves.to_hbf_tokens, moves.writeback_tokens, org, model)
        after = view.kv_tokens + jnp.where(b.chunk_mask, b.chunk_tokens, 0) + b.decode_mask
        hbf_new = jnp.maximum(hbf_resident_tokens(new_kv, after) - reads_record.hbf_tokens, 0)
        return new_kv, record._replace(
            stall_us=record.stall_us + w.stall_us.sum(), prefill_write_bytes=w.direct_bytes,
            writeback_bytes=w.writeback_bytes, program_busy_us=w.program_busy_us,
            writeback_passes=(moves.writeback_tokens > 0).astype(jnp.float32), kv_hbm_tokens=moves.hbm_tokens,
            kv_hbf_tokens=moves.hbf_tokens, hbf_new_tokens=jnp.where(kv.request >= 0, hbf_new, 0)), None

    return Part(init=lambda: kv_tiers.init(config.batcher.slots), admit=admit, reads=reads, writes=writes)
