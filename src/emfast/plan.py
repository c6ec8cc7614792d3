"""Batch plans: where each example's window is cut and how it is transformed.

A plan is a pure function of (seed, epoch, batch index): the producer threads compute plans independently, in
any order, and always get the same ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .augment import Augmentation, Params
from .rng import FIRST_AUGMENT_STREAM, SAMPLER_STREAM, BatchRandom


@dataclass(frozen=True)
class BatchPlan:
    """Everything random about one batch.

    Attributes
    ----------
    epoch, index : int
        Epoch number and batch index within the epoch.
    corners : ndarray, (B, 3) int64
        Low corner (z, y, x) of each example's source window, in raw voxel coordinates.
    extents : ndarray, (B, 3) int64
        Size of each source window along the source axes (the patch, permuted by the transform).
    params : Params
        Per-example axis order, mirrors, and intensity gain/bias.
    """

    epoch: int
    index: int
    corners: np.ndarray
    extents: np.ndarray
    params: Params


def window_extents(patch: Sequence[int], perms: np.ndarray) -> np.ndarray:
    """Source-window extents: output axis j of length patch[j] reads source axis perms[n, j]."""
    extents = np.empty(perms.shape, dtype=np.int64)
    extents[np.arange(len(perms))[:, None], perms] = np.asarray(patch, dtype=np.int64)
    return extents


class Planner:
    """Draws the plan of batch ``index`` of ``epoch`` for windows inside the region [lo, hi)."""

    def __init__(self, *, patch, batch_size: int, sampler, augmentations: Sequence[Augmentation],
                 lo: Sequence[int], hi: Sequence[int], seed: int) -> None:
        self.patch = tuple(patch)
        self.batch_size = batch_size
        self.sampler = sampler
        self.augmentations = list(augmentations)
        self.lo = np.asarray(lo, dtype=np.int64)
        self.hi = np.asarray(hi, dtype=np.int64)
        self.seed = seed

    def plan(self, epoch: int, index: int) -> BatchPlan:
        random = BatchRandom(self.seed, epoch, index, self.batch_size)
        params = Params.identity(self.batch_size)
        for i, augmentation in enumerate(self.augmentations):
            augmentation.apply(random.uniform(FIRST_AUGMENT_STREAM + i, augmentation.draws), params)
        extents = window_extents(self.patch, params.perms)
        corners = self.sampler.corners(random.uniform(SAMPLER_STREAM, self.sampler.draws), self.lo, self.hi,
                                       extents)
        return BatchPlan(epoch=epoch, index=index, corners=corners, extents=extents, params=params)
