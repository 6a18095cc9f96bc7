"""The batch protocol of the serving engine, for every kind of system it composes (review 2026-12-02
§9.14): DASH's organisations with the reads part, HBFlex's six organisations with all six parts, and the
CPU-offloading timing with none (DASH's organisations with the tiers part alone are held to the same
protocol by tests/test_serve_system.py's knob-axis test, at its own size, so this module does not compile
them again). For each system, at a tiny size (the tiny GQA MoE, a fixed batch of two requests):

* the jitted batch (streams and the systems of one family vmapped, ``batch.run``) equals a Python loop
  of jitted single-stream runs, stream by stream and system by system, on every output leaf: vmap over
  streams and over the knob axis changes nothing, and each system on the stacked axis equals its own
  separate run;
* the same seed gives the same outputs (and another seed other ones);
* other knob values of the same shapes run on the same compilations (the batch's and the single
  run's): one compilation per family (parts, timing, shapes);
* the outputs carry the ``overflow`` and ``missing_inputs`` flags (False here).

Then what the parts protocol promises beyond the old engines' tests: a DASH organisation given the
reads part (random placement, ``hbf_packages.dash_policy``) reads its HBF KV through plane collisions,
so its read-wave amplification is at least 1 and its reads stall (that this costs time against the tiers
part alone is tests/test_cli_serve.py's); a run whose inputs lack the tabulated law its knobs need (a read law, a law of
resident experts) says so in ``missing_inputs`` and the report refuses it. Every compilation here is
shared by the module's tests (one per family for the batch, one for the single-stream runs).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _compiles import compilations
from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax import clock, rng
from hbfjax.memory import hbf_packages as hp
from hbfjax.serve import cpu_offload, engine, parts, report, systems
from hbfjax.serve.parts.blocks import BlocksConfig
from hbfjax.validate import ConfigError
from hbfjax.workload import timing

STREAMS, SEED, OTHER_SEED = 2, 3, 4
# 2 requests of 1,024 prompt (two 512-token chunks each) and 6 output tokens at t = 0 in 2 slots: the
# decode passes read 2,048+ KV tokens a layer from HBF on DASH (64+ pages of 4 KiB on 4,096 planes:
# random placement collides)
SCENARIO = systems.Scenario.fixed_batch(GQA, batch=2, prompt=1024, output=6, chunk_tokens=512, token_budget=1024,
                                        max_iterations=64, scan_chunk=8,
                                        blocks=BlocksConfig(planes=2, blocks_per_plane=64, pages_per_block=8,
                                                            n_labels=2, plane_writes_per_chunk=64))
# the same shapes, other values: slower programs and reads on every organisation (no read law changes)
OTHER = dataclasses.replace(SCENARIO, org_changes=(("t_prog_us", 400.0), ("t_read_us", 7.0)))
CPU_RESIDENT = (2, 3, 2, 3)  # per CPU system: the resident experts (of 8) set the law each run looks up (OTHER: + 1)

FAMILIES = {
    "dash-reads": (("dash", "relay-only"), dataclasses.replace(SCENARIO, reads="planes")),
    "hbflex": (tuple(hp.PACKAGES), SCENARIO),
    "cpu": (cpu_offload.SYSTEMS, SCENARIO),
}
KINDS = [(family, k) for family, (names, _) in FAMILIES.items() for k in range(len(names))]

_SINGLE = jax.jit(engine.simulate, static_argnums=4)  # one stream, no vmap: one compilation per family


def _points(family: str, scenario) -> list:
    """The family's knob points serving ``scenario`` (the CPU systems with resident experts of their own)."""
    names, _ = FAMILIES[family]
    gpu = systems.gpu_for(names, scenario)
    points = [systems.system(n).knobs(scenario, gpu) for n in names]
    if family == "cpu":
        other = scenario is OTHER
        points = [dataclasses.replace(p, cpu=cpu_offload.CpuKnobs.make(
            GQA, gpu, 8 if other else 32, n, resident=r + other, cpu_experts=2 if other else 1))
            for p, n, r in zip(points, names, CPU_RESIDENT)]
    return points


def _single(config, point, inputs, stream: int, seed: int = SEED):
    out = _SINGLE(jnp.int32(stream), rng.seed_word(seed), point, inputs, config)
    return jax.tree_util.tree_map(np.asarray, out)


