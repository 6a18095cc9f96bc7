"""Where each running request's KV lives, HBM or HBF, and the KV writes a pass causes (DASH §V-A1,
§V-B "Direct Prefill Write" and "HBM-to-HBF KV Writeback", §VI-F; DESIGN.md §5).

Per slot, ``hbm_tokens`` of the request's ``kv_tokens`` (the batcher's count) are held in HBM, the
rest in HBF. One pass moves them so:

1. **New tokens** go where the placement puts their kind (``OrgKnobs.place``): a prefill chunk's
   tokens by the ``prefill_kv`` row, a decode token by the ``decode_kv`` row — to HBM when the row's
   HBM-only share is at least one half, else to HBF (tokens are whole; a replicated KV share is not
   modelled). DASH: prefill KV to HBF, written straight from the GPU (the direct prefill write);
   decode KV appended in HBM.
2. **Writeback**: when the HBM-resident KV of all slots exceeds the HBM KV budget
   (:func:`capacity_tokens`), whole writeback units of the oldest HBM-resident KV — the
   earliest-admitted requests' first — move to HBF, until it fits again. A unit is the most whole
   tokens whose KV (all layers) fits one page wave (DASH §V-B: "a full HBF page wave is the aggregate
   data volume that can be programmed concurrently across all HBF stacks, dies, and planes").

Reads: the attention of a decode token reads its request's whole KV, that of a chunk its prefix; the
HBM share of each (:func:`read_shares`) splits the attention KV reads between the tiers, read in
parallel (DASH §V-B "Parallel HBM/HBF Read").

Capacity (:func:`capacity_tokens`): HBM holds the weights the placement puts there and KV up to the
budget (by default every HBM byte the weights leave; DASH §VI-F states a 24.46 GB decode-KV budget for
Llama 4 Maverick, a value the caller may pass); HBF holds its weights and any KV in the rest. The
batcher admits a request while its whole KV fits their sum (the HBM budget is soft: writeback keeps it).
Not modelled: KV of finished requests kept for prefix reuse, and GC of the HBF KV blocks (``hbfjax gc``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.memory.organisations import DECODE_KV, DENSE_WEIGHTS, EXPERT_WEIGHTS, HBM, PREFILL_KV, OrgKnobs
from hbfjax.memory import organisations as orgs
from hbfjax.serve.state import MAX_KV_TOKENS
from hbfjax.workload.models import ModelSpec
from hbfjax.workload.timing import Batch


class KvTiers(NamedTuple):
    """Per-slot KV residency (a mechanism's state beside the slot table)."""

    request: jax.Array  # int32[B] the request the entry describes (−1: none); a new one resets it
    hbm_tokens: jax.Array  # int32[B] KV tokens of that request held in HBM (the rest of kv_tokens in HBF)


class KvMoves(NamedTuple):
    """What one pass wrote (tokens; all int32[])."""

    to_hbf_tokens: jax.Array  # new tokens written from the GPU straight to HBF
    to_hbm_tokens: jax.Array  # new tokens appended in HBM
    writeback_tokens: jax.Array  # HBM-resident tokens written back to HBF
    hbm_tokens: jax.Array  # HBM-resident KV tokens after the pass
    hbf_tokens: jax.Array  # HBF-resident KV tokens after the pass


class Capacity(NamedTuple):
    """KV capacity of an organisation for a model (int32[] tokens)."""

    hbm_budget_tokens: jax.Array  # HBM-resident KV above which writeback starts
    hbf_tokens: jax.Array  # KV tokens the HBF left by the weights holds
    writeback_unit_tokens: jax.Array  # whole tokens of KV (all layers) in one page wave (>= 1)


def init(slots: int) -> KvTiers:
    return KvTiers(request=jnp.full(slots, -1, jnp.int32), hbm_tokens=jnp.zeros(slots, jnp.int32))


def capacity_tokens(org: OrgKnobs, model: ModelSpec, hbm_budget_bytes=-1.0) -> Capacity:
    """The budget, HBF room and writeback unit of the module docstring; ``hbm_budget_bytes < 0``
    derives the budget from the HBM the weights leave."""
    weights = jnp.zeros(len(orgs.KINDS), jnp.float32)
    weights = weights.at[DENSE_WEIGHTS].set(model.non_expert_weight_bytes).at[EXPERT_WEIGHTS].set(
        model.expert_weight_bytes)
    held = orgs.tier_bytes(weights, org)  # f32[2] weight bytes in HBM and in HBF
    total = orgs.capacity_bytes(org)
    budget = jnp.where(jnp.asarray(hbm_budget_bytes) >= 0, hbm_budget_bytes, jnp.maximum(total[0] - held[0], 0.0))
    per_token = float(model.kv_bytes_per_token)
    to_tokens = lambda b: jnp.clip(jnp.floor(b / per_token), 0, MAX_KV_TOKENS).astype(jnp.int32)  # noqa: E731
    unit = jnp.maximum(jnp.floor(orgs.page_wave_bytes(org) / per_token), 1.0).astype(jnp.int32)
    return Capacity(hbm_budget_tokens=to_tokens(budget), hbf_tokens=to_tokens(jnp.maximum(total[1] - held[1], 0.0)),
                    writeback_unit_tokens=unit)


def sync(kv: KvTiers, request: jax.Array) -> KvTiers:
    """Entries of slots that now hold another request (just admitted, or emptied) start empty."""
    same = kv.request == request
    return KvTiers(request=request, hbm_tokens=jnp.where(same, kv.hbm_tokens, 0))


def _share(num, den) -> jax.Array:
    return jnp.where(den > 0, num / jnp.maximum(den, 1).astype(jnp.float32), 0.0).astype(jnp.float32)


def read_shares(kv: KvTiers, kv_tokens: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """float32[] HBM shares of the KV that the pass's decode attention and chunk attention read."""
    dec, chk = batch.decode_mask, batch.chunk_mask
    decode = _share(jnp.where(dec, kv.hbm_tokens, 0).sum(), jnp.where(dec, kv_tokens, 0).sum())
    prefill = _share(jnp.where(chk, kv.hbm_tokens, 0).sum(), jnp.where(chk, kv_tokens, 0).sum())
    return decode, prefill



def budget_straight_through(shares: tuple, kv: KvTiers, kv_tokens, batch: Batch, capacity: Capacity,
                            hbm_kv_budget_bytes, kv_bytes_per_token: float) -> tuple:
    """:func:`read_shares` with a straight-through derivative of the decode share in the HBM KV budget
    (relaxed runs only; DESIGN.md §6). The KV booking is in whole tokens and page-wave units, so the exact
    derivative is zero; but while writeback binds (the HBM-resident KV within one unit of the budget) the
    HBM-resident KV *is* the budget, so the share moves by one token over the decode slots' KV tokens per
    budget token. The value is the exact share; the derivative ignores the quantisation to units and that
    a few HBM tokens may sit in slots that are not decoding."""
    decode, chunk = shares
    binding = kv.hbm_tokens.sum() + capacity.writeback_unit_tokens > capacity.hbm_budget_tokens
    den = jnp.where(batch.decode_mask, kv_tokens, 0).sum()
    budget_tokens = hbm_kv_budget_bytes / kv_bytes_per_token
    s = jnp.where(binding & (den > 0), budget_tokens / jnp.maximum(den, 1).astype(jnp.float32), 0.0)
    return decode + (s - jax.lax.stop_gradient(s)), chunk


def _oldest_first(amount, held: jax.Array, request: jax.Array) -> jax.Array:
    """int32[B]: ``amount`` tokens taken from ``held`` (int32[B]) in ascending request order."""
    earlier = (request[None, :] < request[:, None]) & (request[None, :] >= 0)  # [b, j]: j older than b
    ahead = jnp.where(earlier, held[None, :], 0).sum(axis=1)
    return jnp.clip(amount - ahead, 0, held)


def book(kv: KvTiers, kv_tokens: jax.Array, batch: Batch, org: OrgKnobs, capacity: Capacity) -> tuple[KvTiers, KvMoves]:
    """The pass's new tokens placed and the writeback it triggers (module docstring); ``kv_tokens``
    (int32[B]) is each slot's KV before the pass."""
    chunk = jnp.where(batch.chunk_mask, batch.chunk_tokens, 0)
    decode = batch.decode_mask.astype(jnp.int32)
    prefill_hbm = org.place[PREFILL_KV, HBM] >= 0.5
    decode_hbm = org.place[DECODE_KV, HBM] >= 0.5
    new_hbm = jnp.where(prefill_hbm, chunk, 0) + jnp.where(decode_hbm, decode, 0)  # int32[B]
    new_hbf = chunk + decode - new_hbm
    held = kv.hbm_tokens + new_hbm
    excess = jnp.maximum(held.sum() - capacity.hbm_budget_tokens, 0)
    unit = capacity.writeback_unit_tokens
    moved = jnp.minimum((excess + unit - 1) // unit * unit, held.sum())
    taken = _oldest_first(moved, held, kv.request)
    hbm = held - taken
    after = kv_tokens + chunk + decode
    moves = KvMoves(to_hbf_tokens=new_hbf.sum(), to_hbm_tokens=new_hbm.sum(), writeback_tokens=taken.sum(),
                    hbm_tokens=hbm.sum(), hbf_tokens=jnp.where(kv.request >= 0, after - hbm, 0).sum())
    return KvTiers(request=kv.request, hbm_tokens=hbm), moves
