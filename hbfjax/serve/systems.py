"""Named serving systems and the scenario they serve: the one front door through which the CLI, the
figures, sweeps, benchmarks and tuning problems build a serving run (DESIGN.md §5; review 2026-12-02 §8).

* :class:`Scenario` (host, frozen) is everything a run serves apart from the memory system: the model,
  the GPU, the batcher (DASH §VI-E's Sarathi defaults live here, once), the request stream and the
  run's bounds, plus the study options every system reads (KV budgets, organisation changes, HBFlex
  mechanisms turned off, DASH's reads through plane collisions).
* :class:`System` names one system: its kind (which defaults apply), its parts (static: they set what
  compiles) and how its knobs (the organisation and policy as data) follow from a scenario, with the
  sources of its values. :data:`SYSTEMS` holds DASH's four organisations (DASH §VI-A Fig. 8), HBFlex's
  six (HBFlex §6.1) and the CPU-offloading baselines (DASH §VI-C).
* :func:`families` groups the systems of a run by their static configuration: each :class:`Family` is
  one compilation, its systems stacked on one knob axis and compared on common random numbers.

This module builds; it runs nothing (``hbfjax.sweep.families.run_family`` runs a family's batch).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from hbfjax.memory import hbf_packages
from hbfjax.memory import organisations as orgs
from hbfjax.serve import cpu_offload, engine, metrics, parts as part_modules, report
from hbfjax.serve.parts.blocks import BlocksConfig
from hbfjax.serve.parts.reads import ReadsConfig, read_laws
from hbfjax.serve.state import MAX_SLOTS, BatcherConfig, BatcherKnobs
from hbfjax.validate import ConfigError, require, require_choice, require_int, require_real
from hbfjax.workload import models, timing
from hbfjax.workload import requests as rq

CHUNK_TOKENS = 512  # DASH §VI-E (Sarathi's chunk); HBFlex states none
TOKEN_BUDGET = 8192  # DASH §VI-E
DASH_GPU = "h100-pcie"  # DASH §VI-A: operators profiled on an H100 PCIe 80 GB
HBFLEX_GPU = "h200"  # HBFlex §6.1: H200-class accelerators
KINDS = ("dash", "hbflex", "cpu")
READS = ("linear", "planes")  # DASH's HBF KV reads at their bytes' rate, or through plane collisions
# Readings of the DASH paper that it leaves open (review 2026-12-02 DASH fidelity), each an OrgKnobs
# flag by name; the first is the literal (physical) reading and the default
ARRAY_RATES = {"shared": 1.0, "per-path": 0.0}  # OrgKnobs.shared_array_rate
TR_MODELS = {"rate": 1.0, "latency": 0.0}  # OrgKnobs.tr_sets_rate
FIXED_PREFILL = ("chunked", "whole")  # a fixed batch's prefill: Sarathi chunks, or one pass (whole_prefill)


def whole_prefill(prompt: int, slots: int) -> dict:
    """Batcher settings that prefill every slot's prompt in one chunk in the first pass (a chunk of the
    whole prompt, a budget of every slot's prompt and decode token): DASH §VI-B's fixed-batch runs, for
    which the paper states no chunking (LLMSimulator's default budget, 65,536 × 8 tokens, is unchunked)."""
    return dict(chunk_tokens=prompt, token_budget=slots * prompt + slots)


@dataclass(frozen=True, eq=False)
class Scenario:
    """What a serving run serves, apart from the memory system (module docstring). Build one with
    :meth:`fixed_batch`, :meth:`poisson` or :meth:`replay`; change fields with ``dataclasses.replace``."""

    model: Any  # a preset name (hbfjax.workload.models) or a ModelSpec
    requests: rq.RequestsConfig  # the stream's static shape (requests, arrivals, length laws, replay)
    request_knobs: rq.RequestKnobs  # its traced knobs (rate, batch, lengths, rate factors)
    slots: int  # B_max running requests
    trace: rq.TraceInputs | None = None
    gpu: str | None = None  # None: DASH's H100 PCIe, or the H200 when only HBFlex's systems are served
    mode: str = "mixed"  # BatcherConfig.mode
    chunk_tokens: int = CHUNK_TOKENS
    token_budget: int = TOKEN_BUDGET
    routing: str = "uniform"  # routing.KINDS
    warmup: int = 0  # leading requests excluded from the metrics (an open loop)
    warmup_turns: int = 2  # a closed loop: turns every task serves before the window (metrics.closed_window)
    warmup_fraction: float | None = None  # a closed loop's warm-up in time instead (warmup_turns 0; metrics.ClosedLoop)
    measured: int | None = None  # requests measured after the warm-up (None: all the rest)
    slo: metrics.Slo | None = None
    hbm_kv_budget_bytes: float | None = None  # None: the HBM the weights leave
    kv_room_bytes: float | None = None  # None: the HBF the weights leave
    label_interval_s: float = 60.0  # lifetime labels (HBFlex §5.4 states none)
    org_changes: tuple = ()  # (name, value) OrgKnobs.make arguments applied to every organisation
    gpu_changes: tuple = ()  # (name, value) GpuKnobs.make arguments (e.g. launch_us) for every system
    cpu_changes: tuple = ()  # (name, value) OffloadKnobs.make overrides (memory_efficiency, core_bw_gbps)
    link_gbps: float | None = None  # every D2D link that exists (DASH's organisations)
    page_bytes: int | None = None  # HBF page; the base-die transfer regions scale with it (DASH §VI-F)
    disable: tuple = ()  # HBFlex mechanisms off (hbf_packages.MECHANISMS)
    reads: str = "linear"  # READS: "planes" gives DASH's organisations the reads part
    sram_shares: tuple | None = None  # an SRAM split for HBFlex's systems (parts.sram)
    table: Any = None  # a measured GPU operator table (profile_table.Curves; DASH's organisations)
    allow_roofline: bool = False
    max_iterations: int = 100_000
    scan_chunk: int = 64
    max_pass_tokens: int | None = None  # None: a decode token and a chunk per slot within the budget
    cores: int = 32  # host cores the CPU systems may use (DASH Fig. 10(b))
    cpu_experts: int = 0  # hybrid-split's fixed CPU share
    reads_config: ReadsConfig = field(default_factory=ReadsConfig)
    blocks: BlocksConfig = field(default_factory=BlocksConfig)
    relax: engine.ServeRelax | None = None
    reclaim: Any = None  # parts.reclaim.ReclaimKnobs: the organisations gain the reclaim part (issue 26)
    tensor_parallel: int = 1  # GPUs (each with its package) of one stream's tensor-parallel group (HBFlex §6.1)

    def __post_init__(self):
        c = type(self).__name__
        require_int(c, "slots", self.slots, 1)
        require_int(c, "tensor_parallel", self.tensor_parallel, 1)
        if self.tensor_parallel > 1:
            self.model_spec.with_tensor_parallel(self.tensor_parallel)  # validates the split of the model
        require_choice(c, "reads", self.reads, READS)
        require_int(c, "warmup", self.warmup, 0, self.requests.requests - 1)
        if self.requests.closed_loop:
            require(self.warmup == 0, c, "warmup", self.warmup, "a closed loop's warm-up is warmup_turns")
            require_int(c, "warmup_turns", self.warmup_turns, 0, self.requests.turns - 2)
            if self.warmup_fraction is not None:
                require_real(c, "warmup_fraction", self.warmup_fraction, 0.0, 1.0, hi_open=True)
                require(self.warmup_turns == 0, c, "warmup_turns", self.warmup_turns,
                        "must be 0 with a warm-up fraction (one warm-up rule)")
            require(self.slots <= self.requests.tasks, c, "slots", self.slots,
                    f"must be <= tasks = {self.requests.tasks}: at most one request per task is in the system")
        else:
            require(self.warmup_fraction is None, c, "warmup_fraction", self.warmup_fraction,
                    "applies to a closed loop")
        for m in self.disable:
            require(m in hbf_packages.MECHANISMS, c, "disable", m, f"must be among {hbf_packages.MECHANISMS}")
        rq.check_knobs(self.request_knobs, self.requests)

    # --- constructors -------------------------------------------------------------------------------

    @classmethod
    def fixed_batch(cls, model, batch: int, prompt: int, output: int, *, slots: int | None = None,
                    **changes) -> "Scenario":
        """B = ``batch`` requests of ``prompt`` → ``output`` tokens at t = 0 (DASH §VI-B) in ``slots``
        (default B) slots; a stream of ``slots`` requests, so batch sizes up to it share a compilation."""
        slots = batch if slots is None else slots
        knobs = rq.RequestKnobs.make(batch=batch, prompt=rq.LengthKnobs.make(prompt), output=rq.LengthKnobs.make(output))
        return cls(model=model, requests=rq.RequestsConfig(requests=slots, arrivals="batch"), request_knobs=knobs,
                   slots=slots, **changes)

    @classmethod
    def poisson(cls, model, rate_per_s: float, requests: int, prompt: int, output: int, *, slots: int = 32,
                warmup: int = 0, **changes) -> "Scenario":
        """``requests`` Poisson arrivals at ``rate_per_s`` of fixed lengths (DASH §VI-E: 32 slots, 128
        warm-up + 1,024 measured requests)."""
        knobs = rq.RequestKnobs.make(rate_per_s=rate_per_s, prompt=rq.LengthKnobs.make(prompt),
                                     output=rq.LengthKnobs.make(output))
        return cls(model=model, requests=rq.RequestsConfig(requests=requests, arrivals="poisson"),
                   request_knobs=knobs, slots=slots, warmup=warmup, **changes)

    @classmethod
    def replay(cls, model, trace: rq.TraceInputs, requests: int, *, slots: int = 32, replay: str | None = None,
               rate_factor: float = 1.0, concurrency: float | None = None, warmup: int = 0,
               **changes) -> "Scenario":
        """A trace replayed (``replay``: offset or exact; with ``concurrency``, a bootstrap of its sessions
        whose starts keep that many open on average, HBFlex Fig. 16)."""
        if concurrency is not None:
            replay = "bootstrap" if replay is None else replay
            factor = rq.concurrency_rate_factor(trace, concurrency)
        else:
            factor = 1.0
        knobs = rq.RequestKnobs.make(rate_factor=rate_factor, session_rate_factor=factor)
        return cls(model=model, requests=rq.RequestsConfig(requests=requests, arrivals="trace", replay=replay),
                   request_knobs=knobs, slots=slots, trace=trace, warmup=warmup, **changes)

    @classmethod
    def closed_loop(cls, model, tasks: int, turns: int, *, trace: rq.TraceInputs | None = None, think_s: float = 1.0,
                    prompt: int = 1024, output: int = 128, slots: int | None = None, warmup_turns: int = 2,
                    rate_factor: float = 1.0, **changes) -> "Scenario":
        """``tasks`` agent tasks per package in a closed loop (HBFlex §6.1, §6.3), ``turns`` requests each: a
        trace's sessions run one after another by each task (their recorded gaps as think times, ÷
        ``rate_factor``), or without a trace independent ``prompt`` → ``output`` requests; ``think_s`` the
        mean exponential think time before a task's first request and a session's (a synthetic loop: every)
        request. ``slots`` default min(tasks, MAX_SLOTS): a request per task can run."""
        knobs = rq.RequestKnobs.make(prompt=rq.LengthKnobs.make(prompt), output=rq.LengthKnobs.make(output),
                                     think_s=think_s, rate_factor=rate_factor)
        config = (rq.RequestsConfig(requests=tasks * turns, arrivals="closed", tasks=tasks) if trace is None else
                  rq.RequestsConfig(requests=tasks * turns, arrivals="trace", replay="closed", tasks=tasks))
        slots = min(tasks, MAX_SLOTS) if slots is None else slots
        return cls(model=model, requests=config, request_knobs=knobs, slots=slots, trace=trace,
                   warmup_turns=warmup_turns, **changes)

    # --- derived ------------------------------------------------------------------------------------

    @property
    def closed(self) -> tuple | None:
        """A closed loop's window rule (``metrics.ClosedLoop``: tasks, warm-up turns, warm-up fraction) for its
        metrics; None for an open loop."""
        if not self.requests.closed_loop:
            return None
        return metrics.ClosedLoop(self.requests.tasks, self.warmup_turns, self.warmup_fraction)

    @property
    def model_spec(self) -> models.ModelSpec:
        return models.preset(self.model) if isinstance(self.model, str) else self.model

    @property
    def model_name(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.name

    @property
    def online(self) -> bool:
        """Requests arrive over time (Poisson, gamma or a trace), not all at t = 0."""
        return self.requests.arrivals != "batch"

    @property
    def batcher_knobs(self) -> BatcherKnobs:
        return BatcherKnobs.make(chunk_tokens=self.chunk_tokens, token_budget=self.token_budget)

    def longest_request_tokens(self) -> int:
        """The most KV tokens (prompt + output) one request of the stream holds."""
        if self.trace is not None:
            return int(np.max(np.asarray(self.trace.prompt_tokens) + np.asarray(self.trace.output_tokens)))
        k = self.request_knobs
        longest = lambda law: int(max(np.max(np.asarray(law.tokens)), np.max(np.asarray(law.hi))))  # noqa: E731
        return longest(k.prompt) + longest(k.output)


class System(NamedTuple):
    """One named serving system (module docstring)."""

    name: str
    kind: str  # KINDS: which defaults apply (GPU, KV precision, parts, timing)
    knobs: Callable  # (scenario, gpu preset name) -> engine.ServeKnobs
    sources: tuple = ()  # (field, where its value comes from)
    description: str = ""

    def parts(self, scenario: Scenario) -> tuple:
        """The parts this system runs with in ``scenario`` (DASH's gain the reads part with --reads planes; an
        organisation gains the reclaim part with ``scenario.reclaim``)."""
        if self.kind == "cpu":
            return ()
        names = part_modules.HBFLEX if self.kind == "hbflex" else (
            ("tiers", "reads") if scenario.reads == "planes" else ("tiers",))
        return part_modules.in_order(names + (("reclaim",) if scenario.reclaim is not None else ()))

    def model(self, scenario: Scenario) -> models.ModelSpec:
        """The model as one GPU of this system stores it (HBFlex §6.1 evaluates with 1-byte KV elements): with
        ``scenario.tensor_parallel`` T > 1 its share of a T-way group (``hbfjax.workload.tensor_parallel``)."""
        spec = scenario.model_spec
        if scenario.tensor_parallel > 1:
            spec = spec.with_tensor_parallel(scenario.tensor_parallel)
        return spec.with_kv_precision(models.HBFLEX_KV_BYTES_PER_ELEMENT) if self.kind == "hbflex" else spec


def _org_changes(scenario: Scenario, base: orgs.OrgKnobs) -> dict:
    """The scenario's OrgKnobs.make changes for an organisation whose defaults are ``base``."""
    changes = dict(scenario.org_changes)
    if scenario.page_bytes is not None:  # DASH §VI-F: the transfer region scales with the bytes of a page wave
        scale = scenario.page_bytes / float(base.page_bytes)
        changes.update(page_bytes=scenario.page_bytes, hbf_sram_region_bytes=float(base.hbf_sram_region_bytes) * scale)
    return changes


def gpu_knobs(scenario: Scenario, gpu: str) -> timing.GpuKnobs:
    """The GPU preset's knobs with the scenario's changes (``Scenario.gpu_changes``)."""
    return timing.GpuKnobs.make(gpu, **dict(scenario.gpu_changes))


def _hbf_knobs(scenario: Scenario, gpu: str, org: orgs.OrgKnobs, policy) -> engine.ServeKnobs:
    return engine.ServeKnobs.make(
        org, gpu_knobs(scenario, gpu), scenario.batcher_knobs, scenario.request_knobs,
        hbm_kv_budget_bytes=scenario.hbm_kv_budget_bytes, policy=policy, kv_room_bytes=scenario.kv_room_bytes,
        label_interval_s=scenario.label_interval_s, sram_shares=scenario.sram_shares, relax=scenario.relax,
        reclaim=scenario.reclaim)


def _dash_system(name: str) -> System:
    def knobs(scenario: Scenario, gpu: str) -> engine.ServeKnobs:
        changes = _org_changes(scenario, orgs.organisation(name))
        org = orgs.organisation(name, link_gbps=scenario.link_gbps, **changes)
        return _hbf_knobs(scenario, gpu, org, hbf_packages.dash_policy())

    make = orgs.ORGANISATIONS[name]
    return System(name, "dash", knobs, orgs.SOURCES[name], (make.__doc__ or "").strip().split("\n")[0])


def _hbflex_system(name: str) -> System:
    def knobs(scenario: Scenario, gpu: str) -> engine.ServeKnobs:
        base = hbf_packages.package(name)
        changes = _org_changes(scenario, base.org)
        if scenario.link_gbps is not None:
            changes.update({k: scenario.link_gbps for k in ("gpu_hbm_gbps", "direct_gbps", "relay_gbps")
                            if float(getattr(base.org, k)) > 0})
        pkg = hbf_packages.package(name, **changes) if changes else base
        return _hbf_knobs(scenario, gpu, pkg.org, hbf_packages.disable(pkg.policy, scenario.disable))

    make = hbf_packages.PACKAGES[name]
    return System(name, "hbflex", knobs, hbf_packages.SOURCES.get(name, ()),
                  (make.__doc__ or "").strip().split("\n")[0])


def _cpu_system(name: str) -> System:
    def knobs(scenario: Scenario, gpu: str) -> engine.ServeKnobs:
        model = scenario.model_spec
        kv_tokens = scenario.slots * scenario.longest_request_tokens()
        cpu = cpu_offload.CpuKnobs.make(model, gpu, scenario.cores, name, kv_tokens=kv_tokens,
                                        cpu_experts=scenario.cpu_experts, **dict(scenario.cpu_changes))
        return engine.ServeKnobs.make(None, gpu_knobs(scenario, gpu), scenario.batcher_knobs, scenario.request_knobs,
                                      cpu=cpu)

    return System(name, "cpu", knobs, cpu_offload.SOURCES, cpu_offload.DESCRIPTIONS[name])


SYSTEMS: dict[str, System] = {
    **{n: _dash_system(n) for n in orgs.ORGANISATIONS},
    **{n: _hbflex_system(n) for n in hbf_packages.PACKAGES},
    **{n: _cpu_system(n) for n in cpu_offload.SYSTEMS},
}


def system(name: str) -> System:
    """The named system (:data:`SYSTEMS`)."""
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ConfigError(f"system = {name!r}: must be one of {tuple(SYSTEMS)}") from None


def names_of(kind: str) -> tuple:
    """The systems of one kind (KINDS), in registry order."""
    return tuple(n for n, s in SYSTEMS.items() if s.kind == kind)


def gpu_for(names, scenario: Scenario) -> str:
    """The GPU preset of a run: the scenario's, else the H200 when every system is HBFlex's, else DASH's."""
    if scenario.gpu is not None:
        return scenario.gpu
    return HBFLEX_GPU if all(system(n).kind == "hbflex" for n in names) else DASH_GPU


def serve_config(sys_: System, scenario: Scenario) -> engine.ServeConfig:
    """The static configuration of ``sys_`` serving ``scenario`` (the one place a ServeConfig is built)."""
    slots = scenario.slots
    bound = scenario.max_pass_tokens or engine.pass_token_bound(slots, scenario.chunk_tokens, scenario.token_budget)
    return engine.ServeConfig(
        model=sys_.model(scenario), batcher=BatcherConfig(slots=slots, mode=scenario.mode, tasks=scenario.requests.tasks or 0),
        requests=scenario.requests,
        max_pass_tokens=bound, routing_kind=scenario.routing,
        routing_draw="counts" if scenario.routing == "uniform" else "tokens", max_iterations=scenario.max_iterations,
        scan_chunk=scenario.scan_chunk, allow_roofline=scenario.allow_roofline, parts=sys_.parts(scenario),
        timing_kind="cpu-offload" if sys_.kind == "cpu" else "organisation", reads=scenario.reads_config,
        blocks=scenario.blocks)


def inputs_for(config: engine.ServeConfig, points: list, scenario: Scenario, pad_to: int | None = None
               ) -> engine.ServeInputs:
    """The inputs of a call serving ``points`` (ServeKnobs) with ``config``: the scenario's trace and
    measured table, and the laws the points' parts need (padded to ``pad_to`` points' worth by
    repeating the last, so that calls of one width have one shape)."""
    pad = max(pad_to or 0, len(points))
    padded = list(points) + [points[-1]] * (pad - len(points))
    laws = resident = None
    if "reads" in config.parts and config.reads.wave_draw == "table":
        laws = read_laws(padded, pad_to=2 * pad)
    if config.timing_kind == "cpu-offload":
        counts = [int(p.cpu.resident_experts) for p in padded]
        resident = cpu_offload.resident_laws(config.model.routed_experts, counts, pad_to=pad)
    table = scenario.table if config.timing_kind == "organisation" else None
    return engine.ServeInputs(trace=scenario.trace, table=table, read_laws=laws, resident_laws=resident)


class Family(NamedTuple):
    """Systems of one run that share one compilation: ``simulate`` with its static ``config``, one
    knob point per system (``names``, ``points``) and their ``inputs``; ``report(outputs[S, ...], k)``
    turns point ``k``'s outputs into its JSON (a ``ConfigError`` for a run that measured nothing
    meaningful), ``per_stream(outputs[S, ...])`` gives its request metrics stream by stream
    (``{key: float64[S]}``), and ``inputs_for(points, pad_to)`` the inputs of any call stacking such
    points (``hbfjax sweep`` stacks points of families with equal :func:`family_key`).
    ``with_points(points, names=None)`` is the family on other knob points of the same structure
    (e.g. ``dataclasses.replace`` of its own: an ablation's policies, a swept tR), its inputs rebuilt
    for them and each reported on its own organisation; a bare ``_replace(points=...)`` would keep
    the old inputs and report every point on the old points' organisations."""

    simulate: Callable
    config: Any
    inputs: Any
    names: tuple
    points: tuple
    report: Callable[[Any, int], dict]
    per_stream: Callable[[Any], dict]
    inputs_for: Callable
    with_points: Callable


def _check(names, scenario: Scenario) -> None:
    kinds = {system(n).kind for n in names}
    require(len(set(names)) == len(names), "families", "names", list(names), "each system once")
    if scenario.table is not None and kinds - {"dash"}:
        raise ConfigError("--profile-table: applies to DASH's organisations only, not to "
                          + " ".join(n for n in names if system(n).kind != "dash"))
    if scenario.reads == "planes" and "cpu" in kinds:
        raise ConfigError("--reads planes: the CPU-offloading systems read no HBF; drop it or serve HBF systems only")
    if "cpu" in kinds and scenario.tensor_parallel > 1:
        raise ConfigError(f"--tensor-parallel = {scenario.tensor_parallel}: the CPU-offloading systems "
                          f"({', '.join(n for n in names if system(n).kind == 'cpu')}) serve one GPU with its experts "
                          "streamed from the host (DASH §VI-C); tensor parallelism applies to the HBF systems")
    if "cpu" in kinds and not scenario.model_spec.is_moe:
        raise ConfigError(f"--system {' '.join(n for n in names if system(n).kind == 'cpu')}: the CPU-offloading "
                          f"systems serve MoE models ({scenario.model_name} is dense)")


def _table_report(o, scenario: Scenario) -> None:
    if np.any(np.asarray(o.totals.table_miss_passes) > 0):
        raise ConfigError("--profile-table: some operator shapes of this run lie outside the measured table; profile "
                          "them (hbfjax profile --model ...) or pass --allow-roofline")


def _family(config: engine.ServeConfig, names: tuple, scenario: Scenario, points: tuple) -> Family:
    model = config.model
    if "blocks" in config.parts:
        for p in points:
            part_modules.blocks.check_trigger(p.policy, config.blocks, config.requests.requests)

    def report_point(o, k):
        _table_report(o, scenario)
        org = points[k].org
        result = report.system_report(o, org, config.parts, scenario.warmup, scenario.online, scenario.slo,
                                      scenario.measured, scenario.closed)
        if org is not None:
            result.update(report.measured_mean_ci(report.per_gpu_report(o, model)))
        lookahead = org is not None and float(org.lookahead) > 0.5 and model.lookahead_capable
        return {**result, "lookahead_effective": bool(lookahead)}

    def with_points(new_points, new_names=None) -> Family:
        new_points = tuple(new_points)
        new_names = names if new_names is None else tuple(new_names)
        require(len(new_names) == len(new_points), "Family.with_points", "names", new_names,
                f"must name each of the {len(new_points)} points")
        return _family(config, new_names, scenario, new_points)

    return Family(engine.simulate, config, inputs_for(config, list(points), scenario), tuple(names), points,
                  report_point, lambda o: report.per_stream(o, scenario.warmup, scenario.slo, scenario.measured,
                                                             scenario.closed),
                  lambda pts, pad_to=None: inputs_for(config, list(pts), scenario, pad_to), with_points)


def families(names, scenario: Scenario) -> list[Family]:
    """The systems ``names`` serving ``scenario``, grouped into families (one per static configuration,
    in first-seen order), each system's knobs a point of its family."""
    names = list(names)
    _check(names, scenario)
    gpu = gpu_for(names, scenario)
    groups: OrderedDict = OrderedDict()
    for n in names:
        groups.setdefault(serve_config(system(n), scenario), []).append(n)
    return [_family(config, tuple(members), scenario, tuple(system(n).knobs(scenario, gpu) for n in members))
            for config, members in groups.items()]


def pytree_digest(tree) -> str:
    """sha256 of a pytree's structure and array values (``None``: no inputs)."""
    h = hashlib.sha256()
    leaves, structure = jax.tree_util.tree_flatten(tree)
    h.update(str(structure).encode())
    for leaf in leaves:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.shape}{a.dtype.str}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def family_key(family: Family) -> tuple:
    """What two families must share for their points to run in one compiled call: the function, the
    static config, the knobs' tree structure and leaf shapes, and the inputs' values apart from the
    tabulated laws (a call rebuilds those for the points it stacks: ``Family.inputs_for``)."""
    leaves, tree = jax.tree_util.tree_flatten(family.points[0])
    shapes = tuple((np.shape(x), np.asarray(x).dtype.str) for x in leaves)
    shared = family.inputs._replace(read_laws=None, resident_laws=None)
    return family.simulate, family.config, tree, shapes, pytree_digest(shared)


def single(name: str, scenario: Scenario) -> Family:
    """The one family of one system."""
    (family,) = families([name], scenario)
    return family


def stack(members: list, names=None) -> Family:
    """The points of the families ``members`` (equal :func:`family_key`: one compilation) as one family, in
    order, on one knob axis: e.g. a figure's points drawn from several scenarios (batch sizes, offered
    rates, organisation changes) run as one call on common random numbers. Its inputs are rebuilt for
    the points stacked (``Family.inputs_for``), point k is reported by the family it came from;
    ``per_stream`` is the first member's (members stacked should share one measured window). ``names``:
    one per point (default: the members' names)."""
    require(len(members) > 0, "stack", "members", len(members), "need at least one family")
    key = family_key(members[0])
    for f in members[1:]:
        require(family_key(f) == key, "stack", "members", f.names, f"must share {members[0].names}'s compiled shape "
                "(family_key: function, config, knob structure and shapes, inputs)")
    owner = [(f, k) for f in members for k in range(len(f.points))]
    points = tuple(f.points[k] for f, k in owner)
    names = tuple(f.names[k] for f, k in owner) if names is None else tuple(names)
    require(len(names) == len(points), "stack", "names", len(names), f"must name each of the {len(points)} points")
    first = members[0]
    return first._replace(names=names, points=points, inputs=first.inputs_for(points),
                          report=lambda o, k: owner[k][0].report(o, owner[k][1]))

