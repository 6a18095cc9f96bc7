"""One iteration's time through every layer on a memory organisation: the GPU's operator costs
composed with the delivery of each operator's data (DASH §V-B, §V-C; DESIGN.md §5 "The step").

Every operator of a layer (``hbfjax.workload.timing.OPS``) runs as its kernels on the GPU while the
data it reads stream in from the organisation (``hbfjax.memory``); an operator with work takes

    op_us = max(compute_us, activation_us, delivery_us) + kernels × launch_us

* ``compute_us``, ``activation_us`` and the kernel count come from the GPU roofline
  (``timing.step_costs`` / ``timing.expert_costs``); activations (and the new KV the kernels write)
  move through the GPU's own memory at its bandwidth, as the roofline counts them.
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

Overlap assumed, stated here once: within an operator, data delivery and compute overlap fully
(double-buffered streaming into the GEMM); operators of a layer run one after another, and no
operator's transfer starts during the previous one beyond the tR that prefetching hides. The first
token of an operator's data is therefore on the critical path only through tR. KV writes (direct
prefill write, decode writeback) are not composed here; the step adds them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.memory import delivery
from hbfjax.memory.organisations import DENSE_WEIGHTS, EXPERT_WEIGHTS, OrgKnobs
from hbfjax.workload import timing
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


def expert_bytes(model: ModelSpec) -> float:
    """Bytes of one routed expert (all its matrices, one copy)."""
    return float(sum(l.in_features * l.out_features * l.bytes_per_param for l in model.linears("moe")
                     if l.op == "experts"))


def _op_us(costs: timing.OpCosts, delivery_us, gpu: timing.GpuKnobs):
    """float32[..., ops] op_us of the module docstring."""
    activation_us = costs.other_bytes * 1e-3 / (gpu.hbm_bw_gbps * gpu.memory_efficiency)
    busy = jnp.maximum(jnp.maximum(costs.compute_us, activation_us), delivery_us)
    return jnp.where(costs.kernels > 0, busy + costs.kernels * gpu.launch_us, 0.0)


def _operator_delivery(costs: timing.OpCosts, kv_hbm_fraction, org: OrgKnobs) -> jax.Array:
    """float32[..., ops]: weights placed by kind and KV split between the tiers, read in parallel."""
    row = jnp.where(_EXPERT_KIND[:, None], org.place[EXPERT_WEIGHTS], org.place[DENSE_WEIGHTS])  # f32[ops, 3]
    w = costs.weight_bytes[..., None] * row
    kv = jnp.where(_ATTENTION, costs.kv_bytes, 0.0)
    f = jnp.asarray(kv_hbm_fraction, jnp.float32)
    return delivery.parallel_read(w[..., 0] + kv * f, w[..., 1] + kv * (1.0 - f), org, either_bytes=w[..., 2]).read_us


def layer_times(batch: timing.Batch, needed: jax.Array, rows: jax.Array, kv_hbm_fraction, gpu: timing.GpuKnobs,
                org: OrgKnobs, config: timing.TimingConfig) -> LayerTimes:
    """Per-layer times of one iteration (module docstring). ``needed: bool[L_moe, E]`` and
    ``rows: int32[L_moe, E]`` are each MoE layer's routing (``hbfjax.workload.routing.route_layers``),
    in layer order; ``kv_hbm_fraction`` (float32[]) is the share of the KV the attention reads that
    is held in HBM. Roofline timing (a measured table is not composed yet)."""
    model = config.model
    kinds = np.array(model.layer_kinds)
    rows = jnp.asarray(rows, jnp.int32)
    base = timing.step_costs(batch, jnp.zeros((max(model.routed_experts, 1),), jnp.int32), gpu, config)
    dense_delivery = _operator_delivery(base.dense, kv_hbm_fraction, org)
    moe_delivery = _operator_delivery(base.moe, kv_hbm_fraction, org)
    dense_op = _op_us(base.dense, dense_delivery, gpu)
    moe_base_op = _op_us(base.moe, moe_delivery, gpu)
    head = _op_us(base.lm_head, delivery.replicated_read(base.lm_head.weight_bytes, org, DENSE_WEIGHTS).read_us, gpu)

    layers = len(kinds)
    op_us = jnp.broadcast_to(dense_op, (layers, len(OPS)))
    delivery_us = jnp.broadcast_to(dense_delivery, (layers, len(OPS)))
    compute_us = jnp.broadcast_to(base.dense.compute_us, (layers, len(OPS)))
    direct = relay = startup = jnp.zeros((layers,), jnp.float32)
    moe_index = np.flatnonzero(kinds == "moe")
    if moe_index.size:
        experts, _ = timing.expert_costs(rows, gpu, config)  # fields float32[L_moe, ops]
        window = moe_base_op[OPS.index("out_proj")] + moe_base_op[OPS.index("norms")] + \
            moe_base_op[OPS.index("router")]
        window = window if model.lookahead_capable else jnp.float32(0.0)
        routed = delivery.expert_delivery(needed, expert_bytes(model), org, window_us=window)  # [L_moe]
        moe_delivery_l = jnp.broadcast_to(moe_delivery, (moe_index.size, len(OPS))).at[:, _EXPERTS].set(
            routed.delivery_us)
        moe_costs = timing.OpCosts(*(jnp.where(jnp.arange(len(OPS)) == _EXPERTS, e, b)
                                     for b, e in zip(base.moe, experts)))
        moe_op = _op_us(moe_costs, moe_delivery_l, gpu)
        op_us = op_us.at[moe_index].set(moe_op)
        delivery_us = delivery_us.at[moe_index].set(moe_delivery_l)
        compute_us = compute_us.at[moe_index].set(moe_costs.compute_us)
        direct = direct.at[moe_index].set(routed.direct_bytes)
        relay = relay.at[moe_index].set(routed.relay_bytes)
        slow_startup = jnp.where(routed.slow_path == 0, routed.direct_startup_us, routed.relay_startup_us)
        startup = startup.at[moe_index].set(slow_startup)
    layer_us = op_us.sum(axis=-1)
    return LayerTimes(op_us=op_us, delivery_us=delivery_us, compute_us=compute_us, layer_us=layer_us,
                      lm_head_us=head, iteration_us=layer_us.sum() + head, expert_direct_bytes=direct,
                      expert_relay_bytes=relay, expert_startup_us=startup)

