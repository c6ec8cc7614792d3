"""``emfast convert``: copy a volume from any readable format into a zarr array (v2 or v3) or an HDF5 dataset,
tile by tile, resumably.

The output's attributes record the conversion (``emfast_convert``: the source as it was, with a fingerprint of
its files, every setting that decides the tiles and their bytes, and the tiles done so far). The output is
created with its record; a tile is recorded done only after its data was written (and, in HDF5, flushed). A run
that stops for any reason (an error, a full disk, Ctrl-C, a killed process) is resumed by running the same
command again: it checks that the source and the settings are unchanged and continues after the last recorded
tile. An existing output that is not an unfinished conversion of the same source is refused unless
``overwrite`` is given, and even then only an array emfast wrote is replaced. One run at a time writes an output
(see :mod:`emfast.io._outputs`); the source is opened read-only.
"""
from __future__ import annotations

import json
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import h5py
import numpy as np

from ._geometry import GEOMETRY_KEYS
from ._open import open_source, split_path
from ._outputs import (RECORDS, NotOwnOutputError, OutputLock, add_ome_multiscales, check_free_space,
                       check_output_location, check_zarr_container, fingerprint, input_changed, open_hdf5_for_writing,
                       option, remove_hdf5_output, remove_partial_files, remove_zarr_output, zarr_geometry,
                       zarr_store_format)
from ._progress import plural, progress_bar
from ._source import VolumeSource

COMPRESSORS = ("zstd", "blosc", "gzip", "none")
#: The compressor of each output format when none is given (HDF5 has no zstd without plugins).
DEFAULT_COMPRESSORS = {"zarr": "zstd", "hdf5": "gzip"}
#: Most bytes of one tile read and written at a time (whole chunks, all channels).
TILE_BYTES = 256 << 20
#: Output chunk edge when the source has no chunks (clipped to the volume).
CHUNK_EDGE = 64
RECORD = "emfast_convert"
#: How an interrupted conversion continues.
AGAIN = "run the same conversion again to continue"

__all__ = ["COMPRESSORS", "ConvertError", "ConvertWriteError", "Conversion", "convert", "progress_bar",
           "zarr_compressor"]


class ConvertError(ValueError):
    """The output cannot be written as asked (it exists, it is the source, a setting does not apply)."""


class ConvertWriteError(OSError):
    """Writing a tile failed (a full disk, a lost mount); the tiles before it are recorded, a rerun continues."""


@dataclass(frozen=True)
class Conversion:
    """What :func:`convert` did.

    Attributes
    ----------
    path : pathlib.Path
        The output container.
    tiles : int
        Tiles of the conversion.
    written : int
        Tiles written by this call: 0 when the output was complete already.
    """

    path: Path
    tiles: int
    written: int


