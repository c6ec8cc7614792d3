"""``emfast convert`` as met on real work: resumes only with the settings that decide its tiles, picks a codec and
chunks the output format takes, says when there is nothing to do, and stops on Ctrl-C with one line."""
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.cli import main
from emfast.io import ConvertError, _convert, convert

zarr = pytest.importorskip("zarr", reason="these tests write zarr outputs (pip install 'emfast[zarr]')")

SRC = str(Path(ef.__file__).resolve().parents[1])  # the emfast under test, for subprocesses


@pytest.fixture
def source(tmp_path):
    data = np.random.default_rng(11).integers(0, 2**16, (16, 48, 40), dtype=np.uint16)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=(8, 16, 16))
    return tmp_path / "in.h5/raw", data


def stop_after(count):
    def progress(done, total):
        if done >= count:
            raise KeyboardInterrupt
    return progress


def test_a_resume_with_another_tile_size_is_refused(tmp_path, source):
    path, data = source
    out = tmp_path / "out.zarr/raw"
    small = 8 * 16 * 16 * 2  # one chunk per tile: 18 tiles
    with pytest.raises(KeyboardInterrupt):
        convert(path, out, tile_bytes=small, progress=stop_after(3))
    with pytest.raises(ConvertError, match=r"tile: \[8, 16, 16\] there, \[16, 48, 40\] now"):
        convert(path, out)  # the default tile: whole volume; "3 done" would mean 3 whole volumes
    record = dict(zarr.open_array(str(tmp_path / "out.zarr"), path="raw", mode="r").attrs)["emfast_convert"]
    assert record["done"] == 3 and record["complete"] is False
    result = convert(path, out, tile_bytes=small)
    assert (result.tiles, result.written) == (18, 15)
    np.testing.assert_array_equal(ef.open(out).array[0], data)


def test_hdf5_to_hdf5_needs_no_compressor_option(tmp_path, source, capsys):
    path, data = source
    assert main(["convert", str(path), str(tmp_path / "out.h5/raw")]) == 0, capsys.readouterr().err
    with h5py.File(tmp_path / "out.h5", "r") as f:
        assert f["raw"].compression == "gzip"
        np.testing.assert_array_equal(f["raw"][...], data)


@pytest.mark.parametrize("container", ["out.h5", "out.zarr"])
def test_an_unchunked_source_with_a_short_axis_gets_chunks_clipped_to_its_shape(tmp_path, container):
    data = np.arange(20 * 30 * 100, dtype=np.uint8).reshape(20, 30, 100)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=data)  # contiguous: no chunks
    convert(tmp_path / "in.h5/raw", tmp_path / container / "raw")
    output = ef.open(tmp_path / container / "raw")
    assert output.chunks == (20, 30, 64)
    np.testing.assert_array_equal(output.array[0], data)


def test_a_rerun_on_a_complete_output_says_so(tmp_path, source, capsys):
    path, _ = source
    args = ["convert", str(path), str(tmp_path / "out.zarr/raw")]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'out.zarr/raw'} (1 of 1 tile)")
    before = (tmp_path / "out.zarr/raw/zarr.json").stat().st_mtime_ns
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{tmp_path / 'out.zarr/raw'} is already complete (1 tile); nothing to do\n"
    assert captured.err == ""
    assert (tmp_path / "out.zarr/raw/zarr.json").stat().st_mtime_ns == before  # nothing rewritten


SLOW_CONVERT = """
import sys
import emfast.io._convert as _convert
from emfast.cli import main
_convert.TILE_BYTES = 128 << 10  # tiles of many chunks of many chunks: zarr's event loop is busy when Ctrl-C comes
sys.argv = ["emfast", "convert", sys.argv[1], sys.argv[2], "--chunks", "4", "16", "16"]
sys.exit(main())  # as the command runs it
"""


@pytest.mark.parametrize("signals, status, line", [
    ([signal.SIGINT], 130, "emfast: interrupted"),
    ([signal.SIGTERM], 143, "emfast: terminated (SIGTERM)"),  # Slurm, timeout, docker stop: ended silently, -15
    ([signal.SIGINT] * 400, 130, "emfast: interrupted")])  # Ctrl-C held down: often died by the signal (-2)
