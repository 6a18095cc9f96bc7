"""Run a sweep's grid points and write their rows (DESIGN.md §6).

The front (``hbfjax.commands.sweep``) hands the runner its subcommand as a :class:`Target`. Work comes
in *items*. A target with a ``plan(args)`` (``serve``) gives each point a family of systems
(``hbfjax.serve.systems.Family``, one system per sweep point); points whose families share a compiled
shape (``systems.family_key``: function, static config, knob shapes, inputs; and the same streams and
seed) are grouped, and each item is up to ``points_per_call`` of them stacked on one knob axis (their
inputs rebuilt for the points stacked: ``Family.inputs_for``), so knob-only axes run as one
compilation on common random numbers and every shape compiles once. Any other target runs one point
per item through its ``compute(args)``; the jit cache still compiles each shape once, since knob
values are traced. A point whose options are refused, whose run raises, or
whose result breaks an output invariant or overflowed becomes a failed row with its error; the sweep
goes on.

Items are shared among processes round robin (``hbfjax.cluster``); after each round process 0
gathers the rows and appends them to the table.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shlex
import sys
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from hbfjax import batch, cluster as clusters, provenance
from hbfjax.invariants import checked
from hbfjax.serve.systems import family_key
from hbfjax.sweep.grid import SWEEP_OWNED, Point
from hbfjax.sweep.table import flatten, cell
from hbfjax.traces import TraceError
from hbfjax.validate import ConfigError, UsageError

OVERFLOW_ERROR = ("overflow: a fixed-size buffer of the simulation overflowed (see the subcommand's --help); "
                  "the metrics are not meaningful")


class Target(NamedTuple):
    """A subcommand as a sweep runs it: its parser, ``compute(args) -> dict`` and, for a subcommand whose
    points stack on a knob axis (``serve``), ``plan(args) -> (header, families)`` and
    ``assemble(header, {system: result}, systems) -> dict``."""

    name: str
    parser: argparse.ArgumentParser
    compute: Callable[[argparse.Namespace], dict]
    plan: Callable | None = None
    assemble: Callable | None = None


def parse_point(parser: argparse.ArgumentParser, point: Point) -> argparse.Namespace:
    """The subcommand's namespace for ``point`` (its own parser's checks; JSON output)."""
    try:
        args = parser.parse_args(list(point.argv))
    except UsageError as err:
        raise ConfigError(str(err)) from None
    args.json = True
    return args


def config_of(args: argparse.Namespace) -> dict:
    """Every option of a parsed point, JSON-able (the ``config`` provenance column)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in SWEEP_OWNED and not callable(v)}


