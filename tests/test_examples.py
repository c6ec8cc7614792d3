"""The examples run as users run them (short versions)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_and_predict_quick(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="examples/train_and_predict.py needs torch (pip install torch)")
    pytest.importorskip("zarr", reason="examples/train_and_predict.py writes zarr (pip install 'emfast[zarr]')")
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path / "cache"))
    example = _load("train_and_predict")
    result = example.main(["--quick", "--out", str(tmp_path / "prediction.zarr")])
    import emfast as ef

    predicted = ef.open(result["path"])
    assert predicted.shape == (24, 96, 96) and predicted.channels == 3 and predicted.dtype == np.uint8
    assert result["loss"] < 0.6  # down from log(2) = 0.69 of an untrained network
    assert 0.0 <= result["boundary_f1"] <= 1.0 and result["accuracy"] >= result["majority"] - 0.05


def test_train_and_predict_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    """Without --out the prediction goes to a temporary folder that is removed at the end, not left in /tmp on
    every run."""
    pytest.importorskip("torch", reason="examples/train_and_predict.py needs torch (pip install torch)")
    pytest.importorskip("zarr", reason="examples/train_and_predict.py writes zarr (pip install 'emfast[zarr]')")
    import tempfile

    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path / "cache"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = _load("train_and_predict").main(["--quick", "--steps", "2"])
    assert result["path"] is None and list(scratch.iterdir()) == []


def test_train_and_predict_help_gives_the_whole_first_paragraph(capsys):
    """--help showed the docstring's first line only, cut mid-sentence ("... write them to")."""
    pytest.importorskip("torch", reason="examples/train_and_predict.py needs torch (pip install torch)")
    example = _load("train_and_predict")
    with pytest.raises(SystemExit):
        example.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "write them to zarr, and score them against the built-in labels." in text
