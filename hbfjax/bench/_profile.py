"""Optional per-op time profile of one benchmark call (``python -m hbfjax.bench --profile DIR``).

One extra call of a row's compiled function runs under ``jax.profiler.trace``; the trace it writes
is summed per (process, op name): total microseconds and launches (a while loop's op contains
its body's ops, so per-process sums count nested work twice). On a GPU the device process's
ops are the kernels, so the sum of their time against the call's wall time says whether a run is
bound by kernel work or by launches and loop overhead. A failing profiler never fails the bench.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import time
from collections import defaultdict
from typing import Callable

import jax

LOG_DIR: list[str | None] = [None]  # set by ``--profile``; None: no profiles
TOP_OPS = 15


def op_totals(trace_path: str) -> tuple[list[dict], dict]:
    """(ops sorted by total time, total device-op µs per process) from a Chrome/Perfetto trace file.

    An op is a complete event (``ph == 'X'``) carrying an ``hlo_op`` argument, or any complete event
    of a process named ``/device:...``: XLA's executed ops and kernels, not Python or runtime spans.
    """
    with gzip.open(trace_path, "rt") as fh:
        data = json.load(fh)
    events = data["traceEvents"] if isinstance(data, dict) else data
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    total_us: dict = defaultdict(float)
    count: dict = defaultdict(int)
    for e in events:
        if e.get("ph") != "X":
            continue
        where = process.get(e.get("pid"), str(e.get("pid")))
        if "hlo_op" not in e.get("args", {}) and not where.startswith("/device:"):
            continue
        key = (where, e.get("name", "?"))
        total_us[key] += float(e.get("dur", 0.0))
        count[key] += 1
    ops = [{"process": p, "op": n, "total_us": t, "launches": count[(p, n)]} for (p, n), t in total_us.items()]
    ops.sort(key=lambda o: -o["total_us"])
    per_process: dict = defaultdict(float)
    for o in ops:
        per_process[o["process"]] += o["total_us"]
    return ops, dict(per_process)


def _newest_trace(log_dir: str) -> str | None:
    found = glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True) or \
        glob.glob(os.path.join(log_dir, "**", "*.trace.json.gz"), recursive=True)
    return max(found, key=os.path.getmtime) if found else None


def maybe_profile(label: str, call: Callable[[], object]) -> None:
    """When ``LOG_DIR`` is set: run ``call()`` once under the profiler and print its top ops."""
    if LOG_DIR[0] is None:
        return
    log_dir = os.path.join(LOG_DIR[0], "".join(c if c.isalnum() else "_" for c in label)[:80])
    try:
        t0 = time.perf_counter()
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            jax.block_until_ready(call())
        wall_us = (time.perf_counter() - t0) * 1e6
        path = _newest_trace(log_dir)
        if path is None:
            print(f"#   profile {label}: no trace file under {log_dir}", flush=True)
            return
        ops, per_process = op_totals(path)
    except Exception as err:  # noqa: BLE001 - a profile is a diagnostic: report and carry on
        print(f"#   profile {label}: failed ({type(err).__name__}: {err})", flush=True)
        return
    print(f"#   profile {label}: call wall {wall_us:.0f} us (profiler on); op time per process: "
          + ", ".join(f"{p} {t:.0f} us in {sum(o['launches'] for o in ops if o['process'] == p)} ops"
                      for p, t in per_process.items()), flush=True)
    for o in ops[:TOP_OPS]:
        print(f"#     {o['total_us']:>10.0f} us {o['launches']:>7d}x  {o['process']}  {o['op']}", flush=True)
