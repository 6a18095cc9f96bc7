"""Shared by the HBFlex serving figures (Table 2, Fig. 15, Fig. 16, Fig. 19 in serving): the six
organisations served as ``hbfjax serve --system hbflex ...`` serves them (the named systems of
``hbfjax.serve.systems`` on a replay ``Scenario``: one family, one compilation), on the real traces,
every point of a (model, trace) pair on common random numbers, and the per-point summaries (each
system's report, ``Family.report``).

Which of our traces stands in for which of the paper's (HBFlex §6.1 used four Alibaba Bailian traces we
do not have, and SWE-bench traces of its own):

* ``swebench_miniswe_agent.csv`` — SWE-bench agent sessions (the paper's SWE-bench traces; Table 2's and
  Fig. 16's workload);
* ``mooncake_conversation.jsonl`` — multi-turn conversations with prefix trees (Bailian To-C);
* ``azure_llm_2023_code.csv`` — code completions, single-turn (Bailian Coding).
No trace of ours stands in for Bailian To-B or Thinking.
"""

from __future__ import annotations



import jax
import numpy as np

from hbfjax import traces
from hbfjax.serve import systems
from hbfjax.sweep import families
from hbfjax.workload import requests as rq

MODELS = ("deepseek-v4-pro", "deepseek-v3", "hunyuan", "qwen3-235b-a22b")  # HBFlex §6.1
# HBFlex §6.1: "DeepSeek-V4-Pro uses two-way tensor parallelism (TP) combined with four-way data parallelism
# (DP), while the other models use four-way DP": a V4-Pro stream is a group of two GPUs (one package each)
TENSOR_PARALLEL = {"deepseek-v4-pro": 2}

TRACES = {"swebench": "swebench_miniswe_agent.csv", "mooncake": "mooncake_conversation.jsonl",
          "azure-code": "azure_llm_2023_code.csv"}
STANDS_IN_FOR = {"swebench": "SWE-bench", "mooncake": "Bailian To-C", "azure-code": "Bailian Coding"}
BASELINES = ("naive-hbf", "h3", "fa-cli", "fa-csi", "is")
ORGANISATIONS = ("hbflex",) + BASELINES
# every call's tabulated wave laws padded to this many points' worth (the most points of any HBFlex serving
# figure: fig_hbflex15's six organisations), so that the figures' calls share compilations
LAW_PAD = len(ORGANISATIONS)


def tensor_parallel(model: str) -> int:
    """The paper's tensor-parallel degree of ``model`` (HBFlex §6.1; 1 for every model but V4-Pro)."""
    return TENSOR_PARALLEL.get(model, 1)


def deployment_note(models) -> str:
    """The figure note's statement of the paper's deployment of ``models``."""
    split = [m for m in models if tensor_parallel(m) > 1]
    if not split:
        return "one GPU and package per stream (HBFlex §6.1's data parallelism)"
    return (", ".join(f"{m} with tensor parallelism {tensor_parallel(m)}" for m in split) + " (HBFlex §6.1: a stream "
            "is a group of GPUs with a package each, each holding 1/T of the head- and FFN-split weights, with two "
            "all-reduces a layer over NVLink, 450 GB/s each way, at an assumed 0.8 efficiency + 10 µs; tokens/s per "
            "stream), every other model one GPU a stream")


def trace_inputs(key: str, requests: int | None) -> rq.TraceInputs:
    """The trace ``key`` as arrays (its first ``requests`` requests; None: all of it)."""
    return rq.TraceInputs.from_trace(traces.load_trace(TRACES[key]), requests)


def scenario(model: str, inputs: rq.TraceInputs, *, slots: int, requests: int, replay: str = "offset",
             concurrency: float | None = None, max_iterations: int = 200_000, scan_chunk: int = 16,
             **changes) -> systems.Scenario:
    """A trace replayed as ``hbfjax serve --trace`` replays it (with ``concurrency``: its sessions
    bootstrapped at the start rate that keeps that many open); ``changes``: other Scenario fields
    (warmup, kv_room_bytes, ...). HBFlex's systems use their 1-byte KV elements and the H200; the model its
    paper's tensor parallelism (:data:`TENSOR_PARALLEL`)."""
    return systems.Scenario.replay(model, inputs, requests, slots=slots, replay=replay, concurrency=concurrency,
                                   max_iterations=max_iterations, scan_chunk=scan_chunk,
                                   **{"tensor_parallel": tensor_parallel(model), **changes})


def closed_scenario(model: str, inputs: rq.TraceInputs, *, tasks: int, turns: int, warmup_turns: int,
                    max_iterations: int = 200_000, scan_chunk: int = 16, **changes) -> systems.Scenario:
    """``tasks`` agent tasks per GPU running the trace's sessions in a closed loop, as ``hbfjax serve --trace
    ... --tasks`` runs them (slots = tasks up to 1,024, the real KV room unless ``changes`` set one; the model's
    paper tensor parallelism, :data:`TENSOR_PARALLEL`)."""
    return systems.Scenario.closed_loop(model, tasks, turns, trace=inputs, warmup_turns=warmup_turns,
                                        max_iterations=max_iterations, scan_chunk=scan_chunk,
                                        **{"tensor_parallel": tensor_parallel(model), **changes})


def family(names, sc: systems.Scenario) -> systems.Family:
    """The named organisations serving ``sc`` as one family (one compilation)."""
    (fam,) = systems.families(names, sc)
    return fam


def run(fam: systems.Family, streams: int, seed: int, split: bool | None = None) -> list:
    """One output per point on common random numbers and one compilation (split into knob axes of one on
    a CPU: a vmapped rollout runs until its slowest lane stops; see ``_dash_serving.run``)."""
    split = jax.default_backend() == "cpu" if split is None else split
    return families.run_outputs(fam, streams, seed, split=split, pad_to=max(LAW_PAD, len(fam.points)))


def summaries(fam: systems.Family, outs: list) -> list[dict]:
    """Each point's report (request metrics with CIs, the HBF keys of its parts, iterations_mean, overflow)."""
    return [fam.report(o, k) for k, o in enumerate(outs)]


def row(summ: dict, keys=("throughput_tokens_per_s", "ttft_s", "tpot_ms")) -> dict:
    """The keys a figure table keeps (with CIs where the summary has them)."""
    out = {}
    for k in keys:
        out[k] = summ.get(k, np.nan)
        if f"ci95_{k}" in summ:
            out[f"ci95_{k}"] = summ[f"ci95_{k}"]
    return out
