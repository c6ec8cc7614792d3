"""Cold lazy reads: the read paths that decode a box's missing chunks (sharded zarr v3 through the shard index,
raw precomputed chunk files straight into cache blocks, several chunks side by side on helper threads), each
compared voxel by voxel with the array written by the field's own tool (zarr-python, tensorstore, cloud-volume),
with partial edge chunks, never-written chunks (the fill value) and damaged chunks (an error naming the store
and the chunk)."""
import math
import os
import threading
import time

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import _decode, _filebatch
from emfast.io._shards import ShardedChunks
from emfast.io._source import CorruptChunkError

from threads import emfast_threads, errors_on_threads

zarr = pytest.importorskip("zarr")

SHAPE = (37, 45, 29)  # neither shards nor chunks divide it: partial edge shards and chunks everywhere
SHARD, INNER = (16, 20, 12), (8, 10, 6)
DTYPES = [np.uint8, np.uint16, np.uint32, np.int64, np.float32]


def random_volume(dtype, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def random_boxes(rng, shape=SHAPE, count=25):
    for _ in range(count):
        extent = [int(rng.integers(1, s + 1)) for s in shape]
        yield [int(rng.integers(0, s - e + 1)) for s, e in zip(shape, extent)], extent


def assert_lazy_equal(path, expected, cache_bytes=None, **open_args):
    """Every random box and the whole volume, read lazily (a cache too small for the volume when given, so blocks
    are evicted and read again), equal ``expected``; returns the volume's reader."""
    rng = np.random.default_rng(1)
    with ef.open(path, in_memory=False, cache_bytes=cache_bytes, **open_args) as volume:
        for corner, extent in random_boxes(rng, expected.shape):
            out = volume.read_box(corner, extent, np.empty((1,) + tuple(extent), volume.dtype))
            box = tuple(slice(c, c + e) for c, e in zip(corner, extent))
            np.testing.assert_array_equal(out[0], expected[box])
        np.testing.assert_array_equal(np.asarray(volume)[0], expected)
        return volume._reader


# sharded zarr v3 ------------------------------------------------------------------------------------------------

def write_sharded_zarr_python(path, data, compressor, fill_value=0, region=None):
    array = zarr.create_array(str(path), shape=data.shape, chunks=INNER, shards=SHARD, dtype=data.dtype,
                              compressors=compressor, fill_value=fill_value)
    box = tuple(slice(None) for _ in data.shape) if region is None else region
    array[box] = data[box]
    return array


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compressor", ["zstd", "blosc", "gzip", None])
def test_sharded_zarr_python_reads_exactly_through_the_shard_index(tmp_path, dtype, compressor):
    data = random_volume(dtype)
    codec = {"zstd": zarr.codecs.ZstdCodec(), "blosc": zarr.codecs.BloscCodec(), "gzip": zarr.codecs.GzipCodec(),
             None: None}[compressor]
    write_sharded_zarr_python(tmp_path / "s.zarr", data, codec)
    reader = assert_lazy_equal(tmp_path / "s.zarr", data, cache_bytes=6 * int(np.prod(INNER)) * data.itemsize)
    assert isinstance(reader._direct, ShardedChunks)  # not zarr-python's codec pipeline
    assert reader.parallel_reads == (compressor is not None)


def test_codec_settings_given_as_zarr_3_2_gives_them(tmp_path):
    """zarr 3.2 on (what pip installs on Python 3.12) gives codec settings as strings where 3.1 gave enums:
    ``.value`` raised AttributeError (a helper's 3.12 run: no sharded store read, no chunk written), and a
    big-endian shard index would have passed for a little-endian one."""
    import copy
    from pathlib import Path
    from types import SimpleNamespace
    from emfast.io import _zarr
    from emfast.io._chunkfiles import _v3_compressor

    def as_text(codec, **settings):  # a copy (zarr may share codec objects) with settings as zarr 3.2 holds them
        codec = copy.copy(codec)
        for name, value in settings.items():
            object.__setattr__(codec, name, value)  # frozen dataclasses
        return codec

    def reader(index_endian):
        sharding = array.metadata.codecs[0]
        inner = (as_text(sharding.codecs[0], endian="little"),
                 as_text(sharding.codecs[1], shuffle="shuffle", cname="zstd"))
        index = (as_text(sharding.index_codecs[0], endian=index_endian), sharding.index_codecs[1])
        codecs = (as_text(sharding, index_location="end", codecs=inner, index_codecs=index),)
        posing = SimpleNamespace(metadata=SimpleNamespace(codecs=codecs), shards=array.shards, dtype=array.dtype,
                                 chunks=array.chunks, shape=array.shape, serializer=inner[0],
                                 fill_value=array.fill_value)
        return ShardedChunks.for_array(posing, Path(tmp_path / "s.zarr"), _zarr._decoder, _zarr._decoder_into), inner

    data = random_volume(np.uint16)
    array = write_sharded_zarr_python(tmp_path / "s.zarr", data, zarr.codecs.BloscCodec())
    found, inner = reader("little")
    assert found is not None and found._at_end
    assert _v3_compressor(inner, 2).cname == "zstd"
    assert reader("big")[0] is None


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize("index_location", ["end", "start"])
def test_sharded_zarr3_written_by_tensorstore(tmp_path, dtype, index_location):
    ts = pytest.importorskip("tensorstore")
    data = random_volume(dtype)
    inner = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": list(INNER), "index_location": index_location,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}
    ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "s.zarr")},
             "metadata": {"shape": list(SHAPE), "data_type": np.dtype(dtype).name,
                          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHARD)}},
                          "codecs": [inner]}, "create": True}).result()[...] = data
    reader = assert_lazy_equal(tmp_path / "s.zarr", data)
    assert isinstance(reader._direct, ShardedChunks)


def test_never_written_shards_and_inner_chunks_read_as_the_fill_value(tmp_path):
    data = random_volume(np.int64)
    # only part of the array: whole shards are missing, and so are inner chunks of the shards written
    region = (slice(0, 20), slice(5, 25), slice(0, 29))
    write_sharded_zarr_python(tmp_path / "s.zarr", data, zarr.codecs.ZstdCodec(), fill_value=-7, region=region)
    expected = np.full(SHAPE, -7, np.int64)
    expected[region] = data[region]
    assert len(os.listdir(tmp_path / "s.zarr/c")) < -(-SHAPE[0] // SHARD[0])  # a shard file is missing
    reader = assert_lazy_equal(tmp_path / "s.zarr", expected)
    assert isinstance(reader._direct, ShardedChunks)


def shard_file(path):
    return path / "s.zarr/c/0/0/0"


def test_a_corrupt_inner_chunk_names_the_store_and_the_chunk(tmp_path):
    data = random_volume(np.uint16)
    write_sharded_zarr_python(tmp_path / "s.zarr", data, zarr.codecs.ZstdCodec())
    raw = bytearray(shard_file(tmp_path).read_bytes())
    raw[:64] = bytes(64)  # the first inner chunk's zstd frame, index at the end untouched
    shard_file(tmp_path).write_bytes(bytes(raw))
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        with pytest.raises(CorruptChunkError, match=r"s\.zarr: chunk \(z, y, x\) = \(0, 0, 0\) \(in shard c/0/0/0\): "
                                                    "cannot decode it"):
            volume.read_box((0, 0, 0), INNER, np.empty((1,) + INNER, np.uint16))
        # the rest of the store reads
        out = volume.read_box((SHARD[0], 0, 0), INNER, np.empty((1,) + INNER, np.uint16))
        np.testing.assert_array_equal(out[0], data[SHARD[0]:SHARD[0] + INNER[0], :INNER[1], :INNER[2]])


def test_a_shard_index_failing_its_checksum_or_pointing_outside_the_file_is_refused(tmp_path):
    data = random_volume(np.uint8)
    write_sharded_zarr_python(tmp_path / "s.zarr", data, zarr.codecs.ZstdCodec())
    good = shard_file(tmp_path).read_bytes()
    index_bytes = 16 * int(np.prod([s // i for s, i in zip(SHARD, INNER)])) + 4
    flipped = bytearray(good)
    flipped[-index_bytes] ^= 0xFF  # the first entry's offset, so its checksum fails
    shard_file(tmp_path).write_bytes(bytes(flipped))
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        with pytest.raises(CorruptChunkError, match=r"s\.zarr: chunk .* \(in shard c/0/0/0\): the shard's index "
                                                    "fails its CRC32C checksum"):
            volume.read_box((0, 0, 0), INNER, np.empty((1,) + INNER, np.uint8))
    shard_file(tmp_path).write_bytes(good[-index_bytes:])  # truncated: the index only, its chunks gone
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        with pytest.raises(CorruptChunkError, match=r"s\.zarr: chunk .* the shard's index places it at bytes .*"
                                                    "beyond the file"):
            volume.read_box((0, 0, 0), INNER, np.empty((1,) + INNER, np.uint8))
    shard_file(tmp_path).write_bytes(good[:10])
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        with pytest.raises(CorruptChunkError, match=r"the shard file has 10 bytes, fewer than its index's"):
            volume.read_box((0, 0, 0), INNER, np.empty((1,) + INNER, np.uint8))


def test_a_rewritten_shard_is_never_read_through_its_old_index(tmp_path):
    """The shard index kept by the reader is used only while the shard file is unchanged."""
    first = random_volume(np.uint16, seed=1)
    write_sharded_zarr_python(tmp_path / "s.zarr", first, zarr.codecs.ZstdCodec())
    volume = ef.open(tmp_path / "s.zarr", in_memory=False)
    reader = volume._reader
    out = np.empty((1,) + INNER, np.uint16)
    reader.read((0, 0, 0), INNER, out)
    np.testing.assert_array_equal(out[0], first[:8, :10, :6])
    second = np.arange(np.prod(SHAPE), dtype=np.uint16).reshape(SHAPE) // 64  # compresses to another size
    zarr.open_array(str(tmp_path / "s.zarr"), mode="r+")[:16, :20, :12] = second[:16, :20, :12]
    reader.read((0, 0, 0), INNER, out)  # the same reader, its index of the old shard kept
    np.testing.assert_array_equal(out[0], second[:8, :10, :6])


def test_sharded_arrays_emfast_does_not_decode_itself_still_read_through_zarr_python(tmp_path):
    data = random_volume(np.uint8)
    array = zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, shards=SHARD, dtype=np.uint8,
                              filters=[zarr.codecs.TransposeCodec(order=(2, 1, 0))])
    array[...] = data
    reader = assert_lazy_equal(tmp_path / "s.zarr", data)
    assert reader._direct is None and not reader.parallel_reads


# raw precomputed chunk files -----------------------------------------------------------------------------------

def write_cloudvolume_raw(path, data):
    cloudvolume = pytest.importorskip("cloudvolume")
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=1, layer_type="image", data_type=np.dtype(data.dtype).name, encoding="raw",
        resolution=[4, 4, 40], voxel_offset=[3, 5, 7], chunk_size=[6, 10, 8], volume_size=list(data.shape[::-1]))
    volume = cloudvolume.CloudVolume(f"file://{path}", info=info, compress=False, progress=False)
    volume.commit_info()
    volume[3:3 + data.shape[2], 5:5 + data.shape[1], 7:7 + data.shape[0]] = data.T
    return path / "4_4_40"


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint64, np.float32])
def test_raw_precomputed_chunks_read_straight_into_blocks(tmp_path, dtype, monkeypatch):
    from emfast.io import _precomputed
    data = random_volume(dtype)
    directory = write_cloudvolume_raw(tmp_path / "pc", data)
    os.remove(directory / "3-9_5-15_7-15")  # never written: zeros, as neuroglancer reads it
    expected = data.copy()
    expected[:8, :10, :6] = 0
    straight = []
    into = _precomputed.read_regular_file_into
    monkeypatch.setattr(_precomputed, "read_regular_file_into",
                        lambda *args: straight.append(into(*args)) or straight[-1])
    reader = assert_lazy_equal(tmp_path / "pc", expected, cache_bytes=5 * 6 * 10 * 8 * data.itemsize,
                               format="precomputed")
    assert True in straight and None in straight  # chunks read straight; the missing one went the general way
    assert not reader.parallel_reads


