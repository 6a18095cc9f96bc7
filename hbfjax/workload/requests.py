"""Request streams: the ``[R]`` requests one stream serves, sorted by arrival (DESIGN.md §5 "Requests").

One stream's requests are drawn by :func:`generate` ``(stream_id, seed, knobs, inputs, config)`` — the
batch protocol (``hbfjax.batch.run`` vmaps it over streams and knob points). Every draw comes from the
counter hash ``rng.mix(seed, stream, request, Salt.REQ_*, ...)``, so a stream's requests depend only on
its seed words, and knob points are compared on common random numbers. The static
:class:`RequestsConfig` picks the modes and ``R``; the traced :class:`RequestKnobs` carry the rates,
CV, batch size and length parameters (sweeping them never recompiles); :class:`TraceInputs` carry a
trace's arrays (replay, empirical lengths).

Arrivals (``RequestsConfig.arrivals``):

* ``batch``: a fixed batch — the first ``knobs.batch`` = B requests all at t = 0 (DASH §VI-A/B:
  B/L_in/L_out, e.g. 4/1K/128 with ``fixed`` lengths); the other R − B are padding.
* ``poisson``: exponential gaps at ``knobs.rate_per_s`` (DASH §VI-E "Poisson traces"); the first
  request arrives one gap after t = 0. Gaps are rounded to whole µs (the clock's resolution).
* ``gamma``: gamma gaps of mean 1/rate and coefficient of variation ``knobs.cv`` (shape 1/cv²; cv = 1
  is Poisson), drawn by Marsaglia–Tsang with ``gamma_tries`` tries and a masked fallback
  (:func:`standard_gamma`).
* ``trace``: replay of a trace (below).

Lengths (prompt and output separately, synthetic arrivals): ``fixed`` (``tokens``), ``uniform``
integers in [lo, hi], ``lognormal`` (median, sigma of the log), rounded and clamped to [1, 2^24], or
``empirical``: a trace's (prompt, output) pairs resampled uniformly, the pair kept together (so
both must be ``empirical``). Synthetic requests are session roots (no prefix reuse).

Trace replay (``RequestsConfig.replay``; the trace's sessions, parents, reusable prefixes and
lifetime labels are carried through, indices remapped to the stream's order):

* ``exact``: every stream replays the same first R requests of the trace.
* ``offset`` (**the default**): each stream starts the trace at a random phase u, uniform in
  [0, P) where P = duration × n/(n − 1) is the trace's period (its span plus one mean gap): the trace
  is rotated (requests before u wrap to after the end, shifted by P), so arrivals stay sorted and
  every request, length pair, session and burst of the trace is kept; streams differ only in phase.
  A request whose parent wrapped behind it starts a new session there (its parent's KV is not in
  this stream, so its reusable prefix is 0). It is the default because it keeps everything the
  trace measured — ``exact`` gives every stream identical arrivals, so a confidence interval across
  streams would miss arrival randomness; ``bootstrap`` keeps sessions but replaces the trace's
  session-start pattern (bursts, rate drift) by a Poisson process.
* ``bootstrap``: sessions resampled with replacement (uniformly over the trace's sessions), each
  keeping its turns' internal gaps, lengths and prefixes; session starts are a Poisson process at
  the trace's session rate (sessions / P). ``bootstrap_sessions`` = M sessions are drawn (default
  R, which always yields R valid requests); requests at or after the start of the first undrawn
  session are marked invalid (one it would have held could precede them).

In every replay ``knobs.rate_factor`` divides the trace's time axis (arrivals, gaps and session
rate): "scale" is not a separate mode but this knob, combinable with each mode. At 1 the trace's
times are reproduced exactly (rounded to whole µs); otherwise the scaled gaps are rounded to 1/16 µs
and summed exactly on the two-part clock. It does not change how many sessions overlap:
``knobs.session_rate_factor`` (bootstrap only) multiplies the session-start rate alone, internal gaps
unchanged, so it sets the concurrency (HBFlex Fig. 16: concurrent SWE-bench tasks);
:func:`concurrency_rate_factor` gives the factor of a target mean number of open sessions.

Closed loops (``RequestsConfig.tasks`` = T; HBFlex §6.1, §6.3: "concurrent SWE-bench tasks"): a task
issues its next request a think time after its previous one finishes, so at most T requests are in
the system. The stream holds R = T × turns requests, request i = turn · T + task (turn-major: the
first T are every task's first request). Only first turns have a static arrival (a think time after
t = 0); the serving loop issues the others (:mod:`hbfjax.serve.batching`) and records their arrivals,
and with them their sessions' root starts (the lifetime labels). ``Requests.think_us`` holds each
request's think time.

* ``arrivals = "closed"``: synthetic tasks of independent requests, lengths drawn as above, exponential
  think times of mean ``knobs.think_s``.
* ``replay = "closed"`` (a trace): each task replays trace sessions drawn uniformly with replacement, one
  after another, keeping their turns' lengths and reusable prefixes; a later turn thinks the trace's
  recorded gap before it (÷ ``rate_factor``: the agent's recorded inter-request interval, which holds the
  recorded run's own service time too, so it is an upper bound on the think time proper), a session's
  first turn an exponential ``think_s``.

Padding requests (``valid`` False) have arrival and root start ``clock.never()``, zero lengths and
prefix, ``session`` their own index and ``parent`` −1. R is static: the serving layer asks for warm-up
plus measured requests (DASH §VI-E: 128 + 1,024) and masks the warm-up by request index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import jax
import jax.numpy as jnp
import numpy as np

from hbfjax import clock, rng
from hbfjax.clock import Clock
from hbfjax.salts import Salt
from hbfjax.traces import Trace
from hbfjax.validate import ConfigError, require, require_choice, require_int, require_real

ARRIVALS = ("batch", "poisson", "gamma", "trace", "closed")
LENGTHS = ("fixed", "uniform", "lognormal", "empirical")
REPLAYS = ("exact", "offset", "bootstrap", "closed")
MAX_TASKS = 2**14  # closed loop: concurrent tasks per stream
MAX_REQUESTS = 2**17  # R per stream: within clock.cumsum's exact int32 range (137,438 steps)
MAX_TOKENS = 2**24  # a length stays exact in float32 and a stream's token sums inside int32
MAX_BOOTSTRAP_SLOTS = 2**22  # sessions × turns sorted per stream in a bootstrap
_TICK_PER_US = 16.0  # scaled replay gaps are rounded to 1/16 µs: exact on the clock (see hbfjax.clock)


class _Part(IntEnum):
    """Hash word naming one of the uniforms a single draw needs (after its salt)."""

    RADIUS = 0  # Box-Muller radius
    ANGLE = 1  # Box-Muller angle
    ACCEPT = 2  # Marsaglia-Tsang acceptance test
    BOOST = 3  # Marsaglia-Tsang shape < 1 boost


# --- the requests pytree ---------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Requests:
    """One stream's requests sorted by arrival (inputs of a serving run, DESIGN.md §5)."""

    arrival: Clock  # Clock[R] arrival time (sorted; padding: clock.never())
    prompt_tokens: jax.Array  # int32[R] prompt tokens
    output_tokens: jax.Array  # int32[R] tokens to generate
    prefix_tokens: jax.Array  # int32[R] leading prompt tokens whose KV an earlier request holds
    session: jax.Array  # int32[R] index (in this stream) of the session's root request
    parent: jax.Array  # int32[R] index of the parent request, −1 for a root
    root_start: Clock  # Clock[R] arrival of the session's root: the lifetime label (HBFlex §5.4); in a
    #   closed loop known only for first turns (never elsewhere: the serving state records it)
    valid: jax.Array  # bool[R] a real request (False: padding)
    # float32[R] closed loop: whole µs a task thinks after its previous request finishes before issuing
    # this one (a first turn: after t = 0); None for an open-loop stream
    think_us: jax.Array | None = None


