"""The loader end to end: contents, reproducibility, epochs, release semantics, errors and shutdown."""
import gc
import os
import re
import signal
import threading
import time
import tracemalloc
import traceback

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.transfer._fake import FakeDevice
from threads import emfast_threads, threads_end
from reference import converted, window

PATCH = (4, 16, 12)


@pytest.fixture
def volumes(rng):
    raw = rng.integers(0, 256, (12, 40, 36), dtype=np.uint8)
    labels = rng.integers(0, 2**40, (12, 40, 36), dtype=np.uint64)
    return raw, labels


def collect(loader, count):
    """Copies of the first ``count`` batches with their plans."""
    batches = []
    with loader:
        for _, batch in zip(range(count), loader):
            batches.append((batch.copy(), batch.positions.copy(), batch.perms.copy(), batch.flips.copy()))
    return batches


def test_batches_equal_the_numpy_reference(volumes):
    raw, labels = volumes
    loader = ef.Loader(raw, labels, patch=PATCH, batch_size=5, augment=["mirror", "transpose"], seed=7,
                       normalize=(0.5, -1.0))
    for arrays, positions, perms, flips in collect(loader, 6):
        assert arrays["raw"].shape == (5, 1) + PATCH and arrays["raw"].dtype == np.float32
        assert arrays["labels"].shape == (5, 1) + PATCH and arrays["labels"].dtype == np.uint64
        for n in range(5):
            expected_raw = converted(raw[None], positions[n], PATCH, perms[n], flips[n], 0.5, -1.0, np.float32)
            np.testing.assert_array_equal(arrays["raw"][n], expected_raw)
            np.testing.assert_array_equal(arrays["labels"][n], window(labels[None], positions[n], PATCH,
                                                                      perms[n], flips[n]))


def test_the_first_batch_waits_for_one_slot_only_and_the_producers_allocate_the_others(volumes, monkeypatch):
    from emfast.pipeline._gather import Gatherer
    allocated_on = []
    allocate = Gatherer.allocate
    monkeypatch.setattr(Gatherer, "allocate", lambda self: allocated_on.append(threading.current_thread().name)
                        or allocate(self))
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, batch_size=3, threads=2, buffers=5, seed=1) as loader:
        kept = [batch["raw"] for _, batch in zip(range(5), loader)]  # all kept: each needs its own slot
        assert allocated_on[0] == threading.current_thread().name  # at start, where a lack of memory fails early
        assert len(allocated_on) >= 5 and all(name.startswith("emfast-producer") for name in allocated_on[1:])
        assert all(raw.shape == (3, 1) + PATCH for raw in kept)


def test_intensity_changes_raw_only_and_float16_output(volumes):
    raw, labels = volumes
    plain = collect(ef.Loader(raw, labels, patch=PATCH, augment=["mirror"], seed=1), 3)
    bright = collect(ef.Loader(raw, labels, patch=PATCH, augment=["mirror", ef.Intensity(0.5, 0.5)], seed=1,
                               dtype="float16"), 3)
    for (a, *_), (b, *_) in zip(plain, bright):
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert b["raw"].dtype == np.float16
        assert not np.allclose(a["raw"], b["raw"].astype(np.float32), atol=1e-2)


