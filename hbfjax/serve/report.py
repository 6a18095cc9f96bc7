"""A served system's results as the JSON keys ``hbfjax serve`` prints and a sweep row holds (host NumPy).

One system's report is the union of:

* request metrics (``metrics.summary``: throughput, TTFT, TPOT, E2E and their quantiles; for an
  online run the offered and completed rates, Little's-law terms over one window, the saturation flag);
* for an organisation, the run totals (write volumes, stalls, KV occupancy) and the utilisation of
  each path and link (:func:`totals_report`);
* each part's own keys (its module's ``report``: e.g. WAF from the blocks part, read-wave
  amplification from the reads part);
* loop facts: mean iterations and the overflow flag.

Every per-stream value becomes a mean with a 95 % half-width across streams (``ci95_<key>``); a value
a stream did not measure is NaN there and the mean is over the streams that measured it (None when
none did: e.g. WAF with no host page written), never a 0 that reads as a measurement.
"""

from __future__ import annotations

import numpy as np

from hbfjax.memory import delivery
from hbfjax.serve import metrics
from hbfjax.serve.parts import MODULES
from hbfjax.stats import mean_ci95
from hbfjax.validate import ConfigError


def totals_report(totals, org) -> dict:
    """Host ``{key: float64[S]}`` per stream from a run's totals (``engine.Totals`` of float32[S]) on
    ``org``: write volumes, exposed stall, KV occupancy, and utilisations — each path's or link's bytes
    over what it could carry in the busy time (expert Direct and Relay paths, HBM and HBF reads by
    their cuts, the writeback route), and HBF program time over the busy time."""
    t = {k: np.asarray(v, np.float64) for k, v in totals._asdict().items()}
    busy_us = np.maximum(t["busy_us"], 1e-30)
    r = delivery.rates(org)
    cuts = delivery.read_cuts(org)

    def used(nbytes, gbps):
        gbps = float(gbps)
        return nbytes / (gbps * 1e3 * busy_us) if gbps > 0 else np.zeros_like(nbytes)

    return {
        "busy_s": t["busy_us"] * 1e-6,
        "write_stall_s": t["write_stall_us"] * 1e-6,
        "program_busy_s": t["program_busy_us"] * 1e-6,
        "prefill_write_gb": t["prefill_write_bytes"] * 1e-9,
        "writeback_gb": t["writeback_bytes"] * 1e-9,
        "writeback_passes": t["writeback_passes"],
        "mean_kv_hbm_gb": t["kv_hbm_byte_us"] / busy_us * 1e-9,
        "mean_kv_hbf_gb": t["kv_hbf_byte_us"] / busy_us * 1e-9,
        "max_kv_hbm_gb": t["max_kv_hbm_bytes"] * 1e-9,
        "max_kv_hbf_gb": t["max_kv_hbf_bytes"] * 1e-9,
        "utilisation_expert_direct": used(t["expert_direct_bytes"], r.direct_gbps),
        "utilisation_expert_relay": used(t["expert_relay_bytes"], r.relay_gbps),
        "utilisation_hbm_read": used(t["hbm_read_bytes"], cuts.hbm_gbps),
        "utilisation_hbf_read": used(t["hbf_read_bytes"] + t["expert_direct_bytes"] + t["expert_relay_bytes"],
                                     cuts.hbf_gbps),
        "utilisation_writeback_route": used(t["writeback_bytes"], delivery.hbm_to_hbf_gbps(org)),
        "utilisation_hbf_program": t["program_busy_us"] / busy_us,
    }


def per_gpu_report(o, model) -> dict:
    """Host ``{key: float64[S]}`` of one GPU and its package: the HBF KV room (``kv_room_gb``, what the GPU's
    share of the weights leaves, or the room given), and with tensor parallelism (``model.tensor_parallel`` >
    1) its all-reduce time and that time's share of the busy time (``hbfjax.workload.tensor_parallel``)."""
    busy_us = np.asarray(o.totals.busy_us, np.float64)
    room = np.broadcast_to(np.asarray(o.room_tokens, np.float64), busy_us.shape)
    out = {"kv_room_gb": room * float(model.kv_bytes_per_token) * 1e-9}
    if model.tensor_parallel > 1:
        allreduce_us = np.asarray(o.totals.allreduce_us, np.float64)
        out.update(allreduce_s=allreduce_us * 1e-6, allreduce_share_of_busy=allreduce_us / np.maximum(busy_us, 1e-30))
    return out


