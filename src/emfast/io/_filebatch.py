"""Reading the files of many chunks in one call: the missing blocks of a box, read by the compiled reader.

A box of a lazy volume misses up to 27 chunks at once. Read one by one in Python, each file costs a stat, an open,
an fstat, a read and a close through the interpreter, about as long as decoding it (``benchmarks/lazy_cold.py``);
:func:`read_regular_files` makes the same system calls for all of them in one call of ``emfast._core.files``
without the GIL, with the same contract as :func:`~emfast.io._source.read_regular_file`: a path is checked before
it is opened, so a FIFO or a device is refused, never read.
"""
from __future__ import annotations

import contextlib
import errno as errnos
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._core.files import (FILE_FAILED, FILE_MISSING, FILE_NOT_REGULAR, FILE_READ, FILE_UNSUPPORTED, read_decode_files,
                           read_files)
from ._blockslots import private_map
from ._source import _kind, add_transfer_time, read_regular_file

#: Most bytes of chunk files a reader reads in one call: a box's missing chunks beyond it (large chunks, or a
#: batch's read-ahead) are read in several calls, so that their encoded bytes never wait in memory all at once.
#: Below KEPT_BUFFER_BYTES, so that the buffer read into is one kept for the next reads: one allocated and freed
#: per call (8 MiB) made the allocator keep tens of MiB beside the cache (a lazy zarr loader at 1.28 to 1.60 x
#: budget + slots, 1.07 to 1.12 x with 2 MiB).
BATCH_BYTES = 2 << 20

#: Most files one call of the compiled reader holds open at once (it opens a call's files, then reads them): a
#: batch of 512 small chunks in one call failed with EMFILE in a process limited to 256 descriptors
#: (``ulimit -n 256``, 9 of them in use), which zarr-python reads within. Calls side by side (decode helpers, one
#: per idle core) share :data:`DESCRIPTOR_SHARE` of the limit, see :class:`_OpenFiles`.
FILES_PER_CALL = 64

#: The share of the process's descriptor limit the reader's calls may hold open together (at least one call's
#: worth): the rest is the user's, the HDF5 files' and the libraries'.
DESCRIPTOR_SHARE = 4


