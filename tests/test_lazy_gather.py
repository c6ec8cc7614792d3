"""Lazy windows gathered in place from the chunk cache: bit-exact against in-memory windows for every transform,
chunk layout, dtype and thread count, with the blocks pinned while a kernel reads them and no Python work per
block once they are cached."""
import itertools
import threading
import time
import types

import numpy as np
import pytest
import zarr

import emfast as ef
from emfast._core.gather import (ChunkGrid, gather_chunked_convert, gather_chunked_copy, gather_convert,
                                 gather_copy)
from emfast.io import VolumeTooLargeError
from reference import assert_releases_gil, extent_of, random_corner, random_volume
from threads import emfast_threads, errors_on_threads, threads_end

TRANSFORMS = [(perm, flips) for perm in itertools.permutations(range(3))
              for flips in itertools.product((False, True), repeat=3)]
SHAPE = (19, 37, 45)
# cubic, per-section, not dividing the volume along any axis, a single chunk, thin rods
CHUNKS = [(4, 8, 8), (1, 37, 45), (5, 16, 7), (19, 37, 45), (3, 2, 45)]


def held_blocks(volume, chunk):
    """The grid of addresses of the blocks of a (c, z, y, x) array, as a chunk cache holds them, and the blocks
    (the caller keeps them alive while kernels read them)."""
    grid = tuple(-(-s // c) for s, c in zip(volume.shape[1:], chunk))
    addresses = np.zeros(grid, np.int64)
    blocks = []
    for key in np.ndindex(*grid):
        box = tuple(slice(k * c, (k + 1) * c) for k, c in zip(key, chunk))
        block = np.ascontiguousarray(volume[(slice(None),) + box])
        blocks.append(block)
        addresses[key] = block.ctypes.data
    return ChunkGrid(addresses, chunk, volume.shape[1:], volume.shape[0], volume.dtype), blocks


def windows(rng, shape, patch, count):
    """Random transforms and corners; the first window touches the far corner of the volume."""
    transforms = [TRANSFORMS[i] for i in rng.integers(0, len(TRANSFORMS), count)]
    perms = [t[0] for t in transforms]
    flips = [t[1] for t in transforms]
    corners = [random_corner(rng, shape, extent_of(patch, perm)) for perm in perms]
    corners[0] = tuple(s - e for s, e in zip(shape, extent_of(patch, perms[0])))
    return corners, perms, flips


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.int8, np.int16, np.uint32, np.float16,
                                   np.float64])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float16])
def test_chunked_convert_equals_in_memory_for_all_transforms(rng, chunk, dtype, out_dtype):
    volume = random_volume(rng, (2,) + SHAPE, dtype)
    grid, blocks = held_blocks(volume, chunk)
    patch = (7, 18, 19)
    for perm, flips in TRANSFORMS:
        corners = [random_corner(rng, SHAPE, extent_of(patch, perm)) for _ in range(2)]
        scale, shift = rng.random(2).astype(np.float32), rng.random(2).astype(np.float32)
        out = np.empty((2, 2) + patch, out_dtype)
        expected = np.empty_like(out)
        gather_chunked_convert([grid] * 2, corners, [perm] * 2, [flips] * 2, scale, shift, out)
        gather_convert([volume] * 2, corners, [perm] * 2, [flips] * 2, scale, shift, expected)
        assert out.tobytes() == expected.tobytes(), (perm, flips)


