"""CPU-offloading baselines (DASH §VI-C): hand-computed latencies, the core cap and job limit, the
Hybrid oracle against explicit enumerations, monotonicity, and refused values."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax.memory import cpus
from hbfjax.memory import offload as off
from hbfjax.validate import ConfigError
from hbfjax.workload.models import preset as model_preset

QWEN3 = model_preset("qwen3-235b-a22b")
EXPERT_LINEARS = [l for l in QWEN3.linears("moe") if l.op == "experts"]
EXPERT_BYTES = sum(l.in_features * l.out_features * l.bytes_per_param for l in EXPERT_LINEARS)  # one expert
FLOPS_PER_ROW = sum(2 * l.in_features * l.out_features for l in EXPERT_LINEARS)
ACT_BYTES = QWEN3.hidden * 2  # one BF16 token activation
E = QWEN3.routed_experts

# Spec numbers the hand computations use (cpus.py states their sources).
PCIE_GBPS = 64.0 * 0.87
CORE_TFLOPS = 1024 * 2.0e9 * 0.285 / 1e12
CORE_BW_GBPS = 25.6
SOCKET_BW_GBPS = 8 * 4800e6 * 8 * 0.716 / 1e9


def layer(tokens, batch_tokens=None, **kw):
    return off.ExpertLayer.make(np.asarray(tokens), expert_bytes=EXPERT_BYTES, flops_per_row=FLOPS_PER_ROW,
                                activation_bytes=ACT_BYTES, batch_tokens=batch_tokens, **kw)


def rows(*counts, experts=E):
    t = np.zeros(experts, np.int64)
    t[:len(counts)] = counts
    return t


def test_qwen3_expert_shape_is_what_the_hand_numbers_assume():
    assert EXPERT_BYTES == 3 * 4096 * 1536 * 2 == 37_748_736
    assert FLOPS_PER_ROW == 2 * 3 * 4096 * 1536
    assert cpus.pcie_preset("pcie5-x16").raw_gbps == 64.0
    cpu = cpus.cpu_preset("xeon-8452y")
    assert cpu.memory_peak_gbps == pytest.approx(307.2)
    assert cpu.core_peak_tflops == pytest.approx(2.048)
    assert {"amx_efficiency", "core_bw_gbps", "amx_ghz"} <= set(cpu.estimated_fields)
    assert "KTransformers" in cpu.source("memory_efficiency")


def test_one_expert_streamed_over_pcie_then_computed_on_the_gpu():
    gpu = np.zeros(E, np.float32)
    gpu[0] = 12.5
    t = off.weight_stream_us(layer(rows(3), gpu_us=gpu), off.OffloadKnobs.make())
    assert float(t) == pytest.approx(EXPERT_BYTES / (PCIE_GBPS * 1e3) + 12.5, rel=1e-6)  # 677.96 + 12.5 µs
    resident = np.zeros(E, bool)
    resident[0] = True  # already in HBM: nothing crosses PCIe
    assert float(off.weight_stream_us(layer(rows(3), gpu_us=gpu, gpu_resident=resident),
                                      off.OffloadKnobs.make())) == pytest.approx(12.5)


def _pcie(nbytes):
    return nbytes / (PCIE_GBPS * 1e3)


@pytest.mark.parametrize("tokens,bound", [(1, "memory"), (64, "compute")])
def test_one_cpu_job_bound_by_memory_or_by_compute(tokens, bound):
    knobs = off.OffloadKnobs.make(cores=1)
    compute = tokens * FLOPS_PER_ROW / (CORE_TFLOPS * 1e6)  # 1 row: 64.7 µs; 64 rows: 4,139 µs
    memory = EXPERT_BYTES / (CORE_BW_GBPS * 1e3)  # one core streams 25.6 GB/s: 1,474.6 µs
    assert (memory > compute) == (bound == "memory")
    expected = _pcie(tokens * ACT_BYTES) + max(compute, memory) + _pcie(tokens * ACT_BYTES)
    got = off.cpu_compute_us(layer(rows(tokens), batch_tokens=tokens), knobs)
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_b1_eight_jobs_saturate_at_eight_cores():
    """DASH Fig. 10(a): B1's 8 expert jobs, one per core, in ceil(8 / c) waves; more cores add nothing."""
    lay = layer(rows(*[1] * 8), batch_tokens=1)
    job = EXPERT_BYTES / (CORE_BW_GBPS * 1e3)  # 8 × 25.6 GB/s stays under the socket's 220 GB/s
    per_cores = {}
    for c in range(1, 17):
        t = float(off.cpu_compute_us(lay, off.OffloadKnobs.make(cores=c)))
        assert t == pytest.approx(_pcie(ACT_BYTES) + math.ceil(8 / c) * job + _pcie(8 * ACT_BYTES), rel=1e-5)
        per_cores[c] = t
    assert per_cores[1] > per_cores[2] > per_cores[3] > per_cores[4] > per_cores[8]
    assert per_cores[4] == per_cores[7] and all(per_cores[c] == per_cores[8] for c in range(8, 17))


