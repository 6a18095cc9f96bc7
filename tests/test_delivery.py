"""DASH delivery paths by hand: expert delivery over Direct and Relay, parallel HBM/HBF reads and the
direct prefill write, against hand-computed times and independent references (brute force over every
whole-expert split, a linear program over link flows, an event-by-event flow shop)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax.memory import delivery as d
from hbfjax.memory import organisations as o

# A round-number package: one HBM and one HBF stack; links of 1,000 GB/s = 1e6 B/µs; HBM cells 500 GB/s;
# 500 units × 4,096 B = 2,048,000 B per page wave, tR = 2 µs: arrays (and SRAM) 1,024 GB/s;
# relay chunks of 1e6 B: the first one crosses the HBM–HBF link in 1 µs.
TINY = dict(gpu_hbm_gbps=1000.0, direct_gbps=1000.0, relay_gbps=1000.0, hbm_stacks=1, hbf_stacks=1,
            hbm_capacity_bytes=1e9, hbm_bw_gbps=500.0, hbf_capacity_bytes=1e10, parallel_units=500,
            page_bytes=4096, t_read_us=2.0, t_prog_us=50.0, hbf_sram_region_bytes=2_048_000,
            relay_sram_region_bytes=1e6, lookahead=0.0, shared_array_rate=0.0)


def tiny(**changes) -> o.OrgKnobs:
    return o.OrgKnobs.make(**{**TINY, **changes})


def deliver(n, b, knobs, window_us=math.inf):
    return jax.tree_util.tree_map(float, d.expert_delivery(jnp.float32(n), b, knobs, window_us))


def test_one_expert_on_direct_is_tr_plus_bytes_over_the_link():
    out = deliver(1, 8e6, tiny(relay_gbps=0.0))
    assert out.delivery_us == pytest.approx(2.0 + 8.0, rel=1e-6)  # tR + 8e6 B / 1e6 B/µs
    assert (out.direct_experts, out.relay_experts, out.relay_us) == (1, 0, 0)
    assert d.PATHS[int(out.slow_path)] == "direct" and d.LIMITS[int(out.limit)] == "link"


def test_one_expert_on_relay_adds_the_first_relay_chunk():
    out = deliver(1, 8e6, tiny(direct_gbps=0.0))
    # tR + first 1e6 B chunk over the HBM–HBF link (1 µs) + 8e6 B at min(relay, GPU–HBM) = 1e6 B/µs
    assert out.delivery_us == pytest.approx(2.0 + 1.0 + 8.0, rel=1e-6)
    assert out.relay_startup_us == pytest.approx(3.0, rel=1e-6)
    assert (out.direct_experts, out.relay_experts) == (0, 1)


def test_two_paths_split_whole_experts_to_minimise_the_later_path():
    out = deliver(5, 4e6, tiny())
    # k on Direct: T_D = 2 + 4k, T_R = 3 + 4(5 − k); k = 3: max(14, 11) = 14; k = 2: max(10, 15) = 15
    assert (out.direct_experts, out.relay_experts) == (3, 2)
    assert out.direct_us == pytest.approx(14.0, rel=1e-6) and out.relay_us == pytest.approx(11.0, rel=1e-6)
    assert out.delivery_us == pytest.approx(14.0, rel=1e-6)


def test_shared_array_rate_changes_the_split_and_time_as_computed_by_hand():
    out = deliver(5, 4e6, tiny(shared_array_rate=1.0))
    # both paths together drain at most 1,024 GB/s: every busy path lasts >= 20e6 / 1.024e6 = 19.53125 µs.
    # k = 5: 2 + max(20, 19.53125) = 22; k = 3 or 4: relay 3 + 19.53125 = 22.53125; k = 0: 3 + 20 = 23
    assert (out.direct_experts, out.relay_experts) == (5, 0)
    assert out.delivery_us == pytest.approx(22.0, rel=1e-6)
    assert d.LIMITS[int(out.limit)] == "link"  # Direct's 1,000 GB/s link is below the arrays' 1,024
    split = deliver(4, 4e6, tiny(shared_array_rate=1.0))
    # k = 2: 2 + max(8, 15.625) = 17.625 and 3 + 15.625 = 18.625; k = 4: 2 + 16 = 18; k = 3: 3 + 15.625
    assert split.delivery_us == pytest.approx(18.0, rel=1e-6) and split.direct_experts == 4


def test_per_path_array_rate_binds_when_below_the_link():
    out = deliver(2, 10e6, tiny(parallel_units=250))  # arrays 512 GB/s per path, below the 1,000 GB/s links
    # one expert each: Direct 2 + 10e6 / 5.12e5 = 21.53125, Relay 3 + 19.53125 = 22.53125
    assert out.delivery_us == pytest.approx(22.53125, rel=1e-6)
    assert d.PATHS[int(out.slow_path)] == "relay" and d.LIMITS[int(out.limit)] == "array"
    small_sram = deliver(2, 10e6, tiny(hbf_sram_region_bytes=1_024_000))  # SRAM refills 1.024e6 B per tR
    assert small_sram.delivery_us == pytest.approx(22.53125, rel=1e-6)
    assert d.LIMITS[int(small_sram.limit)] == "sram"
    narrow = deliver(2, 10e6, tiny(hbf_interface_gbps=512.0))  # a part's interface at the per-path array rate
    assert narrow.delivery_us == pytest.approx(22.53125, rel=1e-6)
    assert d.LIMITS[int(narrow.limit)] == "interface"


def test_interface_caps_both_paths_together_when_arrays_are_shared():
    # 2 experts of 10 MB; arrays 1,024 GB/s shared, links 1,000 GB/s; a 400 GB/s interface makes every busy
    # path last all 20 MB / 400 GB/s = 50 µs: both on Direct 2 + 50 = 52; split, Relay 2 + 1 (first chunk) + 50
    out = deliver(2, 10e6, tiny(shared_array_rate=1.0, hbf_interface_gbps=400.0))
    assert out.delivery_us == pytest.approx(52.0, rel=1e-6) and out.direct_experts == 2
    assert d.LIMITS[int(out.limit)] == "interface"
    assert float(d.read_cuts(tiny(shared_array_rate=1.0, hbf_interface_gbps=400.0)).hbf_gbps) == pytest.approx(400.0)
    # per-path arrays (TINY): each path's source is capped by the interface, Direct 400 + Relay 400
    assert float(d.read_cuts(tiny(hbf_interface_gbps=400.0)).hbf_gbps) == pytest.approx(800.0)


def test_lookahead_hides_tr_up_to_its_window():
    assert deliver(1, 8e6, tiny(relay_gbps=0.0, lookahead=1.0)).delivery_us == pytest.approx(8.0, rel=1e-6)
    assert deliver(1, 8e6, tiny(relay_gbps=0.0, lookahead=1.0), window_us=0.5).delivery_us == pytest.approx(9.5)
    relay = deliver(1, 8e6, tiny(direct_gbps=0.0, lookahead=1.0))
    assert relay.delivery_us == pytest.approx(1.0 + 8.0, rel=1e-6)  # the relay chunk fill is not hidden


def test_an_absent_link_gets_no_experts():
    for n in (1, 5, 17):
        no_relay, no_direct = deliver(n, 4e6, tiny(relay_gbps=0.0)), deliver(n, 4e6, tiny(direct_gbps=0.0))
        assert no_relay.relay_experts == 0 and no_direct.direct_experts == 0
        assert no_relay.delivery_us == pytest.approx(2.0 + 4.0 * n, rel=1e-6)
        assert no_direct.delivery_us == pytest.approx(3.0 + 4.0 * n, rel=1e-6)


def test_nothing_needed_takes_no_time():
    out = deliver(0, 4e6, tiny(lookahead=0.0))
    assert (out.delivery_us, out.direct_us, out.relay_us, out.direct_startup_us) == (0, 0, 0, 0)


def test_needed_mask_counts_its_experts():
    mask = jnp.array([True, False, True, True, False, True, True, False])
    a = d.expert_delivery(mask, 4e6, tiny())
    assert float(a.direct_experts + a.relay_experts) == 5 and float(a.delivery_us) == pytest.approx(14.0, rel=1e-6)


def test_fixed_relay_fraction_sends_that_share_of_whole_experts():
    out = deliver(5, 4e6, tiny(balanced_split=0.0, relay_fraction=0.4))
    assert (out.direct_experts, out.relay_experts) == (3, 2)
    assert deliver(5, 4e6, tiny(balanced_split=0.0, relay_fraction=0.7)).relay_experts == 4  # round(3.5) = 4


def _reference_times(k, n, b, kw):
    """Plain-Python T_Direct, T_Relay from the model's statement (float64)."""
    link = lambda nbytes, gbps: 0.0 if nbytes == 0 else (math.inf if gbps == 0 else nbytes / (gbps * 1e3))  # noqa: E731
    pairs = min(kw["hbm_stacks"], kw["hbf_stacks"])
    per_tr = kw["hbf_stacks"] / (kw["t_read_us"] * 1e3)
    source = min(min(kw["parallel_units"] * kw["page_bytes"], kw["hbf_sram_region_bytes"]) * per_tr,
                 kw["hbf_stacks"] * kw.get("hbf_interface_gbps", math.inf))  # a part's interface (issue 25)
    direct = kw["hbf_stacks"] * kw["direct_gbps"]
    relay = pairs * min(kw["relay_gbps"], kw["gpu_hbm_gbps"])
    tr = kw["t_read_us"] * (1 - kw["lookahead"])
    floor = link(n * b, source) if kw["shared_array_rate"] else 0.0
    if not kw["shared_array_rate"]:
        direct, relay = min(direct, source), min(relay, source)
    bd, br = k * b, (n - k) * b
    t_d = 0.0 if bd == 0 else tr + max(link(bd, direct), floor)
    fill = link(min(br / pairs, kw["relay_sram_region_bytes"]), kw["relay_gbps"])
    t_r = 0.0 if br == 0 else tr + fill + max(link(br, relay), floor)
    return t_d, t_r


