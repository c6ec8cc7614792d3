"""Opening volumes: metadata, in-memory and lazy reads, and clear errors for bad input."""
import hashlib
import itertools
import os

import h5py
import numpy as np
import pytest

import emfast as ef


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("in_memory", [True, False])
def test_hdf5_metadata_and_read_box(small_h5, in_memory):
    path, raw, _ = small_h5
    with ef.hdf5(path, "volumes/raw", in_memory=in_memory) as volume:
        assert volume.shape == raw.shape and volume.channels == 1 and volume.dtype == np.uint8
        assert volume.chunks == (4, 16, 16)
        assert volume.resolution == (40.0, 4.0, 4.0) and volume.offset == (0.0, 0.0, 0.0)
        assert volume.in_memory is in_memory
        out = np.empty((1, 3, 5, 7), np.uint8)
        volume.read_box((2, 10, 30), (3, 5, 7), out)
        np.testing.assert_array_equal(out[0], raw[2:5, 10:15, 30:37])


def test_file_is_opened_read_only_and_left_unchanged(small_h5):
    path, _, _ = small_h5
    before = digest(path)
    for in_memory in (True, False):
        with ef.hdf5(path, "volumes/raw", in_memory=in_memory):
            pass
    with ef.Loader(ef.hdf5(path, "volumes/raw", in_memory=False), patch=(2, 8, 8), epoch_size=3) as loader:
        for _ in loader:
            pass
    assert digest(path) == before


def test_four_d_arrays_have_channels(rng):
    data = rng.integers(0, 255, (3, 4, 5, 6), dtype=np.uint8)
    volume = ef.Volume.from_array(data, resolution=(1, 1, 1))
    assert volume.shape == (4, 5, 6) and volume.channels == 3 and volume.array is data


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.h5"):
        ef.hdf5(tmp_path / "nope.h5", "raw")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        ef.hdf5(tmp_path, "raw")


def test_not_an_hdf5_file(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("hello")
    with pytest.raises(OSError, match="notes.h5"):
        ef.hdf5(path, "raw")


def test_missing_dataset_lists_what_exists(small_h5):
    path, _, _ = small_h5
    with pytest.raises(ef.DatasetNotFoundError) as info:
        ef.hdf5(path, "volumes/raww")
    message = str(info.value)
    assert "volumes/raww" in message and "volumes/raw" in message and "neuron_ids" in message


def test_group_instead_of_dataset(small_h5):
    path, _, _ = small_h5
    with pytest.raises(ValueError, match="is a group"):
        ef.hdf5(path, "volumes/labels")


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, "S4"])  # float64 and int8 are raw dtypes now
def test_unsupported_dtype_names_dataset_and_dtype(tmp_path, dtype):
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.zeros((4, 4, 4), dtype=dtype))
    with pytest.raises(TypeError, match=r"odd\.h5:data.*unsupported dtype"):
        ef.hdf5(path, "data")


@pytest.mark.parametrize("shape", [(4, 4), (1, 2, 3, 4, 5)])
def test_wrong_number_of_dimensions(shape):
    with pytest.raises(ValueError, match="3-D"):
        ef.Volume.from_array(np.zeros(shape, np.uint8))


def test_bad_resolution_attribute(tmp_path):
    path = tmp_path / "res.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=np.zeros((4, 4, 4), np.uint8)).attrs["resolution"] = (1.0, 2.0)
    with pytest.raises(ef.io.StoreMetadataError, match=r"res.h5:raw \(attributes\): malformed metadata: "
                                                       r"resolution = \[1.0, 2.0\]; expected 3 numbers"):
        ef.hdf5(path, "raw")


def test_nan_in_float_volume_is_reported():
    data = np.zeros((8, 8, 8), np.float32)
    data[3, 4, 5] = np.nan
    with pytest.raises(ValueError, match=r"NaN.*\(0, 3, 4, 5\)"):
        ef.Loader(data, patch=(2, 2, 2))


