"""One stream served on an organisation of HBFlex's evaluation (HBFlex §4–§6; DESIGN.md §4–§5): the
serving engine of :mod:`hbfjax.serve.system` with the KV of every request managed in HBF as the runtime
sees it — retained after a request ends for its session's later turns, read through plane collisions,
written through the writeback policy, reclaimed by GC.

Per iteration (``mechanism``), on top of ``system``'s per-layer times:

1. **Sessions** (``kv_cache``): a finished request's whole KV is retained as its session's entry; an
   admitted request whose prefix that entry holds reuses it in whole logical pages (HBFlex §3.1 Fig. 7b:
   the prefill skips those tokens; its KV is read as its own). A turn admitted while an earlier turn of
   its session still runs shares that turn's KV so far (its prefix pages are in HBF already); the
   open-loop replay lets a turn arrive before its parent has finished, which a closed-loop agent would
   not do. When running plus retained KV exceeds the
   eviction threshold of the HBF KV room, whole sessions are evicted, least recently used first.
2. **Reads** (``hbfjax.flash.reads.wave``): per pass, one scheduling wave of the layer's HBF KV read is
   drawn (``min(pages, planes)`` pages) under the organisation's placement (random pages or
   plane-balanced stripes), placement-aware scheduling and hot-plane offload; the wave's read-wave
   amplification multiplies the time of the HBF share of every layer's KV read (a request's KV pages
   of every layer share one stripe layout: cross-layer packing, HBFlex §5.4). Offloaded pages are read
   from SRAM (HBFlex) or from HBM (FlashAccel) instead.
3. **Writes**: all-HBF organisations program every new token's KV through ``hbf_writes`` (immediate,
   stripe, or window-aware with weight prefetch and the SRAM budget, HBFlex §5.3); organisations that
   append decode KV in HBM write it back in page waves (``kv_tiers`` and ``layer_time.kv_writes``,
   the DASH path), and H3 keeps request KV in HBM only.
4. **Blocks** (``kv_blocks``): the HBF KV of each session is appended to a scaled block store (pages
   owned by the session, classed by its root's lifetime label when lifetime-aware); evicted sessions'
   pages go stale; GC above its trigger migrates valid pages, and the migration's programs and reads
   are added to the iteration's time (exposed: not overlapped with compute).
5. **SRAM** (HBFlex §4.1, §5.3): the package SRAM is shared by prefetched weights (with prefetch on: the
   larger prefetch group, :func:`prefetch_bytes`), the buffered KV, the pages offloaded
   to SRAM and a GC migration buffer of one block; the KV buffer gets what the others leave, and a pass
   whose other users exceed the SRAM counts an SRAM overflow.

Not modelled: shared-prefix replicas across plane groups (every shared page has one copy), data and
tensor parallelism (one GPU with one package per stream; HBFlex §6.1 runs four data-parallel replicas,
each a stream here), the re-read of KV when a retained H3/FlashAccel request's HBM part moves to HBF
(its bytes are counted, its time is not).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.relax import soft_min
from hbfjax.salts import Salt
from hbfjax.flash.reads import wave
from hbfjax.memory import delivery, hbf_packages
from hbfjax.memory.hbf_packages import PolicyKnobs
from hbfjax.memory.organisations import DECODE_KV, HBF
from hbfjax.serve import batching, hbf_writes, kv_blocks, kv_cache, kv_tiers, layer_time, system
from hbfjax.validate import require, require_choice, require_real
from hbfjax.workload import requests as rq
from hbfjax.workload import timing

WAVE_DRAWS = ("table", "exact")
GC_BUFFER_BLOCKS = 1  # SRAM held for GC migration: one erase block's pages (assumed)


@dataclass(frozen=True)
class HbflexConfig:
    """Static shape of an HBFlex-study serving run: the serving engine's, the wave sample's and the
    scaled block store's."""

    serve: system.ServeConfig
    planes: int = 3072  # static bound of the wave sample (the largest package's planes)
    max_group_size: int = 512
    blocks: int = 1024  # scaled block store (kv_blocks): blocks × pages stand for the HBF KV room
    pages_per_block: int = 32
    n_labels: int = 8
    wave_draw: str = "table"  # "table": each pass's wave from its law tabulated per organisation (HbflexKnobs.
    #   read_table, O(1) a pass); "exact": one O(P) wave_sample a pass (only for P = ``planes`` packages)
    block_writes_per_chunk: int = 1024  # scaled pages a chunk appends at most (the rest waits, kept per session)
    gc_rounds: int = 8  # GC rounds of kv_blocks.victims_per_gc victims each, once per scan chunk

    def __post_init__(self):
        c = type(self).__name__
        require(isinstance(self.serve, system.ServeConfig), c, "serve", self.serve, "must be a ServeConfig")
        require_choice(c, "wave_draw", self.wave_draw, WAVE_DRAWS)

    @property
    def wave(self) -> wave.WaveConfig:
        return wave.WaveConfig(planes=self.planes, max_group_size=self.max_group_size)

    @property
    def kv_blocks(self) -> kv_blocks.KvBlocksConfig:
        """The block store: a chunk's KV appended at once, then eviction and GC (``mechanism``)."""
        return kv_blocks.KvBlocksConfig(n_blocks=self.blocks, pages_per_block=self.pages_per_block,
                                        sessions=self.serve.requests.requests, n_labels=self.n_labels,
                                        max_writes=self.block_writes_per_chunk, gc_rounds=self.gc_rounds,
                                        collect_every=1)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class HbflexKnobs:
    """What a sweep may vary without recompiling: the serving knobs (organisation, GPU, batcher, requests)
    and the KV policy of HBFlex §5."""

    serve: system.ServeKnobs
    policy: PolicyKnobs
    label_interval_us: jax.Array  # float32[] lifetime-interval label width on the root start time (§5.4)
    kv_room_bytes: jax.Array  # float32[] HBF KV room; < 0: all the HBF the weights leave
    read_table: wave.WaveTable  # the law of one KV read wave on this package under this policy (derived)

    @classmethod
    def make(cls, package: hbf_packages.Package, gpu: timing.GpuKnobs, batcher, requests: rq.RequestKnobs,
             label_interval_s: float = 60.0, kv_room_bytes: float | None = None) -> "HbflexKnobs":
        """``label_interval_s``: width of a lifetime label in root-start time (HBFlex §5.4 does not state
        it; 60 s assumed). ``kv_room_bytes``: a smaller HBF KV room than the weights leave (a short run
        then cycles its KV through eviction and GC as a long one does); None: all of it."""
        c = cls.__name__
        require(label_interval_s > 0, c, "label_interval_s", label_interval_s, "must be > 0")
        room = -1.0 if kv_room_bytes is None else require_real(c, "kv_room_bytes", kv_room_bytes, 0.0, 1e15,
                                                                 lo_open=True)
        return cls(serve=system.ServeKnobs.make(package.org, gpu, batcher, requests), policy=package.policy,
                   label_interval_us=jnp.float32(label_interval_s * 1e6), kv_room_bytes=jnp.float32(room),
                   read_table=read_table(package))


