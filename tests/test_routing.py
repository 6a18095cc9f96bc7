"""MoE routing: exact laws of the distinct-expert count, per-token invariants, balanced layout, zipf
inclusion probabilities by exact enumeration, and transform invariants."""

import itertools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _compiles import compilations

from hbfjax import batch
from hbfjax.validate import ConfigError
from hbfjax.workload import routing as r

Z = 4.5  # tolerance in standard errors: two-sided false-alarm rate ~7e-6 per check
SAMPLED = [("uniform", "floyd"), ("uniform", "gumbel"), ("zipf", "successive"), ("zipf", "gumbel")]  # s = 0: uniform
WORDS = (jnp.uint32(7), jnp.int32(3), jnp.int32(5))  # (seed, stream, layer)
# jitted once per config: eager dispatch of every small op would dominate these tests' time
route = jax.jit(r.route, static_argnums=4)
token_experts = jax.jit(r.token_experts, static_argnums=4)


def _run(config, tokens, streams, layers, skew=0.0, seed=0, iteration=0):
    """Routing of ``layers`` layers × ``streams`` streams: fields [S, L, ...] as NumPy."""
    inputs = r.RoutingInputs(token_mask=r.active_mask(tokens, config), iteration=jnp.int32(iteration),
                             layers=jnp.arange(layers, dtype=jnp.int32))
    return batch.run(r.simulate, streams, seed, r.RoutingKnobs.make(skew), config, inputs=inputs)


def _picks(config, mask, words=WORDS, iteration=0, skew=0.0):
    return np.asarray(token_experts(words, jnp.int32(iteration), jnp.asarray(mask), r.RoutingKnobs.make(skew),
                                      config))


def _assert_counts_match_law(counts, law):
    """Per-bin z-test of a histogram against exact probabilities; impossible bins must stay empty."""
    n = counts.sum()
    for c, p in zip(counts, law):
        p = float(p)
        if p == 0:
            assert c == 0
        else:
            assert abs(c - n * p) < Z * math.sqrt(n * p * (1 - p)), (counts, n * np.asarray(law, float))


# --- analytic laws ----------------------------------------------------------------------------------


def test_distinct_law_dp_matches_brute_force_enumeration():
    for e, k, t in [(4, 2, 2), (5, 3, 3), (6, 1, 4)]:
        subsets = list(itertools.combinations(range(e), k))
        counts = [0] * (e + 1)
        for choice in itertools.product(subsets, repeat=t):
            counts[len(set().union(*choice))] += 1
        brute = [Fraction(c, len(subsets) ** t) for c in counts]
        assert r.distinct_experts_pmf(e, k, t, exact=True) == brute
        np.testing.assert_allclose(r.distinct_experts_pmf(e, k, t), [float(p) for p in brute], rtol=1e-12, atol=0)


def test_distinct_law_in_floats_matches_exact_fractions_for_wide_top_k():
    exact = r.distinct_experts_pmf(200, 100, 2, exact=True)  # C(200, 100) ≈ 9e58
    np.testing.assert_allclose(r.distinct_experts_pmf(200, 100, 2), [float(p) for p in exact], rtol=1e-9,
                               atol=1e-300)
    assert r.distinct_experts_pmf(4096, 2048, 3).sum() == pytest.approx(1.0, abs=1e-9)  # C(E, k) > 1e308


@pytest.mark.parametrize("e,k,t", [(8, 2, 3), (256, 8, 64), (64, 4, 1000)])
def test_distinct_law_mean_is_the_closed_form(e, k, t):
    law = r.distinct_experts_pmf(e, k, t)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    assert (np.arange(e + 1) * law).sum() == pytest.approx(r.expected_distinct_experts(e, k, t), rel=1e-10)


@pytest.mark.parametrize("weights,drawn", [([3, 1, 4, 2], [1, 2]), ([5, 1, 1, 1, 2], [4, 0, 2]),
                                           ([2, 2, 2], []), ([1, 7, 1, 3, 1, 1], [5, 3, 0, 1])])