def test_a_raw_precomputed_chunk_of_another_size_names_the_chunk(tmp_path):
    data = random_volume(np.uint16)
    directory = write_cloudvolume_raw(tmp_path / "pc", data)
    chunk = directory / "9-15_5-15_7-15"
    chunk.write_bytes(chunk.read_bytes()[:-2])
    with ef.open(tmp_path / "pc", in_memory=False, format="precomputed") as volume:
        with pytest.raises(CorruptChunkError, match=r"pc: chunk 4_4_40/9-15_5-15_7-15 decodes to 958 bytes, but the "
                                                    r"metadata promise \(1, 8, 10, 6\) uint16 = 960 bytes"):
            volume.read_box((0, 0, 6), (8, 10, 6), np.empty((1, 8, 10, 6), np.uint16))


# several chunks side by side -------------------------------------------------------------------------------------

class Recording:
    """A volume source that records which thread read each chunk, and fails on the chunks named; it reads chunk by
    chunk (no ``read_many``), as sources that do not read their files themselves do."""

    parallel_reads = True
    read_many = None

    def __init__(self, source, failing=()) -> None:
        self._source = source
        self.threads = set()
        self.failing = set(failing)
        self.calls = 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._source, name)

    def read(self, corner, extent, out):
        with self._lock:
            self.threads.add(threading.get_ident())
            self.calls += 1
        time.sleep(0.002)  # long enough that every helper takes a chunk
        if tuple(corner) in self.failing:
            raise CorruptChunkError(f"chunk at {tuple(corner)} is damaged")
        self._source.read(corner, extent, out)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_missing_chunks_of_a_box_are_read_on_several_threads_and_equal_numpy(tmp_path, dtype, monkeypatch):
    monkeypatch.setattr(_decode, "_cores", lambda: 4)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 4)
    data = random_volume(dtype)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=dtype)[...] = data
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        cache = volume.chunk_cache
        recording = cache._source = Recording(cache._source)
        rng = np.random.default_rng(2)
        for corner, extent in random_boxes(rng):
            out = volume.read_box(corner, extent, np.empty((1,) + tuple(extent), dtype))
            np.testing.assert_array_equal(out[0], data[tuple(slice(c, c + e) for c, e in zip(corner, extent))])
        assert len(recording.threads) > 1
        assert recording.calls == cache.stats.misses  # each block read once, whichever thread read it
    assert not emfast_threads()  # the helpers ended with the reads that needed them


def test_a_chunk_failing_among_parallel_reads_is_raised_and_the_others_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(_decode, "_cores", lambda: 4)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 4)
    data = random_volume(np.uint8)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint8)[...] = data
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        cache = volume.chunk_cache
        cache._source = Recording(cache._source, failing={(8, 10, 6)})
        with pytest.raises(CorruptChunkError, match=r"chunk at \(8, 10, 6\) is damaged"):
            volume.read_box((0, 0, 0), (24, 30, 18), np.empty((1, 24, 30, 18), np.uint8))
        assert cache.stats.blocks_held == 26 and not cache.grid.pins.any()  # the 26 others kept, nothing pinned
        cache._source.failing.clear()
        out = volume.read_box((0, 0, 0), (24, 30, 18), np.empty((1, 24, 30, 18), np.uint8))
        np.testing.assert_array_equal(out[0], data[:24, :30, :18])
    assert not emfast_threads()


def test_run_all_runs_every_call_once_and_raises_the_first_error_after_all_ended(monkeypatch):
    monkeypatch.setattr(_decode, "_cores", lambda: 3)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 3)
    done, threads = [], set()

    def call(n):
        def run():
            time.sleep(0.001)
            threads.add(threading.get_ident())
            done.append(n)
            if n in (3, 7):
                raise ValueError(f"call {n}")
        return run

    with pytest.raises(ValueError, match=r"call (3|7)"):
        _decode.run_all([call(n) for n in range(20)])
    assert sorted(done) == list(range(20)) and len(threads) > 1
    assert not emfast_threads()
    monkeypatch.setattr(_decode, "_cores", lambda: 1)
    threads.clear()
    _decode.run_all([call(n) for n in range(20, 30)])
    assert threads == {threading.get_ident()}  # one core: the calling thread alone
    monkeypatch.setattr(_decode, "_cores", lambda: 3)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 0)
    threads.clear()
    _decode.run_all([call(n) for n in range(30, 40)])
    assert threads == {threading.get_ident()}  # every core busy: no helper


def test_idle_cores_are_the_cores_less_the_threads_runnable_now(monkeypatch, tmp_path):
    monkeypatch.setattr(_decode, "_cores", lambda: 4)
    figures = tmp_path / "loadavg"
    monkeypatch.setattr(_decode, "LOADAVG", str(figures))
    figures.write_text("5.10 4.00 3.00 3/812 4242\n")  # a busy last minute, but 3 threads runnable now
    assert _decode._idle_cores() == 1
    figures.write_text("0.00 0.00 0.00 7/812 4242\n")
    assert _decode._idle_cores() == 0


def test_idle_cores_follow_the_load_average_without_proc(monkeypatch, tmp_path):
    monkeypatch.setattr(_decode, "_cores", lambda: 4)
    monkeypatch.setattr(_decode, "LOADAVG", str(tmp_path / "none"))  # no /proc (macOS)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 0.0, 0.0))
    assert _decode._idle_cores() == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 0.0, 0.0))
    assert _decode._idle_cores() == 0


# whole chunks decoded straight into their cache blocks ------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 255, 256, 300, 65535, 65536, 70000, 1 << 20])
def test_the_decoded_size_read_from_zstd_and_blosc_headers_is_the_encoded_size(size):
    numcodecs = pytest.importorskip("numcodecs")
    data = np.random.default_rng(size).integers(0, 4, size, dtype=np.uint8)
    for level in (1, 5, 19):
        assert _decode.zstd_content_size(numcodecs.Zstd(level=level).encode(data)) == size
    for cname in ("lz4", "zstd", "blosclz"):
        assert _decode.blosc_content_size(numcodecs.Blosc(cname=cname).encode(data)) == size
    assert _decode.zstd_content_size(b"not a zstd frame") is None and _decode.blosc_content_size(b"short") is None


@pytest.mark.parametrize("zarr_format, compressor", [(2, "zstd"), (2, "blosc"), (3, "zstd"), (3, "blosc"), (3, None)])
def test_whole_chunks_are_decoded_straight_into_blocks_and_edge_chunks_the_general_way(tmp_path, zarr_format,
                                                                                       compressor):
    data = random_volume(np.uint16)
    codec = {(2, "zstd"): {"id": "zstd", "level": 1}, (2, "blosc"): {"id": "blosc"}, (3, "zstd"): zarr.codecs.ZstdCodec(),
             (3, "blosc"): zarr.codecs.BloscCodec(), (3, None): None}[zarr_format, compressor]
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint16, zarr_format=zarr_format,
                      compressors=codec)[...] = data
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        direct = volume._reader._direct
        decoded = []
        general = direct._decode
        direct._decode = lambda data: decoded.append(len(data)) or general(data)
        out = volume.read_box((0, 0, 0), INNER, np.empty((1,) + INNER, np.uint16))  # a whole chunk
        np.testing.assert_array_equal(out[0], data[:8, :10, :6])
        assert decoded == []  # not through the general decoder
        edge = (SHAPE[0] - 5, 0, 0)  # the last chunk along z holds 5 of its 8 planes
        out = volume.read_box(edge, (5,) + INNER[1:], np.empty((1, 5) + INNER[1:], np.uint16))
        np.testing.assert_array_equal(out[0], data[-5:, :10, :6])
        assert len(decoded) == 1  # the edge chunk, stored whole, decoded and cut


