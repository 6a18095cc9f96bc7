"""Tiny ModelSpecs with hand-countable sizes for the timing tests (real ``hbfjax.workload.models``
specs, not presets)."""

from __future__ import annotations

from hbfjax.workload.models import ModelSpec

# 4 layers: one dense, three MoE; GQA 4 heads over 2 KV heads of 16 dims; a float32 router
GQA = ModelSpec(name="tiny-gqa", layers=4, hidden=64, vocab=500, attention="gqa", heads=4, kv_heads=2, head_dim=16,
                first_dense_layers=1, routed_experts=8, shared_experts=1, top_k=2, expert_ffn=32, shared_expert_ffn=32,
                dense_ffn=128, weight_bytes_per_param=(("router", 4.0),))
# 3 layers: one dense, two MoE; MLA with a latent of 4, rope 2, nope 3 and values of 6 dims, 2 heads
MLA = ModelSpec(name="tiny-mla", layers=3, hidden=64, vocab=500, attention="mla", heads=2, kv_lora_rank=4,
                qk_nope_head_dim=3, qk_rope_head_dim=2, v_head_dim=6, first_dense_layers=1, routed_experts=8, top_k=2,
                expert_ffn=32, dense_ffn=128)


def single_gemm(hidden: int, bytes_per_param: float = 2.0) -> ModelSpec:
    """A one-layer dense model whose QKV projection is one hidden × hidden GEMM ((16 + 2·8) heads × hidden/32)."""
    return ModelSpec(name="one-gemm", layers=1, hidden=hidden, vocab=8, attention="gqa", heads=16, kv_heads=8,
                     head_dim=hidden // 32, moe_layer_step=0, dense_ffn=8,
                     weight_bytes_per_param=(("attention", bytes_per_param),))
