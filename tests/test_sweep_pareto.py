"""Pareto fronts of a sweep (``hbfjax.sweep.pareto``, ``hbfjax sweep --pareto``, ``hbfjax plot --pareto``):
both fronts against a brute-force dominance check, and a real sweep marked and drawn."""

import csv

import numpy as np
import pytest

from hbfjax.cli import main
from hbfjax.sweep import pareto
from hbfjax.validate import ConfigError


def _brute(values, widths, senses):
    """Pair by pair, in plain Python: dominated (≥ everywhere, > somewhere) and surely dominated (better
    everywhere by more than the two half-widths)."""
    n, k = len(values), len(senses)
    sign = [1 if s == "max" else -1 for s in senses]
    front, near = [], []
    for a in range(n):
        dominated = surely = False
        for b in range(n):
            gaps = [sign[j] * (values[b][j] - values[a][j]) for j in range(k)]
            dominated |= all(g >= 0 for g in gaps) and any(g > 0 for g in gaps)
            surely |= all(g > widths[a][j] + widths[b][j] for j, g in enumerate(gaps))
        front.append(not dominated)
        near.append(not surely)
    return front, near


@pytest.mark.parametrize("seed,k", [(0, 2), (1, 2), (2, 3), (3, 3)])
def test_both_fronts_are_the_brute_force_ones(seed, k):
    g = np.random.default_rng(seed)
    n = 40
    values = g.integers(0, 8, (n, k)).astype(float)  # small integers: many ties
    widths = g.uniform(0, 1.5, (n, k))
    senses = [("max", "min")[j % 2] for j in range(k)]
    front, near = pareto.fronts(values, widths, senses)
    want_front, want_near = _brute(values.tolist(), widths.tolist(), senses)
    assert front.tolist() == want_front and near.tolist() == want_near
    assert (near | ~front).all() and front.any()  # the CI front holds the point front
    zero, _ = pareto.fronts(values, np.zeros_like(widths), senses)
    assert zero.tolist() == want_front  # the point front never looks at the CIs


@pytest.mark.parametrize("spec,says", [("a:max", "two objectives"), ("a:max,b", "METRIC:max or METRIC:min"),
                                       ("a:max,a:min", "each metric once"), ("a:up,b:min", "METRIC:max")])
def test_bad_specs_are_refused(spec, says):
    with pytest.raises(ConfigError, match=says):
        pareto.parse(spec)


def test_an_objective_that_is_no_number_column_is_refused_naming_it():
    rows = [{"status": "ok", "point": 0, "x": "1.0", "y": "2.0"}, {"status": "ok", "point": 1, "x": "2.0", "y": "n/a"}]
    with pytest.raises(ConfigError, match="--pareto z: no such result column"):
        pareto.mark(rows, pareto.parse("x:max,z:min"))
    with pytest.raises(ConfigError, match="row 1 holds 'n/a'"):
        pareto.mark(rows, pareto.parse("x:max,y:min"))
    assert pareto.mark([{"status": "failed"}], pareto.parse("x:max,y:min")) == {}


def test_a_sweep_marks_its_front_and_plot_draws_it(tmp_path, capsys):
    out = tmp_path / "t.csv"
    argv = ["sweep", "collide", "--vary", "planes=8,16", "--vary", "pages=16,48", "--streams", "4", "--quiet",
            "--out", str(out), "--pareto", "read_time_us:min,planes:min"]
    assert main(argv) == 0
    capsys.readouterr()
    rows = [r for r in csv.DictReader(open(out)) if r["row_kind"] == "point"]
    values = [[float(r["read_time_us"]), float(r["planes"])] for r in rows]
    widths = [[float(r["ci95_read_time_us"]), 0.0] for r in rows]
    want_front, want_near = _brute(values, widths, ["min", "min"])
    assert [r["pareto"] == "True" for r in rows] == want_front
    assert [r["pareto_ci"] == "True" for r in rows] == want_near
    assert not all(want_front)  # more pages on as many planes read longer: the case has dominated points
    assert main(argv) == 0 and "computed_points  0" in capsys.readouterr().out  # --pareto keeps the sweep's id
    png = tmp_path / "front.png"
    assert main(["plot", str(out), "--x", "planes", "--y", "read_time_us", "--pareto", "--out", str(png)]) == 0
    assert png.stat().st_size > 1000
    bare = tmp_path / "bare.csv"
    assert main(["sweep", "collide", "--vary", "planes=8,16", "--streams", "2", "--quiet", "--out", str(bare)]) == 0
    capsys.readouterr()
    assert main(["plot", str(bare), "--x", "planes", "--y", "read_time_us", "--pareto", "--out", str(png)]) == 2
    assert "run the sweep with --pareto" in capsys.readouterr().err
