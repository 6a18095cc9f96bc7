"""The prepared device session (issue 14, "The GPU figures"): every measurement BENCHMARKS.md asks of an
accelerator, as subprocesses with time limits, each one's output kept under ``--out``, and a summary
at the end (``summary.json`` and a short table on stdout, short enough for a tool's output tail).

Steps (``--steps``, in this order; a device command may run at most 600 s, so run it as two calls):

* ``bench``: ``python -m hbfjax.bench --scale 1`` (every row: placements, GC host writes, writeback,
  serving, the sweep row, tuning; the closed-loop rows are the ``closed`` step), rows in ``bench.json``;
* ``table3``: DASH Table III as the figure module runs it, 1,000 streams per point (goal < 60 s);
* ``sweep``: the README's Table III sweep through ``hbfjax sweep`` at 1,000 streams, 9 points stacked
  on one knob axis;
* ``fig15``: HBFlex's Fig. 15 grid (6 organisations × 4 models × 3 traces) at 256 streams;
* ``profile``: the H200 operator table of Qwen3-235B (``hbfjax profile``);
* ``fig16``: HBFlex's Fig. 16 in its closed loop (16 … 1,024 tasks per GPU, two models, four
  organisations) at 64 streams a point (the CPU default runs 4);
* ``fig15c``: Fig. 15 at the operating point (``hbflex15_closed``: SWE-bench from Fig. 16's table, which it
  computes too unless ``fig16`` ran into the same ``--out``; Mooncake conversations at 16, 64 and 256 tasks)
  at 64 streams a point;
* ``table2``: HBFlex's Table 2 and Fig. 19 in serving at the paper's operating point (1,024 SWE-bench
  tasks per GPU in a closed loop, the real KV room, six stages incl. naive-block, three models) at 64
  streams a point (the CPU default runs the same size at 4 streams);
* ``closed``: the closed-loop slot rows alone (``hbfjax.bench --only serve_closed``: 64, 256 and 1,024
  slots, the batcher and the whole HBFlex engine).

    PYTHONPATH=. python3 -m hbfjax.bench._device_session --out $OUT --steps bench
    PYTHONPATH=. python3 -m hbfjax.bench._device_session --out $OUT --steps table3,sweep,fig15,profile
    PYTHONPATH=. python3 -m hbfjax.bench._device_session --out $OUT --steps fig16
    PYTHONPATH=. python3 -m hbfjax.bench._device_session --out $OUT --steps table2
    PYTHONPATH=. python3 -m hbfjax.bench._device_session --out $OUT --steps fig15c
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TABLE3 = ["--model", "qwen3-235b-a22b", "--routing", "balanced", "--prompt", "4096", "--output", "128", "--slots", "32",
          "--requests", "1152", "--warmup", "128", "--vary", "system=dash,relay-only,direct-only",
          "--vary", "load=0.5,0.75,0.9"]


def steps(out: Path) -> dict[str, tuple[list[str], int]]:
    """name -> (argv after ``python -m``, time limit in s)."""
    py = [sys.executable, "-m"]
    return {
        "bench": (py + ["hbfjax.bench", "--scale", "1.0", "--skip", "serve_closed", "--out", str(out / "bench.json")],
                  540),
        "table3": (py + ["experiments", "--only", "dash_table3_p90", "--streams", "1000", "--force", "--out",
                         str(out / "figs")], 150),
        "sweep": (py + ["hbfjax", "sweep", "serve", *TABLE3, "--streams", "1000", "--points-per-call", "9",
                        "--out", str(out / "table3_sweep.csv"), "--json"], 150),
        "fig15": (py + ["experiments", "--only", "hbflex15_latency", "--streams", "256", "--force", "--out",
                        str(out / "figs")], 180),
        "profile": (py + ["hbfjax", "profile", "--model", "qwen3-235b-a22b", "--out", str(out / "h200_qwen3.csv")], 120),
        "fig16": (py + ["experiments", "--only", "hbflex16_concurrency", "--streams", "64", "--force", "--out",
                        str(out / "figs")], 540),
        "fig15c": (py + ["experiments", "--only", "hbflex15_closed", "--streams", "64", "--out", str(out / "figs")],
                   540),
        "table2": (py + ["experiments", "--only", "hbflex_table2_ablation", "--streams", "64", "--force", "--out",
                         str(out / "figs")], 540),
        "closed": (py + ["hbfjax.bench", "--only", "serve_closed", "--scale", "1.0", "--out",
                         str(out / "bench_closed.json")], 300),
    }


def run_step(name: str, argv: list[str], limit_s: int, out: Path) -> dict:
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"step": name, "rc": rc, "wall_s": round(time.perf_counter() - t0, 1), "limit_s": limit_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hbfjax.bench._device_session", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for every step's log and results")
    parser.add_argument("--steps", default="bench,table3,sweep,fig15,profile", help="comma-separated steps")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = steps(out)
    chosen = [s for s in args.steps.split(",") if s]
    unknown = [s for s in chosen if s not in table]
    if unknown:
        parser.error(f"--steps: unknown {unknown}; choose from {', '.join(table)}")
    done = []
    for name in chosen:
        done.append(run_step(name, *table[name], out))
        print(json.dumps(done[-1]), flush=True)
    summary = {"steps": done}
    if (out / "bench.json").exists():
        rows = json.loads((out / "bench.json").read_text())
        summary["machine"] = rows["machine"]
        summary["bench"] = [{k: r[k] for k in ("benchmark", "events_per_s", "unit", "compile_s", "run_s",
                                               "speedup_vs_reference")} for r in rows["rows"]]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for r in summary.get("bench", []):
        print(f"{r['benchmark'][:46]:<46} {r['events_per_s']:.3e} {r['unit']}/s compile {r['compile_s']:.1f} s "
              f"run {r['run_s']:.2f} s x{r['speedup_vs_reference']:.0f}")
    return 0 if all(d["rc"] == 0 for d in done) else 1


if __name__ == "__main__":
    sys.exit(main())
