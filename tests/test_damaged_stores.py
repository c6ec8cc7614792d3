"""Damaged and unusual stores are read correctly or refused with an error naming the culprit: chunks and blocks
that do not match their metadata, malformed metadata of every format, HDF5 virtual datasets with missing sources,
FIFOs and other non-regular files, volumes too large for memory."""
import copy
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import (CorruptChunkError, DatasetNotFoundError, StoreMetadataError, VolumeTooLargeError,
                       tensorstore_missing)

zarr = pytest.importorskip("zarr", reason="zarr is not installed (pip install 'emfast[zarr]')")
needs_tensorstore = pytest.mark.skipif(tensorstore_missing() is not None, reason=str(tensorstore_missing()))

SHAPE = (6, 10, 9)
CHUNKS = (4, 4, 4)


@pytest.fixture
def raw(rng):
    return rng.integers(0, 256, SHAPE, dtype=np.uint8)


def write_zarr(path, data, *, zarr_format=3, shards=None, compressors="auto", attrs=None):
    """An array "raw" written by zarr-python, as a user's tool would."""
    root = zarr.open_group(str(path), mode="a", zarr_format=zarr_format)
    array = root.create_array("raw", shape=data.shape, chunks=CHUNKS, shards=shards, dtype=data.dtype,
                              compressors=compressors, fill_value=0, overwrite=True)
    array[...] = data
    array.attrs.update(attrs or {})
    return path / "raw"


