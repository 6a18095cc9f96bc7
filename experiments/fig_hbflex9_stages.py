"""HBFlex Fig. 9: compute stage durations (decode batches, prefill chunks) against one program (tPROG)."""

from __future__ import annotations

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax.serve import write_scenarios as sc
from hbfjax.flash.programs.timeline import apply_prefetch, window_after
from hbfjax.hardware import preset

TITLE = "HBFlex Fig. 9 — stage durations vs one program (tPROG = 75 µs)"
NAME = "hbflex9_stages"
DECODE_BATCH = (16, 32, 64, 128)
PREFILL_CHUNK = (128, 256, 512, 1024, 2048)
STAGES = ("qkv_proj", "attention", "ffn")


def _windows(decode_requests: float, prefill_tokens: float) -> tuple[float, float]:
    """Longest read-free window of a layer (µs) without and with weight prefetch (HBFlex Fig. 13a)."""
    knobs = sc.hbflex_knobs(decode_requests, prefill_tokens, 1.0, layers=1)
    out = []
    for pf in (0.0, 1.0):
        gd, gp, start = window_after(apply_prefetch(knobs.timeline, jnp.float32(pf)))
        out.append(float(jnp.max(jnp.where(start, gd + gp * prefill_tokens, 0.0))))
    return out[0], out[1]


def _compute(ctx: Context) -> pd.DataFrame:
    stages = sc.StageModel()
    rows = []
    for r in DECODE_BATCH:
        for stage, us in stages.stage_times(r).items():
            rows.append({"kind": "decode", "tokens": r, "stage": stage, "duration_us": us})
        nopf, pf = _windows(r, 0.0)
        rows += [{"kind": "decode", "tokens": r, "stage": "window (no prefetch)", "duration_us": nopf},
                 {"kind": "decode", "tokens": r, "stage": "window (prefetch)", "duration_us": pf}]
    for t in PREFILL_CHUNK:
        for stage, us in stages.stage_times(t).items():  # a prefill chunk of t tokens (decode-free pass)
            rows.append({"kind": "prefill", "tokens": t, "stage": stage, "duration_us": us})
        nopf, pf = _windows(0.0, t)
        rows += [{"kind": "prefill", "tokens": t, "stage": "window (no prefetch)", "duration_us": nopf},
                 {"kind": "prefill", "tokens": t, "stage": "window (prefetch)", "duration_us": pf}]
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"decode": DECODE_BATCH, "prefill": PREFILL_CHUNK, "stages": str(sc.StageModel())},
                         lambda: _compute(ctx))
    t_prog = preset("hbflex").hbf.t_prog_us
    order = list(STAGES) + ["window (no prefetch)", "window (prefetch)"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, kind, sizes, xlabel in ((axes[0], "decode", DECODE_BATCH, "decode batch (tokens)"),
                                    (axes[1], "prefill", PREFILL_CHUNK, "prefill chunk (tokens)")):
        part = table[table.kind == kind]
        x = np.arange(len(sizes))
        w = 0.8 / len(order)
        for i, stage in enumerate(order):
            vals = [part[(part.tokens == s) & (part.stage == stage)].duration_us.iloc[0] for s in sizes]
            ax.bar(x + (i - (len(order) - 1) / 2) * w, vals, w, label=stage, color=f"C{i}",
                   hatch="//" if stage.startswith("window") else None)
        ax.axhline(t_prog, color="k", ls="--", lw=1.2, label=f"one program: tPROG = {t_prog:g} µs")
        ax.set_xticks(x, [str(s) for s in sizes])
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(f"{kind}: per layer, DeepSeek-V4-Pro-like (roofline estimate)", fontsize=9)
    axes[0].set_ylabel("duration per layer (µs, log)")
    axes[1].legend(fontsize=7, loc="upper left")
    save_figure(fig, ctx, NAME)
    dec = table[(table.kind == "decode") & table.stage.isin(STAGES)]
    below = float((dec.duration_us < t_prog).mean())
    pre = table[(table.kind == "prefill") & table.stage.isin(STAGES)]
    first_over = pre[pre.duration_us >= t_prog].tokens.min()
    win = table[(table.kind == "decode") & (table.stage == "window (prefetch)") & (table.tokens == 64)].duration_us.iloc[0]
    return [
        Comparison("HBFlex Fig. 9", "decode stages shorter than one program (fraction, batch 16–128)",
                   "most decode stages < tPROG", f"{below:.0%}",
                   "roofline stage times (estimated, no public V4-Pro config); the FFN at batch 128 exceeds tPROG"),
        Comparison("HBFlex Fig. 9", "smallest prefill chunk with a stage ≥ tPROG (tokens)",
                   "prefill compute grows with chunk size", f"{first_over}",
                   "every prefill chunk ≥ 128 tokens gives a window longer than one program"),
        Comparison("HBFlex Fig. 13a", "decode window after weight prefetch, batch 64 (µs)",
                   "prefetch merges compute into longer windows", f"{win:.0f}",
                   "attention + FFN run back-to-back once the expert weights are prefetched"),
    ]