def test_a_signal_during_a_zarr_conversion_prints_one_line_and_exits_with_its_status(tmp_path, monkeypatch, signals,
                                                                                     status, line):
    data = np.random.default_rng(2).integers(0, 256, (32, 128, 128), dtype=np.uint8)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("raw", data=data, chunks=(4, 16, 16))
    args = [str(tmp_path / "in.zarr/raw"), str(tmp_path / "out.zarr/raw")]
    process = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=SRC))
    try:
        while not list((tmp_path / "out.zarr/raw").glob("c/*")):  # the first chunks are being written
            assert process.poll() is None, process.communicate()
            time.sleep(0.01)
        for number in signals:  # until the process has ended, through its clean-up and the interpreter's exit
            if process.poll() is not None:
                break
            process.send_signal(number)
            time.sleep(0.002)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == status, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[")]
    assert lines == [line], err[-3000:]
    monkeypatch.setattr(_convert, "TILE_BYTES", 128 << 10)
    assert main(["convert", *args, "--chunks", "4", "16", "16"]) == 0  # and it resumes
    np.testing.assert_array_equal(ef.open(tmp_path / "out.zarr/raw").array[0], data)


def test_ctrl_c_during_the_last_tile_of_a_level_stops_before_the_next_level(tmp_path, monkeypatch, capsys):
    """The first Ctrl-C is noted and honoured after the tile being written; during a level's last tile it was
    dropped, and every coarser level of the pyramid was converted with exit status 0."""
    data = np.random.default_rng(2).integers(0, 256, (16, 64, 64), dtype=np.uint8)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("raw", data=data, chunks=(4, 16, 16))
    copy_tile = _convert._copy_tile

    def interrupted_in_the_last(read, writer, record, tiles, number, *args):
        if number == len(tiles) - 1 and writer.dataset.endswith("s0"):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, noted while this tile is written
        return copy_tile(read, writer, record, tiles, number, *args)

    monkeypatch.setattr(_convert, "_copy_tile", interrupted_in_the_last)
    monkeypatch.setattr(_convert, "TILE_BYTES", 16 * 64 * 16)
    args = ["convert", str(tmp_path / "in.zarr/raw"), str(tmp_path / "out.zarr/raw"), "--levels", "3"]
    assert main(args) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "emfast: interrupted"
    np.testing.assert_array_equal(ef.open(tmp_path / "out.zarr/raw/s0").array[0], data)
    assert not (tmp_path / "out.zarr/raw/s1").exists()
    monkeypatch.setattr(_convert, "_copy_tile", copy_tile)
    assert main(args) == 0  # and it resumes with the next level
    assert ef.open(tmp_path / "out.zarr/raw/s2").shape == (4, 16, 16)


def test_a_pyramid_keeps_its_output_locked_between_its_levels(tmp_path, monkeypatch):
    """Each level took and let go of the container's lock: another run got in between two levels, and the
    pyramid, which had started first, failed half way with "another emfast run is writing"."""
    from emfast.io._outputs import OutputBusyError, OutputLock
    data = np.random.default_rng(2).integers(0, 256, (16, 64, 64), dtype=np.uint8)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("raw", data=data, chunks=(4, 16, 16))
    others = []
    open_source = _convert.open_source

    def between_levels(path, *args, **kwargs):  # the pyramid opens the level below each level after s0
        if "out.zarr" in str(path):
            try:
                OutputLock(tmp_path / "out.zarr").acquire().release()
                others.append("let in")
            except OutputBusyError:
                others.append("refused")
        return open_source(path, *args, **kwargs)

    monkeypatch.setattr(_convert, "open_source", between_levels)
    convert(str(tmp_path / "in.zarr/raw"), tmp_path / "out.zarr/raw", levels=3)
    assert others == ["refused", "refused"]  # before s1 and before s2


def _tree(path: Path) -> dict:
    """Every file below ``path`` (or ``path`` itself) with its bytes and modification time."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def test_a_refused_output_is_left_exactly_as_it_was(tmp_path, source):
    """A refusal came after the output was opened to write: an HDF5 file's modification time changed (which made a
    conversion reading that file refuse to resume), and a tensorstore store got a root zarr.json."""
    source = str(source[0])
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f.create_dataset("foreign", data=np.ones((4, 4, 4), np.uint8))
    os.utime(tmp_path / "out.h5", ns=(10**18, 10**18))
    ts = pytest.importorskip("tensorstore")
    ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "ts.zarr/raw")},
             "metadata": {"shape": [4, 4, 4], "data_type": "uint8"}, "create": True}).result()[...] = 1
    for output, dataset in ((tmp_path / "out.h5", "foreign"), (tmp_path / "ts.zarr", "raw")):
        before = _tree(output)
        for overwrite in (False, True):
            with pytest.raises(ConvertError, match="was not written by emfast"):
                convert(source, f"{output}/{dataset}", overwrite=overwrite)
            with pytest.raises(ef.inference.OutputExistsError, match="was not written by emfast"):
                ef.predict(lambda batch: batch.astype(np.float32), source, f"{output}/{dataset}",
                           patch_in=(4, 8, 8), overwrite=overwrite)
            assert _tree(output) == before
    assert not (tmp_path / "ts.zarr/zarr.json").exists()


def test_an_output_below_an_array_is_refused_before_anything_is_written(tmp_path, source, capsys):
    """Only groups hold arrays: into HDF5, h5py failed with a TypeError (reported as a bug in emfast), after opening
    the file to write had rewritten part of its superblock (a review of convert)."""
    with h5py.File(tmp_path / "u.h5", "w") as f:
        f.create_dataset("v", data=np.ones((4, 4, 4), np.uint8))
        f["gone"] = h5py.SoftLink("/nothing")  # below it, h5py failed with a KeyError
        f["T"] = np.dtype("<i4")  # a named datatype: a TypeError
    zarr.open_group(str(tmp_path / "z.zarr"), mode="w").create_array("v", data=np.ones((4, 4, 4), np.uint8))
    cases = [(tmp_path / "u.h5", "v", "a dataset"), (tmp_path / "u.h5", "gone", "a link to nothing"),
             (tmp_path / "u.h5", "T", "no group"), (tmp_path / "z.zarr", "v", "an array")]
    for output, above, what in cases:
        before = _tree(output)
        for flags in ([], ["--overwrite"]):
            assert main(["convert", str(source[0]), f"{output}/{above}/w", *flags]) == 2
            assert f"{output.name}/{above}/w: {above} in {output} is {what}, and only groups hold arrays" in \
                capsys.readouterr().err
        with pytest.raises(ef.inference.OutputExistsError, match=f"{above} in .* is {what}"):
            ef.predict(lambda batch: batch.astype(np.float32), str(source[0]), f"{output}/{above}/w",
                       patch_in=(4, 8, 8))
        assert _tree(output) == before


@pytest.mark.parametrize("levels", [[], ["--levels", "2"]])
@pytest.mark.parametrize("below", [False, True])
def test_damaged_metadata_at_the_output_is_named(tmp_path, source, capsys, levels, below):
    """An empty or non-object zarr.json where the output goes, or in a group above it: "Expecting value" naming no
    file, or an AttributeError or TypeError reported as a bug in emfast."""
    (tmp_path / "o.zarr/img").mkdir(parents=True)
    (tmp_path / "o.zarr/zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    output = tmp_path / "o.zarr/img/w" if below else tmp_path / "o.zarr/img"
    for text, message in (("", "not JSON"), ("[1, 2]", r"\[1, 2\]; expected a JSON object")):
        (tmp_path / "o.zarr/img/zarr.json").write_text(text)
        assert main(["convert", str(source[0]), str(output), *levels]) == 2
        err = capsys.readouterr().err
        assert re.search(r"o.zarr.img \(zarr.json\): malformed metadata: " + message, err), err
        assert (tmp_path / "o.zarr/img/zarr.json").read_text() == text
        assert sorted(p.name for p in (tmp_path / "o.zarr/img").iterdir()) == ["zarr.json"]


def test_a_damaged_root_group_or_a_file_above_the_output_is_named(tmp_path, source, capsys):
    """The root group is above every output: its damaged metadata was an AttributeError or a bare "Expecting
    value"; a file where a group of the output's path belongs was "[Errno 20] Not a directory"."""
    (tmp_path / "o.zarr").mkdir()
    for name, text in (("zarr.json", "[1, 2]"), ("zarr.json", ""), (".zattrs", "[]")):
        for stale in tmp_path.joinpath("o.zarr").iterdir():
            stale.unlink()
        (tmp_path / "o.zarr" / name).write_text(text)
        assert main(["convert", str(source[0]), str(tmp_path / "o.zarr/a/w")]) == 2
        assert f"o.zarr ({name}): malformed metadata" in capsys.readouterr().err
        assert [p.name for p in (tmp_path / "o.zarr").iterdir()] == [name]
    (tmp_path / "f.zarr").mkdir()
    (tmp_path / "f.zarr/a").write_text("a file")
    assert main(["convert", str(source[0]), str(tmp_path / "f.zarr/a/w")]) == 2
    assert "is a file, no group, and only groups hold arrays" in capsys.readouterr().err


