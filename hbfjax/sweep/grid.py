"""A sweep's grid: axes over a subcommand's options, from ``--vary NAME=V1,V2`` or a TOML file, and
the command line of each grid point.

A point is the subcommand's own command line (the fixed options, then one value per axis), so every
value is parsed and validated by that subcommand's parser, with its own error messages. Points are
the Cartesian product of the axes, the last axis fastest. A point is named by its axis values
(``key``), which is what an interrupted sweep looks up to resume.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tomllib
from dataclasses import dataclass

from hbfjax.validate import ConfigError

# options of every subcommand that a sweep manages itself (a row per point is the sweep's own output)
SWEEP_OWNED = frozenset({"json", "func", "command"})


@dataclass(frozen=True)
class Axis:
    dest: str  # the option's argparse destination, e.g. "t_read_us"
    values: tuple[str, ...]  # as given, each parsed by the subcommand's parser


@dataclass(frozen=True)
class Point:
    index: int  # position in the grid (row order of an uninterrupted sweep)
    values: tuple[tuple[str, str], ...]  # (dest, value) per axis, in axis order
    argv: tuple[str, ...]  # the subcommand's command line for this point

    @property
    def key(self) -> str:
        """The point's name in the table: its axis values as compact JSON."""
        return json.dumps(dict(self.values), separators=(",", ":"))


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's options by destination (help excluded)."""
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def _action(parser, name: str) -> argparse.Action:
    actions = option_actions(parser)
    dest = name.lstrip("-").replace("-", "_")
    if dest not in actions or dest in SWEEP_OWNED:
        choices = ", ".join(sorted(d.replace("_", "-") for d in actions if d not in SWEEP_OWNED))
        raise ConfigError(f"--vary {name}: {parser.prog} has no option --{dest.replace('_', '-')} to vary "
                          f"(its options: {choices})")
    return actions[dest]


def split_values(text: str, option: str = "--vary") -> tuple[str, ...]:
    """``V1,V2,...``; with a ``|`` the values are split on ``|`` instead, for values holding commas, and
    a value may then be empty (``disable=|placement,writeback``: nothing disabled, then two). An empty
    value without a ``|`` is refused, naming ``option``."""
    bars = "|" in text
    parts = tuple(v.strip() for v in text.split("|" if bars else ","))
    if not bars and any(v == "" for v in parts):
        raise ConfigError(f"{option} values {text!r}: a value is empty (split on | to give an empty value)")
    return parts


def parse_vary(parser, specs: list[str]) -> list[Axis]:
    """``["system=dash,relay-only", "load=0.5,0.9"]`` -> axes, each naming an option of ``parser``."""
    axes = []
    for spec in specs:
        name, eq, text = spec.partition("=")
        if not eq:
            raise ConfigError(f"--vary {spec!r}: must be NAME=V1,V2,... (e.g. load=0.5,0.75,0.9)")
        axes.append(Axis(_action(parser, name.strip()).dest, split_values(text)))
    return axes


def read_grid_file(path: str) -> tuple[str | None, list[str], dict[str, list[str]]]:
    """A TOML grid: optional ``command = "serve"``, a ``[fixed]`` table of options and a ``[vary]`` table
    of option -> list of values. Returns (command, fixed argv, vary)."""
    try:
        with open(path, "rb") as fh:
            grid = tomllib.load(fh)
    except OSError as err:
        raise ConfigError(f"--grid {path}: cannot read it ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--grid {path}: not valid TOML ({err})") from None
    unknown = set(grid) - {"command", "fixed", "vary"}
    if unknown:
        raise ConfigError(f"--grid {path}: unknown keys {sorted(unknown)}; a grid has command, [fixed] and [vary]")
    for key in ("fixed", "vary"):
        if not isinstance(grid.get(key, {}), dict):
            raise ConfigError(f"--grid {path}: {key} = {grid[key]!r}: must be a table ([{key}] with one option a line)")
    fixed = []
    for name, value in grid.get("fixed", {}).items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            fixed.append(flag)
        elif value is False:
            fixed.append("--no-" + name.replace("_", "-"))
        else:
            fixed += [flag, *(str(v) for v in (value if isinstance(value, list) else [value]))]
    vary = {}
    for name, values in grid.get("vary", {}).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"--grid {path}: vary.{name} = {values!r}: must be a non-empty list")
        vary[name] = [_toml_text(v) for v in values]
    return grid.get("command"), fixed, vary


def _toml_text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _given(argv: tuple[str, ...], action: argparse.Action) -> bool:
    flags = set(action.option_strings) | {"--no-" + s[2:] for s in action.option_strings if s.startswith("--")}
    return any(tok in flags or tok.split("=", 1)[0] in flags for tok in argv)


def _argv_for(action: argparse.Action, value: str) -> list[str]:
    """The tokens that set ``action`` to ``value``."""
    flag = max((s for s in action.option_strings if not s.startswith("--no-")), key=len)
    if action.nargs == 0:  # a switch: store_true or --x/--no-x
        truth = value.lower()
        if truth not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"--vary {action.dest.replace('_', '-')}={value}: the option is a switch, "
                              "vary it over true,false")
        on = truth in ("true", "1", "yes")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if on else "--no-" + flag[2:]]
        if not on:
            return []
        return [flag]
    if action.choices is not None and value not in {str(c) for c in action.choices}:
        raise ConfigError(f"--vary {action.dest.replace('_', '-')}={value}: not one of its choices "
                          f"({', '.join(str(c) for c in action.choices)})")
    return [flag, value]


def multi_value_axes(parser, fixed: tuple[str, ...], axes: list[Axis]) -> tuple[tuple[str, ...], list[Axis]]:
    """Options given several values in the fixed command line (``--system dash relay-only``) become axes,
    one value per row; returns the fixed argv without them and the axes with them first."""
    args = parser.parse_args(list(fixed))
    varied = {a.dest for a in axes}
    moved, rest = [], list(fixed)
    for dest, action in option_actions(parser).items():
        value = getattr(args, dest, None)
        if action.nargs in ("+", "*") and isinstance(value, list) and len(value) > 1 and dest not in varied:
            moved.append(Axis(dest, tuple(str(v) for v in value)))
            rest = _drop_option(rest, action)
    return tuple(rest), moved + axes


def _drop_option(argv: list[str], action: argparse.Action) -> list[str]:
    out, skipping = [], False
    for tok in argv:
        if tok in action.option_strings:
            skipping = True
            continue
        if skipping and not tok.startswith("-"):
            continue
        skipping = False
        out.append(tok)
    return out


def points(parser, fixed: tuple[str, ...], axes: list[Axis]) -> list[Point]:
    """Every grid point, the last axis fastest; an option both fixed and varied is refused."""
    actions = option_actions(parser)
    dests = [a.dest for a in axes]
    if len(set(dests)) < len(dests):
        raise ConfigError(f"--vary: each option once ({', '.join(dests)})")
    for axis in axes:
        if _given(fixed, actions[axis.dest]):
            raise ConfigError(f"--vary {axis.dest.replace('_', '-')}: also given among the fixed options; give it "
                              "in one place")
    grid = []
    for index, combo in enumerate(itertools.product(*(a.values for a in axes))):
        argv = list(fixed)
        for axis, value in zip(axes, combo):
            argv += _argv_for(actions[axis.dest], value)
        grid.append(Point(index, tuple(zip(dests, combo)), tuple(argv)))
    return grid
