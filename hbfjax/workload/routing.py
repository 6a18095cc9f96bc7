"""MoE routing: which routed experts one layer's batch needs, and how many rows each gets (DASH §II-A,
§V-C, §VI-E; DESIGN.md §4 "Delivery paths").

Per MoE layer every active token of the iteration's batch picks its top-k of the E routed experts;
the ``shared_experts`` are always active and see every token. The serving step needs, per layer, the
union of the picks (``needed``), the rows (token-expert assignments) of each expert and the count of
distinct experts. Expert choice kinds (``RoutingConfig.kind``, static: each runs a different loop):

* ``uniform``: each token picks a uniformly random k-subset of the E experts.
* ``zipf``: expert popularity p ∝ rank^(−s) for ranks 1 … E (``RoutingKnobs.zipf_skew`` s ≥ 0; s = 0 is
  uniform), each token drawing k distinct experts without replacement under those weights
  (successive sampling: each draw ∝ p over the experts not yet drawn).
  Which expert has which rank is a random permutation per (stream, layer), persistent across
  iterations (popularity is a property of the layer); token draws are fresh per (iteration, layer,
  token).
* ``balanced``: DASH §VI-E "analytical routing with balanced per-expert rows": the T·k rows of T
  active tokens go round-robin over n = min(E, T·k) experts, so rows differ by at most one. The
  experts are n consecutive ids (mod E) from a rotation drawn per (stream, layer), persistent across
  iterations: the routing is a deterministic function of the layer and T.

Samplers (``RoutingConfig.sampler``, static):

* ``floyd`` (uniform; its ``auto``): Floyd's algorithm, a partial Fisher–Yates without the array.
  Step j of k draws r uniform on {0, …, E−k+j} and takes r, or E−k+j if r was already taken. That is
  k hashes and k(k−1)/2 comparisons per token, with no rejection loop. Each draw is within 2^-32 of
  uniform (32-bit multiply-high).
* ``successive`` (zipf; its ``auto``): successive sampling on an integer inverse CDF of the
  popularity weights (quantised to multiples of 2^-31, plus 2^-31 so every expert stays drawable).
  Draw j skips the intervals already drawn exactly, so no rejection and no repeat. That is k hashes,
  k(k−1)/2 compare-adds and k binary searches over E per token.
* ``gumbel`` (uniform and zipf): a dense [T, E] key matrix and ``lax.top_k``. For zipf the key is
  log(u)·rank^s, the negated exponential race E/p, which orders the experts as Gumbel-top-k on
  log p does: exact for successive sampling without replacement, up to the 24-bit u of each key.
  It costs T·E hashes and a top-k over E per token, and holds float32[T, E] keys per layer
  (float32[L, T, E] in ``route_layers``). For uniform the key is u itself, so zipf with s = 0 makes
  the same picks as uniform ``gumbel`` on the same words (up to float ties).

All samplers are tested against the same exact laws (``tests/test_routing.py``): the distinct-expert
law, equally likely k-subsets, and zipf inclusion probabilities by enumeration.

Hash words: ``words`` identify one (stream, layer), e.g. ``(seed, stream, layer)``. The popularity
permutation and the balanced rotation hash those alone. Token draws also hash ``iteration``. Rows
are counted in int32.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import counting, rng
from hbfjax.salts import Salt
from hbfjax.validate import INT32_MAX, require, require_choice, require_int, require_real

KINDS = ("uniform", "zipf", "balanced")
SAMPLERS = ("auto", "floyd", "successive", "gumbel")
_SAMPLERS_OF_KIND = {"uniform": ("auto", "floyd", "gumbel"), "zipf": ("auto", "successive", "gumbel"),
                     "balanced": ("auto",)}
# A token-expert hash word t·E + e must stay below 2^31 (no two draws of one layer share a word).
MAX_EXPERTS = 4096
MAX_TOKENS = 2**19
# zipf keys scale by rank^s in float32: MAX_EXPERTS^s must stay finite (4096^10 ≈ 1.3e36 < 3.4e38).
MAX_ZIPF_SKEW = 10.0


@dataclass(frozen=True)
class RoutingConfig:
    """Static routing of one MoE layer: E routed experts, top-k per token, shared experts, the choice
    kind and sampler, and the token axis length ``max_tokens`` (active tokens are a traced mask)."""

    routed_experts: int
    top_k: int
    shared_experts: int = 0
    kind: str = "uniform"
    max_tokens: int = 8192
    sampler: str = "auto"

    def __post_init__(self) -> None:
        c = type(self).__name__
        require_int(c, "routed_experts", self.routed_experts, 1, MAX_EXPERTS)
        require_int(c, "top_k", self.top_k, 1)
        require(self.top_k <= self.routed_experts, c, "top_k", self.top_k,
                f"must be <= routed_experts = {self.routed_experts}")
        require_int(c, "shared_experts", self.shared_experts, 0)
        require_choice(c, "kind", self.kind, KINDS)
        require_int(c, "max_tokens", self.max_tokens, 1, MAX_TOKENS)
        require(self.max_tokens * self.top_k <= INT32_MAX, c, "max_tokens", self.max_tokens,
                f"max_tokens × top_k ({self.top_k}) must be <= {INT32_MAX}: rows are int32")
        require_choice(c, "sampler", self.sampler, SAMPLERS)
        allowed = _SAMPLERS_OF_KIND[self.kind]
        require(self.sampler in allowed, c, "sampler", self.sampler,
                f"kind = {self.kind!r} takes one of {allowed}")

    @property
    def resolved_sampler(self) -> str:
        """The sampler that runs: ``floyd`` for uniform and ``successive`` for zipf under ``auto``;
        ``balanced`` for the balanced kind (no draws per token)."""
        if self.kind == "balanced":
            return "balanced"
        if self.sampler != "auto":
            return self.sampler
        return "floyd" if self.kind == "uniform" else "successive"


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class RoutingKnobs:
    """Traced routing knobs (scalar arrays; stack a leading axis to sweep)."""

    zipf_skew: jax.Array  # float32[] s: popularity ∝ rank^(−s) (zipf kind only)

    @classmethod
    def make(cls, zipf_skew=0.0) -> "RoutingKnobs":
        """Validated knobs: the skew s lies in [0, MAX_ZIPF_SKEW]."""
        require_real(cls.__name__, "zipf_skew", zipf_skew, 0.0, MAX_ZIPF_SKEW)
        return cls(zipf_skew=jnp.asarray(zipf_skew, jnp.float32))


class Routing(NamedTuple):
    """One MoE layer's routing for one iteration (leading axes added by vmap: layers, streams)."""

    needed: jax.Array  # bool[E] routed experts picked by at least one active token
    rows: jax.Array  # int32[E] token-expert assignments per routed expert; sums to tokens × k
    distinct_experts: jax.Array  # int32[] routed experts needed (shared ones not counted)
    shared_rows: jax.Array  # int32[] rows of each shared expert (= active tokens); 0 without shared experts


