"""Read reclaim and refresh of a served run's HBF weights (issue 26, in serving): a renewal-theory estimate
from the run's own reads, beside its KV writes.

Every read of a NAND page disturbs its block; after N reads the block is relocated (its pages read and
programmed into a fresh block, the old one erased), and with a refresh interval T every block not
rewritten for T is rewritten too (``hbfjax.flash.disturb``: the mechanism, its plain-NumPy reference and
these closed forms, validated there). Weight blocks hold only valid pages and are read in whole: a pass
that needs a weight reads every page of its blocks, so a block of P pages is read P times per use.

The run gives the reads (per stream, over its busy time):

* expert blocks: the experts' bytes the run read from HBF (Direct + Relay, measured: the routing draws
  of every pass), spread evenly over the blocks that hold the experts placed in HBF;
* dense blocks (attention, norms, routers, shared experts, dense FFNs, embedding, LM head): the
  non-expert weights placed in HBF read once per pass (an upper bound: the embedding table and the MTP
  modules are counted as read every pass).

Each block then rewrites at max(λ/N, 1/T) per second for N ≫ 1 (``reclaim.renewal_rates``): the total
relocation rate Σ λ_b / N does not depend on how reads are shared among blocks, so skewed routing (hot
experts) changes the total only through the bytes it reads; with refresh on, even shares give a lower
bound (max is convex). KV blocks are not in this estimate (their pages die with their requests, mostly
before N reads; HBFlex's paper counts none): the engine counts their reads itself (below). This
estimate's plane time is a share of the package's program rate; the serving engine times the same rewrites in its own loop with the ``reclaim`` part
(``hbfjax.serve.parts.reclaim``: ``reclaim_stall_s`` and the ``reclaim_timed_*`` keys, from each pass's
routing draw), which the CLI runs beside this estimate.

Lifetimes spread wear over every block of the package (global wear levelling): P/E × blocks / erases per
second, for the KV programs (host + GC, the run's measured bytes; and each alone), for reclaim (this
estimate's weight rewrites plus the KV blocks' relocations the run measured: ``parts.blocks`` on HBFlex's
organisations, the reclaim part's KV cohorts on DASH's; ``hbfjax.energy.kv_reclaim_bytes``), and for all of
them together.
These differ from ``hbf_lifetime_years`` (DASH §VI-H's, over the KV room only). Host NumPy, per stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbfjax.flash.disturb.reclaim import renewal_rates
from hbfjax.flash.erase.endurance import SECONDS_PER_YEAR
from hbfjax.hardware import PAGES_PER_BLOCK
from hbfjax.memory.organisations import DENSE_WEIGHTS, EXPERT_WEIGHTS, HBF
from hbfjax.validate import require



@dataclass(frozen=True)
class ReclaimModel:
    """What sets reclaim: the read-disturb threshold N (reads per block), the refresh interval T (hours,
    0: off), pages per block and the P/E budget."""

    threshold_reads: float
    refresh_hours: float = 0.0
    pages_per_block: int = PAGES_PER_BLOCK
    pe_cycles: float = 100_000.0

    SOURCES = {"threshold_reads": "given: --read-disturb-reads (issue 26's public artifact: 10^6)",
               "refresh_hours": "given: --refresh-hours (OCP HBF v0.7: every 24-48 h; 0: off)",
               "pages_per_block": "HBFlex §5.1: 512 pages a block",
               "pe_cycles": "HBFlex §3.3: a 100K P/E budget (--pe-cycles)"}

    def __post_init__(self):
        require(self.threshold_reads >= 1, "ReclaimModel", "threshold_reads", self.threshold_reads, "must be >= 1")
        require(self.refresh_hours >= 0, "ReclaimModel", "refresh_hours", self.refresh_hours, "must be >= 0")
        require(self.pe_cycles > 0, "ReclaimModel", "pe_cycles", self.pe_cycles, "must be > 0")


def _blocks(weight_bytes: float, block_bytes: float) -> float:
    return weight_bytes / block_bytes if weight_bytes > 0 else 0.0


def read_rates(totals: dict, org, model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense, expert) weight page reads per second and the busy seconds, float64[S] each, of a run's per-stream
    ``totals`` (the engine's: expert_direct_bytes, expert_relay_bytes, passes, busy_us; module docstring)."""
    page = float(org.page_bytes)
    place = np.asarray(org.place, np.float64)
    busy_s = np.maximum(np.asarray(totals["busy_us"], np.float64) * 1e-6, 1e-30)
    dense = np.asarray(totals["passes"], np.float64) * model.non_expert_weight_bytes * place[DENSE_WEIGHTS, HBF]
    expert = np.asarray(totals["expert_direct_bytes"], np.float64) + np.asarray(totals["expert_relay_bytes"], np.float64)
    return dense / page / busy_s, expert / page / busy_s, busy_s


