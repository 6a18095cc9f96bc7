"""`hbfjax serve` end to end: the documented JSON keys, several systems in one run, clean refusals."""

import json

from hbfjax.cli import main


def test_serve_json_keys_and_several_systems(capsys):
    args = ["serve", "--system", "dash", "relay-only", "--batch", "2", "--prompt", "64", "--output", "4",
            "--streams", "2", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["system"] for s in out["systems"]] == ["dash", "relay-only"]
    for s in out["systems"]:
        for key in ("throughput_tokens_per_s", "e2e_s", "ttft_s", "tpot_ms", "p50_e2e_s", "p90_ttft_s", "p99_tpot_ms",
                    "ci95_e2e_s", "decode_tokens_per_s", "overflow", "write_stall_s", "prefill_write_gb",
                    "writeback_gb", "mean_kv_hbm_gb", "max_kv_hbf_gb", "utilisation"):
            assert key in s, key
        assert not s["overflow"]
        # 2 prompts × 64 tokens × Qwen3 KV (94 layers, 4 KV heads of 128, K and V, bf16) straight to HBF, none written back (budget far away)
        assert abs(s["prefill_write_gb"] - 2 * 64 * 94 * 4 * 128 * 2 * 2 * 1e-9) < 1e-9 and s["writeback_gb"] == 0.0
        assert set(s["utilisation"]) >= {"expert_direct", "expert_relay", "hbm_read", "hbf_read", "hbf_program"}
        assert all(0.0 <= u <= 1.0 + 1e-6 for u in s["utilisation"].values())
    dash, relay = out["systems"]
    assert dash["e2e_s"] <= relay["e2e_s"]
    assert relay["utilisation"]["expert_direct"] == 0.0  # RelayOnly has no Direct path
    assert out["lookahead_effective"] is True


def test_serve_online_reports_littles_law_terms_and_refuses_bad_options(capsys):
    # the online run of the --load test below (4 slots): one compilation for both in a process
    assert main(["serve", "--rate", "2", "--requests", "24", "--warmup", "4", "--prompt", "64", "--output", "4",
                 "--slots", "4", "--streams", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arrival_rate_per_s"] > 0 and out["mean_requests_in_system"] > 0
    assert main(["serve", "--rate", "2", "--requests", "8", "--warmup", "8"]) == 2
    assert "--warmup = 8: must be below --requests = 8" in capsys.readouterr().err
    assert main(["serve", "--system", "dash", "dash"]) == 2
    assert "each system once" in capsys.readouterr().err
    assert main(["serve", "--system", "hybrid", "--model", "llama3-8b"]) == 2
    assert "serve MoE models (llama3-8b is dense)" in capsys.readouterr().err
    assert main(["serve", "--link-tbps", "0"]) == 2
    assert "--link-tbps = 0: must be in (0, 1000]" in capsys.readouterr().err


def test_serve_replays_a_trace_with_slo_goodput(capsys, tmp_path):
    rows = [f"2023-11-16 18:17:{3 + i:02d}.0000000,{100 + 10 * i},{3 + i % 4}" for i in range(12)]
    path = tmp_path / "small.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    assert main(["serve", "--trace", str(path), "--requests", "12", "--warmup", "2", "--slots", "4",
                 "--streams", "2", "--slo-ttft-s", "1000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["slo_attainment"] == 1.0 and out["goodput_requests_per_s"] > 0
    assert main(["serve", "--trace", str(path), "--rate", "1"]) == 2
    assert "--rate and --trace: give one" in capsys.readouterr().err


def test_serve_runs_the_cpu_offloading_baselines_beside_dash(capsys):
    # DASH and RelayOnly on the first test's fixed batch: its compilation, in a process that ran it
    assert main(["serve", "--system", "dash", "relay-only", "cpu-stream", "hybrid", "--batch", "2", "--prompt", "64",
                 "--output", "4", "--streams", "2", "--json"]) == 0
    out = {s["system"]: s for s in json.loads(capsys.readouterr().out)["systems"]}
    assert list(out) == ["dash", "relay-only", "cpu-stream", "hybrid"]
    assert "utilisation" in out["dash"] and "utilisation" not in out["hybrid"]
    # the oracle is never slower than streaming, and both are far slower than DASH (DASH §VI-C)
    assert out["dash"]["tpot_ms"] < out["hybrid"]["tpot_ms"] <= out["cpu-stream"]["tpot_ms"]


def test_serve_offers_a_load_relative_to_the_reference_backlogged_throughput(capsys):
    assert main(["serve", "--load", "0.5", "--load-reference", "relay-only", "--requests", "24", "--warmup", "4",
                 "--prompt", "64", "--output", "4", "--slots", "4", "--streams", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["load_reference"] == "relay-only" and out["reference_backlogged_requests_per_s"] > 0
    assert abs(out["offered_rate_per_s"] - 0.5 * out["reference_backlogged_requests_per_s"]) < 1e-9
    assert main(["serve", "--load", "0.5", "--rate", "1"]) == 2
    assert "--rate and --load: give one" in capsys.readouterr().err


def test_serve_hbflex_organisations_report_the_hbf_keys_and_refuse_bad_options(capsys, real_trace):
    args = ["serve", "--system", "hbflex", "naive-hbf", "--model", "deepseek-v3", "--trace",
            str(real_trace("azure_llm_2023_code.csv")),
            "--requests", "12", "--warmup", "2", "--slots", "4", "--streams", "2", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] == "h200"  # HBFlex §6.1's GPU when only HBFlex organisations are served
    hbflex, naive = out["systems"]
    for s in (hbflex, naive):
        for key in ("ttft_s", "tpot_ms", "throughput_tokens_per_s", "waf", "read_wave_amplification",
                    "write_stall_us_per_iteration", "sram_peak_bytes", "prefix_hit_tokens_fraction", "evicted_sessions",
                    "ci95_waf", "utilisation", "write_stall_s"):
            assert key in s, key
    assert naive["write_stall_us_per_iteration"] > hbflex["write_stall_us_per_iteration"]  # immediate vs window
    assert naive["read_wave_amplification"] > hbflex["read_wave_amplification"]  # random vs balanced + runtime
    assert main(args[:-1] + ["--disable", "writeback", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)["systems"][0]
    assert off["write_stall_us_per_iteration"] > 0
    assert main(["serve", "--system", "dash", "--disable", "writeback"]) == 2
    assert "--disable/--kv-room-gb: apply to the HBFlex organisations" in capsys.readouterr().err
    assert main(["serve", "--system", "hbflex", "--concurrency", "8"]) == 2
    assert "--concurrency: needs --trace" in capsys.readouterr().err
    assert main(args[:-1] + ["--disable", "magic"]) == 2
    assert "--disable 'magic': must be among" in capsys.readouterr().err