def read_table(package: hbf_packages.Package) -> wave.WaveTable:
    """The package's tabulated wave law (``wave.tabulate`` on its plane count under its policy)."""
    p = package.policy
    key = (int(round(float(hbf_packages.planes(package.org)))), float(p.balanced), float(p.scheduled),
           int(round(float(p.group_size))), float(p.offload_fraction))
    return _read_table(*key)


@functools.lru_cache(maxsize=64)
def _read_table(planes: int, balanced: float, scheduled: float, group_size: int, offload: float) -> wave.WaveTable:
    return wave.tabulate(wave.WaveKnobs.make(balanced=balanced, scheduled=scheduled, group_size=group_size,
                                             offload_fraction=offload), planes)


class SramSplit(NamedTuple):
    """The package SRAM divided between its three users, each share capping its use (issue 13's
    ``hbflex-sram`` problem; HBFlex §5.2–5.3 state no split: every choice here is ours). The GC
    migration buffer is set aside first; of the rest (``usable``):

    * offload ``shares[0]``: at most ``shares[0] × usable`` bytes of a layer read's hot-plane excess
      are served from SRAM; a fraction ρ = min(1, cap / excess) of the excess is, and the wave keeps
      the rest on its planes: waves = w_f + (1 − ρ)(w_0 − w_f), between the wave without offload
      (``bare_table``, the same quantile) and with the policy's f (assumed linear in the unserved share);
    * prefetch ``shares[1]``: it holds π = min(1, cap / prefetch group) of the prefetch group
      (:func:`prefetch_bytes`), and a layer's write window is π · (all operators' idle time) +
      (1 − π) · (the longest one's) (``hbf_writes.window_us``; the paper gives only π = 0 and 1).
      Prefetch hiding the weights' read latency itself is not modelled (the engine's layer times
      already overlap weight delivery with compute);
    * KV ``shares[2]``: the window-aware writeback's SRAM KV budget (``hbf_writes``), overflow forced.

    No pass overflows the SRAM: every user is held to its share."""

    shares: jax.Array  # float32[3] offload, prefetch, KV-buffer shares of the usable SRAM (sum 1)
    bare_table: wave.WaveTable  # the package's wave law without offload (``read_table`` at f = 0)


