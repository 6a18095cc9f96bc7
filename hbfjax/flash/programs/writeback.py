"""Writeback policies for new KV and the exposed stall they cause (HBFlex §3.2, §5.3; DASH §V-B, §VI-F).

Every iteration each layer produces new KV (decode: one token per running request; prefill: a
chunk) at the end of its ``kv_point`` segment. A policy decides when it is programmed into HBF:

* ``immediate``: each request's token KV (and the prefill chunk) is programmed at once; every
  program costs a full tPROG even for a partial page (HBFlex §3.2).
* ``stripe``: KV is aggregated in a buffer and programmed as full stripes of G pages (HBFlex §5.2).
* ``window``: KV is buffered in base-die SRAM and programmed, in full stripes, only at the start of a
  read-free window, as many rounds as fit before the next read (HBFlex §5.3); weight prefetch
  (``prefetch`` knob) merges compute into longer windows; when the SRAM budget would overflow, the
  excess is written back at once (a forced writeback) and the next read stalls.
* ``dash-hbm``: decode KV is appended in HBM; once the HBM decode-KV budget is reached a full page
  wave is written back over the HBM–HBF link right after the QKV projection, overlapping attention
  (DASH §V-B "HBM-to-HBF KV Writeback"); prefill KV is written directly (next policy).
* ``dash-prefill-direct``: prefill KV goes straight to HBF at the QKV projection, its programs
  overlapping attention (DASH §V-B "Direct Prefill Write"); decode KV stays in HBM.

The stall is never assumed: it is the wait of each read for the programs on its planes
(:mod:`hbfjax.flash.programs.interference`), so forced writebacks and overrunning programs cost exactly what
the plane timeline says. One stream: ``simulate`` for :func:`hbfjax.batch.run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.flash.programs.interference import program_pages, read_wait_us, touched_slots
from hbfjax.flash.programs.timeline import Timeline, apply_prefetch, window_after
from hbfjax.validate import INT32_MAX, ConfigError, require, require_choice, require_int, require_real

# Bounds that keep every float32 time finite and every int32 count provably below 2^31
MAX_US = 1e9  # one segment or tPROG: 1,000 s
MAX_LAYERS = 2**16
MAX_COUNT = 2.0**30  # requests, tokens, bytes per token, stripe pages, MB
MAX_ITERATIONS = 2**24

POLICIES = ("immediate", "stripe", "window", "dash-hbm", "dash-prefill-direct")


@dataclass(frozen=True)
class WritebackConfig:
    """Static shape of a writeback rollout (hashable; a change recompiles)."""

    policy: str
    layers: int
    segments: int
    plane_slots: int
    iterations: int
    warmup_iterations: int = 0  # discarded before averaging

    def __post_init__(self) -> None:
        c = type(self).__name__
        require_choice(c, "policy", self.policy, POLICIES)
        for name in ("layers", "segments", "plane_slots", "iterations"):
            require(isinstance(getattr(self, name), int), c, name, getattr(self, name), "must be an int")
            require_int(c, name, getattr(self, name), 1)
        require(0 <= self.warmup_iterations < self.iterations, c, "warmup_iterations", self.warmup_iterations,
                f"must lie in [0, iterations = {self.iterations})")

    def check(self, knobs: "WritebackKnobs") -> None:
        """Raise if the knob arrays do not match this config's shapes."""
        tl = knobs.timeline
        got = (tl.duration_us.shape[-2], tl.duration_us.shape[-1], tl.touch_mask.shape[-1])
        if got != (self.layers, self.segments, self.plane_slots):
            raise ConfigError(f"timeline shape (layers, segments, plane_slots) = {got}: config says "
                             f"{(self.layers, self.segments, self.plane_slots)}")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class FlashKnobs:
    """Traced flash and buffer knobs (scalars; stack a leading axis to sweep)."""

    t_prog_us: jax.Array  # f32[] page program latency tPROG
    page_bytes: jax.Array  # f32[] bytes of one HBF page
    planes_per_slot: jax.Array  # f32[] physical planes one plane slot stands for (program in parallel)
    stripe_pages: jax.Array  # f32[] G: pages of one stripe (stripe, window)
    buffer_capacity_pages: jax.Array  # f32[] SRAM KV budget (window) or HBM decode-KV budget (dash-hbm)
    buffer_base_pages: jax.Array  # f32[] pages already buffered before the run (not in the state)
    wave_pages: jax.Array  # f32[] one full page wave (dash-hbm)
    link_bw_gbps: jax.Array  # f32[] HBM→HBF link, before a writeback wave can program (dash-hbm)
    prefetch: jax.Array  # f32[] 1: prefetch weights to merge compute windows (HBFlex Fig. 13a); 0: off

    @classmethod
    def make(cls, t_prog_us=75.0, page_bytes=4096, planes_per_slot=1.0, stripe_pages=32, buffer_capacity_pages=1e6,
             buffer_base_pages=0.0, wave_pages=4096, link_bw_gbps=1600.0, prefetch=1.0) -> "FlashKnobs":
        """Validated flash knobs: stripes and waves are whole pages >= 1, times and rates finite and > 0,
        the pre-filled buffer lies in [0, capacity], prefetch is 0 or 1."""
        c = cls.__name__
        require_real(c, "t_prog_us", t_prog_us, 0.0, MAX_US, lo_open=True)
        require_int(c, "page_bytes", page_bytes, 1)
        require_real(c, "planes_per_slot", planes_per_slot, 0.0, lo_open=True)
        require_int(c, "stripe_pages", stripe_pages, 1, int(MAX_COUNT))
        require_real(c, "buffer_capacity_pages", buffer_capacity_pages, 0.0, INT32_MAX)
        require_real(c, "buffer_base_pages", buffer_base_pages, 0.0, float(buffer_capacity_pages))
        require_int(c, "wave_pages", wave_pages, 1)
        require_real(c, "link_bw_gbps", link_bw_gbps, 0.0, lo_open=True)
        require(prefetch in (0, 1), c, "prefetch", prefetch, "must be 0 or 1")
        f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(t_prog_us=f(t_prog_us), page_bytes=f(page_bytes), planes_per_slot=f(planes_per_slot),
                   stripe_pages=f(stripe_pages), buffer_capacity_pages=f(buffer_capacity_pages),
                   buffer_base_pages=f(buffer_base_pages), wave_pages=f(wave_pages),
                   link_bw_gbps=f(link_bw_gbps), prefetch=f(prefetch))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WorkloadKnobs:
    """Per-iteration new KV (traced): decode requests, and a prefill chunk with a probability."""

    decode_requests: jax.Array  # f32[] running decode requests (one new token each per iteration)
    prefill_chunk_tokens: jax.Array  # f32[] tokens of a prefill chunk
    prefill_prob: jax.Array  # f32[] probability an iteration carries a prefill chunk

    @classmethod
    def make(cls, decode_requests=64, prefill_chunk_tokens=0, prefill_prob=0.0) -> "WorkloadKnobs":
        """Validated workload knobs: finite counts >= 0 (at most 2^30) and a probability in [0, 1]."""
        require_real(cls.__name__, "decode_requests", decode_requests, 0.0, MAX_COUNT)
        require_real(cls.__name__, "prefill_chunk_tokens", prefill_chunk_tokens, 0.0, MAX_COUNT)
        require_real(cls.__name__, "prefill_prob", prefill_prob, 0.0, 1.0)
        f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(decode_requests=f(decode_requests), prefill_chunk_tokens=f(prefill_chunk_tokens),
                   prefill_prob=f(prefill_prob))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WritebackKnobs:
    timeline: Timeline
    flash: FlashKnobs
    workload: WorkloadKnobs


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WritebackState:
    """Carried across iterations (one stream)."""

    busy_until_us: jax.Array  # f32[P] when each plane slot's programs end, from the iteration start
    cursor: jax.Array  # i32[] next plane slot of the round-robin allocation
    buffer_pages: jax.Array  # f32[] KV buffered, not yet programmed (above buffer_base_pages)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class IterationStats:
    """What one iteration cost (one stream; a leading [T] axis from the rollout)."""

    stall_us: jax.Array  # f32[] read waits added to the critical path
    iteration_us: jax.Array  # f32[] critical-path length, waits included
    program_busy_us: jax.Array  # f32[] Σ over program batches of rounds × tPROG
    pages_programmed: jax.Array  # i32[] page programs issued (a partial page counts one)
    program_rounds: jax.Array  # i32[] Σ over batches of sequential program rounds (stripes/waves)
    forced_writebacks: jax.Array  # i32[] forced writebacks (window) or writeback waves (dash-hbm)
    buffer_end_pages: jax.Array  # f32[] buffer at the iteration end (above base)
    buffer_peak_pages: jax.Array  # f32[] buffer peak during the iteration (above base)


