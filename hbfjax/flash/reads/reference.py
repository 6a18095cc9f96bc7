"""Plain NumPy reference of a random-placement read (DESIGN.md §8 rung 3): the speed baseline of
``make bench`` and an independent check of the plane-load maximum."""

from __future__ import annotations

import numpy as np


def random_read_waves(pages: int, planes: int, streams: int, rng: np.random.Generator) -> np.ndarray:
    """int64[streams]: the most pages on one plane when ``pages`` pages land on uniform random planes."""
    return np.array([np.bincount(rng.integers(0, planes, pages), minlength=planes).max() for _ in range(streams)])
