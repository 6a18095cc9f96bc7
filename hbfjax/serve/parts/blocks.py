"""The ``blocks`` part: the HBF KV of each session in erase blocks of a sample of the package's planes,
invalidated by eviction and reclaimed by GC (HBFlex §3.3, §5.2, §5.4; ``hbfjax.serve.plane_store``).

The KV tokens each session puts in HBF — per pass (``Writes.hbf_new_tokens`` of the tiers part) and when
a finished request's HBM-resident KV is retained (``Admission.retired_hbm_tokens``) — accumulate per
session and their bytes are written once a chunk to P sampled planes at the paper's geometry (512 blocks × 512
pages each, one page the room's share of a plane), each fed exactly the pages the placement sends it:
a random plane per page when ``policy.balanced`` is 0 (naive HBF), G-wide stripes over the session's
plane group when it is 1 (HBFlex; each sampled plane in the group of a random request's session, so a
stream with few sessions over many groups still samples written planes), the KV of every writing
session interleaved in each open block (one frontier per lifetime label when ``policy.lifetime_aware``).
A request that takes its session's retained KV keeps only what it reuses (``Admission.kept_tokens``): the
rest, the tail where the new turn diverges, dies on every plane at the chunk's end before its writes
(``plane_store.cut``; the chunk's own new tokens of the session past the kept ones are dropped before they
reach a plane: :func:`diverge`). The part counts each session's tokens in the store exactly (int32), so a
tail of a token or more is told apart from float32 rounding of the store's bytes. The sessions the sessions part evicted
(``Chunk.evicted``) go stale on every plane; GC above ``policy.gc_trigger`` migrates valid pages of
greedy victims per plane, and the package's migrations (``plane_store.package_scale`` of the sampled
planes') are read over the
HBF read cut and programmed at the program bandwidth, exposed in the next iteration
(``Chunk.exposed_us``: not overlapped with compute).

**Read disturb** (issue 26, when ``ServeKnobs.reclaim`` is given: ``--read-disturb-reads N``): every pass
that reads a slot's HBF KV (a decode token or a prefill chunk: the attention reads every page of the context)
reads each live page of its session once; at each chunk the counted blocks (every block of the first
``read_counter_planes`` sampled planes, totals scaled to the P: ``plane_store``) take those reads
(``plane_store.add_reads``) on the pages as they lie at the chunk's end, after its writes, evictions and
GC: a page written in the chunk counts its whole chunk's reads (an over-count of at most one chunk), a page
GC moved counts them in its new block, and a block GC erased loses its last chunk's reads (an under-count
of at most one chunk; sweeping after GC spares XLA a copy of the owner tags that the GC loop would
otherwise need, about a third of the sweep's cost). GC's erases reset the counters, and a counter
passing N relocates its block: the block's live pages are copied (timed and exposed as GC's migrations;
the store keeps them where they are, so GC's own victims and WAF are those of the run without). Reported:
``kv_block_reads_max``, ``kv_block_reads_mean_at_erase``, ``kv_reclaim_relocations_per_s`` and
``kv_reclaim_waf_added`` (the relocations' page copies per host-written page).

Knobs read: ``policy.balanced``, ``policy.group_size``, ``policy.lifetime_aware``, ``policy.gc_trigger``,
``label_interval_us``, the room (``RunView``), ``org`` (planes, program bandwidth, read cut),
``reclaim.threshold_reads``.
"""

from __future__ import annotations

import numpy as np
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax import clock
from hbfjax.clock import Clock
from hbfjax.memory import delivery, hbf_packages
from hbfjax.serve import kv_blocks, plane_store
from hbfjax.serve.part import Part, RunView
from hbfjax.validate import ConfigError, require_int


