"""The model presets with their derived totals and sources.

Weight bytes count every decoder layer, the embedding and LM head (once when tied), the norms and the
multi-token-prediction modules a checkpoint ships (DASH Table II compares checkpoint sizes; the
`paper_weight_bytes` column is that table's value). KV bytes per token at the preset's KV precision
(`--kv-bytes-per-element 1` gives HBFlex §3.3's FP8 figures). Sizes in bytes; GB = 1e9 B.
"""

from __future__ import annotations

import argparse
import json

from hbfjax.commands import _choices as names
from hbfjax.validate import number


def _run(args) -> int:
    from hbfjax.invariants import jsonable
    from hbfjax.workload import models

    specs = [models.preset(n) for n in (args.names or models.PRESETS)]
    if args.kv_bytes_per_element is not None:
        specs = [s.with_kv_precision(args.kv_bytes_per_element) for s in specs]
    rows = [models.summary(s) for s in specs]
    if args.json:
        print(json.dumps(jsonable(rows)))
        return 0
    print(f"{'name':<20} {'layers':>6} {'moe':>4} {'experts':>8} {'top_k':>5} {'weights GB':>11} {'paper GB':>9} "
          f"{'experts GB':>11} {'KV B/token':>11}  estimated")
    for r in rows:
        paper = f"{r['paper_weight_bytes'] / 1e9:9.2f}" if r["paper_weight_bytes"] else f"{'-':>9}"
        experts = f"{r['routed_experts']}+{r['shared_experts']}"
        print(f"{r['name']:<20} {r['layers']:>6} {r['moe_layers']:>4} {experts:>8} {r['top_k']:>5} "
              f"{r['weight_bytes'] / 1e9:11.2f} {paper} {r['expert_weight_bytes'] / 1e9:11.2f} "
              f"{r['kv_bytes_per_token']:11.0f}  {', '.join(r['estimated_fields']) or '-'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="model presets with derived weight and KV bytes and their sources",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"presets to show (default all: {', '.join(names.MODEL_PRESETS)})")
    p.add_argument("--kv-bytes-per-element", type=number(float, 0.0, 8.0, lo_open=True), default=None,
                   help="KV cache precision in bytes per element (default: each preset's; 1 = FP8, 2 = BF16)")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects, one per model")
    p.set_defaults(func=_run)
