"""``hbfjax profile``: time a model's GPU operator shapes with JAX on this machine's accelerator and
write the measured table (DASH §VI-A "Simulation")."""

from __future__ import annotations

import argparse
import time

from hbfjax.commands import _choices as names
from hbfjax.commands._common import emit, output_file
from hbfjax.validate import ConfigError, number

HELP = "time GPU operator shapes with JAX and write the measured-latency CSV"
DESCRIPTION = f"""\
Time the operators of one or more model presets on the accelerator at hand and write a CSV that the
timing model interpolates (log-log, only inside each shape's measured range).

Shapes: every weight matmul of the model (one copy; a routed expert is one GEMM of its rows) at
M = 1, 2, 4, ..., 8192 rows (tokens), one RMSNorm at the same token counts, decode attention of one
token over 128 ... 128K context tokens, and prefill attention of one {names.PROFILE_PREFILL_CHUNK}-token chunk whose
prefix + chunk = each context length. Each call is compiled first, warmed up, then timed with
block_until_ready; the CSV keeps the median in microseconds (us) with the device kind and the JAX
version. --quick times a handful of small shapes (tokens {list(names.PROFILE_QUICK_TOKENS)}, contexts
{list(names.PROFILE_QUICK_CONTEXTS)}, chunk {names.PROFILE_QUICK_CHUNK}): a tiny synthetic model without --model, or the
given models' shapes at those sizes.

Examples:
  hbfjax profile --quick --out /tmp/quick.csv
  hbfjax profile --model qwen3-235b-a22b --out h200_qwen3.csv
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=None, choices=list(names.MODELS), metavar="NAME",
                   help=f"model preset whose shapes to time (repeatable; one of {', '.join(names.MODELS)}); "
                        "required unless --quick")
    p.add_argument("--quick", action="store_true", help="a handful of small shapes (seconds on a CPU)")
    p.add_argument("--out", required=True, metavar="FILE.csv", help="CSV file to write (replaced atomically)")
    p.add_argument("--max-tokens", type=number(int, 1, 2**20), default=None,
                   help="largest GEMM row count to time, tokens (default 8192)")
    p.add_argument("--max-context", type=number(int, 1, 2**24), default=None,
                   help="largest attention context to time, tokens (default 131072)")
    p.add_argument("--warmup", type=number(int, 0, 1000), default=2, help="untimed calls before timing (default 2)")
    p.add_argument("--repeats", type=number(int, 1, 1000), default=5,
                   help="timed calls per shape; the CSV keeps their median (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def _shapes(args) -> list:
    from hbfjax.workload import models, profiler

    if not args.model:
        if not args.quick:
            raise ConfigError("--model = None: name at least one model preset, or use --quick")
        return profiler.quick_shapes()
    shapes = []
    for name in args.model:
        shapes += profiler.model_shapes(models.preset(name), name)
    return shapes


def run(args) -> int:
    import jax

    from hbfjax.workload import profile_table, profiler

    output_file("--out", args.out)
    shapes = _shapes(args)
    tokens = profiler.QUICK_TOKENS if args.quick else profiler.TOKENS
    contexts = profiler.QUICK_CONTEXTS if args.quick else profiler.CONTEXTS
    chunk = profiler.QUICK_CHUNK if args.quick else profiler.PREFILL_CHUNK
    if args.max_tokens is not None:
        tokens = tuple(t for t in tokens if t <= args.max_tokens) or (args.max_tokens,)
    if args.max_context is not None:
        contexts = tuple(c for c in contexts if c <= args.max_context) or (args.max_context,)
        chunk = min(chunk, max(contexts))
    t0 = time.perf_counter()
    rows = profiler.profile(shapes, tokens, contexts, chunk, args.warmup, args.repeats, progress=True)
    profile_table.write_csv(rows, args.out)
    emit({"out": str(args.out), "device": jax.devices()[0].device_kind, "jax_version": jax.__version__,
          "models": args.model or [profiler.QUICK_MODEL], "shapes": len(shapes), "rows": len(rows),
          "seconds": round(time.perf_counter() - t0, 3)}, args.json)
    return 0
