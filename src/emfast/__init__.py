"""emfast: fast 3-D patch loading and augmentation from electron-microscopy volumes for deep learning.

Quick start::

    import emfast as ef
    raw = ef.hdf5("sample.h5", "volumes/raw")
    labels = ef.hdf5("sample.h5", "volumes/labels/neuron_ids")
    with ef.Loader(raw, labels, patch=(32, 128, 128), batch_size=8, threads=2, epoch_size=1000) as loader:
        for batch in loader:
            ...  # batch["raw"]: (8, 1, 32, 128, 128) float32, batch["labels"]: (8, 1, 32, 128, 128) uint64
"""
from .augment import Augmentation, Intensity, Mirror, Transpose
from .dataset import Dataset, Sample
from .loader import Batch, BatchReleasedError, Loader
from .profile import ProfileReport
from .sampling import Uniform
from .targets import Affinities, Boundaries, Classes, Foreground, compute_targets
from .transfer import DeviceArray, DeviceNotice
from .volumes import DatasetNotFoundError, Volume, hdf5

__version__ = "0.1.0"

__all__ = [
    "Affinities",
    "Augmentation",
    "Batch",
    "BatchReleasedError",
    "Boundaries",
    "Classes",
    "Dataset",
    "DatasetNotFoundError",
    "DeviceArray",
    "DeviceNotice",
    "Foreground",
    "Intensity",
    "Loader",
    "Mirror",
    "ProfileReport",
    "Sample",
    "Transpose",
    "Uniform",
    "Volume",
    "compute_targets",
    "hdf5",
]
