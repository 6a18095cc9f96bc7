"""Read disturb of DASH's HBF KV (issue 26): each request's HBF KV is one cohort of blocks read together
(``hbfjax.flash.disturb.cohorts``, counted by the reclaim part where the system has no block store). The
cohort rule traced by hand, then on the engine a fixed batch traced by hand:

B = 4 prompts of 48 tokens, 12 output tokens each, on DASH with the tiny GQA model (512 B of KV a token,
4,096 B pages): the prefill pass writes each prompt's KV straight to HBF (48 × 512 / 4,096 = 6 pages) and
reads none (no HBF KV before it); the decode KV stays in HBM (the budget is what the weights leave), so
each of the 11 decode passes reads each request's 6 HBF pages once: 4 × 11 × 6 = 264 page reads.

* P = 2 pages a block: a cohort is 3 blocks, each taking 2 reads a pass, 22 after the 11 passes.
  N = 3P = 6: the counter passes 6, 12, 18 at decode passes 3, 6, 9, three relocations of the 3 blocks,
  each copying the 6 pages: 4 × 3 × 3 = 36 blocks, 4 × 3 × 6 = 72 pages, 3 copies per host-written page.
  N = P = 2: every block relocates every pass, 4 × 11 × 3 = 132 blocks, 264 pages (every page read).
* P = 512: the cohort is one block (its 6 pages counted as a full block's 512 reads a pass: the
  docstring's over-count of a last block less than full); N = 3P relocates it at passes 3, 6, 9: 12 blocks,
  72 pages.

The weights are placed in HBM, so the part rewrites only the KV copies (the weights' own rewrites are
``tests/test_reclaim_part``'s); on the critical path (``in_windows = 0``) a pass that copies 24 pages in
12 two-page blocks on 4,096 planes stalls one read round (P × tR) and one program round (tPROG), which
moves every finish time by that much a copying pass and no first token (the prefill pass copies nothing).
The plain-Python DASH reference (``hbfjax.serve.reference``) models no read disturb: its tests run
without ``--read-disturb-reads``, so this hand computation stands for it here. Without the knobs the system
has no reclaim part (nothing of this runs), and a threshold no cohort reaches leaves every output as
without the part."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_models import GQA
from hbfjax import energy
from hbfjax.flash.disturb import cohorts
from hbfjax.memory import hbf_packages
from hbfjax.memory.organisations import DENSE_WEIGHTS, EXPERT_WEIGHTS
from hbfjax.serve import systems
from hbfjax.serve.parts import reclaim

STREAMS = 2
B, PROMPT, OUTPUT = 4, 48, 12
DECODE_PASSES = OUTPUT - 1
PAGES = PROMPT * 512 // 4096  # 6 HBF pages a request
UNREACHED = 1e15
POINTS = ((2, 6.0), (2, 2.0), (512, 1536.0), (2, UNREACHED))  # (P, N)


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


def _scenario(knobs: bool):
    sc = systems.Scenario.fixed_batch(GQA, B, PROMPT, OUTPUT)
    return dataclasses.replace(sc, reclaim=reclaim.ReclaimKnobs.make(in_windows=0.0)) if knobs else sc


def _weights_in_hbm(point):
    """The point with its weights placed in HBM only: the reclaim part's weight groups are empty."""
    org = point.org
    hbm = jnp.asarray([1.0, 0.0, 0.0], jnp.float32)
    return dataclasses.replace(point, org=dataclasses.replace(org, place=org.place.at[DENSE_WEIGHTS].set(hbm)
                                                              .at[EXPERT_WEIGHTS].set(hbm)))


def _compiled(fam):
    simulate, config = fam.simulate, fam.config
    return jax.jit(jax.vmap(lambda s, k, inputs: simulate(s, 0, k, inputs, config), in_axes=(0, None, None)))


@pytest.fixture(scope="module")
def runs():
    """One compilation with the part (P and N traced) and one without it (no --read-disturb-reads)."""
    fam = systems.families(["dash"], _scenario(True))[0]
    assert fam.config.parts == ("tiers", "reclaim")
    run = _compiled(fam)
    out = {}
    for p, n in POINTS:
        point = dataclasses.replace(_weights_in_hbm(fam.points[0]), reclaim=reclaim.ReclaimKnobs.make(
            threshold_reads=n, pages_per_block=p, in_windows=0.0))
        out[p, n] = (point, run(jnp.arange(STREAMS), point, fam.inputs))
    assert run._cache_size() == 1  # the knobs are traced: one compilation for every (P, N)
    off = systems.families(["dash"], _scenario(False))[0]
    assert off.config.parts == ("tiers",)  # without the knobs the reclaim part is not there at all
    out["off"] = (None, _compiled(off)(jnp.arange(STREAMS), _weights_in_hbm(off.points[0]), off.inputs))
    return out


