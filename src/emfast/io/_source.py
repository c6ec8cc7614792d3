"""The volume-source protocol: what a stored volume must offer for emfast to read it, in memory or lazily.

Every format (HDF5, zarr, N5, neuroglancer precomputed) implements :class:`VolumeSource`; a
:class:`~emfast.io.Volume` reads a source whole into memory, or window by window through the bounded chunk cache,
which asks the source for one block (a chunk of the store) at a time. Sources are read-only: none of them ever
writes to the user's store.
"""
from __future__ import annotations

import math
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union
from urllib.parse import unquote, urlsplit

import numpy as np

Triple = Tuple[float, float, float]


class DatasetNotFoundError(KeyError):
    """A dataset (array) named by the user does not exist in its file or store."""

    def __str__(self) -> str:  # KeyError would print the message quoted, like a key
        return str(self.args[0])


class LevelChoiceError(ValueError):
    """``level=`` or ``resolution=`` names no level of the volume, or the volume has no levels to choose from."""


class StoreMetadataError(ValueError):
    """The metadata of a file or store cannot describe an array: a key is missing, or holds a value of the wrong
    type or range. The message names the store, the array, the key and the value."""


class CorruptChunkError(OSError):
    """A chunk (N5: block) of a store cannot be decoded, or decodes to another shape or size than the array's
    metadata promises. The message names the store, the array and the chunk."""


def checked_chunk(data, dtype: np.dtype, shape: Sequence[int], where: object, stamp: Optional["Stamp"] = None
                  ) -> np.ndarray:
    """``data``, a chunk's decoded bytes, as an array of ``shape`` and ``dtype``, if it has exactly that many bytes.

    The chunks emfast decodes itself (zarr's common layouts, N5, HDF5 shuffle/gzip) and the boxes tensorstore
    returns pass through this one check, so a chunk that decodes to more or fewer bytes than the metadata promises
    (a damaged store, another writer's chunk, a store replaced after it was opened) is an error naming it
    (``where``: words, or any object whose ``str`` gives them), never data read from the wrong place. zarr-python
    refuses such chunks itself, and the zarr source names the chunk.

    Raises
    ------
    CorruptChunkError
        The size differs; the message says whether the store changed since it was opened (``stamp``).
    """
    expected = math.prod(int(s) for s in shape) * np.dtype(dtype).itemsize
    got = memoryview(data).nbytes
    if got != expected:
        raise CorruptChunkError(f"{where} decodes to {got} bytes, but the metadata promise "
                                f"{tuple(int(s) for s in shape)} {np.dtype(dtype).name} = {expected} bytes; "
                                + corruption_cause(stamp))
    return np.frombuffer(data, dtype).reshape(tuple(int(s) for s in shape))


def corruption_cause(stamp: Optional["Stamp"]) -> str:
    """Why a chunk does not decode as its metadata says: the store changed since it was opened (``stamp`` says),
    or it is corrupt."""
    if stamp is not None and not stamp.unchanged():
        return "the store's metadata changed since it was opened (it was replaced or rewritten): open it again"
    return "the store is corrupt, or another tool wrote this chunk with other metadata"


def fill_value(value, dtype: np.dtype) -> np.ndarray:
    """A zarr array's ``fill_value`` as a 0-d array of ``dtype``: 0 where the metadata says null, which zarr v2
    allows and tensorstore's zarr driver writes by default (zarr-python and tensorstore read the never-written
    chunks of such an array as 0)."""
    return np.zeros((), dtype) if value is None else np.asarray(value, dtype)


def decoded_into(data, out: np.ndarray, dtype: np.dtype, chunk_shape: Sequence[int], extent: Sequence[int],
                 decode, where: object, undecodable: str, stamp: Optional["Stamp"] = None) -> None:
    """Fill ``out`` (c, z, y, x) with the first ``extent`` voxels of a chunk from its stored bytes ``data``:
    ``decode`` them, check the size as a chunk of ``dtype`` (:func:`checked_chunk`, naming ``where``) and copy
    (converting to ``out``'s dtype). A codec's own exception
    is a :class:`CorruptChunkError` starting with ``undecodable`` (e.g. "store: cannot decode chunk c/0/0/0")."""
    try:
        decoded = decode(data)
    except Exception as error:  # codecs raise their own types for corrupt input
        raise CorruptChunkError(f"{undecodable}: {error}; the store may be corrupt or being written") from error
    chunk = checked_chunk(decoded, dtype, chunk_shape, where, stamp)
    view = chunk if chunk.ndim == 4 else chunk[np.newaxis]
    np.copyto(out, view[(slice(None),) + tuple(slice(0, int(e)) for e in extent)])


