"""``hbfjax gc``: write amplification, erases and lifetime of HBF garbage collection, batched."""

from __future__ import annotations

import argparse
import math

from hbfjax.commands import _choices as names
from hbfjax.commands._common import PRESET_NAMES, add_common_args, add_hbf_args, blame, emit, hbf_part, require_applies
from hbfjax.hardware import preset
from hbfjax.validate import ConfigError, number, require

TB = 1e12

EPILOG = """units and definitions:
  a page is one NAND page (--page-bytes, default the preset's 4 KiB); a block is --pages-per-block pages.
  spare factor s = 1 - logical/physical pages (uniform/hotcold); for kv, valid KV is capped at (1 - s) of
  physical pages by evicting the oldest requests (HBFlex evicts at 90 %% used: s = 0.1).
  WAF = (host + GC-migrated page programs) / host page programs, measured after the warm-up (the first
  fill and --warmup-drive-writes / warm-up ticks), whose host writes are reported apart.
  drive writes = host page writes / logical pages. kv time is in ticks (serving iterations).
  effective_spare_factor excludes the free reserve and open blocks (pages not in circulation).
  lifetime: DASH §VI-H  C_KV*E_SLC/(A_W*R_HBF*u) and HBFlex §3.3  P/E*capacity/(daily writes*WAF), on the
  preset's capacity and P/E cycles, at --daily-write-tb TB (1e12 B) of host KV writes per day.
  --hbf PART replaces the preset with --hbf-stacks stacks (default 1) of the part: page bytes, tPROG,
  capacity, P/E cycles and the planes of a page wave; the JSON's hbf_part gives each value's source.
example:
  hbfjax gc --blocks 256 --pages-per-block 32 --spare-factor 0.15 --victim greedy --workload uniform --json"""


INT = lambda lo=1, hi=None: number(int, lo, hi)  # noqa: E731
FRACTION = number(float, 0.0, 1.0, lo_open=True, hi_open=True)  # in (0, 1)
# mode-dependent options default to None (so a given one can be told from a default) and take these
OVERWRITE_DEFAULTS = {"hot_fraction": 0.2, "hot_write_fraction": 0.8, "drive_writes": 4.0, "warmup_drive_writes": 2.0}
KV_DEFAULTS = {"allocation": "interleaved", "label_fallback": True, "lifetime": "exponential",
               "mean_lifetime_ticks": 100.0, "lifetime_sigma": 0.5, "slots": 32, "pages_per_tick": 2, "ticks": 600}


