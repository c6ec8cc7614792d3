"""Blend weights: how much each tile's prediction counts at each of its voxels.

"gaussian" (sigma an eighth of the tile, as nnU-Net) and "bump" (``exp(4 - 1 / (t (1 - t)))``, as chunkflow) fall
off towards a tile's border, where a network sees the least context; "none" gives each voxel to the one tile
that owns it (see :class:`~emfast.inference._tiling.TilePlan`), so predictions are cropped, not mixed.

A tile's weight is the product of three per-axis weights, each its axis' profile rounded to a multiple of
``1 / QUANTUM`` between ``1 / QUANTUM`` and 1. Blocks sum ``weight * prediction`` in float64: such products of
float32 (or float16) predictions are exact, and so are their sums where the predictions agree; the total weight
at a voxel is the product of three per-axis totals (the tiles of a block form a grid), exact too. So where all
overlapping predictions agree, the blended value is that prediction bit for bit, and a block keeps no array of
weight totals.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ._tiling import Block, TilePlan

BLENDS = ("gaussian", "bump", "none")
#: Per-axis blend weights are multiples of 1 / QUANTUM (see the module docstring).
QUANTUM = 256
#: The weights' definition, in every prediction's record: an output started with other weights (emfast before
#: they were per axis) is not resumed with these, whose blocks would differ in the last bits.
WEIGHTS = f"per-axis, 1/{QUANTUM}"

#: One axis of a tile: its weights over ``[low, high)`` (float64), the volume voxels it contributes to.
AxisWeights = Tuple[np.ndarray, int, int]


def profile(blend: str, size: int) -> np.ndarray:
    """The 1-D weight profile of ``blend`` over ``size`` voxels, peaking at 1 in the middle."""
    t = (np.arange(size) + 0.5) / size
    if blend == "gaussian":
        return np.exp(-0.5 * ((t - 0.5) * 8.0) ** 2)
    if blend == "bump":
        return np.exp(4.0 - 1.0 / (t * (1.0 - t)))
    raise ValueError(f"blend must be one of {', '.join(BLENDS)}, got {blend!r}")


def quantised(weights: np.ndarray) -> np.ndarray:
    """``weights`` rounded to multiples of ``1 / QUANTUM``, at least ``1 / QUANTUM`` (every tile counts)."""
    return np.maximum(1.0, np.rint(weights * QUANTUM)) / QUANTUM


class Weights:
    """The per-axis weights of every tile of ``plan``: one quantised profile per axis for "gaussian" and "bump";
    ones over the interval a tile owns for "none"."""

    def __init__(self, plan: TilePlan, blend: str) -> None:
        if blend not in BLENDS:
            raise ValueError(f"blend must be one of {', '.join(BLENDS)}, got {blend!r}")
        profiles = None if blend == "none" else [quantised(profile(blend, size)) for size in plan.patch_out]
        #: Per axis, by tile start: (weights, low, high, first), see :meth:`axis` and :meth:`first`.
        self._axes: List[Dict[int, tuple]] = []
        for axis, starts in enumerate(plan.starts):
            size, entries, previous_high = plan.patch_out[axis], {}, None
            for index, start in enumerate(int(s) for s in starts):
                if profiles is not None:
                    weights, low, high = profiles[axis], start, start + size
                else:  # the interval the tile owns, weight 1
                    low, high = (int(c) for c in plan.cuts[axis][index:index + 2])
                    weights = np.ones(high - low)
                first = low if previous_high is None else max(low, previous_high)
                entries[start] = (weights, low, high, first)
                previous_high = high
            self._axes.append(entries)

    def axis(self, axis: int, start: int) -> AxisWeights:
        """The weights along ``axis`` of the tiles whose output starts at ``start`` there."""
        return self._axes[axis][start][:3]

    def tile(self, start) -> List[AxisWeights]:
        """The weights of the tile whose output starts at ``start`` (z, y, x), per axis."""
        return [self.axis(axis, int(s)) for axis, s in enumerate(start)]

    def first(self, axis: int, start: int) -> int:
        """Along ``axis``, where the tiles starting at ``start`` first reach voxels no tile before them (in the
        plan's order) reached: the end of the previous tile there, or their own low end. A voxel is reached
        first by the tile whose three axes all reach it first (the tiles of a block are a grid, blended in C
        order)."""
        return self._axes[axis][start][3]

    def totals(self, block: Block) -> List[np.ndarray]:
        """Per axis, the sum over the block's tiles of their weights along that axis, over the block (float64,
        exact): the weight total at a voxel is the product of its three axes' totals."""
        totals = []
        for axis in range(3):
            low, high = block.start[axis], block.stop[axis]
            total = np.zeros(high - low)
            for start in np.unique(block.tiles[:, axis]):
                weights, reach_low, reach_high = self.axis(axis, int(start))
                a, b = max(reach_low, low), min(reach_high, high)
                if a < b:
                    total[a - low:b - low] += weights[a - reach_low:b - reach_low]
            totals.append(total)
        return totals
