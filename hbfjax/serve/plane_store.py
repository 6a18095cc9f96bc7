"""A sample of HBF planes holding one serving stream's KV, each fed exactly the pages the placement sends
it (HBFlex §3.3, §5.2, §5.4, §6.1; the fidelity audit's "sample planes, not bytes").

The package stripes KV over all N planes (HBFlex §3: 6 stacks × 16 dies × 32 = 3,072), each of 512 blocks
× 512 pages of 4 KiB. A stream simulates P of them (``PlaneStoreConfig.planes``), each a
:mod:`hbfjax.serve.kv_blocks` store at that geometry holding the plane's share of the KV room: one page
stands for room / (N × 512 × 512) bytes, i.e. 4 KiB × room / package (≈ 3.3 KiB at DeepSeek-V3's
2.6 TB room: the rest of every plane holds weights, which GC never touches). Every call turns each
session's new bytes into whole pages of the package (``pending_bytes`` holds the remainder) and sends
them to the sampled planes as the placement does:

- random pages (naive HBF, ``grouped`` = 0): a page lands on a uniform plane of N, so a sampled plane
  receives Poisson(n / N) of a session's n new pages (the binomial's limit for N ≫ 1; the sampled planes
  are drawn independently, which neglects the multinomial's negative correlation, O(P / N));
- plane groups (HBFlex §5.2, ``grouped`` = 1): the planes form ⌊N / G⌋ groups of G; a session's k-th
  page goes to plane (k + offset) mod G of its group; its pages on a sampled plane are exact given the
  session's group and offset (uniform hashes of the session: the paper states no rule that chooses a
  session's group). Sampled plane j is either the package's plane j (stripe position ⌊j / groups⌋ mod G
  of group j mod groups) or, given a *pilot* session (``init``'s ``pilot``), stripe position j mod G of
  that session's group: with few sessions over many groups most fixed planes hold nothing, while a
  group chosen through a session is chosen with probability ∝ its sessions, which is how the package's
  WAF, Σ (host + GC) / Σ host over groups, weights them (a size-biased sample; exact when groups are
  chosen ∝ their pages, as a random request's session approximates).

Within a plane, the pages of all sessions writing in a call interleave in its open blocks (one frontier
per lifetime label with ``lifetime_aware``, else one), in session order. Eviction kills a session's
pages on every plane; :func:`cut` keeps only a session's first bytes (a later turn that diverges from
its retained KV, HBFlex §5.4): its pages past them die on every plane (``kv_blocks.cut``: a plane's
pages of a session are numbered in write order; a stripe's pages past the cut are exactly those numbered
from its stripe count below the cut, random pages keep a share of their plane's count in proportion,
stochastically rounded, as their places along the session's KV are uniform), and its next page is
the first past them. GC runs per plane. Pages a plane cannot take yet wait on that plane: calls
whose pages waited because GC was behind count in ``stalled_writes``, those with more than
``max_writes`` pages for the plane (and room for them) in ``capped_writes``.
GC runs on a plane once its used pages pass the trigger, so until the room has filled a call costs
the writes alone. WAF is the sampled planes' (host + GC programs) / host programs; a page on the sampled
planes stands for (pages the package was sent) / (pages the sampled planes were sent) of the package's
(:func:`package_scale`: N / P on average for random placement and fixed planes).

Read disturb (issue 26; ``init(count_reads=True)``): every block of the first ``read_counter_planes`` C
of the P sampled planes counts the page reads of its live pages (:func:`add_reads`,
``hbfjax.flash.disturb.counters``), reset when GC erases it, so the store tells whether a KV block takes
N reads before its pages die. The sampled planes are independent draws of the package's (each alone an
unbiased sample of a plane), so C of them are an unbiased sample of the P: totals scale by P / C
(:func:`counted_share`). The default C = 1 keeps the sweep of the owner tags within a quarter of a
serving step (BENCHMARKS.md, issue 26); C = P counts every sampled block. (An earlier sample of every
k-th block of each plane, from block 0, was biased: blocks open in index order until GC first erases,
so it over-weighted the oldest blocks, 1.44–1.6× the relocations of every block on HBFlex's SWE-bench
runs.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import batch, rng
from hbfjax.clock import Clock
from hbfjax.salts import Salt
from hbfjax.flash.disturb import counters
from hbfjax.flash.erase import gc
from hbfjax.serve import kv_blocks
from hbfjax.validate import require, require_int


POISSON_TERMS = 48  # inverse-CDF terms of the Poisson draw (at mean POISSON_EXACT_MEAN the tail beyond is < 1e-9)
POISSON_EXACT_MEAN = 16.0  # above it a rounded normal stands in (skewness 1/√16 = 0.25 and falling)


@dataclass(frozen=True)
class PlaneStoreConfig:
    """Static shape of one stream's sampled planes (HBFlex §6.1 geometry by default)."""

    sessions: int  # R: owners are session indices in [0, R)
    planes: int = 4  # P planes simulated per stream (the package's N planes are a knob)
    blocks_per_plane: int = 512
    pages_per_block: int = 512
    max_writes: int = 1024  # pages one plane programs per call at most (the rest waits, pending)
    n_labels: int = 8
    gc_rounds: int = 8  # GC rounds of victims_per_gc victims per plane per call
    read_counter_planes: int = 1  # C: the first C sampled planes keep read-disturb counters (the docstring)

    def __post_init__(self):
        c = type(self).__name__
        require_int(c, "planes", self.planes, 1, 4096)
        require_int(c, "read_counter_planes", self.read_counter_planes, 1, self.planes)
        self.plane  # validates the rest

    @property
    def plane(self) -> kv_blocks.KvBlocksConfig:
        """One sampled plane's store."""
        return kv_blocks.KvBlocksConfig(sessions=self.sessions, max_writes=self.max_writes,
                                        n_blocks=self.blocks_per_plane, pages_per_block=self.pages_per_block,
                                        n_labels=self.n_labels, gc_rounds=self.gc_rounds, collect_every=1)

    @property
    def plane_pages(self) -> int:
        return self.blocks_per_plane * self.pages_per_block


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PlaneStoreKnobs:
    """Traced knobs: placement and the planes' block-store knobs (stack a leading axis to sweep)."""

    blocks: kv_blocks.KvBlocksKnobs  # each plane's (bytes_per_page = 1: a plane counts whole pages)
    page_bytes: jax.Array  # f32[] KV bytes of one page: room / (N × blocks × pages per block)
    package_planes: jax.Array  # f32[] N planes the package stripes KV over (HBFlex §3: 3,072)
    grouped: jax.Array  # f32[] 1: stripes over plane groups of G (HBFlex); 0: a random plane per page
    group_size: jax.Array  # f32[] G planes per group

    @classmethod
    def make(cls, config: PlaneStoreConfig, room_bytes: float, package_planes: int = 3072, grouped: float = 1.0,
             group_size: float = 32.0, **blocks) -> "PlaneStoreKnobs":
        """Knobs for a KV room of ``room_bytes`` spread over ``package_planes`` planes (``blocks``:
        KvBlocksKnobs.make's)."""
        o = cls.__name__
        require_int(o, "package_planes", package_planes, config.planes, 2**20)
        require(grouped in (0, 1, 0.0, 1.0), o, "grouped", grouped, "must be 0 or 1")
        require_int(o, "group_size", group_size, 1, 2**16)  # G above N: one group
        bk = kv_blocks.KvBlocksKnobs.make(config.plane, float(config.plane_pages), **blocks)  # 1 byte a page
        f32 = jnp.float32
        return cls(blocks=bk, page_bytes=f32(room_bytes / (package_planes * config.plane_pages)),
                   package_planes=f32(package_planes), grouped=f32(grouped), group_size=f32(group_size))


