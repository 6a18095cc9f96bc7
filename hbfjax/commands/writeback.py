"""``hbfjax writeback``: exposed stall of KV writeback policies, or the synthetic Lindley backlog."""

from __future__ import annotations

import argparse
import dataclasses

from hbfjax.commands import _choices as names
from hbfjax.commands._common import (PRESET_NAMES, add_common_args, add_hbf_args, blame, emit, hbf_part,
                                     require_applies)
from hbfjax.validate import ConfigError, number, require

HELP = """\
Program/read interference (HBFlex §3.2, §5.3; DASH §V-B, §VI-F). Each iteration runs every layer's
segments (weight read, QKV projection, KV read, attention, expert weight read, FFN); each layer's new
KV (one token per decode request, plus a prefill chunk with probability --prefill-prob) is programmed
by the policy; a program holds its planes for tPROG and a read to a busy plane waits (the stall).

Units: times in µs per layer and segment, --kv-bytes-per-token in bytes per token PER LAYER,
--sram-mb in MB (1e6 B) of SRAM for buffered KV, --hbm-budget-gb in GB (1e9 B). Outputs are means per
iteration across streams with 95 % CI half-widths; buffer sizes in bytes.

--hbf PART builds the scenario's package of the part's stacks (the preset's stack count unless --hbf-stacks):
its page size, tPROG (--t-prog-us fills or overrides it) and read units set the page wave, the plane
slots and the pages the SRAM or HBM budget holds; the JSON's hbf_part gives each value's source.

Synthetic form: --synthetic --pages-per-iter λ --window-pages w simulates B' = max(0, B + N − w),
N ~ Poisson(λ), and prints the Monte Carlo mean backlog beside the exact stationary value.
"""


US = number(float, 0.0, names.WRITEBACK_MAX_US)  # a duration in µs, finite
NONNEG = lambda hi: number(float, 0.0, hi)  # noqa: E731
SEGMENTS = (("weight-read-us", "attention weight read"), ("qkv-us", "QKV projection compute"),
            ("kv-read-us", "KV read"), ("attention-us", "attention compute"),
            ("expert-read-us", "expert weight read"), ("ffn-us", "expert FFN compute"))
TIMELINE_OPTIONS = ("policy", "preset", "layers", "kv_bytes_per_token", "decode_requests", "prefill_chunk",
                    "prefill_prob", *(n.replace("-", "_") for n, _ in SEGMENTS), "prefill_us_per_token", "t_prog_us",
                    "stripe_pages", "sram_mb", "no_prefetch", "hbm_budget_gb", "hbf", "hbf_stacks",
                    "read_units_per_die")


