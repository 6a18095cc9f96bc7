"""Page placements per second: S streams × one 12 MiB read (3,072 pages) on 3,072 planes, random placement.

The reference does the same work the plain NumPy way: per stream, draw the planes and ``np.bincount``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.flash import collide

PLANES = PAGES = 3072


def _reference(streams: int, rng: np.random.Generator) -> None:
    for _ in range(streams):
        np.bincount(rng.integers(0, PLANES, PAGES), minlength=PLANES).max()


def run(scale: float) -> list[dict]:
    rows = []
    streams = max(64, int(4096 * scale))
    ref_streams = max(16, streams // 16)
    gen = np.random.default_rng(0)
    ref_s = time_reference(lambda: _reference(ref_streams, gen)) / (ref_streams * PAGES)
    for placement in ("random", "plane-group"):
        config = collide.ReadConfig(planes=PLANES, max_pages=PAGES, placement=placement)
        knobs = collide.ReadKnobs(jnp.int32(PAGES), collide.placement_knobs(group_size=32, pages_per_logical=4))
        fn = batch.compiled(collide.simulate_read)
        ids = batch.stream_ids(0, streams)
        compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), knobs, config))
        rows.append(row(f"collide {placement} {streams}x{PAGES}p/{PLANES}", streams * PAGES, "page placements",
                        compile_s, run_s, ref_s, streams=streams))
    return rows
