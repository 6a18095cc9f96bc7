"""Energy and cost per output token (issue 25): DASH's four organisations, HBFlex and its baselines, and the
CPU-offloading systems serving one fixed batch on one GPU, on tokens/s, J/token (split by where the
energy goes) and $/Mtoken (capital over the run's span and electricity), from ``hbfjax serve``'s own
energy keys (``hbfjax.energy``: every value with its source, in the table's ``energy_model`` columns).

One run of ``hbfjax serve`` per batch size, every system in it on the same GPU (the H100 PCIe of DASH
§VI-A: a mixed run serves all systems on one GPU, so HBFlex is priced here on DASH's GPU rather than its
paper's H200) at DASH Fig. 9(a)'s 1K/128 on Qwen3-235B-A22B, a model both papers serve. Neither paper
reports energy or cost per token, so there is no paper value to compare with: the rows state what our
numbers are and what sets them. The CPU-offloading systems' energy adds host DRAM, PCIe and the host
CPU's FLOPs, counted by the engine for the split each system chose (``hbfjax.energy``); their capital is
the GPU and its own five HBM stacks (the host is left out of every system's capital alike)."""

from __future__ import annotations

import argparse

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments import _dash_serve as ds
from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax import energy
from hbfjax.commands import serve

TITLE = "Energy and cost per token — DASH's and HBFlex's organisations and the CPU-offloading baselines (issue 25)"
NAME = "energy_cost"
MODEL = "qwen3-235b-a22b"
BATCHES = (4, 32)
PROMPT, OUTPUT = 1024, 128  # DASH Fig. 9(a)'s "1K/128"
SYSTEMS = ("dash", "compact-dash", "relay-only", "direct-only", "hbflex", "naive-hbf", "h3", "cpu-stream", "hybrid")
MAX_STREAMS = 8  # a fixed batch is nearly deterministic (only the distinct-expert counts are drawn)
WHERE = ("gpu_compute", "hbm", "hbf_read", "hbf_program", "hbf_erase", "links", "sram", "host_dram", "pcie",
         "cpu_compute", "static")
SPENT_ON = ("capital_gpu", "capital_hbm", "capital_hbf", "electricity")
HIGH_READ_PJ_PER_BIT = 30.0  # the top of the published HBF read range (energy is linear in it: exact)
METRICS = ("throughput_tokens_per_s", "energy_j_per_token", "energy_j_per_request", "power_w", "cost_usd_per_mtoken",
           "hbf_lifetime_years", "gpu_tflop_per_token")


def _row(batch: int, result: dict) -> dict:
    row = {"batch": batch, "system": result["system"]}
    for key in METRICS:
        row[key] = np.nan if result.get(key) is None else result[key]
        row[f"ci95_{key}"] = np.nan if result.get(f"ci95_{key}") is None else result[f"ci95_{key}"]
    for group, names, prefix in (("energy_breakdown_j_per_token", WHERE, "energy_"),
                                 ("cost_breakdown_usd_per_mtoken", SPENT_ON, "cost_")):
        parts = result.get(group) or {}
        row.update({f"{prefix}{k}": parts.get(k, np.nan) for k in names})
    return row


def serve_args(batch: int, prompt: int, output: int, model: str, streams: int, seed: int) -> list[str]:
    """The ``hbfjax serve`` command line of one batch size (every system in one run)."""
    return ["serve", "--system", *SYSTEMS, "--model", model, "--batch", str(batch), "--prompt", str(prompt),
            "--output", str(output), "--streams", str(streams), "--seed", str(seed), "--json"]


def serve_parser() -> argparse.ArgumentParser:
    """``hbfjax serve``'s parser alone (not ``hbfjax.cli``'s, whose every command would key this table)."""
    parser = argparse.ArgumentParser(prog="hbfjax")
    serve.register(parser.add_subparsers(dest="command", required=True))
    return parser


def _compute(ctx: Context) -> pd.DataFrame:
    if ctx.tiny:
        model, batches, prompt, output = ds.TINY_MODEL, (1,), ds.TINY_PROMPT, ds.TINY_OUTPUT
    else:
        model, batches, prompt, output = MODEL, BATCHES, PROMPT, OUTPUT
    streams = min(ctx.streams, MAX_STREAMS)
    parser = serve_parser()
    rows = []
    for b in batches:
        result = serve.compute(parser.parse_args(serve_args(b, prompt, output, model, streams, ctx.seed)))
        rows += [_row(b, r) for r in result["systems"]]
        model_used = result["energy_model"]
    table = pd.DataFrame(rows)
    table.insert(0, "model", model)
    for name, v in model_used.items():  # the values the run used (their sources: hbfjax serve --help)
        table[f"energy_model_{name}"] = v["value"]
    return table


def _stacked(ax, t: pd.DataFrame, parts: tuple, prefix: str, scale: float = 1.0) -> None:
    x = np.arange(len(t))
    bottom = np.zeros(len(t))
    for i, part in enumerate(parts):
        v = np.nan_to_num(t[f"{prefix}{part}"].to_numpy(np.float64)) * scale
        if np.any(v > 0):
            ax.bar(x, v, 0.7, bottom=bottom, label=part, color=plt.cm.tab20(i))
        bottom += v
    for i, missing in enumerate(t[f"{prefix}{parts[0]}"].isna()):
        if missing:
            ax.text(i, 0, "not\nmodelled", ha="center", va="bottom", fontsize=6, rotation=90)


