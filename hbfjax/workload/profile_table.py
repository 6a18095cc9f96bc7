"""Measured GPU operator latencies: the CSV that ``hbfjax profile`` writes, and log-log interpolation
within each operator shape's measured range (DASH §VI-A "Simulation": measured latencies for profiled
shapes, interpolation only within validated per-operator ranges).

**Schema** (:data:`FIELDS`, one row per measurement): ``device`` (``jax.devices()[0].device_kind``),
``jax_version``, ``model`` (the preset the shape came from, informational), ``op`` (a
:data:`hbfjax.workload.timing.OPS` name, ``lm_head``, or ``norm``), ``name`` (the Linear's name),
the shape — ``in_features``, ``out_features`` for GEMMs and norms (hidden × hidden); ``heads``,
``kv_heads``, ``qk_dim``, ``v_dim`` for attention — ``dtype`` (weight or compute precision), ``tokens``
(GEMM rows; decode tokens of the batch; the chunk's tokens), ``context`` (KV tokens each decode token
attends to, itself included; the chunk's prefix + its tokens; 0 for GEMMs), ``us`` (median measured
µs per call) and ``repeats``.

**Curves.** Rows with the same shape key form one curve of µs against a size x: tokens for GEMMs
and norms, total context tokens (tokens × context) for decode attention, causal pairs n·p + n(n+1)/2
for a prefill chunk of n tokens after p prefix tokens — the same sizes :mod:`hbfjax.workload.timing`
computes for a batch. Interpolation is linear in (log x, log µs) between measured points, exact at
them, and refused outside [smallest, largest] measured x. :meth:`ProfileTable.curves` packs all
curves into a :class:`Curves` pytree of padded arrays for use inside ``jit`` (:func:`curve_us`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.validate import ConfigError
from hbfjax.workload import gpus

FIELDS = ("device", "jax_version", "model", "op", "name", "in_features", "out_features", "heads", "kv_heads",
          "qk_dim", "v_dim", "dtype", "tokens", "context", "us", "repeats")
INT_FIELDS = ("in_features", "out_features", "heads", "kv_heads", "qk_dim", "v_dim", "tokens", "context", "repeats")
ATTENTION_OPS = ("attention_decode", "attention_prefill")


class ProfileRangeError(ConfigError):
    """A size outside an operator shape's measured range, or a shape the table has no curve for."""


# --- shape keys shared by the profiler and the timing ---------------------------------------------

def dtype_name(bytes_per_param: float) -> str:
    """Name of a weight width: its compute precision (``gpus.compute_precision``: fp32, bf16, fp8) for
    1 B and wider; int4 for 0.5 B; else ``w<bytes>B`` (timed dequantised to bf16)."""
    if bytes_per_param >= 1:
        return gpus.compute_precision(bytes_per_param)
    return "int4" if bytes_per_param == 0.5 else f"w{bytes_per_param:g}B"


def linear_key(lin) -> tuple:
    """Curve key of one weight matmul (a models.Linear): (op, in, out, weight dtype)."""
    return ("linear", lin.op, int(lin.in_features), int(lin.out_features), dtype_name(lin.bytes_per_param))


def norm_key(model, activation_bytes: int) -> tuple:
    """Curve key of one RMSNorm over the model's hidden size."""
    return ("norm", "norm", int(model.hidden), int(model.hidden), dtype_name(activation_bytes))


def attention_geometry(model, phase: str) -> tuple[int, int, int, int]:
    """(query heads, KV heads, QK dim, V dim) of the attention kernel of ``phase`` for a ModelSpec,
    in the form ``attention_flops_per_pair`` counts: GQA (and DeepSeek-V4's compressed attention) as
    grouped heads; MLA absorbed in decode (one latent KV head of kv_lora + rope dims, values in the
    latent) and expanded in prefill (every head its own K and V)."""
    if model.attention == "mla":
        if phase == "decode":
            return int(model.heads), 1, int(model.kv_lora_rank + model.qk_rope_head_dim), int(model.kv_lora_rank)
        return (int(model.heads), int(model.heads), int(model.qk_nope_head_dim + model.qk_rope_head_dim),
                int(model.v_head_dim))
    return int(model.heads), int(model.kv_heads), int(model.head_dim), int(model.head_dim)


def attention_key(model, phase: str, precision: str) -> tuple:
    return (f"attention_{phase}",) + attention_geometry(model, phase) + (precision,)


def row_key(row: dict) -> tuple:
    """The curve key of one CSV row (see :func:`linear_key`, :func:`norm_key`, :func:`attention_key`)."""
    op = row["op"]
    if op in ATTENTION_OPS:
        return (op, row["heads"], row["kv_heads"], row["qk_dim"], row["v_dim"], row["dtype"])
    if op == "norm":
        return ("norm", "norm", row["in_features"], row["out_features"], row["dtype"])
    return ("linear", op, row["in_features"], row["out_features"], row["dtype"])


def row_size(row: dict) -> float:
    """The size x a row's time is measured at (see the module docstring)."""
    n = row["tokens"]
    if row["op"] == "attention_decode":
        return float(n * row["context"])
    if row["op"] == "attention_prefill":
        p = row["context"] - n
        return float(n * p + n * (n + 1) / 2)
    return float(n)


# --- CSV -----------------------------------------------------------------------------------------

