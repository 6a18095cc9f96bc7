"""Diverged tails (HBFlex §5.4; issue 23 "Pages die when their data dies"): a request that takes its
session's retained KV keeps only what it reuses, and the blocks part turns that into a cut of the
session's tokens in the store and in the chunk (``parts.blocks.diverge``), traced by hand; the store's
page-level cut is checked against its Python mirror in tests/test_plane_store.py, the engine's against
the HBFlex reference in tests/test_hbflex_reference.py, one plane's by hand in tests/test_kv_blocks.py."""

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np

from hbfjax.serve.parts import blocks as blocks_part

NO_CUT = np.iinfo(np.int32).max


def _state(stored, new, cut=None):
    n = len(stored)
    cut = [NO_CUT] * n if cut is None else cut
    return blocks_part.BlocksState(blocks=None, new_tokens=jnp.asarray(new, jnp.int32),
                                   stored_tokens=jnp.asarray(stored, jnp.int32), cut_tokens=jnp.asarray(cut, jnp.int32),
                                   root_start=None)


REQS = SimpleNamespace(session=jnp.asarray([0, 1, 2, 1], jnp.int32))  # request 3 is session 1's next turn


def test_a_kept_prefix_cuts_the_store_drops_the_chunks_tokens_past_it_or_changes_nothing():
    """Sessions 0, 1, 2 hold 100, 50, 0 tokens in the store and put 10, 20, 5 more in HBF this chunk. Session 0
    keeps 105: 5 of the chunk's 10 are dropped, the store untouched; session 1 keeps 30: the store is cut at
    30 at the chunk's end, the chunk's 20 dropped; session 2 keeps 7 of its 5: nothing dies; slot 3 is not
    new, slot 4 took no entry (−1)."""
    s = _state([100, 50, 0], [10, 20, 5])
    kept = jnp.asarray([105, 30, 7, 1, -1], jnp.int32)
    new = jnp.asarray([True, True, True, False, True])
    got = blocks_part.diverge(s, kept, new, jnp.asarray([0, 1, 2, 3, 0], jnp.int32), REQS)
    assert np.asarray(got.new_tokens).tolist() == [5, 0, 5]
    assert np.asarray(got.cut_tokens).tolist() == [NO_CUT, 30, NO_CUT]
    assert np.asarray(got.stored_tokens).tolist() == [100, 50, 0]  # the store's count moves at the chunk's end


def test_a_second_turn_in_the_chunk_counts_from_the_first_cut():
    """Session 1 was cut to 30 this chunk and has put 10 tokens in HBF since: its next turn keeping 40 keeps
    them all, keeping 35 drops 5 of them, keeping 20 cuts the store at 20 and drops the 10."""
    for keep, new_tokens, cut in ((40, 10, 30), (35, 5, 30), (20, 0, 20)):
        s = _state([100, 50, 0], [0, 10, 0], cut=[NO_CUT, 30, NO_CUT])
        got = blocks_part.diverge(s, jnp.asarray([keep], jnp.int32), jnp.asarray([True]), jnp.asarray([3], jnp.int32),
                                  REQS)
        assert int(got.new_tokens[1]) == new_tokens and int(got.cut_tokens[1]) == cut, keep
