"""Model presets: the LLMs the papers serve, as static, sourced specifications (DESIGN.md §5 "ModelSpec").

A :class:`ModelSpec` holds a model's published configuration — layers by kind (dense / MoE and their
pattern), hidden size, attention geometry (GQA heads, KV heads, head dim; MLA ranks and head dims;
DeepSeek-V4's compressed attention), routed and shared experts, top-k, router kind, FFN sizes,
vocabulary, weight precision per tensor group and KV precision — and derives from it what the serving
engine needs: the weight matmuls of each layer kind (:meth:`ModelSpec.linears`), weight bytes (expert
and non-expert, embeddings and head included), KV bytes per token per layer, and FLOPs per token per
operator, each for one GPU of a tensor-parallel group of ``tensor_parallel`` GPUs (default 1: the whole
model; the split is :mod:`hbfjax.workload.tensor_parallel`'s). Like the hardware presets (``hbfjax.hardware``), every field of a preset cites its public
source in ``sources``; a value known only from a paper is listed in ``estimated`` with the sentence it
comes from.

What the weight totals count (DASH Table II compares checkpoint sizes): every decoder layer, the
token embedding and the LM head (once when tied), the norms, and the multi-token-prediction (MTP)
modules that a checkpoint ships (DeepSeek-V3: one MTP layer with its own copies of the embedding and
head, as in the Hugging Face checkpoint). Not counted: a vision tower (Llama 4 Maverick's, < 0.1 % of
its weights), rotary tables, the compressors and indexer of DeepSeek-V4's attention (estimated < 1 %).
FP8 tensors with 128 × 128 block scales in float32 cost 1 + 4/128² bytes per parameter.

Units: sizes in bytes (GB = 1e9 B), FLOPs per token (one multiply-add = 2 FLOPs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from hbfjax.validate import ConfigError, require, require_choice, require_int, require_real
from hbfjax.workload import tensor_parallel

GB = 10**9

# Bytes per parameter of the weight formats the presets use.
BF16 = 2.0
FP8 = 1.0
INT8 = 1.0
FP8_BLOCK_SCALED = 1.0 + 4.0 / 128**2  # FP8 weights + one float32 scale per 128 × 128 block (DeepSeek-V3)

ATTENTION_KINDS = ("gqa", "mla", "compressed")
ROUTERS = ("softmax", "sigmoid", "sigmoid-bias", "sqrtsoftplus-bias")
LAYER_KINDS = ("dense", "moe")
# Weight groups with their own precision; "experts" are the routed experts, every other group is
# non-expert weight (DASH Table II keeps the two apart: expert weights live in HBF).
WEIGHT_GROUPS = ("embedding", "attention", "norms", "router", "dense_ffn", "shared_experts", "experts", "lm_head")
# Operators of a layer, in execution order (DASH Fig. 3); "lm_head" runs once per token after the last layer.
OPERATORS = ("qkv_proj", "attention", "out_proj", "router", "experts", "shared_experts", "dense_ffn", "norms")


class Linear(NamedTuple):
    """One weight matmul of a layer: ``copies`` matrices of ``in_features × out_features``.

    For ``op == "experts"`` the copies are the routed experts and each routed (token, expert) row
    multiplies by one copy; for every other op each token multiplies by every copy."""

    op: str  # operator it belongs to (OPERATORS or "lm_head")
    name: str  # the tensor's name in the published checkpoint (gate_up, down, q_a, …)
    in_features: int
    out_features: int
    copies: int
    bytes_per_param: float

    @property
    def params(self) -> int:
        return self.in_features * self.out_features * self.copies

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param


@dataclass(frozen=True)
class ModelSpec:
    """A served LLM (DASH §II-A, Table II; HBFlex §6.1). Static: hashable by value, validated."""

    name: str
    layers: int  # decoder layers a token passes through (MTP modules not included)
    hidden: int
    vocab: int
    attention: str  # "gqa" | "mla" | "compressed" (DeepSeek-V4 CSA/HCA)
    heads: int  # query heads
    kv_heads: int = 0  # GQA/compressed: KV heads
    head_dim: int = 0  # GQA/compressed: dimension of one head
    q_lora_rank: int = 0  # MLA/compressed: low-rank Q (0 = full-rank Q projection)
    kv_lora_rank: int = 0  # MLA: the compressed KV latent cached per token
    qk_nope_head_dim: int = 0  # MLA: per-head Q/K dims without rotary
    qk_rope_head_dim: int = 0  # MLA: rotary Q/K dims (the rotary key is cached, shared by heads)
    v_head_dim: int = 0  # MLA: per-head value dim
    o_lora_rank: int = 0  # compressed: grouped low-rank output projection (0 = one dense projection)
    o_groups: int = 1  # compressed: head groups of the output projection
    first_dense_layers: int = 0  # leading layers with a dense FFN (DeepSeek-V3: 3)
    moe_layer_step: int = 1  # after them every n-th layer is MoE (Llama 4 Maverick: 2); 0 = dense model
    routed_experts: int = 0
    shared_experts: int = 0
    top_k: int = 0
    router: str = "softmax"  # ROUTERS; the "-bias" kinds add an expert-specific bias (no lookahead, DASH §V-C)
    expert_ffn: int = 0  # intermediate size of one routed expert
    shared_expert_ffn: int = 0  # intermediate size of one shared expert
    dense_ffn: int = 0  # intermediate size of a dense layer's FFN
    ffn_matrices: int = 3  # gate, up, down (SwiGLU / gated GELU)
    tied_embeddings: bool = False  # LM head shares the embedding matrix
    qk_norm: bool = False  # per-head RMSNorm of Q and K (Qwen3, Hy3)
    mtp_layers: int = 0  # multi-token-prediction modules in the checkpoint (counted in weight bytes only)
    weight_bytes_per_param: tuple[tuple[str, float], ...] = ()  # per WEIGHT_GROUPS entry; default BF16
    kv_bytes_per_element: float = BF16  # KV cache precision
    kv_bytes_per_token_layer_override: float | None = None  # compressed attention: stated, not derived
    kv_fraction_attended: float = 1.0  # compressed attention: mean fraction of context entries read per query
    tensor_parallel: int = 1  # GPUs of one tensor-parallel group; every derived size is one GPU's (tensor_parallel)
    active_params_stated: float | None = None  # the model card's activated parameters per token (check only)
    total_params_stated: float | None = None  # the model card's total parameters (check only)
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)
    estimated: tuple[tuple[str, str], ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        cls = f"ModelSpec({self.name})"
        require(isinstance(self.name, str) and self.name != "", cls, "name", self.name, "must be a non-empty string")
        for name in ("layers", "hidden", "vocab", "heads", "ffn_matrices", "o_groups"):
            require_int(cls, name, getattr(self, name), 1)
        for name in ("kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim", "o_lora_rank", "first_dense_layers", "moe_layer_step", "routed_experts",
                     "shared_experts", "top_k", "expert_ffn", "shared_expert_ffn", "dense_ffn", "mtp_layers"):
            require_int(cls, name, getattr(self, name), 0)
        require_choice(cls, "attention", self.attention, ATTENTION_KINDS)
        require_choice(cls, "router", self.router, ROUTERS)
        require_real(cls, "kv_bytes_per_element", self.kv_bytes_per_element, 0.0, lo_open=True)
        require_real(cls, "kv_fraction_attended", self.kv_fraction_attended, 0.0, 1.0, lo_open=True)
        require(self.first_dense_layers <= self.layers, cls, "first_dense_layers", self.first_dense_layers,
                f"must be <= layers = {self.layers}")
        if self.attention in ("gqa", "compressed"):
            for name in ("kv_heads", "head_dim"):
                require(getattr(self, name) >= 1, cls, name, getattr(self, name), f"must be >= 1 for {self.attention}")
            require(self.heads % self.kv_heads == 0, cls, "kv_heads", self.kv_heads,
                    f"must divide heads = {self.heads} (grouped-query attention)")
        if self.attention == "mla":
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                require(getattr(self, name) >= 1, cls, name, getattr(self, name), "must be >= 1 for mla")
        if self.attention == "compressed":
            require(self.kv_bytes_per_token_layer_override is not None, cls, "kv_bytes_per_token_layer_override",
                    None, "compressed attention states its KV bytes per token per layer")
            require(self.o_lora_rank == 0 or (self.heads * self.head_dim) % self.o_groups == 0, cls, "o_groups",
                    self.o_groups, f"must divide heads × head_dim = {self.heads * self.head_dim}")
        if self.kv_bytes_per_token_layer_override is not None:
            require_real(cls, "kv_bytes_per_token_layer_override", self.kv_bytes_per_token_layer_override, 0.0,
                         lo_open=True)
        require_int(cls, "tensor_parallel", self.tensor_parallel, 1)
        problems = tensor_parallel.split_problems(self, self.tensor_parallel)
        require(not problems, cls, "tensor_parallel", self.tensor_parallel, "; ".join(problems))
        if self.moe_layers:
            require(1 <= self.top_k <= self.routed_experts, cls, "top_k", self.top_k,
                    f"must be in [1, routed_experts = {self.routed_experts}] for a MoE model")
            require(self.expert_ffn >= 1, cls, "expert_ffn", self.expert_ffn, "must be >= 1 for a MoE model")
            require(self.shared_experts == 0 or self.shared_expert_ffn >= 1, cls, "shared_expert_ffn",
                    self.shared_expert_ffn, f"must be >= 1 with shared_experts = {self.shared_experts}")
        if self.dense_layers:
            require(self.dense_ffn >= 1, cls, "dense_ffn", self.dense_ffn,
                    f"must be >= 1: the model has {self.dense_layers} dense layers")
        for group, value in self.weight_bytes_per_param:
            require_choice(cls, "weight_bytes_per_param", group, WEIGHT_GROUPS)
            require_real(cls, f"weight_bytes_per_param[{group}]", value, 0.0, lo_open=True)
        groups = [g for g, _ in self.weight_bytes_per_param]
        require(len(groups) == len(set(groups)), cls, "weight_bytes_per_param", groups, "names a group twice")

    # --- layers by kind ---------------------------------------------------------------------------
    def layer_kind(self, layer: int) -> str:
        """"dense" or "moe" for decoder layer ``layer`` (0-based): after ``first_dense_layers`` every
        ``moe_layer_step``-th layer is MoE (the last of each step, as Llama 4's interleaving)."""
        if self.moe_layer_step == 0 or layer < self.first_dense_layers:
            return "dense"
        return "moe" if (layer - self.first_dense_layers) % self.moe_layer_step == self.moe_layer_step - 1 else "dense"

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        return tuple(self.layer_kind(i) for i in range(self.layers))

    @property
    def moe_layers(self) -> int:
        return self.layer_kinds.count("moe")

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def lookahead_capable(self) -> bool:
        """DASH §V-C: lookahead expert selection needs a router without an expert-specific bias."""
        return not self.router.endswith("-bias")

    # --- tensor parallelism (hbfjax.workload.tensor_parallel) ---------------------------------------
    def _per_gpu(self, n: int) -> int:
        """A dimension split over the tensor-parallel group: one GPU's share (split_problems checks it divides)."""
        return n // self.tensor_parallel

    @property
    def heads_per_gpu(self) -> int:
        """Query heads one GPU computes."""
        return self._per_gpu(self.heads)

    @property
    def kv_heads_per_gpu(self) -> int:
        """GQA / compressed KV heads one GPU holds: its share, or one replicated head where the group has more
        GPUs than KV heads."""
        return tensor_parallel.kv_heads_per_gpu(self.kv_heads, self.tensor_parallel)

    def with_tensor_parallel(self, gpus: int) -> "ModelSpec":
        """The model as one GPU of a ``gpus``-way tensor-parallel group holds and computes it (validated:
        ``gpus`` must split its heads and FFNs)."""
        return dataclasses.replace(self, tensor_parallel=gpus)

    # --- precision --------------------------------------------------------------------------------
    def bytes_per_param(self, group: str) -> float:
        require_choice(f"ModelSpec({self.name})", "weight group", group, WEIGHT_GROUPS)
        return dict(self.weight_bytes_per_param).get(group, BF16)

    # --- weight matmuls ---------------------------------------------------------------------------
    def _attention_linears(self) -> tuple[Linear, ...]:
        """One GPU's attention matmuls: the head-indexed ones split by heads (Q, MLA's kv_b, GQA's K/V, the
        output projection); the low-rank down projections (q_a, MLA's kv_a) and a replicated KV head whole."""
        b = self.bytes_per_param("attention")
        h, heads = self.hidden, self.heads_per_gpu
        if self.attention == "gqa":
            qkv = (heads + 2 * self.kv_heads_per_gpu) * self.head_dim
            return (Linear("qkv_proj", "qkv", h, qkv, 1, b),
                    Linear("out_proj", "o", heads * self.head_dim, h, 1, b))
        if self.attention == "mla":
            q_dim = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            q = ((Linear("qkv_proj", "q_a", h, self.q_lora_rank, 1, b),
                  Linear("qkv_proj", "q_b", self.q_lora_rank, q_dim, 1, b)) if self.q_lora_rank
                 else (Linear("qkv_proj", "q", h, q_dim, 1, b),))
            return q + (Linear("qkv_proj", "kv_a", h, self.kv_lora_rank + self.qk_rope_head_dim, 1, b),
                        Linear("qkv_proj", "kv_b", self.kv_lora_rank,
                               heads * (self.qk_nope_head_dim + self.v_head_dim), 1, b),
                        Linear("out_proj", "o", heads * self.v_head_dim, h, 1, b))
        # compressed (DeepSeek-V4): low-rank Q, one shared KV head, grouped low-rank output projection
        q_dim = heads * self.head_dim
        q = ((Linear("qkv_proj", "q_a", h, self.q_lora_rank, 1, b),
              Linear("qkv_proj", "q_b", self.q_lora_rank, q_dim, 1, b)) if self.q_lora_rank
             else (Linear("qkv_proj", "q", h, q_dim, 1, b),))
        kv = (Linear("qkv_proj", "kv", h, self.kv_heads_per_gpu * self.head_dim, 1, b),)
        if self.o_lora_rank:
            groups = self._per_gpu(self.o_groups)
            out = (Linear("out_proj", "o_a", self.heads * self.head_dim // self.o_groups, self.o_lora_rank, groups, b),
                   Linear("out_proj", "o_b", groups * self.o_lora_rank, h, 1, b))
        else:
            out = (Linear("out_proj", "o", q_dim, h, 1, b),)
        return q + kv + out

    def _ffn_linears(self, op: str, inter: int, copies: int, group: str) -> tuple[Linear, ...]:
        """An FFN's matmuls on one GPU: gate/up split by columns, down by rows (``inter`` / tensor_parallel)."""
        b = self.bytes_per_param(group)
        gated = self.ffn_matrices - 1  # gate and up share the input
        inter = self._per_gpu(inter)
        return (Linear(op, "gate_up", self.hidden, gated * inter, copies, b),
                Linear(op, "down", inter, self.hidden, copies, b))

    def linears(self, kind: str) -> tuple[Linear, ...]:
        """The weight matmuls of one decoder layer of ``kind`` ("dense" | "moe"), norms excluded."""
        require_choice(f"ModelSpec({self.name})", "layer kind", kind, LAYER_KINDS)
        out = self._attention_linears()
        if kind == "dense":
            return out + self._ffn_linears("dense_ffn", self.dense_ffn, 1, "dense_ffn")
        out += (Linear("router", "gate", self.hidden, self.routed_experts, 1, self.bytes_per_param("router")),)
        out += self._ffn_linears("experts", self.expert_ffn, self.routed_experts, "experts")
        if self.shared_experts:
            out += self._ffn_linears("shared_experts", self.shared_expert_ffn, self.shared_experts, "shared_experts")
        return out

    def head_linears(self) -> tuple[Linear, ...]:
        """The LM head, once per token after the last layer (the tied embedding when tied)."""
        group = "embedding" if self.tied_embeddings else "lm_head"
        return (Linear("lm_head", "lm_head", self.hidden, self.vocab, 1, self.bytes_per_param(group)),)

    @property
    def norm_params_per_layer(self) -> int:
        """RMSNorm weights of one layer: two per layer, plus Q/K head norms and MLA's latent norms."""
        n = 2 * self.hidden
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention == "mla":
            n += self.kv_lora_rank + self.q_lora_rank
        return n

    # --- weight totals (DASH Table II) ------------------------------------------------------------
    def _layer_bytes(self, kind: str, experts: bool) -> float:
        total = sum(l.weight_bytes for l in self.linears(kind) if (l.op == "experts") == experts)
        return total if experts else total + self.norm_params_per_layer * self.bytes_per_param("norms")

    def _embedding_bytes(self) -> float:
        table = self.vocab * self.hidden * self.bytes_per_param("embedding")
        return table + (0.0 if self.tied_embeddings else self.head_linears()[0].weight_bytes)

    def _mtp_bytes(self, experts: bool) -> float:
        """One MTP module: a MoE layer, the projection of [hidden; embedding] (2h × h), two norms, and its
        own embedding and head copies (DeepSeek-V3's Hugging Face checkpoint, layer 61)."""
        layer = self._layer_bytes("moe" if self.is_moe else "dense", experts)
        if experts:
            return self.mtp_layers * layer
        extra = 2 * self.hidden * self.hidden * self.bytes_per_param("attention") + 3 * self.hidden * \
            self.bytes_per_param("norms") + self._embedding_bytes()
        return self.mtp_layers * (layer + extra)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of every routed expert of every MoE layer (and of the MTP modules)."""
        return self.moe_layers * self._layer_bytes("moe", True) + self._mtp_bytes(True)

    @property
    def non_expert_weight_bytes(self) -> float:
        """Everything else: attention, norms, routers, shared experts, dense FFNs, embedding, LM head, MTP."""
        layers = sum(self._layer_bytes(k, False) for k in self.layer_kinds)
        return layers + self._embedding_bytes() + self.hidden * self.bytes_per_param("norms") + self._mtp_bytes(False)

    @property
    def weight_bytes(self) -> float:
        return self.expert_weight_bytes + self.non_expert_weight_bytes

    @property
    def params(self) -> float:
        """Parameters of the decoder layers, embedding, head and final norm (MTP modules excluded)."""
        layers = sum(sum(l.params for l in self.linears(k)) + self.norm_params_per_layer for k in self.layer_kinds)
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return float(layers + embed + self.hidden)

    @property
    def active_params(self) -> float:
        """Parameters one token multiplies by: routed experts counted top_k of routed_experts times."""
        total = 0.0
        for kind in self.layer_kinds:
            for l in self.linears(kind):
                total += l.params * (self.top_k / self.routed_experts if l.op == "experts" else 1.0)
            total += self.norm_params_per_layer
        return total + self.vocab * self.hidden + self.hidden  # LM head (the embedding is a lookup)

    # --- KV cache ---------------------------------------------------------------------------------
    @property
    def kv_elements_per_token_layer(self) -> int:
        """Cached values per token per layer on one GPU: K and V of its KV heads (GQA), or MLA's latent plus
        its rotary key (shared by all heads, so replicated on every GPU of a tensor-parallel group)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads_per_gpu * self.head_dim

    @property
    def kv_bytes_per_token_layer(self) -> float:
        if self.kv_bytes_per_token_layer_override is not None:  # stated for the whole model: one GPU's KV heads' share
            split = self.kv_heads // self.kv_heads_per_gpu if self.kv_heads else 1
            return float(self.kv_bytes_per_token_layer_override) / split
        return self.kv_elements_per_token_layer * self.kv_bytes_per_element

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one context token holds over all layers."""
        return self.kv_bytes_per_token_layer * self.layers

    def with_kv_precision(self, kv_bytes_per_element: float) -> "ModelSpec":
        """The same model with another KV precision (HBFlex §3.3 counts FP8 KV; DASH BF16)."""
        return dataclasses.replace(self, kv_bytes_per_element=kv_bytes_per_element)

    # --- FLOPs ------------------------------------------------------------------------------------
    def attention_flops_per_pair(self, phase: str) -> float:
        """FLOPs of one (query token, context token) pair in one layer: QKᵀ and PV over every head (of one GPU).

        GQA: 2 · heads · head_dim each. MLA decode runs in the absorbed form (queries projected into
        the latent: QKᵀ over kv_lora + rope dims, PV over kv_lora dims); MLA prefill in the expanded
        form (QKᵀ over nope + rope dims, PV over v dims), as DeepSeek's inference code does.
        Compressed attention (DeepSeek-V4) attends to ``kv_fraction_attended`` of the context entries."""
        require_choice(f"ModelSpec({self.name})", "phase", phase, ("prefill", "decode"))
        heads = self.heads_per_gpu  # a tensor-parallel GPU attends with its own heads
        if self.attention == "gqa":
            return 4.0 * heads * self.head_dim
        if self.attention == "mla":
            if phase == "decode":
                return 2.0 * heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
            return 2.0 * heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return 4.0 * heads * self.head_dim * self.kv_fraction_attended

    def flops_per_token(self, kind: str, context_tokens: float = 0.0, phase: str = "decode") -> dict[str, float]:
        """FLOPs per token of each operator of one layer of ``kind`` at ``context_tokens`` of context
        (routed experts: the token's top_k rows; norms: ≈ 4 FLOPs per normalised element)."""
        flops = dict.fromkeys(OPERATORS, 0.0)
        for l in self.linears(kind):
            rows = self.top_k if l.op == "experts" else l.copies
            flops[l.op] += 2.0 * l.in_features * l.out_features * rows
        flops["attention"] = self.attention_flops_per_pair(phase) * context_tokens
        flops["norms"] = 4.0 * self.norm_params_per_layer
        return flops

    # --- provenance -------------------------------------------------------------------------------
    def source(self, field_name: str) -> str:
        return dict(self.sources).get(field_name, "")

    @property
    def estimated_fields(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.estimated)

    def replace(self, **changes) -> "ModelSpec":
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)


def _cited(source: str, *names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, source) for n in names)


_GQA = ("layers", "hidden", "vocab", "attention", "heads", "kv_heads", "head_dim")
_MLA = ("layers", "hidden", "vocab", "attention", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim")
_MOE = ("routed_experts", "shared_experts", "top_k", "router", "expert_ffn")


def _qwen3_235b() -> ModelSpec:
    src = "huggingface.co/Qwen/Qwen3-235B-A22B config.json"
    return ModelSpec(
        name="qwen3-235b-a22b", layers=94, hidden=4096, vocab=151936, attention="gqa", heads=64, kv_heads=4,
        head_dim=128, qk_norm=True, routed_experts=128, top_k=8, router="softmax", expert_ffn=1536,
        total_params_stated=235e9, active_params_stated=22e9,
        sources=_cited(src, *_GQA, *_MOE, "qk_norm") + (("weight_bytes_per_param", "DASH Table II: BF16"),))


def _qwen3_235b_int8() -> ModelSpec:
    """Qwen3-235B-A22B with INT8 weights (the norms kept in BF16): the precision HBFlex's capacity arithmetic
    implies for it (issue 23; review 2026-12-02-hbflex-fidelity §1.2), 235 GB instead of DASH's BF16 470 GB."""
    base = _qwen3_235b()
    groups = tuple((g, INT8) for g in WEIGHT_GROUPS if g != "norms")
    return dataclasses.replace(
        base, name="qwen3-235b-a22b-int8", weight_bytes_per_param=groups,
        sources=tuple((k, v) for k, v in base.sources if k != "weight_bytes_per_param"),
        estimated=(("weight_bytes_per_param",
                    "HBFlex states no weight precision for Qwen3 (only V4-Pro's prefetched groups are \"in INT8\", "
                    "§5.3); its 3 TiB package with 1,024 agent tasks of 20 K+ tokens per GPU at 95 KB/token (§3.3) "
                    "leaves room only with about one byte per weight, so INT8 is that reading; the norms stay BF16"),))


def _mixtral_8x22b() -> ModelSpec:
    src = "huggingface.co/mistralai/Mixtral-8x22B-v0.1 config.json"
    return ModelSpec(
        name="mixtral-8x22b", layers=56, hidden=6144, vocab=32768, attention="gqa", heads=48, kv_heads=8,
        head_dim=128, routed_experts=8, top_k=2, router="softmax", expert_ffn=16384,
        total_params_stated=141e9, active_params_stated=39e9,
        sources=_cited(src, *_GQA, *_MOE) + (("weight_bytes_per_param", "DASH Table II: BF16"),))


def _llama3(size: str) -> ModelSpec:
    geometry = {"8b": dict(layers=32, hidden=4096, heads=32, dense_ffn=14336, total_params_stated=8.0e9),
                "70b": dict(layers=80, hidden=8192, heads=64, dense_ffn=28672, total_params_stated=70.6e9)}[size]
    src = f"huggingface.co/meta-llama/Meta-Llama-3-{size.upper()} config.json"
    return ModelSpec(name=f"llama3-{size}", vocab=128256, attention="gqa", kv_heads=8, head_dim=128, moe_layer_step=0,
                     sources=_cited(src, *_GQA, "dense_ffn") + (("weight_bytes_per_param", f"{src}: bfloat16"),
                                                                ("moe_layer_step", f"{src}: a dense model (no experts)")),
                     **geometry)


def _grok1() -> ModelSpec:
    src = "github.com/xai-org/grok-1 README.md and run.py (LanguageModelConfig, TransformerConfig)"
    return ModelSpec(
        name="grok-1", layers=64, hidden=6144, vocab=131072, attention="gqa", heads=48, kv_heads=8, head_dim=128,
        routed_experts=8, top_k=2, router="softmax", expert_ffn=32768, tied_embeddings=True,
        weight_bytes_per_param=(("attention", INT8), ("experts", INT8), ("router", BF16)),
        total_params_stated=314e9,
        sources=_cited(src, *_GQA, *_MOE, "tied_embeddings") + (
            ("expert_ffn", f"{src}: widening_factor 8 → int(8 × 6144) × 2 / 3 = 32768"),
            ("weight_bytes_per_param", "DASH Table II: INT8-mixed; the published checkpoint stores its linear "
                                       "layers as 8-bit weights (QuantizedWeight8bit), the embedding in bf16")),
        estimated=(("weight_bytes_per_param", "which tensors are INT8 is read from the checkpoint format, not "
                                              "stated by DASH; per-channel scales (< 0.1 %) not counted"),))


def _llama4_maverick() -> ModelSpec:
    src = "huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct config.json (text_config)"
    return ModelSpec(
        name="llama4-maverick", layers=48, hidden=5120, vocab=202048, attention="gqa", heads=40, kv_heads=8,
        head_dim=128, moe_layer_step=2, routed_experts=128, shared_experts=1, top_k=1, router="sigmoid",
        expert_ffn=8192, shared_expert_ffn=8192, dense_ffn=16384, total_params_stated=400e9,
        active_params_stated=17e9,
        sources=_cited(src, *_GQA, *_MOE, "shared_expert_ffn") + (
            ("moe_layer_step", f"{src}: interleave_moe_layer_step 2 (odd layers MoE)"),
            ("dense_ffn", f"{src}: intermediate_size_mlp 16384"),
            ("weight_bytes_per_param", "DASH Table II: BF16")))


# The MLA geometry DeepSeek-V2 and -V3 share (both config.json files)
_DEEPSEEK_MLA = dict(attention="mla", heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                     qk_rope_head_dim=64, v_head_dim=128)


def _deepseek_v3() -> ModelSpec:
    src = "huggingface.co/deepseek-ai/DeepSeek-V3 config.json"
    return ModelSpec(
        name="deepseek-v3", layers=61, hidden=7168, vocab=129280, **_DEEPSEEK_MLA, first_dense_layers=3,
        routed_experts=256, shared_experts=1, top_k=8, router="sigmoid-bias", expert_ffn=2048,
        shared_expert_ffn=2048, dense_ffn=18432, mtp_layers=1,
        weight_bytes_per_param=(("attention", FP8_BLOCK_SCALED), ("dense_ffn", FP8_BLOCK_SCALED),
                                ("shared_experts", FP8_BLOCK_SCALED), ("experts", FP8_BLOCK_SCALED)),
        total_params_stated=671e9, active_params_stated=37e9,
        sources=_cited(src, *_MLA, *_MOE, "shared_expert_ffn") + (
            ("first_dense_layers", f"{src}: first_k_dense_replace 3"), ("dense_ffn", f"{src}: intermediate_size"),
            ("router", f"{src}: scoring_func sigmoid, topk_method noaux_tc (e_score_correction_bias)"),
            ("mtp_layers", f"{src}: num_nextn_predict_layers 1 (layer 61 of the checkpoint)"),
            ("weight_bytes_per_param", f"{src}: quantization_config fp8 e4m3, weight_block_size [128, 128]; "
                                       "embedding, head, router and norms bf16; DASH Table II: FP8-mixed")))


def _deepseek_v2() -> ModelSpec:
    src = "huggingface.co/deepseek-ai/DeepSeek-V2 config.json"
    return ModelSpec(
        name="deepseek-v2", layers=60, hidden=5120, vocab=102400, **_DEEPSEEK_MLA, first_dense_layers=1,
        routed_experts=160, shared_experts=2, top_k=6, router="softmax", expert_ffn=1536, shared_expert_ffn=1536,
        dense_ffn=12288, total_params_stated=236e9, active_params_stated=21e9,
        sources=_cited(src, *_MLA, *_MOE, "shared_expert_ffn") + (
            ("first_dense_layers", f"{src}: first_k_dense_replace 1"), ("dense_ffn", f"{src}: intermediate_size"),
            ("router", f"{src}: scoring_func softmax, topk_method group_limited_greedy (no expert bias)"),
            ("weight_bytes_per_param", "DASH Table II: BF16")))


def _deepseek_v4_pro() -> ModelSpec:
    src = "huggingface.co/deepseek-ai/DeepSeek-V4-Pro config.json"
    return ModelSpec(
        name="deepseek-v4-pro", layers=61, hidden=7168, vocab=129280, attention="compressed", heads=128, kv_heads=1,
        head_dim=512, q_lora_rank=1536, o_lora_rank=1024, o_groups=16, routed_experts=384, shared_experts=1,
        top_k=6, router="sqrtsoftplus-bias", expert_ffn=3072, shared_expert_ffn=3072, mtp_layers=1,
        weight_bytes_per_param=(("attention", INT8), ("shared_experts", INT8), ("experts", INT8), ("router", INT8),
                                ("norms", INT8), ("embedding", INT8), ("lm_head", INT8)),
        kv_bytes_per_element=FP8, kv_bytes_per_token_layer_override=5_000.0 / 61, kv_fraction_attended=0.125,
        total_params_stated=1.6e12, active_params_stated=49e9,
        sources=_cited(src, "layers", "hidden", "vocab", "heads", "kv_heads", "head_dim", "q_lora_rank",
                       "o_lora_rank", "o_groups", *_MOE, "shared_expert_ffn", "mtp_layers") + (
            ("attention", f"{src}: compress_ratios (CSA 1/4 with an indexer, HCA 1/128), one shared 512-dim KV head"),
            ("weight_bytes_per_param", "HBFlex §5.3: weights in INT8 (\"these groups occupy approximately 63 and "
                                       "106 MB in INT8\")")),
        estimated=(
            ("kv_bytes_per_token_layer_override",
             "HBFlex §5.3: \"At approximately 5 KB/token for DeepSeek-V4-Pro\" (all 61 layers; consistent with "
             "CSA layers caching 512 B per 4 tokens plus 128-dim FP8 indexer keys, and HCA layers 512 B per 128 "
             "tokens, alternating)"),
            ("kv_fraction_attended",
             "assumed: CSA reads its top 1,024 compressed entries and HCA every 1/128 entry; 1/8 of the context is "
             "a round figure for a few-K to 100K-token context, not stated by either paper"),
            ("weight_bytes_per_param",
             "HBFlex §5.3 states INT8 for the prefetched groups; the published checkpoint is FP4 experts + FP8, "
             "so INT8 everywhere is the paper's reading, and \"1.6 trillion parameters\" (HBFlex §1) is checked"),
            ("kv_bytes_per_element", "HBFlex §3.3 counts KV at one byte per element (FP8)"),
            ("total_params_stated", "HBFlex §1: \"DeepSeek-V4-Pro contains 1.6 trillion parameters\""),
        ))


def _hunyuan() -> ModelSpec:
    src = "huggingface.co/tencent/Hy3-preview config.json (HBFlex §6.1 cites tencent/Hy3)"
    return ModelSpec(
        name="hunyuan", layers=80, hidden=4096, vocab=120832, attention="gqa", heads=64, kv_heads=8, head_dim=128,
        qk_norm=True, first_dense_layers=1, routed_experts=192, shared_experts=1, top_k=8, router="sigmoid-bias",
        expert_ffn=1536, shared_expert_ffn=1536, dense_ffn=13312, total_params_stated=295e9,
        sources=_cited(src, *_GQA, *_MOE, "shared_expert_ffn", "qk_norm") + (
            ("first_dense_layers", f"{src}: first_k_dense_replace 1"), ("dense_ffn", f"{src}: intermediate_size"),
            ("router", f"{src}: sigmoid routing with e_score_correction_bias"),
            ("weight_bytes_per_param", f"{src}: bfloat16")),
        estimated=(("name", "HBFlex §6.1 evaluates \"Hunyuan3 (Tencent Hy Team, 2026)\" without its configuration; "
                            "the public Hy3-preview configuration (295B) is taken as that model"),))


PRESETS = {
    "qwen3-235b-a22b": _qwen3_235b,
    "qwen3-235b-a22b-int8": _qwen3_235b_int8,
    "mixtral-8x22b": _mixtral_8x22b,
    "grok-1": _grok1,
    "llama4-maverick": _llama4_maverick,
    "deepseek-v3": _deepseek_v3,
    "deepseek-v2": _deepseek_v2,
    "deepseek-v4-pro": _deepseek_v4_pro,
    "hunyuan": _hunyuan,
    "llama3-8b": lambda: _llama3("8b"),
    "llama3-70b": lambda: _llama3("70b"),
}


# Published reference values the derived totals are checked against (tests/test_models.py, `hbfjax models`).
DASH_TABLE_II_WEIGHT_GB = {"qwen3-235b-a22b": 470.19, "mixtral-8x22b": 281.24, "grok-1": 318.24,
                           "llama4-maverick": 801.42, "deepseek-v3": 688.59, "deepseek-v2": 471.49}
# HBFlex §3.3: "35 KB/token for DeepSeek-V3", "Qwen3 ... with 95 KB/token" (KV at one byte per element,
# which is what reproduces its 8.37 and 22.73 TB/day per GPU); §5.3: "approximately 5 KB/token" for V4-Pro.
HBFLEX_KV_BYTES_PER_TOKEN = {"deepseek-v3": 35e3, "qwen3-235b-a22b": 95e3, "deepseek-v4-pro": 5e3}
HBFLEX_KV_BYTES_PER_ELEMENT = FP8


def summary(spec: ModelSpec) -> dict:
    """The derived totals of a model with their provenance (what ``hbfjax models`` prints)."""
    return {
        "name": spec.name, "layers": spec.layers, "dense_layers": spec.dense_layers, "moe_layers": spec.moe_layers,
        "attention": spec.attention, "routed_experts": spec.routed_experts, "shared_experts": spec.shared_experts,
        "top_k": spec.top_k, "router": spec.router, "lookahead_capable": spec.lookahead_capable,
        "params": spec.params, "active_params": spec.active_params, "weight_bytes": spec.weight_bytes,
        "expert_weight_bytes": spec.expert_weight_bytes, "non_expert_weight_bytes": spec.non_expert_weight_bytes,
        "paper_weight_bytes": DASH_TABLE_II_WEIGHT_GB[spec.name] * GB if spec.name in DASH_TABLE_II_WEIGHT_GB else None,
        "kv_bytes_per_element": spec.kv_bytes_per_element, "kv_bytes_per_token_layer": spec.kv_bytes_per_token_layer,
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "estimated_fields": list(spec.estimated_fields), "estimated": dict(spec.estimated), "sources": dict(spec.sources),
    }


def preset(name: str) -> ModelSpec:
    """A named model preset (``hbfjax models`` lists them with their derived totals)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"model = {name!r}: unknown model; choose one of {sorted(PRESETS)}") from None
