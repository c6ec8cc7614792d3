"""Datasets of several volumes through the loader: alignment, context windows, targets, shards and bad input."""
import pickle

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.augment import Augmentation, Patches
from emfast.pipeline._plan import window_extents

from reference import affinities_reference, converted, window

PATCH = (4, 12, 10)


def make_sample(rng, shape, name, label_shape=None, label_offset=None, weight=1.0, mask=False):
    raw = rng.integers(0, 256, shape, dtype=np.uint8)
    label_shape = shape if label_shape is None else label_shape
    labels = rng.integers(1, 4, label_shape, dtype=np.uint64)
    mask_array = np.ones(label_shape, np.uint8) if mask else None
    return ef.Sample(raw, labels, mask=mask_array, name=name, weight=weight, label_offset=label_offset,
                     mask_offset=label_offset if mask else None)


@pytest.fixture
def dataset(rng):
    return ef.Dataset([make_sample(rng, (10, 40, 36), "a"),
                       make_sample(rng, (14, 30, 44), "b", label_shape=(10, 24, 30), label_offset=(2, 3, 4)),
                       make_sample(rng, (8, 20, 20), "c", weight=2.0)])


def test_every_example_comes_from_its_sample_at_its_position(dataset):
    with ef.Loader(dataset, patch=PATCH, batch_size=6, epoch_size=6, seed=5) as loader:
        seen = set()
        for batch in loader:
            for n in range(6):
                sample = dataset.samples[batch.volumes[n]]
                assert batch.names[n] == sample.name
                args = (batch.positions[n], PATCH, batch.perms[n], batch.flips[n])
                expected = converted(sample.raw.array, *args, 1 / 255, 0.0, np.float32)
                np.testing.assert_array_equal(batch["raw"][n], expected)
                labels = sample.placed_labels
                corner = batch.positions[n] - labels.origin
                np.testing.assert_array_equal(batch["labels"][n], window(labels.volume.array, corner, *args[1:]))
                seen.add(sample.name)
    assert seen == {"a", "b", "c"}


def test_sample_weights_are_respected(dataset):
    with ef.Loader(dataset, patch=PATCH, batch_size=64, seed=1, augment=()) as loader:
        volumes = np.concatenate([loader.next_batch().volumes for _ in range(30)])
    frequencies = np.bincount(volumes, minlength=3) / len(volumes)
    np.testing.assert_allclose(frequencies, [0.25, 0.25, 0.5], atol=0.03)


def test_labels_covering_part_of_raw_keep_windows_inside_the_labels(dataset):
    with ef.Loader(dataset, patch=PATCH, batch_size=16, seed=2) as loader:
        for _ in range(20):
            batch = loader.next_batch()
            for n in np.flatnonzero(batch.volumes == 1):
                lo = batch.positions[n]
                assert np.all(lo >= (2, 3, 4)) and np.all(lo + batch.extents[n] <= (12, 27, 34))


def test_context_window_is_centred_on_the_output_window(rng):
    """Raw holds each voxel's linear index; the output window's raw must equal its labels, for all transforms."""
    shape = (16, 30, 30)
    index = np.arange(np.prod(shape)).reshape(shape)
    sample = ef.Sample(index.astype(np.float32), index.astype(np.uint64))
    with ef.Loader(sample, patch_in=(6, 20, 16), patch_out=(2, 10, 8), batch_size=8, epoch_size=4, seed=3,
                   augment=["mirror", "transpose"]) as loader:
        assert loader.fields["raw"][0] == (8, 1, 6, 20, 16)
        assert loader.fields["labels"][0] == (8, 1, 2, 10, 8)
        for batch in loader:
            inner = batch["raw"][:, :, 2:4, 5:15, 4:12]
            np.testing.assert_array_equal(inner, batch["labels"].astype(np.float32))
            for n in range(8):
                context = window_extents((2, 5, 4), batch.perms[n:n + 1])[0]
                expected = converted(index[None].astype(np.float32), batch.positions[n] - context, (6, 20, 16),
                                     batch.perms[n], batch.flips[n], 1.0, 0.0, np.float32)
                np.testing.assert_array_equal(batch["raw"][n], expected)


