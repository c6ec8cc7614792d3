"""Batch plans: which volume each example comes from, where its window is cut and how it is transformed.

A plan is a pure function of (seed, epoch, batch index, shard): the producer threads compute plans
independently, in any order, and always get the same ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..augment import Augmentation, Params
from ..sampling import Sampler
from ._rng import FIRST_AUGMENT_STREAM, SAMPLER_STREAM, BatchRandom
from ._windows import window_extents


@dataclass(frozen=True)
class BatchPlan:
    """Everything random about one batch.

    Attributes
    ----------
    epoch, index : int
        Epoch number and batch index within the epoch (of this shard).
    corners : ndarray, (B, 3) int64
        Low corner (z, y, x) of each example's *output* window, in its volume's raw voxel coordinates.
    extents : ndarray, (B, 3) int64
        Size of each output window along the source axes (the output patch, permuted by the transform).
    params : Params
        Per-example axis order, mirrors, and intensity gain/bias.
    volumes : ndarray, (B,) int64
        Index of each example's sample in the dataset.
    records : tuple
        What each augmentation's ``apply`` returned (used by pixel-wise augmentations).
    valid : int
        Real examples at the front of the batch (fewer than B only in a tiled sampler's last batch).
    """

    epoch: int
    index: int
    corners: np.ndarray
    extents: np.ndarray
    params: Params
    volumes: Optional[np.ndarray] = None
    records: tuple = field(default=())
    valid: Optional[int] = None

    def __post_init__(self) -> None:
        if self.volumes is None:
            object.__setattr__(self, "volumes", np.zeros(len(self.corners), dtype=np.int64))
        if self.valid is None:
            object.__setattr__(self, "valid", len(self.corners))


class Planner:
    """Draws the plan of batch ``index`` of ``epoch`` with a sampler already bound to the dataset's regions.

    Random streams are keyed by the global batch number ``index * world_size + rank``, so the shards of a
    distributed run draw disjoint batches. With a ``common_grid`` (step (3,), phases (S, 3)), each drawn corner
    snaps down onto its sample's grid ``phases[s] + n * step`` (fields delivered at their own voxel size start on
    their voxels; the regions' low corners lie on that grid, so snapped windows stay inside).
    """

    def __init__(self, *, patch: Sequence[int], batch_size: int, sampler: Sampler,
                 augmentations: Sequence[Augmentation], seed: int, rank: int = 0, world_size: int = 1,
                 common_grid: Optional[tuple] = None) -> None:
        self.patch = tuple(patch)
        self.batch_size = batch_size
        self.sampler = sampler
        self.augmentations = list(augmentations)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.common_grid = common_grid

    def plan(self, epoch: int, index: int) -> BatchPlan:
        random = BatchRandom(self.seed, epoch, index * self.world_size + self.rank, self.batch_size)
        params = Params.identity(self.batch_size)
        records = tuple(augmentation.apply(random.uniform(FIRST_AUGMENT_STREAM + i, augmentation.draws), params)
                        for i, augmentation in enumerate(self.augmentations))
        extents = window_extents(self.patch, params.perms)
        draw = self.sampler.sample(random.uniform(SAMPLER_STREAM, self.sampler.draws), extents, epoch, index)
        corners = draw.corners
        if self.common_grid is not None:
            step, phases = self.common_grid
            corners = corners - (corners - phases[draw.volumes]) % step
        return BatchPlan(epoch=epoch, index=index, corners=corners, extents=extents, params=params,
                         volumes=draw.volumes, records=records, valid=draw.valid)
