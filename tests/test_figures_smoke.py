"""Every figure module end to end at the tiny size (``python -m experiments --tiny``), so a figure that would
crash fails ``make test-slow`` (``make test`` runs only the quick checks here; see :class:`_FigureGroup`):
on the real traces where they are found, else on small files of each schema written here under the real
trace names. One child process per group of figures (:data:`GROUPS`, about
equal time, a test class each, so that pytest-xdist schedules them apart); a group keeps the figures whose
tiny runs share an engine shape (one compilation: ``experiments/__main__`` keeps compiled executables at
the tiny size). Budget: about a minute per group on a 2-core CPU (compiling dominates at this size: see
:data:`CHILD_XLA_FLAGS`)."""

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from experiments.__main__ import figure_modules, main
from hbfjax import traces

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("azure_llm_2023_code.csv", "mooncake_conversation.jsonl", "swebench_miniswe_agent.csv")
# Figures per child process (seconds at the tiny size in brackets, one process, 2-core CPU). Figures that
# share a tiny engine shape stay together: the DASH serving figures 9(a), 9(b) and 11 (_dash_serve.TINY_*),
# Table III and the lifetime (one backlogged shape), Fig. 15, 16 and Table 2 (bootstrap replay).
# The child compiles far more than it runs: LLVM's backend optimisation off (as tests/conftest.py), and XLA:CPU's
# elemental emitters instead of its fusion emitters, which compile the tiny figures' programs about twice as
# fast and run them slower (measured per group alone: tuning 73 -> 59 s, DASH 53 -> 47 s, HBFlex 63 -> 63 s;
# not in the test processes, where long rollouts run: there it was no faster overall)
CHILD_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
GROUPS = {
    "dash": ("dash10_offload", "dash11_lookahead", "dash12_sensitivity", "dash12_write_latency",
             "dash9a_throughput", "dash9b_workloads", "dash_consistency", "dash_cost", "dash_lifetime", "dash_table3_p90", "energy_cost", "hbf_parts_tr",
             "read_reclaim"),
    "hbflex": ("hbflex13c_decode_tokens", "hbflex15_latency", "hbflex15_closed", "hbflex16_concurrency", "hbflex17_read_amplification",
               "hbflex18_stall", "hbflex19_waf", "hbflex20_offload", "hbflex5_imbalance", "hbflex7a_logical_page",
               "hbflex9_stages", "hbflex_table2_ablation"),
    "tune": ("gc_waf_spare", "tune_collide_gc", "tune_collide_sram", "tune_dash_split", "tune_hbflex_sram"),
}


