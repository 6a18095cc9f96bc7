"""The readings of the DASH paper it leaves open (issue 24; review 2026-12-02 DASH fidelity): each by hand
on one layer, each in a two-organisation comparison on the same draws, the readings as traced knobs
(one compilation), and the CLI's B = 1 decode step without launches against a step computed by hand."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _compiles import compilations
from _tiny_models import GQA
from hbfjax import batch as hb
from hbfjax import cli
from hbfjax.memory import delivery, organisations as orgs
from hbfjax.serve import layer_time as lt
from hbfjax.serve import systems
from hbfjax.workload import models, timing
from hbfjax.workload.models import ModelSpec

GPU = timing.GpuKnobs.make("h100-pcie", launch_us=4.0)
ONE_DECODE = timing.Batch.make(decode_context=[16], chunk_tokens=[1], chunk_mask=[False])
_LT = jax.jit(lt.layer_times, static_argnums=6)
WAVE_BYTES = 16 * 32 * 4 * 4096  # one DASH stack's page wave: 16 dies × 32 planes × 4 subarrays × 4 KiB


def _eight_expert_layer():
    model = ModelSpec(name="eight-experts", layers=1, hidden=4096, vocab=8, attention="gqa", heads=8, kv_heads=8,
                      head_dim=64, routed_experts=16, top_k=8, router="sigmoid-bias", expert_ffn=16384)
    needed = np.zeros((1, 16), bool)
    needed[:, :8] = True
    return model, jnp.asarray(needed), jnp.asarray(needed.astype(np.int32))


def test_tr_as_latency_keeps_the_arrays_rate_of_the_reference_tr_and_still_waits_tr():
    # DASH by hand: arrays 2 stacks × one 8 MiB wave per tR; at tR = 3 µs 5.59 TB/s, at 32 µs 0.52 TB/s
    rate_at = lambda tr: 2 * WAVE_BYTES / (tr * 1e3)  # noqa: E731  GB/s
    literal = delivery.rates(orgs.dash(t_read_us=32.0))
    latency = delivery.rates(orgs.dash(t_read_us=32.0, tr_sets_rate=0.0))
    assert float(literal.array_gbps) == pytest.approx(rate_at(32.0), rel=1e-6)
    assert float(latency.array_gbps) == pytest.approx(rate_at(3.0), rel=1e-6)
    assert float(latency.sram_gbps) == pytest.approx(2 * 8 * 2**20 / 3e3, rel=1e-6)
    # at the reference tR the two readings are one organisation
    assert float(delivery.rates(orgs.dash(tr_sets_rate=0.0)).array_gbps) == float(delivery.rates(orgs.dash()).array_gbps)
    # one layer: 8 experts of 402.7 MB over DirectOnly (a biased router: no lookahead, tR exposed)
    model, needed, rows = _eight_expert_layer()
    b = lt.expert_bytes(model)
    cfg = timing.TimingConfig(model=model)
    i = lt.OPS.index("experts")
    for tr_sets_rate, array in ((1.0, rate_at(32.0)), (0.0, rate_at(3.0))):
        org = orgs.direct_only(t_read_us=32.0, t_prog_us=100.0, tr_sets_rate=tr_sets_rate)
        out = _LT(ONE_DECODE, needed, rows, 1.0, GPU, org, cfg)
        rate = min(2 * 1600.0, array)  # the two Direct links or the shared arrays
        assert float(out.delivery_us[0, i]) == pytest.approx(32.0 + 8 * b / (rate * 1e3), rel=1e-5)


def test_per_path_arrays_lift_dash_past_the_shared_floor_and_leave_single_paths_alone():
    model, needed, rows = _eight_expert_layer()
    b = lt.expert_bytes(model)
    cfg = timing.TimingConfig(model=model)
    i = lt.OPS.index("experts")
    arrays = 2 * WAVE_BYTES / 3e3  # GB/s at tR = 3 µs
    shared = _LT(ONE_DECODE, needed, rows, 1.0, GPU, orgs.dash(), cfg)
    per_path = _LT(ONE_DECODE, needed, rows, 1.0, GPU, orgs.dash(shared_array_rate=0.0), cfg)
    # by hand: 4 experts a path; shared: all 8 experts' bytes at the arrays' 5.59 TB/s under both paths;
    # per path: each path's 4 at min(its 3.2 TB/s, the arrays) = 3.2 TB/s (+ tR and the relay's first chunk)
    assert float(shared.delivery_us[0, i]) >= 8 * b / (arrays * 1e3) + 3.0 - 1e-3
    assert float(per_path.delivery_us[0, i]) == pytest.approx(
        3.0 + 4 * 2**20 / 1600e3 + 4 * b / 3200e3, rel=1e-5)
    assert float(per_path.delivery_us[0, i]) < float(shared.delivery_us[0, i])
    for name in ("relay-only", "direct-only"):  # one path: the two readings are one organisation
        a = _LT(ONE_DECODE, needed, rows, 1.0, GPU, orgs.organisation(name), cfg)
        p = _LT(ONE_DECODE, needed, rows, 1.0, GPU, orgs.organisation(name, shared_array_rate=0.0), cfg)
        assert float(a.iteration_us) == float(p.iteration_us)


def test_a_write_window_of_n_layers_exposes_what_a_block_writes_beyond_its_windows():
    need = jnp.asarray([3.0, 0.0, 0.0, 2.0, 5.0])
    window = jnp.ones(5)
    by_hand = {1: [2, 0, 0, 1, 4],  # every layer alone: max(need − 1, 0)
               2: [0, 1, 0, 0, 4],  # blocks {0, 1} 3 − 2, {2, 3} 2 − 2, {4} 5 − 1
               3: [0, 0, 0, 0, 5],  # {0, 1, 2} 3 − 3, {3, 4} 7 − 2 on the last layer
               5: [0, 0, 0, 0, 5]}  # one block: 10 − 5
    for n, expected in by_hand.items():
        np.testing.assert_allclose(np.asarray(lt._block_excess(need, window, jnp.float32(n))), expected)


def test_write_window_layers_and_tr_model_are_traced_knobs_in_one_compilation():
    model, needed, rows = _eight_expert_layer()
    cfg = timing.TimingConfig(model=model)
    points = [orgs.dash(), orgs.dash(shared_array_rate=0.0), orgs.dash(tr_sets_rate=0.0, t_read_us=32.0),
              orgs.dash(write_window_layers=4)]
    fn = jax.jit(jax.vmap(lt.layer_times, in_axes=(None, None, None, None, None, 0, None)), static_argnums=6)
    with compilations("layer_times") as compiled:
        fn(ONE_DECODE, needed, rows, 1.0, GPU, hb.stack_knobs(points), cfg)
        fn(ONE_DECODE, needed, rows, 1.0, GPU, hb.stack_knobs(points[::-1]), cfg)
    assert len(compiled) == 1


def _fixed_batch(*, prefill: str, **changes):
    slots, prompt = 2, 1024
    extra = systems.whole_prefill(prompt, slots) if prefill == "whole" else {}
    sc = systems.Scenario.fixed_batch(GQA, slots, prompt, 4, slots=slots, max_iterations=64, **extra, **changes)
    return systems.single("dash", sc)


def test_whole_prefill_serves_the_batch_in_one_pass_and_chunked_in_sarathi_chunks():
    from hbfjax.sweep import families

    iterations = {}
    for prefill in systems.FIXED_PREFILL:
        out = families.run_outputs(_fixed_batch(prefill=prefill), 2, 0)[0]
        iterations[prefill] = float(np.mean(out.iterations))
    # by hand: chunked, 2 requests × 2 chunks of 512 at one chunk a request a pass: 2 prefill passes (the
    # second gives the first token), then 3 decode passes; whole: 1 prefill pass, then 3 decode passes
    assert iterations == {"chunked": 5.0, "whole": 4.0}


def test_the_cli_b1_decode_step_without_launches_equals_the_step_by_hand(capsys):
    name = "qwen3-235b-a22b"
    assert cli.main(["serve", "--system", "dash", "--model", name, "--batch", "1", "--prompt", "1024", "--output",
                     "128", "--launch-us", "0", "--streams", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["readings"]["launch_us"] == 0.0 and out["readings"]["array_rate"] == "shared"
    m = models.preset(name)
    r = delivery.rates(orgs.dash())
    # by hand: per token, the non-expert weights (less the embedding table: one row is read) over the cut of
    # the GPU's links (GPU–HBM + Direct, 6.4 TB/s; the tiers behind them carry 1.6 + 5.59 TB/s), the
    # top-8 experts of every MoE layer at min(Direct + Relay, arrays, SRAM) = 5.59 TB/s, and the mid-decode
    # KV (1,088 tokens) over the same cut; tR hidden by lookahead; compute is far below delivery at B = 1
    dense_gbps = min(float(r.gpu_hbm_gbps + r.direct_gbps), float(r.hbm_cells_gbps + min(r.array_gbps, r.sram_gbps)))
    expert_gbps = min(float(r.direct_gbps + r.relay_gbps), float(r.array_gbps), float(r.sram_gbps))
    dense = m.non_expert_weight_bytes - m.vocab * m.hidden * m.bytes_per_param("embedding")
    experts = m.moe_layers * m.top_k * lt.expert_bytes(m)
    kv = (1024 + 64) * m.kv_bytes_per_token
    step_ms = ((dense + kv) / dense_gbps + experts / expert_gbps) * 1e-6
    assert out["tpot_ms"] == pytest.approx(step_ms, rel=0.05)


@pytest.mark.parametrize("argv, says", [
    (["--system", "dash", "--reads", "planes", "--tr-model", "latency"], "--tr-model latency: the plane-collision"),
    (["--system", "hbflex", "--array-rate", "per-path"], "--array-rate = 'per-path': applies to DASH's"),
    (["--system", "hbflex", "--write-window-layers", "3"], "--write-window-layers = 3: applies to DASH's"),
    (["--system", "dash", "--rate", "1", "--fixed-prefill", "whole"], "--fixed-prefill = 'whole': applies to a fixed"),
    (["--system", "dash", "--cpu-core-gbps", "30"], "--cpu-core-gbps = 30.0: applies to the CPU-offloading"),
    (["--system", "hybrid", "--cpu-dram-gbps", "400"], "--cpu-dram-gbps = 400: must be <= the Xeon 8452Y's"),
    (["--system", "dash", "--launch-us", "-1"], "--launch-us = -1: must be in [0, 10000]"),
])
def test_a_reading_that_does_not_apply_is_refused_in_one_line(capsys, argv, says):
    assert cli.main(["serve", *argv, "--streams", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and says in err and len(err.strip().splitlines()) == 1, err