def test_an_array_emfast_would_not_read_where_the_output_goes_is_anothers(tmp_path, source, capsys):
    """A valid array emfast reads no volume from (strings, 0-D) was called malformed where an output would go."""
    group = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    group.create_array("v", shape=(), dtype=np.int32)
    assert main(["convert", str(source[0]), str(tmp_path / "z.zarr/v"), "--overwrite"]) == 2
    assert "z.zarr/v exists and was not written by emfast" in capsys.readouterr().err


def test_a_rerun_on_a_complete_output_leaves_it_exactly_as_it_was(tmp_path, source):
    """Opening it to write changed an HDF5 file's modification time even with nothing to write (a conversion
    reading that file then refused to resume), and gave a store without root metadata a root zarr.json."""
    source = str(source[0])
    for output in (tmp_path / "out.h5/raw", tmp_path / "out.zarr/raw"):
        convert(source, output)
        container = output.parent
        os.utime(container, ns=(10**18, 10**18))
        if container.suffix == ".zarr":
            (container / "zarr.json").unlink()  # as tensorstore writes a store: no root metadata
        before = _tree(container)
        assert convert(source, output).written == 0
        assert _tree(container) == before


def test_a_resume_refused_for_missing_block_flags_leaves_the_output_as_it_was(tmp_path, source):
    data = source[1]

    def failing(batch):
        failing.calls += 1
        if failing.calls == 3:
            raise RuntimeError("model failed")
        return batch.astype(np.float32)

    failing.calls = 0
    for output in (tmp_path / "p.h5/pred", tmp_path / "p.zarr/pred"):
        failing.calls = 0
        with pytest.raises(RuntimeError, match="model failed"):
            ef.predict(failing, data, output, patch_in=(8, 16, 16), block=(8, 16, 16), chunks=(8, 16, 16))
        if output.parent.suffix == ".h5":
            with h5py.File(output.parent, "a") as f:
                del f["pred.blocks"]
        else:
            import shutil
            shutil.rmtree(output.parent / "pred.blocks")
        os.utime(output.parent, ns=(10**18, 10**18))
        before = _tree(output.parent)
        with pytest.raises(ef.inference.OutputExistsError, match="without its record of finished blocks"):
            ef.predict(lambda batch: batch.astype(np.float32), data, output, patch_in=(8, 16, 16),
                       block=(8, 16, 16), chunks=(8, 16, 16), resume=True)
        assert _tree(output.parent) == before


