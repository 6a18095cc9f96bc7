"""Delivery times of the DASH paths: pure functions of bytes and :class:`OrgKnobs` (DASH §IV, §V-B, §V-C,
§VI-E; DESIGN.md §4 "Delivery paths").

Every function is elementwise in its byte and count arguments (any broadcastable shapes; leading axes
from vmap pass through) and traced in the knobs, so it is jit- and vmap-safe and one compilation serves
every organisation. Each function assumes it has the links it uses to itself for its duration: the
serving step composes them on the critical path and says what runs beside what.

Aggregate rates (GB/s = 1e3 B/µs), with every data kind striped evenly over the stacks:

* GPU–HBM links ``G = hbm_stacks · gpu_hbm_gbps``; HBM cells ``M = hbm_stacks · hbm_bw_gbps``;
* Direct ``D = hbf_stacks · direct_gbps``; Relay ``R = pairs · min(relay_gbps, gpu_hbm_gbps)`` with
  ``pairs = min(hbm_stacks, hbf_stacks)`` (a relay route crosses its pair's HBM–HBF link, the HBM base
  die's relay SRAM and that stack's GPU–HBM link; it bypasses the HBM cells, DASH §IV-B);
* HBF arrays ``A = hbf_stacks · parallel_units · page_bytes / tR`` (one page wave per tR);
* HBF base-die SRAM fill ``S = hbf_stacks · region_bytes / tR`` (a double-buffered region is refilled
  once per sensing; equal to ``A`` when a region is one page wave, as in DASH §IV-B);
* HBF interfaces ``I = hbf_stacks · hbf_interface_gbps``: what a part's datasheet states a stack can send
  out (issue 25; ``MAX_GBPS``, no cap, in both papers' organisations). The arrays' source is
  ``min(A, S, I)`` wherever ``min(A, S)`` is named below.

The tR in ``A`` and ``S`` is ``t_read_us`` when ``tr_sets_rate = 1`` (the literal reading of DASH
§VI-A and of Fig. 12's text: a lower tR completes more reads in a given time). With ``tr_sets_rate =
0`` tR is a latency only (what Fig. 11's reductions need, review 2026-12-02 DASH fidelity §4.3): the
rates stay those of ``rate_t_read_us`` (DASH's nominal 3 µs), as if a plane kept tR / 3 µs more reads
outstanding, while every path still waits the exposed tR before its first byte.

``shared_array_rate = 1`` makes ``min(A, S)`` a limit on Direct and Relay *together* (the physical
reading, DESIGN.md §4); ``0`` applies it (the interface included) to each path alone (the reading under which the paper's ratios
may have been obtained).

Relaxation (DESIGN.md §6, for gradient tuning of the split only): with ``temperature_us`` given, the
expert delivery's fixed split ``round(relay_fraction · n)`` is rounded straight through (exact forward
value, identity derivative) and its two maxima (a path's transfer against the shared-array floor,
then ``max(T_Direct, T_Relay)``) are ``hbfjax.relax.soft_max`` at that temperature in µs: each
lies above the exact max by at most ``temperature_us · log 2``, so a layer's delivery exceeds the
exact one by at most ``2 · temperature_us · log 2``. ``None`` (the default) is the exact model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.memory.organisations import OrgKnobs
from hbfjax.relax import soft_max

US_PER_BYTE_AT_1_GBPS = 1e-3  # 1 GB/s = 1e3 bytes per µs
LIMITS = ("link", "array", "sram", "interface")  # bottleneck codes of a path; ties go to the earlier name
PATHS = ("direct", "relay")
READ_LIMITS = ("hbm", "hbf", "joint")  # which cut sets a parallel read's time


def _f(x) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def transfer_us(nbytes, gbps) -> jax.Array:
    """µs to move ``nbytes`` at ``gbps``: 0 for no bytes, +inf over an absent (0 GB/s) path."""
    nbytes, gbps = _f(nbytes), _f(gbps)
    safe = jnp.where(gbps > 0, gbps, 1.0)
    return jnp.where(nbytes > 0, jnp.where(gbps > 0, nbytes * US_PER_BYTE_AT_1_GBPS / safe, jnp.inf), 0.0)


class Rates(NamedTuple):
    """Aggregate rates of an organisation in GB/s (see the module docstring); all float32[]."""

    gpu_hbm_gbps: jax.Array  # G
    hbm_cells_gbps: jax.Array  # M
    direct_gbps: jax.Array  # D
    relay_gbps: jax.Array  # R = pairs · min(relay link, GPU–HBM link)
    relay_link_gbps: jax.Array  # pairs · relay link (the HBM–HBF links alone)
    array_gbps: jax.Array  # A
    sram_gbps: jax.Array  # S
    interface_gbps: jax.Array  # I
    pairs: jax.Array  # stack pairs carrying Relay


def rate_t_read_us(knobs: OrgKnobs) -> jax.Array:
    """float32[]: the tR that sets the array and SRAM rates (module docstring): tR itself, or the
    reference tR of the latency-only reading."""
    return jnp.where(knobs.tr_sets_rate > 0.5, knobs.t_read_us, knobs.rate_t_read_us)


def rates(knobs: OrgKnobs) -> Rates:
    """The aggregate rates of ``knobs`` (DASH §IV-A links, §IV-B base dies, §VI-A geometry)."""
    pairs = jnp.minimum(knobs.hbm_stacks, knobs.hbf_stacks)
    per_tr = knobs.hbf_stacks / (rate_t_read_us(knobs) * 1e3)  # stacks / tR in GB/s per byte sensed
    return Rates(
        gpu_hbm_gbps=knobs.hbm_stacks * knobs.gpu_hbm_gbps,
        hbm_cells_gbps=knobs.hbm_stacks * knobs.hbm_bw_gbps,
        direct_gbps=knobs.hbf_stacks * knobs.direct_gbps,
        relay_gbps=pairs * jnp.minimum(knobs.relay_gbps, knobs.gpu_hbm_gbps),
        relay_link_gbps=pairs * knobs.relay_gbps,
        array_gbps=knobs.parallel_units * knobs.page_bytes * per_tr,
        sram_gbps=knobs.hbf_sram_region_bytes * per_tr,
        interface_gbps=knobs.hbf_stacks * knobs.hbf_interface_gbps,
        pairs=pairs,
    )


def source_gbps(r: Rates) -> jax.Array:
    """float32[]: what the HBF stacks can send towards the GPU, min(A, S, I) (module docstring)."""
    return jnp.minimum(jnp.minimum(r.array_gbps, r.sram_gbps), r.interface_gbps)


def hbm_to_hbf_gbps(knobs: OrgKnobs) -> jax.Array:
    """float32[]: the rate of moving HBM-resident data (decode KV writeback, DASH §V-B) into HBF: over
    the pairs' HBM–HBF links where they exist, else through the GPU (in over the GPU–HBM links, out
    over Direct: both links busy for the move)."""
    r = rates(knobs)
    return jnp.where(r.relay_link_gbps > 0, r.relay_link_gbps, jnp.minimum(r.gpu_hbm_gbps, r.direct_gbps))


# --- expert delivery (DASH §V-B "Dual-Path HBF Read", §V-C, §VI-E) ---------------------------------

class ExpertDelivery(NamedTuple):
    """One MoE layer's routed-expert delivery from HBF (shapes: those of the broadcast inputs)."""

    direct_experts: jax.Array  # f32 whole experts sent over Direct
    relay_experts: jax.Array  # f32 whole experts sent over Relay
    direct_bytes: jax.Array  # f32
    relay_bytes: jax.Array  # f32
    direct_us: jax.Array  # f32 T_Direct: startup + bytes / rate (0 when it carries nothing)
    relay_us: jax.Array  # f32 T_Relay
    direct_startup_us: jax.Array  # f32 exposed tR (0 when idle)
    relay_startup_us: jax.Array  # f32 exposed tR + first relay chunk over the HBM–HBF link (0 when idle)
    delivery_us: jax.Array  # f32 max(T_Direct, T_Relay)
    slow_path: jax.Array  # int32 index into PATHS of the path that sets delivery_us (ties: direct)
    limit: jax.Array  # int32 index into LIMITS of what limits the slow path's rate


