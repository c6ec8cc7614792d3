"""Affinities(labels_mask=True): the sample's mask masks every affinity touching a voxel outside it, as
gunpowder's AddAffinities(labels_mask=...) defines it, alone and through loaders (in memory, lazy, warped)."""
import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.config import ConfigError, load_config
from reference import class_weights_reference, seg_to_affgraph

OFFSETS = [(-1, 0, 0), (0, -3, 0), (0, 0, 2)]
SHAPE = (20, 40, 40)


def masked_volume(seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(1, 4, SHAPE).astype(np.uint64).repeat(2, axis=2)[:, :, :SHAPE[2]]
    mask = (rng.random(SHAPE) < 0.8).astype(np.uint8)
    raw = rng.integers(0, 255, SHAPE).astype(np.uint8)
    return raw, labels, mask


def test_the_mask_of_the_affinities_is_gunpowders_with_labels_mask(rng):
    labels = rng.integers(0, 4, (2, 1, 9, 16, 15)).astype(np.uint32)
    mask = (rng.random(labels.shape) < 0.7).astype(np.uint8) * np.uint8(255)  # non-zero is inside
    margin = (1, 3, 2)
    out = ef.compute_targets(labels, [ef.Affinities(offsets=OFFSETS, labels_mask=True)], margin, mask=mask)
    plain = ef.compute_targets(labels, [ef.Affinities(offsets=OFFSETS)], margin)
    inner = tuple(slice(m, n - m) for m, n in zip(margin, labels.shape[2:]))
    for b in range(labels.shape[0]):
        gunpowder = seg_to_affgraph((mask[b, 0] != 0).astype(np.int32), OFFSETS)[(slice(None),) + inner]
        np.testing.assert_array_equal(out["affinities_mask"][b], plain["affinities_mask"][b] * gunpowder)
    np.testing.assert_array_equal(out["affinities"], plain["affinities"])  # the values are the labels' alone
    assert (out["affinities_mask"] < plain["affinities_mask"]).any()


def test_a_labels_mask_on_labels_cut_without_the_offsets_margin_masks_as_gunpowder(rng):
    """The last read: compute_targets(mask=) on labels cut with less margin than the offsets failed (the mask's
    neighbour views ran past the patch); such affinities are masked already, the rest as gunpowder's."""
    labels = rng.integers(0, 4, (2, 1, 6, 12, 11)).astype(np.uint32)
    mask = (rng.random(labels.shape) < 0.7).astype(np.uint8)
    out = ef.compute_targets(labels, [ef.Affinities(offsets=OFFSETS, labels_mask=True)], mask=mask)
    plain = ef.compute_targets(labels, [ef.Affinities(offsets=OFFSETS)])
    for b in range(2):
        gunpowder = seg_to_affgraph(mask[b, 0].astype(np.int32), OFFSETS)
        np.testing.assert_array_equal(out["affinities_mask"][b], plain["affinities_mask"][b] * gunpowder)


def test_a_loaders_affinities_are_masked_where_the_volumes_mask_is_0():
    raw, labels, mask = masked_volume()
    margin = (1, 3, 2)
    full_mask = seg_to_affgraph(mask.astype(np.int32), OFFSETS)  # gunpowder's, over the whole volume
    targets = [ef.Affinities(offsets=OFFSETS, labels_mask=True), ef.ClassWeights()]
    with ef.Loader(ef.Sample(raw, labels, mask=mask), patch=(4, 16, 16), batch_size=4, seed=2, augment=[],
                   targets=targets) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            for b, corner in enumerate(batch.positions):
                window = tuple(slice(c, c + n) for c, n in zip(corner, (4, 16, 16)))
                np.testing.assert_array_equal(batch["mask"][b, 0], mask[window])
                np.testing.assert_array_equal(batch["labels"][b, 0], labels[window])
                np.testing.assert_array_equal(batch["affinities_mask"][b], full_mask[(slice(None),) + window])
            np.testing.assert_allclose(batch["affinities_weights"],
                                       class_weights_reference(batch["affinities"], batch["affinities_mask"]),
                                       rtol=1e-6)
    assert all(corner[a] >= margin[a] for corner in batch.positions for a in range(3))


@pytest.mark.parametrize("lazy", [False, True])
def test_windows_fit_a_mask_smaller_than_the_labels_with_the_margin(tmp_path, lazy):
    """A review: windows were fitted inside the mask without the margin it is now cut with, so the first batch
    near its edge failed (IndexError, or a lazy read outside the chunk grid)."""
    raw, labels, _ = masked_volume(2)
    corner, extent = (2, 5, 6), (14, 28, 30)
    mask = (np.random.default_rng(4).random(extent) < 0.8).astype(np.uint8)
    padded = np.zeros(SHAPE, np.uint8)  # gunpowder reads the mask padded with 0 beyond its box
    padded[tuple(slice(c, c + e) for c, e in zip(corner, extent))] = mask
    full_mask = seg_to_affgraph(padded.astype(np.int32), OFFSETS)
    if lazy:
        with h5py.File(tmp_path / "m.h5", "w") as f:
            f.create_dataset("mask", data=mask, chunks=(4, 8, 8))
        mask = ef.hdf5(tmp_path / "m.h5", "mask", in_memory=False)
    margin = np.array((1, 3, 2))
    with ef.Loader(ef.Sample(raw, labels, mask=mask, mask_offset=corner), patch=(4, 16, 16), batch_size=8, seed=1,
                   augment=[], targets=[ef.Affinities(offsets=OFFSETS, labels_mask=True)]) as loader:
        for _ in range(10):
            batch = loader.next_batch()
            for b, start in enumerate(batch.positions):
                assert (start - margin >= corner).all()
                assert (start + (4, 16, 16) + margin <= np.add(corner, extent)).all()
                window = tuple(slice(c, c + n) for c, n in zip(start, (4, 16, 16)))
                np.testing.assert_array_equal(batch["affinities_mask"][b], full_mask[(slice(None),) + window])


def test_lazy_and_in_memory_loaders_give_the_same_masked_batches(tmp_path):
    raw, labels, mask = masked_volume(1)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        for name, data in (("raw", raw), ("labels", labels), ("mask", mask)):
            f.create_dataset(name, data=data, chunks=(4, 16, 16))
    lazy = ef.Sample(*(ef.hdf5(tmp_path / "s.h5", name, in_memory=False) for name in ("raw", "labels", "mask")))
    kwargs = dict(patch=(4, 16, 16), batch_size=4, seed=5, augment=["mirror", "transpose"],
                  targets=[ef.Affinities(offsets=OFFSETS, labels_mask=True)])
    with ef.Loader(ef.Sample(raw, labels, mask=mask), **kwargs) as memory, ef.Loader(lazy, **kwargs) as chunked:
        for _ in range(3):
            one, two = memory.next_batch(), chunked.next_batch()
            for name in ("mask", "labels", "affinities", "affinities_mask"):
                np.testing.assert_array_equal(one[name], two[name])


def test_a_warped_mask_masks_the_affinities_at_the_coordinates_the_labels_come_from():
    """Labels hold each voxel's linear index + 1, so every known label says where it was sampled; the mask there
    must have masked each affinity it touches."""
    labels = (np.arange(np.prod(SHAPE), dtype=np.uint64) + 1).reshape(SHAPE)
    mask = (np.random.default_rng(3).random(SHAPE) < 0.7).astype(np.uint8)
    raw = np.zeros(SHAPE, np.uint8)
    offsets = [(0, -1, 0), (0, 0, -1)]
    with ef.Loader(ef.Sample(raw, labels, mask=mask), patch=(2, 24, 24), batch_size=4, seed=1,
                   augment=[ef.Rotate(angle=30.0)], targets=[ef.Affinities(offsets=offsets, labels_mask=True)],
                   ) as loader:
        batch = loader.next_batch().copy()
    known = batch["labels_valid"][:, 0].astype(bool)
    source = np.maximum(batch["labels"][:, 0].astype(np.int64) - 1, 0)
    inside = mask.reshape(-1)[source].astype(bool) & known          # the volume's mask where each voxel came from
    np.testing.assert_array_equal(batch["mask"][:, 0][known], mask.reshape(-1)[source][known])
    affinity_mask = batch["affinities_mask"]
    assert not affinity_mask[:, 0][~inside].any() and not affinity_mask[:, 1][~inside].any()
    # channel 0 links v with v - 1 along y, channel 1 along x: a neighbour outside the mask masks v
    assert not affinity_mask[:, 0, :, 1:, :][~inside[:, :, :-1, :]].any()
    assert not affinity_mask[:, 1, :, :, 1:][~inside[:, :, :, :-1]].any()
    both = inside[:, :, 1:, :] & inside[:, :, :-1, :]
    assert affinity_mask[:, 0, :, 1:, :][both].all()  # known and inside on both sides: kept
    assert (~inside).any() and both.any()


def test_labels_mask_without_a_mask_is_refused():
    raw, labels, _ = masked_volume()
    with pytest.raises(ValueError, match=r"Affinities\(labels_mask=True\) masks with the sample's mask, but the "
                                         "data has none"):
        ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), targets=[ef.Affinities(labels_mask=True)])
    with pytest.raises(ValueError, match="needs the labels' mask: pass mask="):
        ef.compute_targets(labels[None, None, :4, :8, :8], [ef.Affinities(labels_mask=True)])
    with pytest.raises(ValueError, match="mask must be shaped like the labels"):
        ef.compute_targets(labels[None, None, :4, :8, :8], [ef.Affinities(labels_mask=True)],
                           mask=np.ones((1, 1, 4, 8, 9), np.uint8))
    with pytest.raises(ValueError, match="labels_mask must be True or False"):
        ef.Affinities(labels_mask="yes")


def test_configs_take_labels_mask_and_name_it_when_the_data_has_no_mask(tmp_path):
    raw, labels, mask = masked_volume()
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f["raw"], f["labels"], f["mask"] = raw, labels, mask
    head = "data:\n  samples:\n    - {name: s, file: s.h5, raw: raw, labels: labels%s}\n" \
           "loader: {patch: [4, 16, 16], batch_size: 2}\ntargets:\n  - affinities: {labels_mask: true}\n"
    (tmp_path / "good.yaml").write_text(head % ", mask: mask")
    with load_config(tmp_path / "good.yaml").loader() as loader:
        batch = loader.next_batch()
        assert batch["mask"].shape == batch["labels"].shape
    (tmp_path / "bad.yaml").write_text(head % "")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml").loader()
    assert info.value.path == "targets[0].affinities.labels_mask" and info.value.line == 6, str(info.value)
