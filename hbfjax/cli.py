"""The ``hbfjax`` command. Each subcommand lives in ``hbfjax/commands/<name>.py`` and exposes
``register(subparsers)``; this module only discovers and dispatches them."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys

from hbfjax import commands
from hbfjax.validate import ConfigError, UsageError

DESCRIPTION = """\
Batched Monte Carlo of High-Bandwidth Flash (HBF) memory for LLM inference.

Units everywhere: times in µs (t_read_us), bandwidths in GB/s (1e9 B/s), sizes in bytes unless a
name says KiB/MiB (powers of two) or KB/MB/GB (powers of ten). Every subcommand takes --json for one
machine-readable JSON object on stdout, --streams for the number of independent Monte Carlo streams
and --seed for reproducibility; confidence intervals are 95 % half-widths across streams.
"""


def command_modules():
    """The subcommand modules in ``hbfjax.commands`` (private ``_*`` helpers excluded), by name. They
    import JAX and the simulator only inside the functions that run, so building the parser is fast."""
    names = sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))
    return [importlib.import_module(f"hbfjax.commands.{name}") for name in names]


# argparse's "argument --flag: <text>: <rule>" from a hbfjax.validate.number type
_TYPE_ERROR = re.compile(r"argument (--[\w-]+)(?:/\S+)?: (\S*): (must .*)")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors become one line (``prog: error: --flag = value: rule``) that
    ``main`` prints with exit status 2, like every ``ConfigError`` of a run; ``--help`` still exits 0."""

    def error(self, message: str):
        m = _TYPE_ERROR.fullmatch(message)
        if m:
            message = f"{m.group(1)} = {m.group(2)}: {m.group(3)}"
        raise UsageError(self.prog, " ".join(message.split()))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hbfjax", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in command_modules():
        module.register(sub)
    return parser


def _trace_error() -> tuple[type, ...]:
    """``hbfjax.traces.TraceError`` once that module is loaded, else nothing: a trace error can only
    have been raised by then, and ``--help`` need not import the trace readers."""
    traces = sys.modules.get("hbfjax.traces")
    return (traces.TraceError,) if traces is not None else ()


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A ``UsageError``, ``ConfigError`` or ``TraceError`` (a bad option, config, file
    or trace; the files a command reads and writes are checked before its work, ``commands._common``)
    is one line on stderr and exit status 2, with nothing on stdout; any other exception is a bug and
    propagates with its traceback."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as err:
        print(f"{err.prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as err:  # a subcommand that parses more of its command line (sweep's target options)
        print(f"hbfjax {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (ConfigError, *_trace_error()) as err:
        print(f"hbfjax {args.command}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
