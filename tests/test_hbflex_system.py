"""The HBFlex organisations served on the engine with HBFlex's parts (``hbfjax.serve.engine``,
``ServeConfig.parts = parts.HBFLEX``): hand-traced reuse and
write stalls, H3's HBM-only request KV, eviction under a small KV room, Little's law, one compilation
for the six organisations on common random numbers (the tabulated wave law against exact draws is in
tests/test_wave.py)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from _compiles import compilations
from _tiny_models import GQA
from conftest import real_trace_or_skip
from hbfjax import batch as hb
from hbfjax import clock, traces
from hbfjax.memory import hbf_packages as hp
from hbfjax.serve import engine, metrics, parts, plane_store, report, systems
from hbfjax.serve.parts.blocks import BlocksConfig
from hbfjax.validate import ConfigError
from hbfjax.serve.parts import reads as reads_part
from hbfjax.serve.parts.reads import ReadsConfig, read_laws
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.workload import timing
from hbfjax.workload import requests as rq

CHUNK = 64


def _config(requests: int, slots: int = 4, model=GQA, replay: str = "exact", wave_draw: str = "table",
            blocks: BlocksConfig = BlocksConfig()):
    return engine.ServeConfig(model=model, batcher=BatcherConfig(slots=slots),
                              requests=rq.RequestsConfig(requests, arrivals="trace", replay=replay),
                              max_pass_tokens=engine.pass_token_bound(slots, CHUNK, 4 * CHUNK), max_iterations=20_000,
                              scan_chunk=16, parts=parts.HBFLEX, reads=ReadsConfig(wave_draw=wave_draw), blocks=blocks)


def _knobs(name: str, kv_room_bytes=None, package=None):
    pkg = package or hp.package(name)
    return engine.ServeKnobs.make(pkg.org, timing.GpuKnobs.make("h200"),
                                  BatcherKnobs.make(chunk_tokens=CHUNK, token_budget=4 * CHUNK), rq.RequestKnobs.make(),
                                  policy=pkg.policy, kv_room_bytes=kv_room_bytes)


def _inputs(trace, points) -> engine.ServeInputs:
    """The run's inputs: the trace and the read laws the points need."""
    return engine.ServeInputs(trace=trace, read_laws=read_laws(points))


def _report(out) -> dict:
    """The parts' per-stream report keys (report.part_keys)."""
    return report.part_keys(out, parts.HBFLEX)


def _swebench(tmp_path, rows) -> rq.TraceInputs:
    """A SWE-bench-format trace (chars at 4 per token) of ``rows`` = (session, t_s, in, out, prefix) tokens."""
    lines = [f"{s},{int(t * 1e6)},{4 * i},{4 * o},{4 * p}" for s, t, i, o, p in rows]
    path = tmp_path / "sessions.csv"
    path.write_text("session_id,timestamp_us,input_chars,output_chars,prefix_chars_shared_with_previous_turn\n"
                    + "\n".join(lines) + "\n")
    return rq.TraceInputs.from_trace(traces.load_trace(path), len(rows))


def test_a_later_turn_reuses_its_sessions_retained_kv_in_whole_logical_pages(tmp_path):
    # turn 1: 100 prompt + 10 output tokens; turn 2, long after, shares 110 tokens with it: min(prefix 110,
    # held 110, prompt − 1 = 149) = 110 tokens, cut to whole 16-token logical pages: 96 reused
    trace = _swebench(tmp_path, [("a", 0.0, 100, 10, 0), ("a", 1000.0, 150, 5, 110)])
    cfg = _config(2)
    knobs = _knobs("hbflex")
    inputs = _inputs(trace, [knobs])  # the page size is not in the read law's key: one law serves both runs
    out = hb.run(engine.simulate, 1, 0, knobs, cfg, inputs=inputs)
    rep = _report(out)
    assert rep["prefix_hit_tokens_fraction"][0] == pytest.approx(96 / 250)
    no_reuse = hb.run(engine.simulate, 1, 0, _knobs("hbflex", package=hp.Package(
        hp.hbflex().org, hp.hbflex_policy(logical_page_tokens=256))), cfg, inputs=inputs)
    assert not np.any(out.missing_inputs) and not np.any(no_reuse.missing_inputs)
    assert _report(no_reuse)["prefix_hit_tokens_fraction"][0] == 0.0  # 110 < one 256-token page
    # the reused tokens are not prefilled: turn 2 needs ceil(54 / 64) = 1 chunk instead of ceil(150 / 64) = 3
    assert int(no_reuse.iterations[0]) - int(out.iterations[0]) == 2
    # H3 keeps request KV out of HBF: nothing retained, nothing moved, turn 2 recomputes its whole prompt
    h3 = _knobs("h3")
    recompute = hb.run(engine.simulate, 1, 0, h3, cfg, inputs=_inputs(trace, [h3]))
    assert not np.any(recompute.missing_inputs)
    assert _report(recompute)["prefix_hit_tokens_fraction"][0] == 0.0
    assert float(np.asarray(recompute.parts["sessions"].totals.retention_write_bytes)[0]) == 0.0
    assert int(recompute.iterations[0]) == int(no_reuse.iterations[0])