@dataclass(frozen=True)
class BlocksConfig:
    """Static shape of the sampled planes (HBFlex §6.1 geometry: 512 blocks × 512 pages a plane)."""

    planes: int = 4  # P planes a stream simulates of the package's N (WAF converges in P: tests/test_plane_store)
    blocks_per_plane: int = 512
    pages_per_block: int = 512
    plane_writes_per_chunk: int = 1024  # pages one plane programs per chunk at most (the rest waits there)
    n_labels: int = 8
    gc_rounds: int = 8  # GC rounds of kv_blocks.victims_per_gc victims per plane, once per scan chunk
    read_counter_planes: int = 1  # read disturb: the first C sampled planes keep block read counters (issue 26)

    def __post_init__(self):
        c = type(self).__name__
        for name in ("planes", "blocks_per_plane", "pages_per_block", "plane_writes_per_chunk", "n_labels",
                     "gc_rounds", "read_counter_planes"):
            require_int(c, name, getattr(self, name), 1)

    def store(self, sessions: int) -> plane_store.PlaneStoreConfig:
        """The sampled planes of a stream of ``sessions`` requests: a chunk's KV written at once, then GC."""
        return plane_store.PlaneStoreConfig(
            sessions=sessions, planes=self.planes, blocks_per_plane=self.blocks_per_plane,
            pages_per_block=self.pages_per_block, max_writes=self.plane_writes_per_chunk, n_labels=self.n_labels,
            gc_rounds=self.gc_rounds, read_counter_planes=self.read_counter_planes)


class BlocksState(NamedTuple):
    blocks: plane_store.PlaneStore  # the sampled planes
    new_tokens: jax.Array  # int32[R] KV tokens each session put in HBF since the last chunk
    stored_tokens: jax.Array  # int32[R] KV tokens of each session in the store (written or waiting there)
    cut_tokens: jax.Array  # int32[R] the fewest of them a session kept this chunk (INT32_MAX: no cut)
    root_start: Clock  # Clock[R] each session root's arrival, the lifetime label's time (a closed loop
    #   records it as the root is admitted: its arrival is issued by the loop, not known ahead)
    session_reads: jax.Array | None = None  # float32[R] passes that read each session's HBF KV since the last
    #   chunk (None: reads not counted, no ReclaimKnobs)


def store_knobs(knobs, room_tokens, model, sc: plane_store.PlaneStoreConfig) -> plane_store.PlaneStoreKnobs:
    """The sampled planes' knobs: the policy's placement (plane groups of ``group_size`` or random pages),
    lifetime packing and GC trigger (GC reclaims back to just below it, ``KvBlocksKnobs.make``'s
    default), one page the KV room's share of a plane (room / (N × pages a plane))."""
    policy, f32 = knobs.policy, jnp.float32
    room_bytes = room_tokens.astype(f32) * float(model.kv_bytes_per_token)
    n_planes = hbf_packages.planes(knobs.org)
    blocks = kv_blocks.KvBlocksKnobs(
        lifetime_aware=policy.lifetime_aware, label_interval_us=knobs.label_interval_us,
        gc_trigger=policy.gc_trigger, gc_target=policy.gc_trigger, bytes_per_page=f32(1.0))  # a plane counts pages
    return plane_store.PlaneStoreKnobs(blocks=blocks, page_bytes=room_bytes / (n_planes * sc.plane_pages),
                                       package_planes=n_planes, grouped=policy.balanced,
                                       group_size=policy.group_size)


def package_bytes(sampled_pages, store: plane_store.PlaneStore, sk: plane_store.PlaneStoreKnobs,
                  sc: plane_store.PlaneStoreConfig):
    """f32: bytes of the package's pages that ``sampled_pages`` on the sampled planes stand for
    (``plane_store.package_scale`` pages each)."""
    return sampled_pages.astype(jnp.float32) * plane_store.package_scale(store, sk, sc) * sk.page_bytes


def check_trigger(policy, config: BlocksConfig, sessions: int) -> None:
    """Refuse a GC trigger (concrete ``policy.gc_trigger``) that leaves a sampled plane's free pool fewer
    blocks than one chunk's writes may take (``KvBlocksConfig.reserve_blocks``): writes would then wait
    for a GC that never runs."""
    plane = config.store(sessions).plane
    cap = 1.0 - plane.reserve_blocks / plane.n_blocks
    trigger = float(np.max(np.asarray(policy.gc_trigger)))
    if trigger > cap:
        raise ConfigError(f"gc_trigger = {trigger:g}: above {cap:.4f}, the most that planes of {plane.n_blocks} blocks "
                          f"x {plane.pages_per_block} pages leave for {config.plane_writes_per_chunk} page writes a "
                          f"chunk ({plane.reserve_blocks} blocks held free); lower it or use larger planes")


def _add_at_sessions(per_session, session, amount):
    """``per_session`` [R] plus each slot's ``amount`` [B] at its session (KV tokens, or read counts from
    ``reading_slots``)."""
    return per_session.at[session].add(jnp.asarray(amount, per_session.dtype))


