"""Nothing lost, nothing silent, for the two writers of emfast (``emfast.predict`` and ``emfast convert``): an output
never deletes or overlaps its input, overwriting removes only what emfast wrote, a full disk ends in a clear error
and a resume equal to an uninterrupted run, a resume refuses an input whose chunks were rewritten, one run at a
time writes an output, and a run killed at any moment resumes."""
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.io import _convert, convert

zarr = pytest.importorskip("zarr", reason="these tests write zarr outputs (pip install 'emfast[zarr]')")

SRC = str(Path(ef.__file__).resolve().parents[1])  # the emfast under test, for subprocesses
PATCH = (8, 16, 16)


def identity(batch):
    """A network returning its input: the prediction equals the normalised input."""
    return batch


def predict(source, out, **options):
    return ef.predict(identity, source, out, patch_in=PATCH, blend="none", chunks=PATCH, block=(8, 32, 32),
                      **options)


WRITERS = {"predict": predict, "convert": lambda source, out, **options: convert(source, out, **options)}


def digest(path: Path) -> str:
    """Names, sizes and contents of every file under ``path`` (or of the file)."""
    sha = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        sha.update(f"{file.relative_to(path.parent)}:{file.stat().st_size}:".encode() + file.read_bytes())
    return sha.hexdigest()