class PlaneStore(NamedTuple):
    """One stream's sampled planes. P = planes, R = sessions."""

    planes: kv_blocks.KvBlocks  # [P] each plane's store; its pending "bytes" are the pages waiting on it
    pending_bytes: jax.Array  # f32[R] a session's new bytes not yet a whole page of the package
    pages_written: jax.Array  # int32[R] whole pages of the package each session has written, cumulative
    position: jax.Array  # int32[R] package pages of each session's KV now: the next page's index (its stripe
    #   position); a cut sets it to the pages kept, eviction to 0
    calls: jax.Array  # int32[] write calls so far (a word of the placement draws)
    pilot: jax.Array  # int32[P] the session whose plane group sampled plane j lies in; -1: the package's plane j
    placed: jax.Array  # int32[] pages sent to the sampled planes so far (programmed or waiting)
    reads: counters.BlockReads | None = None  # [P, blocks] read-disturb counters (None: reads not counted)


def init(config: PlaneStoreConfig, pilot: jax.Array | None = None, count_reads: bool = False) -> PlaneStore:
    """Erased planes, no session written; ``pilot`` int32[P] (default all -1: the package's planes 0 … P-1;
    module docstring); ``count_reads``: each block keeps a read-disturb counter (:func:`add_reads`)."""
    p, r = config.planes, config.sessions
    one = kv_blocks.init(config.plane)
    pilot = jnp.full(p, -1, jnp.int32) if pilot is None else jnp.asarray(pilot, jnp.int32).reshape(p)
    return PlaneStore(planes=jax.tree.map(lambda x: jnp.broadcast_to(x, (p,) + x.shape), one),
                      pending_bytes=jnp.zeros(r, jnp.float32), pages_written=jnp.zeros(r, jnp.int32),
                      position=jnp.zeros(r, jnp.int32), calls=jnp.int32(0),
                      pilot=pilot, placed=jnp.int32(0),
                      reads=counters.init((config.read_counter_planes, config.blocks_per_plane))
                      if count_reads else None)