def _needed_count(needed) -> jax.Array:
    needed = jnp.asarray(needed)
    if needed.dtype == jnp.bool_:
        return jnp.sum(needed, axis=-1).astype(jnp.float32)
    return needed.astype(jnp.float32)


class _PathModel(NamedTuple):
    """What T_path(k) needs; every field float32 broadcast to the inputs."""

    n: jax.Array  # needed experts
    b: jax.Array  # bytes per expert
    tr_us: jax.Array  # exposed tR
    direct_cap: jax.Array  # Direct rate cap: link, and per-path array/SRAM when not shared
    relay_cap: jax.Array
    floor_us: jax.Array  # shared arrays: every busy path lasts at least all bytes / min(A, S)
    chunk_bytes: jax.Array  # one relay region per pair
    relay_link_gbps: jax.Array  # one HBM–HBF link (first-chunk fill)
    pairs: jax.Array


def _path_model(n, b, knobs: OrgKnobs, window_us) -> _PathModel:
    r = rates(knobs)
    shared = knobs.shared_array_rate > 0.5
    source = source_gbps(r)
    per_path = jnp.where(shared, jnp.inf, source)
    hidden = knobs.lookahead * jnp.minimum(knobs.t_read_us, _f(window_us))
    floor_us = jnp.where(shared, transfer_us(n * b, source), 0.0)
    return _PathModel(n=n, b=b, tr_us=knobs.t_read_us - hidden,
                      direct_cap=jnp.minimum(r.direct_gbps, per_path), relay_cap=jnp.minimum(r.relay_gbps, per_path),
                      floor_us=floor_us, chunk_bytes=knobs.relay_sram_region_bytes,
                      relay_link_gbps=knobs.relay_gbps, pairs=r.pairs)


