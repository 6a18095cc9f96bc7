"""Read disturb, read reclaim and refresh (issue 26): a block traced by hand, the closed forms (constant-rate
relocation, refresh alone), renewal-theory rates under Poisson reads, conservation, the NumPy reference step
for step, jit = eager, vmap = loop, no recompilation over knob values, and the `hbfjax disturb` CLI."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch, cli
from hbfjax.flash.disturb import reclaim as rc, reference as ref
from hbfjax.stats import mean_ci95
from hbfjax.validate import ConfigError

WORDS = (jnp.uint32(5), jnp.int32(2))
step = jax.jit(rc.step, static_argnums=4)


def _blocks_of(st, config):
    """{data block: physical block} of a state."""
    return {int(d): i for i, d in enumerate(np.asarray(st.data_of)) if d >= 0}


def test_a_block_traced_by_hand():
    # 1 plane × 3 blocks, one data block of 4 pages in block 0, threshold 5 reads, tR 4 µs, tPROG 75 µs.
    cfg = rc.DisturbConfig(planes=1, blocks_per_plane=3, data_blocks=1, step_s=1.0, steps=4, start="fresh")
    kn = rc.DisturbKnobs.make(cfg, threshold_reads=5, pages_per_block=4, t_read_us=4.0, t_prog_us=75.0)
    st = rc.init_state(WORDS, kn, cfg)
    assert st.data_of.tolist() == [0, -1, -1] and st.valid_pages.tolist() == [4, 0, 0]
    seen = []
    for reads in (3, 4, 2, 1):
        st = step(WORDS, st, jnp.array([reads], jnp.int32), kn, cfg)
        seen.append((st.data_of.tolist(), st.read_count.tolist(), st.erases.tolist(), int(st.relocations)))
    assert seen == [
        ([0, -1, -1], [3, 0, 0], [0, 0, 0], 0),  # 3 reads: below N
        ([-1, 0, -1], [0, 2, 0], [1, 0, 0], 1),  # 7 ≥ 5: into block 1 (fewest erases, lowest index), 2 reads carried
        ([-1, 0, -1], [0, 4, 0], [1, 0, 0], 1),
        ([-1, -1, 0], [0, 0, 0], [1, 1, 0], 2),  # 5 ≥ 5: block 2 (0 erases) beats block 0 (1 erase)
    ]
    assert st.written_step.tolist() == [0, 2, 4] and st.valid_pages.tolist() == [0, 0, 4]
    assert (int(st.relocated_pages), int(st.refresh_pages), int(st.deferred_moves)) == (8, 0, 0)
    assert st.read_pages.tolist() == [8] and st.prog_pages.tolist() == [8]
    assert float(st.rewrite_wall_us) == 2 * (4 * 4.0 + 4 * 75.0)  # one plane: its reads and programs in sequence
    assert float(rc.wide_value(st.reads_hi, st.reads_lo)) == 10


def test_destination_policy_by_hand_and_planes_in_parallel():
    # 2 planes × 2 blocks: data 0 in block 0 (plane 0), data 1 in block 2 (plane 1); blocks 1 and 3 erased,
    # block 1 worn (5 erases). Data 0 reaches N: same-plane takes block 1, least-worn takes block 3.
    cfg = rc.DisturbConfig(planes=2, blocks_per_plane=2, data_blocks=2, step_s=1.0, steps=8, start="fresh")
    reads = jnp.array([6, 0], jnp.int32)
    walls = {}
    for dest, block in (("same-plane", 1), ("least-worn", 3)):
        kn = rc.DisturbKnobs.make(cfg, threshold_reads=5, pages_per_block=4, destination=dest)
        st = rc.init_state(WORDS, kn, cfg)
        st = dataclasses.replace(st, erases=st.erases.at[1].set(5))
        st = step(WORDS, st, reads, kn, cfg)
        assert _blocks_of(st, cfg) == {0: block, 1: 2} and st.read_count[block] == 1
        walls[dest] = float(st.rewrite_wall_us)
        assert st.read_pages.tolist() == [4, 0] and st.prog_pages.tolist() == ([4, 0] if block == 1 else [0, 4])
    assert walls == {"same-plane": 4 * 4.0 + 4 * 75.0, "least-worn": max(4 * 4.0, 4 * 75.0)}


CONST = rc.DisturbConfig(planes=2, blocks_per_plane=8, data_blocks=8, step_s=0.5, steps=400, workload="deterministic",
                         start="fresh")


def test_constant_rate_relocates_every_n_over_r_seconds():
    """8 blocks each read at r pages/s with threshold N from counter 0: ⌊r t / N⌋ relocations each by t,
    erases per block per second r L / (N B), lifetime P/E N B / (r L). One compiled sweep over (N, r, policy)."""
    points = [(50, 10.0, "least-worn"), (64, 16.0, "same-plane"), (100, 7.0, "least-worn"), (30, 4.0, "same-plane")]
    k, t_prog, pe = 16, 75.0, 1e5
    knobs = batch.stack_knobs([rc.DisturbKnobs.make(CONST, threshold_reads=n, pages_per_block=k, destination=dest,
                                                    t_prog_us=t_prog, reads_per_s=r * CONST.data_blocks)
                               for n, r, dest in points])
    out = batch.run(rc.simulate, 2, 0, knobs, CONST, knob_axis=True)
    t, b, n_data = CONST.simulated_s, CONST.physical_blocks, CONST.data_blocks
    for j, (n, r, _) in enumerate(points):
        closed = rc.constant_rate(r, n, t, b, pe, data_blocks=n_data)
        assert closed["period_s"] == n / r
        got = int(out.relocations[0, j])
        assert got == closed["relocations"] == n_data * math.floor(r * t / n)
        assert int(out.erases[0, j]) == got and int(out.deferred_moves[0, j]) == 0
        assert int(out.relocated_pages[0, j]) == got * k
        assert float(out.rewrite_prog_us[0, j]) == pytest.approx(got * k * t_prog, rel=1e-6)
        # erase rate and lifetime: measured over the whole relocation periods in t
        periods = math.floor(r * t / n) * n / r
        assert got / b / periods == pytest.approx(closed["erases_per_block_per_s"], rel=1e-12)
        assert pe / (got / b / periods) == pytest.approx(closed["lifetime_s"], rel=1e-12)
        np.testing.assert_array_equal(out.relocations[0, j], out.relocations[1, j])  # no randomness
    # the timing itself: relocations happen at the end of the steps containing t_k = k N / r
    n, r = 50, 10.0
    kn = rc.DisturbKnobs.make(CONST, threshold_reads=n, pages_per_block=k, reads_per_s=r * n_data)
    st, frac, times = rc.init_state(WORDS, kn, CONST), jnp.zeros(n_data), []
    draw = jax.jit(rc.draw_reads, static_argnums=4)
    for s in range(40):
        reads, frac = draw(WORDS, jnp.int32(s), frac, kn, CONST)
        before = int(st.relocations)
        st = step(WORDS, st, reads, kn, CONST)
        if int(st.relocations) > before:
            times.append(((s + 1) * CONST.step_s, int(st.relocations) - before))
    assert times == [(5.0 * (i + 1), n_data) for i in range(4)]  # every N / r = 5 s, all 8 blocks


RENEWAL = rc.DisturbConfig(planes=4, blocks_per_plane=32, data_blocks=48, step_s=1.0, steps=400)


def _poisson_floor_mean(mean: float, n: int) -> float:
    """E[⌊X / n⌋] for X ~ Poisson(mean): the renewal function of a counter from 0 (sum over the pmf)."""
    x = np.arange(int(mean + 12 * math.sqrt(mean) + 20))
    logp = x * math.log(mean) - mean - np.array([math.lgamma(v + 1.0) for v in x])
    return float(np.sum(np.floor(x / n) * np.exp(logp)))


@pytest.mark.parametrize("start", ["steady", "fresh"])
def test_poisson_reads_relocate_at_the_renewal_rate(start):
    """Poisson reads at λ_d = rate × p_d. Steady start (counters uniform on [0, N)): relocations of a block
    by t have mean λ_d t / N exactly (Hermite's identity), the elementary renewal rate λ_d / N. Fresh start
    (counters 0): mean E⌊X / N⌋, X ~ Poisson(λ_d t), the renewal function (about λ_d t / N − 1/2). The share
    of a block grows with its plane (p ∝ 1 + plane); same-plane keeps each block on its plane, so a plane's
    rewrite reads / K count its blocks' relocations. Tolerance: 3 standard errors across 64 streams (seed 0)."""
    cfg = dataclasses.replace(RENEWAL, start=start)
    n, k, rate, streams = 200, 4, 960.0, 64
    plane = np.arange(cfg.data_blocks) % cfg.planes
    share = (1.0 + plane) / np.sum(1.0 + plane)
    kn = rc.DisturbKnobs.make(cfg, threshold_reads=n, pages_per_block=k, destination="same-plane",
                              reads_per_s=rate, read_share=share)
    out = batch.run(rc.simulate, streams, 0, kn, cfg)
    assert int(out.deferred_moves.sum()) == 0
    t = cfg.simulated_s
    per_plane = np.asarray(out.read_pages) / k  # [streams, planes] relocations of each plane's data
    for p in range(cfg.planes):
        lam = rate * share[plane == p]
        if start == "steady":
            expected = np.sum(lam) * t / n
        else:
            expected = sum(_poisson_floor_mean(x * t, n) for x in lam)
            assert expected == pytest.approx(np.sum(lam * t / n - 0.5), abs=0.02 * len(lam))
        mean, ci = mean_ci95(per_plane[:, p])
        se = np.std(per_plane[:, p], ddof=1) / math.sqrt(streams)
        assert abs(mean - expected) <= 3 * se, (p, mean, expected, ci)
        assert ci < 0.01 * expected  # the test can tell a 1 % bias (a fresh start's is about 3 %)
    if start == "steady":
        total, _ = mean_ci95(out.relocations)
        renewal = rc.renewal_rates(rate, share, n)["relocations_per_s"] * t
        assert renewal == pytest.approx(rate * t / n)
        assert abs(total - renewal) <= 3 * np.std(out.relocations, ddof=1) / math.sqrt(streams)
    np.testing.assert_allclose(out.host_reads.mean(), rate * t, rtol=2e-3)


def test_refresh_alone_rewrites_every_block_once_per_interval():
    """No reads, refresh every T: over m T each data block is rewritten exactly m times (steady: ages spread
    over one interval; fresh: all at once, the pool large enough); erases per block m L / B over m T."""
    m, k = 3, 8
    for cfg in (rc.DisturbConfig(planes=2, blocks_per_plane=16, data_blocks=24, step_s=300.0, steps=36),
                rc.DisturbConfig(planes=1, blocks_per_plane=12, data_blocks=4, step_s=300.0, steps=36, start="fresh")):
        points = [rc.DisturbKnobs.make(cfg, refresh_hours=1.0, pages_per_block=k, destination=d)
                  for d in ("same-plane", "least-worn")]
        ts = float(rc.refresh_steps(points[0], cfg))
        assert ts == 12 and cfg.steps == m * ts
        st0 = rc.init_state(WORDS, points[0], cfg)
        ages = -np.asarray(st0.written_step)[np.asarray(st0.data_of) >= 0]
        assert ages.min() >= 0 and ages.max() < ts  # last programs within one interval before the start
        out = batch.run(rc.simulate, 3, 0, batch.stack_knobs(points), cfg, knob_axis=True)
        assert np.all(out.refreshes == m * cfg.data_blocks) and np.all(out.relocations == 0)
        assert np.all(out.refresh_pages == m * cfg.data_blocks * k) and np.all(out.deferred_moves == 0)
        assert np.all(out.erases == m * cfg.data_blocks)
        erases_per_block_per_interval = out.erases / cfg.physical_blocks / m
        np.testing.assert_allclose(erases_per_block_per_interval, cfg.data_blocks / cfg.physical_blocks)


# a small random case: 3 planes × 5 blocks, 10 data blocks, refresh every 5 steps, some moves deferred
SMALL = rc.DisturbConfig(planes=3, blocks_per_plane=5, data_blocks=10, step_s=720.0, steps=30)


def _small_case(dest: str, seed: int):
    kn = rc.DisturbKnobs.make(SMALL, threshold_reads=40, refresh_hours=1.0, pages_per_block=6, destination=dest,
                              t_read_us=3.0, t_prog_us=100.0, reads_per_s=0.1)
    gen = np.random.default_rng(seed)
    reads = gen.poisson(gen.uniform(0, 20, (SMALL.steps, SMALL.data_blocks))).astype(np.int32)
    return kn, reads


@pytest.mark.parametrize("dest", ["same-plane", "least-worn"])
def test_engine_equals_the_numpy_reference_step_for_step(dest):
    kn, reads = _small_case(dest, seed=len(dest))
    st = rc.init_state(WORDS, kn, SMALL)
    home = [SMALL.home_block(d) for d in range(SMALL.data_blocks)]
    rs = ref.init_state(SMALL, kn, np.asarray(st.read_count)[home], np.asarray(st.written_step)[home])
    for f in ref.FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(st, f)), rs[f], err_msg=f)
    kinds = set()
    for s in range(SMALL.steps):
        st = step(WORDS, st, jnp.asarray(reads[s]), kn, SMALL)
        rs = ref.step(rs, reads[s], kn, SMALL)
        for f in ref.FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(st, f)), rs[f], err_msg=f"step {s}: {f}")
        assert float(st.rewrite_wall_us) == pytest.approx(rs["rewrite_wall_us"], rel=1e-6)
        kinds |= {k for k in ("relocations", "refreshes", "deferred_moves") if rs[k]}
    assert kinds >= {"relocations", "refreshes"}  # the case exercises every path
    assert "deferred_moves" in kinds or dest == "least-worn"  # 2 erased blocks per plane run short
    assert float(rc.wide_value(st.reads_hi, st.reads_lo)) == rs["host_reads"] == reads.sum()


