"""Where a result came from: hbfjax's version and a digest of its sources, JAX, the devices and
processes that computed it (DESIGN.md §6: every sweep row carries it)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import jax

import hbfjax

ROOT = Path(hbfjax.__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def source_digest(folders: tuple[str, ...] = ("hbfjax",)) -> str:
    """First 16 hex digits of a SHA-256 over every ``.py`` file under ``folders`` (relative to the repo root),
    path and contents, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for d in folders for p in (ROOT / d).rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def provenance() -> dict:
    """hbfjax_version, source_digest (of ``hbfjax/``), jax_version, device_kind (of the first device),
    device_count (every process's), process_count."""
    device = jax.devices()[0]
    return {"hbfjax_version": hbfjax.__version__, "source_digest": source_digest(), "jax_version": jax.__version__,
            "device_kind": f"{device.platform}:{device.device_kind}", "device_count": jax.device_count(),
            "process_count": jax.process_count()}
