"""``hbfjax collide``: plane collisions of HBF reads (HBFlex §3.1, §5.2, §6.4–6.5)."""

from __future__ import annotations

import argparse

from hbfjax.commands import _choices as names
from hbfjax.commands._common import (add_common_args, add_hbf_args, add_preset_arg, blame, emit, hbf_part,
                                     preset_or_none, require_applies)
from hbfjax.hardware import preset
from hbfjax.validate import ConfigError, number

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
  hbfjax collide --hbf ocp-hbf-v0.7 --t-read-us 4 --read-units-per-die 32 --json
  hbfjax collide --workload attention --preset hbflex --trace swebench_miniswe_agent.csv \\
      --model-kv-bytes-per-token 1024 --placement plane-group --schedule placement-aware --offload-fraction 0.1

--hbf PART (instead of --preset) takes planes = --hbf-stacks × dies × read units per die, tR, the page and
the read rate min(arrays, interface) from the part; the JSON's hbf_part gives every value's source.
"""


INT = lambda lo=1, hi=None: number(int, lo, hi)  # noqa: E731
ATTENTION_DEFAULTS = {"context_tokens_mean": 8192.0, "context_tokens_sigma": 1.0, "model_kv_bytes_per_token": 1024.0,
                      "logical_page_tokens": 16, "slots": 32, "max_context_tokens": 16384, "chunk_tokens": 256,
                      "schedule": "in-order", "shared_prefix_tokens": 0, "measurements": 4}
READ_DEFAULT_PAGES = 3072


def register(subparsers) -> None:
    p = subparsers.add_parser("collide", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["read", "attention"], default="read",
                   help="one read of --pages pages, or attention over a working set (default read)")
    add_preset_arg(p)
    p.add_argument("--planes", type=INT(1, names.MAX_PLANES), default=None,
                   help="independent planes (bins); default: the preset's parallel units (hbflex: 3072)")
    p.add_argument("--pages", type=INT(1, names.MAX_READ_PAGES), default=None,
                   help=f"physical pages in the read (read workload; default {READ_DEFAULT_PAGES} = one 12 MiB read "
                        "of 4 KiB pages)")
    p.add_argument("--placement", choices=list(names.PLACEMENTS), default="random")
    p.add_argument("--group-size", type=INT(), default=None,
                   help="planes per plane group G, dividing the planes (plane-group, and shared-prefix replicas; "
                        "default: all planes)")
    p.add_argument("--pages-per-logical", type=INT(), default=None,
                   help="physical pages per logical KV page L, striped over distinct planes (read workload, "
                        "plane-group; default 1)")
    p.add_argument("--pages-per-block", type=INT(), default=None,
                   help="pages a request fills on one plane before the next (isolated; default: the preset's "
                        "pages per block, else 512)")
    p.add_argument("--offload-fraction", type=number(float, 0.0, 1.0, hi_open=True), default=0.0,
                   help="fraction f in [0, 1) of top-loaded planes whose excess pages are served from SRAM "
                        "(default 0)")
    a = p.add_argument_group("attention workload (defaults in brackets)")
    d = ATTENTION_DEFAULTS
    a.add_argument("--trace", default=None, help="trace file for context lengths (a name is looked up in "
                   "../shared/traces/); default: a lognormal distribution")
    a.add_argument("--context-tokens-mean", type=number(float, 0.0, names.WORKINGSET_MAX_TOKENS, lo_open=True),
                   default=None, help=f"lognormal mean context, tokens [{d['context_tokens_mean']:g}]")
    a.add_argument("--context-tokens-sigma", type=number(float, 0.0, 10.0), default=None,
                   help=f"lognormal sigma of log-context, in [0, 10] [{d['context_tokens_sigma']:g}]")
    a.add_argument("--model-kv-bytes-per-token", type=number(float, 0.0, names.WORKINGSET_MAX_TOKENS, lo_open=True),
                   default=None, help="KV bytes per token per layer [1024: the HBFlex 1-KiB-per-token model]")
    a.add_argument("--logical-page-tokens", type=INT(1, names.WORKINGSET_MAX_TOKENS), default=None,
                   help=f"tokens per logical KV page T [{d['logical_page_tokens']}]")
    a.add_argument("--slots", type=INT(), default=None,
                   help=f"concurrent requests in the working set [{d['slots']}]")
    a.add_argument("--max-context-tokens", type=INT(1, names.WORKINGSET_MAX_TOKENS), default=None,
                   help=f"longest context held per request; longer ones are truncated and counted "
                        f"[{d['max_context_tokens']}]")
    a.add_argument("--chunk-tokens", type=INT(1, names.WORKINGSET_MAX_TOKENS), default=None,
                   help=f"tokens per CTA work tile, a multiple of T [{d['chunk_tokens']}]")
    a.add_argument("--chunks-per-wave", type=INT(), default=None,
                   help="work tiles read per scheduling wave [about one page per plane]")
    a.add_argument("--schedule", choices=list(names.SCHEDULES), default=None, help="[in-order]")
    a.add_argument("--shared-prefix-tokens", type=INT(0, names.WORKINGSET_MAX_TOKENS), default=None,
                   help="shared system-prompt tokens [0]")
    a.add_argument("--replicas", type=INT(), default=None,
                   help="copies of the shared prefix in distinct groups (with --shared-prefix-tokens) [1]")
    a.add_argument("--measurements", type=INT(), default=None,
                   help=f"attention reads measured per stream [{d['measurements']}]")
    add_hbf_args(p, times=("t_read_us",), stacks=True)
    add_common_args(p, default_streams=256)
    p.set_defaults(func=run)


def _check_options(args) -> None:
    """Refuse every option the chosen workload and placement would ignore."""
    read = args.workload == "read"
    mode = f"--workload {args.workload} --placement {args.placement}"
    prefix = bool(args.shared_prefix_tokens)
    require_applies(args, mode, {
        "pages": read, "pages_per_logical": read and args.placement == "plane-group",
        "pages_per_block": args.placement == "isolated",
        "group_size": args.placement == "plane-group" or (not read and prefix),
        **{dest: not read for dest in ATTENTION_DEFAULTS}, "trace": not read, "chunks_per_wave": not read,
        "replicas": not read and prefix})
    require_applies(args, "--trace", {"context_tokens_mean": not args.trace, "context_tokens_sigma": not args.trace})
    if not read:
        for dest, value in ATTENTION_DEFAULTS.items():
            if getattr(args, dest) is None:
                setattr(args, dest, value)
    elif args.pages is None:
        args.pages = READ_DEFAULT_PAGES


def _part_spec(args):
    """The ``--hbf`` part as a one-package system (``--hbf-stacks`` stacks, default 1), or None."""
    from hbfjax.hardware import SystemSpec
    from hbfjax.memory import hbf_parts

    if args.hbf is not None and args.preset is not None:
        raise ConfigError(f"--hbf {args.hbf} and --preset {args.preset}: give one (each sets the HBF geometry)")
    part = hbf_part(args, need=("t_read_us", "read_units_per_die"),
                    only_with_hbf=("read_units_per_die", "hbf_stacks", "t_read_us"))
    if part is None:
        return None, None
    return part, SystemSpec(name=part.name, hbf=hbf_parts.to_hbf_spec(part, args.hbf_stacks or 1))


def _planes_and_block(args) -> tuple[int, int, object]:
    # without --preset the HBFlex package supplies what the flags leave open (3,072 planes, tR 4 µs, ...)
    spec = args.part_spec or preset_or_none(args.preset) or preset("hbflex")
    planes = spec.hbf.parallel_units if args.planes is None else args.planes
    block = spec.hbf.pages_per_block if args.pages_per_block is None else args.pages_per_block
    return planes, block, spec


def context_pool(args) -> np.ndarray:
    """Context lengths (tokens) the working set replays: a trace's prompt + output, or lognormal draws."""
    import numpy as np

    from hbfjax import traces

    if args.trace:
        tokens = traces.load_trace(args.trace).context_tokens
    else:
        sigma = args.context_tokens_sigma
        mu = np.log(args.context_tokens_mean) - sigma**2 / 2
        tokens = np.random.default_rng(args.seed).lognormal(mu, sigma, 8192)
    return tokens


