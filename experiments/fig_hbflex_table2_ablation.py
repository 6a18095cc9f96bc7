"""HBFlex Table 2 (§6.3) and Fig. 19 in serving: cumulative HBFlex techniques on Naive HBF's package —
+ plane-balanced placement and runtime read balancing, + window-aware writeback, + lifetime-aware
reclamation — served to SWE-bench agent tasks in a closed loop at the real KV room (HBFlex §6.3: "4,096
concurrent SWE-bench tasks across four data-parallel GPUs", 1,024 per GPU), throughput normalised to
Naive HBF with random pages (``naive-hbf``) and, beside it, to Naive HBF with the paper's "immediate
block-first writes" (``naive-block``); WAF of the sampled planes, read-wave amplification and write
stall of each stage from the same runs."""

from __future__ import annotations

import dataclasses

import jax
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _hbflex_serving as hs
from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax.memory import hbf_packages

TITLE = "HBFlex Table 2 — cumulative ablation on SWE-bench tasks in a closed loop; Fig. 19 WAF in serving"
NAME = "hbflex_table2_ablation"
# the models Table 2 reports, and Qwen3 with INT8 weights: the precision HBFlex's capacity arithmetic implies
# for it (review 2026-12-02 §1.2; DASH's Table II gives BF16, which Fig. 15 and 16 keep)
MODELS = ("deepseek-v3", "qwen3-235b-a22b", "qwen3-235b-a22b-int8")
TRACE = "swebench"
TASKS = 1024  # agent tasks per GPU: HBFlex §6.3's 4,096 tasks over four data-parallel GPUs (a 2-core CPU runs it
#               in about 100 s at MAX_CPU_STREAMS streams; the device session, step table2, at 64)
TURNS, WARMUP_TURNS = 3, 0  # turns per task; the window opens once every task has started
MAX_CPU_STREAMS = 4
STAGES = ("naive-hbf", "naive-block", "+placement+balancing", "+writeback", "+lifetime packing", "+reclamation")
TABLE_STAGES = ("+placement+balancing", "+writeback", "+reclamation")  # the columns Table 2 reports
PAPER = {"deepseek-v3": (4.08, 4.10, 4.15), "qwen3-235b-a22b": (4.25, 4.27, 4.32),
         "qwen3-235b-a22b-int8": (4.25, 4.27, 4.32)}  # cumulative, × naive (the paper's Qwen3 row for both readings)
PAPER_WAF = (11.98, 1.24, 1.04)  # Fig. 19: baseline, + lifetime packing, + deferred reclamation
FIG17_CEILING = 5.97 / 2.25  # the paper's own Fig. 17: read amplification alone caps a read-bound speedup


def _size(ctx: Context):
    if ctx.tiny:
        return 2, 4, 2, MODELS[:1]
    if jax.default_backend() == "cpu":
        return min(ctx.streams, MAX_CPU_STREAMS), TASKS, TURNS, MODELS
    return ctx.streams, TASKS, TURNS, MODELS


def stages() -> dict:
    """Each stage's policy on HBFlex's package: Table 2's cumulative stages, naive-block's policy, and Fig. 19's
    middle bar (lifetime packing without deferred reclamation: GC at the eviction threshold)."""
    out = hbf_packages.ablation_stages()
    out["naive-block"] = hbf_packages.naive_block().policy
    out["+lifetime packing"] = hbf_packages.PolicyKnobs(**{**vars(out["+reclamation"]),
                                                           "gc_trigger": out["+reclamation"].evict_threshold})
    return out


def _compute(ctx: Context) -> pd.DataFrame:
    streams, tasks, turns, model_names = _size(ctx)
    policies = stages()
    inputs = hs.trace_inputs(TRACE, None)
    rows = []
    for model in model_names:
        sc = hs.closed_scenario(model, inputs, tasks=tasks, turns=turns, warmup_turns=WARMUP_TURNS)
        base = hs.family(["hbflex"], sc)  # each stage a policy on HBFlex's package: knob points of its family
        fam = base.with_points([dataclasses.replace(base.points[0], policy=policies[s]) for s in STAGES], STAGES)
        for name, s in zip(STAGES, hs.summaries(fam, hs.run(fam, streams, ctx.seed))):
            rows.append({"model": model, "stage": name, "streams": streams, "tasks": tasks, "slots": sc.slots,
                         **hs.row(s, ("throughput_tokens_per_s", "ttft_s", "tpot_ms")),
                         **{k: s.get(k, np.nan) for k in (
                             "waf", "host_writes", "diverged_page_fraction", "block_erases", "stalled_plane_writes",
                             "read_wave_amplification",
                             "write_stall_us_per_iteration", "gc_ms_per_iteration", "evicted_sessions",
                             "prefix_hit_tokens_fraction", "sram_peak_bytes", "iterations_mean",
                             "kv_read_stall_fraction", "mean_kv_hbf_gb", "window_requests", "window_start_s",
                             "window_end_s", "mean_requests_in_system")},
                         "overflow": s["overflow"], "saturated": s.get("saturated")})
    table = pd.DataFrame(rows)
    for ref, column in (("naive-hbf", "speedup"), ("naive-block", "speedup_vs_block")):
        base = table[table.stage == ref].set_index("model").throughput_tokens_per_s
        table[column] = table.throughput_tokens_per_s / table.model.map(base)
    return table


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(dict.fromkeys(table.model))
    width = 0.8 / len(names)
    for i, model in enumerate(names):
        t = table[table.model == model].set_index("stage").loc[list(STAGES)]
        x = np.arange(len(STAGES)) + (i - (len(names) - 1) / 2) * width
        axes[0].bar(x, t.speedup_vs_block, width, label=model)
        axes[0].plot(x, t.speedup, "_", color="k", markersize=8)
        paper = [np.nan, np.nan, PAPER[model][0], PAPER[model][1], np.nan, PAPER[model][2]]
        axes[0].plot(x, paper, "x", color="grey")
        axes[1].bar(x, t.waf, width, label=model)
    for ax, label in ((axes[0], "throughput / naive-block (bars), / naive-hbf (–), paper (×)"),
                      (axes[1], "WAF (GC, sampled planes)")):
        ax.set_xticks(np.arange(len(STAGES)), STAGES, rotation=20, fontsize=7)
        ax.set_ylabel(label, fontsize=8)
    axes[0].legend(fontsize=7)
    save_figure(fig, ctx, NAME)


