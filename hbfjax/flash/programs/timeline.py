"""The per-iteration timeline of one model pass: layers × segments of compute and HBF reads (HBFlex §3.2).

A serving iteration runs every layer; each layer is a fixed sequence of *segments*, either GPU
compute or an HBF read (weights or KV). A read touches a set of planes; a program in flight on any
of them makes the read wait (HBFlex Fig. 8). :class:`Timeline` is the knob pytree that describes
this, shaped so that a serving engine can fill it from model presets and GPU timing (one value per
layer × segment), and so that the plane-collision mechanism can feed the exact planes of a read
through ``touch_mask`` (``touch_fraction`` gives a hashed placement of a read over a fraction of the
planes instead).

Durations are linear in the iteration's prefill tokens: ``duration_us + prefill_us_per_token ×
prefill_tokens`` (a chunked-prefill iteration lengthens compute and KV reads, HBFlex Fig. 9).

Shapes: L layers, S segments per layer, P tracked plane slots (each slot stands for
``planes_per_slot`` physical planes, e.g. a plane group of HBFlex §5.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from hbfjax.validate import require

@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Timeline:
    """Segments of every layer of one iteration (traced knobs: one compilation serves a sweep)."""

    duration_us: jax.Array  # f32[L, S] compute or read time of a decode-only iteration, no waits
    prefill_us_per_token: jax.Array  # f32[L, S] extra time per prefill token in the iteration
    is_read: jax.Array  # bool[L, S] an HBF read segment (else GPU compute)
    touch_fraction: jax.Array  # f32[L, S] fraction of plane slots a read touches (hashed placement)
    touch_mask: jax.Array  # bool[L, S, P] plane slots a read touches for sure (e.g. from collide)
    prefetchable: jax.Array  # bool[L, S] a weight read that prefetch moves to the layer's first read
    kv_point: jax.Array  # bool[L, S] the layer's new KV exists at the end of this segment
    phase_jitter: jax.Array  # f32[L, S] in [−1, 1]: duration × (1 + jitter·(2U−1)), U per layer
    kv_bytes_per_token: jax.Array  # f32[L] KV bytes one token adds to this layer

    @property
    def layers(self) -> int:
        return int(self.duration_us.shape[0])

    @property
    def segments(self) -> int:
        return int(self.duration_us.shape[1])

    @property
    def plane_slots(self) -> int:
        return int(self.touch_mask.shape[2])


def _check(ok: bool, name: str, value, rule: str) -> None:
    require(ok, "Timeline", name, value, rule)


def make_timeline(duration_us, is_read, kv_point, kv_bytes_per_token, plane_slots: int, *,
                  prefill_us_per_token=None, touch_fraction=None, touch_mask=None, prefetchable=None,
                  phase_jitter=None) -> Timeline:
    """A validated :class:`Timeline` from [L, S] arrays (kv_bytes_per_token: scalar or [L]).

    Every layer needs exactly one ``kv_point``; reads default to touching every plane slot.
    """
    dur = np.asarray(duration_us, np.float32)
    _check(dur.ndim == 2 and dur.size > 0, "duration_us", dur.shape, "must be a non-empty [layers, segments] array")
    shape = dur.shape
    L, S = shape
    _check(plane_slots >= 1, "plane_slots", plane_slots, "must be >= 1")

    def arr(x, default, dtype, name, shp=shape):
        a = np.broadcast_to(np.asarray(default if x is None else x, dtype), shp).copy()
        return a

    _check(bool(np.all(dur >= 0)), "duration_us", dur.min(), "durations must be >= 0 µs")
    is_read_a = arr(is_read, False, bool, "is_read")
    kv = arr(kv_point, False, bool, "kv_point")
    _check(bool(np.all(kv.sum(axis=1) == 1)), "kv_point", kv.sum(axis=1).tolist(),
           "each layer needs exactly one segment where its new KV exists")
    _check(not bool(np.any(kv & is_read_a)), "kv_point", "on a read", "new KV comes from a compute segment")
    pre = arr(prefill_us_per_token, 0.0, np.float32, "prefill_us_per_token")
    _check(bool(np.all(pre >= 0)), "prefill_us_per_token", pre.min(), "must be >= 0 µs per token")
    frac = arr(touch_fraction, 1.0, np.float32, "touch_fraction")
    _check(bool(np.all((frac >= 0) & (frac <= 1))), "touch_fraction", (frac.min(), frac.max()), "must lie in [0, 1]")
    mask = arr(touch_mask, False, bool, "touch_mask", (L, S, plane_slots))
    pf = arr(prefetchable, False, bool, "prefetchable")
    _check(not bool(np.any(pf & ~is_read_a)), "prefetchable", "on compute", "only a read can be prefetched")
    jit = arr(phase_jitter, 0.0, np.float32, "phase_jitter")
    _check(bool(np.all(np.abs(jit) <= 1)), "phase_jitter", np.abs(jit).max(), "must lie in [-1, 1]")
    kvb = np.broadcast_to(np.asarray(kv_bytes_per_token, np.float32), (L,)).copy()
    _check(bool(np.all(kvb >= 0)), "kv_bytes_per_token", kvb.min(), "must be >= 0 bytes")
    return Timeline(duration_us=jnp.asarray(dur), prefill_us_per_token=jnp.asarray(pre),
                    is_read=jnp.asarray(is_read_a), touch_fraction=jnp.asarray(frac), touch_mask=jnp.asarray(mask),
                    prefetchable=jnp.asarray(pf), kv_point=jnp.asarray(kv), phase_jitter=jnp.asarray(jit),
                    kv_bytes_per_token=jnp.asarray(kvb))


# --- derived views (pure, traced) -------------------------------------------------------------

def apply_prefetch(tl: Timeline, prefetch: jax.Array) -> Timeline:
    """Weight prefetch (HBFlex §5.3, Fig. 13a): with ``prefetch`` = 1 every prefetchable read of a layer
    is issued together at the layer's first read, so the compute between them runs back-to-back and
    forms one longer window. Total read time is unchanged; the moved segments become empty compute."""
    moved = tl.is_read & tl.prefetchable & (prefetch > 0.5)  # [L, S]
    first = jnp.argmax(tl.is_read, axis=1)  # [L] first read of each layer
    at_first = jax.nn.one_hot(first, tl.segments, dtype=bool) & jnp.any(tl.is_read, axis=1, keepdims=True)
    m = moved.astype(jnp.float32)
    f = at_first.astype(jnp.float32)
    moved_us = jnp.sum(m * tl.duration_us, axis=1, keepdims=True)
    moved_pre = jnp.sum(m * tl.prefill_us_per_token, axis=1, keepdims=True)
    moved_touch = jnp.max(m * tl.touch_fraction, axis=1, keepdims=True)
    moved_mask = jnp.any(moved[:, :, None] & tl.touch_mask, axis=1, keepdims=True)
    keep = 1.0 - m
    return Timeline(
        duration_us=tl.duration_us * keep * (1 - f) + f * (tl.duration_us * keep + moved_us),
        prefill_us_per_token=tl.prefill_us_per_token * keep * (1 - f) + f * (tl.prefill_us_per_token * keep + moved_pre),
        is_read=(tl.is_read & ~moved) | at_first,
        touch_fraction=jnp.where(at_first, jnp.maximum(tl.touch_fraction * keep, moved_touch), tl.touch_fraction * keep),
        touch_mask=jnp.where(at_first[:, :, None], tl.touch_mask | moved_mask, tl.touch_mask & ~moved[:, :, None]),
        prefetchable=tl.prefetchable & ~moved, kv_point=tl.kv_point, phase_jitter=tl.phase_jitter,
        kv_bytes_per_token=tl.kv_bytes_per_token)


def window_after(tl: Timeline) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Read-free windows (HBFlex §3.2): for each segment (flattened to [L·S]) the nominal compute time from
    its start to the next read, split as ``decode_us + prefill_tokens × per_token_us``, and a mask of
    the segments that open a window (compute right after a read, or the first segment).

    The iteration's end closes a window (the next iteration starts with reads)."""
    compute = ~tl.is_read.reshape(-1)
    dur = tl.duration_us.reshape(-1)
    pre = tl.prefill_us_per_token.reshape(-1)

    def back(carry, x):
        c, d, p = x
        g = jnp.where(c, carry + jnp.stack([d, p]), 0.0)
        return g, g

    _, g = jax.lax.scan(back, jnp.zeros(2, jnp.float32), (compute, dur, pre), reverse=True)
    prev_read = jnp.concatenate([jnp.ones(1, bool), ~compute[:-1]])
    return g[:, 0], g[:, 1], compute & prev_read
