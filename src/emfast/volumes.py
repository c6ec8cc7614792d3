"""Volume sources: HDF5 datasets (h5py) and NumPy arrays or memmaps, with their metadata.

A :class:`Volume` is a 3-D (z, y, x) or 4-D (c, z, y, x) array. It is either in memory (or memory-mapped), in
which case the gather kernel reads it directly, or lazy, in which case each window is read from the HDF5 file
into a pre-allocated buffer. HDF5 files are always opened read-only.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import h5py
import numpy as np

RAW_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32))
LABEL_DTYPES = (np.dtype(np.uint32), np.dtype(np.uint64), np.dtype(np.int64))
SUPPORTED_DTYPES = RAW_DTYPES + LABEL_DTYPES

#: z-sections checked per step when scanning a float volume for NaN or infinity (bounds temporary memory).
_FINITE_CHECK_SECTIONS = 16

Triple = Tuple[float, float, float]


class DatasetNotFoundError(KeyError):
    """A dataset named by the user does not exist in its HDF5 file."""

    def __str__(self) -> str:  # KeyError would print the message quoted, like a key
        return str(self.args[0])


def _triple(value, what: str, source: str) -> Optional[Triple]:
    if value is None:
        return None
    array = np.asarray(value, dtype=np.float64).ravel()
    if array.shape != (3,) or not np.all(np.isfinite(array)):
        raise ValueError(f"{source}: {what} must be 3 finite numbers (z, y, x), got {value!r}")
    return tuple(float(v) for v in array)


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
    """

    def __init__(self, data, *, name: str, resolution=None, offset=None, chunks=None, file=None) -> None:
        if data.ndim not in (3, 4):
            raise ValueError(f"{name}: expected a 3-D (z, y, x) or 4-D (c, z, y, x) volume, "
                             f"got {data.ndim}-D shape {tuple(data.shape)}")
        dtype = np.dtype(data.dtype)
        if isinstance(data, np.ndarray) and not dtype.isnative:
            raise TypeError(f"{name}: byte-swapped dtype {dtype}; convert it with "
                            f"array.astype(array.dtype.newbyteorder('='))")
        dtype = dtype.newbyteorder("=")  # HDF5 converts big-endian data when it is read into native buffers
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}: unsupported dtype {data.dtype}; supported: "
                            f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
        if 0 in data.shape:
            raise ValueError(f"{name}: volume is empty (shape {tuple(data.shape)})")
        self.name = name
        self.dtype = dtype
        full_shape = tuple(int(s) for s in data.shape)
        self.channels = full_shape[0] if data.ndim == 4 else 1
        self.shape = full_shape[-3:]
        self.chunks = chunks
        self.resolution = _triple(resolution, "resolution", name)
        self.offset = _triple(offset, "offset", name)
        self._file = file
        self._dataset = None if isinstance(data, np.ndarray) else data
        self._array = None
        if isinstance(data, np.ndarray):
            self._array = data if data.ndim == 4 else data[np.newaxis]

    @classmethod
    def from_array(cls, array: np.ndarray, *, name: str = "array", resolution=None, offset=None) -> "Volume":
        """Wrap a NumPy array or memmap of shape (z, y, x) or (c, z, y, x) without copying it."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: expected a NumPy array, got {type(array).__name__}")
        return cls(array, name=name, resolution=resolution, offset=offset)

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

    def read_box(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> np.ndarray:
        """Read the box ``[corner, corner + extent)`` (z, y, x) of every channel into ``out`` (c, *extent)."""
        box = tuple(slice(int(c), int(c) + int(e)) for c, e in zip(corner, extent))
        if self._array is not None:
            np.copyto(out, self._array[(slice(None),) + box])
        elif self._dataset.ndim == 4:
            self._dataset.read_direct(out, source_sel=(slice(None),) + box)
        else:
            self._dataset.read_direct(out[0], source_sel=box)
        return out

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


def _open_hdf5(path: Union[str, os.PathLike]) -> h5py.File:
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


def hdf5(path: Union[str, os.PathLike], dataset: str, *, in_memory: bool = True) -> Volume:
    """Open a dataset of an HDF5 file as a :class:`Volume`, read-only.

    Parameters
    ----------
    path : str or path-like
        The HDF5 file. It is opened read-only and never modified.
    dataset : str
        Path of the dataset inside the file, e.g. ``"volumes/raw"``.
    in_memory : bool
        Load the whole dataset into memory (fastest; the default) or read each window from the file lazily
        (for volumes larger than memory; reads hold h5py's global lock, so they do not run in parallel).

    Raises
    ------
    FileNotFoundError, IsADirectoryError, OSError
        The path is missing, is a directory, or is not an HDF5 file.
    DatasetNotFoundError
        No dataset of that name; the message lists the datasets the file has.
    TypeError, ValueError
        Unsupported dtype, or not 3-D/4-D.
    """
    file = _open_hdf5(path)
    name = f"{path}:{dataset}"
    try:
        node = file.get(dataset)
        if node is None:
            available = ", ".join(list_datasets(file)) or "none"
            raise DatasetNotFoundError(f"dataset {dataset!r} not found in {path}; datasets there: {available}")
        if not isinstance(node, h5py.Dataset):
            raise ValueError(f"{name} is a group, not a dataset; datasets in the file: "
                             f"{', '.join(list_datasets(file))}")
        attrs = dict(resolution=node.attrs.get("resolution"), offset=node.attrs.get("offset"), chunks=node.chunks)
        if in_memory:
            check = Volume(node, name=name, **attrs)  # validates dtype and shape before reading everything
            data = np.empty(node.shape, dtype=check.dtype)
            node.read_direct(data)
            file.close()
            return Volume(data, name=name, **attrs)
        return Volume(node, name=name, file=file, **attrs)
    except BaseException:
        file.close()
        raise


def as_volume(source, name: str) -> Volume:
    """Accept a :class:`Volume` or a NumPy array (wrapped without copying)."""
    if isinstance(source, Volume):
        return source
    if isinstance(source, np.ndarray):
        return Volume.from_array(source, name=name)
    raise TypeError(f"{name} must be an emfast Volume (emfast.hdf5(...)) or a NumPy array, "
                    f"got {type(source).__name__}")
