"""The serving engine's fixed-size state (DESIGN.md §5 "ServeState"; review §3.5, jumanji masks).

A stream serves its pre-sampled ``Requests [R]`` through a slot table of ``B_max`` running requests.
The queue is two pointers: ``admitted`` (requests ``0 … admitted−1`` have entered a slot, in arrival
order) and ``arrived`` = ``clock.searchsorted(arrival, now)``, computed where needed, never stored.
In a closed loop (``BatcherConfig.tasks`` = T > 0; ``requests`` module, "Closed loops") arrivals are
not known ahead: ``arrival`` holds them as the loop issues them (a task's next request a think time
after its previous one finishes) and ``task_next`` each task's next request; the queue is the tasks
whose next request has arrived, in order of arrival (ties by task), and ``admitted`` counts admissions.
KV capacity is reserved per tier at admission (the whole prompt + output, no preemption; tiers fill
in order, so tier 0 is the one a request spills out of); ``kv_used_tokens`` is that reservation.

:class:`BatcherConfig` is static (shapes and the pass structure), :class:`BatcherKnobs` traced (the
chunk size, the iteration token budget and the tier capacities: sweeping them never recompiles).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import clock
from hbfjax.clock import Clock
from hbfjax.validate import require, require_choice, require_int

MODES = ("mixed", "serial", "alternate")
MAX_SLOTS = 1024
MAX_ITERATION_TOKENS = 2**20  # chunk and budget: B_max of them sum below 2^31 in int32
MAX_TIERS = 8
MAX_KV_TOKENS = 2**30  # total KV capacity: saturating int32 sums of reservations stay below 2^31


class Phase(IntEnum):
    """What a slot holds."""

    EMPTY = 0
    PREFILL = 1  # admitted, prompt not yet fully prefilled
    DECODE = 2  # first token out, generating the rest


@dataclass(frozen=True)
class BatcherConfig:
    """Static shape and pass structure of the batcher (hashable: a ``jit`` static argument).

    ``mode``: ``mixed`` (decode tokens and prefill chunks in one pass), ``serial`` (a decode pass then
    a prefill pass each iteration, DASH §VI-E) or ``alternate`` (LLMSimulator's strict alternation: an
    iteration is all prefill or all decode, switching whenever both have work).
    """

    slots: int = 32  # B_max running requests (DASH §VI-E: 32)
    mode: str = "mixed"
    tiers: int = 2  # KV tiers (e.g. HBM, HBF), the length of BatcherKnobs.kv_capacity_tokens
    tasks: int = 0  # closed loop: T tasks, request i of task i mod T (0: open loop, arrivals given)

    def __post_init__(self):
        c = type(self).__name__
        require_int(c, "slots", self.slots, 1, MAX_SLOTS)
        require_int(c, "tasks", self.tasks, 0, 2**14)
        require_choice(c, "mode", self.mode, MODES)
        require_int(c, "tiers", self.tiers, 1, MAX_TIERS)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class BatcherKnobs:
    """Traced scheduling knobs (stack a leading axis to sweep)."""

    chunk_tokens: jax.Array  # int32[] largest prefill chunk (DASH §VI-E: 512)
    token_budget: jax.Array  # int32[] tokens per iteration, decode and prefill (DASH §VI-E: 8,192)
    kv_capacity_tokens: jax.Array  # int32[T] KV tokens each tier can hold

    @classmethod
    def make(cls, chunk_tokens=512, token_budget=8192, kv_capacity_tokens=None, *, tiers: int = 2) -> "BatcherKnobs":
        """Validated knobs: chunk and budget in [1, 2^20], ``tiers`` capacities >= 0 whose sum is
        in [1, 2^30]. Unset capacities put 2^30 tokens in tier 0 and none elsewhere (unbounded KV)."""
        c = cls.__name__
        chunk = require_int(c, "chunk_tokens", chunk_tokens, 1, MAX_ITERATION_TOKENS)
        budget = require_int(c, "token_budget", token_budget, 1, MAX_ITERATION_TOKENS)
        if kv_capacity_tokens is None:
            kv_capacity_tokens = (MAX_KV_TOKENS,) + (0,) * (tiers - 1)
        caps = [require_int(c, f"kv_capacity_tokens[{t}]", v, 0, MAX_KV_TOKENS) for t, v in enumerate(kv_capacity_tokens)]
        require(len(caps) == tiers, c, "kv_capacity_tokens", list(caps), f"must have one entry per tier ({tiers})")
        require(1 <= sum(caps) <= MAX_KV_TOKENS, c, "kv_capacity_tokens", caps, f"must sum to [1, {MAX_KV_TOKENS}]")
        return cls(chunk_tokens=jnp.int32(chunk), token_budget=jnp.int32(budget),
                   kv_capacity_tokens=jnp.asarray(np.asarray(caps), jnp.int32))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Slots:
    """The slot table: B_max running requests (``request`` −1 = empty)."""

    request: jax.Array  # int32[B] request index, −1 when empty
    phase: jax.Array  # int32[B] a Phase
    prefill_left: jax.Array  # int32[B] prompt tokens not yet prefilled
    decode_left: jax.Array  # int32[B] output tokens still to generate
    kv_tokens: jax.Array  # int32[B] tokens of the request in the KV cache
    first_token: Clock  # Clock[B] when its first token came out (prefill done)
    kv_reserved: jax.Array  # int32[B, T] KV tokens reserved in each tier


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ServeState:
    """One stream's serving state between iterations."""

    slots: Slots
    admitted: jax.Array  # int32[] requests 0 … admitted−1 have been admitted (arrival order)
    now: Clock  # Clock[] the iteration boundary
    first_token: Clock  # Clock[R] first token out (clock.never() until then)
    finish: Clock  # Clock[R] last token out (clock.never() until then)
    tokens_out: jax.Array  # int32[R] output tokens generated
    kv_used_tokens: jax.Array  # int32[T] KV tokens reserved in each tier
    prefill_last: jax.Array  # bool[] the last iteration was a prefill one (``alternate`` mode)
    iterations: jax.Array  # int32[] iterations run
    overflow: jax.Array  # bool[] sticky: a request can never fit the KV capacity, or the rollout ran out
    arrival: Clock  # Clock[R] closed loop: each request's arrival once issued (never until then); Clock[0] open
    task_next: jax.Array  # int32[T] closed loop: each task's next request not yet admitted (>= R: none left)


def init(requests: int, config: BatcherConfig, arrival: Clock | None = None) -> ServeState:
    """The empty state at t = 0 for a stream of ``requests`` = R requests (a closed loop: ``arrival``
    Clock[R], the requests' static arrivals, i.e. every task's first turn)."""
    b, t = config.slots, config.tiers
    zeros = jnp.zeros(b, jnp.int32)
    slots = Slots(request=jnp.full(b, -1, jnp.int32), phase=zeros, prefill_left=zeros, decode_left=zeros,
                  kv_tokens=zeros, first_token=clock.never((b,)), kv_reserved=jnp.zeros((b, t), jnp.int32))
    return ServeState(slots=slots, admitted=jnp.int32(0), now=clock.zeros(), first_token=clock.never((requests,)),
                      finish=clock.never((requests,)), tokens_out=jnp.zeros(requests, jnp.int32),
                      kv_used_tokens=jnp.zeros(t, jnp.int32), prefill_last=jnp.bool_(False),
                      iterations=jnp.int32(0), overflow=jnp.bool_(False),
                      arrival=clock.never((0,)) if config.tasks == 0 else arrival,
                      task_next=jnp.arange(config.tasks, dtype=jnp.int32))