def test_balanced_split_equals_the_best_of_every_whole_expert_split():
    rng = np.random.default_rng(11)
    for _ in range(60):
        kw = dict(TINY, direct_gbps=float(rng.choice([0, 400, 1000, 1600])),
                  relay_gbps=float(rng.choice([0, 300, 1000, 1600])),
                  gpu_hbm_gbps=float(rng.choice([800, 1600])), hbm_stacks=int(rng.integers(1, 3)),
                  hbf_stacks=int(rng.integers(1, 3)), parallel_units=int(rng.choice([100, 500, 2048])),
                  t_read_us=float(rng.choice([1.0, 3.0, 30.0])), lookahead=float(rng.integers(0, 2)),
                  shared_array_rate=float(rng.integers(0, 2)),
                  relay_sram_region_bytes=float(rng.choice([1e5, 4 * 2**20])),
                  hbf_interface_gbps=float(rng.choice([300, 900, 1e7])))
        if kw["direct_gbps"] == 0 and kw["relay_gbps"] == 0:
            kw["direct_gbps"] = 1000.0
        n, b = int(rng.integers(0, 40)), float(rng.choice([2e5, 3e6, 4e7]))
        best = min(max(_reference_times(k, n, b, kw)) for k in range(n + 1))
        got = deliver(n, b, o.OrgKnobs.make(**kw))
        assert got.delivery_us == pytest.approx(best, rel=2e-6), (kw, n, b)
        assert max(_reference_times(int(got.direct_experts), n, b, kw)) == pytest.approx(best, rel=2e-6)


