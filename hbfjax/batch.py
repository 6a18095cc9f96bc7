"""The batch layer: vmap a one-stream simulation over streams × knob points, shard streams over devices.

Model code is written for one stream (mctx style), one protocol for every mechanism (DESIGN.md §3):
``simulate(stream_id, seed, knobs, inputs, config) -> outputs`` where ``stream_id`` is an int32
scalar, ``seed`` a uint32 scalar, ``knobs`` a pytree of arrays (what a user sweeps or tunes),
``inputs`` a pytree of the data the run consumes (a trace's requests; ``None`` when there are none;
shared by every stream and knob point, never swept) and ``config`` a hashable static dataclass.
Outputs are a typed NamedTuple. This module vmaps it once at the top:

* over streams (the leading axis of every output, sharded over all of this process's devices), and
* optionally over knob points (a leading axis on every knob leaf; the second axis of the outputs),
  with common random numbers: a stream's draws depend only on (seed, stream_id, ...), never on the
  knob point, so knob points are compared on identical randomness.

One ``jax.jit`` wraps the whole batched call; ``config`` is static, ``seed`` and knobs are traced, so
changing a knob value, an input's values or the seed never recompiles (tested with
``jax.log_compiles`` in the mechanism tests). Each stream's
result is independent of how many devices share the batch (padding streams are computed and dropped).
"""

from __future__ import annotations

import functools
import math
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hbfjax import rng
from hbfjax.validate import SEED_MAX, ConfigError, require_int

StreamFn = Callable[[jax.Array, jax.Array, Any, Any, Any], Any]


@functools.cache
def _batched(fn: StreamFn, knob_axis: bool, map_streams: int | None):
    per_stream = fn
    if knob_axis:
        per_stream = jax.vmap(fn, in_axes=(None, None, 0, None, None))  # knob points, shared stream draws
    over_streams = jax.vmap(per_stream, in_axes=(0, None, None, None, None))
    if not map_streams:
        return jax.jit(over_streams, static_argnums=4)

    def mapped(ids, seed, knobs, inputs, config):
        chunks = ids.reshape(-1, map_streams)
        out = jax.lax.map(lambda chunk: over_streams(chunk, seed, knobs, inputs, config), chunks)
        return jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), out)

    return jax.jit(mapped, static_argnums=4)


def compiled(fn: StreamFn, knob_axis: bool = False, map_streams: int | None = None):
    """The jitted batched function for ``fn``: ``(stream_ids[S], seed, knobs, inputs, config) -> outputs[S, ...]``.

    With ``map_streams`` the streams are vmapped ``map_streams`` at a time inside one ``lax.map``
    (S must then be a multiple of it): on a CPU this keeps each chunk's working arrays in cache
    (2× faster for plane counting), on a GPU leave it ``None`` so all streams run at once.
    """
    return _batched(fn, knob_axis, map_streams)


def stream_mesh() -> Mesh:
    """A 1-D mesh named ``streams`` over this process's devices (in a ``jax.distributed`` job each process
    simulates its own work on its own devices: ``hbfjax.cluster``)."""
    return Mesh(np.array(jax.local_devices()), ("streams",))


def stream_ids(first: int, count: int, multiple: int = 1) -> jax.Array:
    """int32 stream ids ``first … first+count−1``, padded to a multiple of this process's device count
    (and of ``multiple``) and sharded over those devices."""
    n_dev = jax.local_device_count()
    step = n_dev * multiple // math.gcd(n_dev, multiple)
    padded = -(-count // step) * step
    ids = np.arange(first, first + padded, dtype=np.int32)
    if n_dev == 1:
        return jnp.asarray(ids)
    return jax.device_put(ids, NamedSharding(stream_mesh(), PartitionSpec("streams")))


def run(fn: StreamFn, n_streams: int, seed: int, knobs, config, *, inputs=None, knob_axis: bool = False,
        chunk_streams: int | None = None, map_streams: int | None = None, progress: bool = False) -> Any:
    """Simulate ``n_streams`` streams and return the outputs as NumPy arrays with a leading stream axis.

    ``inputs`` (a pytree, or None) is what ``fn`` consumes, the same for every stream and knob point.
    ``chunk_streams`` bounds device memory: streams are simulated in chunks of that size (the last
    chunk is padded so every chunk has the same shape and one compilation serves all). With
    ``progress`` a line per chunk goes to stderr. ``map_streams``: see :func:`compiled`.
    """
    if n_streams < 1:
        raise ConfigError(f"n_streams = {n_streams}: need at least one stream")
    chunk = n_streams if chunk_streams is None else max(1, min(chunk_streams, n_streams))
    map_streams = min(map_streams, chunk) if map_streams else None
    batched = compiled(fn, knob_axis, map_streams)
    # a uint32 hash word: 2^32 would alias seed 0, so it is refused rather than wrapped
    seed_u32 = rng.seed_word(require_int("batch.run", "seed", seed, 0, SEED_MAX))
    pieces = []
    t0 = time.perf_counter()
    for first in range(0, n_streams, chunk):
        out = batched(stream_ids(first, chunk, map_streams or 1), seed_u32, knobs, inputs, config)
        take = min(chunk, n_streams - first)
        pieces.append(jax.tree_util.tree_map(lambda a, take=take: np.asarray(a)[:take], out))
        if progress:
            done = first + take
            print(f"  streams {done}/{n_streams}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr,
                  flush=True)
    if len(pieces) == 1:
        return pieces[0]
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *pieces)


def cpu_map_streams(streams_per_chunk: int = 256) -> int | None:
    """A ``map_streams`` for the current backend: ``streams_per_chunk`` on a CPU, ``None`` elsewhere."""
    return streams_per_chunk if jax.devices()[0].platform == "cpu" else None


def stack_knobs(points: list) -> Any:
    """Stack a list of knob pytrees into one pytree with a leading knob-point axis."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *points)


def point_outputs(out, k: int, several: bool = True):
    """Knob point ``k``'s outputs from a run with (``several``) or without a knob axis (the knob axis is
    the second axis of every output, after the streams)."""
    return jax.tree_util.tree_map(lambda a: a[:, k], out) if several else out


def over_streams(fn: StreamFn, streams: int):
    """``fn`` vmapped over stream ids ``0 … streams − 1``, un-jitted: ``(seed, knobs, inputs, config) ->
    outputs[S, ...]``, for callers that trace it inside their own jitted function (a tuning loop's
    objective). Same streams, same draws as :func:`run`."""
    ids = jnp.arange(streams, dtype=jnp.int32)
    per_stream = jax.vmap(fn, in_axes=(0, None, None, None, None))
    return lambda seed, knobs, inputs, config: per_stream(ids, seed, knobs, inputs, config)


def when_due(due: Callable[[Any], jax.Array], body: Callable[[Any], Any], x: Any) -> Any:
    """``body(x)`` if ``due(x)`` (a bool[] of one stream), else ``x`` — skipped, not only masked, when no
    stream of a vmapped batch is due: a ``while_loop`` run at most once (under ``vmap`` a ``cond`` becomes a
    select and runs ``body`` for every stream; a batched ``while_loop`` runs it while any stream is due,
    keeping the others' ``x``). For an expensive step that few calls need (a sweep of a store's pages)."""
    out, _ = jax.lax.while_loop(lambda c: ~c[1] & due(c[0]), lambda c: (body(c[0]), jnp.bool_(True)),
                                (x, jnp.bool_(False)))
    return out
