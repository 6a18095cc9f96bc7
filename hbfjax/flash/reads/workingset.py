"""Attention reads over an active KV working set: placement and access imbalance (HBFlex §3.1, §5.2, §6.4–6.5).

A stream holds ``slots`` concurrent requests. Each event, one request completes and a new one takes
its slot (HBFlex Fig. 5: completions and arrivals change the active set without moving pages). A new
request's KV (per layer) is ceil(context / T) logical pages of L = ceil(T × bytes-per-token / page)
physical pages; under ``plane-group`` placement its logical pages go to the least-loaded plane groups
of the *current* active set.

At each measurement the active set is read once for one layer, as attention does it: each request's
logical pages are cut into chunks (CTA work tiles) of C logical pages, and chunks are read in
scheduling waves of W chunks; a scheduling wave costs ``max plane load`` sensing rounds. Reported:

* placement imbalance of the active set: max/avg plane load, hot-plane fraction, and after hot-plane
  offload of the top fraction f of planes, the max/avg load and the SRAM bytes used (Fig. 5, 20);
* read-wave amplification = Σ waves / Σ ceil(pages in wave / planes) (Fig. 6, 17), with chunks
  scheduled in order or placement-aware (each scheduling wave greedily picks, from a look-ahead
  window of pending chunks, the chunk whose pages add the most not-yet-covered planes; ties prefer
  the request of the previous pick, for query reuse — HBFlex §5.2), and with offloaded pages served
  from SRAM.

Optionally the first ``shared_prefix_tokens`` of every request are a shared prefix (a system prompt)
stored once with ``replicas`` copies in different groups; each request reads the replica in the
least-loaded group, requests spread over the replicas in load order.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.flash.reads.collide import (PLACEMENTS, PlacementKnobs, group_count, max_load, offload_hot_planes,
                                  place_pages, plane_loads)
from hbfjax.validate import ConfigError, require, require_choice, require_int, require_real

SCHEDULES = ("in-order", "placement-aware")
MAX_TOKENS = 2**30  # token counts (contexts, prefixes, tiles) stay int32 after any sum of two
MAX_PAGE_ENTRIES = 2**24  # slots × logical pages × pages per logical: one stream's read of the active set
HOT_PLANE_FACTOR = 1.5  # a plane is "hot" when its load exceeds 1.5 × the mean (HBFlex Fig. 5c)


@dataclass(frozen=True)
class WorkingSetConfig:
    """Static shapes and choices of the working-set workload."""

    planes: int
    slots: int  # concurrent requests R
    max_logical_pages: int  # per request per layer (longer contexts are truncated and counted)
    max_pages_per_logical: int  # bound on L (physical pages per logical page)
    chunk_logical_pages: int  # C: logical pages per CTA work tile
    chunks_per_wave: int  # W: work tiles read together in one scheduling wave
    measurements: int  # attention reads measured per stream
    events_per_measurement: int  # completions + arrivals between measurements
    warmup_events: int  # events before the first measurement (the first `slots` only fill)
    placement: str = "plane-group"
    schedule: str = "in-order"
    lookahead_chunks: int = 0  # placement-aware window (0: 2 × chunks_per_wave)
    max_replicas: int = 4  # bound on the traced number of shared-prefix replicas
    page_bytes: int = 4096

    def __post_init__(self):
        c = type(self).__name__
        for name in ("planes", "slots", "max_logical_pages", "max_pages_per_logical", "chunk_logical_pages",
                     "chunks_per_wave", "measurements", "events_per_measurement", "page_bytes"):
            require_int(c, name, getattr(self, name), 1)
        require_choice(c, "placement", self.placement, PLACEMENTS)
        require_choice(c, "schedule", self.schedule, SCHEDULES)
        require(self.max_logical_pages % self.chunk_logical_pages == 0, c, "chunk_logical_pages",
                self.chunk_logical_pages, f"must divide max_logical_pages = {self.max_logical_pages}")
        entries = self.slots * self.max_logical_pages * self.max_pages_per_logical
        require(entries <= MAX_PAGE_ENTRIES, "WorkingSetConfig", "slots", self.slots,
                f"slots × max_logical_pages ({self.max_logical_pages}) × max_pages_per_logical "
                f"({self.max_pages_per_logical}) = {entries} physical pages per stream must be <= {MAX_PAGE_ENTRIES}")
        require(self.lookahead_chunks >= 0, "WorkingSetConfig", "lookahead_chunks", self.lookahead_chunks, "must be >= 0")
        require(self.max_replicas >= 1, "WorkingSetConfig", "max_replicas", self.max_replicas, "must be >= 1")

    @property
    def chunks(self) -> int:
        return self.slots * (self.max_logical_pages // self.chunk_logical_pages)

    @property
    def window(self) -> int:
        return min(self.chunks, self.lookahead_chunks or 2 * self.chunks_per_wave)


def attention_config(planes: int, slots: int, kv_bytes_per_token: float, *, logical_page_tokens: int = 16,
                     chunk_tokens: int = 256, max_context_tokens: int = 16384, chunks_per_wave: int | None = None,
                     measurements: int = 4, placement: str = "plane-group", schedule: str = "in-order",
                     page_bytes: int = 4096) -> WorkingSetConfig:
    """A working-set config from model-level quantities (tokens and bytes rather than page counts).

    Chunks of ``chunk_tokens`` are CTA work tiles; by default a scheduling wave holds about one
    physical page per plane (the 12 MiB read of HBFlex §3.1 for 3,072 planes).
    """
    t = require_int("", "logical_page_tokens", logical_page_tokens, 1, MAX_TOKENS)
    require_int("", "chunk_tokens", chunk_tokens, 1, MAX_TOKENS)
    require_int("", "max_context_tokens", max_context_tokens, 1, MAX_TOKENS)
    require_int("", "page_bytes", page_bytes, 1)
    if chunk_tokens < t or chunk_tokens % t:
        raise ConfigError(f"chunk_tokens = {chunk_tokens}: must be a positive multiple of logical_page_tokens = {t}")
    require_real("", "kv_bytes_per_token", kv_bytes_per_token, 0.0, float(MAX_TOKENS), lo_open=True)
    chunk_logical = chunk_tokens // t
    max_logical = -(-max_context_tokens // chunk_tokens) * chunk_logical
    per_logical = max(1, math.ceil(t * kv_bytes_per_token / page_bytes))  # the traced L's bound, never below it
    if chunks_per_wave is None:
        per_wave = max(1, planes // (chunk_logical * per_logical))
    else:
        per_wave = require_int("", "chunks_per_wave", chunks_per_wave, 1)
    return WorkingSetConfig(planes=planes, slots=slots, max_logical_pages=max_logical,
                            max_pages_per_logical=per_logical, chunk_logical_pages=chunk_logical,
                            chunks_per_wave=per_wave, measurements=measurements,
                            events_per_measurement=max(1, slots // 4), warmup_events=slots, placement=placement,
                            schedule=schedule, lookahead_chunks=4 * per_wave, page_bytes=page_bytes)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WorkingSetKnobs:
    """Traced knobs of the working set (stack a leading axis to sweep)."""

    placement: PlacementKnobs
    kv_bytes_per_token: jax.Array  # f32[] KV bytes per token per layer
    tokens_per_logical_page: jax.Array  # i32[] T
    shared_prefix_tokens: jax.Array  # i32[] shared system-prompt tokens of every request (0: none)
    replicas: jax.Array  # i32[] copies of the shared prefix, in distinct groups

    @classmethod
    def make(cls, kv_bytes_per_token: float, *, group_size: int, offload_fraction: float = 0.0,
             logical_page_tokens: int = 16, pages_per_block: int = 512, shared_prefix_tokens: int = 0,
             replicas: int = 1) -> "WorkingSetKnobs":
        """Validated knobs: finite bytes per token > 0, whole token counts (at most 2^30), replicas >= 1."""
        owner = cls.__name__
        require_real(owner, "kv_bytes_per_token", kv_bytes_per_token, 0.0, float(MAX_TOKENS), lo_open=True)
        require_int(owner, "logical_page_tokens", logical_page_tokens, 1, MAX_TOKENS)
        require_int(owner, "shared_prefix_tokens", shared_prefix_tokens, 0, MAX_TOKENS)
        require_int(owner, "replicas", replicas, 1)
        return cls(placement=PlacementKnobs.make(group_size, 1, pages_per_block, offload_fraction),
                   kv_bytes_per_token=jnp.float32(kv_bytes_per_token),
                   tokens_per_logical_page=jnp.int32(logical_page_tokens),
                   shared_prefix_tokens=jnp.int32(shared_prefix_tokens), replicas=jnp.int32(replicas))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WorkingSetInputs:
    """What the run consumes: context lengths replayed in order from a random start (trace or draws)."""

    context_tokens: jax.Array  # i32[K] prompt + output tokens of each arriving request

    @classmethod
    def make(cls, context_tokens) -> "WorkingSetInputs":
        """Validated inputs: a non-empty 1-D array of finite contexts > 0 tokens (rounded, at most 2^30)."""
        ctx = np.asarray(context_tokens, np.float64)
        require(ctx.ndim == 1 and ctx.size >= 1, cls.__name__, "context_tokens", ctx.shape,
                "must be a non-empty 1-D array")
        bad = ctx[~(np.isfinite(ctx) & (ctx > 0))]
        require(bad.size == 0, cls.__name__, "context_tokens", bad[:1].tolist(),
                "every context must be finite and > 0 tokens")
        return cls(context_tokens=jnp.asarray(np.clip(np.round(context_tokens), 1, 2**30), jnp.int32))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WorkingSetState:
    group: jax.Array  # int32 [R, Lmax] plane group of each logical page (plane-group placement)
    logical_pages: jax.Array  # int32 [R] logical pages held by the request in each slot (0 = empty)
    uid: jax.Array  # int32 [R] request id of each slot (seeds its page hashes)
    group_load: jax.Array  # int32 [planes] physical pages of the active set per group (first n_groups used)
    arrivals: jax.Array  # int32 [] requests admitted so far
    truncated: jax.Array  # int32 [] requests whose context exceeded max_logical_pages


def check_replicas(replicas: int, planes: int, group_size: int, config: WorkingSetConfig) -> None:
    """Refuse more shared-prefix replicas than distinct plane groups or the static bound (the traced
    code would otherwise use fewer copies than asked)."""
    n_groups = max(planes // group_size, 1)
    limit = min(n_groups, config.max_replicas)
    require(1 <= replicas <= limit, "WorkingSetKnobs", "replicas", replicas,
            f"must be in [1, {limit}]: at most one copy per plane group ({n_groups} groups of {group_size}) "
            f"and config.max_replicas = {config.max_replicas}")


def pages_per_logical(knobs: WorkingSetKnobs, config: WorkingSetConfig) -> jax.Array:
    """L = ceil(T × bytes per token / page bytes), clipped to the static bound."""
    raw = jnp.ceil(knobs.tokens_per_logical_page * knobs.kv_bytes_per_token / config.page_bytes).astype(jnp.int32)
    return jnp.clip(raw, 1, config.max_pages_per_logical)


def _prefix_logical_pages(knobs: WorkingSetKnobs) -> jax.Array:
    return knobs.shared_prefix_tokens // jnp.maximum(knobs.tokens_per_logical_page, 1)


def init_state(config: WorkingSetConfig) -> WorkingSetState:
    r, lmax = config.slots, config.max_logical_pages
    return WorkingSetState(group=jnp.zeros((r, lmax), jnp.int32), logical_pages=jnp.zeros((r,), jnp.int32),
                           uid=jnp.zeros((r,), jnp.int32), group_load=jnp.zeros((config.planes,), jnp.int32),
                           arrivals=jnp.int32(0), truncated=jnp.int32(0))


def _slot_group_load(group_row: jax.Array, valid_row: jax.Array, weight: jax.Array, planes: int) -> jax.Array:
    return plane_loads(group_row, valid_row.astype(jnp.int32) * weight, planes)


def event(words: tuple, state: WorkingSetState, inputs: WorkingSetInputs, knobs: WorkingSetKnobs,
          config: WorkingSetConfig) -> WorkingSetState:
    """One completion and one arrival (the first ``slots`` events only fill empty slots)."""
    lmax = config.max_logical_pages
    size = pages_per_logical(knobs, config)
    n_groups = group_count(config.planes, knobs.placement.group_size)
    prefix = _prefix_logical_pages(knobs)
    page = jnp.arange(lmax, dtype=jnp.int32)
    # completion: the first `slots` events fill slot by slot, later ones free a uniform random slot
    filling = state.arrivals < config.slots
    slot = jnp.where(filling, state.arrivals % config.slots,
                     rng.uniform_index(rng.mix(*words, Salt.WS_COMPLETE, state.arrivals), config.slots))
    owned = (page >= prefix) & (page < state.logical_pages[slot])
    load = state.group_load - _slot_group_load(state.group[slot], owned, size, config.planes)
    # arrival: context from the replayed pool, logical pages to the least-loaded groups in turn
    pool = inputs.context_tokens.shape[0]
    start = rng.uniform_index(rng.mix(*words, Salt.WS_START), pool)
    context = inputs.context_tokens[(start + state.arrivals) % pool]
    want = (context + knobs.tokens_per_logical_page - 1) // jnp.maximum(knobs.tokens_per_logical_page, 1)
    n_logical = jnp.minimum(want, lmax)
    unused = jnp.arange(config.planes) >= n_groups
    order = jnp.argsort(jnp.where(unused, jnp.iinfo(jnp.int32).max, load), stable=True)
    new_group = order[(page - prefix) % n_groups]
    new_owned = (page >= prefix) & (page < n_logical)
    load = load + _slot_group_load(new_group, new_owned, size, config.planes)
    return WorkingSetState(
        group=state.group.at[slot].set(new_group),
        logical_pages=state.logical_pages.at[slot].set(n_logical),
        uid=state.uid.at[slot].set(state.arrivals),
        group_load=load,
        arrivals=state.arrivals + 1,
        truncated=state.truncated + (want > lmax).astype(jnp.int32),
    )


def _request_placement(knobs: WorkingSetKnobs, config: WorkingSetConfig) -> PlacementKnobs:
    """The placement knobs of one request's pages: L physical pages per logical page (derived from T)."""
    return dataclasses.replace(knobs.placement, pages_per_logical=pages_per_logical(knobs, config))