def convert(source_path, destination, *, chunks: Optional[Sequence[int]] = None, compressor: Optional[str] = None,
            zarr_format: int = 3, overwrite: bool = False, progress: Optional[Callable[[int, int], None]] = None,
            tile_bytes: Optional[int] = None) -> Conversion:
    """Convert the volume at ``source_path`` (any form :func:`emfast.open` takes) to ``destination``
    (``out.zarr/raw`` or ``out.h5/raw``).

    Parameters
    ----------
    chunks : (int, int, int), optional
        Output chunks (z, y, x); default the source's, else 64 per axis; clipped to the volume's shape.
    compressor : {"zstd", "blosc", "gzip", "none"}, optional
        Default "zstd" for zarr, "gzip" for HDF5 (which takes only "gzip" or "none").
    zarr_format : {2, 3}
        zarr output format of a new store; an existing store keeps its own.
    overwrite : bool
        Replace an existing output that is not an unfinished conversion of the same source. Only an array emfast
        wrote (it carries an emfast record) is replaced; a group, a link or another program's array is refused.
    progress : callable, optional
        Called with (tiles done, tiles in all) before the first tile and after every tile.
    tile_bytes : int, optional
        Most bytes read and written at a time (default :data:`TILE_BYTES`). It decides the tiles, so it is
        recorded: a resume with another value is refused.

    Returns
    -------
    Conversion

    Raises
    ------
    ConvertError
        A setting does not apply, the output is the source (or inside it, or contains it), or it exists and may
        not be resumed or replaced; also when the source changed since the output was started.
    ConvertWriteError
        Writing failed; the tiles written before are recorded and running again continues.
    emfast.io._outputs.OutputSpaceError
        The output's file system has less free space than the next tile (or, uncompressed, the whole rest) needs.
    emfast.io._outputs.OutputBusyError
        Another emfast run (its pid is named), or another program holding the HDF5 file open, is writing the
        output.

    Notes
    -----
    The output may not be the source, inside it, or contain it (symlinks resolved), nor lie in the source's HDF5
    file. While it runs, the lock file ``.NAME.emfast-lock`` beside the output container is held; it stays
    afterwards (harmless: the lock is the open file, released when the process ends however it ends). A resume
    compares the record's fingerprint of the source (every file's name, size and modification time) with the
    source now, and refuses one whose chunks were rewritten. Free space is checked before every tile (a tile
    never needs more than its raw bytes) and, without compression, for the whole rest up front.
    """
    container, dataset, kind = split_path(destination)
    if kind not in ("zarr", "hdf5") or not dataset:
        raise ConvertError(f"destination must name a dataset in a .zarr or .h5 container, e.g. out.zarr/raw; got "
                           f"{destination}")
    compressor = compressor or DEFAULT_COMPRESSORS[kind]
    if compressor not in COMPRESSORS:
        raise ConvertError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {compressor!r}")
    if kind == "hdf5" and compressor not in ("gzip", "none"):
        raise ConvertError(f"HDF5 outputs support the compressors gzip and none, not {compressor}")
    if zarr_format not in (2, 3):
        raise ConvertError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    if kind == "zarr":  # an existing store keeps its format: a root of the other one would hide its arrays
        zarr_format = zarr_store_format(container) or zarr_format
    source = open_source(source_path)
    try:
        try:
            check_output_location(container, dataset, kind, source.stamp, "source")
        except ValueError as error:
            raise ConvertError(str(error)) from None
        chunks = _output_chunks(chunks, source)
        itemsize = np.dtype(source.dtype).itemsize
        tiles = _tiles(source.full_shape, chunks, itemsize, tile_bytes or TILE_BYTES)
        record = {"source": {"path": str(source.stamp.path), "dataset": source.stamp.dataset,
                             "fingerprint": fingerprint(source.stamp)},
                  "shape": list(source.full_shape), "dtype": np.dtype(source.dtype).newbyteorder("=").str,
                  "chunks": list(chunks), "tile": list(tiles[0][1]), "tiles": len(tiles), "compressor": compressor,
                  "format": "hdf5" if kind == "hdf5" else f"zarr{zarr_format}"}
        with OutputLock(container) as lock:
            writer = (_ZarrWriter if kind == "zarr" else _Hdf5Writer)(container, dataset, source, chunks,
                                                                       compressor, zarr_format)
            try:
                done = writer.prepare(record, overwrite, lock)
                _copy(source, writer, record, tiles, done, progress)
            finally:
                writer.close()
        return Conversion(container, len(tiles), len(tiles) - done)
    finally:
        source.close()


def _output_chunks(chunks, source: VolumeSource) -> tuple:
    """The output's chunks: as given, else the source's, else :data:`CHUNK_EDGE`; clipped to the volume (HDF5
    refuses a chunk larger than its dataset)."""
    chunks = tuple(int(c) for c in (chunks or source.chunks or (CHUNK_EDGE,) * 3))
    if len(chunks) != 3 or min(chunks) < 1:
        raise ConvertError(f"chunks must be three sizes >= 1 (z, y, x), got {chunks}")
    return tuple(min(c, s) for c, s in zip(chunks, source.full_shape[-3:]))


def _copy(source: VolumeSource, writer, record: dict, tiles, done: int, progress) -> None:
    """Copy the tiles after the first ``done``, recording each once its data is written."""
    lead = len(source.full_shape) - 3
    channels = source.full_shape[0] if lead else 1
    dtype = np.dtype(source.dtype).newbyteorder("=")
    if record["compressor"] == "none":  # the whole rest's size is known: refuse up front rather than half way
        left = sum(channels * int(np.prod(extent)) for _, extent in tiles[done:]) * dtype.itemsize
        count = len(tiles) - done
        check_free_space(writer.container, left, f"writing the {count} {plural(count, 'tile')} left", AGAIN)
    if progress is not None and done < len(tiles):
        progress(done, len(tiles))
    with _interrupt_between_tiles() as interrupted:
        for number in range(done, len(tiles)):
            if interrupted:
                raise KeyboardInterrupt
            _copy_tile(source, writer, record, tiles, number, channels, dtype, lead)
            if progress is not None:
                progress(number + 1, len(tiles))