def test_two_and_a_half_d(rng):
    raw = rng.integers(0, 256, (12, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 3, (12, 32, 32), dtype=np.uint32)
    with ef.Loader(raw, labels, patch_in=(5, 16, 16), patch_out=(1, 16, 16), batch_size=4, seed=1) as loader:
        batch = loader.next_batch()
        assert batch["raw"].shape == (4, 1, 5, 16, 16) and batch["labels"].shape == (4, 1, 1, 16, 16)
        for n in range(4):
            args = (batch.positions[n], (1, 16, 16), batch.perms[n], batch.flips[n])
            np.testing.assert_array_equal(batch["raw"][n, :, 2:3], converted(raw[None], *args, 1 / 255, 0, np.float32))
            np.testing.assert_array_equal(batch["labels"][n], window(labels[None], *args))


def test_targets_match_the_reference_on_labels_cut_with_their_margin(dataset):
    offsets = ((1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 3))
    targets = [ef.Affinities(offsets=offsets, ignore=2), ef.Foreground(background=3)]
    with ef.Loader(dataset, patch=PATCH, batch_size=4, seed=7, targets=targets) as loader:
        assert loader.margin == (1, 1, 3)
        for _ in range(5):
            batch = loader.next_batch()
            assert batch["affinities"].shape == (4, 4) + PATCH
            for n in range(4):
                placed = dataset.samples[batch.volumes[n]].placed_labels
                grown = np.asarray(PATCH) + 2 * np.asarray(loader.margin)
                source_margin = np.empty(3, np.int64)
                source_margin[batch.perms[n]] = loader.margin
                corner = batch.positions[n] - source_margin - placed.origin
                cut = window(placed.volume.array, corner, grown, batch.perms[n], batch.flips[n])[None]
                affinities, mask = affinities_reference(cut, offsets, loader.margin, ignore=2)
                np.testing.assert_array_equal(batch["affinities"][n], affinities[0])
                np.testing.assert_array_equal(batch["affinities_mask"][n], mask[0])
                inner = cut[0, 0, 1:-1, 1:-1, 3:-3]
                np.testing.assert_array_equal(batch["labels"][n, 0], inner)
                np.testing.assert_array_equal(batch["foreground"][n, 0], inner != 3)


def test_mask_is_delivered_with_the_output_window(rng):
    raw = rng.integers(0, 256, (8, 24, 24), dtype=np.uint8)
    mask = (rng.random((8, 24, 24)) < 0.5).astype(np.uint8)
    with ef.Loader(ef.Sample(raw, mask=mask), patch=(2, 8, 8), batch_size=4, seed=0) as loader:
        batch = loader.next_batch()
        for n in range(4):
            expected = window(mask[None], batch.positions[n], (2, 8, 8), batch.perms[n], batch.flips[n])
            np.testing.assert_array_equal(batch["mask"][n], expected)


def test_extra_channels_are_converted_with_the_same_geometry(rng):
    raw = rng.integers(0, 256, (8, 24, 24), dtype=np.uint8)
    second = rng.random((8, 24, 24)).astype(np.float32)
    sample = ef.Sample(raw, extra={"second": second})
    with ef.Loader(sample, patch=(2, 8, 8), batch_size=4, seed=0, augment=["mirror", "transpose", "intensity"]) \
            as loader:
        batch = loader.next_batch()
        for n in range(4):
            expected = window(second[None], batch.positions[n], (2, 8, 8), batch.perms[n], batch.flips[n])
            np.testing.assert_array_equal(batch["second"][n], expected)  # no intensity change on extras


def test_shards_are_disjoint_and_together_the_single_process_stream(dataset):
    def stream(epoch_size, **extra):
        with ef.Loader(dataset, patch=PATCH, batch_size=3, seed=11, epoch_size=epoch_size, **extra) as loader:
            return [(b.volumes.tolist(), b.positions.tolist(), b.perms.tolist(), b.flips.tolist()) for b in loader]

    whole = stream(16)
    shards = [stream(8, rank=rank, world_size=2) for rank in range(2)]
    for rank in range(2):
        assert shards[rank] == whole[rank::2]
    assert not any(batch in shards[1] for batch in shards[0])


def test_hold_out_splits_by_name(dataset):
    train, validation = dataset.split(hold_out=["b"])
    assert train.names == ["a", "c"] and validation.names == ["b"]
    with pytest.raises(ValueError, match=r"\['x'\] match no sample; samples: \['a', 'b', 'c'\]"):
        dataset.split(hold_out=["x"])
    with pytest.raises(ValueError, match="at most 2"):
        dataset.split(hold_out=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"hold_out=None holds out no sample: name at least one of \['a', 'b', 'c'\]"):
        dataset.split(hold_out=None)  # was a bare "'NoneType' object is not iterable"


def test_per_volume_normalisation(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path))
    raw = rng.integers(10, 200, (8, 20, 20), dtype=np.uint8)
    for mode, expected in (("volume", (raw - raw.mean()) / raw.std()),
                           ("minmax", (raw - raw.min()) / (raw.max() - raw.min()))):
        with ef.Loader(raw, patch=(8, 20, 20), batch_size=1, augment=(), normalize=mode) as loader:
            np.testing.assert_allclose(loader.next_batch()["raw"][0, 0], expected, rtol=1e-5, atol=1e-5)
    with ef.Loader(raw, patch=(8, 20, 20), batch_size=1, augment=(), normalize={"mean": 100, "std": 50}) as loader:
        np.testing.assert_allclose(loader.next_batch()["raw"][0, 0], (raw - 100.0) / 50, rtol=1e-6, atol=1e-6)