def _token_hash(words: tuple, iteration, salt: Salt) -> jax.Array:
    """uint32[]: the base hash of one (stream, layer, iteration)'s token draws of one kind."""
    return rng.mix(*words, iteration, salt)


def expert_order(words: tuple, config: RoutingConfig) -> jax.Array:
    """int32[E]: the routed experts from hottest to coldest, a random permutation per (stream, layer)
    that does not change across iterations.

    Experts are sorted by a hash whose low ⌈log2 E⌉ bits are replaced by the expert id: one sort of
    uint32 keys instead of an argsort of (key, id) pairs, which is several times slower on a CPU.
    Experts whose remaining 32 − ⌈log2 E⌉ hash bits tie (probability ≈ C(E, 2)·2^(⌈log2 E⌉ − 32),
    0.2 % of layers for E = 256) take adjacent ranks in id order rather than at random."""
    e = config.routed_experts
    id_bits = max(e - 1, 1).bit_length()
    ids = jnp.arange(e, dtype=jnp.uint32)
    h = rng.mix(*words, Salt.ROUTE_POPULARITY, ids)
    return (jnp.sort((h >> id_bits << id_bits) | ids) & jnp.uint32((1 << id_bits) - 1)).astype(jnp.int32)


def expert_rank(words: tuple, config: RoutingConfig) -> jax.Array:
    """int32[E]: popularity rank of each routed expert (0 = hottest), the inverse of ``expert_order``."""
    order = expert_order(words, config)
    # a scatter, not a second sort: sorts of E dominate the cost of a small (decode) batch
    return jnp.zeros_like(order).at[order].set(jnp.arange(config.routed_experts, dtype=jnp.int32),
                                               unique_indices=True)


