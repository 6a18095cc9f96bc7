"""HBFlex Fig. 5c: placement imbalance of the active KV working set as requests complete and arrive."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from experiments._hbflex_models import MODELS
from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax import batch, traces
from hbfjax.flash.reads import workingset
from hbfjax.hardware import preset

TITLE = "HBFlex Fig. 5c — placement imbalance over a trace (Mooncake conversation contexts)"
NAME = "hbflex5_imbalance"
TRACE = "mooncake_conversation.jsonl"
SLOTS = 32
MEASUREMENTS = 48
GROUP_SIZE = 32
PLACEMENTS = ("random", "plane-group")


def _compute(ctx: Context) -> pd.DataFrame:
    planes = preset("hbflex").hbf.parallel_units
    kv = MODELS["Qwen3-235B"]["kv_bytes_per_token"]
    contexts = workingset.WorkingSetInputs.make(traces.load_trace(TRACE).context_tokens)
    streams, measurements = (2, 4) if ctx.tiny else (max(4, ctx.streams // 32), MEASUREMENTS)
    rows = []
    for placement in PLACEMENTS:
        config = workingset.attention_config(planes, SLOTS, kv, measurements=measurements, placement=placement,
                                             max_context_tokens=32768)
        knobs = workingset.WorkingSetKnobs.make(kv, group_size=GROUP_SIZE)
        out = batch.run(workingset.simulate, streams, ctx.seed, knobs, config, inputs=contexts)
        for m in range(measurements):
            for s in range(streams):
                rows.append({"placement": placement, "stream": s, "event": (m + 1) * config.events_per_measurement,
                             "max_to_avg_load": float(out.max_to_avg_load[s, m]),
                             "hot_plane_fraction": float(out.hot_plane_fraction[s, m])})
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"slots": SLOTS, "measurements": MEASUREMENTS, "trace": TRACE},
                         lambda: _compute(ctx))
    fig, axes = plt.subplots(2, 1, figsize=(7, 4.6), sharex=True)
    first = table[table.stream == 0]
    for placement in PLACEMENTS:
        one = first[first.placement == placement]
        axes[0].plot(one.event, one.max_to_avg_load, marker=".", label=f"{placement} (stream 0)")
        axes[1].plot(one.event, 100 * one.hot_plane_fraction, marker=".", label=placement)
    axes[0].set(ylabel="max / avg plane load")
    axes[1].set(ylabel="hot planes (%)\n(load > 1.5 × mean)",
                xlabel=f"request completions + arrivals ({SLOTS} concurrent, Mooncake contexts, Qwen3-235B KV)")
    axes[0].legend(fontsize=8)
    save_figure(fig, ctx, NAME)
    rows = []
    for placement in PLACEMENTS:
        part = table[table.placement == placement]
        per_stream = part.groupby("stream").max_to_avg_load
        rows.append(Comparison("HBFlex Fig. 5c", f"max/avg plane load, {placement}: mean and highest spike",
                               "repeated spikes (Bailian trace)",
                               f"{part.max_to_avg_load.mean():.2f}, spike {per_stream.max().mean():.2f}",
                               "spikes follow completions of long requests; our trace is Mooncake, not Bailian"))
    return rows