def _gain_note(t) -> str:
    """What the speedup is made of: the busy time that read amplification and naive's writes add."""
    naive, block, full = t.loc["naive-hbf"], t.loc["naive-block"], t.loc["+reclamation"]
    return (f"× the paper's naive (immediate block-first writes: {block.write_stall_us_per_iteration / 1e3:.0f} ms of "
            f"write stall a pass) and, in brackets, × naive with random pages ({naive.write_stall_us_per_iteration / 1e3:.1f} "
            f"ms); read-wave amplification {naive.read_wave_amplification:.2f}× → {full.read_wave_amplification:.2f}× "
            f"takes {naive.kv_read_stall_fraction:.1%} → {full.kv_read_stall_fraction:.1%} of the busy time. The paper's own "
            f"Fig. 17 (5.97× random → 2.25×) caps a read-bound speedup at {FIG17_CEILING:.2f}×; its 4.08–4.32× needs a naive "
            "that serialises its writes, which block-first does, and that reads a request's pages in runs of a "
            f"block's pages on one plane (naive-block's read-wave amplification {block.read_wave_amplification:.2f}×: "
            "where a wave holds about one run a plane, runs collide as single pages do); Qwen3's BF16 weights (DASH Table II) double its weight stream against "
            "INT8's, the reading the paper's capacity implies")


def _window_note(table) -> str:
    t = table.iloc[0]
    return (f"closed loop: {int(t.tasks)} SWE-bench tasks a GPU in {int(t.slots)} slots, {TURNS} turns each, the real KV "
            f"room (mean HBF KV {table.mean_kv_hbf_gb.mean():.3g} GB held), {int(t.streams)} streams, window "
            f"{table.window_start_s.mean():.0f}–{table.window_end_s.mean():.0f} s ({table.window_requests.mean():.0f} "
            f"requests a stream, from the moment every task has started); paper: 4,096 tasks over four GPUs")


def _turnover_note(table) -> str:
    """What the window's block store did: GC runs once the sampled planes' used pages (live and stale) pass
    95 %, which the real room's size puts hours of serving away."""
    tails = (f"{table.diverged_page_fraction.mean():.0%} of the host-written pages died as diverged tails (a later "
             "turn keeps only the part of its session's KV it reuses)")
    if float(table.block_erases.max()) == 0.0:
        return (f"{tails}; in this window the sampled planes do not fill (no block erased), so GC never runs and WAF is "
                "1 by construction; the paper's 11.98× is measured after its room has turned over, hours of serving "
                "at 1,024 tasks a GPU, and our store's WAF once it turns over is validated against the analytic GC "
                "workloads (tests/test_plane_store.py)")
    return f"{tails}; GC ran on the sampled planes (blocks erased) within the window"


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"models": MODELS, "tasks": TASKS, "turns": TURNS,
                                     "warmup_turns": WARMUP_TURNS, "max_cpu_streams": MAX_CPU_STREAMS},
                         lambda: _compute(ctx))
    _plot(table, ctx)
    rows = []
    for model in dict.fromkeys(table.model):
        t = table[table.model == model].set_index("stage")
        paper = PAPER[model]
        for stage, p in zip(TABLE_STAGES, paper):
            rows.append(Comparison("HBFlex Table 2", f"{model}: throughput × Naive HBF, {stage}", f"{p:.2f}×",
                                   f"{t.loc[stage, 'speedup_vs_block']:.2f}× ({t.loc[stage, 'speedup']:.2f}×)",
                                   _gain_note(t) + "; " + _window_note(table)))
    waf = table.groupby("stage").waf.mean()
    host = table.groupby("stage").host_writes.mean()
    erases = table.groupby("stage").block_erases.mean()
    for (stage, label), p in zip((("+writeback", "baseline: interleaved blocks"), ("+lifetime packing", "+ lifetime packing"),
                                  ("+reclamation", "+ deferred reclamation (GC at 95 %, eviction at 90 %)")), PAPER_WAF):
        rows.append(Comparison("HBFlex Fig. 19 (in serving)", f"GC WAF, {label} ({stage})", f"{p:.2f}×",
                               f"{waf.get(stage, np.nan):.2f}×",
                               f"4 sampled planes a stream at the paper's geometry (512 blocks × 512 pages), each fed the "
                               f"pages the placement sends it; {host.get(stage, np.nan):.0f} host page programs and "
                               f"{erases.get(stage, np.nan):.0f} block erases on them a stream, "
                               f"{table.evicted_sessions.mean():.0f} sessions evicted; " + _turnover_note(table)
                               + "; " + _window_note(table)))
    amp = table.groupby("stage").read_wave_amplification.mean()
    rows.append(Comparison("HBFlex Fig. 17 (in serving)", "read-wave amplification, naive → HBFlex",
                           "5.97× → 2.25×", f"{amp.get('naive-hbf', np.nan):.2f}× → {amp.get('+reclamation', np.nan):.2f}×",
                           "one scheduling wave drawn per pass; " + _window_note(table)))
    return rows
