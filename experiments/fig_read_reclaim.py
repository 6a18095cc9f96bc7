"""Read disturb and refresh (issue 26): HBF lifetime and the share of program bandwidth that read reclaim
takes, against the read-disturb threshold N (10^4 … 10^7 reads per block) with the refresh interval as a
second axis, for DASH (Qwen3-235B-A22B at Table III's 4K/128 with a full batch of 32, uniform routing: a fixed batch,
not Table III's 50 % load, because the Zipf backlogged reference that sets the load took over 20 minutes
on a 2-core CPU, and a fixed batch reads weights at the highest rate, so the lifetimes are the worst case
of the load sweep; Zipf routing is left out because at this shape nearly every pass carries a 4K prompt's
prefill chunk, which activates every expert: a Zipf run measured 6.0206e8 weight page reads/s against
uniform's 6.0201e8, 177.55 against 177.56 tokens/s, and took 105 s against 12 s) and HBFlex (DeepSeek-V3 replaying the SWE-bench agent trace).

One ``hbfjax serve --read-disturb-reads`` run per workload gives its weight page reads per second (dense
and expert blocks, ``hbfjax.read_reclaim``) and its KV program rate; the grid over N and T is then the
renewal estimate of ``read_reclaim.estimate`` at those rates (exact for N ≫ 1 without refresh, whatever
the routing's skew; a lower bound with refresh). The third panel times the same rewrites in the serving
loop (the engine's ``reclaim`` part, ``hbfjax.serve.parts.reclaim``: ``serve --read-disturb-reads N
--reclaim-in windows|critical-path``, refresh off) at TIMED_THRESHOLDS: the share of the busy time that
reclaim's forced rewrites stall, in read-free windows or all on the critical path; the same runs count the
KV blocks' own reads — for HBFlex on the blocks part's sampled planes, for DASH (no block store) each
request's HBF KV as one cohort of blocks read together (``hbfjax.flash.disturb.cohorts``, in the reclaim
part) — whose rows give ``kv_block_reads_max``, the WAF the KV relocations add and their copies' rate beside
the weights' reclaim. Lifetimes spread wear over every block of the package. Assumed values: 512 pages
a block (HBFlex §5.1), 10^5 P/E cycles (HBFlex §3.3); the threshold and the refresh interval are swept
because no source gives HBF's (issue 26's artifact: 10^6; OCP HBF v0.7: refresh every 24–48 h). Neither
paper counts read disturb, so there is no paper value: the rows say what it implies for their lifetime
claims (DASH §VI-H, HBFlex §3.3)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _dash_serve as ds
from experiments.common import Comparison, Context, cached_table, save_figure
from experiments.fig_energy_cost import serve_parser
from hbfjax import read_reclaim
from hbfjax.commands import serve
from hbfjax.memory import hbf_packages
from hbfjax.memory import organisations as orgs
from hbfjax.serve.parts.blocks import BlocksConfig
from hbfjax.workload import models

TITLE = "Read disturb and refresh — HBF lifetime and reclaim's share of program bandwidth against the threshold (issue 26)"
NAME = "read_reclaim"
THRESHOLDS = (1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7)
REFRESH_HOURS = (0.0, 24.0, 48.0)  # 0: off; OCP HBF v0.7's 24-48 h
PE_CYCLES = 1e5
DASH_MODEL, DASH_PROMPT, DASH_OUTPUT, DASH_BATCH = "qwen3-235b-a22b", 4096, 128, 32  # Table III's shape, a full batch
FLEX_MODEL, FLEX_TRACE, FLEX_REQUESTS = "deepseek-v3", "swebench_miniswe_agent", 256
MAX_STREAMS = 4  # the reclaim estimate needs only each run's mean read rates
TIMED_THRESHOLDS = (1e4, 1e5, 1e6)  # the engine-timed runs (refresh off)
UNTIMED_THRESHOLD = 1e15  # the estimate's run: no block reaches it, so its times are those without reclaim
RECLAIM_IN = ("windows", "critical-path")
# (label, system, model, routing or None, the run's options)
RUNS = (("DASH, uniform", "dash", DASH_MODEL, "uniform"), ("HBFlex, SWE-bench", "hbflex", FLEX_MODEL, None))
KEYS = ("lifetime_years_combined", "lifetime_years_read_reclaim", "lifetime_years_kv_writes", "reclaim_program_share",
        "reclaim_program_gbps", "reclaim_over_kv_programs")


def serve_args(system: str, model: str, routing: str | None, streams: int, seed: int, tiny: bool,
               threshold: float = UNTIMED_THRESHOLD, reclaim_in: str = "windows") -> list[str]:
    """The ``hbfjax serve`` command line of one workload: by default with a threshold no run reaches (the
    engine then times no rewrite), only to get the read rates the estimate needs."""
    common = ["--streams", str(streams), "--seed", str(seed), "--read-disturb-reads", f"{threshold:g}",
              "--reclaim-in", reclaim_in, "--json"]
    if tiny:
        return ["serve", "--system", system, "--model", ds.TINY_MODEL, "--batch", "2", "--prompt", str(ds.TINY_PROMPT),
                "--output", str(ds.TINY_OUTPUT), *common]
    if system == "dash":
        return ["serve", "--system", system, "--model", model, "--batch", str(DASH_BATCH), "--prompt", str(DASH_PROMPT),
                "--output", str(DASH_OUTPUT), "--routing", routing, *common]
    return ["serve", "--system", system, "--model", model, "--trace", FLEX_TRACE, "--requests", str(FLEX_REQUESTS),
            *common]


def _package(system: str):
    return orgs.organisation(system) if system == "dash" else hbf_packages.package(system).org


def _compute(ctx: Context) -> pd.DataFrame:
    parser = serve_parser()
    streams = min(ctx.streams, MAX_STREAMS)
    rows = []
    for label, system, model_name, routing in RUNS:
        argv = serve_args(system, model_name, routing, streams, ctx.seed, ctx.tiny)
        result = serve.compute(parser.parse_args(argv))
        r = result if "system" in result else result["systems"][0]
        model = models.preset(result["model"])
        org = _package(system)
        for n in THRESHOLDS:
            for t in REFRESH_HOURS:
                m = read_reclaim.ReclaimModel(threshold_reads=n, refresh_hours=t, pe_cycles=PE_CYCLES)
                est = read_reclaim.estimate(r["dense_page_reads_per_s"], r["expert_page_reads_per_s"],
                                            r["kv_program_gbps"] * 1e9, 1.0, org, model, m)
                rows.append({"workload": label, "system": system, "model": result["model"], "routing": routing or "",
                             "threshold_reads": n, "refresh_hours": t,
                             "throughput_tokens_per_s": r["throughput_tokens_per_s"],
                             "weight_page_reads_per_s": r["weight_page_reads_per_s"],
                             "kv_program_gbps": r["kv_program_gbps"],
                             **{k: float(np.asarray(est[k])) for k in KEYS}})
        for n in TIMED_THRESHOLDS:
            for where in RECLAIM_IN:
                argv = serve_args(system, model_name, routing, streams, ctx.seed, ctx.tiny, n, where)
                timed = serve.compute(parser.parse_args(argv))
                q = timed if "system" in timed else timed["systems"][0]
                rows.append({"workload": label, "system": system, "model": result["model"], "routing": routing or "",
                             "threshold_reads": n, "refresh_hours": 0.0, "reclaim_in": where,
                             "throughput_tokens_per_s": q["throughput_tokens_per_s"],
                             "untimed_throughput_tokens_per_s": r["throughput_tokens_per_s"],
                             **{k: q[k] for k in TIMED_KEYS},
                             **{k: (np.nan if q.get(k) is None else q[k]) for k in KV_KEYS}})
    return pd.DataFrame(rows)


TIMED_KEYS = ("reclaim_stall_share_of_busy", "reclaim_timed_program_gbps", "reclaim_timed_forced_share",
              "reclaim_program_gbps")


# the KV blocks' own read counters (HBFlex's organisations: the blocks part's sampled planes; DASH's: each request's
# HBF KV a cohort of blocks, counted by the reclaim part; kv_block_reads_mean_at_erase: HBFlex only, GC's erases)
KV_KEYS = ("kv_block_reads_max", "kv_block_reads_mean_at_erase", "kv_reclaim_relocations_per_s", "kv_reclaim_waf_added",
           "kv_reclaim_program_gbps", "lifetime_years_combined")


def estimates(table: pd.DataFrame) -> pd.DataFrame:
    """The renewal-estimate rows (the timed runs' rows name where they timed reclaim)."""
    return table[table.reclaim_in.isna()] if "reclaim_in" in table else table


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    styles = {0.0: "-", 24.0: "--", 48.0: ":"}
    timed = table[table.reclaim_in.notna()]
    table = estimates(table)
    for i, label in enumerate(dict.fromkeys(table.workload)):
        for where, ls in zip(RECLAIM_IN, ("-", "--")):
            d = timed[(timed.workload == label) & (timed.reclaim_in == where)].sort_values("threshold_reads")
            axes[2].plot(d.threshold_reads, d.reclaim_stall_share_of_busy, ls, marker="o", ms=4, color=f"C{i}",
                         label=f"{label}, {where}")
        for t, ls in styles.items():
            d = table[(table.workload == label) & (table.refresh_hours == t)].sort_values("threshold_reads")
            more = d.reclaim_over_kv_programs > 1.0
            name = f"{label}, refresh {'off' if t == 0 else f'{t:g} h'}"
            for ax, key in ((axes[0], "lifetime_years_combined"), (axes[1], "reclaim_program_share")):
                ax.plot(d.threshold_reads, d[key], ls, color=f"C{i}", label=name if ax is axes[0] else None)
                ax.plot(d.threshold_reads[more], d[key][more], "o", color=f"C{i}", ms=4)
                ax.plot(d.threshold_reads[~more], d[key][~more], "o", color=f"C{i}", mfc="none", ms=4)
        kv = table[table.workload == label].lifetime_years_kv_writes.iloc[0]
        if np.isfinite(kv):
            axes[0].axhline(kv, color=f"C{i}", lw=0.6, alpha=0.6)
    axes[0].axhline(5.0, color="k", lw=0.8, ls="-.", label="5 years (HBFlex §3.3's horizon)")
    for ax, ylabel in ((axes[0], "HBF lifetime (years; KV writes + reclaim)"),
                       (axes[1], "reclaim's share of the package's program rate"),
                       (axes[2], "reclaim stall / busy time (timed in serving)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("read-disturb threshold N (reads per block)")
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=6, ncol=1, loc="lower right")
    axes[2].legend(fontsize=6, loc="lower left")
    fig.suptitle("left, middle: renewal estimate from each run's weight reads (filled: reclaim programs more than the "
                 "KV writes; thin lines: the lifetime KV writes alone leave); right: the rewrites timed in the serving "
                 "loop, refresh off", fontsize=8)
    fig.tight_layout()
    save_figure(fig, ctx, NAME)


def _crossing(d: pd.DataFrame) -> str:
    """The threshold below which reclaim programs more than the KV writes (refresh off: reclaim ∝ 1/N)."""
    at = d[d.threshold_reads == 1e6].iloc[0]
    if not np.isfinite(at.reclaim_over_kv_programs):
        return "no KV programmed: reclaim is all the wear"
    return f"N < {1e6 * at.reclaim_over_kv_programs:.3g} reads per block"


def run(ctx: Context) -> list[Comparison]:
    params = {"thresholds": THRESHOLDS, "refresh_hours": REFRESH_HOURS, "pe_cycles": PE_CYCLES,
              "runs": RUNS, "dash": (DASH_MODEL, DASH_PROMPT, DASH_OUTPUT, DASH_BATCH), "hbflex": (FLEX_MODEL, FLEX_TRACE, FLEX_REQUESTS),
              "max_streams": MAX_STREAMS, "timed_thresholds": TIMED_THRESHOLDS, "reclaim_in": RECLAIM_IN}
    full = cached_table(ctx, NAME, params, lambda: _compute(ctx))
    _plot(full, ctx)
    table = estimates(full)
    none = "not counted (neither paper models read disturb)"
    rows = []
    for label in dict.fromkeys(table.workload):
        d = table[(table.workload == label) & (table.refresh_hours == 0.0)]
        at = d[d.threshold_reads == 1e6].iloc[0]
        claim = ("DASH §VI-H counts KV writes only" if at.system == "dash" else
                 "HBFlex §3.3: raw KV writes within a 5-year budget; GC the dominant concern")
        rows.append(Comparison("issue 26", f"{label}: HBF lifetime at N = 10^6, refresh off (years)", none,
                               f"{at.lifetime_years_combined:.3g} (KV writes alone {at.lifetime_years_kv_writes:.3g}; "
                               f"reclaim alone {at.lifetime_years_read_reclaim:.3g})",
                               f"{claim}; here reclaim programs {at.reclaim_over_kv_programs:.3g}× the KV writes "
                               f"({at.reclaim_program_gbps:.3g} GB/s, {at.reclaim_program_share:.2%} of the program "
                               f"rate) from {at.weight_page_reads_per_s:.3g} weight page reads/s"))
        rows.append(Comparison("issue 26", f"{label}: where reclaim costs more than the KV writes", none,
                               _crossing(d), "reclaim ∝ 1/N with refresh off (renewal theory, N ≫ 1)"))
        refresh = table[(table.workload == label) & (table.threshold_reads == 1e7)]
        on, off = (refresh[refresh.refresh_hours == t].iloc[0] for t in (24.0, 0.0))
        rows.append(Comparison("issue 26", f"{label}: refresh every 24 h at N = 10^7", none,
                               f"lifetime {on.lifetime_years_combined:.3g} years (off: {off.lifetime_years_combined:.3g})",
                               "refresh binds only for blocks read fewer than N times in T: "
                               + ("it changes nothing here" if abs(on.lifetime_years_combined
                                                                    - off.lifetime_years_combined)
                                  <= 1e-9 * off.lifetime_years_combined else "it shortens the lifetime here")))
        timed = full[(full.workload == label) & full.reclaim_in.notna()]
        cells = {(row.reclaim_in, row.threshold_reads): row for row in timed.itertuples()}
        w, c = cells[("windows", 1e6)], cells[("critical-path", 1e6)]
        lo = cells[("windows", min(TIMED_THRESHOLDS))]
        rows.append(Comparison(
            "issue 26", f"{label}: reclaim stall timed in serving at N = 10^6 (share of busy time)", none,
            f"{w.reclaim_stall_share_of_busy:.2%} in windows, {c.reclaim_stall_share_of_busy:.2%} on the critical "
            f"path (N = {min(TIMED_THRESHOLDS):.0e}: {lo.reclaim_stall_share_of_busy:.1%})",
            f"throughput {w.throughput_tokens_per_s:.4g} tokens/s against {w.untimed_throughput_tokens_per_s:.4g} "
            f"untimed; {w.reclaim_timed_forced_share:.0%} of the rewrites found no window; the timed rewrites "
            f"{w.reclaim_timed_program_gbps:.3g} GB/s against the estimate's {w.reclaim_program_gbps:.3g} "
            "(each pass's routing draw, the credits' stationary start)"))
        if np.isfinite(w.kv_block_reads_max) and w.system == "hbflex":
            rows.append(Comparison("issue 26", f"{label}: KV blocks' own read disturb (sampled planes)", none,
                                   _kv_cells(cells), _kv_note(w)))
        elif np.isfinite(w.kv_block_reads_max):
            rows.append(Comparison("issue 26", f"{label}: KV blocks' own read disturb (each request's HBF KV a "
                                   "cohort of blocks)", none, _kv_cells(cells), _dash_kv_note(cells)))
    return rows


def _kv_cells(cells) -> str:
    """The KV relocations' added WAF at each timed threshold (windows runs)."""
    return "WAF added by relocating KV blocks: " + ", ".join(
        f"{cells[('windows', n)].kv_reclaim_waf_added:.3g} at N = {n:.0e}" for n in sorted(TIMED_THRESHOLDS))


def _kv_note(w) -> str:
    b = BlocksConfig()  # the serve command's sampled planes
    erased = (f"{w.kv_block_reads_mean_at_erase:.3g} reads on average when GC erased a block"
              if np.isfinite(w.kv_block_reads_mean_at_erase) else
              "GC erased no KV block in the window, so these counts are lower bounds of a block's reads before GC")
    return (f"a KV block takes the reads of all its live pages (512 pages, each read by every decode pass of its "
            f"session; the {b.blocks_per_plane} blocks of {b.read_counter_planes} of a stream's {b.planes} sampled planes count "
            f"reads, totals scaled by {b.planes / b.read_counter_planes:g}): the most a "
            f"counted block took was {w.kv_block_reads_max:.3g} reads; {erased}; at N = 10^6 "
            f"{w.kv_reclaim_relocations_per_s:.3g} KV relocations/s (package), {w.kv_reclaim_program_gbps:.3g} GB/s "
            f"of copies against the weights' {w.reclaim_timed_program_gbps:.3g} GB/s of reclaim; lifetime with both "
            f"{w.lifetime_years_combined:.3g} years (the timed run). "
            + ("KV blocks pass 10^6 reads before their pages die: the papers' KV-write lifetimes leave this out"
               if w.kv_block_reads_max >= 1e6 else "No KV block reached 10^6 reads in the window"))


def _dash_kv_note(cells) -> str:
    """DASH's KV cohorts beside the weights' reclaim at each timed threshold (windows runs)."""
    w = cells[("windows", 1e6)]
    per_n = "; ".join(f"N = {n:.0e}: {c.kv_reclaim_relocations_per_s:.3g} KV block relocations/s, "
                      f"{c.kv_reclaim_program_gbps:.3g} GB/s of copies against the weights' "
                      f"{c.reclaim_timed_program_gbps:.3g} GB/s of reclaim"
                      for n, c in ((n, cells[("windows", n)]) for n in sorted(TIMED_THRESHOLDS)))
    return (f"DASH has no block store: a request's HBF KV (its prompt's, written straight to HBF, and what writeback "
            f"moves there) is one cohort of blocks, each taking 512 reads from every pass that reads the request's KV, "
            f"relocated together at each multiple of N; the most-read block took {w.kv_block_reads_max:.3g} reads "
            f"(its request's life: the cohort dies with it). {per_n}; lifetime with both "
            f"{w.lifetime_years_combined:.3g} years at N = 10^6 (the timed run)")
