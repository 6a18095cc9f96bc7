"""DASH Table III and §VI-E: Qwen3-235B-A22B served online (Poisson arrivals at 50/75/90 % of
RelayOnly's backlogged throughput): P90 E2E and P90 TPOT of DASH, its reductions against RelayOnly and
DirectOnly, and the Mixed vs Serial peak (backlogged) throughputs; DASH also under the reading closest to
the paper's ratios (:data:`PER_PATH`: the HBF arrays limit each path alone, ``--array-rate per-path``; the
single-path baselines, and so the loads, are the same under both readings)."""

from __future__ import annotations

import dataclasses

import jax
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _dash_serving as ds
from experiments.common import Comparison, Context, cached_table, fmt_ci, save_figure
from hbfjax import batch
from hbfjax.serve import metrics, report, systems
from hbfjax.stats import mean_ci95
from hbfjax.sweep import load
from hbfjax.workload import models

TITLE = "DASH Table III — Qwen3-235B-A22B P90 E2E and TPOT at 50/75/90 % of RelayOnly's backlogged load"
NAME = "dash_table3_p90"
MODEL = "qwen3-235b-a22b"
PROMPT, OUTPUT, SLOTS = 4096, 128, 32  # DASH §VI-E
WARMUP, MEASURED = 128, 1024
LOADS = (0.5, 0.75, 0.9)
SYSTEMS = ("dash", "relay-only", "direct-only")
PER_PATH = "dash per-path"  # DASH with shared_array_rate = 0 (issue 24's reading of the paper)
PER_PATH_CHANGES = (("shared_array_rate", 0.0),)
ROUTING = "balanced"  # DASH §VI-E "analytical routing with balanced per-expert rows"
MAX_STREAMS = 16  # on a CPU at most this many streams (~5 min on 2 cores); an accelerator runs --streams
# The backlogged runs are deterministic (balanced routing, fixed lengths, every request at t = 0: no draw
# changes a pass time), so a second stream only confirms it (its CI is 0 unless something is random).
BACKLOG_STREAMS = 2
PAPER = {0.5: (20.982, 148.0, 61.2, 62.2, 61.0, 62.0), 0.75: (28.847, 208.5, 53.5, 53.9, 53.3, 53.8),
         0.9: (31.859, 232.0, 50.5, 50.3, 50.4, 50.2)}  # E2E s, TPOT ms, E2E/TPOT % vs RelayOnly, vs DirectOnly


def _size(ctx: Context) -> tuple[int, int, int, tuple[str, ...]]:
    """(streams, warmup, measured, modes): tiny runs Mixed only on 20 requests."""
    if ctx.tiny:
        return 2, 4, 16, ("mixed",)
    cap = ctx.streams if jax.default_backend() != "cpu" else min(ctx.streams, MAX_STREAMS)
    return cap, WARMUP, MEASURED, ("mixed", "serial")


