"""HBFlex Fig. 13c: decode tokens accumulated between consecutive prefill opportunities (SWE-bench replay).

A small iteration-level replay (``hbfjax.workload.replay.session_replay``; the serving engine is a later
issue): C concurrent agent tasks per GPU, each replaying SWE-bench sessions turn by turn, prefilled in
512-token chunks and then decoding one token per iteration. An iteration
with any prefill chunk is a prefill opportunity (HBFlex §5.3); the decode tokens produced since the
previous one is what the SRAM must buffer under window-aware writeback.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax import traces
from hbfjax.serve import write_scenarios as sc
from hbfjax.workload.replay import session_replay

TITLE = "HBFlex Fig. 13c — decode tokens between consecutive prefill opportunities (SWE-bench replay)"
NAME = "hbflex13c_decode_tokens"
TRACE = "swebench_miniswe_agent.csv"
CONCURRENCY = (16, 64, 256, 1024)  # agent tasks per GPU (HBFlex §6.3: 4,096 tasks over 4 GPUs)
ITERATION_S = 0.03  # iteration time (≈ the hbflex scenario's decode iteration)
CHUNK = 512
ITERATIONS, WARMUP = 4000, 1000
THRESHOLD_TOKENS = 4096


def replay(concurrency: int, streams: int, seed: int, iterations: int = ITERATIONS, warmup: int = WARMUP) -> dict:
    """The SWE-bench session replay at this figure's settings (``hbfjax.workload.replay.session_replay``)."""
    return session_replay(traces.load_trace(TRACE), concurrency, streams, seed, iterations=iterations, warmup=warmup,
                          iteration_s=ITERATION_S, chunk_tokens=CHUNK)


def _compute(ctx: Context) -> pd.DataFrame:
    streams, size = (2, (400, 100)) if ctx.tiny else (min(ctx.streams, 32), (ITERATIONS, WARMUP))
    rows = []
    for c in CONCURRENCY:
        for s, v in enumerate(replay(c, streams, ctx.seed + 1000 * c, *size)["intervals"]):
            rows += [{"concurrency": c, "stream": s, "decode_tokens": int(x)} for x in v]
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"concurrency": CONCURRENCY, "iterations": ITERATIONS, "chunk": CHUNK,
                                     "iteration_s": ITERATION_S}, lambda: _compute(ctx))
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    fractions = {}
    for i, c in enumerate(CONCURRENCY):
        v = np.sort(table[table.concurrency == c].decode_tokens.to_numpy())
        fractions[c] = float((v < THRESHOLD_TOKENS).mean())
        ax.step(np.maximum(v, 1), np.arange(1, v.size + 1) / v.size, where="post", color=f"C{i}",
                label=f"{c} tasks/GPU ({fractions[c]:.0%} < 4K)")
    ax.axvline(THRESHOLD_TOKENS, color="k", ls="--", lw=1, label="paper: most intervals < 4K tokens")
    ax.set_xscale("log")
    ax.set_xlabel("decode tokens between consecutive prefill opportunities (all requests)")
    ax.set_ylabel("CDF over intervals")
    ax.set_title(f"SWE-bench sessions replayed, {ITERATION_S * 1e3:g} ms iterations, {CHUNK}-token chunks", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    save_figure(fig, ctx, NAME)
    allv = table.decode_tokens.to_numpy()
    p99_mb = float(np.percentile(allv, 99)) * sc.HBFLEX_KV_BYTES_PER_TOKEN / 1e6
    return [
        Comparison("HBFlex Fig. 13c", "intervals with < 4K decode tokens (fraction, all concurrencies)",
                   "most intervals", f"{(allv < THRESHOLD_TOKENS).mean():.1%}",
                   "per concurrency: " + ", ".join(f"{c}: {f:.0%}" for c, f in fractions.items())
                   + "; SWE-bench trace (chars / 4 tokens), not Bailian; simplified batching replay"),
        Comparison("HBFlex §5.3", "SRAM to buffer the 99th-percentile interval at 5 KB/token (MB)", "< 20 MB (4K tokens)",
                   f"{p99_mb:.1f}", "DeepSeek-V4-Pro ≈5 KB/token (HBFlex §5.3)"),
    ]
