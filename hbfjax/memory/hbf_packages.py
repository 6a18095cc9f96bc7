"""The memory organisations of HBFlex's evaluation as data: the all-HBF package and its five baselines
under one package-area budget (HBFlex §2.3, §4, §6.1, Table 1; DESIGN.md §5 "A memory organisation is
data").

An organisation here is a pair: the hardware (:class:`hbfjax.memory.organisations.OrgKnobs`, the same
pytree the DASH organisations use: links, stacks, geometry, SRAM, where each data kind lives) and the
KV-management policy (:class:`PolicyKnobs`: placement, runtime read balancing, writeback, reclamation,
each a traced 0/1 switch or value). Every leaf is a float32 array, so the six organisations and the
ablation stages of HBFlex Table 2 stack on one knob axis, compile once and compare on common random
numbers.

Hardware (HBFlex §6.1): H200-class GPUs; a full HBF stack has 16 dies × 32 planes, 512 blocks × 512
pages of 4 KiB per plane, tR 4 µs, tPROG 75 µs, 488 GB/s read and 27.2 GB/s program bandwidth, 40 MB of
base-die SRAM; an HBM3e stack 24 GB at 0.8 TB/s. The package budget is six stack sites:

* ``hbflex`` and ``naive-hbf``: six full HBF stacks (3,072 planes, 2.93 TB/s), no HBM;
* ``fa-cli`` (FlashAccel co-located): five full HBF stacks and one HBM stack beside the GPU;
* ``h3``, ``fa-csi`` (cascaded) and ``is`` (integrated stack): six stacks each holding ¼ of an HBM
  stack's capacity (6 GB, its 0.8 TB/s interface unchanged) and ¾ of an HBF stack's capacity, planes and
  read/program bandwidth (HBFlex §6.1 "normalized configuration"); HBF data reach the GPU through the
  stack's HBM-side interface (the Relay route of :mod:`hbfjax.memory.delivery`).

Placement (``OrgKnobs.place``): ``hbflex``/``naive-hbf`` hold everything in HBF; ``h3`` holds the
weights in HBF and request KV in HBM (HBFlex §2.3: "placing weights and read-only shared KV in HBF
while retaining generated KV in HBM"); FlashAccel holds weights and KV in HBF with decode KV buffered in
HBM and written back (§2.3 "using HBM for buffering and read balancing"); ``is`` holds the weights in
HBF and KV in HBM, spilling to HBF. Retained session KV (prefix reuse) lives in HBF in every
organisation (H3's "read-only shared KV").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import hardware
from hbfjax.memory import organisations as orgs
from hbfjax.memory.organisations import DECODE_KV, DENSE_WEIGHTS, EXPERT_WEIGHTS, HBF, HBM, PREFILL_KV, OrgKnobs
from hbfjax.validate import ConfigError, require, require_int, require_real

HBM3E_STACK_BYTES = 24e9  # HBFlex §6.1 (JEDEC HBM3e, 8 dies)
HBM3E_STACK_GBPS = 800.0  # HBFlex §6.1
STACK_SITES = 6  # HBFlex §6.1: six stacks per GPU
CASCADED_HBM_SHARE = 0.25  # HBFlex §6.1: ¼ of the budget HBM, ¾ HBF
MAX_GROUP = 2**16
_FLAGS = ("balanced", "scheduled", "offload_to_hbm", "buffered", "window_aware", "prefetch", "lifetime_aware",
          "hbf_request_kv", "block_first")


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PolicyKnobs:
    """KV management in HBF (traced; every leaf float32[]). HBFlex §5: placement and read balancing
    (§5.2), window-aware writeback (§5.3), lifetime-aware reclamation (§5.4)."""

    balanced: jax.Array  # 1: plane-balanced placement (stripes of G pages over plane groups); 0: random pages
    group_size: jax.Array  # G planes per plane group = pages per physical stripe
    scheduled: jax.Array  # 1: placement-aware attention-chunk scheduling (§5.2)
    offload_fraction: jax.Array  # f of the hottest planes whose excess pages are served from a buffer (0: off)
    offload_to_hbm: jax.Array  # 1: the offloaded pages come from HBM (FlashAccel); 0: from base-die SRAM
    buffered: jax.Array  # 1: new KV aggregated before programming; 0: programmed at once (naive, §3.2)
    window_aware: jax.Array  # 1: programs only inside read-free windows (§5.3); 0: whole stripes as they fill
    prefetch: jax.Array  # 1: weight prefetch into SRAM merges compute into long windows (§5.3, Fig. 13a)
    lifetime_aware: jax.Array  # 1: blocks packed by lifetime label of the session root (§5.4); 0: interleaved
    evict_threshold: jax.Array  # utilisation of the HBF KV room at which sessions are evicted (§5.4: 0.90)
    gc_trigger: jax.Array  # utilisation at which GC runs (§5.4: 0.95; = evict_threshold: no deferral)
    logical_page_tokens: jax.Array  # tokens per logical KV page: prefix reuse in whole pages (§3.1, Fig. 7b)
    hbf_request_kv: jax.Array  # 1: running requests' KV may live in HBF; 0: only in HBM (H3)
    block_first: jax.Array  # with immediate writes, 1: a request's pages program serially in its open block's
    #   plane (HBFlex §6.3 "immediate block-first writes"); 0: each page on its own plane

    @classmethod
    def make(cls, *, balanced, scheduled, offload_fraction, buffered, window_aware, prefetch, lifetime_aware,
             group_size=32, offload_to_hbm=0, evict_threshold=0.90, gc_trigger=0.95, logical_page_tokens=16,
             hbf_request_kv=1, block_first=0) -> "PolicyKnobs":
        """Validated knobs: flags 0 or 1, G a whole number in [1, 2^16], f in [0, 1), thresholds in (0, 1]
        with GC no earlier than eviction, whole logical pages >= 1 token."""
        c = cls.__name__
        values = dict(balanced=balanced, scheduled=scheduled, offload_to_hbm=offload_to_hbm, buffered=buffered,
                      window_aware=window_aware, prefetch=prefetch, lifetime_aware=lifetime_aware,
                      hbf_request_kv=hbf_request_kv, block_first=block_first)
        for name in _FLAGS:
            v = values[name]
            require(v in (0, 1) and not isinstance(v, bool), c, name, v, "must be 0 or 1")
        require_int(c, "group_size", group_size, 1, MAX_GROUP)
        require_real(c, "offload_fraction", offload_fraction, 0.0, 1.0, hi_open=True)
        require_real(c, "evict_threshold", evict_threshold, 0.0, 1.0, lo_open=True)
        require_real(c, "gc_trigger", gc_trigger, 0.0, 1.0, lo_open=True)
        require(gc_trigger >= evict_threshold, c, "gc_trigger", gc_trigger,
                f"GC cannot trigger before eviction (evict_threshold = {evict_threshold})")
        require_int(c, "logical_page_tokens", logical_page_tokens, 1, 2**20)
        f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return cls(group_size=f(group_size), offload_fraction=f(offload_fraction), evict_threshold=f(evict_threshold),
                   gc_trigger=f(gc_trigger), logical_page_tokens=f(logical_page_tokens),
                   **{k: f(v) for k, v in values.items()})


class Package(NamedTuple):
    """One organisation of HBFlex's evaluation: hardware and KV policy."""

    org: OrgKnobs
    policy: PolicyKnobs