def test_a_normalisation_float32_cannot_apply_is_refused_by_name(rng, tmp_path, monkeypatch):
    """Checked finite in float64 but applied in float32, a scale of 1e300, a std of 1e-45 or standardised
    subnormal data gave all-infinite or all-NaN batches and model inputs (and NumPy overflow warnings); float64
    data whose variance overflows or underflows was called "constant"."""
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path))
    tiny = (rng.random((8, 20, 20)) * 1e-39).astype(np.float32)  # subnormal in float32
    cases = [(rng.random((8, 20, 20), dtype=np.float32), (1e300, 0.0), "beyond float32"),
             (rng.random((8, 20, 20), dtype=np.float32), {"mean": 0.5, "std": 1e-45}, "beyond float32"),
             (tiny, "volume", "beyond float32"), (tiny, "minmax", "beyond float32"),
             (rng.random((8, 20, 20)) * 1e300, "volume", "overflow float64"),
             ((rng.random((8, 20, 20)) * 2 - 1) * 1e308, "minmax", "overflows float64"),
             (rng.random((8, 20, 20)) * 1e-310, "volume", "differ too little")]
    for raw, normalize, words in cases:
        with pytest.raises(ValueError, match=words):
            ef.Loader(raw, patch=(8, 20, 20), batch_size=1, augment=(), normalize=normalize)
        with pytest.raises(ValueError, match=words):
            ef.predict(lambda batch: batch, raw, tmp_path / "p.zarr/p", patch_in=(8, 20, 20), normalize=normalize)
    assert not (tmp_path / "p.zarr").exists()
    with pytest.raises(ValueError, match="constant volume"):  # still called so where it is
        ef.Loader(np.full((8, 20, 20), 7.0), patch=(8, 20, 20), batch_size=1, augment=(), normalize="volume")
    big = (rng.random((8, 20, 20)) * 1e30).astype(np.float32)  # large but within float32 after scaling
    with ef.Loader(big, patch=(8, 20, 20), batch_size=1, augment=(), normalize="minmax") as loader:
        assert np.isfinite(loader.next_batch()["raw"]).all()


class Stamp(Augmentation):
    """A pixel-wise test augmentation: writes each example's drawn value into raw and marks label section 0."""

    name = "stamp"
    draws = 1
    pixelwise = True

    def apply(self, uniforms, params):
        return uniforms[:, 0].copy()

    def process(self, record, patches: Patches):
        patches.raw[:] = record[:, None, None, None, None]
        patches.labels[:, :, 0] = 0
        assert patches.labels_offset == (1, 2, 2)


def test_pixelwise_augmentations_run_on_the_batch_before_the_targets(rng):
    raw = rng.integers(0, 256, (10, 24, 24), dtype=np.uint8)
    labels = np.ones((10, 24, 24), np.uint64)
    with ef.Loader(raw, labels, patch_in=(4, 8, 8), patch_out=(2, 4, 4), batch_size=3, seed=0,
                   augment=[Stamp()], targets=["foreground"]) as loader:
        batch = loader.next_batch()
        assert len(set(batch["raw"][:, 0, 0, 0, 0].tolist())) == 3
        assert np.all(batch["raw"] == batch["raw"][:, :, :1, :1, :1])
        assert not batch["foreground"][:, 0, 0].any() and batch["foreground"][:, 0, 1].all()


