"""zarr (v2, v3, sharded), OME-Zarr, N5 and precomputed volumes: reads equal NumPy, metadata follows each
convention's documented definition, bad stores get clear errors, and stores are never written."""
import hashlib
import json
import os
import pickle
import re
import struct
import sys
import threading
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import CorruptChunkError, DatasetNotFoundError, StoreMetadataError, tensorstore_missing, zarr_missing

zarr = pytest.importorskip("zarr", reason="zarr is not installed (pip install 'emfast[zarr]')")
needs_tensorstore = pytest.mark.skipif(tensorstore_missing() is not None, reason=str(tensorstore_missing()))

SHAPE = (20, 40, 36)
CHUNKS = (8, 16, 16)


@pytest.fixture
def raw(rng):
    return rng.integers(0, 256, SHAPE, dtype=np.uint8)


def write_zarr(path, name, data, *, zarr_format=3, shards=None, compressor="zstd", attrs=None, fill_value=0):
    compressors = {"zstd": zarr.codecs.ZstdCodec(), "blosc": zarr.codecs.BloscCodec(), "none": None}[compressor] \
        if zarr_format == 3 else {"zstd": {"id": "zstd", "level": 1}, "blosc": {"id": "blosc"}, "none": None}[compressor]
    root = zarr.open_group(zarr.storage.LocalStore(str(path)), mode="a", zarr_format=zarr_format)  # not a URL
    chunks = CHUNKS if data.ndim == 3 else (data.shape[0],) + CHUNKS
    array = root.create_array(name, shape=data.shape, chunks=chunks, shards=shards, dtype=data.dtype,
                              compressors=compressors, fill_value=fill_value)
    array[...] = data
    array.attrs.update(attrs or {})
    return array


def tree_digest(path):
    """Every file's path, size, mtime and content under ``path``: any write to the store changes it."""
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            full = os.path.join(root, name)
            stat = os.stat(full)
            digest.update(f"{full}:{stat.st_size}:{stat.st_mtime_ns}".encode())
            with open(full, "rb") as file:
                digest.update(file.read())
    return digest.hexdigest()


def random_boxes(rng, count=30):
    for _ in range(count):
        extent = [int(rng.integers(1, s + 1)) for s in SHAPE]
        corner = [int(rng.integers(0, s - e + 1)) for s, e in zip(SHAPE, extent)]
        yield corner, extent


@pytest.mark.parametrize("zarr_format,shards,compressor", [
    (2, None, "zstd"), (2, None, "blosc"), (3, None, "zstd"), (3, None, "blosc"), (3, (16, 32, 32), "zstd"),
    (3, None, "none")], ids=["v2-zstd", "v2-blosc", "v3-zstd", "v3-blosc", "v3-sharded", "v3-raw"])
def test_zarr_reads_equal_numpy_lazily_and_in_memory(tmp_path, rng, raw, zarr_format, shards, compressor):
    write_zarr(tmp_path / "s.zarr", "volumes/raw", raw, zarr_format=zarr_format, shards=shards, compressor=compressor)
    before = tree_digest(tmp_path / "s.zarr")
    np.testing.assert_array_equal(ef.open(tmp_path / "s.zarr/volumes/raw").array[0], raw)
    with ef.open(tmp_path / "s.zarr", "volumes/raw", in_memory=False, cache_bytes=6 * 8 * 16 * 16) as volume:
        assert volume.chunks == CHUNKS and volume.shape == SHAPE and not volume.in_memory
        # every layout here is decoded by emfast (sharded ones through their shard index), exactly
        assert volume._reader._direct is not None
        for corner, extent in random_boxes(rng):
            out = np.empty((1,) + tuple(extent), np.uint8)
            volume.read_box(corner, extent, out)
            box = tuple(slice(c, c + e) for c, e in zip(corner, extent))
            np.testing.assert_array_equal(out[0], raw[box])
        assert volume.cache_stats.misses > 0
    assert tree_digest(tmp_path / "s.zarr") == before  # read-only: nothing written, not even metadata


def test_channels_and_big_endian_v2(tmp_path, rng):
    data = rng.integers(0, 2**16, (2,) + SHAPE, dtype=np.uint16).astype(">u2")
    write_zarr(tmp_path / "c.zarr", "raw", data, zarr_format=2)
    volume = ef.open(tmp_path / "c.zarr/raw", in_memory=False)
    assert volume.channels == 2 and volume.dtype == np.dtype(np.uint16)
    out = np.empty((2, 5, 6, 7), np.uint16)
    volume.read_box((1, 2, 3), (5, 6, 7), out)
    np.testing.assert_array_equal(out, data[:, 1:6, 2:8, 3:10])


def test_open_forms_mean_the_same(tmp_path, raw):
    write_zarr(tmp_path / "s.zarr", "volumes/raw", raw)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f.create_dataset("volumes/raw", data=raw, chunks=CHUNKS)
    for volume in (ef.open(tmp_path / "s.zarr/volumes/raw"), ef.open(tmp_path / "s.zarr", "volumes/raw"),
                   ef.open(str(tmp_path / "s.zarr") + "/volumes", "raw"), ef.open(tmp_path / "s.h5/volumes/raw"),
                   ef.open(tmp_path / "s.h5", "volumes/raw"), ef.open(tmp_path / "s.h5", "/volumes/raw")):
        np.testing.assert_array_equal(volume.array[0], raw)
    os.rename(tmp_path / "s.zarr", tmp_path / "plain")  # no suffix: detected from zarr.json
    np.testing.assert_array_equal(ef.open(tmp_path / "plain", "volumes/raw").array[0], raw)


