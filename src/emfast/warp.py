"""Warps beyond the 48 axis transforms: rotation, scaling, shear and elastic deformation, applied to raw and labels
with one geometry.

Convention. Output voxel ``o = (z, y, x)`` of an output window of extent ``shape`` reads the source at::

    s = centre + A @ (o - (shape - 1) / 2) + d(o)

in source voxel coordinates (z, y, x): ``centre`` is where the window's centre lies in the source, ``A`` any
3x3 linear map and ``d`` an elastic displacement in source voxels, a cubic B-spline of a coarse control grid
whose point (0, 0, 0) sits at ``grid_origin`` in centred output coordinates (``o - (shape - 1) / 2``), with
``grid_spacing`` output voxels between points. Windows of different extents around the same centre (a raw
window and a smaller label window) therefore share one geometry, voxel for voxel.

Raw is sampled trilinearly, labels take the nearest voxel ``floor(s + 0.5)`` (round half up, as
``scipy.ndimage.map_coordinates(order=0)``). A voxel is *inside* when ``0 <= s <= extent - 1`` along every
source axis (the rule of ``map_coordinates(mode="constant")``); outside voxels get ``fill`` and ``valid = 0``.
A signed permutation matrix with an integer-aligned centre and no grid reproduces the gather kernel
(:func:`emfast._kernels.gather_convert` / ``gather_copy``) bit for bit.

Coordinates are computed in float64 per run of 16 voxels and in float32 within (see csrc/warp.h): the error
in ``s`` stays below 1e-5 voxel for ``|A| <= 2`` and displacements up to 16 voxels; integer coordinates are exact.
On CPUs with AVX2 the samplers run 8 voxels at a time with the same bits as the portable path; setting the
environment variable ``EMFAST_NO_AVX2`` forces the portable path.

Augmentations (:class:`Rotate`, :class:`Scale`, :class:`Elastic`) compose into :class:`~emfast.augment.Params`
``matrix`` and ``elastic``; :func:`full_matrix` folds in the Mirror/Transpose permutation and
:class:`WarpPlan` collects what the kernels need for a batch.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import ClassVar, Optional, Sequence

import numpy as np

from . import _warp
from .augment import Augmentation, Params, _check_probability, _parse_axes, _require_isotropic

#: Coordinate error allowance when bounding the voxels a warp reads (well above the float32 error, csrc/warp.h).
_COORDINATE_SLACK = 1e-3


def _grid_geometry(grid, grid_spacing, grid_origin):
    """Check the grid arguments together; default the origin to a grid centred on the window centre."""
    if grid is None:
        if grid_spacing is not None or grid_origin is not None:
            raise ValueError("grid_spacing and grid_origin need a grid")
        return None, None, None
    if not isinstance(grid, np.ndarray):
        raise TypeError(f"grid must be a float32 array of shape (B, 3, gz, gy, gx), got {type(grid).__name__}")
    if grid_spacing is None:
        raise ValueError("grid_spacing is required with a grid (output voxels between control points, z, y, x)")
    spacing = _triple(grid_spacing, "grid_spacing")
    if grid_origin is None:
        if grid.ndim != 5:
            raise ValueError(f"grid must have shape (B, 3, gz, gy, gx), got {grid.shape}")
        grid_origin = centred_origin(grid.shape[2:], spacing)
    return grid, spacing, _triple(grid_origin, "grid_origin")


def _triple(values, name: str) -> tuple:
    try:
        items = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be three numbers (z, y, x), got {values!r}") from None
    if len(items) != 3:
        raise ValueError(f"{name} must be three numbers (z, y, x), got {values!r}")
    return items


def warp_raw(sources, centres, matrices, out, *, scale, shift, grid=None, grid_spacing=None, grid_origin=None,
             fill=0.0, valid=None, gather_path=True):
    """Warp raw windows of B sources into ``out``, trilinearly, as ``value * scale + shift``.

    Parameters
    ----------
    sources : list of ndarray
        One 4-D source (C, Zs, Ys, Xs) per example (uint8, uint16 or float32, one dtype, any strides); examples
        may read different volumes. The whole source is addressable: pass a lazily read box (see
        :func:`source_box`) together with the centre relative to that box.
    centres : array_like, shape (B, 3)
        Source coordinates (z, y, x) of each output window's centre.
    matrices : array_like, shape (B, 3, 3)
        Linear maps from centred output coordinates to source offsets (see :func:`full_matrix`).
    out : ndarray, shape (B, C, Z, Y, X)
        C-contiguous float32 or float16 (rounded to nearest even, as NumPy) output.
    scale, shift : array_like, shape (B,)
        Per-example conversion ``value * scale + shift``, in float32 without fused multiply-add.
    grid : ndarray of float32, shape (B, 3, gz, gy, gx), optional
        Elastic control displacements in source voxels (z, y, x components).
    grid_spacing : three floats
        Output voxels between control points (required with ``grid``).
    grid_origin : three floats, optional
        Centred output coordinate of control point (0, 0, 0); default: the grid centred on the window centre.
    fill : float
        Output value of voxels outside their source (not scaled).
    valid : ndarray of uint8, shape (B, 1, Z, Y, X), optional
        Set to 1 where the voxel is inside its source, 0 where it got ``fill``.
    gather_path : bool
        Hand exact axis transforms to the gather kernel (the same result, faster); False forces the general
        path, for tests and benchmarks.

    Returns
    -------
    ndarray
        ``out``.

    Raises
    ------
    TypeError, ValueError
        For wrong types, dtypes, shapes or layouts, overlapping arrays, or non-finite / out-of-range geometry.
    """
    grid, grid_spacing, grid_origin = _grid_geometry(grid, grid_spacing, grid_origin)
    return _warp.warp_convert(sources, centres, matrices, grid, grid_spacing, grid_origin, scale, shift, fill, out,
                              valid, gather_path)


def warp_labels(sources, centres, matrices, out, *, grid=None, grid_spacing=None, grid_origin=None, fill=0,
                valid=None, gather_path=True):
    """Warp label windows of B sources into ``out`` with the nearest voxel, copied bit for bit.

    The voxel read is ``floor(s + 0.5)`` of the same coordinate ``s`` as :func:`warp_raw`, so raw and labels
    warped with the same arguments stay aligned.

    Parameters
    ----------
    sources : list of ndarray
        One 4-D source (C, Zs, Ys, Xs) per example, all of ``out.dtype``: any 1, 2, 4 or 8-byte integer type.
    centres, matrices, grid, grid_spacing, grid_origin, valid, gather_path
        As in :func:`warp_raw`.
    out : ndarray, shape (B, C, Z, Y, X)
        C-contiguous output of the sources' dtype.
    fill : int
        Label of voxels outside their source; must fit the dtype.

    Returns
    -------
    ndarray
        ``out``.

    Raises
    ------
    TypeError, ValueError
        As :func:`warp_raw`, and for a ``fill`` the dtype cannot hold.
    """
    grid, grid_spacing, grid_origin = _grid_geometry(grid, grid_spacing, grid_origin)
    return _warp.warp_copy(sources, centres, matrices, grid, grid_spacing, grid_origin, fill, out, valid,
                           gather_path)


def warp_coordinates(shape, centres, matrices, *, grid=None, grid_spacing=None, grid_origin=None) -> np.ndarray:
    """The source coordinates the warp kernels use, exactly: (B, 3, Z, Y, X) float64 for an output ``shape``.

    Arguments as in :func:`warp_raw`. Useful to check a warp against another sampler (such as
    ``scipy.ndimage.map_coordinates``) on identical coordinates.
    """
    grid, grid_spacing, grid_origin = _grid_geometry(grid, grid_spacing, grid_origin)
    return _warp.warp_coordinates(shape, centres, matrices, grid, grid_spacing, grid_origin)


def centred_origin(grid_shape: Sequence[int], spacing: Sequence[float]) -> tuple:
    """Origin of a control grid of ``grid_shape`` points centred on the window centre: ``-(g - 1) / 2 * spacing``."""
    return tuple(-(g - 1) / 2.0 * s for g, s in zip(grid_shape, spacing))


def grid_shape(shape: Sequence[int], spacing: Sequence[float]) -> tuple:
    """Control points per axis that cover an output window of ``shape`` with ``spacing``, centred on it.

    ``ceil((extent - 1) / spacing)`` intervals plus one point beyond each end, so that the cubic B-spline never
    runs off the grid inside the window (and, centred, also covers every smaller window around the same centre).
    """
    return tuple(int(math.ceil((n - 1) / s - 1e-9)) + 3 for n, s in zip(shape, spacing))


def source_box(shape, centre, matrix, max_displacement=0.0):
    """Integer bounding box ``[lo, hi)`` of every source voxel a warp of an output window may read.

    Parameters
    ----------
    shape : three ints
        Output window extent (Z, Y, X).
    centre : three floats
        Source coordinate of the window centre.
    matrix : array_like, shape (3, 3)
        The warp's linear map.
    max_displacement : float or three floats
        Bound on the elastic displacement per source axis (``WarpPlan.max_displacement``; 0 without one).

    Returns
    -------
    lo, hi : ndarray of int64, shape (3,)
        Source voxels ``lo <= v < hi`` cover every trilinear neighbour and nearest voxel the kernels read. The box
        is not clipped to any volume: read its intersection with the volume and pass ``centre - read_lo``.
    """
    shape = np.asarray(shape)
    if shape.shape != (3,) or shape.dtype.kind not in "iu" or np.any(shape < 1):
        raise ValueError(f"shape must be three extents >= 1 (Z, Y, X), got {shape.tolist()}")
    centre = np.asarray(centre, dtype=np.float64)
    matrix = np.asarray(matrix, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(max_displacement, dtype=np.float64), (3,))
    if centre.shape != (3,) or not np.all(np.isfinite(centre)):
        raise ValueError(f"centre must be three finite numbers, got {centre.tolist()}")
    if matrix.shape != (3, 3) or not np.all(np.isfinite(matrix)):
        raise ValueError(f"matrix must be a finite 3x3 array, got shape {matrix.shape}")
    if not np.all(np.isfinite(bound)) or np.any(bound < 0):
        raise ValueError(f"max_displacement must be finite and >= 0, got {max_displacement!r}")
    half = (shape - 1) / 2.0
    corners = np.array(np.meshgrid(*[(-h, h) for h in half], indexing="ij")).reshape(3, -1)
    reach = centre[:, None] + matrix @ corners
    lo = np.floor(reach.min(axis=1) - bound - _COORDINATE_SLACK).astype(np.int64)
    hi = np.floor(reach.max(axis=1) + bound + _COORDINATE_SLACK).astype(np.int64) + 2
    return lo, hi


def permutation_matrices(perms, flips) -> np.ndarray:
    """(B, 3, 3) signed permutation matrices of the gather kernel's axis transforms.

    Output axis j reads source axis ``perms[n, j]``, reversed where ``flips[n, perms[n, j]]``: column j holds
    +-1 in row ``perms[n, j]``, so ``centre + P @ (o - (shape - 1) / 2)`` with ``centre`` the window centre in
    the source visits the same voxels as the gather kernel.
    """
    perms = np.asarray(perms, dtype=np.int64)
    flips = np.asarray(flips, dtype=bool)
    rows = np.arange(len(perms))[:, None]
    matrices = np.zeros((len(perms), 3, 3))
    matrices[rows, perms, np.arange(3)] = np.where(flips[rows, perms], -1.0, 1.0)
    return matrices


def full_matrix(params: Params) -> np.ndarray:
    """(B, 3, 3) matrices of a batch in the kernels' convention: ``permutation_matrices(perms, flips) @ matrix``.

    The rotation/scale (``params.matrix``) acts on centred output coordinates first and the Mirror/Transpose
    axis transform after it: the output is the rotated/scaled view of the mirrored/transposed window, whatever
    the order of the augmentations in the list. With ``matrix`` the identity this reproduces the gather kernel.
    """
    return permutation_matrices(params.perms, params.flips) @ params.matrix


@dataclass(frozen=True)
class WarpPlan:
    """Everything the warp kernels need for one batch, from its :class:`~emfast.augment.Params`.

    Attributes
    ----------
    matrices : ndarray, shape (B, 3, 3)
        Full matrices (:func:`full_matrix`).
    grid : ndarray of float32, shape (B, 3, gz, gy, gx), or None
        Elastic control displacements; zero for examples without one.
    grid_spacing, grid_origin : tuple of three floats, or None
        The grid's geometry (pass both to :func:`warp_raw` / :func:`warp_labels`).
    warped : ndarray of bool, shape (B,)
        False for examples that are plain axis transforms: the gather kernel serves them, from a window of the
        output's extent.
    max_displacement : ndarray, shape (B, 3)
        Bound on each example's elastic displacement per source axis (for :func:`source_box`).
    """

    matrices: np.ndarray
    grid: Optional[np.ndarray]
    grid_spacing: Optional[tuple]
    grid_origin: Optional[tuple]
    warped: np.ndarray
    max_displacement: np.ndarray

    @classmethod
    def from_params(cls, params: Params, augmentations: Sequence[Augmentation]) -> "WarpPlan":
        """Collect a batch's plan; ``augmentations`` are those that drew ``params`` (for the grid spacing)."""
        elastics = [a for a in augmentations if isinstance(a, Elastic)]
        spacing = origin = None
        grid = params.elastic
        count = len(params.perms)
        if grid is not None:
            layouts = {(a.spacing, a.grid) for a in elastics}
            if len(layouts) != 1:
                raise ValueError("params.elastic needs exactly one Elastic grid layout among the augmentations, "
                                 f"got {sorted(layouts)}")
            spacing, shape = layouts.pop()
            if grid.shape != (count, 3) + shape:
                raise ValueError(f"params.elastic has shape {grid.shape}, the Elastic grid is {shape}")
            origin = centred_origin(shape, spacing)
            bound = np.abs(grid).reshape(count, 3, -1).max(axis=2).astype(np.float64)
            moving = bound.any(axis=1)
        else:
            bound = np.zeros((count, 3))
            moving = np.zeros(count, dtype=bool)
        warped = moving | np.any(params.matrix != np.eye(3), axis=(1, 2))
        return cls(full_matrix(params), grid, spacing, origin, warped, bound)

    def source_boxes(self, shape, centres) -> tuple:
        """``(lo, hi)``, each (B, 3) int64: the source box each example's warp of a ``shape`` window reads."""
        centres = np.asarray(centres, dtype=np.float64)
        boxes = [source_box(shape, centres[n], self.matrices[n], self.max_displacement[n])
                 for n in range(len(self.matrices))]
        return (np.array([b[0] for b in boxes], dtype=np.int64).reshape(-1, 3),
                np.array([b[1] for b in boxes], dtype=np.int64).reshape(-1, 3))


