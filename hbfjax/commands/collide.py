"""``hbfjax collide``: plane collisions of HBF reads (HBFlex §3.1, §5.2, §6.4–6.5)."""

from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np

from hbfjax import batch, traces
from hbfjax.commands._common import add_common_args, add_preset_arg, emit, preset_or_none
from hbfjax.flash.reads import collide, workingset
from hbfjax.hardware import preset
from hbfjax.reports import fields, mean_ci_fields
from hbfjax.validate import ConfigError

HELP = "plane collisions of HBF reads: waves, amplification, hot-plane offload"
DESCRIPTION = """\
Monte Carlo of how the pages of a read collide on HBF planes.

A plane senses one page per tR, so a read takes waves = max pages on one plane; amplification =
waves / ceil(pages / planes). Two workloads:
  read       (default) one read of --pages physical 4 KiB pages;
  attention  one layer's attention read of an active KV working set of --slots requests, whose
             context lengths come from --trace or a lognormal distribution, read in chunks (CTA
             work tiles) scheduled wave by wave, while requests complete and arrive.

Examples:
  hbfjax collide --planes 3072 --pages 3072 --placement random --json
  hbfjax collide --preset hbflex --pages 3072 --placement plane-group --group-size 32 --pages-per-logical 4
  hbfjax collide --workload attention --preset hbflex --trace swebench_miniswe_agent.csv \\
      --model-kv-bytes-per-token 1024 --placement plane-group --schedule placement-aware --offload-fraction 0.1
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("collide", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["read", "attention"], default="read",
                   help="one read of --pages pages, or attention over a working set (default read)")
    add_preset_arg(p)
    p.add_argument("--planes", type=int, default=None,
                   help="independent planes (bins); default: the preset's parallel units (hbflex: 3072)")
    p.add_argument("--pages", type=int, default=3072, help="physical pages in the read (read workload; default "
                   "3072 = one 12 MiB read of 4 KiB pages)")
    p.add_argument("--placement", choices=list(collide.PLACEMENTS), default="random")
    p.add_argument("--group-size", type=int, default=None,
                   help="planes per plane group G (plane-group; default: all planes)")
    p.add_argument("--pages-per-logical", type=int, default=1,
                   help="physical pages per logical KV page L, striped over distinct planes (read workload)")
    p.add_argument("--pages-per-block", type=int, default=None,
                   help="pages a request fills on one plane before the next (isolated; default: the preset's "
                        "pages per block, else 512)")
    p.add_argument("--offload-fraction", type=float, default=0.0,
                   help="fraction f of top-loaded planes whose excess pages are served from SRAM (default 0)")
    a = p.add_argument_group("attention workload")
    a.add_argument("--trace", default=None, help="trace file for context lengths (a name is looked up in "
                   "../shared/traces/); default: a lognormal distribution")
    a.add_argument("--context-tokens-mean", type=float, default=8192.0, help="lognormal mean context, tokens")
    a.add_argument("--context-tokens-sigma", type=float, default=1.0, help="lognormal sigma of log-context")
    a.add_argument("--model-kv-bytes-per-token", type=float, default=1024.0,
                   help="KV bytes per token per layer (default 1024: the HBFlex 1-KiB-per-token model)")
    a.add_argument("--logical-page-tokens", type=int, default=16, help="tokens per logical KV page T (default 16)")
    a.add_argument("--slots", type=int, default=32, help="concurrent requests in the working set (default 32)")
    a.add_argument("--max-context-tokens", type=int, default=16384,
                   help="longest context held per request; longer ones are truncated and counted (default 16384)")
    a.add_argument("--chunk-tokens", type=int, default=256, help="tokens per CTA work tile (default 256)")
    a.add_argument("--chunks-per-wave", type=int, default=None,
                   help="work tiles read per scheduling wave (default: about one page per plane)")
    a.add_argument("--schedule", choices=list(workingset.SCHEDULES), default="in-order")
    a.add_argument("--shared-prefix-tokens", type=int, default=0, help="shared system-prompt tokens (default 0)")
    a.add_argument("--replicas", type=int, default=1, help="copies of the shared prefix in distinct groups")
    a.add_argument("--measurements", type=int, default=4, help="attention reads measured per stream (default 4)")
    add_common_args(p, default_streams=256)
    p.set_defaults(func=run)


def _planes_and_block(args) -> tuple[int, int, object]:
    # without --preset the HBFlex package supplies what the flags leave open (3,072 planes, tR 4 µs, ...)
    spec = preset_or_none(args.preset) or preset("hbflex")
    planes = args.planes or spec.hbf.parallel_units
    block = args.pages_per_block or spec.hbf.pages_per_block
    if planes < 1:
        raise ConfigError(f"--planes = {planes}: must be >= 1")
    return planes, block, spec


def context_pool(args) -> np.ndarray:
    """Context lengths (tokens) the working set replays: a trace's prompt + output, or lognormal draws."""
    if args.trace:
        tokens = traces.load_trace(args.trace).context_tokens
    else:
        if args.context_tokens_mean <= 0 or args.context_tokens_sigma < 0:
            raise ConfigError("--context-tokens-mean must be > 0 and --context-tokens-sigma >= 0")
        sigma = args.context_tokens_sigma
        mu = np.log(args.context_tokens_mean) - sigma**2 / 2
        tokens = np.random.default_rng(args.seed).lognormal(mu, sigma, 8192)
    return tokens


