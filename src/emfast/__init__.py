"""emfast: fast 3-D patch loading and augmentation from electron-microscopy volumes for deep learning.

Quick start::

    import emfast as ef
    raw = ef.hdf5("sample.h5", "volumes/raw")
    labels = ef.hdf5("sample.h5", "volumes/labels/neuron_ids")
    with ef.Loader(raw, labels, patch=(32, 128, 128), batch_size=8, threads=2, epoch_size=1000) as loader:
        for batch in loader:
            ...  # batch["raw"]: (8, 1, 32, 128, 128) float32, batch["labels"]: (8, 1, 32, 128, 128) uint64
            # arrays taken from a batch stay valid while you hold them; their memory is reused after
"""
from ._version import __version__
from .augment import Augmentation, Intensity, Mirror, Transpose
from .dataset import Dataset, Sample
from .defects import Artifacts, LowContrast, MissingSection, Slip
from .intensity import Blur, Contrast, Gamma, Noise
from .loader import Batch, BatchReleasedError, Loader
from .pool import BackPressureWarning, SlotsExhaustedError
from .profile import ProfileReport
from .sampling import Balanced, Masked, Tiled, Uniform
from .targets import Affinities, Boundaries, Classes, Foreground, compute_targets
from .transfer import DeviceArray, DeviceNotice
from .volumes import DatasetNotFoundError, Volume, hdf5
from .warp import Elastic, Rotate, Scale


__all__ = [
    "Affinities",
    "Artifacts",
    "Augmentation",
    "BackPressureWarning",
    "Balanced",
    "Batch",
    "BatchReleasedError",
    "Blur",
    "Boundaries",
    "Classes",
    "Contrast",
    "Dataset",
    "DatasetNotFoundError",
    "DeviceArray",
    "DeviceNotice",
    "Elastic",
    "Foreground",
    "Gamma",
    "Intensity",
    "Loader",
    "LowContrast",
    "Masked",
    "Mirror",
    "MissingSection",
    "Noise",
    "ProfileReport",
    "Rotate",
    "Sample",
    "Scale",
    "Slip",
    "SlotsExhaustedError",
    "Tiled",
    "Transpose",
    "Uniform",
    "Volume",
    "compute_targets",
    "hdf5",
]