# -- augmentations ----------------------------------------------------------------------------------------------

def _rotation(axis: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """(B, 3, 3) rotations by ``angle`` (radians) about unit vectors ``axis`` (B, 3), Rodrigues' formula."""
    k = np.zeros((len(axis), 3, 3))
    k[:, 0, 1], k[:, 0, 2], k[:, 1, 2] = -axis[:, 2], axis[:, 1], -axis[:, 0]
    k -= k.transpose(0, 2, 1)
    s, c = np.sin(angle)[:, None, None], np.cos(angle)[:, None, None]
    return np.eye(3) + s * k + (1.0 - c) * (k @ k)


def _check_real(value, owner: str, name: str, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
            value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{owner}: {name} must be a finite number {relation} {minimum:g}, got {value!r}")
    return float(value)


def _check_triple(values, owner: str, name: str, minimum: float, strict: bool) -> tuple:
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) != 3:
        raise ValueError(f"{owner}: {name} must be three numbers (z, y, x), got {values!r}")
    return tuple(_check_real(v, owner, name, minimum, strict) for v in values)


@dataclass
class Rotate(Augmentation):
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
            raise ValueError(f"Rotate: axes must name two or three axes, got {self.axes!r}")
        self.angle = _check_real(self.angle, "Rotate", "angle", 0.0)
        if self.angle > 180.0:
            raise ValueError(f"Rotate: angle must be in [0, 180] degrees, got {self.angle!r}")
        self.p = _check_probability(self.p, "Rotate")

    def check(self, isotropic: bool) -> None:
        _require_isotropic("Rotate", self.axes, isotropic, "mixes z with y/x, which distorts anisotropic EM data")

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


@dataclass
class Scale(Augmentation):
    """Zoom each example, with probability ``p``, by factors drawn uniformly from ``range``.

    A factor f > 1 magnifies: one output voxel spans 1 / f source voxels along that axis.

    Parameters
    ----------
    range : two floats
        ``(low, high)`` with ``0 < low <= high``.
    p : float
        Probability of scaling an example.
    isotropic_xy : bool
        One factor for y and x (keeps in-plane shapes); False draws them independently.
    axes : str
        Output axes to scale: ``"yx"`` (the default, safe for anisotropic EM) or, for isotropic data, any set
        including z.
    """

    range: tuple = (0.9, 1.1)
    p: float = 1.0
    isotropic_xy: bool = True
    axes: str = "yx"
    name: ClassVar[str] = "scale"
    draws: ClassVar[int] = 4  # apply?, and one factor per axis

    def __post_init__(self) -> None:
        if isinstance(self.range, str) or not isinstance(self.range, Sequence) or len(self.range) != 2:
            raise ValueError(f"Scale: range must be two numbers (low, high), got {self.range!r}")
        low, high = (_check_real(v, "Scale", "range", 0.0, strict=True) for v in self.range)
        if low > high:
            raise ValueError(f"Scale: range must have low <= high, got {self.range!r}")
        self.range = (low, high)
        self.p = _check_probability(self.p, "Scale")
        if not isinstance(self.isotropic_xy, (bool, np.bool_)):
            raise ValueError(f"Scale: isotropic_xy must be True or False, got {self.isotropic_xy!r}")
        self._axes = _parse_axes(self.axes, "Scale")

    def check(self, isotropic: bool) -> None:
        _require_isotropic("Scale", self.axes, isotropic,
                           "resamples z, which blends sections of anisotropic EM data")

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


@dataclass
class Elastic(Augmentation):
    """Smooth random deformation: control points jittered with Gaussian noise, interpolated by a cubic B-spline.

    Call :meth:`bind` with the largest output window before reading :attr:`draws`: the grid (and so the number
    of draws) depends on it. Smaller windows around the same centre share the grid.

    Parameters
    ----------
    spacing : three floats
        Output voxels between control points (z, y, x), each > 0.
    sigma : three floats
        Standard deviation of the control-point jitter in source voxels (z, y, x), each >= 0. The default moves
        nothing along z, which suits anisotropic EM. The interpolated displacement is a weighted mean of control
        values, so its spread is smaller than ``sigma`` and never exceeds the largest control value.
    p : float
        Probability of deforming an example.
    """

    spacing: tuple = (4.0, 32.0, 32.0)
    sigma: tuple = (0.0, 2.0, 2.0)
    p: float = 1.0
    name: ClassVar[str] = "elastic"
    grid: Optional[tuple] = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.spacing = _check_triple(self.spacing, "Elastic", "spacing", 0.0, strict=True)
        self.sigma = _check_triple(self.sigma, "Elastic", "sigma", 0.0, strict=False)
        self.p = _check_probability(self.p, "Elastic")
        self._draws = None

    def bind(self, shape: Sequence[int]) -> "Elastic":
        """Size the control grid for output windows up to ``shape`` (Z, Y, X); returns self."""
        if isinstance(shape, str) or not isinstance(shape, Sequence) or len(shape) != 3 or \
                any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in shape):
            raise ValueError(f"Elastic.bind: shape must be three extents >= 1 (Z, Y, X), got {shape!r}")
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
        elif params.elastic.shape != shape:
            raise ValueError(f"Elastic: params.elastic has shape {params.elastic.shape}, this grid is {shape}")
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
