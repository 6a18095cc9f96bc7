"""Plane collisions: hand cases, the exact max-load distribution, invariants and transform invariants."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch
from hbfjax.flash.reads.analytic import expected_max_load, max_load_cdf
from hbfjax.flash.reads import collide as c
from hbfjax.hardware import SpecError

Z = 4.5  # tolerance in standard errors: two-sided false-alarm rate ~7e-6 per check


def _read(planes, pages, placement="random", streams=1000, seed=0, **knobs):
    config = c.ReadConfig(planes=planes, max_pages=pages, placement=placement)
    k = c.ReadKnobs(pages=jnp.int32(pages), placement=c.PlacementKnobs.make(**knobs))
    return batch.run(c.simulate, streams, seed, k, config)


def test_four_pages_on_four_planes_hand_case():
    # 4^4 = 256 equally likely placements: max 1 in 24, max 2 in 180, max 3 in 48, max 4 in 4
    assert expected_max_load(4, 4) == pytest.approx(544 / 256, abs=1e-12)
    assert max_load_cdf(4, 4, 1) == pytest.approx(24 / 256, abs=1e-12)
    waves = _read(4, 4, streams=200_000).waves
    se = waves.std(ddof=1) / np.sqrt(waves.size)
    assert abs(waves.mean() - 2.125) < Z * se


@pytest.mark.parametrize("m", [4, 16, 64])
@pytest.mark.parametrize("ratio", [0.5, 1, 4])
def test_random_waves_match_exact_expected_max_load(m, ratio):
    n = int(m * ratio)
    waves = _read(m, n, streams=20_000, seed=m + n).waves
    se = waves.std(ddof=1) / np.sqrt(waves.size)
    assert abs(waves.mean() - expected_max_load(n, m)) < Z * se


def test_exact_max_load_small_cases_by_enumeration():
    import itertools
    for n, m in [(3, 3), (5, 2), (4, 3)]:
        maxima = [max(np.bincount(p, minlength=m)) for p in itertools.product(range(m), repeat=n)]
        assert expected_max_load(n, m) == pytest.approx(np.mean(maxima), abs=1e-12)


@pytest.mark.parametrize("placement", c.PLACEMENTS)
def test_pages_conserved_and_waves_at_least_ideal(placement):
    planes, pages = 64, 200
    config = c.ReadConfig(planes=planes, max_pages=256, placement=placement)
    knobs = c.PlacementKnobs.make(group_size=8, pages_per_logical=3, pages_per_block=16)
    for s in range(20):
        page = jnp.arange(256, dtype=jnp.int32)
        plane = c.place_pages(placement, (jnp.uint32(1), jnp.int32(s)), page, planes, knobs)
        loads = c.plane_loads(plane, page < pages, planes)
        assert int(loads.sum()) == pages and int(plane.min()) >= 0 and int(plane.max()) < planes
    out = batch.run(c.simulate, 200, 3, c.ReadKnobs(jnp.int32(pages), knobs), config)
    assert np.all(out.waves >= out.ideal_waves) and np.all(out.ideal_waves == 4)


def test_plane_group_with_all_planes_and_one_page_per_logical_is_random():
    a = _read(512, 700, "random", streams=64, seed=5)
    b = _read(512, 700, "plane-group", streams=64, seed=5, group_size=512, pages_per_logical=1)
    np.testing.assert_array_equal(a.waves, b.waves)


def test_plane_group_logical_page_spanning_its_group_is_perfectly_balanced():
    # L = G: every logical page covers its whole group; groups are visited in turn
    out = _read(256, 1024, "plane-group", streams=16, group_size=16, pages_per_logical=16)
    assert np.all(out.waves == 4) and np.all(out.amplification == 1)


def test_isolated_read_is_bound_by_pages_per_block():
    out = _read(3072, 3072, "isolated", streams=32, pages_per_block=512)
    assert np.all(out.waves >= 512)  # 6 blocks of 512 pages: at most 6 planes busy


def test_offload_hand_case():
    loads = jnp.array([5, 3, 1, 1], jnp.int32)
    for f, left, moved in [(0.0, [5, 3, 1, 1], 0), (0.25, [3, 3, 1, 1], 2), (0.5, [1, 1, 1, 1], 6)]:
        capped, offloaded = c.offload_hot_planes(loads, jnp.float32(f))
        assert capped.tolist() == left and int(offloaded) == moved


def test_offload_lowers_waves_and_costs_sram_monotonically():
    fractions = [0.0, 0.05, 0.1, 0.2]
    knobs = batch.stack_knobs([c.ReadKnobs(jnp.int32(3072), c.PlacementKnobs.make(offload_fraction=f)) for f in fractions])
    config = c.ReadConfig(planes=3072, max_pages=3072, placement="random")
    out = batch.run(c.simulate, 64, 0, knobs, config, knob_axis=True)
    assert np.all(np.diff(out.waves, axis=1) <= 0)
    assert np.all(np.diff(out.offloaded_pages, axis=1) >= 0)


def test_group_size_must_divide_planes():
    with pytest.raises(SpecError, match="group_size = 5"):
        c.check_group_size(3072, 5)
    c.check_group_size(3072, 32)


def test_jit_equals_eager_and_vmap_equals_loop():
    config = c.ReadConfig(planes=128, max_pages=300, placement="plane-group")
    knobs = c.ReadKnobs(jnp.int32(257), c.PlacementKnobs.make(group_size=16, pages_per_logical=2, offload_fraction=0.1))
    batched = batch.run(c.simulate, 6, 9, knobs, config)
    with jax.disable_jit():
        for s in range(6):
            eager = c.simulate(jnp.int32(s), jnp.uint32(9), knobs, None, config)
            for key, value in eager._asdict().items():
                assert np.asarray(value) == pytest.approx(getattr(batched, key)[s]), key


def test_same_seed_same_result_other_seed_differs():
    a, b, d = (_read(256, 256, streams=50, seed=s).waves for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, d)


def test_knob_values_do_not_recompile():
    config = c.ReadConfig(planes=96, max_pages=96, placement="plane-group")
    with compilations("simulate") as compiled:
        for g, f, n in [(96, 0.0, 96), (32, 0.1, 50), (8, 0.2, 7), (1, 0.0, 96)]:
            batch.run(c.simulate, 8, g, c.ReadKnobs(jnp.int32(n), c.PlacementKnobs.make(g, 2, 16, f)), config)
    assert len(compiled) == 1, compiled  # this config is used by no other test: one compilation, then reuse


def test_knob_sweep_uses_common_random_numbers():
    config = c.ReadConfig(planes=64, max_pages=64, placement="plane-group")
    points = [c.ReadKnobs(jnp.int32(64), c.PlacementKnobs.make(g, 1)) for g in (64, 8)]
    swept = batch.run(c.simulate, 10, 4, batch.stack_knobs(points), config, knob_axis=True)
    for i, k in enumerate(points):
        np.testing.assert_array_equal(swept.waves[:, i], batch.run(c.simulate, 10, 4, k, config).waves)


def test_results_do_not_depend_on_device_count():
    code = ("import json, jax, jax.numpy as jnp; from hbfjax import batch; from hbfjax.flash.reads import collide as c;"
            "cfg = c.ReadConfig(planes=256, max_pages=256, placement='random');"
            "k = c.ReadKnobs(jnp.int32(256), c.PlacementKnobs.make());"
            "o = batch.run(c.simulate, 10, 3, k, cfg);"
            "print(json.dumps([jax.device_count(), o.waves.tolist()]))")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    devices, waves = json.loads(done.stdout.strip().splitlines()[-1])
    assert devices == 4
    assert waves == _read(256, 256, streams=10, seed=3).waves.tolist()


def test_histogram_offload_level_equals_the_sorted_one():
    loads = jnp.asarray(np.random.default_rng(0).poisson(3.0, 500), jnp.int32)
    for f in (0.0, 0.01, 0.1, 0.37):
        by_sort = c.offload_hot_planes(loads, jnp.float32(f))
        by_hist = c.offload_hot_planes(loads, jnp.float32(f), load_bound=int(loads.max()) + 3)
        np.testing.assert_array_equal(by_sort[0], by_hist[0])
        assert int(by_sort[1]) == int(by_hist[1])


def test_mapping_streams_in_chunks_changes_nothing():
    config = c.ReadConfig(planes=256, max_pages=300, placement="random")
    knobs = c.ReadKnobs(jnp.int32(300), c.PlacementKnobs.make(offload_fraction=0.05))
    whole = batch.run(c.simulate, 50, 8, knobs, config)
    mapped = batch.run(c.simulate, 50, 8, knobs, config, map_streams=16)
    for key in whole._fields:
        np.testing.assert_array_equal(getattr(whole, key), getattr(mapped, key), err_msg=key)


def test_flat_counter_refuses_int32_index_overflow():
    counts = jax.vmap(lambda p: c.plane_loads(p, jnp.ones_like(p), 2**20))
    with pytest.raises(ValueError, match="exceed int32 indexing"):
        jax.eval_shape(counts, jax.ShapeDtypeStruct((2**11, 4), jnp.int32))


def test_numpy_reference_read_agrees_with_the_exact_expected_maximum():
    from hbfjax.flash.reads.reference import random_read_waves
    from hbfjax.stats import mean_ci95

    mean, ci = mean_ci95(random_read_waves(64, 64, 4000, np.random.default_rng(0)))
    assert abs(mean - expected_max_load(64, 64)) < 2 * ci  # ≈ 4 standard errors