# --- static config ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestsConfig:
    """Static shape and modes of a request stream (hashable: a ``jit`` static argument).

    ``prompt_lengths``/``output_lengths`` default to ``fixed`` for synthetic arrivals and are the
    trace's own (``"trace"``) in replay; ``replay`` defaults to ``offset`` in replay and is None
    otherwise; ``bootstrap_sessions`` defaults to ``requests`` in a bootstrap and is None otherwise.
    """

    requests: int  # R, the length of every [R] array
    arrivals: str = "poisson"
    prompt_lengths: str | None = None
    output_lengths: str | None = None
    replay: str | None = None
    gamma_tries: int = 8  # Marsaglia-Tsang tries per gamma gap (each accepts with p >= 0.95)
    bootstrap_sessions: int | None = None  # M sessions drawn per stream in a bootstrap
    tasks: int | None = None  # closed loop (arrivals 'closed' or replay 'closed'): T tasks, R = T × turns

    def __post_init__(self):
        c = type(self).__name__
        require_int(c, "requests", self.requests, 1, MAX_REQUESTS)
        require_choice(c, "arrivals", self.arrivals, ARRIVALS)
        require_int(c, "gamma_tries", self.gamma_tries, 1, 64)
        replaying = self.arrivals == "trace"
        for name in ("prompt_lengths", "output_lengths"):
            value = getattr(self, name)
            if replaying:
                require(value in (None, "trace"), c, name, value,
                        "lengths come from the trace in a replay (arrivals = 'trace'); leave it unset")
                object.__setattr__(self, name, "trace")
            else:
                object.__setattr__(self, name, require_choice(c, name, "fixed" if value is None else value, LENGTHS))
        if not replaying:
            require((self.prompt_lengths == "empirical") == (self.output_lengths == "empirical"), c,
                    "output_lengths", self.output_lengths,
                    f"empirical lengths resample (prompt, output) pairs: prompt_lengths = {self.prompt_lengths!r} "
                    "and output_lengths must both be 'empirical' or neither")
            require(self.replay is None, c, "replay", self.replay, "applies only to arrivals = 'trace'")
        else:
            object.__setattr__(self, "replay", require_choice(c, "replay", self.replay or "offset", REPLAYS))
        closed = self.arrivals == "closed" or self.replay == "closed"
        if closed:
            t = require_int(c, "tasks", self.tasks, 1, MAX_TASKS)
            require(self.requests % t == 0, c, "requests", self.requests,
                    f"a closed loop serves tasks × turns requests: must be a multiple of tasks = {t}")
        else:
            require(self.tasks is None, c, "tasks", self.tasks, "applies only to a closed loop "
                    "(arrivals = 'closed', or arrivals = 'trace' with replay = 'closed')")
        if self.replay == "bootstrap":
            m = self.requests if self.bootstrap_sessions is None else self.bootstrap_sessions
            object.__setattr__(self, "bootstrap_sessions", require_int(c, "bootstrap_sessions", m, 1, MAX_REQUESTS))
        else:
            require(self.bootstrap_sessions is None, c, "bootstrap_sessions", self.bootstrap_sessions,
                    "applies only to replay = 'bootstrap'")

    @property
    def closed_loop(self) -> bool:
        """Tasks issue their next request a think time after the previous one finishes (HBFlex §6.3)."""
        return self.tasks is not None

    @property
    def turns(self) -> int:
        """Requests per task in a closed loop (R = tasks × turns); 0 in an open loop."""
        return self.requests // self.tasks if self.closed_loop else 0

    @property
    def needs_inputs(self) -> bool:
        """Whether :func:`generate` reads :class:`TraceInputs` (replay or empirical lengths)."""
        return self.arrivals == "trace" or self.prompt_lengths == "empirical"


