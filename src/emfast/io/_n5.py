"""N5 datasets as volume sources, read-only.

zarr-python 3 no longer reads N5, and the format is small, so emfast reads it itself, following the N5
specification (https://github.com/saalfeldlab/n5): a container directory whose root ``attributes.json`` holds
``"n5"``; per dataset an ``attributes.json`` with ``dimensions``, ``blockSize``, ``dataType`` and
``compression`` (all in N5's (x, y, z) order); one file per block at ``dataset/ix/iy/iz`` that starts with a
big-endian header (mode uint16, ndim uint16, the block's size per dimension uint32, and for mode 1 the number of
elements uint32) followed by the compressed big-endian elements, x varying fastest. A block that was never
written is absent and reads as 0 (N5 has no fill value). Blocks at the volume's far edges may be clipped to the
volume (N5-Java, z5py) or whole (tensorstore), along every axis, channels included, never larger.

Every block is checked against the dataset's attributes, which are checked first (``dimensions``, positive
``blockSize`` of the same length, a known ``dataType`` and ``compression``): a header of another size, another
number of dimensions or a non-array mode, or data that decompresses to other than the header's size times the
element size, is a :class:`~emfast.io._source.CorruptChunkError` naming the block.

Codecs: raw, gzip and zlib, bzip2 and xz from the standard library, which decompress outside the GIL (a box's gzip
and zlib blocks are inflated in one call by the system's libdeflate where there is one, twice as fast as zlib:
:mod:`emfast.io._deflate`); blosc, zstd and lz4 through numcodecs (``emfast[zarr]``). lz4 comes in two framings:
n5-java (the reference) writes lz4-java's ``LZ4BlockOutputStream`` stream (blocks that start with the magic
``LZ4Block``), z5py a bare LZ4 block; the magic tells them apart.

Geometry comes from :mod:`emfast.io._geometry` with every list reversed (N5 lists x first), the axes named by
funlib's ``axis_names`` or by ``axes`` (tensorstore's N5 driver writes its dimension labels there, in the order of
``dimensions``, and neuroglancer reads them); datasets whose axes are named in another order than (c, z, y, x) (a
tensorstore array labelled ``["z", "y", "x"]`` is stored z first) are refused, naming the axes. A remote container
(:mod:`emfast.io._remote`) is read the same way, its blocks' bytes coming over the network.

Scale pyramids as n5-viewer, N5 Spark and BigDataViewer lay them out (n5-viewer's README): levels ``s0``, ``s1``,
... of full resolution first, each level below s0 stating its ``downsamplingFactors`` (or its group stating
them for every level, as ``scales`` or ``downsamplingFactors``), and ``pixelResolution`` stating s0's voxel size,
on the level or on its group (the container's root holds the defaults of the channel groups directly below it). A level's voxel size is then
``pixelResolution`` times its factors (saalfeldlab's N5 metadata parsers place a level's voxel i at
``pixelResolution * (f * i + (f - 1) / 2)``, the centre of the s0 voxels it covers), and its corner is s0's.
Paintera's data groups and cluster_tools' multiscale groups state s0's voxel size instead as ``resolution`` and
``offset`` on the levels' group, beside ``"multiScale": true``, which is where Paintera reads it: a level stating no
voxel size is placed by it the same way. BigDataViewer's N5 export writes the same keys, but in the unit of its
XML (micrometres, often): its levels are left without a voxel size, as before.
"""
from __future__ import annotations

import bz2
import functools
import json
import lzma
import math
import os
import re
import struct
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .._checks import is_real
from . import _deflate
from ._decode import SideBySide, checked_blosc
from ._filebatch import BATCH_BYTES, lent_buffer, read_regular_files
from ._geometry import NANOMETRES, array_geometry, check_dimensions
from ._metadata import bad_metadata, int_list, metadata_key, parsing
from ._remote import RemoteStore
from ._source import (CorruptChunkError, DatasetNotFoundError, Stamp, StoreMetadataError, VolumeSource,
                      checked_chunk, read_regular_file, require_kind)

