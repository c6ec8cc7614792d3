"""Per-volume intensity statistics for normalisation, computed in one streaming pass and cached on disk.

:func:`volume_statistics` reads a volume slab by slab (a lazy volume is never loaded whole, and its chunk cache is
left alone) and returns a :class:`VolumeStatistics`. 1- and 2-byte integer volumes (uint8, uint16, int8, int16) are
counted into a histogram, from which mean, variance and percentiles follow exactly; other volumes (float16, float32,
float64, uint32) are summed in float64 per
piece, and the pieces' means and squared deviations are merged with Chan et al.'s pairwise formula, which stays
accurate where a running sum of squares would cancel.

For a volume opened from an HDF5 file or a local store the result is cached as a small JSON file in the emfast
cache directory (``$EMFAST_CACHE_DIR``, else ``$XDG_CACHE_HOME/emfast``, else ``~/.cache/emfast``), never in the
user's files. The cache entry is keyed by the absolute path, the dataset, the size and modification time (ns) of the
file or of the store's array metadata, for a store a digest of every chunk file's name, size and modification time
(chunks rewritten in place leave the metadata as it was), and :data:`STATS_FORMAT_VERSION`, so changed data is
recomputed. A remote volume is not cached: its chunks can change unseen. An unwritable cache directory only costs
the caching (a warning), never the result.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import warnings
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Optional

import numpy as np

from .._core.common import RAW_DTYPES
from .._machine import cache_directory
from ._outputs import fingerprint
from ._remote import RemoteStamp
from ._volume import Volume, as_volume, first_non_finite

#: Bumped whenever the statistics or the cache file layout change; part of every cache key.
STATS_FORMAT_VERSION = 1
#: Percentiles reported for integer volumes (NumPy's default "linear" method).
PERCENTILES = (0.5, 99.5)
#: Bytes of one slab read from the volume (whole sections, chunk-aligned; see :meth:`Volume.slabs`).
_SLAB_BYTES = 32 << 20
#: Elements per piece of work within a slab (bounds the 8-byte temporaries to 8 x this many bytes).
_PIECE = 1 << 20

__all__ = ["PERCENTILES", "STATS_FORMAT_VERSION", "VolumeStatistics", "volume_statistics"]


@dataclass(frozen=True)
class VolumeStatistics:
    """Intensity statistics of a whole volume, over every voxel of every channel.

    Attributes
    ----------
    mean, std : float
        Mean and population standard deviation (``ddof=0``, as :func:`numpy.std`).
    min, max : float
        Smallest and largest value.
    count : int
        Number of values (channels x z x y x).
    p0_5, p99_5 : float or None
        The 0.5th and 99.5th percentiles, as :func:`numpy.percentile` computes them; integer volumes only (None
        for float32, where they would need a second pass).
    """

    mean: float
    std: float
    min: float
    max: float
    count: int
    p0_5: Optional[float]
    p99_5: Optional[float]


def volume_statistics(volume, *, cache: bool = True) -> VolumeStatistics:
    """Mean, standard deviation, range and (for integers) percentiles of a raw volume, in one streaming pass.

    Parameters
    ----------
    volume : Volume or numpy.ndarray
        A volume of a raw dtype (uint8, uint16, int8, int16, uint32, float16, float32, float64), in memory or
        lazy. Lazy volumes are read slab by slab (32 MiB at a time) straight from the file.
    cache : bool
        Reuse and store the result in the emfast cache directory, for volumes opened from an HDF5 file or a local
        store whose data has not changed since it was opened. Arrays and remote volumes are never cached.

    Returns
    -------
    VolumeStatistics

    Raises
    ------
    TypeError
        Not a volume or array, or not a raw dtype.
    ValueError
        A float volume contains NaN or infinity (the message names the volume and the first such voxel).
    """
    volume = as_volume(volume, "volume")
    if volume.dtype not in RAW_DTYPES:
        raise TypeError(f"{volume.name}: statistics are for raw volumes "
                        f"({', '.join(str(d) for d in RAW_DTYPES)}), not {volume.dtype}")
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be True or False, got {cache!r}")
    entry = _CacheEntry.for_volume(volume) if cache else None
    if entry is not None:
        cached = entry.load()
        if cached is not None:
            return cached
    histogram = volume.dtype.kind in "ui" and volume.dtype.itemsize <= 2
    statistics = _integer_statistics(volume) if histogram else _float_statistics(volume)
    if entry is not None:
        entry.store(statistics)
    return statistics


# -- computing ----------------------------------------------------------------------------------------------------

def _integer_statistics(volume: Volume) -> VolumeStatistics:
    levels = 1 << (8 * volume.dtype.itemsize)
    lowest = int(np.iinfo(volume.dtype).min)  # signed values are counted from the dtype's minimum
    histogram = np.zeros(levels, np.int64)
    for _, slab in volume.slabs(_SLAB_BYTES):
        flat = slab.reshape(-1)
        for start in range(0, flat.size, _PIECE):  # bincount widens to intp: bound that temporary
            histogram += np.bincount(flat[start:start + _PIECE].astype(np.intp) - lowest, minlength=levels)
    present = np.flatnonzero(histogram)
    values = [int(v) + lowest for v in present]
    counts = [int(c) for c in histogram[present]]
    count = sum(counts)
    total = sum(v * c for v, c in zip(values, counts))  # Python ints: exact whatever the volume size
    squares = sum(v * v * c for v, c in zip(values, counts))
    variance = Fraction(count * squares - total * total, count * count)
    cumulative = np.cumsum(histogram[present])
    p_low, p_high = (_percentile(present + lowest, cumulative, count, p) for p in PERCENTILES)
    return VolumeStatistics(mean=float(Fraction(total, count)), std=math.sqrt(variance), min=float(values[0]),
                            max=float(values[-1]), count=count, p0_5=p_low, p99_5=p_high)


def _percentile(values: np.ndarray, cumulative: np.ndarray, count: int, percent: float) -> float:
    """NumPy's "linear" percentile of the sorted data described by (distinct values, cumulative counts)."""
    index = np.float64(percent) / 100 * (count - 1)
    below = math.floor(index)
    gamma = np.float64(index - below)

    def sorted_value(k: int) -> np.float64:  # the k-th smallest value
        return np.float64(values[np.searchsorted(cumulative, k, side="right")])

    a, b = sorted_value(below), sorted_value(min(below + 1, count - 1))
    difference = b - a
    # numpy's _lerp: from whichever end is nearer, so the result is exact at both ends
    return float(b - difference * (1 - gamma) if gamma >= 0.5 else a + difference * gamma)


