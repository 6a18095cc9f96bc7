"""The parts protocol's own machinery (``hbfjax.serve.totals``, ``hbfjax.serve.parts``): the typed Kahan
accumulator traced by hand (sums compensated, PEAKS kept as running maxima) and over a million passes
(closer to the exact sum than a plain float32 running sum), and the refusals of a parts tuple. What the
parts do on the engine (DASH with the reads part, a missing read law) is in tests/test_protocol.py,
which shares its compilations."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax.serve import engine, parts, totals
from hbfjax.serve.state import BatcherConfig
from hbfjax.validate import ConfigError
from hbfjax.workload import requests as rq

EPS = 2.0**-24  # float32 unit roundoff
BIG = 2.0**24  # float32 spacing 2 from here: BIG + 1 rounds back to BIG (ties to even)


class Toy(NamedTuple):
    """A totals type: two sums and a running maximum."""

    a: jax.Array
    b: jax.Array
    peak: jax.Array

    PEAKS = ("peak",)


def _host(acc: totals.Accumulator) -> tuple[list, list]:
    return np.asarray(acc.sums).tolist(), np.asarray(acc.comp).tolist()


def test_the_accumulator_by_hand():
    """Field b starts at 2^24 and takes two 1s: a plain float32 sum loses both (2^24 + 1 rounds to 2^24),
    Kahan keeps the first as compensation −1 and adds it back with the second (2^24 + 2 is exact);
    field a sums small exact values; the peak is the running maximum and never compensated."""
    add = jax.jit(totals.add)
    acc = totals.zeros(Toy)
    assert _host(acc) == ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    acc = add(acc, Toy(a=0.5, b=BIG, peak=3.0))
    assert _host(acc) == ([0.5, BIG, 3.0], [0.0, 0.0, 0.0])
    # y = 1 − 0 = 1; t = fl(2^24 + 1) = 2^24; comp = (t − s) − y = −1
    acc = add(acc, Toy(a=0.25, b=1.0, peak=1.0))
    assert _host(acc) == ([0.75, BIG, 3.0], [0.0, -1.0, 0.0])
    # y = 1 − (−1) = 2; t = 2^24 + 2 (exact); comp = (t − s) − y = 0
    acc = add(acc, Toy(a=0.25, b=1.0, peak=5.0))
    assert _host(acc) == ([1.0, BIG + 2.0, 5.0], [0.0, 0.0, 0.0])
    assert float(np.float32(np.float32(np.float32(BIG) + 1.0) + 1.0)) == BIG  # the plain sum's loss
    value = totals.value(acc, Toy)
    assert isinstance(value, Toy) and [float(v) for v in value] == [1.0, BIG + 2.0, 5.0]
    # a pass without work adds nothing (masked to zeros: a peak of 0 leaves the maximum)
    acc = add(acc, totals.masked(Toy(a=7.0, b=7.0, peak=9.0), jnp.bool_(False)))
    assert [float(v) for v in totals.value(acc, Toy)] == [1.0, BIG + 2.0, 5.0]
    assert [float(v) for v in totals.zero_record(Toy)] == [0.0, 0.0, 0.0]
    # batched accumulators keep their leading axes in value()
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), acc, totals.zeros(Toy))
    assert totals.value(stacked, Toy).b.shape == (2,)


def test_peaks_must_name_fields_of_the_type():
    class Bad(NamedTuple):
        x: jax.Array

        PEAKS = ("y",)

    with pytest.raises(TypeError, match=r"Bad.PEAKS names fields it lacks: \['y'\]"):
        totals.add(totals.zeros(Bad), Bad(x=1.0))


class One(NamedTuple):
    x: jax.Array


@jax.jit
def _kahan_and_plain(xs):
    """A scan over the terms: the accumulator's sum and a plain float32 running sum."""
    def step(c, x):
        acc, plain = c
        return (totals.add(acc, One(x=x)), plain + x), None

    (acc, plain), _ = jax.lax.scan(step, (totals.zeros(One), jnp.float32(0.0)), xs)
    return totals.value(acc, One).x, plain


def test_a_million_terms_sum_closer_to_the_exact_sum_than_a_plain_float32_sum():
    """10^6 uniform terms in [0, 1) (fixed seed): Kahan's error is at most 2·EPS·Σ|x| + O(n·EPS²)·Σ|x|
    (Goldberg 1991, Thm 8; n·EPS² ≈ 4e-9 here), plus the float32 rounding of the result (EPS/2 of it); a
    running float32 sum's grows with the partial sums (its bound is n·EPS·Σ|x|)."""
    xs = np.random.default_rng(0).random(1_000_000, dtype=np.float32)
    exact = math.fsum(xs.astype(np.float64).tolist())
    kahan, plain = (float(v) for v in _kahan_and_plain(jnp.asarray(xs)))
    n = xs.size
    assert abs(kahan - exact) <= (2 * EPS + n * EPS**2 + EPS / 2) * exact
    assert abs(plain - exact) > 100 * abs(kahan - exact)  # the plain sum is far off (≈ 1e-4 relative)


def _config(parts_, timing_kind="organisation"):
    return engine.ServeConfig(model=GQA, batcher=BatcherConfig(slots=2), requests=rq.RequestsConfig(requests=2),
                              max_pass_tokens=8, parts=parts_, timing_kind=timing_kind)


def test_parts_tuples_are_checked():
    for ok in ((), ("tiers",), ("tiers", "reads"), ("tiers", "sessions", "blocks"), parts.ORDER):
        parts.check_parts(ok)
        assert _config(ok).parts == ok
    with pytest.raises(ConfigError, match=r"unknown part\(s\) \['cache'\]; known: \('tiers'"):
        parts.check_parts(("tiers", "cache"))
    for bad in (("reads", "tiers"), ("tiers", "tiers"), ("tiers", "blocks", "sessions")):
        with pytest.raises(ConfigError, match=r"each part once, in the order \('tiers', 'sessions'"):
            parts.check_parts(bad)
    with pytest.raises(ConfigError, match=r"part 'sram' needs \['reads', 'writes'\]"):
        parts.check_parts(("tiers", "sram"))
    with pytest.raises(ConfigError, match=r"part 'sessions' needs \['tiers'\]"):
        parts.check_parts(("sessions",))
    with pytest.raises(ConfigError,
                       match=r"ServeConfig.parts = \('tiers', 'blocks'\): part 'blocks' needs \['sessions'\]"):
        _config(("tiers", "blocks"))  # the config refuses it too
    with pytest.raises(ConfigError, match="the CPU-offloading timing has no HBF: give no parts"):
        _config(("tiers",), timing_kind="cpu-offload")
    assert parts.in_order(["blocks", "tiers", "sessions", "tiers"]) == ("tiers", "sessions", "blocks")
    assert tuple(parts.MODULES) == parts.ORDER and set(parts.NEEDS) == set(parts.ORDER)
    assert dataclasses.replace(_config(()), timing_kind="cpu-offload").parts == ()