@pytest.mark.parametrize("in_memory", [True, False])
def test_big_endian_hdf5_is_read_as_native(tmp_path, rng, in_memory):
    data = rng.integers(0, 60000, (6, 10, 10), dtype=np.uint16)
    path = tmp_path / "be.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=data.astype(">u2"))
    with ef.hdf5(path, "raw", in_memory=in_memory) as volume:
        assert volume.dtype == np.dtype(np.uint16)
        out = np.empty((1, 2, 3, 4), np.uint16)
        np.testing.assert_array_equal(volume.read_box((1, 2, 3), (2, 3, 4), out)[0], data[1:3, 2:5, 3:7])


def test_byte_swapped_array_is_refused():
    with pytest.raises(TypeError, match="byte-swapped"):
        ef.Volume.from_array(np.zeros((4, 4, 4), ">u2"))


@pytest.mark.parametrize("in_memory", [True, False])
def test_read_box_refuses_boxes_outside_and_wrong_buffers(small_h5, in_memory):
    path, _, _ = small_h5
    with ef.hdf5(path, "volumes/raw", in_memory=in_memory) as volume:
        good = np.empty((1, 2, 2, 2), np.uint8)
        for corner in [(-1, 0, 0), (19, 0, 0), (0, 47, 0), (0, 0, 39)]:
            with pytest.raises(ValueError, match=r"sample\.h5:volumes/raw.*not inside the volume"):
                volume.read_box(corner, (2, 2, 2), good)
        with pytest.raises(ValueError, match="the extent at least 1 along each"):  # not "not inside" (a helper)
            volume.read_box((0, 0, 0), (0, 2, 2), np.empty((1, 0, 2, 2), np.uint8))
        for out in [np.empty((1, 2, 2, 3), np.uint8), np.empty((1, 2, 2, 2), np.uint16), [[0]]]:
            with pytest.raises(ValueError, match=r"out must be a uint8 array of shape \(1, 2, 2, 2\)"):
                volume.read_box((0, 0, 0), (2, 2, 2), out)
        for corner, extent in (((1.9, 0, 0), (2, 2, 2)), (("1", True, 0), (2, 2, 2)), ((0, 0, 0), (2.9, 2, 2))):
            with pytest.raises(TypeError, match=r"sample\.h5:volumes/raw: a box takes integers"):  # int() cut them
                volume.read_box(corner, extent, good)
            with pytest.raises(TypeError, match=r"sample\.h5:volumes/raw: a box takes integers"):
                volume.read_padded(corner, extent, good, "reflect")
        volume.read_box(np.array([1, 2, 3]), (np.int64(2), 2, 2), good)  # NumPy integers are integers
        volume.read_box(map(int, "123"), iter((2, 2, 2)), good)  # iterators too (a review: the check used them up)
        read_only = np.empty((1, 2, 2, 2), np.uint8)
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match=r"sample\.h5:volumes/raw: out is read-only"):
            volume.read_box((0, 0, 0), (2, 2, 2), read_only)
        with pytest.raises(ValueError, match=r"sample\.h5:volumes/raw: out is read-only"):
            volume.read_padded((-1, 0, 0), (2, 2, 2), read_only, "reflect")


@pytest.mark.parametrize("store", ["zarr", "hdf5"])
def test_a_closed_lazy_volume_refuses_every_read(tmp_path, rng, store):
    """A closed lazy zarr or N5 volume still read through np.asarray and slabs (no file handle to close), where a
    closed HDF5 one, and the volume's own box reads, refused."""
    data = rng.integers(0, 255, (8, 12, 10), dtype=np.uint8)
    if store == "zarr":
        zarr = pytest.importorskip("zarr")
        zarr.create_array(str(tmp_path / "v.zarr"), shape=data.shape, chunks=(4, 4, 4), dtype=data.dtype)[...] = data
        volume = ef.open(tmp_path / "v.zarr", in_memory=False)
    else:
        with h5py.File(tmp_path / "v.h5", "w") as f:
            f.create_dataset("raw", data=data, chunks=(4, 4, 4))
        volume = ef.hdf5(tmp_path / "v.h5", "raw", in_memory=False)
    np.testing.assert_array_equal(np.asarray(volume)[0], data)
    slabs = volume.slabs(max_bytes=data[0].nbytes)
    next(slabs)
    volume.close()
    with pytest.raises(ValueError, match="the volume was closed"):  # closed between two slabs
        next(slabs)
    for read in (lambda: np.asarray(volume), lambda: volume.slabs(), lambda: volume[0],
                 lambda: volume.read_padded((-9, 0, 0), (2, 2, 2), np.empty((1, 2, 2, 2), np.uint8), "constant"),
                 lambda: volume.read_box((0, 0, 0), (2, 2, 2), np.empty((1, 2, 2, 2), np.uint8))):
        with pytest.raises(ValueError, match="the volume was closed; open it again"):
            read()