def _float_statistics(volume: Volume) -> VolumeStatistics:
    count, mean, squared = 0, 0.0, 0.0
    low, high = math.inf, -math.inf
    for z, slab in volume.slabs(_SLAB_BYTES):
        _check_finite(volume, z, slab)
        low, high = min(low, float(slab.min())), max(high, float(slab.max()))
        flat = slab.reshape(-1)
        for start in range(0, flat.size, _PIECE):
            piece = flat[start:start + _PIECE].astype(np.float64)
            n = piece.size
            with np.errstate(over="ignore", invalid="ignore"):  # values near float64's limits: an infinite or NaN
                piece_mean = float(piece.sum()) / n              # mean or std, which the normalisation names
                piece -= piece_mean
                piece_squared = float(np.dot(piece, piece))
            # Chan, Golub & LeVeque: merge (count, mean, M2) of two parts without cancellation
            merged = count + n
            delta = piece_mean - mean
            mean += delta * n / merged
            squared += piece_squared + delta * delta * count * n / merged
            count = merged
    return VolumeStatistics(mean=mean, std=math.sqrt(squared / count), min=low, max=high, count=count,
                            p0_5=None, p99_5=None)


def _check_finite(volume: Volume, z: int, slab: np.ndarray) -> None:
    bad = first_non_finite(slab, sections=max(1, slab.shape[1]))  # the slab read, at once
    if bad is not None:
        c, dz, y, x = bad
        raise ValueError(f"{volume.name}: contains NaN or infinity, first at (c, z, y, x) = "
                         f"({c}, {z + dz}, {y}, {x}); statistics need finite values")


