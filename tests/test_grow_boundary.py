"""GrowBoundary: boundaries between objects grown into them, against gunpowder's GrowBoundary as documented
(reference.py), in the kernel and through loaders, whose labels and targets must equal those of the whole volume
grown."""
import h5py
import numpy as np
import pytest

import emfast as ef
from emfast._core import targets as _targets
from emfast.config import ConfigError, load_config
from reference import (affinities_reference, assert_releases_gil, class_weights_reference, grow_boundary_reference,
                       seg_to_affgraph)

LABEL_DTYPES = [np.uint32, np.uint64, np.int64, np.int32]


def blocky_labels(rng, shape, ids=4, block=3, dtype=np.uint64):
    """Objects of ``block`` voxels along y and x (one section thick), so that boundaries and insides both occur."""
    coarse = rng.integers(0, ids, (shape[0],) + tuple(-(-s // block) for s in shape[1:]))
    return coarse.repeat(block, 1).repeat(block, 2)[:, :shape[1], :shape[2]].astype(dtype)


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
def test_the_kernel_matches_grow_boundary(rng, dtype):
    for trial in range(30):
        shape = (2, 1) + tuple(int(n) for n in rng.integers(1, (7, 14, 31)))
        labels = blocky_labels(rng, shape[2:], block=1 + trial % 3, dtype=dtype)[None, None].repeat(2, 0)
        labels[1] = rng.permutation(labels[1].reshape(-1)).reshape(labels[1].shape)
        known = None if trial % 3 == 0 else (rng.random(shape) < 0.8).astype(np.uint8)
        steps, in_plane = [1, 2, 3, 4, 7, 12][trial % 6], trial % 5 == 0
        background = [0, 1, -1 if np.dtype(dtype).kind == "i" else 3][trial % 3]
        expected = grow_boundary_reference(labels, known, steps, in_plane, background)
        grown = _targets.grow_boundary(labels.copy(), known, steps, in_plane, background)
        np.testing.assert_array_equal(grown, expected)
        assert (grown != labels).any() or trial % 3 == 0 or not labels.any()


def test_a_boundary_by_hand():
    # two objects side by side along x: one step takes one voxel from each side of their contact, none at the
    # patch's edges, and background never grows
    labels = np.array([[[[[1, 1, 1, 2, 2, 2, 0, 0]]]]], np.uint32)
    _targets.grow_boundary(labels, None, 1, False, 0)
    assert labels.reshape(-1).tolist() == [1, 1, 0, 0, 2, 0, 0, 0]
    known = np.array([[[[[1, 1, 1, 1, 1, 0, 1, 1]]]]], np.uint8)
    labels = np.array([[[[[1, 1, 1, 2, 2, 2, 0, 0]]]]], np.uint32)
    _targets.grow_boundary(labels, known, 1, False, 0)
    assert labels.reshape(-1).tolist() == [1, 1, 0, 0, 2, 2, 0, 0]  # masked voxels neither change nor erode


def volume(rng, shape=(16, 48, 48)):
    labels = blocky_labels(rng, shape, block=4)
    raw = rng.integers(0, 255, shape).astype(np.uint8)
    mask = (rng.random(shape) < 0.9).astype(np.uint8)
    return raw, labels, mask


@pytest.mark.parametrize("grow", [ef.GrowBoundary(), ef.GrowBoundary(steps=2, in_plane=True),
                                  ef.GrowBoundary(labels_mask=True)], ids=["3d", "in plane", "mask"])
def test_a_loaders_labels_and_targets_are_those_of_the_whole_volume_grown(rng, grow):
    raw, labels, mask = volume(rng)
    whole = grow_boundary_reference(labels[None, None], mask[None, None] if grow.labels_mask else None, grow.steps,
                                    grow.in_plane)[0, 0]
    offsets = [(-1, 0, 0), (0, -2, 0), (0, 0, -1)]
    affinities = affinities_reference(whole[None, None], offsets)[0][0]
    patch = (4, 16, 16)
    with ef.Loader(ef.Sample(raw, labels, mask=mask), patch=patch, batch_size=4, seed=3,
                   augment=["intensity", grow], targets=[ef.Affinities(offsets=offsets)]) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            for b, corner in enumerate(batch.positions):
                window = tuple(slice(c, c + n) for c, n in zip(corner, patch))
                np.testing.assert_array_equal(batch["labels"][b, 0], whole[window])
                np.testing.assert_array_equal(batch["affinities"][b], affinities[(slice(None),) + window])
            assert (batch["labels"] == 0).any()


def test_the_unlabelled_region_is_the_labels_before_they_grow(rng):
    """A port of lsd's recipe (GrowBoundary, then AddAffinities with an unlabelled array of labels != 0) found
    the voxels grown into background counted as unlabelled (every affinity between two of them, or to the
    membrane, masked: the masked-in share 0.59 against gunpowder's 0.73). gunpowder's unlabelled array is apart
    from the labels it grows: affinities there stay 0 and are trained on."""
    raw, labels, _ = volume(rng)
    grown = grow_boundary_reference(labels[None, None], None, 1, True)[0, 0]
    offsets = [(-1, 0, 0), (0, -1, 0), (0, 0, -1)]
    affinities, known = affinities_reference(grown[None, None], offsets)
    both_unlabelled = seg_to_affgraph((labels == 0).astype(np.int32), offsets)  # gunpowder: 1 - (labels != 0)
    mask = known[0] * (1 - both_unlabelled)
    targets = [ef.Affinities(offsets=offsets, unlabelled=0), ef.ClassWeights()]
    with ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), batch_size=4, seed=3, augment=[
            ef.GrowBoundary(in_plane=True)], targets=targets) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            for b, corner in enumerate(batch.positions):
                window = (slice(None),) + tuple(slice(c, c + n) for c, n in zip(corner, (4, 16, 16)))
                np.testing.assert_array_equal(batch["affinities"][b], affinities[0][window])
                np.testing.assert_array_equal(batch["affinities_mask"][b], mask[window])
            np.testing.assert_allclose(batch["affinities_weights"],
                                       class_weights_reference(batch["affinities"], batch["affinities_mask"]),
                                       rtol=1e-6)


def test_a_slip_after_the_grow_is_refused_where_the_unlabelled_region_could_not_follow(rng):
    """A last read: the unlabelled region, kept apart from the labels before GrowBoundary, did not move with a
    Slip listed after it (2617 affinities masked between voxels of objects in 5 batches)."""
    raw, labels, _ = volume(rng)
    targets = [ef.Affinities(unlabelled=0)]
    with pytest.raises(ValueError, match=r"Slip moves labels after GrowBoundary changed the labels, .* list Slip "
                                         r"before GrowBoundary"):
        ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), augment=[ef.GrowBoundary(), ef.Slip()], targets=targets)
    # fine: the other order, a Slip leaving the labels in place (it marks them unknown), or no region
    for augment, those in [([ef.Slip(), ef.GrowBoundary()], targets),
                           ([ef.GrowBoundary(), ef.Slip(labels="mask")], targets),
                           ([ef.GrowBoundary(), ef.Slip()], [ef.Affinities()])]:
        ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), augment=augment, targets=those).close()


