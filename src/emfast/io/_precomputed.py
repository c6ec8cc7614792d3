"""Neuroglancer precomputed volumes as volume sources, read-only.

The ``info`` file lists scales; each has a ``resolution`` and a ``voxel_offset`` in (x, y, z) order. emfast reads
(c, z, y, x) with voxel (0, 0, 0) at the scale's voxel offset, whose world position (nm) becomes the volume's
``offset``.

An unsharded scale with the ``raw`` encoding (cloud-volume's default for images and segmentations) or the
``compressed_segmentation`` one (labels: uint32 or uint64) is read here, chunk file by chunk file:
``<key>/<x0>-<x1>_<y0>-<y1>_<z0>-<z1>`` holds the chunk's little-endian elements, x fastest, then channels, or
their compressed_segmentation encoding (decoded by the compiled core, csrc/cseg.h). cloud-volume writes these
files compressed by default, with the compression as a suffix (``.gz``, ``.br``, ``.zstd``, ``.bz2``, ``.xz``),
which neuroglancer's HTTP servers turn into a ``Content-Encoding``; emfast decompresses them (brotli needs the
``brotli`` package; a box's whole raw ``.gz`` chunks are inflated in one call by the system's libdeflate where
there is one, :mod:`emfast.io._deflate`). A chunk with no file in any form is 0, as neuroglancer and tensorstore
read it. Every other scale (sharded, or another encoding) is read through tensorstore (the optional extra
``emfast[tensorstore]``), which decodes with its own thread pool and reads only files without a suffix: a chunk
that exists only compressed there is refused, never read as zeros.

The ``info`` is checked here before any chunk is read (a non-empty ``scales``, each with its ``key``, ``size``,
``resolution``, ``voxel_offset``, ``chunk_sizes`` and ``encoding``), so malformed metadata is a
:class:`~emfast.io._source.StoreMetadataError` naming the key and the value. A remote volume
(:mod:`emfast.io._remote`) is read the same way: its chunk files' bytes over the network, tensorstore through its
own kvstore of the URL.
"""
from __future__ import annotations

import bz2
import functools
import gzip
import itertools
import json
import lzma
import math
import os
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .._core.files import decode_compressed_segmentation
from . import _deflate
from ._decode import SideBySide
from ._filebatch import lent_buffer, read_regular_files
from ._geometry import choose_level
from ._metadata import bad_metadata, deprecated_level, int_list, metadata_key, number_list
from ._remote import ReadAbandoned, RemoteAccessDenied, RemoteReadError, RemoteStore, describe_error
from ._source import (CorruptChunkError, Stamp, StoreMetadataError, VolumeSource, add_transfer_time,
                      checked_chunk, corruption_cause, read_regular_file, read_regular_file_into, require_kind)


def tensorstore_missing() -> Optional[str]:
    """Why precomputed volumes cannot be read here, or None if they can."""
    try:
        import tensorstore  # noqa: F401
    except Exception as error:  # noqa: BLE001 - also one built for another NumPy (0.1.60 under NumPy 2: AttributeError)
        return (f"reading neuroglancer precomputed needs tensorstore, which cannot be imported here "
                f"({type(error).__name__}: {error}); pip install 'emfast[tensorstore]' installs one that can "
                "(with -U over an older one)")
    return None


def is_precomputed(path: Path) -> bool:
    """True for a directory with a precomputed ``info`` file."""
    try:
        return (path / "info").is_file() and "scales" in json.loads((path / "info").read_text())
    except (OSError, ValueError):
        return False


#: The ``data_type`` and ``encoding`` names of the precomputed format.
_DATA_TYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32")
_ENCODINGS = ("raw", "jpeg", "png", "compressed_segmentation", "compresso", "jxl")
#: The longest block edge of compressed_segmentation decoded (csrc/cseg.h: EMF_CSEG_MAX_EDGE).
CSEG_MAX_EDGE = 1 << 21
#: The encodings of unsharded scales decoded here (with the compressed files cloud-volume writes); tensorstore
#: reads the others.
_OWN_ENCODINGS = ("raw", "compressed_segmentation")


