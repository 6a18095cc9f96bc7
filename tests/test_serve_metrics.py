"""Request metrics (hbfjax.serve.metrics): hand-computed TTFT/TPOT/E2E, a fixed batch by hand,
warm-up masking, quantiles, and Little's law L = λW on Poisson streams within a confidence interval."""

import jax
import numpy as np
import pytest
from test_batching import THREE, SMALL, requests_of, serve, tokens_pass_us

from hbfjax import batch
from hbfjax.serve import metrics
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.validate import ConfigError
from hbfjax.workload import requests as rq

Z = 4.5  # tolerance in standard errors: two-sided false-alarm rate ~7e-6 per check
TAU_US = 1000.0  # constant iteration time of the fixed-batch runs


def _times(requests, out) -> metrics.RequestTimes:
    return metrics.times(requests.arrival, out.first_token, out.finish, out.tokens_out, requests.valid)


def _one_stream(requests):
    return jax.tree_util.tree_map(lambda a: a[None], requests)


def test_per_request_from_the_hand_trace():
    """The mixed hand trace of test_batching (first tokens 290, 290, 540 µs; finishes 540, 410, 540;
    arrivals 0, 0, 150): TTFT 290, 290, 390 µs; E2E 540, 410, 390 µs; TPOT (540 − 290)/2 = 125 and
    (410 − 290)/1 = 120 µs, undefined for r2's single token."""
    req = _one_stream(requests_of(*THREE))
    out = jax.vmap(lambda r: serve(r, BatcherKnobs.make(**SMALL), BatcherConfig(slots=2), tokens_pass_us))(req)
    m = metrics.per_request(_times(req, out), metrics.window(3, 0, None))
    np.testing.assert_allclose(m.ttft_s[0] * 1e6, [290, 290, 390], rtol=1e-12)
    np.testing.assert_allclose(m.e2e_s[0] * 1e6, [540, 410, 390], rtol=1e-12)
    np.testing.assert_allclose(m.tpot_s[0, :2] * 1e6, [125, 120], rtol=1e-12)
    assert np.isnan(m.tpot_s[0, 2])


def test_slo_goodput_from_the_hand_trace():
    """The same trace against TTFT ≤ 300 µs and TPOT ≤ 122 µs: r0 fails TPOT (125), r1 meets both (290, 120),
    r2 fails TTFT (390) — its one-token output has no TPOT. Span 0 … 540 µs: goodput 1/540 µs, 2 tokens."""
    req = _one_stream(requests_of(*THREE))
    out = jax.vmap(lambda r: serve(r, BatcherKnobs.make(**SMALL), BatcherConfig(slots=2), tokens_pass_us))(req)
    s = metrics.per_stream(_times(req, out), metrics.window(3, 0, None), metrics.Slo(ttft_s=300e-6, tpot_ms=0.122))
    assert s["slo_attainment"][0] == pytest.approx(1 / 3)
    assert s["goodput_requests_per_s"][0] == pytest.approx(1 / 540e-6)
    assert s["goodput_tokens_per_s"][0] == pytest.approx(int(out.tokens_out[0, 1]) / 540e-6)
    loose = metrics.per_stream(_times(req, out), metrics.window(3, 0, None), metrics.Slo(ttft_s=1.0))
    assert loose["slo_attainment"][0] == 1.0  # no TPOT bound: every request meets a 1 s TTFT


def constant_us(p, draw=0):
    return TAU_US + 0.0 * p.decode_mask.sum()


def _fixed_batch(b: int, prompt: int, output: int):
    config = rq.RequestsConfig(requests=36, arrivals="batch")
    knobs = rq.RequestKnobs.make(batch=b, prompt=rq.LengthKnobs.make(prompt), output=rq.LengthKnobs.make(output))
    req = batch.run(rq.generate, 1, 0, knobs, config)
    out = jax.vmap(lambda r: serve(r, BatcherKnobs.make(512, 8192), BatcherConfig(slots=32),
                                   constant_us))(req)
    return _times(req, out)