@pytest.mark.parametrize("threads,buffers", [(1, 2), (3, 5), (2, 9)])
def test_same_seed_same_batches_whatever_threads_and_buffers(volumes, threads, buffers):
    raw, labels = volumes
    reference = collect(ef.Loader(raw, labels, patch=PATCH, batch_size=3, seed=11), 12)
    other = collect(ef.Loader(raw, labels, patch=PATCH, batch_size=3, seed=11, threads=threads,
                              buffers=buffers), 12)
    for (a, pa, *_), (b, pb, *_) in zip(reference, other):
        np.testing.assert_array_equal(pa, pb)
        np.testing.assert_array_equal(a["raw"], b["raw"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
    different = collect(ef.Loader(raw, labels, patch=PATCH, batch_size=3, seed=12), 1)
    assert not np.array_equal(different[0][1], reference[0][1])


def test_epochs_have_fixed_size_and_differ(volumes):
    raw, _ = volumes
    with ef.Loader(raw, patch=PATCH, batch_size=2, epoch_size=4, threads=2) as loader:
        first = [(b.epoch, b.index, b.positions.copy()) for b in loader]
        assert loader.epoch == 1
        second = [(b.epoch, b.index, b.positions.copy()) for b in loader]
    assert [(e, i) for e, i, _ in first] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert [(e, i) for e, i, _ in second] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert not np.array_equal(first[0][2], second[0][2])


def test_windows_cover_the_volume_uniformly():
    raw = np.zeros((4, 20, 20), np.uint8)
    with ef.Loader(raw, patch=(4, 10, 10), batch_size=50, augment=[], seed=5) as loader:
        corners = np.concatenate([b.positions for _, b in zip(range(40), loader)])
    assert corners[:, 0].max() == 0
    for axis in (1, 2):
        counts = np.bincount(corners[:, axis], minlength=11)
        assert len(counts) == 11 and counts.min() > 0.6 * counts.mean()


def test_lazy_reading_gives_the_in_memory_batches(small_h5):
    path, _, _ = small_h5
    batches = {}
    for in_memory in (True, False):
        raw = ef.hdf5(path, "volumes/raw", in_memory=in_memory)
        labels = ef.hdf5(path, "volumes/labels/neuron_ids", in_memory=in_memory)
        batches[in_memory] = collect(ef.Loader(raw, labels, patch=PATCH, batch_size=4, threads=2, seed=2), 5)
        raw.close()
        labels.close()
    for (a, *_), (b, *_) in zip(batches[True], batches[False]):
        np.testing.assert_array_equal(a["raw"], b["raw"])
        np.testing.assert_array_equal(a["labels"], b["labels"])


def test_labels_covering_part_of_raw(rng):
    raw = rng.integers(0, 256, (10, 40, 40), dtype=np.uint8)
    labels = rng.integers(0, 9, (6, 20, 30), dtype=np.uint32)
    offset = (2, 15, 5)
    loader = ef.Loader(raw, labels, patch=(3, 8, 8), batch_size=4, label_offset=offset, seed=4)
    region = loader.regions[0]
    assert (tuple(region.lo), tuple(region.hi)) == ((2, 15, 5), (8, 35, 35))
    for arrays, positions, perms, flips in collect(loader, 5):
        for n in range(4):
            local = positions[n] - np.array(offset)
            np.testing.assert_array_equal(arrays["labels"][n],
                                          window(labels[None], local, (3, 8, 8), perms[n], flips[n]))
            np.testing.assert_array_equal(arrays["raw"][n], converted(raw[None], positions[n], (3, 8, 8),
                                                                      perms[n], flips[n], 1 / 255, 0, np.float32))


def test_alignment_from_offset_and_resolution_attributes(tmp_path, rng):
    path = tmp_path / "aligned.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("raw", data=rng.integers(0, 256, (10, 40, 40), dtype=np.uint8))
        d.attrs.update(resolution=(40, 4, 4), offset=(0, 0, 0))
        d = f.create_dataset("labels", data=np.ones((6, 20, 20), np.uint64))
        d.attrs.update(resolution=(40, 4, 4), offset=(80, 40, 20))
        d = f.create_dataset("coarse", data=np.ones((6, 20, 20), np.uint64))
        d.attrs.update(resolution=(40, 8, 8), offset=(80, 40, 20))
        d = f.create_dataset("ratio_1_5", data=np.ones((6, 20, 20), np.uint64))
        d.attrs.update(resolution=(40, 6, 4), offset=(80, 40, 20))
        d = f.create_dataset("half_voxel", data=np.ones((6, 20, 20), np.uint64))
        d.attrs.update(resolution=(40, 4, 4), offset=(80, 42, 20))
    raw = ef.hdf5(path, "raw")
    region = ef.Loader(raw, ef.hdf5(path, "labels"), patch=(2, 4, 4)).regions[0]
    assert (tuple(region.lo), tuple(region.hi)) == ((2, 10, 5), (8, 30, 25))
    region = ef.Loader(raw, ef.hdf5(path, "coarse"), patch=(2, 4, 4)).regions[0]  # twice raw's voxel size in y, x
    assert (tuple(region.lo), tuple(region.hi)) == ((2, 10, 5), (8, 40, 40))
    with pytest.raises(ValueError, match=r"along y the ratio 1.5 is not an integer multiple or divisor"):
        ef.Loader(raw, ef.hdf5(path, "ratio_1_5"), patch=(2, 4, 4))
    with pytest.raises(ValueError, match="whole number of voxels"):
        ef.Loader(raw, ef.hdf5(path, "half_voxel"), patch=(2, 4, 4))


def test_batch_is_invalid_after_release_and_next(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH) as loader:
        iterator = iter(loader)
        first = next(iterator)
        assert "raw" in first and len(first) == 2
        first.release()
        first.release()  # idempotent
        with pytest.raises(ef.BatchReleasedError, match="batch 0"):
            first["raw"]
        second = next(iterator)
        third = next(iterator)
        with pytest.raises(ef.BatchReleasedError):
            second["labels"]
        assert third["raw"].shape[0] == 8
    with pytest.raises(ef.BatchReleasedError):
        third["raw"]


def failing_plan(planner, epoch, index):
    if index == 3:
        raise ZeroDivisionError("boom in the producer")
    return planner.__class__.plan(planner, epoch, index)


@pytest.mark.parametrize("threads", [1, 3])
def test_producer_error_reaches_consumer_with_traceback_after_earlier_batches(volumes, threads, monkeypatch):
    raw, _ = volumes
    loader = ef.Loader(raw, patch=PATCH, threads=threads, buffers=threads + 3)
    monkeypatch.setattr(loader._planner, "plan", lambda e, i: failing_plan(loader._planner, e, i))
    seen = []
    with pytest.raises(ZeroDivisionError, match="boom") as info:
        with loader:
            for batch in loader:
                seen.append(batch.index)
    assert seen == [0, 1, 2]
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "failing_plan" in frames and "_run" in frames  # the producer's own frames are kept


def test_keyboard_interrupt_in_the_loop_stops_every_thread(volumes):
    raw, labels = volumes
    with pytest.raises(KeyboardInterrupt):
        with ef.Loader(raw, labels, patch=PATCH, threads=3) as loader:
            for n, _ in enumerate(loader):
                if n == 2:
                    raise KeyboardInterrupt
    # the autouse fixture checks that no emfast thread is left


def test_close_with_producers_blocked_on_a_full_ring(volumes):
    raw, _ = volumes
    loader = ef.Loader(raw, patch=PATCH, threads=2, buffers=2).start()
    time.sleep(0.2)  # producers fill both slots and block waiting for the consumer
    started = time.perf_counter()
    loader.close()
    assert time.perf_counter() - started < 2
    loader.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        loader.next_batch()


def test_closing_from_another_thread_ends_a_wait_for_a_batch(volumes, monkeypatch):
    from emfast.pipeline._gather import Gatherer
    fill = Gatherer.fill

    def slow_fill(self, *args, **kwargs):
        time.sleep(0.5)
        return fill(self, *args, **kwargs)

    monkeypatch.setattr(Gatherer, "fill", slow_fill)
    raw, _ = volumes
    loader = ef.Loader(raw, patch=PATCH, threads=1).start()
    closer = threading.Timer(0.1, loader.close)
    closer.start()
    with pytest.raises(RuntimeError, match="the loader was closed"):
        loader.next_batch()
    closer.join()
    with pytest.raises(RuntimeError, match="this loader is closed"):
        loader.next_batch()


def test_abandoned_loader_stops_its_threads(volumes):
    raw, _ = volumes
    loader = ef.Loader(raw, patch=PATCH, threads=2)
    next(iter(loader))
    del loader
    gc.collect()
    assert threads_end(5)


def test_profile_reports_every_stage(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, epoch_size=10) as loader:
        for _ in loader:
            pass
    report = loader.profile
    assert report.batches == 10 and report.seconds["kernel"] > 0 and report.seconds["sample"] > 0
    assert set(report.seconds) == {"sample", "read", "cache", "fetch", "decode", "pending", "ahead", "kernel", "augment",
                                   "targets", "copy", "stall", "wait"}
    assert report.seconds["copy"] == 0  # no device
    text = str(report)
    assert "kernel" in text and "batches/s" in text
    assert report.as_dict()["per_batch_ms"]["kernel"] > 0


def test_memory_does_not_grow_while_streaming(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, threads=2) as loader:
        iterator = iter(loader)
        tracemalloc.start()
        snapshots = []
        for count in (300, 2000, 2000):
            for _ in range(count):
                next(iterator)
            snapshots.append(tracemalloc.take_snapshot())
        tracemalloc.stop()
    first, second = (sum(s.size_diff for s in b.compare_to(a, "filename"))
                     for a, b in zip(snapshots, snapshots[1:]))
    # The interpreter's free lists (up to 2000 tuples of each size) fill up once: bounded, a few hundred KiB in the
    # first round, nothing in the second. Keeping anything per batch would cost far more, in every round: a plan is
    # ~0.5 KiB, a batch 6 KiB, so at least 1 MiB per 2000 batches.
    assert first < 512 * 1024, f"{first} bytes more after the first 2000 batches"
    assert second < 64 * 1024, f"{second} bytes more after the next 2000 batches"
    assert loader.slot_bytes == 8 * int(np.prod(PATCH)) * (4 + 8)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(patch=(4, 16)), ValueError, "patch must be 3 integers"),
    (dict(patch=(0, 16, 12)), ValueError, r"patch must be 3 integers >= 1 \(z, y, x\), got \(0, 16, 12\)"),
    (dict(patch=(4, 16.5, 12)), ValueError, "patch must be 3 integers"),
    (dict(patch=(13, 16, 12)), ValueError, r"patch \(13, 16, 12\) does not fit"),
    (dict(patch=(4, 39, 12)), ValueError, "for transposed examples"),
    (dict(batch_size=0), ValueError, "batch_size must be an integer >= 1"),
    (dict(threads=0), ValueError, "threads"),
    (dict(buffers=1), ValueError, "buffers must be an integer >= 2"),
    (dict(buffers=5, max_buffers=3), ValueError, r"max_buffers \(3\) must be at least buffers \(5\)"),
    (dict(max_buffers=True), ValueError, "max_buffers must be an integer"),
    (dict(threads=1000), ValueError, "threads=1000 is far beyond this machine's"),
    (dict(batch_size=64, buffers=10**7), MemoryError,
     r"of memory is available: 10000001 batch slots \(buffers=10000000"),
    (dict(epoch_size=0), ValueError, "epoch_size"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(dtype="float64"), ValueError, "dtype must be"),
    (dict(augment=["mirorr"]), ValueError, "did you mean 'mirror'"),
    (dict(augment=[ef.Transpose("zyx")]), ValueError, "isotropic=True"),
    (dict(normalize=(1.0, float("nan"))), ValueError, "normalize"),
    (dict(label_offset=(1, 2, 3)), ValueError, "no labels"),
    (dict(pach=(4, 16, 12)), TypeError, "pach"),
])
def test_bad_arguments_fail_before_streaming(volumes, kwargs, error, match):
    raw, _ = volumes
    arguments = dict(patch=PATCH)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        ef.Loader(raw, **arguments)


