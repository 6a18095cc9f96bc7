"""`hbfjax serve` end to end: every registered system alone and as a sweep point with the same keys, several
systems in one run, online runs with Little's law and the saturation flag, clean refusals.

Every test serves Qwen3-235B-A22B at the tiny fixed batch ``TINY`` (2 requests of 64 → 4 tokens, 2 streams)
or its online variant, so that each system kind (DASH's organisations, HBFlex's, the CPU systems)
compiles once per knob-axis width in the process."""

import json

import pandas as pd
import pytest

from hbfjax import energy
from hbfjax.cli import build_parser, main
from hbfjax.commands import serve
from hbfjax.commands import _choices as names
from hbfjax.commands.serve import warnings_of
from hbfjax.serve import reference, timeline
from hbfjax.sweep.table import flatten

TINY = ["--model", "qwen3-235b-a22b", "--batch", "2", "--prompt", "64", "--output", "4", "--streams", "2"]
QWEN3_LAYERS = 94
ONLINE = ["--prompt", "64", "--output", "4", "--slots", "4", "--streams", "2"]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def _metrics(result: dict) -> dict:
    """A single system's result as the sweep's flat columns, without the run header."""
    flat = flatten(result)
    return {k: v for k, v in flat.items() if k not in ("model", "gpu", "streams", "seed", "system")}


@pytest.mark.slow  # 94 worker-seconds: make test-slow (make test runs several systems in test_serve_json_keys_and_several_systems)
def test_every_system_runs_alone_and_as_a_sweep_point_with_the_same_keys(capsys, tmp_path):
    alone = {}
    for name in names.SYSTEMS:
        assert main(["serve", "--system", name, *TINY, "--json"]) == 0, name
        out = _json(capsys)
        assert out["system"] == name and not out["overflow"]
        assert out["throughput_tokens_per_s"] > 0 and out["tpot_ms"] > 0
        alone[name] = _metrics(out)
    hbflex = alone["hbflex"]
    # 2 × 68 tokens of KV are ≈ 1,700 pages of the package (a page is the room's share of a plane, ≈ 3.6 KB), a
    # 32nd of them on each sampled plane in the two sessions' plane groups: WAF is measured, and is 1 (no GC)
    assert hbflex["host_writes"] > 0 and hbflex["waf"] == 1.0 and hbflex["block_erases"] == 0
    # HBFlex's hot-plane offload (the hottest 10 % of 3,072 planes) serves every page of these 32-page reads from
    # SRAM: no sensing round to amplify, so no amplification; random placement without offload has one
    assert hbflex["read_wave_amplification"] is None and alone["naive-hbf"]["read_wave_amplification"] >= 1.0
    for name in names.SYSTEMS:  # a system of a kind has its kind's keys
        kind = "dash" if name in names.DASH_SYSTEMS else "hbflex" if name in names.HBFLEX_SYSTEMS else "cpu"
        assert ("utilisation.hbf_read" in alone[name]) == (kind != "cpu"), name
        assert ("waf" in alone[name]) == (kind == "hbflex"), name

    table = tmp_path / "registry.csv"
    assert main(["sweep", "serve", *TINY, "--vary", "system=" + ",".join(names.SYSTEMS), "--vary", "seed=0,1",
                 "--out", str(table), "--quiet"]) == 0
    capsys.readouterr()
    rows = pd.read_csv(table)
    rows = rows[rows["row_kind"] == "point"]
    assert len(rows) == 2 * len(names.SYSTEMS) and set(rows["status"]) == {"ok"}
    for name, expected in alone.items():
        row = rows[(rows["system"] == name) & (rows["seed"] == 0)].iloc[0]
        present = {k for k in rows.columns if not pd.isna(row[k])}
        assert {k for k, v in expected.items() if v is not None} <= present, name
        for key in ("throughput_tokens_per_s", "tpot_ms", "p90_ttft_s", "iterations_mean"):
            assert row[key] == pytest.approx(expected[key], rel=1e-12), (name, key)


