"""New KV programmed into an all-HBF package during one serving pass: immediate, stripe and
window-aware writeback (HBFlex §3.2, §5.3, Fig. 8, 9, 13, 18; DESIGN.md §4 "Program/read interference").

Every pass each layer produces new KV: one token per running decode request and the prefill chunk's
tokens, ``kv_bytes_per_token_layer`` bytes each, at its QKV projection. A program occupies its plane
for tPROG and cannot be preempted; the layer's next HBF read (attention's KV read right after the QKV
projection, then the next layer's weights) touches every plane, so a program issued on the critical
path stalls the pass until it ends. Pages go to distinct planes in parallel (plane-balanced
allocation, HBFlex §5.2), so ``n`` pages programmed at once take

    program_us(n) = max(ceil(n / planes) × tPROG, n × page_bytes / write_gbps)

(a program writes a whole page; the package program bandwidth bounds the batch too). Per layer l:

* immediate (``buffered = 0``): each decode request's new KV is its own program, ceil(its bytes /
  page) pages, and the chunk's KV ceil(tokens × bytes / page) pages (HBFlex §3.2: "writing these
  updates immediately underutilizes plane parallelism"); the layer stalls program_us(pages). For
  DeepSeek-V4-Pro (61 layers, 64 requests, 82 B/token/layer) that is one tPROG per layer, ≈ 4.6 ms
  a pass (HBFlex Fig. 18: 4.54 ms).
* immediate block-first (``buffered = 0, block_first = 1``; HBFlex §6.3's naive baseline, "immediate
  block-first writes"): a request's consecutive pages fill its open block on one plane, so its pages of
  the layer program one after another there, while different requests' open blocks (on distinct planes
  while requests ≤ planes, as a block allocator picks them) program in parallel: the layer stalls
  max(rounds × tPROG, pages × page_bytes / write_gbps) with rounds the largest request's pages, its
  prefill chunk's ceil(chunk tokens × bytes / page) or a decode request's (``block_first_rounds``).
  For DeepSeek-V3 a 512-token chunk is 72 pages a layer: 72 × 75 µs = 5.4 ms a layer, 0.33 s a pass.
* stripe (``buffered = 1, window_aware = 0``): new KV accumulates; every whole stripe of G pages is
  programmed at once (``writeback.kv_programs("stripe")``), the layer stalls program_us(stripes × G);
  the remainder (< G pages) stays buffered.
* window (``buffered = 1, window_aware = 1``; HBFlex §5.3): new KV enters the SRAM buffer; if it
  would exceed ``sram_kv_budget_bytes`` the excess, rounded up to whole stripes, is programmed at once
  (a forced writeback, ``writeback.kv_programs("window")``: HBFlex "forces writeback and temporarily
  stalls decoding"), stalling program_us(forced pages). Then the layer's read-free window drains the
  buffer (``writeback.window_drain``): floor(window / tPROG) rounds of up to ``planes`` pages, whole
  stripes only, and no more than window × write_gbps bytes, so the drain never stalls. The window is
  the time the layer's HBF arrays sit idle while the GPU computes, Σ_o max(op_us − delivery_us, 0)
  over its operators with weight prefetch (consecutive operators run back to back with no weight read
  between them, HBFlex Fig. 13a), and the largest single operator's idle time without. Prefill chunks'
  compute makes long windows; decode-only passes short ones (HBFlex Fig. 9, 13b).

Readings of the paper made here: a layer's window is placed after its new KV arrives, although
the QKV projection's own idle time (counted in the window) physically precedes it, a small optimism
at the operator granularity of ``LayerTimes``; the buffer is one package-wide pool, not one per layer
or plane group; programs of the window policy touch no reads (their planes are idle by definition of
the window); the integrator adds ``stall_us`` to the layers' times.

Ordering (tests/test_hbf_writes.py): stall(window) <= stall(stripe) <= stall(immediate) holds when G
divides planes, the buffer starts below one stripe, the write bandwidth never binds (write_gbps >=
planes × page / tPROG) and, for window <= stripe, planes = G with a budget >= G pages. It can fail
otherwise: with planes > G two forced single-stripe programs in two layers (or passes) cost two
rounds where stripe writes both stripes in one; with a binding bandwidth a stripe completed by one
token takes longer than that token's single page. The HBFlex package sits just below the bandwidth
condition (6 × 27.2 = 163.2 GB/s against 3,072 × 4 KiB / 75 µs = 167.8 GB/s: a full-width round
takes 77.1 µs).

Policies are traced 0/1 switches (``jnp.where`` on every branch), so an ablation compiles once. One
pass of one stream; vmap at the top. Times float32 µs, counts float32 (exact below 2^24 pages a pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.flash.programs.writeback import MAX_US, kv_programs, window_drain
from hbfjax.hardware import HbfSpec
from hbfjax.relax import soft_relu, soft_step
from hbfjax.serve.layer_time import LayerTimes
from hbfjax.validate import INT32_MAX, require, require_int, require_real

_SWITCHES = ("buffered", "window_aware", "prefetch", "block_first")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WriteKnobs:
    """Traced writeback knobs (scalars; stack a leading axis to sweep)."""

    buffered: jax.Array  # f32[] 0: immediate (HBFlex §3.2, naive HBF); 1: buffered (stripe or window)
    block_first: jax.Array  # f32[] with immediate: 1 a request's pages program serially on its block's plane
    window_aware: jax.Array  # f32[] with buffered: 0 stripe; 1 window (HBFlex §5.3)
    prefetch: jax.Array  # f32[] 1: a layer's idle array time is one window (HBFlex Fig. 13a); 0: one operator's
    stripe_pages: jax.Array  # f32[] G: pages programmed together, one per plane of a plane group
    planes: jax.Array  # f32[] planes that program in parallel
    page_bytes: jax.Array  # f32[] bytes of one HBF page
    t_prog_us: jax.Array  # f32[] page program latency tPROG
    write_gbps: jax.Array  # f32[] package program bandwidth (HBFlex §6.1: 6 × 27.2 GB/s)
    sram_kv_budget_bytes: jax.Array  # f32[] SRAM left for buffered KV (window policy)

    @classmethod
    def make(cls, *, sram_kv_budget_bytes, buffered=1.0, window_aware=1.0, prefetch=1.0, stripe_pages=32,
             planes=3072, page_bytes=4096, t_prog_us=75.0, write_gbps=6 * 27.2, block_first=0.0) -> "WriteKnobs":
        """Validated knobs (defaults: the HBFlex package, §6.1): switches 0 or 1, 1 <= G <= planes
        whole pages, times and rates finite and > 0, the SRAM budget in [0, 2^31) bytes."""
        c = cls.__name__
        for name, value in zip(_SWITCHES, (buffered, window_aware, prefetch, block_first)):
            require(value in (0, 1), c, name, value, "must be 0 or 1")
        planes = require_int(c, "planes", planes, 1, 2**24)
        require_int(c, "stripe_pages", stripe_pages, 1, planes)
        require_int(c, "page_bytes", page_bytes, 1)
        require_real(c, "t_prog_us", t_prog_us, 0.0, MAX_US, lo_open=True)
        require_real(c, "write_gbps", write_gbps, 0.0, 1e6, lo_open=True)
        require_real(c, "sram_kv_budget_bytes", sram_kv_budget_bytes, 0.0, INT32_MAX)
        f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(buffered=f(buffered), window_aware=f(window_aware), prefetch=f(prefetch), block_first=f(block_first),
                   stripe_pages=f(stripe_pages), planes=f(planes), page_bytes=f(page_bytes), t_prog_us=f(t_prog_us),
                   write_gbps=f(write_gbps), sram_kv_budget_bytes=f(sram_kv_budget_bytes))

    @classmethod
    def for_package(cls, hbf: HbfSpec, *, sram_kv_budget_bytes, stripe_pages=32, **switches) -> "WriteKnobs":
        """Knobs of a package preset: its planes, page, tPROG and write bandwidth (``HbfSpec.write_bw_gbps``)."""
        return cls.make(sram_kv_budget_bytes=sram_kv_budget_bytes, stripe_pages=stripe_pages, planes=hbf.planes,
                        page_bytes=hbf.page_bytes, t_prog_us=hbf.t_prog_us, write_gbps=hbf.write_bw_gbps, **switches)


class WriteState(NamedTuple):
    """Carried from pass to pass (one stream)."""

    buffer_bytes: jax.Array  # f32[] KV waiting in SRAM (stripe, window)


class PassWrites(NamedTuple):
    """What one pass's KV writes cost (one stream)."""

    stall_us: jax.Array  # f32[L] per layer: programs on the critical path
    programmed_pages: jax.Array  # f32[] page programs issued (a partial page counts one)
    program_busy_us: jax.Array  # f32[] Σ over program batches of rounds × tPROG (plane occupancy)
    forced_writebacks: jax.Array  # f32[] layers whose KV overflowed the SRAM budget (window)
    buffer_peak_bytes: jax.Array  # f32[] buffer peak once each layer's at-arrival programs are issued (the carried
    # buffer's overflow leaves before the pass stages its prefetch and offload, so it is not counted on its own)
    window_us: jax.Array  # f32[L] each layer's read-free window (whatever the policy)