def test_bad_volumes(rng):
    raw = rng.integers(0, 256, (12, 40, 36), dtype=np.uint8)
    with pytest.raises(ValueError, match="pass label_offset"):
        ef.Loader(raw, np.zeros((12, 40, 35), np.uint64), patch=PATCH)
    with pytest.raises(TypeError, match="labels must be uint32, uint64, int64 or int32, not uint8"):
        ef.Loader(raw, raw, patch=PATCH)
    with pytest.raises(TypeError, match="raw must be uint8, .* or float64, not uint64"):
        ef.Loader(raw.astype(np.uint64), patch=PATCH)
    with pytest.raises(TypeError, match="NumPy array"):
        ef.Loader([[[1]]], patch=PATCH)
    with pytest.raises(ValueError, match="does not overlap"):
        ef.Loader(raw, np.zeros((4, 4, 4), np.uint64), patch=(1, 1, 1), label_offset=(20, 0, 0))


def test_released_batch_refuses_iteration_and_copy(volumes):
    raw, _ = volumes
    with ef.Loader(raw, patch=PATCH) as loader:
        batch = loader.next_batch()
        batch.release()
        for use in (list, len, lambda b: b.copy(), lambda b: "raw" in b):
            with pytest.raises(ef.BatchReleasedError):
                use(batch)


