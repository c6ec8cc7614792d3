"""ClassWeights: loss weights balancing a target's classes, against gunpowder's BalanceLabels as documented
(reference.py), alone, after the targets they read, through a loader that masks unknown voxels, and from configs."""
import pickle

import numpy as np
import pytest

import emfast as ef
from emfast._core import targets as _targets
from emfast.config import load_config
from reference import assert_releases_gil, class_weights_reference

CLIPS = [(0.05, 0.95), None, (0.2, None), (None, 0.6), (0.0, 1.0)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float32])
@pytest.mark.parametrize("clip", CLIPS, ids=str)
def test_the_kernel_matches_balance_labels_on_random_classes(rng, dtype, clip):
    for trial in range(12):
        classes = int(rng.integers(1, 6))
        shape = (3, int(rng.integers(1, 4)), 4, 9, 23)
        # skewed class frequencies, so clipping matters; some classes absent
        values = np.minimum(rng.geometric(0.6, shape) - 1, classes - 1).astype(dtype)
        mask = None if trial % 3 == 0 else (rng.random(shape) < 0.7).astype(np.uint8)
        if mask is not None:
            mask[0] = 0  # an example without a voxel to count weighs 0 everywhere
        for per_channel in (False, True):
            out = np.full(shape, 7.0, np.float32)  # every voxel must be written
            low, high = clip if clip is not None else (None, None)
            _targets.balance(values, mask, classes, low, high, per_channel, out)
            expected = class_weights_reference(values, mask, classes, clip, per_channel)
            np.testing.assert_allclose(out, expected, rtol=1e-6, atol=0)


def test_weights_by_hand():
    # 10 voxels: one of class 1. Fractions 0.9 and 0.1 give 1 / (2 * 0.9) and 1 / (2 * 0.1); each class adds 0.5 * 10
    values = np.zeros((1, 1, 1, 1, 10), np.uint8)
    values[..., 3] = 1
    out = np.empty(values.shape, np.float32)
    _targets.balance(values, None, 2, 0.05, 0.95, False, out)
    assert np.allclose(out[..., 3], 5.0) and np.allclose(np.delete(out, 3, axis=-1), 1 / 1.8)
    assert np.isclose(out.sum(), 10.0)
    # one voxel in 40: its fraction 0.025 is clipped to 0.05 (weight 10, not 20); the other 39 are clipped to 0.95
    values = np.zeros((1, 1, 1, 1, 40), np.uint8)
    values[..., 0] = 1
    out = np.empty(values.shape, np.float32)
    _targets.balance(values, None, 2, 0.05, 0.95, False, out)
    assert np.isclose(out[..., 0], 10.0) and np.allclose(out[..., 1:], 1 / 1.9)
    _targets.balance(values, None, 2, None, None, False, out)
    assert np.isclose(out[..., 0], 20.0)
    # outside the mask: 0, and not counted
    mask = np.ones(values.shape, np.uint8)
    mask[..., 20:] = 0
    _targets.balance(values, mask, 2, None, None, False, out)
    assert np.isclose(out[..., 0], 10.0) and not out[..., 20:].any()


def test_affinity_weights_are_computed_from_the_affinities_and_their_mask(rng):
    labels = rng.integers(0, 4, (2, 1, 8, 14, 13)).astype(np.uint64)
    targets = [ef.Affinities(offsets=[(-1, 0, 0), (0, -3, 0), (0, 0, -1)], ignore=3), ef.ClassWeights()]
    out = ef.compute_targets(labels, targets, (1, 3, 1))
    assert set(out) == {"affinities", "affinities_mask", "affinities_weights"}
    assert out["affinities_weights"].shape == out["affinities"].shape
    expected = class_weights_reference(out["affinities"], out["affinities_mask"])
    np.testing.assert_allclose(out["affinities_weights"], expected, rtol=1e-6)
    assert not out["affinities_weights"][out["affinities_mask"] == 0].any()
    unmasked = ef.compute_targets(labels, [targets[0], ef.ClassWeights(mask=False, per="channel", clip=None)],
                                  (1, 3, 1))
    np.testing.assert_allclose(unmasked["affinities_weights"],
                               class_weights_reference(out["affinities"], None, clip=None, per_channel=True),
                               rtol=1e-6)