def write_n5(path, data, block=CHUNKS, attrs=None, full_edges=False):
    """An N5 dataset "raw" written from the specification (raw compression): (x, y, z) attributes, a big-endian
    header per block and big-endian elements, x fastest; edge blocks clipped (N5-Java) or whole (tensorstore)."""
    (path / "raw").mkdir(parents=True)
    (path / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    meta = {"dimensions": list(data.shape[::-1]), "blockSize": list(block[::-1]), "dataType": data.dtype.name,
            "compression": {"type": "raw"}, **(attrs or {})}
    (path / "raw/attributes.json").write_text(json.dumps(meta))
    for index in np.ndindex(*(-(-s // b) for s, b in zip(data.shape, block))):
        piece = data[tuple(slice(i * b, (i + 1) * b) for i, b in zip(index, block))]
        if full_edges:
            piece = np.pad(piece, [(0, b - s) for s, b in zip(piece.shape, block)])
        write_block(path / "raw", index, piece)
    return path / "raw"


def write_block(dataset, index, piece, mode=0, dims=None, elements=None):
    """One N5 block file: header (mode, ndim, dims in x, y, z[, elements]) and big-endian elements."""
    dims = list(piece.shape[::-1]) if dims is None else dims
    header = struct.pack(">HH", mode, len(dims)) + struct.pack(f">{len(dims)}I", *dims)
    if mode == 1:
        header += struct.pack(">I", int(np.prod(dims)) if elements is None else elements)
    target = dataset.joinpath(*(str(i) for i in index[::-1]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(header + piece.astype(piece.dtype.newbyteorder(">")).tobytes())


def read_lazily(volume, within=None):
    """Every chunk of a lazy volume (those within the shape ``within``), one box per chunk, as the loader reads
    them."""
    shape = volume.shape if within is None else tuple(min(a, b) for a, b in zip(volume.shape, within))
    out = np.empty((volume.channels,) + shape, volume.dtype)
    chunks = volume.chunks or CHUNKS
    for corner in np.ndindex(*(-(-s // c) for s, c in zip(shape, chunks))):
        start = [i * c for i, c in zip(corner, chunks)]
        extent = [min(c, s - a) for a, c, s in zip(start, chunks, shape)]
        box = (slice(None),) + tuple(slice(a, a + e) for a, e in zip(start, extent))
        volume.read_box(start, extent, out[box])
    return out


# --- chunks and blocks that do not match their metadata ---------------------------------------------------------

@pytest.mark.parametrize("zarr_format, shards, compressors", [
    (2, None, "auto"), (2, None, None), (3, None, "auto"), (3, None, None), (3, (4, 8, 8), "auto")])
@pytest.mark.parametrize("stored, promised", [(np.uint16, np.uint8), (np.uint8, np.uint16)])
def test_zarr_chunks_of_another_size_are_refused_lazily_and_in_memory(tmp_path, raw, zarr_format, shards,
                                                                      compressors, stored, promised):
    """Chunks written by another tool with other metadata (here: another dtype), under the array's metadata: each
    decodes to more or fewer bytes than the metadata promise. Every read path names the chunk."""
    array = write_zarr(tmp_path / "s.zarr", raw.astype(promised), zarr_format=zarr_format, shards=shards,
                       compressors=compressors)
    other = write_zarr(tmp_path / "other.zarr", raw.astype(stored), zarr_format=zarr_format, shards=shards,
                       compressors=compressors)
    for chunk in sorted(p for p in other.rglob("*") if p.is_file() and p.name not in ("zarr.json", ".zarray",
                                                                                       ".zattrs")):
        shutil.copyfile(chunk, array / chunk.relative_to(other))
    lazy = ef.open(tmp_path / "s.zarr/raw", in_memory=False)
    with pytest.raises(CorruptChunkError, match=r"s.zarr:raw: (cannot read )?chunk"):
        read_lazily(lazy)
    with pytest.raises(CorruptChunkError, match=r"s.zarr:raw: (cannot read )?chunk"):
        ef.open(tmp_path / "s.zarr/raw")


def test_the_decoded_size_names_store_array_and_chunk(tmp_path, raw):
    array = write_zarr(tmp_path / "s.zarr", raw, zarr_format=2, compressors=None)
    (array / "1.0.1").write_bytes((array / "1.0.1").read_bytes() + b"\0" * 7)  # 7 bytes of garbage appended
    volume = ef.open(tmp_path / "s.zarr/raw", in_memory=False)
    np.testing.assert_array_equal(volume.read_box((0, 0, 0), (4, 4, 4), np.empty((1, 4, 4, 4), np.uint8))[0],
                                  raw[:4, :4, :4])
    with pytest.raises(CorruptChunkError, match=r"s.zarr:raw: chunk 1.0.1 decodes to 71 bytes, but the metadata "
                                                r"promise \(4, 4, 4\) uint8 = 64 bytes; the store is corrupt"):
        volume.read_box((4, 0, 4), (2, 4, 4), np.empty((1, 2, 4, 4), np.uint8))


def test_a_store_replaced_under_a_running_loader_stops_training_naming_the_chunk(tmp_path, rng):
    """The lazy store is replaced (same path, same chunk grid, uint16 instead of uint8) while a loader streams
    from it: the next blocks read decode to twice the bytes, and the training loop gets the error, naming the
    chunk and saying the store changed, instead of batches of garbage."""
    raw = rng.integers(0, 256, (16, 32, 32), dtype=np.uint8)
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=2)
    root.create_array("raw", shape=raw.shape, chunks=(4, 8, 8), dtype=np.uint8, compressors=None)[...] = raw
    volume = ef.open(tmp_path / "s.zarr/raw", in_memory=False, cache_bytes=256)  # one block: every read decodes
    with ef.Loader(volume, patch=(4, 8, 8), batch_size=2, augment=[], seed=3, threads=2) as loader:
        loader.next_batch()
        shutil.rmtree(tmp_path / "s.zarr")
        root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=2)
        root.create_array("raw", shape=raw.shape, chunks=(4, 8, 8), dtype=np.uint16, compressors=None)[...] = raw
        # whichever is seen first: a block decoding to another size, or the store's files having changed
        with pytest.raises(CorruptChunkError, match=r"s.zarr:raw: (chunk \d+\.\d+\.\d+ decodes to 512 bytes, but "
                                                    r"the metadata promise \(4, 8, 8\) uint8 = 256 bytes; the "
                                                    r"store's metadata changed since it was opened|its files changed "
                                                    r"since it was opened)"):
            for _ in range(200):
                loader.next_batch()


CHANGED = r"its files changed since it was opened \(the store was replaced, rewritten or removed"


def _lazy_uint32(tmp_path, rng, kind: str):
    """A uint32 volume in a zarr v2 store or an HDF5 file, and it opened lazily with a cache of one block."""
    # a virtual dataset is stored contiguously: the cache holds it in blocks of 64 along x, one at a time
    raw = rng.integers(0, 1000, (16, 32, 128 if kind == "hdf5 virtual" else 32), dtype=np.uint32)
    if kind == "zarr":
        zarr.create_array(str(tmp_path / "s.zarr"), name="raw", shape=raw.shape, chunks=(4, 8, 8), dtype=np.uint32,
                          zarr_format=2, compressors=None)[...] = raw
        return raw, ef.open(tmp_path / "s.zarr/raw", in_memory=False, cache_bytes=1024)
    data = "s.h5" if kind == "hdf5" else "d.h5"  # else s.h5 reads d.h5 through an external link or a VDS
    with h5py.File(tmp_path / data, "w") as f:
        f.create_dataset("raw", data=raw, chunks=(4, 8, 8))
    if kind == "hdf5 external link":
        with h5py.File(tmp_path / "s.h5", "w") as f:
            f["raw"] = h5py.ExternalLink("d.h5", "raw")
    elif kind == "hdf5 virtual":
        layout = h5py.VirtualLayout(shape=raw.shape, dtype=raw.dtype)
        layout[...] = h5py.VirtualSource("d.h5", "raw", shape=raw.shape)
        with h5py.File(tmp_path / "s.h5", "w") as f:
            f.create_virtual_dataset("raw", layout)
    budget = 16 * 32 * 64 * 4 if kind == "hdf5 virtual" else 1024
    return raw, ef.hdf5(tmp_path / "s.h5", "raw", in_memory=False, cache_bytes=budget)


@pytest.mark.parametrize("kind, change", [("zarr", "removed"), ("zarr", "float32 instead"), ("hdf5", "cp over it"),
                                          ("hdf5 external link", "cp over it"), ("hdf5 virtual", "cp over it")])
def test_a_store_changed_under_a_lazy_volume_is_an_error_never_other_data(tmp_path, rng, kind, change):
    """Changes nothing else tells: a removed store read as its fill value (zeros); one recreated as float32 has
    chunks of the uint32 size, which decode without an error (float bits read as integers); an HDF5 file
    rewritten in place (cp keeps the inode) has its chunks' offsets point into other bytes, and so has the file
    an external link or a virtual dataset reads. Each is now an error at the first read of a missing block, and
    at every read after it."""
    raw, volume = _lazy_uint32(tmp_path, rng, kind)
    out = np.empty((1, 4, 8, 8), np.uint32)
    volume.read_box((0, 0, 0), (4, 8, 8), out)
    np.testing.assert_array_equal(out[0], raw[:4, :8, :8])
    if change == "removed":
        shutil.rmtree(tmp_path / "s.zarr")
    elif change == "float32 instead":
        zarr.create_array(str(tmp_path / "s.zarr"), name="raw", shape=raw.shape, chunks=(4, 8, 8), dtype=np.float32,
                          zarr_format=2, compressors=None, overwrite=True)[...] = raw.astype(np.float32)
    else:
        with h5py.File(tmp_path / "new.h5", "w") as f:
            f.create_dataset("raw", data=raw[::-1].copy(), chunks=(4, 8, 8))
        data = tmp_path / ("s.h5" if kind == "hdf5" else "d.h5")
        shutil.copyfile(tmp_path / "new.h5", data)
        os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))  # a coarse clock may not tick
    changed = r"its files changed since it was opened \(the virtual dataset's source file .*d\.h5 for the box " \
        if kind == "hdf5 virtual" else CHANGED
    for _ in range(2):
        with pytest.raises(CorruptChunkError, match=changed):
            volume.read_box((8, 16, raw.shape[2] - 8), (4, 8, 8), out)
    volume.close()


def test_reading_a_closed_lazy_hdf5_volume_names_it(tmp_path, rng):
    """h5py said "Unable to synchronously get dataspace (identifier is not of specified type)", naming nothing."""
    _, volume = _lazy_uint32(tmp_path, rng, "hdf5")
    volume.close()
    with pytest.raises(ValueError, match=r"s\.h5:raw: the volume was closed; open it again to read it"):
        volume.read_box((0, 0, 0), (4, 8, 8), np.empty((1, 4, 8, 8), np.uint32))


@pytest.mark.parametrize("kind", ["zarr", "hdf5"])
def test_a_closed_lazy_volume_refuses_reads_whatever_its_format(tmp_path, rng, kind):
    """A closed lazy zarr (N5, precomputed) volume went on reading, 300 batches after close(), while HDF5's failed:
    its reader holds no file to close."""
    _, volume = _lazy_uint32(tmp_path, rng, kind)
    out = np.empty((1, 4, 8, 8), np.uint32)
    volume.read_box((0, 0, 0), (4, 8, 8), out)
    volume.close()
    for corner in ((0, 0, 0), (8, 16, 16)):  # cached before, and never read
        with pytest.raises(ValueError, match=r"the volume was closed; open it again to read it"):
            volume.read_box(corner, (4, 8, 8), out)


def test_a_lazy_hdf5_volume_closed_during_a_read_names_it(tmp_path, rng, monkeypatch):
    """Closed by another thread between the check and the read, h5py's own message came through (9 of 40 runs of
    a reviewer's race)."""
    _, volume = _lazy_uint32(tmp_path, rng, "hdf5")
    source = volume.chunk_cache._source
    checks = source._check_sources
    monkeypatch.setattr(source, "_check_sources", lambda *a: (volume.close(), checks(*a)))  # the race, every time
    with pytest.raises(ValueError, match=r"s\.h5:raw: the volume was closed; open it again to read it"):
        volume.read_box((0, 0, 0), (4, 8, 8), np.empty((1, 4, 8, 8), np.uint32))


def test_a_lazy_hdf5_file_removed_or_renamed_away_still_reads(tmp_path, rng):
    """The open descriptor keeps the data of a file whose path is removed or reused: it reads on, correctly."""
    raw, volume = _lazy_uint32(tmp_path, rng, "hdf5")
    os.rename(tmp_path / "s.h5", tmp_path / "elsewhere.h5")
    with h5py.File(tmp_path / "s.h5", "w") as f:  # another file at the path
        f.create_dataset("raw", data=raw[::-1].copy(), chunks=(4, 8, 8))
    out = np.empty((1, 4, 8, 8), np.uint32)
    volume.read_box((8, 16, 16), (4, 8, 8), out)
    np.testing.assert_array_equal(out[0], raw[8:12, 16:24, 16:24])
    volume.close()


@pytest.mark.parametrize("damage, message", [
    ("one voxel", r"block 1/0/1: the header gives size \[1, 1, 1\] \(x, y, z\), but the attributes .* make it "
                  r"\[4, 4, 2\]"),
    ("larger than blockSize", r"block 0/0/0: the header gives size \[8, 4, 4\]"),
    ("other dtype", r"block 1/0/1 decodes to 64 bytes, but the metadata promise \(2, 4, 4\) uint8 = 32 bytes"),
    ("varlength count", r"block 1/0/1: a varlength header with 5 elements for a block of size \[4, 4, 2\]"),
    ("object mode", r"block 1/0/1: block mode 2 is not an array block"),
    ("two dimensions", r"block 1/0/1: the header has 2 dimensions, the dataset 3"),
    ("truncated", r"block 1/0/1 decodes to 20 bytes, but the metadata promise \(2, 4, 4\) uint8 = 32 bytes"),
])
def test_n5_blocks_are_checked_against_the_attributes(tmp_path, raw, damage, message):
    dataset = write_n5(tmp_path / "a.n5", raw)
    block = raw[4:6, 0:4, 4:8]
    if damage == "one voxel":  # the header of a 1x1x1 block used to fill the whole block by broadcasting
        write_block(dataset, (1, 0, 1), block[:1, :1, :1])
    elif damage == "larger than blockSize":
        write_block(dataset, (0, 0, 0), np.zeros((4, 4, 8), np.uint8))
    elif damage == "other dtype":  # a uint16 block under uint8 attributes
        write_block(dataset, (1, 0, 1), block.astype(np.uint16))
    elif damage == "varlength count":
        write_block(dataset, (1, 0, 1), block, mode=1, elements=5)
    elif damage == "object mode":
        write_block(dataset, (1, 0, 1), block, mode=2)
    elif damage == "two dimensions":
        write_block(dataset, (1, 0, 1), block, dims=[4, 4])
    else:
        path = dataset / "1/0/1"
        path.write_bytes(path.read_bytes()[:-12])
    for in_memory in (False, True):
        with pytest.raises(CorruptChunkError, match=r"a.n5:raw: " + message):
            read_lazily(ef.open(tmp_path / "a.n5/raw", in_memory=False)) if not in_memory else \
                ef.open(tmp_path / "a.n5/raw")


def test_n5_edge_blocks_clipped_or_whole_read_the_same(tmp_path, raw):
    """N5-Java clips blocks at the far edges, tensorstore writes them whole: both are the volume."""
    write_n5(tmp_path / "clipped.n5", raw)
    write_n5(tmp_path / "whole.n5", raw, full_edges=True)
    for name in ("clipped.n5", "whole.n5"):
        np.testing.assert_array_equal(ef.open(tmp_path / name / "raw").array[0], raw)
        np.testing.assert_array_equal(read_lazily(ef.open(tmp_path / name / "raw", in_memory=False))[0], raw)


@pytest.mark.parametrize("key, value, message", [
    ("blockSize", [-4, 4, 4], r"blockSize = \[-4, 4, 4\]; expected a list of 3 integers >= 1"),
    ("blockSize", [0, 4, 4], r"blockSize = \[0, 4, 4\]; expected a list of 3 integers >= 1"),
    ("dimensions", [9, -10, 6], r"dimensions = \[9, -10, 6\]; expected a list of 3 or 4 integers >= 0"),
    ("dataType", "uint9", r"dataType = 'uint9'; expected one of uint8, "),
    ("compression", {"type": "snappy"}, r"compression = \{'type': 'snappy'\}; expected a compression of type raw"),
    ("resolution", [4, 4], r"resolution = \[4, 4\]; expected 3 numbers"),
])
def test_n5_attributes_are_checked(tmp_path, raw, key, value, message):
    dataset = write_n5(tmp_path / "a.n5", raw)
    meta = json.loads((dataset / "attributes.json").read_text())
    meta[key] = value
    (dataset / "attributes.json").write_text(json.dumps(meta))
    with pytest.raises(StoreMetadataError, match=r"a.n5:raw.*" + message):
        ef.open(tmp_path / "a.n5/raw", in_memory=False)


# --- malformed metadata: every mutation is refused by one error, or read correctly ------------------------------

#: Values that replace each metadata entry in turn: wrong types, zero, negative, huge, wrong lengths.
BAD_VALUES = (None, -1, 0, 2.5, "x", True, {}, [1, 2], [0, 0, 0], [-4, 8, 8], [10 ** 12] * 3)


def mutations(node, path=()):
    """(key path, mutated copy of ``node``) for every entry: removed (in objects), and replaced by each bad value."""
    entries = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in list(entries):
        where = path + (key,)
        if isinstance(node, dict):
            changed = copy.deepcopy(node)
            del changed[key]
            yield where, changed
        for bad in BAD_VALUES:
            changed = copy.deepcopy(node)
            changed[key] = bad
            yield where + (bad,), changed
        for inner_path, inner in mutations(value, where):
            changed = copy.deepcopy(node)
            changed[key] = inner
            yield inner_path, changed


def assert_refused_or_correct(open_store, store_name, expected, moved=False):
    """``open_store(in_memory)`` either raises emfast's metadata or chunk error, naming the store, or reads the
    data the original metadata described wherever the two overlap; where the mutation ``moved`` the chunks (another
    chunk grid or directory, so that no chunk is found), the fill value 0, as the format specifies."""
    for in_memory in (True, False):
        try:
            volume = open_store(in_memory)
            data = volume.array if in_memory else read_lazily(volume, within=expected.shape)
        except StoreMetadataError as error:
            assert store_name in str(error)
            return  # opening lazily checks the same metadata
        except (CorruptChunkError, VolumeTooLargeError) as error:
            assert store_name in str(error)
            continue
        except DatasetNotFoundError as error:  # node_type "group": the metadata says it is a group, so it is one
            assert "is a group" in str(error) and store_name in str(error)
            continue
        except ValueError as error:  # a shape with a 0: a Volume is never empty (documented)
            assert "volume is empty" in str(error) and store_name in str(error)
            continue
        overlap = tuple(slice(0, min(a, b)) for a, b in zip(data.shape[1:], expected.shape))
        if data.dtype != expected.dtype:
            continue
        for corner in np.ndindex(*(-(-s.stop // c) for s, c in zip(overlap, CHUNKS))):
            box = tuple(slice(i * c, min((i + 1) * c, s.stop)) for i, c, s in zip(corner, CHUNKS, overlap))
            if not (moved and not data[(0,) + box].any()):
                np.testing.assert_array_equal(data[(0,) + box], expected[box])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_every_mutation_of_zarr_metadata_is_refused_clearly_or_read_correctly(tmp_path, raw, zarr_format):
    array = write_zarr(tmp_path / "s.zarr", raw, zarr_format=zarr_format,
                       attrs={"resolution": [40, 4, 4], "offset": [0, 0, 0]})
    files = ["zarr.json"] if zarr_format == 3 else [".zarray"]  # v3 holds the attributes: mutated there
    count = 0
    for name in files:
        original = (array / name).read_text()
        for where, mutated in mutations(json.loads(original)):
            (array / name).write_text(json.dumps(mutated))
            try:
                assert_refused_or_correct(lambda memory: ef.open(tmp_path / "s.zarr/raw", in_memory=memory),
                                          "s.zarr", raw)
            except Exception as error:
                raise AssertionError(f"{name} with {where}: {type(error).__name__}: {error}") from error
            count += 1
        (array / name).write_text(original)
    assert count > 150


def test_every_mutation_of_n5_attributes_is_refused_clearly_or_read_correctly(tmp_path, raw):
    dataset = write_n5(tmp_path / "a.n5", raw, attrs={"resolution": [4, 4, 40], "offset": [0, 0, 0]})
    original = json.loads((dataset / "attributes.json").read_text())
    for where, mutated in mutations(original):
        (dataset / "attributes.json").write_text(json.dumps(mutated))
        try:
            assert_refused_or_correct(lambda memory: ef.open(tmp_path / "a.n5", "raw", in_memory=memory), "a.n5",
                                      raw)
        except Exception as error:
            raise AssertionError(f"attributes.json with {where}: {type(error).__name__}: {error}") from error


def write_precomputed(path, data):
    import tensorstore as ts
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path)},
                     "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
                     "scale_metadata": {"resolution": [4, 4, 40], "voxel_offset": [0, 0, 0], "size":
                                        list(data.shape[::-1]), "chunk_size": list(CHUNKS[::-1]), "encoding": "raw"},
                     "create": True}).result()
    store[...] = data.T[..., np.newaxis]


@needs_tensorstore
def test_every_mutation_of_a_precomputed_info_is_refused_clearly_or_read_correctly(tmp_path, raw):
    write_precomputed(tmp_path / "pc", raw)
    original = json.loads((tmp_path / "pc/info").read_text())
    for where, mutated in mutations(original):
        (tmp_path / "pc/info").write_text(json.dumps(mutated))
        try:
            moved = any(key in where for key in ("chunk_sizes", "key", "size", "voxel_offset"))  # in chunk names
            assert_refused_or_correct(lambda memory: ef.open(tmp_path / "pc", in_memory=memory, format="precomputed"),
                                      "pc", raw, moved)
        except Exception as error:
            raise AssertionError(f"info with {where}: {type(error).__name__}: {error}") from error


def test_precomputed_info_is_checked_without_tensorstore(tmp_path, monkeypatch):
    """The info is checked before tensorstore is needed: the errors of the field report, each naming the key."""
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    scale = {"key": "4_4_40", "size": [9, 10, 6], "resolution": [4, 4, 40], "chunk_sizes": [[4, 4, 4]],
             "encoding": "raw", "voxel_offset": [0, 0, 0]}
    info = {"type": "image", "data_type": "uint8", "num_channels": 1, "scales": [scale]}
    (tmp_path / "pc").mkdir()
    for change, message in [(lambda i: i["scales"][0].pop("voxel_offset"), r"scales\[0\].voxel_offset is missing"),
                            (lambda i: i["scales"][0].update(chunk_sizes={}), r"scales\[0\].chunk_sizes = \{\}"),
                            (lambda i: i.update(scales=[]), r"scales = \[\]; expected a non-empty list"),
                            (lambda i: i["scales"][0].update(resolution=[0, 4, 40]), r"scales\[0\].resolution")]:
        broken = copy.deepcopy(info)
        change(broken)
        (tmp_path / "pc/info").write_text(json.dumps(broken))
        with pytest.raises(StoreMetadataError, match=r"pc \(info\): malformed metadata: " + message):
            ef.open(tmp_path / "pc", format="precomputed")


def write_compressed_segmentation(path, labels, block=(3, 2, 2)):
    """A compressed_segmentation precomputed volume, written by tensorstore (uncompressed chunk files)."""
    import tensorstore as ts
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path)},
                     "multiscale_metadata": {"type": "segmentation", "data_type": "uint64", "num_channels": 1},
                     "scale_metadata": {"resolution": [4, 4, 40], "voxel_offset": [0, 0, 0], "size":
                                        list(labels.shape[::-1]), "chunk_size": list(CHUNKS[::-1]),
                                        "encoding": "compressed_segmentation",
                                        "compressed_segmentation_block_size": list(block)},
                     "create": True}).result()
    store[...] = labels.T[..., np.newaxis]