def bare_table(package: hbf_packages.Package) -> wave.WaveTable:
    """The package's tabulated wave law with hot-plane offload off (:class:`SramSplit`)."""
    return read_table(hbf_packages.Package(package.org, dataclasses.replace(package.policy,
                                                                            offload_fraction=jnp.float32(0.0))))


class HbfTotals(NamedTuple):
    """Sums over one stream's run of what the HBF KV management did (float32[] each)."""

    read_waves: jax.Array  # Σ over passes of layers × wave-sized reads × the sampled wave's sensing rounds
    ideal_waves: jax.Array  # the same with perfectly balanced planes (HBFlex §6.4's theoretical minimum)
    kv_read_stall_us: jax.Array  # Σ layers × max(waves × tR − bytes / rate, 0): what amplification adds
    write_stall_us: jax.Array  # exposed KV-write time (all paths)
    gc_us: jax.Array  # GC migration time added to iterations
    forced_writebacks: jax.Array
    sram_overflow_passes: jax.Array  # passes whose prefetch + offload + GC buffer exceeded the SRAM
    sram_peak_bytes: jax.Array  # most SRAM used in a pass (max)
    offloaded_bytes: jax.Array  # KV read from SRAM or HBM instead of hot planes (every layer)
    passes: jax.Array  # passes with work
    retention_write_bytes: jax.Array  # HBM-resident KV moved to HBF when its request is retained
    shared_hit_tokens: jax.Array  # prompt tokens reused from a running turn of the same session (before page rounding)
    hit_tokens: jax.Array  # prompt tokens reused in all (whole logical pages), not prefilled


_IS_MAX = np.array([name.endswith("_peak_bytes") for name in HbfTotals._fields])


class HbflexOutput(NamedTuple):
    """One stream's run: the serving engine's output and the HBF KV management's."""

    serve: system.ServeOutput
    hbf: HbfTotals
    cache: kv_cache.SessionCache
    blocks: kv_blocks.KvBlocks


def _accumulate(sums, add: HbfTotals):
    x = jnp.stack([jnp.asarray(v, jnp.float32) for v in add])
    return jnp.where(_IS_MAX, jnp.maximum(sums, x), sums + x)


class Room(NamedTuple):
    """The HBF KV room of an organisation for a model."""

    hbf_kv_tokens: jax.Array  # int32[] KV tokens the HBF the weights leave holds
    bytes_per_token: float


def room(knobs: HbflexKnobs, model) -> Room:
    """The HBF the weights leave, or the knobs' smaller room."""
    per_token = float(model.kv_bytes_per_token)
    derived = kv_tiers.capacity_tokens(knobs.serve.org, model).hbf_tokens
    given = jnp.floor(knobs.kv_room_bytes / per_token).astype(jnp.int32)
    return Room(hbf_kv_tokens=jnp.where(knobs.kv_room_bytes >= 0, jnp.minimum(given, derived), derived),
                bytes_per_token=per_token)


def prefetch_bytes(model) -> float:
    """SRAM that weight prefetch holds (HBFlex §5.3): the larger of its two groups, fetched one at a time —
    one routed expert's projections, or a layer's Q projections (MLA: ``q_a`` and ``q_b``; a fused GQA
    ``qkv`` counted whole). DeepSeek-V4-Pro: 66 and 112 MB from the preset (the paper: ≈ 63 and 106 MB)."""
    kind = "moe" if model.is_moe else "dense"
    expert = layer_time.expert_bytes(model) if model.is_moe else 0.0
    q = sum(l.in_features * l.out_features * l.bytes_per_param for l in model.linears(kind)
            if l.op == "qkv_proj" and l.name in ("q_a", "q_b", "qkv", "q"))
    return float(max(expert, q))


