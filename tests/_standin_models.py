"""A small stand-in for ``hbfjax.workload.models`` (the interface of the timing brief), used by the
timing tests until the real module lands on main. Tiny GQA and MLA models with hand-countable sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Linear(NamedTuple):
    op: str
    name: str
    in_features: int
    out_features: int
    copies: int
    bytes_per_param: float


@dataclass(frozen=True)
class Model:
    hidden: int
    kinds: tuple[str, ...]
    heads: int
    kv_heads: int
    head_dim: int
    routed_experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    expert_ffn: int = 0
    dense_ffn: int = 0
    vocab: int = 1000
    bytes_per_param: float = 2
    mla: bool = False
    kv_lora_rank: int = 0
    rope_dim: int = 0
    nope_dim: int = 0
    v_head_dim: int = 0

    @property
    def layer_kinds(self):
        return self.kinds

    @property
    def dense_layers(self):
        return sum(k == "dense" for k in self.kinds)

    @property
    def moe_layers(self):
        return sum(k == "moe" for k in self.kinds)

    @property
    def norm_params_per_layer(self):
        return 2 * self.hidden

    @property
    def kv_bytes_per_token_layer(self):
        if self.mla:
            return (self.kv_lora_rank + self.rope_dim) * 2
        return 2 * self.kv_heads * self.head_dim * 2

    def attention_flops_per_pair(self, phase):
        if self.mla and phase == "decode":  # absorbed: QK over latent + rope, PV in the latent
            return 2 * self.heads * (self.kv_lora_rank + self.rope_dim) + 2 * self.heads * self.kv_lora_rank
        if self.mla:  # expanded
            return 2 * self.heads * (self.nope_dim + self.rope_dim) + 2 * self.heads * self.v_head_dim
        return 4 * self.heads * self.head_dim

    def attention_geometry(self, phase):
        if self.mla and phase == "decode":
            return self.heads, 1, self.kv_lora_rank + self.rope_dim, self.kv_lora_rank
        if self.mla:
            return self.heads, self.heads, self.nope_dim + self.rope_dim, self.v_head_dim
        return self.heads, self.kv_heads, self.head_dim, self.head_dim

    def linears(self, kind):
        b, h = self.bytes_per_param, self.hidden
        qkv = (Linear("qkv_proj", "qkv", h, (self.heads + 2 * self.kv_heads) * self.head_dim, 1, b),)
        if self.mla:
            qkv = (Linear("qkv_proj", "q_a", h, 3 * self.kv_lora_rank, 1, b),
                   Linear("qkv_proj", "kv_a", h, self.kv_lora_rank + self.rope_dim, 1, b))
        attn = qkv + (Linear("out_proj", "o", self.heads * self.head_dim, h, 1, b),)
        if kind == "dense":
            return attn + (Linear("dense_ffn", "gate_up", h, 2 * self.dense_ffn, 1, b),
                           Linear("dense_ffn", "down", self.dense_ffn, h, 1, b))
        out = attn + (Linear("router", "gate", h, self.routed_experts, 1, 4),
                      Linear("experts", "gate_up", h, 2 * self.expert_ffn, self.routed_experts, b),
                      Linear("experts", "down", self.expert_ffn, h, self.routed_experts, b))
        if self.shared_experts:
            out += (Linear("shared_experts", "gate_up", h, 2 * self.expert_ffn, self.shared_experts, b),
                    Linear("shared_experts", "down", self.expert_ffn, h, self.shared_experts, b))
        return out

    def head_linears(self):
        return (Linear("lm_head", "lm_head", self.hidden, self.vocab, 1, self.bytes_per_param),)


GQA = Model(hidden=64, kinds=("dense", "moe", "moe", "moe"), heads=4, kv_heads=2, head_dim=16, routed_experts=8,
            top_k=2, shared_experts=1, expert_ffn=32, dense_ffn=128, vocab=500)
MLA = Model(hidden=64, kinds=("dense", "moe", "moe"), heads=2, kv_heads=2, head_dim=16, routed_experts=8, top_k=2,
            expert_ffn=32, dense_ffn=128, vocab=500, mla=True, kv_lora_rank=4, rope_dim=2, nope_dim=3, v_head_dim=6)


def single_gemm(in_features: int, out_features: int, bytes_per_param: float = 2) -> Model:
    """A one-layer dense model whose qkv projection is one in × out GEMM (the other ops stay small)."""
    heads = 1
    base = Model(hidden=in_features, kinds=("dense",), heads=heads, kv_heads=1, head_dim=8, dense_ffn=8,
                 bytes_per_param=bytes_per_param)

    class _One(type(base)):
        def linears(self, kind):
            return (Linear("qkv_proj", "qkv", in_features, out_features, 1, bytes_per_param),)

    return _One(**{f: getattr(base, f) for f in base.__dataclass_fields__})
