"""Requests generated per second: S streams × 1,152 requests (DASH §VI-E: 128 warm-up + 1,024 measured).

Two rows: Poisson arrivals with lognormal prompt and output lengths, and the Mooncake conversation
trace replayed from a random phase per stream (``offset``; its sessions remapped), or, without the
trace file, a synthetic trace of the same size with sessions. On a CPU the streams go through the
compiled function 256 at a time inside one ``lax.map``; on a GPU all at once. The references do the same work the
plain NumPy way, vectorised over all streams at once: ``numpy.random`` exponential gaps cumulated in
int64 µs and lognormal lengths; for the replay, a phase per stream, the rotated gather, the parent
shift and the session roots by pointer jumping on (S, R) arrays.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from hbfjax import batch, traces
from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.workload import requests as rq

REQUESTS = 1152
RATE_PER_S = 5.0
PROMPT = dict(median=4096.0, sigma=0.8)
OUTPUT = dict(median=128.0, sigma=1.0)
TRACE = "mooncake_conversation.jsonl"
CPU_CHUNK_STREAMS = 256  # streams per lax.map step on a CPU (1.5x faster than one vmap over 1,024)


def _poisson_reference(streams: int, gen: np.random.Generator):
    gaps = np.rint(gen.exponential(1e6 / RATE_PER_S, (streams, REQUESTS))).astype(np.int64)
    arrival = np.cumsum(gaps, axis=1)
    lengths = [np.clip(np.rint(gen.lognormal(math.log(p["median"]), p["sigma"], (streams, REQUESTS))), 1, rq.MAX_TOKENS)
               for p in (PROMPT, OUTPUT)]
    return arrival, lengths


def _trace() -> traces.Trace:
    try:
        return traces.load_trace(TRACE)
    except traces.TraceMissing:  # same size, sessions of about four turns
        gen = np.random.default_rng(0)
        n = 12_031
        parent = np.where(gen.random(n) < 0.75, np.arange(n) - gen.integers(1, 20, n), -1)
        parent[parent < 0] = -1
        session = np.arange(n)
        for i in np.flatnonzero(parent >= 0):
            session[i] = session[parent[i]]
        return traces.Trace("synthetic", np.cumsum(gen.exponential(0.3, n)) - 0.3, gen.integers(1, 20_000, n),
                            gen.integers(1, 1000, n), session, parent, np.zeros(n, np.int64))


def _replay_reference(arrival_us, parent, prefix, prompt, output, period_us, streams, gen):
    n = arrival_us.size
    phase = np.floor(gen.random(streams) * period_us).astype(np.int64)
    k = np.searchsorted(arrival_us, phase, side="left")
    j = np.arange(REQUESTS)
    src = (k[:, None] + j) % n
    t = arrival_us[src] - phase[:, None] + np.where(src < k[:, None], period_us, 0)
    p_src = parent[src]
    par = np.where(p_src >= 0, j - (src - p_src), -1)
    orphan = (p_src >= 0) & (par < 0)
    par = np.where(orphan, -1, par)
    up = np.where(par >= 0, par, j)
    for _ in range(math.ceil(math.log2(REQUESTS))):
        up = np.take_along_axis(up, up, axis=1)
    return t, par, up, np.where(orphan, 0, prefix[src]), prompt[src], output[src], np.take_along_axis(t, up, axis=1)


def run(scale: float) -> list[dict]:
    streams = max(64, int(1024 * scale))
    gen = np.random.default_rng(0)
    map_streams = batch.cpu_map_streams(CPU_CHUNK_STREAMS)
    fn = batch.compiled(rq.generate, map_streams=map_streams)
    ids = batch.stream_ids(0, streams, map_streams or 1)
    rows = []

    config = rq.RequestsConfig(requests=REQUESTS, arrivals="poisson", prompt_lengths="lognormal",
                               output_lengths="lognormal")
    knobs = rq.RequestKnobs.make(rate_per_s=RATE_PER_S, prompt=rq.LengthKnobs.make(**PROMPT),
                                 output=rq.LengthKnobs.make(**OUTPUT))
    compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), knobs, None, config))
    ref_s = time_reference(lambda: _poisson_reference(streams, gen)) / (streams * REQUESTS)
    rows.append(row(f"requests poisson+lognormal {streams}x{REQUESTS}", streams * REQUESTS, "requests", compile_s,
                    run_s, ref_s, streams=streams, map_streams=map_streams))

    trace = _trace()
    inputs = rq.TraceInputs.from_trace(trace)
    config = rq.RequestsConfig(requests=REQUESTS, arrivals="trace", replay="offset")
    compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), rq.RequestKnobs.make(), inputs, config))
    arrival_us = np.rint(trace.arrival_s * 1e6).astype(np.int64)
    period_us = int(np.asarray(inputs.period.s)) * 1_000_000 + int(np.asarray(inputs.period.us))
    args = (arrival_us, trace.parent, trace.prefix_tokens, trace.input_tokens, trace.output_tokens, period_us)
    ref_s = time_reference(lambda: _replay_reference(*args, streams, gen)) / (streams * REQUESTS)
    rows.append(row(f"requests replay offset {trace.name} {streams}x{REQUESTS}", streams * REQUESTS, "requests",
                    compile_s, run_s, ref_s, streams=streams, map_streams=map_streams, trace_requests=len(trace)))
    return rows