class _FlashView(NamedTuple):
    """The ``writeback.FlashKnobs`` fields that ``kv_programs`` and ``window_drain`` read."""

    t_prog_us: jax.Array
    page_bytes: jax.Array
    planes_per_slot: jax.Array  # all planes as one slot: window_drain(..., plane_slots=1)
    stripe_pages: jax.Array
    buffer_capacity_pages: jax.Array


def init_state() -> WriteState:
    return WriteState(buffer_bytes=jnp.float32(0.0))


def window_us(times: LayerTimes, prefetch) -> jax.Array:
    """f32[L]: each layer's idle array time, summed over its operators with prefetch, else the
    largest single operator's (HBFlex Fig. 13a). A fractional ``prefetch`` π (the share of the
    prefetch group the SRAM holds, ``hbflex_system.SramSplit``) interpolates: π · sum + (1 − π) · max
    (an assumption: the paper states only the two ends); 0 and 1 give the two ends exactly."""
    idle = jnp.maximum(times.op_us - times.delivery_us, 0.0)  # f32[L, ops]
    pi = jnp.clip(jnp.asarray(prefetch, jnp.float32), 0.0, 1.0)
    return pi * idle.sum(axis=-1) + (1.0 - pi) * idle.max(axis=-1)


def _straight_through(exact, surrogate):
    """``exact`` forward, the derivative of ``surrogate`` (a relaxed gradient path, forward value unchanged)."""
    return surrogate + jax.lax.stop_gradient(exact - surrogate)