#: Attributes that describe the N5 layout itself, not the data.
_STRUCTURE = {"dimensions", "blockSize", "dataType", "compression", "compressionType", "resolution", "offset",
              "pixelResolution", "units", "axis_names", "axes", "voxel_size", "types"}
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
            if "dimensions" in json.loads(read_regular_file(attributes, "attributes.json") or b"{}"):
                found.append(attributes.parent.relative_to(root).as_posix())
        except (OSError, ValueError):
            continue
    return found


def _read_attributes(path: Union[Path, RemoteStore], where: str):
    """A dataset's or group's attributes.json as a dict, or None if there is none (``path``: the file, or the
    remote store of the dataset or group)."""
    if isinstance(path, RemoteStore):
        text = path.get("attributes.json")
    else:
        text = read_regular_file(path, "an N5 attributes.json")
    if text is None:
        return None
    try:
        meta = json.loads(text)
    except ValueError as error:
        raise StoreMetadataError(f"{where}: malformed metadata: not JSON ({error})") from error
    if not isinstance(meta, dict):
        raise bad_metadata(where, "the attributes", meta, "a JSON object")
    return meta


#: A scale level's name in the n5-viewer layout.
_LEVEL = re.compile(r"s(\d+)")
#: The keys that state a dataset's own voxel size.
_VOXEL_SIZE_KEYS = ("resolution", "voxel_size", "pixelResolution")


def _scale_level(meta: dict, groups, dataset: str, where: str) -> dict:
    """``meta`` with a scale level's voxel size made explicit (see the module's notes): its ``pixelResolution``
    (its own, or where it states no voxel size, the nearest group's in ``groups``, the attributes of the groups
    it takes defaults from, nearest first) times its downsampling factors (none for s0). Unchanged where a level
    below s0 has no factors, or there is no ``pixelResolution`` to scale (a voxel size of its own, ``resolution``,
    is the level's)."""
    level = _LEVEL.fullmatch(dataset.rpartition("/")[2])
    factors, pixel, key = meta.get("downsamplingFactors"), meta.get("pixelResolution"), "downsamplingFactors"
    inherits = not any(k in meta for k in _VOXEL_SIZE_KEYS)  # a level stating no voxel size takes its groups'
    groups, own = iter(groups), None
    if (factors is None and level is not None) or (factors is not None and inherits):
        for group in groups:
            own = group if own is None else own
            if factors is None and level is not None:
                for listed in ("scales", "downsamplingFactors"):
                    levels = group.get(listed)
                    if isinstance(levels, list) and int(level.group(1)) < len(levels):
                        factors, key = levels[int(level.group(1))], f"{listed} of the group above it"
                        break
            if pixel is None and inherits:
                pixel = group.get("pixelResolution")
            if factors is not None and (pixel is not None or not inherits):
                break
    if factors is None and level is not None and level.group(1) == "0" and inherits and pixel is not None:
        return dict(meta, pixelResolution=pixel)  # full resolution: its groups' voxel size, no factors needed
    if pixel is None and inherits:
        return _multiscale_group_level(meta, factors, own or next(groups, None), level, dataset)
    if factors is None or pixel is None:
        return meta
    sizes = pixel.get("dimensions") if isinstance(pixel, dict) else pixel
    if not (isinstance(factors, list) and isinstance(sizes, list) and len(factors) == len(sizes)
            and all(is_real(f) and f > 0 for f in factors)):
        raise bad_metadata(where, key, factors, f"one positive factor per entry of pixelResolution {pixel}")
    if not all(is_real(v) for v in sizes):
        return dict(meta, pixelResolution=pixel)  # malformed: the geometry's checks name it
    scaled = [v * f for v, f in zip(sizes, factors)]
    return dict(meta, pixelResolution=dict(pixel, dimensions=scaled) if isinstance(pixel, dict) else scaled)


