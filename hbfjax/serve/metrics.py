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
* rates, Little's law and saturation over one **arrival window** [t0, t1): t0 the first and t1 the last
  arrival of the valid requests in the measured window (by index, finished or not), T = t1 − t0. Every
  count below is over all valid requests of the stream (warm-up and later ones too), half-open so a
  request on an edge counts once:

  - ``arrival_rate_per_s`` λ = A / T, A = #{arrivals in [t0, t1)} (the offered rate: with arrivals
    in index order at distinct times A = measured − 1, the gaps between the first and last measured
    arrival per second, as before);
  - ``completion_rate_per_s`` = D / T, D = #{finishes in [t0, t1)}: the server's completion rate in
    the same window (warm-up requests finishing there count). N(t1⁻) − N(t0⁻) = A − D exactly, so a
    stable run has D ≈ A (within the fluctuation of the number in system) and a saturated one D < A;
  - Little's law by construction, for the population of every valid request of the stream, N(t) the
    number of them in the system (arrived ≤ t < finish; ``inf`` finishes never leave) and
    I = ∫_{t0}^{t1} N(t) dt = Σ |[arrival, finish) ∩ [t0, t1)| (each request's time in the system
    clipped to the window, those carried in at t0 included): ``mean_requests_in_system``
    L = I / T (the time-average number in system), ``littles_time_in_system_s`` W = I / A (time in
    system accrued in the window per arrival in it) and ``littles_arrival_rate_per_s`` λ = A / T
    (the same count over the same window: equal to ``arrival_rate_per_s``, reported beside the other
    two terms), so L = λ·W exactly (to float rounding) in every run, stable or not. In steady state
    the time carried in at t0 and the time clipped at t1 cancel on average, and W estimates the mean
    time in system: W ≈ ``e2e_s`` (the mean E2E of the measured requests), L ≈ λ·``e2e_s``. In a
    saturated run they part: the time in system grows past what the window holds, W < ``e2e_s``
    (about half of it for a queue growing from empty), and both grow with the run's length;
  - ``completion_to_arrival_ratio`` r = D / A and ``saturated``: the run is **saturated** when its
    completions fall short of its arrivals by more than ``SATURATION_SHORTFALL`` (5 %) and by more
    than ``SATURATION_MIN_REQUESTS`` (2) requests — the number in system grows through the window, by
    A − D = (1 − r)·A. Per stream (a point test): r < 0.95 and A − D > 2. Across streams
    (:func:`summary`): the mean of r plus its 95 % half-width < 0.95, i.e. r < 0.95 with one-sided
    97.5 % confidence (one stream: no interval, its r), and the mean of A − D > 2. A stable run has
    E[A − D] = 0 in steady state (A − D is the change of the number in system, |1 − r| ~ its
    fluctuation / A) and is not flagged; the count floor keeps a short window whose streams all end
    with a request or two more in the system (an interval of alike discrete values is 0) unflagged.
    Offered k × capacity gives r ≈ 1/k: flagged from k ≈ 1.05. A run whose warm-up ends before the
    system fills has r ≈ 1 − (fill) / A and is flagged only when the fill exceeds 5 % of the window's
    arrivals (its latencies are then transient too).

  A **closed loop** (``summary(..., closed=(tasks, warm-up turns))``, :func:`closed_window`) has a window
  per stream instead of one by index: from the moment the last task issues its turn ``warm-up turns``
  (every task has started and served its warm-up) to the moment the first task issues its last turn
  (before it finishes, all T tasks are in the loop); the measured requests are those arriving in it,
  its token rates count the requests finishing in it (``window_start_s``, ``window_end_s`` and
  ``window_requests`` say which), and the rates and Little's law above are taken over it. Where think
  times are long and uneven (a trace's recorded gaps: Mooncake's run to minutes) the tasks drift apart
  by more turns than they have, and that window is empty; the warm-up is then given in time instead
  (``closed=(tasks, 0, warm-up fraction)``): the window starts the fraction f of the way from the moment
  the last task issues its first request (every task has started) to the moment the first task issues
  its last, and ends there.

  A fixed batch (every request at t = 0) has T = 0: no rate, no Little's law; these keys are NaN,
  ``saturated`` is False (unflagged), and callers drop all of them, :data:`ONLINE_KEYS` with their
  ``ci95_`` half-widths (:func:`is_online_key`).