def register(subparsers) -> None:
    p = subparsers.add_parser("gc", help="GC write amplification, erases and flash lifetime (batched Monte Carlo)",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("device")
    g.add_argument("--blocks", type=INT(), default=256, help="blocks per stream, >= 4 (default 256)")
    g.add_argument("--pages-per-block", type=INT(), default=32, help="pages per block (default 32)")
    g.add_argument("--spare-factor", type=FRACTION, default=0.15,
                   help="fraction of physical pages not backing logical pages, in (0, 1) (default 0.15)")
    g.add_argument("--preset", choices=PRESET_NAMES, default=None,
                   help="hardware preset for page size, tPROG, capacity and P/E cycles (default hbflex; or --hbf)")
    g = p.add_argument_group("policy")
    g.add_argument("--victim", choices=["greedy", "fifo", "random"], default="greedy", help="GC victim policy")
    g.add_argument("--allocation", choices=list(names.ALLOCATIONS), default=None,
                   help="kv block allocation (default interleaved)")
    g.add_argument("--label-fallback", action=argparse.BooleanOptionalAction, default=None,
                   help="kv lifetime allocation: a label whose block is full when no free block may be opened "
                        "writes into the closest label's block (HBFlex §5.4; default on). Off: the host keeps "
                        "a free block per label in reserve")
    g.add_argument("--victims-per-gc", type=INT(), default=8,
                   help="victims examined per GC round, at most --blocks (default 8; fewer, in more rounds, track a "
                        "sequential FTL more closely with random victims)")
    g.add_argument("--gc-trigger-used", type=number(float, 0.0, 1.0, lo_open=True), default=None,
                   help="kv: GC when used pages exceed this fraction, in (0, 1] (default 0.95, HBFlex)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=["uniform", "hotcold", "kv"], default="uniform")
    g.add_argument("--hot-fraction", type=FRACTION, default=None,
                   help="hotcold: fraction f of pages that are hot, in (0, 1) (default 0.2)")
    g.add_argument("--hot-write-fraction", type=FRACTION, default=None,
                   help="hotcold: fraction r of writes to them, in (0, 1) (default 0.8)")
    g.add_argument("--drive-writes", type=number(float, 0.0, lo_open=True), default=None,
                   help="uniform/hotcold: measured host writes, in drive writes (default 4)")
    g.add_argument("--warmup-drive-writes", type=number(float, 0.0), default=None,
                   help="uniform/hotcold: unmeasured drive writes first (default 2)")
    g.add_argument("--lifetime", choices=["exponential", "deterministic", "lognormal"], default=None,
                   help="kv: request lifetime distribution, without --trace (default exponential)")
    g.add_argument("--mean-lifetime-ticks", type=number(float, 0.0, 2.0**30, lo_open=True), default=None,
                   help="kv: mean lifetime, ticks (default 100)")
    g.add_argument("--lifetime-sigma", type=number(float, 0.0, 10.0), default=None,
                   help="kv lognormal: sigma of ln(lifetime), in [0, 10] (default 0.5)")
    g.add_argument("--slots", type=INT(), default=None, help="kv: concurrent requests at most (default 32)")
    g.add_argument("--pages-per-tick", type=INT(), default=None,
                   help="kv: pages a live request writes per tick (default 2)")
    g.add_argument("--ticks", type=INT(), default=None,
                   help="kv: measured ticks (plus as many warm-up ticks / 2; default 600)")
    g.add_argument("--trace", default=None, help="kv: replay a trace file (Azure/Mooncake/SWE-bench/Bailian)")
    g.add_argument("--daily-write-tb", type=number(float, 0.0, lo_open=True), default=8.37,
                   help="host KV writes per day for the lifetime, TB (default 8.37: HBFlex §3.3 DeepSeek-V3)")
    add_hbf_args(p, stacks=True)
    add_common_args(p, default_streams=64)
    p.set_defaults(func=main)


def _check_options(args) -> None:
    """Refuse every option the chosen workload would ignore, then fill the mode's defaults."""
    kv = args.workload == "kv"
    synthetic_life = kv and not args.trace
    require_applies(args, f"--workload {args.workload}", {
        **{dest: not kv for dest in OVERWRITE_DEFAULTS}, **{dest: kv for dest in KV_DEFAULTS},
        "hot_fraction": args.workload == "hotcold", "hot_write_fraction": args.workload == "hotcold",
        "gc_trigger_used": kv, "trace": kv})
    life = args.lifetime or KV_DEFAULTS["lifetime"]
    require_applies(args, "--trace" if args.trace else f"--lifetime {life}", {
        "lifetime": synthetic_life, "mean_lifetime_ticks": synthetic_life,
        "lifetime_sigma": synthetic_life and life == "lognormal"})
    require_applies(args, f"--allocation {args.allocation or KV_DEFAULTS['allocation']}",
                    {"label_fallback": args.allocation == "lifetime"})
    for dest, value in {**OVERWRITE_DEFAULTS, **KV_DEFAULTS}.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)


def _require_host_writes(out: dict) -> None:
    """A WAF is a ratio over measured host writes: refuse a run in which a stream measured none."""
    import numpy as np

    host = np.asarray(out["host_writes"])
    require(bool(np.all(host >= 1)), "result", "host_writes", int(host.min()),
            f"{int(np.sum(host < 1))} of {host.size} streams measured no host write, so their WAF is undefined; "
            "run longer (--drive-writes, --ticks) or give the host room (a larger --spare-factor)")


def _overwrite(args, streams):
    from hbfjax import batch
    from hbfjax.flash.erase import analytic as gc_analytic, gc_overwrite
    from hbfjax.flash.erase.gc import BlockConfig
    from hbfjax.reports import fields, gc_summary

    k = args.pages_per_block
    with blame(args, "blocks", "pages_per_block", "victims_per_gc"):
        blocks = BlockConfig(n_blocks=args.blocks, pages_per_block=k, victim=args.victim,
                             victims_per_gc=args.victims_per_gc)
    logical = int(round((1.0 - args.spare_factor) * blocks.physical_pages))
    chunk = k
    n = lambda dw: max(1, math.ceil(dw * logical / chunk))  # noqa: E731
    warm = n(args.warmup_drive_writes) if args.warmup_drive_writes > 0 else 0
    with blame(args, "spare_factor", "drive_writes", "warmup_drive_writes", "blocks", "pages_per_block"):
        cfg = gc_overwrite.OverwriteConfig(blocks=blocks, logical_pages=logical, chunk_pages=chunk, warmup_chunks=warm,
                                           measure_chunks=n(args.drive_writes), workload=args.workload)
        knobs = gc_overwrite.OverwriteKnobs.make(cfg, args.hot_fraction, args.hot_write_fraction)
    out = fields(batch.run(gc_overwrite.simulate, streams, args.seed, knobs, cfg, chunk_streams=args.chunk_streams))
    _require_host_writes(out)
    res = gc_summary(out, blocks.physical_pages, valid_pages=logical)
    if args.workload == "uniform":
        a = res["alpha_effective"]
        res["analytic_waf"] = {"greedy": gc_analytic.waf_greedy(a, k), "fifo": gc_analytic.waf_fifo(a),
                               "random": gc_analytic.waf_random(a)}[args.victim]
    res["stalled_chunks"] = int(out["stalled_chunks"].sum())
    return res, blocks


def _kv(args, streams):
    from hbfjax import batch
    from hbfjax.flash.erase import kv_lifetimes
    from hbfjax.reports import fields, gc_summary
    from hbfjax.workload.eviction import oldest_first

    with blame(args, "blocks", "pages_per_block", "victims_per_gc", "slots", "pages_per_tick", "ticks"):
        cfg = kv_lifetimes.KvConfig(n_blocks=args.blocks, pages_per_block=args.pages_per_block, slots=args.slots,
                                    pages_per_tick=args.pages_per_tick, allocation=args.allocation,
                                    lifetime="trace" if args.trace else args.lifetime, victim=args.victim,
                                    victims_per_gc=args.victims_per_gc, warmup_ticks=args.ticks // 2,
                                    measure_ticks=args.ticks, label_fallback=args.label_fallback,
                                    evict=oldest_first)
    trace = None
    if args.trace:
        from hbfjax.traces import load_trace
        from hbfjax.workload.replay import kv_trace_requests

        trace, _ = kv_trace_requests(load_trace(args.trace), cfg.warmup_ticks + cfg.measure_ticks,
                                     cfg.blocks.physical_pages, cfg.pages_per_tick)
    trig = 0.95 if args.gc_trigger_used is None else args.gc_trigger_used
    knobs = kv_lifetimes.KvKnobs.make(cfg, mean_lifetime_ticks=args.mean_lifetime_ticks,
                                      lifetime_sigma=args.lifetime_sigma, evict_used=1.0 - args.spare_factor,
                                      gc_trigger_used=trig)
    out = fields(batch.run(kv_lifetimes.simulate, streams, args.seed, knobs, cfg, inputs=kv_lifetimes.KvInputs.make(trace),
                           chunk_streams=args.chunk_streams))
    _require_host_writes(out)
    res = gc_summary(out, cfg.blocks.physical_pages)
    res["evicted_requests"] = int(out["evicted_requests"].sum())
    res["moved_weight_pages"] = int(out["moved_weight_pages"].sum())
    res["label_fallback_pages"] = int(out["label_fallback_pages"].sum())
    return res, cfg.blocks


def main(args) -> int:
    res = compute(args)
    emit(res, args.json)
    return 1 if res["overflow"] else 0


def compute(args) -> dict:
    from hbfjax.flash.erase import endurance

    _check_options(args)
    # configuration errors (ConfigError) reach hbfjax.cli, which prints them and exits with status 2
    if args.hbf is not None and args.preset is not None:
        raise ConfigError(f"--hbf {args.hbf} and --preset {args.preset}: give one (each sets the HBF geometry)")
    part = hbf_part(args, need=("t_read_us", "t_prog_us", "read_units_per_die"),
                    only_with_hbf=("read_units_per_die", "hbf_stacks", "t_read_us", "t_prog_us"))
    if part is None:
        hbf = preset(args.preset or "hbflex").hbf
    else:
        from hbfjax.memory import hbf_parts

        hbf = hbf_parts.to_hbf_spec(part, args.hbf_stacks or 1)
    res, blocks = _kv(args, args.streams) if args.workload == "kv" else _overwrite(args, args.streams)
    res["migrated_bytes"] = res["migrated_pages"] * hbf.page_bytes
    # Migrated pages are programs: plane-busy time at tPROG each, and as full page waves.
    res["migration_plane_time_us"] = res["migrated_pages"] * hbf.t_prog_us
    res["migration_wave_time_us"] = res["migrated_pages"] / hbf.parallel_units * hbf.t_prog_us
    daily = args.daily_write_tb * TB
    waf = res["waf"]  # >= 1: every stream measured at least one host write (_require_host_writes)
    res["lifetime_dash"] = endurance.dash_lifetime(hbf.capacity_bytes, hbf.pe_cycles, waf, daily / 86400.0)
    res["lifetime_hbflex"] = endurance.hbflex_budget(hbf.capacity_bytes, hbf.pe_cycles, 5.0, daily, waf)
    res["lifetime_years"] = res["lifetime_hbflex"]["lifetime_years"]
    if part is not None:
        res["hbf_part"] = {**part.report(), "stacks": args.hbf_stacks or 1}
    return res