# precomputed scales tensorstore reads: a box's missing chunks in one batch of concurrent reads --------------------

def write_tensorstore_precomputed(path, data, sharded):
    ts = pytest.importorskip("tensorstore")
    scale = {"resolution": [4, 4, 40], "voxel_offset": [3, 5, 7], "size": list(data.shape[::-1]),
             "chunk_size": [6, 10, 8], "encoding": "raw"}
    if sharded:
        scale["sharding"] = {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 1, "hash": "identity",
                             "minishard_bits": 1, "shard_bits": 2, "minishard_index_encoding": "gzip",
                             "data_encoding": "gzip"}
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path)},
                     "multiscale_metadata": {"type": "image", "data_type": np.dtype(data.dtype).name,
                                             "num_channels": 1},
                     "scale_metadata": scale, "create": True}).result()
    store[...] = data.T[..., np.newaxis]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint64, np.float32])
def test_precomputed_through_tensorstore_reads_a_box_s_missing_chunks_in_one_batch(tmp_path, dtype):
    data = random_volume(dtype)
    write_tensorstore_precomputed(tmp_path / "pc", data, sharded=True)
    with ef.open(tmp_path / "pc", in_memory=False, format="precomputed") as volume:
        source = volume.chunk_cache._source
        batches = []
        read_many = source.read_many
        source.read_many = lambda requests: batches.append(len(requests)) or read_many(requests)
        out = volume.read_box((3, 4, 5), (20, 25, 20), np.empty((1, 20, 25, 20), dtype))
        np.testing.assert_array_equal(out[0], data[3:23, 4:29, 5:25])
        assert batches == [3 * 3 * 5]  # every missing chunk of the box (chunks (8, 10, 6)) in one call
        assert volume.cache_stats.misses == 45
    assert_lazy_equal(tmp_path / "pc", data, cache_bytes=5 * 6 * 10 * 8 * data.itemsize, format="precomputed")


def test_a_failing_read_among_a_batch_names_the_box_and_leaves_nothing_pinned(tmp_path):
    data = random_volume(np.uint8)
    write_tensorstore_precomputed(tmp_path / "pc", data, sharded=True)
    with ef.open(tmp_path / "pc", in_memory=False, format="precomputed") as volume:
        for shard in (tmp_path / "pc/4_4_40").iterdir():
            shard.write_bytes(shard.read_bytes()[:-7])  # every shard truncated
        with pytest.raises(CorruptChunkError, match=r"pc: the box at \(z, y, x\) = .*: cannot read it"):
            volume.read_box((0, 0, 0), (16, 20, 12), np.empty((1, 16, 20, 12), np.uint8))
        cache = volume.chunk_cache
        assert not cache.grid.pins.any() and cache.stats.blocks_held == 0 and not cache._pending


# a box's missing chunks read in one call of the compiled reader, decoded in parts side by side -------------------

@pytest.mark.parametrize("zarr_format, compressor", [(2, {"id": "blosc", "cname": "lz4"}), (2, {"id": "zlib"}),
                                                     (2, None), (3, "zstd"), (3, "gzip"), (3, None)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_a_box_s_missing_zarr_chunks_are_read_in_one_call_and_equal_zarr_python(tmp_path, monkeypatch, zarr_format,
                                                                                 compressor, dtype):
    from emfast.io import _zarr
    data = random_volume(dtype)
    codec = {"zstd": zarr.codecs.ZstdCodec(), "gzip": zarr.codecs.GzipCodec()}[compressor] \
        if isinstance(compressor, str) else compressor
    array = zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=dtype,
                              zarr_format=zarr_format, compressors=codec, fill_value=7)
    array[:30] = data[:30]  # the chunks beyond plane 32 are never written, planes 30 and 31 hold the fill value
    expected = data.copy()
    expected[30:] = 7
    calls = {"read_regular_files": [], "read_decoded_files": []}  # the edge chunks' files; the whole chunks'
    for name, counted in [(name, getattr(_zarr, name)) for name in calls]:
        monkeypatch.setattr(_zarr, name, lambda paths, *a, counted=counted, name=name, **k:
                            calls[name].append(len(paths)) or counted(paths, *a, **k))
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)  # helpers wherever the work pays for them
    assert_lazy_equal(tmp_path / "s.zarr", expected, cache_bytes=40 * 8 * 10 * 6 * 4)  # 40 blocks: evicted, read again
    compiled = volume_reader_codec(tmp_path / "s.zarr")  # whole chunks read and decoded in one compiled call
    assert max(calls["read_regular_files"]) > 1 and (max(calls["read_decoded_files"]) > 1 if compiled else
                                                      not calls["read_decoded_files"])  # a box's chunks at once
    assert not emfast_threads()


def volume_reader_codec(path):
    """The codec in which the plain zarr array at ``path`` is read and decoded by one compiled call, or None (its
    codec's library is missing: read, then decoded through numcodecs)."""
    with ef.open(path, in_memory=False) as volume:
        direct = volume.chunk_cache._source._direct
        return _filebatch.compiled_codec(direct._raw, direct._decode_into)


def test_a_4d_zarr_array_with_its_channels_in_one_chunk_is_read_in_batches(tmp_path):
    data = random_volume(np.uint16, (3,) + SHAPE)
    zarr.create_array(str(tmp_path / "c.zarr"), shape=data.shape, chunks=(3,) + INNER, dtype=np.uint16,
                      compressors=zarr.codecs.ZstdCodec(), dimension_names=["c", "z", "y", "x"])[...] = data
    rng = np.random.default_rng(4)
    with ef.open(tmp_path / "c.zarr", in_memory=False) as volume:
        for corner, extent in random_boxes(rng, count=10):
            out = volume.read_box(corner, extent, np.empty((3,) + tuple(extent), np.uint16))
            np.testing.assert_array_equal(out, data[(slice(None),) + tuple(slice(c, c + e)
                                                                           for c, e in zip(corner, extent))])


@pytest.mark.parametrize("zarr_format, encoding", [(2, None), (2, {"name": "v2", "separator": "/"}), (3, None),
                                                   (3, {"name": "v2", "separator": "."}),
                                                   (3, {"name": "default", "separator": "."})])
@pytest.mark.parametrize("channels", [0, 2])
def test_chunk_files_are_found_under_every_key_encoding_zarr_python_writes(tmp_path, zarr_format, encoding,
                                                                          channels):
    """emfast names a chunk's file itself (in the form of the array's own key encoding, checked on probes): each
    encoding and separator zarr-python writes, with and without a channel axis, reads the written data, with
    chunk indices of several digits (a key of the wrong form would read as the fill value)."""
    shape = ((channels,) if channels else ()) + (24, 3 * 11, 2 * 10)
    chunks = ((channels,) if channels else ()) + (2, 3, 2)
    data = random_volume(np.uint16, shape, seed=channels)
    options = {} if encoding is None else {"chunk_key_encoding": encoding}
    zarr.create_array(str(tmp_path / "k.zarr"), shape=shape, chunks=chunks, dtype=np.uint16, fill_value=0,
                      zarr_format=zarr_format, compressors=None, **options)[...] = data
    with ef.open(tmp_path / "k.zarr", in_memory=False) as volume:
        out = volume.read_box((0, 0, 0), shape[-3:], np.empty((channels or 1,) + shape[-3:], np.uint16))
    np.testing.assert_array_equal(out, data.reshape(out.shape))


def test_keys_of_a_form_other_than_prefix_and_separator_are_asked_of_the_encoder():
    from emfast.io._zarr import _key_form
    assert _key_form(lambda grid: "c/" + "/".join(map(str, grid)), 1) == ("c/0/", "/")
    assert _key_form(lambda grid: "/".join(map(str, grid[::-1])), 0) is None  # another order
    assert _key_form(lambda grid: "-".join(f"{i:04d}" for i in grid), 0) is None  # padded


def test_a_shard_rewritten_between_its_index_and_its_chunks_is_read_again_from_its_new_index(tmp_path):
    """The batch path keeps a shard's index and reads the chunks' byte ranges later: a shard rewritten in between
    (another size or time) has its chunks read again through its new index, never at the old offsets."""
    first = random_volume(np.uint16, seed=1)
    write_sharded_zarr_python(tmp_path / "s.zarr", first, zarr.codecs.ZstdCodec())
    box, extent = (0, 0, 0), (16, 20, 12)  # one whole shard: 8 inner chunks
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        out = volume.read_box(box, extent, np.empty((1,) + extent, np.uint16))
        np.testing.assert_array_equal(out[0], first[:16, :20, :12])
        assert volume._reader._direct._indexes  # the shard's index kept
        second = np.arange(np.prod(SHAPE), dtype=np.uint16).reshape(SHAPE) // 64  # compresses to another size
        zarr.open_array(str(tmp_path / "s.zarr"), mode="r+")[:16, :20, :12] = second[:16, :20, :12]
        volume.chunk_cache.clear()
        out = volume.read_box(box, extent, np.empty((1,) + extent, np.uint16))
        np.testing.assert_array_equal(out[0], second[:16, :20, :12])