# --- traced knobs ----------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LengthKnobs:
    """One length law's parameters (tokens); the config's mode picks which are used."""

    tokens: jax.Array  # int32[] fixed length
    lo: jax.Array  # int32[] uniform: smallest length
    hi: jax.Array  # int32[] uniform: largest length (inclusive)
    median: jax.Array  # float32[] lognormal median (tokens)
    sigma: jax.Array  # float32[] lognormal standard deviation of ln(length)

    @classmethod
    def make(cls, tokens=1024, lo=None, hi=None, median=None, sigma=0.0, *, owner: str | None = None) -> "LengthKnobs":
        """Validated lengths: whole tokens in [1, 2^24], lo <= hi, sigma in [0, 4]. Unset ``lo``, ``hi`` and
        ``median`` default to ``tokens``, so every law degenerates to the fixed length."""
        o = owner or cls.__name__
        tokens = require_int(o, "tokens", tokens, 1, MAX_TOKENS)
        lo = require_int(o, "lo", tokens if lo is None else lo, 1, MAX_TOKENS)
        hi = require_int(o, "hi", tokens if hi is None else hi, 1, MAX_TOKENS)
        require(lo <= hi, o, "hi", hi, f"must be >= lo = {lo}")
        median = require_real(o, "median", tokens if median is None else median, 1.0, float(MAX_TOKENS))
        sigma = require_real(o, "sigma", sigma, 0.0, 4.0)
        return cls(tokens=jnp.int32(tokens), lo=jnp.int32(lo), hi=jnp.int32(hi), median=jnp.float32(median),
                   sigma=jnp.float32(sigma))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class RequestKnobs:
    """Traced knobs of a request stream (scalars; stack a leading axis to sweep)."""

    rate_per_s: jax.Array  # float32[] poisson/gamma arrival rate (requests/s)
    cv: jax.Array  # float32[] gamma: coefficient of variation of the gaps
    batch: jax.Array  # int32[] fixed batch: B requests at t = 0
    rate_factor: jax.Array  # float32[] replay: the trace's time axis is divided by this
    prompt: LengthKnobs
    output: LengthKnobs
    session_rate_factor: jax.Array  # float32[] bootstrap: session starts × this (internal gaps unchanged)
    think_s: jax.Array  # float32[] closed loop: mean exponential think time (s) before a task's first
    #   request and, in a synthetic loop, between its requests (a trace's sessions keep their own gaps)

    @classmethod
    def make(cls, rate_per_s=1.0, cv=1.0, batch=1, rate_factor=1.0, prompt: LengthKnobs | None = None,
             output: LengthKnobs | None = None, session_rate_factor=1.0, think_s=1.0) -> "RequestKnobs":
        """Validated knobs: rate in (0, 1e6] /s, cv in [0.1, 4] (gamma shape 1/cv² in [1/16, 100]), batch in
        [1, 2^17], rate factor in (0, 1e3], session rate factor in (0, 1e6], think time in [0, 1e4] s;
        lengths default to DASH's 1K prompt / 128 output tokens."""
        c = cls.__name__
        rate = require_real(c, "rate_per_s", rate_per_s, 0.0, 1e6, lo_open=True)
        cv = require_real(c, "cv", cv, 0.1, 4.0)
        batch = require_int(c, "batch", batch, 1, MAX_REQUESTS)
        factor = require_real(c, "rate_factor", rate_factor, 0.0, 1e3, lo_open=True)
        sessions = require_real(c, "session_rate_factor", session_rate_factor, 0.0, 1e6, lo_open=True)
        think = require_real(c, "think_s", think_s, 0.0, 1e4)
        prompt = LengthKnobs.make(1024, owner=f"{c}.prompt") if prompt is None else prompt
        output = LengthKnobs.make(128, owner=f"{c}.output") if output is None else output
        for name, value in (("prompt", prompt), ("output", output)):
            require(isinstance(value, LengthKnobs), c, name, type(value).__name__, "must be a LengthKnobs (LengthKnobs.make)")
        return cls(rate_per_s=jnp.float32(rate), cv=jnp.float32(cv), batch=jnp.int32(batch),
                   rate_factor=jnp.float32(factor), prompt=prompt, output=output,
                   session_rate_factor=jnp.float32(sessions), think_s=jnp.float32(think))


