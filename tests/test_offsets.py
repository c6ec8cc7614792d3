"""Alignment from the files' own attributes, the CREMI way: padded raw without an ``offset`` (read as 0, as
gunpowder, funlib and the CREMI reader read it) and labels with one; explicit offsets that contradict the files
are refused, naming both values and the datasets."""
import textwrap

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.cli import main

RESOLUTION = (40, 4, 4)
#: Labels start this many voxels into raw (CREMI: (37, 911, 911) voxels = (1480, 3644, 3644) nm; scaled down).
LABEL_START = (3, 9, 7)
KEY = 1000  # labels = raw value + KEY, so that each label voxel names the raw voxel it was made from


def _world(shape=(20, 56, 52), seed=3):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _write_cremi(path, world, raw_shape, label_start, label_shape, *, label_offset_attribute=True):
    """An HDF5 file laid out as CREMI's: volumes/raw (resolution, no offset) and volumes/labels/neuron_ids
    (resolution and offset in nm), the labels computed from the raw voxel at the same world position."""
    z, y, x = label_start
    labels = world[z:z + label_shape[0], y:y + label_shape[1], x:x + label_shape[2]].astype(np.uint64) + KEY
    with h5py.File(path, "w") as f:
        raw = f.create_dataset("volumes/raw", data=world[:raw_shape[0], :raw_shape[1], :raw_shape[2]],
                               chunks=(4, 16, 16))
        raw.attrs["resolution"] = RESOLUTION
        ids = f.create_dataset("volumes/labels/neuron_ids", data=labels, chunks=(4, 16, 16))
        ids.attrs["resolution"] = RESOLUTION
        if label_offset_attribute:
            ids.attrs["offset"] = tuple(int(v) * r for v, r in zip(label_start, RESOLUTION))
    return path


def _check_every_label_voxel_matches_raw(loader, batches=4):
    """Each delivered label voxel was computed from the raw voxel the loader delivered at the same place."""
    checked = 0
    with loader:
        for _ in range(batches):
            batch = loader.next_batch()
            raw = np.rint(batch["raw"] * 255).astype(np.uint64)  # uint8 raw normalised to [0, 1]
            assert np.array_equal(batch["labels"], raw + KEY), f"labels misplaced in batch {batch.number}"
            checked += batch["labels"].size
    assert checked > 0


@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "lazy"])
def test_cremi_layout_padded_raw_without_offset_places_the_labels_by_their_offset(tmp_path, in_memory):
    world = _world()
    path = _write_cremi(tmp_path / "sample_A_padded.hdf", world, world.shape, LABEL_START, (12, 40, 40))
    raw = ef.hdf5(path, "volumes/raw", in_memory=in_memory)
    labels = ef.hdf5(path, "volumes/labels/neuron_ids", in_memory=in_memory)
    sample = ef.Sample(raw, labels)
    assert tuple(int(v) for v in sample.placed_labels.origin) == LABEL_START
    loader = ef.Loader(ef.Dataset([sample]), patch=(4, 12, 12), batch_size=3, augment=[], seed=5)
    _check_every_label_voxel_matches_raw(loader)
    raw.close()
    labels.close()


@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "lazy"])
def test_labels_of_raws_shape_with_an_offset_are_shifted_by_it_not_laid_on_raw(tmp_path, in_memory):
    world = _world()
    shape = (14, 40, 40)
    path = _write_cremi(tmp_path / "same_shape.hdf", world, shape, (2, 4, 6), shape)
    raw = ef.hdf5(path, "volumes/raw", in_memory=in_memory)
    labels = ef.hdf5(path, "volumes/labels/neuron_ids", in_memory=in_memory)
    loader = ef.Loader(raw, labels, patch=(4, 12, 12), batch_size=3, augment=["mirror", "transpose"], seed=1)
    assert tuple(int(v) for v in loader.dataset.samples[0].placed_labels.origin) == (2, 4, 6)
    _check_every_label_voxel_matches_raw(loader)
    raw.close()
    labels.close()


