"""Blocks and garbage collection of one HBF stream: allocation by class, victim selection, reclaim.

The machinery behind write amplification (DESIGN.md §4 "Blocks and GC", HBFlex §3.3 and §5.4,
DASH §V-A2). Every physical page carries an *owner tag* (≥ 0: valid, −1: stale or unwritten); a
workload decides what a tag means (a logical page, a request instance) and when it dies. Pages are
appended to the open block of their *allocation class* (one class = interleaved; one per request
slot = request-isolated; one per lifetime label = lifetime-labelled packing; a protected class =
DASH weight-owned blocks that are never GC victims). New blocks come from a ring of erased blocks.

Vectorised for vmap (DESIGN.md §3): ``append`` places a whole batch of pages with one cumulative
sum per class, and ``reclaim`` picks up to ``victims_per_gc`` victims in one search of the block
array (``formulation.smallest``) and migrates their valid pages as one batch — so the O(blocks)
victim search is paid once per chunk of host writes, not once per write; streams that need no GC
mask it away.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.validate import ConfigError, require
from hbfjax.flash.erase import formulation
from hbfjax.flash.erase.formulation import INT_MAX, after_read, smallest

VICTIMS = ("greedy", "fifo", "random")
FREE, OPEN, CLOSED = 0, 1, 2  # block status


GcConfigError = ConfigError  # the project's one configuration error (hbfjax.validate)


@dataclass(frozen=True)
class BlockConfig:
    """Static geometry and GC policy of one stream's block array (sets shapes: static under jit)."""

    n_blocks: int
    pages_per_block: int
    victim: str = "greedy"  # greedy (fewest valid) | fifo (oldest opened) | random
    n_classes: int = 1  # allocation classes, each with its own open block
    victims_per_gc: int = 8  # victims examined per reclaim call (the amortised batch)
    protected_class: int = -1  # blocks of this class are never victims (DASH weight blocks); -1: none
    formulation: str = "auto"  # array primitives: "cpu" | "gpu" forms (bit-identical), "auto" = backend

    def __post_init__(self) -> None:
        c = type(self).__name__
        require(self.n_blocks >= 4, c, "n_blocks", self.n_blocks, "need at least 4 blocks")
        require(self.pages_per_block >= 1, c, "pages_per_block", self.pages_per_block, "must be >= 1")
        require(self.n_blocks * self.pages_per_block < 2**30, c, "n_blocks", self.n_blocks,
                "n_blocks × pages_per_block must stay below 2^30 (int32 page indices)")
        require(self.victim in VICTIMS, c, "victim", self.victim, f"must be one of {VICTIMS}")
        require(self.n_classes >= 1, c, "n_classes", self.n_classes, "must be >= 1")
        require(1 <= self.victims_per_gc <= self.n_blocks, c, "victims_per_gc", self.victims_per_gc,
                f"must be in [1, n_blocks = {self.n_blocks}]")
        require(-1 <= self.protected_class < self.n_classes, c, "protected_class", self.protected_class,
                f"must be -1 or a class index < n_classes = {self.n_classes}")
        require(self.formulation in formulation.NAMES, c, "formulation", self.formulation,
                f"must be one of {formulation.NAMES}")

    @property
    def cpu_formulation(self) -> bool:
        """Trace the CPU forms of the GC primitives (static: part of jit's cache key)."""
        return formulation.cpu_form(self.formulation)

    @property
    def physical_pages(self) -> int:
        return self.n_blocks * self.pages_per_block


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class BlockState:
    """Per-stream block array. B = n_blocks, K = pages_per_block, C = n_classes."""

    owner: jax.Array  # int32[B, K] owner tag of each physical page; -1 = stale or unwritten
    valid: jax.Array  # int32[B] valid pages per block
    status: jax.Array  # int32[B] FREE / OPEN / CLOSED
    block_class: jax.Array  # int32[B] class the block was opened for; -1 when free
    opened_at: jax.Array  # int32[B] sequence number of the block's opening (FIFO age)
    erases: jax.Array  # int32[B] erase count
    ring: jax.Array  # int32[B] circular list of free blocks, valid between head and tail
    head: jax.Array  # int32[] ring position of the next free block to open
    tail: jax.Array  # int32[] ring position where the next erased block goes
    open_block: jax.Array  # int32[C] open block of each class, -1 none
    open_ptr: jax.Array  # int32[C] pages written in the open block, in [1, K]; K = full or none
    n_opened: jax.Array  # int32[] blocks opened so far
    host_pages: jax.Array  # int32[] host page programs (counted by the workload)
    migrated_pages: jax.Array  # int32[] page programs made by GC migration
    gc_invocations: jax.Array  # int32[] reclaim calls that erased at least one block
    gc_calls: jax.Array  # int32[] reclaim calls (salt of the random victim draw)
    overflow: jax.Array  # bool[] sticky: the free pool ran dry (results after it are not valid)
    payload: jax.Array | None = None  # int32[B, K] a word each page carries (a logical page number, say),
    #   written with its tag and moved with it by GC; meaningful where the tag is >= 0; None: no payload


