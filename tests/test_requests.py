"""Request streams: fixed batch, Poisson/gamma arrivals, length laws, trace replay modes, sessions."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch, clock, rng
from hbfjax.traces import Trace
from hbfjax.validate import ConfigError
from hbfjax.workload import requests as rq

Z = 4.5  # tolerance in standard errors: two-sided false-alarm rate ~7e-6 per check
KS_X = 2.6  # Kolmogorov–Smirnov: P(sqrt(n)·D > 2.6) ≈ 2·exp(−2·2.6²) ≈ 3e-6 per check


def _run(config, knobs=None, streams=8, seed=0, inputs=None):
    return batch.run(rq.generate, streams, seed, knobs or rq.RequestKnobs.make(), config, inputs=inputs)


def _us(c) -> np.ndarray:
    return clock.to_us(c)


def _ks_distance(samples: np.ndarray, cdf) -> float:
    x = np.sort(np.asarray(samples, np.float64))
    f = np.asarray(cdf(x), np.float64)
    n = x.size
    return float(max((np.arange(1, n + 1) / n - f).max(), (f - np.arange(n) / n).max()))


# --- fixed batch -----------------------------------------------------------------------------------

def test_fixed_batch_is_b_requests_of_l_in_and_l_out_at_time_zero():
    config = rq.RequestsConfig(requests=8, arrivals="batch")
    knobs = rq.RequestKnobs.make(batch=4, prompt=rq.LengthKnobs.make(1024), output=rq.LengthKnobs.make(128))
    out = _run(config, knobs, streams=3)
    assert out.valid.tolist() == [[True] * 4 + [False] * 4] * 3
    v = out.valid
    assert np.all(_us(out.arrival)[v] == 0) and np.all(_us(out.root_start)[v] == 0)
    assert np.all(out.arrival.s[~v] == np.iinfo(np.int32).max)  # padding arrives "never"
    assert np.all(out.prompt_tokens[v] == 1024) and np.all(out.output_tokens[v] == 128)
    assert np.all(out.prompt_tokens[~v] == 0) and np.all(out.prefix_tokens == 0)
    assert out.session.tolist() == [list(range(8))] * 3 and np.all(out.parent == -1)


# --- Poisson and gamma arrivals --------------------------------------------------------------------

def _gaps_s(out) -> np.ndarray:
    t = _us(out.arrival) / 1e6
    return np.diff(np.concatenate([np.zeros((t.shape[0], 1)), t], axis=1), axis=1)


RATE = 100.0  # requests/s of the Poisson and gamma checks


@functools.cache
def _arrivals(arrivals: str, cv: float = 1.0):
    """256 streams × 2,048 requests at RATE (one compilation per arrival process, shared by the checks)."""
    return _run(rq.RequestsConfig(requests=2048, arrivals=arrivals), rq.RequestKnobs.make(rate_per_s=RATE, cv=cv),
                streams=256, seed=3)


def test_poisson_counts_in_fixed_windows_have_mean_equal_to_variance():
    rate, window_s, windows = RATE, 1.0, 15
    out = _arrivals("poisson")
    t = _us(out.arrival) / 1e6
    assert np.all(t[:, -1] > windows * window_s)  # every window lies inside each stream's R arrivals
    counts = np.stack([np.histogram(row, bins=windows, range=(0, windows * window_s))[0] for row in t]).ravel()
    lam, w = rate * window_s, counts.size
    assert abs(counts.mean() - lam) <= Z * math.sqrt(lam / w)
    # variance / mean = 1 for Poisson counts; sample variance SE = sqrt((λ + 2λ²) / W)
    assert abs(counts.var(ddof=1) / lam - 1) <= Z * math.sqrt((1 / lam + 2) / w)


def test_poisson_gaps_are_exponential_at_the_rate():
    rate = RATE
    out = _arrivals("poisson")
    gaps = _gaps_s(out).ravel()
    assert np.all(out.valid) and np.all(gaps >= 0)
    assert _ks_distance(gaps, lambda x: 1 - np.exp(-rate * x)) <= KS_X / math.sqrt(gaps.size)
    assert np.all(out.arrival.us == np.floor(out.arrival.us))  # whole µs


def _gamma_cdf(shape):
    return lambda x: np.asarray(jax.scipy.special.gammainc(jnp.float32(shape), jnp.asarray(x, jnp.float32)))


_gamma = jax.jit(rq.standard_gamma, static_argnums=4)
GAMMA_DRAWS = 200_000


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0, 30.0])
def test_marsaglia_tsang_gamma_variates_follow_the_gamma_law(shape):
    n = GAMMA_DRAWS
    g, accepted = _gamma(jnp.uint32(5), jnp.int32(1), jnp.arange(n, dtype=jnp.int32), shape, 8)
    g = np.asarray(g, np.float64)
    assert np.all(np.asarray(accepted)) and np.all(g >= 0)  # 8 tries all fail with p < 4e-11 per variate
    assert _ks_distance(g, _gamma_cdf(shape)) <= KS_X / math.sqrt(n)
    assert abs(g.mean() - shape) <= Z * math.sqrt(shape / n)


def test_a_gamma_draw_with_no_accepted_try_falls_back_to_d():
    n = GAMMA_DRAWS
    g, accepted = _gamma(jnp.uint32(2), jnp.int32(0), jnp.arange(n, dtype=jnp.int32), 2.0, 1)
    g, accepted = np.asarray(g), np.asarray(accepted)
    rejected = ~accepted
    # Marsaglia–Tsang accepts a try with probability >= 0.95 at shape >= 1: a few % are rejected
    assert 0 < rejected.mean() < 0.05
    assert np.all(g[rejected] == np.float32(2.0 - 1 / 3))
    more, acc8 = _gamma(jnp.uint32(2), jnp.int32(0), jnp.arange(n, dtype=jnp.int32), 2.0, 8)
    more = np.asarray(more)
    assert np.all(np.asarray(acc8)) and np.array_equal(more[accepted], g[accepted])  # first accepted try


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_gaps_have_the_mean_and_cv_of_the_knobs(cv):
    x = _gaps_s(_arrivals("gamma", cv)).ravel() * RATE  # unit mean
    n, k = x.size, 1 / cv**2
    assert abs(x.mean() - 1) <= Z * cv / math.sqrt(n)
    var, mu4 = 1 / k, 3 * (k + 2) / k**3  # Gamma(k, 1/k): variance cv², central 4th moment 3k(k+2)/k⁴
    assert abs(x.var(ddof=1) - var) <= Z * math.sqrt((mu4 - var**2) / n)
    if cv == 1.0:  # shape 1: exponential gaps, as Poisson's
        assert _ks_distance(x, lambda y: 1 - np.exp(-y)) <= KS_X / math.sqrt(n)


# --- lengths ---------------------------------------------------------------------------------------

def test_lognormal_lengths_have_the_median_and_sigma_of_the_knobs():
    median, sigma = 1000.0, 1.0
    config = rq.RequestsConfig(requests=1024, arrivals="batch", prompt_lengths="lognormal", output_lengths="lognormal")
    knobs = rq.RequestKnobs.make(batch=1024, prompt=rq.LengthKnobs.make(median=median, sigma=sigma),
                                 output=rq.LengthKnobs.make(median=50.0, sigma=0.5))
    out = _run(config, knobs, streams=128, seed=8)
    x = out.prompt_tokens.ravel().astype(np.float64)
    n = x.size
    p_below = 0.5 * (1 + math.erf(math.log(999.5 / median) / (sigma * math.sqrt(2))))  # P(round(X) < 1000)
    assert abs((x < median).mean() - p_below) <= Z * math.sqrt(p_below * (1 - p_below) / n)
    assert abs(np.log(x).std() - sigma) <= Z * sigma / math.sqrt(2 * n) + 1e-3  # + rounding to whole tokens
    y = out.output_tokens.ravel()
    assert abs((y < 50).mean() - 0.5 * (1 + math.erf(math.log(49.5 / 50) / (0.5 * math.sqrt(2))))) <= Z * 0.5 / math.sqrt(n)
    assert not np.array_equal(np.argsort(x[:1000]), np.argsort(y[:1000]))  # prompt and output drawn apart


def test_uniform_lengths_cover_lo_to_hi_evenly():
    config = rq.RequestsConfig(requests=1024, arrivals="batch", prompt_lengths="uniform")
    knobs = rq.RequestKnobs.make(batch=1024, prompt=rq.LengthKnobs.make(5, lo=3, hi=7))
    x = _run(config, knobs, streams=64, seed=9).prompt_tokens.ravel()
    counts = np.bincount(x, minlength=8)
    assert counts[:3].sum() == 0 and counts[3:].sum() == x.size
    p = 1 / 5
    assert np.all(np.abs(counts[3:] / x.size - p) <= Z * math.sqrt(p * (1 - p) / x.size))


def _pair_trace(n=50, seed=0) -> Trace:
    gen = np.random.default_rng(seed)
    return Trace(name="pairs", arrival_s=np.sort(gen.uniform(0, 100, n)), input_tokens=gen.integers(1, 10_000, n),
                 output_tokens=gen.integers(1, 1000, n), session=np.arange(n), parent=-np.ones(n, np.int64),
                 prefix_tokens=np.zeros(n, np.int64))


def test_empirical_lengths_resample_whole_pairs_uniformly():
    trace = _pair_trace()
    inputs = rq.TraceInputs.from_trace(trace)
    config = rq.RequestsConfig(requests=512, arrivals="batch", prompt_lengths="empirical", output_lengths="empirical")
    out = _run(config, rq.RequestKnobs.make(batch=512), streams=32, seed=10, inputs=inputs)
    pairs = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(trace.input_tokens, trace.output_tokens))}
    drawn = [pairs.get((int(a), int(b)), -1) for a, b in zip(out.prompt_tokens.ravel(), out.output_tokens.ravel())]
    assert min(drawn) >= 0  # every (prompt, output) is one trace request's pair; independent draws would mix them
    freq = np.bincount(drawn, minlength=len(trace)) / len(drawn)
    p = 1 / len(trace)
    assert np.all(np.abs(freq - p) <= Z * math.sqrt(p * (1 - p) / len(drawn)))


# --- transform invariants --------------------------------------------------------------------------

_SYNTH = rq.RequestsConfig(requests=64, arrivals="gamma", prompt_lengths="lognormal", output_lengths="uniform")
_SYNTH_KNOBS = rq.RequestKnobs.make(rate_per_s=3.0, cv=1.5, prompt=rq.LengthKnobs.make(median=800.0, sigma=0.7),
                                    output=rq.LengthKnobs.make(100, lo=10, hi=300))


def _leaves(out):
    return jax.tree_util.tree_leaves(out)


def test_same_seed_gives_the_same_requests_and_another_seed_others():
    a, b, c = (_run(_SYNTH, _SYNTH_KNOBS, streams=4, seed=s) for s in (11, 11, 12))
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b)))
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens) and not np.array_equal(a.arrival.us, c.arrival.us)
    assert not np.array_equal(a.prompt_tokens[0], a.prompt_tokens[1])  # streams differ


def test_vmap_over_streams_equals_a_loop_of_single_streams():
    out = _run(_SYNTH, _SYNTH_KNOBS, streams=4, seed=13)
    one = jax.jit(rq.generate, static_argnums=4)
    for s in range(4):
        single = one(jnp.int32(s), rng.seed_word(13), _SYNTH_KNOBS, None, _SYNTH)
        assert all(np.array_equal(x[s], np.asarray(y)) for x, y in zip(_leaves(out), _leaves(single)))


def test_rate_cv_and_length_knobs_do_not_recompile():
    config = rq.RequestsConfig(requests=32, arrivals="gamma", prompt_lengths="lognormal", output_lengths="uniform",
                               gamma_tries=5)
    with compilations("generate") as compiled:
        for rate, cv, median, hi in [(1.0, 1.0, 100.0, 20), (50.0, 0.3, 3000.0, 900), (0.2, 3.0, 5.0, 2)]:
            knobs = rq.RequestKnobs.make(rate_per_s=rate, cv=cv, prompt=rq.LengthKnobs.make(median=median, sigma=1.0),
                                         output=rq.LengthKnobs.make(1, lo=1, hi=hi))
            _run(config, knobs, streams=4)
    assert len(compiled) == 1, compiled  # a config no other test uses: one compilation, then reuse


def test_replay_rate_factor_seed_and_trace_values_do_not_recompile():
    config = rq.RequestsConfig(requests=20, arrivals="trace", replay="offset")
    with compilations("generate") as compiled:
        for factor, seed, trace_seed in [(1.0, 0, 0), (3.0, 1, 1), (0.5, 2, 2)]:
            inputs = rq.TraceInputs.from_trace(_pair_trace(n=40, seed=trace_seed))  # same shapes, other values
            _run(config, rq.RequestKnobs.make(rate_factor=factor), streams=2, seed=seed, inputs=inputs)
    assert len(compiled) == 1, compiled


def test_bootstrap_session_rate_factor_does_not_recompile():
    config = rq.RequestsConfig(requests=20, arrivals="trace", replay="bootstrap")
    inputs = rq.TraceInputs.from_trace(_session_trace())
    with compilations("generate") as compiled:
        outs = [_run(config, rq.RequestKnobs.make(session_rate_factor=x), streams=2, inputs=inputs) for x in (1.0, 4.0)]
    assert len(compiled) == 1, compiled
    assert _us(outs[1].arrival)[0, -1] < _us(outs[0].arrival)[0, -1]  # 4× the session starts: 20 requests sooner


def test_a_knob_sweep_uses_common_random_numbers():
    points = [rq.RequestKnobs.make(rate_per_s=r, cv=1.5) for r in (1.0, 4.0)]
    swept = batch.run(rq.generate, 4, 14, batch.stack_knobs(points), _SYNTH, knob_axis=True)
    # the same unit gaps, scaled: 4× the rate gives 1/4 the arrival times (to the µs rounding)
    slow, fast = _us(swept.arrival)[:, 0], _us(swept.arrival)[:, 1]
    assert np.all(np.abs(slow / 4 - fast) <= np.arange(1, 65))


# --- trace replay ----------------------------------------------------------------------------------

def _session_trace() -> Trace:
    """Three sessions, one a tree (Bailian-like): A 0→2→5, 2→6; B 1→3→7; C 4 alone."""
    arrival = np.array([0.0, 0.5, 1.25, 2.0, 3.5, 4.0, 4.000001, 7.2])
    return Trace(name="sessions", arrival_s=arrival, input_tokens=100 + np.arange(8), output_tokens=10 + np.arange(8),
                 session=np.array([0, 1, 0, 1, 4, 0, 0, 1]), parent=np.array([-1, -1, 0, 1, -1, 2, 2, 3]),
                 prefix_tokens=np.array([0, 0, 90, 95, 0, 99, 99, 100]))


def _reference_rotation(trace: Trace, phase_us: int, requests: int):
    """Plain Python: the trace started at phase u, wrapped at the period, sessions re-rooted at the cut."""
    t = [round(x * 1e6) for x in trace.arrival_s]
    n = len(t)
    period = max(round(t[-1] * n / (n - 1)), t[-1] + 1)
    k = sum(1 for x in t if x < phase_us)
    order = list(range(k, n)) + list(range(k))
    position = {src: j for j, src in enumerate(order)}
    rows = []
    for j, src in enumerate(order[:requests]):
        p = int(trace.parent[src])
        kept = p >= 0 and position[p] < j
        parent = position[p] if kept else -1
        prefix = int(trace.prefix_tokens[src]) if kept or p < 0 else 0
        rows.append([t[src] - phase_us + (period if src < k else 0), int(trace.input_tokens[src]), parent, prefix])
    for row in rows:  # session = root of the parent chain
        root = rows.index(row)
        while rows[root][2] >= 0:
            root = rows[root][2]
        row.append(root)
    return period, rows


@pytest.mark.parametrize("phase_us", [0, 1, 500_000, 1_250_000, 3_999_999, 4_000_001, 7_200_000, 8_228_570])
def test_rotated_replay_matches_a_plain_python_rotation(phase_us):
    trace = _session_trace()
    inputs = rq.TraceInputs.from_trace(trace)
    period, rows = _reference_rotation(trace, phase_us, 8)
    assert int(clock.to_us(inputs.period)) == period == 8_228_571  # 7.2 s × 8/7, rounded
    out = jax.jit(rq.rotated, static_argnums=2)(inputs, clock.from_us(phase_us), 10)
    v = np.asarray(out.valid)
    assert v.tolist() == [True] * 8 + [False] * 2  # R > n: padding after one period
    got = np.stack([_us(out.arrival)[v], np.asarray(out.prompt_tokens)[v], np.asarray(out.parent)[v],
                    np.asarray(out.prefix_tokens)[v], np.asarray(out.session)[v]], axis=1)
    assert got.tolist() == rows
    assert np.array_equal(_us(out.root_start)[v], _us(out.arrival)[np.asarray(out.session)[v]])


def test_exact_replay_reproduces_the_trace_in_every_stream():
    trace = _session_trace()
    out = _run(rq.RequestsConfig(requests=6, arrivals="trace", replay="exact"), streams=3,
               inputs=rq.TraceInputs.from_trace(trace))
    for s in range(3):
        assert np.array_equal(_us(out.arrival)[s], np.rint(trace.arrival_s[:6] * 1e6))
        assert out.session[s].tolist() == trace.session[:6].tolist() and out.parent[s].tolist() == trace.parent[:6].tolist()
        assert out.prefix_tokens[s].tolist() == trace.prefix_tokens[:6].tolist()
        assert np.array_equal(_us(out.root_start)[s], np.rint(trace.root_start_s[:6] * 1e6))


def test_offset_phases_are_uniform_over_the_period():
    inputs = rq.TraceInputs.from_trace(_session_trace())
    streams = 20_000
    phases = jax.jit(jax.vmap(rq.offset_phase, in_axes=(None, 0, None)))(jnp.uint32(3), jnp.arange(streams), inputs)
    u = _us(phases) / 8_228_571
    assert np.all((u >= 0) & (u < 1)) and np.all(np.asarray(phases.us) == np.floor(np.asarray(phases.us)))
    assert _ks_distance(u, lambda x: x) <= KS_X / math.sqrt(streams)


def test_offset_replay_keeps_every_request_once_and_arrivals_sorted():
    trace = _pair_trace(n=300, seed=2)
    out = _run(rq.RequestsConfig(requests=300, arrivals="trace"), streams=16, inputs=rq.TraceInputs.from_trace(trace))
    assert rq.RequestsConfig(requests=300, arrivals="trace").replay == "offset"  # the default
    for s in range(16):
        assert sorted(out.prompt_tokens[s].tolist()) == sorted(trace.input_tokens.tolist())
        assert np.all(np.diff(_us(out.arrival)[s]) >= 0)
    assert len({int(out.prompt_tokens[s, 0]) for s in range(16)}) > 8  # streams start at different places


def test_rate_factor_scales_the_time_axis_and_one_reproduces_it():
    trace = _session_trace()
    inputs = rq.TraceInputs.from_trace(trace)
    exact = np.rint(trace.arrival_s * 1e6)
    config = rq.RequestsConfig(requests=8, arrivals="trace", replay="exact")
    for factor in (2.0, 0.3):
        out = _run(config, rq.RequestKnobs.make(rate_factor=factor), streams=1, inputs=inputs)
        err = np.abs(_us(out.arrival)[0] - exact / factor)
        assert np.all(err <= (np.arange(8) + 1) / 32 + exact / factor * 2**-23)  # 1/16-µs rounding per gap
        assert out.session[0].tolist() == trace.session.tolist()
    one = _run(config, rq.RequestKnobs.make(rate_factor=1.0), streams=1, inputs=inputs)
    assert np.array_equal(_us(one.arrival)[0], exact)


@functools.cache
def _bootstrap(requests, sessions, streams, seed=0, factor=1.0):
    config = rq.RequestsConfig(requests=requests, arrivals="trace", replay="bootstrap", bootstrap_sessions=sessions)
    return _run(config, rq.RequestKnobs.make(rate_factor=factor), streams=streams, seed=seed,
                inputs=rq.TraceInputs.from_trace(_session_trace()))


@pytest.mark.parametrize("factor", [1.0, 2.5])
def test_bootstrap_sessions_keep_their_turns_gaps_lengths_and_links(factor):
    trace = _session_trace()
    out = _bootstrap(256, 128, 512, seed=2, factor=factor)
    since_root = np.rint((trace.arrival_s - trace.root_start_s) * 1e6)
    for s in range(16):
        v = out.valid[s]
        assert v.all()  # 128 sessions of >= 1 request fill 256 requests with probability ~1
        q = out.prompt_tokens[s] - 100  # the trace request each output request replays
        assert np.all(out.output_tokens[s] == 10 + q) and np.all(out.prefix_tokens[s] == trace.prefix_tokens[q])
        root = out.session[s]
        assert np.all(q[root] == trace.session[q])  # its session's root replays the trace root
        offset = _us(out.arrival)[s] - _us(out.arrival)[s][root]
        assert np.all(np.abs(offset - since_root[q] / factor) <= 3 / 32)  # three gaps at most, 1/16-µs rounding
        has_parent = out.parent[s] >= 0
        assert np.all(q[out.parent[s][has_parent]] == trace.parent[q[has_parent]])
        assert np.all(out.parent[s][has_parent] < np.flatnonzero(has_parent))
        assert np.array_equal(_us(out.root_start)[s], _us(out.arrival)[s][root])
        assert np.all(np.diff(_us(out.arrival)[s]) >= 0)


def test_bootstrap_session_starts_are_poisson_at_the_traces_session_rate():
    streams, horizon_s = 512, 60.0
    out = _bootstrap(256, 128, streams, seed=2)
    rate = 3 / 8.228571  # sessions per period
    starts = [(_us(out.arrival)[s][out.parent[s] < 0] / 1e6) for s in range(streams)]
    assert all(st.max() > horizon_s for st in starts)  # the horizon is inside every stream's requests
    counts = np.array([(st < horizon_s).sum() for st in starts])
    lam = rate * horizon_s
    assert abs(counts.mean() - lam) <= Z * math.sqrt(lam / streams)
    assert abs(counts.var(ddof=1) / lam - 1) <= Z * math.sqrt((1 / lam + 2) / streams)
    roots = np.concatenate([out.prompt_tokens[s][out.parent[s] < 0] - 100 for s in range(streams)])
    freq = np.bincount(roots, minlength=8)[[0, 1, 4]] / roots.size  # sessions drawn uniformly
    assert np.all(np.abs(freq - 1 / 3) <= Z * math.sqrt(2 / 9 / roots.size))


def test_bootstrap_with_few_sessions_marks_requests_past_the_drawn_ones_invalid():
    out = _bootstrap(64, 4, 512, seed=3)
    for s in range(8):
        v = out.valid[s]
        assert 1 <= v.sum() <= 4 * 4 and not v[-1] and np.all(v[:v.sum()])  # a valid prefix, then padding
        assert len(set(out.session[s][v].tolist())) <= 4


def _open_sessions(out, s, times_s, mean_gap_s, factor):
    """Plain Python: sessions of stream ``s`` open at each time (root arrival <= t < last turn's arrival
    + one mean gap ÷ rate factor)."""
    v = np.asarray(out.valid[s])
    t = _us(out.arrival)[s][v] / 1e6
    session = np.asarray(out.session[s])[v]
    roots = np.unique(session)
    start = np.array([t[session == k].min() for k in roots])
    end = np.array([t[session == k].max() for k in roots]) + mean_gap_s / factor
    return [int(((start <= x) & (x < end)).sum()) for x in times_s], t.max()


@pytest.mark.parametrize("factor", [1.0, 2.5])
def test_session_rate_factor_sets_the_mean_number_of_open_sessions(factor):
    """The session trace's spans (last turn − root + the mean turn gap 10.700001/5 s): 4.000001 + ḡ,
    6.7 + ḡ, ḡ; at the factor for 20 open sessions the count at a time t (after the longest span) is
    Poisson(20) (M/G/∞); times 10 s / rate factor apart see disjoint starts, so the counts are independent."""
    trace = _session_trace()
    inputs = rq.TraceInputs.from_trace(trace)
    gap = 10.700001 / 5
    spans = rq.session_spans_us(inputs) / 1e6
    np.testing.assert_allclose(spans, [4.000001 + gap, 6.7 + gap, gap], rtol=1e-9)
    x = rq.concurrency_rate_factor(inputs, 20.0)
    assert x == pytest.approx(20.0 / (3 / 8.228571 * spans.mean()), rel=1e-6)
    with pytest.raises(ConfigError, match="concurrency_rate_factor.concurrency = 0.0"):
        rq.concurrency_rate_factor(inputs, 0.0)
    streams = 48
    config = rq.RequestsConfig(requests=2048, arrivals="trace", replay="bootstrap")
    times = (10.0 + 10.0 * np.arange(18)) / factor  # 10 s > the longest span (8.84 s)
    # at x: 20 open; at the default 1: the trace's own concurrency 20 / x (sampled 8× sparser in time)
    for knob, mean, at in ((x, 20.0, times), (1.0, 20.0 / x, 8 * times)):
        out = _run(config, rq.RequestKnobs.make(rate_factor=factor, session_rate_factor=knob), streams=streams,
                   seed=5, inputs=inputs)
        counts = []
        for s in range(streams):
            c, last = _open_sessions(out, s, at, gap, factor)
            assert last > at[-1] + 9.0 / factor  # every turn of a session open at the last time is in the stream
            counts += c
        counts = np.array(counts)
        assert abs(counts.mean() - mean) <= Z * math.sqrt(mean / counts.size), knob


# --- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,fragment", [
    (dict(requests=0), "RequestsConfig.requests = 0: must be in [1, 131072]"),
    (dict(requests=2.5), "RequestsConfig.requests = 2.5: must be an integer"),
    (dict(requests=2**17 + 1), "RequestsConfig.requests = 131073"),
    (dict(requests=8, arrivals="uniform"), "RequestsConfig.arrivals = 'uniform': must be one of"),
    (dict(requests=8, prompt_lengths="normal"), "RequestsConfig.prompt_lengths = 'normal'"),
    (dict(requests=8, output_lengths="zipf"), "RequestsConfig.output_lengths = 'zipf'"),
    (dict(requests=8, prompt_lengths="empirical"), "RequestsConfig.output_lengths = 'fixed': empirical lengths"),
    (dict(requests=8, replay="exact"), "RequestsConfig.replay = 'exact': applies only to arrivals = 'trace'"),
    (dict(requests=8, arrivals="trace", replay="shuffle"), "RequestsConfig.replay = 'shuffle'"),
    (dict(requests=8, arrivals="trace", prompt_lengths="fixed"), "RequestsConfig.prompt_lengths = 'fixed': lengths come"),
    (dict(requests=8, gamma_tries=0), "RequestsConfig.gamma_tries = 0"),
    (dict(requests=8, gamma_tries=65), "RequestsConfig.gamma_tries = 65"),
    (dict(requests=8, arrivals="trace", bootstrap_sessions=4), "RequestsConfig.bootstrap_sessions = 4: applies only"),
    (dict(requests=8, arrivals="trace", replay="bootstrap", bootstrap_sessions=0), "RequestsConfig.bootstrap_sessions = 0"),
])
def test_bad_config_fields_are_refused_by_name(kwargs, fragment):
    with pytest.raises(ConfigError) as err:
        rq.RequestsConfig(**kwargs)
    assert fragment in str(err.value)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(tokens=0), "LengthKnobs.tokens = 0"), (dict(tokens=2**24 + 1), "LengthKnobs.tokens"),
    (dict(tokens=1.5), "LengthKnobs.tokens = 1.5: must be an integer"), (dict(lo=0), "LengthKnobs.lo = 0"),
    (dict(lo=5, hi=4), "LengthKnobs.hi = 4: must be >= lo = 5"), (dict(median=0.5), "LengthKnobs.median = 0.5"),
    (dict(median=float("inf")), "LengthKnobs.median = inf: must be finite"), (dict(sigma=-0.1), "LengthKnobs.sigma"),
    (dict(sigma=4.5), "LengthKnobs.sigma = 4.5"), (dict(sigma=float("nan")), "LengthKnobs.sigma = nan"),
])
def test_bad_length_knobs_are_refused_by_name(kwargs, fragment):
    with pytest.raises(ConfigError) as err:
        rq.LengthKnobs.make(**kwargs)
    assert fragment in str(err.value)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(rate_per_s=0.0), "RequestKnobs.rate_per_s = 0.0: must be in (0, 1e+06]"),
    (dict(rate_per_s=-1), "RequestKnobs.rate_per_s"), (dict(rate_per_s=float("nan")), "RequestKnobs.rate_per_s = nan"),
    (dict(rate_per_s=2e6), "RequestKnobs.rate_per_s"), (dict(cv=0.05), "RequestKnobs.cv = 0.05"),
    (dict(cv=5), "RequestKnobs.cv = 5"), (dict(batch=0), "RequestKnobs.batch = 0"),
    (dict(batch=1.5), "RequestKnobs.batch = 1.5"), (dict(rate_factor=0.0), "RequestKnobs.rate_factor = 0.0"),
    (dict(rate_factor=1e4), "RequestKnobs.rate_factor"),
    (dict(session_rate_factor=0.0), "RequestKnobs.session_rate_factor = 0.0"),
    (dict(session_rate_factor=-1.0), "RequestKnobs.session_rate_factor = -1.0"), (dict(prompt=512), "RequestKnobs.prompt = 'int'"),
    (dict(output=rq.LengthKnobs.make), "RequestKnobs.output = 'method'"),
])
def test_bad_request_knobs_are_refused_by_name(kwargs, fragment):
    with pytest.raises(ConfigError) as err:
        rq.RequestKnobs.make(**kwargs)
    assert fragment in str(err.value)


def test_relations_between_knobs_inputs_and_config_are_checked():
    with pytest.raises(ConfigError, match=r"RequestKnobs.batch = 9: must be <= RequestsConfig.requests = 8"):
        rq.check_knobs(rq.RequestKnobs.make(batch=9), rq.RequestsConfig(requests=8, arrivals="batch"))
    rq.check_knobs(rq.RequestKnobs.make(batch=8), rq.RequestsConfig(requests=8, arrivals="batch"))
    with pytest.raises(ConfigError, match="TraceInputs.max_requests = 0"):
        rq.TraceInputs.from_trace(_session_trace(), max_requests=0)
    backwards = _session_trace()
    backwards = Trace(**{**backwards.__dict__, "parent": np.array([-1, -1, 5, 1, -1, 2, 2, 3])})
    with pytest.raises(ConfigError, match=r"TraceInputs.trace = 'sessions': request \[2\] has a parent"):
        rq.TraceInputs.from_trace(backwards)
    with pytest.raises(ConfigError, match="generate.inputs = NoneType"):
        rq.generate(jnp.int32(0), jnp.uint32(0), rq.RequestKnobs.make(), None,
                    rq.RequestsConfig(requests=4, arrivals="trace"))
    long = Trace(**{**_pair_trace(3000).__dict__, "session": np.zeros(3000, np.int64),
                    "parent": np.arange(-1, 2999)})
    with pytest.raises(ConfigError, match="bootstrap_sessions = 2000: 2000 sessions × 3000 turns"):
        _run(rq.RequestsConfig(requests=2000, arrivals="trace", replay="bootstrap"), streams=1,
             inputs=rq.TraceInputs.from_trace(long))


def test_trace_inputs_pad_and_truncate_to_a_static_length():
    trace = _session_trace()
    padded = rq.TraceInputs.from_trace(trace, max_requests=12)
    assert padded.prompt_tokens.shape == (12,) and int(padded.count) == 8
    assert np.asarray(padded.valid).tolist() == [True] * 8 + [False] * 4
    assert np.all(np.asarray(padded.arrival.s)[8:] == np.iinfo(np.int32).max)
    cut = rq.TraceInputs.from_trace(trace, max_requests=5)
    assert int(cut.count) == 5 and int(cut.sessions) == 3 and cut.turns.shape == (3, 2)
    out = jax.jit(rq.rotated, static_argnums=2)(padded, clock.zeros(), 12)  # padding is never replayed
    assert np.asarray(out.valid).sum() == 8 and np.asarray(out.prompt_tokens)[:8].tolist() == list(range(100, 108))