@needs_tensorstore
@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:len(data) // 2], r"channel 0, block \d+: an offset or table index beyond the chunk's \d+ "),
    (lambda data: data[:-2], r"\d+ bytes are not whole 32-bit words"),
    (lambda data: struct.pack("<I", 2 ** 30) + data[4:], r"channel 0: an offset or table index beyond"),
    (lambda data: data[:8] + struct.pack("<I", 2 ** 30) + data[12:], r"channel 0, block 0: an offset or table index"),
    (lambda data: data[:7] + bytes([3]) + data[8:], r"channel 0, block 0: encoded bits not 0, 1, 2, 4, 8, 16 or 32"),
])
def test_a_damaged_compressed_segmentation_chunk_names_it(tmp_path, rng, damage, message):
    labels = rng.integers(0, 5, SHAPE).astype(np.uint64)
    write_compressed_segmentation(tmp_path / "seg", labels)
    chunk = tmp_path / "seg/4_4_40/0-4_0-4_0-4"
    chunk.write_bytes(damage(chunk.read_bytes()))
    for in_memory in (True, False):
        with pytest.raises(CorruptChunkError, match=r"seg: chunk 4_4_40/0-4_0-4_0-4 is corrupt: "
                                                    r"compressed_segmentation: " + message):
            ef.open(tmp_path / "seg", format="precomputed", in_memory=in_memory).read_box(
                (0, 0, 0), SHAPE, np.empty((1,) + SHAPE, np.uint64))