def test_sharded_boxes_read_each_shard_index_once_in_batches(tmp_path, monkeypatch):
    data = random_volume(np.float32)
    write_sharded_zarr_python(tmp_path / "s.zarr", data, zarr.codecs.BloscCodec())
    indexes = []
    keep = ShardedChunks._keep_index
    monkeypatch.setattr(ShardedChunks, "_keep_index", lambda self, key, *a: indexes.append(key) or keep(self, key, *a))
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)
    assert_lazy_equal(tmp_path / "s.zarr", data)
    assert len(indexes) == len(set(indexes)) == 3 * 3 * 3  # every shard's index read once, all kept


def test_side_by_side_runs_every_item_once_in_parts_and_raises_after_all_ended(monkeypatch):
    monkeypatch.setattr(_decode, "_cores", lambda: 3)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 2)
    runner = _decode.SideBySide()
    seen, threads = [], set()

    def work(part):
        threads.add(threading.get_ident())
        for item in part:
            time.sleep(0.001)  # slow items: worth helpers once measured
            seen.append(item)
            if item == 13:
                raise ValueError("item 13")

    runner.run(list(range(10)), work)
    assert sorted(seen) == list(range(10)) and threads == {threading.get_ident()}  # unmeasured: this thread alone
    seen.clear()
    with pytest.raises(ValueError, match="item 13"):
        runner.run(list(range(10, 40)), work)
    # three parts, 10..19 on this thread (it stops at its error), 20..29 and 30..39 on two helpers, all ended
    assert sorted(seen) == list(range(10, 14)) + list(range(20, 40)) and len(threads) == 3
    assert not emfast_threads()
    quick = _decode.SideBySide()
    threads.clear()
    for _ in range(3):
        quick.run(list(range(30)), lambda part: threads.add(threading.get_ident()))
    assert threads == {threading.get_ident()}  # items too quick to pay for a helper


def test_stores_opened_again_share_the_measurements_of_their_codec_and_chunk_size(tmp_path):
    """Whether a box's chunks pay for helpers is measured per kind of store, not per handle: a loader opened every
    epoch (or in every worker) would otherwise measure afresh, running its first lists the slow way."""
    data = random_volume(np.uint16)
    for name, chunks, codec in [("a", INNER, {"id": "zstd", "level": 1}), ("b", INNER, {"id": "zstd", "level": 1}),
                                ("c", INNER, {"id": "blosc", "cname": "lz4"}), ("d", (8, 10, 12), {"id": "zstd"})]:
        zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=SHAPE, chunks=chunks, dtype=np.uint16, zarr_format=2,
                          compressors=codec)[...] = data

    def runner(name):
        with ef.open(tmp_path / f"{name}.zarr", in_memory=False) as volume:
            return volume.chunk_cache._source._direct._decodes

    first = runner("a")
    assert runner("a") is first and runner("b") is first  # the same store again, and another one like it
    assert runner("c") is not first and runner("d") is not first  # another codec, another chunk size


def test_a_corrupt_chunk_among_a_batch_names_itself_and_leaves_nothing_pinned(tmp_path):
    data = random_volume(np.uint16)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint16, zarr_format=2,
                      compressors={"id": "zstd", "level": 1})[...] = data
    (tmp_path / "s.zarr" / "1.1.1").write_bytes(b"\x28\xb5\x2f\xfd damaged")
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        with pytest.raises(CorruptChunkError, match=r"s\.zarr: cannot decode chunk 1\.1\.1"):
            volume.read_box((0, 0, 0), (24, 30, 18), np.empty((1, 24, 30, 18), np.uint16))
        assert not volume.chunk_cache.grid.pins.any()
        out = volume.read_box((0, 0, 0), (8, 20, 18), np.empty((1, 8, 20, 18), np.uint16))  # chunks around it
        np.testing.assert_array_equal(out[0], data[:8, :20, :18])


def test_side_by_side_stops_cutting_lists_into_parts_where_that_is_slower(monkeypatch):
    """Parts that run slower side by side than alone (raw reads into fresh memory on a small virtual machine) are
    measured so: the reader goes back to running its lists alone, trying parts again once in EXPLORE_EVERY."""
    monkeypatch.setattr(_decode, "_cores", lambda: 2)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)
    runner, in_parts = _decode.SideBySide(), []

    def work(part):
        cut = len(part) < 8  # a part of the list: four times slower per item than the whole list alone
        time.sleep(0.0005 * len(part) * (4 if cut else 1))
        if cut:
            in_parts[-1] = True

    for _ in range(48):
        in_parts.append(False)
        runner.run(list(range(8)), work)
    assert in_parts[1]  # tried once measured as promising enough work
    assert sum(in_parts[8:]) <= 48 // _decode.EXPLORE_EVERY  # then only to look again
    assert not emfast_threads()


def test_a_helper_that_cannot_be_started_leaves_its_calls_to_the_caller(monkeypatch):
    """Under ulimit -v a helper's start fails ("can't start new thread"): its task stayed queued, run_all raised,
    the cache handed the blocks' buffers on, and the next helper ran the stale calls into them (a helper found
    it). The caller now runs them, and nothing is left queued."""
    real_start, failed = threading.Thread.start, []

    def start(thread):
        if thread.name.startswith("emfast-decode") and not failed:
            failed.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    ran = []
    _decode.run_all([lambda i=i: ran.append(i) for i in range(4)], helpers=1)
    assert failed and sorted(ran) == [0, 1, 2, 3] and not _decode._HELPERS._tasks
    _decode.run_all([lambda: None] * 4, helpers=1)  # a later request, served by a helper that starts
    time.sleep(2 * _decode.HELPER_IDLE_SECONDS)
    assert sorted(ran) == [0, 1, 2, 3]  # nothing of the first request ran again


def test_decode_helpers_serve_one_request_after_another_and_end_once_idle(monkeypatch):
    """A helper waits HELPER_IDLE_SECONDS for the next request (a read loop's next box pays no thread start), then
    ends; the calling thread never waits for a helper that has not taken its share."""
    monkeypatch.setattr(_decode, "_cores", lambda: 2)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)
    served = []

    def slow(n):
        def run():
            time.sleep(0.002)
            served.append((n, threading.get_ident()))
        return run

    caller = threading.get_ident()
    for request in range(5):
        _decode.run_all([slow(10 * request + n) for n in range(8)])
    helpers = {thread for _, thread in served if thread != caller}
    assert sorted(n for n, _ in served) == sorted(10 * r + n for r in range(5) for n in range(8))
    assert len(helpers) == 1  # one helper served every request
    alive = [t for t in threading.enumerate() if t.name.startswith("emfast-decode-")]
    assert len(alive) == 1 and alive[0].ident in helpers
    alive[0].join(_decode.HELPER_IDLE_SECONDS + 2)
    assert not alive[0].is_alive()  # ended once idle


def test_an_idle_decode_helper_holds_nothing_of_the_request_it_served(monkeypatch):
    """The buffers a request's calls fill (a chunk cache's blocks) are free once run_all returns: a helper waiting
    for the next request keeps no reference to the last, which would keep an evicted block's memory from reuse."""
    import weakref
    monkeypatch.setattr(_decode, "_cores", lambda: 2)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)

    class Buffer:
        pass
    buffers = [Buffer() for _ in range(8)]
    served = set()

    def fill(buffer):
        def run():
            time.sleep(0.002)
            served.add(threading.get_ident())
            buffer.filled = True
        return run
    _decode.run_all([fill(buffer) for buffer in buffers])
    assert len(served) == 2  # a helper took a share
    alive = [weakref.ref(buffer) for buffer in buffers]
    del buffers
    assert [ref() for ref in alive] == [None] * 8
    assert any(t.name.startswith("emfast-decode-") for t in threading.enumerate())  # still waiting, idle


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_decode_helpers_work_in_a_forked_child(monkeypatch):
    monkeypatch.setattr(_decode, "_cores", lambda: 2)
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)
    _decode.run_all([lambda: time.sleep(0.002) for _ in range(8)])  # a helper alive in the parent at fork()
    pid = os.fork()
    if pid == 0:  # the child: the parent's helper does not exist here, and new ones must start
        try:
            done = []
            _decode.run_all([lambda: (time.sleep(0.002), done.append(1)) for _ in range(8)])
            helpers = [t for t in threading.enumerate() if t.name.startswith("emfast-decode-")]
            os._exit(0 if len(done) == 8 and helpers else 1)  # a helper of its own took a share
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("compression", ["raw", "gzip", "zstd", "lz4"])
def test_a_box_s_missing_n5_blocks_written_by_z5py_are_read_in_one_call(tmp_path, monkeypatch, compression):
    z5py = pytest.importorskip("z5py")
    from emfast.io import _n5
    data = random_volume(np.uint16)
    z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=data, chunks=INNER,
                                                                 compression=compression)
    calls = []
    counted = _n5.read_regular_files
    monkeypatch.setattr(_n5, "read_regular_files", lambda paths, *a, **k: calls.append(len(paths)) or
                        counted(paths, *a, **k))
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)
    assert_lazy_equal(tmp_path / "s.n5/raw", data, cache_bytes=40 * 8 * 10 * 6 * 2)  # 40 blocks: evicted, read again
    assert max(calls) > 1
    assert not emfast_threads()


