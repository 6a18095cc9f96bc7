"""Energy and cost per token of a served run (issue 25), from the run's own byte and token counts.

A run's energy is a sum of activities, each a count the engine measured (or a closed form of the
requests it served) times an energy per unit:

* GPU compute: FLOPs × pJ/FLOP. FLOPs = every computed token's linear layers (2 per multiply-add of
  the active parameters, ``ModelSpec.flops_per_token``) + the LM head per output token + attention
  over each request's context (causal prefill pairs P(P+1)/2, then P + t pairs for decode token t):
  prefix-cache hits are taken off the linear FLOPs (their attention pairs are not: an upper bound there);
* HBM: bytes read from HBM (weights and KV), and the decode KV a writeback reads back out of HBM;
* HBF reads: weight and KV bytes read from the arrays (Direct, Relay and the other reads);
* HBF programs: KV programmed (direct prefill writes, writebacks, retention) and GC's migrations
  ((WAF − 1) × host bytes, each read and programmed again), and with ``--read-disturb-reads`` the
  read-disturb rewrites (weight blocks and KV blocks, each read and programmed again: :func:`reclaim_bytes`);
  erases: one per block programmed full;
* links (UCIe D2D, DASH §IV-A): one hop per HBF byte to or from the GPU, two for a Relay byte;
* SRAM: the base-die transfer buffers every HBF byte crosses (written once, read once; DASH §IV-B,
  HBFlex's write buffer), and the HBM-side buffer of a Relay byte;
* the CPU-offloading systems (DASH §VI-C, ``hbfjax.serve.cpu_offload``): host DRAM (the expert
  weights the CPU computes with or streams), PCIe (streamed weights and the activations to and from
  the CPU) and the host CPU's FLOPs (its experts' rows), each counted by the engine for the split the
  system chose; their GPU FLOPs are the model's less the CPU's, their HBM bytes the roofline's;
* static power × the run's span (0 unless given).

Cost per million output tokens = (capital per second × span + energy × electricity price) / tokens,
the capital amortised over ``amortisation_years``: the GPU without its memory, HBM stacks and HBF
stacks at DASH §VI-G's per-stack ratio r = C_HBF / C_HBM and integration cost δ, the HBF bought
again as often as its lifetime (DASH §VI-H from the run's KV write rate and WAF) falls short of the
amortisation. Every value is a knob with its source; values no source gives are marked "assumed".

The CPU-offloading systems are priced as their GPU and its own HBM stacks (:data:`GPU_HBM_STACKS`); the
host (CPU, DRAM) is left out of every system's capital alike, as every server has one, and they have
no HBF (no lifetime). Host NumPy, per stream, then a mean and a 95 % half-width across streams
(``report.measured_mean_ci``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hbfjax.flash.erase.endurance import SECONDS_PER_YEAR
from hbfjax.hardware import PAGES_PER_BLOCK
from hbfjax.validate import ConfigError, require

# Board power by GPU preset (W): with the dense BF16 peak, the default energy per FLOP (TDP / peak).
GPU_TDP_W = {"h100-pcie": 350.0, "h100-sxm": 700.0, "h200": 700.0}
GPU_TDP_SOURCES = {"h100-pcie": "NVIDIA H100 PCIe datasheet: 350 W max TDP",
                   "h100-sxm": "NVIDIA H100 SXM5 datasheet: 700 W max TDP",
                   "h200": "NVIDIA H200 SXM datasheet: up to 700 W TDP"}
# HBM stacks of each GPU preset's own memory: the CPU-offloading systems' package (no HBF).
GPU_HBM_STACKS = {"h100-pcie": 5.0, "h100-sxm": 5.0, "h200": 6.0}
GPU_HBM_STACKS_SOURCES = {"h100-pcie": "NVIDIA H100 PCIe: 80 GB HBM2e in five active stacks",
                          "h100-sxm": "NVIDIA H100 SXM5: 80 GB HBM3 in five active stacks",
                          "h200": "NVIDIA H200: 141 GB HBM3E in six stacks"}


def _require_finite_non_negative(values, optional: tuple = ()) -> None:
    """Every field of the dataclass ``values`` a finite number >= 0 (None allowed for ``optional`` ones)."""
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        if value is None and f.name in optional:
            continue
        require(isinstance(value, (int, float)) and np.isfinite(value) and value >= 0, type(values).__name__, f.name,
                value, "must be a finite number >= 0")


@dataclass(frozen=True)
class EnergyCosts:
    """Energy per unit of each activity (module docstring). ``gpu_pj_per_flop`` None: the run's GPU's
    board TDP over its dense BF16 peak (an upper bound on compute energy: the TDP includes the board's
    static power and its own memory traffic)."""

    gpu_pj_per_flop: float | None = None
    hbm_pj_per_bit: float = 3.9
    hbf_read_pj_per_bit: float = 8.5
    hbf_program_pj_per_bit: float = 190.0
    hbf_erase_uj_per_block: float = 165.0
    link_pj_per_bit: float = 0.55
    sram_pj_per_bit: float = 1.6
    host_dram_pj_per_bit: float = 20.0
    pcie_pj_per_bit: float = 5.0
    cpu_pj_per_flop: float = 14.3
    static_w: float = 0.0

    SOURCES = {
        "gpu_pj_per_flop": "the GPU's max TDP / dense BF16 peak (NVIDIA datasheets; h100-pcie 350 W / 756.5 TFLOPS "
                           "= 0.46 pJ/FLOP): an upper bound, the TDP includes static and memory power",
        "hbm_pj_per_bit": "O'Connor et al., Fine-Grained DRAM, MICRO 2017: HBM2 ≈ 3.9 pJ/bit a read (array + I/O)",
        "hbf_read_pj_per_bit": "issue 25: published HBF read estimates range 8.5–30 pJ/bit; 8.5 is the low end "
                               "(figures/energy_cost.png also marks 30)",
        "hbf_program_pj_per_bit": "assumed (no HBF figure published): an ONFI-class plane program current ≈ 25 mA "
                                  "at 3.3 V over tPROG 75 µs for a 4 KiB page ≈ 190 pJ/bit",
        "hbf_erase_uj_per_block": "assumed (no HBF figure published): ≈ 25 mA at 3.3 V over a 2 ms block erase "
                                  "≈ 165 µJ a block",
        "link_pj_per_bit": "DASH §IV-A: UCIe-A targets 0.5 pJ/bit at 0.5 V and 0.6 pJ/bit at 0.7 V (their mean)",
        "sram_pj_per_bit": "Horowitz, ISSCC 2014: a 64-bit access of a 1 MB SRAM ≈ 100 pJ (≈ 1.6 pJ/bit)",
        "host_dram_pj_per_bit": "Horowitz, ISSCC 2014: a 64-bit DRAM access 1.3–2.6 nJ (20 pJ/bit, the low end; "
                                "the CPU systems' host DDR5)",
        "pcie_pj_per_bit": "assumed (neither paper gives one): a PCIe Gen5 link end to end ≈ 5 pJ/bit",
        "cpu_pj_per_flop": "Intel ARK: Xeon Platinum 8452Y TDP 300 W over its sustained AMX BF16 rate (memory.cpus: "
                           "KTransformers' 21 TFLOPS a socket) = 14.3 pJ/FLOP; the TDP includes the uncore",
        "static_w": "assumed 0: static power left out unless given (then × the run's span)",
    }

    def __post_init__(self):
        _require_finite_non_negative(self, optional=("gpu_pj_per_flop",))

    def pj_per_flop(self, gpu: str, peak_tflops_bf16: float) -> float:
        if self.gpu_pj_per_flop is not None:
            return float(self.gpu_pj_per_flop)
        if gpu not in GPU_TDP_W:
            raise ConfigError(f"energy: no TDP on record for GPU {gpu!r}: give --gpu-pj-per-flop")
        return GPU_TDP_W[gpu] / peak_tflops_bf16


@dataclass(frozen=True)
class CostModel:
    """The capital and electricity behind cost per token (module docstring)."""

    gpu_usd: float = 20_000.0
    hbm_stack_usd: float = 600.0
    hbf_to_hbm_cost_ratio: float = 1.0
    integration_to_hbm_cost_ratio: float = 0.0
    amortisation_years: float = 5.0
    usd_per_kwh: float = 0.10
    pe_cycles: float = 100_000.0

    SOURCES = {
        "gpu_usd": "assumed: an H100-class GPU without its memory stacks (no public price; swept in studies)",
        "hbm_stack_usd": "assumed: one 24 GB HBM3E stack at ≈ 25 $/GB (no public price; DASH §VI-G prices none)",
        "hbf_to_hbm_cost_ratio": "DASH §VI-G: r = C_HBF / C_HBM per stack, r = 1 its illustrative anchor",
        "integration_to_hbm_cost_ratio": "DASH §VI-G: δ = ΔC_int / C_HBM, 0 at its anchor",
        "amortisation_years": "HBFlex §3.3: a 5-year service life",
        "usd_per_kwh": "assumed: 0.10 $/kWh (a data-centre electricity price; no PUE)",
        "pe_cycles": "HBFlex §3.3: a 100K P/E budget (hardware.py's presets)",
    }

    def __post_init__(self):
        _require_finite_non_negative(self)
        for name in ("amortisation_years", "pe_cycles"):
            require(getattr(self, name) > 0, "CostModel", name, getattr(self, name), "must be > 0")


@dataclass(frozen=True)
class Package:
    """What a run's package holds, for pricing and lifetime: stack counts and the HBF page."""

    hbm_stacks: float
    hbf_stacks: float
    page_bytes: float
    all_hbf: bool  # no HBM stacks: writebacks come from the GPU and its SRAM, not out of HBM


