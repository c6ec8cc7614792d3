"""One output writer for ``emfast convert`` and ``emfast.predict``: one option name (``compression``; convert's
former ``compressor`` still works with a DeprecationWarning naming the new one), one resume rule and the same
metadata."""
import json
import warnings

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.cli import main
from emfast.io import ConvertError, convert
from emfast.inference import OutputExistsError

zarr = pytest.importorskip("zarr")

VOXEL, OFFSET = (40.0, 8.0, 4.0), (400.0, 80.0, 40.0)


def identity(batch):
    return batch


def predict(source, out, **options):
    return ef.predict(identity, str(source), str(out), patch_in=(8, 16, 16), blend="none", chunks=(8, 16, 16),
                      **options)


WRITERS = {"predict": predict, "convert": lambda source, out, **options: convert(str(source), out, **options)}


@pytest.fixture
def source(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, (16, 32, 32), dtype=np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        d = f.create_dataset("raw", data=data, chunks=(8, 16, 16))
        d.attrs["resolution"], d.attrs["offset"] = VOXEL, OFFSET
    return tmp_path / "in.h5/raw", data


def codecs(array_folder):
    metadata = json.loads((array_folder / "zarr.json").read_text())
    return [codec["name"] for codec in metadata["codecs"]]


def test_convert_takes_compressor_as_a_deprecated_name_of_compression(tmp_path, source):
    path, data = source
    with pytest.warns(DeprecationWarning, match="compressor is deprecated; use compression") as caught:
        convert(str(path), tmp_path / "old.zarr/raw", compressor="gzip")
    assert caught[0].filename == __file__  # the caller's line: a frame beyond it, Python hid the warning
    assert "gzip" in codecs(tmp_path / "old.zarr/raw")
    convert(str(path), tmp_path / "new.zarr/raw", compression="gzip")
    assert codecs(tmp_path / "new.zarr/raw") == codecs(tmp_path / "old.zarr/raw")
    np.testing.assert_array_equal(ef.open(str(tmp_path / "old.zarr/raw")).array[0], data)
    with pytest.raises(ConvertError, match="compression='zstd' and its deprecated name compressor='gzip' disagree"):
        with pytest.warns(DeprecationWarning):
            convert(str(path), tmp_path / "both.zarr/raw", compression="zstd", compressor="gzip")
    assert not (tmp_path / "both.zarr").exists()


def test_the_command_line_says_compressor_is_deprecated_and_refuses_a_conflict(tmp_path, source, capsys):
    """The command printed its warning, then the Python one too: under -W error (PYTHONWARNINGS=error) that was an
    "internal error", exit 1, nothing converted."""
    path, _ = source
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["convert", str(path), str(tmp_path / "old.zarr/raw"), "--compressor", "gzip"]) == 0
    assert capsys.readouterr().err.count("--compressor is deprecated; use --compression") == 1
    assert "gzip" in codecs(tmp_path / "old.zarr/raw")
    assert main(["convert", str(path), str(tmp_path / "new.h5/raw"), "--compression", "none"]) == 0
    with h5py.File(tmp_path / "new.h5", "r") as f:
        assert f["raw"].compression is None
    capsys.readouterr()
    assert main(["convert", str(path), str(tmp_path / "both.zarr/raw"), "--compression", "zstd", "--compressor",
                 "gzip"]) == 2
    assert "--compression zstd and its deprecated name --compressor gzip disagree" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse names the choices
        main(["convert", str(path), str(tmp_path / "bad.zarr/raw"), "--compression", "lz4"])
    assert "invalid choice: 'lz4'" in capsys.readouterr().err


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_both_writers_refuse_another_compression_alike_and_name_it(tmp_path, source, writer):
    path, _ = source
    WRITERS[writer](path, tmp_path / "out.zarr/raw", compression="zstd")
    options = {"resume": True} if writer == "predict" else {}
    with pytest.raises((ConvertError, OutputExistsError),
                       match=r"out.zarr/raw exists and it is a (conversion|prediction) with another (source|input) "
                             r"or other settings \(compression: 'zstd' there, 'gzip' now\); pass overwrite=True"):
        WRITERS[writer](path, tmp_path / "out.zarr/raw", compression="gzip", **options)
    with pytest.raises(ValueError, match="HDF5 outputs support the compressions gzip and none, not zstd"):
        WRITERS[writer](path, tmp_path / "out.h5/raw", compression="zstd")
    with pytest.raises(ValueError, match="compression must be one of zstd, blosc, gzip, none, got 'lz4'"):
        WRITERS[writer](path, tmp_path / "other.zarr/raw", compression="lz4")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_both_writers_write_the_same_geometry_metadata(tmp_path, source, zarr_format):
    path, _ = source
    for name, writer in WRITERS.items():
        root = zarr.open_group(str(tmp_path / f"{name}.zarr"), mode="w", zarr_format=zarr_format)
        root.attrs["lab"] = "kept"  # an existing store: its format and attributes stay
        writer(path, tmp_path / f"{name}.zarr/raw")
    made = {name: zarr.open_group(str(tmp_path / f"{name}.zarr"), mode="r") for name in WRITERS}
    arrays = {name: dict(group["raw"].attrs) for name, group in made.items()}
    for key in ("voxel_size", "offset", "units", "resolution"):
        assert arrays["predict"][key] == arrays["convert"][key], key
    assert arrays["convert"]["axis_names"] == ["z", "y", "x"]
    assert arrays["predict"]["axis_names"] == ["c^", "z", "y", "x"]
    images = {}
    for name, group in made.items():
        attributes = dict(group.attrs)
        assert attributes["lab"] == "kept" and group.metadata.zarr_format == zarr_format
        images[name] = (attributes["ome"] if zarr_format == 3 else attributes)["multiscales"][0]
        if zarr_format == 3:
            assert attributes["ome"]["version"] == "0.5"
        else:
            assert images[name]["version"] == "0.4"
    spatial = {}
    for name, image in images.items():
        scale, translation = image["datasets"][0]["coordinateTransformations"]
        spatial[name] = (image["axes"][-3:], scale["scale"][-3:], translation["translation"][-3:])
    assert spatial["predict"] == spatial["convert"]
    assert spatial["convert"][1:] == (list(VOXEL), list(OFFSET))


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_both_writers_give_hdf5_outputs_gunpowders_resolution_and_offset(tmp_path, source, writer):
    path, _ = source
    WRITERS[writer](path, tmp_path / "out.h5/raw")
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert tuple(f["raw"].attrs["resolution"]) == VOXEL and tuple(f["raw"].attrs["offset"]) == OFFSET


