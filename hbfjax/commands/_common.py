"""Arguments and output shared by every subcommand."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from hbfjax.hardware import preset


def add_common_args(parser: argparse.ArgumentParser, default_streams: int = 1024) -> None:
    """--streams, --seed, --json, --chunk-streams."""
    g = parser.add_argument_group("Monte Carlo")
    g.add_argument("--streams", type=int, default=default_streams,
                   help=f"independent Monte Carlo streams (default {default_streams})")
    g.add_argument("--seed", type=int, default=0, help="random seed; same seed, same result (default 0)")
    g.add_argument("--chunk-streams", type=int, default=None,
                   help="simulate streams in chunks of this many to bound memory (default: all at once)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def add_preset_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=["hbflex", "dash"], default=None,
                        help="take hardware values (planes, tR, tPROG, SRAM, ...) from a named preset")


def preset_or_none(name: str | None):
    return None if name is None else preset(name)


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def emit(result: dict, as_json: bool) -> None:
    """Print ``result`` as one JSON object, or as aligned ``key  value`` lines."""
    result = _jsonable(result)
    if as_json:
        print(json.dumps(result, sort_keys=False))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        print(f"{key:<{width}}  {value}")
