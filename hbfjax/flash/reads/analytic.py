"""Exact analytic results the Monte Carlo is checked against (DESIGN.md §8, rung 2).

``max_load_cdf`` and ``expected_max_load`` give the exact distribution of the maximum bin load when n
balls (pages) fall independently and uniformly into m bins (planes) — the waves of a randomly placed
read. No asymptotic formula: a dynamic programme over bins with binomial splits, in float64.
"""

from __future__ import annotations

import math

import numpy as np


def _binom_pmf_table(n: int, k: int, p: float, log_factorial: np.ndarray) -> np.ndarray:
    """[k+1, n+1]: P(Binomial(t, p) = c) for c ≤ k (rows) and t ≤ n (columns); 0 where c > t."""
    c = np.arange(k + 1)[:, None]
    t = np.arange(n + 1)[None, :]
    ok = t >= c
    tc = np.where(ok, t - c, 0)
    log_q = math.log1p(-p) if p < 1 else -math.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        log_pmf = (log_factorial[t] - log_factorial[c] - log_factorial[tc]
                   + c * math.log(p) + np.where(tc > 0, tc * log_q, 0.0))
    return np.where(ok, np.exp(log_pmf), 0.0)


def max_load_cdf(n: int, m: int, k: int) -> float:
    """P(max load ≤ k) for n balls thrown uniformly into m bins, exactly (up to float64 rounding).

    h_j(t) = P(t balls thrown into j bins leave every bin ≤ k); the first of the j bins receives
    Binomial(t, 1/j) balls and the rest are uniform on j−1 bins:
    h_j(t) = Σ_{c ≤ k} Binom(t, 1/j)(c) · h_{j−1}(t − c), with h_1(t) = [t ≤ k].
    """
    if n < 0 or m < 1 or k < 0:
        raise ValueError(f"need n >= 0, m >= 1, k >= 0 (got n={n}, m={m}, k={k})")
    if k >= n:
        return 1.0
    if k * m < n:
        return 0.0
    log_factorial = np.array([math.lgamma(i + 1) for i in range(n + 1)])
    h = (np.arange(n + 1) <= k).astype(np.float64)  # one bin
    for j in range(2, m + 1):
        weight = _binom_pmf_table(n, k, 1.0 / j, log_factorial)
        shifted = np.stack([np.concatenate([np.zeros(c), h[: n + 1 - c]]) for c in range(k + 1)])
        h = np.sum(weight * shifted, axis=0)
    return float(h[n])


def expected_max_load(n: int, m: int) -> float:
    """E[max load] of n balls in m bins: Σ_{k≥0} P(max > k) (HBFlex §3.1 random placement)."""
    total = 0.0
    for k in range(n + 1):
        tail = 1.0 - max_load_cdf(n, m, k)
        if tail <= 0.0:
            break
        total += tail
    return total
