"""zarr arrays (v2 and v3, sharded v3 included) and OME-NGFF multiscale images as volume sources, through
zarr-python 3 (the optional extra ``emfast[zarr]``), opened read-only.

The chunk cache reads one chunk at a time. For the common layout (a local store, no sharding, no filters, C order,
at most one compressor among zstd, blosc, gzip/zlib, lz4) emfast reads the chunk's file and decodes it in the
calling thread with numcodecs or zlib, which release the GIL, so producer threads decode in parallel; this is
about twice as fast as a call into zarr-python per chunk, whose event loop serialises much of the work. Any
other layout (sharded v3 included) is read through zarr-python. A chunk that was never written reads as the
array's fill value, as the zarr specification says; a chunk that cannot be decoded is an error naming the store
and the chunk.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np

from ._metadata import choose_level, multiscale_levels, voxel_metadata
from ._source import DatasetNotFoundError, Stamp, VolumeSource

#: Metadata files that mark a zarr array or group (v3, then v2).
ARRAY_MARKERS = ("zarr.json", ".zarray")
GROUP_MARKERS = ("zarr.json", ".zgroup")


def zarr_missing() -> Optional[str]:
    """Why zarr stores cannot be read here, or None if they can."""
    try:
        import zarr
    except ImportError as error:
        return f"reading zarr needs zarr-python 3 ({error}); install it with pip install 'emfast[zarr]'"
    if int(zarr.__version__.split(".")[0]) < 3:
        return f"reading zarr needs zarr-python 3, this is {zarr.__version__}; pip install 'emfast[zarr]'"
    return None


def import_zarr():
    reason = zarr_missing()
    if reason is not None:
        raise ImportError(reason)
    import zarr
    return zarr


def list_arrays(group) -> List[str]:
    """Paths of every array below a zarr group, depth first."""
    zarr = import_zarr()
    names = []
    for name, member in group.members(max_depth=None):
        if isinstance(member, zarr.Array):
            names.append(name)
    return sorted(names)


class ZarrSource(VolumeSource):
    """An array of a zarr store, or a level of an OME-NGFF multiscale image.

    Parameters
    ----------
    path : str or path-like
        The store (a directory ending in ``.zarr`` by convention).
    dataset : str
        The array inside it, or a group holding an OME-NGFF multiscale image ("" for the store's root).
    level, resolution
        For a multiscale image: the level by index, or by its (z, y, x) voxel size (default: level 0).
    """

    def __init__(self, path: Union[str, os.PathLike], dataset: str = "", level: Optional[int] = None,
                 resolution: Optional[Sequence[float]] = None) -> None:
        zarr = import_zarr()
        path = Path(path)
        dataset = dataset.strip("/")
        self._given = dataset
        self.name = f"{path}:{dataset}" if dataset else str(path)
        if not path.is_dir():
            raise FileNotFoundError(f"zarr store not found: {path}")
        try:
            root = zarr.open(store=str(path), mode="r")
        except Exception as error:  # zarr raises various types for what is not a store
            raise OSError(f"cannot open {path} as a zarr store: {error}") from error
        node = root
        if dataset:
            try:
                node = root[dataset]
            except KeyError:
                raise DatasetNotFoundError(f"array {dataset!r} not found in {path}; arrays there: "
                                           f"{', '.join(list_arrays(root)) or 'none'}") from None
            except Exception as error:
                raise OSError(f"{self.name}: cannot open the array: {error}") from error
        self._axes = None
        if isinstance(node, zarr.Group):
            levels = multiscale_levels(dict(node.attrs), self.name)
            if levels is None:
                raise DatasetNotFoundError(f"{self.name} is a group, not an array; arrays there: "
                                           f"{', '.join(list_arrays(node)) or 'none'}")
            chosen = choose_level(levels, level, resolution, self.name)
            try:
                array = node[chosen.path]
            except KeyError:
                raise ValueError(f"{self.name}: the OME-NGFF multiscale names level {chosen.path!r}, which the "
                                 "store does not have") from None
            if len(chosen.axes) != array.ndim:
                raise ValueError(f"{self.name}/{chosen.path}: {array.ndim}-D array but {len(chosen.axes)} axes "
                                 f"{list(chosen.axes)} in the multiscale metadata")
            self._axes = chosen.axes
            self.resolution, self.offset = chosen.resolution, chosen.offset
            dataset = f"{dataset}/{chosen.path}" if dataset else chosen.path
            self.name = f"{path}:{dataset}"
        else:
            if level is not None or resolution is not None:
                raise ValueError(f"{self.name} is an array, not a multiscale image: level and resolution do not "
                                 "apply")
            array = node
            self.resolution, self.offset = voxel_metadata(dict(array.attrs), self.name, reversed_order=False)
        self._array = array
        self._direct = _DirectChunks.for_array(array, path / dataset) if self._axes is None else None
        self._path, self._dataset = path, dataset
        self._level, self._resolution = level, resolution
        self.dtype = np.dtype(array.dtype)
        self._take, shape, chunks = self._layout(array)
        self.full_shape = shape
        self.chunks = chunks
        marker = next((path / dataset / m for m in ARRAY_MARKERS if (path / dataset / m).is_file()), path)
        self.stamp = Stamp.of(path, dataset, marker)

    def _layout(self, array):
        """How to read (c, z, y, x) from the stored axes: index 0 of t, the channel axis if any."""
        axes = self._axes or (("c",) if array.ndim == 4 else ()) + ("z", "y", "x")
        if self._axes is None and array.ndim not in (3, 4):
            raise ValueError(f"{self.name}: expected a 3-D (z, y, x) or 4-D (c, z, y, x) array, got {array.ndim}-D "
                             f"shape {array.shape}")
        if "t" in axes and array.shape[axes.index("t")] != 1:
            raise ValueError(f"{self.name}: a time series of {array.shape[axes.index('t')]} points; emfast reads "
                             "one 3-D volume (export a single time point)")
        shape = tuple(int(array.shape[axes.index(a)]) for a in ("c", "z", "y", "x") if a in axes)
        chunks = tuple(int(array.chunks[axes.index(a)]) for a in ("z", "y", "x"))
        return axes, shape, chunks

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        if self._direct is not None and self._direct.read(corner, extent, out, self.name):
            return
        box = {a: slice(int(c), int(c) + int(e)) for a, c, e in zip("zyx", corner, extent)}
        selection = tuple(0 if a == "t" else box.get(a, slice(None)) for a in self._take)
        try:
            data = self._array[selection]
        except Exception as error:
            chunks = [f"{int(c) // k}..{(int(c) + int(e) - 1) // k}" for c, e, k in zip(corner, extent, self.chunks)]
            raise OSError(f"{self.name}: cannot read chunk(s) (z, y, x) = ({', '.join(chunks)}): {error}; the "
                          "store may be corrupt or being written") from error
        np.copyto(out, data if "c" in self._take else data[np.newaxis])

    def attributes(self) -> dict:
        return dict(self._array.attrs)

    def reopen_arguments(self) -> tuple:
        return str(self._path), self._given, self._level, self._resolution


class _DirectChunks:
    """Reads whole chunks of a plain local zarr array from their files and decodes them in the calling thread."""

    def __init__(self, array, directory: Path, decode) -> None:
        self._array = array
        self._directory = directory
        self._decode = decode
        self._metadata = array.metadata
        self._chunks = tuple(int(c) for c in array.chunks)
        self._shape = tuple(int(s) for s in array.shape)
        self._dtype = np.dtype(array.dtype)
        serializer = getattr(array, "serializer", None)
        endian = getattr(getattr(serializer, "endian", None), "value", None)
        if endian is not None and self._dtype.itemsize > 1:
            self._dtype = self._dtype.newbyteorder("<" if endian == "little" else ">")
        self._fill = array.fill_value

    @classmethod
    def for_array(cls, array, directory: Path) -> Optional["_DirectChunks"]:
        """A reader if the array's layout is one this class decodes exactly, else None (zarr-python reads it)."""
        zarr = import_zarr()
        if not directory.is_dir() or getattr(array, "shards", None) is not None or array.filters:
            return None
        if getattr(array.metadata, "order", "C") != "C" or np.dtype(array.dtype).kind not in "uif":
            return None
        serializer = getattr(array, "serializer", None)
        if serializer is not None and not isinstance(serializer, zarr.codecs.BytesCodec):
            return None
        if len(array.compressors) > 1:
            return None
        decode = _decoder(array.compressors[0]) if array.compressors else (lambda data: data)
        return None if decode is None else cls(array, directory, decode)

    def read(self, corner, extent, out: np.ndarray, name: str) -> bool:
        """Fill ``out`` if the box is exactly one chunk of a 3-D array (or of a 4-D one with all channels in one
        chunk); False otherwise, and the caller reads through zarr-python."""
        lead = len(self._shape) - 3
        if lead and self._chunks[0] != self._shape[0]:
            return False
        spatial = self._chunks[lead:]
        if not all(int(c) % k == 0 and int(e) == min(k, s - int(c))
                   for c, e, k, s in zip(corner, extent, spatial, self._shape[lead:])):
            return False
        coords = (0,) * lead + tuple(int(c) // k for c, k in zip(corner, spatial))
        key = self._metadata.encode_chunk_key(coords)
        try:
            data = (self._directory / key).read_bytes()
        except FileNotFoundError:
            out[...] = self._fill
            return True
        try:
            decoded = self._decode(data)
            chunk = np.frombuffer(decoded, self._dtype, int(np.prod(self._chunks))).reshape(self._chunks)
        except Exception as error:  # codecs raise their own types for corrupt input
            raise OSError(f"{name}: cannot decode chunk {key}: {error}; the store may be corrupt or being "
                          "written") from error
        view = chunk if lead else chunk[np.newaxis]
        np.copyto(out, view[(slice(None),) + tuple(slice(0, int(e)) for e in extent)])
        return True


def _decoder(codec):
    """A bytes -> bytes function for one zarr compressor, or None if emfast does not decode it itself."""
    import numcodecs
    zarr = import_zarr()
    if isinstance(codec, numcodecs.abc.Codec):  # zarr v2 metadata: numcodecs objects
        return codec.decode if codec.codec_id in ("zstd", "blosc", "zlib", "gzip", "lz4") else None
    if isinstance(codec, zarr.codecs.ZstdCodec):
        return numcodecs.Zstd(level=codec.level, checksum=codec.checksum).decode
    if isinstance(codec, zarr.codecs.BloscCodec):
        return numcodecs.Blosc().decode  # a blosc frame describes its own compressor and shuffle
    if isinstance(codec, zarr.codecs.GzipCodec):
        return lambda data: zlib.decompress(data, 31)
    return None
