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
                    "ci95_e2e_s", "decode_tokens_per_s", "overflow"):
            assert key in s, key
        assert not s["overflow"]
    dash, relay = out["systems"]
    assert dash["e2e_s"] <= relay["e2e_s"]
    assert out["lookahead_effective"] is True


def test_serve_online_reports_littles_law_terms_and_refuses_bad_options(capsys):
    assert main(["serve", "--rate", "2", "--requests", "24", "--warmup", "4", "--prompt", "64", "--output", "4",
                 "--streams", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arrival_rate_per_s"] > 0 and out["mean_requests_in_system"] > 0
    assert main(["serve", "--rate", "2", "--requests", "8", "--warmup", "8"]) == 2
    assert "--warmup = 8: must be below --requests = 8" in capsys.readouterr().err
    assert main(["serve", "--system", "cpu-stream"]) == 2
    assert main(["serve", "--link-tbps", "0"]) == 2
    assert "--link-tbps = 0: must be in (0, 1000]" in capsys.readouterr().err
