"""emfast's own outputs (predict and convert, zarr v2 and v3) read by the field's tools with the geometry emfast
meant, and written into stores those tools made without hiding what they hold."""
import json

import numpy as np
import pytest

import emfast as ef
from emfast.io import convert as emfast_convert

zarr = pytest.importorskip("zarr")

SHAPE = (13, 17, 11)
VOXEL = (40.0, 8.0, 4.0)
OFFSET = (400.0, 80.0, 40.0)


def needs(module):
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install '.[interop]')")


def crop(batch):
    """The identity network on an input patch (10, 20, 20) with an output patch (6, 12, 12)."""
    return batch[:, :, 2:-2, 4:-4, 4:-4]


@pytest.fixture
def source(tmp_path):
    """A zarr v3 input with gunpowder's resolution and offset."""
    data = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
    array = zarr.create_array(str(tmp_path / "in.zarr"), name="raw", shape=SHAPE, dtype=np.uint8, chunks=(8, 8, 8))
    array[...] = data
    array.attrs.update(resolution=list(VOXEL), offset=list(OFFSET))
    return tmp_path / "in.zarr/raw", data


def predict(source_path, out):
    return ef.predict(crop, str(source_path), str(out), patch_in=(10, 20, 20), patch_out=(6, 12, 12))


def convert(source_path, out, zarr_format=3):
    return emfast_convert(str(source_path), str(out), zarr_format=zarr_format)


def write(how, source_path, out, zarr_format):
    if how == "predict":
        predict(source_path, out)
    else:
        convert(source_path, out, zarr_format)


def assert_emfast_geometry(path, channels):
    with ef.open(str(path)) as volume:
        assert volume.channels == channels and volume.shape == SHAPE
        assert volume.resolution == pytest.approx(VOXEL)
        assert volume.offset == pytest.approx(OFFSET)


@pytest.mark.parametrize("how,zarr_format", [("predict", 3), ("convert", 3), ("convert", 2)])
def test_funlib_persistence_reads_the_geometry_of_emfast_outputs(tmp_path, source, how, zarr_format):
    persistence = needs("funlib.persistence")
    out = tmp_path / "out.zarr/result"
    write(how, source[0], out, zarr_format)
    array = persistence.open_ds(str(out), mode="r")
    channels = 1 if how == "predict" else 0
    assert tuple(array.voxel_size) == VOXEL
    assert tuple(array.offset) == OFFSET
    assert list(array.axis_names) == ["c^", "z", "y", "x"][1 - channels:]
    assert list(array.units) == ["nm"] * 3
    assert_emfast_geometry(out, max(channels, 1))


@pytest.mark.parametrize("how", ["predict", "convert"])
def test_tensorstore_finds_the_dimension_names_of_zarr3_outputs(tmp_path, source, how):
    ts = needs("tensorstore")
    out = tmp_path / "out.zarr/result"
    write(how, source[0], out, 3)
    array = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(out)}}).result()
    labels = ["c", "z", "y", "x"] if how == "predict" else ["z", "y", "x"]
    assert list(array.domain.labels) == labels
    assert tuple(array.shape)[-3:] == SHAPE


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_converted_volume_keeps_its_geometry_and_not_the_sources_axis_order(tmp_path, zarr_format):
    """A funlib source stored (x, y, z), its dimensions named for xarray too, is converted to (z, y, x): neither
    its axis_names nor xarray's _ARRAY_DIMENSIONS may come along (xarray read the output with x and z swapped);
    a v2 output names its own dimensions for xarray."""
    xarray = needs("xarray")
    data = np.arange(np.prod(SHAPE), dtype=np.uint16).reshape(SHAPE)
    array = zarr.create_array(str(tmp_path / "in.zarr"), name="raw", shape=SHAPE[::-1], dtype=np.uint16,
                              zarr_format=2)
    array[...] = data.transpose()
    array.attrs.update(axis_names=["x", "y", "z"], voxel_size=list(VOXEL[::-1]), offset=list(OFFSET[::-1]),
                       units=["nm"] * 3, _ARRAY_DIMENSIONS=["x", "y", "z"])
    assert dict(xarray.open_zarr(tmp_path / "in.zarr", consolidated=False)["raw"].sizes) == dict(
        zip("zyx", SHAPE))
    convert(tmp_path / "in.zarr/raw", tmp_path / "out.zarr/raw", zarr_format)
    assert_emfast_geometry(tmp_path / "out.zarr/raw", 1)
    with ef.open(str(tmp_path / "out.zarr/raw")) as volume:
        np.testing.assert_array_equal(np.asarray(volume)[0], data)
    output = xarray.open_zarr(tmp_path / "out.zarr", consolidated=False, mask_and_scale=False)["raw"]
    assert dict(output.sizes) == dict(zip("zyx", SHAPE))
    np.testing.assert_array_equal(output.values, data)


def zarr_python_v2_store(path):
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    group.create_array("volumes/raw", shape=SHAPE, dtype=np.uint8, chunks=(8, 8, 8))[...] = 7
    return "volumes/raw"


def tensorstore_v2_store(path):
    ts = needs("tensorstore")
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path / "volumes/raw")},
            "schema": {"domain": {"shape": list(SHAPE)}, "dtype": "uint8",
                       "chunk_layout": {"chunk": {"shape": [8, 8, 8]}}}, "create": True}
    ts.open(spec).result()[...] = np.full(SHAPE, 7, np.uint8)
    return "volumes/raw"


