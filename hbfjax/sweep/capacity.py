"""Capacity search: for every grid point, the highest Poisson arrival rate at which stated service-level
objectives hold (e.g. P90 TTFT ≤ 2 s and P99 TPOT ≤ 100 ms) — what Vidur-Search and TokenSim are
asked for.

All points are searched at once. Round 0 probes every point at the given rates; each later round
probes, for every point, ``refine_points`` rates evenly spaced inside its bracket (the highest rate
that holds below the lowest that fails), or doubles (halves) beyond the probed range when every rate
holds (fails). A probe is an ordinary sweep point with ``--rate`` added: the rates of a point differ
only in a knob, so they share its compilation and its common random numbers, and a round's probes of
every point run together. Probes are rows (``row_kind = probe``) of the table, so an interrupted search
resumes; each point's result is a ``capacity`` row.

An objective *holds* at a rate when the metric's mean across streams is within its bound. The
uncertainty is stated twice: ``capacity_resolution_rate_per_s`` (the bracket left after the last
round) and ``capacity_lo_rate_per_s`` / ``capacity_hi_rate_per_s``, the capacity found when each
metric is replaced by the upper / lower end of its 95 % confidence interval (the SLO holds with 95 %
confidence up to ``lo``; above ``hi`` it fails with 95 % confidence). A failed probe counts as a
miss, and so does a **saturated** one (``saturated`` true: its completions fall short of its arrivals,
``hbfjax.serve.metrics``) even when every objective holds: the queue grows through its window, its
latencies are transient values that grow with the run's length, and its rate is above capacity.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from hbfjax.sweep.grid import Point
from hbfjax.validate import ConfigError

_SLO = re.compile(r"\s*([A-Za-z0-9_.]+)\s*<=\s*([0-9.eE+-]+)\s*")


@dataclass(frozen=True)
class Objective:
    metric: str  # a result column with a 95 % CI column ci95_<metric>, e.g. p90_ttft_s
    bound: float  # holds when metric <= bound

    @classmethod
    def parse(cls, text: str) -> "Objective":
        m = _SLO.fullmatch(text)
        if not m:
            raise ConfigError(f"--slo {text!r}: must be METRIC<=BOUND, e.g. p90_ttft_s<=2 or p99_tpot_ms<=100")
        bound = float(m.group(2))
        if not math.isfinite(bound) or bound <= 0:
            raise ConfigError(f"--slo {text!r}: the bound must be a finite number > 0")
        return cls(m.group(1), bound)


@dataclass(frozen=True)
class Search:
    objectives: tuple[Objective, ...]
    rates_per_s: tuple[float, ...]  # round 0
    refine_rounds: int = 3
    refine_points: int = 4


def rate_text(rate: float) -> str:
    """A rate as it is probed and keyed (6 significant digits; a resumed search derives the same rates)."""
    return f"{rate:.6g}"


def probe(point: Point, rate: str, round_: int) -> Point:
    """``point`` probed at ``--rate rate`` in round ``round_`` (its key names both: a resumed search plans
    round r from the probes of rounds before r only, as the uninterrupted one did)."""
    return Point(point.index, point.values + (("rate", rate), ("capacity_round", str(round_))),
                 point.argv + ("--rate", rate))


def _value(row: dict, column: str) -> float:
    text = row.get(column, "")
    return float(text) if text not in ("", None) else math.nan


def saturated(row: dict) -> bool:
    """Whether a probe row reports a saturated run (``saturated`` True, or "True" as read back from the
    table; a row without the column is not)."""
    return str(row.get("saturated", "")).strip() == "True"


def meets(row: dict, objectives, side: int = 0) -> bool:
    """Whether every objective's metric is within its bound at a probe: on the mean (``side = 0``), its
    CI's upper end (+1) or lower end (−1). A metric the row lacks does not."""
    for o in objectives:
        v = _value(row, o.metric) + side * _value(row, "ci95_" + o.metric)
        if not v <= o.bound:
            return False
    return True


def holds(row: dict, objectives, side: int = 0) -> bool:
    """Whether a probe holds: it ran (``status`` ok), is not saturated, and :func:`meets` every objective.
    A failed or saturated probe is a miss (module docstring)."""
    return row.get("status") == "ok" and not saturated(row) and meets(row, objectives, side)


def capacity(probes: dict[float, dict], objectives, side: int = 0) -> tuple[float | None, float | None]:
    """(highest rate that holds below the lowest that fails, that lowest failing rate); None where absent."""
    rates = sorted(probes)
    fails = [r for r in rates if not holds(probes[r], objectives, side)]
    first_fail = fails[0] if fails else None
    ok = [r for r in rates if (first_fail is None or r < first_fail) and holds(probes[r], objectives, side)]
    return (ok[-1] if ok else None), first_fail


