"""Volume formats and transfer backends register like augmentations: a new one is one class and one registration;
``emfast info`` goes through the registered formats and the source protocol, its output pinned for each format;
a multiscale level is ``level=`` for OME-Zarr and precomputed alike."""
import ast
import re
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import emfast as ef
from emfast import _registry
from emfast.cli import main
from emfast.io import PrecomputedSource, Volume, VolumeFormat, formats
from emfast.io._formats import Contents, Listed
from emfast.transfer import DeviceNotice, TransferBackend, resolve_device

SHAPE, CHUNKS = (16, 32, 48), (8, 16, 16)


@pytest.fixture
def raw():
    return np.random.default_rng(3).integers(0, 256, SHAPE, dtype=np.uint8)


def info_lines(capsys, path):
    assert main(["info", str(path)]) == 0
    return capsys.readouterr().out.splitlines()


def assert_values_line(line, data):
    assert f"min={data.min()} max={data.max()} mean={data.mean():.6g}" in line


def test_info_of_hdf5_written_by_h5py(tmp_path, raw, capsys):
    with h5py.File(tmp_path / "a.h5", "w") as file:
        file.attrs["note"] = "x"
        dataset = file.create_dataset("volumes/raw", data=raw, chunks=CHUNKS, compression="gzip")
        dataset.attrs["resolution"], dataset.attrs["offset"] = [40, 4, 4], [80, 8, 4]
        file.create_dataset("meta/table", data=np.arange(5))
    lines = info_lines(capsys, tmp_path / "a.h5")
    assert lines[0] == f"{tmp_path / 'a.h5'}  [note=x]"
    assert lines[1] == "  meta/table: shape=(5,) dtype=int64 chunks=None"  # listed, though not a volume
    assert lines[2] == ("  volumes/raw: shape=(16, 32, 48) dtype=uint8 chunks=(8, 16, 16) gzip resolution=(40.0, 4.0, "
                        "4.0) offset=(80.0, 8.0, 4.0) world=[(80.0, 8.0, 4.0), (720.0, 136.0, 196.0)) nm  "
                        "[offset=[80, 8, 4], resolution=[40, 4, 4]]")
    assert_values_line(lines[3], raw)
    assert len(lines) == 4


def test_info_of_zarr_written_by_zarr_python(tmp_path, raw, capsys):
    root = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    array = root.create_array("raw", shape=SHAPE, chunks=CHUNKS, dtype=raw.dtype)
    array[...] = raw
    array.attrs.update({"resolution": [40, 4, 4], "offset": [80, 8, 4]})
    labels = root.create_array("seg/labels", shape=SHAPE, chunks=CHUNKS, dtype=np.uint64)
    labels[...] = (raw % 7).astype(np.uint64)
    lines = info_lines(capsys, tmp_path / "z.zarr")
    assert lines[0] == str(tmp_path / "z.zarr")
    # zarr-python compresses with zstd by default: the codec and the attributes are shown, as for HDF5
    assert lines[1] == ("  raw: shape=(16, 32, 48) dtype=uint8 chunks=(8, 16, 16) zstd resolution=(40.0, 4.0, 4.0) "
                        "offset=(80.0, 8.0, 4.0) world=[(80.0, 8.0, 4.0), (720.0, 136.0, 196.0)) nm  "
                        "[resolution=[40, 4, 4], offset=[80, 8, 4]]")
    assert_values_line(lines[2], raw)
    assert lines[3] == ("  seg/labels: shape=(16, 32, 48) dtype=uint64 chunks=(8, 16, 16) zstd resolution=None "
                        "offset=None")
    assert "6 labels besides 0" in lines[4] and len(lines) == 5
    assert info_lines(capsys, tmp_path / "z.zarr/seg")[1:] == lines[3:]