def _compute(ctx: Context) -> pd.DataFrame:
    streams, warmup, measured, modes = _size(ctx)
    requests = warmup + measured
    scenario = lambda mode, rate=1.0: ds.scenario(MODEL, PROMPT, OUTPUT, slots=SLOTS, requests=requests,  # noqa: E731
                                                  arrivals="poisson", rate_per_s=rate, mode=mode, routing=ROUTING,
                                                  warmup=warmup, measured=measured)
    rows, reference = [], None
    for mode in modes:  # the batcher's mode is static: one compilation each
        for name in SYSTEMS:  # each a knob axis of one: the shape fig_dash_lifetime's run shares (one compilation)
            fam = systems.single(name, scenario(mode))
            rates, overflow = load.backlogged_rates(batch.stack_knobs(list(fam.points)), fam.config,
                                                    min(streams, BACKLOG_STREAMS), ctx.seed, warmup, measured,
                                                    knob_axis=True, inputs=fam.inputs)
            mean, ci = mean_ci95(rates[:, 0])
            rows.append({"kind": "backlogged", "mode": mode, "system": name, "load": np.nan,
                         "rate_per_s": float(mean), "ci95_rate_per_s": float(ci), "overflow": overflow,
                         "streams": min(streams, BACKLOG_STREAMS)})
            if mode == "mixed" and name == "relay-only":
                reference = float(mean)
    per_path = lambda sc: dataclasses.replace(sc, org_changes=PER_PATH_CHANGES)  # noqa: E731
    fam = systems.single("dash", per_path(scenario("mixed")))
    rates, overflow = load.backlogged_rates(batch.stack_knobs(list(fam.points)), fam.config,
                                            min(streams, BACKLOG_STREAMS), ctx.seed, warmup, measured,
                                            knob_axis=True, inputs=fam.inputs)
    mean, ci = mean_ci95(rates[:, 0])
    rows.append({"kind": "backlogged", "mode": "mixed", "system": PER_PATH, "load": np.nan, "rate_per_s": float(mean),
                 "ci95_rate_per_s": float(ci), "overflow": overflow, "streams": min(streams, BACKLOG_STREAMS)})
    grid = [(x, n) for x in LOADS for n in SYSTEMS + (PER_PATH,)]
    fam = ds.family([("dash" if n == PER_PATH else n,
                      (per_path if n == PER_PATH else lambda sc: sc)(scenario("mixed", load.rate_for_load(x, reference))))
                     for x, n in grid])
    outs = ds.run(fam, streams, ctx.seed)
    per = {}
    for (x, name), out in zip(grid, outs):
        t = report.request_times(out)
        per[x, name] = metrics.per_stream(t, metrics.window(requests, warmup, measured))
        s = ds.summary(out, warmup, measured)
        rows.append({"kind": "online", "mode": "mixed", "system": name, "load": x,
                     "rate_per_s": load.rate_for_load(x, reference), "ci95_rate_per_s": np.nan,
                     "overflow": s["overflow"], "iterations_mean": float(np.mean(out.iterations)), "streams": streams,
                     **{k: s[k] for k in s if k.startswith(("p90_", "ci95_p90_", "e2e_s", "tpot_ms",
                                                             "mean_requests", "arrival_rate"))}})
    for x in LOADS:  # paired per stream (common arrivals): 1 − DASH / baseline
        for cand, base in [("dash", b) for b in SYSTEMS[1:]] + [(PER_PATH, b) for b in SYSTEMS[1:]]:
            for key in ("p90_e2e_s", "p90_tpot_ms"):
                red = 100.0 * (1.0 - per[x, cand][key] / per[x, base][key])
                mean, ci = mean_ci95(red)
                rows.append({"kind": "reduction", "mode": "mixed", "system": f"{cand} vs {base}", "load": x,
                             "metric": key, "reduction_pct": float(mean), "ci95_reduction_pct": float(ci),
                             "every_stream_positive": bool(np.all(red > 0)), "streams": streams})
    return pd.DataFrame(rows)


def _peak(table: pd.DataFrame, mode: str, name: str) -> tuple[float, float]:
    r = table[(table.kind == "backlogged") & (table["mode"] == mode) & (table.system == name)].iloc[0]
    return float(r.rate_per_s), float(r.ci95_rate_per_s)


def _reduction_note(r, paper: float, pending: str) -> str:
    """Paired per stream; a gap above 15 % is not explained beyond the latency rows' delivery gap."""
    sign = "every stream positive (paper: every seed)" if r.every_stream_positive else "NOT every stream positive"
    if abs(r.reduction_pct / paper - 1.0) <= 0.15:
        return f"paired per stream; {sign}; within 15 %"
    return (f"paired per stream; {sign}; gap above 15 %: ours falls faster with load than the paper's. Not "
            f"explained: our service times are about half the paper's (latency rows), which changes how the "
            f"queues of the baselines grow; {pending}")