def _relaxed_forced(buf, capacity_pages, stripe_pages, temperature):
    """(pages of a forced writeback, forced indicator) of the window policy relaxed at ``temperature`` (pages): the
    indicator ``1[over > 0]`` as ``soft_step(over, t)``, the pages as that times the exact stripe round-up
    of ``soft_relu(over, t)`` (straight-through), at most ``floor(buf)``. As t → 0 both are exact; the
    bias is at most ``exp(−|over| / t)`` in the indicator and one stripe where ``over`` lies within
    ``t · log 2`` below a stripe boundary. The pages leaving the buffer are their product."""

    over = buf - capacity_pages
    ind = soft_step(over, temperature)
    body = soft_relu(over, temperature)
    stripes = _straight_through(jnp.ceil(body / stripe_pages), body / stripe_pages) * stripe_pages
    return jnp.minimum(stripes, jnp.floor(buf)), ind


def program_rounds(pages, knobs: WriteKnobs):
    """Sequential program rounds of ``pages`` spread over distinct planes."""
    return jnp.ceil(pages / knobs.planes)


def program_us(pages, knobs: WriteKnobs, relaxed: bool = False):
    """Time to program ``pages`` at once: their rounds of tPROG, no faster than the write bandwidth.
    ``relaxed``: the rounds' ceiling differentiates as ``pages / planes`` (straight-through; same value)."""
    rounds = program_rounds(pages, knobs)
    if relaxed:
        rounds = _straight_through(rounds, pages / knobs.planes)
    return jnp.maximum(rounds * knobs.t_prog_us, pages * knobs.page_bytes * 1e-3 / knobs.write_gbps)