def test_successive_draw_skips_drawn_intervals_exactly(weights, drawn):
    # every integer of the remaining mass, traced by hand: the ranks not drawn, each w times, in order
    weight = jnp.asarray(weights, jnp.uint32)
    start = jnp.cumsum(weight, dtype=jnp.uint32) - weight
    expect = [q for q, w in enumerate(weights) if q not in drawn for _ in range(w)]
    x = jnp.arange(len(expect), dtype=jnp.uint32)
    ascending = [jnp.full(x.shape, c, jnp.int32) for c in sorted(drawn)]
    assert np.asarray(r._rank_at(x, ascending, start, weight)).tolist() == expect
    columns = []
    for c in drawn:
        columns = r._insert_sorted(columns, jnp.array([c], jnp.int32))
    assert [int(c[0]) for c in columns] == sorted(drawn)


def test_expected_distinct_experts_takes_a_traced_token_count():
    f = jax.jit(lambda t: r.expected_distinct_experts(256, 8, t))
    assert float(f(jnp.float32(32))) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 32), rel=1e-5)


# --- sampled laws -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,sampler", SAMPLED)
@pytest.mark.parametrize("e,k,t", [(8, 2, 3), (6, 3, 2)])
def test_distinct_experts_follow_the_exact_law(kind, sampler, e, k, t):
    config = r.RoutingConfig(e, k, kind=kind, max_tokens=t, sampler=sampler)
    d = _run(config, t, streams=500, layers=200, seed=e * 10 + k).distinct_experts.ravel()
    _assert_counts_match_law(np.bincount(d, minlength=e + 1), r.distinct_experts_pmf(e, k, t, exact=True))


@pytest.mark.parametrize("kind,sampler", SAMPLED)
def test_each_k_subset_is_equally_likely(kind, sampler):
    e, k = 6, 3
    config = r.RoutingConfig(e, k, kind=kind, max_tokens=4096, sampler=sampler)
    picks = np.concatenate([_picks(config, np.ones(4096, bool), (jnp.uint32(1), jnp.int32(s), jnp.int32(0)))
                            for s in range(25)])
    index = {c: i for i, c in enumerate(itertools.combinations(range(e), k))}
    subsets = np.array([index[tuple(sorted(row))] for row in picks.tolist()])
    _assert_counts_match_law(np.bincount(subsets, minlength=len(index)), [1 / len(index)] * len(index))


@pytest.mark.parametrize("kind,sampler", SAMPLED)
def test_mean_distinct_experts_matches_closed_form(kind, sampler):
    e, k, t = 256, 8, 48
    config = r.RoutingConfig(e, k, kind=kind, max_tokens=64, sampler=sampler)
    d = _run(config, t, streams=64, layers=32, seed=11).distinct_experts.ravel()
    se = d.std(ddof=1) / math.sqrt(d.size)
    assert abs(d.mean() - r.expected_distinct_experts(e, k, t)) < Z * se


# --- per-token invariants ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind,sampler", SAMPLED + [("balanced", "auto")])
def test_rows_count_each_active_tokens_k_distinct_picks(kind, sampler):
    e, k, t_max = 16, 4, 40
    config = r.RoutingConfig(e, k, shared_experts=2, kind=kind, max_tokens=t_max, sampler=sampler)
    gen = np.random.default_rng(0)
    for trial in range(6):
        mask = gen.random(t_max) < [0.0, 0.1, 0.5, 0.9, 1.0, 0.3][trial]
        words = (jnp.uint32(2), jnp.int32(trial), jnp.int32(1))
        picks = _picks(config, mask, words, iteration=trial, skew=1.5)
        assert np.all(picks[~mask] == -1)
        active = picks[mask]
        assert active.min(initial=0) >= 0 and active.max(initial=0) < e
        assert all(len(set(row)) == k for row in active.tolist())
        out = route(words, jnp.int32(trial), jnp.asarray(mask), r.RoutingKnobs.make(1.5), config)
        rows = np.asarray(out.rows)
        np.testing.assert_array_equal(rows, np.bincount(active.ravel(), minlength=e))
        assert rows.sum() == mask.sum() * k
        np.testing.assert_array_equal(np.asarray(out.needed), rows > 0)
        assert int(out.distinct_experts) == (rows > 0).sum() and int(out.shared_rows) == mask.sum()


