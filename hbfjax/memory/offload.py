"""CPU-offloading baselines of DASH §VI-C (Fig. 10): one MoE expert layer's latency when the expert
weights exceed HBM and live in host memory.

The layer's needed experts (``tokens > 0``) split into those whose weights are already resident in
GPU HBM and the rest, which live in host DRAM. Three schemes:

* **weight streaming** (MoE-Infinity, DASH [50]): every needed non-resident expert's weights cross
  the PCIe link to the GPU (``PcieSpec.usable_gbps``), then the GPU computes all its needed experts
  (``gpu_us``, given per expert by the caller from the GPU timing model). Transfer and GPU compute are
  serial; transfer setup latency (µs) is not modelled beside ~0.7 ms per 37.7 MB Qwen3 expert.
* **CPU compute** (Fiddler, DASH [18]): the batch's activations go to the CPU (each token once), every
  needed non-resident expert runs on the CPU, and each expert's output rows come back; the GPU computes
  its resident experts meanwhile. CPU path = D2H + CPU makespan + H2D; layer = max(CPU path, GPU).
* **Hybrid** at a split ``k``: the ``k`` needed non-resident experts with the fewest tokens (ties by
  expert id) run on the CPU, the rest are streamed; both sides concurrent, layer = max(CPU path, GPU
  path). ``k = 0`` is weight streaming, ``k ≥ J`` (J needed non-resident experts) CPU compute. The
  fewest-tokens-first order is the oracle's split family: with equal per-expert GPU times it holds an
  optimal subset for every k (the CPU time only grows with a job's tokens; the GPU's cost of an expert
  is then the same whichever it is). **Hybrid oracle**: the minimum over k = 0 … E, an empirical lower
  bound on the layer's latency (DASH reports the minimum of median TPOT over splits: take the split
  as a knob axis and the minimum of medians on the host for that reading; :func:`oracle` is the
  per-layer minimum, lower still).

**CPU cost of one job.** A job is one expert with ``tokens`` rows: ``tokens × flops_per_row`` FLOPs
and ``expert_bytes`` of weights read from DRAM once, overlapped (a roofline) on one core:
``t = max(FLOPs / core_tflops, expert_bytes / core_bw_gbps)``.

**How jobs map to cores.** A job runs whole on one core (an expert is not split across cores: DASH
Fig. 10(a), "B1 saturates once its eight expert jobs are parallelized"). With a cap of ``c`` cores the
jobs run longest-first in waves of ``c`` (a parallel-for over experts, one expert per core): wave
``w`` holds jobs ``w·c … w·c + c − 1`` of the descending order and lasts as long as its first
(largest) job. So ``J`` jobs use ``min(c, J)`` cores and the schedule takes Σ_w t(first job of w);
for equal jobs that is ``ceil(J / c) · t``, the exact makespan, so B1 (8 jobs) stops improving at 8
cores. (For unequal jobs it lies between the fluid bound ``max(t_max, Σt / c)`` and
``t_max + Σt / c``.) The cores share the socket's DRAM bandwidth: the CPU makespan is
``max(schedule, Σ expert_bytes / memory_bw_gbps)``, the longer of the per-core schedule and all the
CPU's weights over the socket bandwidth (a roofline over the socket; optimistic where the two are
close, as the oracle is meant to be). Both terms are non-increasing in ``c``. Per-layer CPU dispatch
overhead is not modelled.

The non-expert GPU time is the same for every scheme (DASH §VI-C: "the same non-expert GPU time
across all schemes"): :func:`token_us` adds it as a parameter.

Everything is written for one stream and one layer with jax.numpy on fixed-size ``[E]`` arrays, so the
serving step can vmap it over streams and scan it over layers; knobs are traced (a sweep over cores or
splits never recompiles). This module knows bytes and FLOPs, not models: the caller takes
``expert_bytes`` and ``flops_per_row`` from the model's expert Linears.

Units: µs, bytes, FLOPs, GB/s, TFLOPS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.memory import cpus
from hbfjax.validate import INT32_MAX, require, require_int, require_real


def _f32(value) -> jax.Array:
    return jnp.asarray(value, jnp.float32)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class OffloadKnobs:
    """Traced rates of the host CPU and its PCIe link, the core cap and the Hybrid split."""

    cores: jax.Array  # int32[] core-count cap (DASH Fig. 10(a): 1–16; (b): 32)
    cpu_experts: jax.Array  # int32[] Hybrid split k: needed non-resident experts run on the CPU
    core_tflops: jax.Array  # float32[] BF16 matrix rate one core reaches (AMX peak × efficiency)
    core_bw_gbps: jax.Array  # float32[] DRAM bandwidth one core alone can stream
    memory_bw_gbps: jax.Array  # float32[] DRAM bandwidth the socket sustains
    pcie_gbps: jax.Array  # float32[] usable PCIe rate per direction

    @classmethod
    def make(cls, cpu: cpus.CpuSpec | str = "xeon-8452y", pcie: cpus.PcieSpec | str = "pcie5-x16", *,
             cores: int = 16, cpu_experts: int = 0, amx_efficiency: float | None = None,
             memory_efficiency: float | None = None, core_bw_gbps: float | None = None,
             pcie_efficiency: float | None = None) -> "OffloadKnobs":
        """Knobs of ``cpu`` and ``pcie`` (specs or preset names), validated; ``cores`` is capped by the
        CPU's core count; the efficiencies and ``core_bw_gbps`` override the specs' stated values."""
        cpu = cpus.cpu_preset(cpu) if isinstance(cpu, str) else cpu
        pcie = cpus.pcie_preset(pcie) if isinstance(pcie, str) else pcie
        require(isinstance(cpu, cpus.CpuSpec), "OffloadKnobs", "cpu", cpu, "must be a CpuSpec or a preset name")
        require(isinstance(pcie, cpus.PcieSpec), "OffloadKnobs", "pcie", pcie, "must be a PcieSpec or a preset name")
        changes = {"amx_efficiency": amx_efficiency, "memory_efficiency": memory_efficiency,
                   "core_bw_gbps": core_bw_gbps}
        cpu = cpu.replace(**{k: v for k, v in changes.items() if v is not None})  # validated by CpuSpec
        if pcie_efficiency is not None:
            pcie = pcie.replace(efficiency=pcie_efficiency)
        cores = require_int("OffloadKnobs", "cores", cores, 1, cpu.cores)
        cpu_experts = require_int("OffloadKnobs", "cpu_experts", cpu_experts, 0)
        return cls(cores=jnp.asarray(cores, jnp.int32), cpu_experts=jnp.asarray(cpu_experts, jnp.int32),
                   core_tflops=_f32(cpu.core_tflops), core_bw_gbps=_f32(cpu.core_bw_gbps),
                   memory_bw_gbps=_f32(cpu.memory_bw_gbps), pcie_gbps=_f32(pcie.usable_gbps))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ExpertLayer:
    """One MoE layer's expert work this iteration (inputs), for one stream."""

    tokens: jax.Array  # int32[E] rows routed to each expert (0 = not needed), ≤ max_tokens(E)
    gpu_resident: jax.Array  # bool[E] the expert's weights are already in GPU HBM
    gpu_us: jax.Array  # float32[E] GPU compute time of each expert at its rows (weights in HBM)
    expert_bytes: jax.Array  # float32[] weight bytes of one expert (all its matrices)
    flops_per_row: jax.Array  # float32[] FLOPs of one (token, expert) row through one expert
    activation_bytes: jax.Array  # float32[] bytes of one token's activation (hidden × width)
    batch_tokens: jax.Array  # int32[] tokens of the batch at this layer (each crosses to the CPU once)

    @classmethod
    def make(cls, tokens, *, expert_bytes: float, flops_per_row: float, activation_bytes: float,
             batch_tokens: int | None = None, gpu_resident=None, gpu_us=None) -> "ExpertLayer":
        """Validated host-side construction (inside ``jit`` use the constructor). ``batch_tokens``
        defaults to the total rows, an upper bound on the distinct tokens; ``gpu_resident`` to none
        and ``gpu_us`` to zeros."""
        rows = np.asarray(tokens)
        require(rows.ndim == 1 and rows.size >= 1, "ExpertLayer", "tokens", rows.shape, "must be a 1-d array [E]")
        e = rows.size
        require(np.issubdtype(rows.dtype, np.integer) and bool(np.all((rows >= 0) & (rows <= max_tokens(e)))),
                "ExpertLayer", "tokens", rows.tolist(), f"must be integers in [0, {max_tokens(e)}]")
        resident = np.zeros(e, bool) if gpu_resident is None else np.asarray(gpu_resident, bool)
        require(resident.shape == (e,), "ExpertLayer", "gpu_resident", resident.shape, f"must have shape ({e},)")
        gpu = np.zeros(e, np.float32) if gpu_us is None else np.asarray(gpu_us, np.float32)
        require(gpu.shape == (e,) and bool(np.all(np.isfinite(gpu) & (gpu >= 0))), "ExpertLayer", "gpu_us",
                gpu.tolist(), f"must be {e} finite values >= 0")
        for name, value in (("expert_bytes", expert_bytes), ("flops_per_row", flops_per_row)):
            require_real("ExpertLayer", name, value, 0.0, lo_open=True)
        require_real("ExpertLayer", "activation_bytes", activation_bytes, 0.0)
        batch = int(rows.sum()) if batch_tokens is None else require_int("ExpertLayer", "batch_tokens",
                                                                          batch_tokens, 0)
        return cls(tokens=jnp.asarray(rows, jnp.int32), gpu_resident=jnp.asarray(resident),
                   gpu_us=jnp.asarray(gpu), expert_bytes=_f32(expert_bytes), flops_per_row=_f32(flops_per_row),
                   activation_bytes=_f32(activation_bytes), batch_tokens=jnp.asarray(batch, jnp.int32))


