"""The protocol of a serving mechanism: a *part* (DESIGN.md §5 "One engine of parts"; review 2026-12-02 §8).

A part is a NamedTuple of pure functions over its own state ``S`` (like ``optax.GradientTransformation``),
built for one stream by its module's ``part(knobs, config, run) -> Part`` (knobs traced, config static,
``run`` the per-run values of :class:`RunView`). The engine (:mod:`hbfjax.serve.engine`) composes the
parts of a system at trace time, in the order the system lists them, so composition adds no work at
run time. At each of the four stages of the loop the engine folds a typed *record* through the parts
that have a hook for it, each part reading what earlier parts wrote and adding its own say (as
``optax.chain`` folds updates):

=============  ===================================================  =====================================
stage          hook                                                 record folded
=============  ===================================================  =====================================
boundary       ``admit(S, AdmitView, Admission)                      KV reused by new requests, KV retired
               -> (S, Admission, T)``
pass, before   ``reads(S, PassView, Reads) -> (S, Reads, T)``        how the pass's KV reads split and
the layer                                                            amplify (→ ``layer_time``)
times
pass, after    ``writes(S, PassView, Reads, LayerTimes, Writes)      the pass's KV writes and what they
               -> (S, Writes, T)``                                   expose on the critical path
chunk          ``every_chunk(S, Chunk) -> (S, Chunk)``               amortised work (eviction, GC) and its
                                                                     exposed time in the next iteration
=============  ===================================================  =====================================

``T`` is the part's own per-pass totals record (:mod:`hbfjax.serve.totals`; ``totals`` names its type),
added up by the engine with Kahan compensation; a hook returns None for ``T`` when it adds nothing. ``finish(S)`` (optional) returns what the run's output keeps of the final
state and an overflow flag (a buffer of the part that filled). Order rules, fixed by the engine and
not by the parts: admissions, then per pass the reads, the layer times and the writes; every chunk
after its iterations.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.serve.state import ServeState
from hbfjax.workload.requests import Requests
from hbfjax.workload.timing import Batch


class RunView(NamedTuple):
    """What a part's constructor may use besides its knobs and config: values fixed for the run."""

    words: tuple  # (seed uint32[], stream int32[]): the stream's hash words
    requests: Requests  # the stream's requests [R]
    inputs: Any  # the run's ServeInputs (a trace, a measured GPU table, tabulated read laws)
    capacity: Any  # kv_tiers.Capacity: HBM KV budget, HBF room the weights leave, writeback unit (tokens)
    room_tokens: jax.Array  # int32[] the HBF KV room (ServeKnobs.kv_room_bytes, or what the weights leave)


class AdmitView(NamedTuple):
    """What every part sees at an iteration boundary, right after admission."""

    state: ServeState  # the slot table holding this boundary's admissions (kv_tokens before any reuse)
    new: jax.Array  # bool[B] slots that just received a request
    finished: jax.Array  # bool[B] slots whose request finished since the last boundary
    finished_request: jax.Array  # int32[B] that request (−1 where none)


class Admission(NamedTuple):
    """Folded through the ``admit`` hooks (the engine starts it at zeros)."""

    reused: jax.Array  # int32[B] KV tokens of each new request already held, not prefilled nor reserved
    retired_hbm_tokens: jax.Array  # int32[B] HBM-resident KV tokens of each finished request (tiers)
    kept_tokens: jax.Array  # int32[B] a new request whose session's retained KV it took keeps this much of it (its
    #   reused tokens), the rest (the diverged tail) dies (sessions); −1: no retained KV taken


class PassView(NamedTuple):
    """What every part sees of one GPU pass (read-only)."""

    words: tuple  # (seed, stream)
    draw: jax.Array  # int32[] 2·iteration + pass: the pass's draw index
    batch: Batch  # its decode tokens and prefill chunks, masked, [B]
    kv_tokens: jax.Array  # int32[B] each slot's KV tokens before the pass
    request: jax.Array  # int32[B] each slot's request, −1 when empty


class Reads(NamedTuple):
    """Folded through the ``reads`` hooks before the layer times (the engine starts it at
    :func:`no_reads`)."""

    hbm_share: tuple  # (decode, chunk) float32[] HBM shares of the attention's KV reads
    hbf_tokens: jax.Array  # int32[B] each slot's HBF-resident KV tokens before the pass (tiers)
    hbf_factor: jax.Array  # float32[] >= 1: read-wave amplification of the HBF share (reads)
    sram_bytes: jax.Array  # float32[] base-die SRAM that offloaded KV pages hold during the pass (reads)


class Writes(NamedTuple):
    """Folded through the ``writes`` hooks after the layer times (the engine starts it at zeros); the
    engine books it into the run's totals and adds ``stall_us`` to the pass."""

    stall_us: jax.Array  # float32[] KV-write time beyond its windows, on the critical path
    prefill_write_bytes: jax.Array  # float32[] new KV written from the GPU straight to HBF
    writeback_bytes: jax.Array  # float32[] KV written back from HBM to HBF (all-HBF: decode KV programmed)
    program_busy_us: jax.Array  # float32[] HBF program time (rounds × tPROG)
    writeback_passes: jax.Array  # float32[] 1 if the pass wrote KV back from HBM
    kv_hbm_tokens: jax.Array  # int32[] HBM-resident KV after the pass
    kv_hbf_tokens: jax.Array  # int32[] HBF-resident KV after the pass
    hbf_new_tokens: jax.Array  # int32[B] KV tokens each slot put in HBF in this pass
    sram_kv_peak_bytes: jax.Array  # float32[] SRAM peak of buffered KV in the pass (all-HBF writes)


class Chunk(NamedTuple):
    """Folded through the ``every_chunk`` hooks once per chunk of iterations."""

    evicted: jax.Array  # bool[R] sessions whose retained KV was evicted now (their pages die)
    exposed_us: jax.Array  # float32[] time the chunk's work adds to the next iteration (e.g. GC migrations)


class Part(NamedTuple):
    """One serving mechanism (module docstring); every hook but ``init`` is optional."""

    init: Callable[[], Any]
    admit: Callable | None = None
    reads: Callable | None = None
    writes: Callable | None = None
    every_chunk: Callable | None = None
    finish: Callable | None = None  # S -> (what the output keeps, overflow bool[])
    totals: type | None = None  # the part's per-pass totals record type
    missing_inputs: jax.Array | None = None  # bool[] the run's inputs lack what the part needs (e.g. a read law)


def no_reads(view: PassView) -> Reads:
    """Reads of a pass with no part's say: every KV token in HBF, read at its bytes' rate."""
    zero = jnp.float32(0.0)
    return Reads(hbm_share=(zero, zero), hbf_tokens=jnp.zeros_like(view.kv_tokens), hbf_factor=jnp.float32(1.0),
                 sram_bytes=zero)


def no_writes(view: PassView) -> Writes:
    """Writes of a pass with no part's say: nothing written, nothing resident."""
    z, i = jnp.float32(0.0), jnp.int32(0)
    return Writes(stall_us=z, prefill_write_bytes=z, writeback_bytes=z, program_busy_us=z, writeback_passes=z,
                  kv_hbm_tokens=i, kv_hbf_tokens=i, hbf_new_tokens=jnp.zeros_like(view.kv_tokens), sram_kv_peak_bytes=z)
