"""The Sarathi-style iteration schedule (DASH §VI-E; DESIGN.md §5 "The step"), one stream.

At each iteration boundary :func:`schedule`

1. jumps the clock to the next arrival when nothing is running or waiting (an idle gap);
2. admits arrived requests into free slots in arrival order (free slots ranked by ``cumsum``), while
   their whole KV (prompt + output tokens) fits the tiers' free capacity, tiers filled in order; the
   queue is FIFO, so a request that does not fit blocks those behind it (one that could never fit
   sets the sticky ``overflow``);
3. reserves one decode token per running decode request;
4. adds at most one prefill chunk (≤ ``chunk_tokens``) per prefilling request, in arrival order,
   within what the iteration token budget leaves (the last chunk that fits is cut to the budget).

``mixed`` times the result as one pass, ``serial`` as a decode pass then a prefill pass (each fetched
expert reused across the rows of its pass; :func:`passes` splits the batch), ``alternate`` makes each
iteration all prefill or all decode, switching whenever both have work (LLMSimulator's order).

:func:`advance` then moves the clock by the iteration's time and books its progress: a chunk that
completes its prompt emits the first token at the end of the iteration, each decode token one more;
a request whose last token came out records its finish time and frees its slot and KV. Per-request
times are scattered into ``[R]`` arrays with ``mode="drop"``. :func:`rollout` runs the loop with an
iteration-time callable (the real step, composing GPU and memory times, replaces it).

In a closed loop (``BatcherConfig.tasks`` = T, ``state`` module) the queue is each task's next
request in order of arrival (:func:`_queue`: a sort of T keys per boundary), admission marks the task
as waiting on its request, and :func:`advance` issues a task's next request ``think_us`` after its
previous one finishes; everything else is the open loop's.

A :class:`Mechanism` with an ``admit`` hook reuses KV at admission (HBFlex §5.4, e.g. a session's
retained KV, :mod:`hbfjax.serve.kv_cache`): a slot whose request reuses ``reused`` tokens starts with
``kv_tokens = reused`` and ``prefill_left = prompt − reused`` (its first token still comes from a
chunk), and gives back the last ``reused`` tokens of its reservation (those KV tokens are held by the
cache, not newly reserved), taken from its last tiers first, never below 0. Without the hook every
prompt is prefilled whole.

Not yet modelled: preemption (the whole KV is reserved at admission instead), and a cap on admissions
per iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from hbfjax import clock
from hbfjax.serve.state import MAX_KV_TOKENS, BatcherConfig, BatcherKnobs, Phase, ServeState, Slots, init
from hbfjax.workload.requests import Requests
from hbfjax.workload.timing import Batch

PassTime = Callable[[Batch, jax.Array], jax.Array]  # (batch, draw: int32[] unique per pass) -> float32[] µs


class Mechanism(NamedTuple):
    """What times an iteration and keeps state of its own beside the batcher's (DESIGN.md §5: "each
    mechanism's state"), e.g. where each slot's KV lives and the run's write totals.

    ``iteration(carry, state, batch, i)`` gets the carry, the state after :func:`schedule` (slot table
    with this iteration's admissions; ``kv_tokens`` before its tokens) and the iteration's batch, and
    returns ``(iteration_us float32[], carry)``; it is called on every scan step, and its carry is kept
    unchanged where the stream has stopped.

    ``admit(carry, state, new)`` (optional) is called at each boundary right after admission with the
    state holding the new requests and ``new`` bool[B], the slots that just received one; it returns
    ``(reused int32[B], carry)``: KV tokens of each new request already held (in [0, prompt − 1]),
    which it need not prefill nor reserve."""

    init: Callable[[], Any]
    iteration: Callable[[Any, ServeState, Batch, jax.Array], tuple[jax.Array, Any]]
    admit: Callable[[Any, ServeState, jax.Array], tuple[jax.Array, Any]] | None = None
    # ``every_chunk(carry)`` (optional): amortised work once per chunk of ``scan_chunk`` iterations (e.g.
    # GC, DESIGN.md §5 "GC every chunk"); a stream that had stopped before the chunk keeps its carry
    every_chunk: Callable[[Any], Any] | None = None


def stateless(pass_us: PassTime, mode: str) -> Mechanism:
    """The mechanism of an iteration-time callable with no state (:func:`iteration_us`)."""
    return Mechanism(init=lambda: (), iteration=lambda carry, st, b, i: (iteration_us(b, pass_us, mode, i), carry))
_SATURATE = MAX_KV_TOKENS + 1  # reservation sums saturate here: above any free capacity, inside int32


def _saturating_cumsum(x: jax.Array) -> jax.Array:
    """Inclusive running sums of non-negative int32 ``x`` (each <= _SATURATE), capped at _SATURATE."""
    return jax.lax.associative_scan(lambda a, b: b + jnp.minimum(a, _SATURATE - b), x)


class Queue(NamedTuple):
    """The waiting requests at a boundary, in the order they are admitted (FIFO by arrival)."""

    request: jax.Array  # int32[Q] the k-th queued request (>= R: none); Q = B open, T closed
    arrival: clock.Clock  # Clock[Q] its arrival (never: none, or not issued yet)


def _queue(state: ServeState, requests: Requests, config: BatcherConfig) -> Queue:
    """Open loop: requests ``admitted …`` (sorted arrivals). Closed loop: each task's next request, ordered
    by its arrival (ties by task; a task whose next request is not issued, or who has none left, last)."""
    r = requests.valid.shape[0]
    if config.tasks == 0:
        cand = state.admitted + jnp.arange(config.slots, dtype=jnp.int32)
        idx = jnp.minimum(cand, r - 1)
        ok = (cand < r) & requests.valid[idx]
        return Queue(cand, clock.where(ok, clock.take(requests.arrival, idx), clock.never(cand.shape)))
    nxt = state.task_next
    idx = jnp.minimum(nxt, r - 1)
    has = (nxt < r) & requests.valid[idx]
    at = clock.where(has, clock.take(state.arrival, idx), clock.never(nxt.shape))
    s_, us, order = jax.lax.sort((at.s, at.us, jnp.arange(nxt.shape[0], dtype=jnp.int32)), num_keys=2, is_stable=True)
    return Queue(jnp.where(s_ == clock.INT32_MAX, r, nxt[order]), clock.Clock(s_, us))


def _skip_idle(state: ServeState, queue: Queue) -> clock.Clock:
    """The boundary's time: ``now``, or the queue head's arrival if nothing is running or waiting (the
    queue is in arrival order, so its head is the only one to look at)."""
    due = clock.take(queue.arrival, 0)
    idle = ~(state.slots.request >= 0).any() & (due.s < clock.INT32_MAX) & clock.less(state.now, due)
    return clock.where(idle, due, state.now)


def _admit(state: ServeState, requests: Requests, knobs: BatcherKnobs, now: clock.Clock,
           queue: Queue) -> tuple[ServeState, jax.Array]:
    """Arrived requests into free slots in queue order, while their KV fits (tiers filled in order);
    and bool[B], the slots that received one."""
    s = state.slots
    b, r = s.request.shape[0], requests.valid.shape[0]
    free = s.request < 0  # bool[B]
    rank = jnp.clip(jnp.cumsum(free) - 1, 0, b - 1)  # int32[B] rank of each free slot
    k = jnp.arange(b, dtype=jnp.int32)
    fill_q = lambda x, pad: x[:b] if x.shape[0] >= b else jnp.concatenate([x, jnp.full(b - x.shape[0], pad, x.dtype)])  # noqa: E731
    cand = fill_q(queue.request, r)  # int32[B] the k-th waiting request
    arrived = clock.less_equal(clock.Clock(fill_q(queue.arrival.s, clock.INT32_MAX), fill_q(queue.arrival.us, 0.0)), now)
    idx = jnp.minimum(cand, r - 1)
    need = jnp.where(cand < r, requests.prompt_tokens[idx] + requests.output_tokens[idx], 0)
    need = jnp.minimum(need, _SATURATE)
    upto = _saturating_cumsum(need)  # int32[B] KV of candidates 0 … k
    free_tier = knobs.kv_capacity_tokens - state.kv_used_tokens  # int32[T]
    ok = (cand < r) & arrived & (k < free.sum()) & (upto <= free_tier.sum())  # bool[B] a prefix: FIFO
    never_fits = (cand[0] < r) & arrived[0] & (need[0] > knobs.kv_capacity_tokens.sum())
    top = jnp.cumsum(free_tier)  # int32[T] tiers fill in order: tier t holds [top − free, top)
    fill = lambda x: jnp.clip(x[:, None] - (top - free_tier)[None, :], 0, free_tier[None, :])  # noqa: E731
    alloc = jnp.where(ok[:, None], fill(upto) - fill(upto - need), 0)  # int32[B, T] per candidate
    new = free & ok[rank]  # bool[B] slots that receive a request
    pick = lambda a, b_: jnp.where(new, a, b_)  # noqa: E731
    slots = Slots(request=pick(cand[rank], s.request), phase=pick(jnp.int32(Phase.PREFILL), s.phase),
                  prefill_left=pick(requests.prompt_tokens[idx[rank]], s.prefill_left),
                  decode_left=pick(requests.output_tokens[idx[rank]], s.decode_left),
                  kv_tokens=pick(0, s.kv_tokens), first_token=s.first_token,
                  kv_reserved=jnp.where(new[:, None], alloc[rank], s.kv_reserved))
    tasks = state.task_next.shape[0]
    if tasks:  # an admitted task waits for its request to finish before it issues the next one
        task_next = state.task_next.at[jnp.where(ok, cand % tasks, tasks)].set(cand + tasks, mode="drop")
    else:
        task_next = state.task_next
    return dataclasses.replace(state, slots=slots, now=now, admitted=state.admitted + ok.sum(dtype=jnp.int32),
                               kv_used_tokens=state.kv_used_tokens + alloc.sum(axis=0),
                               overflow=state.overflow | never_fits, task_next=task_next), new


def _reuse(state: ServeState, new: jax.Array, reused: jax.Array) -> ServeState:
    """New slots start ``reused`` (int32[B], clipped to [0, prefill_left − 1]) tokens into their prompt
    and give back the last ``reused`` tokens of their reservation (last tier first, each tier >= 0)."""
    s = state.slots
    reused = jnp.where(new, jnp.clip(reused, 0, jnp.maximum(s.prefill_left - 1, 0)), 0)  # int32[B]
    keep = s.kv_reserved.sum(axis=1) - reused  # int32[B] the first `keep` tokens of the fill stay
    below = jnp.cumsum(s.kv_reserved, axis=1) - s.kv_reserved  # int32[B, T] reserved in earlier tiers
    reserved = jnp.clip(keep[:, None] - below, 0, s.kv_reserved)
    slots = dataclasses.replace(s, prefill_left=s.prefill_left - reused, kv_tokens=s.kv_tokens + reused,
                                kv_reserved=reserved)
    return dataclasses.replace(state, slots=slots,
                               kv_used_tokens=state.kv_used_tokens - (s.kv_reserved - reserved).sum(axis=0))


def _select(state: ServeState, knobs: BatcherKnobs, config: BatcherConfig) -> tuple[Batch, jax.Array]:
    """The iteration's decode tokens and prefill chunks, and whether it is a prefill iteration
    (``alternate``; otherwise whether it holds a chunk)."""
    s = state.slots
    decode = s.phase == Phase.DECODE  # bool[B]
    prefill = s.phase == Phase.PREFILL
    if config.mode == "alternate":
        take_prefill = prefill.any() & (~state.prefill_last | ~decode.any())
        decode, prefill = decode & ~take_prefill, prefill & take_prefill
    room = jnp.maximum(knobs.token_budget - decode.sum(dtype=jnp.int32), 0)
    want = jnp.where(prefill, jnp.minimum(s.prefill_left, jnp.minimum(knobs.chunk_tokens, room)), 0)  # int32[B]
    earlier = (s.request[None, :] < s.request[:, None]) & prefill[None, :]  # [s, j]: j precedes s
    ahead = jnp.where(earlier, want[None, :], 0).sum(axis=1)  # int32[B] budget taken before s
    chunk = jnp.clip(room - ahead, 0, want)
    has = chunk > 0
    batch = Batch(decode_context=jnp.where(decode, s.kv_tokens + 1, 0), decode_mask=decode,
                  chunk_tokens=chunk, chunk_prefix=jnp.where(has, s.kv_tokens, 0), chunk_mask=has,
                  chunk_emits=has & (chunk == s.prefill_left))
    return batch, has.any()


def schedule(state: ServeState, requests: Requests, knobs: BatcherKnobs, config: BatcherConfig) -> tuple[ServeState, Batch]:
    """One iteration boundary: idle jump, admission, then the iteration's batch (``Batch`` with
    ``B = C = B_max``: decode context lengths and prefill chunks per slot, masked)."""
    state, batch, _ = schedule_with(state, requests, knobs, config, None, ())
    return state, batch


def schedule_with(state: ServeState, requests: Requests, knobs: BatcherKnobs, config: BatcherConfig,
                  admit, carry) -> tuple[ServeState, Batch, Any]:
    """:func:`schedule` with a :class:`Mechanism` ``admit`` hook (None: none) called on ``carry`` right
    after admission; returns the state, the batch and the hook's carry."""
    queue = _queue(state, requests, config)
    state, new = _admit(state, requests, knobs, _skip_idle(state, queue), queue)
    if admit is not None:
        reused, carry = admit(carry, state, new)
        state = _reuse(state, new, reused)
    batch, prefilling = _select(state, knobs, config)
    work = batch.decode_mask.any() | prefilling
    return dataclasses.replace(state, prefill_last=jnp.where(work, prefilling, state.prefill_last)), batch, carry