def write_csv(rows: list[dict], path) -> None:
    """Write measurement rows (dicts with every :data:`FIELDS` key) to ``path`` (temp file + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in FIELDS})
    tmp.replace(path)


def _bad(path, line: int, message: str):
    raise ConfigError(f"profile table {path}:{line}: {message}")


def _parse_row(raw: dict, path, line: int) -> dict:
    row = dict(raw)
    for name in INT_FIELDS:
        try:
            row[name] = int(raw[name])
        except (TypeError, ValueError):
            _bad(path, line, f"{name} = {raw[name]!r}: must be an integer")
        if row[name] < 0:
            _bad(path, line, f"{name} = {row[name]}: must be >= 0")
    try:
        row["us"] = float(raw["us"])
    except (TypeError, ValueError):
        _bad(path, line, f"us = {raw['us']!r}: must be a number")
    if not (math.isfinite(row["us"]) and row["us"] > 0):
        _bad(path, line, f"us = {raw['us']!r}: must be finite and > 0")
    if row["tokens"] < 1:
        _bad(path, line, f"tokens = {row['tokens']}: must be >= 1")
    if row["op"] in ATTENTION_OPS and row["context"] < (row["tokens"] if row["op"] == "attention_prefill" else 1):
        _bad(path, line, f"context = {row['context']}: must cover the chunk's own tokens (>= tokens) in prefill, "
                         ">= 1 in decode")
    return row


@dataclass(frozen=True)
class ProfileTable:
    """Measurements of one device: rows grouped into curves by shape key."""

    device: str
    jax_version: str
    rows: tuple[dict, ...]

    @classmethod
    def read(cls, path) -> "ProfileTable":
        """Read and validate a CSV written by ``hbfjax profile`` (one device per table)."""
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [f for f in FIELDS if f not in (reader.fieldnames or ())]
            if missing:
                raise ConfigError(f"profile table {path}: columns {missing} missing (expected {list(FIELDS)})")
            rows = tuple(_parse_row(raw, path, i + 2) for i, raw in enumerate(reader))
        return cls.from_rows(rows, str(path))

    @classmethod
    def from_rows(cls, rows, where: str = "rows") -> "ProfileTable":
        rows = tuple(rows)
        if not rows:
            raise ConfigError(f"profile table {where}: no measurements")
        devices = sorted({r["device"] for r in rows})
        if len(devices) > 1:
            raise ConfigError(f"profile table {where}: device = {devices}: one table holds one device's measurements")
        return cls(devices[0], rows[0]["jax_version"], rows)

    def points(self) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """Per shape key: (sizes x float64[n], median µs float64[n]), x increasing and distinct."""
        grouped: dict[tuple, dict[float, list[float]]] = {}
        for row in self.rows:
            grouped.setdefault(row_key(row), {}).setdefault(row_size(row), []).append(row["us"])
        out = {}
        for key, by_x in grouped.items():
            xs = np.array(sorted(by_x), np.float64)
            out[key] = (xs, np.array([np.median(by_x[x]) for x in xs], np.float64))
        return out

    def interpolate_us(self, key: tuple, x: float) -> float:
        """Host-side µs of shape ``key`` at size ``x``: log-log linear between measured points;
        :class:`ProfileRangeError` outside the measured range or for an unmeasured shape."""
        points = self.points()
        if key not in points:
            raise ProfileRangeError(f"profile table ({self.device}): no curve for {key}")
        xs, us = points[key]
        if not xs[0] <= x <= xs[-1]:
            raise ProfileRangeError(f"profile table ({self.device}): {key} at size {x:g} is outside the measured "
                                    f"range [{xs[0]:g}, {xs[-1]:g}]")
        return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(us))))

    def curves(self) -> "Curves":
        """All curves as padded arrays for :func:`curve_us` inside ``jit``."""
        points = self.points()
        keys = tuple(sorted(points, key=repr))
        width = max(2, max(len(points[k][0]) for k in keys))
        log_x = np.zeros((len(keys), width), np.float32)
        log_us = np.zeros((len(keys), width), np.float32)
        for i, key in enumerate(keys):
            xs, us = points[key]
            pad = width - len(xs)  # repeat the last point: a zero-width step jnp.interp never divides by
            log_x[i] = np.log(np.concatenate([xs, np.repeat(xs[-1:], pad)]))
            log_us[i] = np.log(np.concatenate([us, np.repeat(us[-1:], pad)]))
        lo = np.array([points[k][0][0] for k in keys], np.float32)
        hi = np.array([points[k][0][-1] for k in keys], np.float32)
        return Curves(jnp.asarray(log_x), jnp.asarray(log_us), jnp.asarray(lo), jnp.asarray(hi), keys=keys,
                      device=self.device)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Curves:
    """Measured curves as arrays (inputs of the timing; the keys are static)."""

    log_x: jax.Array  # float32[K, P] log sizes, increasing, padded with the last point
    log_us: jax.Array  # float32[K, P] log µs
    lo_x: jax.Array  # float32[K] smallest measured size
    hi_x: jax.Array  # float32[K] largest measured size
    keys: tuple = field(default=(), metadata=dict(static=True))  # the shape key of each curve
    device: str = field(default="", metadata=dict(static=True))

    def index(self, key: tuple) -> int | None:
        """Row of the curve of ``key``, or None."""
        return self.keys.index(key) if key in self.keys else None


def curve_us(curves: Curves, index: int, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(µs float32[...], inside bool[...]) of curve ``index`` at sizes ``x``: log-log interpolation,
    ``inside`` False where x lies outside the measured range (the µs there is the nearest end's)."""
    x = jnp.asarray(x, jnp.float32)
    inside = (x >= curves.lo_x[index]) & (x <= curves.hi_x[index])
    log_x = jnp.log(jnp.maximum(x, jnp.float32(1e-30)))
    return jnp.exp(jnp.interp(log_x, curves.log_x[index], curves.log_us[index])), inside