@needs_tensorstore
def test_compressed_segmentation_decoding_of_any_damage_fails_cleanly_or_decodes(tmp_path, rng):
    """Every offset, count of bits and table index is checked before it is read: words changed at random,
    bytes cut off, never a crash (a read outside the chunk would be one, or garbage)."""
    from emfast._core.files import decode_compressed_segmentation
    labels = rng.integers(0, 300, SHAPE).astype(np.uint64)
    write_compressed_segmentation(tmp_path / "seg", labels, block=(2, 2, 2))
    data = (tmp_path / "seg/4_4_40/0-4_0-4_0-4").read_bytes()
    size, block = CHUNKS[::-1], (2, 2, 2)
    assert np.array_equal(decode_compressed_segmentation(data, size, block, 1, np.uint64)[0], labels[:4, :4, :4])
    words = np.frombuffer(data, np.uint32)
    for trial in range(3000):
        damaged = words.copy()
        spots = rng.integers(0, len(words), rng.integers(1, 4))
        damaged[spots] = rng.choice([0, 1, 2 ** 24 - 1, 2 ** 31, 2 ** 32 - 1, int(rng.integers(0, 2 ** 32))],
                                    len(spots))
        damaged = damaged[:rng.integers(1, len(words) + 1)] if trial % 3 == 0 else damaged
        try:
            decode_compressed_segmentation(damaged.tobytes(), size, block, 1, np.uint64)
        except ValueError as error:
            assert str(error).startswith("compressed_segmentation: "), error
    # sizes whose positions, bit offsets or block grid would overflow 64 bits (a read far outside the chunk)
    for hostile_size, hostile_block in [((1, 2, 1), (2 ** 58, 2, 1)), ((2, 2, 2), (2 ** 63 - 1, 1, 1)),
                                        ((4, 4, 4), (2 ** 21, 2 ** 21, 2)), ((2, 2, 2), (2 ** 64, 1, 1)),
                                        ((2 ** 22,) * 3, (8, 8, 8))]:
        with pytest.raises(ValueError, match=r"compressed_segmentation: size .* out of range"):
            decode_compressed_segmentation(data, hostile_size, hostile_block, 1, np.uint64)
    with pytest.raises(ValueError, match=r"compressed_segmentation: size \(-1, 4, 4\), .* must be 3 positive"):
        decode_compressed_segmentation(data, (-1, 4, 4), block, 1, np.uint64)


