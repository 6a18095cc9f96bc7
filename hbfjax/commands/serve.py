"""``hbfjax serve``: a model served with continuous batching on one or more named systems
(``hbfjax.serve.systems``): the options become a :class:`~hbfjax.serve.systems.Scenario`, the systems
its families (one compilation each), and each system one JSON object."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from hbfjax.commands._common import add_common_args, add_hbf_args, emit, hbf_part, text_file
from hbfjax.commands import _choices as names
from hbfjax.validate import ConfigError, number

HELP = """\
Serve a model on one or more memory systems (DASH §IV-§VI, HBFlex §4-§6) for many independent streams at
once: requests (a fixed batch, Poisson arrivals or a replayed trace) go through a Sarathi batcher (one
decode token per running request, then one prefill chunk per waiting request within the token budget);
every pass routes each MoE layer's tokens and times each operator as the longer of its GPU compute and
the delivery of its weights and KV by the organisation (replicated projections from HBM and HBF in
parallel, experts over Direct and Relay, tR hidden by lookahead unless the router has an expert bias).
Systems with the same parts run as one compilation on common random numbers; each prints the same
keys alone, beside others and as a sweep point.

DASH's organisations (dash, compact-dash, relay-only, direct-only) track each request's KV in HBM and
HBF: prefill KV is written straight to HBF, decode KV is appended in HBM and written back to HBF in page
waves once the HBM KV budget (--hbm-kv-budget-gb; default: the HBM the weights leave) is exceeded;
attention reads both tiers in parallel, and what the writes' programs take beyond each layer's attention
window is an exposed stall (write_stall_s). --reads planes sends their HBF KV reads through the
plane-collision law HBFlex's organisations use (random page placement; read_wave_amplification).

HBFlex's organisations (hbflex, naive-hbf, naive-block, h3, fa-cli, fa-csi, is; six stack sites of an H200-class GPU)
add the HBFlex runtime's KV management: KV retained after a request ends and reused by its session's
later turns in whole logical pages, sessions evicted least recently used at 90 % of the HBF KV room; HBF
KV reads through plane collisions (random pages or plane-balanced stripes, placement-aware scheduling,
hot-plane offload to SRAM or HBM); new KV programmed immediately (naive-block: a request's pages
serially in one block's plane, the paper's "immediate block-first writes"), in stripes or inside
read-free windows with weight prefetch; a sample of 4 of the package's planes per stream at the paper's
geometry (512 blocks x 512 pages), each fed the pages the placement sends it, whose pages die when
their session is evicted or when a later turn keeps less of its session's retained KV than it holds (the
diverged tail; diverged_page_fraction: of the host-written pages), and whose GC migrations are added to
the iterations (waf, measured from the sampled planes' own host page writes: host_writes; block_erases;
stalled_plane_writes and capped_plane_writes: plane-chunks whose pages waited for GC or over a plane's
programs a chunk). --disable turns mechanisms off
for an ablation. They use HBFlex's 1-byte KV elements.

The CPU-offloading baselines (DASH §VI-C: cpu-stream, cpu-compute, hybrid, hybrid-split) serve the same
requests with the same routing draws on an H100 PCIe with no HBF: a fixed number of experts per layer
resident in its 80 GB (0.9 × HBM minus the non-expert weights, the run's KV and a one-layer staging
buffer); cpu-stream copies every other needed expert over PCIe Gen5 x16 and computes it on the GPU;
cpu-compute runs it on a Xeon Platinum 8452Y, one expert per core under --cores; hybrid is the
per-layer oracle over CPU/GPU splits (a lower bound), hybrid-split a fixed split (--cpu-experts).

