"""The CPU-offloading systems served end to end (DASH §VI-C; the engine's ``cpu-offload`` timing,
``hbfjax.serve.cpu_offload``): one Qwen3 pass by hand, the Hybrid oracle against both pure systems on
every draw, the resident-expert rule and its hypergeometric draw, a fixed batch equal to its passes,
one compilation for every knob value, and DASH's routing draws."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _compiles import compilations
from _tiny_models import GQA
from test_serve_system import CONFIG, _hand_batches
from hbfjax import batch as hb
from hbfjax import clock
from hbfjax.memory import organisations as orgs
from hbfjax.serve import cpu_offload as osys
from hbfjax.serve import engine, layer_time
from hbfjax.serve.pass_routing import pass_routing
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.validate import ConfigError
from hbfjax.workload import models, timing
from hbfjax.workload import requests as rq

QWEN3 = models.preset("qwen3-235b-a22b")
B, PROMPT, OUTPUT, CHUNK = 2, 8, 3, 4  # test_serve_system's fixed batch (CONFIG, _hand_batches)
# Spec numbers of the hand computation (hbfjax.memory.cpus, hbfjax.workload.gpus state their sources)
PCIE_GBPS = 64.0 * 0.87
CORE_BW_GBPS = 25.6
SOCKET_GBPS = 8 * 4800 * 8 * 0.716 / 1e3
CORE_TFLOPS = 1024 * 2.0 * 0.285 / 1e3
HBM_GBPS = 2000.0 * 0.8
GEMM_TFLOPS = 1513 / 2 * 0.7
LAUNCH_US = 4.0


CPU_CONFIG = dataclasses.replace(CONFIG, parts=(), timing_kind="cpu-offload")  # the CPU systems on CONFIG's batch


def _qwen3_config(slots: int) -> engine.ServeConfig:
    return engine.ServeConfig(model=QWEN3, batcher=BatcherConfig(slots=slots),
                              requests=rq.RequestsConfig(requests=slots, arrivals="batch"), max_pass_tokens=64,
                              parts=(), timing_kind="cpu-offload")


def _knobs(model, system_name="hybrid", batcher=None, requests=None, **kw):
    """ServeKnobs of a CPU-offloading system (``cpu_offload.CpuKnobs``) on the H100 PCIe."""
    cpu = osys.CpuKnobs.make(model, "h100-pcie", kw.pop("cores", 32), system_name, **kw)
    return engine.ServeKnobs.make(None, timing.GpuKnobs.make("h100-pcie"), batcher or BatcherKnobs.make(),
                                  requests or rq.RequestKnobs.make(), cpu=cpu)


def _cdf(model, knobs):
    """The knobs' law of resident experts among the needed ones."""
    return jnp.asarray(osys.hypergeometric_cdf(model.routed_experts, int(knobs.cpu.resident_experts)))


_pass = jax.jit(osys.pass_times, static_argnums=5)


def test_one_qwen3_decode_token_by_hand():
    """One decode token needs exactly its top-8 experts, one row each; none resident: weight streaming
    moves 8 × 37.7 MB over PCIe then the GPU reads each expert from HBM; CPU compute runs 8 one-row jobs on
    8 of 32 cores, each bound by its core's own DRAM bandwidth."""
    knobs = _knobs(QWEN3, resident=0)
    out = _pass((jnp.uint32(5), jnp.int32(0)), timing.Batch.make([1025]), jnp.int32(0), knobs, _cdf(QWEN3, knobs),
                _qwen3_config(1))
    expert_bytes = 3 * 4096 * 1536 * 2
    gpu_one = sum((i * o * 2 + (i + o) * 2) / (HBM_GBPS * 1e3) for i, o in ((4096, 3072), (1536, 4096)))
    assert 2 * 4096 * 3072 / (GEMM_TFLOPS * 1e6) < gpu_one  # one row: memory-bound, 23.6 µs
    stream = 8 * expert_bytes / (PCIE_GBPS * 1e3) + 8 * gpu_one  # 5,424 + 189 µs
    job = max(2 * 3 * 4096 * 1536 / (CORE_TFLOPS * 1e6), expert_bytes / (CORE_BW_GBPS * 1e3))  # 1,474.6 µs
    activations_in, rows_back = 4096 * 2 / (PCIE_GBPS * 1e3), 8 * 4096 * 2 / (PCIE_GBPS * 1e3)
    cpu = activations_in + max(job, 8 * expert_bytes / (SOCKET_GBPS * 1e3)) + rows_back
    np.testing.assert_allclose(np.asarray(out.experts.stream_us), stream, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out.experts.cpu_compute_us), cpu, rtol=1e-5)
    assert out.expert_launch_us == pytest.approx(2 * LAUNCH_US)  # gate_up and down grouped kernels
    no_experts = jax.jit(timing.model_times, static_argnums=3)(
        timing.Batch.make([1025]), jnp.zeros((94, 128), jnp.int32), knobs.gpu, timing.TimingConfig(model=QWEN3))
    assert float(out.non_expert_us) == pytest.approx(float(no_experts.iteration_us), rel=1e-6)
    oracle = np.asarray(out.experts.oracle_us)
    assert float(out.iteration_us) == pytest.approx(float(no_experts.iteration_us) + 94 * 2 * LAUNCH_US + oracle.sum(),
                                                    rel=1e-5)


