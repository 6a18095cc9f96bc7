"""HBFlex Fig. 19: GC write amplification, baseline → lifetime-guided packing → + deferred reclamation.

The paper replays four Alibaba Bailian traces (not available here) for DeepSeek-V3 and Qwen3; we
replay the traces in ``../shared/traces`` (Mooncake conversation, SWE-bench agent sessions, Azure
code) through the KV-lifetime GC model (``hbfjax.flash.erase.kv_lifetimes``): a request's KV lives
until its session's last turn has decoded plus a reuse retention, the oldest requests are evicted
at 90 % used (HBFlex §5.4). Baseline: interleaved blocks, GC at 90 % (no deferral). Packing:
lifetime labels from the root request's start time. Deferred: GC moved to 95 %.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table, fmt_ci, save_figure
from hbfjax import batch
from hbfjax.flash.erase import kv_lifetimes as kv
from hbfjax.reports import gc_summary
from hbfjax.workload.eviction import oldest_first
from hbfjax.workload.replay import kv_trace_requests
from hbfjax.traces import load_trace

TITLE = "HBFlex Fig. 19: KV GC write amplification — baseline, lifetime packing, + deferred reclamation"
TRACES = {"Mooncake": "mooncake_conversation.jsonl", "SWE-bench": "swebench_miniswe_agent.csv",
          "Azure code": "azure_llm_2023_code.csv"}
SCHEMES = (("baseline", "interleaved", 0.90), ("+ lifetime packing", "lifetime", 0.90),
           ("+ deferred reclamation", "lifetime", 0.95))
PAPER = {"baseline": 11.98, "+ lifetime packing": 1.24, "+ deferred reclamation": 1.04}
GEOM = dict(n_blocks=2048, pages_per_block=16, slots=512, pages_per_tick=2, n_labels=8, victim="greedy",
            victims_per_gc=64, warmup_ticks=250, measure_ticks=500)
KEEP_S = 120.0  # KV kept for prefix reuse after the session's last turn (then evicted or released)
LABEL_TICKS = 8.0


def _compute(streams: int, seed: int, tiny: bool = False) -> pd.DataFrame:
    rows = []
    for trace_name, file in list(TRACES.items())[1:2] if tiny else TRACES.items():  # tiny: SWE-bench only
        trace = load_trace(file)
        geom = {**GEOM, "n_blocks": 256, "warmup_ticks": 10, "measure_ticks": 20} if tiny else GEOM
        for scheme, alloc, gc_at in SCHEMES:
            cfg = kv.KvConfig(**geom, allocation=alloc, lifetime="trace", evict=oldest_first)
            arrays, facts = kv_trace_requests(trace, cfg.warmup_ticks + cfg.measure_ticks, cfg.blocks.physical_pages,
                                              cfg.pages_per_tick, keep_s=KEEP_S)
            knobs = kv.KvKnobs.make(cfg, label_ticks=LABEL_TICKS, evict_used=0.90, gc_trigger_used=gc_at)
            out = batch.run(kv.simulate, streams, seed, knobs, cfg, inputs=kv.KvInputs.make(arrays))
            res = gc_summary(out, cfg.blocks.physical_pages)
            rows.append({"trace": trace_name, "scheme": scheme, "allocation": alloc, "gc_trigger_used": gc_at,
                         "gc_trigger_used_effective": float(knobs.gc_trigger_used), "waf": res["waf"],
                         "ci95_waf": res["ci95_waf"], "host_writes": res["host_writes"],
                         "migrated_pages": res["migrated_pages"], "evicted": int(out.evicted_requests.sum()),
                         "admitted": int(out.admitted_requests.sum()), "stalled_ticks": int(out.stalled_ticks.sum()),
                         "label_fallback_pages": int(out.label_fallback_pages.sum()),
                         "tick_s": facts["tick_s"], "tokens_per_page": facts["tokens_per_page"],
                         "overflow": res["overflow"], "streams": streams})
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    import matplotlib.pyplot as plt

    # Greedy victims on a fixed trace are deterministic: streams differ only by nothing, so two suffice.
    streams = 2
    table = cached_table(ctx, "hbflex19_waf", {"geom": GEOM, "keep_s": KEEP_S, "label_ticks": LABEL_TICKS,
                                               "traces": list(TRACES)}, lambda: _compute(streams, ctx.seed, ctx.tiny))
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    width = 0.8 / len(SCHEMES)
    x = np.arange(len(TRACES))
    for i, (scheme, _, _) in enumerate(SCHEMES):
        d = table[table.scheme == scheme].set_index("trace").reindex(list(TRACES))
        bars = ax.bar(x + (i - 1) * width, d.waf, width, label=f"{scheme} (paper avg {PAPER[scheme]}×)")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(x, list(TRACES))
    ax.set_ylabel("GC WAF (page programs / host KV page writes)", fontsize=9)
    ax.set_title("KV GC write amplification per trace\n(evict at 90 % used; GC at 90 %, deferred: 95 %)", fontsize=10)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, float(table.waf.max()) * 1.35)
    save_figure(fig, ctx, "hbflex19_waf")
    swe = " → ".join(f"{table[(table.trace == 'SWE-bench') & (table.scheme == s)].waf.iloc[0]:.2f}" for s, _, _ in SCHEMES)
    comps = []
    for scheme, _, _ in SCHEMES:
        d = table[table.scheme == scheme]
        comps.append(Comparison(
            figure="HBFlex Fig. 19", quantity=f"average GC WAF, {scheme}", paper=f"{PAPER[scheme]}×",
            hbfjax=fmt_ci(float(d.waf.mean()), float(np.sqrt((d.ci95_waf ** 2).sum()) / len(d))),
            note="paper: 4 Bailian traces × 2 models; ours: Mooncake, SWE-bench, Azure on a 2,048 × 16-page device "
                 "scaled to 80 % live KV, greedy victim, one deterministic replay (CI 0). SWE-bench has session ids "
                 f"(SWE-bench: {swe}); Mooncake's sessions are rebuilt from its block hashes, so its requests live "
                 "to their session's last turn (p90 648 s) and the 512 live-request cap binds (peak 1,518 live): "
                 "admission lags the trace, live KV stays below the 80 % the scaling assumes and little is moved "
                 "(WAF ≈ 1.1; 3.75 → 3.34 → 3.29 with one session per request). Azure (no sessions, peak 1,165 "
                 "live) is capped too; with 2,048 slots on 8,192 blocks the three traces give 3.81/1.10/2.64 at "
                 "baseline: the geometry, not GC, sets these numbers until the serving engine replays the traces; "
                 "our baseline is lower because pages of one request are written together in runs, and the GC "
                 "pool is capped by the tick reserve (host stalls counted in the CSV)"))
    return comps
