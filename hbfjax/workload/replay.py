"""Trace replay: a trace's requests as the inputs a simulation consumes (DESIGN.md §5 "Requests").

* ``kv_trace_requests``: requests as tick arrays with session lifetimes, for the KV-lifetime block
  workload (HBFlex §5.4).
* ``session_replay``: an iteration-level batching replay of agent sessions giving per-iteration decode
  requests and prefill tokens (HBFlex Fig. 13c); a NumPy stand-in until the serving engine exists.
"""

from __future__ import annotations

import numpy as np

from hbfjax.traces import Trace


def kv_trace_requests(trace: Trace, ticks: int, physical_pages: int, pages_per_tick: int, fill: float = 0.8,
                      tpot_s: float = 0.05, keep_s: float = 0.0) -> tuple[dict, dict]:
    """Trace requests as tick arrays for ``KvInputs.make(...)``, scaled to a simulated device of
    ``physical_pages`` over a run of ``ticks`` ticks (each request programs ``pages_per_tick`` per tick).

    A request's KV is its new tokens (input − reused prefix + output); it lives from arrival until
    its session's last turn has finished decoding (descendants reuse it; HBFlex §5.4), plus
    ``keep_s``. Its label comes from the session root's arrival. The run's ticks span the whole
    trace; tokens per page are chosen so that by Little's law the mean live KV is ``fill`` of the
    device (real KV is far larger than a test device; only the mix of lifetimes matters for WAF).
    Returns (arrays, scale facts).
    """
    arrival = np.asarray(trace.arrival_s, np.float64)
    order = np.argsort(arrival, kind="stable")
    done = arrival + np.asarray(trace.output_tokens) * tpot_s
    session = np.asarray(trace.session)
    session_end = np.zeros(len(arrival))
    np.maximum.at(session_end, session, done)
    life_s = np.maximum(session_end[session] - arrival, 0.0) + keep_s
    tokens = np.maximum(np.asarray(trace.input_tokens) - np.asarray(trace.prefix_tokens), 0) \
        + np.asarray(trace.output_tokens)
    duration = max(float(arrival.max()), 1e-9)
    tick_s = duration / ticks
    life_ticks = np.maximum(np.ceil(life_s / tick_s), 1).astype(np.int64)
    live_token_ticks = float((tokens * life_ticks).sum()) / ticks
    tokens_per_page = max(live_token_ticks / (fill * physical_pages), 1e-9)
    pages = np.maximum(np.ceil(tokens / tokens_per_page), 1).astype(np.int64)
    life_ticks = np.maximum(life_ticks, -(-pages // pages_per_tick))
    root_tick = np.floor(arrival[session] / tick_s).astype(np.int64)
    arrays = {"arrival_tick": np.floor(arrival[order] / tick_s).astype(np.int64), "life_ticks": life_ticks[order],
              "pages": pages[order], "root_tick": root_tick[order]}
    return arrays, {"tick_s": tick_s, "tokens_per_page": tokens_per_page, "requests": len(arrival)}


def _turns(t: Trace):
    """Per turn in session order: new prompt tokens, output tokens, gap to the next turn (−1 last), session starts."""
    order = np.lexsort((t.arrival_s, t.session))
    sess, arr = t.session[order], t.arrival_s[order]
    new_in = np.maximum(t.input_tokens - t.prefix_tokens, 1)[order]
    out = np.maximum(t.output_tokens, 1)[order]
    same = np.r_[sess[1:] == sess[:-1], False]
    gap = np.where(same, np.r_[np.diff(arr), 0.0], -1.0)  # −1: last turn of its session
    starts = np.flatnonzero(np.r_[True, sess[1:] != sess[:-1]])
    return new_in, out, gap, starts


def session_replay(trace: Trace, concurrency: int, streams: int, seed: int, *, iterations: int, warmup: int,
                   iteration_s: float, chunk_tokens: int) -> dict:
    """An iteration-level batching replay of agent sessions (NumPy; HBFlex §5.3, Fig. 13c).

    ``concurrency`` tasks per stream each replay ``trace`` sessions turn by turn: a turn arrives no
    earlier than the trace's gap after the previous turn's arrival and not before that turn finished;
    it is prefilled in ``chunk_tokens`` chunks (one per waiting request per iteration of
    ``iteration_s``), then decodes one token per iteration.
    ``intervals``: per stream, the decode tokens of every interval between consecutive prefill iterations
    (after warm-up); ``decode_requests`` and ``prefill_tokens`` [streams, iterations]: the per-iteration
    inputs a writeback rollout takes (``hbfjax.flash.programs.writeback.rollout``)."""
    new_in, out, gap, starts = _turns(trace)
    rng = np.random.default_rng(seed)
    shape = (streams, concurrency)
    turn = rng.integers(0, new_in.size, shape)  # start anywhere in a session
    phase = np.zeros(shape, np.int8)  # 0 waiting, 1 prefill, 2 decode
    remaining = np.zeros(shape, np.int64)
    next_s = rng.uniform(0, 5.0, shape)
    arrival = np.zeros(shape)
    acc = np.zeros(streams, np.int64)
    intervals = [[] for _ in range(streams)]
    dec_it = np.zeros((streams, iterations), np.float32)
    pre_it = np.zeros((streams, iterations), np.float32)
    for k in range(iterations):
        t = k * iteration_s
        arrive = (phase == 0) & (next_s <= t)
        phase[arrive], remaining[arrive], arrival[arrive] = 1, new_in[turn[arrive]], t
        decoding = phase == 2
        prefilling = phase == 1
        acc += decoding.sum(axis=1)
        opportunity = prefilling.any(axis=1)
        dec_it[:, k] = decoding.sum(axis=1)
        pre_it[:, k] = np.where(prefilling, np.minimum(remaining, chunk_tokens), 0).sum(axis=1)
        remaining[decoding] -= 1
        remaining[prefilling] -= chunk_tokens
        to_decode = prefilling & (remaining <= 0)
        phase[to_decode], remaining[to_decode] = 2, out[turn[to_decode]]
        done = decoding & (remaining <= 0)
        g = gap[turn]
        more = done & (g >= 0)
        next_s[more] = np.maximum(t, arrival[more] + g[more])
        turn[more] += 1
        fresh = done & (g < 0)  # session over: the task starts a random new session
        turn[fresh] = starts[rng.integers(0, starts.size, int(fresh.sum()))]
        next_s[fresh] = t
        phase[done] = 0
        if k >= warmup:
            for s in np.flatnonzero(opportunity):
                intervals[s].append(acc[s])
        acc[opportunity] = 0
    return {"intervals": [np.asarray(v) for v in intervals], "decode_requests": dec_it, "prefill_tokens": pre_it}