def test_bad_datasets_fail_clearly(rng, tmp_path):
    raw = rng.integers(0, 256, (8, 20, 20), dtype=np.uint8)
    labels = np.ones((8, 20, 20), np.uint64)
    with pytest.raises(ValueError, match="does not overlap"):
        ef.Sample(raw, labels, label_offset=(0, 30, 0))
    with pytest.raises(ValueError, match="label_offset of labels must be 3 integers"):
        ef.Sample(raw, labels, label_offset=(0, 1))
    with pytest.raises(ValueError, match="weight must be a positive number"):
        ef.Sample(raw, weight=0)
    with pytest.raises(ValueError, match="mask_offset was given but no mask"):
        ef.Sample(raw, mask_offset=(0, 0, 0))
    with pytest.raises(TypeError, match="mask must be uint8 or bool"):
        ef.Sample(raw, mask=labels)
    with pytest.raises(ValueError, match="extra channels must be aligned"):
        ef.Sample(raw, extra={"second": raw[:4]})
    with pytest.raises(ValueError, match="names must be unique"):
        ef.Dataset([ef.Sample(raw, name="x"), ef.Sample(raw, name="x")])
    with pytest.raises(ValueError, match="differ in labels dtype"):
        ef.Dataset([ef.Sample(raw, labels, name="x"), ef.Sample(raw, name="y")])
    with pytest.raises(ValueError, match="at least one Sample"):
        ef.Dataset([])
    with pytest.raises(ValueError, match="even number"):
        ef.Loader(raw, patch_in=(4, 9, 8), patch_out=(2, 4, 4))
    with pytest.raises(ValueError, match="even number"):
        ef.Loader(raw, patch_in=(2, 8, 8), patch_out=(4, 4, 4))
    with pytest.raises(ValueError, match="either patch, or patch_in"):
        ef.Loader(raw, patch=(2, 4, 4), patch_out=(2, 4, 4))
    with pytest.raises(ValueError, match=r"patch_in must be 3 integers >= 1 \(z, y, x\)"):
        ef.Loader(raw, patch_in=(-2, 4, 4), patch_out=(2, 4, 4))
    with pytest.raises(ValueError, match="need labels"):
        ef.Loader(raw, patch=(2, 4, 4), targets=["affinities"])
    with pytest.raises(ValueError, match=r"sample 'small'.*patch_out \(2, 4, 4\).*patch_in \(6, 8, 8\)"):
        ef.Loader(ef.Dataset([ef.Sample(raw, name="big"), ef.Sample(raw[:, :6, :6], name="small")]),
                  patch_in=(6, 8, 8), patch_out=(2, 4, 4))
    with pytest.raises(ValueError, match=r"patch \(8, 4, 4\), grown by the labels' margin \(1, 1, 1\) of "
                                         r"Affinities does not fit"):
        ef.Loader(raw, labels, patch=(8, 4, 4), targets=["affinities"])
    with pytest.raises(ValueError, match="rank must be in"):
        ef.Loader(raw, patch=(2, 4, 4), rank=2, world_size=2)
    with pytest.raises(ValueError, match="cannot be combined with a Dataset"):
        ef.Loader(ef.Dataset([ef.Sample(raw)]), labels, patch=(2, 4, 4))
    with pytest.raises(ValueError, match="normalize must be one of"):
        ef.Loader(raw, patch=(2, 4, 4), normalize="zscore")
    with pytest.raises(ValueError, match="exactly the keys 'mean' and 'std'"):
        ef.Loader(raw, patch=(2, 4, 4), normalize={"mean": 1, "sd": 2})
    path = tmp_path / "misaligned.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=raw).attrs.update(resolution=(40, 4, 4), offset=(0, 0, 0))
        f.create_dataset("labels", data=labels).attrs.update(resolution=(40, 8, 6), offset=(0, 0, 0))
    with pytest.raises(ValueError, match="along x the ratio 1.5 is not an integer"):
        ef.Sample(ef.hdf5(path, "raw"), ef.hdf5(path, "labels"))


