"""A tuning problem: named knobs in their domains, an objective to minimise, and the grid that checks it (DESIGN.md §6).

The optimiser works on unconstrained *raw* coordinates; each knob's :class:`Domain` maps them into
the knob's range (optax works on the raw pytree, the simulation sees knob values):

* :class:`Fraction` — ``lo + (hi − lo) · sigmoid(u)`` (an offload fraction, a split share, a threshold);
* :class:`Log2Size` — ``2 ** clip(u, log2 lo, log2 hi)`` (a plane-group size; ``discrete`` knobs take
  only the powers of two, at integer u);
* :class:`Split` — ``floor + (1 − parts · floor) · softmax(u)`` (shares of one budget that sum to 1).

A problem's ``objective(values, seed, relax)`` is pure JAX: ``values`` maps each knob name to an
f32 array (``[]``, or ``[parts]`` for a split), ``seed`` is the uint32 seed word of every stream's
draws (common random numbers: the draws never depend on the values), ``relax`` is ``None`` for the
exact simulation or a :class:`hbfjax.relax.Relax`. It returns the f32[] objective averaged over
the problem's streams. It must vmap over ``values`` (the grid evaluates every point in one call).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax.validate import ConfigError, require, require_int, require_real


@dataclass(frozen=True)
class Fraction:
    """A value in [lo, hi] as ``lo + (hi − lo) · sigmoid(u)``."""

    lo: float = 0.0
    hi: float = 1.0
    size = 1
    discrete = False

    def __post_init__(self):
        require_real("Fraction", "lo", self.lo)
        require_real("Fraction", "hi", self.hi)
        require(self.hi > self.lo, "Fraction", "hi", self.hi, f"must be > lo = {self.lo}")

    def decode(self, u):
        return self.lo + (self.hi - self.lo) * jax.nn.sigmoid(u)

    def encode(self, value) -> np.ndarray:
        s = np.clip((np.asarray(value, np.float64) - self.lo) / (self.hi - self.lo), 1e-4, 1 - 1e-4)
        return np.log(s / (1 - s)).astype(np.float32)

    def project(self, u):
        return u


@dataclass(frozen=True)
class Log2Size:
    """A size in [lo, hi] as ``2 ** clip(u, log2 lo, log2 hi)``; ``discrete``: only powers of two (integer u)."""

    lo: int
    hi: int
    discrete: bool = True
    size = 1

    def __post_init__(self):
        require_int("Log2Size", "lo", self.lo, 1)
        require_int("Log2Size", "hi", self.hi, self.lo)
        for name in ("lo", "hi"):
            v = getattr(self, name)
            require(not self.discrete or v & (v - 1) == 0, "Log2Size", name, v, "must be a power of two")

    @property
    def raw_bounds(self) -> tuple[float, float]:
        return math.log2(self.lo), math.log2(self.hi)

    def decode(self, u):
        a, b = self.raw_bounds
        return jnp.exp2(jnp.clip(u, a, b))

    def encode(self, value) -> np.ndarray:
        a, b = self.raw_bounds
        return np.clip(np.log2(np.asarray(value, np.float64)), a, b).astype(np.float32)

    def project(self, u):
        a, b = self.raw_bounds
        return jnp.clip(u, a, b)


@dataclass(frozen=True)
class Split:
    """``parts`` shares of one budget summing to 1, each at least ``floor``: ``floor + (1 − parts·floor) · softmax(u)``."""

    parts: int
    floor: float = 0.0
    discrete = False

    def __post_init__(self):
        require_int("Split", "parts", self.parts, 2)
        require_real("Split", "floor", self.floor, 0.0, 1.0 / self.parts, hi_open=True)

    @property
    def size(self) -> int:
        return self.parts

    def decode(self, u):
        return self.floor + (1.0 - self.parts * self.floor) * jax.nn.softmax(u, axis=-1)

    def encode(self, value) -> np.ndarray:
        v = np.asarray(value, np.float64)
        require(v.shape == (self.parts,) and abs(v.sum() - 1) < 1e-6, "Split", "value", value,
                f"must be {self.parts} shares summing to 1")
        s = np.clip((v - self.floor) / (1.0 - self.parts * self.floor), 1e-4, None)
        return np.log(s / s.sum()).astype(np.float32)

    def project(self, u):
        return u  # softmax is shift-invariant: no constraint on the raw logits


Domain = Fraction | Log2Size | Split


@dataclass(frozen=True)
class Knob:
    """One tuned knob: its name (with unit), its domain, the exhaustive grid's values and a help line."""

    name: str
    domain: Domain
    grid: tuple  # values in knob units (tuples of shares for a Split)
    help: str = ""

    def __post_init__(self):
        require(len(self.grid) >= 2, "Knob", "grid", self.grid, "needs at least two values")