def test_info_of_ome_zarr_written_by_ome_zarr_py(tmp_path, raw, capsys):
    writer = pytest.importorskip("ome_zarr.writer")
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w", zarr_format=2)
    writer.write_image(raw, group=group, axes="zyx", scaler=None, storage_options={"chunks": CHUNKS})
    lines = info_lines(capsys, tmp_path / "o.zarr")
    levels = len(group.attrs["multiscales"][0]["datasets"])
    assert lines[1] == (f"  .: shape=(16, 32, 48) dtype=uint8 chunks=(8, 16, 16) zstd (OME-Zarr image: level 0 of "
                        f"{levels}, array s0) resolution=(1.0, 1.0, 1.0) offset=(0.0, 0.0, 0.0) world=[(0.0, 0.0, "
                        "0.0), (16.0, 32.0, 48.0)) nm")
    assert_values_line(lines[2], raw)


def test_info_lists_what_lies_beside_an_ome_zarr_image(tmp_path, raw, capsys):
    """An image group lists its levels as one image, and what else it holds as well: OME-NGFF's labels images
    inside it (written by ome-zarr-py), and an array that a later ``emfast convert`` put beside the image that an
    earlier one described at the store's root. ``info`` showed the image alone."""
    writer = pytest.importorskip("ome_zarr.writer")
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w", zarr_format=2)
    writer.write_image(raw, group=group, axes="zyx", scaler=None, storage_options={"chunks": CHUNKS})
    writer.write_labels((raw % 5).astype(np.uint32), group=group, name="cells", axes="zyx", scaler=None,
                        storage_options={"chunks": CHUNKS})
    lines = info_lines(capsys, tmp_path / "o.zarr")
    names = [line.split(":")[0].strip() for line in lines[1:] if not line.startswith("    ")]
    assert sorted(names) == [".", "labels/cells"]
    image, cells = (next(line for line in lines if line.startswith(f"  {name}: "))
                    for name in (".", "labels/cells"))
    assert "(OME-Zarr image: level 0 of" in image and "dtype=uint8" in image
    assert "(OME-Zarr image: level 0 of" in cells and "dtype=uint32" in cells

    with h5py.File(tmp_path / "in.h5", "w") as file:
        file["raw"], file["labels"] = raw, (raw % 3).astype(np.uint64)
        for name in ("raw", "labels"):
            file[name].attrs["resolution"] = [40, 8, 8]  # the first convert describes the root as raw's image
    assert main(["convert", f"{tmp_path / 'in.h5'}/raw", str(tmp_path / "r.zarr/raw")]) == 0
    assert main(["convert", f"{tmp_path / 'in.h5'}/labels", str(tmp_path / "r.zarr/labels")]) == 0
    capsys.readouterr()
    lines = info_lines(capsys, tmp_path / "r.zarr")
    shown = [line for line in lines[1:] if not line.startswith("    ")]
    assert len(shown) == 2 and shown[0].startswith("  labels: ") and "dtype=uint64" in shown[0]
    assert shown[1].startswith("  .: ") and "(OME-Zarr image: level 0 of 1, array raw)" in shown[1]


def test_info_lists_arrays_below_folders_without_group_metadata(tmp_path, raw, capsys):
    """zarr-python writes ``a/b`` below a root group without a group for ``a``: looking for images there raised
    KeyError ("a bug in emfast")."""
    for zarr_format in (2, 3):
        path = tmp_path / f"implicit{zarr_format}.zarr"
        zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
        zarr.create_array(str(path / "a" / "b"), shape=SHAPE, chunks=CHUNKS, dtype=raw.dtype,
                          zarr_format=zarr_format)[...] = raw  # a store of its own: nothing written for "a"
        lines = info_lines(capsys, path)
        assert lines[1].startswith("  a/b: shape=(16, 32, 48) dtype=uint8") and len(lines) == 3


