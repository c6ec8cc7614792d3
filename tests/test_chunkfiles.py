"""The outputs' own chunk writer (io/_chunkfiles.py) writes the files zarr-python writes, byte for byte, for every
layout emfast creates, reads back in zarr-python and tensorstore, and leaves other layouts to zarr-python."""
import gzip
import os

import numpy as np
import pytest

from emfast.io._chunkfiles import chunk_files
from emfast.io._writer import COMPRESSIONS, OutputWriter, zarr_compressor

zarr = pytest.importorskip("zarr")

SHAPE, CHUNKS = (2, 20, 40, 36), (2, 8, 16, 16)  # edges cut on every spatial axis


def chunk_bytes(folder):
    """Every chunk file under ``folder``, by its path relative to it (metadata left out)."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if name not in ("zarr.json", ".zarray", ".zattrs", ".zgroup"):
                path = os.path.join(root, name)
                files[os.path.relpath(path, folder)] = open(path, "rb").read()
    return files


def new_array(path, zarr_format, compression, dtype="float32", fill_value=0):
    root = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    return root.create_array("p", shape=SHAPE, chunks=CHUNKS, dtype=dtype, fill_value=fill_value,
                             compressors=zarr_compressor(compression, zarr_format, zarr))


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("dtype", ["float32", "uint8", "uint64"])
def test_chunk_files_are_the_bytes_zarr_writes(tmp_path, zarr_format, compression, dtype):
    rng = np.random.default_rng(zarr_format)
    data = (rng.random(SHAPE) * 200).astype(dtype)
    data[:, :8, :16, :16] = 0  # a chunk of only the fill value is written too (zarr would skip it)
    theirs = new_array(tmp_path / "theirs.zarr", zarr_format, compression, dtype)
    theirs[...] = data
    ours_array = new_array(tmp_path / "ours.zarr", zarr_format, compression, dtype)
    files = chunk_files(ours_array)
    assert files is not None
    files.write((0, 0, 0, 0), data)
    mine, zarrs = chunk_bytes(tmp_path / "ours.zarr/p"), chunk_bytes(tmp_path / "theirs.zarr/p")
    empty = "c/0/0/0/0" if zarr_format == 3 else "0.0.0.0"
    assert set(mine) == set(zarrs) | {empty}
    for key in zarrs:
        if compression == "gzip":  # a gzip header holds the time it was written
            assert gzip.decompress(mine[key]) == gzip.decompress(zarrs[key]), key
            assert mine[key][:4] == zarrs[key][:4] and mine[key][8:] == zarrs[key][8:], key
        else:
            assert mine[key] == zarrs[key], key
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "ours.zarr"), path="p", mode="r")[...], data)
    assert not list((tmp_path / "ours.zarr").rglob("*.partial"))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_chunk_files_read_back_in_tensorstore_box_by_box(tmp_path, zarr_format):
    ts = pytest.importorskip("tensorstore")
    data = np.random.default_rng(3).random(SHAPE).astype(np.float32)
    array = new_array(tmp_path / "out.zarr", zarr_format, "zstd")
    files = chunk_files(array)
    for z in (0, 8, 16):  # boxes of whole chunks, the last cut by the array's end
        box = (slice(None), slice(z, z + 8))
        assert files.covers((0, z, 0, 0), data[box].shape)
        files.write((0, z, 0, 0), data[box])
    driver = "zarr3" if zarr_format == 3 else "zarr"
    store = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(tmp_path / "out.zarr/p")}},
                    open=True).result()
    np.testing.assert_array_equal(store.read().result(), data)


def test_a_box_of_partial_chunks_is_not_covered(tmp_path):
    files = chunk_files(new_array(tmp_path / "out.zarr", 3, "zstd"))
    assert files.covers((0, 0, 0, 0), (2, 8, 16, 16))
    assert files.covers((0, 16, 32, 32), (2, 4, 8, 4))  # cut by the array's end
    assert not files.covers((0, 4, 0, 0), (2, 8, 16, 16))  # starts inside a chunk
    assert not files.covers((0, 0, 0, 0), (2, 8, 16, 8))  # ends inside a chunk


def test_other_layouts_are_left_to_zarr(tmp_path):
    root = zarr.open_group(str(tmp_path / "out.zarr"), mode="w", zarr_format=3)
    sharded = root.create_array("sharded", shape=SHAPE, chunks=CHUNKS, shards=(2, 16, 32, 32), dtype="float32")
    assert chunk_files(sharded) is None
    big_endian = root.create_array("big", shape=SHAPE, chunks=CHUNKS, dtype=">f4",
                                   serializer=zarr.codecs.BytesCodec(endian="big"))
    assert chunk_files(big_endian) is None
    v2 = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    fortran = v2.create_array("f", shape=SHAPE, chunks=CHUNKS, dtype="float32", order="F")
    assert chunk_files(fortran) is None


def test_the_writer_writes_unaligned_boxes_through_zarr(tmp_path):
    """A box that is not whole chunks (convert's tiles may be) goes through zarr-python and lands the same."""
    writer = OutputWriter(tmp_path / "out.zarr", "p", "zarr", "emfast_test").open()
    writer.create(shape=SHAPE, dtype="float32", chunks=CHUNKS[1:], compression="zstd")
    data = np.random.default_rng(5).random(SHAPE).astype(np.float32)
    writer.write((0, 0, 0), data[:, :8, :16, :16])  # whole chunk: own writer
    writer.write((4, 0, 0), data[:, 4:12, :16, :16])  # unaligned: zarr, over a chunk written by the other
    writer.write((12, 0, 0), data[:, 12:, :, :])  # unaligned start along z
    writer.write((0, 0, 16), data[:, :12, :, 16:])
    writer.write((0, 16, 0), data[:, :12, 16:, :20])
    writer.close()
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"), path="p", mode="r")[...], data)


def test_a_failed_chunk_write_raises_and_leaves_no_partial_file(tmp_path, monkeypatch):
    files = chunk_files(new_array(tmp_path / "out.zarr", 3, "zstd"))
    data = np.ones(SHAPE, np.float32)
    real_replace = os.replace

    def full_disk(source, target):
        if "c/0/1/" in str(target).replace(os.sep, "/"):
            raise OSError(28, "No space left on device")
        return real_replace(source, target)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        files.write((0, 0, 0, 0), data)
    assert not list((tmp_path / "out.zarr").rglob("*.partial"))


def test_a_box_is_encoded_on_half_the_cores(tmp_path, monkeypatch):
    """On a machine of 16 cores a box's chunks are encoded on 8 threads (a slow compressor must not keep a fast
    network waiting), and the files are still zarr's, each written once."""
    import threading

    from emfast.io import _chunkfiles

    monkeypatch.setattr(_chunkfiles, "cores", lambda: 16)
    data = np.random.default_rng(7).random(SHAPE).astype(np.float32)
    theirs = new_array(tmp_path / "theirs.zarr", 3, "zstd")
    theirs[...] = data
    files = chunk_files(new_array(tmp_path / "ours.zarr", 3, "zstd"))
    encoded, real_encode, lock = [], files.compressor.encode, threading.Lock()
    together = threading.Barrier(8, timeout=10)  # each thread's first chunk waits for the other seven's

    def encode(chunk):
        with lock:
            first = threading.get_ident() not in encoded
            encoded.append(threading.get_ident())
        if first:
            together.wait()
        return real_encode(chunk)

    monkeypatch.setattr(files.compressor, "encode", encode)
    files.write((0, 0, 0, 0), data)
    assert len(encoded) == 27 and len(set(encoded)) == 8  # 3 x 3 x 3 chunks
    assert chunk_bytes(tmp_path / "ours.zarr/p") == chunk_bytes(tmp_path / "theirs.zarr/p")


def test_boxes_written_at_once_share_the_encoding_pool_chunk_by_chunk(tmp_path, monkeypatch):
    """Given a pool, each chunk is a task of its own: while one of the pool's threads is held on the first chunk
    of one box, the other encodes every other chunk of both boxes (a box split in fixed shares would wait for the
    held thread); the files are zarr's."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    data = np.random.default_rng(8).random(SHAPE).astype(np.float32)
    theirs = new_array(tmp_path / "theirs.zarr", 3, "zstd")
    theirs[...] = data
    files = chunk_files(new_array(tmp_path / "ours.zarr", 3, "zstd"))
    real_encode, lock, threads = files.compressor.encode, threading.Lock(), []
    others_done, held = threading.Event(), []

    def encode(chunk):
        with lock:
            threads.append(threading.current_thread().name)
            first = not held
            held.append(True)
            if len(threads) == 2 * 9:
                others_done.set()
        if first:  # released once every other chunk is encoded
            assert others_done.wait(10)
        return real_encode(chunk)

    monkeypatch.setattr(files.compressor, "encode", encode)
    half = CHUNKS[1]  # z 0..8 and 8..16: 9 chunks each
    with ThreadPoolExecutor(2, thread_name_prefix="encode") as pool, \
            ThreadPoolExecutor(2, thread_name_prefix="writer") as writers:
        boxes = [writers.submit(files.write, (0, z, 0, 0), data[:, z:z + half], pool) for z in (0, half)]
        for box in boxes:
            box.result(timeout=20)
    files.write((0, 16, 0, 0), data[:, 16:])  # the rest, on threads of its own
    assert len(threads) == 27 and all(name.startswith("encode") for name in threads[:18])
    assert chunk_bytes(tmp_path / "ours.zarr/p") == chunk_bytes(tmp_path / "theirs.zarr/p")


def test_a_failed_chunk_on_the_pool_raises_once_every_chunk_of_the_box_ended(tmp_path, monkeypatch):
    """No chunk of a box is written after its write raised: its error waits for the box's other tasks."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    files = chunk_files(new_array(tmp_path / "out.zarr", 3, "zstd"))
    data = np.ones(SHAPE, np.float32)
    real_replace, written = os.replace, []

    def full_disk(source, target):
        if "c/0/0/0/0" in str(target).replace(os.sep, "/"):
            raise OSError(28, "No space left on device")
        time.sleep(0.01)  # the others still being written when the first fails
        real_replace(source, target)
        written.append(target)

    monkeypatch.setattr(os, "replace", full_disk)
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(OSError, match="No space left"):
            files.write((0, 0, 0, 0), data, pool)
        count = len(written)
    assert count == 26 == len(written)
    assert not list((tmp_path / "out.zarr").rglob("*.partial"))
