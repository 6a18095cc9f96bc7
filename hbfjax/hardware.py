"""Hardware specifications: HBF stacks, HBM stacks and base-die SRAM, with named presets.

Specs are static configuration (DESIGN.md §3): frozen, hashable dataclasses validated on
construction, so that a bad value fails early with the field, the value and the rule. Every preset
value carries its source in ``sources`` (field name -> where the number comes from).

Units: latencies in µs, bandwidths in GB/s (1e9 B/s), sizes in bytes (KiB/MiB are powers of two,
KB/MB/GB powers of ten, as in the papers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hbfjax.validate import ConfigError, require

KiB = 1024
MiB = 1024 * KiB
GB = 10**9
MB = 10**6


# A hardware or model specification value breaks a rule: the project's one configuration error.
SpecError = ConfigError


def _require_positive(obj, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        require(value is not None and value > 0, type(obj).__name__, name, value, "must be > 0")


@dataclass(frozen=True)
class HbfSpec:
    """One HBF package: stacks × dies × planes (× subarrays), blocks of pages, timing and rates.

    A *parallel unit* is an independently accessible array (a plane, or a plane subarray where the
    preset models them, DASH §VI-A); a page wave is one page on every parallel unit (DESIGN.md §4).
    """

    stacks: int
    dies_per_stack: int
    planes_per_die: int
    blocks_per_plane: int
    pages_per_block: int
    page_bytes: int
    t_read_us: float
    t_prog_us: float
    sram_bytes_per_stack: int  # usable base-die SRAM (transfer / buffer)
    subarrays_per_plane: int = 1
    read_bw_gbps_per_stack: float | None = None  # None: planes × page / tR
    write_bw_gbps_per_stack: float | None = None  # None: planes × page / tPROG
    link_bw_gbps: float | None = None  # GPU-facing link, per link per direction
    sram_regions_per_stack: int = 1  # double buffering = 2 regions of sram_bytes_per_stack / 2
    pe_cycles: int = 100_000  # program/erase endurance per block
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        cls = type(self).__name__
        _require_positive(self, ("stacks", "dies_per_stack", "planes_per_die", "subarrays_per_plane",
                                 "blocks_per_plane", "pages_per_block", "page_bytes", "t_read_us",
                                 "t_prog_us", "sram_regions_per_stack", "pe_cycles"))
        require(self.sram_bytes_per_stack >= 0, cls, "sram_bytes_per_stack", self.sram_bytes_per_stack,
                 "must be >= 0")
        for name in ("read_bw_gbps_per_stack", "write_bw_gbps_per_stack", "link_bw_gbps"):
            value = getattr(self, name)
            require(value is None or value > 0, cls, name, value, "must be > 0 or None")
        require(self.page_bytes % 512 == 0, cls, "page_bytes", self.page_bytes,
                 "must be a multiple of 512 B (a NAND page)")
        require(self.t_prog_us >= self.t_read_us, cls, "t_prog_us", self.t_prog_us,
                 f"a NAND program is slower than a read (t_read_us = {self.t_read_us})")
        require(self.sram_bytes_per_stack % self.sram_regions_per_stack == 0, cls, "sram_regions_per_stack",
                 self.sram_regions_per_stack, "must divide sram_bytes_per_stack into equal regions")

    # --- derived geometry -------------------------------------------------------------------
    @property
    def planes(self) -> int:
        """Physical planes in the package."""
        return self.stacks * self.dies_per_stack * self.planes_per_die

    @property
    def parallel_units(self) -> int:
        """Independently accessible arrays (planes × subarrays): the bins of a plane collision."""
        return self.planes * self.subarrays_per_plane

    @property
    def block_bytes(self) -> int:
        return self.pages_per_block * self.page_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.parallel_units * self.blocks_per_plane * self.pages_per_block * self.page_bytes

    @property
    def page_wave_bytes(self) -> int:
        """One page on every parallel unit of the package (DASH: 8 MiB per stack)."""
        return self.parallel_units * self.page_bytes

    @property
    def array_read_bw_gbps(self) -> float:
        """Read rate the arrays can sustain: parallel units × page / tR, in GB/s."""
        return self.parallel_units * self.page_bytes / (self.t_read_us * 1e3)

    @property
    def read_bw_gbps(self) -> float:
        """Package read bandwidth: the stated per-stack rate if given, else the array rate."""
        if self.read_bw_gbps_per_stack is None:
            return self.array_read_bw_gbps
        return self.read_bw_gbps_per_stack * self.stacks

    @property
    def write_bw_gbps(self) -> float:
        if self.write_bw_gbps_per_stack is None:
            return self.parallel_units * self.page_bytes / (self.t_prog_us * 1e3)
        return self.write_bw_gbps_per_stack * self.stacks

    @property
    def sram_bytes(self) -> int:
        return self.sram_bytes_per_stack * self.stacks

    def source(self, field_name: str) -> str:
        return dict(self.sources).get(field_name, "")

    def replace(self, **changes) -> "HbfSpec":
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class HbmSpec:
    """HBM stacks beside the GPU (DASH §IV-B, HBFlex §6.1)."""

    stacks: int
    capacity_bytes_per_stack: int
    bw_gbps_per_stack: float
    relay_sram_bytes_per_stack: int = 0  # HBM base-die relay SRAM (DASH: 2 × 4 MiB)
    relay_sram_regions_per_stack: int = 1
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        _require_positive(self, ("stacks", "capacity_bytes_per_stack", "bw_gbps_per_stack",
                                 "relay_sram_regions_per_stack"))
        require(self.relay_sram_bytes_per_stack % self.relay_sram_regions_per_stack == 0, type(self).__name__,
                 "relay_sram_regions_per_stack", self.relay_sram_regions_per_stack,
                 "must divide relay_sram_bytes_per_stack into equal regions")

    @property
    def capacity_bytes(self) -> int:
        return self.stacks * self.capacity_bytes_per_stack


@dataclass(frozen=True)
class SystemSpec:
    """A memory package: HBF, and optionally HBM (DASH) — HBFlex is all-HBF."""

    name: str
    hbf: HbfSpec
    hbm: HbmSpec | None = None


def _hbflex() -> SystemSpec:
    src = "HBFlex §3 and §6.1"
    hbf = HbfSpec(
        stacks=6, dies_per_stack=16, planes_per_die=32, blocks_per_plane=512, pages_per_block=512,
        page_bytes=4 * KiB, t_read_us=4.0, t_prog_us=75.0, sram_bytes_per_stack=40 * MB,
        read_bw_gbps_per_stack=488.0, write_bw_gbps_per_stack=27.2, pe_cycles=100_000,
        sources=(("stacks", src), ("dies_per_stack", src), ("planes_per_die", src),
                 ("blocks_per_plane", src), ("pages_per_block", src), ("page_bytes", "HBFlex §2.1"),
                 ("t_read_us", src), ("t_prog_us", src), ("read_bw_gbps_per_stack", src),
                 ("write_bw_gbps_per_stack", "HBFlex §6.1"), ("sram_bytes_per_stack", "HBFlex §6.1"),
                 ("pe_cycles", "HBFlex §3.3 (100K P/E budget)")),
    )
    return SystemSpec(name="hbflex", hbf=hbf, hbm=None)


def _dash() -> SystemSpec:
    est = ("estimated: 512 GB per stack (DASH §VI-A) / (16 dies × 32 planes × 4 subarrays × 4 KiB pages), "
           "with 512 pages per block assumed as in HBFlex")
    hbf = HbfSpec(
        stacks=2, dies_per_stack=16, planes_per_die=32, subarrays_per_plane=4,
        blocks_per_plane=119, pages_per_block=512, page_bytes=4 * KiB, t_read_us=3.0, t_prog_us=100.0,
        sram_bytes_per_stack=16 * MiB, sram_regions_per_stack=2, link_bw_gbps=1600.0,
        pe_cycles=100_000,
        sources=(("stacks", "DASH §VI-A (two 512 GB HBF stacks)"), ("dies_per_stack", "DASH §VI-A"),
                 ("planes_per_die", "DASH §VI-A"), ("subarrays_per_plane", "DASH §VI-A (assumed 4)"),
                 ("blocks_per_plane", est), ("pages_per_block", est), ("page_bytes", "DASH §VI-A"),
                 ("t_read_us", "DASH §VI-A (nominal 3 µs)"), ("t_prog_us", "DASH §VI-A (nominal 100 µs)"),
                 ("sram_bytes_per_stack", "DASH §IV-B (2 × 8 MiB usable transfer regions)"),
                 ("link_bw_gbps", "DASH §IV-A (1.6 TB/s usable per UCIe link)"),
                 ("pe_cycles", "assumed SLC-class 100K, as HBFlex §3.3")),
    )
    hbm = HbmSpec(
        stacks=2, capacity_bytes_per_stack=24 * GB, bw_gbps_per_stack=800.0,
        relay_sram_bytes_per_stack=8 * MiB, relay_sram_regions_per_stack=2,
        sources=(("stacks", "DASH §VI-A"), ("capacity_bytes_per_stack", "DASH §VI-A (24 GB HBM3E)"),
                 ("bw_gbps_per_stack", "HBFlex §6.1 (HBM3e 0.8 TB/s per stack)"),
                 ("relay_sram_bytes_per_stack", "DASH §IV-B (2 × 4 MiB relay regions)")),
    )
    return SystemSpec(name="dash", hbf=hbf, hbm=hbm)


PRESETS = {"hbflex": _hbflex, "dash": _dash}
# pages of one erase block, HBFlex §3 and §6.1 (DASH assumes the same): the serving block store, read reclaim
# and the energy of erases use it
PAGES_PER_BLOCK = _hbflex().hbf.pages_per_block


def preset(name: str) -> SystemSpec:
    """A named hardware preset: ``hbflex`` (6 × 16 × 32 planes, all-HBF) or ``dash`` (HBM + HBF)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise SpecError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
