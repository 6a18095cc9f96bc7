"""GPU operator timing: GPU presets, the roofline by hand, attention pairs by hand, a plain-Python
reference of the whole layer, sums, monotonicity, transforms and recompilation, bad values."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax.validate import ConfigError
from hbfjax.workload import gpus, models
from hbfjax.workload import timing as tm
from tests._compiles import compilations
from tests._tiny_models import GQA, MLA, single_gemm

OPS = tm.OPS
SXM_BF16_TFLOPS = 1979 / 2  # H100 SXM datasheet, dense
SXM_HBM_GBPS = 3350.0


def test_gpu_presets_store_dense_datasheet_rates_with_sources():
    sxm, pcie, h200 = gpus.preset("h100-sxm"), gpus.preset("h100-pcie"), gpus.preset("h200")
    assert (sxm.peak_tflops_bf16, sxm.peak_tflops_fp8, sxm.peak_tflops_tf32) == (989.5, 1979.0, 494.5)
    assert (pcie.peak_tflops_bf16, pcie.peak_tflops_fp8, pcie.hbm_bw_gbps) == (756.5, 1513.0, 2000.0)
    assert (h200.peak_tflops_bf16, h200.hbm_bw_gbps, h200.memory_bytes) == (989.5, 4800.0, 141 * 10**9)
    for spec in (sxm, pcie, h200):
        for field in ("peak_tflops_bf16", "peak_tflops_fp8", "peak_tops_int8", "peak_tflops_tf32", "peak_tflops_fp32",
                      "hbm_bw_gbps", "memory_bytes"):
            assert "datasheet" in spec.source(field), (spec.name, field)
        assert "sparsity" in spec.source("peak_tflops_bf16")
        assert hash(spec) == hash(gpus.preset(spec.name))


def _gemm_op(tokens_as: str, m: int, knobs):
    model = single_gemm(4096)
    batch = tm.Batch.make([1] * m) if tokens_as == "decode" else tm.Batch.make([], [m], [0])
    costs = tm.step_costs(batch, jnp.zeros((1,), jnp.int32), knobs, tm.TimingConfig(model)).dense
    i = OPS.index("qkv_proj")
    return float(costs.time_us[i]), float(costs.compute_us[i]), float(costs.memory_us[i])


def test_one_gemm_by_hand_is_bytes_bound_at_one_token_and_compute_bound_at_8192():
    knobs = tm.GpuKnobs.make("h100-sxm")  # defaults: 0.7 of peak, 0.8 of HBM, 4 µs per kernel
    # M = 1: 2·4096·4096 FLOP; 4096·4096 bf16 weights + one 4096-in, 4096-out row of activations
    flops, bytes_ = 2 * 4096 * 4096, 4096 * 4096 * 2 + (4096 + 4096) * 2
    compute_us, memory_us = flops / (SXM_BF16_TFLOPS * 0.7 * 1e6), bytes_ / (SXM_HBM_GBPS * 0.8 * 1e3)
    time_us, c, m = _gemm_op("decode", 1, knobs)
    assert memory_us > 100 * compute_us  # 12.5 µs against 0.048 µs
    assert time_us == pytest.approx(memory_us + 4.0, rel=1e-5)
    assert (c, m) == (pytest.approx(compute_us, rel=1e-5), pytest.approx(memory_us, rel=1e-5))
    # M = 8192 tokens (one prefill chunk): 2.75e11 FLOP at 692.65 TFLOPS = 396.9 µs; 167.8 MB at 2.68 TB/s = 62.6 µs
    flops, bytes_ = 2 * 8192 * 4096 * 4096, 4096 * 4096 * 2 + 8192 * (4096 + 4096) * 2
    compute_us, memory_us = flops / (SXM_BF16_TFLOPS * 0.7 * 1e6), bytes_ / (SXM_HBM_GBPS * 0.8 * 1e3)
    time_us, c, m = _gemm_op("chunk", 8192, knobs)
    assert compute_us > 3 * memory_us
    assert time_us == pytest.approx(compute_us + 4.0, rel=1e-5)
    # at the datasheet peaks with no launch cost: 33,570,816 B / 3.35e9 B/s = 10.0211 µs
    ideal = tm.GpuKnobs.make("h100-sxm", compute_efficiency=1.0, memory_efficiency=1.0, launch_us=0.0)
    assert _gemm_op("decode", 1, ideal)[0] == pytest.approx(10.021139, rel=1e-5)


def test_fp8_weights_take_the_fp8_peak_and_half_the_bytes():
    knobs = tm.GpuKnobs.make("h100-sxm", compute_efficiency=1.0, memory_efficiency=1.0, launch_us=0.0)
    model = single_gemm(4096, bytes_per_param=1.0)
    costs = tm.step_costs(tm.Batch.make([], [8192], [0]), jnp.zeros((1,), jnp.int32), knobs, tm.TimingConfig(model))
    i = OPS.index("qkv_proj")
    assert float(costs.dense.compute_us[i]) == pytest.approx(2 * 8192 * 4096 * 4096 / (1979.0 * 1e6), rel=1e-5)
    assert float(costs.dense.weight_bytes[i]) == 4096 * 4096


def _pairs_by_enumeration(contexts, chunks):
    """Count (query, key) pairs one query at a time: decode token sees its context; chunk token i of a
    chunk after p prefix tokens sits at position p + i and sees positions 0 … p + i."""
    decode = sum(sum(1 for _ in range(c)) for c in contexts)
    prefill = sum(sum(p + i + 1 for i in range(n)) for n, p in chunks)
    return decode, prefill


@pytest.mark.parametrize("model,decode_fpp,prefill_fpp,kv_bytes", [
    (GQA, 4 * 4 * 16, 4 * 4 * 16, 2 * 2 * 16 * 2),  # 4 heads × d 16: QKᵀ 2d + PV 2d per head; K and V of 2 KV heads
    (MLA, 2 * 2 * (4 + 2) + 2 * 2 * 4, 2 * 2 * (3 + 2) + 2 * 2 * 6, (4 + 2) * 2),  # absorbed / expanded, latent 4 + rope 2
])
def test_attention_flops_and_kv_reads_counted_by_hand(model, decode_fpp, prefill_fpp, kv_bytes):
    contexts, chunks = [3, 5], [(4, 2)]
    decode_pairs, prefill_pairs = _pairs_by_enumeration(contexts, chunks)
    assert (decode_pairs, prefill_pairs) == (8, 18)  # 3 + 5; (3 + 4 + 5 + 6)
    batch = tm.Batch.make(contexts + [99], [4, 50], [2, 7], decode_mask=np.array([1, 1, 0], bool),
                          chunk_mask=np.array([1, 0], bool))
    costs = tm.step_costs(batch, jnp.zeros((8,), jnp.int32), tm.GpuKnobs.make(), tm.TimingConfig(model)).moe
    d, p = OPS.index("attention_decode"), OPS.index("attention_prefill")
    assert float(costs.flops[d]) == decode_pairs * decode_fpp
    assert float(costs.flops[p]) == prefill_pairs * prefill_fpp
    assert float(costs.kv_bytes[d]) == (3 + 5) * kv_bytes  # the whole cache after the new token's KV
    assert float(costs.kv_bytes[p]) == (2 + 4) * kv_bytes  # prefix and the chunk itself


# --- a plain-Python reference of one iteration --------------------------------------------------

def _ref_kernel(flops, bytes_, peak_tflops, eff, knobs):
    if flops == 0 and bytes_ == 0:
        return 0.0
    return max(flops / (peak_tflops * eff * 1e6),
               bytes_ / (float(knobs.hbm_bw_gbps) * float(knobs.memory_efficiency) * 1e3)) + float(knobs.launch_us)


def _reference(model, contexts, chunks, emits, rows, knobs, ab=2):
    """Per-op µs of a dense layer, a MoE layer and the LM head, with Python loops over every token."""
    spec = {p: float(v) for p, v in zip(gpus.PRECISIONS, np.asarray(knobs.peak_tflops))}
    ce, ae = float(knobs.compute_efficiency), float(knobs.attention_efficiency)
    tokens = 0
    for _ in contexts:
        tokens += 1
    for n, _ in chunks:
        for _ in range(n):
            tokens += 1
    prec = lambda b: {4.0: "fp32", 1.0: "fp8"}.get(b, "bf16")  # noqa: E731 (the tiny models' widths)

    def linear(lin, t, copies):
        if t == 0:
            return 0.0
        flops = 2 * t * lin.in_features * lin.out_features * copies
        bytes_ = lin.in_features * lin.out_features * copies * lin.bytes_per_param \
            + t * (lin.in_features + lin.out_features) * copies * ab
        return _ref_kernel(flops, bytes_, spec[prec(lin.bytes_per_param)], ce, knobs)

    def layer(kind):
        out = dict.fromkeys(OPS, 0.0)
        if tokens:
            elems = tokens * model.hidden
            norm_bytes = model.norm_params_per_layer * model.bytes_per_param("norms") + 2 * 2 * ab * elems
            one = _ref_kernel(2 * 4 * elems, norm_bytes, spec["fp32"], ce, knobs)
            out["norms"] = one + float(knobs.launch_us)
        for lin in model.linears(kind):
            if lin.op == "experts":
                total = sum(rows)
                distinct = sum(1 for r in rows if r > 0)
                if total:
                    flops = 2 * total * lin.in_features * lin.out_features
                    bytes_ = distinct * lin.in_features * lin.out_features * lin.bytes_per_param \
                        + total * (lin.in_features + lin.out_features) * ab
                    out["experts"] += _ref_kernel(flops, bytes_, spec[prec(lin.bytes_per_param)], ce, knobs)
            else:
                out[lin.op] += linear(lin, tokens, lin.copies)
        kv = model.kv_bytes_per_token_layer
        if contexts:
            pairs = sum(contexts)
            bytes_ = pairs * kv + len(contexts) * (kv + 2 * model.hidden * ab)
            out["attention_decode"] = _ref_kernel(pairs * model.attention_flops_per_pair("decode"), bytes_, spec["bf16"],
                                                  ae, knobs)
        if chunks:
            pairs = sum(p + i + 1 for n, p in chunks for i in range(n))
            bytes_ = sum(p + n for n, p in chunks) * kv + sum(n for n, _ in chunks) * (kv + 2 * model.hidden * ab)
            out["attention_prefill"] = _ref_kernel(pairs * model.attention_flops_per_pair("prefill"), bytes_,
                                                   spec["bf16"], ae, knobs)
        return [out[op] for op in OPS]

    head_tokens = len(contexts) + sum(1 for e in emits if e)
    head = sum(linear(lin, head_tokens, lin.copies) for lin in model.head_linears())
    return layer("dense"), layer("moe"), head


@pytest.mark.parametrize("model", [GQA, MLA], ids=["gqa", "mla"])
def test_vectorised_roofline_equals_a_plain_python_reference(model):
    gen = np.random.default_rng(7)
    knobs = tm.GpuKnobs.make("h100-pcie", compute_efficiency=0.6, attention_efficiency=0.4, memory_efficiency=0.9,
                             launch_us=2.5)
    for _ in range(6):
        dmask = gen.random(6) < 0.7
        cmask = gen.random(3) < 0.6
        emits = gen.random(3) < 0.5
        ctx = gen.integers(1, 5000, 6)
        tok = gen.integers(1, 700, 3)
        pre = gen.integers(0, 9000, 3)
        rows = gen.integers(0, 5, model.routed_experts) * (gen.random(model.routed_experts) < 0.6)
        batch = tm.Batch.make(ctx, tok, pre, decode_mask=dmask, chunk_mask=cmask, chunk_emits=emits)
        got = tm.step_costs(batch, jnp.asarray(rows, jnp.int32), knobs, tm.TimingConfig(model))
        contexts = [int(c) for c, m in zip(ctx, dmask) if m]
        chunks = [(int(n), int(p)) for n, p, m in zip(tok, pre, cmask) if m]
        dense, moe, head = _reference(model, contexts, chunks, [e for e, m in zip(emits, cmask) if m],
                                      [int(r) for r in rows], knobs)
        np.testing.assert_allclose(np.asarray(got.dense.time_us), dense, rtol=2e-5)
        np.testing.assert_allclose(np.asarray(got.moe.time_us), moe, rtol=2e-5)
        assert float(got.lm_head.time_us) == pytest.approx(head, rel=2e-5)


def _case(seed=0, model=GQA):
    gen = np.random.default_rng(seed)
    batch = tm.Batch.make(gen.integers(1, 4096, 32), [512], [gen.integers(0, 8192)],
                          decode_mask=gen.random(32) < 0.8)
    rows = gen.multinomial(int(np.asarray(tm.tokens_of(batch))) * model.top_k,
                           np.full(model.routed_experts, 1 / model.routed_experts), size=model.moe_layers)
    return batch, jnp.asarray(rows, jnp.int32)


def test_layer_totals_are_the_sums_of_their_operators():
    batch, rows = _case()
    knobs, config = tm.GpuKnobs.make(), tm.TimingConfig(GQA)
    times = tm.model_times(batch, rows, knobs, config)
    np.testing.assert_allclose(times.layer_us, np.asarray(times.segment_us).sum(axis=1), rtol=1e-6)
    assert float(times.iteration_us) == pytest.approx(float(np.asarray(times.layer_us).sum() + times.lm_head_us), rel=1e-6)
    moe_rows = iter(np.asarray(rows))
    for layer, kind in enumerate(GQA.layer_kinds):
        step = tm.step_costs(batch, next(moe_rows) if kind == "moe" else rows[0], knobs, config)
        assert float(step.moe_layer_us) == pytest.approx(float(np.asarray(step.moe.time_us).sum()), rel=1e-6)
        assert float(step.dense_layer_us) == pytest.approx(float(np.asarray(step.dense.time_us).sum()), rel=1e-6)
        expected = step.moe.time_us if kind == "moe" else step.dense.time_us
        np.testing.assert_allclose(times.segment_us[layer], expected, rtol=1e-6)
    assert float(times.lm_head_us) == pytest.approx(float(step.lm_head.time_us), rel=1e-6)


def test_more_tokens_never_take_less_time():
    """Growing any part of the batch (a decode token, a context, a chunk, a prefix, expert rows) never
    lowers any operator's time."""
    gen = np.random.default_rng(3)
    knobs, config = tm.GpuKnobs.make(), tm.TimingConfig(MLA)
    fn = _jitted()
    ctx, dmask = np.ones(8, np.int64), np.zeros(8, bool)
    tok, pre, cmask = np.ones(2, np.int64), np.zeros(2, np.int64), np.zeros(2, bool)
    rows = np.zeros((MLA.moe_layers, MLA.routed_experts), np.int64)
    previous = None
    for _ in range(60):
        step = gen.integers(6)
        i = gen.integers(8)
        if step == 0:
            dmask[i] = True
        elif step == 1:
            ctx[i] += gen.integers(1, 3000)
        elif step == 2:
            cmask[i % 2] = True
        elif step == 3:
            tok[i % 2] += gen.integers(1, 300)
        elif step == 4:
            pre[i % 2] += gen.integers(1, 5000)
        else:
            rows[i % MLA.moe_layers, gen.integers(MLA.routed_experts)] += gen.integers(1, 40)
        t = fn(tm.Batch.make(ctx, tok, pre, decode_mask=dmask, chunk_mask=cmask), jnp.asarray(rows, jnp.int32), knobs,
               config)
        now = np.concatenate([np.asarray(t.segment_us).ravel(), [float(t.lm_head_us)]])
        if previous is not None:
            assert np.all(now >= previous * (1 - 1e-6)), step
        previous = now


