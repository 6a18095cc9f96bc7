"""GPU specifications for operator timing and tensor-parallel all-reduces, with named presets (DASH §VI-A:
H100 PCIe; HBFlex §6.1: H200-class).

A :class:`GpuSpec` is static configuration in the style of :mod:`hbfjax.hardware`: frozen, hashable,
validated on construction, every preset value with its source in ``sources``. Peak rates are the
**dense** tensor-core figures: NVIDIA's datasheets print the 2:4 structured-sparsity figure (marked
"with sparsity"; "specifications 1/2 lower without sparsity"), and dense matmuls of LLM inference
get half of it, so every preset stores the datasheet figure / 2. ``fp32`` is the non-tensor (CUDA
core) FP32 rate, which the datasheet states dense.

``nvlink_gbps`` is one direction of the GPU's NVLink (the datasheets print the bidirectional total per GPU,
stored / 2): the rate a ring all-reduce of a tensor-parallel group sends at (:mod:`hbfjax.workload.tensor_parallel`).

Units: TFLOPS = 1e12 FLOP/s (TOPS for int8), bandwidth in GB/s (1e9 B/s), memory in bytes (GB = 1e9).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hbfjax.validate import ConfigError, require, require_choice, require_real

GB = 10**9

# Compute precisions of a matmul, in the order of GpuKnobs.peak_tflops.
PRECISIONS = ("bf16", "fp8", "int8", "tf32", "fp32")

_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100)"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200)"
_HALF = "; dense = the datasheet's 'with sparsity' figure / 2"
_EACH_WAY = " bidirectional per GPU; one direction = half"


def compute_precision(bytes_per_param: float) -> str:
    """The tensor-core precision a matmul with weights of ``bytes_per_param`` bytes runs at: ≥ 3 B →
    fp32; ≥ 1.5 B → bf16; ≥ 1 B → fp8 (FP8 with block scales, and INT8: Hopper's int8 and fp8 rates are
    equal); narrower weights are weight-only quantised and dequantised to bf16."""
    if bytes_per_param >= 3:
        return "fp32"
    if bytes_per_param >= 1.5 or bytes_per_param < 1:
        return "bf16"
    return "fp8"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: dense peak matmul rate per precision, HBM bandwidth and capacity."""

    name: str
    peak_tflops_bf16: float  # dense BF16/FP16 tensor core, FP32 accumulate
    peak_tflops_fp8: float  # dense FP8 tensor core
    peak_tops_int8: float  # dense INT8 tensor core
    peak_tflops_tf32: float  # dense TF32 tensor core
    peak_tflops_fp32: float  # FP32 on CUDA cores (no tensor core)
    hbm_bw_gbps: float
    memory_bytes: int
    nvlink_gbps: float  # NVLink, one direction, per GPU
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        cls = type(self).__name__
        require(isinstance(self.name, str) and self.name != "", cls, "name", self.name, "must be a non-empty string")
        for name in ("peak_tflops_bf16", "peak_tflops_fp8", "peak_tops_int8", "peak_tflops_tf32", "peak_tflops_fp32",
                     "hbm_bw_gbps", "nvlink_gbps"):
            require_real(cls, name, getattr(self, name), 0.0, lo_open=True)
        require(isinstance(self.memory_bytes, int) and not isinstance(self.memory_bytes, bool)
                and self.memory_bytes > 0, cls, "memory_bytes", self.memory_bytes, "must be an integer > 0")
        require(self.peak_tflops_fp8 >= self.peak_tflops_bf16, cls, "peak_tflops_fp8", self.peak_tflops_fp8,
                f"an FP8 tensor core is not slower than BF16 (peak_tflops_bf16 = {self.peak_tflops_bf16})")

    def peak(self, precision: str) -> float:
        """Dense peak rate of ``precision`` (one of :data:`PRECISIONS`), in TFLOPS (TOPS for int8)."""
        require_choice(type(self).__name__, "precision", precision, PRECISIONS)
        return {"bf16": self.peak_tflops_bf16, "fp8": self.peak_tflops_fp8, "int8": self.peak_tops_int8,
                "tf32": self.peak_tflops_tf32, "fp32": self.peak_tflops_fp32}[precision]

    def source(self, field_name: str) -> str:
        return dict(self.sources).get(field_name, "")

    def replace(self, **changes) -> "GpuSpec":
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)


