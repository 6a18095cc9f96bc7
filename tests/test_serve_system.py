"""A serving run end to end: a fixed batch equals its prefill and decode passes timed by hand, and the
DASH organisations compare on one compilation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _compiles import compilations
from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax import clock, rng
from hbfjax.memory import organisations as orgs
from hbfjax.serve import engine, layer_time
from hbfjax.serve.pass_routing import pass_routing
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import requests as rq
from hbfjax.workload import timing

B, PROMPT, OUTPUT, CHUNK = 2, 8, 3, 4
CONFIG = engine.ServeConfig(model=GQA, batcher=BatcherConfig(slots=B),
                            requests=rq.RequestsConfig(requests=B, arrivals="batch"), max_pass_tokens=B * CHUNK + B,
                            max_iterations=100)


# one compilation each for the whole module: the one-stream rollout, and the hand timings' per-pass functions
# (called eagerly they compiled some 230 primitives one by one)
_SIMULATE = jax.jit(engine.simulate, static_argnums=4)
_PASS_TIMES = jax.jit(engine.pass_times, static_argnums=4)
_KV_WRITES = jax.jit(layer_time.kv_writes, static_argnums=4)


def _knobs(org, **changes):
    return engine.ServeKnobs.make(org, timing.GpuKnobs.make("h100-pcie"), BatcherKnobs.make(chunk_tokens=CHUNK),
                                  rq.RequestKnobs.make(batch=B, prompt=rq.LengthKnobs.make(PROMPT),
                                                       output=rq.LengthKnobs.make(OUTPUT)), **changes)


def _hand_batches():
    """The passes of a fixed batch of 2 × (8 prompt, 3 output) with 4-token chunks, written out: two
    prefill iterations (chunks at prefix 0, then 4, the second completing the prompt and emitting the
    first token), then OUTPUT − 1 = 2 decode iterations attending to 9 and 10 tokens (itself included)."""
    two = np.ones(B, bool)
    none = np.zeros(B, bool)
    prefill = [timing.Batch(jnp.zeros(B, jnp.int32), jnp.asarray(none), jnp.full(B, CHUNK, jnp.int32),
                            jnp.full(B, p, jnp.int32), jnp.asarray(two), jnp.asarray(np.full(B, p + CHUNK == PROMPT)))
               for p in (0, CHUNK)]
    decode = [timing.Batch(jnp.full(B, c, jnp.int32), jnp.asarray(two), jnp.zeros(B, jnp.int32), jnp.zeros(B, jnp.int32),
                           jnp.asarray(none), jnp.asarray(none)) for c in (PROMPT + 1, PROMPT + 2)]
    return prefill + decode


# DASH's KV, pass by pass (kv_tiers): both prompts' KV goes straight to HBF (2 × 4 tokens per prefill
# pass); the first decode pass reads 8 HBF tokens per request (HBM share 0) and appends one token each in
# HBM; the second reads 9, of which 1 in HBM (share 1/9). Shares are (decode attention, chunk attention).
HAND_KV = [((0.0, 0.0), B * CHUNK), ((0.0, 0.0), B * CHUNK), ((0.0, 0.0), 0), ((1 / 9, 0.0), 0)]


def _hand_pass_us(knobs, batches, writeback_tokens=(0, 0, 0, 0)):
    words = (jnp.uint32(7), jnp.int32(0))
    us = []
    for i, (b, (share, to_hbf), back) in enumerate(zip(batches, HAND_KV, writeback_tokens)):
        t = _PASS_TIMES(words, b, 2 * i, knobs, CONFIG, share)  # mixed: pass 0 of iteration i
        stall = _KV_WRITES(t, to_hbf, back, knobs.org, GQA).stall_us.sum()
        us.append(float(t.iteration_us + stall))
    return us


def test_a_fixed_batch_is_its_prefill_and_decode_passes_timed_by_hand():
    knobs = _knobs(orgs.dash(t_prog_us=2000.0))  # a slow program, so the prefill writes stall
    out = _SIMULATE(jnp.int32(0), jnp.uint32(7), knobs, None, CONFIG)
    us = _hand_pass_us(knobs, _hand_batches())
    first = np.asarray(clock.to_us(out.first_token))
    finish = np.asarray(clock.to_us(out.finish))
    assert int(out.iterations) == 4 and not bool(out.overflow)
    np.testing.assert_allclose(first, us[0] + us[1], rtol=1e-6)  # both prompts complete in the second pass
    np.testing.assert_allclose(finish, sum(us), rtol=1e-6)
    assert list(np.asarray(out.tokens_out)) == [OUTPUT] * B
    per_token = GQA.kv_bytes_per_token
    t = out.totals
    np.testing.assert_allclose(float(t.busy_us), sum(us), rtol=1e-6)
    assert float(t.prefill_write_bytes) == 2 * B * CHUNK * per_token and float(t.writeback_bytes) == 0.0
    assert float(t.write_stall_us) > 0  # 2 ms programs exceed the tiny model's windows
    # two prefill passes × L layers × one (partial) page wave each, at 2 ms
    np.testing.assert_allclose(float(t.program_busy_us), 2 * GQA.layers * 2000.0, rtol=1e-6)
    assert float(t.max_kv_hbm_bytes) == 2 * B * per_token and float(t.max_kv_hbf_bytes) == B * PROMPT * per_token


def test_decode_kv_beyond_the_hbm_budget_is_written_back_oldest_first():
    # a one-token budget: each decode pass appends 2 tokens in HBM (2 > 1), and one writeback unit (a page
    # wave holds far more of the tiny model's tokens than exist) moves all of them to HBF
    per_token = GQA.kv_bytes_per_token
    knobs = _knobs(orgs.dash(), hbm_kv_budget_bytes=per_token)
    out = _SIMULATE(jnp.int32(0), jnp.uint32(7), knobs, None, CONFIG)
    t = out.totals
    assert float(t.writeback_bytes) == 2 * B * per_token and float(t.writeback_passes) == 2
    assert float(t.max_kv_hbm_bytes) == 0.0
    # the second decode pass then reads all of its KV from HBF, as the first did
    hand = list(HAND_KV)
    HAND_KV[3] = ((0.0, 0.0), 0)
    try:
        us = _hand_pass_us(knobs, _hand_batches(), writeback_tokens=(0, 0, B, B))
    finally:
        HAND_KV[:] = hand
    np.testing.assert_allclose(np.asarray(clock.to_us(out.finish)), sum(us), rtol=1e-6)


def test_organisations_on_one_knob_axis_compile_once_and_equal_separate_runs():
    names = ("dash", "compact-dash", "relay-only", "direct-only")
    stacked = hb.stack_knobs([_knobs(orgs.organisation(n)) for n in names])
    other = hb.stack_knobs([_knobs(orgs.organisation(n, t_read_us=7.0, t_prog_us=400.0), hbm_kv_budget_bytes=1e6)
                            for n in names])  # other knob values, same shapes
    with compilations("simulate") as compiled:
        both = hb.run(engine.simulate, 2, 3, stacked, CONFIG, knob_axis=True)
        hb.run(engine.simulate, 2, 4, other, CONFIG, knob_axis=True)
    assert len(compiled) == 1
    # RelayOnly alone, stream by stream (the one-stream rollout of the tests above: no vmap at all)
    alone = [_SIMULATE(jnp.int32(s), rng.seed_word(3), _knobs(orgs.relay_only()), None, CONFIG) for s in range(2)]
    np.testing.assert_array_equal(np.asarray(both.finish.us)[:, 2], np.stack([np.asarray(o.finish.us) for o in alone]))
    e2e = np.asarray(both.finish.s, np.float64) + np.asarray(both.finish.us) * 1e-6
    assert np.all(e2e[:, 0] <= e2e[:, 2]) and np.all(e2e[:, 0] <= e2e[:, 3])  # DASH never slower than one path


def test_bad_serve_config_is_refused():
    with pytest.raises(Exception, match="ServeConfig.max_pass_tokens = 0"):
        engine.ServeConfig(model=GQA, batcher=BatcherConfig(slots=B), requests=CONFIG.requests, max_pass_tokens=0)
    with pytest.raises(Exception, match="ServeKnobs.hbm_kv_budget_bytes = -1"):
        engine.ServeKnobs.make(orgs.dash(), timing.GpuKnobs.make(), BatcherKnobs.make(), rq.RequestKnobs.make(),
                               hbm_kv_budget_bytes=-1)


@pytest.mark.slow  # a statistical or eager-mode check of 20-40 worker-seconds: make test-slow
def test_drawing_distinct_counts_matches_drawing_every_token_in_distribution():
    # same requests, routing drawn two ways: the mean E2E over streams agrees within Z = 4.5 two-sample SEs
    import dataclasses

    e2e = {}
    for draw in ("counts", "tokens"):
        cfg = dataclasses.replace(CONFIG, routing_draw=draw)
        out = hb.run(engine.simulate, 128, 11, _knobs(orgs.dash()), cfg)
        e2e[draw] = np.asarray(clock.to_us(out.finish), np.float64).mean(axis=1)
    a, b = e2e["counts"], e2e["tokens"]
    se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    assert se > 0 and abs(a.mean() - b.mean()) < 4.5 * se
    with pytest.raises(Exception, match="routing_draw = 'counts': drawing counts needs uniform routing"):
        dataclasses.replace(CONFIG, routing_kind="zipf")


@jax.jit
def _table_iteration_us(words, b, draw, knobs, curves):
    """One pass's iteration time on the measured table (``timing.model_times`` of the pass's routing rows)."""
    rows = pass_routing(words, b, draw, knobs.routing, CONFIG, compact=False).rows
    return timing.model_times(b, rows, knobs.gpu, CONFIG.timing, curves).iteration_us


def test_a_measured_table_sets_each_operator_where_it_is_slower_than_delivery():
    # every GQA operator measured 1,000× slower than the synthetic table's base: the delivery never binds, so
    # each pass is the table's own model time (the same batches through timing.model_times), and the long
    # windows hide every write
    from test_profile_table import _gqa_table

    knobs = _knobs(orgs.dash())
    curves = _gqa_table(scale=1000.0).curves()
    out = _SIMULATE(jnp.int32(0), jnp.uint32(7), knobs, engine.ServeInputs(table=curves), CONFIG)
    words = (jnp.uint32(7), jnp.int32(0))
    expect = sum(float(_table_iteration_us(words, b, 2 * i, knobs, curves)) for i, b in enumerate(_hand_batches()))
    np.testing.assert_allclose(np.asarray(clock.to_us(out.finish)), expect, rtol=1e-6)
    assert float(out.totals.write_stall_us) == 0.0 and float(out.totals.table_miss_passes) == 0.0
    # decode attention measured only up to 2 context tokens: both decode passes fall outside the table
    short = _gqa_table(scale=1000.0, contexts=(1, 2)).curves()
    out = _SIMULATE(jnp.int32(0), jnp.uint32(7), knobs, engine.ServeInputs(table=short), CONFIG)
    assert float(out.totals.table_miss_passes) == 2.0


@pytest.mark.slow  # 6 worker-seconds: make test-slow; make test keeps HBFlex's six organisations sharing one trace's
# arrivals (tests/test_hbflex_system.py), the same arrival code
def test_organisations_replaying_one_trace_see_the_same_arrivals_and_lengths(tmp_path):
    from hbfjax import traces

    rows = [f"2023-11-16 18:17:{3 + i:02d}.5000000,{40 + 7 * i},{2 + i % 3}" for i in range(10)]
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    trace = rq.TraceInputs.from_trace(traces.load_trace(path), 10)
    cfg = engine.ServeConfig(model=GQA, batcher=BatcherConfig(slots=4), requests=rq.RequestsConfig(10, arrivals="trace"),
                             max_pass_tokens=4 * CHUNK + 4, max_iterations=1000)
    points = [engine.ServeKnobs.make(orgs.organisation(n), timing.GpuKnobs.make("h100-pcie"),
                                     BatcherKnobs.make(chunk_tokens=CHUNK), rq.RequestKnobs.make())
              for n in ("dash", "relay-only")]
    out = hb.run(engine.simulate, 3, 5, hb.stack_knobs(points), cfg, inputs=trace, knob_axis=True)
    arrival = np.asarray(clock.to_us(out.arrival))
    np.testing.assert_array_equal(arrival[:, 0], arrival[:, 1])  # common random numbers: the same replay phase
    assert not np.array_equal(arrival[0, 0], arrival[1, 0])  # streams start the trace at different phases
    np.testing.assert_array_equal(np.asarray(out.tokens_out)[:, 0], np.asarray(out.tokens_out)[:, 1])
    assert not np.any(np.asarray(out.overflow))
