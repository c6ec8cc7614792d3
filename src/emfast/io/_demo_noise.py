"""Smooth random fields and box filters for the synthetic volume (:mod:`._demo`): the cells' in-plane warp and the
image's texture and blur."""

from __future__ import annotations

import numpy as np


def coarse_noise(
    rng: np.random.Generator,
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
) -> np.ndarray:
    """White noise on a grid ``spacing`` voxels apart that covers ``shape``."""
    coarse = tuple(int((n - 1) / s) + 2 for n, s in zip(shape, spacing))
    return rng.standard_normal(coarse, dtype=np.float32)


def sample_noise(
    coarse: np.ndarray,
    spacing: tuple[float, float, float],
    z0: int,
    z1: int,
    ny: int,
    nx: int,
) -> np.ndarray:
    """Smoothly upsample ``coarse`` noise to voxels ``z0:z1`` of an (., ny, nx) volume.

    Separable interpolation with a smoothstep weight, so the field and its
    gradient are continuous (plain linear interpolation shows grid creases).
    The z range is cut from the coarse grid first, so the cost is that of the
    slab alone.
    """
    sz, sy, sx = spacing
    fz = np.arange(z0, z1) / sz
    lo = int(fz[0])
    out = coarse[lo : int(fz[-1]) + 2]
    out = _upsample_axis(out, np.arange(nx) / sx, 2)
    out = _upsample_axis(out, np.arange(ny) / sy, 1)
    return _upsample_axis(out, fz - lo, 0)


def _upsample_axis(a: np.ndarray, pos: np.ndarray, axis: int) -> np.ndarray:
    """Interpolate ``a`` along ``axis`` at fractional indices ``pos``."""
    i0 = np.minimum(pos.astype(np.intp), a.shape[axis] - 2)
    t = (pos - i0).astype(np.float32)
    t = t * t * (3 - 2 * t)
    bshape = [1, 1, 1]
    bshape[axis] = t.size
    t = t.reshape(bshape)
    a0 = np.take(a, i0, axis=axis)
    a1 = np.take(a, i0 + 1, axis=axis)
    a1 -= a0
    a1 *= t
    a1 += a0
    return a1


def box_filter(a: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Return the moving average of odd ``size`` along ``axis``, edges replicated."""
    r = size // 2
    n = a.shape[axis]
    padded = np.concatenate(
        [np.take(a, [0] * r, axis=axis), a, np.take(a, [n - 1] * r, axis=axis)],
        axis=axis,
    )
    window = [slice(None)] * a.ndim
    window[axis] = slice(0, n)
    out = padded[tuple(window)].copy()
    for k in range(1, size):
        window[axis] = slice(k, k + n)
        out += padded[tuple(window)]
    out *= np.float32(1.0 / size)
    return out
