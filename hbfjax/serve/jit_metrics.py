"""Request metrics of one stream's serving run inside a jitted function (pure ``jax.numpy`` reductions of an
``engine.ServeOutput`` with no stream axis): what a tuning objective traces and differentiates.

They are the host metrics of :mod:`hbfjax.serve.metrics` over a window of every request (no warm-up:
``metrics.per_stream(times, metrics.window(R, 0, None))``), written once here for every tuning
problem (review 2026-12-02 §4, §9.6):

* a request is **measured** when it is valid and finished (``metrics.per_request``: a finite finish);
* :func:`throughput_tokens_per_s` is ``metrics``' ``throughput_tokens_per_s``: the measured requests'
  output tokens over the span from their first arrival to their last finish;
* :func:`mean_tpot_ms` is ``metrics``' ``tpot_ms``: the mean over the measured requests with more than
  one output token of (finish − first token) / (output − 1), in ms.

The host versions work in float64 seconds from the clocks (``clock.to_seconds``); these take the span
in float32 µs (``clock.diff_us``), so they agree to float32 rounding of the span (relative ~1e-7 of
the run's length, well inside 1e-5 for any run here). Forward-mode derivatives flow through the
clocks' µs parts (the whole seconds are integers). A stream with no measured request has throughput
0 and TPOT 0 here (NaN on the host: nothing measured).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hbfjax import clock

_NEVER = jnp.iinfo(jnp.int32).max  # clock.never()'s whole seconds: a request that never finished


def measured(out) -> jax.Array:
    """bool[R]: the requests the metrics count (valid and finished)."""
    return out.valid & (out.finish.s != _NEVER)


def span_s(out) -> jax.Array:
    """float32[] seconds from the first measured arrival to the last measured finish (0 with none)."""
    m = measured(out)
    last_s = jnp.where(m, out.finish.s, -1).max()
    last = clock.Clock(last_s, jnp.where(m & (out.finish.s == last_s), out.finish.us, -1.0).max())
    first_s = jnp.where(m, out.arrival.s, _NEVER).min()
    first = clock.Clock(first_s, jnp.where(m & (out.arrival.s == first_s), out.arrival.us, 1e7).min())
    return jnp.where(m.any(), clock.diff_us(last, first) * 1e-6, 0.0)


def throughput_tokens_per_s(out) -> jax.Array:
    """float32[] the measured requests' output tokens over their span (``metrics`` ``throughput_tokens_per_s``)."""
    m = measured(out)
    tokens = jnp.where(m, out.tokens_out, 0).sum().astype(jnp.float32)
    span = span_s(out)
    return jnp.where(span > 0, tokens / jnp.where(span > 0, span, 1.0), 0.0)


def mean_tpot_ms(out) -> jax.Array:
    """float32[] mean TPOT (ms) of the measured requests with more than one output token (``metrics`` ``tpot_ms``)."""
    several = measured(out) & (out.tokens_out > 1)
    per = clock.diff_us(out.finish, out.first_token) * 1e-3 / jnp.maximum(out.tokens_out - 1, 1).astype(jnp.float32)
    return jnp.where(several, per, 0.0).sum() / jnp.maximum(several.sum(), 1).astype(jnp.float32)