def expert_popularity(words: tuple, knobs: RoutingKnobs, config: RoutingConfig) -> jax.Array:
    """float32[E]: the probability p_e ∝ (rank_e + 1)^(−s) of each routed expert under zipf routing
    (the weights of one token's first draw; sums to 1)."""
    return jax.nn.softmax(-knobs.zipf_skew * jnp.log1p(expert_rank(words, config).astype(jnp.float32)))


def _floyd(h: jax.Array, experts: int, k: int, tokens: int) -> jax.Array:
    """int32[T, k]: a uniform k-subset of {0, …, E−1} per token by Floyd's algorithm."""
    word = jnp.arange(tokens, dtype=jnp.uint32)[:, None] * k + jnp.arange(k, dtype=jnp.uint32)
    draws = rng.mix(h, word)  # uint32[T, k]
    picks: list[jax.Array] = []
    for j in range(k):
        top = experts - k + j  # step j draws from {0, …, top}; top itself is never taken before step j
        r = rng.below(draws[:, j], jnp.uint32(top + 1)).astype(jnp.int32)
        taken = jnp.zeros(r.shape, bool)
        for p in picks:
            taken = taken | (p == r)
        picks.append(jnp.where(taken, top, r))
    return jnp.stack(picks, axis=1)


def _successive(words: tuple, iteration, knobs: RoutingKnobs, config: RoutingConfig) -> jax.Array:
    """int32[T, k] by successive sampling on an integer inverse CDF over popularity ranks.

    Each rank r gets an integer weight w_r = ⌊p_r·2^31⌋ + 1 (every expert stays drawable). Draw j
    takes x uniform on [0, mass of the ranks not yet drawn) and walks the drawn ranks in ascending
    order, adding w_c wherever x has reached c's interval, so that x indexes the full table with the
    drawn intervals skipped. It then finds x's rank by binary search. All of it is exact integer
    arithmetic, so a token never draws a rank twice.
    """
    e, k = config.routed_experts, config.top_k
    expert_of_rank = expert_order(words, config)  # int32[E]
    p = jax.nn.softmax(-knobs.zipf_skew * jnp.log1p(jnp.arange(e, dtype=jnp.float32)))  # float32[E] by rank
    weight = jnp.floor(p * jnp.float32(2**31)).astype(jnp.uint32) + 1  # uint32[E]; Σ < 2^31 + E + rounding
    start = jnp.cumsum(weight, dtype=jnp.uint32) - weight  # uint32[E] first integer of each rank
    word = jnp.arange(config.max_tokens, dtype=jnp.uint32)[:, None] * k + jnp.arange(k, dtype=jnp.uint32)
    draws = rng.mix(_token_hash(words, iteration, Salt.ROUTE_SUCCESSIVE), word)  # uint32[T, k]
    left = jnp.broadcast_to(weight.sum(dtype=jnp.uint32), (config.max_tokens,))  # uint32[T] mass not drawn
    ascending: list[jax.Array] = []  # int32[T] each: ranks drawn so far, sorted
    drawn: list[jax.Array] = []  # int32[T] each: ranks in draw order
    for j in range(k):
        q = _rank_at(rng.below(draws[:, j], left), ascending, start, weight)
        left = left - weight[q]
        drawn.append(q)
        ascending = _insert_sorted(ascending, q)
    return expert_of_rank[jnp.stack(drawn, axis=1)]


def _rank_at(x: jax.Array, ascending: list[jax.Array], start: jax.Array, weight: jax.Array) -> jax.Array:
    """int32[T]: the rank whose interval holds integer x (uint32[T]) once the intervals of the drawn
    ranks ``ascending`` are taken out of the table (``start``, ``weight``: uint32[E])."""
    for c in ascending:  # ascending: each shift is judged against intervals already restored below c
        x = jnp.where(x >= start[c], x + weight[c], x)
    return (jnp.searchsorted(start, x, side="right", method="scan") - 1).astype(jnp.int32)


def _insert_sorted(ascending: list[jax.Array], q: jax.Array) -> list[jax.Array]:
    """The elementwise sorted lists ``ascending`` (each int32[T], increasing along the list) with q
    (int32[T], absent from them) inserted."""
    out = []
    for i in range(len(ascending) + 1):
        value = q if i == 0 else jnp.where(ascending[i - 1] < q, q, ascending[i - 1])
        out.append(value if i == len(ascending) else jnp.where(ascending[i] < q, ascending[i], value))
    return out