def max_pages_per_iteration(knobs: WritebackKnobs, layers: int) -> float:
    """An upper bound on the page programs of one iteration, any policy: every layer's decode KV as
    whole pages per request (immediate) plus its whole prefill chunk and one page wave (dash-hbm),
    plus a full buffer drained at once (window)."""
    fk, wl = knobs.flash, knobs.workload
    page = float(fk.page_bytes)
    kvb = float(np.max(np.asarray(knobs.timeline.kv_bytes_per_token)))
    per_layer = (float(wl.decode_requests) * (math.ceil(kvb / page) + kvb / page)
                 + math.ceil(float(wl.prefill_chunk_tokens) * kvb / page) + float(fk.wave_pages) + 1.0)
    return layers * per_layer + float(fk.buffer_capacity_pages) + float(fk.stripe_pages)


def check_int32_counts(knobs: WritebackKnobs, config: WritebackConfig) -> None:
    """Refuse knobs whose per-iteration page programs or per-stream counts could pass 2^31 (int32)."""
    bound = max_pages_per_iteration(knobs, config.layers)
    require(bound <= INT32_MAX, "WritebackKnobs", "workload", f"{bound:.4g} pages per iteration at most",
            "layers × (decode_requests × (ceil(kv / page) + kv / page) + ceil(prefill_chunk × kv / page) + "
            f"wave_pages + 1) + buffer_capacity_pages + stripe_pages must be <= {INT32_MAX} (int32 page counts)")
    require(config.layers * config.iterations <= INT32_MAX, "WritebackConfig", "iterations", config.iterations,
            f"layers ({config.layers}) × iterations must be <= {INT32_MAX} (int32 forced-writeback counts)")


