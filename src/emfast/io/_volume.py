"""Volume sources: HDF5 datasets (h5py) and NumPy arrays or memmaps, with their metadata.

A :class:`Volume` is a 3-D (z, y, x) or 4-D (c, z, y, x) array. It is either in memory (or memory-mapped), in
which case the gather kernel reads it directly, or lazy, in which case each window is assembled into a
pre-allocated buffer from a bounded cache of the file's chunks (:mod:`emfast.io._chunkcache`). HDF5 files are always
opened read-only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import h5py
import numpy as np

from .._checks import triple
from .._core.common import LABEL_DTYPES, RAW_DTYPES
from ._chunkcache import CacheStats, ChunkCache, check_budget, default_budget

SUPPORTED_DTYPES = RAW_DTYPES + LABEL_DTYPES

#: z-sections checked per step when scanning a float volume for NaN or infinity (bounds temporary memory).
_FINITE_CHECK_SECTIONS = 16
#: Default most bytes of one slab yielded by :meth:`Volume.slabs`.
SLAB_BYTES = 32 << 20

Triple = Tuple[float, float, float]


class DatasetNotFoundError(KeyError):
    """A dataset named by the user does not exist in its HDF5 file."""

    def __str__(self) -> str:  # KeyError would print the message quoted, like a key
        return str(self.args[0])


@dataclass(frozen=True)
class Source:
    """The HDF5 dataset a volume was opened from, and its file's size and modification time at that moment.

    Attributes
    ----------
    path : pathlib.Path
        Absolute path of the file.
    dataset : str
        Path of the dataset inside the file.
    size, mtime_ns : int
        ``os.stat`` of the file when the volume was opened.
    """

    path: Path
    dataset: str
    size: int
    mtime_ns: int

    def unchanged(self) -> bool:
        """True if the file still has the size and modification time it had when the volume was opened."""
        try:
            now = os.stat(self.path)
        except OSError:
            return False
        return (now.st_size, now.st_mtime_ns) == (self.size, self.mtime_ns)


def _checked_dtype(data, name: str) -> np.dtype:
    """The native dtype of a 3-D/4-D array or dataset; TypeError/ValueError for anything a Volume cannot hold."""
    if data.ndim not in (3, 4):
        raise ValueError(f"{name}: expected a 3-D (z, y, x) or 4-D (c, z, y, x) volume, "
                         f"got {data.ndim}-D shape {tuple(data.shape)}")
    dtype = np.dtype(data.dtype)
    if isinstance(data, np.ndarray) and not dtype.isnative:
        raise TypeError(f"{name}: byte-swapped dtype {dtype}; convert it with "
                        f"array.astype(array.dtype.newbyteorder('='))")
    dtype = dtype.newbyteorder("=")  # HDF5 converts big-endian data when it is read into native buffers
    if dtype == np.dtype(bool):
        return np.dtype(np.uint8)  # a mask: bool is one byte of 0 or 1, read as uint8 without a copy
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: unsupported dtype {data.dtype}; supported: "
                        f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if 0 in data.shape:
        raise ValueError(f"{name}: volume is empty (shape {tuple(data.shape)})")
    return dtype


class Volume:
    """A 3-D or 4-D EM volume, in memory, memory-mapped or read lazily from HDF5.

    Build one with :meth:`from_array` or :func:`hdf5`.

    Attributes
    ----------
    name : str
        Where the data comes from (``file.h5:dataset`` or ``array``), used in every error message.
    shape : tuple of int
        Spatial shape (z, y, x).
    channels : int
        Number of channels (1 for a 3-D source).
    dtype : numpy.dtype
        Element type.
    chunks : tuple of int or None
        HDF5 chunk shape, if chunked.
    resolution, offset : tuple of float or None
        Voxel size and world position of voxel (0, 0, 0), from the ``resolution`` / ``offset`` attributes.
    in_memory : bool
        True when the kernels read :attr:`array` directly; False for lazy HDF5 reads.
    source : Source or None
        The HDF5 file and dataset the volume came from (None for arrays).
    """

    def __init__(self, data, *, name: str, resolution=None, offset=None, chunks=None, file=None, source=None,
                 cache_bytes: Optional[int] = None) -> None:
        dtype = _checked_dtype(data, name)
        self.name = name
        self.dtype = dtype
        full_shape = tuple(int(s) for s in data.shape)
        self.channels = full_shape[0] if data.ndim == 4 else 1
        self.shape = full_shape[-3:]
        self.chunks = chunks
        self.resolution = None if resolution is None else triple(resolution, f"{name}: resolution", integer=False)
        self.offset = None if offset is None else triple(offset, f"{name}: offset", integer=False)
        self.source = source
        self._file = file
        self._dataset = None if isinstance(data, np.ndarray) else data
        self._array = None
        self._cache = None
        if isinstance(data, np.ndarray):
            if data.dtype == bool:
                data = data.view(np.uint8)  # a bool mask, as the uint8 it is byte for byte
            self._array = data if data.ndim == 4 else data[np.newaxis]
        else:
            self._cache = ChunkCache(data, dtype, default_budget() if cache_bytes is None else cache_bytes, name)

    @classmethod
    def from_array(cls, array: np.ndarray, *, name: str = "array", resolution=None, offset=None) -> "Volume":
        """Wrap a NumPy array or memmap of shape (z, y, x) or (c, z, y, x) without copying it."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: expected a NumPy array, got {type(array).__name__}")
        return cls(array, name=name, resolution=resolution, offset=offset)

    def __reduce__(self):
        """Pickle an in-memory volume with its data, a lazy one as its file and dataset (reopened read-only)."""
        if self._array is not None:
            return _rebuilt_volume, (self._array, self.name, self.resolution, self.offset, self.chunks, self.source)
        return _reopened_volume, (str(self.source.path), self.source.dataset, self._cache.budget_bytes)

    @property
    def in_memory(self) -> bool:
        return self._array is not None

    @property
    def array(self) -> np.ndarray:
        """The data as a 4-D (c, z, y, x) array (in-memory volumes only)."""
        if self._array is None:
            raise RuntimeError(f"{self.name} is read lazily; it has no in-memory array")
        return self._array

    @property
    def nbytes(self) -> int:
        return self.channels * int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def cache_stats(self) -> Optional[CacheStats]:
        """Counters of the chunk cache of a lazy volume (hits, misses, bytes held, ...); None in memory."""
        return None if self._cache is None else self._cache.stats

    def read_box(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> np.ndarray:
        """Read the box ``[corner, corner + extent)`` (z, y, x) of every channel into ``out``.

        Safe to call from several threads at once. Lazy volumes assemble the box from the chunk cache.

        Parameters
        ----------
        corner, extent : sequence of 3 int
            First voxel and size (z, y, x) of the box; it must lie inside the volume.
        out : numpy.ndarray
            Writable array of shape ``(channels, *extent)`` and the volume's dtype.

        Returns
        -------
        numpy.ndarray
            ``out``.
        """
        corner = tuple(int(c) for c in corner)
        extent = tuple(int(e) for e in extent)
        if (len(corner) != 3 or len(extent) != 3 or min(corner) < 0 or min(extent) < 1
                or any(c + e > s for c, e, s in zip(corner, extent, self.shape))):
            raise ValueError(f"{self.name}: box at {corner} of extent {extent} is not inside the volume "
                             f"of shape {self.shape}")
        if not isinstance(out, np.ndarray) or out.shape != (self.channels,) + extent or out.dtype != self.dtype:
            got = f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ValueError(f"{self.name}: out must be a {self.dtype} array of shape "
                             f"{(self.channels,) + extent}, got {got}")
        box = tuple(slice(c, c + e) for c, e in zip(corner, extent))
        if self._array is not None:
            np.copyto(out, self._array[(slice(None),) + box])
        else:
            self._cache.read_box(corner, extent, out)
        return out

    def slabs(self, max_bytes: int = SLAB_BYTES):
        """Yield ``(z, slab)``: the whole volume as consecutive (c, dz, y, x) slabs starting at section ``z``.

        Slabs hold whole sections and at most ``max_bytes`` (but at least one section); for chunked files their
        thickness is a multiple of the chunks' z size where possible, so no chunk is decoded twice. Lazy volumes
        read each slab straight from the file into one reused buffer, bypassing (and not disturbing) the chunk
        cache: a slab is valid only until the next one is yielded. In-memory volumes yield views.
        """
        section = self.channels * self.shape[1] * self.shape[2] * self.dtype.itemsize
        step = max(1, int(max_bytes) // section)
        if self.chunks is not None and step >= self.chunks[-3]:
            step -= step % self.chunks[-3]
        step = min(step, self.shape[0])
        section_shape = (self.shape[1], self.shape[2])
        buffer = None if self._array is not None else np.empty(self.channels * step * int(np.prod(section_shape)),
                                                               self.dtype)
        for z in range(0, self.shape[0], step):
            dz = min(step, self.shape[0] - z)
            if buffer is None:
                yield z, self._array[:, z:z + dz]
            else:  # a contiguous prefix of the buffer, as HDF5 needs
                slab = buffer[:self.channels * dz * int(np.prod(section_shape))].reshape(
                    (self.channels, dz) + section_shape)
                if self._dataset.ndim == 4:
                    self._dataset.read_direct(slab, source_sel=np.s_[:, z:z + dz])
                else:
                    self._dataset.read_direct(slab[0], source_sel=np.s_[z:z + dz])
                yield z, slab

    def check_finite(self) -> None:
        """Raise ValueError if a float volume held in memory contains NaN or infinity."""
        if self.dtype.kind != "f" or self._array is None:
            return
        for z in range(0, self.shape[0], _FINITE_CHECK_SECTIONS):
            section = self._array[:, z:z + _FINITE_CHECK_SECTIONS]
            if not np.isfinite(section).all():
                bad = np.argwhere(~np.isfinite(section))[0]
                raise ValueError(f"{self.name}: contains NaN or infinity, first at (c, z, y, x) = "
                                 f"({bad[0]}, {z + bad[1]}, {bad[2]}, {bad[3]})")

    def close(self) -> None:
        """Close the HDF5 file of a lazy volume (in-memory volumes hold no file)."""
        if self._cache is not None:
            self._cache.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Volume":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "in memory" if self.in_memory else "lazy"
        channels = f"{self.channels} channels, " if self.channels > 1 else ""
        return f"Volume({self.name!r}, shape={self.shape}, {channels}dtype={self.dtype}, {where})"


def open_hdf5(path: Union[str, os.PathLike]) -> h5py.File:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not an HDF5 file")
    if not path.exists():
        raise FileNotFoundError(f"HDF5 file not found: {path}")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise OSError(f"cannot open {path} as an HDF5 file: {exc}") from exc


def list_datasets(file: h5py.File) -> list[str]:
    """Names of all datasets in an open HDF5 file, depth first."""
    names: list[str] = []
    file.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def hdf5(path: Union[str, os.PathLike], dataset: str, *, in_memory: bool = True,
         cache_bytes: Optional[int] = None) -> Volume:
    """Open a dataset of an HDF5 file as a :class:`Volume`, read-only.

    Parameters
    ----------
    path : str or path-like
        The HDF5 file. It is opened read-only and never modified.
    dataset : str
        Path of the dataset inside the file, e.g. ``"volumes/raw"``.
    in_memory : bool
        Load the whole dataset into memory (fastest; the default), or read windows lazily through a bounded
        cache of the file's chunks (for volumes larger than memory).
    cache_bytes : int, optional
        Lazy volumes only: most bytes of decompressed chunks kept in memory, least recently used dropped
        first. Default: 1 GiB, or an eighth of physical memory if smaller (:func:`emfast.io._chunkcache.
        default_budget`). A cache block is one HDF5 chunk with all channels (64x64x64 voxels for unchunked
        datasets); the budget must hold at least one, and should hold several windows' worth for good hit
        rates. Threads that need the same missing chunk read it once; shuffle/gzip chunks are decompressed
        outside h5py's global lock, so several loader threads decode in parallel.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, OSError
        The path is missing, is a directory, or is not an HDF5 file.
    DatasetNotFoundError
        No dataset of that name; the message lists the datasets the file has.
    TypeError, ValueError
        Unsupported dtype, or not 3-D/4-D; a ``cache_bytes`` that is not a positive integer, is smaller than
        one cache block, or is given with ``in_memory=True``.
    """
    name = f"{path}:{dataset}"
    if cache_bytes is not None:
        if in_memory:
            raise ValueError(f"{name}: cache_bytes applies to lazy volumes; pass in_memory=False with it")
        cache_bytes = check_budget(cache_bytes, name)
    file = open_hdf5(path)
    try:
        node = file.get(dataset)
        if node is None:
            available = ", ".join(list_datasets(file)) or "none"
            raise DatasetNotFoundError(f"dataset {dataset!r} not found in {path}; datasets there: {available}")
        if not isinstance(node, h5py.Dataset):
            raise ValueError(f"{name} is a group, not a dataset; datasets in the file: "
                             f"{', '.join(list_datasets(file))}")
        stat = os.stat(path)
        source = Source(Path(path).resolve(), dataset, stat.st_size, stat.st_mtime_ns)
        attrs = dict(resolution=node.attrs.get("resolution"), offset=node.attrs.get("offset"), chunks=node.chunks,
                     source=source)
        if in_memory:
            data = np.empty(node.shape, dtype=_checked_dtype(node, name))  # checked before reading everything
            try:
                node.read_direct(data)
            except OSError as error:  # h5py names neither file nor dataset (e.g. a corrupt compressed chunk)
                raise OSError(f"{name}: cannot read the dataset ({error}); the file may be truncated or "
                              "corrupt") from error
            file.close()
            return Volume(data, name=name, **attrs)
        return Volume(node, name=name, file=file, cache_bytes=cache_bytes, **attrs)
    except BaseException:
        file.close()
        raise


def _rebuilt_volume(array, name, resolution, offset, chunks, source) -> Volume:
    return Volume(array, name=name, resolution=resolution, offset=offset, chunks=chunks, source=source)


def _reopened_volume(path: str, dataset: str, cache_bytes: int) -> Volume:
    return hdf5(path, dataset, in_memory=False, cache_bytes=cache_bytes)


def as_volume(source, name: str) -> Volume:
    """Accept a :class:`Volume` or a NumPy array (wrapped without copying)."""
    if isinstance(source, Volume):
        return source
    if isinstance(source, np.ndarray):
        return Volume.from_array(source, name=name)
    raise TypeError(f"{name} must be an emfast Volume (emfast.hdf5(...)) or a NumPy array, "
                    f"got {type(source).__name__}")
