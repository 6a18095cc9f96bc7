"""HBFlex serving-engine iterations per second (issue 12): streams × iterations of
``hbfjax.serve.hbflex_system.simulate`` against its plain-Python reference
(``hbfjax.serve.hbflex_reference.serve``) in the same run.

One event is one stream-iteration with work (``ServeOutput.iterations``; the reference's
``Result.iterations``, counted the same way). Row ``serve-hbflex deepseek-v3 swebench``: DeepSeek-V3
(1-byte KV elements, HBFlex §6.1) on the HBFlex package with an H200, the SWE-bench agent trace
replayed at its own rate (``offset`` replay: streams differ in phase), 64 slots, 512-token chunks and
an 8,192-token budget (``experiments/_hbflex_serving``), ``256 · scale`` streams of ``REQUESTS``
requests, compile time apart. The reference serves stream 0 to the end, timed without its JAX calls
(wave and routing hashes, the block store: ``loop_s``).
``run_cpu_s`` is the process CPU time of the timed engine run (all threads).
"""

from __future__ import annotations


import numpy as np

from hbfjax import traces
from hbfjax.bench._timing import row, time_serving
from hbfjax.memory import hbf_packages
from hbfjax.serve import hbflex_reference, hbflex_system, system
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import models, timing
from hbfjax.workload import requests as rq

SEED = 1
REQUESTS = 64  # per stream
SLOTS, CHUNK_TOKENS, TOKEN_BUDGET = 64, 512, 8192
TRACE = "swebench_miniswe_agent.csv"
MAX_ITERATIONS = 50_000


def setup():
    """(config, knobs, trace inputs) of the row."""
    spec = models.preset("deepseek-v3").with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
    serve = system.ServeConfig(model=spec, batcher=BatcherConfig(slots=SLOTS),
                               requests=rq.RequestsConfig(requests=REQUESTS, arrivals="trace", replay="offset"),
                               max_pass_tokens=system.pass_token_bound(SLOTS, CHUNK_TOKENS, TOKEN_BUDGET),
                               max_iterations=MAX_ITERATIONS)
    config = hbflex_system.HbflexConfig(serve=serve)
    knobs = hbflex_system.HbflexKnobs.make(hbf_packages.package("hbflex"), timing.GpuKnobs.make("h200"),
                                           BatcherKnobs.make(chunk_tokens=CHUNK_TOKENS, token_budget=TOKEN_BUDGET),
                                           rq.RequestKnobs.make())
    inputs = rq.TraceInputs.from_trace(traces.load_trace(TRACE), REQUESTS)
    return config, knobs, inputs


def _timed(config, knobs, inputs, streams: int):
    """(compile_s, run_s, run_cpu_s, stream-iterations) of ``streams`` streams."""
    compile_s, run_s, cpu_s, out, valid = time_serving(hbflex_system.simulate, config, knobs, inputs, streams, SEED)
    assert not np.asarray(out.serve.overflow)[valid].any(), "a stream overflowed: raise MAX_ITERATIONS"
    return compile_s, run_s, cpu_s, int(np.asarray(out.serve.iterations)[valid].sum())


def run(scale: float) -> list[dict]:
    streams = max(4, int(256 * scale))
    config, knobs, inputs = setup()
    compile_s, run_s, cpu_s, events = _timed(config, knobs, inputs, streams)
    res, _, step = hbflex_reference.serve(0, SEED, knobs, config, inputs)
    assert not res.overflow, "the reference's stream overflowed"
    ref_s = step.loop_s / max(res.iterations, 1)
    return [row(f"serve-hbflex deepseek-v3 hbflex swebench {streams}x{REQUESTS}req {SLOTS}slots", events,
                "stream-iterations", compile_s, run_s, ref_s, streams=streams, run_cpu_s=cpu_s,
                reference_iterations=res.iterations, reference_s_per_iteration=ref_s,
                target_speedup=50.0)]
