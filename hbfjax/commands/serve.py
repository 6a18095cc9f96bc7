"""``hbfjax serve``: a MoE model served with continuous batching on a DASH memory organisation."""

from __future__ import annotations

import argparse

import jax
import numpy as np

from hbfjax import batch, traces
from hbfjax.commands._common import add_common_args, emit
from hbfjax.memory import organisations as orgs
from hbfjax.serve import metrics, system
from hbfjax.serve.state import MODES, BatcherConfig, BatcherKnobs
from hbfjax.reports import mean_ci_fields
from hbfjax.validate import ConfigError, number
from hbfjax.workload import gpus, models, profile_table, timing
from hbfjax.workload import requests as rq

HELP = """\
Serve a model on one or more memory organisations (DASH §IV-§VI) for many independent streams at
once: requests (a fixed batch, or Poisson arrivals) go through a Sarathi batcher (one decode token per
running request, then one prefill chunk per waiting request within the token budget); every pass
routes each MoE layer's tokens and times each operator as the longer of its GPU compute and the
delivery of its weights and KV by the organisation (replicated projections from HBM and HBF in
parallel, experts over Direct and Relay, tR hidden by lookahead unless the router has an expert bias).
Several --system values run as one compilation on common random numbers.

Each request's KV is tracked in HBM and HBF: prefill KV is written straight to HBF, decode KV is
appended in HBM and written back to HBF in page waves once the HBM KV budget (--hbm-kv-budget-gb;
default: the HBM the weights leave) is exceeded; attention reads both tiers in parallel, and what the
writes' programs take beyond each layer's attention window is an exposed stall (write_stall_s).
Admission reserves each request's whole KV within the HBM budget plus the HBF the weights leave.

Not modelled yet: plane collisions between HBF reads and programs, GC, prefix reuse.

Units: times in s (E2E, TTFT) and ms (TPOT), throughput in output tokens per second over the measured
requests (first measured arrival to last measured finish); decode_tokens_per_s is B·(L_out − 1) / T_decode
for a fixed batch. Means across streams with 95 % CI half-widths (ci95_*); p50/p90/p99 are per-stream
percentiles averaged over streams. Utilisations are bytes over what the path could carry in the busy
time (iterations with work); occupancies are time averages over the busy time.
"""