def test_paths_as_users_write_them_elsewhere(tmp_path, raw, monkeypatch):
    """A suffix-less HDF5 file followed by its dataset (``noext/volumes/raw``, as ``open(noext, volumes/raw)``
    reads), a home-relative path (``~/...``, as configs and shells expand it), and cloud-volume's and
    tensorstore's ``file://`` URLs (percent-escapes decoded), for inputs and for outputs."""
    with h5py.File(tmp_path / "noext", "w") as f:
        f.create_dataset("volumes/raw", data=raw, chunks=CHUNKS)
    write_zarr(tmp_path / "my data.zarr", "raw", raw)
    monkeypatch.setenv("HOME", str(tmp_path))
    for path in (tmp_path / "noext/volumes/raw", "~/noext/volumes/raw", f"file://{tmp_path}/noext/volumes/raw",
                 "~/my data.zarr/raw", f"file://{tmp_path}/my%20data.zarr/raw"):
        np.testing.assert_array_equal(ef.open(path).array[0], raw, err_msg=str(path))
    np.testing.assert_array_equal(ef.hdf5("~/noext", "volumes/raw").array[0], raw)
    ef.predict(lambda batch: batch, raw, "~/out.zarr/p", patch_in=(5, 10, 8))
    assert (tmp_path / "out.zarr" / "p").is_dir() and not (tmp_path / "~").exists()
    with h5py.File(tmp_path / "noext") as f, pytest.raises(TypeError, match=re.escape(
            f"got a h5py._hl.dataset.Dataset: pass emfast.open('{tmp_path / 'noext'}', '/volumes/raw')")):
        ef.open(f["volumes/raw"])
    with pytest.raises(TypeError, match="got a numpy.ndarray: pass the path .* or an array in memory to "
                                        "emfast.Volume.from_array"):
        ef.open(raw)
    with pytest.raises(FileNotFoundError, match="~nosuchuser0/s.zarr"):  # not "could not determine home directory"
        ef.open("~nosuchuser0/s.zarr/raw")
    with pytest.raises(ValueError, match="file:// URL names a local path .* not one on host 'rel'"):
        ef.open("file://rel/s.zarr/raw")  # as tensorstore refuses it, not /s.zarr


def test_dot_segments_inside_a_container_and_url_fragments_are_refused_by_name(tmp_path, raw):
    """'..' after the container named a dataset ``../other.zarr/raw`` inside it: zarr refused it only once the
    output's container and lock existed ("The path '../x/raw' is invalid ..."), an input read as "malformed
    metadata", and HDF5 made a group named '..'. An unescaped '#' or '?' in a file:// URL cut the path there."""
    write_zarr(tmp_path / "s.zarr", "raw", raw)
    write_zarr(tmp_path / "other.zarr", "raw", raw)
    for path, dataset in ((f"{tmp_path}/s.zarr/../other.zarr/raw", None), (f"{tmp_path}/s.zarr/raw/..", None),
                          (tmp_path / "s.zarr", "../other.zarr/raw"), (tmp_path / "s.zarr", "volumes/../raw")):
        with pytest.raises(ValueError, match=r"'\.\.' cannot name a dataset inside a container"):
            ef.open(path, dataset)
    before = sorted(p.name for p in tmp_path.iterdir())
    for out in ("o.zarr/x/../../esc.zarr/p", "o.h5/../x", "o.zarr/p/.."):
        with pytest.raises(ValueError, match=re.escape(out)):
            ef.predict(lambda batch: batch, raw, str(tmp_path / out), patch_in=(5, 10, 8))
        with pytest.raises(ValueError, match=re.escape(out)):
            ef.io.convert(tmp_path / "s.zarr/raw", str(tmp_path / out))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # refused before anything was made
    for path, dataset in ((tmp_path / "s.zarr/raw/", None), (tmp_path / "s.zarr", "./raw")):  # as a path reads
        np.testing.assert_array_equal(ef.open(path, dataset).array[0], raw)
    (tmp_path / "h#sh").mkdir()
    write_zarr(tmp_path / "h#sh" / "s.zarr", "raw", raw)
    for mark in ("#", "?"):
        with pytest.raises(ValueError, match=re.escape("'#' starts a fragment and '?' a query")):
            ef.open(f"file://{tmp_path}/h{mark}sh/s.zarr/raw")
    np.testing.assert_array_equal(ef.open(f"file://{tmp_path}/h%23sh/s.zarr/raw").array[0], raw)


def _write_three_formats(folder, raw):
    """``raw`` as s.zarr/raw, s.h5/raw and s.n5/raw (z5py's) in ``folder``, and an empty folder/elsewhere."""
    import z5py
    write_zarr(folder / "s.zarr", "raw", raw)
    with h5py.File(folder / "s.h5", "w") as f:
        f.create_dataset("raw", data=raw, chunks=CHUNKS)
    z5py.File(str(folder / "s.n5"), mode="a").create_dataset("raw", data=raw, chunks=CHUNKS)
    (folder / "elsewhere").mkdir()