def register(subparsers) -> None:
    p = subparsers.add_parser("writeback", help="KV writeback policies: exposed stall (HBFlex §5.3, DASH §V-B)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", choices=names.WRITEBACK_POLICIES, default=None,
                   help="writeback policy (default: window with --preset hbflex, dash-hbm with --preset dash)")
    p.add_argument("--preset", choices=PRESET_NAMES, default=None,
                   help="hardware and scenario: hbflex = DeepSeek-V4-Pro-like decode on the all-HBF package; "
                        "dash = Llama 4 Maverick B=1 decode with HBM spill (default hbflex)")
    g = p.add_argument_group("timeline (per layer; defaults from the preset's scenario)")
    g.add_argument("--layers", type=number(int, 1, names.WRITEBACK_MAX_LAYERS), default=None, help="model layers")
    g.add_argument("--kv-bytes-per-token", type=NONNEG(names.WRITEBACK_MAX_COUNT), default=None,
                   help="KV bytes per token per layer")
    g.add_argument("--decode-requests", type=NONNEG(names.WRITEBACK_MAX_COUNT), default=None,
                   help="running decode requests (tokens/iteration)")
    g.add_argument("--prefill-chunk", type=NONNEG(names.WRITEBACK_MAX_COUNT), default=None,
                   help="prefill chunk tokens (default 512 hbflex)")
    g.add_argument("--prefill-prob", type=NONNEG(1.0), default=None,
                   help="probability in [0, 1] an iteration carries a prefill chunk (default 0.3 hbflex, 0 dash)")
    for name, what in SEGMENTS:
        g.add_argument(f"--{name}", type=US, default=None, help=f"{what}, µs per layer (decode iteration)")
    g.add_argument("--prefill-us-per-token", type=US, default=None,
                   help="extra compute per prefill token and layer, µs (split over QKV/attention/FFN as the preset)")
    f = p.add_argument_group("flash and buffers")
    f.add_argument("--t-prog-us", type=number(float, 0.0, names.WRITEBACK_MAX_US, lo_open=True), default=None,
                   help="page program latency tPROG, µs")
    f.add_argument("--stripe-pages", type=number(int, 1, names.WRITEBACK_MAX_COUNT), default=None,
                   help="whole pages per stripe G (stripe, window; --preset hbflex)")
    f.add_argument("--sram-mb", type=NONNEG(names.WRITEBACK_MAX_COUNT), default=None,
                   help="SRAM for buffered KV, MB (window, --preset hbflex; default 240 MB − 169 MB prefetched weights)")
    f.add_argument("--no-prefetch", action="store_true",
                   help="do not prefetch weights to merge windows (--preset hbflex)")
    f.add_argument("--hbm-budget-gb", type=number(float, 0.0, 1e6, lo_open=True), default=None,
                   help="dash-hbm: HBM decode-KV budget, GB, at least one page wave (default 24.46; the run starts "
                        "just below it)")
    r = p.add_argument_group("run")
    r.add_argument("--iterations", type=number(int, 1, names.WRITEBACK_MAX_ITERATIONS), default=None,
                   help="iterations per stream (default 100; synthetic 4000)")
    r.add_argument("--warmup", type=number(int, 0), default=None,
                   help="iterations discarded first, fewer than --iterations (default 10 %%; synthetic 25 %%)")
    s = p.add_argument_group("synthetic mode (Lindley backlog)")
    s.add_argument("--synthetic", action="store_true", help="run the synthetic backlog instead of a timeline")
    s.add_argument("--pages-per-iter", type=NONNEG(names.BACKLOG_MAX_PAGES_PER_ITER), default=None,
                   help="λ: mean new pages per iteration (Poisson)")
    s.add_argument("--window-pages", type=number(int, 1, names.BACKLOG_MAX_WINDOW_PAGES), default=None,
                   help="w: page programs one window fits")
    add_hbf_args(p, times=(), stacks=True)
    add_common_args(p, default_streams=256)
    p.set_defaults(func=run)


def _warmup(args, iterations: int, default: int) -> int:
    warm = default if args.warmup is None else args.warmup
    require(warm < iterations, "", "--warmup", warm, f"must be < --iterations = {iterations}")
    return warm


