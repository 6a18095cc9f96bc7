"""The ``reclaim`` part: read disturb and refresh of the HBF weights (and of DASH's HBF KV), timed in the
serving loop (issue 26).

Every read of a NAND page disturbs its block; after N page reads the block is relocated (its P pages
read on their plane and programmed into a fresh block, the old one erased; ``hbfjax.flash.disturb`` is
the mechanism alone, with its reference and closed forms). Here the engine feeds it each pass's own
weight reads (and, on a system without the blocks part, its KV reads) and times the rewrites they cause.

**Reads.** A pass that needs a weight reads every page of its blocks once, so each of those blocks
gains P reads. The HBF weights form groups of blocks that are always read together:

* each routed expert of each MoE layer, ``place[experts, hbf] × expert bytes / block bytes`` blocks,
  read in the passes whose routing draw needs that expert (token draws: the draw's own experts, so a hot
  expert under skewed routing wears its blocks faster; count draws, the uniform law: the layer's E experts
  share one credit, advanced by the distinct experts the draw needs, their E × n blocks evenly phased);
* the dense weights of each layer (the model's non-expert bytes in HBF, split evenly over its layers,
  embedding and LM head included), read every pass.

**Phases.** The n blocks of a group see the same reads; their read counters are taken at evenly spaced
phases of the relocation cycle (a device in use, as ``disturb``'s steady start). Then a group is one
carried credit ``c`` in blocks: a pass adds ``n × reads per block / N``, ``floor(c)`` blocks relocate
and ``c`` keeps its fraction (Hermite's identity makes this the exact count of the n phased blocks).
The credits start uniform on [0, 1) (hashed from the stream's words), the stationary phase. The
long-run relocation rate is therefore Σ reads / N, the renewal rate of ``hbfjax.read_reclaim``.

**Refresh** (``refresh_hours`` T > 0): a block not rewritten for T is rewritten (what a relocation
rewrote within T is not refreshed again). A block's progress to its next rewrite is the larger of its
reads / N and its age / T, both restarted by the rewrite, so the blocks of a group (one read progress,
one clock) are rewritten in the order they were last rewritten, and a group's rewrites follow the larger
of its two progresses summed since then. Each group therefore carries a deficit of time over reads
(``d ← max(d + Δt / T − Δreads / N, 0)``, Lindley's recursion: the largest excess of age over reads of
any recent stretch) and its high-water mark; a rise of the mark by x adds n × x to the group's refresh
credit. Reads ahead of the clock (every realistic T: a pass reads the dense weights every ~0.1 s) give
no refresh; a group the reads leave behind (a cold expert) is refreshed at n / T less what its reads
relocated, so a group's rewrites are n × max(reads / N, time / T) over the run, the per-block renewal
rate max(λ/N, 1/T) of ``hbfjax.read_reclaim`` (exact for steady reads). Where the clock leads, the
reads' share is still counted as relocations (a physical device would refresh those blocks instead:
the total is right, the split leans to relocations).

**KV cohorts** (a system with the tiers part and without the blocks part: DASH's organisations, whose HBF KV
has no block store). A slot's HBF KV is one cohort of blocks (``hbfjax.flash.disturb.cohorts``): its HBF
pages (``ceil(HBF tokens × KV bytes a token / page)``, the KV before the pass) in ``ceil(pages / P)`` blocks,
all read together: a pass that reads the slot's HBF KV (a decode token or a prefill chunk,
``parts.blocks.reading_slots``) reads each of its pages once, so each block of the cohort gains P reads.
The cohort's blocks are relocated together each time P × its reading passes since the request's KV was
written passes a multiple of N, the relocation copying the cohort's pages; they join the weights' backlog
(below). The cohort dies with its request (DASH retains no KV). Blocks written later (writeback, later
prefill chunks) take the cohort's whole count, and a last block less than full is counted as full (an
over-count of at most those blocks). KV cohorts are not refreshed: a request's KV lives seconds, far less
than any T. Reported: ``kv_block_reads_max`` (the most reads a cohort block took), ``kv_block_page_reads_per_s``,
``kv_reclaim_relocations_per_s`` (cohort blocks relocated per busy second) and ``kv_reclaim_waf_added`` (the
copied bytes per host-written KV byte: the direct prefill writes and the writebacks, DASH's HBF KV writes);
the copies' bytes are ``hbfjax.energy.kv_reclaim_bytes``, hence ``kv_reclaim_program_gbps`` and the lifetimes
of ``hbfjax.read_reclaim``. On HBFlex's organisations the blocks part counts the KV blocks' reads instead
(on its sampled planes, its copies timed as GC's migrations) and this part counts none.

**Time.** A rewritten block's P pages are read one after another on its plane (tR each; blocks on
distinct planes in parallel) and programmed through a relocation frontier striped over every plane, as
a page-mapped FTL writes its relocation stream (assumed: neither paper states where relocated data
goes), in full-width rounds of tPROG no faster than the program bandwidth; a KV cohort's copied pages are
read and programmed alike. Rewrites join a backlog that:

* ``in_windows = 1`` (default; HBFlex §5.3's principle applied to reclaim): drains in the layers' read-free
  windows (``hbf_writes.window_us``, the policy's prefetch) after the pass's KV programs (their rounds and
  bytes are taken from the windows first, an over-count where they were forced onto the critical path):
  whole tPROG rounds on every plane, whole tR reads on the planes of the blocks waiting, within the
  windows' program bandwidth. What waits beyond ``backlog_blocks`` blocks (default 0: a block is rewritten
  in the pass it falls due) is programmed at once on the critical path;
* ``in_windows = 0``: every rewrite programs on the critical path in the pass that causes it.

A forced rewrite of p pages over b = ceil(p / P) blocks stalls the pass ``ceil(b / planes) × P × tR +
max(ceil(p / planes) × tPROG, p × page / write_gbps)`` (read, then program: no pipelining, an upper
bound; ``reclaim_stall_s``, weights' and KV copies together). ``reclaim_timed_program_*`` and
``reclaim_timed_relocations_per_s`` are the weights' rewrites (the renewal estimate's counterparts), the
forced share is over both. The rewritten bytes are read, programmed and erased again in the run's energy
(``hbfjax.energy``'s ``reclaim_bytes``); the weight blocks' erases are not added to the blocks part's GC (a
separate region: their wear is in ``hbfjax.read_reclaim``'s lifetimes).

Knobs read: ``reclaim`` (:class:`ReclaimKnobs`: all traced, one compilation for a sweep), the
organisation (planes, page, tR, tPROG, program bandwidth, placement), the policy's prefetch; KV cohorts:
the tiers part's HBF tokens (``Reads.hbf_tokens``), the model's KV bytes a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, unique
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.flash.disturb import cohorts
from hbfjax.memory import hbf_packages
from hbfjax.memory.organisations import DENSE_WEIGHTS, EXPERT_WEIGHTS, HBF
from hbfjax.flash.disturb.reclaim import SECONDS_PER_HOUR, DisturbSalt
from hbfjax.hardware import PAGES_PER_BLOCK
from hbfjax.salts import Salt
from hbfjax.serve import hbf_writes
from hbfjax.serve.layer_time import expert_bytes
from hbfjax.serve.part import Part
from hbfjax.serve.parts.blocks import reading_slots
from hbfjax.serve.pass_routing import moe_layer_indices, pass_routing
from hbfjax.validate import ConfigError, require, require_int, require_real

US_PER_HOUR = SECONDS_PER_HOUR * 1e6


@unique
class ReclaimSalt(IntEnum):
    """Hash salts of the part's stationary phases. ``hbfjax.salts.Salt`` is the registry; these values are free
    there and in ``DisturbSalt`` (checked below, at import) and belong in it: moving them with the same values
    keeps every result."""

    EXPERT_PHASE = 170  # credit of a routed expert's blocks (words: layer · E + expert)
    DENSE_PHASE = 171  # credit of a layer's dense blocks (words: layer)
    REFRESH_PHASE = 172  # the refresh credit of every weight block


if {int(s) for s in ReclaimSalt} & ({int(s) for s in Salt} | {int(s) for s in DisturbSalt}):  # pragma: no cover
    raise ImportError("ReclaimSalt: a value collides with hbfjax.salts.Salt or DisturbSalt")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ReclaimKnobs:
    """Traced read-reclaim knobs (scalars; stack a leading axis to sweep)."""

    threshold_reads: jax.Array  # f32[] N: page reads a block takes before it is relocated
    refresh_hours: jax.Array  # f32[] T: every block rewritten every T hours as well; 0: off
    pages_per_block: jax.Array  # f32[] P: pages of one erase block
    in_windows: jax.Array  # f32[] 1: rewrites drain in read-free windows; 0: on the critical path at once
    backlog_blocks: jax.Array  # f32[] blocks that may wait for a later pass's windows before the rest is forced

    SOURCES = {"threshold_reads": "given: --read-disturb-reads (issue 26's public artifact: 10^6)",
               "refresh_hours": "given: --refresh-hours (OCP HBF v0.7: every 24-48 h; 0: off)",
               "pages_per_block": "HBFlex §5.1: 512 pages a block",
               "in_windows": "assumed: the controller schedules rewrites in read-free windows (HBFlex §5.3's "
                             "principle; neither paper times reclaim)",
               "backlog_blocks": "assumed: none wait (a due block is rewritten in the pass it falls due)"}

    @classmethod
    def make(cls, threshold_reads: float = 1e6, refresh_hours: float = 0.0, pages_per_block: int = PAGES_PER_BLOCK,
             in_windows: float = 1.0, backlog_blocks: float = 0.0) -> "ReclaimKnobs":
        """Validated knobs: N >= 1 reads, T >= 0 hours, 1 <= P whole pages, ``in_windows`` 0 or 1."""
        c = cls.__name__
        require_real(c, "threshold_reads", threshold_reads, 1.0, 1e15)
        require_real(c, "refresh_hours", refresh_hours, 0.0, 1e9)
        require_int(c, "pages_per_block", pages_per_block, 1, 2**20)
        require(in_windows in (0, 1), c, "in_windows", in_windows, "must be 0 or 1")
        require_real(c, "backlog_blocks", backlog_blocks, 0.0, 1e12)
        f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(threshold_reads=f(threshold_reads), refresh_hours=f(refresh_hours),
                   pages_per_block=f(pages_per_block), in_windows=f(in_windows), backlog_blocks=f(backlog_blocks))


class ReclaimState(NamedTuple):
    """Carried from pass to pass (one stream): credits in blocks, each in [0, 1) between passes."""

    expert_credit: jax.Array  # f32[L_moe, G] each routed expert's blocks (G = E), or each layer's (count draws:
    #   G = 1; a dense model: [0, 1])
    dense_credit: jax.Array  # f32[L] each layer's dense blocks
    expert_refresh: "Refresh"  # fields f32[L_moe, G]: the expert groups' refresh
    dense_refresh: "Refresh"  # fields f32[L]: the dense groups' refresh
    backlog_pages: jax.Array  # f32[] rewritten pages waiting for a window (weights' and KV copies)
    kv: cohorts.Cohorts | None = None  # fields [B]: each slot's KV cohort (None: KV not counted here)


class Refresh(NamedTuple):
    """One refresh per group of blocks (module docstring, Refresh), each field shaped like the groups."""

    credit: jax.Array  # f32[...] blocks due, in [0, 1) between passes
    deficit: jax.Array  # f32[...] time / T ahead of reads / N over the recent stretch (>= 0)
    high: jax.Array  # f32[...] the deficit's high-water mark


class ReclaimTotals(NamedTuple):
    """Per-run sums of the reclaim part (float32[])."""

    weight_page_reads: jax.Array  # page reads of HBF weight blocks (what the counters counted)
    relocated_blocks: jax.Array  # blocks relocated for read disturb
    refreshed_blocks: jax.Array  # blocks rewritten by refresh
    rewrite_bytes: jax.Array  # bytes the weights' rewrites programmed (every page of a weight block valid)
    window_bytes: jax.Array  # of them and the KV copies, programmed inside read-free windows
    forced_bytes: jax.Array  # of them and the KV copies, programmed on the critical path
    stall_us: jax.Array  # the forced programs' time on the critical path
    kv_page_reads: jax.Array  # page reads of the KV cohorts (0 where KV is not counted here)
    kv_relocated_blocks: jax.Array  # KV cohort blocks relocated for read disturb
    kv_copy_bytes: jax.Array  # bytes those relocations copied


class ReclaimFinal(NamedTuple):
    """What a run keeps of the part's final state."""

    backlog_bytes: jax.Array  # f32[] rewritten bytes still waiting for a window
    kv_block_reads_max: jax.Array | None  # f32[] the most page reads a KV cohort block took (None: not counted)


