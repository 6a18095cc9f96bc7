"""The Sarathi batcher (hbfjax.serve.batching): hand-traced schedules, KV admission, the plain-Python
reference on random streams, no recompilation across knobs, bad config refused."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch, clock
from hbfjax.serve import batching, reference
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.validate import ConfigError
from hbfjax.workload import requests as rq
from hbfjax.workload.requests import Requests


def requests_of(arrival_us, prompt, output, size=None) -> Requests:
    """Requests from host lists (sorted arrivals, whole µs), padded to ``size`` by the padding convention."""
    n = len(arrival_us)
    size = size or n
    valid = np.arange(size) < n
    pad = lambda x: jnp.asarray(np.r_[np.asarray(x, np.int64), np.zeros(size - n, np.int64)], jnp.int32)  # noqa: E731
    arrival = clock.where(jnp.asarray(valid), clock.from_us(np.r_[np.asarray(arrival_us, np.int64),
                                                                  np.zeros(size - n, np.int64)]), clock.never((size,)))
    i = jnp.arange(size, dtype=jnp.int32)
    return Requests(arrival=arrival, prompt_tokens=pad(prompt), output_tokens=pad(output), prefix_tokens=jnp.zeros_like(i),
                    session=i, parent=jnp.full_like(i, -1), root_start=arrival, valid=jnp.asarray(valid))


def tokens_pass_us(b, draw=0):
    """A pass: 100 µs plus 10 µs per token (decode tokens and chunk tokens); NumPy or JAX batch."""
    return 100.0 + 10.0 * (b.decode_mask.sum() + (b.chunk_tokens * b.chunk_mask).sum())


def mixed_pass_us(b, draw=0):
    """A pass: 50 µs, 3 µs per chunk token, 7 µs per decode token and 1 µs per 16 tokens of each decode
    context (whole µs); NumPy or JAX batch."""
    return (50.0 + 3.0 * (b.chunk_tokens * b.chunk_mask).sum() + 7.0 * b.decode_mask.sum()
            + ((b.decode_context * b.decode_mask) // 16).sum())


def constant_pass_us(b, draw=0):
    return jnp.float32(100.0) + 0.0 * b.decode_mask.sum()


@functools.partial(jax.jit, static_argnames=("config", "pass_us", "max_iterations"))
def serve(requests, knobs, config, pass_us, max_iterations=10_000):
    return batching.rollout(requests, knobs, config, pass_us, max_iterations)


# The three requests of the hand traces: (arrival µs, prompt, output); 2 slots, chunk 4, budget 6.
THREE = ([0, 0, 150], [6, 3, 2], [3, 2, 1])
SMALL = dict(chunk_tokens=4, token_budget=6)


def _steps(requests, knobs, config, pass_us):
    """Run the JAX schedule/advance by hand: per iteration (start µs, {request: decode ctx},
    {request: chunk tokens}, µs), and the final state."""
    schedule = jax.jit(batching.schedule, static_argnums=3)
    advance = jax.jit(batching.advance)
    state = batching.init(requests.valid.shape[0], config)
    rows, reserved = [], []
    while bool(batching.running(state, requests)) and len(rows) < 50:
        state, b = schedule(state, requests, knobs, config)
        dt = float(batching.iteration_us(b, pass_us, config.mode))
        req = np.asarray(state.slots.request)
        dec = {int(req[i]): int(b.decode_context[i]) for i in np.flatnonzero(np.asarray(b.decode_mask))}
        chk = {int(req[i]): int(b.chunk_tokens[i]) for i in np.flatnonzero(np.asarray(b.chunk_mask))}
        rows.append((float(clock.to_us(state.now)), dec, chk, dt))
        reserved.append({int(r): tuple(np.asarray(state.slots.kv_reserved)[i]) for i, r in enumerate(req) if r >= 0})
        state = advance(state, dt, b)
    return rows, reserved, state


def _check_final(state, first_us, finish_us, tokens):
    np.testing.assert_array_equal(clock.to_us(state.first_token), first_us)
    np.testing.assert_array_equal(clock.to_us(state.finish), finish_us)
    np.testing.assert_array_equal(np.asarray(state.tokens_out), tokens)


def test_three_requests_mixed_by_hand():
    """Hand trace (100 µs + 10 µs/token; chunk 4, budget 6, KV tiers (10, 4)):
    it  start  decode (ctx)     chunks        tokens  µs   events
    1   0      -                r0:4  r1:2    6       160  r0, r1 admitted (r1 cut to the budget 6 − 4)
    2   160    -                r0:2  r1:1    3       130  both prompts done: first tokens at 290
    3   290    r0:7  r1:4       -             2       120  r1 done at 410 (r2 arrived at 150, no slot)
    4   410    r0:8             r2:2          3       130  r2 admitted: first = last token at 540; r0 done
    KV: r0 reserves 9 of tier 0, r1 1 of tier 0 and 4 of tier 1; r2 (3) takes r1's freed 1 + 2."""
    req = requests_of(*THREE)
    config = BatcherConfig(slots=2)
    knobs = BatcherKnobs.make(**SMALL, kv_capacity_tokens=(10, 4))
    rows, reserved, state = _steps(req, knobs, config, tokens_pass_us)
    assert rows == [(0, {}, {0: 4, 1: 2}, 160), (160, {}, {0: 2, 1: 1}, 130), (290, {0: 7, 1: 4}, {}, 120),
                    (410, {0: 8}, {2: 2}, 130)]
    assert reserved[0] == {0: (9, 0), 1: (1, 4)} and reserved[3] == {0: (9, 0), 2: (1, 2)}
    _check_final(state, [290, 290, 540], [540, 410, 540], [3, 2, 1])
    assert np.asarray(state.kv_used_tokens).tolist() == [0, 0] and not bool(state.overflow)
    ref = reference.simulate(*THREE, **SMALL, kv_capacity_tokens=(10, 4), config=config, pass_us=tokens_pass_us)
    assert [(r["start_us"], r["decode"], r["chunks"], r["us"]) for r in ref.log] == [
        (s, sorted(d), c, u) for s, d, c, u in rows]
    assert (ref.first_token_us, ref.finish_us, ref.tokens_out) == ([290, 290, 540], [540, 410, 540], [3, 2, 1])