def test_convert_arguments_are_checked_before_anything_is_written(tmp_path):
    """Found by a helper misusing the API: ``overwrite="no"`` (a str, so true) replaced an existing output with
    other data; ``progress="yes"`` failed after the output's metadata was written and ``zarr_format=np.int64(2)``
    after the store was made; ``chunks`` as an array, a string, an int, 10.5 or True and ``tile_bytes`` 0 or -5
    raised Python's own errors or were taken as something else."""
    with h5py.File(tmp_path / "in.h5", "w") as file:
        file["raw"] = np.arange(20 * 40 * 40, dtype=np.uint32).reshape(20, 40, 40).astype(np.uint8)
        file["labels"] = np.ones((20, 40, 40), np.uint64)
    convert(tmp_path / "in.h5/raw", tmp_path / "o.zarr/raw")
    with pytest.raises(ConvertError, match="overwrite must be True or False, got 'no'"):
        convert(tmp_path / "in.h5/labels", tmp_path / "o.zarr/raw", overwrite="no")
    np.testing.assert_array_equal(ef.open(tmp_path / "o.zarr/raw").array[0], h5py.File(tmp_path / "in.h5")["raw"][...])
    for bad, message in [(dict(progress="yes"), "progress must be a callable"),
                         (dict(chunks="10,20,20"), "chunks must be 3 integers >= 1"),
                         (dict(chunks=10), "chunks must be 3 integers >= 1"),
                         (dict(chunks=(10.5, 20, 20)), "chunks must be 3 integers >= 1"),
                         (dict(chunks=(True, 20, 20)), "chunks must be 3 integers >= 1"),
                         (dict(tile_bytes=0), "tile_bytes must be an integer >= 1"),
                         (dict(tile_bytes=-5), "tile_bytes must be an integer >= 1")]:
        with pytest.raises(ConvertError, match=message):
            convert(tmp_path / "in.h5/raw", tmp_path / "refused.zarr/raw", **bad)
        assert not (tmp_path / "refused.zarr").exists()
    result = convert(tmp_path / "in.h5/raw", tmp_path / "n.zarr/raw", chunks=np.array([10, 20, 20]),
                     zarr_format=np.int64(2), tile_bytes=np.int64(1 << 20))
    assert result.written == result.tiles