def test_info_of_n5_written_by_z5py(tmp_path, raw, capsys):
    z5py = pytest.importorskip("z5py")
    data = raw.astype(np.uint16) * 200  # two bytes, stored big-endian: shown in native order as a volume reads it
    dataset = z5py.File(str(tmp_path / "n.n5"), use_zarr_format=False, mode="a").create_dataset(
        "volumes/raw", data=data, chunks=CHUNKS, compression="gzip")
    dataset.attrs["resolution"] = [4, 4, 40]
    lines = info_lines(capsys, tmp_path / "n.n5")
    assert lines[1] == ("  volumes/raw: shape=(16, 32, 48) dtype=uint16 chunks=(8, 16, 16) gzip resolution=(40.0, 4.0, "
                        "4.0) offset=(0.0, 0.0, 0.0) world=[(0.0, 0.0, 0.0), (640.0, 128.0, 192.0)) nm")
    assert_values_line(lines[2], data)


def test_info_of_z5py_groups_that_have_no_attributes_file(tmp_path, raw, capsys):
    """z5py writes no attributes.json for a group without attributes: ``emfast info STORE.n5/volumes`` said "no
    dataset or group 'volumes'; the root holds: nothing"."""
    z5py = pytest.importorskip("z5py")
    z5py.File(str(tmp_path / "n.n5"), use_zarr_format=False, mode="a").create_dataset(
        "volumes/raw", data=raw, chunks=CHUNKS)
    assert not (tmp_path / "n.n5" / "volumes" / "attributes.json").exists()
    lines = info_lines(capsys, tmp_path / "n.n5/volumes")
    assert lines[1].startswith("  volumes/raw: shape=(16, 32, 48) dtype=uint8")
    assert main(["info", str(tmp_path / "n.n5/nothing/raw")]) == 2
    assert capsys.readouterr().err.rstrip().endswith("the root holds: volumes")


def test_an_n5_group_that_cannot_be_listed_is_named_not_missing(tmp_path, raw, capsys, monkeypatch):
    """A review found the check for groups without attributes.json walking folders silently past listing
    errors: a group that may be entered but not listed was "no dataset or group; the root holds: nothing"."""
    import errno
    import os
    z5py = pytest.importorskip("z5py")
    z5py.File(str(tmp_path / "n.n5"), use_zarr_format=False, mode="a").create_dataset(
        "volumes/raw", data=raw, chunks=CHUNKS)
    real_scandir = os.scandir

    def unlistable(folder="."):
        if str(folder) == str(tmp_path / "n.n5" / "volumes"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
        return real_scandir(folder)

    monkeypatch.setattr(os, "scandir", unlistable)
    assert main(["info", str(tmp_path / "n.n5/volumes")]) == 2
    assert "cannot list" in capsys.readouterr().err


def write_precomputed(path, data, scales=((4, 4, 40),)):
    ts = pytest.importorskip("tensorstore")
    info = {"type": "image", "data_type": str(data.dtype), "num_channels": 1}
    for n, resolution in enumerate(scales):
        size = [s // (2 ** n) for s in data.shape[::-1][:2]] + [data.shape[0]]
        store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(path)},
                         "multiscale_metadata": info,
                         "scale_metadata": {"resolution": list(resolution), "voxel_offset": [3, 2, 1],
                                            "size": size, "chunk_size": [16, 16, 8], "encoding": "raw"},
                         "create": True} | ({} if n == 0 else {"open": True})).result()
        store[...] = data[:, ::2 ** n, ::2 ** n].T[..., np.newaxis]


def test_info_of_precomputed_written_by_tensorstore(tmp_path, raw, capsys):
    write_precomputed(tmp_path / "pc", raw)
    lines = info_lines(capsys, tmp_path / "pc")
    assert lines[1] == ("  .: shape=(16, 32, 48) dtype=uint8 chunks=(8, 16, 16) resolution=(40.0, 4.0, 4.0) "
                        "offset=(40.0, 8.0, 12.0) world=[(40.0, 8.0, 12.0), (680.0, 136.0, 204.0)) nm")
    assert_values_line(lines[2], raw)