class Groups(NamedTuple):
    """Blocks of each group of weight blocks read together (float32, traced through the knobs)."""

    expert_blocks: jax.Array  # f32[] blocks of one routed expert of one layer in HBF
    dense_blocks: jax.Array  # f32[] dense blocks of one layer in HBF
    all_blocks: jax.Array  # f32[] every weight block in HBF


def groups(org, model, pages_per_block) -> Groups:
    """The block counts of the module docstring on the organisation ``org`` (a ``ModelSpec`` ``model``)."""
    block = pages_per_block * org.page_bytes
    layers = len(model.layer_kinds)
    expert = expert_bytes(model) * org.place[EXPERT_WEIGHTS, HBF] / block if model.is_moe else jnp.float32(0.0)
    dense = model.non_expert_weight_bytes * org.place[DENSE_WEIGHTS, HBF] / block / layers
    moe_layers = len(moe_layer_indices(model))
    return Groups(expert_blocks=jnp.asarray(expert, jnp.float32), dense_blocks=jnp.asarray(dense, jnp.float32),
                  all_blocks=jnp.asarray(expert * moe_layers * model.routed_experts + dense * layers, jnp.float32))


def expert_uses(needed, config) -> jax.Array:
    """Expert uses of a pass from ``pass_routing``'s ``needed``: a token draw's f32[L_moe, E] (1 for each expert
    it needs), or a count draw's f32[L_moe, 1] (the layer's distinct experts: under the uniform law every
    expert of a layer is equally likely, so the layer's E groups share one credit, E × n evenly phased blocks)."""
    model = config.model
    if not model.is_moe:
        return jnp.zeros((0, 1), jnp.float32)
    if config.routing_draw == "counts":
        return needed.astype(jnp.float32)[:, None]
    return needed.astype(jnp.float32)


