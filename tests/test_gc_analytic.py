"""GC write amplification against analytic models (DESIGN.md §8 rung 2).

The analytic models describe the blocks that circulate through GC. Our GC keeps a small free
reserve (a chunk of host writes + one victim's migration room) and one open block, which hold no
valid data and are never victims, so we compare at the *effective* α = (physical − mean free pages
in the pool and open block) / logical, measured per run (``gc_summary(...)['alpha_effective']``).
"""

import math

import pytest

from hbfjax import batch
from hbfjax.flash.erase import gc, analytic as an, gc_overwrite as ow
from hbfjax.flash.erase.reference import overwrite_waf
from hbfjax.reports import gc_summary


def test_lambert_w_satisfies_its_equation_on_both_sides_of_zero():
    for x in (-1 / math.e, -0.3678, -0.3, -0.1, -1e-6, 1e-6, 0.5, 1.0, 10.0, 1e6):
        w = an.lambert_w0(x)
        assert w >= -1.0
        assert w * math.exp(w) == pytest.approx(x, rel=1e-10, abs=1e-12)
    assert an.lambert_w0(math.e) == pytest.approx(1.0, rel=1e-14)
    with pytest.raises(ValueError, match="branch point"):
        an.lambert_w0(-0.5)


def test_fifo_model_solves_the_survival_fixed_point():
    for alpha in (1.05, 1.2, 2.0):
        v = an.fifo_valid_fraction(alpha)
        assert 0 < v < 1 and v == pytest.approx(math.exp(-alpha * (1 - v)), rel=1e-12)
        assert an.waf_fifo(alpha) == pytest.approx(1 / (1 - v))


def test_greedy_mean_field_tends_to_fifo_for_large_blocks_and_beats_it_for_small():
    for alpha in (1.1, 1.3):
        assert an.waf_greedy(alpha, 8192) == pytest.approx(an.waf_fifo(alpha), rel=2e-3)
        assert an.waf_greedy(alpha, 16) < an.waf_greedy(alpha, 64) < an.waf_fifo(alpha)
    # K = 4, α = 2: the flow balance has victims at exactly c = … (checked by hand): WAF = K/(K − c̄).
    assert 1.0 <= an.waf_greedy(2.0, 4) < an.waf_fifo(2.0)
    assert an.waf_random(1.25) == pytest.approx(5.0)


def _run(victim, spare, streams=12, measure_chunks=400):
    bc = gc.BlockConfig(n_blocks=256, pages_per_block=32, victim=victim, victims_per_gc=8)
    cfg = ow.OverwriteConfig(blocks=bc, logical_pages=int(round((1 - spare) * bc.physical_pages)), chunk_pages=32,
                             warmup_chunks=300, measure_chunks=measure_chunks)
    out = batch.run(ow.simulate, streams, 11, ow.OverwriteKnobs.make(cfg), cfg)
    return gc_summary(out, bc.physical_pages, valid_pages=cfg.logical_pages), out


# Tolerance: |sim − model| ≤ 3 × (95 % CI half-width across streams) + model allowance. The FIFO and
# random models are exact in expectation at the effective α (allowance 0). Greedy's model is the
# fluid (many-blocks) limit; with 256 blocks a run sits ≈ 0.3 % above it (finite-size effect of a
# discrete victim level), so greedy gets a 1 % allowance, stated here rather than hidden in the CI.
@pytest.mark.parametrize("victim,spare,allowance", [("greedy", 0.15, 0.01), ("fifo", 0.2, 0.0), ("random", 0.25, 0.0)])
def test_uniform_overwrite_waf_matches_the_analytic_model(victim, spare, allowance):
    res, out = _run(victim, spare)
    assert not res["overflow"]  # (a few chunks may wait for GC: throttling changes no ratio)
    alpha = res["alpha_effective"]
    # The reserve and open block cost 3–4 blocks of 256: α_eff sits below the nominal 1/(1 − s).
    assert 1.0 < alpha < 1 / (1 - spare)
    model = {"greedy": an.waf_greedy(alpha, 32), "fifo": an.waf_fifo(alpha), "random": an.waf_random(alpha)}[victim]
    assert abs(res["waf"] - model) <= 3 * res["ci95_waf"] + allowance * model, (res["waf"], res["ci95_waf"], model)
    assert res["waf"] > 1.2  # the comparison is not vacuous


def test_sequential_reference_agrees_with_the_greedy_model():
    # The plain NumPy FTL (one write, one victim at a time; reserve 3 blocks + the open one).
    b, k, spare = 256, 32, 0.15
    logical = int(round((1 - spare) * b * k))
    r = overwrite_waf(b, k, logical, "greedy", host_writes=60_000, warmup_writes=25_000, reserve_blocks=3, seed=1)
    alpha = (b - 3.5) * k / logical  # free pool 3 blocks + on average half an open block
    assert r["waf"] == pytest.approx(an.waf_greedy(alpha, k), rel=0.02)
