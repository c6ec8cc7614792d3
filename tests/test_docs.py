"""The docs say what the code does: every YAML block of docs/CONFIG.md passes ``emfast check`` on files made the way
the block names them, and the API reference has a page for every public module and command."""
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

from emfast.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DOC = ROOT / "docs" / "CONFIG.md"
API = ROOT / "docs" / "api"

NETS = '''\
def load_unet(checkpoint):
    raise AssertionError("emfast check must not call the model factory")
'''


def yaml_blocks():
    if not CONFIG_DOC.exists():  # an installed wheel's tests run without the repository beside them
        return []
    return re.findall(r"```yaml\n(.*?)```", CONFIG_DOC.read_text(), flags=re.S)


@pytest.fixture
def data(tmp_path):
    """The files the blocks name: a.h5 and b.h5 with raw, neuron ids, mask and a second channel;
    sample.zarr/volumes/raw (empty chunks: only its shape and chunks are read) and nets.py with the factory."""
    rng = np.random.default_rng(0)
    shape = (40, 160, 160)
    z, y, x = np.indices(shape)
    for name in ("a", "b"):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["volumes/raw"] = rng.integers(0, 256, shape, dtype=np.uint8)
            f["volumes/em2"] = rng.integers(0, 256, shape, dtype=np.uint8)
            f["volumes/labels/neuron_ids"] = (1 + z // 8 * 100 + y // 20 * 10 + x // 20).astype(np.uint64)
            f["volumes/mask"] = np.ones(shape, np.uint8)
    zarr.create_array(tmp_path / "sample.zarr", name="volumes/raw", shape=(64, 512, 512), dtype="uint8",
                      chunks=(32, 128, 128))
    (tmp_path / "nets.py").write_text(NETS)
    return tmp_path


def test_config_doc_has_its_yaml_blocks():
    if CONFIG_DOC.exists():
        assert len(yaml_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(yaml_blocks())))
def test_every_yaml_block_of_the_config_doc_passes_check(data, capsys, index):
    text = yaml_blocks()[index]
    if "device: cuda" in text:  # the device is checked against this machine: a GPU with PyTorch, or none
        try:
            import torch
            usable = torch.cuda.is_available()
        except ImportError:
            usable = False
        if not usable:
            text = re.sub(r"\n *(device: cuda|cuda_graphs:)[^\n]*", "", text)  # CUDA graphs need the device
    path = data / f"block{index}.yaml"
    path.write_text(text)
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.rstrip().endswith("valid")


def test_the_api_reference_has_a_page_for_every_public_module_and_command():
    if not API.exists():
        pytest.skip("docs/api is not beside the tests (an installed wheel's tests run without the repository)")
    pages = {path.stem: path.read_text() for path in API.glob("*.rst")}
    assert "automodule:: emfast.inference" in pages.get("predict", "") or \
        "autofunction:: emfast.predict" in pages.get("predict", "")
    assert "emfast.io" in pages.get("convert", "") and "convert" in pages["convert"]
    for command in ("demo", "check", "info", "convert", "predict", "bench"):
        assert f"emfast {command}" in pages["cli"], command
    index = pages["index"]
    for page in pages:
        if page != "index":
            assert page in index, f"{page}.rst is not in the index's toctree"
