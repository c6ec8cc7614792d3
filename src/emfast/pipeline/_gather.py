"""Turning a batch plan into output arrays: one kernel call per field, then the pixel-wise augmentations and the
targets. Windows of lazy volumes are read in place from their chunk caches' blocks, pinned while the kernel runs;
only warped batches, and fields mixing lazy and in-memory volumes, read lazy windows into buffers first.

Geometry. A plan places each example's *output* window (``patch_out``) in its volume. Every field is a window
of its own size centred on it: the raw input (``patch_in``, larger by the network's context), the labels (the
output window grown by the targets' margin), the mask (the output window; grown like the labels where a target
masks itself with it). A field's window starts at
``offset`` from the output window's corner, per output axis; for transposed examples offsets and extents are
permuted into source axes like the patch itself.

Fields at other voxel sizes than raw (see ``_fields``): on raw's grid their sources are views that resample them,
labels and masks by one rescale kernel call per example that also mirrors and transposes, extra channels read like
lazy volumes into buffers (interpolated) and then converted; under warps every view is read like a lazy volume. At
their own voxel size (``Field.grids``) the window corners are converted into the field's voxels and the kernels
read the stored volume.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .._core import gather as _gather
from ..augment import Patches, WarpPlan, warp_labels, warp_raw
from ..io import mapped_empty
from ..sampling import OnRawGrid, Placed
from ..targets import Target, compute_targets
from ._normalize import kernel_shift
from ._plan import BatchPlan
from ._profile import Profile
from ._windows import window_extents


def nbytes(shape: Sequence[int], dtype) -> int:
    """Bytes of an array of ``shape`` and ``dtype``, exact for any size (Python ints, no int64 overflow)."""
    return math.prod(int(n) for n in shape) * np.dtype(dtype).itemsize


@dataclass
class Field:
    """One window of a batch, cut from the same kind of volume in every sample.

    Attributes
    ----------
    name : str
        Batch field name (``raw``, an extra channel's name, ``labels``, ``mask``).
    sources : list of Placed
        Per sample of the dataset, the volume and its origin in raw voxel coordinates.
    dtype : numpy.dtype
        Output dtype.
    patch : tuple of int
        Window size along the output axes.
    offset : tuple of int
        Window corner relative to the output window's corner, along the output axes.
    normalization : ndarray (S, 2) or None
        Per sample ``(scale, shift)`` for converted fields; None for fields copied bit for bit.
    intensity : bool
        Whether the per-example intensity augmentation (gain, bias) applies (raw only).
    delivered : bool
        Whether the field is a batch array (else a per-thread intermediate, e.g. labels with a target margin).
    grids : list of FieldGrid or None
        For a field delivered at its own voxel size, per sample its grid relative to raw's; ``patch`` is then in
        the field's voxels and ``offset`` still in raw voxels. None on raw's grid.
    """

    name: str
    sources: List[Placed]
    dtype: np.dtype
    patch: tuple
    offset: tuple
    normalization: Optional[np.ndarray] = None
    intensity: bool = False
    delivered: bool = True
    grids: Optional[list] = None

    @property
    def channels(self) -> int:
        return self.sources[0].volume.channels

    @property
    def convert(self) -> bool:
        return self.normalization is not None

    def shape(self, batch_size: int) -> tuple:
        return (batch_size, self.channels) + tuple(self.patch)

    @functools.cached_property
    def lazy(self) -> bool:
        return any(not placed.volume.in_memory for placed in self.sources)

    @functools.cached_property
    def chunked(self) -> bool:
        """Every volume is lazy: windows are gathered straight from the chunk caches' blocks (asked per batch, so
        computed once)."""
        return all(placed.volume.chunk_cache is not None for placed in self.sources)

    @functools.cached_property
    def resampled(self) -> bool:
        """Every source is a view resampled onto raw's grid by nearest neighbour: each example is written by one
        kernel call that resamples, mirrors and transposes at once."""
        return all(isinstance(p.volume, OnRawGrid) and not p.volume.linear for p in self.sources)

    @property
    def staged(self) -> bool:
        """Some volumes are lazy and some in memory: lazy windows are read into buffers first."""
        return self.lazy and not self.chunked


class Gatherer:
    """Fills a slot's arrays with the windows of a plan, then augments and computes targets.

    Parameters
    ----------
    fields : list of Field
        Windows to cut, in order. The labels field (if any) is named ``"labels"``.
    batch_size : int
        Examples per batch.
    patch_out : tuple of int
        Output window (z, y, x): the size of the delivered labels, mask and targets.
    pixelwise : list of (int, Augmentation)
        Pixel-wise augmentations with their position in the plan's records, run in order after cropping.
    targets : list of Target
        Targets computed from the (augmented) labels.
    margin : tuple of int
        The targets' margin: the labels field (and the mask, for targets with ``labels_mask``) is cut ``margin``
        larger on each side than ``patch_out``.
    warps : bool
        Whether an augmentation moves voxels off the grid (rotation, scaling, elastic): batches with an example it
        moved are sampled by the warp kernels.
    keep_labels : bool
        Deliver the labels themselves (else only what is computed from them).
    track_valid : bool
        Deliver ``labels_valid`` (1 where the label is known): needed when augmentations can move voxels from
        outside the data into the window. Affinities touching an unknown voxel are masked as well.
    """

    def __init__(self, fields: List[Field], batch_size: int, patch_out: Sequence[int],
                 pixelwise: Sequence[tuple] = (), targets: Sequence[Target] = (),
                 margin: Sequence[int] = (0, 0, 0), warps: bool = False,
                 keep_labels: bool = True, track_valid: bool = False) -> None:
        self.fields = fields
        self.batch_size = batch_size
        self.patch_out = tuple(patch_out)
        self.pixelwise = list(pixelwise)
        self.targets = list(targets)
        self.margin = tuple(int(m) for m in margin)
        self.warps = warps
        self.keep_labels = keep_labels
        self._by_name = {f.name: f for f in fields}
        self.track_valid = track_valid and "labels" in self._by_name
        #: The targets' unlabelled ids, where an augmentation changes the labels they are read from.
        self._unlabelled_ids = sorted({t.unlabelled for t in self.targets if t.unlabelled is not None}) \
            if any(a.changes_labels for _, a in self.pixelwise) else []
        self._target_fields = {}
        for target in self.targets:
            for name, (channels, dtype) in target.outputs().items():
                self._target_fields[name] = ((batch_size, channels) + self.patch_out, dtype)

    def output_fields(self) -> Dict[str, tuple]:
        """Batch field name -> (shape, dtype), in delivery order."""
        shapes = {f.name: (f.shape(self.batch_size), np.dtype(f.dtype)) for f in self.fields if f.delivered}
        if self.keep_labels and "labels" in self._by_name and not self._by_name["labels"].delivered:
            shapes["labels"] = ((self.batch_size, 1) + self.patch_out, np.dtype(self._by_name["labels"].dtype))
        if "mask" in self._by_name and not self._by_name["mask"].delivered:  # cut like the labels for targets
            shapes["mask"] = ((self.batch_size, 1) + self.patch_out, np.dtype(self._by_name["mask"].dtype))
        if self.track_valid:
            shapes["labels_valid"] = ((self.batch_size, 1) + self.patch_out, np.dtype(np.uint8))
        shapes.update({name: (shape, np.dtype(dtype)) for name, (shape, dtype) in self._target_fields.items()})
        return shapes

    def allocate(self) -> Dict[str, np.ndarray]:
        """New output arrays for one slot, with their pages already mapped (no first-touch cost mid-stream), each
        in a mapping of its own, given back to the system when the slot is freed (see
        :func:`~emfast.io.mapped_empty`)."""
        arrays = {name: mapped_empty(shape, dtype, f"a batch slot's {name!r}")
                  for name, (shape, dtype) in self.output_fields().items()}
        for array in arrays.values():
            array.fill(0)
        return arrays

    def slot_bytes(self) -> int:
        """Bytes of one slot's arrays, in Python ints (a NumPy product of a huge batch overflows to nonsense)."""
        return sum(nbytes(shape, dtype) for shape, dtype in self.output_fields().values())

    def scratch_bytes(self) -> int:
        """Bytes of one producer thread's :meth:`new_scratch`, in Python ints."""
        total = 0
        for f in self.fields:
            if f.staged and not f.resampled:
                total += self.batch_size * nbytes((f.channels,) + tuple(f.patch), f.sources[0].volume.dtype)
            if not f.delivered:
                total += nbytes(f.shape(self.batch_size), f.dtype)
        if self.track_valid:
            total += nbytes(self._by_name["labels"].shape(self.batch_size), np.uint8)
        return total

    def new_scratch(self) -> Dict[str, object]:
        """Per-thread buffers: flat read buffers per example for staged fields, and intermediate fields."""
        scratch: Dict[str, object] = {}
        for f in self.fields:
            if f.staged and not f.resampled:
                size = f.channels * math.prod(f.patch)
                dtype = f.sources[0].volume.dtype
                scratch["read:" + f.name] = [np.empty(size, dtype=dtype) for _ in range(self.batch_size)]
            if not f.delivered:
                scratch[f.name] = np.zeros(f.shape(self.batch_size), dtype=f.dtype)
        if self.track_valid:
            scratch["labels_valid"] = np.ones(self._by_name["labels"].shape(self.batch_size), dtype=np.uint8)
        return scratch

    def fill(self, arrays: Dict[str, np.ndarray], plan: BatchPlan, scratch: Dict[str, object],
             profile: Profile) -> None:
        """Write the batch of ``plan`` into ``arrays``, timing each stage in ``profile``."""
        warp = WarpPlan.from_params(plan.params) if self.warps else None
        if warp is not None and not warp.warped.any():
            warp = None
        valid = scratch.get("labels_valid")
        if valid is not None:
            valid.fill(1)
        windows = {}
        for f in self.fields:
            out = arrays[f.name] if f.delivered else scratch[f.name]
            if warp is None:
                self._gather(f, plan, out, scratch.get("read:" + f.name), profile)
            else:
                self._warp(f, plan, warp, out, valid if f.name == "labels" else None, profile)
            windows[f.name] = out
        labels = windows.get("labels")
        unlabelled = None  # the targets' unlabelled regions as the labels held them before any change (GrowBoundary)
        if self.pixelwise:
            with profile.timer("augment"):
                patches = Patches(raw=windows["raw"], labels=labels, labels_offset=self._offset_from_raw("labels"),
                                  labels_valid=valid, valid=plan.valid, mask=windows.get("mask"),
                                  mask_offset=self._offset_from_raw("mask"), extras=self._extras(windows))
                for position, augmentation in self.pixelwise:
                    if augmentation.changes_labels and unlabelled is None and self._unlabelled_ids:
                        unlabelled = {u: np.equal(labels, u).view(np.uint8) for u in self._unlabelled_ids}
                    augmentation.process(plan.records[position], patches)
        if labels is not None and self.keep_labels and not self._by_name["labels"].delivered:
            np.copyto(arrays["labels"], self._inner(labels))
        mask = windows.get("mask")
        if mask is not None and not self._by_name["mask"].delivered:
            np.copyto(arrays["mask"], self._inner(mask))
        if self.targets:
            with profile.timer("targets"):
                compute_targets(labels, self.targets, self.margin,
                                out={name: arrays[name] for name in self._target_fields}, valid=valid,
                                mask=mask if any(t.labels_mask for t in self.targets) else None,
                                unlabelled=unlabelled)
        if valid is not None:
            np.copyto(arrays["labels_valid"], self._inner(valid))

    def _extras(self, windows: Dict[str, np.ndarray]) -> tuple:
        """The extra channels' windows on raw's grid (fields at their own voxel size are not cut like raw)."""
        return tuple(windows[f.name] for f in self.fields
                     if f.name not in ("raw", "labels", "mask") and f.grids is None)

    def _offset_from_raw(self, name: str) -> tuple:
        """Where field ``name``'s window starts in raw's output coordinates ((0, 0, 0) without that field)."""
        if name not in self._by_name:
            return (0, 0, 0)
        return tuple(int(o) for o in np.asarray(self._by_name[name].offset) - np.asarray(self._by_name["raw"].offset))

    def _inner(self, cut: np.ndarray) -> np.ndarray:
        """The output window of an array cut with the targets' margin."""
        m = self.margin
        return cut[:, :, m[0]:cut.shape[2] - m[0], m[1]:cut.shape[3] - m[1], m[2]:cut.shape[4] - m[2]]

    def _warp(self, f: Field, plan: BatchPlan, warp: WarpPlan, out: np.ndarray, valid: Optional[np.ndarray],
              profile: Profile) -> None:
        """Sample a field through the batch's warps: every field's window is centred on the output window."""
        origins = np.stack([f.sources[v].origin for v in plan.volumes])
        centres = plan.corners + (plan.extents - 1) / 2.0 - origins
        if f.lazy:
            with _StageTimer(profile, "read") as timings:
                sources, centres = self._read_boxes(f, plan.volumes, centres, warp, timings)
        else:
            sources = [f.sources[v].volume.array for v in plan.volumes]
        geometry = dict(grid=warp.grid, grid_spacing=warp.grid_spacing, grid_origin=warp.grid_origin)
        with profile.timer("kernel"):
            if f.convert:
                scale, shift = self._normalization(f, plan)
                warp_raw(sources, centres, warp.matrices, out, scale=scale, shift=shift, **geometry)
            else:
                warp_labels(sources, centres, warp.matrices, out, valid=valid, **geometry)

    def _read_boxes(self, f: Field, volumes: np.ndarray, centres: np.ndarray, warp: WarpPlan, timings):
        """Read, per example, the part of the volume its warp can reach; centres move into the read boxes. The
        chunk reads' seconds go to ``timings``."""
        lo, hi = warp.source_boxes(f.patch, centres)
        sources, starts = [], []
        for v, box_lo, box_hi in zip(volumes, lo, hi):
            volume = f.sources[v].volume
            start = np.clip(box_lo, 0, volume.shape)
            stop = np.maximum(np.clip(box_hi, 0, volume.shape), start)
            window = np.empty((volume.channels,) + tuple(int(e) for e in stop - start), dtype=volume.dtype)
            if window.size:
                volume.read_box(start, stop - start, window, timings=timings)
            sources.append(window)
            starts.append(start)
        return sources, centres - np.asarray(starts)

    def _normalization(self, f: Field, plan: BatchPlan) -> tuple:
        """Per-example float32 (scale, shift) of a converted field, with the intensity augmentation for raw."""
        scale, shift = f.normalization[plan.volumes].T
        if f.intensity:
            scale, shift = scale * plan.params.gain, shift * plan.params.gain + plan.params.bias
        return scale.astype(np.float32), kernel_shift(shift.astype(np.float32))

    def chunk_boxes(self, plan: BatchPlan) -> list:
        """``(cache, boxes)`` for the windows of ``plan`` read in place from chunk caches: the blocks a batch
        needs (warped examples may read a little more), for read-ahead. Fields resampled onto raw's grid from
        lazy volumes give the blocks of the stored windows they read."""
        result = []
        for f in self.fields:
            if f.chunked:
                corners, extents = self._windows(f, plan)
                volumes = [f.sources[v].volume for v in plan.volumes]
                for cache, examples in _by_cache(volumes).items():
                    result.append((cache, cache.boxes(corners[examples], extents[examples])))
            elif f.lazy:
                result += _stored_boxes(f, plan, *self._windows(f, plan))
        return result

    @staticmethod
    def _windows(f: Field, plan: BatchPlan) -> tuple:
        """Corners (in each example's volume) and extents of a field's windows, in source axes."""
        params = plan.params
        extents = window_extents(f.patch, params.perms)
        corners = plan.corners + window_extents(f.offset, params.perms)
        if f.grids is not None:  # in the field's own voxels
            return np.stack([f.grids[v].own_corner(corner) for v, corner in zip(plan.volumes, corners)]), \
                extents
        origins = np.stack([f.sources[v].origin for v in plan.volumes])
        return corners - origins, extents

    def _gather(self, f: Field, plan: BatchPlan, out: np.ndarray, read_buffers, profile: Profile) -> None:
        params = plan.params
        corners, extents = self._windows(f, plan)
        if f.chunked:
            self._gather_chunked(f, plan, corners, extents, out, profile)
            return
        if f.resampled:
            with profile.timer("kernel"):
                for n, v in enumerate(plan.volumes):
                    f.sources[v].volume.read_transformed(corners[n], extents[n], params.perms[n], params.flips[n],
                                                         out[n])
            return
        if read_buffers is None:
            sources = [f.sources[v].volume.array for v in plan.volumes]
        else:
            with _StageTimer(profile, "read") as timings:
                sources = self._read(f, plan.volumes, corners, extents, read_buffers, timings)
            corners = np.zeros_like(corners)
        with profile.timer("kernel"):
            if f.convert:
                scale, shift = self._normalization(f, plan)
                _gather.gather_convert(sources, corners, params.perms, params.flips, scale, shift, out)
            else:
                _gather.gather_copy(sources, corners, params.perms, params.flips, out)

    @staticmethod
    def _read(f: Field, volumes: np.ndarray, corners: np.ndarray, extents: np.ndarray, buffers: List[np.ndarray],
              timings):
        sources = []
        for v, corner, extent, buffer in zip(volumes, corners, extents, buffers):
            volume = f.sources[v].volume
            window = buffer.reshape((volume.channels,) + tuple(int(e) for e in extent))
            volume.read_box(corner, extent, window, timings=timings)
            if f.convert and volume.dtype.kind == "f":
                _refuse_nonfinite_window(volume, corner, window)
            sources.append(window)
        return sources

    def _gather_chunked(self, f: Field, plan: BatchPlan, corners: np.ndarray, extents: np.ndarray, out: np.ndarray,
                        profile: Profile) -> None:
        """One kernel call reading every window in place from its volume's cached blocks, pinned meanwhile."""
        params = plan.params
        volumes = [f.sources[v].volume for v in plan.volumes]
        pinned = []
        try:
            with _StageTimer(profile, "cache") as timings:
                for cache, examples in _by_cache(volumes).items():
                    boxes = cache.boxes(corners[examples], extents[examples])
                    cache.pin(boxes, timings)
                    pinned.append((cache, boxes))
            if f.convert:
                _refuse_nonfinite(volumes, corners, extents, pinned)
            grids = [volume.chunk_cache.grid for volume in volumes]
            with profile.timer("kernel"):
                if f.convert:
                    scale, shift = self._normalization(f, plan)
                    _gather.gather_chunked_convert(grids, corners, params.perms, params.flips, scale, shift, out)
                else:
                    _gather.gather_chunked_copy(grids, corners, params.perms, params.flips, out)
        finally:
            for cache, boxes in pinned:
                cache.unpin(boxes)


