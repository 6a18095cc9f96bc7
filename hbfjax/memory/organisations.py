"""Memory organisations as data: one knobs pytree per organisation, and a registry of named constructors
(DESIGN.md §5 "A memory organisation is data"; DASH §IV, §V-A, §VI-A Fig. 8).

An organisation is the links between GPU, HBM and HBF (0 GB/s = absent), the stacks and their
geometry, the base-die SRAM regions, where each data kind lives and how expert delivery is split
over the Direct (GPU–HBF) and Relay (HBF–HBM base die–GPU) paths. Every field is a traced float32
array, so the four DASH organisations stack on one knob axis (:func:`hbfjax.batch.stack_knobs`),
compile once and are compared on common random numbers. Counts (stacks, parallel units, regions)
are traced too: they scale rates, they set no shape.

Units: bandwidths in GB/s (1e9 B/s) per physical link per direction, or per stack; sizes in bytes;
latencies in µs. Rates are aggregated over stacks assuming every data kind is striped evenly over
the stacks (DASH §V-A2 stripes each expert over dies and planes).

**Placement** ``place``: float32[K, 3] over :data:`KINDS` × :data:`TIERS`; each row on the simplex.
Column ``hbm`` is the share of the kind's bytes held only in HBM, ``hbf`` only in HBF, and
``replicated`` the share with a full copy in *both* tiers, read from the two in parallel with the
split chosen per read to balance the paths (DASH §V-B "Parallel HBM/HBF Read"). A replicated share
costs capacity in both tiers. DASH: dense (attention) weights ``[0, 0, 1]``, experts and prefill KV
``[0, 1, 0]``, decode KV ``[1, 0, 0]`` (appended in HBM, written back to HBF by the writeback
mechanism, DASH §V-A1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import hardware
from hbfjax.hardware import MiB
from hbfjax.validate import ConfigError, require, require_int, require_real

KINDS = ("dense_weights", "expert_weights", "prefill_kv", "decode_kv")  # dense: all non-expert weights
TIERS = ("hbm", "hbf", "replicated")
DENSE_WEIGHTS, EXPERT_WEIGHTS, PREFILL_KV, DECODE_KV = range(len(KINDS))
HBM, HBF, REPLICATED = range(len(TIERS))

MAX_GBPS = 1e7  # 10 PB/s: keeps every rate × µs product finite in float32
MAX_BYTES = 1e15
MAX_US = 1e9
MAX_COUNT = 2**20


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class OrgKnobs:
    """A memory organisation (traced; every leaf float32, ``place`` float32[K, 3], the rest float32[])."""

    gpu_hbm_gbps: jax.Array  # f32[] one GPU–HBM link, per direction (0: absent)
    direct_gbps: jax.Array  # f32[] one GPU–HBF link (the Direct path), per direction (0: absent)
    relay_gbps: jax.Array  # f32[] one HBM–HBF link of a stack pair (the Relay path), per direction (0: absent)
    hbm_stacks: jax.Array  # f32[] HBM stacks (each with one GPU–HBM link)
    hbf_stacks: jax.Array  # f32[] HBF stacks (each with one GPU–HBF link); pairs = min(hbm, hbf) stacks
    hbm_capacity_bytes: jax.Array  # f32[] per HBM stack
    hbm_bw_gbps: jax.Array  # f32[] HBM cell-array read bandwidth per stack (the Relay path bypasses it)
    hbf_capacity_bytes: jax.Array  # f32[] per HBF stack
    parallel_units: jax.Array  # f32[] independently accessible arrays per HBF stack (dies × planes × subarrays)
    page_bytes: jax.Array  # f32[] HBF page
    t_read_us: jax.Array  # f32[] tR: sensing one page wave into base-die SRAM
    t_prog_us: jax.Array  # f32[] tPROG: programming one page wave
    hbf_sram_region_bytes: jax.Array  # f32[] one HBF base-die transfer region (DASH: 8 MiB)
    hbf_sram_regions: jax.Array  # f32[] regions per HBF stack (DASH: 2, double buffering)
    relay_sram_region_bytes: jax.Array  # f32[] one HBM base-die relay chunk region (DASH: 4 MiB)
    relay_sram_regions: jax.Array  # f32[] regions per HBM stack (DASH: 2)
    place: jax.Array  # f32[K, 3] data kind × (hbm only, hbf only, replicated); rows on the simplex
    balanced_split: jax.Array  # f32[] 1: whole experts split to minimise max(T_Direct, T_Relay); 0: relay_fraction
    relay_fraction: jax.Array  # f32[] share of the needed experts sent over Relay when balanced_split = 0
    lookahead: jax.Array  # f32[] 1: early expert selection hides tR (DASH §V-C); 0: tR exposed
    shared_array_rate: jax.Array  # f32[] 1: Direct + Relay together <= the stack's array rate (physical); 0: per path
    hbf_write_gbps: jax.Array  # f32[] programs per HBF stack (HBFlex §6.1: 27.2 GB/s); MAX_GBPS: only the route
    tr_sets_rate: jax.Array  # f32[] 1: tR is a latency and sets the array/SRAM rate (one wave per tR); 0: latency only
    rate_t_read_us: jax.Array  # f32[] the tR whose wave rate the arrays keep when tr_sets_rate = 0 (DASH: 3 µs)
    write_window_layers: jax.Array  # f32[] N: a layer's KV writes may overlap the windows of N layers (DASH: 1)
    hbf_interface_gbps: jax.Array  # f32[] one HBF stack's interface read rate (a part's datasheet); MAX_GBPS: none

    @classmethod
    def make(cls, *, gpu_hbm_gbps, direct_gbps, relay_gbps, hbm_stacks, hbf_stacks, hbm_capacity_bytes,
             hbm_bw_gbps, hbf_capacity_bytes, parallel_units, page_bytes, t_read_us, t_prog_us,
             hbf_sram_region_bytes, hbf_sram_regions=2, relay_sram_region_bytes=4 * MiB, relay_sram_regions=2,
             place=None, balanced_split=1.0, relay_fraction=0.5, lookahead=1.0,
             shared_array_rate=1.0, hbf_write_gbps=MAX_GBPS, tr_sets_rate=1.0, rate_t_read_us=None,
             write_window_layers=1, hbf_interface_gbps=MAX_GBPS) -> "OrgKnobs":
        """Validated knobs. Links are finite and >= 0; HBM stacks a whole number >= 0 (0: an all-HBF
        package, HBFlex, with no GPU–HBM or Relay link); HBF stacks, units and regions whole numbers >= 1;
        sizes and times > 0 with tPROG >= tR and pages a multiple of 512 B; ``place`` rows on the
        simplex (``None``: DASH's placement); flags 0 or 1; every tier a placed kind uses must be
        reachable (HBM through a GPU–HBM link, HBF through Direct or Relay), and a fixed split may
        send experts only over paths that exist. ``rate_t_read_us`` (``None``: ``t_read_us``) is the
        reference tR of the latency-only reading (``tr_sets_rate = 0``); ``write_window_layers`` a
        whole number of layers >= 1; ``hbf_interface_gbps`` > 0 caps what a stack's arrays can send out
        (``MAX_GBPS``: only the links and arrays, as in both papers)."""
        c = cls.__name__
        for name, value in (("gpu_hbm_gbps", gpu_hbm_gbps), ("direct_gbps", direct_gbps),
                            ("relay_gbps", relay_gbps), ("hbm_bw_gbps", hbm_bw_gbps)):
            require_real(c, name, value, 0.0, MAX_GBPS)
        require_real(c, "hbf_write_gbps", hbf_write_gbps, 0.0, MAX_GBPS, lo_open=True)
        require_real(c, "hbf_interface_gbps", hbf_interface_gbps, 0.0, MAX_GBPS, lo_open=True)
        require_int(c, "hbm_stacks", hbm_stacks, 0, MAX_COUNT)
        require(hbm_stacks > 0 or (gpu_hbm_gbps == 0 and relay_gbps == 0), c, "hbm_stacks", hbm_stacks,
                f"0 HBM stacks leave no GPU–HBM or Relay link (gpu_hbm_gbps = {gpu_hbm_gbps}, "
                f"relay_gbps = {relay_gbps}: must be 0)")
        require(hbm_bw_gbps > 0, c, "hbm_bw_gbps", hbm_bw_gbps, "must be > 0")
        for name, value in (("hbf_stacks", hbf_stacks),
                            ("parallel_units", parallel_units), ("hbf_sram_regions", hbf_sram_regions),
                            ("relay_sram_regions", relay_sram_regions)):
            require_int(c, name, value, 1, MAX_COUNT)
        for name, value in (("hbm_capacity_bytes", hbm_capacity_bytes), ("hbf_capacity_bytes", hbf_capacity_bytes),
                            ("hbf_sram_region_bytes", hbf_sram_region_bytes),
                            ("relay_sram_region_bytes", relay_sram_region_bytes)):
            require_real(c, name, value, 0.0, MAX_BYTES, lo_open=True)
        require_int(c, "page_bytes", page_bytes, 512, int(MAX_BYTES))
        require(page_bytes % 512 == 0, c, "page_bytes", page_bytes, "must be a multiple of 512 B (a NAND page)")
        require_real(c, "t_read_us", t_read_us, 0.0, MAX_US, lo_open=True)
        require_real(c, "t_prog_us", t_prog_us, 0.0, MAX_US, lo_open=True)
        require(t_prog_us >= t_read_us, c, "t_prog_us", t_prog_us,
                f"a NAND program is slower than a read (t_read_us = {t_read_us})")
        rate_t_read_us = t_read_us if rate_t_read_us is None else rate_t_read_us
        require_real(c, "rate_t_read_us", rate_t_read_us, 0.0, MAX_US, lo_open=True)
        require_int(c, "write_window_layers", write_window_layers, 1, MAX_COUNT)
        for name, value in (("balanced_split", balanced_split), ("lookahead", lookahead),
                            ("shared_array_rate", shared_array_rate), ("tr_sets_rate", tr_sets_rate)):
            require(value in (0, 1) and not isinstance(value, bool), c, name, value, "must be 0 or 1")
        require_real(c, "relay_fraction", relay_fraction, 0.0, 1.0)
        place = dash_placement() if place is None else np.asarray(place, np.float64)
        _check_place(c, place)
        has_hbm = gpu_hbm_gbps > 0
        has_relay = relay_gbps > 0 and has_hbm
        has_hbf = direct_gbps > 0 or has_relay
        require(direct_gbps > 0 or relay_gbps > 0, c, "direct_gbps", direct_gbps,
                f"an HBF stack needs a path to the GPU: Direct or Relay (relay_gbps = {relay_gbps}) must be > 0")
        require(relay_gbps == 0 or has_hbm, c, "relay_gbps", relay_gbps,
                f"the Relay path runs over the GPU–HBM link (gpu_hbm_gbps = {gpu_hbm_gbps})")
        for k, kind in enumerate(KINDS):
            uses_hbm = place[k, HBM] > 0
            require(has_hbm or not uses_hbm, c, f"place[{kind}]", place[k].tolist(),
                    "places bytes only in HBM but gpu_hbm_gbps = 0")
            require(has_hbf or place[k, HBF] == 0, c, f"place[{kind}]", place[k].tolist(),
                    "places bytes only in HBF but no path reaches HBF")
        if balanced_split == 0:
            require(relay_fraction == 0 or has_relay, c, "relay_fraction", relay_fraction,
                    "sends experts over Relay, which is absent (relay_gbps or gpu_hbm_gbps = 0)")
            require(relay_fraction == 1 or direct_gbps > 0, c, "relay_fraction", relay_fraction,
                    "sends experts over Direct, which is absent (direct_gbps = 0)")
        f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(gpu_hbm_gbps=f(gpu_hbm_gbps), direct_gbps=f(direct_gbps), relay_gbps=f(relay_gbps),
                   hbm_stacks=f(hbm_stacks), hbf_stacks=f(hbf_stacks), hbm_capacity_bytes=f(hbm_capacity_bytes),
                   hbm_bw_gbps=f(hbm_bw_gbps), hbf_capacity_bytes=f(hbf_capacity_bytes),
                   parallel_units=f(parallel_units), page_bytes=f(page_bytes), t_read_us=f(t_read_us),
                   t_prog_us=f(t_prog_us), hbf_sram_region_bytes=f(hbf_sram_region_bytes),
                   hbf_sram_regions=f(hbf_sram_regions), relay_sram_region_bytes=f(relay_sram_region_bytes),
                   relay_sram_regions=f(relay_sram_regions), place=f(place), balanced_split=f(balanced_split),
                   relay_fraction=f(relay_fraction), lookahead=f(lookahead),
                   shared_array_rate=f(shared_array_rate), hbf_write_gbps=f(hbf_write_gbps),
                   tr_sets_rate=f(tr_sets_rate), rate_t_read_us=f(rate_t_read_us),
                   write_window_layers=f(write_window_layers), hbf_interface_gbps=f(hbf_interface_gbps))


def _check_place(owner: str, place: np.ndarray) -> None:
    require(place.shape == (len(KINDS), len(TIERS)), owner, "place", place.shape,
            f"must have shape ({len(KINDS)}, {len(TIERS)}): {KINDS} × {TIERS}")
    for k, kind in enumerate(KINDS):
        row = place[k]
        require(bool(np.all(np.isfinite(row)) and np.all(row >= 0) and abs(row.sum() - 1.0) <= 1e-6), owner,
                f"place[{kind}]", row.tolist(), "must be on the simplex: shares >= 0 summing to 1")


def dash_placement() -> np.ndarray:
    """float64[K, 3]: DASH §V-A1 / §VI-A: dense (QKV, output projection) weights replicated in both tiers,
    experts and prefill KV in HBF, decode KV in HBM (spilled to HBF by writeback)."""
    place = np.zeros((len(KINDS), len(TIERS)))
    place[DENSE_WEIGHTS, REPLICATED] = 1.0
    place[EXPERT_WEIGHTS, HBF] = 1.0
    place[PREFILL_KV, HBF] = 1.0
    place[DECODE_KV, HBM] = 1.0
    return place


def capacity_bytes(knobs: OrgKnobs) -> jax.Array:
    """float32[2]: total HBM and HBF capacity of the package."""
    return jnp.stack([knobs.hbm_stacks * knobs.hbm_capacity_bytes, knobs.hbf_stacks * knobs.hbf_capacity_bytes])


def tier_bytes(kind_bytes, knobs: OrgKnobs) -> jax.Array:
    """float32[..., 2]: bytes held in HBM and in HBF for ``kind_bytes`` (float32[..., K] per data kind):
    a kind's replicated share counts in both tiers."""
    place = knobs.place
    per_tier = place[:, (HBM, HBF)] + place[:, REPLICATED, None]  # f32[K, 2]
    return jnp.asarray(kind_bytes, jnp.float32) @ per_tier


def page_wave_bytes(knobs: OrgKnobs) -> jax.Array:
    """float32[]: one page on every parallel unit of every HBF stack (DASH §V-B: the write-back unit)."""
    return knobs.hbf_stacks * knobs.parallel_units * knobs.page_bytes


# --- the DASH organisations (Fig. 8) ---------------------------------------------------------------

_FIG8 = "DASH §VI-A Fig. 8"
_COMMON_SOURCES = (
    ("gpu_hbm_gbps", "DASH §IV-A: 1.6 TB/s usable per physical UCIe-A link (hardware.preset('dash').hbf.link_bw_gbps)"),
    ("direct_gbps", "DASH §IV-A: 1.6 TB/s usable per physical UCIe-A link"),
    ("relay_gbps", "DASH §IV-A: 1.6 TB/s usable per physical UCIe-A link"),
    ("hbm_stacks", f"{_FIG8}: two 24 GB HBM stacks"),
    ("hbf_stacks", f"{_FIG8}: two 512 GB HBF stacks"),
    ("hbm_capacity_bytes", "DASH §VI-A: 24 GB HBM3E per stack (hardware.preset('dash').hbm)"),
    ("hbm_bw_gbps", "hardware.preset('dash').hbm: HBFlex §6.1 (HBM3e 0.8 TB/s per stack)"),
    ("hbf_capacity_bytes", "DASH §VI-A: 512 GB per HBF stack (the preset's geometry: 511 GB)"),
    ("parallel_units", "DASH §VI-A: 16 dies × 32 planes × 4 subarrays (assumed) per stack"),
    ("page_bytes", "DASH §VI-A: 4 KiB pages"),
    ("t_read_us", "DASH §VI-A: nominal tR = 3 µs"),
    ("t_prog_us", "DASH §VI-A: nominal tPROG = 100 µs"),
    ("hbf_sram_region_bytes", "DASH §IV-B: 2 × 8 MiB usable transfer regions per HBF stack (one page wave each)"),
    ("relay_sram_region_bytes", "DASH §IV-B: 2 × 4 MiB relay regions per HBM stack"),
    ("place", "DASH §V-A1, §VI-A: experts in HBF, QKV and output projections replicated, "
              "prefill KV to HBF, decode KV appended in HBM"),
    ("balanced_split", "DASH §VI-E: each active expert entirely on Direct or Relay, T = max(T_Direct, T_Relay); "
                       "the balancing rule is hbfjax's (the paper does not state its assignment)"),
    ("lookahead", "DASH §V-C: early selection (turn off for routers with expert-specific bias)"),
    ("shared_array_rate", "DESIGN.md §4: both paths drain one stack's arrays (physical limit); the paper's "
                          "ratios need each path alone (review 2026-12-02 DASH fidelity §4.1): --array-rate"),
    ("tr_sets_rate", "DASH §VI-A: one 8 MiB page wave per tR (Fig. 12's 'lower tR ... increases the effective "
                     "aggregate read bandwidth'); Fig. 11's reductions need tR as a latency only: --tr-model"),
    ("rate_t_read_us", "DASH §VI-A: the nominal tR = 3 µs (the array rate the latency-only reading keeps)"),
    ("write_window_layers", "DASH §V-B: programs overlap 'the following attention computation' (one layer); "
                            "§VI-F's 'alongside independent work' allows more: --write-window-layers"),
)


def _dash_values() -> dict:
    """OrgKnobs.make arguments of DASH, from ``hardware.preset('dash')`` where it has them."""
    system = hardware.preset("dash")
    hbf, hbm = system.hbf, system.hbm
    return dict(
        gpu_hbm_gbps=hbf.link_bw_gbps, direct_gbps=hbf.link_bw_gbps, relay_gbps=hbf.link_bw_gbps,
        hbm_stacks=hbm.stacks, hbf_stacks=hbf.stacks, hbm_capacity_bytes=hbm.capacity_bytes_per_stack,
        hbm_bw_gbps=hbm.bw_gbps_per_stack, hbf_capacity_bytes=hbf.capacity_bytes / hbf.stacks,
        parallel_units=hbf.parallel_units // hbf.stacks, page_bytes=hbf.page_bytes, t_read_us=hbf.t_read_us,
        t_prog_us=hbf.t_prog_us, rate_t_read_us=hbf.t_read_us,
        hbf_sram_region_bytes=hbf.sram_bytes_per_stack // hbf.sram_regions_per_stack,
        hbf_sram_regions=hbf.sram_regions_per_stack,
        relay_sram_region_bytes=hbm.relay_sram_bytes_per_stack // hbm.relay_sram_regions_per_stack,
        relay_sram_regions=hbm.relay_sram_regions_per_stack,
    )


def _organisation(changes: dict, link_gbps: float | None, **fixed) -> OrgKnobs:
    """DASH's values, then ``fixed`` (what names the organisation), then ``link_gbps`` on every link that
    exists, then the caller's ``changes`` (any OrgKnobs.make argument)."""
    values = _dash_values()
    values.update(fixed)
    if link_gbps is not None:
        for name in ("gpu_hbm_gbps", "direct_gbps", "relay_gbps"):
            values[name] = link_gbps if values[name] > 0 else 0.0
    values.update(changes)
    return OrgKnobs.make(**values)


def dash(link_gbps: float | None = None, **changes) -> OrgKnobs:
    """DASH: two HBM + two HBF stacks, GPU–HBM, GPU–HBF and HBM–HBF links of 1.6 TB/s each (6.4 TB/s of
    GPU-facing expert delivery, DASH §VI-E)."""
    return _organisation(changes, link_gbps)


def compact_dash(link_gbps: float | None = None, **changes) -> OrgKnobs:
    """Compact-DASH: both paths, one HBM/HBF stack pair holding the same capacity."""
    d = _dash_values()
    return _organisation(changes, link_gbps, hbm_stacks=1, hbf_stacks=1,
                         hbm_capacity_bytes=d["hbm_capacity_bytes"] * d["hbm_stacks"],
                         hbf_capacity_bytes=d["hbf_capacity_bytes"] * d["hbf_stacks"])


def relay_only(link_gbps: float | None = None, **changes) -> OrgKnobs:
    """RelayOnly: DASH without the GPU–HBF links; HBF data reaches the GPU over HBF–HBM–GPU routes."""
    return _organisation(changes, link_gbps, direct_gbps=0.0)


def direct_only(link_gbps: float | None = None, **changes) -> OrgKnobs:
    """DirectOnly: DASH without the HBM–HBF links; HBF data reaches the GPU over GPU–HBF links only."""
    return _organisation(changes, link_gbps, relay_gbps=0.0)


ORGANISATIONS: dict[str, Callable[..., OrgKnobs]] = {
    "dash": dash, "compact-dash": compact_dash, "relay-only": relay_only, "direct-only": direct_only,
}

SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    "dash": _COMMON_SOURCES,
    "compact-dash": (("hbm_stacks", f"{_FIG8}: one HBM/HBF stack pair"),
                     ("hbf_stacks", f"{_FIG8}: one HBM/HBF stack pair"),
                     ("hbf_capacity_bytes", "interpreted: the pair holds DASH's capacity ('consolidates the memory "
                                            "resources', §VI-A); Llama 4 Maverick's 801 GB needs more than one "
                                            "512 GB stack"),
                     ("hbm_capacity_bytes", "interpreted: as hbf_capacity_bytes"),
                     ("parallel_units", "interpreted: one stack of DASH's per-stack geometry (array rate halves)"),
                     ) + _COMMON_SOURCES,
    "relay-only": (("direct_gbps", f"{_FIG8}: the GPU–HBF path removed"),
                   ("relay_gbps", "DASH §VI-E: two HBF–HBM–GPU relay routes")) + _COMMON_SOURCES,
    "direct-only": (("relay_gbps", f"{_FIG8}: the HBF–HBM path removed"),
                    ("direct_gbps", "DASH §VI-E: two GPU–HBF links")) + _COMMON_SOURCES,
}


def organisation(name: str, **changes) -> OrgKnobs:
    """The named organisation (:data:`ORGANISATIONS`), with any OrgKnobs.make argument (or ``link_gbps``)
    changed."""
    try:
        make = ORGANISATIONS[name]
    except KeyError:
        raise ConfigError(f"organisation = {name!r}: must be one of {tuple(ORGANISATIONS)}") from None
    return make(**changes)


def source(name: str, field_name: str) -> str:
    """Where organisation ``name``'s value of ``field_name`` comes from ('' when it is not sourced)."""
    return dict(reversed(SOURCES[name])).get(field_name, "")
