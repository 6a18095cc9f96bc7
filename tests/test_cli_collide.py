import json

import pytest

from hbfjax.cli import main

REQUIRED = {"planes", "pages", "streams", "mean_waves", "ci95_waves", "ideal_waves", "amplification",
            "max_to_avg_load", "sram_bytes"}


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_collide_json_has_the_stable_keys(capsys):
    out = _json(capsys, ["collide", "--planes", "64", "--pages", "64", "--placement", "random", "--streams", "500",
                         "--json"])
    assert REQUIRED <= set(out)
    assert out["ideal_waves"] == 1 and out["mean_waves"] == pytest.approx(out["amplification"])


def test_collide_preset_takes_planes_from_hardware(capsys):
    out = _json(capsys, ["collide", "--preset", "dash", "--pages", "4096", "--streams", "8", "--json"])
    assert out["planes"] == 4096  # 2 × 16 × 32 × 4 subarrays


def test_collide_attention_form_runs_a_trace(capsys, real_trace):
    out = _json(capsys, ["collide", "--workload", "attention", "--planes", "256", "--trace",
                         str(real_trace("azure_llm_2023_code.csv")), "--slots", "8", "--max-context-tokens", "2048",
                         "--chunk-tokens", "128", "--placement", "plane-group", "--group-size", "16",
                         "--offload-fraction", "0.1", "--streams", "4", "--json"])
    assert REQUIRED <= set(out) and out["amplification"] >= 1 and out["requests_simulated"] > 0


def test_bad_group_size_is_a_clear_error(capsys):
    assert main(["collide", "--planes", "3072", "--placement", "plane-group", "--group-size", "100"]) == 2
    assert "group_size = 100" in capsys.readouterr().err


def test_help_explains_units(capsys):
    with pytest.raises(SystemExit):
        main(["collide", "--help"])
    text = capsys.readouterr().out
    assert "tR" in text and "KiB" in text and "tokens" in text
