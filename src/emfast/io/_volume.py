"""Volumes: a 3-D (z, y, x) or 4-D (c, z, y, x) array the kernels read, held in memory or read lazily from a
:class:`~emfast.io._source.VolumeSource` (HDF5, zarr, N5, precomputed) through the bounded chunk cache
(:mod:`emfast.io._chunkcache`). Stores are always opened read-only.
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Optional, Sequence, Tuple

import numpy as np

from .._checks import flag, is_integer, triple
from .._core.common import LABEL_DTYPES, RAW_DTYPES
from .._core.gather import gather_copy, pad_indices
from .._machine import available_bytes
from ._chunkcache import CacheStats, ChunkCache, check_budget, default_budget
from ._source import VolumeSource, plain
from ._whole import read_whole

SUPPORTED_DTYPES = tuple(dict.fromkeys(RAW_DTYPES + LABEL_DTYPES))  # uint32 is both

#: z-sections checked per step when scanning a float volume for NaN or infinity (bounds temporary memory).
_FINITE_CHECK_SECTIONS = 16
#: Default most bytes of one slab yielded by :meth:`Volume.slabs`.
SLAB_BYTES = 32 << 20
#: Most bytes ``np.asarray(volume)`` reads from a lazy volume; larger ones are read with read_box or slabs.
ASARRAY_LIMIT_BYTES = 1 << 30


class UnsupportedDtypeError(TypeError):
    """A stored array's dtype is none a volume holds (complex, strings, records): the user's data, not a bug."""


class VolumeTooLargeError(ValueError, MemoryError):
    """A volume opened in memory needs more memory than is available; it is refused before any is allocated."""


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2 ** 30:.3g} GiB"


def _refuse_if_too_large(shape, dtype: np.dtype, name: str) -> None:
    """Refuse to read a volume of ``shape`` into memory when it would not fit in the memory available now."""
    nbytes = math.prod(int(s) for s in shape) * dtype.itemsize
    available = available_bytes()
    if available is not None and nbytes > available:
        raise VolumeTooLargeError(f"{name}: {tuple(shape)} {dtype} is {_gib(nbytes)}, more than the "
                                  f"{_gib(available)} of memory available; open it lazily with in_memory=False "
                                  "(windows are then read through a bounded chunk cache)")

Triple = Tuple[float, float, float]


class _Described:
    """Shape and dtype of a source, for :func:`_checked_dtype`."""

    def __init__(self, shape, dtype) -> None:
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)


def _checked_dtype(data, name: str) -> np.dtype:
    """The native dtype of a 3-D/4-D array or dataset; TypeError/ValueError for anything a Volume cannot hold."""
    if data.ndim not in (3, 4):
        one_section = "; a 2-D image is one section: give it as image[np.newaxis], (1, y, x)" if data.ndim == 2 else ""
        raise ValueError(f"{name}: expected a 3-D (z, y, x) or 4-D (c, z, y, x) volume, "
                         f"got {data.ndim}-D shape {tuple(data.shape)}{one_section}")
    dtype = np.dtype(data.dtype)
    if isinstance(data, np.ndarray) and not dtype.isnative:
        raise TypeError(f"{name}: byte-swapped dtype {dtype}; convert it with "
                        f"array.astype(array.dtype.newbyteorder('='))")
    if isinstance(data, np.ndarray) and not data.flags.aligned:  # the kernels load whole elements
        raise TypeError(f"{name}: the array's data is not aligned to its {dtype.itemsize}-byte elements (a view at "
                        "an odd offset into a buffer or file, as np.memmap(offset=...) or np.frombuffer(offset=...) "
                        f"give); copy it with np.array(array), or map it at an offset that is a multiple of "
                        f"{dtype.itemsize}")
    dtype = dtype.newbyteorder("=")  # sources convert stored byte orders when they read into native buffers
    if dtype == np.dtype(bool):
        return np.dtype(np.uint8)  # a mask: bool is one byte of 0 or 1, read as uint8 without a copy
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedDtypeError(f"{name}: unsupported dtype {data.dtype}; supported: "
                                    f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if 0 in data.shape:
        raise ValueError(f"{name}: volume is empty (shape {tuple(data.shape)})")
    return dtype


class Volume:
    """A 3-D or 4-D EM volume, in memory, memory-mapped or read lazily from a store.

    Build one with :meth:`from_array`, :func:`emfast.open` or :func:`emfast.hdf5`.

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
        The store's chunk shape (z, y, x), if chunked.
    resolution, offset : tuple of float or None
        Voxel size and world position of voxel (0, 0, 0), (z, y, x), from the store's metadata.
    translation : tuple of float or None
        A binned level of an OME-NGFF image: the translation the image gives it (its first voxel's centre), which
        emfast's outputs of it carry in their OME-NGFF metadata beside ``offset``; None otherwise.
    in_memory : bool
        True when the kernels read :attr:`array` directly; False for lazy reads through the chunk cache.
    stamp : Stamp or None
        The file or store and dataset the volume came from, as it was when opened (None for arrays). Its former
        name ``source`` still works, with a DeprecationWarning, until the next minor version.
    stored_dtype : numpy.dtype
        The element type as stored, native byte order: ``bool`` for a boolean mask, which :attr:`dtype` gives as
        uint8 (0 or 1).
    """

    def __init__(self, data, *, name: Optional[str], resolution=None, offset=None, chunks=None, stamp=None,
                 cache_bytes: Optional[int] = None, source=None, translation=None) -> None:
        """``data``: a NumPy array (held as it is), or a :class:`VolumeSource` read lazily through a chunk cache of
        ``cache_bytes``; ``stamp`` is the :class:`Stamp` of an array read from a store (``source``: its deprecated
        name)."""
        if source is not None:
            warnings.warn("Volume(source=) is deprecated; use stamp= (the same Stamp)", DeprecationWarning,
                          stacklevel=2)
            stamp = source if stamp is None else stamp
        lazy = isinstance(data, VolumeSource)
        name = data.name if lazy and name is None else name
        dtype = _checked_dtype(_Described(data.full_shape, data.dtype) if lazy else data, name)
        self.name = name
        self.dtype = dtype
        self.stored_dtype = np.dtype(data.dtype).newbyteorder("=")
        full_shape = tuple(int(s) for s in (data.full_shape if lazy else data.shape))
        self.channels = full_shape[0] if len(full_shape) == 4 else 1
        self.shape = full_shape[-3:]
        self.chunks = plain(data.chunks if lazy else chunks)
        resolution, offset = (data.resolution, data.offset) if lazy else (resolution, offset)
        # positive: predict wrote a resolution of 0, and emfast then refused its own output
        self.resolution = None if resolution is None else triple(resolution, f"{name}: resolution", integer=False,
                                                                 minimum=0, strict=True)
        self.offset = None if offset is None else triple(offset, f"{name}: offset", integer=False)
        translation = data.translation if lazy else translation
        self.translation = None if translation is None else tuple(float(t) for t in translation)
        self.stamp = data.stamp if lazy else stamp
        self._reader: Optional[VolumeSource] = data if lazy else None
        self._closed = False  # a lazy volume, once closed (see close)
        self._array = None
        self._cache = None
        if lazy:
            budget = default_budget() if cache_bytes is None else cache_bytes
            try:
                self._cache = ChunkCache(data, dtype, budget, name)
            except MemoryError as error:  # a chunk grid beyond the address space (absurd metadata)
                raise VolumeTooLargeError(str(error)) from None
        else:
            if data.dtype == bool:
                data = data.view(np.uint8)  # a bool mask, as the uint8 it is byte for byte
            if self.stamp is not None:
                # It stands for its file: statistics are cached under the file's key and predict records the file's
                # fingerprint, so an array changed in place gave the file's key to other data (a review).
                data.flags.writeable = False
            self._array = data if data.ndim == 4 else data[np.newaxis]

    @classmethod
    def open(cls, source: VolumeSource, *, in_memory: bool = True, cache_bytes: Optional[int] = None) -> "Volume":
        """A volume of ``source``: read whole into memory (the source is closed after), or lazily. An array read
        into memory is read-only: it stands for the file (statistics are cached under the file's key, predict
        records the file's fingerprint); change a copy (``np.array(volume)``).

        Raises
        ------
        TypeError, ValueError
            Unsupported dtype or shape (the source is closed), or ``cache_bytes`` with ``in_memory=True``.
        VolumeTooLargeError
            ``in_memory=True`` for a volume larger than the memory available (a ValueError and a MemoryError).
        """
        name = source.name
        try:
            in_memory = flag(in_memory, "in_memory")  # "false" is a str, and true: it loaded the whole volume
            if cache_bytes is not None:
                if in_memory:
                    raise ValueError(f"{name}: cache_bytes applies to lazy volumes; pass in_memory=False with it")
                cache_bytes = check_budget(cache_bytes, name)
            if not in_memory:
                return cls(source, name=name, cache_bytes=cache_bytes)
            dtype = _checked_dtype(_Described(source.full_shape, source.dtype), name)
            _refuse_if_too_large(source.full_shape, dtype, name)
            try:
                data = np.empty(source.full_shape, dtype=dtype)
            except MemoryError:  # the memory available is unknown here, or was taken meanwhile
                size = _gib(math.prod(int(s) for s in source.full_shape) * dtype.itemsize)
                raise VolumeTooLargeError(f"{name}: cannot allocate {size} for {tuple(source.full_shape)} {dtype}; "
                                          "open it lazily with in_memory=False") from None
            read_whole(source, data if data.ndim == 4 else data[np.newaxis])
        except BaseException:
            source.close()
            raise
        source.close()
        volume = cls(data, name=name, resolution=source.resolution, offset=source.offset, chunks=source.chunks,
                     stamp=source.stamp, translation=source.translation)
        volume.stored_dtype = np.dtype(source.dtype).newbyteorder("=")
        return volume

    @classmethod
    def from_array(cls, array: np.ndarray, *, name: str = "array", resolution=None, offset=None) -> "Volume":
        """Wrap a NumPy array or memmap of shape (z, y, x) or (c, z, y, x) without copying it.

        Parameters
        ----------
        array : numpy.ndarray
            The data (a supported dtype; bool is read as uint8).
        name : str
            Named in messages and in a batch's ``names``.
        resolution, offset : (float, float, float), optional
            Voxel size and position of voxel (0, 0, 0) in nm (z, y, x), as a file's attributes would give them:
            they place the volume beside others (see :class:`~emfast.Sample`).
        """
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{name}: expected a NumPy array, got {type(array).__name__}")
        if not isinstance(name, str):  # messages and batches' names would carry None or 5 (a review)
            raise TypeError(f"Volume.from_array: name must be a string, got {name!r}")
        return cls(array, name=name, resolution=resolution, offset=offset)

    def __reduce__(self):
        """Pickle an in-memory volume with its data, a lazy one as its file and dataset (reopened read-only)."""
        if self._array is not None:
            array = self._array.view(bool) if self.stored_dtype == bool else self._array
            return _rebuilt_volume, (array, self.name, self.resolution, self.offset, self.chunks, self.stamp,
                                     self.translation)
        return _reopened_volume, (type(self._reader), self._reader.reopen_arguments(), self._cache.budget_bytes)

    @property
    def in_memory(self) -> bool:
        return self._array is not None

    @property
    def source(self):
        """Deprecated name of :attr:`stamp` ("source" also names the stores a volume reads, the
        :class:`VolumeSource`)."""
        warnings.warn("Volume.source is deprecated; use Volume.stamp (the same Stamp)", DeprecationWarning,
                      stacklevel=2)
        return self.stamp

    @property
    def array(self) -> np.ndarray:
        """The data as a 4-D (c, z, y, x) array (in-memory volumes only)."""
        if self._array is None:
            raise RuntimeError(f"{self.name} is read lazily; it has no in-memory array")
        return self._array

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The data as a (c, z, y, x) NumPy array, like :attr:`array`: ``np.asarray(volume)``.

        In-memory volumes give their array (a view unless ``copy=True`` or another ``dtype``). Lazy volumes are read
        whole, straight from the store, if they hold at most :data:`ASARRAY_LIMIT_BYTES` (1 GiB); larger ones are
        refused: read the part you need with :meth:`read_box`, or stream them with :meth:`slabs`.

        Raises
        ------
        ValueError
            A lazy volume larger than the limit, or ``copy=False`` where a copy is needed (NumPy 2's protocol).
        """
        if self._array is not None:
            data = self._array
        else:
            self._refuse_if_closed()
            if copy is False:
                raise ValueError(f"{self.name} is read lazily: np.asarray(copy=False) cannot give it without a copy")
            if self.nbytes > ASARRAY_LIMIT_BYTES:
                raise ValueError(f"{self.name}: np.asarray would read the whole lazy volume, {_gib(self.nbytes)}, "
                                 f"more than the {_gib(ASARRAY_LIMIT_BYTES)} limit; read the part you need with "
                                 "volume.read_box(corner, extent, out), or stream it with volume.slabs()")
            data = np.empty((self.channels,) + self.shape, self.dtype)
            read_whole(self._reader, data)
            copy = False  # freshly read: nobody else holds it
        if dtype is not None and np.dtype(dtype) != data.dtype:
            if copy is False:
                raise ValueError(f"{self.name}: np.asarray(dtype={np.dtype(dtype)}, copy=False) needs a copy "
                                 f"from {data.dtype}")
            return data.astype(dtype)
        return data.copy() if copy else data

    @property
    def nbytes(self) -> int:
        return self.channels * math.prod(self.shape) * self.dtype.itemsize  # Python ints: no overflow

    @property
    def chunk_cache(self) -> Optional[ChunkCache]:
        """The chunk cache a lazy volume reads through (the gather kernels read its blocks in place); None in
        memory."""
        return self._cache

    @property
    def cache_stats(self) -> Optional[CacheStats]:
        """Counters of the chunk cache of a lazy volume (hits, misses, bytes held, ...); None in memory."""
        return None if self._cache is None else self._cache.stats

    def read_box(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray, *,
                 timings=None) -> np.ndarray:
        """Read the box ``[corner, corner + extent)`` (z, y, x) of every channel into ``out``.

        Safe to call from several threads at once. Lazy volumes assemble the box from the chunk cache.

        Parameters
        ----------
        corner, extent : sequence of 3 int
            First voxel and size (z, y, x) of the box; it must lie inside the volume.
        out : numpy.ndarray
            Writable array of shape ``(channels, *extent)`` and the volume's dtype.
        timings : optional
            Told, as ``timings.add(stage, seconds)``, the seconds a lazy volume's chunk reads spent moving bytes
            ("fetch"), decoding ("decode") and waiting for another thread's read ("pending"), as a loader's
            profile counts them.

        Returns
        -------
        numpy.ndarray
            ``out``.
        """
        corner, extent = self._integers(corner, extent)
        if len(corner) != 3 or len(extent) != 3 or min(extent) < 1:
            raise ValueError(f"{self.name}: a box needs a corner and an extent of 3 values each (z, y, x), the "
                             f"extent at least 1 along each; got corner {corner} and extent {extent}")
        if min(corner) < 0 or any(c + e > s for c, e, s in zip(corner, extent, self.shape)):
            raise ValueError(f"{self.name}: box at {corner} of extent {extent} is not inside the volume "
                             f"of shape {self.shape}")
        if not isinstance(out, np.ndarray) or out.shape != (self.channels,) + extent or out.dtype != self.dtype:
            got = f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ValueError(f"{self.name}: out must be a {self.dtype} array of shape "
                             f"{(self.channels,) + extent}, got {got}")
        self._refuse_if_closed()
        self._refuse_read_only(out)
        box = tuple(slice(c, c + e) for c, e in zip(corner, extent))
        if self._array is not None:
            np.copyto(out, self._array[(slice(None),) + box])
        else:
            self._cache.read_box(corner, extent, out, timings)
        return out

    def _integers(self, corner, extent) -> tuple:
        """``corner`` and ``extent`` as tuples of ints, or a TypeError naming the volume: int() cut a corner of
        1.9 to 1 and read "1" and True as integers."""
        corner, extent = tuple(corner), tuple(extent)
        if not all(is_integer(v) for v in (*corner, *extent)):
            raise TypeError(f"{self.name}: a box takes integers, got corner {corner!r} and extent {extent!r}")
        return tuple(int(c) for c in corner), tuple(int(e) for e in extent)

    def _refuse_read_only(self, out) -> None:
        if isinstance(out, np.ndarray) and not out.flags.writeable:  # the kernels' refusal spoke of a 5-D shape
            raise ValueError(f"{self.name}: out is read-only; pass a writeable array")

    def __getitem__(self, key) -> np.ndarray:
        """``volume[z0:z1, y0:y1, x0:x1]``: a new (c, z, y, x) array of the box, like :meth:`read_box`.

        The key indexes the spatial axes (z, y, x) as NumPy indexes an array of that shape; every channel is
        returned, first, as :attr:`array`, :meth:`read_box` and ``np.asarray(volume)`` give them. So the result is
        ``np.asarray(volume)[(slice(None),) + key]``, a fresh C-ordered copy for in-memory and lazy volumes alike.

        Parameters
        ----------
        key : int, slice, Ellipsis or a tuple of up to 3 of them
            Integers (negative ones count from the end) drop their axis; slices may have any step; missing
            trailing axes are taken whole. A lazy volume reads the box spanning the selection through its chunk
            cache, at most :data:`ASARRAY_LIMIT_BYTES` (1 GiB) of it.

        Returns
        -------
        numpy.ndarray
            Shape ``(channels, *selected)`` and the volume's dtype.

        Raises
        ------
        IndexError
            More than 3 indices, more than one Ellipsis, or an integer outside the volume.
        TypeError
            Anything else as an index (arrays, lists, booleans, floats, None): volumes take ints and slices only.
        ValueError
            A lazy selection spanning more than the limit (read it with :meth:`read_box` or :meth:`slabs`).
        """
        selection = self._spatial_selection(key)
        shape = (self.channels,) + tuple(len(r) for r in selection if isinstance(r, range))
        if any(len(r) == 0 for r in selection if isinstance(r, range)):
            return np.empty(shape, self.dtype)
        low = [min(r) if isinstance(r, range) else r for r in selection]
        extent = tuple((max(r) + 1 if isinstance(r, range) else r + 1) - lo for r, lo in zip(selection, low))
        # Within the box from the selection's lowest to highest index, every step lands on the selection exactly.
        local = (slice(None),) + tuple(slice(None, None, r.step) if isinstance(r, range) else 0 for r in selection)
        if self._array is not None:
            box = self._array[(slice(None),) + tuple(slice(lo, lo + e) for lo, e in zip(low, extent))]
            return box[local].copy()
        nbytes = self.channels * math.prod(extent) * self.dtype.itemsize
        if nbytes > ASARRAY_LIMIT_BYTES:
            raise ValueError(f"{self.name}: volume[{key!r}] spans a box of {extent} voxels, {_gib(nbytes)}, more than "
                             f"the {_gib(ASARRAY_LIMIT_BYTES)} limit for a lazy volume; read it in parts with "
                             "volume.read_box(corner, extent, out), or stream it with volume.slabs()")
        box = self.read_box(low, extent, np.empty((self.channels,) + extent, self.dtype))
        return np.ascontiguousarray(box[local])

    def _spatial_selection(self, key) -> list:
        """Per spatial axis of ``key``: a range of the indices a slice selects, or an int index (axis dropped)."""
        key = key if isinstance(key, tuple) else (key,)
        ellipses = [i for i, item in enumerate(key) if item is Ellipsis]  # by identity: `in` would compare arrays
        if len(ellipses) > 1:
            raise IndexError(f"{self.name}: an index can only have a single ellipsis ('...'), got {key!r}")
        if ellipses:
            at = ellipses[0]
            key = key[:at] + (slice(None),) * max(0, 4 - len(key)) + key[at + 1:]
        if len(key) > 3:
            raise IndexError(f"{self.name}: too many indices ({len(key)}): a volume is indexed (z, y, x), and every "
                             f"channel comes first in the result; got {key!r}")
        key = key + (slice(None),) * (3 - len(key))
        selection = []
        for axis, item, size in zip("zyx", key, self.shape):
            if isinstance(item, slice):
                selection.append(range(*item.indices(size)))
            else:
                try:
                    if isinstance(item, (bool, np.bool_)):  # NumPy reads a boolean as a mask, not as 0 or 1
                        raise TypeError
                    index = operator.index(item)
                except TypeError:
                    raise TypeError(f"{self.name}: index {item!r} along {axis}: volumes take integers and slices "
                                    f"only (no arrays, lists, booleans, floats or None)") from None
                if not -size <= index < size:
                    raise IndexError(f"{self.name}: index {index} is out of bounds for axis {axis} of size {size}")
                selection.append(index % size)
        return selection

    def read_padded(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray, pad: str,
                    fill=0) -> np.ndarray:
        """Read the box ``[corner, corner + extent)`` into ``out`` like :meth:`read_box`, but the box may reach
        past the volume: that part is read as ``np.pad(volume, mode=pad)`` would have it ("reflect", "edge", or
        "constant" with ``fill``). Reads only the voxels the padded box uses."""
        corner, extent = self._integers(corner, extent)
        if len(corner) != 3 or len(extent) != 3 or min(extent) < 1:
            raise ValueError(f"{self.name}: a padded box needs a corner and an extent >= 1 (z, y, x), got "
                             f"{corner} and {extent}")
        self._refuse_if_closed()
        if all(c >= 0 and c + e <= s for c, e, s in zip(corner, extent, self.shape)):
            return self.read_box(corner, extent, out)
        if not isinstance(out, np.ndarray) or out.shape != (self.channels,) + extent or out.dtype != self.dtype:
            raise ValueError(f"{self.name}: out must be a {self.dtype} array of shape {(self.channels,) + extent}")
        self._refuse_read_only(out)
        target = out[np.newaxis] if out.flags.c_contiguous else np.empty((1,) + out.shape, self.dtype)
        used = [pad_indices(np.arange(c, c + e), s, pad) for c, e, s in zip(corner, extent, self.shape)]
        used = [u[u >= 0] for u in used]
        if min(u.size for u in used) == 0:  # a constant pad that misses the volume entirely
            target[...] = fill
        else:
            # Grown to the volume's border on every padded side, the box of used voxels pads like the volume, as
            # long as no index is reflected twice (else the whole axis is read).
            low, size = [], []
            for u, c, e, s in zip(used, corner, extent, self.shape):
                twice = pad == "reflect" and (c < 1 - s or c + e > 2 * s - 1)
                first = 0 if c < 0 or twice else int(u.min())
                low.append(first)
                size.append((s if c + e > s or twice else int(u.max()) + 1) - first)
            low, size = tuple(low), tuple(size)
            inside = self.read_box(low, size, np.empty((self.channels,) + size, self.dtype))
            gather_copy([inside], [tuple(c - lo for c, lo in zip(corner, low))], [(0, 1, 2)], [(False,) * 3],
                        target, pad=pad, fill=fill)
        if target.base is not out:
            np.copyto(out, target[0])
        return out

    def slabs(self, max_bytes: int = SLAB_BYTES):
        """Yield ``(z, slab)``: the whole volume as consecutive (c, dz, y, x) slabs starting at section ``z``.

        Slabs hold whole sections and at most ``max_bytes`` (but at least one section); for chunked files their
        thickness is a multiple of the chunks' z size where possible, so no chunk is decoded twice. Lazy volumes
        read each slab straight from the file into one reused buffer, bypassing (and not disturbing) the chunk
        cache: a slab is valid only until the next one is yielded. In-memory volumes yield views.
        """
        self._refuse_if_closed()  # now, not at the first slab
        return self._slabs(max_bytes)

    def _slabs(self, max_bytes: int):
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
                self._refuse_if_closed()  # closed between two slabs
                slab = buffer[:self.channels * dz * int(np.prod(section_shape))].reshape(
                    (self.channels, dz) + section_shape)
                self._reader.read((z, 0, 0), (dz,) + section_shape, slab)
                yield z, slab

    def check_finite(self) -> None:
        """Raise ValueError if a float volume held in memory contains NaN or infinity."""
        if self.dtype.kind != "f" or self._array is None:
            return
        bad = first_non_finite(self._array)
        if bad is not None:
            raise ValueError(f"{self.name}: contains NaN or infinity, first at (c, z, y, x) = {bad}")

    def close(self) -> None:
        """Close the file or store of a lazy volume (in-memory volumes hold none); its reads fail after it."""
        if self._cache is not None:
            self._cache.close()
        if self._reader is not None:
            self._reader.close()
            self._closed = True

    def _refuse_if_closed(self) -> None:
        """ValueError once a lazy volume was closed: a store without a file handle (zarr, N5) still read after
        it through np.asarray and slabs, where an HDF5 file, and the volume's own box reads, refused."""
        if self._closed:
            raise ValueError(f"{self.name}: the volume was closed; open it again to read it")

    def __enter__(self) -> "Volume":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "in memory" if self.in_memory else "lazy"
        channels = f"{self.channels} channels, " if self.channels > 1 else ""
        return f"Volume({self.name!r}, shape={self.shape}, {channels}dtype={self.dtype}, {where})"


def _rebuilt_volume(array, name, resolution, offset, chunks, stamp, translation=None) -> Volume:
    return Volume(array, name=name, resolution=resolution, offset=offset, chunks=chunks, stamp=stamp,
                  translation=translation)


def _reopened_volume(source_type: type, arguments: tuple, cache_bytes: int) -> Volume:
    return Volume(source_type(*arguments), name=None, cache_bytes=cache_bytes)


def first_non_finite(array: np.ndarray, low: Sequence[int] = (0, 0, 0), high: Optional[Sequence[int]] = None,
                     sections: int = _FINITE_CHECK_SECTIONS) -> Optional[Tuple[int, int, int, int]]:
    """The first (c, z, y, x) of the 4-D float ``array`` holding NaN or infinity within the box ``low`` to ``high``
    (z, y, x; default the whole), looked at ``sections`` sections at a time (no copy of a large array); None if
    there is none."""
    high = tuple(array.shape[1:]) if high is None else tuple(high)
    for z in range(low[0], high[0], sections):
        slab = array[:, z:min(z + sections, high[0]), low[1]:high[1], low[2]:high[2]]
        if not np.isfinite(slab).all():
            c, dz, y, x = (int(i) for i in np.argwhere(~np.isfinite(slab))[0])
            return c, z + dz, low[1] + y, low[2] + x
    return None


def as_volume(source, name: str) -> Volume:
    """Accept a :class:`Volume` or a NumPy array (wrapped without copying)."""
    if isinstance(source, Volume):
        return source
    if isinstance(source, np.ndarray):
        return Volume.from_array(source, name=name)
    raise TypeError(f"{name} must be an emfast Volume (emfast.open(path), for any file or store) or a NumPy array, "
                    f"got {type(source).__module__}.{type(source).__name__}")