A closed loop (--tasks N; HBFlex §6.1, §6.3: concurrent SWE-bench agent tasks) serves N tasks per package,
each issuing its next request a think time after its previous one finishes, so at most N requests are in
the system: with --trace the tasks run the trace's sessions one after another (a later turn thinks the
recorded gap before it, which also holds the recorded run's own service; a session's first turn an
exponential --think-s), without one independent --prompt/--output requests with exponential --think-s
thinks. Each task serves --turns-per-task requests; the window is per stream, from the moment the last task
issues its turn --warmup-turns to the moment the first task issues its last turn, and the JSON states it
(window_start_s, window_end_s, window_requests); tokens/s counts the requests finishing in it. Where the
recorded gaps are long and uneven (Mooncake's run to minutes) the tasks drift apart by more turns than they
have: --warmup-fraction F then warms up in time instead, the window opening the fraction F of the way from
the last task's first request to the first task's last one. The window
does not wait for the KV room to turn over: kv_room_turnover_s says when the finished requests' KV first
filled it (null unless every stream got there), window_after_turnover_streams how many windows opened
after it. --data-parallel D spreads --tasks over D GPUs, session-affine (each GPU serves tasks / D; the
cluster_* token rates are D × one GPU's).

--tensor-parallel T (HBFlex §6.1: DeepSeek-V4-Pro uses T = 2) serves each stream on a group of T GPUs, each
with its own package: every GPU holds 1/T of each split matrix (attention by heads, every expert's and FFN's
intermediate columns), so its streamed weight bytes and matmul FLOPs are 1/T and its KV room is what its
package leaves after its own share; MLA's latent KV and DeepSeek-V4's one shared KV head are replicated
(every GPU caches and reads the whole KV, as vLLM does), GQA's KV heads split; the low-rank down
projections, router, norms, embedding and LM head stay whole. Each layer adds two ring all-reduces of
tokens x hidden x 2 B (BF16), 2 (T - 1) / T x bytes / (NVLink one way x efficiency) + latency, on the
critical path in no overlap window: NVLink 4 = 450 GB/s each way (H200 datasheet: 900 GB/s
bidirectional), efficiency 0.8 and latency 10 us assumed. The JSON states them (tensor_parallel_model) and
reports allreduce_s, allreduce_share_of_busy and kv_room_gb (one GPU's package).

Not modelled yet: shared-prefix replicas; expert parallelism; the logits gather of a vocabulary-split LM
head; for the CPU systems (one GPU: no --tensor-parallel), CPU dispatch overhead, PCIe setup latency, reuse
of streamed experts, KV writes.

Units: times in s (E2E, TTFT) and ms (TPOT), throughput in output tokens per second over the measured
requests (first measured arrival to last measured finish); decode_tokens_per_s is B·(L_out − 1) / T_decode
for a fixed batch. Online runs report the offered arrival_rate_per_s, the completion_rate_per_s and
Little's-law terms over one window, and saturated (with a warning on stderr) when the queue grows
through the measured window: its latencies are then not steady-state values. Means across streams with
95 % CI half-widths (ci95_*); p50/p90/p99 are per-stream percentiles averaged over streams. Utilisations
are bytes over what the path could carry in the busy time (iterations with work); occupancies are time
averages over the busy time.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model on named memory systems (continuous batching)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", nargs="+", choices=names.SYSTEMS, default=["dash"], metavar="SYSTEM",
                   help="systems to serve, several at once (default dash): " + ", ".join(names.SYSTEMS))
    p.add_argument("--model", choices=names.MODELS, default="qwen3-235b-a22b", help="model preset")
    p.add_argument("--gpu", choices=names.GPUS, default=None,
                   help="GPU preset (default: h100-pcie, DASH's; h200 when only HBFlex organisations are served)")
    w = p.add_argument_group("workload (a fixed batch unless --rate, --load or --trace is given)")
    w.add_argument("--batch", type=number(int, 1, names.MAX_REQUESTS), default=None,
                   help="fixed batch size B (default 4)")
    w.add_argument("--prompt", type=number(int, 1, names.MAX_TOKENS), default=1024,
                   help="prompt tokens L_in (default 1024)")
    w.add_argument("--output", type=number(int, 1, names.MAX_TOKENS), default=128,
                   help="output tokens L_out (default 128)")
    w.add_argument("--rate", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="Poisson arrivals at this rate in requests/s instead of a fixed batch")
    w.add_argument("--load", type=number(float, 0.0, 10.0, lo_open=True), default=None,
                   help="Poisson arrivals at this fraction of --load-reference's backlogged throughput "
                        "(DASH §VI-E: 0.5, 0.75, 0.9), measured first in the same run")
    w.add_argument("--load-reference", choices=names.DASH_SYSTEMS, default="relay-only",
                   help="the organisation whose backlogged throughput --load scales (default relay-only)")
    w.add_argument("--trace", default=None, metavar="FILE",
                   help="replay a request trace (arrivals and lengths; a path or a name from `hbfjax traces`)")
    w.add_argument("--rate-factor", type=number(float, 0.0, 1e3, lo_open=True), default=None,
                   help="with --trace: divide the trace's time axis by this (default 1)")
    w.add_argument("--concurrency", type=number(float, 0.0, float(names.MAX_REQUESTS), lo_open=True), default=None,
                   help="with --trace: resample its sessions (bootstrap) with session starts at the rate that keeps "
                        "this many sessions open on average (HBFlex Fig. 16: concurrent SWE-bench tasks)")
    w.add_argument("--tasks", type=number(int, 1, 2**14), default=None,
                   help="closed loop: agent tasks per stream (one GPU and its package, or one --tensor-parallel "
                        "group), each issuing its next request a think time "
                        "after its previous one finishes (HBFlex §6.3: 1,024 per GPU); with --trace they run its "
                        "sessions, without it --prompt/--output requests")
    w.add_argument("--data-parallel", type=number(int, 1, 64), default=None,
                   help="with --tasks: the tasks are the total over this many GPUs (or --tensor-parallel groups), "
                        "each with its own package, routed "
                        "session-affine (a task stays on its GPU for life; HBFlex §6.1: four-way data parallelism), so "
                        "the GPUs share nothing: each stream serves tasks / D and the cluster's tokens/s is D × a GPU's")
    w.add_argument("--tensor-parallel", type=number(int, 1, 64), default=None, metavar="T",
                   help="GPUs (each with its own package) in one stream's tensor-parallel group, serving the same "
                        "requests (default 1; HBFlex §6.1: DeepSeek-V4-Pro with T = 2): each GPU holds 1/T of the "
                        "head- and FFN-split matrices (Megatron-style; MLA's latent KV and V4's one KV head, the "
                        "router, norms, embedding and LM head whole on every GPU), and each layer adds two ring "
                        "all-reduces of tokens x hidden x 2 B over NVLink (450 GB/s each way on the H200, at an assumed "
                        "0.8 bus efficiency, plus an assumed 10 us each); T must divide the heads and FFN sizes; "
                        "tokens/s stay one stream's (one group), *_per_gpu divides them by T; HBF systems only")
    w.add_argument("--turns-per-task", type=number(int, 3, names.MAX_REQUESTS), default=None,
                   help="with --tasks: requests each task serves (default 16; tasks × turns requests per stream)")
    w.add_argument("--think-s", type=number(float, 0.0, 1e4), default=None,
                   help="with --tasks: mean exponential think time in s before a task's first request and, "
                        "without --trace, between its requests (a trace keeps its recorded gaps; default 1)")
    w.add_argument("--warmup-turns", type=number(int, 0, names.MAX_REQUESTS), default=None,
                   help="with --tasks: turns every task serves before the measured window opens (default 2)")
    w.add_argument("--warmup-fraction", type=number(float, 0.0, 1.0, hi_open=True), default=None, metavar="F",
                   help="with --tasks, instead of --warmup-turns: warm up in time, for the first F of the span from "
                        "the last task's first request to the first task's last (traces with long, uneven gaps)")
    w.add_argument("--requests", type=number(int, 1, names.MAX_REQUESTS), default=None,
                   help="requests per stream with --rate, --load or --trace (default 1,152 = DASH §VI-E's 128 + 1,024)")
    w.add_argument("--warmup", type=number(int, 0, names.MAX_REQUESTS), default=None,
                   help="leading requests excluded from the metrics with --rate, --load or --trace (default 128)")
    w.add_argument("--slo-ttft-s", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="TTFT objective in s: adds slo_attainment and goodput_{requests,tokens}_per_s")
    w.add_argument("--slo-tpot-ms", type=number(float, 0.0, 1e9, lo_open=True), default=None,
                   help="TPOT objective in ms (with or without --slo-ttft-s)")
    b = p.add_argument_group("batcher (DASH §VI-E)")
    b.add_argument("--mode", choices=names.MODES, default="mixed", help="mixed or serial passes, or strict alternation")
    b.add_argument("--slots", type=number(int, 1, 4096), default=None,
                   help="running requests at most B_max (default: --batch, or 32 online)")
    b.add_argument("--chunk-tokens", type=number(int, 1, 2**20), default=512, help="prefill chunk tokens (default 512)")
    b.add_argument("--token-budget", type=number(int, 1, 2**20), default=8192,
                   help="tokens per iteration (default 8,192)")
    p.add_argument("--routing", choices=names.ROUTING_KINDS, default="uniform",
                   help="how tokens pick experts: uniform top-k (default; drawn from the exact law of distinct "
                        "experts), zipf-skewed, or balanced rows (DASH §VI-E's analytical routing)")
    p.add_argument("--profile-table", default=None, metavar="CSV",
                   help="GPU operator times from a measured table (`hbfjax profile --out`) instead of the roofline "
                        "(DASH's organisations)")
    p.add_argument("--allow-roofline", action="store_true",
                   help="with --profile-table: use the roofline for shapes outside the table instead of refusing")
    h = p.add_argument_group("memory (defaults: each organisation's own values)")
    h.add_argument("--lookahead", action=argparse.BooleanOptionalAction, default=None,
                   help="early expert selection hides tR (default: the organisation's own, on for DASH's; always "
                        "off for routers with an expert bias)")
    h.add_argument("--t-read-us", type=number(float, 0.0, 1e6, lo_open=True), default=None, help="HBF tR in µs")
    h.add_argument("--t-prog-us", type=number(float, 0.0, 1e6, lo_open=True), default=None, help="HBF tPROG in µs")
    h.add_argument("--link-tbps", type=number(float, 0.0, 1e3, lo_open=True), default=None,
                   help="every D2D link's usable rate in TB/s (default 1.6 for DASH's)")
    h.add_argument("--page-kib", type=number(int, 1, 1024), default=None,
                   help="HBF page in KiB (default 4); the SRAM transfer regions scale with the page wave (DASH §VI-F)")
    h.add_argument("--hbm-kv-budget-gb", type=number(float, 0.0, 1e6), default=None,
                   help="HBM-resident KV (GB) above which decode KV is written back to HBF "
                        "(default: the HBM the placed weights leave; DASH §VI-F states 24.46 GB for Llama 4 Maverick)")
    h.add_argument("--kv-room-gb", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="HBF KV room per package in GB (default: the HBF the weights leave); a smaller room makes "
                        "a short run evict and collect as a long one does")
    h.add_argument("--reads", choices=names.READS, default="linear",
                   help="DASH's organisations: HBF KV reads at their bytes' rate (linear, default) or through plane "
                        "collisions (planes: random page placement, as Naive HBF)")
    r = p.add_argument_group(
        "readings of the DASH paper it leaves open (defaults: the literal reading; the JSON's readings say which ran)")
    r.add_argument("--array-rate", choices=names.ARRAY_RATES, default=None,
                   help="DASH's organisations: the HBF arrays (one page wave per tR) limit Direct and Relay together "
                        "(shared, default: both paths drain one stack's arrays) or each path alone (per-path: what "
                        "the paper's 1.9x needs)")
    r.add_argument("--tr-model", choices=names.TR_MODELS, default=None,
                   help="DASH's organisations: tR is a latency and sets the array rate (rate, default), or a latency "
                        "only (latency: the arrays keep their rate at the nominal 3 us tR, as if a plane kept "
                        "tR / 3 us more reads outstanding; Fig. 11's reductions need it)")
    r.add_argument("--launch-us", type=number(float, 0.0, 1e4), default=None,
                   help="GPU kernel launch and tail per operator in us (default 4, assumed: no CUDA graphs; it adds "
                        "about 3 ms to a Qwen3-235B decode step)")
    r.add_argument("--fixed-prefill", choices=names.FIXED_PREFILL, default=None,
                   help="a fixed batch's prefill: in --chunk-tokens chunks within --token-budget (chunked, default: "
                        "DASH §VI-E's online settings) or every prompt in one pass (whole: §VI-B states no chunking)")
    r.add_argument("--write-window-layers", type=number(int, 1, 4096), default=None,
                   help="DASH's organisations: a layer's KV writes may overlap the attention windows of N layers "
                        "(default 1, DASH §V-B 'the following attention computation'; the paper's Fig. 12 19.94 s "
                        "implies about 3 ms of overlap a page wave)")
    x = p.add_argument_group("HBFlex organisations (HBFlex §5)")
    x.add_argument("--disable", default="", metavar="LIST",
                   help="comma-separated HBFlex mechanisms to turn off: " + ",".join(names.MECHANISMS))
    c = p.add_argument_group("CPU-offloading systems (DASH §VI-C)")
    c.add_argument("--cores", type=number(int, 1, 4096), default=None,
                   help="host cores the CPU systems may use (default 32, DASH Fig. 10(b))")
    c.add_argument("--cpu-experts", type=number(int, 0, 4096), default=None,
                   help="hybrid-split: needed experts per layer computed on the CPU (default 0)")
    c.add_argument("--cpu-dram-gbps", type=number(float, 0.0, 1e4, lo_open=True), default=None,
                   help="DRAM rate of the CPU socket in GB/s, all cores together (default 220, KTransformers' "
                        "measurement on one Xeon 8452Y; its DDR5-4800 x 8 peak is 307.2)")
    c.add_argument("--cpu-core-gbps", type=number(float, 0.0, 1e4, lo_open=True), default=None,
                   help="DRAM rate one core streams alone in GB/s (default 25.6, estimated from its outstanding "
                        "misses; 38.4 = the 307.2 GB/s peak over the eight cores that saturate it in DASH Fig. 10(a))")
    add_hbf_args(p, times=())  # --hbf, --read-units-per-die; --t-read-us/--t-prog-us above fill or override
    add_energy_args(p)
    r = p.add_argument_group("read reclaim and refresh of the HBF weights (issue 26; off unless given)")
    r.add_argument("--read-disturb-reads", type=number(float, 1.0, 1e15), default=None, metavar="N",
                   help="reads a block takes before it is relocated (issue 26's public artifact: 1e6); adds the "
                        "renewal estimate of reclaim from the run's weight reads (hbfjax.read_reclaim)")
    r.add_argument("--refresh-hours", type=number(float, 0.0, 1e6), default=None, metavar="T",
                   help="with --read-disturb-reads: rewrite every block not rewritten for T hours (OCP HBF v0.7: "
                        "24-48 h; default off)")
    r.add_argument("--reclaim-in", choices=RECLAIM_IN, default=None,
                   help="with --read-disturb-reads: where the engine times the rewrites (hbfjax.serve.parts.reclaim): "
                        "in the layers' read-free windows, the rest forced onto the critical path (default windows), "
                        "or all on the critical path in the pass that causes them")
    r.add_argument("--reclaim-backlog-blocks", type=number(float, 0.0, 1e12), default=None, metavar="B",
                   help="with --read-disturb-reads and windows: due blocks that may wait for a later pass's windows "
                        "before the rest is forced (default 0)")
    t = p.add_argument_group("timeline (Chrome trace-event JSON: ui.perfetto.dev, chrome://tracing)")
    t.add_argument("--timeline", default=None, metavar="FILE.json",
                   help="write one stream's passes, layers, operators, KV writes and requests as a Chrome trace "
                        "(a replay by the plain-Python reference; DASH's and HBFlex's organisations, "
                        "HBFlex's with its GC, evictions and SRAM)")
    t.add_argument("--timeline-system", default=None, metavar="NAME", help="the system timed (default: the first)")
    t.add_argument("--timeline-stream", type=number(int, 0, 10**9), default=None, metavar="S",
                   help="the stream timed (default 0)")
    t.add_argument("--timeline-passes", default=None, metavar="A:B",
                   help="the passes written, A to B - 1 (default 0:2000; layers and operators for the first "
                        "64 of them)")
    add_common_args(p, default_streams=64)
    p.set_defaults(func=run)


_ENERGY_UNITS = {"pj_per_flop": "pJ a FLOP", "pj_per_bit": "pJ a bit", "uj_per_block": "µJ a block", "_w": "W",
                 "_usd": "US dollars", "ratio": "a ratio", "_years": "years", "per_kwh": "US dollars a kWh",
                 "cycles": "P/E cycles a block"}


def add_energy_args(p) -> None:
    """One option per energy and cost value (``hbfjax.energy``), each defaulting to its sourced value."""
    from hbfjax import energy

    g = p.add_argument_group("energy and cost per token (issue 25; defaults sourced in the JSON's energy_model)")
    for cls in (energy.EnergyCosts, energy.CostModel):
        for f in dataclasses.fields(cls):
            unit = next((u for key, u in _ENERGY_UNITS.items() if f.name.endswith(key)), "")
            default = "the GPU's TDP / dense BF16 peak" if f.default is None else f"{f.default:g}"
            g.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=number(float, 0.0, 1e12),
                           default=None, metavar="X", help=f"{unit} (default {default}: {cls.SOURCES[f.name]})")


def energy_models(args) -> tuple:
    """The run's (``EnergyCosts``, ``CostModel``) from the energy options."""
    from hbfjax import energy

    def build(cls):
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in given.items() if v is not None})
        except ConfigError as err:  # name the option, not the field
            field = next(f for f in given if f in str(err))
            raise ConfigError(f"--{field.replace('_', '-')} {given[field]:g}: {str(err).split(': ', 1)[-1]}") from None
    return build(energy.EnergyCosts), build(energy.CostModel)


