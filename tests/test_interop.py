"""Conformance: stores written at test time by the field's own tools (zarr-python, tensorstore, ome-zarr-py, z5py,
cloud-volume, funlib.persistence, h5py in the CREMI layout) read with emfast, in memory, lazily and through a
Loader, with the geometry (axis order, voxel size, offset in nm) each tool reports. Bad metadata is refused naming
the store, the array and the values; no store is ever written by reading it."""
import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import StoreMetadataError
from emfast.io._open import split_path

zarr = pytest.importorskip("zarr")

SHAPE = (13, 17, 11)  # no chunking below divides it
CHUNKINGS = [(4, 5, 3), (13, 6, 11)]


def needs(module):
    """The tool, or a skip naming it and the extra that installs it."""
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install '.[interop]')")


def random_volume(dtype, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, min(np.iinfo(dtype).max, 2 ** 40), shape, dtype=dtype, endpoint=True)


def checksums(path):
    """Every file below ``path`` (or the file itself) with its SHA-256, to prove reading writes nothing."""
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    return {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files}


def assert_reads(path, expected, voxel_size=None, offset=None, **open_args):
    """emfast reads ``expected`` ((c,) z, y, x) from ``path`` in memory, lazily (whole and a box across chunk
    borders) with the geometry given, and leaves every file of the store as it was."""
    store = str(split_path(path)[0])
    before = checksums(store)
    expected = expected if expected.ndim == 4 else expected[np.newaxis]
    for in_memory in (True, False):
        with ef.open(path, in_memory=in_memory, **open_args) as volume:
            assert (volume.channels,) + volume.shape == expected.shape
            assert volume.resolution == (None if voxel_size is None else pytest.approx(tuple(voxel_size)))
            assert volume.offset == (None if offset is None else pytest.approx(tuple(offset)))
            np.testing.assert_array_equal(np.asarray(volume), expected)
            corner = tuple(s // 3 for s in volume.shape)
            extent = tuple(s - c - 1 for s, c in zip(volume.shape, corner))
            out = volume.read_box(corner, extent, np.empty((volume.channels,) + extent, volume.dtype))
            np.testing.assert_array_equal(out, expected[(slice(None),) + tuple(slice(c, c + e)
                                                                                for c, e in zip(corner, extent))])
    assert checksums(store) == before, f"reading {path} changed files of {store}"


def assert_aligned(raw_path, labels_path, **raw_args):
    """A Loader over raw and labels written with ``labels == raw + 1`` where they overlap: every example's labels
    equal its raw + 1 voxel by voxel, so the two are placed from their metadata exactly."""
    raw = ef.open(raw_path, in_memory=False, **raw_args)
    labels = ef.open(labels_path, in_memory=False)
    sample = ef.Sample(raw, labels, name="interop")
    with ef.Loader(sample, patch=(3, 4, 4), batch_size=4, epoch_size=3, seed=1, augment=(), normalize=(1.0, 0.0),
                   threads=1) as loader:
        for batch in loader:
            for n in range(batch.valid):
                np.testing.assert_array_equal(batch["labels"][n, 0], batch["raw"][n, 0].astype(np.uint64) + 1)


# zarr-python ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint16, np.float32, np.uint64])
@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("layout", ["v2-zstd", "v2-blosc-F", "v3-gzip", "v3-sharded"])
def test_zarr_python_arrays(tmp_path, dtype, chunks, layout):
    data = random_volume(dtype)
    version = 2 if layout.startswith("v2") else 3
    options = {"v2-zstd": {"compressors": [{"id": "zstd"}]},
               "v2-blosc-F": {"compressors": [{"id": "blosc"}], "order": "F"},
               "v3-gzip": {"compressors": [zarr.codecs.GzipCodec()]},
               "v3-sharded": {"shards": tuple(2 * c for c in chunks)}}[layout]
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=version)
    array = root.create_array("volumes/raw", shape=SHAPE, chunks=chunks, dtype=dtype, **options)
    array[...] = data
    array.attrs.update(resolution=[40, 4, 4], offset=[80, 8, 12])
    assert_reads(tmp_path / "s.zarr/volumes/raw", data, (40, 4, 4), (80, 8, 12))


@pytest.mark.parametrize("names", [["x", "y", "z"], ["z", "y", "x", "c"], ["y", "c", "x", "z"]])
def test_zarr_v3_dimension_names_in_another_order_are_read_as_zyx(tmp_path, names):
    """Read through an axis permutation, channels first: (c, z, y, x) whatever the stored order."""
    data = random_volume(np.uint16, ((2,) if "c" in names else ()) + SHAPE)
    canonical = [a for a in "czyx" if a in names]
    stored = np.transpose(data, [canonical.index(a) for a in names])
    array = zarr.create_array(str(tmp_path / "s.zarr"), shape=stored.shape, chunks=(4, 5, 3, 2)[:len(names)],
                              dtype=np.uint16, dimension_names=names)
    array[...] = stored
    assert_reads(tmp_path / "s.zarr", data)


# tensorstore ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.float32])
@pytest.mark.parametrize("driver", ["zarr", "zarr3"])
def test_tensorstore_zarr_array_without_group_metadata(tmp_path, dtype, driver):
    """tensorstore writes the array's metadata only: no group above ``volumes/raw``, its normal layout."""
    ts = needs("tensorstore")
    data = random_volume(dtype)
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(tmp_path / "s.zarr/volumes/raw")},
            "schema": {"domain": {"shape": list(SHAPE)}, "dtype": np.dtype(dtype).name,
                       "chunk_layout": {"chunk": {"shape": [4, 5, 3]}}}, "create": True}
    if driver == "zarr3":
        spec["schema"]["domain"]["labels"] = ["z", "y", "x"]
    ts.open(spec).result()[...] = data
    assert not (tmp_path / "s.zarr/.zgroup").exists() and not (tmp_path / "s.zarr/zarr.json").exists()
    assert_reads(tmp_path / "s.zarr/volumes/raw", data)


def test_tensorstore_dimension_units_are_the_voxel_size(tmp_path):
    """tensorstore's zarr3 driver keeps the schema's units in the attribute ``dimension_units`` ("40 nm", "0.004 um",
    none for channels): they are the voxel size, as tensorstore reads them (emfast read no voxel size)."""
    ts = needs("tensorstore")
    data = random_volume(np.uint8, (2,) + SHAPE)
    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "s.zarr/raw")},
                     "schema": {"domain": {"shape": list(data.shape)}, "dtype": "uint8",
                                "dimension_units": [None, [40, "nm"], [0.008, "um"], "4nm"]},
                     "create": True}).result()
    store[...] = data
    assert [u and (u.multiplier, u.base_unit) for u in store.dimension_units] == [
        None, (40, "nm"), (0.008, "um"), (4, "nm")]
    assert_reads(tmp_path / "s.zarr/raw", data, (40, 8, 4), (0, 0, 0))
    metadata = json.loads((tmp_path / "s.zarr/raw/zarr.json").read_text())
    metadata["attributes"]["resolution"] = [40, 8, 8]
    (tmp_path / "s.zarr/raw/zarr.json").write_text(json.dumps(metadata))
    with pytest.raises(StoreMetadataError, match=r"contradictory metadata: resolution = \[40, 8, 8\] but "
                                                 r"dimension_units = \[None, '40 nm', '0.008 um', '4 nm'\]"):
        ef.open(tmp_path / "s.zarr/raw")


def test_a_5d_level_with_one_time_point_opens_by_its_path(tmp_path):
    """An OME-Zarr 0.5 level is a (t, c, z, y, x) array naming its dimensions: opened by its own path it reads as the
    image does with level= (it was refused as malformed: "expected a list of 3 or 4 integers")."""
    data = random_volume(np.uint16, (1, 2) + SHAPE)
    array = zarr.create_array(tmp_path / "image.zarr", name="s0", shape=data.shape, chunks=(1, 1, 4, 5, 3),
                              dtype=np.uint16, dimension_names=["t", "c", "z", "y", "x"])
    array[...] = data
    assert_reads(tmp_path / "image.zarr/s0", data[0])


