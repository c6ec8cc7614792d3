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

import contextlib
import json
import os
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from .._checks import flag, integer, is_integer, triple
from .._threads import Terminated, raise_terminated
from ._geometry import GEOMETRY_KEYS
from ._hdf5 import plain_attribute
from ._open import open_source
from ._outputs import (RECORDS, NotOwnOutputError, OutputLock, add_ome_pyramid, check_free_space,
                       check_input_unchanged, check_output_location, fingerprints, forget_ome_pyramid, given, image_paths,
                       option, placement, recordable, refuse_if_unfinished, remove_zarr_output, stored_in_file,
                       zarr_store_format)
from ._progress import plural, progress_bar
from ._pyramid import DOWNSAMPLING, default_downsampling, downsample, level_factors, level_geometry
from ._source import VolumeSource
from ._writer import COMPRESSIONS, OutputWriter, check_compression, compression_option, parse_output

#: The former name of :data:`~emfast.io.COMPRESSIONS`, kept as an alias.
COMPRESSORS = COMPRESSIONS
#: Most bytes of one tile read and written at a time (whole chunks, all channels).
TILE_BYTES = 256 << 20
#: Output chunk edge when the source has no chunks (clipped to the volume).
CHUNK_EDGE = 64
RECORD = "emfast_convert"
#: How an interrupted conversion continues.
AGAIN = "run the same conversion again to continue"

__all__ = ["COMPRESSORS", "ConvertError", "ConvertWriteError", "Conversion", "convert", "progress_bar"]


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


