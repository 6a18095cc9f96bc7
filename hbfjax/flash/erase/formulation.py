"""Array primitives of the GC simulation, each in a CPU and a GPU formulation with identical results.

XLA's CPU and GPU backends favour different programs for the same result (DESIGN.md §3, "GPU
habits"): on a CPU, elementwise passes and scatters; on a GPU, few kernels per scan step. Which
formulation is traced is a static config field (``BlockConfig.formulation``: ``"auto" | "cpu" |
"gpu"``), so the choice is part of jit's cache key; ``"auto"`` follows the backend
(``cpu_form``). One machine can trace both; the tests check that both give the same results bit
for bit.

- ``smallest``: the g best GC victims (g tree-minimum passes on a CPU; one ``lax.top_k`` elsewhere).
- ``duplicates``: last/first copy of each logical page in a chunk (in-map scatters on a CPU;
  n² compares elsewhere).
- ``after_read``: orders an in-place scatter after an earlier read, so XLA does not copy the array.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NAMES = ("auto", "cpu", "gpu")
INT_MAX = int(jnp.iinfo(jnp.int32).max)


def after_read(x: jax.Array, read: jax.Array) -> jax.Array:
    """``x`` unchanged, made data-dependent on ``read`` (values read from an array, all > INT32_MIN).

    An in-place scatter into an array that was read before must wait for the read; when the
    scatter's values do not depend on that read, XLA (jax 0.10) copies the whole array instead of
    ordering the two. Feeding the read into the values orders them: no copy.
    """
    return jnp.where(read == jnp.iinfo(jnp.int32).min, 0, x)


def cpu_form(name: str) -> bool:
    """True when formulation ``name`` (one of NAMES) means the CPU forms: ``"auto"`` follows the
    default backend (fixed for a process, so every trace of one config agrees)."""
    return jax.default_backend() == "cpu" if name == "auto" else name == "cpu"


def _tree_min(x: jax.Array) -> jax.Array:
    """Minimum over the last axis as a halving tree of elementwise ``jnp.minimum`` (XLA CPU
    vectorises these; its integer min/argmin *reductions* run several times slower)."""
    n = x.shape[-1]
    while n > 1:
        h = n // 2
        lo = jnp.minimum(x[..., :h], x[..., h:2 * h])
        x = jnp.concatenate([lo, x[..., 2 * h:]], axis=-1) if n % 2 else lo
        n = x.shape[-1]
    return x[..., 0]


def smallest(score: jax.Array, g: int, max_score: int | None = None, *, cpu: bool) -> tuple[jax.Array, jax.Array]:
    """(indices, values) of the g smallest entries of int32 ``score``, ascending, ties by index.

    Entries equal to INT_MAX (not candidates) come back as index 0, value INT_MAX. With
    ``max_score`` (every entry is in [0, max_score] or INT_MAX, e.g. greedy valid counts) the
    search runs on the packed key score·B + index, unique and ordered as (score, index).
    With ``cpu`` (static): exactly g masked minimum passes of elementwise ops and tree minima, no scatter —
    deliberately not ``lax.top_k``/sort: on XLA CPU (jax 0.10) anything that depends on a sort's
    output made the following batched scatters ~20× slower. Elsewhere: one ``lax.top_k`` (one
    kernel instead of g passes, each a launch inside the chunk loop). Both give the same result.
    """
    b = score.shape[-1]
    if max_score is not None and (max_score + 2) * b <= INT_MAX:
        iota = jnp.arange(b, dtype=jnp.int32)
        top = (max_score + 1) * b  # INT_MAX entries pack as max_score + 1 (after every real score)
        key = jnp.where(score == INT_MAX, top, score * b) + iota
        mins = _smallest_keys_top_k(key, g, top + b) if not cpu else _smallest_keys_passes(key, g)
        real = mins < top
        return jnp.where(real, mins % b, 0), jnp.where(real, mins // b, INT_MAX)
    if cpu:
        return _smallest_passes(score, g)
    val, idx = _top_k_smallest(score, g)
    return jnp.where(val == INT_MAX, 0, idx).astype(jnp.int32), val


def _top_k_smallest(x: jax.Array, g: int) -> tuple[jax.Array, jax.Array]:
    """(values, indices) of the g smallest entries of ``x`` (no INT32_MIN), ascending: one ``lax.top_k``
    of −x (ties: lower index first, lax.top_k's contract)."""
    neg, idx = jax.lax.top_k(-x, g)
    return -neg, idx


def _smallest_passes(score: jax.Array, g: int) -> tuple[jax.Array, jax.Array]:
    """``smallest`` of an unpacked score as g masked argmin passes (value minimum, then index minimum)."""
    b = score.shape[-1]
    iota = jnp.arange(b, dtype=jnp.int32)

    def body(sc, _):
        m = _tree_min(sc)
        i = _tree_min(jnp.where(sc == m, iota, b))
        i = jnp.where(i == b, 0, i)  # unreachable (m is an entry), kept for argmin's index range
        return jnp.where(iota == i, INT_MAX, sc), (i, m)

    _, (idx, val) = jax.lax.scan(body, score, None, length=g)
    return idx, val


def _smallest_keys_passes(key: jax.Array, g: int) -> jax.Array:
    """int32[g] the g smallest of the distinct keys ``key`` int32[B], ascending: g tree-minimum passes."""
    def body(k, _):
        m = _tree_min(k)
        return jnp.where(k == m, INT_MAX, k), m

    _, mins = jax.lax.scan(body, key, None, length=g)
    return mins


def _smallest_keys_top_k(key: jax.Array, g: int, key_bound: int) -> jax.Array:
    """int32[g] the g smallest of the distinct keys ``key`` int32[B] in [0, key_bound), ascending: one top_k.

    Keys below 2^24 are exact in float32, whose top_k has a dedicated XLA GPU kernel for g ≤ 16
    (an integer top_k is lowered as a sort); larger keys stay int32.
    """
    exact_f32 = key_bound <= 2**24
    mins, _ = _top_k_smallest(key.astype(jnp.float32) if exact_f32 else key, g)
    return mins.astype(jnp.int32)


def last_and_first(lp: jax.Array) -> tuple[jax.Array, jax.Array]:
    """bool[n] masks: entry is the last / first occurrence of its value within the batch.

    All-pairs comparison (n² booleans, n = chunk): on XLA CPU a sort here made every scatter fed
    by its result far slower than this (see ``smallest``). On a CPU ``duplicates`` uses the O(n)
    form ``last_and_first_in``, which gives the same masks; on a GPU this one.
    """
    n = lp.shape[0]
    same = lp[:, None] == lp[None, :]
    i = jnp.arange(n)
    later = same & (i[None, :] > i[:, None])
    earlier = same & (i[None, :] < i[:, None])
    return ~later.any(axis=1), ~earlier.any(axis=1)


def last_and_first_in(lp: jax.Array, l2p: jax.Array):
    """``last_and_first(lp)`` with O(n) scatters, borrowing the map ``l2p`` (values ≥ −1) as scratch.

    A scatter-min of −2 − i over the entries of each value leaves −2 − (its last index) there
    (all < −1, below every map value); a scatter-max of n − 1 − i (≥ 0) then leaves n − 1 − (its
    first index). The touched entries are put back (every duplicate writes the same old value), so
    the returned map equals ``l2p``: the same masks, bit for bit, without the n² comparisons that
    dominated a chunk on a CPU. Each scatter's values depend on the read before it (``after_read``), so
    the map is updated in place, never copied.
    Values of ``lp`` must lie in [0, len(l2p)). Returns (last, first, old = l2p[lp], l2p).
    """
    n = lp.shape[0]
    i = jnp.arange(n, dtype=jnp.int32)
    old = l2p[lp]
    tag_last, tag_first = -2 - i, n - 1 - i
    scratch = l2p.at[lp].min(after_read(tag_last, old))  # every touched entry now holds a tag_last, all < −1
    got = scratch[lp]
    scratch = scratch.at[lp].max(after_read(tag_first, got))  # tag_first ≥ 0 beats them: n − 1 − (first index)
    got_first = scratch[lp]
    return got == tag_last, got_first == tag_first, old, scratch.at[lp].set(after_read(old, got_first))


def duplicates(lp: jax.Array, l2p: jax.Array, *, cpu: bool):
    """(last, first, old = l2p[lp], l2p) for a chunk ``lp`` of logical pages: ``last_and_first_in`` on
    a CPU, ``last_and_first`` elsewhere (the n² compares of one chunk are cheap next to three
    scatters into the map on a GPU). The returned map equals ``l2p``."""
    if cpu:
        return last_and_first_in(lp, l2p)
    last, first = last_and_first(lp)
    return last, first, l2p[lp], l2p