def test_no_shared_experts_give_no_shared_rows():
    config = r.RoutingConfig(16, 2, shared_experts=0, max_tokens=8)
    out = route(WORDS, jnp.int32(0), r.active_mask(5, config), r.RoutingKnobs.make(), config)
    assert int(out.shared_rows) == 0 and int(out.rows.sum()) == 10


@pytest.mark.parametrize("kind,sampler", SAMPLED)
def test_a_tokens_picks_do_not_depend_on_other_tokens(kind, sampler):
    config = r.RoutingConfig(32, 4, kind=kind, max_tokens=64, sampler=sampler)
    full = _picks(config, np.ones(64, bool), skew=0.8)
    mask = np.arange(64) % 3 == 1
    np.testing.assert_array_equal(_picks(config, mask, skew=0.8)[mask], full[mask])


@pytest.mark.parametrize("kind,sampler", SAMPLED)
def test_same_words_same_routing_and_iterations_draw_afresh(kind, sampler):
    config = r.RoutingConfig(64, 6, kind=kind, max_tokens=128, sampler=sampler)
    mask = np.ones(128, bool)
    a, b = _picks(config, mask, iteration=4, skew=1.0), _picks(config, mask, iteration=4, skew=1.0)
    np.testing.assert_array_equal(a, b)
    assert np.mean(a != _picks(config, mask, iteration=5, skew=1.0)) > 0.5
    other_layer = (WORDS[0], WORDS[1], WORDS[2] + 1)
    assert np.mean(a != _picks(config, mask, other_layer, iteration=4, skew=1.0)) > 0.5


# --- balanced ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("e,k", [(16, 4), (7, 3), (256, 8)])
def test_balanced_rows_spread_evenly_over_min_experts_and_rows(e, k):
    config = r.RoutingConfig(e, k, kind="balanced", max_tokens=100)
    knobs = r.RoutingKnobs.make()
    for tokens in [0, 1, 2, 3, 5, 17, 64, 100]:
        sorted_rows = None
        for layer in range(4):
            words = (jnp.uint32(1), jnp.int32(2), jnp.int32(layer))
            mask = r.active_mask(tokens, config)
            out = route(words, jnp.int32(layer), mask, knobs, config)
            rows = np.asarray(out.rows)
            used = min(e, tokens * k)
            assert rows.sum() == tokens * k and int(out.distinct_experts) == used
            if used:
                assert rows[rows > 0].max() - rows[rows > 0].min() <= 1
                assert any(np.all(rows[(start + np.arange(used)) % e] > 0) for start in range(e))  # consecutive mod E
            # rows per expert, up to which experts, depend on T alone
            sorted_rows = np.sort(rows) if sorted_rows is None else sorted_rows
            np.testing.assert_array_equal(np.sort(rows), sorted_rows)
            np.testing.assert_array_equal(rows, np.bincount(_picks(config, np.asarray(mask), words)[:tokens].ravel(),
                                                            minlength=e))


def test_balanced_choice_is_a_property_of_the_layer():
    config = r.RoutingConfig(64, 2, kind="balanced", max_tokens=8)
    mask, knobs = r.active_mask(3, config), r.RoutingKnobs.make()
    rows = [np.asarray(route(WORDS, jnp.int32(i), mask, knobs, config).rows) for i in range(3)]
    np.testing.assert_array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(rows[0], rows[2])
    offsets = {int(np.flatnonzero(route((WORDS[0], WORDS[1], jnp.int32(layer)), jnp.int32(0), mask, knobs,
                                          config).rows)[0]) for layer in range(20)}
    assert len(offsets) > 10  # the rotation differs between layers


