"""Warps and section defects through the loader: raw, labels and mask stay aligned; unknown voxels are marked."""
import h5py
import numpy as np
import pytest

import emfast as ef

SHAPE = (24, 48, 48)


def coordinate_sample(lazy_path=None):
    """Raw channels hold each voxel's (z, y, x); labels hold its linear index + 1; the mask its parity."""
    grid = np.indices(SHAPE).astype(np.float32)
    labels = (np.arange(np.prod(SHAPE), dtype=np.uint64) + 1).reshape(SHAPE)
    mask = (labels % 2).astype(np.uint8)
    if lazy_path is None:
        return ef.Sample(grid, labels, mask=mask)
    with h5py.File(lazy_path, "w") as f:
        f.create_dataset("raw", data=grid, chunks=(3, 8, 16, 16))
        f.create_dataset("labels", data=labels, chunks=(8, 16, 16))
        f.create_dataset("mask", data=mask, chunks=(8, 16, 16))
    return ef.Sample(*(ef.hdf5(lazy_path, name, in_memory=False) for name in ("raw", "labels", "mask")))


def decode(labels):
    index = np.maximum(labels.astype(np.int64) - 1, 0)  # 0: filled (unknown) voxels
    return np.stack(np.unravel_index(index, SHAPE)).astype(np.float32)


@pytest.mark.parametrize("lazy", [False, True])
def test_labels_come_from_the_coordinate_raw_says(tmp_path, lazy):
    sample = coordinate_sample(tmp_path / "coords.h5" if lazy else None)
    augment = ["mirror", "transpose", ef.Rotate(), ef.Elastic()]
    with ef.Loader(sample, patch_in=(6, 24, 24), patch_out=(4, 16, 16), batch_size=4, seed=3, augment=augment,
                   targets=[ef.Affinities()], normalize=(1.0, 0.0)) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            raw = batch["raw"][:, :, 1:-1, 4:-4, 4:-4]           # the output window inside the input window
            known = batch["labels_valid"][:, 0].astype(bool)
            coordinates = decode(batch["labels"][:, 0])           # (3, B, Z, Y, X)
            expected = np.moveaxis(raw, 1, 0)
            assert known.any()
            assert np.all(np.abs(coordinates - expected)[:, known] <= 0.5 + 1e-3)
            assert np.all(batch["mask"][:, 0][known] == batch["labels"][:, 0][known] % 2)
            assert not batch["affinities_mask"][:, 0][~known].any()


def test_voxels_rotated_in_from_outside_are_filled_and_marked():
    sample = coordinate_sample()
    rotate = ef.Rotate(angle=45.0)
    with ef.Loader(sample, patch=(2, 44, 44), batch_size=8, seed=1, augment=[rotate],
                   targets=[ef.Affinities()]) as loader:
        batch = loader.next_batch()
        unknown = batch["labels_valid"] == 0
        assert unknown.any()
        assert np.all(batch["labels"][unknown] == 0)
        assert not batch["affinities_mask"][:, :1][unknown].any()
        # the y and x channels compare v with v - 1 along their axis: an unknown neighbour masks v too
        mask = batch["affinities_mask"]
        assert not mask[:, 1, :, 1:, :][unknown[:, 0, :, :-1, :]].any()
        assert not mask[:, 2, :, :, 1:][unknown[:, 0, :, :, :-1]].any()


def test_plain_transforms_in_a_warped_loader_equal_the_gather_path():
    sample = coordinate_sample()
    rotate = ef.Rotate(p=0.0)
    kwargs = dict(patch=(4, 16, 16), batch_size=4, seed=5, normalize=(1.0, 0.0))
    with ef.Loader(sample, augment=["mirror", "transpose", rotate], **kwargs) as warped, \
            ef.Loader(sample, augment=["mirror", "transpose"], **kwargs) as plain:
        a, b = warped.next_batch(), plain.next_batch()
        assert np.array_equal(a.perms, b.perms) and np.array_equal(a.positions, b.positions)
        np.testing.assert_array_equal(a["raw"], b["raw"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert a["labels_valid"].all()


def test_slipped_labels_follow_raw_and_masked_slips_mark_labels_unknown():
    sample = coordinate_sample()
    for labels_mode in ("shift", "mask"):
        slip = ef.Slip(p=0.5, labels=labels_mode)
        with ef.Loader(sample, patch=(8, 16, 16), batch_size=4, seed=2, augment=[slip],
                       normalize=(1.0, 0.0)) as loader:
            batch = loader.next_batch()
            known = batch["labels_valid"][:, 0].astype(bool)
            coordinates = decode(batch["labels"][:, 0])
            raw = np.moveaxis(batch["raw"], 1, 0)
            agree = np.all(coordinates == raw, axis=0)
            assert not known.all()
            if labels_mode == "shift":
                assert np.all(agree[known])
            else:
                assert np.all(agree | ~known) and not np.all(agree)


def test_augmentation_objects_are_not_changed_by_a_loader():
    elastic = ef.Elastic()
    sample = coordinate_sample()
    with ef.Loader(sample, patch=(4, 16, 16), batch_size=2, augment=[elastic]) as loader:
        loader.next_batch()
    assert elastic.grid is None


@pytest.mark.parametrize("mode", ["slip", "step"])
def test_a_slip_moves_the_mask_with_the_labels(mode):
    """Slip(labels="shift") keeps each label on its raw voxel; the mask gating the labels must move with them (it
    stayed: a third of the known voxels had another voxel's mask). The label window carries the targets' margin
    and the mask does not, so their sections start at different raw sections, and a label moved in from the
    margin is known where the mask, moved in from outside its own window, is 0: excluded, never wrong."""
    slip = ef.Slip(p=0.5, mode=mode, labels="shift")
    with ef.Loader(coordinate_sample(), patch_in=(6, 24, 24), patch_out=(4, 16, 16), batch_size=4, seed=2,
                   augment=[slip], targets=[ef.Affinities()], normalize=(1.0, 0.0)) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            known = batch["labels_valid"][:, 0].astype(bool)
            labels, mask = batch["labels"][:, 0], batch["mask"][:, 0]
            assert known.any() and not known.all()
            agrees = mask[known] == labels[known] % 2
            assert agrees.mean() > 0.9 and not mask[known][~agrees].any()
            assert not mask[~known].any()