#: A level of BigDataViewer's N5 layout (``setupNN/timepointNNNNN/sN``), whose group's ``resolution`` is in the unit
#: of the BigDataViewer XML beside it (micrometres, often), not in the N5.
_BDV_LEVEL = re.compile(r"(.+/)?setup\d+/timepoint\d+/s\d+")


def _real_numbers(values) -> bool:
    return isinstance(values, list) and bool(values) and all(is_real(v) for v in values)


def _lengths(units, sizes: list) -> bool:
    """Whether a group's ``units`` are absent, or one length unit, or one per entry of ``sizes``."""
    listed = [units] if units is None or isinstance(units, str) else units
    return isinstance(listed, list) and (listed is not units or len(listed) == len(sizes)) and all(
        unit is None or isinstance(unit, str) and (not unit.strip() or unit.strip().lower() in NANOMETRES)
        for unit in listed)


def _multiscale_group_level(meta: dict, factors, group: Optional[dict], level, dataset: str) -> dict:
    """``meta`` of a level stating no voxel size, placed by its own group (``group``, its attributes) where that
    group is a multiscale group as Paintera and cluster_tools write them (``"multiScale": true`` with s0's
    ``resolution`` and ``offset``, x first, in nm unless the group states ``units``): the level's voxel size is
    ``resolution`` times its factors (none or ones for s0; a trailing channel factor of 1 left out), its corner
    s0's (as n5-viewer's levels are placed; Paintera 1.x shows a coarser level shifted by half its voxel less half
    of s0's). Unchanged where the group's values do not fit (a default, as before it was read), and for
    BigDataViewer's layout without ``units``: its ``resolution`` is in the unit of its XML."""
    if group is None or group.get("multiScale") is not True:
        return meta
    sizes, offset, units = group.get("resolution"), group.get("offset"), group.get("units")
    if not _real_numbers(sizes) or (units is None and _BDV_LEVEL.fullmatch(dataset)) or not _lengths(units, sizes):
        return meta
    if factors is None:
        if level is None or level.group(1) != "0":
            return meta  # a coarser level without factors: not placed by guesswork
        factors = [1] * len(sizes)
    if _real_numbers(factors) and len(factors) > len(sizes) and all(f == 1 for f in factors[len(sizes):]):
        factors = factors[:len(sizes)]  # a channel axis, last in N5's order, not downsampled
    if not (_real_numbers(factors) and len(factors) == len(sizes) and all(f > 0 for f in factors)):
        return meta
    placed = dict(meta, resolution=[v * f for v, f in zip(sizes, factors)])
    if offset is not None and "offset" not in meta:
        placed["offset"] = offset
    if units is not None and "units" not in meta:
        placed["units"] = units
    return placed


def _layout_groups(root: Union[Path, RemoteStore], dataset: str, name: str):
    """The attributes of the groups a scale level takes defaults from in the n5-viewer layout, nearest first (read
    as they are asked for): its own group, then the container's root where that group is directly below it (a
    channel group). None for a dataset that is no level of a pyramid (no ``s0`` beside it): a ``volumes/s1`` took
    the root pyramid's ``scales`` (a review)."""
    parts = dataset.split("/")
    parent = "/".join(parts[:-1])

    def attributes(path: str):
        where = f"{name} (the attributes.json of {path or 'the container'})"
        if isinstance(root, RemoteStore):
            return _read_attributes(root / path if path else root, where)
        return _read_attributes(root / path / "attributes.json", where)

    if not _LEVEL.fullmatch(parts[-1]) or attributes(f"{parent}/s0".lstrip("/")) is None:
        return
    yield attributes(parent) or {}
    if len(parts) == 2:
        yield attributes("") or {}