class LayerTimes(NamedTuple):
    """One expert layer's latency under each scheme."""

    stream_us: jax.Array  # float32[] weight streaming
    cpu_compute_us: jax.Array  # float32[] CPU compute
    hybrid_us: jax.Array  # float32[] Hybrid at knobs.cpu_experts
    oracle_us: jax.Array  # float32[] Hybrid oracle: min over k = 0 … E
    oracle_cpu_experts: jax.Array  # int32[] the smallest k that reaches it


# --- primitives ---------------------------------------------------------------------------------------
def pcie_us(bytes_, knobs: OffloadKnobs) -> jax.Array:
    """Time to move ``bytes_`` one way over the PCIe link."""
    return _f32(bytes_) / (knobs.pcie_gbps * 1e3)


def job_us(tokens, expert_bytes, flops_per_row, knobs: OffloadKnobs) -> jax.Array:
    """CPU time of one expert job of ``tokens`` rows on one core: max(compute at the core's AMX rate,
    weights at the core's own DRAM bandwidth)."""
    compute = _f32(tokens) * flops_per_row / (knobs.core_tflops * 1e6)
    return jnp.maximum(compute, expert_bytes / (knobs.core_bw_gbps * 1e3))


def _socket_us(jobs, expert_bytes, knobs: OffloadKnobs) -> jax.Array:
    """All ``jobs`` experts' weights over the socket's DRAM bandwidth."""
    return _f32(jobs) * expert_bytes / (knobs.memory_bw_gbps * 1e3)


