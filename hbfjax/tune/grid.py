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
def _chunk_fn(problem: Problem, batch: int):
    """The exact objective at ``batch`` points at once: one compilation for the grid and every single point."""
    return jax.jit(jax.vmap(lambda values, seed: problem.objective(values, seed, None), in_axes=(0, None)))


def evaluate_points(problem: Problem, points: list[dict], seed: int, batch: int = 8) -> np.ndarray:
    """f64[points]: the exact objective at each point, ``batch`` points per call (the last chunk padded)."""
    fn, word = _chunk_fn(problem, batch), seed_word(seed)
    out = []
    for first in range(0, len(points), batch):
        chunk = points[first:first + batch]
        padded = chunk + [chunk[-1]] * (batch - len(chunk))
        out.append(np.asarray(fn(problem.stack(padded), word), np.float64)[:len(chunk)])
    return np.concatenate(out)


@functools.cache
def _report_fn(problem: Problem):
    return jax.jit(problem.report)


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


def evaluate_grid(problem: Problem, seed: int = 0) -> GridResult:
    """The exact objective at every grid point (8 points vmapped per call, one compilation)."""
    points = problem.grid_points()
    t0 = time.perf_counter()
    values = evaluate_points(problem, points, seed)
    return GridResult(points=points, objective=values, best_index=int(np.nanargmin(values)),
                      seconds=time.perf_counter() - t0)


def evaluate(problem: Problem, values: dict, seed: int = 0) -> float:
    """The exact objective at one point (knob units), by the grid's compiled function."""
    return float(evaluate_points(problem, [{n: values[n] for n in problem.names}], seed)[0])


def report(problem: Problem, values: dict, seed: int = 0) -> dict:
    """The problem's exact metrics at one point, as floats (empty without a ``report``)."""
    if problem.report is None:
        return {}
    v = {n: jnp.asarray(values[n], jnp.float32) for n in problem.names}
    return as_python(_report_fn(problem)(v, seed_word(seed)))
