"""Tuning (2): read-wave amplification against write amplification over the plane-group size G, with GC."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from experiments._tune_figures import result_rows, streams_for, tune_table
from experiments.common import Comparison, Context, save_figure

TITLE = "Tuning (2) — collide-gc: read-wave amplification + λ · (WAF − 1) over G, with the optimisers' trajectories"
NAME = "tune_collide_gc"
TINY = {"warmup_ticks": 10, "measure_ticks": 20}  # the same rollout, 30 ticks instead of 300


def run(ctx: Context) -> list[Comparison]:
    table = tune_table(ctx, NAME, "collide-gc", {"streams": streams_for(ctx, 32, 8), **(TINY if ctx.tiny else {})})
    grid = table[table.kind == "grid"].sort_values("knob_group_size")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.plot(np.log2(grid.knob_group_size), grid.objective, "k-o", ms=4, label="exhaustive grid (exact)")
    for (est, path), marker in zip(table[table.kind == "trajectory"].groupby("estimator", sort=False), "osd^"):
        # the trajectory's objective is the estimator's (relaxed, interpolated or perturbed) value
        ax.plot(np.log2(path.knob_group_size), path.objective, "--", marker=marker, ms=3, lw=0.8, alpha=0.8,
                label=f"{est} trajectory (estimator's value)")
    best = grid.loc[grid.objective.idxmin()]
    ax.plot(np.log2(best.knob_group_size), best.objective, "r*", ms=14, label="grid optimum")
    for _, r in table[table.kind == "result"].iterrows():
        ax.plot(np.log2(r.knob_group_size), r.objective, "bx", ms=9, mew=2)
    ax.set(xlabel="log2 plane-group size G", ylabel="read-wave amplification + λ · (WAF − 1)",
           title="small G: plane collisions; large G: mixed lifetimes in shared blocks (× = tuned)")
    ax.legend(fontsize=7)
    save_figure(fig, ctx, NAME)
    rows = result_rows(table, "Tuning (2) collide-gc", lambda r: f"G = {r.knob_group_size:g}")
    rows.append(Comparison("Tuning (2) collide-gc", "plane-group size G at the optimum", "not stated (hbfjax preset: 32)",
                           f"{best.knob_group_size:g} (grid)", "a plane group is also an allocation unit here "
                           "(hbfjax's modelling choice, see hbfjax/tune/problems/collide_gc.py)"))
    return rows