AZURE_REQUESTS, STREAMS, SEED = 24, 2, 4
ROOM_TOKENS = 20_000  # above the longest request (7,437 tokens), a few requests' KV
# planes of 512 blocks × 4 pages: a page is the room's share of a plane, so at the paper's 512 × 512 a
# 20,000-token room makes a chunk's KV (16 passes × 8 slots × 64 tokens) ≈ 50,000 pages a plane, far over
# the 1,024 a plane programs a chunk; here ≈ 40 of 64, and the small room turns over within 24 requests
# (the free-block reserve, 16 + 2 + 3 blocks, stays under the 5 % the 95 % GC trigger leaves)
SMALL_PLANES = BlocksConfig(blocks_per_plane=512, pages_per_block=4, n_labels=2, plane_writes_per_chunk=64)
# The azure-trace tests share one run (one compilation per process): the six organisations and naive HBF with a
# small KV room on one knob axis, common random numbers (see _organisations)
POINTS = tuple(hp.PACKAGES) + ("naive-hbf, small room",)


def _azure():
    return (rq.TraceInputs.from_trace(traces.load_trace(real_trace_or_skip("azure_llm_2023_code.csv")), AZURE_REQUESTS),
            _config(AZURE_REQUESTS, slots=8, replay="offset", blocks=SMALL_PLANES))


def _point_knobs(point: str):
    if point == POINTS[-1]:
        return _knobs("naive-hbf", kv_room_bytes=ROOM_TOKENS * GQA.kv_bytes_per_token)
    return _knobs(point)


@functools.lru_cache(maxsize=None)
def _organisations():
    """(outputs with the knob axis, compilations it took): every point of :data:`POINTS` on one knob axis."""
    trace, cfg = _azure()
    points = [_point_knobs(p) for p in POINTS]
    with compilations("simulate") as compiled:
        out = hb.run(engine.simulate, STREAMS, SEED, hb.stack_knobs(points), cfg, inputs=_inputs(trace, points),
                     knob_axis=True)
    assert not np.any(out.missing_inputs)
    return out, len(compiled)


def _point(name: str):
    """One point's outputs (leading stream axis) from the shared run."""
    k = POINTS.index(name)
    return jax.tree_util.tree_map(lambda a: a[:, k], _organisations()[0])


def test_immediate_writes_stall_one_program_per_layer_and_pass():
    # naive HBF programs each layer's new KV at once: a few pages on distinct planes, one tPROG per layer
    out = _point("naive-hbf")
    t_prog = float(hp.naive_hbf().org.t_prog_us)
    passes = np.asarray(out.totals.passes)
    np.testing.assert_allclose(np.asarray(out.totals.write_stall_us), passes * GQA.layers * t_prog, rtol=1e-6)
    window = _point("hbflex")
    assert np.all(np.asarray(window.totals.write_stall_us) == 0.0)  # window-aware: nothing forced at this size


def test_block_first_reads_meet_a_requests_pages_in_runs_on_one_plane():
    # immediate block-first writes put a 64-token chunk's KV of a layer, ceil(64 × 128 B / 4 KiB) = 2 pages, in
    # one block (more than the 4-page block's share of each of 4 layers, 1): runs of 2 pages on one plane, so
    # the same reads collide more than naive-hbf's single random pages (common random numbers)
    cfg = _azure()[1]
    assert float(reads_part.run_pages(_point_knobs("naive-block"), cfg)) == 2.0
    assert all(float(reads_part.run_pages(_point_knobs(p), cfg)) == 1.0 for p in POINTS if p != "naive-block")
    block, naive = (_report(_point(p))["read_wave_amplification"] for p in ("naive-block", "naive-hbf"))
    assert np.all(block > naive) and np.all(naive >= 1.0)


