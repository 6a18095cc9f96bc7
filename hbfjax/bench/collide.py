"""Page placements per second: S streams × one 12 MiB read (3,072 pages) on 3,072 planes (HBFlex §3.1).

The reference does the random-placement work the plain NumPy way: per stream, draw the planes and
``np.bincount``. The first row does exactly that work; the others add hot-plane offload (a histogram
of plane loads per stream) or plane-group striping, for scale.
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
    cases = [("random", False, 0.0), ("random", True, 0.1), ("plane-group", False, 0.0)]
    for placement, offload, fraction in cases:
        config = collide.ReadConfig(planes=PLANES, max_pages=PAGES, placement=placement, offload=offload)
        knobs = collide.ReadKnobs(jnp.int32(PAGES), collide.placement_knobs(group_size=32, pages_per_logical=4,
                                                                             offload_fraction=fraction))
        fn = batch.compiled(collide.simulate_read)
        ids = batch.stream_ids(0, streams)
        compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), knobs, config))
        label = f"collide {placement}{' +offload' if offload else ''} {streams}x{PAGES}p/{PLANES}"
        rows.append(row(label, streams * PAGES, "page placements",
                        compile_s, run_s, ref_s, streams=streams))
    return rows