def descriptor_limit() -> Optional[int]:
    """The process's soft limit of open files; None where it has none (RLIM_INFINITY: BSD, macOS can) or it is not
    known (Windows, where the Python reader reads the files one by one)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


class _OpenFiles:
    """The files the compiled reader's calls hold open, counted across threads: a call waits while the others
    hold so many that its own would pass the process's share of descriptors (a 16-core machine's 15 decode
    helpers, 64 files each, passed ``ulimit -n 256``; macOS's default limit is 256)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open = 0

    @staticmethod
    def _most() -> int:
        soft = descriptor_limit()
        return 1 << 40 if soft is None else max(FILES_PER_CALL, soft // DESCRIPTOR_SHARE)

    @contextlib.contextmanager
    def held(self, count: int) -> Iterator[None]:
        """Hold ``count`` (at most :data:`FILES_PER_CALL`) files open for the block, waiting for room first."""
        most = self._most()
        with self._changed:
            self._changed.wait_for(lambda: self._open == 0 or self._open + count <= most)
            self._open += count
        try:
            yield
        finally:
            with self._changed:
                self._open -= count
                self._changed.notify_all()

    def forget(self) -> None:
        """In a child process after fork(): no call of the parent's threads runs there."""
        self._changed = threading.Condition()
        self._open = 0


_OPEN_FILES = _OpenFiles()
os.register_at_fork(after_in_child=_OPEN_FILES.forget)

#: Bytes of a lent buffer (a box's chunks take about a MiB, a call's at most BATCH_BYTES decoded), and most
#: buffers kept for the next reads.
KEPT_BUFFER_BYTES = 4 << 20
KEPT_BUFFERS = 4


class FileBuffer:
    """Where :func:`read_regular_files` puts the bytes of the files it reads, reused by the next reads (files that
    do not fit go to new memory of their own). Reused memory spares the page faults of fresh memory, which cost
    more than the reads themselves.

    The buffer is a memory map of its own (of :data:`KEPT_BUFFER_BYTES`; only the pages reads touch are
    resident), not memory from malloc: buffers allocated by whichever reader thread needed one stayed in that
    thread's malloc arena once freed, each of five reader threads holding its largest read's bytes (a lazy loader
    over 64 KiB zstd chunks grew 14-22 MiB beside its 32 MiB cache, ``benchmarks/lazy_memory.py``)."""

    def __init__(self) -> None:
        self.array = np.frombuffer(private_map(KEPT_BUFFER_BYTES, "reading chunk files"), np.uint8)


_kept: List[FileBuffer] = []
_kept_lock = threading.Lock()


@contextlib.contextmanager
def lent_buffer() -> Iterator[FileBuffer]:
    """A :class:`FileBuffer` lent for the block and given back after it: bytes read into it must not be used
    after the block."""
    with _kept_lock:
        buffer = _kept.pop() if _kept else FileBuffer()
    try:
        yield buffer
    finally:
        with _kept_lock:
            if len(_kept) < KEPT_BUFFERS:
                _kept.append(buffer)


#: One file's bytes as :func:`read_regular_files` gives them: None (no file), True (read into its ``into``
#: array), or a read-only view of them.
Contents = Union[None, bool, memoryview]


def read_regular_files(paths: Sequence[Path], what: str, starts: Optional[Sequence[int]] = None,
                       lengths: Optional[Sequence[int]] = None, into: Optional[List[Optional[np.ndarray]]] = None,
                       buffer: Optional[FileBuffer] = None) -> Tuple[List[Contents], List[Tuple[int, int]]]:
    """Read regular files whole, or ``lengths`` bytes from ``starts`` (a negative start counts from the end), in
    calls of the compiled reader without the GIL (one per :data:`FILES_PER_CALL` files); a file with exactly
    ``into[i].nbytes`` bytes to read is read into ``into[i]``, the others into ``buffer`` (see
    :func:`lent_buffer`; default: new memory; a second call's files into new memory of their own).

    Returns
    -------
    contents : list
        Per path: None if there is no file, True if it was read into ``into[i]``, else its bytes (fewer than asked
        for where the file ends first): a read-only view of the memory it was read into (``buffer``'s array for
        the first call's files), valid until that buffer's next read.
    versions : list of (int, int)
        Per path: (size, modification time in ns) of the file as it was read, (0, 0) where there is none.

    Raises
    ------
    IsADirectoryError, OSError
        A path is a directory, FIFO, device or socket (named, with its kind, as ``what`` must be a file), or a
        read failed (the path and the system's reason).
    """
    contents: List[Contents] = []
    if len(paths) > FILES_PER_CALL:  # in parts: the first into ``buffer``, the others into new memory
        versions: List[Tuple[int, int]] = []
        for first in range(0, len(paths), FILES_PER_CALL):
            part = slice(first, first + FILES_PER_CALL)
            part_contents, part_versions = read_regular_files(
                paths[part], what, None if starts is None else starts[part], None if lengths is None else lengths[part],
                None if into is None else into[part], buffer if first == 0 else None)
            contents += part_contents
            versions += part_versions
        return contents, versions
    start = time.perf_counter()
    scratch = None if buffer is None else buffer.array
    with _OPEN_FILES.held(len(paths)):
        data, offsets, count, status, modes, errors, sizes, mtimes = read_files(list(paths), starts, lengths, into,
                                                                                scratch)
    add_transfer_time(time.perf_counter() - start)
    view = memoryview(data).toreadonly()
    for i, (path, code, offset, read) in enumerate(zip(paths, status.tolist(), offsets.tolist(), count.tolist())):
        if code == FILE_READ:
            contents.append(True if offset < 0 else view[offset:offset + read])
        elif code == FILE_MISSING:
            contents.append(None)
        elif code == FILE_NOT_REGULAR:
            kind = _kind(int(modes[i]))
            error = IsADirectoryError if kind == "a directory" else OSError
            raise error(f"{path} is {kind}, not a regular file: {what} must be a file")
        elif code == FILE_FAILED:
            number = int(errors[i])
            raise OSError(number, f"cannot read {what}: {os.strerror(number)} ({errnos.errorcode.get(number, '')})"
                                  f"{descriptor_hint(number)}", str(path))
        else:
            assert code == FILE_UNSUPPORTED, code
            contents.append(_read_in_python(Path(path), what, None if starts is None else int(starts[i]),
                                            None if lengths is None else int(lengths[i])))
    return contents, list(zip(sizes.tolist(), mtimes.tolist()))


def compiled_codec(raw: bool, decode_into) -> Optional[str]:
    """The codec in which :func:`read_decoded_files` reads an array's chunks: "raw" (no compressor), that of its
    ``decode_into`` (``_zarr._IntoDecoder``) where its library is bound, else None (they are read the general
    way)."""
    return "raw" if raw else None if decode_into is None else decode_into.compiled()


def whole_and_rest(requests: Sequence, whole: Callable[[np.ndarray], bool]) -> Tuple[list, list]:
    """(the requests whose array (their last item) ``whole`` says is a whole chunk's, the others): what
    :func:`read_decoded_files` fills, and what is read the general way."""
    wholes = [whole(request[-1]) for request in requests]
    return ([request for request, one in zip(requests, wholes) if one],
            [request for request, one in zip(requests, wholes) if not one])


def read_decoded_files(paths: Sequence[str], codec: str, outs: List[np.ndarray], buffer: FileBuffer,
                       ranges: Optional[Sequence[Tuple[int, int]]] = None) -> Tuple[List[int], List[Tuple[int, int]]]:
    """Read the files ``paths`` (whole, or their byte ranges ``ranges[i]``: (start, length)) and decode each into
    ``outs[i]`` (whole chunks; ``codec`` as :func:`emfast._core.files.read_decode_files` takes it, its library
    bound), in calls of at most :data:`FILES_PER_CALL` files, their encoded bytes into ``buffer``.

    Returns
    -------
    results : list of int
        Per path ``emfast._core.files.CHUNK_FILLED``, ``CHUNK_MISSING`` (no file) or ``CHUNK_AGAIN``: to be read
        the general way, which names what is wrong (not a regular file, a failed read, a damaged frame).
    versions : list of (int, int)
        Per path: (size, modification time in ns) of the file as it was read, (0, 0) where it was not.
    """
    results: List[int] = []
    versions: List[Tuple[int, int]] = []
    for first in range(0, len(paths), FILES_PER_CALL):
        part = slice(first, first + FILES_PER_CALL)
        with _OPEN_FILES.held(len(paths[part])):
            result, data, seconds, read = read_decode_files(codec, list(paths[part]), outs[part], buffer.array,
                                                            None if ranges is None else ranges[part])
        add_transfer_time(seconds)
        results += result.tolist()
        versions += map(tuple, read.tolist())
    return results, versions


def descriptor_hint(number: Optional[int]) -> str:
    """For EMFILE, the process's descriptor limit and what to do: the file named is where it ran out, not why."""
    if number != errnos.EMFILE:
        return ""
    soft = descriptor_limit()
    limit = "" if soft is None else f" of {soft}"
    return (f"; the process has every file descriptor its limit{limit} allows open (ulimit -n): raise the limit, "
            "or open fewer files at once (lazily read HDF5 volumes hold up to a quarter of the limit open, 16 at "
            "least; read small ones in memory)")


def _read_in_python(path: Path, what: str, start: Optional[int], length: Optional[int]) -> Optional[memoryview]:
    """One file's bytes (or range) through the Python reader, where the compiled one reads none (Windows)."""
    data = read_regular_file(path, what)
    if data is None:
        return None
    first = 0 if start is None else (max(len(data) + start, 0) if start < 0 else start)
    stop = len(data) if length is None or length < 0 else first + length
    return memoryview(data)[first:stop]