def _gumbel_keys(h: jax.Array, experts: int, tokens: int) -> jax.Array:
    """float32[T, E]: u ∈ (0, 1) per (token, expert), midpoints of the 24-bit grid so log u is finite."""
    word = jnp.arange(tokens, dtype=jnp.uint32)[:, None] * experts + jnp.arange(experts, dtype=jnp.uint32)
    return ((rng.mix(h, word) >> 8).astype(jnp.float32) + 0.5) * jnp.float32(1.0 / (1 << 24))


def _top_k_picks(words: tuple, iteration, knobs: RoutingKnobs, config: RoutingConfig) -> jax.Array:
    """int32[T, k] by the dense key matrix: uniform keys u, zipf keys log(u)·rank^s (exponential race)."""
    u = _gumbel_keys(_token_hash(words, iteration, Salt.ROUTE_KEYS), config.routed_experts, config.max_tokens)
    if config.kind == "uniform":
        keys = u
    else:
        # key_e = −Exp_e / p_e up to a common factor: the k largest are a successive sample under p
        weight = jnp.exp(knobs.zipf_skew * jnp.log1p(expert_rank(words, config).astype(jnp.float32)))
        keys = jnp.log(u) * weight
    return jax.lax.top_k(keys, config.top_k)[1].astype(jnp.int32)


def _balanced_layout(words: tuple, token_mask: jax.Array, config: RoutingConfig):
    """(offset, n, tokens): rotation, experts used n = min(E, T·k) and active tokens T (all int32[])."""
    e, k = config.routed_experts, config.top_k
    tokens = token_mask.sum(dtype=jnp.int32)
    n = jnp.minimum(jnp.int32(e), tokens * k)
    offset = rng.uniform_index(rng.mix(*words, Salt.ROUTE_BALANCED_OFFSET), e)
    return offset, n, tokens


def _balanced_picks(words: tuple, token_mask: jax.Array, config: RoutingConfig) -> jax.Array:
    """int32[T, k]: row ρ = (rank of the token among active ones)·k + j goes to expert offset + ρ mod n."""
    offset, n, _ = _balanced_layout(words, token_mask, config)
    order = jnp.cumsum(token_mask, dtype=jnp.int32) - 1
    row = order[:, None] * config.top_k + jnp.arange(config.top_k, dtype=jnp.int32)
    return (offset + row % jnp.maximum(n, 1)) % config.routed_experts


def token_experts(words: tuple, iteration, token_mask: jax.Array, knobs: RoutingKnobs,
                  config: RoutingConfig) -> jax.Array:
    """int32[T, k]: the routed experts each token picks (distinct within a row); −1 for masked tokens.

    ``words`` identify the (stream, layer), ``iteration`` the serving iteration (int32[]),
    ``token_mask`` (bool[max_tokens]) the active tokens.
    """
    sampler = config.resolved_sampler
    if sampler == "balanced":
        picks = _balanced_picks(words, token_mask, config)
    elif sampler == "floyd":
        picks = _floyd(_token_hash(words, iteration, Salt.ROUTE_FLOYD), config.routed_experts, config.top_k,
                       config.max_tokens)
    elif sampler == "successive":
        picks = _successive(words, iteration, knobs, config)
    else:
        picks = _top_k_picks(words, iteration, knobs, config)
    return jnp.where(token_mask[:, None], picks, -1)


def _routing(rows: jax.Array, tokens: jax.Array, config: RoutingConfig) -> Routing:
    needed = rows > 0
    shared = tokens if config.shared_experts else jnp.int32(0)
    return Routing(needed=needed, rows=rows, distinct_experts=needed.sum(dtype=jnp.int32), shared_rows=shared)