@pytest.mark.parametrize("channels", [None, 2])
@pytest.mark.parametrize("in_memory", [True, False])
def test_slabs_cover_the_volume_in_chunk_aligned_sections(tmp_path, rng, channels, in_memory):
    shape = (23, 12, 10) if channels is None else (channels, 23, 12, 10)
    data = rng.integers(0, 60000, shape, dtype=np.uint16)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=shape[:-3] + (3, 6, 5))
    section = (channels or 1) * 12 * 10 * 2
    with ef.hdf5(tmp_path / "s.h5", "raw", in_memory=in_memory) as volume:
        starts, pieces = [], []
        for z, slab in volume.slabs(max_bytes=7 * section):  # 7 sections fit: 6, a multiple of the chunks' 3
            starts.append(z)
            pieces.append(slab.copy())
        assert starts == [0, 6, 12, 18]
        np.testing.assert_array_equal(np.concatenate(pieces, axis=1), data if channels else data[np.newaxis])
        assert [z for z, _ in volume.slabs(max_bytes=1)] == list(range(23))  # at least one section per slab
        if not in_memory:
            assert volume.cache_stats.misses == 0  # slabs bypass the chunk cache


def test_the_stamp_records_the_file_as_opened(small_h5):
    path, _, _ = small_h5
    for in_memory in (True, False):
        with ef.hdf5(path, "volumes/raw", in_memory=in_memory) as volume:
            source = volume.stamp
            assert source.path == path.resolve() and source.dataset == "volumes/raw"
            assert (source.size, source.mtime_ns) == (path.stat().st_size, path.stat().st_mtime_ns)
            assert source.unchanged()
    assert ef.Volume.from_array(np.zeros((2, 2, 2), np.uint8)).stamp is None


def test_np_asarray_of_a_volume_is_its_data(small_h5, monkeypatch):
    """np.asarray(volume) used to give a 0-d object array. In memory it is the array itself (a copy only when
    asked); lazily it reads the whole volume below a size limit and refuses above it, naming the size."""
    path, raw, _ = small_h5
    volume = ef.hdf5(path, "volumes/raw")
    data = np.asarray(volume)
    assert data.shape == (1,) + raw.shape and np.shares_memory(data, volume.array)
    np.testing.assert_array_equal(data[0], raw)
    assert not np.shares_memory(np.array(volume, copy=True), volume.array)
    assert np.asarray(volume, dtype=np.float32).dtype == np.float32
    lazy = ef.hdf5(path, "volumes/raw", in_memory=False)
    np.testing.assert_array_equal(np.asarray(lazy)[0], raw)
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":  # np.asarray's copy= (NumPy 1.x, which emfast runs on, has none)
        with pytest.raises(ValueError, match="needs a copy"):
            np.asarray(volume, dtype=np.float32, copy=False)
        with pytest.raises(ValueError, match="read lazily: np.asarray\\(copy=False\\) cannot give it without a copy"):
            np.asarray(lazy, copy=False)
    monkeypatch.setattr(ef.io._volume, "ASARRAY_LIMIT_BYTES", raw.nbytes - 1)
    with pytest.raises(ValueError, match=r"volumes/raw: np.asarray would read the whole lazy volume, .* GiB, more "
                                         r"than the .* GiB limit; read the part you need with volume.read_box"):
        np.asarray(lazy)