@pytest.fixture
def zarr_input(tmp_path):
    """A zarr store holding the input at volumes/raw and a second array beside it."""
    data = np.random.default_rng(3).integers(0, 256, (16, 48, 40), dtype=np.uint8)
    root = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    root.create_array("volumes/raw", data=data, chunks=PATCH)
    root.create_array("volumes/labels", data=data // 7, chunks=PATCH)
    return tmp_path / "in.zarr", data


# 1: where an output may be, and what overwriting may remove

@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("out, where", [("in.zarr/volumes", "a folder containing the"),
                                        ("in.zarr/volumes/raw", "the (input|source) itself"),
                                        ("in.zarr/volumes/raw/pred", "inside the"),
                                        ("link.zarr/raw", "the (input|source) itself")])
def test_an_output_is_never_the_input_inside_it_or_above_it(tmp_path, zarr_input, writer, out, where):
    store, data = zarr_input
    (tmp_path / "link.zarr").symlink_to(store / "volumes")  # the same folder under another name
    before = digest(store)
    with pytest.raises(ValueError, match=where):
        WRITERS[writer](str(store / "volumes/raw"), tmp_path / out, overwrite=True)
    assert digest(store) == before
    WRITERS[writer](str(store / "volumes/raw"), store / "volumes/copy")  # beside it is fine
    np.testing.assert_array_equal(zarr.open_array(str(store), path="volumes/raw", mode="r")[...], data)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_is_never_written_into_the_inputs_hdf5_file(tmp_path, writer):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.arange(16 * 32 * 32, dtype=np.uint16).reshape(16, 32, 32), chunks=PATCH)
    (tmp_path / "link.h5").symlink_to(tmp_path / "in.h5")
    before = digest(tmp_path / "in.h5")
    for out in ("in.h5/out", "link.h5/out"):
        with pytest.raises(ValueError, match="in the (input|source)'s HDF5 file"):
            WRITERS[writer](str(tmp_path / "in.h5/raw"), tmp_path / out, overwrite=True)
    assert digest(tmp_path / "in.h5") == before


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_container_that_is_a_dangling_link_is_named_so(tmp_path, zarr_input, writer):
    """A zarr output whose container is a link to nothing failed with "[Errno 17] File exists" (a review)."""
    store, _ = zarr_input
    (tmp_path / "dangling.zarr").symlink_to(tmp_path / "nowhere.zarr")
    with pytest.raises(FileNotFoundError, match=r"dangling.zarr is a symbolic link to .*nowhere.zarr, which does not "
                                                r"exist: create what it points to, or choose another output"):
        WRITERS[writer](str(store / "volumes/raw"), tmp_path / "dangling.zarr/out")
    assert not (tmp_path / "nowhere.zarr").exists()


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_overwrite_replaces_only_an_array_emfast_wrote(tmp_path, zarr_input, writer):
    store, data = zarr_input
    source = str(store / "volumes/raw")
    out = zarr.open_group(str(tmp_path / "out.zarr"), mode="w")
    out.create_array("group/a", data=np.ones(5, np.uint8))  # someone's group of arrays
    out.create_array("theirs", data=np.ones(5, np.uint8))  # another program's array
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out.zarr/link").symlink_to(tmp_path / "elsewhere")
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f.create_dataset("group/a", data=np.ones(5))
        f.create_dataset("theirs", data=np.ones(5))
    before = [digest(tmp_path / "out.zarr"), digest(tmp_path / "out.h5")]
    for name, why in [("out.zarr/group", "is a zarr group"), ("out.zarr/theirs", "was not written by emfast"),
                      ("out.zarr/link", "is a symbolic link"), ("out.h5/group", "is a group"),
                      ("out.h5/theirs", "was not written by emfast")]:
        with pytest.raises((ValueError, FileExistsError), match=why):
            WRITERS[writer](source, tmp_path / name, overwrite=True)
    assert [digest(tmp_path / "out.zarr"), digest(tmp_path / "out.h5")] == before
    for name in ("out.zarr/mine", "out.h5/mine"):  # emfast's own output is replaced
        WRITERS[writer](source, tmp_path / name)
        WRITERS[writer](source, tmp_path / name, overwrite=True)
        assert ef.open(tmp_path / name).shape[-3:] == data.shape


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_beside_consolidated_metadata_is_listed_there(tmp_path, writer, zarr_format):
    """xarray and pipelines consolidate a store's metadata, and zarr-python reads a group through it by default:
    an output written beside it was invisible there ("not found in consolidated metadata"), and one overwritten
    with another dtype was read with the old one and failed (a review). The consolidated metadata is made again
    once the output is written; a store without any gets none."""
    zarr = pytest.importorskip("zarr")
    data = np.random.default_rng(4).integers(0, 256, (16, 32, 32), dtype=np.uint8)
    plain, consolidated = tmp_path / "plain.zarr", tmp_path / "consolidated.zarr"
    for store in (plain, consolidated):
        zarr.open_group(str(store), mode="w", zarr_format=zarr_format).create_group("volumes").create_array(
            "raw", data=data, chunks=(8, 16, 16))
    with warnings.catch_warnings():  # v3: "not part of the specification", as emfast's refresh does not warn
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(consolidated), zarr_format=zarr_format)
    for store in (plain, consolidated):
        WRITERS[writer](str(store / "volumes/raw"), store / "volumes/out")
    group = zarr.open_group(str(consolidated), mode="r")  # through the consolidated metadata
    assert sorted(name for name, _ in group.members(max_depth=None)) == ["volumes", "volumes/out", "volumes/raw"]
    np.testing.assert_array_equal(np.asarray(group["volumes/out"][...]).reshape(data.shape),
                                  ef.open(plain / "volumes/out").array.reshape(data.shape))
    if writer == "predict":  # replaced by an output of another dtype: read as it is now
        ef.predict(lambda batch: batch * 0.5, str(consolidated / "volumes/raw"), consolidated / "volumes/out",
                   patch_in=PATCH, blend="none", chunks=PATCH, block=(8, 32, 32), dtype="float16", overwrite=True)
        out = zarr.open_group(str(consolidated), mode="r")["volumes/out"]
        assert out.dtype == np.float16
        np.testing.assert_allclose(np.asarray(out[...]).reshape(data.shape), data / 255.0 * 0.5, atol=1e-3)
    assert not (plain / ".zmetadata").exists()
    if zarr_format == 3:
        assert json.loads((plain / "zarr.json").read_text()).get("consolidated_metadata") is None