def test_attributes_standard_json_and_hdf5_cannot_hold_do_not_break_the_output(tmp_path):
    """A helper's attribute zoo: a NaN attribute was copied as a bare NaN into zarr.json, which tensorstore and
    neuroglancer refuse to read; a ragged list (or an embedded NUL) made convert to HDF5 fail after it had made
    the dataset, which then blocked every rerun, --overwrite too."""
    import json
    zarr = pytest.importorskip("zarr")
    data = np.arange(512, dtype=np.uint8).reshape(8, 8, 8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = data
        f["raw"].attrs.update({"threshold": np.nan, "gain": np.inf, "note": "kept"})
    with pytest.warns(RuntimeWarning, match=r"the attribute '(threshold|gain)' is not standard JSON"):
        convert(tmp_path / "in.h5/raw", tmp_path / "out.zarr/raw")
    convert(tmp_path / "in.h5/raw", tmp_path / "copy.h5/raw")  # HDF5 holds NaN itself (a review: it was dropped)
    with h5py.File(tmp_path / "copy.h5") as f:
        assert np.isnan(f["raw"].attrs["threshold"]) and f["raw"].attrs["gain"] == np.inf
    source = zarr.create_array(str(tmp_path / "s.zarr"), shape=data.shape, chunks=(8, 8, 8), dtype=data.dtype)
    source[...] = data
    source.attrs["comment"] = "\ud800"  # valid JSON to Python, no UTF-8: tensorstore refused the output (a review)
    with pytest.warns(RuntimeWarning, match=r"the attribute 'comment' is not standard JSON"):
        convert(tmp_path / "s.zarr", tmp_path / "s-copy.zarr/raw")
    (tmp_path / "s-copy.zarr/raw/zarr.json").read_text(encoding="utf-8")
    metadata = json.loads((tmp_path / "out.zarr/raw/zarr.json").read_text(),
                          parse_constant=lambda name: pytest.fail(f"{name} in zarr.json"))
    assert metadata["attributes"]["note"] == "kept" and "threshold" not in metadata["attributes"]
    source = zarr.create_array(str(tmp_path / "src.zarr"), shape=data.shape, chunks=(4, 4, 4), dtype=data.dtype)
    source[...] = data
    source.attrs.update({"bboxes": [[0, 0], [1, 2, 3]], "label": "a\x00b"})
    for _ in range(2):  # the second run finds the first one's output complete
        convert(tmp_path / "src.zarr", tmp_path / "out.h5/raw")
    with h5py.File(tmp_path / "out.h5") as f:
        assert json.loads(f["raw"].attrs["bboxes"]) == [[0, 0], [1, 2, 3]]
        np.testing.assert_array_equal(f["raw"][...], data)


def test_geometry_emfast_cannot_write_back_is_refused_when_read(tmp_path):
    """An OME-NGFF scale of 0 was read, converted and predicted, and emfast then refused its own output; a
    resolution given as a mapping was skipped, and the voxel size lost without a word."""
    zarr = pytest.importorskip("zarr")
    root = zarr.open_group(str(tmp_path / "ome.zarr"), mode="w")
    root.create_array("s0", shape=(4, 4, 4), chunks=(4, 4, 4), dtype="uint8")
    root.attrs["multiscales"] = [{"version": "0.4", "axes": [{"name": a, "type": "space"} for a in "zyx"],
                                  "datasets": [{"path": "s0", "coordinateTransformations": [
                                      {"type": "scale", "scale": [0, 4, 4]}]}]}]
    with pytest.raises(ef.io.StoreMetadataError, match=r"the scale of s0 must be positive along z, y and x"):
        ef.open(tmp_path / "ome.zarr")
    attrs = dict(root.attrs)  # a time or channel axis of scale 0 never reaches emfast's outputs (a review)
    attrs["multiscales"][0]["axes"].insert(0, {"name": "t", "type": "time"})
    attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"][0]["scale"] = [0, 40, 4, 4]
    root.attrs.update(attrs)
    root.create_array("s0", shape=(1, 4, 4, 4), chunks=(1, 4, 4, 4), dtype="uint8", overwrite=True)
    assert ef.open(tmp_path / "ome.zarr", in_memory=False).resolution == (40.0, 4.0, 4.0)
    with pytest.raises(ValueError, match=r"resolution must be 3 finite numbers > 0"):  # predict wrote it, then
        ef.Volume.from_array(np.zeros((4, 4, 4), np.uint8), resolution=(0, 4, 4))  # refused its own output
    array = zarr.create_array(str(tmp_path / "d.zarr"), shape=(4, 4, 4), chunks=(4, 4, 4), dtype="uint8")
    array.attrs["resolution"] = {"z": 40, "y": 4, "x": 4}
    with pytest.raises(ef.io.StoreMetadataError, match=r"resolution = \{'z': 40.*expected a list of one number"):
        ef.open(tmp_path / "d.zarr")


def test_hdf5_byte_string_attributes_are_text_and_undecodable_geometry_is_named(tmp_path):
    """Fixed-length string attributes (MATLAB's, older tools') were dropped by convert; a latin-1 unit in a
    geometry attribute raised a bare UnicodeDecodeError naming no file or key."""
    data = np.zeros((8, 8, 8), np.uint8)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = data
        f["raw"].attrs.update({"comment": np.bytes_(b"from MATLAB"), "channels": np.array([b"em", b"mask"])})
        f["bad"] = data
        f["bad"].attrs.update({"resolution": [4, 4, 4], "units": b"\xb5m"})
    convert(tmp_path / "in.h5/raw", tmp_path / "out.zarr/raw")
    import zarr
    attributes = zarr.open_array(str(tmp_path / "out.zarr/raw"), mode="r").attrs
    assert attributes["comment"] == "from MATLAB" and attributes["channels"] == ["em", "mask"]
    with pytest.raises(ef.io.StoreMetadataError, match=r"in\.h5:bad \(attributes\): malformed metadata"):
        ef.open(tmp_path / "in.h5/bad")


def test_compound_hdf5_attributes_keep_their_field_names(tmp_path):
    """A compound attribute (a calibration table, as HDF5 tools write them) became lists without its field names
    and with its byte strings left as bytes (found by a helper reading attributes as real files carry them)."""
    record = np.dtype([("name", "S8"), ("value", "<f8")])
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = np.zeros((4, 4, 4), np.uint8)
        f["raw"].attrs["calibration"] = np.array([(b"gain", 1.5), (b"bias", -2.0)], dtype=record)
        f["raw"].attrs["detector"] = np.array((b"k2", 4.0), dtype=record)
    convert(tmp_path / "in.h5/raw", tmp_path / "out.zarr/raw")
    import zarr
    attributes = zarr.open_array(str(tmp_path / "out.zarr/raw"), mode="r").attrs
    assert attributes["calibration"] == [{"name": "gain", "value": 1.5}, {"name": "bias", "value": -2.0}]
    assert attributes["detector"] == {"name": "k2", "value": 4.0}


def test_an_unfinished_output_warns_when_opened_and_is_refused_as_a_source(tmp_path, monkeypatch, capsys):
    """A conversion killed half way was read without a word (5.2 M of 9.4 M voxels still 0), listed by info as
    a plain array, and copied by convert into a store that looks complete (found by a helper killing runs). Its
    record says it is not complete: opening it warns, info says so, converting it is refused until finished."""
    data = np.random.default_rng(3).integers(1, 256, (16, 64, 64), dtype=np.uint8)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("raw", data=data, chunks=(4, 16, 16))
    copy_tile = _convert._copy_tile

    def stopped(read, writer, record, tiles, number, *args):
        if number == 2:
            raise KeyboardInterrupt  # where a kill would leave it
        return copy_tile(read, writer, record, tiles, number, *args)

    monkeypatch.setattr(_convert, "_copy_tile", stopped)
    monkeypatch.setattr(_convert, "TILE_BYTES", 4 * 64 * 64)
    half = str(tmp_path / "half.zarr/raw")
    assert main(["convert", str(tmp_path / "in.zarr/raw"), half]) == 130
    monkeypatch.setattr(_convert, "_copy_tile", copy_tile)
    capsys.readouterr()
    with pytest.warns(ef.UnfinishedOutputWarning, match="half.zarr/raw is an emfast output not finished writing.*"
                                                         "run the same emfast convert again"):
        volume = ef.open(half)
    assert (volume.array == 0).any()  # what was not written: read as the fill value, as the warning says
    assert main(["convert", half, str(tmp_path / "copy.h5/raw")]) == 2
    assert "not finished writing" in capsys.readouterr().err and not (tmp_path / "copy.h5").exists()
    # predict too (a helper's: it predicted the unwritten zeros and recorded its output complete), and check
    with pytest.raises(ef.inference.UnfinishedInputError, match="half.zarr/raw is an emfast output not finished "
                                                                "writing .* run the same emfast convert again"):
        ef.predict(lambda batch: batch, half, str(tmp_path / "p.zarr/p"), patch_in=(4, 16, 16))
    assert not (tmp_path / "p.zarr").exists()
    (tmp_path / "p.yaml").write_text(f"predict: {{model: numpy:negative, input: {half}, output: "
                                     f"{tmp_path / 'q.zarr/p'}, patch_in: [4, 16, 16]}}\n")
    for command in ("check", "predict"):
        assert main([command, str(tmp_path / "p.yaml")]) == 2
        assert "predict.input: " in capsys.readouterr().err
    assert not (tmp_path / "q.zarr").exists()
    assert main(["info", str(tmp_path / "half.zarr")]) == 0
    assert "an unfinished emfast output" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "in.zarr/raw"), half]) == 0  # finished: it resumes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(ef.open(half).array[0], data)


