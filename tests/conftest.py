import os

# The suite is mostly XLA compilation: without LLVM's backend optimisation it compiles about a fifth faster
# and runs the small test cases about as fast (measured on tests/test_collide.py + test_gc.py: 63 -> 51 s).
# Set before any test touches a device (the backend reads XLA_FLAGS when it starts).
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

from pathlib import Path

import pytest

from hbfjax.traces import TraceMissing, resolve


def real_trace_or_skip(name: str) -> Path:
    """The real trace ``name`` along the loader's search path, or skip the test with the loader's own
    message (it names the folders looked in and the ``hbfjax traces fetch`` command that gets it)."""
    try:
        return resolve(name)
    except TraceMissing as err:
        pytest.skip(str(err))


@pytest.fixture
def real_trace():
    """``real_trace(name)``: the path of a real trace, or skip (see :func:`real_trace_or_skip`)."""
    return real_trace_or_skip