Across streams (:func:`summary`) every per-stream value becomes a mean with a 95 % confidence
half-width (``ci95_<key>``; :func:`hbfjax.reports.mean_ci_fields`), so P90 E2E is reported as the
mean over streams of each stream's P90 — except ``saturated``, a bool decided by the test above, with
``saturated_streams`` the number of streams whose own flag is set, and ``littles_time_in_system_s``,
the ratio of the means L̄ / λ̄ (so that the reported L, λ and W satisfy L = λ·W as each stream's do). :func:`saturation_warning` words a
saturated summary as one line for stderr.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from hbfjax import clock
from hbfjax.reports import mean_ci_fields
from hbfjax.stats import mean_ci95, t975
from hbfjax.validate import ConfigError, require, require_int, require_real

QUANTILES = (50, 90, 99)
SATURATION_SHORTFALL = 0.05  # saturated: completions short of arrivals by more than this share ...
SATURATION_MIN_REQUESTS = 2.0  # ... and by more than this many requests
# summary keys of an online run only, dropped by callers for a fixed batch (no arrival window): NaN
# there but for the saturation flags (False, 0), which say nothing without arrivals
ONLINE_KEYS = ("arrival_rate_per_s", "completion_rate_per_s", "mean_requests_in_system", "littles_arrival_rate_per_s",
               "littles_time_in_system_s", "completion_to_arrival_ratio", "saturated", "saturated_streams")


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


def _rows(in_window: np.ndarray) -> np.ndarray:
    """The window as bool[S, R] or bool[1, R]: one by index (bool[R]) or one per stream (a closed loop)."""
    in_window = np.asarray(in_window, bool)
    return in_window if in_window.ndim == 2 else in_window[None, :]


class ClosedLoop(NamedTuple):
    """A closed loop's window rule (:func:`closed_window`): its tasks and its warm-up, in turns, or (with
    ``warmup_fraction`` given, ``warmup_turns`` 0) as a fraction of the time every task is in the loop."""

    tasks: int
    warmup_turns: int = 2
    warmup_fraction: float | None = None


def closed_window(t: RequestTimes, tasks: int, warmup_turns: int,
                  warmup_fraction: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed loop's steady window per stream (request i = turn · T + task): bool[S, R] the valid
    requests arriving in [t0, t1) and float64[S] t0, t1 — t1 when the first task issues its last request
    (after that one finishes the population falls below T); t0 when the last task issues its request of
    turn ``warmup_turns`` (every task has started and done its warm-up turns), or with ``warmup_fraction``
    f the fraction f of the way from the last task's first request to t1 (module docstring)."""
    s, r = t.arrival_s.shape
    turns = r // tasks
    require_int("closed_window", "warmup_turns", warmup_turns, 0, turns - 2)
    a = t.arrival_s.reshape(s, turns, tasks)
    t1 = a[:, -1, :].min(axis=1)
    if warmup_fraction is None:
        t0 = a[:, warmup_turns, :].max(axis=1)
    else:
        f = require_real("closed_window", "warmup_fraction", warmup_fraction, 0.0, 1.0, hi_open=True)
        require(warmup_turns == 0, "closed_window", "warmup_turns", warmup_turns,
                "must be 0 with a warm-up fraction (one warm-up rule)")
        started = a[:, 0, :].max(axis=1)
        t0 = started + f * (t1 - started)
    inside = t.valid & (t.arrival_s >= t0[:, None]) & (t.arrival_s < t1[:, None])
    return inside, t0, t1


def per_request(t: RequestTimes, in_window: np.ndarray) -> RequestMetrics:
    """TTFT, TPOT and E2E of the finished requests in the window (NaN elsewhere)."""
    measured = t.valid & _rows(in_window) & np.isfinite(t.finish_s)
    nan = lambda x: np.where(measured, x, np.nan)  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(t.tokens_out > 1, (t.finish_s - t.first_token_s) / (t.tokens_out - 1), np.nan)
        return RequestMetrics(nan(t.first_token_s - t.arrival_s), nan(tpot), nan(t.finish_s - t.arrival_s), measured)


def _span(lo: np.ndarray, hi: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float64[S] max(hi) − min(lo) over the masked requests of each stream."""
    return np.where(mask, hi, -np.inf).max(axis=1) - np.where(mask, lo, np.inf).min(axis=1)


def arrival_window(t: RequestTimes, in_window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64[S] (t0, t1): the first and last arrival of the valid requests in the measured window
    (finished or not); ±inf for a stream with none."""
    mask = t.valid & _rows(in_window)
    return np.where(mask, t.arrival_s, np.inf).min(axis=1), np.where(mask, t.arrival_s, -np.inf).max(axis=1)


def window_counts(t: RequestTimes, t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64[S] (A, D): the valid requests arriving in [t0, t1) and those finishing in [t0, t1)."""
    def inside(x):
        return (t.valid & (x >= t0[:, None]) & (x < t1[:, None])).sum(axis=1)
    return inside(t.arrival_s), inside(t.finish_s)


def time_in_window(t: RequestTimes, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """float64[S] I = ∫_{t0}^{t1} N(t) dt = Σ |[arrival, finish) ∩ [t0, t1)| over every valid request
    (N(t): the valid requests in the system at t)."""
    lo = np.maximum(t.arrival_s, t0[:, None])
    hi = np.minimum(t.finish_s, t1[:, None])
    return np.where(t.valid, np.maximum(hi - lo, 0.0), 0.0).sum(axis=1)


def _shortfall(arrivals: np.ndarray, completions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64[S] (r, A − D) from the window counts; NaN where no request arrived in the window."""
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.where(arrivals > 0, arrivals, np.nan)
        return completions / a, a - completions


def window_shortfall(t: RequestTimes, in_window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64[S] (r, A − D): completions over arrivals in the arrival window, and the arrivals there
    not matched by a completion (the growth of the number in system); NaN with no window."""
    return _shortfall(*window_counts(t, *arrival_window(t, in_window)))


def online(t: RequestTimes, in_window: np.ndarray) -> dict:
    """``{key: float64[S]}`` the rates, Little's law terms and ratio of the module docstring over the
    arrival window [t0, t1), and ``saturated`` bool[S] (r < 1 − SATURATION_SHORTFALL and
    A − D > SATURATION_MIN_REQUESTS); NaN (and False) for a stream with no window (T = 0: a fixed
    batch, or one measured request)."""
    t0, t1 = arrival_window(t, in_window)
    arrivals, completions = window_counts(t, t0, t1)
    ratio, short = _shortfall(arrivals, completions)
    with np.errstate(invalid="ignore", divide="ignore"):
        span_s = np.where(t1 > t0, t1 - t0, np.nan)
        area = time_in_window(t, t0, t1)
        return {"arrival_rate_per_s": arrivals / span_s,
                "completion_rate_per_s": completions / span_s,
                "mean_requests_in_system": area / span_s,
                "littles_arrival_rate_per_s": arrivals / span_s,
                "littles_time_in_system_s": area / np.where(arrivals > 0, arrivals, np.nan),
                "completion_to_arrival_ratio": ratio,
                "saturated": (ratio < 1.0 - SATURATION_SHORTFALL) & (short > SATURATION_MIN_REQUESTS)}


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


def _closed_rates(t: RequestTimes, t0: np.ndarray, t1: np.ndarray) -> dict:
    """A closed loop's token rates over its window [t0, t1): the output (and decode) tokens of the
    requests finishing in it, over its length (steady state: no request's tokens straddle the edges on
    average, whereas the open loop's measured span would run one E2E past t1)."""
    done = t.valid & (t.finish_s >= t0[:, None]) & (t.finish_s < t1[:, None])
    span_s = np.where(t1 > t0, t1 - t0, np.nan)
    return {"throughput_tokens_per_s": np.where(done, t.tokens_out, 0).sum(axis=1) / span_s,
            "decode_tokens_per_s": np.where(done, t.tokens_out - 1, 0).sum(axis=1) / span_s}


def per_stream(t: RequestTimes, in_window: np.ndarray, slo: Slo | None = None, span=None) -> dict:
    """``{key: float64[S]}``: throughput, latency means and quantiles, the rates, Little's law terms and
    ``saturated`` (bool[S]) of :func:`online`, and SLO goodput when ``slo`` is given. ``span``: a closed
    loop's window (t0, t1) float64[S] (:func:`closed_window`): its token rates are those finishing in
    it (:func:`_closed_rates`), and ``window_start_s``, ``window_end_s``, ``window_requests`` say which."""
    m = per_request(t, in_window)
    out_tokens = np.where(m.measured, t.tokens_out, 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a stream with no TPOT (all outputs 1 token): NaN
        span_s = _span(t.arrival_s, t.finish_s, m.measured)
        if span is None:
            result = {
                "throughput_tokens_per_s": out_tokens / span_s,
                "decode_tokens_per_s": np.where(m.measured, t.tokens_out - 1, 0).sum(axis=1)
                / _span(t.first_token_s, t.finish_s, m.measured),
            }
        else:
            t0, t1 = span
            span_s = np.where(t1 > t0, t1 - t0, np.nan)  # goodput over the same window
            result = {**_closed_rates(t, t0, t1), "window_start_s": t0, "window_end_s": t1,
                      "window_requests": m.measured.sum(axis=1).astype(np.float64)}
        for key, values, scale in (("ttft_s", m.ttft_s, 1.0), ("tpot_ms", m.tpot_s, 1e3), ("e2e_s", m.e2e_s, 1.0)):
            result[key] = np.nanmean(values, axis=1) * scale
            for q in QUANTILES:
                result[f"p{q}_{key}"] = np.nanpercentile(values, q, axis=1) * scale
        result.update(online(t, in_window))
        if slo is not None:
            result.update(_goodput(t, m, slo, span_s))
    return result


def saturated(ratio: np.ndarray, shortfall: np.ndarray) -> bool:
    """The across-stream test (module docstring) on the per-stream ratios r and shortfalls A − D
    (:func:`window_shortfall`): mean(r) + 95 % half-width < 1 − SATURATION_SHORTFALL (one stream: r
    itself) and mean(A − D) > SATURATION_MIN_REQUESTS; streams without a window (NaN) are left out,
    and none left is not saturated."""
    r, short = np.asarray(ratio, np.float64), np.asarray(shortfall, np.float64)
    keep = np.isfinite(r)
    if not keep.any():
        return False
    mean, ci = mean_ci95(r[keep])
    bound = mean + (ci if keep.sum() > 1 else 0.0)
    return bool(bound < 1.0 - SATURATION_SHORTFALL and short[keep].mean() > SATURATION_MIN_REQUESTS)


def kv_turnover_s(t: RequestTimes, kv_tokens: np.ndarray, room_tokens: np.ndarray) -> np.ndarray:
    """float64[S] when the KV of the requests finished so far (prompt + output tokens each) first reaches the
    KV room: by then a retained session's KV may have been evicted (the room has turned over); ``inf``
    for a stream that never got there, NaN without a room (``room_tokens`` < 0)."""
    order = np.argsort(np.where(t.valid, t.finish_s, np.inf), axis=1, kind="stable")
    finish = np.take_along_axis(t.finish_s, order, axis=1)
    done = np.take_along_axis(t.valid & np.isfinite(t.finish_s), order, axis=1)
    written = np.cumsum(np.where(done, np.take_along_axis(np.asarray(kv_tokens, np.float64), order, axis=1), 0.0), axis=1)
    room = np.asarray(room_tokens, np.float64).reshape(-1, 1)
    reached = written >= room
    first = np.argmax(reached, axis=1)
    at = np.where(reached.any(axis=1), finish[np.arange(finish.shape[0]), first], np.inf)
    return np.where(room[:, 0] >= 0, at, np.nan)


def stream_window(t: RequestTimes, warmup: int = 0, measured: int | None = None, closed=None):
    """(in_window, span) of a run: by index (:func:`window`, span None), or a closed loop's steady window
    (``closed`` = (tasks, warm-up turns[, warm-up fraction]), :class:`ClosedLoop`: :func:`closed_window`; span
    its (t0, t1)); a closed loop with a
    stream with no request in its window is refused (too few turns per task for the warm-up)."""
    if closed is None:
        return window(t.arrival_s.shape[1], warmup, measured), None
    rule = ClosedLoop(*closed)
    in_window, t0, t1 = closed_window(t, *rule)
    empty = ~in_window.any(axis=1)
    if empty.any():
        turns = t.arrival_s.shape[1] // rule.tasks
        if rule.warmup_fraction is None:
            raise ConfigError(f"closed loop: in {int(empty.sum())} of {empty.size} streams no request arrives between the "
                              f"last task's turn {rule.warmup_turns} and the first task's last turn ({turns} turns per "
                              "task: the tasks drift apart by more than the turns left): give more turns per task, "
                              "fewer warm-up turns, or a warm-up in time (--warmup-fraction)")
        raise ConfigError(f"closed loop: in {int(empty.sum())} of {empty.size} streams no request arrives after the "
                          f"warm-up fraction {rule.warmup_fraction:g} and before the first task's last turn ({turns} turns "
                          "per task: the last task starts after the first one ends): give more turns per task")
    return in_window, (t0, t1)


def summary(t: RequestTimes, warmup: int = 0, measured: int | None = None, slo: Slo | None = None,
            closed=None) -> dict:
    """Across-stream means with 95 % half-widths (``ci95_<key>``) of every :func:`per_stream` value but
    ``saturated``: that one is the bool of :func:`saturated`, with ``saturated_streams`` the number of
    streams flagged on their own. ``closed``: (tasks, warm-up turns) of a closed loop (:func:`stream_window`)."""
    require(t.arrival_s.ndim == 2, "summary", "arrival_s.ndim", t.arrival_s.ndim, "must be 2 (streams, requests)")
    in_window, span = stream_window(t, warmup, measured, closed)
    stream = per_stream(t, in_window, slo, span)
    flags = stream.pop("saturated")
    result = mean_ci_fields(stream, tuple(stream))
    result.update(_littles_ratio(stream))
    result["saturated"] = saturated(*window_shortfall(t, in_window))
    result["saturated_streams"] = int(np.sum(flags))
    return result


def _littles_ratio(stream: dict) -> dict:
    """Little's W across streams as the ratio of the means, W̄ = L̄ / λ̄, so that the reported terms satisfy
    L = λ·W as each stream's do (a mean of per-stream W would not); its 95 % half-width is the ratio
    estimator's, t · sd(L_s − W̄·λ_s) / (√S · λ̄)."""
    lam = np.asarray(stream["littles_arrival_rate_per_s"], np.float64)
    occupancy = np.asarray(stream["mean_requests_in_system"], np.float64)
    n = lam.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        w = occupancy.mean() / lam.mean()
        residual = occupancy - w * lam
        half = t975(n - 1) * residual.std(ddof=1) / (np.sqrt(n) * lam.mean()) if n > 1 else np.nan
    return {"littles_time_in_system_s": float(w), "ci95_littles_time_in_system_s": float(half)}


def is_online_key(key: str) -> bool:
    """Whether a :func:`summary` key exists for an online run only (:data:`ONLINE_KEYS` and their
    ``ci95_`` half-widths): a caller drops them for a fixed batch (NaN there, the flags False and 0)."""
    return key.removeprefix("ci95_") in ONLINE_KEYS


def saturation_warning(summary: dict) -> str | None:
    """One line for stderr when a summary (or a result row holding its keys) is ``saturated``; None
    otherwise (a fixed batch, whose keys were dropped, included)."""
    if summary.get("saturated") not in (True, "True"):
        return None
    return (f"warning: saturated: offered {float(summary['arrival_rate_per_s']):#.3g} req/s, completed "
            f"{float(summary['completion_rate_per_s']):#.3g} req/s in the measured window; latencies grow with "
            "the run's length and are not steady-state values")