def test_serve_json_keys_and_several_systems(capsys, tmp_path):
    assert main(["serve", "--system", "dash", "relay-only", *TINY, "--json"]) == 0
    out = _json(capsys)
    assert [s["system"] for s in out["systems"]] == ["dash", "relay-only"]
    for s in out["systems"]:
        for key in ("throughput_tokens_per_s", "e2e_s", "ttft_s", "tpot_ms", "p50_e2e_s", "p90_ttft_s", "p99_tpot_ms",
                    "ci95_e2e_s", "decode_tokens_per_s", "overflow", "write_stall_s", "prefill_write_gb",
                    "writeback_gb", "mean_kv_hbm_gb", "max_kv_hbf_gb", "utilisation", "lookahead_effective"):
            assert key in s, key
        assert not s["overflow"] and s["lookahead_effective"] is True
        assert "saturated" not in s and "arrival_rate_per_s" not in s  # a fixed batch has no arrivals
        # 2 prompts × 64 tokens × Qwen3 KV (94 layers, 4 KV heads of 128, K and V, bf16) straight to HBF, none written back (budget far away)
        assert abs(s["prefill_write_gb"] - 2 * 64 * 94 * 4 * 128 * 2 * 2 * 1e-9) < 1e-9 and s["writeback_gb"] == 0.0
        assert set(s["utilisation"]) >= {"expert_direct", "expert_relay", "hbm_read", "hbf_read", "hbf_program"}
        assert all(0.0 <= u <= 1.0 + 1e-6 for u in s["utilisation"].values())
    dash, relay = out["systems"]
    assert dash["e2e_s"] <= relay["e2e_s"]
    assert relay["utilisation"]["expert_direct"] == 0.0  # RelayOnly has no Direct path
    # energy and cost per token (issue 25): the parts add up, every value's source in the header
    assert out["energy_model"]["hbf_read_pj_per_bit"] == {"value": 8.5, "source": energy.EnergyCosts.SOURCES[
        "hbf_read_pj_per_bit"]}
    for s in out["systems"]:
        parts = {k: v for k, v in s["energy_breakdown_j_per_token"].items() if not k.startswith("ci95_")}
        assert sum(parts.values()) == pytest.approx(s["energy_j_per_token"], rel=1e-9) and s["energy_j_per_token"] > 0
        assert sum(v for k, v in s["cost_breakdown_usd_per_mtoken"].items() if not k.startswith("ci95_")) == \
            pytest.approx(s["cost_usd_per_mtoken"], rel=1e-9)
        assert s["ci95_energy_j_per_token"] >= 0 and s["power_w"] > 0 and s["hbf_lifetime_years"] > 0
    # a dearer HBF read changes its energy by the bytes read × the difference, and nothing else; nor does
    # writing a timeline of RelayOnly's stream 1 (a replay by the plain-Python reference)
    path = tmp_path / "relay.json"
    assert main(["serve", "--system", "dash", "relay-only", *TINY, "--hbf-read-pj-per-bit", "30", "--json",
                 "--timeline", str(path), "--timeline-system", "relay-only", "--timeline-stream", "1"]) == 0
    dear = _json(capsys)
    assert dear["timeline"]["system"] == "relay-only" and dear["timeline"]["stream"] == 1
    trace = json.loads(path.read_text())
    assert len(trace["traceEvents"]) == dear["timeline"]["events"]
    # the replay's busy time and stalls against the engine's mean over both streams, within the float32
    # bound of test_serve_reference: a pass is a float32 sum of L·(ops + 1) + 1 terms of ≤ 16 roundings each
    family = serve.plan(build_parser().parse_args(["serve", "--system", "relay-only", *TINY]))[1][0]
    replays = [timeline.replay(family, 0, s, 0)[1] for s in (0, 1)]
    rho = (QWEN3_LAYERS * (len(reference._OP_NAMES) + 1) + 16) * 2.0**-24
    busy = sum(t.busy_us for t in replays) / 2e6
    assert relay["busy_s"] == pytest.approx(busy, rel=rho + 1e-6)
    stall_bound = 16 * 2.0**-24 * sum(t.stall_scale_us for t in replays) / 2e6
    assert abs(relay["write_stall_s"] - sum(t.write_stall_us for t in replays) / 2e6) <= stall_bound + 1e-9
    assert dear["energy_model"]["hbf_read_pj_per_bit"] == {"value": 30.0, "source": "given: --hbf-read-pj-per-bit"}
    for s, d in zip(out["systems"], dear["systems"]):
        assert d["throughput_tokens_per_s"] == s["throughput_tokens_per_s"] and d["e2e_s"] == s["e2e_s"]
        base, high = s["energy_breakdown_j_per_token"], d["energy_breakdown_j_per_token"]
        assert high["hbf_read"] == pytest.approx(base["hbf_read"] * 30 / 8.5, rel=1e-9)
        assert all(high[k] == base[k] for k in base if k not in ("hbf_read", "ci95_hbf_read"))
    assert main(["serve", "--system", "dash", *TINY, "--hbf-read-pj-per-bit", "-1"]) == 2
    # as text: the systems side by side, one column each, nested keys dotted
    assert main(["serve", "--system", "dash", "relay-only", *TINY]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["system"] == ["dash", "relay-only"] and rows["model"] == ["qwen3-235b-a22b"]
    assert [float(v) for v in rows["e2e_s"]] == pytest.approx([dash["e2e_s"], relay["e2e_s"]], rel=1e-5)
    assert float(rows["utilisation.expert_direct"][1]) == 0.0


@pytest.mark.slow  # 16 worker-seconds: make test-slow (the dash-reads family's engine runs in test_protocol)
def test_dash_reads_through_plane_collisions_cost_time_and_report_their_amplification(capsys):
    assert main(["serve", "--system", "dash", *TINY, "--json"]) == 0
    linear = _json(capsys)
    assert main(["serve", "--system", "dash", *TINY, "--reads", "planes", "--json"]) == 0
    planes = _json(capsys)
    assert planes["reads"] == "planes" and "read_wave_amplification" not in linear
    assert planes["read_wave_amplification"] >= 1.0
    assert planes["tpot_ms"] >= linear["tpot_ms"] and planes["ttft_s"] >= linear["ttft_s"]


def test_serve_online_reports_littles_law_and_saturation(capsys):
    assert main(["serve", "--rate", "2", "--requests", "24", "--warmup", "4", *ONLINE, "--json"]) == 0
    captured = capsys.readouterr()
    stable = json.loads(captured.out)
    assert captured.err == ""
    for key in ("arrival_rate_per_s", "completion_rate_per_s", "mean_requests_in_system", "saturated"):
        assert key in stable, key
    assert stable["saturated"] is False
    # L = λW over one window, by construction
    assert stable["mean_requests_in_system"] == pytest.approx(
        stable["littles_arrival_rate_per_s"] * stable["littles_time_in_system_s"], rel=1e-9)
    # far beyond capacity (the tiny model at 4 slots serves a few hundred requests/s): the queue grows
    assert main(["serve", "--rate", "100000", "--requests", "24", "--warmup", "4", *ONLINE, "--json"]) == 0
    captured = capsys.readouterr()
    flooded = json.loads(captured.out)
    assert flooded["saturated"] is True
    assert "warning: saturated: offered" in captured.err
    assert flooded["completion_rate_per_s"] < flooded["arrival_rate_per_s"]
    assert flooded["mean_requests_in_system"] == pytest.approx(
        flooded["littles_arrival_rate_per_s"] * flooded["littles_time_in_system_s"], rel=1e-9)


def test_serve_refuses_bad_and_ignored_options(capsys):
    refusals = [
        (["--rate", "2", "--requests", "8", "--warmup", "8"], "--warmup = 8: must be below --requests − 1 = 7"),
        (["--system", "dash", "dash"], "each system once"),
        (["--system", "hybrid", "--model", "llama3-8b"], "serve MoE models (llama3-8b is dense)"),
        (["--link-tbps", "0"], "--link-tbps = 0: must be in (0, 1000]"),
        (["--system", "dash", "--disable", "writeback"], "--disable = 'writeback': applies to HBFlex's organisations"),
        (["--system", "hbflex", "--concurrency", "8"], "--concurrency = 8.0: needs --trace"),
        (["--system", "dash", "--cores", "8"], "--cores = 8: applies to the CPU-offloading systems"),
        (["--warmup", "4"], "--warmup = 4: applies to open-loop online runs"),
        (["--rate", "1", "--rate-factor", "2"], "--rate-factor = 2.0: applies with --trace"),
        (["--rate", "1", "--batch", "2"], "--batch = 2: applies to a fixed batch"),
        (["--system", "hybrid", "--reads", "planes"], "--reads planes: applies to DASH's organisations"),
        (["--system", "nope"], "invalid choice: 'nope'"),
        (["--model", "deepseek-v4-pro", "--tensor-parallel", "3"],
         "--tensor-parallel = 3: deepseek-v4-pro does not split over 3 GPUs: T must divide heads = 128"),
        (["--tensor-parallel", "0"], "--tensor-parallel = 0: must be in [1, 64]"),
        (["--system", "cpu-stream", "--model", "deepseek-v3", "--tensor-parallel", "2"],
         "--tensor-parallel = 2: the CPU-offloading systems (cpu-stream)"),
    ]
    for args, message in refusals:
        assert main(["serve", *args]) == 2, args
        err = capsys.readouterr()
        assert message in err.err, (args, err.err)
        assert err.out == ""


def test_serve_replays_a_trace_with_slo_goodput(capsys, tmp_path):
    rows = [f"2023-11-16 18:17:{3 + i:02d}.0000000,{100 + 10 * i},{3 + i % 4}" for i in range(12)]
    path = tmp_path / "small.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    assert main(["serve", "--trace", str(path), "--requests", "12", "--warmup", "2", "--slots", "4",
                 "--streams", "2", "--slo-ttft-s", "1000", "--json"]) == 0
    out = _json(capsys)
    assert out["slo_attainment"] == 1.0 and out["goodput_requests_per_s"] > 0
    assert main(["serve", "--trace", str(path), "--rate", "1"]) == 2
    assert "--rate and --trace: give one" in capsys.readouterr().err


