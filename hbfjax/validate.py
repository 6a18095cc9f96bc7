"""One error type and one set of checks for bad configuration (DESIGN.md §3).

Every config field, knob constructor and CLI option validates through these helpers, so every
rejection reads the same way: ``<Owner>.<field> = <value>: <rule>`` (the CLI uses ``--flag`` as the
owner-less field name). A value is checked where it is defined: type (an integer field refuses
2.5, every numeric field refuses NaN and ±inf unless it says otherwise), range, and relations to
other fields (the message names both).
"""

from __future__ import annotations

import math
import numbers

INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A configuration, knob or option value breaks a rule; the message names field, value and rule."""


def _label(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def require(ok: bool, owner: str, name: str, value, rule: str) -> None:
    """Raise ``ConfigError('<owner>.<name> = <value>: <rule>')`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{_label(owner, name)} = {value!r}: {rule}")


def _bounds_rule(lo, hi, lo_open: bool, hi_open: bool) -> str:
    fmt = lambda v: f"{v:g}" if isinstance(v, float) else f"{v}"  # noqa: E731
    if lo is not None and hi is not None:
        return f"must be in {'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"must be {'>' if lo_open else '>='} {fmt(lo)}"
    if hi is not None:
        return f"must be {'<' if hi_open else '<='} {fmt(hi)}"
    return ""


def _in_bounds(value, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (value <= lo if lo_open else value < lo):
        return False
    if hi is not None and (value >= hi if hi_open else value > hi):
        return False
    return True


def require_int(owner: str, name: str, value, lo: int | None = None, hi: int | None = INT32_MAX) -> int:
    """``value`` as an int in [lo, hi] (default hi: int32 range, the simulator's index type).

    Accepts ints and integral floats (``1e3``); refuses bools, fractions, NaN and infinities.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{_label(owner, name)} = {value!r}: must be an integer")
    if isinstance(value, numbers.Integral):
        as_int = int(value)
    else:
        v = float(value)
        if not math.isfinite(v) or v != math.floor(v):
            raise ConfigError(f"{_label(owner, name)} = {value!r}: must be an integer")
        as_int = int(v)
    if not _in_bounds(as_int, lo, hi, False, False):
        raise ConfigError(f"{_label(owner, name)} = {value!r}: {_bounds_rule(lo, hi, False, False)}")
    return as_int


def require_real(owner: str, name: str, value, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a finite float in the interval given by ``lo``/``hi`` (open ends on request)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{_label(owner, name)} = {value!r}: must be a number")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{_label(owner, name)} = {value!r}: must be finite")
    if not _in_bounds(v, lo, hi, lo_open, hi_open):
        raise ConfigError(f"{_label(owner, name)} = {value!r}: {_bounds_rule(lo, hi, lo_open, hi_open)}")
    return v


def require_choice(owner: str, name: str, value, choices) -> str:
    """``value`` if it is one of ``choices``."""
    if value not in tuple(choices):
        raise ConfigError(f"{_label(owner, name)} = {value!r}: must be one of {tuple(choices)}")
    return value


SEED_MAX = 2**32 - 1  # seeds are uint32 hash words (hbfjax.rng): 2^32 would alias 0


def _parse_number(text: str):
    """An int for integer text (``3072``), else a float (``1e12``, ``nan``, ``inf``, ``0.5``)."""
    try:
        return int(text)
    except ValueError:
        return float(text)  # ValueError for non-numbers: argparse reports "invalid number value"


def number(kind: type = float, lo=None, hi=None, *, lo_open: bool = False, hi_open: bool = False):
    """An argparse ``type`` that parses a number and checks it with :func:`require_int` (``kind=int``,
    default ``hi`` the int32 range) or :func:`require_real` (finite, in the given interval).

    Rejections raise ``argparse.ArgumentTypeError('<text>: <rule>')``; ``hbfjax.cli`` prints them as
    ``--flag = <text>: <rule>``. The returned callable carries ``kind``, ``lo``, ``hi``, ``lo_open``
    and ``hi_open``, so tests can enumerate every numeric option and its range.
    """
    import argparse

    if kind is int and hi is None:
        hi = INT32_MAX

    def parse(text: str):
        try:
            value = _parse_number(text)
            if kind is int:
                return require_int("", "", value, lo, hi)
            return require_real("", "", value, lo, hi, lo_open=lo_open, hi_open=hi_open)
        except ConfigError as err:  # message '<label> = <value>: <rule>' with an empty label
            raise argparse.ArgumentTypeError(f"{text}: {str(err).split(': ', 1)[1]}") from None

    parse.__name__ = "number" if kind is float else "integer"
    parse.kind, parse.lo, parse.hi, parse.lo_open, parse.hi_open = kind, lo, hi, lo_open, hi_open
    return parse


class UsageError(Exception):
    """A command line argparse refuses (unknown option, bad choice, a number out of range)."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog
