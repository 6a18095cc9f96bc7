"""One scheduling wave of a KV attention read: its sensing rounds and read-wave amplification (HBFlex §3.1, §5.2, §6.4).

Attention reads KV in scheduling waves of about one page per plane (HBFlex §3.1, Fig. 6: a 12 MiB read
is 3,072 pages, one per plane when ideally placed). A wave of n ≤ P pages costs ``max plane load``
sensing rounds; read-wave amplification = waves / ceil(pages / planes) (§6.4, Fig. 17). This module
draws ONE wave per call, cheaply (O(P) element ops, no sort), for the serving step to call once per
pass per stream; ``hbfjax.flash.reads.workingset`` models a whole working set and is too costly there.

Model (all draws by the counter hash; placement reuses ``collide``):

* random (``balanced = 0``): every page on an independent uniform plane, ``collide.place_pages("random")``.
* plane-balanced (``balanced = 1``, HBFlex Fig. 11b): a request's physical pages form stripes of G
  adjacent pages over the G complementary planes of a plane group, continuing across logical pages;
  each stripe went to the least-loaded group when it was written — independent of which stripes a
  later wave reads together, so in a wave each stripe lies in a uniformly random group. The wave's n
  pages are S = ceil(n / G) stripes (the last one partial, q = n − (S − 1)·G pages); each stripe starts
  at a random plane of its group and wraps. Stripe s starts at plane ``place_pages("random", s)``,
  whose group is ``start // G`` and offset ``start % G``: with G = 1 a stripe is a page and balanced
  placement places every page exactly where random placement does.
* placement-aware scheduling (``scheduled = 1``, HBFlex §5.2, only with balanced placement — with
  random placement it is a no-op, since the scheduler works on the plane-group layout): the wave's S
  stripes are chosen from a window of ``candidates × S`` pending stripes to cover as many distinct
  groups as possible — greedily, in increasing rank of each candidate within its group (its count of
  earlier window stripes in the same group), ties by window order; the last pick is the partial
  stripe. Computed without a sort: with c_g the window's stripes in group g and T(r) = Σ_g min(c_g, r),
  the greedy takes every candidate of rank < r* (T(r*) < S ≤ T(r* + 1)) and m = S − T(r*) ≥ 1 of the
  rank-r* ones. Each group g then holds min(c_g, r*) + [one of the m] stripes and the partial stripe
  is in one of the m groups; which m groups (the greedy takes them in window order, this code in group
  order) changes which planes carry each load but not the multiset of plane loads, so waves and
  offloaded pages equal the literal greedy's on every draw (``tests/test_wave.py`` checks this
  against a plain-Python greedy).
* hot-plane offload (HBFlex §5.2, §6.5): ``collide.offload_hot_planes(loads, f, P)`` cuts the top
  f × P planes to the next plane's load; their excess pages are served from base-die SRAM.
* amplification = waves / ceil((pages − offloaded) / P), and 1 for an empty wave (or one served
  wholly from SRAM).

Every array has one compiled shape: P planes, ``candidates × P`` candidate stripes (S ≤ P since
G ≥ 1); the traced counts mask them. ``balanced`` and ``scheduled`` are float 0/1 knobs used in
``jnp.where``, so one compilation covers every knob value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import counting
from hbfjax.flash.reads.collide import (MAX_PLANES, PlacementKnobs, check_group_size, group_count, ideal_waves,
                                        max_load, offload_hot_planes, place_pages)
from hbfjax.salts import Salt
from hbfjax.validate import require, require_int, require_real

LEVELS = 64  # static depth bound of the greedy's ranks and of offload's load histogram (see below)
MAX_CANDIDATES = 64  # look-ahead window bound: candidates × planes stripes stay a small per-stream array


@dataclass(frozen=True)
class WaveConfig:
    """Static shape of one wave: P planes, the bound on the traced group size, the scheduling window."""

    planes: int  # P (HBFlex: 3,072)
    max_group_size: int  # static bound on the traced G (knobs are checked against it)
    candidates: int = 2  # placement-aware scheduling: look-ahead window = candidates × the wave's stripes

    def __post_init__(self):
        require_int("WaveConfig", "planes", self.planes, 1, MAX_PLANES // MAX_CANDIDATES)
        require_int("WaveConfig", "max_group_size", self.max_group_size, 1, self.planes)
        require_int("WaveConfig", "candidates", self.candidates, 1, MAX_CANDIDATES)


def _flag(owner: str, name: str, value) -> float:
    v = require_real(owner, name, value)
    require(v in (0.0, 1.0), owner, name, value, "must be 0 or 1")
    return v


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class WaveKnobs:
    """Traced knobs of one wave (scalars; stack a leading axis to sweep, one compilation for all)."""

    balanced: jax.Array  # f32[] 1: plane-balanced placement (stripes over plane groups); 0: random pages
    scheduled: jax.Array  # f32[] 1: placement-aware tile scheduling (HBFlex §5.2); 0: in order
    group_size: jax.Array  # i32[] G planes per plane group = pages per physical stripe (divides planes)
    offload_fraction: jax.Array  # f32[] fraction f of top-loaded planes whose excess goes to SRAM (0: off)

    @classmethod
    def make(cls, balanced=1.0, scheduled=0.0, group_size=1, offload_fraction=0.0,
             config: WaveConfig | None = None) -> "WaveKnobs":
        """Validated knobs: the flags are 0 or 1, G ≥ 1, f in [0, 1); with ``config``, G also divides
        the planes and stays within ``config.max_group_size``."""
        owner = cls.__name__
        g = require_int(owner, "group_size", group_size, 1)
        if config is not None:
            check_group_size(config.planes, g)
            require(g <= config.max_group_size, owner, "group_size", group_size,
                    f"must be <= WaveConfig.max_group_size = {config.max_group_size}")
        return cls(balanced=jnp.asarray(_flag(owner, "balanced", balanced), jnp.float32),
                   scheduled=jnp.asarray(_flag(owner, "scheduled", scheduled), jnp.float32),
                   group_size=jnp.asarray(g, jnp.int32),
                   offload_fraction=jnp.asarray(require_real(owner, "offload_fraction", offload_fraction, 0.0, 1.0,
                                                             hi_open=True), jnp.float32))


class WaveSample(NamedTuple):
    """One wave (scalars)."""

    waves: jax.Array  # i32[] sensing rounds: max plane load after hot-plane offload
    ideal_waves: jax.Array  # i32[] ceil((pages − offloaded) / planes)
    amplification: jax.Array  # f32[] waves / ideal_waves (1 when ideal_waves = 0)
    offloaded_pages: jax.Array  # i32[] pages served from base-die SRAM
    pages: jax.Array  # i32[] pages in the wave


def _prefix_sum(x: jax.Array) -> jax.Array:
    """Inclusive prefix sum of a small non-negative int32 vector (totals < 2^24), by 64-wide blocks.

    XLA's CPU cumsum is quadratic-ish (about 80 µs for 3,072 int32 under vmap on the 2-core CI
    machine); a block-triangular float32 matmul is exact for such counts and about 8× faster."""
    n = x.shape[-1]
    pad = -n % _BLOCK
    blocks = jnp.pad(x.astype(jnp.float32), (0, pad)).reshape(-1, _BLOCK) @ _UPPER  # within-block sums
    ends = blocks[:, -1]
    before = jnp.cumsum(ends) - ends  # sum of the earlier blocks (a short cumsum)
    return (blocks + before[:, None]).reshape(-1)[:n].astype(jnp.int32)


_BLOCK = 64
_UPPER = np.triu(np.ones((_BLOCK, _BLOCK), np.float32))


def _greedy_group_counts(count: jax.Array, stripes: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The rank-greedy's pick from window counts ``count`` (int32[P], by group id): stripes per group,
    the group of the last pick (the partial stripe), and whether the greedy stayed within ``LEVELS``
    ranks (else the caller reads the wave in order). See the module docstring."""
    depth = counting.bincount(jnp.minimum(count, LEVELS), jnp.ones_like(count), LEVELS + 1)  # groups with c_g = v
    at_least = jnp.cumsum(depth[::-1])[::-1]  # int32[LEVELS + 1]: groups with c_g ≥ v (exact for v ≤ LEVELS)
    taken = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(at_least[1:])])  # T(r), r = 0…LEVELS
    fits = taken[LEVELS] >= stripes
    rank = jnp.clip(jnp.sum(taken < stripes) - 1, 0, LEVELS - 1)  # r*: the first rank not taken in full
    extra = stripes - taken[rank]  # m ≥ 1 picks of rank r* (m = 0 for an empty wave)
    above = count > rank
    order = _prefix_sum(above)
    picked = above & (order <= extra)
    return jnp.minimum(count, rank) + picked, jnp.argmax(picked & (order == extra)).astype(jnp.int32), fits


def plane_load_sample(words: tuple, pages: jax.Array, knobs: WaveKnobs, config: WaveConfig) -> jax.Array:
    """int32[P]: the wave's pages on each plane, before offload (placement and scheduling as modelled above).

    Stripe s < P is the s-th stripe in read order; the look-ahead window's further candidates are
    stripes P, P + 1, … (so the in-order wave, stripes 0…S − 1, is drawn the same with scheduling on)."""
    planes, extra_max = config.planes, (config.candidates - 1) * config.planes
    n = jnp.clip(jnp.asarray(pages, jnp.int32), 0, planes)
    balanced = knobs.balanced > 0.5
    g = jnp.where(balanced, jnp.clip(knobs.group_size, 1, planes), 1)
    n_groups = group_count(planes, g)
    stripes = (n + g - 1) // g  # S ≤ P
    partial_pages = jnp.where(n > 0, n - (stripes - 1) * g, 0)  # q: pages of the last stripe
    stripe = jnp.arange(planes + extra_max, dtype=jnp.int32)
    start = place_pages("random", (*words, Salt.WAVE_STRIPE), stripe, planes, PlacementKnobs.make())
    group = jnp.minimum(start // g, n_groups - 1)  # int32[C·P]
    in_order = counting.bincount(group[:planes], stripe[:planes] < stripes, planes)  # int32[P] by group id
    pending = stripe[planes:] - planes < (config.candidates - 1) * stripes  # the window's further candidates
    lookahead = counting.bincount(group[planes:], pending, planes)
    greedy, greedy_partial, fits = _greedy_group_counts(in_order + lookahead, stripes)
    scheduled = balanced & (knobs.scheduled > 0.5) & fits
    last = jnp.maximum(stripes - 1, 0)
    per_group = jnp.where(scheduled, greedy, in_order)
    partial_group = jnp.where(scheduled, greedy_partial, group[last])
    group_id = jnp.arange(planes, dtype=jnp.int32)
    full = per_group - ((group_id == partial_group) & (n > 0))  # full stripes per group
    plane_group = group_id // g  # group of each plane
    full_load = jnp.where(plane_group < n_groups, full[jnp.minimum(plane_group, planes - 1)], 0)
    # the partial stripe's q pages: from its start offset, wrapping in its group (in the scheduled case
    # the offset of stripe S − 1 stands in: every plane of that group holds the same full load)
    lane = (group_id - partial_group * g - start[last] % g) % g  # stripe index a plane of the group gets
    return full_load + ((plane_group == partial_group) & (lane < partial_pages))


def serve_hot_planes_from_sram(loads: jax.Array, fraction: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``collide.offload_hot_planes`` with its cheap ``LEVELS``-bin histogram: (loads left [P], pages offloaded []).

    A wave piling more than ``LEVELS`` pages on one plane (never drawn in practice: P(any plane above 64)
    < 1e-80 for 3,072 random pages on 3,072 planes) is served without offload, pages conserved."""
    fits = max_load(loads) <= LEVELS
    cut, cut_pages = offload_hot_planes(jnp.where(fits, loads, 0), fraction, LEVELS)
    return jnp.where(fits, cut, loads), jnp.where(fits, cut_pages, 0)


def wave_sample(words: tuple, pages: jax.Array, knobs: WaveKnobs, config: WaveConfig) -> WaveSample:
    """One scheduling wave of ``pages`` (int32[], 0…P; clipped to it) KV pages (HBFlex §3.1, §5.2, §6.4).

    ``words`` identify the wave (e.g. ``(seed, stream, pass, layer)``) and seed every hash."""
    n = jnp.clip(jnp.asarray(pages, jnp.int32), 0, config.planes)
    served, offloaded = serve_hot_planes_from_sram(plane_load_sample(words, n, knobs, config), knobs.offload_fraction)
    waves = max_load(served)
    ideal = ideal_waves(n - offloaded, config.planes)
    amplification = jnp.where(ideal > 0, waves.astype(jnp.float32) / jnp.maximum(ideal, 1).astype(jnp.float32), 1.0)
    return WaveSample(waves=waves, ideal_waves=ideal, amplification=amplification, offloaded_pages=offloaded,
                      pages=n)


# --- a tabulated wave law: the serving step's cheap draw ------------------------------------------

TABLE_LEVELS = 24  # wave sizes tabulated, geometric from 1 page to P
TABLE_SAMPLES = 256  # draws per size


class WaveTable(NamedTuple):
    """The law of one wave's sensing rounds at ``TABLE_LEVELS`` sizes, from ``TABLE_SAMPLES`` exact draws each
    (:func:`wave_sample`), for a serving step that cannot afford an O(P) draw per pass."""

    pages: jax.Array  # f32[L] tabulated wave sizes: round(P^(l / (L − 1))), 1 … P
    waves: jax.Array  # f32[L, S] sensing rounds of the draws at each size, ascending
    offloaded: jax.Array  # f32[L, S] offloaded pages of the same draws (in the waves' order)
    planes: jax.Array  # f32[] P


@jax.jit
def _table_draws(words, sizes, knobs: WaveKnobs, planes_hint):
    config = WaveConfig(planes=planes_hint.shape[0], max_group_size=planes_hint.shape[0])
    draw = jnp.arange(TABLE_SAMPLES, dtype=jnp.uint32)

    def at(size):
        return jax.vmap(lambda d: wave_sample((*words, size, d), size, knobs, config))(draw)

    out = jax.vmap(at)(sizes)
    order = jnp.argsort(out.waves, axis=1, stable=True)
    take = lambda a: jnp.take_along_axis(a, order, axis=1).astype(jnp.float32)  # noqa: E731
    return take(out.waves), take(out.offloaded_pages)


def tabulate(knobs: WaveKnobs, planes: int, seed: int = 0) -> WaveTable:
    """The tabulated law of waves on ``planes`` planes under ``knobs`` (host call; one compilation per
    plane count). Its draws use their own salt, apart from the streams' words."""
    require_int("tabulate", "planes", planes, 1, MAX_PLANES // MAX_CANDIDATES)
    sizes = np.unique(np.round(planes ** (np.arange(TABLE_LEVELS) / (TABLE_LEVELS - 1))).astype(np.int64))
    sizes = np.interp(np.linspace(0, len(sizes) - 1, TABLE_LEVELS), np.arange(len(sizes)), sizes).round()
    words = (jnp.uint32(seed), jnp.uint32(Salt.WAVE_TABLE))
    waves, offloaded = _table_draws(words, jnp.asarray(sizes, jnp.int32), knobs, jnp.zeros(planes, jnp.int8))
    return WaveTable(pages=jnp.asarray(sizes, jnp.float32), waves=waves, offloaded=offloaded,
                     planes=jnp.float32(planes))


def _bracket(table: WaveTable, pages, u):
    """(n, draw index, lower and upper tabulated size index, interpolation weight) of a wave of ``pages``
    drawn with the uniform ``u`` (:func:`draw`)."""
    n = jnp.clip(jnp.asarray(pages, jnp.float32), 0.0, table.planes)
    s = table.waves.shape[1]
    idx = jnp.clip((jnp.asarray(u, jnp.float32) * s).astype(jnp.int32), 0, s - 1)
    hi = jnp.clip(jnp.searchsorted(table.pages, n, side="left"), 1, table.pages.shape[0] - 1)
    lo = hi - 1
    t = jnp.clip((n - table.pages[lo]) / jnp.maximum(table.pages[hi] - table.pages[lo], 1.0), 0.0, 1.0)
    return n, idx, lo, hi, t


def draw(table: WaveTable, pages, u) -> tuple[jax.Array, jax.Array]:
    """(waves, offloaded pages), float32[], of one wave of ``pages`` (0 … P) drawn from ``table`` with the
    uniform ``u``: the u-quantile at the two tabulated sizes around ``pages``, interpolated linearly
    in size. An empty wave has 0 waves."""
    n, idx, lo, hi, t = _bracket(table, pages, u)
    mix_ = lambda a: (1.0 - t) * a[lo, idx] + t * a[hi, idx]  # noqa: E731
    empty = n <= 0
    return jnp.where(empty, 0.0, mix_(table.waves)), jnp.where(empty, 0.0, mix_(table.offloaded))


def draw_ideal(table: WaveTable, pages, u) -> jax.Array:
    """float32[]: the balanced minimum of the wave :func:`draw` gives for the same ``pages`` and ``u``,
    ceil((size − offloaded) / P) of each of the two tabulated draws interpolated in size exactly as the
    waves are. Each tabulated draw has waves >= its own ideal, so the interpolated waves are never below
    the interpolated ideal: the amplification waves / ideal of a drawn wave is >= 1 (an ideal taken from
    the interpolated sizes could exceed the interpolated waves, which mix a size whose draw is wholly
    offloaded with one that is not). An empty wave has ideal 0."""
    n, idx, lo, hi, t = _bracket(table, pages, u)
    ideal = lambda k: jnp.ceil(jnp.maximum(table.pages[k] - table.offloaded[k, idx], 0.0) / table.planes)  # noqa: E731
    return jnp.where(n <= 0, 0.0, (1.0 - t) * ideal(lo) + t * ideal(hi))


def runs_of(pages, run_pages, planes) -> tuple[jax.Array, jax.Array]:
    """(runs in one wave, waves the read takes), float32[], for a read of ``pages`` pages that lie in runs
    of ``run_pages`` consecutive pages on one plane each (a block's pages: block-first placement, HBFlex
    §6.3), every run on an independent uniform plane: a wave is at most one run per plane's worth,
    ``min(runs, P)`` runs, and the read takes ``ceil(runs / P)`` of them. With ``run_pages = 1`` these are
    the single-page wave and read count (``min(pages, P)``, ``ceil(pages / P)``)."""
    runs = jnp.ceil(jnp.asarray(pages, jnp.float32) / run_pages)
    return jnp.minimum(runs, planes), jnp.ceil(runs / planes)


def wave_pages(runs, run_pages, pages) -> jax.Array:
    """float32[] pages in a wave of ``runs`` runs of ``run_pages`` pages of a ``pages``-page read (the last
    run of a read may be short)."""
    return jnp.minimum(runs * run_pages, pages)


def in_pages(waves, offloaded, ideal, runs, run_pages, pages, planes) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(waves, offloaded pages, ideal waves) of a wave of ``runs`` runs of ``run_pages`` pages from a draw of
    the same number of single pages (``waves``, ``offloaded``, ``ideal`` of ``runs`` balls in P planes): a
    plane holding k runs reads k × run_pages pages one after another, but no more than the wave's pages
    (``min(runs × run_pages, pages)``: the last run of a read may be short); the ideal is the wave's pages
    spread perfectly, ceil((pages − offloaded) / P). With ``run_pages = 1`` the draw is returned as it is."""
    n_wave = wave_pages(runs, run_pages, pages)
    off = jnp.minimum(run_pages * offloaded, n_wave)
    clustered_ideal = jnp.ceil(jnp.maximum(n_wave - off, 0.0) / planes)
    single = run_pages <= 1.0
    return (jnp.where(single, waves, jnp.minimum(run_pages * waves, n_wave)), jnp.where(single, offloaded, off),
            jnp.where(single, ideal, clustered_ideal))