def test_pages_are_conserved_by_every_move():
    kn, reads = _small_case("least-worn", seed=3)
    st = rc.init_state(WORDS, kn, SMALL)
    total = SMALL.data_blocks * 6
    for s in range(SMALL.steps):
        before = {d: int(st.valid_pages[i]) for d, i in _blocks_of(st, SMALL).items()}
        st = step(WORDS, st, jnp.asarray(reads[s]), kn, SMALL)
        after = {d: int(st.valid_pages[i]) for d, i in _blocks_of(st, SMALL).items()}
        assert after == before  # each data block keeps its valid pages, wherever it went
        counts = {k: int(v) for k, v in rc.page_counts(st, SMALL).items()}
        assert counts == {"valid_pages": total, "held_blocks": SMALL.data_blocks,
                          "erased_blocks": SMALL.free_blocks, "each_data_block_once": 1}
    moved = int(st.relocated_pages) + int(st.refresh_pages)
    assert moved == int(st.read_pages.sum()) == int(st.prog_pages.sum()) > 0
    assert int(st.erases.sum()) == int(st.relocations) + int(st.refreshes)
    phys = np.asarray(rc.phys_of(st, SMALL))
    assert [int(st.data_of[i]) for i in phys] == list(range(SMALL.data_blocks))


TINY = rc.DisturbConfig(planes=2, blocks_per_plane=4, data_blocks=5, step_s=600.0, steps=8)
TINY_KNOBS = rc.DisturbKnobs.make(TINY, threshold_reads=30, refresh_hours=0.5, pages_per_block=4,
                                  reads_per_s=0.04, read_share=[0.4, 0.3, 0.1, 0.1, 0.1])