def test_labels_can_be_left_out_when_only_targets_are_needed(dataset):
    kwargs = dict(patch=PATCH, batch_size=2, seed=1, targets=["affinities"])
    with ef.Loader(dataset, keep_labels=False, **kwargs) as lean, ef.Loader(dataset, **kwargs) as full:
        a, b = lean.next_batch(), full.next_batch()
        assert set(a) == set(b) - {"labels"}
        np.testing.assert_array_equal(a["affinities"], b["affinities"])
    with ef.Loader(dataset, patch=PATCH, batch_size=2, keep_labels=False) as loader:
        assert set(loader.next_batch()) == {"raw"}
    with pytest.raises(TypeError, match="keep_labels must be True or False"):
        ef.Loader(dataset, patch=PATCH, keep_labels="no")


RAW_LIST = "uint8, uint16, float32, int8, int16, uint32, float16 or float64"


@pytest.mark.parametrize("kwargs, expected", [
    (dict(raw=np.int32), f"raw: raw must be {RAW_LIST}, not int32"),
    (dict(raw=np.uint64), f"raw: raw must be {RAW_LIST}, not uint64"),
    (dict(labels=np.float32), "labels: labels must be uint32, uint64, int64 or int32, not float32"),
    (dict(mask=np.uint16), "mask: mask must be uint8 or bool, not uint16"),
    (dict(extra=np.int64), f"extra 'second': extra channels must be {RAW_LIST}, not int64"),
])
def test_a_wrong_dtype_lists_only_that_fields_supported_dtypes(kwargs, expected):
    def volume(role, default):
        return np.zeros((6, 8, 8), kwargs.get(role, default))

    with pytest.raises(TypeError) as caught:
        ef.Sample(volume("raw", np.uint8), volume("labels", np.uint64), mask=volume("mask", np.uint8),
                  extra={"second": volume("extra", np.uint8)})
    assert str(caught.value) == expected


@pytest.mark.parametrize("kind", ["array", "hdf5", "hdf5 lazy", "zarr", "pickled"])
def test_a_bool_volume_from_any_source_is_refused_as_raw_or_extra_and_kept_as_mask(tmp_path, kind):
    """A bool array was refused as raw, but the same data from a file (read as uint8 0/1) was taken: batches
    of 0 and 1/255."""
    data = np.zeros((6, 8, 8), bool)
    data[:, :, 4:] = True
    if kind.startswith("hdf5"):
        with h5py.File(tmp_path / "b.h5", "w") as f:
            f["b"] = data
        volume = ef.hdf5(tmp_path / "b.h5", "b", in_memory=kind == "hdf5")
    elif kind == "zarr":
        zarr = pytest.importorskip("zarr")
        zarr.create_array(tmp_path / "b.zarr", shape=data.shape, chunks=(3, 4, 4), dtype=bool)[...] = data
        volume = ef.open(tmp_path / "b.zarr")
    else:
        volume = ef.Volume.from_array(data)
        volume = pickle.loads(pickle.dumps(volume)) if kind == "pickled" else volume
    assert volume.stored_dtype == bool and volume.dtype == np.uint8
    with pytest.raises(TypeError, match=rf"raw must be {RAW_LIST}, not bool"):
        ef.Sample(volume)
    raw = np.zeros(data.shape, np.uint8)
    with pytest.raises(TypeError, match=rf"extra channels must be {RAW_LIST}, not bool"):
        ef.Sample(raw, extra={"b": volume})
    sample = ef.Sample(raw, mask=volume)
    with ef.Loader(sample, patch=(6, 8, 8), batch_size=1, augment=()) as loader:
        np.testing.assert_array_equal(loader.next_batch()["mask"][0, 0], data)


@pytest.mark.parametrize("voxels", [100, 50_000, 200_000])
def test_half_voxel_offsets_are_refused_however_far_from_raw(voxels):
    """A relative tolerance let 50000.5 voxels through as 50000 (a half-voxel shift, silently)."""
    raw = ef.Volume.from_array(np.zeros((4, 8, 8), np.uint8), name="raw", resolution=(40, 8, 8), offset=(0, 0, 0))
    labels = ef.Volume.from_array(np.ones((4, 8, 8), np.uint64), name="labels", resolution=(40, 8, 8),
                                  offset=(0, voxels * 8 + 4, 0))
    with pytest.raises(ValueError, match=rf"offset by \(0.0, {voxels}.5, 0.0\) voxels .* not a whole number"):
        ef.Sample(raw, labels=labels)
    shifted = ef.Volume.from_array(np.ones((4, 8, 8), np.uint64), name="labels", resolution=(40, 8, 8),
                                   offset=(0, -voxels * 8, 0))
    assert ef.Sample(ef.Volume.from_array(np.zeros((4, 8, 8), np.uint8), name="raw", resolution=(40, 8, 8),
                                          offset=(0, -voxels * 8, 0)), labels=shifted).placed_labels.origin.tolist() \
        == [0, 0, 0]


