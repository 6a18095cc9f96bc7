"""Building the parser imports no JAX: ``hbfjax --help``, ``hbfjax <subcommand> --help`` and a refused
option answer at once (each command module imports the simulator only inside the functions that run).
The wall time of ``python -m hbfjax --help`` is printed, not asserted (timings are in BENCHMARKS.md)."""

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# in one child: build the parser, print every --help and refuse a few options, then report what loaded
CHILD = r"""
import argparse, contextlib, io, json, sys
from hbfjax.cli import build_parser, main

parser = build_parser()
(sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
lines = [[]] + [[name] for name in sub.choices]
lines += [[name, action] for name, p in sub.choices.items() for a in p._actions
          if isinstance(a, argparse._SubParsersAction) for action in a.choices]
lines += [["sweep", target] for target in ("collide", "gc", "serve", "tune", "writeback")]
for argv in lines:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main([*argv, "--help"])  # hbfjax sweep TARGET --help returns; argparse's --help exits
        except SystemExit as stop:
            code = stop.code
    assert code == 0, (argv, code)
    assert "usage: hbfjax" in out.getvalue(), argv
refused = (["serve", "--system", "nope"], ["collide", "--planes", "-1"], ["gc", "--victim", "oldest"],
           ["writeback", "--layers", "0"], ["tune", "--problem", "nope"], ["profile", "--model", "nope", "--out", "x"],
           ["sweep", "nope"], ["nope"])
for argv in refused:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(argv) == 2, argv
    assert "error:" in err.getvalue(), argv
print(json.dumps({"helps": len(lines), "refused": len(refused), "jax": "jax" in sys.modules,
                  "hbfjax": sorted(m for m in sys.modules if m.startswith("hbfjax"))}))
"""


def test_help_and_refused_options_import_no_jax():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)
    assert child["helps"] >= 12 and child["refused"] == 8
    assert not child["jax"], f"building the parser imported JAX; hbfjax modules loaded: {child['hbfjax']}"


def test_help_wall_time_is_printed():
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hbfjax", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    wall = time.perf_counter() - t0
    assert done.returncode == 0 and "usage: hbfjax" in done.stdout
    print(f"python -m hbfjax --help: {wall:.3f} s")