def test_a_source_rewritten_while_converted_leaves_the_output_unfinished(tmp_path, monkeypatch):
    """Chunks of the source rewritten by another process mid-conversion (metadata untouched): the output mixed
    both versions and was recorded complete with the first one's fingerprint (found by a helper)."""
    data = np.random.default_rng(5).integers(0, 200, (16, 64, 64), dtype=np.uint8)
    source = zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("raw", data=data, chunks=(4, 16, 16))
    copy_tile = _convert._copy_tile

    def rewritten_after_the_first(read, writer, record, tiles, number, *args):
        done = copy_tile(read, writer, record, tiles, number, *args)
        if number == 0:
            source[...] = 255 - data
        return done

    monkeypatch.setattr(_convert, "_copy_tile", rewritten_after_the_first)
    monkeypatch.setattr(_convert, "TILE_BYTES", 4 * 64 * 64)
    out = str(tmp_path / "out.zarr/raw")
    with pytest.raises(ef.InputChangedError, match="in.zarr/raw changed while .*out.zarr/raw was written"):
        convert(str(tmp_path / "in.zarr/raw"), out, tile_bytes=4 * 64 * 64)
    with pytest.warns(ef.UnfinishedOutputWarning):
        ef.open(out).close()
    monkeypatch.setattr(_convert, "_copy_tile", copy_tile)
    with pytest.raises(ConvertError, match="changed since this output was started"):
        convert(str(tmp_path / "in.zarr/raw"), out, tile_bytes=4 * 64 * 64)
    convert(str(tmp_path / "in.zarr/raw"), out, tile_bytes=4 * 64 * 64, overwrite=True)
    np.testing.assert_array_equal(ef.open(out).array[0], 255 - data)


@pytest.mark.parametrize("source", ["e.zarr", "e.h5/v"])
def test_an_empty_source_is_refused_naming_it(tmp_path, capsys, source):
    """A source with a zero-length axis (as zarr-python and h5py write one) failed with ZeroDivisionError, reported
    as a bug in emfast; emfast.open says the same volume is empty."""
    zarr.open_array(str(tmp_path / "e.zarr"), mode="w", shape=(0, 32, 32), chunks=(8, 16, 16), dtype="u1")
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f.create_dataset("v", shape=(0, 32, 32), dtype="u1")
    assert main(["convert", str(tmp_path / source), str(tmp_path / "out.zarr/v")]) == 2
    assert capsys.readouterr().err.strip().endswith("volume is empty (shape (0, 32, 32)); there is nothing to convert")
    assert not (tmp_path / "out.zarr").exists()
