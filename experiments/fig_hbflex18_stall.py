"""HBFlex Fig. 18: write-induced critical-path stall per iteration — immediate, stripe, window-aware."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table, fmt_ci, save_figure
from hbfjax import batch, traces
from hbfjax.flash import scenarios as sc
from hbfjax.flash import writeback as wb
from hbfjax.stats import mean_ci95

TITLE = "HBFlex Fig. 18 — write-induced stall per iteration: immediate → stripe → window-aware"
NAME = "hbflex18_stall"
TRACE = "swebench_miniswe_agent.csv"
DECODE_REQUESTS = (32, 64, 128, 256)  # running decode requests per GPU (SWE-bench concurrency levels)
CHUNK = 512
ITERATIONS, WARMUP = 40, 8
POLICIES = {"immediate": ("immediate", 32), "stripe (G=32)": ("stripe", 32), "stripe (G=256)": ("stripe", 256),
            "window-aware": ("window", 32)}
PAPER_US = {"immediate": 4540.0, "stripe": 69.12, "window": 0.003}


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
    rows = []
    for label, (policy, g) in POLICIES.items():
        points = []
        for r in DECODE_REQUESTS:
            chunk, prob = workload(r, ratio)
            points.append(sc.hbflex_knobs(r, chunk, prob, stripe_pages=g)[0])
        cfg = sc.config_for(points[0], policy, ITERATIONS, WARMUP)
        out = batch.run(wb.stream_fn, ctx.streams, ctx.seed, batch.stack_knobs(points), cfg, knob_axis=True)
        for j, r in enumerate(DECODE_REQUESTS):
            stall, ci = mean_ci95(out["stall_us_per_iteration"][:, j])
            busy, _ = mean_ci95(out["program_busy_us_per_iteration"][:, j])
            rows.append({"policy": label, "decode_requests": r, "prefill_prob": workload(r, ratio)[1],
                         "stall_us": stall, "ci95_us": ci, "program_busy_us": busy,
                         "iteration_us": float(out["iteration_us"][:, j].mean()),
                         "forced_writebacks_per_iteration": float(out["forced_writebacks"][:, j].mean())
                         / (ITERATIONS - WARMUP),
                         "buffer_peak_bytes": float(out["buffer_peak_bytes"][:, j].max())})
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"decode_requests": DECODE_REQUESTS, "iterations": ITERATIONS,
                                     "policies": list(POLICIES), "trace": TRACE}, lambda: _compute(ctx))
    fig, ax = plt.subplots(figsize=(7.5, 4))
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
                ha="right", color=style)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, 3e4)
    ax.set_xticks(x, [str(r) for r in DECODE_REQUESTS])
    ax.set_xlabel("running decode requests per GPU (prefill rate from the SWE-bench trace)")
    ax.set_ylabel("exposed stall per iteration (µs, log)")
    ax.set_title("DeepSeek-V4-Pro-like, 61 layers, tPROG 75 µs; zero drawn at 1e-3 µs", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4)
    save_figure(fig, ctx, NAME)

    def avg(label):
        part = table[table.policy == label]
        return fmt_ci(part.stall_us.mean(), float(np.sqrt((part.ci95_us**2).sum()) / len(part)))

    forced = table[table.policy == "window-aware"].forced_writebacks_per_iteration.mean()
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
    ]
