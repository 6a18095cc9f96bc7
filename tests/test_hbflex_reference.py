"""The serving engine with HBFlex's parts (``engine.simulate``, ``ServeConfig.parts = parts.HBFLEX``)
equals its plain-Python reference (``hbflex_reference.serve``) on the same draws: every request's
first-token and finish time, the serving totals and the parts' totals (read and ideal waves, write
stalls, GC time, WAF, evicted sessions, hit tokens), for the tiny GQA model on a synthetic multi-turn
trace (12 sessions × 3 turns: turns that arrive while their parent runs share its KV, later ones hit
the retained entry), 4 slots and a KV room of 1,000 tokens, on HBFlex (window writes, balanced reads with offload), naive HBF (immediate writes,
random placement, interleaved blocks), FlashAccel-CLI (decode KV in HBM, the DASH write path,
offload to HBM) and naive-block (immediate block-first writes, on 512-B pages so that a chunk's KV of a
layer is several pages). Eviction at 70 % of the room and GC at 70 % used pages of 4 sampled planes of
32 × 4 pages (16 pages a plane a chunk of 4 iterations; HBFlex's plane groups of 32, each sampled plane
in a random request's session group), so sessions are evicted and GC migrates valid pages.

The reference's sampled planes (Python lists) agree page for page, plane by plane: host and GC
programs, erases per block, valid pages per block and per session, block states, waiting pages.

Tolerances, from float32 rounding (``EPS = 2^-24``; the reference is float64), as in
``tests/test_serve_reference.py`` (whose bound ``ρ`` and slack are derived there) plus what HBFlex adds
to an iteration's float32 sum: one more term (the GC time of the last chunk, ``GC_DEPTH = 6``
roundings: bytes × 1e-3 × (1 / write + 1 / read cut)) and, in every attention term, the read-wave
factor's own roundings (``WAVE_DEPTH = 11``: the table interpolation 5, the wave's µs 2, the bytes' µs 3,
their ratio 1). Sums over passes of non-negative terms (read waves, offloaded bytes, GC time) are plain
float32 sums: relative error ``(n + depth)·EPS`` for n terms of ``depth`` roundings each (the engine
now keeps them with Kahan compensation, within that bound). The ideal waves of a pass interpolate the
two tabulated draws' ideals as the waves are (``wave.draw_ideal``; the reference mirrors it in
float32), so they take the read waves' bound too. Integer counts (passes, hit and shared tokens,
retained bytes, forced writebacks, pages, evictions, diverged tails) are exact.

A closed loop of the same trace (``closed_runs``: 5 tasks × 8 turns on HBFlex, lifetime labels 4 ms
wide so that the labels come from the roots' arrivals the loop issues) is compared the same way:
arrivals, request times, the block store page for page.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax import clock, rng, traces
from hbfjax.flash.reads import wave
from hbfjax.memory import hbf_packages
from hbfjax.salts import Salt
from hbfjax.serve import hbflex_reference as href
from hbfjax.serve import engine, kv_blocks, kv_cache, parts, plane_store
from hbfjax.serve.parts.blocks import BlocksConfig
from hbfjax.serve.parts.reads import read_laws
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import requests as rq
from hbfjax.workload import timing

EPS = 2.0**-24
DEPTH = 16  # tests/test_serve_reference.py
WAVE_DEPTH, GC_DEPTH = 11, 6
CLOCK_US = 2.0**-5
SEED = 5
POLICIES = ("hbflex", "naive-hbf", "fa-cli", "naive-block")
ROOM_TOKENS, SLOTS, CHUNK, SCAN_CHUNK = 1000, 4, 32, 4


def session_trace(sessions: int = 12, turns: int = 3, seed: int = 0) -> traces.Trace:
    """Sessions starting in the first 20 ms, each turn's prompt its parent's whole context plus 20–79
    new tokens (the context its prefix), 4–11 output tokens, the next turn 0.5, 10 or 50 ms later."""
    r = np.random.default_rng(seed)
    rows = []
    for s in range(sessions):
        t, context = r.uniform(0.0, 0.02), 0
        for _ in range(turns):
            new, out = int(r.integers(20, 80)), int(r.integers(4, 12))
            rows.append((t, context + new, out, context, s))
            context += new + out
            t += float(r.choice([0.0005, 0.01, 0.05]))
    rows.sort(key=lambda x: x[0])
    root, last, parent, session = {}, {}, [], []
    for i, (_, _, _, _, s) in enumerate(rows):
        session.append(root.setdefault(s, i))
        parent.append(last.get(s, -1))
        last[s] = i
    a = lambda k: np.asarray([x[k] for x in rows])  # noqa: E731
    return traces.Trace("sessions", a(0) - rows[0][0], a(1), a(2), np.asarray(session), np.asarray(parent), a(3))


@functools.lru_cache(maxsize=None)
def case():
    trace = session_trace()
    n = len(trace)
    config = engine.ServeConfig(model=GQA, batcher=BatcherConfig(slots=SLOTS),
                                requests=rq.RequestsConfig(requests=n, arrivals="trace", replay="offset"),
                                max_pass_tokens=engine.pass_token_bound(SLOTS, CHUNK, 2 * CHUNK),
                                max_iterations=3000, scan_chunk=SCAN_CHUNK, parts=parts.HBFLEX,
                                blocks=BlocksConfig(planes=4, blocks_per_plane=32, pages_per_block=4, n_labels=2,
                                                    plane_writes_per_chunk=16))
    knobs = []
    for name in POLICIES:
        # naive-block on 512-B pages: a chunk's KV of a layer is several pages, which block-first serialises
        pkg = hbf_packages.package(name, **({"page_bytes": 512.0} if name == "naive-block" else {}))
        policy = dataclasses.replace(pkg.policy, evict_threshold=jnp.float32(0.7), gc_trigger=jnp.float32(0.7))
        knobs.append(engine.ServeKnobs.make(
            pkg.org, timing.GpuKnobs.make("h200"), BatcherKnobs.make(chunk_tokens=CHUNK, token_budget=2 * CHUNK),
            rq.RequestKnobs.make(), policy=policy, kv_room_bytes=ROOM_TOKENS * GQA.kv_bytes_per_token))
    inputs = engine.ServeInputs(trace=rq.TraceInputs.from_trace(trace, n), read_laws=read_laws(knobs))
    return config, knobs, inputs


@pytest.fixture(scope="module")
def runs():
    config, knobs, inputs = case()
    out = hb.run(engine.simulate, 1, SEED, hb.stack_knobs(knobs), config, knob_axis=True, inputs=inputs)
    refs = {k: href.serve(0, SEED, kn, config, inputs) for k, kn in enumerate(knobs)}
    return config, knobs, inputs, out, refs


CLOSED_TASKS, CLOSED_TURNS, LABEL_MS = 5, 8, 4.0


@pytest.fixture(scope="module")
def closed_runs():
    config, knobs, inputs = case()
    n = CLOSED_TASKS * CLOSED_TURNS
    config = dataclasses.replace(config, batcher=BatcherConfig(slots=SLOTS, tasks=CLOSED_TASKS),
                                 requests=rq.RequestsConfig(requests=n, arrivals="trace", replay="closed",
                                                            tasks=CLOSED_TASKS))
    pkg = hbf_packages.package("hbflex")
    policy = dataclasses.replace(pkg.policy, evict_threshold=jnp.float32(0.7), gc_trigger=jnp.float32(0.7))
    kn = engine.ServeKnobs.make(pkg.org, timing.GpuKnobs.make("h200"),
                                BatcherKnobs.make(chunk_tokens=CHUNK, token_budget=2 * CHUNK),
                                rq.RequestKnobs.make(think_s=0.002), policy=policy,
                                kv_room_bytes=ROOM_TOKENS * GQA.kv_bytes_per_token, label_interval_s=LABEL_MS * 1e-3)
    inputs = inputs._replace(read_laws=read_laws([kn]))
    out = hb.run(engine.simulate, 1, SEED, hb.stack_knobs([kn]), config, knob_axis=True, inputs=inputs)
    return config, out, href.serve(0, SEED, kn, config, inputs)


@pytest.mark.slow  # 27 worker-seconds (a compilation of its own): make test-slow. make test keeps the closed loop
# against its reference on DASH's engine (tests/test_closed_loop.py) and HBFlex's parts against theirs open-loop (below)
def test_a_closed_loop_equals_the_reference(closed_runs):
    config, out, (res, tot, step) = closed_runs
    assert not res.overflow and not bool(out.overflow[0, 0]) and int(out.iterations[0, 0]) == res.iterations
    slack = DEPTH * EPS * tot.stall_scale_us + res.iterations * CLOCK_US
    rho = _rho(config)
    for name, got in (("arrival_us", out.arrival), ("first_token_us", out.first_token), ("finish_us", out.finish)):
        want = np.asarray(getattr(res, name), np.float64)
        have = clock.to_us(clock.Clock(got.s[0, 0], got.us[0, 0]))
        np.testing.assert_allclose(have, want, rtol=rho, atol=slack, err_msg=name)
    _assert_planes_equal(out.parts["blocks"].final, 0, step, config, "closed")
    # the case holds what it claims: sessions after a task's first, their labels from issued arrivals
    roots = [q for q in range(len(res.finish_us)) if step.session[q] == q]
    later = [q for q in roots if q >= CLOSED_TASKS]
    assert later and len({step.blocks.label[q] for q in roots}) == 2
    assert all(step.blocks.label[q] == int(res.arrival_us[q] // (LABEL_MS * 1e3)) % 2 for q in roots)
    assert step.blocks.erases > 0 and step.cache.hit_tokens > 0


def _at(tree, k):
    """Point ``k`` of stream 0 of a batched output tree."""
    return jax.tree_util.tree_map(lambda a: a[0, k], tree)


def _assert_planes_equal(final, k, step, config, where):
    """Point ``k``'s sampled planes equal the reference's, plane by plane and page for page (each plane
    settled first: the engine settles its lazy invalidations only when GC is due)."""
    st, ref = _at(final, k), step.blocks
    assert np.asarray(st.pending_bytes).tolist() == ref.pending and np.asarray(st.pages_written).tolist() == ref.written
    assert np.asarray(st.position).tolist() == ref.position, where
    pc = config.blocks.store(config.requests.requests).plane
    for j, plane in enumerate(ref.planes):
        got = kv_blocks.settle(jax.tree_util.tree_map(lambda a: a[j], st.planes), pc)
        for name in ("host_pages", "gc_pages", "erases", "invalidated_pages", "diverged_pages", "stalled_writes",
                     "capped_writes"):
            assert int(getattr(got, name)) == getattr(plane, name), f"{name} plane {j} {where}"
        assert np.asarray(got.session_pages).tolist() == plane.session_pages, f"plane {j} {where}"
        assert np.asarray(got.pending_bytes).tolist() == plane.pending, f"plane {j} {where}"
        assert np.asarray(got.blocks.valid).tolist() == plane.valid, f"plane {j} {where}"
        assert np.asarray(got.blocks.status).tolist() == plane.status, f"plane {j} {where}"
        assert np.asarray(got.blocks.erases).tolist() == plane.erase_count, f"plane {j} {where}"
        assert not bool(got.overflow) and not plane.overflow, f"plane {j} {where}"
    assert float(plane_store.waf(st)) == ref.waf(), where


def _hbf(out, k) -> dict:
    """Point ``k`` of stream 0's HBF totals by the reference's names (``hbflex_reference.HBF_FIELDS``):
    the parts' totals, and the engine's GC (chunk stall) time, write stall and passes."""
    got = {}
    for name in ("reads", "sessions", "sram", "writes"):
        got.update({f: float(np.asarray(v)[0, k]) for f, v in out.parts[name].totals._asdict().items()})
    t = out.totals
    for name, v in (("gc_us", t.chunk_stall_us), ("write_stall_us", t.write_stall_us), ("passes", t.passes)):
        got[name] = float(np.asarray(v)[0, k])
    assert set(got) == set(href.HBF_FIELDS)
    return got


def _rho(config):
    terms = config.model.layers * (len(timing.OPS) + 1) + 2  # + LM head + GC time
    return (terms - 1 + DEPTH + WAVE_DEPTH) * EPS


_DRAW = jax.jit(wave.draw)  # the engine's draws, compiled as there (one compilation each, not op by op)
_IDEAL = jax.jit(wave.draw_ideal)


def test_wave_uniforms_and_draws_equal_the_engine():
    _, knobs, inputs = case()
    u = href.WaveUniforms(SEED, 0, block=8)
    for draw in (0, 5, 9, 17):
        want = rng.uniform01(rng.mix(jnp.uint32(SEED), jnp.int32(0), jnp.int32(draw), Salt.WAVE_DRAW))
        assert u(draw) == float(want)
        for kn in knobs:  # every policy's table: random, balanced with offload to SRAM, offload to HBM
            table = href.read_table(kn, inputs)
            host = href.host_table(table)
            for pages in (0.0, 1.0, 3.0, 40.0, 1000.0, 3072.0):
                exact = _DRAW(table, jnp.float32(pages), want)
                assert href.wave_draw(host, pages, u(draw)) == tuple(float(x) for x in exact), (draw, pages)
                ideal = href.wave_ideal(host, pages, u(draw))
                assert ideal == float(_IDEAL(table, jnp.float32(pages), want)), (draw, pages)
                assert ideal <= href.wave_draw(host, pages, u(draw))[0]  # waves >= ideal: amplification >= 1


def test_request_times_equal_the_engine(runs):
    config, _, _, out, refs = runs
    rho = _rho(config)
    for k, (res, tot, step) in refs.items():
        assert not res.overflow and not bool(out.overflow[0, k]), POLICIES[k]
        assert not bool(out.missing_inputs[0, k]), POLICIES[k]
        assert int(out.iterations[0, k]) == res.iterations
        n = len(res.finish_us)
        assert list(np.asarray(out.tokens_out)[0, k][:n]) == res.tokens_out
        slack = DEPTH * EPS * tot.stall_scale_us + res.iterations * CLOCK_US
        for name, got in (("first_token_us", out.first_token), ("finish_us", out.finish)):
            want = np.asarray(getattr(res, name), np.float64)
            have = clock.to_us(clock.Clock(got.s[0, k], got.us[0, k]))[:n]
            np.testing.assert_allclose(have, want, rtol=rho, atol=slack, err_msg=f"{name} {POLICIES[k]}")


def test_serving_totals_equal_the_engine(runs):
    config, _, _, out, refs = runs
    layers, rho = config.model.layers, _rho(config)
    for k, (res, tot, _) in refs.items():
        t = {f: float(np.asarray(getattr(out.totals, f))[0, k]) for f in engine.Totals._fields}
        where = POLICIES[k]
        assert t["passes"] == tot.passes and t["table_miss_passes"] == 0.0, where
        for name in ("prefill_write_bytes", "writeback_bytes", "program_busy_us", "writeback_passes",
                     "max_kv_hbm_bytes", "max_kv_hbf_bytes", "expert_direct_bytes", "expert_relay_bytes"):
            np.testing.assert_allclose(t[name], getattr(tot, name), rtol=(layers + 4) * EPS, err_msg=f"{name} {where}")
        stall_abs = DEPTH * EPS * tot.stall_scale_us
        np.testing.assert_allclose(t["busy_us"], tot.busy_us, rtol=rho + 2 * EPS, atol=stall_abs, err_msg=where)
        np.testing.assert_allclose(t["write_stall_us"], tot.write_stall_us, rtol=(layers + DEPTH + 2) * EPS,
                                   atol=stall_abs, err_msg=where)
        read = tot.hbm_read_bytes + tot.hbf_read_bytes  # a tier with nothing to read rounds at the other's scale
        for name in ("hbm_read_bytes", "hbf_read_bytes"):
            np.testing.assert_allclose(t[name], getattr(tot, name), rtol=0.0,
                                       atol=(layers * len(timing.OPS) + DEPTH + WAVE_DEPTH) * EPS * read,
                                       err_msg=f"{name} {where}")


def test_hbf_totals_and_blocks_equal_the_engine(runs):
    config, _, _, out, refs = runs
    for k, (res, _, step) in refs.items():
        h, where = step.hbf_totals(), POLICIES[k]
        got = _hbf(out, k)
        for name in ("passes", "shared_hit_tokens", "hit_tokens", "retention_write_bytes", "forced_writebacks",
                     "sram_overflow_passes"):
            assert got[name] == h[name], f"{name} {where}"
        n = h["passes"]
        for name in ("read_waves", "ideal_waves", "offloaded_bytes", "sram_peak_bytes"):
            np.testing.assert_allclose(got[name], h[name], rtol=(n + 8) * EPS, err_msg=f"{name} {where}")
        # the ideal waves interpolate each tabulated draw's ideal as the waves do: never above the waves
        assert h["ideal_waves"] <= h["read_waves"] and got["ideal_waves"] <= got["read_waves"], where
        np.testing.assert_allclose(got["write_stall_us"], h["write_stall_us"],
                                   rtol=(n + DEPTH) * EPS, atol=DEPTH * EPS * refs[k][1].stall_scale_us, err_msg=where)
        np.testing.assert_allclose(got["kv_read_stall_us"], h["kv_read_stall_us"], rtol=(n + 8) * EPS,
                                   atol=(WAVE_DEPTH + 2) * EPS * step.read_scale_us, err_msg=where)
        np.testing.assert_allclose(got["gc_us"], h["gc_us"], rtol=(n + GC_DEPTH) * EPS, err_msg=where)
        c = _at(out.parts["sessions"].final, k)
        assert int(c.evicted) == step.cache.evicted, where
        assert int(kv_cache.tally_value(c.hit_tokens)) == step.cache.hit_tokens, where
        assert int(kv_cache.tally_value(c.prompt_tokens)) == step.cache.prompt_tokens, where
        _assert_planes_equal(out.parts["blocks"].final, k, step, config, where)


def test_the_case_exercises_reuse_eviction_gc_and_every_write_path(runs):
    """Guards that the comparison covers what it claims."""
    _, _, _, _, refs = runs
    for k, (_, tot, step) in refs.items():
        h, where = step.hbf_totals(), POLICIES[k]
        assert step.cache.evicted > 0 and step.cache.hit_tokens > 0 and h["shared_hit_tokens"] > 0, where
        assert step.blocks.host_pages > 0 and step.blocks.erases > 0, where
        assert sum(p.host_pages > 0 for p in step.blocks.planes) >= 2, where  # several sampled planes written
        assert (tot.write_stall_us > 0) == (where != "hbflex"), where  # window writes hide in the windows here
    flex, naive, fa = (refs[k][2].hbf_totals() for k in range(3))
    assert refs[1][2].blocks.gc_pages > 0 and naive["gc_us"] > 0  # GC migrated valid pages
    # later turns keep their session's KV up to whole logical pages (16 tokens): the tails past them die on
    # naive's planes (random pages reach every plane; HBFlex's 4 cut sessions lie outside its sampled groups)
    assert all(p.diverged_pages > 0 for p in refs[1][2].blocks.planes)
    assert naive["read_waves"] > 0 and naive["kv_read_stall_us"] > 0  # random placement collides
    assert flex["offloaded_bytes"] > 0 and fa["offloaded_bytes"] > 0
    assert fa["retention_write_bytes"] > 0 and refs[2][1].stall_scale_us > 0  # the DASH write path
    block = refs[3][2].hbf_totals()
    assert block["write_stall_us"] > naive["write_stall_us"]  # block-first serialises programs
    # and reads its pages in runs of a block's 4 pages (a chunk's 32 tokens of a layer are 8 pages of 512 B):
    # the random-page law drawn as runs, so more rounds for the same pages than naive-hbf's (its 4-KiB pages)
    assert refs[3][2].run_pages == 4 and all(refs[k][2].run_pages == 1 for k in range(3))
    assert block["read_waves"] / block["ideal_waves"] > naive["read_waves"] / naive["ideal_waves"]


TP_REQUESTS = 12


@pytest.fixture(scope="module")
def tp_runs():
    """HBFlex (window writes, balanced reads) on one GPU of a two-way tensor-parallel group: the first
    ``TP_REQUESTS`` requests of the session trace, the tiny model's per-GPU sizes and its all-reduces."""
    config, knobs, inputs = case()
    model = GQA.with_tensor_parallel(2)
    config = dataclasses.replace(config, model=model, requests=rq.RequestsConfig(
        requests=TP_REQUESTS, arrivals="trace", replay="offset"))
    kn = dataclasses.replace(knobs[0], kv_room_bytes=jnp.float32(ROOM_TOKENS * model.kv_bytes_per_token))
    inputs = inputs._replace(trace=rq.TraceInputs.from_trace(session_trace(), TP_REQUESTS))
    out = hb.run(engine.simulate, 1, SEED, hb.stack_knobs([kn]), config, knob_axis=True, inputs=inputs)
    return config, out, href.serve(0, SEED, kn, config, inputs)


