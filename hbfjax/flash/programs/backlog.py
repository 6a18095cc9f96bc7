"""Synthetic writeback backlog: the Lindley recursion B' = max(0, B + N − w) (HBFlex §5.3, DESIGN.md §8).

Each iteration produces N ~ Poisson(λ) pages of new KV and offers one window that fits w page
programs; what does not fit waits in the buffer. This is a discrete-time queue whose stationary
mean is known exactly (computed here numerically on a truncated lattice), so it validates the
Monte Carlo machinery and gives the buffer a window policy needs.

Poisson draws use the inverse CDF on a counter-hash uniform (``hbfjax.rng``): ``max_arrivals`` (static)
bounds the table; choose it so that P(N > max_arrivals) is negligible (``poisson_table_size``).
It is an order of magnitude faster than ``jax.random.poisson`` on the CPU (BENCHMARKS.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.validate import INT32_MAX, ConfigError, require, require_int, require_real

MAX_TABLE = 2**20  # Poisson table entries (one f32 CDF per stream)
MAX_PAGES_PER_ITER = 1e6  # λ whose table (λ + 12√λ + 20) stays within MAX_TABLE
MAX_WINDOW_PAGES = 2**24  # w is a float32 knob: integers are exact up to 2^24
# exact_stationary iterates a lattice of M states convolved with a K-entry law until it settles,
# about λ / (w − λ)² sweeps per decade of accuracy: its work M · K · sweeps is bounded by this.
MAX_EXACT_WORK = 2e10



@dataclass(frozen=True)
class BacklogConfig:
    iterations: int
    warmup_iterations: int
    max_arrivals: int  # Poisson table size: draws are capped here

    def __post_init__(self) -> None:
        c = type(self).__name__
        require(isinstance(self.iterations, int), c, "iterations", self.iterations, "must be an int")
        require_int(c, "iterations", self.iterations, 1)
        require(0 <= self.warmup_iterations < self.iterations, c, "warmup_iterations", self.warmup_iterations,
                f"must lie in [0, iterations = {self.iterations})")
        require_int("BacklogConfig", "max_arrivals", self.max_arrivals, 1, MAX_TABLE)
        require(self.iterations * self.max_arrivals <= INT32_MAX, "BacklogConfig", "iterations", self.iterations,
                f"iterations × max_arrivals ({self.max_arrivals}) must be <= {INT32_MAX}: the int32 backlog "
                "grows by at most max_arrivals pages per iteration")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class BacklogKnobs:
    pages_per_iter: jax.Array  # f32[] λ: mean new pages per iteration
    window_pages: jax.Array  # f32[] w: page programs one window fits

    @classmethod
    def make(cls, pages_per_iter, window_pages) -> "BacklogKnobs":
        """Validated knobs: λ finite in [0, 1e6], w a whole number of pages in [1, 2^24]."""
        require_real(cls.__name__, "pages_per_iter", pages_per_iter, 0.0, MAX_PAGES_PER_ITER)
        require_int(cls.__name__, "window_pages", window_pages, 1, MAX_WINDOW_PAGES)
        return cls(jnp.asarray(pages_per_iter, jnp.float32), jnp.asarray(window_pages, jnp.float32))


class BacklogOutput(NamedTuple):
    """One stream's backlog over the iterations after warm-up."""

    mean_backlog_pages: jax.Array  # f32[]
    p_backlog_positive: jax.Array  # f32[] fraction of iterations with a backlog
    max_backlog_pages: jax.Array  # i32[]


def poisson_table_size(lam: float) -> int:
    """A table size with P(N > size) < 1e-12 for N ~ Poisson(lam)."""
    return int(math.ceil(lam + 12.0 * math.sqrt(lam) + 20.0))


def poisson_cdf(lam: jax.Array, max_arrivals: int) -> jax.Array:
    """f32[K]: P(N ≤ k) for k = 0 … K−1 (K = max_arrivals)."""
    k = jnp.arange(max_arrivals, dtype=jnp.float32)
    logp = k * jnp.log(jnp.maximum(lam, 1e-30)) - lam - jax.lax.lgamma(k + 1.0)
    return jnp.cumsum(jnp.exp(logp))


def poisson_from_uniform(u: jax.Array, cdf: jax.Array) -> jax.Array:
    """int32 Poisson draw by inverse CDF: the number of table entries with cdf ≤ u."""
    return jnp.searchsorted(cdf, u, side="right").astype(jnp.int32)


