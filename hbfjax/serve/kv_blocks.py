"""HBF KV blocks of one serving stream: page writes, invalidation by eviction, GC migrations, WAF.

HBFlex §3.3, §5.4, Fig. 10 and 19: KV pages of sessions with different lifetimes share erase blocks;
when a session's KV is evicted (LRU by session at 90 % utilisation, decided by the caller) its pages
go stale; GC (trigger at 95 % used: the gap is the deferred reclamation) takes greedy victims and
migrates their valid pages — extra programs, WAF − 1, and plane time in the serving timeline.
Lifetime-aware packing appends a page to the open block of its *lifetime label* (the session root's
start time // ``label_interval_us``, mod ``n_labels``; GC-moved pages keep their block's label);
interleaved packing uses one class for every page. Both run in ONE compilation: the switch is the
traced 0/1 knob ``lifetime_aware``.

**Scaled device.** The real package cannot be held per stream (HBFlex: 3.3 TB, 805 M pages), so the
block store is ``n_blocks × pages_per_block`` scaled pages standing for the HBF KV room; one scaled
page holds ``room_bytes / (n_blocks × pages_per_block)`` real bytes (``KvBlocksKnobs.bytes_per_page``).
Only the mix of lifetimes per block matters for WAF, and utilisation fractions (trigger, target,
eviction level) are preserved; a session's bytes are rounded to whole scaled pages as they accrue
(``pending_bytes`` holds the remainder).

**Lazy invalidation.** A page's owner tag is ``generation[session] << tag_bits | session``, and it
carries its number (below). A cut (:func:`cut`; eviction is a cut keeping nothing) bumps the session's
generation and records the level it keeps, O(R): no page is scanned. A page of generation g is live while
its number lies below every level kept by its session's cuts since max(g, the session's last settle).
``settle`` (O(pages), called by ``collect``, and forced by ``settle_due`` before a session's cuts since
the last settle overrun the ``cut_history`` levels kept) turns dead tags into −1 and recounts the
per-block valid pages, so greedy victims and migrations are exact at GC time. The per-session count
``session_pages`` is exact at all times (``valid_fraction``). Tags are int32: a session may be cut up
to 2^(31 − tag_bits) − 1 times.

**Diverged tails** (HBFlex §5.4: a later turn that diverges from its session's retained KV frees the
entry past the shared prefix). Each page carries its *number*, its place among its session's pages in
this store in write order (``gc.BlockState.payload``, kept through GC's migrations); a session's live
pages are numbered 0 … ``session_pages`` − 1, so ``session_pages`` is also the next page's number.
:func:`cut` keeps a session's first ``keep`` pages: the written ones numbered ``keep`` and on go stale
(lazily, above), its waiting pages past ``keep`` are dropped, and its next page is numbered ``keep``.
Eviction restarts the numbering at 0.

**Cost.** ``write`` is O(slots + max_writes) and ``invalidate`` O(R), but ``collect`` (through
``settle``) reads every page: call it every ``collect_every`` iterations (a chunk boundary); the
trigger's reserve then covers ``collect_every`` calls of ``write``. Measured (XLA CPU, 2 shared cores,
vmap over 256 streams, 1,024 × 32 pages, 32 slots, max_writes 128, R = 1,024), µs per stream-call:
write + invalidate 7–14, collect 37 with one GC round (settle alone 30), 55 with four rounds. If GC
falls behind, ``write`` makes the host wait (``stalled_writes``) rather than run the pool dry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.clock import Clock
from hbfjax.flash.erase import gc
from hbfjax.flash.erase.gc import BlockConfig, BlockState
from hbfjax.validate import require, require_int, require_real

_US_PER_S = 1_000_000.0
GC_HEADROOM_BLOCKS = 3  # free blocks gc.reclaim needs to take a victim with several classes (its pages + 2)


@dataclass(frozen=True)
class KvBlocksConfig:
    """Static geometry of one stream's scaled KV block store (shapes: static under jit)."""

    sessions: int  # R: owners are session indices in [0, R)
    max_writes: int  # scaled pages appended per ``write`` call at most (e.g. slots × a few)
    n_blocks: int = 1024
    pages_per_block: int = 32
    n_labels: int = 8  # lifetime labels = allocation classes (interleaved uses class 0 only)
    victims_per_gc: int = 4  # victims per GC round (gc.reclaim's amortised batch)
    gc_rounds: int = 1  # GC rounds per ``collect`` call
    victim: str = "greedy"  # gc.VICTIMS
    collect_every: int = 1  # write calls between collect calls (sets the free-block reserve)
    cut_history: int = 8  # H: lazy cuts (evictions included) a session may take between settles
    formulation: str = "auto"  # GC array primitives (gc.BlockConfig.formulation)

    def __post_init__(self) -> None:
        c = type(self).__name__
        require_int(c, "sessions", self.sessions, 1, 2**24)
        require_int(c, "max_writes", self.max_writes, 1, 2**20)
        require_int(c, "n_labels", self.n_labels, 1, 256)
        require_int(c, "gc_rounds", self.gc_rounds, 1, 64)
        require_int(c, "collect_every", self.collect_every, 1, 2**16)
        require_int(c, "cut_history", self.cut_history, 3, 256)
        self.blocks  # validates geometry, victims_per_gc, victim, formulation
        require(self.reserve_blocks < self.n_blocks, c, "n_blocks", self.n_blocks,
                f"must exceed the {self.reserve_blocks} blocks one call may need (reserve_blocks)")

    @property
    def blocks(self) -> BlockConfig:
        return BlockConfig(n_blocks=self.n_blocks, pages_per_block=self.pages_per_block, victim=self.victim,
                           n_classes=self.n_labels, victims_per_gc=self.victims_per_gc,
                           formulation=self.formulation)

    @property
    def physical_pages(self) -> int:
        return self.n_blocks * self.pages_per_block

    @property
    def tag_bits(self) -> int:
        """Low bits of an owner tag that hold the session index."""
        return max(1, (self.sessions - 1).bit_length())

    @property
    def reserve_blocks(self) -> int:
        """Free blocks the pool must keep: the pages of ``collect_every`` writes (a class opens at most
        one block more than its pages fill), and 3 for GC to take a victim (gc.reclaim with several
        classes takes victim 0 only if its pages plus 2 blocks fit)."""
        k, pages = self.pages_per_block, self.collect_every * self.max_writes
        return math.ceil(pages / k) + min(self.n_labels, pages) + GC_HEADROOM_BLOCKS


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KvBlocksKnobs:
    """Traced knobs: the ablation switches of one compilation (stack a leading axis to sweep)."""

    lifetime_aware: jax.Array  # f32[] 1: class = lifetime label of the session root; 0: one interleaved class
    label_interval_us: jax.Array  # f32[] root start time // interval → label (mod n_labels)
    gc_trigger: jax.Array  # f32[] GC when used pages (physical − free pool) exceed this fraction
    gc_target: jax.Array  # f32[] GC reclaims until used pages are at most this fraction
    bytes_per_page: jax.Array  # f32[] real bytes one scaled page stands for

    @classmethod
    def make(cls, config: KvBlocksConfig, room_bytes: float, lifetime_aware: float = 1.0,
             label_interval_us: float = 60e6, gc_trigger: float = 0.95,
             gc_target: float | None = None) -> "KvBlocksKnobs":
        """Knobs for a KV room of ``room_bytes`` (HBFlex: GC at 95 % used).

        ``gc_target`` defaults to ``gc_trigger``: GC reclaims just enough to fall back below the trigger,
        as late as possible (greedy victims then hold the fewest valid pages). The trigger must leave
        the free pool ``config.reserve_blocks`` blocks, or one call could run the pool dry.
        """
        o = cls.__name__
        require_real(o, "room_bytes", room_bytes, 0.0, None, lo_open=True)
        require(lifetime_aware in (0, 1, 0.0, 1.0), o, "lifetime_aware", lifetime_aware, "must be 0 or 1")
        require_real(o, "label_interval_us", label_interval_us, 0.0, 1e15, lo_open=True)
        cap = 1.0 - config.reserve_blocks / config.n_blocks
        require_real(o, "gc_trigger", gc_trigger, 0.0, cap, lo_open=True)
        target = gc_trigger if gc_target is None else gc_target
        require_real(o, "gc_target", target, 0.0, gc_trigger)
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(lifetime_aware=f32(lifetime_aware), label_interval_us=f32(label_interval_us),
                   gc_trigger=f32(gc_trigger), gc_target=f32(target),
                   bytes_per_page=f32(room_bytes / config.physical_pages))


