"""The CPU-offloading systems of DASH §VI-C as a timing of the serving engine: an H100 PCIe with no HBF
whose expert weights do not fit its HBM (``cpu-stream``, ``cpu-compute``, ``hybrid``), on the same
batcher and the same routing draws as the DASH organisations (``ServeConfig.timing_kind =
"cpu-offload"`` in :mod:`hbfjax.serve.engine`, with no parts).

**One pass.** Per pass, every MoE layer is routed exactly as the organisations' timing routes it
(``pass_routing``: same words, draw index and calls, so a seed gives DASH and these systems the same
routing), and the pass takes

    pass_us = non_expert_us + Σ_MoE layers (expert_launch_us + expert_layer_us[system])

* ``non_expert_us``: every operator except the routed experts, on the GPU roofline with its weights
  and the KV in the GPU's own HBM (``timing.step_costs`` with no expert rows: attention, projections,
  norms, router, shared experts, dense FFNs, the LM head; the GPU preset's HBM bandwidth). The same in
  every system (DASH §VI-C: "the same non-expert GPU time across all schemes").
* ``expert_layer_us``: :mod:`hbfjax.memory.offload` on the layer's rows, with each expert's GPU time
  the roofline of its own GEMMs at its rows, weights in HBM (``timing.expert_costs`` of a one-expert
  layer, its launches taken out). ``system``: 0 weight streaming, 1 CPU compute, 2 the Hybrid oracle
  per layer (the best split of every layer of every pass: a lower bound below DASH's reading), 3 the
  Hybrid at a fixed split ``offload.cpu_experts`` (DASH's oracle is the minimum of median TPOT over
  such fixed splits: run k as a knob axis and take the minimum on the host).
* ``expert_launch_us``: the grouped expert kernels' launches (one per expert matrix), counted in every
  system as serial GPU time (the GPU gathers and combines the experts' outputs whoever computed them).

**Which experts are GPU-resident** (the stated rule, :func:`resident_experts`): of the GPU's HBM,
``memory_utilisation`` (0.9, vLLM's default ``gpu_memory_utilization``; the rest is CUDA context and
activations) is usable; from it go the non-expert weights, ``kv_tokens`` tokens of KV, and a staging
buffer of one whole MoE layer's experts (so any layer's misses can be streamed). What remains holds a
fixed number ``n`` of experts in every MoE layer. Which ``n``: with ``routing_draw = "tokens"`` the
``n`` most popular experts of each layer (``routing.expert_rank``: a cache with oracle knowledge of
the popularity; under uniform routing a fixed random set); with ``"counts"`` (the needed experts are
not identified there, ``routing.count_routing``) the number of needed experts that are resident is
drawn from its exact hypergeometric law given ``n`` resident of ``E`` and the ``d`` needed (one hashed
uniform per pass and layer, salt ``OFFLOAD_RESIDENT``), which is exact because count routing gives
every needed expert the same rows (± 1). The same resident set, staging buffer included, serves every
system, although CPU compute would not need the buffer (the paper states no caching rule; one set
keeps the comparison paired).

Not modelled: per-layer CPU dispatch and synchronisation overhead, PCIe transfer setup latency, the
overlap of one layer's expert transfer with the previous layer's compute (prefetch is impossible
before routing), pinned-memory limits, NUMA effects, the caching of streamed experts across passes
(each pass streams every needed non-resident expert again: HBM holds only the staging buffer for
them), and KV writes (KV lives in HBM and its appends are in the roofline's activation traffic).

Knobs are traced, the system kind included: the three systems (and any core caps or splits) stack on
one knob axis and share one compilation (``ServeKnobs.cpu``: :class:`CpuKnobs`). The law of resident
experts among the needed ones is computed from the knobs inside the run (:func:`resident_cdf`), not
stored beside them. Units: µs, bytes, FLOPs, GB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.memory import offload
from hbfjax.salts import Salt
from hbfjax.serve import layer_time
from hbfjax.serve.pass_routing import moe_layer_indices, pass_tokens, pass_routing
from hbfjax.validate import require, require_choice, require_int, require_real
from hbfjax.workload import gpus, routing, timing
from hbfjax.workload.models import ModelSpec

# system kinds, the values of CpuKnobs.system
SYSTEMS = ("cpu-stream", "cpu-compute", "hybrid", "hybrid-split")
DESCRIPTIONS = {
    "cpu-stream": "Weight streaming: every needed non-resident expert copied over PCIe and computed on the GPU",
    "cpu-compute": "CPU compute: every needed non-resident expert computed on the host CPU, one expert per core",
    "hybrid": "Hybrid oracle: the best CPU/GPU split of every layer of every pass (a lower bound)",
    "hybrid-split": "Hybrid at a fixed split: the cpu_experts needed experts with the fewest rows on the CPU",
}
SOURCES = (
    ("gpu", "DASH §VI-C: an H100 PCIe 80 GB with no HBF (workload.gpus 'h100-pcie')"),
    ("cpu", "DASH §VI-C: Xeon Platinum 8452Y (memory.cpus 'xeon-8452y')"),
    ("pcie", "DASH §VI-C: PCIe Gen5 x16 (memory.cpus 'pcie5-x16')"),
    ("cores", "DASH Fig. 10(b): a 32-core cap"),
    ("resident_experts", "hbfjax's rule (module docstring): 0.9 of HBM less weights, KV and a staging layer"),
)
MEMORY_UTILISATION = (0.9, "vLLM's default gpu_memory_utilization: 10 % of HBM left to the CUDA context and "
                      "activations")


def expert_flops_per_row(model: ModelSpec) -> float:
    """FLOPs of one (token, expert) row through one routed expert (2 per multiply-add, every matrix)."""
    return float(sum(2 * l.in_features * l.out_features for l in model.linears("moe") if l.op == "experts"))


def _expert_matrices(model: ModelSpec) -> int:
    return sum(1 for l in model.linears("moe") if l.op == "experts")


def resident_experts(model: ModelSpec, gpu: gpus.GpuSpec | str, kv_tokens: int,
                     memory_utilisation: float = MEMORY_UTILISATION[0]) -> int:
    """Experts per MoE layer that stay in GPU HBM under the module docstring's rule; refused when the
    non-expert weights, the KV and the staging buffer alone exceed the usable HBM."""
    spec = gpus.preset(gpu) if isinstance(gpu, str) else gpu
    kv = require_int("resident_experts", "kv_tokens", kv_tokens, 0) * model.kv_bytes_per_token
    one = layer_time.expert_bytes(model)
    staging = model.routed_experts * one
    free = memory_utilisation * spec.memory_bytes - model.non_expert_weight_bytes - kv - staging
    require(free >= 0, "resident_experts", "kv_tokens", kv_tokens,
            f"non-expert weights ({model.non_expert_weight_bytes / 1e9:.2f} GB) + KV ({kv / 1e9:.2f} GB) + one layer's "
            f"staging ({staging / 1e9:.2f} GB) must fit {memory_utilisation:g} × {spec.memory_bytes / 1e9:g} GB "
            "of HBM")
    return int(min(model.routed_experts, free // (model.moe_layers * one)))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class CpuKnobs:
    """What a sweep over the CPU-offloading systems may vary without recompiling (``ServeKnobs.cpu``)."""

    system: jax.Array  # int32[] index into SYSTEMS
    offload: offload.OffloadKnobs
    resident_experts: jax.Array  # int32[] experts per MoE layer held in GPU HBM

    @classmethod
    def make(cls, model: ModelSpec, gpu: str = "h100-pcie", cores: int = 32, system: str = "hybrid", *,
             kv_tokens: int | None = None, cpu: str = "xeon-8452y", pcie: str = "pcie5-x16", cpu_experts: int = 0,
             resident: int | None = None, memory_utilisation: float = MEMORY_UTILISATION[0],
             **cpu_changes) -> "CpuKnobs":
        """Knobs of ``system`` (one of :data:`SYSTEMS`) for ``model`` on the ``gpu`` preset with a cap of
        ``cores`` host cores. ``kv_tokens``: KV tokens the run holds in HBM at most (a fixed batch:
        B × (L_in + L_out); online: slots × the longest request), which sets the resident experts
        (:func:`resident_experts`) unless ``resident`` gives them; ``cpu_experts`` is the fixed split
        of ``hybrid-split``; ``cpu_changes`` override the CPU's stated rates (``OffloadKnobs.make``:
        ``memory_efficiency``, ``core_bw_gbps``, ``amx_efficiency``, ``pcie_efficiency``)."""
        c = cls.__name__
        require(isinstance(model, ModelSpec) and model.is_moe, c, "model", getattr(model, "name", model),
                "must be a MoE ModelSpec")
        kind = require_choice(c, "system", system, SYSTEMS)
        util = require_real(c, "memory_utilisation", memory_utilisation, 0.0, 1.0, lo_open=True)
        require(resident is not None or kv_tokens is not None, c, "kv_tokens", kv_tokens,
                "must be given (the KV tokens held in HBM set the resident experts) unless resident is")
        if resident is None:
            resident = resident_experts(model, gpu, kv_tokens, util)
        resident = require_int(c, "resident", resident, 0, model.routed_experts)
        return cls(system=jnp.int32(SYSTEMS.index(kind)),
                   offload=offload.OffloadKnobs.make(cpu, pcie, cores=cores, cpu_experts=cpu_experts, **cpu_changes),
                   resident_experts=jnp.int32(resident))


class PassTimes(NamedTuple):
    """One pass on the CPU-offloading systems, with the fields the engine books of any pass's timing
    (the path bytes and the table flag: zeros here, nothing is read from HBF), and the host traffic of
    the selected split (energy: ``hbfjax.energy``)."""

    non_expert_us: jax.Array  # float32[] every non-expert operator and the LM head
    expert_launch_us: jax.Array  # float32[] the grouped expert kernels' launches, per MoE layer
    experts: offload.LayerTimes  # fields [L_moe]: each MoE layer's expert latency under every scheme
    expert_us: jax.Array  # float32[L_moe] the selected system's expert latency
    iteration_us: jax.Array  # float32[] the pass
    expert_direct_bytes: jax.Array  # float32[1] 0
    expert_relay_bytes: jax.Array  # float32[1] 0
    hbm_read_bytes: jax.Array  # float32[] the roofline's HBM bytes: weights and KV read, streamed experts written
    hbf_read_bytes: jax.Array  # float32[] 0
    table_miss: jax.Array  # bool[] False (the roofline only)
    pcie_bytes: jax.Array  # float32[] over PCIe: streamed experts' weights and activations (offload.split_traffic)
    host_dram_bytes: jax.Array  # float32[] expert weights read from host DRAM (streamed or computed on the CPU)
    cpu_flops: jax.Array  # float32[] FLOPs of the rows the host CPU computes
    allreduce_us: jax.Array  # float32[1] 0: one GPU (no tensor parallelism)


class ResidentLaws(NamedTuple):
    """The laws of resident experts among the needed ones (:func:`hypergeometric_cdf`), tabulated on the
    host (float64) and stacked on a leading axis, each with the resident count it is for: inputs of a
    run (``ServeInputs.resident_laws``), looked up by value (:func:`lookup`), so none can be stale."""

    resident: jax.Array  # int32[N]
    cdf: jax.Array  # float32[N, E + 1, E + 1]


def resident_laws(experts: int, resident_counts, pad_to: int | None = None) -> ResidentLaws:
    """The laws for each of ``resident_counts`` (each once) of ``experts`` routed experts, padded to
    ``pad_to`` laws by repeating the last (host)."""
    counts = list(dict.fromkeys(int(r) for r in resident_counts))
    counts += [counts[-1]] * max(0, (pad_to or 0) - len(counts))
    return ResidentLaws(resident=jnp.asarray(counts, jnp.int32),
                        cdf=jnp.asarray(np.stack([hypergeometric_cdf(experts, r) for r in counts])))


def lookup(laws: ResidentLaws, resident) -> tuple[jax.Array, jax.Array]:
    """(the law float32[E + 1, E + 1] for ``resident`` experts, bool[] found)."""
    match = laws.resident == resident
    return laws.cdf[jnp.argmax(match)], match.any()


def hypergeometric_cdf(experts: int, resident: int) -> np.ndarray:
    """float32[E + 1, E + 1]: row d is the CDF over h of the number of resident experts among d needed
    ones, when ``resident`` of ``experts`` are resident and the needed ones are a uniform d-subset
    (host, float64 log-binomials)."""
    lc = lambda n, k: math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)  # noqa: E731
    pmf = np.zeros((experts + 1, experts + 1))
    for d in range(experts + 1):
        for h in range(max(0, d - (experts - resident)), min(resident, d) + 1):
            pmf[d, h] = math.exp(lc(resident, h) + lc(experts - resident, d - h) - lc(experts, d))
    cdf = np.cumsum(pmf, axis=1)
    cdf[np.arange(experts + 1), np.minimum(np.arange(experts + 1), resident)] = 1.0  # the top of each support
    return np.minimum(cdf, 1.0).astype(np.float32)


def resident_needed(u, cdf, needed) -> jax.Array:
    """int32[...]: the inverse CDF at ``u`` of the resident experts among ``needed`` distinct ones, from
    ``cdf`` = :func:`hypergeometric_cdf` (one row per needed count)."""
    return jnp.sum(cdf[jnp.asarray(needed, jnp.int32)] <= u[..., None], axis=-1, dtype=jnp.int32)


def gpu_resident(words: tuple, draw, r: routing.Routing, cpu: CpuKnobs, cdf, config):
    """bool[L_moe, E]: which experts of each MoE layer are in HBM (module docstring; ``cdf``: the law
    of :func:`hypergeometric_cdf` for ``cpu.resident_experts``)."""
    e = config.model.routed_experts
    ids = jnp.arange(e, dtype=jnp.int32)
    layers = jnp.asarray(moe_layer_indices(config.model), jnp.int32)
    if config.routing_draw == "tokens":
        rank = jax.vmap(lambda layer: routing.expert_rank((*words, layer), config.routing))(layers)
        return rank < cpu.resident_experts
    d = r.distinct_experts[:, None]  # the needed experts are ids 0 … d − 1
    u = rng.uniform01(rng.mix(*words, draw, layers, Salt.OFFLOAD_RESIDENT))
    h = resident_needed(u, cdf, r.distinct_experts)[:, None]
    return (ids < h) | ((ids >= d) & (ids < d + cpu.resident_experts - h))


def expert_gpu_us(rows, gpu: timing.GpuKnobs, config: timing.TimingConfig) -> jax.Array:
    """float32[..., E]: each expert's GPU time at its ``rows`` with its weights in HBM, the roofline of
    its own GEMMs (``timing.expert_costs`` of a one-expert layer) without the kernel launches."""
    costs, _ = timing.expert_costs(jnp.asarray(rows, jnp.int32)[..., None], gpu, config)
    i = timing.OPS.index("experts")
    return costs.time_us[..., i] - costs.kernels[..., i] * gpu.launch_us


def select(experts: offload.LayerTimes, kind) -> jax.Array:
    """float32[L_moe]: the expert latency of system ``kind`` (index into :data:`SYSTEMS`)."""
    return jnp.stack([experts.stream_us, experts.cpu_compute_us, experts.oracle_us, experts.hybrid_us])[kind]


def selected_split(times: offload.LayerTimes, cpu: CpuKnobs, experts: int) -> jax.Array:
    """int32[]: the CPU experts of one layer's split under ``cpu.system`` (``offload.split_on_cpu``'s k):
    0 for weight streaming, every candidate for CPU compute, the oracle's k, or the fixed split."""
    ks = jnp.stack([jnp.int32(0), jnp.int32(experts), times.oracle_cpu_experts,
                    jnp.asarray(cpu.offload.cpu_experts, jnp.int32)])
    return ks[cpu.system]


