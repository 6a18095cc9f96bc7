"""`hbfjax models`: the JSON keys the issue names, every preset, and clean refusals."""

import json

from hbfjax.cli import main
from hbfjax.workload import models


def test_models_json_lists_every_preset_with_totals_and_sources(capsys):
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(models.PRESETS)
    for r in rows:
        for key in ("name", "layers", "weight_bytes", "expert_weight_bytes", "kv_bytes_per_token", "estimated_fields",
                    "sources"):
            assert key in r, (r["name"], key)
        assert r["weight_bytes"] == models.preset(r["name"]).weight_bytes
        assert r["sources"], r["name"]
    names = {r["name"] for r in rows}
    assert {"qwen3-235b-a22b", "mixtral-8x22b", "grok-1", "llama4-maverick", "deepseek-v3", "deepseek-v2",
            "deepseek-v4-pro", "hunyuan"} <= names


def test_models_kv_precision_and_refusals(capsys):
    assert main(["models", "deepseek-v3", "--kv-bytes-per-element", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kv_bytes_per_token"] == 35136
    assert main(["models", "gpt-5"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["models", "--kv-bytes-per-element", "0"]) == 2
    assert "--kv-bytes-per-element = 0: must be in (0, 8]" in capsys.readouterr().err
