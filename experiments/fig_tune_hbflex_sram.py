"""Tuning (4): the HBFlex base-die SRAM split between offload, prefetch and KV buffering, for serving throughput."""

from __future__ import annotations

import matplotlib.pyplot as plt

from experiments._tune_figures import result_rows, tune_table
from experiments.common import Comparison, Context, save_figure

TITLE = "Tuning (4) — hbflex-sram: throughput over the SRAM split (offload / prefetch / KV buffer), tuned points marked"
NAME = "tune_hbflex_sram"
SHARES = ("offload", "prefetch", "KV buffer")
TINY = {"slots": 4, "requests": 4, "prompt_tokens": 256, "output_tokens": 16}


def run(ctx: Context) -> list[Comparison]:
    table = tune_table(ctx, NAME, "hbflex-sram", {"streams": 2, **(TINY if ctx.tiny else {})})
    table = table.assign(throughput=-table.objective)
    grid = table[table.kind == "grid"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    sc = axes[0].scatter(grid.knob_sram_split_0, grid.knob_sram_split_1, c=grid.throughput, cmap="viridis", s=40)
    fig.colorbar(sc, ax=axes[0], label="tokens/s")
    for _, r in table[table.kind == "result"].iterrows():
        axes[0].plot(r.knob_sram_split_0, r.knob_sram_split_1, "rx", ms=10, mew=2)
    axes[0].set(xlabel="offload share", ylabel="prefetch share", title="the simplex (KV buffer = the rest); × = tuned")
    for i, share in enumerate(SHARES):
        best = grid.groupby(f"knob_sram_split_{i}").throughput.max()
        axes[1].plot(best.index, best.to_numpy(), "-o", ms=3, label=f"{share} (best over the others)")
    for _, r in table[table.kind == "result"].iterrows():
        for i in range(3):
            axes[1].plot(r[f"knob_sram_split_{i}"], r.throughput, "rx", ms=8, mew=1.5)
    axes[1].set(xlabel="share of the usable SRAM", ylabel="tokens/s", title="throughput against each share")
    axes[1].legend(fontsize=7)
    save_figure(fig, ctx, NAME)
    return result_rows(table, "Tuning (4) hbflex-sram", lambda r: "split " + " / ".join(
        f"{s} {r[f'knob_sram_split_{i}']:.2f}" for i, s in enumerate(SHARES)))
