"""Problem ``hbflex-sram`` (hbfjax.tune.problems.hbflex_sram) on a tiny GQA model: the exact objective is the
engine's throughput as ``metrics`` computes it, point by point; the draws do not depend on the split; the
relaxed objective tends to the exact one as the temperature falls; forward-mode derivatives of the relaxed
objective have the sign of a central difference of the exact one where the landscape slopes.

Compilations (the serving engine takes ~10 s each on a CPU): the vmapped exact objective (for every seed),
the engine's run over the same points, and the relaxed objective's ``jax.jvp``; the tune check (slow) adds the grid's,
the loop's and the final evaluation's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax.serve import metrics
from hbfjax.tune.grid import evaluate, evaluate_grid
from hbfjax.tune.loop import tune
from hbfjax.tune.problems import hbflex_sram as hsr
from hbfjax.relax import Relax
from hbfjax.validate import ConfigError

SEED = 3
SETTINGS = dict(model=GQA, slots=8, requests=8, prompt_tokens=1024, output_tokens=128,
                sram_mb=2.46608)  # 0.369 MB to split beside the GC buffer's 2.097 MB erase block (512 pages of 4 KiB)
STREAMS = 2
# the stacked points: a central difference along each direction around CENTRE, and two points apart
CENTRE = np.array([0.2, 0.2, 0.6])
H = 0.05
DIRECTIONS = {"kv_from_offload": np.array([-1.0, 0.0, 1.0]), "kv_from_prefetch": np.array([0.0, -1.0, 1.0])}
FAR = [(0.05, 0.05, 0.9), (0.0, 1.0, 0.0)]


@functools.lru_cache(maxsize=None)
def problem():
    return hsr.make(streams=STREAMS, **SETTINGS)


def points() -> list[np.ndarray]:
    out = [CENTRE]
    for d in DIRECTIONS.values():
        out += [CENTRE + H * d, CENTRE - H * d]
    return out + [np.array(p) for p in FAR]


@functools.lru_cache(maxsize=None)
def _exact_fn():
    p = problem()
    return jax.jit(jax.vmap(lambda v, seed: p.objective(v, seed, None), in_axes=(0, None)))


@functools.lru_cache(maxsize=None)
def exact_values(seed: int = SEED) -> np.ndarray:
    """The exact objective at every point of :func:`points` on ``seed`` (one compilation for every seed)."""
    stack = {hsr.KNOB: jnp.asarray(np.stack(points()), jnp.float32)}
    return np.asarray(_exact_fn()(stack, jnp.uint32(seed)), np.float64)


@functools.lru_cache(maxsize=None)
def engine_runs():
    """The engine's own runs (batch.run of the family's simulate) of every point, the split riding on the knob axis."""
    fam = hsr.family(hsr.Settings(**SETTINGS))
    stacked = [hsr.at_split(fam.points[0], q) for q in points()]
    return hb.run(fam.simulate, STREAMS, SEED, hb.stack_knobs(stacked), fam.config, knob_axis=True,
                  inputs=fam.inputs_for(stacked))


@functools.lru_cache(maxsize=None)
def relaxed():
    p = problem()

    def f(values, tangent, temperature):
        return jax.jvp(lambda v: p.objective({hsr.KNOB: v}, jnp.uint32(SEED), Relax(temperature)), (values,), (tangent,))

    return jax.jit(f)


def test_the_grid_is_the_simplex_and_bad_settings_are_refused():
    grid = problem().knob(hsr.KNOB).grid
    assert len(grid) == 231 and len(set(grid)) == 231  # (20 + 1)(20 + 2) / 2 triples at 0.05
    assert all(abs(sum(q) - 1.0) < 1e-12 and min(q) >= 0 for q in grid)
    with pytest.raises(ConfigError, match="Settings.sram_mb = -1"):
        hsr.make(sram_mb=-1)
    with pytest.raises(ConfigError, match="GC buffer"):
        hsr.make(**{**SETTINGS, "sram_mb": 2.0})
    with pytest.raises(ConfigError, match="lambda"):
        hsr.make(lam=0.5)
    assert not problem().reverse_mode and not problem().minimise


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_the_exact_objective_is_the_engines_throughput_point_by_point():
    o = engine_runs()
    vals = exact_values()
    for k in range(len(points())):
        take = lambda a, k=k: jax.tree_util.tree_map(lambda x: x[:, k], a)  # noqa: E731
        t = metrics.times(take(o.arrival), take(o.first_token), take(o.finish), o.tokens_out[:, k], o.valid[:, k])
        stream = metrics.per_stream(t, metrics.window(SETTINGS["requests"], 0, None))
        # all requests arrive at 0: the measured span is the busy time; float32 sums against the float64
        # clock's span: a relative 1e-5 covers f32 rounding over a few hundred passes
        np.testing.assert_allclose(-vals[k], np.mean(stream["throughput_tokens_per_s"]), rtol=1e-5)


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_the_draws_do_not_depend_on_the_split():
    out = o = engine_runs()
    # the same requests at every point (common random numbers), and the split changes the timing only
    for k in range(1, len(points())):
        np.testing.assert_array_equal(o.tokens_out[:, k], o.tokens_out[:, 0])
        np.testing.assert_array_equal(np.asarray(o.iterations)[:, k], np.asarray(o.iterations)[:, 0])
    # a starved KV buffer forces writebacks and is slower: the landscape slopes (the second FAR point)
    forced = np.asarray(out.parts["writes"].totals.forced_writebacks)
    assert np.all(forced[:, -1] > forced[:, -2])
    vals = exact_values()
    assert vals[-1] > vals[-2]
    # a second seed moves the objective at the centre (the draws matter)
    assert exact_values(SEED + 1)[0] != vals[0]


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
def test_relaxed_tends_to_exact_as_the_temperature_falls():
    f = relaxed()
    exact = exact_values()[0]
    v = jnp.asarray(CENTRE, jnp.float32)
    zero = jnp.zeros(3, jnp.float32)
    gaps = [abs(float(f(v, zero, jnp.float32(t))[0]) - exact) for t in (64.0, 4.0, 1e-2, 1e-4)]
    # the caps' soft_min lies below the exact min by at most t·log 2 pages; the forced indicator is off by
    # at most exp(−|overflow| / t) per layer, and an overflow is a fraction of one layer's new KV (here
    # 8 requests × 64 B = 1/8 page), so t must be well below 1/8 page: at 1e-4 page an overflow of less
    # than ~17 t = 0.002 page is the only one not exact in float32; none occurs on these draws
    assert gaps[-1] <= 1e-5 * abs(exact)
    assert gaps[0] > gaps[-1] and gaps[0] > 1e-3 * abs(exact)  # at 64 pages the relaxation is visible


@pytest.mark.slow  # the tuning problem's landscape: make test-slow (CI's 10-minute make test)
@pytest.mark.parametrize("name", list(DIRECTIONS))
def test_the_relaxed_forward_derivative_has_the_sign_of_a_central_difference(name):
    vals = exact_values()
    k = 1 + 2 * list(DIRECTIONS).index(name)
    fd = (vals[k] - vals[k + 1]) / (2 * H)
    assert abs(fd) > 1e-4 * abs(vals[0]) / H  # the landscape slopes here (else the check means nothing)
    _, tangent = relaxed()(jnp.asarray(CENTRE, jnp.float32), jnp.asarray(DIRECTIONS[name], jnp.float32),
                           jnp.float32(problem().defaults.temperature_end))
    assert float(tangent) != 0.0
    assert np.sign(float(tangent)) == np.sign(fd)


@pytest.mark.slow  # make test-slow; its figure is measured by `make bench` (hbfjax.bench.tune)
@pytest.mark.xfail(strict=True, reason=(
    "since the GC buffer is a real 2 MiB block (2026-12-04; same 0.369 MB to split) the smooth estimator from "
    "the KV-starved start ends +8.9 % from the grid optimum (offload 0.7 / prefetch 0 / KV 0.3), +16 % after 24 "
    "steps, its KV share falling to 0.02-0.03 (a budget of 3-4 pages, below the final temperature of 4 pages); fd "
    "reaches +1.1 %, perturb +3.1 %: the relaxation's bias at budgets under its temperature, to be fixed in the "
    "problem's temperature schedule, not in this test"))
def test_the_default_tune_run_meets_the_grid_within_two_percent_on_a_fifth_of_its_evaluations():
    p = problem()
    grid = evaluate_grid(p, SEED)
    start = {hsr.KNOB: (0.05, 0.9, 0.05)}  # a KV-starved start (the default start is within 2 % on this tiny model)
    start_gap = (evaluate(p, start, SEED) - grid.best_objective) / abs(grid.best_objective)
    assert start_gap > 0.02
    r = tune(p, seed=SEED, grid=grid, init=start)
    assert r.evaluations <= grid.evaluations / 5
    assert r.gap <= 0.02, r.status
    assert not r.gradient_zero
