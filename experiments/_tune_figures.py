"""Shared by the tuning figures: one tidy table per problem with its grid, each estimator's trajectory and result.

Rows have ``kind`` = ``grid`` (one per grid point), ``trajectory`` (one per estimator step) or ``result``
(one per estimator: the tuned point, its exact objective, the gap to the grid optimum and the
evaluations spent). Knob values are columns ``knob_<name>`` (``knob_<name>_<i>`` for a split's shares).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table
from hbfjax.tune import problems
from hbfjax.tune.grid import evaluate_grid
from hbfjax.tune.loop import tune
from hbfjax.tune.problem import Problem

ESTIMATORS = ("smooth", "perturb", "fd")
# tiny: one step of one estimator, perturb (its samples are one vmapped copy of the engine beside the baseline's,
# where fd's 2 · raw coordinates + 1 evaluations are each their own copy: on hbflex-sram 19 s against 40 s to
# compile; the smooth estimator's loop is compiled by the tests), on a grid of each knob's ends and middle
TINY_ESTIMATOR = "perturb"
TINY_GRID_VALUES = 3


def knob_columns(values: dict) -> dict:
    out = {}
    for name, v in values.items():
        if isinstance(v, (list, tuple, np.ndarray)):
            out.update({f"knob_{name}_{i}": float(x) for i, x in enumerate(v)})
        else:
            out[f"knob_{name}"] = float(v)
    return out


def streams_for(ctx: Context, divisor: int = 16, least: int = 4) -> int:
    return 2 if ctx.tiny else max(least, ctx.streams // divisor)


def tiny_grid(problem: Problem, values: int = TINY_GRID_VALUES) -> Problem:
    """``problem`` with each knob's grid cut to ``values`` evenly spaced values, both ends included (the
    grid's code path, one vmapped chunk, not its landscape)."""
    def cut(grid: tuple) -> tuple:
        return tuple(grid[i] for i in sorted(set(np.linspace(0, len(grid) - 1, values).round().astype(int))))

    return dataclasses.replace(problem, knobs=tuple(dataclasses.replace(k, grid=cut(k.grid)) for k in problem.knobs))


def _compute(ctx: Context, name: str, settings: dict, estimators) -> pd.DataFrame:
    problem = problems.make(name, **settings)
    if ctx.tiny:
        problem = tiny_grid(problem)
    grid = evaluate_grid(problem, ctx.seed)
    rows = [{"kind": "grid", **knob_columns(p), "objective": float(v)} for p, v in zip(grid.points, grid.objective)]
    for est in estimators:
        r = tune(problem, estimator=est, seed=ctx.seed, grid=grid, metrics=not ctx.tiny,
                 **({"steps": 1} if ctx.tiny else {}))
        rows += [{"kind": "trajectory", "estimator": est, "step": i, **knob_columns(t["knobs"]),
                  "objective": t["objective"]} for i, t in enumerate(r.trajectory)]
        rows.append({"kind": "result", "estimator": est, **knob_columns(r.knobs), "objective": r.objective,
                     "gap": r.gap, "evaluations": r.evaluations, "grid_evaluations": r.grid_evaluations,
                     "gradient_zero": r.gradient_zero, "tune_s": r.seconds["tune_s"], "grid_s": grid.seconds,
                     **{f"metric_{k}": v for k, v in r.metrics.items()}})
    return pd.DataFrame(rows)


def tune_table(ctx: Context, figure: str, name: str, settings: dict | None = None,
               estimators=ESTIMATORS) -> pd.DataFrame:
    """The problem ``name`` built with ``settings`` (streams included), its grid and one tuning run per estimator."""
    settings = {"streams": streams_for(ctx), **(settings or {})}
    estimators = (TINY_ESTIMATOR,) if ctx.tiny else estimators
    return cached_table(ctx, figure, {"problem": name, "settings": settings, "estimators": list(estimators)},
                        lambda: _compute(ctx, name, settings, estimators))


def result_rows(table: pd.DataFrame, figure: str, describe) -> list[Comparison]:
    """One Comparison per estimator: tuned objective against the grid optimum, with the evaluations of each."""
    grid = table[table.kind == "grid"]
    best = grid.objective.min()
    rows = []
    for _, r in table[table.kind == "result"].iterrows():
        rows.append(Comparison(figure, f"tuned ({r.estimator}) vs grid optimum: objective",
                               "— (no tuning in the paper)",
                               f"{r.objective:.4g} vs {best:.4g} (gap {r.gap:+.2%}; {int(r.evaluations)} vs "
                               f"{int(r.grid_evaluations)} evaluations)", describe(r)))
    return rows
