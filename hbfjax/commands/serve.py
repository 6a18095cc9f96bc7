"""``hbfjax serve``: a MoE model served with continuous batching on a DASH memory organisation."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
from typing import Any, Callable, NamedTuple

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
from hbfjax.workload import gpus, models, profile_table, routing, timing
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
    p.add_argument("--routing", choices=routing.KINDS, default="uniform",
                   help="how tokens pick experts: uniform top-k (default; drawn from the exact law of distinct "
                        "experts), zipf-skewed, or balanced rows (DASH §VI-E's analytical routing)")
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
    draw = "counts" if args.routing == "uniform" else "tokens"  # non-uniform routing draws every token's top-k
    serve = system.ServeConfig(model=model, batcher=BatcherConfig(slots=slots, mode=args.mode), requests=requests,
                               max_pass_tokens=pass_tokens, allow_roofline=args.allow_roofline,
                               routing_kind=args.routing, routing_draw=draw)
    return serve, knobs, inputs, warmup


class Family(NamedTuple):
    """Systems of one run that share one compilation: one ``simulate`` with its static ``config`` and
    ``inputs``, one knob point per system (``names``), ``report(outputs[S, ...], index)``, which
    turns one point's outputs into its JSON (a ``ConfigError`` for a run that measured nothing
    meaningful), and ``per_stream(outputs[S, ...])``, its request metrics stream by stream
    (``{key: float64[S]}``). ``hbfjax sweep`` stacks the points of families with equal
    :func:`family_key` from many grid points on one knob axis."""
    simulate: Callable
    config: Any
    inputs: Any
    names: tuple
    points: tuple
    report: Callable[[Any, int], dict]
    per_stream: Callable[[Any], dict]


def family_key(family: Family) -> tuple:
    """What two families must share for their points to run in one compiled call: the function, the
    static config, the knobs' tree structure and leaf shapes, and the inputs' values (a digest)."""
    leaves, tree = jax.tree_util.tree_flatten(family.points[0])
    shapes = tuple((np.shape(x), np.asarray(x).dtype.str) for x in leaves)
    return family.simulate, family.config, tree, shapes, pytree_digest(family.inputs)


def pytree_digest(tree) -> str:
    """sha256 of a pytree's structure and array values (``None``: no inputs)."""
    h = hashlib.sha256()
    leaves, structure = jax.tree_util.tree_flatten(tree)
    h.update(str(structure).encode())
    for leaf in leaves:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.shape}{a.dtype.str}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def point_outputs(out, k: int, several: bool):
    """Knob point ``k``'s outputs from a run with (``several``) or without a knob axis."""
    return jax.tree_util.tree_map(lambda a: a[:, k], out) if several else out


def run_family(family: Family, args) -> dict:
    """Every point of ``family`` in one compilation (a knob axis when there are several); JSON by name."""
    several = len(family.points) > 1
    knobs = batch.stack_knobs(list(family.points)) if several else family.points[0]
    out = batch.run(family.simulate, args.streams, args.seed, knobs, family.config, knob_axis=several,
                    inputs=family.inputs, chunk_streams=args.chunk_streams, progress=args.chunk_streams is not None)
    return {name: family.report(point_outputs(out, k, several), k) for k, name in enumerate(family.names)}


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


def _per_stream(o, warmup: int, slo) -> dict:
    """A serving run's request metrics per stream (``metrics.per_stream``), its iterations and overflow flags."""
    t = metrics.times(o.arrival, o.first_token, o.finish, o.tokens_out, o.valid)
    return {**metrics.per_stream(t, metrics.window(t.arrival_s.shape[1], warmup, None), slo),
            "iterations": np.asarray(o.iterations, np.float64), "overflow": np.asarray(o.overflow)}


def _dash_family(names, args, config, gpu, batcher, request_knobs, inputs, warmup, online, slo) -> Family:
    """The DASH organisations (DASH §IV–§VI) as one family."""
    budget = None if args.hbm_kv_budget_gb is None else args.hbm_kv_budget_gb * 1e9
    org_knobs = [_org(n, args) for n in names]
    table = None if args.profile_table is None else profile_table.ProfileTable.read(args.profile_table).curves()
    points = [system.ServeKnobs.make(o, gpu, batcher, request_knobs, hbm_kv_budget_bytes=budget) for o in org_knobs]

    def report(o, k):
        if np.any(np.asarray(o.totals.table_miss_passes) > 0):
            raise ConfigError(f"--profile-table {args.profile_table}: some operator shapes of this run lie outside the "
                              "measured table; profile them (hbfjax profile --model ...) or pass --allow-roofline")
        return _report(o, org_knobs[k], warmup, online, slo)

    return Family(system.simulate, config, system.ServeInputs(inputs, table), tuple(names), tuple(points), report,
                  lambda o: _per_stream(o, warmup, slo))


def _hbflex_family(names, args, config, gpu, batcher, request_knobs, inputs, warmup, online, slo) -> Family:
    """The HBFlex organisations (HBFlex §6.1) as one family, with HBFlex's 1-byte KV elements."""
    if args.profile_table is not None:
        raise ConfigError("--profile-table: applies to the DASH organisations only, not to " + " ".join(names))
    model = config.model.with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
    hconfig = hbflex_system.HbflexConfig(serve=dataclasses.replace(config, model=model))
    packages = _hbflex_packages(names, args)
    room = None if args.kv_room_gb is None else args.kv_room_gb * 1e9
    points = [hbflex_system.HbflexKnobs.make(p, gpu, batcher, request_knobs, kv_room_bytes=room) for p in packages]

    def report(o, k):
        extra = hbflex_system.report(o)
        return {**_report(o.serve, packages[k].org, warmup, online, slo), **mean_ci_fields(extra, tuple(extra))}

    return Family(hbflex_system.simulate, hconfig, inputs, tuple(names), tuple(points), report,
                  lambda o: _per_stream(o.serve, warmup, slo))