def _stop_after(calls: int):
    """A model returning its input that raises at its ``calls``-th call."""
    count = [0]

    def model(batch):
        count[0] += 1
        if count[0] == calls:
            raise RuntimeError("stopped")
        return batch
    return model


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_stopped_overwrite_leaves_consolidated_metadata_of_the_new_output(tmp_path, zarr_format):
    """A run stopped after it replaced an output (killed, or its model failing) left the consolidated metadata
    listing the old dtype (every read through it failed), or listing the run's block flags without the dimension
    names xarray needs of every array (xr.open_zarr failed): a second review."""
    zarr = pytest.importorskip("zarr")
    xarray = pytest.importorskip("xarray")
    data = np.random.default_rng(4).integers(0, 256, (16, 32, 32), dtype=np.uint8)
    store = tmp_path / "c.zarr"
    xarray.Dataset({"raw": (("z", "y", "x"), data)}).to_zarr(store, consolidated=True, zarr_format=zarr_format)
    ef.predict(identity, str(store / "raw"), store / "out", patch_in=PATCH, blend="none", chunks=PATCH,
               block=(8, 32, 32), dtype="float32")
    with pytest.raises(RuntimeError, match="stopped"):
        ef.predict(_stop_after(3), str(store / "raw"), store / "out", patch_in=PATCH, blend="none", chunks=PATCH,
                   block=(8, 32, 32), dtype="uint8", overwrite=True, threads=1)
    assert zarr.open_group(str(store), mode="r")["out"].dtype == np.uint8  # through the consolidated metadata
    opened = xarray.open_zarr(store)  # the unfinished run's flags array included
    assert opened["raw"].shape == data.shape


# 2: a full disk

@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (a real full disk), unmounted afterwards; grow it with ``remount(path, "16m")``."""
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def remount(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


#: 3 MiB that no codec compresses, in 32 KiB chunks: more than the small disk holds.
FULL_SHAPE, FULL_CHUNKS = (48, 256, 256), (8, 64, 64)

CONVERT_TILE_BYTES = 256 << 10  # 12 tiles: some fit before the disk is full
RUN_CONVERT = f"""
import sys
import emfast.io._convert as _convert
from emfast.cli import main
_convert.TILE_BYTES = {CONVERT_TILE_BYTES}
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--compression", "gzip"]))
"""
PREDICT_OPTIONS = dict(patch_in=(8, 64, 64), blend="none", chunks=(8, 64, 64), block=(8, 128, 128), dtype="uint8")
RUN_PREDICT = f"""
import sys
import emfast as ef
ef.predict(lambda batch: batch, sys.argv[1], sys.argv[2], progress=True, resume=len(sys.argv) > 3,
           **{PREDICT_OPTIONS!r})