@needs_tensorstore
@pytest.mark.parametrize("change, message", [
    (lambda info: info["scales"][0].pop("compressed_segmentation_block_size"),
     r"scales\[0\].compressed_segmentation_block_size is missing"),
    (lambda info: info["scales"][0].update(compressed_segmentation_block_size=[8, 0, 8]),
     r"scales\[0\].compressed_segmentation_block_size"),
    (lambda info: info.update(data_type="uint16"), r"data_type = 'uint16'; expected uint32 or uint64"),
    (lambda info: info["scales"][0].update(compressed_segmentation_block_size=[2 ** 58, 2, 1]),
     r"scales\[0\].compressed_segmentation_block_size = \[288230376151711744, 2, 1\]; expected 3 edges of at most"),
])
def test_a_compressed_segmentation_info_is_checked(tmp_path, rng, change, message):
    write_compressed_segmentation(tmp_path / "seg", rng.integers(0, 5, SHAPE).astype(np.uint64))
    info = json.loads((tmp_path / "seg/info").read_text())
    change(info)
    (tmp_path / "seg/info").write_text(json.dumps(info))
    with pytest.raises(StoreMetadataError, match=r"seg \(info\): malformed metadata: " + message):
        ef.open(tmp_path / "seg", format="precomputed")


def test_a_volume_larger_than_memory_is_refused_up_front(tmp_path):
    """10^12 voxels in memory: refused before any allocation, with the size, the memory available and the
    remedy; lazily it opens and reads (the chunks were never written: the fill value)."""
    root = zarr.open_group(str(tmp_path / "big.zarr"), mode="w")
    root.create_array("raw", shape=(10000, 10000, 10000), chunks=(64, 64, 64), dtype=np.uint8, fill_value=3)
    with pytest.raises(VolumeTooLargeError, match=r"big.zarr:raw: \(10000, 10000, 10000\) uint8 is 931 GiB, more "
                                                  r"than the .* GiB of memory available; open it lazily with "
                                                  r"in_memory=False"):
        ef.open(tmp_path / "big.zarr/raw")
    volume = ef.open(tmp_path / "big.zarr/raw", in_memory=False)
    assert (volume.read_box((5000, 0, 0), (2, 3, 4), np.empty((1, 2, 3, 4), np.uint8)) == 3).all()


