"""The emfast command line."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.cli import main

SMALL_DEMO = ["--volume-shape", "16", "64", "64", "--patch", "8", "32", "32", "--batch-size", "2"]


def test_demo_streams_batches_and_prints_the_profile(tmp_path, capsys):
    assert main(["demo", "--batches", "5", "--threads", "2", "--cache-dir", str(tmp_path)] + SMALL_DEMO) == 0
    captured = capsys.readouterr()
    assert "5 batches in" in captured.out and "kernel" in captured.out
    assert "5/5 batches" in captured.err and "Mvoxel/s" in captured.err
    assert len(list(tmp_path.glob("*.h5"))) == 1
    # the cached volume is reused, lazily read this time
    assert main(["demo", "--batches", "2", "--lazy", "--cache-dir", str(tmp_path)] + SMALL_DEMO) == 0
    assert len(list(tmp_path.glob("*"))) == 1


def test_demo_refuses_a_patch_larger_than_the_volume(tmp_path, capsys):
    args = ["demo", "--cache-dir", str(tmp_path), "--volume-shape", "16", "64", "64", "--patch", "32", "32", "32"]
    assert main(args) == 2
    assert "does not fit" in capsys.readouterr().err


def test_info_lists_datasets_with_metadata(small_h5, capsys):
    path, _, _ = small_h5
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "volumes/raw: shape=(20, 48, 40) dtype=uint8 chunks=(4, 16, 16)" in out
    assert "volumes/labels/neuron_ids" in out and "resolution=[40.0, 4.0, 4.0]" in out


def test_info_into_a_pipe_closed_early_stops_quietly(small_h5):
    """emfast info a.h5 | head -1: the reader goes away, and emfast stops without a word, as a command the
    SIGPIPE ends (it printed "emfast: error: [Errno 32] Broken pipe" and exited 2)."""
    path, _, _ = small_h5
    process = subprocess.Popen([sys.executable, "-m", "emfast", "info", str(path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.stdout.close()  # before emfast writes a line
    _, error = process.communicate(timeout=120)
    assert process.returncode == 141 and error == b""


@pytest.mark.parametrize("dataset", ["", "/volumes/raw"])
def test_converting_a_missing_hdf5_file_says_it_is_missing(tmp_path, capsys, dataset):
    """Without a dataset the message asked to name one, e.g. missing.h5/volumes/raw, for a file that is not there."""
    assert main(["convert", str(tmp_path / "missing.h5") + dataset, str(tmp_path / "out.zarr/raw")]) == 2
    assert f"emfast: error: HDF5 file not found: {tmp_path / 'missing.h5'}\n" == capsys.readouterr().err


def test_downsampling_without_levels_is_refused_in_the_command_lines_words(tmp_path, capsys):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = np.zeros((4, 8, 8), np.uint8)
    assert main(["convert", str(tmp_path / "in.h5/raw"), str(tmp_path / "out.zarr/raw"), "--downsampling", "mode"]) == 2
    assert capsys.readouterr().err == ("emfast: error: --downsampling mode makes the coarser levels of a pyramid; with "
                                       "--levels 1 there are none: give more levels, or leave downsampling out\n")
    assert not (tmp_path / "out.zarr").exists()


def test_a_folder_of_no_format_is_told_the_remedy_the_command_line_has(tmp_path, capsys):
    """The message ended "or pass format=", an option no command has: that one is emfast.open's."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a store")
    assert main(["info", str(tmp_path / "plain")]) == 2
    error = capsys.readouterr().err
    assert "name the container with a suffix" in error and "(or, in Python, pass format= to emfast.open)" in error


@pytest.mark.parametrize("target", ["missing.h5", "."])
def test_info_on_a_bad_path_is_a_clear_error(tmp_path, capsys, target):
    assert main(["info", str(tmp_path / target)]) == 2
    assert "emfast: error:" in capsys.readouterr().err


