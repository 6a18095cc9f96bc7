"""GPU time of one serving iteration, per operator of each layer: a roofline, or a measured table.

DESIGN.md §5 "The step" computes per-layer segment times from a GPU roofline or a measured table;
DASH §VI-A "Simulation" uses operator latencies measured on an H100 PCIe and interpolates only within
each operator's measured range (:mod:`hbfjax.workload.profile_table`); HBFlex §6.1 models H200-class
GPUs (:mod:`hbfjax.workload.gpus`).

**Roofline.** Every operator runs as one or more kernels; one kernel takes

    time_us = max(flops / (peak × efficiency), bytes / (bandwidth × memory_efficiency)) + launch_us

when it has work, else 0. The peak is the GPU's dense rate for the precision of the weights
(:func:`hbfjax.workload.gpus.compute_precision`: 4 B/param → fp32, 2 → bf16, 1 (FP8, block-scaled
FP8, INT8) → fp8, narrower widths weight-only quantised and computed in bf16); GEMMs use
``compute_efficiency``, attention ``attention_efficiency`` (defaults, all assumed: :data:`KNOB_DEFAULTS`).
Bytes are what the kernel moves through the GPU's own HBM: the weights **once per kernel** (one
weight matrix read for the whole batch), the activations read and written, the KV cache read by
attention and the new KV written. The operators (:data:`OPS`) of one layer:

* ``norms``: two RMSNorms (before attention and before the FFN), 4 FLOP per element, on CUDA cores
  (fp32); activations read and written, ``norm_params_per_layer`` weights in the ``norms`` precision.
* ``qkv_proj``, ``out_proj``, ``router``, ``shared_experts``, ``dense_ffn``: each ``Linear`` of the
  model with that ``op`` is one kernel over all T tokens of the iteration (decode tokens plus prefill
  chunk tokens): 2·T·in·out·copies FLOP, in·out·copies weights, T·(in + out)·copies activations.
  MLA low-rank projections are the model's ``qkv_proj`` Linears.
* ``experts``: each routed-expert ``Linear`` is one grouped kernel over the layer's experts. Input:
  ``rows: int32[E]``, the routed token-expert rows per expert from the routing module; the roofline
  needs only the total rows R and the distinct experts D (rows > 0): 2·R·in·out FLOP and D·in·out
  weights (each needed expert's matrix read once). The measured table times each expert as its own
  GEMM of ``rows[e]`` tokens and sums them.
* ``attention_decode``: one kernel over the batch's decode tokens; a token attending to ``c`` context
  tokens (itself included) costs ``c`` (query, context) pairs and reads ``c`` tokens of KV.
* ``attention_prefill``: one kernel over the prefill chunks; a chunk of ``n`` tokens after a prefix of
  ``p`` tokens attends causally to its prefix and itself: n·p + n(n+1)/2 pairs, (p + n) tokens of KV
  read. Both attentions read the cache after the new tokens' KV is appended (n tokens of KV
  written), compute in ``TimingConfig.attention_precision``, and take FLOPs per pair from
  ``ModelSpec.attention_flops_per_pair(phase)`` (GQA, or MLA absorbed in decode / expanded in prefill)
  and KV bytes from ``kv_bytes_per_token_layer`` (× ``kv_fraction_attended`` for the reads of
  DeepSeek-V4's compressed attention). Queries and outputs count as hidden-size activations per token.
* the LM head (once per iteration, ``ModelSpec.head_linears()``): over the tokens that emit a token,
  i.e. every decode token and the last token of each chunk that completes its prompt.

For a tensor-parallel model (``ModelSpec.tensor_parallel`` T > 1) every size above is one GPU's (its
heads, its share of each FFN: :mod:`hbfjax.workload.tensor_parallel`); the all-reduces between the GPUs
are added per layer by ``hbfjax.serve.layer_time``, with ``GpuKnobs``' NVLink rate and assumed all-reduce
efficiency and latency.

Each operator's FLOPs, weight bytes, KV bytes and other bytes are returned apart (:class:`OpCosts`),
with its compute-bound and bandwidth-bound times, so the serving step can substitute the delivery
time of weights or KV from another memory (HBF, DESIGN.md §4) for the GPU's own bandwidth.

**Measured table.** With ``table`` (:class:`hbfjax.workload.profile_table.Curves`) each operator's
time is interpolated log-log in its measured curve (tokens for GEMMs and norms, total context tokens
for decode attention, total causal pairs for prefill attention). An active operator whose shape has
no curve, or whose size lies outside the measured range, falls back to the roofline if
``TimingConfig.allow_roofline``; otherwise its time is NaN and its ``table_miss`` flag is set
(:func:`raise_if_table_miss` turns that into an error on the host).

Entry points: :func:`step_costs` (one dense layer, one MoE layer, the LM head: per-op costs) and
:func:`model_times` (``segment_us: float32[L, ops]`` over the model's layers, with each MoE layer's own
expert rows). Everything is written for one stream and one iteration; arrays of the batch are
fixed-size with masks, so one compilation serves every batch content, and the serving step vmaps it
over streams. Inside ``jit`` build :class:`Batch` with its constructor (``Batch.make`` validates host
arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.validate import INT32_MAX, require, require_choice, require_int, require_real
from hbfjax.workload import gpus, tensor_parallel
from hbfjax.workload.models import ModelSpec
from hbfjax.workload import profile_table as pt

OPS = ("norms", "qkv_proj", "attention_decode", "attention_prefill", "out_proj", "router", "experts",
       "shared_experts", "dense_ffn")
NORMS_PER_LAYER = 2  # RMSNorm before attention and before the FFN
NORM_FLOPS_PER_ELEMENT = 4  # square, sum, scale by 1/rms, multiply by the weight

# Defaults of GpuKnobs.make: (value, source). None of these is measured here; the profile table is.
KNOB_DEFAULTS = {
    "compute_efficiency": (0.7, "assumed: large bf16 GEMMs reach roughly 70 % of the dense peak"),
    "attention_efficiency": (0.5, "assumed: fused attention kernels reach roughly half the dense peak"),
    "memory_efficiency": (0.8, "assumed: streaming kernels reach roughly 80 % of the HBM peak"),
    "launch_us": (4.0, "assumed: per-kernel launch and tail cost without CUDA graphs"),
}


precision_of = gpus.compute_precision


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GpuKnobs:
    """Traced GPU rates and efficiencies (sweeps over them never recompile)."""

    peak_tflops: jax.Array  # float32[P] dense peak per precision, in gpus.PRECISIONS order (TOPS for int8)
    hbm_bw_gbps: jax.Array  # float32[] HBM bandwidth
    compute_efficiency: jax.Array  # float32[] fraction of the peak a GEMM reaches
    attention_efficiency: jax.Array  # float32[] fraction of the peak an attention kernel reaches
    memory_efficiency: jax.Array  # float32[] fraction of the HBM bandwidth a kernel reaches
    launch_us: jax.Array  # float32[] fixed cost of each kernel with work
    nvlink_gbps: jax.Array  # float32[] NVLink, one direction: a tensor-parallel all-reduce's link (tensor_parallel)
    allreduce_efficiency: jax.Array  # float32[] fraction of nvlink_gbps a ring all-reduce's bus bandwidth reaches
    allreduce_latency_us: jax.Array  # float32[] fixed cost of each all-reduce

    @classmethod
    def make(cls, gpu: gpus.GpuSpec | str = "h200", *, hbm_bw_gbps: float | None = None,
             compute_efficiency: float = KNOB_DEFAULTS["compute_efficiency"][0],
             attention_efficiency: float = KNOB_DEFAULTS["attention_efficiency"][0],
             memory_efficiency: float = KNOB_DEFAULTS["memory_efficiency"][0],
             launch_us: float = KNOB_DEFAULTS["launch_us"][0],
             allreduce_efficiency: float = tensor_parallel.KNOB_DEFAULTS["allreduce_efficiency"][0],
             allreduce_latency_us: float = tensor_parallel.KNOB_DEFAULTS["allreduce_latency_us"][0]) -> "GpuKnobs":
        """Knobs of ``gpu`` (a :class:`~hbfjax.workload.gpus.GpuSpec` or a preset name), validated;
        ``hbm_bw_gbps`` overrides the spec's bandwidth. The all-reduce knobs (both assumed:
        ``tensor_parallel.KNOB_DEFAULTS``) matter only to a tensor-parallel model."""
        spec = gpus.preset(gpu) if isinstance(gpu, str) else gpu
        require(isinstance(spec, gpus.GpuSpec), "GpuKnobs", "gpu", gpu, "must be a GpuSpec or a preset name")
        bw = spec.hbm_bw_gbps if hbm_bw_gbps is None else require_real("GpuKnobs", "hbm_bw_gbps", hbm_bw_gbps,
                                                                        0.0, lo_open=True)
        fractions = {name: require_real("GpuKnobs", name, value, 0.0, 1.0, lo_open=True) for name, value in
                     (("compute_efficiency", compute_efficiency), ("attention_efficiency", attention_efficiency),
                      ("memory_efficiency", memory_efficiency), ("allreduce_efficiency", allreduce_efficiency))}
        launch = require_real("GpuKnobs", "launch_us", launch_us, 0.0)
        latency = require_real("GpuKnobs", "allreduce_latency_us", allreduce_latency_us, 0.0)
        f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(peak_tflops=f32([spec.peak(p) for p in gpus.PRECISIONS]), hbm_bw_gbps=f32(bw),
                   **{k: f32(v) for k, v in fractions.items()}, launch_us=f32(launch),
                   nvlink_gbps=f32(spec.nvlink_gbps), allreduce_latency_us=f32(latency))


@dataclass(frozen=True)
class TimingConfig:
    """Static timing configuration: the model (a hashable ``ModelSpec``), activation width, attention
    precision, and whether a measured table may fall back to the roofline outside its ranges."""

    model: ModelSpec
    activation_bytes: int = 2  # bf16 activations
    attention_precision: str = "bf16"
    allow_roofline: bool = False

    def __post_init__(self) -> None:
        cls = type(self).__name__
        require(isinstance(self.model, ModelSpec), cls, "model", type(self.model).__name__,
                "must be a hbfjax.workload.models.ModelSpec")
        require_choice(cls, "activation_bytes", self.activation_bytes, (1, 2, 4))
        require_choice(cls, "attention_precision", self.attention_precision, gpus.PRECISIONS)
        require(isinstance(self.allow_roofline, bool), cls, "allow_roofline", self.allow_roofline, "must be a bool")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Batch:
    """One iteration's work (inputs): decode tokens and prefill chunks, fixed-size with masks."""

    decode_context: jax.Array  # int32[B] KV tokens each decode token attends to, itself included
    decode_mask: jax.Array  # bool[B]
    chunk_tokens: jax.Array  # int32[C] tokens of each prefill chunk
    chunk_prefix: jax.Array  # int32[C] tokens of the request already in the KV cache before the chunk
    chunk_mask: jax.Array  # bool[C]
    chunk_emits: jax.Array  # bool[C] the chunk completes its prompt: its last token goes through the LM head

    @classmethod
    def make(cls, decode_context=(), chunk_tokens=(), chunk_prefix=None, *, decode_mask=None, chunk_mask=None,
             chunk_emits=None) -> "Batch":
        """A validated batch from host arrays; masks default to all entries, ``chunk_prefix`` to 0 and
        ``chunk_emits`` to True (every chunk is its prompt's last)."""
        ctx = _int_array("decode_context", decode_context)
        tok = _int_array("chunk_tokens", chunk_tokens)
        pre = np.zeros_like(tok) if chunk_prefix is None else _int_array("chunk_prefix", chunk_prefix)
        dmask = _mask("decode_mask", decode_mask, ctx.shape)
        cmask = _mask("chunk_mask", chunk_mask, tok.shape)
        emits = _mask("chunk_emits", chunk_emits, tok.shape)
        require(pre.shape == tok.shape, "Batch", "chunk_prefix", pre.tolist(), f"must have the shape of chunk_tokens {tok.shape}")
        _check_entries("decode_context", ctx, dmask, 1)
        _check_entries("chunk_tokens", tok, cmask, 1)
        _check_entries("chunk_prefix", pre, cmask, 0)
        return cls(jnp.asarray(ctx, jnp.int32), jnp.asarray(dmask), jnp.asarray(tok, jnp.int32),
                   jnp.asarray(pre, jnp.int32), jnp.asarray(cmask), jnp.asarray(emits))