def test_three_requests_serial_and_alternate_by_hand():
    """Serial: iteration 4 is a decode pass (r0: 110 µs) then a prefill pass (r2's 2 tokens: 120 µs),
    so r0 and r2 end at 410 + 230 = 640; iterations 1–3 have one non-empty pass each (as mixed).
    Alternate: it 1 prefill (160) → 160, it 2 prefill again (no decode yet; 130) → 290, it 3 decode
    r0, r1 (120) → 410 (r1 done), it 4 prefill r2 alone (120) → 530 (r2 done), it 5 decode r0 (110) → 640."""
    req = requests_of(*THREE)
    knobs = BatcherKnobs.make(**SMALL)
    serial = BatcherConfig(slots=2, mode="serial")
    rows, _, state = _steps(req, knobs, serial, tokens_pass_us)
    assert [r[0] for r in rows] == [0, 160, 290, 410] and rows[3][3] == 230
    _check_final(state, [290, 290, 640], [640, 410, 640], [3, 2, 1])
    alternate = BatcherConfig(slots=2, mode="alternate")
    rows, _, state = _steps(req, knobs, alternate, tokens_pass_us)
    assert rows == [(0, {}, {0: 4, 1: 2}, 160), (160, {}, {0: 2, 1: 1}, 130), (290, {0: 7, 1: 4}, {}, 120),
                    (410, {}, {2: 2}, 120), (530, {0: 8}, {}, 110)]
    _check_final(state, [290, 290, 530], [640, 410, 530], [3, 2, 1])


def test_kv_capacity_blocks_the_queue_in_order():
    """KV tiers (9, 4): r0 takes 9 of 13; r1 (5) does not fit and blocks r2 (3, which would) until r0
    ends at 400 (constant 100 µs: prefill 4 + 2 tokens, then 2 decodes). At 400 r1 → (5, 0), r2 → (3, 0),
    both prompts done at 500 (r2 then finished), r1's last token at 600."""
    req = requests_of(*THREE)
    knobs = BatcherKnobs.make(**SMALL, kv_capacity_tokens=(9, 4))
    rows, reserved, state = _steps(req, knobs, BatcherConfig(slots=2), constant_pass_us)
    assert [r[0] for r in rows] == [0, 100, 200, 300, 400, 500]
    assert reserved[3] == {0: (9, 0)} and reserved[4] == {1: (5, 0), 2: (3, 0)}
    _check_final(state, [200, 500, 500], [400, 600, 500], [3, 2, 1])
    # a request that can never fit (2 + 12 > 13) sets the sticky overflow and stops the rollout
    big = requests_of([0, 10], [2, 2], [12, 1])
    out = serve(big, knobs, BatcherConfig(slots=2), constant_pass_us)
    assert bool(out.overflow) and (clock.to_us(out.finish) > 1e15).all()  # never reached
    # the rollout stops after max_iterations iterations with work, requests left: overflow
    cut = serve(requests_of(*THREE), knobs, BatcherConfig(slots=2), constant_pass_us, max_iterations=3)
    assert bool(cut.overflow) and int(cut.iterations) == 3
    assert clock.to_us(cut.finish).tolist()[0] > 1e15 and clock.to_us(cut.first_token).tolist()[0] == 200