def test_a_lazy_volume_opened_by_a_relative_path_unpickles_in_another_folder(tmp_path, raw, monkeypatch):
    """Dask workers and spawned DataLoader workers may run in another working directory: a lazy volume pickled
    as its relative path was not found there ("zarr store not found: in.zarr"). So are predict's kept tiles."""
    from emfast.inference._cache import TileCache
    _write_three_formats(tmp_path, raw)
    monkeypatch.chdir(tmp_path)
    pickles = [pickle.dumps(ef.open(name, in_memory=False)) for name in ("s.zarr/raw", "s.h5/raw", "s.n5/raw")]
    tiles = pickle.dumps(TileCache.beside(Path("out.zarr"), "p"))
    monkeypatch.chdir(tmp_path / "elsewhere")
    for pickled in pickles:
        volume = pickle.loads(pickled)
        out = np.empty((1,) + raw.shape, raw.dtype)
        volume.read_box((0, 0, 0), raw.shape, out)
        np.testing.assert_array_equal(out[0], raw)
        volume.close()
    assert pickle.loads(tiles).folder == tmp_path / ".out.zarr+p.emfast-tiles"


@pytest.mark.parametrize("name", ["s.zarr/raw", "s.n5/raw", "s.h5/raw"])
def test_a_lazy_volume_opened_by_a_relative_path_reads_its_data_after_a_chdir(tmp_path, raw, monkeypatch, name):
    """A zarr or N5 volume read its chunks by the relative path it was opened with: after os.chdir every chunk was
    missing, read as the fill value, and a loader or predict delivered zeros without a word."""
    _write_three_formats(tmp_path, raw)
    monkeypatch.chdir(tmp_path)
    with ef.open(name, in_memory=False) as volume:
        monkeypatch.chdir(tmp_path / "elsewhere")
        np.testing.assert_array_equal(np.asarray(volume)[0], raw)


def test_gunpowder_attributes_align_labels_without_arguments(tmp_path, rng, raw):
    """gunpowder/funlib write resolution and offset (world units, z, y, x); labels covering part of raw line up."""
    labels = rng.integers(1, 9, (10, 20, 16), dtype=np.uint64)
    write_zarr(tmp_path / "s.zarr", "raw", raw, attrs={"resolution": [40, 4, 4], "offset": [0, 0, 0]})
    write_zarr(tmp_path / "s.zarr", "labels", labels, attrs={"resolution": [40, 4, 4], "offset": [200, 40, 48]})
    sample = ef.Sample(ef.open(tmp_path / "s.zarr/raw"), labels=ef.open(tmp_path / "s.zarr/labels"))
    np.testing.assert_array_equal(sample.placed_labels.origin, [5, 10, 12])
    with ef.Loader(ef.Dataset([sample]), patch=(4, 8, 8), batch_size=4, augment=[], seed=1) as loader:
        batch = loader.next_batch()
        for n, corner in enumerate(batch.positions):
            z, y, x = (int(c) for c in corner)
            np.testing.assert_array_equal(batch["labels"][n, 0], labels[z - 5:z - 1, y - 10:y - 2, x - 12:x - 4])
            expected = raw[z:z + 4, y:y + 8, x:x + 8].astype(np.float32) * np.float32(1 / 255)
            np.testing.assert_array_equal(batch["raw"][n, 0], expected)


