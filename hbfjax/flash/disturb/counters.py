"""Read-disturb counters of blocks whose data dies (issue 26): each block counts the page reads it took
since its last erase; a block that passes the threshold N is due for relocation.

``reclaim`` is the mechanism for data that lives on (weights: every page valid, relocated and read again).
Here the data is short-lived (KV pages stale when their request's session is evicted, the blocks erased by
GC), so what matters is whether a block takes N reads before GC erases it. A counter passing k·N counts one
relocation per multiple (``relocations``: what a relocate-and-reset controller would do if the moved pages
were read as before), with the block's live pages at that moment (``relocated_pages``: what the relocation
copies). An erase records the counter (``reads_at_erase``) and resets it. Written for one store; a leading
axis of blocks (planes) is allowed. Counts are float32: exact integers below 2^24 ≈ 1.7 × 10^7 reads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class BlockReads(NamedTuple):
    """Per-block read counters and their run tallies (f32; ``count`` has the blocks' shape)."""

    count: jax.Array  # f32[..., B] page reads each block took since it was last erased
    page_reads: jax.Array  # f32[] page reads counted
    erased_blocks: jax.Array  # f32[] blocks erased (their counters recorded, then reset)
    reads_at_erase: jax.Array  # f32[] Σ of the erased blocks' counters
    max_reads: jax.Array  # f32[] the largest counter any block reached
    relocations: jax.Array  # f32[] counters passing a multiple of the threshold
    relocated_pages: jax.Array  # f32[] live pages of those blocks when they passed it


def init(shape) -> BlockReads:
    """Every counter at zero."""
    z = jnp.float32(0.0)
    return BlockReads(count=jnp.zeros(shape, jnp.float32), page_reads=z, erased_blocks=z, reads_at_erase=z,
                      max_reads=z, relocations=z, relocated_pages=z)


def crossings(before: jax.Array, after: jax.Array, threshold_reads) -> jax.Array:
    """f32 like ``after``: multiples of the threshold N a counter passed going from ``before`` to ``after``
    reads (one relocation each: the module docstring's rule)."""
    n = jnp.asarray(threshold_reads, jnp.float32)
    return jnp.floor(after / n) - jnp.floor(before / n)


def add_reads(c: BlockReads, reads: jax.Array, live_pages: jax.Array, threshold_reads) -> BlockReads:
    """Each block takes ``reads`` (f32, the blocks' shape) page reads; ``live_pages`` its valid pages now."""
    new = c.count + reads
    crossed = crossings(c.count, new, threshold_reads)
    return c._replace(count=new, page_reads=c.page_reads + reads.sum(), max_reads=jnp.maximum(c.max_reads, new.max()),
                      relocations=c.relocations + crossed.sum(),
                      relocated_pages=c.relocated_pages + (crossed * live_pages).sum())


def erase(c: BlockReads, erased: jax.Array) -> BlockReads:
    """The ``erased`` blocks (bool, the blocks' shape) record their counters and start again at zero."""
    return c._replace(count=jnp.where(erased, 0.0, c.count), erased_blocks=c.erased_blocks + erased.sum(),
                      reads_at_erase=c.reads_at_erase + jnp.where(erased, c.count, 0.0).sum())
