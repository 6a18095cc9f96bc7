"""The tuning core: knob domains, relaxations, the jitted optax loop, its accounting and its zero-gradient report."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _compiles import compilations
from hbfjax.tune import estimators as est
from hbfjax import relax as rx
from hbfjax.tune.grid import evaluate_grid
from hbfjax.tune.loop import default_steps, tune
from hbfjax.tune.problem import Fraction, Knob, Log2Size, Problem, Split, TuneDefaults
from hbfjax.validate import ConfigError

# ---- domains ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain,value", [(Fraction(0.0, 0.5), 0.2), (Fraction(-1.0, 3.0), 2.5),
                                          (Log2Size(1, 256), 32), (Split(3), (0.2, 0.3, 0.5)),
                                          (Split(3, floor=0.1), (0.1, 0.3, 0.6))])
def test_domains_round_trip(domain, value):
    assert np.allclose(np.asarray(domain.decode(jnp.asarray(domain.encode(value)))), value, atol=2e-4)


def test_domains_keep_values_inside():
    u = jnp.linspace(-50.0, 50.0, 11)
    f = Fraction(0.1, 0.4).decode(u)
    assert float(f.min()) >= np.float32(0.1) and float(f.max()) <= np.float32(0.4)  # float32 ends
    g = Log2Size(2, 64).decode(u)
    assert float(g.min()) == 2.0 and float(g.max()) == 64.0
    s = Split(4, floor=0.05).decode(jnp.array([30.0, -30.0, 0.0, 1.0]))
    assert float(s.sum()) == pytest.approx(1.0) and float(s.min()) >= 0.05 - 1e-7


def test_bad_domains_and_problems_are_refused():
    with pytest.raises(ConfigError, match="power of two"):
        Log2Size(3, 64)
    with pytest.raises(ConfigError, match="summing to 1"):
        Split(3).encode((0.5, 0.5, 0.5))
    with pytest.raises(ConfigError, match="unique"):
        Problem("p", (Knob("a", Fraction(), (0, 1)), Knob("a", Fraction(), (0, 1))), lambda v, s, r: 0.0, "",
                TuneDefaults(init={"a": 0.5}), streams=1)
    with pytest.raises(ConfigError, match="starting value"):
        Problem("p", (Knob("a", Fraction(), (0, 1)),), lambda v, s, r: 0.0, "", TuneDefaults(init={}), streams=1)


# ---- relaxations ------------------------------------------------------------------------------------------


def test_relaxations_bound_and_reduce_to_the_exact_operations():
    x = jnp.array([3.0, 1.0, 2.5, -4.0])
    for t in (1.0, 0.1, 0.001):
        sm = float(rx.soft_max(x, t))
        assert 3.0 <= sm <= 3.0 + t * math.log(4) + 1e-6
        assert 0.0 <= float(rx.soft_relu(jnp.float32(-0.5), t)) <= t * math.log(2) + 1e-7
        assert float(rx.soft_min(jnp.float32(1.0), jnp.float32(2.0), t)) <= 1.0 + 1e-6
    assert float(rx.soft_step(jnp.float32(0.5), 1e-3)) == pytest.approx(1.0)
    assert float(rx.soft_step(jnp.float32(-0.5), 1e-3)) == pytest.approx(0.0)
    assert float(rx.ste_round(jnp.float32(2.4))) == 2.0
    assert float(jax.grad(lambda v: rx.ste_round(v) * 3.0)(jnp.float32(2.4))) == 3.0
    assert np.allclose(rx.geometric_schedule(1.0, 0.01, 3), [1.0, 0.1, 0.01])


# ---- the loop on a toy problem ------------------------------------------------------------------------------


def _toy(floor: bool = False) -> Problem:
    """1 + (log2 G − 3.3)² + 10 (f − 0.3)²; with ``floor`` the f term is piecewise constant (a 0.05 staircase)."""

    def objective(values, seed, relax):
        f = values["f"]
        if floor and relax is None:
            f = jnp.floor(f * 20.0) / 20.0
        return 1.0 + (jnp.log2(values["g"]) - 3.3) ** 2 + 10.0 * (f - 0.3) ** 2 + 0.0 * seed.astype(jnp.float32)

    knobs = (Knob("g", Log2Size(1, 64), tuple(2**i for i in range(7))),
             Knob("f", Fraction(0.0, 1.0), tuple(i / 100 for i in range(101))))
    return Problem("toy", knobs, objective, "toy", TuneDefaults(init={"g": 2, "f": 0.7}, learning_rate=0.3), streams=1)


@pytest.fixture(scope="module")
def toy():
    problem = _toy()
    return problem, evaluate_grid(problem, 0)


def test_grid_is_the_cartesian_product_and_finds_the_lattice_optimum(toy):
    problem, grid = toy
    assert grid.evaluations == 7 * 101
    assert grid.best_knobs == {"g": 8, "f": 0.3}
    assert grid.best_objective == pytest.approx(1.09, abs=1e-5)


# spsa is left out: one lattice step in G (a large, real difference) enters its f estimate through the
# shared direction, so on this toy it needs more steps than the budget (its expectation is tested exactly
# in test_tune_estimators, and it meets the target on collide-sram)
@pytest.mark.parametrize("estimator", ["smooth", "fd", "perturb"])
def test_every_estimator_reaches_the_toy_optimum_within_the_budget(toy, estimator):
    problem, grid = toy
    r = tune(problem, estimator=estimator, grid=grid)
    settings = est.EstimatorSettings(estimator, problem.defaults.samples)
    per_step = est.evaluations_per_step(problem, settings)
    assert len(r.trajectory) == default_steps(problem, settings)
    # the steps plus the final check of the one discrete knob's two neighbouring lattice points (one if on a point)
    assert len(r.trajectory) * per_step + 1 <= r.evaluations <= len(r.trajectory) * per_step + 2
    assert r.evaluations <= grid.evaluations / 5
    assert r.knobs["g"] == 8.0 and not r.gradient_zero
    assert r.gap < 0.02, r


def test_evaluations_per_step_and_default_budget():
    problem = _toy()
    per = {n: est.evaluations_per_step(problem, est.EstimatorSettings(n, 4)) for n in est.ESTIMATORS}
    assert per == {"smooth": 2, "perturb": 5, "fd": 5, "spsa": 2, "exact": 1}  # one discrete knob, two raw coordinates
    # a fifth of 707 grid points is 141, less the final check of two lattice points: 139
    assert default_steps(problem, est.EstimatorSettings("fd", 4)) == 139 // 5
    assert default_steps(problem, est.EstimatorSettings("smooth", 4)) == 139 // 2


def test_smooth_interpolates_discrete_knobs_between_lattice_points():
    problem = _toy()
    seed = jnp.uint32(0)
    raw = {"g": jnp.float32(2.25), "f": jnp.float32(0.0)}
    value = float(est.relaxed(problem, seed, raw, jnp.float32(1.0)))
    at = lambda g: float(problem.objective({"g": jnp.float32(g), "f": jnp.float32(0.5)}, seed, None))  # noqa: E731
    assert value == pytest.approx(0.75 * at(4) + 0.25 * at(8), rel=1e-6)
    grad = jax.grad(lambda u: est.relaxed(problem, seed, u, jnp.float32(1.0)))(raw)
    assert float(grad["g"]) == pytest.approx(at(8) - at(4), rel=1e-5)


def test_a_piecewise_constant_objective_is_reported_as_zero_gradient_not_convergence():
    problem = _toy(floor=True)
    r = tune(problem, estimator="exact", steps=5)
    assert r.zero_gradient_knobs == ["f"] and not r.gradient_zero  # g still has a gradient (straight-through)
    frozen = Problem("flat", problem.knobs[1:], lambda v, s, x: jnp.floor(v["f"] * 4.0), "flat",
                     TuneDefaults(init={"f": 0.6}), streams=1)
    r = tune(frozen, estimator="exact", steps=5)
    assert r.gradient_zero and "zero at every step" in r.status
    assert r.knobs["f"] == pytest.approx(0.6, abs=1e-4)  # never moved


def test_changing_knob_values_seed_and_rates_never_recompiles():
    problem = _toy()
    grid = evaluate_grid(problem, 0)
    tune(problem, estimator="smooth", steps=4, grid=grid)
    with compilations("run") as names:
        tune(problem, estimator="smooth", steps=4, grid=grid, seed=3, learning_rate=0.05,
             init={"g": 16, "f": 0.1}, temperature=(2.0, 0.5))
    assert names == []


def test_json_fields_and_trajectory(toy):
    problem, grid = toy
    d = tune(problem, estimator="smooth", steps=3, grid=grid).as_dict()
    for key in ("knobs", "objective", "grid_best_knobs", "grid_best_objective", "gap", "evaluations",
                "grid_evaluations", "trajectory", "gradient_zero"):
        assert key in d
    assert len(d["trajectory"]) == 3 and set(d["trajectory"][0]) == {"knobs", "objective", "raw_gradient"}
    assert d["trajectory"][0]["knobs"] == pytest.approx({"g": 2.0, "f": 0.7}, abs=1e-4)
