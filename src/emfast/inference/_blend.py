"""Blend weights: how much each tile's prediction counts at each of its voxels.

"gaussian" (sigma an eighth of the tile, as nnU-Net) and "bump" (``exp(4 - 1 / (t (1 - t)))``, as chunkflow) fall
off towards a tile's border, where a network sees the least context; "none" gives each voxel to the one tile
that owns it (see :class:`~emfast.inference._tiling.TilePlan`), so predictions are cropped, not mixed.

Weights are multiples of ``1 / QUANTUM`` between ``1 / QUANTUM`` and 1; blocks sum ``weight * prediction`` in
float64 and ``weight`` in float32. Such products of float32 (or float16) predictions are exact in float64, and so
are their sums (and the weights' sums in float32), so where all overlapping predictions agree, the blended value
is that prediction bit for bit.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ._tiling import TilePlan

BLENDS = ("gaussian", "bump", "none")
#: Blend weights are multiples of 1 / QUANTUM (see the module docstring).
QUANTUM = 256


def profile(blend: str, size: int) -> np.ndarray:
    """The 1-D weight profile of ``blend`` over ``size`` voxels, peaking at 1 in the middle."""
    t = (np.arange(size) + 0.5) / size
    if blend == "gaussian":
        return np.exp(-0.5 * ((t - 0.5) * 8.0) ** 2)
    if blend == "bump":
        return np.exp(4.0 - 1.0 / (t * (1.0 - t)))
    raise ValueError(f"blend must be one of {', '.join(BLENDS)}, got {blend!r}")


class Weights:
    """The weights of every tile of ``plan``: one quantised template for "gaussian" and "bump"; ones over the box
    a tile owns for "none"."""

    def __init__(self, plan: TilePlan, blend: str) -> None:
        if blend not in BLENDS:
            raise ValueError(f"blend must be one of {', '.join(BLENDS)}, got {blend!r}")
        self._plan = plan
        self._template = None
        if blend != "none":
            z, y, x = (profile(blend, size) for size in plan.patch_out)
            smooth = z[:, None, None] * y[None, :, None] * x[None, None, :]
            self._template = (np.maximum(1.0, np.rint(smooth * QUANTUM)) / QUANTUM).astype(np.float32)

    def tile(self, start: Tuple[int, int, int]) -> Tuple[np.ndarray, Tuple[Tuple[int, ...], Tuple[int, ...]]]:
        """The weights (float32, shape ``patch_out``) of the tile whose output starts at ``start``, and the box
        ``(low, high)`` of volume voxels it contributes to: the whole tile, or with "none" the part it owns (where
        its weights are a read-only 1 that takes no memory)."""
        if self._template is not None:
            return self._template, (tuple(start), tuple(s + p for s, p in zip(start, self._plan.patch_out)))
        low, high = [], []
        for axis, first in enumerate(start):
            index = int(np.searchsorted(self._plan.starts[axis], first))
            low.append(int(self._plan.cuts[axis][index]))
            high.append(int(self._plan.cuts[axis][index + 1]))
        return np.broadcast_to(np.float32(1.0), self._plan.patch_out), (tuple(low), tuple(high))