def test_interruption_during_hand_over_leaves_no_slot_leased(volumes, monkeypatch):
    """Ctrl-C inside next_batch must not leave a slot that is never released (the stream would hang)."""
    raw, _ = volumes
    with ef.Loader(raw, patch=PATCH, buffers=2, seed=9) as loader:
        calls = []

        def count_batch():
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt

        monkeypatch.setattr(loader._profile, "count_batch", count_batch)
        loader.next_batch()
        with pytest.raises(KeyboardInterrupt):
            loader.next_batch()
        numbers = []
        consumer = threading.Thread(target=lambda: numbers.extend(loader.next_batch().number for _ in range(6)))
        consumer.start()
        consumer.join(10)
        stalled = consumer.is_alive()
    consumer.join()
    assert not stalled and numbers == [2, 3, 4, 5, 6, 7]


def test_error_while_preparing_a_producer_reaches_the_consumer(small_h5, monkeypatch):
    path, _, _ = small_h5
    raw = ef.hdf5(path, "volumes/raw", in_memory=False)
    loader = ef.Loader(raw, patch=PATCH)

    def no_memory():
        raise MemoryError("scratch buffers")

    monkeypatch.setattr(loader._gatherer, "new_scratch", no_memory)
    with pytest.raises(MemoryError, match="scratch"):
        with loader:
            loader.next_batch()
    raw.close()


