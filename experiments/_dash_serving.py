"""Shared by the DASH online and long-run figures (Table III, Fig. 12 at system level, §VI-H): a serving
run assembled as ``hbfjax serve`` assembles it, through the front door (``hbfjax.serve.systems``: a
``Scenario`` and DASH's named organisations, several points stacked as one family on one knob axis
and one compilation), its per-point summaries, and the engine's per-stream totals."""

from __future__ import annotations

import jax
import numpy as np

from hbfjax.serve import metrics, report, systems
from hbfjax.sweep import families
from hbfjax.workload import requests as rq

# ServeOutput.totals (per-stream float32 totals) the figures report
TOTALS = ("busy_us", "prefill_write_bytes", "writeback_bytes", "write_stall_us", "program_busy_us",
          "expert_direct_bytes", "expert_relay_bytes", "max_kv_hbm_bytes", "max_kv_hbf_bytes")


def request_knobs(prompt: int, output: int, *, rate_per_s: float = 1.0, batch_size: int = 1) -> rq.RequestKnobs:
    return rq.RequestKnobs.make(rate_per_s=rate_per_s, batch=batch_size, prompt=rq.LengthKnobs.make(prompt),
                                output=rq.LengthKnobs.make(output))


def scenario(model: str, prompt: int, output: int, *, slots: int, requests: int, arrivals: str,
             rate_per_s: float = 1.0, batch_size: int = 1, **changes) -> systems.Scenario:
    """``requests`` requests of ``prompt`` → ``output`` tokens (``arrivals``: "poisson" at ``rate_per_s``,
    or "batch", ``batch_size`` of them at t = 0) in ``slots`` slots; ``changes``: other Scenario fields
    (mode, routing, org_changes, link_gbps, page_bytes, max_iterations, scan_chunk, warmup, ...).
    Balanced routing draws through ``routing_draw = "tokens"`` (``systems.serve_config``: its rows are
    closed form, no per-token draws, so it costs about what the count draw costs)."""
    return systems.Scenario(model=model, requests=rq.RequestsConfig(requests=requests, arrivals=arrivals),
                            request_knobs=request_knobs(prompt, output, rate_per_s=rate_per_s, batch_size=batch_size),
                            slots=slots, **changes)


def family(points: list[tuple[str, systems.Scenario]]) -> systems.Family:
    """One family of (system name, scenario) points that share a compilation (``systems.stack``)."""
    return systems.stack([systems.single(name, sc) for name, sc in points])


def run(fam: systems.Family, streams: int, seed: int, split: bool | None = None) -> list:
    """One output per point of ``fam``, on common random numbers (same seed and stream ids) and one compilation.

    ``split`` (default: on a CPU) runs the points one after another, each as a knob axis of one: a
    vmapped rollout runs until its slowest lane stops, so points of very different iteration counts
    (DASH at 50 % load takes ~6× the iterations of RelayOnly at 90 %) waste the CPU when stacked;
    on an accelerator the lanes run in parallel and one stacked axis is faster."""
    split = jax.default_backend() == "cpu" if split is None else split
    return families.run_outputs(fam, streams, seed, split=split)


def summary(out, warmup: int = 0, measured: int | None = None) -> dict:
    """metrics.summary of one point's output, with its overflow flag."""
    s = metrics.summary(report.request_times(out), warmup, measured)
    return {**s, "overflow": bool(np.any(out.overflow))}


def totals(out) -> dict:
    """Across-stream means of ``ServeOutput.totals`` (:data:`TOTALS`)."""
    return {k: float(np.mean(np.asarray(getattr(out.totals, k), np.float64))) for k in TOTALS}


def run_seconds(out) -> float:
    """Mean over streams of a run's span: first arrival to last finish (s)."""
    t = report.request_times(out)
    span = np.where(t.valid, t.finish_s, -np.inf).max(axis=1) - np.where(t.valid, t.arrival_s, np.inf).min(axis=1)
    return float(np.mean(span))