def _comparisons(table: pd.DataFrame) -> list[Comparison]:
    on = table[table.kind == "online"]
    red = table[table.kind == "reduction"]
    experts_tb = models.preset(MODEL).expert_weight_bytes / 1e12
    pending = ("KV tracked per request (prefill KV in HBF, decode KV in HBM, writeback past the budget) with "
               "write stalls; plane collisions of reads with programs are not modelled")

    def latency_note(ours_ms: float, paper_ms: float) -> str:
        return (f"ours ≈ {ours_ms / paper_ms:.2f}× the paper's. A Mixed pass of ≥ 16 tokens needs all 128 experts of "
                f"every layer under balanced routing ({experts_tb * 1e3:.0f} GB per iteration); all experts over the "
                f"P90 TPOT is {experts_tb / (paper_ms * 1e-3):.1f} TB/s for the paper, "
                f"{experts_tb / (ours_ms * 1e-3):.1f} TB/s for us (links 6.4 TB/s, two stacks' arrays 5.6 TB/s at "
                f"tR = 3 µs: where ours exceeds them, our P90 decode passes hold fewer than 16 tokens and need fewer "
                f"experts, so the rate is a bound, not a measurement; the paper's is far below either cap). "
                f"What holds the paper's delivery near half its link aggregate is not stated (SRAM readiness, "
                f"profiled GPU times); also {pending}")

    rows = []
    for x in LOADS:
        d = on[(on.system == "dash") & (on.load == x)].iloc[0]
        e2e, tpot = PAPER[x][:2]
        rows += [Comparison("DASH Table III", f"DASH P90 E2E at {x:.0%} load (s)", f"{e2e}",
                            fmt_ci(d.p90_e2e_s, d.ci95_p90_e2e_s, 4), latency_note(d.p90_tpot_ms, tpot)),
                 Comparison("DASH Table III", f"DASH P90 TPOT at {x:.0%} load (ms)", f"{tpot}",
                            fmt_ci(d.p90_tpot_ms, d.ci95_p90_tpot_ms, 4), latency_note(d.p90_tpot_ms, tpot))]
        for j, base in enumerate(SYSTEMS[1:]):
            for i, key in enumerate(("p90_e2e_s", "p90_tpot_ms")):
                r = red[(red.system == f"dash vs {base}") & (red.load == x) & (red.metric == key)].iloc[0]
                label = "E2E" if i == 0 else "TPOT"
                rows.append(Comparison("DASH Table III", f"P90 {label} reduction vs {base} at {x:.0%} load (%)",
                                       f"{PAPER[x][2 + 2 * j + i]}", fmt_ci(r.reduction_pct, r.ci95_reduction_pct),
                                       _reduction_note(r, PAPER[x][2 + 2 * j + i], pending)))
    if "serial" in set(table["mode"]):
        gain = lambda a, b: 100.0 * (a / b - 1.0)  # noqa: E731
        dash_m, dash_s = _peak(table, "mixed", "dash")[0], _peak(table, "serial", "dash")[0]
        base = [gain(_peak(table, "mixed", n)[0], _peak(table, "serial", n)[0]) for n in SYSTEMS[1:]]
        over = [gain(_peak(table, m, "dash")[0], _peak(table, m, n)[0]) for m in ("mixed", "serial") for n in SYSTEMS[1:]]
        peak_note = ("peak = backlogged completion rate (hbfjax.sweep.load; the paper does not define its peak). "
                     "Gap above 15 %: Serial fetches every needed expert twice per iteration (decode pass, prefill "
                     "pass), so its loss depends on how many passes need all experts, which follows the GPU and "
                     "delivery times the latency rows show differ from the paper's; not explained further")
        within = lambda ours, paper: abs(ours / paper - 1.0) <= 0.15  # noqa: E731
        note_for = lambda ok, extra: ("within 15 %; " + extra) if ok else peak_note + "; " + extra  # noqa: E731
        g_dash = gain(dash_m, dash_s)
        rows += [Comparison("DASH §VI-E", "Mixed over Serial peak throughput, DASH (%)", "+10.3", f"{g_dash:+.1f}",
                            note_for(within(g_dash, 10.3), "DASH")),
                 Comparison("DASH §VI-E", "Mixed over Serial peak throughput, baselines (%)", "+12.6",
                            " / ".join(f"{g:+.1f}" for g in base),
                            note_for(all(within(g, 12.6) for g in base), "RelayOnly / DirectOnly")),
                 Comparison("DASH §VI-E", "DASH over single-route baselines, peak throughput (%)", "+34.1 to +37.1",
                            f"{min(over):+.1f} to {max(over):+.1f}",
                            note_for(within(min(over), 34.1) and within(max(over), 37.1), "both modes, both baselines"))]
    rows += _per_path_rows(table, red)
    return rows


