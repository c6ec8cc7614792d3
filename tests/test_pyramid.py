"""``emfast convert --levels N``: an OME-NGFF multiscale image that ome-zarr-py and tensorstore read level by level,
each level equal to an independent NumPy reference of the documented downsampling, with its voxel size and the
half-voxel shift of its offset."""
import hashlib
import os
import time

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.cli import main
from emfast.io import ConvertError, convert

zarr = pytest.importorskip("zarr")

VOXEL = (40.0, 4.0, 4.0)
OFFSET = (400.0, 40.0, 20.0)


def needs(module):
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install '.[interop]')")


def tree_digest(path):
    digest = hashlib.sha256()
    for root, folders, names in sorted(os.walk(path)):
        folders.sort()
        for name in sorted(names):
            with open(os.path.join(root, name), "rb") as file:
                digest.update(name.encode() + file.read())
    return digest.hexdigest()


def reference_level(data, factor, rule):
    """One level below ``data`` by ``factor``, one output voxel at a time: the mean of the voxels of its block
    (rounded half to even for integers), or its most frequent value with ties to the lowest."""
    out_shape = tuple(-(-s // f) for s, f in zip(data.shape, factor))
    out = np.zeros(out_shape, data.dtype)
    for index in np.ndindex(*out_shape):
        block = data[tuple(slice(i * f, (i + 1) * f) for i, f in zip(index, factor))].ravel()
        if rule == "mean":
            out[index] = np.rint(block.astype(np.float64).mean()) if data.dtype.kind in "iu" else block.mean()
        else:
            values, counts = np.unique(block, return_counts=True)  # sorted: the first maximum is the lowest id
            out[index] = values[np.argmax(counts)]
    return out


def expected_levels(data, voxel, offset, count, rule):
    """(data, voxel size, offset) of every level: an axis is halved while its voxel size is < 2x the smallest,
    and a halved axis' offset moves by half the voxel below."""
    levels = [(data, list(voxel), list(offset))]
    for _ in range(1, count):
        data, voxel, offset = levels[-1]
        factor = [2 if v < 2 * min(voxel) else 1 for v in voxel]
        levels.append((reference_level(data, factor, rule), [v * f for v, f in zip(voxel, factor)],
                       [o + (v / 2 if f == 2 else 0) for o, v, f in zip(offset, voxel, factor)]))
    return levels


@pytest.fixture
def raw_source(tmp_path):
    data = np.random.default_rng(3).integers(0, 256, (5, 37, 29), dtype=np.uint8)  # odd sizes: cut blocks
    with h5py.File(tmp_path / "in.h5", "w") as f:
        d = f.create_dataset("raw", data=data, chunks=(4, 16, 16))
        d.attrs["resolution"], d.attrs["offset"] = VOXEL, OFFSET
    return tmp_path / "in.h5", data


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_ome_zarr_py_and_tensorstore_read_every_level_of_an_intensity_pyramid(tmp_path, raw_source, zarr_format):
    needs("ome_zarr")
    ts = needs("tensorstore")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader
    path, data = raw_source
    before = tree_digest(path)
    result = convert(str(path) + "/raw", tmp_path / "out.zarr/raw", levels=4, zarr_format=zarr_format,
                     chunks=(4, 8, 8))
    assert tree_digest(path) == before  # the input is never written
    expected = expected_levels(data, VOXEL, OFFSET, 4, "mean")
    assert [level[0].shape for level in expected] == [(5, 37, 29), (5, 19, 15), (5, 10, 8), (5, 5, 4)]
    assert result.written == result.tiles
    images = [node for node in Reader(parse_url(str(tmp_path / "out.zarr/raw")))() if node.load(Multiscales)]
    assert len(images) == 1
    image = images[0]
    assert [axis["name"] for axis in image.metadata["axes"]] == ["z", "y", "x"]
    assert len(image.data) == 4
    driver = "zarr3" if zarr_format == 3 else "zarr"
    for k, (level, (want, voxel, offset)) in enumerate(zip(image.data, expected)):
        np.testing.assert_array_equal(np.asarray(level), want, err_msg=f"level {k}")
        scale, translation = image.metadata["coordinateTransformations"][k]
        assert scale["scale"] == pytest.approx(voxel) and translation["translation"] == pytest.approx(offset)
        stored = ts.open({"driver": driver, "kvstore": {"driver": "file",
                                                        "path": str(tmp_path / f"out.zarr/raw/s{k}")}}).result()
        np.testing.assert_array_equal(stored.read().result(), want)
        # OME's translation is the centre of a level's first voxel; emfast's and funlib's offset its corner, where
        # level 0 starts (the level's own attributes, and the image opened at that level)
        for volume in (ef.open(str(tmp_path / f"out.zarr/raw/s{k}")), ef.open(str(tmp_path / "out.zarr/raw"), level=k)):
            with volume:
                assert volume.resolution == pytest.approx(voxel) and volume.offset == pytest.approx(OFFSET)
    with ef.open(str(tmp_path / "out.zarr/raw")) as volume:  # the image opens at its finest level
        np.testing.assert_array_equal(volume.array[0], data)


def test_a_label_pyramid_keeps_only_ids_of_the_level_below_most_frequent_first_ties_to_the_lowest(tmp_path):
    needs("ome_zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader
    rng = np.random.default_rng(5)
    labels = rng.choice(np.array([0, 7, 2**40, 2**40 + 1], np.uint64), size=(9, 14, 11))
    labels[:2, :2, :2] = [[[3, 3], [5, 5]], [[5, 9], [3, 9]]]  # counts 3:3, 5:3, 9:2: the tie goes to 3
    with h5py.File(tmp_path / "labels.h5", "w") as f:
        f.create_dataset("ids", data=labels).attrs["resolution"] = (8.0, 8.0, 8.0)
    convert(str(tmp_path / "labels.h5/ids"), tmp_path / "out.zarr/ids", levels=3)  # uint64: mode by default
    expected = expected_levels(labels, (8.0,) * 3, (0.0,) * 3, 3, "mode")
    assert expected[1][0][0, 0, 0] == 3
    image = [node for node in Reader(parse_url(str(tmp_path / "out.zarr/ids")))() if node.load(Multiscales)][0]
    for k, (level, (want, voxel, offset)) in enumerate(zip(image.data, expected)):
        np.testing.assert_array_equal(np.asarray(level), want, err_msg=f"level {k}")
        assert image.metadata["coordinateTransformations"][k][0]["scale"] == voxel
        assert image.metadata["coordinateTransformations"][k][1]["translation"] == offset
    assert set(np.unique(np.asarray(image.data[2]))) <= set(np.unique(labels))


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_the_mean_of_64_bit_integers_is_exact(dtype):
    """float64 holds 53 bits: a block of 2**64 - 1 averaged to 0, one of 2**63 - 1 to -2**63. The mean of the
    block's voxels, rounded half to even, is compared with Python's exact fractions."""
    from fractions import Fraction

    from emfast.io._pyramid import downsample

    info = np.iinfo(dtype)
    rng = np.random.default_rng(5)
    data = rng.integers(info.max - 20, info.max, (3, 5, 7), dtype=dtype, endpoint=True)
    data[0] = rng.integers(info.min, info.min + 20, (5, 7), dtype=dtype, endpoint=True)
    data[1, :2, :2] = info.max
    got = downsample(data, (2, 2, 2), "mean")
    for z, y, x in np.ndindex(got.shape):
        block = data[2 * z:2 * z + 2, 2 * y:2 * y + 2, 2 * x:2 * x + 2].ravel().tolist()
        assert int(got[z, y, x]) == round(Fraction(sum(block), len(block))), (z, y, x)


@pytest.mark.parametrize("rule, dtype", [("mean", np.uint8), ("mean", np.float32), ("mean", np.uint64),
                                         ("mode", np.uint64)])
def test_downsampling_a_few_sections_at_a_time_gives_the_whole_and_bounds_memory(rule, dtype, monkeypatch):
    """Done whole, the mean of a 256 MiB tile took 1.8 GiB more (a padded copy, masks, blocks; a helper measured
    a pyramid's conversion at 8 times tile_bytes). In sections the result is the same voxel for voxel, and the
    memory taken beside the output stays a fraction of the tile."""
    import tracemalloc

    from emfast.io import _pyramid

    rng = np.random.default_rng(11)
    data = rng.integers(0, 5 if rule == "mode" else 250, (2, 37, 41, 29)).astype(dtype)  # odd: edge blocks
    whole = _pyramid.downsample(data, (2, 2, 2), rule)
    monkeypatch.setattr(_pyramid, "DOWNSAMPLE_SLAB_BYTES", data[:, :2].nbytes * 3)  # 3 output sections at a time
    np.testing.assert_array_equal(_pyramid.downsample(data, (2, 2, 2), rule), whole)
    monkeypatch.undo()
    tile = np.zeros((128, 512, 512), np.uint8)  # 32 MiB: two slabs
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _pyramid.downsample(tile, (2, 2, 2), "mean")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * tile.nbytes, peak / tile.nbytes  # whole: 7 times


def test_downsampling_is_chosen_by_the_user_and_recorded(tmp_path, raw_source):
    path, data = raw_source
    convert(str(path) + "/raw", tmp_path / "out.zarr/raw", levels=2, downsampling="mode")
    want = expected_levels(data, VOXEL, OFFSET, 2, "mode")[1][0]
    np.testing.assert_array_equal(ef.open(str(tmp_path / "out.zarr/raw/s1")).array[0], want)
    record = dict(zarr.open_array(str(tmp_path / "out.zarr/raw/s1"), mode="r").attrs)["emfast_convert"]
    assert record["downsampling"] == "mode" and record["factor"] == [1, 2, 2] and record["complete"] is True


def test_an_interrupted_pyramid_resumes_and_a_rerun_adds_levels(tmp_path, raw_source):
    path, data = raw_source
    out = tmp_path / "out.zarr/raw"
    level0 = 3 * 5 * 4  # tiles of one chunk (2, 8, 8)
    seen = []

    def stop_in_level_one(done, total):
        seen.append((done, total))
        if done == level0 + 1:  # one tile into level 1
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(str(path) + "/raw", out, levels=2, chunks=(2, 8, 8), tile_bytes=2 * 8 * 8, progress=stop_in_level_one)
    record = dict(zarr.open_array(str(out / "s1"), mode="r").attrs)["emfast_convert"]
    assert record["complete"] is False and record["done"] == 1
    assert {total for _, total in seen} == {level0 + 3 * 3 * 2}  # one count over both levels' tiles
    result = convert(str(path) + "/raw", out, levels=3, chunks=(2, 8, 8), tile_bytes=2 * 8 * 8)
    assert result.written < result.tiles  # level 0 was complete, level 1 continued
    for k, (want, _, _) in enumerate(expected_levels(data, VOXEL, OFFSET, 3, "mean")):
        np.testing.assert_array_equal(ef.open(str(out / f"s{k}")).array[0], want, err_msg=f"level {k}")
    attrs = dict(zarr.open_group(str(out), mode="r").attrs)
    assert [d["path"] for d in attrs["ome"]["multiscales"][0]["datasets"]] == ["s0", "s1", "s2"]


@pytest.mark.parametrize("options,message", [
    (dict(levels=7), r"levels=7 is too many for .*out.zarr/raw: level 6 would halve the axis x of level 5, which is "
                     r"1 voxel wide \(shape \(2, 2, 1\)\); at most 6 levels"),
    (dict(levels=0), r"levels must be an integer >= 1, got 0"),
    (dict(levels=2.5), r"levels must be an integer >= 1, got 2.5"),
    (dict(levels=2, downsampling="median"), r"downsampling must be one of mean, mode, got 'median'"),
    (dict(downsampling="mode"), r"downsampling='mode' makes the coarser levels of a pyramid; with levels=1 there are "
                                r"none: give more levels, or leave downsampling out"),
])
def test_bad_pyramid_settings_are_refused_naming_the_value(tmp_path, raw_source, options, message):
    path, _ = raw_source
    with pytest.raises(ConvertError, match=message):
        convert(str(path) + "/raw", tmp_path / "out.zarr/raw", **options)
    assert not (tmp_path / "out.zarr").exists()


def test_a_pyramid_goes_to_zarr_and_not_over_an_array(tmp_path, raw_source, capsys):
    path, _ = raw_source
    with pytest.raises(ConvertError, match=r"levels=2: a multiscale pyramid is written to zarr .*, not to the HDF5"):
        convert(str(path) + "/raw", tmp_path / "out.h5/raw", levels=2)
    convert(str(path) + "/raw", tmp_path / "out.zarr/raw")
    before = tree_digest(tmp_path / "out.zarr")
    assert main(["convert", str(path) + "/raw", str(tmp_path / "out.zarr/raw"), "--levels", "2"]) == 2
    assert "out.zarr/raw is an array; a pyramid's levels go into a group of that name" in capsys.readouterr().err
    assert tree_digest(tmp_path / "out.zarr") == before
    # an audit of convert's promises: with --overwrite emfast's own array is replaced by the pyramid (it was
    # refused), and a single level over that pyramid was called "not written by emfast"
    assert main(["convert", str(path) + "/raw", str(tmp_path / "out.zarr/raw"), "--levels", "2", "--overwrite"]) == 0
    assert ef.open(tmp_path / "out.zarr/raw", level=1).shape == ef.open(tmp_path / "out.zarr/raw/s1").shape
    capsys.readouterr()
    assert main(["convert", str(path) + "/raw", str(tmp_path / "out.zarr/raw")]) == 2
    refused = capsys.readouterr().err
    assert "out.zarr/raw is a multiscale image (levels s0, s1), not an array; choose another output" in refused
    assert "--levels)" not in refused  # a flag without its number (and levels=True from Python, a review)
    theirs = zarr.open_group(str(tmp_path / "theirs.zarr"), mode="w").create_array("raw", shape=(4, 4, 4),
                                                                                 dtype=np.uint8)
    theirs[...] = 7
    assert main(["convert", str(path) + "/raw", str(tmp_path / "theirs.zarr/raw"), "--levels", "2",
                 "--overwrite"]) == 2
    assert "not written by emfast" in capsys.readouterr().err and (theirs[...] == 7).all()


def test_an_ome_zarr_py_image_converts_with_its_geometry_and_the_pyramid_of_ome_zarr_py_itself(tmp_path):
    """An image ome-zarr-py wrote (t, c, z, y, x in micrometres, with its own two-level pyramid) converts to
    (c, z, y, x) in nanometres with the same geometry, and ``levels=2`` places level 1 where ome-zarr-py placed its
    own level 1 (the same voxel size and half-voxel shift)."""
    needs("ome_zarr")
    persistence = needs("funlib.persistence")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader
    from ome_zarr.writer import write_image
    data = np.random.default_rng(8).integers(0, 256, (1, 2, 6, 20, 18), dtype=np.uint8)
    microns = {"z": 0.04, "y": 0.008, "x": 0.008}
    write_image(data, zarr.open_group(str(tmp_path / "in.zarr"), mode="w"), axes="tczyx", scale_factors=(2,),
                scale=microns, axes_units={axis: "micrometer" for axis in "zyx"})
    before = tree_digest(tmp_path / "in.zarr")
    convert(str(tmp_path / "in.zarr"), tmp_path / "out.zarr/image", levels=2)
    assert tree_digest(tmp_path / "in.zarr") == before

    def image(path):
        return [node for node in Reader(parse_url(str(path)))() if node.load(Multiscales)][0]

    theirs, ours = image(tmp_path / "in.zarr"), image(tmp_path / "out.zarr/image")
    assert [(a["name"], a["type"], a.get("unit")) for a in ours.metadata["axes"]] == [
        ("c", "channel", None), ("z", "space", "nanometer"), ("y", "space", "nanometer"), ("x", "space", "nanometer")]
    for k in range(2):
        (their_scale, their_shift), (scale, shift) = (image.metadata["coordinateTransformations"][k]
                                                      for image in (theirs, ours))
        assert scale["scale"][1:] == pytest.approx([1000 * s for s in their_scale["scale"][2:]])
        assert shift["translation"][1:] == pytest.approx([1000 * t for t in their_shift["translation"][2:]])
    np.testing.assert_array_equal(np.asarray(ours.data[0]), data[0])
    np.testing.assert_array_equal(np.asarray(ours.data[1]), np.stack(
        [reference_level(channel, (1, 2, 2), "mean") for channel in data[0]]))
    array = persistence.open_ds(str(tmp_path / "out.zarr/image/s1"), mode="r")
    assert tuple(array.voxel_size) == (40, 16, 16) and list(array.axis_names) == ["c^", "z", "y", "x"]


@pytest.mark.parametrize("open_level", ["by index", "by path"])
def test_a_coarser_level_as_labels_lines_up_with_raw_voxel_for_voxel(tmp_path, open_level):
    """Level 1 of a label pyramid given as labels of a finer raw: its OME translation (the centre of its first
    voxel) was taken for the corner, and every label landed one raw voxel off in y and x (7168 of 16384)."""
    shape = (8, 64, 64)
    raw = np.arange(np.prod(shape), dtype=np.uint16).reshape(shape)  # each voxel holds its own index
    ids = (np.arange(8 * 32 * 32, dtype=np.uint64) + 1).reshape(8, 32, 32)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=raw).attrs.update(resolution=(40, 2, 2), offset=(0, 0, 0))
        f.create_dataset("labels", data=ids).attrs.update(resolution=(40, 4, 4), offset=(0, 0, 0))
    convert(str(tmp_path / "in.h5/labels"), tmp_path / "out.zarr/labels", levels=2)
    level1 = (ef.open(tmp_path / "out.zarr", "labels", level=1) if open_level == "by index"
              else ef.open(tmp_path / "out.zarr/labels/s1"))
    assert level1.resolution == (40, 8, 8) and level1.offset == (0, 0, 0)
    coarse = np.asarray(level1)[0]
    sample = ef.Sample(ef.hdf5(tmp_path / "in.h5", "raw"), labels=level1)
    with ef.Loader(sample, patch=(2, 16, 16), batch_size=4, augment=(), normalize=(1, 0), seed=0) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            z, y, x = np.unravel_index(batch["raw"][:, 0].astype(np.int64), shape)
            # raw voxel y covers [2y, 2y + 2) nm, level-1 voxel j [8j, 8j + 8): j = y // 4
            np.testing.assert_array_equal(batch["labels"][:, 0], coarse[z, y // 4, x // 4])


def test_a_pyramid_whose_levels_state_the_ome_translation_as_their_offset_still_opens(tmp_path):
    """emfast's earlier pyramids wrote the OME translation (the centre) as each level's funlib offset too."""
    zarr = needs("zarr")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((4, 16, 16), np.uint8)).attrs.update(resolution=(40, 4, 4),
                                                                                   offset=(0, 8, 8))
    convert(str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw", levels=2)
    zarr.open_array(str(tmp_path / "out.zarr/raw/s1"), mode="r+").attrs["offset"] = [0, 10, 10]
    assert ef.open(tmp_path / "out.zarr/raw", level=1).offset == (0, 8, 8)
    assert ef.open(tmp_path / "out.zarr/raw/s1").offset == (0, 8, 8)  # by its path: as the image places it
    zarr.open_array(str(tmp_path / "out.zarr/raw/s1"), mode="r+").attrs["offset"] = [0, 12, 12]
    with pytest.raises(ef.io.StoreMetadataError, match=r"contradictory metadata: its offset \(z, y, x\) = "
                                                       r"\(0.0, 12.0, 12.0\) nm but the OME-NGFF translation"):
        ef.open(tmp_path / "out.zarr/raw", level=1)


def test_overwriting_a_pyramid_with_fewer_levels_drops_the_old_ones(tmp_path):
    """The image still listed the old image's coarser levels, which viewers show when zoomed out."""
    needs("ome_zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader
    rng = np.random.default_rng(3)
    first, second = rng.integers(0, 100, (8, 32, 32), np.uint8), rng.integers(150, 255, (8, 32, 32), np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        for name, data in (("first", first), ("second", second)):
            f.create_dataset(name, data=data).attrs["resolution"] = (40, 4, 4)
    convert(str(tmp_path / "in.h5/first"), tmp_path / "out.zarr/raw", levels=4)
    assert (tmp_path / "out.zarr/raw/s3").is_dir()
    convert(str(tmp_path / "in.h5/second"), tmp_path / "out.zarr/raw", levels=2, overwrite=True)
    image = [node for node in Reader(parse_url(str(tmp_path / "out.zarr/raw")))() if node.load(Multiscales)][0]
    expected = expected_levels(second, (40.0, 4.0, 4.0), (0.0, 0.0, 0.0), 2, "mean")
    assert len(image.data) == 2
    for level, (want, _, _) in zip(image.data, expected):
        np.testing.assert_array_equal(np.asarray(level), want)
    assert not (tmp_path / "out.zarr/raw/s2").exists() and not (tmp_path / "out.zarr/raw/s3").exists()


def test_a_pyramid_into_another_programs_image_is_refused_untouched(tmp_path):
    zarr = needs("zarr")
    group = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", path="raw")
    group.create_array("0", shape=(8, 32, 32), dtype=np.uint8)[...] = 7
    group.attrs["multiscales"] = [{"version": "0.4", "axes": ["z", "y", "x"], "datasets": [
        {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [40, 4, 4]}]}]}]
    _pyramid_refused_untouched(tmp_path, "img.zarr", "raw",
                               r"img.zarr/raw is an OME-NGFF image of other datasets \(0\)")


def _pyramid_refused_untouched(tmp_path, container: str, dataset: str, message: str) -> None:
    """A pyramid written into ``container/dataset`` is refused with ``message``, with or without overwrite, and the
    container is left as it was."""
    before = tree_digest(tmp_path / container)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 32, 32), np.uint8))
    for overwrite in (False, True):
        with pytest.raises(ConvertError, match=message):
            convert(str(tmp_path / "in.h5/raw"), tmp_path / container / dataset, levels=2, overwrite=overwrite)
        assert tree_digest(tmp_path / container) == before


def test_a_pyramid_into_another_programs_group_of_datasets_is_refused_untouched(tmp_path):
    """A group another program made, holding its own arrays, got emfast's levels beside them and OME metadata over
    its attributes (the same group listing an image was refused). A resumed pyramid's group holds levels alone."""
    zarr = needs("zarr")
    group = zarr.open_group(str(tmp_path / "f.zarr"), mode="w", path="grp")
    group.attrs["mine"] = 1
    group.create_array("their_labels", shape=(8, 32, 32), dtype=np.uint8)[...] = 7
    _pyramid_refused_untouched(tmp_path, "f.zarr", "grp",
                               r"f.zarr/grp is a group holding other datasets \(their_labels\)")


@pytest.mark.parametrize("damage", ["image a string", "transforms a dict", "scale with null"])
def test_a_level_by_its_path_under_malformed_multiscales_opens_with_its_own_attributes(tmp_path, damage):
    zarr = needs("zarr")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = (40, 4, 4)
    convert(str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw", levels=2)
    group = zarr.open_group(str(tmp_path / "out.zarr/raw"), mode="r+")
    attributes = dict(group.attrs)
    image = attributes["ome"]["multiscales"][0]
    if damage == "image a string":
        attributes["ome"]["multiscales"] = ["s1"]
    elif damage == "transforms a dict":
        image["datasets"][1]["coordinateTransformations"] = {"type": "scale"}
    else:
        image["datasets"][1]["coordinateTransformations"][0]["scale"] = [None, 8, 8]
    group.attrs["ome"] = attributes["ome"]
    with ef.open(tmp_path / "out.zarr/raw/s1") as level:  # raised AttributeError; its own attributes place it
        assert level.resolution == (40, 8, 8) and level.offset == (0, 0, 0)


@pytest.mark.parametrize("level, shape", [("s3", (8, 4, 4)), ("s1", (8, 16, 16))], ids=["stale", "rewritten"])
def test_an_overwrite_refused_for_a_level_not_emfasts_writes_nothing(tmp_path, level, shape):
    """The user's own array at a level the overwrite removes (s3) or rewrites (s1): levels were rewritten, a
    stale one deleted, and only then was it refused, leaving an image that mixed new and old levels or listed
    one that no longer existed."""
    zarr = needs("zarr")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = (40, 4, 4)
        f.create_dataset("other", data=np.full((8, 32, 32), 7, np.uint8)).attrs["resolution"] = (40, 4, 4)
    convert(str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw", levels=4)
    zarr.create_array(str(tmp_path / f"out.zarr/raw/{level}"), shape=shape, dtype=np.uint8, overwrite=True)[...] = 5
    before = tree_digest(tmp_path / "out.zarr")
    with pytest.raises(ConvertError, match=rf"raw/{level} exists and was not written by emfast"):
        convert(str(tmp_path / "in.h5/other"), tmp_path / "out.zarr/raw", levels=2, overwrite=True)
    assert tree_digest(tmp_path / "out.zarr") == before


def test_a_failed_read_of_the_image_above_a_level_is_raised_not_hidden(tmp_path, monkeypatch):
    """Only malformed multiscales fall back to the array's own attributes; a read that fails (a remote store's
    timeout) was hidden, and the level opened without a voxel size."""
    zarr = needs("zarr")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = (40, 4, 4)
    convert(str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw", levels=2)
    opened = zarr.open

    def failing(*args, **kwargs):
        if kwargs.get("path") == "raw":
            raise TimeoutError("read timed out")
        return opened(*args, **kwargs)

    monkeypatch.setattr(zarr, "open", failing)
    with pytest.raises(TimeoutError, match="read timed out"):
        ef.open(tmp_path / "out.zarr/raw/s1")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_pyramid_rerun_with_nothing_to_do_rewrites_nothing(tmp_path, zarr_format):
    """The image group's metadata was written again with the same bytes (its modification time changed)."""
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = (40, 4, 4)
    convert(str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw", levels=3, zarr_format=zarr_format)
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "out.zarr").rglob("*") if p.is_file()}
    time.sleep(0.01)  # a rewrite would show in the modification times
    assert convert(str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw", levels=3).written == 0
    assert {p: p.stat().st_mtime_ns for p in files} == files


def _transforms(group_path, dataset):
    """(scale, translation) the OME-NGFF multiscales on ``group_path`` give ``dataset``."""
    attributes = dict(zarr.open_group(str(group_path), mode="r").attrs)
    image = attributes.get("ome", attributes)["multiscales"][0]
    transforms = next(d for d in image["datasets"] if d["path"] == dataset)["coordinateTransformations"]
    return transforms[0]["scale"][-3:], transforms[1]["translation"][-3:]


def test_a_coarser_level_converted_or_predicted_alone_keeps_its_ome_placement(tmp_path):
    """A pyramid's level 1 converted alone got translation 0 where the image gives it 4 (half a level-0 voxel
    off in OME readers: ome-zarr-py, napari), its own pyramid's next level 8 where it is 12, a prediction over it
    0 (found by a helper comparing emfast's outputs with ome-zarr-py). The OME translation now follows the
    level's; funlib's offset stays the corner, and emfast reads every output back where the level is."""
    data = (np.indices((8, 16, 16)).sum(0) * 5 % 256).astype(np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data).attrs.update(resolution=(8.0, 8.0, 8.0), offset=(0.0, 0.0, 0.0))
    convert(str(tmp_path / "in.h5/raw"), tmp_path / "pyr.zarr/raw", levels=3)
    levels = [_transforms(tmp_path / "pyr.zarr/raw", f"s{n}") for n in range(3)]
    assert levels[1] == ([16.0] * 3, [4.0] * 3) and levels[2] == ([32.0] * 3, [12.0] * 3)  # level-0 centres
    level1 = ef.open(tmp_path / "pyr.zarr/raw", level=1)
    convert(str(tmp_path / "pyr.zarr/raw"), tmp_path / "one.zarr/raw", level=1)
    assert _transforms(tmp_path / "one.zarr", "raw") == levels[1]
    convert(str(tmp_path / "pyr.zarr/raw"), tmp_path / "two.zarr/raw", level=1, levels=2)
    assert [_transforms(tmp_path / "two.zarr/raw", f"s{n}") for n in range(2)] == levels[1:]
    ef.predict(lambda batch: batch, level1, tmp_path / "pred.zarr/p", patch_in=(4, 4, 4), blend="none")
    assert _transforms(tmp_path / "pred.zarr", "p") == levels[1]
    for path in ("one.zarr/raw", "two.zarr/raw", "pred.zarr/p"):
        opened = ef.open(tmp_path / path)
        assert (opened.resolution, opened.offset) == (level1.resolution, level1.offset) == ((16.0,) * 3, (0.0,) * 3)
        array = tmp_path / (path + "/s0" if path.startswith("two") else path)
        assert zarr.open_array(str(array), mode="r").attrs["offset"] == [0.0] * 3  # funlib: the corner
    np.testing.assert_array_equal(ef.open(tmp_path / "one.zarr/raw").array, level1.array)
    # HDF5 has no OME metadata: an HDF5 output keeps the translation beside its offset, and a zarr output made
    # from it is placed as the level was (it was placed as a level 0, half a voxel off: a review)
    convert(str(tmp_path / "pyr.zarr/raw"), tmp_path / "one.h5/raw", level=1)
    ef.predict(lambda batch: batch, level1, tmp_path / "pred.h5/p", patch_in=(4, 4, 4), blend="none")
    for path in ("one.h5/raw", "pred.h5/p"):
        opened = ef.open(tmp_path / path)
        assert (opened.resolution, opened.offset, opened.translation) == (level1.resolution, level1.offset,
                                                                          level1.translation)
        convert(str(tmp_path / path), tmp_path / f"via-{path[:3]}.zarr/raw")
        assert _transforms(tmp_path / f"via-{path[:3]}.zarr", "raw") == levels[1]
    # a review: a binned-looking offset that the image's first level does not imply stays contradictory
    zarr.open_array(str(tmp_path / "pyr.zarr/raw/s1"), mode="r+").attrs["offset"] = [-2.0] * 3  # "factor 4"
    with pytest.raises(ef.io.StoreMetadataError, match="contradictory metadata"):
        ef.open(tmp_path / "pyr.zarr/raw", level=1)
    for wrong in (4 + 0.5, 4 - 2.0):  # past the translation; a shift no binning by 1.75 or more gives
        zarr.open_array(str(tmp_path / "one.zarr/raw"), mode="r+").attrs["offset"] = [wrong] * 3
        with pytest.raises(ef.io.StoreMetadataError, match="contradictory metadata"):
            ef.open(tmp_path / "one.zarr/raw")


def test_a_level_binned_by_a_factor_that_is_not_whole_converts_to_an_output_emfast_reads(tmp_path):
    """ome-zarr-py's scales follow the shapes (30 voxels to 7: a factor of 4.29): its level converted alone was
    written, then refused by emfast as contradictory (found by a helper converting remote stores)."""
    group = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", zarr_format=2)
    group.create_array("s0", data=np.arange(20 * 30 * 40, dtype=np.uint16).reshape(20, 30, 40) % 251)
    group.create_array("s1", data=np.ones((20, 7, 10), np.uint16))
    ratio_y, ratio_x = 30 / 7, 40 / 10
    group.attrs["multiscales"] = [{"version": "0.4", "name": "img", "axes": [
        {"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"], "datasets": [
        {"path": "s0", "coordinateTransformations": [{"type": "scale", "scale": [40.0, 4.0, 4.0]}]},
        {"path": "s1", "coordinateTransformations": [
            {"type": "scale", "scale": [40.0, 4.0 * ratio_y, 4.0 * ratio_x]},
            {"type": "translation", "translation": [0.0, 2.0 * (ratio_y - 1), 2.0 * (ratio_x - 1)]}]}]}]
    level = ef.open(tmp_path / "img.zarr", level=1)
    convert(str(tmp_path / "img.zarr"), tmp_path / "out.zarr/raw", level=1)
    again = ef.open(tmp_path / "out.zarr/raw")
    assert (again.resolution, again.offset, again.translation) == (level.resolution, level.offset, level.translation)


def pyramid_levels(path, count):
    """Each level's (voxel size, offset, data) as emfast opens it, and the image's OME-NGFF description."""
    zarr = needs("zarr")
    levels = []
    for level in range(count):
        with ef.open(path / f"s{level}") as volume:
            levels.append((volume.resolution, volume.offset, np.asarray(volume)))
    attributes = dict(zarr.open_group(str(path), mode="r").attrs)
    return levels, attributes.get("ome", attributes)["multiscales"]


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("placed", [((80, 8, 8), (160, 16, 16)), ((40, 4, 4), (40, 40, 40))],
                         ids=["voxel size", "offset"])
def test_a_pyramid_overwritten_from_an_input_placed_elsewhere_equals_one_written_afresh(tmp_path, zarr_format,
                                                                                       placed):
    """convert --levels --overwrite from an input of another voxel size or offset read its new s0 against the
    replaced image's description to make s1, and failed ("contradictory metadata"): s0 new, the other levels and
    the description old, and every rerun failed the same way (a review)."""
    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("a", data=rng.integers(0, 255, (8, 32, 32), np.uint8)).attrs["resolution"] = VOXEL
        b = f.create_dataset("b", data=rng.integers(0, 255, (8, 32, 32), np.uint8))
        b.attrs["resolution"], b.attrs["offset"] = placed
    convert(str(tmp_path / "in.h5/a"), tmp_path / "out.zarr/img", levels=3, zarr_format=zarr_format)
    convert(str(tmp_path / "in.h5/b"), tmp_path / "out.zarr/img", levels=3, overwrite=True)
    convert(str(tmp_path / "in.h5/b"), tmp_path / "fresh.zarr/img", levels=3, zarr_format=zarr_format)
    (levels, image), (fresh_levels, fresh_image) = (pyramid_levels(tmp_path / f"{name}.zarr/img", 3)
                                                    for name in ("out", "fresh"))
    assert image == fresh_image
    for (resolution, offset, data), (fresh_resolution, fresh_offset, fresh_data) in zip(levels, fresh_levels):
        assert resolution == fresh_resolution and offset == fresh_offset
        np.testing.assert_array_equal(data, fresh_data)
    assert levels[0][:2] == (tuple(map(float, placed[0])), tuple(map(float, placed[1])))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_one_level_overwritten_from_an_input_placed_elsewhere_is_refused_and_the_pyramid_kept(tmp_path, zarr_format):
    """A pyramid's s0 overwritten alone from an input at another offset: the image kept its old translation for
    it, and emfast.open refused the new level as contradictory metadata (a review); its coarser levels are placed
    from s0, so moving s0 alone cannot be described either. Refused before anything is written; one placed as the
    image places it is still replaced."""
    rng = np.random.default_rng(1)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        for name, offset in [("a", (0, 0, 0)), ("b", (40, 40, 40)), ("c", (0, 0, 0))]:
            data = f.create_dataset(name, data=rng.integers(0, 255, (8, 32, 32), np.uint8))
            data.attrs["resolution"], data.attrs["offset"] = VOXEL, offset
    convert(str(tmp_path / "in.h5/a"), tmp_path / "out.zarr/img", levels=2, zarr_format=zarr_format)
    before = tree_digest(tmp_path / "out.zarr")
    with pytest.raises(ConvertError, match=r"img/s0 is level s0 of the OME-NGFF image .*out.zarr/img, which places "
                                           r"it at voxel size \(40.0, 4.0, 4.0\) nm, offset \(0.0, 0.0, 0.0\) nm; "
                                           r"the input is at .* offset \(40.0, 40.0, 40.0\) nm"):
        convert(str(tmp_path / "in.h5/b"), tmp_path / "out.zarr/img/s0", overwrite=True)
    assert tree_digest(tmp_path / "out.zarr") == before
    convert(str(tmp_path / "in.h5/c"), tmp_path / "out.zarr/img/s0", overwrite=True)
    levels, _ = pyramid_levels(tmp_path / "out.zarr/img", 2)
    with h5py.File(tmp_path / "in.h5") as f:
        np.testing.assert_array_equal(levels[0][2][0], f["c"][...])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_prediction_into_a_level_of_a_3d_pyramid_is_refused_before_anything_is_written(tmp_path, zarr_format):
    """predict writes (c, z, y, x): into s0 of a 3-D pyramid, placed as the image places it, it was accepted and
    left that level unreadable ("4-D array but 3 axes", a review)."""
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("a", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = VOXEL
    convert(str(tmp_path / "in.h5/a"), tmp_path / "out.zarr/img", levels=2, zarr_format=zarr_format)
    before = tree_digest(tmp_path / "out.zarr")
    with pytest.raises(FileExistsError, match=r"img/s0 is level s0 of the OME-NGFF image .*, whose levels have the "
                                              r"axes \(z, y, x\); this output has 4 axes"):
        ef.predict(lambda batch: batch, str(tmp_path / "in.h5/a"), str(tmp_path / "out.zarr/img/s0"),
                   patch_in=(8, 16, 16), overwrite=True)
    assert tree_digest(tmp_path / "out.zarr") == before


def test_a_level_of_another_programs_pyramid_is_refused_as_not_emfasts(tmp_path):
    """Written over from an input placed elsewhere, a level of an ome-zarr-py pyramid was refused with advice to
    rewrite the whole pyramid, which is refused too: it is not emfast's (a review)."""
    needs("ome_zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image
    zarr = needs("zarr")
    group = zarr.open_group(parse_url(str(tmp_path / "omz.zarr"), mode="w").store, path="img", mode="a")
    write_image(np.zeros((8, 32, 32), np.uint8), group, axes="zyx")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("a", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = VOXEL
    before = tree_digest(tmp_path / "omz.zarr")
    attributes = dict(zarr.open_group(str(tmp_path / "omz.zarr/img"), mode="r").attrs)
    first = attributes.get("ome", attributes)["multiscales"][0]["datasets"][0]["path"]
    with pytest.raises(ConvertError, match=rf"img/{first} exists and was not written by emfast"):
        convert(str(tmp_path / "in.h5/a"), tmp_path / f"omz.zarr/img/{first}", overwrite=True)
    assert tree_digest(tmp_path / "omz.zarr") == before


@pytest.mark.parametrize("where", ["img", ""], ids=["in a group", "at the root"])
def test_a_prediction_into_a_missing_level_of_a_3d_image_is_refused_wherever_the_image_is(tmp_path, where):
    """ome-zarr-py writes its images at the store's root: the level checks gave up there, and a 4-D prediction
    into a level the root image lists (deleted) was accepted and made the image unreadable (a review)."""
    needs("ome_zarr")
    import shutil
    from ome_zarr.io import parse_url
    from ome_zarr.writer import write_image
    zarr = needs("zarr")
    store = parse_url(str(tmp_path / "omz.zarr"), mode="w").store
    write_image(np.zeros((8, 64, 64), np.uint8), zarr.open_group(store, path=where, mode="a"), axes="zyx",
                scale_factors=[2])
    image = tmp_path / "omz.zarr" / where if where else tmp_path / "omz.zarr"
    attributes = dict(zarr.open_group(str(image), mode="r").attrs)
    first = attributes.get("ome", attributes)["multiscales"][0]["datasets"][0]["path"]
    shutil.rmtree(image / first)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("a", data=np.zeros((8, 64, 64), np.uint8))
    before = tree_digest(tmp_path / "omz.zarr")
    with pytest.raises(FileExistsError, match=rf"{first} is level {first} of the OME-NGFF image .*omz.zarr"
                                              rf"{'/img' if where else ''}, whose levels have the axes"):
        ef.predict(lambda batch: batch, str(tmp_path / "in.h5/a"), str(image / first), patch_in=(8, 16, 16))
    assert tree_digest(tmp_path / "omz.zarr") == before
