"""``hbfjax sweep``: a grid over another subcommand's options, written as a resumable tidy table."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time

from hbfjax import cluster as clusters
from hbfjax.commands._common import emit, output_file
from hbfjax.validate import ConfigError, number

SWEEPABLE = ("collide", "gc", "serve", "tune", "writeback")  # the subcommands with a compute(args)

HELP = """\
Run a subcommand over a grid of its options and write one row per grid point to a CSV table:

  hbfjax sweep serve --vary system=dash,relay-only --vary load=0.5,0.75,0.9 --model mixtral-8x22b \\
      --streams 64 --out results.csv

Every option that is not the sweep's own (below) goes to the subcommand unchanged. --vary NAME=V1,V2
(repeatable; NAME as the option is spelt, without --; split on | instead of , when a value holds
commas; a switch varies over true,false) or a TOML --grid file (command = "serve", a [fixed] table of
options and a [vary] table of lists) give the axes; points are their product, the last axis fastest.
An option given several values (--system dash relay-only) is an axis too. Each value is parsed by the
subcommand's own parser.

Knob-only axes (organisation, load, rate, tR, ...) run as one compilation on common random numbers;
axes that change shapes (model, streams, slots, ...) compile once each. With serve, up to
--points-per-call points of one shape are stacked on one knob axis per call.

The table is tidy: one row per point with its axis values, status (ok or failed), error, overflow,
every metric the subcommand reports with its ci95_ half-width, and provenance (hbfjax version, source
digest, JAX version, device kind and count, process count, seed, streams, the point's command line and
full config, wall time of its call, finish time). Rows are written as points finish; a sweep killed at
any moment and started again with the same command continues where it stopped, with no row lost or
repeated (a grid extended by new values keeps the rows it has). A point that fails (a refused option,
an overflow, an error) is a failed row and the sweep goes on; --retry-failed runs those again. Exit
status 1 when a row failed.

--capacity (serve): for every point the highest Poisson arrival rate at which every --slo holds
(e.g. --slo p90_ttft_s<=2 --slo p99_tpot_ms<=100), starting from --capacity-rates and refined for
--refine-rounds rounds, all points at once; probes are rows (row_kind probe), each point's answer a
capacity row with its bracket and the rates its 95 % CIs allow (see hbfjax.sweep.capacity).

Across hosts: run the same command in every process with --coordinator/--num-processes/--process-id
(or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); the work is shared round robin and
process 0 writes the table. Results do not depend on the device or process count.

--pareto METRIC:max,METRIC:min (two or more result columns): the points no other point beats on every
objective are marked in two columns, pareto (by the estimates) and pareto_ci (not surely dominated:
no other point better on every objective by more than both 95 % half-widths); see hbfjax.sweep.pareto.

`hbfjax plot TABLE --x COL --y COL --hue COL` draws a table with its CIs; `--pareto` draws the front.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="run a subcommand over a grid of options into a resumable CSV table",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", choices=SWEEPABLE, help="the subcommand to sweep")
    p.add_argument("options", nargs=argparse.REMAINDER,
                   help="the sweep's options (below) and the subcommand's (see hbfjax TARGET --help)")
    _sweep_options(p)
    p.set_defaults(func=run)


def _sweep_options(p) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2",
                   help="an axis: a subcommand option and its values (repeatable)")
    g.add_argument("--grid", default=None, metavar="TOML", help="axes (and fixed options) from a TOML file")
    g.add_argument("--out", default=None, metavar="CSV", help="the table to write, or to resume (required)")
    g.add_argument("--points-per-call", type=number(int, 1, 4096), default=None,
                   help="serve: points of one shape stacked on one knob axis per call (default 1 on a CPU, "
                        "where a stacked rollout waits for its slowest point; 64 on an accelerator)")
    g.add_argument("--retry-failed", action="store_true", help="run the table's failed rows again")
    g.add_argument("--per-stream", action="store_true",
                   help="serve: after each point's row, one row per stream (row_kind stream) of its request metrics")
    g.add_argument("--pareto", default=None, metavar="METRIC:max,METRIC:min",
                   help="mark the non-dominated points over these objectives (two or more): columns pareto (by "
                        "the estimates) and pareto_ci (not surely dominated given the 95 %% CIs); see hbfjax plot "
                        "--pareto")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    g.add_argument("--json", action="store_true", help="the closing summary as one JSON object")
    c = p.add_argument_group("capacity search (serve)")
    c.add_argument("--capacity", action="store_true",
                   help="find every point's highest arrival rate (requests/s) meeting every --slo")
    c.add_argument("--slo", action="append", default=[], metavar="METRIC<=BOUND",
                   help="an objective on a result column with a CI, e.g. p90_ttft_s<=2, p99_tpot_ms<=100")
    c.add_argument("--capacity-rates", default=None, metavar="R1,R2",
                   help="the first round's arrival rates in requests/s, e.g. 0.25,0.5,1,2")
    c.add_argument("--refine-rounds", type=number(int, 0, 32), default=3, help="rounds after the first (default 3)")
    c.add_argument("--refine-points", type=number(int, 1, 64), default=4,
                   help="rates per point in each later round (default 4)")
    clusters.add_cluster_args(p)


