import h5py
import numpy as np
import pytest

from threads import emfast_threads


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def small_h5(tmp_path, rng):
    """An HDF5 file with raw (uint8), labels (uint64), resolution/offset attributes and a group."""
    path = tmp_path / "sample.h5"
    raw = rng.integers(0, 256, (20, 48, 40), dtype=np.uint8)
    labels = rng.integers(1, 50, (20, 48, 40), dtype=np.uint64)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("volumes/raw", data=raw, chunks=(4, 16, 16))
        d.attrs["resolution"] = (40.0, 4.0, 4.0)
        d.attrs["offset"] = (0.0, 0.0, 0.0)
        d = f.create_dataset("volumes/labels/neuron_ids", data=labels)
        d.attrs["resolution"] = (40.0, 4.0, 4.0)
        d.attrs["offset"] = (0.0, 0.0, 0.0)
    return path, raw, labels


@pytest.fixture(autouse=True)
def no_leftover_threads():
    """Every test must leave no emfast producer thread running."""
    yield
    alive = emfast_threads()
    assert not alive, f"threads still running after the test: {alive}"
