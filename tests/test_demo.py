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
