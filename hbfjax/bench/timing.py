"""GPU operator timing of one serving iteration per stream: S streams × (32 decode tokens + one
512-token prefill chunk) through Qwen3-235B-A22B (94 MoE layers, 128 experts, per-layer expert rows)
on an H200 roofline (``timing.model_times``, vmapped over streams, one jit).

The reference does the same roofline the plain NumPy way, one stream at a time: the operator sums of
a layer with NumPy, the experts of all 94 layers as one [L, E] array. Its results are checked equal
to the compiled ones on the first streams before either is timed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.workload import gpus, models
from hbfjax.workload import timing as tm

MODEL = "qwen3-235b-a22b"
DECODE, CHUNK = 32, 512


def _inputs(streams: int, spec, seed: int = 0):
    gen = np.random.default_rng(seed)
    ctx = gen.integers(1, 32_768, (streams, DECODE))
    dmask = gen.random((streams, DECODE)) < 0.9
    pre = gen.integers(0, 16_384, (streams, 1))
    tokens = dmask.sum(1) + CHUNK
    probs = np.full(spec.routed_experts, 1.0 / spec.routed_experts)
    rows = np.stack([gen.multinomial(t * spec.top_k, probs, size=spec.moe_layers) for t in tokens]).astype(np.int32)
    batch = tm.Batch(jnp.asarray(ctx, jnp.int32), jnp.asarray(dmask), jnp.full((streams, 1), CHUNK, jnp.int32),
                     jnp.asarray(pre, jnp.int32), jnp.ones((streams, 1), bool), jnp.ones((streams, 1), bool))
    return batch, jnp.asarray(rows), (ctx, dmask, pre, rows)


def _kernel(flops, bytes_, peak, eff, k):
    busy = (flops > 0) | (bytes_ > 0)
    return np.where(busy, np.maximum(flops / (peak * eff * 1e6), bytes_ / (k["bw"] * k["mem"] * 1e3)) + k["launch"], 0.0)


def numpy_iteration_us(spec, ctx, dmask, prefix, rows, knobs) -> float:
    """One stream's iteration µs: the roofline of ``timing`` in NumPy (a MoE-only model, one chunk)."""
    k = {"bw": float(knobs.hbm_bw_gbps), "mem": float(knobs.memory_efficiency), "launch": float(knobs.launch_us),
         "ce": float(knobs.compute_efficiency), "ae": float(knobs.attention_efficiency),
         "peak": dict(zip(gpus.PRECISIONS, np.asarray(knobs.peak_tflops, np.float64)))}
    decode = int(dmask.sum())
    t = decode + CHUNK
    peak = lambda lin: k["peak"][gpus.compute_precision(lin.bytes_per_param)]  # noqa: E731
    base = 0.0
    for lin in spec.linears("moe"):
        if lin.op != "experts":
            w = lin.in_features * lin.out_features * lin.copies
            base += float(_kernel(2.0 * t * w, w * lin.bytes_per_param + t * (lin.in_features + lin.out_features)
                                  * lin.copies * 2, peak(lin), k["ce"], k))
    elems = t * spec.hidden
    base += float(_kernel(8.0 * elems, spec.norm_params_per_layer * 2 + 8.0 * elems, k["peak"]["fp32"], k["ce"], k)) \
        + k["launch"]
    kv, q_bytes = spec.kv_bytes_per_token_layer, 2 * spec.hidden * 2
    pairs = float(ctx[dmask].sum())
    base += float(_kernel(pairs * spec.attention_flops_per_pair("decode"), pairs * kv + decode * (kv + q_bytes),
                          k["peak"]["bf16"], k["ae"], k))
    p = float(prefix[0])
    chunk_pairs = CHUNK * p + CHUNK * (CHUNK + 1) / 2
    base += float(_kernel(chunk_pairs * spec.attention_flops_per_pair("prefill"), (p + CHUNK) * kv
                          + CHUNK * (kv + q_bytes), k["peak"]["bf16"], k["ae"], k))
    total = rows.sum(1).astype(np.float64)  # [L]
    distinct = (rows > 0).sum(1).astype(np.float64)
    experts = np.zeros(len(total))
    for lin in spec.linears("moe"):
        if lin.op == "experts":
            per = lin.in_features * lin.out_features
            experts += _kernel(2.0 * total * per, distinct * per * lin.bytes_per_param
                               + total * (lin.in_features + lin.out_features) * 2, peak(lin), k["ce"], k)
    head = spec.head_linears()[0]
    h = decode + 1
    w = head.in_features * head.out_features
    head_us = float(_kernel(2.0 * h * w, w * head.bytes_per_param + h * (head.in_features + head.out_features) * 2,
                            peak(head), k["ce"], k))
    return spec.layers * base + float(experts.sum()) + head_us


def run(scale: float) -> list[dict]:
    spec = models.preset(MODEL)
    config, knobs = tm.TimingConfig(spec), tm.GpuKnobs.make("h200")
    streams = max(64, int(1024 * scale))
    batch, rows, host = _inputs(streams, spec)
    fn = jax.jit(jax.vmap(tm.model_times, in_axes=(0, 0, None, None)), static_argnums=3)
    compile_s, run_s = time_compiled(lambda: fn(batch, rows, knobs, config).iteration_us)
    out = fn(batch, rows, knobs, config)
    ctx, dmask, pre, rows_np = host
    for s in range(3):
        ref = numpy_iteration_us(spec, ctx[s], dmask[s], pre[s], rows_np[s], knobs)
        np.testing.assert_allclose(float(out.iteration_us[s]), ref, rtol=1e-4)
    ref_streams = 16
    ref_s = time_reference(lambda: [numpy_iteration_us(spec, ctx[s], dmask[s], pre[s], rows_np[s], knobs)
                                    for s in range(ref_streams)]) / ref_streams
    label = f"timing {MODEL} {streams} streams x ({DECODE} decode + {CHUNK}-token chunk), {spec.layers} layers"
    return [row(label, streams, "stream-iterations", compile_s, run_s, ref_s, streams=streams,
                us_per_stream_iteration=run_s / streams * 1e6,
                mean_iteration_us=float(np.mean(np.asarray(out.iteration_us))))]
