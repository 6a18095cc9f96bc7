"""Tuning against exhaustive search: each shipped problem at its default size, the default (smooth) run
against the grid on the same random numbers.

Per problem: the tuner's simulator evaluations and steady run time (the loop compiled once, timed on a
second call), the grid's, the gap between the tuned and the grid-best objective. The "reference" is the
exhaustive grid doing the same job, so ``speedup_vs_reference`` is grid time over tuning time (compile
times apart); ``gap`` and ``evaluations / grid_evaluations`` say what the speed bought.
"""

from __future__ import annotations

import time

from hbfjax.bench._timing import row
from hbfjax.tune import problems
from hbfjax.tune.grid import evaluate_grid
from hbfjax.tune.loop import tune

SEED = 0
STREAMS = {"collide-sram": 16, "collide-gc": 8, "dash-split": 1, "hbflex-sram": 2}  # the problems' own or 16


def _one(name: str, streams: int) -> dict:
    problem = problems.make(name, streams=streams)
    t0 = time.perf_counter()
    evaluate_grid(problem, SEED)
    grid_first = time.perf_counter() - t0
    grid = evaluate_grid(problem, SEED + 1)  # warm: a new seed reuses the compiled objective
    cold = tune(problem, seed=SEED + 1, grid=grid)
    warm = tune(problem, seed=SEED + 1, grid=grid)
    tune_s = warm.seconds["tune_s"]
    return row(f"tune {name} smooth {streams} streams", warm.evaluations, "evaluations",
               max(cold.seconds["tune_s"] - tune_s, 0.0) + max(grid_first - grid.seconds, 0.0), tune_s,
               grid.seconds / warm.evaluations, gap=warm.gap, grid_evaluations=grid.evaluations,
               objective=warm.objective, grid_best_objective=warm.grid_best_objective, knobs=warm.knobs,
               grid_best_knobs=warm.grid_best_knobs, grid_s=grid.seconds, gradient_zero=warm.gradient_zero)


def run(scale: float) -> list[dict]:
    factor = max(scale, 0.0625)
    return [_one(name, max(1, int(round(s * factor * 4)))) for name, s in STREAMS.items()]