# --- HDF5 virtual datasets --------------------------------------------------------------------------------------

def write_vds(tmp_path, raw):
    """A virtual dataset as h5py writes it: its first half from a dataset of another file (named relative to the
    VDS file), its second half from a dataset of the same file ('.')."""
    half = raw.shape[0] // 2
    with h5py.File(tmp_path / "part.h5", "w") as file:
        file["raw"] = raw[:half]
    layout = h5py.VirtualLayout(raw.shape, raw.dtype)
    layout[:half] = h5py.VirtualSource("part.h5", "raw", raw[:half].shape)
    layout[half:] = h5py.VirtualSource(".", "rest", raw[half:].shape)
    with h5py.File(tmp_path / "vds.h5", "w") as file:
        file["rest"] = raw[half:]
        file.create_virtual_dataset("raw", layout, fillvalue=0)
    return tmp_path / "vds.h5"


def test_a_virtual_dataset_reads_its_sources(tmp_path, raw, monkeypatch):
    write_vds(tmp_path, raw)
    monkeypatch.chdir(tmp_path.parent)  # the source is found beside the VDS file, not from the working directory
    np.testing.assert_array_equal(ef.open(tmp_path / "vds.h5/raw").array[0], raw)
    np.testing.assert_array_equal(read_lazily(ef.open(tmp_path / "vds.h5/raw", in_memory=False))[0], raw)


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_virtual_dataset_with_a_missing_source_is_refused(tmp_path, raw, in_memory):
    write_vds(tmp_path, raw)
    (tmp_path / "part.h5").rename(tmp_path / "moved.h5")
    with pytest.raises(FileNotFoundError, match=r"vds.h5:raw: the virtual dataset's source file 'part.h5' \(dataset "
                                                r"'raw'\) does not exist beside .*vds.h5"):
        ef.open(tmp_path / "vds.h5/raw", in_memory=in_memory)
    with h5py.File(tmp_path / "part.h5", "w") as file:
        file["other"] = raw
    with pytest.raises(DatasetNotFoundError, match=r"vds.h5:raw: the virtual dataset's source file .*part.h5 has no "
                                                   r"dataset 'raw'"):
        ef.open(tmp_path / "vds.h5/raw", in_memory=in_memory)


def test_a_virtual_source_removed_while_read_lazily_is_refused(tmp_path, raw):
    write_vds(tmp_path, raw)
    volume = ef.open(tmp_path / "vds.h5/raw", in_memory=False)
    os.remove(tmp_path / "part.h5")
    with pytest.raises(FileNotFoundError, match=r"vds.h5:raw: the virtual dataset's source file .*part.h5 \(dataset "
                                                r"'raw'\) for the box at \(z, y, x\) = \(0, 0, 0\) is gone"):
        volume.read_box((0, 0, 0), (2, 4, 4), np.empty((1, 2, 4, 4), np.uint8))
    out = np.empty((1, 3, 10, 9), np.uint8)
    volume._reader.read((3, 0, 0), (3, 10, 9), out)  # the same file's part: no missing source under it
    np.testing.assert_array_equal(out[0], raw[3:])


# --- FIFOs, devices, directories and files where the other is expected ------------------------------------------

@pytest.fixture
def fifos():
    """Make FIFOs; at the end, open each for writing once so that a reader blocked on it (a regression) returns."""
    made = []

    def make(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for path in made:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waiting: nothing blocked
            pass


def outcome(call, seconds=10):
    """The exception ``call()`` raises within ``seconds``; fails the test if it blocks or returns."""
    result = {}

    def run():
        try:
            call()
        except BaseException as error:  # the outcome under test
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked on a non-regular file"
    assert "error" in result, "read a non-regular file"
    return result["error"]


def test_a_fifo_named_h5_is_refused_by_open_info_and_check(tmp_path, fifos):
    """The field report: emfast.open, emfast info and emfast check blocked forever on a FIFO named *.h5."""
    fifo = fifos(tmp_path / "sample.h5")
    config = tmp_path / "train.yaml"
    config.write_text("data:\n  samples:\n    - {file: sample.h5, raw: raw}\n"
                      "loader: {patch: [4, 8, 8], batch_size: 2}\n")
    script = (f"import emfast as ef, sys\nfrom emfast.cli import main\n"
              f"try:\n    ef.open({str(fifo)!r} + '/raw')\nexcept OSError as error:\n    print('open:', error)\n"
              f"print('info:', main(['info', {str(fifo)!r}]))\nprint('check:', main(['check', {str(config)!r}]))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    refusal = f"{fifo} is a FIFO (named pipe), not a regular file: an HDF5 file must be a file"
    assert f"open: {refusal}" in result.stdout
    assert "info: 2" in result.stdout and "check: 2" in result.stdout
    assert result.stderr.count(refusal) == 2, result.stderr


def test_non_regular_files_inside_stores_are_refused_without_blocking(tmp_path, raw, fifos):
    write_zarr(tmp_path / "meta.zarr", raw, zarr_format=2)
    os.remove(tmp_path / "meta.zarr/raw/.zarray")
    fifos(tmp_path / "meta.zarr/raw/.zarray")
    error = outcome(lambda: ef.open(tmp_path / "meta.zarr/raw"))
    assert "meta.zarr/raw/.zarray is a FIFO (named pipe), not a regular file: zarr metadata must be a file" \
        in str(error)

    array = write_zarr(tmp_path / "chunk.zarr", raw, zarr_format=2, compressors=None)
    os.remove(array / "0.0.0")
    fifos(array / "0.0.0")
    volume = ef.open(tmp_path / "chunk.zarr/raw", in_memory=False)
    error = outcome(lambda: volume.read_box((0, 0, 0), (4, 4, 4), np.empty((1, 4, 4, 4), np.uint8)))
    assert "chunk.zarr/raw/0.0.0 is a FIFO (named pipe), not a regular file: a zarr chunk must be a file" \
        in str(error)
    os.remove(array / "1.0.0")
    (array / "1.0.0").mkdir()  # a directory where a chunk file belongs
    error = outcome(lambda: volume.read_box((4, 0, 0), (2, 4, 4), np.empty((1, 2, 4, 4), np.uint8)))
    assert isinstance(error, IsADirectoryError) and "chunk.zarr/raw/1.0.0 is a directory" in str(error)

    dataset = write_n5(tmp_path / "a.n5", raw)
    os.remove(dataset / "0/0/0")
    fifos(dataset / "0/0/0")
    error = outcome(lambda: ef.open(tmp_path / "a.n5/raw"))
    assert "a.n5/raw/0/0/0 is a FIFO (named pipe), not a regular file: an N5 block must be a file" in str(error)
    (tmp_path / "b.n5").mkdir()
    fifos(tmp_path / "b.n5/raw/attributes.json")
    (tmp_path / "b.n5/attributes.json").write_text('{"n5": "2.5.1"}')
    error = outcome(lambda: ef.open(tmp_path / "b.n5/raw"))
    assert "is a FIFO (named pipe), not a regular file: an N5 attributes.json must be a file" in str(error)
    fifos(tmp_path / "pc/info")
    error = outcome(lambda: ef.open(tmp_path / "pc", format="precomputed"))
    assert "pc/info is a FIFO (named pipe), not a regular file: a precomputed info must be a file" in str(error)


def test_files_and_directories_where_the_other_belongs(tmp_path):
    (tmp_path / "file.zarr").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=r"file.zarr is a regular file, not a directory: a zarr store must "
                                                 r"be a directory"):
        ef.open(tmp_path / "file.zarr/raw")
    (tmp_path / "file.n5").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=r"file.n5 is a regular file, not a directory"):
        ef.open(tmp_path / "file.n5/raw")
    (tmp_path / "dir.h5").mkdir()
    with pytest.raises(IsADirectoryError, match=r"dir.h5 is a directory"):
        ef.open(tmp_path / "dir.h5/raw")
    with pytest.raises(OSError, match=r"/dev/null is a character device, not a regular file"):
        ef.open("/dev/null", "raw", format="hdf5")


