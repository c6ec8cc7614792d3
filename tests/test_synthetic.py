"""Tests for the synthetic EM volume generator and its HDF5 cache."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from emfast.io import _demo as synthetic
from emfast.io._demo import (
    LABELS_DATASET,
    RAW_DATASET,
    demo_volume_path,
    make_em_volume,
)

SHAPE = (16, 64, 64)


@pytest.fixture(scope="module")
def volume():
    return make_em_volume(SHAPE, seed=0)


def test_dtypes_and_shapes(volume):
    raw, labels = volume
    assert raw.shape == SHAPE and raw.dtype == np.uint8
    assert labels.shape == SHAPE and labels.dtype == np.uint64


def test_labels_are_consecutive_from_one(volume):
    _, labels = volume
    ids = np.unique(labels)
    assert ids[0] == 1
    np.testing.assert_array_equal(ids, np.arange(1, ids.size + 1))


def test_same_seed_is_identical_and_other_seed_differs(volume):
    raw, labels = volume
    raw2, labels2 = make_em_volume(SHAPE, seed=0)
    np.testing.assert_array_equal(raw, raw2)
    np.testing.assert_array_equal(labels, labels2)
    raw3, labels3 = make_em_volume(SHAPE, seed=1)
    assert not np.array_equal(raw, raw3)
    assert not np.array_equal(labels, labels3)


def test_non_cubic_shape_and_anisotropy():
    raw, labels = make_em_volume((9, 40, 71), seed=3, anisotropy=1.0)
    assert raw.shape == labels.shape == (9, 40, 71)


def test_membranes_are_darker_than_interiors(volume):
    raw, labels = volume
    boundary = np.zeros(labels.shape, dtype=bool)
    boundary[:, :-1, :] |= labels[:, :-1, :] != labels[:, 1:, :]
    boundary[:, :, :-1] |= labels[:, :, :-1] != labels[:, :, 1:]
    assert 0.02 < boundary.mean() < 0.5
    membrane = raw[boundary].mean()
    interior = raw[~boundary].mean()
    assert membrane < interior - 30, (membrane, interior)


def test_intensity_has_texture_and_range(volume):
    raw, _ = volume
    assert raw.std() > 15
    assert 90 < raw.mean() < 200
    # Cells differ in mean brightness.
    raw_d, labels_d = make_em_volume((16, 128, 128), seed=2)
    ids = labels_d.ravel().astype(np.intp)  # NumPy 1.x's bincount takes no uint64
    means = np.bincount(ids, weights=raw_d.ravel()) / np.maximum(np.bincount(ids), 1)
    assert means[1:].std() > 5


def test_cells_are_many_and_elongated_along_z():
    anisotropy = 5.0
    _, labels = make_em_volume((24, 96, 96), seed=0, anisotropy=anisotropy)
    ids = np.unique(labels)
    assert ids.size >= 10
    z_span, y_span = [], []
    for i in ids:
        zz, yy, _ = np.nonzero(labels == i)
        z_span.append(zz.max() - zz.min() + 1)
        y_span.append(yy.max() - yy.min() + 1)
    z_span, y_span = np.array(z_span), np.array(y_span)
    assert np.mean(z_span > 1) > 0.8
    # Physical extent along z exceeds that across, despite fewer voxels.
    assert np.median(z_span * anisotropy) > np.median(y_span)
    assert np.median(z_span) < np.median(y_span)


@pytest.mark.parametrize(
    "shape",
    [
        (7, 64, 64),
        (16, 64),
        (16, 64, 64, 1),
        (16.0, 64, 64),
        (0, 64, 64),
        (-16, 64, 64),
        16,
    ],
)
def test_bad_shape_raises(shape):
    with pytest.raises(ValueError, match="shape"):
        make_em_volume(shape)


@pytest.mark.parametrize("anisotropy", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_anisotropy_raises(anisotropy):
    with pytest.raises(ValueError, match="anisotropy"):
        make_em_volume(SHAPE, anisotropy=anisotropy)


def test_demo_volume_written_once_from_env(tmp_path, monkeypatch):
    cache = tmp_path / "cache" / "nested"
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(cache))
    path = demo_volume_path(shape=SHAPE, seed=4)
    assert path.parent == cache
    assert path.name == f"demo-v{synthetic.DEMO_FORMAT_VERSION}-16x64x64-s4.h5"
    mtime = path.stat().st_mtime_ns
    assert demo_volume_path(shape=SHAPE, seed=4) == path
    assert path.stat().st_mtime_ns == mtime
    # Only the final file: no temporary left behind.
    assert os.listdir(cache) == [path.name]

    raw, labels = make_em_volume(SHAPE, seed=4)
    with h5py.File(path, "r") as f:
        for name, dtype, expected in (
            (RAW_DATASET, np.uint8, raw),
            (LABELS_DATASET, np.uint64, labels),
        ):
            dset = f[name]
            assert dset.dtype == dtype
            assert dset.shape == SHAPE
            assert dset.chunks is not None
            np.testing.assert_array_equal(dset[...], expected)
            resolution = dset.attrs["resolution"]
            assert resolution.dtype == np.float64
            np.testing.assert_array_equal(resolution, [40.0, 8.0, 8.0])
            np.testing.assert_array_equal(dset.attrs["offset"], [0, 0, 0])
        assert f[LABELS_DATASET].compression in ("gzip", "lzf")


def test_demo_volume_cache_dir_argument_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path / "env"))
    path = demo_volume_path(tmp_path / "arg", shape=SHAPE)
    assert path.parent == tmp_path / "arg"
    assert not (tmp_path / "env").exists()


def test_demo_volume_xdg_fallback(tmp_path, monkeypatch):
    monkeypatch.delenv("EMFAST_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = demo_volume_path(shape=SHAPE)
    assert path.parent == tmp_path / "xdg" / "emfast"


def test_demo_volume_failure_leaves_no_temp_file(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(synthetic, "make_em_volume", boom)
    with pytest.raises(RuntimeError):
        demo_volume_path(tmp_path, shape=SHAPE)
    assert os.listdir(tmp_path) == []


def test_unwritable_cache_dir_raises_oserror_naming_the_setting_that_chose_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad = blocker / "cache"
    with pytest.raises(OSError, match=r"give cache_dir \(--cache-dir\) a writable directory") as info:
        demo_volume_path(bad, shape=SHAPE)
    assert str(bad) in str(info.value)
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(bad))
    with pytest.raises(OSError, match="set EMFAST_CACHE_DIR to a writable directory") as info:
        demo_volume_path(None, shape=SHAPE)
    assert str(bad) in str(info.value)


def test_demo_bad_shape_raises(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        demo_volume_path(tmp_path, shape=(4, 64, 64))
    assert os.listdir(tmp_path) == []
