"""The ``reads`` part: the HBF share of each pass's attention KV reads through plane collisions (HBFlex
§3.1, §5.2, §6.4; ``hbfjax.flash.reads.wave``).

Per pass, one scheduling wave of a layer's HBF KV read is drawn (``min(pages, planes)`` pages) under the
organisation's placement (random pages or plane-balanced stripes of G pages), placement-aware
scheduling and hot-plane offload (``policy.balanced``, ``group_size``, ``scheduled``,
``offload_fraction``); the wave's sensing rounds against the pages' link time (the HBF read cut)
give the read-wave factor that multiplies the time of the HBF share of every layer's KV read (a
request's KV pages of every layer share one stripe layout: cross-layer packing, HBFlex §5.4). The
layer reads ceil(pages / P) wave-sized parts, each as amplified as the sampled wave. Offloaded pages
are read from SRAM (HBFlex: they still cross the link, and hold SRAM during the pass) or from HBM
(FlashAccel, ``policy.offload_to_hbm``: they leave the HBF share). Under an SRAM split the offload
serves at most its share of the excess (``parts.sram``).

**Block-first runs.** Under immediate block-first writes (``naive-block``, HBFlex §6.3) a request's
consecutive pages fill one block on one plane, so a layer's pages of a request lie in runs of
:func:`run_pages` pages on one plane (a prefill chunk's KV of that layer: 72 pages of 4 KiB for a
512-token chunk of DeepSeek-V3), each run on a random plane. A wave is then ``min(runs, P)`` runs drawn
from the random-page law as balls, a plane with k runs reading k × run pages one after another
(``wave.runs_of``, ``wave.in_pages``); the ideal is the same pages spread perfectly, so the
amplification counts the clustering. Every other placement has runs of one page.

**Read laws.** The wave is drawn from its law, tabulated per (planes, placement, scheduling, G, f)
(``wave.tabulate``: O(1) a pass), or exactly (``ReadsConfig.wave_draw = "exact"``, O(P) a pass, for
P = ``ReadsConfig.planes`` packages only). Tabulating costs about a second on a CPU, so the laws are
*inputs* of a run (``ServeInputs.read_laws``, built on the host by :func:`read_laws` and cached by
key), not knobs: each run looks up its own law by the values it was drawn for (:func:`law_key`), so a
law can never be stale; a run whose law is missing sets ``ServeOutput.missing_inputs`` (refused by
the report).

Knobs read: ``org`` (planes, page, tR, the read cut), ``policy`` (placement, scheduling, offload, block-first
writes), the batcher's chunk (block-first runs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import rng
from hbfjax.flash.reads import wave
from hbfjax.memory import delivery, hbf_packages
from hbfjax.salts import Salt
from hbfjax.serve.part import Part, RunView
from hbfjax.serve.parts import sram
from hbfjax.validate import require, require_choice, require_int

WAVE_DRAWS = ("table", "exact")
KEY_FIELDS = ("planes", "balanced", "scheduled", "group_size", "offload_fraction")


@dataclass(frozen=True)
class ReadsConfig:
    """Static shape of the reads part: the bound of an exact wave sample and how waves are drawn."""

    planes: int = 3072  # static bound of the exact wave sample (the largest HBFlex package's planes)
    max_group_size: int = 512
    wave_draw: str = "table"  # "table": each pass's wave from its tabulated law; "exact": one wave_sample a pass

    def __post_init__(self):
        c = type(self).__name__
        require_int(c, "planes", self.planes, 1)
        require_choice(c, "wave_draw", self.wave_draw, WAVE_DRAWS)

    @property
    def wave(self) -> wave.WaveConfig:
        return wave.WaveConfig(planes=self.planes, max_group_size=self.max_group_size)


class ReadLaws(NamedTuple):
    """Tabulated wave laws (``wave.WaveTable`` fields stacked on a leading axis of N laws), each with the
    key it was drawn for."""

    key: jax.Array  # float32[N, 5] KEY_FIELDS of each law
    table: wave.WaveTable  # fields [N, ...]


def law_key(org, policy, offload_fraction=None) -> jax.Array:
    """float32[5]: the values a package's wave law depends on (KEY_FIELDS); ``offload_fraction``
    overrides the policy's (0: the law without offload, an SRAM split's bare law)."""
    f = policy.offload_fraction if offload_fraction is None else offload_fraction
    return jnp.stack([jnp.round(hbf_packages.planes(org)), policy.balanced, policy.scheduled,
                      jnp.round(policy.group_size), jnp.asarray(f, jnp.float32)]).astype(jnp.float32)


@functools.lru_cache(maxsize=256)
def _tabulate(planes: int, balanced: float, scheduled: float, group_size: int, offload: float) -> wave.WaveTable:
    knobs = wave.WaveKnobs.make(balanced=balanced, scheduled=scheduled, group_size=group_size, offload_fraction=offload)
    return jax.tree_util.tree_map(np.asarray, wave.tabulate(knobs, planes))


def needed_keys(knobs) -> list[tuple]:
    """Host keys of the laws a system's knobs need: its own, and with an SRAM split the law at f = 0."""
    keys = [np.asarray(law_key(knobs.org, knobs.policy))]
    if knobs.sram_shares is not None:
        keys.append(np.asarray(law_key(knobs.org, knobs.policy, 0.0)))
    return [tuple(float(v) for v in k) for k in keys]