@pytest.mark.parametrize("in_memory", [True, False])
def test_hdf5_metadata_and_chunks_get_the_same_errors(tmp_path, raw, in_memory):
    """HDF5 attributes and chunks go through the checks of the other formats, with the same error types."""
    with h5py.File(tmp_path / "a.h5", "w") as file:
        file.create_dataset("raw", data=raw, chunks=CHUNKS, compression="gzip").attrs["resolution"] = [40, 4]
        file.create_dataset("ok", data=raw, chunks=CHUNKS, compression="gzip")
    with pytest.raises(StoreMetadataError, match=r"a.h5:raw \(attributes\): malformed metadata: resolution = "
                                                 r"\[40, 4\]; expected 3 numbers"):
        ef.open(tmp_path / "a.h5/raw", in_memory=in_memory)
    with h5py.File(tmp_path / "a.h5", "a") as file:  # a chunk of twice the bytes, as a damaged writer leaves it
        file["ok"].id.write_direct_chunk((4, 4, 4), zlib.compress(raw[:4, :4, :4].astype(np.uint16).tobytes()))
    volume = ef.open(tmp_path / "a.h5/ok", in_memory=False)
    with pytest.raises(CorruptChunkError, match=r"a.h5:ok: the chunk at \(4, 4, 4\) decodes to 128 bytes, but the "
                                                r"metadata promise \(4, 4, 4\) uint8 = 64 bytes"):
        volume.read_box((4, 4, 4), (2, 4, 4), np.empty((1, 2, 4, 4), np.uint8))


def test_a_virtual_dataset_reading_its_own_file_is_not_taken_for_changed(tmp_path, raw):
    """A source in the virtual dataset's own file ("."), watched as the file itself."""
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("part", data=raw)
        layout = h5py.VirtualLayout(shape=raw.shape, dtype=raw.dtype)
        layout[...] = h5py.VirtualSource(".", "part", shape=raw.shape)
        f.create_virtual_dataset("raw", layout)
    with ef.hdf5(tmp_path / "v.h5", "raw", in_memory=False) as volume:
        np.testing.assert_array_equal(volume[:][0], raw)


def test_the_change_check_of_a_virtual_dataset_looks_only_at_the_sources_read(tmp_path, raw, monkeypatch):
    """Every missing block's check stat-ed every source: 4.5 ms per check over 1000 section files."""
    sources = []
    for z in range(raw.shape[0]):
        with h5py.File(tmp_path / f"section{z}.h5", "w") as f:
            f.create_dataset("s", data=raw[z:z + 1])
        sources.append(h5py.VirtualSource(f"section{z}.h5", "s", shape=(1,) + raw.shape[1:]))
    layout = h5py.VirtualLayout(shape=raw.shape, dtype=raw.dtype)
    for z, source in enumerate(sources):
        layout[z:z + 1] = source
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("raw", layout)
    with ef.hdf5(tmp_path / "v.h5", "raw", in_memory=False) as volume:
        source = volume.chunk_cache._source
        stats = []
        real_stat = os.stat
        monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(str(path)) or real_stat(path, *a, **k))
        assert not source.changed_since_opened()  # after every read of missing blocks: no source looked at
        assert [p for p in stats if "section" in p] == []
        out = np.empty((1, 1) + raw.shape[1:], raw.dtype)
        source.read((1, 0, 0), out.shape[1:], out)  # a read looks at the sources it overlaps
        monkeypatch.undo()
    np.testing.assert_array_equal(out[0], raw[1:2])
    assert [os.path.basename(path) for path in stats if "section" in path] == ["section1.h5"]


def test_external_raw_storage_is_watched_where_hdf5_reads_it(tmp_path, monkeypatch):
    """HDF5 reads a relative external file from the working directory; emfast watched the one beside the file."""
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    for folder, value in (("A", 1), ("B", 2)):
        np.full(64, value, np.uint8).tofile(tmp_path / folder / "raw.bin")
    with h5py.File(tmp_path / "A" / "f.h5", "w") as f:
        f.create_dataset("raw", shape=(4, 4, 4), dtype=np.uint8, external=[("raw.bin", 0, 64)])
    monkeypatch.chdir(tmp_path / "B")
    monkeypatch.delenv("HDF5_EXTFILE_PREFIX", raising=False)
    with ef.hdf5(tmp_path / "A" / "f.h5", "raw", in_memory=False) as volume:
        assert [file for file, _, _ in volume.stamp.data_files] == [tmp_path / "B" / "raw.bin"]
        assert (volume[:][0] == 2).all()


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("shape", [(64, 64), (2, 2, 2, 2, 2, 2)])
def test_a_zarr_array_that_is_no_volume_is_said_to_be_so_not_malformed(tmp_path, zarr_format, shape):
    """A 2-D image (a section, a mask) written by zarr-python was refused as "malformed metadata: shape = [64, 64];
    expected a list of 3 or 4 or 5 integers": its metadata is fine, its rank is not a volume's."""
    zarr.open_array(str(tmp_path / "image.zarr"), mode="w", shape=shape, dtype="uint8", chunks=shape,
                    zarr_format=zarr_format)[...] = 1
    with pytest.raises(StoreMetadataError) as refused:
        ef.open(str(tmp_path / "image.zarr"))
    message = str(refused.value)
    assert f"a {len(shape)}-D array (shape {list(shape)}); emfast reads volumes: 3-D (z, y, x)" in message
    assert "image.zarr" in message and "malformed" not in message