def _decode_split(new_decode_tokens, decode_requests):
    """(requests, q, r): ``new_decode_tokens`` spread as evenly as they go over ``decode_requests`` (at least
    one: tokens without a request make one program, none are dropped): r requests get q + 1, the rest q."""
    requests = jnp.maximum(decode_requests, 1)
    return requests, new_decode_tokens // requests, new_decode_tokens % requests


def _pages(tokens, kv_bytes, page_bytes) -> jax.Array:
    """float32: whole pages holding ``tokens`` of one layer's KV."""
    return jnp.ceil(tokens.astype(jnp.float32) * kv_bytes / page_bytes)


def immediate_pages(new_decode_tokens, decode_requests, new_chunk_tokens, kv_bytes, page_bytes):
    """Page programs of one layer under immediate writeback: each request's tokens (:func:`_decode_split`)
    as its own partial-page program, plus the chunk's."""
    requests, q, r = _decode_split(new_decode_tokens, decode_requests)
    return (r.astype(jnp.float32) * _pages(q + 1, kv_bytes, page_bytes)
            + (requests - r).astype(jnp.float32) * _pages(q, kv_bytes, page_bytes)
            + _pages(new_chunk_tokens, kv_bytes, page_bytes))


def block_first_rounds(new_decode_tokens, decode_requests, max_chunk_tokens, kv_bytes, page_bytes):
    """Serial program rounds of one layer under immediate block-first writes (module docstring): the
    largest request's pages, its prefill chunk's or a decode request's (q + 1 tokens where
    ``new_decode_tokens`` do not split evenly over ``decode_requests``, :func:`_decode_split`)."""
    _, q, r = _decode_split(new_decode_tokens, decode_requests)
    return jnp.maximum(_pages(q + (r > 0).astype(q.dtype), kv_bytes, page_bytes),
                       _pages(max_chunk_tokens, kv_bytes, page_bytes))


