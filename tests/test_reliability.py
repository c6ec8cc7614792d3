"""Reliability: faults injected at every stage, fuzzed arguments, configs and files, loaders sharing one file in
one process and across processes. The outcome is always a clear error or correct batches; threads always end."""
import gc
import multiprocessing
import os
import random
import threading

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import emfast as ef
from emfast.config import ConfigError, load_config
from emfast.transfer._fake import FakeDevice
from threads import threads_end

PATCH = (4, 16, 12)
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def volumes(rng):
    return (rng.integers(0, 256, (12, 40, 36), dtype=np.uint8),
            rng.integers(0, 2**40, (12, 40, 36), dtype=np.uint64))


def open_descriptors():
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


class Injected(Exception):
    """The fault a test injects."""


def inject(loader, stage, at):
    """Make ``stage`` fail while making batch number ``at``."""
    if stage == "plan":
        plan = type(loader._planner).plan

        def failing(epoch, index):
            if index == at:
                raise Injected(f"plan of batch {index}")
            return plan(loader._planner, epoch, index)

        loader._planner.plan = failing
    elif stage == "kernel":
        fill = type(loader._gatherer).fill

        def failing(arrays, plan, *args):
            if plan.index == at:
                raise Injected(f"kernel of batch {plan.index}")
            return fill(loader._gatherer, arrays, plan, *args)

        loader._gatherer.fill = failing
    elif stage == "read":
        volume = loader.dataset.samples[0].raw
        cache = volume.chunk_cache  # lazy windows pin their chunks once per batch, reading the missing ones
        pin, calls = cache.pin, []

        def failing(*args):
            calls.append(1)
            if len(calls) > at:
                raise OSError(f"{volume.name}: injected read error")
            return pin(*args)

        cache.pin = failing


@pytest.mark.parametrize("device,stage", [(device, stage) for device in ("cpu", "fake")
                                          for stage in ("plan", "kernel", "read")] + [("fake", "copy")])
@pytest.mark.parametrize("seed", range(3))
def test_an_injected_fault_reaches_the_consumer_and_nothing_leaks(volumes, device, stage, seed, tmp_path):
    at = random.Random(seed).randrange(1, 8)
    raw, labels = volumes
    path = tmp_path / "raw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=raw, chunks=(4, 16, 16))
    descriptors = open_descriptors()
    backend = FakeDevice(max_delay=0.0005, fail_copy_at=at if stage == "copy" else None) if device == "fake" \
        else "cpu"
    volume = ef.hdf5(path, "raw", in_memory=False) if stage == "read" else raw
    loader = ef.Loader(volume, labels, patch=PATCH, batch_size=3, threads=2, seed=seed, device=backend)
    inject(loader, stage, at)
    delivered, batch = [], None  # with two producers the fault can land in batch 0: then no batch is delivered
    expected = (RuntimeError, "copy") if stage == "copy" else (OSError, "read") if stage == "read" else \
        (Injected, stage)
    with pytest.raises(expected[0], match=expected[1]):
        with loader:
            for batch in loader:
                delivered.append(batch.number)
    assert delivered == list(range(len(delivered))) and len(delivered) <= at + 1
    assert threads_end()
    if isinstance(backend, FakeDevice):
        assert backend.live == 0 and backend.violations == []
    del loader, volume, batch
    gc.collect()  # the injected read fault is a closure stored on the volume it reads: a cycle of the test's own
    assert open_descriptors() <= descriptors  # the lazy file is closed once its volume is gone


def test_an_abandoned_iterator_leaves_the_loader_usable(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, epoch_size=10, seed=2) as loader:
        iterator = iter(loader)
        first = next(iterator).number
        del iterator  # a loop left by break or an exception
        assert loader.next_batch().number == first + 1
        assert [b.index for b in loader] == list(range(2, 10))


@FUZZ
@given(patch=st.tuples(*[st.integers(-1, 14)] * 3), batch_size=st.integers(0, 4), threads=st.integers(0, 3),
       buffers=st.one_of(st.none(), st.integers(1, 5)), label_offset=st.one_of(
           st.none(), st.tuples(*[st.integers(-1, 2)] * 3)), dtype=st.sampled_from(["float32", "float16", "int8"]))
def test_fuzzed_arguments_give_batches_or_a_clear_error(volumes, patch, batch_size, threads, buffers,
                                                        label_offset, dtype):
    raw, labels = volumes
    sane = min(patch) >= 1 and batch_size >= 1 and threads >= 1 and (buffers is None or buffers >= 2) \
        and dtype != "int8" and (label_offset is None or min(label_offset) >= 0)
    try:
        loader = ef.Loader(raw, labels[:11, :38, :35] if label_offset else labels, patch=patch,
                           batch_size=batch_size, threads=threads, buffers=buffers, label_offset=label_offset,
                           dtype=dtype)
    except (ValueError, TypeError) as error:
        # refused: a bad value, or windows that do not fit; the message names which
        assert not sane or "does not fit" in str(error) or "does not overlap" in str(error), str(error)
        return
    assert sane
    with loader:
        batch = loader.next_batch()
        assert batch["raw"].shape == (batch_size, 1) + tuple(patch) and batch["raw"].dtype == np.dtype(dtype)
        assert batch["labels"].shape == (batch_size, 1) + tuple(patch)


