"""``hbfjax disturb``: read-disturb reclaim and time-based refresh of HBF blocks (issue 26), batched.

Every page read adds to its block's read counter; a block whose counter reaches --read-disturb-reads is
relocated (its valid pages read and programmed into an erased block, the old block erased), and with
--refresh-hours every block not programmed for that long is rewritten the same way. Reports the
relocation and refresh rates, erases per block, the plane time the rewrites take and the lifetime the
erase rate leaves, beside the renewal-theory rates, with 95 % CIs across streams.
"""

from __future__ import annotations

import argparse
import math

from hbfjax.commands._common import add_common_args, blame, emit, require_applies
from hbfjax.hardware import preset
from hbfjax.validate import number, require

_HBF = preset("hbflex").hbf  # defaults for pages per block, tR and tPROG (HBFlex §3; hardware.py sources)
SKEWS = ("uniform", "hotcold", "zipf")
DESTINATIONS = ("least-worn", "same-plane")  # kept local (hbfjax.flash.disturb.reclaim.DESTINATIONS, by name)
STARTS = ("steady", "fresh")
MAX_STEPS = 200_000  # one lax.scan step each; more is minutes of CPU
MAX_PLANES = 4096
MAX_BLOCKS = 2**24
MAX_READS = 2**30
SKEW_DEFAULTS = {"hot_fraction": 0.1, "hot_read_fraction": 0.9, "zipf_exponent": 1.0}

EPILOG = f"""units and definitions:
  a stream is one slice of the device: --planes planes of --blocks / --planes physical blocks each;
  --free-blocks-per-plane of each plane's blocks are erased (the pool relocations write into), the others
  hold data blocks of --pages-per-block valid pages. Data block d starts on plane d mod --planes.
  reads: --reads-per-s page reads per second over the stream's data blocks, shared by --read-skew
  (uniform; hotcold: --hot-fraction of the blocks take --hot-read-fraction of the reads; zipf: block d
  takes a share proportional to (d + 1)^-s). Poisson per block and step, or exactly at the rate with
  --constant-rate.
  a block whose counter reaches N = --read-disturb-reads is relocated; its new block starts at the reads
  past N. Refresh rewrites a block whose last program is --refresh-hours old (0 or absent: off).
  --destination least-worn takes the erased block with the fewest erases anywhere, same-plane the one of
  the block's own plane. Each rewritten page is a read on the source plane (tR) and a program on the
  destination plane (tPROG); planes work in parallel, one page per page-round.
  program shares = rewrite program time / plane time (planes × simulated time); busiest-plane share:
  the plane with the most rewrite time (reads and programs).
  erases per block: over all physical blocks (mean: perfect wear levelling; worst: the most erased block).
  lifetime = P/E cycles / erases per block per year (365.25 days), ci95 by the delta method; unbounded
  when no block is erased.
  renewal_*: the long-run rates for N >> 1 (a block read at l pages/s is rewritten every min(N/l, T)).
  --start steady (default, assumed: a device in use) puts each block at a uniform phase of its rewrite
  cycle (counter uniform on [0, N) or age uniform on [0, T), whichever limits it, the other consistent);
  fresh starts every counter at 0, every block just programmed (rates then lag the renewal ones by about
  half a rewrite per block).
  time: steps of --step-s seconds (default: the longest step <= 60 s in which the hottest block gets at
  most N/4 reads, each group's pool is at most a quarter used, and a refresh interval spans >= 64 steps).
sources of defaults:
  --read-disturb-reads 1e6 and --pe-cycles 1e5: issue 26's public artifact (HBF read reclaim after 10^6
  reads per block, 10^5 P/E cycles); refresh every 24-48 h: OCP HBF specification v0.7 (2026-08) (off unless
  given); --pages-per-block {_HBF.pages_per_block}, --t-read-us {_HBF.t_read_us:g}, --t-prog-us {_HBF.t_prog_us:g}:
  the hbflex preset (HBFlex §3); --free-blocks-per-plane 8, --reads-per-s 1e6 (half of 8 planes' 4 µs tR
  rate), --destination least-worn, --start steady: assumed.
example:
  hbfjax disturb --read-disturb-reads 1e6 --refresh-hours 24 --read-skew hotcold --hours 24 --json"""

INT = lambda lo=1, hi=None: number(int, lo, hi)  # noqa: E731
POSITIVE = lambda hi=None: number(float, 0.0, hi, lo_open=True)  # noqa: E731
FRACTION = number(float, 0.0, 1.0, lo_open=True, hi_open=True)