@pytest.mark.parametrize("command", [[], ["demo"], ["info"]])
def test_help_for_every_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(command + ["--help"])
    assert exit_info.value.code == 0
    assert "usage: emfast" in capsys.readouterr().out


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "emfast", "--version"], capture_output=True, text=True,
                            check=True)
    assert result.stdout.startswith("emfast ")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_standard_streams_on_a_full_device_lose_text_not_work(small_h5, tmp_path):
    """Standard error on a full device stopped a conversion at its first progress line (exit 1, the output left
    unfinished); standard output on one said "No space left on device" as if the output's disk were full."""
    def emfast(*args, **streams):
        return subprocess.run([sys.executable, "-m", "emfast", *args], timeout=120, **streams)

    path = small_h5[0]
    with open("/dev/full", "w") as full:
        assert emfast("convert", f"{path}/volumes/raw", str(tmp_path / "c.zarr/raw"), stderr=full,
                      stdout=subprocess.DEVNULL).returncode == 0
        assert emfast("info", str(tmp_path / "nope.h5"), stderr=full).returncode == 2
        stdout_full = emfast("info", str(path), stdout=full, stderr=subprocess.PIPE, text=True)
        for asked in ("--version", "--help"):  # argparse dropped its text without a word: exit 0
            assert emfast(asked, stdout=full, stderr=subprocess.DEVNULL).returncode == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unfinished output warns when opened
        np.testing.assert_array_equal(ef.open(str(tmp_path / "c.zarr/raw")).array[0], small_h5[1])
    assert stdout_full.returncode == 2 and stdout_full.stderr.strip().splitlines()[-1] == (
        "emfast: error: [Errno 28] cannot write to standard output (No space left on device): what emfast printed "
        "there is lost")


def test_demo_checks_its_options_before_building_the_volume(tmp_path, capsys):
    assert main(["demo", "--batches", "0", "--cache-dir", str(tmp_path)]) == 2
    assert "--batches" in capsys.readouterr().err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("shape", [["-4", "96", "96"], ["4", "96", "96"]])
@pytest.mark.parametrize("config", [[], ["--config"]])
def test_demo_names_a_volume_shape_it_cannot_build(tmp_path, capsys, shape, config):
    """A negative size gave numpy's "all elements of broadcast shape must be non-negative"; a size under 8 failed
    later, saying the patch did not fit."""
    assert main(["demo", *config, "--volume-shape", *shape, "--cache-dir", str(tmp_path)]) == 2
    assert f"--volume-shape must be 3 integers >= 8 (z, y, x), got [{', '.join(shape)}]" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_version_is_single_sourced_and_printed(capsys):
    import importlib.metadata

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"emfast {ef.__version__}" == \
        f"emfast {importlib.metadata.version('emfast')}"
    changelog = Path(__file__).resolve().parents[1] / "CHANGELOG.md"
    if changelog.exists():  # beside the sources (an installed wheel's tests run without it)
        assert f"## {ef.__version__}" in changelog.read_text()


@pytest.mark.parametrize("no_avx2", [False, True])
def test_info_without_a_file_describes_the_installation(capsys, monkeypatch, no_avx2):
    from emfast._core import warp as _warp
    from emfast.transfer import cuda_unavailable

    if no_avx2:  # read once, when emfast is imported: a fresh process with the variable set
        monkeypatch.setenv("EMFAST_NO_AVX2", "1")
        out = subprocess.run([sys.executable, "-m", "emfast", "info"], capture_output=True, text=True,
                             check=True).stdout
        assert "AVX2 warp samplers, blending and boundary growing not used" in out
    else:
        assert main(["info"]) == 0
        out = capsys.readouterr().out
        assert ("AVX2 warp samplers, blending and boundary growing in use" in out) == _warp.uses_avx2()
    assert out.startswith(f"emfast {ef.__version__} (Python ")
    reason = cuda_unavailable()
    assert ("GPU: usable" in out) if reason is None else (f"GPU: not available: {reason}" in out)


# -- errors: the user's in one line, emfast's bugs with their traceback ----------------------------------------------

@pytest.mark.parametrize("bug", [TypeError("unsupported operand"), KeyError("shape"), AttributeError("no .chunks"),
                                 RuntimeError("producer died")])