def test_organisations_with_a_link_zeroed_equal_dash_with_that_link_zeroed():
    for name, zeroed in (("relay-only", "direct_gbps"), ("direct-only", "relay_gbps")):
        for n in (1, 8, 64):
            a = d.expert_delivery(jnp.float32(n), 37.7e6, o.organisation(name))
            b = d.expert_delivery(jnp.float32(n), 37.7e6, o.dash(**{zeroed: 0.0}))
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)


def test_dash_delivers_over_both_route_sets_at_once():
    # DASH §VI-E: 3.2 TB/s per baseline route set, 6.4 TB/s in DASH (per path, links bind: 1.6 < 2.8 TB/s arrays)
    n, b = 64, 50e6
    times = {name: float(d.expert_delivery(jnp.float32(n), b, o.organisation(name, shared_array_rate=0.0, lookahead=0.0)).delivery_us)
             for name in ("dash", "relay-only", "direct-only")}
    assert times["direct-only"] == pytest.approx(3.0 + n * b / 3.2e6, rel=1e-6)
    assert times["dash"] == pytest.approx(3.0 + 4 * 2**20 / 1.6e6 + n / 2 * b / 3.2e6, rel=1e-6)


# --- parallel reads --------------------------------------------------------------------------------

def test_kv_ranges_read_in_parallel_by_hand():
    r = jax.tree_util.tree_map(float, d.parallel_read(1e6, 4e6, tiny(shared_array_rate=1.0)))
    # cuts: HBM min(500, 1000) = 500; HBF min(1024, 1000 + 1000) = 1024; both min(500 + 1024, 1000 + 1000) = 1524
    assert r.read_us == pytest.approx(4e6 / 1.024e6, rel=1e-6) and d.READ_LIMITS[int(r.limit)] == "hbf"
    assert (r.hbm_bytes, r.hbf_bytes) == (1e6, 4e6)