# -- caching ------------------------------------------------------------------------------------------------------

class _CacheEntry:
    """The JSON cache file of one dataset at one version of its data."""

    def __init__(self, key: dict) -> None:
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        self.directory = cache_directory(None) / "stats"
        self.path = self.directory / f"stats-{digest}.json"

    @classmethod
    def for_volume(cls, volume: Volume) -> Optional["_CacheEntry"]:
        source = volume.stamp
        # A file changed since it was opened may no longer hold the data this volume reads: do not cache.
        if source is None or isinstance(source, RemoteStamp) or not source.unchanged():
            return None
        key = {"format": STATS_FORMAT_VERSION, "path": str(source.path), "dataset": source.dataset,
               "size": source.size, "mtime_ns": source.mtime_ns}
        # a store's chunks are rewritten in place under the same metadata; an HDF5 link's or virtual dataset's
        # files are rewritten under the same file
        if not source.path.is_file() or source.data_files:
            if volume.in_memory:  # read when opened: the files now may hold other data than the statistics see
                return None
            try:
                key["data"] = fingerprint(source)
            except OSError as error:  # a folder that cannot be listed: a change there would go unseen
                warnings.warn(f"{error}; volume statistics are not cached", RuntimeWarning, stacklevel=3)
                return None
        try:
            return cls(key)
        except OSError as error:  # no cache folder at all: the statistics are computed, not cached
            warnings.warn(f"{error}; volume statistics are recomputed each time", RuntimeWarning, stacklevel=3)
            return None

    def load(self) -> Optional[VolumeStatistics]:
        """The cached statistics, or None if there are none for this key (missing, stale or unreadable)."""
        try:
            with open(self.path, encoding="utf-8") as file:
                content = json.load(file)
            if content.get("key") != self.key:
                return None
            statistics = VolumeStatistics(**content["statistics"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):  # nested too deep
            return None
        return statistics if _plausible(statistics) else None  # a damaged entry is recomputed, never believed

    def store(self, statistics: VolumeStatistics) -> None:
        """Write the entry atomically (temporary file + rename); warn and carry on if that is impossible."""
        temporary = self.directory / f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temporary, "x", encoding="utf-8") as file:
                json.dump({"key": self.key, "statistics": asdict(statistics)}, file)
            os.replace(temporary, self.path)
        except OSError as exc:
            _remove_quietly(temporary)
            warnings.warn(f"emfast: cannot cache volume statistics in {self.directory} ({exc.strerror or exc}); "
                          f"they will be recomputed next time. Set EMFAST_CACHE_DIR to a writable directory.",
                          RuntimeWarning, stacklevel=3)


def _plausible(statistics: VolumeStatistics) -> bool:
    """Whether cached statistics could be a volume's: finite numbers, min <= mean <= max, std >= 0."""
    numbers = (statistics.mean, statistics.std, statistics.min, statistics.max)
    optional = tuple(p for p in (statistics.p0_5, statistics.p99_5) if p is not None)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in numbers + optional):
        return False
    count_ok = isinstance(statistics.count, int) and not isinstance(statistics.count, bool) and statistics.count > 0
    slack = 1e-6 * (abs(statistics.min) + abs(statistics.max) + 1)  # a mean's rounding past a constant's value
    return (count_ok and statistics.std >= 0
            and statistics.min - slack <= statistics.mean <= statistics.max + slack)


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # the directory itself is unusable; nothing was left behind
        pass
