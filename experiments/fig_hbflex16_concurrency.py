"""HBFlex Fig. 16: throughput of HBFlex over FA-CLI, FA-CSI and H3 against the number of concurrent
SWE-bench tasks per GPU, in a closed loop (HBFlex §6.1, §6.3: "4,096 concurrent SWE-bench tasks across
four data-parallel GPUs"): each task runs the trace's sessions one after another, issuing a turn the
recorded gap after its previous turn finishes, in as many slots as tasks (up to 1,024) and the real KV
room (what the weights leave of the package). DeepSeek-V3 and Qwen3-235B (BF16 weights, DASH Table II),
the two models the issue names; each task count is one compilation shared by the four organisations."""

from __future__ import annotations

import jax
import matplotlib.pyplot as plt
import pandas as pd

from experiments import _hbflex_serving as hs
from experiments.common import Comparison, Context, cached_table, save_figure
from experiments.fig_hbflex15_latency import geomean

TITLE = "HBFlex Fig. 16 — throughput vs concurrent SWE-bench tasks (closed loop): HBFlex over FA-CLI, FA-CSI and H3"
NAME = "hbflex16_concurrency"
TRACE = "swebench"
TASKS = (16, 64, 256, 1024)  # agent tasks per GPU (HBFlex §6.3: 4,096 over four GPUs is 1,024 each)
CPU_TASKS = TASKS[:3]  # a 2-core CPU stops at 256 (H3 at 1,024 alone runs ~18 K iterations a stream of 1,024
#                        slots); the device session (hbfjax/bench/_device_session.py, step fig16) runs all four
MODELS = ("deepseek-v3", "qwen3-235b-a22b")
TURNS, WARMUP_TURNS = 3, 0  # turns per task; the window opens once every task has started
MAX_CPU_STREAMS = 4
POINTS = ("hbflex", "fa-cli", "fa-csi", "h3")
PAPER = {"fa-cli": (1.31, 1.48), "fa-csi": (1.47, 1.58), "h3": (1.56, 3.30)}  # lowest, highest concurrency
KEYS = ("throughput_tokens_per_s", "tpot_ms", "ttft_s", "e2e_s", "mean_requests_in_system", "window_start_s",
        "window_end_s", "window_requests", "prefix_hit_tokens_fraction", "read_wave_amplification", "waf")


def _size(ctx: Context):
    if ctx.tiny:
        return 2, 3, 0, MODELS[:1], TASKS[:1]
    if jax.default_backend() == "cpu":
        return min(ctx.streams, MAX_CPU_STREAMS), TURNS, WARMUP_TURNS, MODELS, CPU_TASKS
    return ctx.streams, TURNS, WARMUP_TURNS, MODELS, TASKS


def closed_loop_rows(trace: str, model_names, levels, streams: int, turns: int, warmup_turns: int,
                     seed: int, warmup_fraction: float | None = None) -> pd.DataFrame:
    """The four organisations serving ``trace``'s sessions in a closed loop of each task count in ``levels``
    (``warmup_fraction``: a warm-up in time, ``warmup_turns`` 0: ``metrics.ClosedLoop``)."""
    inputs = hs.trace_inputs(trace, None)
    rows = []
    for model in model_names:
        for tasks in levels:  # one compilation per (model, tasks): the slot table's size is a shape
            sc = hs.closed_scenario(model, inputs, tasks=tasks, turns=turns, warmup_turns=warmup_turns,
                                    warmup_fraction=warmup_fraction)
            fam = hs.family(POINTS, sc)
            for name, s in zip(POINTS, hs.summaries(fam, hs.run(fam, streams, seed))):
                rows.append({"model": model, "tasks": tasks, "slots": sc.slots, "point": name, "streams": streams,
                             **hs.row(s, KEYS), "overflow": s["overflow"], "saturated": s["saturated"]})
    return pd.DataFrame(rows)


def _compute(ctx: Context) -> pd.DataFrame:
    streams, turns, warmup_turns, model_names, levels = _size(ctx)
    return closed_loop_rows(TRACE, model_names, levels, streams, turns, warmup_turns, ctx.seed)


def ratio(table, baseline: str, level: int, metric: str, invert: bool = False) -> float:
    t = table[table.tasks == level].set_index(["model", "point"])[metric].unstack("point")
    r = t["hbflex"] / t[baseline]
    return geomean(1.0 / r if invert else r)


def _plot(table, ctx):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    levels = sorted(set(table.tasks))
    for b in POINTS[1:]:
        axes[0].plot(levels, [ratio(table, b, c, "throughput_tokens_per_s") for c in levels], "o-", label=f"vs {b}")
        axes[1].plot(levels, [ratio(table, b, c, "tpot_ms", invert=True) for c in levels], "o-", label=f"vs {b}")
    for b, (lo, hi) in PAPER.items():
        axes[0].plot([levels[0], levels[-1]], [lo, hi], "x", color="grey")
    for ax, label in ((axes[0], "throughput speedup of HBFlex"), (axes[1], "decode-rate (1/TPOT) speedup")):
        ax.set_xscale("log")
        ax.set_xlabel("concurrent SWE-bench tasks per GPU (closed loop)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7, title="× paper, lowest / highest", title_fontsize=7)
    save_figure(fig, ctx, NAME)


def _in_system(table, level) -> str:
    rows = table[(table.tasks == level) & (table.point == "hbflex")]
    return f"{rows.mean_requests_in_system.mean():.0f}"


def closed_loop_table(ctx: Context) -> pd.DataFrame:
    """The closed-loop table (computed once, read back after): also Fig. 15's at the operating point."""
    return cached_table(ctx, NAME, {"tasks": list(_size(ctx)[4]), "turns": TURNS, "warmup_turns": WARMUP_TURNS,
                                    "models": list(MODELS), "max_cpu_streams": MAX_CPU_STREAMS}, lambda: _compute(ctx),
                        module=__name__)


def run(ctx: Context) -> list[Comparison]:
    table = closed_loop_table(ctx)
    _plot(table, ctx)
    lo, hi = min(table.tasks), max(table.tasks)
    h3_hits = table[table.point == "h3"].prefix_hit_tokens_fraction.max()
    rows = []
    for b, (p_lo, p_hi) in PAPER.items():
        rows.append(Comparison(
            "HBFlex Fig. 16", f"geomean throughput speedup over {b}, lowest / highest concurrency",
            f"{p_lo:.2f}× / {p_hi:.2f}×",
            f"{ratio(table, b, lo, 'throughput_tokens_per_s'):.2f}× / {ratio(table, b, hi, 'throughput_tokens_per_s'):.2f}× "
            f"(decode rate {ratio(table, b, lo, 'tpot_ms', True):.2f}× / {ratio(table, b, hi, 'tpot_ms', True):.2f}×)",
            f"{lo} and {hi} closed-loop SWE-bench tasks per GPU ({', '.join(MODELS)}; slots = tasks; requests in "
            f"the system on HBFlex: {_in_system(table, lo)} and {_in_system(table, hi)}; the real KV room; H3 retains "
            f"no KV and recomputes later turns, its prefix hits at most {h3_hits:.2f}); a window of "
            f"{int(table.window_requests.min())}–{int(table.window_requests.max())} requests a stream, {TURNS} turns a "
            f"task, from the moment every task has started (warm-up {WARMUP_TURNS} turns), before the KV room has turned "
            f"over; {hi} tasks is this table's top (a 2-core CPU stops at {CPU_TASKS[-1]}; the device session runs "
            f"{TASKS[-1]}); Hunyuan and V4-Pro not run (V4-Pro needs TP = 2, not modelled)"))
    return rows

