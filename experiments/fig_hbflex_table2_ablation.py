"""HBFlex Table 2 (§6.3) and Fig. 19 in serving: cumulative HBFlex techniques on Naive HBF's package —
+ plane-balanced placement and runtime read balancing, + window-aware writeback, + lifetime-aware
reclamation — served on SWE-bench sessions at high concurrency (bootstrap replay), throughput normalised
to Naive HBF; WAF, read-wave amplification and write stall of each stage from the same runs."""

from __future__ import annotations

import dataclasses

import jax
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _hbflex_serving as hs
from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax.memory import hbf_packages
from hbfjax.workload import models

TITLE = "HBFlex Table 2 — cumulative ablation on SWE-bench at high concurrency; Fig. 19 WAF in serving"
NAME = "hbflex_table2_ablation"
MODELS = ("deepseek-v3", "qwen3-235b-a22b")  # the models Table 2 reports
TRACE = "swebench"
CONCURRENCY = 1024  # open sessions per GPU: HBFlex §6.3's 4,096 tasks over four data-parallel GPUs
SLOTS = 64
WARMUP, MEASURED = 32, 224
ROOM_TOKENS = 150_000  # HBF KV room per package in tokens (scaled, see _room_note): above the longest request (36,375)
MAX_CPU_STREAMS = 64
STAGES = ("naive-hbf", "+placement+balancing", "+writeback", "+lifetime packing", "+reclamation")
TABLE_STAGES = ("+placement+balancing", "+writeback", "+reclamation")  # the columns Table 2 reports
PAPER = {"deepseek-v3": (4.08, 4.10, 4.15), "qwen3-235b-a22b": (4.25, 4.27, 4.32)}  # cumulative, × naive
PAPER_WAF = (11.98, 1.24, 1.04)  # Fig. 19: baseline, + lifetime packing, + deferred reclamation


def _size(ctx: Context):
    if ctx.tiny:
        return 2, 2, 6, MODELS[:1]
    streams = ctx.streams if jax.default_backend() != "cpu" else min(ctx.streams, MAX_CPU_STREAMS)
    return streams, WARMUP, MEASURED, MODELS


def _compute(ctx: Context) -> pd.DataFrame:
    streams, warmup, measured, model_names = _size(ctx)
    stages = hbf_packages.ablation_stages()
    # Fig. 19's middle bar: lifetime packing without deferred reclamation (GC at the eviction threshold)
    stages["+lifetime packing"] = hbf_packages.PolicyKnobs(**{**vars(stages["+reclamation"]),
                                                              "gc_trigger": stages["+reclamation"].evict_threshold})
    rows = []
    for model in model_names:
        inputs = hs.trace_inputs(TRACE, warmup + measured)
        spec = models.preset(model).with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
        room = ROOM_TOKENS * spec.kv_bytes_per_token
        # each stage is a policy on HBFlex's package: knob points of HBFlex's family
        base = hs.family(["hbflex"], hs.scenario(model, inputs, slots=SLOTS, requests=warmup + measured,
                                                 replay="bootstrap", concurrency=CONCURRENCY, kv_room_bytes=room,
                                                 warmup=warmup))
        points = [dataclasses.replace(base.points[0], policy=stages[s]) for s in STAGES]
        fam = base.with_points(points, STAGES)
        for name, s in zip(STAGES, hs.summaries(fam, hs.run(fam, streams, ctx.seed))):
            rows.append({"model": model, "stage": name, "streams": streams, "room_gb": room / 1e9,
                         **hs.row(s, ("throughput_tokens_per_s", "ttft_s", "tpot_ms")),
                         **{k: s[k] for k in ("waf", "read_wave_amplification", "write_stall_us_per_iteration",
                                              "gc_ms_per_iteration", "evicted_sessions", "prefix_hit_tokens_fraction",
                                              "sram_peak_bytes", "iterations_mean", "kv_read_stall_fraction")},
                         "overflow": s["overflow"]})
    table = pd.DataFrame(rows)
    base = table[table.stage == "naive-hbf"].set_index("model").throughput_tokens_per_s
    table["speedup"] = table.throughput_tokens_per_s / table.model.map(base)
    return table


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, model in enumerate(dict.fromkeys(table.model)):
        t = table[table.model == model].set_index("stage").loc[list(STAGES)]
        x = np.arange(len(STAGES)) + (i - 0.5) * 0.4
        axes[0].bar(x, t.speedup, 0.4, label=model)
        axes[1].bar(x, t.waf, 0.4, label=model)
    for ax, label in ((axes[0], "throughput / Naive HBF"), (axes[1], "WAF (GC)")):
        ax.set_xticks(np.arange(len(STAGES)), STAGES, rotation=20, fontsize=7)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    save_figure(fig, ctx, NAME)