def non_expert_hbm_bytes(base: timing.StepCosts, model: ModelSpec) -> jax.Array:
    """float32[]: the weights and KV the roofline reads from HBM for every operator but the routed
    experts (``base``: ``timing.step_costs`` with no expert rows)."""
    per = lambda c: jnp.sum(c.weight_bytes + c.kv_bytes)  # noqa: E731
    return model.moe_layers * per(base.moe) + model.dense_layers * per(base.dense) + \
        base.lm_head.weight_bytes + base.lm_head.kv_bytes


def pass_times(words: tuple, batch: timing.Batch, draw, knobs, cdf, config) -> PassTimes:
    """One pass's time on the selected system (module docstring); ``words`` = (seed, stream), ``knobs``
    a ``ServeKnobs`` with ``cpu`` set, ``cdf`` its resident law (:func:`lookup`), ``config`` a
    ``ServeConfig``."""
    model, tc, cpu = config.model, config.timing, knobs.cpu
    r = pass_routing(words, batch, draw, knobs.routing, config, compact=False)
    base = timing.step_costs(batch, jnp.zeros((model.routed_experts,), jnp.int32), knobs.gpu, tc)
    non_expert = model.moe_layers * base.moe_layer_us + model.dense_layers * base.dense_layer_us + \
        base.lm_head.time_us
    tokens = pass_tokens(batch)

    def per_layer(rows, resident, gpu_us):
        layer = offload.ExpertLayer(tokens=rows, gpu_resident=resident, gpu_us=gpu_us,
                                    expert_bytes=jnp.float32(layer_time.expert_bytes(model)),
                                    flops_per_row=jnp.float32(expert_flops_per_row(model)),
                                    activation_bytes=jnp.float32(model.hidden * tc.activation_bytes),
                                    batch_tokens=tokens)
        times = offload.layer_times(layer, cpu.offload)
        on_cpu = offload.split_on_cpu(layer, selected_split(times, cpu, rows.shape[0]))
        return times, offload.split_traffic(layer, on_cpu)

    experts, traffic = jax.vmap(per_layer)(r.rows, gpu_resident(words, draw, r, cpu, cdf, config),
                                           expert_gpu_us(r.rows, knobs.gpu, tc))
    expert_us = select(experts, cpu.system)
    active = r.rows.sum(axis=-1) > 0
    launch = jnp.float32(_expert_matrices(model)) * knobs.gpu.launch_us
    total = non_expert + jnp.sum(jnp.where(active, launch + expert_us, 0.0))
    zero = jnp.float32(0.0)
    hbm = non_expert_hbm_bytes(base, model) + traffic.gpu_hbm_bytes.sum()
    return PassTimes(non_expert_us=non_expert, expert_launch_us=launch, experts=experts, expert_us=expert_us,
                     iteration_us=total, expert_direct_bytes=jnp.zeros(1, jnp.float32),
                     expert_relay_bytes=jnp.zeros(1, jnp.float32), hbm_read_bytes=hbm, hbf_read_bytes=zero,
                     table_miss=jnp.bool_(False), pcie_bytes=traffic.pcie_bytes.sum(),
                     host_dram_bytes=traffic.host_dram_bytes.sum(), cpu_flops=traffic.cpu_flops.sum(),
                     allreduce_us=jnp.zeros(1, jnp.float32))