def _cpu_family(names, args, config, model, batcher, request_knobs, inputs, warmup, online, slo) -> Family:
    """The CPU-offloading baselines (DASH §VI-C) as one family."""
    if not model.is_moe:
        raise ConfigError(f"--system {' '.join(names)}: the CPU-offloading systems serve MoE models "
                          f"({args.model} is dense)")
    if args.profile_table is not None:
        raise ConfigError("--profile-table: applies to the HBF organisations only, not to --system " + " ".join(names))
    kv_tokens = config.batcher.slots * (args.prompt + args.output)
    if inputs is not None:  # a trace: the slots × its longest request
        kv_tokens = config.batcher.slots * int(np.max(np.asarray(inputs.prompt_tokens) + np.asarray(inputs.output_tokens)))
    points = [offload_system.OffloadServeKnobs.make(model, args.gpu, args.cores, n, kv_tokens=kv_tokens,
                                                    batcher=batcher, requests=request_knobs) for n in names]
    return Family(offload_system.simulate, config, inputs, tuple(names), tuple(points),
                  lambda o, k: _report(o, None, warmup, online, slo), lambda o: _per_stream(o, warmup, slo))


def _check_options(args, model) -> None:
    hbflex_names = [n for n in args.system if n in HBFLEX_SYSTEMS]
    if (args.disable or args.kv_room_gb is not None) and not hbflex_names:
        raise ConfigError("--disable/--kv-room-gb: apply to the HBFlex organisations " + ", ".join(HBFLEX_SYSTEMS))
    if args.concurrency is not None and args.trace is None:
        raise ConfigError("--concurrency: needs --trace (it resamples the trace's sessions)")
    if args.allow_roofline and args.profile_table is None:
        raise ConfigError("--allow-roofline: applies only with --profile-table")
    if len(set(args.system)) < len(args.system):
        raise ConfigError(f"--system {' '.join(args.system)}: each system once")
    if args.routing != "uniform" and not model.is_moe:
        raise ConfigError(f"--routing {args.routing}: {args.model} is dense (no router)")


def plan(args) -> tuple[dict, list[Family]]:
    """Everything of a run but the simulation: its JSON header and its families (DASH organisations,
    HBFlex organisations, CPU baselines; each one compilation). ``--load`` runs its reference here."""
    model = models.preset(args.model)
    _check_options(args, model)
    config, request_knobs, inputs, warmup = _config(args, model)
    hbflex_names = [n for n in args.system if n in HBFLEX_SYSTEMS]
    if args.gpu is None:
        args.gpu = "h200" if len(hbflex_names) == len(args.system) else "h100-pcie"
    gpu = timing.GpuKnobs.make(args.gpu)
    batcher = BatcherKnobs.make(chunk_tokens=args.chunk_tokens, token_budget=args.token_budget)
    slo = None if args.slo_ttft_s is None and args.slo_tpot_ms is None else metrics.Slo(args.slo_ttft_s, args.slo_tpot_ms)
    online = config.requests.arrivals != "batch"
    header = {"model": args.model, "gpu": args.gpu, "streams": args.streams, "seed": args.seed,
              "lookahead_effective": bool(args.lookahead and model.lookahead_capable)}
    if args.load is not None:
        ref = system.ServeKnobs.make(_org(args.load_reference, args), gpu, batcher, request_knobs)
        mean, ci = _backlogged_rate(ref, config, args.streams, args.seed, warmup, args.requests - warmup)
        rate = load.rate_for_load(args.load, mean)
        request_knobs = dataclasses.replace(request_knobs, rate_per_s=jnp.float32(rate))
        header.update({"load": args.load, "load_reference": args.load_reference,
                       "reference_backlogged_requests_per_s": mean, "ci95_reference_backlogged_requests_per_s": ci,
                       "offered_rate_per_s": rate})
    if not model.lookahead_capable and args.lookahead:
        header["note"] = f"{args.model}'s router has an expert-specific bias: lookahead is off (DASH §V-C)"
    common = (batcher, request_knobs, inputs, warmup, online, slo)
    org_names = [n for n in args.system if n not in CPU_SYSTEMS and n not in HBFLEX_SYSTEMS]
    cpu_names = [n for n in args.system if n in CPU_SYSTEMS]
    families = []
    if org_names:
        families.append(_dash_family(org_names, args, config, gpu, *common))
    if hbflex_names:
        families.append(_hbflex_family(hbflex_names, args, config, gpu, *common))
    if cpu_names:
        families.append(_cpu_family(cpu_names, args, config, model, *common))
    return header, families


_BACKLOGGED: dict = {}


def _backlogged_rate(ref, config, streams: int, seed: int, warmup: int, measured: int) -> tuple[float, float]:
    """``load.backlogged_rate_per_s``, remembered for the process (a sweep over loads asks it once)."""
    key = (pytree_digest(ref), config, streams, seed, warmup, measured)
    if key not in _BACKLOGGED:
        _BACKLOGGED[key] = load.backlogged_rate_per_s(ref, config, streams, seed, warmup, measured)
    return _BACKLOGGED[key]


def assemble(header: dict, by_name: dict, systems) -> dict:
    """The run's JSON: the header and one system's metrics, or the header and a list by system."""
    results = [{"system": name, **by_name[name]} for name in systems]
    if len(results) == 1:
        return {**header, **results[0]}
    return {**header, "systems": results}


def compute(args) -> dict:
    header, families = plan(args)
    by_name = {}
    for family in families:
        by_name.update(run_family(family, args))
    return assemble(header, by_name, args.system)


def run(args) -> int:
    emit(compute(args), args.json)
    return 0
