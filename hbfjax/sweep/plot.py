"""A sweep table as a seaborn figure: a metric against one column, a line per ``hue`` value, a panel
per ``col`` value, with 95 % confidence intervals — the ``ci95_<metric>`` half-widths the table
carries, or, where a table has several rows per point (e.g. seeds), seaborn's own bootstrap CI."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from hbfjax.validate import ConfigError  # noqa: E402


def read(path: str, row_kind: str = "point") -> pd.DataFrame:
    """The ``ok`` rows of one kind (point, probe or capacity) of a sweep table."""
    try:
        table = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ConfigError(f"{path}: cannot read it as a sweep table ({err})") from None
    if "row_kind" not in table:
        raise ConfigError(f"{path}: not a sweep table (no row_kind column)")
    rows = table[(table["row_kind"] == row_kind) & (table["status"] == "ok")]
    if rows.empty:
        raise ConfigError(f"{path}: no ok rows of kind {row_kind!r}")
    return rows


def _require(table: pd.DataFrame, column: str | None, role: str) -> None:
    if column is not None and column not in table:
        numeric = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c]) and not c.startswith("ci95_")]
        raise ConfigError(f"--{role} {column}: no such column (numeric columns: {', '.join(numeric[:40])})")


def plot(table: pd.DataFrame, x: str, y: str, hue: str | None = None, col: str | None = None,
         logx: bool = False, logy: bool = False, title: str | None = None) -> plt.Figure:
    """``y`` against ``x`` (numeric: a line; else categories in table order) per ``hue``, a panel per ``col``."""
    for column, role in ((x, "x"), (y, "y"), (hue, "hue"), (col, "col")):
        _require(table, column, role)
    sns.set_theme(style="whitegrid")
    panels = [None] if col is None else list(dict.fromkeys(table[col]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.8), squeeze=False, sharey=True)
    groups = [None] if hue is None else list(dict.fromkeys(table[hue]))
    colours = dict(zip(groups, sns.color_palette(n_colors=max(1, len(groups)))))
    numeric_x = pd.api.types.is_numeric_dtype(table[x])
    categories = list(dict.fromkeys(table[x]))
    ci_column = f"ci95_{y}" if f"ci95_{y}" in table else None
    for ax, panel in zip(axes[0], panels):
        part = table if col is None else table[table[col] == panel]
        for group in groups:
            rows = part if hue is None else part[part[hue] == group]
            if rows.empty:
                continue
            means = rows.groupby(x, sort=numeric_x)[y]
            xs = means.mean().index.to_numpy()
            ys = means.mean().to_numpy()
            if ci_column is not None and (rows.groupby(x).size() == 1).all():
                err = rows.set_index(x).loc[xs, ci_column].to_numpy(dtype=float)
            else:  # several rows per x: a 95 % interval of their mean
                err = (means.std(ddof=1) / np.sqrt(means.count()) * 1.96).fillna(0.0).to_numpy()
            pos = xs if numeric_x else [categories.index(v) for v in xs]
            ax.errorbar(pos, ys, yerr=err, marker="o", capsize=3, color=colours[group],
                        label=None if hue is None else str(group))
        if not numeric_x:
            ax.set_xticks(range(len(categories)), [str(c) for c in categories], rotation=30, ha="right")
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(x)
        ax.set_title(title if panel is None else f"{col} = {panel}", fontsize=10)
    axes[0][0].set_ylabel(y + (" (95 % CI)" if ci_column or len(table) > 1 else ""))
    if hue is not None:
        axes[0][-1].legend(title=hue, fontsize=8)
    fig.tight_layout()
    return fig


def pareto_plot(table: pd.DataFrame, x: str, y: str, logx: bool = False, logy: bool = False,
                title: str | None = None) -> plt.Figure:
    """``y`` against ``x`` for every point: the front (``pareto``) joined in ``x`` order with its CIs, the
    points the CIs cannot tell from it (``pareto_ci`` only) hollow, the dominated ones grey."""
    for column, role in ((x, "x"), (y, "y")):
        _require(table, column, role)
    if "pareto" not in table or "pareto_ci" not in table:
        raise ConfigError("--pareto: the table has no pareto column; run the sweep with --pareto METRIC:max,METRIC:min")
    flag = lambda c: table[c].astype(str).str.lower() == "true"  # noqa: E731
    front, near = flag("pareto"), flag("pareto_ci") & ~flag("pareto")
    sns.set_theme(style="whitegrid")
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    err = lambda rows, c: rows[f"ci95_{c}"].to_numpy(float) if f"ci95_{c}" in rows else None  # noqa: E731
    rest = table[~front & ~near]
    ax.scatter(rest[x], rest[y], color="0.7", label="dominated")
    ax.scatter(table[near][x], table[near][y], facecolors="none", edgecolors="C0", label="within the CIs of the front")
    line = table[front].sort_values(x)
    ax.errorbar(line[x], line[y], xerr=err(line, x), yerr=err(line, y), marker="o", capsize=3, color="C0",
                label="Pareto front")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"Pareto front: {front.sum()} of {len(table)} points", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