SYSTEMS = tuple(orgs.ORGANISATIONS)


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a MoE model on DASH memory organisations (continuous batching)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", nargs="+", choices=SYSTEMS, default=["dash"],
                   help="memory organisations, several at once share one compilation (default dash)")
    p.add_argument("--model", choices=sorted(models.PRESETS), default="qwen3-235b-a22b", help="model preset")
    p.add_argument("--gpu", choices=sorted(gpus.PRESETS), default="h100-pcie", help="GPU preset (DASH: H100 PCIe)")
    w = p.add_argument_group("workload (a fixed batch unless --rate or --trace is given)")
    w.add_argument("--batch", type=number(int, 1, rq.MAX_REQUESTS), default=4, help="fixed batch size B (default 4)")
    w.add_argument("--prompt", type=number(int, 1, rq.MAX_TOKENS), default=1024, help="prompt tokens L_in (default 1024)")
    w.add_argument("--output", type=number(int, 1, rq.MAX_TOKENS), default=128, help="output tokens L_out (default 128)")
    w.add_argument("--rate", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="Poisson arrivals at this rate in requests/s instead of a fixed batch")
    w.add_argument("--trace", default=None, metavar="FILE",
                   help="replay a request trace (arrivals and lengths; a path or a name from `hbfjax traces`)")
    w.add_argument("--rate-factor", type=number(float, 0.0, 1e3, lo_open=True), default=1.0,
                   help="with --trace: divide the trace's time axis by this (default 1)")
    w.add_argument("--requests", type=number(int, 1, rq.MAX_REQUESTS), default=1152,
                   help="requests per stream with --rate or --trace (default 1,152 = DASH §VI-E's 128 + 1,024)")
    w.add_argument("--warmup", type=number(int, 0, rq.MAX_REQUESTS), default=128,
                   help="leading requests excluded from the metrics with --rate or --trace (default 128)")
    w.add_argument("--slo-ttft-s", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="TTFT objective in s: adds slo_attainment and goodput_{requests,tokens}_per_s")
    w.add_argument("--slo-tpot-ms", type=number(float, 0.0, 1e9, lo_open=True), default=None,
                   help="TPOT objective in ms (with or without --slo-ttft-s)")
    b = p.add_argument_group("batcher (DASH §VI-E)")
    b.add_argument("--mode", choices=MODES, default="mixed", help="mixed or serial passes, or strict alternation")
    b.add_argument("--slots", type=number(int, 1, 4096), default=None,
                   help="running requests at most B_max (default: --batch, or 32 with --rate)")
    b.add_argument("--chunk-tokens", type=number(int, 1, 2**20), default=512, help="prefill chunk tokens (default 512)")
    b.add_argument("--token-budget", type=number(int, 1, 2**20), default=8192,
                   help="tokens per iteration (default 8,192)")
    p.add_argument("--profile-table", default=None, metavar="CSV",
                   help="GPU operator times from a measured table (`hbfjax profile --out`) instead of the roofline")
    p.add_argument("--allow-roofline", action="store_true",
                   help="with --profile-table: use the roofline for shapes outside the table instead of refusing")
    h = p.add_argument_group("memory (defaults: each organisation's DASH values)")
    h.add_argument("--lookahead", action=argparse.BooleanOptionalAction, default=True,
                   help="early expert selection hides tR (always off for routers with an expert bias)")
    h.add_argument("--t-read-us", type=number(float, 0.0, 1e6, lo_open=True), default=None, help="HBF tR in µs")
    h.add_argument("--t-prog-us", type=number(float, 0.0, 1e6, lo_open=True), default=None, help="HBF tPROG in µs")
    h.add_argument("--link-tbps", type=number(float, 0.0, 1e3, lo_open=True), default=None,
                   help="every D2D link's usable rate in TB/s (default 1.6)")
    h.add_argument("--page-kib", type=number(int, 1, 1024), default=None,
                   help="HBF page in KiB (default 4); the SRAM transfer regions scale with the page wave (DASH §VI-F)")
    h.add_argument("--hbm-kv-budget-gb", type=number(float, 0.0, 1e6), default=None,
                   help="HBM-resident KV (GB) above which decode KV is written back to HBF "
                        "(default: the HBM the placed weights leave; DASH §VI-F states 24.46 GB for Llama 4 Maverick)")
    add_common_args(p, default_streams=64)
    p.set_defaults(func=run)


def _org(name: str, args) -> orgs.OrgKnobs:
    changes = {"lookahead": 1 if args.lookahead else 0}
    if args.t_read_us is not None:
        changes["t_read_us"] = args.t_read_us
    if args.t_prog_us is not None:
        changes["t_prog_us"] = args.t_prog_us
    if args.page_kib is not None:  # DASH §VI-F: the transfer region scales with the bytes of a page wave
        base = orgs.dash()
        scale = args.page_kib * 1024 / float(base.page_bytes)
        changes.update(page_bytes=args.page_kib * 1024, hbf_sram_region_bytes=float(base.hbf_sram_region_bytes) * scale)
    link = None if args.link_tbps is None else args.link_tbps * 1e3
    return orgs.ORGANISATIONS[name](link_gbps=link, **changes)


def _workload(args) -> tuple[rq.RequestsConfig, rq.RequestKnobs, rq.TraceInputs | None, int, int]:
    """The request stream: (config, knobs, trace inputs, slots, warm-up requests)."""
    lengths = dict(prompt=rq.LengthKnobs.make(args.prompt), output=rq.LengthKnobs.make(args.output))
    if args.rate is not None and args.trace is not None:
        raise ConfigError("--rate and --trace: give one (a trace brings its own arrivals)")
    if args.rate is None and args.trace is None:
        config = rq.RequestsConfig(requests=args.batch, arrivals="batch")
        return config, rq.RequestKnobs.make(batch=args.batch, **lengths), None, args.slots or args.batch, 0
    if args.warmup >= args.requests:
        raise ConfigError(f"--warmup = {args.warmup}: must be below --requests = {args.requests}")
    if args.trace is None:
        config = rq.RequestsConfig(requests=args.requests, arrivals="poisson")
        return config, rq.RequestKnobs.make(rate_per_s=args.rate, **lengths), None, args.slots or 32, args.warmup
    trace = traces.load_trace(traces.resolve(args.trace))
    config = rq.RequestsConfig(requests=args.requests, arrivals="trace")
    inputs = rq.TraceInputs.from_trace(trace, args.requests)
    return config, rq.RequestKnobs.make(rate_factor=args.rate_factor), inputs, args.slots or 32, args.warmup