def test_fixed_batch_by_hand():
    """B = 4, 1,024/128, chunk 512, τ = 1 ms per iteration: two prefill iterations, then 127 decodes.
    TTFT 2 ms, E2E 129 ms, TPOT 1 ms; throughput 4·128/0.129 s; decode rate 4·127/0.127 s = B/τ."""
    s = metrics.summary(_fixed_batch(4, 1024, 128), warmup=0, measured=4)  # requests 4–35 are padding
    assert s["ttft_s"] == pytest.approx(2e-3, rel=1e-9) and s["e2e_s"] == pytest.approx(0.129, rel=1e-9)
    assert s["tpot_ms"] == pytest.approx(1.0, rel=1e-9)
    assert s["throughput_tokens_per_s"] == pytest.approx(4 * 128 / 0.129, rel=1e-9)
    assert s["decode_tokens_per_s"] == pytest.approx(4000.0, rel=1e-9)
    assert s["ci95_e2e_s"] == np.inf  # one stream: no interval


def test_fixed_batch_where_the_budget_binds():
    """B = 32 at 1,024 tokens: 32 × 512 > 8,192. By hand (request index order): it 1–2 prefill r0–15
    (TTFT 2τ); it 3 has 16 decodes, so 8,176 tokens of room: r16–30 get 512, r31 496; it 4 the same
    (r16–30 done, TTFT 4τ; r31 has 32 left); it 5 r31's last 32 (TTFT 5τ). E2E = TTFT + 127τ.
    Quantiles (NumPy's linear rule on 16×2, 15×4, 1×5 ms): P50 3, P90 4, P99 4.69 ms. With the
    first 16 as warm-up the measured TTFT mean is (15·4 + 5)/16 ms."""
    t = _fixed_batch(32, 1024, 128)
    m = metrics.per_request(t, metrics.window(36, 0, 32))
    expect = np.r_[np.full(16, 2.0), np.full(15, 4.0), 5.0]
    np.testing.assert_allclose(m.ttft_s[0, :32] * 1e3, expect, rtol=1e-9)
    np.testing.assert_allclose(m.e2e_s[0, :32] * 1e3, expect + 127, rtol=1e-9)
    s = metrics.summary(t, warmup=0, measured=32)
    assert (s["p50_ttft_s"], s["p90_ttft_s"]) == pytest.approx((3e-3, 4e-3), rel=1e-9)
    assert s["p99_ttft_s"] == pytest.approx(4.69e-3, rel=1e-9)
    warm = metrics.summary(t, warmup=16, measured=16)
    assert warm["ttft_s"] == pytest.approx((15 * 4 + 5) / 16 * 1e-3, rel=1e-9)
    assert warm["throughput_tokens_per_s"] == pytest.approx(16 * 128 / 0.132, rel=1e-9)


def test_littles_law_on_poisson_streams():
    """32 Poisson streams at 60 requests/s on 8 slots (prompt 256, output 1–64 uniform, 2 ms + 1 µs per
    token each iteration), 64 warm-up, 512 measured, 64 after. Per stream L (time-average of requests in
    system over the measured arrival window) and λW (measured arrival rate × mean E2E) agree: the mean
    of L − λW across streams is within Z standard errors of 0, and that error is small (< 3 % of L).
    λ itself is within Z standard errors of the knob's 60 /s."""
    config = rq.RequestsConfig(requests=640, output_lengths="uniform")
    knobs = rq.RequestKnobs.make(rate_per_s=60.0, prompt=rq.LengthKnobs.make(256),
                                 output=rq.LengthKnobs.make(32, lo=1, hi=64))
    req = batch.run(rq.generate, 32, 3, knobs, config)
    out = jax.vmap(lambda r: serve(r, BatcherKnobs.make(512, 8192), BatcherConfig(slots=8), tokens_time))(req)
    assert not np.asarray(out.overflow).any()
    stream = metrics.per_stream(_times(req, out), metrics.window(640, 64, 512))
    little, lam = stream["mean_requests_in_system"], stream["arrival_rate_per_s"]
    gap = little - lam * stream["e2e_s"]
    se = gap.std(ddof=1) / np.sqrt(gap.size)
    assert abs(gap.mean()) <= Z * se and Z * se < 0.03 * little.mean()
    assert abs(lam.mean() - 60.0) <= Z * lam.std(ddof=1) / np.sqrt(lam.size)
    assert little.mean() > 1.0  # a loaded system: queueing, not one request at a time


def tokens_time(p, draw=0):
    return 2000.0 + 1.0 * (p.decode_mask.sum() + (p.chunk_tokens * p.chunk_mask).sum())


@pytest.mark.parametrize("args, message", [
    ((10, 10, None), "window.warmup = 10"),
    ((10, 2, 9), "window.measured = 9"),
    ((10, 2, 0), "window.measured = 0"),
])
def test_bad_window_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        metrics.window(*args)
