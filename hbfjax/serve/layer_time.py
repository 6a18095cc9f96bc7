"""One iteration's time through every layer on a memory organisation: the GPU's operator costs
composed with the delivery of each operator's data (DASH §V-B, §V-C; DESIGN.md §5 "The step").

Every operator of a layer (``hbfjax.workload.timing.OPS``) runs as its kernels on the GPU while the
data it reads stream in from the organisation (``hbfjax.memory``); an operator with work takes

    op_us = max(compute_us, activation_us, delivery_us) + kernels × launch_us

* ``compute_us``, ``activation_us`` and the kernel count come from the GPU roofline
  (``timing.step_costs`` / ``timing.expert_costs``); activations (and the new KV the kernels write)
  move through the GPU's own memory at its bandwidth, as the roofline counts them. With a measured
  table (``hbfjax profile``), an operator takes ``max(measured_us, delivery_us + kernels × launch_us)``
  instead: the measured time (launches and the profiling GPU's own memory traffic included) is the
  floor, and the organisation's delivery replaces it where it is slower (DASH §VI-A: measured GPU
  operator latencies, HBF transfers modelled).
* ``delivery_us`` replaces the roofline's weight and KV traffic. Weights of the non-expert operators
  (attention projections, router, dense FFN, LM head) are dense weights, shared experts are expert
  weights (``OrgKnobs.place``): their HBM-only, HBF-only and replicated shares and the KV the
  attention operators read (``kv_hbm_fraction`` of it in HBM, the rest in HBF) are one
  ``delivery.parallel_read`` per operator (DASH §V-B "Parallel HBM/HBF Read"). These accesses follow
  the execution order, so tR is hidden (DASH §V-C).
* The routed experts of each MoE layer are delivered by ``delivery.expert_delivery`` (whole experts
  over Direct or Relay, T = max(T_Direct, T_Relay), tR exposed unless lookahead hides it). Lookahead
  (DASH §V-C) selects the experts as soon as the attention output exists, so the window that hides
  tR is that layer's output projection, norms and router; a router with an expert-specific bias
  (``ModelSpec.lookahead_capable`` False, e.g. DeepSeek-V3) gets no window, whatever the knob says.

A tensor-parallel model (``ModelSpec.tensor_parallel`` T > 1: every size above is one GPU's) adds each
layer's two all-reduces after its operators (``allreduce_us``, :mod:`hbfjax.workload.tensor_parallel`):
on the critical path, in no window below.

Overlap assumed, stated here once: within an operator, data delivery and compute overlap fully
(double-buffered streaming into the GEMM); operators of a layer run one after another, and no
operator's transfer starts during the previous one beyond the tR that prefetching hides. The first
token of an operator's data is therefore on the critical path only through tR. KV writes (direct
prefill write, decode writeback) run beside a layer's operators, from its QKV projection to its
expert reads (:func:`kv_writes`); the serving step adds what they expose.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.memory import delivery
from hbfjax.memory.organisations import DENSE_WEIGHTS, EXPERT_WEIGHTS, OrgKnobs, page_wave_bytes
from hbfjax.workload import tensor_parallel, timing
from hbfjax.workload.models import ModelSpec

OPS = timing.OPS
_EXPERTS = OPS.index("experts")
_ATTENTION = np.isin(np.array(OPS), ("attention_decode", "attention_prefill"))
# operators whose weights are expert weights in the placement; every other weight is a dense weight
_EXPERT_KIND = np.array([op == "shared_experts" for op in OPS])


class LayerTimes(NamedTuple):
    """One iteration through the model on one organisation (layers in ``ModelSpec.layer_kinds`` order)."""

    op_us: jax.Array  # float32[L, ops] each operator's time, launch included
    delivery_us: jax.Array  # float32[L, ops] time to bring each operator's weights and KV to the GPU
    compute_us: jax.Array  # float32[L, ops] roofline compute time
    layer_us: jax.Array  # float32[L]
    lm_head_us: jax.Array  # float32[]
    iteration_us: jax.Array  # float32[] every layer and the LM head
    expert_direct_bytes: jax.Array  # float32[L] routed-expert bytes over Direct (0 for dense layers)
    expert_relay_bytes: jax.Array  # float32[L] routed-expert bytes over Relay
    expert_startup_us: jax.Array  # float32[L] exposed tR (and first relay chunk) of the slower path
    table_miss: jax.Array  # bool[] with a measured table: an active operator fell outside it (NaN time)
    hbm_read_bytes: jax.Array  # float32[] non-routed-expert bytes read from HBM (weights and KV), every layer
    hbf_read_bytes: jax.Array  # float32[] non-routed-expert bytes read from HBF, every layer and the LM head
    pcie_bytes: jax.Array  # float32[] 0: an organisation has no host path (the CPU systems' field)
    host_dram_bytes: jax.Array  # float32[] 0
    cpu_flops: jax.Array  # float32[] 0
    allreduce_us: jax.Array  # float32[L] each layer's tensor-parallel all-reduces (0 for one GPU)
    needed: jax.Array | None = None  # the pass's routing draw (``pass_routing``'s needed; engine.pass_times sets it)


def expert_bytes(model: ModelSpec) -> float:
    """Bytes of one routed expert (all its matrices, one copy)."""
    return float(sum(l.in_features * l.out_features * l.bytes_per_param for l in model.linears("moe")
                     if l.op == "experts"))


def _op_us(costs: timing.OpCosts, delivery_us, gpu: timing.GpuKnobs, measured: bool = False):
    """float32[..., ops] op_us of the module docstring (``measured``: ``costs.time_us`` is a table's)."""
    launches = costs.kernels * gpu.launch_us
    if measured:
        return jnp.where(costs.kernels > 0, jnp.maximum(costs.time_us, delivery_us + launches), 0.0)
    activation_us = costs.other_bytes * 1e-3 / (gpu.hbm_bw_gbps * gpu.memory_efficiency)
    busy = jnp.maximum(jnp.maximum(costs.compute_us, activation_us), delivery_us)
    return jnp.where(costs.kernels > 0, busy + launches, 0.0)


def kv_share_per_op(kv_hbm_fraction) -> jax.Array:
    """float32[ops]: the HBM share of each operator's KV reads, from one share (float32[]) or a
    (decode attention, chunk attention) pair."""
    if isinstance(kv_hbm_fraction, tuple):
        decode, prefill = (jnp.asarray(f, jnp.float32) for f in kv_hbm_fraction)
        return jnp.where(np.array(OPS) == "attention_decode", decode, jnp.where(np.array(OPS) == "attention_prefill",
                                                                               prefill, 0.0))
    return jnp.broadcast_to(jnp.asarray(kv_hbm_fraction, jnp.float32), (len(OPS),))


def _operator_delivery(costs: timing.OpCosts, kv_share: jax.Array, org: OrgKnobs,
                       kv_hbf_factor=1.0) -> delivery.ParallelRead:
    """Per operator (``[..., ops]``): weights placed by kind and KV split between the tiers by
    ``kv_share`` (float32[ops]), read in parallel; the HBF share of the KV costs ``kv_hbf_factor`` times
    its bytes (plane collisions: read-wave amplification, ``hbfjax.flash.reads.wave``)."""
    row = jnp.where(_EXPERT_KIND[:, None], org.place[EXPERT_WEIGHTS], org.place[DENSE_WEIGHTS])  # f32[ops, 3]
    w = costs.weight_bytes[..., None] * row
    kv = jnp.where(_ATTENTION, costs.kv_bytes, 0.0)
    return delivery.parallel_read(w[..., 0] + kv * kv_share, w[..., 1] + kv * (1.0 - kv_share) * kv_hbf_factor, org,
                                  either_bytes=w[..., 2])


def layer_times(batch: timing.Batch, needed: jax.Array, rows: jax.Array, kv_hbm_fraction, gpu: timing.GpuKnobs,
                org: OrgKnobs, config: timing.TimingConfig, table=None, delivery_table=None,
                kv_hbf_factor=1.0, temperature_us=None) -> LayerTimes:
    """Per-layer times of one iteration (module docstring). ``needed: bool[L_moe, E]`` and
    ``rows: int32[L_moe, E]`` are each MoE layer's routing (``hbfjax.workload.routing.route_layers``),
    in layer order (or, as count routing draws them, ``needed`` as int32[L_moe] counts and ``rows`` a
    ``timing.EvenRows``); ``kv_hbm_fraction`` is the share of the KV the attention reads that is held in HBM:
    one float32[] or a (decode attention, chunk attention) pair (:func:`kv_share_per_op`). ``table``:
    measured curves (``profile_table.Curves``) or None for the roofline. ``delivery_table``: the
    organisation's ``delivery.expert_delivery_table`` for this model's experts, built once per run (the
    same delivery, one gather per layer instead of the split search). ``kv_hbf_factor`` (float32[] >= 1)
    multiplies the time of the HBF share of the attention's KV reads (read-wave amplification); the
    bytes reported in ``hbf_read_bytes`` are then the amplified ones. ``temperature_us`` (None: exact)
    relaxes the experts' split and path maxima (``delivery`` module docstring "Relaxation"; the table
    must have been built with the same temperature)."""
    model = config.model
    kinds = np.array(model.layer_kinds)
    if not isinstance(rows, timing.EvenRows):
        rows = jnp.asarray(rows, jnp.int32)
    measured = table is not None
    base = timing.step_costs(batch, jnp.zeros((max(model.routed_experts, 1),), jnp.int32), gpu, config, table)
    share = kv_share_per_op(kv_hbm_fraction)
    dense_read = _operator_delivery(base.dense, share, org, kv_hbf_factor)
    moe_read = _operator_delivery(base.moe, share, org, kv_hbf_factor)
    head_read = delivery.replicated_read(base.lm_head.weight_bytes, org, DENSE_WEIGHTS)
    dense_delivery, moe_delivery = dense_read.read_us, moe_read.read_us
    dense_op = _op_us(base.dense, dense_delivery, gpu, measured)
    moe_base_op = _op_us(base.moe, moe_delivery, gpu, measured)
    head = _op_us(base.lm_head, head_read.read_us, gpu, measured)
    miss = base.table_miss.any()

    layers = len(kinds)
    n_moe = int((kinds == "moe").sum())
    hbm_read = (layers - n_moe) * dense_read.hbm_bytes.sum() + n_moe * moe_read.hbm_bytes.sum() + head_read.hbm_bytes
    hbf_read = (layers - n_moe) * dense_read.hbf_bytes.sum() + n_moe * moe_read.hbf_bytes.sum() + head_read.hbf_bytes
    op_us = jnp.broadcast_to(dense_op, (layers, len(OPS)))
    delivery_us = jnp.broadcast_to(dense_delivery, (layers, len(OPS)))
    compute_us = jnp.broadcast_to(base.dense.compute_us, (layers, len(OPS)))
    direct = relay = startup = jnp.zeros((layers,), jnp.float32)
    moe_index = np.flatnonzero(kinds == "moe")
    if moe_index.size:
        experts, experts_miss = timing.expert_costs(rows, gpu, config, table)  # fields float32[L_moe, ops]
        miss = miss | experts_miss.any()
        window = moe_base_op[OPS.index("out_proj")] + moe_base_op[OPS.index("norms")] + \
            moe_base_op[OPS.index("router")]
        window = window if model.lookahead_capable else jnp.float32(0.0)
        if delivery_table is None:
            routed = delivery.expert_delivery(needed, expert_bytes(model), org, window_us=window,
                                              temperature_us=temperature_us)  # [L_moe]
        else:
            routed = delivery.expert_delivery_lookup(delivery_table, needed, org, window_us=window,
                                                     temperature_us=temperature_us)
        # only the experts column differs between MoE layers: cost it on [L_moe], the rest once
        routed_costs = timing.OpCosts(*(f[..., _EXPERTS] for f in experts))  # fields float32[L_moe]
        is_experts = jnp.arange(len(OPS)) == _EXPERTS
        per_layer = lambda col, row: jnp.where(is_experts, col[:, None], row[None, :])  # noqa: E731  [L_moe, ops]
        moe_op = per_layer(_op_us(routed_costs, routed.delivery_us, gpu, measured), moe_base_op)
        op_us = op_us.at[moe_index].set(moe_op)
        delivery_us = delivery_us.at[moe_index].set(per_layer(routed.delivery_us, moe_delivery))
        compute_us = compute_us.at[moe_index].set(per_layer(routed_costs.compute_us, base.moe.compute_us))
        direct = direct.at[moe_index].set(routed.direct_bytes)
        relay = relay.at[moe_index].set(routed.relay_bytes)
        slow_startup = jnp.where(routed.slow_path == 0, routed.direct_startup_us, routed.relay_startup_us)
        startup = startup.at[moe_index].set(slow_startup)
    layer_us = op_us.sum(axis=-1)
    allreduce = jnp.broadcast_to(allreduce_us(batch, gpu, config), (layers,))
    if model.tensor_parallel > 1:  # static: one GPU's layers are exactly those of before
        layer_us = layer_us + allreduce
    return LayerTimes(op_us=op_us, delivery_us=delivery_us, compute_us=compute_us, layer_us=layer_us,
                      lm_head_us=head, iteration_us=layer_us.sum() + head, expert_direct_bytes=direct,
                      expert_relay_bytes=relay, expert_startup_us=startup, table_miss=miss, hbm_read_bytes=hbm_read,
                      hbf_read_bytes=hbf_read, pcie_bytes=jnp.float32(0.0), host_dram_bytes=jnp.float32(0.0),
                      cpu_flops=jnp.float32(0.0), allreduce_us=allreduce)


def allreduce_us(batch: timing.Batch, gpu: timing.GpuKnobs, config: timing.TimingConfig) -> jax.Array:
    """float32[]: one layer's tensor-parallel all-reduces for the pass's tokens (0 for one GPU)."""
    return tensor_parallel.layer_allreduce_us(timing.tokens_of(batch), config.model.hidden, config.activation_bytes,
                                              config.model.tensor_parallel, gpu.nvlink_gbps, gpu.allreduce_efficiency,
                                              gpu.allreduce_latency_us)



# --- KV writes (DASH §V-B "Direct Prefill Write", "HBM-to-HBF KV Writeback") -----------------------

# what runs after a layer's QKV projection and before its experts read HBF: the window in which the
# layer's KV writes are sent and programmed (both start once the QKV projection has produced the KV)
WRITE_WINDOW_OPS = ("attention_decode", "attention_prefill", "out_proj", "norms", "router", "dense_ffn")
_WINDOW = np.isin(np.array(OPS), WRITE_WINDOW_OPS)


class KvWrites(NamedTuple):
    """One pass's KV writes into HBF and what they expose."""

    stall_us: jax.Array  # float32[L] per layer: the writes' time beyond its window
    program_busy_us: jax.Array  # float32[] page-wave programs × tPROG, every layer
    direct_bytes: jax.Array  # float32[] new KV written from the GPU straight to HBF
    writeback_bytes: jax.Array  # float32[] KV written back from HBM to HBF


def write_window_us(times: LayerTimes) -> jax.Array:
    """float32[L]: each layer's operators between its QKV projection and its expert reads."""
    return jnp.where(_WINDOW, times.op_us, 0.0).sum(axis=-1)


def _block_excess(need_us, window_us, block_layers) -> jax.Array:
    """float32[L]: per block of ``block_layers`` consecutive layers, max(Σ need − Σ window, 0) on the
    block's last layer, 0 on the others (:func:`kv_writes`; one block a layer gives max(need − window, 0))."""
    layers = need_us.shape[0]
    index = jnp.arange(layers)
    n = jnp.maximum(jnp.asarray(block_layers, jnp.float32), 1.0)
    block = jnp.floor(index / n).astype(jnp.int32)  # int32[L]
    excess = jnp.maximum(jax.ops.segment_sum(need_us, block, num_segments=layers)
                         - jax.ops.segment_sum(jnp.broadcast_to(window_us, need_us.shape), block, num_segments=layers),
                         0.0)  # f32[L] by block
    last = index == jnp.minimum(((block + 1) * n).astype(jnp.int32) - 1, layers - 1)
    return jnp.where(last, excess[block], 0.0)


def kv_writes(times: LayerTimes, to_hbf_tokens, writeback_tokens, org: OrgKnobs, model: ModelSpec) -> KvWrites:
    """The KV writes of a pass (``kv_tiers.book``'s token counts) laid on its layers.

    Every layer writes its own KV of the ``to_hbf_tokens`` new HBF-bound tokens straight from the GPU
    (``delivery.prefill_write``). The ``writeback_tokens`` (all layers' KV of each) are moved as whole
    page waves, spread over the layers' windows one wave at a time (layer l gets ``W // L`` waves, one
    more while ``l < W mod L``; ``delivery.writeback_write``). The two kinds share a layer's HBF
    programs, so they run one after the other; what exceeds the layer's window
    (:func:`write_window_us`) is exposed. With ``org.write_window_layers = N`` > 1 the layers form
    blocks of N (the last may be shorter) whose writes may overlap any window of their block: a block
    exposes what its writes take beyond its windows' sum, booked on its last layer (N = 1 is DASH
    §V-B's "the following attention computation"; N > 1 reads §VI-F's "alongside independent work" as
    N layers). Writes and reads cross the links in opposite directions and do not compete for them; a
    program's interference with the same window's HBF reads (plane collisions) is not modelled here."""
    layers = times.layer_us.shape[0]
    per_layer = float(model.kv_bytes_per_token_layer)
    direct = delivery.prefill_write(jnp.asarray(to_hbf_tokens, jnp.float32) * per_layer, org)
    back_bytes = jnp.asarray(writeback_tokens, jnp.float32) * float(model.kv_bytes_per_token)
    waves = jnp.ceil(back_bytes / page_wave_bytes(org))
    share = jnp.floor(waves / layers) + (jnp.arange(layers) < jnp.mod(waves, layers))  # f32[L] waves per layer
    back = delivery.writeback_write(back_bytes * share / jnp.maximum(waves, 1.0), org)  # fields f32[L]
    stall = _block_excess(direct.write_us + back.write_us, write_window_us(times), org.write_window_layers)
    return KvWrites(stall_us=stall, program_busy_us=layers * direct.program_busy_us + back.program_busy_us.sum(),
                    direct_bytes=jnp.asarray(to_hbf_tokens, jnp.float32) * float(model.kv_bytes_per_token),
                    writeback_bytes=back_bytes)