def test_class_maps_are_balanced_over_their_own_class_ids(rng):
    labels = rng.integers(0, 3, (2, 1, 6, 12, 12)).astype(np.int32)
    spec = ef.Classes(values=(0, 4, 2), dtype="uint8")
    out = ef.compute_targets(labels, [spec, ef.ClassWeights("classes", name="w")], (1, 1, 1))
    # classes default to one more than the largest id: 5, of which 1 and 3 never occur
    np.testing.assert_allclose(out["w"], class_weights_reference(out["classes"], classes=5), rtol=1e-6)


def test_weights_of_a_loader_leave_out_what_the_loader_masked(rng):
    """Voxels rotated in from outside the data are masked after the affinities are computed: the weights must be
    computed after that, from the final mask (and, for a target without a mask, from labels_valid)."""
    labels = rng.integers(1, 4, (24, 48, 48)).astype(np.uint64)
    labels = labels.repeat(2, axis=1).repeat(2, axis=2)[:, :48, :48]
    raw = rng.integers(0, 255, labels.shape).astype(np.uint8)
    targets = [ef.Affinities(), ef.ClassWeights(), ef.Boundaries(), ef.ClassWeights("boundaries")]
    with ef.Loader(ef.Sample(raw, labels), patch=(2, 44, 44), batch_size=4, seed=1, augment=[ef.Rotate(angle=45.0)],
                   targets=targets) as loader:
        batch = loader.next_batch()
        known = batch["labels_valid"]
        assert not known.all()
        np.testing.assert_allclose(batch["affinities_weights"],
                                   class_weights_reference(batch["affinities"], batch["affinities_mask"]), rtol=1e-6)
        np.testing.assert_allclose(batch["boundaries_weights"],
                                   class_weights_reference(batch["boundaries"], known), rtol=1e-6)
        assert not batch["boundaries_weights"][known == 0].any()


def test_a_config_names_class_weights(tmp_path):
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f["raw"] = rng.integers(0, 255, (16, 32, 32)).astype(np.uint8)
        f["labels"] = rng.integers(0, 3, (16, 32, 32)).astype(np.uint64)
    config = tmp_path / "train.yaml"
    config.write_text("data:\n  samples:\n    - {name: s, file: s.h5, raw: raw, labels: labels}\n"
                      "loader: {patch: [4, 16, 16], batch_size: 2}\n"
                      "targets:\n  - affinities\n"
                      "  - class_weights: {of: affinities, per: channel, clip: [0.1, null]}\n")
    with load_config(config).loader() as loader:
        batch = loader.next_batch()
        expected = class_weights_reference(batch["affinities"], batch["affinities_mask"], clip=(0.1, None),
                                           per_channel=True)
        np.testing.assert_allclose(batch["affinities_weights"], expected, rtol=1e-6)


def test_class_weights_pickle_and_compute_the_same(rng):
    labels = rng.integers(0, 3, (2, 1, 6, 10, 10)).astype(np.uint32)
    targets = ef.targets.resolve([ef.Affinities(), ef.ClassWeights(per="channel")])
    again = pickle.loads(pickle.dumps(targets))
    assert again == targets
    first, second = (ef.compute_targets(labels, t, (1, 1, 1)) for t in (targets, again))
    assert np.array_equal(first["affinities_weights"], second["affinities_weights"])


def test_one_object_in_two_target_lists_serves_each_with_its_own_source(rng):
    """A review: the object itself was bound, so two lists (a train and a validation loader) computing at once
    weighed with each other's classes (4 of 100 batches), or failed on a value the other's source allows."""
    import threading

    labels = rng.integers(0, 3, (2, 1, 6, 40, 40)).astype(np.uint64)
    shared = ef.ClassWeights("classes")
    lists = {3: [ef.Classes(values=(0, 1, 2)), shared], 8: [ef.Classes(values=(0, 1, 7)), shared]}
    wrong = []

    def run(classes):
        for _ in range(40):
            out = ef.compute_targets(labels, lists[classes], (1, 1, 1))
            if not np.allclose(out["classes_weights"], class_weights_reference(out["classes"], classes=classes),
                               rtol=1e-6):
                wrong.append(classes)

    threads = [threading.Thread(target=run, args=(k,)) for k in lists]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong
    assert shared._source is None  # the caller's object is left as given: lists bind copies
    with pytest.raises(ValueError, match="not yet bound to the target writing 'classes'"):
        shared.outputs()


