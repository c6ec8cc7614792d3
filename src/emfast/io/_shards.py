"""Inner chunks of a local sharded zarr v3 array, read straight from their shard files.

A shard (zarr v3's ``sharding_indexed`` codec) is one file holding many inner chunks, each encoded alone, and an
index: for each inner chunk, in C order of the shard's grid of inner chunks, its byte offset and length (two
little-endian uint64; both 2**64 - 1 where the chunk was never written), at the file's end or start
(``index_location``), followed by a CRC32C checksum where ``index_codecs`` says so.

zarr-python reads one inner chunk through its event loop and the whole codec pipeline (about 3 ms each, most of it
under the GIL); here the shard's index is read once and kept, and each inner chunk is one ``pread`` of its bytes
and one decode with numcodecs (zstd, blosc, gzip), which releases the GIL. A kept index is used again only while
the shard file's size and modification time are unchanged, so a rewritten shard is never read through a stale
index. A chunk whose index entry points outside its file, or an index whose checksum fails, is a
:class:`~emfast.io._source.CorruptChunkError` naming the store and the shard.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np

from .._core.files import CHUNK_FILLED
from ._decode import SideBySide
from ._filebatch import (BATCH_BYTES, compiled_codec, lent_buffer, read_decoded_files, read_regular_files,
                         whole_and_rest)
from ._metadata import zarr_text
from ._source import CorruptChunkError, Stamp, add_transfer_time, decoded_into, fill_value, require_kind

#: Index entry of an inner chunk that was never written (offset and length both).
_EMPTY = np.uint64(2 ** 64 - 1)

#: Shard indexes kept per array (least recently used dropped first); 16 bytes per inner chunk each.
KEPT_INDEXES = 4096


class ShardedChunks:
    """Reads the inner chunks of a local sharded zarr v3 array whose layout this class decodes exactly.

    Parameters
    ----------
    array : zarr.Array
        The array (opened by zarr-python, which parsed and checked its metadata).
    directory : Path
        The array's directory.
    decode : callable
        Bytes of one encoded inner chunk -> its decoded bytes.
    decode_into : callable or None
        (bytes, out) -> whether it decoded them straight into ``out``; its ``many(contents, outs, wholes)`` decodes
        a box's whole chunks at once (see ``_zarr._IntoDecoder``).
    checksum, at_end : bool
        Whether the index ends with a CRC32C checksum; whether it is at the shard's end (else its start).
    """

    def __init__(self, array, directory: Path, decode: Callable, decode_into: Optional[Callable], checksum: bool,
                 at_end: bool) -> None:
        self._metadata = array.metadata
        self._directory = directory
        self._decode = decode
        self._decode_into = decode_into
        self._checksum = checksum
        self._at_end = at_end
        self._inner = tuple(int(c) for c in array.chunks)
        self._shard = tuple(int(s) for s in array.shards)
        self._shape = tuple(int(s) for s in array.shape)
        self._per_shard = tuple(s // c for s, c in zip(self._shard, self._inner))
        self._index_bytes = 16 * int(np.prod(self._per_shard)) + 4 * checksum
        self._dtype = np.dtype(array.dtype)
        if self._dtype.itemsize > 1 and array.serializer.endian is not None:
            self._dtype = self._dtype.newbyteorder("<" if zarr_text(array.serializer.endian) == "little" else ">")
        self._fill = fill_value(array.fill_value, self._dtype)
        self._raw = len(array.metadata.codecs[0].codecs) == 1  # bytes alone: no compressor
        self._indexes: "OrderedDict[str, Tuple[Tuple[int, int], np.ndarray]]" = OrderedDict()
        self._lock = threading.Lock()
        # a box's chunks decoded side by side where that pays, as measured for shards of this codec and chunk size
        self._decodes = SideBySide.of("zarr shards", repr(tuple(array.metadata.codecs[0].codecs)),
                                      math.prod(self._inner) * self._dtype.itemsize)

    @classmethod
    def for_array(cls, array, directory: Path, decoder: Callable, decoder_into: Callable
                  ) -> Optional["ShardedChunks"]:
        """A reader if ``array`` is sharded in a layout this class decodes exactly (sharding the only
        array-to-bytes codec, no filters; inner chunks: bytes and at most one compressor ``decoder`` knows;
        index: bytes, little-endian, optionally crc32c), else None (zarr-python reads it). ``decoder`` and
        ``decoder_into`` make the inner compressor's decoders."""
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
        codecs = getattr(array.metadata, "codecs", ())
        if not directory.is_dir() or getattr(array, "shards", None) is None or len(codecs) != 1:
            return None
        sharding = codecs[0]
        if not isinstance(sharding, ShardingCodec) or np.dtype(array.dtype).kind not in "uif":
            return None
        inner = list(sharding.codecs)
        if not inner or not isinstance(inner[0], BytesCodec) or len(inner) > 2:
            return None
        decode = decoder(inner[1]) if len(inner) == 2 else (lambda data: data)
        into = decoder_into(inner[1]) if len(inner) == 2 else None
        index = list(sharding.index_codecs)
        little = isinstance(index[0], BytesCodec) and zarr_text(index[0].endian) in (None, "little")
        checksum = len(index) == 2 and isinstance(index[1], Crc32cCodec)
        if decode is None or not little or len(index) != 1 + checksum:
            return None
        return cls(array, directory, decode, into, checksum, zarr_text(sharding.index_location) == "end")

    def _one_chunk(self, corner, extent) -> bool:
        """Whether the box is exactly one inner chunk of a 3-D array."""
        return len(self._shape) == 3 and all(int(c) % k == 0 and int(e) == min(k, s - int(c))
                                             for c, e, k, s in zip(corner, extent, self._inner, self._shape))

    def _locate(self, corner, name: str) -> Tuple[str, int, "_ChunkName"]:
        """(its shard's key, its position in the shard's index, words naming it) of the inner chunk at ``corner``."""
        return self._locate_many([corner], name)[0]

    def _locate_many(self, corners, name: str) -> List[Tuple[str, int, "_ChunkName"]]:
        """:meth:`_locate` of each of ``corners``, at once (a box's chunks): their shards' keys made once each."""
        chunks = np.asarray(corners, np.int64).reshape(-1, 3) // self._inner
        per_shard = np.array(self._per_shard)
        positions = np.ravel_multi_index(tuple((chunks % per_shard).T), self._per_shard).tolist()
        keys: dict = {}
        located = []
        for chunk, shard, position in zip(map(tuple, chunks.tolist()), map(tuple, (chunks // per_shard).tolist()),
                                          positions):
            key = keys.get(shard)
            if key is None:
                key = keys[shard] = self._metadata.encode_chunk_key(shard)
            located.append((key, position, _ChunkName(name, chunk, key)))
        return located

    def read(self, corner, extent, out: np.ndarray, name: str, stamp: Stamp) -> bool:
        """Fill ``out`` (1, z, y, x) if the box is exactly one inner chunk of a 3-D array; False otherwise, and
        the caller reads through zarr-python."""
        if not self._one_chunk(corner, extent):
            return False
        key, position, where = self._locate(corner, name)
        start = time.perf_counter()
        try:
            data = self._chunk_bytes(key, position, where)
        finally:  # the shard's bytes moved: the rest of the read is decoding
            add_transfer_time(time.perf_counter() - start)
        self._fill_from(data, extent, out, where, stamp)
        return True

    def read_many(self, requests, name: str, stamp: Stamp) -> list:
        """Fill the boxes of ``requests`` ((corner, extent, out) each) that are one inner chunk each: the indexes
        of their shards not kept yet read in one call, then the chunks' byte ranges read in one call
        (:func:`read_regular_files`) and decoded, in parts side by side where that pays (:class:`SideBySide`).
        A chunk whose shard changed since its index was read is read again alone (:meth:`read`). Returns the
        requests it did not fill."""
        mine, rest = [], []
        for request in requests:
            (mine if self._one_chunk(request[0], request[1]) else rest).append(request)
        located = self._locate_many([corner for corner, _, _ in mine], name)
        indexes = self._indexes_of(sorted({key for key, _, _ in located}), {key: w for key, _, w in located})
        ranges = []
        for (key, position, where), (corner, extent, out) in zip(located, mine):
            version, index = indexes[key]
            entry = None if index is None else self._entry(index, position, version[0], where)
            if entry is None:
                self._fill_from(None, extent, out, where, stamp)
            else:
                ranges.append((key, entry, version, where, corner, extent, out))
        again: list = []
        self._decodes.run(ranges, functools.partial(self._read_part, again=again, stamp=stamp),
                          most=max(1, BATCH_BYTES // (math.prod(self._inner) * self._dtype.itemsize)))
        for corner, extent, out in again:
            self.read(corner, extent, out, name, stamp)
        return rest

    def _read_part(self, ranges, again: list, stamp: Stamp) -> None:
        """Read and decode inner chunks, ``ranges`` (shard key, (offset, length), the shard's version its index
        was read at, words naming the chunk, corner, extent, out) each: whole chunks of a codec emfast decodes
        itself in one compiled call, the others (and those it could not fill) read in one call, then decoded one
        after another. A chunk whose shard is no longer at that version is appended to ``again`` (its box as
        :meth:`read` takes it)."""
        codec = compiled_codec(self._raw, self._decode_into)
        if codec is not None:
            ranges = self._read_decoded(ranges, codec, again)
        if not ranges:
            return
        directory = str(self._directory)
        with lent_buffer() as buffer:
            contents, versions = read_regular_files([os.path.join(directory, key) for key, *_ in ranges],
                                                    "a zarr shard", [entry[0] for _, entry, *_ in ranges],
                                                    [entry[1] for _, entry, *_ in ranges], buffer=buffer)
            current = [read_version == version and data is not None and len(data) == entry[1]
                       for data, read_version, (_, entry, version, *_) in zip(contents, versions, ranges)]
            outs = [out for *_, out in ranges]
            decoded = [False] * len(ranges) if self._decode_into is None else \
                self._decode_into.many([data if ok else None for data, ok in zip(contents, current)], outs,
                                       [self._whole(out) for out in outs])
            for data, ok, done, (*_, where, corner, extent, out) in zip(contents, current, decoded, ranges):
                if not ok:
                    again.append((corner, extent, out))
                elif not done:
                    self._fill_from(data, extent, out, where, stamp)

    def _read_decoded(self, ranges, codec: str, again: list) -> list:
        """Fill the whole inner chunks of ``ranges`` (as :meth:`_read_part` takes them) by
        :func:`read_decoded_files`, a chunk whose shard changed since its index was read appended to ``again``;
        returns the others, and those it could not fill (read again the general way, which names what is
        wrong)."""
        mine, left = whole_and_rest(ranges, self._whole)
        if not mine:
            return left
        directory = os.path.join(str(self._directory), "")
        with lent_buffer() as buffer:
            results, versions = read_decoded_files([directory + key for key, *_ in mine], codec,
                                                   [out for *_, out in mine], buffer,
                                                   [entry for _, entry, *_ in mine])
        for chunk, result, read in zip(mine, results, versions):
            key, entry, version, where, corner, extent, out = chunk
            if read != version:  # rewritten or removed since its index was read: its chunk read again alone
                again.append((corner, extent, out))
            elif result != CHUNK_FILLED:
                left.append(chunk)
        return left

    def _whole(self, out: np.ndarray) -> bool:
        """Whether ``out`` is a whole inner chunk's buffer, which a chunk is decoded straight into."""
        return out.flags.c_contiguous and out.dtype == self._dtype and out.size == math.prod(self._inner)

    def _fill_from(self, data, extent, out: np.ndarray, where: "_ChunkName", stamp: Stamp) -> None:
        """Fill ``out`` from an inner chunk's stored bytes ``data`` (None: never written, the fill value)."""
        if data is None:
            out[...] = self._fill
            return
        if self._whole(out) and self._decode_into is not None and self._decode_into(data, out):
            return
        decoded_into(data, out, self._dtype, self._inner, extent, self._decode, where, f"{where}: cannot decode it",
                     stamp)

    def _indexes_of(self, keys, where) -> dict:
        """Shard key -> ((size, mtime), index or None where there is no shard file) for ``keys``: kept indexes as
        they are (the chunks' reads check their version), the others read in one call. ``where``: key -> words
        naming a chunk of it, for errors."""
        found = {}
        with self._lock:
            for key in keys:
                kept = self._indexes.get(key)
                if kept is not None:
                    self._indexes.move_to_end(key)
                    found[key] = kept
        unread = [key for key in keys if key not in found]
        if unread:
            start = -self._index_bytes if self._at_end else 0
            contents, versions = read_regular_files([self._directory / key for key in unread], "a zarr shard",
                                                    [start] * len(unread), [self._index_bytes] * len(unread))
            for key, raw, version in zip(unread, contents, versions):
                if raw is None:
                    found[key] = (version, None)
                    continue
                self._check_size(version[0], where[key])
                found[key] = (version, self._keep_index(key, bytes(raw), version, where[key]))
        return found

    def _check_size(self, size: int, where: "_ChunkName") -> None:
        if size < self._index_bytes:
            raise CorruptChunkError(f"{where}: the shard file has {size} bytes, fewer than its index's "
                                    f"{self._index_bytes}; the store is corrupt or being written")

    @staticmethod
    def _entry(index: np.ndarray, position: int, size: int, where: "_ChunkName") -> Optional[Tuple[int, int]]:
        """(offset, length) of inner chunk ``position`` in a shard of ``size`` bytes, or None if never written."""
        offset, length = index[position]
        if offset == _EMPTY and length == _EMPTY:
            return None
        if int(offset) + int(length) > size:
            raise CorruptChunkError(f"{where}: the shard's index places it at bytes "
                                    f"{int(offset)}..{int(offset) + int(length)}, beyond the file's {size}; the "
                                    "store is corrupt or being written")
        return int(offset), int(length)

    def _chunk_bytes(self, key: str, position: int, where: "_ChunkName") -> Optional[bytes]:
        """The encoded bytes of inner chunk ``position`` of shard ``key``, or None if it was never written
        (``where`` names the chunk in errors)."""
        path = self._directory / key
        require_kind(path, "file", "a zarr shard")
        try:
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return None
        try:
            status = os.fstat(descriptor)
            size = status.st_size
            self._check_size(size, where)
            index = self._index(key, descriptor, (size, status.st_mtime_ns), where)
            entry = self._entry(index, position, size, where)
            return None if entry is None else os.pread(descriptor, entry[1], entry[0])
        finally:
            os.close(descriptor)

    def _index(self, key: str, descriptor: int, version: Tuple[int, int], where: "_ChunkName") -> np.ndarray:
        """Shard ``key``'s index, (n, 2) (offset, length), kept while the file's (size, mtime) is ``version``."""
        with self._lock:
            kept = self._indexes.get(key)
            if kept is not None and kept[0] == version:
                self._indexes.move_to_end(key)
                return kept[1]
        start = version[0] - self._index_bytes if self._at_end else 0
        return self._keep_index(key, os.pread(descriptor, self._index_bytes, start), version, where)

    def _keep_index(self, key: str, raw: bytes, version: Tuple[int, int], where: "_ChunkName") -> np.ndarray:
        """Shard ``key``'s index from its stored bytes ``raw`` (checked against its checksum), kept for
        ``version``."""
        if self._checksum:
            import numcodecs
            try:
                raw = numcodecs.CRC32C().decode(raw)
            except Exception as error:  # numcodecs raises RuntimeError for a mismatch
                raise CorruptChunkError(f"{where}: the shard's index fails its CRC32C checksum ({error}); the "
                                        "store is corrupt or being written") from error
        index = np.frombuffer(raw, "<u8").reshape(-1, 2)
        with self._lock:
            self._indexes[key] = (version, index)
            if len(self._indexes) > KEPT_INDEXES:
                self._indexes.popitem(last=False)
        return index


class _ChunkName:
    """Words naming an inner chunk in errors (``f"{where}: ..."``), formatted only if one is raised: a box's
    chunks are located by the dozen, their names needed by none where all goes well."""

    __slots__ = ("_name", "_chunk", "_key")

    def __init__(self, name: str, chunk: tuple, key: str) -> None:
        self._name, self._chunk, self._key = name, chunk, key

    def __str__(self) -> str:
        return f"{self._name}: chunk (z, y, x) = {self._chunk} (in shard {self._key})"
