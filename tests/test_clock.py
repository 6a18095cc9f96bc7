"""The two-part clock: exact to 1 µs over 2 hours in float32 arithmetic (DESIGN.md §3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax import clock as C
from hbfjax.validate import ConfigError

TWO_HOURS_US = 7200 * C.US_PER_S


def _as_int_us(c) -> np.ndarray:
    return np.asarray(c.s, np.int64) * C.US_PER_S + np.asarray(c.us).astype(np.int64)


@jax.jit
def _run(dt_us):
    def step(c, dt):
        c = C.advance(c, dt)
        return c, c
    return jax.lax.scan(step, C.zeros(), dt_us)[1]


def test_two_hours_of_whole_microsecond_advances_stay_exact():
    gen = np.random.default_rng(0)
    # 200,000 advances of 0 .. 72,000 µs (mean 36 ms) span 2 h; plus steps that land exactly on and one
    # µs either side of second boundaries
    dt = gen.integers(0, 72_001, 200_000)
    dt[::97] = C.US_PER_S  # whole seconds
    dt[1::89] = 999_999
    dt[2::83] = 1
    expected = np.cumsum(dt)
    assert expected[-1] > TWO_HOURS_US
    got = _run(jnp.asarray(dt, jnp.float32))
    assert np.array_equal(_as_int_us(got), expected)
    us = np.asarray(got.us)
    assert us.min() >= 0 and us.max() < C.US_PER_S and np.all(us == np.floor(us))


def test_a_single_float32_microsecond_count_would_not_be_exact():
    """The reason for two parts: the same advances summed in one float32 drift by many µs."""
    gen = np.random.default_rng(0)
    dt = gen.integers(0, 72_001, 200_000)
    flat = np.cumsum(dt.astype(np.float32), dtype=np.float32)
    assert np.abs(flat.astype(np.int64) - np.cumsum(dt)).max() > 100


def test_sixteenths_of_a_microsecond_are_exact_and_other_fractions_round_by_at_most_a_16th():
    sixteenths = np.random.default_rng(1).integers(0, 2**20, 50_000)  # 0 .. 65,536 µs in 1/16 µs
    got = _run(jnp.asarray(sixteenths / 16.0, jnp.float32))
    exact = np.cumsum(sixteenths)  # in 1/16 µs
    as_16ths = np.asarray(got.s, np.int64) * 16 * C.US_PER_S + (np.asarray(got.us, np.float64) * 16).astype(np.int64)
    assert np.array_equal(as_16ths, exact)
    dt = np.random.default_rng(4).uniform(0, 3e6, 10_000).astype(np.float32)  # fractional, across seconds
    t = C.to_us(_run(jnp.asarray(dt)))
    step_error = np.abs(np.diff(t) - dt[1:].astype(np.float64))  # each advance on its own
    assert step_error.max() <= 1 / 16 and np.abs(t[0] - dt[0]) <= 1 / 16


def test_long_advances_and_negative_steps_carry_whole_seconds():
    c = C.advance(C.from_us(999_999), 1.0)
    assert (int(c.s), float(c.us)) == (1, 0.0)
    c = C.advance(C.from_us(5 * C.US_PER_S), -1.0)  # back one µs over a second boundary
    assert (int(c.s), float(c.us)) == (4, 999_999.0)
    big = float(np.float32(3.5e9))  # 58 minutes in one float32 step (exact as a float32 value)
    c = C.advance(C.from_us(123), big)
    assert _as_int_us(c) == 123 + int(big)
    assert (int(C.advance(C.zeros(), 2**24 - 1).s), float(C.advance(C.zeros(), 2**24 - 1).us)) == (16, 777_215.0)


def test_from_seconds_rounds_to_whole_microseconds_and_to_seconds_inverts_it():
    x = np.array([0.0, 0.4999994, 0.4999996, 7199.9999996, 1.25e-7, 3600.0000015])
    c = C.from_seconds(x)
    assert list(_as_int_us(c)) == [0, 499_999, 500_000, 7_200_000_000, 0, 3_600_000_002]
    assert np.array_equal(C.to_seconds(c), np.rint(x * 1e6) / 1e6)
    assert np.array_equal(C.to_us(C.from_us(np.array([7_199_999_999]))), [7_199_999_999.0])
    for bad in (float("nan"), float("inf"), 2.0**31):
        with pytest.raises(ConfigError, match="clock = "):
            C.from_seconds(bad)


def test_differences_are_exact_below_two_to_the_24_microseconds():
    a = C.from_us(np.array([7_200_000_000, 7_200_000_000, 7_200_000_000]))
    b = C.from_us(np.array([7_200_000_000 - 16_777_215, 7_199_999_999, 3]))
    d = np.asarray(C.diff_us(a, b), np.float64)
    assert d[0] == 16_777_215 and d[1] == 1.0
    assert abs(d[2] - (7_200_000_000 - 3)) <= 7.2e9 * 2**-24  # rounded to float32 beyond 16.8 s
    s = C.sub(a, b)
    assert list(_as_int_us(s)) == [16_777_215, 1, 7_199_999_997]
    assert list(_as_int_us(C.add(b, s))) == [7_200_000_000] * 3


def test_comparisons_and_searchsorted_count_arrivals_at_or_before_now():
    stamps = np.array([0, 5, 999_999, 1_000_000, 1_000_000, 7_199_000_000, 7_200_000_000])
    arr = C.from_us(stamps)
    nows = np.array([-1, 0, 4, 5, 999_999, 1_000_000, 1_000_001, 7_199_999_999, 7_200_000_000, 9_000_000_000])
    right = jax.vmap(lambda n: C.searchsorted(arr, n))(C.from_us(nows))
    left = jax.vmap(lambda n: C.searchsorted(arr, n, side="left"))(C.from_us(nows))
    assert np.array_equal(right, np.searchsorted(stamps, nows, side="right"))
    assert np.array_equal(left, np.searchsorted(stamps, nows, side="left"))
    assert bool(C.less(C.from_us(999_999), C.from_us(1_000_000))) and not bool(C.less(C.take(arr, 0), C.take(arr, 0)))
    assert bool(C.less_equal(C.from_us(7), C.from_us(7)))
    padded = C.where(jnp.arange(7) < 5, arr, C.never(7))  # padding arrivals are never counted
    assert int(C.searchsorted(padded, C.from_us(9_000_000_000))) == 5
    with pytest.raises(ConfigError, match="side"):
        C.searchsorted(arr, C.zeros(), side="middle")


def test_cumsum_of_whole_microsecond_steps_is_exact_past_two_hours():
    steps = np.random.default_rng(2).integers(0, 20_000_000, 1_000)  # up to 20 s each: 2.8 h in all
    got = jax.jit(C.cumsum)(C.from_us(steps))
    assert np.array_equal(_as_int_us(got), np.cumsum(steps))


def test_vmap_and_jit_agree_with_a_loop():
    gen = np.random.default_rng(3)
    starts = C.from_us(gen.integers(0, TWO_HOURS_US, 64))
    dts = jnp.asarray(gen.integers(0, 3 * C.US_PER_S, 64), jnp.float32)
    batched = jax.jit(jax.vmap(C.advance))(starts, dts)
    for i in range(64):
        one = C.advance(C.Clock(starts.s[i], starts.us[i]), dts[i])
        assert (int(one.s), float(one.us)) == (int(batched.s[i]), float(batched.us[i]))