def _max2(a, b, temperature_us=None) -> jax.Array:
    """``max(a, b)``, or its soft max at ``temperature_us`` (module docstring "Relaxation")."""
    if temperature_us is None:
        return jnp.maximum(a, b)
    a, b = jnp.broadcast_arrays(_f(a), _f(b))
    return soft_max(jnp.stack([a, b], axis=-1), temperature_us)


def _round_half_up(x, temperature_us=None) -> jax.Array:
    """``floor(x + 0.5)``; relaxed: the same value with the identity's derivative (straight through)."""
    r = jnp.floor(x + 0.5)
    return r if temperature_us is None else x + jax.lax.stop_gradient(r - x)


def _times(k, m: _PathModel, temperature_us=None):
    """(T_Direct, T_Relay, startups) with ``k`` whole experts on Direct and the rest on Relay."""
    direct_bytes, relay_bytes = k * m.b, (m.n - k) * m.b
    fill = transfer_us(jnp.minimum(relay_bytes / m.pairs, m.chunk_bytes), m.relay_link_gbps)
    s_d = jnp.where(direct_bytes > 0, m.tr_us, 0.0)
    s_r = jnp.where(relay_bytes > 0, m.tr_us + fill, 0.0)
    t_d = jnp.where(direct_bytes > 0,
                    s_d + _max2(transfer_us(direct_bytes, m.direct_cap), m.floor_us, temperature_us), 0.0)
    t_r = jnp.where(relay_bytes > 0,
                    s_r + _max2(transfer_us(relay_bytes, m.relay_cap), m.floor_us, temperature_us), 0.0)
    return t_d, t_r, s_d, s_r


def _balanced_candidates(m: _PathModel) -> jax.Array:
    """float32[..., 16]: the splits among which the min-max one lies (see :func:`expert_delivery`).

    On 1 <= k <= n − 1, T_Direct(k) = tR + max(k·u_D, F) and T_Relay(k) = tR + min((n − k)·φ, C) +
    max((n − k)·u_R, F), with u the µs per expert of a path, F the shared-array floor, φ the relay
    first-chunk fill per expert and C the fill of a whole chunk. Each is the max or min of linear
    pieces; their crossing is a crossing of one Direct piece with one Relay piece."""
    u_d = transfer_us(m.b, m.direct_cap)
    u_r = transfer_us(m.b, m.relay_cap)
    phi = transfer_us(m.b / m.pairs, m.relay_link_gbps)
    full = transfer_us(m.chunk_bytes, m.relay_link_gbps)
    zero = jnp.zeros_like(m.n)
    direct = [(zero, u_d), (m.floor_us, zero)]  # (value at k = 0 above tR, µs per expert on Direct)
    relay = [(zero, phi + u_r), (m.floor_us, phi), (full, u_r), (full + m.floor_us, zero)]  # (value at k = n, slope)
    lo, hi = jnp.minimum(1.0, m.n), jnp.maximum(m.n - 1.0, 0.0)
    ks = [zero, m.n]
    for a, slope_d in direct:
        for c, slope_r in relay:
            k = (c + m.n * slope_r - a) / (slope_d + slope_r)
            k = jnp.where(jnp.isinf(u_d), 0.0, jnp.where(jnp.isinf(u_r), m.n, k))
            k = jnp.nan_to_num(k, nan=0.0, posinf=0.0, neginf=0.0)
            ks += [jnp.clip(jnp.floor(k), lo, hi), jnp.clip(jnp.ceil(k), lo, hi)]
    return jnp.stack(jnp.broadcast_arrays(*ks), axis=-1)