def test_an_agreeing_explicit_label_offset_is_accepted(tmp_path):
    world = _world()
    path = _write_cremi(tmp_path / "a.hdf", world, world.shape, LABEL_START, (12, 40, 40))
    sample = ef.Sample(ef.hdf5(path, "volumes/raw"), ef.hdf5(path, "volumes/labels/neuron_ids"),
                       label_offset=LABEL_START)
    assert tuple(int(v) for v in sample.placed_labels.origin) == LABEL_START


def test_a_label_offset_contradicting_the_files_offset_is_refused_naming_both(tmp_path):
    world = _world()
    path = _write_cremi(tmp_path / "a.hdf", world, world.shape, LABEL_START, (12, 40, 40))
    raw, labels = ef.hdf5(path, "volumes/raw"), ef.hdf5(path, "volumes/labels/neuron_ids")
    with pytest.raises(ValueError) as caught:
        ef.Sample(raw, labels, label_offset=(0, 0, 0))
    message = str(caught.value)
    for words in ("label_offset=(0, 0, 0)", "(120.0, 36.0, 28.0)", "(3, 9, 7)", "a.hdf:volumes/labels/neuron_ids",
                  "a.hdf:volumes/raw", "offset (0.0, 0.0, 0.0)"):
        assert words in message, message
    with pytest.raises(ValueError, match=r"label_offset=\(1, 2, 3\) contradicts"):
        ef.Loader(raw, labels, patch=(4, 8, 8), label_offset=(1, 2, 3))


def test_a_mask_offset_contradicting_the_files_offset_is_refused(tmp_path):
    path = tmp_path / "masked.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=_world((12, 32, 32))).attrs.update(resolution=RESOLUTION, offset=(40, 0, 0))
        f.create_dataset("mask", data=np.ones((8, 20, 20), np.uint8)).attrs.update(resolution=RESOLUTION,
                                                                                  offset=(120, 16, 16))
    raw, mask = ef.hdf5(path, "raw"), ef.hdf5(path, "mask")
    assert tuple(int(v) for v in ef.Sample(raw, mask=mask).placed_mask.origin) == (2, 4, 4)
    with pytest.raises(ValueError, match=r"mask_offset=\(0, 4, 4\) contradicts .*masked.h5:mask has offset "
                                         r"\(120.0, 16.0, 16.0\) .*masked.h5:raw has offset \(40.0, 0.0, 0.0\)"):
        ef.Sample(raw, mask=mask, mask_offset=(0, 4, 4))


def test_a_config_label_offset_contradicting_the_file_fails_check_with_exit_2(tmp_path, capsys):
    world = _world()
    _write_cremi(tmp_path / "cremi.hdf", world, world.shape, LABEL_START, (12, 40, 40))
    config = tmp_path / "train.yaml"
    config.write_text(textwrap.dedent("""\
        data:
          samples:
            - file: cremi.hdf
              raw: volumes/raw
              labels: volumes/labels/neuron_ids
              label_offset: [3, 9, 8]
        loader: {patch: [4, 8, 8], batch_size: 2}
        """))
    assert main(["check", str(config)]) == 2
    error = capsys.readouterr().err
    assert "label_offset=(3, 9, 8) contradicts" in error and "cremi.hdf:volumes/labels/neuron_ids" in error


