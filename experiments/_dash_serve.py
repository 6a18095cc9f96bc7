"""What the DASH fixed-batch serving figures share (Fig. 9(a), 9(b), 11): a fixed batch served on DASH
organisations stacked on one knob axis, one compilation per model, and the rows and ratios they report.

A :class:`Point` is one knob point: a named DASH organisation (with any ``OrgKnobs.make`` changes, e.g.
``lookahead=0`` or ``t_read_us``) and a fixed-batch workload (B, L_in, L_out), i.e. one system of
``hbfjax.serve.systems`` serving one ``Scenario.fixed_batch``. :func:`run_points` serves a list of
them for one model as one family (``systems.stack``: one compilation, one knob axis, common random
numbers: the routing draws depend only on (seed, stream, pass, layer)) and returns one metric row per
point from ``metrics.summary``, with a diagnostic of where a decode iteration's time goes
(:func:`decode_breakdown`). The fixed batch is B requests at t = 0 in a slot table of the largest B
among the points, so batch sizes share a compilation too (requests beyond a point's B are padding).

Batcher settings of a fixed batch (the paper states them only for its online runs, DASH §VI-E, and
they are used here too): the scenario's defaults, mixed passes, 512-token prefill chunks, an 8,192-token
iteration budget (``systems.CHUNK_TOKENS``, ``TOKEN_BUDGET``). On an H100 PCIe (DASH §VI-A,
``systems.DASH_GPU``).

Readings (issue 24): every point is served under a :class:`Reading` of the open choices of the paper
(``hbfjax serve``'s ``--array-rate``, ``--tr-model``, ``--launch-us``, ``--fixed-prefill``,
``--write-window-layers``): :data:`LITERAL` (the defaults, the physical reading) or one closer to the
paper's text; a point's row names its reading, and ratios pair rows within one reading.

Ratios (DASH §VI-B): a speedup is DASH's throughput over a baseline's at the same point, an E2E
reduction is 1 − DASH's E2E over the baseline's; across points both are geometric means of the
paired ratios (:func:`geomean`, :func:`paired`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.memory import delivery
from hbfjax.memory import organisations as orgs
from hbfjax.serve import engine, kv_tiers, layer_time, metrics, report, systems
from hbfjax.sweep import families
from hbfjax.validate import ConfigError, require, require_int
from hbfjax.workload import models, timing
from hbfjax.workload import requests as rq

# DASH §VI-A: "Five are evaluated in the main sweeps" (Fig. 9), DeepSeek-V2 only in the lookahead study (§VI-D)
FIG9_MODELS = ("qwen3-235b-a22b", "mixtral-8x22b", "grok-1", "llama4-maverick", "deepseek-v3")
ORGANISATIONS = ("dash", "compact-dash", "relay-only", "direct-only")  # DASH §VI-A Fig. 8
ITERATION_MARGIN = 64  # max_iterations above the iterations a fixed batch needs (the loop runs in scan chunks)
# The tiny size (ctx.tiny) of every DASH serving figure: one model, one workload and one knob-axis length,
# so the figures run in one `python -m experiments --tiny` share one compilation.
TINY_MODEL = "mixtral-8x22b"
TINY_PROMPT, TINY_OUTPUT = 256, 4
TINY_POINTS = 8
# the metrics each row keeps (means, and their 95 % half-widths across streams)
METRICS = ("throughput_tokens_per_s", "decode_tokens_per_s", "e2e_s", "ttft_s", "tpot_ms")
# the engine's per-stream totals each row keeps (means across streams, ``<field>_mean``)
TOTALS = ("busy_us", "prefill_write_bytes", "writeback_bytes", "write_stall_us", "program_busy_us", "writeback_passes",
          "expert_direct_bytes", "expert_relay_bytes", "hbm_read_bytes", "hbf_read_bytes", "kv_hbm_byte_us",
          "kv_hbf_byte_us", "max_kv_hbm_bytes", "max_kv_hbf_bytes", "table_miss_passes")


@dataclass(frozen=True)
class Reading:
    """A reading of the paper's open choices: OrgKnobs changes (``shared_array_rate``, ``tr_sets_rate``,
    ``write_window_layers``), GpuKnobs changes (``launch_us``) and the fixed batch's prefill
    (``systems.FIXED_PREFILL``)."""

    name: str
    org: tuple[tuple[str, float], ...] = ()
    gpu: tuple[tuple[str, float], ...] = ()
    prefill: str = "chunked"

    def __post_init__(self) -> None:
        require(self.prefill in systems.FIXED_PREFILL, type(self).__name__, "prefill", self.prefill,
                f"must be one of {systems.FIXED_PREFILL}")


LITERAL = Reading("literal")  # shared arrays, tR sets the rate, 4 µs launches, chunked prefill, one-layer window
PER_PATH = Reading("per-path", org=(("shared_array_rate", 0.0),))  # the arrays limit each path alone
NO_LAUNCH = Reading("per-path, no launch", org=PER_PATH.org, gpu=(("launch_us", 0.0),))
# closest to the paper's text for the fixed-batch figures: each path at its links, no launch cost (the paper
# profiles operators, it adds none), every prompt in one pass (§VI-B states no chunking)
PAPER = Reading("paper", org=PER_PATH.org, gpu=NO_LAUNCH.gpu, prefill="whole")
TR_LATENCY = Reading("tR a latency", org=(("tr_sets_rate", 0.0),))  # the arrays keep their rate at 3 µs
# closest to the paper's text for Fig. 11: PAPER with tR a latency only (its 10.88 % at 32 µs needs it)
PAPER_TR = Reading("paper, tR a latency", org=PAPER.org + TR_LATENCY.org, gpu=PAPER.gpu, prefill="whole")


@dataclass(frozen=True)
class Point:
    """One knob point: organisation ``org`` with ``changes`` (``OrgKnobs.make`` arguments), serving a
    fixed batch of ``batch`` requests of ``prompt`` → ``output`` tokens; ``system`` names it in the
    rows (default ``org``; a variant with changes needs its own name to be paired apart)."""

    org: str
    batch: int
    prompt: int
    output: int
    changes: tuple[tuple[str, float], ...] = ()
    system: str = ""
    reading: Reading = LITERAL

    def __post_init__(self) -> None:
        c = type(self).__name__
        require(self.org in orgs.ORGANISATIONS, c, "org", self.org, f"must be one of {tuple(orgs.ORGANISATIONS)}")
        require_int(c, "batch", self.batch, 1, rq.MAX_REQUESTS)
        require_int(c, "prompt", self.prompt, 1, rq.MAX_TOKENS)
        require_int(c, "output", self.output, 1, rq.MAX_TOKENS)
        if not self.system:
            object.__setattr__(self, "system", self.org)


def batcher(p: Point, slots: int) -> dict:
    """The point's chunk and token budget (``Scenario`` fields): Sarathi's, or its reading's one-pass prefill."""
    if p.reading.prefill == "whole":
        return systems.whole_prefill(p.prompt, slots)
    return dict(chunk_tokens=systems.CHUNK_TOKENS, token_budget=systems.TOKEN_BUDGET)