def test_a_voxel_size_ratio_that_is_not_an_integer_is_refused_even_for_equal_shapes(rng):
    raw = ef.Volume.from_array(rng.integers(0, 9, (8, 16, 16), dtype=np.uint8), resolution=(40, 4, 4))
    labels = ef.Volume.from_array(np.zeros((8, 16, 16), np.uint64), resolution=(40, 4, 6))
    with pytest.raises(ValueError, match="along x the ratio 1.5 is not an integer"):
        ef.Loader(raw, labels, patch=(2, 4, 4))


def test_numpy_scalars_and_arrays_are_accepted_where_numbers_are(volumes):
    raw, _ = volumes
    loader = ef.Loader(raw, patch=np.array(PATCH), batch_size=np.int64(2), normalize=np.array([1.0, 0.0]),
                       augment=[ef.Mirror(p=np.float32(0.3)), ef.Intensity(np.float32(0.1), np.float64(0.1))],
                       label_offset=None, threads=np.int32(1))
    assert loader.patch == PATCH and loader.batch_size == 2


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampler="uniformm"), "unknown sampler 'uniformm'; did you mean 'uniform'"),
    (dict(sampler=["uniform"]), "one sampler"),
    (dict(sampler=ef.Mirror()), "samplers must be names or Sampler objects"),
    (dict(normalize=("a", 1)), "normalize"),
    (dict(labels=np.zeros((12, 40, 36), np.uint64), label_offset=(True, 0, 0)), "label_offset"),
    (dict(labels=np.zeros((12, 40, 36), np.uint64), label_offset=(2**70, 0, 0)), "out of range"),
])
def test_more_bad_arguments(volumes, kwargs, match):
    raw, _ = volumes
    with pytest.raises((TypeError, ValueError), match=match):
        ef.Loader(raw, patch=PATCH, **kwargs)


