"""The Chrome timeline of one stream (``hbfjax.serve.timeline``, issue 25): recording leaves the replay's numbers
unchanged, every track adds up to the run's totals (pass slices to busy time, layers, head and stall to
each pass, operators to each layer, the stall and program tracks to their totals), the window bounds the
file, and what the replay cannot model is refused; on HBFlex's parts (the block-store case of
``test_hbflex_reference``) the GC track adds up to the GC the run booked. The replay against the engine:
``test_cli_serve`` (the JSON's busy time and stalls), ``test_serve_reference`` and ``test_hbflex_reference``
(every time and total)."""

import json

import pytest

from hbfjax.serve import hbflex_reference, reference, systems, timeline
from hbfjax.validate import ConfigError

MODEL = "qwen3-235b-a22b"


@pytest.fixture(scope="module")
def dash():
    """DASH serving 3 requests of 300 → 6 tokens with a 1 MB HBM KV budget (about 5 tokens of Qwen3's KV),
    so that decode KV is written back."""
    sc = systems.Scenario.fixed_batch(MODEL, batch=3, prompt=300, output=6, hbm_kv_budget_bytes=1e6)
    return systems.single("dash", sc)


def _replay(family, window=(0, 10_000)):
    result, totals, record, chunks, _ = timeline.replay(family, 0, 1, 3)
    assert chunks == []  # DASH's organisations have no block store
    trace, summary = timeline.chrome_trace(result, record, family.config.model, window, "test")
    return result, totals, record, trace, summary


def test_recording_leaves_the_replay_unchanged(dash):
    plain, plain_totals, _ = reference.serve(1, 3, dash.points[0], dash.config)
    result, totals, record, _, _ = timeline.replay(dash, 0, 1, 3)
    assert (result.first_token_us, result.finish_us) == (plain.first_token_us, plain.finish_us)
    assert totals == plain_totals and len(record) == totals.passes


@pytest.fixture(scope="module")
def naive_hbf():
    """The naive-hbf policy on the block-store case of test_hbflex_reference (reuse, LRU eviction, GC)."""
    from test_hbflex_reference import POLICIES, SEED, case

    config, knobs, inputs = case()
    kn = knobs[POLICIES.index("naive-hbf")]
    record: list = []
    result, totals, step = hbflex_reference.serve(0, SEED, kn, config, inputs, record=record)
    plain = hbflex_reference.serve(0, SEED, kn, config, inputs)
    return config, result, totals, step, record, plain


def test_hbflex_recording_leaves_the_replay_unchanged(naive_hbf):
    _, result, totals, step, record, (plain, plain_totals, plain_step) = naive_hbf
    assert (result.first_token_us, result.finish_us) == (plain.first_token_us, plain.finish_us)
    assert totals == plain_totals and step.hbf_totals() == plain_step.hbf_totals()
    assert len(record) == totals.passes and plain_step.chunks is None


def test_hbflex_tracks_add_up_to_the_run_totals(naive_hbf):
    config, result, totals, step, record, _ = naive_hbf
    trace, summary = timeline.chrome_trace(result, record, config.model, (0, 10_000), "test", step.chunks)
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    passes = [e for e in slices if e["tid"] == 1]
    gc = [e for e in slices if e["tid"] == 6]
    h = step.hbf_totals()
    assert sum(e["dur"] for e in passes) == pytest.approx(totals.busy_us, rel=1e-12)
    assert h["gc_us"] > 0 and sum(e["dur"] for e in gc) == pytest.approx(h["gc_us"], rel=1e-12)
    assert summary["window_gc_s"] == pytest.approx(h["gc_us"] * 1e-6, rel=1e-12)
    assert sum(e["args"]["read_waves"] for e in passes) == pytest.approx(h["read_waves"], rel=1e-12)
    assert sum(e["args"]["kv_read_stall_us"] for e in passes) == pytest.approx(h["kv_read_stall_us"], rel=1e-12)
    evicted = [int(e["name"].split()[0]) for e in events if e["ph"] == "i" and "evicted" in e["name"]]
    assert sum(evicted) == step.cache.evicted > 0  # every LRU eviction of the run (none in its last chunk here)
    # GC runs at its iteration's start, before the passes: no pass overlaps a GC slice
    for g in gc:
        assert not any(p["ts"] < g["ts"] + g["dur"] - 1e-6 and g["ts"] < p["ts"] + p["dur"] for p in passes)
    sram = [e for e in events if e["ph"] == "C" and e["name"].startswith("base-die SRAM")]
    assert len(sram) == totals.passes and max(e["args"]["in use"] for e in sram) * 1e6 == pytest.approx(
        h["sram_peak_bytes"], rel=1e-12)
    json.dumps(trace)