@pytest.mark.parametrize("draw_kind", ["counts", "tokens"])
def test_the_hybrid_oracle_is_never_slower_than_either_pure_system(draw_kind):
    config = engine.ServeConfig(model=QWEN3, batcher=BatcherConfig(slots=64), requests=rq.RequestsConfig(requests=64),
                                max_pass_tokens=64, routing_draw=draw_kind, parts=(), timing_kind="cpu-offload")
    knobs = _knobs(QWEN3, cores=8, resident=16)
    cdf = _cdf(QWEN3, knobs)

    def one(tokens, draw):
        batch = timing.Batch(jnp.full(64, 1025, jnp.int32), jnp.arange(64) < tokens, *(jnp.zeros(1, jnp.int32),) * 2,
                             jnp.zeros(1, bool), jnp.zeros(1, bool))
        return osys.pass_times((jnp.uint32(1), jnp.int32(0)), batch, draw, knobs, cdf, config)

    tokens = jnp.repeat(jnp.asarray([1, 3, 16, 64]), 4)
    out = jax.jit(jax.vmap(one))(tokens, jnp.arange(tokens.size, dtype=jnp.int32))
    e = out.experts
    assert np.all(e.oracle_us <= np.minimum(e.stream_us, e.cpu_compute_us) * (1 + 1e-6))
    assert np.any(e.oracle_us < np.minimum(e.stream_us, e.cpu_compute_us) * 0.99)  # a split helps somewhere
    assert np.all(e.hybrid_us >= e.oracle_us * (1 - 1e-6))


def test_resident_experts_follow_the_stated_hbm_rule():
    """0.9 × 80 GB − 15.99 GB non-expert weights − KV − 128 × 37.7 MB staging, in whole experts × 94 layers."""
    one = 3 * 4096 * 1536 * 2
    for kv_tokens in (1152, 64 * 1152):
        free = 0.9 * 80e9 - QWEN3.non_expert_weight_bytes - kv_tokens * 94 * 2048 - 128 * one
        assert osys.resident_experts(QWEN3, "h100-pcie", kv_tokens) == math.floor(free / (94 * one))
    assert osys.resident_experts(QWEN3, "h100-pcie", 1152) == 14
    with pytest.raises(ConfigError, match=r"resident_experts.kv_tokens = 400000: non-expert weights"):
        osys.resident_experts(QWEN3, "h100-pcie", 400_000)  # 77 GB of KV
    with pytest.raises(ConfigError, match=r"CpuKnobs.system = 'dash'"):
        _knobs(QWEN3, "dash")
    with pytest.raises(ConfigError, match=r"CpuKnobs.resident = 129"):
        _knobs(QWEN3, resident=129)
    with pytest.raises(ConfigError, match=r"CpuKnobs.kv_tokens = None: must be given"):
        osys.CpuKnobs.make(QWEN3, "h100-pcie", 32, "hybrid")
    assert int(osys.CpuKnobs.make(QWEN3, kv_tokens=1152).resident_experts) == 14


def test_resident_count_among_needed_experts_is_hypergeometric():
    """The inverse CDF on a fine grid of u gives each count the hypergeometric mass, to the grid step."""
    e, n, grid = 16, 5, 20_000
    u = (jnp.arange(grid, dtype=jnp.float32) + 0.5) / grid
    cdf = jnp.asarray(osys.hypergeometric_cdf(e, n))
    for d in (0, 3, 9, 14, 16):
        h = np.asarray(osys.resident_needed(u, cdf, jnp.full(grid, d)))
        law = np.array([math.comb(n, k) * math.comb(e - n, d - k) / math.comb(e, d) if 0 <= d - k <= e - n else 0.0
                        for k in range(n + 1)])
        np.testing.assert_allclose(np.bincount(h, minlength=n + 1) / grid, law, atol=2.0 / grid)


