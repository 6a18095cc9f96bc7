"""Plane collisions: how the pages of a read land on HBF planes, and what that costs (HBFlex §3.1, §5.2).

A read is a set of physical pages. Each plane senses its pages one after another, so the read takes
``waves = max over planes of pages on that plane`` sensing rounds: ``waves × tR``, never below
``bytes / bandwidth``. Read-wave amplification is ``waves / ceil(pages / planes)`` (HBFlex §6.4).

Placement policies map (stream, request, logical page, physical page) to a plane through the counter
hash of ``hbfjax.rng`` — no per-page table is stored (DESIGN.md §4):

* ``random``: every physical page on an independent uniform plane.
* ``isolated``: a request's pages fill its own blocks in order; a block lives on one plane, so a read
  of n pages touches only ceil(n / pages-per-block) planes (request-isolated blocks, HBFlex §3.3).
* ``plane-group``: planes split into groups of G; a logical page of L physical pages is striped over
  L distinct planes of its group (from a random offset, wrapping when L > G); logical pages go to
  the least-loaded group (HBFlex §5.2, Fig. 11b/12). With G = planes and L = 1 this is ``random``.

Runtime balancing (HBFlex §5.2): hot-plane offload serves the excess pages of the top fraction f of
planes from base-die SRAM (``offload_hot_planes``); shared-prefix replicas and placement-aware chunk
scheduling live in ``hbfjax.flash.reads.workingset``. G, f, L and the page count are traced knobs, so one
compilation covers a sweep over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax import counting, rng
from hbfjax.salts import Salt
from hbfjax.validate import ConfigError, require, require_int, require_real

PLACEMENTS = ("random", "isolated", "plane-group")
# Static bounds that keep every per-stream array and int32 count small enough: a plane id, a page
# index and a page count stay far below 2^31, and one stream's read fits in memory.
MAX_PLANES = 2**24
MAX_READ_PAGES = 2**24



@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PlacementKnobs:
    """Traced placement knobs (each a scalar array; stack a leading axis to sweep)."""

    group_size: jax.Array  # int32 [] planes per plane group G (plane-group)
    pages_per_logical: jax.Array  # int32 [] physical pages per logical KV page L (plane-group)
    pages_per_block: jax.Array  # int32 [] pages a request fills on one plane before the next (isolated)
    offload_fraction: jax.Array  # float32 [] fraction f of top-loaded planes whose excess goes to SRAM

    @classmethod
    def make(cls, group_size=1, pages_per_logical=1, pages_per_block=512, offload_fraction=0.0) -> "PlacementKnobs":
        """Validated placement knobs: G, L and pages per block are whole counts >= 1, f lies in [0, 1).

        The ``jnp.maximum(·, 1)`` guards in the traced code only keep a swept knob point from dividing
        by zero; a bad value is refused here, never replaced."""
        owner = cls.__name__
        for name, v in (("group_size", group_size), ("pages_per_logical", pages_per_logical),
                        ("pages_per_block", pages_per_block)):
            require_int(owner, name, v, 1)
        require_real(owner, "offload_fraction", offload_fraction, 0.0, 1.0, hi_open=True)
        return cls(group_size=jnp.asarray(group_size, jnp.int32),
                   pages_per_logical=jnp.asarray(pages_per_logical, jnp.int32),
                   pages_per_block=jnp.asarray(pages_per_block, jnp.int32),
                   offload_fraction=jnp.asarray(offload_fraction, jnp.float32))


def _validate_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement = {placement!r}: choose one of {PLACEMENTS}")


def check_group_size(planes: int, group_size: int) -> None:
    """Raise ConfigError unless G is a whole divisor of the planes (every plane in exactly one group)."""
    require_int("", "group_size", group_size, 1)
    if not 1 <= group_size <= planes or planes % group_size:
        raise ConfigError(f"group_size = {group_size}: plane groups must divide the {planes} planes evenly "
                        f"(1 <= G <= {planes}, {planes} % G == 0)")


def group_count(planes: int, group_size: jax.Array) -> jax.Array:
    """Whole plane groups of G planes (planes beyond the last whole group stay unused)."""
    return jnp.maximum(planes // jnp.maximum(group_size, 1), 1)


def striped_plane(group: jax.Array, offset: jax.Array, stripe_index: jax.Array, group_size: jax.Array) -> jax.Array:
    """Plane of the ``stripe_index``-th physical page of a logical page striped over a group (HBFlex Fig. 11b)."""
    g = jnp.maximum(group_size, 1)
    return group * g + (offset + stripe_index) % g


def place_pages(placement: str, words: tuple, page_index: jax.Array, planes: int, knobs: PlacementKnobs,
                group: jax.Array | None = None) -> jax.Array:
    """Plane (int32) of each physical page ``page_index`` of one request's read.

    ``words`` identify the request (e.g. ``(seed, stream, request, layer)``) and seed every hash.
    For ``plane-group``, ``group`` gives each page's group (from least-loaded allocation); by
    default logical pages cycle through the groups from a random starting group — in a single read
    every page is a fresh allocation, so least-loaded allocation visits the groups in turn.
    """
    _validate_placement(placement)
    if placement == "random":
        return rng.uniform_index(rng.mix(*words, Salt.PLACE_RANDOM, page_index), planes)
    if placement == "isolated":
        block = page_index // jnp.maximum(knobs.pages_per_block, 1)
        return rng.uniform_index(rng.mix(*words, Salt.PLACE_BLOCK, block), planes)
    size = jnp.maximum(knobs.pages_per_logical, 1)
    logical, stripe = page_index // size, page_index % size
    n_groups = group_count(planes, knobs.group_size)
    if group is None:
        start = rng.uniform_index(rng.mix(*words, Salt.PLACE_GROUP_START), n_groups)
        group = (start + logical) % n_groups
    # the offset shares the random page's salt: G = planes, L = 1 reproduces random placement exactly
    offset = rng.uniform_index(rng.mix(*words, Salt.PLACE_RANDOM, logical), jnp.maximum(knobs.group_size, 1))
    return striped_plane(group, offset, stripe, knobs.group_size)


def plane_loads(plane: jax.Array, valid: jax.Array, planes: int) -> jax.Array:
    """int32 [planes]: pages on each plane; ``valid`` (bool or int32 weight) masks pages out.

    Counts are int32 (float scatter-add is slow on some jaxlib releases, DESIGN.md §3). Plane ids
    must lie in [0, planes).
    """
    return counting.bincount(plane, valid, planes)


def max_load(loads: jax.Array) -> jax.Array:
    """Max over the last (plane) axis by pairwise halving.

    XLA's CPU backend does not vectorise an integer max-reduction (about 0.5 G elements/s on the
    2-core CI machine), but it does vectorise elementwise ``maximum``: halving the axis first makes
    the reduction about 4× faster, and it is exact.
    """
    while loads.shape[-1] % 2 == 0 and loads.shape[-1] > 8:
        half = loads.shape[-1] // 2
        loads = jnp.maximum(loads[..., :half], loads[..., half:])
    return jnp.max(loads, axis=-1)


def offload_hot_planes(loads: jax.Array, fraction: jax.Array, load_bound: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Serve the excess pages of the top ``fraction`` of planes from SRAM (HBFlex §5.2, §6.5).

    The k = round(f × planes) most loaded planes are cut down to the load of the next plane in
    rank order (the (k+1)-th highest); their excess pages are read from SRAM instead. Returns
    (loads left on the planes [planes], pages offloaded []).

    With a static bound ``load_bound`` on any plane's load, that level comes from a histogram of the
    loads (one small scatter) instead of a sort of all planes, which is several times cheaper.
    """
    planes = loads.shape[-1]
    k = jnp.clip(jnp.round(fraction * planes).astype(jnp.int32), 0, planes - 1)
    if load_bound is None:
        level = (-jnp.sort(-loads))[k]  # load of the highest plane that is not offloaded
    else:
        at_least = jnp.cumsum(plane_loads(loads, jnp.ones_like(loads), load_bound + 1)[::-1])[::-1]  # planes ≥ v
        level = jnp.sum(at_least[1:] >= k + 1)  # largest v with more than k planes at load ≥ v
    capped = jnp.minimum(loads, jnp.where(k > 0, level, max_load(loads)))
    return capped, jnp.sum(loads - capped)