def passes(batch: Batch, mode: str) -> tuple[Batch, ...]:
    """The GPU passes of an iteration: one (``mixed``, ``alternate``) or decode then prefill (``serial``)."""
    if mode != "serial":
        return (batch,)
    no_chunks = jnp.zeros_like(batch.chunk_mask)
    return (dataclasses.replace(batch, chunk_mask=no_chunks, chunk_emits=no_chunks),
            dataclasses.replace(batch, decode_mask=jnp.zeros_like(batch.decode_mask)))


def has_work(batch: Batch) -> jax.Array:
    """bool[] the batch holds a decode token or a chunk."""
    return batch.decode_mask.any() | batch.chunk_mask.any()


def _scatter(times: clock.Clock, index, when: clock.Clock) -> clock.Clock:
    """``times[index] = when`` for indices in range (out-of-range ones dropped)."""
    return clock.Clock(times.s.at[index].set(when.s, mode="drop"), times.us.at[index].set(when.us, mode="drop"))


def _issue_next(state: ServeState, requests: Requests, done: jax.Array, stamp: clock.Clock) -> clock.Clock:
    """Closed loop: ``arrival`` with the next request of each task whose request finished (``done``
    bool[B] at ``stamp``) issued its think time later."""
    tasks, r = state.task_next.shape[0], requests.valid.shape[0]
    nxt = state.slots.request + tasks  # int32[B]
    think = requests.think_us[jnp.clip(nxt, 0, r - 1)]
    return _scatter(state.arrival, jnp.where(done & (nxt < r), nxt, r), clock.advance(stamp, think))