def _refuse_unused(args, kinds: set, workload: str) -> None:
    """Refuse options the chosen systems or workload would ignore."""
    given = lambda d: getattr(args, d) not in (None, False, "")  # noqa: E731
    rules = [
        ("disable", "hbflex" in kinds, "applies to HBFlex's organisations (" + ", ".join(names.HBFLEX_SYSTEMS) + ")"),
        ("cores", "cpu" in kinds, "applies to the CPU-offloading systems (" + ", ".join(names.CPU_SYSTEMS) + ")"),
        ("cpu_experts", "hybrid-split" in args.system, "applies to --system hybrid-split"),
        ("rate_factor", args.trace is not None, "applies with --trace"),
        ("concurrency", workload == "trace", "needs --trace without --tasks (it resamples the trace's sessions' "
                                             "starts; --tasks sets a closed loop's concurrency)"),
        ("warmup", workload in ("poisson", "trace"), "applies to open-loop online runs (--rate, --load or --trace); "
                                                     "a closed loop (--tasks) warms up by --warmup-turns"),
        ("requests", workload in ("poisson", "trace"), "applies to open-loop online runs (--rate, --load or --trace); "
                                                       "a fixed batch serves --batch requests, a closed loop --tasks × "
                                                       "--turns-per-task"),
        ("turns_per_task", workload == "closed", "applies to a closed loop (--tasks)"),
        ("data_parallel", workload == "closed", "applies to a closed loop (--tasks): an open-loop stream has no "
                                                "tasks to route"),
        ("think_s", workload == "closed", "applies to a closed loop (--tasks)"),
        ("warmup_turns", workload == "closed", "applies to a closed loop (--tasks)"),
        ("warmup_fraction", workload == "closed", "applies to a closed loop (--tasks)"),
        ("batch", workload == "batch", "applies to a fixed batch, not with --rate, --load or --trace"),
        ("allow_roofline", args.profile_table is not None, "applies only with --profile-table"),
        ("array_rate", "dash" in kinds, "applies to DASH's organisations (" + ", ".join(names.DASH_SYSTEMS) + ")"),
        ("tr_model", "dash" in kinds, "applies to DASH's organisations (" + ", ".join(names.DASH_SYSTEMS) + ")"),
        ("write_window_layers", "dash" in kinds,
         "applies to DASH's organisations (" + ", ".join(names.DASH_SYSTEMS) + "); HBFlex's place their programs "
         "by their own writeback policy"),
        ("fixed_prefill", workload == "batch", "applies to a fixed batch (online runs chunk by --chunk-tokens)"),
        ("cpu_dram_gbps", "cpu" in kinds, "applies to the CPU-offloading systems (" + ", ".join(names.CPU_SYSTEMS) + ")"),
        ("cpu_core_gbps", "cpu" in kinds, "applies to the CPU-offloading systems (" + ", ".join(names.CPU_SYSTEMS) + ")"),
    ]
    for dest, ok, rule in rules:
        if given(dest) and not ok:
            raise ConfigError(f"--{dest.replace('_', '-')} = {getattr(args, dest)!r}: {rule}")
    if args.tr_model == "latency" and (kinds & {"hbflex"} or args.reads != "linear"):
        raise ConfigError("--tr-model latency: the plane-collision reads (HBFlex's organisations, --reads planes) "
                          "serve a wave of page reads per tR, so tR sets their rate; the latency-only reading applies "
                          "to DASH's linear reads alone")
    if args.reads != "linear" and kinds - {"dash"}:
        raise ConfigError(f"--reads {args.reads}: applies to DASH's organisations (HBFlex's always read through plane "
                          "collisions; the CPU systems read no HBF)")
    if len(set(args.system)) < len(args.system):
        raise ConfigError(f"--system {' '.join(args.system)}: each system once")


