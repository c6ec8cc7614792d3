"""Per-volume statistics: equal to NumPy's, one streaming pass, cached beside (never inside) the user's file."""
import hashlib
import json
import os

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import _stats as stats_module
from emfast.io._stats import PERCENTILES, STATS_FORMAT_VERSION, volume_statistics
from reference import random_volume


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """A private cache directory, and slabs and pieces small enough that every volume takes several."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(directory))
    monkeypatch.setattr(stats_module, "_SLAB_BYTES", 3000)
    monkeypatch.setattr(stats_module, "_PIECE", 700)
    return directory


@pytest.fixture
def slab_reads(monkeypatch):
    """Counts the slabs every volume yields (the only way statistics read a volume)."""
    count = [0]
    original = ef.Volume.slabs

    def counting(self, *args, **kwargs):
        for item in original(self, *args, **kwargs):
            count[0] += 1
            yield item

    monkeypatch.setattr(ef.Volume, "slabs", counting)
    return count


def write(path, data, **kwargs):
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=data, **kwargs)


def assert_matches_numpy(statistics, data):
    wide = data.astype(np.float64)
    np.testing.assert_allclose(statistics.mean, wide.mean(), rtol=1e-13)
    np.testing.assert_allclose(statistics.std, wide.std(), rtol=1e-12)
    assert (statistics.min, statistics.max, statistics.count) == (data.min(), data.max(), data.size)
    if data.dtype.kind == "u":
        assert (statistics.p0_5, statistics.p99_5) == tuple(np.percentile(data, PERCENTILES))
    else:
        assert statistics.p0_5 is None and statistics.p99_5 is None


@pytest.mark.parametrize("shape", [(9, 14, 11), (3, 9, 14, 11)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_statistics_equal_numpy(rng, dtype, shape):
    data = random_volume(rng, shape, dtype)
    assert_matches_numpy(volume_statistics(data), data)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_lazy_volumes_are_read_in_slabs_not_whole(tmp_path, rng, slab_reads, dtype):
    data = random_volume(rng, (2, 21, 13, 17), dtype)
    write(tmp_path / "v.h5", data, chunks=(1, 4, 8, 8), compression="gzip")
    with ef.hdf5(tmp_path / "v.h5", "raw", in_memory=False) as volume:
        assert_matches_numpy(volume_statistics(volume, cache=False), data)
        assert volume.cache_stats.misses == 0  # the chunk cache was left alone
    sections = 3000 // (2 * 13 * 17 * np.dtype(dtype).itemsize)  # per slab: 6, 3, 1; 6 -> 4 (chunks of 4)
    assert slab_reads[0] == -(-21 // (4 if sections >= 4 else sections))


def test_few_distinct_values_and_constant_volumes(rng):
    data = (rng.integers(0, 3, (5, 7, 9)) * 1000).astype(np.uint16)
    assert_matches_numpy(volume_statistics(data), data)
    constant = np.full((4, 4, 4), 3.5, np.float32)
    statistics = volume_statistics(constant)
    assert (statistics.mean, statistics.std, statistics.min, statistics.max) == (3.5, 0.0, 3.5, 3.5)


def test_float_variance_is_accurate_far_from_zero(rng):
    # a large mean with a tiny spread: a running sum of squares would lose every significant digit
    data = (1e4 + rng.standard_normal((8, 20, 20))).astype(np.float32)
    assert_matches_numpy(volume_statistics(data), data)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_infinity_names_the_volume_and_voxel(tmp_path, bad):
    data = np.ones((2, 12, 6, 5), np.float32)
    data[1, 9, 4, 3] = bad
    with pytest.raises(ValueError, match=r"volume: contains NaN or infinity.*\(1, 9, 4, 3\)"):
        volume_statistics(data)
    write(tmp_path / "nan.h5", data)
    with ef.hdf5(tmp_path / "nan.h5", "raw", in_memory=False) as volume:
        with pytest.raises(ValueError, match=r"nan\.h5:raw: contains NaN or infinity.*\(1, 9, 4, 3\)"):
            volume_statistics(volume)


def test_non_raw_volumes_and_arguments_are_refused():
    with pytest.raises(TypeError, match=r"labels: statistics are for raw volumes.*not uint64"):
        volume_statistics(ef.Volume.from_array(np.zeros((2, 2, 2), np.uint64), name="labels"))
    with pytest.raises(TypeError, match="Volume"):
        volume_statistics([[[1]]])
    with pytest.raises(TypeError, match="cache must be True or False"):
        volume_statistics(np.zeros((2, 2, 2), np.uint8), cache="yes")


@pytest.mark.parametrize("in_memory", [True, False])
def test_cache_is_written_then_reused_without_reading(tmp_path, rng, cache_dir, slab_reads, in_memory):
    data = random_volume(rng, (10, 12, 14), np.uint16)
    path = tmp_path / "v.h5"
    write(path, data, chunks=(2, 6, 7))
    with ef.hdf5(path, "raw", in_memory=in_memory) as volume:
        first = volume_statistics(volume)
    reads = slab_reads[0]
    assert reads > 1
    files = list((cache_dir / "stats").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"
    content = json.loads(files[0].read_text())
    stat = path.stat()
    assert content["key"] == {"format": STATS_FORMAT_VERSION, "path": str(path.resolve()), "dataset": "raw",
                              "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    with ef.hdf5(path, "raw", in_memory=in_memory) as volume:  # a new volume of the same, unchanged file
        assert volume_statistics(volume) == first
    assert slab_reads[0] == reads  # not read again
    assert_matches_numpy(first, data)


def test_cache_is_invalidated_when_the_file_changes(tmp_path, rng, slab_reads):
    path = tmp_path / "v.h5"
    data = random_volume(rng, (6, 8, 8), np.uint8)
    write(path, data)
    first = volume_statistics(ef.hdf5(path, "raw"))
    reads = slab_reads[0]
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touch
    assert volume_statistics(ef.hdf5(path, "raw")) == first
    assert slab_reads[0] == 2 * reads  # recomputed
    other = random_volume(rng, (6, 8, 8), np.uint8)
    write(path, other)  # rewritten with new data
    assert_matches_numpy(volume_statistics(ef.hdf5(path, "raw")), other)
    assert slab_reads[0] == 3 * reads


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_cache_of_a_store_is_invalidated_when_its_chunks_are_rewritten(tmp_path, rng, slab_reads, zarr_format):
    """zarr-python rewrites chunks in place without touching the array's metadata file: the statistics of the old
    data were reused (a whole-volume batch normalised by them had mean 10 and std 3), now they are recomputed."""
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "v.zarr"
    first, second = (random_volume(rng, (6, 8, 8), np.uint8) for _ in range(2))
    zarr.create_array(path, shape=first.shape, chunks=(3, 4, 4), dtype=np.uint8, zarr_format=zarr_format)[...] = first
    assert_matches_numpy(volume_statistics(ef.open(path, in_memory=False)), first)
    reads = slab_reads[0]
    assert_matches_numpy(volume_statistics(ef.open(path, in_memory=False)), first)
    assert slab_reads[0] == reads  # cached while the chunks stay as they were
    zarr.open_array(path, mode="r+")[...] = second
    assert_matches_numpy(volume_statistics(ef.open(path, in_memory=False)), second)
    assert slab_reads[0] > reads


def _external_link(tmp_path, data):
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=(3, 4, 4))
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f["raw"] = h5py.ExternalLink("data.h5", "raw")


def _virtual(tmp_path, data):
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=(3, 4, 4))
    layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
    layout[...] = h5py.VirtualSource(str(tmp_path / "data.h5"), "raw", shape=data.shape)
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f.create_virtual_dataset("raw", layout)


@pytest.mark.parametrize("link", [_external_link, _virtual], ids=["external-link", "virtual"])
def test_cache_follows_the_file_an_hdf5_link_or_virtual_dataset_reads(tmp_path, rng, link):
    """main.h5 stays as it was while the file holding its data is rewritten: the statistics of the old data were
    reused (batches with mean 494, std 30 instead of 0 and 1)."""
    first, second = random_volume(rng, (6, 8, 8), np.uint8), random_volume(rng, (6, 8, 8), np.uint8) // 4
    link(tmp_path, first)
    main = tmp_path / "main.h5"
    state = main.stat()
    assert_matches_numpy(volume_statistics(ef.hdf5(main, "raw", in_memory=False)), first)
    with h5py.File(tmp_path / "data.h5", "r+") as f:
        f["raw"][...] = second
    assert main.stat().st_mtime_ns == state.st_mtime_ns
    assert_matches_numpy(volume_statistics(ef.hdf5(main, "raw", in_memory=False)), second)


def test_file_changed_after_opening_is_not_cached(tmp_path, rng, cache_dir):
    path = tmp_path / "v.h5"
    write(path, random_volume(rng, (6, 8, 8), np.uint8))
    with ef.hdf5(path, "raw", in_memory=False) as volume:
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        volume_statistics(volume)
    assert not cache_dir.exists()


def test_users_file_is_left_unchanged(tmp_path, rng):
    path = tmp_path / "v.h5"
    write(path, random_volume(rng, (6, 8, 8), np.float32), chunks=(2, 4, 4))
    digest, mtime = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns
    for in_memory in (True, False, True):
        with ef.hdf5(path, "raw", in_memory=in_memory) as volume:
            volume_statistics(volume)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest and path.stat().st_mtime_ns == mtime


def test_arrays_and_cache_false_write_no_cache(tmp_path, rng, cache_dir):
    volume_statistics(random_volume(rng, (4, 4, 4), np.uint8))
    write(tmp_path / "v.h5", random_volume(rng, (4, 4, 4), np.uint8))
    volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw"), cache=False)
    assert not cache_dir.exists()


def test_unreadable_cache_entry_is_recomputed_and_replaced(tmp_path, rng, cache_dir, slab_reads):
    data = random_volume(rng, (6, 8, 8), np.uint8)
    write(tmp_path / "v.h5", data)
    first = volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw"))
    (entry,) = (cache_dir / "stats").iterdir()
    entry.write_text("{not json")
    assert volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw")) == first
    assert json.loads(entry.read_text())["statistics"]["mean"] == first.mean
    assert [p.name for p in (cache_dir / "stats").iterdir()] == [entry.name]  # no temporary left behind


@pytest.mark.parametrize("damage", [{"std": None}, {"mean": None}, {"std": "a"}, {"std": float("nan")},
                                    {"std": -1.0}, {"min": 1e300}, {"count": 0}])
def test_a_cache_entry_with_impossible_values_is_recomputed(tmp_path, rng, cache_dir, damage):
    """A hand-edited or damaged entry under the right key was believed: TypeError, or "constant volume (std 0)
    cannot be standardised" blaming the user's data."""
    data = random_volume(rng, (6, 8, 8), np.uint8)
    write(tmp_path / "v.h5", data)
    first = volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw"))
    (entry,) = (cache_dir / "stats").iterdir()
    content = json.loads(entry.read_text())
    content["statistics"].update(damage)
    entry.write_text(json.dumps(content))
    assert volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw")) == first