class N5Source(VolumeSource):
    """One dataset of an N5 container. Resolution and offset come from funlib's ``resolution``/``offset`` (stored
    in (x, y, z) order in N5) or from ``pixelResolution``."""

    def __init__(self, path: Union[str, os.PathLike, RemoteStore], dataset: str) -> None:
        remote = isinstance(path, RemoteStore)
        root = path if remote else Path(path)
        dataset = dataset.strip("/")
        self.name = f"{root}:{dataset}"
        if not remote:
            require_kind(root, "directory", "an N5 container")
            if not root.is_dir():
                raise FileNotFoundError(f"N5 container not found: {root}")
        attributes = root / dataset if remote else root / dataset / "attributes.json"
        meta = _read_attributes(attributes, f"{self.name} (attributes.json)")
        if meta is None:
            listed = "not listed remotely" if remote else ", ".join(list_n5_datasets(root)) or "none"
            raise DatasetNotFoundError(f"dataset {dataset!r} not found in {root}; datasets there: {listed}")
        if "dimensions" not in meta:
            listed = "not listed remotely" if remote else ", ".join(list_n5_datasets(root / dataset)) or "none"
            raise DatasetNotFoundError(f"{self.name} is a group, not a dataset; datasets there: {listed}")
        where = f"{self.name} (attributes.json)"
        if meta.get("isLabelMultiset") is True:  # its blocks are serialised label lists, not voxels of dataType
            raise StoreMetadataError(f"{self.name} is a Paintera label-multiset dataset (isLabelMultiset: true), whose "
                             "blocks emfast does not decode; export its labels as a plain N5 or zarr dataset "
                             "first (Paintera's export, or paintera-conversion-helper)")
        if isinstance(meta["dimensions"], list) and len(meta["dimensions"]) == 2:
            check_dimensions(2, where)  # a 2-D image is told how to be one section, not "malformed"
        dimensions = int_list(meta["dimensions"], "dimensions", where, minimum=0, lengths=(3, 4))
        block = int_list(metadata_key(meta, "blockSize", where), "blockSize", where, minimum=1,
                         length=len(dimensions))
        data_type = metadata_key(meta, "dataType", where)
        if not isinstance(data_type, str) or data_type not in _DTYPES:
            raise bad_metadata(where, "dataType", data_type, f"one of {', '.join(_DTYPES)}")
        self._stored = _DTYPES[data_type]
        self.dtype = self._stored
        self.full_shape = tuple(reversed(dimensions))
        self._block = tuple(reversed(block))
        self.chunks = self._block[-3:]
        compression = meta.get("compression", {"type": meta.get("compressionType", "raw")})
        self._decode = _decoder(compression, where)
        kind = compression.get("type") if isinstance(compression, dict) else compression
        self._compression = str(kind)
        #: gzip and zlib blocks are inflated a box at a time by libdeflate where there is one (io/_deflate.py)
        self._deflated = kind in ("gzip", "zlib")
        # a box's blocks decoded side by side where that pays, as measured for this compression and block size
        self._decodes = SideBySide.of("n5", repr(compression), math.prod(self._block) * self._stored.itemsize)
        self._directory = root / dataset
        self._root, self._dataset = root, dataset
        # a 4-D dataset whose channels are split over blocks reads them box by box (_one_block)
        self.whole_by_chunks = not isinstance(root, RemoteStore) and (
            len(self.full_shape) == 3 or self._block[0] >= self.full_shape[0])
        axes = meta.get("axes")
        if axes is not None and (not isinstance(axes, list) or len(axes) != len(dimensions)):
            raise bad_metadata(where, "axes", axes, f"a list of {len(dimensions)} axis names, x first")
        with parsing(where):
            meta = _scale_level(meta, _layout_groups(root, dataset, self.name), dataset, where)
            geometry = array_geometry(meta, len(dimensions), where, reversed_order=True, names_key="N5 axes",
                                      dimension_names=axes)
        geometry.require_canonical(where, "; N5 lists axes x first: those of a (c, z, y, x) volume are [\"x\", "
                                          "\"y\", \"z\", \"c\"]", listed=None if axes is None else f"listed as {axes}")
        self.resolution, self.offset = geometry.resolution, geometry.offset
        if remote:
            self.stamp = root.stamp(dataset, f"{dataset}/attributes.json".lstrip("/"))
        else:
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
                # a whole edge block (tensorstore) holds channels past the last: those are cut like voxels
                channels = (slice(0, into[0].stop - into[0].start),) if lead else ()
                target[into] = block[channels + take]

    @property
    def read_many(self):
        """A function filling several boxes at once (a list of (corner, extent, out), as :meth:`read` takes them)
        for a local container: the chunk cache's missing blocks of a box, their files read in one call and decoded
        side by side where that pays. None for a remote one, whose blocks :meth:`will_read` requests together."""
        return None if isinstance(self._directory, RemoteStore) else self._read_many

    def _read_many(self, requests) -> None:
        mine, rest = [], []
        for request in requests:
            (mine if self._one_block(request[0], request[1]) else rest).append(request)
        self._decodes.run(mine, self._read_part,
                          most=max(1, BATCH_BYTES // (math.prod(self._block) * self._stored.itemsize)))
        for corner, extent, out in rest:
            self.read(corner, extent, out)

    def _one_block(self, corner, extent) -> bool:
        """Whether the box is exactly one block of a 3-D dataset (or of a 4-D one with all channels in one block)."""
        if len(self.full_shape) == 4 and self._block[0] < self.full_shape[0]:
            return False
        for c, e, b, s in zip(corner, extent, self.chunks, self.full_shape[-3:]):
            if c % b or e != min(b, s - c):
                return False
        return True

    def _read_part(self, requests) -> None:
        """Fill ``requests``, one block each: their files read in one call (:func:`read_regular_files`), then
        decoded one after another."""
        lead = (0,) if len(self.full_shape) == 4 else ()
        keys = [lead + tuple(int(c) // b for c, b in zip(corner, self.chunks)) for corner, _, _ in requests]
        directory = str(self._directory)
        with lent_buffer() as buffer:
            contents, _ = read_regular_files([os.path.join(directory, *map(str, reversed(key))) for key in keys],
                                             "an N5 block", buffer=buffer)
            inflated = self._inflated_into(contents, keys, [out for _, _, out in requests])
            for data, key, (_, extent, out), done in zip(contents, keys, requests, inflated):
                if done:
                    continue
                if data is None:  # never written: 0
                    out[...] = 0
                    continue
                block = self._decoded(data, key)
                block = block if lead else block[np.newaxis]
                out[...] = block[tuple(slice(0, n) for n in out.shape)]  # a whole edge block is cut to the volume

    def _inflated_into(self, contents, keys, outs) -> list:
        """Per block, whether it was inflated here straight into its ``out``: the gzip or zlib blocks whose header
        gives exactly ``out``'s size, all in one call of libdeflate (:mod:`emfast.io._deflate`), their big-endian
        values then swapped in place. The others (and all, where there is no libdeflate) are the caller's, whose
        reading names what is wrong."""
        done = [False] * len(contents)
        if not self._deflated:
            return done
        chosen, frames = [], []
        for i, (data, key, out) in enumerate(zip(contents, keys, outs)):
            if data is None or not out.flags.c_contiguous:
                continue
            clipped = tuple(min(b, s - k * b) for k, b, s in zip(key, self._block, self.full_shape))
            try:
                shape, start = self._header(data, clipped, "")
            except CorruptChunkError:
                continue  # named by the caller's reading
            if shape == clipped and math.prod(shape) == out.size:
                chosen.append(i)
                frames.append(data[start:])
        if not chosen:
            return done
        decoded = _deflate.decode_frames(frames, [outs[i].reshape(-1).view(np.uint8) for i in chosen])
        if decoded is None:
            return done
        swap = self._stored.itemsize > 1 and not self._stored.isnative
        for i, ok in zip(chosen, decoded.tolist()):
            if ok and swap:
                outs[i].byteswap(inplace=True)
            done[i] = ok
        return done

    def close(self) -> None:
        """Cancel the remote reads announced and not taken."""
        if isinstance(self._directory, RemoteStore):
            self._directory.abandon_announced()

    def will_read(self, blocks) -> None:
        """Announce the blocks ((corner, extent) each) about to be read: a remote store requests them together."""
        if not isinstance(self._directory, RemoteStore):
            return
        lead = len(self.full_shape) - 3
        channels = range(-(-self.full_shape[0] // self._block[0])) if lead else [None]
        self._directory.will_get("/".join(str(k) for k in reversed(((c,) if lead else ()) + tuple(
            int(o) // b for o, b in zip(corner, self.chunks)))) for corner, _ in blocks for c in channels)

    def _block_data(self, key) -> np.ndarray:
        """Block ``key`` ((c,) z, y, x block indices) as an array of its stored size, or None if never written.

        The header must describe this block as the dataset's attributes do: the clipped size at the far edges
        (N5-Java writes that), or the full blockSize (tensorstore writes edge blocks whole), and never more."""
        name = "/".join(str(k) for k in reversed(key))
        if isinstance(self._directory, RemoteStore):
            data = self._directory.get(name)
        else:
            data = read_regular_file(self._directory / name, "an N5 block")
        return None if data is None else self._decoded(data, key)

    def _decoded(self, data, key) -> np.ndarray:
        """Block ``key`` from its file's bytes ``data``, checked as :meth:`_block_data` says."""
        where = f"{self.name}: block {'/'.join(str(k) for k in reversed(key))}"
        clipped = tuple(min(b, s - k * b) for k, b, s in zip(key, self._block, self.full_shape))
        shape, start = self._header(data, clipped, where)
        count = int(np.prod(shape))
        try:
            raw = self._decode(data[start:], count * self._stored.itemsize)
        except Exception as error:  # each codec raises its own types for corrupt input
            raise CorruptChunkError(f"{where} is corrupt: cannot decompress it ({error})") from error
        return checked_chunk(raw, self._stored, shape, where, self.stamp)

    def _header(self, data: bytes, clipped, where: str):
        """(block shape, (c,) z, y, x; offset of the data) from a block's header, checked against the dataset."""
        ndim = len(self.full_shape)
        if len(data) < 4:
            raise CorruptChunkError(f"{where} is corrupt: {len(data)} bytes, shorter than a block header")
        mode, stored_ndim = struct.unpack(">HH", data[:4])
        if mode not in (0, 1):
            raise CorruptChunkError(f"{where}: block mode {mode} is not an array block (0 default, 1 varlength)")
        if stored_ndim != ndim:
            raise CorruptChunkError(f"{where}: the header has {stored_ndim} dimensions, the dataset {ndim}")
        start = 4 + 4 * ndim + (4 if mode == 1 else 0)
        if len(data) < start:
            raise CorruptChunkError(f"{where} is corrupt: {len(data)} bytes, shorter than its header")
        shape = tuple(reversed(struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])))
        if shape not in (clipped, self._block):
            raise CorruptChunkError(
                f"{where}: the header gives size {list(reversed(shape))} (x, y, z), but the attributes (dimensions "
                f"{list(reversed(self.full_shape))}, blockSize {list(reversed(self._block))}) make it "
                f"{list(reversed(clipped))}; the block is corrupt or belongs to another dataset")
        if mode == 1:
            (elements,) = struct.unpack(">I", data[start - 4:start])
            if elements != int(np.prod(shape)):
                raise CorruptChunkError(f"{where}: a varlength header with {elements} elements for a block of "
                                        f"size {list(reversed(shape))}")
        return shape, start

    def attributes(self) -> dict:
        return dict(self._attributes)

    def describe(self) -> str:
        return f"{super().describe()} {self._compression}" if self._compression != "raw" else super().describe()

    def reopen_arguments(self) -> tuple:
        # a store pickles as its URL, a folder as its absolute path (a Dask worker may run elsewhere)
        root = self._root if isinstance(self._root, RemoteStore) else str(Path(self._root).absolute())
        return root, self._dataset


def _decoder(compression, name: str):
    """A function (compressed bytes, expected size) -> bytes for an N5 ``compression`` entry."""
    kind = compression.get("type") if isinstance(compression, dict) else compression
    if kind == "raw":
        return lambda data, size: data
    if kind in ("gzip", "zlib"):
        zlib_header = isinstance(compression, dict) and compression.get("useZlib") is True
        wbits = 47 if kind == "gzip" and not zlib_header else 15  # 47: gzip or zlib header
        return functools.partial(_deflate.inflated, wbits=wbits)
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
        if kind == "lz4":
            return lambda data, size: _lz4_decode(numcodecs.LZ4(), data, size)
        decode = checked_blosc(numcodecs.Blosc()) if kind == "blosc" else numcodecs.Zstd().decode
        return lambda data, size: decode(data)
    raise bad_metadata(name, "compression", compression, 'a compression of type raw, gzip, zlib, bzip2, xz, blosc, '
                       'zstd or lz4, e.g. {"type": "gzip"}')


#: lz4-java's ``LZ4BlockOutputStream`` framing, which n5-java (the reference) writes: each block is the magic,
#: a token (method in the high 4 bits), compressed and original lengths and a checksum (little-endian int32s),
#: then the data; an empty block ends the stream.
_LZ4_BLOCK_MAGIC = b"LZ4Block"
_LZ4_BLOCK_HEADER = struct.Struct("<Biii")
_LZ4_RAW, _LZ4_COMPRESSED = 0x10, 0x20


def _lz4_decode(codec, data: bytes, size: int) -> bytes:
    """An N5 lz4 block in either framing writers use: n5-java's lz4-java stream (told by its magic), or the bare
    LZ4 block z5py writes (its size comes from the N5 header)."""
    data = bytes(data)  # a view of a file buffer has no startswith
    if not data.startswith(_LZ4_BLOCK_MAGIC):
        return _lz4_block(codec, data, size)
    parts, position = [], 0
    while position < len(data):
        if not data.startswith(_LZ4_BLOCK_MAGIC, position):
            raise ValueError(f"lz4-java stream: no LZ4Block magic at byte {position}")
        start = position + len(_LZ4_BLOCK_MAGIC) + _LZ4_BLOCK_HEADER.size
        token, compressed, original, _checksum = _LZ4_BLOCK_HEADER.unpack_from(data, position + len(_LZ4_BLOCK_MAGIC))
        payload = data[start:start + compressed]
        if compressed < 0 or original < 0 or len(payload) != compressed:
            raise ValueError(f"lz4-java stream: a block at byte {position} claims {compressed} bytes, "
                             f"{len(data) - start} remain")
        if original == 0:  # the end-of-stream block
            break
        method = token & 0xF0
        if method not in (_LZ4_RAW, _LZ4_COMPRESSED):
            raise ValueError(f"lz4-java stream: unknown compression method {method:#x} at byte {position}")
        parts.append(payload if method == _LZ4_RAW else _lz4_block(codec, payload, original))
        position = start + compressed
    return b"".join(parts)


def _lz4_block(codec, block: bytes, size: int) -> bytes:
    """A bare LZ4 block of ``size`` decompressed bytes, through numcodecs' LZ4 (whose own framing is the size as a
    little-endian uint32 before the block)."""
    return bytes(codec.decode(struct.pack("<I", size) + bytes(block)))