def test_empty_batch_costs_nothing_and_masked_entries_are_ignored():
    knobs, config = tm.GpuKnobs.make(), tm.TimingConfig(GQA)
    rows = jnp.zeros((GQA.moe_layers, GQA.routed_experts), jnp.int32)
    empty = tm.model_times(tm.Batch.make([7], [9], [3], decode_mask=np.zeros(1, bool), chunk_mask=np.zeros(1, bool)),
                           rows, knobs, config)
    assert float(empty.iteration_us) == 0.0
    a = tm.model_times(tm.Batch.make([100, 200], [64], [10]), rows, knobs, config)
    b = tm.model_times(tm.Batch.make([100, 200, 90000], [64, 4000], [10, 5], decode_mask=np.array([1, 1, 0], bool),
                                     chunk_mask=np.array([1, 0], bool)), rows, knobs, config)
    np.testing.assert_allclose(a.segment_us, b.segment_us, rtol=1e-6)


def _jitted():
    return jax.jit(tm.model_times, static_argnums=3)


def test_jit_equals_eager():
    batch, rows = _case(1)
    knobs, config = tm.GpuKnobs.make("h100-pcie"), tm.TimingConfig(GQA)
    eager = tm.model_times(batch, rows, knobs, config)
    jitted = _jitted()(batch, rows, knobs, config)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_vmap_over_streams_equals_a_loop():
    cases = [_case(s) for s in range(4)]
    batches = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[b for b, _ in cases])
    rows = jnp.stack([r for _, r in cases])
    knobs, config = tm.GpuKnobs.make(), tm.TimingConfig(GQA)
    batched = jax.jit(jax.vmap(tm.model_times, in_axes=(0, 0, None, None)), static_argnums=3)(batches, rows, knobs, config)
    for s, (b, r) in enumerate(cases):
        one = tm.model_times(b, r, knobs, config)
        np.testing.assert_allclose(batched.segment_us[s], one.segment_us, rtol=1e-6)
        assert float(batched.iteration_us[s]) == pytest.approx(float(one.iteration_us), rel=1e-6)


