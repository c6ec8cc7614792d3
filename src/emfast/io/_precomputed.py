"""Neuroglancer precomputed volumes as volume sources, through tensorstore (the optional extra
``emfast[tensorstore]``), read-only.

The ``info`` file lists scales; each has a ``resolution`` and a ``voxel_offset`` in (x, y, z) order, and
tensorstore's domain is (x, y, z, channel). emfast reads (c, z, y, x) with voxel (0, 0, 0) at the scale's voxel
offset, whose world position (nm) becomes the volume's ``offset``. tensorstore decodes with its own thread pool.

The ``info`` is checked here before tensorstore reads it (a non-empty ``scales``, each with its ``key``, ``size``,
``resolution``, ``voxel_offset``, ``chunk_sizes`` and ``encoding``), so malformed metadata is a
:class:`~emfast.io._source.StoreMetadataError` naming the key and the value.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ._metadata import bad_metadata, int_list, metadata_key, number_list
from ._source import (CorruptChunkError, Stamp, StoreMetadataError, VolumeSource, checked_chunk, read_regular_file,
                      require_kind)


def tensorstore_missing() -> Optional[str]:
    """Why precomputed volumes cannot be read here, or None if they can."""
    try:
        import tensorstore  # noqa: F401
    except ImportError as error:
        return f"reading neuroglancer precomputed needs tensorstore ({error}); pip install 'emfast[tensorstore]'"
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


def read_info(path: Path, name: str) -> dict:
    """The ``info`` of a precomputed volume, checked for what emfast and tensorstore rely on.

    Raises
    ------
    FileNotFoundError
        No ``info`` file.
    StoreMetadataError
        A key missing or holding a bad value, naming the volume, the key (``scales[1].voxel_offset``) and value.
    """
    text = read_regular_file(path / "info", "a precomputed info") if path.is_dir() else None
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


class PrecomputedSource(VolumeSource):
    """One scale of a precomputed volume: ``scale`` by index (default 0, the finest), or by its (z, y, x)
    ``resolution``."""

    def __init__(self, path: Union[str, os.PathLike], scale: Optional[int] = None,
                 resolution: Optional[Sequence[float]] = None) -> None:
        path = Path(path)
        self.name = str(path)
        require_kind(path, "directory", "a precomputed volume")
        scales = read_info(path, self.name)["scales"]
        if resolution is not None:
            wanted = [float(r) for r in resolution][::-1]
            matches = [i for i, s in enumerate(scales) if np.allclose(s["resolution"], wanted)]
            if not matches:
                raise ValueError(f"{self.name}: no scale has resolution {tuple(resolution)}; scales (z, y, x): "
                                 + ", ".join(str(tuple(s["resolution"][::-1])) for s in scales))
            scale = matches[0]
        index = 0 if scale is None else scale
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(scales):
            raise ValueError(f"{self.name}: scale must be an index in [0, {len(scales)}), got {scale!r}")
        chosen = scales[index]
        reason = tensorstore_missing()
        if reason is not None:
            raise ImportError(reason)
        import tensorstore as ts
        try:
            self._store = ts.open({"driver": "neuroglancer_precomputed",
                                   "kvstore": {"driver": "file", "path": str(path.resolve())},
                                   "scale_index": index}, read=True, write=False).result()
        except Exception as error:  # what tensorstore refuses beyond the checks above
            raise StoreMetadataError(f"{self.name} (info): tensorstore cannot open scale {index}: {error}") from error
        self._origin = [int(o) for o in self._store.domain.inclusive_min[:3]]  # x, y, z
        x, y, z, c = (int(n) for n in self._store.domain.shape)
        self.full_shape = (c, z, y, x) if c > 1 else (z, y, x)
        self.dtype = np.dtype(self._store.dtype.numpy_dtype)
        self.chunks = tuple(int(n) for n in chosen["chunk_sizes"][0][::-1])
        self.resolution = tuple(float(r) for r in chosen["resolution"][::-1])
        self.offset = tuple(float(o) * r for o, r in zip(chosen["voxel_offset"][::-1], self.resolution))
        self._path, self._scale = path, index
        self.stamp = Stamp.of(path, f"scale {index}", path / "info")

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        z, y, x = (int(c) for c in corner)
        dz, dy, dx = (int(e) for e in extent)
        ox, oy, oz = self._origin
        where = f"{self.name}: the box at (z, y, x) = {tuple(int(c) for c in corner)}"
        try:
            data = self._store[ox + x:ox + x + dx, oy + y:oy + y + dy, oz + z:oz + z + dz].read().result()
        except Exception as error:
            raise CorruptChunkError(f"{where}: cannot read it: {error}") from error
        data = checked_chunk(np.ascontiguousarray(data), self.dtype, (dx, dy, dz, out.shape[0]), where, self.stamp)
        np.copyto(out, np.transpose(data, (3, 2, 1, 0)))

    def reopen_arguments(self) -> tuple:
        return str(self._path), self._scale
