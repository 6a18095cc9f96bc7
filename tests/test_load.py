"""Offered load (hbfjax.sweep.load): the backlogged throughput of a constant-pass-time server by hand,
the same for a served dense model against one fixed batch, Poisson rates that scale with the load."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import single_gemm
from hbfjax import batch, clock
from hbfjax.memory import organisations as orgs
from hbfjax.serve import batching, engine
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.sweep import load
from hbfjax.validate import ConfigError
from hbfjax.workload import requests as rq
from hbfjax.workload import timing

Z = 4.5  # two-sided false-alarm rate ≈ 7e-6 per check

SLOTS, R, PROMPT, OUTPUT, CHUNK, PASS_US = 4, 24, 1000, 5, 512, 100.0


def _constant_pass_us(b, draw=0):
    return jnp.float32(PASS_US) + 0.0 * b.decode_mask.sum()


@functools.partial(jax.jit, static_argnames=("config",))
def _backlogged_finish(knobs, config):
    reqs = rq.generate(jnp.int32(0), jnp.uint32(0), knobs,
                       None, rq.RequestsConfig(requests=R, arrivals="batch"))
    st = batching.rollout(reqs, BatcherKnobs.make(chunk_tokens=CHUNK), config, _constant_pass_us, 1000)
    return st.finish, st.overflow


@pytest.mark.parametrize("warmup, measured", [(0, 8), (2, 8), (4, 16), (1, 20)])
def test_backlogged_rate_of_a_constant_pass_time_is_slots_per_request_cycle(warmup, measured):
    """All 24 requests at t = 0, 4 slots, 1,000-token prompts in 512-token chunks (two prefill
    iterations, the first token at the end of the second), 5 output tokens (4 more decode iterations):
    a group of 4 completes every 2 + 4 = 6 iterations of 100 µs: 4 / 600 µs over any window of whole
    groups (W and W + M at the same place in a group)."""
    knobs = rq.RequestKnobs.make(batch=R, prompt=rq.LengthKnobs.make(PROMPT), output=rq.LengthKnobs.make(OUTPUT))
    finish, overflow = _backlogged_finish(knobs, BatcherConfig(slots=SLOTS))
    assert not bool(overflow)
    finish_us = np.asarray(clock.to_us(finish))
    np.testing.assert_array_equal(np.sort(finish_us), np.repeat(np.arange(1, R // SLOTS + 1) * 600.0, SLOTS))
    rate = load.completion_rate_per_s(np.asarray(clock.to_seconds(finish))[None], warmup, measured)
    np.testing.assert_allclose(rate, [SLOTS / 600e-6], rtol=1e-9)


def test_unfinished_window_has_rate_zero_and_bad_window_is_refused():
    f = np.array([[1.0, 2.0, np.inf], [1.0, 2.0, 3.0]])
    np.testing.assert_allclose(load.completion_rate_per_s(f, 1, 2), [0.0, 2 / 2.0])
    with pytest.raises(ConfigError, match="completion_rate_per_s.measured = 3"):
        load.completion_rate_per_s(f, 1, 3)


DENSE = single_gemm(256)


def _dense(requests: int, max_iterations: int = 1000):
    config = engine.ServeConfig(model=DENSE, batcher=BatcherConfig(slots=SLOTS),
                                requests=rq.RequestsConfig(requests=requests, arrivals="poisson"),
                                max_pass_tokens=SLOTS * CHUNK + SLOTS, max_iterations=max_iterations)
    knobs = engine.ServeKnobs.make(orgs.relay_only(), timing.GpuKnobs.make("h100-pcie"),
                                   BatcherKnobs.make(chunk_tokens=CHUNK),
                                   rq.RequestKnobs.make(rate_per_s=3.0, prompt=rq.LengthKnobs.make(PROMPT),
                                                        output=rq.LengthKnobs.make(OUTPUT)))
    return config, knobs


def test_backlogged_rate_of_a_served_dense_model_is_one_fixed_batch_per_cycle():
    """A dense model's passes are deterministic and a backlog of 24 is served in 6 identical groups of
    4, so the backlogged rate is 4 / (the finish time of one fixed batch of 4, simulated apart)."""
    config, knobs = _dense(R)
    mean, ci = load.backlogged_rate_per_s(knobs, config, streams=2, seed=3, warmup=4, measured=16)
    fixed = engine.ServeConfig(model=DENSE, batcher=config.batcher, requests=rq.RequestsConfig(requests=SLOTS,
                               arrivals="batch"), max_pass_tokens=config.max_pass_tokens)
    one = batch.run(engine.simulate, 1, 3, load.backlogged_knobs(knobs, fixed), fixed)
    t_batch_s = float(np.max(clock.to_seconds(one.finish)))
    np.testing.assert_allclose(mean, SLOTS / t_batch_s, rtol=1e-5)
    assert ci < 1e-6 * mean  # every stream the same


def test_backlogged_run_that_runs_out_of_iterations_is_refused():
    config, knobs = _dense(R, max_iterations=10)
    with pytest.raises(ConfigError, match="backlogged_rate_per_s.overflow = True"):
        load.backlogged_rate_per_s(knobs, config, streams=1, seed=0, warmup=0, measured=4)


@pytest.mark.parametrize("x", [0.5, 0.75, 0.9])
def test_poisson_rate_at_a_load_is_that_fraction_of_the_reference(x):
    """Arrivals generated at rate_for_load(x, 2.4 /s): their mean gap is 1 / (2.4 x) within Z standard
    errors (exponential gaps: SE = mean / sqrt(n))."""
    rate = load.rate_for_load(x, 2.4)
    assert rate == pytest.approx(2.4 * x, rel=1e-12)
    cfg = rq.RequestsConfig(requests=256, arrivals="poisson")
    out = batch.run(rq.generate, 64, 11, rq.RequestKnobs.make(rate_per_s=rate), cfg)
    t = np.asarray(clock.to_seconds(out.arrival), np.float64)
    gaps = np.diff(np.concatenate([np.zeros((t.shape[0], 1)), t], axis=1), axis=1).ravel()
    expected = 1.0 / (2.4 * x)
    assert abs(gaps.mean() - expected) < Z * expected / np.sqrt(gaps.size)


@pytest.mark.parametrize("bad", [0.0, -0.5, 11.0, float("nan")])
def test_bad_load_is_refused(bad):
    with pytest.raises(ConfigError, match="rate_for_load.load"):
        load.rate_for_load(bad, 1.0)