def package_of(org) -> Package:
    hbm, hbf = float(org.hbm_stacks), float(org.hbf_stacks)
    return Package(hbm_stacks=hbm, hbf_stacks=hbf, page_bytes=float(org.page_bytes), all_hbf=hbm == 0)


@dataclass(frozen=True)
class Activity:
    """Per-stream counts of one run (float64[S] each): bytes, FLOPs, tokens, seconds."""

    flops: np.ndarray
    hbm_read_bytes: np.ndarray
    direct_bytes: np.ndarray  # HBF bytes over one hop to the GPU (Direct experts, other HBF reads)
    relay_bytes: np.ndarray  # HBF bytes over the Relay path (two hops)
    gpu_write_bytes: np.ndarray  # KV from the GPU programmed into HBF (one hop)
    hbm_write_bytes: np.ndarray  # KV read out of HBM and programmed into HBF (one hop)
    gc_bytes: np.ndarray  # GC migrations: read and programmed again inside the package
    reclaim_bytes: np.ndarray  # read-disturb rewrites (weights and KV blocks): read and programmed again inside it
    host_dram_bytes: np.ndarray  # the CPU systems' expert weights read from host DRAM (0 on an organisation)
    pcie_bytes: np.ndarray  # the CPU systems' PCIe traffic
    cpu_flops: np.ndarray  # the CPU systems' FLOPs on the host CPU (not in ``flops``)
    output_tokens: np.ndarray
    requests: np.ndarray
    span_s: np.ndarray  # first arrival to last finish
    busy_s: np.ndarray


