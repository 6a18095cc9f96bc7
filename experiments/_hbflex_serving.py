"""Shared by the HBFlex serving figures (Table 2, Fig. 15, Fig. 16, Fig. 19 in serving): the six
organisations served as ``hbfjax serve --system hbflex ...`` serves them, on the real traces, every point of a (model, trace) pair on common random numbers, and the
per-point summaries.

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

from hbfjax import batch, traces
from hbfjax.memory import hbf_packages
from hbfjax.serve import hbflex_system, metrics, system
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import models, timing
from hbfjax.workload import requests as rq

GPU = "h200"  # HBFlex §6.1: H200-class accelerators
CHUNK_TOKENS, TOKEN_BUDGET = 512, 8192  # Sarathi defaults (HBFlex does not state its own)
MODELS = ("deepseek-v4-pro", "deepseek-v3", "hunyuan", "qwen3-235b-a22b")  # HBFlex §6.1
TRACES = {"swebench": "swebench_miniswe_agent.csv", "mooncake": "mooncake_conversation.jsonl",
          "azure-code": "azure_llm_2023_code.csv"}
STANDS_IN_FOR = {"swebench": "SWE-bench", "mooncake": "Bailian To-C", "azure-code": "Bailian Coding"}
BASELINES = ("naive-hbf", "h3", "fa-cli", "fa-csi", "is")
ORGANISATIONS = ("hbflex",) + BASELINES


def packages() -> dict[str, hbf_packages.Package]:
    """The six organisations of a (model, trace) pair (Table 2 builds its own ablation stages)."""
    return {name: hbf_packages.package(name) for name in ORGANISATIONS}


def config(model: str, *, slots: int, requests: int, replay: str = "offset", max_iterations: int = 200_000,
           scan_chunk: int = 16) -> hbflex_system.HbflexConfig:
    """An HbflexConfig as ``hbfjax serve`` builds it, at HBFlex's 1-byte KV elements."""
    spec = models.preset(model).with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
    serve = system.ServeConfig(model=spec, batcher=BatcherConfig(slots=slots),
                               requests=rq.RequestsConfig(requests=requests, arrivals="trace", replay=replay),
                               max_pass_tokens=system.pass_token_bound(slots, CHUNK_TOKENS, TOKEN_BUDGET),
                               max_iterations=max_iterations, scan_chunk=scan_chunk)
    return hbflex_system.HbflexConfig(serve=serve)


def knobs(package: hbf_packages.Package, requests: rq.RequestKnobs, kv_room_bytes: float | None = None):
    return hbflex_system.HbflexKnobs.make(package, timing.GpuKnobs.make(GPU),
                                          BatcherKnobs.make(chunk_tokens=CHUNK_TOKENS, token_budget=TOKEN_BUDGET),
                                          requests, kv_room_bytes=kv_room_bytes)


def trace_inputs(key: str, requests: int) -> rq.TraceInputs:
    return rq.TraceInputs.from_trace(traces.load_trace(TRACES[key]), requests)


def run(points: list, cfg, streams: int, seed: int, inputs, split: bool | None = None) -> list:
    """One output per point on common random numbers and one compilation (split into knob axes of one on
    a CPU: a vmapped rollout runs until its slowest lane stops; see ``_dash_serving.run``)."""
    split = jax.default_backend() == "cpu" if split is None else split
    groups = [[p] for p in points] if split else [points]
    outs = []
    for group in groups:
        out = batch.run(hbflex_system.simulate, streams, seed, batch.stack_knobs(group), cfg, knob_axis=True,
                        inputs=inputs)
        outs += [jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) for k in range(len(group))]
    return outs


def summary(out, warmup: int) -> dict:
    """Request metrics (means and CIs) and the HBF keys of one point's output."""
    s = metrics.summary(metrics.times(out.serve.arrival, out.serve.first_token, out.serve.finish,
                                      out.serve.tokens_out, out.serve.valid), warmup)
    extra = hbflex_system.report(out)
    s.update({k: float(np.mean(v)) for k, v in extra.items()})
    s["overflow"] = bool(np.any(out.serve.overflow))
    s["iterations_mean"] = float(np.mean(out.serve.iterations))
    return s


def row(summ: dict, keys=("throughput_tokens_per_s", "ttft_s", "tpot_ms")) -> dict:
    """The keys a figure table keeps (with CIs where the summary has them)."""
    out = {}
    for k in keys:
        out[k] = summ.get(k, np.nan)
        if f"ci95_{k}" in summ:
            out[f"ci95_{k}"] = summ[f"ci95_{k}"]
    return out



