"""Run every benchmark module and print one table; ``--out FILE`` also writes the rows as JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import platform
import sys

import jax

import hbfjax.bench as bench
from hbfjax.bench import _profile


def machine() -> dict:
    dev = jax.devices()[0]
    return {"platform": dev.platform, "device": getattr(dev, "device_kind", str(dev)),
            "devices": jax.device_count(), "jax": jax.__version__, "host": platform.processor() or platform.machine(),
            "cpus": __import__("os").cpu_count()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hbfjax.bench", description=__doc__)
    parser.add_argument("--only", nargs="*", default=None, help="benchmark modules to run (default: all)")
    parser.add_argument("--skip", nargs="*", default=(), help="benchmark modules not to run")
    parser.add_argument("--scale", type=float, default=None,
                        help="work multiplier (default 1 on a GPU, smaller on a CPU so a run takes minutes)")
    parser.add_argument("--out", default=None, help="write rows and machine facts as JSON to this file")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="also run one call per gc row under the JAX profiler, keep its trace in DIR and "
                             "print the ops that took the most time (microseconds, launches)")
    args = parser.parse_args(argv)
    _profile.LOG_DIR[0] = args.profile
    info = machine()
    scale = args.scale if args.scale is not None else (1.0 if info["platform"] == "gpu" else 0.25)
    print(f"# machine: {info}", flush=True)
    rows = []
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
    for name in names:
        if (args.only and name not in args.only) or name in args.skip:
            continue
        module = importlib.import_module(f"hbfjax.bench.{name}")
        for row in module.run(scale):
            rows.append(row)
            print(f"{row['benchmark']:<40} {row['events_per_s']:>12.3e} {row['unit']}/s  compile {row['compile_s']:.2f} s"
                  f"  run {row['run_s']:.3f} s  reference {row['reference_events_per_s']:.3e}/s"
                  f"  speedup {row['speedup_vs_reference']:.1f}x"
                  + (f"  gap {row['gap']:+.2%} ({row['events']} vs {row['grid_evaluations']} evaluations)"
                     if "gap" in row else ""), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": info, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
