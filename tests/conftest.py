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


def _share_read_laws_between_workers() -> None:
    """Tabulate each read law once per ``make test``, not once per worker: the serving tests tabulate the
    same few wave laws (``parts.reads._tabulate``, about 2-3 s each at opt level 0) in both worker
    processes. Under ``make test`` (which sets ``JAX_COMPILATION_CACHE_DIR`` to a folder made for the run)
    a law one worker tabulated is saved there and loaded by the other; the loaded arrays are the saved
    ones bit for bit (np.save), so no test sees a different law. Without that folder nothing changes."""
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not folder:
        return
    import functools
    import hashlib

    import numpy as np

    from hbfjax.flash.reads import wave
    from hbfjax.serve.parts import reads

    tabulate = reads._tabulate.__wrapped__  # the uncached host function of (planes, balanced, scheduled, G, f)

    @functools.lru_cache(maxsize=256)
    def shared(*key):
        path = Path(folder) / f"read-law-{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}.npz"
        try:
            with np.load(path) as saved:
                return wave.WaveTable(**{name: saved[name] for name in wave.WaveTable._fields})
        except (FileNotFoundError, OSError, KeyError, ValueError):
            table = tabulate(*key)
            part = path.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(part, **table._asdict())
            os.replace(part, path)  # atomic: the other worker loads a whole law or none
            return table

    reads._tabulate = shared


_share_read_laws_between_workers()