def write_knobs(knobs: HbflexKnobs, model) -> hbf_writes.WriteKnobs:
    """The all-HBF write path's knobs from the organisation and policy (SRAM budget set per pass)."""
    org, p = knobs.serve.org, knobs.policy
    return hbf_writes.WriteKnobs(
        buffered=p.buffered, window_aware=p.window_aware, prefetch=p.prefetch, stripe_pages=p.group_size,
        planes=hbf_packages.planes(org), page_bytes=org.page_bytes, t_prog_us=org.t_prog_us,
        write_gbps=org.hbf_stacks * org.hbf_write_gbps, sram_kv_budget_bytes=hbf_packages.sram_bytes(org))


def wave_knobs(policy: PolicyKnobs) -> wave.WaveKnobs:
    return wave.WaveKnobs(balanced=policy.balanced, scheduled=policy.scheduled,
                          group_size=policy.group_size.astype(jnp.int32), offload_fraction=policy.offload_fraction)


def blocks_knobs(knobs: HbflexKnobs, space: Room, config: HbflexConfig) -> kv_blocks.KvBlocksKnobs:
    """The block store's knobs: the policy's lifetime packing and GC trigger (GC reclaims back to just
    below it, ``KvBlocksKnobs.make``'s default), one scaled page standing for the KV room's share."""
    pages = config.blocks * config.pages_per_block
    return kv_blocks.KvBlocksKnobs(
        lifetime_aware=knobs.policy.lifetime_aware, label_interval_us=knobs.label_interval_us,
        gc_trigger=knobs.policy.gc_trigger, gc_target=knobs.policy.gc_trigger,
        bytes_per_page=space.hbf_kv_tokens.astype(jnp.float32) * space.bytes_per_token / pages)


def _add_bytes(per_session: jax.Array, session: jax.Array, tokens_bytes) -> jax.Array:
    """float32[R] ``per_session`` plus each slot's bytes at its session."""
    return per_session.at[session].add(jnp.asarray(tokens_bytes, jnp.float32))


def _hbf_tokens(kv: kv_tiers.KvTiers, kv_tokens) -> jax.Array:
    """int32[B] HBF-resident KV tokens of each slot."""
    return jnp.where(kv.request >= 0, kv_tokens - kv.hbm_tokens, 0)


def _read_pages_per_layer(hbf_tokens, batch: timing.Batch, model, page_bytes) -> jax.Array:
    """float32[] pages one layer's attention reads from HBF in this pass (decode reads the whole KV,
    a chunk its prefix)."""
    reading = batch.decode_mask | batch.chunk_mask
    tokens = jnp.where(reading, hbf_tokens, 0).sum().astype(jnp.float32)
    return jnp.ceil(tokens * float(model.kv_bytes_per_token_layer) / page_bytes)


class _Carry(NamedTuple):
    kv: kv_tiers.KvTiers
    cache: kv_cache.SessionCache
    blocks: kv_blocks.KvBlocks
    block_bytes: jax.Array  # float32[R] KV bytes each session put in HBF since the last chunk (appended per chunk)
    writes: hbf_writes.WriteState
    gc_pending_us: jax.Array  # float32[] GC migration time of the last collection, added to the next iteration
    running_kv_tokens: jax.Array  # int32[] whole KV (prompt + output) of the running requests, for eviction
    serve_sums: jax.Array  # float32[F] system.Totals, Kahan-compensated
    serve_comp: jax.Array
    hbf_sums: jax.Array  # float32[H] HbfTotals


def _capped(need, cap, temperature, unit):
    """min(need, cap), relaxed as ``soft_min`` at ``temperature`` in ``unit`` s (None: exact)."""
    if temperature is None:
        return jnp.minimum(need, cap)
    return soft_min(need / unit, cap / unit, temperature) * unit