def _gain_note(t) -> str:
    """Why placement and balancing gain little here: the share of the busy time that amplification adds."""
    naive, full = t.loc["naive-hbf"], t.loc["+reclamation"]
    return (f"amplification {naive.read_wave_amplification:.2f}× → {full.read_wave_amplification:.2f}× adds "
            f"{naive.kv_read_stall_fraction:.1%} → {full.kv_read_stall_fraction:.1%} of the busy time (each iteration "
            "with a prefill chunk streams nearly all expert weights at 2.93 TB/s, which dominates at 64 slots); naive's "
            f"immediate writes stall {naive.write_stall_us_per_iteration / 1e3:.1f} ms a pass; the paper's ≥ 4× needs "
            "KV reads and writes to dominate, at batches of its 4,096 tasks over four GPUs (its batch bound is not stated); "
            "and even then the paper's own Fig. 17 amplifications (5.97× random → 2.25× HBFlex) cap a read-bound speedup "
            "at 5.97 / 2.25 = 2.65×, so the rest of its 4.08–4.32× must come from naive's immediate block-first writes "
            "serialising on one plane (not modelled yet: our naive places pages randomly) — this table is still the "
            "open-loop replay in 64 slots; the closed loop at 1,024 tasks is Fig. 16's")


def _room_note(table) -> str:
    return (f"SWE-bench sessions resampled at {CONCURRENCY} open sessions per GPU, {SLOTS} slots; the HBF KV room "
            f"is scaled to {ROOM_TOKENS / 1e3:.0f} K tokens ({', '.join(f'{g:.0f} GB' for g in dict.fromkeys(table.room_gb))}) "
            "so that a run of a few hundred requests evicts and collects as the paper's long runs fill 2.6 TB")


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"models": MODELS, "concurrency": CONCURRENCY, "slots": SLOTS, "warmup": WARMUP,
                                     "measured": MEASURED, "room_tokens": ROOM_TOKENS}, lambda: _compute(ctx))
    _plot(table, ctx)
    rows = []
    for model in dict.fromkeys(table.model):
        t = table[table.model == model].set_index("stage")
        paper = PAPER[model]
        for stage, p in zip(TABLE_STAGES, paper):
            rows.append(Comparison("HBFlex Table 2", f"{model}: throughput × Naive HBF, {stage}", f"{p:.2f}×",
                                   f"{t.loc[stage, 'speedup']:.2f}×", _gain_note(t) + "; " + _room_note(table)))
    waf = table.groupby("stage").waf.mean()
    for (stage, label), p in zip((("+writeback", "baseline: interleaved blocks"), ("+lifetime packing", "+ lifetime packing"),
                                  ("+reclamation", "+ deferred reclamation (GC at 95 %, eviction at 90 %)")), PAPER_WAF):
        rows.append(Comparison("HBFlex Fig. 19 (in serving)", f"GC WAF, {label} ({stage})", f"{p:.2f}×",
                               f"{waf.get(stage, np.nan):.2f}×", "scaled block store (1,024 × 32 pages per stream "
                               f"standing for the KV room; naive HBF: {waf.get('naive-hbf', np.nan):.2f}×, "
                               f"{table.evicted_sessions.mean():.0f} sessions evicted per stream); a session's pages die "
                               "together at its eviction, least recently used first, which follows the order they were "
                               "written, so greedy GC finds wholly stale blocks; the paper's 11.98× needs pages of one "
                               "block to die at different times (we do not invalidate the diverged tail of a reused entry "
                               "apart from its session; Fig. 19's physics figure, hbflex19_waf, mixes lifetimes and "
                               "gives 2.82 → 1.98); " + _room_note(table)))
    amp = table.groupby("stage").read_wave_amplification.mean()
    rows.append(Comparison("HBFlex Fig. 17 (in serving)", "read-wave amplification, naive → HBFlex",
                           "5.97× → 2.25×", f"{amp.get('naive-hbf', np.nan):.2f}× → {amp.get('+reclamation', np.nan):.2f}×",
                           "one scheduling wave drawn per pass"))

    return rows