def test_jit_equals_eager():
    seed, sid = jnp.uint32(3), jnp.int32(1)
    jitted = jax.jit(rc.simulate, static_argnums=4)(sid, seed, TINY_KNOBS, None, TINY)
    with jax.disable_jit():
        eager = rc.simulate(sid, seed, TINY_KNOBS, None, TINY)
    assert int(jitted.relocations) > 0 and int(jitted.refreshes) > 0
    for f in jitted._fields:
        np.testing.assert_allclose(np.asarray(getattr(jitted, f)), np.asarray(getattr(eager, f)), rtol=1e-6, err_msg=f)


def test_vmap_equals_a_loop_over_streams_and_knobs_never_recompile():
    out = batch.run(rc.simulate, 4, 11, TINY_KNOBS, TINY)
    one = jax.jit(rc.simulate, static_argnums=4)
    for s in range(4):
        alone = one(jnp.int32(s), jnp.uint32(11), TINY_KNOBS, None, TINY)
        for f in out._fields:
            np.testing.assert_array_equal(np.asarray(getattr(out, f))[s], np.asarray(getattr(alone, f)), err_msg=f)
    assert len({int(r) for r in out.relocations}) > 1  # the streams differ
    other = rc.DisturbKnobs.make(TINY, threshold_reads=17, refresh_hours=0.0, pages_per_block=9,
                                 destination="same-plane", t_read_us=2.0, t_prog_us=50.0, reads_per_s=0.03)
    with compilations("simulate") as compiled:
        again = batch.run(rc.simulate, 4, 12, other, TINY)
        same = batch.run(rc.simulate, 4, 11, TINY_KNOBS, TINY)
    assert compiled == []
    assert int(again.refreshes.sum()) == 0 and not np.array_equal(again.relocations, out.relocations)
    for f in out._fields:
        np.testing.assert_array_equal(np.asarray(getattr(out, f)), np.asarray(getattr(same, f)))