def test_tensorstore_zarr3_with_x_first_is_read_as_zyx(tmp_path):
    ts = needs("tensorstore")
    data = random_volume(np.uint16)
    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "s.zarr/raw")},
                     "schema": {"domain": {"shape": list(SHAPE[::-1]), "labels": ["x", "y", "z"]}, "dtype": "uint16",
                                "chunk_layout": {"chunk": {"shape": [3, 5, 4]}}}, "create": True}).result()
    store[...] = data.T
    assert_reads(tmp_path / "s.zarr/raw", data)


@pytest.mark.parametrize("compression", ["raw", "gzip", "bzip2", "xz", "blosc", "zstd"])
def test_tensorstore_n5_with_units(tmp_path, compression):
    """tensorstore's N5 writes ``resolution`` and ``units`` in N5's (x, y, z) order; micrometres become nm."""
    ts = needs("tensorstore")
    data = random_volume(np.uint16)
    codec = {"type": compression, **({"cname": "zstd", "clevel": 3, "shuffle": 1} if compression == "blosc" else {})}
    store = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path / "s.n5/raw")},
                     "metadata": {"dimensions": list(SHAPE[::-1]), "blockSize": [3, 5, 4], "dataType": "uint16",
                                  "compression": codec},
                     "schema": {"dimension_units": [[4, "nm"], [0.004, "um"], [40, "nm"]]}, "create": True}).result()
    store[...] = data.T
    (tmp_path / "s.n5/attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    assert_reads(tmp_path / "s.n5/raw", data, (40, 4, 4), (0, 0, 0))  # a missing offset is 0
    units = [u.base_unit for u in store.dimension_units]
    assert [u.multiplier for u in store.dimension_units] == [4, 0.004, 40] and units == ["nm", "um", "nm"]


def test_tensorstore_n5_labels_are_its_axes(tmp_path):
    """tensorstore's N5 driver writes its dimension labels as ``axes``, in the order of ``dimensions``: x first is
    N5's own order, read as (c, z, y, x); an array labelled z first is stored z first and is refused naming its
    axes (it was read transposed, z and x swapped, without a word)."""
    ts = needs("tensorstore")
    data = random_volume(np.uint8, (3,) + SHAPE)

    def write(name, labels, array):
        store = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path / f"s.n5/{name}")},
                         "schema": {"domain": {"shape": list(array.shape), "labels": labels}, "dtype": "uint8",
                                    "chunk_layout": {"read_chunk": {"shape": [4] * array.ndim}}},
                         "metadata": {"compression": {"type": "raw"}}, "create": True}).result()
        store[...] = array
        assert json.loads((tmp_path / f"s.n5/{name}/attributes.json").read_text())["axes"] == labels

    write("xyz", ["x", "y", "z"], data[0].T)
    write("xyzc", ["x", "y", "z", "c"], data.T)
    write("zyx", ["z", "y", "x"], data[0])
    (tmp_path / "s.n5/attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    assert_reads(tmp_path / "s.n5/xyz", data[0])
    assert_reads(tmp_path / "s.n5/xyzc", data)
    with pytest.raises(StoreMetadataError, match=r"s.n5:zyx \(attributes.json\): its axes are listed as "
                                                 r"\['z', 'y', 'x'\]; .*N5 lists axes x first"):
        ef.open(tmp_path / "s.n5/zyx")


@pytest.mark.parametrize("channel_block", [2, 4])
def test_tensorstore_n5_whole_edge_blocks_along_channels(tmp_path, channel_block):
    """tensorstore writes a 4-D N5 dataset's edge blocks whole along the channels too (blockSize 2 or 4 for 3
    channels): the channels past the last are cut like voxels past the edge (every read raised a NumPy
    broadcasting error naming nothing)."""
    ts = needs("tensorstore")
    data = random_volume(np.uint16, (3,) + SHAPE)
    store = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path / "s.n5/raw")},
                     "metadata": {"dimensions": list(data.shape[::-1]), "blockSize": [3, 5, 4, channel_block],
                                  "dataType": "uint16", "compression": {"type": "gzip"}}, "create": True}).result()
    store[...] = data.T
    (tmp_path / "s.n5/attributes.json").write_text(json.dumps({"n5": "2.5.1"}))
    assert_reads(tmp_path / "s.n5/raw", data)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize("writer", ["tensorstore", "zarr-python"])
def test_zarr_v2_null_fill_value_reads_chunks_never_written_as_zero(tmp_path, writer, dtype):
    """zarr v2 allows ``"fill_value": null`` and tensorstore's zarr driver writes it by default; both tools read
    the chunks never written as 0 (emfast read NaN for floats, and raised a bare TypeError for integers)."""
    path = tmp_path / "s.zarr/raw"
    data = np.zeros(SHAPE, dtype)
    data[:4, :5, :3] = random_volume(dtype, (4, 5, 3))  # one chunk written, the others never
    if writer == "tensorstore":
        ts = needs("tensorstore")
        store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)},
                         "metadata": {"shape": list(SHAPE), "chunks": [4, 5, 3], "dtype": np.dtype(dtype).str,
                                      "compressor": {"id": "zstd", "level": 1}}, "create": True}).result()
        store[:4, :5, :3] = data[:4, :5, :3]
        np.testing.assert_array_equal(store.read().result(), data)
    else:
        array = zarr.create_array(path, shape=SHAPE, chunks=(4, 5, 3), dtype=dtype, fill_value=None, zarr_format=2)
        array[:4, :5, :3] = data[:4, :5, :3]
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
    assert json.loads((path / ".zarray").read_text())["fill_value"] is None
    assert_reads(path, data)


@pytest.mark.parametrize("sharded", [False, True])
def test_tensorstore_precomputed(tmp_path, sharded):
    ts = needs("tensorstore")
    data = random_volume(np.uint8)
    scale = {"resolution": [4, 4, 40], "voxel_offset": [3, 5, 7], "size": list(SHAPE[::-1]),
             "chunk_size": [3, 5, 4], "encoding": "raw"}
    if sharded:
        scale["sharding"] = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 1, "hash": "identity",
                             "minishard_bits": 1, "shard_bits": 1, "minishard_index_encoding": "gzip",
                             "data_encoding": "gzip"}
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(tmp_path / "pc")},
                     "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
                     "scale_metadata": scale, "create": True}).result()
    store[...] = data.T[..., np.newaxis]
    assert list(store.domain.inclusive_min[:3]) == [3, 5, 7]
    assert_reads(tmp_path / "pc", data, (40, 4, 4), (280, 20, 12), format="precomputed")


# ome-zarr-py ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_ome_zarr_py_levels_in_micrometres_read_in_nm(tmp_path, version):
    writer = needs("ome_zarr.writer")
    from ome_zarr.format import FormatV04, FormatV05
    fmt = FormatV04() if version == "0.4" else FormatV05()
    data = random_volume(np.uint8, (13, 16, 12))
    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", zarr_format=fmt.zarr_format)
    writer.write_image(data, root, scale_factors=(2,), axes="zyx", fmt=fmt, scale={"z": 0.04, "y": 0.004, "x": 0.004},
                       axes_units={a: "micrometer" for a in "zyx"}, storage_options={"chunks": (4, 5, 3)})
    assert_reads(tmp_path / "img.zarr", data, (40, 4, 4), (0, 0, 0))
    level1 = np.asarray(zarr.open_array(str(tmp_path / "img.zarr/s1"), mode="r"))
    # ome-zarr-py translates level 1 by half a voxel of level 0 (its first voxel's centre): it starts at 0
    assert_reads(tmp_path / "img.zarr", level1, (40, 8, 8), (0, 0, 0), level=1)
    assert_reads(tmp_path / "img.zarr", level1, (40, 8, 8), (0, 0, 0), resolution=(40, 8, 8))
    # the level opened by its own path, which holds no geometry itself: as the image above it places it
    assert_reads(tmp_path / "img.zarr/s1", level1, (40, 8, 8), (0, 0, 0))