def test_no_recompilation_when_knob_values_or_batch_contents_change():
    fn = jax.jit(tm.model_times, static_argnums=3)
    config = tm.TimingConfig(MLA)
    with compilations("model_times") as compiled:
        for seed, gpu, eff in ((0, "h200", 0.7), (1, "h100-pcie", 0.3), (2, "h100-sxm", 0.9)):
            batch, rows = _case(seed, MLA)
            jax.block_until_ready(fn(batch, rows, tm.GpuKnobs.make(gpu, compute_efficiency=eff, launch_us=seed), config))
    assert len(compiled) == 1, compiled


@pytest.mark.parametrize("make,field,value", [
    (lambda: tm.GpuKnobs.make(compute_efficiency=0.0), "GpuKnobs.compute_efficiency", 0.0),
    (lambda: tm.GpuKnobs.make(memory_efficiency=1.5), "GpuKnobs.memory_efficiency", 1.5),
    (lambda: tm.GpuKnobs.make(attention_efficiency=float("nan")), "GpuKnobs.attention_efficiency", float("nan")),
    (lambda: tm.GpuKnobs.make(launch_us=-1.0), "GpuKnobs.launch_us", -1.0),
    (lambda: tm.GpuKnobs.make(hbm_bw_gbps=0), "GpuKnobs.hbm_bw_gbps", 0),
    (lambda: tm.GpuKnobs.make("a100"), "gpus.preset.name", "a100"),
    (lambda: gpus.preset("h200").replace(hbm_bw_gbps=-5.0), "GpuSpec.hbm_bw_gbps", -5.0),
    (lambda: gpus.preset("h200").replace(peak_tflops_fp8=100.0), "GpuSpec.peak_tflops_fp8", 100.0),
    (lambda: tm.TimingConfig(GQA, activation_bytes=3), "TimingConfig.activation_bytes", 3),
    (lambda: tm.TimingConfig(GQA, attention_precision="fp4"), "TimingConfig.attention_precision", "fp4"),
    (lambda: tm.TimingConfig(object()), "TimingConfig.model", "object"),
    (lambda: tm.Batch.make([5, 0]), "Batch.decode_context[1]", 0),
    (lambda: tm.Batch.make([], [0], [3]), "Batch.chunk_tokens[0]", 0),
    (lambda: tm.Batch.make([], [4], [-2]), "Batch.chunk_prefix[0]", -2),
    (lambda: tm.Batch.make([2.5]), "Batch.decode_context", [2.5]),
])
def test_bad_values_are_refused_naming_the_field(make, field, value):
    with pytest.raises(ConfigError) as err:
        make()
    assert str(err.value).startswith(f"{field} = {value!r}"), str(err.value)