def _config(args, model) -> tuple[system.ServeConfig, rq.RequestKnobs, rq.TraceInputs | None, int]:
    requests, knobs, inputs, slots, warmup = _workload(args)
    pass_tokens = min(args.token_budget, slots + slots * args.chunk_tokens)
    serve = system.ServeConfig(model=model, batcher=BatcherConfig(slots=slots, mode=args.mode), requests=requests,
                               max_pass_tokens=pass_tokens, allow_roofline=args.allow_roofline)
    return serve, knobs, inputs, warmup


def _report(o, org, warmup: int, online: bool, slo) -> dict:
    """One organisation's JSON: request metrics, run totals and utilisations, means with CIs."""
    s = metrics.summary(metrics.times(o.arrival, o.first_token, o.finish, o.tokens_out, o.valid), warmup, None, slo)
    if not online:  # every request arrives at t = 0: no arrival rate, Little's law is void
        s = {key: v for key, v in s.items() if "arrival_rate" not in key and "requests_in_system" not in key}
    per_stream = system.totals_report(o.totals, org)
    run = mean_ci_fields(per_stream, tuple(per_stream))
    util = {k[len("utilisation_"):]: v for k, v in run.items() if k.startswith("utilisation_")}
    run = {k: v for k, v in run.items() if "utilisation_" not in k}
    return {**s, **run, "utilisation": util, "iterations_mean": float(np.mean(o.iterations)),
            "overflow": bool(np.any(o.overflow))}


def run(args) -> int:
    model = models.preset(args.model)
    config, request_knobs, inputs, warmup = _config(args, model)
    gpu = timing.GpuKnobs.make(args.gpu)
    batcher = BatcherKnobs.make(chunk_tokens=args.chunk_tokens, token_budget=args.token_budget)
    budget = None if args.hbm_kv_budget_gb is None else args.hbm_kv_budget_gb * 1e9
    org_knobs = [_org(n, args) for n in args.system]
    points = [system.ServeKnobs.make(o, gpu, batcher, request_knobs, hbm_kv_budget_bytes=budget) for o in org_knobs]
    several = len(points) > 1
    knobs = batch.stack_knobs(points) if several else points[0]
    if args.allow_roofline and args.profile_table is None:
        raise ConfigError("--allow-roofline: applies only with --profile-table")
    table = None if args.profile_table is None else profile_table.ProfileTable.read(args.profile_table).curves()
    out = batch.run(system.simulate, args.streams, args.seed, knobs, config,
                    inputs=system.ServeInputs(trace=inputs, table=table), knob_axis=several,
                    chunk_streams=args.chunk_streams, progress=args.chunk_streams is not None)
    if np.any(np.asarray(out.totals.table_miss_passes) > 0):
        raise ConfigError(f"--profile-table {args.profile_table}: some operator shapes of this run lie outside the "
                          "measured table; profile them (hbfjax profile --model ...) or pass --allow-roofline")
    slo = None if args.slo_ttft_s is None and args.slo_tpot_ms is None else metrics.Slo(args.slo_ttft_s, args.slo_tpot_ms)
    results = []
    for k, name in enumerate(args.system):
        o = jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) if several else out
        results.append({"system": name, **_report(o, org_knobs[k], warmup, config.requests.arrivals != "batch", slo)})
    header = {"model": args.model, "gpu": args.gpu, "streams": args.streams, "seed": args.seed,
              "lookahead_effective": bool(args.lookahead and model.lookahead_capable)}
    if not model.lookahead_capable and args.lookahead:
        header["note"] = f"{args.model}'s router has an expert-specific bias: lookahead is off (DASH §V-C)"
    if not several:
        emit({**header, **results[0]}, args.json)
    else:
        emit({**header, "systems": results}, args.json)
    return 0
