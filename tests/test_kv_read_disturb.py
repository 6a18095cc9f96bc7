"""Read disturb of the KV blocks (issue 26): the counters (``hbfjax.flash.disturb.counters``) traced by hand,
the sampled planes' per-block reads (``plane_store.add_reads``) against a NumPy count over the pages' owner
tags, and on the engine (HBFlex's blocks part with ``--read-disturb-reads``) a fixed batch traced by hand:
each of its pages is read by the 11 decode passes after the prefill (the prefill pass reads no HBF KV),
a threshold N relocates ⌊reads / N⌋ times per block; in chunks of 4 iterations (make test-slow) the copies'
time is exposed in the next iteration, and a threshold no block reaches exposes nothing."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax import rng
from hbfjax.clock import Clock
from hbfjax.flash.disturb import counters
from hbfjax.serve import kv_blocks, plane_store, systems
from hbfjax.serve.parts import blocks as blocks_part
from hbfjax.serve.parts import reclaim
from hbfjax.serve.parts.blocks import BlocksConfig

STREAMS = 2


def test_counters_by_hand():
    c = counters.init((2,))
    c = c._replace(count=jnp.asarray([0.0, 900.0]))
    c = counters.add_reads(c, jnp.asarray([500.0, 200.0]), jnp.asarray([3, 4]), 1000.0)
    assert np.asarray(c.count).tolist() == [500.0, 1100.0]
    assert (float(c.page_reads), float(c.max_reads), float(c.relocations), float(c.relocated_pages)) == (
        700.0, 1100.0, 1.0, 4.0)  # only the second passed N = 1,000, with its 4 live pages
    c = counters.erase(c, jnp.asarray([False, True]))
    assert np.asarray(c.count).tolist() == [500.0, 0.0]
    assert (float(c.erased_blocks), float(c.reads_at_erase)) == (1.0, 1100.0)
    c = counters.add_reads(c, jnp.asarray([0.0, 250.0]), jnp.asarray([0, 2]), 100.0)  # 0 → 250 passes 100 and 200
    assert (float(c.relocations), float(c.relocated_pages), float(c.max_reads)) == (3.0, 8.0, 1100.0)


def test_each_block_takes_the_reads_of_its_live_pages():
    """Three sessions written to two small planes, read 1, 2 and 3 times a page; session 1 evicted, then read
    again: the counters equal a NumPy count over the owner tags (stale pages are not read)."""
    cfg = plane_store.PlaneStoreConfig(sessions=3, planes=2, blocks_per_plane=16, pages_per_block=4, max_writes=16,
                                       n_labels=1, gc_rounds=1, read_counter_planes=2)
    knobs = plane_store.PlaneStoreKnobs.make(cfg, room_bytes=2.0 * 16 * 4, package_planes=2, grouped=0.0,
                                             gc_trigger=0.5)
    words = (rng.seed_word(5), jnp.int32(0))
    zero = Clock(jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.float32))
    st = plane_store.init(cfg, count_reads=True)
    st, wrote = jax.jit(lambda s: plane_store.write(words, s, jnp.asarray([6.0, 5.0, 7.0]), zero, knobs, cfg))(st)
    assert int(wrote) > 6  # the draws put pages of every session somewhere
    per_page = np.asarray([1.0, 2.0, 3.0])

    def numpy_counts(state, alive_sessions):
        owner = np.asarray(state.planes.blocks.owner)  # [P, blocks, pages]
        session = owner & ((1 << cfg.plane.tag_bits) - 1)
        live = (owner >= 0) & np.isin(session, alive_sessions)
        return np.where(live, per_page[np.clip(session, 0, 2)], 0.0).sum(axis=2), live.sum(axis=2)

    st = plane_store.add_reads(st, jnp.asarray(per_page, jnp.float32), 1e9, cfg)
    want, _ = numpy_counts(st, [0, 1, 2])
    np.testing.assert_array_equal(np.asarray(st.reads.count), want)
    st = plane_store.invalidate(st, jnp.asarray([False, True, False]), cfg)
    st2 = plane_store.add_reads(st, jnp.asarray(per_page, jnp.float32), 5.0, cfg)
    again, live = numpy_counts(st, [0, 2])
    np.testing.assert_array_equal(np.asarray(st2.reads.count), want + again)
    crossed = np.floor((want + again) / 5.0) - np.floor(want / 5.0)
    assert float(st2.reads.relocations) == crossed.sum() > 0
    assert float(st2.reads.relocated_pages) == (crossed * live).sum()
    assert float(st2.reads.page_reads) == (want + again).sum()
    # the first plane alone counted: the same counters on its blocks, and P / C = 2 to scale its totals
    one = dataclasses.replace(cfg, read_counter_planes=1)
    fresh = plane_store.init(one, count_reads=True)._replace(planes=st.planes)
    st_one = plane_store.add_reads(fresh, jnp.asarray(per_page, jnp.float32), 1e9, one)
    np.testing.assert_array_equal(np.asarray(st_one.reads.count), again[:1])
    assert plane_store.counted_share(one) == 2.0
    # a store made without counters is left as it is
    plain = plane_store.init(cfg)
    assert plane_store.add_reads(plain, jnp.asarray(per_page, jnp.float32), 5.0, cfg) is plain


_COMPILED = {}


def _run(threshold_reads=None, scan_chunk=64):
    sc = dataclasses.replace(systems.Scenario.fixed_batch(GQA, 4, 48, 12), scan_chunk=scan_chunk)
    if threshold_reads is not None:
        sc = dataclasses.replace(sc, reclaim=reclaim.ReclaimKnobs.make(threshold_reads=threshold_reads))
    fam = systems.families(["hbflex"], sc)[0]
    if fam.config not in _COMPILED:
        simulate, config = fam.simulate, fam.config
        _COMPILED[config] = jax.jit(jax.vmap(lambda s, k, inputs: simulate(s, 0, k, inputs, config),
                                             in_axes=(0, None, None)))
    return _COMPILED[fam.config](jnp.arange(STREAMS), fam.points[0], fam.inputs)


@pytest.fixture(scope="module")
def runs():
    """The fixed batch of 12 output tokens in one scan chunk at a threshold no block reaches and at N = 10 (one
    compilation: the thresholds are traced; the run without read disturb is tests/test_reclaim_part's)."""
    return {n: _run(n) for n in (1e15, 10.0)}


def test_a_fixed_batch_reads_each_page_once_a_decode_pass(runs):
    """B = 4 prompts of 48, 12 output tokens: one prefill pass (no HBF KV before it), then 11 decode passes,
    each reading every page; one chunk holds the run, nothing is evicted or erased."""
    o = runs[1e15]
    b = o.parts["blocks"].final
    assert BlocksConfig().read_counter_planes == 1  # the default: the first sampled plane counts reads
    host = np.asarray(plane_store.host_pages(b), np.float64)
    counted_host = np.asarray(b.planes.host_pages, np.float64)[:, 0]  # [S] that plane's host page programs
    assert np.all(counted_host > 0)
    np.testing.assert_array_equal(np.asarray(b.reads.page_reads, np.float64), 11.0 * counted_host)
    np.testing.assert_array_equal(np.asarray(b.reads.erased_blocks), 0.0)
    live = np.asarray(b.reads.count) / 11.0  # live pages of each block
    assert np.all(live == np.round(live))
    # N = 10: each block relocates ⌊11 × live / 10⌋ times, copying its live pages each time
    r = runs[10.0].parts["blocks"].final.reads
    np.testing.assert_array_equal(np.asarray(r.count), np.asarray(b.reads.count))
    due = np.floor(np.asarray(b.reads.count) / 10.0)
    np.testing.assert_array_equal(np.asarray(r.relocations), due.sum(axis=(1, 2)))
    np.testing.assert_array_equal(np.asarray(r.relocated_pages), (due * live).sum(axis=(1, 2)))
    assert np.all(np.asarray(r.relocations) > 0)
    rep = blocks_part.report(type("Own", (), {"final": runs[10.0].parts["blocks"].final})(), runs[10.0])
    planes = b.planes.host_pages.shape[-1]  # the counted plane's copies stand for P / 1 planes' of all P
    np.testing.assert_allclose(rep["kv_reclaim_waf_added"], planes * (due * live).sum(axis=(1, 2)) / host)
    # the reclaim part counts no KV beside the blocks part (its KV cohorts are DASH's: tests/test_dash_kv_read_disturb)
    own = runs[10.0].parts["reclaim"]
    assert own.final.kv_block_reads_max is None and "kv_block_reads_max" not in reclaim.report(own, runs[10.0])
    for key in ("kv_page_reads", "kv_relocated_blocks", "kv_copy_bytes"):
        np.testing.assert_array_equal(np.asarray(getattr(own.totals, key)), 0.0)


@pytest.mark.slow  # a compilation of its own (scan chunks of 4 iterations): make test-slow
def test_relocations_are_timed_and_an_unreached_threshold_exposes_nothing():
    """The same batch in chunks of 4 iterations, so that a chunk's copies are exposed in the next iteration."""
    long_unreached, long_low = _run(1e15, 4), _run(10.0, 4)
    np.testing.assert_array_equal(np.asarray(long_unreached.totals.chunk_stall_us), 0.0)  # nothing evicted: no GC
    assert np.all(np.asarray(long_low.parts["blocks"].final.reads.relocations) > 0)
    assert np.all(np.asarray(long_low.totals.chunk_stall_us) > 0)  # the copies, exposed as GC's migrations
    # the weights' reclaim part stalls both alike at N = 10 (its own stall_us); the copies come on top
    assert np.all(np.asarray(long_low.totals.busy_us) - np.asarray(long_unreached.totals.busy_us)
                  >= np.asarray(long_low.totals.chunk_stall_us) - 1e-3)