@pytest.mark.parametrize("channels, channel_chunk", [(None, None), (3, 2)])
def test_a_box_s_missing_hdf5_chunks_are_decompressed_side_by_side_and_equal_h5py(tmp_path, monkeypatch, channels,
                                                                                   channel_chunk):
    """gzip + shuffle chunks written by h5py, fetched one after another under HDF5's lock and decompressed in
    parts; a 4-D dataset's channels split over two chunks are both filled."""
    import h5py
    from emfast.io._hdf5 import Hdf5Source
    shape = SHAPE if channels is None else (channels,) + SHAPE
    data = random_volume(np.uint16, shape)
    chunks = INNER if channels is None else (channel_chunk,) + INNER
    with h5py.File(tmp_path / "s.h5", "w") as file:
        file.create_dataset("raw", data=data, chunks=chunks, compression="gzip", shuffle=True)
    batches = []
    many = Hdf5Source._read_many
    monkeypatch.setattr(Hdf5Source, "_read_many", lambda self, requests: batches.append(len(requests)) or
                        many(self, requests))
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 1)
    rng = np.random.default_rng(5)
    with ef.open(tmp_path / "s.h5", "raw", in_memory=False, cache_bytes=40 * 8 * 10 * 6 * 2 * 3) as volume:
        expected = data if channels is not None else data[np.newaxis]
        for corner, extent in random_boxes(rng, count=15):
            out = volume.read_box(corner, extent, np.empty((volume.channels,) + tuple(extent), np.uint16))
            np.testing.assert_array_equal(out, expected[(slice(None),) + tuple(slice(c, c + e)
                                                                               for c, e in zip(corner, extent))])
    assert max(batches) > 1
    assert not emfast_threads()


def test_a_box_s_missing_blocks_are_read_within_the_budget_and_in_steps_where_the_rest_is_pinned(tmp_path,
                                                                                                monkeypatch):
    """Room for a box's missing blocks is made before they are allocated: a full cache of unpinned blocks reads a
    box of 27 new blocks in waves (WAVE_BLOCKS here) and never holds more than its budget; where every held block
    is pinned, the blocks are read one at a time, each adding one block beyond what the pins hold."""
    from emfast.io._chunkcache import WAVE_BLOCKS, ChunkCache
    data = random_volume(np.uint8, (64, 64, 64))
    zarr.create_array(str(tmp_path / "s.zarr"), shape=data.shape, chunks=(8, 8, 8), dtype=np.uint8,
                      compressors=zarr.codecs.ZstdCodec())[...] = data
    block = 8 * 8 * 8
    budget = 64 * block
    peaks, requests = [], []
    allocate = ChunkCache._empty_blocks

    def watched(self, keys):
        blocks = allocate(self, keys)
        peaks.append(self._bytes_held + self._incoming)
        requests.append(len(keys))
        return blocks
    monkeypatch.setattr(ChunkCache, "_empty_blocks", watched)
    with ef.open(tmp_path / "s.zarr", in_memory=False, cache_bytes=budget) as volume:
        cache = volume.chunk_cache
        full = [((0, 0, 0), (32, 32, 16)), ((0, 32, 0), (32, 32, 16))]  # 64 blocks: the budget
        for corner, extent in full:
            volume.read_box(corner, extent, np.empty((1,) + extent, np.uint8))
        assert cache.stats.bytes_held == budget
        peaks.clear()
        requests.clear()
        out = volume.read_box((40, 0, 24), (24, 24, 24), np.empty((1, 24, 24, 24), np.uint8))  # 27 new blocks
        np.testing.assert_array_equal(out[0], data[40:64, 0:24, 24:48])
        assert sum(requests) == 27 and max(requests) == WAVE_BLOCKS  # 64 // 32 blocks would be fewer
        assert max(peaks) <= budget  # room made before each wave: never the budget and the new blocks
        pinned = cache.boxes(*zip(*[((40, 0, 24), (24, 24, 24)), ((0, 0, 0), (32, 32, 16)),
                                    ((0, 32, 0), (24, 32, 16))]))
        cache.pin(pinned)
        assert (cache.grid.pins.flat[list(cache._blocks)] > 0).all()  # every held block pinned
        peaks.clear()
        requests.clear()
        held = cache.stats.bytes_held
        out = volume.read_box((40, 32, 32), (16, 16, 16), np.empty((1, 16, 16, 16), np.uint8))  # 8 new blocks
        np.testing.assert_array_equal(out[0], data[40:56, 32:48, 32:48])
        assert sum(requests) == 8 and max(requests) == 1  # no room: one block at a time
        assert max(peaks) <= held + block * (1 + 7)  # one block beyond what the pins hold before each step
        cache.unpin(pinned)


