"""What a second review found emfast could still change or delete without owning it: a user's dataset at the
name a failed run was creating, a zarr array used as an output's container, a lock file that is a link, and an
HDF5 output that is the input file under another name."""
import errno
import os
import pwd
import signal
import stat
import subprocess
import sys
import threading

import h5py
import numpy as np
import pytest
import zarr

import emfast as ef
from emfast.cli import main
from emfast.io import OutputWriter


def crop(batch):
    return batch[:, :, 2:-2, 2:-2, 2:-2]


ARGS = dict(patch_in=20, patch_out=16)


def _input(tmp_path):
    volume = np.random.default_rng(0).random((32, 32, 32), dtype=np.float32)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = volume
    return volume


@pytest.mark.parametrize("how", ["predict", "convert"])
def test_a_users_dataset_where_a_failed_run_was_creating_is_never_replaced(tmp_path, how, capsys, monkeypatch):
    _input(tmp_path)

    def failing(*args, **kwargs):
        raise OSError("no room for the flags")

    monkeypatch.setattr(OutputWriter, "create_companion", failing)
    with pytest.raises(OSError, match="no room"):  # fails while creating its output: its flags after its dataset
        ef.predict(crop, tmp_path / "in.h5/raw", tmp_path / "out.h5/pred", **ARGS)
    monkeypatch.undo()
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


_KILLED_WITH_A_CHILD = """
import os, signal, sys, time
from emfast.io import OutputLock
lock = OutputLock(sys.argv[1]).acquire()
child = os.fork()
if child == 0:  # a helper process the model started, outliving the run (its output not the test's pipe)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_runs_forked_child_does_not_keep_the_outputs_lock(tmp_path):
    """The lock's descriptor was inherited by fork(): a child outliving the killed run (a model's helper
    process) kept the flock, and every later run was told that the dead pid was writing."""
    from emfast.io import OutputLock
    done = subprocess.run([sys.executable, "-c", _KILLED_WITH_A_CHILD, str(tmp_path / "out.zarr")],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == -signal.SIGKILL, done.stderr
    child = int(done.stdout.split()[0])
    try:
        os.kill(child, 0)  # still running
        with OutputLock(tmp_path / "out.zarr"):  # taken: the child's copy was closed at fork
            pass
    finally:
        os.kill(child, signal.SIGKILL)


def test_one_lock_for_an_output_reached_through_a_link(tmp_path):
    from emfast.io._outputs import OutputBusyError, OutputLock

    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real/x.zarr", tmp_path / "out.zarr")  # the output named through a link to it
    with OutputLock(tmp_path / "real/x.zarr"):
        with pytest.raises(OutputBusyError, match="another emfast run"):
            OutputLock(tmp_path / "out.zarr").acquire()


def test_a_run_elsewhere_with_this_processs_pid_is_not_taken_for_this_process(tmp_path):
    """Two containers sharing a folder both run as pid 1: the refusal said "another emfast run in this process"
    when the lock file's pid equalled this process's, though another process held it."""
    from emfast.io._outputs import OutputBusyError, OutputLock

    script = (f"import time\nfrom emfast.io._outputs import OutputLock\n"
              f"lock = OutputLock({str(tmp_path / 'out.zarr')!r})\nlock.acquire()\n"
              f"lock._write({{'pid': {os.getpid()}}})\nprint('held', flush=True)\ntime.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(OutputBusyError, match=rf"^another emfast run \(pid {os.getpid()}\) is writing"):
            OutputLock(tmp_path / "out.zarr").acquire()
    finally:
        child.kill()
        child.wait(30)


def test_two_predictions_from_two_threads_into_one_container_name_this_process(tmp_path):
    """The second of two threads predicting into one container was told that "another emfast run (pid N)" was
    writing it, N being its own pid."""
    from emfast.io._outputs import OutputBusyError

    volume = np.zeros((8, 32, 32), np.float32)
    started, release = threading.Event(), threading.Event()

    def slow(batch):
        started.set()
        release.wait(30)
        return batch

    first = threading.Thread(target=ef.predict, args=(slow, volume, tmp_path / "out.zarr/a"),
                             kwargs=dict(patch_in=(8, 32, 32)))
    first.start()
    try:
        assert started.wait(30)
        with pytest.raises(OutputBusyError, match=r"^another emfast run in this process \(another thread\) "
                                                        r"is writing .*out\.zarr"):
            ef.predict(lambda b: b, volume, tmp_path / "out.zarr/b", patch_in=(8, 32, 32))
    finally:
        release.set()
        first.join(60)


def test_partial_files_are_never_removed_through_a_link(tmp_path):
    from emfast.io._outputs import remove_partial_files

    (tmp_path / "theirs").mkdir()
    theirs = tmp_path / "theirs" / ("c.0." + "a" * 32 + ".partial")
    theirs.write_bytes(b"x")
    os.symlink(tmp_path / "theirs", tmp_path / "pred.blocks")
    assert remove_partial_files(tmp_path / "pred.blocks") == 0 and theirs.exists()


KILLED_WHILE_CREATING = """
import os, signal, sys
import emfast as ef
from emfast.io import _writer
_writer.OutputWriter.create = lambda self, **layout: os.kill(os.getpid(), signal.SIGKILL)
source, out, how = sys.argv[1:]
if how == "predict":
    ef.predict(lambda batch: batch[:, :, 2:-2, 2:-2, 2:-2], source, out, patch_in=20, patch_out=16)
