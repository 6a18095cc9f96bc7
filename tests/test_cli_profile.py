"""``hbfjax profile``: the --quick CSV (schema, device, every operator kind, readable by the timing)
and its errors."""

from __future__ import annotations

import csv
import json
import time

import jax
import pytest

from hbfjax.cli import main
from hbfjax.workload import profile_table as pt
from hbfjax.workload import profiler


def test_quick_profile_writes_the_schema_for_this_device(tmp_path, capsys):
    out = tmp_path / "quick.csv"
    t0 = time.perf_counter()
    assert main(["profile", "--quick", "--out", str(out), "--repeats", "2", "--json"]) == 0
    elapsed = time.perf_counter() - t0
    summary = json.loads(capsys.readouterr().out)
    with open(out, newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == pt.FIELDS
        rows = list(reader)
    assert summary["rows"] == len(rows) and summary["shapes"] == len(profiler.quick_shapes())
    assert {r["device"] for r in rows} == {jax.devices()[0].device_kind}
    assert {r["jax_version"] for r in rows} == {jax.__version__}
    assert {r["op"] for r in rows} == {"qkv_proj", "out_proj", "experts", "norm", "attention_decode",
                                       "attention_prefill"}
    gemm_tokens = sorted({int(r["tokens"]) for r in rows if r["op"] == "qkv_proj"})
    assert gemm_tokens == list(profiler.QUICK_TOKENS)
    decode = sorted(int(r["context"]) for r in rows if r["op"] == "attention_decode")
    assert decode == list(profiler.QUICK_CONTEXTS)
    assert all(float(r["us"]) > 0 and r["repeats"] == "2" for r in rows)
    table = pt.ProfileTable.read(out)
    key = ("linear", "qkv_proj", 256, 512, "bf16")
    first = next(float(r["us"]) for r in rows if r["op"] == "qkv_proj" and r["tokens"] == "1")
    assert table.interpolate_us(key, 1) == pytest.approx(first, rel=1e-9)
    with pytest.raises(pt.ProfileRangeError):
        table.interpolate_us(key, 2 * max(profiler.QUICK_TOKENS))
    assert elapsed < 30.0


def test_profile_needs_a_model_or_quick(tmp_path, capsys):
    assert main(["profile", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--model = None" in capsys.readouterr().err
    assert main(["profile", "--quick", "--repeats", "0", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--repeats = 0" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_help_explains_units(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    text = capsys.readouterr().out
    assert "microseconds" in text and "tokens" in text and "block_until_ready" in text
