"""The ``dash-split`` tuning problem (issue 13 problem 3): its exact objective is the serving engine's
throughput, its relaxation tends to it within the stated bias, common random numbers, vmap, and the
forward-mode gradient against finite differences of the exact landscape.

Small run (one stream, 8 requests of 64 → 32 tokens on Qwen3-235B, many experts so the split is
nearly continuous): exact values come from the grid the tuner is checked against
(``evaluate_grid``) and from one-point evaluations, every relaxed value and derivative from one
vmapped ``jax.jvp`` call."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax import rng
from hbfjax.memory import organisations as orgs
from hbfjax.serve import metrics, report
from hbfjax.sweep import families
from hbfjax.tune import grid as tune_grid
from hbfjax.tune import loop
from hbfjax.tune.problems import dash_split
from hbfjax.relax import Relax
from hbfjax.validate import ConfigError
from hbfjax.workload import models

SETTINGS = dict(streams=1, model="qwen3-235b-a22b", batch=8, prompt=64, output=32)
SEED = 3
PROBLEM = dash_split.make(**SETTINGS)
MODEL = models.preset(PROBLEM.extra["model"])
PEAK_GB = PROBLEM.extra["peak_decode_kv_gb"]
MID_GB = PROBLEM.knob("hbm_kv_budget_gb").grid[2]
SLOPE_AT, FD_H = 0.3, 0.05  # the landscape slopes there (Direct-bound); central difference half-width
# extra exact points after the grid: a central difference, and budgets at and above the peak decode KV
EXTRA = [(SLOPE_AT + FD_H, MID_GB), (SLOPE_AT - FD_H, MID_GB), (SLOPE_AT, MID_GB), (SLOPE_AT, PEAK_GB),
         (SLOPE_AT, 1.5 * PEAK_GB), (0.5, MID_GB)]
TEMPERATURES_US = (20.0, 2.0, 0.2)


def _point(f, gb):
    return {"relay_fraction": f, "hbm_kv_budget_gb": gb}


@pytest.fixture(scope="module")
def grid_result():
    """The exhaustive grid as ``hbfjax tune`` checks against it (one compiled call, shared with the tune test)."""
    return tune_grid.evaluate_grid(PROBLEM, SEED)


@pytest.fixture(scope="module")
def exact(grid_result):
    """Exact objective at every grid point (``evaluate_grid``) and at EXTRA, by the same compiled function
    (8 points vmapped per call) that the tuner's final evaluation uses."""
    grid = grid_result.objective.reshape(len(PROBLEM.knobs[0].grid), len(PROBLEM.knobs[1].grid))
    return grid, tune_grid.evaluate_points(PROBLEM, [_point(f, gb) for f, gb in EXTRA], SEED)


@pytest.fixture(scope="module")
def relaxed():
    """(value, d/d relay_fraction, d/d budget) of the relaxed objective at (SLOPE_AT, MID_GB) for each
    temperature, and at 0.5 (the plateau) for the last."""
    seed = rng.seed_word(SEED)

    def jvp(t, f, gb, df, dgb):
        relax = Relax(t)
        return jax.jvp(lambda a, b: PROBLEM.objective(_point(a, b), seed, relax), (f, gb), (df, dgb))

    rows = [(t, SLOPE_AT, MID_GB, 1.0, 0.0) for t in TEMPERATURES_US] + [
        (TEMPERATURES_US[-1], SLOPE_AT, MID_GB, 0.0, 1.0), (TEMPERATURES_US[-1], 0.5, MID_GB, 1.0, 0.0)]
    cols = [jnp.asarray(c, jnp.float32) for c in zip(*rows)]
    value, deriv = jax.jit(jax.vmap(jvp))(*cols)
    return np.asarray(value), np.asarray(deriv)