"""


def run_script(script, *args, **options):
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=SRC), timeout=120, **options)


@pytest.mark.parametrize("tool", ["convert", "predict"])
@pytest.mark.parametrize("container", ["out.zarr", "out.h5"])
def test_a_full_disk_ends_in_a_clear_error_and_the_resume_equals_an_uninterrupted_run(tmp_path, small_disk, tool,
                                                                                      container, monkeypatch):
    data = np.random.default_rng(5).integers(0, 256, FULL_SHAPE, dtype=np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=FULL_CHUNKS)
    script = RUN_CONVERT if tool == "convert" else RUN_PREDICT
    out = small_disk / container / "raw"
    failed = run_script(script, tmp_path / "in.h5/raw", out)
    assert failed.returncode in (1, 2), failed.stderr[-2000:]  # an error, not SIGSEGV
    assert f"not enough space for {small_disk / container}" in failed.stderr
    assert "MiB is free" in failed.stderr and "needs" in failed.stderr
    assert ("then run the same conversion again" if tool == "convert" else "then run again with resume=True") \
        in failed.stderr
    with pytest.warns(ef.UnfinishedOutputWarning):  # and says it is unfinished when opened
        assert np.count_nonzero(ef.open(out).array) > 0  # it had started: some tiles were written
    remount(small_disk, "16m")
    resumed = run_script(script, tmp_path / "in.h5/raw", out, *(["resume"] if tool == "predict" else []))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole = tmp_path / container / "raw"  # uninterrupted, here
    if tool == "convert":
        monkeypatch.setattr(_convert, "TILE_BYTES", CONVERT_TILE_BYTES)
        convert(tmp_path / "in.h5/raw", whole, compression="gzip")
    else:
        ef.predict(identity, tmp_path / "in.h5/raw", whole, **PREDICT_OPTIONS)
    np.testing.assert_array_equal(ef.open(out).array.reshape(data.shape), data)
    np.testing.assert_array_equal(ef.open(out).array, ef.open(whole).array)


FILE_SIZE_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv.pop()), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""


@pytest.mark.parametrize("tool", ["convert", "predict"])
def test_a_file_size_limit_ends_an_hdf5_output_in_a_clear_error_and_keeps_the_file(tmp_path, tool, monkeypatch):
    """Under ``ulimit -f`` (a batch scheduler's h_fsize; quotas act alike) statvfs shows room, the write failed
    with EFBIG, the close's HDF5 error hid it, and the process crashed (SIGSEGV): the file was left cut at the
    limit, unreadable, with the user's own dataset in it, and no resume could open it (a review). The limit is
    now checked before each write, as free space is."""
    data = np.random.default_rng(5).integers(0, 256, FULL_SHAPE, dtype=np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=FULL_CHUNKS)
    kept = np.arange(10000, dtype=np.int32).reshape(100, 100)
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f["user/keep"] = kept
    script = FILE_SIZE_LIMIT + (RUN_CONVERT if tool == "convert" else RUN_PREDICT)
    out = tmp_path / "out.h5/raw"
    failed = run_script(script, tmp_path / "in.h5/raw", out, 5 << 19)  # 2.5 MiB: some tiles fit
    assert failed.returncode in (1, 2), failed.stderr[-2000:]  # an error, not SIGSEGV
    assert f"not enough room for {tmp_path / 'out.h5'}" in failed.stderr, failed.stderr[-2000:]
    assert "file-size limit of 2.5 MiB (ulimit -f" in failed.stderr
    with h5py.File(tmp_path / "out.h5", "r") as f:
        np.testing.assert_array_equal(f["user/keep"][...], kept)
        assert np.count_nonzero(f["raw"][...]) > 0  # it had started: some tiles were written
    resumed = run_script(script, tmp_path / "in.h5/raw", out, *(["resume"] if tool == "predict" else []), 1 << 30)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    np.testing.assert_array_equal(ef.open(out).array.reshape(data.shape), data)
    with h5py.File(tmp_path / "out.h5", "r") as f:
        np.testing.assert_array_equal(f["user/keep"][...], kept)


def test_an_hdf5_file_already_beyond_the_file_size_limit_is_left_as_it_was(tmp_path):
    """Opening a file to write and creating a dataset write metadata at its end: a file already past the limit got
    a broken entry (HDF5's "File write failed"), which every later run, resume and overwrite failed to open (a
    second review)."""
    data = np.random.default_rng(5).integers(0, 256, (8, 64, 64), dtype=np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = data
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f["user/keep"] = np.arange(400000, dtype=np.int32)  # 1.6 MB
    before = digest(tmp_path / "out.h5")
    failed = run_script(FILE_SIZE_LIMIT + RUN_PREDICT, tmp_path / "in.h5/raw", tmp_path / "out.h5/raw", 800000)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "OutputSpaceError" in failed.stderr and "opening it to write" in failed.stderr, failed.stderr[-2000:]
    assert digest(tmp_path / "out.h5") == before
    done = run_script(RUN_PREDICT, tmp_path / "in.h5/raw", tmp_path / "out.h5/raw")
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_array_equal(ef.open(tmp_path / "out.h5/raw").array.reshape(data.shape), data)


def test_overwriting_an_uncompressed_prediction_counts_the_space_the_old_one_frees(small_disk):
    """The room an uncompressed output needs is checked once the output it replaces is removed: on a disk that
    holds one copy and its margin, not two, overwriting succeeds."""
    data = np.random.default_rng(6).integers(0, 256, (10, 256, 256), dtype=np.uint8)  # 0.6 MiB of a 2 MiB disk
    options = dict(patch_in=(2, 64, 64), blend="none", chunks=(2, 64, 64), block=(2, 128, 128), dtype="uint8",
                   compression="none")
    out = small_disk / "p.zarr/raw"
    ef.predict(identity, data, out, **options)
    ef.predict(lambda batch: 1 - batch, data, out, overwrite=True, **options)
    np.testing.assert_array_equal(ef.open(out).array[0], 255 - data)


def test_an_uncompressed_output_that_cannot_fit_is_refused_before_writing(tmp_path, small_disk):
    data = np.random.default_rng(5).integers(0, 256, FULL_SHAPE, dtype=np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=FULL_CHUNKS)
    with pytest.raises(OSError, match=r"not enough space for .*out.zarr: writing the 1 tile left needs 3.0 MiB"):
        convert(tmp_path / "in.h5/raw", small_disk / "out.zarr/raw", compression="none")
    assert not list((small_disk / "out.zarr").rglob("c/*"))  # no chunk written
    with pytest.raises(OSError, match=r"not enough space for .*p.zarr: writing the 6 blocks left needs 12.0 MiB"):
        ef.predict(identity, tmp_path / "in.h5/raw", small_disk / "p.zarr/raw", patch_in=(8, 64, 64),
                   blend="none", chunks=(8, 64, 64), block=(8, 256, 256), compression="none")


# 5: an input rewritten in place between a run and its resume

@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_resume_after_the_inputs_chunks_were_rewritten_is_refused(tmp_path, zarr_input, writer):
    store, data = zarr_input
    source, out = str(store / "volumes/raw"), tmp_path / "out.zarr/raw"
    _write_part_then_stop(writer, source, out)
    metadata = (store / "volumes/raw/zarr.json").stat()
    array = zarr.open_array(str(store), path="volumes/raw", mode="r+")
    array[8:16, 16:32, 16:32] = 255 - array[8:16, 16:32, 16:32]  # one chunk rewritten in place
    assert (store / "volumes/raw/zarr.json").stat().st_mtime_ns == metadata.st_mtime_ns  # metadata untouched
    with pytest.raises((ValueError, FileExistsError), match=r"cannot resume .*out.zarr/raw: the input .*in.zarr/"
                                                            r"volumes/raw changed since this output was started"):
        _resume(writer, source, out)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_resume_after_a_dataset_was_added_beside_an_hdf5_input_says_the_file_changed(tmp_path, writer):
    """HDF5 inputs are known by their file: labels added beside the raw refuse a resume, which said the raw had
    changed (a review); it names the file, and why a write to another dataset counts."""
    data = np.random.default_rng(3).integers(0, 256, FULL_SHAPE, dtype=np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=FULL_CHUNKS)
    source, out = str(tmp_path / "in.h5/raw"), tmp_path / "out.zarr/raw"
    _write_part_then_stop(writer, source, out)
    with h5py.File(tmp_path / "in.h5", "a") as f:
        f["labels"] = np.zeros(FULL_SHAPE, np.uint64)
    with pytest.raises((ValueError, FileExistsError), match=r"cannot resume .*out.zarr/raw: a file holding the "
                                                            r"input .*in.h5/raw changed since this output was started "
                                                            r"\(its file, or one its external links or virtual datasets "
                                                            r"read\): 1 file of \d+ bytes now, .*; emfast knows an input "
                                                            r"stored in a file by the sizes and modification times of "
                                                            r"those files, so a write to any dataset of them counts"):
        _resume(writer, source, out)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_resume_after_an_ome_images_voxel_size_or_origin_changed_is_refused(tmp_path, writer):
    """A level of an OME-NGFF image is placed by the image group's metadata, outside the level's folder, which was
    all the record fingerprinted: a conversion resumed after the scale and translation were corrected finished,
    recorded complete with the old ones (a review of convert)."""
    ome_writer = pytest.importorskip("ome_zarr.writer", reason="ome-zarr-py writes this test's image")
    data = np.random.default_rng(0).integers(0, 256, (16, 40, 48), dtype=np.uint8)
    group = zarr.open_group(str(tmp_path / "img.zarr"), mode="w", zarr_format=2)
    axes = [{"name": name, "type": "space", "unit": "nanometer"} for name in "zyx"]
    ome_writer.write_multiscale([data], group, axes=axes, storage_options={"chunks": (8, 16, 16)},
                                coordinate_transformations=[[{"type": "scale", "scale": [40, 4, 4]},
                                                             {"type": "translation", "translation": [100, 8, 12]}]])
    source, out = str(tmp_path / "img.zarr"), tmp_path / "out.zarr/raw"
    _write_part_then_stop(writer, source, out)
    attributes = json.loads((tmp_path / "img.zarr/.zattrs").read_text())
    attributes["multiscales"][0]["datasets"][0]["coordinateTransformations"] = [
        {"type": "scale", "scale": [30, 4, 4]}, {"type": "translation", "translation": [100, 1008, 12]}]
    (tmp_path / "img.zarr/.zattrs").write_text(json.dumps(attributes))
    with pytest.raises((ValueError, FileExistsError), match=r"cannot resume .*out.zarr/raw: the input .*img.zarr/"
                                                            r"\w+ is placed otherwise than when this output was "
                                                            r"started \(voxel size and offset \(30.0, 4.0, 4.0\) "
                                                            r"\(100.0, 1008.0, 12.0\) now, \(40.0, 4.0, 4.0\)"):
        _resume(writer, source, out)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_recorded_without_its_inputs_placement_resumes(tmp_path, zarr_input, writer):
    """A record written before emfast recorded where its input was placed has no ``placement``: its resume was
    refused as after a changed input (the fingerprint's file count and digest took the placement in)."""
    store, data = zarr_input
    source, out = str(store / "volumes/raw"), tmp_path / "out.zarr/raw"
    _write_part_then_stop(writer, source, out)
    array = zarr.open_array(str(tmp_path / "out.zarr"), path="raw", mode="r+")
    key, part = ("emfast_convert", "source") if writer == "convert" else ("emfast_predict", "input")
    record = dict(array.attrs[key])
    assert record[part].pop("placement")
    array.attrs[key] = record
    _resume(writer, source, out)
    expected = data if writer == "convert" else data.astype(np.float32) * np.float32(1 / 255)  # identity, normalised
    np.testing.assert_array_equal(ef.open(out).array[0], expected)


def _write_part_then_stop(writer, source, out):
    """Begin ``out`` from ``source`` with ``writer`` and interrupt it (as Ctrl-C would) after two units."""
    with pytest.raises(KeyboardInterrupt):
        if writer == "convert":
            convert(source, out, progress=StopAfter(2), tile_bytes=8 * 16 * 16)
        else:
            predict(source, out, progress=StopAfter(2))


def _resume(writer, source, out):
    return convert(source, out, tile_bytes=8 * 16 * 16) if writer == "convert" else predict(source, out, resume=True)


class StopAfter:
    """A progress callback that interrupts the run (as Ctrl-C would) once ``count`` units are done."""

    def __init__(self, count):
        self.count = count

    def __call__(self, done, total=None):
        if getattr(done, "blocks", done) >= self.count:  # convert counts tiles; predict's state counts blocks
            raise KeyboardInterrupt


# 14: one run at a time; a run killed at any moment resumes

SLOW_PREDICT = """
import sys, time
import emfast as ef
calls = [0]
def slow(batch):
    calls[0] += 1
    if calls[0] == 2:  # the first call learns the channels, before the output is opened
        print("running", flush=True)
        time.sleep(60)
    return batch
ef.predict(slow, sys.argv[1], sys.argv[2], patch_in=(8, 16, 16), blend="none", chunks=(8, 16, 16), block=(8, 32, 32))
"""


@pytest.mark.parametrize("container", ["out.zarr", "out.h5"])
def test_a_second_run_on_an_output_names_the_first(tmp_path, zarr_input, container):
    store, _ = zarr_input
    out = tmp_path / container / "pred"
    first = subprocess.Popen([sys.executable, "-c", SLOW_PREDICT, str(store / "volumes/raw"), str(out)],
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=SRC))
    try:
        assert first.stdout.readline().strip() == "running"
        for writer in sorted(WRITERS):
            with pytest.raises(OSError, match=rf"another emfast run \(pid {first.pid}\) is writing "
                                                   rf"{tmp_path / container}"):
                WRITERS[writer](str(store / "volumes/raw"), out, **({"resume": True} if writer == "predict" else {}))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    predict(str(store / "volumes/raw"), out, resume=True)  # the dead run's lock is gone with it


KILLABLE = """
import sys
import emfast.io._convert as _convert
import emfast as ef
print("ready", flush=True)
if sys.argv[3] == "convert":
    _convert.convert(sys.argv[1], sys.argv[2], tile_bytes=16 * 16 * 16)
else:
    ef.predict(lambda batch: batch, sys.argv[1], sys.argv[2], patch_in=(8, 16, 16), blend="none",
               chunks=(8, 16, 16), block=(8, 16, 16), resume=True)
"""


def content(out, tool):
    """The volume a run of ``tool`` wrote, as the uint8 input it copied."""
    array = ef.open(out).array[0]
    return array if tool == "convert" else np.rint(array * 255).astype(np.uint8)


@pytest.mark.parametrize("tool", ["convert", "predict"])
def test_runs_killed_at_random_moments_resume_to_the_same_output(tmp_path, zarr_input, tool):
    store, data = zarr_input
    out = tmp_path / "out.zarr/raw"
    moments = [random.uniform(0, 0.4) for _ in range(3)]  # after the imports: creation, writes, records
    for delay in moments:
        process = subprocess.Popen([sys.executable, "-c", KILLABLE, str(store / "volumes/raw"), str(out), tool],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=SRC))
        assert process.stdout.readline() == b"ready\n", process.communicate()
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        _, error = process.communicate()
        assert process.returncode in (0, -signal.SIGKILL), f"killed after {delay} s: {error.decode()[-2000:]}"
    finish = run_script(KILLABLE, store / "volumes/raw", out, tool)
    assert finish.returncode == 0, f"killed after {moments} s: {finish.stderr[-2000:]}"
    np.testing.assert_array_equal(content(out, tool), data)
    assert not list(out.parent.rglob("*.partial"))