def init_state(config: BlockConfig, payload: bool = False) -> BlockState:
    """An erased device: every block free, in index order on the ring; ``payload``: each page carries a word
    (:attr:`BlockState.payload`, 0 until written)."""
    b, k, c = config.n_blocks, config.pages_per_block, config.n_classes
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return BlockState(
        owner=jnp.full((b, k), -1, jnp.int32), valid=jnp.zeros(b, jnp.int32),
        status=jnp.full(b, FREE, jnp.int32), block_class=jnp.full(b, -1, jnp.int32),
        opened_at=jnp.zeros(b, jnp.int32), erases=jnp.zeros(b, jnp.int32),
        ring=jnp.arange(b, dtype=jnp.int32), head=i32(0), tail=i32(b),
        open_block=jnp.full(c, -1, jnp.int32), open_ptr=jnp.full(c, k, jnp.int32), n_opened=i32(0),
        host_pages=i32(0), migrated_pages=i32(0), gc_invocations=i32(0), gc_calls=i32(0),
        overflow=jnp.asarray(False), payload=jnp.zeros((b, k), jnp.int32) if payload else None)


def free_blocks(state: BlockState) -> jax.Array:
    """int32[] erased blocks in the pool (not counting the open blocks' unwritten pages)."""
    return state.tail - state.head


def open_room(state: BlockState, config: BlockConfig) -> jax.Array:
    """int32[C] pages still writable in each class's open block (0 for a class with none)."""
    return jnp.where(state.open_block >= 0, config.pages_per_block - state.open_ptr, 0)


def free_pages(state: BlockState, config: BlockConfig) -> jax.Array:
    """int32[] writable pages: the free pool plus what is left in every open block."""
    return free_blocks(state) * config.pages_per_block + open_room(state, config).sum()


def written_pages(state: BlockState, config: BlockConfig) -> jax.Array:
    """int32[B] pages programmed (or abandoned) in each block since its erase: K closed, ptr open, 0 free."""
    k = config.pages_per_block
    idx = jnp.where(state.open_block >= 0, state.open_block, config.n_blocks)  # −1 would wrap to the last block
    ptr_of_block = jnp.zeros_like(state.valid).at[idx].set(state.open_ptr, mode="drop")
    return jnp.where(state.status == CLOSED, k, jnp.where(state.status == OPEN, ptr_of_block, 0))


def page_counts(state: BlockState, config: BlockConfig) -> dict:
    """Conservation terms (int32[]): valid + stale + free = physical pages (stale includes abandoned)."""
    valid = state.valid.sum()
    stale = written_pages(state, config).sum() - valid
    return {"valid": valid, "stale": stale, "free": free_pages(state, config),
            "physical": jnp.int32(config.physical_pages)}


def _within_class_index(cls: jax.Array, write: jax.Array, n_classes: int):
    """(index of each written page within its class, pages per class) — order of appearance."""
    if n_classes == 1:  # one running count: no one-hot, no gather
        csum = jnp.cumsum(write.astype(jnp.int32))
        return csum - 1, csum[-1:]
    onehot = ((cls[:, None] == jnp.arange(n_classes)[None, :]) & write[:, None]).astype(jnp.int32)
    csum = jnp.cumsum(onehot, axis=0)
    idx = jnp.take_along_axis(csum, jnp.clip(cls, 0, n_classes - 1)[:, None], axis=1)[:, 0] - 1
    return idx, csum[-1]