def _workload_kind(args) -> str:
    given = [f for f, v in (("--rate", args.rate), ("--load", args.load), ("--trace", args.trace)) if v is not None]
    if args.tasks is not None:
        given = [f for f in given if f != "--trace"]
        if given:
            raise ConfigError(f"--tasks = {args.tasks} and {' and '.join(given)}: give one (a closed loop's tasks set "
                              "the arrivals)")
        return "closed"
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: give one (each sets the arrivals)")
    return "trace" if args.trace is not None else "batch" if not given else "poisson"


def scenario(args):
    """The run's :class:`~hbfjax.serve.systems.Scenario` from the parsed options (``--load``'s rate is
    set later, once the reference's backlogged throughput is known: 1 req/s stands for it)."""
    from hbfjax import traces
    from hbfjax.serve import metrics, systems
    from hbfjax.workload import models, profile_table
    from hbfjax.workload import requests as rq

    workload = _workload_kind(args)
    kinds = {systems.system(n).kind for n in args.system}
    _refuse_unused(args, kinds, workload)
    model = models.preset(args.model)
    if args.routing != "uniform" and not model.is_moe:
        raise ConfigError(f"--routing {args.routing}: {args.model} is dense (no router)")
    org_changes = tuple((k, v) for k, v in (("lookahead", None if args.lookahead is None else int(args.lookahead)),
                                            ("t_read_us", args.t_read_us), ("t_prog_us", args.t_prog_us),
                                            ("shared_array_rate", None if args.array_rate is None else
                                             systems.ARRAY_RATES[args.array_rate]),
                                            ("tr_sets_rate", None if args.tr_model is None else
                                             systems.TR_MODELS[args.tr_model]),
                                            ("write_window_layers", args.write_window_layers))
                        if v is not None)
    org_changes += _part_changes(args)
    gpu_changes = () if args.launch_us is None else (("launch_us", args.launch_us),)
    cpu_changes = _cpu_changes(args)
    slo = None if args.slo_ttft_s is None and args.slo_tpot_ms is None else metrics.Slo(args.slo_ttft_s, args.slo_tpot_ms)
    table = None if args.profile_table is None else profile_table.ProfileTable.read(
        text_file("--profile-table", args.profile_table)).curves()
    common = dict(gpu=args.gpu, mode=args.mode, chunk_tokens=args.chunk_tokens, token_budget=args.token_budget,
                  routing=args.routing, slo=slo, org_changes=org_changes, gpu_changes=gpu_changes,
                  cpu_changes=cpu_changes,
                  hbm_kv_budget_bytes=None if args.hbm_kv_budget_gb is None else args.hbm_kv_budget_gb * 1e9,
                  kv_room_bytes=None if args.kv_room_gb is None else args.kv_room_gb * 1e9,
                  link_gbps=None if args.link_tbps is None else args.link_tbps * 1e3,
                  page_bytes=None if args.page_kib is None else args.page_kib * 1024,
                  disable=tuple(m for m in args.disable.split(",") if m), reads=args.reads, table=table,
                  allow_roofline=args.allow_roofline, cores=args.cores or 32, cpu_experts=args.cpu_experts or 0,
                  reclaim=reclaim_knobs(args, kinds))
    for m in common["disable"]:
        if m not in names.MECHANISMS:
            raise ConfigError(f"--disable {m!r}: must be among {names.MECHANISMS}")
    _check_nand_times(args)
    _check_cpu_counts(args, model)
    common["tensor_parallel"] = _tensor_parallel(args, model)
    if workload == "batch":
        batch = args.batch or 4
        slots = args.slots or batch
        if args.fixed_prefill == "whole":
            common.update(systems.whole_prefill(args.prompt, slots))
        return systems.Scenario.fixed_batch(model, batch, args.prompt, args.output, slots=slots, **common)
    if workload == "closed":
        return _closed_loop(args, model, common)
    requests = args.requests or 1152
    warmup = 128 if args.warmup is None else args.warmup
    if warmup >= requests - 1:
        raise ConfigError(f"--warmup = {warmup}: must be below --requests − 1 = {requests - 1} (an arrival window "
                          "needs at least two measured requests)")
    slots = args.slots or 32
    if workload == "poisson":
        rate = 1.0 if args.rate is None else args.rate
        return systems.Scenario.poisson(model, rate, requests, args.prompt, args.output, slots=slots, warmup=warmup,
                                        **common)
    inputs = rq.TraceInputs.from_trace(traces.load_trace(traces.resolve(args.trace)), requests)
    return systems.Scenario.replay(model, inputs, requests, slots=slots, rate_factor=args.rate_factor or 1.0,
                                   concurrency=args.concurrency, warmup=warmup, **common)


