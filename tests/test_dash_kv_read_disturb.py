"""Read disturb of DASH's HBF KV (issue 26): each request's HBF KV is one cohort of blocks read together
(``hbfjax.flash.disturb.cohorts``). The cohort rule traced by hand."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hbfjax.flash.disturb import cohorts


def test_cohorts_by_hand():
    """Three slots, P = 4, N = 10: slot 0 (5 pages, 2 blocks) reads twice, slot 1 (8 pages) once, slot 2 none."""
    c = cohorts.init(3)
    owner = jnp.asarray([7, 8, -1], jnp.int32)
    pages = jnp.asarray([5.0, 8.0, 0.0])
    c, m = cohorts.read_pass(c, owner, jnp.asarray([1.0, 1.0, 0.0]), pages, 4.0, 10.0)
    assert np.asarray(c.reads).tolist() == [4.0, 4.0, 0.0] and np.asarray(m.blocks).tolist() == [0.0, 0.0, 0.0]
    assert np.asarray(m.page_reads).tolist() == [5.0, 8.0, 0.0]
    c, m = cohorts.read_pass(c, owner, jnp.asarray([1.0, 0.0, 0.0]), pages, 4.0, 10.0)  # slot 0: 4 → 8
    c, m = cohorts.read_pass(c, owner, jnp.asarray([1.0, 0.0, 0.0]), pages, 4.0, 10.0)  # 8 → 12 passes 10
    assert np.asarray(m.blocks).tolist() == [2.0, 0.0, 0.0] and np.asarray(m.pages).tolist() == [5.0, 0.0, 0.0]
    assert float(c.max_reads) == 12.0
    # slot 1 gets a new owner: its cohort starts at 0 (4 reads, not 8); N = 1 relocates each block 4 times
    c, m = cohorts.read_pass(c, jnp.asarray([7, 9, -1], jnp.int32), jnp.asarray([0.0, 1.0, 0.0]), pages, 4.0, 1.0)
    assert np.asarray(c.reads).tolist() == [12.0, 4.0, 0.0]
    assert np.asarray(m.blocks).tolist() == [0.0, 4.0 * 2, 0.0] and np.asarray(m.pages).tolist() == [0.0, 32.0, 0.0]