def test_serve_runs_the_cpu_offloading_baselines_beside_dash(capsys):
    assert main(["serve", "--system", "dash", "relay-only", "cpu-stream", "hybrid", *TINY, "--json"]) == 0
    out = {s["system"]: s for s in _json(capsys)["systems"]}
    assert list(out) == ["dash", "relay-only", "cpu-stream", "hybrid"]
    assert "utilisation" in out["dash"] and "utilisation" not in out["hybrid"]
    # the oracle is never slower than streaming, and both are far slower than DASH (DASH §VI-C)
    assert out["dash"]["tpot_ms"] < out["hybrid"]["tpot_ms"] <= out["cpu-stream"]["tpot_ms"]
    # their host DRAM, PCIe and CPU energy is counted (issue 25); DASH spends none there, they no HBF
    hybrid, stream, dash = (out[s]["energy_breakdown_j_per_token"] for s in ("hybrid", "cpu-stream", "dash"))
    assert hybrid["host_dram"] > 0 and hybrid["pcie"] > 0 and hybrid["hbf_read"] == 0.0
    assert stream["cpu_compute"] == 0.0 and stream["pcie"] > hybrid["pcie"]
    assert dash["host_dram"] == dash["pcie"] == dash["cpu_compute"] == 0.0 and dash["hbf_read"] > 0
    assert "5 HBM stacks" in out["hybrid"]["energy_note"] and "hbf_lifetime_years" not in out["hybrid"]
    assert "energy_note" not in out["dash"]


