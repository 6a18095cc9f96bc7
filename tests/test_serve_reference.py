"""The serving engine equals its plain-Python reference (``hbfjax.serve.reference.serve``) on the same
draws: every request's first-token and finish time and the run's totals, for a tiny MoE model (fixed
batch, serial passes) and Qwen3-235B-A22B (Poisson arrivals, mixed passes), with KV writeback forced by
a small HBM KV budget, on DASH, RelayOnly and DirectOnly (writeback through the GPU), and the tiny model on
one GPU of a two-way tensor-parallel group (its all-reduces a term more per layer).

Tolerances, from float32 rounding (unit roundoff ``EPS = 2^-24``; the reference is float64):

* a pass time is a float32 sum of ``n = L·(len(OPS) + 1) + 1`` non-negative terms (each operator of
  each layer, each layer's stall, the LM head), each computed in at most ``DEPTH = 16`` roundings, so
  its relative error is at most ``(n − 1 + DEPTH)·EPS`` (recursive summation bound, any order);
  an iteration adds its passes. A layer's stall ``max(write − window, 0)`` cancels: its error is
  bounded absolutely by ``DEPTH·EPS·(write + window)``, summed by the reference (``stall_scale_us``).
* the clock adds each iteration's float32 µs to a (whole s, float32 µs < 1e6) pair: one rounding of
  at most half the float32 spacing below 2^20, ``2^-5`` µs, per iteration.

So a time ``t`` reached after ``N`` iterations is within ``ρ·t + DEPTH·EPS·stall_scale + N·2^-5`` µs,
``ρ = passes·(n − 1 + DEPTH)·EPS``. Totals are Kahan sums (``2·EPS`` of the total beyond each term's own
error); integer-valued ones (bytes, programs × tPROG) are float32 products of integers, exact to one
rounding.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax import clock
from hbfjax.memory import organisations as orgs
from hbfjax.serve import engine, layer_time, reference
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import models, routing, timing
from hbfjax.workload import requests as rq

EPS = 2.0**-24
DEPTH = 16
CLOCK_US = 2.0**-5
SEED = 5
ORGS = ("dash", "relay-only", "direct-only")
QWEN3 = models.preset("qwen3-235b-a22b")


def _case(model, arrivals, n, slots, chunk, budget_tokens, mode, prompt, output, rate=1.0, **org_changes):
    config = engine.ServeConfig(model=model, batcher=BatcherConfig(slots=slots, mode=mode),
                                requests=rq.RequestsConfig(requests=n, arrivals=arrivals),
                                max_pass_tokens=slots * chunk + slots, max_iterations=2000, scan_chunk=16)
    req = rq.RequestKnobs.make(rate_per_s=rate, batch=n, prompt=rq.LengthKnobs.make(prompt),
                               output=rq.LengthKnobs.make(output))
    knobs = [engine.ServeKnobs.make(orgs.organisation(name, **org_changes), timing.GpuKnobs.make("h100-pcie"),
                                    BatcherKnobs.make(chunk_tokens=chunk, token_budget=2 * chunk), req,
                                    hbm_kv_budget_bytes=budget_tokens * model.kv_bytes_per_token) for name in ORGS]
    return config, knobs


CASES = {
    # 3 requests of 40 + 6 tokens at t = 0 in 16-token chunks, a decode pass then a prefill pass per
    # iteration; a 4-token HBM budget and 16 KiB page waves (units of 32 tokens): every decode pass
    # past the budget writes back; 300 µs programs stall
    "tiny-batch-serial": (1, lambda: _case(GQA, "batch", 3, 3, 16, 4, "serial", 40, 6, t_prog_us=300.0,
                                           parallel_units=2)),
    # 8 requests of 300 + 12 tokens at 20 /s through 4 slots, 128-token chunks; a 20-token budget
    # (writeback units of 43 tokens: partial, oldest first)
    "qwen3-poisson-mixed": (2, lambda: _case(QWEN3, "poisson", 8, 4, 128, 20, "mixed", 300, 12, rate=20.0)),
    # the tiny batch under the other readings of DASH (issue 24): arrays per path, tR = 32 µs a latency only
    # (the arrays at their 3 µs rate), a layer's writes overlapping the windows of 3 layers
    "tiny-batch-readings": (1, lambda: _case(GQA, "batch", 3, 3, 16, 4, "serial", 40, 6, t_prog_us=300.0,
                                             parallel_units=2, shared_array_rate=0.0, tr_sets_rate=0.0,
                                             t_read_us=32.0, write_window_layers=3)),
    # the tiny batch on one GPU of a two-way tensor-parallel group (each GPU 2 heads, 1 KV head, half of each
    # FFN): its sizes and the two all-reduces a layer, mirrored by the reference
    "tiny-batch-tp2": (1, lambda: _case(GQA.with_tensor_parallel(2), "batch", 3, 3, 16, 4, "serial", 40, 6,
                                        t_prog_us=300.0, parallel_units=2)),
}


def test_reference_names_the_engine_operators_and_windows():
    assert reference._OP_NAMES == timing.OPS
    assert set(reference._WINDOW_OPS) == set(layer_time.WRITE_WINDOW_OPS)


def test_count_draws_equal_the_routing_draws():
    config, _ = CASES["qwen3-poisson-mixed"][1]()
    draws = reference.CountDraws(config, SEED, 1, block=8)
    layers = jnp.asarray([i for i, k in enumerate(QWEN3.layer_kinds) if k == "moe"], jnp.int32)
    for draw, tokens in ((0, 1), (3, 4), (9, 130), (17, 516)):
        want = routing.distinct_count_draws((jnp.uint32(SEED), jnp.int32(1)), draw, layers, tokens, config.routing)
        assert draws(draw, tokens) == np.asarray(want).tolist()


@pytest.fixture(scope="module", params=sorted(CASES))
def runs(request):
    streams, make = CASES[request.param]
    config, knobs = make()
    out = hb.run(engine.simulate, streams, SEED, hb.stack_knobs(knobs), config, knob_axis=True)
    refs = {(s, k): reference.serve(s, SEED, kn, config) for s in range(streams) for k, kn in enumerate(knobs)}
    return config, out, refs


def _rho(config, layers):
    passes = 2 if config.batcher.mode == "serial" else 1
    per_layer = len(timing.OPS) + 1 + (config.model.tensor_parallel > 1)  # + the layer's all-reduces
    return passes * (layers * per_layer + 1 - 1 + DEPTH) * EPS


def test_request_times_equal_the_reference(runs):
    config, out, refs = runs
    rho = _rho(config, config.model.layers)
    for (s, k), (res, tot, _) in refs.items():
        assert not res.overflow and not bool(out.overflow[s, k])
        assert int(out.iterations[s, k]) == res.iterations
        n = len(res.finish_us)
        assert list(out.tokens_out[s, k][:n]) == res.tokens_out
        slack = DEPTH * EPS * tot.stall_scale_us + res.iterations * CLOCK_US
        for name, got in (("first_token_us", out.first_token), ("finish_us", out.finish)):
            want = np.asarray(getattr(res, name), np.float64)
            have = clock.to_us(clock.Clock(got.s[s, k], got.us[s, k]))[:n]
            np.testing.assert_allclose(have, want, rtol=rho, atol=slack, err_msg=f"{name} stream {s} {ORGS[k]}")


def test_totals_equal_the_reference(runs):
    config, out, refs = runs
    layers = config.model.layers
    rho = _rho(config, layers)
    for (s, k), (res, tot, _) in refs.items():
        t = {f: float(np.asarray(getattr(out.totals, f))[s, k]) for f in engine.Totals._fields}
        where = f"stream {s} {ORGS[k]}"
        assert t["passes"] == tot.passes and t["chunk_stall_us"] == 0.0 and t["table_miss_passes"] == 0.0, where
        for name in ("prefill_write_bytes", "writeback_bytes", "program_busy_us", "writeback_passes",
                     "max_kv_hbm_bytes", "max_kv_hbf_bytes"):
            np.testing.assert_allclose(t[name], getattr(tot, name), rtol=4 * EPS, err_msg=f"{name} {where}")
        stall_abs = DEPTH * EPS * tot.stall_scale_us
        np.testing.assert_allclose(t["busy_us"], tot.busy_us, rtol=rho + 2 * EPS, atol=stall_abs, err_msg=where)
        np.testing.assert_allclose(t["write_stall_us"], tot.write_stall_us, rtol=(layers + DEPTH + 2) * EPS,
                                   atol=stall_abs, err_msg=where)
        for name in ("hbm_read_bytes", "hbf_read_bytes"):
            np.testing.assert_allclose(t[name], getattr(tot, name), rtol=(layers * len(timing.OPS) + DEPTH) * EPS,
                                       err_msg=f"{name} {where}")
        np.testing.assert_allclose(t["allreduce_us"], tot.allreduce_us, rtol=rho + 2 * EPS, err_msg=where)
        experts = tot.expert_direct_bytes + tot.expert_relay_bytes  # Σ needed experts × bytes
        np.testing.assert_allclose(t["expert_direct_bytes"] + t["expert_relay_bytes"], experts,
                                   rtol=(layers + 4) * EPS, err_msg=where)
        tol = (layers + 4) * EPS * experts
        assert tot.expert_direct_bytes - tol <= t["expert_direct_bytes"] <= tot.expert_direct_max_bytes + tol, where
        for name, peak in (("kv_hbm_byte_us", tot.max_kv_hbm_bytes), ("kv_hbf_byte_us", tot.max_kv_hbf_bytes)):
            np.testing.assert_allclose(t[name], getattr(tot, name), rtol=rho + 4 * EPS,
                                       atol=peak * stall_abs, err_msg=f"{name} {where}")


def test_the_cases_exercise_writeback_stalls_and_both_paths(runs):
    """Guards that the comparison covers what it claims: writeback, exposed stalls, Relay on DASH and
    RelayOnly, Direct on DirectOnly (writeback through the GPU)."""
    config, _, refs = runs
    for (s, k), (_, tot, _) in refs.items():
        assert tot.writeback_bytes > 0 and tot.write_stall_us > 0 and tot.prefill_write_bytes > 0
        assert (tot.allreduce_us > 0) == (config.model.tensor_parallel > 1)
        if ORGS[k] == "relay-only":
            assert tot.expert_direct_max_bytes == 0 and tot.expert_relay_bytes > 0
        if ORGS[k] == "direct-only":
            assert tot.expert_relay_bytes == 0 and tot.expert_direct_bytes > 0
