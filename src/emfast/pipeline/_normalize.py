"""Normalisation of raw and extra channels: the (scale, shift) per volume that the kernels apply while converting,
from a default per dtype, a given pair, a mean and std, or per-volume statistics (cached, see
:mod:`emfast.io._stats`). The per-example intensity augmentation composes with it in the gatherer."""
from __future__ import annotations

import numpy as np

from ..io import Volume, volume_statistics

#: Default normalisation (scale, shift) per raw dtype: integers from their dtype's range to [0, 1]
#: ((x - min) / (max - min), so int8 -128 -> 0 and 127 -> 1), floats unchanged. The kernels compute
#: float32(x) * scale + shift: uint32 values above 2**24 and float64 values lose their low bits in float32, and
#: float64 values beyond float32's range become infinity.
DEFAULT_NORMALIZATION = {
    np.dtype(np.uint8): (1.0 / 255.0, 0.0),
    np.dtype(np.uint16): (1.0 / 65535.0, 0.0),
    np.dtype(np.float32): (1.0, 0.0),
    np.dtype(np.int8): (1.0 / 255.0, 128.0 / 255.0),
    np.dtype(np.int16): (1.0 / 65535.0, 32768.0 / 65535.0),
    np.dtype(np.uint32): (1.0 / 4294967295.0, 0.0),
    np.dtype(np.float16): (1.0, 0.0),
    np.dtype(np.float64): (1.0, 0.0),
}


def _standardize(volume: Volume) -> tuple:
    statistics = volume_statistics(volume)
    if not statistics.std > 0:
        raise ValueError(f"{volume.name}: constant volume (std 0) cannot be standardised; pass normalize=(scale, "
                         "shift)")
    return 1.0 / statistics.std, -statistics.mean / statistics.std


def _min_max(volume: Volume) -> tuple:
    statistics = volume_statistics(volume)
    if not statistics.max > statistics.min:
        raise ValueError(f"{volume.name}: constant volume (min = max) cannot be min/max scaled; pass "
                         "normalize=(scale, shift)")
    return 1.0 / (statistics.max - statistics.min), -statistics.min / (statistics.max - statistics.min)


#: Per-volume normalisation modes: to zero mean and unit variance, or min/max to [0, 1], from statistics
#: computed once per volume and cached (see :mod:`emfast.io._stats`).
NORMALIZE_MODES = {"volume": _standardize, "minmax": _min_max}


def _pair(value) -> tuple:
    """(scale, shift) as two finite floats."""
    try:
        pair = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or not all(np.isfinite(pair)):
        raise ValueError(f"normalize must be (scale, shift), two finite numbers, got {value!r}")
    return pair


def normalization(volume: Volume, normalize) -> tuple:
    """(scale, shift) mapping ``volume``'s values to the network's input range."""
    if normalize is None:
        return DEFAULT_NORMALIZATION[volume.dtype]
    if isinstance(normalize, dict):
        unknown = sorted(set(normalize) - {"mean", "std"})
        if unknown or set(normalize) != {"mean", "std"}:
            raise ValueError(f"normalize as a dict needs exactly the keys 'mean' and 'std', got {sorted(normalize)}")
        mean, std = _pair((normalize["mean"], normalize["std"]))
        if std <= 0:
            raise ValueError(f"normalize: std must be positive, got {std}")
        return 1.0 / std, -mean / std
    if isinstance(normalize, str):
        if normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be one of {sorted(NORMALIZE_MODES)}, (scale, shift), or "
                             f"{{'mean': ..., 'std': ...}}; got {normalize!r}")
        return NORMALIZE_MODES[normalize](volume)
    return _pair(normalize)