class _NumpyIntSource(ef.io.VolumeSource):
    """A source whose sizes are NumPy integers, as h5py and NumPy arithmetic hand them out."""

    def __init__(self):
        self.name, self.dtype = "numpy-ints", np.dtype(np.uint8)
        self.full_shape = tuple(np.int64(s) for s in (10, 12, 14))
        self.chunks = tuple(np.int64(c) for c in (5, 6, 7))
        self.stamp = None

    def read(self, corner, extent, out):
        out[...] = 1


def test_reprs_show_plain_numbers(small_h5):
    source = _NumpyIntSource()
    assert repr(source) == "_NumpyIntSource('numpy-ints', shape=(10, 12, 14), dtype=uint8, chunks=(5, 6, 7))"
    volume = ef.Volume.open(source, in_memory=False)
    assert repr(volume.chunks) == "(5, 6, 7)" and "np." not in repr(volume)
    path, _, _ = small_h5
    with ef.hdf5(path, "volumes/raw", in_memory=False) as lazy:
        assert repr(lazy._reader) == f"Hdf5Source('{path}:volumes/raw', shape=(20, 48, 40), dtype=uint8, " \
                                     "chunks=(4, 16, 16))"


def test_volume_source_is_a_deprecated_name_of_its_stamp(tmp_path):
    import h5py
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((4, 4, 4), np.uint8))
    volume = ef.open(str(tmp_path / "a.h5/raw"))
    assert volume.stamp.dataset == "raw"
    with pytest.warns(DeprecationWarning, match="Volume.source is deprecated; use Volume.stamp"):
        assert volume.source is volume.stamp
    with pytest.warns(DeprecationWarning, match="Volume\\(source=\\) is deprecated; use stamp="):
        again = ef.Volume(volume.array, name="copy", source=volume.stamp)
    assert again.stamp is volume.stamp


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc/self/fd (Linux)")
def test_closing_a_volume_behind_an_external_link_closes_both_files(tmp_path):
    """The file the link leads to stayed open after close()."""
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f.create_dataset("raw", data=np.arange(8 * 16 * 16, dtype=np.uint16).reshape(8, 16, 16), chunks=(4, 8, 8))
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f["raw"] = h5py.ExternalLink("data.h5", "raw")

    def open_files():
        names = (os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
        return sorted(os.path.basename(name) for name in names if name.startswith(str(tmp_path)))

    volume = ef.hdf5(tmp_path / "main.h5", "raw", in_memory=False)
    out = np.empty((1, 4, 8, 8), np.uint16)
    volume.read_box((4, 8, 8), (4, 8, 8), out)
    assert out[0, 0, 0, 0] == 4 * 256 + 8 * 16 + 8 and open_files() == ["data.h5", "main.h5"]
    volume.close()
    assert open_files() == []


def test_a_dataset_not_found_in_a_file_of_links_lists_the_linked_datasets(tmp_path):
    """A misspelt dataset in a file of links (soft and external) listed "datasets there: none"."""
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["volumes/raw"] = np.zeros((4, 8, 8), np.uint8)
    with h5py.File(tmp_path / "links.h5", "w") as f:
        f["raw"] = h5py.ExternalLink("data.h5", "volumes/raw")
        f.create_group("inner")["soft"] = h5py.SoftLink("/raw")
    for opened in (lambda: ef.hdf5(tmp_path / "links.h5", "volumes/raw"),
                   lambda: ef.open(tmp_path / "links.h5/nothing")):
        with pytest.raises(ef.DatasetNotFoundError, match="datasets there: inner/soft, raw$"):
            opened()


def test_in_memory_must_be_a_bool_not_a_string_that_is_true(tmp_path):
    """``ef.open(path, in_memory="false")`` loaded the whole volume: a non-empty string is true."""
    with h5py.File(tmp_path / "v.h5", "w") as file:
        file["raw"] = np.zeros((4, 8, 8), np.uint8)
    for opened in (lambda: ef.open(tmp_path / "v.h5/raw", in_memory="false"),
                   lambda: ef.hdf5(tmp_path / "v.h5", "raw", in_memory="no")):
        with pytest.raises(TypeError, match="in_memory must be True or False, got '(false|no)'"):
            opened()


def test_an_optional_plugin_filter_the_first_chunk_went_without_is_named_when_read(tmp_path):
    """An optional filter (as hdf5plugin registers blosc) that HDF5 skipped for the first chunk (one it could not
    shrink) and applied to the others: the open passed, as the first chunk needs no filter, and reading any other
    chunk blamed a corrupt file (a review). The read's error names the filter."""
    if h5py.h5z.filter_avail(32001):
        pytest.skip("an HDF5 blosc filter is loaded in this process (hdf5plugin imported)")
    data = np.random.default_rng(0).integers(0, 255, (20, 70, 90), dtype=np.uint8)
    chunks = (10, 35, 45)
    with h5py.File(tmp_path / "mixed.h5", "w") as f:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_chunk(chunks)
        plist.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, ())
        h5py.h5d.create(f.id, b"v", h5py.h5t.NATIVE_UINT8, h5py.h5s.create_simple(data.shape), dcpl=plist)
        for corner in itertools.product(range(0, 20, 10), range(0, 70, 35), range(0, 90, 45)):
            first = corner == (0, 0, 0)
            block = data[tuple(slice(c, c + k) for c, k in zip(corner, chunks))]
            f["v"].id.write_direct_chunk(corner, block.tobytes() if first else b"blosc?" * 100,
                                         filter_mask=1 if first else 0)
    lazy = ef.open(tmp_path / "mixed.h5", "v", in_memory=False)
    out = np.empty((1,) + chunks, np.uint8)
    lazy.read_box((0, 0, 0), chunks, out)
    np.testing.assert_array_equal(out[0], data[:10, :35, :45])
    message = r"mixed.h5:v: a chunk in the box at .* is compressed with the HDF5 filter 32001 .*import hdf5plugin"
    with pytest.raises(ValueError, match=message):
        lazy.read_box((10, 35, 45), chunks, out)
    with pytest.raises(ValueError, match=message):
        ef.open(tmp_path / "mixed.h5", "v")


