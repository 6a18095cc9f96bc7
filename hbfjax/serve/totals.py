"""Typed run totals: a NamedTuple of float32 scalars added up pass by pass over a whole run.

A totals type is a ``NamedTuple`` whose fields are float32[] per-pass amounts. Most fields are sums;
the fields a type names in its class attribute ``PEAKS`` are running maxima (e.g. the most SRAM in use
in a pass). :class:`Accumulator` keeps the run's sums with Kahan compensation, so a million-pass run
loses no more than float32 rounding of the total (a plain float32 sum of n terms loses up to n·2⁻²⁴
of it). The fields are stacked into one float32[F] vector inside the accumulator (one vector
operation per pass instead of one per field); :func:`add` takes and :func:`value` returns the typed
record, so no caller indexes fields by position or name.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Accumulator(NamedTuple):
    """The running totals of one totals type (a loop carry)."""

    sums: jax.Array  # float32[F] the fields in declaration order: sums, and maxima for PEAKS fields
    comp: jax.Array  # float32[F] Kahan compensation of the sums (0 for PEAKS fields)


@functools.cache
def _peaks(kind: type) -> np.ndarray:
    """bool[F]: which fields of ``kind`` are running maxima (its ``PEAKS``)."""
    peaks = tuple(getattr(kind, "PEAKS", ()))
    unknown = set(peaks) - set(kind._fields)
    if unknown:
        raise TypeError(f"{kind.__name__}.PEAKS names fields it lacks: {sorted(unknown)}")
    return np.array([name in peaks for name in kind._fields])


def zeros(kind: type) -> Accumulator:
    """Empty totals of ``kind`` (a NamedTuple type)."""
    z = jnp.zeros(len(kind._fields), jnp.float32)
    return Accumulator(z, z)


def zero_record(kind: type):
    """A ``kind`` record of float32 zeros (the amounts of a pass that adds nothing)."""
    return kind(*(jnp.float32(0.0) for _ in kind._fields))


def add(acc: Accumulator, amounts) -> Accumulator:
    """``acc`` plus one pass's ``amounts`` (a record of ``acc``'s type): Kahan-compensated sums, and
    running maxima for the type's ``PEAKS``."""
    peaks = _peaks(type(amounts))
    x = jnp.stack([jnp.asarray(v, jnp.float32) for v in amounts])
    y = x - acc.comp
    t = acc.sums + y
    return Accumulator(jnp.where(peaks, jnp.maximum(acc.sums, x), t), jnp.where(peaks, acc.comp, (t - acc.sums) - y))


def value(acc: Accumulator, kind: type):
    """The totals as a ``kind`` record (float32[...] fields; any leading axes of a batched run kept)."""
    return kind(*(acc.sums[..., i] for i in range(len(kind._fields))))


def masked(amounts, keep):
    """``amounts`` where ``keep`` (bool[]), zeros elsewhere (a pass without work adds nothing)."""
    return jax.tree_util.tree_map(lambda v: jnp.where(keep, jnp.asarray(v, jnp.float32), 0.0), amounts)
