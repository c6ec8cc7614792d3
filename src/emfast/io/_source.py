"""The volume-source protocol: what a stored volume must offer for emfast to read it, in memory or lazily.

Every format (HDF5, zarr, N5, neuroglancer precomputed) implements :class:`VolumeSource`; a
:class:`~emfast.io.Volume` reads a source whole into memory, or window by window through the bounded chunk cache,
which asks the source for one block (a chunk of the store) at a time. Sources are read-only: none of them ever
writes to the user's store.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

Triple = Tuple[float, float, float]


class DatasetNotFoundError(KeyError):
    """A dataset (array) named by the user does not exist in its file or store."""

    def __str__(self) -> str:  # KeyError would print the message quoted, like a key
        return str(self.args[0])


@dataclass(frozen=True)
class Stamp:
    """Where a volume was opened from, and how its data looked at that moment, to tell later whether it changed.

    Attributes
    ----------
    path : pathlib.Path
        Absolute path of the file or store.
    dataset : str
        Path of the dataset (array) inside it.
    size, mtime_ns : int
        ``os.stat`` of ``marker`` when the volume was opened.
    marker : pathlib.Path
        The file whose stat stands for the data: the HDF5 file itself, or a store's array metadata file
        (rewritten whenever the array is recreated or resized).
    """

    path: Path
    dataset: str
    size: int
    mtime_ns: int
    marker: Optional[Path] = None

    @classmethod
    def of(cls, path, dataset: str, marker=None) -> "Stamp":
        marker = Path(path if marker is None else marker)
        stat = os.stat(marker)
        return cls(Path(path).resolve(), dataset, stat.st_size, stat.st_mtime_ns, marker.resolve())

    def unchanged(self) -> bool:
        """True if the marker file still has the size and modification time it had when the volume was opened."""
        try:
            now = os.stat(self.marker or self.path)
        except OSError:
            return False
        return (now.st_size, now.st_mtime_ns) == (self.size, self.mtime_ns)


class VolumeSource:
    """A stored 3-D (z, y, x) or 4-D (c, z, y, x) volume, read-only.

    Attributes
    ----------
    name : str
        ``container:dataset``, used in every message.
    full_shape : tuple of int
        The stored shape, 3-D or 4-D (channels first).
    dtype : numpy.dtype
        The stored element type (byte order as stored; reads deliver native order).
    chunks : tuple of int or None
        The store's chunk shape along (z, y, x), or None for unchunked data.
    resolution, offset : tuple of float or None
        Voxel size and world position of voxel (0, 0, 0), in (z, y, x) order, from the store's metadata.
    stamp : Stamp
        Location and state when opened (statistics cache key, pickling, change detection).
    """

    name: str
    full_shape: Tuple[int, ...]
    dtype: np.dtype
    chunks: Optional[Tuple[int, int, int]] = None
    resolution: Optional[Triple] = None
    offset: Optional[Triple] = None
    stamp: Stamp

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        """Fill ``out`` (c, dz, dy, dx), native byte order, with the box ``[corner, corner + extent)`` of every
        channel. The box lies inside the volume. Safe to call from several threads at once."""
        raise NotImplementedError

    def attributes(self) -> dict:
        """The dataset's own metadata attributes (what ``emfast convert`` carries over)."""
        return {}

    def reopen_arguments(self) -> tuple:
        """The arguments of this class that open the same source again (a lazy volume pickles as them)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release open files; reads after it fail."""
