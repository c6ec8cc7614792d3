"""N5 datasets as volume sources, read-only.

zarr-python 3 no longer reads N5, and the format is small, so emfast reads it itself, following the N5
specification (https://github.com/saalfeldlab/n5): a container directory whose root ``attributes.json`` holds
``"n5"``; per dataset an ``attributes.json`` with ``dimensions``, ``blockSize``, ``dataType`` and
``compression`` (all in N5's (x, y, z) order); one file per block at ``dataset/ix/iy/iz`` that starts with a
big-endian header (mode uint16, ndim uint16, the block's size per dimension uint32, and for mode 1 the number of
elements uint32) followed by the compressed big-endian elements, x varying fastest. A block that was never
written is absent and reads as 0 (N5 has no fill value). Blocks at the volume's far edges may be smaller.

Codecs: raw, gzip and zlib, bzip2 and xz from the standard library, which decompress outside the GIL; blosc,
zstd and lz4 through numcodecs (``emfast[zarr]``).
"""
from __future__ import annotations

import bz2
import json
import lzma
import os
import struct
import zlib
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from ._metadata import voxel_metadata
from ._source import DatasetNotFoundError, Stamp, VolumeSource

#: Attributes that describe the N5 layout itself, not the data.
_STRUCTURE = {"dimensions", "blockSize", "dataType", "compression", "compressionType", "resolution", "offset",
              "pixelResolution"}
