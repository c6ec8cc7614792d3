"""Bad arguments a review of the public API found accepted silently or refused in another library's words: each is
now refused, naming the setting, before anything runs."""
import h5py
import numpy as np
import pytest

import emfast as ef

RAW = np.zeros((8, 32, 32), np.float32)


def _first_batch(augment, dtype="float32"):
    with ef.Loader(RAW, patch=(4, 16, 16), batch_size=1, epoch_size=1, augment=augment, dtype=dtype) as loader:
        return np.array(loader.next_batch()["raw"])


@pytest.fixture
def h5(tmp_path):
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f["raw"] = np.zeros((4, 8, 8), np.uint8)
    return tmp_path / "s.h5"


@pytest.mark.parametrize("make, error, message", [
    # a fill that float32 (or float16) batches hold only as infinity: the batch was inf, with a cast warning
    (lambda: _first_batch([ef.MissingSection(fill=1e300, p=1.0)]), ValueError,
     r"MissingSection: fill 1e\+300 is beyond the range of the batches' dtype float32"),
    (lambda: _first_batch([ef.Slip(fill=1e5, p=1.0)], dtype="float16"), ValueError,
     r"Slip: fill 100000.0 is beyond the range of the batches' dtype float16 \(at most 65504"),
    (lambda: ef.Slip(max_shift=(2**62, 2**62)), ValueError, r"Slip: max_shift must be two integers in \[0, 1048576\]"),
    # extra names: str(key) merged 1 and "1" into one field
    (lambda: ef.Sample(RAW, extra={1: RAW, "1": RAW}), TypeError, r"extra names must be non-empty strings .* got 1"),
    (lambda: ef.Dataset(None), TypeError, "a Dataset takes a Sample or a list of them, got NoneType"),
    (lambda: ef.Dataset([ef.Sample(RAW, name="a"), ef.Sample(RAW, name="b")]).split(5), TypeError,
     "hold_out must be a sample's name or a list of names, got 5"),
    (lambda: ef.Volume.from_array(RAW, name=None), TypeError, "Volume.from_array: name must be a string, got None"),
    # compute_targets returned fields of ``out`` that no target writes, as if computed
    (lambda: ef.compute_targets(np.zeros((1, 1, 4, 4, 4), np.uint64), "affinities", out={"foo": None}), ValueError,
     r"out holds \['foo'\], which no target writes"),
    (lambda: ef.compute_targets(np.zeros((1, 1, 4, 4, 4), np.uint64), "affinities", out=[1]), TypeError,
     "out must be a dict of field name to array, got list"),
])
def test_a_bad_argument_is_refused_naming_it(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_a_dataset_name_that_is_no_string_is_refused_naming_it(h5):
    """h5py's "Accessing a group is done with bytes or str" and "'int' object has no attribute 'split'"."""
    with pytest.raises(TypeError, match=r"s\.h5: dataset must be a string .*got 5"):
        ef.open(h5, 5)
    with pytest.raises(TypeError, match=r"s\.h5: dataset must be a string .*got None"):
        ef.hdf5(h5, None)


def test_predict_takes_numpy_dtypes_as_the_loader_does(tmp_path):
    data = np.random.default_rng(0).random((8, 32, 32), dtype=np.float32)
    ef.predict(lambda batch: batch, data, tmp_path / "p.zarr/out", patch_in=(4, 16, 16), dtype=np.float16)
    assert ef.open(tmp_path / "p.zarr/out").dtype == np.float16


def test_predict_refuses_threads_far_beyond_the_cores_before_writing(tmp_path):
    """Each reader thread reads a block ahead with its context: threads=1000 ran out of memory instead (a review)."""
    with pytest.raises(ValueError, match="threads=1000 is far beyond this machine's"):
        ef.predict(lambda batch: batch, RAW, tmp_path / "p.zarr/out", patch_in=(4, 16, 16), threads=1000)
    assert not (tmp_path / "p.zarr").exists()
    pytest.importorskip("dask.distributed")
    from dask.distributed import Client
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        ef.predict(lambda batch: batch, RAW, tmp_path / "d.zarr/out", patch_in=(4, 16, 16), threads=1000,
                   client=client)  # the workers' reading is theirs: no reader threads here


def test_a_fill_beyond_a_config_dtype_is_named_at_its_item_by_load_config(tmp_path):
    """The Loader refused it, at the config's whole ``augment`` section: which of two missing_section items was
    meant stayed unsaid, and load_config accepted it (a review)."""
    from emfast.config import ConfigError, load_config
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["raw"] = np.zeros((8, 32, 32), np.uint8)
    (tmp_path / "c.yaml").write_text(
        "data:\n  samples:\n    - {name: A, file: a.h5, raw: raw}\n"
        "loader: {patch: [4, 16, 16], batch_size: 1, dtype: float16}\n"
        "augment:\n  - mirror\n  - {missing_section: {p: 0.5, fill: 1.0}}\n"
        "  - {missing_section: {p: 0.5, fill: 70000}}\n")
    with pytest.raises(ConfigError, match=r"line 8: augment\[2\]\.missing_section\.fill: MissingSection: fill 70000"):
        load_config(tmp_path / "c.yaml")


def test_a_2d_image_and_a_2d_patch_are_told_how_to_be_one_section(tmp_path):
    """2-D images and (y, x) patches were refused as "expected 3-D" alone, an HDF5 dataset's shape blamed on its
    attributes (a review of 2-D use)."""
    import zarr
    image = np.zeros((64, 64), np.uint8)
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["image"] = image
    zarr.open_group(str(tmp_path / "two.zarr"), mode="w").create_array("image", data=image)
    with pytest.raises(ValueError, match=r"got 2-D shape \(64, 64\); a 2-D image is one section: give it as "
                                         r"image\[np.newaxis\], \(1, y, x\)"):
        ef.Volume.from_array(image)
    with pytest.raises(ef.io.StoreMetadataError, match=r"two.h5:image: expected a 3-D .* got 2-D; a 2-D image is one "
                                                       r"section: store it with a z axis of 1, \(1, y, x\)$"):
        ef.open(tmp_path / "two.h5", "image")
    with pytest.raises(ef.io.StoreMetadataError, match=r"a 2-D array \(shape \[64, 64\]\); .*; a 2-D image is one "
                                                       r"section: store it with a z axis of 1"):
        ef.open(tmp_path / "two.zarr/image")
    for setting in ("patch", "patch_in"):
        with pytest.raises(ValueError, match=rf"{setting} must be 3 integers >= 1 \(z, y, x\), got \(32, 32\): a 2-D "
                                             r"patch is one section deep, \(1, 32, 32\)"):
            ef.Loader(image[np.newaxis], **{setting: (32, 32)})
    with pytest.raises(ValueError, match=r"got array\(\[32, 32\]\): a 2-D patch is one section deep, \(1, 32, 32\)"):
        ef.Loader(image[np.newaxis], patch=np.array([32, 32]))
    for pair in ((0, 64), (-3, 5), ("a", "b"), (64.5, 64), (True, 64)):  # no window in one section either
        with pytest.raises(ValueError) as refused:
            ef.Loader(image[np.newaxis], patch=pair)
        assert "one section" not in str(refused.value)
    for setting in ("patch_in", "patch_out"):
        with pytest.raises(ValueError, match=rf"{setting} must be 3 integers >= 1 \(z, y, x\), got \(16, 16\): a 2-D "
                                             r"patch is one section deep, \(1, 16, 16\)"):
            ef.predict(lambda batch: batch, image[np.newaxis], tmp_path / "p.zarr/p",
                       **dict(dict(patch_in=(1, 32, 32)), **{setting: (16, 16)}))
    with ef.Loader(image[np.newaxis], patch=iter((1, 32, 32)), batch_size=2, seed=0) as loader:  # any iterable
        assert loader.next_batch()["raw"].shape == (2, 1, 1, 32, 32)


def test_2d_images_in_ome_zarr_and_n5_are_told_how_to_be_one_section(tmp_path):
    """Valid 2-D images were "malformed metadata" (axes ['y', 'x']; dimensions [64, 64]) (a second review)."""
    import json
    import zarr
    group = zarr.open_group(str(tmp_path / "ome.zarr"), mode="w", zarr_format=2)
    group.create_array("0", data=np.zeros((64, 64), np.uint8))
    group.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": "y", "type": "space"},
                                                              {"name": "x", "type": "space"}],
                                   "datasets": [{"path": "0", "coordinateTransformations": [
                                       {"type": "scale", "scale": [4.0, 4.0]}]}]}]
    with pytest.raises(ef.io.StoreMetadataError, match=r"axes = \['y', 'x'\], an image without a z axis; emfast "
                                                       r"reads volumes \(z, y, x\); a 2-D image is one section"):
        ef.open(tmp_path / "ome.zarr")
    (tmp_path / "img.n5/img").mkdir(parents=True)
    (tmp_path / "img.n5/attributes.json").write_text(json.dumps({"n5": "2.0.0"}))
    (tmp_path / "img.n5/img/attributes.json").write_text(json.dumps(
        {"dimensions": [64, 64], "blockSize": [32, 32], "dataType": "uint8", "compression": {"type": "raw"}}))
    with pytest.raises(ef.io.StoreMetadataError, match=r"img \(attributes.json\): expected a 3-D \(z, y, x\) or 4-D "
                                                       r"\(c, z, y, x\) array, got 2-D; a 2-D image is one section"):
        ef.open(tmp_path / "img.n5/img")
