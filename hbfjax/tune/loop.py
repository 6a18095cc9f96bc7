"""The tuning loop: an optax optimiser over raw knob coordinates inside one jitted ``lax.scan`` (DESIGN.md §6).

Every step evaluates the objective on the problem's common random numbers (one seed for the whole run
and for the grid it is checked against), estimates the gradient (``hbfjax.tune.estimators``), takes an
optax step (Adam with a cosine-decayed learning rate by default) and projects the raw coordinates back
into the knobs' domains. Learning rate, temperatures, σ, the FD step, the start and the seed are traced:
changing any of them reuses the compiled loop. After the last step discrete knobs are snapped to the
better of their neighbouring lattice points, the point is evaluated exactly, and the result is compared
with the exhaustive grid.

A gradient that is exactly zero at every step (the exact simulation is piecewise constant in the knobs)
is reported as ``gradient_zero`` with the knobs it concerns, never as convergence.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hbfjax.tune import estimators as est
from hbfjax.tune.grid import GridResult, evaluate_grid, evaluate_points, report, seed_word
from hbfjax.tune.problem import Problem, as_python
from hbfjax.relax import geometric_schedule
from hbfjax.validate import require_int, require_real


def adam(learning_rate: jax.Array, steps: int) -> optax.GradientTransformation:
    """Adam whose step size decays from ``learning_rate`` to a tenth of it by a cosine over ``steps``."""
    return optax.adam(optax.cosine_decay_schedule(learning_rate, max(steps, 1), alpha=0.1), b1=0.5)


@dataclass(frozen=True)
class Trace:
    """Per-step arrays of one run (host NumPy)."""

    raw: dict  # name -> f32[steps, ...] raw coordinates before each step's update
    value: np.ndarray  # f32[steps] the estimator's objective value at that point
    grad: dict  # name -> f32[steps, ...] the estimator's gradient in raw coordinates
    zero: dict  # name -> bool[steps] the knob's gradient was exactly zero


@functools.cache
def _compiled_run(problem: Problem, settings: est.EstimatorSettings, steps: int, optimiser):
    """One jitted loop per (problem, estimator, step count, optimiser factory); everything else traced."""

    def run(raw0, seed, learning_rate, temperatures, sigma, fd_step, key):
        opt = optimiser(learning_rate, steps)

        def step(carry, k):
            raw, state = carry
            ek = est.EstimatorKnobs(temperature=temperatures[k], sigma=sigma, fd_step=fd_step,
                                    key=jax.random.fold_in(key, k))
            value, grad = est.value_and_grad(problem, settings, seed, raw, ek)
            updates, state = opt.update(grad, state, raw)
            new = problem.project(optax.apply_updates(raw, updates))
            zero = jax.tree_util.tree_map(lambda g: jnp.all(g == 0), grad)
            return (new, state), (raw, value, grad, zero)

        (final, _), (raws, values, grads, zeros) = jax.lax.scan(step, (raw0, opt.init(raw0)), jnp.arange(steps))
        return final, raws, values, grads, zeros

    return jax.jit(run)


def lattice_corners(problem: Problem, raw: dict) -> list[dict]:
    """Raw points with each discrete knob at the floor and ceiling of its coordinate (continuous knobs kept)."""
    options = []
    for k in problem.knobs:
        u = np.asarray(raw[k.name], np.float64)
        if k.domain.discrete:
            a, b = k.domain.raw_bounds
            options.append(sorted({float(np.clip(np.floor(u), a, b)), float(np.clip(np.ceil(u), a, b))}))
        else:
            options.append([u])
    return [dict(zip(problem.names, combo)) for combo in itertools.product(*options)]


def final_corners(problem: Problem) -> int:
    """Exact evaluations of the final lattice check: 2 per discrete knob, combined."""
    return 2 ** sum(k.domain.discrete for k in problem.knobs)


def default_steps(problem: Problem, settings: est.EstimatorSettings, budget_fraction: float = 0.2) -> int:
    """Steps that ``settings`` can take within ``budget_fraction`` of the grid's evaluations (at least 1)."""
    budget = int(budget_fraction * len(problem.grid_points())) - final_corners(problem)
    return max(1, budget // est.evaluations_per_step(problem, settings))


@dataclass
class TuneResult:
    """What ``hbfjax tune`` reports (``as_dict`` is the CLI's JSON)."""

    problem: str
    estimator: str
    knobs: dict
    objective: float
    grid_best_knobs: dict
    grid_best_objective: float
    gap: float  # (objective − grid best) / |grid best|: > 0 worse than the grid, < 0 better (off-grid)
    evaluations: int
    grid_evaluations: int
    trajectory: list
    gradient_zero: bool
    zero_gradient_knobs: list
    status: str
    metrics: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _status(gradient_zero: bool, zero_knobs: list, gap: float, evaluations: int, grid_evaluations: int) -> str:
    if gradient_zero:
        return ("gradient identically zero at every step: the objective is piecewise constant in the knobs through "
                "this estimator (choose --estimator smooth, perturb, fd or spsa); the knobs did not move")
    note = f"gap to the grid optimum {gap:+.2%}"
    if zero_knobs:
        note += f"; the gradient in {', '.join(zero_knobs)} was zero at every step (those knobs never moved)"
    if evaluations >= grid_evaluations:
        note += (f"; the exhaustive grid ({grid_evaluations} evaluations) is cheaper than this run ({evaluations}): "
                 "for so small a knob space prefer the grid")
    return note


def tune(problem: Problem, *, estimator: str = "smooth", steps: int | None = None, learning_rate: float | None = None,
         seed: int = 0, init: dict | None = None, temperature: tuple[float, float] | None = None,
         sigma: float | None = None, samples: int | None = None, fd_step: float | None = None, key: int = 0,
         optimiser=adam, grid: GridResult | None = None, metrics: bool = True) -> TuneResult:
    """Minimise ``problem``'s objective with ``estimator`` and check it against the exhaustive grid.

    Unset arguments take the problem's defaults. ``optimiser(learning_rate, steps)`` builds the optax
    transformation (Adam with cosine decay by default). ``grid``: a grid already evaluated at this seed.
    ``metrics``: also compute the problem's report at the tuned point (one more compilation).
    """
    d = problem.defaults
    settings = est.EstimatorSettings(estimator, d.samples if samples is None else samples)
    if steps is None:
        steps = d.steps or default_steps(problem, settings)
    steps = require_int("tune", "steps", steps, 1, 100_000)
    lr = require_real("tune", "learning_rate", d.learning_rate if learning_rate is None else learning_rate, 0.0,
                      lo_open=True)
    t_start, t_end = (d.temperature_start, d.temperature_end) if temperature is None else temperature
    sigma = d.sigma if sigma is None else sigma
    fd_step = d.fd_step if fd_step is None else fd_step
    ek = est.EstimatorKnobs.make(t_end, sigma, fd_step)  # validates the traced settings
    temps = geometric_schedule(t_start, t_end, steps)
    start = {**d.init, **(init or {})}
    raw0 = problem.project(problem.encode(start))
    seed_u32 = seed_word(seed)

    t0 = time.perf_counter()
    run = _compiled_run(problem, settings, steps, optimiser)
    final, raws, values, grads, zeros = run(raw0, seed_u32, jnp.float32(lr), jnp.asarray(temps), ek.sigma, ek.fd_step,
                                     jax.random.key(key))
    jax.block_until_ready(values)
    t_tune = time.perf_counter() - t0

    candidates = lattice_corners(problem, jax.tree_util.tree_map(np.asarray, final))
    decoded = [as_python(problem.decode({n: jnp.asarray(c[n], jnp.float32) for n in problem.names})) for c in candidates]
    scores = evaluate_points(problem, decoded, seed)
    best = int(np.argmin(scores))
    best_value, knobs = float(scores[best]), decoded[best]

    if grid is None:
        grid = evaluate_grid(problem, seed)
    host = lambda tree: jax.tree_util.tree_map(np.asarray, tree)  # noqa: E731
    trace = Trace(raw=host(raws), value=np.asarray(values), grad=host(grads), zero=host(zeros))
    zero_knobs = [n for n in problem.names if bool(np.all(trace.zero[n]))]
    gradient_zero = len(zero_knobs) == len(problem.names)
    gap = (best_value - grid.best_objective) / max(abs(grid.best_objective), 1e-30)
    trajectory = [{"knobs": as_python(problem.decode({n: jnp.asarray(trace.raw[n][i]) for n in problem.names})),
                   "objective": float(trace.value[i]),
                   "raw_gradient": as_python({n: trace.grad[n][i] for n in problem.names})} for i in range(steps)]
    per_step = est.evaluations_per_step(problem, settings)
    evaluations = steps * per_step + len(candidates)
    return TuneResult(
        problem=problem.name, estimator=estimator, knobs=knobs, objective=float(best_value),
        grid_best_knobs=as_python(grid.best_knobs), grid_best_objective=grid.best_objective, gap=float(gap),
        evaluations=evaluations, grid_evaluations=grid.evaluations, trajectory=trajectory,
        gradient_zero=gradient_zero, zero_gradient_knobs=zero_knobs, status=_status(gradient_zero, zero_knobs, gap, evaluations, grid.evaluations),
        metrics=report(problem, knobs, seed) if metrics else {},
        settings={"steps": steps, "learning_rate": lr, "seed": seed, "key": key, "temperature": [t_start, t_end],
                  "sigma": sigma, "samples": settings.samples, "fd_step": fd_step, "init": as_python(start),
                  "evaluations_per_step": per_step, "streams": problem.streams, **problem.extra},
        seconds={"tune_s": t_tune, "grid_s": grid.seconds})
