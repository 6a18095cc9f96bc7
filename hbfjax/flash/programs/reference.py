"""A plain NumPy/Python reference of the writeback rollout: one stream, loops (DESIGN.md §8 rung 3).

The correctness oracle of ``hbfjax.flash.programs.writeback`` on the same inputs (reads touching all or none
of the plane slots, no explicit masks, no phase jitter) and the speed baseline of ``make bench``.
"""

from __future__ import annotations

import math

import numpy as np

from hbfjax.flash.programs import writeback as wb


def _program(busy, cursor, n, t, t_prog, per_slot):
    P = busy.size
    n = int(max(n, 0))
    idx = (np.arange(P) - cursor) % P
    count = n // P + (idx < n % P)
    rounds = np.ceil(count / per_slot)
    busy = np.where(count > 0, np.maximum(busy, t) + rounds * t_prog, busy)
    return busy, (cursor + n) % P, rounds.max() * t_prog


def reference_plan(knobs: wb.WritebackKnobs) -> dict:
    """The prefetched timeline and its windows as NumPy arrays (setup, outside the timed loop)."""
    tl, gd, gp, gs = wb.plan_timeline(knobs)
    return {"gd": np.asarray(gd, np.float64), "gp": np.asarray(gp, np.float64), "gs": np.asarray(gs),
            "dur": np.asarray(tl.duration_us, np.float64), "pre_us": np.asarray(tl.prefill_us_per_token, np.float64),
            "is_read": np.asarray(tl.is_read), "kvp": np.asarray(tl.kv_point),
            "touch": np.asarray(tl.touch_fraction) >= 0.5, "kvb": np.asarray(tl.kv_bytes_per_token, np.float64),
            "P": tl.plane_slots, "flash": {k: float(v) for k, v in knobs.flash.__dict__.items()}}


def reference_rollout(plan: dict, policy: str, decode_requests, prefill_tokens) -> dict:
    """Sequential NumPy rollout of one stream (reads touch all or none of the slots: touch fractions 0/1,
    no explicit masks, no phase jitter). Returns per-iteration stall_us and program_busy_us."""
    gd, gp, gs, dur, pre_us = plan["gd"], plan["gp"], plan["gs"], plan["dur"], plan["pre_us"]
    is_read, kvp, touch, kvb, f, P = plan["is_read"], plan["kvp"], plan["touch"], plan["kvb"], plan["flash"], plan["P"]
    L, S = dur.shape
    busy, cursor, buf = np.zeros(P), 0, 0.0
    stalls, busys = [], []
    for dec, pre in zip(decode_requests, prefill_tokens):
        t = stall = busy_us = 0.0
        for l in range(L):
            for s in range(S):
                j = l * S + s
                if policy == "window" and gs[j]:
                    fit = math.floor((gd[j] + gp[j] * pre) / f["t_prog_us"]) * P * f["planes_per_slot"]
                    n = math.floor(min(buf, fit) / f["stripe_pages"]) * f["stripe_pages"]
                    busy, cursor, b = _program(busy, cursor, n, t, f["t_prog_us"], f["planes_per_slot"])
                    buf, busy_us = buf - n, busy_us + (b if n > 0 else 0.0)
                if is_read[l, s] and touch[l, s]:
                    wait = max(0.0, float(np.max(busy - t)))
                    stall, t = stall + wait, t + wait
                t += dur[l, s] + pre_us[l, s] * pre
                if kvp[l, s]:
                    page = f["page_bytes"]
                    if policy == "immediate":
                        n = dec * math.ceil(kvb[l] / page) + math.ceil(pre * kvb[l] / page)
                    else:
                        buf += (dec + pre) * kvb[l] / page
                        if policy == "stripe":
                            n = math.floor(buf / f["stripe_pages"]) * f["stripe_pages"]
                        else:
                            over = buf - f["buffer_capacity_pages"]
                            n = min(math.ceil(over / f["stripe_pages"]) * f["stripe_pages"], math.floor(buf)) \
                                if over > 0 else 0
                        buf -= n
                    busy, cursor, b = _program(busy, cursor, n, t, f["t_prog_us"], f["planes_per_slot"])
                    busy_us += b if n > 0 else 0.0
        busy = np.maximum(busy - t, 0.0)
        stalls.append(stall)
        busys.append(busy_us)
    return {"stall_us": np.asarray(stalls), "program_busy_us": np.asarray(busys)}
