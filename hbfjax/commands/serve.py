"""``hbfjax serve``: a MoE model served with continuous batching on a DASH memory organisation."""

from __future__ import annotations

import argparse

import jax
import numpy as np

from hbfjax import batch
from hbfjax.commands._common import add_common_args, emit
from hbfjax.memory import organisations as orgs
from hbfjax.serve import metrics, system
from hbfjax.serve.state import MODES, BatcherConfig, BatcherKnobs
from hbfjax.validate import ConfigError, number
from hbfjax.workload import gpus, models, timing
from hbfjax.workload import requests as rq

HELP = """\
Serve a model on one or more memory organisations (DASH §IV-§VI) for many independent streams at
once: requests (a fixed batch, or Poisson arrivals) go through a Sarathi batcher (one decode token per
running request, then one prefill chunk per waiting request within the token budget); every pass
routes each MoE layer's tokens and times each operator as the longer of its GPU compute and the
delivery of its weights and KV by the organisation (replicated projections from HBM and HBF in
parallel, experts over Direct and Relay, tR hidden by lookahead unless the router has an expert bias).
Several --system values run as one compilation on common random numbers.

Not modelled yet (issue 11 continues): KV writes and their stalls (direct prefill write, decode
writeback), the per-request split of KV between HBM and HBF (--kv-hbm-fraction stands in), CPU
offloading systems, --load, --trace, SLO goodput.

Units: times in s (E2E, TTFT) and ms (TPOT), throughput in output tokens per second over the measured
requests (first measured arrival to last measured finish); decode_tokens_per_s is B·(L_out − 1) / T_decode
for a fixed batch. Means across streams with 95 % CI half-widths (ci95_*); p50/p90/p99 are per-stream
percentiles averaged over streams.
"""

SYSTEMS = tuple(orgs.ORGANISATIONS)


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a MoE model on DASH memory organisations (continuous batching)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", nargs="+", choices=SYSTEMS, default=["dash"],
                   help="memory organisations, several at once share one compilation (default dash)")
    p.add_argument("--model", choices=sorted(models.PRESETS), default="qwen3-235b-a22b", help="model preset")
    p.add_argument("--gpu", choices=sorted(gpus.PRESETS), default="h100-pcie", help="GPU preset (DASH: H100 PCIe)")
    w = p.add_argument_group("workload (a fixed batch unless --rate is given)")
    w.add_argument("--batch", type=number(int, 1, rq.MAX_REQUESTS), default=4, help="fixed batch size B (default 4)")
    w.add_argument("--prompt", type=number(int, 1, rq.MAX_TOKENS), default=1024, help="prompt tokens L_in (default 1024)")
    w.add_argument("--output", type=number(int, 1, rq.MAX_TOKENS), default=128, help="output tokens L_out (default 128)")
    w.add_argument("--rate", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="Poisson arrivals at this rate in requests/s instead of a fixed batch")
    w.add_argument("--requests", type=number(int, 1, rq.MAX_REQUESTS), default=1152,
                   help="requests per stream with --rate (default 1,152 = DASH §VI-E's 128 + 1,024)")
    w.add_argument("--warmup", type=number(int, 0, rq.MAX_REQUESTS), default=128,
                   help="leading requests excluded from the metrics with --rate (default 128)")
    b = p.add_argument_group("batcher (DASH §VI-E)")
    b.add_argument("--mode", choices=MODES, default="mixed", help="mixed or serial passes, or strict alternation")
    b.add_argument("--slots", type=number(int, 1, 4096), default=None,
                   help="running requests at most B_max (default: --batch, or 32 with --rate)")
    b.add_argument("--chunk-tokens", type=number(int, 1, 2**20), default=512, help="prefill chunk tokens (default 512)")
    b.add_argument("--token-budget", type=number(int, 1, 2**20), default=8192,
                   help="tokens per iteration (default 8,192)")
    h = p.add_argument_group("memory (defaults: each organisation's DASH values)")
    h.add_argument("--lookahead", action=argparse.BooleanOptionalAction, default=True,
                   help="early expert selection hides tR (always off for routers with an expert bias)")
    h.add_argument("--t-read-us", type=number(float, 0.0, 1e6, lo_open=True), default=None, help="HBF tR in µs")
    h.add_argument("--t-prog-us", type=number(float, 0.0, 1e6, lo_open=True), default=None, help="HBF tPROG in µs")
    h.add_argument("--link-tbps", type=number(float, 0.0, 1e3, lo_open=True), default=None,
                   help="every D2D link's usable rate in TB/s (default 1.6)")
    h.add_argument("--kv-hbm-fraction", type=number(float, 0.0, 1.0), default=0.0,
                   help="share of the KV attention reads that is held in HBM (stand-in; default 0: all in HBF)")
    add_common_args(p, default_streams=64)
    p.set_defaults(func=run)


