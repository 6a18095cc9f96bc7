"""Plain-Python reference of the batcher (one stream, loops): the correctness oracle of
:mod:`hbfjax.serve.batching` and its speed baseline (DESIGN.md §5 "A plain-Python reference").

The same schedule, written as the prose of :mod:`hbfjax.serve.batching` reads: walk the queue in
arrival order, walk the slots, walk the prefilling requests by request index. Time is whole µs in
Python ints, so the iteration-time function must return whole µs for the two to agree exactly (the
JAX clock is exact for whole µs). The iteration-time function is called on a ``Batch`` of NumPy
arrays shaped as the JAX one (``[B_max]``, masked), so one callable serves both.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from hbfjax.serve.state import BatcherConfig, Phase
from hbfjax.workload.timing import Batch

NEVER = None  # a time not reached


@dataclass
class _Slot:
    request: int = -1
    phase: int = Phase.EMPTY
    prefill_left: int = 0
    decode_left: int = 0
    kv_tokens: int = 0
    reserved: list = field(default_factory=list)


@dataclass
class Result:
    """One stream served: per-request times (whole µs; None if not reached) and an iteration log."""

    first_token_us: list
    finish_us: list
    tokens_out: list
    iterations: int
    overflow: bool
    log: list  # per iteration: dict(start_us, decode: [request], chunks: {request: tokens}, us)


def _batch(slots: list, decode: list, chunks: dict) -> Batch:
    """The iteration's Batch (NumPy, slot order, masked) for the iteration-time function."""
    b = len(slots)
    ctx, dmask = np.zeros(b, np.int32), np.zeros(b, bool)
    tok, pre, cmask, emits = np.zeros(b, np.int32), np.zeros(b, np.int32), np.zeros(b, bool), np.zeros(b, bool)
    for i, sl in enumerate(slots):
        if sl.request in decode:
            ctx[i], dmask[i] = sl.kv_tokens + 1, True
        if sl.request in chunks:
            tok[i], pre[i], cmask[i] = chunks[sl.request], sl.kv_tokens, True
            emits[i] = chunks[sl.request] == sl.prefill_left
    return Batch(ctx, dmask, tok, pre, cmask, emits)


def _passes(batch: Batch, mode: str) -> list:
    if mode != "serial":
        return [batch]
    none_b, none_c = np.zeros_like(batch.decode_mask), np.zeros_like(batch.chunk_mask)
    return [Batch(batch.decode_context, batch.decode_mask, batch.chunk_tokens, batch.chunk_prefix, none_c, none_c),
            Batch(batch.decode_context, none_b, batch.chunk_tokens, batch.chunk_prefix, batch.chunk_mask,
                  batch.chunk_emits)]


def simulate(arrival_us, prompt_tokens, output_tokens, chunk_tokens: int, token_budget: int, kv_capacity_tokens,
             config: BatcherConfig, pass_us, max_iterations: int = 10**6) -> Result:
    """Serve the valid requests (``arrival_us`` sorted whole µs, lengths ints) to the end."""
    arrival, prompt, output = [int(a) for a in arrival_us], [int(p) for p in prompt_tokens], [int(o) for o in output_tokens]
    n = len(arrival)
    caps = [int(c) for c in kv_capacity_tokens]
    used = [0] * len(caps)
    slots = [_Slot(reserved=[0] * len(caps)) for _ in range(config.slots)]
    first, finish, out = [NEVER] * n, [NEVER] * n, [0] * n
    now, admitted, prefill_last, overflow, log, it = 0, 0, False, False, [], 0
    while (admitted < n or any(sl.request >= 0 for sl in slots)) and not overflow and it < max_iterations:
        arrived = bisect.bisect_right(arrival, now)  # requests with arrival <= now
        if not any(sl.request >= 0 for sl in slots) and admitted >= arrived and admitted < n:
            now = arrival[admitted]  # idle: jump to the next arrival
            arrived = bisect.bisect_right(arrival, now)
        # admission: FIFO into free slots (slot order), whole KV reserved, tiers filled in order
        if admitted < arrived and prompt[admitted] + output[admitted] > sum(caps):
            overflow = True  # the head of the queue can never fit: it blocks the queue for good
        for sl in slots:
            if sl.request >= 0 or admitted >= arrived:
                continue
            need = prompt[admitted] + output[admitted]
            if need > sum(caps) - sum(used):
                break
            left = need
            for t in range(len(caps)):
                take = min(left, caps[t] - used[t])
                used[t] += take
                sl.reserved[t] = take
                left -= take
            sl.request, sl.phase = admitted, Phase.PREFILL
            sl.prefill_left, sl.decode_left, sl.kv_tokens = prompt[admitted], output[admitted], 0
            admitted += 1
        decode = [sl.request for sl in slots if sl.phase == Phase.DECODE]
        prefilling = sorted(sl.request for sl in slots if sl.phase == Phase.PREFILL)
        if config.mode == "alternate":
            take_prefill = bool(prefilling) and (not prefill_last or not decode)
            decode, prefilling = ([], prefilling) if take_prefill else (decode, [])
        room = max(token_budget - len(decode), 0)
        chunks = {}
        by_request = {sl.request: sl for sl in slots if sl.request >= 0}
        for q in prefilling:
            c = min(by_request[q].prefill_left, chunk_tokens, room)
            if c > 0:
                chunks[q] = c
                room -= c
        if decode or chunks:
            prefill_last = bool(chunks)
        batch = _batch(slots, decode, chunks)
        us = sum(int(round(float(pass_us(p, 2 * it + k)))) for k, p in enumerate(_passes(batch, config.mode))
                 if p.decode_mask.any() or p.chunk_mask.any())
        log.append(dict(start_us=now, decode=sorted(decode), chunks=chunks, us=us))
        now += us
        it += bool(decode or chunks)  # iterations with work (a stuck queue runs one empty one)
        for sl in slots:
            q = sl.request
            produced = False
            if q in chunks:
                sl.prefill_left -= chunks[q]
                sl.kv_tokens += chunks[q]
                if sl.prefill_left == 0:
                    first[q], sl.phase, produced = now, Phase.DECODE, True
            elif q in decode:
                sl.kv_tokens += 1
                produced = True
            if produced:
                out[q] += 1
                sl.decode_left -= 1
                if sl.decode_left == 0:
                    finish[q] = now
                    used = [u - r for u, r in zip(used, sl.reserved)]
                    slots[slots.index(sl)] = _Slot(reserved=[0] * len(caps))
    overflow = overflow or admitted < n or any(sl.request >= 0 for sl in slots)
    return Result(first, finish, out, it, overflow, log)