def _tensor_parallel(args, model) -> int:
    """--tensor-parallel T (default 1), refused where the model's heads or FFNs do not split T ways."""
    from hbfjax.workload import tensor_parallel

    gpus = args.tensor_parallel or 1
    problems = tensor_parallel.split_problems(model, gpus)
    if problems:
        raise ConfigError(f"--tensor-parallel = {gpus}: {args.model} does not split over {gpus} GPUs: T "
                          + "; ".join(problems))
    return gpus


def _part(args):
    return hbf_part(args, need=("t_read_us", "t_prog_us", "read_units_per_die"))


def _part_changes(args) -> tuple:
    """--hbf: the part's per-stack values for every organisation served (OrgKnobs.make's parallel_units,
    page_bytes, t_read_us, t_prog_us, hbf_capacity_bytes, hbf_interface_gbps and hbf_write_gbps, all per
    stack: hbf_parts.org_changes); each organisation keeps its
    stack count. An organisation whose stack is not one whole preset stack (a share, or a merged pair) is
    refused: a part is one whole stack."""
    from hbfjax import hardware
    from hbfjax.memory import hbf_packages, hbf_parts
    from hbfjax.memory import organisations as orgs
    from hbfjax.serve import systems

    part = _part(args)
    if part is None:
        return ()
    if args.page_kib is not None:
        raise ConfigError(f"--page-kib = {args.page_kib} and --hbf {args.hbf}: give one (the part states its page)")
    for name in args.system:
        kind = systems.system(name).kind
        if kind == "cpu":
            continue
        org = orgs.organisation(name) if kind == "dash" else hbf_packages.package(name).org
        stack = hardware.preset("dash" if kind == "dash" else "hbflex").hbf
        whole = (float(org.parallel_units) == stack.parallel_units // stack.stacks
                 and abs(float(org.hbf_capacity_bytes) - stack.capacity_bytes / stack.stacks) <= 1e-6 * stack.capacity_bytes)
        if not whole:
            raise ConfigError(f"--hbf {args.hbf}: {name}'s HBF stack is not one whole stack of its preset "
                              f"({float(org.parallel_units):g} units, {float(org.hbf_capacity_bytes):.4g} B), and a part "
                              "is one whole stack; serve it without --hbf")
    return hbf_parts.org_changes(part)


