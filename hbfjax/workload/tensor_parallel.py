"""Tensor parallelism of one serving stream: T GPUs, each with its own memory package, serve the same
requests, each holding and computing 1/T of every split weight matrix (HBFlex §6.1: "DeepSeek-V4-Pro
uses two-way tensor parallelism (TP) combined with four-way data parallelism (DP)").

**The split** (Megatron-LM's, as vLLM serves these models), applied by ``ModelSpec(tensor_parallel=T)``,
whose every derived size is then one GPU's:

* attention by heads: each GPU computes ``heads / T`` query heads (Q or MLA's q_b, and MLA's kv_b
  column-parallel; the output projection row-parallel; DeepSeek-V4's grouped o_a by its groups, o_b by
  rows), so its attention FLOPs per (query, context) pair are 1/T;
* KV heads: GQA splits them too (``kv_heads / T`` each, so 1/T of the KV cache per GPU); where T exceeds
  the KV heads (DeepSeek-V4-Pro's one shared KV head) each GPU holds one whole KV head — **replicated**,
  as is MLA's compressed latent (shared by all heads): with MLA and DeepSeek-V4 every GPU caches, writes
  and reads the whole KV of every token, as vLLM does for latent KV;
* FFNs by their intermediate columns: every routed expert's, the shared experts' and dense FFNs'
  gate/up column-parallel and down row-parallel (each GPU holds 1/T of every expert: T-way tensor
  parallelism inside each expert, not expert parallelism);
* **replicated** (whole on every GPU): the low-rank down projections (q_a, MLA's kv_a), a replicated KV
  head's projection, the router, the norms, the embedding and the LM head (Megatron splits the last two by
  vocabulary and gathers the logits; here each GPU computes the logits itself: no gather is timed), and
  the multi-token-prediction module's own projection and embedding copy.

So per GPU the streamed weight bytes and matmul FLOPs of the split matrices are 1/T, and the KV room is
what the GPU's package leaves after its own share of the weights (``kv_tiers.capacity_tokens`` on the
per-GPU model).

**The all-reduces.** Row-parallel outputs are partial sums, reduced across the group twice per layer:
after attention's output projection and after the MoE / FFN (:data:`ALLREDUCES_PER_LAYER`). Each moves
the pass's activations, ``tokens × hidden × 2`` bytes (BF16), and a ring all-reduce over T GPUs takes

    allreduce_us = 2 (T − 1) / T × bytes / (link_gbps × efficiency × 1e3) + latency_us

(0 for T = 1). ``link_gbps`` is one GPU's NVLink rate in one direction (:mod:`hbfjax.workload.gpus`: the
H200 SXM's NVLink 4 is 900 GB/s bidirectional per GPU, 450 GB/s each way, NVIDIA H200 datasheet);
``efficiency`` and ``latency_us`` are **assumed** (:data:`KNOB_DEFAULTS`), traced knobs of
``timing.GpuKnobs``. The all-reduces lie on each layer's critical path, after the operators
(``layer_time.layer_times``): no data is delivered to the GPU during them, and none of the engine's
windows counts them (the lookahead window that hides tR, DASH's KV-write window, HBFlex's idle array time
all sum operators, and an all-reduce is not one), so writes and tR hide no more than at T = 1 — the
conservative reading, stated.

T itself is static (a ``ModelSpec`` field): no array shape depends on it, but it changes the per-GPU model,
whose sizes (KV bytes per token, weight and expert bytes) are static constants of every module and both
references; a T sweep compiles once per T.
"""

from __future__ import annotations

import jax.numpy as jnp

ALLREDUCES_PER_LAYER = 2  # after attention's output projection and after the MoE / FFN (Megatron-LM)

# Defaults of GpuKnobs.make's all-reduce knobs: (value, source). Neither is measured here.
KNOB_DEFAULTS = {
    "allreduce_efficiency": (0.8, "assumed: a ring all-reduce's bus bandwidth reaches about 80 % of one NVLink "
                                  "direction (NCCL-class, large messages)"),
    "allreduce_latency_us": (10.0, "assumed: fixed cost of one all-reduce inside one NVLink node (launch and "
                                   "synchronisation, NCCL-class small messages)"),
}


def kv_heads_per_gpu(kv_heads: int, gpus: int) -> int:
    """KV heads one GPU of ``gpus`` holds: its share where ``gpus`` divides them, else one (replicated)."""
    return kv_heads // gpus if kv_heads % gpus == 0 else 1


def split_problems(model, gpus: int) -> list[str]:
    """Why ``gpus``-way tensor parallelism cannot split ``model`` (a ``ModelSpec``) evenly; [] when it can."""
    need = [("heads", model.heads)]
    need += [(name, getattr(model, name)) for name in ("expert_ffn", "shared_expert_ffn", "dense_ffn")
             if getattr(model, name) > 0]
    if model.attention == "compressed" and model.o_lora_rank:
        need.append(("o_groups", model.o_groups))
    problems = [f"must divide {name} = {n}" for name, n in need if n % gpus]
    if model.attention in ("gqa", "compressed") and model.kv_heads % gpus and gpus % model.kv_heads:
        problems.append(f"must divide kv_heads = {model.kv_heads} or be a multiple of it (replicated KV heads)")
    return problems


def allreduce_us(message_bytes, gpus: int, link_gbps, efficiency, latency_us):
    """µs of one ring all-reduce of ``message_bytes`` (float32[...]) over ``gpus`` GPUs (module
    docstring); 0 where there is nothing to reduce or one GPU."""
    if gpus == 1:
        return jnp.zeros(jnp.shape(message_bytes), jnp.float32)
    wire = 2.0 * (gpus - 1) / gpus * message_bytes / (link_gbps * efficiency * 1e3)
    return jnp.where(message_bytes > 0, wire + latency_us, 0.0)


def layer_allreduce_us(tokens, hidden: int, activation_bytes: int, gpus: int, link_gbps, efficiency, latency_us):
    """µs of one layer's all-reduces for a pass of ``tokens`` tokens (float32[...]): two of
    ``tokens × hidden × activation_bytes`` bytes each."""
    message = jnp.asarray(tokens, jnp.float32) * float(hidden * activation_bytes)
    return ALLREDUCES_PER_LAYER * allreduce_us(message, gpus, link_gbps, efficiency, latency_us)


def describe(gpus: int, link_gbps: float, efficiency: float, latency_us: float) -> dict:
    """The run header's statement of the tensor parallelism and its all-reduce assumptions (values to 6 digits:
    the knobs are float32)."""
    link_gbps, efficiency, latency_us = (float(f"{float(v):.6g}") for v in (link_gbps, efficiency, latency_us))
    return {"gpus": gpus, "allreduces_per_layer": ALLREDUCES_PER_LAYER, "allreduce_bytes": "tokens × hidden × 2 (BF16)",
            "allreduce_formula": "2 (T − 1) / T × bytes / (link_gbps × efficiency) + latency_us",
            "link_gbps": link_gbps, "link_source": "NVLink, one direction (the GPU datasheet's bidirectional rate / 2)",
            "efficiency": efficiency, "latency_us": latency_us,
            "assumed": {k: v[1] for k, v in KNOB_DEFAULTS.items()},
            "replicated": "KV of MLA / one shared KV head, q_a and kv_a projections, router, norms, embedding, LM head",
            "critical_path": "both all-reduces of each layer, in no overlap window"}