@contextmanager
def _interrupt_between_tiles() -> Iterator[list]:
    """Within the block, a first Ctrl-C (SIGINT) only appends to the list yielded, for the loop to stop after the
    tile being written; a second one interrupts at once. zarr reads and writes on its own event-loop thread,
    and an interruption in the middle leaves that loop running: its tasks' tracebacks flood the terminal at
    exit. Outside the main thread, or under another SIGINT handler, nothing changes."""
    interrupted: list = []
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield interrupted
        return

    def note(signum, frame) -> None:
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)

    signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _copy_tile(source: VolumeSource, writer, record: dict, tiles, number: int, channels: int, dtype, lead: int):
    """Read tile ``number``, write it and record it done."""
    corner, extent = tiles[number]
    data = np.empty((channels,) + extent, dtype)
    source.read(corner, extent, data)
    # A tile never costs more than its raw bytes (and the margin): checked before the write, as HDF5 cannot
    # recover from a full disk (its file can no longer be closed, and the process crashes at exit).
    check_free_space(writer.container, data.nbytes, f"writing tile {number + 1} of {len(tiles)}", AGAIN)
    try:
        writer.write(corner, data if lead else data[0])
        writer.record(dict(record, done=number + 1, complete=number + 1 == len(tiles)))
    except (OSError, RuntimeError) as error:
        end = tuple(c + e for c, e in zip(corner, extent))
        raise ConvertWriteError(f"writing tile {number + 1} of {len(tiles)} (voxels {corner}..{end}) to "
                                f"{writer.path} failed: {error}. The {number} tiles before it are recorded; "
                                f"{AGAIN}") from error


