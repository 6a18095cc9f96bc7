"""Shared by the DASH online and long-run figures (Table III, Fig. 12 at system level, §VI-H): a serving
run assembled as ``hbfjax serve`` assembles it (organisations stacked on one knob axis, one
``batch.run``), its per-point summaries, and the engine's per-stream totals where it reports them."""

from __future__ import annotations

import math

import jax
import numpy as np

from hbfjax import batch
from hbfjax.memory import organisations as orgs
from hbfjax.serve import metrics, system
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import models, timing
from hbfjax.workload import requests as rq

GPU = "h100-pcie"  # DASH §VI-A: H100 PCIe 80 GB
CHUNK_TOKENS, TOKEN_BUDGET = 512, 8192  # DASH §VI-E
# ServeOutput.totals (per-stream float32 totals), once the engine reports them
TOTALS = ("busy_us", "prefill_write_bytes", "writeback_bytes", "write_stall_us", "program_busy_us",
          "expert_direct_bytes", "expert_relay_bytes", "max_kv_hbm_bytes", "max_kv_hbf_bytes")


def config(model: str, *, slots: int, requests: int, arrivals: str, mode: str = "mixed",
           routing_kind: str = "uniform", max_iterations: int = 100_000, scan_chunk: int = 64) -> system.ServeConfig:
    """A ServeConfig as ``hbfjax serve`` builds it (pass tokens = min(budget, slots·(1 + chunk)));
    balanced routing draws through ``routing_draw = "tokens"`` (its rows are closed form, no per-token
    draws, so it costs about what the count draw costs)."""
    draw = "counts" if routing_kind == "uniform" else "tokens"
    return system.ServeConfig(model=models.preset(model), batcher=BatcherConfig(slots=slots, mode=mode),
                              requests=rq.RequestsConfig(requests=requests, arrivals=arrivals),
                              max_pass_tokens=system.pass_token_bound(slots, CHUNK_TOKENS, TOKEN_BUDGET),
                              routing_kind=routing_kind, routing_draw=draw, max_iterations=max_iterations,
                              scan_chunk=scan_chunk)


def request_knobs(prompt: int, output: int, *, rate_per_s: float = 1.0, batch_size: int = 1) -> rq.RequestKnobs:
    return rq.RequestKnobs.make(rate_per_s=rate_per_s, batch=batch_size, prompt=rq.LengthKnobs.make(prompt),
                                output=rq.LengthKnobs.make(output))


def knobs(org: orgs.OrgKnobs, requests: rq.RequestKnobs) -> system.ServeKnobs:
    """One knob point: an organisation, DASH's GPU and batcher, a request stream."""
    return system.ServeKnobs.make(org, timing.GpuKnobs.make(GPU),
                                  BatcherKnobs.make(chunk_tokens=CHUNK_TOKENS, token_budget=TOKEN_BUDGET), requests)


def run(points: list[system.ServeKnobs], cfg: system.ServeConfig, streams: int, seed: int,
        split: bool | None = None) -> list:
    """One output per point, on common random numbers (same seed and stream ids) and one compilation.

    ``split`` (default: on a CPU) runs the points one after another, each as a knob axis of one: a
    vmapped rollout runs until its slowest lane stops, so points of very different iteration counts
    (DASH at 50 % load takes ~6× the iterations of RelayOnly at 90 %) waste the CPU when stacked;
    on an accelerator the lanes run in parallel and one stacked axis is faster."""
    split = jax.default_backend() == "cpu" if split is None else split
    groups = [[p] for p in points] if split else [points]
    outs = []
    for group in groups:
        out = batch.run(system.simulate, streams, seed, batch.stack_knobs(group), cfg, knob_axis=True)
        outs += [jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) for k in range(len(group))]
    return outs


def summary(out, warmup: int = 0, measured: int | None = None) -> dict:
    """metrics.summary of one point's output, with its overflow flag."""
    s = metrics.summary(metrics.times(out.arrival, out.first_token, out.finish, out.tokens_out, out.valid),
                        warmup, measured)
    return {**s, "overflow": bool(np.any(out.overflow))}


def totals(out) -> dict:
    """Across-stream means of ``ServeOutput.totals`` (NaN for each field while the engine lacks them)."""
    got = getattr(out, "totals", None)
    return {k: (float(np.mean(np.asarray(getattr(got, k), np.float64))) if got is not None and hasattr(got, k)
                else math.nan) for k in TOTALS}


def run_seconds(out) -> float:
    """Mean over streams of a run's span: first arrival to last finish (s)."""
    t = metrics.times(out.arrival, out.first_token, out.finish, out.tokens_out, out.valid)
    span = np.where(t.valid, t.finish_s, -np.inf).max(axis=1) - np.where(t.valid, t.arrival_s, np.inf).min(axis=1)
    return float(np.mean(span))
