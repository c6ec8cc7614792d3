"""``emfast convert``: copy a volume from any readable format into a zarr array (v2 or v3) or an HDF5 dataset,
tile by tile, resumably.

The output's attributes record the conversion (``emfast_convert``: the source as it was, the settings, the tiles
done so far), updated after every tile that was written completely. A run that stops for any reason (an error,
Ctrl-C, a killed process) is resumed by running the same command again: it checks that the source and the
settings are unchanged and continues after the last recorded tile. An existing output that is not an unfinished
conversion of the same source is refused unless ``overwrite`` is given. The source is opened read-only.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import h5py
import numpy as np

from ._open import open_source, split_path
from ._source import VolumeSource

COMPRESSORS = ("zstd", "blosc", "gzip", "none")
#: Most bytes of one tile read and written at a time (whole chunks, all channels).
TILE_BYTES = 256 << 20
RECORD = "emfast_convert"


class ConvertError(ValueError):
    """The output cannot be written as asked (it exists, it is the source, a setting does not apply)."""


def convert(source_path, destination, *, chunks: Optional[Sequence[int]] = None, compressor: str = "zstd",
            zarr_format: int = 3, overwrite: bool = False, progress: Optional[Callable[[int, int], None]] = None,
            tile_bytes: Optional[int] = None) -> Path:
    """Convert the volume at ``source_path`` (any form :func:`emfast.open` takes) to ``destination``
    (``out.zarr/raw`` or ``out.h5/raw``), returning the output container.

    Parameters
    ----------
    chunks : (int, int, int), optional
        Output chunks (z, y, x); default the source's, else (64, 64, 64).
    compressor : {"zstd", "blosc", "gzip", "none"}
        zarr codec; HDF5 outputs take "gzip" or "none".
    zarr_format : {2, 3}
        zarr output format.
    overwrite : bool
        Replace an existing output that is not an unfinished conversion of the same source.
    progress : callable, optional
        Called with (tiles done, tiles in all) after every tile.
    tile_bytes : int, optional
        Most bytes read and written at a time (default :data:`TILE_BYTES`).
    """
    container, dataset, kind = split_path(destination)
    if kind not in ("zarr", "hdf5") or not dataset:
        raise ConvertError(f"destination must name a dataset in a .zarr or .h5 container, e.g. out.zarr/raw; got "
                           f"{destination}")
    if compressor not in COMPRESSORS:
        raise ConvertError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {compressor!r}")
    if kind == "hdf5" and compressor not in ("gzip", "none"):
        raise ConvertError(f"HDF5 outputs support the compressors gzip and none, not {compressor}")
    if zarr_format not in (2, 3):
        raise ConvertError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    source = open_source(source_path)
    try:
        if source.stamp.path == container.resolve() or container.resolve() in source.stamp.path.parents:
            raise ConvertError(f"{destination} is inside the source {source.stamp.path}; write it elsewhere")
        chunks = tuple(int(c) for c in (chunks or source.chunks or (64, 64, 64)))
        if len(chunks) != 3 or min(chunks) < 1:
            raise ConvertError(f"chunks must be three sizes >= 1 (z, y, x), got {chunks}")
        record = {"source": {"path": str(source.stamp.path), "dataset": source.stamp.dataset,
                             "size": source.stamp.size, "mtime_ns": source.stamp.mtime_ns},
                  "shape": list(source.full_shape), "dtype": np.dtype(source.dtype).newbyteorder("=").str,
                  "chunks": list(chunks), "compressor": compressor,
                  "format": "hdf5" if kind == "hdf5" else f"zarr{zarr_format}"}
        writer = (_ZarrWriter if kind == "zarr" else _Hdf5Writer)(container, dataset, source, chunks, compressor,
                                                                   zarr_format)
        done = writer.prepare(record, overwrite)
        tiles = _tiles(source.full_shape, chunks, np.dtype(source.dtype).itemsize, tile_bytes or TILE_BYTES)
        lead = len(source.full_shape) - 3
        channels = source.full_shape[0] if lead else 1
        for number, (corner, extent) in enumerate(tiles):
            if number < done:
                continue
            data = np.empty((channels,) + extent, np.dtype(source.dtype).newbyteorder("="))
            source.read(corner, extent, data)
            writer.write(corner, data if lead else data[0])
            writer.record(dict(record, done=number + 1, complete=number + 1 == len(tiles)))
            if progress is not None:
                progress(number + 1, len(tiles))
        if not tiles or done >= len(tiles):
            writer.record(dict(record, done=len(tiles), complete=True))
        writer.close()
        return container
    finally:
        source.close()


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


class _ZarrWriter:
    def __init__(self, container: Path, dataset: str, source: VolumeSource, chunks, compressor, zarr_format):
        from ._zarr import import_zarr
        self._zarr = import_zarr()
        self._container, self._dataset, self._source = container, dataset, source
        self._chunks, self._compressor, self._format = chunks, compressor, zarr_format
        self._array = None

    def prepare(self, record: dict, overwrite: bool) -> int:
        zarr = self._zarr
        existing = None
        if self._container.exists():
            try:
                existing = zarr.open_array(str(self._container), path=self._dataset, mode="r")
            except Exception:  # absent (or not an array): checked below
                existing = None
            if existing is None and (self._container / self._dataset).exists() and not overwrite:
                raise ConvertError(f"{self._container}/{self._dataset} exists and is not an array; pass "
                                   "--overwrite to replace it")
        if existing is not None:
            previous = dict(existing.attrs).get(RECORD)
            same = previous is not None and all(previous.get(k) == v for k, v in record.items())
            if same and not overwrite:
                self._array = zarr.open_array(str(self._container), path=self._dataset, mode="r+")
                return int(previous.get("done", 0))
            if not overwrite:
                why = "it was not written by emfast convert" if previous is None else \
                    "it is a conversion with another source or other settings"
                raise ConvertError(f"{self._container}/{self._dataset} exists and {why}; pass --overwrite to "
                                   "replace it")
            shutil.rmtree(self._container / self._dataset, ignore_errors=True)
        compressors = zarr_compressor(self._compressor, self._format, zarr)
        root = zarr.open_group(str(self._container), mode="a", zarr_format=self._format)
        lead = tuple(self._source.full_shape[:-3])
        self._array = root.create_array(self._dataset, shape=self._source.full_shape, chunks=lead + self._chunks,
                                        dtype=np.dtype(self._source.dtype).newbyteorder("="),
                                        compressors=compressors, overwrite=overwrite)
        self._array.attrs.update(_carried_attributes(self._source))
        self._array.attrs[RECORD] = dict(record, done=0, complete=False)
        return 0

    def write(self, corner, data: np.ndarray) -> None:
        box = tuple(slice(c, c + e) for c, e in zip(corner, data.shape[-3:]))
        self._array[(slice(None),) * (data.ndim - 3) + box] = data

    def record(self, record: dict) -> None:
        self._array.attrs[RECORD] = record

    def close(self) -> None:
        pass


class _Hdf5Writer:
    def __init__(self, container: Path, dataset: str, source: VolumeSource, chunks, compressor, _format):
        self._container, self._dataset, self._source = container, dataset, source
        self._chunks, self._compressor = chunks, compressor
        self._file = None

    def prepare(self, record: dict, overwrite: bool) -> int:
        self._file = h5py.File(self._container, "a")
        node = self._file.get(self._dataset)
        if node is not None:
            previous = node.attrs.get(RECORD)
            previous = json.loads(previous) if isinstance(previous, str) else None
            same = previous is not None and all(previous.get(k) == v for k, v in record.items())
            if same and not overwrite:
                self._node = node
                return int(previous.get("done", 0))
            if not overwrite:
                self._file.close()
                raise ConvertError(f"{self._container}/{self._dataset} exists; pass --overwrite to replace it")
            del self._file[self._dataset]
        lead = tuple(self._source.full_shape[:-3])
        self._node = self._file.create_dataset(
            self._dataset, shape=self._source.full_shape, dtype=np.dtype(self._source.dtype).newbyteorder("="),
            chunks=lead + self._chunks, compression=None if self._compressor == "none" else "gzip")
        for key, value in _carried_attributes(self._source).items():
            self._node.attrs[key] = value
        self.record(dict(record, done=0, complete=False))
        return 0

    def write(self, corner, data: np.ndarray) -> None:
        box = tuple(slice(c, c + e) for c, e in zip(corner, data.shape[-3:]))
        self._node[(slice(None),) * (data.ndim - 3) + box] = data

    def record(self, record: dict) -> None:
        self._node.attrs[RECORD] = json.dumps(record)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


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
    if source.resolution is not None:
        carried["resolution"] = [float(r) for r in source.resolution]
    if source.offset is not None:
        carried["offset"] = [float(o) for o in source.offset]
    carried.pop(RECORD, None)
    return carried


def progress_bar(stream=None, unit: str = "tiles") -> Callable[[int, int], None]:
    """A one-line progress bar with the time left, redrawn in place on ``stream`` (default: standard error),
    counting ``unit``."""
    stream = sys.stderr if stream is None else stream
    start = time.monotonic()

    def draw(done: int, total: int) -> None:
        elapsed = time.monotonic() - start
        left = elapsed / done * (total - done) if done else 0.0
        filled = int(30 * done / total) if total else 30
        stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {unit}, {left:5.0f} s left ")
        if done == total:
            stream.write("\n")
        stream.flush()

    return draw