def _read(location: Union[Path, RemoteStore], key: str, what: str) -> Optional[bytes]:
    """The bytes of file ``key`` below a local directory or a remote store, or None if there is none."""
    if isinstance(location, RemoteStore):
        return location.get(key)
    return read_regular_file(location / key, what)


def read_info(path: Union[Path, RemoteStore], name: str) -> dict:
    """The ``info`` of a precomputed volume, checked for what emfast and tensorstore rely on.

    Raises
    ------
    FileNotFoundError
        No ``info`` file.
    StoreMetadataError
        A key missing or holding a bad value, naming the volume, the key (``scales[1].voxel_offset``) and value.
    """
    remote = isinstance(path, RemoteStore)
    text = _read(path, "info", "a precomputed info") if remote or path.is_dir() else None
    if text is None:
        raise FileNotFoundError(f"no neuroglancer precomputed volume at {path} (no info file with scales)")
    where = f"{name} (info)"
    try:
        info = json.loads(text)
    except ValueError as error:
        raise StoreMetadataError(f"{where}: malformed metadata: not JSON ({error})") from error
    if metadata_key(info, "type", where) not in ("image", "segmentation"):
        raise bad_metadata(where, "type", info["type"], '"image" or "segmentation"')
    if metadata_key(info, "data_type", where) not in _DATA_TYPES:
        raise bad_metadata(where, "data_type", info["data_type"], f"one of {', '.join(_DATA_TYPES)}")
    int_list([metadata_key(info, "num_channels", where)], "num_channels", where, minimum=1)
    scales = metadata_key(info, "scales", where)
    if not isinstance(scales, list) or not scales:
        raise bad_metadata(where, "scales", scales, "a non-empty list of scales")
    for n, scale in enumerate(scales):
        _check_scale(scale, f"scales[{n}]", where)
    if any(scale["encoding"] == "compressed_segmentation" for scale in scales) \
            and info["data_type"] not in ("uint32", "uint64"):
        raise bad_metadata(where, "data_type", info["data_type"], "uint32 or uint64 (a compressed_segmentation scale)")
    return info


def _check_scale(scale, key: str, where: str) -> None:
    if not isinstance(metadata_key(scale, "key", where, key), str):
        raise bad_metadata(where, f"{key}.key", scale["key"], "a string (the scale's directory)")
    int_list(metadata_key(scale, "size", where, key), f"{key}.size", where, minimum=0, length=3)
    number_list(metadata_key(scale, "resolution", where, key), f"{key}.resolution", where, length=3, positive=True)
    int_list(metadata_key(scale, "voxel_offset", where, key), f"{key}.voxel_offset", where, minimum=None, length=3)
    sizes = metadata_key(scale, "chunk_sizes", where, key)
    if not isinstance(sizes, list) or not sizes:
        raise bad_metadata(where, f"{key}.chunk_sizes", sizes, "a non-empty list of chunk sizes [x, y, z]")
    for m, size in enumerate(sizes):
        int_list(size, f"{key}.chunk_sizes[{m}]", where, minimum=1, length=3)
    if metadata_key(scale, "encoding", where, key) not in _ENCODINGS:
        raise bad_metadata(where, f"{key}.encoding", scale["encoding"], f"one of {', '.join(_ENCODINGS)}")
    if scale["encoding"] == "compressed_segmentation":
        block = metadata_key(scale, "compressed_segmentation_block_size", where, key)
        int_list(block, f"{key}.compressed_segmentation_block_size", where, minimum=1, length=3)
        if max(block) > CSEG_MAX_EDGE or math.prod(block) > 1 << 32:
            raise bad_metadata(where, f"{key}.compressed_segmentation_block_size", block,
                               f"3 edges of at most {CSEG_MAX_EDGE} voxels, a block of at most 2^32")