def test_ome_zarr_in_micrometres_beside_labels_in_nm_align(tmp_path):
    """The issue's case: raw in an OME-Zarr image in micrometres, labels (funlib/gunpowder attributes) in nm,
    covering part of raw at an offset."""
    writer = needs("ome_zarr.writer")
    from ome_zarr.format import FormatV04
    data = random_volume(np.uint8, (13, 16, 12))
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=2)
    image = root.create_group("raw")
    writer.write_image(data, image, scale_factors=(), axes="zyx", fmt=FormatV04(),
                       scale={"z": 0.04, "y": 0.004, "x": 0.004}, axes_units={a: "micrometer" for a in "zyx"},
                       storage_options={"chunks": (4, 5, 3)})
    labels = root.create_array("labels", shape=(9, 10, 8), chunks=(4, 4, 4), dtype=np.uint64)
    labels[...] = data[2:11, 3:13, 1:9].astype(np.uint64) + 1
    labels.attrs.update(resolution=[40, 4, 4], offset=[80, 12, 4])
    assert_aligned(tmp_path / "s.zarr/raw", tmp_path / "s.zarr/labels")


# z5py -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("compression", ["raw", "gzip", "bzip2", "xz", "blosc", "zstd", "lz4"])
@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_z5py_n5_every_compression(tmp_path, compression, dtype):
    """z5py writes N5 with funlib's (x, y, z) resolution/offset; its lz4 is a bare LZ4 block, not n5-java's."""
    z5py = needs("z5py")
    data = random_volume(dtype)
    dataset = z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset(
        "volumes/raw", data=data, chunks=(4, 5, 3), compression=compression)
    dataset.attrs["resolution"] = [4, 4, 40]
    dataset.attrs["offset"] = [12, 8, 80]
    assert_reads(tmp_path / "s.n5/volumes/raw", data, (40, 4, 4), (80, 8, 12))


def n5_pyramid(path, z5py, level_attributes, group_attributes):
    """raw (8, 20, 16) at s0 and its labels at s0 and s1 (y and x halved: each s1 voxel one 2 x 2 block of s0),
    written by z5py in the n5-viewer layout; labels s0 == raw + 1."""
    raw = random_volume(np.uint8, (8, 20, 16))
    coarse = (raw[:, ::2, ::2].astype(np.uint64) + 1)
    container = z5py.File(str(path), mode="a")
    full = {"pixelResolution": {"dimensions": [4.0, 4.0, 40.0], "unit": "nm"}}
    for name, data, attributes in [("raw/s0", raw, full),
                                   ("labels/s0", coarse.repeat(2, 1).repeat(2, 2), full),
                                   ("labels/s1", coarse, level_attributes)]:
        dataset = container.create_dataset(name, data=data, chunks=(4, 8, 8), compression="gzip")
        for key, value in attributes.items():
            dataset.attrs[key] = value
    for key, value in group_attributes.items():
        container["labels"].attrs[key] = value
    return raw


