"""Request metrics (hbfjax.serve.metrics): hand-computed TTFT/TPOT/E2E, a fixed batch by hand,
warm-up masking, quantiles, Little's law L = λW on Poisson streams within a confidence interval, and the
window identity L = λ·W, the offered and completed rates and the saturation flag on hand-built
M/D/1 queues (plain NumPy, the Lindley recursion) and a hand trace."""

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
    np.testing.assert_allclose(little, lam * stream["littles_time_in_system_s"], rtol=1e-9)
    assert not stream["saturated"].any()


def tokens_time(p, draw=0):
    return 2000.0 + 1.0 * (p.decode_mask.sum() + (p.chunk_tokens * p.chunk_mask).sum())


def md1(rate_per_s: float, service_s: float, streams: int, requests: int, seed: int) -> metrics.RequestTimes:
    """Poisson arrivals at ``rate_per_s`` to one FIFO server of fixed service time (M/D/1), by the
    Lindley recursion finish_i = max(arrival_i, finish_{i−1}) + service; first token mid-service,
    two output tokens."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, (streams, requests)), axis=1)
    finish = np.empty_like(arrival)
    free = np.zeros(streams)
    for i in range(requests):
        free = finish[:, i] = np.maximum(arrival[:, i], free) + service_s
    return metrics.RequestTimes(arrival, finish - service_s / 2, finish, np.full(arrival.shape, 2, np.int64),
                                np.ones(arrival.shape, bool))


def _md1_streams(rate_per_s: float, warmup: int, seed: int):
    t = md1(rate_per_s, 1.0, 32, warmup + 1024 + 64, seed)
    in_window = metrics.window(t.arrival_s.shape[1], warmup, 1024)
    return t, metrics.per_stream(t, in_window), metrics.summary(t, warmup, 1024)


def _se(x: np.ndarray) -> float:
    return float(x.std(ddof=1) / np.sqrt(x.size))


@pytest.mark.parametrize("rho, warmup", [(0.5, 128), (0.6, 128), (0.7, 0)])
def test_md1_stable_queue_is_not_saturated(rho, warmup):
    """M/D/1 at load ρ (service 1 s), 32 streams of 1,024 measured requests: L = λ·W per stream to
    1e-9; L within Z standard errors of Pollaczek–Khinchine's ρ + ρ²/(2(1 − ρ)); completions equal
    arrivals within Z standard errors of their paired difference (with no warm-up the fill from empty
    leaves a significant but tiny shortfall, ≈ L / A: only the 5 % margin keeps it unflagged), and
    neither the run nor any stream is saturated."""
    _, stream, s = _md1_streams(rho, warmup, seed=1)
    lam, little, w = stream["arrival_rate_per_s"], stream["mean_requests_in_system"], stream["littles_time_in_system_s"]
    np.testing.assert_allclose(little, stream["littles_arrival_rate_per_s"] * w, rtol=1e-9)
    assert abs(little.mean() - (rho + rho**2 / (2 * (1 - rho)))) <= Z * _se(little)
    assert abs(lam.mean() - rho) <= Z * _se(lam)
    gap = stream["completion_rate_per_s"] - lam
    if warmup:
        assert abs(gap.mean()) <= Z * _se(gap)
    assert abs(gap.mean()) <= 0.01 * rho
    assert abs(w.mean() - s["e2e_s"]) <= Z * _se(w - stream["e2e_s"])  # steady state: W estimates E2E
    assert s["saturated"] is False and s["saturated_streams"] == 0 and not stream["saturated"].any()
    assert metrics.saturation_warning(s) is None


def test_md1_at_twice_capacity_is_saturated():
    """The same server offered 2 requests/s (2× its capacity of 1/s): L = λ·W still holds to 1e-9, every
    stream and the run are saturated, and the completion rate is the service rate — after a 128-request
    warm-up the server is busy through the window, so D/T is 1/s within 1/T. The ratio is ≈ 1/2 and W
    falls well short of the mean E2E (the times in system outgrow the window)."""
    t, stream, s = _md1_streams(2.0, 128, seed=2)
    lam, little, w = stream["arrival_rate_per_s"], stream["mean_requests_in_system"], stream["littles_time_in_system_s"]
    np.testing.assert_allclose(little, stream["littles_arrival_rate_per_s"] * w, rtol=1e-9)
    t0, t1 = metrics.arrival_window(t, metrics.window(t.arrival_s.shape[1], 128, 1024))
    assert np.all(np.abs(stream["completion_rate_per_s"] - 1.0) <= 1.0 / (t1 - t0) + 1e-12)
    r = stream["completion_to_arrival_ratio"]
    assert abs(r.mean() - 0.5) <= Z * _se(r)  # r = (1/s) / λ̂, λ̂ ≈ 2/s
    assert s["saturated"] is True and s["saturated_streams"] == 32 and stream["saturated"].all()
    assert s["littles_time_in_system_s"] < 0.6 * s["e2e_s"]
    text = metrics.saturation_warning(s)
    assert text.startswith("warning: saturated: offered 2.0") and "completed 1.00 req/s" in text
    one = metrics.summary(metrics.RequestTimes(*(a[:1] for a in t)), 128, 1024)
    assert one["saturated"] is True  # one stream: no interval, its own ratio decides


def test_littles_terms_from_a_hand_trace():
    """Five requests, FIFO, 1.5 s of service: arrivals 0, 1, 2, 4, 5 s, finishes 1.5, 3, 4.5, 6, 7.5 s;
    warm-up 1, measured 3 (r1–r3). Window [1, 4) s, T = 3: arrivals in it r1, r2 (A = 2; r3 at 4 closes
    it), finishes r0 at 1.5 and r1 at 3 (D = 2). Time in system within the window: r0 0.5 (carried in),
    r1 2, r2 2, r3 0: I = 4.5 s. So λ = 2/3, completions 2/3 /s, L = 1.5, W = 2.25 s = L/λ, ratio 1;
    E2E of r1–r3: (2 + 2.5 + 2)/3 s."""
    arrival = np.array([[0.0, 1.0, 2.0, 4.0, 5.0]])
    finish = np.array([[1.5, 3.0, 4.5, 6.0, 7.5]])
    t = metrics.RequestTimes(arrival, finish - 0.5, finish, np.full((1, 5), 2, np.int64), np.ones((1, 5), bool))
    s = metrics.summary(t, warmup=1, measured=3)
    assert s["arrival_rate_per_s"] == pytest.approx(2 / 3, rel=1e-12)
    assert s["completion_rate_per_s"] == pytest.approx(2 / 3, rel=1e-12)
    assert s["mean_requests_in_system"] == pytest.approx(1.5, rel=1e-12)
    assert s["littles_time_in_system_s"] == pytest.approx(2.25, rel=1e-12)
    assert s["littles_arrival_rate_per_s"] == pytest.approx(2 / 3, rel=1e-12)
    assert s["completion_to_arrival_ratio"] == pytest.approx(1.0, rel=1e-12)
    assert s["e2e_s"] == pytest.approx(6.5 / 3, rel=1e-12)
    assert s["saturated"] is False
    late = t._replace(finish_s=np.array([[1.5, 3.0, np.inf, 6.0, 7.5]]))  # r2 never finishes: in until t1
    assert metrics.summary(late, 1, 3)["mean_requests_in_system"] == pytest.approx(1.5, rel=1e-12)


def _short_window(slow: int) -> metrics.RequestTimes:
    """Two alike streams of 20 requests 1 s apart, served in 0.5 s but for the last ``slow`` before the
    window closes at t1 = 19 s, which finish after it."""
    arrival = np.arange(20.0)
    finish = arrival + 0.5
    finish[19 - slow:19] = 19.5
    a, f = np.tile(arrival, (2, 1)), np.tile(finish, (2, 1))
    return metrics.RequestTimes(a, f - 0.25, f, np.full((2, 20), 2, np.int64), np.ones((2, 20), bool))


def test_the_count_floor_keeps_a_short_stable_window_unflagged():
    """Window [0, 19) s: A = 19 arrivals. One request still in service at t1: D = 18, r = 18/19 < 0.95
    in both streams (no spread: a 0 half-width), but a shortfall of 1 request is no growth — not
    saturated. Four still waiting (r = 15/19, shortfall 4 > 2): saturated."""
    one = metrics.summary(_short_window(1))
    assert one["completion_to_arrival_ratio"] == pytest.approx(18 / 19) and one["ci95_completion_to_arrival_ratio"] == 0
    assert one["saturated"] is False and one["saturated_streams"] == 0
    four = metrics.summary(_short_window(4))
    assert four["completion_to_arrival_ratio"] == pytest.approx(15 / 19)
    assert four["saturated"] is True and four["saturated_streams"] == 2


def test_a_fixed_batch_has_no_online_keys_and_is_not_saturated():
    """Every request at t = 0: no arrival window, so the rates and Little's terms are NaN, ``saturated`` is
    False, and :func:`metrics.is_online_key` names exactly those keys and the flags for callers to drop:
    what is left is finite."""
    finish = np.array([[1.0, 2.0, 3.0], [1.5, 2.5, 3.5]])
    t = metrics.RequestTimes(np.zeros((2, 3)), finish / 2, finish, np.full((2, 3), 4, np.int64), np.ones((2, 3), bool))
    s = metrics.summary(t)
    undefined = {k for k, v in s.items() if isinstance(v, float) and not np.isfinite(v) and not k.startswith("ci95_")}
    assert undefined == set(metrics.ONLINE_KEYS) - {"saturated", "saturated_streams"}
    assert {k for k in s if metrics.is_online_key(k)} == set(metrics.ONLINE_KEYS) | {"ci95_" + k for k in undefined}
    assert s["saturated"] is False and s["saturated_streams"] == 0 and metrics.saturation_warning(s) is None
    kept = {k: v for k, v in s.items() if not metrics.is_online_key(k)}
    assert all(np.isfinite(v) for v in kept.values())


def test_saturation_warning_reads_a_result_row():
    """A sweep row read back from its CSV holds text: "True" warns, "False" and a missing key do not."""
    row = {"saturated": "True", "arrival_rate_per_s": "3.9", "completion_rate_per_s": "1.62"}
    assert metrics.saturation_warning(row) == ("warning: saturated: offered 3.90 req/s, completed 1.62 req/s in the "
                                               "measured window; latencies grow with the run's length and are not "
                                               "steady-state values")
    assert metrics.saturation_warning({**row, "saturated": "False"}) is None
    assert metrics.saturation_warning({}) is None


@pytest.mark.parametrize("args, message", [
    ((10, 10, None), "window.warmup = 10"),
    ((10, 2, 9), "window.measured = 9"),
    ((10, 2, 0), "window.measured = 0"),
])
def test_bad_window_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        metrics.window(*args)