def cpu_makespan_us(tokens, on_cpu, expert_bytes, flops_per_row, knobs: OffloadKnobs) -> jax.Array:
    """Makespan of the jobs ``on_cpu: bool[E]`` (expert e has ``tokens[e]`` rows) under the core cap:
    longest first in waves of ``knobs.cores``, or the socket bandwidth, whichever is longer (module
    docstring)."""
    jobs = jnp.sum(on_cpu, dtype=jnp.int32)
    desc = -jnp.sort(-jnp.where(on_cpu, tokens, -1))  # int32[E] descending; non-jobs (-1) last
    i = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    first = (i % knobs.cores == 0) & (i < jobs)  # the largest job of each wave
    waves = jnp.sum(jnp.where(first, job_us(desc, expert_bytes, flops_per_row, knobs), 0.0))
    return jnp.maximum(waves, _socket_us(jobs, expert_bytes, knobs))


# --- one split --------------------------------------------------------------------------------------
def _candidates(layer: ExpertLayer) -> jax.Array:
    """bool[E]: needed experts whose weights are in host memory."""
    return (layer.tokens > 0) & ~layer.gpu_resident


def max_tokens(experts: int) -> int:
    """Largest row count of one expert that the sort key ``tokens · E + id`` holds in int32."""
    return INT32_MAX // experts - 2


def _ascending(layer: ExpertLayer) -> jax.Array:
    """int32[E] expert ids, candidates first by ascending tokens (ties by id), then the others: one
    sort of the int32 key tokens · E + id (4× faster than a stable argsort on the CPU)."""
    e = layer.tokens.shape[0]
    rank = jnp.where(_candidates(layer), layer.tokens, max_tokens(e) + 1)
    return jnp.sort(rank * e + jnp.arange(e, dtype=jnp.int32)) % e


def split_on_cpu(layer: ExpertLayer, k) -> jax.Array:
    """bool[E]: the Hybrid split ``k``, the ``k`` candidates with the fewest tokens."""
    rank = jnp.zeros_like(layer.tokens).at[_ascending(layer)].set(jnp.arange(layer.tokens.shape[0], dtype=jnp.int32))
    return _candidates(layer) & (rank < k)