class KvBlocks(NamedTuple):
    """One stream's KV block store. R = sessions."""

    blocks: BlockState  # owner tags gen << tag_bits | session, payload the page's number; valid counts exact
    #   after ``settle``
    pending_bytes: jax.Array  # f32[R] written bytes of each session not yet a whole scaled page
    generation: jax.Array  # int32[R] cuts (evictions included) of each session so far
    cut_level: jax.Array  # int32[R, H] the kept level of the cut that began generation g, at g mod H
    settled: jax.Array  # int32[R] each session's generation at the last settle (its cuts since are lazy)
    lapsed: jax.Array  # bool[] sticky: a session had more lazy cuts than the history holds (results invalid)
    session_pages: jax.Array  # int32[R] valid scaled pages of each session (exact at all times), numbered
    #   0 … session_pages − 1: the next page's number
    invalidated_pages: jax.Array  # int32[] pages made stale by eviction or a cut, cumulative
    diverged_pages: jax.Array  # int32[] of those, pages made stale by a cut (diverged tails), cumulative
    stalled_writes: jax.Array  # int32[] write calls that the free pool cut short (GC fell behind)
    capped_writes: jax.Array  # int32[] write calls that ``max_writes`` cut short (the free pool had room)

    @property
    def host_pages(self) -> jax.Array:
        return self.blocks.host_pages  # int32[] host page programs

    @property
    def gc_pages(self) -> jax.Array:
        return self.blocks.migrated_pages  # int32[] GC page programs (migrations)

    @property
    def erases(self) -> jax.Array:
        return self.blocks.erases.sum(axis=-1)  # int32[] block erases (per stream under a leading axis)

    @property
    def overflow(self) -> jax.Array:
        return self.blocks.overflow | self.lapsed  # bool[] sticky: the free pool ran dry or a session's cuts
        #   overran the history (results after it are not valid)