def run(args) -> int:
    emit(compute(args), args.json)
    return 0


def compute(args) -> dict:
    from hbfjax.flash.reads import collide

    _check_options(args)
    part, args.part_spec = _part_spec(args)
    planes, block, spec = _planes_and_block(args)
    group = planes if args.group_size is None else args.group_size
    with blame(args, "planes", "group_size"):
        collide.check_group_size(planes, group)
    page_bytes = spec.hbf.page_bytes
    if args.workload == "read":
        out = _read(args, planes, block, group, spec, page_bytes)
    else:
        out = _attention(args, planes, block, group, page_bytes)
    if part is not None:
        out["hbf_part"] = {**part.report(), "stacks": args.hbf_stacks or 1}
    return out


def _read(args, planes, block, group, spec, page_bytes) -> dict:
    import jax.numpy as jnp

    from hbfjax import batch
    from hbfjax.flash.reads import collide
    from hbfjax.reports import fields, mean_ci_fields

    per_logical = 1 if args.pages_per_logical is None else args.pages_per_logical
    config = collide.ReadConfig(planes=planes, max_pages=args.pages, placement=args.placement, page_bytes=page_bytes,
                                t_read_us=spec.hbf.t_read_us, read_bw_gbps=spec.hbf.read_bw_gbps,
                                offload=args.offload_fraction > 0)
    knobs = collide.ReadKnobs(pages=jnp.int32(args.pages), placement=collide.PlacementKnobs.make(
        group, per_logical, block, args.offload_fraction))
    out = fields(batch.run(collide.simulate, args.streams, args.seed, knobs, config, chunk_streams=args.chunk_streams,
                           map_streams=batch.cpu_map_streams()))
    s = mean_ci_fields(out, ("waves", "ideal_waves", "amplification", "max_to_avg_load", "offloaded_pages",
                             "read_time_us"))
    # with offload the ideal counts only the pages read from planes (pages − SRAM-served), so waves ≥ ideal
    ideal = s["ideal_waves"] if config.offload else int(collide.ideal_waves(args.pages, planes))
    offload = {"sram_served_pages": s["offloaded_pages"],
               "ideal_waves_all_pages": int(collide.ideal_waves(args.pages, planes))} if config.offload else {}
    return {"workload": "read", "planes": planes, "pages": args.pages, "streams": args.streams, "seed": args.seed,
          "placement": args.placement, "group_size": group, "pages_per_logical": per_logical,
          "offload_fraction": args.offload_fraction,
          "mean_waves": s["waves"], "ci95_waves": s["ci95_waves"], "ideal_waves": ideal, **offload,
          "amplification": s["amplification"], "ci95_amplification": s["ci95_amplification"],
          "max_to_avg_load": s["max_to_avg_load"],
          "sram_bytes": s["offloaded_pages"] * page_bytes,
          "read_time_us": s["read_time_us"], "ci95_read_time_us": s["ci95_read_time_us"]}


