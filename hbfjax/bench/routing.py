"""MoE routings per second: S streams × 58 MoE layers × an 8,192-token iteration (DeepSeek-V3-like:
256 routed experts, top-8, one shared expert; DASH §VI-E's 8,192-token iteration budget).

One event is one token's top-k in one layer. The reference does the same work the plain NumPy way,
one stream at a time, with the same algorithm as the row, vectorised over tokens: Floyd's algorithm,
successive sampling on the integer inverse CDF, ``argpartition`` of a dense [T, E] key matrix
(uniform keys u, zipf keys log(u)·rank^s), or the balanced closed form; then ``np.bincount`` of the
rows. The dense rows route fewer streams, since
their keys alone take T·E·4 bytes per layer.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.workload import routing

EXPERTS, TOP_K, SHARED, LAYERS, TOKENS = 256, 8, 1, 58, 8192
REF_LAYERS = 4  # layers per reference call


def _reference_picks(gen: np.random.Generator, sampler: str, skew: float) -> np.ndarray:
    """int[T, k]: one layer's picks by the plain NumPy form of ``sampler``."""
    if sampler == "floyd":
        picks = np.empty((TOKENS, TOP_K), np.int64)
        for j in range(TOP_K):
            top = EXPERTS - TOP_K + j
            pick = gen.integers(0, top + 1, TOKENS)
            taken = (picks[:, :j] == pick[:, None]).any(axis=1)
            picks[:, j] = np.where(taken, top, pick)
        return picks
    if sampler == "successive":
        p = np.arange(1, EXPERTS + 1) ** -skew
        weight = np.floor(p / p.sum() * 2**31).astype(np.int64) + 1
        start = np.cumsum(weight) - weight
        drawn = np.empty((TOKENS, 0), np.int64)
        for _ in range(TOP_K):
            x = gen.integers(0, weight.sum() - weight[drawn].sum(axis=1))
            for c in np.sort(drawn, axis=1).T:
                x = np.where(x >= start[c], x + weight[c], x)
            drawn = np.column_stack([drawn, np.searchsorted(start, x, side="right") - 1])
        return gen.permutation(EXPERTS)[drawn]
    keys = np.log(gen.random((TOKENS, EXPERTS))) * (gen.permutation(EXPERTS) + 1.0) ** skew
    return np.argpartition(-keys, TOP_K, axis=1)[:, :TOP_K]


def _reference_layers(gen: np.random.Generator, sampler: str, skew: float) -> np.ndarray:
    """int[REF_LAYERS, E]: rows per expert of REF_LAYERS layers."""
    out = np.empty((REF_LAYERS, EXPERTS), np.int64)
    for layer in range(REF_LAYERS):
        if sampler == "balanced":
            used = min(EXPERTS, TOKENS * TOP_K)
            position = (np.arange(EXPERTS) - gen.integers(EXPERTS)) % EXPERTS
            out[layer] = np.where(position < used, TOKENS * TOP_K // used + (position < TOKENS * TOP_K % used), 0)
        else:
            out[layer] = np.bincount(_reference_picks(gen, sampler, skew).ravel(), minlength=EXPERTS)
    return out


def run(scale: float) -> list[dict]:
    rows = []
    streams = max(4, int(64 * scale))
    gen = np.random.default_rng(0)
    cases = [("uniform", "floyd", 0.0, streams), ("uniform", "gumbel", 0.0, max(1, streams // 16)),
             ("zipf", "successive", 1.0, streams), ("zipf", "gumbel", 1.0, max(1, streams // 16)),
             ("balanced", "auto", 0.0, streams)]
    for kind, sampler, skew, n_streams in cases:
        config = routing.RoutingConfig(EXPERTS, TOP_K, SHARED, kind, TOKENS, sampler)
        inputs = routing.RoutingInputs(routing.active_mask(TOKENS, config), jnp.int32(0),
                                       jnp.arange(LAYERS, dtype=jnp.int32))
        knobs = routing.RoutingKnobs.make(skew)
        fn = batch.compiled(routing.simulate)
        ids = batch.stream_ids(0, n_streams)
        compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), knobs, inputs, config))
        ref_sampler = config.resolved_sampler
        ref_s = time_reference(lambda: _reference_layers(gen, ref_sampler, skew)) / (REF_LAYERS * TOKENS)
        label = f"routing {kind}{f' s={skew:g}' if kind == 'zipf' else ''} {ref_sampler} " \
                f"{ids.shape[0]}x{LAYERS}Lx{TOKENS}T E={EXPERTS} k={TOP_K}"
        rows.append(row(label, ids.shape[0] * LAYERS * TOKENS, "token-layer routings", compile_s, run_s, ref_s,
                        streams=int(ids.shape[0]), layers=LAYERS, tokens=TOKENS))
    return rows
