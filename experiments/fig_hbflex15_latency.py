"""HBFlex Fig. 15 and the full ablation grid: TTFT and TPOT of HBFlex against FA-CLI, FA-CSI and H3 (and
every other organisation and Table 2 stage) on four models × our three real traces, replayed at their
own rate, one stream a random phase of the trace (offset replay); each (model, trace) pair's points on
common random numbers. The HBF measures of HBFlex's physics figures (Fig. 17 read-wave amplification,
Fig. 18 write stall per iteration, Fig. 19 WAF, Fig. 20 SRAM) come from the same serving runs."""

from __future__ import annotations

import jax
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _hbflex_serving as hs
from experiments.common import Comparison, Context, cached_table, save_figure

TITLE = "HBFlex Fig. 15 — TTFT/TPOT speedups of HBFlex over FA-CLI, FA-CSI and H3 (4 models × 3 real traces)"
NAME = "hbflex15_latency"
SHORT = {"deepseek-v4-pro": "DS-V4-Pro", "deepseek-v3": "DS-V3", "hunyuan": "Hunyuan", "qwen3-235b-a22b": "Qwen3-235B"}
SLOTS = 64  # running requests per package at most (HBFlex does not state its batch bound)
WARMUP, MEASURED = 16, 80  # requests per stream
MAX_CPU_STREAMS = 256  # the full grid at 256 streams fits the 20 CPU minutes (an accelerator runs --streams)
PAPER = {"fa-cli": (1.20, 1.21), "fa-csi": (1.33, 1.35), "h3": (22.65, 1.89)}  # TTFT, TPOT geomean speedups
KEYS = ("throughput_tokens_per_s", "ttft_s", "tpot_ms", "e2e_s", "mean_requests_in_system")
HBF_KEYS = ("waf", "read_wave_amplification", "write_stall_us_per_iteration", "sram_peak_bytes",
            "prefix_hit_tokens_fraction", "evicted_sessions", "gc_ms_per_iteration", "iterations_mean")


def _size(ctx: Context):
    if ctx.tiny:  # bootstrap replay: the shape Table 2's tiny run shares (one compilation)
        return 2, 2, 6, hs.MODELS[1:2], ("swebench",), ("hbflex", "naive-hbf", "h3")
    streams = ctx.streams if jax.default_backend() != "cpu" else min(ctx.streams, MAX_CPU_STREAMS)
    return streams, WARMUP, MEASURED, hs.MODELS, tuple(hs.TRACES), hs.ORGANISATIONS


def _compute(ctx: Context) -> pd.DataFrame:
    streams, warmup, measured, models, trace_keys, points = _size(ctx)
    rows = []
    for model in models:
        for key in trace_keys:  # one compilation per model: the trace is an input
            inputs = hs.trace_inputs(key, warmup + measured)
            fam = hs.family(points, hs.scenario(model, inputs, slots=SLOTS, requests=warmup + measured,
                                                replay="bootstrap" if ctx.tiny else "offset", warmup=warmup))
            for name, s in zip(points, hs.summaries(fam, hs.run(fam, streams, ctx.seed))):
                rows.append({"model": model, "trace": key, "point": name, "streams": streams,
                             **hs.row(s, KEYS), **{k: s[k] for k in HBF_KEYS}, "overflow": s["overflow"]})
    return pd.DataFrame(rows)


def speedups(table: pd.DataFrame, baseline: str, metric: str) -> pd.Series:
    """Per (model, trace): baseline's metric over HBFlex's (a latency: > 1 means HBFlex is faster)."""
    t = table.set_index(["model", "trace", "point"])[metric].unstack("point")
    return t[baseline] / t["hbflex"]


def geomean(x) -> float:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.exp(np.mean(np.log(x)))) if x.size else float("nan")


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    baselines = [b for b in ("fa-cli", "fa-csi", "h3", "is", "naive-hbf") if b in set(table.point)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    pairs = table[["model", "trace"]].drop_duplicates().values.tolist()
    labels = [f"{SHORT.get(m, m)}/{t}" for m, t in pairs]
    width = 0.8 / max(len(baselines), 1)
    for ax, metric, title in ((axes[0], "ttft_s", "TTFT speedup of HBFlex"), (axes[1], "tpot_ms", "TPOT speedup of HBFlex")):
        for j, b in enumerate(baselines):
            s = speedups(table, b, metric)
            vals = [s.get((m, t), np.nan) for m, t in pairs]
            ax.bar(np.arange(len(pairs)) + (j - (len(baselines) - 1) / 2) * width, vals, width, label=f"vs {b}")
        ax.set_yscale("log")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(pairs)), labels, rotation=60, fontsize=7, ha="right")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    save_figure(fig, ctx, NAME)