class PrecomputedSource(VolumeSource):
    """One scale of a precomputed volume: ``level`` by index (default 0, the finest), or by its (z, y, x)
    ``resolution``, as for OME-Zarr (``scale=`` is the deprecated name of ``level=``)."""

    def __init__(self, path: Union[str, os.PathLike, RemoteStore], level: Optional[int] = None,
                 resolution: Optional[Sequence[float]] = None, *, scale: Optional[int] = None) -> None:
        scale = deprecated_level(level, scale, "PrecomputedSource")
        remote = isinstance(path, RemoteStore)
        path = path if remote else Path(path)
        self.name = str(path)
        if not remote:
            require_kind(path, "directory", "a precomputed volume")
        info = read_info(path, self.name)
        scales = info["scales"]
        resolutions = [tuple(float(r) for r in s["resolution"][::-1]) for s in scales]  # (z, y, x)
        index = choose_level(resolutions, scale, resolution, self.name)
        chosen = scales[index]
        self.chunks = tuple(int(n) for n in chosen["chunk_sizes"][0][::-1])
        self.resolution = resolutions[index]
        self.offset = tuple(float(o) * r for o, r in zip(chosen["voxel_offset"][::-1], self.resolution))
        self._path, self._scale = path, index
        self._scales = [str(s.get("key", "")) for s in scales]
        self.stamp = path.stamp(f"scale {index}", "info") if remote else Stamp.of(path, f"scale {index}", path / "info")
        self._chunk_files = _ChunkFiles(path, chosen, self.name)
        if chosen["encoding"] in _OWN_ENCODINGS and not chosen.get("sharding"):
            self._store = None
            channels = int(info["num_channels"])
            x, y, z = (int(n) for n in chosen["size"])
            self.dtype = np.dtype(info["data_type"]).newbyteorder("<")
            # whole chunks read straight into buffers (and .gz ones inflated a wave at a time) beat one read chunk by
            # chunk: 17 against 26 ms for (96, 512, 512) uint8, 56 against 205 ms gzipped
            self.whole_by_chunks = not remote and chosen["encoding"] == "raw"
        else:
            self._store = _open_tensorstore(path, index, self.name)
            self._opened_in = os.getpid()
            self.parallel_reads = True  # tensorstore decodes outside the GIL
            x, y, z, channels = (int(n) for n in self._store.domain.shape)
            self.dtype = np.dtype(self._store.dtype.numpy_dtype)
        self.full_shape = (channels, z, y, x) if channels > 1 else (z, y, x)

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        if self._store is None:
            self._chunk_files.read_raw(corner, extent, out, self.dtype, self.stamp)
            return
        self.read_many([(corner, extent, out)])

    def read_many(self, requests) -> None:
        """Fill several boxes, ``requests`` a list of (corner, extent, out) as :meth:`read` takes them: a scale
        tensorstore reads gets every box's read issued at once, decoded concurrently by tensorstore's threads
        outside the GIL, each delivered in emfast's (c, z, y, x) order (tensorstore transposes while it copies);
        a raw scale reads its whole chunks' files in one call (:meth:`_ChunkFiles.read_raw_many`)."""
        if self._store is None:
            self._chunk_files.read_raw_many(requests, self.dtype, self.stamp)
            return
        if self._opened_in != os.getpid():  # tensorstore aborts a forked child that uses it
            raise RuntimeError(f"{self.name}: this scale is read through tensorstore, which cannot be used in a "
                               "process forked after it started (it aborts the process): open the volume in the worker "
                               "itself (for a torch DataLoader, in the Dataset's __iter__ or a worker_init_fn), or "
                               "start the workers with the 'spawn' method")
        reads = []
        for corner, extent, out in requests:
            self._chunk_files.refuse_compressed(corner, extent)
            (x, y, z), (dx, dy, dz) = self._in_store(corner), tuple(int(e) for e in extent[::-1])
            reads.append(self._store[x:x + dx, y:y + dy, z:z + dz].T.read())
        for future, (corner, extent, out) in zip(reads, requests):
            where = f"{self.name}: the box at (z, y, x) = {tuple(int(c) for c in corner)}"
            start = time.perf_counter()
            try:
                data = self._path.wait_tensorstore(future, where) if isinstance(self._path, RemoteStore) else \
                    future.result()
            except (RemoteReadError, ReadAbandoned):
                raise
            except Exception as error:
                raise CorruptChunkError(f"{where}: cannot read it: {error}") from error
            finally:  # tensorstore fetches and decodes in one call: counted as the transfer it mostly is remotely
                add_transfer_time(time.perf_counter() - start)
            np.copyto(out, checked_chunk(np.ascontiguousarray(data), self.dtype, out.shape, where, self.stamp))

    def _in_store(self, corner) -> tuple:
        """The (x, y, z) store coordinates of the (z, y, x) voxel ``corner``."""
        return tuple(o + int(c) for o, c in zip(self._chunk_files.origin, corner[::-1]))

    def describe(self) -> str:
        """As every source's, and, of a volume of several scales, which this is: ``emfast info`` showed the finest
        alone, with nothing saying there were others (an OME-Zarr image's levels are said)."""
        if len(self._scales) < 2:
            return super().describe()
        return (f"{super().describe()} (precomputed: scale {self._scale} of {len(self._scales)}, key "
                f"{self._scales[self._scale]}; the others by level= or resolution=)")

    def reopen_arguments(self) -> tuple:
        # a store pickles as its URL, a folder as its absolute path (a Dask worker may run elsewhere)
        path = self._path if isinstance(self._path, RemoteStore) else str(Path(self._path).absolute())
        return path, self._scale


