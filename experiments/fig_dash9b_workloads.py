"""DASH Fig. 9(b): throughput and E2E latency at B = 1 over four L_in/L_out workloads per model, and
Llama 4 Maverick with its KV overflowing HBM at 4K/256K and 4K/1M (DASH §VI-B), on the serving engine,
the four workloads under the literal reading and the one closest to the paper's text
(``_dash_serve.PAPER``), the overflow runs under the literal one."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _dash_serve as ds
from experiments.common import Comparison, Context, cached_table, save_figure

TITLE = "DASH Fig. 9(b) — B = 1 over L_in/L_out workloads, and Llama 4 Maverick's KV overflow at 4K/256K and 4K/1M"
NAME = "dash9b_workloads"
# K = 1024 (4K = 4,096: the paper's 197.413 GB of Maverick KV at 4K/1M is exactly (4,096 + 10^6) tokens ×
# 196,608 B), M = 10^6 (the same check); 256K read as 262,144.
WORKLOADS = (("512/16", 512, 16), ("4K/16", 4096, 16), ("512/20K", 512, 20480), ("20K/20K", 20480, 20480))
OVERFLOW_MODEL = "llama4-maverick"
OVERFLOW = (("4K/256K", 4096, 262_144), ("4K/1M", 4096, 1_000_000))
# Supported context windows (tokens), from each model's published configuration; ModelSpec has no field.
CONTEXT_WINDOW = {
    "qwen3-235b-a22b": (40_960, "huggingface.co/Qwen/Qwen3-235B-A22B config.json max_position_embeddings"),
    "mixtral-8x22b": (65_536, "huggingface.co/mistralai/Mixtral-8x22B-v0.1 config.json max_position_embeddings"),
    "grok-1": (8_192, "github.com/xai-org/grok-1 run.py sequence_len"),
    "llama4-maverick": (1_048_576, "huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct config.json "
                                   "text_config.max_position_embeddings"),
    "deepseek-v3": (163_840, "huggingface.co/deepseek-ai/DeepSeek-V3 config.json max_position_embeddings"),
}
PAPER_COMBINATIONS = 20  # DASH §VI-B: "Across the 20 combinations"
# B = 1 with top-k routing: every decode pass routes one token to exactly k experts (no draw), only the
# prefill chunks' distinct-expert counts are drawn, so one or two streams suffice.
STREAMS, OVERFLOW_STREAMS = 2, 1
OVERFLOW_SCAN_CHUNK = 512
KEYS = ("model", "workload", "reading")
READINGS = (ds.LITERAL, ds.PAPER)


def workloads(model: str) -> list[tuple[str, int, int]]:
    """The Fig. 9(b) workloads of ``model`` that fit its context window (L_in + L_out <= window)."""
    window = CONTEXT_WINDOW[model][0]
    extra = OVERFLOW if model == OVERFLOW_MODEL else ()
    return [w for w in WORKLOADS + extra if w[1] + w[2] <= window]


def _run(model: str, cases, streams: int, seed: int, readings=(ds.LITERAL,), **kw) -> list[dict]:
    """Each workload of ``cases`` on the four organisations under each of ``readings``, one ``run_points``
    per workload; calls share one compilation (one ``max_iterations`` for all)."""
    bound = max(ds.iterations_bound(ds.Point("dash", 1, p, o, reading=r)) for _, p, o in cases
                for r in readings) + ds.ITERATION_MARGIN
    rows = []
    for label, prompt, output in cases:
        points = [ds.Point(org, 1, prompt, output, reading=r) for r in readings for org in ds.ORGANISATIONS]
        rows += [{**r, "workload": label} for r in ds.run_points(model, points, streams, seed, max_iterations=bound, **kw)]
    return rows


def _compute(ctx: Context) -> pd.DataFrame:
    if ctx.tiny:
        rows = _run(ds.TINY_MODEL, [("tiny", ds.TINY_PROMPT, ds.TINY_OUTPUT)], min(ctx.streams, STREAMS), ctx.seed,
                    READINGS, pad_to=ds.TINY_POINTS)
    else:
        rows = []
        for m in ds.FIG9_MODELS:
            cases = workloads(m)
            rows += _run(m, [w for w in cases if w not in OVERFLOW], min(ctx.streams, STREAMS), ctx.seed, READINGS)
            if any(w in OVERFLOW for w in cases):
                rows += _run(m, [w for w in cases if w in OVERFLOW], min(ctx.streams, OVERFLOW_STREAMS), ctx.seed,
                             scan_chunk=OVERFLOW_SCAN_CHUNK)
    table = pd.DataFrame(rows)
    for metric, name in (("decode_tokens_per_s", "decode_rate_norm"), ("throughput_tokens_per_s", "throughput_norm"),
                         ("e2e_s", "e2e_norm")):
        table[name] = ds.normalise(rows, metric, {"system": "relay-only"}, KEYS)
    table["prefill_share"] = table.ttft_s / table.e2e_s
    return table


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    table = table[table.reading == ds.LITERAL.name]
    groups = [(m, table[(table.model == m) & ~table.workload.isin([w[0] for w in OVERFLOW])])
              for m in dict.fromkeys(table.model)]
    over = table[table.workload.isin([w[0] for w in OVERFLOW])]
    if len(over):
        groups.append((f"{OVERFLOW_MODEL}: KV overflow", over))
    fig, axes = plt.subplots(2, len(groups), figsize=(2.8 * len(groups), 5.6), squeeze=False)
    width = 0.8 / len(ds.ORGANISATIONS)
    for j, (title, t) in enumerate(groups):
        labels = list(dict.fromkeys(t.workload))
        for i, name in enumerate(ds.ORGANISATIONS):
            s = t[t.system == name].set_index("workload").loc[labels]
            x = np.arange(len(labels)) + (i - 1.5) * width
            axes[0, j].bar(x, s.decode_rate_norm, width, color=f"C{i}", label=name)
            axes[1, j].bar(x, s.e2e_norm, width, color=f"C{i}")
        axes[0, j].set_title(title, fontsize=9)
        for ax in axes[:, j]:
            ax.set_xticks(np.arange(len(labels)), labels, fontsize=7)
    axes[0, 0].set_ylabel("decode throughput / RelayOnly")
    axes[1, 0].set_ylabel("E2E / RelayOnly")
    axes[0, 0].legend(fontsize=7)
    save_figure(fig, ctx, NAME)


def _kv_note(row: dict) -> str:
    """The engine's account of one row's KV (``ServeOutput.totals``, means over streams)."""
    return (f"engine: peak KV {row['max_kv_hbm_bytes_mean'] / 1e9:.2f} GB in HBM + "
            f"{row['max_kv_hbf_bytes_mean'] / 1e9:.2f} GB in HBF, {row['writeback_bytes_mean'] / 1e9:.1f} GB written "
            f"back, {row['write_stall_us_mean'] * 1e-6:.2f} s exposed write stall; a mid-decode token reads "
            f"{row['decode_kv_hbm_share']:.0%} of its KV from HBM")


def _hbm_bound_note(dash: list[dict]) -> str:
    """Where DASH gains least because the attention reads most of its KV from HBM (the decode KV below
    the HBM budget), through HBM cells that every organisation shares."""
    worst = max(dash, key=lambda r: r["decode_kv_hbm_share"] * r["decode_attention_share"])
    return (f"; least at {worst['model']} {worst['workload']}: a mid-decode token reads "
            f"{worst['decode_kv_hbm_share']:.0%} of its KV from HBM and attention is "
            f"{worst['decode_attention_share']:.0%} of the iteration, bound by the HBM cells (the same in all four)")


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"models": ds.FIG9_MODELS, "workloads": WORKLOADS, "overflow": OVERFLOW,
                                     "windows": {m: w for m, (w, _) in CONTEXT_WINDOW.items()},
                                     "streams_cap": [STREAMS, OVERFLOW_STREAMS]}, lambda: _compute(ctx))
    _plot(table, ctx)
    everything = table.to_dict("records")
    rows = [r for r in everything if r["reading"] == ds.LITERAL.name]
    dash = [r for r in rows if r["system"] == "dash"]

    def ratios(baseline, subset=rows):
        dec, e2e = ds.speedup_and_reduction(subset, KEYS, "decode_tokens_per_s", baseline)
        whole, _ = ds.speedup_and_reduction(subset, KEYS, "throughput_tokens_per_s", baseline)
        return dec, whole, e2e

    (dr, wr, er), (dd, wd, ed) = ratios("relay-only"), ratios("direct-only")
    by_workload = {w: ratios("relay-only", [r for r in rows if r["workload"] == w])[2]
                   for w in dict.fromkeys(table.workload)}
    windows = "; ".join(f"{m} {w:,} ({src})" for m, (w, src) in CONTEXT_WINDOW.items())
    grok = [w[0] for w in workloads("grok-1")]
    out = [
        Comparison("DASH Fig. 9(b)", f"geomean throughput speedup of DASH over RelayOnly ({len(dash)} combinations)",
                   "1.79× (20 combinations)", f"{dr:.2f}× decode-phase rate ({wr:.2f}× whole-run)",
                   f"the gap as in Fig. 9(a): DASH's two paths are capped by the HBF arrays at "
                   f"{ds.expert_cap_ratio():.2f}× one path, and the non-expert operators gain less (decode_expert_share "
                   f"column: {np.mean([r['decode_expert_share'] for r in dash]):.0%} mean for DASH); at B = 1 the decode passes are deterministic (one token, exactly "
                   f"top-k experts): {STREAMS} streams, {OVERFLOW_STREAMS} for the 4K/256K and 4K/1M runs"),
        Comparison("DASH Fig. 9(b)", "geomean throughput speedup of DASH over DirectOnly", "1.63×",
                   f"{dd:.2f}× decode-phase rate ({wd:.2f}× whole-run)",
                   f"as above; DirectOnly runs at {dr / dd:.2f}× RelayOnly's decode rate at B = 1 (the paper's two "
                   "speedups imply 1.79/1.63 = 1.10×)"),
        Comparison("DASH Fig. 9(b)", "geomean E2E reduction of DASH vs RelayOnly (paired ratios)", "−40.1 %",
                   f"−{er:.1%}", "1 − geomean(E2E ratio)"),
        Comparison("DASH Fig. 9(b)", "geomean E2E reduction of DASH vs DirectOnly", "−35.6 %", f"−{ed:.1%}",
                   "as for the throughput"),
        Comparison("DASH Fig. 9(b)", "E2E reduction vs RelayOnly by workload (geomean over models)",
                   "larger for 512/20K and 20K/20K than for 4K/16",
                   ", ".join(f"{w} −{v:.1%}" for w, v in by_workload.items()),
                   "a long decode repeats the expert reads that DASH speeds up most; a 4K prefill is partly "
                   "compute-bound (prefill_share column)" + _hbm_bound_note(dash)),
        Comparison("DASH §VI-B", "workloads within each model's context window", "20 combinations; Grok-1 only "
                   "512/16 and 4K/16", f"{len(dash)} combinations; Grok-1: {', '.join(grok)}",
                   f"windows (tokens) from each model's configuration: {windows}"),
    ]
    paper = [r for r in everything if r["reading"] == ds.PAPER.name]
    if paper:
        (pr, pw, pe), (pd_, _, pde) = ratios("relay-only", paper), ratios("direct-only", paper)
        out.append(Comparison(
            "DASH Fig. 9(b)", f"reading '{ds.PAPER.name}' (the {len(paper) // len(ds.ORGANISATIONS)} combinations "
            "without overflow): DASH over RelayOnly, DirectOnly (decode-phase rate); E2E reductions",
            "1.79×, 1.63×; −40.1 %, −35.6 %", f"{pr:.2f}×, {pd_:.2f}×; −{pe:.1%}, −{pde:.1%}",
            "the arrays limit each path alone, no kernel-launch cost, every prompt in one pass (Fig. 9(a)'s "
            "readings); the literal rows above"))
    over = {r["workload"]: r for r in rows if r["workload"] == "4K/1M"}
    if over:
        mine = [r for r in rows if r["workload"] == "4K/1M"]
        dr1, wr1, er1 = ratios("relay-only", mine)
        d1 = next(r for r in mine if r["system"] == "dash")
        out += [
            Comparison("DASH Fig. 9(b)", "Llama 4 Maverick 4K/1M: DASH over RelayOnly (throughput, E2E)",
                       "1.92×, −48.0 %", f"{dr1:.2f}× decode-phase rate ({wr1:.2f}× whole-run), −{er1:.1%}",
                       f"one stream, {d1['iterations']:,.0f} iterations per organisation; attention over the growing "
                       f"context is {d1['decode_attention_share']:.0%} of a mid-decode DASH iteration, the experts "
                       f"{d1['decode_expert_share']:.0%}: DASH's gain is mostly its two paths reading HBF-resident KV "
                       f"(capped by the arrays at {ds.expert_cap_ratio():.2f}× one path); {_kv_note(d1)}"),
            Comparison("DASH Fig. 9(b)", "Llama 4 Maverick 4K/1M KV cache", "197.413 GB",
                       f"{d1['kv_bytes'] / 1e9:.3f} GB", "(4,096 + 10^6) tokens × 196,608 B per token (48 layers × "
                       "8 KV heads × 128 × 2 (K, V) × 2 B)"),
        ]
    return out