@pytest.fixture(scope="module")
def engine():
    """The engine run the front door's way (the named system ``dash`` through ``systems``, its knob points by
    ``dataclasses.replace``, ``sweep.families.run_outputs``, ``metrics.summary``): fixed splits at
    (SLOPE_AT, MID_GB) and (0.5, MID_GB), then the balanced split at MID_GB; per point (throughput, busy µs,
    iterations)."""
    fam = dash_split.family(SETTINGS["model"], SETTINGS["batch"], SETTINGS["prompt"], SETTINGS["output"])
    points = [(0.0, SLOPE_AT), (0.0, 0.5), (1.0, 0.5)]  # (balanced_split, relay_fraction)
    base = fam.points[0]
    knobs = [dataclasses.replace(base, org=orgs.dash(balanced_split=b, relay_fraction=f),
                                 hbm_kv_budget_bytes=jnp.float32(MID_GB * 1e9)) for b, f in points]
    outs = families.run_outputs(fam.with_points(knobs, ("fixed", "plateau", "balanced")), SETTINGS["streams"], SEED)
    rows = []
    for o in outs:
        s = metrics.summary(report.request_times(o))
        rows.append((s["throughput_tokens_per_s"], float(o.totals.busy_us[0]), int(o.iterations[0])))
    return rows


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_exact_objective_is_minus_the_engines_throughput(exact, engine):
    _, extra = exact
    assert -extra[2] == pytest.approx(engine[0][0], rel=2e-6)
    assert -extra[5] == pytest.approx(engine[1][0], rel=2e-6)


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_balanced_split_is_at_least_every_fixed_split(exact, engine):
    """balanced_split = 1 minimises every layer's max(T_Direct, T_Relay) over whole experts, and the
    fixed batch's schedule does not depend on times, so no fixed split serves faster."""
    grid, _ = exact
    balanced = engine[2]
    column = list(PROBLEM.knob("hbm_kv_budget_gb").grid).index(MID_GB)
    assert balanced[0] >= -grid[:, column].min() * (1 - 2e-6)
    assert balanced[0] == pytest.approx(-grid[:, column].min(), rel=5e-3)  # the grid's best split is as good


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_landscape_has_an_interior_optimum_in_the_split(exact):
    """All-Direct and all-Relay each leave one path idle: the best split is inside, near the middle."""
    grid, _ = exact
    relay = np.array(PROBLEM.knob("relay_fraction").grid)
    best = relay[np.unravel_index(np.argmin(grid), grid.shape)[0]]
    assert 0.3 < best < 0.7
    assert grid.min() < 0.8 * min(grid[0].min(), grid[-1].min())  # at least 25 % above either end


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_common_random_numbers_budget_above_peak_decode_kv_changes_nothing(exact):
    """A budget at or above the batch's peak decode KV never writes back: bit-identical objectives."""
    _, extra = exact
    assert extra[3] == extra[4]


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_vmap_equals_point_by_point(exact):
    """The grid's vmapped value at (SLOPE_AT, MID_GB) equals the objective called on that point alone."""
    grid, _ = exact
    relay = list(PROBLEM.knob("relay_fraction").grid)
    column = list(PROBLEM.knob("hbm_kv_budget_gb").grid).index(MID_GB)
    one = jax.jit(lambda v: PROBLEM.objective(v, rng.seed_word(SEED), None))
    got = float(one({"relay_fraction": jnp.float32(SLOPE_AT), "hbm_kv_budget_gb": jnp.float32(MID_GB)}))
    assert got == pytest.approx(grid[relay.index(SLOPE_AT), column], rel=1e-6)


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_relaxed_tends_to_exact_within_the_stated_bias(exact, relaxed, engine):
    """0 <= relaxed − exact <= throughput × δ / busy with δ = 2·t·log 2 per MoE layer and pass (module
    docstring), and the gap shrinks with the temperature."""
    _, extra = exact
    value, _ = relaxed
    thr, busy_us, iterations = engine[0]
    moe = sum(k == "moe" for k in MODEL.layer_kinds)
    gaps = value[:len(TEMPERATURES_US)] - extra[2]
    for t, gap in zip(TEMPERATURES_US, gaps):
        bound = thr * 2 * t * math.log(2) * moe * iterations / busy_us
        assert -1e-6 * thr <= gap <= bound
    assert gaps[0] > 0 and gaps[0] >= gaps[1] >= gaps[2]
    assert abs(gaps[2]) <= 1e-6 * thr  # at 0.2 µs the soft maxima are the maxima to float32


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_relaxed_derivative_matches_a_central_difference_of_the_exact_objective(exact, relaxed):
    _, extra = exact
    _, deriv = relaxed
    fd = (extra[0] - extra[1]) / (2 * FD_H)
    assert fd < 0  # more Relay helps where Direct is the slow path
    for d in deriv[:len(TEMPERATURES_US)]:
        assert d == pytest.approx(fd, rel=0.1)
    assert abs(deriv[-1]) < 0.05 * abs(fd)  # on the plateau the slope is (almost) flat
    # the budget's straight-through derivative: non-zero with the sign of the exact landscape's slope (its
    # size is not pinned: in this small run the budgets span only a few page-wave writeback units)
    fd_budget = budget_fd(exact)
    assert fd_budget < 0 and deriv[len(TEMPERATURES_US)] < 0


