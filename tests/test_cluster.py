"""hbfjax.cluster: the one-process path by hand, refusals, and a real two-process job on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hbfjax import cluster
from hbfjax.cluster import Cluster
from hbfjax.validate import ConfigError

import _cluster_child as child

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("_cluster_child.py")
TIMEOUT_S = 60  # per job: a hung collective fails the test instead of blocking CI


@pytest.fixture
def clean_env(monkeypatch):
    for name in cluster.ENV.values():
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cluster.add_cluster_args(parser)
    return parser.parse_args(argv)


def test_share_deals_items_round_robin():
    shares = [cluster.share(Cluster(p, 3, "h:1"), 8) for p in range(3)]
    assert shares == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert cluster.share(Cluster(2, 3, "h:1"), 2) == []
    assert cluster.share(Cluster(0, 1, None), 4) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match=r"share.n_items = -1: must be in \[0, "):
        cluster.share(Cluster(0, 1, None), -1)


def test_one_process_broadcast_and_gather_return_the_value():
    one = Cluster(0, 1, None)
    value = {"done": [[0, "a"], [3, "b"]], "x": 1.5, "none": None}
    assert cluster.broadcast(one, value) == value
    assert cluster.gather(one, value) == [value]
    assert one.is_leader
    # the same JSON round trip as with several processes: a tuple arrives as a list, NumPy is refused
    assert cluster.gather(one, (1, 2)) == [[1, 2]]
    with pytest.raises(TypeError):
        cluster.broadcast(one, np.float32(1))


def test_no_settings_is_one_process(clean_env):
    assert cluster.connect(argparse.Namespace()) == Cluster(0, 1, None)
    assert cluster.connect(parse([])) == Cluster(0, 1, None)
    assert cluster.connect(parse(["--coordinator", "h:1", "--num-processes", "1", "--process-id", "0"])) \
        == Cluster(0, 1, None)


@pytest.mark.parametrize("argv, env, message", [
    (["--num-processes", "2"], {}, r"^--num-processes = 2: several processes need --coordinator"),
    (["--process-id", "1"], {}, r"^--process-id = 1: a process id other than 0 needs --coordinator"),
    (["--coordinator", "host0"], {}, r"^--coordinator = 'host0': must be HOST:PORT"),
    (["--coordinator", "host0:65536", "--num-processes", "2"], {}, r"port in \[1, 65535\]"),
    (["--coordinator", "host0:1234"], {}, r"^--coordinator = 'host0:1234': needs --num-processes"),
    (["--coordinator", "host0:1234", "--num-processes", "2"], {}, r"needs --process-id"),
    (["--coordinator", "host0:1234", "--num-processes", "2", "--process-id", "2"], {},
     r"^--process-id = 2: must be in \[0, 1\] \(--num-processes = 2\)"),
    ([], {"JAX_NUM_PROCESSES": "2"}, r"^JAX_NUM_PROCESSES = 2: several processes need --coordinator"),
    ([], {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "x"},
     r"^JAX_PROCESS_ID = 'x': must be an integer"),
    (["--process-id", "3"], {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "3"},
     r"^--process-id = 3: must be in \[0, 2\] \(JAX_NUM_PROCESSES = 3\)"),
])
def test_inconsistent_settings_are_refused(clean_env, argv, env, message):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        cluster.connect(parse(argv))


def test_options_check_their_range_and_help_names_the_environment(capsys):
    with pytest.raises(SystemExit):
        parse(["--num-processes", "0"])
    assert "--num-processes: 0: must be in [1, " in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    cluster.add_cluster_args(parser)
    text = " ".join(parser.format_help().split())
    for needed in ("many hosts", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                   "SLURM / Open MPI, --coordinator auto"):
        assert needed in text


@pytest.mark.parametrize("fields, message", [
    ((2, 2, "h:1"), r"Cluster.process_id = 2: must be in \[0, 1\]"),
    ((0, 2, None), r"Cluster.coordinator = None: several processes need"),
    ((0, 0, None), r"Cluster.process_count = 0: must be in \[1, "),
])
def test_cluster_refuses_impossible_places(fields, message):
    with pytest.raises(ConfigError, match=message):
        Cluster(*fields)


def _run_together(tmp_path: Path, jobs: list[tuple[list[str], dict[str, str]]]) -> list[list[str]]:
    """Start every ``(argv, env)`` child at once; their stdout lines once all exit 0 (killed at the timeout)."""
    procs, logs = [], []
    try:
        for k, (argv, env) in enumerate(jobs):
            out, err = (open(tmp_path / f"{k}.{name}", "w+") for name in ("out", "err"))
            logs.append((out, err))
            procs.append(subprocess.Popen([sys.executable, str(CHILD), *argv], env=env, stdout=out, stderr=err))
        deadline = time.monotonic() + TIMEOUT_S
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = []
    for p, (out, err) in zip(procs, logs):
        out.seek(0), err.seek(0)
        assert p.returncode == 0, err.read()[-3000:]
        lines.append(out.read().splitlines())
        out.close(), err.close()
    return lines


def test_two_processes_gather_what_one_process_computes(tmp_path):
    n_items, port = 5, child.free_port()
    leader = (["job", str(n_items), "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
               "--process-id", "0"], child.child_env())
    other = (["job", str(n_items)], child.child_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                               JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1"))  # from the environment
    lines = _run_together(tmp_path, [leader, other])
    assert [len(out) for out in lines] == [1, 1]  # stdout is the JSON line alone (gloo's banner goes to stderr)
    first, second = (json.loads(out[0]) for out in lines)

    alone = child.job(Cluster(0, 1, None), n_items)
    by_hand = [[i, sum(k * k for k in range(i + 3))] for i in range(n_items)]
    assert alone["rounds"][0] == [by_hand]
    per_process = first["rounds"][0]
    assert per_process == [[by_hand[0], by_hand[2], by_hand[4]], [by_hand[1], by_hand[3]]]  # 3 rows, then 2
    assert sorted(row for rows in per_process for row in rows) == alone["rounds"][0][0]
    assert first["rounds"][1:] == [["x", "x" * 300], [{"process": 0, "empty": []}, {"process": 1, "empty": []}]]
    assert second["rounds"] == [None, None, None]
    assert (first["process_id"], second["process_id"], first["process_count"]) == (0, 1, 2)
    assert first["broadcast"] == second["broadcast"] == alone["broadcast"] == {"from": 0, "done": [[1, "a"], [2, "b"]]}


def test_connect_refuses_after_jax_started_and_auto_outside_a_job(tmp_path):
    late, auto = (json.loads(out[-1])["error"]
                  for out in _run_together(tmp_path, [(["late"], child.child_env()), (["auto"], child.child_env())]))
    assert late.startswith("RuntimeError: jax.distributed.initialize() must be called before any JAX calls")
    assert auto.startswith("ConfigError: --coordinator = 'auto':")
    assert "No SLURM or Open MPI job detected" in auto