def next_rates(probes: dict[float, dict], objectives, count: int) -> list[str]:
    """The rates of the next round for one point (texts; empty when nothing is left to refine)."""
    if not probes:
        return []
    best, fail = capacity(probes, objectives)
    if fail is None:  # every rate holds: look above
        top = max(probes)
        rates = [top * 2.0**i for i in range(1, count + 1)]
    elif best is None:  # every rate fails: look below
        low = min(probes)
        rates = [low / 2.0**i for i in range(1, count + 1)]
    else:
        rates = [best + (fail - best) * i / (count + 1) for i in range(1, count + 1)]
    texts = [rate_text(r) for r in rates]
    return [t for t in dict.fromkeys(texts) if float(t) not in probes]


def capacity_result(probes: dict[float, dict], objectives) -> dict:
    """A grid point's capacity columns from its probes (rate -> probe row)."""
    best, fail = capacity(probes, objectives)
    lo, _ = capacity(probes, objectives, side=+1)
    hi, _ = capacity(probes, objectives, side=-1)
    rates = sorted(probes)
    if fail is None:
        status = "above range"  # a lower bound: every probed rate holds
    elif best is None:
        status = "below range"  # every probed rate fails
    else:
        status = "bracketed"
    result = {"capacity_status": status, "capacity_rate_per_s": best if best is not None else 0.0,
              "capacity_lo_rate_per_s": lo if lo is not None else 0.0,
              "capacity_hi_rate_per_s": hi if hi is not None else 0.0,
              "capacity_first_miss_rate_per_s": fail,
              "capacity_resolution_rate_per_s": (fail - (best or 0.0)) if fail is not None else None,
              "probes": len(rates), "failed_probes": sum(probes[r].get("status") != "ok" for r in rates),
              "saturated_probes": sum(saturated(probes[r]) for r in rates),
              "slo": " and ".join(f"{o.metric}<={o.bound:g}" for o in objectives)}
    if fail is not None:
        row = probes[fail]
        missed = [o.metric for o in objectives if not meets(row, (o,))] + (["saturated"] if saturated(row) else [])
        result["capacity_bound_by"] = ",".join(missed) if row.get("status") == "ok" else "failed probe"
    if best is not None:
        for o in objectives:
            result[f"{o.metric}_at_capacity"] = _value(probes[best], o.metric)
            result[f"ci95_{o.metric}_at_capacity"] = _value(probes[best], "ci95_" + o.metric)
    return result


def probes_by_point(rows: dict, points: list[Point], before_round: int) -> dict[int, dict[float, dict]]:
    """Each point's probes (table rows by (row_kind, key)) of the rounds before ``before_round``: rate -> row."""
    keyed = {p.key: p.index for p in points}
    by_point = {p.index: {} for p in points}
    for (kind, key), row in rows.items():
        if kind != "probe":
            continue
        values = json.loads(key)
        rate, round_ = float(values.pop("rate")), int(values.pop("capacity_round"))
        index = keyed.get(json.dumps(values, separators=(",", ":")))
        if index is not None and round_ < before_round:
            by_point[index][rate] = row
    return by_point


def round_probes(points: list[Point], search: Search, round_: int, rows: dict) -> list[Point] | None:
    """Round ``round_``'s probes of every point, planned from the probes of earlier rounds in ``rows``
    (those already in ``rows`` included: the caller skips them); None when no point has more to refine."""
    if round_ == 0:
        return [probe(p, rate_text(r), 0) for p in points for r in search.rates_per_s]
    probes = probes_by_point(rows, points, round_)
    asked = [probe(p, r, round_) for p in points
             for r in next_rates(probes[p.index], search.objectives, search.refine_points)]
    return asked or None


def results(points: list[Point], search: Search, rows: dict) -> list[tuple[Point, dict]]:
    """Every point's capacity columns from all its probes in ``rows``."""
    probes = probes_by_point(rows, points, search.refine_rounds + 1)
    return [(p, capacity_result(probes[p.index], search.objectives)) for p in points]


def require_metrics(search: Search, rows: dict) -> None:
    """Refuse an objective on a metric that no successful probe reports."""
    ok = [r for (kind, _), r in rows.items() if kind == "probe" and r.get("status") == "ok"]
    missing = [o.metric for o in search.objectives if ok and all(r.get(o.metric) in (None, "") for r in ok)]
    if missing:
        raise ConfigError(f"--slo: serve reports no {', '.join(missing)} (the table's columns name the metrics; "
                          "those with a ci95_ column can be objectives)")