def _options_parser() -> argparse.ArgumentParser:
    from hbfjax.cli import Parser

    p = Parser(prog="hbfjax sweep", add_help=False)
    _sweep_options(p)
    return p


def target_parser(name: str) -> argparse.ArgumentParser:
    """The subcommand's own parser (``hbfjax <name>``)."""
    from hbfjax.cli import build_parser

    top = build_parser()
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _split(args) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's options (wherever they stand after TARGET) and the subcommand's command line."""
    from hbfjax.validate import UsageError

    try:
        own, rest = _options_parser().parse_known_args(args.options)
    except UsageError as err:
        raise ConfigError(str(err)) from None
    for dest, value in vars(own).items():  # options given before TARGET count too
        before = getattr(args, dest, None)
        if value in (None, False, []) and before not in (None, False, []):
            setattr(own, dest, before)
    return own, rest


def _axes(own, parser, command: str) -> tuple[tuple[str, ...], list[grid.Axis]]:
    from hbfjax.sweep import grid

    fixed, specs = [], list(own.vary)
    if own.grid is not None:
        file_command, file_fixed, vary = grid.read_grid_file(own.grid)
        if file_command not in (None, command):
            raise ConfigError(f"--grid {own.grid}: its command is {file_command!r}, the sweep's is {command!r}")
        fixed += file_fixed
        specs += [f"{name}={'|'.join(values)}" for name, values in vary.items()]
    return tuple(fixed), grid.parse_vary(parser, specs)


def run(args) -> int:
    own, rest = _split(args)
    if "-h" in rest or "--help" in rest:  # hbfjax sweep TARGET --help: the sweep's options, then the target's
        target_parser("sweep").print_help()
        print(f"\nOptions of hbfjax {args.target} (fixed, or varied with --vary):\n")
        target_parser(args.target).print_help()
        return 0
    import jax  # here, not above: the help needs neither JAX nor the sweep machinery

    from hbfjax.sweep import grid, pareto, runner

    if own.out is None:
        raise ConfigError("--out: give the CSV table to write (or to resume)")
    output_file("--out", own.out)
    command = args.target
    parser = target_parser(command)
    target = _target(command, parser)
    file_fixed, axes = _axes(own, parser, command)
    fixed, axes = grid.multi_value_axes(parser, tuple(file_fixed) + tuple(rest), axes)
    search = _search(own, command, fixed, axes)
    if own.per_stream and (command != "serve" or search is not None):
        raise ConfigError("--per-stream: applies to a serve sweep (not to --capacity or to " + command + ")"
                          if command == "serve" else f"--per-stream: applies to a serve sweep, not to {command}")
    if own.pareto is not None and search is not None:
        raise ConfigError("--pareto: marks the points of a plain sweep, not a --capacity search's rows")
    objectives = None if own.pareto is None else pareto.parse(own.pareto)
    points = grid.points(parser, fixed, axes)
    base = runner.config_of(parser.parse_args(list(fixed)))
    for axis in axes:
        base.pop(axis.dest, None)
    extra = {"capacity": dataclasses.asdict(search) if search else None, "per_stream": own.per_stream}
    sid = runner.sweep_id(command, base, [a.dest for a in axes], extra)
    cluster = clusters.connect(own)  # before any JAX computation (jax.distributed's rule)
    try:
        per_call = own.points_per_call or (1 if jax.default_backend() == "cpu" else 64)
        table = _open_table(own, sid, cluster)
        t0 = time.perf_counter()
        if search is None:
            summary = _plain(target, points, per_call, cluster, table, own.quiet, own.per_stream)
        else:
            summary = _capacity(target, points, per_call, cluster, table, own.quiet, search)
    finally:
        clusters.close(cluster)
    if not cluster.is_leader:
        return 0
    if objectives is not None:
        summary["pareto_points"] = _mark_pareto(table, objectives)
    rows = [r for r in table.rows.values() if r["row_kind"] in ("point", "capacity")]
    failed = sum(r.get("status") == "failed" for r in rows)
    emit({"out": own.out, "sweep_id": sid, "points": len(points), **summary, "failed_rows": failed,
          "seconds": round(time.perf_counter() - t0, 3)}, own.json)
    return 1 if failed else 0


def _mark_pareto(table, objectives) -> int:
    """The table's point rows given their ``pareto`` and ``pareto_ci`` columns; the size of the front."""
    from hbfjax.sweep import pareto

    where = [k for k in table.rows if k[0] == "point"]
    marks = pareto.mark([table.rows[k] for k in where], objectives)
    table.set_cells({where[i]: m for i, m in marks.items()})
    return sum(m["pareto"] for m in marks.values())