def test_replicated_weights_split_to_balance_by_hand():
    shared = tiny(shared_array_rate=1.0)
    r = jax.tree_util.tree_map(float, d.replicated_read(10e6, shared))
    assert r.read_us == pytest.approx(10e6 / 1.524e6, rel=1e-6) and d.READ_LIMITS[int(r.limit)] == "joint"
    assert r.hbm_bytes / 5e5 == pytest.approx(r.read_us, rel=1e-5)  # HBM busy the whole read
    assert r.hbm_bytes + r.hbf_bytes == pytest.approx(10e6)
    assert float(d.replicated_read(10e6, tiny()).read_us) == pytest.approx(5.0, rel=1e-6)  # per path: 2,000 GB/s
    # RelayOnly: HBF bytes share the GPU–HBM link with HBM's, so the replica adds nothing over 1,000 GB/s
    assert float(d.replicated_read(10e6, tiny(direct_gbps=0.0, shared_array_rate=1.0)).read_us) == pytest.approx(10.0)


def test_an_hbf_only_read_puts_no_byte_on_hbm():
    """HBM carries its own and the replicated bytes only: an HBF-only read reports exactly 0 HBM bytes, on
    an organisation with HBM (DASH) and without (HBFlex's all-HBF package), at sizes where the split's
    bound total − hbf · t would leave float32 rounding on the HBM side."""
    from hbfjax.memory import hbf_packages

    sizes = jnp.asarray(np.geomspace(1.0, 3e10, 97), jnp.float32)
    for org in (o.dash(), hbf_packages.hbflex().org):
        r = jax.jit(jax.vmap(lambda f: d.parallel_read(0.0, f, org)))(sizes)
        np.testing.assert_array_equal(np.asarray(r.hbm_bytes), 0.0)
        np.testing.assert_array_equal(np.asarray(r.hbf_bytes), np.asarray(sizes))


