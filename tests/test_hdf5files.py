"""The files of lazily read HDF5 volumes, parked (closed) beyond a bound and opened again when read
(``emfast.io._hdf5files``): the same windows as when every file stays open, and a parked file that is no longer
the one opened is refused, named."""
import os
import signal

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import CorruptChunkError, _hdf5files


@pytest.fixture
def bound(monkeypatch):
    """At most ``bound.most`` files held open (3 unless a test sets it), whatever the descriptor limit."""
    class Bound:
        most = 3
    monkeypatch.setattr(_hdf5files, "FEWEST_OPEN", 1)
    monkeypatch.setattr(_hdf5files.OPEN_FILES, "_most", lambda: Bound.most)
    return Bound


def _files(tmp_path, count: int, shape=(24, 40, 40)) -> list:
    rng = np.random.default_rng(7)
    arrays = []
    for i in range(count):
        arrays.append(rng.integers(0, 255, shape, dtype=np.uint8))
        with h5py.File(tmp_path / f"{i}.h5", "w") as f:
            f.create_dataset("raw", data=arrays[-1], chunks=(8, 16, 16), compression="gzip")
    return arrays


def _batches(volumes, seed: int, count: int) -> list:
    dataset = ef.Dataset([ef.Sample(volume, name=str(i)) for i, volume in enumerate(volumes)])
    with ef.Loader(dataset, patch=(8, 24, 24), batch_size=4, threads=2, augment=(), seed=seed,
                   normalize=None) as loader:
        return [np.array(loader.next_batch()["raw"]) for _ in range(count)]


def test_parked_files_give_the_windows_of_open_ones(tmp_path, bound):
    """12 lazily read HDF5 volumes, at most 3 files open, two producer threads: the batches equal those of the
    same volumes read in memory, and no more than the bound stay open once the loader closed."""
    arrays = _files(tmp_path, 12)
    lazy = [ef.open(tmp_path / f"{i}.h5", "raw", in_memory=False, cache_bytes=64 << 10) for i in range(12)]
    assert _hdf5files.OPEN_FILES.count <= 3
    expected = _batches([ef.Volume.from_array(a) for a in arrays], seed=3, count=12)
    got = _batches(lazy, seed=3, count=12)
    for ours, theirs in zip(got, expected):
        np.testing.assert_array_equal(ours, theirs)
    assert _hdf5files.OPEN_FILES.count <= 3
    reopened = [volume for volume in lazy if volume.chunk_cache._source._file is None]
    assert reopened, "no file was parked: the test tests nothing"
    for volume in lazy:
        volume.close()
    assert _hdf5files.OPEN_FILES.count == 0


def test_a_parked_file_replaced_or_removed_is_named(tmp_path, bound):
    """A parked file cannot be read through its descriptor: another file at its path is refused as a changed
    file (an open one would read on), a removed one as gone, each naming the volume."""
    bound.most = 1
    arrays = _files(tmp_path, 3)
    first, second, third = (ef.open(tmp_path / f"{i}.h5", "raw", in_memory=False, cache_bytes=64 << 10)
                            for i in range(3))
    out = np.empty((1, 8, 16, 16), np.uint8)
    second.read_box((0, 0, 0), (8, 16, 16), out)  # the first and third parked
    np.testing.assert_array_equal(out[0], arrays[1][:8, :16, :16])
    assert first.chunk_cache._source._file is None and third.chunk_cache._source._file is None

    os.replace(tmp_path / "1.h5", tmp_path / "moved.h5")  # the first file's path now holds the second's
    os.replace(tmp_path / "moved.h5", tmp_path / "0.h5")
    assert first.chunk_cache._source.changed_since_opened()
    with pytest.raises(CorruptChunkError, match=r"0\.h5:raw: its file changed since the volume was opened"):
        first.read_box((0, 0, 0), (8, 16, 16), out)

    os.remove(tmp_path / "0.h5")  # no HDF5 file there any more: changed too, not h5py's "file signature not found"
    (tmp_path / "0.h5").write_bytes(bytes(1000))
    with pytest.raises(CorruptChunkError, match=r"0\.h5:raw: its file changed since the volume was opened"):
        first.read_box((0, 0, 0), (8, 16, 16), out)

    os.remove(tmp_path / "2.h5")
    assert not third.chunk_cache._source.changed_since_opened()  # nothing there: the read says what
    with pytest.raises(FileNotFoundError, match=r"2\.h5:raw: the file is gone since the volume was opened"):
        third.read_box((0, 0, 0), (8, 16, 16), out)
    second.read_box((8, 16, 16), (8, 16, 16), out)  # the open one reads on, though its path is gone
    np.testing.assert_array_equal(out[0], arrays[1][8:16, 16:32, 16:32])


