"""Read-disturb counters of cohorts: blocks written for one owner, read together and dead together (issue 26).

A cohort is the ``ceil(pages / P)`` blocks that hold one owner's ``pages`` (P pages a block), every one of them
read in whole by each read pass of its owner. Each of its blocks then takes P page reads a pass (a block full
of the owner's pages), so one counter serves the cohort: P × its read passes since it was written. A counter
passing k·N relocates every block of the cohort, once per multiple (``counters.crossings``: the per-block
rule of ``counters``, for blocks that hold many owners' pages), copying the cohort's pages as they are in the
pass. Blocks a cohort gained after it was written (pages added later) take its whole count: an over-count
of those blocks' reads, as is a last block less than full. A slot that gets a new owner starts a fresh cohort
at zero (the old owner's pages died: erased without a copy). One cohort per slot; counts are float32,
exact integers below 2^24 ≈ 1.7 × 10^7 reads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hbfjax.flash.disturb.counters import crossings


class Cohorts(NamedTuple):
    """The cohorts of C slots (one stream)."""

    owner: jax.Array  # int32[C] each slot's owner (−1: none); another owner starts a fresh cohort
    reads: jax.Array  # f32[C] page reads each block of the slot's cohort took since it was written
    max_reads: jax.Array  # f32[] the most page reads any cohort block took


class Relocated(NamedTuple):
    """One pass's relocations, per slot (f32[C] each)."""

    page_reads: jax.Array  # page reads of the cohort's pages (pages × its read passes)
    blocks: jax.Array  # cohort blocks relocated
    pages: jax.Array  # pages those relocations copied


def init(slots: int) -> Cohorts:
    """No owner, no reads."""
    return Cohorts(owner=jnp.full(slots, -1, jnp.int32), reads=jnp.zeros(slots, jnp.float32),
                   max_reads=jnp.float32(0.0))


def blocks_of(pages, pages_per_block) -> jax.Array:
    """f32: the whole blocks that hold ``pages`` pages."""
    return jnp.ceil(pages / pages_per_block)


def read_pass(c: Cohorts, owner, reading, pages, pages_per_block, threshold_reads) -> tuple[Cohorts, Relocated]:
    """One pass: each slot now of ``owner`` (int32[C]) reads its cohort's ``pages`` (f32[C]) once where
    ``reading`` (f32[C], 0 or 1): each of its blocks takes P page reads, and a counter passing multiples of N
    relocates every block of the cohort once per multiple (module docstring)."""
    before = jnp.where(c.owner == owner, c.reads, 0.0)  # a new owner: a fresh cohort
    after = before + reading * pages_per_block
    crossed = crossings(before, after, threshold_reads)
    moved = Relocated(page_reads=reading * pages, blocks=crossed * blocks_of(pages, pages_per_block),
                      pages=crossed * pages)
    return Cohorts(owner=owner, reads=after, max_reads=jnp.maximum(c.max_reads, after.max())), moved
