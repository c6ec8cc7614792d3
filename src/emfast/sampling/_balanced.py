"""The balanced sampler: window centres drawn class by class (boundary vs interior, or semantic classes of label
ids) with given priors, from per-block class counts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .._checks import ID_RANGE, is_integer, real, refusal, warn_user
from .._core import sampling as _sampling
from .._registry import register
from ..io import Volume
from . import _base
from ._base import (Draw, Region, Sampler, cumulative_shares, label_origin, one_channel, pick,
                    read_box, redistributed, uniform_offsets)


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
@dataclass(eq=False)
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
    The index is built at :meth:`bind` in one pass over each label volume (in tiles of at most 256 MiB for lazy
    volumes, part of a plane where planes are wide) by a compiled kernel that runs without the GIL: the voxels
    of each class in every block of :attr:`block` voxels,
    kept as running counts (int64, a few hundredths of a byte per voxel). A draw finds the block by binary
    search and recomputes that block's classes to find its voxel.
    """

    classes: Union[str, Mapping[int, str]] = "boundary"
    priors: Optional[Mapping[str, float]] = None
    thickness: int = 1
    in_plane: bool = False
    name: ClassVar[str] = "balanced"
    draws: ClassVar[int] = 3
    #: Blocks of the class counts (z, y, x).
    block: ClassVar[Tuple[int, int, int]] = (8, 16, 16)

    def __post_init__(self) -> None:
        self.class_names, self.mapping = self._classes_of(self.classes)
        if not is_integer(self.thickness) or int(self.thickness) < 1:
            raise refusal(f"Balanced: thickness must be an integer >= 1, got {self.thickness!r}", "thickness")
        if not isinstance(self.in_plane, (bool, np.bool_)):
            raise refusal(f"Balanced: in_plane must be True or False, got {self.in_plane!r}", "in_plane")
        self.thickness = int(self.thickness)
        self.in_plane = bool(self.in_plane)
        self.priors = self._priors(self.priors)

    @staticmethod
    def _classes_of(classes) -> Tuple[Tuple[str, ...], Optional[Dict[int, str]]]:
        """(class names, {label id: class name} or None for boundary/interior) of the ``classes`` parameter."""
        if isinstance(classes, str):
            if classes != "boundary":
                raise ValueError(f"Balanced: classes must be 'boundary' or a mapping {{label_id: class_name}}, "
                                 f"got {classes!r}")
            return ("boundary", "interior"), None
        if not isinstance(classes, Mapping):
            raise ValueError(f"Balanced: classes must be 'boundary' or a mapping {{label_id: class_name}}, "
                             f"got {classes!r}")
        if not classes:
            raise ValueError("Balanced: classes must map at least one label id to a class name")
        for label_id, class_name in classes.items():
            if not is_integer(label_id) or not ID_RANGE[0] <= int(label_id) <= ID_RANGE[1]:
                raise ValueError(f"Balanced: classes keys must be integer label ids, got {label_id!r}")
            if not isinstance(class_name, str) or not class_name:
                raise ValueError(f"Balanced: classes values must be non-empty class names, got "
                                 f"{class_name!r} for label id {label_id}")
        mapping = {int(k): v for k, v in classes.items()}
        names = tuple(dict.fromkeys(mapping.values()))
        if len(names) >= _sampling.NO_CLASS:
            raise ValueError(f"Balanced: at most {_sampling.NO_CLASS - 1} classes, got {len(names)}")
        return names, mapping

    def _priors(self, priors) -> Dict[str, float]:
        if priors is None:
            return {name: 1.0 for name in self.class_names}
        if not isinstance(priors, Mapping):
            raise ValueError(f"Balanced: priors must be a mapping {{class_name: weight}} or None, got {priors!r}")
        for class_name, weight in priors.items():
            if class_name not in self.class_names:
                raise ValueError(f"Balanced: priors name the class {class_name!r}, which does not exist; the "
                                 f"classes are {', '.join(repr(c) for c in self.class_names)}")
            real(weight, f"Balanced: the prior of class {class_name!r}", 0.0)
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

    def _tile(self, grid, shape: np.ndarray, itemsize: int) -> Tuple[int, int]:
        """(block rows along z, block rows along y) of a tile of labels read at once, whole along x, within
        :data:`~emfast.sampling._base.TILE_BYTES` with its halo where one block row allows: whole planes of
        6144 x 6144 uint32 labels took 2 GB a slab (a review)."""
        halo = 2 * self._halo()
        width = int(shape[2] + halo[2]) * itemsize
        plane = int(shape[1] + halo[1]) * width
        rows = _base.TILE_BYTES // (plane * self.block[0] + plane * int(halo[0]))
        if rows >= 1:
            return min(rows, grid[0]), grid[1]
        lines = _base.TILE_BYTES // ((self.block[0] + int(halo[0])) * width * self.block[1])
        return 1, max(1, min(lines, grid[1]))

    def _view(self, labels: Volume, lo: np.ndarray, hi: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(labels around the box [lo, hi), position of that array's voxel 0): the whole array of an in-memory
        volume, else the box plus its halo read from the file."""
        if labels.in_memory:
            return labels.array[0], np.zeros(3, dtype=np.int64)
        start = np.maximum(lo - self._halo(), 0)
        stop = np.minimum(hi + self._halo(), np.asarray(labels.shape))
        return read_box(labels, start, stop - start), start

    def _count(self, region: Region, rule, centre_lo: np.ndarray, centre_hi: np.ndarray) -> _Classes:
        """Class counts of the voxels of the raw box [centre_lo, centre_hi) that lie in the label volume."""
        labels = region.labels
        origin = label_origin(region)
        lo = np.maximum(centre_lo - origin, 0)
        hi = np.minimum(centre_hi - origin, np.asarray(labels.shape))
        classes = len(self.class_names)
        if np.any(lo >= hi):
            return _Classes(np.zeros((classes, 0), np.int64), lo, hi, (0, 0, 0))
        block = np.asarray(self.block, dtype=np.int64)
        grid = _sampling.grid_shape(lo, hi, block)
        counts = np.empty(grid + (classes,), dtype=np.uint32)
        rows, lines = (grid[0], grid[1]) if labels.in_memory else \
            self._tile(grid, hi - lo, labels.dtype.itemsize)
        for row in range(0, grid[0], rows):
            for line in range(0, grid[1], lines):
                box_lo = lo + [row * self.block[0], line * self.block[1], 0]
                box_hi = np.minimum(hi, lo + [(row + rows) * self.block[0], (line + lines) * self.block[1], hi[2]])
                data, start = self._view(labels, box_lo, box_hi)
                if lines >= grid[1]:  # whole planes: the counts' rows are consecutive
                    _sampling.count_classes(data, rule, box_lo - start, box_hi - start, block, counts[row:row + rows])
                    continue
                part = np.empty(_sampling.grid_shape(box_lo, box_hi, block) + (classes,), dtype=np.uint32)
                _sampling.count_classes(data, rule, box_lo - start, box_hi - start, block, part)
                counts[row:row + part.shape[0], line:line + part.shape[1]] = part
        cumulative = np.cumsum(counts.reshape(-1, classes), axis=0, dtype=np.int64).T.copy()
        return _Classes(cumulative, lo + origin, hi + origin, grid)

    def bind(self, regions, extents, batch_size, rank=0, world_size=1) -> None:
        super().bind(regions, extents, batch_size, rank, world_size)
        extents = np.asarray(extents, dtype=np.int64).reshape(-1, 3)
        for region in self.regions:
            if region.labels is None:
                raise ValueError(f"{self!r}: region {region.name!r} has no labels")
            one_channel(region.labels, "labels", region, repr(self))
        half = (extents - 1) // 2
        self._classes: List[_Classes] = []
        self._rules = []
        for region in self.regions:
            # voxels whose centred window fits [lo, hi) for every extent
            centre_lo = np.asarray(region.lo, np.int64) + half.max(axis=0)
            centre_hi = (np.asarray(region.hi, np.int64) - extents + half + 1).min(axis=0)
            rule = self._rule(region.labels.dtype)
            self._rules.append(rule)
            self._classes.append(self._indexed(region, (centre_lo.tobytes(), centre_hi.tobytes()),
                                               lambda: self._count(region, rule, centre_lo, centre_hi)))
        self._forget_previous_indexes()
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
                warn_user(f"{self!r}: class {name!r} is absent from region(s) {', '.join(map(repr, absent))}; "
                              f"its prior goes to the classes present there")
        for i in np.flatnonzero(~usable):
            warn_user(f"{self!r}: region {self.regions[i].name!r} has no voxel of a class with a positive "
                          f"prior; it is skipped and its weight goes to the other regions")
        weights = np.asarray([region.weight for region in self.regions], dtype=np.float64)
        self._cumulative_weights = cumulative_shares(redistributed(weights, usable))
        self._class_weights = [cumulative_shares(row) if row.sum() > 0 else None for row in effective]

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
        origin = label_origin(region)
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
            cls = int(pick(self._class_weights[volume], uniforms[n, 1:2])[0])
            total = int(self._classes[volume].totals[cls])
            rank = int(uniform_offsets(uniforms[n, 2], total))
            corners[n] = self._voxel(volume, cls, rank) - (extents[n] - 1) // 2
        return Draw(volumes=volumes, corners=corners, valid=len(volumes))

    def __repr__(self) -> str:
        classes = "'boundary'" if self.mapping is None else repr(self.mapping)
        boundary = f", thickness={self.thickness}, in_plane={self.in_plane}" if self.mapping is None else ""
        return f"Balanced(classes={classes}, priors={self.priors!r}{boundary})"