def write_n5(path, dataset, data, block, compression="gzip", attrs=None):
    """An N5 dataset written from the specification, independently of the reader: (x, y, z) metadata, a
    big-endian header per block (mode 0, ndim, the block's size), big-endian elements with x fastest."""
    directory = path / dataset
    directory.mkdir(parents=True)
    (path / "attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    meta = {"dimensions": list(data.shape[::-1]), "blockSize": list(block[::-1]), "dataType": data.dtype.name,
            "compression": {"type": compression}, **(attrs or {})}
    (directory / "attributes.json").write_text(json.dumps(meta))
    for index in np.ndindex(*(-(-s // b) for s, b in zip(data.shape, block))):
        if index == (0, 1, 1):
            continue  # a block never written reads as 0
        piece = data[tuple(slice(i * b, (i + 1) * b) for i, b in zip(index, block))]
        body = piece.astype(piece.dtype.newbyteorder(">")).tobytes()
        if compression == "gzip":
            body = zlib.compress(body)  # zlib header: N5's gzip type accepts it (decoded with auto-detection)
        header = struct.pack(">HH", 0, 3) + struct.pack(">3I", *piece.shape[::-1])
        block_path = directory.joinpath(*(str(i) for i in index[::-1]))
        block_path.parent.mkdir(parents=True, exist_ok=True)
        block_path.write_bytes(header + body)


@pytest.mark.parametrize("compression", ["raw", "gzip"])
def test_n5_from_the_specification(tmp_path, rng, compression):
    data = rng.integers(0, 2**16, SHAPE, dtype=np.uint16)
    write_n5(tmp_path / "a.n5", "volumes/raw", data, CHUNKS, compression,
             attrs={"resolution": [4, 4, 40], "offset": [8, 4, 80]})
    expected = data.copy()
    expected[0:8, 16:32, 16:32] = 0
    volume = ef.open(tmp_path / "a.n5", "volumes/raw", in_memory=False)
    assert volume.resolution == (40.0, 4.0, 4.0) and volume.offset == (80.0, 4.0, 8.0)  # funlib: reversed in N5
    for corner, extent in random_boxes(rng):
        out = np.empty((1,) + tuple(extent), np.uint16)
        volume.read_box(corner, extent, out)
        np.testing.assert_array_equal(out[0], expected[tuple(slice(c, c + e) for c, e in zip(corner, extent))])
    (tmp_path / "b.n5").mkdir()
    write_n5(tmp_path / "b.n5", "raw", data, CHUNKS, attrs={"pixelResolution": {"dimensions": [4, 5, 40],
                                                                                  "unit": "nm"}})
    assert ef.open(tmp_path / "b.n5/raw").resolution == (40.0, 5.0, 4.0)


@needs_tensorstore
def test_n5_and_precomputed_written_by_tensorstore(tmp_path, rng):
    import tensorstore as ts
    data = rng.integers(0, 2**16, SHAPE, dtype=np.uint16)
    store = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path / "t.n5" / "raw")},
                     "metadata": {"dimensions": list(SHAPE[::-1]), "blockSize": list(CHUNKS[::-1]),
                                  "dataType": "uint16", "compression": {"type": "gzip"}}, "create": True}).result()
    store[...] = data.T
    np.testing.assert_array_equal(ef.open(tmp_path / "t.n5/raw").array[0], data)
    info = {"type": "image", "data_type": "uint16", "num_channels": 1}
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(tmp_path / "pc")},
                     "multiscale_metadata": info,
                     "scale_metadata": {"resolution": [4, 4, 40], "voxel_offset": [3, 2, 1],
                                        "size": list(SHAPE[::-1]), "chunk_size": list(CHUNKS[::-1]),
                                        "encoding": "raw"}, "create": True}).result()
    store[...] = data.T[..., np.newaxis]
    volume = ef.open(tmp_path / "pc", in_memory=False)
    assert volume.resolution == (40.0, 4.0, 4.0) and volume.offset == (40.0, 8.0, 12.0)
    out = np.empty((1, 5, 6, 7), np.uint16)
    volume.read_box((2, 3, 4), (5, 6, 7), out)
    np.testing.assert_array_equal(out[0], data[2:7, 3:9, 4:11])


def ome_attrs(axes, levels, version="0.4"):
    """OME-NGFF multiscales as the specification's example writes them."""
    return {"multiscales": [{"version": version, "name": "image",
                             "axes": [{"name": a, "type": {"c": "channel", "t": "time"}.get(a, "space")} for a in axes],
                             "datasets": [{"path": path, "coordinateTransformations": [
                                 {"type": "scale", "scale": scale}, {"type": "translation", "translation": shift}]}
                                 for path, scale, shift in levels],
                             "coordinateTransformations": [{"type": "scale", "scale": [1.0] * len(axes)}]}]}


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_ome_zarr_levels_axes_and_transforms(tmp_path, rng, zarr_format):
    full = rng.integers(0, 256, (1, 2) + SHAPE, dtype=np.uint8)  # t, c, z, y, x
    half = full[:, :, :, ::2, ::2].copy()
    for path, data in (("0", full), ("1", half)):
        root = zarr.open_group(str(tmp_path / "img.zarr"), mode="a", zarr_format=zarr_format)
        root.create_array(path, shape=data.shape, chunks=(1, 1) + CHUNKS, dtype=data.dtype)[...] = data
    attrs = ome_attrs("tczyx", [("0", [1, 1, 40, 4, 4], [0, 0, 0, 2, 2]), ("1", [1, 1, 40, 8, 8], [0, 0, 0, 4, 4])],
                      "0.4" if zarr_format == 2 else "0.5")
    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="a")
    root.attrs.update(attrs if zarr_format == 2 else {"ome": attrs})
    level0 = ef.open(tmp_path / "img.zarr", in_memory=False)
    assert level0.channels == 2 and level0.shape == SHAPE
    assert level0.resolution == (40.0, 4.0, 4.0) and level0.offset == (0.0, 2.0, 2.0)
    out = np.empty((2, 4, 5, 6), np.uint8)
    level0.read_box((1, 2, 3), (4, 5, 6), out)
    np.testing.assert_array_equal(out, full[0, :, 1:5, 2:7, 3:9])
    level1 = ef.open(tmp_path / "img.zarr", resolution=(40, 8, 8))
    # translated by half the voxel size difference (OME-NGFF's binned level, its first voxel's centre): level 1
    # starts where level 0 starts
    assert level1.shape == half.shape[2:] and level1.offset == (0.0, 2.0, 2.0)
    np.testing.assert_array_equal(level1.array, half[0])
    np.testing.assert_array_equal(ef.open(tmp_path / "img.zarr", level=1).array, half[0])
    with pytest.raises(ValueError, match=r"no level has resolution \(40.0, 2.0, 2.0\)"):
        ef.open(tmp_path / "img.zarr", resolution=(40, 2, 2))
    with pytest.raises(ValueError, match="level must be an index in"):
        ef.open(tmp_path / "img.zarr", level=2)
    for not_an_index in (True, 1.0, "1"):
        with pytest.raises(ValueError, match=rf"level must be an index in \[0, 2\), got {not_an_index!r}"):
            ef.open(tmp_path / "img.zarr", level=not_an_index)
    volume = pickle.loads(pickle.dumps(ef.open(tmp_path / "img.zarr", level=1, in_memory=False)))
    assert volume.name.endswith("img.zarr:1") and not volume.in_memory
    # NumPy's integers are indexes too (an argmin over the levels' voxel sizes, say): it was refused
    numpy_level = ef.open(tmp_path / "img.zarr", level=np.int64(1), in_memory=False)
    assert numpy_level.name == volume.name and numpy_level.shape == half.shape[2:]