# --- hardware ----------------------------------------------------------------------------------------

def _hbf_stack() -> hardware.HbfSpec:
    return hardware.preset("hbflex").hbf


def _placement(request_kv_tier: int, decode_kv_tier: int | None = None) -> np.ndarray:
    """float64[K, 3]: weights in HBF; prefill KV in ``request_kv_tier``, decode KV in ``decode_kv_tier``."""
    place = np.zeros((len(orgs.KINDS), len(orgs.TIERS)))
    place[DENSE_WEIGHTS, HBF] = place[EXPERT_WEIGHTS, HBF] = 1.0
    place[PREFILL_KV, request_kv_tier] = 1.0
    place[DECODE_KV, request_kv_tier if decode_kv_tier is None else decode_kv_tier] = 1.0
    return place


def _hardware(*, hbf_stacks: float, hbf_share: float, hbm_stacks: float, hbm_bytes_per_stack: float,
              cascaded: bool, place: np.ndarray, **changes) -> OrgKnobs:
    """OrgKnobs of ``hbf_stacks`` HBF stacks (each ``hbf_share`` of a full stack's planes, capacity and
    bandwidth) and ``hbm_stacks`` HBM stacks; ``cascaded``: HBF reached through the HBM side (Relay),
    else over its own GPU link (Direct)."""
    s = _hbf_stack()
    per_stack = 1.0 / s.stacks
    read_gbps = s.read_bw_gbps_per_stack * hbf_share
    values = dict(
        gpu_hbm_gbps=HBM3E_STACK_GBPS if hbm_stacks else 0.0,
        direct_gbps=0.0 if cascaded else read_gbps, relay_gbps=read_gbps if cascaded else 0.0,
        hbm_stacks=hbm_stacks, hbf_stacks=hbf_stacks, hbm_capacity_bytes=hbm_bytes_per_stack or 1.0,
        hbm_bw_gbps=HBM3E_STACK_GBPS, hbf_capacity_bytes=s.capacity_bytes * per_stack * hbf_share,
        parallel_units=s.parallel_units * per_stack * hbf_share, page_bytes=s.page_bytes, t_read_us=s.t_read_us,
        t_prog_us=s.t_prog_us, hbf_sram_region_bytes=s.sram_bytes_per_stack / 2, hbf_sram_regions=2,
        relay_sram_region_bytes=s.sram_bytes_per_stack / 2, relay_sram_regions=2, place=place,
        hbf_write_gbps=s.write_bw_gbps_per_stack * hbf_share, lookahead=0.0,
    )
    values.update(changes)
    return OrgKnobs.make(**values)