def iterations_bound(p: Point, slots: int | None = None) -> int:
    """An upper bound on the iterations a fixed batch takes: its B·⌈L_in/chunk⌉ prefill chunks, one per request
    per iteration, within the token budget less the B decode tokens reserved first (so at least
    min(B, (budget − B) // chunk) chunks an iteration), then L_out − 1 decode iterations after the last
    prompt completes (its first token comes with its last chunk); ``slots`` (default B) size a one-pass
    prefill's budget."""
    b = batcher(p, p.batch if slots is None else slots)
    chunk, budget = b["chunk_tokens"], b["token_budget"]
    chunks = p.batch * math.ceil(p.prompt / chunk)
    per_iteration = max(1, min(p.batch, (budget - p.batch) // chunk))
    return math.ceil(chunks / per_iteration) + p.output - 1


def scenario(model_name: str, p: Point, slots: int, max_iterations: int, scan_chunk: int = 64,
             max_pass_tokens: int | None = None) -> systems.Scenario:
    """The point's fixed batch in ``slots`` slots under its reading, its organisation changes applied
    (``max_pass_tokens``: a bound shared by the points of one family)."""
    return systems.Scenario.fixed_batch(model_name, p.batch, p.prompt, p.output, slots=slots,
                                        org_changes=p.reading.org + p.changes, gpu_changes=p.reading.gpu,
                                        max_iterations=max_iterations, scan_chunk=scan_chunk,
                                        max_pass_tokens=max_pass_tokens, **batcher(p, slots))


def pass_bound(points: list[Point], slots: int) -> int:
    """The most tokens a pass of any of ``points`` holds (their readings' chunks and budgets)."""
    return max(engine.pass_token_bound(slots, b["chunk_tokens"], b["token_budget"])
               for b in (batcher(p, slots) for p in points))


def family(model_name: str, points: list[Point], slots: int, max_iterations: int, scan_chunk: int = 64
           ) -> systems.Family:
    """Every point as one family (``systems.stack``: one compilation), named by ``Point.system``."""
    bound = pass_bound(points, slots)
    members = [systems.single(p.org, scenario(model_name, p, slots, max_iterations, scan_chunk, bound))
               for p in points]
    return systems.stack(members, names=[p.system for p in points])


def decode_kv_hbm_share(p: Point, knobs: engine.ServeKnobs, config: engine.ServeConfig) -> float:
    """HBM share of the KV that a mid-decode token's attention reads (after L_out // 2 decode tokens):
    each kind's tokens in HBM when its placement row is at least half HBM (``kv_tiers``), the HBM total
    capped by the HBM KV budget (writeback moves the rest to HBF)."""
    place = np.asarray(knobs.org.place)
    in_hbm = [float(place[kind, orgs.HBM] >= 0.5) for kind in (orgs.PREFILL_KV, orgs.DECODE_KV)]
    decoded = p.output // 2
    budget = int(kv_tiers.capacity_tokens(knobs.org, config.model, knobs.hbm_kv_budget_bytes).hbm_budget_tokens)
    hbm = min(p.batch * (p.prompt * in_hbm[0] + decoded * in_hbm[1]), budget)
    return hbm / (p.batch * (p.prompt + decoded))


def decode_breakdown(p: Point, knobs: engine.ServeKnobs, config: engine.ServeConfig) -> dict:
    """Where one decode iteration's time goes (``layer_time.layer_times`` through ``engine.pass_times``):
    B decode tokens at the mid-decode context L_in + L_out // 2 with :func:`decode_kv_hbm_share` of
    their KV in HBM, routed on draw 0 of stream 0. Shares of the iteration in the routed experts and in
    attention, and the experts' delivery and compute time."""
    slots = config.batcher.slots
    context = np.where(np.arange(slots) < p.batch, p.prompt + p.output // 2, 1)
    b = timing.Batch.make(decode_context=context, decode_mask=np.arange(slots) < p.batch,
                          chunk_tokens=np.ones(slots, np.int32), chunk_mask=np.zeros(slots, bool))
    share = decode_kv_hbm_share(p, knobs, config)
    t = _PASS_TIMES((jnp.uint32(0), jnp.int32(0)), b, jnp.int32(0), knobs, config, jnp.float32(share))
    total = float(t.iteration_us)
    experts = layer_time.OPS.index("experts")
    attention = [layer_time.OPS.index(op) for op in ("attention_decode", "attention_prefill")]
    return {"decode_iteration_ms": total * 1e-3, "decode_kv_hbm_share": share,
            "decode_expert_share": float(np.sum(t.op_us[:, experts])) / total,
            "decode_attention_share": float(np.sum(np.asarray(t.op_us)[:, attention])) / total,
            "decode_expert_delivery_ms": float(np.sum(t.delivery_us[:, experts])) * 1e-3,
            "decode_expert_compute_ms": float(np.sum(t.compute_us[:, experts])) * 1e-3}


_PASS_TIMES = jax.jit(engine.pass_times, static_argnums=4)


def _totals(o) -> dict:
    """The engine's per-stream totals (``ServeOutput.totals``, :data:`TOTALS`) as means across streams."""
    return {f"{k}_mean": float(np.mean(getattr(o.totals, k))) for k in TOTALS}


def run_points(model_name: str, points: list[Point], streams: int, seed: int, *, breakdown: bool = True,
               scan_chunk: int = 64, max_iterations: int | None = None, pad_to: int | None = None) -> list[dict]:
    """Serve every point for ``model_name`` as one family (one compiled call) and return one row per
    point: the point, the :data:`METRICS` means with ``ci95_`` half-widths, iterations, overflow, and
    (``breakdown``) :func:`decode_breakdown`.

    ``scan_chunk``: iterations per loop step (larger for long runs: less loop overhead).
    ``max_iterations``: the loop's bound (default: :func:`iterations_bound` of the longest point plus a
    margin); calls
    with equal bounds, slots, model and point count share one compilation, which is what ``pad_to``
    is for: the knob axis is padded to that many points (repeating the last; dropped from the rows)."""
    if not points:
        raise ConfigError("run_points.points = []: need at least one point")
    model = models.preset(model_name)
    slots = max(p.batch for p in points)
    need = max(iterations_bound(p, slots) for p in points)
    if max_iterations is None:
        max_iterations = need + ITERATION_MARGIN
    require(max_iterations >= need, "run_points", "max_iterations", max_iterations,
            f"must be >= the {need} iterations the longest point may need")
    padded = points + [points[-1]] * (max(pad_to or 0, len(points)) - len(points))
    fam = family(model_name, padded, slots, max_iterations, scan_chunk)
    outs = families.run_outputs(fam, streams, seed)
    rows = []
    for p, kn, o in zip(points, fam.points, outs):
        s = metrics.summary(report.request_times(o))
        row = {"model": model_name, "system": p.system, "org": p.org, "reading": p.reading.name, "batch": p.batch,
               "prompt": p.prompt, "output": p.output, **{name: value for name, value in p.changes}}
        row.update({key: s[key] for m in METRICS for key in (m, f"ci95_{m}")})
        row.update(iterations=float(np.mean(o.iterations)), overflow=bool(np.any(o.overflow)), streams=streams,
                   kv_bytes=float(model.kv_bytes_per_token * (p.prompt + p.output)), **_totals(o))
        if breakdown:
            row.update(decode_breakdown(p, kn, fam.config))
        rows.append(row)
    return rows


def expert_cap_ratio(baseline: str = "relay-only") -> float:
    """DASH's expert-delivery rate cap over a single-path baseline's, both at DASH's values:
    min(Direct + Relay, HBF arrays, SRAM fill) / the baseline's path (``delivery.rates``)."""
    d, b = delivery.rates(orgs.dash()), delivery.rates(orgs.organisation(baseline))
    path = b.relay_gbps if baseline == "relay-only" else b.direct_gbps
    return float(min(d.direct_gbps + d.relay_gbps, d.array_gbps, d.sram_gbps) / path)


# --- ratios ----------------------------------------------------------------------------------------

def geomean(values) -> float:
    """Geometric mean of positive values (NaN for none)."""
    a = np.asarray(list(values), np.float64)
    require(a.ndim == 1 and np.all(a > 0), "geomean", "values", a.tolist(), "must be positive numbers")
    return float(np.exp(np.mean(np.log(a)))) if a.size else float("nan")


def paired(rows: list[dict], metric: str, baseline: str, keys: tuple[str, ...], candidate: str = "dash") -> list[float]:
    """System ``candidate``'s ``metric`` over system ``baseline``'s at every point (rows matched on
    ``keys``), in the order of ``candidate``'s rows."""
    def key(r):
        return tuple(r[k] for k in keys)

    base = {key(r): r[metric] for r in rows if r["system"] == baseline}
    mine = [r for r in rows if r["system"] == candidate]
    missing = [key(r) for r in mine if key(r) not in base]
    require(not missing, "paired", "rows", missing, f"have no {baseline} row at these {keys}")
    return [r[metric] / base[key(r)] for r in mine]


def speedup_and_reduction(rows: list[dict], keys: tuple[str, ...], throughput: str = "throughput_tokens_per_s",
                          baseline: str = "relay-only", candidate: str = "dash") -> tuple[float, float]:
    """(geomean throughput speedup, 1 − geomean E2E ratio) of ``candidate`` over ``baseline`` across the
    points (DASH §VI-B: "based on paired latency ratios")."""
    return (geomean(paired(rows, throughput, baseline, keys, candidate)),
            1.0 - geomean(paired(rows, "e2e_s", baseline, keys, candidate)))


def normalise(rows: list[dict], metric: str, to: dict, keys: tuple[str, ...]) -> list[float]:
    """Each row's ``metric`` over the ``metric`` of the row that matches it on ``keys`` and has the
    values of ``to`` (e.g. ``to={"org": "relay-only", "batch": 64}``, ``keys=("model",)``: Fig. 9(a)'s
    throughput normalised to RelayOnly at B = 64 of the same model)."""
    def ref_key(r):
        return tuple(r[k] for k in keys)

    refs = {ref_key(r): r[metric] for r in rows if all(r[k] == v for k, v in to.items())}
    missing = sorted({ref_key(r) for r in rows} - set(refs))
    require(not missing, "normalise", "rows", missing, f"have no reference row {to}")
    return [r[metric] / refs[ref_key(r)] for r in rows]