@pytest.mark.parametrize("chunk", [(5, 16, 7), (4, 8, 40), (3, 64, 64)])
@pytest.mark.parametrize("dtype, out_dtype", [(np.uint8, np.float32), (np.uint16, np.float16), (np.uint8, None)])
def test_chunked_batches_large_enough_to_stream_equal_in_memory(rng, chunk, dtype, out_dtype):
    """Outputs of 2 MiB and more are written with streaming stores, a row that crosses chunks along x assembled
    in staging first: bit-exact against the in-memory kernels."""
    shape = (70, 150, 170)  # every transform of the patch fits
    volume = random_volume(rng, (2,) + shape, dtype)
    grid, blocks = held_blocks(volume, chunk)
    patch, count = (8, 64, 64), 72  # 72 windows of 2 x 8 x 64 x 64: 2.25 MiB of uint8, more of floats
    for transforms in ([((0, 1, 2), (False, False, False))] * count,
                       [TRANSFORMS[i] for i in rng.integers(0, len(TRANSFORMS), count)]):
        perms, flips = [t[0] for t in transforms], [t[1] for t in transforms]
        corners = [random_corner(rng, shape, extent_of(patch, perm)) for perm in perms]
        out = np.empty((count, 2) + patch, dtype if out_dtype is None else out_dtype)
        expected = np.empty_like(out)
        if out_dtype is None:
            gather_chunked_copy([grid] * count, corners, perms, flips, out)
            gather_copy([volume] * count, corners, perms, flips, expected)
        else:
            scale, shift = rng.random(count).astype(np.float32), rng.random(count).astype(np.float32)
            gather_chunked_convert([grid] * count, corners, perms, flips, scale, shift, out)
            gather_convert([volume] * count, corners, perms, flips, scale, shift, expected)
        assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int32])
def test_chunked_copy_equals_in_memory_for_all_transforms(rng, chunk, dtype):
    volume = random_volume(rng, (1,) + SHAPE, dtype)
    grid, blocks = held_blocks(volume, chunk)
    corners, perms, flips = windows(rng, SHAPE, (5, 16, 17), 3 * len(TRANSFORMS))
    out = np.empty((len(corners), 1, 5, 16, 17), dtype)
    expected = np.empty_like(out)
    gather_chunked_copy([grid] * len(corners), corners, perms, flips, out)
    gather_copy([volume] * len(corners), corners, perms, flips, expected)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("chunk", [(3, 150, 150), (3, 140, 64), (2, 64, 140)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint64])
def test_chunked_y_x_transposes_of_long_runs_equal_in_memory(rng, chunk, dtype):
    """Runs of at least a cache line of rows take the register transposer, inside one chunk or split across."""
    shape = (6, 150, 150)
    volume = random_volume(rng, (1,) + shape, dtype)
    grid, blocks = held_blocks(volume, chunk)
    transforms = [(perm, flips) for perm, flips in TRANSFORMS if perm[0] == 0]
    perms, flips = [t[0] for t in transforms], [t[1] for t in transforms]
    corners = [random_corner(rng, shape, extent_of((2, 130, 136), perm)) for perm in perms]
    out = np.empty((len(transforms), 1, 2, 130, 136), dtype)
    expected = np.empty_like(out)
    gather_chunked_copy([grid] * len(transforms), corners, perms, flips, out)
    gather_copy([volume] * len(transforms), corners, perms, flips, expected)
    np.testing.assert_array_equal(out, expected)


def test_chunked_kernels_release_the_gil(rng):
    volume = random_volume(rng, (1, 64, 256, 256), np.uint8)
    grid, blocks = held_blocks(volume, (16, 64, 64))
    count = 16
    out = np.empty((count, 1, 32, 128, 128), np.float32)
    corners = [random_corner(rng, (64, 256, 256), (32, 128, 128)) for _ in range(count)]
    args = ([grid] * count, corners, [(0, 1, 2)] * count, [(False,) * 3] * count, np.ones(count, np.float32),
            np.zeros(count, np.float32), out)
    assert_releases_gil(gather_chunked_convert, *args)


