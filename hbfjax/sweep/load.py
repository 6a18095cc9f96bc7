"""Offered load relative to a reference system's backlogged throughput (DASH §VI-E): a driver that runs
the reference's batch before the online run it sets the rate of.

DASH §VI-E replays Poisson arrivals "at 50 %, 75 % and 90 % of RelayOnly's backlogged throughput". The
paper does not define that throughput further; hbfjax's definition:

* **backlogged**: every request of the stream is present at t = 0 (``RequestsConfig(arrivals="batch")``
  with ``RequestKnobs.batch`` = R + B_max: the online run's R and one slot table more, so the queue
  is not empty before the measured window closes), served by the same batcher as the online run
  (DASH: B_max = 32 slots, 512-token chunks, an 8,192-token budget, Mixed): the server is never idle
  and never short of work;
* **throughput** of one stream: the completion rate between the ``warmup``-th and the
  ``(warmup + measured)``-th completion, ``measured / (f₍W+M₎ − f₍W₎)`` requests/s with ``f₍k₎`` the
  k-th smallest finish time (``f₍0₎`` = 0). Order statistics, not request indices, so the window is the
  server's steady state whatever order requests complete in; the ramp-up of the first W completions
  and the drain after the last measured one are excluded (DASH: W = 128, M = 1,024);
* the reported value is the mean of that rate over independent streams with its 95 % half-width.

The offered rate at load x is then ``x × reference_throughput`` (:func:`rate_for_load`).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.serve import engine, metrics
from hbfjax.stats import mean_ci95
from hbfjax.validate import require, require_int, require_real
from hbfjax.workload import requests as rq

MAX_LOAD = 10.0  # an offered load above 10× the reference's capacity is surely a units mistake


def completion_rate_per_s(finish_s, warmup: int, measured: int) -> np.ndarray:
    """float64[...] requests/s per stream: ``measured / (f₍W+M₎ − f₍W₎)`` over the sorted finish times
    ``finish_s`` (float64[..., R] s, ``inf`` where never finished: such a window gives rate 0)."""
    f = np.sort(np.asarray(finish_s, np.float64), axis=-1)
    r = f.shape[-1]
    require_int("completion_rate_per_s", "warmup", warmup, 0, r - 1)
    require_int("completion_rate_per_s", "measured", measured, 1, r - warmup)
    start = np.zeros(f.shape[:-1]) if warmup == 0 else f[..., warmup - 1]
    with np.errstate(invalid="ignore"):
        span = f[..., warmup + measured - 1] - start
    return np.where(np.isfinite(span), measured / span, 0.0)


def backlogged_config(config: engine.ServeConfig) -> engine.ServeConfig:
    """``config`` with R + B_max requests all present at t = 0 (same lengths, batcher and bounds)."""
    r = config.requests
    require(r.arrivals != "trace", "backlogged_config", "requests.arrivals", r.arrivals,
            "a trace's requests have their own lengths; give a synthetic stream's config")
    requests = rq.RequestsConfig(requests=r.requests + config.batcher.slots, arrivals="batch", prompt_lengths=r.prompt_lengths,
                                 output_lengths=r.output_lengths)
    return dataclasses.replace(config, requests=requests)


def backlogged_knobs(knobs: engine.ServeKnobs, config: engine.ServeConfig) -> engine.ServeKnobs:
    """``knobs`` with a batch of all of ``config``'s requests (works on a stacked knob axis too)."""
    r = knobs.requests
    batch_r = jnp.full(jnp.shape(r.batch), config.requests.requests, jnp.int32)
    return dataclasses.replace(knobs, requests=dataclasses.replace(r, batch=batch_r))


def backlogged_rates(knobs: engine.ServeKnobs, config: engine.ServeConfig, streams: int, seed: int, warmup: int,
                     measured: int, *, knob_axis: bool = False, inputs=None) -> tuple[np.ndarray, bool]:
    """``(rates, overflow)``: float64[S] (float64[S, K] on a knob axis) backlogged requests/s of each
    stream (module docstring), and whether any run overflowed (its rate is then not a throughput);
    ``inputs``: the reference's ``ServeInputs`` (its tabulated laws; no trace)."""
    cfg = backlogged_config(config)
    out = batch.run(engine.simulate, streams, seed, backlogged_knobs(knobs, cfg), cfg, knob_axis=knob_axis,
                    inputs=inputs)
    t = metrics.times(out.arrival, out.first_token, out.finish, out.tokens_out, out.valid)  # [S, (K,) R]
    return completion_rate_per_s(np.where(t.valid, t.finish_s, np.inf), warmup, measured), bool(np.any(out.overflow))


def backlogged_rate_per_s(reference_knobs: engine.ServeKnobs, config: engine.ServeConfig, streams: int, seed: int,
                          warmup: int, measured: int, inputs=None) -> tuple[float, float]:
    """The reference organisation's backlogged throughput in requests/s: mean across ``streams`` and its
    95 % half-width (module docstring). ``config`` is the online run's (its arrivals are replaced);
    a run that overflows (a request never fits, or ``max_iterations`` ran out) is refused."""
    rates, overflow = backlogged_rates(reference_knobs, config, streams, seed, warmup, measured, inputs=inputs)
    require(not overflow, "backlogged_rate_per_s", "overflow", overflow,
            f"the backlogged run did not finish (raise ServeConfig.max_iterations = {config.max_iterations})")
    mean, ci = mean_ci95(rates)
    return float(mean), float(ci)


def rate_for_load(load: float, reference_throughput: float) -> float:
    """Poisson arrival rate (requests/s) offering ``load`` (a fraction, DASH: 0.5, 0.75, 0.9) of a
    reference's backlogged throughput (requests/s)."""
    load = require_real("rate_for_load", "load", load, 0.0, MAX_LOAD, lo_open=True)
    ref = require_real("rate_for_load", "reference_throughput", reference_throughput, 0.0, 1e6, lo_open=True)
    return load * ref
