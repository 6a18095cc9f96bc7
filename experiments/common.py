"""What every figure module shares: cached data tables, plot saving, and paper-vs-hbfjax rows.

A figure module ``experiments/fig_<name>.py`` defines ``TITLE`` and ``run(ctx) -> list[Comparison]``.
It computes a tidy table (one row per stream-aggregate × knob point), saves it as
``figures/<name>.csv`` beside ``figures/<name>.png``, and returns the rows that go into the
"paper value vs hbfjax value" table of ``figures/README.md``.

Tables are cached: ``cached_table`` reuses ``<name>.csv`` when the sidecar ``<name>.params.json``
matches the parameters of this run, so an interrupted ``make figures`` resumes figure by figure.
The parameters include ``source_digest``, the digest of the import closure of the figure module that
makes the table (``provenance.closure_digest``: its files within ``hbfjax/`` and ``experiments/``), so a
table computed by older code is never reused, and an edit elsewhere leaves it fresh. The sidecar also
lists those files with a digest of each (``source_files``), for humans and to say which changed.

In check mode (``Context.check``, ``python -m experiments --check``) ``cached_table`` computes nothing:
it raises :class:`TableChecked`, the verdict on the table, which stops the figure module there (so only a
module's first table is checked: every figure module makes one, under its own name but where ``module=`` says).
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
    check: bool = False  # only decide whether each table is fresh: cached_table raises TableChecked


@dataclass(frozen=True)
class Comparison:
    """One line of the paper-vs-hbfjax table."""

    figure: str  # e.g. "HBFlex Fig. 17"
    quantity: str  # what is compared, with units
    paper: str  # the paper's reported value, as the paper states it
    hbfjax: str  # our value (with its 95 % CI where it has one)
    note: str = ""  # the gap explained, or the setting that differs


class TableChecked(Exception):
    """Raised by :func:`cached_table` in check mode, instead of computing: table ``name`` is fresh when
    ``reasons`` is empty, else stale for each reason (one line each). Stops the figure module."""

    def __init__(self, name: str, reasons: tuple[str, ...]):
        super().__init__(f"{name}: {'fresh' if not reasons else 'stale, ' + '; '.join(reasons)}")
        self.name, self.reasons = name, reasons


# sidecar keys that describe the sources, not the figure's parameters
SOURCE_KEYS = ("source_digest", "source_files")


def figure_module(name: str, module: str | None = None) -> str:
    """The module that makes table ``name``: ``module`` when given, else ``experiments.fig_<name>``."""
    module = module or f"experiments.fig_{name}"
    if provenance.module_path(module) is None:
        raise ValueError(f"table {name!r}: no module {module!r} makes it; pass module= to cached_table")
    return module


def table_params(ctx: Context, name: str, params: dict, module: str | None = None) -> dict:
    """The sidecar this run writes for table ``name``: streams, seed, the closure digest of its figure module,
    the figure's own ``params`` (tiny marked), and the closure's files with a digest of each; as JSON reads it."""
    module = figure_module(name, module)
    out = {"streams": ctx.streams, "seed": ctx.seed, "source_digest": provenance.closure_digest(module), **params}
    if ctx.tiny:  # never mistaken for (or reused as) a full-size table
        out["tiny"] = True
    out["source_files"] = provenance.closure_file_digests(module)
    return json.loads(json.dumps(out))


def _changed_files(old: dict, new: dict, most: int = 6) -> str:
    """``a.py, +b.py, -c.py`` (changed, added, removed files), at most ``most`` named."""
    names = sorted(f"+{f}" if f not in old else f"-{f}" if f not in new else f
                   for f in old.keys() | new.keys() if old.get(f) != new.get(f))
    return ", ".join(names[:most]) + (f", … {len(names) - most} more" if len(names) > most else "")


def stale_reasons(csv_path: Path, params_path: Path, expected: dict) -> tuple[str, ...]:
    """Why the table at ``csv_path`` cannot be reused for sidecar ``expected`` (empty: it can): a missing file,
    the parameters that differ, or the sources that changed."""
    missing = [p for p in (csv_path, params_path) if not p.exists()]
    if missing:
        return tuple(f"missing {p}" for p in missing)
    try:
        found = json.loads(params_path.read_text())
    except (OSError, ValueError) as err:
        return (f"unreadable {params_path}: {err}",)
    if not isinstance(found, dict):
        return (f"unreadable {params_path}: not a JSON object",)
    differ = sorted(k for k in found.keys() | expected.keys() if found.get(k) != expected.get(k))
    reasons = []
    if params := [k for k in differ if k not in SOURCE_KEYS]:
        reasons.append(f"params differ: {', '.join(params)}")
    if any(k in SOURCE_KEYS for k in differ):
        old = found.get("source_files")
        detail = _changed_files(old, expected["source_files"]) if isinstance(old, dict) else "no file list recorded"
        reasons.append(f"sources changed ({detail or 'digest ' + str(found.get('source_digest'))})")
    return tuple(reasons)


def cached_table(ctx: Context, name: str, params: dict, compute: Callable[[], pd.DataFrame],
                 module: str | None = None) -> pd.DataFrame:
    """``compute()`` unless ``<name>.csv`` exists with the same ``params`` and sources (then read it back).
    ``module`` names the figure module when it is not ``experiments.fig_<name>`` (its import closure keys the
    table). Check mode: raise :class:`TableChecked` instead, computing and writing nothing."""
    csv_path = ctx.out_dir / f"{name}.csv"
    params_path = ctx.out_dir / f"{name}.params.json"
    params = table_params(ctx, name, params, module)
    if ctx.check:
        raise TableChecked(name, stale_reasons(csv_path, params_path, params))
    if not ctx.force and not stale_reasons(csv_path, params_path, params):
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
