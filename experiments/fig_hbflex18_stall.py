"""HBFlex Fig. 18: write-induced critical-path stall per iteration — immediate, stripe, window-aware."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table, fmt_ci, save_figure
from hbfjax import batch, traces
from hbfjax.serve import write_scenarios as sc
from hbfjax.flash.programs import writeback as wb
from hbfjax.stats import mean_ci95

TITLE = "HBFlex Fig. 18 — write-induced stall per iteration: immediate → stripe → window-aware"
NAME = "hbflex18_stall"
TRACE = "swebench_miniswe_agent.csv"
DECODE_REQUESTS = (32, 64, 128, 256)  # running decode requests per GPU (SWE-bench concurrency levels)
CHUNK = 512
ITERATIONS, WARMUP = 24, 4
POLICIES = {"immediate": ("immediate", 32), "stripe (G=32)": ("stripe", 32), "stripe (G=256)": ("stripe", 256),
            "window-aware": ("window", 32)}
PAPER_US = {"immediate": 4540.0, "stripe": 69.12, "window": 0.003}
SRAM_SWEEP_MB = (71.0, 4.0, 1.0, 0.5, 0.25, 0.13)  # window-aware SRAM KV budget sweep at SWEEP_REQUESTS
SWEEP_REQUESTS = 32  # decode windows (≈46 µs) < tPROG: only prefill iterations drain


def prefill_tokens_per_decode_token() -> float:
    """New prompt tokens per generated token in the SWE-bench trace (prefix reuse removed)."""
    t = traces.load_trace(TRACE)
    return float(np.clip(t.input_tokens - t.prefix_tokens, 0, None).sum() / t.output_tokens.sum())


def workload(r: float, ratio: float) -> tuple[float, float]:
    """(prefill chunk tokens, probability) so that prefill keeps pace with decode: r·ratio tokens per iteration
    on average, in chunks of at least CHUNK tokens."""
    need = r * ratio
    return max(CHUNK, need), min(1.0, need / CHUNK)


def _compute(ctx: Context) -> pd.DataFrame:
    ratio = prefill_tokens_per_decode_token()
    streams, (iterations, warmup) = (2, (6, 2)) if ctx.tiny else (ctx.streams, (ITERATIONS, WARMUP))
    rows = []
    for label, (policy, g) in POLICIES.items():
        points = []
        for r in DECODE_REQUESTS:
            chunk, prob = workload(r, ratio)
            points.append(sc.hbflex_knobs(r, chunk, prob, stripe_pages=g))
        cfg = sc.config_for(points[0], policy, iterations, warmup)
        out = batch.run(wb.simulate, streams, ctx.seed, batch.stack_knobs(points), cfg, knob_axis=True)
        for j, r in enumerate(DECODE_REQUESTS):
            stall, ci = mean_ci95(out.stall_us_per_iteration[:, j])
            busy, _ = mean_ci95(out.program_busy_us_per_iteration[:, j])
            rows.append({"policy": label, "decode_requests": r, "prefill_prob": workload(r, ratio)[1],
                         "stall_us": stall, "ci95_us": ci, "program_busy_us": busy,
                         "iteration_us": float(out.iteration_us[:, j].mean()),
                         "forced_writebacks_per_iteration": float(out.forced_writebacks[:, j].mean())
                         / (iterations - warmup),
                         "buffer_peak_bytes": float(out.buffer_peak_bytes[:, j].max())})
    # window-aware with a shrinking SRAM KV budget: zero stall while windows suffice, then forced writebacks
    chunk, prob = workload(SWEEP_REQUESTS, ratio)
    points = [sc.hbflex_knobs(SWEEP_REQUESTS, chunk, prob, sram_kv_bytes=mb * 1e6) for mb in SRAM_SWEEP_MB]
    cfg = sc.config_for(points[0], "window", iterations, warmup)
    out = batch.run(wb.simulate, streams, ctx.seed, batch.stack_knobs(points), cfg, knob_axis=True)
    for j, mb in enumerate(SRAM_SWEEP_MB):
        stall, ci = mean_ci95(out.stall_us_per_iteration[:, j])
        rows.append({"policy": "window-aware SRAM sweep", "decode_requests": SWEEP_REQUESTS, "prefill_prob": prob,
                     "sram_mb": mb, "stall_us": stall, "ci95_us": ci,
                     "program_busy_us": float(out.program_busy_us_per_iteration[:, j].mean()),
                     "iteration_us": float(out.iteration_us[:, j].mean()),
                     "forced_writebacks_per_iteration": float(out.forced_writebacks[:, j].mean())
                     / (iterations - warmup),
                     "buffer_peak_bytes": float(out.buffer_peak_bytes[:, j].max())})
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"decode_requests": DECODE_REQUESTS, "iterations": ITERATIONS,
                                     "policies": list(POLICIES), "trace": TRACE, "sram_sweep_mb": SRAM_SWEEP_MB},
                         lambda: _compute(ctx))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1.6, 1]})
    labels = list(POLICIES)
    x = np.arange(len(DECODE_REQUESTS))
    width = 0.8 / len(labels)
    floor = 1e-3  # a zero stall drawn at the axis floor (log scale)
    for i, label in enumerate(labels):
        part = table[table.policy == label].sort_values("decode_requests")
        ax.bar(x + (i - (len(labels) - 1) / 2) * width, np.maximum(part.stall_us, floor), width,
               yerr=part.ci95_us, label=label, color=f"C{i}")
    for key, style in zip(PAPER_US, ("C0", "C1", "C3")):
        ax.axhline(PAPER_US[key], ls=":", color=style, lw=1.2)
        ax.text(len(x) - 0.45, PAPER_US[key] * 1.15, f"paper {key}: {PAPER_US[key]:g} µs", fontsize=7,
                ha="right", color=style, bbox=dict(fc="white", ec="none", alpha=0.8, pad=1))
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, 3e4)
    ax.set_xticks(x, [str(r) for r in DECODE_REQUESTS])
    ax.set_xlabel("running decode requests per GPU (prefill rate from the SWE-bench trace)")
    ax.set_ylabel("exposed stall per iteration (µs, log)")
    ax.set_title("DeepSeek-V4-Pro-like, 61 layers, tPROG 75 µs; zero drawn at 1e-3 µs", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4)
    sweep = table[table.policy == "window-aware SRAM sweep"].sort_values("sram_mb")
    ax2.errorbar(sweep.sram_mb, np.maximum(sweep.stall_us, floor), yerr=sweep.ci95_us, fmt="o-", color="C3",
                 label="window-aware stall")
    ax2.axhline(PAPER_US["window"], ls=":", color="C3", lw=1.2, label="paper window: 0.003 µs")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_ylim(floor / 2, 3e4)
    ax2.set_xlabel("SRAM budget for buffered KV (MB, log)")
    ax2.set_ylabel("exposed stall per iteration (µs, log)")
    for _, r in sweep.iterrows():
        ax2.annotate(f"{r.forced_writebacks_per_iteration:.2g} forced/it", (r.sram_mb, max(r.stall_us, floor)),
                     textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax2.set_title(f"window-aware at {SWEEP_REQUESTS} requests: stall once the SRAM overflows", fontsize=9)
    ax2.legend(fontsize=8, loc="upper right")
    save_figure(fig, ctx, NAME)

    def avg(label):
        part = table[table.policy == label]
        return fmt_ci(part.stall_us.mean(), float(np.sqrt((part.ci95_us**2).sum()) / len(part)))

    forced = table[table.policy == "window-aware"].forced_writebacks_per_iteration.mean()
    sweep = table[table.policy == "window-aware SRAM sweep"]
    zero_down_to = sweep[sweep.stall_us == 0].sram_mb.min()
    return [
        Comparison("HBFlex Fig. 18", "immediate stall per iteration (µs), mean over 4 loads", "4.54 ms",
                   avg("immediate"),
                   "one program per layer right before the KV read: ≈ 61 × tPROG; paper averages Bailian + SWE-bench"),
        Comparison("HBFlex Fig. 18", "stripe stall per iteration (µs), G = 32 pages", "69.12 µs", avg("stripe (G=32)"),
                   "each full stripe stalls the next read ≈ tPROG; stall ∝ new KV / stripe size — the paper's "
                   "stripe width is not stated; G = 256 pages gives " + avg("stripe (G=256)")),
        Comparison("HBFlex Fig. 18", "window-aware stall per iteration (µs)", "≈0.003 µs", avg("window-aware"),
                   f"no forced writeback at a 71 MB SRAM KV budget ({forced:.3g} per iteration); the paper's small "
                   "residue comes from rare forced writebacks on Bailian traces we do not have"),
        Comparison("HBFlex §5.3", "smallest SRAM KV budget with zero window stall (MB, 32 requests)",
                   "forced writeback when SRAM overflows", f"{zero_down_to:g} MB",
                   f"sweep points {SRAM_SWEEP_MB} MB; peak buffered KV at 71 MB: "
                   f"{sweep[sweep.sram_mb == max(SRAM_SWEEP_MB)].buffer_peak_bytes.iloc[0] / 1e6:.1f} MB; below, "
                   "each forced writeback exposes ≈ tPROG (right panel)"),
    ]
