"""Which requests' KV to evict when the device is too full (HBFlex §5.4: evict at 90 % used).

A policy is a pure function ``(keep bool[S], held_pages i32[S], start_tick i32[S], excess_pages i32[])
-> bool[S]`` choosing, among the requests still kept, those whose KV is dropped so that at least
``excess_pages`` pages are freed. The block workload (``hbfjax.flash.erase.kv_lifetimes``) takes it as a
static config field, so the physics carries no serving policy of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def oldest_first(keep: jax.Array, held_pages: jax.Array, start_tick: jax.Array, excess_pages: jax.Array) -> jax.Array:
    """bool[S]: the oldest kept requests (by admission tick, ties by slot) until ``excess_pages`` are freed."""
    order = jnp.argsort(jnp.where(keep, start_tick, jnp.iinfo(jnp.int32).max), stable=True)
    held_sorted = jnp.where(keep, held_pages, 0)[order]
    before = jnp.cumsum(held_sorted) - held_sorted
    return jnp.zeros(keep.shape, bool).at[order].set(keep[order] & (before < excess_pages))


POLICIES = {"oldest-first": oldest_first}