def sweep_id(command: str, base: dict, axes: list[str], extra: dict | None = None) -> str:
    """Names a sweep: the subcommand, its fixed options, the axes' names (not their values: a grid
    extended by new values resumes) and hbfjax's source digest (other code never extends a table)."""
    text = json.dumps({"command": command, "base": base, "axes": axes, "extra": extra or {},
                       "source": provenance.source_digest()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def point_row(command: str, point: Point, args, result: dict | None, error: str | None, wall_s: float,
              call_points: int, row_kind: str = "point", check: bool = True) -> dict:
    """One table row: identity, the axis values, status, the result's metrics (flattened; ``check``: once
    they satisfy the subcommand's output invariants), provenance."""
    row = {"row_kind": row_kind, "point": point.index, "key": point.key, **dict(point.values)}
    metrics = {}
    if result is not None and error is None:
        try:
            metrics = flatten(checked(result) if check else result)
        except ConfigError as err:
            error = str(err)
    if error is None and metrics.get("overflow") is True:
        error = OVERFLOW_ERROR
    row.update(status="ok" if error is None else "failed", error=error or "", overflow=metrics.get("overflow", ""))
    for name, value in metrics.items():
        if name in row:  # a metric named like an axis: kept apart when it says something else
            if cell(value) != cell(row[name]):
                row["result." + name] = value
            continue
        row[name] = value
    row.update(provenance.provenance())
    row.update(seed=getattr(args, "seed", ""), streams=getattr(args, "streams", ""),
               command="hbfjax " + shlex.join([command, *point.argv]),
               config=json.dumps(config_of(args), sort_keys=True, default=str) if args is not None else "",
               call_wall_s=wall_s, call_points=call_points, finished_utc=_utc_now())
    return row


def _error_text(err: BaseException) -> str:
    if isinstance(err, (ConfigError, TraceError)):
        return " ".join(str(err).split())
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _report_bug(err: BaseException) -> None:
    """An exception that is not a refused option: its traceback on stderr (the row keeps its message)."""
    if not isinstance(err, (ConfigError, TraceError)):
        traceback.print_exception(err, file=sys.stderr)


@dataclass
class Item:
    """A unit of work: ``run()`` returns its rows."""
    points: int
    run: Callable[[], list[dict]]


@dataclass
class _Planned:
    point: Point
    args: Any
    header: dict
    family: Any


def _failed_item(command, point, args, err, row_kind) -> Item:
    return Item(1, lambda: [point_row(command, point, args, None, _error_text(err), 0.0, 0, row_kind)])


def _compute_item(command, target: Target, point, args, row_kind) -> Item:
    def run():
        t0 = time.perf_counter()
        try:
            result, error = target.compute(args), None
        except Exception as err:  # noqa: BLE001 - a failed point is a row; the sweep goes on
            _report_bug(err)
            result, error = None, _error_text(err)
        return [point_row(command, point, args, result, error, time.perf_counter() - t0, 1, row_kind)]
    return Item(1, run)


def stream_rows(point: Point, per_stream: dict) -> list[dict]:
    """One row per stream (``row_kind = stream``) of a point's per-stream metrics."""
    streams = len(next(iter(per_stream.values())))
    rows = []
    for s in range(streams):
        key = json.dumps({**dict(point.values), "stream": s}, separators=(",", ":"))
        rows.append({"row_kind": "stream", "point": point.index, "key": key, **dict(point.values), "stream": s,
                     "status": "ok", **{k: v[s].item() for k, v in per_stream.items()}})
    return rows


def _chunk_item(command, target: Target, chunk: list[_Planned], size: int, row_kind: str, done: set[str],
                per_stream: bool) -> Item:
    """Points of one family shape stacked on one knob axis of ``size`` (the last point repeated to fill it:
    every call of a group has one shape, so one compilation); rows for the points not ``done`` (with
    ``per_stream``, each followed by its streams' rows)."""

    def run():
        t0 = time.perf_counter()
        first = chunk[0]
        padded = chunk + [chunk[-1]] * (size - len(chunk))
        points = [p.family.points[0] for p in padded]
        try:
            inputs = first.family.inputs_for(points, size)
            out = batch.run(first.family.simulate, first.args.streams, first.args.seed, batch.stack_knobs(points),
                            first.family.config, inputs=inputs, knob_axis=True, chunk_streams=first.args.chunk_streams)
        except Exception as err:  # noqa: BLE001
            _report_bug(err)
            wall = time.perf_counter() - t0
            return [point_row(command, p.point, p.args, None, _error_text(err), wall, size, row_kind) for p in chunk
                    if p.point.key not in done]
        wall = time.perf_counter() - t0
        rows = []
        for k, p in enumerate(chunk):
            if p.point.key in done:
                continue
            o = batch.point_outputs(out, k)
            try:
                by_name = {p.family.names[0]: p.family.report(o, 0)}
                result, error = target.assemble(p.header, by_name, p.family.names), None
            except Exception as err:  # noqa: BLE001
                _report_bug(err)
                result, error = None, _error_text(err)
            row = point_row(command, p.point, p.args, result, error, wall, size, row_kind)
            if per_stream and row["status"] == "ok":  # before the point's row: a point on disk has its streams
                rows += stream_rows(p.point, p.family.per_stream(o))
            rows.append(row)
        return rows
    return Item(sum(p.point.key not in done for p in chunk), run)


def work_items(target: Target, points: list[Point], points_per_call: int, row_kind: str = "point",
               done: frozenset[str] = frozenset(), per_stream: bool = False) -> list[Item]:
    """The items that compute the ``points`` not ``done`` (rows of ``row_kind``): failed plans first, then
    each compiled shape's chunks. Chunks are cut from every point, done or not, so a point is stacked with
    the same others whichever rows an interrupted sweep left (a stacked call is not bit-for-bit the same
    as a call of another width: float32 reductions may be vectorised differently)."""
    command = target.name
    items, groups = [], OrderedDict()
    for point in points:
        if point.key in done and target.plan is None:
            continue
        try:
            args = parse_point(target.parser, point)
        except ConfigError as err:
            if point.key not in done:
                items.append(_failed_item(command, point, None, err, row_kind))
            continue
        if target.plan is None:
            items.append(_compute_item(command, target, point, args, row_kind))
            continue
        try:
            header, families = target.plan(args)
        except Exception as err:  # noqa: BLE001
            if point.key not in done:
                _report_bug(err)
                items.append(_failed_item(command, point, args, err, row_kind))
            continue
        (family,) = families  # a sweep point serves one system (grid.multi_value_axes)
        key = (family_key(family), args.streams, args.seed, args.chunk_streams)
        groups.setdefault(key, []).append(_Planned(point, args, header, family))
    for members in groups.values():
        size = min(points_per_call, len(members))
        for i in range(0, len(members), size):
            chunk = members[i:i + size]
            if any(p.point.key not in done for p in chunk):
                items.append(_chunk_item(command, target, chunk, size, row_kind, done, per_stream))
    return items


class Progress:
    """``[sweep] 12/40 points (1 failed)  35 s elapsed, ETA 1 min 22 s`` on stderr after each round."""

    def __init__(self, total: int, label: str = "points", quiet: bool = False):
        self.total, self.label, self.quiet = total, label, quiet
        self.done = self.failed = 0
        self.t0 = self.shown = time.perf_counter()

    def update(self, rows: list[dict], every_s: float = 1.0) -> None:
        """Count ``rows`` (a point's stream rows are not points); print at most once per ``every_s``
        seconds, and at the end."""
        rows = [r for r in rows if r["row_kind"] != "stream"]
        self.done += len(rows)
        self.failed += sum(r["status"] == "failed" for r in rows)
        now = time.perf_counter()
        if self.quiet or (now - self.shown < every_s and self.done < self.total):
            return
        self.shown = now
        elapsed = now - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        failed = f" ({self.failed} failed)" if self.failed else ""
        print(f"[sweep] {self.done}/{self.total} {self.label}{failed}  {_duration(elapsed)} elapsed, "
              f"ETA {_duration(eta)}", file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    if seconds != seconds:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {s} s"
    return f"{minutes // 60} h {minutes % 60} min"


def execute(items: list[Item], cluster, table, progress: Progress) -> list[dict] | None:
    """Run the items, process ``i % count`` taking item ``i``, in rounds of one item per process; after
    each round the leader appends every process's rows (in item order) to ``table``. Returns the rows
    (leader) or None."""
    count, mine = cluster.process_count, cluster.process_id
    every = [] if cluster.is_leader else None
    for first in range(0, len(items), count):
        index = first + mine
        rows = items[index].run() if index < len(items) else []
        gathered = clusters.gather(cluster, rows)
        if cluster.is_leader:
            for part in gathered:
                table.append(part)
                progress.update(part)
                every.extend(part)
    return every