def attention_pairs(prompt_tokens, output_tokens) -> tuple[np.ndarray, np.ndarray]:
    """(prefill, decode) (query, context) pairs of requests of ``prompt_tokens`` P and ``output_tokens`` O,
    per layer: P(P+1)/2 causal prefill pairs; decode token t = 1 … O − 1 attends P + t entries (the first
    output token comes from the prefill pass)."""
    p = np.asarray(prompt_tokens, np.float64)
    d = np.maximum(np.asarray(output_tokens, np.float64) - 1.0, 0.0)
    return p * (p + 1.0) / 2.0, d * p + d * (d + 1.0) / 2.0


def flops(model, prompt_tokens, output_tokens, hit_tokens=0.0) -> np.ndarray:
    """float64[S]: FLOPs of serving requests ``prompt_tokens`` / ``output_tokens`` (float[S, R], 0 for
    none) with ``hit_tokens`` (float[S]) of their prompts served from retained KV (module docstring)."""
    p = np.asarray(prompt_tokens, np.float64)
    o = np.asarray(output_tokens, np.float64)
    linear = sum(sum(v for op, v in model.flops_per_token(kind).items() if op != "attention")
                 for kind in model.layer_kinds)
    head = 2.0 * model.vocab * model.hidden
    pre, dec = attention_pairs(p, o)
    att = model.layers * (model.attention_flops_per_pair("prefill") * pre.sum(-1)
                          + model.attention_flops_per_pair("decode") * dec.sum(-1))
    computed = p.sum(-1) - np.asarray(hit_tokens, np.float64) + np.maximum(o - 1.0, 0.0).sum(-1)
    return linear * computed + head * o.sum(-1) + att