@pytest.mark.parametrize("damage,words", [('{"shape": [4, 4,', "not JSON"), ("", "not JSON"),
                                          ("[]", "expected a JSON object"), ("null", "expected a JSON object")])
@pytest.mark.parametrize("zarr_format,marker", [(2, ".zarray"), (3, "zarr.json")])
def test_info_names_a_zarr_array_whose_metadata_is_damaged(tmp_path, capsys, zarr_format, marker, damage, words):
    """A zarr v3 array with a cut-off, empty (a crash mid-write) or non-object zarr.json was left out of `emfast
    info`'s listing of its store (v2's was named), and asked by name gave zarr-python's bare "Expecting value:
    line 1 column 16", naming no file (a helper's trial, a second review). Both name the array and its metadata
    file, as convert does."""
    import zarr

    from emfast.cli import main

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=zarr_format)
    for name in ("good", "bad"):
        group.create_array(name, data=np.zeros((4, 4, 4), np.uint8))
    (tmp_path / "s.zarr" / "bad" / marker).write_text(damage)
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"bad: not read as a volume: .*s\.zarr:bad \({re.escape(marker)}\): malformed metadata: "
                     rf".*{words}", out) and "good: shape=(4, 4, 4)" in out, out
    assert main(["info", str(tmp_path / "s.zarr" / "bad")]) == 2
    assert re.search(rf"s\.zarr:bad \({re.escape(marker)}\): malformed metadata: .*{words}",
                     capsys.readouterr().err)


def test_info_lists_the_arrays_below_a_damaged_group(tmp_path, capsys):
    """A damaged group's zarr.json, listed as a node that cannot be read, hid the intact arrays below it (a second
    review): they are listed too."""
    import zarr

    from emfast.cli import main

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    sub = group.create_group("sub")
    sub.create_array("b", data=np.zeros((4, 4, 4), np.uint8))
    sub.create_group("mid").create_array("deep", data=np.zeros((4, 4, 4), np.uint8))
    (tmp_path / "s.zarr" / "sub" / "mid" / "zarr.json").unlink()  # a folder with no metadata, as tensorstore's
    (tmp_path / "s.zarr" / "sub" / "zarr.json").write_text('{"node_type": "gro')
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"sub: not read as a volume: .*malformed metadata", out) and "sub/b: shape=(4, 4, 4)" in out, out
    assert "sub/mid/deep: shape=(4, 4, 4)" in out, out


def test_info_names_a_zarr_array_whose_metadata_has_no_node_type(tmp_path, capsys):
    """A zarr.json without node_type was taken for a group: the array went unlisted (its chunk folders walked),
    and asked by name gave zarr-python's words naming no file (a third review)."""
    import zarr

    from emfast.cli import main

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    for name in ("good", "bad"):
        group.create_array(name, data=np.zeros((4, 4, 4), np.uint8))
    (tmp_path / "s.zarr" / "bad" / "zarr.json").write_text('{"zarr_format": 3}')
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    assert re.search(r"bad: not read as a volume: .*node_type", capsys.readouterr().out)
    assert main(["info", str(tmp_path / "s.zarr" / "bad")]) == 2
    assert re.search(r"s\.zarr:bad: malformed metadata in .*bad.zarr\.json: .*node_type", capsys.readouterr().err)


def test_info_lists_every_dataset_of_a_file_with_a_corrupt_chunk(tmp_path, capsys):
    """A corrupt chunk in one dataset ended `emfast info file.h5` at that dataset, the file's others never listed
    (a helper's trial): the values line says what failed, the others are listed, and the status says so."""
    import h5py

    from emfast.cli import main

    path = tmp_path / "damaged.h5"
    with h5py.File(path, "w") as f:
        for name in ("a", "b"):
            f.create_dataset(name, data=np.random.default_rng(0).integers(0, 255, (20, 20, 20), dtype=np.uint8),
                             chunks=(10, 10, 10), compression="gzip")
        chunk = f["a"].id.get_chunk_info(5)
    damaged = bytearray(path.read_bytes())
    damaged[chunk.byte_offset + 10:chunk.byte_offset + chunk.size] = bytes(chunk.size - 10)
    path.write_bytes(bytes(damaged))
    assert main(["info", str(path)]) == 2
    out, err = capsys.readouterr()
    assert re.search(r"a: shape=\(20, 20, 20\).*\n    values not read: .*damaged\.h5:a: cannot decompress the chunk "
                     r"at \(10, 0, 10\)", out), out
    assert re.search(r"\n  b: shape=\(20, 20, 20\).*\n    values from all 8 chunks", out), out
    assert "the values of 1 dataset could not be read" in err


def test_info_lists_arrays_linked_into_a_store_and_walks_a_link_cycle_once(tmp_path, capsys):
    """An array linked into a store (a raw volume shared between projects) opened by its path but was not listed
    by `emfast info` (a third review); a link back up the store is walked once, not forever."""
    import zarr

    from emfast.cli import main

    zarr.open_group(str(tmp_path / "s.zarr"), mode="w").create_array("own", data=np.zeros((4, 4, 4), np.uint8))
    zarr.create_array(str(tmp_path / "shared.zarr"), data=np.ones((4, 4, 4), np.uint8))
    (tmp_path / "s.zarr" / "linked").symlink_to(tmp_path / "shared.zarr", target_is_directory=True)
    (tmp_path / "s.zarr" / "loop").symlink_to(tmp_path / "s.zarr", target_is_directory=True)
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert "  linked: shape=(4, 4, 4)" in out and "  own: shape=(4, 4, 4)" in out and "loop/" not in out, out
