"""Pareto fronts of a sweep's points (issue 25, as AIConfigurator and Vidur-Search print them): the rows no
other row beats on every objective.

``--pareto throughput_tokens_per_s:max,p99_tpot_ms:min`` names two or more result columns and the way
each is better. Two fronts are marked, as two table columns:

* ``pareto``: by the point estimates — a row is dominated when another is at least as good on every
  objective and better on one;
* ``pareto_ci``: by the 95 % confidence half-widths the table carries (``ci95_<metric>``, 0 for a column
  without one, e.g. an axis) — a row is out only when another is better on every objective by more than
  the two half-widths together, i.e. surely dominated. It holds every ``pareto`` row and those the
  noise cannot tell from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbfjax.validate import ConfigError

SENSES = ("max", "min")


@dataclass(frozen=True)
class Objective:
    metric: str  # a result column
    sense: str  # "max" or "min": which way is better


def parse(spec: str) -> tuple[Objective, ...]:
    """``METRIC:max,METRIC:min,...`` (at least two, each metric once)."""
    objectives = []
    for part in spec.split(","):
        metric, _, sense = part.strip().rpartition(":")
        if not metric or sense not in SENSES:
            raise ConfigError(f"--pareto {spec!r}: {part.strip()!r} must be METRIC:max or METRIC:min, "
                              "e.g. --pareto throughput_tokens_per_s:max,p99_tpot_ms:min")
        objectives.append(Objective(metric, sense))
    if len(objectives) < 2:
        raise ConfigError(f"--pareto {spec!r}: a front needs two objectives or more (one is a plain maximum)")
    if len({o.metric for o in objectives}) < len(objectives):
        raise ConfigError(f"--pareto {spec!r}: each metric once")
    return tuple(objectives)


def fronts(values: np.ndarray, half_widths: np.ndarray, senses) -> tuple[np.ndarray, np.ndarray]:
    """(pareto bool[n], pareto_ci bool[n]) of ``values`` float[n, k] with ``half_widths`` float[n, k] (≥ 0)
    and ``senses`` (k of "max"/"min"): the module docstring's two fronts. O(n² k)."""
    sign = np.asarray([1.0 if s == "max" else -1.0 for s in senses])
    better = np.asarray(values, np.float64) * sign  # larger is better in every column
    hw = np.asarray(half_widths, np.float64)
    gap = better[None, :, :] - better[:, None, :]  # [a, b, k]: how much b beats a
    dominated = ((gap >= 0).all(axis=2) & (gap > 0).any(axis=2)).any(axis=1)
    surely = (gap > hw[:, None, :] + hw[None, :, :]).all(axis=2).any(axis=1)
    return ~dominated, ~surely


def mark(rows: list[dict], objectives: tuple[Objective, ...]) -> dict[int, dict]:
    """The two front columns for each ``ok`` row of ``rows`` (dicts of a table's cells, by position),
    ``{index: {"pareto": bool, "pareto_ci": bool}}``; a row whose objective cell is not a number is refused."""
    ok = [i for i, r in enumerate(rows) if r.get("status") == "ok"]
    if not ok:
        return {}
    values, widths = np.zeros((len(ok), len(objectives))), np.zeros((len(ok), len(objectives)))
    for j, o in enumerate(objectives):
        if o.metric not in rows[ok[0]]:
            numeric = [c for c in rows[ok[0]] if _number(rows[ok[0]][c]) is not None and not c.startswith("ci95_")]
            raise ConfigError(f"--pareto {o.metric}: no such result column (numeric: {', '.join(numeric[:40])})")
        for n, i in enumerate(ok):
            v = _number(rows[i].get(o.metric))
            if v is None:
                raise ConfigError(f"--pareto {o.metric}: row {rows[i].get('point')} holds {rows[i].get(o.metric)!r}, "
                                  "not a number")
            values[n, j], widths[n, j] = v, _number(rows[i].get("ci95_" + o.metric)) or 0.0
    point, ci = fronts(values, widths, [o.sense for o in objectives])
    return {i: {"pareto": bool(point[n]), "pareto_ci": bool(ci[n])} for n, i in enumerate(ok)}


def _number(cell) -> float | None:
    try:
        v = float(cell)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None