else:
    ef.io.convert(source, out)
"""


def _users_own(out, container: str) -> None:
    """The user's own array under the output's name, with data and no emfast record."""
    if container == "out.h5":  # the killed run left the file truncated: the user writes it anew
        with h5py.File(out.parent, "w") as f:
            f[out.name] = np.full((1, 32, 32, 32), 7.0, np.float32)
        return
    array = zarr.open_group(out.parent, mode="a", zarr_format=3 if container == "v3.zarr" else 2).create_array(
        out.name, shape=(1, 32, 32, 32), chunks=(1, 16, 16, 16), dtype="f4")
    array[...] = 7.0


def _still_users(out, container: str) -> bool:
    if container == "out.h5":
        with h5py.File(out.parent, "r") as f:
            return bool((f[out.name][...] == 7).all())
    return bool((zarr.open_array(out, mode="r")[...] == 7).all())


@pytest.mark.parametrize("container", ["v2.zarr", "v3.zarr", "out.h5"])
@pytest.mark.parametrize("how", ["predict", "convert"])
def test_a_users_array_written_where_a_killed_run_was_creating_is_never_replaced(tmp_path, how, container):
    """A run killed while creating its output leaves that name in the lock file; an array the user writes there
    afterwards holds data and no record, so neither a plain run nor an overwrite may take it for the half-made
    output and delete it."""
    _input(tmp_path)
    out = tmp_path / container / "pred"
    if container != "out.h5":  # an existing store keeps its format
        zarr.open_group(out.parent, mode="w", zarr_format=3 if container == "v3.zarr" else 2)
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_CREATING, str(tmp_path / "in.h5/raw"), str(out), how],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert '"creating": "pred"' in (tmp_path / f".{container}.emfast-lock").read_text()
    _users_own(out, container)
    for overwrite in (False, True):
        with pytest.raises((ef.inference.OutputExistsError, ef.io.ConvertError), match="not written by emfast"):
            if how == "predict":
                ef.predict(crop, tmp_path / "in.h5/raw", out, overwrite=overwrite, **ARGS)
            else:
                ef.io.convert(tmp_path / "in.h5/raw", out, overwrite=overwrite)
        assert _still_users(out, container)


def test_a_half_made_v2_output_with_a_partial_attributes_file_is_still_emfasts(tmp_path):
    """zarr-python writes .zattrs through NAME.<uuid>.partial: a run killed between .zarray and .zattrs leaves
    that temporary, which is no data of anyone's; a chunk file is."""
    from emfast.io._outputs import _zarr_holds_data

    folder = tmp_path / "pred"
    folder.mkdir()
    (folder / ".zarray").write_text("{}")
    (folder / f".zattrs.{'ab12' * 8}.partial").write_text("{")
    assert not _zarr_holds_data(folder)
    (folder / "0.0.0").write_bytes(b"data")
    assert _zarr_holds_data(folder)