def init(config: KvBlocksConfig) -> KvBlocks:
    """An erased store, no session written."""
    r = config.sessions
    return KvBlocks(blocks=gc.init_state(config.blocks, payload=True), pending_bytes=jnp.zeros(r, jnp.float32),
                    generation=jnp.zeros(r, jnp.int32), cut_level=jnp.zeros((r, config.cut_history), jnp.int32),
                    settled=jnp.zeros(r, jnp.int32), lapsed=jnp.bool_(False), session_pages=jnp.zeros(r, jnp.int32),
                    invalidated_pages=jnp.int32(0), diverged_pages=jnp.int32(0), stalled_writes=jnp.int32(0),
                    capped_writes=jnp.int32(0))


def lifetime_label(root_start: Clock, knobs: KvBlocksKnobs, config: KvBlocksConfig) -> jax.Array:
    """int32[...] label of a session root's start time: (start // interval) mod n_labels (HBFlex §5.4).

    The start in µs is formed in float32 (spacing 512 µs near 2 h): labels near an interval boundary
    may shift by under a millisecond.
    """
    t_us = root_start.s.astype(jnp.float32) * _US_PER_S + root_start.us
    return jnp.mod(jnp.floor(t_us / knobs.label_interval_us).astype(jnp.int32), config.n_labels)