def cpu_package(gpu: str) -> Package:
    """A CPU-offloading system's package: the GPU's own HBM stacks, no HBF."""
    if gpu not in GPU_HBM_STACKS:
        raise ConfigError(f"energy: no HBM stack count on record for GPU {gpu!r} (known: {', '.join(GPU_HBM_STACKS)})")
    return Package(hbm_stacks=GPU_HBM_STACKS[gpu], hbf_stacks=0.0, page_bytes=4096.0, all_hbf=False)


def activity(o, org, model) -> Activity:
    """A batched run's counts (``o``: ``engine.ServeOutput`` with a leading stream axis, on ``org``; None
    for a CPU-offloading system, which writes no KV to flash)."""
    from hbfjax.serve import report

    t = {k: np.asarray(v, np.float64) for k, v in o.totals._asdict().items()}
    times = report.request_times(o)
    started = times.valid & np.isfinite(times.first_token_s)
    out = np.where(started, times.tokens_out, 0).astype(np.float64)
    prompt = np.where(started, np.asarray(o.kv_tokens, np.float64) - times.tokens_out, 0.0)
    parts = o.parts
    hits = np.asarray(parts["sessions"].totals.hit_tokens, np.float64) if "sessions" in parts else 0.0
    retained = np.asarray(parts["sessions"].totals.retention_write_bytes, np.float64) if "sessions" in parts else 0.0
    host = t["prefill_write_bytes"] + t["writeback_bytes"] + retained
    if "blocks" in parts:
        waf = report.part_keys(o, ("blocks",))["waf"]
        gc = np.where(np.isfinite(waf), waf - 1.0, 0.0) * host
    else:
        gc = np.zeros_like(host)
    reclaim = reclaim_bytes(o, host)
    all_hbf = org is not None and package_of(org).all_hbf
    from_hbm = (0.0 if all_hbf else 1.0) * (t["writeback_bytes"] + retained)
    finish = np.where(times.valid & np.isfinite(times.finish_s), times.finish_s, -np.inf).max(axis=-1)
    begin = np.where(times.valid, times.arrival_s, np.inf).min(axis=-1)
    return Activity(flops=flops(model, prompt, out, hits) - t["cpu_flops"], hbm_read_bytes=t["hbm_read_bytes"],
                    direct_bytes=t["expert_direct_bytes"] + t["hbf_read_bytes"], relay_bytes=t["expert_relay_bytes"],
                    gpu_write_bytes=host - from_hbm, hbm_write_bytes=from_hbm, gc_bytes=gc, reclaim_bytes=reclaim,
                    output_tokens=out.sum(-1),
                    requests=(started & (times.tokens_out > 0)).sum(-1).astype(np.float64),
                    span_s=np.maximum(finish - begin, 0.0), busy_s=t["busy_us"] * 1e-6,
                    host_dram_bytes=t["host_dram_bytes"], pcie_bytes=t["pcie_bytes"], cpu_flops=t["cpu_flops"])


def reclaim_bytes(o, host_bytes) -> np.ndarray:
    """float64[S] bytes a run's read-disturb rewrites programmed (issue 26): the weight blocks the reclaim part
    rewrote and the KV blocks' relocated pages (:func:`kv_reclaim_bytes`); 0 without ``--read-disturb-reads``."""
    parts = o.parts
    weights = np.asarray(parts["reclaim"].totals.rewrite_bytes, np.float64) if "reclaim" in parts else 0.0
    return weights + kv_reclaim_bytes(o, host_bytes)


def kv_reclaim_bytes(o, host_bytes) -> np.ndarray:
    """float64[S] the KV blocks' read-disturb copies: on HBFlex's organisations the blocks part's
    ``kv_reclaim_waf_added`` × the host bytes ``host_bytes``, on DASH's the KV cohorts' copies the reclaim part
    timed (``kv_copy_bytes``); 0 where neither counts KV reads."""
    from hbfjax.serve import report

    host = np.asarray(host_bytes, np.float64)
    copies = np.zeros_like(host)
    if "reclaim" in o.parts:  # 0 unless the reclaim part counts the KV (no blocks part)
        copies = copies + np.asarray(o.parts["reclaim"].totals.kv_copy_bytes, np.float64)
    if "blocks" in o.parts and o.parts["blocks"].final.reads is not None:
        added = report.part_keys(o, ("blocks",))["kv_reclaim_waf_added"]
        copies = copies + np.where(np.isfinite(added), added, 0.0) * host
    return copies