def advance(state: ServeState, iteration_us, batch: Batch, requests: Requests | None = None) -> ServeState:
    """The clock moved by ``iteration_us`` (float32 µs) and the iteration's progress booked (a closed
    loop needs ``requests``: a finished request issues its task's next one)."""
    now = clock.advance(state.now, iteration_us)
    s = state.slots
    r = state.tokens_out.shape[0]
    chunk = jnp.where(batch.chunk_mask, batch.chunk_tokens, 0)
    decoded = batch.decode_mask
    prefill_left = s.prefill_left - chunk
    first = batch.chunk_mask & (prefill_left == 0)  # bool[B] prompt done: first token out
    produced = decoded | first
    decode_left = s.decode_left - produced.astype(jnp.int32)
    done = produced & (decode_left == 0)  # bool[B] last token out
    to_r = lambda m: jnp.where(m, s.request, r)  # noqa: E731  (index r: dropped)
    shape = s.request.shape
    stamp = clock.Clock(jnp.broadcast_to(now.s, shape), jnp.broadcast_to(now.us, shape))
    slot_first = clock.where(first, stamp, s.first_token)
    slots = Slots(request=jnp.where(done, -1, s.request),
                  phase=jnp.where(done, jnp.int32(Phase.EMPTY), jnp.where(first, jnp.int32(Phase.DECODE), s.phase)),
                  prefill_left=prefill_left, decode_left=decode_left,
                  kv_tokens=jnp.where(done, 0, s.kv_tokens + chunk + decoded.astype(jnp.int32)),
                  first_token=clock.where(done, clock.never(shape), slot_first),
                  kv_reserved=jnp.where(done[:, None], 0, s.kv_reserved))
    arrival = _issue_next(state, requests, done, stamp) if state.task_next.shape[0] else state.arrival
    return dataclasses.replace(
        state, slots=slots, now=now, arrival=arrival, first_token=_scatter(state.first_token, to_r(first), stamp),
        finish=_scatter(state.finish, to_r(done), stamp),
        tokens_out=state.tokens_out.at[to_r(produced)].add(1, mode="drop"),
        kv_used_tokens=state.kv_used_tokens - jnp.where(done[:, None], s.kv_reserved, 0).sum(axis=0),
        iterations=state.iterations + has_work(batch).astype(jnp.int32))