@pytest.mark.parametrize("how", ["predict", "convert"])
@pytest.mark.parametrize("make", [zarr_python_v2_store, tensorstore_v2_store])
def test_writing_into_a_v2_store_keeps_its_format_and_its_arrays(tmp_path, source, how, make):
    store = tmp_path / "store.zarr"
    existing = make(store)
    write(how, source[0], store / "result", 3)
    assert not (store / "zarr.json").exists(), "a zarr v3 root was added over a v2 store"
    assert (store / "result/.zarray").is_file() and not (store / "result/zarr.json").exists()
    with ef.open(str(store / existing)) as volume:
        assert volume.shape == SHAPE and int(np.asarray(volume).max()) == 7
    assert_emfast_geometry(store / "result", 1)
    assert zarr.open_array(str(store), path=existing, mode="r")[...].min() == 7
    if make is tensorstore_v2_store:
        ts = needs("tensorstore")
        array = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(store / existing)}}).result()
        assert int(array.read().result().min()) == 7
    attributes = json.loads((store / "result/.zattrs").read_text())
    assert attributes["voxel_size"] == list(VOXEL) and "dimension_names" not in attributes


@pytest.mark.parametrize("how,zarr_format", [("predict", 3), ("convert", 3), ("convert", 2)])
def test_ome_zarr_py_finds_the_output_as_an_image_with_its_geometry(tmp_path, source, how, zarr_format):
    needs("ome_zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    out = tmp_path / "out.zarr/result"
    write(how, source[0], out, zarr_format)
    images = [node for node in Reader(parse_url(str(tmp_path / "out.zarr")))() if node.load(Multiscales)]
    assert len(images) == 1
    metadata = images[0].metadata
    lead = [1.0] if how == "predict" else []
    assert [axis["name"] for axis in metadata["axes"]] == ["c", "z", "y", "x"][1 - len(lead):]
    assert [axis.get("unit") for axis in metadata["axes"]][-3:] == ["nanometer"] * 3
    scale, translation = metadata["coordinateTransformations"][0]
    assert scale["scale"] == lead + list(VOXEL)
    assert translation["translation"] == [0.0] * len(lead) + list(OFFSET)
    assert tuple(images[0].data[0].shape)[-3:] == SHAPE
    assert_emfast_geometry(tmp_path / "out.zarr", len(lead) or 1)


def test_an_image_described_on_the_parent_group_is_kept(tmp_path, source):
    """The output's parent already describes another image: emfast adds its output beside it, not over it."""
    group = zarr.open_group(str(tmp_path / "out.zarr"), mode="w", zarr_format=2)
    group.create_array("0", shape=SHAPE, dtype=np.uint8)
    theirs = [{"version": "0.4", "axes": [{"name": a, "type": "space"} for a in "zyx"],
               "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 1, 1]}]}]}]
    group.attrs["multiscales"] = theirs
    convert(source[0], tmp_path / "out.zarr/result")
    assert zarr.open_group(str(tmp_path / "out.zarr"), mode="r").attrs["multiscales"] == theirs


@pytest.mark.parametrize("how", ["predict", "convert"])
def test_an_output_overwritten_beside_others_takes_its_new_geometry_into_its_ome_description(tmp_path, source, how):
    """An output described as its group's image while alone, then joined by another, then overwritten from an input
    placed elsewhere: its description kept the old voxel size and offset (a review), so OME readers placed the new
    data where the old was, and emfast refused to open it ("contradictory metadata")."""
    needs("ome_zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    moved = zarr.open_array(str(source[0]), mode="r+")
    write(how, source[0], tmp_path / "out.zarr/result", 3)
    write(how, source[0], tmp_path / "out.zarr/other", 3)
    moved.attrs.update(resolution=[8.0, 8.0, 8.0], offset=[0.0, 16.0, 8.0])
    if how == "predict":
        ef.predict(crop, str(source[0]), str(tmp_path / "out.zarr/result"), patch_in=(10, 20, 20),
                   patch_out=(6, 12, 12), overwrite=True)
    else:
        emfast_convert(str(source[0]), str(tmp_path / "out.zarr/result"), overwrite=True)
    with ef.open(str(tmp_path / "out.zarr/result")) as volume:
        assert volume.resolution == pytest.approx((8, 8, 8)) and volume.offset == pytest.approx((0, 16, 8))
    images = [node for node in Reader(parse_url(str(tmp_path / "out.zarr")))() if node.load(Multiscales)]
    scale, translation = images[0].metadata["coordinateTransformations"][0]
    lead = [1.0] if how == "predict" else []
    assert scale["scale"] == lead + [8.0] * 3
    assert translation["translation"] == [0.0] * len(lead) + [0.0, 16.0, 8.0]
    with ef.open(str(tmp_path / "out.zarr/other")) as volume:  # the other output, beside it, as it was written
        assert volume.resolution == pytest.approx(VOXEL) and volume.offset == pytest.approx(OFFSET)


def test_a_malformed_description_on_the_parent_is_left_as_it_is(tmp_path, source):
    group = zarr.open_group(str(tmp_path / "out.zarr"), mode="w", zarr_format=2)
    group.create_array("theirs", shape=SHAPE, dtype=np.uint8)
    group.attrs["multiscales"] = "not a list"
    convert(source[0], tmp_path / "out.zarr/result", zarr_format=2)
    assert zarr.open_group(str(tmp_path / "out.zarr"), mode="r").attrs["multiscales"] == "not a list"
    assert_emfast_geometry(tmp_path / "out.zarr/result", 1)
