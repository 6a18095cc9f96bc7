"""Stated writeback scenarios: timelines and knobs for the HBFlex and DASH presets, for ``hbfjax writeback``
and the writeback figures, which study the program/read interference of one layer structure apart
from the serving engine (whose passes build their own windows: ``parts.writes``, ``layer_time.kv_writes``).
It composes model presets with the physics' timelines (``hbfjax.flash.programs.timeline`` only takes
arrays), which is serving-level work: the module sits here, above both the workload and the physics.

* ``hbflex``: DeepSeek-V4-Pro-like decode on one H200 with the all-HBF package (HBFlex §5.3, §6.4):
  61 layers, ≈5 KB of KV per token in all (HBFlex §5.3) → 82 B per token per layer; stage times
  from a roofline estimate (``stage_times``; estimated, not from a public config). Plane slots are
  plane groups of 32 planes (3,072 planes = 96 slots).
* ``dash``: Llama 4 Maverick, B = 1, 4K/1M (DASH §VI-F): 48 layers, 8 KV heads × 128 × 2 (K, V) × 2 B
  = 4 KiB per token per layer; attention and projection weights come from HBM (no HBF read); the
  next HBF read after the QKV projection is the expert weights, after attention, output projection
  and routing; decode KV spills one 16 MiB page wave at a time once HBM holds its 24.46 GB budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hbfjax.flash.programs import writeback as wb
from hbfjax.flash.programs.timeline import Timeline, make_timeline
from hbfjax.hardware import preset
from hbfjax.validate import ConfigError
from hbfjax.workload import models

# The standard layer of the stated scenarios (HBFlex Fig. 13a): weights of attention projections,
# the QKV projection (new KV exists at its end), the KV read, attention, expert weights, expert FFN.
STANDARD_SEGMENTS = ("attn_weight_read", "qkv_proj", "kv_read", "attention", "expert_weight_read", "ffn")



_V4_PRO = models.preset("deepseek-v4-pro")
_MAVERICK = models.preset("llama4-maverick")
HBFLEX_LAYERS = _V4_PRO.layers  # 61
HBFLEX_KV_BYTES_PER_TOKEN = _V4_PRO.kv_bytes_per_token  # HBFlex §5.3: ≈5 KB per token, all layers
HBFLEX_PLANE_GROUP = 32
DASH_LAYERS = _MAVERICK.layers  # 48
DASH_KV_BYTES_PER_TOKEN_LAYER = _MAVERICK.kv_bytes_per_token_layer  # 8 KV heads × 128 × (K, V) × BF16 = 4 KiB
DASH_DECODE_KV_BUDGET_BYTES = 24.46e9  # DASH §VI-F
DASH_SPILLED_KV_BYTES = 172.96e9  # DASH §VI-F: decode KV that ends in HBF over the 1M-token run


def standard_timeline(layers: int, kv_bytes_per_token_layer: float, plane_slots: int, *,
                      attn_weight_read_us: float, qkv_us: float, kv_read_us: float, attention_us: float,
                      expert_weight_read_us: float, ffn_us: float, prefill_qkv_us_per_token: float = 0.0,
                      prefill_attention_us_per_token: float = 0.0, prefill_ffn_us_per_token: float = 0.0,
                      kv_touch_fraction: float = 1.0) -> Timeline:
    """Identical layers of :data:`STANDARD_SEGMENTS` (HBFlex Fig. 13a); weight reads touch every plane
    and are prefetchable, the KV read touches ``kv_touch_fraction`` of the planes."""
    if layers < 1:
        raise ConfigError(f"standard_timeline.layers = {layers!r}: must be >= 1")
    row = np.array([attn_weight_read_us, qkv_us, kv_read_us, attention_us, expert_weight_read_us, ffn_us], np.float32)
    pre = np.array([0, prefill_qkv_us_per_token, 0, prefill_attention_us_per_token, 0, prefill_ffn_us_per_token],
                   np.float32)
    tile = lambda r: np.tile(r, (layers, 1))  # noqa: E731
    return make_timeline(
        tile(row), tile(np.array([1, 0, 1, 0, 1, 0], bool)), tile(np.array([0, 1, 0, 0, 0, 0], bool)),
        kv_bytes_per_token_layer, plane_slots, prefill_us_per_token=tile(pre),
        touch_fraction=tile(np.array([1, 0, kv_touch_fraction, 0, 1, 0], np.float32)),
        prefetchable=tile(np.array([1, 0, 0, 0, 1, 0], bool)))


def segment(name: str) -> int:
    """Index of a named segment of the standard layer."""
    return STANDARD_SEGMENTS.index(name)


@dataclass(frozen=True)
class StageModel:
    """Roofline stage times per layer (µs): fixed launch cost + per-token compute (estimated for
    DeepSeek-V4-Pro with TP2 on an H200 at ≈600 TFLOPS effective; HBFlex §6.1)."""

    launch_us: float = 5.0
    qkv_us_per_token: float = 0.47  # ≈140 M activated attention-projection params per GPU per layer
    attention_us_per_token: float = 0.25  # attention core at a few-K context
    ffn_us_per_token: float = 0.87  # ≈260 M activated expert params per GPU per layer
    attn_weight_read_us: float = 18.0  # ≈53 MB of Q/KV projections (HBFlex §5.3: 106 MB, TP2) at 2.93 TB/s
    expert_weight_read_us: float = 100.0  # activated experts of a decode batch at 2.93 TB/s
    kv_read_us_per_request: float = 0.6  # ≈20K-token context × 82 B per layer at 2.93 TB/s

    def stage_times(self, tokens: float) -> dict:
        """Compute time of each stage for ``tokens`` tokens in the pass (HBFlex Fig. 9)."""
        return {"qkv_proj": self.launch_us + tokens * self.qkv_us_per_token,
                "attention": self.launch_us + tokens * self.attention_us_per_token,
                "ffn": self.launch_us + tokens * self.ffn_us_per_token}


def hbflex_knobs(decode_requests: float = 64, prefill_chunk_tokens: float = 512, prefill_prob: float = 0.3, *,
                 t_prog_us: float | None = None, sram_kv_bytes: float = 240e6 - 169e6, prefetch: bool = True,
                 stripe_pages: float = HBFLEX_PLANE_GROUP, stages: StageModel = StageModel(),
                 kv_bytes_per_token_layer: float = HBFLEX_KV_BYTES_PER_TOKEN / HBFLEX_LAYERS,
                 layers: int = HBFLEX_LAYERS) -> wb.WritebackKnobs:
    """Knobs for the hbflex scenario (plane slots: ``knobs.timeline.plane_slots``). The SRAM KV budget defaults to the
    240 MB package SRAM minus the 63 + 106 MB prefetch groups of HBFlex §5.3."""
    hbf = preset("hbflex").hbf
    slots = hbf.planes // HBFLEX_PLANE_GROUP
    d = stages.stage_times(decode_requests)
    tl = standard_timeline(
        layers, kv_bytes_per_token_layer, slots, attn_weight_read_us=stages.attn_weight_read_us,
        qkv_us=d["qkv_proj"], kv_read_us=stages.kv_read_us_per_request * decode_requests,
        attention_us=d["attention"], expert_weight_read_us=stages.expert_weight_read_us, ffn_us=d["ffn"],
        prefill_qkv_us_per_token=stages.qkv_us_per_token, prefill_attention_us_per_token=stages.attention_us_per_token,
        prefill_ffn_us_per_token=stages.ffn_us_per_token)
    fk = wb.FlashKnobs.make(t_prog_us=hbf.t_prog_us if t_prog_us is None else t_prog_us, page_bytes=hbf.page_bytes,
                        planes_per_slot=HBFLEX_PLANE_GROUP, stripe_pages=stripe_pages,
                        buffer_capacity_pages=sram_kv_bytes / hbf.page_bytes, wave_pages=hbf.parallel_units,
                        prefetch=1.0 if prefetch else 0.0)
    return wb.WritebackKnobs(tl, fk, wb.WorkloadKnobs.make(decode_requests, prefill_chunk_tokens, prefill_prob))


def dash_knobs(*, t_prog_us: float | None = None, attention_us: float = 600.0, decode_requests: float = 1,
               plane_slots: int = 128) -> wb.WritebackKnobs:
    """Knobs for the DASH §VI-F scenario (decode phase, HBM full). ``attention_us``: mean attention time
    per layer over the run (≈ KV bytes per layer at half the final context over the Direct + Relay
    rate, estimated)."""
    sysd = preset("dash")
    hbf = sysd.hbf
    tl = standard_timeline(
        DASH_LAYERS, DASH_KV_BYTES_PER_TOKEN_LAYER, plane_slots, attn_weight_read_us=5.0, qkv_us=10.0,
        kv_read_us=0.0, attention_us=attention_us + 15.0, expert_weight_read_us=60.0, ffn_us=20.0,
        kv_touch_fraction=0.0)
    # attention/QKV weights come from HBM (DASH §V-B): that read touches no HBF plane
    tl = dataclasses.replace(tl, touch_fraction=tl.touch_fraction.at[:, segment("attn_weight_read")].set(0.0))
    wave = hbf.page_wave_bytes // hbf.page_bytes
    budget = DASH_DECODE_KV_BUDGET_BYTES // hbf.page_bytes
    fk = wb.FlashKnobs.make(t_prog_us=hbf.t_prog_us if t_prog_us is None else t_prog_us, page_bytes=hbf.page_bytes,
                        planes_per_slot=hbf.parallel_units / plane_slots, stripe_pages=wave,
                        buffer_capacity_pages=budget, buffer_base_pages=budget - wave, wave_pages=wave,
                        link_bw_gbps=hbf.link_bw_gbps, prefetch=0.0)
    return wb.WritebackKnobs(tl, fk, wb.WorkloadKnobs.make(decode_requests, 0.0, 0.0))


def config_for(knobs: wb.WritebackKnobs, policy: str, iterations: int, warmup_iterations: int = 0) -> wb.WritebackConfig:
    tl = knobs.timeline
    return wb.WritebackConfig(policy=policy, layers=tl.layers, segments=tl.segments, plane_slots=tl.plane_slots,
                              iterations=iterations, warmup_iterations=warmup_iterations)
