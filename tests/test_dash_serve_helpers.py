"""The DASH serving figures' helper logic (experiments/_dash_serve.py) by hand: geomeans, paired ratios,
normalisation, the iteration bound of a fixed batch, and the validation of a point."""

import math

import pytest

from experiments import _dash_serve as ds
from hbfjax.validate import ConfigError


def _row(system, model, batch, thr, e2e):
    return {"system": system, "model": model, "batch": batch, "throughput_tokens_per_s": thr, "e2e_s": e2e}


# two models × two batch sizes, DASH and RelayOnly; numbers chosen so every ratio is exact by hand
ROWS = [
    _row("relay-only", "a", 1, 10.0, 4.0), _row("dash", "a", 1, 20.0, 2.0),
    _row("relay-only", "a", 64, 100.0, 10.0), _row("dash", "a", 64, 150.0, 8.0),
    _row("relay-only", "b", 1, 5.0, 9.0), _row("dash", "b", 1, 20.0, 1.0),
    _row("relay-only", "b", 64, 50.0, 20.0), _row("dash", "b", 64, 75.0, 5.0),
]
KEYS = ("model", "batch")


def test_geomean_by_hand_and_refuses_non_positive_values():
    assert ds.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert ds.geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert ds.geomean([3.0]) == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="must be positive"):
        ds.geomean([1.0, 0.0])


def test_paired_ratios_match_rows_on_the_keys_not_on_their_order():
    shuffled = ROWS[::-1]
    assert ds.paired(shuffled, "throughput_tokens_per_s", "relay-only", KEYS) == pytest.approx([1.5, 4.0, 1.5, 2.0])
    assert ds.paired(ROWS, "e2e_s", "relay-only", KEYS) == pytest.approx([0.5, 0.8, 1 / 9, 0.25])
    with pytest.raises(ConfigError, match="have no direct-only row"):
        ds.paired(ROWS, "e2e_s", "direct-only", KEYS)


def test_speedup_and_reduction_are_geomeans_of_the_paired_ratios():
    speedup, reduction = ds.speedup_and_reduction(ROWS, KEYS)
    assert speedup == pytest.approx((2.0 * 1.5 * 4.0 * 1.5) ** 0.25)  # 18^(1/4) = 2.0598
    assert reduction == pytest.approx(1.0 - (0.5 * 0.8 * (1 / 9) * 0.25) ** 0.25)  # 1 − (1/90)^(1/4) = 0.6753
    assert ds.speedup_and_reduction(ROWS, KEYS, baseline="dash") == pytest.approx((1.0, 0.0))


def test_normalise_to_relay_only_at_the_largest_batch_of_the_same_model():
    thr = ds.normalise(ROWS, "throughput_tokens_per_s", {"system": "relay-only", "batch": 64}, ("model",))
    assert thr == pytest.approx([0.1, 0.2, 1.0, 1.5, 0.1, 0.4, 1.0, 1.5])
    e2e = ds.normalise(ROWS, "e2e_s", {"system": "relay-only"}, KEYS)
    assert e2e == pytest.approx([1.0, 0.5, 1.0, 0.8, 1.0, 1 / 9, 1.0, 0.25])
    with pytest.raises(ConfigError, match="have no reference row"):
        ds.normalise(ROWS, "e2e_s", {"system": "relay-only", "batch": 4}, ("model",))


def test_iteration_bound_of_a_fixed_batch_by_hand():
    # B = 1, 1K/128: two 512-token chunks (one per iteration), then 127 decode iterations; the engine ran 129
    assert ds.iterations_bound(ds.Point("dash", 1, 1024, 128)) == 2 + 127
    # B = 64: 128 chunks; 64 decode tokens leave (8192 − 64) // 512 = 15 chunks an iteration: 9 + 127 (engine: 136)
    assert ds.iterations_bound(ds.Point("dash", 64, 1024, 128)) == math.ceil(128 / 15) + 127
    # B = 4: four chunks fit, one per request: 2 + 127 (engine: 129); one output token: prefill only
    assert ds.iterations_bound(ds.Point("dash", 4, 1024, 128)) == 129
    assert ds.iterations_bound(ds.Point("dash", 1, 4096, 1)) == 8


def test_a_point_names_its_system_and_refuses_unknown_organisations():
    assert ds.Point("dash", 1, 8, 2).system == "dash"
    assert ds.Point("dash", 1, 8, 2, (("lookahead", 0),), "no-lookahead").system == "no-lookahead"
    with pytest.raises(ConfigError, match="Point.org = 'hbm-only'"):
        ds.Point("hbm-only", 1, 8, 2)
    with pytest.raises(ConfigError, match="Point.batch = 0"):
        ds.Point("dash", 0, 8, 2)
    with pytest.raises(ConfigError, match="points = \\[\\]"):
        ds.run_points("qwen3-235b-a22b", [], 1, 0)
