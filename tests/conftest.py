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