def test_serve_offers_a_load_relative_to_the_reference_backlogged_throughput(capsys):
    assert main(["serve", "--load", "0.5", "--load-reference", "relay-only", "--requests", "24", "--warmup", "4",
                 *ONLINE, "--json"]) == 0
    out = _json(capsys)
    assert out["load_reference"] == "relay-only" and out["reference_backlogged_requests_per_s"] > 0
    assert abs(out["offered_rate_per_s"] - 0.5 * out["reference_backlogged_requests_per_s"]) < 1e-9
    assert main(["serve", "--load", "0.5", "--rate", "1"]) == 2
    assert "--rate and --load: give one" in capsys.readouterr().err


def test_serve_hbflex_organisations_report_the_hbf_keys_and_refuse_bad_options(capsys, real_trace):
    args = ["serve", "--system", "hbflex", "naive-hbf", "--model", "deepseek-v3", "--trace",
            str(real_trace("azure_llm_2023_code.csv")),
            "--requests", "12", "--warmup", "2", "--slots", "4", "--streams", "2", "--json"]
    assert main(args) == 0
    out = _json(capsys)
    for s in out["systems"]:  # the real room: a page of the sampled planes is ≈ 3.3 KB, so the run writes pages
        assert s["host_writes"] >= 1 and s["waf"] >= 1.0 and s["stalled_plane_writes"] == 0
    assert out["gpu"] == "h200"  # HBFlex §6.1's GPU when only HBFlex organisations are served
    hbflex, naive = out["systems"]
    for s in (hbflex, naive):
        for key in ("ttft_s", "tpot_ms", "throughput_tokens_per_s", "waf", "host_writes", "read_wave_amplification",
                    "write_stall_us_per_iteration", "sram_peak_bytes", "prefix_hit_tokens_fraction", "evicted_sessions",
                    "ci95_waf", "utilisation", "write_stall_s", "saturated"):
            assert key in s, key
    assert naive["write_stall_us_per_iteration"] > hbflex["write_stall_us_per_iteration"]  # immediate vs window
    assert naive["read_wave_amplification"] > hbflex["read_wave_amplification"]  # random vs balanced + runtime
    assert main(args[:-1] + ["--disable", "writeback", "--json"]) == 0
    off = _json(capsys)["systems"][0]
    assert off["write_stall_us_per_iteration"] > 0
    assert main(args[:-1] + ["--disable", "magic"]) == 2
    assert "--disable 'magic': must be among" in capsys.readouterr().err
    tiny = args[:-1] + ["--kv-room-gb", "0.00001", "--json"]  # 10 KB: no request's KV fits
    assert main(tiny) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--kv-room-gb 1e-05: hbflex, naive-hbf overflowed" in err