def test_samplers_by_name_as_in_configs(volumes):
    raw, _ = volumes
    with ef.Loader(raw, patch=PATCH, sampler="tiled", batch_size=2, augment=["mirror"]) as loader:
        assert type(loader.sampler) is ef.Tiled and loader.epoch_size == loader.sampler.batches_per_epoch()


def test_no_augmentation(volumes):
    raw, _ = volumes
    with ef.Loader(raw, patch=PATCH, augment=None) as loader:
        batch = loader.next_batch()
        assert (batch.perms == [0, 1, 2]).all() and not batch.flips.any()


@pytest.mark.parametrize("where", ["array", "hdf5", "lazy", "lazy-gzip"])
def test_bool_masks_are_read_as_uint8(volumes, tmp_path, where):
    """README and Sample accept bool masks: delivered as uint8 0/1, usable by the masked sampler."""
    raw, labels = volumes
    mask = np.random.default_rng(4).random(raw.shape) > 0.3
    if where == "array":
        source = mask
    else:
        path = tmp_path / "mask.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("mask", data=mask, chunks=(4, 8, 8), compression="gzip" if "gzip" in where else None)
        source = ef.hdf5(path, "mask", in_memory=where == "hdf5")
    sample = ef.Sample(raw, labels=labels, mask=source)
    with ef.Loader(sample, patch=PATCH, augment=[], sampler=ef.sampling.Masked(0.6), seed=2) as loader:
        for _, batch in zip(range(3), loader):
            assert batch["mask"].dtype == np.uint8
            for n, (z, y, x) in enumerate(batch.positions):
                expected = mask[z:z + PATCH[0], y:y + PATCH[1], x:x + PATCH[2]]
                np.testing.assert_array_equal(batch["mask"][n, 0], expected.astype(np.uint8))
                assert expected.mean() >= 0.6


@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_ctrl_c_during_close_still_joins_every_thread(volumes, monkeypatch, device):
    """A second Ctrl-C that lands while close() joins the producers must not leave them (or the copier, or
    device memory) behind."""
    raw, labels = volumes
    backend = FakeDevice() if device == "fake" else "cpu"
    loader = ef.Loader(raw, labels, patch=PATCH, threads=3, buffers=6, seed=1, device=backend)
    fill = type(loader._gatherer).fill

    def slow_fill(*args):
        # Producers busy, so joining them takes a while; the first (joined first) the longest, so that a join the
        # Ctrl-C broke (Python 3.11 then reports the thread ended) leaves it running after close().
        time.sleep(1.0 if threading.current_thread().name.endswith("-0") else 0.3)
        return fill(loader._gatherer, *args)

    monkeypatch.setattr(loader._gatherer, "fill", slow_fill)
    loader.start()
    time.sleep(0.05)
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C, while close() joins
    with pytest.raises(KeyboardInterrupt):
        loader.close()
    assert not emfast_threads()
    if device == "fake":
        assert backend.closed and backend.live == 0 and backend.violations == []
    loader.close()  # and again, quietly