def assert_labels_of_s1_follow_raw(raw, raw_path, labels_path):
    """A loader pairing raw at s0 with labels at s1 (y and x halved; each s1 voxel the label of the first voxel of
    its 2 x 2 block of ``raw``, + 1) gives every raw voxel the label of the s1 voxel holding it."""
    sample = ef.Sample(ef.open(raw_path, in_memory=False), ef.open(labels_path, in_memory=False))
    with ef.Loader(sample, patch=(3, 6, 6), batch_size=4, epoch_size=3, seed=1, augment=(), normalize=(1.0, 0.0),
                   threads=1) as loader:
        for batch in loader:
            for n in range(batch.valid):
                z, y, x = np.meshgrid(*[np.arange(c, c + e) for c, e in zip(batch.positions[n], (3, 6, 6))],
                                      indexing="ij")
                expected = raw[z, y // 2 * 2, x // 2 * 2].astype(np.uint64) + 1
                np.testing.assert_array_equal(batch["labels"][n, 0], expected)


@pytest.mark.parametrize("layout", ["level", "group", "group resolution"])
def test_n5_scale_levels_take_their_downsampling_factors(tmp_path, layout):
    """n5-viewer and N5 Spark state a level's downsamplingFactors beside s0's pixelResolution (on the level, or on
    the group for every level): s1 was read at s0's voxel size, and labels at s1 beside raw at s0 were placed
    wrongly without an error (a review: 12 of 12 examples wrong)."""
    z5py = needs("z5py")
    pixel = {"dimensions": [4.0, 4.0, 40.0], "unit": "nm"}
    if layout == "level":  # N5 Spark: every level states both
        raw = n5_pyramid(tmp_path / "p.n5", z5py, {"pixelResolution": pixel, "downsamplingFactors": [2, 2, 1]}, {})
    elif layout == "group":  # n5-viewer's group defaults: the levels state nothing
        raw = n5_pyramid(tmp_path / "p.n5", z5py, {}, {"scales": [[1, 1, 1], [2, 2, 1]], "pixelResolution": pixel})
    else:  # the group states the voxel size, each level below s0 its factors; s0 nothing (a review)
        raw = n5_pyramid(tmp_path / "p.n5", z5py, {"downsamplingFactors": [2, 2, 1]}, {"pixelResolution": pixel})
        import json
        (tmp_path / "p.n5/labels/s0/attributes.json").write_text(json.dumps(
            {k: v for k, v in json.loads((tmp_path / "p.n5/labels/s0/attributes.json").read_text()).items()
             if k != "pixelResolution"}))
        with ef.open(tmp_path / "p.n5/labels/s0") as level:
            assert level.resolution == (40.0, 4.0, 4.0)
    with ef.open(tmp_path / "p.n5/labels/s1") as level:
        assert level.resolution == (40.0, 8.0, 8.0) and level.offset == (0.0, 0.0, 0.0)
    assert_labels_of_s1_follow_raw(raw, tmp_path / "p.n5/raw/s0", tmp_path / "p.n5/labels/s1")


@pytest.mark.parametrize("layout", ["paintera", "cluster_tools", "micrometres"])
def test_n5_multiscale_groups_as_paintera_and_cluster_tools_write_them_place_their_levels(tmp_path, layout):
    """Paintera's data group (``painteraData`` above a ``data`` group holding ``multiScale``, ``resolution`` and
    ``offset``) and cluster_tools' multiscale group (the same on the levels' group) state the voxel size on the
    levels' group, as Paintera reads it: their levels were read without a voxel size, and labels at s1 could not be
    paired with raw at s0. A group that states ``units`` is read in them."""
    z5py = needs("z5py")
    raw = random_volume(np.uint8, (8, 20, 16))
    coarse = raw[:, ::2, ::2].astype(np.uint64) + 1
    offset = [8.0, 16.0, 80.0]  # x, y, z
    container = z5py.File(str(tmp_path / "p.n5"), mode="a")
    placed = container.create_dataset("raw", data=raw, chunks=(4, 8, 8), compression="gzip")
    placed.attrs["resolution"], placed.attrs["offset"] = [4.0, 4.0, 40.0], offset
    group = "labels/data" if layout == "paintera" else "labels"
    container.create_group(group)
    if layout == "paintera":
        container["labels"].attrs["painteraData"] = {"type": "label"}
    container[group].attrs["multiScale"] = True
    if layout == "micrometres":
        container[group].attrs["resolution"] = [0.004, 0.004, 0.04]
        container[group].attrs["offset"] = [o / 1000 for o in offset]
        container[group].attrs["units"] = ["um", "um", "um"]
    else:
        container[group].attrs["resolution"], container[group].attrs["offset"] = [4.0, 4.0, 40.0], offset
    container.create_dataset(f"{group}/s0", data=coarse.repeat(2, 1).repeat(2, 2), chunks=(4, 8, 8),
                             compression="gzip")
    container.create_dataset(f"{group}/s1", data=coarse, chunks=(4, 8, 8), compression="gzip").attrs[
        "downsamplingFactors"] = [2, 2, 1]  # Paintera and cluster_tools give s0 no factors
    for name, resolution in [("s0", (40.0, 4.0, 4.0)), ("s1", (40.0, 8.0, 8.0))]:
        with ef.open(tmp_path / "p.n5" / group / name) as level:
            np.testing.assert_allclose(level.resolution + level.offset, resolution + (80.0, 16.0, 8.0),
                                       err_msg=name)
    assert_labels_of_s1_follow_raw(raw, tmp_path / "p.n5/raw", tmp_path / "p.n5" / group / "s1")


def test_n5_bigdataviewer_levels_are_not_given_a_voxel_size_of_unknown_unit(tmp_path):
    """BigDataViewer's N5 export writes ``multiScale`` and ``resolution`` on the timepoint group, in the unit of its
    XML (micrometres, often, as MoBIE's): read as nm, a level would be placed 1000 times too small (a review). A
    multichannel level whose factors name the channel axis too is placed by its group (a review: refused)."""
    z5py = needs("z5py")
    container = z5py.File(str(tmp_path / "b.n5"), mode="a")
    container.create_group("setup0/timepoint0")
    container["setup0"].attrs["downsamplingFactors"] = [[1, 1, 1], [2, 2, 2]]
    container["setup0"].attrs["dataType"] = "uint8"
    container["setup0/timepoint0"].attrs["multiScale"] = True
    container["setup0/timepoint0"].attrs["resolution"] = [0.008, 0.008, 0.008]
    for name, shape, factors in [("s0", (16, 16, 16), [1, 1, 1]), ("s1", (8, 8, 8), [2, 2, 2])]:
        container.create_dataset(f"setup0/timepoint0/{name}", data=np.ones(shape, np.uint8), chunks=(8, 8, 8),
                                 compression="gzip").attrs["downsamplingFactors"] = factors
        with ef.open(tmp_path / "b.n5/setup0/timepoint0" / name) as level:
            assert level.resolution is None, name
    container.create_group("multi")
    container["multi"].attrs["multiScale"], container["multi"].attrs["resolution"] = True, [4, 4, 40]
    for name, shape, factors in [("s0", (2, 8, 16, 16), None), ("s1", (2, 8, 8, 8), [2, 2, 1, 1])]:
        level = container.create_dataset(f"multi/{name}", data=np.ones(shape, np.uint8), chunks=(1, 8, 8, 8),
                                         compression="gzip")
        if factors is not None:
            level.attrs["downsamplingFactors"] = factors
    with ef.open(tmp_path / "b.n5/multi/s1") as level:
        assert level.resolution == (40.0, 8.0, 8.0)
    for units in (["nm", "nm"], 5, "pixel"):  # not lengths emfast reads: the group is not taken (a review: refused)
        container["multi"].attrs["units"] = units
        with ef.open(tmp_path / "b.n5/multi/s1") as level:
            assert level.resolution is None, units


def test_n5_datasets_named_like_levels_outside_a_pyramid_keep_their_own_voxel_size(tmp_path):
    """A root that is an n5-viewer pyramid (scales, pixelResolution, s0 and s1), and a volumes/s1 and other/s1
    beside it in plain groups: they took the root's scales[1] and were read at twice their voxel size (a review).
    Only a level's own group, or the root for a channel group right below it, and only beside an s0, lends it
    defaults."""
    z5py = needs("z5py")
    pixel = {"dimensions": [4.0, 4.0, 40.0], "unit": "nm"}
    container = z5py.File(str(tmp_path / "c.n5"), mode="a")
    container.attrs["scales"], container.attrs["pixelResolution"] = [[1, 1, 1], [2, 2, 1]], pixel
    for name, shape in [("s0", (8, 32, 32)), ("s1", (8, 16, 16)), ("volumes/s1", (8, 32, 32)),
                        ("other/s1", (8, 32, 32)), ("c0/s0", (8, 32, 32)), ("c0/s1", (8, 16, 16))]:
        container.create_dataset(name, data=np.ones(shape, np.uint8), chunks=(8, 8, 8), compression="gzip")
    container["volumes/s1"].attrs["pixelResolution"] = pixel
    expected = {"s0": (40, 4, 4), "s1": (40, 8, 8), "volumes/s1": (40, 4, 4), "other/s1": None,
                "c0/s0": (40, 4, 4), "c0/s1": (40, 8, 8)}  # c0: a channel group, the root's defaults
    for name, resolution in expected.items():
        with ef.open(tmp_path / "c.n5" / name) as volume:
            assert volume.resolution == resolution, name


def test_n5_downsampling_factors_that_do_not_fit_the_pixel_resolution_are_refused(tmp_path):
    z5py = needs("z5py")
    n5_pyramid(tmp_path / "p.n5", z5py, {"pixelResolution": {"dimensions": [4, 4, 40], "unit": "nm"},
                                         "downsamplingFactors": [2, 2]}, {})
    with pytest.raises(StoreMetadataError, match=r"p.n5:labels/s1 \(attributes.json\): malformed metadata: "
                                                 r"downsamplingFactors = \[2, 2\]"):
        ef.open(tmp_path / "p.n5/labels/s1")


def test_n5_java_lz4_block_stream_is_read(tmp_path):
    """n5-java's lz4 blocks are lz4-java ``LZ4BlockOutputStream`` streams (magic "LZ4Block", token, compressed and
    original lengths, checksum, data; an empty block ends it), written here byte for byte as lz4-java frames them
    around blocks from the LZ4 library, with a raw (incompressible) block among them."""
    import numcodecs
    z5py = needs("z5py")
    data = random_volume(np.uint16)
    z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=data, chunks=(4, 5, 3),
                                                                 compression="lz4")
    for path in sorted((tmp_path / "s.n5/raw").rglob("*")):
        if path.is_file() and path.name != "attributes.json":
            block = path.read_bytes()
            ndim = int.from_bytes(block[2:4], "big")
            header, payload = block[:4 + 4 * ndim], block[4 + 4 * ndim:]
            size = int(np.prod(np.frombuffer(header[4:], ">u4"))) * data.itemsize
            original = numcodecs.LZ4().decode(size.to_bytes(4, "little") + payload)
            half = len(original) // 2
            frames = b""
            for method, part in ((0x20, original[:half]), (0x10, original[half:])):
                body = bytes(numcodecs.LZ4().encode(part))[4:] if method == 0x20 else part
                frames += b"LZ4Block" + bytes([method]) + len(body).to_bytes(4, "little") \
                    + len(part).to_bytes(4, "little") + b"\0\0\0\0" + body
            frames += b"LZ4Block" + bytes([0x10]) + bytes(12)
            path.write_bytes(header + frames)
    assert_reads(tmp_path / "s.n5/raw", data)


def test_z5py_zarr_v2(tmp_path):
    z5py = needs("z5py")
    data = random_volume(np.uint16)
    dataset = z5py.File(str(tmp_path / "s.zarr"), mode="a", use_zarr_format=True).create_dataset(
        "raw", data=data, chunks=(4, 5, 3), compression="gzip")
    dataset.attrs["resolution"] = [40, 4, 4]
    assert_reads(tmp_path / "s.zarr/raw", data, (40, 4, 4), (0, 0, 0))


# cloud-volume ---------------------------------------------------------------------------------------------------

def write_cloudvolume(path, data, compress, encoding="raw", layer_type="image", **info):
    cloudvolume = needs("cloudvolume")
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=1, layer_type=layer_type, data_type=np.dtype(data.dtype).name, encoding=encoding,
        resolution=[4, 4, 40], voxel_offset=[3, 5, 7], chunk_size=[4, 5, 3], volume_size=list(data.shape[::-1]),
        **info)
    volume = cloudvolume.CloudVolume(f"file://{path}", info=info, compress=compress, progress=False)
    volume.commit_info()
    volume[3:3 + data.shape[2], 5:5 + data.shape[1], 7:7 + data.shape[0]] = data.T
    return volume