def _target(command: str, parser) -> runner.Target:
    """The subcommand as the runner takes it (``serve``'s points stack on a knob axis: it plans)."""
    from hbfjax.sweep import runner

    module = importlib.import_module(f"hbfjax.commands.{command}")
    return runner.Target(command, parser, module.compute, getattr(module, "plan", None),
                         getattr(module, "assemble", None))


def _open_table(own, sid: str, cluster) -> ResultTable | None:
    """The leader's table; a refusal (another sweep's file, say) reaches every process, so all stop."""
    from hbfjax.sweep.table import ResultTable

    table, error = None, None
    if cluster.is_leader:
        try:
            table = ResultTable(own.out, sid).open(own.retry_failed)
        except ConfigError as err:
            error = str(err)
    error = clusters.broadcast(cluster, error)
    if error is not None:
        raise ConfigError(error)
    return table


def _plain(target, points, per_call, cluster, table, quiet, per_stream) -> dict:
    from hbfjax.sweep import runner

    done = set(clusters.broadcast(cluster, sorted(table.done("point")) if cluster.is_leader else None))
    pending = [p for p in points if p.key not in done]
    if cluster.is_leader and done and not quiet:
        print(f"[sweep] resuming {table.path}: {len(points) - len(pending)} of {len(points)} points done",
              file=sys.stderr, flush=True)
    items = runner.work_items(target, points, per_call, done=frozenset(done), per_stream=per_stream)
    runner.execute(items, cluster, table, runner.Progress(len(pending), quiet=quiet or not cluster.is_leader))
    return {"computed_points": len(pending)}


def _search(own, command, fixed, axes) -> cap.Search | None:
    from hbfjax.sweep import capacity as cap
    from hbfjax.sweep import grid

    if not own.capacity:
        if own.slo or own.capacity_rates:
            raise ConfigError("--slo/--capacity-rates: apply with --capacity")
        return None
    if command != "serve":
        raise ConfigError(f"--capacity: searches serve's arrival rate, not {command}'s")
    if not own.slo:
        raise ConfigError("--capacity: give at least one --slo METRIC<=BOUND, e.g. --slo p90_ttft_s<=2")
    if own.capacity_rates is None:
        raise ConfigError("--capacity: give the first round's rates, e.g. --capacity-rates 0.25,0.5,1,2")
    rates = []
    for text in grid.split_values(own.capacity_rates, "--capacity-rates"):
        try:
            rate = float(text)
        except ValueError:
            rate = float("nan")
        if not rate > 0 or rate == float("inf"):
            raise ConfigError(f"--capacity-rates {own.capacity_rates}: {text!r} must be a rate > 0 in requests/s")
        rates.append(rate)
    taken = [a.dest for a in axes if a.dest in ("rate", "load", "trace")]
    taken += [t for t in fixed if t.split("=")[0] in ("--rate", "--load", "--trace")]
    if taken:
        raise ConfigError(f"--capacity: varies serve's --rate itself (Poisson arrivals); drop {', '.join(taken)}")
    return cap.Search(tuple(cap.Objective.parse(s) for s in own.slo), tuple(rates), own.refine_rounds,
                      own.refine_points)


def _capacity(target, points, per_call, cluster, table, quiet, search) -> dict:
    """The capacity search's rounds (``hbfjax.sweep.capacity``); every round's probes of every point run
    together, and the leader shares the probe rows so that every process plans the next round alike."""
    from hbfjax.sweep import capacity as cap
    from hbfjax.sweep import runner

    keep = ("status", "saturated") + tuple(c for o in search.objectives for c in (o.metric, "ci95_" + o.metric))
    computed = 0
    for round_ in range(search.refine_rounds + 1):
        rows = table.rows if cluster.is_leader else None
        shared = clusters.broadcast(cluster, None if rows is None else
                                    [[k, {c: r.get(c, "") for c in keep}] for k, r in rows.items() if k[0] == "probe"])
        shared = {tuple(k): r for k, r in shared}
        if round_ > 0:  # every process checks the same rows, so all stop together
            cap.require_metrics(search, shared)
        asked = cap.round_probes(points, search, round_, shared)
        if asked is None:
            break
        done = frozenset(q.key for q in asked if ("probe", q.key) in shared)
        items = runner.work_items(target, asked, per_call, row_kind="probe", done=done)
        progress = runner.Progress(len(asked) - len(done), f"probes (round {round_})", quiet or not cluster.is_leader)
        runner.execute(items, cluster, table, progress)
        computed += len(asked) - len(done)
    if cluster.is_leader:
        cap.require_metrics(search, table.rows)
        done = table.done("capacity")
        table.append([runner.point_row(target.name, p, None, result, None, 0.0, 0, row_kind="capacity", check=False)
                      for p, result in cap.results(points, search, table.rows) if p.key not in done])
    return {"computed_probes": computed}
