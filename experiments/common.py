"""What every figure module shares: cached data tables, plot saving, and paper-vs-hbfjax rows.

A figure module ``experiments/fig_<name>.py`` defines ``TITLE`` and ``run(ctx) -> list[Comparison]``.
It computes a tidy table (one row per stream-aggregate × knob point), saves it as
``figures/<name>.csv`` beside ``figures/<name>.png``, and returns the rows that go into the
"paper value vs hbfjax value" table of ``figures/README.md``.

Tables are cached: ``cached_table`` reuses ``<name>.csv`` when the sidecar ``<name>.params.json``
matches the parameters of this run, so an interrupted ``make figures`` resumes figure by figure.
The parameters include a digest of the simulator and experiment sources, so a table computed by
older code is never reused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from hbfjax import provenance


@dataclass(frozen=True)
class Context:
    streams: int  # Monte Carlo streams per point
    out_dir: Path  # where PNG/CSV/JSON land
    seed: int = 0
    force: bool = False  # recompute even when a cached table matches
    tiny: bool = False  # smoke-test size: each figure shrinks its loops (numbers meaningless, code paths the same)


@dataclass(frozen=True)
class Comparison:
    """One line of the paper-vs-hbfjax table."""

    figure: str  # e.g. "HBFlex Fig. 17"
    quantity: str  # what is compared, with units
    paper: str  # the paper's reported value, as the paper states it
    hbfjax: str  # our value (with its 95 % CI where it has one)
    note: str = ""  # the gap explained, or the setting that differs


def source_digest() -> str:
    """First 16 hex digits of a SHA-256 over every ``.py`` file of ``hbfjax/`` and ``experiments/``."""
    return provenance.source_digest(("hbfjax", "experiments"))


def cached_table(ctx: Context, name: str, params: dict, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """``compute()`` unless ``<name>.csv`` exists with the same ``params`` and sources (then read it back)."""
    csv_path = ctx.out_dir / f"{name}.csv"
    params_path = ctx.out_dir / f"{name}.params.json"
    params = {"streams": ctx.streams, "seed": ctx.seed, "source_digest": source_digest(), **params}
    if ctx.tiny:  # never mistaken for (or reused as) a full-size table
        params["tiny"] = True
    if not ctx.force and csv_path.exists() and params_path.exists():
        if json.loads(params_path.read_text()) == json.loads(json.dumps(params)):
            return pd.read_csv(csv_path)
    table = compute()
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv_path, index=False)
    params_path.write_text(json.dumps(params, indent=1) + "\n")
    return table


def save_figure(fig, ctx: Context, name: str) -> Path:
    path = ctx.out_dir / f"{name}.png"
    fig.savefig(path, dpi=130, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def save_comparisons(ctx: Context, name: str, rows: list[Comparison]) -> None:
    (ctx.out_dir / f"{name}.paper.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


def fmt_ci(mean: float, ci: float, digits: int = 3) -> str:
    return f"{mean:.{digits}g} ± {ci:.2g}"
