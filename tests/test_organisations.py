"""Memory organisations as data: DASH's four organisations from the sourced preset, their differences
in values only, one compilation for all of them on a knob axis, and refused bad knobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch, hardware
from hbfjax.memory import delivery as d
from hbfjax.memory import organisations as o
from hbfjax.validate import ConfigError


def _leaves_equal(a: o.OrgKnobs, b: o.OrgKnobs) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_dash_takes_its_values_from_the_dash_preset():
    k, system = o.dash(), hardware.preset("dash")
    assert float(k.parallel_units) == 16 * 32 * 4 == system.hbf.parallel_units / 2
    assert float(k.page_bytes) == 4096 and float(k.t_read_us) == 3.0 and float(k.t_prog_us) == 100.0
    assert float(k.gpu_hbm_gbps) == float(k.direct_gbps) == float(k.relay_gbps) == 1600.0
    assert float(k.hbm_capacity_bytes) == 24e9 and float(k.hbm_stacks) == float(k.hbf_stacks) == 2
    assert float(k.hbf_sram_region_bytes) == 8 * 2**20 and float(k.relay_sram_region_bytes) == 4 * 2**20
    # one page wave per stack (DASH §VI-A: 8 MiB) fills one transfer region (§IV-B)
    assert float(k.parallel_units * k.page_bytes) == float(k.hbf_sram_region_bytes)


def test_route_sets_give_3_2_tb_s_per_baseline_and_6_4_in_dash():
    gpu_facing = {name: float(r.direct_gbps + r.relay_gbps)
                  for name, r in ((n, d.rates(o.organisation(n))) for n in o.ORGANISATIONS)}
    assert gpu_facing == {"dash": 6400.0, "compact-dash": 3200.0, "relay-only": 3200.0, "direct-only": 3200.0}


def test_baselines_are_dash_with_one_link_zeroed():
    assert _leaves_equal(o.relay_only(), o.dash(direct_gbps=0.0))
    assert _leaves_equal(o.direct_only(), o.dash(relay_gbps=0.0))
    compact = o.compact_dash()
    assert float(compact.hbm_stacks) == float(compact.hbf_stacks) == 1
    assert float(compact.hbf_capacity_bytes) == pytest.approx(2 * float(o.dash().hbf_capacity_bytes))
    assert float(compact.hbm_capacity_bytes) == 48e9


def test_link_override_changes_only_the_links_that_exist():
    k = o.organisation("relay-only", link_gbps=800.0)
    assert (float(k.gpu_hbm_gbps), float(k.direct_gbps), float(k.relay_gbps)) == (800.0, 0.0, 800.0)
    assert float(o.organisation("dash", t_read_us=32.0).t_read_us) == 32.0


def test_dash_placement_replicates_dense_weights_and_puts_experts_and_prefill_kv_in_hbf():
    place = np.asarray(o.dash().place)
    np.testing.assert_array_equal(place, [[0, 0, 1], [0, 1, 0], [0, 1, 0], [1, 0, 0]])
    assert o.KINDS[o.DECODE_KV] == "decode_kv" and o.TIERS[o.REPLICATED] == "replicated"


def test_every_organisation_is_sourced():
    for name in o.ORGANISATIONS:
        for field_name in ("hbm_stacks", "hbf_stacks", "direct_gbps", "relay_gbps", "t_read_us", "place"):
            assert o.source(name, field_name), (name, field_name)
    assert "removed" in o.source("relay-only", "direct_gbps")  # the organisation's own source comes first


def test_unknown_organisation_is_refused():
    with pytest.raises(ConfigError, match="organisation = 'dram-only'"):
        o.organisation("dram-only")


def simulate_delivery(stream_id, seed, knobs, inputs, config):
    """One stream: expert delivery of (stream_id mod 9) + 1 experts of ``inputs`` bytes (a test stand-in)."""
    del seed, config
    return d.expert_delivery((stream_id % 9 + 1).astype(jnp.float32), inputs, knobs)


def test_organisations_stack_on_one_knob_axis_and_compile_once():
    names = list(o.ORGANISATIONS)
    with compilations("simulate_delivery") as compiled:
        first = batch.run(simulate_delivery, 6, 0, batch.stack_knobs([o.organisation(n) for n in names]), None,
                          inputs=jnp.float32(37.7e6), knob_axis=True)
        other = batch.run(simulate_delivery, 6, 0,
                          batch.stack_knobs([o.organisation(n, t_read_us=30.0, lookahead=0.0) for n in names]),
                          None, inputs=jnp.float32(12e6), knob_axis=True)
    assert len(compiled) == 1, compiled
    assert first.delivery_us.shape == (6, len(names))
    for i, name in enumerate(names):
        alone = d.expert_delivery(jnp.arange(6) % 9 + 1.0, 12e6, o.organisation(name, t_read_us=30.0, lookahead=0.0))
        np.testing.assert_allclose(other.delivery_us[:, i], alone.delivery_us, rtol=1e-6)
    assert np.all(first.delivery_us[:, names.index("dash")] < first.delivery_us[:, names.index("relay-only")])


BAD = [
    (dict(direct_gbps=-1.0), "OrgKnobs.direct_gbps = -1.0: must be in [0, 1e+07]"),
    (dict(direct_gbps=float("nan")), "OrgKnobs.direct_gbps = nan: must be finite"),
    (dict(hbf_stacks=1.5), "OrgKnobs.hbf_stacks = 1.5: must be an integer"),
    (dict(hbm_stacks=-1), "OrgKnobs.hbm_stacks = -1: must be in [0, 1048576]"),
    (dict(hbm_stacks=0), "OrgKnobs.hbm_stacks = 0: 0 HBM stacks leave no GPU–HBM or Relay link"),
    (dict(hbf_write_gbps=0.0), "OrgKnobs.hbf_write_gbps = 0.0: must be in (0, 1e+07]"),
    (dict(page_bytes=1000), "OrgKnobs.page_bytes = 1000: must be a multiple of 512"),
    (dict(t_read_us=0.0), "OrgKnobs.t_read_us = 0.0: must be in (0, 1e+09]"),
    (dict(t_prog_us=2.0), "OrgKnobs.t_prog_us = 2.0: a NAND program is slower than a read (t_read_us = 3.0)"),
    (dict(lookahead=0.5), "OrgKnobs.lookahead = 0.5: must be 0 or 1"),
    (dict(shared_array_rate=True), "OrgKnobs.shared_array_rate = True: must be 0 or 1"),
    (dict(relay_fraction=1.2), "OrgKnobs.relay_fraction = 1.2: must be in [0, 1]"),
    (dict(direct_gbps=0.0, relay_gbps=0.0), "OrgKnobs.direct_gbps = 0.0: an HBF stack needs a path"),
    (dict(gpu_hbm_gbps=0.0), "OrgKnobs.relay_gbps = 1600.0: the Relay path runs over the GPU–HBM link"),
    (dict(gpu_hbm_gbps=0.0, relay_gbps=0.0), "OrgKnobs.place[decode_kv] = [1.0, 0.0, 0.0]: places bytes only in HBM"),
    (dict(place=np.full((4, 3), 1 / 3.0)[:3]), "OrgKnobs.place = (3, 3): must have shape (4, 3)"),
    (dict(place=[[0.5, 0.6, 0], [0, 1, 0], [0, 1, 0], [1, 0, 0]]),
     "OrgKnobs.place[dense_weights] = [0.5, 0.6, 0.0]: must be on the simplex"),
    (dict(place=[[0, 0, 1], [-0.5, 1.5, 0], [0, 1, 0], [1, 0, 0]]), "OrgKnobs.place[expert_weights] = [-0.5, 1.5, 0.0]: must be on the simplex"),
    (dict(direct_gbps=0.0, balanced_split=0.0, relay_fraction=0.5),
     "OrgKnobs.relay_fraction = 0.5: sends experts over Direct, which is absent"),
    (dict(relay_gbps=0.0, balanced_split=0.0, relay_fraction=0.1),
     "OrgKnobs.relay_fraction = 0.1: sends experts over Relay, which is absent"),
    (dict(hbf_sram_region_bytes=0), "OrgKnobs.hbf_sram_region_bytes = 0: must be in (0, 1e+15]"),
]


@pytest.mark.parametrize("changes, message", BAD)
def test_bad_knobs_are_refused_naming_field_value_and_rule(changes, message):
    with pytest.raises(ConfigError) as err:
        o.dash(**changes)
    assert message in str(err.value), str(err.value)


def test_tier_bytes_count_replicas_in_both_tiers():
    k = o.dash()
    used = np.asarray(o.tier_bytes(jnp.array([10.0, 100.0, 1000.0, 10000.0]), k))
    # dense weights replicated (both), experts and prefill KV in HBF, decode KV in HBM
    np.testing.assert_array_equal(used, [10.0 + 10000.0, 10.0 + 100.0 + 1000.0])
    np.testing.assert_allclose(np.asarray(o.capacity_bytes(k)), [48e9, 2 * hardware.preset("dash").hbf.capacity_bytes / 2],
                               rtol=1e-6)
    assert float(o.page_wave_bytes(k)) == 16 * 2**20  # DASH §VI-A: 16 MiB across two stacks


def test_writeback_without_hbm_hbf_links_goes_through_the_gpu():
    assert float(d.hbm_to_hbf_gbps(o.dash())) == 3200.0  # two HBM–HBF links
    assert float(d.hbm_to_hbf_gbps(o.direct_only(gpu_hbm_gbps=1000.0))) == 2000.0  # min(GPU–HBM, Direct)