def iteration_us(batch: Batch, pass_us: PassTime, mode: str, iteration=0) -> jax.Array:
    """float32 µs of an iteration: the sum of its non-empty passes' times. Pass ``k`` of iteration ``i``
    is timed with draw index ``2·i + k`` (the words of its random draws, e.g. routing)."""
    return sum(jnp.where(has_work(p), pass_us(p, 2 * jnp.asarray(iteration, jnp.int32) + k), 0.0)
               for k, p in enumerate(passes(batch, mode)))


def _varying_with(tree, anchors):
    """``tree`` unchanged in value, but computed from ``anchors`` (every leaf of them): under ``vmap`` every
    leaf is then batched from the start, so the ``while_loop``'s and ``scan``'s batching rules settle which
    carries are batched in one pass over the body instead of one pass per promotion (tracing the engine
    under vmap was dominated by those passes)."""
    tie = jnp.bool_(True)
    for leaf in jax.tree_util.tree_leaves(anchors):
        first = jnp.ravel(leaf)[:1]
        tie = tie & jnp.all((first == first) | (first != first))  # True for every value, NaN included
    return jax.tree_util.tree_map(lambda x: jnp.where(tie, x, x), tree)


def running(state: ServeState, requests: Requests) -> jax.Array:
    """bool[] a valid request is not yet finished (waiting, or in a slot)."""
    return (state.admitted < requests.valid.sum(dtype=jnp.int32)) | (state.slots.request >= 0).any()


