"""Read-disturb / refresh throughput (``hbfjax.flash.disturb.reclaim``): simulated block-steps per second,
many streams at once.

GPU scale (scale 1): 4,096 streams × 8 planes × 128 blocks (1,000 holding data), 512 steps of Poisson
reads at 2 × 10^5 page reads per second against a 10^4-read threshold with least-worn destinations and a
one-hour refresh, so blocks relocate and refresh throughout. An event is one physical block in one step
(what a step touches). The reference is ``hbfjax.flash.disturb.reference.step``: the same mechanism as
plain NumPy/Python loops over blocks, one stream, fed Poisson reads at the same mean rate (NumPy's
generator), timed over 16 steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import batch
from hbfjax.bench._timing import row, time_compiled, time_reference
from hbfjax.flash.disturb import reclaim as rc
from hbfjax.flash.disturb import reference as ref

PLANES, BLOCKS_PER_PLANE, DATA_BLOCKS = 8, 128, 1000
STEP_S, THRESHOLD, READS_PER_S, REFRESH_HOURS = 60.0, 10_000, 2e5, 1.0


def _config(steps: int) -> rc.DisturbConfig:
    return rc.DisturbConfig(planes=PLANES, blocks_per_plane=BLOCKS_PER_PLANE, data_blocks=DATA_BLOCKS, step_s=STEP_S,
                            steps=steps, start="fresh")


def _knobs(config: rc.DisturbConfig) -> rc.DisturbKnobs:
    return rc.DisturbKnobs.make(config, threshold_reads=THRESHOLD, refresh_hours=REFRESH_HOURS,
                                destination="least-worn", reads_per_s=READS_PER_S)


def _reference_s_per_event(config: rc.DisturbConfig, knobs: rc.DisturbKnobs, steps: int = 16) -> float:
    """Seconds per block-step of the NumPy reference over ``steps`` steps of reads at the mean rate."""
    reads = np.random.default_rng(0).poisson(READS_PER_S * STEP_S / DATA_BLOCKS, (steps, DATA_BLOCKS))

    def run():
        st = ref.init_state(config, knobs)
        for s in range(steps):
            st = ref.step(st, reads[s], knobs, config)
        return st

    return time_reference(run) / (steps * config.physical_blocks)


def run(scale: float) -> list[dict]:
    streams = max(16, int(4096 * scale))
    steps = max(64, int(512 * scale))
    config = _config(steps)
    knobs = _knobs(config)
    fn = batch.compiled(rc.simulate)
    ids = jnp.arange(streams, dtype=jnp.int32)
    compile_s, run_s = time_compiled(lambda: fn(ids, np.uint32(0), knobs, None, config), repeats=2)
    out = jax.block_until_ready(fn(ids, np.uint32(0), knobs, None, config))
    events = float(streams * steps * config.physical_blocks)
    return [row(f"disturb {streams}x{PLANES}x{BLOCKS_PER_PLANE} blocks", events, "block-steps", compile_s, run_s,
                _reference_s_per_event(config, knobs), streams=streams, steps=steps,
                relocations=float(np.sum(np.asarray(out.relocations))),
                refreshes=float(np.sum(np.asarray(out.refreshes))), scale=scale)]