_transfers = threading.local()


def add_transfer_time(seconds: float) -> None:
    """Count ``seconds`` this thread spent moving a chunk's or metadata's bytes (a file read, a network request)."""
    _transfers.seconds = getattr(_transfers, "seconds", 0.0) + seconds


def transfer_time() -> float:
    """Seconds this thread has spent moving bytes (:func:`add_transfer_time`): the difference across a chunk's
    read is its transfer, the rest its decoding."""
    return getattr(_transfers, "seconds", 0.0)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


#: URL schemes read remotely, and the fsspec protocol of each.
SCHEMES = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "https"}
#: A URL's scheme and its "://": a path starting so names no local file.
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")


def refuse_unread_scheme(text) -> None:
    """ValueError for a URL (``scheme://``) of a scheme emfast reads neither remotely nor as file://: it was
    taken for a relative path and joined onto the working folder."""
    scheme = _URL.match(text) if isinstance(text, str) else None
    if scheme is not None and scheme.group(1).lower() not in SCHEMES and scheme.group(1).lower() != "file":
        raise ValueError(f"{text}: emfast reads no {scheme.group(1)}:// URL; it reads s3://, gs://, http(s):// "
                         "and local paths (file:// too)")


def local_path(path: Union[str, os.PathLike], dataset: Optional[str] = None) -> Path:
    """``path`` with ``~`` expanded; a ``file://`` URL as its local path (percent-escapes decoded; ValueError for
    one with an unescaped '#' or '?'). TypeError for an object that is no path (an open dataset or array), saying
    what to pass instead (an open HDF5 file given with ``dataset``: that dataset of its file)."""
    if not isinstance(path, (str, os.PathLike)):
        file, name = getattr(getattr(path, "file", None), "filename", None), getattr(path, "name", None)
        if isinstance(name, str) and dataset:  # an open h5py.File or Group, and the dataset inside it
            name = f"{name.rstrip('/')}/{dataset.lstrip('/')}".lstrip("/")
        hint = (f"emfast.open({file!r}, {name!r})" if isinstance(file, str) and isinstance(name, str) else
                "the path of its file or store (and its dataset), or an array in memory to "
                "emfast.Volume.from_array")
        raise TypeError(f"expected the path of a file or store, got a {type(path).__module__}.{type(path).__name__}: "
                        f"pass {hint}")
    text = os.fspath(path)
    if isinstance(text, str) and text.lower().startswith("file://"):
        if "#" in text or "?" in text:  # a URL's fragment and query: silently not part of the path
            raise ValueError(f"{text}: in a file:// URL, '#' starts a fragment and '?' a query, which name no file; "
                             "write them as %23 and %3F, or give the path itself")
        url = urlsplit(text)
        if url.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file:// URL names a local path (file:///path or file://localhost/path), "
                             f"not one on host {url.netloc!r}")
        text = unquote(url.path)
    else:
        refuse_unread_scheme(text)
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~user of no such user: the path as written, which is then not found
        return Path(text)


