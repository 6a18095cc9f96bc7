"""Gradient estimators of a problem's objective in raw knob coordinates (DESIGN.md §6).

Each returns ``(value, gradient)`` at raw coordinates ``u`` and spends a known number of simulator
evaluations (one evaluation = the objective at one knob point over all the problem's streams, on the
problem's common random numbers). ``F(u)`` below is the exact objective at the knobs ``u`` decodes to,
with discrete knobs rounded to their lattice.

* ``exact`` — ``jax.grad`` of ``F`` itself (1 evaluation). Plane maxima, thresholds and roundings are
  piecewise constant, so this gradient is usually identically zero: the loop detects it and says so.
* ``smooth`` — the pathwise gradient of the *relaxed* objective (``hbfjax.relax`` at the step's
  temperature). Bias: the relaxation's (each problem states it; it vanishes as the temperature falls);
  variance: that of the sample mean over streams, small. Discrete knobs are interpolated linearly
  between their two neighbouring lattice points (2 evaluations per discrete knob corner, 2^d in all):
  the gradient in that coordinate is the lattice difference, exact for the sampled objective.
  Reverse mode (``jax.grad``) where the rollout is a scan, forward mode (``jax.linearize`` + one JVP
  per raw coordinate) where it is a ``while_loop``.
* ``perturb`` — ``optax.perturbations.make_perturbed_fun`` with Gaussian noise of scale σ (raw units):
  an unbiased estimate of the gradient of the smoothed ``F_σ(u) = E F(u + σZ)``, whose bias against
  ``∇F`` is O(σ²) where F is smooth; variance O(Var F / (σ² · samples)) with the baseline
  (``samples + 1`` evaluations). Works on discrete knobs (F rounds them) and needs no relaxation.
* ``fd`` — central differences on common random numbers, one raw coordinate at a time (2 per
  coordinate + 1 for the value). Bias O(h²) where F is smooth; on CRN the difference's variance
  is that of the per-stream differences, far below independent runs. Discrete knobs step one lattice
  point each way (one-sided at a bound).
* ``spsa`` — simultaneous perturbation: both evaluations at ``u ± h·Δ`` with Rademacher ``Δ`` (2
  evaluations whatever the dimension); unbiased to O(h²) for smooth F, variance grows with the dimension.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import jax
import jax.flatten_util
import jax.numpy as jnp
import optax
import optax.perturbations

from hbfjax.tune.problem import Problem
from hbfjax.relax import Relax, ste_round
from hbfjax.validate import require_choice, require_int, require_real

ESTIMATORS = ("smooth", "perturb", "fd", "spsa", "exact")


@dataclass(frozen=True)
class EstimatorSettings:
    """Static settings of an estimator (hashable; part of the compiled loop's key)."""

    name: str = "smooth"
    samples: int = 4  # perturb: perturbed evaluations per step

    def __post_init__(self):
        require_choice("EstimatorSettings", "name", self.name, ESTIMATORS)
        require_int("EstimatorSettings", "samples", self.samples, 1, 4096)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class EstimatorKnobs:
    """Traced settings (changing them never recompiles)."""

    temperature: jax.Array  # f32[] smooth: the relaxation's temperature this step
    sigma: jax.Array  # f32[] perturb: Gaussian scale in raw units
    fd_step: jax.Array  # f32[] fd / spsa: half-width in raw units for continuous knobs
    key: jax.Array  # PRNG key of this step's perturbations (perturb, spsa)

    @classmethod
    def make(cls, temperature=1.0, sigma=0.3, fd_step=0.25, key=None) -> "EstimatorKnobs":
        for name, v in (("temperature", temperature), ("sigma", sigma), ("fd_step", fd_step)):
            require_real(cls.__name__, name, v, 0.0, lo_open=True)
        return cls(jnp.float32(temperature), jnp.float32(sigma), jnp.float32(fd_step),
                   jax.random.key(0) if key is None else key)


def _discrete(problem: Problem) -> tuple[str, ...]:
    return tuple(k.name for k in problem.knobs if k.domain.discrete)


def raw_size(problem: Problem) -> int:
    return sum(k.domain.size for k in problem.knobs)


def evaluations_per_step(problem: Problem, settings: EstimatorSettings) -> int:
    """Simulator evaluations one step of ``settings.name`` spends on ``problem``."""
    return {"exact": 1, "smooth": 2 ** len(_discrete(problem)), "perturb": settings.samples + 1,
            "fd": 2 * raw_size(problem) + 1, "spsa": 2}[settings.name]


def exact(problem: Problem, seed: jax.Array, raw: dict) -> jax.Array:
    """F(u): the exact objective, discrete knobs rounded (straight-through, so ``exact`` grads reach the simulation)."""
    snapped = {k.name: ste_round(raw[k.name]) if k.domain.discrete else raw[k.name] for k in problem.knobs}
    return problem.objective(problem.decode(problem.project(snapped)), seed, None)


def relaxed(problem: Problem, seed: jax.Array, raw: dict, temperature: jax.Array) -> jax.Array:
    """The relaxed objective, multilinear between the lattice points around the discrete knobs."""
    relax = Relax(temperature)
    raw = problem.project(raw)
    names = _discrete(problem)
    if not names:
        return problem.objective(problem.decode(raw), seed, relax)
    base, weight = {}, {}
    for k in problem.knobs:
        if k.domain.discrete:
            a, b = k.domain.raw_bounds
            lo = jnp.clip(jnp.floor(raw[k.name]), a, max(a, b - 1))
            base[k.name], weight[k.name] = lo, jnp.clip(raw[k.name] - lo, 0.0, 1.0)
    total = jnp.float32(0.0)
    for corner in itertools.product((0, 1), repeat=len(names)):
        point, w = dict(raw), jnp.float32(1.0)
        for name, c in zip(names, corner):
            point[name] = jax.lax.stop_gradient(base[name]) + c
            w = w * (weight[name] if c else 1.0 - weight[name])
        total = total + w * problem.objective(problem.decode(point), seed, relax)
    return total


def _forward_value_and_grad(f, raw: dict):
    """Value and gradient by forward mode: one linearisation, one JVP per raw coordinate (while_loop rollouts)."""
    value, jvp = jax.linearize(f, raw)
    flat, unravel = jax.flatten_util.ravel_pytree(raw)
    basis = jnp.eye(flat.size, dtype=flat.dtype)
    grads = jax.vmap(lambda e: jvp(unravel(e)))(basis)
    return value, unravel(grads)


def _value_and_grad(problem: Problem, f, raw: dict):
    return jax.value_and_grad(f)(raw) if problem.reverse_mode else _forward_value_and_grad(f, raw)


def _raw_steps(problem: Problem, fd_step: jax.Array) -> dict:
    """Half-width of a difference in each raw coordinate: one lattice step for discrete knobs."""
    return {k.name: jnp.full((k.domain.size,) if k.domain.size > 1 else (), 1.0 if k.domain.discrete else fd_step,
                             jnp.float32) for k in problem.knobs}


def _central_difference(problem, seed, raw, direction: dict, step: dict):
    """(F(u + s·d) − F(u − s·d)) / (distance actually travelled), after projection into the domains."""
    plus = problem.project(jax.tree_util.tree_map(lambda u, d, s: u + s * d, raw, direction, step))
    minus = problem.project(jax.tree_util.tree_map(lambda u, d, s: u - s * d, raw, direction, step))
    travel = jax.tree_util.tree_map(lambda p, m, d: jnp.sum((p - m) * d), plus, minus, direction)
    dist = sum(jax.tree_util.tree_leaves(travel))
    return (exact(problem, seed, plus) - exact(problem, seed, minus)) / jnp.maximum(dist, 1e-6)


def _fd(problem, seed, raw, ek):
    step = _raw_steps(problem, ek.fd_step)
    flat, unravel = jax.flatten_util.ravel_pytree(raw)
    rows = [_central_difference(problem, seed, raw, unravel(jnp.zeros_like(flat).at[i].set(1.0)), step)
            for i in range(flat.size)]
    return exact(problem, seed, raw), unravel(jnp.stack(rows))


def _spsa(problem, seed, raw, ek):
    step = _raw_steps(problem, ek.fd_step)
    flat, unravel = jax.flatten_util.ravel_pytree(raw)
    delta = jax.random.rademacher(ek.key, flat.shape, dtype=jnp.float32)
    s = jax.flatten_util.ravel_pytree(step)[0]
    plus = problem.project(unravel(flat + s * delta))
    minus = problem.project(unravel(flat - s * delta))
    f_plus, f_minus = exact(problem, seed, plus), exact(problem, seed, minus)
    travel = jax.flatten_util.ravel_pytree(plus)[0] - jax.flatten_util.ravel_pytree(minus)[0]
    # per coordinate: the difference over that coordinate's signed travel (zero where the bound stopped it)
    grad = jnp.where(travel != 0, (f_plus - f_minus) / jnp.where(travel != 0, travel, 1.0), 0.0)
    return 0.5 * (f_plus + f_minus), unravel(grad)


def _perturb(problem, seed, raw, ek, samples: int):
    fun = optax.perturbations.make_perturbed_fun(lambda u: exact(problem, seed, u), num_samples=samples,
                                                 sigma=ek.sigma, noise=optax.perturbations.Normal())
    return jax.value_and_grad(fun, argnums=1)(ek.key, raw)


def value_and_grad(problem: Problem, settings: EstimatorSettings, seed: jax.Array, raw: dict, ek: EstimatorKnobs):
    """``(value f32[], gradient like raw)`` of the objective at ``raw`` by ``settings.name`` (see module doc)."""
    name = settings.name
    if name == "exact":
        return _value_and_grad(problem, lambda u: exact(problem, seed, u), raw)
    if name == "smooth":
        return _value_and_grad(problem, lambda u: relaxed(problem, seed, u, ek.temperature), raw)
    if name == "perturb":
        return _perturb(problem, seed, raw, ek, settings.samples)
    if name == "fd":
        return _fd(problem, seed, raw, ek)
    return _spsa(problem, seed, raw, ek)