@pytest.mark.parametrize("tool", ["convert", "predict"])
@pytest.mark.parametrize("container", ["out.zarr", "out.h5"])
def test_a_run_killed_right_after_creating_its_output_resumes(tmp_path, zarr_input, tool, container):
    """The moment between creating the output and writing its record, hit on purpose."""
    store, data = zarr_input
    out = tmp_path / container / "raw"
    kill_after_creation = textwrap.dedent("""
        import os, signal, h5py, zarr
        for cls, name in ((zarr.Group, "create_array"), (h5py.Group, "create_dataset")):
            def killing(self, *args, _real=getattr(cls, name), **kwargs):
                node = _real(self, *args, **kwargs)
                if hasattr(node, "file"):
                    node.file.flush()  # what HDF5 may write at any moment; zarr writes at once
                os.kill(os.getpid(), signal.SIGKILL)
            setattr(cls, name, killing)
        """) + KILLABLE
    killed = run_script(kill_after_creation, store / "volumes/raw", out, tool)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    finish = run_script(KILLABLE, store / "volumes/raw", out, tool)
    assert finish.returncode == 0, finish.stderr[-2000:]
    np.testing.assert_array_equal(content(out, tool), data)


KILLED_WHILE_REMOVING = """
import os, shutil, signal, sys
from pathlib import Path
import emfast as ef
from emfast.io import _writer

def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def rmtree_killed(path, *args, **kwargs):  # killed with the folder half removed: its metadata first
    for name in ("zarr.json", ".zarray"):
        (Path(path) / name).unlink(missing_ok=True)
    kill()

if sys.argv[3] == "flags":  # killed with the record complete, before the flags are removed
    _writer.OutputWriter.delete = kill
elif sys.argv[3] == "removing":
    shutil.rmtree = rmtree_killed
ef.predict(lambda batch: batch, sys.argv[1], sys.argv[2], patch_in=(8, 16, 16), blend="none", chunks=(8, 16, 16),
           block=(8, 16, 16), resume=sys.argv[4] == "resume", overwrite=sys.argv[4] == "overwrite")
"""


