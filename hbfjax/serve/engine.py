"""The serving engine: one stream served on one system, a memory organisation and the parts that manage
its KV (DESIGN.md §5 "The step", "One engine of parts"; review 2026-12-02 §8).

``simulate(stream_id, seed, knobs, inputs, config)`` is the batch protocol (``hbfjax.batch.run`` vmaps
it over streams, and over systems stacked on a knob axis, which then compare on common random
numbers: requests and routing hash only (seed, stream, request / pass, layer)). Requests go through
the Sarathi batcher (``batching.run``); each iteration's passes (mixed, serial or alternate) are timed
here, in one loop for every system:

1. at each boundary the parts' ``admit`` hooks see the admissions (KV reuse, retention, residency);
2. per pass, every MoE layer is routed (:func:`pass_routing`, drawn per pass and layer), the parts'
   ``reads`` hooks say how the attention's KV reads split between HBM and HBF and how much plane
   collisions amplify the HBF share, the layer times compose GPU operator costs with the
   organisation's delivery (``layer_time.layer_times``, or the CPU-offloading timing,
   ``ServeConfig.timing``), the parts' ``writes`` hooks place the pass's KV and say what its writes
   expose, and the pass takes its layers' time plus that stall;
3. once per chunk of iterations the parts' ``every_chunk`` hooks do amortised work (eviction, GC),
   whose exposed time is added to the next iteration.

Systems differ by data (their knobs: organisation, KV policy, GPU, ...) and by the static tuple of
parts (``ServeConfig.parts``; :mod:`hbfjax.serve.parts`): DASH's organisations are ``("tiers",)``,
HBFlex's add sessions, reads, writes, sram and blocks; the CPU-offloading baselines use no part and the
``cpu-offload`` timing. One compilation per (parts, timing, shapes).

Totals of the run (``ServeOutput.totals`` and each part's own) are float32 sums kept with Kahan
compensation (:mod:`hbfjax.serve.totals`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.clock import Clock
from hbfjax.memory import delivery
from hbfjax.memory.hbf_packages import PolicyKnobs, dash_policy
from hbfjax.memory.organisations import OrgKnobs
from hbfjax.serve import batching, cpu_offload, kv_tiers, layer_time, parts as part_modules, totals
from hbfjax.serve.pass_routing import ROUTING_DRAWS, pass_routing
from hbfjax.serve.part import Admission, AdmitView, Chunk, PassView, RunView, no_reads, no_writes
from hbfjax.serve.parts.blocks import BlocksConfig
from hbfjax.serve.parts.reads import ReadLaws, ReadsConfig
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.validate import require, require_choice, require_int, require_real
from hbfjax.workload import requests as rq
from hbfjax.workload import routing, timing
from hbfjax.workload.models import ModelSpec

TIMINGS = ("organisation", "cpu-offload")  # layer times on an HBM/HBF organisation, or DASH §VI-C's CPU systems


def pass_token_bound(slots: int, chunk_tokens: int, token_budget: int) -> int:
    """The most tokens one pass can hold (``ServeConfig.max_pass_tokens``): a decode token per slot and a
    chunk per slot, within the iteration token budget."""
    return min(token_budget, slots + slots * chunk_tokens)


@dataclass(frozen=True)
class ServeConfig:
    """Static shape of a serving run: the model, the batcher, the request stream, the routing kind, the
    parts and timing of the system, their static shapes, and bounds on the loop (``max_pass_tokens`` is
    routing's token axis: the most tokens one pass holds)."""

    model: ModelSpec
    batcher: BatcherConfig
    requests: rq.RequestsConfig
    max_pass_tokens: int
    routing_kind: str = "uniform"
    routing_draw: str = "counts"  # "counts": each layer's distinct experts drawn from their exact law; "tokens"
    max_iterations: int = 100_000
    scan_chunk: int = 64
    allow_roofline: bool = False  # with a measured table: the roofline where it has no curve (else NaN, counted)
    parts: tuple[str, ...] = ("tiers",)  # the system's parts, in engine order (hbfjax.serve.parts.ORDER)
    timing_kind: str = "organisation"  # TIMINGS
    reads: ReadsConfig = field(default_factory=ReadsConfig)  # static shape of the reads part
    blocks: BlocksConfig = field(default_factory=BlocksConfig)  # static shape of the blocks part

    def __post_init__(self) -> None:
        c = type(self).__name__
        require(isinstance(self.model, ModelSpec), c, "model", self.model, "must be a ModelSpec")
        require_int(c, "max_pass_tokens", self.max_pass_tokens, 1, routing.MAX_TOKENS)
        require_int(c, "max_iterations", self.max_iterations, 1)
        require_int(c, "scan_chunk", self.scan_chunk, 1)
        require_choice(c, "routing_draw", self.routing_draw, ROUTING_DRAWS)
        require(self.routing_draw == "tokens" or self.routing_kind == "uniform", c, "routing_draw", self.routing_draw,
                f"drawing counts needs uniform routing (routing_kind = {self.routing_kind!r}); use 'tokens'")
        require_choice(c, "timing_kind", self.timing_kind, TIMINGS)
        part_modules.check_parts(self.parts)
        require(self.batcher.tasks == (self.requests.tasks or 0), c, "batcher.tasks", self.batcher.tasks,
                f"must be the request stream's closed-loop tasks ({self.requests.tasks or 0}; 0: an open loop)")
        require(self.timing_kind == "organisation" or not self.parts, c, "parts", self.parts,
                "the CPU-offloading timing has no HBF: give no parts")
        require(self.timing_kind == "organisation" or self.model.is_moe, c, "model", self.model.name,
                "the CPU-offloading systems serve MoE models")
        if self.model.is_moe:
            self.routing  # validates the routing kind against the model  # noqa: B018

    @property
    def timing(self) -> timing.TimingConfig:
        return timing.TimingConfig(model=self.model, allow_roofline=self.allow_roofline)

    @property
    def routing(self) -> routing.RoutingConfig:
        m = self.model
        return routing.RoutingConfig(routed_experts=m.routed_experts, top_k=m.top_k, shared_experts=m.shared_experts,
                                     kind=self.routing_kind, max_tokens=self.max_pass_tokens)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ServeRelax:
    """Relaxed (differentiable) runs for gradient tuning only (DESIGN.md §6); each field None is exact.
    Being None or an array is pytree structure, so the choice is static: the exact engine compiles as
    before."""

    delivery_us: jax.Array | None = None  # float32[] µs: the experts' split and path maxima (memory.delivery)
    sram_pages: jax.Array | None = None  # float32[] pages: the SRAM split's caps and forced writebacks (parts.sram)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ServeKnobs:
    """Everything a sweep may vary without recompiling: the organisation and its KV policy, the GPU, the
    batcher, the request stream, the routing skew, the KV budgets, the SRAM split, the CPU systems'
    knobs. Optional fields are None where a system has no such thing (``org`` and ``policy`` for the
    CPU systems, ``cpu`` for the HBF ones, ``sram_shares`` without a split, ``relax`` when exact): the
    structure of the knobs is static, so systems of one structure stack on one knob axis."""

    gpu: timing.GpuKnobs
    batcher: BatcherKnobs
    requests: rq.RequestKnobs
    routing: routing.RoutingKnobs
    org: OrgKnobs | None = None
    policy: PolicyKnobs | None = None  # the KV policy in HBF (HBFlex §5) the parts read
    hbm_kv_budget_bytes: jax.Array = None  # float32[] HBM-resident KV above which writeback starts; < 0: derived
    kv_room_bytes: jax.Array = None  # float32[] HBF KV room; < 0: all the HBF the weights leave
    label_interval_us: jax.Array = None  # float32[] lifetime-label width on the root start time (HBFlex §5.4)
    sram_shares: jax.Array | None = None  # float32[3] offload, prefetch, KV-buffer shares of the SRAM (parts.sram)
    cpu: cpu_offload.CpuKnobs | None = None  # the CPU-offloading systems (timing_kind "cpu-offload")
    relax: ServeRelax | None = None
    reclaim: part_modules.reclaim.ReclaimKnobs | None = None  # read disturb and refresh (the reclaim part)

    @classmethod
    def make(cls, org: OrgKnobs | None, gpu: timing.GpuKnobs, batcher: BatcherKnobs, requests: rq.RequestKnobs,
             routing_knobs: routing.RoutingKnobs | None = None, hbm_kv_budget_bytes: float | None = None, *,
             policy: PolicyKnobs | None = None, kv_room_bytes: float | None = None, label_interval_s: float = 60.0,
             sram_shares=None, cpu: cpu_offload.CpuKnobs | None = None, relax: ServeRelax | None = None,
             reclaim=None) -> "ServeKnobs":
        """Validated knobs. ``hbm_kv_budget_bytes`` None: every HBM byte the placed weights leave
        (``kv_tiers.capacity_tokens``); the batcher's ``kv_capacity_tokens`` caps admission further
        (its default is unbounded). ``policy`` None: DASH's (``hbf_packages.dash_policy``) for an
        organisation, none without one. ``kv_room_bytes``: a smaller HBF KV room than the weights
        leave (a short run then cycles its KV through eviction and GC as a long one does); None: all
        of it. ``label_interval_s``: width of a lifetime label in root-start time (HBFlex §5.4 does
        not state it; 60 s assumed). ``sram_shares``: three shares summing to 1 (``parts.sram``)."""
        c = cls.__name__
        require(org is not None or cpu is not None, c, "org", org, "give an organisation (or CPU knobs)")
        budget = -1.0 if hbm_kv_budget_bytes is None else require_real(
            c, "hbm_kv_budget_bytes", hbm_kv_budget_bytes, 0.0, 1e15)
        room = -1.0 if kv_room_bytes is None else require_real(c, "kv_room_bytes", kv_room_bytes, 0.0, 1e15,
                                                                 lo_open=True)
        require_real(c, "label_interval_s", label_interval_s, 0.0, 1e9, lo_open=True)
        if sram_shares is not None:
            shares = [require_real(c, f"sram_shares[{k}]", v, 0.0, 1.0) for k, v in enumerate(sram_shares)]
            require(len(shares) == 3 and abs(sum(shares) - 1.0) <= 1e-5, c, "sram_shares", shares,
                    "must be three shares (offload, prefetch, KV buffer) summing to 1")
            sram_shares = jnp.asarray(shares, jnp.float32)
        if policy is None and org is not None:
            policy = dash_policy()
        return cls(gpu=gpu, batcher=batcher, requests=requests,
                   routing=routing.RoutingKnobs.make() if routing_knobs is None else routing_knobs,
                   org=org, policy=policy, hbm_kv_budget_bytes=jnp.float32(budget), kv_room_bytes=jnp.float32(room),
                   label_interval_us=jnp.float32(label_interval_s * 1e6), sram_shares=sram_shares, cpu=cpu,
                   relax=relax, reclaim=reclaim)

    @property
    def delivery_relax_us(self):
        """float32[] µs of the relaxed expert delivery, or None (exact)."""
        return None if self.relax is None else self.relax.delivery_us


class Totals(NamedTuple):
    """Sums over one stream's run (float32[] each; bytes, µs, byte·µs)."""

    busy_us: jax.Array  # time with work: the sum of pass times (idle gaps and chunk work excluded)
    prefill_write_bytes: jax.Array  # new KV written from the GPU straight to HBF (direct prefill write)
    writeback_bytes: jax.Array  # decode KV written back from HBM to HBF (all-HBF: decode KV programmed)
    write_stall_us: jax.Array  # KV-write time beyond its windows, on the critical path
    program_busy_us: jax.Array  # HBF program time (page waves or rounds × tPROG)
    writeback_passes: jax.Array  # passes that wrote back
    expert_direct_bytes: jax.Array  # routed-expert bytes over Direct
    expert_relay_bytes: jax.Array  # routed-expert bytes over Relay
    hbm_read_bytes: jax.Array  # other bytes (weights, KV) read from HBM
    hbf_read_bytes: jax.Array  # other bytes read from HBF
    kv_hbm_byte_us: jax.Array  # ∫ HBM-resident KV bytes dt over the busy time
    kv_hbf_byte_us: jax.Array  # ∫ HBF-resident KV bytes dt over the busy time
    max_kv_hbm_bytes: jax.Array  # most HBM-resident KV at the end of a pass
    max_kv_hbf_bytes: jax.Array  # most HBF-resident KV at the end of a pass
    table_miss_passes: jax.Array  # passes with an operator outside the measured table (its time NaN)
    passes: jax.Array  # passes with work
    chunk_stall_us: jax.Array  # every-chunk work (GC migrations) exposed in the next iteration, not in busy_us
    pcie_bytes: jax.Array  # the CPU systems' PCIe traffic (streamed experts, activations); 0 on an organisation
    host_dram_bytes: jax.Array  # the CPU systems' expert weights read from host DRAM; 0 on an organisation
    cpu_flops: jax.Array  # FLOPs the host CPU computed (the CPU systems' experts); 0 on an organisation
    allreduce_us: jax.Array  # tensor-parallel all-reduce time inside busy_us (layer_time.allreduce_us); 0 on one GPU

    PEAKS = ("max_kv_hbm_bytes", "max_kv_hbf_bytes")


class ServeInputs(NamedTuple):
    """What ``simulate`` reads besides its knobs (the same for every stream and knob point): a trace to
    replay, a measured GPU table (``profile_table.ProfileTable.curves()``), the tabulated read laws of
    the reads part (``parts.reads.read_laws``) and the CPU systems' laws of resident experts
    (``cpu_offload.resident_laws``), each None where unused: laws tabulated on the host are inputs
    looked up by the values they were drawn for, never knobs that could go stale. ``simulate`` also
    takes a bare ``requests.TraceInputs`` (or None) as its inputs."""

    trace: rq.TraceInputs | None = None
    table: object = None  # profile_table.Curves | None
    read_laws: ReadLaws | None = None
    resident_laws: cpu_offload.ResidentLaws | None = None  # the CPU systems' laws of resident experts


class PartOutput(NamedTuple):
    """What a run keeps of one part: its totals and what its ``finish`` hook returns of its final state."""

    totals: Any  # the part's totals record (float32[] fields), or None
    final: Any  # e.g. the session cache or the block store; None


class ServeOutput(NamedTuple):
    """One stream's run: per-request times (``Clock[R]``), loop facts, totals."""

    arrival: Clock  # Clock[R]
    first_token: Clock  # Clock[R]
    finish: Clock  # Clock[R]
    tokens_out: jax.Array  # int32[R]
    valid: jax.Array  # bool[R]
    iterations: jax.Array  # int32[] iterations with work
    overflow: jax.Array  # bool[] a request never fitted, max_iterations ran out, or a part's buffer filled
    missing_inputs: jax.Array  # bool[] the inputs lacked a tabulated law the knobs need (the run is invalid)
    totals: Totals  # float32[] each: the run's write, read and occupancy sums
    parts: dict  # {part name: PartOutput}
    kv_tokens: jax.Array  # int32[R] each request's whole KV (prompt + output tokens)
    room_tokens: jax.Array  # int32[] the HBF KV room (−1: no HBF, the CPU systems)


def pass_times(words: tuple, batch: timing.Batch, draw, knobs: ServeKnobs, config: ServeConfig,
               kv_hbm_fraction=0.0, table=None, delivery_table=None, kv_hbf_factor=1.0) -> layer_time.LayerTimes:
    """Per-layer times of one pass (:func:`pass_routing`), composed on the organisation with the HBM
    share of the attention's KV reads (one float32[] or a (decode, chunk) pair;
    ``kv_tiers.read_shares``) and the GPU times of the roofline or of a measured ``table``
    (``delivery_table``: :func:`delivery_table`, the same times faster; ``kv_hbf_factor``: the HBF KV
    reads' read-wave amplification, ``layer_time.layer_times``)."""
    needed, rows = pass_routing(words, batch, draw, knobs.routing, config)
    times = layer_time.layer_times(batch, needed, rows, kv_hbm_fraction, knobs.gpu, knobs.org, config.timing, table,
                                   delivery_table, kv_hbf_factor, knobs.delivery_relax_us)
    return times._replace(needed=needed)  # the reclaim part reads the same draw


def delivery_table(knobs: ServeKnobs, config: ServeConfig):
    """The organisation's expert deliveries for 0 … E needed experts of this model (None for a dense
    model): built once per run, looked up by every layer of every pass."""
    if not config.model.is_moe:
        return None
    return delivery.expert_delivery_table(config.model.routed_experts, layer_time.expert_bytes(config.model), knobs.org,
                                          knobs.delivery_relax_us)


def room_tokens(knobs: ServeKnobs, capacity: kv_tiers.Capacity, model: ModelSpec) -> jax.Array:
    """int32[] the HBF KV room: what the weights leave, or ``kv_room_bytes`` where that is smaller."""
    given = jnp.floor(knobs.kv_room_bytes / float(model.kv_bytes_per_token)).astype(jnp.int32)
    return jnp.where(knobs.kv_room_bytes >= 0, jnp.minimum(given, capacity.hbf_tokens), capacity.hbf_tokens)


class _Carry(NamedTuple):
    """The engine's state beside the batcher's (one stream)."""

    states: tuple  # each part's state, in ServeConfig.parts order
    core: totals.Accumulator  # Totals
    part_totals: tuple  # each part's totals.Accumulator (None where it has no totals)
    last_request: jax.Array  # int32[B] each slot's request at the last boundary (−1: empty)
    pending_us: jax.Array  # float32[] chunk work to add to the next iteration


def _unpack_inputs(inputs) -> ServeInputs:
    return inputs if isinstance(inputs, ServeInputs) else ServeInputs(trace=inputs)


def _layer_timer(words, knobs: ServeKnobs, config: ServeConfig, inputs: ServeInputs):
    """(``times(view, reads)`` of a pass, bool[] an input it needs is missing)."""
    if config.timing_kind == "cpu-offload":
        require(inputs.resident_laws is not None, "engine.simulate", "inputs.resident_laws", None,
                "the CPU systems need their laws of resident experts (cpu_offload.resident_laws)")
        cdf, found = cpu_offload.lookup(inputs.resident_laws, knobs.cpu.resident_experts)
        return (lambda view, reads: cpu_offload.pass_times(words, view.batch, view.draw, knobs, cdf, config)), ~found
    experts = delivery_table(knobs, config)
    return (lambda view, reads: pass_times(words, view.batch, view.draw, knobs, config, reads.hbm_share, inputs.table,
                                           experts, reads.hbf_factor)), jnp.bool_(False)


def mechanism(words: tuple, knobs: ServeKnobs, config: ServeConfig, parts: tuple, layers_of) -> batching.Mechanism:
    """The batcher mechanism of the module docstring: every iteration's passes timed with ``parts``
    (``part.Part`` instances in ``config.parts`` order) composed around ``layers_of(view, reads)``,
    the pass's layer times."""
    slots = config.batcher.slots
    per_token = float(config.model.kv_bytes_per_token)

    def admit(carry: _Carry, st, new):
        req = st.slots.request
        finished = (carry.last_request >= 0) & (carry.last_request != req)
        view = AdmitView(state=st, new=new, finished=finished, finished_request=jnp.where(finished, carry.last_request, -1))
        record = Admission(reused=jnp.zeros(slots, jnp.int32), retired_hbm_tokens=jnp.zeros(slots, jnp.int32),
                           kept_tokens=jnp.full(slots, -1, jnp.int32))
        states, part_totals = list(carry.states), list(carry.part_totals)
        for k, p in enumerate(parts):
            if p.admit is not None:
                states[k], record, t = p.admit(states[k], view, record)
                if t is not None:
                    part_totals[k] = totals.add(part_totals[k], t)
        return record.reused, carry._replace(states=tuple(states), part_totals=tuple(part_totals), last_request=req)

    def one_pass(carry: _Carry, view: PassView, first: bool):
        states, part_totals = list(carry.states), list(carry.part_totals)
        work = batching.has_work(view.batch)
        adds = [None] * len(parts)
        reads = no_reads(view)
        for k, p in enumerate(parts):
            if p.reads is not None:
                states[k], reads, t = p.reads(states[k], view, reads)
                adds[k] = t
        times = layers_of(view, reads)
        writes = no_writes(view)
        for k, p in enumerate(parts):
            if p.writes is not None:
                states[k], writes, t = p.writes(states[k], view, reads, times, writes)
                adds[k] = t if adds[k] is None else jax.tree_util.tree_map(jnp.add, adds[k], t)
        us = jnp.where(work, times.iteration_us + writes.stall_us, 0.0)
        hbm_kv, hbf_kv = writes.kv_hbm_tokens * per_token, writes.kv_hbf_tokens * per_token
        core = totals.masked(Totals(
            busy_us=us, prefill_write_bytes=writes.prefill_write_bytes, writeback_bytes=writes.writeback_bytes,
            write_stall_us=writes.stall_us, program_busy_us=writes.program_busy_us,
            writeback_passes=writes.writeback_passes, expert_direct_bytes=times.expert_direct_bytes.sum(),
            expert_relay_bytes=times.expert_relay_bytes.sum(), hbm_read_bytes=times.hbm_read_bytes,
            hbf_read_bytes=times.hbf_read_bytes, kv_hbm_byte_us=hbm_kv * us, kv_hbf_byte_us=hbf_kv * us,
            max_kv_hbm_bytes=hbm_kv, max_kv_hbf_bytes=hbf_kv, table_miss_passes=times.table_miss, passes=work,
            chunk_stall_us=0.0, pcie_bytes=times.pcie_bytes, host_dram_bytes=times.host_dram_bytes,
            cpu_flops=times.cpu_flops, allreduce_us=times.allreduce_us.sum()), work)
        if first:  # the pending chunk work is booked once per iteration, with or without work
            core = core._replace(chunk_stall_us=carry.pending_us)
        for k, t in enumerate(adds):
            if t is not None:
                part_totals[k] = totals.add(part_totals[k], totals.masked(t, work))
        kept = tuple(jax.tree_util.tree_map(lambda a, b: jnp.where(work, a, b), new, old)
                     for new, old in zip(states, carry.states))
        return us, carry._replace(states=kept, part_totals=tuple(part_totals), core=totals.add(carry.core, core))

    def iteration(carry: _Carry, st, batch, i):
        kv_tokens = st.slots.kv_tokens
        total_us = carry.pending_us
        for k, p in enumerate(batching.passes(batch, config.batcher.mode)):
            view = PassView(words=words, draw=2 * jnp.asarray(i, jnp.int32) + k, batch=p, kv_tokens=kv_tokens,
                            request=st.slots.request)
            us, carry = one_pass(carry, view, k == 0)
            total_us = total_us + us
            kv_tokens = kv_tokens + jnp.where(p.chunk_mask, p.chunk_tokens, 0) + p.decode_mask.astype(jnp.int32)
        return total_us, carry._replace(pending_us=jnp.float32(0.0))

    def every_chunk(carry: _Carry) -> _Carry:
        record = Chunk(evicted=jnp.zeros(config.requests.requests, bool), exposed_us=jnp.float32(0.0))
        states = list(carry.states)
        for k, p in enumerate(parts):
            if p.every_chunk is not None:
                states[k], record = p.every_chunk(states[k], record)
        return carry._replace(states=tuple(states), pending_us=carry.pending_us + record.exposed_us)

    def init() -> _Carry:
        return _Carry(states=tuple(p.init() for p in parts), core=totals.zeros(Totals),
                      part_totals=tuple(None if p.totals is None else totals.zeros(p.totals) for p in parts),
                      last_request=jnp.full(slots, -1, jnp.int32), pending_us=jnp.float32(0.0))

    chunked = every_chunk if any(p.every_chunk is not None for p in parts) else None
    return batching.Mechanism(init=init, iteration=iteration, admit=admit, every_chunk=chunked)


def simulate(stream_id, seed, knobs: ServeKnobs, inputs, config: ServeConfig) -> ServeOutput:
    """Serve one stream's requests to the end on the system (module docstring); ``inputs``:
    :class:`ServeInputs`, or a trace's ``requests.TraceInputs`` for replay, or None."""
    inputs = _unpack_inputs(inputs)
    reqs = rq.generate(stream_id, seed, knobs.requests, inputs.trace, config.requests)
    words = (seed, stream_id)
    batcher = knobs.batcher
    capacity = room = None
    if config.timing_kind == "organisation":
        capacity = kv_tiers.capacity_tokens(knobs.org, config.model, knobs.hbm_kv_budget_bytes)
        room = room_tokens(knobs, capacity, config.model)
    run = RunView(words=words, requests=reqs, inputs=inputs, capacity=capacity, room_tokens=room)
    parts = tuple(part_modules.build(name, knobs, config, run) for name in config.parts)
    if "tiers" in config.parts:
        batcher = part_modules.tiers.batcher_knobs(knobs, run)
    layers_of, missing = _layer_timer(words, knobs, config, inputs)
    st, carry = batching.run(reqs, batcher, config.batcher, mechanism(words, knobs, config, parts, layers_of),
                             config.max_iterations, config.scan_chunk, varying=(words, knobs, reqs))
    outputs, overflow = {}, st.overflow
    for name, p, state, acc in zip(config.parts, parts, carry.states, carry.part_totals):
        final = None
        if p.finish is not None:
            final, part_overflow = p.finish(state)
            overflow = overflow | part_overflow
        if p.missing_inputs is not None:
            missing = missing | p.missing_inputs
        outputs[name] = PartOutput(totals=None if acc is None else totals.value(acc, p.totals), final=final)
    arrival = st.arrival if config.batcher.tasks else reqs.arrival  # a closed loop issued its own
    return ServeOutput(arrival=arrival, first_token=st.first_token, finish=st.finish, tokens_out=st.tokens_out,
                       valid=reqs.valid, iterations=st.iterations, overflow=overflow, missing_inputs=missing,
                       totals=totals.value(carry.core, Totals), parts=outputs,
                       kv_tokens=reqs.prompt_tokens + reqs.output_tokens,
                       room_tokens=jnp.int32(-1) if room is None else room)
