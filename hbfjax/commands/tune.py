"""``hbfjax tune``: minimise a shipped problem's objective over its policy knobs with optax, checked on a grid."""

from __future__ import annotations

import argparse
import sys

from hbfjax.commands import _choices as names
from hbfjax.commands._common import MAX_STREAMS, emit
from hbfjax.validate import SEED_MAX, number

HELP = """\
Gradient-based tuning of policy knobs (DESIGN.md §6). The optimiser (Adam, cosine-decayed step) works on
raw coordinates mapped into each knob's domain (sigmoid for fractions, exp2 for plane-group sizes,
softmax for splits); every evaluation uses the same random numbers (--seed), and the result is checked
against the exhaustive grid of the problem evaluated on those numbers.

Problems (objective to minimise):
  collide-sram  read waves per attention read + λ · SRAM MB over plane-group size G and offload fraction f
                (λ in waves per MB)
  collide-gc    read-wave amplification + λ · (WAF − 1) over G, with greedy GC
  dash-split    DASH: the Relay share of expert delivery and the HBM writeback threshold, for throughput
  hbflex-sram   HBFlex: the base-die SRAM split between offload, prefetch and KV buffering, for throughput

Estimators: smooth (pathwise through relaxations at a falling temperature; forward mode through
while_loop rollouts), perturb (optax.perturbations, Gaussian), fd (central differences on common random
numbers), spsa (simultaneous perturbation), exact (plain jax.grad of the exact simulation: usually zero,
which is detected and reported as gradient_zero, never as convergence).

Output: knobs, objective, grid_best_knobs, grid_best_objective, gap ((objective − grid best) / |grid
best|), evaluations (simulator evaluations the tuner spent; one = one knob point over all streams),
grid_evaluations, trajectory (knobs and the estimator's objective at each step), gradient_zero, metrics
(the problem's exact metrics at the tuned point, units in the names).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="auto-tune policy knobs with optax, checked against a grid (DESIGN.md §6)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problem", choices=names.TUNE_PROBLEMS, required=True, help="the shipped problem to tune")
    p.add_argument("--lambda", dest="lam", type=number(float, 0.0, 1e9), default=None,
                   help="the problem's penalty weight (collide-sram: waves per MB of SRAM; collide-gc: "
                        "amplification per unit of WAF − 1); default: the problem's")
    p.add_argument("--estimator", choices=names.ESTIMATORS, default="smooth",
                   help="gradient estimator (default smooth)")
    p.add_argument("--steps", type=number(int, 1, 100_000), default=None, help="optimiser steps (default: the problem's)")
    p.add_argument("--learning-rate", type=number(float, 0.0, 100.0, lo_open=True), default=None,
                   help="Adam's initial step in raw units (default: the problem's)")
    p.add_argument("--samples", type=number(int, 1, 4096), default=None,
                   help="perturb: perturbed evaluations per step (default: the problem's)")
    p.add_argument("--sigma", type=number(float, 0.0, 100.0, lo_open=True), default=None,
                   help="perturb: Gaussian scale in raw units (default: the problem's)")
    p.add_argument("--streams", type=number(int, 1, MAX_STREAMS), default=None,
                   help="Monte Carlo streams per evaluation (default: the problem's)")
    p.add_argument("--seed", type=number(int, 0, SEED_MAX), default=0,
                   help="seed of the common random numbers shared by the tuner and the grid (default 0)")
    p.add_argument("--trajectory", action="store_true", help="print the trajectory in the table form as well")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def run(args) -> int:
    emit(compute(args), args.json)
    return 0


def compute(args) -> dict:
    from hbfjax.tune import problems
    from hbfjax.tune.loop import tune

    settings = {"lam": args.lam}
    if args.streams is not None:
        settings["streams"] = args.streams
    problem = problems.make(args.problem, **settings)
    print(f"tune {problem.name}: {problem.objective_label}; grid of {len(problem.grid_points())} points, "
          f"{problem.streams} streams (compiling…)", file=sys.stderr, flush=True)
    result = tune(problem, estimator=args.estimator, steps=args.steps, learning_rate=args.learning_rate, seed=args.seed,
                  samples=args.samples, sigma=args.sigma).as_dict()
    if not (args.json or args.trajectory):
        result.pop("trajectory")
    return result