def pilots(words: tuple, session: jax.Array, valid: jax.Array, planes: int) -> jax.Array:
    """int32[P] pilot sessions: the ``session`` (int32[R]) of a hash-chosen valid request (``valid`` bool[R], a
    prefix) for each sampled plane (a request's session: groups chosen ∝ their requests, as ∝ pages)."""
    n = jnp.maximum(jnp.sum(valid).astype(jnp.int32), 1)
    q = rng.below(rng.mix(*words, jnp.arange(planes, dtype=jnp.int32), Salt.STORE_PILOT), n).astype(jnp.int32)
    return session[q].astype(jnp.int32)


def poisson(h_u: jax.Array, h_angle: jax.Array, mean: jax.Array) -> jax.Array:
    """int32 Poisson variates of ``mean`` (float32, ≥ 0) from uint32 hashes: the inverse CDF over
    ``POISSON_TERMS`` terms up to ``POISSON_EXACT_MEAN``, a rounded normal above it."""
    mean = jnp.asarray(mean, jnp.float32)
    u = rng.uniform01(h_u)

    def term(k, c):  # c = (variate so far, pmf(k), cdf(k)): the variate is the number of cdf(k) <= u
        x, pmf, cdf = c
        pmf = pmf * mean / (k + 1.0)
        return x + (u >= cdf), pmf, cdf + pmf

    pmf0 = jnp.exp(-jnp.minimum(mean, POISSON_EXACT_MEAN))
    small, _, _ = jax.lax.fori_loop(0, POISSON_TERMS, term, (jnp.zeros(mean.shape, jnp.int32), pmf0, pmf0))
    large = jnp.maximum(jnp.round(mean + jnp.sqrt(mean) * rng.normal(h_u, h_angle)), 0.0)
    return jnp.where(mean <= POISSON_EXACT_MEAN, small, large).astype(jnp.int32)


def group_size(knobs: PlaneStoreKnobs) -> jax.Array:
    """int32[] G from the f32 knob (rounded, at least 1)."""
    return jnp.maximum(jnp.round(knobs.group_size), 1.0).astype(jnp.int32)


def groups(knobs: PlaneStoreKnobs) -> jax.Array:
    """int32[] plane groups of the package: ⌊N / G⌋ (at least 1)."""
    return jnp.maximum(jnp.floor(knobs.package_planes / group_size(knobs)), 1.0).astype(jnp.int32)


