"""DASH Fig. 11: E2E and TPOT reductions of lookahead expert execution as tR grows (DASH §V-C, §VI-D), on
the serving engine: DASH with lookahead on and off at B/L_in/L_out = 1/4K/128, Qwen3-235B-A22B and DeepSeek-V2,
under the literal reading (tR sets the arrays' rate: one page wave per tR), with tR a latency only, and
the reading closest to the paper's text (``_dash_serve.PAPER_TR``: also arrays per path, no launch cost,
the prompt in one pass)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from experiments import _dash_serve as ds
from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax.memory import delivery
from hbfjax.memory import organisations as orgs
from hbfjax.workload import models

TITLE = "DASH Fig. 11 — lookahead expert execution: E2E and TPOT reductions vs tR (Qwen3-235B-A22B, DeepSeek-V2, 1/4K/128)"
NAME = "dash11_lookahead"
MODELS = ("qwen3-235b-a22b", "deepseek-v2")
T_READ_US = (1.0, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0)
BATCH, PROMPT, OUTPUT = 1, 4096, 128
STREAMS = 2  # B = 1: decode passes route exactly top-k experts (no draw); only prefill chunk counts are drawn
KEYS = ("model", "t_read_us", "reading")
READINGS = (ds.LITERAL, ds.TR_LATENCY, ds.PAPER_TR)
# DASH §VI-D: reductions (%) with lookahead at tR = 3 and 32 µs
PAPER = {("qwen3-235b-a22b", 3.0): (3.33, 3.86), ("deepseek-v2", 3.0): (1.99, 2.45),
         ("qwen3-235b-a22b", 32.0): (9.50, 10.88), ("deepseek-v2", 32.0): (8.69, 10.53)}


def _points(t_reads, prompt, output) -> list[ds.Point]:
    return [ds.Point("dash", BATCH, prompt, output, (("t_read_us", t), ("lookahead", on)),
                     "lookahead" if on else "no-lookahead", reading=r) for r in READINGS for t in t_reads
            for on in (1, 0)]


def _compute(ctx: Context) -> pd.DataFrame:
    if ctx.tiny:
        cases = [(ds.TINY_MODEL, (3.0, 32.0), ds.TINY_PROMPT, ds.TINY_OUTPUT, ds.TINY_POINTS)]
    else:
        cases = [(m, T_READ_US, PROMPT, OUTPUT, None) for m in MODELS]
    rows = [r for m, t_reads, prompt, output, pad in cases
            for r in ds.run_points(m, _points(t_reads, prompt, output), min(ctx.streams, STREAMS), ctx.seed, pad_to=pad)]
    table = pd.DataFrame(rows)
    on = table.system == "lookahead"
    for metric in ("e2e_s", "tpot_ms"):
        table.loc[on, f"{metric}_reduction"] = [1.0 - x for x in ds.paired(rows, metric, "no-lookahead", KEYS, "lookahead")]
    return table


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6))
    for i, m in enumerate(dict.fromkeys(table.model)):
        of = table[(table.model == m) & (table.system == "lookahead")]
        for ax, metric in zip(axes, ("e2e_s", "tpot_ms")):
            for reading, style in ((ds.LITERAL.name, "o-"), (ds.PAPER_TR.name, "s--")):
                t = of[of.reading == reading].sort_values("t_read_us")
                ax.plot(t.t_read_us, 100 * t[f"{metric}_reduction"], style, color=f"C{i}", label=f"{m} ({reading})")
            paper = [(tr, PAPER[m, tr][metric == "tpot_ms"]) for tr in (3.0, 32.0) if (m, tr) in PAPER]
            if paper:
                ax.plot(*zip(*paper), "*", ms=11, color=f"C{i}", label=f"{m} (paper)")
    for ax, what in zip(axes, ("E2E", "TPOT")):
        ax.set_xscale("log", base=2)
        ticks = sorted(set(table.t_read_us))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("HBF read latency tR (µs)")
        ax.set_ylabel(f"{what} reduction with lookahead (%)")
    axes[0].legend(fontsize=7)
    save_figure(fig, ctx, NAME)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"models": MODELS, "t_read_us": T_READ_US, "batch": BATCH, "prompt": PROMPT,
                                     "output": OUTPUT, "streams_cap": STREAMS,
                                     "readings": [r.name for r in READINGS]}, lambda: _compute(ctx))
    _plot(table, ctx)
    literal = table[table.reading == ds.LITERAL.name]
    on = literal[literal.system == "lookahead"].set_index(["model", "t_read_us"])
    off = literal[literal.system == "no-lookahead"].set_index(["model", "t_read_us"])
    out = []
    for m, tr in [(m, tr) for m in dict.fromkeys(table.model) for tr in (3.0, 32.0) if (m, tr) in on.index]:
        paper = f"−{PAPER[m, tr][0]:.2f} %, −{PAPER[m, tr][1]:.2f} %" if (m, tr) in PAPER else "—"
        r, o = on.loc[m, tr], off.loc[m, tr]
        array_tbps = float(delivery.rates(orgs.dash(t_read_us=tr)).array_gbps) / 1e3
        hidden_us = (o.tpot_ms - r.tpot_ms) * 1e3 / models.preset(m).moe_layers
        out.append(Comparison(
            "DASH Fig. 11", f"{m}, tR = {tr:g} µs: E2E and TPOT reduction with lookahead",
            paper, f"−{r.e2e_s_reduction:.2%}, −{r.tpot_ms_reduction:.2%}",
            f"TPOT {o.tpot_ms:.2f} → {r.tpot_ms:.2f} ms: {hidden_us:.1f} µs hidden per MoE layer and token (the "
            "window of the layer's output projection, norms and router, layer_time, covers that much of tR); "
            f"the HBF arrays deliver {array_tbps:.2f} TB/s at this tR (one page wave per tR, DESIGN.md §4) and "
            f"the routed experts are {r.decode_expert_share:.0%} of a decode iteration"
            + ("; TPOT grows with tR through that rate, so the same hidden tR is a smaller share, while the "
               "paper says part of a 32 µs tR stays exposed (its window is shorter) and still reports ~10 %: its "
               "delivery rate is not bound by one page wave per tR (e.g. pipelined cache reads) or more startup "
               "per layer is exposed without lookahead, neither stated" if tr > 3 else
               "; the paper's larger share implies a shorter TPOT or more than one exposed tR per layer "
               "(neither stated)")))
    for reading in READINGS[1:]:
        rows = table[table.reading == reading.name]
        on_r = rows[rows.system == "lookahead"].set_index(["model", "t_read_us"])
        off_r = rows[rows.system == "no-lookahead"].set_index(["model", "t_read_us"])
        cells = [(m, tr) for m in dict.fromkeys(table.model) for tr in (3.0, 32.0) if (m, tr) in on_r.index]
        if not cells:
            continue
        paper = "; ".join(f"{m} {tr:g} µs −{PAPER[m, tr][0]:.2f} %, −{PAPER[m, tr][1]:.2f} %"
                          for m, tr in cells if (m, tr) in PAPER) or "—"
        hidden = lambda m, tr: ((off_r.loc[m, tr].tpot_ms - on_r.loc[m, tr].tpot_ms) * 1e3  # noqa: E731
                                / models.preset(m).moe_layers)
        ours = "; ".join(f"{m} {tr:g} µs −{on_r.loc[m, tr].e2e_s_reduction:.2%}, "
                         f"−{on_r.loc[m, tr].tpot_ms_reduction:.2%} (TPOT {off_r.loc[m, tr].tpot_ms:.2f} → "
                         f"{on_r.loc[m, tr].tpot_ms:.2f} ms, {hidden(m, tr):.1f} µs hidden a MoE layer)"
                         for m, tr in cells)
        what = ("tR a latency only: the arrays keep their 3 µs rate (as if a plane kept tR / 3 µs more reads "
                "outstanding; --tr-model latency), the rest literal" if reading is ds.TR_LATENCY else
                "tR a latency only, the arrays per path, no kernel-launch cost, the 4K prompt in one pass: the "
                "reading closest to the paper's text. Where ours exceeds the paper's at 32 µs, our lookahead "
                "window (the layer's output projection, norms and router) hides more of tR than the paper's "
                "numbers imply (DeepSeek-V2's output projection alone is 168 MB, ≈ 26 µs at the links; the "
                "paper's reductions imply ≈ 16 µs)")
        out.append(Comparison("DASH Fig. 11", f"reading '{reading.name}': E2E and TPOT reductions with lookahead",
                              paper, ours, what))
    return out