def test_a_cache_entry_nested_too_deep_for_json_is_recomputed(tmp_path, rng, cache_dir):
    """json.load raised RecursionError, which the damaged-entry check did not catch: the Loader failed (a review)."""
    data = random_volume(rng, (6, 8, 8), np.uint8)
    write(tmp_path / "v.h5", data)
    first = volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw"))
    (entry,) = (cache_dir / "stats").iterdir()
    entry.write_text("[" * 100000)
    assert volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw")) == first


def test_a_store_opened_in_memory_then_rewritten_caches_nothing(tmp_path, rng, cache_dir):
    """Its statistics describe the data read when it was opened, but a key taken from the chunk files now
    described the new data: later runs normalised the new data with the old statistics (batches with mean 1.9
    and std 5.2)."""
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "v.zarr"
    first, second = (random_volume(rng, (6, 8, 8), np.uint8) for _ in range(2))
    zarr.create_array(path, shape=first.shape, chunks=(3, 4, 4), dtype=np.uint8)[...] = first
    volume = ef.open(path)  # in memory
    zarr.open_array(path, mode="r+")[...] = second  # chunks rewritten in place, the metadata untouched
    assert_matches_numpy(volume_statistics(volume), first)
    assert_matches_numpy(volume_statistics(ef.open(path, in_memory=False)), second)