def append(state: BlockState, owner: jax.Array, cls: jax.Array, write: jax.Array,
           config: BlockConfig, payload: jax.Array | None = None) -> tuple[BlockState, jax.Array, jax.Array]:
    """Program a batch of pages, in order, into the open block of each page's class.

    ``owner`` int32[n] (tag written; −1 programs a page that is stale at once), ``cls`` int32[n],
    ``write`` bool[n] (False: no program); ``payload`` int32[n] the pages' words (a state with a payload
    needs them). A class whose open block fills opens the next free block
    from the ring (HBFlex §5.4: a partially filled block of the same label first, else a new block).
    Returns (state, dest_block int32[n], dest_page int32[n]); unwritten entries get block B (a
    dropped index). Sets ``overflow`` if the pool had too few free blocks.
    """
    b, k, c = config.n_blocks, config.pages_per_block, config.n_classes
    n = owner.shape[0]
    idx, per_class = _within_class_index(cls, write, c)
    total = state.open_ptr + per_class  # [C]
    new_blocks = jnp.maximum((total - 1) // k, 0)  # ptr ∈ [1, K] so `total ≤ K` needs none
    base = jnp.cumsum(new_blocks) - new_blocks
    n_new = new_blocks.sum()

    cls_c = jnp.clip(cls, 0, c - 1)
    pos = state.open_ptr[cls_c] + idx
    q, off = pos // k, pos % k
    ring_pos = (state.head + base[cls_c] + q - 1) % b
    blk = jnp.where(q == 0, state.open_block[cls_c], state.ring[ring_pos])
    blk = jnp.where(write, blk, b)  # out of range: dropped by the scatters below

    # Flat page index blk·K + off: a 1-D scatter (no [n, 2] index array); blk = B lands past the end.
    owner_arr = state.owner.reshape(-1).at[blk * k + off].set(jnp.where(write, owner, -1), mode="drop").reshape(b, k)
    if state.payload is not None:
        state = dataclasses.replace(state, payload=state.payload.reshape(-1).at[blk * k + off].set(
            payload, mode="drop").reshape(b, k))
    valid = state.valid.at[blk].add((write & (owner >= 0)).astype(jnp.int32), mode="drop")

    # Blocks opened in this call: slot t is ring position head + t, class = first c with cum > t.
    max_new = n // k + c + 1
    t = jnp.arange(max_new, dtype=jnp.int32)
    cum = jnp.cumsum(new_blocks)
    t_cls = jnp.searchsorted(cum, t, side="right", method="compare_all").astype(jnp.int32)
    t_live = t < n_new
    t_blk = jnp.where(t_live, state.ring[(state.head + t) % b], b)
    t_last = t == (jnp.take(cum, jnp.clip(t_cls, 0, c - 1)) - 1)
    status = state.status.at[jnp.where((new_blocks > 0) & (state.open_block >= 0), state.open_block, b)].set(
        CLOSED, mode="drop")
    status = status.at[t_blk].set(jnp.where(t_last, OPEN, CLOSED), mode="drop")
    block_class = state.block_class.at[t_blk].set(t_cls, mode="drop")
    opened_at = state.opened_at.at[t_blk].set(state.n_opened + t, mode="drop")

    last_ring = state.ring[(state.head + base + new_blocks - 1) % b]
    open_block = jnp.where(new_blocks > 0, last_ring, state.open_block)
    open_ptr = total - new_blocks * k
    overflow = state.overflow | (n_new > free_blocks(state))
    state = dataclasses.replace(
        state, owner=owner_arr, valid=valid, status=status, block_class=block_class, opened_at=opened_at,
        head=state.head + n_new, open_block=open_block, open_ptr=open_ptr, n_opened=state.n_opened + n_new,
        overflow=overflow)
    return state, blk, off


def closest_class_fallback(cls: jax.Array, write: jax.Array, state: BlockState, host_blocks: jax.Array,
                           config: BlockConfig) -> tuple[jax.Array, jax.Array]:
    """HBFlex §5.4 allocation order when free blocks run short: own label's partial block, else a new
    block for the label, else a block of the closest label.

    ``cls`` int32[n] wanted class of each page (its lifetime label), ``write`` bool[n], ``host_blocks``
    int32[] free blocks the host may open now. Each class first fills the room left in its open block
    (pages in order of appearance); classes that need new blocks get them in class order while
    ``host_blocks`` lasts; a class that gets none sends its excess to the class nearest in circular
    label distance (ties: lower index) whose room, after its own pages and earlier redirections,
    holds the whole excess. An excess with no such class is not written (``write`` cleared): the
    host waits for GC. The returned classes never need more than ``host_blocks`` new blocks.
    Returns (cls int32[n], write bool[n]).
    """
    c, k = config.n_classes, config.pages_per_block
    idx, demand = _within_class_index(cls, write, c)
    room = open_room(state, config)  # [C]
    excess = jnp.maximum(demand - room, 0)
    blocks = (excess + k - 1) // k
    ci = jnp.arange(c, dtype=jnp.int32)
    gap = jnp.abs(ci[:, None] - ci[None, :])
    rank = jnp.minimum(gap, c - gap) * c + ci[None, :]  # [from, to] circular distance, then index

    def grant_or_redirect(carry, i):
        left, spare = carry  # blocks the host may still open; room left per class after assignments
        grant = (blocks[i] > 0) & (blocks[i] <= left)
        left = left - jnp.where(grant, blocks[i], 0)
        spare = spare.at[i].add(jnp.where(grant, blocks[i] * k, 0))
        short = (blocks[i] > 0) & ~grant
        fits = (spare >= excess[i]) & (ci != i) & (ci != config.protected_class)
        key = jnp.where(fits, rank[i], c * c)
        to = jnp.argmin(key).astype(jnp.int32)
        moved = short & (key[to] < c * c)
        spare = spare.at[to].add(jnp.where(moved, -excess[i], 0))
        return (left, spare), (moved, short & ~moved, to)

    _, (moved, stuck, to) = jax.lax.scan(grant_or_redirect, (host_blocks, room - demand), ci)
    own = jnp.clip(cls, 0, c - 1)
    over = idx >= room[own]  # past the room of its own class's open block
    return (jnp.where(write & over & moved[own], to[own], cls), write & ~(over & stuck[own]))


def close_classes(state: BlockState, mask: jax.Array, config: BlockConfig) -> BlockState:
    """Close the open block of every class in ``mask`` (bool[C]); its unwritten pages are abandoned.

    Request-isolated allocation closes a request's block when the request ends, so the next request
    of that slot starts a fresh block (the abandoned pages count as stale until the block is erased).
    """
    b, k = config.n_blocks, config.pages_per_block
    shut = mask & (state.open_block >= 0)
    status = state.status.at[jnp.where(shut, state.open_block, b)].set(CLOSED, mode="drop")
    return dataclasses.replace(state, status=status, open_block=jnp.where(shut, -1, state.open_block),
                               open_ptr=jnp.where(shut, k, state.open_ptr))


def victim_score(words: tuple, state: BlockState, config: BlockConfig) -> jax.Array:
    """int32[B] victim score, lower = reclaimed first; INT_MAX for blocks that cannot be victims.

    Candidates are closed blocks outside the protected class (DASH §V-A2: weight-owned blocks are
    never examined). Greedy: valid pages; FIFO: opening order; random: a hash per (call, block).
    """
    if config.victim == "greedy":
        score = state.valid
    elif config.victim == "fifo":
        score = state.opened_at
    else:
        h = rng.mix(*words, state.gc_calls, jnp.arange(config.n_blocks), Salt.GC_RANDOM_VICTIM)
        score = (h >> 1).astype(jnp.int32)
    candidate = (state.status == CLOSED) & (state.block_class != config.protected_class)
    return jnp.where(candidate, jnp.minimum(score, INT_MAX - 1), INT_MAX)


def reclaim(words: tuple, state: BlockState, target_free_pages: jax.Array, config: BlockConfig):
    """One amortised GC round: erase victims until the pool holds ``target_free_pages`` (or g victims).

    Picks the g = ``victims_per_gc`` best candidates (``smallest``), keeps the prefix whose
    reclaimed pages are still needed, programs their valid pages into the open block of the class
    each victim block had (GC-moved pages keep their lifetime label, HBFlex §5.4) and erases the
    victims onto the tail of the free ring. A target at or below the pool's size reclaims nothing.
    Returns (state, moved) where ``moved`` = (owner int32[g·K], dest_block, dest_page, mask bool[g·K]).

    With one allocation class a victim is erased as soon as its pages are read, as a sequential
    FTL does, so later victims' pages may land in earlier victims' blocks: victim j's pages need at
    most j + 1 new blocks and j blocks come back before it, so one free block lets all g run in one
    round. With several classes each class's pages are appended in class order, not victim order,
    so the round migrates into today's free pages first and erases after.

    Batching approximation: the g victims are chosen together, so blocks that the round's own
    migrations close become candidates only from the next round. Greedy and FIFO never pick such
    fresh full blocks anyway; a random victim would, so a large g lowers random-victim WAF below a
    sequential FTL's. Measured (256 × 32-page blocks, s = 0.1, 16 streams; model α/(α − 1) at the
    measured α): g = 16 in one round 11.38 ± 0.08 vs 11.68; g = 4 in up to 4 rounds 11.41 vs 11.53;
    g = 1 in up to 16 rounds 11.44 vs 11.48. Small g with more rounds tracks the sequential policy.
    """
    k = config.pages_per_block
    score = victim_score(words, state, config)
    victims, best = smallest(score, config.victims_per_gc,
                             config.pages_per_block if config.victim == "greedy" else None,
                             cpu=config.cpu_formulation)
    cand = best < INT_MAX
    # Full blocks stay candidates (a random or FIFO victim may be full: that is the policy modelled).
    v = jnp.where(cand, state.valid[victims], 0)
    gain = jnp.where(cand, k - v, 0)
    before = free_blocks(state) * k + jnp.cumsum(gain) - gain
    # Which victims are taken must not look at v_j itself, so it cannot bias the choice (a random
    # victim stays uniform): the rules below assume every victim is full.
    c = config.n_classes
    if c == 1:
        fits = free_blocks(state) >= 1
    else:  # victim j is taken if the earlier ones plus a full block fit, each class rounding up a block
        j = jnp.arange(config.victims_per_gc, dtype=jnp.int32)
        earlier = jnp.cumsum(v) - v
        fits = earlier + k + k * jnp.minimum(j + 1, c) <= free_blocks(state) * k
    take = cand & (before < target_free_pages) & fits

    pages = state.owner[victims]  # [g, K]
    move = take[:, None] & (pages >= 0)
    cls = jnp.broadcast_to(state.block_class[victims][:, None], pages.shape)
    owners, move_flat = pages.reshape(-1), move.reshape(-1)
    words = None if state.payload is None else state.payload[victims].reshape(-1)  # moved with their pages
    if c == 1:
        state = _erase(state, victims, take, pages, config)
        state, dest_blk, dest_page = append(state, owners, cls.reshape(-1), move_flat, config, words)
    else:
        state, dest_blk, dest_page = append(state, owners, cls.reshape(-1), move_flat, config, words)
        state = _erase(state, victims, take, pages, config)
    state = dataclasses.replace(state, migrated_pages=state.migrated_pages + move_flat.sum().astype(jnp.int32),
                                gc_calls=state.gc_calls + 1)
    return state, (owners, dest_blk, dest_page, move_flat)


def _erase(state: BlockState, victims: jax.Array, take: jax.Array, pages: jax.Array, config: BlockConfig) -> BlockState:
    """Erase the taken ``victims`` (int32[g], ``take`` bool[g] a prefix) onto the tail of the free ring.

    ``pages`` int32[g, K] are the victims' rows as read before (``after_read`` keeps the erase in place).
    """
    b = config.n_blocks
    vb = jnp.where(take, victims, b)
    rank = jnp.cumsum(take) - 1
    n_take = take.sum().astype(jnp.int32)
    return dataclasses.replace(
        state,
        owner=state.owner.at[vb].set(after_read(jnp.full_like(pages, -1), pages), mode="drop"),
        valid=state.valid.at[vb].set(0, mode="drop"),
        status=state.status.at[vb].set(FREE, mode="drop"),
        block_class=state.block_class.at[vb].set(-1, mode="drop"),
        erases=state.erases.at[vb].add(1, mode="drop"),
        ring=state.ring.at[jnp.where(take, (state.tail + rank) % b, b)].set(victims, mode="drop"),
        tail=state.tail + n_take,
        gc_invocations=state.gc_invocations + (n_take > 0).astype(jnp.int32),
    )


def gc_target_pages(state: BlockState, trigger_used: jax.Array, target_used: jax.Array,
                    config: BlockConfig) -> jax.Array:
    """Free-pool pages GC must restore now: (1 − target_used)·physical once used > trigger_used, else 0.

    ``used`` = physical − free pool (HBFlex §5.4: GC at 95 % used; the gap to the eviction threshold
    is the deferred reclamation). Fractions are traced knobs, so sweeping them never recompiles.
    """
    phys = jnp.float32(config.physical_pages)
    pool = (free_blocks(state) * config.pages_per_block).astype(jnp.float32)
    triggered = (phys - pool) > trigger_used * phys
    return jnp.where(triggered, jnp.ceil((1.0 - target_used) * phys), 0.0).astype(jnp.int32)


def collect(words: tuple, state: BlockState, rounds: int, target_free_pages, config: BlockConfig,
            on_move=None, carry=None):
    """``rounds`` reclaim rounds (a scan: compiled once); ``on_move(carry, moved) -> carry`` sees each batch."""
    def body(c, _):
        st, cr = c
        st, moved = reclaim(words, st, target_free_pages, config)
        return (st, cr if on_move is None else on_move(cr, moved)), None

    (state, carry), _ = jax.lax.scan(body, (state, carry), None, length=rounds)
    return state, carry


def block_counters(st: BlockState) -> dict:
    """Cumulative counters every workload reports (int32 scalars)."""
    return {"host_writes": st.host_pages, "migrated_pages": st.migrated_pages, "gc_invocations": st.gc_invocations,
            "erases": st.erases.sum()}


def warm_then_measure(state, step, counters, erases, warm_steps: int, measure_steps: int):
    """One ``lax.scan`` of ``warm_steps + measure_steps`` calls ``step(state, measuring) -> state``.

    ``measuring`` is a traced bool (False during the warm-up), so the step is traced once.
    ``counters(state) -> dict`` of cumulative int32 counters and ``erases(state) -> int32[B]`` say
    what to snapshot at the end of the warm-up. Returns (final state, counters at the end of the
    warm-up, measured deltas of ``counters``, erase summary of the measured part).
    """
    def body(carry, i):
        st, before, erases0 = carry
        boundary = i == warm_steps  # snapshot the warm-up's end before the first measured step
        before = jax.tree_util.tree_map(lambda b, now: jnp.where(boundary, now, b), before, counters(st))
        erases0 = jnp.where(boundary, erases(st), erases0)
        return (step(st, i >= warm_steps), before, erases0), None

    steps = jnp.arange(warm_steps + measure_steps, dtype=jnp.int32)
    (state, before, erases0), _ = jax.lax.scan(body, (state, counters(state), erases(state)), steps)
    after = counters(state)
    return state, before, {k: after[k] - before[k] for k in after}, erase_summary(erases(state) - erases0)


def erase_summary(e: jax.Array) -> dict:
    """Erases per block int32[B] -> mean, max, spread (max − min)."""
    return {"erases_per_block_mean": e.mean(), "erases_per_block_max": e.max(),
            "erases_per_block_spread": e.max() - e.min()}
