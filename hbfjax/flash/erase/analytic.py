"""Analytic write amplification of GC under uniform random overwrites (DESIGN.md §8 rung 2).

α = physical / logical pages *in circulation* (exclude the free reserve and open blocks: the
effective spare factor s_eff = 1 − 1/α). Each model is the steady state of uniform overwrites:

* FIFO victim (Desnoyers 2012; Hu et al. 2009): a page survives one pass of the log with
  probability v = exp(−α(1 − v)), so WAF = 1/(1 − v) = α / (α + W₀(−α e^{−α})).
* Greedy victim, mean-field (fluid limit, many blocks) with finite pages per block K: blocks enter
  full, lose valid pages at rate ∝ their count, and greedy takes them at the lowest level. The
  victim count is a mix of c₀ and c₀ + 1; solving the flow balance level by level gives WAF. As
  K → ∞ this tends to the FIFO value (Bux & Iliadis 2010); for small K greedy is better.
* Random victim: a victim is an average block, valid fraction 1/α, so WAF = α / (α − 1).

Pure Python floats (no SciPy); Lambert W by Halley iteration.
"""

from __future__ import annotations

import math


def lambert_w0(x: float, tol: float = 1e-15) -> float:
    """Principal branch W₀(x) for x ≥ −1/e: the w ≥ −1 solving w·e^w = x (Halley's method)."""
    if x < -1.0 / math.e - 1e-15:
        raise ValueError(f"lambert_w0: x = {x!r} below the branch point −1/e")
    if x == 0.0:
        return 0.0
    if x < -0.3:  # near the branch point: series in p = sqrt(2(e·x + 1))
        p = math.sqrt(max(2.0 * (math.e * x + 1.0), 0.0))
        w = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p**3
    elif x < 3.0:
        w = math.log1p(x)
    else:
        lx = math.log(x)
        w = lx - math.log(lx)
    for _ in range(100):
        ew = math.exp(w)
        f = w * ew - x
        if w == -1.0:
            break
        denom = ew * (w + 1.0) - (w + 2.0) * f / (2.0 * w + 2.0)
        step = f / denom
        w -= step
        if abs(step) <= tol * (1.0 + abs(w)):
            break
    return w


def _check_alpha(alpha: float) -> None:
    if not alpha > 1.0:
        raise ValueError(f"alpha = {alpha!r}: physical/logical pages must be > 1 (spare factor > 0)")


def alpha_from_spare(spare_factor: float) -> float:
    """α = physical/logical = 1 / (1 − s)."""
    if not 0.0 < spare_factor < 1.0:
        raise ValueError(f"spare_factor = {spare_factor!r}: must be in (0, 1)")
    return 1.0 / (1.0 - spare_factor)


def fifo_valid_fraction(alpha: float) -> float:
    """Valid fraction v of a FIFO victim: v = −W₀(−α e^{−α}) / α."""
    _check_alpha(alpha)
    return -lambert_w0(-alpha * math.exp(-alpha)) / alpha


def waf_fifo(alpha: float) -> float:
    """FIFO-victim WAF under uniform overwrites (Lambert-W model, Desnoyers)."""
    return 1.0 / (1.0 - fifo_valid_fraction(alpha))


def waf_random(alpha: float) -> float:
    """Random-victim WAF under uniform overwrites: α / (α − 1)."""
    _check_alpha(alpha)
    return alpha / (alpha - 1.0)


def waf_greedy(alpha: float, pages_per_block: int) -> float:
    """Greedy-victim WAF, mean-field with K = ``pages_per_block`` (fluid limit in the block count).

    Levels j > c₀ + 1 carry a constant flow r (blocks created per host write), so their share is
    r·(K/α)/j; level c₀ + 1 holds x and hands d = x(c₀+1)α/K per host write down to c₀ where greedy
    takes it at once, the rest r − d it takes at c₀ + 1. Block count Σ = 1 and valid-page balance
    r(K − c₀ − 1) + d = 1 give r for each c₀; the consistent c₀ has 0 ≤ d ≤ r. WAF = r·K.
    """
    _check_alpha(alpha)
    k = int(pages_per_block)
    if k < 1:
        raise ValueError(f"pages_per_block = {pages_per_block!r}: must be >= 1")
    harmonic = [0.0]
    for j in range(1, k + 1):
        harmonic.append(harmonic[-1] + 1.0 / j)
    for c0 in range(k):
        tail = harmonic[k] - harmonic[c0 + 1] - (k - c0 - 1) / (c0 + 1)
        rhs = 1.0 - k / (alpha * (c0 + 1))
        if tail == 0.0:  # c0 = K − 1, K = 1: every victim is empty or full
            return 1.0 if alpha > 1.0 else math.inf
        r = rhs * alpha / (k * tail)
        d = 1.0 - r * (k - c0 - 1)
        if c0 == 0 and r > 0.0 and d > r:
            return 1.0  # blocks empty out before GC needs them: victims hold no valid page
        if r > 0.0 and -1e-12 <= d <= r + 1e-12:
            return r * k
    raise ArithmeticError(f"waf_greedy: no consistent level for alpha = {alpha}, K = {k}")