def mechanism(words: tuple, reqs: rq.Requests, knobs: HbflexKnobs, config: HbflexConfig,
              table=None, split: SramSplit | None = None, temperature=None) -> batching.Mechanism:
    """The HBF KV management of the module docstring as a batcher mechanism (with an admission hook).
    ``split``: the SRAM divided between offload, prefetch and KV buffer (:class:`SramSplit`; None: the
    KV buffer gets what the others leave); ``temperature`` (pages; None: exact): with a split, its caps
    as ``soft_min`` and the forced writebacks relaxed (``hbf_writes.pass_writes``)."""
    require(split is not None or temperature is None, "mechanism", "temperature", temperature,
            "relaxes the SRAM split's caps: give a split")
    require(split is None or config.wave_draw == "table", "HbflexConfig", "wave_draw", config.wave_draw,
            "an SRAM split needs the tabulated wave law ('table')")
    sc, model = config.serve, config.serve.model
    org, policy = knobs.serve.org, knobs.policy
    capacity = kv_tiers.capacity_tokens(org, model, knobs.serve.hbm_kv_budget_bytes)
    space = room(knobs, model)
    experts = system.delivery_table(knobs.serve, sc)
    wc, bc = config.wave, config.kv_blocks
    wk, bk = wave_knobs(policy), blocks_knobs(knobs, space, config)
    n_planes = hbf_packages.planes(org)
    hbf_cut_gbps = jnp.maximum(delivery.read_cuts(org).hbf_gbps, 1e-9)
    page = org.page_bytes
    per_token = space.bytes_per_token
    all_hbf = org.place[DECODE_KV, HBF] >= 0.5  # new KV programmed straight into HBF (hbf_writes)
    sram = hbf_packages.sram_bytes(org)
    prefetch = policy.prefetch * prefetch_bytes(model)
    gc_buffer = GC_BUFFER_BLOCKS * config.pages_per_block * page
    if split is not None:
        usable = jnp.maximum(sram - gc_buffer, 0.0)
        cap_offload, cap_prefetch, cap_kv = (split.shares[k] * usable for k in range(3))
        prefetch_need = prefetch
        prefetch = _capped(prefetch_need, cap_prefetch, temperature, page)
        prefetch_held = jnp.where(prefetch_need > 0, prefetch / jnp.maximum(prefetch_need, 1e-30), 0.0)
    tokens_per_page = jnp.maximum(policy.logical_page_tokens, 1.0).astype(jnp.int32)

    def admit(carry: _Carry, st, new):
        # requests that finished since the last boundary: their KV becomes their session's entry
        prev = carry.kv.request
        finished = (prev >= 0) & (prev != st.slots.request)
        idx = jnp.maximum(prev, 0)
        context = jnp.where(finished, reqs.prompt_tokens[idx] + reqs.output_tokens[idx], 0)
        cache = kv_cache.retain(carry.cache, reqs.session[idx], finished, context, st.now)
        moved = jnp.where(finished, carry.kv.hbm_tokens, 0)  # HBM-resident KV moved to HBF to be retained
        block_bytes = _add_bytes(carry.block_bytes, reqs.session[idx], jnp.where(finished, moved, 0) * per_token)
        hbf_sums = carry.hbf_sums.at[HbfTotals._fields.index("retention_write_bytes")].add(
            moved.sum().astype(jnp.float32) * per_token)
        reused, cache = kv_cache.take(cache, st.slots.request, new, reqs)
        # a turn that arrives while an earlier turn of its session still runs shares that turn's KV so far
        # (a shared prefix: its pages are in HBF already, HBFlex §5.2) — open-loop replay lets a turn
        # arrive before its parent ends
        req = jnp.maximum(st.slots.request, 0)
        sess = jnp.where(st.slots.request >= 0, reqs.session[req], -1)
        same = (sess[:, None] == sess[None, :]) & (sess[:, None] >= 0) & ~new[None, :]  # [b, j]: j runs b's session
        running = jnp.where(same, st.slots.kv_tokens[None, :], 0).max(axis=1)
        shared = jnp.where(new, jnp.minimum(jnp.minimum(reqs.prefix_tokens[req], running), reqs.prompt_tokens[req] - 1), 0)
        shared = jnp.maximum(shared - reused, 0)
        reused = (reused + shared) // tokens_per_page * tokens_per_page  # whole logical pages (HBFlex §3.1)
        hbf_sums = hbf_sums.at[HbfTotals._fields.index("shared_hit_tokens")].add(shared.sum().astype(jnp.float32))
        hbf_sums = hbf_sums.at[HbfTotals._fields.index("hit_tokens")].add(reused.sum().astype(jnp.float32))
        return reused, carry._replace(cache=cache, block_bytes=block_bytes, hbf_sums=hbf_sums)

    def one_pass(carry: _Carry, kv_tokens, batch, draw):
        kv, st_writes = carry.kv, carry.writes
        hbm_share = kv_tiers.read_shares(kv, kv_tokens, batch)
        hbf_tokens = _hbf_tokens(kv, kv_tokens)
        pages = _read_pages_per_layer(hbf_tokens, batch, model, page)
        n_wave = jnp.minimum(pages, n_planes)
        if config.wave_draw == "exact":
            sample = wave.wave_sample((*words, draw), n_wave.astype(jnp.int32), wk, wc)
            waves, offloaded = sample.waves.astype(jnp.float32), sample.offloaded_pages.astype(jnp.float32)
        else:
            u = rng.uniform01(rng.mix(*words, draw, Salt.WAVE_DRAW))
            waves, offloaded = wave.draw(knobs.read_table, n_wave, u)
        reads = jnp.ceil(pages / n_planes)
        if split is not None:  # the offload share serves at most its bytes of the layer's excess (SramSplit)
            bare, _ = wave.draw(split.bare_table, n_wave, u)
            excess = offloaded * page * reads
            served = _capped(excess, cap_offload, temperature, page)
            rho = jnp.where((excess > 0) & (policy.offload_to_hbm < 0.5), served / jnp.maximum(excess, 1e-30), 1.0)
            waves, offloaded = waves + (1.0 - rho) * jnp.maximum(bare - waves, 0.0), rho * offloaded
        # the pages read from planes, whole (offload interpolated between tabulated sizes is fractional)
        ideal = jnp.where(n_wave > 0, jnp.ceil(jnp.round(jnp.maximum(n_wave - offloaded, 0.0)) / n_planes), 0.0)
        # the layer reads ceil(pages / P) wave-sized parts, each as amplified as the sampled wave; pages
        # offloaded to SRAM still cross the link, those offloaded to HBM (FlashAccel) leave the HBF share
        off = jnp.where(n_wave > 0, offloaded / jnp.maximum(n_wave, 1.0), 0.0)
        to_hbm = policy.offload_to_hbm * off
        wave_us = reads * waves * org.t_read_us
        byte_us = pages * (1.0 - to_hbm) * page * 1e-3 / hbf_cut_gbps
        factor = jnp.where(byte_us > 0, jnp.maximum(wave_us / jnp.maximum(byte_us, 1e-30), 1.0), 1.0)
        shares = tuple(s + (1.0 - s) * to_hbm for s in hbm_share)
        times = system.pass_times(words, batch, draw, knobs.serve, sc, shares, table, experts,
                                  kv_hbf_factor=factor)
        # writes: the DASH path (HBM-appended KV, written back in waves) and the all-HBF path
        new_kv, moves = kv_tiers.book(kv, kv_tokens, batch, org, capacity)
        dash_writes = layer_time.kv_writes(times, moves.to_hbf_tokens, moves.writeback_tokens, org, model)
        offload_bytes = (1.0 - policy.offload_to_hbm) * offloaded * page * reads
        others = prefetch + offload_bytes + gc_buffer
        if split is None:
            wk_pass = dataclasses.replace(write_knobs(knobs, model), sram_kv_budget_bytes=jnp.maximum(sram - others, 0.0))
        else:
            wk_pass = dataclasses.replace(write_knobs(knobs, model), sram_kv_budget_bytes=cap_kv,
                                          prefetch=policy.prefetch * prefetch_held)
        decode_tokens = batch.decode_mask.sum(dtype=jnp.int32)
        chunk_tokens = jnp.where(batch.chunk_mask, batch.chunk_tokens, 0).sum(dtype=jnp.int32)
        new_writes, hw = hbf_writes.pass_writes(st_writes, times, decode_tokens, chunk_tokens, decode_tokens,
                                                float(model.kv_bytes_per_token_layer), wk_pass, temperature)
        stall = jnp.where(all_hbf, hw.stall_us.sum(), dash_writes.stall_us.sum())
        work = batching.has_work(batch)
        us = jnp.where(work, times.iteration_us + stall, 0.0)
        # bytes each session put in HBF this pass: HBF-resident KV after minus before
        after_tokens = kv_tokens + jnp.where(batch.chunk_mask, batch.chunk_tokens, 0) + batch.decode_mask
        hbf_new = jnp.maximum(_hbf_tokens(new_kv, after_tokens) - hbf_tokens, 0)
        owner = jnp.maximum(kv.request, 0)
        block_bytes = _add_bytes(carry.block_bytes, reqs.session[owner], jnp.where(kv.request >= 0, hbf_new, 0) * per_token)
        z = lambda x: jnp.where(work, jnp.asarray(x, jnp.float32), 0.0)  # noqa: E731
        layers = float(model.layers)
        add_serve = system.Totals(
            busy_us=us, prefill_write_bytes=z(jnp.where(all_hbf, chunk_tokens * per_token, dash_writes.direct_bytes)),
            writeback_bytes=z(jnp.where(all_hbf, decode_tokens * per_token, dash_writes.writeback_bytes)),
            write_stall_us=z(stall), program_busy_us=z(jnp.where(all_hbf, hw.program_busy_us,
                                                                 dash_writes.program_busy_us)),
            writeback_passes=z(moves.writeback_tokens > 0), expert_direct_bytes=z(times.expert_direct_bytes.sum()),
            expert_relay_bytes=z(times.expert_relay_bytes.sum()), hbm_read_bytes=z(times.hbm_read_bytes),
            hbf_read_bytes=z(times.hbf_read_bytes), kv_hbm_byte_us=z(moves.hbm_tokens * per_token * us),
            kv_hbf_byte_us=z(moves.hbf_tokens * per_token * us), max_kv_hbm_bytes=z(moves.hbm_tokens * per_token),
            max_kv_hbf_bytes=z(moves.hbf_tokens * per_token), table_miss_passes=z(times.table_miss))
        add_hbf = HbfTotals(
            read_waves=z(layers * reads * waves), ideal_waves=z(layers * reads * ideal),
            kv_read_stall_us=z(layers * jnp.maximum(wave_us - byte_us, 0.0)), write_stall_us=z(stall), gc_us=z(0.0), forced_writebacks=z(hw.forced_writebacks),
            sram_overflow_passes=z(others > sram), sram_peak_bytes=z(jnp.minimum(others, sram) + hw.buffer_peak_bytes),
            offloaded_bytes=z(layers * offloaded * page * reads), passes=z(work),
            retention_write_bytes=z(0.0), shared_hit_tokens=z(0.0), hit_tokens=z(0.0))
        keep = lambda a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(work, x, y), a, b)  # noqa: E731
        serve_sums, serve_comp = system._accumulate(carry.serve_sums, carry.serve_comp, add_serve)
        carry = carry._replace(kv=keep(new_kv, kv), writes=keep(new_writes, st_writes), block_bytes=keep(block_bytes, carry.block_bytes),
                               serve_sums=serve_sums, serve_comp=serve_comp,
                               hbf_sums=_accumulate(carry.hbf_sums, add_hbf))
        return us, carry

    def iteration(carry: _Carry, st, batch, i):
        kv = kv_tiers.sync(carry.kv, st.slots.request)
        gc_us = carry.gc_pending_us
        carry = carry._replace(kv=kv, running_kv_tokens=kv_cache.running_kv_tokens(st.slots.request, reqs),
                               gc_pending_us=jnp.float32(0.0),
                               hbf_sums=carry.hbf_sums.at[HbfTotals._fields.index("gc_us")].add(gc_us))
        kv_tokens = st.slots.kv_tokens
        total_us = gc_us
        for k, p in enumerate(batching.passes(batch, sc.batcher.mode)):
            us, carry = one_pass(carry, kv_tokens, p, 2 * jnp.asarray(i, jnp.int32) + k)
            total_us = total_us + us
            kv_tokens = kv_tokens + jnp.where(p.chunk_mask, p.chunk_tokens, 0) + p.decode_mask.astype(jnp.int32)
        return total_us, carry

    def every_chunk(carry: _Carry) -> _Carry:
        # eviction and GC (HBFlex §5.4), amortised once per chunk (the 90 % → 95 % gap absorbs a chunk's
        # growth): LRU sessions evicted while running + retained KV exceed the threshold of the room;
        # GC's moved pages are read and programmed again, their time (bytes over the read cut, then the
        # program bandwidth) added to the next iteration
        sessions = jnp.arange(sc.requests.requests, dtype=jnp.int32)
        blocks, _ = kv_blocks.write(carry.blocks, sessions, carry.block_bytes, reqs.root_start, bk, bc)
        cache, evicted = kv_cache.evict(carry.cache, carry.running_kv_tokens, space.hbf_kv_tokens,
                                        policy.evict_threshold)
        blocks = kv_blocks.invalidate(blocks, evicted, bc)
        blocks, moved = kv_blocks.collect(words, blocks, bk, bc)
        moved_bytes = moved.astype(jnp.float32) * bk.bytes_per_page
        gc_us = moved_bytes * 1e-3 * (1.0 / jnp.maximum(org.hbf_stacks * org.hbf_write_gbps, 1e-9) + 1.0 / hbf_cut_gbps)
        return carry._replace(cache=cache, blocks=blocks, block_bytes=jnp.zeros_like(carry.block_bytes),
                              gc_pending_us=carry.gc_pending_us + gc_us)

    def init():
        zeros = lambda n: jnp.zeros(n, jnp.float32)  # noqa: E731
        return _Carry(kv=kv_tiers.init(sc.batcher.slots), cache=kv_cache.init(sc.requests.requests),
                      blocks=kv_blocks.init(bc), block_bytes=jnp.zeros(sc.requests.requests, jnp.float32),
                      writes=hbf_writes.init_state(), gc_pending_us=jnp.float32(0.0),
                      running_kv_tokens=jnp.int32(0), serve_sums=zeros(len(system.Totals._fields)), serve_comp=zeros(len(system.Totals._fields)),
                      hbf_sums=zeros(len(HbfTotals._fields)))

    return batching.Mechanism(init=init, iteration=iteration, admit=admit, every_chunk=every_chunk)


