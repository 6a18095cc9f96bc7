"""Plain-Python reference of the HBFlex serving step (one stream, loops): the correctness oracle of the
serving engine (:mod:`hbfjax.serve.engine`) run with HBFlex's parts (``ServeConfig.parts =
parts.HBFLEX``: tiers, sessions, reads, writes, sram, blocks; :mod:`hbfjax.serve.parts`) and its speed
baseline (DESIGN.md §5 "A plain-Python reference").

Built on :mod:`hbfjax.serve.reference` (its batcher :func:`reference.simulate` with the ``admit`` and
``every_chunk`` hooks, and :class:`reference.ServeStep` for the roofline, the delivery over the link
network and the DASH write path), it adds in Python floats and loops what the parts add (HBFlex §3–§5):

* the session cache (``parts.sessions``, ``kv_cache``): a finished request's whole KV retained for its
  session at the next boundary, handed to the earliest new request of the session at admission (its
  prefix, at most prompt − 1 tokens), shared from a running turn of the same session, rounded down to
  whole logical pages; LRU eviction by retention order above ``evict_threshold`` of the HBF KV room,
  once a chunk;
* the read-wave factor (``parts.reads``): per pass one wave of ``min(pages, planes)`` pages drawn from
  the run's tabulated law (``ServeInputs.read_laws``, looked up by ``parts.reads.law_key``) with the
  same uniform (``rng.mix(seed, stream, draw, Salt.WAVE_DRAW)``), its sensing rounds against the
  pages' link time multiplying the HBF share of the attention's KV bytes; its balanced minimum (the
  ideal waves) interpolated between the two tabulated draws as the waves are (``wave.draw_ideal``);
* the all-HBF writes (``parts.writes``, ``hbf_writes.pass_writes``: immediate, immediate block-first,
  stripe, window with the SRAM budget that prefetch, offloaded pages and the GC buffer leave:
  ``parts.sram``), layer by layer;
* the KV bytes each session puts in HBF per pass and at retention, written once per chunk of
  ``scan_chunk`` loop steps to the sampled planes (:class:`SampledPlanes`, ``parts.blocks`` and
  ``plane_store``: whole pages of the package placed on each plane as the placement sends them, each
  plane a Python block store, :class:`BlockStore`, with an open block per lifetime class, LRU-evicted
  sessions' pages stale, a session's diverged tail stale when a later turn keeps less of its retained
  KV (each page numbered in its plane's write order of its session), greedy GC moving valid pages to the
  open block of their class); the package's GC time of a chunk (the sampled planes' migrations × their package scale) added to the
  next iteration.

The wave's and the routing's uniforms come from JAX (hashes), as does the tabulated wave law of the
inputs; everything else is Python. Where float32 decides a discrete outcome the reference rounds as
the engine does (the wave interpolation, the block store's pending bytes and GC target). No SRAM
split (``ServeKnobs.sram_shares``) and no relaxed run: the reference is of the exact engine.
"""

from __future__ import annotations

import collections
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import clock, rng
from hbfjax.memory.organisations import DECODE_KV, HBF
from hbfjax.salts import Salt
from hbfjax.serve import kv_blocks, plane_store, reference
from hbfjax.serve.engine import ServeConfig, ServeInputs, ServeKnobs
from hbfjax.serve.parts import HBFLEX, blocks as blocks_part, reads as reads_part, sram as sram_part
from hbfjax.validate import require, require_choice
from hbfjax.workload import requests as rq

# what the HBFlex step books beside the serving totals (reference.Totals), by the engine's names: the reads
# part's totals, the sessions part's, the sram part's, the writes part's, and the engine's own gc (chunk
# stall), write stall and passes (engine.Totals.chunk_stall_us, write_stall_us, passes)
HBF_FIELDS = ("read_waves", "ideal_waves", "kv_read_stall_us", "offloaded_bytes",  # parts.reads.ReadTotals
              "retention_write_bytes", "shared_hit_tokens", "hit_tokens",  # parts.sessions.SessionTotals
              "sram_overflow_passes", "sram_peak_bytes",  # parts.sram.SramTotals
              "forced_writebacks",  # parts.writes.WriteTotals
              "gc_us", "write_stall_us", "passes")  # engine.Totals: chunk_stall_us, write_stall_us, passes


class WaveUniforms:
    """``u(draw)``: the uniform of pass ``draw``'s read wave, ``rng.uniform01(rng.mix(seed, stream,
    draw, Salt.WAVE_DRAW))``, computed by JAX in blocks of ``block`` passes (``jax_s``: time spent)."""

    def __init__(self, seed: int, stream_id: int, block: int = 4096):
        words = (jnp.uint32(seed), jnp.int32(stream_id))
        self._uniforms = jax.jit(lambda first: rng.uniform01(rng.mix(
            *words, first + jnp.arange(block, dtype=jnp.int32), Salt.WAVE_DRAW)))
        self.block, self.u, self.jax_s = block, {}, 0.0

    def __call__(self, draw: int) -> float:
        first = draw - draw % self.block
        if first not in self.u:
            t0 = time.perf_counter()
            self.u[first] = np.asarray(self._uniforms(first), np.float64)
            self.jax_s += time.perf_counter() - t0
        return float(self.u[first][draw - first])


def _bracket(table: dict, pages: float, u: float):
    """(n, idx, lo, hi, t) of ``wave.draw``: the wave's size clipped to [0, P], the ``u``-quantile's
    sample index and the two tabulated sizes around the size with its weight, in float32 as there."""
    f = np.float32
    n = min(max(f(pages), f(0.0)), table["planes"])
    sizes, samples = table["pages"], table["waves"].shape[1]
    idx = min(max(int(f(u) * f(samples)), 0), samples - 1)
    hi = min(max(int(np.searchsorted(sizes, n, side="left")), 1), len(sizes) - 1)
    lo = hi - 1
    t = min(max((n - sizes[lo]) / max(sizes[hi] - sizes[lo], f(1.0)), f(0.0)), f(1.0))
    return n, idx, lo, hi, t


