"""Counter-based random numbers: a stateless integer hash of (seed, stream, request, layer, page, ...).

JAX's threefry generator costs more per draw than the work it feeds in the bulk placement loops
(DESIGN.md §3), so bulk draws hash their coordinates instead: cheap, reproducible, and identical on
any device layout. ``mix`` is MurmurHash3's 32-bit finaliser applied to a running combination of
words; its uniformity is tested in ``tests/test_stats_rng.py``. All arithmetic is uint32 (wraps mod 2^32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_GOLDEN = 0x9E3779B9


def fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3 fmix32 avalanche on uint32 values (elementwise)."""
    h = jnp.asarray(h, jnp.uint32)
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def mix(*words) -> jax.Array:
    """Hash of a tuple of integer words (broadcast elementwise) to uint32.

    Each word is folded in as ``h = fmix32(h ^ (word * golden + h_rotated))``, so that permuted
    tuples hash differently. Words may be Python ints, int32 or uint32 arrays.
    """
    h = jnp.uint32(0x12345678)
    for w in words:
        w = jnp.asarray(w).astype(jnp.uint32)
        h = fmix32(h ^ (w * jnp.uint32(_GOLDEN) + ((h << 6) | (h >> 26))))
    return h


def uniform01(h: jax.Array) -> jax.Array:
    """float32 in [0, 1) from a uint32 hash (top 24 bits, exact in float32)."""
    return (h >> 8).astype(jnp.float32) * jnp.float32(1.0 / (1 << 24))


def uniform_index(h: jax.Array, n) -> jax.Array:
    """int32 uniform on {0, …, n−1} from a uint32 hash; n may be traced (n ≤ 2^24).

    Bias is at most one part in 2^24 / n (under 2e-4 for n = 3,072 planes).
    """
    n = jnp.asarray(n)
    idx = jnp.floor(uniform01(h) * n.astype(jnp.float32)).astype(jnp.int32)
    return jnp.minimum(idx, n.astype(jnp.int32) - 1)


def open01(h: jax.Array) -> jax.Array:
    """float32 in (0, 1] from a uint32 hash (1 − :func:`uniform01`, exact): safe under a logarithm."""
    return 1.0 - uniform01(h)


def exponential(h: jax.Array) -> jax.Array:
    """Standard exponential variate (mean 1) from a uint32 hash by the inverse CDF (≤ 16.6 from 24 bits)."""
    return -jnp.log1p(-uniform01(h))


def normal(h_radius: jax.Array, h_angle: jax.Array) -> jax.Array:
    """Standard normal variate from two uint32 hashes (Box–Muller; |z| ≤ 5.8 from 24-bit uniforms)."""
    return jnp.sqrt(2.0 * exponential(h_radius)) * jnp.cos(2.0 * jnp.pi * uniform01(h_angle))


def below(h: jax.Array, n: jax.Array) -> jax.Array:
    """uint32 ⌊h·n / 2^32⌋: uniform on {0, …, n−1} from a uint32 hash h, every value within 2^-32 of
    probability 1/n (a 32-bit multiply-high in 16-bit halves; :func:`uniform_index` keeps 24 bits)."""
    h = jnp.asarray(h, jnp.uint32)
    n = jnp.asarray(n, jnp.uint32)
    h1, h0 = h >> 16, h & 0xFFFF
    n1, n0 = n >> 16, n & 0xFFFF
    cross_a, cross_b = h1 * n0, h0 * n1
    carry = ((h0 * n0) >> 16) + (cross_a & 0xFFFF) + (cross_b & 0xFFFF)
    return h1 * n1 + (cross_a >> 16) + (cross_b >> 16) + (carry >> 16)


def seed_word(seed: int) -> jax.Array:
    """A user seed (any Python int) as the uint32 first word of every hash."""
    return jnp.uint32(seed % (1 << 32))