BASE = """\
data:
  samples:
    - name: A
      file: {builtin: demo, shape: [16, 48, 48]}
      raw: volumes/raw
      labels: volumes/labels/neuron_ids
loader: {patch: [4, 16, 16], batch_size: 2, seed: 3}
augment: [mirror, {intensity: {scale: 0.2, shift: 0.1}}]
targets: [affinities]
"""


@FUZZ
@given(position=st.integers(0, len(BASE) - 1), length=st.integers(0, 8),
       insert=st.text(alphabet="[]{}:,-&*!|>'\"# \n\tabcxyz0129.", max_size=8))
def test_fuzzed_configs_give_a_config_or_a_config_error(position, length, insert):
    text = BASE[:position] + insert + BASE[position + length:]
    load_config(BASE)  # the unmutated config is valid
    try:
        load_config(text)
    except ConfigError as error:
        assert error.reason and str(error).startswith("<string>") or "line" in str(error), str(error)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("stored") / "volume.h5"
    rng = np.random.default_rng(3)
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=rng.integers(1, 256, (16, 48, 48), dtype=np.uint8), chunks=(4, 16, 16),
                         compression="gzip")
        f.create_dataset("labels", data=rng.integers(1, 9, (16, 48, 48), dtype=np.uint64), chunks=(4, 16, 16))
    return path.read_bytes()


@FUZZ
@given(cut=st.one_of(st.none(), st.floats(0.0, 1.0)), flips=st.lists(
    st.tuples(st.floats(0.0, 1.0), st.integers(1, 255)), max_size=4), lazy=st.booleans())
def test_damaged_files_give_correct_batches_or_a_clear_error(stored, tmp_path_factory, cut, flips, lazy):
    """Damage where the data lives (the compressed raw chunks, beyond the metadata): truncated or flipped. The
    loader delivers the original data or raises; uncompressed labels are left intact, since HDF5 keeps no
    checksum that could tell a flipped label byte."""
    data, chunks = bytearray(stored), stored_chunks(stored)
    if cut is not None:
        start, end = chunks[0][0], chunks[-1][0] + chunks[-1][1]
        data = data[:start + int(cut * (end - start))]
    for where, value in flips:
        offset, size = chunks[int(where * (len(chunks) - 1))]
        position = offset + int(where * (size - 1))
        if position < len(data):
            data[position] ^= value
    path = tmp_path_factory.mktemp("damaged") / "volume.h5"
    path.write_bytes(bytes(data))
    try:
        raw = ef.hdf5(path, "raw", in_memory=not lazy)
        labels = ef.hdf5(path, "labels", in_memory=not lazy)
        with ef.Loader(raw, labels, patch=(4, 16, 16), batch_size=2, seed=1, augment=[],
                       normalize=(1.0, 0.0)) as loader:
            for _ in range(6):
                batch = loader.next_batch()
                for n, (z, y, x) in enumerate(batch.positions):
                    window = (slice(z, z + 4), slice(y, y + 16), slice(x, x + 16))
                    np.testing.assert_array_equal(batch["raw"][n, 0], ORIGINAL["raw"][window])
                    np.testing.assert_array_equal(batch["labels"][n, 0], ORIGINAL["labels"][window])
        event("the original data")
    except (OSError, ValueError, RuntimeError) as error:
        event(f"{type(error).__name__}")
        assert "volume.h5" in str(error) or "zlib" in str(error) or "chunk" in str(error), str(error)
    assert threads_end()


ORIGINAL = {}


def stored_chunks(stored):
    """(byte offset, size) of every raw chunk of the stored file, in file order."""
    import io

    with h5py.File(io.BytesIO(stored), "r") as f:
        dataset = f["raw"]
        chunks = sorted((info.byte_offset, info.size) for info in
                        (dataset.id.get_chunk_info(i) for i in range(dataset.id.get_num_chunks())))
        if not ORIGINAL:
            ORIGINAL.update(raw=f["raw"][()], labels=f["labels"][()])
    return chunks