def _attention(args, planes, block, group, page_bytes) -> dict:
    import numpy as np

    from hbfjax import batch
    from hbfjax.flash.reads import workingset
    from hbfjax.reports import fields, mean_ci_fields

    replicas = 1 if args.replicas is None else args.replicas
    config = workingset.attention_config(
        planes, args.slots, args.model_kv_bytes_per_token, logical_page_tokens=args.logical_page_tokens,
        chunk_tokens=args.chunk_tokens, max_context_tokens=args.max_context_tokens,
        chunks_per_wave=args.chunks_per_wave, measurements=args.measurements, placement=args.placement,
        schedule=args.schedule, page_bytes=page_bytes)
    inputs = workingset.WorkingSetInputs.make(context_pool(args))
    knobs = workingset.WorkingSetKnobs.make(
        args.model_kv_bytes_per_token, group_size=group, offload_fraction=args.offload_fraction,
        logical_page_tokens=args.logical_page_tokens, pages_per_block=block,
        shared_prefix_tokens=args.shared_prefix_tokens, replicas=replicas)
    with blame(args, "replicas", "group_size"):
        workingset.check_replicas(replicas, planes, group, config)
    out = fields(batch.run(workingset.simulate, args.streams, args.seed, knobs, config, inputs=inputs,
                           chunk_streams=args.chunk_streams, progress=not args.json))
    s = mean_ci_fields(out, ("waves", "ideal_waves", "amplification", "max_to_avg_load", "hot_plane_fraction",
                       "offload_max_to_avg_load", "sram_bytes", "pages"))
    return {"workload": "attention", "planes": planes, "pages": s["pages"], "streams": args.streams, "seed": args.seed,
          "placement": args.placement, "schedule": args.schedule, "group_size": group,
          "offload_fraction": args.offload_fraction, "slots": args.slots, "trace": args.trace,
          "pages_per_logical": config.max_pages_per_logical, "chunks_per_wave": config.chunks_per_wave,
          "mean_waves": s["waves"], "ci95_waves": s["ci95_waves"], "ideal_waves": s["ideal_waves"],
          "amplification": s["amplification"], "ci95_amplification": s["ci95_amplification"],
          "max_to_avg_load": s["max_to_avg_load"], "ci95_max_to_avg_load": s["ci95_max_to_avg_load"],
          "hot_plane_fraction": s["hot_plane_fraction"],
          "offload_max_to_avg_load": s["offload_max_to_avg_load"], "sram_bytes": s["sram_bytes"],
          "truncated_requests": int(np.sum(out["truncated_requests"])),
          "requests_simulated": int(np.sum(out["arrivals"]))}