def ideal_waves(pages: jax.Array, planes: int) -> jax.Array:
    """ceil(pages / planes): the waves of a perfectly balanced read (at least one for a non-empty read)."""
    return (pages + planes - 1) // planes


def read_time_us(waves: jax.Array, pages: jax.Array, page_bytes: int, t_read_us: float, read_bw_gbps: float) -> jax.Array:
    """waves × tR, never below the bytes over the package bandwidth (DESIGN.md §4)."""
    transfer_us = pages.astype(jnp.float32) * page_bytes / (read_bw_gbps * 1e3)
    return jnp.maximum(waves.astype(jnp.float32) * t_read_us, transfer_us)


@dataclass(frozen=True)
class ReadConfig:
    """Static shape of the single-read workload: ``max_pages`` bounds the traced page count."""

    planes: int
    max_pages: int
    placement: str
    page_bytes: int = 4096
    t_read_us: float = 4.0
    read_bw_gbps: float = 2928.0
    offload: bool = True  # compute hot-plane offload (False: the offload fraction knob is ignored)

    def __post_init__(self):
        _validate_placement(self.placement)
        require_int("ReadConfig", "planes", self.planes, 1, MAX_PLANES)
        require_int("ReadConfig", "max_pages", self.max_pages, 1, MAX_READ_PAGES)
        require_int("ReadConfig", "page_bytes", self.page_bytes, 1)
        for name in ("t_read_us", "read_bw_gbps"):
            require_real("ReadConfig", name, getattr(self, name), 0.0, lo_open=True)
        require(isinstance(self.offload, bool), "ReadConfig", "offload", self.offload, "must be a bool")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ReadKnobs:
    pages: jax.Array  # int32 [] pages in the read (≤ config.max_pages)
    placement: PlacementKnobs