def expert_groups(config) -> int:
    """Credits per MoE layer: one per expert under token draws, one for the layer under count draws."""
    return config.model.routed_experts if config.routing_draw == "tokens" else 1


def advance(credit, blocks_added):
    """(credit in [0, 1), whole blocks due): ``credit + blocks_added`` split into its fraction and floor."""
    total = credit + blocks_added
    due = jnp.floor(total)
    return total - due, due


def refresh_step(r: Refresh, blocks, time_progress, read_progress) -> tuple[Refresh, jax.Array]:
    """(the groups' refresh after a pass, blocks due for refresh, f32 like ``blocks``): the deficit of
    ``time_progress`` (the pass's time / T) over ``read_progress`` (its page reads per block / N) by
    Lindley's recursion, its high-water mark's rise × ``blocks`` into the credit (module docstring)."""
    deficit = jnp.maximum(r.deficit + time_progress - read_progress, 0.0)
    rise = jnp.maximum(deficit - r.high, 0.0)
    credit, due = advance(r.credit, blocks * rise)
    return Refresh(credit=credit, deficit=deficit, high=jnp.maximum(r.high, deficit)), due


def forced_us(pages, pages_per_block, planes, t_read_us, t_prog_us, page_bytes, write_gbps):
    """f32[] time to rewrite ``pages`` at once on the critical path: each block's pages read one after another
    on its plane (blocks on distinct planes), then programmed in full-width rounds of tPROG, no faster than
    the program bandwidth."""
    blocks = jnp.ceil(pages / pages_per_block)
    read_us = jnp.ceil(blocks / planes) * pages_per_block * t_read_us
    program_us = jnp.maximum(jnp.ceil(pages / planes) * t_prog_us, pages * page_bytes * 1e-3 / write_gbps)
    return jnp.where(pages > 0, read_us + program_us, 0.0)


