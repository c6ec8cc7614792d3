"""The emfast command line."""
import subprocess
import sys

import pytest

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


def test_demo_checks_its_options_before_building_the_volume(tmp_path, capsys):
    assert main(["demo", "--batches", "0", "--cache-dir", str(tmp_path)]) == 2
    assert "--batches" in capsys.readouterr().err and not list(tmp_path.iterdir())
