"""``hbfjax gc``: write amplification, erases and lifetime of HBF garbage collection, batched."""

from __future__ import annotations

import argparse
import math

from hbfjax import batch
from hbfjax.commands._common import add_common_args, emit
from hbfjax.flash.erase import endurance, analytic as gc_analytic, gc_overwrite, kv_lifetimes
from hbfjax.flash.erase.gc import BlockConfig
from hbfjax.reports import fields, gc_summary
from hbfjax.workload.eviction import oldest_first
from hbfjax.hardware import preset
from hbfjax.validate import ConfigError

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
example:
  hbfjax gc --blocks 256 --pages-per-block 32 --spare-factor 0.15 --victim greedy --workload uniform --json"""


def register(subparsers) -> None:
    p = subparsers.add_parser("gc", help="GC write amplification, erases and flash lifetime (batched Monte Carlo)",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("device")
    g.add_argument("--blocks", type=int, default=256, help="blocks per stream (default 256)")
    g.add_argument("--pages-per-block", type=int, default=32, help="pages per block (default 32)")
    g.add_argument("--spare-factor", type=float, default=0.15,
                   help="fraction of physical pages not backing logical pages, in (0, 1) (default 0.15)")
    g.add_argument("--preset", choices=["hbflex", "dash"], default="hbflex",
                   help="hardware preset for page size, tPROG, capacity and P/E cycles (default hbflex)")
    g = p.add_argument_group("policy")
    g.add_argument("--victim", choices=["greedy", "fifo", "random"], default="greedy", help="GC victim policy")
    g.add_argument("--allocation", choices=list(kv_lifetimes.ALLOCATIONS), default="interleaved",
                   help="kv block allocation (default interleaved)")
    g.add_argument("--label-fallback", action=argparse.BooleanOptionalAction, default=True,
                   help="kv lifetime allocation: a label whose block is full when no free block may be opened "
                        "writes into the closest label's block (HBFlex §5.4; default on). Off: the host keeps "
                        "a free block per label in reserve")
    g.add_argument("--victims-per-gc", type=int, default=8,
                   help="victims examined per GC round (default 8; fewer, in more rounds, track a sequential FTL "
                        "more closely with random victims)")
    g.add_argument("--gc-trigger-used", type=float, default=None,
                   help="kv: GC when used pages exceed this fraction (default 0.95, HBFlex)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=["uniform", "hotcold", "kv"], default="uniform")
    g.add_argument("--hot-fraction", type=float, default=0.2, help="hotcold: fraction f of pages that are hot")
    g.add_argument("--hot-write-fraction", type=float, default=0.8, help="hotcold: fraction r of writes to them")
    g.add_argument("--drive-writes", type=float, default=4.0, help="measured host writes, in drive writes (default 4)")
    g.add_argument("--warmup-drive-writes", type=float, default=2.0, help="unmeasured drive writes first (default 2)")
    g.add_argument("--lifetime", choices=["exponential", "deterministic", "lognormal"], default="exponential",
                   help="kv: request lifetime distribution (ignored with --trace)")
    g.add_argument("--mean-lifetime-ticks", type=float, default=100.0, help="kv: mean lifetime (ticks)")
    g.add_argument("--lifetime-sigma", type=float, default=0.5, help="kv lognormal: sigma of ln(lifetime)")
    g.add_argument("--slots", type=int, default=32, help="kv: concurrent requests at most (default 32)")
    g.add_argument("--pages-per-tick", type=int, default=2, help="kv: pages a live request writes per tick")
    g.add_argument("--ticks", type=int, default=600, help="kv: measured ticks (plus as many warm-up ticks / 2)")
    g.add_argument("--trace", default=None, help="kv: replay a trace file (Azure/Mooncake/SWE-bench/Bailian)")
    g.add_argument("--daily-write-tb", type=float, default=8.37,
                   help="host KV writes per day for the lifetime, TB (default 8.37: HBFlex §3.3 DeepSeek-V3)")
    add_common_args(p, default_streams=64)
    p.set_defaults(func=main)


def _overwrite(args, streams):
    k = args.pages_per_block
    blocks = BlockConfig(n_blocks=args.blocks, pages_per_block=k, victim=args.victim,
                         victims_per_gc=args.victims_per_gc)
    logical = int(round((1.0 - args.spare_factor) * blocks.physical_pages))
    chunk = k
    n = lambda dw: max(1, math.ceil(dw * logical / chunk))  # noqa: E731
    cfg = gc_overwrite.OverwriteConfig(blocks=blocks, logical_pages=logical, chunk_pages=chunk,
                                       warmup_chunks=n(args.warmup_drive_writes) if args.warmup_drive_writes > 0 else 0,
                                       measure_chunks=n(args.drive_writes), workload=args.workload)
    knobs = gc_overwrite.OverwriteKnobs.make(cfg, args.hot_fraction, args.hot_write_fraction)
    out = fields(batch.run(gc_overwrite.simulate, streams, args.seed, knobs, cfg, chunk_streams=args.chunk_streams))
    res = gc_summary(out, blocks.physical_pages, valid_pages=logical)
    if args.workload == "uniform":
        a = res["alpha_effective"]
        res["analytic_waf"] = {"greedy": gc_analytic.waf_greedy(a, k), "fifo": gc_analytic.waf_fifo(a),
                               "random": gc_analytic.waf_random(a)}[args.victim]
    res["stalled_chunks"] = int(out["stalled_chunks"].sum())
    return res, blocks


def _kv(args, streams):
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
    knobs = kv_lifetimes.KvKnobs.make(cfg, mean_lifetime_ticks=args.mean_lifetime_ticks, lifetime_sigma=args.lifetime_sigma,
                               evict_used=1.0 - args.spare_factor, gc_trigger_used=trig)
    out = fields(batch.run(kv_lifetimes.simulate, streams, args.seed, knobs, cfg, inputs=kv_lifetimes.KvInputs.make(trace),
                           chunk_streams=args.chunk_streams))
    res = gc_summary(out, cfg.blocks.physical_pages)
    res["evicted_requests"] = int(out["evicted_requests"].sum())
    res["moved_weight_pages"] = int(out["moved_weight_pages"].sum())
    res["label_fallback_pages"] = int(out["label_fallback_pages"].sum())
    return res, cfg.blocks


def main(args) -> int:
    if not 0.0 < args.spare_factor < 1.0:
        raise ConfigError(f"--spare-factor = {args.spare_factor}: must be in (0, 1)")
    if args.streams < 1:
        raise ConfigError(f"--streams = {args.streams}: must be >= 1")
    for name in ("drive_writes", "daily_write_tb"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be > 0")
    # configuration errors (GcConfigError, SpecError: both ValueErrors) reach hbfjax.cli, which
    # prints them and exits with status 2 like every subcommand
    hbf = preset(args.preset).hbf
    res, blocks = _kv(args, args.streams) if args.workload == "kv" else _overwrite(args, args.streams)
    res["migrated_bytes"] = res["migrated_pages"] * hbf.page_bytes
    # Migrated pages are programs: plane-busy time at tPROG each, and as full page waves.
    res["migration_plane_time_us"] = res["migrated_pages"] * hbf.t_prog_us
    res["migration_wave_time_us"] = res["migrated_pages"] / hbf.parallel_units * hbf.t_prog_us
    daily = args.daily_write_tb * TB
    waf = max(res["waf"], 1.0)
    res["lifetime_dash"] = endurance.dash_lifetime(hbf.capacity_bytes, hbf.pe_cycles, waf, daily / 86400.0)
    res["lifetime_hbflex"] = endurance.hbflex_budget(hbf.capacity_bytes, hbf.pe_cycles, 5.0, daily, waf)
    res["lifetime_years"] = res["lifetime_hbflex"]["lifetime_years"]
    emit(res, args.json)
    return 1 if res["overflow"] else 0
