"""The measured table: CSV schema, log-log interpolation inside measured ranges, errors outside, the
jit path, the timing with a table, and the profiler's attention against a NumPy reference."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax.validate import ConfigError
from hbfjax.workload import profile_table as pt
from hbfjax.workload import profiler
from hbfjax.workload import timing as tm
from tests._tiny_models import GQA

DEVICE = "test-gpu"


def _row(op, us, tokens, context=0, in_features=0, out_features=0, dtype="bf16", geometry=(0, 0, 0, 0),
         device=DEVICE):
    heads, kv_heads, qk, v = geometry
    return {"device": device, "jax_version": "0.0", "model": "m", "op": op, "name": op, "in_features": in_features,
            "out_features": out_features, "heads": heads, "kv_heads": kv_heads, "qk_dim": qk, "v_dim": v, "dtype": dtype,
            "tokens": tokens, "context": context, "us": us, "repeats": 3}


KEY = ("linear", "qkv_proj", 64, 128, "bf16")
POINTS = [(1, 10.0), (4, 20.0), (16, 80.0)]


def _qkv_table():
    return pt.ProfileTable.from_rows([_row("qkv_proj", us, m, 0, 64, 128) for m, us in POINTS])


def test_csv_round_trip_keeps_every_column(tmp_path):
    path = tmp_path / "t.csv"
    rows = [_row("qkv_proj", us, m, 0, 64, 128) for m, us in POINTS]
    pt.write_csv(rows, path)
    assert path.read_text().splitlines()[0] == ",".join(pt.FIELDS)
    table = pt.ProfileTable.read(path)
    assert table.device == DEVICE and [r["tokens"] for r in table.rows] == [1, 4, 16]
    assert [r["us"] for r in table.rows] == [10.0, 20.0, 80.0]


def test_interpolation_is_exact_at_measured_points_and_log_log_linear_between():
    table = _qkv_table()
    for m, us in POINTS:
        assert table.interpolate_us(KEY, m) == pytest.approx(us, rel=1e-12)
    # between 1 and 4: log-linear means the geometric midpoint x = 2 gets the geometric mean
    assert table.interpolate_us(KEY, 2) == pytest.approx(math.sqrt(10.0 * 20.0), rel=1e-12)
    # between 4 and 16 the measured slope is 1 in log-log: µs ∝ x
    assert table.interpolate_us(KEY, 10) == pytest.approx(50.0, rel=1e-12)


def test_jit_interpolation_matches_the_host_and_flags_sizes_outside():
    table = _qkv_table()
    curves = table.curves()
    k = curves.index(KEY)
    xs = jnp.asarray([1.0, 2.0, 3.0, 10.0, 16.0, 0.5, 17.0])
    us, inside = jax.jit(pt.curve_us, static_argnums=1)(curves, k, xs)
    np.testing.assert_allclose(us[:5], [table.interpolate_us(KEY, float(x)) for x in xs[:5]], rtol=1e-5)
    assert inside.tolist() == [True] * 5 + [False, False]


@pytest.mark.parametrize("x", [0.5, 17, 1e6])
def test_host_interpolation_refuses_sizes_outside_the_measured_range(x):
    with pytest.raises(pt.ProfileRangeError, match=r"outside the measured range \[1, 16\]"):
        _qkv_table().interpolate_us(KEY, x)


def test_unmeasured_shape_is_refused():
    with pytest.raises(pt.ProfileRangeError, match="no curve"):
        _qkv_table().interpolate_us(("linear", "qkv_proj", 64, 256, "bf16"), 2)


def test_repeated_measurements_at_one_size_take_their_median():
    table = pt.ProfileTable.from_rows([_row("norm", us, 8, 0, 64, 64) for us in (5.0, 9.0, 6.0)]
                                      + [_row("norm", 20.0, 64, 0, 64, 64)])
    xs, us = table.points()[("norm", "norm", 64, 64, "bf16")]
    assert xs.tolist() == [8.0, 64.0] and us.tolist() == [6.0, 20.0]


def test_attention_sizes_are_total_context_and_causal_pairs():
    geo = (4, 2, 16, 16)
    decode = _row("attention_decode", 5.0, 2, 300, geometry=geo)
    prefill = _row("attention_prefill", 9.0, 4, 6, geometry=geo)  # chunk of 4 after a prefix of 2
    assert pt.row_size(decode) == 600  # two tokens × 300 context tokens
    assert pt.row_size(prefill) == 4 * 2 + 4 * 5 / 2  # 18 pairs, as the timing counts them
    assert pt.row_key(decode) == pt.attention_key(GQA, "decode", "bf16")


# --- the timing with a measured table -----------------------------------------------------------

def _gqa_table(scale=1.0, tokens=(1, 2, 64, 1024), contexts=(1, 100_000), pairs_chunks=((1, 1), (512, 4096))):
    """A synthetic table for every GQA shape: µs = scale × (3 + x / 50) at the listed sizes."""
    rows = []
    for shape in profiler.model_shapes(GQA, "gqa"):
        geo = (shape.heads, shape.kv_heads, shape.qk_dim, shape.v_dim)
        if shape.op == "attention_decode":
            rows += [_row(shape.op, scale * (3 + c / 50), 1, c, geometry=geo) for c in contexts]
        elif shape.op == "attention_prefill":
            for n, ctx in pairs_chunks:
                x = n * (ctx - n) + n * (n + 1) / 2
                rows.append(_row(shape.op, scale * (3 + x / 50), n, ctx, geometry=geo))
        else:
            rows += [_row(shape.op, scale * (3 + m / 50), m, 0, shape.in_features, shape.out_features, shape.dtype)
                     for m in tokens]
    return pt.ProfileTable.from_rows(rows)


def _curve_value(table, key, x):
    return table.interpolate_us(key, x)


def test_timing_reads_each_operator_from_its_curve():
    table = _gqa_table()
    batch = tm.Batch.make([40, 60], [10], [5])  # 12 tokens; 100 context; 10·5 + 55 = 105 pairs
    rows = jnp.asarray([3, 0, 0, 2, 0, 0, 1, 0], jnp.int32)
    costs = tm.step_costs(batch, rows, tm.GpuKnobs.make(), tm.TimingConfig(GQA), table.curves())
    moe = np.asarray(costs.moe.time_us)
    assert not np.asarray(costs.table_miss).any()
    lin = {lin.op: lin for lin in GQA.linears("moe")}
    assert moe[tm.OPS.index("qkv_proj")] == pytest.approx(_curve_value(table, pt.linear_key(lin["qkv_proj"]), 12), rel=1e-5)
    assert moe[tm.OPS.index("norms")] == pytest.approx(2 * _curve_value(table, pt.norm_key(GQA, 2), 12), rel=1e-5)
    assert moe[tm.OPS.index("attention_decode")] == pytest.approx(
        _curve_value(table, pt.attention_key(GQA, "decode", "bf16"), 100), rel=1e-5)
    assert moe[tm.OPS.index("attention_prefill")] == pytest.approx(
        _curve_value(table, pt.attention_key(GQA, "prefill", "bf16"), 105), rel=1e-5)
    # routed experts: each expert one GEMM of its rows (3, 2 and 1), for both expert matrices
    experts = [lin for lin in GQA.linears("moe") if lin.op == "experts"]
    expected = sum(_curve_value(table, pt.linear_key(e), r) for e in experts for r in (3, 2, 1))
    assert moe[tm.OPS.index("experts")] == pytest.approx(expected, rel=1e-5)
    # shared experts: copies × one GEMM over all tokens
    shared = [lin for lin in GQA.linears("moe") if lin.op == "shared_experts"]
    assert moe[tm.OPS.index("shared_experts")] == pytest.approx(
        sum(lin.copies * _curve_value(table, pt.linear_key(lin), 12) for lin in shared), rel=1e-5)
    head = GQA.head_linears()[0]
    assert float(costs.lm_head.time_us) == pytest.approx(_curve_value(table, pt.linear_key(head), 3), rel=1e-5)


def test_outside_the_table_is_nan_and_flagged_unless_the_roofline_is_allowed():
    table = _gqa_table(tokens=(1, 2, 8))  # GEMMs measured only up to 8 tokens
    batch = tm.Batch.make([40, 60], [10], [5])  # 12 tokens
    rows = jnp.asarray([3, 0, 0, 2, 0, 0, 1, 0], jnp.int32)
    knobs = tm.GpuKnobs.make()
    strict = tm.step_costs(batch, rows, knobs, tm.TimingConfig(GQA), table.curves())
    miss = dict(zip(tm.OPS + ("lm_head",), np.asarray(strict.table_miss).tolist()))
    assert miss["qkv_proj"] and miss["norms"] and not miss["experts"] and not miss["lm_head"]  # rows ≤ 3, 3 heads
    assert not miss["attention_decode"]
    assert math.isnan(float(strict.moe.time_us[tm.OPS.index("qkv_proj")]))
    with pytest.raises(pt.ProfileRangeError, match=r"'norms', 'qkv_proj'"):
        tm.raise_if_table_miss(strict.table_miss)
    lenient = tm.step_costs(batch, rows, knobs, tm.TimingConfig(GQA, allow_roofline=True), table.curves())
    roofline = tm.step_costs(batch, rows, knobs, tm.TimingConfig(GQA))
    assert not np.asarray(lenient.table_miss).any()
    i = tm.OPS.index("qkv_proj")
    assert float(lenient.moe.time_us[i]) == pytest.approx(float(roofline.moe.time_us[i]), rel=1e-6)
    e = tm.OPS.index("experts")
    assert float(lenient.moe.time_us[e]) == pytest.approx(float(strict.moe.time_us[e]), rel=1e-6)  # inside: the table
    tm.raise_if_table_miss(lenient.table_miss)


def test_a_shape_without_a_curve_is_a_miss():
    batch = tm.Batch.make([40], [], [])
    costs = tm.step_costs(batch, jnp.zeros((8,), jnp.int32), tm.GpuKnobs.make(), tm.TimingConfig(GQA),
                          _qkv_table().curves())
    miss = dict(zip(tm.OPS + ("lm_head",), np.asarray(costs.table_miss).tolist()))
    assert miss["out_proj"] and miss["attention_decode"] and not miss["attention_prefill"] and not miss["experts"]


def test_table_values_change_without_recompiling():
    from tests._compiles import compilations

    fn = jax.jit(tm.model_times, static_argnums=3)
    batch = tm.Batch.make([40, 60], [10], [5])
    rows = jnp.zeros((GQA.moe_layers, 8), jnp.int32).at[:, 0].set(4)
    config = tm.TimingConfig(GQA)
    with compilations("model_times") as compiled:
        a = fn(batch, rows, tm.GpuKnobs.make(), config, _gqa_table(1.0).curves())
        b = fn(batch, rows, tm.GpuKnobs.make(), config, _gqa_table(2.0).curves())
    assert len(compiled) == 1
    assert float(b.iteration_us) == pytest.approx(2 * float(a.iteration_us), rel=1e-5)


# --- CSV validation --------------------------------------------------------------------------

def test_bad_tables_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="one table holds one device"):
        pt.ProfileTable.from_rows([_row("norm", 1.0, 1, 0, 8, 8), _row("norm", 1.0, 2, 0, 8, 8, device="other")])
    with pytest.raises(ConfigError, match="no measurements"):
        pt.ProfileTable.from_rows([])
    path = tmp_path / "bad.csv"
    path.write_text("device,op,us\ncpu,norm,1\n")
    with pytest.raises(ConfigError, match=r"columns \['jax_version'"):
        pt.ProfileTable.read(path)
    for field, value, rule in (("us", "-3", "must be finite and > 0"), ("us", "nan", "must be finite and > 0"),
                               ("tokens", "0", "must be >= 1"), ("tokens", "2.5", "must be an integer")):
        row = _row("norm", 1.0, 1, 0, 8, 8)
        pt.write_csv([row], path)
        text = path.read_text().splitlines()
        header = text[0].split(",")
        cells = text[1].split(",")
        cells[header.index(field)] = value
        path.write_text("\n".join([text[0], ",".join(cells)]) + "\n")
        with pytest.raises(ConfigError, match=f"bad.csv:2: {field} = .*{rule}"):
            pt.ProfileTable.read(path)


# --- the profiler's kernels ------------------------------------------------------------------

def _numpy_attention(q, k, v, prefix):
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    out = np.zeros((n, heads, v.shape[-1]))
    for i in range(n):
        for h in range(heads):
            g = h // (heads // kv_heads)
            keys = np.arange(prefix + i + 1)
            logits = k[keys, g] @ q[i, h] / np.sqrt(d)
            w = np.exp(logits - logits.max())
            out[i, h] = (w / w.sum()) @ v[keys, g]
    return out


def test_profiler_attention_is_grouped_and_causal_after_the_prefix():
    gen = np.random.default_rng(0)
    q = gen.normal(size=(3, 4, 8)).astype(np.float32)
    k = gen.normal(size=(7, 2, 8)).astype(np.float32)
    v = gen.normal(size=(7, 2, 5)).astype(np.float32)
    expected = _numpy_attention(q, k, v, 4)
    got = profiler.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), prefix=4)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)
    # in query blocks of one (logits of one query: 4 heads × 7 keys × 4 B)
    blocked = profiler.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), prefix=4, logits_bytes=4 * 4 * 7)
    np.testing.assert_allclose(np.asarray(blocked), expected, rtol=1e-5, atol=1e-6)


def test_model_shapes_cover_every_curve_the_timing_looks_up():
    keys = {pt.row_key(r) for r in _gqa_table().rows}
    lins = [lin for kind in ("dense", "moe") for lin in GQA.linears(kind)] + list(GQA.head_linears())
    wanted = {pt.linear_key(lin) for lin in lins} | {pt.norm_key(GQA, 2)} | {
        pt.attention_key(GQA, p, "bf16") for p in ("decode", "prefill")}
    assert wanted == keys


def test_vmap_over_streams_with_a_table_equals_a_loop():
    curves = _gqa_table().curves()
    batches = [tm.Batch.make([40, 60], [10], [5]), tm.Batch.make([900, 7], [100], [0], chunk_emits=np.array([False]))]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *batches)
    rows = jnp.asarray(np.random.default_rng(1).integers(0, 6, (2, GQA.moe_layers, 8)), jnp.int32)
    knobs, config = tm.GpuKnobs.make(), tm.TimingConfig(GQA)
    out = jax.jit(jax.vmap(tm.model_times, in_axes=(0, 0, None, None, None)), static_argnums=3)(
        stacked, rows, knobs, config, curves)
    for s, b in enumerate(batches):
        one = tm.model_times(b, rows[s], knobs, config, curves)
        np.testing.assert_allclose(out.segment_us[s], one.segment_us, rtol=1e-5)
        assert not np.asarray(one.table_miss).any()