def test_an_hdf5_plugin_filter_this_library_lacks_is_named_when_opened(tmp_path, capsys):
    """tests/data/blosc_plugin.h5 was written by hdf5plugin 7.1 (h5py 3.16): dataset ``raw`` with the blosc
    filter (32001), ``plain`` with gzip. Without ``import hdf5plugin`` every read failed with "the file may be
    truncated or corrupt", naming no filter, and ``emfast info`` stopped at the first such dataset (found by a
    helper reading the field's stores in their less common encodings)."""
    from pathlib import Path
    from emfast.cli import main
    path = Path(__file__).parent / "data" / "blosc_plugin.h5"
    if h5py.h5z.filter_avail(32001):
        pytest.skip("an HDF5 blosc filter is loaded in this process (hdf5plugin imported)")
    for in_memory in (True, False):
        with pytest.raises(ValueError, match=r"blosc_plugin.h5:raw is compressed with the HDF5 filter 32001 \(blosc\)"
                                             r".*import hdf5plugin"):
            ef.open(path, "raw", in_memory=in_memory)
    expected = np.arange(4 * 8 * 8, dtype=np.uint16).reshape(4, 8, 8)
    np.testing.assert_array_equal(ef.open(path, "plain").array[0], expected)
    assert main(["info", str(path)]) == 0
    listing = capsys.readouterr().out
    assert "raw: " in listing and "not read as a volume" in listing and "filter 32001" in listing
    assert "plain: " in listing  # the others still listed
    layout = h5py.VirtualLayout(shape=(4, 8, 8), dtype=np.uint16)  # a virtual dataset over it: its source's filter
    layout[...] = h5py.VirtualSource(str(path), "raw", shape=(4, 8, 8))
    with h5py.File(tmp_path / "virtual.h5", "w") as f:
        f.create_virtual_dataset("v", layout)
    with pytest.raises(ValueError, match=r"virtual dataset's source .*blosc_plugin.h5:raw is compressed with the "
                                         r"HDF5 filter 32001"):
        ef.open(tmp_path / "virtual.h5", "v")
