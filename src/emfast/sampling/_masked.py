"""The masked sampler: windows drawn uniformly among those that a mask, or the labelled part of the labels, covers
well enough, from a compact bitmap of the qualifying corners."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

import numpy as np

from .._checks import is_real, label_id, refusal, warn_user
from .._core import sampling as _sampling
from .._registry import register
from ..io import Volume
from . import _base
from ._base import (Draw, Region, Sampler, as_triple, cumulative_shares, one_channel, pick,
                    read_box, redistributed, uniform_offsets)


def _tile(corners, extent, width: int, voxel_bytes: int) -> Tuple[int, int]:
    """(corner planes, corner rows) of a tile of the index, whole along x: the tile and its coverage (``voxel_bytes``
    a voxel) within :data:`~emfast.sampling._base.TILE_BYTES`, reading the fewest voxels per corner. Each tile is
    read with the window's extent less one beyond its corners along z and y: tiles one plane deep read each plane
    ``extent[0]`` times (planes of 6144 x 6144 voxels were, and each slab took 1.2 G voxels, a review)."""
    rows = max(1, _base.TILE_BYTES // (voxel_bytes * width))  # (z, y) rows of the tile
    ez, ey = int(extent[0]), int(extent[1])
    # where no tile fits (a window's rows across the whole width are more than the bytes): one corner plane and
    # at least four windows' rows, reading each voxel at most 1.25 extent z times (tiles of one corner each read
    # it extent z x extent y times: 50 times slower than whole planes, a second review)
    best, choice = math.inf, (1, min(int(corners[1]), max(4 * ey, rows // ez - ey + 1)))
    planes = 1
    while True:
        planes = min(planes, int(corners[0]))
        lines = min(rows // (planes + ez - 1) - ey + 1, int(corners[1]))
        if lines >= 1:
            cost = (planes + ez - 1) / planes * (lines + ey - 1) / lines
            if cost < best:
                best, choice = cost, (planes, lines)
        if planes == int(corners[0]):
            return choice
        planes *= 2


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
@dataclass(eq=False)
class Masked(Sampler):
    """Windows drawn uniformly among those that a mask, or the labelled part of the labels, covers well enough.

    A window qualifies when at least ``min_fraction`` of its voxels are covered (``covered / window_voxels >=
    min_fraction`` in float64); voxels outside the mask or label volume count as not covered. With warps
    (``Rotate``, ``Scale``, ``Elastic``) the window judged is the one drawn, around which the warped window is read:
    a delivered mask may cover less (a scale below 1 shows more of the surroundings). A region is drawn by
    its weight, then one of its qualifying corners uniformly: the draw picks the k-th qualifying corner of a
    compact index (one bit per window position plus a running count per row of positions), never by rejection.

    The index is built at :meth:`bind` for each region and each window extent, in tiles of at most 256 MiB of
    the field and its coverage (several corner planes, and part of each where planes are wide), with separable
    running window sums (compiled, without the GIL), so its transient memory stays bounded; it holds about 1 bit
    per window position.

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

    min_fraction: float = 0.5
    source: str = "mask"
    unlabelled: int = 0
    name: ClassVar[str] = "masked"
    draws: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if not is_real(self.min_fraction) or not 0 < float(self.min_fraction) <= 1:
            raise refusal(f"Masked: min_fraction must be a number in (0, 1], got {self.min_fraction!r}",
                          "min_fraction")
        if self.source not in ("mask", "labels"):
            raise refusal(f"Masked: source must be 'mask' or 'labels', got {self.source!r}", "source")
        self.unlabelled = label_id(self.unlabelled, "Masked: unlabelled")
        self.min_fraction = float(self.min_fraction)

    def _volume(self, region: Region) -> Tuple[Volume, np.ndarray]:
        if self.source == "mask":
            volume, origin, what = region.mask, region.mask_origin, "mask"
        else:
            volume, origin, what = region.labels, region.labels_origin, "labels"
        if volume is None:
            raise ValueError(f"{self!r}: region {region.name!r} has no {what}")
        one_channel(volume, what, region, repr(self))
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
            data = read_box(volume, start - origin, stop - start)
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
        width = int(hi[2] - lo[2])
        step_z, step_y = _tile(corners[:2], extent, width, 1 + volume.dtype.itemsize)
        best = 0
        for z in range(0, int(corners[0]), step_z):
            planes = min(step_z, int(corners[0]) - z)
            for y in range(0, rows_y, step_y):
                ys = min(step_y, rows_y - y)
                tile = np.array([planes + extent[0] - 1, ys + extent[1] - 1, width], dtype=np.int64)
                coverage = self._coverage(volume, origin, lo + [z, y, 0], tile)
                if ys == rows_y:  # whole planes: their rows are consecutive
                    rows = slice(z * rows_y, (z + planes) * rows_y)
                    best = max(best, _sampling.window_bits(coverage, extent, threshold, bits[rows], counts[rows]))
                    continue
                tile_bits = np.empty((planes * ys, words), dtype=np.uint64)
                tile_counts = np.empty(planes * ys, dtype=np.int64)
                best = max(best, _sampling.window_bits(coverage, extent, threshold, tile_bits, tile_counts))
                for k in range(planes):
                    rows = slice((z + k) * rows_y + y, (z + k) * rows_y + y + ys)
                    bits[rows] = tile_bits[k * ys:(k + 1) * ys]
                    counts[rows] = tile_counts[k * ys:(k + 1) * ys]
        return _Corners(bits, np.cumsum(counts), rows_y, best)

    def bind(self, regions, extents, batch_size, rank=0, world_size=1) -> None:
        super().bind(regions, extents, batch_size, rank, world_size)
        unique = np.unique(np.asarray(extents, dtype=np.int64).reshape(-1, 3), axis=0)
        weights = np.asarray([region.weight for region in self.regions], dtype=np.float64)
        self._extents: Dict[Tuple[int, int, int], int] = {}
        self._corners: List[List[_Corners]] = []
        self._weights: List[np.ndarray] = []
        indexes = [[self._indexed(region, (extent.tobytes(),), lambda: self._index(region, extent))
                    for region in self.regions] for extent in unique]
        self._forget_previous_indexes()
        for k, (extent, index) in enumerate(zip(unique, indexes)):
            volume = math.prod(int(e) for e in extent)
            usable = np.asarray([c.total > 0 for c in index])
            if not usable.any():
                best = max(range(len(index)), key=lambda i: index[i].best)
                names = ", ".join(repr(r.name) for r in self.regions)
                raise ValueError(
                    f"{self!r}: no window of extent {as_triple(extent)} is covered to min_fraction="
                    f"{self.min_fraction} in any region ({names}); the best covered fraction is "
                    f"{index[best].best / volume:.4g} (region {self.regions[best].name!r})")
            for i in np.flatnonzero(~usable):
                warn_user(
                    f"{self!r}: region {self.regions[i].name!r} has no window of extent {as_triple(extent)} covered "
                    f"to min_fraction={self.min_fraction} (best: {index[i].best / volume:.4g}); it is skipped for "
                    f"that extent and its weight goes to the other regions")
            self._extents[as_triple(extent)] = k
            self._corners.append(index)
            self._weights.append(cumulative_shares(redistributed(weights, usable)))

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
            key = self._extents.get(as_triple(extent))
            if key is None:
                raise ValueError(f"{self!r}: window extent {as_triple(extent)} was not given to bind()")
            keys[n] = key
        volumes = np.empty(len(extents), dtype=np.int64)
        for key in np.unique(keys):
            members = keys == key
            volumes[members] = pick(self._weights[key], uniforms[members, 0])
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