def assignment_us(layer: ExpertLayer, on_cpu, knobs: OffloadKnobs) -> jax.Array:
    """Layer latency when the experts ``on_cpu: bool[E]`` (needed, non-resident) run on the CPU and every
    other needed expert on the GPU (streamed unless resident); both sides concurrent."""
    needed = layer.tokens > 0
    on_gpu = needed & ~on_cpu
    streamed = jnp.sum(on_gpu & ~layer.gpu_resident, dtype=jnp.int32)
    gpu = pcie_us(_f32(streamed) * layer.expert_bytes, knobs) + jnp.sum(jnp.where(on_gpu, layer.gpu_us, 0.0))
    rows_back = jnp.sum(jnp.where(on_cpu, layer.tokens, 0))
    any_cpu = jnp.any(on_cpu)
    cpu = (pcie_us(_f32(layer.batch_tokens) * layer.activation_bytes, knobs)
           + cpu_makespan_us(layer.tokens, on_cpu, layer.expert_bytes, layer.flops_per_row, knobs)
           + pcie_us(_f32(rows_back) * layer.activation_bytes, knobs))
    return jnp.maximum(gpu, jnp.where(any_cpu, cpu, 0.0))


def weight_stream_us(layer: ExpertLayer, knobs: OffloadKnobs) -> jax.Array:
    """Weight streaming: every needed non-resident expert crosses PCIe, then the GPU computes."""
    return assignment_us(layer, jnp.zeros_like(layer.gpu_resident), knobs)


def cpu_compute_us(layer: ExpertLayer, knobs: OffloadKnobs) -> jax.Array:
    """CPU compute: every needed non-resident expert runs on the CPU, resident ones on the GPU."""
    return assignment_us(layer, _candidates(layer), knobs)


def hybrid_us(layer: ExpertLayer, knobs: OffloadKnobs, k=None) -> jax.Array:
    """Hybrid at split ``k`` (default ``knobs.cpu_experts``)."""
    return assignment_us(layer, split_on_cpu(layer, knobs.cpu_experts if k is None else k), knobs)


class SplitTraffic(NamedTuple):
    """What one expert layer moves and computes off the GPU under one CPU/GPU split (energy, issue 25)."""

    pcie_bytes: jax.Array  # float32[] streamed experts' weights, and the activations to and from the CPU
    host_dram_bytes: jax.Array  # float32[] the CPU's experts' weights read from host DRAM (streamed ones too)
    cpu_flops: jax.Array  # float32[] FLOPs of the rows the CPU computes
    gpu_hbm_bytes: jax.Array  # float32[] the GPU's experts' weights read from HBM, and the streamed ones written there


def split_traffic(layer: ExpertLayer, on_cpu) -> SplitTraffic:
    """The bytes and CPU FLOPs of the assignment ``on_cpu: bool[E]`` (as :func:`assignment_us` times it):
    every streamed expert's weights are read from host DRAM and cross PCIe once; each CPU expert's
    weights are read from DRAM once; with any CPU expert the batch's activations cross to the CPU and
    the CPU's rows come back; the GPU reads each of its experts' weights from HBM once, the streamed
    ones after PCIe has written them into HBM's staging buffer."""
    needed = layer.tokens > 0
    streamed = _f32(jnp.sum(needed & ~on_cpu & ~layer.gpu_resident, dtype=jnp.int32))
    jobs = _f32(jnp.sum(on_cpu, dtype=jnp.int32))
    rows = _f32(jnp.sum(jnp.where(on_cpu, layer.tokens, 0)))
    crossing = jnp.where(jnp.any(on_cpu), _f32(layer.batch_tokens) + rows, 0.0) * layer.activation_bytes
    on_gpu = _f32(jnp.sum(needed & ~on_cpu, dtype=jnp.int32))
    return SplitTraffic(pcie_bytes=streamed * layer.expert_bytes + crossing,
                        host_dram_bytes=(streamed + jobs) * layer.expert_bytes, cpu_flops=rows * layer.flops_per_row,
                        gpu_hbm_bytes=(on_gpu + streamed) * layer.expert_bytes)