# --- zipf -------------------------------------------------------------------------------------------


def _successive_inclusion(p: list[float], k: int) -> list[float]:
    """Exact P(expert i among k draws without replacement, each ∝ p over those left): enumeration."""
    incl = [0.0] * len(p)
    for seq in itertools.permutations(range(len(p)), k):
        prob, left = 1.0, 1.0
        for i in seq:
            prob *= p[i] / left
            left -= p[i]
        for i in seq:
            incl[i] += prob
    return incl


def test_popularity_is_a_persistent_permutation_of_rank_powers():
    config = r.RoutingConfig(10, 2, kind="zipf", max_tokens=4)
    rank = np.asarray(r.expert_rank(WORDS, config))
    assert sorted(rank.tolist()) == list(range(10))
    weights = [(q + 1) ** -1.3 for q in rank.tolist()]
    p = np.asarray(r.expert_popularity(WORDS, r.RoutingKnobs.make(1.3), config))
    np.testing.assert_allclose(p, np.array(weights) / sum(weights), rtol=2e-6)
    other = np.asarray(r.expert_rank((WORDS[0], WORDS[1], WORDS[2] + 1), config))
    assert not np.array_equal(rank, other)


ZIPF_SAMPLERS = ["successive", "gumbel"]


def test_popularity_orders_are_equally_likely_permutations():
    config = r.RoutingConfig(4, 1, kind="zipf", max_tokens=1)
    order_of = jax.jit(jax.vmap(jax.vmap(lambda s, layer: r.expert_order((jnp.uint32(9), s, layer), config),
                                         (None, 0)), (0, None)))
    orders = np.asarray(order_of(jnp.arange(600, dtype=jnp.int32), jnp.arange(200, dtype=jnp.int32))).reshape(-1, 4)
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([index[tuple(o)] for o in orders.tolist()], minlength=24)
    _assert_counts_match_law(counts, [1 / 24] * 24)
    rank = np.asarray(r.expert_rank(WORDS, config))
    np.testing.assert_array_equal(np.asarray(r.expert_order(WORDS, config))[rank], np.arange(4))


@pytest.mark.parametrize("sampler", ZIPF_SAMPLERS)
@pytest.mark.parametrize("skew", [0.7, 2.0])
def test_zipf_inclusion_and_mean_distinct_match_exact_enumeration(skew, sampler):
    e, k, t = 6, 3, 4
    config = r.RoutingConfig(e, k, kind="zipf", max_tokens=t, sampler=sampler)
    p = [(q + 1) ** -skew for q in range(e)]
    incl = _successive_inclusion([w / sum(p) for w in p], k)  # by rank
    out = _run(config, t, streams=400, layers=100, skew=skew, seed=3)
    rank_of = jax.vmap(jax.vmap(lambda s, layer: r.expert_rank((jnp.uint32(3), s, layer), config),
                                (None, 0)), (0, None))
    ranks = np.asarray(rank_of(jnp.arange(400, dtype=jnp.int32), jnp.arange(100, dtype=jnp.int32))).reshape(-1, e)
    rows = out.rows.reshape(-1, e)
    for q in range(e):  # a token includes the rank-q expert with probability incl[q]
        share = rows[ranks == q]  # [S·L] rows of that expert out of t tokens
        n = share.size * t
        assert abs(share.sum() - n * incl[q]) < Z * math.sqrt(n * incl[q] * (1 - incl[q]))
    d = out.distinct_experts.ravel()
    exact_mean = sum(1 - (1 - pi) ** t for pi in incl)
    assert abs(d.mean() - exact_mean) < Z * d.std(ddof=1) / math.sqrt(d.size)