def _limit(path_bytes, total_bytes, link_gbps, r: Rates, shared) -> jax.Array:
    """int32 index into LIMITS of the smallest of a path's link rate and its array, SRAM and interface shares."""
    share = jnp.where(shared, path_bytes / jnp.maximum(total_bytes, 1.0), 1.0)
    candidates = jnp.stack(jnp.broadcast_arrays(link_gbps, r.array_gbps * share, r.sram_gbps * share,
                                                r.interface_gbps * share), axis=-1)
    return jnp.argmin(candidates, axis=-1).astype(jnp.int32)


def expert_delivery(needed, expert_bytes, knobs: OrgKnobs, window_us=math.inf, temperature_us=None) -> ExpertDelivery:
    """Deliver one MoE layer's needed routed experts from HBF to the GPU over Direct and Relay.

    ``needed``: bool[..., E] (the union of the batch's top-k picks) or a count; ``expert_bytes``: bytes of
    one expert. Whole experts go to one path each (DASH §VI-E). A path carrying ``B_p`` bytes takes
    ``T_p = startup_p + B_p / rate_p`` (0 when idle), where

    * startup is the exposed tR (DASH §II-B: sensing before any byte is in SRAM). That sensing is the
      first HBF SRAM fill: the shared-TSV fill is counted in the array rate (DASH §IV-A accounts it
      apart from the link and overlaps it by double buffering). Lookahead (DASH §V-C)
      hides ``min(tR, window_us)``, ``window_us`` being the time between early selection and the
      experts' use (the serving step passes the output-projection time; ∞ hides tR entirely). Relay
      adds its first store-and-forward chunk: ``min(B_r / pairs, relay region)`` over one HBM–HBF link
      (DASH §IV-B), after which the double-buffered regions sustain the link rate;
    * ``rate_p = min(link_p, SRAM and array share)``. Shared arrays give path p the share ``B_p / B`` of
      ``min(A, S)``, so ``T_p = startup_p + max(B_p / link_p, B / min(A, S))`` and the later path ends
      exactly when the arrays could have delivered everything; per path, ``rate_p = min(link_p, A, S)``.

    The double buffer overlaps sensing with draining (DASH §V-B "Dual-Path HBF Read"), so after the
    startup the slowest stage sets the rate. That is the chunk pipeline's makespan exactly when the
    drain is the slow stage; when sensing is, the two differ by less than one chunk's stage time
    (tR against one chunk's drain).

    Assignment (``balanced_split = 1``): the number of experts on Direct, ``k``, minimises
    ``max(T_Direct(k), T_Relay(n − k))``. T_Direct rises and T_Relay falls with k, so the optimum is at
    k = 0, n, or next to the crossing of the two, which is a crossing of one of Direct's two linear pieces
    (link-bound, array-floor-bound) with one of Relay's four (first chunk filling or full × link- or
    floor-bound): 16 candidates, exact (``tests/test_delivery.py`` checks it against
    every k). Ties go to the first candidate in the order 0, n, crossings. An absent path
    (rate 0) has T = ∞ for any expert and so gets none. With ``balanced_split = 0``,
    ``round(relay_fraction · n)`` experts go over Relay. ``temperature_us``: the relaxation of the
    module docstring (None: exact).
    """
    n = _needed_count(needed)
    b = _f(expert_bytes)
    n, b = jnp.broadcast_arrays(n, b)
    m = _path_model(n, b, knobs, window_us)
    ks = _balanced_candidates(m)
    t_d, t_r, _, _ = _times(ks, jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, -1), m))
    best = jnp.take_along_axis(ks, jnp.argmin(jnp.maximum(t_d, t_r), axis=-1)[..., None], axis=-1)[..., 0]
    fixed = n - _round_half_up(knobs.relay_fraction * n, temperature_us)
    k = jnp.where(knobs.balanced_split > 0.5, best, fixed)
    t_d, t_r, s_d, s_r = _times(k, m, temperature_us)
    total = _max2(t_d, t_r, temperature_us)
    slow = (t_r > t_d).astype(jnp.int32)
    r, shared = rates(knobs), knobs.shared_array_rate > 0.5
    lim_d = _limit(k * b, n * b, r.direct_gbps, r, shared)
    lim_r = _limit((n - k) * b, n * b, r.relay_gbps, r, shared)
    return ExpertDelivery(direct_experts=k, relay_experts=n - k, direct_bytes=k * b, relay_bytes=(n - k) * b,
                          direct_us=t_d, relay_us=t_r, direct_startup_us=s_d, relay_startup_us=s_r,
                          delivery_us=total, slow_path=slow, limit=jnp.where(slow == 1, lim_r, lim_d))