def test_parallel_read_time_equals_the_linear_program_over_link_flows():
    linprog = pytest.importorskip("scipy.optimize").linprog
    rng = np.random.default_rng(5)
    for _ in range(40):
        kw = dict(TINY, direct_gbps=float(rng.choice([0, 700, 1600])), relay_gbps=float(rng.choice([0, 900, 1600])),
                  gpu_hbm_gbps=float(rng.choice([600, 1600])), hbm_bw_gbps=float(rng.choice([400, 1200, 3000])),
                  parallel_units=int(rng.choice([200, 500, 2048])), shared_array_rate=float(rng.integers(0, 2)),
                  hbf_interface_gbps=float(rng.choice([300, 1e7])))
        if kw["direct_gbps"] == 0 and kw["relay_gbps"] == 0:
            kw["relay_gbps"] = 900.0
        h, f, e = (float(rng.choice([0, 1e6, 7e6])) for _ in range(3))
        if h + f + e == 0:
            continue
        r = d.rates(o.OrgKnobs.make(**kw))
        m, g, dd, x = (float(v) for v in (r.hbm_cells_gbps, r.gpu_hbm_gbps, r.direct_gbps, r.relay_link_gbps))
        src, k = float(min(r.array_gbps, r.sram_gbps, r.interface_gbps)), 1e3  # k: B/µs per GB/s
        # variables: bytes from HBM (xh), from HBF over Direct (xd) and over Relay (xr), and the time t (µs)
        a_ub = [[1, 0, 0, -m * k], [1, 0, 1, -g * k], [0, 1, 0, -dd * k], [0, 0, 1, -x * k],  # cells, G, D, X
                [-1, 0, 0, 0], [1, 0, 0, 0]]  # HBM carries its own bytes and at most the replicated ones too
        b_ub = [0.0, 0.0, 0.0, 0.0, -h, h + e]
        shared = [[0, 1, 1, -src * k]] if kw["shared_array_rate"] else [[0, 1, 0, -src * k], [0, 0, 1, -src * k]]
        res = linprog([0, 0, 0, 1], A_ub=a_ub + shared, b_ub=b_ub + [0.0] * len(shared), A_eq=[[1, 1, 1, 0]],
                      b_eq=[h + f + e], bounds=[(0, None)] * 4, method="highs")
        assert res.status == 0
        got = d.parallel_read(h, f, o.OrgKnobs.make(**kw), either_bytes=e)
        assert float(got.read_us) == pytest.approx(res.x[3], rel=1e-5), (kw, h, f, e)
        assert float(got.hbm_bytes) >= h * (1 - 1e-6) and float(got.hbf_bytes) >= f * (1 - 1e-6)
        assert float(got.hbm_bytes) <= float(d.read_cuts(o.OrgKnobs.make(**kw)).hbm_gbps) * k * float(got.read_us) * (1 + 1e-5)


# --- direct prefill write ------------------------------------------------------------------------