class ReadOutput(NamedTuple):
    """One stream's read (scalars)."""

    waves: jax.Array  # i32[] sensing rounds after hot-plane offload
    raw_waves: jax.Array  # i32[] sensing rounds before offload
    ideal_waves: jax.Array  # i32[] ceil(pages / planes)
    amplification: jax.Array  # f32[] waves / ideal_waves
    max_to_avg_load: jax.Array  # f32[] waves / (pages / planes)
    offloaded_pages: jax.Array  # i32[] pages served from SRAM
    read_time_us: jax.Array  # f32[] waves × tR, never below bytes / bandwidth


def simulate(stream_id: jax.Array, seed: jax.Array, knobs: ReadKnobs, inputs: None, config: ReadConfig) -> ReadOutput:
    """One read of ``knobs.pages`` pages of one request on ``config.planes`` planes (HBFlex Fig. 6/7a).

    The read consumes no inputs (``inputs`` is None). The ideal counts only the pages read from planes
    (pages − offloaded), so waves ≥ ideal_waves and amplification ≥ 1 always; a read whose every page
    is served from SRAM has 0 waves, 0 ideal waves and amplification 1.
    """
    page = jnp.arange(config.max_pages, dtype=jnp.int32)
    valid = page < knobs.pages
    plane = place_pages(config.placement, (seed, stream_id), page, config.planes, knobs.placement)
    loads = plane_loads(plane, valid, config.planes)
    if config.offload:
        served, offloaded = offload_hot_planes(loads, knobs.placement.offload_fraction, config.max_pages)
    else:
        served, offloaded = loads, jnp.int32(0)
    waves = max_load(served)
    ideal = ideal_waves(knobs.pages - offloaded, config.planes)
    mean_load = knobs.pages.astype(jnp.float32) / config.planes
    return ReadOutput(
        waves=waves,
        raw_waves=max_load(loads),
        ideal_waves=ideal,
        amplification=jnp.where(ideal > 0, waves.astype(jnp.float32) / jnp.maximum(ideal, 1).astype(jnp.float32),
                                1.0),
        max_to_avg_load=waves.astype(jnp.float32) / jnp.maximum(mean_load, 1e-9),
        offloaded_pages=offloaded,
        read_time_us=read_time_us(waves, knobs.pages, config.page_bytes, config.t_read_us, config.read_bw_gbps),
    )