@pytest.mark.parametrize("compress", [None, "gzip", "br", "zstd", "xz", "bz2", False])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_cloudvolume_compressed_chunk_files(tmp_path, compress, dtype):
    """cloud-volume's default compresses each chunk file (``<bbox>.gz``): read, never zeros."""
    data = random_volume(dtype)
    volume = write_cloudvolume(tmp_path / "pc", data, compress)
    suffix = {None: ".gz", "gzip": ".gz", "br": ".br", "zstd": ".zstd", "xz": ".xz", "bz2": ".bz2", False: ""}[compress]
    assert all(name.endswith(suffix) for name in os.listdir(tmp_path / "pc/4_4_40"))
    assert tuple(volume.resolution) == (4, 4, 40) and tuple(volume.voxel_offset) == (3, 5, 7)
    assert_reads(tmp_path / "pc", data, (40, 4, 4), (280, 20, 12), format="precomputed")


def test_cloudvolume_labels_beside_raw_align(tmp_path):
    raw = random_volume(np.uint8)
    write_cloudvolume(tmp_path / "raw", raw, None)
    cloudvolume = needs("cloudvolume")
    labels = raw[2:11, 3:15, 1:9].astype(np.uint64) + 1
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=1, layer_type="segmentation", data_type="uint64", encoding="raw", resolution=[4, 4, 40],
        voxel_offset=[3 + 1, 5 + 3, 7 + 2], chunk_size=[4, 5, 3], volume_size=list(labels.shape[::-1]))
    volume = cloudvolume.CloudVolume(f"file://{tmp_path / 'labels'}", info=info, progress=False)
    volume.commit_info()
    volume[4:12, 8:20, 9:18] = labels.T
    assert_aligned(tmp_path / "raw", tmp_path / "labels")


@pytest.mark.parametrize("compress", [None, False])
@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("block", [(8, 8, 8), (3, 2, 2)])
def test_cloudvolume_compressed_segmentation(tmp_path, compress, dtype, block):
    """Labels as cloud-volume writes them by default: compressed_segmentation chunks in ``.gz`` files (tensorstore
    reads no such file), blocks larger than the chunks or not dividing them; every value kept (64-bit ones too)."""
    labels = random_volume(np.uint16) % 7 * np.dtype(dtype).type(1000003)
    labels[3, 4, 5] = np.iinfo(dtype).max
    write_cloudvolume(tmp_path / "seg", labels, compress, encoding="compressed_segmentation",
                      layer_type="segmentation", compressed_segmentation_block_size=list(block))
    suffix = ".gz" if compress is None else ""
    assert all(name.endswith(suffix) for name in os.listdir(tmp_path / "seg/4_4_40"))
    assert_reads(tmp_path / "seg", labels, (40, 4, 4), (280, 20, 12), format="precomputed")


def test_tensorstore_compressed_segmentation_channels(tmp_path):
    """Several channels of compressed_segmentation (cloud-volume writes one): each channel's data where the chunk's
    header of channel offsets says, as tensorstore writes it."""
    ts = needs("tensorstore")
    labels = random_volume(np.uint16, (3,) + SHAPE).astype(np.uint64) % 5 * 77
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(tmp_path / "seg")},
                     "multiscale_metadata": {"type": "segmentation", "data_type": "uint64", "num_channels": 3},
                     "scale_metadata": {"resolution": [4, 4, 40], "encoding": "compressed_segmentation",
                                        "chunk_size": [8, 6, 4], "compressed_segmentation_block_size": [4, 4, 2],
                                        "size": list(SHAPE[::-1]), "voxel_offset": [3, 5, 7]}},
                    create=True).result()
    store[...] = labels.transpose(3, 2, 1, 0)
    assert_reads(tmp_path / "seg", labels, (40, 4, 4), (280, 20, 12), format="precomputed")


def test_compressed_segmentation_decoder_against_the_codec(tmp_path):
    """The decoder against neuroglancer's codec as the compressed_segmentation package (cloud-volume's) encodes:
    random sizes, block sizes and numbers of distinct values (0 to 32 encoded bits)."""
    codec = needs("compressed_segmentation")
    from emfast._core.files import decode_compressed_segmentation
    rng = np.random.default_rng(0)
    for trial in range(120):
        dtype = (np.uint32, np.uint64)[trial % 2]
        size = tuple(int(n) for n in rng.integers(1, 30, 3))  # x, y, z
        block = tuple(int(n) for n in rng.choice([1, 2, 3, 4, 8, 16], 3))
        distinct = int(rng.choice([1, 2, 3, 5, 17, 300, 70000]))
        values = rng.integers(0, np.iinfo(dtype).max, distinct, dtype=dtype, endpoint=True)
        labels = values[rng.integers(0, distinct, size[::-1])]  # z, y, x
        encoded = codec.compress(np.asfortranarray(labels.T), block_size=block, order="F")
        decoded = decode_compressed_segmentation(encoded, size, block, 1, dtype)
        assert decoded.dtype == dtype and np.array_equal(decoded[0], labels), (size, block, distinct)


def test_cloudvolume_compressed_chunks_of_an_encoding_emfast_does_not_decode_are_refused(tmp_path):
    """jpeg chunks gzipped (compress="gzip") exist only as ``.gz``: tensorstore would read zeros; emfast refuses."""
    raw = random_volume(np.uint8)
    write_cloudvolume(tmp_path / "jpeg", raw, "gzip", encoding="jpeg")
    needs("tensorstore")
    volume = ef.open(tmp_path / "jpeg", format="precomputed", in_memory=False)
    with pytest.raises(StoreMetadataError, match=r"jpeg: chunk 4_4_40/3-7_5-10_7-10 exists only as "
                                                 r"3-7_5-10_7-10.gz \(.gz compression"):
        volume.read_box((0, 0, 0), (2, 2, 2), np.empty((1, 2, 2, 2), np.uint8))


# funlib.persistence ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.uint64])
def test_funlib_prepare_ds_default(tmp_path, dtype):
    """``prepare_ds("s.zarr/raw")``: gunpowder's and daisy's default layout (no group metadata), axis names
    d0, d1, d2, units "" (nm)."""
    persistence = needs("funlib.persistence")
    data = random_volume(dtype)
    array = persistence.prepare_ds(str(tmp_path / "s.zarr/raw"), shape=SHAPE, offset=(80, 10, 12),
                                   voxel_size=(40, 5, 4), dtype=dtype)
    array[array.roi] = data
    reopened = persistence.open_ds(str(tmp_path / "s.zarr/raw"))
    assert_reads(tmp_path / "s.zarr/raw", data, tuple(reopened.voxel_size), tuple(reopened.offset))


def test_funlib_axis_names_xyz_in_micrometres(tmp_path):
    """``axis_names=["x", "y", "z"]``: the array and every spatial list are (x, y, z); read as (z, y, x) in nm."""
    persistence = needs("funlib.persistence")
    data = random_volume(np.uint16)
    array = persistence.prepare_ds(str(tmp_path / "s.zarr/raw"), shape=SHAPE[::-1], offset=(12, 10, 80),
                                   voxel_size=(4, 5, 40), axis_names=["x", "y", "z"], types=["space"] * 3,
                                   units=["um", "um", "nm"], dtype=np.uint16, chunk_shape=(3, 5, 4))
    array[array.roi] = data.T
    reopened = persistence.open_ds(str(tmp_path / "s.zarr/raw"))
    assert tuple(reopened.axis_names) == ("x", "y", "z") and tuple(reopened.units) == ("um", "um", "nm")
    assert_reads(tmp_path / "s.zarr/raw", data, (40, 5000, 4000), (80, 10000, 12000))


