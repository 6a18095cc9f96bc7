"""Statistics of a request trace: size, duration, arrival rate, prompt and output token quantiles,
sessions, and how much of the prompts' block prefixes earlier requests already computed.

FILE is a path or a catalogued trace name (hbfjax traces list), in any supported schema (Azure 2023
CSV, Mooncake JSONL, SWE-bench CSV or per-session JSONL, Bailian JSONL). Units: seconds, requests per
second, tokens. Quantiles are linearly interpolated (NumPy's default). arrival_rate_per_s is
(requests − 1) / duration_s, the rate between the first and the last arrival. Sessions are the
schema's own (SWE-bench session ids, Bailian parent links) or rebuilt from block hashes (Mooncake:
each request's parent is the earlier request with the longest common block prefix, beyond the blocks
every request of the trace shares);
prefix_reusable_block_fraction is the fraction of all prompt blocks whose whole prefix, up to and
including that block, began an earlier request (null where the schema has no block hashes).
"""

from __future__ import annotations

import argparse

from hbfjax.commands._common import emit

QUANTILES = (50, 90, 99)


def _token_stats(name: str, tokens: np.ndarray) -> dict:
    import numpy as np

    q = np.percentile(tokens, QUANTILES)
    return {**{f"{name}_p{p}": float(v) for p, v in zip(QUANTILES, q)},
            f"{name}_mean": float(tokens.mean()), f"{name}_max": int(tokens.max())}


def reusable_block_fraction(trace: traces.Trace) -> float | None:
    """Fraction of all prompt blocks whose block prefix began an earlier request (None: no hashes)."""
    from hbfjax import traces

    if trace.block_hashes is None:
        return None
    total = sum(len(h) for h in trace.block_hashes)
    shared, _ = traces.shared_prefix_blocks(trace.block_hashes)
    return float(shared.sum() / total) if total else 0.0


def summary(trace: traces.Trace) -> dict:
    """The statistics ``trace-info`` prints, by key."""
    import numpy as np

    n, duration = len(trace), trace.duration_s
    sessions = int(np.unique(trace.session).size)
    return {"requests": n, "duration_s": duration,
            "arrival_rate_per_s": (n - 1) / duration if duration > 0 else None,
            **_token_stats("prompt_tokens", trace.input_tokens), **_token_stats("output_tokens", trace.output_tokens),
            "sessions": sessions, "mean_turns_per_session": n / sessions,
            "prefix_reusable_block_fraction": reusable_block_fraction(trace)}


def _run(args) -> int:
    from hbfjax import traces

    path = traces.resolve(args.file)
    emit({"trace": str(path), **summary(traces.load_trace(path))}, args.json)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("trace-info", help="statistics of a request trace (rate, token quantiles, sessions, "
                              "prefix reuse)", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="a trace file or folder, or a catalogued trace name")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=_run)
