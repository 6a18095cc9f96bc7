"""Sweep throughput (issue 14): ``hbfjax sweep serve`` over 3 DASH organisations × 3 arrival rates
(9 points, one compiled program), through the sweep's own runner and table, against the serving
engine's plain-Python reference (``hbfjax.serve.reference.serve``) in the same run.

One event is one stream-iteration with work, summed over the points (``iterations_mean`` × streams).
``compile_s`` is the first sweep's wall time less the second's (a new table, same shapes); ``run_s``
the second's. On an accelerator the 9 points run stacked on one knob axis (``--points-per-call 9``);
on a CPU one at a time (the sweep's default there).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax

from hbfjax import cluster as clusters
from hbfjax.bench._timing import row
from hbfjax.bench.serve import SEED, _reference, _setup
from hbfjax.commands import serve as serve_command
from hbfjax.commands.sweep import target_parser
from hbfjax.sweep import grid, runner
from hbfjax.sweep.table import ResultTable
from hbfjax.workload import models

REQUESTS = 32
SYSTEMS, RATES = ("dash", "relay-only", "direct-only"), ("1", "2", "3")


def _sweep(points, parser, per_call: int, folder: Path, name: str) -> tuple[float, list[dict]]:
    table = ResultTable(folder / name, name).open()
    target = runner.Target("serve", parser, serve_command.compute, serve_command.plan, serve_command.assemble)
    items = runner.work_items(target, points, per_call)
    t0 = time.perf_counter()
    rows = runner.execute(items, clusters.Cluster(0, 1, None), table, runner.Progress(len(points), quiet=True))
    return time.perf_counter() - t0, rows


def run(scale: float) -> list[dict]:
    streams = max(8, int(1024 * scale))
    parser = target_parser("serve")
    fixed = ("--model", "qwen3-235b-a22b", "--requests", str(REQUESTS), "--warmup", "4", "--prompt", "1024",
             "--output", "128", "--streams", str(streams), "--seed", str(SEED))
    axes = [grid.Axis("system", SYSTEMS), grid.Axis("rate", RATES)]
    points = grid.points(parser, fixed, axes)
    per_call = 1 if jax.default_backend() == "cpu" else len(points)
    with tempfile.TemporaryDirectory() as tmp:
        first_s, _ = _sweep(points, parser, per_call, Path(tmp), "first.csv")
        run_s, rows = _sweep(points, parser, per_call, Path(tmp), "second.csv")
    failed = [r["error"] for r in rows if r["status"] != "ok"]
    assert not failed, failed
    events = sum(float(r["iterations_mean"]) * streams for r in rows)
    ref_s, ref_it = _reference(_setup(models.preset("qwen3-235b-a22b"), "poisson", REQUESTS, 2.0, 1024, 128, 100_000))
    return [row(f"sweep serve qwen3 {len(points)} points x {streams} streams", events, "stream-iterations",
                max(first_s - run_s, 0.0), run_s, ref_s, streams=streams, points=len(points),
                points_per_call=per_call, points_per_s=len(points) / run_s, reference_iterations=ref_it)]