def test_every_track_adds_up_to_the_run_totals(dash):
    result, totals, record, trace, summary = _replay(dash)
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    by_track = lambda tid: [e for e in slices if e["tid"] == tid]  # noqa: E731
    passes = by_track(1)
    assert len(passes) == totals.passes
    assert sum(e["dur"] for e in passes) == pytest.approx(totals.busy_us, rel=1e-12)
    assert summary["window_busy_s"] == pytest.approx(totals.busy_us * 1e-6, rel=1e-12)
    stall = [e for e in by_track(4) if e["name"] == "exposed KV-write stall"]
    assert sum(e["dur"] for e in stall) == pytest.approx(totals.write_stall_us, rel=1e-12) and totals.write_stall_us > 0
    programs = [e for e in by_track(4) if e["name"] == "KV programs"]
    assert sum(e["args"]["program_busy_us"] for e in programs) == pytest.approx(totals.program_busy_us, rel=1e-12)
    assert sum(e["args"]["writeback_bytes"] for e in programs) == pytest.approx(totals.writeback_bytes, rel=1e-12)
    assert totals.writeback_bytes > 0
    layers, operators = by_track(2), by_track(3)
    for p in passes:  # layers and the LM head fill the pass up to its stall; operators fill each layer
        inside = [e for e in layers if p["ts"] <= e["ts"] < p["ts"] + p["dur"]]
        assert sum(e["dur"] for e in inside) + p["args"]["stall_us"] == pytest.approx(p["dur"], rel=1e-9)
    for layer in (e for e in layers if e["name"] != "LM head"):
        ops = [e for e in operators if layer["ts"] <= e["ts"] < layer["ts"] + layer["dur"]]
        assert sum(e["dur"] for e in ops) == pytest.approx(layer["dur"], rel=1e-9), layer["name"]
    experts = [e for e in operators if e["name"] == "routed experts"]
    assert sum(e["args"]["direct_bytes"] for e in experts) == pytest.approx(totals.expert_direct_bytes, rel=1e-12)
    assert sum(e["args"]["relay_bytes"] for e in experts) == pytest.approx(totals.expert_relay_bytes, rel=1e-12)
    finished = [e for e in events if e["ph"] == "i" and e["name"].endswith("finished")]
    assert sorted(e["ts"] for e in finished) == sorted(result.finish_us)
    json.dumps(trace)  # serialisable as it stands


def test_the_window_bounds_the_file(dash):
    _, totals, record, _, full = _replay(dash)
    _, _, _, trace, part = _replay(dash, (1, 3))
    assert part["passes"] == [1, 3] and [e["name"].split(":")[0] for e in trace["traceEvents"]
                                         if e["ph"] == "X" and e["tid"] == 1] == ["pass 1", "pass 2"]
    assert part["window_busy_s"] == pytest.approx((record[1]["us"] + record[2]["us"]) * 1e-6, rel=1e-12)
    assert part["events"] < full["events"]
    _, _, _, _, clipped = _replay(dash, (2, 10**5))
    assert clipped["passes"] == [2, totals.passes]
    with pytest.raises(ConfigError, match="passes"):
        _replay(dash, (totals.passes, totals.passes + 5))


@pytest.mark.parametrize("text, want", [("0:500", (0, 500)), ("7:", (7, 2007)), (":9", (0, 9))])
def test_window_option(text, want):
    assert timeline.parse_window(text) == want


@pytest.mark.parametrize("text", ["5", "5:5", "a:b", "-1:4", "0:200001"])
def test_bad_window_is_refused(text):
    with pytest.raises(ConfigError, match="--timeline-passes"):
        timeline.parse_window(text)


@pytest.mark.parametrize("name, changes, match", [("dash", {"reads": "planes"}, "parts"), ("hybrid", {}, "CPU"),
                                                   ("dash", {"routing": "zipf"}, "routing")])
def test_what_the_replay_cannot_model_is_refused(name, changes, match):
    family = systems.single(name, systems.Scenario.fixed_batch(MODEL, batch=2, prompt=64, output=4, **changes))
    with pytest.raises(ConfigError, match=match):
        timeline.check_family(family, 0)