def wave_draw(table: dict, pages: float, u: float) -> tuple[float, float]:
    """(sensing rounds, offloaded pages) of a wave of ``pages`` pages (``wave.draw``): the ``u``-quantile
    at the two tabulated sizes around it, interpolated linearly in size; 0 for an empty wave. In
    float32, operation for operation as ``wave.draw``."""
    f = np.float32
    n, idx, lo, hi, t = _bracket(table, pages, u)
    if n <= 0:
        return 0.0, 0.0
    mix = lambda a: float((f(1.0) - t) * a[lo, idx] + t * a[hi, idx])  # noqa: E731
    return mix(table["waves"]), mix(table["offloaded"])


def wave_ideal(table: dict, pages: float, u: float) -> float:
    """The balanced minimum of the wave :func:`wave_draw` gives (``wave.draw_ideal``): each of the two
    tabulated draws' ``ceil((size − offloaded) / P)``, interpolated in size as the waves are (so the
    waves are never below it: each tabulated draw has waves ≥ its own ideal); 0 for an empty wave.
    The two ceilings are of whole page counts (exact); the interpolation is float32 as the engine's."""
    f = np.float32
    n, idx, lo, hi, t = _bracket(table, pages, u)
    if n <= 0:
        return 0.0
    planes = float(table["planes"])
    ideal = [f(math.ceil(max(float(table["pages"][k]) - float(table["offloaded"][k, idx]), 0.0) / planes))
             for k in (lo, hi)]
    return float((f(1.0) - t) * ideal[0] + t * ideal[1])


def host_table(table) -> dict:
    """A ``wave.WaveTable`` as float32 NumPy arrays for :func:`wave_draw`."""
    return dict(pages=np.asarray(table.pages, np.float32), waves=np.asarray(table.waves, np.float32),
                offloaded=np.asarray(table.offloaded, np.float32), planes=np.float32(table.planes))


def pass_writes(buffer_bytes: float, idle: list, dec: int, chunk: int, requests: int, kv: float, k: dict,
                max_chunk: int | None = None):
    """One pass's all-HBF KV writes, one layer at a time (``hbf_writes.pass_writes``; the Python
    reference of ``tests/test_hbf_writes.py`` too): (buffer bytes after, {stall_us, stalls_us, pages,
    busy_us, forced, peak_bytes}), ``stalls_us`` per layer. ``idle``: each layer's read-free window (µs);
    ``k``: the WriteKnobs as floats (``block_first`` absent: 0); ``max_chunk``: the largest request's
    chunk tokens (None: ``chunk``)."""
    page, planes, g, t, gbps = k["page_bytes"], k["planes"], k["stripe_pages"], k["t_prog_us"], k["write_gbps"]
    prog = lambda n: max(math.ceil(n / planes) * t, n * page / (gbps * 1e3)) if n > 0 else 0.0  # noqa: E731
    rounds_us = lambda n: math.ceil(n / planes) * t  # noqa: E731
    stalls, pages, busy = [], 0.0, 0.0
    forced = 0
    buf, peak = buffer_bytes / page, 0.0  # the carried buffer's overflow leaves first (hbf_writes.PassWrites)
    for w in idle:
        if not k["buffered"]:
            q, r = divmod(dec, max(requests, 1))
            n = r * math.ceil((q + 1) * kv / page) + (max(requests, 1) - r) * math.ceil(q * kv / page) \
                + math.ceil(chunk * kv / page)
            if k.get("block_first") and n > 0:  # a request's pages serially on its open block's plane
                largest = chunk if max_chunk is None else max_chunk
                rounds = max(math.ceil((q + (r > 0)) * kv / page), math.ceil(largest * kv / page),
                             math.ceil(n / planes))
                stalls.append(max(rounds * t, n * page / (gbps * 1e3)))
                pages, busy, peak = pages + n, busy + rounds * t, max(peak, buf)
                continue
            stalls.append(prog(n))
            pages, busy, peak = pages + n, busy + rounds_us(n), max(peak, buf)  # an unused buffer stays as it is
            continue
        buf += (dec + chunk) * kv / page
        if not k["window_aware"]:
            n = math.floor(buf / g) * g
        else:
            over = buf - k["sram_kv_budget_bytes"] / page
            n = min(math.ceil(over / g) * g, math.floor(buf)) if over > 0 else 0
            forced += over > 0
        buf -= n
        peak = max(peak, buf)
        d = 0
        if k["window_aware"]:
            d = math.floor(min(buf, w * gbps * 1e3 / page, math.floor(w / t) * planes) / g) * g
            buf -= d
        stalls.append(prog(n))
        pages, busy = pages + n + d, busy + rounds_us(n) + rounds_us(d)
    return buf * page, dict(stall_us=sum(stalls), stalls_us=stalls, pages=pages, busy_us=busy, forced=forced,
                            peak_bytes=peak * page)


class SessionCache:
    """The retained KV by session (``kv_cache``), in Python: tokens, LRU rank, tallies."""

    def __init__(self):
        self.tokens, self.use_seq = {}, {}  # session -> retained tokens (> 0), its retention rank
        self.retained = self.evicted = self.evicted_tokens = self.hit_tokens = self.prompt_tokens = 0

    def retain(self, finished: list) -> None:
        """``finished``: (session, context tokens) of the requests that ended; of two turns of one session
        the larger KV is kept; the touched sessions ranked in session order after every earlier one."""
        touched = {}
        for s, context in finished:
            touched[s] = max(touched.get(s, 0), context)
        for s in sorted(touched):
            self.tokens[s] = touched[s]
            self.use_seq[s] = self.retained
            self.retained += 1

    def take(self, new: list, prefix: list, prompt: list) -> list:
        """(reused, held) tokens of each new request (``new``: (request, session)): the earliest request
        of a session gets the hit and the entry's tokens, every new request's session entry is consumed."""
        first = {}
        for q, s in new:
            first[s] = min(first.get(s, q), q)
        out = []
        for q, s in new:
            held = self.tokens.get(s, 0) if first[s] == q else 0
            out.append((max(min(prefix[q], held, prompt[q] - 1), 0) if first[s] == q else 0, held))
        for q, s in new:
            self.tokens.pop(s, None)
        self.hit_tokens += sum(r for r, _ in out)
        self.prompt_tokens += sum(prompt[q] for q, _ in new)
        return out

    def evict(self, running: int, capacity: int, threshold: float) -> list:
        """Sessions evicted, least recently retained first, while running + held exceed the limit."""
        limit = int(np.floor(np.float32(threshold) * np.float32(capacity)))
        excess = running + sum(self.tokens.values()) - limit
        out = []
        for s in sorted(self.tokens, key=self.use_seq.__getitem__):
            if excess <= 0:
                break
            out.append(s)
            excess -= self.tokens[s]
        for s in out:
            self.evicted_tokens += self.tokens.pop(s)
            del self.use_seq[s]
        self.evicted += len(out)
        return out