def test_a_chunk_not_held_or_a_window_outside_the_volume_is_refused(rng):
    volume = random_volume(rng, (1,) + SHAPE, np.uint8)
    grid, blocks = held_blocks(volume, (4, 8, 8))
    grid.addresses[1, 2, 3] = 0
    out = np.empty((1, 1, 4, 8, 8), np.uint8)
    with pytest.raises(ValueError, match=r"window 0 needs chunk \(1, 2, 3\), which is not held"):
        gather_chunked_copy([grid], [(4, 16, 24)], [(0, 1, 2)], [(False,) * 3], out)
    with pytest.raises(IndexError, match=r"window 0 spans \[40, 48\) along axis x, outside the volume extent 45"):
        gather_chunked_copy([grid], [(0, 0, 40)], [(0, 1, 2)], [(False,) * 3], out)
    with pytest.raises(ValueError, match="C-contiguous int64 array of the grid's shape"):
        ChunkGrid(np.zeros((2, 2, 2), np.int64), (4, 8, 8), SHAPE, 1, np.uint8)


@pytest.mark.parametrize("box", [[[0, 0, 0], [1, 1, 6]], [[-1, 0, 0], [0, 0, 0]], [[1, 0, 0], [0, 0, 0]],
                                 [[0, 0, 0, 0], [0, 0, 0, 0]]])
def test_pinning_refuses_boxes_of_blocks_outside_the_grid_and_leaves_the_pins_alone(rng, box):
    volume = random_volume(rng, (1,) + SHAPE, np.uint8)
    grid, _ = held_blocks(volume, (4, 8, 8))
    shape = grid.addresses.shape
    with pytest.raises(ValueError, match=rf"chunk indices inside the grid \({shape[0]}, {shape[1]}, {shape[2]}\)"):
        grid.pin(np.array([box, box]), 1)
    with pytest.raises(ValueError, match="inside the grid"):
        grid.unpin(np.array([box]))
    assert not grid.pins.any()
    last = np.array(shape) - 1
    assert grid.pin(np.array([[[0, 0, 0], last]]), 1) == (grid.addresses.size, [])
    assert (grid.pins == 1).all()


def write_zarr(path, data, chunks):
    """A zarr v3 array written by zarr-python, the way the field's tools write them."""
    array = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype,
                              compressors=zarr.codecs.ZstdCodec(), fill_value=0)
    array[...] = data
    return path


def batches(raw, labels, threads, count, **kwargs):
    loader = ef.Loader(raw, labels, patch=(6, 12, 14), batch_size=4, threads=threads, seed=7,
                       augment=[ef.Mirror(), ef.Transpose("zyx")], isotropic=True, **kwargs)
    with loader:
        return [batch.copy() for _, batch in zip(range(count), loader)]


