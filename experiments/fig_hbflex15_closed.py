"""HBFlex Fig. 15 at the paper's operating point: the TTFT and TPOT speedups of HBFlex over FA-CLI, FA-CSI and
H3 in a closed loop (agent tasks per GPU, slots = tasks, the real KV room; HBFlex §6.1, §6.3) against the
number of tasks: on SWE-bench read from Fig. 16's runs, and on Mooncake conversations (our stand-in for
Bailian To-C), whose tasks run conversations one after another with the trace's recorded gaps as think
times. Beside ``fig_hbflex15_latency``'s open-loop replay of three traces at their own rate."""

from __future__ import annotations

import jax
import matplotlib.pyplot as plt
import pandas as pd

from experiments import fig_hbflex16_concurrency as fig16
from experiments.common import Comparison, Context, cached_table, save_figure
from experiments.fig_hbflex15_latency import PAPER

TITLE = ("HBFlex Fig. 15 at the operating point — TTFT/TPOT speedups vs concurrent tasks (closed loop), "
         "SWE-bench and Mooncake")
NAME = "hbflex15_closed"
METRICS = (("ttft_s", "TTFT speedup of HBFlex"), ("tpot_ms", "TPOT speedup of HBFlex"))
COLUMNS = ("trace", "model", "tasks", "slots", "point", "streams", "ttft_s", "ci95_ttft_s", "tpot_ms",
           "ci95_tpot_ms", "mean_requests_in_system", "window_requests", "saturated")
# Mooncake's recorded gaps between a conversation's turns are long and uneven (minutes), so tasks drift apart
# by more turns than they have: a warm-up in turns leaves no window (32 tasks × 12 turns, 2 warm-up: none in 2
# of 4 streams), so the warm-up is in time (metrics.ClosedLoop): the first tenth of the span in which every
# task is in the loop (from the last task's first request to the first task's last)
MOONCAKE_TURNS, MOONCAKE_WARMUP_FRACTION = 12, 0.1
MOONCAKE_TASKS, MOONCAKE_CPU_TASKS = (16, 64, 256), (16, 64)  # 64 tasks: ≈ 24 s a point and model on 2 CPU cores


def _mooncake_size(ctx: Context):
    if ctx.tiny:
        return 2, 6, MOONCAKE_WARMUP_FRACTION, fig16.MODELS[:1], (4,)
    if jax.default_backend() == "cpu":
        return min(ctx.streams, fig16.MAX_CPU_STREAMS), MOONCAKE_TURNS, MOONCAKE_WARMUP_FRACTION, fig16.MODELS, \
            MOONCAKE_CPU_TASKS
    return ctx.streams, MOONCAKE_TURNS, MOONCAKE_WARMUP_FRACTION, fig16.MODELS, MOONCAKE_TASKS


def _compute(ctx: Context) -> pd.DataFrame:
    swebench = fig16.closed_loop_table(ctx).assign(trace=fig16.TRACE)
    streams, turns, warmup_fraction, models, levels = _mooncake_size(ctx)
    mooncake = fig16.closed_loop_rows("mooncake", models, levels, streams, turns, 0, ctx.seed,
                                      warmup_fraction=warmup_fraction).assign(trace="mooncake")
    return pd.concat([swebench, mooncake], ignore_index=True)[list(COLUMNS)]


def latency_table(ctx: Context) -> pd.DataFrame:
    """This figure's data: the latency columns of Fig. 16's SWE-bench table and of the Mooncake runs."""
    _, turns, warmup, models, levels = _mooncake_size(ctx)
    return cached_table(ctx, NAME, {"from": fig16.NAME, "columns": list(COLUMNS), "mooncake_turns": turns,
                                    "mooncake_warmup_fraction": warmup, "mooncake_models": list(models),
                                    "mooncake_tasks": list(levels)}, lambda: _compute(ctx))


def speedup(table, baseline: str, tasks: int, metric: str) -> float:
    """Geomean over the models of the baseline's latency over HBFlex's at ``tasks`` (> 1: HBFlex is faster)."""
    return fig16.ratio(table, baseline, tasks, metric, invert=True)


STYLE = {"swebench": ("o-", "SWE-bench"), "mooncake": ("s--", "Mooncake (To-C stand-in)")}