def test_funlib_channels_first_and_labels_aligned(tmp_path):
    persistence = needs("funlib.persistence")
    data = random_volume(np.uint8, (2,) + SHAPE)
    array = persistence.prepare_ds(str(tmp_path / "s.zarr/raw"), shape=(2,) + SHAPE, offset=(0, 0, 0),
                                   voxel_size=(40, 4, 4), axis_names=["c", "z", "y", "x"], units=["nm"] * 3,
                                   types=["channel", "space", "space", "space"],
                                   dtype=np.uint8)
    array[array.roi] = data
    assert_reads(tmp_path / "s.zarr/raw", data, (40, 4, 4), (0, 0, 0))
    single = persistence.prepare_ds(str(tmp_path / "s.zarr/single"), shape=SHAPE, offset=(0, 0, 0),
                                    voxel_size=(40, 4, 4), dtype=np.uint8)
    single[single.roi] = data[0]
    labels = persistence.prepare_ds(str(tmp_path / "s.zarr/labels"), shape=(9, 12, 8), offset=(80, 12, 4),
                                    voxel_size=(40, 4, 4), dtype=np.uint64)
    labels[labels.roi] = data[0, 2:11, 3:15, 1:9].astype(np.uint64) + 1
    assert_aligned(tmp_path / "s.zarr/single", tmp_path / "s.zarr/labels")


# h5py, CREMI layout ---------------------------------------------------------------------------------------------

def test_cremi_hdf5_layout(tmp_path):
    """CREMI: ``volumes/raw`` and ``volumes/labels/neuron_ids`` with ``resolution`` (z, y, x) nm; labels with an
    ``offset`` in nm."""
    raw = random_volume(np.uint8)
    labels = raw[2:11, 3:15, 1:9].astype(np.uint64) + 1
    with h5py.File(tmp_path / "sample_A.hdf", "w") as f:
        f.create_dataset("volumes/raw", data=raw, chunks=(4, 5, 3), compression="gzip").attrs["resolution"] = \
            np.array([40.0, 4.0, 4.0])
        ids = f.create_dataset("volumes/labels/neuron_ids", data=labels)
        ids.attrs["resolution"] = np.array([40.0, 4.0, 4.0])
        ids.attrs["offset"] = np.array([80.0, 12.0, 4.0])
    assert_reads(tmp_path / "sample_A.hdf/volumes/raw", raw, (40, 4, 4), (0, 0, 0))  # no offset: 0
    assert_reads(tmp_path / "sample_A.hdf/volumes/labels/neuron_ids", labels, (40, 4, 4), (80, 12, 4))
    assert_aligned(tmp_path / "sample_A.hdf/volumes/raw", tmp_path / "sample_A.hdf/volumes/labels/neuron_ids")


# bad metadata ---------------------------------------------------------------------------------------------------

def zarr_array(path, attrs, shape=SHAPE, dimension_names=None, dtype=np.uint8):
    array = zarr.create_array(str(path), shape=shape, chunks=(4, 5, 3), dtype=dtype,
                              dimension_names=dimension_names)
    array[...] = 1
    array.attrs.update(attrs)
    return path


@pytest.mark.parametrize("attrs, dimension_names, message", [
    ({"resolution": [40, 4, 4], "voxel_size": [40, 8, 8]}, None,
     r"contradictory metadata: resolution = \[40, 4, 4\] but voxel_size = \[40, 8, 8\]"),
    ({"voxel_size": [40, 4, 4], "units": ["nm", "furlong", "nm"]}, None,
     r"units = 'furlong'; expected a length unit"),
    ({"axis_names": ["a", "y", "x"]}, None, r"axis_names = \['a', 'y', 'x'\]; expected names that map each axis"),
    ({"axis_names": ["z", "y", "x"]}, ["x", "y", "z"],
     r"contradictory metadata: axis_names \['z', 'y', 'x'\] but the zarr dimension_names \['x', 'y', 'z'\]"),
    ({"voxel_size": [40, 4]}, None, r"voxel_size = \[40, 4\]; expected 3 numbers"),
    ({"dimension_units": ["40 nm", None, "4 nm"]}, None,
     r"dimension_units = \['40 nm', None, '4 nm'\]; expected a length \(such as \"4 nm\"\) for each of z, y and x"),
    ({"dimension_units": ["40 nm", "4 furlong", "4 nm"]}, None,
     r"dimension_units = 'furlong'; expected a length unit"),
])
def test_contradictory_or_unmappable_metadata_is_refused(tmp_path, attrs, dimension_names, message):
    path = zarr_array(tmp_path / "s.zarr", attrs, dimension_names=dimension_names)
    before = checksums(tmp_path / "s.zarr")
    with pytest.raises(StoreMetadataError, match=r"s.zarr \(attributes\): (malformed metadata: )?" + message):
        ef.open(path)
    assert checksums(tmp_path / "s.zarr") == before


def test_ome_scale_contradicting_the_level_voxel_size_is_refused(tmp_path):
    writer = needs("ome_zarr.writer")
    from ome_zarr.format import FormatV04
    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", zarr_format=2)
    writer.write_image(random_volume(np.uint8), root, scale_factors=(), axes="zyx", fmt=FormatV04(),
                       scale={"z": 0.04, "y": 0.004, "x": 0.004}, axes_units={a: "micrometer" for a in "zyx"})
    zarr.open_array(str(tmp_path / "img.zarr/s0"), mode="a").attrs["voxel_size"] = [40, 8, 8]
    with pytest.raises(StoreMetadataError, match=r"img.zarr:s0 \(attributes\): contradictory metadata: its "
                                                 r"voxel_size \(z, y, x\) = \(40.0, 8.0, 8.0\) nm but the OME-NGFF "
                                                 r"scale = \(40.0, 4.0, 4.0\) nm"):
        ef.open(tmp_path / "img.zarr")


def test_ome_unknown_unit_is_refused(tmp_path):
    root = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", zarr_format=2)
    root.create_array("0", shape=SHAPE, chunks=SHAPE, dtype=np.uint8)
    root.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": a, "type": "space", "unit": "parsecs"}
                                                             for a in "zyx"],
                                  "datasets": [{"path": "0", "coordinateTransformations": [
                                      {"type": "scale", "scale": [1, 1, 1]}]}]}]
    with pytest.raises(StoreMetadataError, match=r"img.zarr \(OME-NGFF multiscales\): malformed metadata: "
                                                 r"axes\[0\].unit = 'parsecs'; expected a length unit"):
        ef.open(tmp_path / "img.zarr")


def test_n5_pixel_resolution_contradicting_resolution_is_refused(tmp_path):
    z5py = needs("z5py")
    dataset = z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=random_volume(np.uint8),
                                                                        chunks=(4, 5, 3))
    dataset.attrs["resolution"] = [4, 4, 40]
    dataset.attrs["pixelResolution"] = {"dimensions": [0.004, 0.004, 0.05], "unit": "um"}
    with pytest.raises(StoreMetadataError, match=r"s.n5:raw \(attributes.json\): contradictory metadata: "
                                                 r"resolution = \[4, 4, 40\] but pixelResolution"):
        ef.open(tmp_path / "s.n5/raw")


def test_labels_offset_by_part_of_a_voxel_are_refused(tmp_path):
    """Offsets that are no whole number of raw voxels cannot be aligned: refused, naming both arrays."""
    zarr_array(tmp_path / "s.zarr/raw", {"voxel_size": [40, 4, 4], "offset": [0, 0, 0]})
    zarr_array(tmp_path / "s.zarr/labels", {"voxel_size": [40, 4, 4], "offset": [0, 2, 0]}, dtype=np.uint64)
    with pytest.raises(ValueError, match=r"s.zarr:labels .*is offset by \(0.0, 0.5, 0.0\) voxels from"):
        ef.Sample(ef.open(tmp_path / "s.zarr/raw"), ef.open(tmp_path / "s.zarr/labels"))


# labels beside raw, through a Loader ----------------------------------------------------------------------------

LABELS_BOX = (slice(2, 11), slice(3, 15), slice(1, 9))  # labels cover this part of raw: offset (80, 12, 4) nm


def write_zarr_python(path, name, data, offset_voxels):
    array = zarr.open_group(str(path), mode="a").create_array(name, shape=data.shape, chunks=(4, 5, 3),
                                                              dtype=data.dtype)
    array[...] = data
    array.attrs.update(resolution=[40, 4, 4], offset=[o * r for o, r in zip(offset_voxels, (40, 4, 4))])
    return path / name


