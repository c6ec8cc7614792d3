"""zarr arrays (v2 and v3, sharded v3 included) and OME-NGFF multiscale images as volume sources, through
zarr-python 3 (the optional extra ``emfast[zarr]``), opened read-only.

The chunk cache reads one chunk at a time. For the common layout (no sharding, no filters, C order,
at most one compressor among zstd, blosc, gzip/zlib, lz4) emfast reads the chunk's file and decodes it in the
calling thread with numcodecs or zlib, which release the GIL, so the chunk cache decodes a box's missing chunks
in parallel (:mod:`emfast.io._decode`); this is about twice as fast as a call into zarr-python per chunk, whose
event loop serialises much of the work. Sharded v3 arrays of the same inner layout in a local store read each inner
chunk straight from its shard file through the shard's index, read once (:mod:`emfast.io._shards`; about ten times
faster than zarr-python per inner chunk). A whole chunk is decoded straight into its cache block (zstd and blosc,
whose frames state their decoded size; gzip by libdeflate) or read into it (no compressor); a box's whole zstd
chunks are decoded in one compiled call by the system's libzstd where there is one (:mod:`emfast.io._zstd`; 19
against 24 ms for 256 chunks of 64 KiB through numcodecs), its blosc chunks by c-blosc's own decoder
(:mod:`emfast.io._blosc`), its gzip and zlib chunks by the system's libdeflate (:mod:`emfast.io._deflate`). Any
other layout (a remote sharded array included) is read through zarr-python. Per codec, emfast decodes with
numcodecs (zstd, blosc, lz4) or zlib (gzip) itself rather than through tensorstore: one chunk read alone costs
about what tensorstore's read of it costs (``benchmarks/lazy_cold.py``), and a tensorstore route would add a copy
into the block and a dependency. A remote
store (:mod:`emfast.io._remote`) is read the same way, its chunks' bytes coming over the network (to zarr-python
through a retrying FsspecStore); its chunks are decoded one after another on the reading thread, their requests
announced together beforehand (``will_read``). A chunk that was never written reads as the array's fill value, as
the zarr specification says; a chunk that cannot be decoded, or decodes to another size than the metadata promises,
is a :class:`~emfast.io._source.CorruptChunkError` naming the store and the chunk.

An array is opened by its own metadata, so an array with no group metadata above it (tensorstore's and
funlib.persistence's normal layout) opens too. Its geometry comes from :mod:`emfast.io._geometry`: an array whose
axes are named in another order (funlib ``axis_names``, zarr v3 ``dimension_names``, e.g. (x, y, z)) is read
through an axis permutation applied to each box read, never copied.

An array's metadata (``.zarray`` or ``zarr.json``) is checked here before zarr-python parses it, so malformed
metadata is a :class:`~emfast.io._source.StoreMetadataError` naming the key and the value; what zarr-python
still refuses is reported as the same error, naming the metadata file.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import threading
import time
import zlib
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from .._core.files import CHUNK_AGAIN, CHUNK_MISSING
from ._geometry import (ONE_SECTION, Geometry, Level, array_geometry, binned_corner, choose_level, multiscale_levels,
                        require_agreement, xarray_axes)
from ._decode import SideBySide, blosc_content_size, checked_blosc, zstd_content_size
from ._filebatch import (BATCH_BYTES, compiled_codec, lent_buffer, read_decoded_files, read_regular_files,
                         whole_and_rest)
from ._metadata import bad_metadata, int_list, metadata_key, parsing
from ._remote import RemoteReadError, RemoteStore, ReadAbandoned, zarr_read
from ._shards import ShardedChunks
from ._source import (CorruptChunkError, DatasetNotFoundError, LevelChoiceError, Stamp, StoreMetadataError,
                      VolumeSource, add_transfer_time, decoded_into, fill_value, read_regular_file,
                      read_regular_file_into, require_kind, unlistable)
from . import _blosc, _deflate, _zstd

#: Metadata files that mark a zarr array or group (v3, then v2).
ARRAY_MARKERS = ("zarr.json", ".zarray")
GROUP_MARKERS = ("zarr.json", ".zgroup")
#: Every metadata file a zarr node may have.
METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
#: Most chunks of a box that failed read one by one to name the culprit (bounds the time an error takes).
_CHUNKS_TRIED_ALONE = 4096


def zarr_missing(use: str = "reading") -> Optional[str]:
    """Why zarr stores cannot be used here (``use``: "reading" or "writing"), or None if they can."""
    try:
        import zarr
    except ImportError as error:
        return f"{use} zarr needs zarr-python 3 ({error}); install it with pip install 'emfast[zarr]'"
    if int(zarr.__version__.split(".")[0]) < 3:
        return f"{use} zarr needs zarr-python 3, this is {zarr.__version__}; pip install 'emfast[zarr]'"
    return None


def import_zarr(use: str = "reading"):
    """zarr-python 3, or an ImportError saying what it is needed for and how to install it."""
    reason = zarr_missing(use)
    if reason is not None:
        raise ImportError(reason)
    import zarr
    return zarr


def local_store(path, writable: bool = False):
    """zarr-python's store of the local folder ``path``: a store object, not the path's text, which zarr 3.2 on
    reads as a URL (a store in a folder named 'h#sh' was looked for in 'h')."""
    return import_zarr("writing" if writable else "reading").storage.LocalStore(str(path), read_only=not writable)


#: Most seconds a :func:`settling_store` waits for its writes in flight.
SETTLE_S = 10.0


def settling_store(path):
    """A writable zarr-python store of the local folder ``path`` whose ``settle()`` waits (at most
    :data:`SETTLE_S`) for its writes in flight. Where one write of a group (an ``asyncio.gather``) fails, zarr
    raises at once and the others run on: files they write landed after the caller had removed what failed (a
    snapshot's store, deleted after a full disk, reappeared in part: a CI run under load). Only this store's
    writes are waited for: a wait for every task on zarr's loop also waited for other volumes' remote reads."""
    return _settling_store_class()(str(path))


@functools.lru_cache(maxsize=None)
def _settling_store_class():
    zarr = import_zarr("writing")

    class SettlingStore(zarr.storage.LocalStore):
        def __init__(self, root, read_only: bool = False) -> None:
            super().__init__(root, read_only=read_only)
            self._writing = 0
            self._settled = threading.Condition()  # notified as the count of writes in flight falls to 0

        # not async: a write is counted when zarr asks for it, before its task first runs (a sibling not yet
        # started when the first write failed would pass for none)
        def set(self, key, value):
            return self._counted(super().set(key, value))

        def set_if_not_exists(self, key, value):
            return self._counted(super().set_if_not_exists(key, value))

        def _counted(self, write):
            with self._settled:
                self._writing += 1

            async def counted():
                try:
                    return await write
                finally:
                    with self._settled:
                        self._writing -= 1
                        if not self._writing:
                            self._settled.notify_all()

            return counted()

        def settle(self) -> None:
            with self._settled:
                self._settled.wait_for(lambda: not self._writing, SETTLE_S)

    return SettlingStore


class ZarrSource(VolumeSource):
    """An array of a zarr store, or a level of an OME-NGFF multiscale image.

    Parameters
    ----------
    path : str, path-like or RemoteStore
        The store (a directory ending in ``.zarr`` by convention), or a remote one (see :mod:`emfast.io._remote`).
    dataset : str
        The array inside it, or a group holding an OME-NGFF multiscale image ("" for the store's root).
    level, resolution
        For a multiscale image: the level by index, or by its (z, y, x) voxel size (default: level 0).
    """

    def __init__(self, path: Union[str, os.PathLike, RemoteStore], dataset: str = "", level: Optional[int] = None,
                 resolution: Optional[Sequence[float]] = None) -> None:
        zarr = import_zarr()
        remote = isinstance(path, RemoteStore)
        path = path if remote else Path(path)
        dataset = dataset.strip("/")
        self._given = dataset
        self._image_level: Optional[tuple] = None  # (index, levels, array path) where a multiscale image was named
        self._own_geometry = False  # placed by its own attributes, not by an OME-NGFF image's
        self.name = f"{path}:{dataset}" if dataset else str(path)
        if not remote:
            require_kind(path, "directory", "a zarr store")
            if not path.is_dir():
                raise FileNotFoundError(f"zarr store not found: {path}")
            refuse_special_metadata(path, dataset)
        check_array_metadata(path / dataset, self.name, ranks=(3, 4, 5))  # 5-D: a time axis, named
        node = _open_node(zarr, path, dataset, self.name)
        if isinstance(node, zarr.Group):
            with parsing(f"{self.name} (OME-NGFF multiscales)"):
                levels = _placed_levels(node, multiscale_levels(dict(node.attrs), self.name), self.name)
            if levels is None:
                listed = "not listed remotely" if remote else ", ".join(arrays_on_disk(path, dataset)) or "none"
                raise DatasetNotFoundError(f"{self.name} is a group, not an array; arrays there: {listed}")
            chosen = levels[choose_level([candidate.resolution for candidate in levels], level, resolution, self.name)]
            level_path = (Path(dataset) / chosen.path).as_posix() if dataset else chosen.path
            if not remote:
                refuse_special_metadata(path, level_path)
            check_array_metadata(path / level_path, f"{path}:{level_path}", ranks=(3, 4, 5))
            try:
                array = node[chosen.path]
            except KeyError:
                raise ValueError(f"{self.name}: the OME-NGFF multiscale names level {chosen.path!r}, which the "
                                 "store does not have") from None
            except Exception as error:
                raise refused_metadata(f"{path}:{level_path}", path / level_path, error) from error
            dataset = f"{dataset}/{chosen.path}" if dataset else chosen.path
            self.name = f"{path}:{dataset}"
            self._take_level(array, chosen)
            self._image_level = (list(levels).index(chosen), len(levels), chosen.path)
        else:
            if level is not None or resolution is not None:
                raise LevelChoiceError(f"{self.name} is an array, not a multiscale image: level and resolution do "
                                       "not apply")
            array = node
            # a level of an image opened by its own path is placed as the image places it
            chosen = _level_above(zarr, path, dataset)
            self._own_geometry = chosen is None
            if chosen is not None:
                self._take_level(array, chosen)
            else:
                geometry = _geometry_of(array, self.name)
                self._axes = geometry.axes
                self.resolution, self.offset = geometry.resolution, geometry.offset
        self._array = array
        in_order = "t" not in self._axes and Geometry(self._axes, None, None).canonical  # what _DirectChunks reads
        self._direct = _DirectChunks.for_array(array, path / dataset) if in_order else None
        if self._direct is None and in_order and not remote:  # remote shards: zarr-python with the retrying store
            self._direct = ShardedChunks.for_array(array, path / dataset, _decoder, _decoder_into)
        # emfast's own decoders release the GIL; zarr-python's event loop serialises the work of several threads.
        # A remote array's reads wait on the network, their requests already announced together (will_read).
        self.parallel_reads = self._direct is not None and bool(array.compressors) and not remote
        # a 4-D array whose channels are split over chunks reads a block's chunks through zarr-python
        self.whole_by_chunks = self._direct is not None and not remote and (
            len(array.shape) == 3 or int(array.chunks[0]) == int(array.shape[0]))
        self._path, self._dataset = path, dataset
        self._opened_in = os.getpid()  # the process whose event loop self._array's connections live on
        self._level, self._resolution = level, resolution
        self.dtype = np.dtype(array.dtype)
        self._take, shape, chunks = self._layout(array)
        self.full_shape = shape
        self.chunks = chunks
        if remote:
            self.stamp = path.stamp(dataset, next(f"{dataset}/{m}".lstrip("/") for m in ARRAY_MARKERS
                                                  if _read_metadata(path / dataset, m) is not None))
        else:
            marker = next((path / dataset / m for m in ARRAY_MARKERS if (path / dataset / m).is_file()), path)
            # an OME-NGFF level's voxel size and offset are its image's, outside its folder (given for every
            # array: a level of a pyramid being written is placed by its own attributes until the image lists it)
            self.stamp = Stamp.of(path, dataset, marker, placement=f"{self.resolution} {self.offset}")

    def _take_level(self, array, chosen: Level) -> None:
        """Axes, voxel size and offset of ``array``, the level ``chosen`` of an OME-NGFF image, checked against the
        array's own attributes."""
        if len(chosen.axes) != array.ndim:
            raise ValueError(f"{self.name}: {array.ndim}-D array but {len(chosen.axes)} axes {list(chosen.axes)} in "
                             "the multiscale metadata")
        geometry = _geometry_of(array, self.name, chosen.axes)
        require_agreement(f"{self.name} (attributes)", "its voxel_size", geometry.resolution,
                          "the OME-NGFF scale", chosen.resolution)
        if geometry.offset is None or not np.allclose(geometry.offset, chosen.translation, rtol=0, atol=1e-6):
            # funlib's offset is the corner (emfast's earlier pyramids wrote a binned level's centre there too)
            require_agreement(f"{self.name} (attributes)", "its offset", geometry.offset,
                              "the OME-NGFF translation (its first voxel's corner)", chosen.offset)
        self._axes = chosen.axes
        self.resolution, self.offset = chosen.resolution, chosen.offset
        if not np.allclose(chosen.translation, chosen.offset, rtol=0, atol=1e-6):
            self.translation = chosen.translation

    def _layout(self, array):
        """How to read (c, z, y, x) from the stored axes: index 0 of t, every axis moved to emfast's order."""
        axes = self._axes
        if "t" in axes and array.shape[axes.index("t")] != 1:
            raise ValueError(f"{self.name}: a time series of {array.shape[axes.index('t')]} points; emfast reads "
                             "one 3-D volume (export a single time point)")
        shape = tuple(int(array.shape[axes.index(a)]) for a in ("c", "z", "y", "x") if a in axes)
        chunks = tuple(int(array.chunks[axes.index(a)]) for a in ("z", "y", "x"))
        kept = [a for a in axes if a != "t"]
        self._to_canonical = tuple(kept.index(a) for a in ("c", "z", "y", "x") if a in kept)
        return axes, shape, chunks

    def _selection(self, corner, extent) -> tuple:
        """The stored array's index of the (z, y, x) box, every channel, time point 0."""
        box = {a: slice(int(c), int(c) + int(e)) for a, c, e in zip("zyx", corner, extent)}
        return tuple(0 if a == "t" else box.get(a, slice(None)) for a in self._take)

    @property
    def read_many(self):
        """A function filling several boxes at once (a list of (corner, extent, out), as :meth:`read` takes them)
        where emfast reads this array's chunk files itself: the chunk cache's missing blocks of a box, read in one
        call and decoded side by side. None where another library reads the chunks, or they are remote."""
        if self._direct is None or isinstance(self._path, RemoteStore):
            return None
        return self._read_many

    def _read_many(self, requests) -> None:
        for corner, extent, out in self._direct.read_many(requests, self.name, self.stamp):
            self.read(corner, extent, out)

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        if self._direct is not None and self._direct.read(corner, extent, out, self.name, self.stamp):
            return
        # zarr-python returns a box as a new array, copied into out: a large box (a conversion's tile, a volume
        # loaded whole) read in slabs of whole chunk rows along z takes one slab more, not twice the box
        rows = int(self.chunks[0])
        plane = max(1, out[:, :1].nbytes)
        step = rows * max(1, READ_SLAB_BYTES // (plane * rows))
        z, end = int(corner[0]), int(corner[0]) + int(extent[0])
        while z < end:
            stop = min(end, (z // rows) * rows + step)  # a slab's end on a chunk row's
            first, last = z - int(corner[0]), stop - int(corner[0])
            self._read_through_zarr((z,) + tuple(corner[1:]), (stop - z,) + tuple(extent[1:]), out[:, first:last])
            z = stop

    def _read_through_zarr(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        start = time.perf_counter()
        try:
            data = self._stored(self._selection(corner, extent))
        except (RemoteReadError, ReadAbandoned):
            raise
        except Exception as error:
            raise self._unreadable(corner, extent, error) from error
        finally:  # zarr-python fetches and decodes in one call: counted as the transfer it mostly is remotely
            add_transfer_time(time.perf_counter() - start)
        data = np.transpose(data, self._to_canonical)  # a view: stored (x, y, z) reads as (z, y, x)
        np.copyto(out, data if "c" in self._take else data[np.newaxis])

    def _stored(self, selection):
        """The stored array's values at ``selection``, through zarr-python. A remote array's read is abandoned when
        the reading thread's loader closes; in a forked child (a torch DataLoader worker) the array is opened
        again, since its connections belong to the parent's event loop."""
        if not isinstance(self._path, RemoteStore):
            return self._array[selection]
        if self._opened_in != os.getpid():
            self._array = _open_node(import_zarr(), self._path, self._dataset, self.name)
            self._opened_in = os.getpid()
        return zarr_read(self._array.async_array.getitem(selection))

    def _unreadable(self, corner, extent, error: Exception) -> CorruptChunkError:
        """The error for a box zarr-python could not read, naming the first chunk that fails alone (zarr-python
        names none), or the range of chunks if each reads alone."""
        why = ("the store's metadata changed since it was opened (it was replaced or rewritten): open it again"
               if not self.stamp.unchanged() else "the store is corrupt or being written")
        ranges = [range(int(c) // k, (int(c) + int(e) - 1) // k + 1) for c, e, k in zip(corner, extent, self.chunks)]
        for key in itertools.islice(itertools.product(*ranges), _CHUNKS_TRIED_ALONE):
            start = [k * n for k, n in zip(key, self.chunks)]
            stop = [min(a + n, s) for a, n, s in zip(start, self.chunks, self.full_shape[-3:])]
            try:
                self._stored(self._selection(start, [b - a for a, b in zip(start, stop)]))
            except (RemoteReadError, ReadAbandoned):
                raise
            except Exception as alone:
                return CorruptChunkError(f"{self.name}: cannot read chunk (z, y, x) = {key}: {alone}; {why}")
        chunks = [f"{r.start}..{r.stop - 1}" for r in ranges]
        return CorruptChunkError(f"{self.name}: cannot read chunk(s) (z, y, x) = ({', '.join(chunks)}): {error}; "
                                 f"{why}")

    def will_read(self, blocks) -> None:
        """Announce the blocks ((corner, extent) each) about to be read: a remote store requests them together."""
        if isinstance(self._direct, _DirectChunks) and isinstance(self._direct.directory, RemoteStore):
            self._direct.directory.will_get(self._direct.key(corner) for corner, _ in blocks)

    def close(self) -> None:
        """Cancel the remote reads announced and not taken."""
        if isinstance(self._direct, _DirectChunks) and isinstance(self._direct.directory, RemoteStore):
            self._direct.directory.abandon_announced()

    def attributes(self) -> dict:
        return dict(self._array.attrs)

    def attribute_keys(self) -> tuple:
        """A zarr v2 array's own .zattrs where they place it (resolution, offset); an OME-NGFF level is placed by
        its image's, read already (a denied one is no image), and zarr v3 keeps attributes in zarr.json."""
        if self._array.metadata.zarr_format != 2 or not self._own_geometry:
            return ()
        return (f"{self._dataset.strip('/')}/.zattrs".lstrip("/"),)

    def describe(self) -> str:
        shards = getattr(self._array, "shards", None)  # each shard one file (or object): what one read fetches
        shown = "" if shards is None else f" shards={tuple(int(shards[self._axes.index(a)]) for a in 'zyx')}"
        text = f"{super().describe()}{shown} {codec_names(self._array.metadata)}".rstrip()
        if self._image_level is not None:
            index, count, level_path = self._image_level
            text += f" (OME-Zarr image: level {index} of {count}, array {level_path})"
        return text

    def reopen_arguments(self) -> tuple:
        # a store pickles as its URL, a folder as its absolute path (a Dask worker may run elsewhere)
        path = self._path if isinstance(self._path, RemoteStore) else str(Path(self._path).absolute())
        return path, self._given, self._level, self._resolution


def _open_node(zarr, path: Path, dataset: str, name: str):
    """The array or group at ``dataset``, opened by its own metadata: tensorstore and funlib.persistence write an
    array with no group metadata above it, which is a valid zarr store (the store's root is no node)."""
    node = path / dataset
    if isinstance(path, RemoteStore):
        if not any(_read_metadata(node, marker) is not None for marker in ARRAY_MARKERS + GROUP_MARKERS):
            raise DatasetNotFoundError(f"no zarr array or group at {node} (no zarr.json, .zarray or .zgroup)")
        try:
            return zarr.open(store=path.zarr_store(), path=dataset, mode="r")
        except (RemoteReadError, ReadAbandoned):
            raise
        except Exception as error:
            raise StoreMetadataError(f"{name}: malformed metadata at {node}: zarr-python cannot parse it "
                                     f"({type(error).__name__}: {error})") from error
    if not any((node / marker).is_file() for marker in ARRAY_MARKERS + GROUP_MARKERS):
        if dataset:
            raise DatasetNotFoundError(f"array {dataset!r} not found in {path}; arrays there: "
                                       f"{', '.join(arrays_on_disk(path)) or 'none'}")
        raise OSError(f"cannot open {path} as a zarr store: it has no zarr.json, .zarray or .zgroup; arrays "
                      f"below it: {', '.join(arrays_on_disk(path)) or 'none'}")
    try:
        return zarr.open(store=local_store(path), path=dataset, mode="r")
    except Exception as error:  # zarr raises various types for metadata it refuses
        raise refused_metadata(name, node, error) from error


#: The most bytes of a box read through zarr-python at once (see :meth:`ZarrSource.read`).
READ_SLAB_BYTES = 32 * 2 ** 20


def level_above(container: Path, dataset: str) -> Optional[Level]:
    """The level the array ``container/dataset`` is of the OME-NGFF image in the group right above it, as that
    image places it; None if that group is no image listing it, or its multiscales cannot be read."""
    return _level_above(import_zarr("reading"), container, dataset)


def _level_above(zarr, path, dataset: str) -> Optional[Level]:
    """The level an array is of the OME-NGFF image in the group right above it, None if that group is no image
    listing it (or its multiscales cannot be read: the array's own attributes stand then)."""
    parent, _, leaf = dataset.rpartition("/")
    if not leaf or not any(_read_metadata(path / parent, marker) is not None for marker in GROUP_MARKERS):
        return None
    try:
        group = zarr.open(store=path.zarr_store() if isinstance(path, RemoteStore) else local_store(path),
                          path=parent, mode="r")
        levels = _placed_levels(group, multiscale_levels(dict(group.attrs), f"{path}:{parent}"), f"{path}:{parent}") \
            if isinstance(group, zarr.Group) else None
    except (StoreMetadataError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None  # malformed multiscales: the array's own attributes stand (a failed read is raised)
    return next((level for level in levels or () if level.path.strip("/") == leaf), None)


def _placed_levels(group, levels: Optional[List[Level]], name: str) -> Optional[List[Level]]:
    """``levels`` of the image ``group``, placed where its first level starts: where that level's funlib offset is
    the corner of a binned level (a pyramid made from a coarser level of another image, as emfast writes one, or
    a coarser level written alone, see :func:`~emfast.io._geometry.binned_corner`), every level binned from it
    starts there, not at its translation."""
    if not levels:
        return levels
    first = levels[0]
    try:
        offset = _geometry_of(group[first.path], name, first.axes).offset
    except Exception:  # noqa: BLE001 - a first level that cannot be read is refused when it is opened
        return levels
    if offset is None or not binned_corner(offset, first.translation, first.resolution):
        return levels
    return [dataclasses.replace(level, offset=tuple(offset))
            if np.allclose(level.offset, first.translation, rtol=0, atol=1e-6) else level for level in levels]


def _geometry_of(array, name: str, known_axes: Optional[Sequence[str]] = None) -> Geometry:
    """The array's geometry from its attributes and, in zarr v3, its dimension_names (which must agree with
    ``known_axes``, an OME-NGFF image's, where given)."""
    where = f"{name} (attributes)"
    with parsing(where):
        names = getattr(array.metadata, "dimension_names", None)
        attrs = dict(array.attrs)
        key = "zarr dimension_names"
        if names is None and known_axes is None and "axis_names" not in attrs:  # zarr v2's, as xarray writes them
            names = xarray_axes(attrs.get("_ARRAY_DIMENSIONS"), array.ndim)
            key = "xarray _ARRAY_DIMENSIONS"
        return array_geometry(attrs, array.ndim, where, dimension_names=names, names_key=key, known_axes=known_axes)


def codec_names(metadata) -> str:
    """A zarr array's compression as ``emfast info`` shows it: its codecs but the bytes codec (v3; a sharded
    array's inner ones in brackets), or its filters and compressor (v2); "" for none."""
    if metadata.zarr_format == 2:
        codecs = list(metadata.filters or ()) + ([metadata.compressor] if metadata.compressor is not None else [])
        return " ".join(codec.codec_id for codec in codecs)

    def names(described) -> List[str]:
        shown = []
        for codec in described:
            if codec.get("name") == "sharding_indexed":
                shown.append(f"sharded[{' '.join(names(codec.get('configuration', {}).get('codecs', ())))}]")
            elif codec.get("name") != "bytes":
                shown.append(str(codec.get("name")))
        return shown

    return " ".join(names([codec.to_dict() for codec in metadata.codecs]))


def arrays_on_disk(store: Path, below: str = "") -> List[str]:
    """Paths, relative to ``below``, of every zarr array in ``store/below``, found by their metadata files, so that
    arrays with no group metadata above them are listed too ("." for ``below`` itself); folders linked into the
    store are followed (an array linked in opens by its path too), each folder walked once."""
    top = store / below
    found = []
    seen = set()  # folders reached, as real paths: a link back up (or to a folder seen) is walked once
    for directory, subdirectories, files in os.walk(top, onerror=unlistable(), followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:
            subdirectories[:] = []
            continue
        seen.add(real)
        kind = _v3_kind(Path(directory) / "zarr.json") if "zarr.json" in files else None
        if ".zarray" in files or kind in ("array", "unreadable"):
            found.append(Path(directory).relative_to(top).as_posix())
            if kind == "unreadable":  # listed, so that reading it names the file; a group's nodes below it
                # too, but not an array's chunk folders ("c" in v3, numbers in v2's nested keys)
                subdirectories[:] = [d for d in subdirectories if d != "c" and not d.isdigit()]
            else:
                subdirectories[:] = []  # an array's subdirectories hold its chunks
        subdirectories.sort()
    return sorted(found)


def check_metadata_json(node: Path, name: str) -> None:
    """StoreMetadataError naming the file where a zarr node's metadata file at ``node`` is no JSON object (what
    zarr-python needs to read it at all; an array emfast would not read as a volume is no error here)."""
    for marker in METADATA_FILES:
        meta = _parsed_metadata(node, marker, name)
        if meta is not NO_FILE and not isinstance(meta, dict):
            raise StoreMetadataError(f"{name} ({marker}): malformed metadata: {meta!r}; expected a JSON object")


#: What :func:`_parsed_metadata` returns for a file that is not there (None is JSON's null, which a file may hold).
NO_FILE = object()


def _parsed_metadata(node, marker: str, name: str):
    """The JSON value of the metadata file ``marker`` of ``node`` (a local path or a remote store), :data:`NO_FILE`
    if there is no such file; StoreMetadataError naming it where it is no JSON."""
    text = _read_metadata(node, marker)
    if text is None:
        return NO_FILE
    try:
        return json.loads(text)
    except ValueError as error:
        raise StoreMetadataError(f"{name} ({marker}): malformed metadata: not JSON ({error})") from error


def is_zarr_array(node: Path) -> bool:
    """Whether the folder ``node`` holds a zarr array (v2 ``.zarray``, or v3 ``zarr.json`` of an array)."""
    return (node / ".zarray").is_file() or ((node / "zarr.json").is_file() and _is_v3_array(node / "zarr.json"))


def _is_v3_array(metadata: Path) -> bool:
    """Whether ``metadata`` describes an array; one that cannot be read for want of permission is an error, not
    left out of a listing that says nothing of it."""
    return _v3_kind(metadata) == "array"


def _v3_kind(metadata: Path) -> Optional[str]:
    """What the zarr v3 ``metadata`` file says its node is: "array", "group", or "unreadable" where it is empty, no
    JSON, no JSON object or names no node type (what a crash mid-write leaves: left out of a listing, a broken
    array went unmentioned); None where it cannot be read as a file."""
    try:
        text = read_regular_file(metadata, "zarr metadata")
    except PermissionError as error:
        raise PermissionError(error.errno, f"cannot read the zarr metadata {metadata}: {error.strerror}") from None
    except OSError:
        return None
    try:
        meta = json.loads(text or b"")
    except ValueError:
        return "unreadable"
    node_type = meta.get("node_type") if isinstance(meta, dict) else None
    return node_type if node_type in ("array", "group") else "unreadable"  # no node type: no node zarr reads


def refuse_special_metadata(store: Path, dataset: str) -> None:
    """Refuse a metadata file on the way from the store to ``dataset`` that is not a regular file (a FIFO would
    block zarr-python's read forever), before zarr-python opens any."""
    directories = [store]
    for part in (p for p in dataset.split("/") if p):
        directories.append(directories[-1] / part)
    for directory in directories:
        for marker in METADATA_FILES:
            require_kind(directory / marker, "file", "zarr metadata")


def refused_metadata(name: str, node: Path, error: Exception) -> StoreMetadataError:
    """zarr-python's refusal of metadata emfast's own checks let through, naming the metadata file."""
    local = not isinstance(node, RemoteStore)
    marker = next((node / m for m in ARRAY_MARKERS + GROUP_MARKERS if local and (node / m).is_file()), node)
    return StoreMetadataError(f"{name}: malformed metadata in {marker}: zarr-python cannot parse it "
                              f"({type(error).__name__}: {error})")


def check_array_metadata(node: Path, name: str, ranks: Sequence[int]) -> None:
    """Check the metadata of the zarr array at ``node`` (``.zarray`` or ``zarr.json``), if it is one, for what
    emfast relies on: a known format, a shape of one of ``ranks`` sizes >= 0, positive chunk sizes of the same
    length, a dtype, codecs given as the format requires.

    Raises
    ------
    StoreMetadataError
        Naming the store and array, the file, the key and the value.
    """
    for marker, check in (("zarr.json", _check_v3), (".zarray", _check_v2)):
        meta = _parsed_metadata(node, marker, name)
        if meta is NO_FILE:
            continue
        if marker == "zarr.json" and isinstance(meta, dict) and meta.get("node_type") == "group":
            return
        check(meta, f"{name} ({marker})", ranks)
        return


def _read_metadata(node, marker: str) -> Optional[bytes]:
    """The bytes of the metadata file ``marker`` of ``node`` (a local path or a remote store), None if absent."""
    if isinstance(node, RemoteStore):
        return node.get(marker)
    return read_regular_file(node / marker, "zarr metadata")


def _shape(meta, where: str, ranks: Sequence[int]) -> Tuple[int, ...]:
    """The array's shape; an array of another rank than ``ranks`` is not malformed, only not a volume: said so."""
    shape = int_list(metadata_key(meta, "shape", where), "shape", where, minimum=0)
    if len(shape) not in ranks:
        raise StoreMetadataError(f"{where}: a {len(shape)}-D array (shape {list(shape)}); emfast reads volumes: 3-D "
                                 "(z, y, x), 4-D (c, z, y, x), or 5-D with a time axis named in their metadata"
                                 + (ONE_SECTION if len(shape) == 2 else ""))
    return shape


def _check_v2(meta, where: str, ranks: Sequence[int]) -> None:
    if metadata_key(meta, "zarr_format", where) != 2:
        raise bad_metadata(where, "zarr_format", meta["zarr_format"], "2 in a .zarray")
    shape = _shape(meta, where, ranks)
    int_list(metadata_key(meta, "chunks", where), "chunks", where, minimum=1, length=len(shape))
    _check_dtype(metadata_key(meta, "dtype", where), "dtype", where)
    compressor = metadata_key(meta, "compressor", where)
    if compressor is not None and not _is_codec(compressor, "id"):
        raise bad_metadata(where, "compressor", compressor, 'null or a codec such as {"id": "zstd"}')
    filters = meta.get("filters")
    if filters is not None and not (isinstance(filters, list) and all(_is_codec(f, "id") for f in filters)):
        raise bad_metadata(where, "filters", filters, 'null or a list of codecs such as [{"id": "delta", ...}]')
    if metadata_key(meta, "order", where) not in ("C", "F"):
        raise bad_metadata(where, "order", meta["order"], '"C" or "F"')
    metadata_key(meta, "fill_value", where)
    if meta.get("dimension_separator", ".") not in (".", "/"):
        raise bad_metadata(where, "dimension_separator", meta["dimension_separator"], '"." or "/"')


def _check_v3(meta, where: str, ranks: Sequence[int]) -> None:
    if metadata_key(meta, "zarr_format", where) != 3:
        raise bad_metadata(where, "zarr_format", meta["zarr_format"], "3 in a zarr.json")
    if metadata_key(meta, "node_type", where) != "array":
        raise bad_metadata(where, "node_type", meta["node_type"], '"array" or "group"')
    shape = _shape(meta, where, ranks)
    _check_dtype(metadata_key(meta, "data_type", where), "data_type", where)
    grid = metadata_key(meta, "chunk_grid", where)
    if metadata_key(grid, "name", where, "chunk_grid") != "regular":
        raise bad_metadata(where, "chunk_grid.name", grid["name"], '"regular"')
    configuration = metadata_key(grid, "configuration", where, "chunk_grid")
    chunks = int_list(metadata_key(configuration, "chunk_shape", where, "chunk_grid.configuration"),
                      "chunk_grid.configuration.chunk_shape", where, minimum=1, length=len(shape))
    encoding = metadata_key(meta, "chunk_key_encoding", where)
    if metadata_key(encoding, "name", where, "chunk_key_encoding") not in ("default", "v2"):
        raise bad_metadata(where, "chunk_key_encoding.name", encoding["name"], '"default" or "v2"')
    metadata_key(meta, "fill_value", where)
    _check_codecs(metadata_key(meta, "codecs", where), "codecs", where, chunks)
    names = meta.get("dimension_names")
    if names is not None and not (isinstance(names, list) and len(names) == len(shape)):
        raise bad_metadata(where, "dimension_names", names, f"null or a list of {len(shape)} names")


def _check_codecs(codecs, key: str, where: str, chunks: Tuple[int, ...]) -> None:
    """A v3 codec list; a sharding codec's inner chunks must tile its shard (``chunks``)."""
    if not isinstance(codecs, list) or not codecs or not all(_is_codec(c, "name") for c in codecs):
        raise bad_metadata(where, key, codecs, 'a non-empty list of codecs such as [{"name": "bytes"}]')
    for n, codec in enumerate(codecs):
        if codec["name"] != "sharding_indexed":
            continue
        here = f"{key}[{n}].configuration"
        configuration = metadata_key(codec, "configuration", where, f"{key}[{n}]")
        inner = int_list(metadata_key(configuration, "chunk_shape", where, here), f"{here}.chunk_shape", where,
                         minimum=1, length=len(chunks))
        if any(c % i for c, i in zip(chunks, inner)):
            raise bad_metadata(where, f"{here}.chunk_shape", list(inner), f"sizes that divide the shard {list(chunks)}")
        _check_codecs(metadata_key(configuration, "codecs", where, here), f"{here}.codecs", where, inner)
        _check_codecs(configuration.get("index_codecs", [{"name": "bytes"}]), f"{here}.index_codecs", where, inner)


def _is_codec(codec, key: str) -> bool:
    return isinstance(codec, dict) and isinstance(codec.get(key), str)


def _check_dtype(value, key: str, where: str) -> None:
    """A data type named by a string NumPy reads (v2 ``"<u2"``, v3 ``"uint16"``); structured and extension types,
    which emfast does not read, are refused here too."""
    try:
        known = isinstance(value, str) and np.dtype(value) is not None
    except TypeError:
        known = False
    if not known:
        raise bad_metadata(where, key, value, 'a data type name such as "uint8"')


class _DirectChunks:
    """Reads whole chunks of a plain zarr array from their files (or a remote store's keys) and decodes them in the
    calling thread."""

    def __init__(self, array, directory: Union[Path, RemoteStore], decode, decode_into) -> None:
        self._array = array
        self.directory = directory
        self._decode = decode
        self._decode_into = decode_into
        self._raw = not array.compressors
        self._metadata = array.metadata
        self._chunks = tuple(int(c) for c in array.chunks)
        self._shape = tuple(int(s) for s in array.shape)
        self._lead = len(self._shape) - 3
        # a box is one chunk only where every channel is in one chunk (see _one_chunk)
        self._channels_whole = not self._lead or self._chunks[0] == self._shape[0]
        self._chunk_size = math.prod(self._chunks)
        self._key_form = _key_form(self._metadata.encode_chunk_key, self._lead)
        self._dtype = np.dtype(array.dtype)
        serializer = getattr(array, "serializer", None)
        endian = getattr(getattr(serializer, "endian", None), "value", None)
        if endian is not None and self._dtype.itemsize > 1:
            self._dtype = self._dtype.newbyteorder("<" if endian == "little" else ">")
        self._fill = fill_value(array.fill_value, self._dtype)
        codec = array.compressors[0] if array.compressors else None
        # a box's chunks decoded side by side where that pays, as measured for stores of this codec and chunk size
        self._decodes = SideBySide.of("zarr", type(codec).__name__, str(getattr(codec, "cname", "")),
                                      math.prod(self._chunks) * self._dtype.itemsize)

    @classmethod
    def for_array(cls, array, directory: Union[Path, RemoteStore]) -> Optional["_DirectChunks"]:
        """A reader if the array's layout is one this class decodes exactly, else None (zarr-python reads it)."""
        zarr = import_zarr()
        local = not isinstance(directory, RemoteStore)
        if (local and not directory.is_dir()) or getattr(array, "shards", None) is not None or array.filters:
            return None
        if getattr(array.metadata, "order", "C") != "C" or np.dtype(array.dtype).kind not in "uif":
            return None
        serializer = getattr(array, "serializer", None)
        if serializer is not None and not isinstance(serializer, zarr.codecs.BytesCodec):
            return None
        if len(array.compressors) > 1:
            return None
        decode = _decoder(array.compressors[0]) if array.compressors else (lambda data: data)
        into = _decoder_into(array.compressors[0]) if array.compressors else None
        return None if decode is None else cls(array, directory, decode, into)

    def key(self, corner) -> str:
        """The store key of the chunk at ``corner`` (z, y, x voxels, a multiple of the chunk shape)."""
        kz, ky, kx = self._chunks[self._lead:]
        z, y, x = int(corner[0]) // kz, int(corner[1]) // ky, int(corner[2]) // kx
        if self._key_form is None:
            return self._metadata.encode_chunk_key((0,) * self._lead + (z, y, x))
        prefix, separator = self._key_form
        return f"{prefix}{z}{separator}{y}{separator}{x}"

    def _one_chunk(self, corner, extent) -> bool:
        """Whether the box is exactly one chunk of a 3-D array (or of a 4-D one with all channels in one chunk)."""
        if not self._channels_whole:
            return False
        (z, y, x), (ez, ey, ex) = corner, extent
        (kz, ky, kx), (sz, sy, sx) = self._chunks[self._lead:], self._shape[self._lead:]
        return (not (z % kz or y % ky or x % kx)
                and ez == min(kz, sz - z) and ey == min(ky, sy - y) and ex == min(kx, sx - x))

    def _whole(self, out: np.ndarray) -> bool:
        """Whether ``out`` is a whole chunk's buffer, which a chunk is read or decoded straight into."""
        return out.flags.c_contiguous and out.dtype == self._dtype and out.size == self._chunk_size

    def read(self, corner, extent, out: np.ndarray, name: str, stamp: Stamp) -> bool:
        """Fill ``out`` if the box is exactly one chunk (:meth:`_one_chunk`); False otherwise, and the caller reads
        through zarr-python."""
        if not self._one_chunk(corner, extent):
            return False
        key = self.key(corner)
        whole = self._whole(out)
        if isinstance(self.directory, RemoteStore):
            data = self.directory.get(key)
        else:
            if whole and self._raw and read_regular_file_into(self.directory / key, "a zarr chunk", out):
                return True
            data = read_regular_file(self.directory / key, "a zarr chunk")
        self._fill_from(data, key, extent, out, whole, name, stamp)
        return True

    def read_many(self, requests, name: str, stamp: Stamp) -> list:
        """Fill the boxes of ``requests`` ((corner, extent, out) each) that are one chunk each of a local array,
        their files read in one call (:func:`read_regular_files`) and decoded, in parts side by side where that
        pays (:class:`SideBySide`). Returns the requests it did not fill."""
        mine, rest = [], []
        for request in requests:
            (mine if self._one_chunk(request[0], request[1]) else rest).append(request)
        self._decodes.run(mine, functools.partial(self._read_part, name=name, stamp=stamp),
                          most=max(1, BATCH_BYTES // (math.prod(self._chunks) * self._dtype.itemsize)))
        return rest

    def _read_part(self, requests, name: str, stamp: Stamp) -> None:
        """Fill ``requests``, one chunk each: whole chunks of a codec emfast decodes itself read and decoded in
        one compiled call; the others (and those it could not fill) read in one call, then decoded one after
        another."""
        codec = compiled_codec(self._raw, self._decode_into)
        if codec is not None:
            requests = self._read_decoded(requests, codec)
        if not requests:
            return
        keys = [self.key(corner) for corner, _, _ in requests]
        wholes = [self._whole(out) for _, _, out in requests]
        into = [out if whole and self._raw else None for (_, _, out), whole in zip(requests, wholes)]
        directory = str(self.directory)
        with lent_buffer() as buffer:
            contents, _ = read_regular_files([os.path.join(directory, key) for key in keys], "a zarr chunk",
                                             into=into, buffer=buffer)
            decoded = self._decode_into.many(contents, [out for _, _, out in requests], wholes) \
                if self._decode_into is not None else [False] * len(contents)
            for data, key, (_, extent, out), whole, done in zip(contents, keys, requests, wholes, decoded):
                if data is not True and not done:
                    self._fill_from(data, key, extent, out, whole, name, stamp)

    def _read_decoded(self, requests, codec: str) -> list:
        """Fill the whole chunks of ``requests`` by :func:`read_decoded_files`; returns the others, and those it
        could not fill (read again the general way, which names what is wrong)."""
        mine, left = whole_and_rest(requests, self._whole)
        if not mine:
            return left
        directory = os.path.join(str(self.directory), "")
        with lent_buffer() as buffer:
            results, _ = read_decoded_files([directory + self.key(corner) for corner, _, _ in mine], codec,
                                            [out for _, _, out in mine], buffer)
        for request, result in zip(mine, results):
            if result == CHUNK_MISSING:
                request[2][...] = self._fill
            elif result == CHUNK_AGAIN:
                left.append(request)
        return left

    def _fill_from(self, data, key: str, extent, out: np.ndarray, whole: bool, name: str, stamp: Stamp) -> None:
        """Fill ``out`` from chunk ``key``'s stored bytes ``data`` (None: no chunk, the fill value)."""
        if data is None:
            out[...] = self._fill
            return
        if whole and self._decode_into is not None and self._decode_into(data, out):
            return
        decoded_into(data, out, self._dtype, self._chunks, extent, self._decode, f"{name}: chunk {key}",
                     f"{name}: cannot decode chunk {key}", stamp)


def _key_form(encode_chunk_key, lead: int) -> Optional[Tuple[str, str]]:
    """(prefix, separator) of the keys ``encode_chunk_key`` (an array's metadata's) gives the chunks of a 3-D grid
    behind ``lead`` leading coordinates of 0: ``prefix + separator.join(z, y, x)``, as checked on probes; None if
    its keys are of another form (it is then asked for every key). Formatted here, a key costs a fifth of zarr's
    encoding, which took 4 % of a cold loader's time over small chunks (``benchmarks/lazy_cold.py``)."""
    zeros = (0,) * lead
    probe = encode_chunk_key(zeros + (11, 22, 33))
    first, last = probe.rfind("11"), probe.rfind("33")
    middle = probe.rfind("22")
    if not (0 <= first < middle < last) or last + 2 != len(probe):
        return None
    prefix, separator = probe[:first], probe[first + 2:middle]
    if any(encode_chunk_key(zeros + grid) != prefix + separator.join(map(str, grid))
           for grid in ((0, 0, 0), (4, 105, 6), (1000, 7, 123456))):
        return None
    return prefix, separator


def _decoder_into(codec):
    """A :class:`_IntoDecoder` for one zarr compressor, or None for codecs without one (lz4)."""
    import numcodecs
    zarr = import_zarr()
    if isinstance(codec, numcodecs.abc.Codec) and codec.codec_id in ("zstd", "blosc"):
        kind, decoder = codec.codec_id, codec
    elif (isinstance(codec, numcodecs.abc.Codec) and codec.codec_id in ("gzip", "zlib")) or \
            isinstance(codec, zarr.codecs.GzipCodec):
        kind, decoder = "deflate", None  # zlib cannot inflate into a buffer: libdeflate alone does
    elif isinstance(codec, zarr.codecs.ZstdCodec):
        kind, decoder = "zstd", numcodecs.Zstd(level=codec.level, checksum=codec.checksum)
    elif isinstance(codec, zarr.codecs.BloscCodec):
        kind, decoder = "blosc", numcodecs.Blosc()
    else:
        return None
    return _IntoDecoder(kind, decoder)


class _IntoDecoder:
    """Decodes chunks straight into their blocks where a frame decodes to exactly the block's size: one (a call),
    or a box's whole chunks at once (:meth:`many`: zstd with the system's libzstd, blosc with c-blosc's own
    decoder, gzip and zlib with the system's libdeflate). What it does not decode, the caller decodes the general
    way, which names what is wrong."""

    def __init__(self, kind: str, decoder) -> None:
        self.kind = kind
        self._decode_frames = {"zstd": _zstd.decode_frames, "blosc": _blosc.decode_frames,
                               "deflate": _deflate.decode_frames}[kind]
        if kind != "deflate":
            self._decode = decoder.decode if kind == "zstd" else checked_blosc(decoder)
            self._size_of = zstd_content_size if kind == "zstd" else blosc_content_size

    def compiled(self) -> Optional[str]:
        """The codec as ``emfast._core.files`` decodes it, where its library is bound (looked for once), else
        None."""
        found = {"zstd": _zstd.system_zstd, "blosc": _blosc.native_blosc, "deflate": _deflate.system_deflate}
        return self.kind if found[self.kind]() else None

    def __call__(self, data, out: np.ndarray) -> bool:
        if self.kind == "deflate":  # no size in a zlib header: the inflation stops at the block's size
            return bool(self.many([data], [out], [True])[0])
        if self._size_of(data) != out.nbytes:
            return False
        try:
            self._decode(data, out.reshape(-1).view(np.uint8))
        except Exception:  # noqa: BLE001 - decoded again the general way, whose error names the chunk
            return False
        return True

    def many(self, contents: Sequence, outs: Sequence[np.ndarray], wholes: Sequence[bool]) -> List[bool]:
        """Per chunk, whether it was decoded here: the stored bytes ``contents[i]`` (None or True: nothing to
        decode) of the whole chunks (``wholes[i]``) into ``outs[i]``, all in one call without the GIL."""
        done = [False] * len(contents)
        chosen = [i for i, (data, whole) in enumerate(zip(contents, wholes))
                  if whole and data is not None and data is not True]
        if not chosen:
            return done
        decoded = self._decode_frames([contents[i] for i in chosen],
                                      [outs[i].reshape(-1).view(np.uint8) for i in chosen])
        if decoded is not None:
            for i, ok in zip(chosen, decoded.tolist()):
                done[i] = ok
        return done


def _decoder(codec):
    """A bytes -> bytes function for one zarr compressor, or None if emfast does not decode it itself."""
    import numcodecs
    zarr = import_zarr()
    if isinstance(codec, numcodecs.abc.Codec):  # zarr v2 metadata: numcodecs objects
        if codec.codec_id == "blosc":
            return checked_blosc(codec)
        return codec.decode if codec.codec_id in ("zstd", "zlib", "gzip", "lz4") else None
    if isinstance(codec, zarr.codecs.ZstdCodec):
        return numcodecs.Zstd(level=codec.level, checksum=codec.checksum).decode
    if isinstance(codec, zarr.codecs.BloscCodec):
        return checked_blosc(numcodecs.Blosc())  # a blosc frame describes its own compressor and shuffle
    if isinstance(codec, zarr.codecs.GzipCodec):
        return lambda data: zlib.decompress(data, 31)
    return None