def stripe_pages(first: jax.Array, count: jax.Array, position: jax.Array, group_size: jax.Array) -> jax.Array:
    """int32 pages k in [first, first + count) with k ≡ position (mod G): a stripe's pages on one plane."""
    g = group_size
    upto = lambda n: jnp.where(n > position, (n - position + g - 1) // g, 0)  # noqa: E731  k < n with k ≡ pos
    return upto(first + count) - upto(first)


def placed_pages(words: tuple, new_pages: jax.Array, pages_before: jax.Array, call, knobs: PlaneStoreKnobs,
                 config: PlaneStoreConfig, pilot: jax.Array | None = None) -> jax.Array:
    """int32[P, R]: of each session's ``new_pages`` int32[R] (its pages ``pages_before`` … onwards), those
    the placement sends to each sampled plane (module docstring); ``call`` int32[] a word of the draws;
    ``pilot`` int32[P] as :func:`init`'s (None: all -1)."""
    p, r = config.planes, config.sessions
    plane = jnp.arange(p, dtype=jnp.int32)[:, None]
    session = jnp.arange(r, dtype=jnp.int32)[None, :]
    h = lambda salt, *w: rng.mix(*words, *w, salt)  # noqa: E731
    mean = new_pages.astype(jnp.float32)[None, :] / knobs.package_planes
    random = poisson(h(Salt.STORE_PLANE_PAGES, call, plane, session), h(Salt.STORE_PLANE_NORMAL, call, plane, session),
                     jnp.broadcast_to(mean, (p, r)))
    mine, position = stripes(words, knobs, config, pilot)
    striped = jnp.where(mine, stripe_pages(pages_before[None, :], new_pages[None, :], position, group_size(knobs)), 0)
    return jnp.where(knobs.grouped > 0.5, striped, random)


def stripes(words: tuple, knobs: PlaneStoreKnobs, config: PlaneStoreConfig,
            pilot: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(bool[P, R] each sampled plane lies in each session's plane group, int32[P, R] which k mod G of the
    session's pages land on it) under plane-group placement (module docstring; ``pilot`` as
    :func:`placed_pages`')."""
    p, r = config.planes, config.sessions
    plane = jnp.arange(p, dtype=jnp.int32)[:, None]
    session = jnp.arange(r, dtype=jnp.int32)[None, :]
    h = lambda salt, *w: rng.mix(*words, *w, salt)  # noqa: E731
    g, n_groups = group_size(knobs), groups(knobs)
    group_of = lambda s: rng.below(h(Salt.STORE_GROUP, s), n_groups).astype(jnp.int32)  # noqa: E731
    pilot = jnp.full((p, 1), -1, jnp.int32) if pilot is None else pilot.reshape(p, 1)
    piloted = pilot >= 0
    plane_group = jnp.where(piloted, group_of(jnp.maximum(pilot, 0)), plane % n_groups)  # [P, 1]
    stripe = jnp.where(piloted, plane % g, (plane // n_groups) % g)  # [P, 1] the plane's position in its group
    mine = group_of(session) == plane_group  # [P, R]
    offset = rng.below(h(Salt.STORE_STRIPE_OFFSET, session), g).astype(jnp.int32)  # [1, R]
    return mine, jnp.mod(stripe - offset, g)


def write(words: tuple, state: PlaneStore, session_bytes: jax.Array, root_start: Clock, knobs: PlaneStoreKnobs,
          config: PlaneStoreConfig) -> tuple[PlaneStore, jax.Array]:
    """Each session's new KV bytes (f32[R]; ``root_start`` Clock[R] its root's start) to the sampled planes:
    whole pages of the package placed (:func:`placed_pages`), then programmed on each plane within its
    room (the rest pending there). Returns (state, pages programmed on the sampled planes int32[])."""
    bk, bc = knobs.blocks, config.plane
    pending = state.pending_bytes + session_bytes
    new = jnp.floor(pending / knobs.page_bytes).astype(jnp.int32)
    placed = placed_pages(words, new, state.position, state.calls, knobs, config, state.pilot)
    session = jnp.arange(config.sessions, dtype=jnp.int32)
    planes, wrote = jax.vmap(lambda st, pages: kv_blocks.write(st, session, pages, root_start, bk, bc))(
        state.planes, placed.astype(jnp.float32))
    return state._replace(planes=planes, pending_bytes=pending - new.astype(jnp.float32) * knobs.page_bytes,
                          pages_written=state.pages_written + new, position=state.position + new,
                          calls=state.calls + 1,
                          placed=state.placed + placed.sum()), wrote.sum()


def invalidate(state: PlaneStore, evicted: jax.Array, config: PlaneStoreConfig) -> PlaneStore:
    """The ``evicted`` sessions' (bool[R]) pages die on every plane, waiting ones included."""
    planes = jax.vmap(lambda st: kv_blocks.invalidate(st, evicted, config.plane))(state.planes)
    return state._replace(planes=planes, pending_bytes=jnp.where(evicted, 0.0, state.pending_bytes),
                          position=jnp.where(evicted, 0, state.position))


def stored_bytes(state: PlaneStore, knobs: PlaneStoreKnobs) -> jax.Array:
    """f32[R] each session's KV bytes in the store now: its whole pages placed and the fraction pending."""
    return state.position.astype(jnp.float32) * knobs.page_bytes + state.pending_bytes


def kept_pages(words: tuple, state: PlaneStore, keep: jax.Array, knobs: PlaneStoreKnobs,
               config: PlaneStoreConfig) -> jax.Array:
    """int32[P, R] the pages each sampled plane keeps of each session when it keeps its first ``keep`` pages
    of the package (int32[R]; module docstring): a stripe's pages k < keep with k ≡ its position (mod G),
    none where the plane is not in the session's group; random pages a share ``keep / position`` of the
    plane's pages of the session (written and waiting), rounded up with a probability of its fraction."""
    mine, position = stripes(words, knobs, config, state.pilot)
    striped = jnp.where(mine, stripe_pages(jnp.int32(0), keep[None, :], position, group_size(knobs)), 0)
    on_plane = state.planes.session_pages + jnp.floor(state.planes.pending_bytes).astype(jnp.int32)  # [P, R]
    share = jnp.where(state.position > 0, keep / jnp.maximum(state.position, 1).astype(jnp.float32), 0.0)
    p, r = config.planes, config.sessions
    u = rng.uniform01(rng.mix(*words, state.calls, jnp.arange(p, dtype=jnp.int32)[:, None],
                              jnp.arange(r, dtype=jnp.int32)[None, :], Salt.STORE_CUT_ROUND))
    random = jnp.minimum(jnp.floor(on_plane * share[None, :] + u).astype(jnp.int32), on_plane)
    return jnp.where(knobs.grouped > 0.5, striped, random)


def cut(words: tuple, state: PlaneStore, keep_bytes: jax.Array, knobs: PlaneStoreKnobs,
        config: PlaneStoreConfig) -> PlaneStore:
    """Each session keeps its first ``keep_bytes`` (f32[R]; +inf or at least its stored bytes: untouched) of
    KV: its pages past them die on every plane (:func:`kept_pages`, ``kv_blocks.cut``), the page the cut
    falls in included (its kept bytes wait pending, to be written again), and its next page is the one
    the cut falls in (module docstring; a later turn diverging from its session's retained KV)."""
    cutting = keep_bytes < stored_bytes(state, knobs)
    keep = jnp.floor(jnp.where(cutting, keep_bytes, 0.0) / knobs.page_bytes).astype(jnp.int32)
    per_plane = jnp.where(cutting[None, :], kept_pages(words, state, keep, knobs, config), -1)
    planes = jax.vmap(lambda st, k: kv_blocks.cut(st, k, knobs.blocks, config.plane))(state.planes, per_plane)
    return state._replace(planes=planes, position=jnp.where(cutting, keep, state.position),
                          pending_bytes=jnp.where(cutting, keep_bytes - keep.astype(jnp.float32) * knobs.page_bytes,
                                                  state.pending_bytes))


def add_reads(state: PlaneStore, reads_per_page: jax.Array, threshold_reads, config: PlaneStoreConfig) -> PlaneStore:
    """Every live page of session s is read ``reads_per_page[s]`` times (f32[R]): each counted block's
    read-disturb counter takes the reads of its live pages (``flash.disturb.counters``; stale pages are not
    read). The counted blocks are those of the first ``read_counter_planes`` planes (one sweep over their
    owner tags). A store made without ``count_reads`` is returned as it is."""
    if state.reads is None:
        return state

    def per_plane(plane):
        owner = plane.blocks.owner
        live = kv_blocks.live_pages(plane, config.plane)
        reads = reads_per_page[kv_blocks.tag_sessions(owner, config.plane)]
        return jnp.where(live, reads, 0.0).sum(axis=1), live.sum(axis=1)

    counted = jax.tree.map(lambda x: x[:config.read_counter_planes], state.planes)
    block_reads, live = jax.vmap(per_plane)(counted)
    return state._replace(reads=counters.add_reads(state.reads, block_reads, live, threshold_reads))


def gc_due(state: PlaneStore, knobs: PlaneStoreKnobs, config: PlaneStoreConfig) -> jax.Array:
    """bool[]: a sampled plane's used pages exceed the GC trigger (the very test ``kv_blocks.collect``
    makes, ``gc.gc_target_pages``, so a plane it would collect is never skipped)."""
    kb, bc = knobs.blocks, config.plane.blocks
    target = jax.vmap(lambda st: gc.gc_target_pages(st.blocks, kb.gc_trigger, kb.gc_target, bc))(state.planes)
    return (target > 0).any()


def collect(words: tuple, state: PlaneStore, knobs: PlaneStoreKnobs, config: PlaneStoreConfig) -> tuple[PlaneStore, jax.Array]:
    """GC on every sampled plane once one is over the trigger (kv_blocks.collect with the plane's index as a
    word); returns (state, pages migrated on the sampled planes int32[]).

    Below the trigger nothing is settled (the lazy invalidations wait; ``session_pages`` is exact anyway)
    unless a session's lazy cuts would overrun their history (:func:`settle_due`): ``batch.when_due``, so a
    batch of streams none of which is due skips the O(pages) settle (GC below the trigger takes no victim).
    """
    index = jnp.arange(config.planes, dtype=jnp.int32)

    def reclaim(c):
        st, _ = c
        planes, moved = jax.vmap(lambda p, j: kv_blocks.collect((*words, j), p, knobs.blocks, config.plane))(
            st.planes, index)
        return st._replace(planes=planes), moved.sum()

    before = state.planes.blocks.erases
    due = lambda c: gc_due(c[0], knobs, config) | settle_due(c[0], config)  # noqa: E731
    state, moved = batch.when_due(due, reclaim, (state, jnp.int32(0)))
    if state.reads is not None:  # an erased block's read counter starts again
        erased = state.planes.blocks.erases > before
        state = state._replace(reads=counters.erase(state.reads, erased[:config.read_counter_planes]))
    return state, moved


def counted_share(config: PlaneStoreConfig) -> float:
    """P / C: sampled planes per plane that counts reads, the factor from the counters' totals to the
    sampled planes' (:func:`add_reads`)."""
    return config.planes / config.read_counter_planes


def settle_due(state: PlaneStore, config: PlaneStoreConfig) -> jax.Array:
    """bool[]: a sampled plane's lazy cuts must be settled before the next chunk's (``kv_blocks.settle_due``)."""
    return jax.vmap(lambda st: kv_blocks.settle_due(st, config.plane))(state.planes).any()


def package_scale(state: PlaneStore, knobs: PlaneStoreKnobs, config: PlaneStoreConfig) -> jax.Array:
    """f32[]: package pages one page of the sampled planes stands for — the pages the package was sent
    over those the sampled planes were (N / P before any)."""
    return jnp.where(state.placed > 0, sent_over_placed(state, jnp), knobs.package_planes / config.planes)


def sent_over_placed(state: PlaneStore, xp=np):
    """Pages the package was sent over those the sampled planes were (0 before any; ``xp``: jnp in a trace,
    numpy on the host for a batched output)."""
    dtype = np.float64 if xp is np else jnp.float32
    placed = xp.asarray(state.placed, dtype)
    return xp.where(placed > 0, xp.asarray(state.pages_written, dtype).sum(axis=-1) / xp.maximum(placed, 1.0), 0.0)


def host_pages(state: PlaneStore) -> jax.Array:
    return state.planes.host_pages.sum(axis=-1)  # int32[] host page programs on the sampled planes


def gc_pages(state: PlaneStore) -> jax.Array:
    return state.planes.gc_pages.sum(axis=-1)  # int32[] GC migrations on the sampled planes


def erases(state: PlaneStore) -> jax.Array:
    return state.planes.blocks.erases.sum(axis=(-2, -1))  # int32[] block erases on the sampled planes


def overflow(state: PlaneStore) -> jax.Array:
    return state.planes.overflow.any(axis=-1)  # bool[] a plane's free pool ran dry (results invalid)


def stalled_writes(state: PlaneStore) -> jax.Array:
    return state.planes.stalled_writes.sum(axis=-1)  # int32[] plane-calls whose pages waited for GC


def capped_writes(state: PlaneStore) -> jax.Array:
    return state.planes.capped_writes.sum(axis=-1)  # int32[] plane-calls over max_writes (pages waited)


def waf(state: PlaneStore) -> jax.Array:
    """f32[] (host + GC page programs) / host page programs over the sampled planes (1 before any write)."""
    host = host_pages(state).astype(jnp.float32)
    return (host + gc_pages(state).astype(jnp.float32)) / jnp.maximum(host, 1.0)