def window_pages(windows_us, backlog_pages, kv_program_us, kv_bytes, pages_per_block, planes, t_read_us, t_prog_us,
                 page_bytes, write_gbps):
    """f32[] pages of the backlog the pass's read-free windows (f32[L] µs) can rewrite after its KV programs
    (``kv_program_us`` of rounds, ``kv_bytes``): whole tPROG rounds on every plane, whole tR reads on the
    planes of the blocks waiting, no more than the windows' program bandwidth."""
    rounds = jnp.maximum(jnp.floor(windows_us / t_prog_us).sum() - kv_program_us / t_prog_us, 0.0)
    sources = jnp.minimum(planes, jnp.ceil(backlog_pages / pages_per_block))
    by_reads = jnp.floor(windows_us / t_read_us).sum() * sources
    by_bandwidth = jnp.maximum(windows_us.sum() * write_gbps * 1e3 - kv_bytes, 0.0) / page_bytes
    return jnp.minimum(jnp.minimum(backlog_pages, rounds * planes), jnp.minimum(by_reads, by_bandwidth))


def kv_pages(hbf_tokens, kv_bytes_per_token: float, page_bytes) -> jax.Array:
    """f32[B]: the whole pages that each slot's ``hbf_tokens`` (int32[B]) of KV fill."""
    return jnp.ceil(hbf_tokens.astype(jnp.float32) * kv_bytes_per_token / page_bytes)