def _t(o):
    return {k: np.asarray(v, np.float64) for k, v in o.parts["reclaim"].totals._asdict().items()}


def test_the_batch_is_the_hand_traced_one(runs):
    o = runs[2, 6.0][1]
    np.testing.assert_array_equal(np.asarray(o.totals.prefill_write_bytes), B * PAGES * 4096.0)  # 6 pages each
    np.testing.assert_array_equal(np.asarray(o.totals.writeback_bytes), 0.0)  # decode KV stays in HBM
    np.testing.assert_array_equal(np.asarray(o.totals.passes), 1 + DECODE_PASSES)
    assert np.all(_t(o)["relocated_blocks"] == 0) and np.all(_t(o)["rewrite_bytes"] == 0)  # no weight in HBF


@pytest.mark.parametrize("p,n,blocks,pages", [(2, 6.0, 36, 72), (2, 2.0, 132, 264), (512, 1536.0, 12, 72),
                                              (2, UNREACHED, 0, 0)])
def test_page_reads_and_relocations_by_hand(runs, p, n, blocks, pages):
    point, o = runs[p, n]
    t = _t(o)
    np.testing.assert_array_equal(t["kv_page_reads"], B * DECODE_PASSES * PAGES)  # 264: the prefill pass reads none
    np.testing.assert_array_equal(t["kv_relocated_blocks"], blocks)
    np.testing.assert_array_equal(t["kv_copy_bytes"], pages * 4096.0)
    np.testing.assert_array_equal(np.asarray(o.parts["reclaim"].final.kv_block_reads_max), p * DECODE_PASSES)
    rep = reclaim.report(o.parts["reclaim"], o)
    busy_s = np.asarray(o.totals.busy_us, np.float64) * 1e-6
    np.testing.assert_allclose(rep["kv_reclaim_relocations_per_s"], blocks / busy_s, rtol=1e-12)
    np.testing.assert_allclose(rep["kv_reclaim_waf_added"], pages / (B * PAGES))  # copies per host-written page
    # the copies are the run's KV read-disturb bytes in its energy and lifetimes (kv_reclaim_program_gbps)
    host = np.asarray(o.totals.prefill_write_bytes, np.float64)
    np.testing.assert_array_equal(energy.kv_reclaim_bytes(o, host), pages * 4096.0)
    np.testing.assert_array_equal(energy.reclaim_bytes(o, host), pages * 4096.0)


@pytest.mark.parametrize("p,n,copying_passes", [(2, 6.0, 3), (2, 2.0, DECODE_PASSES)])
def test_copies_stall_the_critical_path_by_hand(runs, p, n, copying_passes):
    """A copying pass copies the 4 cohorts' 24 pages, 12 blocks of 2 on 4,096 planes: one read round of P × tR,
    then one program round of tPROG (24 pages at the program bandwidth take far less)."""
    point, o = runs[p, n]
    base = runs[2, UNREACHED][1]
    org = point.org
    assert float(hbf_packages.planes(org)) >= B * PAGES
    assert 24 * 4096.0 * 1e-3 / float(org.hbf_stacks * org.hbf_write_gbps) < float(org.t_prog_us)
    stall = copying_passes * (p * float(org.t_read_us) + float(org.t_prog_us))
    np.testing.assert_allclose(_t(o)["stall_us"], stall, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(o.first_token.us), np.asarray(base.first_token.us))
    np.testing.assert_array_equal(np.asarray(o.finish.s), np.asarray(base.finish.s))
    np.testing.assert_allclose(np.asarray(o.finish.us) - np.asarray(base.finish.us), stall, atol=2e-3)
    np.testing.assert_allclose(np.asarray(o.totals.busy_us) - np.asarray(base.totals.busy_us), stall, rtol=1e-5)


def test_the_knobs_off_change_nothing(runs):
    """Without --read-disturb-reads DASH runs its tiers part alone (the fixture asserts it); a threshold no
    cohort reaches gives every output of that run, bit for bit."""
    off, unreached = runs["off"][1], runs[2, UNREACHED][1]
    for field in ("arrival", "first_token", "finish", "tokens_out", "iterations", "totals"):
        for a, b in zip(jax.tree_util.tree_leaves(getattr(off, field)), jax.tree_util.tree_leaves(getattr(unreached,
                                                                                                          field))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
