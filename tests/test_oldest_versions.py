"""The oldest versions pyproject.toml declares (h5py 3.8, dask[distributed] 2024.1), simulated here by taking away
what they lack: each feature below was used unconditionally and failed every run on those versions (a review ran
them: every HDF5 prediction, every Dask prediction, and `emfast info` on a file of links)."""
import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.cli import main


def test_an_hdf5_prediction_needs_no_fill_time_keyword(tmp_path, monkeypatch):
    """create_dataset(fill_time=...) is h5py 3.12's; 3.8 raised TypeError making the finished-block flags."""
    real = h5py.Group.create_dataset

    def as_in_h5py_3_8(self, name, *args, **kwargs):
        if "fill_time" in kwargs:
            raise TypeError("make_new_dset() got an unexpected keyword argument 'fill_time'")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", as_in_h5py_3_8)
    raw = np.random.default_rng(0).integers(0, 255, (16, 32, 32), dtype=np.uint8)
    ef.predict(lambda batch: batch, raw, tmp_path / "p.h5/pred", patch_in=(8, 16, 16))
    with h5py.File(tmp_path / "p.h5", "r") as f:
        np.testing.assert_array_equal(f["pred"][0], raw * np.float32(1 / 255))


def test_a_dask_prediction_needs_no_futures_cancelled_error(tmp_path, monkeypatch):
    """distributed.client.FuturesCancelledError came in distributed 2024.7; before, the import in every run's
    clean-up failed after the blocks were written."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.delattr(distributed.client, "FuturesCancelledError", raising=False)
    raw = np.random.default_rng(1).integers(0, 255, (16, 32, 32), dtype=np.uint8)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        ef.predict(lambda batch: batch, raw, tmp_path / "p.zarr/pred", patch_in=(8, 16, 16), client=client)
    np.testing.assert_array_equal(ef.open(tmp_path / "p.zarr/pred").array[0], raw * np.float32(1 / 255))


def test_info_lists_datasets_behind_links_without_visititems_links(tmp_path, capsys, monkeypatch):
    """Group.visititems_links is h5py 3.11's: before, a file of links was listed as holding nothing."""
    monkeypatch.delattr(h5py.Group, "visititems_links", raising=False)
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["volumes/raw"] = np.zeros((4, 8, 8), np.uint8)
    with h5py.File(tmp_path / "links.h5", "w") as f:
        f["raw"] = h5py.ExternalLink("data.h5", "volumes/raw")
        f.create_group("inner")["soft"] = h5py.SoftLink("/raw")
    assert main(["info", str(tmp_path / "links.h5")]) == 0
    listed = [line.split(":")[0].strip() for line in capsys.readouterr().out.splitlines()[1:]
              if not line.startswith("    ")]
    assert listed == ["inner/soft", "raw"], listed
