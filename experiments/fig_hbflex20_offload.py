"""HBFlex Fig. 20: hot-plane offload — max/avg plane load and SRAM per stack vs offloaded plane fraction."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from experiments._hbflex_models import MODELS, TRACES
from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax import batch, traces
from hbfjax.flash.reads import workingset
from hbfjax.hardware import MB, preset
from hbfjax.stats import mean_ci95

TITLE = "HBFlex Fig. 20 — hot-plane offload: balance vs SRAM"
NAME = "hbflex20_offload"
FRACTIONS = (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2)
SLOTS = 32
GROUP_SIZE = 32


def _compute(ctx: Context) -> pd.DataFrame:
    hbf = preset("hbflex").hbf
    streams = 2 if ctx.tiny else max(4, ctx.streams // 16)
    rows = []
    for trace in TRACES[:1] if ctx.tiny else TRACES:  # tiny: one trace (each is its own inputs shape)
        contexts = workingset.WorkingSetInputs.make(traces.load_trace(trace).context_tokens)
        for model, spec in list(MODELS.items())[:1] if ctx.tiny else MODELS.items():
            config = workingset.attention_config(hbf.parallel_units, SLOTS, spec["kv_bytes_per_token"], measurements=2)
            points = batch.stack_knobs([workingset.WorkingSetKnobs.make(spec["kv_bytes_per_token"],
                                                                        group_size=GROUP_SIZE, offload_fraction=f)
                                        for f in FRACTIONS])
            out = batch.run(workingset.simulate, streams, ctx.seed, points, config, inputs=contexts, knob_axis=True)
            for i, f in enumerate(FRACTIONS):
                ratio, ratio_ci = mean_ci95(out.offload_max_to_avg_load[:, i].mean(axis=-1))
                # one layer's offload, times the layers, spread over the stacks
                sram = out.sram_bytes[:, i].mean(axis=-1) * spec["layers"] / hbf.stacks / MB
                sram_mean, sram_ci = mean_ci95(sram)
                rows.append({"trace": trace.split(".")[0], "model": model, "offload_fraction": f,
                             "max_to_avg_load": ratio, "ci95_max_to_avg": ratio_ci,
                             "sram_mb_per_stack": sram_mean, "ci95_sram_mb": sram_ci})
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"fractions": FRACTIONS, "slots": SLOTS, "traces": TRACES}, lambda: _compute(ctx))
    table = table.assign(series=table.trace + " / " + table.model, offload_pct=100 * table.offload_fraction)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    sns.lineplot(data=table, x="offload_pct", y="max_to_avg_load", hue="series", marker="o", ax=axes[0])
    sns.lineplot(data=table, x="offload_pct", y="sram_mb_per_stack", hue="series", marker="o", ax=axes[1], legend=False)
    axes[0].set(xlabel="top-loaded planes offloaded (%)", ylabel="max / avg plane load")
    axes[1].set(xlabel="top-loaded planes offloaded (%)", ylabel="SRAM per stack, all layers (MB)")
    axes[1].axhspan(6, 12, xmin=0.45, xmax=0.55, color="gray", alpha=0.3, label="paper @10 %: 6–12 MB")
    axes[1].axhspan(14, 35, xmin=0.92, xmax=1.0, color="orange", alpha=0.3, label="paper @20 %: 14–35 MB")
    axes[1].axhline(40, ls="--", color="red", lw=1, label="40 MB SRAM per stack")
    axes[1].legend(fontsize=7)
    axes[0].legend(fontsize=7)
    save_figure(fig, ctx, NAME)
    at = lambda f: table[np.isclose(table.offload_fraction, f)]  # noqa: E731
    lo10, hi10 = at(0.1).sram_mb_per_stack.min(), at(0.1).sram_mb_per_stack.max()
    lo20, hi20 = at(0.2).sram_mb_per_stack.min(), at(0.2).sram_mb_per_stack.max()
    note = (f"{SLOTS} concurrent requests, plane groups of {GROUP_SIZE}; traces: Azure code, Mooncake, SWE-bench "
            "(no Bailian here); one layer's offload × layers / 6 stacks")
    return [
        Comparison("HBFlex Fig. 20", "SRAM per stack at 10 % offload", "6–12 MB", f"{lo10:.1f}–{hi10:.1f} MB", note),
        Comparison("HBFlex Fig. 20", "SRAM per stack at 20 % offload", "14–35 MB", f"{lo20:.1f}–{hi20:.1f} MB", note),
        Comparison("HBFlex Fig. 20", "max/avg load, 0 % → 10 % offload (mean over series)", "curves flatten beyond 10 %",
                   f"{at(0.0).max_to_avg_load.mean():.2f} → {at(0.1).max_to_avg_load.mean():.2f} "
                   f"(20 %: {at(0.2).max_to_avg_load.mean():.2f})", note),
    ]