class _StageTimer:
    """Times ``stage`` ("cache", or "read" for windows copied out of lazy volumes): the time inside it less what
    the caches reported through it (``add``) as "fetch", "decode" or "pending", so that the profile's stages stay
    disjoint and add up to the producers' time."""

    def __init__(self, profile: Profile, stage: str) -> None:
        self._profile, self._stage = profile, stage
        self._reported = 0.0

    def add(self, stage: str, seconds: float) -> None:
        self._reported += seconds
        self._profile.add(stage, seconds)

    def __enter__(self) -> "_StageTimer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.add(self._stage, max(0.0, time.perf_counter() - self._start - self._reported))


def _stored_boxes(f: Field, plan: BatchPlan, corners: np.ndarray, extents: np.ndarray) -> list:
    """``(cache, boxes)`` of the stored volumes that a field's views onto raw's grid read for ``plan``."""
    stored: Dict[object, tuple] = {}
    for n, v in enumerate(plan.volumes):
        view = f.sources[v].volume
        if isinstance(view, OnRawGrid) and view.stored_cache is not None:
            start, stop = view.stored_box(corners[n], extents[n])
            starts, sizes = stored.setdefault(view.stored_cache, ([], []))
            starts.append(start)
            sizes.append(stop - start)
    return [(cache, cache.boxes(np.asarray(starts), np.asarray(sizes))) for cache, (starts, sizes) in stored.items()]


