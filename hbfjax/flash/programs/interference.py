"""Program/read interference on plane slots: a program holds its planes, a read waits (HBFlex §3.2, Fig. 8).

Plane state is ``busy_until_us[P]``: when each plane slot finishes the programs issued to it (times
relative to the current iteration start, so float32 stays exact to well under 1 µs). A program
cannot be preempted (HBFlex §3.2), so a read that touches a busy slot starts when the last of its
slots is free; the wait is exposed on the critical path. A slot stands for ``planes_per_slot``
physical planes that program in parallel: ``c`` pages on a slot take ``ceil(c / planes_per_slot)``
program rounds of tPROG each.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hbfjax import rng


def touched_slots(h: jax.Array, touch_fraction: jax.Array, touch_mask: jax.Array) -> jax.Array:
    """bool[P]: slots a read touches: the explicit ``touch_mask`` plus a hashed ``touch_fraction`` of the
    slots (each slot independently, from the read's hash ``h``)."""
    slots = jnp.arange(touch_mask.shape[-1], dtype=jnp.uint32)
    return touch_mask | (rng.uniform01(rng.mix(h, slots)) < touch_fraction)


def read_wait_us(busy_until_us: jax.Array, touched: jax.Array, t_us: jax.Array) -> jax.Array:
    """µs a read issued at ``t_us`` waits for programs on the slots it touches (0 if none is busy)."""
    return jnp.maximum(jnp.max(jnp.where(touched, busy_until_us - t_us, 0.0)), 0.0)


def program_pages(busy_until_us: jax.Array, cursor: jax.Array, n_pages: jax.Array, t_us: jax.Array,
                  t_prog_us: jax.Array, planes_per_slot: jax.Array):
    """Issue ``n_pages`` page programs at ``t_us``, round-robin over the slots from ``cursor`` (plane-balanced
    allocation, HBFlex §5.2). A busy slot queues the new rounds behind its programs.

    Returns (busy_until_us[P], cursor, busy_us: rounds × tPROG of this batch, rounds: int32).
    """
    P = busy_until_us.shape[-1]
    n = jnp.maximum(n_pages, 0).astype(jnp.int32)
    idx = (jnp.arange(P, dtype=jnp.int32) - cursor) % P
    count = n // P + (idx < n % P).astype(jnp.int32)  # pages per slot
    rounds = jnp.ceil(count.astype(jnp.float32) / planes_per_slot)
    start = jnp.maximum(busy_until_us, t_us)
    busy = jnp.where(count > 0, start + rounds * t_prog_us, busy_until_us)
    max_rounds = jnp.max(rounds)
    return busy, (cursor + n) % P, max_rounds * t_prog_us, max_rounds.astype(jnp.int32)
