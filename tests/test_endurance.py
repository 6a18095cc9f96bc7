"""Endurance: HBFlex §3.3 budget numbers and the DASH §VI-H lifetime formula."""

import pytest

from hbfjax.flash.erase import endurance as en

TB = 1e12


def test_hbflex_budget_reproduces_section_3_3():
    ds3 = en.daily_kv_write_bytes(434e9, 35e3, 1814)
    qwen = en.daily_kv_write_bytes(434e9, 95e3, 1814)
    assert ds3 / TB == pytest.approx(8.37, abs=0.005)
    assert qwen / TB == pytest.approx(22.73, abs=0.005)
    b = en.hbflex_budget(1 * TB, 100_000, 5.0, ds3)
    assert b["budget_bytes_per_day"] / TB == pytest.approx(54.8, abs=0.05)
    assert b["raw_share_of_budget"] == pytest.approx(0.153, abs=0.0005)
    assert b["waf_margin"] == pytest.approx(6.5, abs=0.05)
    q = en.hbflex_budget(1 * TB, 100_000, 5.0, qwen)
    assert q["raw_share_of_budget"] == pytest.approx(0.415, abs=0.0005)
    assert q["waf_margin"] == pytest.approx(2.4, abs=0.05)
    # At WAF equal to the margin the lifetime is exactly the 5-year budget; at WAF 30 (§3.3) it is short.
    assert en.hbflex_budget(1 * TB, 100_000, 5.0, ds3, waf=b["waf_margin"])["lifetime_years"] == pytest.approx(5.0)
    assert en.hbflex_budget(1 * TB, 100_000, 5.0, ds3, waf=30.0)["lifetime_years"] < 1.1


def test_dash_lifetime_formula_by_hand_and_reports_every_input():
    r = en.dash_lifetime(kv_capacity_bytes=512e9, pe_cycles=1e5, waf=2.0, write_bytes_per_s=1e9, utilization=0.5)
    assert r["lifetime_s"] == pytest.approx(512e9 * 1e5 / (2.0 * 1e9 * 0.5))
    assert r["lifetime_years"] == pytest.approx(r["lifetime_s"] / (365.25 * 86400))
    for key in ("C_KV_bytes", "E_SLC_pe_cycles", "A_W_waf", "R_HBF_bytes_per_s", "u_utilization"):
        assert key in r
    # The two formulas agree when R = daily / 86,400 s and u = 1.
    d = en.dash_lifetime(1 * TB, 1e5, 3.0, 8.37 * TB / 86400)
    h = en.hbflex_budget(1 * TB, 1e5, 5.0, 8.37 * TB, waf=3.0)
    assert d["lifetime_years"] == pytest.approx(h["lifetime_years"])
    with pytest.raises(ValueError, match="waf = 0"):
        en.dash_lifetime(1e12, 1e5, 0, 1e9)
