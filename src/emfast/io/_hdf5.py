"""HDF5 datasets as volume sources (h5py), opened read-only.

Chunked datasets whose filters are at most shuffle and deflate (gzip) are read chunk by chunk with
``Dataset.id.read_direct_chunk`` and decoded here: h5py's global lock is held only while the compressed bytes are
read (taken here: h5py before 3.16 did not take it for its low-level calls, and threads reading chunks at once
crashed HDF5, which is not thread-safe, see :data:`HDF5_LOCK`), and ``zlib`` decompresses with the GIL released, so
several producer threads decode in parallel, and the chunks a box misses are decompressed side by side where that
pays (``read_many``). Any other read (contiguous datasets, other filters, chunks never written, which read as the
fill value, boxes that are not one chunk) goes through ``Dataset.read_direct``, which HDF5 serialises.

A virtual dataset (VDS) is read only if every source file exists and holds its dataset, checked when it is
opened, and each source a lazy read touches is checked to still exist: HDF5 itself reads a missing source as
the fill value. Only regular files are opened: a FIFO named ``*.h5`` is refused, never opened (it would block).

A lazily read volume reads through its open file; beyond a bound on the files open at once (a quarter of the
descriptor limit, :mod:`emfast.io._hdf5files`) those of the volumes read least recently are closed and opened again
when read, checked to be the file first opened.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import zlib
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import h5py
import numpy as np

from . import _deflate
from ._decode import SideBySide
from ._filebatch import descriptor_hint
from ._hdf5files import OPEN_FILES, close_files, most_open, open_identity
from ._geometry import CANONICAL, GEOMETRY_KEYS, array_geometry, check_dimensions, ilastik_axes
from ._metadata import parsing
from ._outputs import OutputLock, warn_if_unfinished
from ._source import (CorruptChunkError, DatasetNotFoundError, Stamp, StoreMetadataError, VolumeSource, checked_chunk,
                      local_path, require_kind)
from ._volume import Volume

_DIRECT_FILTERS = {h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_DEFLATE}

try:  # the lock every high-level h5py call holds, so that one HDF5 call runs at a time in the process
    from h5py._objects import phil as HDF5_LOCK
except ImportError:  # a later h5py without it: its low-level calls are expected to lock themselves
    HDF5_LOCK = threading.RLock()
#: ``HDF5_LOCK`` is held around the low-level calls emfast makes from several threads (``read_direct_chunk``,
#: chunk and storage queries): h5py 3.8 to 3.15 made them without it, and emfast's decode helpers and producers
#: calling them at once crashed the process (SIGSEGV in ``emfast demo`` 9 of 16 runs on h5py 3.8.0, a helper
#: found); h5py 3.16 takes it itself, and it is re-entrant.


def open_hdf5(path: Union[str, os.PathLike]) -> h5py.File:
    """Open an HDF5 file read-only, with errors that name the path (``~`` and ``file://`` as :func:`local_path`)."""
    path = local_path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not an HDF5 file")
    require_kind(path, "file", "an HDF5 file")  # before HDF5 opens it: a FIFO would block forever
    if not path.exists():
        raise FileNotFoundError(f"HDF5 file not found: {path}")
    try:
        return h5py.File(path, "r")
    except BlockingIOError as exc:  # HDF5's lock: "as an HDF5 file" read as a damaged file (a review)
        raise BlockingIOError(exc.errno, _being_written(path, exc)) from exc
    except OSError as exc:
        raise OSError(f"cannot open {path} as an HDF5 file: {exc}{descriptor_hint(exc.errno)}") from exc


def _being_written(path: Path, error: OSError) -> str:
    """Why the HDF5 file ``path`` cannot be opened to read while a program holds HDF5's lock to write it."""
    pid = OutputLock(path).holder()
    if pid is None:
        writer = "another program is writing it"
    elif pid == "unknown":  # its lock file unreadable, or without a pid
        writer = "an emfast run may be writing a prediction or conversion into it (its lock file does not say which)"
    else:
        writer = f"an emfast run (pid {pid}) is writing a prediction or conversion into it"
    return (f"cannot read {path}: {writer}, and HDF5 locks a file it writes against readers "
            f"({error.strerror or error}); wait for it to finish, or write outputs to a file of their own. "
            "HDF5_USE_FILE_LOCKING=FALSE lets readers in, "
            "at the risk of reading what is half written")


def _unopenable_link(path: Path, dataset: str, link: h5py.ExternalLink) -> OSError:
    """Why the external link ``dataset`` of ``path`` leads nowhere: its target file missing, being written by
    another process, or without the dataset (looked for where HDF5 looks: ``$HDF5_EXT_PREFIX``, the linking
    file's folder, the working directory). It was "not found; datasets there: none" (a review)."""
    name = Path(os.fsdecode(link.filename))
    prefix = os.environ.get("HDF5_EXT_PREFIX")
    candidates = [name] if name.is_absolute() else \
        ([Path(prefix) / name] if prefix else []) + [path.parent / name, name]
    where = f"{path}:{dataset} is an external link to {link.path} in {link.filename}"
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            target = open_hdf5(candidate)
        except OSError as error:  # BlockingIOError: the target is being written; its message says by whom
            if error.errno is None:
                return OSError(f"{where}: {error}")
            return type(error)(error.errno, f"{where}: {error.strerror}")
        with target:
            return DatasetNotFoundError(f"{where}, which has no dataset {link.path}; datasets there: "
                                        f"{', '.join(list_datasets(target)) or 'none'}")
    return FileNotFoundError(errno.ENOENT, f"{where}, a file not found (looked for "
                                           f"{', '.join(str(c) for c in candidates)})")


def list_datasets(group: h5py.Group) -> List[str]:
    """The datasets below ``group``, by path: each object once by its hard links (as ``visititems``), then those
    reached through a soft or external link by the link's name (``visititems`` follows neither: a file of links
    to another was listed as holding nothing). A link's group is walked through its hard links only (a soft link
    may lead back up: no cycle); a dangling link is left out."""
    names: List[str] = []
    groups: List[str] = [""]

    def visit(name, node):
        if isinstance(node, h5py.Dataset):
            names.append(name)
        elif isinstance(node, h5py.Group):
            groups.append(name)

    group.visititems(visit)
    # the links of each group reached by hard links, read one by one: visititems_links is h5py 3.11's, and 3.8 is
    # supported (there a file of links was listed as holding nothing)
    links: List[str] = []
    for parent in groups:
        holder = group[parent] if parent else group
        links += [f"{parent}/{key}" if parent else key for key in holder
                  if isinstance(holder.get(key, getlink=True), (h5py.SoftLink, h5py.ExternalLink))]
    links.sort(key=lambda name: name.split("/"))  # depth first by name, as HDF5 visits them
    for name in links:
        try:
            node = group[name]
        except (KeyError, OSError):  # dangling: its target is gone
            continue
        if isinstance(node, h5py.Dataset):
            names.append(name)
        elif isinstance(node, h5py.Group) and node.file.filename != group.file.filename:
            node.visititems(lambda inner, item: names.append(f"{name}/{inner}")
                            if isinstance(item, h5py.Dataset) else None)
    return names


def dataset_summary(node: h5py.Dataset) -> str:
    """Shape, dtype, chunks and compression of a dataset as stored (what ``emfast info`` shows)."""
    compression = f" {node.compression}" if node.compression else ""
    return f"shape={node.shape} dtype={node.dtype} chunks={node.chunks}{compression}"


#: What a dataset whose filter is missing needs, for messages.
_NO_FILTER = ("which this HDF5 library does not have: pip install hdf5plugin and import hdf5plugin before opening "
              "it, or rewrite the file without it (h5repack -f NONE)")


def _missing_filter(node: h5py.Dataset, optional: bool = False) -> Optional[str]:
    """The first filter of the dataset's pipeline that this HDF5 library cannot apply (a plugin's, such as blosc,
    bitshuffle or zstd, not loaded) and its chunks need, as "N (its name in the file)"; None if it can read them.
    hdf5plugin registers its filters as optional, which HDF5 skips for a chunk they fail on: such a filter is
    taken as needed where the first chunk stored went through it, or, with ``optional`` (a chunk failed to
    read), always."""
    with HDF5_LOCK:  # low-level calls: h5py takes its lock in them only from 3.16
        pipeline = node.id.get_create_plist()
        for index in range(pipeline.get_nfilters()):
            code, flags, _, name = pipeline.get_filter(index)
            if h5py.h5z.filter_avail(code) or (flags & h5py.h5z.FLAG_OPTIONAL and not optional
                                               and not _applied(node, index)):
                continue
            text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            return f"{code} ({text or 'unnamed'})"
    return None


def _applied(node: h5py.Dataset, index: int) -> bool:
    """Whether the first chunk stored went through the pipeline's filter ``index`` (its filter mask's bit is
    clear); False with no chunk stored."""
    try:
        if node.chunks is None or node.id.get_num_chunks() == 0:
            return False
        return not node.id.get_chunk_info(0).filter_mask & (1 << index)
    except (AttributeError, RuntimeError, ValueError):  # h5py or HDF5 without chunk queries: assume it did
        return True


class Hdf5Source(VolumeSource):
    """One dataset of an HDF5 file; resolution and offset from its ``resolution`` (or ``voxel_size``) and
    ``offset`` attributes, in (z, y, x) order as gunpowder and CREMI write them, with funlib's ``axis_names`` and
    ``units`` (see :mod:`emfast.io._geometry`), and ilastik's ``axistags``; axes stored in another order (an
    ilastik export's (z, y, x, c)) are read box by box through h5py and transposed, except in virtual datasets."""

    def __init__(self, path: Union[str, os.PathLike], dataset: str) -> None:
        if not isinstance(dataset, str):  # h5py's own TypeError named neither
            raise TypeError(f"{path}: dataset must be a string (its path inside the file), got {dataset!r}")
        path = local_path(path, dataset)
        self.name = f"{path}:{dataset}"
        file = open_hdf5(path)
        try:
            node = file.get(dataset)
            if node is None:
                link = file.get(dataset, getlink=True)
                if isinstance(link, h5py.ExternalLink):  # h5py's get() hides why its target cannot be opened
                    raise _unopenable_link(path, dataset, link)
                available = ", ".join(list_datasets(file)) or "none"
                raise DatasetNotFoundError(f"dataset {dataset!r} not found in {path}; datasets there: {available}")
            if not isinstance(node, h5py.Dataset):
                raise ValueError(f"{self.name} is a group, not a dataset; datasets in the file: "
                                 f"{', '.join(list_datasets(file))}")
            missing = _missing_filter(node)
            if missing is not None:  # else every read failed, calling the file "truncated or corrupt"
                raise ValueError(f"{self.name} is compressed with the HDF5 filter {missing}, {_NO_FILTER}")
            self._sources = _virtual_sources(Path(path), node, self.name) if node.is_virtual else []
            self.stamp = Stamp.of(path, dataset, data_files=_data_files(Path(path), node, self._sources))
        except BaseException:
            file.close()
            raise
        self._file, self._dataset = file, node
        # the file holding the dataset: another one where an external link leads there
        self._data_file = node.file
        self._data_path = Path(self._data_file.filename).resolve()
        # a virtual dataset's sources are looked at where a read overlaps them (_check_sources), the other data
        # files (external raw storage) at every change check
        opened = {file: (size, mtime) for file, size, mtime in self.stamp.data_files}
        resolved = [source.file.resolve() for source in self._sources]
        self._source_states = [opened.get(file) for file in resolved]  # None: the file itself, watched as a whole
        self._watched_elsewhere = (self._data_path,) + tuple(resolved)
        stored_shape = tuple(int(s) for s in node.shape)
        check_dimensions(len(stored_shape), self.name)  # the shape's fault, not the attributes'
        where = f"{self.name} (attributes)"
        with parsing(where):  # a byte string no UTF-8 (b"\xb5m") is malformed metadata, named
            attrs = {key: plain_attribute(node.attrs[key]) for key in GEOMETRY_KEYS if key in node.attrs}
            # ilastik's exports are channel-last, their axes named only there (they were read as (c, z, y, x),
            # z taken for channels and channels for x)
            tags = ilastik_axes(node.attrs.get("axistags"))
            geometry = array_geometry(attrs, len(stored_shape), where, dimension_names=tags,
                                      names_key="ilastik axistags")
        if self._sources and not geometry.canonical:  # a virtual dataset's sources are placed in stored order
            raise StoreMetadataError(f"{where}: its axes are in the order it stores them, "
                                     f"({', '.join(geometry.axes)}); a virtual HDF5 dataset is read only with its "
                                     "axes in the order (c, z, y, x): map its sources in that order, or pass the "
                                     "reordered array (ef.Volume.from_array)")
        #: Stored axes in emfast's order (c, z, y, x), as np.transpose takes them; None where stored so.
        self._to_canonical = None if geometry.canonical else \
            tuple(geometry.axes.index(axis) for axis in CANONICAL if axis in geometry.axes)
        self._stored_axes = geometry.axes
        self.full_shape = self._canonical(stored_shape)
        self.channels = self.full_shape[0] if len(self.full_shape) == 4 else 1
        self.dtype = np.dtype(node.dtype)
        self.chunks = self._canonical(node.chunks)[-3:] if node.chunks is not None else None
        self.resolution, self.offset = geometry.resolution, geometry.offset
        self.translation = _binned_translation(node.attrs.get(TRANSLATION_ATTRIBUTE), self.offset)
        # stored in another order: read through h5py, box by box, and transposed
        self._direct = _DirectChunkReader.for_dataset(node) if self._to_canonical is None else None
        # HDF5 reads a whole dataset without filters faster itself; deflate goes faster through libdeflate
        self.whole_by_chunks = self._direct is not None and self._direct.inflates
        # a box's chunks decompressed side by side where that pays, as measured for this filter and chunk size
        self._decodes = SideBySide.of("hdf5", str(node.compression), self.chunks, str(node.dtype))
        # the file is parked (closed, to be opened again) while other lazily read HDF5 files are used, see
        # _hdf5files; reopened, it must be the one opened now
        self._path = Path(path).absolute()
        status = self._data_status()
        self._identity = None if status is None else open_identity(status)
        self._opened = None if status is None else self._identity[2:]  # (size, modification time) when opened
        self._users, self._parkable, self._user_closed = 0, status is not None, False
        self._reopen_lock = threading.Lock()
        OPEN_FILES.add(self)

    def _canonical(self, stored: Sequence[int]) -> Tuple[int, ...]:
        """A shape (or chunk shape) in stored order, in emfast's order (c, z, y, x)."""
        stored = tuple(int(n) for n in stored)
        return stored if self._to_canonical is None else tuple(stored[i] for i in self._to_canonical)

    @property
    def stored_axes(self) -> Optional[Tuple[str, ...]]:
        """The stored axes' roles in stored order where they are not in emfast's order (read transposed), else
        None."""
        return None if self._to_canonical is None else tuple(self._stored_axes)

    def _stored(self, at: dict) -> tuple:
        """One value per stored axis, in stored order, from ``at`` ({axis role: value}; a time axis is read as
        channels are)."""
        return tuple(at["c" if axis == "t" else axis] for axis in self._stored_axes)

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        with self._held():
            self._read(corner, extent, out)

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """The file open meanwhile (see :meth:`_open_again`), the volume closed meanwhile named as such."""
        OPEN_FILES.use(self)  # refuses a closed volume: h5py would say "identifier is not of specified type"
        try:
            yield
        except Exception:
            if self._user_closed:  # closed by another thread during the read
                raise self._closed() from None
            raise
        finally:
            OPEN_FILES.done(self)

    def _open_again(self) -> None:
        """Open the file again if it was parked (:mod:`emfast.io._hdf5files`), refusing one that is not the file
        opened first; refuse a closed volume."""
        if self._file is not None and not self._user_closed:
            return
        with self._reopen_lock:
            if self._user_closed:
                raise self._closed()
            if self._file is not None:
                return
            try:
                file = open_hdf5(self._path)
            except FileNotFoundError as error:
                raise FileNotFoundError(f"{self.name}: the file is gone since the volume was opened (removed or "
                                        f"renamed); emfast had closed it to hold at most {most_open()} lazily read "
                                        "HDF5 files open, and cannot open it again") from error
            except OSError as error:  # truncated, or another kind of file there now: the file changed
                now = self._status_of(None)
                if now is not None and open_identity(now) == self._identity:
                    raise  # the same file, not opened for another reason (the descriptor limit)
                raise self._changed_while_parked() from error
            node, data_file = file.get(self.stamp.dataset), file
            try:
                if isinstance(node, h5py.Dataset):
                    data_file = node.file
                status = self._status_of(data_file)
                if not isinstance(node, h5py.Dataset) or status is None or open_identity(status) != self._identity:
                    raise self._changed_while_parked()
            except BaseException:
                close_files([file, data_file])
                raise
            self._dataset, self._data_file, self._file = node, data_file, file  # the file last: the fast path's test

    def _changed_while_parked(self) -> CorruptChunkError:
        return CorruptChunkError(f"{self.name}: its file changed since the volume was opened (replaced, truncated or "
                                 "written to while emfast had closed it to hold fewer HDF5 files open): open it again")

    def _park(self) -> list:
        """Hand over the open files (to be closed) and forget them, until :meth:`_open_again`."""
        files = [self._file] if self._data_file is self._file else [self._file, self._data_file]
        self._file = self._dataset = self._data_file = None
        return files

    def _closed(self) -> ValueError:
        return ValueError(f"{self.name}: the volume was closed; open it again to read it")

    def _read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        corner, extent = tuple(int(c) for c in corner), tuple(int(e) for e in extent)
        one_chunk = self.chunks is not None and all(
            c % k == 0 and e == min(k, s - c) for c, e, k, s in zip(corner, extent, self.chunks, self.full_shape[-3:]))
        if one_chunk or self.chunks is None:
            self._check_stored(corner)
        self._check_sources(corner, extent)
        if one_chunk and self._direct is not None and self._direct.read(self._dataset, corner, out, self.name):
            return
        box = tuple(slice(c, c + e) for c, e in zip(corner, extent))
        try:
            if self._to_canonical is not None:
                stored = self._dataset[self._stored(dict(zip("zyx", box), c=slice(None)))]
                np.copyto(out, np.transpose(stored, self._to_canonical).reshape(out.shape))
            elif self._dataset.ndim == 4:
                self._dataset.read_direct(out, source_sel=(slice(None),) + box)
            else:
                self._dataset.read_direct(out[0], source_sel=box)
        except OSError as error:  # h5py names neither file nor dataset (e.g. a corrupt compressed chunk)
            missing = _missing_filter(self._dataset, optional=True)
            if missing is not None:  # an optional one the first chunk went without (a review): not corruption
                raise ValueError(f"{self.name}: a chunk in the box at {corner} of {extent} is compressed with the "
                                 f"HDF5 filter {missing}, {_NO_FILTER}") from error
            raise OSError(f"{self.name}: cannot read the dataset ({error}); the file may be truncated or "
                          "corrupt") from error

    @property
    def read_many(self):
        """A function filling several boxes at once (a list of (corner, extent, out), as :meth:`read` takes them)
        where chunks are read directly: the chunk cache's missing blocks of a box, in parts side by side where
        that pays (HDF5 holds its lock while it reads a chunk's compressed bytes; zlib decompresses without the
        GIL). None otherwise."""
        return None if self._direct is None else self._read_many

    def _read_many(self, requests) -> None:
        with self._held():  # for the parts too: they end before run returns
            self._decodes.run(requests, self._read_part)

    def _read_part(self, requests) -> None:
        """Read ``requests`` one after another: each chunk's bytes fetched under HDF5's lock, then decompressed
        while another thread may fetch, so that no more than one chunk's compressed bytes wait per thread."""
        for corner, extent, out in requests:
            self._read(corner, extent, out)

    def attributes(self) -> dict:
        with self._held():
            return dict(self._dataset.attrs)

    def describe(self) -> str:
        with self._held():
            return dataset_summary(self._dataset)

    def reopen_arguments(self) -> tuple:
        return str(Path(self.stamp.path).absolute()), self.stamp.dataset

    def close(self) -> None:
        self._user_closed = True
        OPEN_FILES.forget(self)
        with self._reopen_lock:
            if self._file is not None:
                close_files([self._file, self._data_file])

    def _check_sources(self, corner: Tuple[int, ...], extent: Tuple[int, ...]) -> None:
        """Refuse a box of a virtual dataset that maps onto a source file removed since the volume was opened
        (HDF5 would read its part as the fill value, silently), or rewritten since (its part may be another array
        now). One stat per source the box overlaps."""
        for source, opened in zip(self._sources, self._source_states):
            if not source.overlaps(corner, extent):
                continue
            try:
                status = os.stat(source.file)
                gone = not stat.S_ISREG(status.st_mode)
            except OSError:
                gone = True
            if gone:
                raise FileNotFoundError(f"{self.name}: the virtual dataset's source file {source.file} (dataset "
                                        f"{source.dataset!r}) for the box at (z, y, x) = {corner} is gone; HDF5 "
                                        "would read that part as fill values")
            if opened is not None and (status.st_size, status.st_mtime_ns) != opened:
                raise CorruptChunkError(f"{self.name}: its files changed since it was opened (the virtual dataset's "
                                        f"source file {source.file} for the box at (z, y, x) = {corner} was "
                                        "rewritten): its part may hold another array now; open it again")

    def _data_status(self) -> Optional[os.stat_result]:
        """The status now of the file holding the dataset (the one an external link leads to, if any): through
        its open descriptor, right even if the path was removed or replaced; of its path where it is parked or read
        by another HDF5 driver; None where it cannot be told (a removed path, a file parked meanwhile)."""
        return self._status_of(self._data_file)

    def _status_of(self, file: Optional[h5py.File]) -> Optional[os.stat_result]:
        """As :meth:`_data_status`, of ``file`` (None: parked)."""
        try:
            if file is None:
                return os.stat(self._data_path)
            if file.driver == "sec2":
                with HDF5_LOCK:
                    handle = file.id.get_vfd_handle()
                return os.fstat(handle)
            return os.stat(file.filename)
        except (OSError, ValueError):
            return None

    def _file_size(self) -> Optional[int]:
        status = self._data_status()
        return None if status is None else status.st_size

    def changed_since_opened(self) -> bool:
        """Whether the open file was written since it was opened (``cp new.h5 v.h5`` rewrites it in place: the
        chunks' offsets then point into other bytes), or another file holding the data (a virtual dataset's source,
        external raw storage) was. The open file is told through its descriptor, so a file removed or renamed
        away, whose data the descriptor keeps, has not changed; a parked one through its path (another file there
        has changed; none there is said by the next read)."""
        OPEN_FILES.hold(self)  # not parked meanwhile: its descriptor could be another file's by the fstat
        try:
            now = self._data_status()
        finally:
            OPEN_FILES.done(self)
        if now is not None and self._identity is not None and open_identity(now) != self._identity:
            return True
        return bool(self.stamp.data_files) and not self.stamp.data_files_unchanged(skip=self._watched_elsewhere)

    def _check_stored(self, origin: Sequence[int]) -> None:
        """Refuse a chunk whose bytes lie past the end of the file: HDF5 reads them as zeros, silently, when the
        file was truncated after it was opened. Only a file smaller than when it was opened is looked into."""
        size = self._file_size()
        if size is None or self._opened is None or size >= self._opened[0]:
            return
        dataset, where = self._dataset, tuple(int(o) for o in origin)
        if dataset.chunks is None:
            with HDF5_LOCK:
                spans = [(dataset.id.get_offset(), dataset.id.get_storage_size())]
        else:
            channel_chunk = self._canonical(dataset.chunks)[0] if dataset.ndim == 4 else self.channels
            spans = []
            for c0 in range(0, self.channels, channel_chunk):
                coord = self._stored(dict(zip("zyx", where), c=c0))
                try:
                    with HDF5_LOCK:
                        info = dataset.id.get_chunk_info_by_coord(coord)
                except (RuntimeError, OSError) as error:  # the chunk index itself is damaged or gone
                    raise OSError(f"{self.name}: cannot locate the block at {where} "
                                  f"({error}); the file ({size} bytes now) is truncated or corrupt") from error
                spans.append((info.byte_offset, info.size))
        for offset, length in spans:
            if offset is not None and offset + length > size:
                raise OSError(f"{self.name}: the block at {where} is stored at bytes "
                              f"{offset}-{offset + length} but the file now has {size} bytes: it was truncated "
                              "or is being rewritten")


class _VirtualSource(NamedTuple):
    """Where one source of an HDF5 virtual dataset lies: its file, dataset, and the (z, y, x) voxels it fills."""

    file: Path
    dataset: str
    first: Tuple[int, ...]
    last: Tuple[int, ...]

    def overlaps(self, corner: Tuple[int, ...], extent: Tuple[int, ...]) -> bool:
        return all(f <= c + e - 1 and c <= l for f, l, c, e in zip(self.first, self.last, corner, extent))


def _virtual_sources(path: Path, dataset: h5py.Dataset, name: str) -> List[_VirtualSource]:
    """The sources of a virtual dataset, each checked to exist and hold its dataset: HDF5 reads a missing source
    as the fill value, silently. A relative source file name is looked up as HDF5 does: under
    ``$HDF5_VDS_PREFIX``, beside the virtual dataset's file, then from the working directory.

    Raises
    ------
    FileNotFoundError
        A source file is missing (or not a regular file), naming it and the virtual dataset.
    DatasetNotFoundError
        A source file lacks the dataset the mapping names.
    """
    sources = []
    for mapping in dataset.virtual_sources():
        file = path if mapping.file_name == "." else _source_file(path, mapping.file_name)
        if file is None:
            raise FileNotFoundError(f"{name}: the virtual dataset's source file {mapping.file_name!r} (dataset "
                                    f"{mapping.dset_name!r}) does not exist beside {path} or as given; HDF5 would "
                                    "read its part as fill values")
        with open_hdf5(file) as source:
            node = source.get(mapping.dset_name)
            if not isinstance(node, h5py.Dataset):
                raise DatasetNotFoundError(f"{name}: the virtual dataset's source file {file} has no dataset "
                                           f"{mapping.dset_name!r}; HDF5 would read its part as fill values")
            missing = _missing_filter(node)
            if missing is not None:
                raise ValueError(f"{name}: the virtual dataset's source {file}:{mapping.dset_name} is compressed "
                                 f"with the HDF5 filter {missing}, {_NO_FILTER}")
        first, last = mapping.vspace.get_select_bounds()
        sources.append(_VirtualSource(file, mapping.dset_name, tuple(first[-3:]), tuple(last[-3:])))
    return sources


def _data_files(path: Path, dataset: h5py.Dataset, sources: Sequence[_VirtualSource]) -> List[Path]:
    """The files besides ``path`` that hold the dataset's bytes: the file an external link leads to, a virtual
    dataset's sources, and external raw storage, where HDF5 looks for it: under ``$HDF5_EXTFILE_PREFIX``
    (``${ORIGIN}`` is the file's folder), else from the working directory."""
    files = [Path(dataset.file.filename)] + [source.file for source in sources]
    prefix = os.environ.get("HDF5_EXTFILE_PREFIX")
    for name, _, _ in dataset.external or ():
        name = Path(os.fsdecode(name))
        if prefix and not name.is_absolute():
            name = Path(prefix.replace("${ORIGIN}", str(path.resolve().parent))) / name
        if name.is_file():
            files.append(name)
    return files


def _source_file(vds: Path, file_name: str) -> Optional[Path]:
    """The existing regular file a virtual dataset's source ``file_name`` refers to, or None."""
    given = Path(file_name)
    prefix = os.environ.get("HDF5_VDS_PREFIX")
    candidates = [given] if given.is_absolute() else (
        ([Path(prefix) / given] if prefix else []) + [vds.parent / given, given])
    for candidate in candidates:
        require_kind(candidate, "file", "a virtual dataset's source")
        if candidate.is_file():
            return candidate
    return None


def _unshuffled(data: bytes, itemsize: int) -> bytes:
    """HDF5's shuffle undone: byte k of each of the ``len // itemsize`` elements was stored together; the bytes
    left over (shuffled after deflate, the compressed stream seldom divides) are as they were."""
    whole = len(data) // itemsize * itemsize
    shuffled = np.frombuffer(data, np.uint8, count=whole).reshape(itemsize, -1).T.tobytes()
    return shuffled if whole == len(data) else shuffled + bytes(data[whole:])


class _DirectChunkReader:
    """Reads a block chunk by chunk with ``read_direct_chunk`` and decodes shuffle + deflate itself."""

    def __init__(self, chunks: Tuple[int, ...], file_dtype: np.dtype, filters: Sequence[int]) -> None:
        self._chunks = chunks
        self._file_dtype = file_dtype
        self._decode = tuple(reversed(filters))  # filters run in pipeline order on write, reversed on read
        #: Whether the deflate filter is among them.
        self.inflates = h5py.h5z.FILTER_DEFLATE in filters

    @classmethod
    def for_dataset(cls, dataset: h5py.Dataset) -> Optional["_DirectChunkReader"]:
        """A reader if ``dataset`` is chunked with only shuffle/deflate filters and a plain numeric type."""
        if dataset.chunks is None or dataset.dtype.kind not in "uif":
            return None
        plist = dataset.id.get_create_plist()
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        if not set(filters) <= _DIRECT_FILTERS:
            return None
        return cls(tuple(int(c) for c in dataset.chunks), np.dtype(dataset.dtype), filters)

    def read(self, dataset: h5py.Dataset, origin: Sequence[int], block: np.ndarray, name: str) -> bool:
        """Fill ``block`` (c, z, y, x) whose first voxel is at ``origin`` (z, y, x); False if a chunk has no
        storage or skipped a filter, in which case the caller reads the block through HDF5."""
        channel_chunk = self._chunks[0] if dataset.ndim == 4 else 1
        channels = block.shape[0]
        for c0 in range(0, channels, channel_chunk):
            offset = ((c0,) if dataset.ndim == 4 else ()) + tuple(origin)
            try:
                with HDF5_LOCK:
                    filter_mask, raw = dataset.id.read_direct_chunk(offset)
            except (RuntimeError, OSError):  # never written (OSError once HDF5 read it itself): the fill value
                return False
            except MemoryError:  # what HDF5 2.0 raises for a dataset of which no chunk was ever written
                with HDF5_LOCK:
                    if dataset.id.get_storage_size() == 0:
                        return False
                raise
            if filter_mask:
                return False
            chunk = self._decoded(raw, offset, name).reshape((-1,) + self._chunks[-3:])
            c1 = min(c0 + channel_chunk, channels)
            z, y, x = block.shape[1:]
            block[c0:c1] = chunk[:c1 - c0, :z, :y, :x]
        return True

    def _decoded(self, raw: bytes, offset: Tuple[int, ...], name: str) -> np.ndarray:
        itemsize = self._file_dtype.itemsize
        expected = int(np.prod(self._chunks)) * itemsize
        data = raw
        for code in self._decode:
            if code == h5py.h5z.FILTER_DEFLATE:
                try:
                    data = _deflate.inflated(data, expected)
                except zlib.error as exc:
                    raise CorruptChunkError(f"{name}: cannot decompress the chunk at {offset}: {exc}") from exc
            elif itemsize > 1:  # shuffle: byte k of every element stored together; a no-op for 1-byte types
                data = _unshuffled(data, itemsize)
        return checked_chunk(data, self._file_dtype, self._chunks, f"{name}: the chunk at {offset}")


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

    Notes
    -----
    A lazily read volume holds its file open, read-only. Of many such volumes (a training set of cutouts), the
    process keeps at most a quarter of its descriptor limit's files open (16 to 256): the others are closed and
    opened again at their next read, which refuses a file no longer the one first opened (replaced or rewritten:
    :class:`~emfast.io.CorruptChunkError`) or gone (FileNotFoundError). A file kept open reads on through its
    descriptor even if its path is removed or reused meanwhile. A reopening costs about 0.15 ms: reading many
    files at random, raise the descriptor limit (``ulimit -n``) so that more stay open
    (``benchmarks/lazy_hdf5_many.py``).

    Raises
    ------
    FileNotFoundError, IsADirectoryError, OSError
        The path is missing, is a directory or another non-regular file (a FIFO is refused, never opened), or
        is not an HDF5 file; a virtual dataset's source file is missing.
    DatasetNotFoundError
        No dataset of that name (the message lists the datasets the file has), or a virtual dataset's source
        file lacks its dataset.
    StoreMetadataError
        A ``resolution``, ``voxel_size`` or ``offset`` attribute that is not 3 finite numbers.
    TypeError, ValueError
        Unsupported dtype, or not 3-D/4-D; a ``cache_bytes`` that is not a positive integer, is smaller than
        one cache block, or is given with ``in_memory=True``.
    """
    source = Hdf5Source(path, dataset)
    warn_if_unfinished(source, f"{path}/{dataset}")
    return Volume.open(source, in_memory=in_memory, cache_bytes=cache_bytes)


#: The attribute emfast writes beside ``offset`` on an HDF5 output of a binned OME-NGFF level: the translation the
#: image gave it (:attr:`~emfast.io.Volume.translation`), which HDF5 has no convention for, read back as such so that
#: a zarr output made from it later is placed as the level was.
TRANSLATION_ATTRIBUTE = "translation"


def _binned_translation(value, offset) -> Optional[Tuple[float, float, float]]:
    """The translation ``value`` (an attribute) states for a binned level: 3 finite numbers other than ``offset``;
    None for anything else (an attribute of that name another program wrote for its own use is left alone)."""
    try:
        translation = tuple(float(t) for t in np.asarray(plain_attribute(value), dtype=np.float64).reshape(-1))
    except (TypeError, ValueError):
        return None
    if len(translation) != 3 or not all(np.isfinite(translation)) or offset is None \
            or np.allclose(translation, offset, rtol=0, atol=1e-9):
        return None
    return translation


def plain_attribute(value):
    """An HDF5 attribute as JSON would hold it: arrays as lists, compound values as mappings of their fields (they
    were lists, their field names lost), byte strings as UTF-8 text (UnicodeDecodeError where they are none)."""
    if isinstance(value, (np.ndarray, np.void)) and value.dtype.names is not None:
        if isinstance(value, np.void):
            return {name: plain_attribute(value[name]) for name in value.dtype.names}
        return [plain_attribute(element) for element in value] if value.ndim else plain_attribute(value[()])
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, np.generic):  # NumPy scalars (np.bytes_ too) as Python's
        value = value.item()
    if isinstance(value, list):
        return [plain_attribute(v) for v in value]
    return value.decode() if isinstance(value, bytes) else value