@pytest.mark.slow  # 40 worker-seconds (a compilation of its own): make test-slow. make test keeps the tensor-parallel
# step against its reference on DASH's engine (tests/test_serve_reference.py, tiny-batch-tp2)
def test_a_tensor_parallel_run_equals_the_reference(tp_runs):
    config, out, (res, tot, step) = tp_runs
    assert not res.overflow and not bool(out.overflow[0, 0]) and int(out.iterations[0, 0]) == res.iterations
    slack = DEPTH * EPS * tot.stall_scale_us + res.iterations * CLOCK_US
    rho = _rho(config) + config.model.layers * EPS  # + each layer's all-reduce term
    for name, got in (("first_token_us", out.first_token), ("finish_us", out.finish)):
        want = np.asarray(getattr(res, name), np.float64)
        have = clock.to_us(clock.Clock(got.s[0, 0], got.us[0, 0]))[:len(want)]
        np.testing.assert_allclose(have, want, rtol=rho, atol=slack, err_msg=name)
    np.testing.assert_allclose(float(out.totals.allreduce_us[0, 0]), tot.allreduce_us, rtol=rho)
    assert tot.allreduce_us > 0 and step.blocks.host_pages > 0
    _assert_planes_equal(out.parts["blocks"].final, 0, step, config, "tensor parallel")