def _check_nand_times(args) -> None:
    """tPROG >= tR for every organisation served, naming the option(s) given and the defaults they meet."""
    from hbfjax.memory import hbf_packages
    from hbfjax.memory import organisations as orgs
    from hbfjax.serve import systems

    if (args.t_read_us is None and args.t_prog_us is None) or args.hbf is not None:  # --hbf: checked by the part
        return
    for name in args.system:
        kind = systems.system(name).kind
        if kind == "cpu":
            continue
        org = orgs.organisation(name) if kind == "dash" else hbf_packages.package(name).org
        t_read = float(org.t_read_us) if args.t_read_us is None else args.t_read_us
        t_prog = float(org.t_prog_us) if args.t_prog_us is None else args.t_prog_us
        if t_prog < t_read:
            given = " and ".join(f"{flag} = {v:g}" for flag, v in (("--t-read-us", args.t_read_us),
                                                                    ("--t-prog-us", args.t_prog_us)) if v is not None)
            raise ConfigError(f"{given}: {name} would program a page (tPROG {t_prog:g} µs) faster than it reads one "
                              f"(tR {t_read:g} µs); a NAND program is slower than a read")


def _check_cpu_counts(args, model) -> None:
    """--cores within the host CPU's cores, --cpu-experts within the model's routed experts."""
    from hbfjax.memory import cpus

    host = cpus.cpu_preset("xeon-8452y")
    if args.cores is not None and args.cores > host.cores:
        raise ConfigError(f"--cores = {args.cores}: must be <= the {host.cores} cores of the host CPU (Xeon 8452Y)")
    if args.cpu_experts is not None and model.is_moe and args.cpu_experts > model.routed_experts:
        raise ConfigError(f"--cpu-experts = {args.cpu_experts}: must be <= {args.model}'s {model.routed_experts} routed "
                          "experts per layer")


def _cpu_changes(args) -> tuple:
    """The CPU-offloading systems' rate overrides (``OffloadKnobs.make``): the socket's DRAM rate as a share
    of the host CPU's DDR peak, and one core's rate."""
    from hbfjax.memory import cpus

    changes = []
    if args.cpu_dram_gbps is not None:
        peak = cpus.cpu_preset("xeon-8452y").memory_peak_gbps
        if args.cpu_dram_gbps > peak:
            raise ConfigError(f"--cpu-dram-gbps = {args.cpu_dram_gbps:g}: must be <= the Xeon 8452Y's DDR5-4800 x 8 "
                              f"peak, {peak:g} GB/s")
        changes.append(("memory_efficiency", args.cpu_dram_gbps / peak))
    if args.cpu_core_gbps is not None:
        changes.append(("core_bw_gbps", args.cpu_core_gbps))
    return tuple(changes)


def readings(args, kinds: set) -> dict:
    """The readings of the papers a run took (the JSON's ``readings``): the open DASH choices for a run with
    DASH's organisations, the GPU's launch time for every run, the CPU's rates for the CPU systems."""
    from hbfjax.memory import cpus
    from hbfjax.workload import timing

    host = cpus.cpu_preset("xeon-8452y")
    out = {"launch_us": timing.KNOB_DEFAULTS["launch_us"][0] if args.launch_us is None else args.launch_us}
    if "dash" in kinds:
        out.update(array_rate=args.array_rate or names.ARRAY_RATES[0], tr_model=args.tr_model or names.TR_MODELS[0],
                   write_window_layers=args.write_window_layers or 1)
    if _workload_kind(args) == "batch":
        out["fixed_prefill"] = args.fixed_prefill or names.FIXED_PREFILL[0]
    if "cpu" in kinds:
        out.update(cpu_dram_gbps=host.memory_bw_gbps if args.cpu_dram_gbps is None else args.cpu_dram_gbps,
                   cpu_core_gbps=host.core_bw_gbps if args.cpu_core_gbps is None else args.cpu_core_gbps)
    return out


def _closed_loop(args, model, common: dict):
    """The closed loop of ``--tasks`` (module help), its options checked against each other."""
    from hbfjax import traces
    from hbfjax.serve import systems
    from hbfjax.serve.state import MAX_SLOTS
    from hbfjax.workload import requests as rq

    gpus = args.data_parallel or 1
    if args.tasks % gpus:
        raise ConfigError(f"--tasks = {args.tasks}: must be a multiple of --data-parallel = {gpus} (a session-affine "
                          "router gives each GPU the same number of tasks)")
    tasks = args.tasks // gpus
    turns = args.turns_per_task or 16
    if args.warmup_fraction is not None and args.warmup_turns is not None:
        raise ConfigError("--warmup-fraction and --warmup-turns: give one (a warm-up in time or in turns)")
    warmup_turns = 0 if args.warmup_fraction is not None else 2 if args.warmup_turns is None else args.warmup_turns
    if warmup_turns > turns - 2:
        raise ConfigError(f"--warmup-turns = {warmup_turns}: must be <= --turns-per-task − 2 = {turns - 2} (the window "
                          "runs from the last task's turn --warmup-turns to the first task's last turn)")
    if tasks * turns > names.MAX_REQUESTS:
        raise ConfigError(f"tasks per GPU × --turns-per-task = {tasks} × {turns} = {tasks * turns} requests per "
                          f"stream: must be <= {names.MAX_REQUESTS}")
    slots = args.slots or min(tasks, MAX_SLOTS)
    if slots > min(tasks, MAX_SLOTS):
        raise ConfigError(f"--slots = {slots}: must be <= the tasks per GPU = {tasks} (a task has one request in the "
                          f"system at a time) and <= {MAX_SLOTS}")
    trace = None
    if args.trace is not None:
        trace = rq.TraceInputs.from_trace(traces.load_trace(traces.resolve(args.trace)))
    return systems.Scenario.closed_loop(model, tasks, turns, trace=trace,
                                        think_s=1.0 if args.think_s is None else args.think_s, prompt=args.prompt,
                                        output=args.output, slots=slots, warmup_turns=warmup_turns,
                                        warmup_fraction=args.warmup_fraction,
                                        rate_factor=args.rate_factor or 1.0, **common)


def _offered_load(args, sc) -> tuple:
    """(scenario at --load's rate, header keys): the reference's backlogged throughput measured first."""
    import jax.numpy as jnp

    from hbfjax.serve import systems
    from hbfjax.sweep import load

    ref = systems.single(args.load_reference, dataclasses.replace(sc, reads="linear", gpu=sc.gpu or systems.gpu_for(
        args.system, sc)))
    measured = sc.requests.requests - sc.warmup
    mean, ci = load.backlogged_rate_per_s(ref.points[0], ref.config, args.streams, args.seed, sc.warmup, measured,
                                          inputs=ref.inputs._replace(trace=None))
    rate = load.rate_for_load(args.load, mean)
    knobs = dataclasses.replace(sc.request_knobs, rate_per_s=jnp.float32(rate))
    header = {"load": args.load, "load_reference": args.load_reference, "reference_backlogged_requests_per_s": mean,
              "ci95_reference_backlogged_requests_per_s": ci, "offered_rate_per_s": rate}
    return dataclasses.replace(sc, request_knobs=knobs), header


