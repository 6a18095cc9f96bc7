"""One stream served on one memory organisation (DESIGN.md §5): requests → the Sarathi batcher →
for every pass, the routing of every MoE layer → per-layer time on the organisation → the clock.

``simulate(stream_id, seed, knobs, inputs, config)`` is the batch protocol (``hbfjax.batch.run`` vmaps
it over streams, and over organisations stacked on a knob axis, which then compare on common random
numbers: requests and routing hash only (seed, stream, request / pass, layer)). Its output holds each
request's arrival, first-token and finish times; ``hbfjax.serve.metrics`` turns them into TTFT, TPOT,
E2E and throughput on the host.

What is composed so far, and what is not yet:

* composed: the batcher (``batching.run``: admission while the whole KV fits the organisation's HBM
  KV budget plus the HBF the weights leave, one decode token per running request, one chunk per
  prefilling request within the token budget; mixed, serial or alternate passes), honest per-layer
  routing (``routing.route_layers`` or ``count_routing``, drawn per pass and layer;
  ``ServeConfig.routing_draw``), GPU operator costs with each operator's weights and KV delivered by
  the organisation (``layer_time.layer_times``: replicated projections read from both tiers, experts
  over Direct and Relay, lookahead), where each request's KV lives (``kv_tiers``: prefill KV written
  straight to HBF, decode KV appended in HBM and written back in page waves once the HBM KV budget is
  exceeded; attention reads each tier's share in parallel), and the KV writes' exposed stalls
  (``layer_time.kv_writes``);
  GPU operator times from the roofline or from a measured table (``ServeInputs.table``);
* not yet: plane collisions of HBF KV reads with programs, GC, prefix reuse.

Totals of the run (``ServeOutput.totals``) are float32 sums kept with Kahan compensation, so a
million-iteration run loses no more than float32 rounding of the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.clock import Clock
from hbfjax.memory import delivery
from hbfjax.memory.organisations import OrgKnobs
from hbfjax.serve import batching, kv_tiers, layer_time
from hbfjax.serve.state import BatcherConfig, BatcherKnobs
from hbfjax.validate import require, require_choice, require_int, require_real
from hbfjax.workload import requests as rq
from hbfjax.workload import routing, timing
from hbfjax.workload.models import ModelSpec


# How a pass's routing is drawn (DESIGN.md §5: per-layer randomness drawn honestly):
# * "counts": each MoE layer's number of distinct experts drawn from its exact law under uniform top-k
#   (routing.distinct_count_draws, O(E) per layer whatever the pass's tokens); the T·k rows shared by
#   them evenly. Exact for what the roofline and the delivery use (distinct experts, total rows).
# * "tokens": every token's top-k drawn (routing.route_layers; any routing kind), O(max_pass_tokens)
#   per layer even for a decode pass of a few tokens.
ROUTING_DRAWS = ("counts", "tokens")


def pass_token_bound(slots: int, chunk_tokens: int, token_budget: int) -> int:
    """The most tokens one pass can hold (``ServeConfig.max_pass_tokens``): a decode token per slot and a
    chunk per slot, within the iteration token budget."""
    return min(token_budget, slots + slots * chunk_tokens)


@dataclass(frozen=True)
class ServeConfig:
    """Static shape of a serving run: the model, the batcher, the request stream, the routing kind, and
    bounds on the loop (``max_pass_tokens`` is routing's token axis: the most tokens one pass holds)."""

    model: ModelSpec
    batcher: BatcherConfig
    requests: rq.RequestsConfig
    max_pass_tokens: int
    routing_kind: str = "uniform"
    routing_draw: str = "counts"  # "counts": each layer's distinct experts drawn from their exact law; "tokens"
    max_iterations: int = 100_000
    scan_chunk: int = 64
    allow_roofline: bool = False  # with a measured table: the roofline where it has no curve (else NaN, counted)

    def __post_init__(self) -> None:
        c = type(self).__name__
        require(isinstance(self.model, ModelSpec), c, "model", self.model, "must be a ModelSpec")
        require_int(c, "max_pass_tokens", self.max_pass_tokens, 1, routing.MAX_TOKENS)
        require_int(c, "max_iterations", self.max_iterations, 1)
        require_int(c, "scan_chunk", self.scan_chunk, 1)
        require_choice(c, "routing_draw", self.routing_draw, ROUTING_DRAWS)
        require(self.routing_draw == "tokens" or self.routing_kind == "uniform", c, "routing_draw", self.routing_draw,
                f"drawing counts needs uniform routing (routing_kind = {self.routing_kind!r}); use 'tokens'")
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
class ServeKnobs:
    """Everything a sweep may vary without recompiling: the organisation, the GPU, the batcher, the
    request stream, the routing skew, and the HBM KV budget. ``relax_temperature_us`` None (the default)
    is the exact engine; a float32[] relaxes the expert delivery's split and maxima at that temperature
    in µs (``hbfjax.memory.delivery`` "Relaxation"; DESIGN.md §6), for gradient tuning only. Being None
    or an array is pytree structure, so the choice is static: the exact engine compiles as before."""

    org: OrgKnobs
    gpu: timing.GpuKnobs
    batcher: BatcherKnobs
    requests: rq.RequestKnobs
    routing: routing.RoutingKnobs
    hbm_kv_budget_bytes: jax.Array  # float32[] HBM-resident KV above which writeback starts; < 0: derived
    relax_temperature_us: jax.Array | None = None  # float32[] > 0: relaxed delivery (tuning); None: exact

    @classmethod
    def make(cls, org: OrgKnobs, gpu: timing.GpuKnobs, batcher: BatcherKnobs, requests: rq.RequestKnobs,
             routing_knobs: routing.RoutingKnobs | None = None, hbm_kv_budget_bytes: float | None = None) -> "ServeKnobs":
        """``hbm_kv_budget_bytes`` None: every HBM byte the placed weights leave (``kv_tiers.capacity_tokens``);
        the batcher's ``kv_capacity_tokens`` caps admission further (its default is unbounded)."""
        budget = -1.0 if hbm_kv_budget_bytes is None else require_real(
            cls.__name__, "hbm_kv_budget_bytes", hbm_kv_budget_bytes, 0.0, 1e15)
        return cls(org=org, gpu=gpu, batcher=batcher, requests=requests,
                   routing=routing.RoutingKnobs.make() if routing_knobs is None else routing_knobs,
                   hbm_kv_budget_bytes=jnp.float32(budget))


class Totals(NamedTuple):
    """Sums over one stream's run (float32[] each; bytes, µs, byte·µs)."""

    busy_us: jax.Array  # time with work: the sum of iteration times (idle gaps excluded)
    prefill_write_bytes: jax.Array  # new KV written from the GPU straight to HBF (direct prefill write)
    writeback_bytes: jax.Array  # decode KV written back from HBM to HBF
    write_stall_us: jax.Array  # KV-write time beyond its windows, on the critical path
    program_busy_us: jax.Array  # HBF page-wave programs × tPROG
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


_IS_MAX = np.array([name.startswith("max_") for name in Totals._fields])  # running maxima, not sums


def _accumulate(sums: jax.Array, comp: jax.Array, add: Totals) -> tuple[jax.Array, jax.Array]:
    """Kahan-compensated ``sums + add`` over the stacked fields (float32[F]; the ``max_`` fields: running
    maxima). The carry holds the stacked vector: one vector op per step instead of one per field."""
    x = jnp.stack([jnp.asarray(v, jnp.float32) for v in add])
    y = x - comp
    t = sums + y
    return jnp.where(_IS_MAX, jnp.maximum(sums, x), t), jnp.where(_IS_MAX, comp, (t - sums) - y)


class ServeInputs(NamedTuple):
    """What ``simulate`` reads besides its knobs (the same for every stream): a trace to replay and a
    measured GPU table (``profile_table.ProfileTable.curves()``), each or both None. ``simulate`` also
    takes a bare ``requests.TraceInputs`` (or None) as its inputs."""

    trace: rq.TraceInputs | None = None
    table: object = None  # profile_table.Curves | None


class ServeOutput(NamedTuple):
    """One stream's run: per-request times (``Clock[R]``) and loop facts."""

    arrival: Clock  # Clock[R]
    first_token: Clock  # Clock[R]
    finish: Clock  # Clock[R]
    tokens_out: jax.Array  # int32[R]
    valid: jax.Array  # bool[R]
    iterations: jax.Array  # int32[] iterations with work
    overflow: jax.Array  # bool[] a request never fitted, or max_iterations ran out
    totals: Totals | None  # float32[] each: the run's write, read and occupancy sums (None: not tracked, CPU systems)


def pass_tokens(batch: timing.Batch) -> jax.Array:
    """int32[] tokens of one pass: its decode tokens and its chunks' tokens."""
    return batch.decode_mask.sum(dtype=jnp.int32) + jnp.where(batch.chunk_mask, batch.chunk_tokens, 0).sum(dtype=jnp.int32)


def pass_routing(words: tuple, batch: timing.Batch, draw, knobs: ServeKnobs | routing.RoutingKnobs, config: ServeConfig,
                 compact: bool = True):
    """(needed, rows) of one pass: every MoE layer routed for its tokens (``words`` = (seed, stream),
    ``draw`` the pass's draw index; ``ServeConfig.routing_draw``): ``bool[L_moe, E]`` and
    ``int32[L_moe, E]``, or with count draws and ``compact``, the distinct counts ``int32[L_moe]`` and
    ``timing.EvenRows`` (the same costs at O(1) instead of O(E) per layer). ``compact=False`` returns
    the whole ``routing.Routing``. A dense model gets empty ``[0, 1]`` arrays."""
    model = config.model
    if not model.is_moe:
        return jnp.zeros((0, 1), bool), jnp.zeros((0, 1), jnp.int32)
    rc = config.routing
    moe_layers = jnp.asarray([i for i, k in enumerate(model.layer_kinds) if k == "moe"], jnp.int32)
    tokens = pass_tokens(batch)
    if config.routing_draw == "counts":
        distinct = routing.distinct_count_draws(words, draw, moe_layers, tokens, rc)
        if compact:
            total = jnp.broadcast_to(tokens * rc.top_k, distinct.shape)
            return distinct, timing.EvenRows(distinct=distinct, total=total)
        r = routing.count_routing(distinct, tokens, rc)
    else:
        rk = knobs.routing if isinstance(knobs, ServeKnobs) else knobs
        r = routing.route_layers(words, draw, moe_layers, routing.active_mask(tokens, rc), rk, rc)
    return r if not compact else (r.needed, r.rows)


def pass_times(words: tuple, batch: timing.Batch, draw, knobs: ServeKnobs, config: ServeConfig,
               kv_hbm_fraction=0.0, table=None, delivery_table=None, kv_hbf_factor=1.0) -> layer_time.LayerTimes:
    """Per-layer times of one pass (:func:`pass_routing`), composed on the organisation with the HBM
    share of the attention's KV reads (one float32[] or a (decode, chunk) pair;
    ``kv_tiers.read_shares``) and the GPU times of the roofline or of a measured ``table``
    (``delivery_table``: :func:`delivery_table`, the same times faster; ``kv_hbf_factor``: the HBF KV
    reads' read-wave amplification, ``layer_time.layer_times``)."""
    needed, rows = pass_routing(words, batch, draw, knobs, config)
    return layer_time.layer_times(batch, needed, rows, kv_hbm_fraction, knobs.gpu, knobs.org, config.timing, table,
                                  delivery_table, kv_hbf_factor, knobs.relax_temperature_us)


def delivery_table(knobs: ServeKnobs, config: ServeConfig):
    """The organisation's expert deliveries for 0 … E needed experts of this model (None for a dense
    model): built once per run, looked up by every layer of every pass."""
    if not config.model.is_moe:
        return None
    return delivery.expert_delivery_table(config.model.routed_experts, layer_time.expert_bytes(config.model), knobs.org,
                                          knobs.relax_temperature_us)


class PassResult(NamedTuple):
    """One pass composed: its time, the KV residency after it, and what it adds to the totals."""

    pass_us: jax.Array  # float32[] layers, LM head and exposed write stalls (0 for an empty pass)
    kv: kv_tiers.KvTiers
    totals: Totals


def serve_pass(words: tuple, kv: kv_tiers.KvTiers, kv_tokens, batch: timing.Batch, draw, capacity: kv_tiers.Capacity,
               knobs: ServeKnobs, config: ServeConfig, table=None, experts=None) -> PassResult:
    """One GPU pass on the organisation (module docstring): read shares from the KV residency, layer
    times, the pass's KV placed and written back, and the writes' exposed stall (``experts``: the run's
    :func:`delivery_table`). Relaxed knobs (``relax_temperature_us``) add the budget's straight-through
    derivative to the shares (:func:`kv_tiers.budget_straight_through`)."""
    shares = kv_tiers.read_shares(kv, kv_tokens, batch)
    if knobs.relax_temperature_us is not None:
        shares = kv_tiers.budget_straight_through(shares, kv, kv_tokens, batch, capacity, knobs.hbm_kv_budget_bytes,
                                                  float(config.model.kv_bytes_per_token))
    times = pass_times(words, batch, draw, knobs, config, shares, table, experts)
    new_kv, moves = kv_tiers.book(kv, kv_tokens, batch, knobs.org, capacity)
    writes = layer_time.kv_writes(times, moves.to_hbf_tokens, moves.writeback_tokens, knobs.org, config.model)
    work = batching.has_work(batch)
    us = jnp.where(work, times.iteration_us + writes.stall_us.sum(), 0.0)
    per_token = float(config.model.kv_bytes_per_token)
    hbm_kv, hbf_kv = moves.hbm_tokens * per_token, moves.hbf_tokens * per_token
    z = lambda x: jnp.where(work, jnp.asarray(x, jnp.float32), 0.0)  # noqa: E731
    add = Totals(busy_us=us, prefill_write_bytes=z(writes.direct_bytes), writeback_bytes=z(writes.writeback_bytes),
                 write_stall_us=z(writes.stall_us.sum()), program_busy_us=z(writes.program_busy_us),
                 writeback_passes=z(moves.writeback_tokens > 0), expert_direct_bytes=z(times.expert_direct_bytes.sum()),
                 expert_relay_bytes=z(times.expert_relay_bytes.sum()), hbm_read_bytes=z(times.hbm_read_bytes),
                 hbf_read_bytes=z(times.hbf_read_bytes), kv_hbm_byte_us=z(hbm_kv * us), kv_hbf_byte_us=z(hbf_kv * us),
                 max_kv_hbm_bytes=z(hbm_kv), max_kv_hbf_bytes=z(hbf_kv), table_miss_passes=z(times.table_miss))
    return PassResult(pass_us=us, kv=jax.tree_util.tree_map(lambda a, b: jnp.where(work, a, b), new_kv, kv), totals=add)


def admission_capacity(capacity: kv_tiers.Capacity, batcher: BatcherKnobs) -> BatcherKnobs:
    """The batcher's knobs with its tier capacities the organisation's (HBM budget, HBF room), cut
    to the batcher's own total where that is smaller."""
    cap = batcher.kv_capacity_tokens.sum()
    hbm = jnp.minimum(capacity.hbm_budget_tokens, cap)
    hbf = jnp.minimum(capacity.hbf_tokens, cap - hbm)
    tiers = batcher.kv_capacity_tokens.shape[0]
    caps = jnp.zeros(tiers, jnp.int32).at[0].set(hbm).at[min(1, tiers - 1)].add(hbf)
    return BatcherKnobs(chunk_tokens=batcher.chunk_tokens, token_budget=batcher.token_budget, kv_capacity_tokens=caps)


def mechanism(words: tuple, knobs: ServeKnobs, config: ServeConfig, table=None,
              capacity: kv_tiers.Capacity | None = None) -> batching.Mechanism:
    """The iteration of :func:`serve_pass` for each of its passes, with the KV residency and the
    compensated totals as the carry (``capacity``: the organisation's, derived when None)."""
    if capacity is None:
        capacity = kv_tiers.capacity_tokens(knobs.org, config.model, knobs.hbm_kv_budget_bytes)
    experts = delivery_table(knobs, config)

    def iteration(carry, st, batch, i):
        kv, sums, comp = carry
        kv = kv_tiers.sync(kv, st.slots.request)
        kv_tokens = st.slots.kv_tokens
        total_us = jnp.float32(0.0)
        for k, p in enumerate(batching.passes(batch, config.batcher.mode)):
            r = serve_pass(words, kv, kv_tokens, p, 2 * jnp.asarray(i, jnp.int32) + k, capacity, knobs, config, table,
                           experts)
            kv, total_us = r.kv, total_us + r.pass_us
            sums, comp = _accumulate(sums, comp, r.totals)
            kv_tokens = kv_tokens + jnp.where(p.chunk_mask, p.chunk_tokens, 0) + p.decode_mask.astype(jnp.int32)
        return total_us, (kv, sums, comp)

    zeros = lambda: jnp.zeros(len(Totals._fields), jnp.float32)  # noqa: E731
    return batching.Mechanism(init=lambda: (kv_tiers.init(config.batcher.slots), zeros(), zeros()), iteration=iteration)


def simulate(stream_id, seed, knobs: ServeKnobs, inputs, config: ServeConfig) -> ServeOutput:
    """Serve one stream's requests to the end (module docstring); ``inputs``: :class:`ServeInputs`, or a
    trace's ``requests.TraceInputs`` for replay, or None."""
    trace, table = inputs if isinstance(inputs, ServeInputs) else (inputs, None)
    reqs = rq.generate(stream_id, seed, knobs.requests, trace, config.requests)
    capacity = kv_tiers.capacity_tokens(knobs.org, config.model, knobs.hbm_kv_budget_bytes)
    st, (_, totals, _) = batching.run(reqs, admission_capacity(capacity, knobs.batcher), config.batcher,
                                      mechanism((seed, stream_id), knobs, config, table, capacity), config.max_iterations,
                                      config.scan_chunk)
    return ServeOutput(arrival=reqs.arrival, first_token=st.first_token, finish=st.finish, tokens_out=st.tokens_out,
                       valid=reqs.valid, iterations=st.iterations, overflow=st.overflow, totals=Totals(*totals))


def totals_report(totals: Totals, org: OrgKnobs) -> dict:
    """Host ``{key: float64[S]}`` per stream from a run's totals (``Totals`` of float32[S]) on ``org``:
    write volumes, exposed stall, KV occupancy, and utilisations — each path's or link's bytes over
    what it could carry in the busy time (expert Direct and Relay paths, HBM and HBF reads by their
    cuts, the writeback route), and HBF program time over the busy time."""
    t = {k: np.asarray(v, np.float64) for k, v in totals._asdict().items()}
    busy_us = np.maximum(t["busy_us"], 1e-30)
    r = delivery.rates(org)
    cuts = delivery.read_cuts(org)

    def used(nbytes, gbps):
        gbps = float(gbps)
        return nbytes / (gbps * 1e3 * busy_us) if gbps > 0 else np.zeros_like(nbytes)

    return {
        "busy_s": t["busy_us"] * 1e-6,
        "write_stall_s": t["write_stall_us"] * 1e-6,
        "program_busy_s": t["program_busy_us"] * 1e-6,
        "prefill_write_gb": t["prefill_write_bytes"] * 1e-9,
        "writeback_gb": t["writeback_bytes"] * 1e-9,
        "writeback_passes": t["writeback_passes"],
        "mean_kv_hbm_gb": t["kv_hbm_byte_us"] / busy_us * 1e-9,
        "mean_kv_hbf_gb": t["kv_hbf_byte_us"] / busy_us * 1e-9,
        "max_kv_hbm_gb": t["max_kv_hbm_bytes"] * 1e-9,
        "max_kv_hbf_gb": t["max_kv_hbf_bytes"] * 1e-9,
        "utilisation_expert_direct": used(t["expert_direct_bytes"], r.direct_gbps),
        "utilisation_expert_relay": used(t["expert_relay_bytes"], r.relay_gbps),
        "utilisation_hbm_read": used(t["hbm_read_bytes"], cuts.hbm_gbps),
        "utilisation_hbf_read": used(t["hbf_read_bytes"] + t["expert_direct_bytes"] + t["expert_relay_bytes"],
                                     cuts.hbf_gbps),
        "utilisation_writeback_route": used(t["writeback_bytes"], delivery.hbm_to_hbf_gbps(org)),
        "utilisation_hbf_program": t["program_busy_us"] / busy_us,
    }