def test_lazy_zarr_stream_equals_in_memory_and_any_thread_count(tmp_path, rng):
    raw = rng.integers(0, 256, (24, 64, 64), dtype=np.uint8)
    labels = rng.integers(1, 5, (24, 64, 64), dtype=np.uint64)
    write_zarr(tmp_path / "s.zarr", "raw", raw)
    write_zarr(tmp_path / "s.zarr", "labels", labels)

    def stream(in_memory, threads):
        volumes = [ef.open(tmp_path / "s.zarr", name, in_memory=in_memory) for name in ("raw", "labels")]
        volumes = [pickle.loads(pickle.dumps(v)) for v in volumes]  # as a DataLoader worker gets them
        with ef.Loader(*volumes, patch=(8, 24, 24), batch_size=4, threads=threads, augment=["mirror", "rotate"],
                       targets=[ef.Affinities()], seed=5, epoch_size=6) as loader:
            return [{k: batch[k].copy() for k in batch} for batch in loader]

    reference = stream(True, 1)
    for in_memory, threads in ((False, 1), (False, 2)):
        for a, b in zip(reference, stream(in_memory, threads)):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


def test_missing_chunks_read_as_the_fill_value(tmp_path, raw):
    root = zarr.open_group(str(tmp_path / "f.zarr"), mode="w")
    array = root.create_array("raw", shape=SHAPE, chunks=CHUNKS, dtype=np.uint8, fill_value=7)
    array[0:8, 0:16, 0:16] = raw[0:8, 0:16, 0:16]  # one chunk written; the rest were never stored
    volume = ef.open(tmp_path / "f.zarr/raw", in_memory=False)
    out = np.empty((1, 12, 20, 20), np.uint8)
    volume.read_box((0, 0, 0), (12, 20, 20), out)
    expected = np.full((12, 20, 20), 7, np.uint8)
    expected[0:8, 0:16, 0:16] = raw[0:8, 0:16, 0:16]
    np.testing.assert_array_equal(out[0], expected)


def test_bad_stores_fail_clearly(tmp_path, raw):
    with pytest.raises(FileNotFoundError, match="zarr store not found"):
        ef.open(tmp_path / "none.zarr/raw")
    with pytest.raises(FileNotFoundError, match="no such file or store"):
        ef.open(tmp_path / "nothing")
    write_zarr(tmp_path / "s.zarr", "volumes/raw", raw)
    write_zarr(tmp_path / "s.zarr", "volumes/labels", raw)
    with pytest.raises(DatasetNotFoundError, match="'volumes/rwa' not found .* arrays there: volumes/labels, "
                                                   "volumes/raw"):
        ef.open(tmp_path / "s.zarr/volumes/rwa")
    with pytest.raises(DatasetNotFoundError, match="is a group, not an array"):
        ef.open(tmp_path / "s.zarr/volumes")
    # an unsupported codec, in v2 metadata as another tool might write it
    write_zarr(tmp_path / "c.zarr", "raw", raw, zarr_format=2)
    meta = json.loads((tmp_path / "c.zarr/raw/.zarray").read_text())
    meta["compressor"] = {"id": "nosuchcodec"}
    (tmp_path / "c.zarr/raw/.zarray").write_text(json.dumps(meta))
    with pytest.raises(StoreMetadataError, match="c.zarr:raw: malformed metadata in .*nosuchcodec"):
        ef.open(tmp_path / "c.zarr/raw")
    # a corrupt chunk: the error names the store and the chunk
    write_zarr(tmp_path / "k.zarr", "raw", raw)
    chunk = tmp_path / "k.zarr/raw/c/1/1/0"
    chunk.write_bytes(b"not zstd" * 10)
    volume = ef.open(tmp_path / "k.zarr/raw", in_memory=False)
    with pytest.raises(OSError, match="k.zarr:raw: cannot decode chunk c/1/1/0"):  # emfast's own decoding
        volume.read_box((8, 16, 0), (8, 16, 16), np.empty((1, 8, 16, 16), np.uint8))
    source = volume._reader
    with pytest.raises(CorruptChunkError, match=r"k.zarr:raw: cannot read chunk \(z, y, x\) = \(1, 1, 0\)"):
        source.read((4, 4, 0), (8, 16, 8), np.empty((1, 8, 16, 8), np.uint8))  # not one chunk: zarr-python
    # inconsistent metadata
    write_n5(tmp_path / "bad.n5", "raw", raw, CHUNKS)
    meta = json.loads((tmp_path / "bad.n5/raw/attributes.json").read_text())
    meta["blockSize"] = [16, 16]
    (tmp_path / "bad.n5/raw/attributes.json").write_text(json.dumps(meta))
    with pytest.raises(StoreMetadataError, match=r"bad.n5:raw \(attributes.json\): malformed metadata: blockSize = "
                                                  r"\[16, 16\]; expected a list of 3 integers >= 1"):
        ef.open(tmp_path / "bad.n5/raw")
    root = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    root.create_array("0", shape=SHAPE, chunks=CHUNKS, dtype=np.uint8)
    root.attrs.update(ome_attrs("czyx", [("0", [1, 40, 4, 4], [0, 0, 0, 0])]))
    with pytest.raises(ValueError, match="3-D array but 4 axes"):
        ef.open(tmp_path / "o.zarr")
    root.attrs.update(ome_attrs("zyx", [("1", [40, 4, 4], [0, 0, 0])]))
    with pytest.raises(ValueError, match="names level '1', which the store does not have"):
        ef.open(tmp_path / "o.zarr")


