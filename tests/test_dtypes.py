"""Raw int8/int16/uint32/float16/float64 and int32 labels through the loader, in memory and lazy, against NumPy."""
import numpy as np
import pytest
import zarr

import emfast as ef
from emfast.io import volume_statistics
from emfast.pipeline._normalize import DEFAULT_NORMALIZATION
from reference import random_volume

NEW_RAW = [np.int8, np.int16, np.uint32, np.float16, np.float64]
SHAPE = (12, 40, 44)
PATCH = (4, 16, 20)


def write_zarr(path, data, chunks=(4, 16, 16)):
    array = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=2)
    array[...] = data
    return path


def batches(raw, labels=None, count=2, **kwargs):
    options = dict(patch=PATCH, batch_size=3, seed=3, augment=())
    options.update(kwargs)
    with ef.Loader(raw, labels, **options) as loader:
        return [batch.copy() | {"positions": batch.positions.copy()} for _, batch in zip(range(count), loader)]


@pytest.mark.parametrize("dtype", NEW_RAW)
@pytest.mark.parametrize("lazy", [False, True])
def test_new_raw_dtypes_are_converted_with_their_default_normalisation(tmp_path, rng, dtype, lazy):
    raw = random_volume(rng, SHAPE, dtype)
    source = ef.open(write_zarr(tmp_path / "raw.zarr", raw), in_memory=False) if lazy else raw
    scale, shift = (np.float32(v) for v in DEFAULT_NORMALIZATION[np.dtype(dtype)])
    for batch in batches(source):
        for n, corner in enumerate(batch["positions"]):
            window = raw[tuple(slice(c, c + p) for c, p in zip(corner, PATCH))]
            expected = window.astype(np.float32) * scale + shift
            np.testing.assert_array_equal(batch["raw"][n, 0], expected)
    if lazy:
        source.close()


@pytest.mark.parametrize("dtype", NEW_RAW)
def test_lazy_augmented_batches_equal_in_memory_ones(tmp_path, rng, dtype):
    raw = random_volume(rng, SHAPE, dtype)
    augment = [ef.Mirror(), ef.Transpose(), ef.Rotate(angle=20)]
    expected = batches(raw, augment=augment, dtype="float16")
    with ef.open(write_zarr(tmp_path / "raw.zarr", raw, (5, 9, 16)), in_memory=False) as lazy:
        got = batches(lazy, augment=augment, dtype="float16")
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(have["raw"].view(np.uint16), want["raw"].view(np.uint16))


def test_default_normalisation_maps_each_integer_range_onto_0_1():
    for dtype in (np.uint8, np.uint16, np.int8, np.int16, np.uint32):
        info = np.iinfo(dtype)
        scale, shift = DEFAULT_NORMALIZATION[np.dtype(dtype)]
        ends = np.array([info.min, info.max], dtype).astype(np.float32) * np.float32(scale) + np.float32(shift)
        np.testing.assert_allclose(ends, [0.0, 1.0], atol=1e-6, err_msg=str(dtype))
    for dtype in (np.float16, np.float32, np.float64):
        assert DEFAULT_NORMALIZATION[np.dtype(dtype)] == (1.0, 0.0)


def test_float16_output_beyond_its_range_is_infinity_as_documented():
    """README: a normalised value beyond +-65504 in float16 output becomes infinity (the kernels round to
    nearest, as NumPy's float32 -> float16 cast does)."""
    raw = np.full((4, 8, 8), 70000.0, np.float32)
    raw[:, :, :4] = 60000.0
    with ef.Loader(raw, patch=(4, 8, 8), batch_size=1, dtype="float16", augment=()) as loader:
        out = loader.next_batch()["raw"][0, 0]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, raw.astype(np.float16))
    assert np.isinf(out[:, :, 4:]).all() and (out[:, :, :4] == np.float16(60000.0)).all()


@pytest.mark.parametrize("dtype", NEW_RAW)
def test_statistics_of_the_new_raw_dtypes_equal_numpy(rng, dtype):
    raw = random_volume(rng, (6, 20, 30), dtype)
    statistics = volume_statistics(raw, cache=False)
    exact = raw.astype(np.float64)
    assert statistics.min == exact.min() and statistics.max == exact.max()
    assert statistics.mean == pytest.approx(exact.mean(), rel=1e-12, abs=1e-9)
    assert statistics.std == pytest.approx(exact.std(), rel=1e-9)
    if np.dtype(dtype).itemsize <= 2 and np.dtype(dtype).kind == "i":  # counted exactly in a histogram
        assert statistics.p0_5 == np.percentile(raw, 0.5) and statistics.p99_5 == np.percentile(raw, 99.5)


@pytest.mark.parametrize("lazy", [False, True])
def test_int32_labels_with_negative_ids_are_ordinary_ids(tmp_path, rng, lazy):
    """Negative ids are objects like any other; background and ignore may be negative (documented)."""
    raw = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    labels = rng.integers(-2, 3, (SHAPE[0], SHAPE[1] // 2, SHAPE[2] // 2)).astype(np.int32)
    labels = labels.repeat(2, 1).repeat(2, 2)
    source = ef.open(write_zarr(tmp_path / "labels.zarr", labels), in_memory=False) if lazy else labels
    targets = [ef.Affinities(offsets=[(0, 0, 1)], background=-1, ignore=-2)]
    for batch in batches(raw, source, targets=targets):
        for n, corner in enumerate(batch["positions"]):
            window = labels[tuple(slice(c, c + p) for c, p in zip(corner, PATCH))]
            np.testing.assert_array_equal(batch["labels"][n, 0], window)
            a, b = window[..., :-1], window[..., 1:]
            np.testing.assert_array_equal(batch["affinities"][n, 0, ..., :-1], (a == b) & (a != -1))
            np.testing.assert_array_equal(batch["affinities_mask"][n, 0, ..., :-1], (a != -2) & (b != -2))
    if lazy:
        source.close()


def test_balanced_sampling_finds_negative_int32_ids(rng):
    raw = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    labels = np.zeros(SHAPE, np.int32)
    labels[4:8, 10:30, 12:32] = -7
    sampler = ef.Balanced(classes={-7: "object"})
    for batch in batches(raw, labels, sampler=sampler, count=3):
        for corner in batch["positions"]:
            centre = tuple(int(c) + (p - 1) // 2 for c, p in zip(corner, PATCH))
            assert labels[centre] == -7