def _tiles(shape, chunks, itemsize: int, tile_bytes: int):
    """Chunk-aligned (corner, extent) tiles in C order, each at most ``tile_bytes`` (but at least one chunk)."""
    spatial = shape[-3:]
    channels = shape[0] if len(shape) == 4 else 1
    per_chunk = channels * int(np.prod(chunks)) * itemsize
    grow = max(1, tile_bytes // per_chunk)
    tile = list(chunks)
    for axis in (2, 1, 0):  # whole rows first: contiguous reads for most formats
        whole = -(-spatial[axis] // chunks[axis])
        factor = min(whole, max(1, grow))
        tile[axis] = chunks[axis] * factor
        grow //= factor
    tiles = []
    for index in np.ndindex(*(-(-s // t) for s, t in zip(spatial, tile))):
        corner = tuple(i * t for i, t in zip(index, tile))
        extent = tuple(min(t, s - c) for t, s, c in zip(tile, spatial, corner))
        tiles.append((corner, extent))
    return tiles


def _resumable(previous: Optional[dict], record: dict, path: str, overwrite: bool) -> bool:
    """Whether an existing output with the record ``previous`` continues this conversion (or is complete);
    ConvertError if it may neither be continued nor replaced."""
    if overwrite:
        return False
    if previous is None:
        raise ConvertError(f"{path} exists and it was not written by emfast convert; choose another output "
                           "(emfast never replaces what it did not write)")
    old, new = previous.get("source", {}), record["source"]
    if (old.get("path"), old.get("dataset")) == (new["path"], new["dataset"]):
        changed = input_changed(old.get("fingerprint"), new["fingerprint"],
                                f"the input {new['path']}/{new['dataset']}")
        if changed:
            raise ConvertError(f"cannot resume {path}: {changed}; pass {option('overwrite')} to convert it again")
    differing = [k for k in record if previous.get(k) != record[k]]
    if differing:
        raise ConvertError(f"{path} exists and it is a conversion with another source or other settings ("
                           + "; ".join(f"{k}: {previous.get(k)!r} there, {record[k]!r} now" for k in differing)
                           + f"); pass {option('overwrite')} to replace it")
    return True


def _remove_own(remove, *args) -> None:
    """``remove(*args)``, its refusal to remove what emfast did not write raised as a ConvertError."""
    try:
        remove(*args)
    except NotOwnOutputError as error:
        raise ConvertError(str(error)) from None


class _ZarrWriter:
    def __init__(self, container: Path, dataset: str, source: VolumeSource, chunks, compressor, zarr_format):
        from ._zarr import import_zarr
        self._zarr = import_zarr()
        self.container, self._dataset, self._source = container, dataset, source
        self._chunks, self._compressor, self._format = chunks, compressor, zarr_format
        self._array = None

    @property
    def path(self) -> str:
        return f"{self.container}/{self._dataset}"

    def prepare(self, record: dict, overwrite: bool, lock: OutputLock) -> int:
        """Open the output to continue it (returns the tiles done), or create it with its record (returns 0)."""
        check_zarr_container(self.container)
        folder = self.container / self._dataset
        if folder.exists() or folder.is_symlink():
            previous = self._existing_record(folder)
            half_made = previous is None and lock.was_creating(self._dataset)
            if not half_made and _resumable(previous, record, self.path, overwrite):
                remove_partial_files(folder)
                self._array = self._zarr.open_array(str(self.container), path=self._dataset, mode="r+")
                return int(previous.get("done", 0))
            _remove_own(remove_zarr_output, self.container, self._dataset, lock)
        compressors = zarr_compressor(self._compressor, self._format, self._zarr)
        root = self._zarr.open_group(str(self.container), mode="a", zarr_format=self._format)
        lead = tuple(self._source.full_shape[:-3])
        geometry, dimension_names = zarr_geometry(len(self._source.full_shape), self._source.resolution,
                                                  self._source.offset, self._format)
        attributes = dict(_carried_attributes(self._source), **geometry,
                          **{RECORD: dict(record, done=0, complete=False)})
        with lock.creating(self._dataset):  # the record is in the array's first metadata: never one without it
            self._array = root.create_array(self._dataset, shape=self._source.full_shape,
                                            chunks=lead + self._chunks,
                                            dtype=np.dtype(self._source.dtype).newbyteorder("="),
                                            compressors=compressors, dimension_names=dimension_names,
                                            attributes=attributes)
            add_ome_multiscales(root, self._dataset, len(self._source.full_shape), self._source.resolution,
                                self._source.offset)
        return 0

    def _existing_record(self, folder: Path) -> Optional[dict]:
        try:
            existing = self._zarr.open_array(str(self.container), path=self._dataset, mode="r")
        except Exception:  # not an array: the overwrite rules decide
            return None
        return dict(existing.attrs).get(RECORD)

    def write(self, corner, data: np.ndarray) -> None:
        box = tuple(slice(c, c + e) for c, e in zip(corner, data.shape[-3:]))
        self._array[(slice(None),) * (data.ndim - 3) + box] = data

    def record(self, record: dict) -> None:
        self._array.attrs[RECORD] = record  # rewrites the metadata file whole (written aside, then renamed)

    def close(self) -> None:
        self._array = None


class _Hdf5Writer:
    def __init__(self, container: Path, dataset: str, source: VolumeSource, chunks, compressor, _format):
        self.container, self._dataset, self._source = container, dataset, source
        self._chunks, self._compressor = chunks, compressor
        self._file = self._node = None

    @property
    def path(self) -> str:
        return f"{self.container}/{self._dataset}"

    def prepare(self, record: dict, overwrite: bool, lock: OutputLock) -> int:
        """Open the output to continue it (returns the tiles done), or create it with its record (returns 0)."""
        self._file = open_hdf5_for_writing(self.container)
        if self._dataset in self._file:
            node = self._file[self._dataset]
            previous = node.attrs.get(RECORD) if isinstance(node, h5py.Dataset) else None
            previous = json.loads(previous) if isinstance(previous, str) else None
            half_made = previous is None and lock.was_creating(self._dataset)
            if not half_made and _resumable(previous, record, self.path, overwrite):
                self._node = node
                return int(previous.get("done", 0))
            _remove_own(remove_hdf5_output, self._file, self._dataset, lock)
        lead = tuple(self._source.full_shape[:-3])
        with lock.creating(self._dataset):
            self._node = self._file.create_dataset(
                self._dataset, shape=self._source.full_shape, dtype=np.dtype(self._source.dtype).newbyteorder("="),
                chunks=lead + self._chunks, compression=None if self._compressor == "none" else "gzip")
            for key, value in _carried_attributes(self._source).items():
                self._node.attrs[key] = value
            self._node.attrs[RECORD] = json.dumps(dict(record, done=0, complete=False))
            self._file.flush()
        return 0

    def write(self, corner, data: np.ndarray) -> None:
        box = tuple(slice(c, c + e) for c, e in zip(corner, data.shape[-3:]))
        self._node[(slice(None),) * (data.ndim - 3) + box] = data
        self._file.flush()  # the tile's chunks are on disk before the record says so

    def record(self, record: dict) -> None:
        self._node.attrs[RECORD] = json.dumps(record)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._node = None
            self._file.close()
            self._file = None


def zarr_compressor(name: str, zarr_format: int, zarr):
    """The codec object for ``name``: numcodecs for zarr v2 metadata, zarr's own codecs for v3; None for none."""
    if name == "none":
        return None
    if zarr_format == 2:
        import numcodecs
        return {"zstd": lambda: numcodecs.Zstd(level=3), "blosc": numcodecs.Blosc, "gzip": numcodecs.GZip}[name]()
    return {"zstd": lambda: zarr.codecs.ZstdCodec(level=3), "blosc": zarr.codecs.BloscCodec,
            "gzip": zarr.codecs.GzipCodec}[name]()


def _carried_attributes(source: VolumeSource) -> dict:
    """The source's own attributes (JSON-compatible ones), with its resolution and offset in (z, y, x)."""
    carried = {}
    for key, value in source.attributes().items():
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, np.generic):
            value = value.item()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        carried[key] = value
    for key in GEOMETRY_KEYS:  # the source's own, in its stored axis order; the output's are written anew
        carried.pop(key, None)
    if source.resolution is not None:
        carried["resolution"] = [float(r) for r in source.resolution]
    if source.offset is not None:
        carried["offset"] = [float(o) for o in source.offset]
    for record in RECORDS:  # a copy is not the run a record describes: ownership and resumes would trust it
        carried.pop(record, None)
    return carried
