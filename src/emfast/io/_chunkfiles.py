"""Writing whole chunks of a local zarr array as files, without zarr-python's write path.

zarr-python writes a box through its asynchronous codec pipeline: per chunk an event-loop round trip, a check
whether the chunk holds only the fill value, and Python work that holds the GIL while a model or the other writer
wants it. For the arrays emfast creates (C order, little-endian, one compressor of :data:`COMPRESSIONS` or none,
no filters, no sharding, in a local store) a chunk file is just the compressor's frame of the chunk's bytes, so
:class:`ChunkFiles` encodes with numcodecs (which releases the GIL) and writes the file itself, atomically as
zarr's local store does (a ``*.<hex>.partial`` file renamed into place). The bytes are those zarr-python writes
(tests compare them); an array of any other layout returns None from :func:`chunk_files`, and its writes go
through zarr-python.

Unlike zarr-python's default, a chunk that holds only the fill value is written too: readers see the same values,
and no pass over every chunk is spent on looking.
"""
from __future__ import annotations

import os
import sys
import uuid
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Iterator, Optional, Tuple

import numpy as np

from .._machine import cores
from .._threads import shutdown_pool
from ._metadata import zarr_text
from ._source import fill_value

#: v3 Blosc shuffle names as numcodecs numbers them.
_BLOSC_SHUFFLES = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def _v3_compressor(codecs, itemsize: int):
    """The numcodecs codec writing the same frames as the v3 codec chain ``codecs`` (bytes, then at most one
    compressor), False if the chain is another."""
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ZstdCodec

    if not codecs or not isinstance(codecs[0], BytesCodec) or len(codecs) > 2:
        return False
    if zarr_text(codecs[0].endian) not in (None, "little"):
        return False
    if len(codecs) == 1:
        return None
    codec = codecs[1]
    if isinstance(codec, ZstdCodec):
        return numcodecs.Zstd(level=codec.level, checksum=codec.checksum)
    if isinstance(codec, GzipCodec):
        return numcodecs.GZip(level=codec.level)
    if isinstance(codec, BloscCodec) and codec.typesize == itemsize:
        return numcodecs.Blosc(cname=zarr_text(codec.cname), clevel=codec.clevel,
                               shuffle=_BLOSC_SHUFFLES[zarr_text(codec.shuffle)], blocksize=codec.blocksize)
    return False


def encoders() -> int:
    """Threads one box's chunks are encoded on where no pool is given (convert's tiles, a Dask worker's blocks): half
    the usable cores, leaving the others to the reads and workers running meanwhile, at least two."""
    return max(2, cores() // 2)


def chunk_files(array) -> Optional["ChunkFiles"]:
    """A :class:`ChunkFiles` for the zarr ``array``, or None if its layout is not one it writes exactly."""
    store_root = getattr(array.store, "root", None)
    metadata = array.metadata
    dtype = np.dtype(array.dtype)
    if store_root is None or type(array.store).__name__ != "LocalStore" or sys.byteorder != "little" \
            or dtype.byteorder == ">" or dtype.hasobject:
        return None
    if metadata.zarr_format == 2:
        if metadata.order != "C" or metadata.filters:
            return None
        compressor = metadata.compressor
    else:
        if metadata.to_dict()["chunk_grid"]["name"] != "regular":  # by the spec's name: its class moved in 3.2
            return None
        compressor = _v3_compressor(metadata.codecs, dtype.itemsize)
        if compressor is False:
            return None
    fill = fill_value(metadata.fill_value, dtype)
    return ChunkFiles(Path(store_root) / array.path, metadata, tuple(array.shape), tuple(array.chunks), dtype,
                      compressor, fill)


class ChunkFiles:
    """The chunk files of one local zarr array (see :func:`chunk_files`)."""

    def __init__(self, folder: Path, metadata, shape: Tuple[int, ...], chunks: Tuple[int, ...], dtype: np.dtype,
                 compressor, fill: np.ndarray) -> None:
        self.folder, self.metadata, self.shape, self.chunks = folder, metadata, shape, chunks
        self.dtype, self.compressor, self.fill = dtype, compressor, fill
        self._made: set = set()

    def covers(self, corner: Tuple[int, ...], extent: Tuple[int, ...]) -> bool:
        """Whether the box is whole chunks (a chunk cut by the array's end counts as whole)."""
        return all(c % k == 0 and ((c + e) % k == 0 or c + e == s)
                   for c, e, k, s in zip(corner, extent, self.chunks, self.shape))

    def write(self, corner: Tuple[int, ...], data: np.ndarray, encoding: Optional[Executor] = None) -> None:
        """Write ``data`` (the array's dtype), whose box :meth:`covers`, chunk by chunk, each chunk a task of a
        pool (encoding releases the GIL): a box written alone, as the last one of a run is, still keeps the cores
        busy, and a compressor slower than the network (zstd on near-constant float32 predictions runs at about
        150 MB/s a core) is spread over them. The pool is ``encoding``, shared by several writers (whichever
        thread is free takes the next chunk, of this box or another's, so no core idles while another works
        through a box's remaining share), or one of :func:`encoders` threads for this box alone."""
        chunks = list(self._chunks(corner, data))
        if encoding is not None and len(chunks) > 1:
            self._write_on(encoding, chunks)
            return
        parts = min(len(chunks), encoders())
        if parts < 2:
            self._write_chunks(chunks)
            return
        encoding = ThreadPoolExecutor(parts, thread_name_prefix="emfast-chunk-write")
        try:
            self._write_on(encoding, chunks)
        finally:  # through Ctrl-C too: none writes after this returns (what was not begun is not)
            shutdown_pool(encoding, cancel_futures=True)

    def _write_on(self, encoding: Executor, chunks) -> None:
        """Write ``chunks`` as tasks of ``encoding``; returns once every one has ended (none writes after it),
        raising the first one's error."""
        tasks = [encoding.submit(self._write_chunks, [chunk]) for chunk in chunks]
        wait(tasks)
        for task in tasks:
            task.result()

    def _write_chunks(self, chunks) -> None:
        for position, part in chunks:
            if part.shape != self.chunks:  # cut by the array's end: stored whole, the rest the fill value
                whole = np.full(self.chunks, self.fill, self.dtype)
                whole[tuple(slice(0, n) for n in part.shape)] = part
                part = whole
            part = np.ascontiguousarray(part, self.dtype)
            frame = part if self.compressor is None else self.compressor.encode(part)
            self._put(self.folder / self.metadata.encode_chunk_key(position), frame)

    def _chunks(self, corner, data: np.ndarray) -> Iterator[Tuple[tuple, np.ndarray]]:
        first = [c // k for c, k in zip(corner, self.chunks)]
        counts = [-(-e // k) for e, k in zip(data.shape, self.chunks)]
        for offsets in np.ndindex(*counts):
            box = tuple(slice(o * k, (o + 1) * k) for o, k in zip(offsets, self.chunks))
            yield tuple(f + o for f, o in zip(first, offsets)), data[box]

    def _put(self, path: Path, frame) -> None:
        """Write the file atomically: readers see the old chunk or the new one, never half of one."""
        parent = path.parent
        if parent not in self._made:
            parent.mkdir(parents=True, exist_ok=True)
            self._made.add(parent)
        partial = parent / f"{path.name}.{uuid.uuid4().hex}.partial"
        try:
            with open(partial, "wb") as file:
                file.write(memoryview(frame).cast("B"))
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