def test_idle_gap_jumps_to_the_next_arrival():
    """One request at 1 s: its first (and only) iteration starts at 1 s, not at 0."""
    out = serve(requests_of([1_000_000], [3], [1], size=2), BatcherKnobs.make(**SMALL), BatcherConfig(slots=2),
                constant_pass_us)
    assert clock.to_us(out.finish).tolist()[0] == 1_000_100 and int(out.iterations) == 1


def _reusing(table):
    """A Mechanism admit hook: request r reuses table[r] tokens; its carry counts the admissions."""
    table = jnp.asarray(table, jnp.int32)
    return lambda carry, st, new: (jnp.where(new, table[jnp.maximum(st.slots.request, 0)], 0),
                                   carry + new.sum(dtype=jnp.int32))


def test_an_admit_hook_shortens_prefill_and_gives_back_the_last_reserved_tokens():
    """Tiers (7, 100): r0 (6 + 3) reserves (7, 2), r1 (3 + 2) reserves (0, 5). r0 reuses 4 → keeps its
    first 5 tokens (5, 0); r1 asks 5, clipped to prompt − 1 = 2 → keeps 3, (0, 3). Their chunks start at
    the reused tokens."""
    req = requests_of(*THREE)
    knobs = BatcherKnobs.make(**SMALL, kv_capacity_tokens=(7, 100))
    config = BatcherConfig(slots=2)
    st, b, carry = batching.schedule_with(batching.init(3, config), req, knobs, config, _reusing([4, 5, 0]), jnp.int32(0))
    assert st.slots.request.tolist() == [0, 1] and int(carry) == 2
    assert st.slots.kv_reserved.tolist() == [[5, 0], [0, 3]] and st.kv_used_tokens.tolist() == [5, 3]
    assert st.slots.prefill_left.tolist() == [2, 1] and st.slots.kv_tokens.tolist() == [4, 2]
    assert b.chunk_tokens.tolist() == [2, 1] and b.chunk_prefix.tolist() == [4, 2] and b.chunk_emits.tolist() == [True, True]
    # the rollout (100 µs + 10 µs a token): both prompts done in one iteration (130), two decodes (120) end
    # r1 at 250; r2 (no reuse) is admitted at 250 beside r0's last decode (130): both end at 380
    mech = batching.Mechanism(init=lambda: jnp.int32(0), admit=_reusing([4, 5, 0]),
                              iteration=lambda c, st, b, i: (batching.iteration_us(b, tokens_pass_us, "mixed", i), c))
    out, carry = jax.jit(lambda r: batching.run(r, knobs, config, mech, 100))(req)
    _check_final(out, [130, 130, 380], [380, 250, 380], [3, 2, 1])
    assert int(out.iterations) == 3 and out.kv_used_tokens.tolist() == [0, 0] and int(carry) == 3


def _random_streams(n_streams: int, requests: int, rate: float):
    config = rq.RequestsConfig(requests=requests, prompt_lengths="uniform", output_lengths="uniform")
    knobs = rq.RequestKnobs.make(rate_per_s=rate, prompt=rq.LengthKnobs.make(40, lo=1, hi=40),
                                 output=rq.LengthKnobs.make(6, lo=1, hi=6))
    return batch.run(rq.generate, n_streams, 7, knobs, config)