def test_a_fixed_batch_is_its_passes_and_every_knob_value_shares_one_compilation():
    reqs = rq.RequestKnobs.make(batch=B, prompt=rq.LengthKnobs.make(PROMPT), output=rq.LengthKnobs.make(OUTPUT))
    common = dict(batcher=BatcherKnobs.make(chunk_tokens=CHUNK), requests=reqs)
    first = [_knobs(GQA, s, resident=2, **common) for s in osys.SYSTEMS]
    second = [_knobs(GQA, s, resident=3, cores=2, cpu_experts=2, **common) for s in osys.SYSTEMS]
    # the laws of both resident counts are the inputs of both calls (looked up by value inside the run)
    inputs = engine.ServeInputs(resident_laws=osys.resident_laws(GQA.routed_experts, [2, 3]))
    with compilations("simulate") as compiled:
        a = hb.run(engine.simulate, 1, 7, hb.stack_knobs(first), CPU_CONFIG, knob_axis=True, inputs=inputs)
        b = hb.run(engine.simulate, 1, 7, hb.stack_knobs(second), CPU_CONFIG, knob_axis=True, inputs=inputs)
    assert len(compiled) == 1
    assert not np.any(a.missing_inputs) and not np.any(b.missing_inputs)
    finish = lambda o: np.asarray(clock.to_us(o.finish))[0]  # noqa: E731  [systems, requests] of stream 0
    first_token = np.asarray(clock.to_us(a.first_token))[0]
    words = (jnp.uint32(7), jnp.int32(0))
    for k, knobs in enumerate(first):  # two prefill passes, then OUTPUT − 1 decode passes (mixed: pass 0 of each)
        us = [float(_pass(words, p, jnp.int32(2 * i), knobs, _cdf(GQA, knobs), CPU_CONFIG).iteration_us)
              for i, p in enumerate(_hand_batches())]
        np.testing.assert_allclose(first_token[k], us[0] + us[1], rtol=1e-6)
        np.testing.assert_allclose(finish(a)[k], sum(us), rtol=1e-6)
    assert np.all(np.asarray(a.iterations) == 4) and not np.any(a.overflow)
    assert np.all(finish(a)[2] <= np.minimum(finish(a)[0], finish(a)[1]) * (1 + 1e-6))  # oracle ≤ both
    assert not np.array_equal(finish(a), finish(b))
    # host traffic (energy): every system reads each needed non-resident expert from DRAM once per pass
    dram, cpu_flops = np.asarray(a.totals.host_dram_bytes)[0], np.asarray(a.totals.cpu_flops)[0]
    np.testing.assert_allclose(dram, dram[0], rtol=1e-6)
    assert dram[0] > 0 and cpu_flops[osys.SYSTEMS.index("cpu-stream")] == 0.0
    assert cpu_flops[osys.SYSTEMS.index("cpu-compute")] > 0
    pcie = np.asarray(a.totals.pcie_bytes)[0]
    assert pcie[osys.SYSTEMS.index("cpu-compute")] < pcie[osys.SYSTEMS.index("cpu-stream")]


@pytest.mark.parametrize("draw_kind", ["counts", "tokens"])
def test_dash_and_the_offload_systems_see_the_same_routing_draws(draw_kind):
    """DASH's per-layer expert bytes over Direct + Relay are its needed experts × one expert's bytes."""
    config = dataclasses.replace(CONFIG, routing_draw=draw_kind)
    batch = _hand_batches()[2]  # two decode tokens, top-2 of 8 experts: 2-4 needed per layer
    words, draws = (jnp.uint32(9), jnp.int32(3)), jnp.arange(8, dtype=jnp.int32)
    dash = engine.ServeKnobs.make(orgs.dash(), timing.GpuKnobs.make("h100-pcie"), BatcherKnobs.make(),
                                  rq.RequestKnobs.make(batch=B))
    delivered = jax.jit(jax.vmap(lambda d: engine.pass_times(words, batch, d, dash, config)))(draws)
    moe = [i for i, k in enumerate(GQA.layer_kinds) if k == "moe"]
    needed = (np.asarray(delivered.expert_direct_bytes) + np.asarray(delivered.expert_relay_bytes))[:, moe]
    knobs = _knobs(GQA, resident=0)
    r = jax.jit(jax.vmap(lambda d: pass_routing(words, batch, d, knobs.routing, config, compact=False)))(draws)
    distinct = np.asarray(r.distinct_experts)  # [draws, L_moe]
    np.testing.assert_allclose(needed / layer_time.expert_bytes(GQA), distinct, rtol=1e-6)
    assert len(np.unique(distinct)) > 1  # the draws differ: the equality is not between constants