@pytest.mark.parametrize("valid, match", [
    (np.ones((2, 1, 5, 10, 10), np.uint8), r"valid must be shaped like the labels \(2, 1, 6, 10, 10\)"),
    (np.ones((2, 2, 6, 10, 10), np.uint8), "valid must be shaped like the labels"),
])
def test_compute_targets_names_a_bad_valid(valid, match):
    labels = np.ones((2, 1, 6, 10, 10), np.uint32)
    with pytest.raises(ValueError, match=match):
        ef.compute_targets(labels, [ef.Foreground(), ef.ClassWeights("foreground")], (1, 1, 1), valid=valid)


def test_valid_of_any_dtype_counts_non_zero_as_known(rng):
    labels = rng.integers(0, 2, (2, 1, 6, 10, 10)).astype(np.uint32)
    known = rng.random(labels.shape) < 0.7
    targets = [ef.Foreground(), ef.ClassWeights("foreground")]
    as_uint8 = ef.compute_targets(labels, targets, (1, 1, 1), valid=known.astype(np.uint8))
    for other in (known, known * np.float32(2.5), (known * 2).astype(np.uint8)):
        out = ef.compute_targets(labels, targets, (1, 1, 1), valid=other)
        np.testing.assert_array_equal(out["foreground_weights"], as_uint8["foreground_weights"])


@pytest.mark.parametrize("targets, match", [
    (["class_weights"], r"no target listed before it writes the field 'affinities' it balances \(fields before it: "
                        r"none\)"),
    ([ef.ClassWeights(), ef.Affinities()], "no target listed before it writes the field 'affinities'"),
    ([ef.LSD(sigma=2.0), ef.ClassWeights("lsd")], "does not hold class ids"),
    ([ef.Affinities(), ef.ClassWeights("affinities_mask")], "does not hold class ids"),
    ([ef.Classes(), ef.ClassWeights("classes", classes=2)], r"classes \[0, 1, 2\], not all in \[0, 2\)"),
    ([ef.Classes(values=(-1, 0, 1)), ef.ClassWeights("classes")], r"negative class ids \[-1\]"),
    ([ef.Classes(values=(0, 1, 2000000)), ef.ClassWeights("classes")], r"class ids up to 2000000, more classes"),
])
def test_bad_sources_are_refused_naming_them(targets, match):
    with pytest.raises(ValueError, match=match):
        ef.targets.resolve(targets)


@pytest.mark.parametrize("kwargs, match", [
    (dict(classes=0), "classes must be an integer in"),
    (dict(classes=2.5), "classes must be an integer in"),
    (dict(clip=(0.9, 0.1)), "low bound 0.9 exceeds its high bound 0.1"),
    (dict(clip=(0.1, 2.0)), "fractions in"),
    (dict(clip=(None, 0)), "high bound must be above 0"),
    (dict(clip=0.1), r"clip must be \(low, high\)"),
    (dict(per="batch"), "per must be one of 'example', 'channel'"),
    (dict(mask="yes"), "mask must be True or False"),
    (dict(of="not a name"), "identifier"),
])
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ef.ClassWeights(**kwargs)


def test_the_kernel_refuses_values_that_are_not_classes():
    values = np.zeros((1, 2, 2, 3, 4), np.float32)
    values[0, 1, 1, 2, 3] = 0.5
    out = np.empty(values.shape, np.float32)
    with pytest.raises(ValueError, match=r"value 0.5 at \(0, 1, 1, 2, 3\) is not a class in \[0, 2\)"):
        _targets.balance(values, None, 2, None, None, False, out)
    values[0, 1, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="nan"):
        _targets.balance(values, None, 2, None, None, False, out)
    with pytest.raises(ValueError, match=r"value 7 at"):
        _targets.balance(np.full(values.shape, 7, np.int64), None, 2, None, None, False, out)
    with pytest.raises(ValueError, match="mask must be C-contiguous and shaped like the values"):
        _targets.balance(values, np.ones((1, 2, 2, 3, 5), np.uint8), 2, None, None, False, out)
    with pytest.raises(TypeError, match="values has dtype int32"):
        _targets.balance(np.zeros(values.shape, np.int32), None, 2, None, None, False, out)
    with pytest.raises(ValueError, match="must not overlap"):
        _targets.balance(values, None, 2, None, None, False, values)


def test_the_kernel_releases_the_gil(rng):
    values = (rng.random((4, 3, 32, 128, 128)) < 0.3).astype(np.float32)
    mask = (rng.random(values.shape) < 0.9).astype(np.uint8)
    assert_releases_gil(_targets.balance, values, mask, 2, 0.05, 0.95, False, np.empty(values.shape, np.float32))
