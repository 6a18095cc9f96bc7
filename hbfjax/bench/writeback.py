"""Writeback stream-iterations per second: S streams × T iterations of the 61-layer hbflex scenario.

The reference is the same policy written the plain sequential way: NumPy over plane slots, Python
loops over iterations, layers and segments, one stream at a time (``reference_rollout``; the tests
check it agrees with the compiled rollout). Its per-iteration inputs are drawn outside the timing.
"""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.serve import write_scenarios as sc
from hbfjax.flash.programs import writeback as wb
from hbfjax.flash.programs.reference import reference_plan, reference_rollout

ITERATIONS = 20


def run(scale: float) -> list[dict]:
    rows = []
    streams = max(64, int(4096 * scale))
    knobs = sc.hbflex_knobs(64, 512, 0.3)
    gen = np.random.default_rng(0)
    for policy in ("immediate", "window"):
        cfg = sc.config_for(knobs, policy, ITERATIONS)
        fn = batch.compiled(wb.simulate)
        ids = batch.stream_ids(0, streams)
        compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), knobs, None, cfg), repeats=2)
        ref_iters = 4
        dec = np.full(ref_iters, 64.0)
        pre = np.where(gen.random(ref_iters) < 0.3, 512.0, 0.0)
        plan = reference_plan(knobs)
        ref_s = time_reference(lambda: reference_rollout(plan, policy, dec, pre), min_s=1.0) / ref_iters
        rows.append(row(f"writeback {policy} {streams}x{ITERATIONS}it x{cfg.layers}layers", streams * ITERATIONS,
                        "stream-iterations", compile_s, run_s, ref_s, streams=streams, layers=cfg.layers))
    return rows