@dataclass(frozen=True)
class TuneDefaults:
    """A problem's default run: its start, Adam's learning rate in raw units, the estimators' settings.

    Without ``steps`` the loop takes as many steps as a fifth of the grid's evaluations pays for with the
    chosen estimator (less the final lattice check), so every estimator spends the same budget."""

    init: dict  # knob name -> starting value (knob units)
    steps: int | None = None
    learning_rate: float = 0.2
    temperature_start: float = 1.0  # smooth estimator: temperature schedule, in the relaxed quantity's units
    temperature_end: float = 0.1
    sigma: float = 0.3  # perturb estimator: Gaussian perturbation scale in raw units
    samples: int = 4  # perturb estimator: perturbed evaluations per step
    fd_step: float = 0.25  # fd / spsa: half-width in raw units of continuous knobs (discrete knobs: one lattice step)


@dataclass(frozen=True, eq=False)
class Problem:
    """What ``hbfjax tune`` minimises. Hashed by identity: one compilation per problem object."""

    name: str
    knobs: tuple[Knob, ...]
    objective: Callable  # (values: dict[str, f32], seed: u32[], relax: Relax | None) -> f32[]
    objective_label: str  # what the objective is, with its unit (e.g. "read waves + λ · SRAM MB")
    defaults: TuneDefaults
    streams: int
    report: Callable | None = None  # (values, seed) -> dict[str, f32[]] exact metrics for tables and figures
    reverse_mode: bool = True  # False: the rollout is a while_loop; gradients by forward mode (jax.jvp)
    minimise: bool = True  # False: the figure shows −objective (a throughput)
    description: str = ""
    extra: dict = field(default_factory=dict)  # problem settings for provenance (λ, model, trace, …)

    def __post_init__(self):
        names = [k.name for k in self.knobs]
        require(len(set(names)) == len(names), "Problem", "knobs", names, "knob names must be unique")
        missing = set(names) - set(self.defaults.init)
        require(not missing, "Problem", "defaults.init", sorted(missing), "every knob needs a starting value")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise ConfigError(f"{self.name}: no knob {name!r} (knobs: {', '.join(self.names)})")

    # ---- raw <-> values -------------------------------------------------------------------------
    def encode(self, values: dict) -> dict:
        """Raw coordinates (f32 arrays) of knob values."""
        return {k.name: jnp.asarray(k.domain.encode(values[k.name])) for k in self.knobs}

    def decode(self, raw: dict) -> dict:
        return {k.name: k.domain.decode(raw[k.name]) for k in self.knobs}

    def project(self, raw: dict) -> dict:
        return {k.name: k.domain.project(raw[k.name]) for k in self.knobs}

    def snap(self, raw: dict) -> dict:
        """Discrete knobs moved to their nearest lattice point (integer raw), continuous ones kept."""
        return {k.name: jnp.round(raw[k.name]) if k.domain.discrete else raw[k.name] for k in self.knobs}

    # ---- the exhaustive grid --------------------------------------------------------------------
    def grid_points(self) -> list[dict]:
        """Every grid point as a dict of knob values (Cartesian product of the knobs' grids)."""
        return [dict(zip(self.names, combo)) for combo in itertools.product(*(k.grid for k in self.knobs))]

    def stack(self, points: list[dict]) -> dict:
        """Knob values of many points as f32 arrays with a leading point axis."""
        return {n: jnp.asarray(np.array([p[n] for p in points], np.float32)) for n in self.names}


def as_python(values: dict) -> dict:
    """Knob values as plain floats (lists for splits), for JSON."""
    out = {}
    for name, v in values.items():
        a = np.asarray(v, np.float64)
        out[name] = float(a) if a.ndim == 0 else [float(x) for x in a]
    return out
