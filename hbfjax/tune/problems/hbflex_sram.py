"""Problem ``hbflex-sram``: the HBFlex base-die SRAM split between hot-plane offload, weight prefetch and
KV buffering for a serving workload (issue 13 problem 4; HBFlex §5.2–5.3, §6.5 Fig. 20).

The package SRAM (HBFlex §6.1: 40 MB per stack) less one GC migration block (the config's pages per
block) is divided into three shares (``ServeKnobs.sram_shares``; ``hbfjax.serve.parts.sram``, whose
docstring states every modelling choice the paper does not): the offload share caps the hot-plane excess
served from SRAM per layer read (more waves where it binds), the prefetch share holds part of the
prefetch group (shorter write windows where it binds), the KV share is the window-aware writeback's
buffer (forced, stalling writebacks where it binds).

The run is HBFlex's named system (``hbflex``, ``hbfjax.serve.systems``) serving the settings' fixed batch,
its package's SRAM, offload fraction and plane-group size changed, streams vmapped by
``hbfjax.batch.over_streams``.

Objective (MINIMISED): −throughput in tokens/s, the output tokens of a fixed batch of long-context
requests over the span from the first arrival to the last finish (``hbfjax.serve.jit_metrics``, the
in-jit form of ``metrics.per_stream``'s ``throughput_tokens_per_s``; all arrive at t = 0 and no GC runs,
so the span is the busy time), averaged over the streams.
The synthetic workload by default (lognormal prompt lengths around ``prompt_tokens``): the real
traces are absent in CI.

Relaxation (``relax`` given; ``engine.ServeRelax.sram_pages``): the temperature is in **pages** (the
package's 4 KiB HBF page) in every relaxed quantity: the three caps ``min(need, cap)`` as ``soft_min``
(bias ≤ t · log 2 pages below the exact min), the forced-writeback indicator as ``soft_step`` on the
buffer's overflow in pages (bias ≤ exp(−|overflow| / t) per layer; an overflow is a fraction of one
layer's new KV, so this bias vanishes only for t well below it), its stripe round-up and the program
rounds straight-through (forward exact, derivative of the continuous surrogate); the drain stays exact
(``hbf_writes``). The schedule runs 64 → 4 pages: a forced writeback near its threshold multiplies the KV
buffer's tangent by up to 1 − G / (4t) − 1/2 in magnitude (G = 32-page stripes), and on the default run
the forward derivatives overflow to NaN at t ≤ 2 pages (finite at 4). The offload share's effect (fewer
sensing rounds) is continuous in the exact simulation already; the prefetch share acts only through whole
tPROG rounds of the write window, a step with zero derivative. The rollout is a ``lax.while_loop``:
``reverse_mode=False``.

Landscape (default settings, 2 streams, seed 0; 231 simplex points at 0.05, printed by the tests'
companion script in the report): 174.3 tokens/s at (0, 1, 0) to 184.63 at (0.70, 0, 0.30). Offload is
worth most (hot-plane excess served from SRAM: read-wave amplification 2.0 → 1.04, the decode KV
reads are sensing-bound on Qwen3's GQA attention) and saturates near a 0.65 share, where the SRAM
holds the f = 0.2 hottest planes' whole excess; the KV buffer matters only below ~0.1 (a starved
buffer forces a writeback every layer); the prefetch group (75 MB) cannot fit in 48 MB and a partial
one lengthens no decode window by a whole tPROG, so prefetch buys nothing and the optimum sits on the
prefetch = 0 edge, interior in offload against KV. The default start (0.05, 0.75, 0.20) is 180.5
(2.2 % below the grid optimum).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp

from hbfjax import batch as hb
from hbfjax.memory import hbf_packages
from hbfjax.serve import engine, jit_metrics, systems
from hbfjax.serve.parts import sram
from hbfjax.tune.problem import Knob, Problem, Split, TuneDefaults
from hbfjax.validate import require, require_int, require_real
from hbfjax.workload import models
from hbfjax.workload import requests as rq

NAME = "hbflex-sram"
SYSTEM = "hbflex"
KNOB = "sram_split"  # shares (offload, prefetch, KV buffer) of the usable SRAM
GRID_STEP = 0.05  # the simplex at 0.05: 231 points
INIT = (0.05, 0.75, 0.2)  # the default start (and the shares the problem's inputs are built at)


def simplex(step: float) -> tuple:
    """Every (offload, prefetch, KV) share triple on the simplex at ``step`` (float tuples summing to 1)."""
    n = int(round(1.0 / step))
    return tuple((i / n, j / n, (n - i - j) / n) for i, j in itertools.product(range(n + 1), repeat=2) if i + j <= n)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The serving run the split is tuned for (static; validated)."""

    model: str | models.ModelSpec = "qwen3-235b-a22b"  # a preset name or a ModelSpec (GQA: memory-bound attention)
    slots: int = 32
    requests: int = 32
    prompt_tokens: int = 4096  # lognormal median of the prompt length
    prompt_sigma: float = 0.5
    output_tokens: int = 512
    sram_mb: float = 48.0  # package SRAM (HBFlex §6.1: 240 MB); smaller, so the three users contend
    offload_fraction: float = 0.2  # f of the hottest planes offloaded (HBFlex §6.5 sweeps it; 0.1 by default)
    group_size: int = 32

    def __post_init__(self):
        c = type(self).__name__
        require(isinstance(self.model, models.ModelSpec) or self.model in models.PRESETS, c, "model", self.model,
                f"must be a ModelSpec or one of {tuple(models.PRESETS)}")
        require_int(c, "slots", self.slots, 1, 256)
        require_int(c, "requests", self.requests, 1, 4096)
        require_int(c, "prompt_tokens", self.prompt_tokens, 1, 1 << 20)
        require_real(c, "prompt_sigma", self.prompt_sigma, 0.0, 2.0)
        require_int(c, "output_tokens", self.output_tokens, 2, 1 << 16)
        require_real(c, "sram_mb", self.sram_mb, 0.0, 1e5, lo_open=True)
        require_real(c, "offload_fraction", self.offload_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        require_int(c, "group_size", self.group_size, 1, 512)


def package(s: Settings) -> hbf_packages.Package:
    """HBFlex's package with the settings' SRAM, offload fraction and plane-group size."""
    base = hbf_packages.hbflex()
    org = dataclasses.replace(base.org, hbf_sram_region_bytes=jnp.float32(
        s.sram_mb * 1e6 / float(base.org.hbf_stacks) / float(base.org.hbf_sram_regions)))
    policy = dataclasses.replace(base.policy, offload_fraction=jnp.float32(s.offload_fraction),
                                 group_size=jnp.float32(s.group_size))
    return hbf_packages.Package(org, policy)


def scenario(s: Settings) -> systems.Scenario:
    """The settings' fixed batch (lognormal prompts around ``prompt_tokens``) with an SRAM split (the
    knob sets its shares)."""
    prompt = rq.LengthKnobs.make(s.prompt_tokens, median=s.prompt_tokens, sigma=s.prompt_sigma,
                                 owner="RequestKnobs.prompt")
    output = rq.LengthKnobs.make(s.output_tokens, owner="RequestKnobs.output")
    return systems.Scenario(model=s.model, requests=rq.RequestsConfig(requests=s.requests, arrivals="batch",
                                                                      prompt_lengths="lognormal",
                                                                      output_lengths="fixed"),
                            request_knobs=rq.RequestKnobs.make(batch=s.requests, prompt=prompt, output=output),
                            slots=s.slots, sram_shares=INIT, max_iterations=100_000, scan_chunk=16)


def family(s: Settings) -> systems.Family:
    """HBFlex serving the settings (:func:`scenario`), its one point on :func:`package`, the inputs rebuilt
    for it (its wave laws follow the offload fraction and group size)."""
    fam = systems.single(SYSTEM, scenario(s))
    pkg = package(s)
    return fam.with_points([dataclasses.replace(fam.points[0], org=pkg.org, policy=pkg.policy)])


def at_split(knobs: engine.ServeKnobs, shares, temperature=None) -> engine.ServeKnobs:
    """``knobs`` with the SRAM split ``shares`` (f32[3]), relaxed at ``temperature`` pages (None: exact)."""
    relax = None if temperature is None else engine.ServeRelax(sram_pages=temperature)
    return dataclasses.replace(knobs, sram_shares=jnp.asarray(shares, jnp.float32), relax=relax)


def _runner(s: Settings, streams: int):
    """(run(values, seed, temperature) -> ServeOutput with a leading stream axis, the family)."""
    fam = family(s)
    over_streams = hb.over_streams(fam.simulate, streams)

    def run(values, seed, temperature):
        return over_streams(seed, at_split(fam.points[0], values[KNOB], temperature), fam.inputs, fam.config)

    return run, fam


def make(*, streams: int = 2, lam: float | None = None, **settings) -> Problem:
    """The ``hbflex-sram`` problem over ``streams`` streams; ``settings``: :class:`Settings` fields.
    ``lam`` has no role here (no penalty: the split is a budget by construction) and must be None."""
    require_int(NAME, "streams", streams, 1, 4096)
    require(lam is None, NAME, "lambda", lam, "has no role in this problem (the shares are a budget)")
    s = Settings(**settings)
    run, fam = _runner(s, streams)
    org, cfg = fam.points[0].org, fam.config
    throughput = jax.vmap(jit_metrics.throughput_tokens_per_s)

    def objective(values, seed, relax):
        out = run(values, seed, None if relax is None else relax.temperature)
        return -jnp.mean(throughput(out))

    def report(values, seed):
        out = run(values, seed, None)
        t = out.totals
        reads = out.parts["reads"].totals
        passes = jnp.maximum(t.passes, 1.0)
        tokens = jnp.where(jit_metrics.measured(out), out.tokens_out, 0).sum(axis=-1).astype(jnp.float32)
        m = jnp.mean
        return {
            "throughput_tokens_per_s": m(throughput(out)),
            "busy_s": m(t.busy_us) * 1e-6,
            "mean_iteration_ms": m(t.busy_us / passes) * 1e-3,
            "forced_writebacks": m(out.parts["writes"].totals.forced_writebacks),
            "write_stall_s": m(t.write_stall_us) * 1e-6,
            "offloaded_mb": m(reads.offloaded_bytes) * 1e-6,
            "read_wave_amplification": m(reads.read_waves / jnp.maximum(reads.ideal_waves, 1e-30)),
            "sram_peak_mb": m(out.parts["sram"].totals.sram_peak_bytes) * 1e-6,
            "tpot_ms": m(jax.vmap(jit_metrics.mean_tpot_ms)(out)),
            "output_tokens": m(tokens),
        }

    gc_buffer = sram.gc_buffer_bytes(float(org.page_bytes), cfg.blocks.pages_per_block)
    usable_mb = (s.sram_mb * 1e6 - gc_buffer) * 1e-6
    require(usable_mb > 0.0, "Settings", "sram_mb", s.sram_mb,
            f"must exceed the GC buffer it holds ({gc_buffer * 1e-6:.2f} MB: {sram.GC_BUFFER_BLOCKS} erase block "
            f"of {cfg.blocks.pages_per_block} pages), or nothing is left to split")
    knob = Knob(KNOB, Split(3), simplex(GRID_STEP),
                help=f"shares of {usable_mb:.1f} MB of SRAM: hot-plane offload, weight prefetch, KV buffer")
    defaults = TuneDefaults(init={KNOB: INIT}, steps=12, learning_rate=0.3, temperature_start=64.0,
                            temperature_end=4.0, sigma=0.3, samples=4, fd_step=0.25)
    return Problem(name=NAME, knobs=(knob,), objective=objective,
                   objective_label="−throughput (tokens/s)", defaults=defaults, streams=streams, report=report,
                   reverse_mode=False, minimise=False,
                   description="HBFlex SRAM split (offload, prefetch, KV buffer) for a long-context serving batch",
                   extra={**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)}, "model": cfg.model.name,
                          "prefetch_group_mb": sram.prefetch_bytes(cfg.model) * 1e-6,
                          "usable_sram_mb": usable_mb})

