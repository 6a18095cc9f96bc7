"""Per-table source digests (``provenance.import_closure`` / ``closure_digest``) and ``python -m experiments
--check``: the closure follows a figure module's imports and nothing else, its digest moves only with a file
in it, and the check names each stale table without computing it. No JAX compilation."""

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from experiments import __main__ as cli
from experiments.common import Context, cached_table
from hbfjax import provenance
from hbfjax.traces import TraceMissing


def _posix(paths) -> set[str]:
    return {p.as_posix() for p in paths}


def test_closure_of_a_physics_figure_is_its_imports_and_not_the_serving_engine():
    closure = _posix(provenance.import_closure("experiments.fig_hbflex5_imbalance"))
    for path in ("experiments/fig_hbflex5_imbalance.py", "experiments/_hbflex_models.py", "experiments/common.py",
                 "experiments/__init__.py", "hbfjax/__init__.py", "hbfjax/hardware.py", "hbfjax/traces.py",
                 "hbfjax/flash/__init__.py", "hbfjax/flash/reads/__init__.py", "hbfjax/flash/reads/workingset.py",
                 "hbfjax/provenance.py"):  # direct imports, enclosing packages, and common's own import
        assert path in closure, path
    assert not [p for p in closure if p.startswith("hbfjax/serve/")]
    assert not {"experiments/__main__.py", "experiments/_dash_serve.py", "experiments/fig_gc_waf_spare.py"} & closure


def test_closure_follows_import_module_of_an_fstring_to_every_module_of_its_package():
    closure = _posix(provenance.import_closure("experiments.fig_tune_dash_split"))
    problems = Path(provenance.ROOT, "hbfjax/tune/problems")
    assert {f"hbfjax/tune/problems/{p.name}" for p in problems.glob("*.py")} <= closure


FAKE_TREE = {
    "hbfjax/__init__.py": '"""fake"""\n',
    "hbfjax/a.py": "import numpy as np\n\ndef f():\n    from hbfjax import b  # inside a function\n    return b\n",
    "hbfjax/b.py": "X = 1\n",
    "hbfjax/unrelated.py": "Y = 2\n",
    "hbfjax/pkg/__init__.py": "",
    "hbfjax/pkg/sub.py": "from . import leaf\n",
    "hbfjax/pkg/leaf.py": "Z = 3\n",
    "hbfjax/pkg/other.py": "W = 4\n",
    "hbfjax/reg/__init__.py": ('import importlib\n\n\ndef make(n):\n'
                               '    return importlib.import_module(f"hbfjax.reg.{n}")\n'),
    "hbfjax/reg/one.py": "",
    "experiments/__init__.py": "",
    "experiments/_helpers.py": "from hbfjax.a import f\n",
    "experiments/fig_x.py": ("import os\nfrom hbfjax.pkg import sub\nfrom hbfjax import reg\n"
                             "from ._helpers import f\nfrom experiments._helpers import *\n"),
}


@pytest.fixture
def fake_root(tmp_path):
    for rel, text in FAKE_TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    provenance.clear_closure_caches()
    yield tmp_path
    provenance.clear_closure_caches()


def test_closure_of_a_fake_tree(fake_root):
    assert _posix(provenance.import_closure("experiments.fig_x", fake_root)) == {
        "experiments/__init__.py", "experiments/fig_x.py", "experiments/_helpers.py", "hbfjax/__init__.py",
        "hbfjax/a.py", "hbfjax/b.py", "hbfjax/pkg/__init__.py", "hbfjax/pkg/sub.py", "hbfjax/pkg/leaf.py",
        "hbfjax/reg/__init__.py", "hbfjax/reg/one.py"}
    with pytest.raises(ModuleNotFoundError, match="experiments.fig_none"):
        provenance.import_closure("experiments.fig_none", fake_root)


def test_closure_digest_moves_with_a_file_in_the_closure_only(fake_root):
    def digest():
        provenance.clear_closure_caches()
        return provenance.closure_digest("experiments.fig_x", fake_root)

    before, files_before = digest(), provenance.closure_file_digests("experiments.fig_x", fake_root)
    (fake_root / "hbfjax/unrelated.py").write_text("Y = 3\n")
    (fake_root / "hbfjax/pkg/other.py").write_text("W = 5\n")
    assert digest() == before
    (fake_root / "hbfjax/b.py").write_text("X = 2\n")
    changed = digest()
    assert changed != before
    files = provenance.closure_file_digests("experiments.fig_x", fake_root)
    assert [f for f in files if files[f] != files_before[f]] == ["hbfjax/b.py"]
    (fake_root / "hbfjax/reg/two.py").write_text("")  # a new module the dynamic import may load
    assert digest() != changed