# --- every split at once -----------------------------------------------------------------------------
def _strided_prefix_sum(t: jax.Array, stride) -> jax.Array:
    """float32[E + 1]: S[k] = Σ t[p] over p = k − 1, k − 1 − stride, … ≥ 0 (S[0] = 0) for a traced
    stride, as one product with the 0/1 matrix M[k, p] = (p < k and stride divides k − 1 − p): under vmap
    over layers M is shared and the sums are one matrix product (full float32 precision)."""
    e = t.shape[-1]
    k = jnp.arange(e + 1, dtype=jnp.int32)[:, None]
    p = jnp.arange(e, dtype=jnp.int32)[None, :]
    m = ((p < k) & ((k - 1 - p) % jnp.maximum(jnp.asarray(stride, jnp.int32), 1) == 0)).astype(jnp.float32)
    return jnp.matmul(m, t, precision=jax.lax.Precision.HIGHEST)


def _prefix_sum(x: jax.Array) -> jax.Array:
    """[E + 1]: 0, x[0], x[0] + x[1], …"""
    return jnp.concatenate([jnp.zeros(1, x.dtype), jnp.cumsum(x)])


def split_table_us(layer: ExpertLayer, knobs: OffloadKnobs) -> jax.Array:
    """float32[E + 1]: Hybrid latency at every split k = 0 … E in one pass (one sort, O(E log E) plus one
    [E + 1, E] product); k beyond the J candidates is the same as k = J.

    Candidates sorted ascending (the sort key of :func:`_ascending`; tokens read back from the key):
    split k runs positions 0 … k−1 on the CPU; in descending order the job at position p is then the
    first of its wave iff (k − 1 − p) % c == 0, so the per-core schedule of split k is a strided prefix
    sum over the positions k − 1, k − 1 − c, …"""
    e = layer.tokens.shape[0]
    cand_e = _candidates(layer)
    key = jnp.sort(jnp.where(cand_e, layer.tokens, max_tokens(e) + 1) * e + jnp.arange(e, dtype=jnp.int32))
    gpu_cand = jnp.where(cand_e, layer.gpu_us, 0.0)[key % e]  # a gather: a two-operand sort is 2× slower
    cand = key // e <= max_tokens(e)  # bool[E] candidates first
    tok = jnp.where(cand, key // e, 0)  # int32[E] ascending over the candidates, 0 after them
    jobs = jnp.sum(cand, dtype=jnp.int32)
    i = jnp.arange(e + 1, dtype=jnp.int32)
    k = jnp.minimum(i, jobs)  # int32[E + 1]
    strided = _strided_prefix_sum(jnp.where(cand, job_us(tok, layer.expert_bytes, layer.flops_per_row, knobs), 0.0),
                                  knobs.cores)
    waves = jnp.where(i > jobs, strided[jobs], strided)
    makespan = jnp.maximum(waves, _socket_us(k, layer.expert_bytes, knobs))
    rows_back = _prefix_sum(tok)  # constant beyond the candidates (their tok is 0)
    cpu = (pcie_us(_f32(layer.batch_tokens) * layer.activation_bytes, knobs) + makespan
           + pcie_us(_f32(rows_back) * layer.activation_bytes, knobs))
    needed = layer.tokens > 0
    gpu_left = jnp.sum(jnp.where(needed, layer.gpu_us, 0.0)) - _prefix_sum(gpu_cand)
    gpu = pcie_us(_f32(jobs - k) * layer.expert_bytes, knobs) + gpu_left
    return jnp.maximum(gpu, jnp.where(k > 0, cpu, 0.0))


def _best(table: jax.Array) -> tuple[jax.Array, jax.Array]:
    best = jnp.argmin(table).astype(jnp.int32)
    return table[best], best


def oracle(layer: ExpertLayer, knobs: OffloadKnobs) -> tuple[jax.Array, jax.Array]:
    """Hybrid oracle: (min over k = 0 … E of the Hybrid latency, the smallest k reaching it)."""
    return _best(split_table_us(layer, knobs))


def layer_times(layer: ExpertLayer, knobs: OffloadKnobs) -> LayerTimes:
    """Every scheme's latency for one expert layer, all read from one :func:`split_table_us`
    (k = 0 is weight streaming, k = E CPU compute; tests check them against the one-split functions)."""
    table = split_table_us(layer, knobs)
    e = layer.tokens.shape[0]
    best_us, best_k = _best(table)
    return LayerTimes(stream_us=table[0], cpu_compute_us=table[e], hybrid_us=table[jnp.minimum(knobs.cpu_experts, e)],
                      oracle_us=best_us, oracle_cpu_experts=best_k)


def token_us(non_expert_gpu_us, expert_layers_us) -> jax.Array:
    """Time of one decode step: the non-expert GPU time (the same for every scheme, a parameter) plus
    the expert layers' latencies ``float32[L]`` in sequence."""
    return _f32(non_expert_gpu_us) + jnp.sum(_f32(expert_layers_us), axis=-1)