def test_info_of_precomputed_says_which_of_its_scales_it_shows(tmp_path, raw, capsys):
    """Of a volume of several scales, info showed the finest alone, nothing saying there were others."""
    write_precomputed(tmp_path / "pc", raw, scales=((4, 4, 40), (8, 8, 40)))
    lines = info_lines(capsys, tmp_path / "pc")
    assert lines[1].startswith("  .: shape=(16, 32, 48) dtype=uint8 chunks=(8, 16, 16) (precomputed: scale 0 of 2, "
                               "key 4_4_40; the others by level= or resolution=) resolution=(40.0, 4.0, 4.0) ")


def test_precomputed_level_is_level_and_scale_is_deprecated(tmp_path, raw):
    write_precomputed(tmp_path / "pc", raw, scales=((4, 4, 40), (8, 8, 40)))
    half = raw[:, ::2, ::2]
    np.testing.assert_array_equal(ef.open(tmp_path / "pc", level=1).array[0], half)
    np.testing.assert_array_equal(Volume.open(PrecomputedSource(tmp_path / "pc", level=1)).array[0], half)
    with pytest.warns(DeprecationWarning, match=r"scale= is deprecated; use level="):
        source = PrecomputedSource(tmp_path / "pc", scale=1)
    assert source.full_shape == half.shape
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrecomputedSource(tmp_path / "pc", 1)  # positional: the level, no warning
    with pytest.raises(ValueError, match="give level= only"):
        PrecomputedSource(tmp_path / "pc", level=1, scale=1)
    with pytest.raises(ValueError, match=r"level must be an index in \[0, 2\), got 2"):
        ef.open(tmp_path / "pc", level=2)
    with pytest.raises(ValueError, match=r"level must be an index in \[0, 2\), got True"):
        ef.open(tmp_path / "pc", level=True)
    np.testing.assert_array_equal(ef.open(tmp_path / "pc", level=np.int64(1)).array[0], half)  # it was refused
    # as OME-Zarr's levels are chosen (one check for both): both given opened level 1, a resolution of the wrong
    # length raised NumPy's broadcasting error (a helper's)
    with pytest.raises(ValueError, match="give level or resolution, not both"):
        ef.open(tmp_path / "pc", level=0, resolution=(40, 8, 8))
    with pytest.raises(ValueError, match=r"resolution must be 3"):
        ef.open(tmp_path / "pc", resolution=(8, 8))
    with pytest.raises(ValueError, match=r"no level has resolution \(40.0, 2.0, 2.0\); levels: 0: \(40.0, 4.0, 4.0\)"):
        ef.open(tmp_path / "pc", resolution=(40, 2, 2))
    np.testing.assert_array_equal(ef.open(tmp_path / "pc", resolution=(40, 8, 8)).array[0], half)


class NpyFormat(VolumeFormat):
    """A format defined outside emfast: one .npy file, read through NumPy's memory map."""

    name = "npy"
    suffixes = (".npy",)

    @classmethod
    def detect(cls, container):
        return container.is_file() and container.read_bytes()[:6] == b"\x93NUMPY"

    @classmethod
    def open(cls, where, dataset, level, resolution):
        return NpySource(where)

    @classmethod
    def contents(cls, container, inner):
        source = NpySource(container)
        return Contents({}, iter([Listed("", source.describe(), {}, Volume.open(source, in_memory=False))]))


class NpySource(ef.io.VolumeSource):
    def __init__(self, path):
        self._array = np.load(path, mmap_mode="r")
        self.name, self.full_shape, self.dtype = str(path), self._array.shape, self._array.dtype
        self.stamp = ef.io.Stamp.of(path, "")

    def read(self, corner, extent, out):
        out[0] = self._array[tuple(slice(c, c + e) for c, e in zip(corner, extent))]

    def reopen_arguments(self):
        return (str(self.stamp.path),)


@pytest.fixture
def npy_format(monkeypatch):
    monkeypatch.setitem(_registry._CLASSES, "format", dict(_registry._CLASSES["format"]))
    _registry.register("format")(NpyFormat)
    return NpyFormat


