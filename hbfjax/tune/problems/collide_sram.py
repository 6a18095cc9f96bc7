"""Problem ``collide-sram``: read waves + λ · SRAM over plane-group size G and hot-plane offload fraction f (HBFlex §5.2, §6.5).

The attention working set of ``hbfjax.flash.reads.workingset`` (plane-group placement, in-order
scheduling waves): a stream holds ``slots`` requests whose contexts come from a synthetic log-normal
pool; one layer's KV is read per measurement. The objective is

    waves per read + λ · SRAM MB per read

where *waves* is the sum over scheduling waves of the most loaded plane (each costs tR) and *SRAM* the
hot-plane excess that offload serves from base-die SRAM (one layer's read). Small G wraps a logical
page's L physical pages onto fewer than L planes (collisions); large G balances only coarsely across
groups; offload cuts the hottest planes at the price of SRAM. λ is in waves per MB: the sensing rounds
one is willing to pay to save one MB of SRAM.

Relaxation (``relax`` given; temperature t in pages):

* the plane maximum of each scheduling wave is ``soft_max`` at t (bias ≤ t · log planes waves per wave);
* k = round(f · planes) is straight-through rounded, and the offload level (the load of the (k+1)-th
  plane) is read from the descending loads by linear interpolation, so the forward value is exact and
  the backward pass sees the slope between neighbouring ranks;
* a page on plane p is offloaded when its uniform is below p's excess share; relaxed, the indicator is
  ``soft_step`` at 0.1 · t (in probability units), so it, too, is exact as t → 0.

G is discrete (powers of two dividing the planes); the smooth estimator interpolates between them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.flash.reads import workingset
from hbfjax.flash.reads.collide import max_load, offload_hot_planes, plane_loads
from hbfjax.hardware import MB
from hbfjax.tune.problem import Fraction, Knob, Log2Size, Problem, TuneDefaults
from hbfjax.relax import Relax, soft_max, ste_round
from hbfjax.validate import require, require_int, require_real

PLANES = 256
SLOTS = 16
KV_BYTES_PER_TOKEN = 1152.0  # DeepSeek-V3 MLA: (512 + 64) × 2 bytes per token per layer (L = 5 pages of 4 KiB)
CONTEXT_MEDIAN_TOKENS = 2048
CONTEXT_SIGMA = 1.0  # log-normal shape of the synthetic context pool
MAX_CONTEXT_TOKENS = 8192
POOL = 512  # contexts in the synthetic pool
LAMBDA_WAVES_PER_MB = 8.0
F_GRID = tuple(round(0.01 * i, 2) for i in range(26))  # 0 … 25 % of the planes


def context_pool(pool: int = POOL, median_tokens: int = CONTEXT_MEDIAN_TOKENS, sigma: float = CONTEXT_SIGMA,
                 max_tokens: int = MAX_CONTEXT_TOKENS) -> workingset.WorkingSetInputs:
    """A fixed synthetic log-normal pool of contexts (data, not a stream's randomness: seed 0 always)."""
    draws = np.random.default_rng(0).lognormal(np.log(median_tokens), sigma, pool)
    return workingset.WorkingSetInputs.make(np.clip(draws, 16, max_tokens))


def _level(loads_desc: jax.Array, k: jax.Array) -> jax.Array:
    """Descending loads ``[..., planes]`` read at a (possibly fractional) scalar rank k by linear interpolation."""
    i = jnp.clip(jnp.floor(k).astype(jnp.int32), 0, loads_desc.shape[-1] - 2)
    frac = k - jax.lax.stop_gradient(jnp.floor(k))
    return loads_desc[..., i] + frac * (loads_desc[..., i + 1] - loads_desc[..., i])


def scheduling_wave_loads(words, state, knobs: workingset.WorkingSetKnobs, config: workingset.WorkingSetConfig):
    """int32 [waves, planes]: pages of each in-order scheduling wave of the active set's read on each plane."""
    plane, valid = workingset.active_planes(words, state, knobs, config)
    chunk_plane, chunk_valid, _, _ = workingset.chunk_table(plane, valid, config)
    wave = jnp.arange(config.chunks, dtype=jnp.int32) // config.chunks_per_wave
    n_waves = -(-config.chunks // config.chunks_per_wave)
    loads = plane_loads(wave[:, None] * config.planes + chunk_plane, chunk_valid, n_waves * config.planes)
    return loads.reshape(n_waves, config.planes)


def offloaded_waves(loads: jax.Array, fraction: jax.Array, relax: Relax | None):
    """(waves, offloaded pages) of the scheduling waves ``loads`` [waves, planes], each wave's hot planes offloaded.

    Exact: ``collide.offload_hot_planes`` per wave and the plane maximum. Relaxed: the offload level
    at the straight-through rounded rank, and the soft maximum (empty waves cost nothing in both)."""
    if relax is None:
        served, off = jax.vmap(offload_hot_planes, in_axes=(0, None))(loads, fraction)
        return jnp.sum(max_load(served)).astype(jnp.float32), jnp.sum(off).astype(jnp.float32)
    planes = loads.shape[-1]
    x = loads.astype(jnp.float32)
    k = jnp.clip(ste_round(fraction * planes), 0.0, planes - 1.0)
    level = _level(-jnp.sort(-x, axis=-1), k)
    served = jnp.where(k > 0, jnp.minimum(x, level[:, None]), x)
    nonempty = jnp.sum(x, axis=-1) > 0
    waves = jnp.sum(jnp.where(nonempty, soft_max(served, relax.temperature), 0.0))
    return waves, jnp.sum(x - served)


def make(*, streams: int = 16, lam: float | None = None, planes: int = PLANES, slots: int = SLOTS,
         kv_bytes_per_token: float = KV_BYTES_PER_TOKEN, measurements: int = 2) -> Problem:
    """The ``collide-sram`` problem (see the module docstring); ``lam`` in waves per MB of SRAM."""
    streams = require_int("collide-sram", "streams", streams, 1, 1 << 16)
    lam = require_real("collide-sram", "lam", LAMBDA_WAVES_PER_MB if lam is None else lam, 0.0)
    require_int("collide-sram", "planes", planes, 2)
    require(planes & (planes - 1) == 0, "collide-sram", "planes", planes, "must be a power of two (G grid)")
    config = workingset.attention_config(planes, slots, kv_bytes_per_token, max_context_tokens=MAX_CONTEXT_TOKENS,
                                         measurements=measurements)
    inputs = context_pool()
    base = workingset.WorkingSetKnobs.make(kv_bytes_per_token, group_size=1)

    def outputs(values, seed, relax):
        placement = dataclasses.replace(base.placement, group_size=jnp.round(values["group_size"]).astype(jnp.int32),
                                        offload_fraction=jnp.asarray(values["offload_fraction"], jnp.float32))
        knobs = dataclasses.replace(base, placement=placement)
        simulate = lambda s, seed, knobs, inputs, config: workingset.simulate(  # noqa: E731
            s, seed, knobs, inputs, config, measure(relax))
        return batch.over_streams(simulate, streams)(seed, knobs, inputs, config)

    def objective(values, seed, relax):
        out = outputs(values, seed, relax)
        return jnp.mean(out.waves.astype(jnp.float32)) + lam * jnp.mean(out.sram_bytes.astype(jnp.float32)) / MB

    def report(values, seed):
        out = outputs(values, seed, None)
        return {"waves_per_read": jnp.mean(out.waves.astype(jnp.float32)),
                "sram_mb_per_read": jnp.mean(out.sram_bytes.astype(jnp.float32)) / MB,
                "objective": objective(values, seed, None)}

    def measure(relax):
        def one(words, state, knobs, config):
            waves, offloaded = offloaded_waves(scheduling_wave_loads(words, state, knobs, config),
                                               knobs.placement.offload_fraction, relax)
            z = jnp.float32(0)
            return workingset.AttentionRead(pages=z, max_to_avg_load=z, hot_plane_fraction=z, offload_max_to_avg_load=z,
                                            offloaded_pages=offloaded, sram_bytes=offloaded * config.page_bytes,
                                            waves=waves, ideal_waves=z, amplification=z)
        return one

    sizes = tuple(2**i for i in range(int(np.log2(planes)) + 1))
    knobs = (Knob("group_size", Log2Size(1, planes), sizes, "planes per plane group G (a power of two)"),
             Knob("offload_fraction", Fraction(0.0, 0.5), F_GRID, "fraction f of the most loaded planes offloaded"))
    return Problem(
        name="collide-sram", knobs=knobs, objective=objective,
        objective_label=f"read waves per read + {lam:g} · SRAM MB per read", streams=streams, report=report,
        defaults=TuneDefaults(init={"group_size": 32, "offload_fraction": 0.10}, learning_rate=0.3,
                              temperature_start=1.0, temperature_end=0.05, sigma=0.5, samples=4, fd_step=0.25),
        description=__doc__.splitlines()[0],
        extra={"lam_waves_per_mb": lam, "planes": planes, "slots": slots, "kv_bytes_per_token": kv_bytes_per_token,
               "measurements": measurements})