def test_relaxed_expert_delivery_bias_and_straight_through_slope():
    """Per layer, without a serving run: relaxed − exact delivery in [0, 2·t·log 2] µs for any split, and
    where Direct is the slow path and above the array floor, d T / d relay_fraction is the envelope's
    −n · b / D (straight-through rounding of the expert count). Jitted (eagerly, some 170 primitives
    compiled one by one)."""
    from hbfjax.memory import delivery
    b, n = 37.7e6, 100.0
    fractions = jnp.linspace(0.0, 1.0, 41)
    for t in (30.0, 1.0):
        def at(f, t=t):
            org = dataclasses.replace(orgs.dash(balanced_split=0.0), relay_fraction=f)
            return (delivery.expert_delivery(jnp.float32(n), b, org, temperature_us=t).delivery_us,
                    delivery.expert_delivery(jnp.float32(n), b, org).delivery_us)
        relaxed_us, exact_us = (np.asarray(a) for a in jax.jit(jax.vmap(at))(fractions))
        assert np.all(relaxed_us >= exact_us - 1e-3) and np.all(relaxed_us - exact_us <= 2 * t * math.log(2) + 1e-3)
    org = orgs.dash(balanced_split=0.0)
    rate = delivery.rates(org)
    slope = jax.jit(lambda f0: jax.jvp(lambda f: delivery.expert_delivery(
        jnp.float32(n), b, dataclasses.replace(org, relay_fraction=f), temperature_us=0.01).delivery_us,
        (f0,), (jnp.float32(1.0),))[1])(jnp.float32(0.2))
    assert float(slope) == pytest.approx(-n * b * 1e-3 / float(rate.direct_gbps), rel=1e-4)
    exact_slope = jax.jit(lambda f0: jax.jvp(lambda f: delivery.expert_delivery(
        jnp.float32(n), b, dataclasses.replace(org, relay_fraction=f)).delivery_us, (f0,),
        (jnp.float32(1.0),))[1])(jnp.float32(0.2))
    assert float(exact_slope) == 0.0  # the exact split rounds: piecewise constant, zero pathwise derivative


def budget_fd(exact):
    grid, _ = exact
    i = list(PROBLEM.knob("relay_fraction").grid).index(SLOPE_AT)
    gbs = PROBLEM.knob("hbm_kv_budget_gb").grid
    return (grid[i, 3] - grid[i, 1]) / (gbs[3] - gbs[1])


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="lam"):
        dash_split.make(lam=1.0)
    with pytest.raises(ConfigError, match="batch"):
        dash_split.make(batch=0)
    with pytest.raises(ConfigError, match="model"):
        dash_split.make(model="no-such-model")


@pytest.mark.slow  # make test-slow; its figure is measured by `make bench` (hbfjax.bench.tune)
def test_default_tune_run_reaches_the_grid_optimum_within_2_percent_using_a_fifth_of_its_evaluations(grid_result):
    result = loop.tune(PROBLEM, estimator="smooth", seed=SEED, grid=grid_result)
    assert result.evaluations <= result.grid_evaluations / 5
    assert result.gap <= 0.02
    assert not result.gradient_zero and not result.zero_gradient_knobs