def check_knobs(knobs: RequestKnobs, config: RequestsConfig) -> None:
    """Refuse a fixed batch larger than the stream (B > R would silently serve only R requests)."""
    if config.arrivals == "batch":
        b = int(np.max(np.asarray(knobs.batch)))
        require(b <= config.requests, "RequestKnobs", "batch", b, f"must be <= RequestsConfig.requests = {config.requests}")


# --- trace inputs ----------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TraceInputs:
    """A trace as arrays (N requests padded to a static length; S sessions of at most L turns)."""

    arrival: Clock  # Clock[N] from the first request, whole µs, sorted (padding: never)
    prompt_tokens: jax.Array  # int32[N]
    output_tokens: jax.Array  # int32[N]
    prefix_tokens: jax.Array  # int32[N]
    session: jax.Array  # int32[N] root index
    parent: jax.Array  # int32[N] parent index (< own index) or −1
    valid: jax.Array  # bool[N]
    count: jax.Array  # int32[] n real requests
    period: Clock  # Clock[] replay period P = duration × n/(n − 1) (> duration)
    since_root: Clock  # Clock[N] arrival − the session root's arrival
    gap_us: jax.Array  # float32[N] µs since the previous turn of the session (0 at a root)
    turns: jax.Array  # int32[S, L] each session's requests in arrival order (−1 padding)
    turn: jax.Array  # int32[N] position of each request in its session's row of ``turns``
    sessions: jax.Array  # int32[] S sessions

    @classmethod
    def from_trace(cls, trace: Trace, max_requests: int | None = None) -> "TraceInputs":
        """The arrays of ``trace`` (its first ``max_requests`` requests if fewer, padded to ``max_requests``
        if more; default: exactly the trace). Arrivals are rounded to whole µs; every parent must come
        before its child in arrival order (a root first in its session)."""
        c = cls.__name__
        n_all = len(trace)
        size = n_all if max_requests is None else require_int(c, "max_requests", max_requests, 1, MAX_REQUESTS)
        n = min(n_all, size)
        require(n >= 1, c, "trace", trace.name, "has no requests")
        parent = np.asarray(trace.parent[:n], np.int64)
        session = np.asarray(trace.session[:n], np.int64)
        idx = np.arange(n)
        same_root = session == np.where(parent >= 0, session[np.maximum(parent, 0)], idx)
        bad = np.flatnonzero((parent >= idx) | (session > idx) | ~same_root)
        require(bad.size == 0, c, "trace", trace.name,
                f"request {bad[:1].tolist()} has a parent or session root that does not precede it in arrival order")
        for name in ("input_tokens", "output_tokens", "prefix_tokens"):
            big = np.asarray(getattr(trace, name)[:n]).max()
            require(big <= MAX_TOKENS, c, name, int(big), f"must be <= {MAX_TOKENS} tokens")
        arrival_us = np.rint(np.asarray(trace.arrival_s[:n], np.float64) * clock.US_PER_S).astype(np.int64)
        arrival_us -= arrival_us[0]
        span = int(arrival_us[-1])
        period_us = max(int(round(span * n / (n - 1))) if n > 1 else 0, span + 1)
        rows: dict = {}  # session root -> its requests in arrival order
        prev = np.full(n, -1)  # previous turn of the session
        turn = np.zeros(n, np.int64)  # position in the session
        for i, root in enumerate(session.tolist()):
            row = rows.setdefault(root, [])
            prev[i], turn[i] = (row[-1] if row else -1), len(row)
            row.append(i)
        turns = np.full((len(rows), max(map(len, rows.values()))), -1, np.int64)
        for k, row in enumerate(rows.values()):
            turns[k, :len(row)] = row

        def pad(a, fill, dtype):
            out = np.full(size, fill, dtype)
            out[:n] = a
            return jnp.asarray(out)

        def pad_clock(total_us, fill_s):
            c = clock.from_us(total_us)
            return Clock(pad(c.s, fill_s, np.int32), pad(c.us, 0.0, np.float32))

        return cls(
            arrival=pad_clock(arrival_us, np.iinfo(np.int32).max),
            prompt_tokens=pad(trace.input_tokens[:n], 0, np.int32),
            output_tokens=pad(trace.output_tokens[:n], 0, np.int32),
            prefix_tokens=pad(trace.prefix_tokens[:n], 0, np.int32),
            session=jnp.asarray(np.r_[session, np.arange(n, size)], jnp.int32),
            parent=pad(parent, -1, np.int32),
            valid=jnp.asarray(np.arange(size) < n),
            count=jnp.int32(n),
            period=clock.from_us(period_us),
            since_root=pad_clock(arrival_us - arrival_us[session], 0),
            gap_us=pad(np.where(prev >= 0, arrival_us - arrival_us[np.maximum(prev, 0)], 0), 0.0, np.float32),
            turns=jnp.asarray(turns, jnp.int32),
            turn=pad(turn, 0, np.int32),
            sessions=jnp.int32(len(rows)),
        )


# --- random variates from the counter hash ---------------------------------------------------------