def _full_hbf(**changes) -> OrgKnobs:
    return _hardware(hbf_stacks=STACK_SITES, hbf_share=1.0, hbm_stacks=0, hbm_bytes_per_stack=0.0, cascaded=False,
                     place=_placement(HBF), **changes)


def _cascaded(place: np.ndarray, **changes) -> OrgKnobs:
    return _hardware(hbf_stacks=STACK_SITES, hbf_share=1.0 - CASCADED_HBM_SHARE, hbm_stacks=STACK_SITES,
                     hbm_bytes_per_stack=HBM3E_STACK_BYTES * CASCADED_HBM_SHARE, cascaded=True, place=place, **changes)


# --- policies ----------------------------------------------------------------------------------------

def hbflex_policy(**changes) -> PolicyKnobs:
    """HBFlex §5 with every mechanism on: plane groups of one die's 32 planes (assumed), runtime
    balancing with the hottest 10 % of planes offloaded to SRAM (§6.5), placement-aware scheduling,
    window-aware writeback with weight prefetch, lifetime-aware packing, evict at 90 % and GC at 95 %."""
    values = dict(balanced=1, scheduled=1, offload_fraction=0.1, buffered=1, window_aware=1, prefetch=1,
                  lifetime_aware=1)
    values.update(changes)
    return PolicyKnobs.make(**values)


def naive_policy(**changes) -> PolicyKnobs:
    """Naive HBF (HBFlex §6.3): random page placement, no runtime balancing, immediate writes, one
    interleaved allocation class, GC as soon as sessions are evicted (no deferred reclamation)."""
    values = dict(balanced=0, scheduled=0, offload_fraction=0.0, buffered=0, window_aware=0, prefetch=0,
                  lifetime_aware=0, evict_threshold=0.90, gc_trigger=0.90)
    values.update(changes)
    return PolicyKnobs.make(**values)


def dash_policy(**changes) -> PolicyKnobs:
    """DASH's KV in HBF as the HBFlex parts would read it (DASH states no placement of KV pages within
    HBF and no reuse of KV across requests; read only by the parts a DASH organisation is given, e.g.
    ``--reads planes``): random page placement, no runtime balancing or scheduling, immediate writes
    (DASH's own writes are the tiers part's direct prefill write and page-wave writeback), one
    interleaved allocation class, eviction and GC at 90 % (no deferral)."""
    return naive_policy(**changes)


def ablation_stages() -> dict[str, PolicyKnobs]:
    """HBFlex Table 2's cumulative stages, from Naive HBF to HBFlex: + placement and read balancing,
    + window-aware writeback, + lifetime-aware reclamation."""
    placement = dict(balanced=1, scheduled=1, offload_fraction=0.1)
    writeback = dict(buffered=1, window_aware=1, prefetch=1)
    reclamation = dict(lifetime_aware=1, gc_trigger=0.95)
    return {"naive-hbf": naive_policy(), "+placement+balancing": naive_policy(**placement),
            "+writeback": naive_policy(**placement, **writeback),
            "+reclamation": naive_policy(**placement, **writeback, **reclamation)}


