"""`hbfjax tune` end to end on a stand-in problem (the shipped ones are tested in tests/test_tune_*.py)."""

import json

import jax.numpy as jnp
import pytest

from hbfjax.cli import main
from hbfjax.tune import problems
from hbfjax.tune.problem import Fraction, Knob, Log2Size, Problem, TuneDefaults


def _stand_in(streams: int = 1, lam=None, **_):
    lam = 1.0 if lam is None else lam

    def objective(values, seed, relax):
        return lam * (jnp.log2(values["g"]) - 2.0) ** 2 + (values["f"] - 0.25) ** 2 - 3.0  # a negative optimum

    knobs = (Knob("g", Log2Size(1, 16), (1, 2, 4, 8, 16)), Knob("f", Fraction(0.0, 0.5), tuple(i / 100 for i in range(51))))
    return Problem("collide-sram", knobs, objective, "stand-in", TuneDefaults(init={"g": 1, "f": 0.4}), streams=streams)


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(problems, "make", lambda name, **kw: _stand_in(**kw))


def test_cli_prints_the_documented_keys(stand_in, capsys):
    assert main(["tune", "--problem", "collide-sram", "--estimator", "fd", "--lambda", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("knobs", "objective", "grid_best_knobs", "grid_best_objective", "gap", "evaluations",
                "grid_evaluations", "trajectory", "gradient_zero"):
        assert key in out
    assert out["grid_best_knobs"] == {"g": 4.0, "f": 0.25} and out["grid_best_objective"] == pytest.approx(-3.0)
    assert out["knobs"]["g"] == 4.0 and out["gap"] < 0.02 and out["gradient_zero"] is False
    assert out["evaluations"] <= out["grid_evaluations"] / 5
    assert all(set(step) == {"knobs", "objective", "raw_gradient"} for step in out["trajectory"])


def test_cli_reports_a_zero_gradient(stand_in, capsys, monkeypatch):
    flat = Problem("collide-sram", (Knob("f", Fraction(), (0.0, 0.5, 1.0)),), lambda v, s, r: jnp.floor(v["f"] * 3),
                   "flat", TuneDefaults(init={"f": 0.2}), streams=1)
    monkeypatch.setattr(problems, "make", lambda name, **kw: flat)
    assert main(["tune", "--problem", "collide-sram", "--estimator", "exact", "--steps", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gradient_zero"] is True and "zero at every step" in out["status"]


def test_cli_refuses_bad_options(capsys):
    assert main(["tune", "--problem", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["tune", "--problem", "collide-sram", "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err
