"""Tuning (3): the DASH Relay share of expert delivery and the HBM writeback threshold, for serving throughput."""

from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

from experiments._tune_figures import result_rows, tune_table
from experiments.common import Comparison, Context, save_figure

TITLE = "Tuning (3) — dash-split: throughput against the Relay share, per writeback threshold, tuned points marked"
NAME = "tune_dash_split"
TINY = {"model": "qwen3-235b-a22b", "batch": 8, "prompt": 64, "output": 32}  # the tests' small workload


def run(ctx: Context) -> list[Comparison]:
    # all 8 of Mixtral's experts are needed at every pass of the default batch: one stream is exact
    table = tune_table(ctx, NAME, "dash-split", {"streams": 1, **(TINY if ctx.tiny else {})})
    table = table.assign(throughput=-table.objective)
    grid = table[table.kind == "grid"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    sns.lineplot(data=grid, x="knob_relay_fraction", y="throughput", hue="knob_hbm_kv_budget_gb", marker="o",
                 palette="viridis", ax=ax, legend="full")
    for _, r in table[table.kind == "result"].iterrows():
        ax.plot(r.knob_relay_fraction, r.throughput, "rx", ms=10, mew=2)
        ax.annotate(f"{r.estimator}, {r.knob_hbm_kv_budget_gb:.2g} GB", (r.knob_relay_fraction, r.throughput),
                    fontsize=6, xytext=(4, 4), textcoords="offset points")
    ax.set(xlabel="share of needed experts sent over Relay", ylabel="output tokens/s",
           title="fixed split (balanced_split = 0); × = tuned points")
    ax.legend(title="HBM KV budget (GB)", fontsize=6, title_fontsize=7)
    save_figure(fig, ctx, NAME)
    return result_rows(table, "Tuning (3) dash-split", lambda r: f"relay share {r.knob_relay_fraction:.3f}, HBM KV "
                       f"budget {r.knob_hbm_kv_budget_gb:.3g} GB")
