"""Where windows are cut: samplers turn uniform draws into (volume, window corner) pairs.

The loader describes each volume of the dataset by a :class:`Region`: the box where *output* windows may lie
(already shrunk so that the input context and the label margin of every window stay inside the data), plus the
volumes a sampler may look at (labels, mask). A sampler is bound once to the regions, before any thread starts,
and builds whatever index it needs then; afterwards :meth:`Sampler.sample` is a pure function of its uniforms and
the batch position, called from several producer threads at once.

Samplers:

- :class:`Uniform`: every window position equally likely.
- :class:`Masked`: only windows that a mask (or the labelled part of the labels) covers well enough, drawn
  uniformly from a compact bitmap of the qualifying corners.
- :class:`Balanced`: window centres drawn class by class (boundary vs interior, or semantic classes of label ids)
  with given priors, from per-block class counts.
- :class:`Tiled`: a deterministic grid of windows covering every region, split between the shards.

The indexes are built by the kernels of :mod:`emfast._core.sampling`, slab by slab for lazy volumes, so their
transient memory stays bounded.
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._core import sampling as _sampling
from .._registry import register
from ..io import Volume


@dataclass(frozen=True)
class Region:
    """One volume of the dataset, as a sampler sees it.

    Attributes
    ----------
    name : str
        The sample's name (for messages).
    weight : float
        Relative probability of drawing an example from this volume (> 0).
    lo, hi : ndarray, (3,) int64
        Output windows must lie inside ``[lo, hi)``, in the volume's raw voxel coordinates (z, y, x).
    labels : Volume or None
        The label volume, its voxel (0, 0, 0) at ``labels_origin`` in raw voxel coordinates.
    mask : Volume or None
        The mask volume (non-zero = usable), its voxel (0, 0, 0) at ``mask_origin``.
    """

    name: str
    weight: float
    lo: np.ndarray
    hi: np.ndarray
    labels: Optional[Volume] = None
    labels_origin: Optional[np.ndarray] = None
    mask: Optional[Volume] = None
    mask_origin: Optional[np.ndarray] = None


@dataclass(frozen=True)
class Draw:
    """A sampler's answer for one batch.

    Attributes
    ----------
    volumes : ndarray, (B,) int64
        Index of each example's region.
    corners : ndarray, (B, 3) int64
        Low corner of each example's output window, in that region's raw voxel coordinates.
    valid : int
        Examples at the front of the batch that are real; the rest repeat the last one (only a tiled sampler's
        final, incomplete batch has ``valid < B``).
    """

    volumes: np.ndarray
    corners: np.ndarray
    valid: int


class Sampler:
    """Base class of the samplers.

    Subclasses set ``draws`` (uniforms per example), may override :meth:`bind` to build an index, and implement
    :meth:`sample`.
    """

    name = "sampler"
    draws = 0

    def bind(self, regions: Sequence[Region], extents: np.ndarray, batch_size: int, rank: int = 0,
             world_size: int = 1) -> None:
        """Prepare for ``regions``; called once by the loader before streaming.

        Parameters
        ----------
        regions : sequence of Region
            The dataset's volumes, in order.
        extents : ndarray, (K, 3) int64
            Every output-window extent in source axes that :meth:`sample` may be asked for (one per reachable
            axis order of the augmentations).
        batch_size : int
            Examples per batch.
        rank, world_size : int
            This process's shard of the stream (``torch.distributed`` convention). Random samplers get disjoint
            streams from the loader; deterministic samplers split their sequence themselves.

        Raises
        ------
        ValueError
            If no window qualifies in any region.
        """
        self.regions = list(regions)
        weights = np.asarray([region.weight for region in self.regions], dtype=np.float64)
        self._cumulative_weights = np.cumsum(weights) / weights.sum()

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        """Windows for one batch from ``uniforms`` (B, draws) in [0, 1), for output windows of ``extents`` (B, 3).

        ``index`` is the batch index within ``epoch`` for this shard.
        """
        raise NotImplementedError

    def describe(self, index: int, extent: Tuple[int, int, int]) -> Optional[str]:
        """A line for ``emfast check`` on how region ``index`` serves windows of ``extent`` (None: nothing to add)."""
        return None

    def batches_per_epoch(self) -> Optional[int]:
        """Batches in an epoch, for samplers with a finite sequence (None: the loader's ``epoch_size`` decides)."""
        return None

    def choose_regions(self, uniforms: np.ndarray) -> np.ndarray:
        """Region index per example, drawn by the regions' weights from one uniform each."""
        chosen = np.searchsorted(self._cumulative_weights, uniforms, side="right")
        return np.minimum(chosen, len(self.regions) - 1).astype(np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def uniform_offsets(uniforms: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Integers uniformly in ``[0, positions)`` from uniforms in [0, 1), elementwise."""
    return np.minimum((uniforms * positions).astype(np.int64), positions - 1)


@register("sampler")
class Uniform(Sampler):
    """A region drawn by weight, then an output-window corner uniformly over every position where it fits."""

    name = "uniform"
    draws = 4

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        volumes = self.choose_regions(uniforms[:, 0])
        lo = np.stack([self.regions[v].lo for v in volumes])
        hi = np.stack([self.regions[v].hi for v in volumes])
        corners = lo + uniform_offsets(uniforms[:, 1:4], hi - lo - extents + 1)
        return Draw(volumes=volumes, corners=corners, valid=len(volumes))


#: Voxels per slab when an index is built from a volume slab by slab (bounds transient memory).
_SLAB_VOXELS = 1 << 25
_ID_RANGE = (-(2**63), 2**64 - 1)


def _is_integer(value) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
    return isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))


def _triple(value) -> Tuple[int, int, int]:
    return tuple(int(v) for v in value)


def _read(volume: Volume, corner: Sequence[int], extent: Sequence[int]) -> np.ndarray:
    """The box [corner, corner + extent) of a one-channel volume as a 3-D array: a view of an in-memory volume,
    a fresh buffer read from a lazy one."""
    box = tuple(slice(int(c), int(c) + int(e)) for c, e in zip(corner, extent))
    if volume.in_memory:
        return volume.array[0][box]
    out = np.empty((volume.channels,) + tuple(int(e) for e in extent), dtype=volume.dtype)
    volume.read_box(corner, extent, out)
    return out[0]


def _one_channel(volume: Volume, what: str, region: Region, owner: str) -> None:
    if volume.channels != 1:
        raise ValueError(f"{owner}: region {region.name!r} has {what} with {volume.channels} channels; "
                         f"a {what} volume must have one")


def _cumulative(weights: np.ndarray) -> np.ndarray:
    return np.cumsum(weights) / weights.sum()


def _pick(cumulative: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Index per uniform into the categories of ``cumulative`` (normalised cumulative weights), never one of
    weight zero."""
    chosen = np.searchsorted(cumulative, uniforms, side="right")
    return np.minimum(chosen, len(cumulative) - 1).astype(np.int64)


def _labels_origin(region: Region) -> np.ndarray:
    return np.zeros(3, np.int64) if region.labels_origin is None else np.asarray(region.labels_origin, np.int64)


def _redistributed(weights: np.ndarray, usable: np.ndarray) -> np.ndarray:
    return np.where(usable, weights, 0.0)


@dataclass(frozen=True)
class _Corners:
    """The qualifying window corners of one region for one extent: a bitmap with a row per (z, y) corner row.

    ``bits[row]`` holds bit x of corner (lo[0] + row // rows_y, lo[1] + row % rows_y, lo[2] + x);
    ``cumulative[row]`` counts the set bits of rows 0 to ``row``.
    """

    bits: np.ndarray
    cumulative: np.ndarray
    rows_y: int
    best: int

    @property
    def total(self) -> int:
        return int(self.cumulative[-1]) if len(self.cumulative) else 0

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + self.cumulative.nbytes


@register("sampler")
class Masked(Sampler):
    """Windows drawn uniformly among those that a mask, or the labelled part of the labels, covers well enough.

    A window qualifies when at least ``min_fraction`` of its voxels are covered (``covered / window_voxels >=
    min_fraction`` in float64); voxels outside the mask or label volume count as not covered. A region is drawn by
    its weight, then one of its qualifying corners uniformly: the draw picks the k-th qualifying corner of a
    compact index (one bit per window position plus a running count per row of positions), never by rejection.

    The index is built at :meth:`bind` for each region and each window extent, slab by slab along z with
    separable running window sums (compiled, without the GIL), so its transient memory stays bounded; it holds
    about 1 bit per window position.

    Parameters
    ----------
    min_fraction : float
        Least covered fraction of a window's voxels, in (0, 1].
    source : {"mask", "labels"}
        What covers: the region's mask (non-zero voxels) or its labels (voxels other than ``unlabelled``).
    unlabelled : int
        With ``source="labels"``: the id of unlabelled voxels.

    Notes
    -----
    At :meth:`bind`, a region with no qualifying window for some window extent is skipped for that extent with
    a warning (its weight goes to the others, proportionally); if no region has one, :meth:`bind` raises a
    ValueError naming the regions and the best covered fraction found.
    """

    name = "masked"
    draws = 2

    def __init__(self, min_fraction: float = 0.5, source: str = "mask", unlabelled: int = 0) -> None:
        if not _is_real(min_fraction) or not 0 < float(min_fraction) <= 1:
            raise ValueError(f"Masked: min_fraction must be a number in (0, 1], got {min_fraction!r}")
        if source not in ("mask", "labels"):
            raise ValueError(f"Masked: source must be 'mask' or 'labels', got {source!r}")
        if not _is_integer(unlabelled) or not _ID_RANGE[0] <= int(unlabelled) <= _ID_RANGE[1]:
            raise ValueError(f"Masked: unlabelled must be an integer label id, got {unlabelled!r}")
        self.min_fraction = float(min_fraction)
        self.source = source
        self.unlabelled = int(unlabelled)

    def _volume(self, region: Region) -> Tuple[Volume, np.ndarray]:
        if self.source == "mask":
            volume, origin, what = region.mask, region.mask_origin, "mask"
        else:
            volume, origin, what = region.labels, region.labels_origin, "labels"
        if volume is None:
            raise ValueError(f"{self!r}: region {region.name!r} has no {what}")
        _one_channel(volume, what, region, repr(self))
        if what == "labels":
            info = np.iinfo(volume.dtype)
            if not info.min <= self.unlabelled <= info.max:
                raise ValueError(f"{self!r}: unlabelled={self.unlabelled} cannot occur in the {volume.dtype} "
                                 f"labels of region {region.name!r} (range [{info.min}, {info.max}])")
        origin = np.zeros(3, np.int64) if origin is None else np.asarray(origin, dtype=np.int64)
        return volume, origin

    def threshold(self, window_voxels: int) -> int:
        """Covered voxels a window of ``window_voxels`` voxels needs: the least n with n / window_voxels >=
        min_fraction in float64."""
        needed = math.ceil(self.min_fraction * window_voxels)
        while needed > 0 and (needed - 1) / window_voxels >= self.min_fraction:
            needed -= 1
        while needed / window_voxels < self.min_fraction:
            needed += 1
        return needed

    def _coverage(self, volume: Volume, origin: np.ndarray, lo: np.ndarray, shape: np.ndarray) -> np.ndarray:
        """0 / 1 coverage of the raw box [lo, lo + shape), 0 outside the volume."""
        coverage = np.zeros(tuple(shape), dtype=np.uint8)
        start = np.maximum(lo, origin)
        stop = np.minimum(lo + shape, origin + np.asarray(volume.shape))
        if np.all(start < stop):
            data = _read(volume, start - origin, stop - start)
            inside = coverage[tuple(slice(a, b) for a, b in zip(start - lo, stop - lo))].view(bool)
            empty = 0 if self.source == "mask" else np.asarray(self.unlabelled).astype(volume.dtype)
            np.not_equal(data, empty, out=inside)
        return coverage

    def _index(self, region: Region, extent: np.ndarray) -> _Corners:
        volume, origin = self._volume(region)
        lo, hi = np.asarray(region.lo, np.int64), np.asarray(region.hi, np.int64)
        corners = hi - lo - extent + 1
        if np.any(corners < 1):
            return _Corners(np.zeros((0, 0), np.uint64), np.zeros(0, np.int64), 0, 0)
        rows_y = int(corners[1])
        words = _sampling.words_per_row(int(corners[2]))
        bits = np.empty((int(corners[0]) * rows_y, words), dtype=np.uint64)
        counts = np.empty(len(bits), dtype=np.int64)
        threshold = self.threshold(math.prod(int(e) for e in extent))
        plane = int(hi[1] - lo[1]) * int(hi[2] - lo[2])
        step = max(1, _SLAB_VOXELS // plane - int(extent[0]) + 1)  # corner planes per slab
        best = 0
        for z in range(0, int(corners[0]), step):
            planes = min(step, int(corners[0]) - z)
            slab = np.array([planes + extent[0] - 1, hi[1] - lo[1], hi[2] - lo[2]], dtype=np.int64)
            coverage = self._coverage(volume, origin, lo + [z, 0, 0], slab)
            rows = slice(z * rows_y, (z + planes) * rows_y)
            best = max(best, _sampling.window_bits(coverage, extent, threshold, bits[rows], counts[rows]))
        return _Corners(bits, np.cumsum(counts), rows_y, best)

    def bind(self, regions, extents, batch_size, rank=0, world_size=1) -> None:
        super().bind(regions, extents, batch_size, rank, world_size)
        unique = np.unique(np.asarray(extents, dtype=np.int64).reshape(-1, 3), axis=0)
        weights = np.asarray([region.weight for region in self.regions], dtype=np.float64)
        self._extents: Dict[Tuple[int, int, int], int] = {}
        self._corners: List[List[_Corners]] = []
        self._weights: List[np.ndarray] = []
        for k, extent in enumerate(unique):
            index = [self._index(region, extent) for region in self.regions]
            volume = math.prod(int(e) for e in extent)
            usable = np.asarray([c.total > 0 for c in index])
            if not usable.any():
                best = max(range(len(index)), key=lambda i: index[i].best)
                names = ", ".join(repr(r.name) for r in self.regions)
                raise ValueError(
                    f"{self!r}: no window of extent {_triple(extent)} is covered to min_fraction="
                    f"{self.min_fraction} in any region ({names}); the best covered fraction is "
                    f"{index[best].best / volume:.4g} (region {self.regions[best].name!r})")
            for i in np.flatnonzero(~usable):
                warnings.warn(
                    f"{self!r}: region {self.regions[i].name!r} has no window of extent {_triple(extent)} covered "
                    f"to min_fraction={self.min_fraction} (best: {index[i].best / volume:.4g}); it is skipped for "
                    f"that extent and its weight goes to the other regions", stacklevel=2)
            self._extents[_triple(extent)] = k
            self._corners.append(index)
            self._weights.append(_cumulative(_redistributed(weights, usable)))

    @property
    def index_nbytes(self) -> int:
        """Bytes held by the index of qualifying corners (all regions and extents)."""
        return sum(c.nbytes for index in self._corners for c in index)

    def describe(self, index: int, extent: Tuple[int, int, int]) -> Optional[str]:
        """The share of window positions of region ``index`` that qualify (untransposed ``extent``)."""
        corners = self._corners[self._extents[tuple(extent)]][index]
        region = self.regions[index]
        positions = math.prod(max(int(high) - int(low) - int(size) + 1, 0)
                              for low, high, size in zip(region.lo, region.hi, extent))
        share = corners.total / positions if positions else 0.0
        return f"{self!r}: {100 * share:.1f}% of {positions:,} window positions qualify"

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        extents = np.asarray(extents, dtype=np.int64)
        keys = np.empty(len(extents), dtype=np.int64)
        for n, extent in enumerate(extents):
            key = self._extents.get(_triple(extent))
            if key is None:
                raise ValueError(f"{self!r}: window extent {_triple(extent)} was not given to bind()")
            keys[n] = key
        volumes = np.empty(len(extents), dtype=np.int64)
        for key in np.unique(keys):
            members = keys == key
            volumes[members] = _pick(self._weights[key], uniforms[members, 0])
        corners = np.empty((len(extents), 3), dtype=np.int64)
        for key, volume in set(zip(keys.tolist(), volumes.tolist())):
            members = np.flatnonzero((keys == key) & (volumes == volume))
            index = self._corners[key][volume]
            ranks = uniform_offsets(uniforms[members, 1], index.total)
            rows = np.searchsorted(index.cumulative, ranks, side="right")
            before = np.where(rows > 0, index.cumulative[np.maximum(rows - 1, 0)], 0)
            x = _sampling.select_bits(index.bits, rows, ranks - before)
            offsets = np.stack([rows // index.rows_y, rows % index.rows_y, x], axis=1)
            corners[members] = np.asarray(self.regions[volume].lo, dtype=np.int64) + offsets
        return Draw(volumes=volumes, corners=corners, valid=len(volumes))

    def __repr__(self) -> str:
        unlabelled = f", unlabelled={self.unlabelled}" if self.source == "labels" else ""
        return f"Masked(min_fraction={self.min_fraction}, source={self.source!r}{unlabelled})"


@dataclass(frozen=True)
class _Classes:
    """Class counts of one region: ``cumulative[c, b]`` voxels of class c in blocks 0 to b of the grid of
    :attr:`Balanced.block` blocks tiling the label box [lo, hi) (label voxel coordinates)."""

    cumulative: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    grid: Tuple[int, int, int]

    @property
    def totals(self) -> np.ndarray:
        if self.cumulative.shape[1] == 0:
            return np.zeros(len(self.cumulative), dtype=np.int64)
        return self.cumulative[:, -1]


@register("sampler")
class Balanced(Sampler):
    """Windows centred on voxels drawn class by class, with given class priors.

    An example draws a region by its weight, then a class by its prior among the classes present in that region,
    then a voxel of that class uniformly; the output window is placed with that voxel at its centre voxel,
    ``corner = voxel - (extent - 1) // 2``. Only voxels whose centred window fits the region for every window
    extent (and that lie in the label volume) are drawn.

    Parameters
    ----------
    classes : "boundary" or mapping
        ``"boundary"``: two classes, ``"boundary"`` (a voxel up to ``thickness`` steps away along +-y, +-x, and
        +-z unless ``in_plane``, inside the label volume, has another label, as in
        :class:`emfast.targets.Boundaries`) and ``"interior"`` (every other voxel). A mapping ``{label_id:
        class_name}``: semantic classes; voxels whose label id is not in the mapping belong to no class and are
        never drawn as centres (map them explicitly to sample them).
    priors : mapping or None
        ``{class_name: weight}``, weights >= 0 with a positive sum; a class left out gets weight 0. None: every
        class equally likely. In a region where a class is absent, its prior goes to the present classes,
        proportionally to theirs (with one warning per absent class at :meth:`bind`).
    thickness : int
        Boundary reach in voxels, >= 1 (``classes="boundary"`` only).
    in_plane : bool
        Compare along y and x only (``classes="boundary"`` only).

    Notes
    -----
    The index is built at :meth:`bind` in one pass over each label volume (slab by slab for lazy volumes) by a
    compiled kernel that runs without the GIL: the voxels of each class in every block of :attr:`block` voxels,
    kept as running counts (int64, a few hundredths of a byte per voxel). A draw finds the block by binary
    search and recomputes that block's classes to find its voxel.
    """

    name = "balanced"
    draws = 3
    #: Blocks of the class counts (z, y, x).
    block = (8, 16, 16)

    def __init__(self, classes: Union[str, Mapping[int, str]] = "boundary",
                 priors: Optional[Mapping[str, float]] = None, thickness: int = 1, in_plane: bool = False) -> None:
        if isinstance(classes, str):
            if classes != "boundary":
                raise ValueError(f"Balanced: classes must be 'boundary' or a mapping {{label_id: class_name}}, "
                                 f"got {classes!r}")
            self.class_names: Tuple[str, ...] = ("boundary", "interior")
            self.mapping: Optional[Dict[int, str]] = None
        elif isinstance(classes, Mapping):
            if not classes:
                raise ValueError("Balanced: classes must map at least one label id to a class name")
            for label_id, class_name in classes.items():
                if not _is_integer(label_id) or not _ID_RANGE[0] <= int(label_id) <= _ID_RANGE[1]:
                    raise ValueError(f"Balanced: classes keys must be integer label ids, got {label_id!r}")
                if not isinstance(class_name, str) or not class_name:
                    raise ValueError(f"Balanced: classes values must be non-empty class names, got "
                                     f"{class_name!r} for label id {label_id}")
            self.mapping = {int(k): v for k, v in classes.items()}
            self.class_names = tuple(dict.fromkeys(self.mapping.values()))
            if len(self.class_names) >= _sampling.NO_CLASS:
                raise ValueError(f"Balanced: at most {_sampling.NO_CLASS - 1} classes, got {len(self.class_names)}")
        else:
            raise ValueError(f"Balanced: classes must be 'boundary' or a mapping {{label_id: class_name}}, "
                             f"got {classes!r}")
        if not _is_integer(thickness) or int(thickness) < 1:
            raise ValueError(f"Balanced: thickness must be an integer >= 1, got {thickness!r}")
        if not isinstance(in_plane, (bool, np.bool_)):
            raise ValueError(f"Balanced: in_plane must be True or False, got {in_plane!r}")
        self.thickness = int(thickness)
        self.in_plane = bool(in_plane)
        self.priors = self._priors(priors)

    def _priors(self, priors) -> Dict[str, float]:
        if priors is None:
            return {name: 1.0 for name in self.class_names}
        if not isinstance(priors, Mapping):
            raise ValueError(f"Balanced: priors must be a mapping {{class_name: weight}} or None, got {priors!r}")
        for class_name, weight in priors.items():
            if class_name not in self.class_names:
                raise ValueError(f"Balanced: priors name the class {class_name!r}, which does not exist; the "
                                 f"classes are {', '.join(repr(c) for c in self.class_names)}")
            if not _is_real(weight) or not math.isfinite(float(weight)) or float(weight) < 0:
                raise ValueError(f"Balanced: the prior of class {class_name!r} must be a finite number >= 0, "
                                 f"got {weight!r}")
        resolved = {name: float(priors.get(name, 0.0)) for name in self.class_names}
        if sum(resolved.values()) <= 0:
            raise ValueError(f"Balanced: priors must have a positive sum, got {dict(priors)!r}")
        return resolved

    def _rule(self, dtype: np.dtype) -> "_sampling.ClassRule":
        if self.mapping is None:
            return _sampling.ClassRule(2, thickness=self.thickness, in_plane=self.in_plane)
        info = np.iinfo(dtype)
        # ids the dtype cannot hold never occur; the kernel compares labels as unsigned bits
        pairs = [(label_id % (1 << info.bits), self.class_names.index(name))
                 for label_id, name in self.mapping.items() if info.min <= label_id <= info.max]
        ids = np.asarray([p[0] for p in pairs], dtype=np.uint64)
        return _sampling.ClassRule(len(self.class_names), ids=ids,
                                   id_classes=np.asarray([p[1] for p in pairs], dtype=np.uint8))

    def _halo(self) -> np.ndarray:
        """Label voxels around a box that decide the classes inside it."""
        if self.mapping is not None:
            return np.zeros(3, dtype=np.int64)
        t = self.thickness
        return np.asarray([0 if self.in_plane else t, t, t], dtype=np.int64)

    def _view(self, labels: Volume, lo: np.ndarray, hi: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(labels around the box [lo, hi), position of that array's voxel 0): the whole array of an in-memory
        volume, else the box plus its halo read from the file."""
        if labels.in_memory:
            return labels.array[0], np.zeros(3, dtype=np.int64)
        start = np.maximum(lo - self._halo(), 0)
        stop = np.minimum(hi + self._halo(), np.asarray(labels.shape))
        return _read(labels, start, stop - start), start

    def _count(self, region: Region, rule, centre_lo: np.ndarray, centre_hi: np.ndarray) -> _Classes:
        """Class counts of the voxels of the raw box [centre_lo, centre_hi) that lie in the label volume."""
        labels = region.labels
        origin = _labels_origin(region)
        lo = np.maximum(centre_lo - origin, 0)
        hi = np.minimum(centre_hi - origin, np.asarray(labels.shape))
        classes = len(self.class_names)
        if np.any(lo >= hi):
            return _Classes(np.zeros((classes, 0), np.int64), lo, hi, (0, 0, 0))
        block = np.asarray(self.block, dtype=np.int64)
        grid = _sampling.grid_shape(lo, hi, block)
        counts = np.empty(grid + (classes,), dtype=np.uint32)
        plane = int(hi[1] - lo[1]) * int(hi[2] - lo[2])
        rows = grid[0] if labels.in_memory else max(1, _SLAB_VOXELS // (plane * self.block[0]))
        for row in range(0, grid[0], rows):
            box_lo = lo + [row * self.block[0], 0, 0]
            box_hi = np.minimum(hi, lo + [(row + rows) * self.block[0], hi[1], hi[2]])
            data, start = self._view(labels, box_lo, box_hi)
            _sampling.count_classes(data, rule, box_lo - start, box_hi - start, block, counts[row:row + rows])
        cumulative = np.cumsum(counts.reshape(-1, classes), axis=0, dtype=np.int64).T.copy()
        return _Classes(cumulative, lo + origin, hi + origin, grid)

    def bind(self, regions, extents, batch_size, rank=0, world_size=1) -> None:
        super().bind(regions, extents, batch_size, rank, world_size)
        extents = np.asarray(extents, dtype=np.int64).reshape(-1, 3)
        for region in self.regions:
            if region.labels is None:
                raise ValueError(f"{self!r}: region {region.name!r} has no labels")
            _one_channel(region.labels, "labels", region, repr(self))
        half = (extents - 1) // 2
        self._classes: List[_Classes] = []
        self._rules = []
        for region in self.regions:
            # voxels whose centred window fits [lo, hi) for every extent
            centre_lo = np.asarray(region.lo, np.int64) + half.max(axis=0)
            centre_hi = (np.asarray(region.hi, np.int64) - extents + half + 1).min(axis=0)
            rule = self._rule(region.labels.dtype)
            self._rules.append(rule)
            self._classes.append(self._count(region, rule, centre_lo, centre_hi))
        priors = np.asarray([self.priors[name] for name in self.class_names])
        totals = np.stack([c.totals for c in self._classes])  # (regions, classes)
        present = totals > 0
        effective = priors * present
        usable = effective.sum(axis=1) > 0
        if not usable.any():
            raise ValueError(f"{self!r}: no region has a voxel of a class with a positive prior "
                             f"(voxels per class and region: {self._census(totals)})")
        for c, name in enumerate(self.class_names):
            absent = [self.regions[i].name for i in range(len(self.regions)) if usable[i] and not present[i, c]]
            if priors[c] > 0 and absent:
                warnings.warn(f"{self!r}: class {name!r} is absent from region(s) {', '.join(map(repr, absent))}; "
                              f"its prior goes to the classes present there", stacklevel=2)
        for i in np.flatnonzero(~usable):
            warnings.warn(f"{self!r}: region {self.regions[i].name!r} has no voxel of a class with a positive "
                          f"prior; it is skipped and its weight goes to the other regions", stacklevel=2)
        weights = np.asarray([region.weight for region in self.regions], dtype=np.float64)
        self._cumulative_weights = _cumulative(_redistributed(weights, usable))
        self._class_weights = [_cumulative(row) if row.sum() > 0 else None for row in effective]

    def _census(self, totals: np.ndarray) -> str:
        return "; ".join(f"{region.name!r}: " + ", ".join(f"{name} {int(count)}"
                                                          for name, count in zip(self.class_names, row))
                         for region, row in zip(self.regions, totals))

    @property
    def index_nbytes(self) -> int:
        """Bytes held by the class index (all regions)."""
        return sum(c.cumulative.nbytes for c in self._classes)

    def class_counts(self) -> Dict[str, Dict[str, int]]:
        """Indexed voxels per region and class: ``{region name: {class name: count}}`` (after :meth:`bind`)."""
        return {region.name: {name: int(count) for name, count in zip(self.class_names, index.totals)}
                for region, index in zip(self.regions, self._classes)}

    def _voxel(self, volume: int, cls: int, rank: int) -> np.ndarray:
        """The rank-th indexed voxel of class ``cls`` of region ``volume``, in raw voxel coordinates."""
        index = self._classes[volume]
        cumulative = index.cumulative[cls]
        block = int(np.searchsorted(cumulative, rank, side="right"))
        if block > 0:
            rank -= int(cumulative[block - 1])
        region = self.regions[volume]
        origin = _labels_origin(region)
        size = np.asarray(self.block, dtype=np.int64)
        lo = index.lo - origin + np.asarray(np.unravel_index(block, index.grid), dtype=np.int64) * size
        hi = np.minimum(lo + size, index.hi - origin)
        data, start = self._view(region.labels, lo, hi)
        found = _sampling.select_class(data, self._rules[volume], lo - start, hi - start, cls, rank)
        return np.asarray(found, dtype=np.int64) + start + origin

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        extents = np.asarray(extents, dtype=np.int64)
        volumes = self.choose_regions(uniforms[:, 0])
        corners = np.empty((len(volumes), 3), dtype=np.int64)
        for n, volume in enumerate(volumes.tolist()):
            cls = int(_pick(self._class_weights[volume], uniforms[n, 1:2])[0])
            total = int(self._classes[volume].totals[cls])
            rank = int(uniform_offsets(uniforms[n, 2], total))
            corners[n] = self._voxel(volume, cls, rank) - (extents[n] - 1) // 2
        return Draw(volumes=volumes, corners=corners, valid=len(volumes))

    def __repr__(self) -> str:
        classes = "'boundary'" if self.mapping is None else repr(self.mapping)
        boundary = f", thickness={self.thickness}, in_plane={self.in_plane}" if self.mapping is None else ""
        return f"Balanced(classes={classes}, priors={self.priors!r}{boundary})"


def _tile_starts(lo: int, hi: int, extent: int, stride: int) -> np.ndarray:
    """Window corners along one axis: every ``stride`` from ``lo``, the last clamped to end at ``hi``."""
    starts = np.arange(lo, hi - extent + 1, stride, dtype=np.int64)
    if starts[-1] + extent < hi:
        starts = np.append(starts, hi - extent)
    return starts


@register("sampler")
class Tiled(Sampler):
    """A deterministic grid of output windows over every region, for inference or validation.

    Windows step by ``stride`` from each region's low corner along z, y and x; along each axis the last window
    is moved back to end at the region's high bound, so the windows cover every voxel of every region. Tiles are
    numbered region by region (in order), then in C order (z, y, x) within a region; batches take them in that
    order. Uniforms are not used.

    Sharding: with ``world_size`` W, rank r gets the tiles i with ``i % W == r``; the shards are disjoint and
    together hold every tile. Let n be the shard's tile count and B the batch size:

    - ``last="keep"``: ``ceil(n / B)`` batches; the last one has ``valid = n - (ceil(n / B) - 1) * B`` real
      examples and repeats its last tile in the remaining places.
    - ``last="drop"``: ``n // B`` batches, all full; the last ``n % B`` tiles are never delivered.
    - ``last="roll"``: ``ceil(n / B)`` batches, all full: the sequence wraps around, so place p of the epoch
      (``p = batch * B + example``) gets the shard's tile ``p % n``; the first ``ceil(n / B) * B - n`` tiles
      come twice, at the start and again at the end of the last batch. Every epoch is the same.

    Parameters
    ----------
    stride : int, (int, int, int) or None
        Step between windows along (z, y, x), each >= 1 and at most the window extent (larger steps would leave
        gaps); None: the window extent (tiles touch, no overlap).
    last : {"keep", "drop", "roll"}
        What becomes of the shard's last, incomplete batch (see above).
    """

    name = "tiled"
    draws = 0

    def __init__(self, stride: Union[None, int, Sequence[int]] = None, last: str = "keep") -> None:
        if stride is not None:
            values = (stride,) * 3 if _is_integer(stride) else stride
            if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) \
                    or len(values) != 3 or not all(_is_integer(v) for v in values):
                raise ValueError(f"Tiled: stride must be an integer or three integers (z, y, x), got {stride!r}")
            if min(values) < 1:
                raise ValueError(f"Tiled: stride must be >= 1 along each axis, got {stride!r}")
            stride = tuple(int(v) for v in values)
        if last not in ("keep", "drop", "roll"):
            raise ValueError(f"Tiled: last must be 'keep', 'drop' or 'roll', got {last!r}")
        self.stride: Optional[Tuple[int, int, int]] = stride
        self.last = last

    def bind(self, regions, extents, batch_size, rank=0, world_size=1) -> None:
        super().bind(regions, extents, batch_size, rank, world_size)
        extents = np.asarray(extents, dtype=np.int64).reshape(-1, 3)
        if len(np.unique(extents, axis=0)) != 1:
            raise ValueError(f"{self!r}: all windows must have the same extent, got "
                             f"{sorted(set(map(_triple, extents)))}; tiling does not combine with augmentations "
                             f"that transpose the window")
        if not _is_integer(world_size) or world_size < 1 or not _is_integer(rank) or not 0 <= rank < world_size:
            raise ValueError(f"{self!r}: need 0 <= rank < world_size, got rank={rank!r}, "
                             f"world_size={world_size!r}")
        extent = extents[0]
        stride = extent if self.stride is None else np.asarray(self.stride, dtype=np.int64)
        if np.any(stride > extent):
            raise ValueError(f"{self!r}: stride {_triple(stride)} exceeds the window extent {_triple(extent)} "
                             f"along some axis; the tiles would leave gaps")
        self._extent = extent
        self._starts = []
        for region in self.regions:
            if np.any(np.asarray(region.hi) - np.asarray(region.lo) < extent):
                raise ValueError(f"{self!r}: the window {_triple(extent)} does not fit region {region.name!r} "
                                 f"[{_triple(region.lo)}, {_triple(region.hi)})")
            self._starts.append([_tile_starts(int(region.lo[a]), int(region.hi[a]), int(extent[a]), int(stride[a]))
                                 for a in range(3)])
        counts = [math.prod(len(s) for s in starts) for starts in self._starts]
        self._first_tile = np.cumsum([0] + counts)
        self.tiles = int(self._first_tile[-1])
        self.batch_size = int(batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.shard_tiles = len(range(self.rank, self.tiles, self.world_size))
        if self.shard_tiles == 0:
            raise ValueError(f"{self!r}: {self.tiles} tiles leave none for rank {rank} of {world_size}")
        if self.last == "drop" and self.shard_tiles < self.batch_size:
            raise ValueError(f"{self!r}: rank {rank} has {self.shard_tiles} tiles, fewer than batch_size="
                             f"{batch_size}, so last='drop' leaves no batch")

    def batches_per_epoch(self) -> int:
        """Batches per epoch for this shard (see the class documentation)."""
        if self.last == "drop":
            return self.shard_tiles // self.batch_size
        return -(-self.shard_tiles // self.batch_size)

    def tile(self, i: int) -> Tuple[int, np.ndarray]:
        """(region index, window corner) of global tile ``i``."""
        volume = int(np.searchsorted(self._first_tile, i, side="right")) - 1
        starts = self._starts[volume]
        local = np.unravel_index(i - int(self._first_tile[volume]), [len(s) for s in starts])
        return volume, np.asarray([starts[a][local[a]] for a in range(3)], dtype=np.int64)

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        batches = self.batches_per_epoch()
        if not 0 <= index < batches:
            raise ValueError(f"{self!r}: batch index {index} is outside the epoch of {batches} "
                             f"batch{'' if batches == 1 else 'es'}")
        extents = np.asarray(extents, dtype=np.int64)
        if len(extents) != self.batch_size or np.any(extents != self._extent):
            raise ValueError(f"{self!r}: expected {self.batch_size} windows of extent {_triple(self._extent)}")
        places = index * self.batch_size + np.arange(self.batch_size)
        valid = self.batch_size
        if self.last == "roll":
            places %= self.shard_tiles
        elif self.last == "keep":
            valid = min(self.batch_size, self.shard_tiles - index * self.batch_size)
            places = np.minimum(places, self.shard_tiles - 1)
        volumes = np.empty(self.batch_size, dtype=np.int64)
        corners = np.empty((self.batch_size, 3), dtype=np.int64)
        for n, place in enumerate(places.tolist()):
            volumes[n], corners[n] = self.tile(self.rank + place * self.world_size)
        return Draw(volumes=volumes, corners=corners, valid=valid)

    def __repr__(self) -> str:
        return f"Tiled(stride={self.stride}, last={self.last!r})"