def _open_tensorstore(path: Path, index: int, name: str):
    reason = tensorstore_missing()
    if reason is not None:
        raise ImportError(reason)
    import tensorstore as ts
    try:
        remote = isinstance(path, RemoteStore)
        kvstore = path.kvstore_spec() if remote else {"driver": "file", "path": str(path.resolve())}
        return ts.open({"driver": "neuroglancer_precomputed", "kvstore": kvstore, "scale_index": index},
                       read=True, write=False).result()
    except Exception as error:  # what tensorstore refuses beyond the checks of read_info
        failed = path.tensorstore_failure(error, f"{name} (scale {index})") if remote else None
        if failed is not None:  # a transfer, not the metadata: denied (credentials), or out of reach
            raise failed from error
        if remote and "NOT_FOUND" in str(error):  # the info emfast has just read
            raise RemoteReadError(f"{name} (scale {index}): tensorstore found no info where emfast has just read one: "
                                  f"the store changed, or the server answers inconsistently ({error})") from error
        raise StoreMetadataError(f"{name} (info): tensorstore cannot open scale {index}: "
                                 f"{describe_error(error)}") from error


def _brotli(data: bytes) -> bytes:
    try:
        import brotli
    except ImportError:
        raise ImportError("reading brotli-compressed precomputed chunks (.br, cloud-volume's compress='br') needs "
                          "the brotli package: pip install brotli") from None
    return brotli.decompress(data)


def _zstd(data: bytes) -> bytes:
    import numcodecs
    return bytes(numcodecs.Zstd().decode(data))


#: The compressions cloud-volume writes as a suffix of a chunk's file name (cloud-files' COMPRESSION_EXTENSIONS),
#: and their decoders.
SUFFIXES = {".gz": gzip.decompress, ".br": _brotli, ".zstd": _zstd, ".bz2": bz2.decompress, ".xz": lzma.decompress}