_FREE, _OPEN, _CLOSED = 0, 1, 2  # block status (gc)


class BlockStore:
    """The scaled KV block store of ``kv_blocks`` (over ``hbfjax.flash.erase.gc``) in Python lists: whole
    scaled pages appended per chunk into the open block of their class (the session root's lifetime
    label, or one class), eviction's pages made stale by a generation bump, GC above its trigger taking
    greedy victims (fewest valid pages, ties by index; ``victims_per_gc`` a round, ``gc_rounds`` rounds)
    and moving their valid pages to the open block of the victim's class. The free blocks are a queue
    (new blocks from its head, erased victims onto its tail). float32 where ``kv_blocks`` rounds:
    the pending bytes, the labels' start times and the GC target."""

    def __init__(self, bc: kv_blocks.KvBlocksConfig, bk: kv_blocks.KvBlocksKnobs, root_start_us: list):
        f = np.float32
        b, k, c = bc.n_blocks, bc.pages_per_block, bc.n_labels
        self.b, self.k, self.c, self.n, self.r = b, k, c, bc.max_writes, bc.sessions
        self.g, self.rounds = bc.victims_per_gc, bc.gc_rounds
        self.bpp, self.trigger, self.target = f(bk.bytes_per_page), f(bk.gc_trigger), f(bk.gc_target)
        self.aware, self.interval = float(np.asarray(bk.lifetime_aware)) > 0.5, f(bk.label_interval_us)
        self.label = [self.label_of(t) for t in root_start_us]
        self.owner = [[None] * k for _ in range(b)]  # (session, generation, number) or None (stale, unwritten)
        self.valid, self.status, self.block_class, self.erase_count = [0] * b, [_FREE] * b, [-1] * b, [0] * b
        self.ring = collections.deque(range(b))  # the free pool, in ring order
        self.open_block, self.open_ptr = [-1] * c, [k] * c
        self.pending, self.generation, self.session_pages = [f(0.0)] * self.r, [0] * self.r, [0] * self.r
        self.host_pages = self.gc_pages = self.invalidated_pages = self.stalled_writes = self.capped_writes = 0
        self.diverged_pages = 0
        self.overflow = self.unsettled = False

    def label_of(self, root_start_us) -> int:
        """The lifetime label of a session root's start (float32 µs, as ``kv_blocks.lifetime_label``)."""
        if not self.aware or not np.isfinite(root_start_us):
            return 0
        return int(np.floor(np.float32(root_start_us) / self.interval)) % self.c

    @property
    def erases(self) -> int:
        return sum(self.erase_count)

    def _append(self, pages: list) -> None:
        """Program ``pages`` ((owner, class) in order) into their classes' open blocks (gc.append)."""
        k = self.k
        idx, demand = [], [0] * self.c
        for _, cls in pages:
            idx.append(demand[cls])
            demand[cls] += 1
        total = [ptr + m for ptr, m in zip(self.open_ptr, demand)]
        new = [max((t - 1) // k, 0) for t in total]
        base = [sum(new[:c]) for c in range(self.c)]
        n_new = sum(new)
        self.overflow |= n_new > len(self.ring)
        fresh = [self.ring.popleft() for _ in range(min(n_new, len(self.ring)))]
        for (owner, cls), i in zip(pages, idx):
            q, off = divmod(self.open_ptr[cls] + i, k)
            blk = self.open_block[cls] if q == 0 else fresh[base[cls] + q - 1]
            self.owner[blk][off] = owner
            self.valid[blk] += owner is not None
        for cls in range(self.c):
            if new[cls] > 0:
                if self.open_block[cls] >= 0:
                    self.status[self.open_block[cls]] = _CLOSED
                for t in range(new[cls]):
                    blk = fresh[base[cls] + t]
                    self.status[blk] = _OPEN if t == new[cls] - 1 else _CLOSED
                    self.block_class[blk] = cls
                self.open_block[cls] = fresh[base[cls] + new[cls] - 1]
            self.open_ptr[cls] = total[cls] - new[cls] * k

    def write(self, new_bytes: np.ndarray) -> None:
        """Each session's new bytes (float32[R]) into its pending bytes; their whole pages appended in
        session order within the room the free pool leaves GC (kv_blocks.write)."""
        f = np.float32
        spare = len(self.ring) - kv_blocks.GC_HEADROOM_BLOCKS - min(self.c, self.n)
        room = min(max(spare, 0) * self.k, self.n)
        self.pending = [f(p + b) for p, b in zip(self.pending, new_bytes)]
        want = [int(np.floor(p / self.bpp)) for p in self.pending]
        self.stalled_writes += sum(want) > room and room < self.n
        self.capped_writes += sum(want) > room and room >= self.n
        pages, left = [], room
        for s, w in enumerate(want):
            count = min(w, left)
            left -= count
            first = self.session_pages[s]  # the session's pages here are numbered in write order
            pages += [((s, self.generation[s], first + i), self.label[s]) for i in range(count)]
            self.pending[s] = f(self.pending[s] - f(count) * self.bpp)
            self.session_pages[s] += count
        self._append(pages)
        self.host_pages += len(pages)

    def invalidate(self, evicted: list) -> None:
        self.unsettled |= bool(evicted)
        for s in evicted:
            self.invalidated_pages += self.session_pages[s]
            self.generation[s] += 1
            self.session_pages[s], self.pending[s] = 0, np.float32(0.0)

    def cut(self, keep: list) -> None:
        """Session s keeps its first ``keep[s]`` pages (−1: untouched; kv_blocks.cut): the written ones numbered
        from keep[s] on go stale, its waiting whole pages past keep[s] are dropped."""
        f = np.float32
        for s, kept in enumerate(keep):
            if kept < 0:
                continue
            written, waiting = self.session_pages[s], int(np.floor(self.pending[s] / self.bpp))
            self.pending[s] = f(self.pending[s] - f(f(waiting - min(max(kept - written, 0), waiting)) * self.bpp))
            dead = max(written - kept, 0)
            if dead:
                for blk, row in enumerate(self.owner):
                    for i, o in enumerate(row):
                        if o is not None and o[0] == s and o[1] == self.generation[s] and o[2] >= kept:
                            row[i] = None
                            self.valid[blk] -= 1
            self.session_pages[s] -= dead
            self.invalidated_pages += dead
            self.diverged_pages += dead

    def collect(self) -> int:
        """Settle the stale pages, then GC to the target (kv_blocks.collect); the pages it moved."""
        if self.unsettled:  # only an eviction makes pages stale
            for blk, row in enumerate(self.owner):
                for i, o in enumerate(row):
                    if o is not None and o[1] != self.generation[o[0]]:
                        row[i] = None
                self.valid[blk] = sum(o is not None for o in row)
            self.unsettled = False
        f = np.float32
        phys, pool = f(self.b * self.k), f(len(self.ring) * self.k)
        target = int(np.ceil((f(1.0) - self.target) * phys)) if phys - pool > self.trigger * phys else 0
        before = self.gc_pages
        for _ in range(self.rounds):
            self._reclaim(target)
        return self.gc_pages - before

    def _reclaim(self, target: int) -> None:
        """One GC round (gc.reclaim): the g greedy victims whose reclaimed pages are still needed and
        whose valid pages fit; their valid pages moved, then (several classes) the victims erased."""
        k, free = self.k, len(self.ring)
        if free * k >= target:  # the pool holds the target: no victim is taken
            return
        victims = sorted((blk for blk in range(self.b) if self.status[blk] == _CLOSED),
                         key=lambda blk: (self.valid[blk], blk))[:self.g]
        taken, gained, earlier = [], 0, 0
        for j, blk in enumerate(victims):
            v = self.valid[blk]
            fits = free >= 1 if self.c == 1 else earlier + k + k * min(j + 1, self.c) <= free * k
            if not (free * k + gained < target and fits):
                break
            taken.append(blk)
            gained, earlier = gained + k - v, earlier + v
        moved = [(o, self.block_class[blk]) for blk in taken for o in self.owner[blk] if o is not None]
        if self.c == 1:
            self._erase(taken)
            self._append(moved)
        else:
            self._append(moved)
            self._erase(taken)
        self.gc_pages += len(moved)

    def _erase(self, taken: list) -> None:
        for blk in taken:
            self.owner[blk] = [None] * self.k
            self.valid[blk], self.status[blk], self.block_class[blk] = 0, _FREE, -1
            self.erase_count[blk] += 1
            self.ring.append(blk)

    def waf(self) -> float:
        """(host + GC page programs) / host page programs, in float32 as ``kv_blocks.waf``."""
        f = np.float32
        return float((f(self.host_pages) + f(self.gc_pages)) / max(f(self.host_pages), f(1.0)))


class SampledPlanes:
    """The sampled planes of ``plane_store`` in Python: each session's new bytes as whole pages of the
    package (float32 remainder, as the engine rounds), sent to the planes as the placement does — a
    stripe over the session's plane group (group and offset from the engine's hashes, the count
    computed here) or a Poisson count per plane (inverse CDF, a rounded normal above
    ``plane_store.POISSON_EXACT_MEAN``, from the engine's uniforms, in float32 as it sums) — each
    plane a :class:`BlockStore` counting pages as its bytes (``PlaneStoreKnobs.blocks``: one byte a
    page), so the pages a plane cannot take wait in its pending bytes."""

    def __init__(self, sc, sk, root_start_us: list, words: tuple, pilot: list | None = None):
        f = np.float32
        self.r, self.np = sc.sessions, sc.planes
        self.bpp, self.n = f(sk.page_bytes), f(sk.package_planes)
        self.grouped = float(np.asarray(sk.grouped)) > 0.5
        self.g = max(int(np.round(float(np.asarray(sk.group_size)))), 1)
        self.planes = [BlockStore(sc.plane, sk.blocks, root_start_us) for _ in range(self.np)]
        self.label, self.label_of = self.planes[0].label, self.planes[0].label_of
        for plane in self.planes:
            plane.label = self.label  # one list: a closed loop sets a root's label on every plane
        self.pending, self.written, self.position = [f(0.0)] * self.r, [0] * self.r, [0] * self.r
        self.words = words
        self.calls = 0
        groups = max(int(np.floor(float(self.n) / self.g)), 1)
        session = jnp.arange(self.r, dtype=jnp.int32)
        h = lambda salt, *w: rng.mix(*words, *w, salt)  # noqa: E731
        group_of = lambda s: np.asarray(rng.below(h(Salt.STORE_GROUP, s), groups)).astype(int).tolist()  # noqa: E731
        self.group = group_of(session)
        self.offset = np.asarray(rng.below(h(Salt.STORE_STRIPE_OFFSET, session), self.g)).astype(int).tolist()
        self.groups = groups
        # each sampled plane's group and stripe position: the package's plane j, or in the pilot's group
        pilot = [-1] * self.np if pilot is None else [int(x) for x in pilot]
        self.plane_group = [self.group[q] if q >= 0 else j % groups for j, q in enumerate(pilot)]
        self.stripe = [j % self.g if q >= 0 else (j // groups) % self.g for j, q in enumerate(pilot)]
        self.placed = 0
        plane, sess = jnp.arange(self.np, dtype=jnp.int32)[:, None], session[None, :]
        self._hashes = jax.jit(lambda call: (rng.uniform01(h(Salt.STORE_PLANE_PAGES, call, plane, sess)),
                                             rng.normal(h(Salt.STORE_PLANE_PAGES, call, plane, sess),
                                                        h(Salt.STORE_PLANE_NORMAL, call, plane, sess))))

    @staticmethod
    def _poisson(u: float, z: float, mean) -> int:
        f = np.float32
        if mean > plane_store.POISSON_EXACT_MEAN:
            return int(max(np.round(f(mean + np.sqrt(mean) * f(z))), 0.0))
        pmf = cdf = f(jnp.exp(-jnp.float32(mean)))  # XLA's exp: numpy's may differ in the last place
        x = 0
        for k in range(plane_store.POISSON_TERMS):
            x += u >= cdf
            pmf = f(pmf * mean / f(k + 1))
            cdf = f(cdf + pmf)
        return x

    def _placed(self, new: list) -> list:
        """Pages of each session's ``new`` reaching each sampled plane (plane_store.placed_pages)."""
        out = [[0] * self.r for _ in range(self.np)]
        if self.grouped:
            for j in range(self.np):
                pos = self.stripe[j]
                for s, n in enumerate(new):
                    if n and self.group[s] == self.plane_group[j]:
                        first = self.position[s]
                        out[j][s] = sum((k + self.offset[s]) % self.g == pos for k in range(first, first + n))
            return out
        u, z = (np.asarray(a) for a in self._hashes(jnp.int32(self.calls)))
        for j in range(self.np):
            for s, n in enumerate(new):
                if n:
                    out[j][s] = self._poisson(u[j, s], z[j, s], np.float32(n) / self.n)
        return out

    def write(self, new_bytes: np.ndarray) -> None:
        f = np.float32
        pending = [f(p + b) for p, b in zip(self.pending, new_bytes)]
        new = [int(np.floor(p / self.bpp)) for p in pending]
        for plane, placed in zip(self.planes, self._placed(new)):
            plane.write(np.asarray(placed, np.float32))
            self.placed += sum(placed)
        self.pending = [f(p - f(n) * self.bpp) for p, n in zip(pending, new)]
        self.written = [w + n for w, n in zip(self.written, new)]
        self.position = [w + n for w, n in zip(self.position, new)]
        self.calls += 1

    def invalidate(self, evicted: list) -> None:
        for plane in self.planes:
            plane.invalidate(evicted)
        for s in evicted:
            self.pending[s], self.position[s] = np.float32(0.0), 0

    def cut(self, keep_bytes: dict) -> None:
        """Session s keeps its first ``keep_bytes[s]`` bytes (plane_store.cut): the pages each plane keeps
        (plane_store.kept_pages: a stripe's pages below the cut; random pages a share of the plane's,
        stochastically rounded with the engine's uniforms), the rest stale; its next page the cut's."""
        f = np.float32
        if not keep_bytes:
            return
        keep = {}
        for s, kb in keep_bytes.items():
            kb = f(kb)
            if kb < f(f(self.position[s]) * self.bpp) + self.pending[s]:  # plane_store.stored_bytes
                keep[s] = int(np.floor(kb / self.bpp))
                self.pending[s] = f(kb - f(keep[s]) * self.bpp)
        if not keep:
            return
        u = None if self.grouped else np.asarray(rng.uniform01(rng.mix(
            *self.words, jnp.int32(self.calls), jnp.arange(self.np, dtype=jnp.int32)[:, None],
            jnp.arange(self.r, dtype=jnp.int32)[None, :], Salt.STORE_CUT_ROUND)))
        for j, plane in enumerate(self.planes):
            per = [-1] * self.r
            for s, m in keep.items():
                if self.grouped:
                    mine = self.group[s] == self.plane_group[j]
                    pos = (self.stripe[j] - self.offset[s]) % self.g  # pages k < m with k = pos (mod G)
                    per[s] = (m - pos + self.g - 1) // self.g if mine and m > pos else 0
                else:
                    on_plane = plane.session_pages[s] + int(np.floor(plane.pending[s]))
                    share = f(f(m) / f(max(self.position[s], 1))) if self.position[s] > 0 else f(0.0)
                    per[s] = min(int(np.floor(f(f(on_plane) * share) + f(u[j, s]))), on_plane)
            plane.cut(per)
        for s, m in keep.items():
            self.position[s] = m

    def collect(self) -> int:
        """GC on every plane; the pages migrated on the sampled planes."""
        return sum(plane.collect() for plane in self.planes)

    def package_scale(self) -> float:
        """Package pages one sampled page stands for (``plane_store.package_scale``, in float32)."""
        f = np.float32
        if self.placed == 0:
            return float(self.n / f(self.np))
        return float(f(sum(f(w) for w in self.written)) / f(self.placed))

    @property
    def host_pages(self) -> int:
        return sum(p.host_pages for p in self.planes)

    @property
    def gc_pages(self) -> int:
        return sum(p.gc_pages for p in self.planes)

    @property
    def erases(self) -> int:
        return sum(p.erases for p in self.planes)

    def waf(self) -> float:
        """(host + GC page programs) / host page programs, in float32 as ``plane_store.waf``."""
        f = np.float32
        return float((f(self.host_pages) + f(self.gc_pages)) / max(f(self.host_pages), f(1.0)))


class HbflexStep(reference.ServeStep):
    """The engine's iteration with HBFlex's parts for :func:`reference.simulate` (``step``, ``admit``,
    ``every_chunk``): the DASH engine's step with the read-wave factor, the all-HBF writes, the
    session cache and the per-chunk block store (module docstring). ``read_table``: the run's
    tabulated wave law for these knobs (:func:`read_table`)."""

    def __init__(self, knobs: ServeKnobs, config: ServeConfig, reqs: rq.Requests, seed: int, stream_id: int,
                 read_table):
        model = config.model
        org_knobs = knobs.org
        budget = float(np.asarray(knobs.hbm_kv_budget_bytes))
        hbm_tokens, hbf_derived, unit = reference.capacity_tokens(model, org_knobs, budget)
        self.hbm_tokens = hbm_tokens
        draws = reference.CountDraws(config, seed, stream_id) if model.is_moe else None
        super().__init__(model, org_knobs, knobs.gpu, config.batcher.mode, hbm_tokens, unit, draws)
        k, self.p = self.org.k, reference._host(knobs.policy)
        self.planes = k["hbf_stacks"] * k["parallel_units"]
        self.page, self.t_read = k["page_bytes"], k["t_read_us"]
        self.write_gbps = k["hbf_stacks"] * k["hbf_write_gbps"]
        self.sram = k["hbf_stacks"] * k["hbf_sram_region_bytes"] * k["hbf_sram_regions"]
        self.hbf_cut = max(self.org.cuts[1], 1e-9)
        self.all_hbf = self.org.place[DECODE_KV][HBF] >= 0.5
        self.prefetch = self.p["prefetch"] * sram_part.prefetch_bytes(model)
        self.gc_buffer = sram_part.gc_buffer_bytes(self.page, config.blocks.pages_per_block)
        self.tokens_per_page = int(max(self.p["logical_page_tokens"], 1.0))
        self.room_tokens = reference.room_tokens(model, knobs, hbf_derived)
        self.write_k = dict(buffered=self.p["buffered"] > 0.5, window_aware=self.p["window_aware"] > 0.5,
                            block_first=self.p["block_first"] > 0.5,
                            stripe_pages=self.p["group_size"], planes=self.planes, page_bytes=self.page,
                            t_prog_us=k["t_prog_us"], write_gbps=self.write_gbps)
        self.table = host_table(read_table)
        # parts.reads.run_pages: a prefill chunk's pages of one layer, at least a block's share of each layer
        per_block = config.blocks.pages_per_block
        f32 = np.float32  # in float32 as the engine computes it, so the run length is the engine's
        per_chunk = int(np.ceil(f32(np.asarray(knobs.batcher.chunk_tokens)) * f32(model.kv_bytes_per_token_layer)
                                / f32(self.page)))
        clustered = self.p["block_first"] > 0.5 and self.p["buffered"] < 0.5
        self.run_pages = min(max(per_chunk, per_block // model.layers, 1), per_block) if clustered else 1
        self.uniforms = WaveUniforms(seed, stream_id)
        host = lambda a: np.asarray(a).tolist()  # noqa: E731
        self.session, self.prefix = host(reqs.session), host(reqs.prefix_tokens)
        self.prompt, self.output = host(reqs.prompt_tokens), host(reqs.output_tokens)
        self.cache, self.buffer_bytes, self.gc_pending_us, self.running_kv = SessionCache(), 0.0, 0.0, 0
        self.hbf = dict.fromkeys(HBF_FIELDS, 0.0)
        self.block_tokens = {}  # session -> KV tokens put in HBF since the last chunk (parts.blocks)
        self.stored_tokens, self.cut_tokens = {}, {}  # session -> its KV tokens in the store; the fewest kept
        self.last_requests = [-1] * config.batcher.slots
        # the sampled planes, one page the room's share of a plane (parts.blocks.store_knobs)
        self.sc = config.blocks.store(sessions=config.requests.requests)
        self.sk = blocks_part.store_knobs(knobs, jnp.int32(self.room_tokens), model, self.sc)
        f = np.float32
        starts = [f(sec) * f(1e6) + f(us) for sec, us in zip(np.asarray(reqs.root_start.s), np.asarray(reqs.root_start.us))]
        words = (jnp.uint32(seed), jnp.int32(stream_id))
        pilot = np.asarray(plane_store.pilots(words, reqs.session, reqs.valid, self.sc.planes)).tolist()
        self.blocks = SampledPlanes(self.sc, self.sk, starts, words, pilot)
        self.read_scale_us = 0.0  # Σ layers × (wave µs + bytes µs): the scale of kv_read_stall_us's cancellation
        self.chunks = None  # with recording on (hbfjax.serve.timeline), a list of each chunk's block-store events

    # --- admission (the parts' admit hooks: tiers, sessions, blocks) ---------------------------------
    def admit(self, requests: list, new: list, kv_tokens: list, now, arrival: list | None = None) -> list:
        if arrival is not None:  # a closed loop: a session root's start is known once it is issued
            f = np.float32
            for q, n in zip(requests, new):
                if n and q >= 0 and self.session[q] == q:
                    sec = np.floor(arrival[q] / 1e6)  # the clock's (s, us), summed in float32 as the engine does
                    self.blocks.label[q] = self.blocks.label_of(f(sec) * f(1e6) + f(arrival[q] - sec * 1e6))
        retains = self.p["hbf_request_kv"] > 0  # H3 retains nothing (parts.sessions)
        finished = [(self.session[q], self.prompt[q] + self.output[q], self.hbm.get(q, 0))
                    for q, r in zip(self.last_requests, requests) if q >= 0 and q != r and retains]
        self.cache.retain([(s, c) for s, c, _ in finished])
        for s, _, moved in finished:  # HBM-resident KV moved to HBF to be retained
            self.block_tokens[s] = self.block_tokens.get(s, 0) + moved
        self.hbf["retention_write_bytes"] += sum(moved for _, _, moved in finished) * self.m.kv_token
        pairs = [(q, self.session[q]) for q, n in zip(requests, new) if n and q >= 0]
        taken = iter(self.cache.take(pairs, self.prefix, self.prompt))
        reused = []
        for b, (q, n) in enumerate(zip(requests, new)):
            if not (n and q >= 0):
                reused.append(0)
                continue
            got, held = next(taken)
            s = self.session[q]
            running = max([kv for j, (r, kv) in enumerate(zip(requests, kv_tokens))
                           if r >= 0 and not new[j] and self.session[r] == s], default=0)
            shared = max(min(self.prefix[q], running, self.prompt[q] - 1) - got, 0) if retains else 0
            self.hbf["shared_hit_tokens"] += shared
            reused.append((got + shared) // self.tokens_per_page * self.tokens_per_page)
            if held > 0:  # the entry's tail past the reuse diverges (parts.blocks.diverge)
                kept, base = min(reused[-1], held), min(self.stored_tokens.get(s, 0), self.cut_tokens.get(s, 2**31 - 1))
                ahead = self.block_tokens.get(s, 0)
                self.block_tokens[s] = min(max(kept - base, 0), ahead)
                if kept < base:
                    self.cut_tokens[s] = kept
        self.hbf["hit_tokens"] += sum(reused)
        return reused

    # --- one iteration ------------------------------------------------------------------------------
    def __call__(self, requests: list, kv_tokens: list, batch, iteration: int) -> float:
        gc_us, self.gc_pending_us = self.gc_pending_us, 0.0
        self.hbf["gc_us"] += gc_us
        self.running_kv = sum(self.prompt[q] + self.output[q] for q in requests if q >= 0)
        self.last_requests = list(requests)
        return gc_us + super().__call__(requests, kv_tokens, batch, iteration)

    def one_pass(self, requests: list, kv_tokens: list, batch, draw: int) -> float:
        """µs of one non-empty pass (the engine's pass with HBFlex's parts), booking its totals."""
        m, p, page, planes = self.m, self.p, self.page, self.planes
        ps = reference._pass_shape(batch)
        hbf_before = {q: kv - self.hbm.get(q, 0) for q, kv in zip(requests, kv_tokens) if q >= 0}
        reading = sum(hbf_before[q] for i, q in enumerate(requests)
                      if q >= 0 and (batch.decode_mask[i] or batch.chunk_mask[i]))
        pages = math.ceil(reading * m.kv_layer / page)
        r = self.run_pages  # block-first: a layer's pages of a request lie in runs of r on one plane
        runs = math.ceil(pages / r)
        u = self.uniforms(draw)
        waves, offloaded = wave_draw(self.table, min(runs, planes), u)
        ideal = wave_ideal(self.table, min(runs, planes), u)
        n_wave = min(pages, min(runs, planes) * r)  # the wave's pages
        if r > 1:  # a plane with k runs reads k × r pages, no more than the wave's
            waves, offloaded = min(r * waves, n_wave), min(r * offloaded, n_wave)
            ideal = math.ceil(max(n_wave - offloaded, 0) / planes)
        reads = math.ceil(runs / planes)
        to_hbm = p["offload_to_hbm"] * (offloaded / max(n_wave, 1.0) if n_wave > 0 else 0.0)
        wave_us = reads * waves * self.t_read
        byte_us = pages * (1.0 - to_hbm) * page * 1e-3 / self.hbf_cut
        self.kv_hbf_factor = max(wave_us / max(byte_us, 1e-30), 1.0) if byte_us > 0 else 1.0
        shares = tuple(s + (1.0 - s) * to_hbm for s in self._shares(requests, kv_tokens, batch))
        layer_us, windows, head_us, (direct, direct_max, relay), hbm_read, hbf_read = self._times(ps, draw, shares)
        to_hbf, back, hbm_after, hbf_after = self._book(requests, kv_tokens, batch)
        dash_stall, dash_busy, scale, back_bytes = self._dash_writes(to_hbf, back, windows)
        others = self.prefetch + (1.0 - p["offload_to_hbm"]) * offloaded * page * reads + self.gc_buffer
        k = dict(self.write_k, sram_kv_budget_bytes=max(self.sram - others, 0.0))
        idle = self.idle[0] if p["prefetch"] > 0.5 else self.idle[1]
        largest = max([int(n) for n, on in zip(batch.chunk_tokens, batch.chunk_mask) if on], default=0)
        self.buffer_bytes, hw = pass_writes(self.buffer_bytes, idle, ps.decode, ps.chunk_tokens, ps.decode,
                                            m.kv_layer, k, largest)
        stall = hw["stall_us"] if self.all_hbf else dash_stall
        us = sum(layer_us) + head_us + stall
        # bytes each session put in HBF this pass: HBF-resident KV after minus before
        for i, q in enumerate(requests):
            if q >= 0:
                after = kv_tokens[i] + (int(batch.chunk_tokens[i]) if batch.chunk_mask[i] else 0) + \
                    int(bool(batch.decode_mask[i]))
                new = max(after - self.hbm.get(q, 0) - hbf_before[q], 0)
                s = self.session[q]
                self.block_tokens[s] = self.block_tokens.get(s, 0) + new
        per_token = m.kv_token
        values = dict(
            busy_us=us, prefill_write_bytes=ps.chunk_tokens * per_token if self.all_hbf else to_hbf * per_token,
            writeback_bytes=ps.decode * per_token if self.all_hbf else back_bytes, write_stall_us=stall,
            program_busy_us=hw["busy_us"] if self.all_hbf else dash_busy, writeback_passes=float(back > 0),
            expert_direct_bytes=direct, expert_direct_max_bytes=direct_max, expert_relay_bytes=relay,
            hbm_read_bytes=hbm_read, hbf_read_bytes=hbf_read, stall_scale_us=0.0 if self.all_hbf else scale)
        self._add_sums(values, hbm_after, hbf_after)
        layers, h = float(len(layer_us)), self.hbf
        self._record_pass(values, requests, batch, ps, layer_us, head_us, hbm_after, hbf_after,
                          read_waves=layers * reads * waves, kv_read_stall_us=layers * max(wave_us - byte_us, 0.0),
                          sram_bytes=min(others, self.sram) + hw["peak_bytes"], sram_capacity_bytes=self.sram)
        h["read_waves"] += layers * reads * waves
        h["ideal_waves"] += layers * reads * ideal
        h["kv_read_stall_us"] += layers * max(wave_us - byte_us, 0.0)
        self.read_scale_us += layers * (wave_us + byte_us)
        h["write_stall_us"] += stall
        h["forced_writebacks"] += hw["forced"]
        h["sram_overflow_passes"] += others > self.sram
        h["sram_peak_bytes"] = max(h["sram_peak_bytes"], min(others, self.sram) + hw["peak_bytes"])
        h["offloaded_bytes"] += layers * offloaded * page * reads
        h["passes"] += 1
        return us

    # --- once per chunk (the parts' every_chunk hooks: sessions' eviction, blocks' append and GC) -----
    def every_chunk(self) -> None:
        """Plane writes, LRU eviction, GC; the package's moved pages (the sampled planes' × their package
        scale) read and programmed again, their time added to the next iteration."""
        f = np.float32
        self.blocks.cut({s: f(f(c) * f(self.m.kv_token)) for s, c in self.cut_tokens.items()
                         if c < self.stored_tokens.get(s, 0)})
        new_bytes = np.zeros(self.blocks.r, np.float32)
        for s, t in self.block_tokens.items():
            new_bytes[s] = f(f(t) * f(self.m.kv_token))
        self.blocks.write(new_bytes)
        evicted = self.cache.evict(self.running_kv, self.room_tokens, self.p["evict_threshold"])
        self.blocks.invalidate(evicted)
        for s in set(self.block_tokens) | set(self.cut_tokens):
            self.stored_tokens[s] = min(self.stored_tokens.get(s, 0), self.cut_tokens.get(s, 2**31 - 1)) + \
                self.block_tokens.get(s, 0)
        for s in evicted:
            self.stored_tokens[s] = 0
        self.block_tokens, self.cut_tokens = {}, {}
        f = np.float32
        moved_pages = self.blocks.collect()
        moved_bytes = float(f(moved_pages) * f(self.blocks.package_scale()) * f(self.sk.page_bytes))
        gc_us = moved_bytes * 1e-3 * (1.0 / max(self.write_gbps, 1e-9) + 1.0 / self.hbf_cut)
        self.gc_pending_us += gc_us
        if self.chunks is not None:  # the timeline's block-store events: GC timed at the next iteration's start
            self.chunks.append(dict(call=self.calls, gc_us=gc_us, moved_sampled_pages=int(moved_pages),
                                    moved_package_bytes=moved_bytes, evicted_sessions=len(evicted),
                                    cached_sessions=len(self.cache.tokens),
                                    cached_tokens=sum(self.cache.tokens.values()),
                                    erases_sampled=int(self.blocks.erases), waf=self.blocks.waf()))

    def hbf_totals(self) -> dict:
        return dict(self.hbf)


def read_table(knobs: ServeKnobs, inputs: ServeInputs):
    """The tabulated wave law the engine's reads part looks up for ``knobs`` in ``inputs.read_laws``
    (``parts.reads.lookup`` by ``parts.reads.law_key``); refused when the inputs lack it."""
    require(inputs.read_laws is not None, "hbflex_reference.serve", "inputs.read_laws", None,
            "the run's tabulated wave laws are needed (parts.reads.read_laws)")
    table, found = reads_part.lookup(inputs.read_laws, reads_part.law_key(knobs.org, knobs.policy))
    require(bool(found), "hbflex_reference.serve", "inputs.read_laws", "missing",
            "must hold the law of the knobs' organisation and policy (parts.reads.read_laws([knobs]))")
    return table


def serve(stream_id: int, seed: int, knobs: ServeKnobs, config: ServeConfig, inputs=None,
          max_iterations: int | None = None, record: list | None = None):
    """One stream of ``engine.simulate(stream_id, seed, knobs, inputs, config)`` with HBFlex's parts
    (``config.parts = parts.HBFLEX``) in plain Python: (:class:`reference.Result` with float µs times,
    :class:`reference.Totals`, the :class:`HbflexStep`, whose ``hbf_totals()`` are :data:`HBF_FIELDS`,
    ``cache`` the sessions and ``blocks`` the block store; ``loop_s`` is the loop's time without the
    JAX hashes and block-store calls). ``inputs``: the run's ``ServeInputs`` (a trace and the read
    laws; :func:`read_table`). ``record``: a list each pass's detail is appended to, with the step's
    ``chunks`` each chunk's block-store events (``hbfjax.serve.timeline``)."""
    c = "hbflex_reference.serve"
    require(tuple(config.parts) == HBFLEX, c, "config.parts", config.parts,
            f"must be HBFlex's parts {HBFLEX} (the reference does not replay the reclaim part)")
    require(config.timing_kind == "organisation", c, "config.timing_kind", config.timing_kind, "must be 'organisation'")
    require_choice(c, "routing_draw", config.routing_draw, ("counts",))
    require_choice(c, "reads.wave_draw", config.reads.wave_draw, ("table",))
    require(knobs.sram_shares is None and knobs.relax is None, c, "knobs", "sram_shares/relax",
            "the reference is of the exact engine without an SRAM split")
    inputs = inputs if isinstance(inputs, ServeInputs) else ServeInputs(trace=inputs)
    require(inputs.table is None, c, "inputs.table", "a measured table", "the reference times the roofline only")
    reqs = rq.generate(stream_id, seed, knobs.requests, inputs.trace, config.requests)
    valid = np.asarray(reqs.valid)
    n = int(valid.sum())
    assert valid[:n].all(), "valid requests must be a prefix"
    step = HbflexStep(knobs, config, reqs, seed, stream_id, read_table(knobs, inputs))
    if record is not None:
        step.record, step.chunks = record, []
    # the batcher's tiers (parts.tiers.batcher_knobs): the HBM budget, and the HBF room where running
    # requests' KV may live in HBF (H3: HBM only)
    hbf = step.room_tokens if step.p["hbf_request_kv"] > 0 else 0
    caps = reference.admission_caps(step.hbm_tokens, hbf, knobs.batcher, config.batcher.tiers)
    closed = config.batcher.tasks > 0  # a closed loop: the first T arrivals, the loop issues the rest
    arrival = clock.to_us(reqs.arrival)[:config.batcher.tasks if closed else n]
    think = np.asarray(reqs.think_us, np.float64).tolist() if closed else None
    t0 = time.perf_counter()
    result = reference.simulate(arrival, step.prompt[:n], step.output[:n], int(knobs.batcher.chunk_tokens),
                                int(knobs.batcher.token_budget), caps, config.batcher,
                                max_iterations=max_iterations or config.max_iterations, step=step, admit=step.admit,
                                every_chunk=step.every_chunk, scan_chunk=config.scan_chunk, think_us=think)
    jax_s = step.uniforms.jax_s + (step.draws.jax_s if step.draws is not None else 0.0)
    step.loop_s = time.perf_counter() - t0 - jax_s
    return result, step.totals(), step
