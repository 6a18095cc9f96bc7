"""Program/read interference (HBFlex §3.2, §5.3; DASH §V-B, §VI-F): hand-traced timelines, queueing
theory, policy ordering, the DASH write-latency sweep, and transform invariants.

Monte Carlo tolerances: each check compares a mean over streams with its exact value and allows
2 × the 95 % CI half-width of that mean (≈ 4 standard errors: a false failure has probability
≈ 6e-5 per check), plus any stated deterministic bias bound. Seeds are fixed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch, stats
from hbfjax.flash.programs import backlog as bl
from hbfjax.serve import write_scenarios as sc
from hbfjax.flash.programs import writeback as wb
from hbfjax.flash.programs.interference import program_pages, read_wait_us
from hbfjax.flash.programs.timeline import apply_prefetch, make_timeline, window_after
from hbfjax.flash.programs.reference import reference_plan, reference_rollout
from hbfjax.serve.write_scenarios import standard_timeline


def run_one(timeline, policy, iterations=1, seed=0, **flash):
    """One stream, jitted: the summary dict as floats."""
    knobs = wb.WritebackKnobs(timeline, wb.FlashKnobs.make(**{"prefetch": 0.0, **flash}), wb.WorkloadKnobs.make(1))
    cfg = sc.config_for(knobs, policy, iterations)
    out = batch.run(wb.simulate, 1, seed, knobs, cfg)
    return type(out)(*(float(v[0]) for v in out))  # stream 0 of each field


def two_slot_timeline(gap_us, read_slot, kv_bytes=4096.0):
    """KV produced after 10 µs of compute, then ``gap_us`` of compute, then a 4 µs read of one slot."""
    mask = np.zeros((1, 3, 2), bool)
    mask[0, 2, read_slot] = True
    return make_timeline([[10.0, gap_us, 4.0]], [[False, False, True]], [[True, False, False]], kv_bytes, 2,
                         touch_fraction=[[0, 0, 0]], touch_mask=mask)


# --- hand-traced timelines (DESIGN.md §8 rung 1) ---------------------------------------------

def test_program_on_the_read_plane_stalls_for_its_remaining_time():
    # immediate: one page programmed on slot 0 at t = 10; the read of slot 0 at t = 10 + 20 waits 75 − 20
    out = run_one(two_slot_timeline(20.0, read_slot=0), "immediate", t_prog_us=75.0)
    assert out.stall_us_per_iteration == pytest.approx(55.0)
    assert out.iteration_us == pytest.approx(10 + 20 + 55 + 4)
    assert out.program_busy_us_per_iteration == pytest.approx(75.0)
    assert out.pages_programmed_per_iteration == 1


def test_program_on_another_plane_does_not_stall():
    out = run_one(two_slot_timeline(20.0, read_slot=1), "immediate", t_prog_us=75.0)
    assert out.stall_us_per_iteration == 0.0
    assert out.iteration_us == pytest.approx(34.0)


def test_programs_queued_on_one_plane_add_up():
    busy, cursor, busy_us, rounds = program_pages(jnp.zeros(2), jnp.int32(0), jnp.float32(3), jnp.float32(5.0),
                                                  jnp.float32(75.0), jnp.float32(1.0))
    # 3 pages round-robin over 2 slots: slot 0 gets 2 (two rounds), slot 1 one
    np.testing.assert_allclose(busy, [5 + 150, 5 + 75])
    assert int(cursor) == 1 and float(busy_us) == 150.0 and int(rounds) == 2
    assert float(read_wait_us(busy, jnp.array([True, False]), jnp.float32(100.0))) == pytest.approx(55.0)
    assert float(read_wait_us(busy, jnp.array([False, False]), jnp.float32(0.0))) == 0.0


def test_a_window_as_long_as_a_program_hides_it():
    # window: KV waits in SRAM; the compute after it opens no window (it follows compute, not a read), so
    # with a window-opening segment of ≥ tPROG before the read the program is hidden
    mask = np.zeros((1, 4, 1), bool)
    tl = make_timeline([[10.0, 4.0, 80.0, 4.0]], [[False, True, False, True]], [[True, False, False, False]],
                       4096.0, 1, touch_fraction=[[0, 1, 0, 1]], touch_mask=mask)
    out = run_one(tl, "window", iterations=3, t_prog_us=75.0, stripe_pages=1.0)
    assert out.stall_us_per_iteration == 0.0
    assert out.pages_programmed_per_iteration == 1  # one page per iteration, drained in its own window
    short = make_timeline([[10.0, 4.0, 70.0, 4.0]], [[False, True, False, True]], [[True, False, False, False]],
                          4096.0, 1, touch_fraction=[[0, 1, 0, 1]], touch_mask=mask)
    held = run_one(short, "window", iterations=3, t_prog_us=75.0, stripe_pages=1.0)
    assert held.stall_us_per_iteration == 0.0 and held.pages_programmed_per_iteration == 0
    assert held.buffer_peak_bytes == pytest.approx(3 * 4096)
    # a 2-page SRAM budget overflows at the third page: forced writeback, the next read waits a full tPROG
    forced = run_one(short, "window", iterations=3, t_prog_us=75.0, stripe_pages=1.0, buffer_capacity_pages=2.0)
    assert forced.forced_writebacks == 1
    assert forced.stall_us_total == pytest.approx(75.0)


def test_stripe_programs_once_per_full_stripe():
    # one page per iteration, stripes of 4: a program (and a 75 − 20 µs stall) every fourth iteration
    out = run_one(two_slot_timeline(20.0, read_slot=0), "stripe", iterations=8, t_prog_us=75.0, stripe_pages=4.0)
    assert out.pages_programmed_per_iteration == pytest.approx(1.0)
    assert out.program_rounds_per_iteration == pytest.approx(2 * 2 / 8)  # two stripes of two rounds
    # stripes go to slots 0,1 (round-robin of 4 pages over 2 slots: two rounds each); the read waits 150 − 20
    assert out.stall_us_total == pytest.approx(2 * (150 - 20))


def test_prefetch_merges_compute_into_one_window():
    tl = standard_timeline(2, 100.0, 4, attn_weight_read_us=5, qkv_us=10, kv_read_us=7, attention_us=20,
                           expert_weight_read_us=9, ffn_us=30)
    gd, _, start = window_after(tl)
    assert float(gd[3]) == 20.0 and float(gd[5]) == 30.0  # attention and FFN split by the expert weight read
    pf = apply_prefetch(tl, jnp.float32(1.0))
    gd, _, start = window_after(pf)
    assert float(gd[3]) == 50.0 and bool(start[3]) and not bool(start[5])
    np.testing.assert_allclose(pf.duration_us.sum(), tl.duration_us.sum())  # no read time is lost
    assert float(pf.duration_us[0, 0]) == 14.0  # both weight reads at the layer's first read


# --- queueing theory (rung 2) ------------------------------------------------------------------

def test_exact_stationary_backlog_matches_closed_form_for_unit_windows():
    # w = 1 is the discrete M/D/1 queue: E[B] = λ² / (2 (1 − λ))
    for lam in (0.3, 0.5, 0.8):
        assert bl.exact_stationary(lam, 1)["mean_backlog_pages"] == pytest.approx(lam**2 / (2 * (1 - lam)), rel=1e-8)


@pytest.mark.parametrize("lam,w", [(0.5, 1), (2.0, 3), (7.0, 8), (30.0, 36)])
def test_synthetic_backlog_matches_exact_stationary_mean(lam, w):
    exact = bl.exact_stationary(lam, w)
    # burn-in of 1000 ≫ relaxation time at ρ ≤ 0.875 (backlog mean ≤ 2.3 pages): bias far below the CI
    cfg = bl.BacklogConfig(iterations=4000, warmup_iterations=1000, max_arrivals=bl.poisson_table_size(lam))
    out = batch.run(bl.simulate, 256, 7, bl.BacklogKnobs.make(lam, w), cfg)
    m, ci = stats.mean_ci95(out.mean_backlog_pages)
    p, pci = stats.mean_ci95(out.p_backlog_positive)
    assert abs(m - exact["mean_backlog_pages"]) < 2 * ci
    assert abs(p - exact["p_backlog_positive"]) < 2 * pci


def test_poisson_draws_have_poisson_mean_and_variance():
    cdf = bl.poisson_cdf(jnp.float32(6.5), bl.poisson_table_size(6.5))
    u = (jnp.arange(200_000, dtype=jnp.float32) + 0.5) / 200_000  # stratified: exact moments up to 1/n
    n = np.asarray(bl.poisson_from_uniform(u, cdf), np.float64)
    assert n.mean() == pytest.approx(6.5, abs=1e-3) and n.var() == pytest.approx(6.5, abs=2e-2)


def test_reads_at_random_phase_wait_rho_tprog_over_two():
    """Residual life: a plane programs tPROG out of every Tc µs (ρ = tPROG / Tc); a read landing at a
    uniformly random phase (the Poisson-arrivals-see-time-averages view) waits ρ·tPROG/2 on average.

    Each layer: KV (one page, immediate policy) at t = 0, then compute Tc·U, the read, compute Tc·(1−U)
    (anti-correlated phase jitter keeps the layer at Tc of compute). Programs never overlap (Tc ≥ tPROG),
    so the formula is exact; ρ counts stall-free time (the stall itself is the read's wait)."""
    t_prog, tc, layers = 75.0, 300.0, 16
    tl = make_timeline(np.tile([[0.0, tc / 2, 0.0, tc / 2]], (layers, 1)), np.tile([[0, 0, 1, 0]], (layers, 1)),
                       np.tile([[1, 0, 0, 0]], (layers, 1)), 4096.0, 1, touch_fraction=np.tile([[0, 0, 1, 0]], (layers, 1)),
                       phase_jitter=np.tile([[0, 1, 0, -1]], (layers, 1)))
    knobs = wb.WritebackKnobs(tl, wb.FlashKnobs.make(t_prog_us=t_prog, prefetch=0.0), wb.WorkloadKnobs.make(1))
    cfg = sc.config_for(knobs, "immediate", 50)
    out = batch.run(wb.simulate, 256, 3, knobs, cfg)
    per_read = out.stall_us_per_iteration / layers
    m, ci = stats.mean_ci95(per_read)
    rho = t_prog / tc
    assert abs(m - rho * t_prog / 2) < 2 * ci
    assert ci < 0.02 * rho * t_prog / 2  # the check is sharp: ±2 % at 95 %


# --- policy ordering and the window (rung 4 settings, reduced) --------------------------------

def small_hbflex(layers=8, **kw):
    return sc.hbflex_knobs(layers=layers, **kw)


def test_policies_order_immediate_stripe_window_on_identical_random_numbers():
    knobs = small_hbflex(layers=4, decode_requests=64, prefill_prob=0.3)
    res = {p: batch.run(wb.simulate, 64, 11, knobs, sc.config_for(knobs, p, 16)) for p in
           ("immediate", "stripe", "window")}
    s = {p: r.stall_us_per_iteration for p, r in res.items()}
    assert np.all(s["immediate"] >= s["stripe"]) and np.all(s["stripe"] >= s["window"])
    assert s["immediate"].mean() > 5 * s["stripe"].mean() > 0
    assert np.all(s["window"] == 0.0)
    # same KV, same random numbers: stripe and window program the same pages, only the timing differs
    np.testing.assert_allclose(res["stripe"].pages_programmed_per_iteration.mean(),
                               res["window"].pages_programmed_per_iteration.mean(), rtol=0.05)


def test_window_stall_is_zero_while_windows_suffice_and_grows_once_sram_overflows():
    # 32 requests: decode windows (≈46 µs) are shorter than tPROG, so only prefill iterations drain
    knobs = small_hbflex(decode_requests=32, prefill_prob=0.1)
    page = 4096.0
    sram_pages = [1e6, 64.0, 32.0]  # ample; a few iterations of KV; one stripe
    points = [dataclasses.replace(knobs, flash=dataclasses.replace(knobs.flash, buffer_capacity_pages=jnp.float32(p)))
              for p in sram_pages]
    cfg = sc.config_for(knobs, "window", 40, 5)
    out = batch.run(wb.simulate, 64, 5, batch.stack_knobs(points), cfg, knob_axis=True)
    stall = out.stall_us_per_iteration.mean(axis=0)
    forced = out.forced_writebacks.mean(axis=0)
    assert stall[0] == 0.0 and forced[0] == 0.0
    assert 0 < stall[1] < stall[2] and 0 < forced[1] < forced[2]
    # the buffer never exceeds its budget by more than one layer's KV
    layer_kv = 32 * float(knobs.timeline.kv_bytes_per_token[0]) + 512 * float(knobs.timeline.kv_bytes_per_token[0])
    assert np.all(out.buffer_peak_bytes[:, 2] <= 32 * page + layer_kv)


def test_dash_writeback_hidden_up_to_500us_and_exposed_at_5ms():
    """DASH §VI-F: program-busy time grows with tPROG; the exposed stall stays zero through 500 µs and
    appears at 5 ms (the wave's programs outlast attention)."""
    knobs = sc.dash_knobs()
    t_progs = [100.0, 500.0, 5000.0]
    points = [dataclasses.replace(knobs, flash=dataclasses.replace(knobs.flash, t_prog_us=jnp.float32(t)))
              for t in t_progs]
    cfg = sc.config_for(knobs, "dash-hbm", 100)  # 48 pages a token: the first wave at iteration 86
    out = batch.run(wb.simulate, 1, 0, batch.stack_knobs(points), cfg, knob_axis=True)
    busy, stall = out.program_busy_us_total[0], out.stall_us_total[0]
    np.testing.assert_allclose(busy, t_progs)  # one wave, one round on every plane
    assert stall[0] == 0.0 and stall[1] == 0.0 and stall[2] > 4000.0
    assert out.forced_writebacks[0].tolist() == [1, 1, 1]


# --- transform invariants and configuration (rung 3) --------------------------------------------

def _eager_case():
    knobs = small_hbflex(decode_requests=16, prefill_prob=0.5)
    knobs = dataclasses.replace(knobs, timeline=make_timeline(
        np.asarray(knobs.timeline.duration_us[:1]), np.asarray(knobs.timeline.is_read[:1]),
        np.asarray(knobs.timeline.kv_point[:1]), 82.0, 96, touch_fraction=np.full((1, 6), 0.5)))
    cfg = sc.config_for(knobs, "stripe", 3)
    fn = batch.compiled(wb.simulate)
    return knobs, cfg, fn, fn(jnp.arange(3, dtype=jnp.int32), jnp.uint32(9), knobs, None, cfg)


@pytest.mark.slow  # an eager-mode check (op by op): make test-slow (CI's 10-minute make test)
def test_jit_equals_eager():
    knobs, cfg, _, jitted = _eager_case()
    for s in (2,):  # eager runs op by op: one stream suffices
        with jax.disable_jit():
            eager = wb.simulate(jnp.int32(s), jnp.uint32(9), knobs, None, cfg)
        for k in eager._fields:
            np.testing.assert_allclose(np.asarray(getattr(jitted, k))[s], np.asarray(getattr(eager, k)),
                                       rtol=1e-5, atol=1e-3)


def test_knob_changes_do_not_recompile():
    knobs, cfg, fn, _ = _eager_case()
    other = dataclasses.replace(knobs, flash=dataclasses.replace(knobs.flash, t_prog_us=jnp.float32(200.0)))
    with compilations("simulate") as compiled:
        fn(jnp.arange(3, dtype=jnp.int32), jnp.uint32(1), other, None, cfg)
    assert compiled == []


def test_bad_configuration_names_field_value_and_rule():
    with pytest.raises(ValueError, match="policy = 'eager'"):
        wb.WritebackConfig("eager", 1, 1, 1, 1)
    with pytest.raises(ValueError, match="warmup_iterations = 5"):
        wb.WritebackConfig("window", 1, 1, 1, 5, 5)
    with pytest.raises(ValueError, match="kv_point"):
        make_timeline([[1.0, 2.0]], [[False, False]], [[True, True]], 1.0, 1)
    with pytest.raises(ValueError, match="touch_fraction"):
        make_timeline([[1.0]], [[False]], [[True]], 1.0, 1, touch_fraction=[[1.5]])
    with pytest.raises(ValueError, match="needs 0 <= λ < window_pages"):
        bl.exact_stationary(3.0, 3)




def test_compiled_rollout_equals_the_sequential_numpy_reference():
    """vmap/scan = loop: the plain NumPy reference rollout gives the same stall and busy time as the batched,
    compiled streams, for each HBFlex policy (window with a small SRAM, so forced writebacks occur).
    Same configs as the ordering test, so nothing recompiles."""
    knobs = small_hbflex(layers=4, decode_requests=32, prefill_prob=0.2, sram_kv_bytes=24 * 4096.0)
    plan = reference_plan(knobs)
    for policy in ("immediate", "stripe", "window"):
        cfg = sc.config_for(knobs, policy, 16)
        out = batch.run(wb.simulate, 64, 4, knobs, cfg)  # 64 streams: the ordering test's compiled shape
        for stream in range(2):
            dec, pre = wb.iteration_inputs((jnp.uint32(4), jnp.int32(stream)), knobs, cfg)
            ref = reference_rollout(plan, policy, np.asarray(dec), np.asarray(pre))
            assert out.stall_us_total[stream] == pytest.approx(ref["stall_us"].sum(), abs=1e-2)
            assert out.program_busy_us_total[stream] == pytest.approx(ref["program_busy_us"].sum(), abs=1e-2)
        if policy == "window":
            assert out.forced_writebacks.sum() > 0 and out.stall_us_total.sum() > 0


def test_swebench_replay_drives_the_rollout_end_to_end(real_trace):  # skips, naming the fetch command, without it
    """Rung 5: per-iteration decode requests and prefill tokens from a SWE-bench replay (the interface a
    serving engine uses) run through the rollout: window-aware hides every program with ample SRAM,
    immediate exposes one tPROG per layer in every iteration that produces KV."""
    from hbfjax.traces import load_trace
    from hbfjax.workload.replay import session_replay

    trace = session_replay(load_trace(real_trace("swebench_miniswe_agent.csv")), 64, 1, 0, iterations=120,
                           warmup=0, iteration_s=0.03, chunk_tokens=512)
    dec, pre = jnp.asarray(trace["decode_requests"][0]), jnp.asarray(trace["prefill_tokens"][0])
    assert float(dec.sum()) > 0 and float(pre.sum()) > 0
    knobs = small_hbflex(layers=4, decode_requests=64, prefill_prob=0.3)
    roll = jax.jit(wb.rollout, static_argnums=4)
    words = (jnp.uint32(0), jnp.int32(0))
    _, window = roll(words, dec, pre, knobs, sc.config_for(knobs, "window", 120))
    _, immediate = roll(words, dec, pre, knobs, sc.config_for(knobs, "immediate", 120))
    assert float(window.stall_us.sum()) == 0.0
    produces = np.asarray((dec + pre) > 0)
    np.testing.assert_allclose(np.asarray(immediate.stall_us)[produces], 4 * 75.0, atol=1e-3)  # float32 clock
    assert float(immediate.stall_us[~produces].sum()) == 0.0
