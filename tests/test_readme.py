"""The README's Python blocks run as written, on small files made here, so they never drift from the code.

Only sizes shrink, so that the blocks run in seconds: epochs of 1,000 batches become 2, ten epochs one, eight
test-time variants none. Blocks
that use PyTorch skip where it is not installed, saying so.
"""
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHRINK = [("epoch_size=1000", "epoch_size=2"), ("range(10)", "range(1)"), ("tta=8,", "tta=0,")]


def blocks():
    if not README.exists():  # an installed wheel's tests run without the repository beside them
        return []
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def shrunk(code):
    for old, new in SHRINK:
        code = code.replace(old, new)
    return code


@pytest.fixture
def files(tmp_path, monkeypatch):
    """sample_A.h5, A.h5, B.h5, C.h5 (raw, neuron ids with many boundaries, a training mask) and train.yaml."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMFAST_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    z, y, x = np.indices((40, 200, 200))
    labels = (1 + z // 8 * 100 + y // 25 * 10 + x // 25).astype(np.uint64)
    for name in ("sample_A", "A", "B", "C"):
        with h5py.File(f"{name}.h5", "w") as f:
            f["volumes/raw"] = rng.integers(0, 256, labels.shape, dtype=np.uint8)
            f["volumes/labels/neuron_ids"] = labels
            f["volumes/masks/training"] = np.ones(labels.shape, np.uint8)
    Path("train.yaml").write_text(
        "data:\n  samples:\n"
        "    - {name: A, file: A.h5, raw: volumes/raw, labels: volumes/labels/neuron_ids}\n"
        "    - {name: B, file: B.h5, raw: volumes/raw, labels: volumes/labels/neuron_ids}\n"
        "  hold_out: [B]\n"
        "loader: {patch: [8, 32, 32], batch_size: 2, epoch_size: 3}\n")
    return tmp_path


def test_the_readme_has_python_blocks():
    if README.exists():
        assert len(blocks()) >= 4


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_block_runs(files, index):
    code = blocks()[index]
    if "import torch" in code:
        pytest.importorskip("torch", reason="this README block uses PyTorch, which is not installed")
    namespace = {}
    if index > 0 and not code.startswith(("import ", "from ")):  # a block without imports goes on from the last
        exec(shrunk(blocks()[index - 1]), namespace)
    exec(shrunk(code), namespace)
    loader = namespace.get("loader")
    if loader is not None and not loader._closed:  # a block that only builds a loader: it must stream too
        with loader:
            batch = loader.next_batch()
            assert batch["raw"].shape[0] == loader.batch_size


@pytest.mark.filterwarnings("ignore:The mapping interface for autodoc options")  # inside Sphinx's own napoleon
def test_the_api_reference_builds_without_warnings(tmp_path):
    """``python -m sphinx -W -b html docs/api build/docs``: autodoc over the public docstrings, warnings as
    errors (sphinx comes with the test extra)."""
    sources = Path(__file__).resolve().parents[1] / "docs" / "api"
    if not sources.exists():
        pytest.skip("docs/api is not beside the tests (an installed wheel's tests run without the repository)")
    sphinx = pytest.importorskip("sphinx.cmd.build", reason="sphinx is not installed (pip install '.[test]')")
    warnings = tmp_path / "warnings.txt"
    status = sphinx.build_main(["-W", "--keep-going", "-q", "-b", "html", "-w", str(warnings), str(sources),
                                str(tmp_path / "html")])
    assert status == 0, warnings.read_text()
    loader_page = (tmp_path / "html" / "loader.html").read_text()
    assert "max_buffers" in loader_page and "state_dict" in loader_page  # autodoc really ran


def test_the_bench_tables_are_the_recorded_runs():
    """The README's comparison and targets tables are those of the JSON file it names, and the version it names is
    the one that wrote that file: a new recorded run fails this test until the README shows it."""
    from emfast.bench._report import tables

    if not README.exists():
        pytest.skip("README.md is not beside the tests (an installed wheel's tests run without the repository)")
    text = README.read_text()
    found = re.search(r"with emfast (\S+)\n\(`(benchmarks/results/[^`]+\.json)`.*?<!-- bench tables: (\S+) -->\n"
                      r"```\n(.*?)```", text, flags=re.S)
    assert found, "the Performance section must name the version and JSON file before its bench tables"
    version, named, marked, shown = found.groups()
    assert named == marked
    record = json.loads((ROOT / named).read_text())
    expected = "\n".join(tables(record["rows"], record["targets"])) + "\n"
    assert shown == expected, f"README's tables differ from {named}; they should read:\n{expected}"
    assert version.rstrip(",.") == record["machine"]["emfast"], f"{named} was written by emfast " \
                                                                 f"{record['machine']['emfast']}"
    report = (ROOT / named).with_suffix(".txt")
    assert expected in report.read_text() + "\n", f"{report} is not the report of the same run"
