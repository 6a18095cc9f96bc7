"""``hbfjax sweep`` and ``hbfjax plot`` end to end: rows equal separate runs, knob-only axes compile
once, a killed sweep resumes with no row lost or repeated, failed points are rows, results do not
depend on the device or process count, and a capacity search's answer agrees with its own probes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from hbfjax.cli import main
from hbfjax.sweep import runner
from hbfjax.sweep.grid import Point
from tests._compiles import compilations

from _cluster_child import child_env, free_port

ROOT = Path(__file__).resolve().parents[1]
# columns that say when and where a row was computed, not what
RUN_COLUMNS = {"call_wall_s", "call_points", "finished_utc", "device_count", "process_count"}
COLLIDE = ["collide", "--planes", "8", "--streams", "16"]
SERVE = ["--model", "mixtral-8x22b", "--requests", "24", "--warmup", "4", "--prompt", "64", "--output", "8",
         "--streams", "2"]


def _table(path) -> pd.DataFrame:
    return pd.read_csv(path).sort_values(["row_kind", "point", "key"]).reset_index(drop=True)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    columns = [c for c in a.columns if c not in RUN_COLUMNS]
    assert sorted(columns) == sorted(c for c in b.columns if c not in RUN_COLUMNS)
    pd.testing.assert_frame_equal(a[columns], b[columns], check_exact=True)


def _summary(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_collide_rows_equal_separate_runs_and_a_rerun_or_a_wider_grid_computes_only_new_points(tmp_path, capsys):
    out = str(tmp_path / "c.csv")
    sweep = ["sweep", *COLLIDE, "--vary", "pages=8,32", "--vary", "placement=random,isolated", "--out", out,
             "--quiet", "--json"]
    assert main(sweep) == 0
    assert _summary(capsys)["computed_points"] == 4
    t = _table(out)
    assert list(t["pages"]) == [8, 8, 32, 32] and list(t["placement"]) == ["random", "isolated"] * 2
    assert set(t["status"]) == {"ok"} and t["error"].isna().all()
    for column in ("hbfjax_version", "source_digest", "jax_version", "device_kind", "seed", "command", "config"):
        assert t[column].notna().all(), column
    for _, row in t.iterrows():
        assert main([*COLLIDE, "--pages", str(row["pages"]), "--placement", row["placement"], "--json"]) == 0
        alone = json.loads(capsys.readouterr().out)
        for key in ("mean_waves", "ci95_waves", "amplification", "read_time_us"):
            assert row[key] == alone[key], key
        assert json.loads(row["config"])["pages"] == row["pages"]
    assert main(sweep) == 0
    assert _summary(capsys)["computed_points"] == 0
    assert main([a if a != "pages=8,32" else "pages=8,32,64" for a in sweep]) == 0
    assert _summary(capsys)["computed_points"] == 2
    assert len(_table(out)) == 6
    _same(_table(out).iloc[[0, 1, 2, 3]].reset_index(drop=True)[t.columns], t)


def test_a_failing_point_is_a_row_with_its_error_and_the_sweep_goes_on(tmp_path, capsys):
    out = str(tmp_path / "f.csv")
    assert main(["sweep", "collide", "--streams", "4", "--vary", "planes=8,0,16", "--out", out, "--quiet"]) == 1
    t = _table(out)
    assert list(t["status"]) == ["ok", "failed", "ok"]
    assert "--planes = 0" in t["error"][1] and t["mean_waves"].notna().tolist() == [True, False, True]
    point = Point(0, (("x", "1"),), ("--x", "1"))
    row = runner.point_row("gc", point, None, {"overflow": True, "migrated_pages": 3}, None, 1.0, 1)
    assert (row["status"], row["overflow"], row["migrated_pages"]) == ("failed", True, 3)
    assert row["error"] == runner.OVERFLOW_ERROR
    row = runner.point_row("gc", point, None, {"overflow": False, "waf": 0.5}, None, 1.0, 1)  # breaks WAF >= 1
    assert row["status"] == "failed" and "result.waf = 0.5" in row["error"] and "waf" not in row


def test_bad_sweep_options_are_refused(tmp_path, capsys):
    out = str(tmp_path / "x.csv")
    assert main(["sweep", "collide", "--vary", "pages=8"]) == 2  # no --out
    assert "--out" in capsys.readouterr().err
    assert main(["sweep", "collide", "--vary", "nosuch=1", "--out", out]) == 2
    assert "no option --nosuch" in capsys.readouterr().err
    assert main(["sweep", "collide", "--capacity", "--slo", "p90_ttft_s<=1", "--out", out]) == 2
    assert "serve's arrival rate" in capsys.readouterr().err
    assert main(["sweep", "serve", "--capacity", "--slo", "p90_ttft_s<=1", "--capacity-rates", "1", "--load", "0.5",
                 "--out", out]) == 2
    assert "drop --load" in capsys.readouterr().err
    # a value outside an option's choices is refused before any point runs (not a failed row)
    assert main(["sweep", "serve", "--vary", "system=dash,nosuch", "--out", out]) == 2
    assert "--vary system=nosuch: not one of its choices (dash, " in capsys.readouterr().err
    assert not os.path.exists(out)


def test_a_toml_grid_is_the_same_sweep_as_its_command_line(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('command = "collide"\n[fixed]\nplanes = 8\nstreams = 16\n[vary]\npages = [8, 32]\n')
    assert main(["sweep", "collide", "--grid", str(grid), "--out", str(tmp_path / "a.csv"), "--quiet", "--json"]) == 0
    from_file = _summary(capsys)
    assert main(["sweep", *COLLIDE, "--vary", "pages=8,32", "--out", str(tmp_path / "b.csv"), "--quiet", "--json"]) == 0
    assert _summary(capsys)["sweep_id"] == from_file["sweep_id"]
    _same(_table(tmp_path / "a.csv").drop(columns=["command"]), _table(tmp_path / "b.csv").drop(columns=["command"]))
    assert main(["sweep", "serve", "--help"]) == 0
    assert "Options of hbfjax serve" in capsys.readouterr().out


def test_a_sweep_killed_mid_way_resumes_with_no_row_lost_or_repeated(tmp_path):
    pages = ",".join(str(p) for p in range(4, 52, 4))  # 12 points, each its own shape (one compilation each)
    command = [sys.executable, "-m", "hbfjax", "sweep", *COLLIDE, "--vary", f"pages={pages}", "--quiet"]
    whole, killed = tmp_path / "whole.csv", tmp_path / "killed.csv"
    subprocess.run(command + ["--out", str(whole)], env=child_env(), check=True, timeout=300, capture_output=True)
    child = subprocess.Popen(command + ["--out", str(killed)], env=child_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not killed.exists() or killed.read_bytes().count(b"\n") < 4):
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    rows_at_kill = killed.read_bytes().count(b"\n") - 1
    assert 3 <= rows_at_kill < 12, rows_at_kill  # killed mid-sweep
    subprocess.run(command + ["--out", str(killed)], env=child_env(), check=True, timeout=300, capture_output=True)
    resumed = _table(killed)
    assert len(resumed) == 12 and resumed["key"].is_unique
    _same(resumed, _table(whole))


@pytest.mark.slow  # 54 worker-seconds: make test-slow
def test_serve_knob_axes_compile_once_equal_single_runs_on_one_or_four_devices_and_find_capacity(tmp_path, capsys):
    grid, capacity = str(tmp_path / "grid.csv"), str(tmp_path / "cap.csv")
    sweep = ["sweep", "serve", *SERVE, "--rate", "4", "--vary", "system=dash,relay-only", "--vary", "t-read-us=2,8",
             "--per-stream", "--quiet"]
    with compilations("simulate") as compiled:
        assert main([*sweep, "--out", grid]) == 0
        assert main(["sweep", "serve", *SERVE, "--system", "dash", "relay-only", "--capacity", "--slo",
                     "p90_ttft_s<=0.2", "--capacity-rates", "2,8", "--refine-rounds", "2", "--refine-points", "2",
                     "--out", capacity, "--quiet"]) == 0
    assert len(compiled) == 1, compiled  # four organisation × tR points and every probed rate: one program
    capsys.readouterr()
    everything = _table(grid)
    t = everything[everything["row_kind"] == "point"].reset_index(drop=True)
    assert list(zip(t["system"], t["t_read_us"])) == [("dash", 2), ("dash", 8), ("relay-only", 2), ("relay-only", 8)]
    streams = everything[everything["row_kind"] == "stream"]
    assert len(streams) == 4 * 2 and set(streams["stream"]) == {0, 1}
    for point, rows in streams.groupby("point"):  # a point's value is the mean of its streams'
        assert rows["p90_ttft_s"].mean() == pytest.approx(t["p90_ttft_s"][point], rel=1e-12)
    assert main(["serve", *SERVE, "--rate", "4", "--system", "relay-only", "--t-read-us", "8", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    for key in ("p90_ttft_s", "ci95_p90_ttft_s", "throughput_tokens_per_s", "iterations_mean"):
        assert t[key][3] == alone[key], key
    # the stream axis sharded over 4 devices (2 streams padded to 4): the same rows
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    subprocess.run([sys.executable, "-m", "hbfjax", *sweep, "--out", str(tmp_path / "four.csv")], check=True,
                   env=child_env(XLA_FLAGS=flags.strip()), timeout=300, capture_output=True)
    four = _table(tmp_path / "four.csv")
    assert set(four["device_count"].dropna()) == {4} and set(t["device_count"]) == {1}
    _same(everything, four)
    c = pd.read_csv(capacity)
    probes, answers = c[c["row_kind"] == "probe"], c[c["row_kind"] == "capacity"]
    assert list(answers["system"]) == ["dash", "relay-only"]
    for _, answer in answers.iterrows():
        mine = probes[probes["system"] == answer["system"]]
        meets = (mine["p90_ttft_s"] <= 0.2) & ~mine["saturated"].astype(bool)  # a saturated probe is a miss
        holds = mine[meets]["rate"]
        assert answer["probes"] == len(mine) and set(mine["capacity_round"]) <= {0, 1, 2}
        if answer["capacity_status"] == "bracketed":
            miss = answer["capacity_first_miss_rate_per_s"]
            assert meets[mine["rate"] < miss].all()
            assert answer["capacity_rate_per_s"] == holds[holds < miss].max()
            assert not meets[mine["rate"] == miss].iloc[0]
            assert answer["capacity_lo_rate_per_s"] <= answer["capacity_rate_per_s"] <= answer["capacity_hi_rate_per_s"]
    assert main(["plot", capacity, "--kind", "probe", "--x", "rate", "--y", "p90_ttft_s", "--hue", "system",
                 "--logx", "--out", str(tmp_path / "probe.png")]) == 0
    assert (tmp_path / "probe.png").stat().st_size > 0
    assert main(["plot", grid, "--x", "t_read_us", "--y", "nosuch", "--out", str(tmp_path / "x.png")]) == 2
    assert "no such column" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["--points-per-call=0"])
def test_points_per_call_is_validated(bad, capsys, tmp_path):
    assert main(["sweep", "collide", bad, "--vary", "pages=8", "--out", str(tmp_path / "x.csv")]) == 2


def test_two_processes_write_the_table_one_process_writes(tmp_path):
    """Points shared round robin between two processes on 127.0.0.1 (3 and 2 of 5, each its own shape);
    process 0 gathers the rows into the one table."""
    command = [sys.executable, "-m", "hbfjax", "sweep", *COLLIDE, "--vary", "pages=8,16,24,32,40", "--quiet", "--json"]
    subprocess.run(command + ["--out", str(tmp_path / "one.csv")], env=child_env(), check=True, timeout=300,
                   capture_output=True)
    port = free_port()
    children = [subprocess.Popen(command + ["--out", str(tmp_path / f"two-{k}.csv"), "--coordinator",
                                            f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(k)],
                                 env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for k in (0, 1)]
    try:
        outputs = [c.communicate(timeout=180) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
    assert [c.returncode for c in children] == [0, 0], [err[-2000:] for _, err in outputs]
    assert json.loads(outputs[0][0].decode().strip().splitlines()[-1])["computed_points"] == 5
    assert outputs[1][0] == b"" and not (tmp_path / "two-1.csv").exists()  # only process 0 writes
    two = _table(tmp_path / "two-0.csv")
    assert set(two["process_count"]) == {2}
    _same(_table(tmp_path / "one.csv"), two)