def test_output_names_longer_than_a_file_name_may_be_are_refused_before_anything_is_made(tmp_path, capsys):
    """A 245-character store name is a valid file name, but its lock file's is not: the error asked to move
    away a link that did not exist; a 250-character dataset passed ``emfast check`` and failed once predict
    had made the store, on its flags' name (``.blocks`` added)."""
    volume = _input(tmp_path)
    long_store, long_dataset = tmp_path / ("a" * 245 + ".zarr"), "b" * 250
    for out in (f"{long_store}/p", f"{tmp_path}/o.zarr/{long_dataset}", f"{tmp_path}/o.zarr/{'c' * 256}/p"):
        with pytest.raises(ValueError, match=r"more than the 255 a file name may have; choose a shorter name"):
            ef.predict(crop, volume, out, **ARGS)
        if long_dataset not in out:  # convert makes no companion
            with pytest.raises(ValueError, match=r"more than the 255 a file name may have"):
                ef.io.convert(tmp_path / "in.h5/raw", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.h5"]
    ef.io.convert(tmp_path / "in.h5/raw", f"{tmp_path}/o.zarr/{long_dataset}")  # convert makes no .blocks
    config = tmp_path / "p.yaml"
    config.write_text(f"predict:\n  model: numpy:copy\n  input: in.h5/raw\n  output: o.zarr/{long_dataset}\n"
                      "  patch_in: [20, 20, 20]\n  patch_out: [20, 20, 20]\n")
    assert main(["check", str(config)]) == 2
    assert "line 4: predict.output: " in capsys.readouterr().err


@pytest.mark.parametrize("dataset", ["a" * 230, "a" * 200 + "/" + "b" * 200])
def test_long_dataset_names_that_fit_a_file_name_predict_and_overwrite(tmp_path, dataset):
    """A review: datasets of 210 to 248 characters failed after every model call (the kept-tiles folder's and
    the set-aside names, which add to the dataset's), and one of two 200-character names when overwritten."""
    volume = np.random.default_rng(1).integers(0, 256, (23, 41, 37), dtype=np.uint8)
    settings = dict(patch_in=(8, 16, 16), overlap=(2, 4, 4), chunks=(8, 8, 8), block=(8, 8, 8), batch_size=2)
    for overwrite in (False, True):
        ef.predict(lambda batch: batch, volume, f"{tmp_path}/out.zarr/{dataset}", overwrite=overwrite, **settings)
    np.testing.assert_array_equal(ef.open(f"{tmp_path}/out.zarr/{dataset}").array[0],
                                  volume.astype(np.float32) * np.float32(1 / 255))
    ef.predict(lambda batch: batch, volume, f"{tmp_path}/out.h5/{dataset}", **settings)  # no file-name limit inside
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.h5.emfast-lock", ".out.zarr.emfast-lock", "out.h5",
                                                          "out.zarr"]


def test_an_hdf5_output_this_process_has_open_to_read_is_refused_before_the_model_runs(tmp_path):
    """Opened read-only here (a lazy volume of the previous prediction), HDF5 refuses to open it to write: the
    busy check let it through as this process's own, and the model ran first (a review)."""
    volume = _input(tmp_path)
    calls = []
    ef.predict(crop, volume, tmp_path / "out.h5/old", **ARGS)
    for swmr in (False, True):  # a SWMR reader's intent is another flag, still no writer's (a review)
        with h5py.File(tmp_path / "out.h5", "r", swmr=swmr):
            with pytest.raises(ef.io._outputs.OutputBusyError, match="this process has it open to read only"):
                ef.predict(lambda batch: calls.append(1) or crop(batch), volume, tmp_path / "out.h5/new", **ARGS)
    assert calls == []


