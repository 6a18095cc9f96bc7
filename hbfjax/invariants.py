"""Invariants every printed result and every sweep row satisfies: ``commands._common.emit`` refuses to print
a result that breaks one, ``hbfjax.sweep`` records it as a failed row.

A broken invariant means a run measured something meaningless (an int32 count that wrapped, a float
that overflowed, a ratio over zero samples): the CLI reports it as a ``ConfigError`` naming the
result field, its value and the rule, exit status 2, and prints nothing. The rules:

* every number is finite and >= 0 (no output of ``collide``, ``gc`` or ``writeback`` is signed; a
  ``tune`` objective and its gap to the grid are, ``SIGNED``); ``None`` only where a key documents it
  (``NULLABLE``: a value the run could not measure), NaN only for a run's TPOT and decode rate when none of
  its requests decodes (``NO_DECODE``, printed as null);
* fractions and probabilities lie in [0, 1];
* ``mean_waves >= ideal_waves`` and ``amplification >= 1`` (waves are never fewer than a perfectly
  balanced read of the same plane pages);
* ``waf >= 1``, measured from at least one host write (``host_writes >= 1``), and a serving run's
  ``read_wave_amplification >= 1``; a serving run that wrote no page or read no HBF KV reports them as
  None (not measured), never as a number;
* the rules that relate fields apply to the result and to each system of a multi-system result.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from hbfjax.validate import ConfigError

# a serving run none of whose measured requests decodes (one output token each) has no TPOT and no decode
# rate: the metrics compute them as NaN (0 / 0), which only these keys may carry, printed as null
NO_DECODE = frozenset({f"{c}{p}tpot_ms" for c in ("", "ci95_") for p in ("", "p50_", "p90_", "p99_")}
                      | {"decode_tokens_per_s", "ci95_decode_tokens_per_s"})
# keys that may be None: the exact backlog when λ >= w (no stationary law), no trace file, a trace of one
# instant (no rate) or without block hashes (trace-info)
NULLABLE = frozenset({"exact_mean_backlog_pages", "exact_p_backlog_positive", "trace", "arrival_rate_per_s",
                      "prefix_reusable_block_fraction"}
                     # serving (hbfjax.serve.report): not measured by a run that wrote no page, read no HBF KV,
                     # or admitted no prompt token
                     | {f"{p}{k}" for p in ("", "ci95_") for k in ("waf", "read_wave_amplification",
                                                                    "prefix_hit_tokens_fraction",
                                                                    # a run whose GC erased no KV block / wrote none
                                                                    "kv_block_reads_mean_at_erase",
                                                                    "kv_reclaim_waf_added")}
                     # a closed loop whose KV room did not turn over in every stream, or has none (CPU systems)
                     | {"kv_room_turnover_s"}
                     | NO_DECODE
                     # hbfjax disturb: a run that erased no block bounds no lifetime (lifetime_note says why)
                     | {f"{c}{k}" for c in ("", "ci95_") for k in ("lifetime_years", "worst_block_lifetime_years")})
# tune: an objective to minimise may be a negated throughput, and a tuned point off the grid may beat it
SIGNED = frozenset({"objective", "grid_best_objective", "gap"})
FRACTIONS = frozenset({"hot_plane_fraction", "offload_fraction", "p_backlog_positive", "exact_p_backlog_positive",
                       "buffer_overflow_fraction", "effective_spare_factor",
                       "u_utilization", "prefix_reusable_block_fraction", "kv_read_stall_fraction",
                       "prefix_hit_tokens_fraction", "slo_attainment"})


def _fail(key: str, value, rule: str):
    raise ConfigError(f"result.{key} = {value!r}: {rule}; the run's output is not meaningful, so nothing is "
                      "printed (an input outside what the model covers)")


def _numbers(result: dict, prefix: str = ""):
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _numbers(value, f"{name}.")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield f"{name}[{i}]", v
        else:
            yield name, value


def check_result(result: dict) -> None:
    """Raise ``ConfigError`` naming the first field of ``result`` that breaks an invariant."""
    for name, value in _numbers(result):
        leaf = name.rsplit(".", 1)[-1]
        if value is None or (leaf in NO_DECODE and isinstance(value, float) and math.isnan(value)):  # not measured
            if leaf not in NULLABLE:
                _fail(name, value, "must be a number")
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        v = float(value)
        if not math.isfinite(v):
            _fail(name, value, "must be finite")
        if v < 0 and leaf not in SIGNED:
            _fail(name, value, "must be >= 0 (a count, time, size or ratio)")
        if leaf in FRACTIONS and v > 1:
            _fail(name, value, "a fraction must lie in [0, 1]")
    _check_relations(result, "")
    for i, row in enumerate(result.get("systems") or ()):
        if isinstance(row, dict):
            _check_relations(row, f"systems[{i}].")


def _check_relations(result: dict, prefix: str) -> None:
    """The rules of the module docstring that relate fields of one result (``prefix``: where it sits)."""
    get = result.get
    if get("mean_waves") is not None and get("ideal_waves") is not None and get("mean_waves") < get("ideal_waves"):
        _fail(prefix + "mean_waves", get("mean_waves"), f"must be >= ideal_waves = {get('ideal_waves')}")
    for key in ("amplification", "read_wave_amplification"):
        if get(key) is not None and get(key) < 1:
            _fail(prefix + key, get(key), "must be >= 1")
    if get("waf") is not None:
        if not (get("host_writes") or 0) >= 1:
            _fail(prefix + "waf", get("waf"), f"needs at least one measured host write (host_writes = "
                                              f"{get('host_writes')})")
        if get("waf") < 1:
            _fail(prefix + "waf", get("waf"), "must be >= 1")


def jsonable(value, nonfinite_as_none: bool = True):
    """``value`` with NumPy scalars and arrays as Python numbers and lists; non-finite floats as None
    (JSON has no inf or NaN) unless ``nonfinite_as_none`` is False (for the invariant checks)."""
    if isinstance(value, dict):
        return {k: jsonable(v, nonfinite_as_none) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, nonfinite_as_none) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), nonfinite_as_none)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) or not nonfinite_as_none else None
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def checked(result: dict) -> dict:
    """``result`` as JSON-able values once it satisfies every output invariant
    (``_invariants.check_result``; a ``ConfigError`` if not)."""
    check_result(jsonable(result, nonfinite_as_none=False))
    return jsonable(result)