def _first_of_session(session: jax.Array, r: int) -> jax.Array:
    """bool[B]: the first slot holding each session (−1 slots: never); O(R + B)."""
    b = session.shape[0]
    slot = jnp.arange(b, dtype=jnp.int32)
    idx = jnp.where(session >= 0, session, r)
    first = jnp.full(r + 1, b, jnp.int32).at[idx].min(slot)
    return (session >= 0) & (first[idx] == slot)


def _expand(count: jax.Array, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-slot counts int32[B] → (slot of each of n entries int32[n], entry used bool[n], the entry's index
    among its slot's int32[n]); O(n + B)."""
    start = jnp.cumsum(count) - count
    mark = jnp.zeros(n, jnp.int32).at[start].add(1, mode="drop")
    slot = jnp.cumsum(mark) - 1
    entry = jnp.arange(n, dtype=jnp.int32)
    return slot, entry < count.sum(), entry - start[jnp.clip(slot, 0, count.shape[0] - 1)]


def write(state: KvBlocks, session: jax.Array, new_bytes: jax.Array, root_start: Clock, knobs: KvBlocksKnobs,
          config: KvBlocksConfig) -> tuple[KvBlocks, jax.Array]:
    """Program the new KV of one pass: ``session`` int32[B] (−1: empty slot), ``new_bytes`` f32[B],
    ``root_start`` Clock[B] (start of the slot's session root).

    Each session's bytes accumulate in ``pending_bytes``; its whole scaled pages are appended in slot
    order with owner tag = gen << tag_bits | session, numbered on from ``session_pages``, and class = its
    label if ``lifetime_aware`` else 0 — at most
    ``max_writes`` pages per call, and never more than the free pool holds beyond the blocks GC needs
    (the host waits for GC: the rest stays pending for the next call, and ``stalled_writes`` counts
    the call; a call cut short by ``max_writes`` alone counts in ``capped_writes``). So the pool never
    runs dry. Returns (state, pages_written int32[]).
    """
    r, n = config.sessions, config.max_writes
    spare = gc.free_blocks(state.blocks) - GC_HEADROOM_BLOCKS - min(config.n_labels, n)
    room = jnp.minimum(jnp.maximum(spare, 0) * config.pages_per_block, n)  # each class opens ≤ 1 extra block
    idx = jnp.where(session >= 0, session, r)
    pending = state.pending_bytes.at[idx].add(jnp.where(session >= 0, new_bytes, 0.0), mode="drop")
    first = _first_of_session(session, r)
    whole = jnp.floor(pending[jnp.clip(session, 0, r - 1)] / knobs.bytes_per_page).astype(jnp.int32)
    want = jnp.where(first, whole, 0)  # int32[B] pages of each slot's session (counted on its first slot)
    cum = jnp.minimum(jnp.cumsum(want), room)
    count = cum - jnp.concatenate([jnp.zeros(1, jnp.int32), cum[:-1]])  # clipped to the room in slot order
    short = want.sum() > room
    stalled, capped = short & (room < n), short & (room >= n)

    slot, used, nth = _expand(count, n)
    slot = jnp.clip(slot, 0, session.shape[0] - 1)
    sess = jnp.clip(session[slot], 0, r - 1)
    owner = (state.generation[sess] << config.tag_bits) | sess
    aware = knobs.lifetime_aware > 0.5
    cls = jnp.where(aware, lifetime_label(root_start, knobs, config), 0)[slot]
    blocks, _, _ = gc.append(state.blocks, owner, cls, used, config.blocks, state.session_pages[sess] + nth)
    wrote = count.sum()
    blocks = dataclasses.replace(blocks, host_pages=blocks.host_pages + wrote)
    written = jnp.zeros(r + 1, jnp.int32).at[jnp.where(count > 0, idx, r)].add(count)[:r]
    return state._replace(blocks=blocks, pending_bytes=pending - written.astype(jnp.float32) * knobs.bytes_per_page,
                          session_pages=state.session_pages + written,
                          stalled_writes=state.stalled_writes + stalled.astype(jnp.int32),
                          capped_writes=state.capped_writes + capped.astype(jnp.int32)), wrote


def invalidate(state: KvBlocks, evicted: jax.Array, config: KvBlocksConfig) -> KvBlocks:
    """Every page (and pending byte) of the ``evicted`` sessions (bool[R]) goes stale: a cut keeping none of
    them (:func:`cut`'s lazy generation bump, O(R)); the session's next page is numbered 0."""
    gone = jnp.where(evicted, state.session_pages, 0).sum()
    state = _bump(state, jnp.where(evicted, 0, -1), config)
    return state._replace(session_pages=jnp.where(evicted, 0, state.session_pages),
                          pending_bytes=jnp.where(evicted, 0.0, state.pending_bytes),
                          invalidated_pages=state.invalidated_pages + gone)


def cut(state: KvBlocks, keep: jax.Array, knobs: KvBlocksKnobs, config: KvBlocksConfig) -> KvBlocks:
    """Each session ``s`` with ``0 <= keep[s]`` (int32[R]; −1: untouched) keeps its first ``keep[s]`` pages
    (module docstring, diverged tails): its written pages numbered ``keep[s]`` and on go stale (lazily, as
    eviction's: O(R), applied by :func:`settle`), its waiting pages past ``keep[s]`` are dropped (whole
    pages; the fraction of a page waits on), and its next page is numbered ``min(session_pages, keep)``."""
    cutting = keep >= 0
    keep = jnp.where(cutting, keep, jnp.iinfo(jnp.int32).max)
    written = state.session_pages
    waiting = jnp.floor(state.pending_bytes / knobs.bytes_per_page)  # whole pages waiting
    kept_waiting = jnp.clip(keep - written, 0, waiting).astype(jnp.float32)
    dead = jnp.maximum(written - keep, 0)  # int32[R] written pages past keep: live, numbered keep … written − 1
    state = _bump(state, jnp.where(dead > 0, keep, -1), config)
    return state._replace(session_pages=written - dead,
                          pending_bytes=state.pending_bytes - jnp.where(cutting, waiting - kept_waiting, 0.0)
                          * knobs.bytes_per_page,
                          invalidated_pages=state.invalidated_pages + dead.sum(),
                          diverged_pages=state.diverged_pages + dead.sum())


def _bump(state: KvBlocks, level: jax.Array, config: KvBlocksConfig) -> KvBlocks:
    """Sessions with ``level[s] >= 0`` (int32[R]) start a new generation whose cut keeps their pages numbered
    below ``level[s]`` (0: none); a session with more generations since its last settle than the history
    holds sets ``lapsed`` (later results invalid: :func:`settle_due` prevents it)."""
    bump = level >= 0
    generation = state.generation + bump.astype(jnp.int32)
    slot = jnp.mod(generation, config.cut_history)
    rows = jnp.where(bump, jnp.arange(config.sessions, dtype=jnp.int32), config.sessions)
    return state._replace(generation=generation, cut_level=state.cut_level.at[rows, slot].set(level, mode="drop"),
                          lapsed=state.lapsed | (generation - state.settled > config.cut_history).any())


def settle_due(state: KvBlocks, config: KvBlocksConfig) -> jax.Array:
    """bool[]: a session has so many cuts since the last settle that two more (one chunk's cut and eviction)
    would overrun the history: settle now."""
    return (state.generation - state.settled > config.cut_history - 2).any()


def tag_sessions(owner: jax.Array, config: KvBlocksConfig) -> jax.Array:
    """int32 the session of each owner tag (clipped: read with :func:`live_tags`)."""
    return jnp.clip(owner & ((1 << config.tag_bits) - 1), 0, config.sessions - 1)


def keep_below(state: KvBlocks, config: KvBlocksConfig) -> jax.Array:
    """int32[R, H + 1]: ``[s, d]`` the page number below which a page of session s survives the last d cuts
    (the least of their kept levels; d = 0: no cut, INT32_MAX)."""
    h = config.cut_history
    back = jnp.mod(state.generation[:, None] - jnp.arange(h, dtype=jnp.int32)[None, :], h)  # [R, H] newest first
    levels = jnp.take_along_axis(state.cut_level, back, axis=1)
    return jnp.concatenate([jnp.full((config.sessions, 1), jnp.iinfo(jnp.int32).max, jnp.int32),
                            jax.lax.cummin(levels, axis=1)], axis=1)


def live_tags(owner: jax.Array, number: jax.Array, state: KvBlocks, config: KvBlocksConfig) -> jax.Array:
    """bool: the page of each owner tag (with its page ``number``) holds live KV, the lazy cuts and evictions
    applied: a page of generation g survives the cuts after max(g, its session's last settle), i.e. its
    number lies below the least of their kept levels."""
    session = tag_sessions(owner, config)
    generation = state.generation[session]
    since = jnp.minimum(generation - jnp.maximum(owner >> config.tag_bits, state.settled[session]), config.cut_history)
    return (owner >= 0) & (number < keep_below(state, config)[session, jnp.maximum(since, 0)])


def live_pages(state: KvBlocks, config: KvBlocksConfig) -> jax.Array:
    """bool[n_blocks, pages_per_block]: :func:`live_tags` of every physical page."""
    return live_tags(state.blocks.owner, state.blocks.payload, state, config)


def settle(state: KvBlocks, config: KvBlocksConfig) -> KvBlocks:
    """Apply the lazy invalidations (cuts, evictions) to the pages: dead tags → −1, valid counts recounted, each
    session's history emptied.

    O(n_blocks × pages_per_block) gathers from the R-entry tables.
    """
    st, alive = state.blocks, live_pages(state, config)
    return state._replace(blocks=dataclasses.replace(st, owner=jnp.where(alive, st.owner, -1),
                                                     valid=alive.sum(axis=1, dtype=jnp.int32)),
                          settled=state.generation)


def collect(words: tuple, state: KvBlocks, knobs: KvBlocksKnobs, config: KvBlocksConfig) -> tuple[KvBlocks, jax.Array]:
    """GC if used pages exceed ``gc_trigger`` (HBFlex §5.4): ``gc_rounds`` rounds of greedy victims,
    until used ≤ ``gc_target``; valid pages of a victim move to the open block of its label.

    Returns (state, moved_pages int32[] programmed by this call's migrations).
    """
    state = settle(state, config)
    bc = config.blocks
    target = gc.gc_target_pages(state.blocks, knobs.gc_trigger, knobs.gc_target, bc)
    before = state.blocks.migrated_pages
    blocks, _ = gc.collect(words, state.blocks, config.gc_rounds, target, bc)
    return state._replace(blocks=blocks), blocks.migrated_pages - before


def waf(state: KvBlocks) -> jax.Array:
    """f32[] write amplification: (host + GC page programs) / host page programs (1 before any write)."""
    host = state.host_pages.astype(jnp.float32)
    return (host + state.gc_pages.astype(jnp.float32)) / jnp.maximum(host, 1.0)


def valid_fraction(state: KvBlocks, config: KvBlocksConfig) -> jax.Array:
    """f32[] valid scaled pages / physical pages (the eviction policy's utilisation; exact, O(R))."""
    return state.session_pages.sum(axis=-1).astype(jnp.float32) / jnp.float32(config.physical_pages)


def used_fraction(state: KvBlocks, config: KvBlocksConfig) -> jax.Array:
    """f32[] used pages (physical − free pool) / physical: what ``gc_trigger`` compares."""
    pool = gc.free_blocks(state.blocks) * config.pages_per_block
    return 1.0 - pool.astype(jnp.float32) / jnp.float32(config.physical_pages)

