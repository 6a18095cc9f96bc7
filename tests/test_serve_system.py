"""A serving run end to end: a fixed batch equals its prefill and decode passes timed by hand, and the
DASH organisations compare on one compilation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _compiles import compilations
from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax import clock
from hbfjax.memory import organisations as orgs
from hbfjax.serve import system
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import requests as rq
from hbfjax.workload import timing

B, PROMPT, OUTPUT, CHUNK = 2, 8, 3, 4
CONFIG = system.ServeConfig(model=GQA, batcher=BatcherConfig(slots=B),
                            requests=rq.RequestsConfig(requests=B, arrivals="batch"), max_pass_tokens=B * CHUNK + B,
                            max_iterations=100)


def _knobs(org):
    return system.ServeKnobs.make(org, timing.GpuKnobs.make("h100-pcie"), BatcherKnobs.make(chunk_tokens=CHUNK),
                                  rq.RequestKnobs.make(batch=B, prompt=rq.LengthKnobs.make(PROMPT),
                                                       output=rq.LengthKnobs.make(OUTPUT)), kv_hbm_fraction=0.5)


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


def test_a_fixed_batch_is_its_prefill_and_decode_passes_timed_by_hand():
    knobs = _knobs(orgs.dash())
    out = jax.jit(system.simulate, static_argnums=4)(jnp.int32(0), jnp.uint32(7), knobs, None, CONFIG)
    words = (jnp.uint32(7), jnp.int32(0))
    us = [float(system.pass_times(words, b, 2 * i, knobs, CONFIG).iteration_us)  # mixed: pass 0 of iteration i
          for i, b in enumerate(_hand_batches())]
    first = np.asarray(clock.to_us(out.first_token))
    finish = np.asarray(clock.to_us(out.finish))
    assert int(out.iterations) == 4 and not bool(out.overflow)
    np.testing.assert_allclose(first, us[0] + us[1], rtol=1e-6)  # both prompts complete in the second pass
    np.testing.assert_allclose(finish, sum(us), rtol=1e-6)
    assert list(np.asarray(out.tokens_out)) == [OUTPUT] * B


def test_organisations_on_one_knob_axis_compile_once_and_equal_separate_runs():
    names = ("dash", "compact-dash", "relay-only", "direct-only")
    stacked = hb.stack_knobs([_knobs(orgs.organisation(n)) for n in names])
    with compilations("simulate") as compiled:
        both = hb.run(system.simulate, 2, 3, stacked, CONFIG, knob_axis=True)
        hb.run(system.simulate, 2, 4, stacked, CONFIG, knob_axis=True)
    assert len(compiled) == 1
    alone = hb.run(system.simulate, 2, 3, _knobs(orgs.relay_only()), CONFIG)
    np.testing.assert_array_equal(np.asarray(both.finish.us)[:, 2], np.asarray(alone.finish.us))
    e2e = np.asarray(both.finish.s, np.float64) + np.asarray(both.finish.us) * 1e-6
    assert np.all(e2e[:, 0] <= e2e[:, 2]) and np.all(e2e[:, 0] <= e2e[:, 3])  # DASH never slower than one path


def test_bad_serve_config_is_refused():
    with pytest.raises(Exception, match="ServeConfig.max_pass_tokens = 0"):
        system.ServeConfig(model=GQA, batcher=BatcherConfig(slots=B), requests=CONFIG.requests, max_pass_tokens=0)
    with pytest.raises(Exception, match="ServeKnobs.kv_hbm_fraction = 1.5"):
        system.ServeKnobs.make(orgs.dash(), timing.GpuKnobs.make(), BatcherKnobs.make(), rq.RequestKnobs.make(),
                               kv_hbm_fraction=1.5)


def test_drawing_distinct_counts_matches_drawing_every_token_in_distribution():
    # same requests, routing drawn two ways: the mean E2E over streams agrees within Z = 4.5 two-sample SEs
    import dataclasses

    e2e = {}
    for draw in ("counts", "tokens"):
        cfg = dataclasses.replace(CONFIG, routing_draw=draw)
        out = hb.run(system.simulate, 256, 11, _knobs(orgs.dash()), cfg)
        e2e[draw] = np.asarray(clock.to_us(out.finish), np.float64).mean(axis=1)
    a, b = e2e["counts"], e2e["tokens"]
    se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    assert se > 0 and abs(a.mean() - b.mean()) < 4.5 * se
    with pytest.raises(Exception, match="routing_draw = 'counts': drawing counts needs uniform routing"):
        dataclasses.replace(CONFIG, routing_kind="zipf")