def expert_delivery_table(max_experts: int, expert_bytes, knobs: OrgKnobs, temperature_us=None) -> ExpertDelivery:
    """:func:`expert_delivery` of 0 … ``max_experts`` needed experts (fields float32[max_experts + 1])
    with tR fully hidden, for :func:`expert_delivery_lookup`. Built once per run (the organisation and
    the expert size are fixed), it turns each layer's 16-candidate split search into one gather."""
    hidden = dataclasses.replace(knobs, lookahead=jnp.float32(1.0))
    return expert_delivery(jnp.arange(max_experts + 1, dtype=jnp.float32), expert_bytes, hidden, window_us=math.inf,
                           temperature_us=temperature_us)


def expert_delivery_lookup(table: ExpertDelivery, needed, knobs: OrgKnobs, window_us=math.inf,
                           temperature_us=None) -> ExpertDelivery:
    """:func:`expert_delivery` of ``needed`` (bool[..., E] or counts <= the table's size) from a
    :func:`expert_delivery_table`: equal to it, because the exposed tR is added to every busy path's
    time alike — ``max(T_Direct, T_Relay) = tR_exposed + max(T'_Direct, T'_Relay)`` for every split
    with a busy path — so the best split does not depend on it; only the times and startups shift.
    ``temperature_us``: the relaxation of the module docstring (the table's own, built with it)."""
    n = _needed_count(needed).astype(jnp.int32)
    got = jax.tree_util.tree_map(lambda a: a[n], table)
    tr = knobs.t_read_us - knobs.lookahead * jnp.minimum(knobs.t_read_us, _f(window_us))
    t_d = jnp.where(got.direct_bytes > 0, got.direct_us + tr, 0.0)
    t_r = jnp.where(got.relay_bytes > 0, got.relay_us + tr, 0.0)
    slow = (t_r > t_d).astype(jnp.int32)
    r, shared = rates(knobs), knobs.shared_array_rate > 0.5
    total_bytes = got.direct_bytes + got.relay_bytes
    lim_d = _limit(got.direct_bytes, total_bytes, r.direct_gbps, r, shared)
    lim_r = _limit(got.relay_bytes, total_bytes, r.relay_gbps, r, shared)
    return got._replace(direct_us=t_d, relay_us=t_r,
                        direct_startup_us=jnp.where(got.direct_bytes > 0, got.direct_startup_us + tr, 0.0),
                        relay_startup_us=jnp.where(got.relay_bytes > 0, got.relay_startup_us + tr, 0.0),
                        delivery_us=_max2(t_d, t_r, temperature_us), slow_path=slow,
                        limit=jnp.where(slow == 1, lim_r, lim_d))


# --- parallel HBM/HBF reads (DASH §V-B "Parallel HBM/HBF Read") ------------------------------------

class ParallelRead(NamedTuple):
    """A read served from HBM and HBF at once (shapes: those of the broadcast inputs)."""

    hbm_bytes: jax.Array  # f32 bytes read from HBM (over the GPU–HBM links)
    hbf_bytes: jax.Array  # f32 bytes read from HBF (over Direct and Relay)
    read_us: jax.Array  # f32 time until both parts are at the GPU
    limit: jax.Array  # int32 index into READ_LIMITS: the HBM side, the HBF side, or both together