def init_state(config: WritebackConfig) -> WritebackState:
    return WritebackState(busy_until_us=jnp.zeros(config.plane_slots, jnp.float32), cursor=jnp.int32(0),
                          buffer_pages=jnp.float32(0.0))


# --- policies: masked arithmetic on scalars (static policy, so no per-stream branch) -----------

def _whole_stripes(pages, stripe):
    return jnp.floor(pages / stripe) * stripe


def kv_programs(policy: str, buffer_pages, decode_requests, prefill_tokens, kv_bytes, fk: FlashKnobs):
    """At a layer's kv_point: (buffer_pages, pages to program now, pages to program after the link
    transfer, forced/wave count). ``kv_bytes`` is the layer's KV bytes per token."""
    page = fk.page_bytes
    dec_pages = decode_requests * kv_bytes / page
    pre_pages = prefill_tokens * kv_bytes / page
    direct_prefill = jnp.ceil(pre_pages)
    zero = jnp.float32(0.0)
    if policy == "immediate":
        # one (partial-)page program per request per layer, plus the chunk's pages (HBFlex §3.2)
        return buffer_pages, decode_requests * jnp.ceil(kv_bytes / page) + direct_prefill, zero, jnp.int32(0)
    if policy in ("stripe", "window"):
        buf = buffer_pages + dec_pages + pre_pages
        if policy == "stripe":
            n = _whole_stripes(buf, fk.stripe_pages)
            return buf - n, n, zero, jnp.int32(0)
        over = buf - fk.buffer_capacity_pages
        forced = over > 0
        n = jnp.where(forced, jnp.minimum(jnp.ceil(over / fk.stripe_pages) * fk.stripe_pages, jnp.floor(buf)), 0.0)
        return buf - n, n, zero, forced.astype(jnp.int32)
    buf = buffer_pages + dec_pages
    if policy == "dash-prefill-direct":
        return buf, direct_prefill, zero, jnp.int32(0)
    # dash-hbm: one wave per layer once the HBM decode-KV budget is reached (DASH §V-B)
    wave = (buf + fk.buffer_base_pages >= fk.buffer_capacity_pages) & (buf >= fk.wave_pages)
    n_wave = jnp.where(wave, fk.wave_pages, 0.0)
    return buf - n_wave, direct_prefill, n_wave, wave.astype(jnp.int32)