def standard_gamma(seed, stream, index, shape, tries: int) -> tuple[jax.Array, jax.Array]:
    """Gamma(shape, 1) variates for requests ``index`` (any shape) by Marsaglia–Tsang (2000), and whether
    one of the ``tries`` proposals was accepted.

    Each try draws x ~ N(0, 1) and u ~ U(0, 1] from the counter hash, v = (1 + x/√(9d))³ with
    d = a − 1/3, and accepts d·v if v > 0 and ln u < x²/2 + d − d·v + d·ln v; the first accepted try
    is taken. For a >= 1 a try accepts with probability >= 0.95, so 8 tries all fail with probability
    below 4e-11; then the masked fallback d (close to the median) is returned. A shape < 1 is drawn
    as Gamma(a + 1) · U^(1/a).
    """
    shape = jnp.asarray(shape, jnp.float32)
    index = jnp.asarray(index)
    small = shape < 1.0
    a = jnp.where(small, shape + 1.0, shape)
    d = a - jnp.float32(1.0 / 3.0)
    c = jax.lax.rsqrt(9.0 * d)
    t = jnp.arange(tries, dtype=jnp.int32).reshape((tries,) + (1,) * index.ndim)
    x = rng.normal(rng.mix(seed, stream, index, Salt.REQ_GAMMA, t, _Part.RADIUS),
               rng.mix(seed, stream, index, Salt.REQ_GAMMA, t, _Part.ANGLE))
    v = (1.0 + c * x) ** 3
    log_u = jnp.log(rng.open01(rng.mix(seed, stream, index, Salt.REQ_GAMMA, t, _Part.ACCEPT)))
    ok = (v > 0) & (log_u < 0.5 * x * x + d - d * v + d * jnp.log(jnp.maximum(v, 1e-30)))
    first = jnp.argmax(ok, axis=0)
    accepted = jnp.any(ok, axis=0)
    g = jnp.where(accepted, d * jnp.take_along_axis(v, first[None], axis=0)[0], d)
    boost = rng.open01(rng.mix(seed, stream, index, Salt.REQ_GAMMA, _Part.BOOST)) ** (1.0 / shape)
    return jnp.where(small, g * boost, g), accepted


# --- arrivals --------------------------------------------------------------------------------------

def _clock_steps(gaps_us: jax.Array) -> Clock:
    """Clocks of non-negative float32 gaps (µs, any size)."""
    return clock.advance(clock.zeros(gaps_us.shape), gaps_us)


def arrivals(seed, stream, knobs: RequestKnobs, config: RequestsConfig) -> tuple[Clock, jax.Array]:
    """``(arrival Clock[R], valid bool[R])`` of a synthetic stream (``batch``, ``poisson`` or ``gamma``)."""
    i = jnp.arange(config.requests, dtype=jnp.int32)
    if config.arrivals == "batch":
        return clock.zeros(i.shape), i < knobs.batch
    mean_gap_us = jnp.float32(clock.US_PER_S) / knobs.rate_per_s
    if config.arrivals == "poisson":
        unit = rng.exponential(rng.mix(seed, stream, i, Salt.REQ_GAP))
    else:
        k = 1.0 / (knobs.cv * knobs.cv)
        unit = standard_gamma(seed, stream, i, k, config.gamma_tries)[0] / k
    gaps = jnp.round(unit * mean_gap_us)  # whole µs, the clock's resolution
    return clock.cumsum(_clock_steps(gaps)), jnp.ones(i.shape, bool)


# --- lengths ---------------------------------------------------------------------------------------

def lengths(seed, stream, law: LengthKnobs, mode: str, salt: Salt, count: int) -> jax.Array:
    """int32[count] lengths of requests 0 … count−1 under a ``fixed``, ``uniform`` or ``lognormal`` law."""
    i = jnp.arange(count, dtype=jnp.int32)
    if mode == "fixed":
        return jnp.full(i.shape, law.tokens, jnp.int32)
    if mode == "uniform":
        return law.lo + rng.uniform_index(rng.mix(seed, stream, i, salt), law.hi - law.lo + 1)
    if mode == "lognormal":
        z = rng.normal(rng.mix(seed, stream, i, salt, _Part.RADIUS), rng.mix(seed, stream, i, salt, _Part.ANGLE))
        x = jnp.exp(jnp.log(law.median) + law.sigma * z)
        return jnp.clip(jnp.round(x), 1, MAX_TOKENS).astype(jnp.int32)
    raise ConfigError(f"lengths.mode = {mode!r}: must be one of ('fixed', 'uniform', 'lognormal')")


def empirical_pairs(seed, stream, inputs: TraceInputs, count: int) -> tuple[jax.Array, jax.Array]:
    """(prompt, output) int32[count]: a trace's pairs resampled uniformly with replacement, pair kept."""
    j = rng.uniform_index(rng.mix(seed, stream, jnp.arange(count, dtype=jnp.int32), Salt.REQ_PAIR), inputs.count)
    return inputs.prompt_tokens[j], inputs.output_tokens[j]


# --- synthetic streams -----------------------------------------------------------------------------

def _roots(arrival: Clock, prompt, output, valid) -> Requests:
    """Independent requests: each its own session root, no reusable prefix; padding per the convention."""
    i = jnp.arange(valid.shape[0], dtype=jnp.int32)
    arrival = clock.where(valid, arrival, clock.never(i.shape))
    return Requests(arrival=arrival, prompt_tokens=jnp.where(valid, prompt, 0), output_tokens=jnp.where(valid, output, 0),
                    prefix_tokens=jnp.zeros_like(i), session=i, parent=jnp.full_like(i, -1), root_start=arrival,
                    valid=valid)


