"""Normalisation of raw and extra channels: the (scale, shift) per volume that the kernels apply while converting,
from a default per dtype, a given pair, a mean and std, or per-volume statistics (cached, see
:mod:`emfast.io._stats`). The per-example intensity augmentation composes with it in the gatherer."""
from __future__ import annotations

from typing import Optional

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
    if not (np.isfinite(statistics.mean) and np.isfinite(statistics.std)):
        raise ValueError(f"{volume.name}: its mean and standard deviation overflow float64 (mean {statistics.mean}, "
                         f"std {statistics.std}; values up to {statistics.max:g}), so it cannot be standardised; "
                         "pass normalize=(scale, shift)")
    if not statistics.std > 0:
        why = ("constant volume (std 0)" if not statistics.max > statistics.min else
               f"its values (from {statistics.min:g} to {statistics.max:g}) differ too little for a standard "
               "deviation (it underflows to 0)")
        raise ValueError(f"{volume.name}: {why}, so it cannot be standardised; pass normalize=(scale, shift)")
    return 1.0 / statistics.std, -statistics.mean / statistics.std


def _min_max(volume: Volume) -> tuple:
    statistics = volume_statistics(volume)
    if not statistics.max > statistics.min:
        raise ValueError(f"{volume.name}: constant volume (min = max) cannot be min/max scaled; pass "
                         "normalize=(scale, shift)")
    span = statistics.max - statistics.min
    if not np.isfinite(span):
        raise ValueError(f"{volume.name}: its range ({statistics.min:g} to {statistics.max:g}) overflows float64, so "
                         "it cannot be min/max scaled; pass normalize=(scale, shift)")
    return 1.0 / span, -statistics.min / span


def _fits_float32(pair: tuple, normalize, volume: Optional[Volume] = None) -> tuple:
    """``pair`` if the kernels, which compute ``float32(x) * float32(scale) + float32(shift)``, can apply it: a
    scale or shift beyond float32's range (a std of 1e-45, a scale of 1e300, subnormal data standardised) made
    every value infinite or NaN, silently, where float64 had checked them finite. ``volume``: the one whose
    statistics gave the pair."""
    scale, shift = pair
    with np.errstate(over="ignore", under="ignore"):
        scale32, shift32 = np.float32(scale), np.float32(shift)
    if not (np.isfinite(scale32) and np.isfinite(shift32)) or (scale != 0 and scale32 == 0):
        raise ValueError(f"{'' if volume is None else volume.name + ': '}normalize={normalize!r} gives (scale, shift) "
                         f"= ({scale:g}, {shift:g}), beyond float32, in which the kernels normalise: every value "
                         "would be infinite, NaN or 0; scale the data first, or pass a (scale, shift) float32 holds")
    return pair


#: Per-volume normalisation modes: to zero mean and unit variance, or min/max to [0, 1], from statistics
#: computed once per volume and cached (see :mod:`emfast.io._stats`).
NORMALIZE_MODES = {"volume": _standardize, "minmax": _min_max}


def kernel_shift(shift):
    """``shift`` (a float or float32 array) for the kernels, which compute ``x * scale + shift``: +0.0 as -0.0,
    since x + (-0.0) is x for every x where x + 0.0 turns -0.0 into +0.0 (an identity network's output then
    differed from its float input in the sign of its zeros)."""
    if isinstance(shift, np.ndarray):
        return np.where(shift == 0, np.float32(-0.0), shift).astype(shift.dtype)
    return -0.0 if shift == 0 else shift


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
    """(scale, shift) mapping ``volume``'s values to the network's input range, both within float32."""
    if normalize is None:
        return DEFAULT_NORMALIZATION[volume.dtype]
    if isinstance(normalize, str):
        if normalize not in NORMALIZE_MODES:
            raise ValueError(f"normalize must be one of {sorted(NORMALIZE_MODES)}, (scale, shift), or "
                             f"{{'mean': ..., 'std': ...}}; got {normalize!r}")
        return _fits_float32(NORMALIZE_MODES[normalize](volume), normalize, volume)
    return fixed_normalization(normalize)


def fixed_normalization(normalize) -> tuple:
    """(scale, shift) of a ``normalize`` that needs no data, (scale, shift) or {"mean": m, "std": s}, checked as
    the kernels apply it (a config's check asks this before any volume is read): ValueError naming it."""
    if isinstance(normalize, dict):
        unknown = sorted(set(normalize) - {"mean", "std"})
        if unknown or set(normalize) != {"mean", "std"}:
            raise ValueError(f"normalize as a dict needs exactly the keys 'mean' and 'std', got {sorted(normalize)}")
        mean, std = _pair((normalize["mean"], normalize["std"]))
        if std <= 0:
            raise ValueError(f"normalize: std must be positive, got {std}")
        return _fits_float32((1.0 / std, -mean / std), normalize)
    return _fits_float32(_pair(normalize), normalize)
