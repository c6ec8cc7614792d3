"""Warp augmentations: :class:`Rotate`, :class:`Scale` and :class:`Elastic` compose into
:class:`~emfast.augment.Params` ``matrix`` and ``elastic``; the loader samples examples they moved through the warp
kernels (:mod:`emfast.augment._resample`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional, Sequence

import numpy as np

from .._checks import real, refusal, triple
from .._registry import register
from ._base import Augmentation, Params, Windows, _check_probability, _parse_axes, _require_isotropic
from ._geometry import grid_shape

#: The largest zoom ``Scale`` draws (and its inverse the smallest): beyond, a window is no augmented example, and the
#: warp kernel's matrices (at most 1024 in magnitude) would overflow.
MAX_ZOOM = 64.0
#: The largest control-point jitter of ``Elastic``, in voxels: beyond, the warp kernel's coordinates would overflow.
MAX_SIGMA = 4096.0


def _rotation(axis: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """(B, 3, 3) rotations by ``angle`` (radians) about unit vectors ``axis`` (B, 3), Rodrigues' formula."""
    k = np.zeros((len(axis), 3, 3))
    k[:, 0, 1], k[:, 0, 2], k[:, 1, 2] = -axis[:, 2], axis[:, 1], -axis[:, 0]
    k -= k.transpose(0, 2, 1)
    s, c = np.sin(angle)[:, None, None], np.cos(angle)[:, None, None]
    return np.eye(3) + s * k + (1.0 - c) * (k @ k)


class _Warp(Augmentation):
    """What the warps share: they resample off the voxel grid and can bring in voxels from outside the data."""

    moves_voxels: ClassVar[bool] = True
    unknown_voxels: ClassVar[bool] = True


@register("augmentation")
@dataclass
class Rotate(_Warp):
    """Rotate each example, with probability ``p``, by an angle drawn uniformly from ``[-angle, angle]`` degrees.

    Parameters
    ----------
    angle : float
        Largest rotation in degrees, in [0, 180].
    axes : str
        The output axes spanning the rotation: two letters rotate in that plane (``"yx"``, the default, rotates
        about z and is safe for anisotropic EM); ``"zyx"`` rotates about an axis drawn uniformly on the sphere
        (isotropic data only, as is any pair including z).
    p : float
        Probability of rotating an example.
    """

    angle: float = 180.0
    axes: str = "yx"
    p: float = 1.0
    name: ClassVar[str] = "rotate"
    draws: ClassVar[int] = 4  # apply?, angle, and the axis direction (two) for 3-D rotations

    def __post_init__(self) -> None:
        self._axes = _parse_axes(self.axes, "Rotate")
        if len(self._axes) < 2:
            raise refusal(f"Rotate: axes must name two or three axes, got {self.axes!r}", "axes")
        self.angle = real(self.angle, "Rotate: angle", 0.0)
        if self.angle > 180.0:
            raise refusal(f"Rotate: angle must be in [0, 180] degrees, got {self.angle!r}", "angle")
        self.p = _check_probability(self.p, "Rotate")

    def check(self, isotropic: bool) -> None:
        _require_isotropic("Rotate", self.axes, isotropic, "mixes z with y/x, which distorts anisotropic EM data")

    def exchanged_axes(self) -> str:
        return self.axes

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        angle = np.deg2rad(self.angle) * (2.0 * uniforms[:, 1] - 1.0)
        if len(self._axes) == 3:
            cos_polar = 2.0 * uniforms[:, 2] - 1.0
            azimuth = 2.0 * np.pi * uniforms[:, 3]
            sin_polar = np.sqrt(1.0 - cos_polar ** 2)
            axis = np.stack([cos_polar, sin_polar * np.sin(azimuth), sin_polar * np.cos(azimuth)], axis=1)
            rotation = _rotation(axis, angle)
        else:  # in the plane of the two axes, turning the first towards the second for positive angles
            first, second = self._axes
            rotation = np.tile(np.eye(3), (len(uniforms), 1, 1))
            rotation[:, first, first] = rotation[:, second, second] = np.cos(angle)
            rotation[:, second, first] = np.sin(angle)
            rotation[:, first, second] = -np.sin(angle)
        chosen = uniforms[:, 0] < self.p
        params.matrix[chosen] = params.matrix[chosen] @ rotation[chosen]