def energy_j(a: Activity, costs: EnergyCosts, pj_per_flop: float, pkg: Package) -> dict:
    """``{where: float64[S] joules}`` of a run's activity (module docstring)."""
    bits = 8.0 * 1e-12  # pJ/bit × bytes → J
    hbf_read = a.direct_bytes + a.relay_bytes + a.gc_bytes + a.reclaim_bytes
    programmed = a.gpu_write_bytes + a.hbm_write_bytes + a.gc_bytes + a.reclaim_bytes
    block_bytes = PAGES_PER_BLOCK * pkg.page_bytes
    return {
        "gpu_compute": a.flops * pj_per_flop * 1e-12,
        "hbm": (a.hbm_read_bytes + a.hbm_write_bytes) * costs.hbm_pj_per_bit * bits,
        "hbf_read": hbf_read * costs.hbf_read_pj_per_bit * bits,
        "hbf_program": programmed * costs.hbf_program_pj_per_bit * bits,
        "hbf_erase": programmed / block_bytes * costs.hbf_erase_uj_per_block * 1e-6,
        "links": (a.direct_bytes + 2.0 * a.relay_bytes + a.gpu_write_bytes + a.hbm_write_bytes)
        * costs.link_pj_per_bit * bits,
        "sram": 2.0 * (a.direct_bytes + 2.0 * a.relay_bytes + a.gpu_write_bytes + a.hbm_write_bytes)
        * costs.sram_pj_per_bit * bits,
        "host_dram": a.host_dram_bytes * costs.host_dram_pj_per_bit * bits,
        "pcie": a.pcie_bytes * costs.pcie_pj_per_bit * bits,
        "cpu_compute": a.cpu_flops * costs.cpu_pj_per_flop * 1e-12,
        "static": costs.static_w * a.span_s,
    }


def lifetime_years(a: Activity, room_bytes, cost: CostModel) -> np.ndarray:
    """float64[S]: DASH §VI-H's lifetime C_KV·E / (A_W·R_HBF) with the run's host KV write rate over its
    busy time and its WAF (programmed / host bytes); inf where nothing was written."""
    host = a.gpu_write_bytes + a.hbm_write_bytes
    programmed = host + a.gc_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = programmed / np.maximum(a.busy_s, 1e-30)  # A_W · R_HBF
        seconds = np.where(rate > 0, np.asarray(room_bytes, np.float64) * cost.pe_cycles / rate, np.inf)
    return seconds / SECONDS_PER_YEAR


def cost_usd(a: Activity, energy_total_j, life_years, cost: CostModel, pkg: Package) -> dict:
    """``{where: float64[S] dollars}`` the run costs: capital over its span (the HBF bought again as
    often as its lifetime falls short of the amortisation) and electricity for its energy."""
    per_s = 1.0 / (cost.amortisation_years * SECONDS_PER_YEAR)
    buys = np.maximum(1.0, cost.amortisation_years / np.asarray(life_years, np.float64))
    hbf_usd = pkg.hbf_stacks * cost.hbf_to_hbm_cost_ratio * cost.hbm_stack_usd
    return {"capital_gpu": cost.gpu_usd * per_s * a.span_s,
            "capital_hbm": (pkg.hbm_stacks + cost.integration_to_hbm_cost_ratio) * cost.hbm_stack_usd * per_s
            * a.span_s,
            "capital_hbf": hbf_usd * buys * per_s * a.span_s,
            "electricity": np.asarray(energy_total_j) / 3.6e6 * cost.usd_per_kwh}


def per_stream(o, org, model, room_bytes, costs: EnergyCosts, cost: CostModel, pj_per_flop: float,
               gpu: str = "h100-pcie") -> dict:
    """Host ``{key: float64[S]}``: energy per output token and request, power, cost per million output
    tokens, lifetime, and each breakdown per output token (``energy_<where>_j_per_token``,
    ``cost_<where>_usd_per_mtoken``); ``org`` None: a CPU-offloading system on ``gpu``."""
    a = activity(o, org, model)
    pkg = cpu_package(gpu) if org is None else package_of(org)
    parts = energy_j(a, costs, pj_per_flop, pkg)
    total = sum(parts.values())
    life = lifetime_years(a, room_bytes, cost)
    usd = cost_usd(a, total, life, cost, pkg)
    with np.errstate(divide="ignore", invalid="ignore"):
        tokens = np.where(a.output_tokens > 0, a.output_tokens, np.nan)
        out = {"energy_j_per_token": total / tokens,
               "energy_j_per_request": total / np.where(a.requests > 0, a.requests, np.nan),
               "power_w": total / np.where(a.span_s > 0, a.span_s, np.nan),
               "cost_usd_per_mtoken": sum(usd.values()) / tokens * 1e6,
               "hbf_lifetime_years": np.where(np.isfinite(life), life, np.nan),
               "gpu_tflop_per_token": a.flops / tokens * 1e-12}
        out.update({f"energy_{k}_j_per_token": v / tokens for k, v in parts.items()})
        out.update({f"cost_{k}_usd_per_mtoken": v / tokens * 1e6 for k, v in usd.items()})
    return out


