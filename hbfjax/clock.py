"""Simulated time exact to 1 µs over hours in float32 arithmetic: a two-part clock (DESIGN.md §3).

A float32 count of µs is exact only below 2^24 µs ≈ 16.8 s; a 2-hour trace spans 7.2e9 µs. A
:class:`Clock` therefore holds whole seconds (int32) and the µs within the second (float32 in
[0, 1e6)). Below 1e6 the float32 spacing is at most 1/16 µs, so:

* whole-µs values (and multiples of 1/16 µs) are held exactly, and every :func:`add`, :func:`sub`
  and :func:`advance` by such an amount is exact, for any number of seconds an int32 holds
  (±68 years);
* an :func:`advance` by a fractional amount is kept fractional (not rounded, so gradients flow
  through ``dt_us``): it rounds to that spacing, an error of at most 1/16 µs per advance;
* an advance is exact when ``dt_us`` itself is (a float32 whole number of µs below 2^24 µs ≈ 16.8 s;
  a longer step is as exact as its float32 value).

:func:`from_seconds` (host float64 → Clock) **rounds to the nearest whole µs**, the design's
resolution; trace stamps are ms or µs (Azure's 100 ns digits are dropped). :func:`to_seconds` is its
host inverse. Inside traced code compare clocks with :func:`less` and take differences with
:func:`diff_us` (float32: exact for whole-µs differences below 2^24 µs ≈ 16.8 s, otherwise rounded
to float32, relative error 2^-24). :func:`searchsorted` counts the arrivals at or before ``now`` in a
sorted clock array (the serving layer's "arrived" pointer, DESIGN.md §5).

Shapes: a ``Clock[R]`` is ``Clock(s=int32[R], us=float32[R])``; a NamedTuple, so it is a pytree that
``vmap``, ``jit`` and ``lax.scan`` carry as is.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.validate import INT32_MAX, ConfigError

US_PER_S = 1_000_000
_US = np.float32(US_PER_S)  # a NumPy scalar: importing hbfjax must not start a JAX backend (jax.distributed comes first)


class Clock(NamedTuple):
    """A time: ``s`` whole seconds (int32) plus ``us`` microseconds (float32 in [0, 1e6))."""

    s: jax.Array  # int32[...] whole seconds
    us: jax.Array  # float32[...] µs within the second, in [0, 1e6)


def zeros(shape=()) -> Clock:
    """t = 0 in the given shape."""
    return Clock(jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32))


def never(shape=()) -> Clock:
    """A sentinel later than every real time (``s`` = int32 max): the arrival of a padding request,
    so a sorted arrival array stays sorted and :func:`searchsorted` never counts it."""
    return Clock(jnp.full(shape, INT32_MAX, jnp.int32), jnp.zeros(shape, jnp.float32))


def from_us(total_us) -> Clock:
    """Host whole µs (an int or an int64 array, exact) → Clock."""
    total = np.asarray(total_us, np.int64)
    s, us = np.divmod(total, US_PER_S)
    if total.size and (s.min() < -INT32_MAX - 1 or s.max() > INT32_MAX):
        raise ConfigError(f"clock = {total.max()} µs: whole seconds must fit int32 (|t| < 2^31 s)")
    return Clock(jnp.asarray(s, jnp.int32), jnp.asarray(us, jnp.float32))


def from_seconds(seconds) -> Clock:
    """Host seconds (float64, scalar or array) → Clock, **rounded to the nearest whole µs**."""
    x = np.asarray(seconds, np.float64)
    if not np.all(np.isfinite(x)):
        raise ConfigError(f"clock = {x[~np.isfinite(x)].flat[0]!r} s: must be finite")
    if x.size and np.abs(x).max() >= 2.0**31:
        raise ConfigError(f"clock = {np.abs(x).max()!r} s: whole seconds must fit int32 (|t| < 2^31 s)")
    return from_us(np.rint(x * US_PER_S).astype(np.int64))


def to_seconds(clock: Clock) -> np.ndarray:
    """Host float64 seconds of a clock (exact to float64: 7.2e3 s keeps ~1e-12 s)."""
    return np.asarray(clock.s, np.float64) + np.asarray(clock.us, np.float64) / US_PER_S


def to_us(clock: Clock) -> np.ndarray:
    """Host float64 µs of a clock (exact for whole µs below 2^53 µs)."""
    return np.asarray(clock.s, np.float64) * US_PER_S + np.asarray(clock.us, np.float64)


def _fold(whole: jax.Array, part: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(whole, part)`` with ``part`` folded into [0, 1e6) once: a float32 ``x / 1e6`` a hair below a
    whole number can round up (or down), leaving ``part`` one second out of range."""
    up = part >= _US
    down = part < 0
    part = jnp.where(up, part - _US, jnp.where(down, part + _US, part))
    return whole + up.astype(whole.dtype) - down.astype(whole.dtype), part


def _add_within(s: jax.Array, us: jax.Array, rem: jax.Array) -> Clock:
    """``(s, us) + rem`` for ``us, rem`` in [0, 1e6), never forming a sum above 1e6: past 2^20 the
    float32 spacing doubles to 1/8 µs, so ``us + rem − 1e6`` is computed as ``us − (1e6 − rem)``."""
    gap = _US - rem
    over = us >= gap
    return Clock(s + over.astype(jnp.int32), jnp.where(over, us - gap, us + rem))