def diverge(s: BlocksState, kept_tokens, new, request, reqs) -> BlocksState:
    """The new requests' diverged tails (``kept_tokens`` int32[B] each keeps of its session's retained KV, −1
    none; ``new`` bool[B], ``request`` int32[B]): a session keeps that many of its tokens in the store and
    this chunk. Kept at or past them all: nothing dies; within the chunk's new tokens: those past it are
    dropped; below the store's (or an earlier cut's this chunk): the store is cut there at the chunk's end
    (``cut_tokens``), the chunk's new tokens dropped. One cut a session per call (``kv_cache.take`` hands
    an entry to one request)."""
    cutting = new & (kept_tokens >= 0)
    session = reqs.session[jnp.maximum(request, 0)]
    base = jnp.minimum(s.stored_tokens[session], s.cut_tokens[session])
    idx = jnp.where(cutting, session, s.new_tokens.shape[0])
    return s._replace(
        new_tokens=s.new_tokens.at[idx].set(jnp.clip(kept_tokens - base, 0, s.new_tokens[session]), mode="drop"),
        cut_tokens=s.cut_tokens.at[idx].set(jnp.where(kept_tokens < base, kept_tokens, s.cut_tokens[session]),
                                            mode="drop"))


def reading_slots(view, reads) -> jax.Array:
    """float32[B] 1 for each slot whose pass reads its HBF KV (a decode token or a prefill chunk: the
    attention reads every page of the context, ``parts.reads.read_pages_per_layer``), else 0."""
    reading = (view.batch.decode_mask | view.batch.chunk_mask) & (reads.hbf_tokens > 0) & (view.request >= 0)
    return reading.astype(jnp.float32)


