"""What a second review found emfast could still change or delete without owning it: a user's dataset at the
name a failed run was creating, a zarr array used as an output's container, a lock file that is a link, and an
HDF5 output that is the input file under another name."""
import os

import h5py
import numpy as np
import pytest
import zarr

import emfast as ef
from emfast.cli import main


def crop(batch):
    return batch[:, :, 2:-2, 2:-2, 2:-2]


ARGS = dict(patch_in=20, patch_out=16)


def _input(tmp_path):
    volume = np.random.default_rng(0).random((32, 32, 32), dtype=np.float32)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = volume
    return volume


@pytest.mark.parametrize("how", ["predict", "convert"])
def test_a_users_dataset_where_a_failed_run_was_creating_is_never_replaced(tmp_path, how, capsys):
    _input(tmp_path)
    with pytest.raises(Exception):  # fails while creating its dataset: chunks larger than the volume
        ef.predict(crop, tmp_path / "in.h5/raw", tmp_path / "out.h5/pred", chunks=(64, 64, 64), **ARGS)
    with h5py.File(tmp_path / "out.h5", "a") as f:  # the user then keeps their own data under that name
        if "pred" in f:
            del f["pred"]
        f["pred"] = np.full((1, 32, 32, 32), 7.0, np.float32)
    if how == "predict":
        with pytest.raises(ef.inference.OutputExistsError, match="not written by emfast"):
            ef.predict(crop, tmp_path / "in.h5/raw", tmp_path / "out.h5/pred", **ARGS)
    else:
        assert main(["convert", str(tmp_path / "in.h5/raw"), str(tmp_path / "out.h5/pred")]) == 2
    with h5py.File(tmp_path / "out.h5") as f:
        assert (f["pred"][...] == 7).all()


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("how", ["predict", "convert"])
def test_an_output_inside_a_zarr_array_is_refused_and_the_array_still_opens(tmp_path, zarr_format, how):
    _input(tmp_path)
    array = zarr.create_array(tmp_path / "labels.zarr", shape=(32, 32, 32), chunks=(16, 16, 16), dtype="u8",
                              zarr_format=zarr_format)
    array[:] = 5
    before = sorted(os.listdir(tmp_path / "labels.zarr"))
    with pytest.raises(ValueError, match="labels.zarr is a zarr array"):
        if how == "predict":
            ef.predict(crop, tmp_path / "in.h5/raw", tmp_path / "labels.zarr/pred", **ARGS)
        else:
            ef.io.convert(tmp_path / "in.h5/raw", tmp_path / "labels.zarr/copy")
    assert sorted(os.listdir(tmp_path / "labels.zarr")) == before
    assert (zarr.open_array(tmp_path / "labels.zarr", mode="r")[...] == 5).all()


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("three years of notes\n")
    os.symlink(notes, tmp_path / ".out.zarr.emfast-lock")
    with pytest.raises(OSError, match="emfast-lock"):
        ef.predict(crop, np.random.default_rng(1).random((32, 32, 32), dtype=np.float32), tmp_path / "out.zarr/p",
                   **ARGS)
    assert notes.read_text() == "three years of notes\n"


def test_an_hdf5_output_that_is_the_input_file_under_another_name_is_refused(tmp_path):
    _input(tmp_path)
    os.link(tmp_path / "in.h5", tmp_path / "alias.h5")
    with pytest.raises(ValueError, match="HDF5 file"):
        ef.predict(crop, tmp_path / "in.h5/raw", tmp_path / "alias.h5/pred", **ARGS)
    with h5py.File(tmp_path / "in.h5") as f:
        assert list(f) == ["raw"]


def test_a_copy_of_a_prediction_carries_no_record_of_the_run_it_copies(tmp_path):
    _input(tmp_path)
    ef.predict(crop, tmp_path / "in.h5/raw", tmp_path / "p.zarr/pred", **ARGS)
    ef.io.convert(tmp_path / "p.zarr/pred", tmp_path / "copy.zarr/pred")
    attributes = dict(zarr.open_array(tmp_path / "copy.zarr/pred", mode="r").attrs)
    assert "emfast_predict" not in attributes and "emfast_convert" in attributes


def test_one_lock_for_an_output_reached_through_a_link(tmp_path):
    from emfast.io._outputs import OutputBusyError, OutputLock

    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real/x.zarr", tmp_path / "out.zarr")  # the output named through a link to it
    with OutputLock(tmp_path / "real/x.zarr"):
        with pytest.raises(OutputBusyError, match="another emfast run"):
            OutputLock(tmp_path / "out.zarr").acquire()


def test_partial_files_are_never_removed_through_a_link(tmp_path):
    from emfast.io._outputs import remove_partial_files

    (tmp_path / "theirs").mkdir()
    theirs = tmp_path / "theirs" / ("c.0." + "a" * 32 + ".partial")
    theirs.write_bytes(b"x")
    os.symlink(tmp_path / "theirs", tmp_path / "pred.blocks")
    assert remove_partial_files(tmp_path / "pred.blocks") == 0 and theirs.exists()