@pytest.mark.parametrize("mode", ["mixed", "serial", "alternate"])
def test_jax_equals_reference_on_random_streams(mode):
    """Poisson streams of 24 requests (prompts 1–40, outputs 1–6) on 3 slots, chunk 16, budget 20, KV
    tiers (36, 24) (so admission is KV-blocked in ~10 % of iterations): every first-token and finish time, token count and iteration count equal the
    plain-Python reference's, under an iteration time that depends on token counts and context lengths."""
    streams = _random_streams(6, 24, rate=2_000.0)
    config = BatcherConfig(slots=3, mode=mode)
    knob = dict(chunk_tokens=16, token_budget=20, kv_capacity_tokens=(36, 24))
    out = jax.vmap(lambda r: serve(r, BatcherKnobs.make(**knob), config, mixed_pass_us))(streams)
    for s in range(6):
        arr = clock.to_us(clock.Clock(streams.arrival.s[s], streams.arrival.us[s])).astype(np.int64)
        ref = reference.simulate(arr, streams.prompt_tokens[s], streams.output_tokens[s], **knob, config=config,
                                 pass_us=mixed_pass_us)
        assert not ref.overflow and not bool(out.overflow[s])
        np.testing.assert_array_equal(clock.to_us(clock.Clock(out.first_token.s[s], out.first_token.us[s])),
                                      ref.first_token_us)
        np.testing.assert_array_equal(clock.to_us(clock.Clock(out.finish.s[s], out.finish.us[s])), ref.finish_us)
        np.testing.assert_array_equal(out.tokens_out[s], ref.tokens_out)
        assert int(out.iterations[s]) == ref.iterations
        np.testing.assert_array_equal(out.tokens_out[s], streams.output_tokens[s])  # every token came out


def test_an_admit_hook_that_reuses_nothing_changes_nothing():
    """The hook path with reused = 0 on the random KV-blocked streams: the same state as no hook."""
    streams = _random_streams(4, 24, rate=2_000.0)
    config = BatcherConfig(slots=3, mode="mixed")
    knobs = BatcherKnobs.make(chunk_tokens=16, token_budget=20, kv_capacity_tokens=(36, 24))
    plain = batching.stateless(mixed_pass_us, "mixed")
    hooked = plain._replace(admit=lambda c, st, new: (jnp.zeros_like(st.slots.request), c))
    run = jax.jit(jax.vmap(lambda r, m: batching.run(r, knobs, config, m, 1000)[0], in_axes=(0, None)), static_argnums=1)
    a, b = run(streams, plain), run(streams, hooked)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not a.overflow.any() and (a.tokens_out == streams.output_tokens).all()


def test_no_recompilation_when_knobs_change():
    """Chunk size, budget and KV capacities are traced: three knob points, one compilation."""
    req = requests_of(*THREE)
    run = jax.jit(lambda r, k: batching.rollout(r, k, BatcherConfig(slots=2), tokens_pass_us, 100))
    with compilations("lambda") as names:
        outs = [run(req, BatcherKnobs.make(c, b, caps)) for c, b, caps in
                ((4, 6, (10, 4)), (2, 3, (9, 4)), (512, 8192, (1 << 20, 0)))]
        jax.block_until_ready(outs)
    assert len(names) == 1
    assert clock.to_us(outs[0].finish).tolist() == [540, 410, 540]
    assert clock.to_us(outs[1].finish).tolist() != [540, 410, 540]  # the knobs took effect


@pytest.mark.parametrize("make, message", [
    (lambda: BatcherConfig(slots=0), "BatcherConfig.slots = 0"),
    (lambda: BatcherConfig(mode="fcfs"), "BatcherConfig.mode = 'fcfs'"),
    (lambda: BatcherConfig(tiers=0), "BatcherConfig.tiers = 0"),
    (lambda: BatcherKnobs.make(chunk_tokens=0), "BatcherKnobs.chunk_tokens = 0"),
    (lambda: BatcherKnobs.make(chunk_tokens=2.5), "BatcherKnobs.chunk_tokens = 2.5"),
    (lambda: BatcherKnobs.make(token_budget=2**21), "BatcherKnobs.token_budget = 2097152"),
    (lambda: BatcherKnobs.make(kv_capacity_tokens=(10,)), "BatcherKnobs.kv_capacity_tokens = [10]"),
    (lambda: BatcherKnobs.make(kv_capacity_tokens=(-1, 5)), "BatcherKnobs.kv_capacity_tokens[0] = -1"),
    (lambda: BatcherKnobs.make(kv_capacity_tokens=(0, 0)), "BatcherKnobs.kv_capacity_tokens = [0, 0]"),
    (lambda: BatcherKnobs.make(kv_capacity_tokens=(2**30, 1)), "BatcherKnobs.kv_capacity_tokens = [1073741824, 1]"),
])
def test_bad_config_refused(make, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        make()
