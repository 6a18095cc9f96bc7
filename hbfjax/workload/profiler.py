"""Time the operator shapes of a model with JAX on the accelerator at hand, for the measured table
(:mod:`hbfjax.workload.profile_table`; DASH §VI-A "Simulation" profiles GPU operator latencies on an
H100 PCIe at the evaluated shapes).

Each shape is one jitted call timed after ``warmup`` calls, ``repeats`` times with
``block_until_ready``; the row keeps the median µs. Shapes and sizes:

* every weight matmul of the model (``ModelSpec.linears`` of each layer kind and ``head_linears``),
  one copy of it (a routed expert is one GEMM of its rows), at M ∈ ``tokens`` rows: x[M, in] @ W[in, out]
  with bf16 activations and W in its weight dtype (fp8 weights multiply fp8 activations into bf16;
  int4 weights are dequantised to bf16 inside the call; fp32 at full fp32 precision);
* one RMSNorm over ``hidden`` at the same token counts;
* decode attention: one query token over ``context`` KV tokens for each context length;
* prefill attention: one chunk of ``chunk`` tokens after a prefix, so that prefix + chunk = each
  context length ≥ chunk; causal inside the chunk.

Attention is plain JAX (logits in fp32, softmax, PV) with grouped KV heads, in the geometry of
``profile_table.attention_geometry`` (MLA absorbed in decode: one latent KV head, values in the latent;
DeepSeek-V4's compressed attention as dense attention over the ``kv_fraction_attended`` of the context
it reads, an approximation of its sparse kernels). Compilation happens before the warm-up and is never
timed.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from hbfjax.workload import profile_table as pt

TOKENS = tuple(2**i for i in range(14))  # 1 … 8192 GEMM rows
CONTEXTS = tuple(2**i for i in range(7, 18))  # 128 … 128K KV tokens
PREFILL_CHUNK = 512
QUICK_TOKENS = (1, 4, 16, 64)
QUICK_CONTEXTS = (64, 256)
QUICK_CHUNK = 32
QUICK_MODEL = "quick-tiny"


@dataclass(frozen=True)
class Shape:
    """One operator shape to time (GEMM and norm fields, or attention fields)."""

    model: str
    op: str
    name: str
    dtype: str
    in_features: int = 0
    out_features: int = 0
    heads: int = 0
    kv_heads: int = 0
    qk_dim: int = 0
    v_dim: int = 0
    kv_fraction: float = 1.0  # compressed attention: fraction of the context entries a query reads

    @property
    def is_attention(self) -> bool:
        return self.op in pt.ATTENTION_OPS


def model_shapes(model, name: str, activation_bytes: int = 2, attention_precision: str = "bf16") -> list[Shape]:
    """The distinct operator shapes of ``model`` (a ModelSpec), in the keys the timing looks up."""
    shapes: dict[tuple, Shape] = {}
    kinds = sorted(set(model.layer_kinds))
    linears = [lin for kind in kinds for lin in model.linears(kind)] + list(model.head_linears())
    for lin in linears:
        key = pt.linear_key(lin)
        shapes.setdefault(key, Shape(name, lin.op, lin.name, key[4], int(lin.in_features), int(lin.out_features)))
    hidden = int(model.hidden)
    norm = pt.norm_key(model, activation_bytes)
    shapes.setdefault(norm, Shape(name, "norm", "rmsnorm", norm[4], hidden, hidden))
    for phase in ("decode", "prefill"):
        heads, kv_heads, qk, v = pt.attention_geometry(model, phase)
        shapes.setdefault(pt.attention_key(model, phase, attention_precision),
                          Shape(name, f"attention_{phase}", "attention", attention_precision, heads=heads,
                                kv_heads=kv_heads, qk_dim=qk, v_dim=v, kv_fraction=float(model.kv_fraction_attended)))
    return list(shapes.values())


def quick_shapes() -> list[Shape]:
    """A handful of small shapes of every operator kind (``hbfjax profile --quick`` without a model)."""
    m = QUICK_MODEL
    return [Shape(m, "qkv_proj", "qkv", "bf16", 256, 512), Shape(m, "out_proj", "o", "bf16", 256, 256),
            Shape(m, "experts", "gate_up", "bf16", 256, 1024), Shape(m, "norm", "rmsnorm", "bf16", 256, 256),
            Shape(m, "attention_decode", "attention", "bf16", heads=4, kv_heads=2, qk_dim=64, v_dim=64),
            Shape(m, "attention_prefill", "attention", "bf16", heads=4, kv_heads=2, qk_dim=64, v_dim=64)]


_JNP_DTYPES = {"bf16": jnp.bfloat16, "fp8": jnp.float8_e4m3fn, "fp32": jnp.float32, "int4": jnp.int4}


def _gemm(shape: Shape, m: int):
    dtype = _JNP_DTYPES.get(shape.dtype, jnp.bfloat16)
    x = jnp.full((m, shape.in_features), 0.01, jnp.bfloat16)
    w = jnp.full((shape.in_features, shape.out_features), 1, jnp.float32).astype(dtype)
    if shape.dtype == "fp8":
        fn = lambda x, w: jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.bfloat16)  # noqa: E731
    elif shape.dtype == "fp32":
        x = x.astype(jnp.float32)
        fn = lambda x, w: jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
    else:  # bf16, and weight-only widths dequantised to bf16
        fn = lambda x, w: jnp.dot(x, w.astype(jnp.bfloat16))  # noqa: E731
    return fn, (x, w)


def _norm(shape: Shape, m: int):
    def rmsnorm(x, g):
        xf = x.astype(jnp.float32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * g).astype(x.dtype)

    return rmsnorm, (jnp.full((m, shape.in_features), 0.5, jnp.bfloat16), jnp.ones((shape.in_features,), jnp.float32))


LOGITS_BYTES = 4 * 2**30  # fp32 logits one query block may hold: long prefill chunks run in blocks


def attention(q, k, v, prefix: int, logits_bytes: int = LOGITS_BYTES):
    """Grouped attention of q[n, H, qk] over k[S, Hk, qk], v[S, Hk, dv]; query i sits at position
    ``prefix + i`` and sees keys ≤ it (decode: n = 1, prefix = S − 1). Returns [n, H, dv] (bf16).
    Queries go in blocks whose fp32 logits fit ``logits_bytes`` (one ``lax.map`` step per block)."""
    n, heads, _ = q.shape
    s, kv_heads, _ = k.shape
    block = max(1, min(n, logits_bytes // max(1, 4 * heads * s)))
    while n % block:
        block -= 1

    def one_block(args):
        qb, start = args  # qb[block, H, qk]; its first query's position is prefix + start
        qg = qb.reshape(block, kv_heads, heads // kv_heads, q.shape[-1])
        logits = jnp.einsum("ngjd,sgd->gjns", qg, k, preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])
        visible = jnp.arange(s)[None, :] <= prefix + start + jnp.arange(block)[:, None]  # bool[block, S]
        probs = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1).astype(v.dtype)
        out = jnp.einsum("gjns,sgd->ngjd", probs, v, preferred_element_type=jnp.float32)
        return out.reshape(block, heads, v.shape[-1]).astype(q.dtype)

    blocks = q.reshape(n // block, block, heads, q.shape[-1])
    starts = jnp.arange(0, n, block)
    return jax.lax.map(one_block, (blocks, starts)).reshape(n, heads, v.shape[-1])


def _attention(shape: Shape, tokens: int, context: int):
    # compressed attention: the kernel sees only the entries a query reads (at least the chunk's own)
    entries = context if shape.kv_fraction == 1.0 else max(tokens, round(shape.kv_fraction * context))
    q = jnp.full((tokens, shape.heads, shape.qk_dim), 0.01, jnp.bfloat16)
    k = jnp.full((entries, shape.kv_heads, shape.qk_dim), 0.01, jnp.bfloat16)
    v = jnp.full((entries, shape.kv_heads, shape.v_dim), 0.01, jnp.bfloat16)
    prefix = entries - tokens
    return (lambda q, k, v: attention(q, k, v, prefix)), (q, k, v)


def time_call(fn, args, warmup: int = 2, repeats: int = 5) -> float:
    """Median µs of ``jax.jit(fn)(*args)`` over ``repeats`` calls after compiling and ``warmup`` calls."""
    jitted = jax.jit(fn)
    compiled = jitted.lower(*args).compile()
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _sizes(shape: Shape, tokens, contexts, chunk: int):
    """(tokens, context) pairs at which ``shape`` is timed."""
    if shape.op == "attention_decode":
        return [(1, c) for c in contexts]
    if shape.op == "attention_prefill":
        return [(chunk, c) for c in contexts if c >= chunk]
    return [(m, 0) for m in tokens]


def profile(shapes: list[Shape], tokens=TOKENS, contexts=CONTEXTS, chunk: int = PREFILL_CHUNK, warmup: int = 2,
            repeats: int = 5, progress: bool = False) -> list[dict]:
    """Time every shape at its sizes; rows in the schema of :data:`profile_table.FIELDS`."""
    device, version = jax.devices()[0].device_kind, jax.__version__
    rows = []
    for i, shape in enumerate(shapes):
        t0 = time.perf_counter()
        for n, context in _sizes(shape, tokens, contexts, chunk):
            if shape.is_attention:
                fn, args = _attention(shape, n, context)
            elif shape.op == "norm":
                fn, args = _norm(shape, n)
            else:
                fn, args = _gemm(shape, n)
            us = time_call(fn, args, warmup, repeats)
            rows.append({"device": device, "jax_version": version, "model": shape.model, "op": shape.op,
                         "name": shape.name, "in_features": shape.in_features, "out_features": shape.out_features,
                         "heads": shape.heads, "kv_heads": shape.kv_heads, "qk_dim": shape.qk_dim, "v_dim": shape.v_dim,
                         "dtype": shape.dtype, "tokens": n, "context": context, "us": round(us, 3), "repeats": repeats})
            del args
        if progress:
            print(f"  [{i + 1}/{len(shapes)}] {shape.model} {shape.op} {shape.name} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
    return rows
