"""``hbfjax serve``: a MoE model served with continuous batching on a DASH memory organisation."""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import batch, traces
from hbfjax.commands._common import add_common_args, emit
from hbfjax.memory import hbf_packages
from hbfjax.memory import organisations as orgs
from hbfjax.serve import hbflex_system, load, metrics, offload_system, system
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

The CPU-offloading baselines (DASH §VI-C) serve the same requests with the same routing draws on an
H100 PCIe with no HBF: a fixed number of experts per layer resident in its 80 GB (0.9 × HBM minus the
non-expert weights, the run's KV and a one-layer staging buffer); cpu-stream copies every other needed
expert over PCIe Gen5 x16 and computes it on the GPU; cpu-compute runs it on a Xeon Platinum 8452Y,
one expert per core under --cores; hybrid is the per-layer oracle over CPU/GPU splits (a lower bound).
They compile apart from the HBF organisations and report request metrics only.

The organisations of HBFlex's evaluation (HBFlex §6.1: hbflex, naive-hbf, h3, fa-cli, fa-csi, is; six
stack sites of an H200-class GPU) serve on the same engine with each request's KV managed as the HBFlex
runtime sees it: KV retained after a request ends and reused by its session's later turns in whole
logical pages, sessions evicted least recently used at 90 % of the HBF KV room; HBF KV reads through
plane collisions (random pages or plane-balanced stripes, placement-aware scheduling, hot-plane offload
to SRAM or HBM); new KV programmed immediately, in stripes or inside read-free windows with weight
prefetch (forced writeback when the SRAM budget is exceeded); a scaled block store per stream whose GC
migrations are added to the iterations. --disable turns HBFlex mechanisms off for an ablation. They use
HBFlex's 1-byte KV elements and compile apart from the DASH organisations.

Not modelled yet: plane collisions between DASH reads and programs; shared-prefix replicas; data and
tensor parallelism (one GPU and package per stream); for the CPU systems, CPU dispatch overhead, PCIe
setup latency, reuse of streamed experts, KV writes.