class ReadCuts(NamedTuple):
    """Most GB/s the GPU can receive from HBM alone, HBF alone, and both at once (float32[])."""

    hbm_gbps: jax.Array
    hbf_gbps: jax.Array
    joint_gbps: jax.Array


def read_cuts(knobs: OrgKnobs) -> ReadCuts:
    """Max flows of the link network to the GPU: HBM cells (M) → base die → GPU–HBM links (G); HBF
    arrays (min(A, S)) → Direct (D) → GPU, and → HBM–HBF links → the same base die → G (Relay, past the
    HBM cells). Each value is the network's min cut for that set of sources; a read of fixed shares then
    takes ``max(H / hbm, F / hbf, (H + F) / joint)`` (the supply vectors form a polymatroid). Shared
    arrays bound Direct + Relay by ``min(A, S)``; per path, each by it alone."""
    r = rates(knobs)
    m, g, d, x = r.hbm_cells_gbps, r.gpu_hbm_gbps, r.direct_gbps, r.relay_link_gbps
    src = source_gbps(r)
    shared = knobs.shared_array_rate > 0.5
    d_p, x_p = jnp.minimum(d, src), jnp.minimum(x, src)
    hbf = jnp.where(shared, jnp.minimum(src, d + jnp.minimum(x, g)), d_p + jnp.minimum(x_p, g))
    joint_shared = jnp.minimum(jnp.minimum(m + src, m + d + x), jnp.minimum(g + src, g + d))
    joint_per_path = jnp.minimum(m + d_p + x_p, g + d_p)
    return ReadCuts(hbm_gbps=jnp.minimum(m, g), hbf_gbps=hbf,
                    joint_gbps=jnp.where(shared, joint_shared, joint_per_path))


def parallel_read(hbm_only_bytes, hbf_only_bytes, knobs: OrgKnobs, either_bytes=0.0) -> ParallelRead:
    """Read ``hbm_only_bytes`` from HBM and ``hbf_only_bytes`` from HBF concurrently, plus ``either_bytes``
    held in both tiers (replicated) and split between them to finish soonest (DASH §V-B).

    The time is ``max(H / hbm, F / hbf, (H + F + E) / joint)`` over :func:`read_cuts`: the least time any
    split and any routing over the links achieves (HBF bytes may use Direct and Relay, DASH §V-B
    "Dual-Path HBF Read"). The accesses are predictable (they follow the execution order), so
    double buffering hides tR (DASH §V-C) and no startup is added. The replicated bytes are split in
    proportion to the two sides' rates, within what each side can carry in that time.
    """
    h, f, e = jnp.broadcast_arrays(_f(hbm_only_bytes), _f(hbf_only_bytes), _f(either_bytes))
    cuts = read_cuts(knobs)
    times = jnp.stack([transfer_us(h, cuts.hbm_gbps), transfer_us(f, cuts.hbf_gbps),
                       transfer_us(h + f + e, cuts.joint_gbps)], axis=-1)
    read_us = jnp.max(times, axis=-1)
    total = h + f + e
    # any split within both sides' cuts over read_us is routable (the joint cut holds by construction)
    within_us = jnp.where(jnp.isfinite(read_us), read_us, 0.0) / US_PER_BYTE_AT_1_GBPS  # bytes per GB/s
    # HBM carries its own bytes and at most the replicated ones: without the cap, the rounding of
    # total − hbf · within_us leaves a few ulps of an HBF-only read on an HBM that may not exist
    lo = jnp.minimum(jnp.maximum(h, total - cuts.hbf_gbps * within_us), h + e)
    hi = jnp.maximum(jnp.minimum(h + e, cuts.hbm_gbps * within_us), lo)
    hbm_bytes = jnp.clip(total * cuts.hbm_gbps / jnp.maximum(cuts.hbm_gbps + cuts.hbf_gbps, 1e-30), lo, hi)
    return ParallelRead(hbm_bytes=hbm_bytes, hbf_bytes=total - hbm_bytes, read_us=read_us,
                        limit=jnp.argmax(times, axis=-1).astype(jnp.int32))


