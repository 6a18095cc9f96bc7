"""A timeline of one served stream as Chrome trace-event JSON (issue 25): opens in ui.perfetto.dev and
chrome://tracing.

The timeline is a replay of the chosen stream, with recording on, by the engine's plain-Python reference
(``hbfjax.serve.reference.serve`` for DASH's organisations, ``hbfjax.serve.hbflex_reference.serve`` for
HBFlex's: the same requests and routing draws, every first-token and finish time and every total equal
to the engine's within the float32 bound, ``tests/test_serve_reference.py`` and
``tests/test_hbflex_reference.py``), so the jitted rollout itself runs unchanged and its numbers are the
same with or without a timeline. Covered: DASH's four organisations (the tiers part: open-loop arrivals
or a trace replay) and HBFlex's organisations (all six parts, closed loops included), with uniform
routing and the tabulated read waves; other part sets (``--reads planes`` on DASH) are refused.

Tracks (one process, times in µs of simulated time):

* ``GPU passes``: one slice per pass, with its decode and prefill tokens and the bytes it read (Direct,
  Relay, HBM, other HBF) and wrote;
* ``layers`` and ``operators``: each layer and, inside it, each operator (norms, projections, attention,
  router, the routed experts with their Direct and Relay bytes and distinct experts, dense FFN), then
  the LM head: for the first :data:`DETAIL_PASSES` passes of the window only (a pass of a 94-layer
  model is ~1,000 slices);
* ``KV writes``: the KV a pass programs (direct prefill writes, writebacks) over its layers, with the
  program-busy time, and its exposed KV-write stall, which the engine books after the pass's layers;
* ``requests``: when each request is first scheduled, emits its first token and finishes;
* ``block store`` (HBFlex's organisations): each chunk's GC, timed at the next iteration's start as the
  engine books it (its migrated pages, the sampled planes' erases and WAF so far), and its LRU
  evictions of retained sessions;
* counters: the KV resident in HBM and HBF (GB) after each pass, and the requests in the pass and in
  the system (arrived, not finished); with HBFlex's parts also the base-die SRAM in use (MB: prefetch,
  offloaded KV pages, the GC buffer and the buffered KV writes' peak) and the sessions retained.

A window of passes bounds the file (``--timeline-passes A:B``, at most :data:`MAX_PASSES`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from hbfjax.validate import ConfigError

DETAIL_PASSES = 64  # passes of a window whose layers and operators are written
MAX_PASSES = 100_000  # passes one timeline may hold (a few slices each without detail)
_TRACKS = {"passes": (1, "GPU passes"), "layers": (2, "layers"), "operators": (3, "operators"),
           "writes": (4, "KV writes"), "requests": (5, "requests"), "blocks": (6, "block store")}
HBFLEX_PARTS = ("tiers", "sessions", "reads", "writes", "sram", "blocks")  # hbfjax.serve.parts.HBFLEX
GB = 1e9


def parse_window(text: str) -> tuple[int, int]:
    """``"A:B"`` (passes A … B − 1; either end may be left out: 0 and A + 2,000) as (A, B)."""
    first, sep, last = text.partition(":")
    try:
        a = int(first) if first.strip() else 0
        b = int(last) if last.strip() else a + 2000
    except ValueError:
        raise ConfigError(f"--timeline-passes {text!r}: give A:B, whole passes (e.g. 0:500)") from None
    if not sep or a < 0 or b <= a:
        raise ConfigError(f"--timeline-passes {text!r}: give A:B with 0 <= A < B (passes A to B − 1)")
    if b - a > MAX_PASSES:
        raise ConfigError(f"--timeline-passes {text!r}: at most {MAX_PASSES:,} passes in one timeline")
    return a, b


def check_family(family, k: int) -> None:
    """Refuse a point the reference cannot replay (module docstring), naming what to change."""
    config = family.config
    name = family.names[k]
    if family.points[k].org is None or config.timing_kind != "organisation":
        raise ConfigError(f"--timeline: {name} is a CPU-offloading system; timelines cover DASH's organisations")
    hbflex = tuple(config.parts) == HBFLEX_PARTS
    if "reclaim" in config.parts:
        raise ConfigError(f"--timeline: {name} times read reclaim (--read-disturb-reads), which the replay does not "
                          "model; drop it for the timeline")
    if tuple(config.parts) != ("tiers",) and not hbflex:
        raise ConfigError(f"--timeline: {name} runs the parts {', '.join(config.parts)} (--reads planes on a DASH "
                          "organisation), which the replay does not model; time it with the linear reads")
    if config.routing_draw != "counts":
        raise ConfigError(f"--timeline: {name} draws routing per token (--routing zipf or balanced); the replay "
                          "takes uniform routing")
    if hbflex and config.reads.wave_draw != "table":
        raise ConfigError(f"--timeline: {name} draws its read waves exactly; the replay takes the tabulated law")
    if config.batcher.tasks and not hbflex:
        raise ConfigError(f"--timeline: a closed loop (--tasks) on {name} is not replayed (HBFlex's organisations "
                          "only); use --rate or --trace")
    if family.inputs.table is not None:
        raise ConfigError("--timeline: a measured GPU table (--profile-table) is not replayed; use the roofline")


class Replay(NamedTuple):
    result: object  # reference.Result: float µs times
    totals: object  # reference.Totals
    record: list  # one dict per non-empty pass (reference.ServeStep._record_pass)
    chunks: list  # one dict per chunk's block-store events (HBFlex's parts; empty for DASH's)
    hbf_totals: dict  # HBFlex's extra totals (hbflex_reference.HBF_FIELDS; empty for DASH's)


def replay(family, k: int, stream: int, seed: int) -> Replay:
    """Stream ``stream`` of point ``k`` replayed by the reference with recording on."""
    check_family(family, k)
    record: list = []
    if tuple(family.config.parts) == HBFLEX_PARTS:
        from hbfjax.serve import hbflex_reference

        result, totals, step = hbflex_reference.serve(stream, seed, family.points[k], family.config,
                                                      inputs=family.inputs, record=record)
        return Replay(result, totals, record, step.chunks, step.hbf_totals())
    from hbfjax.serve import reference

    result, totals, _ = reference.serve(stream, seed, family.points[k], family.config, trace=family.inputs.trace,
                                        record=record)
    return Replay(result, totals, record, [], {})


def _gc_by_call(chunks: list) -> dict:
    """µs of GC booked at the start of each iteration (a chunk's GC runs before the next iteration's passes)."""
    out: dict = {}
    for c in chunks:
        out[c["call"]] = out.get(c["call"], 0.0) + c["gc_us"]
    return out


def _pass_starts(result, record, gc_us: dict) -> list:
    """Each recorded pass's start (µs): its iteration's start, the GC booked there, and the passes before it
    in the iteration."""
    starts, offset, last = [], 0.0, None
    for r in record:
        if r["call"] != last:
            offset, last = gc_us.get(r["call"], 0.0), r["call"]
        starts.append(result.log[r["call"]]["start_us"] + offset)
        offset += r["us"]
    return starts


def _block_events(result, chunks: list, lo: float, hi: float) -> tuple[list, float]:
    """The block store's slices and counters within [lo, hi] µs; the GC µs they hold."""
    events, gc_total = [], 0.0
    for c in chunks:
        if c["call"] >= len(result.log):  # the run's last chunk: no iteration left to book its GC
            continue
        at = result.log[c["call"]]["start_us"]
        if not lo <= at <= hi:
            continue
        if c["gc_us"] > 0:
            events.append(_slice("blocks", "GC migrations", at, c["gc_us"], moved_package_bytes=c["moved_package_bytes"],
                                 moved_sampled_pages=c["moved_sampled_pages"], erases_sampled=c["erases_sampled"],
                                 waf=c["waf"]))
            gc_total += c["gc_us"]
        if c["evicted_sessions"]:
            events.append({"name": f"{c['evicted_sessions']} sessions evicted (LRU)", "ph": "i", "s": "t", "ts": at,
                           "pid": 1, "tid": _TRACKS["blocks"][0]})
        events.append({"name": "sessions retained", "ph": "C", "ts": at, "pid": 1,
                       "args": {"sessions": c["cached_sessions"], "KV (M tokens)": c["cached_tokens"] / 1e6}})
    return events, gc_total


