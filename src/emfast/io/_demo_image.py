"""The raw image of the synthetic volume (:mod:`._demo`): grey cells with texture, dark membranes and organelles,
blur, per-section brightness and noise, rendered slab by slab from the cell labels."""

from __future__ import annotations

import math

import numpy as np

from ._demo_noise import box_filter, coarse_noise, sample_noise

# Grey levels (0-255) and their spread.
_CELL_MEAN, _CELL_MEAN_SD = 165.0, 16.0
_MEMBRANE_LEVEL = 55.0
_Z_MEMBRANE_STRENGTH = 0.35  # oblique membranes are smeared over a section, so fainter
_TEXTURE_COARSE, _TEXTURE_FINE = 9.0, 5.0
_BLOB_LEVEL = 75.0
_BLOB_DENSITY = 2e-4  # blobs per voxel: a few per cell profile
_NOISE_SD = 9.0
_SECTION_GAIN_SD, _SECTION_OFFSET_SD = 0.04, 4.0

# Work size that bounds temporary memory independently of the volume size.
_RAW_SLAB_SECTIONS = 8


def render_raw(
    rng: np.random.Generator, cells: np.ndarray, n_cells: int, anisotropy: float
) -> np.ndarray:
    """Render the uint8 EM image of the cell partition ``cells``."""
    nz, ny, nx = cells.shape
    # All global random draws come first, so the result does not depend on
    # how the per-slab work below is split.
    cell_mean = rng.normal(_CELL_MEAN, _CELL_MEAN_SD, n_cells).clip(105, 225)
    cell_texture = rng.uniform(0.5, 1.5, n_cells)
    cell_mean = cell_mean.astype(np.float32)
    cell_texture = cell_texture.astype(np.float32)
    coarse_spacing = (max(1.0, 24.0 / anisotropy), 24.0, 24.0)
    fine_spacing = (max(1.0, 6.0 / anisotropy), 6.0, 6.0)
    coarse_tex = coarse_noise(rng, cells.shape, coarse_spacing)
    fine_tex = coarse_noise(rng, cells.shape, fine_spacing)
    gain = 1.0 + _SECTION_GAIN_SD * rng.standard_normal(nz)
    offset = _SECTION_OFFSET_SD * rng.standard_normal(nz)
    blobs = _make_blobs(rng, cells.shape, anisotropy)

    raw = np.empty(cells.shape, dtype=np.uint8)
    for z0 in range(0, nz, _RAW_SLAB_SECTIONS):
        z1 = min(z0 + _RAW_SLAB_SECTIONS, nz)
        lab = cells[z0:z1]
        img = cell_mean[lab]
        texture = _TEXTURE_COARSE * sample_noise(
            coarse_tex, coarse_spacing, z0, z1, ny, nx
        )
        texture += _TEXTURE_FINE * sample_noise(fine_tex, fine_spacing, z0, z1, ny, nx)
        texture *= cell_texture[lab]
        img += texture
        membrane = _membrane_strength(cells, z0, z1)
        img += (_MEMBRANE_LEVEL - img) * membrane
        _draw_blobs(img, lab, blobs, z0, z1)
        # Slight in-plane blur with the [1, 2, 1] / 4 kernel.
        for axis in (1, 2):
            img = 0.25 * img + 0.75 * box_filter(img, 3, axis)
        img *= gain[z0:z1, None, None].astype(np.float32)
        img += offset[z0:z1, None, None].astype(np.float32)
        img += rng.standard_normal(img.shape, dtype=np.float32) * np.float32(_NOISE_SD)
        np.clip(img, 0, 255, out=img)
        raw[z0:z1] = np.rint(img)
    return raw


