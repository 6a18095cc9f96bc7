"""Request metrics of a serving run (host NumPy, float64 seconds; DESIGN.md §5 "Metrics").

Per request (DASH §VI): TTFT = first token − arrival, E2E = finish − arrival, TPOT = (finish − first
token)/(output − 1) (undefined, NaN, for a one-token output). A stream's **measured window** is the
requests ``warmup … warmup + measured − 1`` by index (DASH §VI-E: 128 warm-up, 1,024 measured): the
warm-up is masked, not a second rollout. Per stream:

* ``throughput_tokens_per_s``: output tokens of the measured requests over the measured span, from
  the first measured arrival to the last measured finish (the paper does not define its own);
* ``decode_tokens_per_s``: their decode tokens Σ(output − 1) over the span from the first first-token
  to the last finish — for a fixed batch whose prefills end together, B·(L_out − 1)/T_decode;
* means and P50/P90/P99 of TTFT, TPOT and E2E over the measured requests;
* with service-level objectives (:class:`Slo`): ``slo_attainment``, the share of measured requests
  whose TTFT and TPOT both meet them (a one-token output has no TPOT and meets that part), and
  ``goodput_requests_per_s`` / ``goodput_tokens_per_s``, those requests (their output tokens) over the
  measured span;
* Little's law terms over the arrival window [first, last measured arrival]: ``mean_requests_in_system``
  L (time-average of every request present, warm-up and later ones included), ``arrival_rate_per_s``
  λ (measured arrivals in the window per second), with ``e2e_s`` as W: L ≈ λW in steady state.

Across streams (:func:`summary`) every per-stream value becomes a mean with a 95 % confidence
half-width (``ci95_<key>``; :func:`hbfjax.reports.mean_ci_fields`), so P90 E2E is reported as the
mean over streams of each stream's P90.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from hbfjax import clock
from hbfjax.reports import mean_ci_fields
from hbfjax.validate import require, require_int

QUANTILES = (50, 90, 99)


class Slo(NamedTuple):
    """Service-level objectives; None: no bound on that metric."""

    ttft_s: float | None = None
    tpot_ms: float | None = None


class RequestTimes(NamedTuple):
    """Per-request times of S streams (host float64 seconds; ``inf`` where never reached)."""

    arrival_s: np.ndarray  # float64[S, R]
    first_token_s: np.ndarray  # float64[S, R]
    finish_s: np.ndarray  # float64[S, R]
    tokens_out: np.ndarray  # int64[S, R] output tokens generated
    valid: np.ndarray  # bool[S, R]


class RequestMetrics(NamedTuple):
    """Per-request latencies (float64[S, R] seconds; NaN outside the measured window or undefined)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    measured: np.ndarray  # bool[S, R] in the measured window and finished


def _seconds(c: clock.Clock) -> np.ndarray:
    """Host seconds of a clock, ``inf`` for clock.never()."""
    s = clock.to_seconds(c)
    return np.where(np.asarray(c.s) == np.iinfo(np.int32).max, np.inf, s)


def times(arrival: clock.Clock, first_token: clock.Clock, finish: clock.Clock, tokens_out, valid) -> RequestTimes:
    """Batched device outputs (``Clock[S, R]`` and arrays) as host seconds."""
    return RequestTimes(_seconds(arrival), _seconds(first_token), _seconds(finish),
                        np.asarray(tokens_out, np.int64), np.asarray(valid, bool))


def window(n_requests: int, warmup: int, measured: int | None) -> np.ndarray:
    """bool[R] the measured request indices: ``warmup … warmup + measured − 1`` (all after the warm-up
    if ``measured`` is None)."""
    require_int("window", "warmup", warmup, 0, n_requests - 1)
    if measured is None:
        measured = n_requests - warmup
    require_int("window", "measured", measured, 1, n_requests - warmup)
    i = np.arange(n_requests)
    return (i >= warmup) & (i < warmup + measured)