def _slice(track: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": _TRACKS[track][0], "args": args}


def _operators(r: dict, kinds: list, start: float) -> list:
    """The layers and operators of one pass, from ``start``, then its LM head."""
    from hbfjax.serve.reference import _OP_NAMES

    events, t = [], start
    for i, (kind, layer_us) in enumerate(zip(kinds, r["layer_us"])):
        events.append(_slice("layers", f"layer {i} ({kind})", t, layer_us))
        u = t
        for op in _OP_NAMES:
            us = r["ops"][kind].get(op, 0.0)
            if us > 0:
                events.append(_slice("operators", op, u, us))
                u += us
            if op == "experts" and r["experts"][i] is not None:
                us, direct, relay, distinct = r["experts"][i]
                events.append(_slice("operators", "routed experts", u, us, direct_bytes=direct, relay_bytes=relay,
                                     distinct_experts=distinct))
                u += us
        t += layer_us
    if r["head_us"] > 0:
        events.append(_slice("layers", "LM head", t, r["head_us"]))
    return events


def chrome_trace(result, record, model, window: tuple[int, int], title: str, chunks: list = ()) -> tuple[dict, dict]:
    """(the Chrome trace of passes ``window`` of a replay, its summary: window, events, sums)."""
    a, b = window
    if a >= len(record):
        raise ConfigError(f"--timeline-passes {a}:{b}: the run has {len(record)} passes")
    b = min(b, len(record))
    gc_us = _gc_by_call(chunks)
    starts = _pass_starts(result, record, gc_us)
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": title}}]
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": label}}
               for tid, label in _TRACKS.values()]
    arrival = result.arrival_us or []
    scheduled, sums = set(), {"busy_us": 0.0, "stall_us": 0.0, "program_busy_us": 0.0}
    for p in range(a, b):
        r, t0 = record[p], starts[p]
        run_us = sum(r["layer_us"]) + r["head_us"]
        events.append(_slice("passes", f"pass {p}: {r['decode_tokens']} decode + {r['prefill_tokens']} prefill",
                             t0, r["us"], decode_tokens=r["decode_tokens"], prefill_tokens=r["prefill_tokens"],
                             direct_bytes=r["direct_bytes"], relay_bytes=r["relay_bytes"],
                             hbm_read_bytes=r["hbm_read_bytes"], hbf_read_bytes=r["hbf_read_bytes"],
                             stall_us=r["stall_us"], **{k: r[k] for k in ("read_waves", "kv_read_stall_us") if k in r}))
        if p < a + DETAIL_PASSES:
            events += _operators(r, list(model.layer_kinds), t0)
        if r["prefill_write_bytes"] or r["writeback_bytes"]:
            events.append(_slice("writes", "KV programs", t0, run_us, prefill_write_bytes=r["prefill_write_bytes"],
                                 writeback_bytes=r["writeback_bytes"], program_busy_us=r["program_busy_us"]))
        if r["stall_us"] > 0:
            events.append(_slice("writes", "exposed KV-write stall", t0 + run_us, r["stall_us"]))
        end = t0 + r["us"]
        in_system = sum(1 for q, at in enumerate(arrival) if at is not None and at <= end
                        and (result.finish_us[q] is None or result.finish_us[q] > end))
        events.append({"name": "KV resident (GB)", "ph": "C", "ts": end, "pid": 1,
                       "args": {"HBM": r["kv_hbm_bytes"] / GB, "HBF": r["kv_hbf_bytes"] / GB}})
        if "sram_bytes" in r:
            events.append({"name": "base-die SRAM (MB)", "ph": "C", "ts": end, "pid": 1,
                           "args": {"in use": r["sram_bytes"] / 1e6, "capacity": r["sram_capacity_bytes"] / 1e6}})
        events.append({"name": "requests", "ph": "C", "ts": end, "pid": 1,
                       "args": {"in pass": len(set(r["decode_requests"]) | set(r["prefill_requests"])),
                                "in system": in_system}})
        for q in r["decode_requests"] + r["prefill_requests"]:
            if q not in scheduled:
                scheduled.add(q)
                events.append(_instant(f"request {q} scheduled", t0))
        sums["busy_us"] += r["us"]
        sums["stall_us"] += r["stall_us"]
        sums["program_busy_us"] += r["program_busy_us"]
    lo, hi = starts[a], starts[b - 1] + record[b - 1]["us"]
    blocks, window_gc_us = _block_events(result, chunks, lo - gc_us.get(record[a]["call"], 0.0), hi)
    events += blocks
    for q, (first, done) in enumerate(zip(result.first_token_us, result.finish_us)):
        for label, at in (("first token", first), ("finished", done)):
            if at is not None and lo <= at <= hi:
                events.append(_instant(f"request {q} {label}", at))
    summary = {"passes": [a, b], "run_passes": len(record), "detail_passes": [a, min(b, a + DETAIL_PASSES)],
               "events": len(events), "window_start_s": lo * 1e-6, "window_end_s": hi * 1e-6,
               "window_busy_s": sums["busy_us"] * 1e-6, "window_stall_s": sums["stall_us"] * 1e-6,
               "window_program_busy_s": sums["program_busy_us"] * 1e-6, "window_gc_s": window_gc_us * 1e-6}
    trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title, **summary}}
    return trace, summary