def test_a_chunk_rewritten_while_read(tmp_path, raw):
    """Documented behaviour: a block already in the cache keeps the data it had when read; a block read later gets
    the store's data of that moment; a chunk is never seen half written by zarr's own writes (whole files)."""
    array = write_zarr(tmp_path / "s.zarr", "raw", raw)
    volume = ef.open(tmp_path / "s.zarr/raw", in_memory=False)
    out = np.empty((1, 8, 16, 16), np.uint8)
    volume.read_box((0, 0, 0), (8, 16, 16), out)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            array[0:8, 0:16, 0:16] = 255 - raw[0:8, 0:16, 0:16]
            array[0:8, 0:16, 0:16] = raw[0:8, 0:16, 0:16]

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(50):
            volume._cache.clear()
            volume.read_box((0, 0, 0), (8, 16, 16), out)
            assert np.array_equal(out[0], raw[0:8, 0:16, 0:16]) or np.array_equal(out[0], 255 - raw[0:8, 0:16, 0:16])
    finally:
        stop.set()
        thread.join()


def test_zarr_in_configs_and_emfast_info(tmp_path, raw, capsys):
    from emfast.cli import main
    from emfast.config import load_config
    write_zarr(tmp_path / "s.zarr", "volumes/raw", raw, attrs={"resolution": [40, 4, 4]})
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  samples:\n    - {file: s.zarr, raw: volumes/raw, lazy: true}\n"
                      "loader: {patch: [4, 8, 8], batch_size: 2}\n")
    with load_config(config).loader() as loader:
        assert loader.next_batch()["raw"].shape == (2, 1, 4, 8, 8)
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert "volumes/raw" in out and "(20, 40, 36)" in out


def test_a_missing_optional_dependency_is_named(tmp_path, raw, monkeypatch):
    write_zarr(tmp_path / "s.zarr", "raw", raw)
    monkeypatch.setitem(sys.modules, "zarr", None)  # as if zarr were not installed
    assert "pip install 'emfast[zarr]'" in zarr_missing()
    with pytest.raises(ImportError, match=r"emfast\[zarr\]"):
        ef.open(tmp_path / "s.zarr/raw")
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    assert "pip install 'emfast[tensorstore]'" in tensorstore_missing()
    # one built for another NumPy (tensorstore 0.1.60 under NumPy 2) raised AttributeError past this check
    (tmp_path / "broken" / "tensorstore").mkdir(parents=True)
    (tmp_path / "broken" / "tensorstore" / "__init__.py").write_text("raise AttributeError('_ARRAY_API not found')")
    monkeypatch.delitem(sys.modules, "tensorstore")
    monkeypatch.syspath_prepend(str(tmp_path / "broken"))
    assert "cannot be imported here (AttributeError: _ARRAY_API not found)" in tensorstore_missing()
    fsspec = pytest.importorskip("fsspec")
    from emfast.io._remote import remote_missing
    monkeypatch.setattr(fsspec, "__version__", "2024.3.0")  # its forked children hung on the parent's event loop
    assert "needs fsspec 2025.3.2 or later (this is 2024.3.0" in remote_missing()
    with pytest.raises(ImportError, match="needs fsspec 2025.3.2 or later"):
        ef.open("http://127.0.0.1:9/s.zarr/raw", in_memory=False)
    monkeypatch.setattr(fsspec, "__version__", "2025.3.2.post1")
    assert remote_missing() is None


