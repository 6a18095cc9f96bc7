"""KV writes into an all-HBF package in one serving pass (HBFlex §3.2, §5.3, Fig. 18): hand-traced
immediate, stripe and window passes on a two-layer LayerTimes, the forced-writeback threshold, an
independent plain-Python reference on random inputs, the policy ordering (and where it breaks),
conservation, and one compilation across knob values. Deterministic: no tolerance beyond float32
rounding of a continuous quantity (rel 1e-5); page counts and buffers are dyadic, so exact.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import hardware
from hbfjax.serve import hbf_writes as hw
from hbfjax.serve import hbflex_reference
from hbfjax.serve.layer_time import OPS, LayerTimes
from hbfjax.validate import ConfigError

QKV, ATT_D, ATT_P, EXPERTS = (OPS.index(o) for o in ("qkv_proj", "attention_decode", "attention_prefill", "experts"))
PASS = jax.jit(hw.pass_writes)


def layer_times(op_us, delivery_us) -> LayerTimes:
    """A LayerTimes with only the fields the writes read (op, delivery; compute = op)."""
    op, dl = jnp.asarray(op_us, jnp.float32), jnp.asarray(delivery_us, jnp.float32)
    z = jnp.zeros(op.shape[:-1], jnp.float32)
    return LayerTimes(op_us=op, delivery_us=dl, compute_us=op, layer_us=op.sum(-1), lm_head_us=jnp.float32(0),
                      iteration_us=op.sum(), expert_direct_bytes=z, expert_relay_bytes=z, expert_startup_us=z,
                      table_miss=jnp.bool_(False), hbm_read_bytes=jnp.float32(0), hbf_read_bytes=jnp.float32(0),
                      pcie_bytes=jnp.float32(0), host_dram_bytes=jnp.float32(0), cpu_flops=jnp.float32(0), allreduce_us=z)


def tiny_times(idle=((5.0, 8.0), (12.0, 9.0))) -> LayerTimes:
    """Two layers; layer 0 idles 5 µs in its QKV projection and 8 µs in decode attention, layer 1 12 µs
    in QKV and 9 µs in chunk attention; the experts read HBF the whole time (no idle)."""
    op, dl = np.zeros((2, len(OPS))), np.zeros((2, len(OPS)))
    for layer, (a, b) in enumerate(idle):
        second = ATT_D if layer == 0 else ATT_P
        dl[layer, [QKV, second, EXPERTS]] = (20.0, 1.0, 30.0)
        op[layer, [QKV, second, EXPERTS]] = (20.0 + a, 1.0 + b, 30.0)
    return layer_times(op, dl)


BUSY = tiny_times(((0.0, 0.0), (0.0, 0.0)))  # every operator HBF-bound: no read-free window

# page 128 B, 32 B per token per layer: 3 decode tokens = 0.75 page, a 19-token chunk = 4.75 pages,
# 5.5 pages a layer; 4 planes, stripes of G = 2, tPROG 10 µs, bandwidth far from binding
SMALL = dict(planes=4, stripe_pages=2, page_bytes=128, t_prog_us=10.0, write_gbps=1e3)
KV = 32.0


def knobs(policy, prefetch=1.0, budget=1e6, **over):
    switch = {"immediate": (0, 0), "stripe": (1, 0), "window": (1, 1)}[policy]
    return hw.WriteKnobs.make(buffered=switch[0], window_aware=switch[1], prefetch=prefetch,
                              sram_kv_budget_bytes=budget, **{**SMALL, **over})


def run(policy, times=None, buffer_bytes=64.0, dec=3, chunk=19, requests=3, kv=KV, **kw):
    state = hw.WriteState(jnp.float32(buffer_bytes))
    new, out = PASS(state, tiny_times() if times is None else times, jnp.int32(dec), jnp.int32(chunk),
                    jnp.int32(requests), kv, knobs(policy, **kw))
    return float(new.buffer_bytes), jax.tree.map(np.asarray, out)


# --- hand-traced passes --------------------------------------------------------------------------

def test_immediate_programs_each_request_and_the_chunk_at_once():
    # per layer: 3 requests × ceil(32/128) = 3 pages + ceil(4.75) = 5 chunk pages = 8 → ceil(8/4) = 2 rounds
    buf, out = run("immediate")
    assert out.stall_us.tolist() == [20.0, 20.0]
    assert out.programmed_pages == 16 and out.program_busy_us == 40.0
    assert buf == 64.0 and out.buffer_peak_bytes == 64.0 and out.forced_writebacks == 0


def test_block_first_programs_a_requests_pages_serially_on_its_plane():
    # the same 8 pages a layer; the largest request's pages serialise on its block's plane: the 19-token
    # chunk's 5 pages take 5 rounds (random placement: 2); chunks of 10 and 9 tokens: ceil(2.5) = 3 rounds
    for largest, rounds in ((19, 5), (10, 3), (0, 2)):  # no chunk this large: the 2 rounds of 8 pages on 4 planes
        state = hw.WriteState(jnp.float32(64.0))
        _, out = PASS(state, tiny_times(), jnp.int32(3), jnp.int32(19), jnp.int32(3), KV,
                      knobs("immediate", block_first=1.0), None, jnp.int32(largest))
        assert out.stall_us.tolist() == [10.0 * rounds] * 2, largest
        assert out.programmed_pages == 16 and out.program_busy_us == 20.0 * rounds
    # decode only: one page per request, each on its own plane: one round (random placement: ceil(3/4) = 1)
    _, out = PASS(hw.WriteState(jnp.float32(0.0)), tiny_times(), jnp.int32(3), jnp.int32(0), jnp.int32(3), KV,
                  knobs("immediate", block_first=1.0), None, jnp.int32(0))
    assert out.stall_us.tolist() == [10.0, 10.0]
    # buffered policies ignore it
    assert run("window", block_first=1.0)[1].stall_us.tolist() == run("window")[1].stall_us.tolist()


def test_immediate_pages_split_tokens_over_requests():
    page = jnp.float32(128.0)
    f = lambda d, r, c: float(hw.immediate_pages(jnp.int32(d), jnp.int32(r), jnp.int32(c), 48.0, page))  # noqa: E731
    assert f(3, 3, 0) == 3  # one 48-B token each: a partial page each
    assert f(7, 3, 0) == 1 * math.ceil(3 * 48 / 128) + 2 * math.ceil(2 * 48 / 128)  # 3 + 2 + 2 tokens
    assert f(10, 3, 0) == 1 * 2 + 2 * 2  # 4 tokens = 192 B = 2 pages; 3 tokens = 144 B = 2 pages
    assert f(0, 0, 8) == 3  # 8 × 48 = 384 B = 3 pages, no decode
    assert f(5, 0, 0) == 2  # tokens without a request are one program, not dropped: 240 B
    assert f(0, 0, 0) == 0


def test_stripe_programs_whole_stripes_and_keeps_the_rest():
    # layer 0: 0.5 + 5.5 = 6 pages → 3 stripes, 2 rounds; layer 1: 5.5 → 2 stripes, 1 round, 1.5 left
    buf, out = run("stripe")
    assert out.stall_us.tolist() == [20.0, 10.0]
    assert out.programmed_pages == 10 and out.program_busy_us == 30.0
    assert buf == 1.5 * 128 and out.buffer_peak_bytes == 1.5 * 128 and out.forced_writebacks == 0


def test_window_drains_in_read_free_windows_without_stalling():
    # prefetch windows 5 + 8 = 13 and 12 + 9 = 21 µs: 1 and 2 rounds of 4 pages
    # layer 0: 6 pages → 4 drained, 2 left; layer 1: 7.5 → 6 drained (whole stripes), 1.5 left
    buf, out = run("window")
    assert out.window_us.tolist() == [13.0, 21.0]
    assert out.stall_us.tolist() == [0.0, 0.0]
    assert out.programmed_pages == 10 and out.program_busy_us == 30.0
    assert buf == 1.5 * 128 and out.buffer_peak_bytes == 7.5 * 128


def test_without_prefetch_a_window_is_one_operator_and_drains_less():
    # windows 8 and 12 µs: 0 and 1 round; layer 0 keeps 6 pages, layer 1 drains 4 of 11.5
    buf, out = run("window", prefetch=0.0)
    assert out.window_us.tolist() == [8.0, 12.0]
    assert out.stall_us.tolist() == [0.0, 0.0]
    assert out.programmed_pages == 4 and out.program_busy_us == 10.0
    assert buf == 7.5 * 128 and out.buffer_peak_bytes == 11.5 * 128


def test_window_drain_is_bounded_by_write_bandwidth():
    # 0.0128 GB/s = 12.8 B/µs: 13 µs carries 1.3 pages (→ 0 whole stripes), 21 µs 2.1 pages (→ 1 stripe)
    buf, out = run("window", write_gbps=0.0128)
    assert out.stall_us.tolist() == [0.0, 0.0]
    assert out.programmed_pages == 2
    assert buf == (0.5 + 11.0 - 2.0) * 128


def test_program_time_is_rounds_or_bandwidth_whichever_is_longer():
    k = knobs("immediate", write_gbps=0.0128)  # 4 pages = 512 B take 40 µs at 12.8 B/µs
    assert float(hw.program_us(jnp.float32(4.0), k)) == pytest.approx(40.0, rel=1e-5)
    assert float(hw.program_us(jnp.float32(1.0), k)) == pytest.approx(10.0, rel=1e-5)  # one round
    assert float(hw.program_us(jnp.float32(9.0), knobs("immediate"))) == pytest.approx(30.0)  # 3 rounds


def test_decode_pass_without_idle_time_drains_nothing_and_a_chunk_pass_drains():
    buf, out = run("window", times=BUSY, chunk=0)
    assert out.window_us.tolist() == [0.0, 0.0]
    assert out.programmed_pages == 0 and out.stall_us.tolist() == [0.0, 0.0]
    assert buf == 64.0 + 2 * 3 * KV  # every byte stays in SRAM
    # a chunk whose attention computes 100 µs past its reads: 10 rounds × 4 planes = 40 pages a layer
    op, dl = np.asarray(BUSY.op_us).copy(), np.asarray(BUSY.delivery_us)
    op[:, ATT_P] += 100.0
    buf, out = run("window", times=layer_times(op, dl), buffer_bytes=float(buf))
    assert out.window_us.tolist() == [100.0, 100.0]
    # from 2 pages: layer 0: 2 + 5.5 = 7.5 → 6 drained; layer 1: 1.5 + 5.5 = 7 → 6 drained, 1 left
    assert out.programmed_pages == 12 and out.stall_us.tolist() == [0.0, 0.0]
    assert buf == 1.0 * 128


def test_forced_writeback_exactly_when_the_budget_is_exceeded():
    # no window: layer 0 reaches 6 pages, layer 1 11.5 pages
    buf, out = run("window", times=BUSY, budget=6 * 128)  # layer 0 at the budget: not over it
    # layer 1: 5.5 pages over → 3 stripes forced, 2 rounds → 20 µs; 5.5 left
    assert out.stall_us.tolist() == [0.0, 20.0] and out.forced_writebacks == 1
    assert out.programmed_pages == 6 and buf == 5.5 * 128 and out.buffer_peak_bytes == 6 * 128
    buf, out = run("window", times=BUSY, budget=6 * 128 - 1)  # one byte less: layer 0 is over too
    # layer 0: 1/128 page over → 1 stripe, 1 round; layer 1: 4 + 5.5 = 9.5, 3.5 over → 2 stripes, 1 round
    assert out.stall_us.tolist() == [10.0, 10.0] and out.forced_writebacks == 2
    assert out.programmed_pages == 6 and buf == 5.5 * 128
    buf, out = run("window", times=BUSY, budget=12 * 128)  # never over
    assert out.forced_writebacks == 0 and out.stall_us.tolist() == [0.0, 0.0] and buf == 11.5 * 128


def test_forced_writeback_then_the_window_drains():
    # budget 5 pages, prefetch windows 13 and 21 µs. layer 0: 6 pages, 1 over → 1 stripe forced (10 µs),
    # 4 left, 1 round drains 4 → 0; layer 1: 5.5, 0.5 over → 1 stripe forced (10 µs), 3.5 left, 2 rounds drain 2
    buf, out = run("window", budget=5 * 128)
    assert out.stall_us.tolist() == [10.0, 10.0] and out.forced_writebacks == 2
    assert out.programmed_pages == 2 + 4 + 2 + 2 and out.program_busy_us == 10 + 10 + 10 + 10
    assert buf == 1.5 * 128 and out.buffer_peak_bytes == 4 * 128


def test_prefetch_window_is_at_least_the_single_operator_window():
    rng = np.random.default_rng(7)
    dl = rng.uniform(0, 50, (5, len(OPS)))
    times = layer_times(dl + rng.uniform(0, 30, dl.shape) * (rng.uniform(size=dl.shape) < 0.5), dl)
    on, off = hw.window_us(times, jnp.float32(1.0)), hw.window_us(times, jnp.float32(0.0))
    assert np.all(np.asarray(on) >= np.asarray(off)) and np.any(np.asarray(on) > np.asarray(off))


def test_deepseek_v4_pro_like_decode_pass_fig18():
    # HBFlex Fig. 18 setting: 61 layers, 64 decode requests, 82 B/token/layer, the HBFlex package
    # (3,072 planes, 4 KiB, tPROG 75 µs, 163.2 GB/s). Immediate: 64 one-page programs per layer, one
    # round (their 256 KiB take 1.6 µs at 163.2 GB/s): 61 × 75 = 4,575 µs (the paper: 4.54 ms on average).
    # Stripe (G = 32, 128 KiB) from empty: 61 × 64 × 82 B = 320,128 B fill 2 stripes, one round each: 150 µs.
    # Window: every layer offers 80 µs of idle arrays (one round), so nothing stalls.
    op = np.zeros((61, len(OPS)))
    op[:, ATT_D] = 80.0
    times = layer_times(op, np.zeros_like(op))
    hbf = hardware.preset("hbflex").hbf
    out = {}
    for name, b, w in (("immediate", 0, 0), ("stripe", 1, 0), ("window", 1, 1)):
        k = hw.WriteKnobs.for_package(hbf, sram_kv_budget_bytes=20e6, buffered=b, window_aware=w)
        out[name] = PASS(hw.init_state(), times, jnp.int32(64), jnp.int32(0), jnp.int32(64), 82.0, k)
    assert float(out["immediate"][1].stall_us.sum()) == pytest.approx(4575.0, rel=1e-6)
    assert float(out["immediate"][1].programmed_pages) == 61 * 64
    assert float(out["stripe"][1].stall_us.sum()) == pytest.approx(150.0, rel=1e-6)
    assert float(out["stripe"][1].programmed_pages) == 64
    assert float(out["stripe"][0].buffer_bytes) == pytest.approx(320128.0 - 2 * 32 * 4096, rel=1e-6)
    assert float(out["window"][1].stall_us.sum()) == 0.0 and float(out["window"][1].programmed_pages) == 64


# --- an independent plain-Python reference on random inputs -------------------------------------

def reference(buf0, op, dl, dec, chunk, req, kv, k, max_chunk=None):
    """The module docstring's model, one layer at a time in Python floats (``hbflex_reference.pass_writes``,
    the plain-Python step of the HBFlex reference), with each layer's window from its operators."""
    windows = [(sum if k["prefetch"] else max)(max(o - d, 0.0) for o, d in zip(ro, rd)) for ro, rd in zip(op, dl)]
    buf, r = hbflex_reference.pass_writes(buf0, windows, dec, chunk, req, kv, k, max_chunk)
    return buf, r["stalls_us"], r["pages"], r["busy_us"], r["forced"], r["peak_bytes"], windows