def test_model_times_refuses_rows_of_the_wrong_layer_count():
    batch, rows = _case()
    with pytest.raises(ConfigError, match=r"model_times.rows = \(2, 8\)"):
        tm.model_times(batch, rows[:2], tm.GpuKnobs.make(), tm.TimingConfig(GQA))


def test_precision_follows_the_weight_width():
    assert [tm.precision_of(b) for b in (4, 2, 1, 1 + 4 / 128**2, 0.5)] == ["fp32", "bf16", "fp8", "fp8", "bf16"]
    assert math.isclose(gpus.preset("h100-sxm").peak("fp32"), 67.0)


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_a_fully_routed_iteration_reads_every_weight_of_the_preset_once(name):
    """With every expert routed some rows, the weights the roofline reads over all layers and the LM
    head are the model's weights less the embedding lookup table (unless tied: then it is the head)
    and the final norm — an independent total from hbfjax.workload.models."""
    spec = models.preset(name)
    if spec.mtp_layers:
        spec = spec.replace(mtp_layers=0)  # MTP modules are checkpoint weights no decode step reads
    experts = max(spec.routed_experts, 1)
    step = tm.step_costs(tm.Batch.make([100] * 4, [64], [0]), jnp.ones((experts,), jnp.int32), tm.GpuKnobs.make(),
                         tm.TimingConfig(spec))
    read = (float(np.asarray(step.dense.weight_bytes, np.float64).sum()) * spec.dense_layers
            + float(np.asarray(step.moe.weight_bytes, np.float64).sum()) * spec.moe_layers
            + float(step.lm_head.weight_bytes))
    embedding = 0.0 if spec.tied_embeddings else spec.vocab * spec.hidden * spec.bytes_per_param("embedding")
    expected = spec.weight_bytes - embedding - spec.hidden * spec.bytes_per_param("norms")
    assert read == pytest.approx(expected, rel=1e-6)
    assert np.isfinite(float(step.moe_layer_us + step.dense_layer_us + step.lm_head.time_us))


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-235b-a22b", "deepseek-v3"])
def test_model_times_of_a_preset_is_its_layers_by_kind_plus_the_head(name):
    """Dense-only, MoE-only and mixed presets: with the same rows in every MoE layer the iteration is
    dense_layers × one dense layer + moe_layers × one MoE layer + the LM head."""
    spec = models.preset(name)
    batch = tm.Batch.make([300] * 8, [256], [1000])
    experts = max(spec.routed_experts, 1)
    one = jnp.asarray(np.arange(experts) % 3, jnp.int32)
    knobs, config = tm.GpuKnobs.make("h100-pcie"), tm.TimingConfig(spec)
    step = tm.step_costs(batch, one, knobs, config)
    times = tm.model_times(batch, jnp.tile(one, (spec.moe_layers, 1)), knobs, config)
    expected = spec.dense_layers * float(step.dense_layer_us) + spec.moe_layers * float(step.moe_layer_us) \
        + float(step.lm_head.time_us)
    assert float(times.iteration_us) == pytest.approx(expected, rel=1e-5)
    assert times.segment_us.shape == (spec.layers, len(OPS))