def _int_array(name: str, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(arr.shape if arr.ndim == 1 else (0,), np.int64)
    require(arr.ndim == 1, "Batch", name, arr.tolist(), "must be one-dimensional")
    require(np.issubdtype(arr.dtype, np.integer) or (np.issubdtype(arr.dtype, np.floating)
                                                      and np.all(np.isfinite(arr)) and np.all(arr == np.floor(arr))),
            "Batch", name, arr.tolist(), "must be integers")
    return arr.astype(np.int64)


def _mask(name: str, values, shape) -> np.ndarray:
    if values is None:
        return np.ones(shape, bool)
    arr = np.asarray(values)
    require(arr.shape == shape and arr.dtype == bool, "Batch", name, arr.tolist(), f"must be a bool array of shape {shape}")
    return arr


def _check_entries(name: str, arr: np.ndarray, mask: np.ndarray, lo: int) -> None:
    bad = (arr < lo) & mask | (arr > INT32_MAX)
    if bad.any():
        require_int("Batch", f"{name}[{int(np.argmax(bad))}]", int(arr[bad][0]), lo)


class OpCosts(NamedTuple):
    """Costs of operators (shape ``[ops]`` in :data:`OPS` order, or ``[]`` for the LM head)."""

    time_us: jax.Array  # float32: roofline or measured time, launch included
    compute_us: jax.Array  # float32: roofline FLOPs / (peak × efficiency), summed over the op's kernels
    memory_us: jax.Array  # float32: roofline bytes / (bandwidth × memory_efficiency), summed likewise
    flops: jax.Array  # float32
    weight_bytes: jax.Array  # float32: weights read (once per kernel)
    kv_bytes: jax.Array  # float32: KV cache read
    other_bytes: jax.Array  # float32: activations read and written, new KV written
    kernels: jax.Array  # float32: kernels launched (those with work)


class StepCosts(NamedTuple):
    """One iteration's GPU time for one dense layer, one MoE layer (with the given expert rows) and the
    LM head."""

    dense: OpCosts  # float32[ops]
    moe: OpCosts  # float32[ops]
    lm_head: OpCosts  # float32[]
    dense_layer_us: jax.Array  # float32[] sum of dense.time_us
    moe_layer_us: jax.Array  # float32[] sum of moe.time_us
    tokens: jax.Array  # int32[] tokens through each layer (decode + prefill chunk tokens)
    table_miss: jax.Array  # bool[ops + 1] an active op (OPS, then the LM head) fell outside the table


class ModelTimes(NamedTuple):
    """One iteration's GPU time through the whole model, per layer in ``ModelSpec.layer_kinds`` order."""

    segment_us: jax.Array  # float32[L, ops]
    layer_us: jax.Array  # float32[L]
    lm_head_us: jax.Array  # float32[]
    iteration_us: jax.Array  # float32[] all layers plus the LM head
    table_miss: jax.Array  # bool[ops + 1]


# --- one kernel ----------------------------------------------------------------------------------

class _Kernel(NamedTuple):
    flops: jax.Array
    weight_bytes: jax.Array
    kv_bytes: jax.Array
    other_bytes: jax.Array
    active: jax.Array  # bool: the kernel has work
    peak_index: int  # into GpuKnobs.peak_tflops
    attention: bool  # attention efficiency instead of the GEMM one


def _roofline(k: _Kernel, knobs: GpuKnobs):
    eff = knobs.attention_efficiency if k.attention else knobs.compute_efficiency
    compute = k.flops / (knobs.peak_tflops[k.peak_index] * eff * 1e6)
    memory = (k.weight_bytes + k.kv_bytes + k.other_bytes) / (knobs.hbm_bw_gbps * knobs.memory_efficiency * 1e3)
    zero = jnp.float32(0.0)
    time = jnp.where(k.active, jnp.maximum(compute, memory) + knobs.launch_us, zero)
    return time, jnp.where(k.active, compute, zero), jnp.where(k.active, memory, zero)


def _peak(precision: str) -> int:
    return gpus.PRECISIONS.index(precision)


# --- operator kernels (host-static structure, traced sizes) ---------------------------------------

def _linear_kernel(lin, tokens: jax.Array, act_bytes: int, copies: int | None = None) -> _Kernel:
    """A non-expert Linear (``copies`` of its matrix, default ``lin.copies``) over ``tokens`` tokens
    (float32[...])."""
    copies = lin.copies if copies is None else copies
    active = tokens > 0
    weights = float(lin.in_features * lin.out_features * copies)
    return _Kernel(flops=2.0 * tokens * weights, weight_bytes=jnp.where(active, weights * lin.bytes_per_param, 0.0),
                   kv_bytes=jnp.zeros_like(tokens),
                   other_bytes=tokens * float((lin.in_features + lin.out_features) * copies * act_bytes),
                   active=active, peak_index=_peak(precision_of(lin.bytes_per_param)), attention=False)


class EvenRows(NamedTuple):
    """Routed rows in compact form: ``total`` rows shared as evenly as possible by ``distinct`` experts
    (``total mod distinct`` of them get one row more), as count routing draws them
    (``routing.count_routing``); :func:`expert_costs` takes it in place of ``rows: int32[..., E]``."""

    distinct: jax.Array  # int32[...] experts with rows (0 when total is 0)
    total: jax.Array  # int32[...] rows over all experts (tokens × top-k)


def _totals(rows) -> tuple[jax.Array, jax.Array]:
    """(total rows, distinct experts) float32[...] of ``rows`` (int32[..., E] or EvenRows)."""
    if isinstance(rows, EvenRows):
        total = jnp.asarray(rows.total, jnp.float32)
        return total, jnp.where(total > 0, jnp.asarray(rows.distinct, jnp.float32), 0.0)
    return jnp.sum(rows, axis=-1).astype(jnp.float32), jnp.sum(rows > 0, axis=-1).astype(jnp.float32)


def _expert_kernel(lin, rows, act_bytes: int) -> _Kernel:
    """A routed-expert Linear as one grouped kernel; ``rows: int32[..., E]`` or :class:`EvenRows`."""
    total, distinct = _totals(rows)
    per_copy = float(lin.in_features * lin.out_features)
    return _Kernel(flops=2.0 * total * per_copy, weight_bytes=distinct * per_copy * lin.bytes_per_param,
                   kv_bytes=jnp.zeros_like(total), other_bytes=total * float((lin.in_features + lin.out_features) * act_bytes),
                   active=total > 0, peak_index=_peak(precision_of(lin.bytes_per_param)), attention=False)


def _norm_kernel(model, tokens: jax.Array, act_bytes: int) -> _Kernel:
    """All RMSNorms of one layer (their launches are counted by the caller)."""
    elements = tokens * float(model.hidden)
    return _Kernel(flops=float(NORMS_PER_LAYER * NORM_FLOPS_PER_ELEMENT) * elements,
                   weight_bytes=jnp.where(tokens > 0, float(model.norm_params_per_layer * model.bytes_per_param("norms")),
                                          0.0),
                   kv_bytes=jnp.float32(0.0), other_bytes=float(NORMS_PER_LAYER * 2 * act_bytes) * elements,
                   active=tokens > 0, peak_index=_peak("fp32"), attention=False)


def decode_pairs(batch: Batch) -> jax.Array:
    """(query, context) pairs of the decode tokens: float32[] Σ context over active tokens."""
    return jnp.sum(jnp.where(batch.decode_mask, batch.decode_context, 0).astype(jnp.float32))


def prefill_pairs(batch: Batch) -> jax.Array:
    """Causal (query, context) pairs of the prefill chunks: float32[] Σ n·p + n(n+1)/2."""
    n = jnp.where(batch.chunk_mask, batch.chunk_tokens, 0).astype(jnp.float32)
    p = jnp.where(batch.chunk_mask, batch.chunk_prefix, 0).astype(jnp.float32)
    return jnp.sum(n * p + n * (n + 1.0) / 2.0)


def _attention_kernel(model, phase: str, pairs, queries, kv_tokens, act_bytes: int, precision: str) -> _Kernel:
    kv = float(model.kv_bytes_per_token_layer)
    read = kv * float(model.kv_fraction_attended)  # compressed attention reads a fraction of the entries
    return _Kernel(flops=pairs * float(model.attention_flops_per_pair(phase)), weight_bytes=jnp.float32(0.0),
                   kv_bytes=kv_tokens * read, other_bytes=queries * (kv + 2.0 * model.hidden * act_bytes),
                   active=queries > 0, peak_index=_peak(precision), attention=True)


def tokens_of(batch: Batch) -> jax.Array:
    """int32[] tokens through each layer: active decode tokens plus active chunk tokens."""
    return jnp.sum(batch.decode_mask.astype(jnp.int32)) + jnp.sum(jnp.where(batch.chunk_mask, batch.chunk_tokens, 0))


def emitting_tokens(batch: Batch) -> jax.Array:
    """int32[] tokens through the LM head: decode tokens and the last token of completing chunks."""
    return jnp.sum(batch.decode_mask.astype(jnp.int32)) + jnp.sum((batch.chunk_mask & batch.chunk_emits).astype(jnp.int32))


# --- measured table ------------------------------------------------------------------------------

def _measured(table, key, x, roofline_us, allow: bool):
    """(time_us, miss) of one op from its curve at size ``x`` (0 = no work), or the roofline."""
    if table is None:
        return roofline_us, jnp.zeros(jnp.shape(x), bool)
    active = x > 0
    index = table.index(key)
    if index is None:
        us, inside = jnp.zeros(jnp.shape(x), jnp.float32), jnp.zeros(jnp.shape(x), bool)
    else:
        us, inside = pt.curve_us(table, index, x)
    fallback = roofline_us if allow else jnp.full(jnp.shape(x), jnp.nan, jnp.float32)
    miss = active & ~inside
    return jnp.where(active, jnp.where(inside, us, fallback), 0.0), miss & (not allow)


# --- operator costs ------------------------------------------------------------------------------

class _Acc:
    """Per-op sums of kernel costs, built at trace time (a static loop over the model's Linears)."""

    def __init__(self, shape=()):
        zeros = lambda: [jnp.zeros(shape, jnp.float32) for _ in OPS]  # noqa: E731
        self.time, self.compute, self.memory, self.flops = zeros(), zeros(), zeros(), zeros()
        self.weight, self.kv, self.other, self.kernels = zeros(), zeros(), zeros(), zeros()
        self.miss = [jnp.zeros(shape, bool) for _ in OPS]

    def add(self, op: str, k: _Kernel, knobs: GpuKnobs, time_us=None, miss=None, launches: float = 1.0):
        i = OPS.index(op)
        roof, compute, memory = _roofline(k, knobs)
        if launches != 1.0:  # several identical kernels (the layer's norms): one launch each
            roof = roof + jnp.where(k.active, (launches - 1.0) * knobs.launch_us, 0.0)
        self.time[i] = self.time[i] + (roof if time_us is None else time_us)
        self.compute[i] = self.compute[i] + compute
        self.memory[i] = self.memory[i] + memory
        self.flops[i] = self.flops[i] + k.flops
        self.weight[i] = self.weight[i] + k.weight_bytes
        self.kv[i] = self.kv[i] + k.kv_bytes
        self.other[i] = self.other[i] + k.other_bytes
        self.kernels[i] = self.kernels[i] + jnp.where(k.active, launches, 0.0)
        if miss is not None:
            self.miss[i] = self.miss[i] | miss

    def costs(self) -> OpCosts:
        st = lambda xs: jnp.stack(xs, axis=-1)  # noqa: E731
        return OpCosts(st(self.time), st(self.compute), st(self.memory), st(self.flops), st(self.weight), st(self.kv),
                       st(self.other), st(self.kernels))


def _layer_base(kind: str, batch: Batch, knobs: GpuKnobs, config: TimingConfig, table) -> _Acc:
    """Every op of one layer of ``kind`` except the routed experts."""
    model, ab, allow = config.model, config.activation_bytes, config.allow_roofline
    acc = _Acc()
    tokens = tokens_of(batch).astype(jnp.float32)
    norm = _norm_kernel(model, tokens, ab)
    roof = _roofline(norm, knobs)[0] + jnp.where(norm.active, (NORMS_PER_LAYER - 1) * knobs.launch_us, 0.0)
    norm_us = _measured(table, pt.norm_key(model, ab), tokens, roof / NORMS_PER_LAYER, allow)
    acc.add("norms", norm, knobs, NORMS_PER_LAYER * norm_us[0], norm_us[1], launches=float(NORMS_PER_LAYER))
    for lin in model.linears(kind):
        if lin.op == "experts":
            continue
        k = _linear_kernel(lin, tokens, ab)
        roof = _roofline(k, knobs)[0]
        us, miss = _measured(table, pt.linear_key(lin), tokens, roof / lin.copies, allow)
        acc.add(lin.op, k, knobs, lin.copies * us, miss)
    n = jnp.where(batch.chunk_mask, batch.chunk_tokens, 0).astype(jnp.float32)
    p = jnp.where(batch.chunk_mask, batch.chunk_prefix, 0).astype(jnp.float32)
    decode_tokens = jnp.sum(batch.decode_mask.astype(jnp.float32))
    for phase, pairs, queries, kv_tokens, x in (
            ("decode", decode_pairs(batch), decode_tokens, decode_pairs(batch), decode_pairs(batch)),
            ("prefill", prefill_pairs(batch), jnp.sum(n), jnp.sum(p + n), prefill_pairs(batch))):
        k = _attention_kernel(model, phase, pairs, queries, kv_tokens, ab, config.attention_precision)
        us, miss = _measured(table, pt.attention_key(model, phase, config.attention_precision), x,
                             _roofline(k, knobs)[0], allow)
        acc.add(f"attention_{phase}", k, knobs, us, miss)
    return acc


def expert_costs(rows, knobs: GpuKnobs, config: TimingConfig, table=None) -> tuple[OpCosts, jax.Array]:
    """Costs of the routed experts of MoE layers: ``rows: int32[..., E]`` (routed rows per expert, one
    row per layer) or :class:`EvenRows` -> (OpCosts with fields float32[..., ops], zero except
    ``experts``; miss bool[...])."""
    model, ab = config.model, config.activation_bytes
    even = isinstance(rows, EvenRows)
    if not even:
        rows = jnp.asarray(rows, jnp.int32)
    shape = jnp.shape(rows.total) if even else rows.shape[:-1]
    acc = _Acc(shape)
    miss_all = jnp.zeros(shape, bool)
    for lin in model.linears("moe"):
        if lin.op != "experts":
            continue
        k = _expert_kernel(lin, rows, ab)
        if table is None:
            acc.add("experts", k, knobs)
            continue
        # the table times each expert as its own GEMM of its rows (fallback: that GEMM's roofline)
        if even:  # r experts of q + 1 rows and d − r of q rows
            d = jnp.maximum(jnp.asarray(rows.distinct, jnp.int32), 1)
            total = jnp.asarray(rows.total, jnp.int32)
            q, r = total // d, total % d
            sizes = jnp.stack([q + 1, q], axis=-1).astype(jnp.float32)  # f32[..., 2]
            counts = jnp.stack([r, jnp.where(total > 0, d - r, 0)], axis=-1).astype(jnp.float32)
            sizes = jnp.where(counts > 0, sizes, 0.0)
        else:
            sizes, counts = rows.astype(jnp.float32), jnp.ones(rows.shape, jnp.float32)
        fallback = _roofline(_linear_kernel(lin, sizes, ab, copies=1), knobs)[0]
        us, miss = _measured(table, pt.linear_key(lin), sizes, fallback, config.allow_roofline)
        miss = miss & (counts > 0)
        acc.add("experts", k, knobs, jnp.sum(us * counts, axis=-1), jnp.any(miss, axis=-1))
        miss_all = miss_all | jnp.any(miss, axis=-1)
    return acc.costs(), miss_all


def _lm_head(batch: Batch, knobs: GpuKnobs, config: TimingConfig, table) -> tuple[OpCosts, jax.Array]:
    tokens = emitting_tokens(batch).astype(jnp.float32)
    fields = [jnp.float32(0.0)] * len(OpCosts._fields)
    miss = jnp.zeros((), bool)
    for lin in config.model.head_linears():
        k = _linear_kernel(lin, tokens, config.activation_bytes)
        roof, compute, memory = _roofline(k, knobs)
        us, m = _measured(table, pt.linear_key(lin), tokens, roof / lin.copies, config.allow_roofline)
        parts = (lin.copies * us, compute, memory, k.flops, k.weight_bytes, k.kv_bytes, k.other_bytes,
                 jnp.where(k.active, 1.0, 0.0))
        fields = [a + b for a, b in zip(fields, parts)]
        miss = miss | m
    return OpCosts(*fields), miss


def _dense_layer(batch: Batch, knobs: GpuKnobs, config: TimingConfig, table) -> tuple[OpCosts, jax.Array]:
    """(OpCosts float32[ops], miss bool[ops]) of one dense layer."""
    acc = _layer_base("dense", batch, knobs, config, table)
    return acc.costs(), jnp.stack(acc.miss)


def _moe_layer(batch: Batch, rows: jax.Array, knobs: GpuKnobs, config: TimingConfig, table) -> tuple[OpCosts, jax.Array]:
    """(OpCosts float32[..., ops], miss bool[..., ops]) of MoE layers with ``rows: int32[..., E]``; the
    non-expert ops are computed once and broadcast."""
    base = _layer_base("moe", batch, knobs, config, table)
    experts, experts_miss = expert_costs(rows, knobs, config, table)
    is_experts = jnp.arange(len(OPS)) == OPS.index("experts")
    miss = jnp.stack(base.miss) | is_experts & experts_miss[..., None]
    return OpCosts(*(b + e for b, e in zip(base.costs(), experts))), miss


def step_costs(batch: Batch, rows: jax.Array, knobs: GpuKnobs, config: TimingConfig, table=None) -> StepCosts:
    """GPU costs of one iteration for one dense layer, one MoE layer whose routed experts got
    ``rows: int32[E]`` rows, and the LM head (roofline, or ``table`` as in the module docstring)."""
    dense, dense_miss = _dense_layer(batch, knobs, config, table)
    moe, moe_miss = _moe_layer(batch, jnp.asarray(rows, jnp.int32), knobs, config, table)
    head, head_miss = _lm_head(batch, knobs, config, table)
    return StepCosts(dense=dense, moe=moe, lm_head=head, dense_layer_us=jnp.sum(dense.time_us),
                     moe_layer_us=jnp.sum(moe.time_us), tokens=tokens_of(batch),
                     table_miss=jnp.concatenate([dense_miss | moe_miss, head_miss[None]]))


def model_times(batch: Batch, rows: jax.Array, knobs: GpuKnobs, config: TimingConfig, table=None) -> ModelTimes:
    """GPU time of one iteration through every layer: ``rows: int32[L_moe, E]`` gives each MoE layer's
    routed rows per expert (in layer order; ignored by a dense model); the non-expert ops of a layer
    kind are computed once."""
    is_moe = np.array([k == "moe" for k in config.model.layer_kinds])  # static bool[L]
    rows = jnp.asarray(rows, jnp.int32)
    miss = jnp.zeros(len(OPS), bool)
    dense_seg = jnp.zeros(len(OPS), jnp.float32)
    if not is_moe.all():
        dense, dense_miss = _dense_layer(batch, knobs, config, table)
        dense_seg, miss = dense.time_us, miss | dense_miss
    segment = jnp.broadcast_to(dense_seg, (len(is_moe), len(OPS)))
    if is_moe.any():
        require(rows.ndim == 2 and rows.shape[0] == is_moe.sum(), "model_times", "rows", tuple(rows.shape),
                f"must be int32[{is_moe.sum()}, E] (one row of expert rows per MoE layer)")
        moe, moe_miss = _moe_layer(batch, rows, knobs, config, table)  # float32[Lm, ops]
        moe_row = np.maximum(np.cumsum(is_moe) - 1, 0)  # static: which MoE layer each layer is
        segment = jnp.where(jnp.asarray(is_moe)[:, None], moe.time_us[moe_row], segment)
        miss = miss | jnp.any(moe_miss, axis=0)
    head, head_miss = _lm_head(batch, knobs, config, table)
    layer_us = jnp.sum(segment, axis=1)
    return ModelTimes(segment_us=segment, layer_us=layer_us, lm_head_us=head.time_us,
                      iteration_us=jnp.sum(layer_us) + head.time_us, table_miss=jnp.concatenate([miss, head_miss[None]]))


def raise_if_table_miss(table_miss) -> None:
    """Raise :class:`~hbfjax.workload.profile_table.ProfileRangeError` naming each operator that fell
    outside the measured table (a host check on a result's ``table_miss``, any leading axes)."""
    flags = np.asarray(table_miss).reshape(-1, len(OPS) + 1).any(axis=0)
    if flags.any():
        names = [name for name, f in zip(OPS + ("lm_head",), flags) if f]
        raise pt.ProfileRangeError(f"timing.table_miss = {names}: these operators' shapes lie outside the measured "
                                   "profile table (or have no curve in it); profile them (hbfjax profile --model ...) "
                                   "or set TimingConfig.allow_roofline=True to use the roofline there")


__all__ = ["OPS", "GpuKnobs", "TimingConfig", "Batch", "EvenRows", "OpCosts", "StepCosts", "ModelTimes", "step_costs",
           "model_times", "expert_costs", "precision_of", "decode_pairs", "prefill_pairs", "tokens_of",
           "emitting_tokens", "raise_if_table_miss"]