def run(args) -> int:
    planes, block, spec = _planes_and_block(args)
    group = args.group_size or planes
    collide.check_group_size(planes, group)
    if not 0.0 <= args.offload_fraction < 1.0:
        raise ConfigError(f"--offload-fraction = {args.offload_fraction}: must be in [0, 1)")
    page_bytes = spec.hbf.page_bytes
    if args.workload == "read":
        return _run_read(args, planes, block, group, spec, page_bytes)
    return _run_attention(args, planes, block, group, page_bytes)


def _run_read(args, planes, block, group, spec, page_bytes) -> int:
    if args.pages < 1:
        raise ConfigError(f"--pages = {args.pages}: must be >= 1")
    config = collide.ReadConfig(planes=planes, max_pages=args.pages, placement=args.placement, page_bytes=page_bytes,
                                t_read_us=spec.hbf.t_read_us, read_bw_gbps=spec.hbf.read_bw_gbps,
                                offload=args.offload_fraction > 0)
    knobs = collide.ReadKnobs(pages=jnp.int32(args.pages), placement=collide.PlacementKnobs.make(
        group, args.pages_per_logical, block, args.offload_fraction))
    out = fields(batch.run(collide.simulate, args.streams, args.seed, knobs, config, chunk_streams=args.chunk_streams,
                           map_streams=batch.cpu_map_streams()))
    s = mean_ci_fields(out, ("waves", "amplification", "max_to_avg_load", "offloaded_pages", "read_time_us"))
    emit({"workload": "read", "planes": planes, "pages": args.pages, "streams": args.streams, "seed": args.seed,
          "placement": args.placement, "group_size": group, "pages_per_logical": args.pages_per_logical,
          "offload_fraction": args.offload_fraction,
          "mean_waves": s["waves"], "ci95_waves": s["ci95_waves"],
          "ideal_waves": int(collide.ideal_waves(args.pages, planes)),
          "amplification": s["amplification"], "ci95_amplification": s["ci95_amplification"],
          "max_to_avg_load": s["max_to_avg_load"],
          "sram_bytes": s["offloaded_pages"] * page_bytes,
          "read_time_us": s["read_time_us"], "ci95_read_time_us": s["ci95_read_time_us"]}, args.json)
    return 0


def _run_attention(args, planes, block, group, page_bytes) -> int:
    config = workingset.attention_config(
        planes, args.slots, args.model_kv_bytes_per_token, logical_page_tokens=args.logical_page_tokens,
        chunk_tokens=args.chunk_tokens, max_context_tokens=args.max_context_tokens,
        chunks_per_wave=args.chunks_per_wave, measurements=args.measurements, placement=args.placement,
        schedule=args.schedule, page_bytes=page_bytes)
    inputs = workingset.WorkingSetInputs.make(context_pool(args))
    knobs = workingset.WorkingSetKnobs.make(
        args.model_kv_bytes_per_token, group_size=group, offload_fraction=args.offload_fraction,
        logical_page_tokens=args.logical_page_tokens, pages_per_block=block,
        shared_prefix_tokens=args.shared_prefix_tokens, replicas=args.replicas)
    out = fields(batch.run(workingset.simulate, args.streams, args.seed, knobs, config, inputs=inputs,
                           chunk_streams=args.chunk_streams, progress=not args.json))
    s = mean_ci_fields(out, ("waves", "ideal_waves", "amplification", "max_to_avg_load", "hot_plane_fraction",
                       "offload_max_to_avg_load", "sram_bytes", "pages"))
    emit({"workload": "attention", "planes": planes, "pages": s["pages"], "streams": args.streams, "seed": args.seed,
          "placement": args.placement, "schedule": args.schedule, "group_size": group,
          "offload_fraction": args.offload_fraction, "slots": args.slots, "trace": args.trace,
          "pages_per_logical": config.max_pages_per_logical, "chunks_per_wave": config.chunks_per_wave,
          "mean_waves": s["waves"], "ci95_waves": s["ci95_waves"], "ideal_waves": s["ideal_waves"],
          "amplification": s["amplification"], "ci95_amplification": s["ci95_amplification"],
          "max_to_avg_load": s["max_to_avg_load"], "ci95_max_to_avg_load": s["ci95_max_to_avg_load"],
          "hot_plane_fraction": s["hot_plane_fraction"],
          "offload_max_to_avg_load": s["offload_max_to_avg_load"], "sram_bytes": s["sram_bytes"],
          "truncated_requests": int(np.sum(out["truncated_requests"])),
          "requests_simulated": int(np.sum(out["arrivals"]))}, args.json)
    return 0