def test_h3_keeps_request_kv_in_hbm_and_fills_no_hbf_with_it():
    t = _point("h3").totals
    assert np.all(np.asarray(t.prefill_write_bytes) == 0) and np.all(np.asarray(t.writeback_bytes) == 0)
    assert np.all(np.asarray(t.max_kv_hbf_bytes) == 0)
    assert np.all(np.asarray(t.max_kv_hbm_bytes) > 0)


def test_a_small_kv_room_evicts_sessions_and_gc_reclaims_their_blocks():
    out = _point(POINTS[-1])  # single-turn requests, each retained after it ends until evicted
    rep = _report(out)
    assert np.all(rep["evicted_sessions"] >= 2)
    assert np.all(np.asarray(plane_store.erases(out.parts["blocks"].final)) > 0)  # GC erased blocks
    assert np.all(rep["waf"] >= 1.0)
    assert not np.any(np.asarray(out.overflow))
    held = np.asarray(out.parts["sessions"].final.tokens).sum(axis=1)
    assert np.all(held <= 0.90 * ROOM_TOKENS + 1)  # after the last chunk's eviction nothing runs: cache ≤ threshold


def test_littles_law_holds_in_an_hbflex_replay():
    o = _point("hbflex")
    warmup = 8
    stream = metrics.per_stream(metrics.times(o.arrival, o.first_token, o.finish, o.tokens_out, o.valid),
                                metrics.window(AZURE_REQUESTS, warmup, None))
    little, lam, w = stream["mean_requests_in_system"], stream["arrival_rate_per_s"], stream["e2e_s"]
    gap = little - lam * w
    # L = λW over a window holds up to the requests straddling its ends: a few requests' time each
    bound = 4 * lam * np.max(clock.to_seconds(o.finish) - clock.to_seconds(o.arrival), axis=1) / (AZURE_REQUESTS - warmup)
    assert np.all(np.abs(gap) <= bound + 1e-9)


def test_six_organisations_compile_once_and_share_their_arrivals():
    out, compiled = _organisations()
    assert compiled == 1  # the six organisations and the small room: one compilation
    trace, cfg = _azure()
    points = [_point_knobs(p) for p in POINTS[::-1]]
    with compilations("simulate") as again_compiled:
        again = hb.run(engine.simulate, STREAMS, SEED, hb.stack_knobs(points), cfg, inputs=_inputs(trace, points),
                       knob_axis=True)
    assert again_compiled == []  # the same shapes in another order reuse it (the laws too, in another order)
    arrival = np.asarray(clock.to_us(out.arrival))
    for k in range(1, len(POINTS)):
        np.testing.assert_array_equal(arrival[:, 0], arrival[:, k])
    # a point's results do not depend on its neighbours on the knob axis (reversed order, same values)
    np.testing.assert_array_equal(np.asarray(clock.to_us(again.finish))[:, ::-1],
                                  np.asarray(clock.to_us(out.finish)))


def test_a_gc_trigger_the_planes_cannot_honour_is_refused_before_the_run():
    # planes of 128 blocks × 16 pages keep 512 / 16 + 8 labels + 3 = 43 blocks free for a chunk's writes, so GC may
    # trigger at most at 1 − 43 / 128 = 66.4 % used: HBFlex's 95 % is refused; at 512 × 512 the reserve is 13 blocks
    small = BlocksConfig(blocks_per_plane=128, pages_per_block=16, plane_writes_per_chunk=512)  # 32 + 8 + 3 = 43
    sc = systems.Scenario.fixed_batch(GQA, batch=2, prompt=64, output=4, blocks=small)
    with pytest.raises(ConfigError, match=r"gc_trigger = 0\.95: above 0\.6641"):
        systems.families(["hbflex"], sc)
    systems.families(["hbflex"], systems.Scenario.fixed_batch(GQA, batch=2, prompt=64, output=4))  # 512 × 512: fine