def read_laws(knobs_points, pad_to: int | None = None) -> ReadLaws:
    """The laws that ``knobs_points`` (ServeKnobs with an organisation and policy) need, each once, in
    first-seen order, padded to ``pad_to`` laws by repeating the last (host; each law tabulated once
    per process)."""
    keys = list(dict.fromkeys(k for kn in knobs_points for k in needed_keys(kn)))
    require(bool(keys), "read_laws", "knobs_points", len(keys), "need at least one point")
    keys += [keys[-1]] * max(0, (pad_to or 0) - len(keys))
    tables = [_tabulate(int(p), b, s, int(g), f) for p, b, s, g, f in keys]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs)), *tables)
    return ReadLaws(key=jnp.asarray(np.asarray(keys, np.float32)), table=stacked)


def lookup(laws: ReadLaws, key: jax.Array) -> tuple[wave.WaveTable, jax.Array]:
    """(the law drawn for ``key``, bool[] found); a missing key gives the first law and found False."""
    match = jnp.all(laws.key == key[None, :], axis=1)
    idx = jnp.argmax(match)
    return jax.tree_util.tree_map(lambda a: a[idx], laws.table), match.any()


def wave_knobs(policy) -> wave.WaveKnobs:
    return wave.WaveKnobs(balanced=policy.balanced, scheduled=policy.scheduled,
                          group_size=policy.group_size.astype(jnp.int32), offload_fraction=policy.offload_fraction)


def run_pages(knobs, config) -> jax.Array:
    """float32[]: pages of one layer that lie together in a block of a request's KV, read one after another
    on its plane. Under immediate block-first writes (``policy.block_first`` with ``buffered`` 0, HBFlex
    §6.3's naive baseline) a request's pages fill its open block in write order, layer by layer within a
    pass: a prefill chunk's KV of one layer is ceil(chunk tokens × KV bytes per token and layer / page)
    consecutive pages, and where a chunk's pages of every layer are fewer than a block, the block holds
    several chunks, ``pages_per_block / layers`` pages of each layer (floor; at most a block). Taken at the
    batcher's chunk (``chunk_tokens``): every page is counted as prefill-written (an agent's context is
    mostly prompt; decode-written pages, one a layer and token, lie ``pages_per_block / layers`` to a block,
    fewer a run, so their reads are over-counted where the chunk's runs are longer). 1 otherwise: each
    page on its own plane."""
    policy, model = knobs.policy, config.model
    per_block = float(config.blocks.pages_per_block)
    chunk = knobs.batcher.chunk_tokens.astype(jnp.float32)
    per_chunk = jnp.ceil(chunk * float(model.kv_bytes_per_token_layer) / knobs.org.page_bytes)
    together = jnp.clip(jnp.maximum(per_chunk, np.floor(per_block / model.layers)), 1.0, per_block)
    clustered = (policy.block_first > 0.5) & (policy.buffered < 0.5)
    return jnp.where(clustered, together, 1.0).astype(jnp.float32)


def read_pages_per_layer(hbf_tokens, batch, model, page_bytes) -> jax.Array:
    """float32[] pages one layer's attention reads from HBF in this pass (decode reads the whole KV,
    a chunk its prefix)."""
    reading = batch.decode_mask | batch.chunk_mask
    tokens = jnp.where(reading, hbf_tokens, 0).sum().astype(jnp.float32)
    return jnp.ceil(tokens * float(model.kv_bytes_per_token_layer) / page_bytes)


class ReadTotals(NamedTuple):
    """Per-run sums of the reads part (float32[] each)."""

    read_waves: jax.Array  # Σ over passes of layers × wave-sized reads × the sampled wave's sensing rounds
    ideal_waves: jax.Array  # the same with perfectly balanced planes (HBFlex §6.4's theoretical minimum)
    kv_read_stall_us: jax.Array  # Σ layers × max(waves × tR − bytes / rate, 0): what amplification adds
    offloaded_bytes: jax.Array  # KV read from SRAM or HBM instead of hot planes (every layer)