def test_an_offset_that_cannot_be_converted_to_voxels_is_refused_not_ignored(tmp_path):
    world = _world()
    path = _write_cremi(tmp_path / "a.hdf", world, (14, 40, 40), (2, 4, 6), (14, 40, 40))
    labels = ef.hdf5(path, "volumes/labels/neuron_ids")
    with pytest.raises(ValueError, match=r"neuron_ids has offset \(80.0, 16.0, 24.0\) but raw has no 'resolution'"):
        ef.Sample(world[:14, :40, :40], labels)
    with h5py.File(path, "a") as f:  # a resolution and no offset attribute: at 0, said so, not "an attribute"
        del f["volumes/labels/neuron_ids"].attrs["offset"]
    # (said as such, and what to pass: the offset of 0 read there was taken for an attribute, a review)
    with pytest.raises(ValueError, match=r"neuron_ids has offset \(0.0, 0.0, 0.0\) \(an 'offset' attribute of 0, or "
                                         r"none beside its 'resolution'\) but raw has no 'resolution'.*"
                                         r"\(0, 0, 0\) where the two start at the same voxel"):
        ef.Sample(world[:14, :40, :40], ef.hdf5(path, "volumes/labels/neuron_ids"))
    assert tuple(ef.Sample(world[:14, :40, :40], ef.hdf5(path, "volumes/labels/neuron_ids"),
                           label_offset=(0, 0, 0)).placed_labels.origin) == (0, 0, 0)
    with h5py.File(path, "a") as f:  # the labels' offset without a resolution (a CREMI-like slip): said so
        f["volumes/labels/neuron_ids"].attrs["offset"] = (80.0, 16.0, 24.0)
        del f["volumes/labels/neuron_ids"].attrs["resolution"]
    unplaced = ef.hdf5(path, "volumes/labels/neuron_ids")
    with pytest.raises(ValueError, match=r"neuron_ids has offset \(80.0, 16.0, 24.0\) and no resolution, so the "
                                         r"offset cannot be converted"):  # named once (it was twice)
        ef.Sample(ef.hdf5(path, "volumes/raw"), unplaced)
    assert tuple(ef.Sample(world[:14, :40, :40], labels, label_offset=(2, 4, 6)).placed_labels.origin) == (2, 4, 6)
    # an explicit offset fills in what the attributes leave open, but may not contradict every reading of them
    assert tuple(ef.Sample(ef.hdf5(path, "volumes/raw"), unplaced, label_offset=(2, 4, 6)).placed_labels.origin) \
        == (2, 4, 6)  # the labels' offset read in nm at raw's resolution
    with pytest.raises(ValueError, match=r"label_offset=\(0, 0, 0\) contradicts the datasets' attributes: .*"
                                         r"neuron_ids has offset \(80.0, 16.0, 24.0\) and no resolution .*place it "
                                         r"at \(2.0, 4.0, 6.0\) or \(80.0, 16.0, 24.0\) in raw voxels"):
        ef.Sample(ef.hdf5(path, "volumes/raw"), unplaced, label_offset=(0, 0, 0))
    # with no voxel size anywhere the offset's unit is unknown: the explicit one is taken
    assert tuple(ef.Sample(world[:14, :40, :40], unplaced, label_offset=(0, 1, 2)).placed_labels.origin) == (0, 1, 2)


def test_an_extra_channel_offset_from_raw_is_refused(tmp_path):
    path = tmp_path / "channels.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=_world((8, 16, 16))).attrs.update(resolution=RESOLUTION)
        f.create_dataset("second", data=_world((8, 16, 16))).attrs.update(resolution=RESOLUTION, offset=(0, 8, 0))
        f.create_dataset("third", data=_world((8, 16, 16))).attrs.update(resolution=RESOLUTION, offset=(0, 0, 0))
    raw = ef.hdf5(path, "raw")
    with pytest.raises(ValueError, match=r"channels.h5:second \(offset \(0.0, 8.0, 0.0\)\) lies at \(0, 2, 0\)"):
        ef.Sample(raw, extra={"second": ef.hdf5(path, "second")})
    assert list(ef.Sample(raw, extra={"third": ef.hdf5(path, "third")}).extra) == ["third"]


def test_labels_without_any_offset_lie_at_the_origin_as_funlib_reads_them(tmp_path):
    world = _world()
    path = _write_cremi(tmp_path / "a.hdf", world, world.shape, (0, 0, 0), (12, 40, 40),
                        label_offset_attribute=False)
    sample = ef.Sample(ef.hdf5(path, "volumes/raw"), ef.hdf5(path, "volumes/labels/neuron_ids"))
    assert tuple(int(v) for v in sample.placed_labels.origin) == (0, 0, 0)
    loader = ef.Loader(ef.Dataset([sample]), patch=(4, 12, 12), batch_size=3, augment=[], seed=5)
    _check_every_label_voxel_matches_raw(loader)


def test_bare_arrays_of_other_shapes_still_need_an_explicit_offset():
    world = _world()
    with pytest.raises(ValueError, match="pass label_offset=.z, y, x."):
        ef.Sample(world, world[:12, :40, :40].astype(np.uint64))