def per_request(t: RequestTimes, in_window: np.ndarray) -> RequestMetrics:
    """TTFT, TPOT and E2E of the finished requests in the window (NaN elsewhere)."""
    measured = t.valid & in_window[None, :] & np.isfinite(t.finish_s)
    nan = lambda x: np.where(measured, x, np.nan)  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(t.tokens_out > 1, (t.finish_s - t.first_token_s) / (t.tokens_out - 1), np.nan)
        return RequestMetrics(nan(t.first_token_s - t.arrival_s), nan(tpot), nan(t.finish_s - t.arrival_s), measured)


def _span(lo: np.ndarray, hi: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float64[S] max(hi) − min(lo) over the masked requests of each stream."""
    return np.where(mask, hi, -np.inf).max(axis=1) - np.where(mask, lo, np.inf).min(axis=1)


def time_in_window(t: RequestTimes, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """float64[S] ∫ N(t) dt over [t0, t1] per stream: every valid request counted from arrival to finish."""
    lo = np.maximum(t.arrival_s, t0[:, None])
    hi = np.minimum(t.finish_s, t1[:, None])
    return np.where(t.valid, np.maximum(hi - lo, 0.0), 0.0).sum(axis=1)


def _goodput(t: RequestTimes, m: RequestMetrics, slo: Slo, span_s: np.ndarray) -> dict:
    """SLO attainment and goodput per stream (module docstring)."""
    ok = m.measured.copy()
    if slo.ttft_s is not None:
        ok &= m.ttft_s <= slo.ttft_s
    if slo.tpot_ms is not None:
        ok &= np.isnan(m.tpot_s) | (m.tpot_s * 1e3 <= slo.tpot_ms)
    return {"slo_attainment": ok.sum(axis=1) / m.measured.sum(axis=1),
            "goodput_requests_per_s": ok.sum(axis=1) / span_s,
            "goodput_tokens_per_s": np.where(ok, t.tokens_out, 0).sum(axis=1) / span_s}


def per_stream(t: RequestTimes, in_window: np.ndarray, slo: Slo | None = None) -> dict:
    """``{key: float64[S]}``: throughput, latency means and quantiles, Little's law terms per stream,
    and SLO goodput when ``slo`` is given."""
    m = per_request(t, in_window)
    out_tokens = np.where(m.measured, t.tokens_out, 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a stream with no TPOT (all outputs 1 token): NaN
        span_s = _span(t.arrival_s, t.finish_s, m.measured)
        result = {
            "throughput_tokens_per_s": out_tokens / span_s,
            "decode_tokens_per_s": np.where(m.measured, t.tokens_out - 1, 0).sum(axis=1)
            / _span(t.first_token_s, t.finish_s, m.measured),
        }
        for key, values, scale in (("ttft_s", m.ttft_s, 1.0), ("tpot_ms", m.tpot_s, 1e3), ("e2e_s", m.e2e_s, 1.0)):
            result[key] = np.nanmean(values, axis=1) * scale
            for q in QUANTILES:
                result[f"p{q}_{key}"] = np.nanpercentile(values, q, axis=1) * scale
        t0 = np.where(m.measured, t.arrival_s, np.inf).min(axis=1)
        t1 = np.where(m.measured, t.arrival_s, -np.inf).max(axis=1)
        arrivals = (m.measured & (t.arrival_s < t1[:, None])).sum(axis=1)  # [t0, t1): the last one closes it
        result["mean_requests_in_system"] = time_in_window(t, t0, t1) / (t1 - t0)
        result["arrival_rate_per_s"] = arrivals / (t1 - t0)
        if slo is not None:
            result.update(_goodput(t, m, slo, span_s))
    return result


def summary(t: RequestTimes, warmup: int = 0, measured: int | None = None, slo: Slo | None = None) -> dict:
    """Across-stream means with 95 % half-widths (``ci95_<key>``) of every :func:`per_stream` value."""
    require(t.arrival_s.ndim == 2, "summary", "arrival_s.ndim", t.arrival_s.ndim, "must be 2 (streams, requests)")
    stream = per_stream(t, window(t.arrival_s.shape[1], warmup, measured), slo)
    return mean_ci_fields(stream, tuple(stream))