@pytest.mark.parametrize("sampler", ZIPF_SAMPLERS)
def test_largest_skew_on_most_experts_still_orders_by_popularity(sampler):
    # s = 10 on E = 4096: p(rank 0) ≈ 0.999 and rank 1 beats all colder ranks ~98 % of the time, so a
    # token misses rank 0 or 1 with probability < 1e-11: float32 keys must neither overflow nor tie
    config = r.RoutingConfig(r.MAX_EXPERTS, 8, kind="zipf", max_tokens=16, sampler=sampler)
    picks = _picks(config, np.ones(16, bool), skew=r.MAX_ZIPF_SKEW)
    hot = np.argsort(np.asarray(r.expert_rank(WORDS, config)))[:2]
    assert all(len(set(row)) == 8 and set(hot) <= set(row) for row in picks.tolist())


@pytest.mark.parametrize("sampler", ZIPF_SAMPLERS)
def test_more_skew_needs_fewer_distinct_experts(sampler):
    e, k, t = 64, 4, 32
    config = r.RoutingConfig(e, k, kind="zipf", max_tokens=t, sampler=sampler)
    means, ses = [], []
    for skew in [0.0, 0.5, 1.0, 2.0]:
        d = _run(config, t, streams=32, layers=32, skew=skew, seed=5).distinct_experts.ravel()
        means.append(d.mean())
        ses.append(d.std(ddof=1) / math.sqrt(d.size))
    assert abs(means[0] - r.expected_distinct_experts(e, k, t)) < Z * ses[0]
    for i in range(3):
        assert means[i] - means[i + 1] > Z * math.hypot(ses[i], ses[i + 1]), means


# --- transforms and compilation ---------------------------------------------------------------------


def test_route_layers_is_route_per_layer_word():
    config = r.RoutingConfig(32, 4, kind="zipf", max_tokens=20)
    knobs, mask = r.RoutingKnobs.make(1.0), r.active_mask(13, config)
    layers = jnp.array([0, 3, 7], jnp.int32)
    both = jax.jit(r.route_layers, static_argnums=5)(WORDS[:2], jnp.int32(2), layers, mask, knobs, config)
    for i, layer in enumerate([0, 3, 7]):
        one = route((*WORDS[:2], jnp.int32(layer)), jnp.int32(2), mask, knobs, config)
        for a, b in zip(both, one):
            np.testing.assert_array_equal(np.asarray(a)[i], np.asarray(b))


@pytest.mark.parametrize("kind", r.KINDS)
def test_vmap_over_streams_equals_a_loop(kind):
    config = r.RoutingConfig(48, 6, shared_experts=1, kind=kind, max_tokens=30)
    inputs = r.RoutingInputs(r.active_mask(21, config), jnp.int32(9), jnp.arange(5, dtype=jnp.int32))
    knobs = r.RoutingKnobs.make(0.9)
    batched = batch.run(r.simulate, 6, 4, knobs, config, inputs=inputs)
    for s in range(6):
        one = jax.jit(r.simulate, static_argnums=4)(jnp.int32(s), jnp.uint32(4), knobs, inputs, config)
        for a, b in zip(batched, one):
            np.testing.assert_array_equal(a[s], np.asarray(b))


def test_a_skew_sweep_on_the_knob_axis_equals_separate_runs():
    config = r.RoutingConfig(32, 4, kind="zipf", max_tokens=40)
    inputs = r.RoutingInputs(r.active_mask(30, config), jnp.int32(1), jnp.arange(4, dtype=jnp.int32))
    skews = [0.0, 1.0, 2.5]
    swept = batch.run(r.simulate, 5, 2, batch.stack_knobs([r.RoutingKnobs.make(s) for s in skews]), config,
                      inputs=inputs, knob_axis=True)
    for i, skew in enumerate(skews):
        np.testing.assert_array_equal(swept.rows[:, i], batch.run(r.simulate, 5, 2, r.RoutingKnobs.make(skew),
                                                                  config, inputs=inputs).rows)


