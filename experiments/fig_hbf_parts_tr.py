"""Throughput over tR × read units per die for public HBF parts (issue 25): DASH and HBFlex serving one fixed
batch with each HBF stack replaced by a part (``hbfjax serve --hbf PART``), the sweep no published result has.

Each point is one run of ``hbfjax serve`` with both systems (each keeps its own stack count: DASH 2, HBFlex 6)
and the part's per-stack values: dies, page, capacity, the interface's read rate (a cap on what a stack's arrays
send out), tR and read units per die as swept here, and tPROG. The OCP v0.7 and SanDisk parts state no tR, tPROG
or read units: tR and read units are the axes; tPROG is the slc-96l part's 75 µs for all three (an assumption:
neither source states one). ``array_limited`` marks the points whose arrays (dies × read units × page / tR)
cannot feed the part's interface. Qwen3-235B-A22B at DASH Fig. 9(a)'s 1K/128, batch 32, on DASH's H100 PCIe
(one GPU for both systems, as in the energy figure). No paper gives these numbers: the rows say where the two
designs' answers part."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _dash_serve as ds
from experiments.common import Comparison, Context, cached_table, save_figure
from experiments.fig_energy_cost import serve_parser
from hbfjax.commands import serve

TITLE = "HBF parts from public specifications: DASH and HBFlex throughput over tR × read units per die (issue 25)"
NAME = "hbf_parts_tr"
MODEL = "qwen3-235b-a22b"
BATCH, PROMPT, OUTPUT = 32, 1024, 128
PARTS = ("ocp-hbf-v0.7", "sandisk-gen1", "slc-96l")
T_READ_US = (1.0, 4.0, 20.0)
READ_UNITS_PER_DIE = (8, 32, 128)
T_PROG_US = 75.0  # slc-96l's stated tPROG (HBFlex §3), assumed for the parts that state none
SYSTEMS = ("dash", "hbflex")
MAX_STREAMS = 4  # a fixed batch is nearly deterministic (only the distinct-expert counts are drawn)


def serve_args(part: str, t_read_us: float, units: int, model: str, batch: int, prompt: int, output: int,
               streams: int, seed: int) -> list[str]:
    """The ``hbfjax serve`` command line of one point (both systems in one run)."""
    return ["serve", "--system", *SYSTEMS, "--hbf", part, "--t-read-us", f"{t_read_us:g}", "--t-prog-us",
            f"{T_PROG_US:g}", "--read-units-per-die", str(units), "--model", model, "--batch", str(batch),
            "--prompt", str(prompt), "--output", str(output), "--streams", str(streams), "--seed", str(seed), "--json"]


def _compute(ctx: Context) -> pd.DataFrame:
    if ctx.tiny:
        model, prompt, output, batch = ds.TINY_MODEL, ds.TINY_PROMPT, ds.TINY_OUTPUT, 1
        grid = [(PARTS[0], T_READ_US[1], u) for u in READ_UNITS_PER_DIE[:2]]
    else:
        model, prompt, output, batch = MODEL, PROMPT, OUTPUT, BATCH
        grid = [(p, t, u) for p in PARTS for t in T_READ_US for u in READ_UNITS_PER_DIE]
    streams = min(ctx.streams, MAX_STREAMS)
    parser = serve_parser()
    rows = []
    for i, (part, t_read, units) in enumerate(grid):
        print(f"  {NAME}: point {i + 1}/{len(grid)}: {part}, tR {t_read:g} µs, {units} read units per die", flush=True)
        result = serve.compute(parser.parse_args(serve_args(part, t_read, units, model, batch, prompt, output,
                                                            streams, ctx.seed)))
        hbf = result["hbf_part"]
        for r in result["systems"]:
            rows.append({"model": model, "batch": batch, "part": part, "t_read_us": t_read, "read_units_per_die": units,
                         "system": r["system"], "throughput_tokens_per_s": r["throughput_tokens_per_s"],
                         "ci95_throughput_tokens_per_s": r["ci95_throughput_tokens_per_s"],
                         "array_read_gbps_per_stack": hbf["array_read_gbps_per_stack"],
                         "interface_gbps_per_stack": hbf["interface_gbps_per_stack"],
                         "array_limited": bool(hbf["array_limited"])})
    return pd.DataFrame(rows)


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    parts = [p for p in PARTS if p in set(table.part)]
    systems = [s for s in SYSTEMS if s in set(table.system)]
    fig, axes = plt.subplots(len(systems), len(parts), figsize=(4.2 * len(parts), 3.3 * len(systems)),
                             squeeze=False, sharey="row")
    for i, system in enumerate(systems):
        for j, part in enumerate(parts):
            ax = axes[i, j]
            for k, units in enumerate(sorted(set(table.read_units_per_die))):
                t = table[(table.system == system) & (table.part == part) & (table.read_units_per_die == units)]
                t = t.sort_values("t_read_us")
                ax.errorbar(t.t_read_us, t.throughput_tokens_per_s, yerr=t.ci95_throughput_tokens_per_s, color=f"C{k}",
                            label=f"{units} read units per die", marker="o", ms=0)
                fed = t[~t.array_limited]
                ax.plot(fed.t_read_us, fed.throughput_tokens_per_s, "o", color=f"C{k}")
                starved = t[t.array_limited]
                ax.plot(starved.t_read_us, starved.throughput_tokens_per_s, "o", mfc="none", color=f"C{k}")
            ax.set_xscale("log")
            ax.set_xticks(sorted(set(table.t_read_us)), [f"{v:g}" for v in sorted(set(table.t_read_us))])
            ax.set_title(f"{system} on {part}", fontsize=9)
            ax.set_xlabel("tR (µs)")
        axes[i, 0].set_ylabel("output tokens/s")
    axes[0, 0].legend(fontsize=7, title="hollow: arrays below the interface", title_fontsize=7)
    fig.suptitle(f"{table.model.iloc[0]}, fixed batch {table.batch.iloc[0]}, 1K/128, one H100 PCIe; tPROG "
                 f"{T_PROG_US:g} µs (assumed for parts that state none)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, ctx, NAME)


def _spread(table: pd.DataFrame, system: str, part: str) -> str:
    t = table[(table.system == system) & (table.part == part)]
    lo, hi = t.loc[t.throughput_tokens_per_s.idxmin()], t.loc[t.throughput_tokens_per_s.idxmax()]
    return (f"{lo.throughput_tokens_per_s:.3g} (tR {lo.t_read_us:g} µs, {lo.read_units_per_die} units) to "
            f"{hi.throughput_tokens_per_s:.3g} (tR {hi.t_read_us:g} µs, {hi.read_units_per_die} units)")


def run(ctx: Context) -> list[Comparison]:
    params = {"model": MODEL, "batch": BATCH, "prompt": PROMPT, "output": OUTPUT, "parts": PARTS,
              "t_read_us": T_READ_US, "read_units_per_die": READ_UNITS_PER_DIE, "t_prog_us": T_PROG_US,
              "systems": SYSTEMS, "max_streams": MAX_STREAMS}
    table = cached_table(ctx, NAME, params, lambda: _compute(ctx))
    _plot(table, ctx)
    none = "not reported (no published result sweeps tR × read units on a part)"
    rows = []
    for part in (p for p in PARTS if p in set(table.part)):
        for system in (s for s in SYSTEMS if s in set(table.system)):
            t = table[(table.system == system) & (table.part == part)]
            starved = int(t.array_limited.sum())
            rows.append(Comparison("issue 25", f"{system} on {part}: output tokens/s over the grid", none,
                                   _spread(table, system, part),
                                   f"{starved} of {len(t)} points have arrays below the part's "
                                   f"{t.interface_gbps_per_stack.iloc[0]:g} GB/s interface"))
        if {"dash", "hbflex"} <= set(table.system) and not ctx.tiny:
            t = table[table.part == part].pivot_table(index=["t_read_us", "read_units_per_die"], columns="system",
                                                      values="throughput_tokens_per_s")
            ratio = (t["dash"] / t["hbflex"])
            lo, hi = ratio.idxmin(), ratio.idxmax()
            rows.append(Comparison("issue 25", f"DASH over HBFlex tokens/s on {part}", none,
                                   f"{ratio.min():.3g}× to {ratio.max():.3g}×",
                                   f"lowest at tR {lo[0]:g} µs, {lo[1]} units; highest at tR {hi[0]:g} µs, {hi[1]} units: "
                                   "where the designs disagree most is where this ratio moves"))
    flex = table[table.system == "hbflex"].pivot_table(index=["t_read_us", "read_units_per_die"], columns="part",
                                                       values="throughput_tokens_per_s")
    if flex.shape[1] > 1:
        spread = float((flex.max(axis=1) / flex.min(axis=1) - 1.0).max())
        rows.append(Comparison("issue 25", "HBFlex: largest difference between parts at one (tR, read units)", none,
                               f"{spread:.2%}", "each organisation keeps its stacks and links (DASH 2 stacks, HBFlex 6 "
                               "with 488 GB/s links each): HBFlex's links bind before any part's interface, so only "
                               "tR and read units move it; DASH's links are wider than two parts' interfaces, which cap it "
                               "(sandisk-gen1 1.6 TB/s, slc-96l 488 GB/s per stack)"))
    return rows
