"""Where windows are cut: samplers turn uniform draws into window corners."""
from __future__ import annotations

import numpy as np


class Sampler:
    """Base class: turns ``draws`` uniforms per example into window corners."""

    name = "sampler"
    draws = 0

    def corners(self, uniforms: np.ndarray, lo: np.ndarray, hi: np.ndarray, extents: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class Uniform(Sampler):
    """Window corners uniformly distributed over every position where the window fits in the region."""

    name = "uniform"
    draws = 3

    def corners(self, uniforms: np.ndarray, lo: np.ndarray, hi: np.ndarray, extents: np.ndarray) -> np.ndarray:
        """Return (B, 3) int64 corners from (B, 3) uniforms, for windows of ``extents`` inside [lo, hi).

        The caller guarantees every window fits (``hi - lo >= extents``).
        """
        positions = hi - lo - extents + 1
        offsets = np.minimum((uniforms * positions).astype(np.int64), positions - 1)
        return lo + offsets

    def __repr__(self) -> str:
        return "Uniform()"