def test_two_loaders_on_one_lazy_file_in_one_process(stored, tmp_path):
    path = tmp_path / "volume.h5"
    path.write_bytes(stored)
    with h5py.File(path, "r") as f:
        raw = f["raw"][()]

    def stream(volume, seed):
        with ef.Loader(volume, patch=(4, 16, 16), seed=seed, augment=[], threads=2, normalize=(1.0, 0.0)) as loader:
            return [(b.positions.copy(), b["raw"].copy()) for b in (loader.next_batch() for _ in range(10))]

    shared = ef.hdf5(path, "raw", in_memory=False, cache_bytes=2**16)  # a small cache: many reads
    results = {}
    workers = [threading.Thread(target=lambda s=s: results.__setitem__(s, stream(shared, s))) for s in (1, 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for seed in (1, 2):
        for positions, batch in results[seed]:
            for n, (z, y, x) in enumerate(positions):
                np.testing.assert_array_equal(batch[n, 0], raw[z:z + 4, y:y + 16, x:x + 16])


def _digests_in_a_process(path, seed):
    import hashlib

    with ef.Loader(ef.hdf5(path, "raw", in_memory=False), ef.hdf5(path, "labels", in_memory=False),
                   patch=(4, 16, 16), seed=seed, threads=2) as loader:
        return [hashlib.sha256(b["raw"].tobytes() + b["labels"].tobytes()).hexdigest()
                for b in (loader.next_batch() for _ in range(8))]


def test_loaders_in_several_processes_read_one_file(stored, tmp_path):
    """As under torch.distributed: one loader per process, all on one HDF5 file."""
    path = tmp_path / "volume.h5"
    path.write_bytes(stored)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        spawned = pool.starmap(_digests_in_a_process, [(str(path), 1), (str(path), 2)])
    assert spawned == [_digests_in_a_process(str(path), 1), _digests_in_a_process(str(path), 2)]


@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_short_soak_keeps_threads_slots_and_memory_flat(device):
    """The CI-sized version of ``python benchmarks/soak.py --batches 100000``."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
    spec = importlib.util.spec_from_file_location("soak", path)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    result = soak.soak(3000, threads=2, device=device, every=150, shape=(24, 96, 96), patch=(8, 32, 32))
    assert len(result["thread_counts"]) == 1
    assert max(result["slots"]) <= 2 + 2 + 1  # buffers (threads + 2), plus the one the loop keeps: bounded
    if device == "cpu":  # the fake device starts a thread per copy and records every guard: memory of its own
        # a kept batch of this size is 1 MiB: leaking one per batch would add about 1 GiB per 1,000 batches;
        # allocator warm-up in a short run shows as up to some 100 KiB per 1,000
        assert result["rss_slope_bytes_per_1000"] < 4 * 2**20


def test_a_config_run_writes_only_into_the_cache_directory_and_never_touches_its_inputs(tmp_path, monkeypatch):
    import hashlib

    from emfast.cli import main

    data, cache, home, cwd = (tmp_path / name for name in ("data", "cache", "home", "cwd"))
    for folder in (data, home, cwd):
        folder.mkdir()
    rng = np.random.default_rng(1)
    with h5py.File(data / "a.h5", "w") as f:
        f.create_dataset("raw", data=rng.integers(0, 256, (16, 48, 48), dtype=np.uint8))
        f.create_dataset("labels", data=rng.integers(1, 9, (16, 48, 48), dtype=np.uint64))
    (data / "train.yaml").write_text(
        "data: {samples: [{name: A, file: a.h5, raw: raw, labels: labels}, "
        "{name: B, file: {builtin: demo, shape: [16, 48, 48]}, raw: volumes/raw, labels: volumes/labels/neuron_ids}]}\n"
        "loader: {patch: [4, 16, 16], batch_size: 2, normalize: volume}\ntargets: [affinities]\n")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in data.iterdir()}
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(cache))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.chdir(cwd)
    assert main(["check", str(data / "train.yaml")]) == 0
    with load_config(data / "train.yaml").loader() as loader:
        loader.next_batch()
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in data.iterdir()} == before
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(data)]
    assert written and all(p.is_relative_to(cache) for p in written), written


def test_a_lazy_file_removed_under_the_loader_is_still_read_correctly(stored, tmp_path):
    """POSIX keeps an open file's data until it is closed: removing the path does not disturb the loader."""
    path = tmp_path / "volume.h5"
    path.write_bytes(stored)
    with h5py.File(path, "r") as f:
        raw = f["raw"][()]
    volume = ef.hdf5(path, "raw", in_memory=False, cache_bytes=2**16)
    with ef.Loader(volume, patch=(4, 16, 16), augment=[], normalize=(1.0, 0.0), seed=4) as loader:
        loader.next_batch()
        path.unlink()
        for batch in (loader.next_batch() for _ in range(20)):
            for n, (z, y, x) in enumerate(batch.positions):
                np.testing.assert_array_equal(batch["raw"][n, 0], raw[z:z + 4, y:y + 16, x:x + 16])