Units: times in s (E2E, TTFT) and ms (TPOT), throughput in output tokens per second over the measured
requests (first measured arrival to last measured finish); decode_tokens_per_s is B·(L_out − 1) / T_decode
for a fixed batch. Means across streams with 95 % CI half-widths (ci95_*); p50/p90/p99 are per-stream
percentiles averaged over streams. Utilisations are bytes over what the path could carry in the busy
time (iterations with work); occupancies are time averages over the busy time.
"""

CPU_SYSTEMS = ("cpu-stream", "cpu-compute", "hybrid")  # DASH §VI-C baselines (offload_system.SYSTEMS)
HBFLEX_SYSTEMS = tuple(hbf_packages.PACKAGES)  # HBFlex §6.1 organisations (hbflex_system)
SYSTEMS = tuple(orgs.ORGANISATIONS) + HBFLEX_SYSTEMS + CPU_SYSTEMS


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a MoE model on DASH memory organisations (continuous batching)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", nargs="+", choices=SYSTEMS, default=["dash"],
                   help="memory organisations, several at once share one compilation (default dash)")
    p.add_argument("--cores", type=number(int, 1, 4096), default=32,
                   help="host cores the CPU systems may use (default 32, DASH Fig. 10(b))")
    p.add_argument("--model", choices=sorted(models.PRESETS), default="qwen3-235b-a22b", help="model preset")
    p.add_argument("--gpu", choices=sorted(gpus.PRESETS), default=None,
                   help="GPU preset (default: h100-pcie, DASH's; h200 when only HBFlex organisations are served)")
    w = p.add_argument_group("workload (a fixed batch unless --rate or --trace is given)")
    w.add_argument("--batch", type=number(int, 1, rq.MAX_REQUESTS), default=4, help="fixed batch size B (default 4)")
    w.add_argument("--prompt", type=number(int, 1, rq.MAX_TOKENS), default=1024, help="prompt tokens L_in (default 1024)")
    w.add_argument("--output", type=number(int, 1, rq.MAX_TOKENS), default=128, help="output tokens L_out (default 128)")
    w.add_argument("--rate", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="Poisson arrivals at this rate in requests/s instead of a fixed batch")
    w.add_argument("--load", type=number(float, 0.0, 10.0, lo_open=True), default=None,
                   help="Poisson arrivals at this fraction of --load-reference's backlogged throughput "
                        "(DASH §VI-E: 0.5, 0.75, 0.9), measured first in the same run")
    w.add_argument("--load-reference", choices=tuple(orgs.ORGANISATIONS), default="relay-only",
                   help="the organisation whose backlogged throughput --load scales (default relay-only)")
    w.add_argument("--trace", default=None, metavar="FILE",
                   help="replay a request trace (arrivals and lengths; a path or a name from `hbfjax traces`)")
    w.add_argument("--rate-factor", type=number(float, 0.0, 1e3, lo_open=True), default=1.0,
                   help="with --trace: divide the trace's time axis by this (default 1)")
    w.add_argument("--concurrency", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="with --trace: resample its sessions (bootstrap) with session starts at the rate that keeps "
                        "this many sessions open on average (HBFlex Fig. 16: concurrent SWE-bench tasks)")
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
    x = p.add_argument_group("HBFlex organisations (HBFlex §5)")
    x.add_argument("--disable", default="", metavar="LIST",
                   help="comma-separated HBFlex mechanisms to turn off: " + ",".join(hbf_packages.MECHANISMS))
    x.add_argument("--kv-room-gb", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="HBF KV room per package in GB (default: the HBF the weights leave); a smaller room makes "
                        "a short run evict and collect as a long one does")
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
    given = [f for f, v in (("--rate", args.rate), ("--load", args.load), ("--trace", args.trace)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: give one (each sets the arrivals)")
    if args.load is not None:  # the rate is set once the reference's backlogged throughput is known
        args = argparse.Namespace(**{**vars(args), "rate": 1.0})
    if args.rate is None and args.trace is None:
        config = rq.RequestsConfig(requests=args.batch, arrivals="batch")
        return config, rq.RequestKnobs.make(batch=args.batch, **lengths), None, args.slots or args.batch, 0
    if args.warmup >= args.requests:
        raise ConfigError(f"--warmup = {args.warmup}: must be below --requests = {args.requests}")
    if args.trace is None:
        config = rq.RequestsConfig(requests=args.requests, arrivals="poisson")
        return config, rq.RequestKnobs.make(rate_per_s=args.rate, **lengths), None, args.slots or 32, args.warmup
    trace = traces.load_trace(traces.resolve(args.trace))
    inputs = rq.TraceInputs.from_trace(trace, args.requests)
    if args.concurrency is None:
        config = rq.RequestsConfig(requests=args.requests, arrivals="trace")
        return config, rq.RequestKnobs.make(rate_factor=args.rate_factor), inputs, args.slots or 32, args.warmup
    config = rq.RequestsConfig(requests=args.requests, arrivals="trace", replay="bootstrap")
    factor = rq.concurrency_rate_factor(inputs, args.concurrency)
    knobs = rq.RequestKnobs.make(rate_factor=args.rate_factor, session_rate_factor=factor)
    return config, knobs, inputs, args.slots or 32, args.warmup


def _config(args, model) -> tuple[system.ServeConfig, rq.RequestKnobs, rq.TraceInputs | None, int]:
    requests, knobs, inputs, slots, warmup = _workload(args)
    pass_tokens = system.pass_token_bound(slots, args.chunk_tokens, args.token_budget)
    serve = system.ServeConfig(model=model, batcher=BatcherConfig(slots=slots, mode=args.mode), requests=requests,
                               max_pass_tokens=pass_tokens, allow_roofline=args.allow_roofline)
    return serve, knobs, inputs, warmup


def _run_points(simulate, points, args, config, run_kw):
    """One compilation for every point (a knob axis when there are several)."""
    several = len(points) > 1
    knobs = batch.stack_knobs(points) if several else points[0]
    return batch.run(simulate, args.streams, args.seed, knobs, config, knob_axis=several, **run_kw)


def _report(o, org, warmup: int, online: bool, slo) -> dict:
    """One system's JSON: request metrics, and for an HBF organisation (``org``) the run totals and
    utilisations; means with CIs."""
    s = metrics.summary(metrics.times(o.arrival, o.first_token, o.finish, o.tokens_out, o.valid), warmup, None, slo)
    if not online:  # every request arrives at t = 0: no arrival rate, Little's law is void
        s = {key: v for key, v in s.items() if "arrival_rate" not in key and "requests_in_system" not in key}
    extra = {"iterations_mean": float(np.mean(o.iterations)), "overflow": bool(np.any(o.overflow))}
    if org is None:
        return {**s, **extra}
    per_stream = system.totals_report(o.totals, org)
    run = mean_ci_fields(per_stream, tuple(per_stream))
    util = {k[len("utilisation_"):]: v for k, v in run.items() if k.startswith("utilisation_")}
    run = {k: v for k, v in run.items() if "utilisation_" not in k}
    return {**s, **run, "utilisation": util, **extra}


def _hbflex_packages(names, args) -> list[hbf_packages.Package]:
    off = [m for m in args.disable.split(",") if m]
    packages = [hbf_packages.package(n) for n in names]
    return [p._replace(policy=hbf_packages.disable(p.policy, off)) if off else p for p in packages]


def _run_hbflex(names, args, config, gpu, batcher, request_knobs, run_kw, warmup, online, slo) -> dict:
    """The HBFlex organisations as one compilation; their JSON by name."""
    model = config.model.with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
    hconfig = hbflex_system.HbflexConfig(serve=dataclasses.replace(config, model=model))
    packages = _hbflex_packages(names, args)
    points = [hbflex_system.HbflexKnobs.make(p, gpu, batcher, request_knobs,
                                             kv_room_bytes=None if args.kv_room_gb is None else args.kv_room_gb * 1e9)
              for p in packages]
    out = _run_points(hbflex_system.simulate, points, args, hconfig, run_kw)
    result = {}
    for k, name in enumerate(names):
        o = jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) if len(points) > 1 else out
        extra = hbflex_system.report(o)
        result[name] = {**_report(o.serve, packages[k].org, warmup, online, slo), **mean_ci_fields(extra, tuple(extra))}
    return result


def run(args) -> int:
    model = models.preset(args.model)
    config, request_knobs, inputs, warmup = _config(args, model)
    hbflex_names = [n for n in args.system if n in HBFLEX_SYSTEMS]
    if args.gpu is None:
        args.gpu = "h200" if len(hbflex_names) == len(args.system) else "h100-pcie"
    if (args.disable or args.kv_room_gb is not None) and not hbflex_names:
        raise ConfigError("--disable/--kv-room-gb: apply to the HBFlex organisations " + ", ".join(HBFLEX_SYSTEMS))
    if args.concurrency is not None and args.trace is None:
        raise ConfigError("--concurrency: needs --trace (it resamples the trace's sessions)")
    gpu = timing.GpuKnobs.make(args.gpu)
    batcher = BatcherKnobs.make(chunk_tokens=args.chunk_tokens, token_budget=args.token_budget)
    if args.allow_roofline and args.profile_table is None:
        raise ConfigError("--allow-roofline: applies only with --profile-table")
    if len(set(args.system)) < len(args.system):
        raise ConfigError(f"--system {' '.join(args.system)}: each system once")
    cpu_names = [n for n in args.system if n in CPU_SYSTEMS]
    if cpu_names and not model.is_moe:
        raise ConfigError(f"--system {' '.join(cpu_names)}: the CPU-offloading systems serve MoE models "
                          f"({args.model} is dense)")
    if cpu_names and args.profile_table is not None:
        raise ConfigError("--profile-table: applies to the HBF organisations only, not to --system " + " ".join(cpu_names))
    slo = None if args.slo_ttft_s is None and args.slo_tpot_ms is None else metrics.Slo(args.slo_ttft_s, args.slo_tpot_ms)
    online = config.requests.arrivals != "batch"
    load_header = {}
    if args.load is not None:
        ref = system.ServeKnobs.make(_org(args.load_reference, args), gpu, batcher, request_knobs)
        mean, ci = load.backlogged_rate_per_s(ref, config, args.streams, args.seed, warmup, args.requests - warmup)
        rate = load.rate_for_load(args.load, mean)
        request_knobs = dataclasses.replace(request_knobs, rate_per_s=jnp.float32(rate))
        load_header = {"load": args.load, "load_reference": args.load_reference,
                       "reference_backlogged_requests_per_s": mean, "ci95_reference_backlogged_requests_per_s": ci,
                       "offered_rate_per_s": rate}
    by_name = {}
    org_names = [n for n in args.system if n not in CPU_SYSTEMS and n not in HBFLEX_SYSTEMS]
    run_kw = dict(inputs=inputs, chunk_streams=args.chunk_streams, progress=args.chunk_streams is not None)
    if org_names:
        budget = None if args.hbm_kv_budget_gb is None else args.hbm_kv_budget_gb * 1e9
        org_knobs = [_org(n, args) for n in org_names]
        table = None if args.profile_table is None else profile_table.ProfileTable.read(args.profile_table).curves()
        points = [system.ServeKnobs.make(o, gpu, batcher, request_knobs, hbm_kv_budget_bytes=budget) for o in org_knobs]
        out = _run_points(system.simulate, points, args, config, dict(run_kw, inputs=system.ServeInputs(inputs, table)))
        if np.any(np.asarray(out.totals.table_miss_passes) > 0):
            raise ConfigError(f"--profile-table {args.profile_table}: some operator shapes of this run lie outside the "
                              "measured table; profile them (hbfjax profile --model ...) or pass --allow-roofline")
        for k, name in enumerate(org_names):
            o = jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) if len(points) > 1 else out
            by_name[name] = _report(o, org_knobs[k], warmup, online, slo)
    if hbflex_names:
        if args.profile_table is not None:
            raise ConfigError("--profile-table: applies to the DASH organisations only, not to " + " ".join(hbflex_names))
        by_name.update(_run_hbflex(hbflex_names, args, config, gpu, batcher, request_knobs, run_kw, warmup, online,
                                   slo))
    if cpu_names:
        kv_tokens = config.batcher.slots * (args.prompt + args.output) if inputs is None else None
        if inputs is not None:  # a trace: the slots × its longest request
            kv_tokens = config.batcher.slots * int(np.max(np.asarray(inputs.prompt_tokens) + np.asarray(inputs.output_tokens)))
        points = [offload_system.OffloadServeKnobs.make(model, args.gpu, args.cores, n, kv_tokens=kv_tokens,
                                                        batcher=batcher, requests=request_knobs) for n in cpu_names]
        out = _run_points(offload_system.simulate, points, args, config, run_kw)
        for k, name in enumerate(cpu_names):
            o = jax.tree_util.tree_map(lambda a, k=k: a[:, k], out) if len(points) > 1 else out
            by_name[name] = _report(o, None, warmup, online, slo)
    results = [{"system": name, **by_name[name]} for name in args.system]
    header = {"model": args.model, "gpu": args.gpu, "streams": args.streams, "seed": args.seed,
              "lookahead_effective": bool(args.lookahead and model.lookahead_capable), **load_header}
    if not model.lookahead_capable and args.lookahead:
        header["note"] = f"{args.model}'s router has an expert-specific bias: lookahead is off (DASH §V-C)"
    if len(results) == 1:
        emit({**header, **results[0]}, args.json)
    else:
        emit({**header, "systems": results}, args.json)
    return 0
