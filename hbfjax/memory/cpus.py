"""Host-side hardware of the CPU-offloading baselines (DASH §VI-C, Fig. 10): the CPU that runs
offloaded experts and the PCIe link between host memory and the GPU, with named presets.

Static configuration in the style of :mod:`hbfjax.hardware`: frozen, hashable dataclasses validated
on construction; every preset value carries its source in ``sources``, and a value that no public
datasheet states is listed in ``estimated`` with its derivation.

Units: clocks in GHz, matrix rates in TFLOPS (1e12 FLOP/s), bandwidths in GB/s (1e9 B/s), transfer
rates in MT/s (DDR) or GT/s (PCIe).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hbfjax.validate import ConfigError, require, require_int, require_real


class _Sourced:
    """Provenance and validated copies for the specs below (fields ``sources`` and ``estimated``)."""

    def source(self, field_name: str) -> str:
        return dict(self.sources).get(field_name, "")

    @property
    def estimated_fields(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.estimated)

    def replace(self, **changes):
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class CpuSpec(_Sourced):
    """One CPU socket: cores, clocks, the per-core BF16 matrix unit (AMX) and DDR channels.

    ``amx_efficiency`` is the fraction of the AMX peak an expert GEMM reaches, ``memory_efficiency``
    the fraction of the DDR peak all cores together sustain, and ``core_bw_gbps`` what one core alone
    can stream from DRAM (its outstanding misses over the load latency)."""

    name: str
    cores: int  # physical cores
    base_ghz: float
    turbo_ghz: float  # maximum single-core turbo
    amx_ghz: float  # clock the cores hold under sustained AMX load
    amx_bf16_flops_per_cycle: int  # per core (one multiply-add = 2 FLOPs)
    memory_channels: int
    memory_mts: float  # DDR transfer rate per channel
    amx_efficiency: float
    memory_efficiency: float
    core_bw_gbps: float
    memory_bytes_per_transfer: int = 8  # a 64-bit DDR channel
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)
    estimated: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        cls = type(self).__name__
        require(isinstance(self.name, str) and self.name != "", cls, "name", self.name, "must be a non-empty string")
        for name in ("cores", "amx_bf16_flops_per_cycle", "memory_channels", "memory_bytes_per_transfer"):
            require_int(cls, name, getattr(self, name), 1)
        for name in ("base_ghz", "turbo_ghz", "amx_ghz", "memory_mts", "core_bw_gbps"):
            require_real(cls, name, getattr(self, name), 0.0, lo_open=True)
        for name in ("amx_efficiency", "memory_efficiency"):
            require_real(cls, name, getattr(self, name), 0.0, 1.0, lo_open=True)
        require(self.turbo_ghz >= self.base_ghz, cls, "turbo_ghz", self.turbo_ghz,
                f"must be >= base_ghz = {self.base_ghz}")
        require(self.amx_ghz <= self.turbo_ghz, cls, "amx_ghz", self.amx_ghz,
                f"must be <= turbo_ghz = {self.turbo_ghz}")

    @property
    def core_peak_tflops(self) -> float:
        """AMX BF16 peak of one core at ``amx_ghz``."""
        return self.amx_bf16_flops_per_cycle * self.amx_ghz / 1e3

    @property
    def core_tflops(self) -> float:
        """What one core reaches on an expert GEMM: the peak × ``amx_efficiency``."""
        return self.core_peak_tflops * self.amx_efficiency

    @property
    def memory_peak_gbps(self) -> float:
        """DDR peak: channels × MT/s × bytes per transfer."""
        return self.memory_channels * self.memory_mts * self.memory_bytes_per_transfer / 1e3

    @property
    def memory_bw_gbps(self) -> float:
        """What all cores together sustain: the peak × ``memory_efficiency``."""
        return self.memory_peak_gbps * self.memory_efficiency


@dataclass(frozen=True)
class PcieSpec(_Sourced):
    """One PCIe link between host memory and the GPU: lanes × GT/s, and the usable fraction of the
    raw rate per direction (line encoding, packet headers and flow control)."""

    name: str
    gt_per_s: float  # per lane
    lanes: int
    efficiency: float  # usable / raw, per direction
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)
    estimated: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        cls = type(self).__name__
        require(isinstance(self.name, str) and self.name != "", cls, "name", self.name, "must be a non-empty string")
        require_real(cls, "gt_per_s", self.gt_per_s, 0.0, lo_open=True)
        require_int(cls, "lanes", self.lanes, 1)
        require_real(cls, "efficiency", self.efficiency, 0.0, 1.0, lo_open=True)

    @property
    def raw_gbps(self) -> float:
        """Raw signalling rate per direction: lanes × GT/s / 8 bits."""
        return self.gt_per_s * self.lanes / 8

    @property
    def usable_gbps(self) -> float:
        return self.raw_gbps * self.efficiency


_ARK_8452Y = ("Intel ARK, Xeon Platinum 8452Y (DASH [15]: 'processor-67-5m-cache-2-00-ghz'): 36 cores, 2.00 GHz "
              "base, 3.20 GHz max turbo, 8 channels DDR5-4800")
_AMX = ("Intel AMX (4th Gen Xeon Scalable): TDPBF16PS multiplies 16×32 by 32×16 BF16 tiles (8,192 multiply-adds) "
        "in 16 cycles = 1,024 BF16 FLOP per cycle per core; KTransformers doc/en/AMX.md states the same unit as "
        "2,048 INT8 operations per cycle per core")


def _xeon_8452y() -> CpuSpec:
    return CpuSpec(
        name="xeon-8452y", cores=36, base_ghz=2.0, turbo_ghz=3.2, amx_ghz=2.0, amx_bf16_flops_per_cycle=1024,
        memory_channels=8, memory_mts=4800.0, amx_efficiency=0.285, memory_efficiency=0.716, core_bw_gbps=25.6,
        sources=(("cores", f"{_ARK_8452Y}; 36 × 1.875 MB L3 per core = the 67.5 MB in the part name; KTransformers "
                  "(SOSP'25 §6.1) runs on 2 × 8452Y with 36 cores each"),
                 ("base_ghz", _ARK_8452Y), ("turbo_ghz", _ARK_8452Y), ("memory_channels", _ARK_8452Y),
                 ("memory_mts", _ARK_8452Y), ("amx_bf16_flops_per_cycle", _AMX),
                 ("amx_ghz", "estimated (see estimated)"), ("amx_efficiency", "estimated (see estimated)"),
                 ("memory_efficiency", "KTransformers SOSP'25 §6.1: 220 GB/s measured within one 8452Y socket"),
                 ("core_bw_gbps", "estimated (see estimated)")),
        estimated=(("amx_ghz", "sustained all-core AMX load assumed at the 2.0 GHz base clock (AMX-heavy code runs "
                    "below turbo; Intel publishes no AMX frequency for this part)"),
                   ("amx_efficiency", "KTransformers doc/en/AMX.md: its BF16 MoE kernel reaches 21 TFLOPS on a Xeon 4 "
                    "CPU; 21 / (36 cores × 1,024 FLOP × 2.0 GHz = 73.7 TFLOPS) = 0.285, assuming one socket"),
                   ("memory_efficiency", "220 GB/s (KTransformers, measured) / 307.2 GB/s (8 × 4800 MT/s × 8 B) = 0.716"),
                   ("core_bw_gbps", "Little's law: 48 outstanding L2 misses per Golden Cove core × 64 B / ~120 ns "
                    "loaded DRAM latency = 25.6 GB/s; eight such cores (27.5 GB/s each under the 220 GB/s socket "
                    "limit) are what DASH Fig. 10(a)'s B1 saturation at eight expert jobs needs")),
    )


def _pcie5_x16() -> PcieSpec:
    return PcieSpec(
        name="pcie5-x16", gt_per_s=32.0, lanes=16, efficiency=0.87,
        sources=(("gt_per_s", "PCI Express Base Specification 5.0: 32 GT/s per lane"),
                 ("lanes", "NVIDIA H100 PCIe product brief: PCIe Gen5 x16 (64 GB/s per direction raw)"),
                 ("efficiency", "estimated (see estimated)")),
        estimated=(("efficiency", "128b/130b encoding leaves 63.0 of 64 GB/s, TLP headers and flow control take "
                    "more; NVIDIA's nvbandwidth host_to_device_memcpy_ce example output reports 55.63 GB/s: "
                    "55.63 / 64 = 0.87"),),
    )


CPU_PRESETS = {"xeon-8452y": _xeon_8452y}
PCIE_PRESETS = {"pcie5-x16": _pcie5_x16}


def cpu_preset(name: str) -> CpuSpec:
    """A named CPU: ``xeon-8452y`` (DASH §VI-C's host CPU)."""
    try:
        return CPU_PRESETS[name]()
    except KeyError:
        raise ConfigError(f"cpus.cpu_preset.name = {name!r}: must be one of {tuple(sorted(CPU_PRESETS))}") from None


def pcie_preset(name: str) -> PcieSpec:
    """A named PCIe link: ``pcie5-x16`` (the H100 PCIe's host link)."""
    try:
        return PCIE_PRESETS[name]()
    except KeyError:
        raise ConfigError(f"cpus.pcie_preset.name = {name!r}: must be one of {tuple(sorted(PCIE_PRESETS))}") from None
