"""The CLI's light name lists (``hbfjax.commands._choices``, read without importing JAX) equal the
registries they mirror, so a choice offered by ``--help`` is always a system, model or mode that exists,
and a bound the parser checks is the one the simulator enforces."""

from hbfjax import trace_fetch
from hbfjax.commands import _choices as names
from hbfjax.flash.erase import kv_lifetimes
from hbfjax.flash.programs import backlog as bl
from hbfjax.flash.programs import writeback as wb
from hbfjax.flash.reads import collide, workingset
from hbfjax.memory import hbf_packages, hbf_parts
from hbfjax.memory import organisations as orgs
from hbfjax.serve import cpu_offload, systems
from hbfjax.serve.state import MODES
from hbfjax.tune import problems
from hbfjax.tune.estimators import ESTIMATORS
from hbfjax.workload import gpus, models, profiler, routing
from hbfjax.workload import requests as rq


def _same(mirror, registry) -> bool:
    """Equal, and of the same type (a float bound prints as one in a refusal: 1e+06, not 1000000)."""
    return mirror == registry and type(mirror) is type(registry)


def test_the_cli_name_lists_equal_the_registries():
    assert names.DASH_SYSTEMS == tuple(orgs.ORGANISATIONS) == systems.names_of("dash")
    assert names.HBFLEX_SYSTEMS == tuple(hbf_packages.PACKAGES) == systems.names_of("hbflex")
    assert names.CPU_SYSTEMS == cpu_offload.SYSTEMS == systems.names_of("cpu")
    assert names.SYSTEMS == tuple(systems.SYSTEMS)
    assert names.MODEL_PRESETS == tuple(models.PRESETS)  # registry order: `hbfjax models --help` lists them so
    assert names.MODELS == tuple(sorted(models.PRESETS))
    assert names.GPUS == tuple(sorted(gpus.PRESETS))
    assert names.MODES == MODES and names.ROUTING_KINDS == routing.KINDS and names.READS == systems.READS
    assert names.MECHANISMS == hbf_packages.MECHANISMS
    assert (names.ARRAY_RATES, names.TR_MODELS, names.FIXED_PREFILL) == (
        tuple(systems.ARRAY_RATES), tuple(systems.TR_MODELS), systems.FIXED_PREFILL)
    assert (names.MAX_REQUESTS, names.MAX_TOKENS) == (rq.MAX_REQUESTS, rq.MAX_TOKENS)


def test_the_other_subcommands_choices_and_bounds_equal_the_registries():
    pairs = {
        "PLACEMENTS": collide.PLACEMENTS, "MAX_PLANES": collide.MAX_PLANES, "MAX_READ_PAGES": collide.MAX_READ_PAGES,
        "SCHEDULES": workingset.SCHEDULES, "WORKINGSET_MAX_TOKENS": workingset.MAX_TOKENS,
        "ALLOCATIONS": kv_lifetimes.ALLOCATIONS,
        "WRITEBACK_POLICIES": wb.POLICIES, "WRITEBACK_MAX_US": wb.MAX_US, "WRITEBACK_MAX_LAYERS": wb.MAX_LAYERS,
        "WRITEBACK_MAX_COUNT": wb.MAX_COUNT, "WRITEBACK_MAX_ITERATIONS": wb.MAX_ITERATIONS,
        "BACKLOG_MAX_PAGES_PER_ITER": bl.MAX_PAGES_PER_ITER, "BACKLOG_MAX_WINDOW_PAGES": bl.MAX_WINDOW_PAGES,
        "PROFILE_PREFILL_CHUNK": profiler.PREFILL_CHUNK, "PROFILE_QUICK_TOKENS": profiler.QUICK_TOKENS,
        "PROFILE_QUICK_CONTEXTS": profiler.QUICK_CONTEXTS, "PROFILE_QUICK_CHUNK": profiler.QUICK_CHUNK,
        "TUNE_PROBLEMS": problems.NAMES, "ESTIMATORS": ESTIMATORS,
        "TRACE_BASE_URL_ENV": trace_fetch.BASE_URL_ENV, "HBF_PARTS": tuple(hbf_parts.PARTS),
    }
    assert {k: v for k, v in pairs.items() if not _same(getattr(names, k), v)} == {}
    for k in ("MAX_REQUESTS", "MAX_TOKENS"):
        assert _same(getattr(names, k), getattr(rq, k))
