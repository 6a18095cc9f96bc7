"""Across-stream summaries of batched outputs (host NumPy): the batch layer's reporting side.

Physics returns per-stream arrays; these functions turn a batched run (a NamedTuple of NumPy arrays
with a leading stream axis) into means with 95 % confidence half-widths and derived ratios.
"""

from __future__ import annotations

import numpy as np

from hbfjax.stats import mean_ci95


def fields(out) -> dict:
    """A batched output as a dict of its fields (NamedTuple or dict)."""
    return out._asdict() if hasattr(out, "_asdict") else dict(out)


def mean_ci_fields(out, keys: tuple[str, ...]) -> dict:
    """``{key: mean, f"ci95_{key}": half-width}`` across streams; a field with more axes than the stream
    axis is first averaged within each stream."""
    got = fields(out)
    result = {}
    for key in keys:
        a = np.asarray(got[key], np.float64)
        mean, ci = mean_ci95(a.reshape(a.shape[0], -1).mean(axis=1))
        result[key] = float(mean)
        result[f"ci95_{key}"] = float(ci)
    return result


def gc_summary(out, physical_pages: int, valid_pages=None) -> dict:
    """Across-stream summary of a batched GC run (``OverwriteOutput`` or ``KvOutput``).

    WAF = (host + migrated page programs) / host page programs, per stream, then mean ± 95 % CI.
    The effective spare factor counts only pages in circulation: 1 − valid / (physical − mean free
    pool and open-block remainder); ``valid_pages`` defaults to the output ``mean_valid_pages``.
    """
    got = fields(out)
    host = np.asarray(got["host_writes"], np.float64)
    mig = np.asarray(got["migrated_pages"], np.float64)
    waf = (host + mig) / np.maximum(host, 1.0)
    waf_mean, waf_ci = mean_ci95(waf)
    valid = np.asarray(got["mean_valid_pages"] if valid_pages is None else valid_pages, np.float64)
    circ = physical_pages - np.asarray(got["mean_free_pages"], np.float64)
    eff = float(np.mean(1.0 - valid / circ))
    return {"waf": float(waf_mean), "ci95_waf": float(waf_ci), "host_writes": int(host.sum()),
            "migrated_pages": int(mig.sum()), "warmup_host_writes": int(np.sum(got["warmup_host_writes"])),
            "erases_per_block_mean": float(np.mean(got["erases_per_block_mean"])),
            "erases_per_block_max": int(np.max(got["erases_per_block_max"])),
            "erases_per_block_spread": float(np.mean(got["erases_per_block_spread"])),
            "gc_invocations": int(np.sum(got["gc_invocations"])), "effective_spare_factor": eff,
            "alpha_effective": 1.0 / (1.0 - eff), "overflow": bool(np.any(got["overflow"])),
            "overflow_streams": int(np.sum(got["overflow"])), "streams": int(host.shape[0])}
