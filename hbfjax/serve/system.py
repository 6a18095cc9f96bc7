"""One stream served on one memory organisation (DESIGN.md §5): requests → the Sarathi batcher →
for every pass, the routing of every MoE layer → per-layer time on the organisation → the clock.

``simulate(stream_id, seed, knobs, inputs, config)`` is the batch protocol (``hbfjax.batch.run`` vmaps
it over streams, and over organisations stacked on a knob axis, which then compare on common random
numbers: requests and routing hash only (seed, stream, request / pass, layer)). Its output holds each
request's arrival, first-token and finish times; ``hbfjax.serve.metrics`` turns them into TTFT, TPOT,
E2E and throughput on the host.

What is composed so far, and what is not yet:

* composed: the batcher (``batching.rollout``: admission by KV reservation over HBM then HBF, one
  decode token per running request, one chunk per prefilling request within the token budget; mixed,
  serial or alternate passes), honest per-layer routing (``routing.route_layers``, drawn per pass and
  layer; ``ServeConfig.routing_draw``), GPU operator costs with each operator's weights and KV delivered by the organisation
  (``layer_time.layer_times``: replicated projections read from both tiers, experts over Direct and
  Relay, lookahead);
* not yet: KV writes (direct prefill write, decode writeback of page waves) and their stalls, the
  split of each request's KV between HBM and HBF (a traced knob, ``kv_hbm_fraction``, stands in: the
  share of the KV attention reads that sits in HBM), plane collisions of HBF KV reads, GC, prefix
  reuse, and the CPU-offloading systems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.clock import Clock
from hbfjax.memory.organisations import OrgKnobs
from hbfjax.serve import batching, layer_time
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
        return timing.TimingConfig(model=self.model)

    @property
    def routing(self) -> routing.RoutingConfig:
        m = self.model
        return routing.RoutingConfig(routed_experts=m.routed_experts, top_k=m.top_k, shared_experts=m.shared_experts,
                                     kind=self.routing_kind, max_tokens=self.max_pass_tokens)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ServeKnobs:
    """Everything a sweep may vary without recompiling: the organisation, the GPU, the batcher, the
    request stream, the routing skew, and the stand-in for the KV tier split."""

    org: OrgKnobs
    gpu: timing.GpuKnobs
    batcher: BatcherKnobs
    requests: rq.RequestKnobs
    routing: routing.RoutingKnobs
    kv_hbm_fraction: jax.Array  # float32[] share of the KV attention reads that is held in HBM

    @classmethod
    def make(cls, org: OrgKnobs, gpu: timing.GpuKnobs, batcher: BatcherKnobs, requests: rq.RequestKnobs,
             routing_knobs: routing.RoutingKnobs | None = None, kv_hbm_fraction: float = 0.0) -> "ServeKnobs":
        f = require_real(cls.__name__, "kv_hbm_fraction", kv_hbm_fraction, 0.0, 1.0)
        return cls(org=org, gpu=gpu, batcher=batcher, requests=requests,
                   routing=routing.RoutingKnobs.make() if routing_knobs is None else routing_knobs,
                   kv_hbm_fraction=jnp.float32(f))


class ServeOutput(NamedTuple):
    """One stream's run: per-request times (``Clock[R]``) and loop facts."""

    arrival: Clock  # Clock[R]
    first_token: Clock  # Clock[R]
    finish: Clock  # Clock[R]
    tokens_out: jax.Array  # int32[R]
    valid: jax.Array  # bool[R]
    iterations: jax.Array  # int32[] iterations with work
    overflow: jax.Array  # bool[] a request never fitted, or max_iterations ran out


def pass_tokens(batch: timing.Batch) -> jax.Array:
    """int32[] tokens of one pass: its decode tokens and its chunks' tokens."""
    return batch.decode_mask.sum(dtype=jnp.int32) + jnp.where(batch.chunk_mask, batch.chunk_tokens, 0).sum(dtype=jnp.int32)


def pass_times(words: tuple, batch: timing.Batch, draw, knobs: ServeKnobs, config: ServeConfig) -> layer_time.LayerTimes:
    """Per-layer times of one pass: every MoE layer routed for this pass (``words`` = (seed, stream),
    ``draw`` the pass's draw index), then composed on the organisation."""
    model = config.model
    if model.is_moe:
        rc = config.routing
        moe_layers = jnp.asarray([i for i, k in enumerate(model.layer_kinds) if k == "moe"], jnp.int32)
        tokens = pass_tokens(batch)
        if config.routing_draw == "counts":
            r = routing.count_routing(routing.distinct_count_draws(words, draw, moe_layers, tokens, rc), tokens, rc)
        else:
            r = routing.route_layers(words, draw, moe_layers, routing.active_mask(tokens, rc), knobs.routing, rc)
        needed, rows = r.needed, r.rows
    else:
        needed, rows = jnp.zeros((0, 1), bool), jnp.zeros((0, 1), jnp.int32)
    return layer_time.layer_times(batch, needed, rows, knobs.kv_hbm_fraction, knobs.gpu, knobs.org, config.timing)


def simulate(stream_id, seed, knobs: ServeKnobs, inputs, config: ServeConfig) -> ServeOutput:
    """Serve one stream's requests to the end (module docstring); ``inputs``: a trace's
    ``requests.TraceInputs`` for replay, else None."""
    reqs = rq.generate(stream_id, seed, knobs.requests, inputs, config.requests)
    words = (seed, stream_id)

    def pass_us(batch, draw):
        return pass_times(words, batch, draw, knobs, config).iteration_us

    st = batching.rollout(reqs, knobs.batcher, config.batcher, pass_us, config.max_iterations, config.scan_chunk)
    return ServeOutput(arrival=reqs.arrival, first_token=st.first_token, finish=st.finish, tokens_out=st.tokens_out,
                       valid=reqs.valid, iterations=st.iterations, overflow=st.overflow)