def register(subparsers) -> None:
    p = subparsers.add_parser("disturb", help="read-disturb reclaim and refresh: relocations, erases, plane time, "
                                              "lifetime (batched Monte Carlo)",
                              description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("device (one stream)")
    g.add_argument("--planes", type=INT(1, MAX_PLANES), default=8, help="planes per stream (default 8)")
    g.add_argument("--blocks", type=INT(2, MAX_BLOCKS), default=1024,
                   help="physical blocks per stream, a multiple of --planes (default 1024)")
    g.add_argument("--free-blocks-per-plane", type=INT(1), default=8,
                   help="erased blocks per plane, the relocation pool (default 8, assumed)")
    g.add_argument("--pages-per-block", type=INT(1), default=_HBF.pages_per_block,
                   help=f"valid pages per data block, copied by each rewrite (default {_HBF.pages_per_block}, hbflex)")
    g.add_argument("--t-read-us", type=POSITIVE(1e6), default=_HBF.t_read_us,
                   help=f"page read time tR, µs (default {_HBF.t_read_us:g}, hbflex)")
    g.add_argument("--t-prog-us", type=POSITIVE(1e6), default=_HBF.t_prog_us,
                   help=f"page program time tPROG, µs (default {_HBF.t_prog_us:g}, hbflex)")
    g.add_argument("--pe-cycles", type=POSITIVE(1e12), default=1e5,
                   help="program/erase endurance per block (default 1e5: issue 26's public artifact)")
    g = p.add_argument_group("mechanism")
    g.add_argument("--read-disturb-reads", type=INT(1, MAX_READS), default=1_000_000,
                   help="reads of a block's pages that trigger its relocation (default 1e6: issue 26's artifact)")
    g.add_argument("--refresh-hours", type=number(float, 0.0, 1e6), default=None,
                   help="rewrite every block not programmed for this many hours; 0 or absent: off "
                        "(the OCP HBF spec v0.7 asks for 24-48 h)")
    g.add_argument("--destination", choices=DESTINATIONS, default="least-worn",
                   help="where a rewritten block goes: the least-worn erased block anywhere, or of its own plane")
    g = p.add_argument_group("read workload")
    g.add_argument("--reads-per-s", type=number(float, 0.0, 1e12), default=1e6,
                   help="host page reads per second over the stream's data blocks (default 1e6)")
    g.add_argument("--read-skew", choices=SKEWS, default="uniform", help="how the reads are shared by the blocks")
    g.add_argument("--hot-fraction", type=FRACTION, default=None,
                   help="hotcold: fraction of the data blocks that are hot, in (0, 1) (default 0.1)")
    g.add_argument("--hot-read-fraction", type=FRACTION, default=None,
                   help="hotcold: fraction of the reads that go to them, in (0, 1) (default 0.9)")
    g.add_argument("--zipf-exponent", type=number(float, 0.0, 10.0), default=None,
                   help="zipf: exponent s of the block shares (d + 1)^-s, in [0, 10] (default 1)")
    g.add_argument("--constant-rate", action="store_true",
                   help="each block read exactly at its rate (no Poisson noise): the deterministic case")
    g.add_argument("--host-write-pages-per-s", type=POSITIVE(1e12), default=None,
                   help="host page writes per second beside the reads (counted, not simulated): reports the "
                        "WAF the rewrites add, 1 + rewrite pages / host pages")
    g = p.add_argument_group("run")
    g.add_argument("--hours", type=POSITIVE(1e6), default=24.0, help="simulated hours (default 24)")
    g.add_argument("--step-s", type=POSITIVE(1e7), default=None,
                   help="seconds per step (default: chosen, see 'time:' below)")
    g.add_argument("--start", choices=STARTS, default="steady",
                   help="steady: a device in use (assumed); fresh: all counters 0, all blocks just programmed")
    add_common_args(p, default_streams=16)
    p.set_defaults(func=run)


def _check_options(args) -> None:
    """Refuse the skew options the chosen skew ignores, then fill their defaults; check the geometry."""
    require_applies(args, f"--read-skew {args.read_skew}", {
        "hot_fraction": args.read_skew == "hotcold", "hot_read_fraction": args.read_skew == "hotcold",
        "zipf_exponent": args.read_skew == "zipf"})
    for dest, value in SKEW_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    require(args.blocks % args.planes == 0, "", "--blocks", args.blocks,
            f"must be a multiple of --planes = {args.planes}")
    per_plane = args.blocks // args.planes
    require(args.free_blocks_per_plane < per_plane, "", "--free-blocks-per-plane", args.free_blocks_per_plane,
            f"must be < --blocks / --planes = {per_plane}, so that some blocks hold data")


def read_share(args, data_blocks: int):
    """float64[L] share of the reads of each data block (sums to 1)."""
    import numpy as np

    if args.read_skew == "uniform":
        return np.full(data_blocks, 1.0 / data_blocks)
    if args.read_skew == "zipf":
        w = (np.arange(data_blocks) + 1.0) ** -args.zipf_exponent
        return w / w.sum()
    hot = min(max(1, round(args.hot_fraction * data_blocks)), data_blocks - 1) if data_blocks > 1 else 1
    if hot == data_blocks:
        return np.full(data_blocks, 1.0 / data_blocks)
    share = np.full(data_blocks, (1.0 - args.hot_read_fraction) / (data_blocks - hot))
    share[:hot] = args.hot_read_fraction / hot
    return share


def step_s(args, share, data_blocks: int) -> float:
    """The step: at most 60 s; the hottest block gets at most N/4 reads; each destination group's erased
    pool is at most a quarter used per step on average; a refresh interval spans at least 64 steps."""
    import numpy as np

    if args.step_s is not None:
        return args.step_s
    n = args.read_disturb_reads
    lam = args.reads_per_s * np.asarray(share)
    refresh_s = (args.refresh_hours or 0.0) * 3600.0
    moves = lam / n + (1.0 / refresh_s if refresh_s > 0 else 0.0)  # rewrites per second per data block
    if args.destination == "same-plane":
        plane = np.arange(data_blocks) % args.planes
        group_moves = np.bincount(plane, weights=moves, minlength=args.planes).max()
        pool = args.free_blocks_per_plane
    else:
        group_moves, pool = moves.sum(), args.free_blocks_per_plane * args.planes
    limits = [60.0, args.hours * 3600.0]
    if lam.max() > 0:
        limits.append(n / (4.0 * lam.max()))
    if group_moves > 0:
        limits.append(pool / (4.0 * group_moves))
    if refresh_s > 0:
        limits.append(refresh_s / 64.0)
    return min(limits)


def _mean_ci(x):
    from hbfjax.stats import mean_ci95

    m, c = mean_ci95(x)
    return float(m), float(c)


def _rate(res: dict, key: str, per_stream) -> None:
    res[key], res[f"ci95_{key}"] = _mean_ci(per_stream)


def _lifetime(res: dict, key: str, erases_per_block_per_year, pe_cycles: float) -> bool:
    """``key`` years = P/E / mean erase rate (ci95 by the delta method); False (None: not bounded) when no
    block was erased."""
    m, c = _mean_ci(erases_per_block_per_year)
    if m <= 0:
        res[key] = res[f"ci95_{key}"] = None
        return False
    res[key] = pe_cycles / m
    res[f"ci95_{key}"] = pe_cycles * c / (m * m)
    return True


def compute(args) -> dict:
    import numpy as np

    from hbfjax import batch
    from hbfjax.flash.disturb import reclaim
    from hbfjax.flash.erase.endurance import SECONDS_PER_YEAR
    from hbfjax.reports import fields

    _check_options(args)
    per_plane = args.blocks // args.planes
    data_blocks = args.blocks - args.planes * args.free_blocks_per_plane
    share = read_share(args, data_blocks)
    dt = step_s(args, share, data_blocks)
    steps = max(1, math.ceil(args.hours * 3600.0 / dt - 1e-9))
    why = "" if args.step_s is not None else (
        f" (the step keeps the hottest block below N/4 reads and each pool a quarter used at --reads-per-s = "
        f"{args.reads_per_s:g})")
    require(steps <= MAX_STEPS, "", "--hours", args.hours,
            f"needs {steps} steps of {dt:.3g} s{why}, at most {MAX_STEPS}; shorten --hours, lower --reads-per-s, "
            "give a longer --step-s, or raise --read-disturb-reads / --free-blocks-per-plane")
    if args.step_s is None:
        dt = args.hours * 3600.0 / steps  # whole steps cover exactly --hours
    with blame(args, "planes", "blocks", "free_blocks_per_plane", "hours", "step_s"):
        cfg = reclaim.DisturbConfig(planes=args.planes, blocks_per_plane=per_plane, data_blocks=data_blocks,
                                    step_s=dt, steps=steps, start=args.start,
                                    workload="deterministic" if args.constant_rate else "poisson")
    with blame(args, "read_disturb_reads", "refresh_hours", "pages_per_block", "reads_per_s", "t_read_us",
               "t_prog_us", "hours", "step_s"):
        knobs = reclaim.DisturbKnobs.make(
            cfg, threshold_reads=args.read_disturb_reads, refresh_hours=args.refresh_hours or 0.0,
            pages_per_block=args.pages_per_block, destination=args.destination, t_read_us=args.t_read_us,
            t_prog_us=args.t_prog_us, reads_per_s=args.reads_per_s, read_share=share)
    sim_s = cfg.simulated_s
    if args.host_write_pages_per_s is not None:
        require(args.host_write_pages_per_s * sim_s >= 1, "", "--host-write-pages-per-s", args.host_write_pages_per_s,
                f"writes no page in {sim_s:g} s; a WAF needs at least one host write")
    out = fields(batch.run(reclaim.simulate, args.streams, args.seed, knobs, cfg, chunk_streams=args.chunk_streams))
    f = {k: np.asarray(v, np.float64) for k, v in out.items()}
    hours, days, years = sim_s / 3600.0, sim_s / 86400.0, sim_s / SECONDS_PER_YEAR
    b = cfg.physical_blocks
    plane_us = args.planes * sim_s * 1e6
    renewal = reclaim.renewal_rates(args.reads_per_s, share, args.read_disturb_reads, args.refresh_hours or 0.0)

    res = {"streams": args.streams, "planes": args.planes, "physical_blocks": b, "data_blocks": data_blocks,
           "pages_per_block": args.pages_per_block, "read_disturb_reads": args.read_disturb_reads,
           "refresh_hours": args.refresh_hours or 0.0, "destination": args.destination, "read_skew": args.read_skew,
           "step_s": dt, "steps": steps, "simulated_hours": hours}
    _rate(res, "host_reads_per_s", f["host_reads"] / sim_s)
    _rate(res, "relocations_per_hour", f["relocations"] / hours)
    res["renewal_relocations_per_hour"] = renewal["relocations_per_s"] * 3600.0
    _rate(res, "refreshes_per_hour", f["refreshes"] / hours)
    res["renewal_refreshes_per_hour"] = renewal["refreshes_per_s"] * 3600.0
    _rate(res, "erases_per_block_per_day", f["erases"] / b / days)
    res["renewal_erases_per_block_per_day"] = (renewal["relocations_per_s"] + renewal["refreshes_per_s"]) * 86400.0 / b
    _rate(res, "worst_block_erases_per_day", f["erases_per_block_max"] / days)
    _rate(res, "relocation_program_share", f["relocated_pages"] * args.t_prog_us / plane_us)
    _rate(res, "refresh_program_share", f["refresh_pages"] * args.t_prog_us / plane_us)
    _rate(res, "rewrite_read_share", f["rewrite_read_us"] / plane_us)
    busiest = (f["read_pages"] * args.t_read_us + f["prog_pages"] * args.t_prog_us).max(axis=1)
    _rate(res, "busiest_plane_rewrite_share", busiest / (sim_s * 1e6))
    rewrite_pages_per_s = (f["relocated_pages"] + f["refresh_pages"]) / sim_s
    _rate(res, "rewrite_pages_per_s", rewrite_pages_per_s)
    if args.host_write_pages_per_s is not None:
        res["host_writes"] = args.host_write_pages_per_s * sim_s
        _rate(res, "waf", 1.0 + rewrite_pages_per_s / args.host_write_pages_per_s)
    res["pe_cycles"] = args.pe_cycles
    mean_ok = _lifetime(res, "lifetime_years", f["erases"] / b / years, args.pe_cycles)
    _lifetime(res, "worst_block_lifetime_years", f["erases_per_block_max"] / years, args.pe_cycles)
    res["lifetime_unbounded"] = not mean_ok
    if not mean_ok:
        res["lifetime_note"] = ("unbounded: no block was erased in the run (no relocation or refresh), so the P/E "
                                "cycles bound no lifetime; give reads (--reads-per-s), a refresh (--refresh-hours) "
                                "or a longer run (--hours)")
    res["deferred_moves"] = int(f["deferred_moves"].sum())
    res["conserved"] = bool(np.all(f["valid_pages"] == data_blocks * args.pages_per_block)
                            and np.all(out["each_data_block_once"]))
    if not res["conserved"]:  # a bug, not a bad option: never print a result that lost pages
        raise RuntimeError("hbfjax disturb: valid pages or data blocks were not conserved")
    return res


def run(args) -> int:
    import sys

    res = compute(args)
    emit(res, args.json)
    if res["deferred_moves"]:
        print(f"hbfjax disturb: warning: {res['deferred_moves']} rewrites waited a step for an erased block "
              "(rates stay right, timing is delayed); raise --free-blocks-per-plane or shorten --step-s",
              file=sys.stderr)
    return 0