def plan(args, timeline_ok: bool = False) -> tuple[dict, list]:
    """Everything of a run but the simulation: its JSON header and its families (each one compilation).
    ``--load`` runs its reference here. ``--timeline`` is refused unless ``timeline_ok`` (``compute``
    writes it; a sweep's points, planned here, would not)."""
    from hbfjax import energy
    from hbfjax.serve import systems
    from hbfjax.workload import gpus

    if getattr(args, "timeline", None) is not None and not timeline_ok:
        raise ConfigError("--timeline: time one run (hbfjax serve ... --timeline FILE.json), not a sweep's points")
    sc = scenario(args)
    header = {"model": args.model, "gpu": systems.gpu_for(args.system, sc), "streams": args.streams, "seed": args.seed,
              "readings": readings(args, {systems.system(n).kind for n in args.system})}
    header["tensor_parallel"] = sc.tensor_parallel
    if sc.tensor_parallel > 1:
        header["tensor_parallel_model"] = _tensor_parallel_model(sc, header["gpu"])
    if args.reads != "linear":
        header["reads"] = args.reads
    if args.hbf is not None:
        header["hbf_part"] = {**_part(args).report(), "stacks": "each organisation's own (dash 2, hbflex 6, ...): "
                              "the part replaces its per-stack HBF"}
    if sc.requests.closed_loop:
        header.update(closed_loop=True, data_parallel=args.data_parallel or 1,
                      tasks_total=sc.requests.tasks * (args.data_parallel or 1),
                      tasks_per_package=sc.requests.tasks, turns_per_task=sc.requests.turns,
                      think_s=float(sc.request_knobs.think_s), warmup_turns=sc.warmup_turns, slots=sc.slots,
                      think_times="the trace's recorded inter-request gaps (÷ rate factor); exponential think_s "
                                  "before a session's first turn" if sc.trace is not None else
                                  "exponential, mean think_s")
        if sc.warmup_fraction is not None:
            header["warmup_fraction"] = sc.warmup_fraction
    if args.load is not None:
        sc, extra = _offered_load(args, sc)
        header.update(extra)
    if not sc.model_spec.lookahead_capable and args.lookahead:
        header["note"] = f"{args.model}'s router has an expert-specific bias: lookahead is off (DASH §V-C)"
    costs, cost = energy_models(args)
    pj_per_flop = costs.pj_per_flop(header["gpu"], gpus.preset(header["gpu"]).peak_tflops_bf16)
    header["energy_model"] = energy.describe(costs, cost, pj_per_flop)
    reclaim = reclaim_model(args, cost)
    if reclaim is not None:
        from hbfjax import read_reclaim

        header["reclaim_model"] = read_reclaim.describe(reclaim)
    if sc.reclaim is not None:
        from hbfjax.serve.parts import reclaim as reclaim_part

        header["reclaim_timing"] = reclaim_part.describe(sc.reclaim)
    return header, [_with_energy(f, costs, cost, pj_per_flop, reclaim, header["gpu"])
                    for f in systems.families(args.system, sc)]


def _tensor_parallel_model(sc, gpu: str) -> dict:
    """The header's statement of a tensor-parallel run: the split and the all-reduce's values and sources."""
    from hbfjax.serve import systems
    from hbfjax.workload import gpus, tensor_parallel

    knobs = systems.gpu_knobs(sc, gpu)
    spec = gpus.preset(gpu)
    return {**tensor_parallel.describe(sc.tensor_parallel, float(knobs.nvlink_gbps), float(knobs.allreduce_efficiency),
                                       float(knobs.allreduce_latency_us)),
            "link_source": spec.source("nvlink_gbps")}


RECLAIM_IN = ("windows", "critical-path")


def reclaim_knobs(args, kinds=()):
    """The reclaim part's knobs (``parts.reclaim.ReclaimKnobs``) of --read-disturb-reads and its options, or None;
    the options alone are refused. The CPU systems read no HBF: they run without the part."""
    given = [f for f, v in (("--reclaim-in", getattr(args, "reclaim_in", None)),
                            ("--reclaim-backlog-blocks", getattr(args, "reclaim_backlog_blocks", None))) if v is not None]
    if getattr(args, "read_disturb_reads", None) is None:
        if given:
            raise ConfigError(f"{' '.join(given)}: give --read-disturb-reads N too (1e6: issue 26's public artifact)")
        return None
    if getattr(args, "reclaim_in", None) == "critical-path" and getattr(args, "reclaim_backlog_blocks", None):
        raise ConfigError("--reclaim-backlog-blocks: applies to --reclaim-in windows (the critical path waits for none)")
    if set(kinds) == {"cpu"}:
        raise ConfigError("--read-disturb-reads: the CPU-offloading systems read no HBF; serve an HBF system too")
    from hbfjax.serve.parts.reclaim import ReclaimKnobs

    return ReclaimKnobs.make(threshold_reads=args.read_disturb_reads, refresh_hours=args.refresh_hours or 0.0,
                             in_windows=float(getattr(args, "reclaim_in", None) != "critical-path"),
                             backlog_blocks=getattr(args, "reclaim_backlog_blocks", None) or 0.0)


def reclaim_model(args, cost):
    """The run's ``read_reclaim.ReclaimModel`` (None without --read-disturb-reads); --refresh-hours alone is
    refused."""
    if getattr(args, "read_disturb_reads", None) is None:
        if getattr(args, "refresh_hours", None) is not None:
            raise ConfigError(f"--refresh-hours {args.refresh_hours:g}: give --read-disturb-reads N too "
                              "(1e6: issue 26's public artifact)")
        return None
    from hbfjax import read_reclaim

    return read_reclaim.ReclaimModel(threshold_reads=args.read_disturb_reads, refresh_hours=args.refresh_hours or 0.0,
                                     pe_cycles=cost.pe_cycles)