def test_a_run_whose_planes_waited_for_gc_is_warned_about_on_stderr():
    result = {"systems": [{"system": "naive-hbf", "stalled_plane_writes": 3.0}, {"system": "hbflex",
                                                                                "stalled_plane_writes": 0.0}]}
    lines = warnings_of(result)
    assert len(lines) == 1 and lines[0].startswith("naive-hbf: stalled_plane_writes = 3: GC on the sampled planes")
    capped = warnings_of({"system": "naive-block", "stalled_plane_writes": 0.0, "capped_plane_writes": 2.0})
    assert len(capped) == 1 and capped[0].startswith("naive-block: capped_plane_writes = 2: chunks sent a sampled plane")


# mode -> (a load the system keeps up with, one it cannot); the light loads are per system: the CPU-streaming
# baseline serves a request of this size in ≈ 78 s (4 slots: ≈ 0.05 req/s), DASH and HBFlex hundreds a second
LIGHT = {"dash": ("2", "0.01"), "hbflex": ("2", "0.01"), "cpu-stream": ("0.005", "0.0005")}  # --rate, --rate-factor


def _saturation_modes(system: str) -> dict:
    rate, factor = LIGHT[system]
    trace = ["--trace", "azure_llm_2023_code.csv", "--requests", "24", "--warmup", "4"]
    return {"poisson": (["--rate", rate, "--requests", "24", "--warmup", "4"],
                        ["--rate", "100000", "--requests", "24", "--warmup", "4"]),
            "trace": (trace + ["--rate-factor", factor], trace + ["--rate-factor", "1000"])}


@pytest.mark.slow  # 15 serving runs, each its own compilation: make test-slow
@pytest.mark.parametrize("system", ["dash", "hbflex", "cpu-stream"])
def test_every_online_mode_and_system_kind_reports_littles_law_and_its_saturation(capsys, real_trace, system):
    """Issue 27, "saturation hidden": open-loop Poisson arrivals and trace replay, a light and a flooding load,
    and a closed loop, for one system of each kind: every run reports Little's-law terms that agree
    (L = λW over the window) and a saturated flag, set with a warning exactly when the queue grows."""
    real_trace("azure_llm_2023_code.csv")
    base = ["serve", "--system", system, "--model", "qwen3-235b-a22b", "--streams", "2", "--json"]
    lengths = ["--prompt", "64", "--output", "4"]  # a trace sets its own
    for mode, (light, flood) in _saturation_modes(system).items():
        for load, expect in ((light, False), (flood, True)):
            argv = base + ["--slots", "4"] + load + ([] if mode == "trace" else lengths)
            assert main(argv) == 0, (mode, load)
            captured = capsys.readouterr()
            r = json.loads(captured.out)
            assert r["saturated"] is expect, (system, mode, load, r["arrival_rate_per_s"], r["completion_rate_per_s"])
            assert ("warning: saturated" in captured.err) is expect, (system, mode, captured.err)
            assert r["mean_requests_in_system"] == pytest.approx(
                r["littles_arrival_rate_per_s"] * r["littles_time_in_system_s"], rel=1e-9), (system, mode)
    # a closed loop: in-flight requests never exceed the tasks, so nothing saturates
    argv = base + ["--trace", "swebench_miniswe_agent", "--tasks", "4", "--turns-per-task", "4", "--warmup-turns", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["saturated"] is False and "warning: saturated" not in captured.err
    assert r["mean_requests_in_system"] <= 4 + 1e-9
    assert r["mean_requests_in_system"] == pytest.approx(
        r["littles_arrival_rate_per_s"] * r["littles_time_in_system_s"], rel=1e-9)