def _by_cache(volumes) -> Dict[object, List[int]]:
    """The examples of a batch grouped by the chunk cache of their volume."""
    groups: Dict[object, List[int]] = {}
    for n, volume in enumerate(volumes):
        groups.setdefault(volume.chunk_cache, []).append(n)
    return groups


def _refuse_nonfinite_window(volume, corner, window: np.ndarray) -> None:
    """ValueError naming the volume and the window's corner if ``window`` holds NaN or infinity."""
    if not np.isfinite(window).all():
        raise ValueError(f"{volume.name}: NaN or infinity in the window at (z, y, x) = "
                         f"{tuple(int(c) for c in corner)}")


def _refuse_nonfinite(volumes, corners: np.ndarray, extents: np.ndarray, pinned) -> None:
    """ValueError naming the volume and window if a converted window holds NaN or infinity (known per block)."""
    if all(volume.dtype.kind != "f" for volume in volumes):
        return
    for cache, boxes in pinned:
        if not cache.nonfinite(boxes).any():
            continue
        for n, volume in enumerate(volumes):
            if volume.chunk_cache is cache:
                window = np.empty((volume.channels,) + tuple(int(e) for e in extents[n]), volume.dtype)
                volume.read_box(corners[n], extents[n], window)
                _refuse_nonfinite_window(volume, corners[n], window)