def test_convert_hdf5_to_zarr_resumes_byte_identical_and_never_clobbers(tmp_path, rng, monkeypatch, capsys):
    from emfast.cli import main
    from emfast.io import _convert
    data = rng.integers(0, 2**16, (2,) + SHAPE, dtype=np.uint16)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        d = f.create_dataset("volumes/raw", data=data, chunks=(2,) + CHUNKS, compression="gzip")
        d.attrs["resolution"] = (40.0, 4.0, 4.0)
        d.attrs["offset"] = (80.0, 8.0, 8.0)
        d.attrs["note"] = "from the microscope"
    source_before = tree_digest(tmp_path / "in.h5")
    args = ["convert", str(tmp_path / "in.h5/volumes/raw"), str(tmp_path / "whole.zarr/raw"), "--chunks", "8", "8",
            "16"]
    assert main(args) == 0
    whole = ef.open(tmp_path / "whole.zarr/raw")
    np.testing.assert_array_equal(whole.array, data)
    assert whole.resolution == (40.0, 4.0, 4.0) and whole.offset == (80.0, 8.0, 8.0) and whole.chunks == (8, 8, 16)
    attrs = dict(zarr.open_array(str(tmp_path / "whole.zarr/raw"), mode="r").attrs)
    assert attrs["note"] == "from the microscope" and attrs["emfast_convert"]["complete"] is True

    # interrupted after 3 tiles (as Ctrl-C would), then resumed by the same command
    written = []
    real = _convert.OutputWriter.write

    def failing(self, corner, tile):
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(corner)
        real(self, corner, tile)

    monkeypatch.setattr(_convert, "TILE_BYTES", 2 * 8 * 8 * 16 * 2)
    monkeypatch.setattr(_convert.OutputWriter, "write", failing)
    args[2] = str(tmp_path / "resumed.zarr/raw")
    assert main(args) == 130
    record = dict(zarr.open_array(str(tmp_path / "resumed.zarr/raw"), mode="r").attrs)["emfast_convert"]
    assert record["done"] == 3 and record["complete"] is False
    monkeypatch.setattr(_convert.OutputWriter, "write", real)
    assert main(args) == 0
    np.testing.assert_array_equal(ef.open(tmp_path / "resumed.zarr/raw").array, data)
    chunk_files = 0
    for root, _, files in os.walk(tmp_path / "whole.zarr/raw/c"):  # the chunks equal the uninterrupted run's
        for name in files:
            other = os.path.join(str(root).replace("whole.zarr", "resumed.zarr"), name)
            with open(os.path.join(root, name), "rb") as a, open(other, "rb") as b:
                assert a.read() == b.read()
            chunk_files += 1
    assert chunk_files == 3 * 5 * 3
    # an existing output that is not an unfinished conversion of this source is refused, then replaced on request
    capsys.readouterr()
    other = ["convert", str(tmp_path / "in.h5/volumes/raw"), str(tmp_path / "whole.zarr/raw"), "--compression", "gzip"]
    assert main(other) == 2
    assert "exists and it is a conversion with another source or other settings" in capsys.readouterr().err
    assert main(other + ["--overwrite"]) == 0
    np.testing.assert_array_equal(ef.open(tmp_path / "whole.zarr/raw").array, data)
    assert main(["convert", str(tmp_path / "whole.zarr/raw"), str(tmp_path / "back.h5/raw"), "--compression",
                 "gzip"]) == 0
    np.testing.assert_array_equal(ef.open(tmp_path / "back.h5/raw").array, data)
    assert main(["convert", str(tmp_path / "whole.zarr/raw"), str(tmp_path / "whole.zarr/raw/copy")]) == 2
    assert "inside the source" in capsys.readouterr().err
    assert tree_digest(tmp_path / "in.h5") == source_before


