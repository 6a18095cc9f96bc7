"""Tensor parallelism of one stream (``hbfjax.workload.tensor_parallel``; HBFlex §6.1: DeepSeek-V4-Pro at T = 2):
the per-GPU model against hand counts of its split and replicated parts, the all-reduce against the ring
formula by hand, the all-reduces on each layer's critical path, T = 1 unchanged, bad T refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax.memory import hbf_packages, organisations as orgs
from hbfjax.serve import kv_tiers, layer_time as lt, systems
from hbfjax.validate import ConfigError
from hbfjax.workload import models, tensor_parallel, timing

V4 = models.preset("deepseek-v4-pro")
H200 = timing.GpuKnobs.make("h200")
_LT = jax.jit(lt.layer_times, static_argnums=6)


def _v4_replicated_bytes() -> float:
    """DeepSeek-V4-Pro's weights every GPU holds whole, counted from its config (all INT8, 1 B a parameter):
    per layer (61 + the MTP module's) q_a (h × 1536), the one KV head's projection (h × 512), the router
    (h × 384) and two norms (2h); the embedding and LM head (2 × vocab × h) and the final norm (h); the MTP
    module's own projection (2h × h), three norms (3h), embedding and head copies (2 × vocab × h)."""
    h, vocab = 7168, 129280
    layer = h * 1536 + h * 512 + h * 384 + 2 * h
    return float((61 + 1) * layer + 2 * vocab * h + h + 2 * h * h + 3 * h + 2 * vocab * h)


def test_v4_pro_per_gpu_weights_halve_the_split_part_and_keep_the_replicated_part():
    one, two = V4, V4.with_tensor_parallel(2)
    replicated = _v4_replicated_bytes()
    split = one.weight_bytes - replicated
    assert two.weight_bytes == pytest.approx(replicated + split / 2, rel=1e-12)
    assert two.expert_weight_bytes == one.expert_weight_bytes / 2  # every routed expert's columns split
    assert 0.49 < two.weight_bytes / one.weight_bytes < 0.51  # the replicated part is ~1 % (review §5: "≈0.8 TB")


def test_the_kv_cache_is_replicated_for_latent_and_shared_heads_and_split_for_gqa():
    v3, qwen = models.preset("deepseek-v3"), models.preset("qwen3-235b-a22b")  # MLA; GQA with 4 KV heads
    assert V4.with_tensor_parallel(2).kv_bytes_per_token == V4.kv_bytes_per_token  # one shared KV head
    assert v3.with_tensor_parallel(2).kv_bytes_per_token == v3.kv_bytes_per_token  # MLA's latent
    assert qwen.with_tensor_parallel(2).kv_bytes_per_token == qwen.kv_bytes_per_token / 2
    assert qwen.with_tensor_parallel(8).kv_bytes_per_token == qwen.kv_bytes_per_token / 4  # one of 4 heads each
    for m in (V4, v3, qwen):  # every GPU computes its own heads
        for phase in ("decode", "prefill"):
            assert m.with_tensor_parallel(2).attention_flops_per_pair(phase) == m.attention_flops_per_pair(phase) / 2


def test_the_router_norms_and_head_stay_whole_and_the_ffns_split():
    two = GQA.with_tensor_parallel(2)
    by_name = lambda m: {(l.op, l.name): l for l in m.linears("moe")}  # noqa: E731
    whole, half = by_name(GQA), by_name(two)
    assert half[("router", "gate")] == whole[("router", "gate")]
    assert two.head_linears() == GQA.head_linears() and two.norm_params_per_layer == GQA.norm_params_per_layer
    for key in (("experts", "gate_up"), ("experts", "down"), ("shared_experts", "gate_up"), ("qkv_proj", "qkv"),
                ("out_proj", "o")):
        assert half[key].params * 2 == whole[key].params, key


def test_t1_is_the_whole_model():
    for name in models.PRESETS:
        m = models.preset(name)
        assert m.with_tensor_parallel(1) == m
        assert m.heads_per_gpu == m.heads and m.kv_heads_per_gpu == m.kv_heads


def test_a_t_that_does_not_split_the_model_is_refused():
    with pytest.raises(ConfigError, match=r"tensor_parallel = 3: must divide heads = 128; must divide o_groups = 16"):
        V4.with_tensor_parallel(3)
    with pytest.raises(ConfigError, match=r"kv_heads = 4 or be a multiple"):
        models.preset("qwen3-235b-a22b").with_tensor_parallel(6)  # 64 heads split, 4 KV heads neither
    with pytest.raises(ConfigError, match="tensor_parallel = 0"):
        V4.with_tensor_parallel(0)
    with pytest.raises(ConfigError, match="--tensor-parallel = 2: the CPU-offloading systems"):
        systems.families(["cpu-stream"], systems.Scenario.fixed_batch("deepseek-v3", 2, 64, 4, tensor_parallel=2))


def _batch():
    """A pass of 3 decode tokens and chunks of 100 and 50 tokens: 153 tokens through each layer."""
    return timing.Batch.make(decode_context=[10, 20, 30], chunk_tokens=[100, 50], chunk_prefix=[0, 7])


@pytest.mark.parametrize("gpus", [2, 4])
def test_one_layers_allreduces_equal_the_ring_formula_by_hand(gpus):
    config = timing.TimingConfig(model=V4.with_tensor_parallel(gpus))
    message = 153 * 7168 * 2  # tokens × hidden × BF16
    one = 2 * (gpus - 1) / gpus * message / (450e3 * 0.8) + 10.0  # µs: 450 GB/s each way, assumed 0.8 and 10 µs
    assert float(lt.allreduce_us(_batch(), H200, config)) == pytest.approx(2 * one, rel=1e-6)
    assert float(lt.allreduce_us(timing.Batch.make(decode_context=[1], decode_mask=[False]), H200, config)) == 0.0
    assert float(lt.allreduce_us(_batch(), H200, timing.TimingConfig(model=V4))) == 0.0  # one GPU


def test_the_allreduces_lie_on_each_layers_critical_path_and_in_no_window():
    needed = jnp.ones((GQA.moe_layers, GQA.routed_experts), bool)
    rows = needed.astype(jnp.int32)
    org = hbf_packages.package("hbflex").org
    one = _LT(_batch(), needed, rows, 0.0, H200, org, timing.TimingConfig(model=GQA))
    two = _LT(_batch(), needed, rows, 0.0, H200, org, timing.TimingConfig(model=GQA.with_tensor_parallel(2)))
    assert np.all(np.asarray(one.allreduce_us) == 0.0)
    assert np.array_equal(np.asarray(one.layer_us), np.asarray(one.op_us.sum(axis=-1)))
    ar = np.asarray(two.allreduce_us)
    assert np.all(ar > 0) and np.all(ar == ar[0])  # every layer reduces the same tokens
    assert np.array_equal(np.asarray(two.layer_us), np.asarray(two.op_us.sum(axis=-1) + ar))
    # the half-size GPU's operators: never slower than the whole model's, the all-reduces outside them
    assert np.all(np.asarray(two.op_us) <= np.asarray(one.op_us) + 1e-3)


def test_the_kv_room_is_what_the_package_leaves_after_one_gpus_weights():
    org = hbf_packages.package("hbflex").org  # every weight in HBF
    package = float(orgs.capacity_bytes(org)[1])
    for gpus in (1, 2):
        m = V4.with_tensor_parallel(gpus)
        want = (package - m.weight_bytes) / m.kv_bytes_per_token
        assert int(kv_tiers.capacity_tokens(org, m).hbf_tokens) == pytest.approx(want, rel=1e-6)


def test_the_allreduce_knobs_are_traced():
    """Sweeping the assumed all-reduce values never recompiles (T itself is static: tensor_parallel docstring)."""
    from _compiles import compilations

    config = timing.TimingConfig(model=V4.with_tensor_parallel(2))
    fn = jax.jit(lt.allreduce_us, static_argnums=2)
    with compilations("allreduce_us") as compiled:
        a = fn(_batch(), H200, config)
        b = fn(_batch(), timing.GpuKnobs.make("h200", allreduce_latency_us=0.0, allreduce_efficiency=1.0), config)
    assert len(compiled) == 1
    message = 153 * 7168 * 2
    assert float(b) == pytest.approx(2 * message / 450e3, rel=1e-6) and float(a) > float(b)


def test_the_header_states_the_split_and_the_assumptions():
    d = tensor_parallel.describe(2, 450.0, np.float32(0.8), 10.0)
    assert d["efficiency"] == 0.8 and d["gpus"] == 2 and set(d["assumed"]) == set(tensor_parallel.KNOB_DEFAULTS)


@pytest.mark.slow  # 15 worker-seconds (a compilation of its own): make test-slow. make test keeps the refusals
# (tests/test_cli_serve.py) and the tensor-parallel engine against its reference (tests/test_serve_reference.py)
def test_serve_states_the_group_and_reports_the_allreduces_and_rates_per_gpu(capsys):
    import json

    from hbfjax.cli import main

    assert main(["serve", "--system", "dash", "--model", "qwen3-235b-a22b", "--batch", "2", "--prompt", "64",
                 "--output", "4", "--streams", "2", "--tensor-parallel", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    tp = r["tensor_parallel_model"]
    assert r["tensor_parallel"] == 2 and tp["gpus"] == 2 and tp["link_gbps"] == 300.0  # the H100 PCIe's 600 / 2
    assert tp["efficiency"] == 0.8 and tp["latency_us"] == 10.0 and "assumed" in tp["assumed"]["allreduce_latency_us"]
    assert 0.0 < r["allreduce_share_of_busy"] < 1.0
    assert r["allreduce_s"] == pytest.approx(r["allreduce_share_of_busy"] * r["busy_s"], rel=0.05)  # ratio of means
    assert r["throughput_tokens_per_s_per_gpu"] == r["throughput_tokens_per_s"] / 2