def lindley_step(backlog: jax.Array, arrivals: jax.Array, window: jax.Array) -> jax.Array:
    """B' = max(0, B + N − w) (int32)."""
    return jnp.maximum(backlog + arrivals - window, 0)


def simulate(stream_id, seed, knobs: BacklogKnobs, inputs: None, config: BacklogConfig) -> BacklogOutput:
    """One stream of the synthetic backlog (no inputs); means over the iterations after warm-up."""
    cdf = poisson_cdf(knobs.pages_per_iter, config.max_arrivals)
    w = jnp.floor(knobs.window_pages).astype(jnp.int32)
    it = jnp.arange(config.iterations, dtype=jnp.uint32)
    arrivals = poisson_from_uniform(rng.uniform01(rng.mix(seed, stream_id, it, Salt.BACKLOG_ARRIVALS)), cdf)

    def step(b, n):
        b = lindley_step(b, n, w)
        return b, b

    _, b = jax.lax.scan(step, jnp.int32(0), arrivals)
    b = b[config.warmup_iterations:]
    return BacklogOutput(mean_backlog_pages=jnp.mean(b.astype(jnp.float32)),
                         p_backlog_positive=jnp.mean((b > 0).astype(jnp.float32)), max_backlog_pages=jnp.max(b))


def _lattice_size(lam: float, w: int) -> int:
    # geometric tail: the lattice is large enough that the decay rate leaves < 1e-15 mass beyond it
    return int(200 + 60 * w / max(1 - lam / w, 1e-3))


def exact_work(lam: float, w: int) -> float:
    """Estimated multiply-adds of :func:`exact_stationary`: lattice × table × sweeps, with
    sweeps ≈ 30 · (1 + λ / (w − λ)²) (the relaxation time of the queue, 13 decades of accuracy)."""
    K = poisson_table_size(lam) + 1
    return _lattice_size(lam, w) * K * 30.0 * (1.0 + lam / (w - lam) ** 2)


def check_exact_cost(lam: float, w: int) -> None:
    """Refuse a λ/w whose exact stationary law would take more than ``MAX_EXACT_WORK`` operations."""
    work = exact_work(lam, w)
    require(work <= MAX_EXACT_WORK, "", "pages_per_iter", lam,
            f"the exact stationary backlog at w = {w} needs about {work:.2g} operations (lattice "
            f"{_lattice_size(lam, w)} × table {poisson_table_size(lam) + 1} × sweeps ≈ 30 (1 + λ / (w − λ)²)), "
            f"more than the {MAX_EXACT_WORK:.0e} allowed (minutes): choose λ farther below w or a smaller w")


def exact_stationary(lam: float, w: int, tol: float = 1e-13, max_sweeps: int = 200_000) -> dict:
    """Exact stationary law of B' = max(0, B + N − w), N ~ Poisson(lam), lam < w, by iterating the
    distribution on a truncated lattice (float64) until the L1 change is below ``tol``.

    Returns ``mean_backlog_pages``, ``p_backlog_positive`` and ``truncation`` (the lattice size)."""
    if not 0 <= lam < w:
        raise ConfigError(f"pages_per_iter = {lam!r}: a stationary backlog needs 0 <= λ < window_pages = {w}")
    K = poisson_table_size(lam) + 1
    k = np.arange(K)
    pmf = np.exp(k * math.log(max(lam, 1e-300)) - lam - np.array([math.lgamma(x + 1) for x in k]))
    pmf /= pmf.sum()
    check_exact_cost(lam, w)
    M = _lattice_size(lam, w)
    pi = np.zeros(M)
    pi[0] = 1.0
    for _ in range(max_sweeps):
        conv = np.convolve(pi, pmf)  # law of B + N
        new = np.zeros(M)
        new[0] = conv[: w + 1].sum()
        top = conv[w + 1: w + M]
        new[1: 1 + top.size] = top
        new /= new.sum()
        change = np.abs(new - pi).sum()
        pi = new
        if change < tol:
            break
    else:
        raise ConfigError(f"pages_per_iter = {lam!r}: the exact stationary backlog at w = {w} did not settle "
                          f"within {max_sweeps} sweeps (L1 change {change:.2g} > {tol:g})")
    idx = np.arange(M)
    return {"mean_backlog_pages": float((idx * pi).sum()), "p_backlog_positive": float(1.0 - pi[0]),
            "truncation": M}