def _with_energy(family, costs, cost, pj_per_flop, reclaim=None, gpu: str = "h100-pcie"):
    """``family`` whose report adds each point's energy and cost keys (``hbfjax.energy.report``) and, with a
    reclaim model, its read-reclaim keys (``hbfjax.read_reclaim.report``), also on the points ``with_points``
    gives it."""
    from hbfjax import energy

    def report(o, k):
        org, model = family.points[k].org, family.config.model
        out = {**family.report(o, k), **energy.report(o, org, model, costs, cost, pj_per_flop, gpu)}
        if reclaim is not None and org is not None:
            from hbfjax import read_reclaim

            a = energy.activity(o, org, model)
            totals = {key: np.asarray(v, np.float64) for key, v in o.totals._asdict().items()}
            out.update(read_reclaim.report(totals, org, model, a.gpu_write_bytes + a.hbm_write_bytes + a.gc_bytes,
                                           reclaim, a.gc_bytes, energy.kv_reclaim_bytes(o, a.gpu_write_bytes
                                                                                        + a.hbm_write_bytes)))
        return out
    return family._replace(report=report, with_points=lambda *a, **kw: _with_energy(family.with_points(*a, **kw),
                                                                                     costs, cost, pj_per_flop, reclaim,
                                                                                     gpu))


def family_key(family) -> tuple:
    from hbfjax.serve import systems

    return systems.family_key(family)


def _rates(result: dict, factor: float, name: str) -> dict:
    """A system's result with its token rates (and CIs) times ``factor`` under ``name.format(key)``."""
    out = dict(result)
    for key in ("throughput_tokens_per_s", "decode_tokens_per_s"):
        if result.get(key) is not None:
            out[name.format(key)] = factor * result[key]
            out[f"ci95_{name.format(key)}"] = factor * result[f"ci95_{key}"]
    return out


def assemble(header: dict, by_name: dict, systems_: list) -> dict:
    """The run's JSON: the header and one system's metrics, or the header and a list by system (a
    data-parallel closed loop adds each system's cluster token rates, a tensor-parallel run its rates per GPU)."""
    gpus, group = header.get("data_parallel", 1), header.get("tensor_parallel", 1)
    results = []
    for name in systems_:  # D streams that share nothing: D × one stream's; a stream is T GPUs: one's ÷ T
        r = _rates(by_name[name], 1.0 / group, "{}_per_gpu") if group > 1 else by_name[name]
        results.append({"system": name, **(_rates(r, gpus, "cluster_{}") if gpus > 1 else r)})
    if len(results) == 1:
        return {**header, **results[0]}
    return {**header, "systems": results}


def _check_timeline(args) -> None:
    """Refuse timeline options that cannot apply, before anything runs."""
    from hbfjax.serve import timeline

    if args.timeline is None:
        for option in ("timeline_system", "timeline_stream", "timeline_passes"):
            if getattr(args, option) is not None:
                raise ConfigError(f"--{option.replace('_', '-')}: applies with --timeline FILE.json only")
        return
    if args.timeline_system is not None and args.timeline_system not in args.system:
        raise ConfigError(f"--timeline-system {args.timeline_system}: not one of the run's --system "
                          f"{' '.join(args.system)}")
    if (args.timeline_stream or 0) >= args.streams:
        raise ConfigError(f"--timeline-stream {args.timeline_stream}: the run has {args.streams} streams (0 … "
                          f"{args.streams - 1})")
    timeline.parse_window(args.timeline_passes or "0:2000")
    folder = Path(args.timeline).expanduser().resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"--timeline {args.timeline}: no folder {folder} to write it in")


def _timed(args, families) -> tuple:
    """(the family of ``--timeline-system``, default the first system; its point's index)."""
    name = args.timeline_system or args.system[0]
    family = next(f for f in families if name in f.names)
    return family, family.names.index(name)


def _timeline(args, families) -> dict:
    """Write the timeline of ``--timeline-system``'s stream (``hbfjax.serve.timeline``); its summary."""
    from hbfjax.serve import timeline

    return timeline.write(*_timed(args, families), args.timeline_stream or 0, args.seed,
                          timeline.parse_window(args.timeline_passes or "0:2000"), args.timeline)


def compute(args) -> dict:
    from hbfjax.serve import timeline
    from hbfjax.sweep.families import run_family

    _check_timeline(args)
    header, families = plan(args, timeline_ok=True)
    if args.timeline is not None:  # refused before the simulation runs
        timeline.check_family(*_timed(args, families))
    by_name = {}
    for family in families:
        by_name.update(run_family(family, args.streams, args.seed, chunk_streams=args.chunk_streams,
                                  progress=args.chunk_streams is not None))
    overflowed = [name for name in args.system if by_name[name].get("overflow")]
    if overflowed and args.kv_room_gb is not None:  # the likeliest cause is the room the user set
        raise ConfigError(f"--kv-room-gb {args.kv_room_gb}: {', '.join(overflowed)} overflowed (a request needs "
                          "more KV than the room holds, or the run ran out of iterations): give a room above the "
                          "longest request's prompt + output tokens of KV")
    if args.timeline is not None:
        header = {**header, "timeline": _timeline(args, families)}
    return assemble(header, by_name, args.system)


def warnings_of(result: dict) -> list[str]:
    """One stderr line per saturated system of a result (``metrics.saturation_warning``) and per system whose
    sampled planes kept pages waiting: for GC (``stalled_plane_writes``: chunks whose pages a plane's free
    blocks could not take) or over the cap of ``BlocksConfig.plane_writes_per_chunk`` pages a plane a chunk
    (``capped_plane_writes``)."""
    from hbfjax.serve import metrics

    rows = result.get("systems", [result])
    lines = []
    for row in rows:
        text = metrics.saturation_warning(row)
        if text:
            lines.append(f"{row.get('system', '')}: {text}")
        if (row.get("stalled_plane_writes") or 0) > 0:
            lines.append(f"{row.get('system', '')}: stalled_plane_writes = {row['stalled_plane_writes']:g}: GC on the "
                         "sampled planes fell behind their writes and pages waited, so WAF and GC time lag the run (a "
                         "page is the KV room's share of a plane: a small --kv-room-gb makes every chunk many pages)")
        if (row.get("capped_plane_writes") or 0) > 0:
            lines.append(f"{row.get('system', '')}: capped_plane_writes = {row['capped_plane_writes']:g}: chunks sent a "
                         f"sampled plane more pages than the store simulates a plane programming in one chunk "
                         f"({_plane_writes_per_chunk()}, a bound of the simulation, not of the flash), and the rest "
                         "waited for the next, so WAF and GC time lag the run (long prompts striped over one plane "
                         "group, or a small --kv-room-gb, which makes every chunk many pages, send a plane that many)")
    return lines


def _plane_writes_per_chunk() -> int:
    from hbfjax.serve.parts.blocks import BlocksConfig

    return BlocksConfig().plane_writes_per_chunk


def run(args) -> int:
    result = compute(args)
    emit(result, args.json)
    for line in warnings_of(result):
        print(f"hbfjax serve: {line}", file=sys.stderr)
    return 0
