import os
from pathlib import Path

import pytest

TRACE_DIR = Path(os.environ.get("HBFJAX_TRACE_DIR", Path(__file__).resolve().parents[2] / "shared" / "traces"))


@pytest.fixture(scope="session")
def trace_dir() -> Path:
    if not TRACE_DIR.exists():
        pytest.skip(f"shared traces not found at {TRACE_DIR}")
    return TRACE_DIR