def admission_capacity(knobs: HbflexKnobs, config: HbflexConfig):
    """The batcher's tier capacities: the HBM KV budget, and the HBF KV room where running requests'
    KV may live in HBF (``PolicyKnobs.hbf_request_kv``; H3: HBM only)."""
    cap = kv_tiers.capacity_tokens(knobs.serve.org, config.serve.model, knobs.serve.hbm_kv_budget_bytes)
    hbf = jnp.where(knobs.policy.hbf_request_kv > 0, room(knobs, config.serve.model).hbf_kv_tokens, 0)
    return system.admission_capacity(cap._replace(hbf_tokens=hbf), knobs.serve.batcher)


def simulate(stream_id, seed, knobs: HbflexKnobs, inputs, config: HbflexConfig, split: SramSplit | None = None,
             temperature=None) -> HbflexOutput:
    """Serve one stream's requests to the end on the organisation (module docstring); ``inputs`` as
    ``system.simulate``'s; ``split``, ``temperature``: :func:`mechanism`'s."""
    trace, table = inputs if isinstance(inputs, system.ServeInputs) else (inputs, None)
    sc = config.serve
    reqs = rq.generate(stream_id, seed, knobs.serve.requests, trace, sc.requests)
    st, carry = batching.run(reqs, admission_capacity(knobs, config), sc.batcher,
                             mechanism((seed, stream_id), reqs, knobs, config, table, split, temperature),
                             sc.max_iterations, sc.scan_chunk)
    out = system.ServeOutput(arrival=reqs.arrival, first_token=st.first_token, finish=st.finish,
                             tokens_out=st.tokens_out, valid=reqs.valid, iterations=st.iterations,
                             overflow=st.overflow | carry.blocks.overflow, totals=system.Totals(*carry.serve_sums))
    return HbflexOutput(serve=out, hbf=HbfTotals(*carry.hbf_sums), cache=carry.cache, blocks=carry.blocks)