def replicated_read(weight_bytes, knobs: OrgKnobs, kind: int = 0) -> ParallelRead:
    """Read ``weight_bytes`` of data kind ``kind`` (default: dense weights, i.e. the QKV and output
    projections) placed by ``knobs.place``: its HBM-only, HBF-only and replicated shares
    (:func:`parallel_read`)."""
    w = _f(weight_bytes)
    row = knobs.place[kind]
    return parallel_read(w * row[0], w * row[1], knobs, either_bytes=w * row[2])


# --- direct prefill write (DASH §V-B "Direct Prefill Write") ---------------------------------------

class PrefillWrite(NamedTuple):
    """New prefill KV written from the GPU into HBF (shapes: those of the broadcast inputs)."""

    link_us: jax.Array  # f32 all bytes over the write route
    waves: jax.Array  # f32 page-wave programs (a partial wave costs a full tPROG)
    program_busy_us: jax.Array  # f32 waves × tPROG
    write_us: jax.Array  # f32 from the first byte sent to the last wave programmed
    exposed_us: jax.Array  # f32 max(0, write_us − window_us): what the overlap does not hide


def _programmed_write(nbytes, route_gbps, knobs: OrgKnobs, window_us) -> PrefillWrite:
    """``nbytes`` sent at ``route_gbps`` into the HBF base-die SRAM and programmed there, one region per
    stack (at most a page wave) per tPROG: the two-stage flow shop of :func:`prefill_write`."""
    nbytes = _f(nbytes)
    route = jnp.minimum(_f(route_gbps), knobs.hbf_stacks * knobs.hbf_write_gbps)  # programs cap the route
    chunk = knobs.hbf_stacks * jnp.minimum(knobs.parallel_units * knobs.page_bytes, knobs.hbf_sram_region_bytes)
    waves = jnp.ceil(nbytes / chunk)
    p = knobs.t_prog_us
    x = transfer_us(chunk, route)
    first = transfer_us(jnp.minimum(nbytes, chunk), route)
    link_us = transfer_us(nbytes, route)
    write_us = jnp.maximum(jnp.maximum(first + waves * p, link_us + p), jnp.where(waves >= 2, (waves - 1) * x + 2 * p, 0.0))
    write_us = jnp.where(nbytes > 0, write_us, 0.0)
    return PrefillWrite(link_us=link_us, waves=waves, program_busy_us=waves * p, write_us=write_us,
                        exposed_us=jnp.maximum(write_us - _f(window_us), 0.0))


def prefill_write(kv_bytes, knobs: OrgKnobs, window_us=0.0) -> PrefillWrite:
    """Write ``kv_bytes`` of prefill KV straight from the GPU to HBF, without staging it in HBM.

    The bytes cross the Direct links (RelayOnly: the relay route) into the HBF base-die SRAM in chunks
    of one region per stack (at most a page wave), and each chunk is programmed in tPROG while the
    next one arrives in the other region. This is a two-stage flow shop (send ``x_i``, program
    tPROG), whose makespan is ``max_j (x_1 + … + x_j + (n − j + 1)·tPROG)``; with equal full chunks
    that is the largest of ``x_1 + n·tPROG``, ``(n − 1)·x + 2·tPROG`` and ``all bytes / rate + tPROG``.
    Two regions suffice for it: a region is refilled only after its wave has been programmed. The
    programs overlap the layer's attention computation (DASH §V-B: the output-projection weights come
    from HBM meanwhile), so only the part beyond ``window_us`` is exposed.
    """
    r = rates(knobs)
    route = jnp.where(r.direct_gbps > 0, r.direct_gbps, r.relay_gbps)
    return _programmed_write(kv_bytes, route, knobs, window_us)


def writeback_write(kv_bytes, knobs: OrgKnobs, window_us=0.0) -> PrefillWrite:
    """Write ``kv_bytes`` of decode KV back from HBM to HBF (DASH §V-B "HBM-to-HBF KV Writeback"): over
    the HBM–HBF links where they exist, else through the GPU (:func:`hbm_to_hbf_gbps`), into the HBF
    SRAM and programmed wave by wave, the same flow shop as :func:`prefill_write`; the transfer starts
    after the layer's QKV projection and overlaps what follows, ``window_us``."""
    return _programmed_write(kv_bytes, hbm_to_hbf_gbps(knobs), knobs, window_us)