@functools.lru_cache(maxsize=None)
def _run(family: str) -> dict:
    """Everything the tests read of one family, run once: its batch and the checks' compilation counts."""
    names, scenario = FAMILIES[family]
    config = systems.serve_config(systems.system(names[0]), scenario)
    points = _points(family, scenario)
    assert all(systems.serve_config(systems.system(n), scenario) == config for n in names)  # one family
    inputs = systems.inputs_for(config, points, scenario)
    stacked = hb.stack_knobs(points)
    with compilations("simulate") as batch_compiles:
        out = hb.run(engine.simulate, STREAMS, SEED, stacked, config, inputs=inputs, knob_axis=True)
    with compilations("simulate") as single_compiles:
        loop = [[_single(config, p, inputs, s) for s in range(STREAMS)] for p in points]
    again = hb.run(engine.simulate, STREAMS, SEED, stacked, config, inputs=inputs, knob_axis=True)
    other_seed = hb.run(engine.simulate, STREAMS, OTHER_SEED, stacked, config, inputs=inputs, knob_axis=True)
    other_points = _points(family, OTHER if scenario is SCENARIO else dataclasses.replace(scenario,
                                                                                         org_changes=OTHER.org_changes))
    other_inputs = systems.inputs_for(config, other_points, scenario)
    with compilations("simulate") as recompiles:
        other = hb.run(engine.simulate, STREAMS, SEED, hb.stack_knobs(other_points), config, inputs=other_inputs,
                       knob_axis=True)
        _single(config, other_points[-1], other_inputs, 0)
    return dict(config=config, points=points, inputs=inputs, out=out, loop=loop, again=again, other_seed=other_seed,
                other=other, batch_compiles=len(batch_compiles), single_compiles=len(single_compiles),
                recompiles=list(recompiles))


