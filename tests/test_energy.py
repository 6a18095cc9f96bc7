"""Energy and cost per token (``hbfjax.energy``, issue 25): each formula against a hand computation, the
FLOP count against the model's parameter count and a plain loop, lifetime against DASH §VI-H's closed
form (``endurance.dash_lifetime``), and the capital of a flash that wears out before its amortisation.
Host NumPy only; the serve JSON's keys are checked in ``test_cli_serve``."""

import numpy as np
import pytest

from hbfjax import energy
from hbfjax.flash.erase.endurance import dash_lifetime
from hbfjax.validate import ConfigError
from hbfjax.workload import models


def _activity(**changes) -> energy.Activity:
    """One stream of round numbers: 1 GB of each byte kind, 1 PFLOP, 1,000 tokens of 10 requests over 10 s."""
    one = np.array([1e9])
    base = dict(flops=np.array([1e15]), hbm_read_bytes=one, direct_bytes=one, relay_bytes=one, gpu_write_bytes=one,
                hbm_write_bytes=one, gc_bytes=one, reclaim_bytes=np.array([0.0]), output_tokens=np.array([1000.0]), requests=np.array([10.0]),
                span_s=np.array([10.0]), busy_s=np.array([8.0]), host_dram_bytes=one, pcie_bytes=one,
                cpu_flops=np.array([1e14]))
    return energy.Activity(**{**base, **{k: np.array([v], np.float64) for k, v in changes.items()}})


PKG = energy.Package(hbm_stacks=2.0, hbf_stacks=2.0, page_bytes=4096.0, all_hbf=False)


def test_energy_of_round_activity_by_hand():
    costs = energy.EnergyCosts(hbm_pj_per_bit=4.0, hbf_read_pj_per_bit=10.0, hbf_program_pj_per_bit=200.0,
                               hbf_erase_uj_per_block=100.0, link_pj_per_bit=0.5, sram_pj_per_bit=2.0, static_w=3.0,
                               host_dram_pj_per_bit=20.0, pcie_pj_per_bit=6.0, cpu_pj_per_flop=10.0)
    e = {k: float(v[0]) for k, v in energy.energy_j(_activity(), costs, 0.5, PKG).items()}
    gbit = 8e9 * 1e-12  # 1 GB at 1 pJ/bit, in J
    assert e["gpu_compute"] == pytest.approx(1e15 * 0.5e-12)  # 500 J
    assert e["hbm"] == pytest.approx(2 * 4.0 * gbit)  # HBM read + the writeback read out of HBM
    assert e["hbf_read"] == pytest.approx(3 * 10.0 * gbit)  # Direct + Relay + GC's re-reads
    assert e["hbf_program"] == pytest.approx(3 * 200.0 * gbit)  # GPU writes + HBM writebacks + GC's re-programs
    assert e["hbf_erase"] == pytest.approx(3e9 / (512 * 4096) * 100e-6)  # a block erased per block programmed
    assert e["links"] == pytest.approx((1 + 2 + 1 + 1) * 0.5 * gbit)  # Relay crosses two links
    assert e["sram"] == pytest.approx(2 * (1 + 2 + 1 + 1) * 2.0 * gbit)  # each crossing written and read once
    assert e["static"] == pytest.approx(30.0)
    assert e["host_dram"] == pytest.approx(20.0 * gbit) and e["pcie"] == pytest.approx(6.0 * gbit)
    assert e["cpu_compute"] == pytest.approx(1e14 * 10e-12)  # 1,000 J
    # 2 GB of read-disturb rewrites (issue 26) are read, programmed and erased again inside the package
    r = {k: float(v[0]) for k, v in energy.energy_j(_activity(reclaim_bytes=2e9), costs, 0.5, PKG).items()}
    assert r["hbf_read"] == pytest.approx(5 * 10.0 * gbit) and r["hbf_program"] == pytest.approx(5 * 200.0 * gbit)
    assert r["hbf_erase"] == pytest.approx(5e9 / (512 * 4096) * 100e-6) and r["links"] == e["links"]


def test_energy_is_linear_in_each_cost():
    a = _activity()
    low = energy.energy_j(a, energy.EnergyCosts(hbf_read_pj_per_bit=8.5), 0.4, PKG)
    high = energy.energy_j(a, energy.EnergyCosts(hbf_read_pj_per_bit=30.0), 0.4, PKG)
    hbf_read_bytes = 3e9
    assert float(high["hbf_read"][0] - low["hbf_read"][0]) == pytest.approx(hbf_read_bytes * 8 * 21.5e-12)
    assert all(high[k] == low[k] for k in low if k != "hbf_read")