@pytest.mark.parametrize("moment, container", [("flags", "out.zarr"), ("flags", "out.h5"),
                                               ("removing", "out.zarr")])
@pytest.mark.parametrize("rerun", ["resume", "overwrite"])
def test_a_prediction_killed_while_removing_its_scratch_or_an_old_output_runs_again(tmp_path, zarr_input, moment,
                                                                                    container, rerun):
    """Killed as it finishes (the record complete, the finished-block flags not yet removed, or half removed),
    or while ``overwrite`` removes the previous output: the next run completes and leaves nothing behind. A
    resume of the first failed ("read-only mode"), and half-removed folders stayed for good or were refused as
    "not a zarr array"."""
    store, data = zarr_input
    out = tmp_path / container / "raw"
    source = store / "volumes/raw"
    if rerun == "overwrite":
        assert run_script(KILLED_WHILE_REMOVING, source, out, "none", "resume").returncode == 0
    killed = run_script(KILLED_WHILE_REMOVING, source, out, moment, rerun)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    if container == "out.zarr":  # what was set aside is outside the group: readers list only its arrays
        assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    again = run_script(KILLED_WHILE_REMOVING, source, out, "none", rerun)
    assert again.returncode == 0, again.stderr[-2000:]
    np.testing.assert_array_equal(content(out, "predict"), data)
    if container == "out.h5":
        with h5py.File(out.parent, "r") as f:
            assert list(f) == ["raw"]
    else:
        assert sorted(p.name for p in out.parent.iterdir()) == ["raw", "zarr.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name not in ("in.zarr", container) and "lock" not in p.name] \
        == []


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_resume_removes_the_partial_files_a_killed_zarr_write_left(tmp_path, zarr_input, writer):
    store, data = zarr_input
    out = tmp_path / "out.zarr/raw"
    options = {"tile_bytes": 8 * 16 * 16} if writer == "convert" else {}
    with pytest.raises(KeyboardInterrupt):
        WRITERS[writer](str(store / "volumes/raw"), out, progress=StopAfter(1), **options)
    # what zarr leaves when killed inside a write: NAME.<uuid hex>.partial beside the chunk it was writing
    leftover = out / "c" / f"9.{'ab12' * 8}.partial"
    leftover.write_bytes(b"half a chunk")
    WRITERS[writer](str(store / "volumes/raw"), out, **options, **({"resume": True} if writer == "predict" else {}))
    assert not leftover.exists()


HOLD_OPEN = """
import sys, time, h5py
file = h5py.File(sys.argv[1], "r")  # HDF5 locks the file: no one else may write it
print("open", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_hdf5_output_open_in_another_program_is_named(tmp_path, zarr_input, writer):
    store, _ = zarr_input
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f.create_dataset("theirs", data=np.ones(3))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(tmp_path / "out.h5")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        options = {"compression": "gzip"} if writer == "convert" else {}
        with pytest.raises(OSError, match=rf"cannot write {tmp_path / 'out.h5'}: another program has it open"):
            WRITERS[writer](str(store / "volumes/raw"), tmp_path / "out.h5/raw", **options)
    finally:
        holder.kill()
        holder.wait()