def test_a_new_format_is_one_class_and_one_registration(tmp_path, raw, npy_format, capsys):
    assert [f.name for f in formats()][-1] == "npy"
    np.save(tmp_path / "v.npy", raw)
    (tmp_path / "v.npy").rename(tmp_path / "plain")  # detected from its content, without the suffix
    np.save(tmp_path / "v.npy", raw)
    for path in (tmp_path / "v.npy", tmp_path / "plain"):
        np.testing.assert_array_equal(ef.open(path).array[0], raw)
    np.testing.assert_array_equal(ef.open(tmp_path / "plain", format="npy").array[0], raw)
    with pytest.raises(ValueError, match="level and resolution choose a level of a multiscale image"):
        ef.open(tmp_path / "v.npy", level=1)
    lines = info_lines(capsys, tmp_path / "v.npy")
    assert lines[1] == "  .: shape=(16, 32, 48) dtype=uint8 chunks=None resolution=None offset=None"
    assert_values_line(lines[2], raw)
    with pytest.raises(ValueError, match=r"format must be one of hdf5, n5, zarr, precomputed, npy, got 'tiff'"):
        ef.open(tmp_path / "v.npy", format="tiff")


def test_a_file_of_no_known_format_names_them_all(tmp_path):
    (tmp_path / "notes").write_text("hello")
    with pytest.raises(ValueError, match=r"cannot tell its format \(none of hdf5, n5, zarr, precomputed"):
        ef.open(tmp_path / "notes")


class LoopbackBackend(TransferBackend):
    kind = "loop"
    auto = True
    usable = (0,)

    @classmethod
    def unavailable(cls, ordinal):
        return None if ordinal in cls.usable else f"no loop device {ordinal}"

    def __init__(self, ordinal):
        self.ordinal, self.name = ordinal, f"loop:{ordinal}"


@pytest.fixture
def loop_backend(monkeypatch):
    monkeypatch.setitem(_registry._CLASSES, "backend", {"loop": LoopbackBackend})
    return LoopbackBackend


def test_a_new_backend_is_one_class_and_one_registration(loop_backend, monkeypatch):
    backend = resolve_device("loop:0")
    assert isinstance(backend, LoopbackBackend) and backend.name == "loop:0"
    assert resolve_device("auto").name == "loop:0"
    with pytest.raises(RuntimeError, match=r"device='loop:3' cannot be used: no loop device 3"):
        resolve_device("loop:3")
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'loop', 'loop:N' or 'auto', got 'cuda'"):
        resolve_device("cuda")
    monkeypatch.setattr(LoopbackBackend, "usable", ())
    with pytest.warns(DeviceNotice, match="uses the CPU: no loop device 0"):
        assert resolve_device("auto") is None


def test_cuda_is_a_registered_backend():
    backends = _registry.registered("backend")
    assert list(backends) == ["cuda"] and backends["cuda"].__name__ == "PycudaBackend"


def test_cli_imports_no_private_io_module_and_no_h5py():
    tree = ast.parse((Path(ef.__file__).parent / "cli.py").read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert "h5py" not in imported
    assert not [m for m in imported if re.match(r"(emfast\.)?io\._", m or "")], imported


def test_convert_takes_a_precomputed_scale_by_level_or_resolution(tmp_path, raw):
    """Only scale 0 could be converted: a scale's own folder is no volume emfast can open."""
    write_precomputed(tmp_path / "pc", raw, scales=((4, 4, 40), (8, 8, 40)))
    level = ef.open(tmp_path / "pc", level=1)
    assert main(["convert", str(tmp_path / "pc"), str(tmp_path / "a.zarr/half"), "--level", "1"]) == 0
    assert main(["convert", str(tmp_path / "pc"), str(tmp_path / "b.h5/half"), "--resolution", "40", "8", "8"]) == 0
    for path in (tmp_path / "a.zarr/half", tmp_path / "b.h5/half"):
        with ef.open(path) as converted:
            np.testing.assert_array_equal(converted.array, level.array)
            assert converted.resolution == (40, 8, 8) and converted.offset == level.offset
    assert main(["convert", str(tmp_path / "pc"), str(tmp_path / "c.zarr/x"), "--level", "2"]) == 2