def convert(source_path, destination, *, chunks: Optional[Sequence[int]] = None, compression: Optional[str] = None,
            zarr_format: int = 3, overwrite: bool = False, progress: Optional[Callable[[int, int], None]] = None,
            tile_bytes: Optional[int] = None, levels: int = 1, downsampling: Optional[str] = None,
            compressor: Optional[str] = None, storage_options: Optional[dict] = None, level: Optional[int] = None,
            resolution: Optional[Sequence[float]] = None) -> Conversion:
    """Convert the volume at ``source_path`` (any form :func:`emfast.open` takes) to ``destination``
    (``out.zarr/raw`` or ``out.h5/raw``), optionally with a multiscale pyramid.

    Parameters
    ----------
    source_path : str or pathlib.Path
        The volume to convert: ``file.h5/dataset``, a zarr or N5 array, an OME-Zarr image, a precomputed volume, or
        a URL (with ``storage_options``).
    destination : str or pathlib.Path
        ``out.zarr/raw`` (zarr) or ``out.h5/raw`` (HDF5): the container and the array's path inside it.
    chunks : (int, int, int), optional
        Output chunks (z, y, x); default the source's, else 64 per axis; clipped to the volume's shape.
    compression : {"zstd", "blosc", "gzip", "none"}, optional
        Default "zstd" for zarr, "gzip" for HDF5 (which takes only "gzip" or "none"). The same option as
        :func:`emfast.predict`'s.
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
    levels : int
        Levels of a multiscale pyramid (zarr only). With more than 1, ``destination`` becomes an OME-NGFF image
        group holding the levels ``s0`` (the source), ``s1``, ...; see :mod:`emfast.io._pyramid` for which axes
        each level halves and where its voxels lie.
    downsampling : {"mean", "mode"}, optional
        How a level is made from the one below: ``mean`` for intensities, ``mode`` (most frequent value, ties to
        the lowest) for labels. Default ``mode`` for 32- and 64-bit integers, else ``mean``. Only with
        ``levels`` > 1.
    compressor : str, optional
        Deprecated name of ``compression``.
    storage_options : dict, optional
        For a remote source (``s3://``, ``gs://``, ``http(s)://``): fsspec's options, as :func:`emfast.open`
        takes them (e.g. ``{"endpoint_url": ...}`` for an S3-compatible server).
    level, resolution : optional
        For an OME-Zarr image or a precomputed volume: the level (scale) to convert, by index or by its (z, y, x)
        voxel size, as :func:`emfast.open` takes them (default: the finest).

    Returns
    -------
    Conversion

    Raises
    ------
    ConvertError
        A setting does not apply (also: ``levels`` would halve an axis of one voxel), the output is the source (or
        inside it, or contains it), or it exists and may not be resumed or replaced; also when the source changed
        since the output was started.
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
    never needs more than its raw bytes) and, without compression, for the whole rest up front. Each level of a
    pyramid is an output of its own, made from the level below with its own record: a rerun continues with the
    first unfinished level, and a rerun with more levels adds them.
    """
    try:
        container, dataset, kind = parse_output(destination, "destination")
        compression = check_compression(compression_option(compression, compressor), kind)
        overwrite = flag(overwrite, "overwrite")  # overwrite="no" (a str, so true) replaced the output
        if chunks is not None:
            chunks = triple(chunks, "chunks", minimum=1)
        if tile_bytes is not None:
            tile_bytes = integer(tile_bytes, "tile_bytes")
    except (TypeError, ValueError) as error:
        raise ConvertError(str(error)) from None
    if not (progress is None or callable(progress)):  # else found after the output's metadata was written
        raise ConvertError(f"progress must be a callable taking (tiles done, tiles), got {progress!r}")
    if zarr_format not in (2, 3):
        raise ConvertError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    zarr_format = int(zarr_format)  # np.int64(2) as given: the record needs a JSON int
    if not is_integer(levels) or levels < 1:
        raise ConvertError(f"levels must be an integer >= 1, got {levels!r}")
    if levels > 1 and kind != "zarr":
        raise ConvertError(f"levels={levels}: a multiscale pyramid is written to zarr (an OME-NGFF image), not to "
                           f"the HDF5 file {container}")
    if downsampling is not None and downsampling not in DOWNSAMPLING:
        raise ConvertError(f"downsampling must be one of {', '.join(DOWNSAMPLING)}, got {downsampling!r}")
    if downsampling is not None and levels == 1:  # else silently unused: the copy has no level to make
        raise ConvertError(f"{given('downsampling', downsampling)} makes the coarser levels of a pyramid; with "
                           f"{given('levels', 1)} there are none: give more levels, or leave downsampling out")
    if kind == "zarr":  # an existing store keeps its format: a root of the other one would hide its arrays
        zarr_format = zarr_store_format(container) or zarr_format
    if not isinstance(source_path, (str, os.PathLike)):  # an array: Volume.from_array's hint would lead nowhere
        raise ConvertError(f"source_path must be the path of a file or store (any form emfast.open takes), got a "
                           f"{type(source_path).__module__}.{type(source_path).__name__}: convert copies stored "
                           "volumes; write an array in memory with zarr-python or h5py")
    source = open_source(source_path, level=level, resolution=resolution, storage_options=storage_options)
    try:
        # a copy carries no record: its unwritten voxels would pass for data
        refuse_if_unfinished(source, str(source_path), "a copy would hold what was not written as data",
                             ConvertError)
        if 0 in tuple(source.full_shape):  # a volume never is (see emfast.open); its tiles would be none
            raise ConvertError(f"{source_path}: volume is empty (shape {tuple(source.full_shape)}); there is nothing "
                               "to convert")
        try:
            check_output_location(container, dataset, kind, source.stamp, "source")
            factors = level_factors(source.full_shape[-3:], source.resolution, levels, str(destination))
        except ValueError as error:
            raise ConvertError(str(error)) from None
        settings = dict(chunks=_output_chunks(chunks, source), compression=compression, tile_bytes=tile_bytes,
                        format="hdf5" if kind == "hdf5" else f"zarr{zarr_format}")
        if levels == 1:
            return _convert_level(source, container, dataset, kind, zarr_format, settings, overwrite, progress)
        rule = downsampling or default_downsampling(source.dtype)
        return _convert_pyramid(source, container, dataset, zarr_format, settings, factors, rule, overwrite,
                                progress)
    finally:
        source.close()