def synthetic(seed, stream, knobs: RequestKnobs, inputs: TraceInputs | None, config: RequestsConfig) -> Requests:
    """A stream of independent requests: synthetic arrivals with drawn or resampled lengths."""
    arrival, valid = arrivals(seed, stream, knobs, config)
    r = config.requests
    if config.prompt_lengths == "empirical":
        prompt, output = empirical_pairs(seed, stream, inputs, r)
    else:
        prompt = lengths(seed, stream, knobs.prompt, config.prompt_lengths, Salt.REQ_PROMPT, r)
        output = lengths(seed, stream, knobs.output, config.output_lengths, Salt.REQ_OUTPUT, r)
    return _roots(arrival, prompt, output, valid)


# --- trace replay ----------------------------------------------------------------------------------

def _scaled(arrival: Clock, real: jax.Array, factor) -> Clock:
    """Sorted ``arrival`` with its time axis divided by ``factor``: consecutive gaps (float32 µs) scaled,
    rounded to 1/16 µs and summed exactly; at factor 1 the arrivals are returned unchanged."""
    previous = Clock(jnp.concatenate([jnp.zeros(1, jnp.int32), arrival.s[:-1]]),
                     jnp.concatenate([jnp.zeros(1, jnp.float32), arrival.us[:-1]]))
    gap = jnp.where(real, clock.diff_us(arrival, previous), 0.0) / factor
    summed = clock.cumsum(_clock_steps(jnp.round(gap * _TICK_PER_US) / _TICK_PER_US))
    return clock.where(factor == 1.0, arrival, summed)


def _roots_by_jumping(parent: jax.Array) -> jax.Array:
    """int32[R] the root of each request's parent chain (parents precede children), by pointer jumping:
    ceil(log2 R) gathers, each doubling how far every pointer reaches."""
    i = jnp.arange(parent.shape[0], dtype=jnp.int32)
    up = jnp.where(parent >= 0, parent, i)
    return jax.lax.fori_loop(0, max(1, math.ceil(math.log2(parent.shape[0]))), lambda _, u: u[u], up)


def _finish(arrival: Clock, src, valid, parent, session, prefix, inputs: TraceInputs) -> Requests:
    """Requests gathered from trace rows ``src`` with remapped ``parent``/``session``; padding applied."""
    i = jnp.arange(valid.shape[0], dtype=jnp.int32)
    arrival = clock.where(valid, arrival, clock.never(i.shape))
    session = jnp.where(valid, session, i)
    return Requests(arrival=arrival,
                    prompt_tokens=jnp.where(valid, inputs.prompt_tokens[src], 0),
                    output_tokens=jnp.where(valid, inputs.output_tokens[src], 0),
                    prefix_tokens=jnp.where(valid, prefix, 0),
                    session=session, parent=jnp.where(valid, parent, -1),
                    root_start=clock.take(arrival, session), valid=valid)


def offset_phase(seed, stream, inputs: TraceInputs) -> Clock:
    """A stream's replay phase u: whole µs, uniform on [0, P) (24-bit resolution of the period P)."""
    period_us = clock.diff_us(inputs.period, clock.zeros())
    u = clock.advance(clock.zeros(), jnp.floor(rng.uniform01(rng.mix(seed, stream, Salt.REQ_OFFSET)) * period_us))
    return clock.where(clock.less(u, inputs.period), u, clock.advance(inputs.period, -1.0))


def rotated(inputs: TraceInputs, phase: Clock, requests: int, rate_factor=1.0) -> Requests:
    """The first ``requests`` requests of the trace started at ``phase`` u in [0, P): request i at t_i − u
    if t_i >= u, else at t_i + P − u (it wrapped); a request whose parent wrapped behind it becomes the
    root of what follows of its session and loses its reusable prefix. ``exact`` is phase 0."""
    j = jnp.arange(requests, dtype=jnp.int32)
    n = inputs.count
    k = clock.searchsorted(inputs.arrival, phase, side="left")  # requests before the phase wrap
    src = (k + j) % n
    valid = j < n
    t = clock.sub(clock.take(inputs.arrival, src), phase)
    t = clock.where(src < k, clock.add(t, inputs.period), t)
    parent_src = inputs.parent[src]
    parent = jnp.where(parent_src >= 0, j - (src - parent_src), -1)  # the same shift as the child's
    orphan = (parent_src >= 0) & (parent < 0)  # its parent wrapped behind it
    parent = jnp.where(orphan | ~valid, -1, parent)
    prefix = jnp.where(orphan, 0, inputs.prefix_tokens[src])
    return _finish(_scaled(t, valid, rate_factor), src, valid, parent, _roots_by_jumping(parent), prefix, inputs)