def test_the_lock_file_is_shared_as_the_umask_shares_the_output(tmp_path):
    """The lock file was made 0o644 whatever the umask: in a group's shared folder (umask 002), a member's first
    run locked every other member out of writing that container (a review)."""
    previous = os.umask(0o002)
    try:
        ef.predict(crop, np.zeros((8, 32, 32), np.uint8), tmp_path / "shared.zarr/pred", **ARGS)
    finally:
        os.umask(previous)
    lock = tmp_path / ".shared.zarr.emfast-lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o664
    assert stat.S_IMODE((tmp_path / "shared.zarr/pred/zarr.json").stat().st_mode) == 0o664


def test_a_lock_file_another_user_keeps_is_named_with_its_owner(tmp_path, monkeypatch):
    from emfast.io._outputs import OutputLock

    OutputLock(tmp_path / "out.zarr").acquire().release()
    real_open = os.open

    def theirs(path, flags, *args, **kwargs):  # as root, no mode makes a file unwritable: another user's refusal
        if str(path).endswith(".emfast-lock") and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", theirs)
    owner = pwd.getpwuid(os.getuid()).pw_name
    with pytest.raises(PermissionError, match=rf"cannot write .*out.zarr: its lock file .*\.out\.zarr\.emfast-lock is "
                                              rf"not writable by this user \(Permission denied; it belongs to user "
                                              rf"{owner}, mode -rw-.*\). .*chmod g\+w"):
        ef.predict(crop, np.zeros((8, 32, 32), np.uint8), tmp_path / "out.zarr/pred", **ARGS)


