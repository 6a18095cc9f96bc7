"""Timing helpers shared by the benchmark modules: compile time apart from steady-state run time."""

from __future__ import annotations

import time
from typing import Callable

import jax
import numpy as np


def time_compiled(make_call: Callable[[], object], repeats: int = 3) -> tuple[float, float]:
    """(compile_s, best run_s): the first call includes tracing and compilation; later calls do not."""
    t0 = time.perf_counter()
    jax.block_until_ready(make_call())
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(make_call())
        best = min(best, time.perf_counter() - t0)
    return max(first - best, 0.0), best


def time_reference(fn: Callable[[], object], min_s: float = 0.5) -> float:
    """Seconds per call of a NumPy/Python reference (repeated until ``min_s`` has passed)."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return elapsed / n


def row(benchmark: str, events: float, unit: str, compile_s: float, run_s: float, ref_s_per_event: float,
        **extra) -> dict:
    eps = events / run_s
    ref = 1.0 / ref_s_per_event
    return {"benchmark": benchmark, "events": events, "unit": unit, "compile_s": compile_s, "run_s": run_s,
            "events_per_s": eps, "reference_events_per_s": ref, "speedup_vs_reference": eps / ref, **extra}


def time_serving(simulate, config, knobs, inputs, streams: int, seed: int):
    """(compile_s, run_s, run_cpu_s, outputs, valid stream mask) of a serving ``simulate`` over ``streams`` streams
    (64 vmapped at a time on a CPU)."""
    from hbfjax import batch

    per = batch.cpu_map_streams(min(streams, 64))
    fn = batch.compiled(simulate, map_streams=per)
    ids = batch.stream_ids(0, streams, per or 1)
    last = []

    def call():
        t0 = time.process_time()
        out = jax.block_until_ready(fn(ids, np.uint32(seed), knobs, inputs, config))
        last[:] = [out, time.process_time() - t0]
        return out

    compile_s, run_s = time_compiled(call, repeats=1)
    out, cpu_s = last
    return compile_s, run_s, cpu_s, out, np.asarray(ids) < streams


def time_family(family, streams: int, seed: int):
    """(compile_s, run_s, run_cpu_s, stream-iterations with work) of a one-point serving family
    (``hbfjax.serve.systems.Family``) over ``streams`` streams; refused if a stream overflowed."""
    compile_s, run_s, cpu_s, out, valid = time_serving(family.simulate, family.config, family.points[0], family.inputs,
                                                       streams, seed)
    assert not np.asarray(out.overflow)[valid].any(), "a stream overflowed: raise the scenario's max_iterations"
    return compile_s, run_s, cpu_s, int(np.asarray(out.iterations)[valid].sum())