@pytest.mark.parametrize("kind", r.KINDS)
def test_token_count_and_skew_changes_do_not_recompile(kind):
    config = r.RoutingConfig(40, 5, kind=kind, max_tokens=50)
    fn = batch.compiled(r.simulate)
    ids = batch.stream_ids(0, 4)
    with compilations("simulate") as compiled:
        for tokens, skew, iteration in [(50, 0.0, 0), (7, 1.5, 1), (0, 3.0, 2)]:
            inputs = r.RoutingInputs(r.active_mask(tokens, config), jnp.int32(iteration),
                                     jnp.arange(3, dtype=jnp.int32))
            out = fn(ids, jnp.uint32(1), r.RoutingKnobs.make(skew), inputs, config)
            assert np.all(np.asarray(out.rows).sum(-1) == tokens * 5)
    assert len(compiled) == 1, compiled


# --- refused values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,field", [
    (dict(routed_experts=8, top_k=9), "top_k"),
    (dict(routed_experts=8, top_k=0), "top_k"),
    (dict(routed_experts=0, top_k=1), "routed_experts"),
    (dict(routed_experts=8.5, top_k=2), "routed_experts"),
    (dict(routed_experts=8, top_k=2.5), "top_k"),
    (dict(routed_experts=8, top_k=2, shared_experts=-1), "shared_experts"),
    (dict(routed_experts=8, top_k=2, kind="softmax"), "kind"),
    (dict(routed_experts=8, top_k=2, max_tokens=0), "max_tokens"),
    (dict(routed_experts=8, top_k=2, max_tokens=100.5), "max_tokens"),
    (dict(routed_experts=8, top_k=2, max_tokens=True), "max_tokens"),
    (dict(routed_experts=4096, top_k=4096, max_tokens=2**19), "max_tokens"),
    (dict(routed_experts=8, top_k=2, sampler="alias"), "sampler"),
    (dict(routed_experts=8, top_k=2, kind="zipf", sampler="floyd"), "sampler"),
    (dict(routed_experts=8, top_k=2, kind="uniform", sampler="successive"), "sampler"),
    (dict(routed_experts=8, top_k=2, kind="balanced", sampler="gumbel"), "sampler"),
])
def test_bad_configs_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^RoutingConfig\.{field} = "):
        r.RoutingConfig(**kwargs)


@pytest.mark.parametrize("skew", [-0.1, r.MAX_ZIPF_SKEW + 0.1, float("nan"), float("inf"), "1", None])
def test_bad_skew_is_refused(skew):
    with pytest.raises(ConfigError, match=r"^RoutingKnobs\.zipf_skew = "):
        r.RoutingKnobs.make(skew)


@pytest.mark.parametrize("args", [(8, 9, 2), (8, 0, 2), (8, 2, -1), (8, 2, 1.5)])
def test_bad_law_arguments_are_refused(args):
    with pytest.raises(ConfigError):
        r.distinct_experts_pmf(*args)


def test_distinct_count_draws_follow_the_exact_law_and_count_routing_keeps_the_totals():
    config = r.RoutingConfig(routed_experts=8, top_k=2, max_tokens=5)
    law = r.distinct_experts_pmf(8, 2, 3)
    draws = jax.vmap(lambda i: r.distinct_count_draws((jnp.uint32(5), jnp.int32(0)), i, jnp.arange(64), jnp.int32(3),
                                                      config))(jnp.arange(500))  # 500 iterations × 64 layers
    counts = np.bincount(np.asarray(draws).ravel(), minlength=9)
    n = counts.sum()
    z = (counts - n * law) / np.sqrt(n * law * (1 - law) + 1e-300)
    assert np.all(np.abs(z[law > 0]) < 4.5) and np.all(counts[law == 0] == 0)  # ~7e-6 false alarm per bin
    routed = r.count_routing(jnp.asarray([1, 3, 4]), jnp.int32(3), config)
    assert np.asarray(routed.rows).sum(axis=1).tolist() == [6, 6, 6]
    assert np.asarray(routed.distinct_experts).tolist() == [1, 3, 4]
    assert np.asarray(routed.rows[2]).tolist() == [2, 2, 1, 1, 0, 0, 0, 0]
    # the tables' rows are the per-token-count laws
    np.testing.assert_allclose(r.distinct_experts_pmf(8, 2, 5, all_tokens=True)[3], law)
