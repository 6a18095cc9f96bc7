"""Blocks and GC mechanism: a block reclaimed by hand, conservation every step, transforms."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch
from hbfjax.flash.erase import formulation, gc, gc_overwrite as ow

SEED, STREAM = jnp.uint32(7), jnp.int32(3)
append = jax.jit(gc.append, static_argnums=4)
reclaim = jax.jit(gc.reclaim, static_argnums=3)


def test_block_reclaimed_by_hand_in_a_tiny_device():
    # 4 blocks × 4 pages. Program tags 0..7: block 0 = 0..3 (closed), block 1 = 4..7 (open, full).
    bc = gc.BlockConfig(n_blocks=4, pages_per_block=4, victim="greedy", victims_per_gc=1)
    st = gc.init_state(bc)
    tags = jnp.arange(8, dtype=jnp.int32)
    st, blk, off = append(st, tags, jnp.zeros_like(tags), jnp.ones(8, bool), bc)
    assert blk.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and off.tolist() == [0, 1, 2, 3] * 2
    assert st.status.tolist() == [gc.CLOSED, gc.OPEN, gc.FREE, gc.FREE] and int(gc.free_blocks(st)) == 2
    # Overwrite tags 0, 1, 2 by hand: block 0 keeps one valid page (tag 3).
    st = dataclasses.replace(st, owner=st.owner.at[0, :3].set(-1), valid=st.valid.at[0].set(1))
    # Greedy: the only candidate is block 0 (block 1 is open). Target: one more free block.
    st, (owners, dblk, dpage, mask) = reclaim((SEED, STREAM), st, jnp.int32(3 * 4), bc)
    moved = [(int(o), int(b), int(p)) for o, b, p, m in zip(owners, dblk, dpage, mask) if m]
    assert moved == [(3, 2, 0)]  # tag 3 → first page of block 2 (block 1 was full)
    assert st.valid.tolist() == [0, 4, 1, 0]
    assert st.erases.tolist() == [1, 0, 0, 0]
    assert st.status.tolist() == [gc.FREE, gc.CLOSED, gc.OPEN, gc.FREE]
    assert int(gc.free_blocks(st)) == 2 and int(st.migrated_pages) == 1 and int(st.gc_invocations) == 1
    # The erased block is at the tail of the free ring, after block 3.
    assert [int(st.ring[i % 4]) for i in range(int(st.head), int(st.tail))] == [3, 0]
    counts = {k: int(v) for k, v in gc.page_counts(st, bc).items()}
    assert counts == {"valid": 5, "stale": 0, "free": 11, "physical": 16}


def test_one_free_block_lets_a_round_reuse_its_own_victims():
    # 4 blocks × 4 pages; tags 0..11 fill blocks 0, 1, 2 (block 2 open and full); block 3 is the only
    # free block. By hand, blocks 0 and 1 keep 3 valid pages each. A sequential FTL erases block 0
    # after moving its pages into block 3, then moves block 1's pages into block 3 and the erased
    # block 0: one round with one free block takes both victims (one class, ``reclaim``'s rule).
    bc = gc.BlockConfig(n_blocks=4, pages_per_block=4, victim="greedy", victims_per_gc=2)
    st = gc.init_state(bc)
    tags = jnp.arange(12, dtype=jnp.int32)
    st, _, _ = append(st, tags, jnp.zeros_like(tags), jnp.ones(12, bool), bc)
    st = dataclasses.replace(st, owner=st.owner.at[0, 0].set(-1).at[1, 0].set(-1), valid=st.valid.at[:2].set(3))
    st, (owners, dblk, dpage, mask) = reclaim((SEED, STREAM), st, jnp.int32(16), bc)
    moved = [(int(o), int(b), int(p)) for o, b, p, m in zip(owners, dblk, dpage, mask) if m]
    assert moved == [(1, 3, 0), (2, 3, 1), (3, 3, 2), (5, 3, 3), (6, 0, 0), (7, 0, 1)]
    assert st.valid.tolist() == [2, 0, 4, 4] and st.erases.tolist() == [1, 1, 0, 0]
    assert st.status.tolist() == [gc.OPEN, gc.FREE, gc.CLOSED, gc.CLOSED]
    assert [int(st.ring[i % 4]) for i in range(int(st.head), int(st.tail))] == [1]
    assert int(st.migrated_pages) == 6 and int(st.gc_invocations) == 1
    counts = {k: int(v) for k, v in gc.page_counts(st, bc).items()}
    assert counts == {"valid": 10, "stale": 0, "free": 6, "physical": 16}


def test_closest_label_fallback_by_hand():
    # 8 blocks × 4 pages, 4 labels. Open blocks: label 0 holds 3 pages (room 1), label 1 holds 1
    # (room 3), label 3 holds 2 (room 2); label 2 has none. This tick: 3 pages of label 0, 2 of
    # label 2, 1 of label 3 — labels 0 and 2 each need a new block.
    bc = gc.BlockConfig(n_blocks=8, pages_per_block=4, n_classes=4, victims_per_gc=1)
    st = gc.init_state(bc)
    first = jnp.array([0, 0, 0, 1, 3, 3], jnp.int32)
    st, _, _ = append(st, jnp.arange(6, dtype=jnp.int32), first, jnp.ones(6, bool), bc)
    assert st.open_ptr.tolist() == [3, 1, 4, 2] and int(st.open_block[2]) == -1
    cls = jnp.array([0, 2, 0, 3, 2, 0], jnp.int32)
    write = jnp.ones(6, bool)
    fallback = jax.jit(gc.closest_class_fallback, static_argnums=4)
    # One block to open: label 0 (first in class order) gets it; label 2 borrows label 1's block
    # (circular distance 1; label 3 at distance 1 has 1 page of room left after its own page).
    new_cls, new_write = fallback(cls, write, st, jnp.int32(1), bc)
    assert new_cls.tolist() == [0, 1, 0, 3, 1, 0] and new_write.tolist() == [True] * 6
    # No block to open: label 0 fills its last page, its 2 others go to label 1 (room 3); label 2
    # then finds no label with room for 2 pages and waits.
    new_cls, new_write = fallback(cls, write, st, jnp.int32(0), bc)
    assert new_cls.tolist() == [0, 2, 1, 3, 2, 1]
    assert new_write.tolist() == [True, False, True, True, False, True]
    opened = int(st.n_opened)
    st2, _, _ = append(st, jnp.arange(6, dtype=jnp.int32), new_cls, new_write, bc)
    assert int(st2.n_opened) == opened and st2.open_ptr.tolist() == [4, 3, 4, 3]


def test_reclaim_below_target_does_nothing():
    bc = gc.BlockConfig(n_blocks=4, pages_per_block=4, victims_per_gc=2)
    st = gc.init_state(bc)
    tags = jnp.arange(8, dtype=jnp.int32)
    st, _, _ = append(st, tags, jnp.zeros_like(tags), jnp.ones(8, bool), bc)
    st2, _ = reclaim((SEED, STREAM), st, jnp.int32(0), bc)
    assert int(st2.erases.sum()) == 0 and int(st2.migrated_pages) == 0 and int(st2.gc_invocations) == 0


def _smallest_by_sorting(score: np.ndarray, g: int):
    """The g smallest (index, value) pairs by a stable NumPy sort; non-candidates (INT_MAX) -> (0, INT_MAX)."""
    order = np.argsort(score, kind="stable")[:g]
    val = score[order]
    return np.where(val == formulation.INT_MAX, 0, order), val


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_smallest_matches_a_stable_sort_with_ties_and_non_candidates(name):
    # Greedy-like scores in [0, 8] with many ties, a third of them non-candidates (INT_MAX), and
    # hash-like scores for the unpacked search; g runs past the number of candidates.
    rng = np.random.default_rng(5)
    imax = formulation.INT_MAX
    greedy = np.where(rng.random(50) < 0.33, imax, rng.integers(0, 9, 50)).astype(np.int32)
    hashed = np.where(rng.random(50) < 0.33, imax, rng.integers(0, 40, 50)).astype(np.int32)
    cpu = formulation.cpu_form(name)
    for score, max_score in ((greedy, 8), (hashed, None)):
        n_cand = int((score < imax).sum())
        for g in (1, 5, n_cand + 3):
            search = lambda s: formulation.smallest(s, g, max_score, cpu=cpu)  # noqa: B023, E731
            assert ("top_k" in str(jax.make_jaxpr(search)(score))) == (name == "gpu")
            idx, val = jax.jit(search)(jnp.asarray(score))
            want_idx, want_val = _smallest_by_sorting(score, g)
            np.testing.assert_array_equal(np.asarray(val), want_val, err_msg=f"{name} g={g} max={max_score}")
            np.testing.assert_array_equal(np.asarray(idx), want_idx, err_msg=f"{name} g={g} max={max_score}")


def _check_overwrite_invariants(s: ow.OverwriteState, cfg: ow.OverwriteConfig):
    bc = cfg.blocks
    b = s.blocks
    counts = {k: int(v) for k, v in gc.page_counts(b, bc).items()}
    assert counts["valid"] + counts["stale"] + counts["free"] == counts["physical"], counts
    own = np.asarray(b.owner)
    assert ((own >= 0).sum(axis=1) == np.asarray(b.valid)).all()
    # No logical page lost: every logical page is valid exactly where l2p says.
    l2p = np.asarray(s.l2p)
    k = bc.pages_per_block
    assert (own[l2p // k, l2p % k] == np.arange(cfg.logical_pages)).all()
    assert counts["valid"] == cfg.logical_pages
    assert not bool(b.overflow)


@pytest.mark.parametrize("victim", gc.VICTIMS)
def test_overwrite_conserves_pages_and_loses_none_after_every_step(victim):
    bc = gc.BlockConfig(n_blocks=24, pages_per_block=8, victim=victim, victims_per_gc=4)
    cfg = ow.OverwriteConfig(blocks=bc, logical_pages=144, chunk_pages=8, warmup_chunks=0, measure_chunks=1)
    knobs = ow.OverwriteKnobs.make(cfg)
    step = jax.jit(lambda s: ow.step((SEED, STREAM), s, knobs, cfg, True))
    s = ow.filled_state(cfg)
    _check_overwrite_invariants(s, cfg)
    for _ in range(40):
        s = step(s)
        _check_overwrite_invariants(s, cfg)
    host, mig = int(s.blocks.host_pages), int(s.blocks.migrated_pages)
    assert host > 0 and mig > 0 and (host + mig) / host >= 1.0
    assert int(s.blocks.gc_invocations) > 0


def test_duplicate_writes_within_a_chunk_keep_only_the_last_copy():
    lp = jnp.array([5, 2, 5, 7, 2, 5], jnp.int32)
    last, first = formulation.last_and_first(lp)
    assert last.tolist() == [False, False, False, True, True, True]
    assert first.tolist() == [True, True, False, True, False, False]


def test_in_map_duplicate_masks_equal_the_pairwise_ones_and_leave_the_map_unchanged():
    rs = np.random.default_rng(5)
    fn = jax.jit(formulation.last_and_first_in)
    for n, size in ((6, 8), (64, 40), (256, 1000)):
        lp = jnp.asarray(rs.integers(0, size, n), jnp.int32)
        l2p = jnp.asarray(rs.integers(-1, 10_000, size), jnp.int32)
        last, first, old, back = fn(lp, l2p)
        want_last, want_first = formulation.last_and_first(lp)
        assert last.tolist() == want_last.tolist() and first.tolist() == want_first.tolist()
        assert old.tolist() == l2p[lp].tolist() and back.tolist() == l2p.tolist()


SMALL = ow.OverwriteConfig(blocks=gc.BlockConfig(n_blocks=16, pages_per_block=8, victim="random", victims_per_gc=4),
                           logical_pages=90, chunk_pages=8, warmup_chunks=1, measure_chunks=2)


@pytest.mark.slow  # a statistical or eager-mode check of 20-40 worker-seconds: make test-slow
def test_jit_equals_eager_on_a_small_case():
    # One amortised GC round (victim search, batched migration, erase) with random victims on a
    # state that needs it; eager op-by-op and jitted must agree bit for bit.
    bc = SMALL.blocks
    filled = jax.jit(ow.filled_state, static_argnums=0)(SMALL).blocks
    own = np.asarray(filled.owner).copy()
    own[np.random.default_rng(0).random(own.shape) < 0.4] = -1  # overwritten elsewhere
    st = dataclasses.replace(filled, owner=jnp.asarray(own), valid=jnp.asarray((own >= 0).sum(1), jnp.int32))
    target = jnp.int32(bc.physical_pages // 2)
    jitted, _ = reclaim((SEED, STREAM), st, target, bc)
    with jax.disable_jit():
        eager, _ = gc.reclaim((SEED, STREAM), st, target, bc)
    assert int(jitted.migrated_pages) > 0 and int(jitted.gc_invocations) == 1  # the round did migrate
    for a, b in zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(eager)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_retrace_across_knob_values_and_same_seed_same_result():
    cfg = dataclasses.replace(SMALL, workload="hotcold")
    a = batch.run(ow.simulate, 4, 1, ow.OverwriteKnobs.make(cfg, hot_fraction=0.1, hot_write_fraction=0.9), cfg)
    with compilations("simulate") as compiled:
        b = batch.run(ow.simulate, 4, 1, ow.OverwriteKnobs.make(cfg, hot_fraction=0.3, hot_write_fraction=0.6), cfg)
        c = batch.run(ow.simulate, 4, 1, ow.OverwriteKnobs.make(cfg, hot_fraction=0.1, hot_write_fraction=0.9), cfg)
    assert compiled == []
    assert not np.array_equal(a.migrated_pages, b.migrated_pages)
    for key in a._fields:
        np.testing.assert_array_equal(getattr(a, key), getattr(c, key))


def test_config_errors_name_field_value_and_rule():
    with pytest.raises(gc.GcConfigError, match=r"BlockConfig.victim = 'lru': must be one of"):
        gc.BlockConfig(n_blocks=8, pages_per_block=4, victim="lru")
    with pytest.raises(gc.GcConfigError, match=r"OverwriteConfig.logical_pages = 30: leaves 2 spare pages"):
        ow.OverwriteConfig(blocks=gc.BlockConfig(n_blocks=8, pages_per_block=4), logical_pages=30,
                           chunk_pages=4, warmup_chunks=0, measure_chunks=1)






@pytest.mark.parametrize("victim", [v if v == "greedy" else pytest.param(v, marks=pytest.mark.slow)  # make test:
                                    for v in gc.VICTIMS])  # greedy, the serving store's victim; the rest test-slow
def test_cpu_and_gpu_formulations_give_identical_results(victim):
    # BlockConfig.formulation picks tree-minimum passes and in-map duplicate detection ("cpu") or one
    # top_k and n² compares ("gpu"); both must give the same streams bit for bit (both traced here). The
    # field is static, so each formulation is its own entry in jit's cache.
    res = {}
    for name in ("cpu", "gpu"):
        bc = gc.BlockConfig(n_blocks=64, pages_per_block=16, victim=victim, victims_per_gc=8, formulation=name)
        cfg = ow.OverwriteConfig(blocks=bc, logical_pages=800, chunk_pages=32, warmup_chunks=20, measure_chunks=30,
                                 gc_rounds=1)
        res[name] = batch.run(ow.simulate, 4, int(SEED), ow.OverwriteKnobs.make(cfg), cfg)
    assert res["cpu"].migrated_pages.min() > 0
    for key in res["cpu"]._fields:
        np.testing.assert_array_equal(getattr(res["cpu"], key), getattr(res["gpu"], key), err_msg=key)
    with pytest.raises(ValueError, match="must be one of"):
        gc.BlockConfig(n_blocks=64, pages_per_block=16, formulation="tpu")
