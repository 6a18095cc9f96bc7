"""The shipped tuning problems (issue 13), each a module exposing ``make(*, streams, lam, **settings) -> Problem``.

* ``collide-sram``: read waves + λ · SRAM over plane-group size G and hot-plane offload fraction f
  for the attention working set (HBFlex §5.2, Fig. 12, 20);
* ``collide-gc``: read waves against write amplification over G with GC (HBFlex §5.2, §5.4);
* ``dash-split``: the DASH Direct/Relay split and the HBM writeback threshold for a serving run (DASH §V);
* ``hbflex-sram``: the HBFlex base-die SRAM split between offload, prefetch and KV buffering (HBFlex §5.2–5.3).
"""

from __future__ import annotations

import importlib

from hbfjax.validate import ConfigError

MODULES = {"collide-sram": "collide_sram", "collide-gc": "collide_gc", "dash-split": "dash_split",
           "hbflex-sram": "hbflex_sram"}
NAMES = tuple(MODULES)


def make(name: str, **settings):
    """The problem ``name`` built with ``settings`` (streams, lam, …); a ConfigError names the choices."""
    if name not in MODULES:
        raise ConfigError(f"problem = {name!r}: choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"hbfjax.tune.problems.{MODULES[name]}").make(**settings)