def _instant(name: str, ts: float) -> dict:
    return {"name": name, "ph": "i", "s": "t", "ts": ts, "pid": 1, "tid": _TRACKS["requests"][0]}


def write(family, k: int, stream: int, seed: int, window: tuple[int, int], path) -> dict:
    """Replay stream ``stream`` of point ``k`` of ``family``, write passes ``window`` of it to ``path`` as
    Chrome trace JSON; the summary for the run's JSON."""
    result, totals, record, chunks, hbf = replay(family, k, stream, seed)
    title = f"hbfjax {family.names[k]}, stream {stream}, seed {seed}"
    trace, summary = chrome_trace(result, record, family.config.model, window, title, chunks)
    path = Path(path)
    try:
        path.write_text(json.dumps(trace, separators=(",", ":")))
    except OSError as err:
        raise ConfigError(f"--timeline {path}: cannot write it ({err.strerror})") from None
    return {"file": str(path), "system": family.names[k], "stream": stream, **summary,
            "run_busy_s": totals.busy_us * 1e-6, **({"run_gc_s": hbf["gc_us"] * 1e-6} if hbf else {}),
            "source": "a replay of the stream by the plain-Python reference (hbfjax.serve.reference, or "
                      "hbfjax.serve.hbflex_reference for HBFlex's organisations), equal to the engine's run within "
                      "the float32 bound; the simulation ran unchanged"}