def test_mirrored_and_lazy_loaders_grow_the_same_labels(rng, tmp_path):
    raw, labels, mask = volume(rng)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        for name, data in (("raw", raw), ("labels", labels), ("mask", mask)):
            f.create_dataset(name, data=data, chunks=(4, 16, 16))
    lazy = ef.Sample(*(ef.hdf5(tmp_path / "s.h5", name, in_memory=False) for name in ("raw", "labels", "mask")))
    kwargs = dict(patch=(4, 16, 16), batch_size=4, seed=5, targets=[ef.Boundaries()],
                  augment=["mirror", "transpose", ef.GrowBoundary(steps=2, labels_mask=True)])
    with ef.Loader(ef.Sample(raw, labels, mask=mask), **kwargs) as memory, ef.Loader(lazy, **kwargs) as chunked:
        for _ in range(3):
            one, two = memory.next_batch(), chunked.next_batch()
            for name in ("labels", "mask", "boundaries"):
                np.testing.assert_array_equal(one[name], two[name])


def test_voxels_moved_in_from_outside_do_not_erode_their_neighbours(rng):
    labels = np.full((8, 48, 48), 5, np.uint64)  # one object: nothing to grow but what rotation brings in
    raw = np.zeros(labels.shape, np.uint8)
    with ef.Loader(ef.Sample(raw, labels), patch=(2, 44, 44), batch_size=4, seed=1,
                   augment=[ef.Rotate(angle=45.0), ef.GrowBoundary(steps=2)]) as loader:
        batch = loader.next_batch()
        known = batch["labels_valid"].astype(bool)
        assert not known.all()
        assert (batch["labels"][known] == 5).all()


def test_several_grows_add_up_their_reach(rng):
    """A review: the labels' margin took the largest reach of several GrowBoundary entries, not their sum, so
    the second grow saw labels cut too small (24 voxels differed in one example)."""
    raw, labels, _ = volume(rng)
    once = grow_boundary_reference(labels[None, None], None, 1)
    twice = grow_boundary_reference(grow_boundary_reference(once, None, 2, True), None, 1)[0, 0]
    augment = [ef.GrowBoundary(), ef.GrowBoundary(steps=2, in_plane=True), ef.GrowBoundary()]
    with ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), batch_size=4, seed=3, augment=augment) as loader:
        assert loader.margin == (2, 4, 4)
        batch = loader.next_batch()
        for b, corner in enumerate(batch.positions):
            window = tuple(slice(c, c + n) for c, n in zip(corner, (4, 16, 16)))
            np.testing.assert_array_equal(batch["labels"][b, 0], twice[window])


