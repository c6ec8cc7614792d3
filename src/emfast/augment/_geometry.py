"""The geometry of a batch's warps: control-grid layout, the source box a warp reads, and :class:`WarpPlan`, which
folds the Mirror/Transpose axis transforms into the rotation/scale matrices (conventions in
:mod:`emfast.augment._resample`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .._checks import triple
from ._base import Params

#: Coordinate error allowance when bounding the voxels a warp reads (well above the float32 error, csrc/warp.h).
_COORDINATE_SLACK = 1e-3


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
    shape = np.asarray(triple(shape, "shape", minimum=1))
    centre = np.asarray(triple(centre, "centre", integer=False))
    matrix = np.asarray(matrix, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(max_displacement, dtype=np.float64), (3,))
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
    def from_params(cls, params: Params) -> "WarpPlan":
        """Collect a batch's plan from the parameters its augmentations drew."""
        spacing = origin = None
        grid = params.elastic
        count = len(params.perms)
        if grid is not None:
            if params.elastic_spacing is None:
                raise ValueError("params.elastic needs params.elastic_spacing (set by the Elastic augmentation)")
            spacing = params.elastic_spacing
            origin = centred_origin(grid.shape[2:], spacing)
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