def require_kind(path: Path, expected: str, what: str) -> None:
    """Refuse ``path`` unless it is a regular file (``expected="file"``) or a directory; stat only, never opened,
    so a FIFO or device cannot block. A missing path passes (the caller says what is missing).

    Raises
    ------
    IsADirectoryError, NotADirectoryError, OSError
        ``path`` is of another kind; the message names it, its kind and ``what`` was expected there.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if expected == "file" and not stat.S_ISREG(mode):
        error = IsADirectoryError if stat.S_ISDIR(mode) else OSError
        raise error(f"{path} is {_kind(mode)}, not a regular file: {what} must be a file")
    if expected == "directory" and not stat.S_ISDIR(mode):
        kind = "a regular file" if stat.S_ISREG(mode) else _kind(mode)
        raise NotADirectoryError(f"{path} is {kind}, not a directory: {what} must be a directory")


def unlistable(why: str = ""):
    """An ``os.walk`` onerror that raises an OSError naming the folder (and ``why`` it matters): a folder that may
    be entered but not listed is never taken for an empty one."""
    def raise_it(error: OSError) -> None:
        raise OSError(error.errno, f"cannot list {error.filename}: {error.strerror}{why}") from None

    return raise_it


def read_regular_file(path: Path, what: str) -> Optional[bytes]:
    """The bytes of the regular file ``path``, or None if there is none; anything else (a directory, a FIFO, a
    device) is refused. Checked by stat before it is opened, so a FIFO is never opened; opened non-blocking and
    checked again through the descriptor, so a FIFO swapped in between can neither block nor slip through."""
    opened = _open_regular(path, what)
    if opened is None:
        return None
    start = time.perf_counter()
    with os.fdopen(opened[0], "rb") as file:
        data = file.read()
    add_transfer_time(time.perf_counter() - start)
    return data


def read_regular_file_into(path: Path, what: str, out: np.ndarray) -> Optional[bool]:
    """Read the regular file ``path`` straight into ``out`` (C-contiguous) if it has exactly ``out.nbytes`` bytes:
    True; False if it has another size (nothing read: the caller reads it whole to say what is wrong); None if there
    is no file. Refuses what :func:`read_regular_file` refuses."""
    opened = _open_regular(path, what)
    if opened is None:
        return None
    descriptor, size = opened
    start = time.perf_counter()
    try:
        with os.fdopen(descriptor, "rb", buffering=0) as file:
            if size != out.nbytes:
                return False
            view = memoryview(out.reshape(-1).view(np.uint8))
            got = 0
            while got < size:
                count = file.readinto(view[got:])
                if not count:
                    return False  # the file shrank while being read
                got += count
        return True
    finally:
        add_transfer_time(time.perf_counter() - start)


def _open_regular(path: Path, what: str) -> Optional[Tuple[int, int]]:
    """(descriptor, size) of the regular file ``path`` opened for reading, or None if there is none."""
    require_kind(path, "file", what)
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except IsADirectoryError:  # some systems refuse to open a directory at all
        raise IsADirectoryError(f"{path} is a directory, not a regular file: {what} must be a file") from None
    try:
        status = os.fstat(descriptor)
    except BaseException:
        os.close(descriptor)
        raise
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        error = IsADirectoryError if stat.S_ISDIR(status.st_mode) else OSError
        raise error(f"{path} is {_kind(status.st_mode)}, not a regular file: {what} must be a file")
    return descriptor, status.st_size


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
    data_files : tuple of (pathlib.Path, int, int)
        Other files holding the data, with their size and modification time then: the file an HDF5 external link
        leads to, a virtual dataset's source files. Rewriting one changes the data, not ``marker``.
    placement : str
        The voxel size and offset the volume was opened with, where metadata outside its files may give them (a
        zarr array: an OME-NGFF level's come from its image's), else "": part of an output's record of its input
        (:func:`~emfast.io._outputs.fingerprint`), not of its data.
    """

    path: Path
    dataset: str
    size: int
    mtime_ns: int
    marker: Optional[Path] = None
    data_files: tuple = ()
    placement: str = ""

    @classmethod
    def of(cls, path, dataset: str, marker=None, data_files=(), placement: str = "") -> "Stamp":
        marker = Path(path if marker is None else marker)
        stat = os.stat(marker)
        others = []
        for file in dict.fromkeys(Path(f).resolve() for f in data_files):
            if file != marker.resolve():
                state = os.stat(file)
                others.append((file, state.st_size, state.st_mtime_ns))
        return cls(Path(path).resolve(), dataset, stat.st_size, stat.st_mtime_ns, marker.resolve(), tuple(others),
                   placement)

    def unchanged(self) -> bool:
        """True if the marker file and the other data files still have the size and modification time they had
        when the volume was opened."""
        return _same_state(self.marker or self.path, self.size, self.mtime_ns) and self.data_files_unchanged()

    def data_files_unchanged(self, skip: Sequence[Path] = ()) -> bool:
        """True if the other data files (but those in ``skip``) still have the size and modification time they
        had when the volume was opened."""
        return all(_same_state(*entry) for entry in self.data_files if entry[0] not in skip)


