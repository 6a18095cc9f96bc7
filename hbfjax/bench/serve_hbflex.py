"""HBFlex serving-engine iterations per second (issue 12): streams × iterations of
``hbfjax.serve.engine.simulate`` on the named system ``hbflex`` (``hbfjax.serve.systems``: every part)
against its plain-Python reference (``hbfjax.serve.hbflex_reference.serve``) in the same run.

One event is one stream-iteration with work (``ServeOutput.iterations``; the reference's
``Result.iterations``, counted the same way). Row ``serve-hbflex deepseek-v3 swebench``: DeepSeek-V3
(1-byte KV elements, HBFlex §6.1) on the HBFlex package with an H200, the SWE-bench agent trace replayed
at its own rate (``offset`` replay: streams differ in phase), 64 slots, 512-token chunks and an
8,192-token budget (the scenario's Sarathi defaults, as ``experiments/_hbflex_serving``), ``256 · scale``
streams of ``REQUESTS`` requests, compile time apart. The reference serves stream 0 to the end, timed
without its JAX calls (wave and routing hashes, the block store: ``loop_s``).
``run_cpu_s`` is the process CPU time of the timed engine run (all threads).

Row ``... + read disturb``: the same family with ``--read-disturb-reads 10^6`` (issue 26): the reclaim part's
weight credits and the blocks part's KV read counters on the sampled planes; ``read_disturb_overhead`` the
ratio of its seconds per event to the row without (issue 26: under 1.25). Its reference ratio is against
the same reference, which counts no reads.
"""

from __future__ import annotations


from hbfjax import traces
from hbfjax.bench._timing import row, time_family
from hbfjax.serve import systems
from hbfjax.serve.parts.reclaim import ReclaimKnobs
from hbfjax.workload import requests as rq

SEED = 1
REQUESTS = 64  # per stream
SLOTS = 64
TRACE = "swebench_miniswe_agent.csv"
MAX_ITERATIONS = 50_000


def setup(reclaim=None) -> systems.Family:
    """The row's family: HBFlex serving the trace replayed at its own rate (offset replay), one point
    (``reclaim``: ReclaimKnobs, read disturb counted)."""
    import dataclasses

    inputs = rq.TraceInputs.from_trace(traces.load_trace(TRACE), REQUESTS)
    sc = systems.Scenario.replay("deepseek-v3", inputs, REQUESTS, slots=SLOTS, replay="offset",
                                 max_iterations=MAX_ITERATIONS)
    sc = sc if reclaim is None else dataclasses.replace(sc, reclaim=reclaim)
    return systems.single("hbflex", sc)


def run(scale: float) -> list[dict]:
    from hbfjax.serve import hbflex_reference

    streams = max(4, int(256 * scale))
    fam = setup()
    compile_s, run_s, cpu_s, events = time_family(fam, streams, SEED)
    res, _, step = hbflex_reference.serve(0, SEED, fam.points[0], fam.config, fam.inputs)
    assert not res.overflow, "the reference's stream overflowed"
    ref_s = step.loop_s / max(res.iterations, 1)
    name = f"serve-hbflex deepseek-v3 hbflex swebench {streams}x{REQUESTS}req {SLOTS}slots"
    rows = [row(name, events, "stream-iterations", compile_s, run_s, ref_s, streams=streams, run_cpu_s=cpu_s,
                reference_iterations=res.iterations, reference_s_per_iteration=ref_s, target_speedup=50.0)]
    plain_s_per_event = run_s / events
    compile_s, run_s, cpu_s, events = time_family(setup(ReclaimKnobs.make(threshold_reads=1e6)), streams, SEED)
    rows.append(row(f"{name} + read disturb", events, "stream-iterations", compile_s, run_s, ref_s, streams=streams,
                    run_cpu_s=cpu_s, read_disturb_overhead=run_s / events / plain_s_per_event))
    return rows