def test_attributes_hdf5_cannot_hold_are_kept_as_json_text(tmp_path):
    """A zarr source's nested attributes (lists of mappings) go into an HDF5 output as JSON text."""
    array = zarr.create_array(str(tmp_path / "in.zarr"), name="raw", shape=(4, 8, 8), dtype=np.uint8)
    array.attrs.update(history=[{"step": "align", "version": 2}], note="kept")
    convert(str(tmp_path / "in.zarr/raw"), tmp_path / "out.h5/raw")
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert json.loads(f["raw"].attrs["history"]) == [{"step": "align", "version": 2}]
        assert f["raw"].attrs["note"] == "kept"


def test_a_new_outputs_record_is_made_once_the_earlier_output_is_removed(tmp_path, source):
    """predict hands its record over as a callable: an in-memory input's digest is computed while the earlier
    output is removed. It is called once that output is gone, and the new output holds what it returned."""
    from emfast.io import OutputLock
    from emfast.io._writer import OutputWriter

    path, data = source
    predict(path, tmp_path / "p.zarr/pred")
    chunk_file = next((tmp_path / "p.zarr/pred").rglob("0"))
    seen = []

    def record():
        seen.append(chunk_file.exists())
        return {"input": {"fingerprint": "ours"}, "settings": 1}

    writer = OutputWriter(tmp_path / "p.zarr", "pred", "zarr", "emfast_predict")
    writer.open_to_check()
    with OutputLock(tmp_path / "p.zarr") as lock:
        assert writer.prepare(lock, record, resume=False, overwrite=True, input_key="input", what="prediction",
                              shape=(1, 16, 32, 32), dtype="float32", chunks=(8, 16, 16), compression="zstd") is None
    writer.close()
    assert seen == [False]
    assert zarr.open_array(str(tmp_path / "p.zarr"), path="pred").attrs["emfast_predict"]["settings"] == 1


def test_the_lock_file_is_flushed_to_disk_only_for_the_creation_mark(tmp_path, monkeypatch):
    """The mark of a dataset being created must reach the disk before the dataset (a machine crash between them
    would leave a half-made dataset no run may replace). Its clearing is not flushed: the record it stands for
    is not either, and a cleared mark beside a lost record would be that same dataset (a reviewer's case); a mark
    that outlives a crash only has the output made again. A pid needs no flush (milliseconds each on a network
    file system)."""
    import os

    from emfast.io import OutputLock

    flushed = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(json.loads(os.pread(fd, 200, 0))), real_fsync(fd)))
    with OutputLock(tmp_path / "p.zarr") as lock:
        assert flushed == []
        with lock.creating("pred"):
            assert flushed == [{"pid": os.getpid(), "creating": "pred"}]
    assert len(flushed) == 1
    (tmp_path / ".p.zarr.emfast-lock").write_text(json.dumps({"pid": 1, "creating": "pred"}))  # a killed run's
    with OutputLock(tmp_path / "p.zarr") as lock:
        assert lock.was_creating("pred") and len(flushed) == 1