@pytest.mark.parametrize("chunks", [(4, 8, 8), (1, 37, 45), (5, 16, 7)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("threads", [1, 2])
def test_lazy_loader_batches_equal_in_memory_batches(tmp_path, rng, chunks, dtype, threads):
    raw = random_volume(rng, SHAPE, dtype)
    labels = rng.integers(0, 2 ** 40, SHAPE, dtype=np.uint64)
    write_zarr(tmp_path / "raw.zarr", raw, chunks)
    write_zarr(tmp_path / "labels.zarr", labels, chunks)
    expected = batches(raw, labels, 1, 6, normalize=(0.5, 0.25) if dtype == np.float32 else None)
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy_raw, \
            ef.open(tmp_path / "labels.zarr", in_memory=False) as lazy_labels:
        got = batches(lazy_raw, lazy_labels, threads, 6, normalize=(0.5, 0.25) if dtype == np.float32 else None)
    for expected_batch, got_batch in zip(expected, got):
        assert expected_batch.keys() == got_batch.keys()
        for name in expected_batch:
            assert got_batch[name].tobytes() == expected_batch[name].tobytes(), name


def test_blocks_stay_pinned_while_threads_evict_under_a_tight_budget(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (2, 8, 8))
    expected = batches(raw, None, 1, 8)
    block = 2 * 8 * 8
    with ef.open(tmp_path / "raw.zarr", in_memory=False, cache_bytes=40 * block) as lazy:
        got = batches(lazy, None, 2, 8)  # a window needs up to 4 x 3 x 3 blocks: eviction on every batch
        stats = lazy.cache_stats
        assert stats.bytes_held <= stats.budget_bytes  # back within the budget once nothing is pinned
        assert not lazy.chunk_cache._pins.any()
    for expected_batch, got_batch in zip(expected, got):
        np.testing.assert_array_equal(got_batch["raw"], expected_batch["raw"])


def test_warm_lazy_batches_do_no_python_work_per_chunk(tmp_path, rng, monkeypatch):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (1, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        lazy.read_box((0, 0, 0), SHAPE, np.empty((1,) + SHAPE, np.uint8))  # every chunk is cached
        cache = lazy.chunk_cache
        per_chunk = []
        lookup = type(cache)._get
        monkeypatch.setattr(cache, "_get", lambda *args: per_chunk.append(args) or lookup(cache, *args))
        hits = cache.stats.hits
        batches(lazy, None, 2, 4)
        assert per_chunk == [] and cache.stats.hits > hits


def test_a_failed_chunk_read_unpins_and_reaches_the_consumer(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    (tmp_path / "raw.zarr" / "c" / "1" / "1" / "1").write_bytes(b"not zstd")
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        with pytest.raises(OSError, match=r"raw\.zarr: cannot decode chunk"):
            batches(lazy, None, 2, 20)
        assert not lazy.chunk_cache._pins.any()
        assert threads_end()  # producers and the read-ahead threads, which met the same chunk first


class SlowReads:
    """Wraps a lazy volume's source so that every chunk read takes ``seconds`` more: a remote store."""

    def __init__(self, volume, seconds):
        self.source, self.seconds, self.threads = volume.chunk_cache._source, seconds, set()
        volume.chunk_cache._source = self

    def read(self, corner, extent, out):
        self.threads.add(threading.current_thread().name)
        threading.Event().wait(self.seconds)
        self.source.read(corner, extent, out)


def test_read_ahead_reads_the_next_batches_chunks_within_the_budget(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    expected = batches(raw, None, 1, 8)
    with ef.open(tmp_path / "raw.zarr", in_memory=False, cache_bytes=200 * 4 * 8 * 8) as lazy:
        slow = SlowReads(lazy, 0.002)
        loader = ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=1, seed=7,
                           augment=[ef.Mirror(), ef.Transpose("zyx")], isotropic=True)
        with loader:
            assert any(name.startswith("emfast-read-ahead-") for name in emfast_threads())
            got = [batch.copy() for _, batch in zip(range(8), loader)]
            profile = loader.profile
        assert threads_end()
        stats = lazy.cache_stats
        assert stats.read_ahead > 0 and any(name.startswith("emfast-read-ahead-") for name in slow.threads)
        assert stats.bytes_held <= stats.budget_bytes and not lazy.chunk_cache._pins.any()
        assert profile.seconds["ahead"] > 0
    for expected_batch, got_batch in zip(expected, got):
        np.testing.assert_array_equal(got_batch["raw"], expected_batch["raw"])


#: Blocks of (4, 8, 8) a cache holds: the first batch of ``batches`` needs 81 (its windows counted apart).
BATCH_AND_A_HALF = 120


def test_a_lone_producer_has_part_of_the_next_batch_read_ahead_where_the_cache_holds_no_whole_one(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    expected = batches(raw, None, 1, 8)
    with ef.open(tmp_path / "raw.zarr", in_memory=False, cache_bytes=BATCH_AND_A_HALF * 4 * 8 * 8) as lazy:
        slow = SlowReads(lazy, 0.002)
        loader = ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=1, seed=7,
                           augment=[ef.Mirror(), ef.Transpose("zyx")], isotropic=True)
        with loader:
            room = loader._pipeline.producers.read_ahead._room
            assert room is not None and 0 < room[lazy.chunk_cache] < 81  # part of a batch
            got = [batch.copy() for _, batch in zip(range(8), loader)]
        assert threads_end()
        stats = lazy.cache_stats
        assert stats.read_ahead > 0 and any(name.startswith("emfast-read-ahead-") for name in slow.threads)
        assert stats.bytes_held <= stats.budget_bytes and not lazy.chunk_cache._pins.any()
    for expected_batch, got_batch in zip(expected, got):
        np.testing.assert_array_equal(got_batch["raw"], expected_batch["raw"])


def test_producers_take_the_plans_read_ahead_computed_and_none_pile_up(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    expected = batches(raw, None, 1, 30)
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        loader = ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=2, seed=7,
                           augment=[ef.Mirror(), ef.Transpose("zyx")], isotropic=True)
        with loader:
            read_ahead = loader._pipeline.producers.read_ahead
            taken, plan = [], read_ahead.plan

            def counted(number):  # whether the producer found the plan read-ahead computed (not a timing)
                with read_ahead._lock:
                    taken.append(number in read_ahead._plans)
                return plan(number)

            read_ahead.plan = counted
            got = []
            for _, batch in zip(range(30), loader):
                got.append(batch.copy())
                assert len(read_ahead._plans) <= len(read_ahead.threads)
    assert any(taken), taken  # the producers took plans that read-ahead computed (counted from when it began)
    for expected_batch, got_batch in zip(expected, got):
        np.testing.assert_array_equal(got_batch["raw"], expected_batch["raw"])


def test_no_read_ahead_where_the_budget_holds_only_the_batches_in_flight(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False, cache_bytes=20 * 4 * 8 * 8) as lazy:
        with ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=2) as loader:
            next(iter(loader))
            assert not any(name.startswith("emfast-read-ahead") for name in emfast_threads())
        assert lazy.cache_stats.read_ahead == 0


def test_nan_in_a_lazy_float_window_names_volume_and_window(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.float32)
    raw[3:, :, :] = np.nan
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        with pytest.raises(ValueError, match=r"raw\.zarr.*NaN or infinity in the window at \(z, y, x\)"):
            batches(lazy, None, 1, 4, normalize=(0.0, 1.0))


def test_read_box_of_a_box_larger_than_the_budget_is_read_block_by_block(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint16)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False, cache_bytes=3 * 4 * 8 * 8 * 2) as lazy:
        out = np.empty((1,) + SHAPE, np.uint16)
        lazy.read_box((0, 0, 0), SHAPE, out)
        np.testing.assert_array_equal(out[0], raw)
        assert lazy.cache_stats.bytes_held <= lazy.cache_stats.budget_bytes


def test_threads_sharing_a_lazy_volume_get_exact_windows(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (3, 5, 7))
    with ef.open(tmp_path / "raw.zarr", in_memory=False, cache_bytes=60 * 3 * 5 * 7) as lazy:
        def read(seed):
            generator = np.random.default_rng(seed)
            for _ in range(60):
                extent = tuple(int(generator.integers(1, 9)) for _ in range(3))
                corner = random_corner(generator, SHAPE, extent)
                out = lazy.read_box(corner, extent, np.empty((1,) + extent, np.uint8))
                box = tuple(slice(c, c + e) for c, e in zip(corner, extent))
                np.testing.assert_array_equal(out[0], raw[box])
        assert errors_on_threads(read, 4) == []


def test_profile_separates_cache_hits_fetches_and_waits_for_read_ahead(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        SlowReads(lazy, 0.003)
        cold = ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=2)
        with cold:
            for _, batch in zip(range(6), cold):
                pass
            del batch
            seconds = cold.profile.seconds
        assert seconds["ahead"] > 0 and seconds["fetch"] + seconds["pending"] > 0
        lazy.read_box((0, 0, 0), SHAPE, np.empty((1,) + SHAPE, np.uint8))  # every chunk cached
        warm = ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=2)
        with warm:
            for _, batch in zip(range(6), warm):
                pass
            del batch
            report = warm.profile
        assert report.seconds["cache"] > 0 and report.seconds["fetch"] == report.seconds["pending"] == 0
        assert report.seconds["read"] == 0  # no window is assembled into a buffer
        for stage in ("cache", "fetch", "pending", "ahead"):
            assert f"\n{stage} " in str(report)


def test_warped_lazy_windows_report_their_fetches_apart_from_the_read(tmp_path, rng):
    """Windows read for warps (Rotate, Elastic) went through Volume.read_box without the profile: fetch, decode and
    pending read 0 and every storage second sat in "read" (a review, over HTTP: read 0.93 s of 1.00)."""
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        SlowReads(lazy, 0.003)
        with ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=1, augment=[ef.Rotate()]) as loader:
            for _, batch in zip(range(4), loader):
                pass
            del batch
            seconds = loader.profile.seconds
    assert seconds["fetch"] + seconds["pending"] > 0 and seconds["read"] > 0