def _assert_trees_equal(a, b, what: str):
    """Every leaf of ``a`` equals ``b``'s, bit for bit (NaN equal to NaN), named by its path on failure."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), what
    bad = []
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            bad.append(f"{jax.tree_util.keystr(path)}: {x.ravel()[:4]} vs {y.ravel()[:4]}")
    assert not bad, f"{what}: " + "; ".join(bad)


EPS, DEPTH, WAVE_DEPTH = 2.0**-24, 16, 11  # tests/test_serve_reference.py, tests/test_hbflex_reference.py
READ_FIELDS = ("hbm_read_bytes", "hbf_read_bytes")


def _assert_outputs_equal(a, b, what: str):
    """Two runs of one stream on one system (:class:`engine.ServeOutput`, any leading axes) are the same
    run: every leaf bit for bit, but the split of the read bytes between HBM and HBF. That split
    (``delivery``'s parallel read) leaves a few ulps of an operator's HBF-only bytes on the HBM side
    (max(bytes − cut × bytes / cut, 0)), and the vmapped and the single-stream compilations round it
    apart (seen: 0.023 bytes apart on HBFlex and naive HBF). Each is within tests/test_hbflex_reference.py's bound
    of the exact split, ``(L·len(OPS) + DEPTH + WAVE_DEPTH)·EPS`` of the bytes read, so they are within
    twice that of each other."""
    zero = lambda o: o._replace(totals=o.totals._replace(**{f: 0.0 * o.totals.hbm_read_bytes  # noqa: E731
                                                            for f in READ_FIELDS}))
    _assert_trees_equal(zero(a), zero(b), what)
    read = np.asarray(b.totals.hbm_read_bytes, np.float64) + np.asarray(b.totals.hbf_read_bytes, np.float64)
    bound = 2 * (GQA.layers * len(timing.OPS) + DEPTH + WAVE_DEPTH) * EPS * read
    for f in READ_FIELDS:
        gap = np.abs(np.asarray(getattr(a.totals, f), np.float64) - np.asarray(getattr(b.totals, f), np.float64))
        assert np.all(gap <= bound), f"{what}: .totals.{f}: {gap} > {bound}"


# the two families with the largest programs (HBFlex's six parts, DASH with its reads part: 150 of make
# test's worker-seconds) run in make test-slow; make test keeps the DASH and CPU families here, and HBFlex's
# engine is held to its reference in tests/test_hbflex_reference.py
SLOW_FAMILIES = ("hbflex", "dash-reads")


def _slow_if_large(family, *rest):
    return pytest.param(family, *rest, marks=pytest.mark.slow) if family in SLOW_FAMILIES else pytest.param(family, *rest)


@pytest.mark.parametrize("family, k", [_slow_if_large(f, k) for f, k in KINDS],
                         ids=[f"{f}-{FAMILIES[f][0][k]}" for f, k in KINDS])
def test_each_system_conforms_to_the_batch_protocol(family, k):
    r = _run(family)
    name = FAMILIES[family][0][k]
    point = hb.point_outputs(r["out"], k)  # [S, ...]
    for s in range(STREAMS):  # the batch's stream s of system k is its own single-stream run
        _assert_outputs_equal(jax.tree_util.tree_map(lambda a: a[s], point), r["loop"][k][s], f"{name} stream {s}")
    _assert_trees_equal(r["again"], r["out"], f"{name}: same seed")
    finish = lambda o: clock.to_us(hb.point_outputs(o, k).finish)  # noqa: E731
    assert not np.array_equal(finish(r["other_seed"]), finish(r["out"])), name  # the seed draws the routing
    assert not np.array_equal(finish(r["other"]), finish(r["out"])), name  # the other knob values took effect
    assert r["recompiles"] == [], name  # other knob values, same shapes: no compilation
    assert "overflow" in engine.ServeOutput._fields and "missing_inputs" in engine.ServeOutput._fields
    for flag in (point.overflow, point.missing_inputs):
        assert flag.dtype == np.bool_ and flag.shape == (STREAMS,) and not flag.any(), name
    assert set(point.parts) == set(r["config"].parts), name
    assert np.all(point.iterations == 7) and np.all(point.tokens_out == 6), name  # 2 prefill + 6 − 1 decode


@pytest.mark.parametrize("family", [_slow_if_large(f) for f in sorted(FAMILIES)], ids=sorted(FAMILIES))
def test_systems_of_the_same_parts_stack_on_one_knob_axis_with_one_compilation(family):
    r = _run(family)
    assert r["batch_compiles"] == 1 and r["single_compiles"] == 1, family  # the whole family, every stream
    for k in range(len(r["points"])):  # each point equals its separate runs (every leaf, every stream)
        separate = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *r["loop"][k])
        _assert_outputs_equal(hb.point_outputs(r["out"], k), separate, f"{family} point {k}")
    first, last = (clock.to_us(hb.point_outputs(r["out"], k).finish) for k in (0, len(r["points"]) - 1))
    assert not np.array_equal(first, last), family  # the points differ: the equalities are not between copies


def test_dash_with_the_reads_part_reads_through_plane_collisions():
    """The reads part on DASH (random pages, no offload): amplification >= 1 on every stream (> 1 where
    two pages of a wave share a plane), and a wave's tR exceeds its pages' link time."""
    reads = hb.point_outputs(_run("dash-reads")["out"], 0)
    assert _run("dash-reads")["config"].parts == ("tiers", "reads")
    keys = report.part_keys(reads, ("tiers", "reads"))
    amp = keys["read_wave_amplification"]
    assert np.all(np.isfinite(amp)) and np.all(amp >= 1.0) and np.any(amp > 1.0)
    assert np.all(keys["kv_read_stall_fraction"] > 0)


def test_a_missing_tabulated_law_is_flagged_and_refused():
    # DASH + reads served with inputs built for other systems (HBFlex's and naive HBF's policies and planes,
    # tabulated for the HBFlex family already): the inputs have the same shape, so the family's compilation
    # runs them, and the run says its law was missing
    r = _run("dash-reads")
    points = r["points"]
    inputs = systems.inputs_for(r["config"], _points("hbflex", SCENARIO)[:len(points)], FAMILIES["dash-reads"][1])
    with compilations("simulate") as compiled:
        out = _single(r["config"], points[0], inputs, 0)
    assert compiled == [] and bool(out.missing_inputs) and not bool(_single(r["config"], points[0], r["inputs"],
                                                                             0).missing_inputs)
    batched = jax.tree_util.tree_map(lambda a: a[None], out)
    with pytest.raises(ConfigError, match="inputs: the run's inputs lack a tabulated law"):
        report.check_inputs(batched)
    with pytest.raises(ConfigError, match="inputs: the run's inputs lack a tabulated law"):
        report.system_report(batched, points[0].org, r["config"].parts, 0, False)
    report.check_inputs(r["out"])  # the family's own inputs hold every law
    # a CPU system whose law of resident experts is not in the inputs (laws for other resident counts)
    c = _run("cpu")
    absent = cpu_offload.resident_laws(GQA.routed_experts, [5, 6, 7, 8])
    out = _single(c["config"], c["points"][0], c["inputs"]._replace(resident_laws=absent), 0)
    assert bool(out.missing_inputs)
    with pytest.raises(ConfigError, match="inputs: the run's inputs lack a tabulated law"):
        report.check_inputs(jax.tree_util.tree_map(lambda a: a[None], out))


def test_the_families_are_the_engines_system_kinds():
    """Guards that the families cover what the module docstring claims: DASH + reads, HBFlex's six parts,
    the CPU timing with none."""
    configs = {f: systems.serve_config(systems.system(FAMILIES[f][0][0]), FAMILIES[f][1]) for f in FAMILIES}
    assert configs["dash-reads"].parts == ("tiers", "reads")
    assert configs["hbflex"].parts == parts.HBFLEX and len(parts.ORDER) == 7
    assert configs["cpu"].parts == () and configs["cpu"].timing_kind == "cpu-offload"
    assert {configs[f].timing_kind for f in ("dash-reads", "hbflex")} == {"organisation"}
    assert isinstance(_points("hbflex", SCENARIO)[0].gpu, timing.GpuKnobs)