def test_unwritable_cache_dir_warns_and_still_answers(tmp_path, rng, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(blocker / "cache"))  # below a regular file: cannot be created
    data = random_volume(rng, (6, 8, 8), np.uint16)
    write(tmp_path / "v.h5", data)
    with pytest.warns(RuntimeWarning, match=r"cannot cache volume statistics in .*a-file/cache"):
        statistics = volume_statistics(ef.hdf5(tmp_path / "v.h5", "raw"))
    assert_matches_numpy(statistics, data)


def test_no_home_at_all_computes_the_statistics_and_says_why_nothing_is_cached(tmp_path, rng, monkeypatch, capsys):
    """A container run as a user with no passwd entry and no HOME: ``Path.home()`` raised RuntimeError from the
    statistics cache, so every lazy loader and ``normalize="volume"`` failed (and the CLI called it a bug)."""
    import pwd
    from emfast.cli import main

    def no_such_user(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for name in ("HOME", "EMFAST_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_such_user)
    data = random_volume(rng, (6, 8, 8), np.uint16)
    write(tmp_path / "v.h5", data)
    with pytest.warns(RuntimeWarning, match=r"no folder to cache in: HOME is not set and this user has no home "
                                            r"directory; set EMFAST_CACHE_DIR .*; volume statistics are recomputed"):
        statistics = volume_statistics(ef.open(tmp_path / "v.h5/raw", in_memory=False))
    assert_matches_numpy(statistics, data)
    assert main(["demo", "--batches", "1"]) == 2  # the demo volume needs a folder: told in one line
    assert capsys.readouterr().err.splitlines()[-1].startswith("emfast: error: emfast has no folder to cache in")


def test_a_store_folder_that_cannot_be_listed_is_never_fingerprinted_as_empty(tmp_path, rng, monkeypatch, capsys):
    """On a mount whose folders may be entered but not listed, os.walk skipped them silently: the store's
    fingerprint held no chunk files, so statistics of rewritten data were reused, a resume after the input
    changed was accepted, and ``emfast info`` printed "(no arrays)". Now statistics are not cached (a warning),
    and predict and info say which folder cannot be listed."""
    import errno
    zarr = pytest.importorskip("zarr")
    from emfast.cli import main

    path = tmp_path / "s.zarr"
    data = rng.integers(0, 256, (6, 8, 8), dtype=np.uint8)
    zarr.create_array(str(path), name="raw", shape=data.shape, chunks=(3, 4, 4), dtype=np.uint8)[...] = data
    real_scandir = os.scandir

    def unlistable(folder="."):
        if str(folder).startswith(str(path)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
        return real_scandir(folder)

    monkeypatch.setattr(os, "scandir", unlistable)
    with pytest.warns(RuntimeWarning, match=r"cannot list .*s.zarr.*Permission denied.*; volume statistics are not "
                                            r"cached"):
        assert_matches_numpy(volume_statistics(ef.open(path / "raw", in_memory=False)), data)
    with pytest.raises(OSError, match=r"cannot list .*s.zarr.*: Permission denied; emfast notices changes"):
        ef.predict(lambda batch: batch, path / "raw", tmp_path / "p.zarr/p", patch_in=(6, 8, 8))
    assert main(["info", str(path)]) == 2
    assert "cannot list" in capsys.readouterr().err


def test_an_in_memory_volume_read_from_a_file_cannot_be_changed_in_place(tmp_path, rng, monkeypatch):
    """Its statistics are cached under the file's key: clipped in place (np.asarray(volume) was a writeable view),
    its statistics went to the cache as the file's, and a later unchanged open of the file got them (a minmax batch
    reaching 3.98; a review). The array is read-only; a copy may be changed, and is no longer the file."""
    import pickle

    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path / "cache"))
    data = rng.integers(0, 200, (8, 16, 16)).astype(np.uint8)
    with h5py.File(tmp_path / "raw.h5", "w") as f:
        f["raw"] = data
    volume = ef.hdf5(tmp_path / "raw.h5", "raw")
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(volume)[...] = np.minimum(np.asarray(volume), 50)
    assert not pickle.loads(pickle.dumps(volume)).array.flags.writeable
    assert volume_statistics(volume).max == data.max()
    clipped = np.minimum(np.array(volume), 50)  # a copy: an array of its own, no file behind it
    assert ef.Volume.from_array(clipped).stamp is None and volume_statistics(ef.Volume.from_array(clipped)).max == 50
    assert volume_statistics(ef.hdf5(tmp_path / "raw.h5", "raw")).max == data.max()