def _same_state(file: Path, size: int, mtime_ns: int) -> bool:
    try:
        now = os.stat(file)
    except OSError:
        return False
    return (now.st_size, now.st_mtime_ns) == (size, mtime_ns)


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
    translation : tuple of float or None
        A binned level of an OME-NGFF image: its translation as the image states it (the centre of its first
        voxel, half the voxel size difference past level 0's corner, which ``offset`` is); None otherwise.
    stamp : Stamp
        Location and state when opened (statistics cache key, pickling, change detection).
    parallel_reads : bool
        Whether reading several chunks on several threads at once is faster than one after another: True where a
        chunk read is mostly decoding that releases the GIL (the chunk cache then reads a box's missing chunks side
        by side, :mod:`emfast.io._decode`); False where it is mostly Python work (an uncompressed file), which
        threads would only contend for.
    whole_by_chunks : bool
        Whether the whole volume reads faster chunk by chunk through ``read_many`` than in one :meth:`read`
        (:func:`emfast.io._whole.read_whole`: in-memory opens, ``np.asarray`` of a lazy volume): True where emfast
        reads the chunks itself and the store's library reads a whole array more slowly (zarr-python, N5, HDF5's
        deflate filter, raw precomputed chunk files).

    A source may also offer ``read_many(requests)``, filling several boxes, ``requests`` a list of
    ``(corner, extent, out)`` as :meth:`read` takes them, in one call (tensorstore's concurrent reads): the chunk
    cache then reads a box's missing chunks through it, together. A remote source may offer ``will_read(blocks)``,
    ``blocks`` a list of (corner, extent): the chunk cache announces every block it is about to read, and the source
    requests them all at once.
    """

    parallel_reads: bool = False
    whole_by_chunks: bool = False
    name: str
    full_shape: Tuple[int, ...]
    dtype: np.dtype
    chunks: Optional[Tuple[int, int, int]] = None
    resolution: Optional[Triple] = None
    offset: Optional[Triple] = None
    translation: Optional[Triple] = None
    stamp: Stamp

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        """Fill ``out`` (c, dz, dy, dx), native byte order, with the box ``[corner, corner + extent)`` of every
        channel. The box lies inside the volume. Safe to call from several threads at once."""
        raise NotImplementedError

    def changed_since_opened(self) -> bool:
        """Whether the files this source reads are no longer those it opened: the store was recreated, rewritten
        or removed (its marker file's size or modification time differ, or it is gone). A remote source is not
        looked at: that would cost a request each time."""
        stamp = getattr(self, "stamp", None)
        return isinstance(stamp, Stamp) and not stamp.unchanged()

    def attributes(self) -> dict:
        """The dataset's own metadata attributes (what ``emfast convert`` carries over)."""
        return {}

    def attribute_keys(self) -> tuple:
        """The optional metadata files (below the store's root) whose attributes place this volume: read as absent
        where a remote store denies them, they would drop its resolution and offset (see
        :meth:`~emfast.io._remote.RemoteStore.refuse_denied_attributes`)."""
        return ()

    def describe(self) -> str:
        """Shape, dtype and chunks as ``emfast info`` shows them: by default as a Volume reads them (spatial
        shape, channels if more than one, native dtype, bool as uint8)."""
        dtype = np.dtype(self.dtype).newbyteorder("=")
        channels = f" channels={self.full_shape[0]}" if len(self.full_shape) == 4 and self.full_shape[0] > 1 else ""
        return (f"shape={plain(self.full_shape[-3:])}{channels} dtype={np.dtype(np.uint8) if dtype == bool else dtype} "
                f"chunks={plain(self.chunks)}")

    def reopen_arguments(self) -> tuple:
        """The arguments of this class that open the same source again (a lazy volume pickles as them)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release open files; reads after it fail."""

    def __repr__(self) -> str:
        shape, chunks = plain(getattr(self, "full_shape", None)), plain(getattr(self, "chunks", None))
        dtype = getattr(self, "dtype", None)
        return (f"{type(self).__name__}({getattr(self, 'name', '?')!r}, shape={shape}, "
                f"dtype={None if dtype is None else np.dtype(dtype).name}, chunks={chunks})")


def plain(values):
    """A tuple of plain Python numbers (reprs show ``10``, not ``np.int64(10)``), or None."""
    if values is None:
        return None
    return tuple(int(v) if isinstance(v, (int, np.integer)) else float(v) for v in values)
