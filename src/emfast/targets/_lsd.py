"""Local shape descriptors (Sheridan et al., the ``lsds`` package's definition) at a voxel size in world units.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .._checks import refusal
from .._checks import triple as _triple
from .._core import targets as _targets
from .._registry import register
from ._base import Margin, Target, _check_id, _check_label_dtype, _check_name


def _check_voxel_size(value, what: str) -> Tuple[float, float, float]:
    """Three finite numbers > 0 (z, y, x) in world units; a single number means the same along each axis."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        value = (value,) * 3
    return _triple(value, what, integer=False, minimum=0, strict=True)


@register("target")
@dataclass
class LSD(Target):
    """Local shape descriptors (Sheridan et al., Nature Methods 2023): ten float32 channels (six in plane)
    describing, around each voxel, the shape of the object it belongs to, with a mask of the voxels whose
    descriptor is defined.

    The gaussian mode of funkelab's ``lsds`` package (``get_local_shape_descriptors``), in its channel order and
    value range: each object (the voxels of one id) is weighted by a gaussian of standard deviation ``sigma``
    (world units) around the voxel, truncated at 3 sigma, and

    ========  ===========================================================================================
    0, 1, 2   mean offset (z, y, x) from the voxel to the object's weighted centre, / sigma / 2 + 1/2
    3, 4, 5   variance (z, y, x) of the object's weighted positions, / sigma**2 (floored at 1e-3 units**2)
    6, 7, 8   pearson correlation (zy, zx, yx) of those positions, / 2 + 1/2
    9         size: the share of the gaussian's weight that the object holds
    ========  ===========================================================================================

    every channel clipped to [0, 1], 0 on ``background`` and ``ignore`` voxels. Label voxels outside the patch
    belong to no object (lsds' zero padding), so values agree with ``lsds`` run on the label patch. Differences
    from ``lsds``: moments are taken about each voxel in float32/float64 rather than from absolute coordinates in
    float32, so where an object is one voxel thick along an axis (variance near 0) the pearson channels are exact
    here and rounding noise there (in plane too); ``downsample`` and the ``sphere`` mode are not offered;
    ``background`` and ``ignore`` may be any ids (lsds: 0 only); voxel sizes are taken as given (lsds rounds them
    down to integers, so they agree for integer voxel sizes).

    The mask (field ``name + "_mask"``, one uint8 channel, broadcast over the channels) is 0 on ``background`` and
    ``ignore`` voxels, on voxels whose gaussian reaches past the label patch (their descriptor depends on labels
    the patch does not hold, as at the border of :func:`compute_targets` with a margin below :meth:`margin`),
    and inside a loader on voxels whose gaussian reaches an unknown label (moved in by a warp); else 1.

    Inside a loader, sigma is converted with raw's resolution along (z, y, x); a ``Transpose`` of y and x on data
    whose y and x resolutions differ swaps the labels' axes but not sigma's (as it distorts raw).

    Parameters
    ----------
    sigma : float or (float, float, float)
        Standard deviation of the gaussian (z, y, x) in world units (nm, like the voxel size), at least the
        voxel size along each axis; lsds' ``sigma``. One number means the same along each axis.
    voxel_size : (float, float, float), optional
        World units per voxel (z, y, x). Inside a :class:`~emfast.Loader` it comes from raw's resolution (and
        must match it if given); :func:`compute_targets` on bare arrays needs it.
    background : int or None
        Label id without a descriptor (lsds: 0); None for none.
    ignore : int or None
        Label id of unlabelled voxels: no descriptor, masked; the objects around them are described as if those
        voxels were not theirs. None for none.
    name : str
        Field name of the descriptors; the mask is ``name + "_mask"``.
    in_plane : bool
        Describe each section on its own, as lsds describes a 2-D segmentation (for networks predicting 2-D
        descriptors of anisotropic EM): six channels, mean offset (y, x), variance (y, x), pearson (yx) and size,
        lsds' 2-D order (channels 1, 2, 4, 5, 8 and 9 of the ten); only sigma's y and x are used (give them alone,
        ``sigma=(y, x)``, or a z value that is ignored), and the labels need no margin along z.
    """

    sigma: Optional[Union[float, Sequence[float]]] = None
    voxel_size: Optional[Union[float, Sequence[float]]] = None
    background: Optional[int] = 0
    ignore: Optional[int] = None
    name: str = "lsd"
    in_plane: bool = False
    kind: ClassVar[str] = "lsd"

    def __post_init__(self) -> None:
        owner = "LSD"
        if self.sigma is None:
            raise refusal(f"{owner}: sigma is required: the gaussian's standard deviation (z, y, x) in world "
                          "units, e.g. LSD(sigma=(80, 80, 80)) for 80 nm", "sigma")
        if not isinstance(self.in_plane, (bool, np.bool_)):
            raise refusal(f"{owner}: in_plane must be True or False, got {self.in_plane!r}", "in_plane")
        self.in_plane = bool(self.in_plane)
        if self.in_plane and isinstance(self.sigma, (Sequence, np.ndarray)) and len(self.sigma) == 2:
            self.sigma = (self.sigma[0],) + tuple(self.sigma)  # (y, x): z is unused in plane
        self.sigma = _check_voxel_size(self.sigma, f"{owner}: sigma")
        if self.voxel_size is not None:
            self.voxel_size = _check_voxel_size(self.voxel_size, f"{owner}: voxel_size")
            self._check_sigma_covers_voxels(self.voxel_size, "voxel size")
        self.background = _check_id(self.background, "background", owner, optional=True)
        self.ignore = _check_id(self.ignore, "ignore", owner, optional=True)
        self.name = _check_name(self.name, owner)

    def _check_sigma_covers_voxels(self, voxel_size: Tuple[float, float, float], what: str) -> None:
        """A gaussian narrower than a voxel sees only the voxel itself: refuse it, naming the axis and numbers."""
        for axis, (sigma, voxel) in enumerate(zip(self.sigma, voxel_size)):
            if sigma < voxel and not (self.in_plane and axis == 0):
                raise ValueError(f"LSD: sigma {self.sigma} is below the {what} {voxel_size} along {'zyx'[axis]} "
                                 f"({sigma:g} < {voxel:g}); sigma must be at least one voxel along each axis")

    @property
    def channels(self) -> int:
        return _targets.LSD_PLANAR_CHANNELS if self.in_plane else _targets.LSD_CHANNELS

    @property
    def mask_name(self) -> str:
        return self.name + "_mask"

    def with_voxel_size(self, voxel_size, source: str) -> "LSD":
        """A copy for labels of ``voxel_size`` (raw's resolution, from ``source``); itself where its own
        ``voxel_size`` already says so."""
        if voxel_size is None:
            if self.voxel_size is None:
                raise ValueError(f"LSD: {source} states no voxel size (resolution); give LSD(voxel_size=(z, y, x)) "
                                 "in the units of sigma")
            return self
        voxel_size = _check_voxel_size(voxel_size, f"LSD: resolution of {source}")
        if self.voxel_size is not None:
            if not np.allclose(self.voxel_size, voxel_size):
                raise ValueError(f"LSD: voxel_size {self.voxel_size} does not match the resolution {voxel_size} of "
                                 f"{source}; one LSD target serves one voxel size")
            return self
        self._check_sigma_covers_voxels(voxel_size, f"resolution of {source}")
        return dataclasses.replace(self, voxel_size=voxel_size)

    def _voxel_size(self) -> Tuple[float, float, float]:
        if self.voxel_size is None:
            raise ValueError("LSD: the voxel size is unknown: give LSD(voxel_size=(z, y, x)) to compute it on bare "
                             "arrays (a Loader takes it from raw's resolution)")
        return self.voxel_size

    def sigma_voxels(self) -> Tuple[float, float, float]:
        """Sigma in voxels along (z, y, x)."""
        return tuple(s / v for s, v in zip(self.sigma, self._voxel_size()))

    def margin(self) -> Margin:
        """The gaussian's reach in voxels, int(3 sigma + 0.5) per axis (scipy's truncation, which lsds uses); none
        along z in plane."""
        reach = _targets.lsd_radius(self.sigma_voxels())
        return (0,) + reach[1:] if self.in_plane else reach

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (self.channels, np.dtype(np.float32)), self.mask_name: (1, np.dtype(np.uint8))}

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background, "ignore": self.ignore}, "LSD")

    def compute(self, labels, margin, out) -> None:
        descriptors, mask = self._arrays(out)
        # lsds floors variances at 1e-3 world units squared; the kernel works in units of sigma.
        floor = tuple(1e-3 / (s * s) for s in self.sigma)  # s ** 2 of a sigma of 1e200 raised OverflowError
        _targets.lsd(labels, margin, self.sigma_voxels(), floor, self.background, self.ignore, descriptors, mask,
                     self.in_plane)
        reach = self.margin()
        for axis in range(3):  # voxels whose gaussian leaves the patch: their descriptor is not fully known
            cut = max(0, reach[axis] - int(margin[axis]))
            if cut:
                _along(mask, axis, slice(0, cut))[...] = 0
                _along(mask, axis, slice(mask.shape[2 + axis] - cut, None))[...] = 0

    def mask_unknown(self, valid: np.ndarray, margin: Sequence[int], out: Dict[str, np.ndarray]) -> None:
        """Mask every descriptor whose gaussian reaches an unknown label voxel."""
        reach = self.margin()
        unknown = _box_any(valid[:, 0] == 0, reach)
        m = margin
        inner = unknown[:, m[0]:valid.shape[2] - m[0], m[1]:valid.shape[3] - m[1], m[2]:valid.shape[4] - m[2]]
        mask = out[self.mask_name][:, 0]
        mask[inner] = 0


def _along(array: np.ndarray, axis: int, part: slice) -> np.ndarray:
    """The view of a (B, C, Z, Y, X) array restricted to ``part`` along spatial ``axis`` (0, 1, 2 = z, y, x)."""
    index = [slice(None)] * array.ndim
    index[2 + axis] = part
    return array[tuple(index)]


def _box_any(flags: np.ndarray, reach: Sequence[int]) -> np.ndarray:
    """Where any of ``flags`` (B, Z, Y, X) bool lies within ``reach`` voxels along each axis (a box, as the
    separable gaussian's support is): a running count along each axis in turn."""
    counts = flags.astype(np.int64)
    for axis, r in enumerate(reach):
        axis += 1
        extent = counts.shape[axis]
        total = np.cumsum(counts, axis=axis)
        padded = np.concatenate([np.zeros_like(np.take(total, [0], axis=axis)), total], axis=axis)
        hi = np.minimum(np.arange(extent) + r + 1, extent)
        lo = np.maximum(np.arange(extent) - r, 0)
        counts = np.take(padded, hi, axis=axis) - np.take(padded, lo, axis=axis)
    return counts > 0


