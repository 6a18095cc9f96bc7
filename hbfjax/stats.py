"""Summary statistics across Monte Carlo streams: means with 95 % confidence half-widths."""

from __future__ import annotations

import math

import numpy as np

# Student t 0.975 quantiles for 1..10 degrees of freedom; beyond, a Cornish–Fisher expansion
# (error < 1e-3 for df > 10).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
_Z975 = 1.959964


def t975(df: int) -> float:
    """Two-sided 95 % Student-t critical value."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(samples, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95 % confidence half-width of the mean along ``axis`` (one sample per stream)."""
    x = np.asarray(samples, dtype=np.float64)
    n = x.shape[axis]
    mean = x.mean(axis=axis)
    if n < 2:
        return mean, np.full_like(mean, np.inf)
    sem = x.std(axis=axis, ddof=1) / math.sqrt(n)
    return mean, t975(n - 1) * sem
