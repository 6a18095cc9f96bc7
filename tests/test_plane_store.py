"""The sampled planes (``hbfjax.serve.plane_store``): placement counts by hand, the store against its
plain-Python mirror (``hbflex_reference.SampledPlanes``) page for page, and the store's WAF against the
GC workloads it must reproduce (``hbfjax.flash.erase.kv_lifetimes``, whose WAF tests/test_gc_kv.py holds
to its own checks):

* one plane group over every plane sends each plane exactly 1/N of every session's pages in session
  order, which is ``kv_lifetimes``' interleaved workload (``pages_per_tick`` pages of each live request
  a tick, in slot order, its pages dying at its end): the same lifetime draws give the same WAF on every
  stream where neither run made the host wait (the two wait differently);
* random placement draws a Poisson count per plane, which spreads the blocks' valid pages and lets
  greedy GC find emptier victims: its WAF falls below the interleaved workload's, and tends to it as a
  session's pages per plane per tick grow (the Poisson's relative spread 1/√λ shrinks);
* a stream's WAF pools its sampled planes, so its distance to a many-plane stream's falls with the
  planes sampled as independent placement noise does (about √(1/P − 1/16) against 16 planes).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hbfjax import rng
from hbfjax.clock import Clock
from hbfjax.flash.erase import kv_lifetimes as kl
from hbfjax.salts import Salt
from hbfjax.serve import hbflex_reference as href
from hbfjax.serve import kv_blocks
from hbfjax.serve import plane_store as ps

SEED = 3


def test_a_stripe_sends_each_plane_of_its_group_every_g_th_page():
    first, count = jnp.arange(10)[:, None], jnp.full((10, 1), 7)
    got = np.asarray(ps.stripe_pages(first, count, jnp.arange(4)[None, :], 4))
    for f in range(10):  # pages f … f + 6 on positions k mod 4
        want = [sum(k % 4 == j for k in range(f, f + 7)) for j in range(4)]
        assert got[f].tolist() == want
    assert (got.sum(axis=1) == 7).all()


@pytest.mark.parametrize("mean", [0.0, 0.3, 4.0, 15.0, 40.0])
def test_poisson_counts_have_the_poisson_mean_and_variance(mean):
    n = 100_000
    i = jnp.arange(n)
    x = np.asarray(ps.poisson(rng.mix(i, 1), rng.mix(i, 2), jnp.full(n, mean)), np.float64)
    if mean == 0.0:
        assert (x == 0).all()
        return
    assert abs(x.mean() - mean) < 4.0 * np.sqrt(mean / n)  # 4 standard errors
    assert abs(x.var() - mean) < 4.0 * mean * np.sqrt(2.0 / n) + 0.02 * mean * (mean > ps.POISSON_EXACT_MEAN)


def _placed(knobs, config, new, before, calls):
    words = (rng.seed_word(SEED), jnp.int32(0))
    f = jax.jit(lambda c: ps.placed_pages(words, new, before, c, knobs, config))
    return np.stack([np.asarray(f(jnp.int32(c))) for c in range(calls)])


def test_groups_place_each_sessions_pages_on_its_own_group_and_random_pages_everywhere():
    """Sampling every plane of an 8-plane package: stripes put all of a session's pages on the G planes
    of one group; random placement puts them everywhere, all of them in expectation."""
    n_planes, r = 8, 6
    config = ps.PlaneStoreConfig(sessions=r, planes=n_planes, blocks_per_plane=64, pages_per_block=4, max_writes=16,
                                 n_labels=1)
    new = jnp.asarray([0, 1, 5, 9, 16, 40], jnp.int32)
    before = jnp.asarray([0, 3, 2, 7, 1, 5], jnp.int32)
    for g in (1, 2, 8):
        knobs = ps.PlaneStoreKnobs.make(config, 1e6, package_planes=n_planes, grouped=1, group_size=g, gc_trigger=0.8)
        got = _placed(knobs, config, new, before, 1)[0]  # [planes, R]
        assert got.sum(axis=0).tolist() == new.tolist(), g  # every page on exactly one plane
        groups = n_planes // g
        for s in range(r):
            on = {j % groups for j in np.flatnonzero(got[:, s])}  # plane j sits in group j mod groups
            assert len(on) <= 1, (g, s)
            mine = got[[j for j in range(n_planes) if j % groups in on], s]
            assert len(on) == 0 or mine.max() - mine.min() <= 1, (g, s)  # a stripe: ⌊n/G⌋ or one more each
    knobs = ps.PlaneStoreKnobs.make(config, 1e6, package_planes=n_planes, grouped=0, gc_trigger=0.8)
    calls = 400
    got = _placed(knobs, config, new, before, calls).sum(axis=1)  # [calls, R]: pages on all planes a call
    mean, se = got.mean(axis=0), np.sqrt(np.asarray(new, np.float64) / calls)  # Poisson(n): variance n
    assert np.all(np.abs(mean - np.asarray(new)) <= 4 * se + 1e-9)


def test_pilot_planes_lie_in_their_sessions_group_and_cover_its_stripes():
    """G planes piloted by one session sit at the G stripe positions of its group: they receive every page
    of that session and of each session hashed to the same group, and nothing of the others."""
    r, g = 6, 4
    config = ps.PlaneStoreConfig(sessions=r, planes=g, blocks_per_plane=64, pages_per_block=4, max_writes=16,
                                 n_labels=1)
    knobs = ps.PlaneStoreKnobs.make(config, 1e6, package_planes=64, grouped=1, group_size=g, gc_trigger=0.8)
    new = jnp.asarray([3, 1, 5, 9, 16, 40], jnp.int32)
    before = jnp.asarray([0, 3, 2, 7, 1, 5], jnp.int32)
    words = (rng.seed_word(SEED), jnp.int32(0))
    group = np.asarray(rng.below(rng.mix(*words, jnp.arange(r, dtype=jnp.int32), Salt.STORE_GROUP), 16))
    for pilot in range(r):
        got = np.asarray(ps.placed_pages(words, new, before, jnp.int32(0), knobs, config,
                                         jnp.full(g, pilot, jnp.int32)))
        same = group == group[pilot]
        assert got.sum(axis=0).tolist() == np.where(same, np.asarray(new), 0).tolist(), pilot
    assert len(set(group.tolist())) > 1  # the case has sessions outside the pilot's group
    # a stream's pilots are the sessions of its valid requests
    session = jnp.asarray([0, 0, 2, 2, 4, 4, 0, 0], jnp.int32)
    valid = jnp.asarray([True] * 6 + [False] * 2)
    got = np.asarray(ps.pilots(words, session, valid, 64))
    assert set(got.tolist()) == {0, 2, 4}


# --- the store against its Python mirror -------------------------------------------------------------

SMALL = dict(blocks_per_plane=32, pages_per_block=4, max_writes=12, n_labels=2, gc_rounds=2)


def _drive(config, knobs, session_bytes, evicted, roots_us, pilot=None, kept=None):
    """The store over ``calls`` calls: each call's cuts (``kept`` f32[calls, R]: the share of its stored bytes
    a session keeps, > 1 none; None: no cuts), its bytes (f32[calls, R]) written, then the evictions
    (bool[calls, R]), then GC; returns the final store (``pilot``: ``ps.init``'s)."""
    words = (rng.seed_word(SEED), jnp.int32(1))
    root = Clock(jnp.zeros_like(roots_us, dtype=jnp.int32), roots_us)
    kept = jnp.full_like(session_bytes, 2.0) if kept is None else kept

    def call(st, x):
        b, e, k = x
        st = ps.cut(words, st, jnp.where(k <= 1.0, k * ps.stored_bytes(st, knobs), jnp.inf), knobs, config)
        st, _ = ps.write(words, st, b, root, knobs, config)
        st = ps.invalidate(st, e, config)
        st, _ = ps.collect(words, st, knobs, config)
        return st, None

    st, _ = jax.lax.scan(call, ps.init(config, pilot), (session_bytes, evicted, kept))
    return st


def _workload(r, calls, page_bytes, seed):
    """Bytes f32[calls, R], evictions bool[calls, R] and cuts (the share of its bytes a session keeps, 2: none)
    f32[calls, R]."""
    g = np.random.default_rng(seed)
    live = g.random((calls, r)) < 0.5
    b = np.where(live, g.integers(0, 30, (calls, r)) * page_bytes * 4.3, 0.0).astype(np.float32)
    e = g.random((calls, r)) < 0.04
    kept = np.where(g.random((calls, r)) < 0.08, g.random((calls, r)), 2.0).astype(np.float32)
    return b, e, kept


@pytest.mark.parametrize("placement", ["random", "groups", "groups+labels", "groups+pilots"])
def test_the_store_equals_its_python_mirror_page_for_page(placement):
    r, calls, planes = 10, 100, 3
    config = ps.PlaneStoreConfig(sessions=r, planes=planes, **SMALL)
    pilot = [7, 2, 7] if placement == "groups+pilots" else None  # two planes in session 7's group
    room = 1e9
    knobs = ps.PlaneStoreKnobs.make(config, room, package_planes=12, grouped=float(placement != "random"),
                                    group_size=3, lifetime_aware=float(placement == "groups+labels"),
                                    label_interval_us=10.0, gc_trigger=0.7)
    page = float(np.float32(knobs.page_bytes))
    b, e, kept = _workload(r, calls, page / 6, seed=len(placement))
    roots = np.arange(r, dtype=np.float32) * 7.0
    # knobs traced, as the engine passes them (closed over, XLA may fold a division into a reciprocal)
    st = jax.jit(lambda kn, b, e, k: _drive(config, kn, b, e, jnp.asarray(roots), pilot, k))(
        knobs, jnp.asarray(b), jnp.asarray(e), jnp.asarray(kept))
    ref = href.SampledPlanes(config, knobs, roots.tolist(), (rng.seed_word(SEED), jnp.int32(1)), pilot)
    f = np.float32
    for k in range(calls):
        stored = [f(f(pos) * ref.bpp) + pend for pos, pend in zip(ref.position, ref.pending)]  # ps.stored_bytes
        ref.cut({s: f(kept[k, s] * stored[s]) for s in range(r) if kept[k, s] <= 1.0})
        ref.write(b[k])
        ref.invalidate(np.flatnonzero(e[k]).tolist())
        ref.collect()
    assert np.asarray(st.pending_bytes).tolist() == ref.pending and np.asarray(st.pages_written).tolist() == ref.written
    assert np.asarray(st.position).tolist() == ref.position
    for j, plane in enumerate(ref.planes):
        got = kv_blocks.settle(jax.tree_util.tree_map(lambda a: a[j], st.planes), config.plane)
        for name in ("host_pages", "gc_pages", "erases", "invalidated_pages", "diverged_pages", "stalled_writes",
                     "capped_writes"):
            assert int(getattr(got, name)) == getattr(plane, name), (name, j)
        assert np.asarray(got.session_pages).tolist() == plane.session_pages, j
        assert np.asarray(got.pending_bytes).tolist() == plane.pending, j  # the pages waiting on the plane
        assert np.asarray(got.blocks.valid).tolist() == plane.valid, j
        assert np.asarray(got.blocks.status).tolist() == plane.status, j
        assert np.asarray(got.blocks.erases).tolist() == plane.erase_count, j
        assert not bool(got.overflow) and not plane.overflow, j
    assert float(ps.waf(st)) == ref.waf()
    assert float(ps.package_scale(st, knobs, config)) == ref.package_scale()
    # the case holds what it claims: every plane written and collected, GC moved valid pages
    assert all(p.host_pages > 0 and p.erases > 0 and p.diverged_pages > 0 for p in ref.planes) and ref.gc_pages > 0, [
        (p.host_pages, p.erases, p.gc_pages, p.stalled_writes, p.diverged_pages) for p in ref.planes]
    if placement == "groups+labels":
        assert len(set(ref.label)) == 2


def _cohorts(calls: int, lifetime: int, sessions: int, mult: int):
    """Call c starts session (c × mult) mod R at time c µs; a session writes one page a call for ``lifetime``
    calls and is evicted after its last (deterministic lifetimes). Returns (writes bool[calls, R],
    evicted bool[calls, R], root start f32[calls, R])."""
    start = np.full(sessions, -1e6)
    w, e, roots = [], [], []
    for c in range(calls):
        start[(c * mult) % sessions] = c
        age = c - start
        live = (age >= 0) & (age < lifetime)
        w.append(live)
        e.append(live & (age == lifetime - 1))
        roots.append(start.copy())
    return np.asarray(w), np.asarray(e), np.asarray(roots, np.float32)


def test_deterministic_lifetimes_with_lifetime_labels_give_waf_one():
    """HBFlex §5.4's premise: when every session lives the same time, a label of its start time is a label of
    its death, so each block dies whole and greedy GC never migrates (WAF = 1), while interleaving the same
    pages (sessions in an order unrelated to their age) leaves every block part-valid for up to a lifetime
    and, in a store smaller than a lifetime's writes, GC must migrate (WAF > 1). One plane receiving every
    page (N = 1); 20 live sessions write a page a call each (210 live pages); the store holds 512 pages and GC
    runs above 60 % (307 < 400 pages, a lifetime's writes); 24 labels of one call each (> 20 live starts)."""
    lifetime, sessions, labels = 20, 47, 24
    config = ps.PlaneStoreConfig(sessions=sessions, planes=1, blocks_per_plane=128, pages_per_block=4,
                                 max_writes=lifetime, n_labels=labels, gc_rounds=8)
    w, e, roots = _cohorts(400, lifetime, sessions, mult=7)
    words = (rng.seed_word(SEED), jnp.int32(0))

    def run(knobs):
        page = knobs.page_bytes

        def call(st, x):
            wc, ec, rc = x
            st, _ = ps.write(words, st, jnp.where(wc, page, 0.0), Clock(jnp.zeros(sessions, jnp.int32), rc), knobs,
                             config)
            st, _ = ps.collect(words, ps.invalidate(st, ec, config), knobs, config)
            return st, None

        return jax.lax.scan(call, ps.init(config), (jnp.asarray(w), jnp.asarray(e), jnp.asarray(roots)))[0]

    out = {}
    for aware in (1.0, 0.0):
        knobs = ps.PlaneStoreKnobs.make(config, room_bytes=512.0, package_planes=1, grouped=1.0, group_size=1,
                                        lifetime_aware=aware, label_interval_us=1.0, gc_trigger=0.6)
        st = jax.jit(run)(knobs)
        assert not bool(ps.overflow(st)) and int(ps.stalled_writes(st)) == 0
        assert int(ps.erases(st)) > 3 * 128  # the store turned over several times
        out[aware] = float(ps.waf(st))
    assert out[1.0] == 1.0  # every GC victim wholly invalid
    assert out[0.0] > 1.1  # measured 1.1485


# --- the store's WAF against the GC workloads --------------------------------------------------------


def _sessions(words, knobs, config, pages_per_tick, mean_ticks, warm, ticks, kind):
    """A closed loop of R sessions (kv_lifetimes' order each tick: GC, ends, admissions, writes): each
    session writes ``pages_per_tick`` pages of the package × N a tick until its lifetime (drawn as
    ``kv_lifetimes.draw_lifetime`` draws a request's) ends, then its pages die and a new session takes its
    place. Returns (WAF over the measured ticks, the host waited in some tick)."""
    r = config.sessions
    lifetimes = kl.KvKnobs.make(kl.KvConfig(n_blocks=BLOCKS, pages_per_block=PAGES), mean_lifetime_ticks=mean_ticks)
    life = functools.partial(kl.draw_lifetime, words, knobs=lifetimes, kind=kind)
    per_call = jnp.full(r, pages_per_tick, jnp.float32) * knobs.package_planes * knobs.page_bytes

    def tick(c, t):
        st, end, start, serial = c
        st, _ = ps.collect(words, st, knobs, config)
        ending = t >= end
        st = ps.invalidate(st, ending, config)
        end = jnp.where(ending, t + life(serial + jnp.cumsum(ending) - 1), end)
        start = jnp.where(ending, t * 1e3, start)
        st, _ = ps.write(words, st, per_call, Clock(jnp.zeros(r, jnp.int32), start), knobs, config)
        return (st, end, start, serial + ending.sum()), (ps.host_pages(st), ps.gc_pages(st), ps.stalled_writes(st))

    slot = jnp.arange(r, dtype=jnp.int32)
    start = (ps.init(config), life(slot), jnp.zeros(r, jnp.float32), jnp.int32(r))
    _, (h, g, stalled) = jax.lax.scan(tick, start, jnp.arange(warm + ticks))
    dh, dg = h[-1] - h[warm - 1], g[-1] - g[warm - 1]
    return (dh + dg).astype(jnp.float32) / dh.astype(jnp.float32), stalled[-1] > 0, dg


R, MEAN, BLOCKS, PAGES, WARM, TICKS, STREAMS = 14, 40.0, 128, 16, 240, 480, 12


def _store(pages_per_tick, planes, grouped, aware=0.0, kind="exponential", sessions=R):
    """WAF, host waited, GC migrations of each of ``STREAMS`` streams of :func:`_sessions` on the store."""
    config = ps.PlaneStoreConfig(sessions=sessions, planes=planes, blocks_per_plane=BLOCKS, pages_per_block=PAGES,
                                 max_writes=max(64, 2 * sessions * pages_per_tick), n_labels=2, gc_rounds=8)
    knobs = ps.PlaneStoreKnobs.make(config, 1e9, package_planes=64, grouped=grouped, group_size=64,
                                    lifetime_aware=aware, label_interval_us=1e3 * MEAN, gc_trigger=0.9)
    run = jax.jit(jax.vmap(lambda s, kn: _sessions((rng.seed_word(SEED), s), kn, config, pages_per_tick,
                                                   MEAN, WARM, TICKS, kind), in_axes=(0, None)))
    waf, stalled, moved = run(jnp.arange(STREAMS, dtype=jnp.int32), knobs)
    return np.asarray(waf, np.float64), np.asarray(stalled), np.asarray(moved)


@functools.lru_cache(maxsize=None)
def _gc_kv(pages_per_tick, sessions=R):
    kc = kl.KvConfig(n_blocks=BLOCKS, pages_per_block=PAGES, slots=sessions, pages_per_tick=pages_per_tick,
                     allocation="interleaved", lifetime="exponential", warmup_ticks=WARM, measure_ticks=TICKS,
                     victims_per_gc=4, gc_rounds=8)
    kk = kl.KvKnobs.make(kc, mean_lifetime_ticks=MEAN, gc_trigger_used=0.9, gc_target_used=0.9)
    out = jax.jit(jax.vmap(lambda s: kl.simulate(s, rng.seed_word(SEED), kk, kl.KvInputs.make(), kc)))(
        jnp.arange(STREAMS, dtype=jnp.int32))
    host = np.asarray(out.host_writes, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # a stream the host waited through wrote nothing
        waf = (host + np.asarray(out.migrated_pages)) / host
    return waf, np.asarray(out.stalled_ticks) > 0


def test_one_group_over_every_plane_is_the_interleaved_gc_workload():
    waf, stalled, moved = _store(2, planes=2, grouped=1.0)
    want, waited = _gc_kv(2)
    same = ~stalled & ~waited
    assert same.sum() >= STREAMS // 2 and (moved[same] > 0).all()  # the comparison covers GC on most streams
    np.testing.assert_allclose(waf[same], want[same], rtol=1e-6)


@pytest.mark.slow
def test_random_placement_reproduces_the_interleaved_workload_within_ten_percent_from_below():
    """Paired on the same lifetimes (streams where neither run made the host wait): random placement's
    Poisson counts per plane spread the blocks' valid pages, so greedy GC finds emptier victims and its
    WAF is below the interleaved workload's, by 3 % here; the claim checked is "within 10 %, from
    below"."""
    waf, stalled, _ = _store(2, planes=4, grouped=0.0, sessions=12)
    want, waited = _gc_kv(2, 12)
    ok = ~stalled & ~waited
    assert ok.sum() >= STREAMS // 2
    gap = (waf[ok] - want[ok]) / want[ok]
    se = gap.std(ddof=1) / np.sqrt(len(gap))
    assert gap.mean() < -2 * se and gap.mean() > -0.10


@pytest.mark.slow
def test_a_streams_waf_converges_in_the_planes_it_samples():
    """Paired on the same sessions, |WAF(P planes) − WAF(16 planes)| falls as the placement noise of P
    independent planes does, ∝ √(1/P − 1/16) (measured rms 0.032, 0.024, 0.017, 0.006 at P = 1, 2, 4, 8
    against 0.032 × 1, 0.71, 0.45, 0.26)."""
    runs = {p: _store(2, planes=p, grouped=0.0, sessions=12) for p in (1, 8, 16)}
    ok = ~np.any([r[1] for r in runs.values()], axis=0)
    assert ok.sum() >= STREAMS // 2
    rms = {p: np.sqrt(np.mean((runs[p][0][ok] - runs[16][0][ok]) ** 2)) for p in (1, 8)}
    assert rms[8] < rms[1] / 2  # expected ratio 0.26
