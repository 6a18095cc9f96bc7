"""KV retained after a request ends, reused by its session's later turns, evicted LRU by session
(HBFlex §4.2, §5.4, §6.1; DESIGN.md §5 "Modes"), one stream.

A fixed-size cache indexed by session (the root request's index ``s`` in ``[R]``): ``tokens[s]`` KV
tokens retained for session ``s`` and ``last_use[s]``, when it last finished a request (the LRU key).

* :func:`take` at admission: a new request ``r`` of session ``s`` reuses
  ``min(prefix_tokens[r], tokens[s], prompt_tokens[r] − 1)`` tokens (at least one prompt token is
  computed: it produces the first output token). The entry is handed to the request (``tokens[s]`` = 0:
  its KV is now the running request's) and the entry's tokens beyond the reused ones are freed (the
  request's new KV diverges from them; counted in ``freed_tokens``). When two slots of one session are
  admitted in one iteration, only the earliest request (smallest index: arrival order) gets the hit,
  by a scatter-min of request indices per session; the later one reuses nothing. A request admitted
  while another turn of its session still runs finds the entry empty (that KV is the running turn's;
  sharing between running requests is not modelled).
* :func:`retain` when a request finishes: its whole KV (``context_tokens``, e.g. prompt + output)
  becomes its session's entry and ``last_use`` = now; an entry it replaces (and, when two turns of one
  session finish in one iteration, the smaller of the two) is freed.
* :func:`evict`: while running + cached tokens exceed ``threshold × capacity`` (HBFlex §5.4: 90 %),
  whole sessions are evicted, least recently used first (ties by session index), stopping as soon as
  it fits.

The LRU order is kept as ``use_seq``, each session's rank in the sequence of retentions: :func:`retain`
numbers the sessions it stamps in session-index order after every earlier one, so with ``now``
non-decreasing across calls (as in a run) ``use_seq`` orders sessions by ``(last_use, index)``, except
that equal ``last_use`` stamped by two calls goes by call order (the later call is the more recent; in a
run each call is a later iteration, so this needs an iteration of zero time).
Eviction then needs no sort (a 3-key sort of R = 1,152 takes ~0.9 ms a stream under ``vmap`` on a CPU):
a bisection over ``use_seq`` (< R: a request finishes, and is retained, once) finds the newest session
to evict, ``bit_length(R) + 1`` masked sums of R.

Totals that grow without bound over a run (tokens freed, hit, prompted) are :data:`Tally` counters:
int32[2] = (units of 2^30 tokens, remainder in [0, 2^30)), exact up to 2^61 tokens, read with
:func:`tally_value` (host int64) or :func:`tally_float` (traced float32). Each call adds a per-call
total that must stay below 2^31 − 2^30: it does, since a call's tokens are KV the stream holds at
once (``Σ tokens`` and the admitted prompts are bounded by the KV capacity, at most 2^30).

Cost per call (R requests, B slots): :func:`take` and :func:`retain` O(R + B) (a scatter into a fresh
``[R]`` array, gathers of B); :func:`evict` O(R log R) (the bisection) and :func:`held_tokens` O(R).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import clock
from hbfjax.clock import Clock
from hbfjax.workload.requests import Requests

_UNIT = 2**30  # a Tally's low word stays below this; a call adds below 2^31 − 2^30

Tally = jax.Array  # int32[2] (units of 2^30 tokens, remainder in [0, 2^30)): an exact running total


class SessionCache(NamedTuple):
    """One stream's retained KV by session (``s`` = the session root's request index)."""

    tokens: jax.Array  # int32[R] KV tokens retained for session s; 0: nothing held
    last_use: Clock  # Clock[R] when session s last finished a request (LRU key); clock.never() if none
    use_seq: jax.Array  # int32[R] rank of session s's last retention (the LRU order); −1 if none
    retained: jax.Array  # int32[] retentions so far (the next use_seq)
    evicted: jax.Array  # int32[] sessions evicted so far (each a session's whole entry)
    evicted_tokens: Tally  # int32[2] tokens freed by eviction so far
    freed_tokens: Tally  # int32[2] tokens of entries freed without eviction (diverged past a hit, replaced)
    hit_tokens: Tally  # int32[2] prompt tokens served from the cache so far
    prompt_tokens: Tally  # int32[2] prompt tokens of admitted requests so far


def tally_add(tally: Tally, total) -> Tally:
    """``tally + total`` (int32[], 0 <= total < 2^31 − 2^30), carried into the high word."""
    lo = tally[1] + jnp.asarray(total, jnp.int32)
    return jnp.stack([tally[0] + lo // _UNIT, lo % _UNIT])


def tally_value(tally) -> np.ndarray:
    """Host int64 value of a tally (any leading axes)."""
    t = np.asarray(tally, np.int64)
    return t[..., 0] * _UNIT + t[..., 1]


def tally_float(tally: Tally) -> jax.Array:
    """float32[] value of a tally (traced; rounded to float32)."""
    return tally[0].astype(jnp.float32) * jnp.float32(_UNIT) + tally[1].astype(jnp.float32)


def init(requests: int) -> SessionCache:
    """The empty cache of a stream of ``requests`` = R requests."""
    zero = jnp.zeros(2, jnp.int32)
    return SessionCache(tokens=jnp.zeros(requests, jnp.int32), last_use=clock.never((requests,)),
                        use_seq=jnp.full(requests, -1, jnp.int32), retained=jnp.int32(0), evicted=jnp.int32(0),
                        evicted_tokens=zero, freed_tokens=zero, hit_tokens=zero, prompt_tokens=zero)


def held_tokens(cache: SessionCache) -> jax.Array:
    """int32[] KV tokens the cache holds (Σ tokens)."""
    return cache.tokens.sum(dtype=jnp.int32)


def running_kv_tokens(slot_request: jax.Array, requests: Requests) -> jax.Array:
    """int32[] whole KV (prompt + output) of the requests in slots (``slot_request`` int32[B], −1 empty):
    the running side of :func:`evict`. A slot's reservation lacks the tokens it reused (the batcher's
    ``admit`` hook gives them back), and :func:`take` emptied their entry, so the reservations
    (``kv_used_tokens``) alone would count those tokens nowhere."""
    r = jnp.maximum(slot_request, 0)
    return jnp.where(slot_request >= 0, requests.prompt_tokens[r] + requests.output_tokens[r], 0).sum(dtype=jnp.int32)


def _first_of(key: jax.Array, mask: jax.Array, order: jax.Array, size: int) -> jax.Array:
    """bool[B] masked entries whose ``order`` is the smallest among the masked entries sharing their
    ``key`` (int32[B] in [0, size); ``order`` int32[B] distinct where masked): a scatter-min."""
    big = jnp.iinfo(jnp.int32).max
    least = jnp.full(size, big, jnp.int32).at[jnp.where(mask, key, size)].min(order, mode="drop")
    return mask & (least[key] == order)


def take(cache: SessionCache, request_idx: jax.Array, new: jax.Array,
         requests: Requests) -> tuple[jax.Array, jax.Array, SessionCache]:
    """At admission: ``(reused int32[B], held int32[B], cache)`` for slots that just received request
    ``request_idx`` (``new`` bool[B]; other slots reuse 0 and change nothing): ``held`` the session entry's
    tokens each took (0: none). HBFlex §5.4: the session's retained KV serves the request's reusable prefix;
    the entry is consumed, its tokens past the hit freed."""
    r_count = cache.tokens.shape[0]
    r = jnp.clip(request_idx, 0, r_count - 1)
    new = new & (request_idx >= 0) & requests.valid[r]
    session = requests.session[r]  # int32[B]
    first = _first_of(session, new, r, r_count)  # the earliest new request of each session
    held = jnp.where(first, cache.tokens[session], 0)
    prompt = requests.prompt_tokens[r]
    reused = jnp.clip(jnp.minimum(jnp.minimum(requests.prefix_tokens[r], held), prompt - 1), 0, None)
    reused = jnp.where(first, reused, 0)
    tokens = cache.tokens.at[jnp.where(new, session, r_count)].set(0, mode="drop")
    return reused, held, cache._replace(
        tokens=tokens, freed_tokens=tally_add(cache.freed_tokens, (held - reused).sum(dtype=jnp.int32)),
        hit_tokens=tally_add(cache.hit_tokens, reused.sum(dtype=jnp.int32)),
        prompt_tokens=tally_add(cache.prompt_tokens, jnp.where(new, prompt, 0).sum(dtype=jnp.int32)))


def retain(cache: SessionCache, finished_session: jax.Array, finished: jax.Array, context_tokens: jax.Array,
           now: Clock) -> SessionCache:
    """A finished request's whole KV (``context_tokens`` int32[B]) becomes its session's entry, with
    ``last_use`` = ``now`` and the next ``use_seq`` ranks (in session order) (HBFlex §4.2: KV retained
    after a request ends). An entry it replaces is freed; of two turns of one session finishing
    together the larger KV is kept, the other freed."""
    r_count = cache.tokens.shape[0]
    slot = jnp.arange(finished.shape[0], dtype=jnp.int32)
    session = jnp.clip(finished_session, 0, r_count - 1)
    at = jnp.where(finished, session, r_count)
    context = jnp.where(finished, context_tokens, 0)
    tokens = cache.tokens.at[at].set(0, mode="drop").at[at].max(context, mode="drop")
    once = _first_of(session, finished, slot, r_count)  # one slot per touched session
    kept = jnp.where(once, tokens[session] - cache.tokens[session], 0).sum(dtype=jnp.int32)  # Σ new − old
    stamp = Clock(jnp.broadcast_to(now.s, slot.shape), jnp.broadcast_to(now.us, slot.shape))
    last_use = Clock(cache.last_use.s.at[at].set(stamp.s, mode="drop"), cache.last_use.us.at[at].set(stamp.us, mode="drop"))
    touched = jnp.zeros(r_count, jnp.int32).at[at].set(1, mode="drop")  # int32[R] sessions stamped now
    use_seq = jnp.where(touched > 0, cache.retained + jnp.cumsum(touched) - 1, cache.use_seq)
    return cache._replace(tokens=tokens, last_use=last_use, use_seq=use_seq, retained=cache.retained + touched.sum(),
                          freed_tokens=tally_add(cache.freed_tokens, context.sum(dtype=jnp.int32) - kept))


def evict(cache: SessionCache, running_tokens, capacity_tokens, threshold) -> tuple[SessionCache, jax.Array]:
    """``(cache, evicted bool[R])``: while running + cached tokens exceed ``threshold × capacity`` (HBFlex
    §5.4: evict at 90 %; the limit is ``floor`` of the float32 product), whole sessions are evicted,
    least recently used first (``use_seq``: ties in one retention by session index), stopping as soon
    as it fits. The mask names the
    sessions whose KV pages die (the GC mechanism invalidates them)."""
    r_count = cache.tokens.shape[0]
    limit = jnp.floor(jnp.asarray(threshold, jnp.float32) * jnp.asarray(capacity_tokens, jnp.float32)).astype(jnp.int32)
    excess = jnp.asarray(running_tokens, jnp.int32) + held_tokens(cache) - limit  # > 0: must free this much
    steps = r_count.bit_length() + 1
    key = jnp.where(cache.tokens > 0, cache.use_seq, jnp.iinfo(jnp.int32).max)  # int32[R] LRU rank of held entries

    def halve(_, bounds):  # freeing every key <= lo frees < excess; every key <= hi, >= excess (or all held)
        lo, hi = bounds
        mid = (lo + hi) // 2
        enough = jnp.where(key <= mid, cache.tokens, 0).sum(dtype=jnp.int32) >= excess
        return jnp.where(enough, lo, mid), jnp.where(enough, mid, hi)

    _, newest = jax.lax.fori_loop(0, steps, halve, (jnp.int32(-1), jnp.int32(2**steps - 1)))
    out = (key <= newest) & (excess > 0)  # bool[R]
    freed = jnp.where(out, cache.tokens, 0).sum(dtype=jnp.int32)
    return cache._replace(tokens=jnp.where(out, 0, cache.tokens), last_use=clock.where(out, clock.never((r_count,)), cache.last_use),
                          use_seq=jnp.where(out, -1, cache.use_seq), evicted=cache.evicted + out.sum(dtype=jnp.int32),
                          evicted_tokens=tally_add(cache.evicted_tokens, freed)), out