def pass_writes(state: WriteState, times: LayerTimes, new_decode_tokens, new_chunk_tokens, decode_requests,
                kv_bytes_per_token_layer, knobs: WriteKnobs, temperature=None,
                max_chunk_tokens=None) -> tuple[WriteState, PassWrites]:
    """One pass's KV writes (module docstring). ``new_decode_tokens``, ``new_chunk_tokens``,
    ``decode_requests``: int32[] (each decode request gains its share of ``new_decode_tokens``: one
    each in plain decoding); ``max_chunk_tokens`` int32[]: the largest request's prefill chunk (None: the
    whole ``new_chunk_tokens``, one request's); ``kv_bytes_per_token_layer``: float or f32[]. ``temperature`` (pages; None:
    exact): the window policy's forced writeback relaxed (:func:`_relaxed_forced`) and its program rounds
    straight-through, so the stall differentiates in the SRAM KV budget (issue 13). The drain is left
    exact: a window gains a round only at each whole tPROG, and a straight-through drain would claim
    planes / tPROG pages per µs of window where the exact drain gains none. A forced writeback near the
    threshold multiplies the buffer's tangent by about 1 − G · sigmoid'(overflow / t) / t − sigmoid(…),
    as low as 1 − G / (4t) − 1/2 (G = ``stripe_pages``): at small t the tangent grows from pass to pass
    (the HBFlex-SRAM run overflows to NaN at t <= 2 pages with G = 32; finite at t >= 4)."""
    kv = jnp.asarray(kv_bytes_per_token_layer, jnp.float32)
    dec = jnp.asarray(new_decode_tokens, jnp.int32)
    chunk = jnp.asarray(new_chunk_tokens, jnp.int32)
    page = knobs.page_bytes
    view = _FlashView(t_prog_us=knobs.t_prog_us, page_bytes=page, planes_per_slot=knobs.planes,
                      stripe_pages=knobs.stripe_pages, buffer_capacity_pages=knobs.sram_kv_budget_bytes / page)
    imm = immediate_pages(dec, jnp.asarray(decode_requests, jnp.int32), chunk, kv, page)
    largest = chunk if max_chunk_tokens is None else jnp.asarray(max_chunk_tokens, jnp.int32)
    serial = (knobs.block_first > 0.5) & (knobs.buffered <= 0.5)  # immediate block-first
    bf_rounds = jnp.maximum(block_first_rounds(dec, jnp.asarray(decode_requests, jnp.int32), largest, kv, page),
                            program_rounds(imm, knobs))
    bf_us = jnp.maximum(bf_rounds * knobs.t_prog_us, imm * page * 1e-3 / knobs.write_gbps)
    dec_f, chunk_f = dec.astype(jnp.float32), chunk.astype(jnp.float32)
    buffered = knobs.buffered > 0.5
    window = buffered & (knobs.window_aware > 0.5)
    windows = window_us(times, knobs.prefetch)  # f32[L]

    def layer(buf, window_l):  # buf: f32[] buffered pages
        after_stripe, stripe_n, _, _ = kv_programs("stripe", buf, dec_f, chunk_f, kv, view)
        after_forced, forced_n, _, forced = kv_programs("window", buf, dec_f, chunk_f, kv, view)
        bw_pages = window_l * knobs.write_gbps * 1e3 / page
        drain = window_drain(jnp.minimum(after_forced, bw_pages), window_l, view, 1)
        if temperature is not None:
            arrived = buf + (dec_f + chunk_f) * kv / page
            whole, forced = _relaxed_forced(arrived, view.buffer_capacity_pages, knobs.stripe_pages, temperature)
            forced_n = forced * whole
            after_forced = arrived - forced_n
        drained = jnp.where(window, drain, 0.0)
        exposed = jnp.where(buffered, jnp.where(window, forced_n, stripe_n), imm)  # pages at the KV point
        resident = jnp.where(buffered, jnp.where(window, after_forced, after_stripe), buf)
        exposed_us = jnp.where(exposed > 0, jnp.where(serial, bf_us, program_us(exposed, knobs)), 0.0)
        if temperature is None:
            stall = exposed_us
        else:  # the forced program's time scaled by the relaxed indicator (window), exact otherwise
            stall = jnp.where(window, forced * program_us(whole, knobs, relaxed=True), exposed_us)
        exposed_rounds = jnp.where(serial & (exposed > 0), bf_rounds, program_rounds(exposed, knobs))
        busy = (exposed_rounds + program_rounds(drained, knobs)) * knobs.t_prog_us
        forced_flag = (window & (forced > 0)) if temperature is None else jnp.where(window, forced, 0.0)
        return resident - drained, (stall, exposed + drained, busy, forced_flag, resident)

    buf0 = state.buffer_bytes / page
    buf_end, (stall, pages, busy, forced, resident) = jax.lax.scan(layer, buf0, windows)
    out = PassWrites(stall_us=stall, programmed_pages=pages.sum(), program_busy_us=busy.sum(),
                     forced_writebacks=forced.sum().astype(jnp.float32),
                     buffer_peak_bytes=resident.max() * page, window_us=windows)
    return WriteState(buffer_bytes=buf_end * page), out