def _per_path_rows(table: pd.DataFrame, red: pd.DataFrame) -> list[Comparison]:
    """The reductions and the Mixed peak ratio of DASH with the arrays per path (the paper's reading)."""
    out = []
    if not len(red[red.system.str.startswith(PER_PATH)]):
        return out
    for j, base in enumerate(SYSTEMS[1:]):
        cells, paper = [], []
        for x in LOADS:
            got = [red[(red.system == f"{PER_PATH} vs {base}") & (red.load == x) & (red.metric == key)].iloc[0]
                   for key in ("p90_e2e_s", "p90_tpot_ms")]
            cells.append(f"{x:.0%}: {got[0].reduction_pct:.1f} / {got[1].reduction_pct:.1f}")
            paper.append(f"{x:.0%}: {PAPER[x][2 + 2 * j]} / {PAPER[x][3 + 2 * j]}")
        out.append(Comparison("DASH Table III", f"reading 'per-path': P90 E2E / TPOT reductions vs {base} (%)",
                              "; ".join(paper), "; ".join(cells),
                              "DASH with the HBF arrays limiting each path alone (--array-rate per-path); the "
                              "baselines and loads as in the literal rows (one path: the reading changes nothing)"))
    gain = 100 * (_peak(table, "mixed", PER_PATH)[0] / _peak(table, "mixed", "relay-only")[0] - 1)
    where = "above" if gain > 37.1 else "below" if gain < 34.1 else "within"
    close = [x for x in LOADS if abs(red[(red.system == f"{PER_PATH} vs relay-only") & (red.load == x)
                                         & (red.metric == "p90_e2e_s")].iloc[0].reduction_pct - PAPER[x][2]) <= 2.0]
    out.append(Comparison("DASH §VI-E", "reading 'per-path': DASH over RelayOnly, Mixed peak throughput (%)",
                          "+34.1 to +37.1", f"{gain:+.1f}",
                          f"{where} the paper's range, while the E2E reductions vs RelayOnly are within 2 points of "
                          f"the paper's at {', '.join(f'{x:.0%}' for x in close) or 'no load'}: no single reading gives "
                          "all of Table III (review 2026-12-02 DASH fidelity §2.3)"))
    return out


def run(ctx: Context) -> list[Comparison]:
    streams, warmup, measured, modes = _size(ctx)
    table = cached_table(ctx, NAME, {"model": MODEL, "prompt": PROMPT, "output": OUTPUT, "slots": SLOTS,
                                     "loads": LOADS, "warmup": warmup, "measured": measured, "modes": modes,
                                     "routing": ROUTING, "max_streams": MAX_STREAMS,
                                     "backlog_streams": BACKLOG_STREAMS, "per_path": PER_PATH},
                         lambda: _compute(ctx))
    on = table[table.kind == "online"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, unit, col in ((axes[0], "p90_e2e_s", "s", 0), (axes[1], "p90_tpot_ms", "ms", 1)):
        for name in SYSTEMS:
            d = on[on.system == name].sort_values("load")
            ax.errorbar(100 * d.load, d[key], yerr=d[f"ci95_{key}"], marker="o", capsize=3, label=f"{name} (hbfjax)")
        ax.plot([100 * x for x in LOADS], [PAPER[x][col] for x in LOADS], "k*", ms=11, label="DASH (paper)")
        implied = [PAPER[x][col] / (1.0 - PAPER[x][2 + col] / 100.0) for x in LOADS]  # DASH / (1 − reduction)
        ax.plot([100 * x for x in LOADS], implied, "k^", mfc="none", ms=8, label="RelayOnly (paper, implied)")
        ax.set_xlabel("offered load (% of RelayOnly's backlogged throughput)")
        ax.set_ylabel(f"P90 {'E2E' if col == 0 else 'TPOT'} ({unit})")
        ax.legend(fontsize=7)
    fig.suptitle(f"Qwen3-235B-A22B, {PROMPT}/{OUTPUT} tokens, B_max {SLOTS}, Mixed; "
                 f"{int(on.streams.iloc[0])} streams per point", fontsize=9)
    save_figure(fig, ctx, NAME)
    return _comparisons(table)