def init_state(words, model, routed_experts: int, kv_slots: int | None = None) -> ReclaimState:
    """Credits at the stationary phase (uniform on [0, 1), hashed from the stream's ``words``), nothing waiting;
    ``kv_slots``: the KV cohorts of that many slots, empty (None: KV not counted here)."""
    seed, stream = words
    moe = len(moe_layer_indices(model)) if model.is_moe else 0
    experts = routed_experts if model.is_moe else 1
    layers = len(model.layer_kinds)
    e = np.arange(moe * experts, dtype=np.int32).reshape(moe, experts)
    expert = rng.uniform01(rng.mix(seed, stream, ReclaimSalt.EXPERT_PHASE, e))
    dense = rng.uniform01(rng.mix(seed, stream, ReclaimSalt.DENSE_PHASE, np.arange(layers, dtype=np.int32)))
    refresh = rng.uniform01(rng.mix(seed, stream, ReclaimSalt.REFRESH_PHASE,
                                    np.arange(moe * experts + layers, dtype=np.int32))).astype(jnp.float32)
    fresh = lambda credit: Refresh(credit=credit, deficit=jnp.zeros_like(credit), high=jnp.zeros_like(credit))  # noqa: E731
    return ReclaimState(expert_credit=expert.astype(jnp.float32), dense_credit=dense.astype(jnp.float32),
                        expert_refresh=fresh(refresh[:moe * experts].reshape(moe, experts)),
                        dense_refresh=fresh(refresh[moe * experts:]), backlog_pages=jnp.float32(0.0),
                        kv=None if kv_slots is None else cohorts.init(kv_slots))