def test_many_jobs_on_many_cores_share_the_socket_bandwidth():
    """64 one-row jobs on 16 cores: 4 waves at 25.6 GB/s per core would take 5.9 ms, but 16 × 25.6 GB/s
    exceeds the socket's 220 GB/s, so all 64 experts' weights over 220 GB/s (11.0 ms) set the time."""
    lay = layer(rows(*[1] * 64), batch_tokens=8)
    waves = 4 * EXPERT_BYTES / (CORE_BW_GBPS * 1e3)
    socket = 64 * EXPERT_BYTES / (SOCKET_BW_GBPS * 1e3)
    assert socket > waves
    t = float(off.cpu_compute_us(lay, off.OffloadKnobs.make(cores=16)))
    assert t == pytest.approx(_pcie(8 * ACT_BYTES) + socket + _pcie(64 * ACT_BYTES), rel=1e-5)
    few = float(off.cpu_compute_us(lay, off.OffloadKnobs.make(cores=4)))  # 16 waves: per-core bound
    assert few == pytest.approx(_pcie(8 * ACT_BYTES) + 16 * EXPERT_BYTES / (CORE_BW_GBPS * 1e3)
                                + _pcie(64 * ACT_BYTES), rel=1e-5)


def test_unequal_jobs_run_longest_first_in_waves():
    """Jobs of 200, 150, 100, 50 rows on 3 cores: waves {200, 150, 100} and {50}; a CPU made
    compute-bound (huge bandwidth) so each job costs rows × FLOPs / rate."""
    knobs = off.OffloadKnobs.make(cores=3, core_bw_gbps=1e9, pcie_efficiency=1.0)
    knobs = dataclasses.replace(knobs, memory_bw_gbps=jnp.float32(1e9))  # no socket limit
    lay = layer(rows(50, 200, 100, 150), batch_tokens=0)
    per_row = FLOPS_PER_ROW / (CORE_TFLOPS * 1e6)
    expected = (200 + 50) * per_row + 500 * ACT_BYTES / (64.0 * 1e3)
    assert float(off.cpu_compute_us(lay, knobs)) == pytest.approx(expected, rel=1e-5)


def _random_layer(seed, experts=12, jobs=7, resident_count=2):
    r = np.random.default_rng(seed)
    tokens = np.zeros(experts, np.int64)
    picked = r.choice(experts, jobs + resident_count, replace=False)
    tokens[picked] = r.integers(1, 300, jobs + resident_count)
    resident = np.zeros(experts, bool)
    resident[picked[:resident_count]] = True
    gpu = np.where(tokens > 0, r.uniform(5, 60, experts), 0).astype(np.float32)
    return tokens, resident, gpu


