"""Relaxations of the simulation's hard operations, used only when a tuning run asks for them (DESIGN.md §6).

A leaf module (like ``hbfjax.rng``): the physics, memory and serving layers relax their own maxima and
thresholds with it when a ``hbfjax.tune`` problem passes a temperature.

The default simulation is exact: a maximum over planes, a threshold and ``round(f × planes)`` are
piecewise constant in the knobs, so their pathwise gradient is zero. A problem's objective receives
``relax = None`` (exact) or a :class:`Relax` carrying a temperature in the units of the quantity
relaxed; every helper here reduces to the exact operation as the temperature goes to zero.

Bias of each relaxation (for the estimator documentation in ``hbfjax.tune.estimators``):

* :func:`soft_max`: ``t · logsumexp(x / t)`` lies in ``[max x, max x + t · log n]``;
* :func:`soft_step`: ``sigmoid(x / t)`` differs from ``1[x > 0]`` by at most ``exp(−|x| / t)``;
* :func:`soft_relu`: ``t · softplus(x / t)`` lies in ``[max(x, 0), max(x, 0) + t · log 2]``;
* :func:`ste_round`: the forward value is exact; the backward pass treats rounding as the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.validate import require, require_int, require_real


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Relax:
    """The relaxation in force: one temperature (f32[]), in the units of the quantity each problem relaxes."""

    temperature: jax.Array  # f32[] > 0

    @classmethod
    def make(cls, temperature: float) -> "Relax":
        require_real(cls.__name__, "temperature", temperature, 0.0, lo_open=True)
        return cls(jnp.float32(temperature))


def soft_max(x: jax.Array, temperature, axis: int = -1) -> jax.Array:
    """``t · logsumexp(x / t)`` over ``axis``: an upper bound of the max, within ``t · log n`` of it."""
    t = jnp.asarray(temperature, jnp.float32)
    return t * jax.nn.logsumexp(x / t, axis=axis)


def soft_step(x: jax.Array, temperature) -> jax.Array:
    """``sigmoid(x / t)``: the relaxed indicator ``1[x > 0]``."""
    return jax.nn.sigmoid(x / jnp.asarray(temperature, jnp.float32))


def soft_relu(x: jax.Array, temperature) -> jax.Array:
    """``t · softplus(x / t)``: the relaxed ``max(x, 0)``, above it by at most ``t · log 2``."""
    t = jnp.asarray(temperature, jnp.float32)
    return t * jax.nn.softplus(x / t)


def soft_min(a: jax.Array, b: jax.Array, temperature) -> jax.Array:
    """``−t · logaddexp(−a / t, −b / t)``: the relaxed ``min(a, b)``, below it by at most ``t · log 2``."""
    t = jnp.asarray(temperature, jnp.float32)
    return -t * jnp.logaddexp(-a / t, -b / t)


def ste_round(x: jax.Array) -> jax.Array:
    """Straight-through rounding: ``round(x)`` forward, the identity backward."""
    return x + jax.lax.stop_gradient(jnp.round(x) - x)


def maybe(relax: "Relax | None", exact, relaxed):
    """``exact`` when no relaxation is in force, else ``relaxed(temperature)`` (a static choice)."""
    return exact() if relax is None else relaxed(relax.temperature)


def geometric_schedule(start: float, end: float, steps: int) -> np.ndarray:
    """f32[steps]: temperatures falling geometrically from ``start`` to ``end`` (both > 0)."""
    require_real("", "temperature_start", start, 0.0, lo_open=True)
    require_real("", "temperature_end", end, 0.0, lo_open=True)
    require(end <= start, "", "temperature_end", end, f"must be <= temperature_start = {start}")
    n = require_int("", "steps", steps, 1)
    return np.geomspace(start, end, n).astype(np.float32) if n > 1 else np.array([end], np.float32)