def test_a_parked_file_reopened_unchanged_reads_on_and_a_closed_volume_stays_closed(tmp_path, bound):
    bound.most = 1
    arrays = _files(tmp_path, 2)
    first, second = (ef.open(tmp_path / f"{i}.h5", "raw", in_memory=False) for i in range(2))
    assert first.chunk_cache._source._file is None  # parked by the second's opening
    np.testing.assert_array_equal(np.asarray(first)[0], arrays[0])
    assert second.chunk_cache._source._file is None and first.chunk_cache._source._file is not None
    assert "shape=(24, 40, 40)" in first.chunk_cache._source.describe()
    second.close()
    with pytest.raises(ValueError, match=r"1\.h5:raw: the volume was closed"):
        np.asarray(second)


def test_a_file_parked_while_its_status_is_read_is_not_taken_for_another(tmp_path, bound, monkeypatch):
    """A review: another thread parked the file between its descriptor's lookup and its fstat, and reopened
    another file on that descriptor number: the untouched file was called changed, and its Loader failed."""
    bound.most = 1
    _files(tmp_path, 2)
    first, second = (ef.open(tmp_path / f"{i}.h5", "raw", in_memory=False) for i in range(2))
    out = np.empty((1, 8, 16, 16), np.uint8)
    first.read_box((0, 0, 0), (8, 16, 16), out)  # the first open, the second parked
    real = os.fstat

    def racing(descriptor):  # what another thread may do at this moment
        monkeypatch.setattr(os, "fstat", real)
        with _hdf5files.OPEN_FILES._lock:
            files = _hdf5files.OPEN_FILES._park_beyond(0)
        _hdf5files.close_files(files)
        second.read_box((0, 0, 0), (8, 16, 16), out)  # reopened on the lowest free descriptor
        return real(descriptor)

    monkeypatch.setattr(os, "fstat", racing)
    assert not first.chunk_cache._source.changed_since_opened()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() (POSIX)")
def test_a_forked_child_reopens_a_file_another_thread_was_reopening(tmp_path, bound):
    """A DataLoader worker forked while a thread of the parent reopened a parked file inherited that file's lock
    held, and hung at its first read of it (a review: 14 of 40 children)."""
    bound.most = 1
    arrays = _files(tmp_path, 2)
    first, _ = (ef.open(tmp_path / f"{i}.h5", "raw", in_memory=False) for i in range(2))
    source = first.chunk_cache._source
    assert source._file is None  # parked
    with source._reopen_lock:  # as a thread reopening it holds it
        child = os.fork()
        if child == 0:  # pragma: no cover - the child's outcome is its exit status
            signal.alarm(20)  # a hang ends the child with SIGALRM
            ok = np.array_equal(np.asarray(first)[0], arrays[0])
            os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_volume_closed_while_another_thread_reopened_it_is_not_listed_again(tmp_path, bound):
    _files(tmp_path, 1)
    volume = ef.open(tmp_path / "0.h5", "raw", in_memory=False)
    source = volume.chunk_cache._source
    volume.close()
    _hdf5files.OPEN_FILES.opened(source)  # a reader that got past its reopen just before close()
    assert _hdf5files.OPEN_FILES.count == 0
