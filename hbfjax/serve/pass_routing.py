"""The routing of one GPU pass: every MoE layer's experts for the pass's tokens (DESIGN.md §5: per-layer
randomness drawn honestly), shared by every timing of a pass (the organisations' layer times and the
CPU-offloading systems'), so that all systems see the same draws on a seed.

How a pass's routing is drawn (``ServeConfig.routing_draw``):

* ``"counts"``: each MoE layer's number of distinct experts drawn from its exact law under uniform top-k
  (``routing.distinct_count_draws``, O(E) per layer whatever the pass's tokens); the T·k rows shared by
  them evenly. Exact for what the roofline and the delivery use (distinct experts, total rows).
* ``"tokens"``: every token's top-k drawn (``routing.route_layers``; any routing kind),
  O(max_pass_tokens) per layer even for a decode pass of a few tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hbfjax.workload import routing, timing

ROUTING_DRAWS = ("counts", "tokens")


def pass_tokens(batch: timing.Batch) -> jax.Array:
    """int32[] tokens of one pass: its decode tokens and its chunks' tokens."""
    return batch.decode_mask.sum(dtype=jnp.int32) + jnp.where(batch.chunk_mask, batch.chunk_tokens, 0).sum(dtype=jnp.int32)


def moe_layer_indices(model) -> list[int]:
    """The model's MoE layers, in layer order."""
    return [i for i, k in enumerate(model.layer_kinds) if k == "moe"]


def pass_routing(words: tuple, batch: timing.Batch, draw, routing_knobs: routing.RoutingKnobs, config,
                 compact: bool = True):
    """(needed, rows) of one pass: every MoE layer routed for its tokens (``words`` = (seed, stream),
    ``draw`` the pass's draw index; ``config`` a ``ServeConfig``): ``bool[L_moe, E]`` and
    ``int32[L_moe, E]``, or with count draws and ``compact``, the distinct counts ``int32[L_moe]`` and
    ``timing.EvenRows`` (the same costs at O(1) instead of O(E) per layer). ``compact=False`` returns
    the whole ``routing.Routing``. A dense model gets empty ``[0, 1]`` arrays."""
    model = config.model
    if not model.is_moe:
        return jnp.zeros((0, 1), bool), jnp.zeros((0, 1), jnp.int32)
    rc = config.routing
    moe_layers = jnp.asarray(moe_layer_indices(model), jnp.int32)
    tokens = pass_tokens(batch)
    if config.routing_draw == "counts":
        distinct = routing.distinct_count_draws(words, draw, moe_layers, tokens, rc)
        if compact:
            total = jnp.broadcast_to(tokens * rc.top_k, distinct.shape)
            return distinct, timing.EvenRows(distinct=distinct, total=total)
        r = routing.count_routing(distinct, tokens, rc)
    else:
        r = routing.route_layers(words, draw, moe_layers, routing.active_mask(tokens, rc), routing_knobs, rc)
    return r if not compact else (r.needed, r.rows)
