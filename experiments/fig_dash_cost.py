"""DASH §VI-G: nominal capacity per cost of DASH (2 HBM3E + 2 HBF stacks) against a four-HBM3E
reference, G(r, δ) = (C_DASH / C_ref) · 4 / (2 + 2r + δ), with r the HBF-to-HBM per-stack cost ratio
and δ DASH's incremental integration cost in HBM-stack units. The 44.67 of the paper is
4 · 1,072 GB / 96 GB, derived here from the stack capacities."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import Comparison, Context, cached_table, save_figure
from hbfjax.hardware import preset

TITLE = "DASH §VI-G — nominal capacity per cost G(r, δ) of DASH against four HBM3E stacks"
NAME = "dash_cost"
GB = 1e9
HBM_STACK_GB = 24.0  # DASH §VI-G: 24-GB HBM3E stack [25]
HBF_STACK_GB = 512.0  # DASH §VI-G: 512-GB HBF stack (fact sheet [37])
REF_HBM_STACKS = 4  # the four-HBM reference
DASH_HBM_STACKS, DASH_HBF_STACKS = 2, 2
R_GRID = tuple(float(r) for r in np.round(np.geomspace(0.25, 64.0, 33), 4))
DELTAS = (0.0, 1.0, 2.0, 4.0, 8.0)


def capacities_gb(hbm_gb: float = HBM_STACK_GB, hbf_gb: float = HBF_STACK_GB) -> tuple[float, float]:
    """(DASH, reference) nominal capacity in GB."""
    return DASH_HBM_STACKS * hbm_gb + DASH_HBF_STACKS * hbf_gb, REF_HBM_STACKS * hbm_gb


def numerator(hbm_gb: float = HBM_STACK_GB, hbf_gb: float = HBF_STACK_GB) -> float:
    """The constant of G = K / (2 + 2r + δ): K = (C_DASH / C_ref) · (reference cost in HBM stacks)."""
    dash, ref = capacities_gb(hbm_gb, hbf_gb)
    return dash / ref * REF_HBM_STACKS


def gain(r, delta, hbm_gb: float = HBM_STACK_GB, hbf_gb: float = HBF_STACK_GB):
    """G(r, δ): capacity per cost of DASH over the reference (costs in units of one HBM stack)."""
    cost = DASH_HBM_STACKS + DASH_HBF_STACKS * np.asarray(r, np.float64) + np.asarray(delta, np.float64)
    return numerator(hbm_gb, hbf_gb) / cost


def break_even(delta: float = 0.0) -> float:
    """The r at which G = 1 for a given δ (G > 1 below it)."""
    return (numerator() - DASH_HBM_STACKS - delta) / DASH_HBF_STACKS


def _compute() -> pd.DataFrame:
    rows = [{"r": r, "delta": d, "gain": float(gain(r, d))} for d in DELTAS for r in R_GRID]
    return pd.DataFrame(rows)


def run(ctx: Context) -> list[Comparison]:
    table = cached_table(ctx, NAME, {"r": R_GRID, "deltas": DELTAS, "hbm_gb": HBM_STACK_GB, "hbf_gb": HBF_STACK_GB},
                         _compute)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for d in DELTAS:
        t = table[table.delta == d]
        ax.plot(t.r, t.gain, label=f"δ = {d:g}")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.plot([1.0], [11.17], "k*", ms=11, label="paper: 11.17× at (1, 0)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("r = C_HBF / C_HBM (per stack)")
    ax.set_ylabel("G(r, δ)  (capacity per cost vs 4 × HBM3E)")
    ax.legend(fontsize=8)
    dash_gb, ref_gb = capacities_gb()
    ax.set_title(f"{dash_gb:,.0f} GB vs {ref_gb:,.0f} GB nominal: G = {numerator():.2f} / (2 + 2r + δ)", fontsize=9)
    save_figure(fig, ctx, NAME)
    hbf = preset("dash").hbf
    geometry_gb = hbf.capacity_bytes / hbf.stacks / GB
    return [
        Comparison("DASH §VI-G", "numerator of G (4 · C_DASH / C_ref)", "44.67", f"{numerator():.2f}",
                   f"from {dash_gb:,.0f} GB and {ref_gb:,.0f} GB; with the preset's geometry "
                   f"({geometry_gb:.1f} GB per HBF stack) it is {numerator(hbf_gb=geometry_gb):.2f}"),
        Comparison("DASH §VI-G", "G at (r, δ) = (1, 0)", "11.17×", f"{float(gain(1.0, 0.0)):.2f}×"),
        Comparison("DASH §VI-G", "G > 1 while 2r + δ <", "42.67", f"{numerator() - DASH_HBM_STACKS:.2f}"),
        Comparison("DASH §VI-G", "break-even r at δ = 0", "21.33", f"{break_even(0.0):.2f}"),
    ]