class _ChunkFiles:
    """The chunk files of one unsharded scale: their names, the compressed forms cloud-volume writes, and the
    decoding of the raw and compressed_segmentation encodings."""

    def __init__(self, path: Union[Path, RemoteStore], scale: dict, name: str) -> None:
        self._directory = path / scale["key"]
        self._name = name
        # (x, y, z) blocks of a compressed_segmentation scale; None for raw
        self._block = scale.get("compressed_segmentation_block_size") \
            if scale["encoding"] == "compressed_segmentation" else None
        self.origin = [int(o) for o in scale["voxel_offset"]]  # x, y, z
        self._size = [int(n) for n in scale["size"]]
        self._chunk = [int(n) for n in scale["chunk_sizes"][0]]
        self._sharded = bool(scale.get("sharding"))
        # a box's chunk files read side by side where that pays, as measured for chunks of this size
        self._reads = SideBySide.of("precomputed", tuple(self._chunk))

    def _chunks_of(self, corner, extent):
        """(file name stem, (z, y, x) start, (z, y, x) stop) of every chunk the box touches, in volume voxels."""
        ranges = [range(int(c) // k, (int(c) + int(e) - 1) // k + 1)
                  for c, e, k in zip(corner, extent, self._chunk[::-1])]
        for key in itertools.product(*ranges):
            start = [i * k for i, k in zip(key, self._chunk[::-1])]
            stop = [min(a + k, s) for a, k, s in zip(start, self._chunk[::-1], self._size[::-1])]
            bounds = [f"{o + a}-{o + b}" for o, a, b in zip(self.origin, start[::-1], stop[::-1])]
            yield "_".join(bounds), start, stop

    def _exists(self, name: str) -> bool:
        if isinstance(self._directory, RemoteStore):
            return self._directory.exists(name)
        return (self._directory / name).exists()

    def refuse_compressed(self, corner, extent) -> None:
        """Refuse a box of a scale tensorstore reads if one of its chunks exists only in a compressed form, which
        tensorstore would read as zeros."""
        if self._sharded:
            return
        for stem, _start, _stop in self._chunks_of(corner, extent):
            if self._exists(stem):
                continue
            for suffix in SUFFIXES:
                if self._exists(stem + suffix):
                    raise StoreMetadataError(
                        f"{self._name}: chunk {self._directory.name}/{stem} exists only as {stem + suffix} "
                        f"({suffix} compression, as cloud-volume writes it); emfast decompresses such files only for "
                        "the raw and compressed_segmentation encodings of unsharded scales, and tensorstore reads only "
                        "uncompressed files: rewrite the volume with cloud-volume's compress=False, or as raw")

    def read_raw(self, corner, extent, out: np.ndarray, dtype: np.dtype, stamp: Stamp) -> None:
        """Fill ``out`` (c, z, y, x) with the box, chunk file by chunk file."""
        if self._read_whole_chunk(corner, extent, out, dtype):
            return
        for stem, start, stop in self._chunks_of(corner, extent):
            lo = [max(a, int(c)) for a, c in zip(start, corner)]
            hi = [min(b, int(c) + int(e)) for b, c, e in zip(stop, corner, extent)]
            into = (slice(None),) + tuple(slice(a - int(c), b - int(c)) for a, b, c in zip(lo, hi, corner))
            chunk = self._chunk_data(stem, [b - a for a, b in zip(start, stop)], out.shape[0], dtype, stamp)
            if chunk is None:
                out[into] = 0
                continue
            out[into] = chunk[(slice(None),) + tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start))]

    def read_raw_many(self, requests, dtype: np.dtype, stamp: Stamp) -> None:
        """Fill the boxes of ``requests`` ((corner, extent, out) each): those that are one whole chunk from their
        uncompressed files straight into ``out``, in parts side by side where that pays (:class:`SideBySide`),
        each part's files in one call (:func:`read_regular_files`); the others (and chunks stored compressed,
        missing, or of another size, which it reports) by :meth:`read_raw`."""
        stems = [self._whole_chunk_stem(corner, extent, out, dtype) for corner, extent, out in requests]
        whole = [(stem, index) for index, stem in enumerate(stems) if stem is not None]
        filled: list = []
        self._reads.run(whole, functools.partial(self._read_whole_chunks, requests=requests, filled=filled))
        filled_indices = set(filled)
        for index, request in enumerate(requests):
            if index not in filled_indices:
                self.read_raw(*request, dtype, stamp)

    def _read_whole_chunks(self, whole, requests, filled: list) -> None:
        """Read the (file name, request index) chunks' files straight into their requests' ``out`` in one call,
        then the gzip files (cloud-volume's default compression) of those without an uncompressed file, inflated
        into ``out`` in one call of libdeflate where there is one (:mod:`emfast.io._deflate`); append the indices
        of the requests filled so to ``filled``."""
        directory = str(self._directory)
        contents, _ = read_regular_files([os.path.join(directory, stem) for stem, _ in whole],
                                         "a precomputed chunk", into=[requests[index][2] for _, index in whole])
        filled.extend(index for (_, index), data in zip(whole, contents) if data is True)
        absent = [(stem, index) for (stem, index), data in zip(whole, contents) if data is None]
        if not absent or not _deflate.system_deflate():
            return
        with lent_buffer() as buffer:
            gzipped, _ = read_regular_files([os.path.join(directory, stem + ".gz") for stem, _ in absent],
                                            "a precomputed chunk", buffer=buffer)
            found = [(index, data) for (_, index), data in zip(absent, gzipped) if data is not None]
            decoded = _deflate.decode_frames([data for _, data in found],
                                             [requests[index][2].reshape(-1).view(np.uint8) for index, _ in found])
        filled.extend(index for (index, _), ok in zip(found, decoded.tolist()) if ok)

    def _read_whole_chunk(self, corner, extent, out: np.ndarray, dtype: np.dtype) -> bool:
        """Read the box straight from its chunk's uncompressed file into ``out`` if :meth:`_whole_chunk_stem`
        names one and the file has the chunk's size; False, with ``out`` to be filled by :meth:`read_raw`'s
        general path, otherwise."""
        stem = self._whole_chunk_stem(corner, extent, out, dtype)
        return stem is not None and bool(read_regular_file_into(self._directory / stem, "a precomputed chunk", out))

    def _whole_chunk_stem(self, corner, extent, out: np.ndarray, dtype: np.dtype) -> Optional[str]:
        """The file name of the chunk if the box is exactly one chunk (as the chunk cache asks) of a local scale and
        ``out`` its C-contiguous buffer: the raw encoding is the chunk's little-endian (c, z, y, x) elements,
        ``out``'s own layout. None otherwise (a remote store's chunk is read through the store; a
        compressed_segmentation chunk is decoded)."""
        if isinstance(self._directory, RemoteStore) or self._block is not None or not out.flags.c_contiguous \
                or out.dtype != dtype:
            return None
        chunk = self._chunk[::-1]
        if not all(int(c) % k == 0 and int(e) == min(k, s - int(c))
                   for c, e, k, s in zip(corner, extent, chunk, self._size[::-1])):
            return None
        return "_".join(f"{o + int(c)}-{o + int(c) + int(e)}"
                        for o, c, e in zip(self.origin, corner[::-1], extent[::-1]))

    def _chunk_data(self, stem: str, shape, channels: int, dtype: np.dtype, stamp: Stamp):
        """One chunk as (c, z, y, x), from its file in whichever form it exists, or None if in none. A form the
        server denies is looked past (S3 denies a missing key to a reader who may not list the bucket): denied
        where no form exists, the chunk is an error."""
        denied = None
        for suffix, decode in (("", None),) + tuple(SUFFIXES.items()):
            try:
                data = _read(self._directory, stem + suffix, "a precomputed chunk")
            except RemoteAccessDenied as error:
                denied = denied or error
                continue
            if data is None:
                continue
            where = f"{self._name}: chunk {self._directory.name}/{stem + suffix}"
            if decode is not None:
                try:
                    data = decode(data)
                except ImportError:
                    raise
                except Exception as error:  # each codec raises its own types for corrupt input
                    raise CorruptChunkError(f"{where} is corrupt: cannot decompress it ({error})") from error
            if self._block is None:
                return checked_chunk(data, dtype, (channels, *shape), where, stamp)
            try:
                return decode_compressed_segmentation(data, shape[::-1], self._block, channels, dtype)
            except ValueError as error:
                raise CorruptChunkError(f"{where} is corrupt: {error}; {corruption_cause(stamp)}") from error
        if denied is not None:
            raise denied
        return None
