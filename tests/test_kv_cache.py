"""Retained KV by session (hbfjax.serve.kv_cache, HBFlex §5.4): hand-traced reuse, retention and LRU
eviction of three sessions; exact tallies; a batcher run where a second turn reuses its first's KV."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import clock
from hbfjax.serve import batching, kv_cache
from hbfjax.serve.kv_cache import tally_value
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload.requests import Requests


def requests_of(arrival_us, prompt, output, prefix, session) -> Requests:
    """Requests from host lists (sorted whole-µs arrivals), all valid; parent = previous turn."""
    n = len(arrival_us)
    arrival = clock.from_us(np.asarray(arrival_us, np.int64))
    a = lambda x: jnp.asarray(np.asarray(x, np.int64), jnp.int32)  # noqa: E731
    parent = [max((j for j in range(i) if session[j] == session[i]), default=-1) for i in range(n)]
    return Requests(arrival=arrival, prompt_tokens=a(prompt), output_tokens=a(output), prefix_tokens=a(prefix),
                    session=a(session), parent=a(parent), root_start=clock.take(arrival, a(session)),
                    valid=jnp.ones(n, bool))


# Six requests, three sessions (roots 0, 1, 2); 3 and 5 are later turns of session 0, 4 of session 1.
SIX = requests_of([0, 1, 2, 3, 4, 5], prompt=[10, 10, 10, 80, 40, 90], output=[5, 5, 5, 5, 5, 5],
                  prefix=[0, 0, 0, 50, 30, 90], session=[0, 1, 2, 0, 1, 0])


def cache_with(*calls) -> kv_cache.SessionCache:
    """A cache of six sessions filled by :func:`kv_cache.retain` calls, each ``(time_s, {session: tokens})``."""
    c = kv_cache.init(6)
    for time_s, entries in calls:
        c = retain(c, jnp.asarray(list(entries), jnp.int32), jnp.ones(len(entries), bool),
                   jnp.asarray(list(entries.values()), jnp.int32), clock.from_us(time_s * 10**6))
    return c


take = jax.jit(kv_cache.take)
retain = jax.jit(kv_cache.retain)
evict = jax.jit(kv_cache.evict)


def test_a_hit_reuses_min_of_prefix_held_and_prompt_minus_one_and_consumes_the_entry():
    # session 0 holds 60, session 1 holds 20, session 2 holds 100 (request 5 is put in session 2 here)
    six = dataclasses.replace(SIX, session=jnp.asarray([0, 1, 2, 0, 1, 2], jnp.int32))
    c = cache_with((1, {0: 60, 1: 20, 2: 100}))
    reused, held, c = take(c, jnp.asarray([3, 4, 5, -1], jnp.int32), jnp.asarray([True, True, True, False]), six)
    # 3: min(50, 60, 79) = 50 (10 freed); 4: min(30, 20, 39) = 20; 5: min(90, 100, 89) = 89 (11 freed)
    assert reused.tolist() == [50, 20, 89, 0]
    assert held.tolist() == [60, 20, 100, 0]  # the entries each took: their tails past reused die
    assert c.tokens.tolist() == [0] * 6  # each entry handed to its request
    assert tally_value(c.hit_tokens) == 159 and tally_value(c.prompt_tokens) == 210
    assert tally_value(c.freed_tokens) == 21 and int(c.evicted) == 0
    assert int(kv_cache.running_kv_tokens(jnp.asarray([3, 4, 5, -1], jnp.int32), six)) == 85 + 45 + 95


def test_two_new_turns_of_one_session_only_the_earliest_gets_the_hit():
    c = cache_with((1, {0: 60, 1: 20, 2: 100}))
    # request 5 sits in an earlier slot than request 3; both are session 0; slot 2 holds 4 but is not new
    reused, held, c = take(c, jnp.asarray([5, 3, 4], jnp.int32), jnp.asarray([True, True, False]), SIX)
    assert reused.tolist() == [0, 50, 0]  # request 3 arrived first: min(50, 60, 79)
    assert held.tolist() == [0, 60, 0]
    assert c.tokens.tolist() == [0, 20, 100, 0, 0, 0]  # session 1's entry untouched: its slot is not new
    assert tally_value(c.hit_tokens) == 50 and tally_value(c.prompt_tokens) == 170
    assert tally_value(c.freed_tokens) == 10


def test_an_empty_entry_gives_no_hit():
    reused, held, c = take(kv_cache.init(6), jnp.asarray([3, 4], jnp.int32), jnp.asarray([True, True]), SIX)
    assert reused.tolist() == [0, 0] and held.tolist() == [0, 0] and tally_value(c.freed_tokens) == 0 and tally_value(c.prompt_tokens) == 120


def test_retain_makes_the_whole_kv_the_sessions_entry_and_frees_what_it_replaces():
    c = cache_with((1, {1: 20}), (3, {0: 60}))
    now = clock.from_us(5_000_000)
    # slot 0: session 2 ends with 70 tokens; slots 1, 2: two turns of session 1 end with 30 and 40; slot 3 idle
    c = retain(c, jnp.asarray([2, 1, 1, 0], jnp.int32), jnp.asarray([True, True, True, False]),
               jnp.asarray([70, 30, 40, 999], jnp.int32), now)
    assert c.tokens.tolist() == [60, 40, 70, 0, 0, 0]
    assert clock.to_us(c.last_use)[:3].tolist() == [3e6, 5e6, 5e6] and np.all(np.asarray(c.last_use.s)[3:] == 2**31 - 1)
    assert tally_value(c.freed_tokens) == 30 + 20  # the other turn's KV and session 1's old entry
    assert c.use_seq.tolist() == [1, 2, 3, -1, -1, -1] and int(c.retained) == 4  # this call: sessions 1, 2 in order


def test_nothing_is_evicted_at_or_below_the_threshold():
    c = cache_with((1, {1: 20}), (2, {2: 100}), (3, {0: 60}))  # 180 cached
    for running in (0, 700, 720):  # 720 + 180 = 900 = 0.9 × 1000: fits
        out, mask = evict(c, jnp.int32(running), jnp.int32(1000), jnp.float32(0.9))
        assert not mask.any() and out.tokens.tolist() == c.tokens.tolist() and int(out.evicted) == 0


def test_eviction_is_lru_by_session_and_stops_as_soon_as_it_fits():
    c = cache_with((1, {1: 20}), (2, {2: 100}), (3, {0: 60}))  # LRU order: session 1, 2, 0
    cases = {730: [1], 740: [1], 741: [1, 2], 840: [1, 2], 841: [0, 1, 2], 5000: [0, 1, 2]}
    for running, gone in cases.items():  # excess = running + 180 − 900
        out, mask = evict(c, jnp.int32(running), jnp.int32(1000), jnp.float32(0.9))
        assert np.flatnonzero(mask).tolist() == gone, running
        want = np.array([60, 20, 100, 0, 0, 0])
        assert int(out.evicted) == len(gone) and tally_value(out.evicted_tokens) == want[gone].sum()
        want[gone] = 0
        assert out.tokens.tolist() == want.tolist()
        assert np.all(np.asarray(out.last_use.s)[gone] == 2**31 - 1)  # no longer an LRU candidate


def test_eviction_ties_on_last_use_go_by_session_index():
    c = cache_with((1, {1: 20}), (2, {2: 100, 0: 60}))  # sessions 0 and 2 last used together
    _, mask = evict(c, jnp.int32(750), jnp.int32(1000), jnp.float32(0.9))  # excess 30: session 1 (20), then 0
    assert np.flatnonzero(mask).tolist() == [0, 1]


def test_eviction_equals_a_plain_python_lru_on_random_caches():
    """Random retentions (16 sessions, 4 slots a call, replaced entries, two calls at each time), then
    evictions at random running loads: the evicted set is the greedy prefix of a Python sort by (time,
    call, index): equal times of two calls go by retention order (the later call is the more recent)."""
    rng = np.random.default_rng(11)
    for case in range(25):
        c, held, when = kv_cache.init(16), {}, {}
        for call in range(6):
            sessions = rng.choice(16, 4, replace=False)
            finished = rng.random(4) < 0.7
            context = rng.integers(1, 50, 4)
            c = retain(c, jnp.asarray(sessions, jnp.int32), jnp.asarray(finished), jnp.asarray(context, jnp.int32),
                       clock.from_us(call // 2 * 10**6))  # two calls share each time: ties across calls too
            for k, f, x in zip(sessions, finished, context):
                if f:
                    held[int(k)], when[int(k)] = int(x), (call // 2, call)
        running = int(rng.integers(0, 400))
        out, mask = evict(c, jnp.int32(running), jnp.int32(500), jnp.float32(0.9))
        excess, gone = running + sum(held.values()) - 450, []
        for k in sorted(held, key=lambda k: (*when[k], k)):
            if excess <= 0:
                break
            gone.append(k)
            excess -= held[k]
        assert np.flatnonzero(mask).tolist() == sorted(gone), case
        assert tally_value(out.evicted_tokens) == sum(held[k] for k in gone)


def test_tallies_are_exact_past_int32():
    t = jnp.zeros(2, jnp.int32)
    add = jax.jit(kv_cache.tally_add)
    step = 2**30 - 1
    for _ in range(5):
        t = add(t, jnp.int32(step))
    assert tally_value(t) == 5 * step and float(kv_cache.tally_float(t)) == np.float32(5 * step)


# --- a batcher run: the second turn of a session reuses the first's KV ------------------------------

def tokens_pass_us(b, draw=0):
    """A pass: 100 µs plus 10 µs per token (decode tokens and chunk tokens)."""
    return 100.0 + 10.0 * (b.decode_mask.sum() + (b.chunk_tokens * b.chunk_mask).sum())


def cache_mechanism(requests: Requests, mode: str, keep: bool) -> batching.Mechanism:
    """Stateless unit pass time; a finished request's prompt + output retained (if ``keep``); a new
    request takes its session's entry."""
    def admit(c, st, new):
        reused, _, c = kv_cache.take(c, st.slots.request, new, requests)
        return reused, c

    def iteration(c, st, b, i):
        us = batching.iteration_us(b, tokens_pass_us, mode, i)
        s = st.slots
        done = (b.decode_mask | b.chunk_emits) & (s.decode_left == 1)  # its last token comes out now
        r = jnp.maximum(s.request, 0)
        c = kv_cache.retain(c, requests.session[r], done & keep, requests.prompt_tokens[r] + requests.output_tokens[r],
                            clock.advance(st.now, us))
        return us, c

    return batching.Mechanism(init=lambda: kv_cache.init(requests.valid.shape[0]), iteration=iteration, admit=admit)