def test_the_profile_clock_runs_from_start_to_close(monkeypatch):
    """elapsed ran from the Loader's construction, so a loader built while a model was set up reported a fraction
    of its rate, and it went on growing after close (a review: 60 batches in 0.017 s shown as 58.8 batches/s)."""
    from emfast.pipeline import _profile

    now = [100.0]
    clock = types.SimpleNamespace(perf_counter=lambda: now[0])  # the profile's clock alone, moved by hand
    monkeypatch.setattr(_profile, "time", clock)
    loader = ef.Loader(random_volume(np.random.default_rng(0), SHAPE, np.uint8), patch=(6, 12, 14), batch_size=2)
    assert loader.profile.elapsed == 0
    now[0] = 200.0  # built long before its first batch
    with loader:
        loader.next_batch()
        now[0] = 203.0
    now[0] = 500.0  # long after close
    assert loader.profile.elapsed == 3.0 and loader.profile.batches == 1


def test_a_chunk_grid_beyond_the_address_space_is_refused_naming_the_store(tmp_path):
    zarr.create_array(str(tmp_path / "huge.zarr"), shape=(10 ** 12,) * 3, chunks=(1, 1, 1), dtype=np.uint8)
    with pytest.raises(VolumeTooLargeError, match=r"huge\.zarr: the table of its 10{36} chunks .* needs "
                                                     r"21000000000000000000000000000000000000 bytes"):
        ef.open(tmp_path / "huge.zarr", in_memory=False)


