"""Serving-engine iterations per second (issue 11 "Performance"): streams × iterations of
``hbfjax.serve.engine.simulate`` (the named system ``dash`` of ``hbfjax.serve.systems``) against its
plain-Python reference (``hbfjax.serve.reference.serve``) in the same run.

One event is one stream-iteration with work (``ServeOutput.iterations``; the reference's
``Result.iterations``, counted the same way). The reference serves one stream of the same shape,
timed without the JAX calls that draw its routing uniforms (``ServeStep.loop_s``). ``run_cpu_s`` is
the process CPU time of the timed engine run (all threads): on a shared machine, compare it with
``run_s``.

Rows:

* ``serve qwen3 dash``: Qwen3-235B-A22B on DASH with an H100-PCIe, Poisson arrivals at 2 requests/s of
  1,024-token prompts and 128 output tokens (DASH §VI-E: 32 slots, 512-token chunks, 8,192-token
  budget), ``1024 · scale`` streams of ``REQUESTS`` requests.
* ``serve qwen3 dash + reclaim``: the same family with the reclaim part (``hbfjax.serve.parts.reclaim``,
  N = 10^6 reads, windows): its per-block credits' cost per stream-iteration, ``reclaim_overhead`` the ratio
  of its seconds per event to the row without (issue 26: under 1.25). Its reference ratio is against the
  same reference, which has no reclaim.
* ``serve vidur-shape``: the shape of Vidur's measurement (issue 11): dense Llama-3-8B, 32 slots,
  512-token chunks and a 512-token iteration budget (Sarathi's chunk is its budget), 4,096-token
  prompts, 128 output tokens, 1,152 Poisson requests at 77 % of the backlogged throughput of the same
  system — measured in the same run by one stream whose 1,152 requests all arrive at t = 0 (a dense
  model draws no routing, so every backlogged stream is the same). System: DASH with an H100-PCIe
  (the engine's organisation; the 16 GB of weights are replicated in HBM and HBF and read from both,
  prefill KV goes to HBF): stream-iterations/s across all streams, beside Vidur's 6,000–8,700
  iterations/s on this machine.
"""

from __future__ import annotations

import time


from hbfjax import batch, clock
from hbfjax.bench._timing import row, time_family
from hbfjax.serve import reference, systems
from hbfjax.serve.parts.reclaim import ReclaimKnobs
from hbfjax.workload import models
from hbfjax.workload import requests as rq

SEED = 1
SLOTS = 32
REQUESTS = 32  # per stream, Qwen3 row
VIDUR_REQUESTS, VIDUR_LOAD = 1152, 0.77
VIDUR_TOKEN_BUDGET = 512  # Vidur's shape: Sarathi's 512-token chunk is its iteration budget


def _setup(model, arrivals: str, n: int, rate: float, prompt: int, output: int, max_iterations: int, *,
           token_budget: int = systems.TOKEN_BUDGET, reclaim=None) -> systems.Family:
    """DASH serving ``n`` requests of ``prompt`` → ``output`` tokens in 32 slots (``arrivals`` "poisson" at
    ``rate``, or "batch": all at t = 0) with DASH's chunk and ``token_budget``: one family, one point."""
    knobs = rq.RequestKnobs.make(rate_per_s=rate, batch=n, prompt=rq.LengthKnobs.make(prompt),
                                 output=rq.LengthKnobs.make(output))
    sc = systems.Scenario(model=model, requests=rq.RequestsConfig(requests=n, arrivals=arrivals), request_knobs=knobs,
                          slots=SLOTS, token_budget=token_budget, max_iterations=max_iterations, reclaim=reclaim)
    return systems.single("dash", sc)


def _reference(fam: systems.Family, max_iterations=None) -> tuple[float, int]:
    """(seconds per iteration, iterations) of the plain-Python reference on stream 0."""
    res, _, step = reference.serve(0, SEED, fam.points[0], fam.config, max_iterations=max_iterations)
    return step.loop_s / max(res.iterations, 1), res.iterations


def run(scale: float) -> list[dict]:
    rows = []
    streams = max(8, int(1024 * scale))
    qwen = models.preset("qwen3-235b-a22b")
    fam = _setup(qwen, "poisson", REQUESTS, 2.0, 1024, 128, 20_000)
    compile_s, run_s, cpu_s, events = time_family(fam, streams, SEED)
    ref_s, ref_it = _reference(fam)
    rows.append(row(f"serve qwen3 dash poisson {streams}x{REQUESTS}req", events, "stream-iterations", compile_s, run_s,
                    ref_s, streams=streams, run_cpu_s=cpu_s, reference_iterations=ref_it))
    plain_s_per_event = run_s / events
    fam = _setup(qwen, "poisson", REQUESTS, 2.0, 1024, 128, 20_000, reclaim=ReclaimKnobs.make(threshold_reads=1e6))
    compile_s, run_s, cpu_s, events = time_family(fam, streams, SEED)
    rows.append(row(f"serve qwen3 dash + reclaim poisson {streams}x{REQUESTS}req", events, "stream-iterations",
                    compile_s, run_s, ref_s, streams=streams, run_cpu_s=cpu_s,
                    reclaim_overhead=run_s / events / plain_s_per_event))

    llama = models.preset("llama3-8b")
    shape = dict(prompt=4096, output=128, max_iterations=40_000, token_budget=VIDUR_TOKEN_BUDGET)
    t0 = time.perf_counter()
    backlogged = _setup(llama, "batch", VIDUR_REQUESTS, 1.0, **shape)
    backlog = batch.run(backlogged.simulate, 1, SEED, backlogged.points[0], backlogged.config,
                        inputs=backlogged.inputs)
    backlog_s = time.perf_counter() - t0
    makespan_s = float(clock.to_us(backlog.finish).max()) * 1e-6
    capacity = VIDUR_REQUESTS / makespan_s  # requests/s when backlogged
    v_streams = max(4, int(64 * scale))
    fam = _setup(llama, "poisson", VIDUR_REQUESTS, VIDUR_LOAD * capacity, **shape)
    compile_s, run_s, cpu_s, events = time_family(fam, v_streams, SEED)
    ref_s, ref_it = _reference(fam, max_iterations=2_000)
    rows.append(row(f"serve vidur-shape llama3-8b dash {v_streams}x{VIDUR_REQUESTS}req", events, "stream-iterations",
                    compile_s, run_s, ref_s, streams=v_streams, run_cpu_s=cpu_s, backlogged_requests_per_s=capacity,
                    rate_per_s=VIDUR_LOAD * capacity, backlog_run_s=backlog_s, reference_iterations=ref_it,
                    vidur_iterations_per_s=(6000, 8700)))
    return rows