def _plot(table, ctx: Context) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    levels = sorted(set(table.tasks))
    colours = dict(zip(PAPER, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for i, (ax, (metric, label)) in enumerate(zip(axes, METRICS)):  # PAPER[b] is (TTFT, TPOT): i picks one
        for trace, part in table.groupby("trace", sort=False):
            style, name = STYLE[trace]
            mine = sorted(set(part.tasks))
            for b in PAPER:
                ax.plot(mine, [speedup(part, b, n, metric) for n in mine], style, color=colours[b],
                        label=f"vs {b}, {name}")
        for b in PAPER:
            ax.axhline(PAPER[b][i], color=colours[b], ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.minorticks_off()
        if metric == "ttft_s":  # H3's TTFT ratio spans an order of magnitude beside the others' ≈ 1.2
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.set_xlabel("concurrent tasks per GPU (closed loop)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=6, title="dotted: paper (Bailian + SWE-bench)", title_fontsize=7)
    save_figure(fig, ctx, NAME)


def _h3_note(table, hi: int) -> str:
    """Where H3's 36 GB of HBM KV binds: its TTFT per model at the top level, against HBFlex's."""
    h3 = table[(table.tasks == hi) & (table.point == "h3")]
    hb = table[(table.tasks == hi) & (table.point == "hbflex")].set_index("model")
    per = "; ".join(f"{r.model}: H3 TTFT {r.ttft_s:.1f} s against HBFlex's {hb.ttft_s[r.model]:.2f} s"
                    for r in h3.itertuples())
    return (f"at {hi} tasks {per}: H3's TTFT grows where its HBM KV (36 GB) turns admission into queueing and it "
            "recomputes every later turn (it retains no KV), so the TTFT ratio depends on how far past that bound "
            "the load is; the paper's 22.65× comes from the Bailian traces' KV pressure, not reproduced here. "
            + _h3_tpot_note(speedup(table, "h3", hi, "tpot_ms")))


BANDWIDTH_RATIO = 2.93 / 2.20  # HBFlex's weight-read bandwidth over H3's (¾ of 6 stacks), TB/s


def _h3_tpot_note(ratio: float) -> str:
    """Where H3's TPOT ratio sits against the weight-bandwidth ratio, and what moves it there."""
    where = (f"H3's TPOT ratio {ratio:.2f}× against the weight-bandwidth ratio {BANDWIDTH_RATIO:.2f}× (HBFlex's 2.93 "
             "TB/s over H3's 2.20 TB/s, ¾ of 6 stacks): ")
    if ratio >= BANDWIDTH_RATIO:
        return where + ("above it by the prefill chunks of the turns H3 recomputes; the paper's 1.89× needs more of "
                        "them (longer Bailian sessions), not traced further")
    return where + ("below it: both share the GPU compute of the long prompts' prefill chunks, and H3 reads its KV "
                    "from HBM where HBFlex reads it from HBF (long contexts make those reads large); which of the two "
                    "dominates is not traced")


def _lead_note(table, baseline: str, lo: int, hi: int) -> str:
    """HBFlex's TPOT lead in ms and as a ratio from ``lo`` to ``hi`` tasks (per model, from the table), and why
    the ratio can fall while the lead grows."""
    t = table.set_index(["model", "tasks", "point"]).tpot_ms
    lead = {m: (t[m, lo, baseline] - t[m, lo, "hbflex"], t[m, hi, baseline] - t[m, hi, "hbflex"])
            for m in sorted(set(table.model))}
    per = "; ".join(f"{m}: {a:.0f} → {b:.0f} ms" for m, (a, b) in lead.items())
    out = f"HBFlex's TPOT lead over {baseline} from {lo} to {hi} tasks: {per}"
    falls = speedup(table, baseline, hi, "tpot_ms") < speedup(table, baseline, lo, "tpot_ms")
    if falls and all(b > a for a, b in lead.values()):
        out += ("; it grows while the ratio falls: the part of a pass every organisation shares (the GPU's compute "
                "over more running requests) grows faster than the weight-read time the organisations differ in "
                "(every pass with a prefill chunk streams nearly all expert weights)")
    return out


def _setting(table, trace: str) -> str:
    part = table[table.trace == trace]
    hb = part[part.point == "hbflex"]
    load = ", ".join(f"{n}: {hb[hb.tasks == n].mean_requests_in_system.mean():.0f}" for n in sorted(set(hb.tasks)))
    turns = (f"{fig16.TURNS} turns a task (Fig. 16's runs)" if trace == fig16.TRACE else
             f"{MOONCAKE_TURNS} turns a task (the first {MOONCAKE_WARMUP_FRACTION:.0%} of the full loop's span as "
             "warm-up), the recorded gaps as think times")
    return (f"{', '.join(sorted(set(part.model)))}, closed loop, slots = tasks, the real KV room, {turns}; windows of "
            f"{int(part.window_requests.min())}–{int(part.window_requests.max())} requests a stream; requests in the "
            f"system on HBFlex by tasks {load}")


def run(ctx: Context) -> list[Comparison]:
    table = latency_table(ctx)
    _plot(table, ctx)
    rows = []
    for trace, part in table.groupby("trace", sort=False):
        lo, hi = min(part.tasks), max(part.tasks)
        common = (f"{_setting(table, trace)}; the paper: 4 models, Bailian To-B/To-C/Coding/Thinking and SWE-bench, "
                  f"one geomean; {hi} tasks is this table's top on the CPU")
        for b, (p_ttft, p_tpot) in PAPER.items():
            ttft = [speedup(part, b, n, "ttft_s") for n in (lo, hi)]
            tpot = [speedup(part, b, n, "tpot_ms") for n in (lo, hi)]
            note = common + f"; {_h3_note(part, hi) if b == 'h3' else _lead_note(part, b, lo, hi)}"
            rows.append(Comparison(f"HBFlex Fig. 15 (closed loop, {STYLE[trace][1]})",
                                   f"geomean TTFT / TPOT speedup of HBFlex over {b}, {lo} / {hi} tasks",
                                   f"{p_ttft:.2f}× / {p_tpot:.2f}×",
                                   f"{ttft[0]:.2f}× / {tpot[0]:.2f}× at {lo}; {ttft[1]:.2f}× / {tpot[1]:.2f}× at {hi}",
                                   note))
    return rows
