"""``emfast demo`` checks everything it can before it builds and caches the built-in volume."""
import pytest

from emfast.cli import main


@pytest.mark.parametrize("options, words", [
    (["--volume-shape", "10", "10", "10"], "patch (32, 128, 128) does not fit"),
    (["--volume-shape", "16", "64", "40", "--patch", "8", "64", "32"], "for transposed examples"),
    (["--volume-shape", "16", "64", "64", "--patch", "8", "32", "32", "--batch-size", str(2**50)],
     f"batch_size={2**50} x patch_in"),
])
def test_demo_refuses_what_cannot_run_before_building_the_volume(tmp_path, capsys, options, words):
    assert main(["demo", "--batches", "1", "--threads", "1", "--cache-dir", str(tmp_path)] + options) == 2
    captured = capsys.readouterr()
    assert words in captured.err, captured.err
    assert "preparing the built-in EM volume" not in captured.err
    assert not list(tmp_path.iterdir()), "the volume was built and cached anyway"


def test_a_cache_folder_without_room_is_a_one_line_error_before_hdf5_writes(tmp_path, capsys, monkeypatch):
    """On a nearly full disk the volume's write failed inside HDF5, which then crashed the process (exit 139) after
    a traceback calling it a bug; the room is now checked first, as convert and predict check theirs."""
    import collections
    import os

    real_statvfs = os.statvfs
    full = collections.namedtuple("statvfs", "f_bavail f_frsize")(1, 4096)
    monkeypatch.setattr(os, "statvfs", lambda path: full if str(path).startswith(str(tmp_path)) else real_statvfs(path))
    assert main(["demo", "--batches", "1", "--volume-shape", "16", "64", "64", "--patch", "8", "32", "32",
                 "--cache-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("emfast: error: [Errno 28] not enough space for ") and "the built-in volume (16, 64, 64)" \
        in error and "(--cache-dir, or $EMFAST_CACHE_DIR)" in error, error
    assert not list(tmp_path.iterdir())  # the temporary file removed


def test_a_cache_folder_given_as_an_empty_or_unusable_path_is_named_as_given(tmp_path, capsys):
    """--cache-dir '' cached the volume in the working folder unasked; a --cache-dir that is a file was told to
    set EMFAST_CACHE_DIR, which --cache-dir overrides."""
    assert main(["demo", "--batches", "1", "--cache-dir", ""]) == 2
    assert "cache_dir (--cache-dir) is empty" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("")
    assert main(["demo", "--batches", "1", "--volume-shape", "16", "64", "64", "--patch", "8", "32", "32",
                 "--cache-dir", str(tmp_path / "a_file")]) == 2
    assert "give cache_dir (--cache-dir) a writable directory" in capsys.readouterr().err