def _stand_in_note() -> str:
    return "traces: " + ", ".join(f"{k} for {v}" for k, v in hs.STANDS_IN_FOR.items()) + " (no Bailian trace here)"


def _per_trace(table, baseline: str, metric: str) -> str:
    return ", ".join(f"{k} {geomean(speedups(table[table.trace == k], baseline, metric)):.2f}×"
                     for k in dict.fromkeys(table.trace))


def _notes(table) -> dict[str, str]:
    """Why each baseline's gap is what it is, from the table itself."""
    bandwidth = {"fa-cli": "2.44 TB/s of HBF (5 stacks) beside 0.8 TB/s of HBM", "fa-csi": "2.20 TB/s of HBF (¾ of 6 stacks)",
                 "h3": "2.20 TB/s of HBF (¾ of 6 stacks)"}
    h3 = table[table.point == "h3"]
    worst = h3.loc[h3.ttft_s.idxmax()] if len(h3) else None
    common = (f"{table.model.nunique()} models × {table.trace.nunique()} traces replayed at their own rate (offset "
              f"replay, {WARMUP} + {MEASURED} requests per stream), {SLOTS} slots; "
              f"{hs.deployment_note(dict.fromkeys(table.model))}; {_stand_in_note()}")
    notes = {}
    for b in (b for b in PAPER if b in set(table.point)):
        notes[b] = (f"{common}; per trace TTFT {_per_trace(table, b, 'ttft_s')}, TPOT {_per_trace(table, b, 'tpot_ms')}; "
                    f"every iteration with a prefill chunk streams nearly all expert weights, so TPOT follows the HBF "
                    f"read bandwidth: HBFlex's 2.93 TB/s against {bandwidth[b]}")
    if worst is not None:
        notes["h3"] += (f"; H3's 36 GB of HBM KV binds only where a trace loads the queue (largest: {worst.model} on "
                        f"{worst.trace}, TTFT {worst.ttft_s:.0f} s, {worst.mean_requests_in_system:.0f} requests in the "
                        "system): the paper's 22.65× TTFT is admission queueing under the Bailian traces' KV pressure, "
                        "which our traces at their own rates do not reach, and H3's smaller batches then decode faster "
                        "there (TPOT below HBFlex's)")
    return notes


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"slots": SLOTS, "warmup": WARMUP, "measured": MEASURED, "points": hs.ORGANISATIONS,
                                     "models": hs.MODELS, "traces": hs.TRACES, "tensor_parallel": hs.TENSOR_PARALLEL},
                         lambda: _compute(ctx))
    _plot(table, ctx)
    notes = _notes(table)
    rows = []
    for b, (p_ttft, p_tpot) in PAPER.items():
        if b not in set(table.point):
            continue
        ttft, tpot = geomean(speedups(table, b, "ttft_s")), geomean(speedups(table, b, "tpot_ms"))
        rows.append(Comparison("HBFlex Fig. 15", f"geomean TTFT / TPOT speedup of HBFlex over {b}",
                               f"{p_ttft:.2f}× / {p_tpot:.2f}×", f"{ttft:.2f}× / {tpot:.2f}×", notes[b]))
    for point, label in (("naive-hbf", "naive HBF"), ("hbflex", "HBFlex")):
        part = table[table.point == point]
        if len(part):
            rows.append(Comparison("HBFlex Fig. 17 (in serving)", f"read-wave amplification, {label}",
                                   "5.97× (random)" if point == "naive-hbf" else "2.25× (balanced + runtime)",
                                   f"{part.read_wave_amplification.mean():.2f}×",
                                   "per pass, one scheduling wave of the layers' HBF KV read drawn from the package's "
                                   "tabulated wave law; waves over the ideal, mean over the grid; small active sets "
                                   "(Azure code: short contexts) give partial waves, which amplify less"))
            rows.append(Comparison("HBFlex Fig. 18 (in serving)", f"write stall per iteration, {label}",
                                   "4.54 ms (immediate)" if point == "naive-hbf" else "≈ 0.003 µs (window-aware)",
                                   f"{part.write_stall_us_per_iteration.mean():.3g} µs",
                                   "immediate: one tPROG per layer (61–94 layers); window-aware: forced writebacks where "
                                   "the prefetch groups (75–112 MB) and offloaded pages leave little of the 240 MB SRAM"
                                   if point == "hbflex" else "one tPROG (75 µs) per layer and pass"))
    hb = table[table.point == "hbflex"]
    rows.append(Comparison("HBFlex Fig. 20 (in serving)", "peak SRAM per stack, HBFlex (prefetch + KV buffer + offload)",
                           "6–12 MB offload at 10 % (of 40 MB)", f"{hb.sram_peak_bytes.max() / 6e6:.1f} MB at most",
                           "prefetch groups dominate: one routed expert or a layer's Q projections (HBFlex §5.3)"))
    return rows