def part(knobs, config, run) -> Part:
    if knobs.reclaim is None or knobs.org is None:
        raise ConfigError("the reclaim part needs an organisation with ReclaimKnobs (ServeKnobs.reclaim): "
                          "give --read-disturb-reads N")
    org, rk, model = knobs.org, knobs.reclaim, config.model
    g = groups(org, model, rk.pages_per_block)
    planes = hbf_packages.planes(org)
    page, t_read, t_prog = org.page_bytes, org.t_read_us, org.t_prog_us
    write_gbps = org.hbf_stacks * org.hbf_write_gbps
    per_block = rk.pages_per_block
    reads_per_use = per_block / rk.threshold_reads  # a use reads every page of a block once
    refresh_us = rk.refresh_hours * US_PER_HOUR
    limit_pages = rk.in_windows * rk.backlog_blocks * per_block
    prefetch = knobs.policy.prefetch if knobs.policy is not None else 1.0
    # experts one credit stands for: a count draw's credit is the layer's E experts (its blocks' mean read
    # progress is the distinct experts drawn / E), a token draw's one expert
    pooled = float(model.routed_experts) if model.is_moe and config.routing_draw == "counts" else 1.0
    counts_kv = "tiers" in config.parts and "blocks" not in config.parts  # DASH's KV cohorts (module docstring)
    per_token = float(model.kv_bytes_per_token)

    def writes(state: ReclaimState, view, reads, times, record):
        needed = times.needed if times.needed is not None else pass_routing(
            view.words, view.batch, view.draw, knobs.routing, config)[0]
        uses = expert_uses(needed, config)  # f32[L_moe, E]
        expert_credit, relocated_e = advance(state.expert_credit, uses * g.expert_blocks * reads_per_use)
        dense_credit, relocated_d = advance(state.dense_credit, g.dense_blocks * reads_per_use)
        pass_us = times.iteration_us + record.stall_us
        clock = jnp.where(refresh_us > 0, pass_us / jnp.where(refresh_us > 0, refresh_us, 1.0), 0.0)  # age / T
        expert_refresh, refreshed_e = refresh_step(state.expert_refresh, g.expert_blocks * pooled, clock,
                                                   uses / pooled * reads_per_use)
        dense_refresh, refreshed_d = refresh_step(state.dense_refresh, g.dense_blocks, clock, reads_per_use)
        refreshed = refreshed_e.sum() + refreshed_d.sum()
        relocated = relocated_e.sum() + relocated_d.sum()
        kv, kv_moved = state.kv, cohorts.Relocated(*[jnp.float32(0.0)] * 3)  # none where KV is not counted here
        if counts_kv:
            kv, kv_moved = cohorts.read_pass(state.kv, view.request, reading_slots(view, reads),
                                             kv_pages(reads.hbf_tokens, per_token, page), per_block, rk.threshold_reads)
        kv_copied = kv_moved.pages.sum()
        new_pages = (relocated + refreshed) * per_block
        backlog = state.backlog_pages + new_pages + kv_copied
        windows = hbf_writes.window_us(times, prefetch)
        kv_bytes = record.prefill_write_bytes + record.writeback_bytes
        drained = rk.in_windows * window_pages(windows, backlog, record.program_busy_us, kv_bytes, per_block, planes,
                                               t_read, t_prog, page, write_gbps)
        forced = jnp.maximum(backlog - drained - limit_pages, 0.0)
        stall = forced_us(forced, per_block, planes, t_read, t_prog, page, write_gbps)
        page_reads = (uses.sum() * g.expert_blocks + len(model.layer_kinds) * g.dense_blocks) * per_block
        t = ReclaimTotals(weight_page_reads=page_reads, relocated_blocks=relocated, refreshed_blocks=refreshed,
                          rewrite_bytes=new_pages * page, window_bytes=drained * page, forced_bytes=forced * page,
                          stall_us=stall, kv_page_reads=kv_moved.page_reads.sum(),
                          kv_relocated_blocks=kv_moved.blocks.sum(), kv_copy_bytes=kv_copied * page)
        new = ReclaimState(expert_credit=expert_credit, dense_credit=dense_credit, expert_refresh=expert_refresh,
                           dense_refresh=dense_refresh, backlog_pages=backlog - drained - forced, kv=kv)
        return new, record._replace(stall_us=record.stall_us + stall), t

    def finish(state: ReclaimState):
        return ReclaimFinal(backlog_bytes=state.backlog_pages * page,
                            kv_block_reads_max=None if state.kv is None else state.kv.max_reads), jnp.bool_(False)

    kv_slots = config.batcher.slots if counts_kv else None
    return Part(init=lambda: init_state(run.words, model, expert_groups(config), kv_slots), writes=writes,
                finish=finish, totals=ReclaimTotals)