def window_drain(buffer_pages, window_us, fk: FlashKnobs, plane_slots: int):
    """Pages the window policy programs at the start of a read-free window of ``window_us``: whole stripes,
    at most as many rounds on every plane as fit before the next read (HBFlex §5.3)."""
    rounds = jnp.floor(window_us / fk.t_prog_us)
    fit = rounds * plane_slots * fk.planes_per_slot
    return _whole_stripes(jnp.minimum(buffer_pages, fit), fk.stripe_pages)


# --- one iteration -----------------------------------------------------------------------------

class IterationInput(NamedTuple):
    """What one iteration consumes (a serving engine passes its own)."""

    iteration: jax.Array  # i32[] index (seeds the iteration's draws)
    decode_requests: jax.Array  # f32[] running decode requests (one new token each)
    prefill_tokens: jax.Array  # f32[] prefill tokens in the iteration


class TimelinePlan(NamedTuple):
    """The timeline after weight prefetch and its read-free windows (depends on knobs only)."""

    timeline: Timeline
    window_decode_us: jax.Array  # f32[L·S] compute from each segment's start to the next read
    window_prefill_us_per_token: jax.Array  # f32[L·S] its extra time per prefill token
    opens_window: jax.Array  # bool[L·S] the segment starts a read-free window


class LayerSegments(NamedTuple):
    """One layer's rows of the plan (the scan's xs; S segments)."""

    layer: jax.Array  # i32[]
    duration_us: jax.Array  # f32[S]
    prefill_us_per_token: jax.Array  # f32[S]
    is_read: jax.Array  # bool[S]
    touch_fraction: jax.Array  # f32[S]
    touch_mask: jax.Array  # bool[S, P]
    kv_point: jax.Array  # bool[S]
    phase_jitter: jax.Array  # f32[S]
    kv_bytes_per_token: jax.Array  # f32[]
    window_decode_us: jax.Array  # f32[S]
    window_prefill_us_per_token: jax.Array  # f32[S]
    opens_window: jax.Array  # bool[S]


class ProgramTally(NamedTuple):
    """Programs issued so far in the iteration."""

    busy_us: jax.Array  # f32[] Σ over batches of rounds × tPROG
    pages: jax.Array  # i32[] page programs
    rounds: jax.Array  # i32[] sequential program rounds


class LayerCarry(NamedTuple):
    """Carried from layer to layer within one iteration."""

    state: WritebackState
    t_us: jax.Array  # f32[] time since the iteration start
    pending_pages: jax.Array  # f32[] KV programs waiting for the next segment's start
    programs: ProgramTally
    stall_us: jax.Array  # f32[]
    forced_writebacks: jax.Array  # i32[]
    buffer_peak_pages: jax.Array  # f32[]


