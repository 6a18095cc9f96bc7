"""Arguments and output shared by every subcommand."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
from pathlib import Path

from hbfjax.hardware import PRESETS, preset
from hbfjax.validate import SEED_MAX, ConfigError, number

MAX_STREAMS = 2**24  # stream ids are int32 and a run holds every stream's outputs in memory
PRESET_NAMES = sorted(PRESETS)


def add_common_args(parser: argparse.ArgumentParser, default_streams: int = 1024) -> None:
    """--streams, --seed, --json, --chunk-streams."""
    g = parser.add_argument_group("Monte Carlo")
    g.add_argument("--streams", type=number(int, 2, MAX_STREAMS), default=default_streams,
                   help=f"independent Monte Carlo streams, >= 2 for a 95 %% CI (default {default_streams})")
    g.add_argument("--seed", type=number(int, 0, SEED_MAX), default=0,
                   help="random seed in [0, 2^32); same seed, same result (default 0)")
    g.add_argument("--chunk-streams", type=number(int, 1), default=None,
                   help="simulate streams in chunks of at most this many to bound memory (default: all at once)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def add_preset_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=PRESET_NAMES, default=None,
                        help="take hardware values (planes, tR, tPROG, SRAM, ...) from a named preset")


def add_hbf_args(parser, *, times: tuple[str, ...] = ("t_read_us", "t_prog_us"), stacks: bool = False) -> None:
    """--hbf PART (``hbfjax.memory.hbf_parts``), --read-units-per-die and, where the command has none, the
    --t-read-us/--t-prog-us options (``times``) that fill a part's unstated values or override its own."""
    from hbfjax.commands import _choices as names

    g = parser.add_argument_group("HBF part from a public specification (--hbf; issue 25)")
    g.add_argument("--hbf", choices=names.HBF_PARTS, default=None, metavar="PART",
                   help="take the HBF stack's geometry and timing from a part: " + ", ".join(names.HBF_PARTS))
    g.add_argument("--read-units-per-die", type=number(int, 1, 2**16), default=None,
                   help="with --hbf: planes × subarrays per die, for a part that states none (or to override it)")
    if "t_read_us" in times:
        g.add_argument("--t-read-us", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                       help="with --hbf: tR in µs, for a part that states none (or to override it)")
    if "t_prog_us" in times:
        g.add_argument("--t-prog-us", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                       help="with --hbf: tPROG in µs, for a part that states none (or to override it)")
    if stacks:
        g.add_argument("--hbf-stacks", type=number(int, 1, 64), default=None,
                       help="with --hbf: stacks of the part in the package (default 1)")


def hbf_part(args, need: tuple[str, ...], only_with_hbf: tuple[str, ...] = ("read_units_per_die", "hbf_stacks")):
    """The resolved ``--hbf`` part (None without --hbf); the options in ``only_with_hbf`` are refused without it."""
    if args.hbf is None:
        for dest in only_with_hbf:
            if getattr(args, dest, None) is not None:
                raise ConfigError(f"{flag(dest)} = {getattr(args, dest)!r}: applies only with --hbf")
        return None
    from hbfjax.memory import hbf_parts

    return hbf_parts.resolve(args.hbf, t_read_us=getattr(args, "t_read_us", None),
                             t_prog_us=getattr(args, "t_prog_us", None),
                             read_units_per_die=args.read_units_per_die, need=need)


def flag(dest: str) -> str:
    """The command-line spelling of an ``args`` attribute: ``pages_per_block`` -> ``--pages-per-block``."""
    return "--" + dest.replace("_", "-")


def given(args, dest: str) -> bool:
    """Whether an option was given (options whose meaning depends on the mode default to None or False)."""
    return getattr(args, dest) not in (None, False)


def require_applies(args, mode: str, applies: dict[str, bool]) -> None:
    """Refuse an option the chosen mode would ignore: ``applies`` maps an ``args`` attribute to whether
    it has an effect in ``mode`` (a text such as ``"--workload read"``)."""
    for dest, ok in applies.items():
        if given(args, dest) and not ok:
            raise ConfigError(f"{flag(dest)} = {getattr(args, dest)!r}: has no effect with {mode}; drop it "
                              "or choose a mode it applies to (see --help)")


@contextlib.contextmanager
def blame(args, *dests: str):
    """Prefix a ``ConfigError`` raised inside with those of the options its config is built from that
    were given (``--a = 1, --b = 2: <Config>.<field> = ...: <rule>``)."""
    try:
        yield
    except ConfigError as err:
        named = ", ".join(f"{flag(d)} = {getattr(args, d)!r}" for d in dests if given(args, d))
        if not named:
            raise
        raise ConfigError(f"{named}: {err}") from None


def preset_or_none(name: str | None):
    return None if name is None else preset(name)


def _text(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _is_table(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def emit(result: dict, as_json: bool) -> None:
    """Print ``result`` as one JSON object, or as aligned ``key  value`` lines (nested dicts as dotted keys,
    as a sweep table's columns: :func:`~hbfjax.sweep.table.flatten`; a list of results, such as
    ``systems``, side by side: one column each, one row per key), once it satisfies every output invariant (:func:`~hbfjax.invariants.checked`; a ``ConfigError``
    and nothing printed if not)."""
    from hbfjax.invariants import checked  # NumPy: imported by a run, not by building the parser
    from hbfjax.sweep.table import flatten

    result = checked(result)
    if as_json:
        print(json.dumps(result, sort_keys=False))
        return
    tables = [v for v in result.values() if _is_table(v)]
    header = flatten({k: v for k, v in result.items() if not _is_table(v)})
    width = max([len(k) for k in header] + [len(k) for rows in tables for r in rows for k in flatten(r)])
    for key, value in header.items():
        print(f"{key:<{width}}  {_text(value)}")
    for rows in tables:
        columns = [flatten(r) for r in rows]
        keys = list(dict.fromkeys(k for c in columns for k in c))
        cells = [[_text(c.get(k, "")) for c in columns] for k in keys]
        col = [max(len(row[i]) for row in cells) for i in range(len(columns))]
        for key, row in zip(keys, cells):
            print(f"{key:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(row, col)).rstrip())


def input_file(option: str, path) -> str:
    """``path``, once it names a file that can be read; else a ``ConfigError`` naming ``option``."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{option} {path}: no such file")
    if p.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; name a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"{option} {path}: cannot be read (permission denied)")
    return str(path)


def text_file(option: str, path) -> str:
    """:func:`input_file` that is also UTF-8 text throughout (read once in 1 MiB pieces: for the small
    tables and grids a command reads, not for traces)."""
    input_file(option, path)
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    try:
        with open(path, "rb") as fh:
            while piece := fh.read(1 << 20):
                decoder.decode(piece)
                offset += len(piece)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{option} {path}: not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} near "
                          f"offset {offset + err.start}); is it the file you meant?") from None
    return str(path)


def output_file(option: str, path) -> str:
    """``path``, once a file can be written there (its folder exists and is writable, it is not a
    folder); else a ``ConfigError`` naming ``option``: checked before a command's work, so that a long
    run never fails at its end for want of a place to write."""
    p = Path(path)
    folder = p.parent
    if p.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; name a file in it")
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{option} {path}: cannot be written (permission denied)")
    return str(path)
