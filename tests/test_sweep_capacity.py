"""Capacity search: the bracket logic by hand, and the rounds against a latency whose SLO threshold is
known exactly."""

import math

import pytest

from hbfjax.sweep import capacity as cap
from hbfjax.sweep.grid import Point
from hbfjax.validate import ConfigError

TTFT = cap.Objective("p90_ttft_s", 1.0)


def _probe(value, ci=0.0, status="ok"):
    return {"status": status, "p90_ttft_s": value, "ci95_p90_ttft_s": ci}


def test_objectives_parse_and_bad_ones_are_refused():
    assert cap.Objective.parse("p99_tpot_ms <= 100") == cap.Objective("p99_tpot_ms", 100.0)
    for bad in ("p90_ttft_s < 2", "p90_ttft_s<=-1", "p90<=inf", "<=2"):
        with pytest.raises(ConfigError, match="--slo"):
            cap.Objective.parse(bad)


def test_the_capacity_is_the_highest_holding_rate_below_the_first_miss():
    probes = {1.0: _probe(0.2), 2.0: _probe(0.5, 0.6), 4.0: _probe(1.5), 3.0: _probe(0.9, 0.05), 8.0: _probe(0.8)}
    # 8 holds again (noise) but lies above the first miss at 4: not the capacity
    assert cap.capacity(probes, (TTFT,)) == (3.0, 4.0)
    assert cap.capacity(probes, (TTFT,), side=+1) == (1.0, 2.0)  # 0.5 + 0.6 > 1: not with 95 % confidence
    r = cap.capacity_result(probes, (TTFT,))
    assert (r["capacity_status"], r["capacity_rate_per_s"], r["capacity_lo_rate_per_s"]) == ("bracketed", 3.0, 1.0)
    assert (r["capacity_first_miss_rate_per_s"], r["capacity_resolution_rate_per_s"]) == (4.0, 1.0)
    assert r["capacity_bound_by"] == "p90_ttft_s" and r["p90_ttft_s_at_capacity"] == 0.9
    assert cap.next_rates(probes, (TTFT,), 3) == ["3.25", "3.5", "3.75"]
    failed = {**probes, 2.0: _probe(0.1, status="failed")}  # a failed probe is a miss
    assert cap.capacity(failed, (TTFT,)) == (1.0, 2.0)


def test_beyond_the_probed_range_the_search_doubles_or_halves():
    below = {1.0: _probe(2.0), 2.0: _probe(3.0)}
    above = {1.0: _probe(0.1), 2.0: _probe(0.2)}
    assert cap.next_rates(below, (TTFT,), 2) == ["0.5", "0.25"]
    assert cap.next_rates(above, (TTFT,), 2) == ["4", "8"]
    assert cap.capacity_result(below, (TTFT,))["capacity_status"] == "below range"
    assert cap.capacity_result(above, (TTFT,))["capacity_status"] == "above range"


def test_rounds_bracket_a_known_threshold_to_the_predicted_resolution():
    """Latency 0.1 · e^{rate/5}: the SLO 1 s holds up to exactly 5 ln 10 = 11.513 req/s. Four rates
    1, 2, 4, 8 and then rounds of n = 3 interior rates: each round divides the bracket by n + 1 = 4
    after the first, which doubles (all four hold) to 16, 32, 64 and brackets it in (8, 16)."""
    threshold = 5 * math.log(10)
    points = [Point(0, (("system", "a"),), ("--system", "a")), Point(1, (("system", "b"),), ("--system", "b"))]
    search = cap.Search((TTFT,), (1.0, 2.0, 4.0, 8.0), refine_rounds=4, refine_points=3)
    rows = {}
    for round_ in range(search.refine_rounds + 1):
        asked = cap.round_probes(points, search, round_, rows)
        if asked is None:
            break
        for q in asked:
            rate = float(dict(q.values)["rate"])
            scale = 1.0 if q.index == 0 else 2.0  # point b's latency is twice a's: threshold 5 ln 5
            rows["probe", q.key] = _probe(scale * 0.1 * math.exp(rate / 5))
    (pa, ra), (pb, rb) = cap.results(points, search, rows)
    assert ra["capacity_status"] == "bracketed"
    assert ra["capacity_rate_per_s"] <= threshold < ra["capacity_first_miss_rate_per_s"]
    assert ra["capacity_resolution_rate_per_s"] == pytest.approx(8 / 4**3, rel=1e-4)  # (16 − 8) / 4^3
    assert rb["capacity_rate_per_s"] <= 5 * math.log(5) < rb["capacity_first_miss_rate_per_s"]
    assert ra["probes"] == 4 + 3 * 4


def test_a_saturated_probe_is_a_miss_even_when_its_slo_holds():
    """A probe that meets the SLO but whose run is saturated (its latencies are transient, its rate above
    capacity) is a miss on every side of the CI; the flag reads as a bool or as the table's text."""
    probes = {1.0: _probe(0.2), 2.0: {**_probe(0.5), "saturated": True}, 4.0: {**_probe(0.6), "saturated": "True"},
              0.5: {**_probe(0.1), "saturated": "False"}}
    assert not cap.holds(probes[2.0], (TTFT,)) and cap.meets(probes[2.0], (TTFT,))
    assert cap.holds(probes[0.5], (TTFT,))
    for side in (-1, 0, 1):
        assert cap.capacity(probes, (TTFT,), side) == (1.0, 2.0)
    r = cap.capacity_result(probes, (TTFT,))
    assert (r["capacity_status"], r["capacity_rate_per_s"], r["capacity_first_miss_rate_per_s"]) == (
        "bracketed", 1.0, 2.0)
    assert r["capacity_bound_by"] == "saturated" and r["saturated_probes"] == 2
    late = {**probes, 2.0: {**_probe(1.5), "saturated": True}}  # misses the SLO too: both named
    assert cap.capacity_result(late, (TTFT,))["capacity_bound_by"] == "p90_ttft_s,saturated"
    assert cap.next_rates(probes, (TTFT,), 3) == ["1.25", "1.5", "1.75"]
