"""Small conveniences users reach for: ``len(loader)``, ``volume[z0:z1, y0:y1, x0:x1]`` and value statistics in
``emfast info``."""
import numpy as np
import pytest

import emfast as ef


# -- len(loader) --------------------------------------------------------------------------------------------------

def _raw(seed=0, shape=(16, 32, 32)):
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


def test_len_is_epoch_size_and_one_epoch_yields_that_many_batches():
    with ef.Loader(_raw(), patch=(4, 8, 8), batch_size=2, epoch_size=5, augment=()) as loader:
        assert len(loader) == 5
        assert sum(1 for _ in loader) == 5
        assert len(loader) == 5  # a length, not what is left


def test_len_of_tiled_sampler_is_its_epoch():
    # (16, 32, 32) tiled by (4, 8, 8) windows at their own stride: 4 * 4 * 4 = 64 tiles, 10 per batch -> 7 batches
    with ef.Loader(_raw(), patch=(4, 8, 8), batch_size=10, sampler=ef.Tiled(), augment=()) as loader:
        assert len(loader) == loader.sampler.batches_per_epoch() == 7
        assert sum(1 for _ in loader) == 7


def test_len_of_endless_stream_is_a_type_error_that_says_why():
    loader = ef.Loader(_raw(), patch=(4, 8, 8), batch_size=2, augment=())
    with pytest.raises(TypeError, match="endless.*epoch_size"):
        len(loader)
    loader.close()


# -- volume[z0:z1, y0:y1, x0:x1] ----------------------------------------------------------------------------------

def _random_item(rng, size):
    """A random int or slice along an axis of ``size``: negative, out-of-range bounds and steps included."""
    if rng.random() < 0.25:
        return int(rng.integers(-size, size))
    def bound():
        return None if rng.random() < 0.2 else int(rng.integers(-size - 3, size + 4))

    step = None if rng.random() < 0.4 else int(rng.choice([-3, -2, -1, 1, 2, 3, 5]))
    return slice(bound(), bound(), step)


def _random_key(rng, shape):
    key = tuple(_random_item(rng, s) for s in shape)
    form = rng.integers(4)
    if form == 1:
        return key[:int(rng.integers(1, 3))]  # trailing axes taken whole
    if form == 2:
        at = int(rng.integers(0, 3))
        return key[:at] + (Ellipsis,) + key[at + 1:]
    return key[0] if form == 3 else key


@pytest.mark.parametrize("dtype, channels", [(np.uint8, None), (np.float32, 2), (np.uint64, None)])
def test_getitem_matches_numpy_lazy_and_in_memory(tmp_path, dtype, channels):
    import h5py
    rng = np.random.default_rng(7)
    spatial = (9, 13, 11)
    full = (channels,) + spatial if channels else spatial
    data = (rng.random(full) * 1000).astype(dtype)
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as file:
        file.create_dataset("v", data=data, chunks=((channels,) if channels else ()) + (4, 5, 3))
    reference = data if channels else data[np.newaxis]  # channels first, as read_box and np.asarray give them
    in_memory = ef.hdf5(path, "v")
    with ef.hdf5(path, "v", in_memory=False) as lazy:
        assert not lazy.in_memory
        for _ in range(300):
            key = _random_key(rng, spatial)
            whole = key if isinstance(key, tuple) else (key,)
            expected = reference[(slice(None),) + whole]
            for volume in (in_memory, lazy):
                got = volume[key]
                assert got.dtype == expected.dtype and got.shape == expected.shape, key
                np.testing.assert_array_equal(got, expected, err_msg=repr(key))
                assert got.flags.c_contiguous and not np.shares_memory(got, reference)


def test_getitem_result_is_a_copy_of_an_in_memory_volume():
    array = _raw()
    box = ef.Volume.from_array(array)[2:4, :5, 1]
    box[...] = 0
    assert array[2:4, :5, 1].any()  # writing to the result leaves the volume alone


@pytest.mark.parametrize("key, error, message", [
    ((0, 0, 0, 0), IndexError, "too many indices"),
    ((Ellipsis, 0, Ellipsis), IndexError, "single ellipsis"),
    ((16,), IndexError, "out of bounds for axis z of size 16"),
    ((0, -33), IndexError, "index -33 is out of bounds for axis y of size 32"),
    ((np.array([1, 2]),), TypeError, "integers and slices"),
    (([1, 2],), TypeError, "integers and slices"),
    ((True,), TypeError, "integers and slices"),
    ((0, 1.5), TypeError, "along y"),
    ((None,), TypeError, "integers and slices"),
])
def test_getitem_refuses_what_it_cannot_read(key, error, message):
    volume = ef.Volume.from_array(_raw(), name="raw.h5:raw")
    with pytest.raises(error, match=message) as caught:
        volume[key]
    assert "raw.h5:raw" in str(caught.value)


def test_getitem_of_a_lazy_volume_refuses_a_box_over_the_limit(tmp_path, monkeypatch):
    import h5py
    from emfast.io import _volume
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as file:
        file.create_dataset("v", data=_raw(), chunks=(4, 8, 8))
    monkeypatch.setattr(_volume, "ASARRAY_LIMIT_BYTES", 1000)
    with ef.hdf5(path, "v", in_memory=False) as lazy:
        assert lazy[0:2, 0:10, 0:10].shape == (1, 2, 10, 10)  # 200 bytes
        with pytest.raises(ValueError, match=r"v.h5:v.*\(4, 32, 32\) voxels.*read_box"):
            lazy[0:4, ::31, ::31]  # 4 x 2 x 2 voxels, but a box spanning 4 x 32 x 32 is read