def _bootstrap(seed, stream, knobs: RequestKnobs, inputs: TraceInputs, config: RequestsConfig) -> Requests:
    """``bootstrap`` replay: M sessions drawn with replacement, started by a Poisson process at the trace's
    session rate × rate factor × session rate factor, each keeping its internal gaps (÷ rate factor),
    lengths and prefixes."""
    m_count, width = config.bootstrap_sessions, inputs.turns.shape[1]
    slots = m_count * width
    if slots > MAX_BOOTSTRAP_SLOTS:
        raise ConfigError(f"RequestsConfig.bootstrap_sessions = {m_count}: {m_count} sessions × {width} turns "
                          f"(the trace's longest session) = {slots} slots per stream > {MAX_BOOTSTRAP_SLOTS}; "
                          "draw fewer sessions or replay with 'offset'")
    factor = knobs.rate_factor
    m = jnp.arange(m_count + 1, dtype=jnp.int32)
    mean_gap_us = (clock.diff_us(inputs.period, clock.zeros()) / inputs.sessions.astype(jnp.float32)
                   / (factor * knobs.session_rate_factor))
    gaps = rng.exponential(rng.mix(seed, stream, m, Salt.REQ_BOOT_START)) * mean_gap_us
    starts = clock.cumsum(_clock_steps(jnp.round(gaps * _TICK_PER_US) / _TICK_PER_US))  # Clock[M + 1]
    pick = rng.uniform_index(rng.mix(seed, stream, m[:-1], Salt.REQ_BOOT_SESSION), inputs.sessions)
    rows = inputs.turns[pick]  # int32[M, L] trace requests of each drawn session
    real = rows >= 0
    src = jnp.maximum(rows, 0)
    scaled_gap = jnp.where(real, inputs.gap_us[src] / factor, 0.0)
    scaled = clock.cumsum(_clock_steps(jnp.round(scaled_gap * _TICK_PER_US) / _TICK_PER_US))
    offset = clock.where(factor == 1.0, clock.take(inputs.since_root, src), scaled)
    t = clock.add(Clock(starts.s[:-1, None], starts.us[:-1, None]), offset)
    t = clock.where(real, t, clock.never(rows.shape))
    flat = jnp.arange(slots, dtype=jnp.int32)
    s_sorted, us_sorted, order = jax.lax.sort((t.s.reshape(-1), t.us.reshape(-1), flat), num_keys=2, is_stable=True)
    position = jnp.zeros(slots, jnp.int32).at[order].set(flat)  # output index of each slot
    take = order[:config.requests] if slots >= config.requests else jnp.concatenate(
        [order, jnp.zeros(config.requests - slots, jnp.int32)])
    j = jnp.arange(config.requests, dtype=jnp.int32)
    arrival = clock.take(Clock(s_sorted, us_sorted), jnp.minimum(j, slots - 1))
    src_flat, real_flat = src.reshape(-1)[take], real.reshape(-1)[take]
    valid = (j < slots) & real_flat & clock.less(arrival, clock.take(starts, m_count))  # before session M+1
    row_start = (take // width) * width
    parent_src = inputs.parent[src_flat]
    parent = jnp.where(parent_src >= 0, position[row_start + inputs.turn[jnp.maximum(parent_src, 0)]], -1)
    session = position[row_start]  # the root is turn 0 of its row
    return _finish(arrival, src_flat, valid, parent, session, inputs.prefix_tokens[src_flat], inputs)


def session_spans_us(inputs: TraceInputs) -> np.ndarray:
    """Host float64[S] µs each trace session is open (at rate factor 1): its last turn's arrival − its
    root's, plus one mean gap between turns (the trace's mean over non-root turns; the trace's mean
    inter-arrival gap P/n if no session has two turns), which stands for the last turn's service and
    follow-up without needing service times."""
    turns = np.asarray(inputs.turns)
    count = int(inputs.count)
    turn = np.asarray(inputs.turn)[:count]
    gaps = np.asarray(inputs.gap_us, np.float64)[:count][turn > 0]
    mean_gap = gaps.mean() if gaps.size else clock.to_us(inputs.period) / count
    last = turns[np.arange(turns.shape[0]), (turns >= 0).sum(axis=1) - 1]
    return clock.to_us(inputs.since_root)[last] + mean_gap


def concurrency_rate_factor(inputs: TraceInputs, concurrency: float) -> float:
    """The ``session_rate_factor`` at which a ``bootstrap`` replay has ``concurrency`` sessions open on
    average (HBFlex Fig. 16): by Little's law, open sessions = session start rate × mean span
    (:func:`session_spans_us`), with starts at S/P × factor (independent of ``rate_factor``, which
    multiplies the start rate and divides the spans)."""
    target = require_real("concurrency_rate_factor", "concurrency", concurrency, 0.0, float(MAX_REQUESTS), lo_open=True)
    per_us = int(inputs.sessions) / float(clock.to_us(inputs.period))
    return target / (per_us * float(session_spans_us(inputs).mean()))


def replay(seed, stream, knobs: RequestKnobs, inputs: TraceInputs, config: RequestsConfig) -> Requests:
    """One stream's replay of the trace in ``inputs`` (``config.replay``: exact, offset or bootstrap)."""
    if config.replay == "bootstrap":
        return _bootstrap(seed, stream, knobs, inputs, config)
    phase = offset_phase(seed, stream, inputs) if config.replay == "offset" else clock.zeros()
    return rotated(inputs, phase, config.requests, knobs.rate_factor)


# --- closed loops (HBFlex §6.1, §6.3: concurrent agent tasks) ----------------------------------------

def _think_us(seed, stream, index, think_s) -> jax.Array:
    """float32 whole µs: exponential think times of mean ``think_s`` for requests ``index``."""
    return jnp.round(rng.exponential(rng.mix(seed, stream, index, Salt.REQ_THINK)) * think_s * clock.US_PER_S)


def _closed_first_turns(think_us: jax.Array, tasks: int) -> Clock:
    """Clock[R]: a task's first request arrives after its think time from t = 0; every later one is issued
    by the serving loop when its predecessor finishes (never here)."""
    first = jnp.arange(think_us.shape[0]) < tasks
    return clock.where(first, _clock_steps(think_us), clock.never(think_us.shape))


def _closed_synthetic(seed, stream, knobs: RequestKnobs, inputs: TraceInputs | None, config: RequestsConfig) -> Requests:
    """A synthetic closed loop: T tasks of independent requests (each its own session root), lengths drawn
    as :func:`synthetic` draws them, exponential think times of mean ``knobs.think_s``."""
    r = config.requests
    i = jnp.arange(r, dtype=jnp.int32)
    if config.prompt_lengths == "empirical":
        prompt, output = empirical_pairs(seed, stream, inputs, r)
    else:
        prompt = lengths(seed, stream, knobs.prompt, config.prompt_lengths, Salt.REQ_PROMPT, r)
        output = lengths(seed, stream, knobs.output, config.output_lengths, Salt.REQ_OUTPUT, r)
    think = _think_us(seed, stream, i, knobs.think_s)
    arrival = _closed_first_turns(think, config.tasks)
    return Requests(arrival=arrival, prompt_tokens=prompt, output_tokens=output, prefix_tokens=jnp.zeros_like(i),
                    session=i, parent=jnp.full_like(i, -1), root_start=arrival, valid=jnp.ones(r, bool), think_us=think)


def session_turn_counts(inputs: TraceInputs) -> jax.Array:
    """int32[S] turns of each trace session."""
    return (inputs.turns >= 0).sum(axis=1, dtype=jnp.int32)


def _closed_replay(seed, stream, knobs: RequestKnobs, inputs: TraceInputs, config: RequestsConfig) -> Requests:
    """A trace's sessions run by T tasks in a closed loop (module docstring): task t replays trace sessions
    drawn uniformly with replacement, one after another, until it has ``turns`` requests; a turn's think
    time is the trace's recorded gap before it (÷ ``rate_factor``), a session's first turn thinks an
    exponential ``think_s``. Request i = turn · T + task; its parent is the task's previous request when
    both belong to one session."""
    t_count, k_count = config.tasks, config.turns
    task = jnp.arange(t_count, dtype=jnp.int32)
    k = jnp.arange(k_count, dtype=jnp.int32)
    pick = rng.uniform_index(rng.mix(seed, stream, task[:, None], Salt.REQ_TASK_SESSION, k[None, :]),
                             inputs.sessions)  # int32[T, K] a task's sessions (K suffice: each has >= 1 turn)
    span = session_turn_counts(inputs)[pick]  # int32[T, K]
    ends = jnp.cumsum(span, axis=1)  # int32[T, K] turns done after each session
    which = (ends[:, None, :] <= k[None, :, None]).sum(axis=2, dtype=jnp.int32)  # int32[T, K] session of turn k
    within = k[None, :] - jnp.take_along_axis(ends - span, which, axis=1)  # int32[T, K] turn inside it
    src = inputs.turns[jnp.take_along_axis(pick, which, axis=1), within]  # int32[T, K] trace request
    # request i = turn · T + task: transpose to [K, T] and flatten
    src, within = src.T.reshape(-1), within.T.reshape(-1)
    i = jnp.arange(config.requests, dtype=jnp.int32)
    cont = within > 0  # a later turn of a session
    recorded = jnp.round(inputs.gap_us[src] / knobs.rate_factor)
    think = jnp.where(cont, recorded, _think_us(seed, stream, i, knobs.think_s))
    arrival = _closed_first_turns(think, t_count)
    return Requests(arrival=arrival, prompt_tokens=inputs.prompt_tokens[src], output_tokens=inputs.output_tokens[src],
                    prefix_tokens=jnp.where(cont, inputs.prefix_tokens[src], 0),
                    session=i - within * t_count, parent=jnp.where(cont, i - t_count, -1),
                    root_start=arrival, valid=jnp.ones(config.requests, bool), think_us=think)


def generate(stream_id, seed, knobs: RequestKnobs, inputs: TraceInputs | None, config: RequestsConfig) -> Requests:
    """One stream's requests (the ``hbfjax.batch`` protocol; vmap over ``stream_id`` at the top)."""
    if config.needs_inputs and not isinstance(inputs, TraceInputs):
        raise ConfigError(f"generate.inputs = {type(inputs).__name__}: arrivals = {config.arrivals!r} with "
                          f"prompt_lengths = {config.prompt_lengths!r} needs TraceInputs.from_trace(trace)")
    if config.replay == "closed":
        return _closed_replay(seed, stream_id, knobs, inputs, config)
    if config.arrivals == "closed":
        return _closed_synthetic(seed, stream_id, knobs, inputs, config)
    if config.arrivals == "trace":
        return replay(seed, stream_id, knobs, inputs, config)
    return synthetic(seed, stream_id, knobs, inputs, config)