def _synthetic(args) -> dict:
    import numpy as np

    from hbfjax import batch
    from hbfjax.flash.programs import backlog as bl
    from hbfjax.reports import fields, mean_ci_fields

    require_applies(args, "--synthetic", {dest: False for dest in TIMELINE_OPTIONS})
    if args.pages_per_iter is None or args.window_pages is None:
        raise ConfigError("--synthetic needs --pages-per-iter and --window-pages")
    lam, w = args.pages_per_iter, args.window_pages
    T = 4000 if args.iterations is None else args.iterations
    warm = _warmup(args, T, T // 4)
    with blame(args, "pages_per_iter", "window_pages", "iterations"):
        cfg = bl.BacklogConfig(iterations=T, warmup_iterations=warm, max_arrivals=bl.poisson_table_size(lam))
        if lam < w:
            bl.check_exact_cost(lam, w)  # before the Monte Carlo, so a refused λ/w costs nothing
    out = fields(batch.run(bl.simulate, args.streams, args.seed, bl.BacklogKnobs.make(lam, w), cfg,
                           chunk_streams=args.chunk_streams))
    s = mean_ci_fields(out, ("mean_backlog_pages", "p_backlog_positive"))
    m, ci = s["mean_backlog_pages"], s["ci95_mean_backlog_pages"]
    pp, pci = s["p_backlog_positive"], s["ci95_p_backlog_positive"]
    result = {"mode": "synthetic", "pages_per_iter": lam, "window_pages": w, "iterations": T, "warmup": warm,
              "streams": args.streams, "mean_backlog_pages": m, "ci95_mean_backlog_pages": ci,
              "p_backlog_positive": pp, "ci95_p_backlog_positive": pci,
              "max_backlog_pages": int(np.max(out["max_backlog_pages"]))}
    if lam < w:
        exact = bl.exact_stationary(lam, w)
        result["exact_mean_backlog_pages"] = exact["mean_backlog_pages"]
        result["exact_p_backlog_positive"] = exact["p_backlog_positive"]
    else:
        result["exact_mean_backlog_pages"] = None  # λ ≥ w: the backlog grows without bound
    return result


def _knobs(args, part=None):
    from hbfjax.flash.programs import writeback as wb
    from hbfjax.serve import write_scenarios as sc

    hbflex = args.preset == "hbflex"
    require_applies(args, f"--preset {args.preset} --policy {args.policy}", {
        "sram_mb": hbflex and args.policy == "window", "stripe_pages": hbflex and args.policy in ("stripe", "window"),
        "no_prefetch": hbflex, "hbm_budget_gb": args.preset == "dash" and args.policy == "dash-hbm"})
    if args.preset == "dash":
        knobs = sc.dash_knobs(t_prog_us=args.t_prog_us,
                              **({} if args.decode_requests is None else {"decode_requests": args.decode_requests}))
    else:
        kw = {k: v for k, v in (("decode_requests", args.decode_requests), ("prefill_chunk_tokens", args.prefill_chunk),
                                ("prefill_prob", args.prefill_prob)) if v is not None}
        if args.sram_mb is not None:
            kw["sram_kv_bytes"] = args.sram_mb * 1e6
        if args.stripe_pages is not None:
            kw["stripe_pages"] = args.stripe_pages
        if args.kv_bytes_per_token is not None:
            kw["kv_bytes_per_token_layer"] = args.kv_bytes_per_token
        if args.layers is not None:
            kw["layers"] = args.layers
        knobs = sc.hbflex_knobs(t_prog_us=args.t_prog_us, prefetch=not args.no_prefetch, **kw)
    knobs, slots = _with_part(args, knobs, part)
    knobs = _override_timeline(args, knobs, slots)
    fk = knobs.flash
    if args.hbm_budget_gb is not None:
        budget = float(int(args.hbm_budget_gb * 1e9 // float(fk.page_bytes)))
        with blame(args, "hbm_budget_gb"):  # the run starts one page wave below the budget
            fk = wb.FlashKnobs.make(**{**{k: float(v) for k, v in vars(fk).items()}, "buffer_capacity_pages": budget,
                                   "buffer_base_pages": budget - float(fk.wave_pages)})
    wl = knobs.workload
    if args.preset == "dash" and (args.prefill_chunk is not None or args.prefill_prob is not None):
        wl = wb.WorkloadKnobs.make(float(wl.decode_requests), 0.0 if args.prefill_chunk is None else args.prefill_chunk,
                                   0.0 if args.prefill_prob is None else args.prefill_prob)
    return wb.WritebackKnobs(knobs.timeline, fk, wl)


def _part_stacks(args) -> int:
    """Stacks of the ``--hbf`` part in the package: ``--hbf-stacks``, else the preset's stack count."""
    from hbfjax.hardware import preset

    return args.hbf_stacks or preset(args.preset).hbf.stacks


def _with_part(args, knobs, part):
    """``knobs`` with the flash of a package of ``--hbf-stacks`` (default: the preset's) stacks of ``part``, and the
    plane slots of its timeline: hbflex keeps its 32-plane groups (slots = read units / 32, the SRAM budget in the
    part's pages), dash its 128 slots (read units shared among them, the page wave and the HBM budget in the
    part's pages). Without a part: ``knobs`` and its slots unchanged."""
    from hbfjax.flash.programs import writeback as wb
    from hbfjax.serve import write_scenarios as sc

    if part is None:
        return knobs, knobs.timeline.plane_slots
    fk = knobs.flash
    units, page = _part_stacks(args) * part.units_per_stack, part.part.page_bytes
    flash = {k: float(v) for k, v in vars(fk).items()}
    flash.update(t_prog_us=part.t_prog_us, page_bytes=page, wave_pages=units)
    if args.preset == "hbflex":
        slots = units // sc.HBFLEX_PLANE_GROUP
        require(slots >= 1, "", "--hbf-stacks × --read-units-per-die", units,
                f"read units in the package; need at least one plane group of {sc.HBFLEX_PLANE_GROUP}")
        flash["buffer_capacity_pages"] = flash["buffer_capacity_pages"] * float(fk.page_bytes) / page
    else:
        slots = knobs.timeline.plane_slots
        budget = float(sc.DASH_DECODE_KV_BUDGET_BYTES // page)
        require(budget >= units, "", "--hbf", args.hbf, f"a page wave of {units} pages exceeds DASH's HBM budget "
                f"({budget:g} pages); give fewer --hbf-stacks or --read-units-per-die")
        flash.update(planes_per_slot=units / slots, stripe_pages=units, buffer_capacity_pages=budget,
                     buffer_base_pages=budget - units)
    with blame(args, "hbf", "hbf_stacks", "read_units_per_die", "t_prog_us"):
        fk = wb.FlashKnobs.make(**flash)
    return wb.WritebackKnobs(knobs.timeline, fk, knobs.workload), slots


def _override_timeline(args, knobs, slots):
    """Rebuild the timeline when any per-segment duration, layer count or KV size is given (dash preset), or on
    ``slots`` plane slots when they differ from the timeline's."""
    import numpy as np

    from hbfjax.flash.programs import writeback as wb
    from hbfjax.serve import write_scenarios as sc

    names = ("weight_read_us", "qkv_us", "kv_read_us", "attention_us", "expert_read_us", "ffn_us")
    given = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    layers_changed = args.preset == "dash" and (args.layers is not None or args.kv_bytes_per_token is not None)
    if not given and args.prefill_us_per_token is None and not layers_changed and slots == knobs.timeline.plane_slots:
        return knobs
    tl = knobs.timeline
    row = np.asarray(tl.duration_us[0])
    pre = np.asarray(tl.prefill_us_per_token[0])
    cur = dict(zip(names, row[[sc.segment(s) for s in sc.STANDARD_SEGMENTS]]))
    cur.update(given)
    if args.prefill_us_per_token is not None:
        total = pre.sum()
        pre = pre / total * args.prefill_us_per_token if total > 0 else np.array([0, 1, 0, 1, 0, 1]) * \
            args.prefill_us_per_token / 3
    layers = args.layers if args.layers is not None else tl.layers
    kvb = args.kv_bytes_per_token if args.kv_bytes_per_token is not None else float(tl.kv_bytes_per_token[0])
    new = sc.standard_timeline(layers, kvb, slots, attn_weight_read_us=cur["weight_read_us"], qkv_us=cur["qkv_us"],
                            kv_read_us=cur["kv_read_us"], attention_us=cur["attention_us"],
                            expert_weight_read_us=cur["expert_read_us"], ffn_us=cur["ffn_us"],
                            prefill_qkv_us_per_token=float(pre[sc.segment("qkv_proj")]),
                            prefill_attention_us_per_token=float(pre[sc.segment("attention")]),
                            prefill_ffn_us_per_token=float(pre[sc.segment("ffn")]),
                            kv_touch_fraction=float(tl.touch_fraction[0, sc.segment("kv_read")]))
    weights = sc.segment("attn_weight_read")
    new = dataclasses.replace(new, touch_fraction=new.touch_fraction.at[:, weights].set(tl.touch_fraction[0, weights]))
    return wb.WritebackKnobs(new, knobs.flash, knobs.workload)


def run(args) -> int:
    emit(compute(args), args.json)
    return 0


def compute(args) -> dict:
    import numpy as np

    from hbfjax import batch
    from hbfjax.flash.programs import writeback as wb
    from hbfjax.reports import fields, mean_ci_fields
    from hbfjax.serve import write_scenarios as sc

    if args.synthetic:
        return _synthetic(args)
    require_applies(args, "a timeline run (no --synthetic)", {"pages_per_iter": False, "window_pages": False})
    args.preset = "hbflex" if args.preset is None else args.preset
    if args.policy is None:
        args.policy = "dash-hbm" if args.preset == "dash" else "window"
    part = hbf_part(args, need=("t_prog_us", "read_units_per_die"))
    knobs = _knobs(args, part)
    T = 100 if args.iterations is None else args.iterations
    warm = _warmup(args, T, T // 10)
    cfg = sc.config_for(knobs, args.policy, T, warm)
    with blame(args, "decode_requests", "prefill_chunk", "kv_bytes_per_token", "layers", "iterations"):
        wb.check_int32_counts(knobs, cfg)
    out = fields(batch.run(wb.simulate, args.streams, args.seed, knobs, cfg, chunk_streams=args.chunk_streams))
    s = mean_ci_fields(out, ("stall_us_per_iteration", "program_busy_us_per_iteration", "iteration_us"))
    stall, stall_ci = s["stall_us_per_iteration"], s["ci95_stall_us_per_iteration"]
    busy, busy_ci = s["program_busy_us_per_iteration"], s["ci95_program_busy_us_per_iteration"]
    it_us, it_ci = s["iteration_us"], s["ci95_iteration_us"]
    measured = T - warm
    result = {
        "policy": args.policy, "preset": args.preset, "iterations": T, "warmup": warm, "streams": args.streams,
        "t_prog_us": float(knobs.flash.t_prog_us), "layers": cfg.layers,
        "kv_bytes_per_token_layer": float(knobs.timeline.kv_bytes_per_token[0]),
        "decode_requests": float(knobs.workload.decode_requests),
        "stall_us_per_iteration": stall, "ci95_stall_us": stall_ci,
        "program_busy_us_per_iteration": busy, "ci95_program_busy_us": busy_ci,
        "iteration_us": it_us, "ci95_iteration_us": it_ci,
        "pages_programmed_per_iteration": float(np.mean(out["pages_programmed_per_iteration"])),
        "program_rounds_per_iteration": float(np.mean(out["program_rounds_per_iteration"])),
        "buffer_mean_bytes": float(np.mean(out["buffer_mean_bytes"])),
        "buffer_peak_bytes": float(np.max(out["buffer_peak_bytes"])),
        "forced_writebacks": float(np.mean(out["forced_writebacks"])),
        "buffer_overflow_fraction": float(np.mean(out["buffer_overflow"])),
        "forced_writebacks_per_iteration": float(np.mean(out["forced_writebacks"])) / measured,
        "stall_us_total": float(np.mean(out["stall_us_total"])),
        "program_busy_us_total": float(np.mean(out["program_busy_us_total"])),
    }
    if part is not None:
        result["hbf_part"] = {**part.report(include_reads=False), "stacks": _part_stacks(args)}
    return result