def test_two_offsets_of_one_array_far_from_zero_must_agree_to_rounding():
    """A relative tolerance of 1e-6 let offsets 4 nm apart agree at 4 mm."""
    from emfast.io._geometry import require_agreement
    with pytest.raises(ef.io.StoreMetadataError, match="contradictory metadata"):
        require_agreement("a", "its offset", (0.0, 4e6, 0.0), "the translation", (0.0, 4e6 + 4, 0.0))
    require_agreement("a", "its offset", (0.0, 4e6, 0.0), "the translation", (0.0, 4000.0 * 1e3, 0.0))
    require_agreement("a", "its voxel size", (40.0, 4.0, 4.0), "the scale", (0.04 * 1e3, 0.004 * 1e3, 4.0))


def test_geometry_stored_as_float32_still_lines_up(tmp_path):
    """float32 attributes (4.1 nm voxels, an offset 100 voxels in) are whole voxels only to float32 rounding; a
    float32 resolution beside its float64 voxel_size states the same value."""
    voxel = np.array([4.1, 4.1, 4.1], np.float32)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        raw = f.create_dataset("raw", data=np.zeros((8, 300, 300), np.uint8))
        raw.attrs.update(resolution=voxel, offset=np.zeros(3, np.float32), voxel_size=voxel.astype(np.float64))
        labels = f.create_dataset("labels", data=np.ones((8, 100, 100), np.uint64))
        labels.attrs.update(resolution=voxel, offset=(np.array([0, 100, 100]) * voxel.astype(np.float64)).astype(
            np.float32))
    sample = ef.Sample(ef.hdf5(tmp_path / "f.h5", "raw"), labels=ef.hdf5(tmp_path / "f.h5", "labels"))
    assert sample.placed_labels.origin.tolist() == [0, 100, 100]


@pytest.mark.parametrize("far", [0, 100_000, 1_000_000])
def test_float32_offsets_far_from_the_origin_line_up_and_half_voxels_do_not(far):
    """The rounding allowed grew with the distance between the volumes, not with the offsets' size: raw 10**5
    voxels from 0 and labels 101 voxels further, both offsets float32, were refused."""
    voxel = np.float32(4.1)

    def placed(name, at, dtype, shape=(4, 8, 8)):
        offset = tuple(float(np.float32(v * float(voxel))) for v in (0, at, 0))
        return ef.Volume.from_array(np.zeros(shape, dtype), name=name, resolution=(float(voxel),) * 3,
                                    offset=offset)

    raw = placed("raw", far, np.uint8, (4, 128, 8))
    assert ef.Sample(raw, labels=placed("labels", far + 101, np.uint64)).placed_labels.origin.tolist() == [0, 101, 0]
    with pytest.raises(ValueError, match="not a whole number of voxels"):
        ef.Sample(raw, labels=placed("labels", far + 101.5, np.uint64))


def test_float64_offsets_far_from_the_origin_are_checked_to_a_thousandth_of_a_voxel():
    """The float32 allowance was applied to exact float64 offsets too: 800,000 voxels out, labels 10.2 voxels off
    were accepted and rounded to 10."""
    raw = ef.Volume.from_array(np.zeros((4, 64, 8), np.uint8), name="raw", resolution=(4.0, 4.0, 4.0),
                               offset=(0.0, 3_200_000.0, 0.0))
    for shift in (10.2, 0.2):
        labels = ef.Volume.from_array(np.ones((4, 8, 8), np.uint64), name="labels", resolution=(4.0, 4.0, 4.0),
                                      offset=(0.0, 3_200_000.0 + 4 * shift, 0.0))
        with pytest.raises(ValueError, match="not a whole number of voxels"):
            ef.Sample(raw, labels=labels)