def test_a_burst_of_ctrl_c_during_close_leaves_no_producer_running(volumes, monkeypatch):
    """Ctrl-C pressed again and again while close() stops slow producers: signals from another process (a
    terminal's), about one every 0.3 ms, may land anywhere in close(), not only while it waits. The test's handler
    raises KeyboardInterrupt, as the default one does, but only inside close() (so that pytest goes on) and once
    close() is past its first ``with`` line: before that, nothing has started to stop, and an interrupt there ends
    close() early by design."""
    import inspect
    import subprocess
    import sys

    raw, labels = volumes
    close = ef.Loader.close.__code__
    lines, first = inspect.getsourcelines(ef.Loader.close)
    stopping_from = first + next(i for i, line in enumerate(lines) if line.strip().startswith("with "))

    def interrupt_inside_close(signum, frame):
        while frame is not None:
            if frame.f_code is close:
                if frame.f_lineno > stopping_from:
                    raise KeyboardInterrupt
                return
            frame = frame.f_back

    previous = signal.signal(signal.SIGINT, interrupt_inside_close)
    sender = subprocess.Popen([sys.executable, "-c", f"""
import os, signal, sys, time
for line in sys.stdin:
    end = time.monotonic() + float(line)
    while time.monotonic() < end:
        os.kill({os.getpid()}, signal.SIGINT)
        pause = time.monotonic() + 0.0003
        while time.monotonic() < pause:
            pass
    print("done", flush=True)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(5):
            loader = ef.Loader(raw, labels, patch=PATCH, threads=3, buffers=6, seed=1)
            fill, filling = type(loader._gatherer).fill, set()

            def slow_fill(*args):
                filling.add(threading.current_thread().name)
                try:
                    time.sleep(0.3)
                    return fill(loader._gatherer, *args)
                finally:
                    filling.discard(threading.current_thread().name)

            monkeypatch.setattr(loader._gatherer, "fill", slow_fill)
            loader.start()
            time.sleep(0.05)
            sender.stdin.write("0.35\n")
            sender.stdin.flush()
            try:
                loader.close()
            except KeyboardInterrupt:
                pass
            assert not filling, f"still filling after close(): {sorted(filling)}"
            sender.stdout.readline()
    finally:
        sender.stdin.close()
        sender.wait(10)
        signal.signal(signal.SIGINT, previous)


class FormattedError(Exception):
    def __init__(self, number):
        super().__init__(f"batch {number} is bad")
        self.number = number


def test_a_producer_error_reaches_the_consumer_with_its_message_and_attributes(volumes, monkeypatch):
    raw, _ = volumes
    loader = ef.Loader(raw, patch=PATCH, seed=1)
    plan = type(loader._planner).plan

    def failing(epoch, index):
        if index == 1:
            raise FormattedError(index)
        return plan(loader._planner, epoch, index)

    monkeypatch.setattr(loader._planner, "plan", failing)
    with loader:
        loader.next_batch()
        for _ in range(2):  # raised again as often as asked, the same each time
            with pytest.raises(FormattedError) as info:
                loader.next_batch()
            assert str(info.value) == "batch 1 is bad" and info.value.number == 1


def test_reprs_and_counts_read_as_plain_python(rng):
    """NumPy-typed arguments (from arrays, configs) must not show as np.int64(4) in reprs, and one is singular."""
    i = np.int64
    raw = rng.integers(0, 256, (8, 16, 16), dtype=np.uint8)
    labels = np.zeros((6, 12, 12), np.uint64)
    sample = ef.Sample(raw, labels, label_offset=(i(1), i(2), i(2)), weight=np.float32(2))
    with ef.Loader(ef.Dataset([sample]), patch=(i(4), i(8), i(8)), batch_size=i(1), sampler=ef.Tiled(stride=i(4)),
                   augment=[], seed=i(3)) as loader:
        batch = loader.next_batch()
        texts = [repr(sample), repr(loader), repr(loader.sampler), repr(batch), str(loader.profile),
                 repr((batch.number, batch.epoch, batch.index, batch.valid)), repr(loader.state_dict())]
    assert not [text for text in texts if "np." in text], texts
    assert repr(sample) == "Sample('raw', raw=(8, 16, 16), labels=(6, 12, 12) at (1, 2, 2), weight=2.0)"
    assert str(loader.profile).startswith("1 batch in ") and "batches/s, 1 producer thread)" in str(loader.profile)
    with pytest.raises(ValueError, match=r"has 18 batches per epoch"):
        ef.Loader(ef.Dataset([sample]), patch=(4, 8, 8), batch_size=1, sampler=ef.Tiled(stride=2), epoch_size=3)
    with pytest.raises(ValueError, match=r"has 1 batch per epoch; leave epoch_size out"):
        ef.Loader(raw, patch=(8, 16, 16), batch_size=1, sampler=ef.Tiled(), epoch_size=3)


@pytest.mark.parametrize("name, hint", [
    ("affinities", r"Add it with targets=\[ef.Affinities\(...\)\] \(in a config: targets: \[affinities\]\)"),
    ("affinities_mask", r"targets=\[ef.Affinities\(...\)\]"),
    ("foreground", r"targets=\[ef.Foreground\(...\)\]"),
    ("affinities_weights", r"targets=\[ef.ClassWeights\(...\)\], after the target it reads"),
    ("mask", r"Add it with a mask: Sample\(raw, labels, mask=...\)"),
    ("labels_valid", "augmentations that move voxels from outside the data"),
    ("raws", r"Did you mean 'raw'\?"),
])
def test_a_missing_batch_field_names_the_fields_there_and_the_option_that_adds_it(volumes, name, hint):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, batch_size=1) as loader:
        batch = loader.next_batch()
        with pytest.raises(KeyError) as caught:
            batch[name]
        assert isinstance(caught.value, ef.pipeline.MissingFieldError)
        message = str(caught.value)
        assert message.startswith(f"the batch has no field {name!r}; it has 'raw', 'labels'."), message
        assert re.search(hint, message), message
        assert name not in batch and batch.get(name) is None


@pytest.mark.parametrize("key", [0, None, b"raw", ("raw",)])
def test_a_batch_indexed_by_a_number_says_its_fields_are_named(volumes, key):
    """batch[0], as a torch user indexes a list of samples, crashed inside difflib with "'int' object is not
    iterable"."""
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, batch_size=1) as loader:
        with pytest.raises(ef.pipeline.MissingFieldError) as caught:
            loader.next_batch()[key]
    assert str(caught.value).startswith(f"a batch's fields are named by strings; got {key!r}: a batch is a "
                                        "mapping of fields ('raw', 'labels')")


def test_labels_missing_because_of_keep_labels_false_say_so(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, batch_size=1, targets=["boundaries"], keep_labels=False) as loader:
        with pytest.raises(KeyError, match="built with keep_labels=False; keep_labels=True delivers them"):
            loader.next_batch()["labels"]


def test_the_loader_docstring_gives_every_parameters_default():
    """Each parameter with a default names it on its line of the docstring (``name : type, default value``)."""
    import inspect

    lines = ef.Loader.__doc__.splitlines()
    entries = {}
    for line in lines:
        match = re.match(r"    ([a-z_, ]+) : (.*)$", line)
        if match:
            for name in match.group(1).split(", "):
                entries[name] = match.group(2)
    missing = []
    for name, parameter in inspect.signature(ef.Loader).parameters.items():
        if parameter.default is inspect.Parameter.empty:
            continue
        default = repr(parameter.default) if isinstance(parameter.default, (str, tuple)) else str(parameter.default)
        if name not in entries or "default" not in entries[name] or default not in entries[name]:
            missing.append(f"{name} (default {default}): {entries.get(name)!r}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("epoch_size", [None, 6])
def test_an_iterator_goes_on_after_an_exception_in_next(volumes, epoch_size, monkeypatch):
    """iter(loader) was a generator, finished for good once an exception left it: after a Ctrl-C in a notebook
    cell (or a SlotsExhaustedError), next(it) raised a bare StopIteration on an endless loader (a review)."""
    raw, _ = volumes
    settings = dict(patch=(4, 16, 16), batch_size=2, seed=3, epoch_size=epoch_size, augment=["mirror"])
    with ef.Loader(raw, **settings) as reference:
        expected = [reference.next_batch()["raw"].copy() for _ in range(6)]
    with ef.Loader(raw, **settings) as loader:
        it = iter(loader)
        taken = [next(it)["raw"].copy()]
        real = loader.next_batch
        interrupted = [False]

        def interrupt_once():
            if not interrupted[0]:
                interrupted[0] = True
                raise KeyboardInterrupt
            return real()

        monkeypatch.setattr(loader, "next_batch", interrupt_once)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        taken += [batch["raw"].copy() for batch in it] if epoch_size else [next(it)["raw"].copy() for _ in range(5)]
    assert len(taken) == 6
    for got, want in zip(taken, expected):
        np.testing.assert_array_equal(got, want)
