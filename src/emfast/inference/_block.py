"""One block of a prediction: read its input (padded past the volume's border), run the network over the tiles
(and their test-time variants) no other block computed, in batches, blend, and convert to the output dtype.

A block's result depends only on the block: the same tiles and variants blended in the same order every time,
whether computed here or kept by the block that shares them (:mod:`~emfast.inference._cache`). So a resumed run,
or one spread over Dask workers, writes the same bytes as one uninterrupted run.

A block runs in parts so that the network never waits (:func:`~emfast.inference._local.run_local`): one thread
*feeds* it (gathers batches of the tiles still missing and submits them to the model), a *blender* blends the
predictions as they come back (every block's, in the plan's order, so a block's blending starts once the previous
block's shared tiles are kept), and its finishing converts the sums. Dask tasks, and
:meth:`BlockPredictor.compute`, do it all on one thread, the model called at once.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Executor, Future, InvalidStateError, wait
from typing import Callable, Dict, List, Optional, Set

import numpy as np

from .._core.blend import TileBlends, blend_finish
from .._core.gather import gather_convert
from ..io import Volume
from ..pipeline import kernel_shift
from ._blend import Weights
from ._cache import TileCache
from ._model import ModelCaller, root_array
from ._tiling import Block, TilePlan
from ._tta import Variant, undo

#: Batches submitted to the model and not yet blended, per block being fed: the model has the next batch ready
#: while the previous one is blended.
BATCHES_AHEAD = 2

#: Runs the model on a gathered batch: ``call(batch, out_shape)`` returns a Future of the predictions.
ModelRunner = Callable[[np.ndarray, tuple], Future]


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
        #: Shared tiles this process submitted to the model: the block that did keeps them before the next
        #: block is finished, so they need not be computed again even if not saved yet.
        self._promised: Set[tuple] = set()
        self.weights = Weights(plan, blend)
        self.variants, self.scale, self.shift = variants, scale, kernel_shift(shift)
        self.pad, self.fill, self.batch_size, self.dtype = pad, fill, batch_size, np.dtype(dtype)
        self.channels: Optional[int] = None  # learned from the first prediction, then enforced
        #: Values computed; uint8 outputs: values outside [0, 1] or NaN that the conversion clipped to 0 or 255
        #: (NaN to 0), and of those the NaN; float outputs: values NaN or infinite (written as they are).
        self.values = self.clipped = self.nans = self.non_finite = 0
        self._pool = _Pool()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_pool"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _pool=_Pool())

    def read(self, block: Block) -> np.ndarray:
        """The block's input, context included, as the volume's dtype (channels, z, y, x): of an in-memory volume,
        where no padding is needed, a view of it (the gather kernels read any strides; a copy cost a pass over
        the input)."""
        corner, extent = self.plan.input_box(block)
        if self.volume.in_memory and all(0 <= c and c + e <= s for c, e, s in zip(corner, extent, self.volume.shape)):
            return self.volume.array[(slice(None),) + tuple(slice(c, c + e) for c, e in zip(corner, extent))]
        region = np.empty((self.volume.channels,) + extent, self.volume.dtype)
        return self.volume.read_padded(corner, extent, region, self.pad, self.fill)

    def is_shared(self, key) -> bool:
        """Whether tile ``key`` writes into more than one block (and is kept for the others)."""
        z, y, x = (int(counts[k]) for counts, k in zip(self.sharing, key))
        return self.cache is not None and z * y * x > 1

    def shared_keys(self, block: Block) -> List[tuple]:
        """The keys of the block's tiles that other blocks share."""
        keys = [self.plan.tile_key(tile) for tile in block.tiles]
        return [key for key in keys if self.is_shared(key)]

    def compute(self, block: Block, region: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The block's blended prediction (channels, z, y, x) in the output dtype (uint8: [0, 1] to 0..255),
        written into ``out`` (a flat array of the output dtype, at least that large) if given; the model is
        called on this thread."""
        run = self.feed(block, region, self.call_now)
        return run.finish(out)

    def feed(self, block: Block, region: np.ndarray, run_model: ModelRunner, blender: Optional[Executor] = None,
             helpers: Optional["BlendHelpers"] = None, carry: Optional["Carry"] = None) -> "BlockRun":
        """Submit the block's missing tiles to ``run_model`` in batches, blending whatever came back while more
        than :data:`BATCHES_AHEAD` are out; returns the run, for :meth:`BlockRun.finish`. With ``blender`` (a
        one-thread executor blending every block's groups, in order) the groups are blended there as the model
        returns them, and this thread only feeds the model, waiting while more than :data:`BATCHES_AHEAD` batches
        are queued; ``helpers`` blend rows of the block beside the blender.

        With ``carry`` (a blender's run over several blocks), a batch the block's last tiles leave partly empty
        is filled by the next block's first, see :class:`Carry`.

        Tiles are blended in the plan's order, whichever were computed here and whichever were kept by another
        block, so the sums (and the bytes written) do not depend on the blocks."""
        run = BlockRun(self, block, region, run_model, blender, helpers, carry)
        for tile in block.tiles:
            tile = tuple(int(v) for v in tile)
            key = self.plan.tile_key(tile)
            shared = self.is_shared(key)
            kept = shared and (key in self._promised or self.cache.has(key))
            for index, variant in enumerate(self.variants):
                known = self._known.get((key, index))
                run.add(_Job(tile, key, index, variant, KEPT if kept else known))
            if shared:
                self._promised.add(key)
        run.close_group(last=True)
        return run

    def call_now(self, batch: np.ndarray, out_shape: tuple) -> Future:
        """Run the model on this thread (a Future already resolved)."""
        future: Future = Future()
        future.set_result(self.model(batch, out_shape, self.channels))
        return future

    def gather(self, region: np.ndarray, corner, part, batch: np.ndarray) -> tuple:
        """Fill ``batch`` with the network's inputs for ``part``, (tile, variant) jobs read from ``region``;
        returns the output shape of the batch's tiles."""
        plan = self.plan
        perms = [variant[0] for _, variant in part]
        corners = [[t - c - k for t, c, k in zip(tile, corner, plan.context)] for tile, _ in part]
        gather_convert([region] * len(part), corners, perms, [variant[1] for _, variant in part],
                       [self.scale] * len(part), [self.shift] * len(part), batch)
        self.tiles_computed += len(part)
        return tuple(plan.patch_out[a] for a in perms[0])

    def batch_shape(self, part, channels: int) -> tuple:
        return (len(part), channels) + tuple(self.plan.patch_in[a] for a in part[0][1][0])

    def predict_batch(self, region: np.ndarray, corner, part) -> np.ndarray:
        """The network's predictions for a batch of (tile, variant) jobs, read from ``region`` (on this thread)."""
        batch = np.empty(self.batch_shape(part, region.shape[0]), np.float32)
        predictions = self.model(batch, self.gather(region, corner, part, batch), self.channels)
        self.channels = predictions.shape[1]
        return predictions

    def lend_batches(self, slots: List[np.ndarray]) -> None:
        """Gather batches into ``slots`` (flat float32 arrays, page-locked host slots of a device) while one is
        free, until :meth:`return_lent`."""
        for slot in slots:
            self._pool.give("batch", slot)

    def return_lent(self) -> None:
        """Let go of the pooled arrays, the lent slots among them, before their device closes: page-locked memory
        that dies after its context is detached is never freed (pycuda skips it), and the predictor outlived the
        device, holding them, every predict() on a GPU (a review of the fake device's rules)."""
        self._pool = _Pool()

    def give_back_kept(self, kept: Optional[np.ndarray]) -> None:
        """Reuse the memory of a shared tile's predictions (from :meth:`TileCache.discard`) for the next one."""
        if kept is not None:
            self._pool.give(KEPT, kept)

    def remember(self, tile, prediction: np.ndarray) -> None:
        """Keep the identity variant's ``prediction`` of ``tile`` (the probe's, computed by another predictor and
        counted here), so no block computes it again."""
        self._known[(self.plan.tile_key(tile), 0)] = np.array(prediction)
        self.tiles_computed += 1

    def _count_clipped(self, sums: np.ndarray, totals: List[np.ndarray]) -> None:
        """Tally the blended values that uint8 cannot hold: those rounding to below 0 or above 255."""
        tz, ty, tx = totals
        values = sums / ((len(self.variants) * tz)[:, None, None] * ty[None, :, None] * tx[None, None, :])
        nans = int(np.count_nonzero(np.isnan(values)))
        self.values += values.size
        self.clipped += int(np.count_nonzero((values < -0.5 / 255) | (values > 1 + 0.5 / 255))) + nans
        self.nans += nans


#: Fresh arrays of a pool are cut, several at once, from one allocation (a slab) of at most this size, where
#: that makes one of at least :data:`HUGE_PAGES_FROM`: a shared tile copied into new memory costs a third as much
#: when the kernel backs it with huge pages (a 2 MiB array of its own is 512 page faults, each clearing a page).
SLAB_BYTES = 16 << 20
#: The size from which NumPy asks the kernel for huge pages.
HUGE_PAGES_FROM = 4 << 20
#: At most this many arrays are cut from one slab (free arrays are looked through one by one).
SLAB_ARRAYS = 8


class _Pool:
    """Arrays handed back for reuse (batches, sums): fresh memory would be page-faulted in on every block, a
    large share of the cost of blending. Thread-safe."""

    def __init__(self) -> None:
        self._free: Dict[tuple, List[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, name: str, shape: tuple, dtype) -> np.ndarray:
        size = int(np.prod(shape))
        with self._lock:
            free = self._free.setdefault((name, np.dtype(dtype).str), [])
            index = next((i for i, f in enumerate(free) if f.size >= size), None)
            flat = None if index is None else free.pop(index)
        if flat is None:
            flat = self._fresh(name, size, np.dtype(dtype))
        return flat[:size].reshape(shape)

    def _fresh(self, name: str, size: int, dtype: np.dtype) -> np.ndarray:
        """A new flat array of ``size`` elements; the others cut from its slab go on the free list. They view the
        slab through a memoryview, so each is the base of what :meth:`take` hands out of it, and the slab is
        freed once none of them is left."""
        count = min(SLAB_ARRAYS, SLAB_BYTES // max(1, size * dtype.itemsize))
        if count < 2 or count * size * dtype.itemsize < HUGE_PAGES_FROM:
            return np.empty(size, dtype)
        slab = memoryview(np.empty(count * size, dtype))
        arrays = [np.frombuffer(slab, dtype, size, i * size * dtype.itemsize) for i in range(count)]
        with self._lock:
            self._free.setdefault((name, dtype.str), []).extend(arrays[1:])
        return arrays[0]

    def give(self, name: str, array: np.ndarray) -> None:
        flat = root_array(array)  # the array take cut its view from
        with self._lock:
            self._free.setdefault((name, flat.dtype.str), []).append(flat)


#: A job whose prediction another block kept (loaded when it is blended).
KEPT = "kept"


class _Job:
    """One (tile, variant) of a block; ``prediction`` is an array, :data:`KEPT`, or None until computed."""

    __slots__ = ("tile", "key", "index", "variant", "prediction")

    def __init__(self, tile, key, index, variant, prediction) -> None:
        self.tile, self.key, self.index, self.variant, self.prediction = tile, key, index, variant, prediction


class _Group:
    """Jobs blended together: those ready, and at most one batch computed by the model (``future``), whose
    predictions from ``offset`` on are the group's; ``batch`` is handed back once the group is blended (None when
    a later group shares it)."""

    __slots__ = ("jobs", "future", "batch", "offset")

    def __init__(self, jobs: List[_Job], future: Optional[Future], batch: Optional[np.ndarray],
                 offset: int = 0) -> None:
        self.jobs, self.future, self.batch, self.offset = jobs, future, batch, offset


class _SharedBatch:
    """A batch begun by a block's last group (``first``) and finished by the next block's first. Its ``future``
    exists from the start (the first group is queued for blending with it) and takes the model's result once the
    batch is submitted. The batch is handed back by the last group blended that holds it."""

    __slots__ = ("batch", "count", "out_shape", "first", "future")

    def __init__(self, batch: np.ndarray, count: int, out_shape: tuple, first: _Group) -> None:
        self.batch, self.count, self.out_shape, self.first = batch, count, out_shape, first
        self.future: Future = _CarriedFuture()
        first.future, first.batch = self.future, batch

    def _settle(self, done: Future) -> None:
        try:
            if done.cancelled():
                self.future.cancel()
            elif done.exception() is not None:
                self.future.set_exception(done.exception())
            else:
                self.future.set_result(done.result())
        except InvalidStateError:  # cancelled by Carry.abandon meanwhile (an error): nobody waits for it now
            pass


class _CarriedFuture(Future):
    """The future of a batch two blocks share: cancelled by its :class:`Carry` only, never by one block's
    :meth:`BlockRun.release` (the other block's group waits on it, and would report a cancellation instead of
    the error that ended the first block)."""


class Carry:
    """Batches spanning blocks, for a run that feeds blocks one after another (:func:`~emfast.inference._local.
    run_local`): a block whose missing tiles end in a partial batch leaves it here, and the next block's first
    missing tiles fill it before it is submitted. A device computes a whole batch whatever it holds (a CUDA
    graph replays its whole slot), so each block's partial batch would cost a whole one. A batch spans at most
    two blocks: the next block submits it at its end, filled or not, and :meth:`flush` submits what is left.
    Every call holds ``batch_size`` tiles (:class:`~emfast.inference._model.ModelCaller` fills a short one with
    zero tiles), so a tile's predictions do not depend on the batch it is in, and neither do the bytes written."""

    def __init__(self) -> None:
        self.pending: Optional[_SharedBatch] = None  # the last block's, for the next block to fill
        self._unsubmitted: List[_SharedBatch] = []

    def begin(self, batch: np.ndarray, count: int, out_shape: tuple, group: _Group) -> None:
        self.pending = _SharedBatch(batch, count, out_shape, group)
        self._unsubmitted.append(self.pending)

    def submit(self, shared: _SharedBatch, run_model: ModelRunner) -> None:
        if self.pending is shared:
            self.pending = None
        run_model(shared.batch[:shared.count], shared.out_shape).add_done_callback(shared._settle)
        self._unsubmitted.remove(shared)  # only now: if the submission failed (Ctrl-C), abandon() cancels it

    def flush(self, run_model: ModelRunner) -> None:
        """Submit the batches begun and not yet submitted."""
        for shared in list(self._unsubmitted):
            self.submit(shared, run_model)

    def abandon(self) -> None:
        """After an error: the batches not submitted never are, and a blending waiting for one sees it
        cancelled."""
        unsubmitted, self._unsubmitted, self.pending = self._unsubmitted, [], None
        for shared in unsubmitted:
            shared.future.cancel()


class BlockRun:
    """A block's sums, fed jobs in the plan's order. Jobs are grouped: a group closes when it holds a
    batch of missing jobs (submitted to the model) or when a ready job has none missing before it; groups are
    blended in order (on the feeding thread, or on a blender: see :meth:`BlockPredictor.feed`), so only a few
    batches' predictions are held at once."""

    def __init__(self, predictor: BlockPredictor, block: Block, region: np.ndarray, run_model: ModelRunner,
                 blender: Optional[Executor] = None, helpers: Optional["BlendHelpers"] = None,
                 carry: Optional[Carry] = None) -> None:
        self.predictor, self.block, self.region, self.run_model = predictor, block, region, run_model
        self.blender, self.helpers, self.carry = blender, helpers, carry
        #: The previous block's partial batch, which this block's first missing tiles fill.
        self.continued: Optional[_SharedBatch] = None if carry is None else carry.pending
        self.blending: Optional[Future] = None  # on the blender: the blending of the last group queued
        self.blended = threading.Condition()  # a group was blended on the blender, or a blending ended
        self.failed: Optional[BaseException] = None  # what a blending on the blender raised
        self.corner, _ = predictor.plan.input_box(block)
        self.open: List[_Job] = []
        self.missing = 0
        self.groups: deque = deque()
        self.fresh: Dict[tuple, tuple] = {}  # shared tiles being computed: (their variants, how many so far)
        self.loaded: tuple = (None, None)  # the kept tile being blended: (key, predictions)
        self.sums = None

    def add(self, job: _Job) -> None:
        self.open.append(job)
        if job.prediction is None:
            self.missing += 1
            if self.missing == self.predictor.batch_size - (0 if self.continued is None else self.continued.count):
                self.close_group()
        elif not self.missing:
            self.close_group()

    def close_group(self, last: bool = False) -> None:
        """Submit the open group's missing jobs (``last``: the block's last group, whose partial batch a
        :class:`Carry` keeps for the next block); then blend groups here while too many are out or the oldest is
        in, or, with a blender, queue the group for it and wait while more than :data:`BATCHES_AHEAD` batches are
        queued."""
        part = [(job.tile, job.variant) for job in self.open if job.prediction is None]
        if part:
            self.groups.append(self._submit(part, last))
        elif self.open:
            self.groups.append(_Group(self.open, None, None))
        if last and self.continued is not None:  # a batch spans two blocks at most
            self.carry.submit(self.continued, self.run_model)
            self.continued = None
        if not self.open:
            return
        self.open, self.missing = [], 0
        if self.blender is None:
            while self.groups and (self._batches_out() > BATCHES_AHEAD or self._oldest_ready()):
                self._blend_group(self.groups.popleft())
            return
        self.blending = self.blender.submit(self._blend_queued)  # takes every group queued before it, or fails
        with self.blended:
            # Batches, not groups: a group of kept tiles holds no batch, and counting it would leave the model
            # without its next batch behind a row of them.
            self.blended.wait_for(lambda: self._batches_out() <= BATCHES_AHEAD or self.failed is not None)
        if self.failed is not None:
            raise self.failed

    def _submit(self, part: List[tuple], last: bool) -> _Group:
        """The open group, its missing jobs ``part`` gathered into a batch: submitted to the model, or continuing
        the previous block's batch, or (``last``, partial) left in the carry for the next block."""
        predictor = self.predictor
        shape = predictor.batch_shape(part, self.region.shape[0])
        shared, group = self.continued, _Group(self.open, None, None)
        if shared is not None and shared.batch.shape[1:] != shape[1:]:  # tiles of another shape: not in one batch
            self.carry.submit(shared, self.run_model)
            self.continued = shared = None
        if shared is not None:
            self.continued = None
            predictor.gather(self.region, self.corner, part, shared.batch[shared.count:shared.count + len(part)])
            group.future, group.batch, group.offset = shared.future, shared.batch, shared.count
            shared.first.batch = None  # handed back by this group, blended after the first
            shared.count += len(part)
            self.carry.submit(shared, self.run_model)
        elif last and self.carry is not None and len(part) < predictor.batch_size:
            batch = predictor._pool.take("batch", (predictor.batch_size,) + shape[1:], np.float32)
            out_shape = predictor.gather(self.region, self.corner, part, batch[:len(part)])
            self.carry.begin(batch, len(part), out_shape, group)
        else:
            group.batch = predictor._pool.take("batch", shape, np.float32)
            group.future = self.run_model(group.batch, predictor.gather(self.region, self.corner, part, group.batch))
        return group

    def _blend_queued(self) -> None:
        """On the blender: blend the groups queued, in order, each once the model has returned its batch. After a
        failure (the model's error, say) nothing more is blended, and the error is raised again by every later
        blending and by :meth:`finish`: the block must not be finished without the group that failed."""
        try:
            if self.failed is not None:
                raise self.failed
            while True:
                with self.blended:  # the feeding thread counts the queued batches under this lock
                    if not self.groups:
                        break
                    group = self.groups.popleft()
                self._blend_group(group)
                with self.blended:
                    self.blended.notify()
        except BaseException as error:
            self.failed = error
            raise
        finally:
            with self.blended:
                self.blended.notify()

    def _batches_out(self) -> int:
        return sum(group.future is not None for group in self.groups)

    def _oldest_ready(self) -> bool:
        """Whether the oldest group can be blended without waiting for its batch: waiting here would leave the
        model without its next batch."""
        oldest = self.groups[0]
        return oldest.future is None or oldest.future.done()

    def finish(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Blend what is left and convert: the block's prediction (see :meth:`BlockPredictor.compute`). With a
        blender, this waits for it to blend the block's last group (submitted by the feeding thread, so before
        any group of the next block: the blender blends every block's groups in the plan's order)."""
        try:
            if self.blending is not None:  # the last group's blending, behind this block's others
                self.blending.result()
            if self.failed is not None:
                raise self.failed
            while self.groups:
                self._blend_group(self.groups.popleft())
            predictor, sums = self.predictor, self.sums
            size = sums.size
            result = (np.empty(sums.shape, predictor.dtype) if out is None or out.size < size
                      else out[:size].reshape(sums.shape))
            totals = predictor.weights.totals(self.block)
            if predictor.dtype == np.uint8:
                predictor._count_clipped(sums, totals)
            non_finite = blend_finish(sums, totals, len(predictor.variants), result)
            if predictor.dtype != np.uint8:
                predictor.values += size
                predictor.non_finite += non_finite
            return result
        finally:
            self.release()

    def release(self) -> None:
        """Hand the sums and the batches back (after an error too)."""
        pool = self.predictor._pool
        for group in self.groups:
            if group.future is not None and not isinstance(group.future, _CarriedFuture):
                group.future.cancel()
        if self.sums is not None:
            pool.give("sums", self.sums)
            self.sums = None

    def _blend_group(self, group: _Group) -> None:
        if group.future is not None:
            predictions = iter(group.future.result()[group.offset:])
            for job in group.jobs:
                if job.prediction is None:
                    job.prediction = next(predictions)
        complete: List[tuple] = []  # (key, predictions) of shared tiles whose every variant is in this group
        blends = [(job, self._prediction(job), None if job.prediction is KEPT else self._keep_if_shared(job, complete))
                  for job in group.jobs]
        if self.sums is None:  # not cleared: each voxel's first tile sets it (see blend_add)
            channels = blends[0][1].shape[0]
            self.sums = self.predictor._pool.take("sums", (channels,) + self.block.shape, np.float64)
        tiles = TileBlends()
        for job, prediction, keep in blends:
            self._add_tile(tiles, job, prediction, keep)
        if self.helpers is None:
            tiles.run()
        else:
            self.helpers.run(tiles.run)
        for key, kept in complete:
            if not self.predictor.cache.save(key, kept):  # written to the folder: its memory takes the next one
                self.predictor.give_back_kept(kept)
        if group.batch is not None:  # the predictions may be views of it: reused only now
            self.predictor._pool.give("batch", group.batch)

    def _keep_if_shared(self, job: _Job, complete: List[tuple]) -> Optional[np.ndarray]:
        """Where to copy the prediction of a tile that later blocks share (its rows are copied with its blending,
        :meth:`_add_tile`: the model's output may be a view of a batch reused next), or None; a tile with all
        its variants kept goes on ``complete``, to be saved once copied."""
        predictor = self.predictor
        if not predictor.is_shared(job.key):
            return None
        count = len(predictor.variants)
        kept, done = self.fresh.get(job.key) or (predictor._pool.take(KEPT, (count,) + job.prediction.shape,
                                                                      job.prediction.dtype), 0)
        if done + 1 == count:
            complete.append((job.key, kept))
            self.fresh.pop(job.key, None)
        else:
            self.fresh[job.key] = (kept, done + 1)
        return kept[job.index]

    def _prediction(self, job: _Job) -> np.ndarray:
        if job.prediction is not KEPT:
            return job.prediction
        key, kept = self.loaded
        if key != job.key:
            kept = self.predictor.cache.load(job.key)
            self.loaded = (job.key, kept)
        if kept is None:  # not saved (a full disk) or removed meanwhile: compute it again (the same values)
            kept = self._computed_again(job.tile)
            self.loaded = (job.key, kept)
        return kept[job.index]

    def _computed_again(self, tile) -> List[np.ndarray]:
        """The predictions of every variant of a kept tile that could not be loaded (the block blends them all),
        computed in batches of ``batch_size``: one call per variant would fill each with zero tiles."""
        predictor, predictions = self.predictor, []
        jobs = [(tile, variant) for variant in predictor.variants]
        for start in range(0, len(jobs), predictor.batch_size):
            part = jobs[start:start + predictor.batch_size]
            batch = np.empty(predictor.batch_shape(part, self.region.shape[0]), np.float32)
            predictions.extend(self.run_model(batch, predictor.gather(self.region, self.corner, part, batch)).result())
        return predictions

    def _add_tile(self, tiles: TileBlends, job: _Job, prediction: np.ndarray, keep: Optional[np.ndarray]) -> None:
        """Add the job's tile, where it reaches into the block, to the group's ``tiles``, and its copy into
        ``keep`` if later blocks share it (made with the blending, split by rows as it is: the model's output may
        be a view of a batch reused next)."""
        block, weights = self.block, self.predictor.weights
        axes = weights.tile(job.tile)
        low = [max(reach, b) for (_, reach, _), b in zip(axes, block.start)]
        high = [max(lo, min(reach, b)) for (_, _, reach), b, lo in zip(axes, block.stop, low)]  # empty: copy only
        in_tile = tuple(slice(lo - t, hi - t) for lo, hi, t in zip(low, high, job.tile))
        in_block = tuple(slice(lo - b, hi - b) for lo, hi, b in zip(low, high, block.start))
        along = [w[lo - reach:hi - reach] for (w, reach, _), lo, hi in zip(axes, low, high)]
        first = ((0, 0, 0), (0, 0, 0))
        if job.index == 0:  # the voxels this tile reaches first: set, not added to (its later variants add)
            first = ([max(0, weights.first(a, t) - lo) for a, (t, lo) in enumerate(zip(job.tile, low))],
                     [hi - lo for lo, hi in zip(low, high)])
        tiles.add(self.sums[(slice(None),) + in_block], along, undo(prediction, job.variant)[(slice(None),) + in_tile],
                  first, low[1] - block.start[1], keep, None if keep is None else prediction)


class BlendHelpers:
    """Threads that blend a block beside the blender, each its own rows (see :class:`~emfast._core.blend.TileBlends`):
    blending one tile reads and writes several times its bytes, more than one core's memory bandwidth keeps up
    with on a GPU that predicts a few hundred tiles a second.

    Parameters
    ----------
    parts : int
        Rows are split into this many parts; the calling thread blends the first, ``parts - 1`` threads the rest.
    executor : Executor
        Runs the other parts (``parts - 1`` threads).
    """

    def __init__(self, parts: int, executor: Executor) -> None:
        self.parts, self.executor = parts, executor

    def run(self, blend_part: Callable[[int, int], None]) -> None:
        """``blend_part(part, parts)`` for every part at once; returns when all are done, raising the first
        error."""
        others = [self.executor.submit(blend_part, part, self.parts) for part in range(1, self.parts)]
        try:
            blend_part(0, self.parts)
        finally:
            wait(others)  # every part has stopped writing the sums before they are used or handed back
        for other in others:
            other.result()