@register("augmentation")
@dataclass
class Scale(_Warp):
    """Zoom each example, with probability ``p``, by factors drawn uniformly from ``range``.

    A factor f > 1 magnifies: one output voxel spans 1 / f source voxels along that axis.

    Parameters
    ----------
    range : two floats
        ``(low, high)`` with ``1/64 <= low <= high <= 64``.
    p : float
        Probability of scaling an example.
    isotropic_xy : bool
        One factor for y and x (keeps in-plane shapes); False draws them independently.
    axes : str
        Output axes to scale: ``"yx"`` (the default, safe for anisotropic EM) or, for isotropic data, any set
        including z.
    """

    range: Sequence[float] = (0.9, 1.1)
    p: float = 1.0
    isotropic_xy: bool = True
    axes: str = "yx"
    name: ClassVar[str] = "scale"
    draws: ClassVar[int] = 4  # apply?, and one factor per axis

    def __post_init__(self) -> None:
        if isinstance(self.range, str) or not isinstance(self.range, Sequence) or len(self.range) != 2:
            raise refusal(f"Scale: range must be two numbers (low, high), got {self.range!r}", "range")
        low, high = (real(v, "Scale: range", 0.0, strict=True) for v in self.range)
        if low < 1 / MAX_ZOOM or high > MAX_ZOOM:  # else the warp kernel refused its matrix, naming neither
            raise refusal(f"Scale: range must lie within [1/{MAX_ZOOM:g}, {MAX_ZOOM:g}], got {self.range!r}", "range")
        if low > high:
            raise refusal(f"Scale: range must have low <= high, got {self.range!r}", "range")
        self.range = (low, high)
        self.p = _check_probability(self.p, "Scale")
        if not isinstance(self.isotropic_xy, (bool, np.bool_)):
            raise refusal(f"Scale: isotropic_xy must be True or False, got {self.isotropic_xy!r}",
                          "isotropic_xy")
        self._axes = _parse_axes(self.axes, "Scale")

    def check(self, isotropic: bool) -> None:
        _require_isotropic("Scale", self.axes, isotropic,
                           "resamples z, which blends sections of anisotropic EM data")

    def isotropic_axes(self) -> str:
        # y and x alone may differ in size: they are zoomed, never moved onto each other; z zoomed with them
        # blends the sections of data whose z voxels are larger
        return self.axes if "z" in self.axes else ""

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        low, high = self.range
        factors = low + (high - low) * uniforms[:, 1:4]
        if self.isotropic_xy:
            factors[:, 2] = factors[:, 1]
        inverse = np.ones((len(uniforms), 3))
        for axis in self._axes:
            inverse[:, axis] = 1.0 / factors[:, axis]
        chosen = uniforms[:, 0] < self.p
        params.matrix[chosen] = params.matrix[chosen] * inverse[chosen][:, None, :]


@register("augmentation")
@dataclass
class Elastic(_Warp):
    """Smooth random deformation: control points jittered with Gaussian noise, interpolated by a cubic B-spline.

    Call :meth:`bind` with the largest output window before reading :attr:`draws`: the grid (and so the number
    of draws) depends on it. Smaller windows around the same centre share the grid.

    Parameters
    ----------
    spacing : three floats
        Output voxels between control points (z, y, x), each >= 1.
    sigma : three floats
        Standard deviation of the control-point jitter in source voxels (z, y, x), each in [0, 4096]. The default moves
        nothing along z, which suits anisotropic EM. The interpolated displacement is a weighted mean of control
        values, so its spread is smaller than ``sigma`` and never exceeds the largest control value.
    p : float
        Probability of deforming an example.
    """

    spacing: Sequence[float] = (4.0, 32.0, 32.0)
    sigma: Sequence[float] = (0.0, 2.0, 2.0)
    p: float = 1.0
    name: ClassVar[str] = "elastic"
    # bound to the windows at run time, not configured: neither shown nor compared
    grid: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # more than one control point per voxel deforms nothing more finely, and its draws grow without bound: a
        # spacing of 0.01 drew 20 GiB per batch of small windows (a review; the process was killed)
        self.spacing = triple(self.spacing, "Elastic: spacing", integer=False, minimum=1.0)
        self.sigma = triple(self.sigma, "Elastic: sigma", integer=False, minimum=0.0, strict=False)
        if max(self.sigma) > MAX_SIGMA:  # else the warp kernel refused the coordinates, naming neither
            raise refusal(f"Elastic: sigma must be at most {MAX_SIGMA:g} voxels along each axis (a jitter beyond "
                          f"leaves any window), got {tuple(self.sigma)}", "sigma")
        self.p = _check_probability(self.p, "Elastic")
        self._draws = None

    def bind_windows(self, windows: Windows) -> None:
        """Size the control grid for the largest window (smaller ones around the same centre share it)."""
        self.bind(windows.largest)

    def bind(self, shape: Sequence[int]) -> "Elastic":
        """Size the control grid for output windows up to ``shape`` (Z, Y, X); returns self."""
        shape = triple(shape, "Elastic.bind: shape", minimum=1)
        self.grid = grid_shape(shape, self.spacing)
        values = sum(s > 0 for s in self.sigma) * int(np.prod(self.grid))
        self._draws = 1 + 2 * ((values + 1) // 2)  # apply?, then pairs for Box-Muller
        return self

    @property
    def draws(self) -> int:
        if self._draws is None:
            raise RuntimeError("Elastic: call bind(shape) with the largest output window before drawing")
        return self._draws

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        count = len(uniforms)
        if uniforms.shape != (count, self.draws):
            raise ValueError(f"Elastic: expected uniforms of shape ({count}, {self.draws}), got {uniforms.shape}")
        shape = (count, 3) + self.grid
        if params.elastic is None:
            params.elastic = np.zeros(shape, dtype=np.float32)
            params.elastic_spacing = self.spacing
        elif params.elastic.shape != shape or params.elastic_spacing != self.spacing:
            raise ValueError(f"Elastic: params.elastic has shape {params.elastic.shape} and spacing "
                             f"{params.elastic_spacing}; this grid is {shape} with spacing {self.spacing}")
        pairs = uniforms[:, 1:].reshape(count, -1, 2)
        radius = np.sqrt(-2.0 * np.log1p(-pairs[:, :, 0]))  # 1 - u in (0, 1]: finite
        turn = 2.0 * np.pi * pairs[:, :, 1]
        normal = np.concatenate([radius * np.cos(turn), radius * np.sin(turn)], axis=1)
        chosen = uniforms[:, 0] < self.p
        cells = int(np.prod(self.grid))
        used = 0
        for axis, sigma in enumerate(self.sigma):
            if sigma == 0:
                continue
            jitter = (sigma * normal[:, used:used + cells]).reshape((count,) + self.grid)
            params.elastic[chosen, axis] += jitter[chosen].astype(np.float32)
            used += cells