def rollout(requests: Requests, knobs: BatcherKnobs, config: BatcherConfig, pass_us: PassTime,
            max_iterations: int, scan_chunk: int = 64) -> ServeState:
    """Serve one stream to the end with a stateless iteration-time callable (:func:`run`)."""
    return run(requests, knobs, config, stateless(pass_us, config.mode), max_iterations, scan_chunk)[0]


def run(requests: Requests, knobs: BatcherKnobs, config: BatcherConfig, mechanism: Mechanism,
        max_iterations: int, scan_chunk: int = 64, varying: Any = None) -> tuple[ServeState, Any]:
    """Serve one stream to the end with a :class:`Mechanism`; returns the final state and carry.
    ``varying``: what differs between the vmapped streams and points (the stream's random words, the
    knobs; default the requests and ``knobs``): the loop's start is tied to it (:func:`_varying_with`).
    ``overflow`` is set if requests are left when it stops (a request that never fits, or
    ``max_iterations`` iterations with work spent).

    A ``while_loop`` over chunks of ``scan_chunk`` iterations (DESIGN.md §5 "Rollout"): inside a chunk a
    ``lax.scan`` whose steps are no-ops once the stream has stopped (masked batch, slot table and carry
    kept), so under ``vmap`` the whole state — the ``[R]`` arrays included — is selected once per chunk,
    not once per iteration."""
    def go(st):
        return running(st, requests) & ~st.overflow & (st.iterations < max_iterations)

    def keep(active, a, b_):
        return jax.tree_util.tree_map(lambda x, y: jnp.where(active, x, y), a, b_)

    def step(c, _):
        st, carry = c
        active = go(st)
        new, b, admitted_carry = schedule_with(st, requests, knobs, config, mechanism.admit, carry)
        new = dataclasses.replace(new, slots=keep(active, new.slots, st.slots),
                                  admitted=keep(active, new.admitted, st.admitted), now=keep(active, new.now, st.now),
                                  kv_used_tokens=keep(active, new.kv_used_tokens, st.kv_used_tokens),
                                  prefill_last=keep(active, new.prefill_last, st.prefill_last),
                                  overflow=keep(active, new.overflow, st.overflow),
                                  task_next=keep(active, new.task_next, st.task_next))
        b = dataclasses.replace(b, decode_mask=b.decode_mask & active, chunk_mask=b.chunk_mask & active,
                                chunk_emits=b.chunk_emits & active)
        us, new_carry = mechanism.iteration(admitted_carry, new, b, st.iterations)
        return (advance(new, us, b, requests), keep(active, new_carry, carry)), None

    def chunk(c):
        (st, carry), chunks = c
        live = go(st)
        st, carry = jax.lax.scan(step, (st, carry), length=scan_chunk)[0]
        if mechanism.every_chunk is not None:
            carry = keep(live, mechanism.every_chunk(carry), carry)
        return (st, carry), chunks + 1

    # every chunk of a live stream holds an iteration with work; the chunk count only guards the loop
    start = _varying_with((init(requests.valid.shape[0], config, requests.arrival), mechanism.init(), jnp.int32(0)),
                          (requests, knobs) if varying is None else varying)
    (final, carry), _ = jax.lax.while_loop(lambda c: go(c[0][0]) & (c[1] <= max_iterations), chunk,
                                           (start[:2], start[2]))
    return dataclasses.replace(final, overflow=final.overflow | running(final, requests)), carry