_DTYPES = {name: np.dtype(name).newbyteorder(">") for name in
           ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float64")}


def is_n5(path: Path) -> bool:
    """True for a directory that is an N5 container (its root attributes name the N5 version)."""
    attributes = path / "attributes.json"
    try:
        return attributes.is_file() and "n5" in json.loads(attributes.read_text())
    except (OSError, ValueError):
        return False


def list_n5_datasets(root: Path) -> list[str]:
    """Paths of every dataset below an N5 container."""
    found = []
    for attributes in sorted(root.rglob("attributes.json")):
        try:
            if "dimensions" in json.loads(attributes.read_text()):
                found.append(attributes.parent.relative_to(root).as_posix())
        except (OSError, ValueError):
            continue
    return found


class N5Source(VolumeSource):
    """One dataset of an N5 container. Resolution and offset come from funlib's ``resolution``/``offset`` (stored
    in (x, y, z) order in N5) or from ``pixelResolution``."""

    def __init__(self, path: Union[str, os.PathLike], dataset: str) -> None:
        root = Path(path)
        dataset = dataset.strip("/")
        self.name = f"{root}:{dataset}"
        if not root.is_dir():
            raise FileNotFoundError(f"N5 container not found: {root}")
        attributes = root / dataset / "attributes.json"
        try:
            meta = json.loads(attributes.read_text())
        except FileNotFoundError:
            raise DatasetNotFoundError(f"dataset {dataset!r} not found in {root}; datasets there: "
                                       f"{', '.join(list_n5_datasets(root)) or 'none'}") from None
        except (OSError, ValueError) as error:
            raise OSError(f"{self.name}: cannot read {attributes}: {error}") from error
        if "dimensions" not in meta:
            raise DatasetNotFoundError(f"{self.name} is a group, not a dataset; datasets there: "
                                       f"{', '.join(list_n5_datasets(root / dataset)) or 'none'}")
        dimensions, block = meta.get("dimensions"), meta.get("blockSize")
        if not isinstance(dimensions, list) or not isinstance(block, list) or len(dimensions) != len(block) \
                or len(dimensions) not in (3, 4):
            raise ValueError(f"{self.name}: inconsistent metadata: dimensions {dimensions!r} and blockSize "
                             f"{block!r} must be lists of 3 (x, y, z) or 4 (x, y, z, c) sizes")
        if meta.get("dataType") not in _DTYPES:
            raise TypeError(f"{self.name}: unsupported N5 dataType {meta.get('dataType')!r}")
        self._stored = _DTYPES[meta["dataType"]]
        self.dtype = self._stored
        self.full_shape = tuple(int(d) for d in reversed(dimensions))
        self._block = tuple(int(b) for b in reversed(block))
        self.chunks = self._block[-3:]
        self._decode = _decoder(meta.get("compression", {"type": meta.get("compressionType", "raw")}), self.name)
        self._directory = root / dataset
        self._root, self._dataset = root, dataset
        self.resolution, self.offset = voxel_metadata(meta, self.name, reversed_order=True)
        self.stamp = Stamp.of(root, dataset, attributes)
        self._attributes = {k: v for k, v in meta.items() if k not in _STRUCTURE}

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        lead = len(self.full_shape) - 3
        stop = [int(c) + int(e) for c, e in zip(corner, extent)]
        ranges = [range(int(c) // b, (s - 1) // b + 1) for c, s, b in zip(corner, stop, self.chunks)]
        channel_blocks = range(0, (self.full_shape[0] + self._block[0] - 1) // self._block[0]) if lead else [None]
        target = out if lead else out[0]
        for channel in channel_blocks:
            for index in np.ndindex(*(len(r) for r in ranges)):
                key = tuple(r[i] for r, i in zip(ranges, index))
                origin = [k * b for k, b in zip(key, self.chunks)]
                block = self._block_data(((channel,) if lead else ()) + key)
                lo = [max(int(c), o) for c, o in zip(corner, origin)]
                hi = [min(s, o + b) for s, o, b in zip(stop, origin, self.chunks)]
                into = tuple(slice(a - int(c), b - int(c)) for a, b, c in zip(lo, hi, corner))
                if lead:
                    c0 = channel * self._block[0]
                    into = (slice(c0, min(c0 + self._block[0], self.full_shape[0])),) + into
                if block is None:
                    target[into] = 0
                    continue
                take = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin))
                target[into] = block[((slice(None),) if lead else ()) + take]

    def _block_data(self, key) -> np.ndarray:
        """Block ``key`` ((c,) z, y, x block indices) as an array of its stored size, or None if never written."""
        path = self._directory.joinpath(*(str(k) for k in reversed(key)))
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        where = f"{self.name}: block {'/'.join(str(k) for k in reversed(key))}"
        try:
            mode, ndim = struct.unpack(">HH", data[:4])
            sizes = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
            start = 4 + 4 * ndim + (4 if mode == 1 else 0)
            if mode not in (0, 1) or ndim != len(self.full_shape):
                raise ValueError(f"unsupported block header (mode {mode}, {ndim} dimensions)")
            shape = tuple(reversed(sizes))
            count = int(np.prod(shape))
            raw = self._decode(data[start:], count * self._stored.itemsize)
            if len(raw) < count * self._stored.itemsize:
                raise ValueError(f"{len(raw)} bytes decoded, {count * self._stored.itemsize} expected")
            return np.frombuffer(raw, self._stored, count).reshape(shape)
        except (ValueError, struct.error, OSError, EOFError, zlib.error, lzma.LZMAError) as error:
            raise OSError(f"{where} is corrupt: {error}") from error

    def attributes(self) -> dict:
        return dict(self._attributes)

    def reopen_arguments(self) -> tuple:
        return str(self._root), self._dataset


def _decoder(compression, name: str):
    """A function (compressed bytes, expected size) -> bytes for an N5 ``compression`` entry."""
    kind = compression.get("type") if isinstance(compression, dict) else None
    if kind == "raw":
        return lambda data, size: data
    if kind in ("gzip", "zlib"):
        wbits = 47 if kind == "gzip" and compression.get("useZlib") is not True else 15  # 47: gzip or zlib header
        return lambda data, size: zlib.decompress(data, wbits, size)
    if kind == "bzip2":
        return lambda data, size: bz2.decompress(data)
    if kind == "xz":
        return lambda data, size: lzma.decompress(data)
    if kind in ("blosc", "zstd", "lz4"):
        try:
            import numcodecs
        except ImportError:
            raise ImportError(f"{name}: reading {kind}-compressed N5 needs numcodecs; install it with "
                              "pip install 'emfast[zarr]'") from None
        codec = {"blosc": numcodecs.Blosc, "zstd": numcodecs.Zstd, "lz4": numcodecs.LZ4}[kind]()
        return lambda data, size: codec.decode(data)
    raise ValueError(f"{name}: unsupported N5 compression {compression!r}; supported: raw, gzip, zlib, bzip2, xz, "
                     "blosc, zstd, lz4")