def report(out: HbflexOutput) -> dict:
    """Host ``{key: float64[S]}`` per stream of the HBFlex keys (HBFlex §6.4): WAF, read-wave
    amplification, write stall per iteration, SRAM peak, prefix hit fraction, evicted sessions."""
    h = {k: np.asarray(v, np.float64) for k, v in out.hbf._asdict().items()}
    iterations = np.maximum(np.asarray(out.serve.iterations, np.float64), 1.0)
    c = out.cache
    return {
        "waf": np.asarray(jax.vmap(kv_blocks.waf)(out.blocks) if np.ndim(out.blocks.host_pages) else
                          kv_blocks.waf(out.blocks), np.float64),
        "read_wave_amplification": h["read_waves"] / np.maximum(h["ideal_waves"], 1e-30),
        "write_stall_us_per_iteration": h["write_stall_us"] / iterations,
        "gc_ms_per_iteration": h["gc_us"] * 1e-3 / iterations,
        "kv_read_stall_fraction": h["kv_read_stall_us"] / np.maximum(np.asarray(out.serve.totals.busy_us, np.float64),
                                                                      1e-30),
        "sram_peak_bytes": h["sram_peak_bytes"],
        "sram_overflow_passes": h["sram_overflow_passes"],
        "forced_writebacks": h["forced_writebacks"],
        "prefix_hit_tokens_fraction": h["hit_tokens"] / np.maximum(kv_cache.tally_value(c.prompt_tokens), 1.0),
        "evicted_sessions": np.asarray(c.evicted, np.float64),
        "retention_write_gb": h["retention_write_bytes"] * 1e-9,
    }