def _h100_pcie() -> GpuSpec:
    src = f"{_H100_DATASHEET}, H100 PCIe column"
    return GpuSpec(
        name="h100-pcie", peak_tflops_bf16=1513 / 2, peak_tflops_fp8=3026 / 2, peak_tops_int8=3026 / 2,
        peak_tflops_tf32=756 / 2, peak_tflops_fp32=51.0, hbm_bw_gbps=2000.0, memory_bytes=80 * GB, nvlink_gbps=600 / 2,
        sources=(("peak_tflops_bf16", f"{src}: 1,513 TFLOPS{_HALF}; DASH [29] cites 756 dense from the H100 "
                  "architecture whitepaper v1.04"),
                 ("peak_tflops_fp8", f"{src}: 3,026 TFLOPS{_HALF}"), ("peak_tops_int8", f"{src}: 3,026 TOPS{_HALF}"),
                 ("peak_tflops_tf32", f"{src}: 756 TFLOPS{_HALF}"), ("peak_tflops_fp32", f"{src}: 51 TFLOPS"),
                 ("hbm_bw_gbps", f"{src}: 2 TB/s HBM2e (product brief PB-11133-001: 'greater than 2,000 GB/s')"),
                 ("memory_bytes", f"{src}: 80 GB"),
                 ("nvlink_gbps", f"{src}: NVLink 600 GB/s (2- or 4-way bridge){_EACH_WAY}")),
    )


def _sxm_class(name: str, src: str, hbm: str, hbm_bw_gbps: float, memory_gb: int, memory_note: str = "") -> GpuSpec:
    """A GH100 SXM part (H100 SXM, H200): the same dense tensor-core rates, its own HBM."""
    return GpuSpec(
        name=name, peak_tflops_bf16=1979 / 2, peak_tflops_fp8=3958 / 2, peak_tops_int8=3958 / 2,
        peak_tflops_tf32=989 / 2, peak_tflops_fp32=67.0, hbm_bw_gbps=hbm_bw_gbps, memory_bytes=memory_gb * GB,
        nvlink_gbps=900 / 2,
        sources=(("peak_tflops_bf16", f"{src}: 1,979 TFLOPS{_HALF}"), ("peak_tflops_fp8", f"{src}: 3,958 TFLOPS{_HALF}"),
                 ("peak_tops_int8", f"{src}: 3,958 TOPS{_HALF}"), ("peak_tflops_tf32", f"{src}: 989 TFLOPS{_HALF}"),
                 ("peak_tflops_fp32", f"{src}: 67 TFLOPS"), ("hbm_bw_gbps", f"{src}: {hbm_bw_gbps / 1000:g} TB/s {hbm}"),
                 ("memory_bytes", f"{src}: {memory_gb} GB{memory_note}"),
                 ("nvlink_gbps", f"{src}: NVLink 900 GB/s (NVLink 4){_EACH_WAY}")),
    )


def _h100_sxm() -> GpuSpec:
    return _sxm_class("h100-sxm", f"{_H100_DATASHEET}, H100 SXM column", "HBM3", 3350.0, 80)


def _h200() -> GpuSpec:
    return _sxm_class("h200", f"{_H200_DATASHEET}, H200 SXM column (same GH100 compute as the H100 SXM)", "HBM3e",
                      4800.0, 141, "; HBFlex §6.1 models H200-class accelerators")


PRESETS = {"h100-pcie": _h100_pcie, "h100-sxm": _h100_sxm, "h200": _h200}


def preset(name: str) -> GpuSpec:
    """A named GPU: ``h100-pcie`` (DASH's profiling GPU), ``h100-sxm`` or ``h200`` (HBFlex §6.1)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"gpus.preset.name = {name!r}: must be one of {tuple(sorted(PRESETS))}") from None
