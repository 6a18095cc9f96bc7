"""Two tuning problems whose objective and gradient are known exactly, to validate the estimators (issue 13).

* **Max plane load under non-uniform plane probabilities.** ``pages`` pages each land on plane j with
  probability p_j (a :class:`Split` knob: the raw coordinates are the logits). The read costs the
  most loaded plane. ``E[max load]`` is a smooth function of p, computed exactly from the multinomial's
  generating function: ``P(max ≤ m) = n! [xⁿ] Π_j Σ_{i≤m} (p_j x)^i / i!``. The simulation draws each
  page's plane by inverse CDF of a counter-hash uniform; relaxed, a page's membership of plane j is
  ``soft_step(u − c_{j−1}) − soft_step(u − c_j)`` on the cumulative probabilities c (temperature t in
  probability units) and the maximum is ``soft_max`` at t (in pages).
* **Writeback backlog with exponential new work.** ``B' = max(0, B + A − w)`` with A ~ Exp(mean a)
  pages per iteration and a window of w pages (``hbfjax.flash.programs.backlog`` with continuous work).
  The stationary backlog is the maximum of a random walk whose ascending ladder heights are Exp(1/a),
  so ``P(B > x) = (1 − η a) e^{−η x}`` with η the positive root of ``e^{−η w} = 1 − η a``; hence
  ``E[B] = (1 − η a) / η``, smooth in w, with ``dη/dw`` by implicit differentiation. The pathwise
  derivative of the recursion (infinitesimal perturbation analysis) is unbiased here: the hard max
  needs no relaxation, and ``relax`` replaces it by ``soft_relu`` at t pages only to show the bias.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.tune.problem import Fraction, Knob, Problem, Split, TuneDefaults
from hbfjax.relax import soft_max, soft_relu, soft_step
from hbfjax.validate import require, require_int, require_real


# ---- max plane load --------------------------------------------------------------------------------
def expected_max_load(p: jax.Array, pages: int) -> jax.Array:
    """E[max_j load_j] of ``pages`` pages on planes with probabilities ``p`` [planes], exactly (differentiable)."""
    n = require_int("", "pages", pages, 1, 64)
    fact = jnp.asarray([math.factorial(i) for i in range(n + 1)], p.dtype)
    powers = p[:, None] ** jnp.arange(n + 1, dtype=p.dtype)[None, :] / fact[None, :]  # [planes, n+1]

    def p_max_at_most(m: int) -> jax.Array:
        poly = jnp.zeros(n + 1, p.dtype).at[0].set(1.0)
        trunc = jnp.where(jnp.arange(n + 1) <= m, powers, 0.0)
        for j in range(p.shape[0]):
            poly = jnp.convolve(poly, trunc[j])[: n + 1]
        return poly[n] * fact[n]

    return sum(1.0 - p_max_at_most(m) for m in range(n))


def _plane_of(u: jax.Array, p: jax.Array) -> jax.Array:
    """Inverse-CDF plane of each uniform (int32)."""
    return jnp.sum(u[:, None] >= jnp.cumsum(p)[None, :-1], axis=1)


def max_load_problem(*, planes: int = 4, pages: int = 8, streams: int = 4096, init=None) -> Problem:
    """The max-load reference problem: knob ``plane_probabilities`` (a split of ``planes``)."""
    require_int("max_load_problem", "planes", planes, 2, 16)
    require_int("max_load_problem", "pages", pages, 1, 64)
    ids = jnp.arange(require_int("max_load_problem", "streams", streams, 1), dtype=jnp.int32)
    page = jnp.arange(pages, dtype=jnp.int32)

    def stream(s, seed, p, relax):
        u = rng.uniform01(rng.mix(seed, s, page, Salt.TUNE_PAGE_PLANE))
        if relax is None:
            return jnp.max(jnp.sum(jax.nn.one_hot(_plane_of(u, p), planes), axis=0))
        t = relax.temperature
        inner = soft_step(u[:, None] - jnp.cumsum(p)[None, :-1], t)  # [pages, planes−1]
        above = jnp.concatenate([jnp.ones((pages, 1)), inner], axis=1)
        below = jnp.concatenate([inner, jnp.zeros((pages, 1))], axis=1)
        return soft_max(jnp.sum(above - below, axis=0), t)

    def objective(values, seed, relax):
        return jnp.mean(jax.vmap(lambda s: stream(s, seed, values["plane_probabilities"], relax))(ids))

    uniform = tuple([1.0 / planes] * planes)
    init = init or tuple(np.linspace(2.0, 1.0, planes) / np.linspace(2.0, 1.0, planes).sum())
    grid = tuple(tuple(float(x) for x in v) for v in (uniform, init))
    return Problem(name="max-load", knobs=(Knob("plane_probabilities", Split(planes), grid),),
                   objective=objective, objective_label="E[max plane load] (pages)", streams=streams,
                   defaults=TuneDefaults(init={"plane_probabilities": init}, steps=1),
                   description="reference: expected max load under non-uniform plane probabilities")


# ---- writeback backlog with exponential work ----------------------------------------------------------
def exponential_backlog(mean_work_pages: float, window_pages: float) -> tuple[float, float]:
    """(E[B], dE[B]/dw) of the stationary backlog with Exp(mean a) work and a window w > a (float64)."""
    a = require_real("", "mean_work_pages", mean_work_pages, 0.0, lo_open=True)
    w = require_real("", "window_pages", window_pages, 0.0, lo_open=True)
    require(w > a, "", "window_pages", w, f"must exceed the mean work {a} (a stable queue)")
    h = lambda eta: math.exp(-eta * w) - 1.0 + eta * a  # noqa: E731  (h(0) = 0, h < 0 just above 0)
    lo, hi = 1e-12, 1.0 / a
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if h(mid) < 0 else (lo, mid)
    eta = 0.5 * (lo + hi)
    mean = (1.0 - eta * a) / eta
    # implicit: h(η(w), w) = 0 → dη/dw = −h_w / h_η = η e^{−ηw} / (a − w e^{−ηw})
    e = math.exp(-eta * w)
    d_eta = eta * e / (a - w * e)
    d_mean = -d_eta / eta**2  # d/dη of (1 − ηa)/η = −1/η²
    return mean, d_mean


def backlog_problem(*, mean_work_pages: float = 2.0, iterations: int = 512, warmup: int = 128,
                    streams: int = 1024, window=(2.5, 6.0), init: float = 3.0) -> Problem:
    """The backlog reference problem: knob ``window_pages`` (a Fraction of the interval ``window``)."""
    a = require_real("backlog_problem", "mean_work_pages", mean_work_pages, 0.0, lo_open=True)
    require(window[0] > a, "backlog_problem", "window", window, f"the lowest window must exceed the mean work {a}")
    ids = jnp.arange(require_int("backlog_problem", "streams", streams, 1), dtype=jnp.int32)
    it = jnp.arange(require_int("backlog_problem", "iterations", iterations, 2), dtype=jnp.int32)
    require_int("backlog_problem", "warmup", warmup, 0, iterations - 1)

    def stream(s, seed, w, relax):
        work = -a * jnp.log1p(-rng.uniform01(rng.mix(seed, s, it, Salt.TUNE_WORK)))
        step = (lambda x: jnp.maximum(x, 0.0)) if relax is None else (lambda x: soft_relu(x, relax.temperature))

        def body(b, x):
            b = step(b + x - w)
            return b, b

        _, b = jax.lax.scan(body, jnp.float32(0.0), work)
        return jnp.mean(b[warmup:])

    def objective(values, seed, relax):
        return jnp.mean(jax.vmap(lambda s: stream(s, seed, values["window_pages"], relax))(ids))

    return Problem(name="backlog", knobs=(Knob("window_pages", Fraction(*window), tuple(np.linspace(*window, 8))),),
                   objective=objective, objective_label="mean backlog (pages)", streams=streams,
                   defaults=TuneDefaults(init={"window_pages": init}, steps=1),
                   description="reference: stationary backlog with exponential work")