def measured_mean_ci(per_stream: dict) -> dict:
    """``{key: mean, ci95_key: half-width}`` over the streams where each value is finite (None, None
    where no stream measured it)."""
    out = {}
    for key, values in per_stream.items():
        a = np.asarray(values, np.float64).reshape(len(values), -1).mean(axis=1)
        a = a[np.isfinite(a)]
        if a.size == 0:
            out[key], out[f"ci95_{key}"] = None, None
            continue
        mean, ci = mean_ci95(a)
        out[key], out[f"ci95_{key}"] = float(mean), float(ci)
    return out


def request_times(o) -> metrics.RequestTimes:
    """A batched output's per-request times as host seconds."""
    return metrics.times(o.arrival, o.first_token, o.finish, o.tokens_out, o.valid)


def part_keys(o, parts: tuple) -> dict:
    """Host ``{key: float64[S]}`` of every part of the run that reports (``parts.<name>.report``)."""
    keys = {}
    for name in parts:
        report = getattr(MODULES[name], "report", None)
        if report is not None:
            keys.update(report(o.parts[name], o))
    return keys


def check_inputs(o) -> None:
    """Refuse a run whose inputs lacked a tabulated law its knobs need (its numbers are not its own)."""
    if np.any(np.asarray(o.missing_inputs)):
        raise ConfigError("inputs: the run's inputs lack a tabulated law (read or resident-expert) for its knobs; "
                          "build them with hbfjax.serve.systems.inputs_for (a bug if raised from the CLI)")


def _window(t, warmup, measured, closed, slo) -> tuple:
    """``metrics.per_stream``'s (in_window, slo, span) arguments."""
    in_window, span = metrics.stream_window(t, warmup, measured, closed)
    return in_window, slo, span


def _turnover(o, closed) -> dict:
    """A closed loop's KV-room turnover (``metrics.kv_turnover_s``) against its window: the mean turnover
    time over streams (null unless every stream turned its room over: NaN without a room, the CPU
    systems), the streams that did, and those whose window opened after it (the retention such a
    window measures is the steady one)."""
    t = request_times(o)
    at = metrics.kv_turnover_s(t, o.kv_tokens, np.broadcast_to(np.asarray(o.room_tokens), t.valid.shape[:1]))
    t0 = metrics.closed_window(t, *closed)[1]
    finite = np.isfinite(at)
    return {"kv_room_turnover_s": float(at.mean()) if finite.all() else None,
            "kv_room_turned_over_streams": int(finite.sum()),
            "window_after_turnover_streams": int((finite & (t0 >= at)).sum())}


def system_report(o, org, parts: tuple, warmup: int, online: bool, slo=None, measured: int | None = None,
                  closed=None) -> dict:
    """One system's JSON (module docstring) from its batched output ``o`` (leading stream axis) on
    ``org`` (None: no organisation, the CPU systems) with ``parts``; ``closed``: a closed loop's (tasks,
    warm-up turns), whose window is per stream (``metrics.stream_window``)."""
    check_inputs(o)
    s = metrics.summary(request_times(o), warmup, measured, slo, closed)
    if not online:  # every request arrives at t = 0: no arrival rate, Little's law is void
        s = {key: v for key, v in s.items() if not metrics.is_online_key(key)}
    result = dict(s)
    if closed is not None:
        result.update(_turnover(o, closed))
    if org is not None:
        run = measured_mean_ci(totals_report(o.totals, org))
        util = {k[len("utilisation_"):]: v for k, v in run.items() if k.startswith("utilisation_")}
        result.update({k: v for k, v in run.items() if "utilisation_" not in k})
        result["utilisation"] = util
    result.update(measured_mean_ci(part_keys(o, parts)))
    result.update(iterations_mean=float(np.mean(o.iterations)), overflow=bool(np.any(o.overflow)))
    return result


def per_stream(o, warmup: int, slo=None, measured: int | None = None, closed=None) -> dict:
    """A serving run's request metrics per stream (``metrics.per_stream``), its iterations and overflow flags."""
    t = request_times(o)
    return {**metrics.per_stream(t, *_window(t, warmup, measured, closed, slo)),
            "iterations": np.asarray(o.iterations, np.float64), "overflow": np.asarray(o.overflow)}