def write_z5py(path, name, data, offset_voxels):
    z5py = needs("z5py")
    dataset = z5py.File(str(path), mode="a").create_dataset(name, data=data, chunks=(4, 5, 3), compression="lz4")
    dataset.attrs["resolution"] = [4, 4, 40]  # funlib's N5 convention: (x, y, z)
    dataset.attrs["offset"] = [o * r for o, r in zip(offset_voxels[::-1], (4, 4, 40))]
    return path / name


def write_tensorstore_precomputed(path, name, data, offset_voxels):
    ts = needs("tensorstore")
    kind = "image" if data.dtype == np.uint8 else "segmentation"
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path / name)},
                     "multiscale_metadata": {"type": kind, "data_type": data.dtype.name, "num_channels": 1},
                     "scale_metadata": {"resolution": [4, 4, 40], "voxel_offset": list(offset_voxels[::-1]),
                                        "size": list(data.shape[::-1]), "chunk_size": [3, 5, 4], "encoding": "raw"},
                     "create": True}).result()
    store[...] = data.T[..., np.newaxis]
    return path / name


@pytest.mark.parametrize("write, container", [(write_zarr_python, "s.zarr"), (write_z5py, "s.n5"),
                                              (write_tensorstore_precomputed, "pc")])
def test_loader_aligns_labels_beside_raw(tmp_path, write, container):
    raw = random_volume(np.uint8)
    labels = raw[LABELS_BOX].astype(np.uint64) + 1
    write(tmp_path / container, "raw", raw, (0, 0, 0))
    write(tmp_path / container, "labels", labels, tuple(s.start for s in LABELS_BOX))
    assert_aligned(tmp_path / container / "raw", tmp_path / container / "labels")


# alignment diagnostics ------------------------------------------------------------------------------------------