def iteration_step(words, state: WritebackState, inputs: IterationInput, knobs: WritebackKnobs,
                   config: WritebackConfig, plan: TimelinePlan) -> tuple[WritebackState, IterationStats]:
    """One serving iteration: every layer's segments in order (HBFlex Fig. 8). ``words`` = (seed, stream)
    hash words; ``plan`` = :func:`plan_timeline` (computed once per rollout)."""
    dec, pre = inputs.decode_requests, inputs.prefill_tokens
    fk = knobs.flash
    S, P, policy = config.segments, config.plane_slots, config.policy
    h_iter = rng.mix(*words, inputs.iteration)

    def issue(busy, cursor, prog: ProgramTally, n, t0):
        busy, cursor, b_us, r = program_pages(busy, cursor, n, t0, fk.t_prog_us, fk.planes_per_slot)
        return busy, cursor, ProgramTally(prog.busy_us + b_us, prog.pages + n.astype(jnp.int32), prog.rounds + r)

    def layer(c: LayerCarry, x: LayerSegments):
        u_layer = rng.uniform01(rng.mix(h_iter, x.layer, Salt.WB_PHASE))
        busy, cursor, buf = c.state.busy_until_us, c.state.cursor, c.state.buffer_pages
        t, pending, prog, stall, forced, peak = (c.t_us, c.pending_pages, c.programs, c.stall_us,
                                                 c.forced_writebacks, c.buffer_peak_pages)
        for s in range(S):  # the fixed segments of one layer, in time order (static structure)
            d = (x.duration_us[s] + x.prefill_us_per_token[s] * pre) * (1.0 + x.phase_jitter[s] * (2.0 * u_layer - 1.0))
            # the previous segment's KV programs and this segment's window drain start at the same instant
            # and never both (KV ends a compute segment, a window opens after a read): one program batch
            n = pending
            if policy == "window":
                window_us = x.window_decode_us[s] + x.window_prefill_us_per_token[s] * pre
                n_win = jnp.where(x.opens_window[s], window_drain(buf, window_us, fk, P), 0.0)
                buf, n = buf - n_win, n + n_win
            busy, cursor, prog = issue(busy, cursor, prog, n, t)
            touched = touched_slots(rng.mix(h_iter, x.layer * S + s, Salt.WB_TOUCH), x.touch_fraction[s],
                                    x.touch_mask[s])
            wait = jnp.where(x.is_read[s], read_wait_us(busy, touched, t), 0.0)
            stall, t = stall + wait, t + wait + d
            buf_k, now, later, f = kv_programs(policy, buf, dec, pre, x.kv_bytes_per_token, fk)
            kvp = x.kv_point[s]
            buf = jnp.where(kvp, buf_k, buf)
            pending = jnp.where(kvp, now, 0.0)
            forced = forced + jnp.where(kvp, f, 0)
            if policy == "dash-hbm":  # the wave starts once it has crossed the HBM–HBF link
                later = jnp.where(kvp, later, 0.0)
                busy, cursor, prog = issue(busy, cursor, prog, later,
                                           t + later * fk.page_bytes / (fk.link_bw_gbps * 1e3))
            peak = jnp.maximum(peak, buf)
        st = WritebackState(busy_until_us=busy, cursor=cursor, buffer_pages=buf)
        return LayerCarry(st, t, pending, prog, stall, forced, peak), None

    L, tl = config.layers, plan.timeline
    xs = LayerSegments(jnp.arange(L, dtype=jnp.int32), tl.duration_us, tl.prefill_us_per_token, tl.is_read,
                       tl.touch_fraction, tl.touch_mask, tl.kv_point, tl.phase_jitter, tl.kv_bytes_per_token,
                       plan.window_decode_us.reshape(L, S), plan.window_prefill_us_per_token.reshape(L, S),
                       plan.opens_window.reshape(L, S))
    f0, i0 = jnp.float32(0.0), jnp.int32(0)
    carry0 = LayerCarry(state, f0, f0, ProgramTally(f0, i0, i0), f0, i0, state.buffer_pages)
    c, _ = jax.lax.scan(layer, carry0, xs)
    busy, cursor, prog = issue(c.state.busy_until_us, c.state.cursor, c.programs, c.pending_pages, c.t_us)  # last KV
    st = WritebackState(busy_until_us=jnp.maximum(busy - c.t_us, 0.0), cursor=cursor, buffer_pages=c.state.buffer_pages)
    return st, IterationStats(stall_us=c.stall_us, iteration_us=c.t_us, program_busy_us=prog.busy_us,
                              pages_programmed=prog.pages, program_rounds=prog.rounds,
                              forced_writebacks=c.forced_writebacks, buffer_end_pages=st.buffer_pages,
                              buffer_peak_pages=c.buffer_peak_pages)


def plan_timeline(knobs: WritebackKnobs) -> TimelinePlan:
    """The timeline after weight prefetch and its read-free windows (depends on knobs only)."""
    tl = apply_prefetch(knobs.timeline, knobs.flash.prefetch)
    return TimelinePlan(tl, *window_after(tl))