def _membrane_strength(cells: np.ndarray, z0: int, z1: int) -> np.ndarray:
    """Soft membrane mask in [0, 1] for sections ``z0:z1``.

    In-plane label changes give a ~4 voxel wide dark line; label changes
    between sections give a fainter smear.
    """
    lab = cells[z0:z1]
    edge = np.zeros(lab.shape, dtype=bool)
    for axis in (1, 2):
        n = lab.shape[axis]
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(0, n - 1), slice(1, n)
        diff = lab[tuple(lo)] != lab[tuple(hi)]
        # Mark both sides of the change: the membrane belongs to both cells.
        edge[tuple(lo)] |= diff
        edge[tuple(hi)] |= diff
    soft = edge.astype(np.float32)
    for axis in (1, 2):
        soft = box_filter(soft, 3, axis)
    np.minimum(soft * np.float32(1.5), np.float32(1.0), out=soft)

    # Compare with the neighbouring sections, including those outside the slab.
    zlo, zhi = max(z0 - 1, 0), min(z1 + 1, cells.shape[0])
    ext = cells[zlo:zhi]
    zedge = np.zeros(lab.shape, dtype=bool)
    diff = ext[1:] != ext[:-1]  # diff[i]: section zlo+i differs from zlo+i+1
    # Section z differs from z+1 -> diff[z - zlo]; from z-1 -> diff[z - 1 - zlo].
    z = np.arange(z0, z1)
    has_next = z + 1 < zhi
    zedge[has_next] |= diff[z[has_next] - zlo]
    has_prev = z - 1 >= zlo
    zedge[has_prev] |= diff[z[has_prev] - 1 - zlo]
    np.maximum(
        soft, zedge.astype(np.float32) * np.float32(_Z_MEMBRANE_STRENGTH), out=soft
    )
    return soft


def _make_blobs(
    rng: np.random.Generator, shape: tuple[int, int, int], anisotropy: float
) -> np.ndarray:
    """Random organelle-like ellipsoids.

    Returns rows of (z, y, x, radius, z half-length in sections, strength).
    Blobs are up to four times longer along z than across, in physical units,
    like mitochondria running along a neurite.
    """
    nz, ny, nx = shape
    n = rng.poisson(_BLOB_DENSITY * nz * ny * nx)
    radius = rng.uniform(2.5, 7.0, n)
    # At least half a section, so that every blob shows in some section.
    half_length = np.maximum(radius * rng.uniform(1.0, 4.0, n) / anisotropy, 0.6)
    return np.column_stack(
        [
            rng.uniform(-half_length, nz - 1 + half_length),
            rng.uniform(0, ny - 1, n),
            rng.uniform(0, nx - 1, n),
            radius,
            half_length,
            rng.uniform(0.5, 0.8, n),
        ]
    )


def _draw_blobs(
    img: np.ndarray, lab: np.ndarray, blobs: np.ndarray, z0: int, z1: int
) -> None:
    """Darken ``img`` (sections ``z0:z1``) inside the blobs, in place.

    A blob is clipped to the cell that holds its centre, since organelles do
    not cross membranes.
    """
    _, ny, nx = img.shape
    zc, half = blobs[:, 0], blobs[:, 4]
    hits = np.flatnonzero((zc + half >= z0) & (zc - half < z1))
    for bz, by, bx, radius, half_length, strength in blobs[hits]:
        s0 = max(z0, math.ceil(bz - half_length))
        s1 = min(z1, math.floor(bz + half_length) + 1)
        y0, y1 = max(0, int(by - radius) - 1), min(ny, int(by + radius) + 2)
        x0, x1 = max(0, int(bx - radius) - 1), min(nx, int(bx + radius) + 2)
        if s0 >= s1:
            continue
        # Ellipsoid cross-section radius in each section.
        frac = (np.arange(s0, s1) - bz) / half_length
        r = (radius * np.sqrt(np.clip(1.0 - frac * frac, 0.0, 1.0))).astype(np.float32)
        dy = np.arange(y0, y1, dtype=np.float32)[:, None] - np.float32(by)
        dx = np.arange(x0, x1, dtype=np.float32)[None, :] - np.float32(bx)
        dist = np.sqrt(dy * dy + dx * dx)
        # One-voxel soft edge instead of a hard, aliased disk.
        alpha = np.clip(r[:, None, None] - dist + np.float32(0.5), 0.0, 1.0)
        window = (slice(s0 - z0, s1 - z0), slice(y0, y1), slice(x0, x1))
        cy = min(max(int(round(by)), y0), y1 - 1) - y0
        cx = min(max(int(round(bx)), x0), x1 - 1) - x0
        cell = lab[window]
        alpha *= cell == cell[:, cy : cy + 1, cx : cx + 1]
        patch = img[window]
        patch += (np.float32(_BLOB_LEVEL) - patch) * (alpha * np.float32(strength))
