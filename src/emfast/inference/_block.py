"""One block of a prediction: read its input (padded past the volume's border), run the network over its tiles
and their test-time variants in batches, blend, and convert to the output dtype.

A block's result depends only on the block: the same tiles, variants and batches in the same order, every
time. So a resumed run, or one spread over Dask workers, writes the same bytes as one uninterrupted run.
"""
from __future__ import annotations

import threading
from typing import List, Optional

import numpy as np

from .._core.blend import blend_add, blend_finish
from .._core.gather import gather_convert
from ..io import Volume
from ._blend import Weights
from ._model import ModelCaller
from ._tiling import Block, TilePlan
from ._tta import Variant, undo


class BlockPredictor:
    """Everything a block needs. Picklable when the model is: a lazy volume travels as its file and dataset."""

    def __init__(self, volume: Volume, model: ModelCaller, plan: TilePlan, blend: str, variants: List[Variant],
                 scale: float, shift: float, pad: str, fill, batch_size: int, dtype: np.dtype) -> None:
        self.volume, self.model, self.plan = volume, model, plan
        self.weights = Weights(plan, blend)
        self.variants, self.scale, self.shift = variants, scale, shift
        self.pad, self.fill, self.batch_size, self.dtype = pad, fill, batch_size, np.dtype(dtype)
        self.channels: Optional[int] = None  # learned from the first prediction, then enforced
        #: uint8 outputs: values computed, and values outside [0, 1] that the conversion clipped to 0 or 255.
        self.values = self.clipped = 0
        self._scratch = threading.local()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_scratch"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _scratch=threading.local())

    def _buffer(self, name: str, shape: tuple, dtype) -> np.ndarray:
        """A C-contiguous array of ``shape``, reused by this thread from block to block: fresh memory would be
        page-faulted in on every block, a large share of the cost of blending."""
        size = int(np.prod(shape))
        flat = getattr(self._scratch, name, None)
        if flat is None or flat.size < size or flat.dtype != dtype:
            flat = np.empty(size, dtype)
            setattr(self._scratch, name, flat)
        return flat[:size].reshape(shape)

    def read(self, block: Block) -> np.ndarray:
        """The block's input, context included, as the volume's dtype (channels, z, y, x)."""
        corner, extent = self.plan.input_box(block)
        region = np.empty((self.volume.channels,) + extent, self.volume.dtype)
        return self.volume.read_padded(corner, extent, region, self.pad, self.fill)

    def compute(self, block: Block, region: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The block's blended prediction (channels, z, y, x) in the output dtype (uint8: [0, 1] to 0..255),
        written into ``out`` (a flat array of the output dtype, at least that large) if given."""
        plan = self.plan
        corner, _ = plan.input_box(block)
        jobs = [(tuple(int(v) for v in tile), variant) for tile in block.tiles for variant in self.variants]
        sums = weights = None
        for first in range(0, len(jobs), self.batch_size):
            part = jobs[first:first + self.batch_size]
            predictions = self.predict_batch(region, corner, part)
            if sums is None:
                sums = self._buffer("sums", (predictions.shape[1],) + block.shape, np.float64)
                weights = self._buffer("weights", block.shape, np.float32)
                sums.fill(0.0)
                weights.fill(0.0)
            for (tile, variant), prediction in zip(part, predictions):
                weight, (reach_low, reach_high) = self.weights.tile(tile)
                low = [max(r, b) for r, b in zip(reach_low, block.start)]
                high = [min(r, b) for r, b in zip(reach_high, block.stop)]
                if any(lo >= hi for lo, hi in zip(low, high)):
                    continue
                in_tile = tuple(slice(lo - t, hi - t) for lo, hi, t in zip(low, high, tile))
                in_block = tuple(slice(lo - b, hi - b) for lo, hi, b in zip(low, high, block.start))
                blend_add(sums[(slice(None),) + in_block], weights[in_block], weight[in_tile],
                          undo(prediction, variant)[(slice(None),) + in_tile])
        size = sums.size
        result = np.empty(sums.shape, self.dtype) if out is None or out.size < size else out[:size].reshape(sums.shape)
        if self.dtype == np.uint8:
            self._count_clipped(sums, weights)
        return blend_finish(sums, weights, result)

    def _count_clipped(self, sums: np.ndarray, weights: np.ndarray) -> None:
        """Tally the blended values that uint8 cannot hold: those rounding to below 0 or above 255."""
        covered = weights > 0
        values = sums[:, covered] / weights[covered]
        self.values += values.size
        self.clipped += int(np.count_nonzero((values < -0.5 / 255) | (values > 1 + 0.5 / 255)))

    def predict_batch(self, region: np.ndarray, corner, part) -> np.ndarray:
        """The network's predictions for a batch of (tile, variant) jobs, read from ``region``."""
        plan = self.plan
        perms = [variant[0] for _, variant in part]
        shape_in = tuple(plan.patch_in[a] for a in perms[0])
        shape_out = tuple(plan.patch_out[a] for a in perms[0])
        # Reused: the model's predictions (possibly views of its input) are blended before the next batch.
        batch = self._buffer("batch", (len(part), region.shape[0]) + shape_in, np.float32)
        corners = [[t - c - k for t, c, k in zip(tile, corner, plan.context)] for tile, _ in part]
        gather_convert([region] * len(part), corners, perms, [variant[1] for _, variant in part],
                       [self.scale] * len(part), [self.shift] * len(part), batch)
        predictions = self.model(batch, shape_out, self.channels)
        self.channels = predictions.shape[1]
        return predictions