@functools.partial(jax.jit, static_argnames=("config", "keep"))
def _serve(requests, knobs, config, keep):
    return batching.run(requests, knobs, config, cache_mechanism(requests, config.mode, keep), 100)


def test_a_second_turn_prefills_only_what_the_cache_does_not_hold():
    # turn 1: prompt 8, output 2 at 0; turn 2 (same session, prefix 10 = turn 1's KV): prompt 14, output 1 at 1 ms
    two = requests_of([0, 1000], prompt=[8, 14], output=[2, 1], prefix=[0, 10], session=[0, 0])
    config = BatcherConfig(slots=1, tiers=1)
    knobs = BatcherKnobs.make(chunk_tokens=4, token_budget=8, tiers=1)
    # turn 1: chunks 4, 4 (first token at 280), a decode (110): ends at 390 holding 10 KV tokens
    # turn 2 with the cache: reuses min(10, 10, 13) = 10, one chunk of 4: 1000 + 140
    st, c = _serve(two, knobs, config, True)
    assert clock.to_us(st.first_token).tolist() == [280, 1140] and clock.to_us(st.finish).tolist() == [390, 1140]
    assert int(st.iterations) == 4 and st.kv_used_tokens.tolist() == [0] and not bool(st.overflow)
    assert tally_value(c.hit_tokens) == 10 and tally_value(c.prompt_tokens) == 22
    assert c.tokens.tolist() == [15, 0] and clock.to_us(c.last_use)[0] == 1140  # turn 2's whole KV retained
    # nothing retained: turn 2 prefills all 14 tokens, chunks 4, 4, 4, 2: 1000 + 3 × 140 + 120
    st, c = _serve(two, knobs, config, False)
    assert clock.to_us(st.first_token).tolist() == [280, 1540] and clock.to_us(st.finish).tolist() == [390, 1540]
    assert int(st.iterations) == 7 and tally_value(c.hit_tokens) == 0 and st.kv_used_tokens.tolist() == [0]