def _plot(table: pd.DataFrame, ctx: Context) -> None:
    batches = sorted(set(table.batch))
    fig, axes = plt.subplots(len(batches), 3, figsize=(13.5, 3.6 * len(batches)), squeeze=False)
    for i, b in enumerate(batches):
        t = table[table.batch == b].reset_index(drop=True)
        x = np.arange(len(t))
        axes[i, 0].bar(x, t.throughput_tokens_per_s, 0.7, yerr=t.ci95_throughput_tokens_per_s,
                       color=["C0" if s in ds.ORGANISATIONS else "C2" if s.startswith(("cpu", "hybrid")) else "C1"
                              for s in t.system])
        axes[i, 0].set_ylabel(f"B = {b}: tokens/s")
        axes[i, 0].set_yscale("log")
        _stacked(axes[i, 1], t, WHERE, "energy_")
        dear = t.energy_j_per_token + t.energy_hbf_read * (HIGH_READ_PJ_PER_BIT / t.energy_model_hbf_read_pj_per_bit - 1)
        axes[i, 1].plot(x, dear, "k_", ms=14, mew=2, label=f"total at {HIGH_READ_PJ_PER_BIT:g} pJ/bit HBF reads")
        axes[i, 1].set_ylabel("J per output token")
        _stacked(axes[i, 2], t, SPENT_ON, "cost_")
        axes[i, 2].set_ylabel("$ per million output tokens")
        for ax in axes[i]:
            ax.set_xticks(x, t.system, rotation=60, ha="right", fontsize=7)
    axes[-1, 1].legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    axes[-1, 2].legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.suptitle(f"{table.model.iloc[0]}, fixed batch 1K/128 on one H100 PCIe; energy at the sourced "
                 "defaults (hbfjax serve --help): HBF read 8.5 pJ/bit, program 190 pJ/bit (assumed)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, ctx, NAME)


def _get(table: pd.DataFrame, batch: int, system: str, key: str) -> float:
    return float(table[(table.batch == batch) & (table.system == system)][key].iloc[0])


STATIC_STEP_W = 10.0  # the static power the notes price (--static-w; 0 by default: no source states one)


def _static_note(table: pd.DataFrame, batch: int, system: str) -> str:
    """What static power would add per token: span × W over the tokens, i.e. W / throughput (a batch run)."""
    per = {s: STATIC_STEP_W / _get(table, batch, s, "throughput_tokens_per_s") for s in (system, "dash")
           if s in set(table.system)}
    dash = f" ({per['dash']:.2g} J for DASH)" if "dash" in per else ""
    return (f"static power is 0 by default (--static-w): every {STATIC_STEP_W:g} W of it adds {per[system]:.2g} J per "
            f"output token here{dash}, so a slow system's J/token is a lower bound that idle power dominates")


def run(ctx: Context) -> list[Comparison]:
    params = {"model": MODEL, "batches": BATCHES, "prompt": PROMPT, "output": OUTPUT, "systems": SYSTEMS,
              "max_streams": MAX_STREAMS, "energy_defaults": energy.FIELDS}
    table = cached_table(ctx, NAME, params, lambda: _compute(ctx))
    _plot(table, ctx)
    b = int(table.batch.max())
    rows = []
    none = "not reported (neither paper gives energy or cost per token)"
    for system in ("dash", "relay-only", "hbflex", "naive-hbf"):
        if system not in set(table.system):
            continue
        e = _get(table, b, system, "energy_j_per_token")
        read_j = _get(table, b, system, "energy_hbf_read")
        read = read_j / e
        dear = e + read_j * (HIGH_READ_PJ_PER_BIT / _get(table, b, system, "energy_model_hbf_read_pj_per_bit") - 1)
        rows.append(Comparison("issue 25", f"{system}: J per output token at B = {b}", none,
                               f"{e:.3g} ± {_get(table, b, system, 'ci95_energy_j_per_token'):.2g}",
                               f"HBF reads {read:.0%} of it (weights read every iteration; {dear:.3g} J at "
                               f"{HIGH_READ_PJ_PER_BIT:g} pJ/bit); {_get(table, b, system, 'power_w'):.0f} W on average"))
        rows.append(Comparison("issue 25", f"{system}: $ per million output tokens at B = {b}", none,
                               f"{_get(table, b, system, 'cost_usd_per_mtoken'):.3g} ± "
                               f"{_get(table, b, system, 'ci95_cost_usd_per_mtoken'):.2g}",
                               f"capital {1 - _get(table, b, system, 'cost_electricity') / _get(table, b, system, 'cost_usd_per_mtoken'):.0%}; "
                               f"HBF lifetime at this write rate {_get(table, b, system, 'hbf_lifetime_years'):.3g} years"))
    for system in ("cpu-stream", "hybrid"):
        if system not in set(table.system):
            continue
        e = _get(table, b, system, "energy_j_per_token")
        host = {k: _get(table, b, system, f"energy_{k}") / e for k in ("host_dram", "pcie", "cpu_compute")}
        ratio = e / _get(table, b, "dash", "energy_j_per_token") if "dash" in set(table.system) else np.nan
        rows.append(Comparison("issue 25", f"{system}: J per output token at B = {b}", none,
                               f"{e:.3g} ± {_get(table, b, system, 'ci95_energy_j_per_token'):.2g}",
                               f"host DRAM {host['host_dram']:.0%}, PCIe {host['pcie']:.0%}, host CPU "
                               f"{host['cpu_compute']:.0%} of it; {ratio:.3g}x DASH's; "
                               f"{_get(table, b, system, 'cost_usd_per_mtoken'):.3g} $ per million output tokens; "
                               f"{_static_note(table, b, system)}"))
    return rows