def write_small_traces(folder: Path, seed: int = 0) -> Path:
    """Small traces under the real names: Azure CSV, Mooncake JSONL, SWE-bench as per-session JSONL files."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = datetime(2023, 11, 16, 18, 17, 3)
    stamps = np.cumsum(rng.exponential(0.4, 200))
    rows = [f"{(t0 + timedelta(seconds=float(s))).strftime('%Y-%m-%d %H:%M:%S.%f')}0,{rng.integers(1, 8000)},"
            f"{rng.integers(1, 500)}" for s in stamps]
    (folder / NAMES[0]).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n" + "\r\n".join(rows) + "\r\n")
    lines = []
    for ms in np.cumsum(rng.integers(0, 800, 200)):
        n = int(rng.integers(100, 20000))
        blocks = -(-n // 512)
        shared = min(blocks, int(rng.integers(0, 4)))  # leading blocks common to many prompts
        ids = list(range(shared)) + [int(x) for x in rng.integers(10, 10**6, blocks - shared)]
        lines.append(json.dumps({"timestamp": int(ms), "input_length": n, "output_length": int(rng.integers(1, 500)),
                                 "hash_ids": ids}))
    (folder / NAMES[1]).write_text("\n".join(lines) + "\n")
    sessions = folder / "swebench_miniswe_agent"
    sessions.mkdir(exist_ok=True)
    for s in range(4):
        sid, prompt, t_us = f"session{s}", "system prompt " * 300, 1_760_000_000_000_000 + s * 5_000_000
        with open(sessions / f"{sid}.jsonl", "w", encoding="utf-8") as fh:
            for _ in range(10):
                output = "command " * int(rng.integers(10, 200))
                fh.write(json.dumps({"timestamp": t_us, "input": prompt, "output": output, "session_id": sid}) + "\n")
                prompt += output + "observation " * int(rng.integers(10, 400))
                t_us += int(rng.integers(500_000, 3_000_000))
    return folder


def _real_traces_present() -> bool:
    try:
        return all(traces.resolve(n) for n in NAMES)
    except traces.TraceMissing:
        return False


def test_small_traces_load_in_their_schemas(tmp_path):
    folder = write_small_traces(tmp_path)
    azure, moon, swe = (traces.load_trace(folder / n) for n in (NAMES[0], NAMES[1], "swebench_miniswe_agent"))
    assert (len(azure), len(moon), len(swe)) == (200, 200, 40)
    assert len(np.unique(swe.session)) == 4 and np.sum(swe.parent >= 0) == 36
    assert (swe.prefix_tokens[swe.parent >= 0] > 0).all() and (swe.prefix_tokens[swe.parent < 0] == 0).all()
    assert moon.prefix_tokens.max() > 0


def _run_group(group: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + CHILD_XLA_FLAGS).strip(), "MPLBACKEND": "Agg"}
    if not _real_traces_present():
        env["HBFJAX_TRACE_DIR"] = str(write_small_traces(tmp_path / "traces"))
    out = tmp_path / "figures"
    run = subprocess.run([sys.executable, "-m", "experiments", "--tiny", "--force", "--streams", "2", "--out", str(out),
                          "--only", *GROUPS[group]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "skipped" not in run.stderr
    readme = (out / "README.md").read_text()
    modules = figure_modules()
    for name in GROUPS[group]:
        for suffix in (".png", ".csv", ".paper.json"):
            assert (out / f"{name}{suffix}").stat().st_size > 0, f"{name}{suffix}"
        assert json.loads((out / f"{name}.params.json").read_text())["tiny"] is True
        assert f"## {modules[name].TITLE}" in readme


class _FigureGroup:
    """One child process per group: a class each, so that pytest-xdist (``--dist loadscope``, pyproject.toml)
    schedules the groups as units of their own.

    Marked slow (``make test-slow``; 218 of ``make test``'s 1,156 worker-seconds): in ``make test`` the
    figures are held by ``python -m experiments --check`` instead, which fails a change to any source in a
    figure's import closure until that figure is regenerated, and regenerating runs it at full size. What
    only these runs catch is a figure broken by something outside the package (a library upgrade, a trace
    file of another schema): run them after such a change."""

    group = ""

    @pytest.mark.slow
    def test_every_figure_runs_end_to_end_at_the_tiny_size(self, tmp_path):
        _run_group(self.group, tmp_path)


class TestDashFigures(_FigureGroup):
    group = "dash"


class TestHbflexFigures(_FigureGroup):
    group = "hbflex"


class TestTuningFigures(_FigureGroup):
    group = "tune"


def test_the_groups_hold_every_figure_exactly_once():
    listed = [name for group in GROUPS.values() for name in group]
    assert sorted(listed) == sorted(figure_modules()) and len(set(listed)) == len(listed)
    assert sorted(c.group for c in _FigureGroup.__subclasses__()) == sorted(GROUPS)


def test_a_figure_without_its_trace_is_skipped_with_one_line(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "nowhere"
    monkeypatch.setattr(traces, "search_path", lambda: [empty])
    out = tmp_path / "figures"
    assert main(["--tiny", "--force", "--only", "hbflex13c_decode_tokens", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert skipped == [f"[figures] hbflex13c_decode_tokens: skipped, trace 'swebench_miniswe_agent.csv' not found "
                       f"(looked in {empty}); get it with: hbfjax traces fetch swebench_miniswe_agent"]
    readme = (out / "README.md").read_text()
    assert "**Not made in this run**: trace 'swebench_miniswe_agent.csv' not found" in readme
    assert not (out / "hbflex13c_decode_tokens.png").exists()