def _org(name: str, args) -> orgs.OrgKnobs:
    changes = {"lookahead": 1 if args.lookahead else 0}
    if args.t_read_us is not None:
        changes["t_read_us"] = args.t_read_us
    if args.t_prog_us is not None:
        changes["t_prog_us"] = args.t_prog_us
    link = None if args.link_tbps is None else args.link_tbps * 1e3
    return orgs.ORGANISATIONS[name](link_gbps=link, **changes)


def _config(args, model) -> tuple[system.ServeConfig, rq.RequestKnobs, int, int | None]:
    lengths = dict(prompt=rq.LengthKnobs.make(args.prompt), output=rq.LengthKnobs.make(args.output))
    if args.rate is None:
        slots = args.slots or args.batch
        config = rq.RequestsConfig(requests=args.batch, arrivals="batch")
        knobs = rq.RequestKnobs.make(batch=args.batch, **lengths)
        warmup, measured = 0, None
    else:
        if args.warmup >= args.requests:
            raise ConfigError(f"--warmup = {args.warmup}: must be below --requests = {args.requests}")
        slots = args.slots or 32
        config = rq.RequestsConfig(requests=args.requests, arrivals="poisson")
        knobs = rq.RequestKnobs.make(rate_per_s=args.rate, **lengths)
        warmup, measured = args.warmup, None
    pass_tokens = min(args.token_budget, slots + slots * args.chunk_tokens)
    serve = system.ServeConfig(model=model, batcher=BatcherConfig(slots=slots, mode=args.mode), requests=config,
                               max_pass_tokens=pass_tokens)
    return serve, knobs, warmup, measured


def run(args) -> int:
    model = models.preset(args.model)
    config, request_knobs, warmup, measured = _config(args, model)
    gpu = timing.GpuKnobs.make(args.gpu)
    batcher = BatcherKnobs.make(chunk_tokens=args.chunk_tokens, token_budget=args.token_budget)
    points = [system.ServeKnobs.make(_org(n, args), gpu, batcher, request_knobs, kv_hbm_fraction=args.kv_hbm_fraction)
              for n in args.system]
    several = len(points) > 1
    knobs = batch.stack_knobs(points) if several else points[0]
    out = batch.run(system.simulate, args.streams, args.seed, knobs, config, knob_axis=several,
                    chunk_streams=args.chunk_streams, progress=args.chunk_streams is not None)
    results = []
    for k, name in enumerate(args.system):
        o = jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) if several else out
        s = metrics.summary(metrics.times(o.arrival, o.first_token, o.finish, o.tokens_out, o.valid), warmup, measured)
        if args.rate is None:  # every request arrives at t = 0: no arrival rate, Little's law is void
            s = {key: v for key, v in s.items() if "arrival_rate" not in key and "requests_in_system" not in key}
        results.append({"system": name, **s, "iterations_mean": float(np.mean(o.iterations)),
                        "overflow": bool(np.any(o.overflow))})
    header = {"model": args.model, "gpu": args.gpu, "streams": args.streams, "seed": args.seed,
              "lookahead_effective": bool(args.lookahead and model.lookahead_capable)}
    if not several:
        emit({**header, **results[0]}, args.json)
    else:
        emit({**header, "systems": results}, args.json)
    return 0
