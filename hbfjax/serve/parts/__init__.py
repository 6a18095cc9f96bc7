"""The serving mechanisms composed by the engine (:mod:`hbfjax.serve.part` is their protocol): a system's
parts are a tuple of names from :data:`ORDER`, run in that order at every stage of the loop.

============  ===================================================================  ==================
part          what it models                                                       needs
============  ===================================================================  ==================
``tiers``     where each request's KV lives (HBM or HBF), the DASH write path       —
``sessions``  KV retained after a request, reused by later turns, evicted LRU       tiers
``reads``     plane collisions of the HBF KV reads, hot-plane offload               tiers
``writes``    all-HBF programs: immediate, stripes or window-aware writeback       tiers
``sram``      the base-die SRAM's budget and use                                   reads, writes
``reclaim``   read disturb and refresh of the HBF weights, timed in windows or stalls  —
``blocks``    erase blocks of the HBF KV, invalidation, GC and its exposed time    tiers, sessions
============  ===================================================================  ==================
"""

from __future__ import annotations

from hbfjax.serve.parts import blocks, reads, reclaim, sessions, sram, tiers, writes
from hbfjax.validate import ConfigError

ORDER = ("tiers", "sessions", "reads", "writes", "sram", "reclaim", "blocks")
MODULES = {"tiers": tiers, "sessions": sessions, "reads": reads, "writes": writes, "sram": sram, "reclaim": reclaim,
           "blocks": blocks}
NEEDS = {"tiers": (), "sessions": ("tiers",), "reads": ("tiers",), "writes": ("tiers",), "sram": ("reads", "writes"),
         "reclaim": (),
         "blocks": ("tiers", "sessions")}
HBFLEX = ("tiers", "sessions", "reads", "writes", "sram", "blocks")  # HBFlex's systems (reclaim: on request)


def check_parts(names: tuple) -> None:
    """Refuse a parts tuple with an unknown or repeated part, one out of :data:`ORDER`, or one without
    the parts it needs (:data:`NEEDS`)."""
    names = tuple(names)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        raise ConfigError(f"ServeConfig.parts = {names}: unknown part(s) {unknown}; known: {ORDER}")
    if list(names) != sorted(set(names), key=ORDER.index):
        raise ConfigError(f"ServeConfig.parts = {names}: each part once, in the order {ORDER}")
    for n in names:
        missing = [m for m in NEEDS[n] if m not in names]
        if missing:
            raise ConfigError(f"ServeConfig.parts = {names}: part {n!r} needs {missing}")


def in_order(names) -> tuple:
    """``names`` (any order, repeats allowed) as a parts tuple in :data:`ORDER`."""
    return tuple(n for n in ORDER if n in set(names))


def build(name: str, knobs, config, run):
    """The part ``name`` for one stream (its module's ``part(knobs, config, run)``)."""
    return MODULES[name].part(knobs, config, run)