def test_rewrite_time_is_differentiable_in_tprog_and_tr():
    def times(t_read, t_prog):
        kn = dataclasses.replace(TINY_KNOBS, t_read_us=t_read, t_prog_us=t_prog)
        o = rc.simulate(jnp.int32(0), jnp.uint32(3), kn, None, TINY)
        return o.rewrite_prog_us + o.rewrite_read_us, o

    (d_read, d_prog), o = jax.jit(jax.grad(times, argnums=(0, 1), has_aux=True))(jnp.float32(4.0), jnp.float32(75.0))
    assert float(d_prog) == int(o.prog_pages.sum()) > 0 and float(d_read) == int(o.read_pages.sum())


def test_bad_config_and_knobs_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"DisturbConfig.data_blocks = 8: must be <= planes × \(blocks_per_plane"):
        rc.DisturbConfig(planes=2, blocks_per_plane=4, data_blocks=8, step_s=1.0, steps=1)
    with pytest.raises(ConfigError, match="DisturbConfig.planes = 2.5: must be an integer"):
        rc.DisturbConfig(planes=2.5, blocks_per_plane=4, data_blocks=2, step_s=1.0, steps=1)
    with pytest.raises(ConfigError, match="DisturbKnobs.threshold_reads = 0: must be in"):
        rc.DisturbKnobs.make(TINY, threshold_reads=0)
    with pytest.raises(ConfigError, match="DisturbKnobs.refresh_hours = 0.1: must be 0 \\(off\\) or at least one step"):
        rc.DisturbKnobs.make(TINY, refresh_hours=0.1)
    with pytest.raises(ConfigError, match="DisturbKnobs.destination = 'nearest': must be one of"):
        rc.DisturbKnobs.make(TINY, destination="nearest")
    with pytest.raises(ConfigError, match="read_share"):
        rc.DisturbKnobs.make(TINY, read_share=[1.0, 2.0])