@pytest.mark.parametrize("seed,cores", [(0, 1), (1, 3), (2, 5), (3, 16)])
def test_oracle_is_the_minimum_over_an_explicit_enumeration_of_splits(seed, cores):
    tokens, resident, gpu = _random_layer(seed)
    lay = layer(tokens, batch_tokens=int(tokens.sum()) // 4, gpu_resident=resident, gpu_us=gpu)
    knobs = off.OffloadKnobs.make(cores=cores)
    direct = [float(off.hybrid_us(lay, knobs, k)) for k in range(tokens.size + 1)]  # one split at a time
    np.testing.assert_allclose(np.asarray(off.split_table_us(lay, knobs)), direct, rtol=1e-5)
    best_us, best_k = off.oracle(lay, knobs)
    assert float(best_us) == pytest.approx(min(direct), rel=1e-5)
    assert direct[int(best_k)] == pytest.approx(min(direct), rel=1e-5)
    assert float(off.hybrid_us(lay, knobs, 0)) == pytest.approx(float(off.weight_stream_us(lay, knobs)))
    assert float(off.hybrid_us(lay, knobs, 99)) == pytest.approx(float(off.cpu_compute_us(lay, knobs)))


@pytest.mark.parametrize("seed,cores", [(4, 2), (5, 4)])
def test_with_equal_gpu_times_the_split_family_holds_the_best_of_all_subsets(seed, cores):
    """Fewest-tokens-first is optimal for every k when the GPU costs each expert the same: the oracle
    equals the minimum over all 2^J CPU/GPU assignments of the J host-resident experts."""
    tokens, resident, _ = _random_layer(seed, experts=10, jobs=7)
    gpu = np.where(tokens > 0, 20.0, 0.0).astype(np.float32)
    lay = layer(tokens, batch_tokens=50, gpu_resident=resident, gpu_us=gpu)
    knobs = off.OffloadKnobs.make(cores=cores)
    movable = np.flatnonzero((tokens > 0) & ~resident)
    best = math.inf
    for mask in itertools.product([False, True], repeat=movable.size):
        on_cpu = np.zeros(tokens.size, bool)
        on_cpu[movable[list(mask)]] = True
        best = min(best, float(off.assignment_us(lay, jnp.asarray(on_cpu), knobs)))
    assert float(off.oracle(lay, knobs)[0]) == pytest.approx(best, rel=1e-5)


def test_monotone_in_cores_and_in_work():
    tokens, resident, gpu = _random_layer(6, experts=16, jobs=12)
    lay = layer(tokens, batch_tokens=40, gpu_resident=resident, gpu_us=gpu)
    previous = None
    for c in range(1, 37):
        t = off.layer_times(lay, off.OffloadKnobs.make(cores=c))
        assert float(t.oracle_us) <= min(float(t.stream_us), float(t.cpu_compute_us)) * (1 + 1e-6)
        if previous is not None:  # more cores never slow the CPU down
            assert float(t.cpu_compute_us) <= float(previous.cpu_compute_us) * (1 + 1e-6)
            assert float(t.oracle_us) <= float(previous.oracle_us) * (1 + 1e-6)
        previous = t
    many = layer(rows(*[1] * 82), batch_tokens=16)  # 82 equal jobs: partial last waves at 12 and 16 cores
    times = [float(off.cpu_compute_us(many, off.OffloadKnobs.make(cores=c))) for c in range(1, 37)]
    assert all(b <= a * (1 + 1e-6) for a, b in zip(times, times[1:]))
    knobs = off.OffloadKnobs.make(cores=4)
    more = tokens.copy()
    more[np.argmax(tokens)] += 100  # more rows on one expert: no scheme gets faster
    heavier = layer(more, batch_tokens=40, gpu_resident=resident, gpu_us=gpu)
    a, b = off.layer_times(lay, knobs), off.layer_times(heavier, knobs)
    for name in ("stream_us", "cpu_compute_us", "oracle_us"):
        assert float(getattr(b, name)) >= float(getattr(a, name)) * (1 - 1e-6)
    extra = tokens.copy()
    extra[np.flatnonzero(tokens == 0)[0]] = 1  # one more needed expert: streaming moves one more
    assert float(off.weight_stream_us(layer(extra, batch_tokens=40, gpu_resident=resident, gpu_us=gpu), knobs)) \
        == pytest.approx(float(off.weight_stream_us(lay, knobs)) + EXPERT_BYTES / (PCIE_GBPS * 1e3), rel=1e-5)


def test_knob_axis_of_cores_matches_one_at_a_time_under_jit():
    tokens, resident, gpu = _random_layer(7)
    lay = layer(tokens, batch_tokens=30, gpu_resident=resident, gpu_us=gpu)
    knobs = [off.OffloadKnobs.make(cores=c, cpu_experts=c % 5) for c in (1, 2, 8, 32)]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *knobs)
    swept = jax.jit(jax.vmap(off.layer_times, in_axes=(None, 0)))(lay, stacked)
    for i, k in enumerate(knobs):
        one = off.layer_times(lay, k)
        for name in off.LayerTimes._fields:
            assert float(getattr(swept, name)[i]) == pytest.approx(float(getattr(one, name)), rel=1e-6)


def test_token_time_adds_the_same_non_expert_time_to_every_scheme():
    assert float(off.token_us(1000.0, jnp.asarray([1.0, 2.5, 3.0]))) == pytest.approx(1006.5)