# -- emfast info: value statistics --------------------------------------------------------------------------------

def _values_lines(out):
    return [line.strip() for line in out.splitlines() if line.strip().startswith("values from")]


def test_info_summarises_raw_and_labels_of_a_small_file_exactly(tmp_path, capsys):
    import h5py
    from emfast.cli import main
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 2 ** 16, (12, 20, 20), dtype=np.uint16)
    labels = rng.choice(np.array([0, 5, 9, 2 ** 40], np.uint64), (12, 20, 20))
    with h5py.File(tmp_path / "s.h5", "w") as file:
        file.create_dataset("volumes/raw", data=raw, chunks=(4, 10, 10))
        file.create_dataset("volumes/labels/neuron_ids", data=labels)  # contiguous: sampled in blocks
        file.create_dataset("ids_uint16", data=labels.astype(np.uint16) % 7)  # a name that says labels
        file.create_dataset("lookup", data=np.arange(5))  # 1-D: not a volume, no values
    assert main(["info", str(tmp_path / "s.h5")]) == 0
    out = capsys.readouterr().out
    ids16, label_line, raw_line = _values_lines(out)
    assert "all 12 chunks" in raw_line and "at most 16 chunks or 64 MiB" in raw_line
    assert (f"min={raw.min()} max={raw.max()} mean={raw.mean():.6g} std={raw.std():.6g}") in raw_line
    assert "all 1 chunk " in label_line
    fraction = np.count_nonzero(labels == 0) / labels.size
    assert f"3 labels besides 0 (background: {fraction:.1%} of voxels), highest: 1099511627776, 9, 5" in label_line
    present = np.unique(labels.astype(np.uint16) % 7)
    assert f"{np.count_nonzero(present)} labels besides 0" in ids16
    assert len(_values_lines(out)) == 3  # none for the 1-D dataset


def test_info_reads_a_bounded_sample_of_chunks_spread_over_the_volume(tmp_path, capsys, monkeypatch):
    import zarr
    from emfast import cli
    rng = np.random.default_rng(4)
    raw = rng.random((16, 32, 32), dtype=np.float32) + np.arange(16, dtype=np.float32)[:, None, None]
    store = zarr.open_array(str(tmp_path / "s.zarr"), mode="w", shape=raw.shape, chunks=(4, 8, 8), dtype=raw.dtype)
    store[:] = raw
    monkeypatch.setattr(cli, "INFO_SAMPLE_CHUNKS", 4)
    read = []
    real_read_box = ef.Volume.read_box
    monkeypatch.setattr(ef.Volume, "read_box",
                        lambda self, c, e, out: read.append(c) or real_read_box(self, c, e, out))
    assert cli.main(["info", str(tmp_path / "s.zarr")]) == 0
    line, = _values_lines(capsys.readouterr().out)
    # 64 chunks in a 4 x 4 x 4 grid; grid indices 0, 21, 42, 63 are read: first, last and two between
    assert read == [(0, 0, 0), (4, 8, 8), (8, 16, 16), (12, 24, 24)]
    sample = np.concatenate([raw[z:z + 4, y:y + 8, x:x + 8].ravel() for z, y, x in read])
    assert "4 of 64 chunks, spread over the volume (0.00391 MiB; at most 4 chunks" in line
    assert f"min={sample.min():.6g} max={sample.max():.6g} mean={sample.mean(dtype=np.float64):.6g}" in line


def test_info_names_nan_in_a_float_volume(tmp_path, capsys):
    import h5py
    from emfast.cli import main
    raw = np.ones((4, 8, 8), np.float32)
    raw[1, 2, 3] = np.nan
    with h5py.File(tmp_path / "s.h5", "w") as file:
        file.create_dataset("raw", data=raw)
    assert main(["info", str(tmp_path / "s.h5")]) == 0
    line, = _values_lines(capsys.readouterr().out)
    assert "contains NaN or infinity" in line


def test_every_rank_of_a_tiled_validation_makes_as_many_batches_even_one_without_tiles():
    """64 tiles over 7 ranks (10 for rank 0, 9 for the others): every rank makes as many batches, as torch's
    DistributedSampler gives every rank as many samples (uneven ranks hang DistributedDataParallel). A short
    rank's last batch holds fewer real tiles (``valid``), none at all with batches of 3, and the augmentations
    and targets take it."""
    labels = (np.arange(16 * 32 * 32, dtype=np.uint64).reshape(16, 32, 32) // 7)
    augment = [ef.Intensity(), ef.MissingSection(p=0.5)]
    counts, valids = set(), {}
    for rank, tiles_short in ((0, 0), (6, 1)):
        with ef.Loader(ef.Sample(_raw(), labels=labels), patch=(4, 8, 8), batch_size=5, sampler=ef.Tiled(),
                       augment=augment, targets=[ef.Affinities()], rank=rank, world_size=7) as loader:
            batches = list(loader)
        counts.add(len(batches))
        valids[rank] = [batch.valid for batch in batches]
    assert counts == {2} and valids == {0: [5, 5], 6: [5, 4]}
    with ef.Loader(_raw(), patch=(4, 8, 8), batch_size=3, sampler=ef.Tiled(), augment=augment, rank=6,
                   world_size=7) as loader:  # 10 or 9 tiles, batches of 3: 4 batches, the last of rank 6 empty
        assert [batch.valid for batch in loader] == [3, 3, 3, 0]