def test_a_patch_too_large_for_the_reach_names_it(rng):
    raw, labels, _ = volume(rng)
    with pytest.raises(ValueError, match=r"patch \(15, 16, 16\), grown by the labels' margin \(1, 1, 1\) of "
                                         r"GrowBoundary does not fit"):
        ef.Loader(ef.Sample(raw, labels), patch=(15, 16, 16), augment=[ef.GrowBoundary()])


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0), r"steps must be an integer in \[1, 64\]"),
    (dict(steps=65), r"steps must be an integer in \[1, 64\]"),
    (dict(in_plane="no"), "in_plane must be True or False"),
    (dict(labels_mask=1), "labels_mask must be True or False"),
    (dict(background=0.5), "background must be an integer label id"),
])
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ef.GrowBoundary(**kwargs)


def test_what_the_data_cannot_do_is_refused_when_the_loader_is_built(rng):
    raw, labels, mask = volume(rng)
    with pytest.raises(ValueError, match="GrowBoundary changes the labels, but the data has none"):
        ef.Loader(raw, patch=(4, 16, 16), augment=[ef.GrowBoundary()])
    with pytest.raises(ValueError, match=r"background -1 cannot occur in uint64 labels"):
        ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), augment=[ef.GrowBoundary(background=-1)])
    with pytest.raises(ValueError, match=r"GrowBoundary\(labels_mask=True\) masks with the sample's mask, but the "
                                         "data has none"):
        ef.Loader(ef.Sample(raw, labels), patch=(4, 16, 16), augment=[ef.GrowBoundary(labels_mask=True)])


def test_the_kernel_refuses_bad_arguments():
    labels = np.zeros((1, 1, 2, 3, 4), np.uint32)
    with pytest.raises(ValueError, match=r"steps must be in \[1, 64\]"):
        _targets.grow_boundary(labels, None, 65, False, 0)
    with pytest.raises(ValueError, match="known must be shaped like the labels"):
        _targets.grow_boundary(labels, np.ones((1, 1, 2, 3, 5), np.uint8), 1, False, 0)
    with pytest.raises(ValueError, match="must be writeable"):
        readonly = labels.copy()
        readonly.flags.writeable = False
        _targets.grow_boundary(readonly, None, 1, False, 0)
    with pytest.raises(ValueError, match="background 4294967296 cannot occur in uint32 labels"):
        _targets.grow_boundary(labels, None, 1, False, 2**32)


def test_a_config_names_grow_boundary(rng, tmp_path):
    raw, labels, _ = volume(rng)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f["raw"], f["labels"] = raw, labels
    text = ("data:\n  samples:\n    - {name: s, file: s.h5, raw: raw, labels: labels}\n"
            "loader: {patch: [4, 16, 16], batch_size: 2}\naugment:\n  - grow_boundary: {steps: 2, in_plane: %s}\n")
    (tmp_path / "good.yaml").write_text(text % "true")
    with load_config(tmp_path / "good.yaml").loader() as loader:
        batch = loader.next_batch()
        whole = grow_boundary_reference(labels[None, None], None, 2, True)[0, 0]
        for b, corner in enumerate(batch.positions):
            window = tuple(slice(c, c + n) for c, n in zip(corner, (4, 16, 16)))
            np.testing.assert_array_equal(batch["labels"][b, 0], whole[window])
    (tmp_path / "bad.yaml").write_text(text % "maybe")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml")
    assert info.value.path == "augment[0].grow_boundary.in_plane", str(info.value)


def test_the_avx2_build_and_the_baseline_grow_the_same_labels(rng, tmp_path):
    """The kernel runs an AVX2 build where the CPU has one; EMFAST_NO_AVX2 (read at import, so in a process of
    its own here) runs the baseline: the same labels, for every way the kernel walks or spreads."""
    import os
    import subprocess
    import sys

    labels = blocky_labels(rng, (6, 40, 41), ids=6, block=2)[None, None].repeat(2, 0)
    known = (rng.random(labels.shape) < 0.9).astype(np.uint8)
    np.save(tmp_path / "labels.npy", labels)
    np.save(tmp_path / "known.npy", known)
    cases = [(steps, in_plane) for steps in (1, 2, 5) for in_plane in (False, True)]
    script = (f"import numpy as np; from emfast._core import targets as t; assert not t.grow_uses_avx2(); "
              f"labels, known = np.load({str(tmp_path / 'labels.npy')!r}), np.load({str(tmp_path / 'known.npy')!r}); "
              f"np.save({str(tmp_path / 'baseline.npy')!r}, np.stack([t.grow_boundary(labels.copy(), k, s, p, 0) "
              f"for s, p in {cases!r} for k in (None, known)]))")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, env=dict(os.environ, EMFAST_NO_AVX2="1"))
    ours = np.stack([_targets.grow_boundary(labels.copy(), k, s, p, 0) for s, p in cases for k in (None, known)])
    np.testing.assert_array_equal(ours, np.load(tmp_path / "baseline.npy"))


def test_the_kernel_releases_the_gil(rng):
    labels = blocky_labels(rng, (32, 128, 128))[None, None].repeat(4, 0)
    assert_releases_gil(_targets.grow_boundary, labels, None, 2, False, 0)
