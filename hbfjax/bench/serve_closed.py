"""Closed-loop serving at 64, 256 and 1,024 slots (issue 23): what a slot costs as the operating point
grows to HBFlex's 1,024 agent tasks per GPU (HBFlex §6.3), against the plain-Python references in the
same run.

One event is one stream-iteration with work; ``us_per_slot_iteration`` is the engine's wall time per
stream-iteration and slot. Rows (``T`` = tasks = slots, SWE-bench sessions in a closed loop, their
recorded gaps as think times, 512-token chunks and an 8,192-token budget):

* ``serve-closed batcher``: the batcher alone (``batching.rollout`` with a pass time of 20 ms + 2 µs per
  token, about a DeepSeek-V3 iteration on the HBFlex package), ``streams`` streams of T × 3 turns to the end, against
  ``reference.simulate`` on stream 0 with the same pass time;
* ``serve-closed hbflex``: the whole engine, HBFlex's every part on DeepSeek-V3 and the H200 package (the
  real KV room: what the weights leave), each stream capped at ``ITERATIONS`` iterations with work
  (its requests are left unfinished: the row times iterations, not requests), against
  ``hbflex_reference.serve`` on stream 0 with the same cap (timed without its JAX hashes).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import traces
from hbfjax.bench._timing import row, time_compiled, time_serving
from hbfjax.serve import batching, hbflex_reference, reference, systems
from hbfjax.serve.state import BatcherConfig
from hbfjax.workload import requests as rq

SEED = 1
TRACE = "swebench_miniswe_agent.csv"
TURNS = 3
ITERATIONS = 200  # engine rows: iterations with work per stream
SLOT_COUNTS = (64, 256, 1024)


def _pass_us(b, draw=0):
    """20 ms + 2 µs per token of the pass (whole µs: the reference's clock is exact): about a DeepSeek-V3
    iteration on the HBFlex package, so that requests overlap as they do in serving (with µs passes each
    request would run alone between the seconds-long thinks, a million iterations a stream)."""
    return 20_000.0 + 2.0 * (b.decode_mask.sum() + (b.chunk_tokens * b.chunk_mask).sum())


def _scenario(inputs, tasks: int, **changes) -> systems.Scenario:
    return systems.Scenario.closed_loop("deepseek-v3", tasks, TURNS, trace=inputs, warmup_turns=0, **changes)


def _batcher_row(inputs, tasks: int, streams: int) -> dict:
    sc = _scenario(inputs, tasks)
    config = BatcherConfig(slots=sc.slots, tasks=tasks)
    knobs = sc.batcher_knobs

    def one(stream, seed):
        reqs = rq.generate(stream, seed, sc.request_knobs, inputs, sc.requests)
        st = batching.rollout(reqs, knobs, config, _pass_us, 1_000_000)
        return st.iterations, st.overflow, reqs

    fn = jax.jit(jax.vmap(one, in_axes=(0, None)))
    ids = jnp.arange(streams, dtype=jnp.int32)
    compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(SEED)), repeats=1)
    iterations, overflow, reqs = fn(ids, jnp.uint32(SEED))
    assert not np.asarray(overflow).any(), "a batcher stream overflowed"
    events = int(np.asarray(iterations).sum())
    first = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], reqs)
    t0 = time.perf_counter()
    ref = reference.simulate(np.asarray(first.arrival.us[:tasks]) + 1e6 * np.asarray(first.arrival.s[:tasks]),
                             first.prompt_tokens, first.output_tokens, sc.chunk_tokens, sc.token_budget,
                             (2**30, 0), config, pass_us=_pass_us, think_us=np.asarray(first.think_us).tolist())
    ref_s = (time.perf_counter() - t0) / max(ref.iterations, 1)
    return row(f"serve-closed batcher swebench {streams}x{tasks}tasks {sc.slots}slots", events, "stream-iterations",
               compile_s, run_s, ref_s, streams=streams, slots=sc.slots,
               us_per_slot_iteration=run_s / events / sc.slots * 1e6, reference_iterations=ref.iterations)


def _engine_row(inputs, tasks: int, streams: int) -> dict:
    fam = systems.single("hbflex", _scenario(inputs, tasks, max_iterations=ITERATIONS))
    compile_s, run_s, cpu_s, out, valid = time_serving(fam.simulate, fam.config, fam.points[0], fam.inputs, streams,
                                                       SEED)
    events = int(np.asarray(out.iterations)[valid].sum())
    res, _, step = hbflex_reference.serve(0, SEED, fam.points[0], fam.config, fam.inputs, max_iterations=ITERATIONS)
    ref_s = step.loop_s / max(res.iterations, 1)
    return row(f"serve-closed hbflex deepseek-v3 swebench {streams}x{tasks}tasks {fam.config.batcher.slots}slots",
               events, "stream-iterations", compile_s, run_s, ref_s, streams=streams, slots=fam.config.batcher.slots,
               run_cpu_s=cpu_s, us_per_slot_iteration=run_s / events / fam.config.batcher.slots * 1e6,
               reference_iterations=res.iterations, reference_s_per_iteration=ref_s)


def run(scale: float) -> list[dict]:
    inputs = rq.TraceInputs.from_trace(traces.load_trace(TRACE))
    streams = max(2, int(32 * scale))
    rows = [_batcher_row(inputs, t, streams) for t in SLOT_COUNTS]
    rows += [_engine_row(inputs, t, max(2, int(8 * scale))) for t in SLOT_COUNTS]
    return rows
