"""The exhaustive check of a tuned result: the exact objective at every grid point, on the same random numbers (DESIGN.md §6)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.tune.problem import Problem, as_python
from hbfjax.validate import SEED_MAX, require_int


def seed_word(seed: int) -> jax.Array:
    """The uint32 seed word every evaluation of a tuning run shares (common random numbers)."""
    return rng.seed_word(require_int("tune", "seed", seed, 0, SEED_MAX))


@functools.cache
def _grid_fn(problem: Problem, batch: int):
    def one(values, seed):
        return problem.objective(values, seed, None)
    return jax.jit(lambda stacked, seed: jax.lax.map(lambda v: one(v, seed), stacked, batch_size=batch))


@functools.cache
def _report_fn(problem: Problem):
    return jax.jit(problem.report)


@functools.cache
def _objective_fn(problem: Problem):
    return jax.jit(lambda values, seed: problem.objective(values, seed, None))


@dataclass(frozen=True)
class GridResult:
    points: list  # knob values of each grid point (dicts, knob units)
    objective: np.ndarray  # f64[points] exact objective at each point
    best_index: int
    seconds: float  # wall time of the whole grid, compile included

    @property
    def best_knobs(self) -> dict:
        return self.points[self.best_index]

    @property
    def best_objective(self) -> float:
        return float(self.objective[self.best_index])

    @property
    def evaluations(self) -> int:
        return len(self.points)


def evaluate_grid(problem: Problem, seed: int = 0, *, batch: int = 8) -> GridResult:
    """The exact objective at every grid point in one compiled call (``batch`` points vmapped at a time)."""
    points = problem.grid_points()
    t0 = time.perf_counter()
    values = np.asarray(_grid_fn(problem, min(batch, len(points)))(problem.stack(points), seed_word(seed)), np.float64)
    return GridResult(points=points, objective=values, best_index=int(np.nanargmin(values)),
                      seconds=time.perf_counter() - t0)


def evaluate(problem: Problem, values: dict, seed: int = 0) -> float:
    """The exact objective at one point (knob units)."""
    v = {n: jnp.asarray(values[n], jnp.float32) for n in problem.names}
    return float(_objective_fn(problem)(v, seed_word(seed)))


def report(problem: Problem, values: dict, seed: int = 0) -> dict:
    """The problem's exact metrics at one point, as floats (empty without a ``report``)."""
    if problem.report is None:
        return {}
    v = {n: jnp.asarray(values[n], jnp.float32) for n in problem.names}
    return as_python(_report_fn(problem)(v, seed_word(seed)))
