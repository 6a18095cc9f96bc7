"""KV-lifetime workload: requests write KV pages across layers, then die together (HBFlex §3.3, §5.4).

Time advances in ticks (one serving iteration). ``slots`` requests are live at most; each live
request programs up to ``pages_per_tick`` pages per tick (its KV for every layer) until it has
written all its pages, keeps them until its end tick, and then every one of its pages goes stale
at once. Requests come from a lifetime distribution (closed loop: an ended request is replaced at
once) or from a trace (open loop: admitted at their arrival tick). An eviction policy given in the
config (HBFlex: the oldest requests, ``hbfjax.workload.eviction``) ends requests when valid data exceed
``evict_used`` of the device; GC triggers at ``gc_trigger_used``
(deferred reclamation = the gap between the two, HBFlex §5.4).

Allocation classes (see ``hbfjax.flash.erase.gc``): interleaved (one class, requests share blocks in
arrival order), isolated (one class per slot; a request's last block is closed when it ends),
lifetime (one class per label; label = root request's start tick // label interval, inherited by
descendants and by GC-moved pages; when a label's block is full and no free block may be opened,
its pages go to the block of the closest label, ``gc.closest_class_fallback``), plane-group (HBFlex
§5.2: the ``planes`` split into groups of G = ``KvKnobs.group_size``, a traced knob; a plane group is
also an allocation unit, so the requests of one group share its open blocks; slot s belongs to group
s mod (planes / G), and the class is the group, so the static class bound is ``slots``; with one
group every page is in class 0 as with interleaved, but the tick reserve still holds a block per
class bound, so WAF equals a one-label lifetime run's, not interleaved's, bit for bit). DASH weight/KV
separation (§V-A2) puts weight pages in a protected class that GC never examines. A page's owner
tag is gen·(slots+1) + slot, so a slot reused by a new request never revives its predecessor's pages.

Reads (plane-group only, HBFlex §3.1, §5.2): at every measured tick the live requests' KV is read
once (a decode step's attention). A request's n held pages are striped over the G planes of its
group from a random offset (``collide.striped_plane``: plane ``(offset + i) mod G``, wrapping), so a
plane of the group gets ⌊n/G⌋ pages plus one for n mod G of them; the read takes ``max plane load``
waves against the ideal ⌈pages / planes⌉. Modelling choices the paper does not state: the stripe
follows the logical page order (GC moves pages between blocks, not between planes), the group is
fixed by the slot (every group holds slots·G/planes requests when planes/G ≤ slots; with more groups
than slots, planes/G − slots groups stay idle), and the offset is a hash of (stream, slot, slot
generation), never of G, so every G sees the same draws. ``soft_read_max`` replaces the max by
the soft max ``t · logsumexp(loads / t)`` at t = ``KvKnobs.read_temperature_pages`` (tuning only,
as ``hbfjax.relax.soft_max``, which this layer does not import).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.salts import Salt
from hbfjax.flash.erase import gc
from hbfjax.flash.erase.gc import BlockConfig, BlockState, require
from hbfjax.flash.reads.collide import MAX_PLANES, group_count, ideal_waves, max_load
from hbfjax.validate import INT32_MAX, require_int, require_real

ALLOCATIONS = ("interleaved", "isolated", "lifetime", "plane-group")
GC_HEADROOM_BLOCKS = 2  # free blocks a GC round with several classes needs to take a victim (gc.reclaim)
LIFETIMES = ("exponential", "deterministic", "lognormal", "trace")


@dataclass(frozen=True)
class KvConfig:
    """Static shape of a KV-lifetime run."""

    n_blocks: int
    pages_per_block: int
    slots: int = 32  # live requests at most
    pages_per_tick: int = 4  # pages a live request programs per tick (its layers' KV)
    allocation: str = "interleaved"
    lifetime: str = "exponential"
    n_labels: int = 8  # lifetime labels (allocation = lifetime), used modulo this
    weight_pages: int = 0  # model weight pages written once at start (never invalidated)
    separate_weights: bool = True  # DASH: weights in their own, never-victim blocks
    label_fallback: bool = True  # lifetime: a label with no room and no free block borrows the closest label's block
    victim: str = "greedy"
    victims_per_gc: int = 8
    gc_rounds: int = 2
    warmup_ticks: int = 200
    measure_ticks: int = 400
    formulation: str = "auto"  # GC array primitives (BlockConfig.formulation)
    planes: int = 256  # plane-group: planes split into groups of KvKnobs.group_size (traced)
    soft_read_max: bool = False  # plane-group: waves by a soft max of plane loads (tuning relaxation)
    # which live requests end when valid pages exceed evict_used (a serving policy, e.g.
    # hbfjax.workload.eviction.oldest_first); None: never evict (the host waits for requests to end)
    evict: Callable | None = None

    def __post_init__(self) -> None:
        c = type(self).__name__
        require(self.allocation in ALLOCATIONS, c, "allocation", self.allocation, f"must be one of {ALLOCATIONS}")
        require(self.lifetime in LIFETIMES, c, "lifetime", self.lifetime, f"must be one of {LIFETIMES}")
        for name in ("slots", "pages_per_tick", "n_labels", "gc_rounds", "measure_ticks"):
            require(getattr(self, name) >= 1, c, name, getattr(self, name), "must be >= 1")
        require(self.weight_pages >= 0, c, "weight_pages", self.weight_pages, "must be >= 0")
        require(self.warmup_ticks >= 0, c, "warmup_ticks", self.warmup_ticks, "must be >= 0")
        require_int(c, "planes", self.planes, 1, MAX_PLANES)
        self.blocks  # validates the block geometry
        per_tick = self.tick_pages + self.gc_rounds * self.victims_per_gc * self.pages_per_block
        ticks = self.warmup_ticks + self.measure_ticks
        require(ticks * per_tick + self.weight_pages <= INT32_MAX, c, "measure_ticks", self.measure_ticks,
                f"(warmup_ticks {self.warmup_ticks} + measure_ticks) × {per_tick} page programs per tick at most "
                f"(slots × pages_per_tick + gc_rounds × victims_per_gc × pages_per_block) must be <= {INT32_MAX}, "
                "so every int32 page counter and tick fits")
        require(self.weight_pages * (1 if self.separate_weights else 2) < self.valid_pages_max, c, "n_blocks", self.n_blocks,
                f"{self.n_blocks} × {self.pages_per_block} pages cannot hold {self.weight_pages} weight pages "
                f"plus the GC reserve of {self.reserve_blocks} blocks and a partial block per class")

    @property
    def kv_classes(self) -> int:
        return {"interleaved": 1, "isolated": self.slots, "lifetime": self.n_labels,
                "plane-group": self.slots}[self.allocation]

    @property
    def weight_class(self) -> int:
        return self.kv_classes if self.separate_weights else 0

    @property
    def blocks(self) -> BlockConfig:
        n_classes = self.kv_classes + (1 if self.separate_weights else 0)
        return BlockConfig(n_blocks=self.n_blocks, pages_per_block=self.pages_per_block, victim=self.victim,
                           n_classes=n_classes, victims_per_gc=self.victims_per_gc,
                           protected_class=self.kv_classes if self.separate_weights else -1,
                           formulation=self.formulation)

    @property
    def valid_pages_max(self) -> int:
        """Valid pages eviction allows at most: physical less the GC reserve and a partial block per class."""
        return self.blocks.physical_pages - (self.reserve_blocks + 2 + self.blocks.n_classes) * self.pages_per_block

    @property
    def tick_pages(self) -> int:
        return self.slots * self.pages_per_tick

    @property
    def reserve_blocks(self) -> int:
        """Free blocks a tick needs before it may run: its pages, a new block per class, one victim.

        With the closest-label fallback a label never needs a block of its own, so no per-class term.
        """
        per_class = 0 if self.uses_label_fallback else min(self.kv_classes, self.tick_pages)
        return math.ceil(self.tick_pages / self.pages_per_block) + per_class + GC_HEADROOM_BLOCKS

    @property
    def uses_label_fallback(self) -> bool:
        return self.allocation == "lifetime" and self.label_fallback


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KvKnobs:
    """Tunable values (traced: sweeping them never recompiles)."""

    mean_lifetime_ticks: jax.Array  # f32[] mean request lifetime (synthetic lifetimes)
    lifetime_sigma: jax.Array  # f32[] lognormal σ of ln(lifetime)
    label_ticks: jax.Array  # f32[] width of a lifetime-label interval, in ticks
    evict_used: jax.Array  # f32[] evict oldest requests while valid pages exceed this fraction
    gc_trigger_used: jax.Array  # f32[] GC when used pages exceed this fraction of physical
    gc_target_used: jax.Array  # f32[] GC reclaims until used ≤ this fraction
    group_size: jax.Array  # f32[] plane-group: planes per group G (a whole divisor of config.planes)
    read_temperature_pages: jax.Array  # f32[] soft_read_max: soft-max temperature, in pages (waves)

    @classmethod
    def make(cls, config: KvConfig, mean_lifetime_ticks: float = 50.0, lifetime_sigma: float = 0.5,
             label_ticks: float = 10.0, evict_used: float = 0.90, gc_trigger_used: float = 0.95,
             gc_target_used: float | None = None, group_size: int | None = None,
             read_temperature_pages: float = 1.0) -> "KvKnobs":
        """Knobs with HBFlex's thresholds by default (evict at 90 % used, GC at 95 %).

        GC trigger/target are capped so the free pool never drops below the tick reserve.
        ``group_size`` defaults to one group of every plane.
        """
        owner = cls.__name__
        require_real(owner, "mean_lifetime_ticks", mean_lifetime_ticks, 0.0, float(2**30), lo_open=True)
        require_real(owner, "lifetime_sigma", lifetime_sigma, 0.0, 10.0)
        require_real(owner, "label_ticks", label_ticks, 0.0, float(2**30), lo_open=True)
        require_real(owner, "evict_used", evict_used, 0.0, 1.0, lo_open=True)
        require_real(owner, "gc_trigger_used", gc_trigger_used, 0.0, 1.0, lo_open=True)
        if gc_target_used is not None:
            require_real(owner, "gc_target_used", gc_target_used, 0.0, 1.0)
        group_size = config.planes if group_size is None else group_size
        require_int(owner, "group_size", group_size, 1, config.planes)
        require(config.planes % group_size == 0, owner, "group_size", group_size,
                f"must divide the {config.planes} planes evenly")
        require_real(owner, "read_temperature_pages", read_temperature_pages, 0.0, lo_open=True)
        phys = config.blocks.physical_pages
        cap = 1.0 - (config.reserve_blocks + 1) * config.pages_per_block / phys
        trig = min(gc_trigger_used, cap)
        target = min(trig, cap - config.pages_per_block / phys) if gc_target_used is None else gc_target_used
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(mean_lifetime_ticks=f32(mean_lifetime_ticks), lifetime_sigma=f32(lifetime_sigma),
                   label_ticks=f32(label_ticks), evict_used=f32(evict_used), gc_trigger_used=f32(trig),
                   gc_target_used=f32(target), group_size=f32(group_size),
                   read_temperature_pages=f32(read_temperature_pages))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KvInputs:
    """Trace requests as tick arrays (``lifetime = "trace"``), sorted by arrival; length 1 if unused."""

    arrival_tick: jax.Array  # i32[R] arrival tick, sorted
    life_ticks: jax.Array  # i32[R] ticks from arrival until the KV is released
    pages: jax.Array  # i32[R] KV pages of the request
    root_tick: jax.Array  # i32[R] arrival tick of the session's root request

    @classmethod
    def make(cls, trace: dict | None = None) -> "KvInputs":
        """From ``hbfjax.workload.replay.kv_trace_requests`` arrays, or the placeholder of a synthetic run."""
        t = trace or {"arrival_tick": [0], "life_ticks": [1], "pages": [1], "root_tick": [0]}
        i32 = lambda v: jnp.asarray(np.asarray(v), jnp.int32)  # noqa: E731
        return cls(arrival_tick=i32(t["arrival_tick"]), life_ticks=i32(t["life_ticks"]), pages=i32(t["pages"]),
                   root_tick=i32(t["root_tick"]))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class KvState:
    """One stream. S = slots."""

    blocks: BlockState
    live: jax.Array  # bool[S] slot holds a request
    gen: jax.Array  # int32[S] request generation of each slot (owner tag = gen·(S+1) + slot)
    end_tick: jax.Array  # int32[S] tick at which the request's pages die
    left: jax.Array  # int32[S] pages still to program
    held: jax.Array  # int32[S] pages programmed (valid) by the request
    start_tick: jax.Array  # int32[S] admission tick (eviction order: oldest first)
    label: jax.Array  # int32[S] lifetime label (root start tick // label interval)
    tick: jax.Array  # int32[] ticks done
    admitted: jax.Array  # int32[] requests admitted so far (serial of the next one)
    evicted: jax.Array  # int32[] requests ended early by eviction
    stalled: jax.Array  # int32[] steps the host waited for GC
    moved_weight_pages: jax.Array  # int32[] weight pages GC migrated (0 with DASH separation)
    borrowed_pages: jax.Array  # int32[] host pages written into the block of another (the closest) label
    free_pages_sum: jax.Array  # float32[] Σ free pages over measured steps
    valid_pages_sum: jax.Array  # float32[] Σ valid pages over measured steps
    read_waves_sum: jax.Array  # float32[] plane-group: Σ read waves over measured ticks
    ideal_waves_sum: jax.Array  # float32[] plane-group: Σ ⌈read pages / planes⌉ over measured ticks


def _owner_slot(owner, s):
    return owner % (s + 1), owner // (s + 1)


def init_state(config: KvConfig) -> KvState:
    """Empty device with the weight pages programmed first (slot S, generation 0: always alive)."""
    bc, s = config.blocks, config.slots
    st = gc.init_state(bc)
    if config.weight_pages:
        w = jnp.full(config.weight_pages, s, jnp.int32)
        if config.separate_weights:  # DASH: weight-owned blocks, closed when the weights are in
            st, _, _ = gc.append(st, w, jnp.full_like(w, config.weight_class), jnp.ones(w.shape, bool), bc)
            st = gc.close_classes(st, jnp.arange(bc.n_classes) == config.weight_class, bc)
        else:  # shared blocks: weights were written among KV pages that have since died
            w = jnp.stack([w, jnp.full_like(w, -1)], axis=1).reshape(-1)
            st, _, _ = gc.append(st, w, jnp.zeros_like(w), jnp.ones(w.shape, bool), bc)
    z = jnp.zeros(s, jnp.int32)
    i0 = jnp.int32(0)
    return KvState(blocks=st, live=jnp.zeros(s, bool), gen=z, end_tick=z, left=z, held=z, start_tick=z, label=z,
                   tick=i0, admitted=i0, evicted=i0, stalled=i0, moved_weight_pages=i0, borrowed_pages=i0,
                   free_pages_sum=jnp.float32(0), valid_pages_sum=jnp.float32(0),
                   read_waves_sum=jnp.float32(0), ideal_waves_sum=jnp.float32(0))


def draw_lifetime(words: tuple, serial, knobs: KvKnobs, kind: str) -> jax.Array:
    """int32 lifetime ≥ 1 tick of request ``serial`` (counter hash; exponential, deterministic, lognormal)."""
    mean = knobs.mean_lifetime_ticks
    h1 = rng.mix(*words, serial, Salt.LIFETIME_U1)
    if kind == "deterministic":
        life = jnp.broadcast_to(mean, jnp.shape(h1)).astype(jnp.float32)
    elif kind == "exponential":
        life = mean * rng.exponential(h1)
    else:  # lognormal with the given mean: median = mean·exp(−σ²/2)
        z = rng.normal(h1, rng.mix(*words, serial, Salt.LIFETIME_U2))
        sig = knobs.lifetime_sigma
        life = mean * jnp.exp(sig * z - 0.5 * sig * sig)
    return jnp.maximum(jnp.round(life), 1.0).astype(jnp.int32)


def _evict(state: KvState, ending, knobs: KvKnobs, config: KvConfig):
    """bool[S]: live requests the config's eviction policy ends so valid pages fall to ``evict_used`` of
    physical (HBFlex §5.4); none without a policy."""
    keep = state.live & ~ending
    if config.evict is None:
        return jnp.zeros_like(keep)
    weights = jnp.int32(config.weight_pages)
    limit = jnp.minimum(jnp.floor(knobs.evict_used * config.blocks.physical_pages).astype(jnp.int32),
                        config.valid_pages_max)
    excess = weights + jnp.where(keep, state.held, 0).sum() - limit
    return config.evict(keep, state.held, state.start_tick, excess)


def _admit(words: tuple, state: KvState, free_slot, inputs: KvInputs, knobs: KvKnobs, config: KvConfig):
    """New requests into free slots: closed loop (every free slot) or trace (arrived ones, in order)."""
    s = config.slots
    rank = jnp.cumsum(free_slot) - 1
    serial = state.admitted + rank
    if config.lifetime == "trace":
        n_req = inputs.arrival_tick.shape[0]
        ready = jnp.searchsorted(inputs.arrival_tick, state.tick, side="right").astype(jnp.int32)
        new = free_slot & (serial < ready)
        idx = jnp.clip(serial, 0, n_req - 1)
        life = inputs.life_ticks[idx]
        pages = inputs.pages[idx]
        root = inputs.root_tick[idx]
    else:
        new = free_slot
        life = draw_lifetime(words, serial, knobs, config.lifetime)
        pages = life * config.pages_per_tick  # KV grows every tick of the request's life
        root = jnp.broadcast_to(state.tick, (s,))
    label = jnp.floor(root.astype(jnp.float32) / knobs.label_ticks).astype(jnp.int32)
    pick = lambda a, b: jnp.where(new, a, b)  # noqa: E731
    return dataclasses.replace(
        state, live=state.live | new, gen=state.gen + new.astype(jnp.int32),
        end_tick=pick(state.tick + life, state.end_tick), left=pick(pages, state.left), held=pick(0, state.held),
        start_tick=pick(state.tick, state.start_tick), label=pick(label, state.label),
        admitted=state.admitted + new.sum().astype(jnp.int32)), new


def group_size_int(knobs: KvKnobs) -> jax.Array:
    """int32[] G from the f32 knob (rounded: a tuner passes lattice values as f32)."""
    return jnp.maximum(jnp.round(knobs.group_size).astype(jnp.int32), 1)


def slot_group(slot: jax.Array, knobs: KvKnobs, config: KvConfig) -> jax.Array:
    """int32 plane group of each slot: slot mod (planes / G) (traced G: one compilation for every G)."""
    return jnp.mod(slot, group_count(config.planes, group_size_int(knobs)))


def _page_class(slot_label, slot, knobs: KvKnobs, config: KvConfig):
    if config.allocation == "interleaved":
        return jnp.zeros_like(slot)
    if config.allocation == "isolated":
        return slot
    if config.allocation == "plane-group":
        return slot_group(slot, knobs, config)  # < slots: with planes/G ≥ slots group = slot
    return jnp.mod(slot_label, config.n_labels)


def group_read_loads(words: tuple, state: KvState, knobs: KvKnobs, config: KvConfig) -> jax.Array:
    """int32[planes]: pages each plane senses when every live request's held pages are read once.

    Request s (n pages, offset o) striped over its group's G planes from plane o: plane j of the
    group gets ⌊n/G⌋ + [(j − o) mod G < n mod G] pages (``collide.striped_plane``, in closed form).
    """
    s, planes = config.slots, config.planes
    g = group_size_int(knobs)
    slot = jnp.arange(s, dtype=jnp.int32)
    group = slot_group(slot, knobs, config)
    offset = rng.uniform_index(rng.mix(*words, slot, state.gen, Salt.KV_GROUP_OFFSET), g)  # [S]
    n = jnp.where(state.live, state.held, 0)
    plane = jnp.arange(planes, dtype=jnp.int32)
    mine = (plane[None, :] // g) == group[:, None]  # [S, P]
    extra = jnp.mod(plane[None, :] - offset[:, None], g) < jnp.mod(n, g)[:, None]
    return jnp.where(mine, n[:, None] // g + extra.astype(jnp.int32), 0).sum(axis=0, dtype=jnp.int32)


def read_waves(loads: jax.Array, knobs: KvKnobs, config: KvConfig) -> jax.Array:
    """f32[] waves of one read: max plane load, or its soft max (``soft_read_max``, an upper bound
    within ``read_temperature_pages · log planes``)."""
    if config.soft_read_max:
        t = knobs.read_temperature_pages
        return t * jax.nn.logsumexp(loads.astype(jnp.float32) / t)
    return max_load(loads).astype(jnp.float32)


def _kill_dead_pages(st: BlockState, state: KvState, config: KvConfig) -> BlockState:
    """Owner tags of ended requests become −1; valid counts are recounted (O(B·K), once per tick)."""
    s = config.slots
    slot, gen = _owner_slot(st.owner, s)
    live = jnp.concatenate([state.live, jnp.array([True])])
    gens = jnp.concatenate([state.gen, jnp.array([0], jnp.int32)])
    alive = (st.owner >= 0) & live[slot] & (gens[slot] == gen)
    owner = jnp.where(alive, st.owner, -1)
    return dataclasses.replace(st, owner=owner, valid=alive.sum(axis=1, dtype=jnp.int32))


def step(words: tuple, state: KvState, inputs: KvInputs, knobs: KvKnobs, config: KvConfig,
         measuring: jax.Array) -> KvState:
    """One tick: amortised GC, then (unless the pool is short) ends, evictions, admissions, KV writes."""
    bc, s, p = config.blocks, config.slots, config.pages_per_tick
    st = state.blocks
    target = gc.gc_target_pages(st, knobs.gc_trigger_used, knobs.gc_target_used, bc)

    def count_weights(n, moved):
        owners, _, _, mask = moved
        return n + (mask & (owners % (s + 1) == s)).sum().astype(jnp.int32)

    st, moved_w = gc.collect(words, st, config.gc_rounds, target, bc, on_move=count_weights,
                             carry=state.moved_weight_pages)
    go = gc.free_blocks(st) >= config.reserve_blocks - 1

    ending = go & state.live & (state.tick >= state.end_tick)
    evict = _evict(state, ending, knobs, config)  # also while stalled: eviction is what frees the device
    dead = ending | evict
    state = dataclasses.replace(state, live=state.live & ~dead,
                                evicted=state.evicted + evict.sum().astype(jnp.int32))
    state, new = _admit(words, state, go & ~state.live, inputs, knobs, config)
    if config.allocation == "isolated":  # a new request in a slot must not share its predecessor's block
        st = gc.close_classes(st, jnp.zeros(bc.n_classes, bool).at[:s].set(new), bc)
    st = _kill_dead_pages(st, state, config)

    slot = jnp.repeat(jnp.arange(s, dtype=jnp.int32), p)
    j = jnp.tile(jnp.arange(p, dtype=jnp.int32), s)
    write = go & state.live[slot] & (j < state.left[slot])
    owner = state.gen[slot] * (s + 1) + slot
    cls = _page_class(state.label[slot], slot, knobs, config)
    borrowed = state.borrowed_pages
    if config.uses_label_fallback:  # HBFlex §5.4: else a block with the closest label
        host_blocks = jnp.maximum(gc.free_blocks(st) - GC_HEADROOM_BLOCKS, 0)
        wanted = cls
        cls, write = gc.closest_class_fallback(cls, write, st, host_blocks, bc)
        borrowed = borrowed + (write & (cls != wanted)).sum(dtype=jnp.int32)
    st, _, _ = gc.append(st, owner, cls, write, bc)
    wrote = write.reshape(s, p).sum(axis=1, dtype=jnp.int32)  # a page the fallback could not place waits
    st = dataclasses.replace(st, host_pages=st.host_pages + wrote.sum().astype(jnp.int32))
    m = jnp.where(measuring, jnp.float32(1.0), jnp.float32(0.0))
    waves_sum, ideal_sum = state.read_waves_sum, state.ideal_waves_sum
    if config.allocation == "plane-group":  # the live KV read once per measured tick (after this tick's writes)
        state_now = dataclasses.replace(state, held=state.held + wrote)
        loads = group_read_loads(words, state_now, knobs, config)
        waves_sum = waves_sum + m * read_waves(loads, knobs, config)
        ideal_sum = ideal_sum + m * ideal_waves(loads.sum(), config.planes).astype(jnp.float32)
    return dataclasses.replace(
        state, blocks=st, left=state.left - wrote, held=state.held + wrote,
        tick=state.tick + go.astype(jnp.int32), stalled=state.stalled + (~go).astype(jnp.int32),
        moved_weight_pages=moved_w, borrowed_pages=borrowed,
        free_pages_sum=state.free_pages_sum + m * gc.free_pages(st, bc).astype(jnp.float32),
        valid_pages_sum=state.valid_pages_sum + m * st.valid.sum().astype(jnp.float32),
        read_waves_sum=waves_sum, ideal_waves_sum=ideal_sum)


def _counters(state: KvState) -> dict:
    return {**gc.block_counters(state.blocks), "evicted_requests": state.evicted,
            "admitted_requests": state.admitted, "stalled_ticks": state.stalled,
            "label_fallback_pages": state.borrowed_pages}


class KvOutput(NamedTuple):
    """One stream's measured ticks (counters are deltas over them)."""

    host_writes: jax.Array  # i32[] host page programs
    migrated_pages: jax.Array  # i32[] GC page programs
    gc_invocations: jax.Array  # i32[] reclaim calls that erased a block
    erases: jax.Array  # i32[] block erases
    evicted_requests: jax.Array  # i32[] requests ended early by eviction
    admitted_requests: jax.Array  # i32[]
    stalled_ticks: jax.Array  # i32[] ticks the host waited for GC
    label_fallback_pages: jax.Array  # i32[] pages written into the closest label's block
    warmup_host_writes: jax.Array  # i32[] weight pages and warm-up host programs
    moved_weight_pages: jax.Array  # i32[] weight pages GC migrated (0 with DASH separation)
    overflow: jax.Array  # bool[] the free pool ran dry
    mean_free_pages: jax.Array  # f32[] over measured ticks
    mean_valid_pages: jax.Array  # f32[] over measured ticks
    erases_per_block_mean: jax.Array  # f32[]
    erases_per_block_max: jax.Array  # i32[]
    erases_per_block_spread: jax.Array  # i32[] max − min
    read_waves: jax.Array  # f32[] plane-group: Σ read waves over measured ticks (0 otherwise)
    ideal_read_waves: jax.Array  # f32[] plane-group: Σ ⌈read pages / planes⌉ over measured ticks


def simulate(stream_id, seed, knobs: KvKnobs, inputs: KvInputs, config: KvConfig) -> KvOutput:
    """One stream (for ``hbfjax.batch.run``): warm-up ticks, then measured ticks (counters are deltas)."""
    words = (seed, stream_id)
    state, before, d, erases = gc.warm_then_measure(
        init_state(config), lambda s, m: step(words, s, inputs, knobs, config, m), _counters,
        lambda s: s.blocks.erases, config.warmup_ticks, config.measure_ticks)
    n = jnp.float32(config.measure_ticks)
    return KvOutput(**d, warmup_host_writes=before["host_writes"] + config.weight_pages,
                    moved_weight_pages=state.moved_weight_pages, overflow=state.blocks.overflow,
                    mean_free_pages=state.free_pages_sum / n, mean_valid_pages=state.valid_pages_sum / n, **erases,
                    read_waves=state.read_waves_sum, ideal_read_waves=state.ideal_waves_sum)