def test_info_and_check_show_world_extents_and_partial_overlap(tmp_path, capsys):
    """funlib raw at offset 0 and labels shifted so that a quarter of them lies outside raw along y: ``emfast
    info`` gives each array's box in nm, ``emfast check`` the boxes, the labels' raw voxels and the partial
    overlap."""
    from emfast.cli import main
    persistence = needs("funlib.persistence")
    raw = persistence.prepare_ds(str(tmp_path / "s.zarr/raw"), shape=(8, 16, 16), offset=(0, 0, 0),
                                 voxel_size=(40, 4, 4), dtype=np.uint8)
    raw[raw.roi] = random_volume(np.uint8, (8, 16, 16))
    labels = persistence.prepare_ds(str(tmp_path / "s.zarr/labels"), shape=(8, 16, 16), offset=(0, 16, 0),
                                    voxel_size=(40, 4, 4), dtype=np.uint64)
    labels[labels.roi] = 1
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert "labels: shape=(8, 16, 16) dtype=uint64" in out and "world=[(0.0, 16.0, 0.0), (320.0, 80.0, 64.0)) nm" in out
    assert "raw: shape=(8, 16, 16)" in out and "world=[(0.0, 0.0, 0.0), (320.0, 64.0, 64.0)) nm" in out
    (tmp_path / "config.yaml").write_text("data:\n  samples:\n    - {file: s.zarr, raw: raw, labels: labels}\n"
                                          "loader: {patch: [2, 4, 4], batch_size: 1}\n")
    assert main(["check", str(tmp_path / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert "resolution (40, 4, 4), world [(0, 16, 0), (320, 80, 64)) nm" in out
    assert ("origin (0, 4, 0) in raw voxels; overlap with raw (8, 12, 16) = 75.0% of raw; raw voxels "
            "[(0, 4, 0), (8, 20, 16)); only partly overlapping: 75.0% of its voxels lie in raw") in out


def test_hdf5_with_axes_in_another_order_reads_transposed_and_n5_is_refused(tmp_path):
    """HDF5 axes named in another order (funlib's axis_names, with the voxel size listed in that order) are read
    transposed, lazily too; N5 is read in stored order only: such axes are refused, never transposed silently."""
    data = random_volume(np.uint8)  # stored (x, y, z)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        node = f.create_dataset("raw", data=data, chunks=(4, 5, 3))
        node.attrs["axis_names"], node.attrs["voxel_size"], node.attrs["offset"] = ["x", "y", "z"], [4, 8, 40], \
            [0, 16, 80]
    for in_memory in (True, False):
        volume = ef.open(tmp_path / "s.h5/raw", in_memory=in_memory)
        assert volume.shape == data.shape[::-1] and volume.resolution == (40, 8, 4)
        assert volume.offset == (80, 16, 0)
        np.testing.assert_array_equal(volume[:, :, :][0], data.transpose())
    z5py = needs("z5py")
    dataset = z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=random_volume(np.uint8),
                                                                        chunks=(4, 5, 3))
    dataset.attrs["axis_names"] = ["z", "y", "x"]  # N5 lists axes x first: this names them reversed
    with pytest.raises(StoreMetadataError, match=r"s.n5:raw \(attributes.json\): its axes are in the order it "
                                                 r"stores them, \(x, y, z\)"):
        ef.open(tmp_path / "s.n5/raw")


def test_funlib_time_axis_voxel_size_per_physical_axis(tmp_path):
    """funlib lists voxel_size and offset per physical axis, time included: (t, z, y, x) with one time point."""
    persistence = needs("funlib.persistence")
    data = random_volume(np.uint8)
    array = persistence.prepare_ds(str(tmp_path / "s.zarr/raw"), shape=(1,) + SHAPE, offset=(5, 80, 0, 4),
                                   voxel_size=(10, 40, 4, 4), axis_names=["t", "z", "y", "x"],
                                   types=["time", "space", "space", "space"], units=["s", "nm", "nm", "nm"],
                                   dtype=np.uint8)
    array[array.roi] = data[np.newaxis]
    assert_reads(tmp_path / "s.zarr/raw", data, (40, 4, 4), (80, 0, 4))


def test_cloudvolume_channels(tmp_path):
    """Two channels: a raw chunk holds x fastest, then y, z and the channel (Fortran order (x, y, z, c))."""
    cloudvolume = needs("cloudvolume")
    data = random_volume(np.uint8, (2,) + SHAPE)
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=2, layer_type="image", data_type="uint8", encoding="raw", resolution=[4, 4, 40],
        voxel_offset=[0, 0, 0], chunk_size=[4, 5, 3], volume_size=list(SHAPE[::-1]))
    volume = cloudvolume.CloudVolume(f"file://{tmp_path / 'pc'}", info=info, progress=False)
    volume.commit_info()
    volume[:, :, :] = np.transpose(data, (3, 2, 1, 0))
    assert_reads(tmp_path / "pc", data, (40, 4, 4), (0, 0, 0), format="precomputed")


def _positional(shape):
    """Values that say where they are: c * 1000 + z * 100 + y * 10 + x, per the axes named in ``shape``'s keys."""
    grids = np.meshgrid(*[np.arange(n) for n in shape.values()], indexing="ij")
    weights = {"c": 1000, "z": 100, "y": 10, "x": 1}
    return sum(weights[axis] * grid for axis, grid in zip(shape, grids)).astype(np.uint16)


def test_an_ilastik_export_is_read_in_the_order_its_axistags_give(tmp_path, capsys):
    """ilastik exports channel-last with the axis order in an ``axistags`` JSON attribute: a (z, y, x, c) export
    was read as (c, z, y, x), z taken for channels and channels for x, silently (then refused); it is read
    transposed, in memory and lazily, whole and by boxes across its chunks. A 2-D (y, x, c) one is no volume."""
    def export(name, axes, chunks=None):
        shape = {axis: {"c": 2, "z": 9, "y": 10, "x": 11}[axis] for axis in axes}
        tags = {"axes": [{"key": key, "typeFlags": 1 if key == "c" else 2, "resolution": 0, "description": ""}
                         for key in axes]}
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("exported_data", data=_positional(shape), chunks=chunks, compression="gzip"
                             if chunks else None)
            f["exported_data"].attrs["axistags"] = json.dumps(tags, indent=2)
        return tmp_path / name

    expected = _positional({"c": 2, "z": 9, "y": 10, "x": 11})
    for name, axes, chunks in [("probabilities.h5", "zyxc", None), ("chunked.h5", "zyxc", (4, 4, 5, 1)),
                               ("first.h5", "czyx", (1, 4, 4, 5)), ("xyzc.h5", "xyzc", (5, 4, 4, 2))]:
        for in_memory in (True, False):
            volume = ef.hdf5(export(name, axes, chunks), "exported_data", in_memory=in_memory)
            assert volume.shape == (9, 10, 11) and volume.channels == 2, (name, in_memory)
            np.testing.assert_array_equal(volume[:, :, :], expected)
            np.testing.assert_array_equal(volume[3:7, 2:9, 4:11], expected[:, 3:7, 2:9, 4:11])
            volume.close()
    from emfast.cli import main

    assert main(["info", str(tmp_path / "probabilities.h5")]) == 0
    assert "shape=(9, 10, 11, 2) dtype=uint16 chunks=None (axes stored (z, y, x, c), read as (c, z, y, x) " \
           "(2, 9, 10, 11))" in capsys.readouterr().out
    # a time axis stored last is read as a first one is (as channels), not a KeyError (a review)
    timed = export("timed.h5", "zyxc", (4, 5, 5, 1))
    with h5py.File(timed, "r+") as f:
        f["exported_data"].attrs["axistags"] = json.dumps({"axes": [{"key": key} for key in "zyxt"]})
    for in_memory in (True, False):
        np.testing.assert_array_equal(ef.hdf5(timed, "exported_data", in_memory=in_memory)[:, :, :], expected)
    assert main(["info", str(timed)]) == 0 and "axes stored (z, y, x, t)" in capsys.readouterr().out
    with pytest.raises(StoreMetadataError, match="an image without a z axis"):
        ef.hdf5(export("image.h5", "yxc"), "exported_data")


def test_an_ilastik_export_trains_and_converts_as_its_reordered_array(tmp_path):
    """An ilastik probability export as the training mask and a convert's source: the same batches as the array
    stored (c, z, y, x), and a store written in that order."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, (12, 40, 40)).astype(np.uint8)
    labels = rng.integers(1, 5, raw.shape).astype(np.uint64)
    mask = (rng.random(raw.shape) < 0.8).astype(np.uint8)
    tags = {"axes": [{"key": key, "typeFlags": 1 if key == "c" else 2, "resolution": 0, "description": ""}
                     for key in "zyxc"]}
    with h5py.File(tmp_path / "ilastik.h5", "w") as f:
        f.create_dataset("exported_data", data=mask[..., np.newaxis], chunks=(4, 16, 16, 1))
        f["exported_data"].attrs["axistags"] = json.dumps(tags)
    kwargs = dict(patch=(4, 16, 16), batch_size=4, seed=2, augment=["mirror", "transpose"], sampler=ef.Masked())
    exported = ef.hdf5(tmp_path / "ilastik.h5", "exported_data", in_memory=False)
    with ef.Loader(ef.Sample(raw, labels, mask=exported), **kwargs) as theirs, \
            ef.Loader(ef.Sample(raw, labels, mask=mask), **kwargs) as ours:
        for _ in range(3):
            one, two = theirs.next_batch(), ours.next_batch()
            for name in ("raw", "labels", "mask"):
                np.testing.assert_array_equal(one[name], two[name])
    ef.io.convert(tmp_path / "ilastik.h5/exported_data", tmp_path / "mask.zarr/mask")
    np.testing.assert_array_equal(ef.open(tmp_path / "mask.zarr/mask")[:, :, :], mask[np.newaxis])
    # written (c, z, y, x): the source's axistags, copied, named its stored order, and an HDF5 output was read
    # back with its channels taken from x (a helper's trial), directly and through zarr
    ef.io.convert(tmp_path / "ilastik.h5/exported_data", tmp_path / "mask.h5/mask")
    ef.io.convert(tmp_path / "mask.zarr/mask", tmp_path / "mask.h5/again")
    for output in ("mask", "again"):
        np.testing.assert_array_equal(ef.hdf5(tmp_path / "mask.h5", output)[:, :, :], mask[np.newaxis])
        with h5py.File(tmp_path / "mask.h5", "r") as f:
            assert f[output].shape == (1,) + mask.shape and "axistags" not in f[output].attrs
    assert "axistags" not in zarr.open_array(str(tmp_path / "mask.zarr/mask")).attrs


@pytest.mark.parametrize("names", [["z", "y", "x", "c"], ["x", "y", "z"], ["c", "z", "y", "x"]])
def test_xarray_dimension_names_of_a_zarr_v2_array_place_its_axes(tmp_path, names):
    """xarray names a zarr v2 array's dimensions in ``_ARRAY_DIMENSIONS`` (v3 has ``dimension_names``, which
    emfast read): ignored, a (z, y, x, c) array was read as (c, z, y, x) and an (x, y, z) one transposed."""
    zarr = pytest.importorskip("zarr")
    sizes = {"c": 2, "z": 4, "y": 5, "x": 6}
    array = zarr.create_array(str(tmp_path / "xr.zarr"), shape=tuple(sizes[a] for a in names), dtype=np.uint16,
                              zarr_format=2)
    array[...] = _positional({axis: sizes[axis] for axis in names})
    array.attrs["_ARRAY_DIMENSIONS"] = names
    for in_memory in (True, False):
        volume = ef.open(tmp_path / "xr.zarr", in_memory=in_memory)
        assert volume.shape == (4, 5, 6) and volume.channels == (2 if "c" in names else 1)
        box = volume[2:3, 3:4, 4:5]
        assert box[-1, 0, 0, 0] == (1234 if "c" in names else 234)


@pytest.mark.parametrize("names", [["dim_0", "dim_1", "dim_2", "dim_3"], ["band", "z", "y", "x"],
                                   ["band", "y", "x", "q"]])
def test_xarray_names_that_only_number_the_axes_leave_them_to_the_other_metadata(tmp_path, names):
    """xarray's default names (dim_0, ...) or names of its own (band) do not place the axes: read as they were
    before _ARRAY_DIMENSIONS were read, they must not refuse an array, nor override funlib's axis_names or an
    OME-NGFF image's axes (a (t, c, z, y, x) image of one time point was refused)."""
    zarr = pytest.importorskip("zarr")
    array = zarr.create_array(str(tmp_path / "xr.zarr"), shape=(2, 4, 5, 6), dtype=np.uint16, zarr_format=2)
    array[...] = _positional({"c": 2, "z": 4, "y": 5, "x": 6})
    array.attrs.update({"_ARRAY_DIMENSIONS": names, "axis_names": ["c^", "z", "y", "x"]})
    assert ef.open(tmp_path / "xr.zarr")[2:3, 3:4, 4:5][1, 0, 0, 0] == 1234
    image = zarr.open_group(str(tmp_path / "image.zarr"), mode="w", zarr_format=2)
    level = image.create_array("0", shape=(1, 2, 4, 5, 6), dtype=np.uint16)
    level[0] = _positional({"c": 2, "z": 4, "y": 5, "x": 6})
    level.attrs["_ARRAY_DIMENSIONS"] = [f"dim_{i}" for i in range(5)]
    image.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": "t", "type": "time"},
                                                             {"name": "c", "type": "channel"}] +
                                   [{"name": axis, "type": "space", "unit": "nanometer"} for axis in "zyx"],
                                   "datasets": [{"path": "0", "coordinateTransformations": [
                                       {"type": "scale", "scale": [1, 1, 40, 4, 4]}]}]}]
    volume = ef.open(tmp_path / "image.zarr")
    assert volume.channels == 2 and volume[2:3, 3:4, 4:5][1, 0, 0, 0] == 1234