MECHANISMS = ("placement", "balancing", "scheduling", "writeback", "reclamation")


def disable(policy: PolicyKnobs, mechanisms) -> PolicyKnobs:
    """``policy`` with the named HBFlex mechanisms off (``MECHANISMS``): placement → random pages;
    balancing → no hot-plane offload; scheduling → in-order chunks; writeback → immediate programs;
    reclamation → interleaved blocks and GC at the eviction threshold."""
    off = {}
    for m in mechanisms:
        if m not in MECHANISMS:
            raise ConfigError(f"--disable {m!r}: must be among {MECHANISMS}")
        off.update({"placement": dict(balanced=0.0), "balancing": dict(offload_fraction=0.0),
                    "scheduling": dict(scheduled=0.0), "writeback": dict(buffered=0.0, window_aware=0.0, prefetch=0.0),
                    "reclamation": dict(lifetime_aware=0.0, gc_trigger=float(policy.evict_threshold))}[m])
    fields = {k: getattr(policy, k) for k in policy.__dataclass_fields__}
    fields.update({k: jnp.float32(v) for k, v in off.items()})
    return PolicyKnobs(**fields)


# --- the registry ------------------------------------------------------------------------------------

def hbflex(**changes) -> Package:
    """HBFlex: six full HBF stacks with base-die SRAM, every mechanism on (HBFlex §4, §5)."""
    return Package(_full_hbf(**changes), hbflex_policy())


def naive_hbf(**changes) -> Package:
    """Naive HBF: HBFlex's package without its mechanisms (HBFlex §6.3)."""
    return Package(_full_hbf(**changes), naive_policy())


def naive_block(**changes) -> Package:
    """Naive HBF with immediate block-first writes (HBFlex §6.3's baseline as the paper words it): a
    request's consecutive pages fill one block on one plane, so a layer's new KV of a request programs
    serially there, and its reads of a layer's pages meet them in runs of a block's pages on one plane
    (``serve.parts.reads.run_pages``); the block store as ``naive-hbf``'s (random pages)."""
    return Package(_full_hbf(**changes), naive_policy(block_first=1))


def h3(**changes) -> Package:
    """H3 (Ha et al. 2026): cascaded HBM/HBF, weights and shared KV in HBF, request KV in HBM only; random
    placement of the HBF KV it holds, immediate writes of it (H3 keeps generated KV out of HBF)."""
    return Package(_cascaded(_placement(HBM), **changes), naive_policy(hbf_request_kv=0))


def _flashaccel_policy() -> PolicyKnobs:
    """FlashAccel (Wang et al. 2026b) as HBFlex describes it: KV in HBF, HBM for buffering (decode KV
    appended in HBM, written back in page waves) and read balancing (the hottest 10 % of planes' excess
    pages served from HBM); plane-balanced striping, no placement-aware scheduling, no window-aware
    writeback, interleaved blocks (interpreted: HBFlex credits its gains over FlashAccel to scheduling
    and coordinated writeback, §6.2)."""
    return naive_policy(balanced=1, offload_fraction=0.1, offload_to_hbm=1, buffered=1)


def fa_cli(**changes) -> Package:
    """FlashAccel co-located: five full HBF stacks and one HBM stack beside the GPU (HBFlex §6.1)."""
    org = _hardware(hbf_stacks=STACK_SITES - 1, hbf_share=1.0, hbm_stacks=1, hbm_bytes_per_stack=HBM3E_STACK_BYTES,
                    cascaded=False, place=_placement(HBF, decode_kv_tier=HBM), **changes)
    return Package(org, _flashaccel_policy())


def fa_csi(**changes) -> Package:
    """FlashAccel cascaded, normalised to the package budget like H3 (HBFlex §6.1)."""
    return Package(_cascaded(_placement(HBF, decode_kv_tier=HBM), **changes), _flashaccel_policy())


