"""The reclaim part (``hbfjax.serve.parts.reclaim``, issue 26 in serving): its kernels traced by hand, and on
the engine the invariants that tie the rewrites it times to the reads the pass made: every HBF weight page
read counted once (the layer times' expert bytes plus the dense weights of each pass), relocations equal
to reads / N within one block a group (the credits' fractions at the start and the end), rewritten bytes
conserved (windows + forced + still waiting), windows never stalling more than the critical path, a
threshold no block reaches leaving every request time as without the part, and one compilation for a
sweep of the thresholds."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax.memory.organisations import DENSE_WEIGHTS, HBF
from hbfjax.serve import systems
from hbfjax.serve.parts import reclaim
from hbfjax.validate import ConfigError

STREAMS = 2
EPS = 2.0**-24


def test_advance_by_hand():
    credit, due = reclaim.advance(jnp.float32(0.75), jnp.float32(1.5))
    assert float(credit) == 0.25 and float(due) == 2.0
    credit, due = reclaim.advance(jnp.float32(0.25), jnp.float32(0.5))
    assert float(credit) == 0.75 and float(due) == 0.0


def test_forced_us_by_hand():
    """1,024 pages of 512-page blocks on 4,096 planes: two blocks read in parallel, 512 × tR = 1,536 µs, then
    one full-width round of tPROG = 100 µs (the bandwidth, 0.42 µs, does not bind); nothing: 0."""
    args = dict(pages_per_block=512.0, planes=4096.0, t_read_us=3.0, t_prog_us=100.0, page_bytes=4096.0,
                write_gbps=1e7)
    assert float(reclaim.forced_us(jnp.float32(1024.0), **args)) == pytest.approx(1636.0, rel=1e-6)
    assert float(reclaim.forced_us(jnp.float32(0.0), **args)) == 0.0
    # 9,000 blocks on 4,096 planes: three read rounds; 4.608e6 pages: 1,125 program rounds
    assert float(reclaim.forced_us(jnp.float32(9000 * 512.0), **args)) == pytest.approx(
        3 * 512 * 3.0 + 1125 * 100.0, rel=1e-6)


def test_window_pages_by_hand():
    """Windows of 250 and 50 µs at tPROG 100: 2 + 0 rounds, one taken by the KV's 100 µs, so 1 round on 8 planes
    = 8 pages; reads: (83 + 16) tR slots on min(8, ceil(20 / 4)) = 5 source planes = 495; bandwidth: 300 µs at
    1 GB/s = 3e5 B = 73.2 pages; 20 waiting: 8 drain. With 5 waiting, 5."""
    w = jnp.asarray([250.0, 50.0], jnp.float32)
    args = dict(kv_program_us=100.0, kv_bytes=0.0, pages_per_block=4.0, planes=8.0, t_read_us=3.0, t_prog_us=100.0,
                page_bytes=4096.0, write_gbps=1.0)
    assert float(reclaim.window_pages(w, jnp.float32(20.0), **args)) == 8.0
    assert float(reclaim.window_pages(w, jnp.float32(5.0), **args)) == 5.0
    # the bandwidth binds once the KV took 2.9e5 of its 3e5 bytes: 1e4 / 4096 = 2.44 pages
    assert float(reclaim.window_pages(w, jnp.float32(20.0), **{**args, "kv_bytes": 2.9e5})) == pytest.approx(
        1e4 / 4096, rel=1e-6)


def test_knobs_refuse_bad_values():
    with pytest.raises(ConfigError, match="threshold_reads"):
        reclaim.ReclaimKnobs.make(threshold_reads=0.5)
    with pytest.raises(ConfigError, match="in_windows"):
        reclaim.ReclaimKnobs.make(in_windows=0.5)
    with pytest.raises(ConfigError, match="refresh_hours"):
        reclaim.ReclaimKnobs.make(refresh_hours=-1.0)


def _scenario(routing="uniform", **knobs):
    sc = systems.Scenario.fixed_batch(GQA, 4, 48, 12, routing=routing)
    return sc if not knobs else dataclasses.replace(sc, reclaim=reclaim.ReclaimKnobs.make(**knobs))


_COMPILED = {}  # one compilation per static configuration: the knob values (N, windows, refresh) are traced


def _run(sc):
    fam = systems.families(["dash"], sc)[0]
    if fam.config not in _COMPILED:
        simulate, config = fam.simulate, fam.config
        _COMPILED[config] = jax.jit(jax.vmap(lambda s, k, inputs: simulate(s, 0, k, inputs, config),
                                             in_axes=(0, None, None)))
    return fam, _COMPILED[fam.config](jnp.arange(STREAMS), fam.points[0], fam.inputs)


@pytest.fixture(scope="module")
def runs():
    """DASH on the tiny GQA model (its weights are a few blocks' worth, so N = 1 read for relocations to
    fire), refresh every 1e-9 h (3.6 µs) so that it fires too: windows and critical path, uniform (count
    draws) and Zipf (token draws), and the runs without the part and with a threshold no block reaches."""
    out = {}
    for routing in ("uniform", "zipf"):
        for where in (1.0, 0.0):
            out[routing, where] = _run(_scenario(routing, threshold_reads=1.0, in_windows=where,
                                                 refresh_hours=1e-9))
    out["none"] = _run(_scenario())
    out["unreached"] = _run(_scenario(threshold_reads=1e15))
    out["clock"] = _run(_scenario(threshold_reads=1e15, refresh_hours=1e-9))
    return out


def _totals(o):
    return {k: np.asarray(v, np.float64) for k, v in o.parts["reclaim"].totals._asdict().items()}


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_every_weight_page_read_is_counted_once(runs, routing):
    fam, o = runs[routing, 1.0]
    org, model = fam.points[0].org, fam.config.model
    t = _totals(o)
    expert = np.asarray(o.totals.expert_direct_bytes, np.float64) + np.asarray(o.totals.expert_relay_bytes, np.float64)
    dense = np.asarray(o.totals.passes, np.float64) * model.non_expert_weight_bytes * float(org.place[DENSE_WEIGHTS, HBF])
    assert np.all(expert > 0)
    np.testing.assert_allclose(t["weight_page_reads"] * float(org.page_bytes), expert + dense, rtol=1e-4)


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_relocations_are_reads_over_n_within_one_block_a_group(runs, routing):
    fam, o = runs[routing, 1.0]
    model = fam.config.model
    t = _totals(o)
    groups = 3 * model.routed_experts + model.layers  # the credits of the MoE layers' experts and of every layer
    due = t["weight_page_reads"] / 1.0
    assert np.all(due > 10 * groups)  # the bound below is not vacuous
    assert np.all(np.abs(t["relocated_blocks"] - due) < groups)
    per_block = float(fam.points[0].reclaim.pages_per_block)
    np.testing.assert_allclose(t["rewrite_bytes"], (t["relocated_blocks"] + t["refreshed_blocks"]) * per_block
                               * float(fam.points[0].org.page_bytes), rtol=1e-5)
    # refresh every 3.6 µs, but a pass (well under 512 × 3.6 µs) reads every dense block 512 times its N = 1, and
    # under the uniform law a layer's experts together: the reads keep those blocks younger than T, so only the
    # experts Zipf routing leaves unread for stretches of passes are refreshed, at most once per T each
    cycles = (np.asarray(o.totals.busy_us, np.float64) - t["stall_us"]) / (1e-9 * reclaim.US_PER_HOUR)
    g = reclaim.groups(fam.points[0].org, model, per_block)
    expert_blocks = float(g.all_blocks) - model.layers * float(g.dense_blocks)
    assert np.all(cycles > 10)
    if routing == "uniform":
        assert np.all(t["refreshed_blocks"] == 0)
    else:
        assert np.all(t["refreshed_blocks"] > 0) and np.all(t["refreshed_blocks"] <= cycles * expert_blocks + groups)


def test_blocks_the_reads_leave_behind_are_refreshed_once_per_interval(runs):
    """N = 1e15 (reads never relocate) and T = 3.6 µs: every weight block is rewritten once per T of the passes'
    own time (the reclaim stall not counted), within one block per group (the credits' fractions)."""
    fam, o = runs["clock"]
    model, per_block = fam.config.model, float(fam.points[0].reclaim.pages_per_block)
    t = _totals(o)
    all_blocks = float(reclaim.groups(fam.points[0].org, model, per_block).all_blocks)
    cycles = (np.asarray(o.totals.busy_us, np.float64) - t["stall_us"]) / (1e-9 * reclaim.US_PER_HOUR)
    groups = 3 + model.layers  # count draws: one refresh credit per MoE layer's experts and one per layer
    assert np.all(cycles * all_blocks > 10 * groups) and np.all(t["relocated_blocks"] == 0)
    assert np.all(np.abs(t["refreshed_blocks"] - cycles * all_blocks) < groups)


@pytest.mark.parametrize("where", [1.0, 0.0])
def test_rewritten_bytes_are_conserved(runs, where):
    fam, o = runs["uniform", where]
    t = _totals(o)
    waiting = np.asarray(o.parts["reclaim"].final.backlog_bytes, np.float64)
    assert np.all(t["kv_copy_bytes"] > 0)  # DASH's KV cohorts relocate at N = 1 too, into the same backlog
    np.testing.assert_allclose(t["window_bytes"] + t["forced_bytes"] + waiting, t["rewrite_bytes"] + t["kv_copy_bytes"],
                               rtol=1e-5)
    if where == 0.0:
        assert np.all(t["window_bytes"] == 0) and np.all(waiting == 0)


def test_windows_stall_no_more_than_the_critical_path(runs):
    """Refresh advances with each pass's time, so the two runs' rewrites differ by a few refreshed blocks at
    most; the relocations (reads only) are equal."""
    for routing in ("uniform", "zipf"):
        w, c = _totals(runs[routing, 1.0][1]), _totals(runs[routing, 0.0][1])
        np.testing.assert_array_equal(w["relocated_blocks"], c["relocated_blocks"])
        assert np.all(w["stall_us"] <= c["stall_us"]) and np.all(c["stall_us"] > 0)
        np.testing.assert_allclose(c["stall_us"], np.asarray(runs[routing, 0.0][1].totals.write_stall_us)
                                   - np.asarray(runs["none"][1].totals.write_stall_us), rtol=1e-4)


def test_an_unreached_threshold_changes_no_time(runs):
    a, b = runs["none"][1], runs["unreached"][1]
    assert runs["unreached"][0].config.parts == ("tiers", "reclaim")
    assert np.all(_totals(b)["relocated_blocks"] == 0)
    for field in ("first_token", "finish"):
        np.testing.assert_array_equal(np.asarray(getattr(a, field).us), np.asarray(getattr(b, field).us))


def test_one_compilation_for_a_sweep_of_thresholds():
    fam = systems.families(["dash"], _scenario(threshold_reads=20.0))[0]
    run = jax.jit(lambda k: fam.simulate(0, 0, k, fam.inputs, fam.config).parts["reclaim"].totals.relocated_blocks)
    counts = [float(run(dataclasses.replace(fam.points[0], reclaim=reclaim.ReclaimKnobs.make(threshold_reads=n))))
              for n in (20.0, 40.0, 80.0)]
    assert run._cache_size() == 1
    assert counts[0] > counts[1] > counts[2] > 0
