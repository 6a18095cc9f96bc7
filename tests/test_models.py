"""Model presets: derived weight and KV bytes against the papers, hand-counted shapes and FLOPs, sources."""

import dataclasses

import pytest

from hbfjax.validate import ConfigError
from hbfjax.workload import models
from hbfjax.workload.models import ModelSpec

TABLE_II_TOLERANCE = 0.02  # the bound: derived checkpoint bytes within 2 % of DASH Table II


@pytest.mark.parametrize("name", sorted(models.DASH_TABLE_II_WEIGHT_GB))
def test_weight_bytes_match_dash_table_ii(name):
    derived = models.preset(name).weight_bytes / 1e9
    paper = models.DASH_TABLE_II_WEIGHT_GB[name]
    assert abs(derived / paper - 1) < TABLE_II_TOLERANCE, (name, derived, paper)


def test_exact_parameter_counts_of_the_dense_llamas():
    # the published exact counts of Meta-Llama-3-8B and -70B (model cards: 8.03B, 70.6B)
    assert models.preset("llama3-8b").params == 8_030_261_248
    assert models.preset("llama3-70b").params == 70_553_706_496


def test_qwen3_weight_count_by_hand():
    h, layers, experts, f, vocab = 4096, 94, 128, 1536, 151936
    attention = h * (64 + 2 * 4) * 128 + 64 * 128 * h
    per_layer = attention + h * experts + experts * 3 * h * f + 2 * h + 2 * 128
    params = layers * per_layer + 2 * vocab * h + h
    assert models.preset("qwen3-235b-a22b").params == params
    assert models.preset("qwen3-235b-a22b").weight_bytes == 2 * params


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_total_parameters_match_the_model_cards(name):
    spec = models.preset(name)
    assert spec.total_params_stated is not None
    assert abs(spec.params / spec.total_params_stated - 1) < 0.02, (spec.params, spec.total_params_stated)


@pytest.mark.parametrize("name", sorted(models.HBFLEX_KV_BYTES_PER_TOKEN))
def test_kv_bytes_per_token_match_hbflex(name):
    # HBFlex rounds to two digits ("35 KB", "95 KB", "≈5 KB"); Qwen3 derives 96.3 KB, 1.3 % above
    spec = models.preset(name).with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT)
    assert abs(spec.kv_bytes_per_token / models.HBFLEX_KV_BYTES_PER_TOKEN[name] - 1) < 0.02


def test_kv_geometry_by_hand():
    assert models.preset("deepseek-v3").kv_bytes_per_token_layer == (512 + 64) * 2  # MLA latent + rotary key, BF16
    assert models.preset("llama4-maverick").kv_bytes_per_token_layer == 8 * 128 * 2 * 2  # DASH §VI-F: 4 KiB
    # DASH §VI-B: 197.413 GB of KV for Maverick at 4K/1M is 1,004,000 tokens of 196,608 B (BF16, every layer)
    assert abs(models.preset("llama4-maverick").kv_bytes_per_token * 1_004_000 / 197.413e9 - 1) < 0.001


def test_hbflex_prefetch_groups_of_deepseek_v4_pro():
    # HBFlex §5.3: an expert's three projections ≈ 63 MB and the two Q projections ≈ 106 MB in INT8 (MiB)
    spec = models.preset("deepseek-v4-pro")
    expert = sum(l.in_features * l.out_features * l.bytes_per_param for l in spec.linears("moe") if l.op == "experts")
    q = sum(l.weight_bytes for l in spec.linears("moe") if l.name in ("q_a", "q_b"))
    assert round(expert / 2**20) == 63 and round(q / 2**20) in (106, 107)


def test_layer_patterns():
    assert models.preset("llama4-maverick").layer_kinds[:4] == ("dense", "moe", "dense", "moe")
    assert models.preset("llama4-maverick").moe_layers == 24
    v3 = models.preset("deepseek-v3")
    assert v3.layer_kinds[:4] == ("dense", "dense", "dense", "moe") and v3.moe_layers == 58
    assert models.preset("llama3-8b").moe_layers == 0 and not models.preset("llama3-8b").is_moe


