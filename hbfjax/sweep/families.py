"""Run a family of serving systems (``hbfjax.serve.systems.Family``) as one batched call and report each
system: the driver every front door uses (``hbfjax serve``, the figures, the benchmarks)."""

from __future__ import annotations

from hbfjax import batch
from hbfjax.serve.systems import Family


def run_outputs(family: Family, streams: int, seed: int, *, chunk_streams: int | None = None,
                progress: bool = False, split: bool = False, pad_to: int | None = None) -> list:
    """Each system's batched outputs (leading stream axis), in ``family.names`` order: every point of the
    family in one compiled call on one knob axis (common random numbers), or with ``split`` one call
    per point (each a knob axis of one: the same compilation). A vmapped rollout runs until its slowest
    lane stops, so points of very different iteration counts waste a CPU when stacked; on an
    accelerator the lanes run in parallel and one stacked axis is faster. ``pad_to``: the calls'
    inputs padded to that many points' worth of tabulated laws (``Family.inputs_for``; default the
    family's size), so that families of different sizes share one compilation."""
    groups = [[k] for k in range(len(family.points))] if split else [list(range(len(family.points)))]
    outs = []
    for group in groups:
        points = [family.points[k] for k in group]
        if pad_to is None and len(group) == len(family.points):
            inputs = family.inputs
        else:
            inputs = family.inputs_for(points, pad_to or len(family.points))
        out = batch.run(family.simulate, streams, seed, batch.stack_knobs(points), family.config, knob_axis=True,
                        inputs=inputs, chunk_streams=chunk_streams, progress=progress)
        outs += [batch.point_outputs(out, k) for k in range(len(group))]
    return outs


def run_family(family: Family, streams: int, seed: int, *, chunk_streams: int | None = None,
               progress: bool = False) -> dict:
    """``{system name: its report}`` of every system of ``family`` (one compiled call)."""
    outs = run_outputs(family, streams, seed, chunk_streams=chunk_streams, progress=progress)
    return {name: family.report(o, k) for k, (name, o) in enumerate(zip(family.names, outs))}
