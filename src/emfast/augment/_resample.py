"""Resampling windows through a warp: rotation, scaling, shear and elastic deformation, applied to raw and labels
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
(:func:`emfast._core.gather.gather_convert` / ``gather_copy``) bit for bit.

Coordinates are computed in float64 per run of 16 voxels and in float32 within (see csrc/warp.h): the error
in ``s`` stays below 1e-5 voxel for ``|A| <= 2`` and displacements up to 16 voxels; integer coordinates are exact.
On CPUs with AVX2 the samplers run 8 voxels at a time with the same bits as the portable path; setting the
environment variable ``EMFAST_NO_AVX2`` (to any value) forces the portable path. It is read once, when emfast is
imported: set it before that (setting it later in the same process changes nothing).

This module is the warp kernels' Python API (defaults, documentation, argument grouping). The augmentations that
draw warps are in :mod:`emfast.augment._warp`; the geometry of a batch's warps is in :mod:`emfast.augment._geometry`.
"""
from __future__ import annotations

import numpy as np

from .._checks import triple
from .._core import warp as _warp
from ._geometry import centred_origin


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
    spacing = triple(grid_spacing, "grid_spacing", integer=False)
    if grid_origin is None:
        if grid.ndim != 5:
            raise ValueError(f"grid must have shape (B, 3, gz, gy, gx), got {grid.shape}")
        grid_origin = centred_origin(grid.shape[2:], spacing)
    return grid, spacing, triple(grid_origin, "grid_origin", integer=False)


def warp_raw(sources, centres, matrices, out, *, scale, shift, grid=None, grid_spacing=None, grid_origin=None,
             fill=0.0, valid=None, gather_path=True):
    """Warp raw windows of B sources into ``out``, trilinearly, as ``value * scale + shift``.

    Parameters
    ----------
    sources : list of ndarray
        One 4-D source (C, Zs, Ys, Xs) per example (any dtype of ``RAW_DTYPES``, one dtype, any strides); examples
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