def _nest(flat: dict) -> dict:
    """The report's keys: the totals at the top, each breakdown under ``energy_breakdown_j_per_token`` /
    ``cost_breakdown_usd_per_mtoken`` (means and half-widths)."""
    out, energy, cost = {}, {}, {}
    for key, v in flat.items():
        ci = key.startswith("ci95_")
        bare = key[5:] if ci else key
        for prefix, suffix, into in (("energy_", "_j_per_token", energy), ("cost_", "_usd_per_mtoken", cost)):
            where = bare[len(prefix):-len(suffix)] if bare.startswith(prefix) and bare.endswith(suffix) else ""
            if where and bare not in ("energy_j_per_token", "cost_usd_per_mtoken"):
                into[("ci95_" if ci else "") + where] = v
                break
        else:
            out[key] = v
    return {**out, "energy_breakdown_j_per_token": energy, "cost_breakdown_usd_per_mtoken": cost}


KEYS = ("energy_j_per_token", "energy_j_per_request", "power_w", "cost_usd_per_mtoken", "hbf_lifetime_years",
        "gpu_tflop_per_token")


def room_bytes_of(o, model) -> np.ndarray:
    """float64[S] the HBF KV room of each stream in bytes (NaN without one)."""
    room = np.asarray(o.room_tokens, np.float64)
    return np.where(room >= 0, room * model.kv_bytes_per_token, np.nan)


def report(o, org, model, costs: EnergyCosts, cost: CostModel, pj_per_flop: float, gpu: str = "h100-pcie") -> dict:
    """One system's energy and cost keys (means and ``ci95_`` half-widths); ``org`` None: a CPU-offloading
    system on ``gpu`` (module docstring)."""
    from hbfjax.serve.report import measured_mean_ci

    room = np.full(np.shape(o.room_tokens), np.nan) if org is None else room_bytes_of(o, model)
    measured = measured_mean_ci(per_stream(o, org, model, room, costs, cost, pj_per_flop, gpu))
    unmeasured = sorted(k for k, v in measured.items() if v is None and not k.startswith("ci95_"))
    out = _nest({k: v for k, v in measured.items() if v is not None})
    if org is None:
        out["energy_note"] = (f"a CPU-offloading system: priced as the GPU and its own {GPU_HBM_STACKS[gpu]:g} HBM stacks "
                              f"({GPU_HBM_STACKS_SOURCES[gpu]}), no HBF (so no HBF lifetime); the host (CPU, DRAM) is "
                              "left out of every system's capital alike")
    elif unmeasured:  # e.g. no KV programmed into HBF (no wear: no lifetime), or no output token (nothing per token)
        out["energy_note"] = f"not measured in any stream: {', '.join(unmeasured)} (nothing written to HBF bounds " \
                             "no lifetime; a run without output tokens has nothing per token)"
    return out


def describe(costs: EnergyCosts, cost: CostModel, pj_per_flop: float) -> dict:
    """The header's ``energy_model``: every value the run used with its source."""
    values = {**dataclasses.asdict(costs), "gpu_pj_per_flop": pj_per_flop, **dataclasses.asdict(cost)}
    given = {f.name for f in dataclasses.fields(costs) if getattr(costs, f.name) != f.default} | \
            {f.name for f in dataclasses.fields(cost) if getattr(cost, f.name) != f.default}
    sources = {**EnergyCosts.SOURCES, **CostModel.SOURCES}
    return {name: {"value": values[name], "source": f"given: --{name.replace('_', '-')}" if name in given
                   else sources[name]} for name in values}


FIELDS = tuple(f.name for f in dataclasses.fields(EnergyCosts)) + tuple(f.name for f in dataclasses.fields(CostModel))
