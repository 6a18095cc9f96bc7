"""Page placements per second: S streams × one 12 MiB read (3,072 pages) on 3,072 planes (HBFlex §3.1).

The reference does the random-placement work the plain NumPy way: per stream, draw the planes and
``np.bincount``. The first row does exactly that work; the others add hot-plane offload (a histogram
of plane loads per stream) or plane-group striping, for scale. On a CPU the streams go through the
compiled function 256 at a time inside one ``lax.map`` (their plane counters then stay in cache,
about 2× faster than one vmap over all streams); on a GPU all at once.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.flash.reads import collide
from hbfjax.flash.reads.reference import random_read_waves

PLANES = PAGES = 3072
CPU_CHUNK_STREAMS = 256  # streams per lax.map step on a CPU


def run(scale: float) -> list[dict]:
    rows = []
    streams = max(64, int(4096 * scale))
    map_streams = batch.cpu_map_streams(CPU_CHUNK_STREAMS)
    ref_streams = max(16, streams // 16)
    gen = np.random.default_rng(0)
    cases = [("random", False, 0.0), ("random", True, 0.1), ("plane-group", False, 0.0)]
    for placement, offload, fraction in cases:
        config = collide.ReadConfig(planes=PLANES, max_pages=PAGES, placement=placement, offload=offload)
        knobs = collide.ReadKnobs(jnp.int32(PAGES), collide.PlacementKnobs.make(group_size=32, pages_per_logical=4,
                                                                             offload_fraction=fraction))
        fn = batch.compiled(collide.simulate, map_streams=map_streams)
        ids = batch.stream_ids(0, streams, map_streams or 1)
        compile_s, run_s = time_compiled(lambda: fn(ids, jnp.uint32(1), knobs, None, config))
        # the reference is timed right after, under the same machine load
        ref_s = time_reference(lambda: random_read_waves(PAGES, PLANES, ref_streams, gen)) / (ref_streams * PAGES)
        label = f"collide {placement}{' +offload' if offload else ''} {streams}x{PAGES}p/{PLANES}"
        rows.append(row(label, ids.shape[0] * PAGES, "page placements", compile_s, run_s, ref_s,
                        streams=int(ids.shape[0]), map_streams=map_streams))
    return rows