@pytest.mark.slow  # a statistical or eager-mode check of 20-40 worker-seconds: make test-slow
def test_even_rows_cost_what_the_rows_they_stand_for_cost():
    """timing.EvenRows (count routing's compact form) against the explicit rows count_routing builds, on the
    roofline and on a measured table: every field equal."""
    from hbfjax.workload import routing
    from test_profile_table import _gqa_table

    rc = routing.RoutingConfig(routed_experts=GQA.routed_experts, top_k=GQA.top_k, shared_experts=GQA.shared_experts,
                               max_tokens=64)
    tokens = jnp.asarray([0, 1, 3, 7, 64, 64], jnp.int32)
    distinct = jnp.asarray([0, 1, 2, 5, GQA.routed_experts, 3], jnp.int32)
    explicit = jax.vmap(lambda d, t: routing.count_routing(d[None], t, rc).rows[0])(distinct, tokens)  # int32[6, E]
    even = tm.EvenRows(distinct=distinct, total=tokens * GQA.top_k)
    knobs, config = tm.GpuKnobs.make(), tm.TimingConfig(model=GQA)
    for table in (None, _gqa_table(tokens=(1, 2, 64, 1024)).curves()):
        a, miss_a = tm.expert_costs(explicit, knobs, config, table)
        b, miss_b = tm.expert_costs(even, knobs, config, table)
        for x, y in zip(a, b):
            np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(miss_a), np.asarray(miss_b))