def part(knobs, config, run: RunView) -> Part:
    org, model, reqs = knobs.org, config.model, run.requests
    sessions = config.requests.requests
    sc = config.blocks.store(sessions)
    sk = store_knobs(knobs, run.room_tokens, model, sc)
    per_token = float(model.kv_bytes_per_token)
    closed = config.batcher.tasks > 0
    # a migrated byte is read over the HBF read cut and programmed at the program bandwidth (µs per kB)
    per_gb_s = (1.0 / jnp.maximum(org.hbf_stacks * org.hbf_write_gbps, 1e-9)
                + 1.0 / jnp.maximum(delivery.read_cuts(org).hbf_gbps, 1e-9))

    counting = knobs.reclaim is not None  # read disturb asked for: KV blocks count their reads too
    counted_share = plane_store.counted_share(sc)
    no_cut = jnp.iinfo(jnp.int32).max
    zeros = jnp.zeros(sessions, jnp.int32)

    def init():
        pilot = plane_store.pilots(run.words, reqs.session, reqs.valid, sc.planes)
        return BlocksState(blocks=plane_store.init(sc, pilot, count_reads=counting), new_tokens=zeros,
                           stored_tokens=zeros, cut_tokens=jnp.full(sessions, no_cut, jnp.int32),
                           root_start=reqs.root_start,
                           session_reads=jnp.zeros(sessions, jnp.float32) if counting else None)

    def admit(s: BlocksState, view, record):
        session = reqs.session[jnp.maximum(view.finished_request, 0)]
        s = s._replace(new_tokens=_add_at_sessions(s.new_tokens, session, record.retired_hbm_tokens))
        s = diverge(s, record.kept_tokens, view.new, view.state.slots.request, reqs)
        if closed:
            req = jnp.maximum(view.state.slots.request, 0)
            root = view.new & (reqs.session[req] == req)
            at = clock.take(view.state.arrival, req)
            index = jnp.where(root, req, sessions)
            s = s._replace(root_start=clock.Clock(s.root_start.s.at[index].set(at.s, mode="drop"),
                                                  s.root_start.us.at[index].set(at.us, mode="drop")))
        return s, record, None

    def writes(s: BlocksState, view, reads, times, record):
        session = reqs.session[jnp.maximum(view.request, 0)]
        s = s._replace(new_tokens=_add_at_sessions(s.new_tokens, session, record.hbf_new_tokens))
        if counting:
            s = s._replace(session_reads=_add_at_sessions(s.session_reads, session, reading_slots(view, reads)))
        return s, record, None

    def every_chunk(s: BlocksState, record):
        cutting = s.cut_tokens < s.stored_tokens
        keep_bytes = jnp.where(cutting, s.cut_tokens.astype(jnp.float32) * per_token, jnp.inf)
        store = plane_store.cut(run.words, s.blocks, keep_bytes, sk, sc)  # the chunk's diverged tails die
        new_bytes = s.new_tokens.astype(jnp.float32) * per_token
        store, _ = plane_store.write(run.words, store, new_bytes, s.root_start, sk, sc)
        relocated_before = store.reads.relocated_pages if counting else None
        store = plane_store.invalidate(store, record.evicted, sc)
        stored = jnp.where(record.evicted, 0, jnp.minimum(s.stored_tokens, s.cut_tokens) + s.new_tokens)
        store, moved = plane_store.collect(run.words, store, sk, sc)
        if counting:  # the chunk's reads, on the pages as they lie after its writes, evictions and GC (docstring)
            store = plane_store.add_reads(store, s.session_reads, knobs.reclaim.threshold_reads, sc)
        moved = moved.astype(jnp.float32)
        if counting:  # a relocation copies the block's live pages, timed as GC's migrations (scaled to all blocks)
            moved = moved + (store.reads.relocated_pages - relocated_before) * counted_share
        gc_us = package_bytes(moved, store, sk, sc) * 1e-3 * per_gb_s
        s = s._replace(blocks=store, new_tokens=zeros, stored_tokens=stored, cut_tokens=jnp.full_like(s.cut_tokens, no_cut))
        if counting:
            s = s._replace(session_reads=jnp.zeros_like(s.session_reads))
        return s, record._replace(exposed_us=record.exposed_us + gc_us)

    return Part(init=init, admit=admit, writes=writes, every_chunk=every_chunk,
                finish=lambda s: (s.blocks, plane_store.overflow(s.blocks)))


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream: the sampled planes' write amplification (HBFlex §5.4, Fig. 19;
    NaN for a stream that wrote no page: WAF is measured from host writes) with their host page programs,
    block erases, plane-chunks whose pages waited for GC (``stalled_plane_writes``) and those that sent a
    plane more than ``plane_writes_per_chunk`` pages (``capped_plane_writes``: the rest waited for the
    next chunk), and the GC migrations' exposed time per iteration."""
    b = own.final
    host = np.asarray(plane_store.host_pages(b), np.float64)
    gc_pages = np.asarray(plane_store.gc_pages(b), np.float64)
    iterations = np.maximum(np.asarray(out.iterations, np.float64), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        waf = np.where(host > 0, (host + gc_pages) / host, np.nan)
    diverged = np.asarray(b.planes.diverged_pages, np.float64).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        diverged_share = np.where(host > 0, diverged / host, np.nan)
    return {"waf": waf, "host_writes": host, "diverged_page_fraction": diverged_share,
            "block_erases": np.asarray(plane_store.erases(b), np.float64),
            "stalled_plane_writes": np.asarray(plane_store.stalled_writes(b), np.float64),
            "capped_plane_writes": np.asarray(plane_store.capped_writes(b), np.float64),
            "gc_ms_per_iteration": np.asarray(out.totals.chunk_stall_us, np.float64) * 1e-3 / iterations,
            **(read_disturb_report(b, host, out) if b.reads is not None else {})}


def read_disturb_report(b: plane_store.PlaneStore, host_pages, out) -> dict:
    """Host ``{key: float64[S]}``: the KV blocks' read-disturb counters (module docstring) — the most page reads
    a block took, the mean at GC's erase, the relocations the threshold implies per busy second of the package
    (the sampled planes' times ``package_scale``) and the programs they add per host-written page (a WAF term)."""
    r = {k: np.asarray(v, np.float64) for k, v in b.reads._asdict().items() if k != "count"}
    sample = b.planes.blocks.owner.shape[-3] / b.reads.count.shape[-2]  # sampled planes per counted plane
    for k in ("page_reads", "relocations", "relocated_pages"):
        r[k] = r[k] * sample
    scale = np.asarray(plane_store.sent_over_placed(b), np.float64)
    busy_s = np.maximum(np.asarray(out.totals.busy_us, np.float64) * 1e-6, 1e-30)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"kv_block_reads_max": r["max_reads"],
                "kv_block_reads_mean_at_erase": np.where(r["erased_blocks"] > 0,
                                                         r["reads_at_erase"] / r["erased_blocks"], np.nan),
                "kv_block_page_reads_per_s": r["page_reads"] * scale / busy_s,
                "kv_reclaim_relocations_per_s": r["relocations"] * scale / busy_s,
                "kv_reclaim_waf_added": np.where(host_pages > 0, r["relocated_pages"] / host_pages, np.nan)}