def rollout(words, decode_requests, prefill_tokens, knobs: WritebackKnobs, config: WritebackConfig,
            state: WritebackState | None = None) -> tuple[WritebackState, IterationStats]:
    """``lax.scan`` over iterations with per-iteration inputs ``decode_requests[T]``, ``prefill_tokens[T]``
    (a serving engine passes its own); returns the final state and stats with a leading [T] axis."""
    config.check(knobs)  # shapes are static at trace time
    plan = plan_timeline(knobs)
    state = init_state(config) if state is None else state
    T = decode_requests.shape[0]
    xs = IterationInput(jnp.arange(T, dtype=jnp.int32), decode_requests.astype(jnp.float32),
                        prefill_tokens.astype(jnp.float32))
    return jax.lax.scan(lambda s, x: iteration_step(words, s, x, knobs, config, plan), state, xs)


def iteration_inputs(words, knobs: WritebackKnobs, config: WritebackConfig):
    """decode_requests[T], prefill_tokens[T]: a prefill chunk in each iteration with ``prefill_prob``."""
    it = jnp.arange(config.iterations, dtype=jnp.uint32)
    wl = knobs.workload
    has_prefill = rng.uniform01(rng.mix(*words, it, Salt.WB_PREFILL)) < wl.prefill_prob
    dec = jnp.full(config.iterations, wl.decode_requests, jnp.float32)
    return dec, jnp.where(has_prefill, wl.prefill_chunk_tokens, 0.0)


class WritebackOutput(NamedTuple):
    """One stream's means over the measured iterations (after warm-up)."""

    stall_us_per_iteration: jax.Array  # f32[]
    iteration_us: jax.Array  # f32[]
    program_busy_us_per_iteration: jax.Array  # f32[]
    pages_programmed_per_iteration: jax.Array  # f32[]
    program_rounds_per_iteration: jax.Array  # f32[]
    forced_writebacks: jax.Array  # i32[] total
    buffer_mean_bytes: jax.Array  # f32[]
    buffer_peak_bytes: jax.Array  # f32[]
    buffer_overflow: jax.Array  # bool[] the buffer ever held more than its budget
    stall_us_total: jax.Array  # f32[]
    program_busy_us_total: jax.Array  # f32[]


def summarize(stats: IterationStats, knobs: WritebackKnobs, config: WritebackConfig) -> WritebackOutput:
    """Per-stream summary over the measured iterations (after warm-up)."""
    w = config.warmup_iterations
    m = jax.tree_util.tree_map(lambda a: a[w:], stats)
    page = knobs.flash.page_bytes
    base = knobs.flash.buffer_base_pages
    mean = lambda a: jnp.mean(a.astype(jnp.float32))  # noqa: E731
    return WritebackOutput(
        stall_us_per_iteration=mean(m.stall_us),
        iteration_us=mean(m.iteration_us),
        program_busy_us_per_iteration=mean(m.program_busy_us),
        pages_programmed_per_iteration=mean(m.pages_programmed),
        program_rounds_per_iteration=mean(m.program_rounds),
        forced_writebacks=jnp.sum(m.forced_writebacks),
        buffer_mean_bytes=(mean(m.buffer_end_pages) + base) * page,
        buffer_peak_bytes=(jnp.max(m.buffer_peak_pages) + base) * page,
        # sticky: the buffer ever held more than its budget (dash-prefill-direct keeps decode KV in HBM
        # with no writeback; window drains any excess at once, so its buffer never stays above it)
        buffer_overflow=jnp.max(m.buffer_peak_pages) + base > knobs.flash.buffer_capacity_pages,
        stall_us_total=jnp.sum(m.stall_us),
        program_busy_us_total=jnp.sum(m.program_busy_us),
    )


def simulate(stream_id, seed, knobs: WritebackKnobs, inputs: None, config: WritebackConfig) -> WritebackOutput:
    """One Monte Carlo stream for :func:`hbfjax.batch.run` (no inputs: the iteration inputs are drawn
    from ``knobs.workload``): random prefill chunks, hashed read placement."""
    words = (seed, stream_id)
    dec, pre = iteration_inputs(words, knobs, config)
    _, stats = rollout(words, dec, pre, knobs, config)
    return summarize(stats, knobs, config)
