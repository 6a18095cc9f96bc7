"""Tuning (1): read waves + λ · SRAM over plane-group size G and offload fraction f — the landscape and the optimiser's paths."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from experiments._tune_figures import result_rows, tune_table
from experiments.common import Comparison, Context, save_figure
from hbfjax.tune.problems import collide_sram

TITLE = "Tuning (1) — collide-sram: read waves + λ · SRAM over (G, f), with the optimisers' trajectories"
NAME = "tune_collide_sram"


def run(ctx: Context) -> list[Comparison]:
    table = tune_table(ctx, NAME, "collide-sram")
    grid = table[table.kind == "grid"]
    sizes = np.sort(grid.knob_group_size.unique())
    fractions = np.sort(grid.knob_offload_fraction.unique())
    z = grid.pivot(index="knob_group_size", columns="knob_offload_fraction", values="objective").loc[sizes, fractions]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    mesh = ax.pcolormesh(fractions * 100, np.log2(sizes), z.to_numpy(), shading="nearest", cmap="viridis_r")
    fig.colorbar(mesh, ax=ax, label="read waves per read + λ · SRAM MB")
    for (est, path), marker in zip(table[table.kind == "trajectory"].groupby("estimator", sort=False), "osd^"):
        ax.plot(path.knob_offload_fraction * 100, np.log2(path.knob_group_size), "-", marker=marker, ms=3, lw=1,
                label=f"{est} trajectory")
    best = grid.loc[grid.objective.idxmin()]
    ax.plot(best.knob_offload_fraction * 100, np.log2(best.knob_group_size), "r*", ms=14, label="grid optimum")
    for _, r in table[table.kind == "result"].iterrows():
        ax.plot(r.knob_offload_fraction * 100, np.log2(r.knob_group_size), "wx", ms=9, mew=2)
    ax.set(xlabel="hot planes offloaded f (%)", ylabel="log2 plane-group size G",
           title=f"λ = {collide_sram.LAMBDA_WAVES_PER_MB:g} waves per MB; × = tuned points")
    ax.legend(fontsize=7, loc="upper right")
    save_figure(fig, ctx, NAME)
    note = (f"{collide_sram.PLANES} planes, {collide_sram.SLOTS} requests, DeepSeek-V3 MLA KV (L = 5 pages per "
            "logical page), synthetic log-normal contexts; offload per scheduling wave; same random numbers for "
            "the grid and every optimiser")
    rows = result_rows(table, "Tuning (1) collide-sram",
                       lambda r: f"G = {r.knob_group_size:g}, f = {r.knob_offload_fraction:.3f}; " + note)
    rows.append(Comparison("Tuning (1) collide-sram", "plane-group size G at the optimum",
                           "not stated (hbfjax preset: 32)", f"{best.knob_group_size:g} (grid), "
                           f"f = {best.knob_offload_fraction:.2f}",
                           "G below L = 5 wraps a logical page onto fewer planes; large G balances only coarsely"))
    return rows