def _level_plan(full_shape, dtype, settings: dict, factor=None, rule=None):
    """(shape, chunks, tiles) of an output of ``full_shape`` (downsampled by ``factor`` with ``rule`` if given)."""
    if factor is not None:
        full_shape = tuple(full_shape[:-3]) + tuple(-(-s // f) for s, f in zip(full_shape[-3:], factor))
    chunks = tuple(min(c, s) for c, s in zip(settings["chunks"], full_shape[-3:]))
    tile_bytes = settings["tile_bytes"] or TILE_BYTES
    if factor is not None:  # the tile's source box is up to 8 times larger, and mode compares 8 by 8 values
        tile_bytes //= int(np.prod(factor)) * (8 if rule == "mode" else 1)
    return full_shape, chunks, _tiles(full_shape, chunks, np.dtype(dtype).itemsize, tile_bytes)


def _convert_level(source: VolumeSource, container: Path, dataset: str, kind: str, zarr_format: int, settings: dict,
                   overwrite: bool, progress, factor=None, rule=None, geometry=None,
                   lock: Optional[OutputLock] = None) -> Conversion:
    """Write ``source`` (downsampled by ``factor`` with ``rule`` when given) to ``container/dataset``, under
    ``lock`` (a pyramid's, held for all its levels) or a lock of its own."""
    full_shape, chunks, tiles = _level_plan(source.full_shape, source.dtype, settings, factor, rule)
    whole, data = fingerprints(source.stamp)  # data: checked again before the output is recorded complete
    record = {"source": {"path": recordable(str(source.stamp.path)), "dataset": recordable(source.stamp.dataset),
                         "fingerprint": whole, **placement(source.stamp)},
              "shape": list(full_shape), "dtype": np.dtype(source.dtype).newbyteorder("=").str,
              "chunks": list(chunks), "tile": list(tiles[0][1]), "tiles": len(tiles),
              "compression": settings["compression"], "format": settings["format"]}
    if factor is not None:
        record.update(downsampling=rule, factor=list(factor))
    resolution, offset = geometry or (source.resolution, source.offset)
    with contextlib.nullcontext(lock) if lock is not None else OutputLock(container) as lock:
        writer = OutputWriter(container, dataset, kind, RECORD, refused=ConvertError, zarr_format=zarr_format)
        try:
            writer.open_to_check()
            previous = writer.prepare(lock, dict(record, done=0, complete=False), resume=True, overwrite=overwrite,
                                      input_key="source", what="conversion", unchecked=("done", "complete"),
                                      input_in_file=stored_in_file(source.stamp),
                                      shape=full_shape, dtype=source.dtype, chunks=chunks,
                                      compression=settings["compression"], resolution=resolution, offset=offset,
                                      translation=source.translation if geometry is None else None,
                                      attributes=_carried_attributes(source))
            done = 0 if previous is None else int(previous.get("done", 0))
            read = _reader(source, factor, rule)
            _copy(read, source, writer, record, tiles, done, progress, data)
        finally:
            writer.close()
    return Conversion(container, len(tiles), len(tiles) - done)


#: The names of emfast's pyramid levels.
LEVEL_NAME = re.compile(r"s[0-9]+")


def _convert_pyramid(source: VolumeSource, container: Path, dataset: str, zarr_format: int, settings: dict,
                     factors, rule: str, overwrite: bool, progress) -> Conversion:
    """Write ``source`` as level ``s0`` of the OME-NGFF image ``container/dataset``, then each level from the one
    below it; the image's multiscales list every level with its voxel size and offset. One lock is held for the
    whole pyramid: another writer let in between two levels would make this run fail half way."""
    with OutputLock(container) as lock:
        return _write_pyramid(source, container, dataset, zarr_format, settings, factors, rule, overwrite,
                              progress, lock)


def _write_pyramid(source: VolumeSource, container: Path, dataset: str, zarr_format: int, settings: dict,
                   factors, rule: str, overwrite: bool, progress, lock: OutputLock) -> Conversion:
    """:func:`_convert_pyramid`'s work, under its ``lock``."""
    node = container / dataset
    if _is_zarr_array(node):
        if not overwrite:
            raise ConvertError(f"{container}/{dataset} is an array; a pyramid's levels go into a group of that name: "
                               f"choose another output, or pass {option('overwrite')} to replace it (emfast's own "
                               "only)")
        _remove_own(container, dataset, lock)  # emfast's array, replaced by the pyramid; another's never
    listed = image_paths(node) or []
    if any(not LEVEL_NAME.fullmatch(path) for path in listed):
        raise ConvertError(f"{container}/{dataset} is an OME-NGFF image of other datasets ({', '.join(listed)}): "
                           "emfast writes a pyramid into a new group or one of its own; choose another output")
    others = sorted(entry.name for entry in (node.iterdir() if node.is_dir() else ())
                    if entry.is_dir() and not entry.name.startswith(".") and not LEVEL_NAME.fullmatch(entry.name))
    if not listed and others:  # another program's group: its image metadata would be written over its own
        raise ConvertError(f"{container}/{dataset} is a group holding other datasets ({', '.join(others)}): emfast "
                           "writes a pyramid into a new group or one of its own; choose another output")
    stale = [path for path in listed if int(path[1:]) > len(factors)]  # levels of the image this one replaces
    if overwrite:  # every level to replace or remove emfast's own, before anything is written
        _remove_levels(container, dataset, [f"s{level}" for level in range(len(factors) + 1)] + stale, lock,
                       delete=False)
        if listed:  # the image replaced: described until the new one is, at the end
            forget_ome_pyramid(container, dataset, listed)
    shape, counts = source.full_shape, []
    for factor in [None] + list(factors):  # one progress count over every level's tiles
        shape, _, level_tiles = _level_plan(shape, source.dtype, settings, factor, rule)
        counts.append(len(level_tiles))

    def progress_of(level: int):
        before = sum(counts[:level])
        return None if progress is None else lambda done, _: progress(before + done, sum(counts))

    done = _convert_level(source, container, f"{dataset}/s0", "zarr", zarr_format, settings, overwrite,
                          progress_of(0), lock=lock)
    tiles, written = done.tiles, done.written
    # OME-NGFF translations, from the source's (a binned level's centre, where the source is one)
    geometry = [(source.resolution, source.offset if source.translation is None else source.translation)]
    for level, factor in enumerate(factors, 1):
        geometry.append(level_geometry(*geometry[-1], factor))
        below = open_source(f"{container}/{dataset}/s{level - 1}")
        try:
            # funlib's offset is the corner of the first voxel, where level 0 starts; OME's translation, the
            # centre, is in geometry
            done = _convert_level(below, container, f"{dataset}/s{level}", "zarr", zarr_format, settings,
                                  overwrite, progress_of(level), factor, rule, (geometry[-1][0], source.offset),
                                  lock)
        finally:
            below.close()
        tiles, written = tiles + done.tiles, written + done.written
    if overwrite:
        _remove_levels(container, dataset, stale, lock, delete=True)
    add_ome_pyramid(container, dataset, len(source.full_shape),
                    [(f"s{level}", *level_geometry(*g, (1, 1, 1))) for level, g in enumerate(geometry)],
                    replace=overwrite)
    return Conversion(container, tiles, written)


def _remove_levels(container: Path, dataset: str, paths, lock: OutputLock, delete: bool) -> None:
    """Remove the pyramid levels ``paths`` of the image ``container/dataset`` (``delete`` False: only check that
    each is emfast's to remove); ConvertError naming one that is not."""
    for path in paths:
        _remove_own(container, f"{dataset}/{path}", lock, delete)


def _remove_own(container: Path, dataset: str, lock: OutputLock, delete: bool = True) -> None:
    """Remove the zarr array ``container/dataset`` if emfast wrote it (``delete`` False: only check that it
    did); ConvertError otherwise."""
    try:
        remove_zarr_output(container, dataset, lock, delete=delete)
    except NotOwnOutputError as error:
        raise ConvertError(str(error)) from None


def _is_zarr_array(node: Path) -> bool:
    """Whether ``node`` is a zarr array; damaged metadata there is a StoreMetadataError naming the file."""
    from ._zarr import check_metadata_json, is_zarr_array
    check_metadata_json(node, str(node))
    return is_zarr_array(node)


def _reader(source: VolumeSource, factor, rule):
    """read(corner, extent, dtype, channels) of a tile: the source's box, or the box below a downsampled tile."""
    def read(corner, extent, channels: int, dtype) -> np.ndarray:
        if factor is None:
            data = np.empty((channels,) + tuple(extent), dtype)
            source.read(corner, extent, data)
            return data
        start = [c * f for c, f in zip(corner, factor)]
        stop = [min((c + e) * f, s) for c, e, f, s in zip(corner, extent, factor, source.full_shape[-3:])]
        data = np.empty((channels,) + tuple(b - a for a, b in zip(start, stop)), dtype)
        source.read(start, [b - a for a, b in zip(start, stop)], data)
        return downsample(data, factor, rule)
    return read


def _output_chunks(chunks, source: VolumeSource) -> tuple:
    """The output's chunks: as given, else the source's, else :data:`CHUNK_EDGE`; clipped to the volume (HDF5
    refuses a chunk larger than its dataset)."""
    chunks = tuple(int(c) for c in (chunks or source.chunks or (CHUNK_EDGE,) * 3))
    if len(chunks) != 3 or min(chunks) < 1:
        raise ConvertError(f"chunks must be three sizes >= 1 (z, y, x), got {chunks}")
    return tuple(min(c, s) for c, s in zip(chunks, source.full_shape[-3:]))


def _copy(read, source: VolumeSource, writer: OutputWriter, record: dict, tiles, done: int, progress,
          started: Optional[dict]) -> None:
    """Copy the tiles after the first ``done`` (each from ``read``), recording each once its data is written;
    ``started``: the source's data-only fingerprint when the run began, taken again before the last tile."""
    lead = len(source.full_shape) - 3
    channels = source.full_shape[0] if lead else 1
    dtype = np.dtype(source.dtype).newbyteorder("=")
    if record["compression"] == "none":  # the whole rest's size is known: refuse up front rather than half way
        left = sum(channels * int(np.prod(extent)) for _, extent in tiles[done:]) * dtype.itemsize
        count = len(tiles) - done
        check_free_space(writer.container, left, f"writing the {count} {plural(count, 'tile')} left", AGAIN)
    if progress is not None and done < len(tiles):
        progress(done, len(tiles))
    with _interrupt_between_tiles() as interrupted:
        for number in range(done, len(tiles)):
            if interrupted:
                raise _interruption(interrupted)
            _copy_tile(read, writer, record, tiles, number, channels, dtype, lead,
                       lambda: check_input_unchanged(source.stamp, started, writer.path, f"convert it again with "
                                                     f"{option('overwrite')} once it no longer changes"))
            if progress is not None:
                progress(number + 1, len(tiles))
        if interrupted:  # during the last tile: this array is complete, the next level is not begun
            raise _interruption(interrupted)


def _interruption(signals) -> KeyboardInterrupt:
    """What the signals noted stop the conversion with: SIGTERM's :class:`~emfast._threads.Terminated`, else
    Ctrl-C's KeyboardInterrupt."""
    return Terminated() if signal.SIGTERM in signals else KeyboardInterrupt()


@contextmanager
def _interrupt_between_tiles() -> Iterator[list]:
    """Within the block, a first Ctrl-C (SIGINT), or SIGTERM where the CLI takes it as an interrupt, only appends
    to the list yielded, for the loop to stop after the tile being written; a second one interrupts at once. zarr
    reads and writes on its own event-loop thread, and an interruption in the middle leaves that loop running: its
    tasks' tracebacks flood the terminal at exit. Outside the main thread, or under other handlers, nothing
    changes."""
    interrupted: list = []
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    ours = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: raise_terminated}  # Python's, the CLI's

    def note(signum, frame) -> None:
        if interrupted:
            raise _interruption(interrupted + [signum])
        interrupted.append(signum)

    replaced = []
    try:
        for signum in [signum for signum, handler in ours.items() if signal.getsignal(signum) is handler]:
            signal.signal(signum, note)
            replaced.append(signum)
        yield interrupted
    finally:
        for signum in replaced:
            signal.signal(signum, ours[signum])


def _copy_tile(read, writer: OutputWriter, record: dict, tiles, number: int, channels: int, dtype, lead: int,
               unchanged: Optional[Callable[[], None]] = None):
    """Read tile ``number``, write it and record it done; before the last is recorded (the output complete),
    ``unchanged()`` raises if the source changed meanwhile."""
    corner, extent = tiles[number]
    data = read(corner, extent, channels, dtype)
    last = number + 1 == len(tiles)
    if last and unchanged is not None:  # every read of the source done
        unchanged()
    # A tile never costs more than its raw bytes (and the margin): checked before the write, as HDF5 cannot
    # recover from a full disk (its file can no longer be closed, and the process crashes at exit).
    check_free_space(writer.container, data.nbytes, f"writing tile {number + 1} of {len(tiles)}", AGAIN)
    try:
        writer.write(corner, data if lead else data[0])
        writer.set_record(dict(record, done=number + 1, complete=last))
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


#: Attributes of other conventions that name a source's axes in its stored order (xarray's zarr v2
#: ``_ARRAY_DIMENSIONS``, N5 ``axes``, ilastik's ``axistags``): carried to a (c, z, y, x) output, they would
#: mislabel it (xarray read a source stored (x, y, z) as converted with x and z swapped; emfast read an ilastik
#: export's HDF5 copy with its channels taken from x).
SOURCE_AXES_KEYS = ("_ARRAY_DIMENSIONS", "axes", "axistags")


def _carried_attributes(source: VolumeSource) -> dict:
    """The source's own attributes (JSON-compatible ones), with its resolution and offset in (z, y, x)."""
    carried = {}
    for key, value in source.attributes().items():
        try:  # HDF5's fixed-length strings (MATLAB's, older tools') come as bytes: text, as the geometry reads them
            value = plain_attribute(value)
        except UnicodeDecodeError:
            continue
        try:  # what JSON holds (NaN too: an HDF5 output keeps it; a zarr one's writer leaves it out, saying so)
            json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            continue
        carried[key] = value
    # the source's own, in its stored axis order; the output's are written anew
    for key in GEOMETRY_KEYS + SOURCE_AXES_KEYS:
        carried.pop(key, None)
    if source.resolution is not None:
        carried["resolution"] = [float(r) for r in source.resolution]
    if source.offset is not None:
        carried["offset"] = [float(o) for o in source.offset]
    for record in RECORDS:  # a copy is not the run a record describes: ownership and resumes would trust it
        carried.pop(record, None)
    return carried