def test_attention_pairs_against_a_loop():
    for p, o in [(1, 1), (5, 1), (5, 2), (7, 9), (64, 4)]:
        prefill = sum(i + 1 for i in range(p))  # query i of the prompt sees entries 0 … i
        decode = sum(p + t for t in range(1, o))  # output token t (t ≥ 1) sees the prompt and t tokens
        pre, dec = energy.attention_pairs(p, o)
        assert (float(pre), float(dec)) == (prefill, decode), (p, o)


@pytest.mark.parametrize("name", ["qwen3-235b-a22b", "llama3-8b", "deepseek-v3"])
def test_flops_of_one_token_is_twice_the_active_parameters_plus_one_attention_pair(name):
    m = models.preset(name)
    one = float(energy.flops(m, [[1.0]], [[1.0]])[0])
    attention = m.layers * m.attention_flops_per_pair("prefill")
    assert one - attention == pytest.approx(2 * m.active_params, rel=1e-3)  # norms are not multiplies
    if m.active_params_stated:
        assert one - attention == pytest.approx(2 * m.active_params_stated, rel=0.05)  # the model card's count


def test_flops_of_requests_against_a_token_loop_and_hits():
    m = models.preset("qwen3-235b-a22b")
    per_pair = {kind: m.attention_flops_per_pair(kind) for kind in ("prefill", "decode")}
    token = float(energy.flops(m, [[1.0]], [[1.0]])[0]) - m.layers * per_pair["prefill"]  # linear + head
    head = 2.0 * m.vocab * m.hidden
    prompts, outputs, hits = [[30.0, 7.0]], [[4.0, 1.0]], [5.0]
    want = 0.0
    for p, o in zip(prompts[0], outputs[0]):
        for i in range(int(p)):  # prefill: linear layers (no head) and attention over entries 0 … i
            want += (token - head) + m.layers * per_pair["prefill"] * (i + 1)
        want += head  # the first output token's head, from the prefill pass
        for t in range(1, int(o)):  # each decode token: linear layers, head, attention over P + t entries
            want += token + m.layers * per_pair["decode"] * (p + t)
    want -= hits[0] * (token - head)  # a hit token's linear layers are not computed
    assert float(energy.flops(m, prompts, outputs, hits)[0]) == pytest.approx(want, rel=1e-12)


def test_lifetime_is_dash_closed_form_with_the_run_waf_and_busy_rate():
    a = _activity(gc_bytes=0.5e9)  # host 2 GB, programmed 2.5 GB: WAF 1.25, over 8 s busy
    room = 500e9
    cost = energy.CostModel(pe_cycles=1e5)
    want = dash_lifetime(room, 1e5, 1.25, 2e9 / 8.0)["lifetime_years"]
    assert float(energy.lifetime_years(a, np.array([room]), cost)[0]) == pytest.approx(want, rel=1e-12)
    nothing = _activity(gpu_write_bytes=0.0, hbm_write_bytes=0.0, gc_bytes=0.0)
    assert np.isinf(energy.lifetime_years(nothing, np.array([room]), cost)[0])


def test_a_flash_that_wears_out_early_is_bought_again():
    cost = energy.CostModel(gpu_usd=0.0, hbm_stack_usd=1000.0, hbf_to_hbm_cost_ratio=2.0, amortisation_years=5.0,
                            usd_per_kwh=0.2)
    a = _activity()
    seconds_per_year = 365.25 * 86400
    long_lived = energy.cost_usd(a, np.array([3.6e6]), np.array([10.0]), cost, PKG)
    worn = energy.cost_usd(a, np.array([3.6e6]), np.array([1.25]), cost, PKG)
    hbf_per_s = 2 * 2.0 * 1000.0 / (5.0 * seconds_per_year)
    assert float(long_lived["capital_hbf"][0]) == pytest.approx(hbf_per_s * 10.0)  # bought once
    assert float(worn["capital_hbf"][0]) == pytest.approx(4.0 * hbf_per_s * 10.0)  # 5 y / 1.25 y: four times
    assert float(worn["capital_hbm"][0]) == pytest.approx(2 * 1000.0 / (5.0 * seconds_per_year) * 10.0)
    assert float(worn["electricity"][0]) == pytest.approx(0.2)  # 1 kWh at 0.2 $/kWh
    assert worn["capital_gpu"][0] == 0.0


def test_bad_costs_are_refused_with_their_names():
    with pytest.raises(ConfigError, match="hbf_read_pj_per_bit"):
        energy.EnergyCosts(hbf_read_pj_per_bit=-1.0)
    with pytest.raises(ConfigError, match="amortisation_years"):
        energy.CostModel(amortisation_years=0.0)
    with pytest.raises(ConfigError, match="gpu-pj-per-flop"):
        energy.EnergyCosts().pj_per_flop("a100", 312.0)
    assert energy.EnergyCosts().pj_per_flop("h100-pcie", 756.5) == pytest.approx(350.0 / 756.5)
    assert energy.EnergyCosts(gpu_pj_per_flop=0.3).pj_per_flop("a100", 312.0) == 0.3