FRONTIER = ("assumed: a relocated block's pages are read on its own plane (P x tR) and programmed through a "
            "frontier striped over every plane (neither paper states where relocated data goes)")
KV_BLOCKS = ("KV blocks count their reads on the blocks part's sampled planes (HBFlex's organisations; "
             "kv_block_reads_*, kv_reclaim_*); DASH's organisations (no block store): each request's HBF KV is one "
             "cohort of ceil(pages / P) blocks read together, P reads a block per pass that reads it, relocated "
             "together at each multiple of N, the copies timed with the weights' rewrites (kv_block_reads_max, "
             "kv_reclaim_*)")


def describe(knobs: ReclaimKnobs) -> dict:
    """The run header's account of the timed reclaim: each knob's value and source, the assumed relocation
    frontier and which KV blocks are counted."""
    out = {name: {"value": float(np.asarray(getattr(knobs, name)).reshape(-1)[0]), "source": source}
           for name, source in ReclaimKnobs.SOURCES.items()}
    return {**out, "relocation_frontier": FRONTIER, "kv_blocks": KV_BLOCKS}


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream: the rewrites the engine timed, per busy second, and their stall;
    where this part counts the KV cohorts, their reads and relocations (module docstring, KV cohorts)."""
    t = {k: np.asarray(v, np.float64) for k, v in own.totals._asdict().items()}
    busy_s = np.maximum(np.asarray(out.totals.busy_us, np.float64) * 1e-6, 1e-30)
    rewrite = t["rewrite_bytes"]
    timed = rewrite + t["kv_copy_bytes"]
    kv = {} if own.final.kv_block_reads_max is None else kv_report(own, out, busy_s)
    return {**kv, "reclaim_stall_s": t["stall_us"] * 1e-6, "reclaim_stall_share_of_busy": t["stall_us"] * 1e-6 / busy_s,
            "reclaim_timed_program_gb": rewrite / 1e9, "reclaim_timed_program_gbps": rewrite / 1e9 / busy_s,
            "reclaim_timed_relocations_per_s": t["relocated_blocks"] / busy_s,
            "reclaim_timed_refreshes_per_s": t["refreshed_blocks"] / busy_s,
            "reclaim_timed_weight_page_reads_per_s": t["weight_page_reads"] / busy_s,
            "reclaim_timed_forced_share": np.where(timed > 0, t["forced_bytes"] / np.where(timed > 0, timed, 1.0), 0.0),
            "reclaim_timed_backlog_gb": np.asarray(own.final.backlog_bytes, np.float64) / 1e9}


def kv_report(own, out, busy_s) -> dict:
    """Host ``{key: float64[S]}``: the KV cohorts' keys, as the blocks part's where they mean the same — the most
    reads a cohort block took, page reads and relocated blocks per busy second, and the copies per host-written
    KV byte (NaN where no KV was written to HBF)."""
    t = {k: np.asarray(v, np.float64) for k, v in own.totals._asdict().items()}
    host = np.asarray(out.totals.prefill_write_bytes, np.float64) + np.asarray(out.totals.writeback_bytes, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"kv_block_reads_max": np.asarray(own.final.kv_block_reads_max, np.float64),
                "kv_block_page_reads_per_s": t["kv_page_reads"] / busy_s,
                "kv_reclaim_relocations_per_s": t["kv_relocated_blocks"] / busy_s,
                "kv_reclaim_waf_added": np.where(host > 0, t["kv_copy_bytes"] / host, np.nan)}