def advance(clock: Clock, dt_us) -> Clock:
    """``clock + dt_us`` (float32 µs, may be fractional or negative), carried into whole seconds.

    Exact when ``dt_us`` and ``clock.us`` are whole µs (or multiples of 1/16 µs); a fractional sum
    rounds to float32's spacing below 1e6 (≤ 1/16 µs)."""
    dt = jnp.asarray(dt_us, jnp.float32)
    whole = jnp.floor(dt / _US)  # split first: dt may exceed 2^24 µs, clock.us + dt would round
    whole, rem = _fold(whole, dt - whole * _US)
    out = _add_within(clock.s, clock.us, rem)
    return Clock(out.s + whole.astype(jnp.int32), out.us)


def add(a: Clock, b: Clock) -> Clock:
    """``a + b`` (exact for whole-µs or 1/16-µs parts)."""
    return _add_within(a.s + b.s, a.us, b.us)


def sub(a: Clock, b: Clock) -> Clock:
    """``a − b`` as a clock (exact for whole-µs or 1/16-µs parts: |a.us − b.us| < 1e6)."""
    s, us = _fold(a.s - b.s, a.us - b.us)
    return Clock(s, us)


def diff_us(a: Clock, b: Clock) -> jax.Array:
    """float32 µs of ``a − b``: exact for whole-µs differences below 2^24 µs ≈ 16.8 s; beyond,
    rounded to float32 (relative error 2^-24)."""
    return (a.s - b.s).astype(jnp.float32) * _US + (a.us - b.us)


def less(a: Clock, b: Clock) -> jax.Array:
    """``a < b`` (elementwise, exact)."""
    return (a.s < b.s) | ((a.s == b.s) & (a.us < b.us))


def less_equal(a: Clock, b: Clock) -> jax.Array:
    """``a <= b`` (elementwise, exact)."""
    return (a.s < b.s) | ((a.s == b.s) & (a.us <= b.us))


def where(cond, a: Clock, b: Clock) -> Clock:
    """Elementwise select of two clocks."""
    return Clock(jnp.where(cond, a.s, b.s), jnp.where(cond, a.us, b.us))


def take(clock: Clock, index) -> Clock:
    """``clock[index]`` (gather along the last axis)."""
    return Clock(jnp.take(clock.s, index, axis=-1), jnp.take(clock.us, index, axis=-1))


_SIXTEENTHS = 16  # cumsum's unit: 1/16 µs, the float32 spacing just below 1e6 µs
_Q_PER_S = _SIXTEENTHS * US_PER_S  # 1.6e7 sixteenths a second (< 2^24: exact in float32)
_DIGIT = 1024  # sixteenths = hi·1024 + lo; 1.6e7 = 1024 × 15625, so hi counts 1/15625 s
MAX_CUMSUM_STEPS = (2**31 - 1) // (_Q_PER_S // _DIGIT)  # int32 running sum of hi digits (137,438)


def cumsum(steps: Clock) -> Clock:
    """Inclusive running sums of ``steps: Clock[..., R]`` along the last axis, exact in int32 arithmetic
    for steps that are whole µs or multiples of 1/16 µs (other fractions are rounded to 1/16 µs
    first); R <= 137,438 steps.

    The µs parts, in sixteenths, are split into two base-1024 digits whose int32 running sums cannot
    overflow, then folded back into seconds: a plain ``cumsum`` each (an ``associative_scan`` of
    :func:`add` gives the same sums but compiles 10× slower on a CPU)."""
    r = steps.s.shape[-1]
    if r > MAX_CUMSUM_STEPS:
        raise ConfigError(f"clock.cumsum steps = {r}: at most {MAX_CUMSUM_STEPS} (int32 running sums)")
    q = jnp.round(steps.us * _SIXTEENTHS).astype(jnp.int32)  # in [0, 1.6e7]
    whole = steps.s + (q >= _Q_PER_S).astype(jnp.int32)
    q = jnp.where(q >= _Q_PER_S, q - _Q_PER_S, q)
    hi = jnp.cumsum(q // _DIGIT, axis=-1)  # < 15625·R
    lo = jnp.cumsum(q % _DIGIT, axis=-1)  # < 1024·R
    per_s = _Q_PER_S // _DIGIT
    rest = (hi % per_s) * _DIGIT + lo % _Q_PER_S  # < 3.2e7 sixteenths
    seconds = jnp.cumsum(whole, axis=-1) + hi // per_s + lo // _Q_PER_S + rest // _Q_PER_S
    return Clock(seconds, (rest % _Q_PER_S).astype(jnp.float32) / jnp.float32(_SIXTEENTHS))


def searchsorted(sorted_clock: Clock, now: Clock, side: str = "right") -> jax.Array:
    """int32: how many entries of the sorted ``sorted_clock: Clock[R]`` are ``<= now`` (``side="right"``,
    the arrivals that have happened by ``now``) or ``< now`` (``side="left"``); a binary search of
    ceil(log2(R + 1)) exact comparisons."""
    if side not in ("left", "right"):
        raise ConfigError(f"searchsorted.side = {side!r}: must be one of ('left', 'right')")
    n = sorted_clock.s.shape[-1]
    before = less_equal if side == "right" else less  # entry at mid is counted

    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        go_right = before(take(sorted_clock, jnp.minimum(mid, n - 1)), now) & (mid < hi)
        return jnp.where(go_right, mid + 1, lo), jnp.where(go_right, hi, mid)

    # a fori_loop, not an unrolled Python loop: under vmap the unrolled gathers compiled 30x slower
    bounds = (jnp.zeros(jnp.shape(now.s), jnp.int32), jnp.full(jnp.shape(now.s), n, jnp.int32))
    return jax.lax.fori_loop(0, max(1, math.ceil(math.log2(n + 1))), halve, bounds)[0]