def part(knobs, config, run: RunView) -> Part:
    org, policy, model, rc = knobs.org, knobs.policy, config.model, config.reads
    require(knobs.sram_shares is None or rc.wave_draw == "table", "ReadsConfig", "wave_draw", rc.wave_draw,
            "an SRAM split needs the tabulated wave law ('table')")
    page, n_planes = org.page_bytes, hbf_packages.planes(org)
    hbf_cut_gbps = jnp.maximum(delivery.read_cuts(org).hbf_gbps, 1e-9)
    layers = float(model.layers)
    budget = sram.plan(knobs, config)
    laws = run.inputs.read_laws
    if rc.wave_draw == "table":
        require(laws is not None, "parts.reads", "inputs.read_laws", None,
                "the tabulated wave laws must be in the run's inputs (parts.reads.read_laws)")
        table, found = lookup(laws, law_key(org, policy))
        if knobs.sram_shares is not None:
            bare_table, bare_found = lookup(laws, law_key(org, policy, 0.0))
            found = found & bare_found
    else:
        found = jnp.bool_(True)

    together = run_pages(knobs, config)  # 1 unless block-first: then runs of a block's pages share a plane

    def reads(s, view, record):
        pages = read_pages_per_layer(record.hbf_tokens, view.batch, model, page)
        runs, reads_per_layer = wave.runs_of(pages, together, n_planes)  # runs = min(pages, P) when together = 1
        if rc.wave_draw == "exact":
            sample = wave.wave_sample((*view.words, view.draw), runs.astype(jnp.int32), wave_knobs(policy), rc.wave)
            waves, offloaded = sample.waves.astype(jnp.float32), sample.offloaded_pages.astype(jnp.float32)
            ideal = sample.ideal_waves.astype(jnp.float32)
        else:
            u = rng.uniform01(rng.mix(*view.words, view.draw, Salt.WAVE_DRAW))
            waves, offloaded = wave.draw(table, runs, u)
            ideal = wave.draw_ideal(table, runs, u)  # interpolated as the waves are: waves >= ideal
        waves, offloaded, ideal = wave.in_pages(waves, offloaded, ideal, runs, together, pages, n_planes)
        n_wave = wave.wave_pages(runs, together, pages)
        if budget.offload_cap_bytes is not None:  # the offload share serves at most its bytes of the excess
            bare, _ = wave.draw(bare_table, runs, u)
            bare_ideal = wave.draw_ideal(bare_table, runs, u)
            bare, _, bare_ideal = wave.in_pages(bare, 0.0, bare_ideal, runs, together, pages, n_planes)
            excess = offloaded * page * reads_per_layer
            served = sram.capped(excess, budget.offload_cap_bytes, budget.temperature_pages, page)
            rho = jnp.where((excess > 0) & (policy.offload_to_hbm < 0.5), served / jnp.maximum(excess, 1e-30), 1.0)
            waves, offloaded = waves + (1.0 - rho) * jnp.maximum(bare - waves, 0.0), rho * offloaded
            ideal = ideal + (1.0 - rho) * jnp.maximum(bare_ideal - ideal, 0.0)
        # pages offloaded to SRAM still cross the link, those offloaded to HBM (FlashAccel) leave the HBF share
        off = jnp.where(n_wave > 0, offloaded / jnp.maximum(n_wave, 1.0), 0.0)
        to_hbm = policy.offload_to_hbm * off
        wave_us = reads_per_layer * waves * org.t_read_us
        byte_us = pages * (1.0 - to_hbm) * page * 1e-3 / hbf_cut_gbps
        factor = jnp.where(byte_us > 0, jnp.maximum(wave_us / jnp.maximum(byte_us, 1e-30), 1.0), 1.0)
        shares = tuple(h + (1.0 - h) * to_hbm for h in record.hbm_share)
        sram_held = (1.0 - policy.offload_to_hbm) * offloaded * page * reads_per_layer
        add = ReadTotals(read_waves=layers * reads_per_layer * waves, ideal_waves=layers * reads_per_layer * ideal,
                         kv_read_stall_us=layers * jnp.maximum(wave_us - byte_us, 0.0),
                         offloaded_bytes=layers * offloaded * page * reads_per_layer)
        return s, record._replace(hbm_share=shares, hbf_factor=factor, sram_bytes=record.sram_bytes + sram_held), add

    return Part(init=lambda: (), reads=reads, totals=ReadTotals, missing_inputs=~found)


def report(own, out) -> dict:
    """Host ``{key: float64[S]}`` per stream (HBFlex §6.4): the read-wave amplification of the HBF KV
    reads (NaN for a run that read no HBF KV) and the share of the busy time it added."""
    t = {k: np.asarray(v, np.float64) for k, v in own.totals._asdict().items()}
    busy = np.asarray(out.totals.busy_us, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"read_wave_amplification": np.where(t["ideal_waves"] > 0, t["read_waves"] / t["ideal_waves"], np.nan),
                "kv_read_stall_fraction": np.where(busy > 0, t["kv_read_stall_us"] / busy, 0.0),
                "offloaded_gb": t["offloaded_bytes"] * 1e-9}