def test_a_box_s_missing_small_blocks_are_read_in_waves_of_wave_bytes(tmp_path, monkeypatch):
    """Small blocks are read WAVE_BYTES at a time where the budget allows it, not 1/WAVES_PER_BUDGET of it: each
    wave's bookkeeping holds the GIL whatever its size. A wave stays within 1/WAVE_SHARE_MAX of the budget."""
    from emfast.io._chunkcache import WAVE_BYTES, WAVE_SHARE_MAX, WAVES_PER_BUDGET, ChunkCache
    data = random_volume(np.uint8, (40, 160, 320))
    zarr.create_array(str(tmp_path / "s.zarr"), shape=data.shape, chunks=(8, 32, 32), dtype=np.uint8,
                      compressors=zarr.codecs.ZstdCodec())[...] = data
    requests = []
    allocate = ChunkCache._empty_blocks

    def watched(self, keys):
        requests.append(len(keys))
        return allocate(self, keys)
    monkeypatch.setattr(ChunkCache, "_empty_blocks", watched)
    with ef.open(tmp_path / "s.zarr", in_memory=False, cache_bytes=24 << 20) as volume:
        cache = volume.chunk_cache
        wave = min(WAVE_BYTES, cache.blocks_budget // WAVE_SHARE_MAX) // cache.block_bytes
        assert wave > cache.blocks_budget // WAVES_PER_BUDGET // cache.block_bytes  # the case this is about
        out = volume.read_box((0, 0, 0), data.shape, np.empty((1,) + data.shape, np.uint8))  # 250 blocks
        np.testing.assert_array_equal(out[0], data)
    assert sum(requests) == 250 and requests == [wave] * (250 // wave) + ([250 % wave] if 250 % wave else [])


def test_data_addresses_are_those_numpy_gives():
    """The compiled addresses of a wave's blocks are each array's ``ctypes.data``: views at offsets, every dtype
    and strides; anything but an ndarray is refused."""
    from emfast._core.files import data_addresses
    rng = np.random.default_rng(3)
    base = np.empty(1 << 16, np.uint8)
    arrays = [base[int(start):].view(np.uint8)[::int(step)] for start, step in rng.integers(1, 100, (20, 2))]
    arrays += [np.empty((3, 4, 5), dtype)[1:, ::2] for dtype in (np.uint16, np.float32, np.int64)]
    assert data_addresses(arrays).tolist() == [array.ctypes.data for array in arrays]
    assert data_addresses([]).shape == (0,)
    with pytest.raises(TypeError):
        data_addresses([bytearray(4)])


def test_side_by_side_cuts_parts_of_at_most_the_items_asked(monkeypatch):
    """A reader's parts hold at most ``most`` items (its chunks' encoded bytes in one file read), alone or not."""
    monkeypatch.setattr(_decode, "_idle_cores", lambda: 0)
    parts = []
    _decode.SideBySide().run(list(range(10)), parts.append, most=3)
    assert [len(p) for p in parts] == [2, 3, 2, 3] and sorted(i for p in parts for i in p) == list(range(10))


def test_a_warm_read_asks_nothing_of_the_machine(tmp_path, monkeypatch):
    """Boxes whose blocks are all held read no load figures (/proc/loadavg): a warm batch's cache stage stays a
    few compiled loops."""
    data = random_volume(np.uint16)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint16,
                      compressors=zarr.codecs.ZstdCodec())[...] = data
    asked = []
    idle = _decode._idle_cores
    monkeypatch.setattr(_decode, "_idle_cores", lambda: asked.append(1) or idle())
    with ef.open(tmp_path / "s.zarr", in_memory=False) as volume:
        volume.read_box((0, 0, 0), SHAPE, np.empty((1,) + SHAPE, np.uint16))  # cold: every block read
        asked.clear()
        for corner, extent in random_boxes(np.random.default_rng(6), count=10):
            out = volume.read_box(corner, extent, np.empty((1,) + tuple(extent), np.uint16))
            np.testing.assert_array_equal(out[0], data[tuple(slice(c, c + e) for c, e in zip(corner, extent))])
    assert asked == []


def _assert_named_and_the_chunks_around_read(path, data, match, **open_args):
    """A box over the damaged chunk at (8, 10, 6) of ``path`` (uint16, INNER chunks) raises CorruptChunkError
    matching ``match``; a box of the chunks around it reads as ``data``."""
    with ef.open(path, in_memory=False, **open_args) as volume:
        with pytest.raises(CorruptChunkError, match=match):
            volume.read_box((0, 0, 0), (24, 30, 18), np.empty((1, 24, 30, 18), np.uint16))
        out = volume.read_box((0, 0, 0), (8, 20, 18), np.empty((1, 8, 20, 18), np.uint16))
        np.testing.assert_array_equal(out[0], data[:8, :20, :18])


# zstd frames decoded many at a time by the system's libzstd --------------------------------------------------------

def _system_zstd():
    from emfast.io import _zstd
    if not _zstd.system_zstd():
        pytest.skip("no libzstd on this machine: zstd chunks are decoded through numcodecs")
    return _zstd


@pytest.mark.parametrize("level, checksum", [(1, False), (3, True), (19, False)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_system_zstd_decodes_numcodecs_frames_and_refuses_damaged_ones(level, checksum, dtype):
    import numcodecs
    zstd = _system_zstd()
    codec = numcodecs.Zstd(level=level, checksum=checksum)
    chunks = [random_volume(dtype, (8, 10, 6), seed) for seed in range(5)]
    chunks[1] = np.zeros_like(chunks[1])  # compresses to a few bytes
    frames = [codec.encode(chunk) for chunk in chunks]
    damaged = bytearray(frames[2])
    damaged[len(damaged) // 2] ^= 0xFF  # a flipped byte inside the compressed data
    frames[2] = bytes(damaged)
    frames[3] = frames[3][:-5]  # truncated
    outs = [np.empty_like(chunk) for chunk in chunks]
    outs[4] = np.empty((8, 10, 5), dtype)  # another size than the frame's
    decoded = zstd.decode_frames(frames, [out.reshape(-1).view(np.uint8) for out in outs])
    assert decoded.tolist() == [True, True, not checksum and _decodes_anyway(codec, frames[2]), False, False]
    for i in (0, 1):
        np.testing.assert_array_equal(outs[i], chunks[i])


def _decodes_anyway(codec, frame):
    """Whether numcodecs decodes a damaged frame without noticing (no checksum to catch a flipped byte)."""
    try:
        codec.decode(frame)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("zarr_format, shards", [(2, None), (3, None), (3, SHARD)])
def test_zstd_chunks_written_by_zarr_python_read_the_same_with_and_without_libzstd(tmp_path, monkeypatch,
                                                                                   zarr_format, shards):
    zstd = _system_zstd()
    data = random_volume(np.uint16)
    codec = {"id": "zstd", "level": 5, "checksum": True} if zarr_format == 2 else zarr.codecs.ZstdCodec(checksum=True)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, shards=shards, dtype=np.uint16,
                      zarr_format=zarr_format, compressors=codec)[...] = data
    _assert_decoded_together_and_without(monkeypatch, zstd, zstd._LIBZSTD, tmp_path / "s.zarr", data)


def _assert_decoded_together_and_without(monkeypatch, module, library, store, data, **options):
    """``store`` reads as ``data`` (opened with ``options``) with a box's whole chunks decoded in one call of
    ``module.decode_frames`` (or, for the files of a plain zarr array, read and decoded in one call of
    ``read_decode_files``), then the same where its library is missing (``library`` found none: numcodecs
    decodes)."""
    frames = []
    counted, fused = module.decode_frames, _filebatch.read_decode_files
    monkeypatch.setattr(module, "decode_frames", lambda sources, outs: frames.append(len(sources)) or
                        counted(sources, outs))
    monkeypatch.setattr(_filebatch, "read_decode_files", lambda codec, paths, *rest:
                        frames.append(len(paths) if codec == library.codec else 0) or fused(codec, paths, *rest))
    assert_lazy_equal(store, data, cache_bytes=40 * 8 * 10 * 6 * 2, **options)
    assert max(frames) > 1  # a box's whole chunks in one call
    monkeypatch.setattr(library, "_library", False)  # as on a machine without the library
    assert_lazy_equal(store, data, cache_bytes=40 * 8 * 10 * 6 * 2, **options)


def test_a_damaged_zstd_chunk_is_named_after_libzstd_refused_it(tmp_path):
    _system_zstd()
    data = random_volume(np.uint16)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint16,
                      compressors=zarr.codecs.ZstdCodec(checksum=True))[...] = data
    chunk = tmp_path / "s.zarr/c/1/1/1"
    damaged = bytearray(chunk.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    chunk.write_bytes(bytes(damaged))
    _assert_named_and_the_chunks_around_read(tmp_path / "s.zarr", data, r"s\.zarr: cannot decode chunk c/1/1/1")


# blosc frames decoded many at a time by c-blosc's own decoder ------------------------------------------------------

def _native_blosc():
    from emfast.io import _blosc
    if not _blosc.native_blosc():
        pytest.skip("no c-blosc 1.16 or later found: blosc chunks are decoded through numcodecs")
    return _blosc


@pytest.mark.parametrize("cname, shuffle", [("lz4", 1), ("zstd", 2), ("blosclz", 0), ("zlib", 1)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_native_blosc_decodes_numcodecs_frames_and_refuses_damaged_ones(cname, shuffle, dtype):
    import numcodecs
    blosc = _native_blosc()
    codec = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle)
    chunks = [random_volume(dtype, (8, 10, 6), seed) for seed in range(6)]
    chunks[1] = np.zeros_like(chunks[1])  # compresses to a few bytes
    chunks[5] = (chunks[5] // 64).astype(dtype)  # compresses, without being constant
    frames = [codec.encode(chunk) for chunk in chunks]
    damaged = bytearray(frames[2])
    damaged[len(damaged) // 2] ^= 0xFF  # a flipped byte inside the compressed data
    frames[2] = bytes(damaged)
    frames[3] = frames[3][:-5]  # truncated: the header's size is no longer the frame's
    outs = [np.empty_like(chunk) for chunk in chunks]
    outs[4] = np.empty((8, 10, 5), dtype)  # another size than the frame's
    decoded = blosc.decode_frames(frames, [out.reshape(-1).view(np.uint8) for out in outs])
    assert decoded.tolist() == [True, True, _decodes_anyway(codec, frames[2]), False, False, True]
    for i in (0, 1, 5):
        np.testing.assert_array_equal(outs[i], chunks[i])
    if decoded[2]:  # c-blosc noticed nothing, as numcodecs does not: both decode the same bytes
        np.testing.assert_array_equal(outs[2].reshape(-1).view(np.uint8), np.frombuffer(codec.decode(frames[2]),
                                                                                         np.uint8))


@pytest.mark.parametrize("zarr_format, shards", [(2, None), (3, None), (3, SHARD)])
def test_blosc_chunks_written_by_zarr_python_read_the_same_with_and_without_native_blosc(tmp_path, monkeypatch,
                                                                                         zarr_format, shards):
    blosc = _native_blosc()
    data = random_volume(np.uint16)
    data[:8] //= 256  # some chunks compress
    codec = {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2} if zarr_format == 2 else \
        zarr.codecs.BloscCodec(cname="lz4", shuffle="bitshuffle")
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, shards=shards, dtype=np.uint16,
                      zarr_format=zarr_format, compressors=codec)[...] = data
    _assert_decoded_together_and_without(monkeypatch, blosc, blosc._CBLOSC, tmp_path / "s.zarr", data)


@pytest.mark.parametrize("native", [True, False])
def test_a_truncated_blosc_chunk_is_named_not_decoded_past_its_end(tmp_path, monkeypatch, native):
    blosc = _native_blosc()
    if not native:  # numcodecs alone decodes a truncated frame without an error: emfast checks its length itself
        monkeypatch.setattr(blosc._CBLOSC, "_library", False)
    data = random_volume(np.uint16)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint16, zarr_format=2,
                      compressors={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1})[...] = data
    chunk = tmp_path / "s.zarr/1.1.1"
    chunk.write_bytes(chunk.read_bytes()[:-7])
    _assert_named_and_the_chunks_around_read(tmp_path / "s.zarr", data, r"s\.zarr: cannot decode chunk 1\.1\.1")


# gzip and zlib streams inflated many at a time by the system's libdeflate ------------------------------------------

def _system_deflate():
    from emfast.io import _deflate
    if not _deflate.system_deflate():
        pytest.skip("no libdeflate on this machine: gzip and zlib chunks are inflated through zlib")
    return _deflate


@pytest.mark.parametrize("wrap", ["gzip", "zlib", "numcodecs GZip", "numcodecs Zlib"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_system_deflate_inflates_gzip_and_zlib_and_refuses_damaged_ones(wrap, dtype):
    import gzip
    import zlib
    import numcodecs
    deflate = _system_deflate()
    encode = {"gzip": lambda data: gzip.compress(data, 6), "zlib": lambda data: zlib.compress(data, 1),
              "numcodecs GZip": numcodecs.GZip(level=9).encode, "numcodecs Zlib": numcodecs.Zlib(level=5).encode}[wrap]
    chunks = [random_volume(dtype, (8, 10, 6), seed) for seed in range(6)]
    chunks[1] = np.zeros_like(chunks[1])  # compresses to a few bytes
    frames = [bytes(encode(chunk.tobytes())) for chunk in chunks]
    damaged = bytearray(frames[2])
    damaged[len(damaged) // 2] ^= 0xFF  # a flipped byte: gzip's crc32 or zlib's adler32 no longer agrees
    frames[2] = bytes(damaged)
    frames[3] = frames[3][:-5]  # truncated
    frames[5] = frames[5] + frames[5]  # two streams back to back: the general path decides what they are
    outs = [np.empty_like(chunk) for chunk in chunks]
    outs[4] = np.empty((8, 10, 5), dtype)  # another size than the stream's
    decoded = deflate.decode_frames(frames, [out.reshape(-1).view(np.uint8) for out in outs])
    assert decoded.tolist() == [True, True, False, False, False, False]
    for i in (0, 1):
        np.testing.assert_array_equal(outs[i], chunks[i])


@pytest.mark.parametrize("codec", ["zstd", "deflate"])
def test_a_thread_s_kept_decoder_decodes_exactly_after_damaged_frames_and_beside_other_threads(codec):
    """Each thread keeps its decoding context for its next calls: a context that refused damaged and truncated
    frames decodes the next good ones exactly, and threads decoding at once each use their own."""
    import numcodecs
    module = _system_zstd() if codec == "zstd" else _system_deflate()
    encoder = numcodecs.Zstd(level=3, checksum=True) if codec == "zstd" else numcodecs.GZip(level=6)
    chunks = [random_volume(np.uint16, (8, 10, 6), seed) for seed in range(8)]
    frames = [bytes(encoder.encode(chunk)) for chunk in chunks]
    damaged = bytearray(frames[0])
    damaged[len(damaged) // 2] ^= 0xFF

    def decode(indices, broken=()):
        outs = [np.empty_like(chunks[i]) for i in indices]
        done = module.decode_frames(list(broken) + [frames[i] for i in indices],
                                    [np.empty(chunks[0].nbytes, np.uint8) for _ in broken] +
                                    [out.reshape(-1).view(np.uint8) for out in outs])
        assert done.tolist() == [False] * len(broken) + [True] * len(indices)
        return outs

    decode([], broken=[bytes(damaged), frames[1][:-7]])  # fails mid-frame: the kept context is left mid-stream
    for outs, indices in ((decode([0, 1]), [0, 1]), (decode([2]), [2])):
        for out, i in zip(outs, indices):
            np.testing.assert_array_equal(out, chunks[i])
    results = {}

    def run(n):
        for _ in range(20):
            results[n] = decode(list(range(8)))
    assert errors_on_threads(run, 4) == []
    for outs in results.values():
        for out, chunk in zip(outs, chunks):
            np.testing.assert_array_equal(out, chunk)


@pytest.mark.parametrize("codec, zarr_format, shards", [({"id": "gzip", "level": 5}, 2, None),
                                                        ({"id": "zlib"}, 2, None), ("gzip", 3, None),
                                                        ("gzip", 3, SHARD)])
def test_gzip_chunks_written_by_zarr_python_read_the_same_with_and_without_libdeflate(tmp_path, monkeypatch, codec,
                                                                                      zarr_format, shards):
    deflate = _system_deflate()
    data = random_volume(np.uint16)
    data[:8] //= 256  # some chunks compress
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, shards=shards, dtype=np.uint16,
                      zarr_format=zarr_format,
                      compressors=zarr.codecs.GzipCodec(level=6) if codec == "gzip" else codec)[...] = data
    _assert_decoded_together_and_without(monkeypatch, deflate, deflate._LIBDEFLATE, tmp_path / "s.zarr", data)


@pytest.mark.parametrize("writer", ["z5py", "tensorstore"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_gzip_n5_blocks_read_the_same_with_and_without_libdeflate(tmp_path, monkeypatch, writer, dtype):
    """N5's big-endian values inflated straight into the blocks, then swapped; edge blocks clipped (z5py) or whole
    (tensorstore), which the general path reads."""
    deflate = _system_deflate()
    data = random_volume(dtype)
    if writer == "z5py":
        z5py = pytest.importorskip("z5py")
        z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=data, chunks=INNER,
                                                                     compression="gzip")
    else:
        ts = pytest.importorskip("tensorstore")
        ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path / "s.n5/raw")},
                 "metadata": {"dimensions": list(reversed(SHAPE)), "blockSize": list(reversed(INNER)),
                              "dataType": np.dtype(dtype).name, "compression": {"type": "gzip"}},
                 "create": True}).result()[...] = data.T
    _assert_decoded_together_and_without(monkeypatch, deflate, deflate._LIBDEFLATE, tmp_path / "s.n5/raw", data)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_gzip_precomputed_chunks_of_cloud_volume_read_the_same_with_and_without_libdeflate(tmp_path, monkeypatch,
                                                                                          dtype):
    """cloud-volume's default compression: every chunk file a .gz; one never written reads as zeros."""
    cloudvolume = pytest.importorskip("cloudvolume")
    deflate = _system_deflate()
    data = random_volume(dtype)
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=1, layer_type="image", data_type=np.dtype(dtype).name, encoding="raw", resolution=[4, 4, 40],
        voxel_offset=[3, 5, 7], chunk_size=list(INNER[::-1]), volume_size=list(data.shape[::-1]))
    volume = cloudvolume.CloudVolume(f"file://{tmp_path / 'pc'}", info=info, compress="gzip", progress=False)
    volume.commit_info()
    volume[3:3 + data.shape[2], 5:5 + data.shape[1], 7:7 + data.shape[0]] = data.T
    assert (tmp_path / "pc/4_4_40/3-9_5-15_7-15.gz").exists()
    os.remove(tmp_path / "pc/4_4_40/3-9_5-15_7-15.gz")
    data[:8, :10, :6] = 0
    _assert_decoded_together_and_without(monkeypatch, deflate, deflate._LIBDEFLATE, tmp_path / "pc", data,
                                         format="precomputed")


def test_a_damaged_gzip_n5_block_is_named_after_libdeflate_refused_it(tmp_path):
    z5py = pytest.importorskip("z5py")
    _system_deflate()
    data = random_volume(np.uint16)
    z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=data, chunks=INNER, compression="gzip")
    block = tmp_path / "s.n5/raw/1/1/1"
    damaged = bytearray(block.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    block.write_bytes(bytes(damaged))
    _assert_named_and_the_chunks_around_read(tmp_path / "s.n5/raw", data,
                                             r"block 1/1/1 is corrupt: cannot decompress it")


@pytest.mark.parametrize("dtype, shuffle", [(np.uint8, False), (np.uint16, True), (np.float32, True),
                                            (np.uint16, False)])
def test_gzip_hdf5_chunks_written_by_h5py_read_the_same_with_and_without_libdeflate(tmp_path, monkeypatch, dtype,
                                                                                   shuffle):
    import h5py
    deflate = _system_deflate()
    data = random_volume(dtype)
    with h5py.File(tmp_path / "s.h5", "w") as file:
        file.create_dataset("raw", data=data, chunks=INNER, compression="gzip", shuffle=shuffle)
    inflated = []
    counted = deflate.decode_frames
    monkeypatch.setattr(deflate, "decode_frames", lambda frames, outs: inflated.append(counted(frames, outs)) or
                        inflated[-1])
    assert_lazy_equal(tmp_path / "s.h5", data, dataset="raw")
    assert inflated and all(decoded.all() for decoded in inflated)
    monkeypatch.setattr(deflate._LIBDEFLATE, "_library", False)  # as on a machine without libdeflate: zlib
    assert_lazy_equal(tmp_path / "s.h5", data, dataset="raw")


@pytest.mark.parametrize("with_libdeflate", [True, False])
def test_a_damaged_gzip_hdf5_chunk_is_named_with_and_without_libdeflate(tmp_path, monkeypatch, with_libdeflate):
    import h5py
    deflate = _system_deflate()
    if not with_libdeflate:
        monkeypatch.setattr(deflate._LIBDEFLATE, "_library", False)
    data = random_volume(np.uint16)
    with h5py.File(tmp_path / "s.h5", "w") as file:
        dataset = file.create_dataset("raw", data=data, chunks=INNER, compression="gzip", shuffle=True)
        info = dataset.id.get_chunk_info_by_coord((8, 10, 6))
    with open(tmp_path / "s.h5", "r+b") as file:  # a flipped byte inside the chunk's deflate stream
        file.seek(info.byte_offset + info.size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    _assert_named_and_the_chunks_around_read(tmp_path / "s.h5", data, r"cannot decompress the chunk at \(8, 10, 6\)",
                                             dataset="raw")


@pytest.mark.parametrize("module, switch, found", [("_zstd", "EMFAST_SYSTEM_ZSTD", "system_zstd"),
                                                   ("_blosc", "EMFAST_NATIVE_BLOSC", "native_blosc"),
                                                   ("_deflate", "EMFAST_SYSTEM_DEFLATE", "system_deflate")])
def test_each_compiled_decoder_is_turned_off_by_its_environment_variable(module, switch, found):
    """With the variable at 0, no library is looked for and every frame is left to the general decoders."""
    script = (f"import os; os.environ[{switch!r}] = '0'\n"
              f"from emfast.io import {module} as codec\n"
              f"assert not codec.{found}() and codec.decode_frames([b'x'], [bytearray(1)]) is None\n")
    import subprocess
    import sys
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_the_compiled_decoder_refuses_a_codec_it_does_not_know():
    from emfast._core.files import decode_frames
    with pytest.raises(ValueError, match="codec must be one of zstd, blosc, deflate, got 'lz4'"):
        decode_frames("lz4", [], [])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_gzip_n5_blocks_read_alone_are_inflated_by_libdeflate_too(tmp_path, monkeypatch, dtype):
    """In-memory opens and edge blocks written whole (tensorstore) read block by block: libdeflate inflates them,
    zlib where it is missing, to the same values."""
    ts = pytest.importorskip("tensorstore")
    deflate = _system_deflate()
    data = random_volume(dtype)
    ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(tmp_path / "s.n5/raw")},
             "metadata": {"dimensions": list(reversed(SHAPE)), "blockSize": list(reversed(INNER)),
                          "dataType": np.dtype(dtype).name, "compression": {"type": "gzip", "useZlib": True}},
             "create": True}).result()[...] = data.T
    inflated = []
    inflate = deflate.inflate
    monkeypatch.setattr(deflate, "inflate", lambda stream, size: inflated.append(inflate(stream, size)) or
                        inflated[-1])
    np.testing.assert_array_equal(np.asarray(ef.open(tmp_path / "s.n5/raw"))[0], data)
    assert inflated and all(block is not None for block in inflated)
    monkeypatch.setattr(deflate._LIBDEFLATE, "_library", False)
    np.testing.assert_array_equal(np.asarray(ef.open(tmp_path / "s.n5/raw"))[0], data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_the_compiled_decoders_bound_in_a_parent_decode_in_a_forked_child():
    """A torch DataLoader worker is a forked child: the libraries found and bound before fork() serve it."""
    import gzip
    import numcodecs
    from emfast.io import _blosc, _deflate, _zstd
    chunk = random_volume(np.uint16, (8, 10, 6))
    frames = {_zstd: numcodecs.Zstd().encode(chunk), _blosc: numcodecs.Blosc().encode(chunk),
              _deflate: gzip.compress(chunk.tobytes())}
    usable = [module for module in frames if module.decode_frames([frames[module]], [np.empty_like(chunk)])
              is not None]  # found and bound here, in the parent
    if not usable:
        pytest.skip("none of libzstd, c-blosc and libdeflate on this machine")
    pid = os.fork()
    if pid == 0:
        try:
            for module in usable:
                out = np.empty_like(chunk)
                assert module.decode_frames([frames[module]], [out]).all() and np.array_equal(out, chunk)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# whole volumes: in-memory opens and np.asarray of lazy volumes -----------------------------------------------------

def _write_whole_case(tmp_path, case, data):
    """The store of one whole-read case and the options to open it with."""
    if case in ("zarr v2 blosc", "zarr v3 zstd", "zarr sharded"):
        compressors = {"id": "blosc", "cname": "lz4"} if case == "zarr v2 blosc" else zarr.codecs.ZstdCodec()
        zarr.create_array(str(tmp_path / "s.zarr"), shape=data.shape, dtype=data.dtype,
                          chunks=INNER if data.ndim == 3 else (data.shape[0],) + INNER,
                          shards=(SHARD if data.ndim == 3 else (data.shape[0],) + SHARD) if case == "zarr sharded"
                          else None, zarr_format=2 if case == "zarr v2 blosc" else 3,
                          compressors=compressors)[...] = data
        return tmp_path / "s.zarr", {}
    if case == "n5 gzip":
        z5py = pytest.importorskip("z5py")
        z5py.File(str(tmp_path / "s.n5"), mode="a").create_dataset("raw", data=data, chunks=INNER,
                                                                     compression="gzip")
        return tmp_path / "s.n5/raw", {}
    import h5py
    with h5py.File(tmp_path / "s.h5", "w") as file:
        file.create_dataset("raw", data=data, chunks=INNER, compression="gzip" if case == "hdf5 gzip" else None)
    return tmp_path / "s.h5", {"dataset": "raw"}


@pytest.mark.parametrize("case, by_chunks", [("zarr v2 blosc", True), ("zarr v3 zstd", True), ("zarr sharded", True),
                                             ("n5 gzip", True), ("hdf5 gzip", True), ("hdf5 raw", False)])
def test_a_whole_volume_reads_by_waves_of_chunks_where_that_is_faster(tmp_path, monkeypatch, case, by_chunks):
    """In-memory opens and np.asarray of a lazy volume read chunk by chunk through the source's read_many (small
    waves here: chunk buffers reused from one wave to the next, edge chunks of every size) where the store's
    library reads a whole array more slowly, else in one read; the same values either way."""
    from emfast.io import _whole
    data = random_volume(np.uint16)
    path, options = _write_whole_case(tmp_path, case, data)
    monkeypatch.setattr(_whole, "WAVE_BYTES", 5 * 8 * 10 * 6 * 2)  # five chunks a wave
    waves = []
    read_whole = _whole.read_whole

    class Counted:  # the source, its read_many counting the chunks of each wave
        def __init__(self, source):
            self._source = source

        def __getattr__(self, name):
            return getattr(self._source, name)

        @property
        def read_many(self):
            many = self._source.read_many
            return None if many is None else lambda requests: waves.append(len(requests)) or many(requests)

    def counted(source, out):
        return read_whole(Counted(source), out)

    monkeypatch.setattr(_whole, "read_whole", counted)
    from emfast.io import _volume
    monkeypatch.setattr(_volume, "read_whole", counted)
    np.testing.assert_array_equal(np.asarray(ef.open(path, **options))[0], data)
    with ef.open(path, in_memory=False, **options) as volume:
        np.testing.assert_array_equal(np.asarray(volume)[0], data)
    chunks = math.prod(-(-s // c) for s, c in zip(SHAPE, INNER))
    assert sum(waves) == (2 * chunks if by_chunks else 0) and (not waves or max(waves) == 5)


@pytest.mark.parametrize("compress", [False, "gzip"])
def test_raw_precomputed_reads_whole_by_chunks_plain_or_gzipped(tmp_path, compress):
    """cloud-volume's chunk files, one of them never written (zeros), in memory and through np.asarray."""
    cloudvolume = pytest.importorskip("cloudvolume")
    data = random_volume(np.uint16)
    info = cloudvolume.CloudVolume.create_new_info(
        num_channels=1, layer_type="image", data_type="uint16", encoding="raw", resolution=[4, 4, 40],
        voxel_offset=[3, 5, 7], chunk_size=list(INNER[::-1]), volume_size=list(data.shape[::-1]))
    volume = cloudvolume.CloudVolume(f"file://{tmp_path / 'pc'}", info=info, compress=compress, progress=False)
    volume.commit_info()
    volume[3:3 + data.shape[2], 5:5 + data.shape[1], 7:7 + data.shape[0]] = data.T
    os.remove(tmp_path / ("pc/4_4_40/3-9_5-15_7-15" + (".gz" if compress else "")))
    data[:8, :10, :6] = 0
    with ef.open(tmp_path / "pc", in_memory=False, format="precomputed") as lazy:
        assert lazy._reader.whole_by_chunks
        np.testing.assert_array_equal(np.asarray(lazy)[0], data)
    np.testing.assert_array_equal(np.asarray(ef.open(tmp_path / "pc", format="precomputed"))[0], data)


def test_a_four_d_zarr_array_reads_whole_by_chunks_only_with_its_channels_in_one_chunk(tmp_path):
    data = random_volume(np.uint16, (3,) + SHAPE)
    for name, channel_chunk in (("together", 3), ("split", 1)):
        zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=data.shape, chunks=(channel_chunk,) + INNER,
                          dtype=data.dtype, compressors=zarr.codecs.ZstdCodec())[...] = data
        with ef.open(tmp_path / f"{name}.zarr", in_memory=False) as volume:
            assert volume._reader.whole_by_chunks == (channel_chunk == 3)
            np.testing.assert_array_equal(np.asarray(volume), data)
        np.testing.assert_array_equal(np.asarray(ef.open(tmp_path / f"{name}.zarr")), data)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_whole_zarr_volume_read_by_chunks_fills_chunks_never_written(tmp_path, zarr_format):
    data = random_volume(np.uint16)
    zarr.create_array(str(tmp_path / "s.zarr"), shape=SHAPE, chunks=INNER, dtype=np.uint16, fill_value=7,
                      zarr_format=zarr_format, compressors={"id": "zstd"} if zarr_format == 2 else
                      zarr.codecs.ZstdCodec())[...] = data
    os.remove(tmp_path / ("s.zarr/1.1.1" if zarr_format == 2 else "s.zarr/c/1/1/1"))
    data[8:16, 10:20, 6:12] = 7
    np.testing.assert_array_equal(np.asarray(ef.open(tmp_path / "s.zarr"))[0], data)


def test_never_written_hdf5_chunks_read_as_the_fill_value_after_hdf5_read_them_itself(tmp_path):
    """Once HDF5 had read a dataset's never-written chunks (h5py, or emfast's in-memory open, in the same
    process), read_direct_chunk raised OSError ("chunk address isn't defined") instead of RuntimeError, and
    lazy reads of those chunks failed."""
    with h5py.File(tmp_path / "part.h5", "w") as f:
        f.create_dataset("raw", shape=(64, 64, 64), dtype=np.uint8, chunks=(32, 32, 32))[:32, :32, :32] = 7
    lazy = ef.hdf5(tmp_path / "part.h5", "raw", in_memory=False)
    with h5py.File(tmp_path / "part.h5", "r") as f:
        whole = f["raw"][()]
    out = np.empty((1, 32, 32, 32), np.uint8)
    lazy.read_box((32, 32, 32), (32, 32, 32), out)
    np.testing.assert_array_equal(out[0], whole[32:, 32:, 32:])
    lazy.close()


def test_hdf5_chunks_deflated_then_shuffled_read_as_h5py_reads_them(tmp_path):
    """The HDF5 C API allows the filters in either order; shuffled after deflate, a chunk's compressed bytes
    are seldom a multiple of the item size, and HDF5 leaves the last ones as they are (emfast raised "cannot
    reshape array")."""
    data = np.random.default_rng(3).integers(0, 1000, (16, 32, 32), dtype=np.uint16)
    with h5py.File(tmp_path / "ds.h5", "w") as f:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_chunk((8, 16, 16))
        plist.set_deflate(4)
        plist.set_shuffle()
        space = h5py.h5s.create_simple(data.shape)
        dataset = h5py.Dataset(h5py.h5d.create(f.id, b"raw", h5py.h5t.NATIVE_UINT16, space, dcpl=plist))
        dataset[...] = data
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        sizes = [len(dataset.id.read_direct_chunk(corner)[1]) % 2
                 for corner in np.ndindex(2, 2, 2) for corner in [tuple(c * s for c, s in zip(corner, (8, 16, 16)))]]
    assert filters == [h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE] and 1 in sizes  # some odd
    for in_memory in (True, False):
        volume = ef.hdf5(tmp_path / "ds.h5", "raw", in_memory=in_memory)
        out = np.empty((1,) + data.shape, data.dtype)
        volume.read_box((0, 0, 0), data.shape, out)
        np.testing.assert_array_equal(out[0], data)
        volume.close()
