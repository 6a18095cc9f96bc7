"""DASH §VI-H: HBF lifetime = C_KV·E_SLC / (A_W·R_HBF·u) with R_HBF, the KV write rate into HBF,
measured from a serving run: Qwen3-235B-A22B backlogged on DASH (the sustained peak, §VI-E's batcher).

Inputs (the section's prose is not in the copy of the paper we hold, only the formula, so each is
hbfjax's choice, stated): C_KV = the DASH package's HBF capacity less the model's weights held in HBF
(experts, and the replicated dense weights); E_SLC = the preset's 100K P/E cycles per block;
A_W = 1 (page waves appended to KV-only blocks freed whole; the GC figure gc_waf_spare measures what
mixing lifetimes costs); u the fraction of time serving, swept.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _dash_serving as ds
from hbfjax.workload import models
from experiments.common import Comparison, Context, cached_table, fmt_ci, save_figure
from hbfjax.flash.erase import endurance
from hbfjax.hardware import preset
from hbfjax.memory import organisations as orgs
from hbfjax.serve import report, systems
from hbfjax.stats import mean_ci95
from hbfjax.sweep import families, load

TITLE = "DASH §VI-H — HBF lifetime from the measured KV write rate (Qwen3-235B-A22B, backlogged, DASH)"
NAME = "dash_lifetime"
MODEL = "qwen3-235b-a22b"
PROMPT, OUTPUT, SLOTS = 4096, 128, 32  # DASH §VI-E
WARMUP, MEASURED = 128, 1024  # as fig_dash_table3_p90's backlogged runs, whose compilation this one shares
MAX_STREAMS = 2  # the backlogged run is deterministic (balanced routing, fixed lengths): a second stream confirms it
A_W = (1.0, 1.5, 2.0, 3.0)
U = (0.25, 0.5, 0.75, 0.9, 1.0)


def _size(ctx: Context) -> tuple[int, int, int]:
    return (2, 4, 16) if ctx.tiny else (min(ctx.streams, MAX_STREAMS), WARMUP, MEASURED)  # = Table III's sizes


def kv_capacity_bytes() -> float:
    """C_KV: DASH's HBF bytes less the model weights placed in HBF (orgs.tier_bytes of DASH's placement)."""
    org = orgs.dash()
    m = models.preset(MODEL)
    kinds = np.zeros(len(orgs.KINDS))
    kinds[orgs.DENSE_WEIGHTS] = m.non_expert_weight_bytes
    kinds[orgs.EXPERT_WEIGHTS] = m.expert_weight_bytes
    hbf_weights = float(orgs.tier_bytes(kinds, org)[orgs.HBF])
    return float(orgs.capacity_bytes(org)[orgs.HBF]) - hbf_weights


def _compute(ctx: Context) -> pd.DataFrame:
    streams, warmup, measured = _size(ctx)
    fam = systems.single("dash", ds.scenario(MODEL, PROMPT, OUTPUT, slots=SLOTS, requests=warmup + measured,
                                             arrivals="poisson", routing="balanced"))
    cfg = load.backlogged_config(fam.config)
    point = load.backlogged_knobs(fam.points[0], cfg)
    (out,) = families.run_outputs(fam._replace(config=cfg, points=(point,)), streams, ctx.seed)
    t = report.request_times(out)
    rate, rate_ci = mean_ci95(load.completion_rate_per_s(np.where(t.valid, t.finish_s, np.inf), warmup, measured))
    m = models.preset(MODEL)
    prefill_bytes = PROMPT * m.kv_bytes_per_token_layer * m.layers  # prefill KV written straight to HBF
    tot = ds.totals(out)
    measured_rate = (tot["prefill_write_bytes"] + tot["writeback_bytes"]) / ds.run_seconds(out)
    return pd.DataFrame([{"streams": streams, "completion_rate_per_s": float(rate), "ci95_completion_rate_per_s":
                          float(rate_ci), "prefill_kv_bytes_per_request": prefill_bytes,
                          "r_hbf_expected_bytes_per_s": float(rate) * prefill_bytes,
                          "r_hbf_measured_bytes_per_s": measured_rate, "run_s": ds.run_seconds(out),
                          "kv_capacity_bytes": kv_capacity_bytes(), "overflow": bool(np.any(out.overflow)), **tot}])


def run(ctx: Context) -> list[Comparison]:
    streams, warmup, measured = _size(ctx)
    table = cached_table(ctx, NAME, {"model": MODEL, "prompt": PROMPT, "output": OUTPUT, "warmup": warmup,
                                     "measured": measured, "max_streams": MAX_STREAMS}, lambda: _compute(ctx))
    row = table.iloc[0]
    pe = preset("dash").hbf.pe_cycles
    measured_ok = np.isfinite(row.r_hbf_measured_bytes_per_s) and row.r_hbf_measured_bytes_per_s > 0
    r_hbf = row.r_hbf_measured_bytes_per_s if measured_ok else row.r_hbf_expected_bytes_per_s
    years = lambda a, u, r=r_hbf: endurance.dash_lifetime(row.kv_capacity_bytes, pe, a, r, u)["lifetime_years"]  # noqa: E731
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for a in A_W:
        ax.plot(U, [years(a, u) for u in U], "o-", label=f"A_W = {a:g}")
    ax.set_xlabel("u, fraction of time serving at the backlogged rate")
    ax.set_ylabel("HBF lifetime (years)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    src = "measured (ServeOutput.totals)" if measured_ok else "expected: completions × prefill KV (totals pending)"
    ax.set_title(f"R_HBF = {r_hbf / 1e9:.2f} GB/s {src}; C_KV = {row.kv_capacity_bytes / 1e9:.0f} GB, "
                 f"E_SLC = {pe:,}", fontsize=8)
    save_figure(fig, ctx, NAME)
    return [
        Comparison("DASH §VI-H", "HBF KV write rate R_HBF, measured (GB/s)", "not in the text we hold",
                   f"{row.r_hbf_measured_bytes_per_s / 1e9:.3f}",
                   "(prefill_write_bytes + writeback_bytes) / run span, from ServeOutput.totals"),
        Comparison("DASH §VI-H", "R_HBF expected: backlogged completions × 4,096-token prefill KV (GB/s)", "—",
                   f"{fmt_ci(row.completion_rate_per_s, row.ci95_completion_rate_per_s)} req/s × "
                   f"{row.prefill_kv_bytes_per_request / 1e6:.0f} MB = {row.r_hbf_expected_bytes_per_s / 1e9:.3f}",
                   "decode KV (32 × 128 tokens) stays far below the HBM decode-KV budget: no writeback"),
        Comparison("DASH §VI-H", "lifetime at A_W = 1, u = 1 (years)", "not in the text we hold (formula only)",
                   f"{years(1.0, 1.0):.2f}", f"C_KV = {row.kv_capacity_bytes / 1e9:.0f} GB (HBF less weights in HBF), "
                   f"E_SLC = {pe:,} (preset); R_HBF {src}"),
    ]