_WRITING = """
import sys, time, h5py
from emfast.io import OutputLock
if sys.argv[2] == "emfast":
    OutputLock(sys.argv[1]).acquire()
file = h5py.File(sys.argv[1], "a")
print("writing", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("writer", ["emfast", "other"])
def test_reading_an_hdf5_file_another_process_writes_names_the_writer(tmp_path, writer):
    """HDF5 refuses readers while another process writes the file: its "unable to lock file" came as "cannot open
    ... as an HDF5 file", read as a damaged file, naming no writer and no way out (a review)."""
    with h5py.File(tmp_path / "shared.h5", "w") as f:
        f["raw"] = np.zeros((4, 8, 8), np.uint8)
    process = subprocess.Popen([sys.executable, "-c", _WRITING, str(tmp_path / "shared.h5"), writer],
                               stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert process.stdout.readline().strip() == "writing"
        who = rf"an emfast run \(pid {process.pid}\) is writing a prediction or conversion into it" \
            if writer == "emfast" else "another program is writing it"
        for in_memory in (True, False):
            with pytest.raises(BlockingIOError, match=rf"cannot read .*shared.h5: {who}, and HDF5 locks a file it "
                                                      r"writes against readers .*; wait for it to finish, or write "
                                                      r"outputs to a file of their own. HDF5_USE_FILE_LOCKING=FALSE"):
                ef.open(tmp_path / "shared.h5", "raw", in_memory=in_memory)
    finally:
        process.kill()
        process.wait()
    assert ef.open(tmp_path / "shared.h5", "raw").shape == (4, 8, 8)


def test_an_external_link_whose_target_cannot_be_opened_says_why(tmp_path):
    """h5py's get() hides why a link's target cannot be opened: a link to a file another process wrote, to a
    missing file or to a missing dataset was "not found; datasets there: none" (a second review)."""
    with h5py.File(tmp_path / "target.h5", "w") as f:
        f["raw"] = np.zeros((4, 8, 8), np.uint8)
    with h5py.File(tmp_path / "link.h5", "w") as f:
        f["raw"] = h5py.ExternalLink("target.h5", "/raw")
        f["missing"] = h5py.ExternalLink("target.h5", "/labels")
        f["gone"] = h5py.ExternalLink("gone.h5", "/raw")
    assert ef.open(tmp_path / "link.h5", "raw").shape == (4, 8, 8)
    with pytest.raises(ef.io.DatasetNotFoundError, match=r"link.h5:missing is an external link to /labels in "
                                                         r"target.h5, which has no dataset /labels; datasets there: "
                                                         r"raw"):
        ef.open(tmp_path / "link.h5", "missing")
    with pytest.raises(FileNotFoundError, match=r"link.h5:gone is an external link to /raw in gone.h5, a file not "
                                                r"found \(looked for .*gone.h5"):
        ef.open(tmp_path / "link.h5", "gone")
    process = subprocess.Popen([sys.executable, "-c", _WRITING, str(tmp_path / "target.h5"), "emfast"],
                               stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert process.stdout.readline().strip() == "writing"
        with pytest.raises(BlockingIOError, match=rf"link.h5:raw is an external link to /raw in target.h5: cannot "
                                                  rf"read .*target.h5: an emfast run \(pid {process.pid}\) is writing"):
            ef.open(tmp_path / "link.h5", "raw", in_memory=False)
    finally:
        process.kill()
        process.wait()


def test_this_processs_own_lock_is_not_taken_for_the_writer_of_an_hdf5_file(tmp_path, monkeypatch):
    """holder() asked a lock this process held: flock refused its own, and a run that found another program
    writing its HDF5 output between its two checks blamed itself ("an emfast run (pid <its own>)"), as a reader
    (a second review)."""
    from emfast.io import _writer
    from emfast.io._outputs import OutputBusyError, OutputLock

    with h5py.File(tmp_path / "out.h5", "w") as f:
        f["raw"] = np.zeros((4, 8, 8), np.uint8)
    process = subprocess.Popen([sys.executable, "-c", _WRITING, str(tmp_path / "out.h5"), "other"],
                               stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert process.stdout.readline().strip() == "writing"
        with OutputLock(tmp_path / "out.h5") as lock:
            assert lock.holder() is None
            with pytest.raises(BlockingIOError, match=r"another program is writing it"):
                ef.open(tmp_path / "out.h5", "raw")
        monkeypatch.setattr(_writer, "refuse_hdf5_in_use", lambda path: None)  # the writer comes after this check
        with pytest.raises(OutputBusyError, match=r"cannot write .*out.h5: another program has it open to write"):
            ef.predict(crop, np.zeros((8, 32, 32), np.uint8), tmp_path / "out.h5/pred", **ARGS)
    finally:
        process.kill()
        process.wait()


def test_an_unreadable_lock_file_says_an_emfast_run_may_be_writing(tmp_path, monkeypatch):
    from emfast.io._outputs import OutputLock

    OutputLock(tmp_path / "out.h5").acquire().release()
    real_open = os.open

    def unreadable(path, flags, *args, **kwargs):  # another user's lock file, made under umask 077
        if str(path).endswith(".emfast-lock"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", unreadable)
    assert OutputLock(tmp_path / "out.h5").holder() == "unknown"
    monkeypatch.setattr(os, "open", real_open)
    assert OutputLock(tmp_path / "out.h5").holder() is None


def test_an_existing_lock_file_is_opened_without_creating_it(tmp_path, monkeypatch):
    """Linux's protected_regular (on by default in most distributions) refuses O_CREAT on another user's file in a
    sticky world-writable folder (/tmp, a scratch space), whatever its mode: the lock must be opened as it is."""
    from emfast.io._outputs import OutputLock

    OutputLock(tmp_path / "out.zarr").acquire().release()
    real_open = os.open

    def protected(path, flags, *args, **kwargs):
        if str(path).endswith(".emfast-lock") and flags & os.O_CREAT and os.path.exists(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", protected)
    ef.predict(crop, np.zeros((8, 32, 32), np.uint8), tmp_path / "out.zarr/pred", **ARGS)
    assert (tmp_path / "out.zarr/pred").is_dir()


def test_a_lock_file_removed_between_two_opens_is_made_again(tmp_path, monkeypatch):
    """Opened without O_CREAT first, then made with O_EXCL: a file removed between the two (a user told to remove
    a stale one) was "a link or folder of that name must be moved away" (a second review)."""
    from emfast.io._outputs import OutputLock

    real_open = os.open
    raced = []

    def removed_meanwhile(path, flags, *args, **kwargs):
        if str(path).endswith(".emfast-lock") and flags & os.O_EXCL and not raced:
            raced.append(path)
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))  # made, then removed
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", removed_meanwhile)
    with OutputLock(tmp_path / "out.zarr"):
        assert raced and (tmp_path / ".out.zarr.emfast-lock").is_file()
