"""Where the data comes from: volumes (NumPy arrays and HDF5 datasets, read-only, in memory or lazily through a
bounded chunk cache), per-volume statistics cached beside the user's data, and the built-in demo volume.

May import: ``emfast._core``, ``emfast._checks``, ``emfast._machine``.
"""
from ._chunkcache import CacheStats, default_budget
from ._demo import LABELS_DATASET, RAW_DATASET, demo_volume_path, make_em_volume
from ._stats import VolumeStatistics, volume_statistics
from ._hdf5 import Hdf5Source, hdf5, list_datasets, open_hdf5
from ._source import DatasetNotFoundError, Stamp, VolumeSource
from ._volume import Volume, as_volume

__all__ = [
    "LABELS_DATASET",
    "RAW_DATASET",
    "CacheStats",
    "DatasetNotFoundError",
    "Hdf5Source",
    "Stamp",
    "Volume",
    "VolumeSource",
    "VolumeStatistics",
    "as_volume",
    "default_budget",
    "demo_volume_path",
    "hdf5",
    "list_datasets",
    "make_em_volume",
    "open_hdf5",
    "volume_statistics",
]
