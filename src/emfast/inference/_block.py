"""One block of a prediction: read its input (padded past the volume's border), run the network over the tiles
(and their test-time variants) no other block computed, in batches, blend, and convert to the output dtype.

A block's result depends only on the block: the same tiles and variants blended in the same order every time,
whether computed here or kept by the block that shares them (:mod:`~emfast.inference._cache`). So a resumed run,
or one spread over Dask workers, writes the same bytes as one uninterrupted run.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from .._core.blend import blend_add, blend_finish
from .._core.gather import gather_convert
from ..io import Volume
from ._blend import Weights
from ._cache import TileCache
from ._model import ModelCaller
from ._tiling import Block, TilePlan
from ._tta import Variant, undo


class BlockPredictor:
    """Everything a block needs. Picklable when the model is: a lazy volume travels as its file and dataset."""

    def __init__(self, volume: Volume, model: ModelCaller, plan: TilePlan, blend: str, variants: List[Variant],
                 scale: float, shift: float, pad: str, fill, batch_size: int, dtype: np.dtype,
                 cache: Optional[TileCache] = None) -> None:
        self.volume, self.model, self.plan, self.cache = volume, model, plan, cache
        #: Per axis, how many blocks each tile writes into (see :meth:`TilePlan.shared`).
        self.sharing = plan.shared()
        #: Tile variants computed by the model in this process.
        self.tiles_computed = 0
        self._known: Dict[tuple, np.ndarray] = {}
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

    def is_shared(self, key) -> bool:
        """Whether tile ``key`` writes into more than one block (and is kept for the others)."""
        return self.cache is not None and int(np.prod([counts[k] for counts, k in zip(self.sharing, key)])) > 1

    def compute(self, block: Block, region: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The block's blended prediction (channels, z, y, x) in the output dtype (uint8: [0, 1] to 0..255),
        written into ``out`` (a flat array of the output dtype, at least that large) if given.

        Tiles are blended in the plan's order, whichever were computed here and whichever were kept by another
        block, so the sums (and the bytes written) do not depend on the blocks. The model runs on batches of the
        tiles still missing; a shared tile's predictions are kept once all its variants are computed."""
        blender = _Blender(self, block, region)
        for tile in block.tiles:
            tile = tuple(int(v) for v in tile)
            key = self.plan.tile_key(tile)
            kept = self.is_shared(key) and self.cache.has(key)
            for index, variant in enumerate(self.variants):
                known = self._known.get((key, index))
                blender.add(_Job(tile, key, index, variant, KEPT if kept else known))
        blender.flush()
        sums, weights = blender.sums, blender.weights
        size = sums.size
        result = np.empty(sums.shape, self.dtype) if out is None or out.size < size else out[:size].reshape(sums.shape)
        if self.dtype == np.uint8:
            self._count_clipped(sums, weights)
        return blend_finish(sums, weights, result)

    def shared_keys(self, block: Block) -> List[tuple]:
        """The keys of the block's tiles that other blocks share."""
        keys = [self.plan.tile_key(tile) for tile in block.tiles]
        return [key for key in keys if self.is_shared(key)]

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
        self.tiles_computed += len(part)
        return predictions

    def remember(self, tile, prediction: np.ndarray) -> None:
        """Keep the identity variant's ``prediction`` of ``tile`` (the probe's, computed by another predictor and
        counted here), so no block computes it again."""
        self._known[(self.plan.tile_key(tile), 0)] = np.array(prediction)
        self.tiles_computed += 1


#: A job whose prediction another block kept (loaded when it is blended).
KEPT = "kept"


class _Job:
    """One (tile, variant) of a block; ``prediction`` is an array, :data:`KEPT`, or None until computed."""

    __slots__ = ("tile", "key", "index", "variant", "prediction")

    def __init__(self, tile, key, index, variant, prediction) -> None:
        self.tile, self.key, self.index, self.variant, self.prediction = tile, key, index, variant, prediction


class _Blender:
    """A block's sums and weights, fed jobs in the plan's order. Jobs wait until the batch of missing ones
    before them is computed; those ready with none missing before them are blended at once, so only a batch's
    worth of predictions is held."""

    def __init__(self, predictor: BlockPredictor, block: Block, region: np.ndarray) -> None:
        self.predictor, self.block, self.region = predictor, block, region
        self.corner, _ = predictor.plan.input_box(block)
        self.pending: List[_Job] = []
        self.missing = 0
        self.fresh: Dict[tuple, list] = {}  # shared tiles being computed: their variants so far
        self.loaded: Tuple[Optional[tuple], Optional[np.ndarray]] = (None, None)  # the kept tile being blended
        self.sums = self.weights = None

    def add(self, job: _Job) -> None:
        self.pending.append(job)
        if job.prediction is None:
            self.missing += 1
            if self.missing == self.predictor.batch_size:
                self.flush()
        elif not self.missing:
            self.flush()

    def flush(self) -> None:
        """Compute the missing jobs waiting (one batch), then blend every waiting job in order."""
        missing = [job for job in self.pending if job.prediction is None]
        if missing:
            predictions = self.predictor.predict_batch(self.region, self.corner,
                                                       [(job.tile, job.variant) for job in missing])
            for job, prediction in zip(missing, predictions):
                job.prediction = prediction
        for job in self.pending:
            if job.prediction is not KEPT:
                self._keep_if_shared(job)
            self._blend(job)
        self.pending, self.missing = [], 0

    def _keep_if_shared(self, job: _Job) -> None:
        predictor = self.predictor
        if not predictor.is_shared(job.key):
            return
        variants = self.fresh.setdefault(job.key, [None] * len(predictor.variants))
        variants[job.index] = np.array(job.prediction)  # the model's output may be reused by the next batch
        if all(v is not None for v in variants):
            predictor.cache.save(job.key, np.stack(variants))
            del self.fresh[job.key]

    def _prediction(self, job: _Job) -> np.ndarray:
        if job.prediction is not KEPT:
            return job.prediction
        key, kept = self.loaded
        if key != job.key:
            kept = self.predictor.cache.load(job.key)
            self.loaded = (job.key, kept)
        if kept is None:  # removed meanwhile: compute it again (the same values)
            return self.predictor.predict_batch(self.region, self.corner, [(job.tile, job.variant)])[0]
        return kept[job.index]

    def _blend(self, job: _Job) -> None:
        prediction = self._prediction(job)
        block = self.block
        if self.sums is None:
            self.sums = self.predictor._buffer("sums", (prediction.shape[0],) + block.shape, np.float64)
            self.weights = self.predictor._buffer("weights", block.shape, np.float32)
            self.sums.fill(0.0)
            self.weights.fill(0.0)
        weight, (reach_low, reach_high) = self.predictor.weights.tile(job.tile)
        low = [max(r, b) for r, b in zip(reach_low, block.start)]
        high = [min(r, b) for r, b in zip(reach_high, block.stop)]
        if any(lo >= hi for lo, hi in zip(low, high)):
            return
        in_tile = tuple(slice(lo - t, hi - t) for lo, hi, t in zip(low, high, job.tile))
        in_block = tuple(slice(lo - b, hi - b) for lo, hi, b in zip(low, high, block.start))
        blend_add(self.sums[(slice(None),) + in_block], self.weights[in_block], weight[in_tile],
                  undo(prediction, job.variant)[(slice(None),) + in_tile])
