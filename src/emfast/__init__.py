"""emfast: fast 3-D patch loading and augmentation from electron-microscopy volumes for deep learning.

The package is laid out by pipeline stage, and imports run one way, down this list: ``cli`` and ``bench``;
``config``; ``inference`` (whole-volume prediction, ``predict``); ``pipeline`` (plans, gather, ring, pool, copier, Loader);
``transfer`` (device backends); ``augment``, ``targets``, ``sampling``; ``io`` (volumes); and the shared base, ``_core`` (the compiled kernels),
``_registry``, ``_checks``, ``_machine``. This module is the public API: every name in ``__all__``.

Quick start::

    import emfast as ef
    raw = ef.hdf5("sample.h5", "volumes/raw")
    labels = ef.hdf5("sample.h5", "volumes/labels/neuron_ids")
    with ef.Loader(raw, labels, patch=(32, 128, 128), batch_size=8, threads=2, epoch_size=1000) as loader:
        for batch in loader:
            ...  # batch["raw"]: (8, 1, 32, 128, 128) float32, batch["labels"]: (8, 1, 32, 128, 128) uint64
            # arrays taken from a batch stay valid while you hold them; their memory is reused after
"""
from ._version import __version__ as __version__
from .augment import (Artifacts, Augmentation, Blur, Contrast, Elastic, Gamma, GrowBoundary, Intensity, LowContrast,
                      Mirror, MissingSection, Noise, Rotate, Scale, Slip, Transpose)
from .io import (CorruptChunkError, DatasetNotFoundError, InputChangedError, RemoteReadError, StoreMetadataError,
                 UnfinishedOutputWarning, Volume, VolumeTooLargeError, hdf5)
from .io import open_volume as open
from .inference import (BlockWriteError, DaskRunLostError, InputDtypeError, ModelOutputError, NonFiniteWarning,
                        OutputExistsError, Prediction, PredictProgress, SaturationWarning, TrainingModeWarning,
                        UnfinishedInputError, predict)
from .pipeline import (BackPressureWarning, Batch, BatchReleasedError, InsufficientMemoryError, Loader,
                       MissingFieldError, ProfileReport, SlotsExhaustedError)
from .sampling import Balanced, Dataset, Masked, Sample, Tiled, Uniform
from .targets import LSD, Affinities, Boundaries, ClassWeights, Classes, Foreground, compute_targets
from .transfer import DeviceArray, DeviceNotice

__all__ = [
    "Affinities",
    "Artifacts",
    "Augmentation",
    "BackPressureWarning",
    "Balanced",
    "Batch",
    "BatchReleasedError",
    "BlockWriteError",
    "Blur",
    "Boundaries",
    "ClassWeights",
    "Classes",
    "Contrast",
    "CorruptChunkError",
    "DaskRunLostError",
    "Dataset",
    "DatasetNotFoundError",
    "DeviceArray",
    "DeviceNotice",
    "Elastic",
    "Foreground",
    "Gamma",
    "GrowBoundary",
    "InputChangedError",
    "InputDtypeError",
    "InsufficientMemoryError",
    "Intensity",
    "LSD",
    "Loader",
    "LowContrast",
    "Masked",
    "Mirror",
    "MissingFieldError",
    "MissingSection",
    "ModelOutputError",
    "Noise",
    "NonFiniteWarning",
    "OutputExistsError",
    "PredictProgress",
    "Prediction",
    "ProfileReport",
    "RemoteReadError",
    "Rotate",
    "Sample",
    "SaturationWarning",
    "Scale",
    "Slip",
    "SlotsExhaustedError",
    "StoreMetadataError",
    "Tiled",
    "TrainingModeWarning",
    "Transpose",
    "UnfinishedInputError",
    "UnfinishedOutputWarning",
    "Uniform",
    "Volume",
    "VolumeTooLargeError",
    "compute_targets",
    "hdf5",
    "open",
    "predict",
]