def integrated_stack(**changes) -> Package:
    """IS (Yin et al. 2026): HBM and HBF dies in each of six stacks behind an HBM-like interface,
    normalised like the cascaded designs (interpreted: ¼ HBM, ¾ HBF per stack); weights in HBF, KV
    appended in HBM and spilled to HBF in page waves when HBM is full; random placement, immediate
    programs of the spilled waves' pages."""
    return Package(_cascaded(_placement(HBM), **changes), naive_policy())


PACKAGES: dict[str, Callable[..., Package]] = {
    "hbflex": hbflex, "naive-hbf": naive_hbf, "naive-block": naive_block, "h3": h3, "fa-cli": fa_cli, "fa-csi": fa_csi, "is": integrated_stack,
}


_HW = "HBFlex §6.1"
_HBF_STACK = (("hbf_stacks", f"{_HW}: six stack sites per GPU"),
              ("parallel_units", f"{_HW}: 16 dies × 32 planes per stack (hardware.preset('hbflex'))"),
              ("t_read_us", f"{_HW}: tR 4 µs"), ("t_prog_us", f"{_HW}: tPROG 75 µs"),
              ("hbf_write_gbps", f"{_HW}: 27.2 GB/s program bandwidth per stack"),
              ("hbf_sram_region_bytes", f"{_HW}: 40 MB base-die SRAM per stack, as two regions"))
_CASCADED = (("hbm_capacity_bytes", f"{_HW} 'normalized configuration': ¼ of a 24 GB HBM3e stack per site"),
             ("parallel_units", f"{_HW}: ¾ of an HBF stack's planes per site"),
             ("relay_gbps", "HBF data reach the GPU through the stack's HBM-side interface (interpreted)"))
_POLICY_HBFLEX = (("policy", "HBFlex §5: plane-balanced placement (G = 32, assumed: one die's planes), hot-plane "
                             "offload f = 0.1 (§6.5), placement-aware scheduling, window-aware writeback with "
                             "prefetch, lifetime-aware packing, evict at 90 %, GC at 95 % (§5.4)"),)
_POLICY_NAIVE = (("policy", "HBFlex §6.3 Naive HBF: random pages, immediate writes, interleaved blocks, GC at "
                            "eviction"),)
SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    "hbflex": _POLICY_HBFLEX + _HBF_STACK,
    "naive-hbf": _POLICY_NAIVE + _HBF_STACK,
    "naive-block": (("policy", "HBFlex §6.3 Naive HBF, \"immediate block-first writes\": a request's pages "
                               "program serially in one block's plane, and are read in runs of a block's pages on one plane "
                               "(interpreted: a layer's run is a prefill chunk's pages of it; its block store as "
                               "naive-hbf's random pages)"),) + _HBF_STACK,
    "h3": (("place", "HBFlex §2.3: weights and shared KV in HBF, generated KV in HBM"),) + _POLICY_NAIVE + _CASCADED
    + _HBF_STACK,
    "fa-cli": (("hbf_stacks", f"{_HW}: five HBF stacks and one HBM stack beside the GPU"),
               ("policy", "HBFlex §2.3, §6.2 (interpreted): HBM buffers decode KV and serves hot planes; striping, "
                          "no scheduling, no window-aware writeback, interleaved blocks")) + _HBF_STACK,
    "fa-csi": (("policy", "as fa-cli (interpreted)"),) + _CASCADED + _HBF_STACK,
    "is": (("place", "Yin et al. 2026 as HBFlex describes it (interpreted): KV in HBM, spilled to HBF"),)
    + _POLICY_NAIVE + _CASCADED + _HBF_STACK,
}


def package(name: str, **changes) -> Package:
    """The named organisation (:data:`PACKAGES`), with any OrgKnobs.make argument changed."""
    try:
        make = PACKAGES[name]
    except KeyError:
        raise ConfigError(f"organisation = {name!r}: must be one of {tuple(PACKAGES)}") from None
    return make(**changes)


def sram_bytes(org: OrgKnobs) -> jax.Array:
    """float32[]: the package's base-die SRAM (HBFlex §6.1: 40 MB per stack, the same in every design)."""
    return org.hbf_stacks * org.hbf_sram_region_bytes * org.hbf_sram_regions


def planes(org: OrgKnobs) -> jax.Array:
    """float32[]: HBF planes of the package."""
    return org.hbf_stacks * org.parallel_units
