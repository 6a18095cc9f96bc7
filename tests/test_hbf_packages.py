"""The organisations of HBFlex's evaluation (hbfjax.memory.hbf_packages): the package budget of HBFlex
§6.1 recomputed from the preset, placements, policies and the ablation stages."""

import jax
import numpy as np
import pytest

from hbfjax import batch
from hbfjax.memory import delivery, hbf_packages as hp
from hbfjax.memory import organisations as orgs
from hbfjax.validate import ConfigError

FULL_STACK_BYTES = 16 * 32 * 512 * 512 * 4096  # HBFlex §6.1: dies × planes × blocks × pages × 4 KiB


def test_full_hbf_package_is_six_stacks_of_3072_planes_at_2_93_tbps():
    org = hp.hbflex().org
    assert float(hp.planes(org)) == 3072
    assert np.isclose(float(orgs.capacity_bytes(org)[1]), 6 * FULL_STACK_BYTES, rtol=1e-6)
    assert float(orgs.capacity_bytes(org)[0]) == 0.0
    cuts = delivery.read_cuts(org)
    assert np.isclose(float(cuts.hbf_gbps), 6 * 488.0)  # HBFlex §3: 2.93 TB/s (the 488 GB/s links bind)
    assert float(hp.sram_bytes(org)) == 240e6  # 6 × 40 MB


def test_cascaded_stacks_hold_a_quarter_hbm_and_three_quarters_hbf():
    org = hp.h3().org
    hbm, hbf = (float(x) for x in orgs.capacity_bytes(org))
    assert np.isclose(hbm, 6 * 24e9 / 4, rtol=1e-6)
    assert np.isclose(hbf, 6 * FULL_STACK_BYTES * 0.75, rtol=1e-6)
    assert float(hp.planes(org)) == 0.75 * 3072
    cuts = delivery.read_cuts(org)
    assert np.isclose(float(cuts.hbf_gbps), 6 * 488.0 * 0.75)  # read bandwidth scaled to ¾
    assert np.isclose(float(cuts.hbm_gbps), 6 * 800.0)  # HBM bandwidth unchanged (HBFlex §6.1)
    assert np.isclose(float(org.hbf_write_gbps), 27.2 * 0.75)
    assert float(org.direct_gbps) == 0.0 and float(org.relay_gbps) > 0  # HBF behind the HBM side


def test_flashaccel_co_located_is_five_hbf_and_one_hbm_stack():
    org = hp.fa_cli().org
    assert float(org.hbf_stacks) == 5 and float(org.hbm_stacks) == 1
    assert np.isclose(float(orgs.capacity_bytes(org)[0]), 24e9)
    assert np.isclose(float(delivery.read_cuts(org).hbf_gbps), 5 * 488.0)


def test_placements_follow_table_1():
    hbm, hbf = orgs.HBM, orgs.HBF
    for name in ("hbflex", "naive-hbf"):
        assert np.all(np.asarray(hp.package(name).org.place)[:, hbf] == 1)
    h3 = np.asarray(hp.h3().org.place)
    assert h3[orgs.PREFILL_KV, hbm] == 1 and h3[orgs.DECODE_KV, hbm] == 1 and h3[orgs.EXPERT_WEIGHTS, hbf] == 1
    fa = np.asarray(hp.fa_csi().org.place)
    assert fa[orgs.PREFILL_KV, hbf] == 1 and fa[orgs.DECODE_KV, hbm] == 1
    assert float(hp.h3().policy.hbf_request_kv) == 0 and float(hp.fa_cli().policy.hbf_request_kv) == 1


def test_ablation_stages_are_cumulative_and_end_at_hbflex():
    stages = hp.ablation_stages()
    keys = list(hp.PolicyKnobs.__dataclass_fields__)
    last = stages["+reclamation"]
    full = hp.hbflex_policy()
    assert all(float(getattr(last, k)) == float(getattr(full, k)) for k in keys)
    on = [sum(float(getattr(p, k)) for k in ("balanced", "buffered", "lifetime_aware")) for p in stages.values()]
    assert on == [0, 1, 2, 3]


def test_disable_turns_each_mechanism_off():
    p = hp.disable(hp.hbflex_policy(), ["placement", "writeback", "reclamation"])
    assert float(p.balanced) == 0 and float(p.buffered) == 0 and float(p.lifetime_aware) == 0
    assert float(p.gc_trigger) == float(p.evict_threshold)
    assert float(p.offload_fraction) == np.float32(0.1)  # balancing left on
    with pytest.raises(ConfigError, match="--disable 'magic'"):
        hp.disable(p, ["magic"])


@pytest.mark.parametrize("changes, message", [
    (dict(balanced=2), "PolicyKnobs.balanced = 2: must be 0 or 1"),
    (dict(gc_trigger=0.8), "PolicyKnobs.gc_trigger = 0.8: GC cannot trigger before eviction"),
    (dict(offload_fraction=1.0), "PolicyKnobs.offload_fraction = 1.0"),
    (dict(group_size=0), "PolicyKnobs.group_size = 0"),
])
def test_bad_policy_is_refused_naming_field_value_and_rule(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hp.hbflex_policy(**changes)


def test_every_organisation_stacks_on_one_knob_axis():
    stacked = batch.stack_knobs([hp.package(n) for n in hp.PACKAGES])
    leaves = jax.tree_util.tree_leaves(stacked)
    assert all(leaf.shape[0] == len(hp.PACKAGES) for leaf in leaves)
    with pytest.raises(ConfigError, match="organisation = 'dash'"):
        hp.package("dash")