# --- the CLI -----------------------------------------------------------------------------------------------

SMALL_CLI = ["disturb", "--planes", "2", "--blocks", "32", "--free-blocks-per-plane", "4", "--pages-per-block", "8",
             "--read-disturb-reads", "1000", "--reads-per-s", "2000", "--hours", "1", "--streams", "4", "--json"]


def _json(capsys, argv):
    rc_ = cli.main(argv)
    captured = capsys.readouterr()
    assert rc_ == 0, captured.err
    return json.loads(captured.out)


def test_cli_reports_rates_shares_and_lifetime_against_the_closed_forms(capsys):
    out = _json(capsys, SMALL_CLI + ["--constant-rate", "--start", "fresh", "--step-s", "1",
                                     "--free-blocks-per-plane", "12"])
    # 8 data blocks at 2000 / 8 = 250 reads/s each, N = 1000: each relocated every 4 s, 900 times in 3600 s
    assert out["data_blocks"] == 8 and out["steps"] == 3600 and out["deferred_moves"] == 0
    assert out["relocations_per_hour"] == 8 * 900 == out["renewal_relocations_per_hour"]
    per_year = out["relocations_per_hour"] * 24 * 365.25 / 32
    assert out["lifetime_years"] == pytest.approx(1e5 / per_year, rel=1e-9)
    assert out["relocation_program_share"] == pytest.approx(out["relocations_per_hour"] * 8 * 75.0 / (2 * 3600e6))
    assert out["lifetime_unbounded"] is False and "lifetime_note" not in out

    out = _json(capsys, SMALL_CLI + ["--read-skew", "hotcold", "--refresh-hours", "0.25", "--reads-per-s", "200"])
    assert out["relocations_per_hour"] == pytest.approx(out["renewal_relocations_per_hour"], rel=0.05)
    assert out["refreshes_per_hour"] == pytest.approx(out["renewal_refreshes_per_hour"], rel=0.1)
    assert out["refreshes_per_hour"] > 0 and out["worst_block_lifetime_years"] < out["lifetime_years"]
    for key in ("erases_per_block_per_day", "ci95_erases_per_block_per_day", "refresh_program_share",
                "busiest_plane_rewrite_share", "ci95_lifetime_years", "rewrite_pages_per_s"):
        assert key in out, key

    out = _json(capsys, SMALL_CLI + ["--reads-per-s", "0", "--host-write-pages-per-s", "10"])
    assert out["lifetime_unbounded"] is True and out["lifetime_years"] is None and "no block was erased" in \
        out["lifetime_note"] and out["erases_per_block_per_day"] == 0 and out["waf"] == 1.0


@pytest.mark.parametrize("argv,says", [
    (["--blocks", "33"], "--blocks = 33: must be a multiple of --planes = 2"),
    (["--read-disturb-reads", "0"], "--read-disturb-reads = 0: must be in [1, 1073741824]"),
    (["--hot-fraction", "0.2"], "--hot-fraction = 0.2: has no effect with --read-skew uniform"),
    (["--free-blocks-per-plane", "16"], "--free-blocks-per-plane = 16: must be < --blocks / --planes = 16"),
    (["--refresh-hours", "nan"], "--refresh-hours = nan: must be finite"),
    (["--step-s", "1000", "--refresh-hours", "0.1"], "must be 0 (off) or at least one step"),
])
def test_cli_bad_options_are_one_line_and_exit_2(capsys, argv, says):
    assert cli.main(SMALL_CLI + argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and says in lines[0] and "Traceback" not in captured.err, lines