@pytest.mark.parametrize("chunks", [(4, 8, 8), (1, 37, 45), (5, 16, 7)])
@pytest.mark.parametrize("pad", ["reflect", "edge", "constant"])
def test_lazy_padded_boxes_equal_in_memory_padded_boxes(tmp_path, rng, chunks, pad):
    raw = random_volume(rng, (2,) + SHAPE, np.uint16)
    write_zarr(tmp_path / "raw.zarr", raw, (2,) + chunks)
    memory = ef.Volume.from_array(raw)
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        for _ in range(20):
            extent = tuple(int(rng.integers(1, 2 * s)) for s in SHAPE)
            corner = tuple(int(rng.integers(-e, s)) for e, s in zip(extent, SHAPE))
            expected = memory.read_padded(corner, extent, np.empty((2,) + extent, np.uint16), pad, fill=7)
            got = lazy.read_padded(corner, extent, np.empty((2,) + extent, np.uint16), pad, fill=7)
            np.testing.assert_array_equal(got, expected)


def test_closing_a_loader_mid_read_ahead_ends_every_thread_promptly(tmp_path, rng):
    raw = random_volume(rng, SHAPE, np.uint8)
    write_zarr(tmp_path / "raw.zarr", raw, (4, 8, 8))
    with ef.open(tmp_path / "raw.zarr", in_memory=False) as lazy:
        slow = SlowReads(lazy, 0.02)
        loader = ef.Loader(lazy, patch=(6, 12, 14), batch_size=4, threads=2).start()
        next(iter(loader)).release()
        started = time.perf_counter()
        loader.close()  # read-ahead threads are mid-way through batches of tens of 20 ms reads
        assert time.perf_counter() - started < 1.0 and threads_end(0.1)
        assert any(name.startswith("emfast-read-ahead-") for name in slow.threads)
        assert not lazy.chunk_cache._pins.any()
