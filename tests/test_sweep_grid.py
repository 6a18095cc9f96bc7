"""The sweep grid: axes from --vary and TOML, each point's command line as the subcommand parses it."""

import argparse

import pytest

from hbfjax.cli import Parser
from hbfjax.sweep import grid
from hbfjax.validate import ConfigError


def _parser():
    p = Parser(prog="hbfjax demo")
    p.add_argument("--planes", type=int, default=8)
    p.add_argument("--t-read-us", type=float, default=None)
    p.add_argument("--system", nargs="+", default=["dash"])
    p.add_argument("--lookahead", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--fast", action="store_true")
    p.add_argument("--disable", default="")
    p.add_argument("--json", action="store_true")
    return p


def test_points_are_the_product_with_the_last_axis_fastest_and_each_argv_parses_to_its_values():
    p = _parser()
    axes = grid.parse_vary(p, ["planes=8,16", "t-read-us=2,8,20"])
    pts = grid.points(p, ("--fast",), axes)
    assert [dict(q.values) for q in pts][:4] == [{"planes": "8", "t_read_us": "2"}, {"planes": "8", "t_read_us": "8"},
                                                 {"planes": "8", "t_read_us": "20"}, {"planes": "16", "t_read_us": "2"}]
    assert [q.index for q in pts] == list(range(6))
    for q in pts:
        args = p.parse_args(list(q.argv))
        assert (args.planes, args.t_read_us, args.fast) == (int(dict(q.values)["planes"]),
                                                            float(dict(q.values)["t_read_us"]), True)
    assert pts[5].key == '{"planes":"16","t_read_us":"20"}'


def test_switches_vary_over_true_false_and_values_with_commas_split_on_bars():
    p = _parser()
    assert grid.split_values("|placement,writeback") == ("", "placement,writeback")
    with pytest.raises(ConfigError, match="a value is empty"):
        grid.split_values("8,,16")
    pts = grid.points(p, (), grid.parse_vary(p, ["lookahead=true,false", "fast=false,true",
                                                 "disable=placement,writeback|balancing"]))
    got = [(a.lookahead, a.fast, a.disable) for a in (p.parse_args(list(q.argv)) for q in pts)]
    assert got[:3] == [(True, False, "placement,writeback"), (True, False, "balancing"), (True, True, "placement,writeback")]
    assert got[-1] == (False, True, "balancing")
    with pytest.raises(ConfigError, match="switch"):
        grid.points(p, (), grid.parse_vary(p, ["fast=maybe"]))


def test_an_option_given_several_values_becomes_the_first_axis():
    p = _parser()
    fixed, axes = grid.multi_value_axes(p, ("--system", "dash", "relay-only", "--planes", "4"),
                                        grid.parse_vary(p, ["t-read-us=2,8"]))
    assert fixed == ("--planes", "4")
    assert [(a.dest, a.values) for a in axes] == [("system", ("dash", "relay-only")), ("t_read_us", ("2", "8"))]
    assert [p.parse_args(list(q.argv)).system for q in grid.points(p, fixed, axes)] == [["dash"]] * 2 + [["relay-only"]] * 2


def test_bad_axes_are_refused_with_the_rule():
    p = _parser()
    with pytest.raises(ConfigError, match=r"no option --pages to vary \(its options: disable, fast, lookahead, planes"):
        grid.parse_vary(p, ["pages=1,2"])
    with pytest.raises(ConfigError, match="NAME=V1,V2"):
        grid.parse_vary(p, ["planes"])
    with pytest.raises(ConfigError, match="no option --json"):  # the sweep owns the output format
        grid.parse_vary(p, ["json=true"])
    with pytest.raises(ConfigError, match="also given among the fixed options"):
        grid.points(p, ("--planes", "4"), grid.parse_vary(p, ["planes=8,16"]))
    with pytest.raises(ConfigError, match="each option once"):
        grid.points(p, (), grid.parse_vary(p, ["planes=8", "planes=16"]))


def test_a_toml_grid_gives_the_command_fixed_options_and_axes(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text('command = "demo"\n[fixed]\nplanes = 4\nfast = true\nlookahead = false\n'
                    '[vary]\nt_read_us = [2, 8.5]\nsystem = ["dash", "relay-only"]\n')
    command, fixed, vary = grid.read_grid_file(str(path))
    assert command == "demo" and fixed == ["--planes", "4", "--fast", "--no-lookahead"]
    assert vary == {"t_read_us": ["2", "8.5"], "system": ["dash", "relay-only"]}
    (tmp_path / "bad.toml").write_text("[vary]\nplanes = 8\n")
    with pytest.raises(ConfigError, match="must be a non-empty list"):
        grid.read_grid_file(str(tmp_path / "bad.toml"))
    (tmp_path / "typo.toml").write_text("[vary]\nplanes = [8]\n[fixd]\nx = 1\n")
    with pytest.raises(ConfigError, match="unknown keys"):
        grid.read_grid_file(str(tmp_path / "typo.toml"))
    with pytest.raises(ConfigError, match="cannot read"):
        grid.read_grid_file(str(tmp_path / "missing.toml"))