def test_a_bug_shows_its_traceback_and_asks_for_a_report(monkeypatch, capsys, bug):
    def broken():
        raise bug

    monkeypatch.setattr("emfast.cli.installation", broken)
    assert main(["info"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert f"internal error ({type(bug).__name__})" in err and "please report it" in err


def test_the_users_errors_stay_one_line(tmp_path, small_h5, capsys, monkeypatch):
    path, _, _ = small_h5
    missing_dataset = ["convert", f"{path}/volumes/nothing", str(tmp_path / "out.zarr/raw")]
    missing_file = ["info", str(tmp_path / "missing.h5")]
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("data: {samples: []}\nloader: {patch: [8, 8, 8]}\n")
    for argv, culprit in ((missing_dataset, "volumes/nothing"), (missing_file, "missing.h5"),
                          (["check", str(bad_config)], "bad.yaml, line 1: data.samples")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("emfast: error:") and culprit in err and "Traceback" not in err, err
    import zarr

    zarr.create_array(tmp_path / "store.zarr", shape=(4, 4, 4), dtype="uint8", chunks=(2, 2, 2))
    monkeypatch.setitem(sys.modules, "zarr", None)  # the optional package not installed: import zarr fails
    assert main(["info", str(tmp_path / "store.zarr")]) == 2
    err = capsys.readouterr().err  # it said only "No module named 'zarr'"
    assert err.startswith("emfast: error: reading zarr needs zarr-python 3") and "Traceback" not in err
    assert "pip install 'emfast[zarr]'" in err
    assert main(["convert", f"{path}/volumes/raw", str(tmp_path / "out.zarr/raw")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("emfast: error: writing zarr needs zarr-python 3") and "emfast[zarr]" in err, err


def test_info_shows_the_shards_of_a_sharded_zarr_array_in_z_y_x_order(tmp_path, capsys):
    """A shard is one file (one request, remotely), which decides what a read costs: info shows its shape beside
    the inner chunks', both in (z, y, x) order for an array stored as (x, y, z); an unsharded array shows none."""
    zarr = pytest.importorskip("zarr")
    zarr.create_array(tmp_path / "s.zarr", shape=(64, 48, 32), chunks=(8, 8, 4), shards=(32, 16, 8), dtype="u1",
                      dimension_names=["x", "y", "z"])[...] = 1
    zarr.create_array(tmp_path / "u.zarr", shape=(8, 8, 8), chunks=(4, 4, 4), dtype="u1")[...] = 1
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    assert "  .: shape=(32, 48, 64) dtype=uint8 chunks=(4, 8, 8) shards=(8, 16, 32) sharded[zstd] " in \
        capsys.readouterr().out
    assert main(["info", str(tmp_path / "u.zarr")]) == 0
    assert " shards=" not in capsys.readouterr().out


def test_info_shows_the_world_box_of_hdf5_datasets_as_of_zarr_arrays(tmp_path, capsys):
    """HDF5 lines carry the same resolution, offset and world box (z, y, x nm) as emfast reads them as zarr's."""
    import h5py
    import numpy as np
    data = np.zeros((4, 8, 6), np.uint8)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        d = f.create_dataset("raw", data=data)
        d.attrs["resolution"], d.attrs["offset"] = (40, 4, 2), (80, 8, 8)
        f.create_dataset("plain", data=data)
    from emfast.io import convert
    convert(str(tmp_path / "a.h5/raw"), tmp_path / "b.zarr/raw")
    geometry = "resolution=(40.0, 4.0, 2.0) offset=(80.0, 8.0, 8.0) world=[(80.0, 8.0, 8.0), (240.0, 40.0, 20.0)) nm"
    assert main(["info", str(tmp_path / "a.h5")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "  raw:" in line][0].startswith(f"  raw: shape=(4, 8, 6) dtype=uint8 chunks=None "
                                                                    f"{geometry}")
    assert "  plain: shape=(4, 8, 6) dtype=uint8 chunks=None resolution=None offset=None" in lines
    assert main(["info", str(tmp_path / "b.zarr")]) == 0
    assert geometry in capsys.readouterr().out


# -- options every command shares -------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["demo"], ["check", "c.yaml"], ["snapshot", "c.yaml", "--out", "o.zarr"],
                                     ["predict", "c.yaml"], ["bench"]])
def test_every_command_building_the_built_in_volume_takes_the_same_cache_dir_option(command, capsys):
    from emfast.cli import build_parser
    assert build_parser().parse_args(command + ["--cache-dir", "elsewhere"]).cache_dir == "elsewhere"
    with pytest.raises(SystemExit):
        build_parser().parse_args(command + ["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    # the help names every place the cache may be, in the order emfast looks (emfast._machine.cache_directory)
    assert "--cache-dir CACHE_DIR where the built-in volume is cached (default: $EMFAST_CACHE_DIR, else " \
           "$XDG_CACHE_HOME/emfast, else ~/.cache/emfast)" in help_text


def test_an_internal_type_error_in_a_command_is_a_bug_with_its_traceback(monkeypatch, capsys, tmp_path):
    """A TypeError raised inside a command (not by an argument check, which raises ValueError) is emfast's bug:
    exit 1 and the traceback, never the one line of a user error."""
    def broken(config, cache_dir=None):
        return len(None)

    monkeypatch.setattr("emfast.config.check_config", broken)
    assert main(["check", str(tmp_path / "any.yaml")]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "len(None)" in err
    assert "internal error (TypeError)" in err and not err.startswith("emfast: error:")


def test_an_error_during_convert_starts_on_its_own_line_after_the_progress_bar(tmp_path, monkeypatch):
    """On a terminal the message was appended to the bar's line ("...0/2 tiles, estimating the time left emfast:
    error: ...")."""
    import io
    from emfast import cli

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def failing(*args, progress, **kwargs):
        progress(0, 2)
        raise OSError("the disk is full")

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(cli, "convert_volume", failing)
    assert main(["convert", str(tmp_path / "in.h5/raw"), str(tmp_path / "out.zarr/raw")]) == 2
    text = terminal.getvalue()
    assert "estimating the time left" in text and "\nemfast: error: the disk is full" in text, text


def test_converting_into_a_store_with_other_arrays_leaves_them_listed(tmp_path, capsys):
    """convert store.zarr/raw store.zarr/raw_copy described the store's root as an OME-NGFF image of raw_copy:
    emfast info and ome-zarr-py then saw only that image, and raw and labels were hidden."""
    zarr = pytest.importorskip("zarr")
    root = zarr.open_group(str(tmp_path / "store.zarr"), mode="w")
    data = np.random.default_rng(1).integers(0, 255, (8, 16, 16), dtype=np.uint8)
    for name in ("raw", "labels"):
        root.create_array(name, data=data, chunks=(4, 8, 8), attributes={"resolution": [40, 4, 4]})
    assert main(["convert", str(tmp_path / "store.zarr/raw"), str(tmp_path / "store.zarr/raw_copy")]) == 0
    capsys.readouterr()
    assert "multiscales" not in json.dumps(dict(zarr.open_group(str(tmp_path / "store.zarr")).attrs))
    assert main(["info", str(tmp_path / "store.zarr")]) == 0
    listed = capsys.readouterr().out
    assert all(f"{name}:" in listed for name in ("raw", "labels", "raw_copy")), listed
    assert main(["convert", str(tmp_path / "store.zarr/raw"), str(tmp_path / "alone.zarr/raw")]) == 0
    assert "multiscales" in json.dumps(dict(zarr.open_group(str(tmp_path / "alone.zarr")).attrs))  # its one array


def test_a_source_whose_path_is_not_utf8_converts(tmp_path):
    """A file name with bytes that are not UTF-8 (an old file server's Latin-1): info read it, but convert failed
    with "'utf-8' codec can't encode character '\\udcff'", naming nothing (the resume fingerprint's text)."""
    import os
    import h5py
    name = os.fsdecode(b"bad\xffname.h5")
    data = np.random.default_rng(2).integers(0, 255, (8, 16, 16), dtype=np.uint8)
    with h5py.File(tmp_path / name, "w") as f:
        f.create_dataset("raw", data=data, chunks=(4, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its record left out (not standard JSON), a killed run passed for finished
        assert main(["convert", str(tmp_path / name / "raw"), str(tmp_path / "out.zarr/raw")]) == 0
    np.testing.assert_array_equal(ef.open(tmp_path / "out.zarr/raw").array[0], data)
    import zarr
    record = zarr.open_array(str(tmp_path / "out.zarr/raw")).attrs["emfast_convert"]
    assert record["complete"] is True and record["source"]["path"].endswith("bad\\xffname.h5")
    assert main(["convert", str(tmp_path / name / "raw"), str(tmp_path / "out.zarr/raw")]) == 0  # done: resumes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = ef.predict(lambda batch: batch, str(tmp_path / name / "raw"), tmp_path / "p.zarr/p",
                            patch_in=(4, 8, 8), blend="none")
    assert zarr.open_array(result.path).attrs["emfast_predict"]["input"]["path"].endswith("bad\\xffname.h5")
    assert ef.predict(lambda batch: batch, str(tmp_path / name / "raw"), tmp_path / "p.zarr/p", patch_in=(4, 8, 8),
                      blend="none", resume=True).computed == 0


def test_info_names_an_array_it_cannot_read_instead_of_leaving_it_out(tmp_path, capsys, monkeypatch):
    """A zarr array whose zarr.json this user may not read was left out of the listing, exit 0."""
    zarr = pytest.importorskip("zarr")
    from emfast.io import _zarr
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    for name in ("raw", "labels"):
        root.create_array(name, shape=(8, 16, 16), chunks=(4, 8, 8), dtype=np.uint8)
    read = _zarr.read_regular_file

    def refusing(path, what):
        if Path(path) == tmp_path / "s.zarr" / "raw" / "zarr.json":
            raise PermissionError(13, "Permission denied", str(path))
        return read(path, what)

    monkeypatch.setattr(_zarr, "read_regular_file", refusing)
    assert main(["info", str(tmp_path / "s.zarr")]) == 2
    assert "cannot read the zarr metadata" in capsys.readouterr().err


@pytest.mark.parametrize("closed", [1, 2])
def test_a_closed_standard_stream_does_not_stop_the_work(small_h5, tmp_path, closed):
    """``emfast convert ... 2>&-`` (standard error closed, as some schedulers leave it) converted nothing and
    exited 1 without a word: its first progress line failed, then the error report. The work is done, the
    closed stream's text is dropped, and nothing else is written where it was (the next file opened would have
    taken its descriptor)."""
    import os
    path, raw, _ = small_h5
    out = tmp_path / "c.zarr"
    done = subprocess.run([sys.executable, "-m", "emfast", "convert", f"{path}/volumes/raw", f"{out}/raw"],
                          capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.close(closed),
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, (done.stdout, done.stderr)
    np.testing.assert_array_equal(ef.open(f"{out}/raw").array[0], raw)
    assert ("wrote" in done.stdout) == (closed == 2)


def test_info_lists_every_array_beside_one_it_cannot_read_and_prints_any_attribute(tmp_path, capsys):
    """One array's malformed geometry ended `emfast info` of a zarr store (exit 2, the other arrays never shown),
    an HDF5 one was shown without saying why it is no volume, and a lone surrogate in an attribute (valid JSON)
    stopped info after its first line."""
    zarr = pytest.importorskip("zarr")
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    for name, attrs in (("a_bad", {"resolution": "4,4,4"}), ("b_good", {"comment": "\ud800"})):
        root.create_array(name, shape=(8, 8, 8), chunks=(4, 4, 4), dtype=np.uint8).attrs.update(attrs)
    with h5py_file(tmp_path / "s.h5") as f:
        f["a_bad"] = np.zeros((8, 8, 8), np.uint8)
        f["a_bad"].attrs["resolution"] = "4,4,4"
        f["cplx"] = np.zeros((4, 4, 4), np.complex64)  # a dtype volumes do not hold: said too (a review)
    for store in ("s.zarr", "s.h5"):
        assert main(["info", str(tmp_path / store)]) == 0
        out = capsys.readouterr().out
        assert "a_bad" in out and "not read as a volume" in out and "resolution = '4,4,4'" in out, out
        assert main(["info", str(tmp_path / store / "a_bad")]) == 2  # the array named: an error, in every format
        assert "resolution = '4,4,4'" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "s.h5")]) == 0
    assert "cplx: shape=(4, 4, 4) dtype=complex64 chunks=None (not read as a volume" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    assert "b_good: shape=(8, 8, 8)" in capsys.readouterr().out


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_info_of_a_zarr_store_lists_arrays_that_are_no_volume_beside_the_others(tmp_path, capsys, zarr_format):
    """An empty, complex or string array ended `emfast info` of the store (exit 2, or 1 as a bug in emfast), the
    volume beside it never shown; the HDF5 listing said why such a dataset is no volume and went on."""
    zarr = pytest.importorskip("zarr")
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=zarr_format)
    root.create_array("a_empty", shape=(0, 4, 5), dtype="u1")
    root.create_array("b_complex", shape=(3, 4, 5), dtype="c8")
    root.create_array("c_raw", shape=(4, 5, 6), dtype="u1")[...] = 1
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert "a_empty: shape=(0, 4, 5)" in out and "(not read as a volume: " in out and "volume is empty" in out
    assert "b_complex: shape=(3, 4, 5) dtype=complex64" in out and "unsupported dtype complex64" in out
    assert "c_raw: shape=(4, 5, 6) dtype=uint8" in out and "min=1 max=1" in out
    assert main(["info", str(tmp_path / "s.zarr/b_complex")]) == 0  # named: listed with its reason too
    assert "unsupported dtype complex64" in capsys.readouterr().out


def test_info_lists_datasets_behind_hdf5_links_and_a_groups_own_attributes(tmp_path, capsys):
    """A file made of external links (to another file's dataset and group) was listed as holding nothing: h5py's
    visititems follows neither soft nor external links. A group named by the path showed the file's attributes
    as its own."""
    import h5py
    data = np.random.default_rng(4).integers(0, 255, (8, 16, 16), dtype=np.uint8)
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f.create_dataset("volumes/raw", data=data)
        f.create_dataset("volumes/labels/ids", data=data.astype(np.uint64))
    with h5py.File(tmp_path / "links.h5", "w") as f:
        f.attrs["of_the_file"] = 1
        f["raw"] = h5py.ExternalLink("data.h5", "volumes/raw")
        f["vols"] = h5py.ExternalLink("data.h5", "volumes")
        f["soft"] = h5py.SoftLink("/raw")
        f["gone"] = h5py.ExternalLink("missing.h5", "x")
        f.create_group("group").attrs["of_the_group"] = 2
        f["group/inside"] = data
    assert main(["info", str(tmp_path / "links.h5")]) == 0
    listed = [line.split(":")[0].strip() for line in capsys.readouterr().out.splitlines()[1:]
              if not line.startswith("    ")]
    assert listed == ["group/inside", "raw", "soft", "vols/labels/ids", "vols/raw"], listed
    assert main(["info", str(tmp_path / "links.h5/group")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "of_the_group" in header and "of_the_file" not in header, header


@pytest.mark.parametrize("name", ["gone.n5", "gone.zarr", "gone.h5"])
def test_info_of_a_container_that_is_not_there_is_an_error(tmp_path, capsys, name):
    """A path named .n5 that was not there listed "(no arrays)" with exit status 0 (.zarr and .h5 said so)."""
    assert main(["info", str(tmp_path / name)]) == 2
    assert str(tmp_path / name) in capsys.readouterr().err
    (tmp_path / "file.n5").write_bytes(b"")
    assert main(["info", str(tmp_path / "file.n5")]) == 2
    assert "file.n5 is a file, not an N5 container" in capsys.readouterr().err
    assert main(["info", "--storage-options", "{}"]) == 2  # without a URL they were dropped unsaid
    assert "--storage-options apply to a URL" in capsys.readouterr().err


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_info_of_a_missing_path_in_a_store_without_root_group_lists_its_arrays(tmp_path, capsys, zarr_format):
    """tensorstore and funlib write arrays with no group metadata above them: a path naming nothing there gave
    zarr-python's "No group found in store ... at path ''", naming the store's root, not the path."""
    zarr = pytest.importorskip("zarr")
    zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=zarr_format).create_array(
        "raw", shape=(4, 8, 8), dtype="u1")
    for marker in ("zarr.json", ".zgroup", ".zattrs"):
        (tmp_path / "s.zarr" / marker).unlink(missing_ok=True)  # as tensorstore writes it: no root group
    assert main(["info", str(tmp_path / "s.zarr/nope")]) == 2
    assert capsys.readouterr().err.strip() == f"emfast: error: {tmp_path / 's.zarr'} has no array 'nope'; its " \
                                              "arrays: raw"
    assert main(["info", str(tmp_path / "s.zarr")]) == 0 and "raw: shape=(4, 8, 8)" in capsys.readouterr().out


def h5py_file(path):
    import h5py
    return h5py.File(path, "w")


@pytest.mark.parametrize("command", [["check"], ["predict"], ["snapshot", "--out", "s.zarr"]])
def test_an_empty_config_argument_is_called_empty(command, capsys):
    """emfast predict "$CFG" with CFG unset read '' as the text of an empty config: "<text>: no predict section"
    (a review). argparse refuses it, naming the argument."""
    with pytest.raises(SystemExit) as exited:
        main(command[:1] + [""] + command[1:])
    assert exited.value.code == 2
    assert "the config path is empty (an unset shell variable?)" in capsys.readouterr().err