# A fake figure: one table keyed by the closure of experiments.common (a real module that the check needs, small)
def _fake_figure(params: dict, name: str = "fake", computed: list | None = None):
    def compute():
        if computed is None:
            raise AssertionError("check mode computed a table")
        computed.append(name)
        return pd.DataFrame({"x": [1, 2], "y": [0.5, 0.25]})

    def run(ctx):
        cached_table(ctx, name, params, compute, module="experiments.common")
        return []

    return SimpleNamespace(TITLE="fake", run=run)


def _check(out: Path, modules: dict, capsys) -> tuple[int, list[str]]:
    """``check`` at 256 streams, seed 0: its exit status and stderr lines."""
    rc = cli.check(Context(streams=256, out_dir=out, seed=0, check=True), modules)
    return rc, capsys.readouterr().err.strip().splitlines()


def _check_main(args: list[str], capsys) -> tuple[int, list[str]]:
    rc = cli.main(["--check", *args])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_check_fresh_then_stale_when_params_or_sources_change(tmp_path, capsys):
    computed = []
    _fake_figure({"n": 3}, computed=computed).run(Context(streams=256, out_dir=tmp_path))
    _fake_figure({"n": 3}, computed=computed).run(Context(streams=256, out_dir=tmp_path))  # reused
    assert computed == ["fake"]
    sidecar = json.loads((tmp_path / "fake.params.json").read_text())
    assert sidecar["source_digest"] == provenance.closure_digest("experiments.common")
    assert set(sidecar["source_files"]) == _posix(provenance.import_closure("experiments.common"))

    rc, lines = _check(tmp_path, {"fake": _fake_figure({"n": 3})}, capsys)
    assert rc == 0 and lines[-1].endswith("1 fresh, 0 stale, 0 skipped (trace missing)")

    rc, lines = _check(tmp_path, {"fake": _fake_figure({"n": 4})}, capsys)
    assert rc == 1 and lines[0] == "[check] fake: stale, params differ: n"

    sidecar["source_digest"] = "0" * 16
    sidecar["source_files"]["experiments/common.py"] = "0" * 12
    (tmp_path / "fake.params.json").write_text(json.dumps(sidecar))
    rc, lines = _check(tmp_path, {"fake": _fake_figure({"n": 3})}, capsys)
    assert rc == 1 and lines[0] == "[check] fake: stale, sources changed (experiments/common.py)"

    (tmp_path / "fake.csv").unlink()
    rc, lines = _check(tmp_path, {"fake": _fake_figure({"n": 3})}, capsys)
    assert rc == 1 and lines[0] == f"[check] fake: stale, missing {tmp_path / 'fake.csv'}"


def test_check_through_main_skips_missing_traces_and_refuses_tiny(tmp_path, capsys, monkeypatch):
    _fake_figure({"n": 3}, computed=[]).run(Context(streams=64, out_dir=tmp_path, seed=2))

    def needs_trace(ctx):
        raise TraceMissing("trace 'x.csv' not found; hbfjax traces fetch x.csv")

    modules = {"fake": _fake_figure({"n": 3}), "traced": SimpleNamespace(TITLE="t", run=needs_trace),
               "other": _fake_figure({"n": 1}, name="other")}
    monkeypatch.setattr(cli, "figure_modules", lambda: modules)
    rc, lines = _check_main(["--out", str(tmp_path), "--streams", "64", "--seed", "2", "--only", "fake", "traced"],
                            capsys)
    assert rc == 0 and lines == ["[check] traced: skipped, trace 'x.csv' not found; hbfjax traces fetch x.csv",
                                 f"[check] 2 figure(s), tables in {tmp_path}: 1 fresh, 0 stale, "
                                 "1 skipped (trace missing)"]
    rc, lines = _check_main(["--out", str(tmp_path), "--streams", "64"], capsys)  # seed 0 now; other has no table
    assert rc == 1 and lines[0] == "[check] fake: stale, params differ: seed"
    assert lines[2] == (f"[check] other: stale, missing {tmp_path / 'other.csv'}; "
                        f"missing {tmp_path / 'other.params.json'}")
    assert lines[3].endswith("0 fresh, 2 stale, 1 skipped (trace missing)")
    assert not (tmp_path / "README.md").exists()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--check", "--tiny"])
    assert exit_.value.code == 2 and "--check makes no sense with --tiny" in capsys.readouterr().err
