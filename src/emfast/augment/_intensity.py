"""Per-example intensity augmentations of raw: :class:`Intensity` folds into the gather kernel's scale and shift;
gamma, contrast around the window's mean, Gaussian noise and Gaussian blur cannot, and change the cropped batch.

Each of the latter is a pixel-wise :class:`~emfast.augment.Augmentation`: :meth:`apply` turns the batch's uniforms into a
:class:`Draws` record during planning (whether each example is augmented, with probability ``p``, and its
parameter), and :meth:`process` changes the cropped raw batch in place according to that record, with the
compiled kernels of :mod:`emfast._core.intensity` (GIL released). Only real examples (``patches.valid``) whose draw
fired are touched; labels never change. Raw is float32 or float16 (float16 is processed in float32 and rounded
back to nearest even).

Example::

    augment = [ef.Mirror(), ef.Transpose(), Gamma(), Contrast(), Noise(sigma=(0, 0.05)), Blur(p=0.2)]
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence, Tuple

import numpy as np

from .._core import intensity as _intensity
from .._checks import refusal
from .._core.common import FLOAT_DTYPES
from .._registry import register
from ._base import Augmentation, Params, Patches, Windows, _check_probability

Range = Tuple[float, float]


@register("augmentation")
@dataclass
class Intensity(Augmentation):
    """Per-example random contrast and brightness of raw: ``x * a + b`` after normalisation.

    Parameters
    ----------
    scale : float
        ``a`` is drawn uniformly from ``[1 - scale, 1 + scale]``; must be in [0, 1).
    shift : float
        ``b`` is drawn uniformly from ``[-shift, shift]``; must be >= 0.
    """

    scale: float = 0.1
    shift: float = 0.1
    name: ClassVar[str] = "intensity"
    draws: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if not isinstance(self.scale, numbers.Real) or not 0.0 <= self.scale < 1.0:
            raise refusal(f"Intensity: scale must be in [0, 1), got {self.scale!r}", "scale")
        if not isinstance(self.shift, numbers.Real) or not 0.0 <= self.shift < float("inf"):
            raise refusal(f"Intensity: shift must be a finite number >= 0, got {self.shift!r}", "shift")

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        a = 1.0 + self.scale * (2.0 * uniforms[:, 0] - 1.0)
        b = self.shift * (2.0 * uniforms[:, 1] - 1.0)
        params.gain *= a
        params.bias = params.bias * a + b


@dataclass(frozen=True)
class Draws:
    """What a per-example pixel-wise augmentation drew for one batch (returned by ``apply``).

    Attributes
    ----------
    fired : ndarray, (B,) bool
        Examples to augment.
    value : ndarray, (B,) float64
        The drawn parameter of each example (gamma, contrast factor or sigma).
    keys : ndarray, (B,) uint64, or None
        Philox keys of the per-voxel noise (:class:`Noise` only).
    """

    fired: np.ndarray
    value: np.ndarray
    keys: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.fired)


def check_range(value, what: str, owner: str, low: float = -np.inf, high: float = np.inf) -> Range:
    """``value`` as a (lo, hi) pair of finite floats with low <= lo <= hi <= high, or a ValueError naming it."""
    try:
        pair = tuple(value)
    except TypeError:
        pair = ()
    if (len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in pair)
            or not all(np.isfinite(float(v)) for v in pair)):
        raise refusal(f"{owner}: {what} must be a (low, high) pair of finite numbers, got {value!r}", what)
    lo, hi = float(pair[0]), float(pair[1])
    if not low <= lo <= hi <= high:
        raise refusal(f"{owner}: {what} must satisfy {low} <= low <= high <= {high}, got {value!r}", what)
    return lo, hi


def keys_from_uniforms(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """64-bit Philox keys from two uniforms in [0, 1) per example: the top 32 bits of each, concatenated."""
    high = np.floor(np.asarray(first) * 2.0**32).astype(np.uint64)
    low = np.floor(np.asarray(second) * 2.0**32).astype(np.uint64)
    return (high << np.uint64(32)) | low


def checked_raw(patches: Patches, owner: str) -> np.ndarray:
    """The raw batch of ``patches`` after checking what the kernels need, with a clear error otherwise."""
    raw = patches.raw
    if not isinstance(raw, np.ndarray):
        raise TypeError(f"{owner}: patches.raw must be a NumPy array, got {type(raw).__name__}")
    if raw.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{owner}: patches.raw has dtype {raw.dtype}; supported: float32, float16")
    if raw.ndim != 5:
        raise ValueError(f"{owner}: patches.raw must have shape (B, C, Z, Y, X), got {raw.shape}")
    if not raw.flags.c_contiguous or not raw.flags.writeable:
        raise ValueError(f"{owner}: patches.raw must be a writeable C-contiguous array")
    valid = patches.valid
    if isinstance(valid, bool) or not isinstance(valid, numbers.Integral) or not 0 <= valid <= raw.shape[0]:
        raise ValueError(f"{owner}: patches.valid must be an integer in [0, {raw.shape[0]}], got {valid!r}")
    return raw


def check_record(record, kind: type, batch: int, owner: str):
    """``record`` if it is a ``kind`` record drawn for a batch of ``batch`` examples."""
    if not isinstance(record, kind):
        raise TypeError(f"{owner}: record must be the {kind.__name__} returned by apply(), got {record!r}")
    if len(record) != batch:
        raise ValueError(f"{owner}: record was drawn for {len(record)} examples, the batch has {batch}")
    return record


class _PerExample(Augmentation):
    """Per-example augmentation with probability ``p`` and one parameter drawn uniformly from an interval.

    ``_PARAMETER`` names the field holding the interval (>= 0; > 0 with ``_POSITIVE``); ``_KERNEL`` names the
    :mod:`emfast._core.intensity` kernel that applies one value per example, unless ``_run`` is overridden.
    """

    draws: ClassVar[int] = 2
    pixelwise: ClassVar[bool] = True
    _PARAMETER: ClassVar[str] = "range"
    _POSITIVE: ClassVar[bool] = False
    _KERNEL: ClassVar[str]
    _range: Range

    def __post_init__(self) -> None:
        owner, interval = type(self).__name__, getattr(self, self._PARAMETER)
        self._range = check_range(interval, self._PARAMETER, owner, 0.0)
        if self._POSITIVE and self._range[0] <= 0:
            raise refusal(f"{owner}: {self._PARAMETER} must be > 0, got {interval!r}", self._PARAMETER)
        self.p = _check_probability(self.p, owner)

    def apply(self, uniforms: np.ndarray, params: Params) -> Draws:
        lo, hi = self._range
        return Draws(fired=uniforms[:, 0] < self.p, value=lo + (hi - lo) * uniforms[:, 1])

    def process(self, record: Draws, patches: Patches) -> None:
        owner = type(self).__name__
        raw = checked_raw(patches, owner)
        record = check_record(record, Draws, raw.shape[0], owner)
        examples = np.flatnonzero(record.fired[:patches.valid])
        if examples.size:
            self._run(raw, examples, record)

    def _run(self, raw: np.ndarray, examples: np.ndarray, record: Draws) -> None:
        getattr(_intensity, self._KERNEL)(raw, examples, raw[0].size, record.value[examples])


@register("augmentation")
@dataclass
class Gamma(_PerExample):
    """Gamma correction ``x -> x ** gamma`` per example, gamma drawn uniformly from ``range``.

    Meant for raw normalised to [0, 1]. It is sign-safe: it maps ``x`` to ``sign(x) * |x| ** gamma``, so values
    in [-1, 0) (raw normalised to [-1, 1]) are mirrored around 0 and nothing becomes NaN; values above 1 grow
    for gamma > 1. Computed in float32 (C library ``powf``).

    Parameters
    ----------
    range : (float, float)
        Interval of gamma, both > 0.
    p : float
        Probability of augmenting an example.
    """

    range: Sequence[float] = (0.7, 1.5)
    p: float = 0.5
    name: ClassVar[str] = "gamma"
    _POSITIVE: ClassVar[bool] = True
    _KERNEL: ClassVar[str] = "gamma"


@register("augmentation")
@dataclass
class Contrast(_PerExample):
    """Contrast around the window's mean: ``x -> (x - m) * c + m`` per example, c drawn uniformly from
    ``range``, m the mean of the example's whole window (all channels), in float32.

    Parameters
    ----------
    range : (float, float)
        Interval of the factor c, >= 0 (below 1 lowers contrast, above 1 raises it).
    p : float
        Probability of augmenting an example.
    """

    range: Sequence[float] = (0.75, 1.25)
    p: float = 0.5
    name: ClassVar[str] = "contrast"
    _KERNEL: ClassVar[str] = "contrast"


@register("augmentation")
@dataclass
class Noise(_PerExample):
    """Additive Gaussian noise ``x -> x + sigma * g`` per voxel, sigma drawn per example from ``sigma``.

    ``g`` are standard normal draws computed in the kernel from a 64-bit Philox key made of two of the example's
    uniforms (Box-Muller), so the noise depends only on (seed, epoch, batch, example), not on threads.

    Parameters
    ----------
    sigma : (float, float)
        Interval of the standard deviation, >= 0, in normalised raw units.
    p : float
        Probability of augmenting an example.
    """

    sigma: Sequence[float] = (0.0, 0.1)
    p: float = 0.5
    name: ClassVar[str] = "noise"
    draws: ClassVar[int] = 4
    _PARAMETER: ClassVar[str] = "sigma"

    def apply(self, uniforms: np.ndarray, params: Params) -> Draws:
        drawn = super().apply(uniforms, params)
        return Draws(fired=drawn.fired, value=drawn.value, keys=keys_from_uniforms(uniforms[:, 2], uniforms[:, 3]))

    def _run(self, raw, examples, record):
        if record.keys is None:
            raise ValueError("Noise: record has no keys; use the record returned by Noise.apply()")
        _intensity.noise(raw, examples, raw[0].size, record.value[examples], record.keys[examples])


@register("augmentation")
@dataclass
class Blur(_PerExample):
    """Gaussian blur per example, sigma (voxels) drawn from ``sigma``, in each z-section or in 3-D.

    Separable, truncated at 3 sigma (radius ``int(3 sigma + 0.5)``; below sigma = 1/6 nothing changes), edges
    mirrored about the outer voxel faces: the result equals ``scipy.ndimage.gaussian_filter(x, s, mode="reflect",
    truncate=3.0)`` per channel up to float32 rounding, with ``s = (0, sigma, sigma)`` in-plane or ``(sigma,)*3``.

    Parameters
    ----------
    sigma : (float, float)
        Interval of the standard deviation in voxels, >= 0; a loader refuses one whose kernel (3 sigma) reaches
        beyond four times the raw window's longest blurred side.
    p : float
        Probability of augmenting an example.
    per_section : bool
        Blur each z-section in 2-D (the default: sections of anisotropic EM are imaged one by one) or the whole
        window in 3-D with the same sigma along z.
    """

    sigma: Sequence[float] = (0.0, 1.5)
    p: float = 0.5
    per_section: bool = True
    name: ClassVar[str] = "blur"
    _PARAMETER: ClassVar[str] = "sigma"

    #: Kernel radius in standard deviations.
    TRUNCATE: ClassVar[float] = 3.0
    #: The longest kernel radius a loader accepts, in longest sides of the raw window.
    REACH_PER_SIDE: ClassVar[int] = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.per_section, (bool, np.bool_)):
            raise refusal(f"Blur: per_section must be True or False, got {self.per_section!r}", "per_section")

    def bind_windows(self, windows: Windows) -> None:
        """Refuse a sigma whose kernel reaches beyond :data:`REACH_PER_SIDE` times the raw window's longest blurred
        side: it would average the window's mirror images over and over, at a cost that grows with sigma (a sigma
        of 1e18 aborted the process)."""
        extents = windows.raw_section if self.per_section else (windows.raw_sections, *windows.raw_section)
        most = self.REACH_PER_SIDE * max(extents)
        high = float(self.sigma[1])
        reach = self.TRUNCATE * high + 0.5  # a float: 3 x 1e308 is infinite, and int() of it raised OverflowError
        if reach >= most + 1:  # int(reach) > most
            plane = "section" if self.per_section else "window"
            raise refusal(f"Blur: sigma up to {high:g} voxels reaches {int(reach) if reach < 1e15 else reach:g} "
                          f"voxels (3 sigma), more than "
                          f"{self.REACH_PER_SIDE} times the longest side of the raw {plane} {tuple(extents)}: it "
                          f"would average the {plane}'s mirror images over and over; give a sigma below "
                          f"{(most + 0.5) / self.TRUNCATE:.6g}", "sigma")

    def _run(self, raw, examples, record):
        channels = raw.shape[1]
        volumes = (examples[:, None] * channels + np.arange(channels)).ravel()
        sigmas = np.repeat(record.value[examples], channels)
        _intensity.blur(raw, volumes, raw.shape[2:], sigmas, bool(self.per_section), self.TRUNCATE)