def balanced_rows(words: tuple, token_mask: jax.Array, config: RoutingConfig) -> jax.Array:
    """int32[E]: rows of balanced routing in closed form: the first T·k mod n of the n rotated experts
    get ⌊T·k / n⌋ + 1 rows, the others of the n get ⌊T·k / n⌋, the rest none."""
    offset, n, tokens = _balanced_layout(words, token_mask, config)
    total, n_safe = tokens * config.top_k, jnp.maximum(n, 1)
    position = (jnp.arange(config.routed_experts, dtype=jnp.int32) - offset) % config.routed_experts
    return jnp.where(position < n, total // n_safe + (position < total % n_safe), 0).astype(jnp.int32)


def route(words: tuple, iteration, token_mask: jax.Array, knobs: RoutingKnobs, config: RoutingConfig) -> Routing:
    """One MoE layer's routing for one iteration: needed experts, rows per expert, distinct count.

    ``words`` identify the (stream, layer) (e.g. ``(seed, stream, layer)``), ``iteration`` is an
    int32[] and ``token_mask`` a bool[max_tokens] of active tokens, so one compilation serves every
    batch size. Shared experts are not in ``needed``/``rows``: each of the
    ``config.shared_experts`` gets ``shared_rows`` rows, so a layer with active tokens runs
    ``distinct_experts + shared_experts`` experts on ``rows.sum() + shared_experts · shared_rows`` rows.
    """
    tokens = token_mask.sum(dtype=jnp.int32)
    if config.kind == "balanced":
        return _routing(balanced_rows(words, token_mask, config), tokens, config)
    picks = token_experts(words, iteration, token_mask, knobs, config)
    weight = jnp.broadcast_to(token_mask[:, None], picks.shape).astype(jnp.int32)
    rows = counting.bincount(jnp.maximum(picks, 0), weight, config.routed_experts)
    return _routing(rows, tokens, config)


def route_layers(words: tuple, iteration, layers: jax.Array, token_mask: jax.Array, knobs: RoutingKnobs,
                 config: RoutingConfig) -> Routing:
    """Routing of every MoE layer in ``layers`` (int32[L] layer ids) for one iteration: each field
    gains a leading [L] axis. ``words`` identify the stream (e.g. ``(seed, stream)``); layer ℓ routes
    with words ``(*words, ℓ)``."""
    return jax.vmap(lambda layer: route((*words, layer), iteration, token_mask, knobs, config))(layers)


class RoutingInputs(NamedTuple):
    """One iteration to route, the same for every stream: active tokens, iteration and layer ids."""

    token_mask: jax.Array  # bool[max_tokens]
    iteration: jax.Array  # int32[]
    layers: jax.Array  # int32[L] MoE layer ids


def simulate(stream_id: jax.Array, seed: jax.Array, knobs: RoutingKnobs, inputs: RoutingInputs,
             config: RoutingConfig) -> Routing:
    """The one-stream protocol of ``hbfjax.batch``: every layer of ``inputs`` routed for one stream;
    fields have a leading [L] axis."""
    return route_layers((seed, stream_id), inputs.iteration, inputs.layers, inputs.token_mask, knobs, config)


def active_mask(active_tokens, config: RoutingConfig) -> jax.Array:
    """bool[max_tokens]: the first ``active_tokens`` tokens active (a traced count is fine)."""
    return jnp.arange(config.max_tokens, dtype=jnp.int32) < active_tokens


# --- analytic: uniform routing (DESIGN.md §8 rung 2) -------------------------------------------------


def expected_distinct_experts(experts, top_k, tokens):
    """E·(1 − (1 − k/E)^T): the mean number of distinct experts T tokens need under uniform top-k
    (each expert is missed by a token with probability 1 − k/E, independently across tokens).

    Plain arithmetic, so Python numbers, NumPy and (traced) JAX arrays all work."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def distinct_experts_pmf(experts: int, top_k: int, tokens: int, exact: bool = False, all_tokens: bool = False):
    """P(D = d) for d = 0 … E: the exact law of the distinct experts T tokens need under uniform top-k.

    A DP over tokens: with d experts already needed, a token's k picks contain m new ones with the
    hypergeometric probability C(E−d, m)·C(d, k−m) / C(E, k). float64 NumPy array (with ``all_tokens``
    float64[T + 1, E + 1], the law after every token count 0 … T), or a list of ``Fraction`` with
    ``exact`` (small cases)."""
    owner = "distinct_experts_pmf"
    e = require_int(owner, "experts", experts, 1, MAX_EXPERTS)
    k = require_int(owner, "top_k", top_k, 1, e)
    t = require_int(owner, "tokens", tokens, 0)
    if exact:
        total = math.comb(e, k)
        hyper = [[Fraction(math.comb(e - d, m) * math.comb(d, k - m), total) for m in range(k + 1)]
                 for d in range(e + 1)]
        law = [Fraction(1)] + [Fraction(0)] * e
        for _ in range(t):
            new = [Fraction(0)] * (e + 1)
            for d, p in enumerate(law):
                if p:
                    for m in range(min(k, e - d) + 1):
                        new[d + m] += p * hyper[d][m]
            law = new
        return law
    # float64[E+1, k+1] in log space (C(E, k) overflows a float for large k); each row is a law, and
    # normalising it keeps lgamma's rounding (~1e-13) from leaking probability mass token after token
    log_fact = np.array([math.lgamma(n + 1) for n in range(e + 1)])
    d, m = np.arange(e + 1)[:, None], np.arange(k + 1)[None, :]
    possible = (m <= e - d) & (k - m <= d)

    def log_comb(n, r):
        n, r = np.where(possible, n, 0), np.where(possible, r, 0)
        return log_fact[n] - log_fact[r] - log_fact[n - r]

    hyper = np.where(possible, np.exp(log_comb(e - d, m) + log_comb(d, k - m) - log_comb(e, k)), 0.0)
    hyper /= hyper.sum(axis=1, keepdims=True)
    law = np.zeros(e + 1)
    law[0] = 1.0
    laws = [law]
    for _ in range(t):
        new = np.zeros(e + 1)
        for fresh in range(k + 1):  # a token adding ``fresh`` new experts
            new[fresh:] += law[:e + 1 - fresh] * hyper[:e + 1 - fresh, fresh]
        law = new
        laws.append(law)
    return np.stack(laws) if all_tokens else law


@functools.cache
def _distinct_cdf_table(experts: int, top_k: int, max_tokens: int) -> np.ndarray:
    """float32[max_tokens + 1, E + 1]: row T is the CDF of the distinct experts T tokens need."""
    cdf = np.cumsum(distinct_experts_pmf(experts, top_k, max_tokens, all_tokens=True), axis=1)
    cdf[:, -1] = 1.0
    return cdf.astype(np.float32)


def distinct_count_draws(words: tuple, iteration, layers: jax.Array, tokens, config: RoutingConfig) -> jax.Array:
    """int32[L]: for each layer in ``layers``, an exact draw of the number of distinct routed experts that
    ``tokens`` (int32[], ≤ max_tokens) uniform top-k tokens need: the inverse CDF of
    :func:`distinct_experts_pmf` at one hashed uniform per (words, iteration, layer). Layers and
    iterations draw independently, as token-by-token routing does; which experts, and how the rows
    split between them, is not drawn (see :func:`count_routing`). Cost O(E) per layer, whatever T."""
    require(config.kind == "uniform", "distinct_count_draws", "kind", config.kind, "the law is uniform top-k's")
    table = jnp.asarray(_distinct_cdf_table(config.routed_experts, config.top_k, config.max_tokens))
    cdf = table[jnp.clip(jnp.asarray(tokens, jnp.int32), 0, config.max_tokens)]  # f32[E + 1]
    u = rng.uniform01(rng.mix(*words, iteration, jnp.asarray(layers), Salt.ROUTE_COUNT))  # f32[L]
    d = jnp.searchsorted(cdf, u, side="right").astype(jnp.int32)  # entries <= u: the first CDF entry above u
    return jnp.minimum(d, config.routed_experts)


def count_routing(distinct: jax.Array, tokens, config: RoutingConfig) -> Routing:
    """A ``Routing`` (fields [L, ...]) with ``distinct`` needed experts (the first ones) sharing the T·k
    rows as evenly as possible: exact in what a roofline uses (distinct experts, total rows), not in
    which experts or in the per-expert split."""
    t = jnp.asarray(tokens, jnp.int32)
    d = jnp.maximum(jnp.asarray(distinct, jnp.int32), 1)[..., None]
    e = jnp.arange(config.routed_experts, dtype=jnp.int32)
    total = t * config.top_k
    rows = jnp.where(e < distinct[..., None], total // d + (e < total % d), 0).astype(jnp.int32)
    needed = rows > 0
    shared = jnp.broadcast_to(t if config.shared_experts else jnp.int32(0), distinct.shape)
    return Routing(needed=needed, rows=rows, distinct_experts=needed.sum(axis=-1, dtype=jnp.int32), shared_rows=shared)