def random_cases(n, seed, ordered=False):
    """Random passes on dyadic values (float32-exact page counts); ``ordered``: only inputs that meet
    the ordering's conditions (see test_policy_ordering)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        L = 3
        dl = rng.integers(0, 60, (L, len(OPS))).astype(float)
        op = dl + rng.integers(0, 120, dl.shape) * (rng.uniform(size=dl.shape) < 0.3)
        planes = int(rng.choice([4, 8, 16, 64]))
        G = planes if ordered else int(rng.choice([d for d in (1, 2, 4, 8, 16) if d <= planes]))
        page, t = 4096, float(rng.choice([10, 25, 75]))
        gbps = 256.0 if ordered else float(rng.choice([0.25, 1.0, 4.0, 256.0]))
        req = int(rng.integers(0, 65))
        dec = req * int(rng.integers(1, 3))
        chunk = int(rng.integers(0, 4097)) * int(rng.uniform() < 0.5)
        kv = 16.0 * int(rng.integers(1, 65))
        budget_pages = rng.integers(G if ordered else 0, 400)
        buf0 = 16.0 * int(rng.integers(0, (G if ordered else 2 * G) * page // 16))
        knob = dict(planes=planes, stripe_pages=G, page_bytes=page, t_prog_us=t, write_gbps=gbps,
                    sram_kv_budget_bytes=float(budget_pages * page), prefetch=int(rng.integers(0, 2)))
        yield buf0, op, dl, dec, chunk, req, kv, knob


def run_case(case, policy, max_chunk=None):
    buf0, op, dl, dec, chunk, req, kv, knob = case
    k = {**knob, "buffered": policy not in ("immediate", "block-first"), "window_aware": policy == "window",
         "block_first": policy == "block-first"}
    kn = hw.WriteKnobs.make(buffered=float(k["buffered"]), window_aware=float(k["window_aware"]),
                            block_first=float(k["block_first"]), **knob)
    new, out = PASS(hw.WriteState(jnp.float32(buf0)), layer_times(op, dl), jnp.int32(dec), jnp.int32(chunk),
                    jnp.int32(req), kv, kn, None, None if max_chunk is None else jnp.int32(max_chunk))
    return k, float(new.buffer_bytes), jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("policy", ["immediate", "block-first", "stripe", "window"])
def test_matches_plain_python_reference(policy):
    seed = {"immediate": 1, "stripe": 2, "window": 3, "block-first": 6}[policy]
    for i, case in enumerate(random_cases(40, seed=seed)):
        largest = (case[4] * (i % 3)) // 2 if policy == "block-first" else None  # 0, half or all of the chunk
        k, buf, out = run_case(case, policy, largest)
        ref_buf, stall, pages, busy, forced, peak, windows = reference(*case[:-1], k, largest)
        assert buf == ref_buf and out.programmed_pages == pages and out.forced_writebacks == forced
        assert out.buffer_peak_bytes == peak and out.window_us.tolist() == windows
        np.testing.assert_allclose(out.stall_us, stall, rtol=1e-5)
        assert out.program_busy_us == pytest.approx(busy, rel=1e-6)


def test_conservation_bytes_in_equal_bytes_programmed_plus_buffer_change():
    for case in random_cases(30, seed=4):
        buf0, op, dl, dec, chunk, req, kv, knob = case
        bytes_in = 3 * (dec + chunk) * kv
        for policy in ("stripe", "window"):
            _, buf, out = run_case(case, policy)
            assert out.programmed_pages * knob["page_bytes"] + (buf - buf0) == pytest.approx(bytes_in, abs=1e-3)
        _, buf, out = run_case(case, "immediate")  # everything programmed at once, padded to pages
        assert buf == buf0 and out.programmed_pages * knob["page_bytes"] >= bytes_in


def test_policy_ordering_window_le_stripe_le_immediate():
    """Why it must hold, under stated conditions: (a) G divides planes, (b) the buffer starts below one
    stripe (a state stripe writeback can be in), (c) write_gbps >= planes × page / tPROG (a batch's
    bytes never outlast its rounds, so stall = rounds × tPROG), and for window <= stripe (d) planes = G
    and a budget >= G pages.
    stripe <= immediate, per layer: stripe programs S whole stripes with S·G <= buffer + new < G + new
    pages, so S <= ceil(new / G), and ceil(S / m) <= ceil(new / (m·G)) <= immediate's rounds (planes = m·G,
    immediate pads every program to >= new pages). window <= stripe, per pass: the window policy only
    ever programs whole stripes (budget >= G), at most floor((b0 + bytes in) / G) of them, which is exactly
    what stripe programs; with planes = G each stripe is one round, and only forced ones stall.
    Counter-examples when (c) or (d) fail: the next two tests."""
    for case in random_cases(60, seed=5, ordered=True):
        stall = {p: float(run_case(case, p)[2].stall_us.sum()) for p in ("immediate", "stripe", "window")}
        assert stall["window"] <= stall["stripe"] + 1e-3 <= stall["immediate"] + 2e-3, (case, stall)


def test_counter_example_window_above_stripe_when_planes_exceed_a_stripe():
    # planes = 2G, budget G, one layer, two passes of 4 pages then 1 page (128-B tokens = 1 page each).
    # stripe: 2 stripes in one round, then nothing. window: 2 pages over → 1 stripe forced in pass 1
    # (2 left), 1 over → 1 stripe forced in pass 2: one round each, twice stripe's stall.
    one = layer_times(np.zeros((1, len(OPS))), np.zeros((1, len(OPS))))
    kw = dict(times=one, dec=0, requests=0, kv=128.0, planes=4, stripe_pages=2, budget=2 * 128)
    total = {}
    for policy in ("stripe", "window"):
        buf, first = run(policy, buffer_bytes=0.0, chunk=4, **kw)
        _, second = run(policy, buffer_bytes=buf, chunk=1, **kw)
        total[policy] = float(first.stall_us.sum() + second.stall_us.sum())
    assert total == {"stripe": 10.0, "window": 20.0}


def test_counter_example_stripe_above_immediate_when_bandwidth_binds():
    # 1 layer, 4 planes, G = 4, 12.8 B/µs: a stripe (512 B) takes 40 µs, one request's page 10 µs.
    # From 3.75 buffered pages, one 32-B token completes a stripe: stripe stalls 40, immediate 10.
    one = layer_times(np.zeros((1, len(OPS))), np.zeros((1, len(OPS))))
    kw = dict(times=one, buffer_bytes=3.75 * 128, dec=1, chunk=0, requests=1, planes=4, stripe_pages=4,
              write_gbps=0.0128)
    _, s = run("stripe", **kw)
    _, i = run("immediate", **kw)
    assert float(s.stall_us[0]) == pytest.approx(40.0, rel=1e-5)
    assert float(i.stall_us[0]) == pytest.approx(10.0, rel=1e-5)


# --- one compilation, validation ---------------------------------------------------------------

def test_one_compilation_across_policies_and_knob_values():
    def fresh_pass_writes(*args):  # a new function: no earlier test's cache entry
        return hw.pass_writes(*args)

    fn = jax.jit(fresh_pass_writes)
    times, state = tiny_times(), hw.init_state()
    with compilations("fresh_pass_writes") as compiled:
        for policy in ("immediate", "stripe", "window"):
            for prefetch in (0.0, 1.0):
                k = knobs(policy, prefetch=prefetch, planes=8 if prefetch else 4, t_prog_us=75.0 - 10 * prefetch)
                fn(state, times, jnp.int32(3), jnp.int32(19), jnp.int32(3), KV, k)[1].stall_us.block_until_ready()
    assert len(compiled) == 1


@pytest.mark.parametrize("field, value, rule", [
    ("buffered", 0.5, "must be 0 or 1"), ("prefetch", 2, "must be 0 or 1"),
    ("stripe_pages", 8, "must be in [1, 4]"), ("planes", 0, "must be in [1,"), ("page_bytes", 1.5, "integer"),
    ("t_prog_us", 0.0, "must be in (0,"), ("write_gbps", float("nan"), "finite"),
])
def test_bad_knobs_are_refused_with_field_value_and_rule(field, value, rule):
    with pytest.raises(ConfigError, match=f"WriteKnobs.{field} = .*{rule}".replace("[", r"\[").replace("(", r"\(")):
        hw.WriteKnobs.make(**{**SMALL, "sram_kv_budget_bytes": 0.0, field: value})
    with pytest.raises(ConfigError, match="sram_kv_budget_bytes"):
        hw.WriteKnobs.make(**SMALL, sram_kv_budget_bytes=-1.0)