def active_planes(words: tuple, state: WorkingSetState, knobs: WorkingSetKnobs, config: WorkingSetConfig):
    """Plane of every physical page the active set reads for one layer: (plane, valid) of [R, Lmax, Lp].

    Placement is :func:`hbfjax.flash.reads.collide.place_pages` (the one implementation) with each
    request's words ``(*words, uid)`` and, for plane groups, the group chosen at its arrival.
    """
    lmax, lp = config.max_logical_pages, config.max_pages_per_logical
    size = pages_per_logical(knobs, config)
    logical = jnp.arange(lmax, dtype=jnp.int32)[None, :, None]
    stripe = jnp.arange(lp, dtype=jnp.int32)[None, None, :]
    valid = (logical < state.logical_pages[:, None, None]) & (stripe < size)
    plane = place_pages(config.placement, (*words, state.uid[:, None, None]), logical * size + stripe,
                        config.planes, _request_placement(knobs, config), group=state.group[:, :, None])
    return _with_shared_prefix(words, plane, state, knobs, config), valid


def _with_shared_prefix(words, plane, state, knobs, config):
    """Replace the prefix pages by the replica each request is redirected to (HBFlex §5.2)."""
    n_groups = group_count(config.planes, knobs.placement.group_size)
    prefix = _prefix_logical_pages(knobs)
    replicas = jnp.clip(knobs.replicas, 1, jnp.minimum(n_groups, config.max_replicas))
    lmax, lp = config.max_logical_pages, config.max_pages_per_logical
    logical = jnp.arange(lmax, dtype=jnp.int32)
    stripe = jnp.arange(lp, dtype=jnp.int32)
    # replica k of prefix page l sits in group (base_l + k · n_groups / replicas): distinct groups
    base = rng.uniform_index(rng.mix(*words, Salt.WS_PREFIX, logical), n_groups)  # [Lmax]
    spread = jnp.maximum(n_groups // replicas, 1)
    k = jnp.arange(config.max_replicas, dtype=jnp.int32)
    replica_group = (base[:, None] + k[None, :] * spread) % n_groups  # [Lmax, max_replicas]
    replica_load = jnp.where(k < replicas, state.group_load[replica_group], jnp.iinfo(jnp.int32).max)
    rank = jnp.argsort(replica_load, axis=-1, stable=True)  # replicas of each page, least loaded first
    request_rank = jnp.arange(config.slots, dtype=jnp.int32) % replicas  # requests spread over replicas
    chosen = rank[:, request_rank].T  # [R, Lmax]
    group = (base[None, :] + chosen * spread) % n_groups
    # the prefix is one shared "request": its words carry the prefix salt instead of a request id
    size = pages_per_logical(knobs, config)
    prefix_plane = place_pages("plane-group", (*words, Salt.WS_PREFIX_OFFSET),
                               logical[None, :, None] * size + stripe[None, None, :], config.planes,
                               _request_placement(knobs, config), group=group[:, :, None])
    return jnp.where((logical < prefix)[None, :, None], prefix_plane, plane)


def chunk_table(plane, valid, config):
    """Chunks (work tiles) in request-major order, valid ones first: plane ids [K, C·Lp], page mask, owner."""
    r, lmax, lp = config.slots, config.max_logical_pages, config.max_pages_per_logical
    c = config.chunk_logical_pages
    per_req = lmax // c
    plane = plane.reshape(r * per_req, c * lp)
    valid = valid.reshape(r * per_req, c * lp)
    owner = jnp.repeat(jnp.arange(r, dtype=jnp.int32), per_req)
    nonempty = jnp.any(valid, axis=1)
    order = jnp.argsort(~nonempty, stable=True)
    return plane[order], valid[order], owner[order], jnp.sum(nonempty)


def _greedy_waves(plane, valid, owner, n_chunks, config):
    """Scheduling wave of each chunk, placement-aware (HBFlex §5.2).

    Each pick takes, from the look-ahead window of pending chunks, the chunk with the most pages on
    planes the current wave has not touched, less its collisions with pages already in the wave
    (once every plane is covered, the distinct-plane criterion alone cannot rank chunks).
    """
    k_total, width, window = plane.shape[0], plane.shape[1], config.window
    w = config.chunks_per_wave
    pad = jnp.zeros((window, width), plane.dtype)
    plane_p = jnp.concatenate([plane, pad])
    valid_p = jnp.concatenate([valid, jnp.zeros((window, width), bool)])
    owner_p = jnp.concatenate([owner, jnp.full((window,), -1, owner.dtype)])

    def pick(carry, step):
        count, assigned, head, last_owner = carry
        idx = head + jnp.arange(window)
        cand_plane = jax.lax.dynamic_slice_in_dim(plane_p, head, window)
        cand_valid = jax.lax.dynamic_slice_in_dim(valid_p, head, window)
        free = (~jax.lax.dynamic_slice_in_dim(assigned, head, window)) & (idx < n_chunks)
        # pages landing on planes this wave has not touched yet, minus collisions with pages it has
        hits = jnp.where(cand_valid, count[cand_plane], 0)
        gain = jnp.sum(cand_valid & (hits == 0), axis=1) - jnp.sum(hits, axis=1)
        gain = gain.astype(jnp.float32) + 0.5 * (jax.lax.dynamic_slice_in_dim(owner_p, head, window) == last_owner)
        choice = jnp.argmax(jnp.where(free, gain, -1.0))
        chosen = head + choice
        real = step < n_chunks
        assigned = assigned.at[chosen].set(assigned[chosen] | real)
        wave_full = (step + 1) % w == 0
        count = count.at[cand_plane[choice]].add(cand_valid[choice].astype(jnp.int32) * real)
        count = jnp.where(wave_full, jnp.zeros_like(count), count)
        after = jax.lax.dynamic_slice_in_dim(assigned, head, window)
        head = jnp.minimum(head + jnp.argmin(after) + jnp.all(after) * window, k_total)
        return (count, assigned, head, owner_p[chosen]), (chosen, step // w)

    init = (jnp.zeros((config.planes,), jnp.int32), jnp.zeros((k_total + window,), bool), jnp.int32(0), jnp.int32(-1))
    _, (chosen, wave) = jax.lax.scan(pick, init, jnp.arange(k_total, dtype=jnp.int32))
    return jnp.zeros((k_total + window,), jnp.int32).at[chosen].set(wave)[:k_total]


class AttentionRead(NamedTuple):
    """Placement and access metrics of one attention read of the active set (one layer, one stream)."""

    pages: jax.Array  # i32[] physical pages read
    max_to_avg_load: jax.Array  # f32[] max plane load / mean plane load (before offload)
    hot_plane_fraction: jax.Array  # f32[] planes above HOT_PLANE_FACTOR × the mean load
    offload_max_to_avg_load: jax.Array  # f32[] the same after hot-plane offload
    offloaded_pages: jax.Array  # i32[] pages served from SRAM
    sram_bytes: jax.Array  # i32[] SRAM those pages take
    waves: jax.Array  # i32[] Σ over scheduling waves of the max plane load
    ideal_waves: jax.Array  # i32[] Σ over scheduling waves of ceil(pages read from planes / planes)
    amplification: jax.Array  # f32[] waves / ideal_waves


class WorkingSetOutput(NamedTuple):
    """One stream: every AttentionRead field as [measurements], and run counters."""

    pages: jax.Array  # i32[M]
    max_to_avg_load: jax.Array  # f32[M]
    hot_plane_fraction: jax.Array  # f32[M]
    offload_max_to_avg_load: jax.Array  # f32[M]
    offloaded_pages: jax.Array  # i32[M]
    sram_bytes: jax.Array  # i32[M]
    waves: jax.Array  # i32[M]
    ideal_waves: jax.Array  # i32[M]
    amplification: jax.Array  # f32[M]
    truncated_requests: jax.Array  # i32[] contexts longer than the static page bound
    arrivals: jax.Array  # i32[] requests admitted


def measure(words: tuple, state: WorkingSetState, knobs: WorkingSetKnobs, config: WorkingSetConfig) -> AttentionRead:
    """Placement and access metrics of one attention read of the active set (one layer)."""
    plane, valid = active_planes(words, state, knobs, config)
    loads = plane_loads(plane, valid, config.planes)
    pages = jnp.sum(loads)
    mean = pages.astype(jnp.float32) / config.planes
    served, offloaded = offload_hot_planes(loads, knobs.placement.offload_fraction)
    # offloaded pages: a page on plane p is served from SRAM with probability excess_p / load_p
    excess_share = (loads - served).astype(jnp.float32) / jnp.maximum(loads, 1).astype(jnp.float32)
    thin = rng.uniform01(rng.mix(*words, Salt.WS_THIN, state.arrivals, jnp.arange(plane.size).reshape(plane.shape)))
    read = valid & (thin >= excess_share[plane])
    chunk_plane, chunk_read, owner, n_chunks = chunk_table(plane, read, config)
    if config.schedule == "placement-aware":
        wave = _greedy_waves(chunk_plane, chunk_read, owner, n_chunks, config)
    else:
        wave = jnp.arange(config.chunks, dtype=jnp.int32) // config.chunks_per_wave
    n_waves = -(-config.chunks // config.chunks_per_wave)
    wave_loads = plane_loads(wave[:, None] * config.planes + chunk_plane, chunk_read, n_waves * config.planes)
    wave_loads = wave_loads.reshape(n_waves, config.planes)
    wave_pages = jnp.sum(wave_loads, axis=1)
    waves = jnp.sum(max_load(wave_loads))
    ideal = jnp.sum((wave_pages + config.planes - 1) // config.planes)
    return AttentionRead(
        pages=pages,
        max_to_avg_load=max_load(loads) / jnp.maximum(mean, 1e-9),
        hot_plane_fraction=jnp.mean(loads > HOT_PLANE_FACTOR * mean),
        offload_max_to_avg_load=max_load(served) / jnp.maximum(mean, 1e-9),
        offloaded_pages=offloaded,
        sram_bytes=offloaded * config.page_bytes,
        waves=waves,
        ideal_waves=ideal,
        # no page read from planes (all served from SRAM): no waves, no amplification
        amplification=jnp.where(ideal > 0, waves / jnp.maximum(ideal, 1), 1.0),
    )


def simulate(stream_id: jax.Array, seed: jax.Array, knobs: WorkingSetKnobs, inputs: WorkingSetInputs,
             config: WorkingSetConfig, measure=measure) -> WorkingSetOutput:
    """Warm up, then alternate ``events_per_measurement`` events with one measured read.

    Returns each metric as [measurements] plus ``truncated_requests`` (contexts longer than the
    static page bound) and ``arrivals``. ``measure(words, state, knobs, config) -> AttentionRead``
    is the read measured (a tuning relaxation passes its own, ``hbfjax.tune.problems.collide_sram``).
    """
    words = (seed, stream_id)
    step = lambda s, _: (event(words, s, inputs, knobs, config), None)  # noqa: E731
    state, _ = jax.lax.scan(step, init_state(config), None, length=config.slots + config.warmup_events)

    def measured(s, _):
        s, _ = jax.lax.scan(step, s, None, length=config.events_per_measurement)
        return s, measure(words, s, knobs, config)

    state, metrics = jax.lax.scan(measured, state, None, length=config.measurements)
    return WorkingSetOutput(*metrics, truncated_requests=state.truncated, arrivals=state.arrivals)