def test_emfast_info_names_a_missing_dataset_and_what_is_there(tmp_path, raw, capsys):
    """`emfast info file.h5/wrong/path` used to list the whole file and exit 0; for zarr it printed 'volumes/rwa'.
    Now every format says the path does not exist, lists the members of its deepest existing group, exits 2."""
    from emfast.cli import main
    with h5py.File(tmp_path / "a.h5", "w") as file:
        file["volumes/raw"] = raw
        file["volumes/labels"] = raw
    write_zarr(tmp_path / "s.zarr", "volumes/raw", raw)
    write_zarr(tmp_path / "s.zarr", "volumes/labels", raw)
    write_n5(tmp_path / "n.n5", "volumes/raw", raw, CHUNKS)
    cases = [("a.h5/wrong/path", r"a.h5 has no dataset or group 'wrong/path'; the root holds: volumes"),
             ("a.h5/volumes/rwa", r"a.h5 has no dataset or group 'volumes/rwa'; 'volumes' holds: labels, raw"),
             ("s.zarr/volumes/rwa", r"s.zarr has no dataset or group 'volumes/rwa'; 'volumes' holds: labels, raw"),
             ("n.n5/volumes/rwa", r"n.n5 has no dataset or group 'volumes/rwa'; 'volumes' holds: raw")]
    for path, message in cases:
        assert main(["info", str(tmp_path / path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and re.search(r"emfast: error: .*" + message, captured.err), captured.err
    assert main(["info", str(tmp_path / "a.h5/volumes/raw")]) == 0
    out = capsys.readouterr().out
    assert "volumes/raw: shape=(20, 40, 36)" in out and "labels" not in out


def test_a_paintera_label_multiset_dataset_is_refused_by_name(tmp_path, capsys):
    """Paintera stores label multisets in N5 with ``isLabelMultiset: true``: varlength blocks of serialised
    (id, count) lists under ``dataType: uint8`` (imglib2-label-multisets). They were read as uint8 voxels: a
    "corrupt" block, or zeros where no block was written (found by a helper). Refused by name now; ``info`` lists
    the dataset with the reason and goes on."""
    import gzip
    import json
    import struct
    from emfast.cli import main
    root = tmp_path / "paintera.n5"
    dataset = root / "volumes/labels/data/s0"
    dataset.mkdir(parents=True)
    (root / "attributes.json").write_text(json.dumps({"n5": "2.1.0"}))
    (dataset / "attributes.json").write_text(json.dumps({
        "dimensions": [8, 8, 4], "blockSize": [8, 8, 4], "dataType": "uint8", "isLabelMultiset": True,
        "maxId": 7, "compression": {"type": "gzip", "level": -1}}))
    voxels = 8 * 8 * 4  # one list, (label 7, count 1), for every voxel
    body = struct.pack(">iq", 1, 7) + struct.pack(f">{voxels}i", *[0] * voxels) + struct.pack(">iqi", 1, 7, 1)
    (dataset / "0/0").mkdir(parents=True)
    (dataset / "0/0/0").write_bytes(struct.pack(">HH3II", 1, 3, 8, 8, 4, len(body)) + gzip.compress(body))
    plain = root / "volumes/raw"
    plain.mkdir(parents=True)
    (plain / "attributes.json").write_text(json.dumps({"dimensions": [8, 8, 4], "blockSize": [8, 8, 4],
                                                       "dataType": "uint8", "compression": {"type": "raw"}}))
    for in_memory in (True, False):
        with pytest.raises(ValueError, match="s0 is a Paintera label-multiset dataset"):
            ef.open(dataset, in_memory=in_memory)
    assert main(["info", str(root)]) == 0
    listing = capsys.readouterr().out
    assert "not read as a volume" in listing and "label-multiset" in listing and "volumes/raw: " in listing


def test_objects_in_hand_get_advice_that_leads_somewhere(tmp_path, raw):
    """Open objects passed where a path goes: the hints dropped the dataset given with an open h5py.File (the
    command suggested failed), sent predict's out= to the input's APIs without naming out, and sent convert's
    source to Volume.from_array, which convert refuses too."""
    zarr = pytest.importorskip("zarr")
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("vol/raw", data=raw)
    with h5py.File(tmp_path / "a.h5", "r") as file:
        for opener in (ef.hdf5, ef.open):
            for node, dataset in ((file, "vol/raw"), (file["vol"], "raw")):  # a group and the dataset in it too
                with pytest.raises(TypeError, match=re.escape(f"pass emfast.open({str(tmp_path / 'a.h5')!r}, "
                                                              "'vol/raw')")):
                    opener(node, dataset)
        for out in (file["vol/raw"], zarr.open_array(str(tmp_path / "o.zarr"), mode="w", shape=(1, 2, 2, 2))):
            with pytest.raises(TypeError, match=r"^out must be the path of the output, a dataset in a \.zarr or \.h5 "
                                                r"container \(e\.g\. pred\.zarr/p\), got a "):
                ef.predict(lambda batch: batch, raw, out, patch_in=(4, 8, 8))
    for source in (raw, ef.Volume.from_array(raw)):
        with pytest.raises(ef.io.ConvertError, match=r"^source_path must be the path of a file or store .* write an "
                                                     r"array in memory with zarr-python or h5py"):
            ef.io.convert(source, tmp_path / "c.zarr/raw")
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.parametrize("layout", ["sharded", "Fortran order", "x y z axes", "channels"])
def test_a_large_box_read_through_zarr_python_in_slabs_is_the_box(tmp_path, raw, layout, monkeypatch):
    """zarr-python returns a box as a new array, then copied: a 256 MiB conversion tile took 512 MiB (a helper
    measured 2.06 times tile_bytes). Read in slabs of whole chunk rows, a box must still be the box, whatever the
    layout zarr-python reads (unaligned corners, axes stored in another order, channels)."""
    from emfast.io import _zarr

    data = raw if layout != "channels" else np.stack([raw, 255 - raw])
    if layout == "sharded":
        write_zarr(tmp_path / "s.zarr", "raw", data, shards=tuple(2 * c for c in CHUNKS))
    elif layout == "Fortran order":
        zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=2).create_array(
            "raw", data=data, chunks=CHUNKS, order="F")
    elif layout == "x y z axes":
        zarr.open_group(str(tmp_path / "s.zarr"), mode="w").create_array(
            "raw", data=np.ascontiguousarray(data.transpose(2, 1, 0)), chunks=CHUNKS[::-1],
            dimension_names=["x", "y", "z"])
    else:
        write_zarr(tmp_path / "s.zarr", "raw", data)
    monkeypatch.setattr(_zarr, "READ_SLAB_BYTES", 1)  # a slab per chunk row
    with ef.open(str(tmp_path / "s.zarr/raw"), in_memory=False) as volume:
        expected = data if data.ndim == 4 else data[np.newaxis]
        corner = (1, 3, 2)
        extent = tuple(s - c - 1 for s, c in zip(volume.shape, corner))
        out = np.empty((volume.channels,) + extent, volume.dtype)
        volume._cache._source.read(corner, extent, out)
        np.testing.assert_array_equal(out, expected[(slice(None),) + tuple(slice(c, c + e)
                                                                           for c, e in zip(corner, extent))])