def estimate(dense_reads, expert_reads, kv_program_bps, busy_s, org, model, m: ReclaimModel, gc_program_bps=0.0,
             kv_reclaim_bps=0.0) -> dict:
    """Host ``{key: float64[...]}``: the rewrites that weight page reads of ``dense_reads`` and ``expert_reads``
    per second imply (each class's blocks at its mean rate), beside KV programs of ``kv_program_bps`` B/s
    (host + GC, of which ``gc_program_bps`` GC's migrations) and the run's measured KV relocations
    (``kv_reclaim_bps``: the blocks part's read-disturb copies, 0 where none), over ``busy_s`` seconds, on the
    package of ``org`` (module docstring). The lifetimes split the wear: KV host writes, GC, read reclaim (the
    weights' estimate and the KV copies), and all of it; 1 / combined = Σ 1 / each."""
    page = float(org.page_bytes)
    block = m.pages_per_block * page
    place = np.asarray(org.place, np.float64)
    dense_reads, expert_reads = np.asarray(dense_reads, np.float64), np.asarray(expert_reads, np.float64)
    relocations, refreshes = np.zeros_like(dense_reads), np.zeros_like(dense_reads)
    for reads, weight in ((dense_reads, model.non_expert_weight_bytes * place[DENSE_WEIGHTS, HBF]),
                          (expert_reads, model.expert_weight_bytes * place[EXPERT_WEIGHTS, HBF])):
        n_blocks = _blocks(weight, block)
        if n_blocks == 0:
            continue
        for i, r in np.ndenumerate(reads):  # each block at the class's mean rate λ = reads / blocks
            rates = renewal_rates(r / n_blocks, 1.0, m.threshold_reads, m.refresh_hours)
            relocations[i] += n_blocks * rates["relocations_per_s"]
            refreshes[i] += n_blocks * rates["refreshes_per_s"]
    rewrite_bps = (relocations + refreshes) * block  # every page of a weight block valid
    program_bps = float(org.hbf_stacks) * min(float(org.parallel_units) * page / (float(org.t_prog_us) * 1e-6),
                                              float(org.hbf_write_gbps) * 1e9)
    kv_bps = np.asarray(kv_program_bps, np.float64)
    gc_bps = np.asarray(gc_program_bps, np.float64)
    kv_reclaim = np.asarray(kv_reclaim_bps, np.float64)
    device_bytes = float(org.hbf_stacks) * float(org.hbf_capacity_bytes)
    life = lambda bps: np.where(bps > 0, m.pe_cycles * device_bytes / np.where(bps > 0, bps, 1.0), np.inf) \
        / SECONDS_PER_YEAR  # noqa: E731
    return {"reclaim_relocations_per_s": relocations, "reclaim_refreshes_per_s": refreshes,
            "reclaim_program_gb": rewrite_bps * np.asarray(busy_s, np.float64) / 1e9,
            "reclaim_program_gbps": rewrite_bps / 1e9, "reclaim_program_share": rewrite_bps / program_bps,
            "reclaim_over_kv_programs": np.where(kv_bps > 0, rewrite_bps / np.where(kv_bps > 0, kv_bps, 1.0), np.inf),
            "dense_page_reads_per_s": dense_reads, "expert_page_reads_per_s": expert_reads,
            "weight_page_reads_per_s": dense_reads + expert_reads, "kv_program_gbps": kv_bps / 1e9,
            "kv_reclaim_program_gbps": kv_reclaim / 1e9,
            "lifetime_years_kv_writes": life(kv_bps), "lifetime_years_kv_host_writes": life(kv_bps - gc_bps),
            "lifetime_years_gc": life(gc_bps), "lifetime_years_read_reclaim": life(rewrite_bps + kv_reclaim),
            "lifetime_years_combined": life(kv_bps + rewrite_bps + kv_reclaim)}


def per_stream(totals: dict, org, model, kv_programmed_bytes, m: ReclaimModel, gc_bytes=0.0,
               kv_reclaim_bytes=0.0) -> dict:
    """Host ``{key: float64[S]}`` of one system's run: ``totals`` the engine's per-stream totals
    (:func:`read_rates`), ``kv_programmed_bytes`` the KV it programmed (host + GC, float64[S]), ``gc_bytes``
    GC's share of it, ``kv_reclaim_bytes`` the KV blocks' read-disturb copies."""
    dense, expert, busy_s = read_rates(totals, org, model)
    rate = lambda b: np.asarray(b, np.float64) / busy_s  # noqa: E731
    return estimate(dense, expert, rate(kv_programmed_bytes), busy_s, org, model, m, rate(gc_bytes),
                    rate(kv_reclaim_bytes))


KEYS = ("reclaim_program_gb", "reclaim_program_share", "lifetime_years_combined")
NOTE = ("reclaim_program_*, reclaim_relocations/refreshes: renewal estimate from the run's weight reads "
        "(hbfjax.read_reclaim); lifetime_years_*: that estimate with the run's KV host writes, GC and KV-block "
        "relocations (kv_reclaim_program_gbps: HBFlex's blocks on sampled planes, DASH's KV cohorts); "
        "reclaim_stall_s and reclaim_timed_*: "
        "the same rewrites timed in the "
        "serving loop (hbfjax.serve.parts.reclaim: each pass's routing draw, windows or critical path); lifetimes "
        "over every block of the package (global wear levelling), unlike hbf_lifetime_years (DASH §VI-H, over the "
        "KV room)")


def report(totals: dict, org, model, kv_programmed_bytes, m: ReclaimModel, gc_bytes=0.0,
           kv_reclaim_bytes=0.0) -> dict:
    """One system's reclaim keys (means and ``ci95_`` half-widths; an unbounded lifetime is left out, named in
    ``reclaim_note``); arguments as :func:`per_stream`'s."""
    from hbfjax.serve.report import measured_mean_ci

    measured = measured_mean_ci(per_stream(totals, org, model, kv_programmed_bytes, m, gc_bytes, kv_reclaim_bytes))
    out = {k: v for k, v in measured.items() if v is not None}
    unbounded = sorted(k for k, v in measured.items() if v is None and not k.startswith("ci95_"))
    out["reclaim_note"] = NOTE + (f"; unbounded (nothing of that kind written): {', '.join(unbounded)}"
                                  if unbounded else "")
    return out


def describe(m: ReclaimModel) -> dict:
    return {name: {"value": getattr(m, name), "source": source} for name, source in m.SOURCES.items()}