@pytest.mark.parametrize("make,message", [
    (lambda: off.OffloadKnobs.make(cores=0), "OffloadKnobs.cores = 0: must be in [1, 36]"),
    (lambda: off.OffloadKnobs.make(cores=37), "OffloadKnobs.cores = 37: must be in [1, 36]"),
    (lambda: off.OffloadKnobs.make(cores=2.5), "OffloadKnobs.cores = 2.5: must be an integer"),
    (lambda: off.OffloadKnobs.make(cpu_experts=-1), "OffloadKnobs.cpu_experts = -1: must be in [0, "),
    (lambda: off.OffloadKnobs.make(amx_efficiency=1.5), "CpuSpec.amx_efficiency = 1.5: must be in (0, 1]"),
    (lambda: off.OffloadKnobs.make(pcie_efficiency=0.0), "PcieSpec.efficiency = 0.0: must be in (0, 1]"),
    (lambda: off.OffloadKnobs.make(core_bw_gbps=float("nan")), "CpuSpec.core_bw_gbps = nan: must be finite"),
    (lambda: off.OffloadKnobs.make(cpu="epyc"), "cpus.cpu_preset.name = 'epyc': must be one of ('xeon-8452y',)"),
    (lambda: cpus.cpu_preset("xeon-8452y").replace(turbo_ghz=1.5), "CpuSpec.turbo_ghz = 1.5: must be >= base_ghz"),
    (lambda: cpus.cpu_preset("xeon-8452y").replace(cores=0), "CpuSpec.cores = 0: must be in [1, "),
    (lambda: cpus.pcie_preset("pcie5-x16").replace(lanes=0), "PcieSpec.lanes = 0: must be in [1, "),
    (lambda: layer(rows(-1)), "ExpertLayer.tokens"),
    (lambda: layer(rows(1), gpu_resident=np.zeros(3, bool)), "ExpertLayer.gpu_resident = (3,): must have shape"),
    (lambda: off.ExpertLayer.make(rows(1), expert_bytes=0, flops_per_row=1, activation_bytes=1),
     "ExpertLayer.expert_bytes = 0: must be > 0"),
])
def test_bad_values_are_refused_with_field_value_and_rule(make, message):
    with pytest.raises(ConfigError) as err:
        make()
    assert message in str(err.value)


def test_a_sweep_over_cores_and_splits_compiles_once():
    tokens, resident, gpu = _random_layer(8)
    lay = layer(tokens, batch_tokens=30, gpu_resident=resident, gpu_us=gpu)
    times = jax.jit(off.layer_times)
    with compilations("layer_times") as compiled:
        for c, k in ((1, 0), (7, 3), (36, 12)):
            jax.block_until_ready(times(lay, off.OffloadKnobs.make(cores=c, cpu_experts=k)))
    assert len(compiled) == 1


def test_split_traffic_of_a_hand_traced_layer():
    """Experts 0-3 with 3, 0, 5, 2 rows, expert 2 resident, expert 0 on the CPU: expert 3 is streamed
    (DRAM → PCIe → HBM, then read), expert 2 read from HBM, expert 0 read from DRAM by the CPU; the batch's
    7 tokens cross to the CPU and its 3 rows come back."""
    resident = np.zeros(E, bool)
    resident[2] = True
    l = layer(rows(3, 0, 5, 2), batch_tokens=7, gpu_resident=resident)
    on_cpu = np.zeros(E, bool)
    on_cpu[0] = True
    t = off.split_traffic(l, jnp.asarray(on_cpu))
    assert float(t.pcie_bytes) == pytest.approx(EXPERT_BYTES + (7 + 3) * ACT_BYTES, rel=1e-6)
    assert float(t.host_dram_bytes) == pytest.approx(2 * EXPERT_BYTES, rel=1e-6)
    assert float(t.gpu_hbm_bytes) == pytest.approx(3 * EXPERT_BYTES, rel=1e-6)  # read 2 and 3, write 3
    assert float(t.cpu_flops) == pytest.approx(3 * FLOPS_PER_ROW, rel=1e-6)
    none = off.split_traffic(l, jnp.zeros(E, bool))  # weight streaming: no activation crosses
    assert float(none.pcie_bytes) == pytest.approx(2 * EXPERT_BYTES, rel=1e-6) and float(none.cpu_flops) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_traffic_times_the_pcie_rate_is_the_streaming_time_and_dram_is_split_invariant(seed):
    """Weight streaming's time minus its GPU compute is its PCIe bytes over the link; every split reads each
    needed non-resident expert from DRAM exactly once (streamed or computed)."""
    tokens, resident, gpu = _random_layer(seed)
    l = layer(tokens, batch_tokens=int(tokens.sum()) // 4, gpu_resident=resident, gpu_us=gpu)
    knobs = off.OffloadKnobs.make(cores=4)
    gpu_us = float(jnp.sum(jnp.where(l.tokens > 0, l.gpu_us, 0.0)))
    stream = off.split_traffic(l, jnp.zeros_like(l.gpu_resident))
    assert float(off.weight_stream_us(l, knobs)) - gpu_us == pytest.approx(_pcie(float(stream.pcie_bytes)), rel=1e-5)
    candidates = int(jnp.sum((l.tokens > 0) & ~l.gpu_resident))
    for k in range(candidates + 1):
        t = off.split_traffic(l, off.split_on_cpu(l, k))
        assert float(t.host_dram_bytes) == pytest.approx(candidates * EXPERT_BYTES, rel=1e-6)