def test_lookahead_needs_a_router_without_expert_bias():
    # DASH §V-C / DESIGN §4: not DeepSeek-V3
    assert not models.preset("deepseek-v3").lookahead_capable
    assert models.preset("qwen3-235b-a22b").lookahead_capable and models.preset("deepseek-v2").lookahead_capable


def test_flops_per_token_by_hand():
    llama = models.preset("llama3-8b")
    f = llama.flops_per_token("dense", context_tokens=1000)
    assert f["qkv_proj"] == 2 * 4096 * (32 + 16) * 128
    assert f["out_proj"] == 2 * 4096 * 4096
    assert f["dense_ffn"] == 2 * 3 * 4096 * 14336
    assert f["attention"] == 4 * 32 * 128 * 1000  # QKᵀ and PV, 2 FLOPs per multiply-add
    qwen = models.preset("qwen3-235b-a22b").flops_per_token("moe")
    assert qwen["experts"] == 2 * 8 * 3 * 4096 * 1536 and qwen["router"] == 2 * 4096 * 128
    v3 = models.preset("deepseek-v3")
    assert v3.attention_flops_per_pair("decode") == 2 * 128 * (2 * 512 + 64)  # absorbed MLA
    assert v3.attention_flops_per_pair("prefill") == 2 * 128 * (128 + 64 + 128)


def test_active_parameters_are_the_flops_of_one_token_halved():
    spec = models.preset("deepseek-v3")
    flops = sum(sum(v for k, v in spec.flops_per_token(kind).items() if k != "norms") for kind in spec.layer_kinds)
    head = 2 * spec.hidden * spec.vocab
    norms = spec.layers * spec.norm_params_per_layer + spec.hidden
    assert (flops + head) / 2 + norms == pytest.approx(spec.active_params, rel=1e-12)


_UNSOURCED = {"name", "sources", "estimated"}


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_every_preset_value_is_sourced_or_marked_estimated(name):
    spec = models.preset(name)
    cited = {n for n, _ in spec.sources} | set(spec.estimated_fields)
    for f in dataclasses.fields(ModelSpec):
        if f.name in _UNSOURCED or f.name.endswith("_stated"):
            continue
        # a field without a default, or one a preset sets away from its default, needs a source
        if f.default is dataclasses.MISSING or getattr(spec, f.name) != f.default:
            assert f.name in cited, f"{name}.{f.name} has no source"
    for _, text in spec.sources + spec.estimated:
        assert text.strip()


@pytest.mark.parametrize("change, message", [
    (dict(kv_heads=3), "kv_heads = 3: must divide heads"),
    (dict(top_k=200), "top_k = 200: must be in [1, routed_experts = 128]"),
    (dict(attention="sparse"), "attention = 'sparse': must be one of"),
    (dict(layers=0), "layers = 0: must be in [1, 2147483647]"),
    (dict(hidden=4096.5), "hidden = 4096.5: must be an integer"),
    (dict(router="argmax"), "router = 'argmax'"),
    (dict(kv_bytes_per_element=0.0), "kv_bytes_per_element = 0.0: must be > 0"),
    (dict(weight_bytes_per_param=(("experts", 1.0), ("experts", 2.0))), "names a group twice"),
    (dict(weight_bytes_per_param=(("vision", 1.0),)), "'vision': must be one of"),
    (dict(first_dense_layers=95), "first_dense_layers = 95: must be <= layers = 94"),
])
def test_bad_values_are_refused_with_field_and_rule(change, message):
    with pytest.raises(ConfigError, match=None) as err:
        models.preset("qwen3-235b-a22b").replace(**change)
    assert message in str(err.value)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match="choose one of"):
        models.preset("gpt-5")


def test_specs_hash_by_value():
    assert models.preset("deepseek-v3") == models.preset("deepseek-v3")
    assert hash(models.preset("deepseek-v3")) == hash(models.preset("deepseek-v3"))
    assert models.preset("deepseek-v3") != models.preset("deepseek-v3").with_kv_precision(1.0)
