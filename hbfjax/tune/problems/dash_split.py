"""``dash-split``: the DASH Direct/Relay split and the HBM writeback threshold of a serving run (DASH §V-B,
§V-C, §VI-E; issue 13 problem 3).

A fixed batch (all requests queued at t = 0, so the GPU never idles and the throughput is the
saturated one) is served on DASH (the named system ``dash`` with ``balanced_split = 0``,
``hbfjax.serve.systems``) by the serving engine (``hbfjax.serve.engine.simulate``, streams vmapped by
``hbfjax.batch.over_streams``). The two knobs:

* ``relay_fraction`` (Fraction 0–1): the share of each MoE layer's needed experts sent over Relay,
  ``round(relay_fraction · n)`` whole experts (``OrgKnobs.relay_fraction``). The layer's expert delivery
  is ``max(T_Direct, T_Relay)``, each path bounded below by the stacks' shared array rate;
* ``hbm_kv_budget_gb`` (GB, Fraction from 0 to the batch's peak decode KV ``B · L_out · KV bytes per
  token``; above it nothing is ever written back): the HBM-resident KV above which decode KV is written
  back to HBF (``ServeKnobs.hbm_kv_budget_bytes``). It sets how much of the attention's KV is read from
  HBM rather than HBF (prefill KV is written straight to HBF), and how much is written back.

Objective: ``−throughput`` (output tokens/s per stream, from the first arrival to the last finish:
``hbfjax.serve.jit_metrics.throughput_tokens_per_s``, the in-jit form of ``hbfjax.serve.metrics``'
``throughput_tokens_per_s``), averaged over ``streams`` streams on common random numbers (requests and
routing hash only (seed, stream, pass, layer)).

Relaxation (``relax`` given; temperature in **µs** of path delivery time, ``engine.ServeRelax.delivery_us``):
``round(relay_fraction · n)`` straight through (forward exact) and the two maxima of each layer's expert
delivery (a path's transfer against the shared-array floor, then ``max(T_Direct, T_Relay)``) as
``soft_max``: bias per MoE layer
and pass in [0, 2 · t · log 2] µs, so the relaxed busy time exceeds the exact one by at most
``2 · t · log 2 · MoE layers · passes`` and the relaxed throughput is never above the exact one. The
budget acts through whole tokens and page-wave units of the KV booking (exact derivative zero); the
relaxed engine gives it a straight-through derivative (``kv_tiers.budget_straight_through``: while
writeback binds, the HBM-resident KV is the budget), temperature-free and unbiased in value, biased in
slope by the unit quantisation. The rollout is a ``while_loop``: ``reverse_mode=False``.

Landscape (module defaults: Mixtral-8x22B, 64 requests of 256 → 512 tokens, H100 PCIe): the split is
a staircase of whole experts (8 per layer, all needed at 64 tokens) with its top on 4/8 over Relay
(relay_fraction in [0.4375, 0.5625)): with DASH's equal links and shared arrays both paths are then
bounded by the stacks' array rate, which the balanced split (``balanced_split = 1``) also reaches;
all-Direct or all-Relay serves 38 % fewer tokens/s. The budget has an interior optimum near a fifth
of the peak decode KV (≈ 1.5 GB, +2.0 % over never writing back, +0.3 % over writing everything
back): decode attention reads its KV from both tiers at once, and the HBM side alone (HBM cells,
1.6 TB/s) is slower than the HBF side (``delivery.read_cuts``), so the read is fastest with a minority
of the KV in HBM. The writes themselves expose almost no stall here. With 8 experts all needed at
every pass the routing draws do not vary, so streams add nothing at these defaults (they do for
models with more experts or smaller batches).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from hbfjax import batch as hb
from hbfjax.memory import delivery
from hbfjax.serve import engine, jit_metrics, systems
from hbfjax.tune.problem import Fraction, Knob, Problem, TuneDefaults
from hbfjax.validate import require, require_choice, require_int
from hbfjax.workload import gpus, models
from hbfjax.workload import requests as rq

NAME = "dash-split"
SYSTEM = "dash"
ITERATION_MARGIN = 64
SCAN_CHUNK = 32
RELAY_GRID = tuple(round(0.05 * i, 2) for i in range(21))
BUDGET_GRID_SHARES = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)  # of the peak decode KV


def iterations_bound(batch: int, prompt: int, output: int) -> int:
    """Iterations a fixed batch needs at most: its B·⌈L_in/chunk⌉ chunks at no fewer than
    min(B, (budget − B) // chunk) an iteration, then L_out − 1 decode iterations (DASH §VI-E's batcher,
    ``systems.CHUNK_TOKENS`` and ``TOKEN_BUDGET``)."""
    chunk, budget = systems.CHUNK_TOKENS, systems.TOKEN_BUDGET
    per_iteration = max(1, min(batch, (budget - batch) // chunk))
    return math.ceil(batch * math.ceil(prompt / chunk) / per_iteration) + output - 1 + ITERATION_MARGIN


def scenario(model, batch: int, prompt: int, output: int, gpu: str = systems.DASH_GPU,
             balanced: bool = False) -> systems.Scenario:
    """The fixed batch on ``gpu`` with DASH's batcher, the HBM KV budget at 0 (the knob sets it) and DASH
    with a fixed split (or the balanced one)."""
    return systems.Scenario.fixed_batch(model, batch, prompt, output, gpu=gpu, hbm_kv_budget_bytes=0.0,
                                        org_changes=(("balanced_split", 1.0 if balanced else 0.0),),
                                        max_iterations=iterations_bound(batch, prompt, output), scan_chunk=SCAN_CHUNK)


def family(model, batch: int, prompt: int, output: int, gpu: str = systems.DASH_GPU,
           balanced: bool = False) -> systems.Family:
    """DASH serving the fixed batch (:func:`scenario`): its config, one knob point and its inputs."""
    return systems.single(SYSTEM, scenario(model, batch, prompt, output, gpu, balanced))


def with_values(knobs: engine.ServeKnobs, values: dict, temperature_us=None) -> engine.ServeKnobs:
    """``knobs`` at the knob values (f32[] each), relaxed at ``temperature_us`` (None: exact)."""
    org = dataclasses.replace(knobs.org, relay_fraction=jnp.asarray(values["relay_fraction"], jnp.float32))
    budget = jnp.asarray(values["hbm_kv_budget_gb"], jnp.float32) * 1e9
    relax = None if temperature_us is None else engine.ServeRelax(delivery_us=temperature_us)
    return dataclasses.replace(knobs, org=org, hbm_kv_budget_bytes=budget, relax=relax)


def _utilisation(nbytes, gbps, busy_us) -> jax.Array:
    return jnp.where(gbps > 0, nbytes / (jnp.maximum(gbps, 1e-30) * 1e3 * jnp.maximum(busy_us, 1e-30)), 0.0)


def make(*, streams: int = 1, lam: float | None = None, model: str = "mixtral-8x22b", batch: int = 64,
         prompt: int = 256, output: int = 512, gpu: str = systems.DASH_GPU) -> Problem:
    """The problem on ``model`` serving a fixed batch of ``batch`` requests of ``prompt`` → ``output``
    tokens on ``gpu`` (module docstring). ``lam`` has no meaning here (no penalty): it must be None."""
    c = NAME
    streams = require_int(c, "streams", streams, 1, 4096)
    require(lam is None, c, "lam", lam, "this problem has no penalty term: leave it unset")
    require_choice(c, "model", model, tuple(models.PRESETS))
    require_choice(c, "gpu", gpu, tuple(gpus.PRESETS))
    batch = require_int(c, "batch", batch, 1, 4096)
    prompt = require_int(c, "prompt", prompt, 1, rq.MAX_TOKENS)
    output = require_int(c, "output", output, 2, rq.MAX_TOKENS)
    spec = models.preset(model)
    require_int(c, "model.routed_experts", spec.routed_experts, 2)  # a split needs experts to split
    fixed, balanced = family(model, batch, prompt, output, gpu), family(model, batch, prompt, output, gpu, True)
    require(fixed.config == balanced.config, c, "config", balanced.config, "the balanced split must share the config")
    config, inputs = fixed.config, fixed.inputs
    peak_gb = batch * output * spec.kv_bytes_per_token / 1e9
    over_streams = hb.over_streams(fixed.simulate, streams)

    def run(knobs, seed):
        return over_streams(seed, knobs, inputs, config)

    def throughput(out):
        return jax.vmap(jit_metrics.throughput_tokens_per_s)(out)

    def objective(values, seed, relax=None):
        t = None if relax is None else relax.temperature
        out = run(with_values(fixed.points[0], values, t), seed)
        return -jnp.mean(throughput(out))

    def report(values, seed):
        knobs = with_values(fixed.points[0], values)
        out = run(knobs, seed)
        ref = run(with_values(balanced.points[0], values), seed)
        tot = out.totals
        r = delivery.rates(knobs.org)
        mean = lambda x: jnp.mean(jnp.asarray(x, jnp.float32))  # noqa: E731
        return {
            "throughput_tokens_per_s": mean(throughput(out)),
            "balanced_throughput_tokens_per_s": mean(throughput(ref)),
            "tpot_ms": mean(jax.vmap(jit_metrics.mean_tpot_ms)(out)),
            "writeback_gb": mean(tot.writeback_bytes) * 1e-9,
            "write_stall_s": mean(tot.write_stall_us) * 1e-6,
            "busy_s": mean(tot.busy_us) * 1e-6,
            "utilisation_expert_direct": mean(_utilisation(tot.expert_direct_bytes, r.direct_gbps, tot.busy_us)),
            "utilisation_expert_relay": mean(_utilisation(tot.expert_relay_bytes, r.relay_gbps, tot.busy_us)),
        }

    knobs = (
        Knob("relay_fraction", Fraction(0.0, 1.0), RELAY_GRID,
             "share of each MoE layer's needed experts sent over Relay (DASH §V-B, §VI-E)"),
        Knob("hbm_kv_budget_gb", Fraction(0.0, peak_gb), tuple(round(s * peak_gb, 6) for s in BUDGET_GRID_SHARES),
             f"HBM-resident KV (GB) above which decode KV is written back to HBF; {peak_gb:.3g} GB: never"),
    )
    # start: a Direct-leaning split (DASH's preset 0.5 is already optimal with its equal links) and the
    # budget at the middle of its range; steps: the loop's (a fifth of the 147-point grid's evaluations)
    defaults = TuneDefaults(init={"relay_fraction": 0.2, "hbm_kv_budget_gb": 0.5 * peak_gb},
                            learning_rate=0.2, temperature_start=50.0, temperature_end=1.0, sigma=0.3, samples=2,
                            fd_step=0.25)
    return Problem(name=NAME, knobs=knobs, objective=objective, objective_label="−throughput (output tokens/s)",
                   defaults=defaults, streams=streams, report=report, reverse_mode=False, minimise=False,
                   description="DASH Direct/Relay split and HBM writeback threshold, fixed batch at saturation",
                   extra={"model": model, "batch": batch, "prompt": prompt, "output": output, "gpu": gpu,
                          "peak_decode_kv_gb": peak_gb})