def _flow_shop_us(nbytes, chunk, us_per_byte, t_prog, regions=2):
    """Event-by-event: chunks sent back to back into one of ``regions`` SRAM regions, each programmed
    for t_prog once sent and once the previous program ended; a region is reused once programmed."""
    sizes = [chunk] * int(nbytes // chunk) + ([nbytes % chunk] if nbytes % chunk else [])
    sent = prog_end = 0.0
    freed = [0.0] * regions
    for i, size in enumerate(sizes):
        start = max(sent, freed[i % regions])
        sent = start + size * us_per_byte
        prog_end = max(sent, prog_end) + t_prog
        freed[i % regions] = prog_end
    return prog_end


def test_prefill_write_by_hand_program_bound_and_link_bound():
    slow = jax.tree_util.tree_map(float, d.prefill_write(5e6, tiny()))
    # three 2,048,000 B waves: first sent in 2.048 µs, then 3 × 50 µs of programs back to back
    assert slow.waves == 3 and slow.write_us == pytest.approx(2.048 + 150.0, rel=1e-6)
    assert slow.program_busy_us == 150.0 and slow.link_us == pytest.approx(5.0, rel=1e-6)
    fast = float(d.prefill_write(5e6, tiny(t_prog_us=2.0)).write_us)
    # sends end at 2.048, 4.096, 5.0; programs [2.048, 4.048], [4.096, 6.096], [6.096, 8.096]
    assert fast == pytest.approx(8.096, rel=1e-6)
    hidden = d.prefill_write(5e6, tiny(), window_us=100.0)
    assert float(hidden.exposed_us) == pytest.approx(52.048, rel=1e-5)
    assert float(d.prefill_write(0.0, tiny()).write_us) == 0.0


def test_prefill_write_equals_the_event_by_event_flow_shop():
    for nbytes, t_prog, units, stacks in itertools.product((1e5, 2_048_000, 5e6, 3.3e7), (2.0, 2.5, 50.0), (250, 500),
                                                           (1, 2)):
        knobs = tiny(t_prog_us=t_prog, parallel_units=units, hbf_stacks=stacks, hbm_stacks=stacks)
        chunk = stacks * min(units * 4096, 2_048_000)
        want = _flow_shop_us(nbytes, chunk, 1 / (stacks * 1e6), t_prog)
        assert float(d.prefill_write(nbytes, knobs).write_us) == pytest.approx(want, rel=1e-6)


def test_prefill_write_without_direct_uses_the_relay_route():
    assert float(d.prefill_write(5e6, tiny(direct_gbps=0.0, gpu_hbm_gbps=500.0)).link_us) == pytest.approx(10.0)


def test_delivery_is_jit_and_vmap_safe():
    knobs = tiny(shared_array_rate=1.0)
    ns = jnp.arange(0, 20, dtype=jnp.float32)
    batched = jax.jit(jax.vmap(lambda n: d.expert_delivery(n, 4e6, knobs)))(ns)
    for i, n in enumerate(ns):
        one = d.expert_delivery(n, 4e6, knobs)
        # the shared-array floor makes many splits tie: jit may pick another one of equal time
        assert float(batched.delivery_us[i]) == pytest.approx(float(one.delivery_us), rel=1e-6)
        assert float(batched.direct_experts[i] + batched.relay_experts[i]) == float(n)


def test_needed_masks_of_several_layers_give_one_delivery_per_layer():
    needed = jnp.array([[True] * 8, [True, False] * 4, [False] * 8])  # bool[L = 3, E = 8], e.g. Routing.needed
    out = d.expert_delivery(needed, 4e6, tiny())
    assert out.delivery_us.shape == (3,)
    for layer, count in enumerate((8, 4, 0)):
        assert float(out.delivery_us[layer]) == pytest.approx(deliver(count, 4e6, tiny()).delivery_us, rel=1e-6)


def test_the_lookup_table_equals_the_split_search_for_every_count_and_window():
    """expert_delivery_lookup from one expert_delivery_table (tR hidden) = expert_delivery itself, field by
    field, for 0 … E needed experts, on the four DASH organisations, shared and per-path arrays, lookahead on
    and off, and windows that hide none, part or all of tR."""
    n = jnp.arange(129, dtype=jnp.float32)
    for name in o.ORGANISATIONS:
        for changes in ({}, {"shared_array_rate": 0}, {"lookahead": 0}, {"t_read_us": 32.0}):
            org = o.organisation(name, **changes)
            table = d.expert_delivery_table(128, 37.7e6, org)
            for window in (0.0, 1.5, 1e9):
                want = d.expert_delivery(n, 37.7e6, org, window_us=window)
                got = d.expert_delivery_lookup(table, n, org, window_us=window)
                for field, a, b in zip(want._fields, want, got):
                    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-7, err_msg=f"{name} {changes} {field}")
