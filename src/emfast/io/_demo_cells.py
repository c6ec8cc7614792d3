"""The labels of the synthetic volume (:mod:`._demo`): a power-weighted Voronoi partition of jittered grid seeds,
elongated along z and warped in-plane."""

from __future__ import annotations

import numpy as np

from ._demo_noise import coarse_noise, sample_noise

# Cell geometry, in xy voxels.
_CELL_SPACING = 32  # seed grid step in y and x: ~200 cell profiles per 384^2 section
_CELL_ELONGATION = 3.0  # cells are this many times longer along z than across
_POWER_WEIGHT = (
    0.45  # sqrt of the max power-diagram weight, in spacings: varied cell sizes
)
_WARP_AMPLITUDE = 4.0  # in-plane warp of the partition, voxels
_WARP_SCALE = 24.0  # wavelength-ish of the warp, voxels
_WARP_MARGIN = (
    16  # labels are computed this far outside the volume, for the warp to reach
)

# Work size that bounds temporary memory independently of the volume size.
_LABEL_CHUNK_VOXELS = 1 << 18


def voronoi_cells(
    rng: np.random.Generator, shape: tuple[int, int, int], anisotropy: float
) -> tuple[np.ndarray, int]:
    """Label every voxel with its nearest jittered seed, then warp in-plane.

    Returns an int32 array of seed indices and the number of seeds.
    """
    nz, ny, nx = shape
    g = _CELL_SPACING
    # Metric: xy in voxels, z in voxels * anisotropy / elongation. Block depth
    # in sections is chosen so blocks are cubes in that metric.
    z_scale = anisotropy / _CELL_ELONGATION
    gz = max(1, round(g / z_scale))
    m = _WARP_MARGIN
    # Blocks tile [0, nz) in z and [-m, n + m) in y/x; one extra ring of blocks
    # on every side provides the neighbours of the border blocks.
    nbz = -(-nz // gz)
    nby = -(-(ny + 2 * m) // g)
    nbx = -(-(nx + 2 * m) // g)
    py, px = nby * g, nbx * g
    grid = (nbz + 2, nby + 2, nbx + 2)
    kz, ky, kx = np.meshgrid(
        *(np.arange(n, dtype=np.float64) - 1 for n in grid), indexing="ij"
    )
    # Continuous voxel coordinates span [k*g - 0.5, (k+1)*g - 0.5) per block.
    seed_z = ((kz + rng.random(grid)) * gz - 0.5) * z_scale
    seed_y = (ky + rng.random(grid)) * g - 0.5 - m
    seed_x = (kx + rng.random(grid)) * g - 0.5 - m
    # Power-diagram weights w vary cell sizes. Distances use max(w) - w
    # instead of -w: shifting all candidates equally keeps the argmin and
    # makes every distance non-negative, which _nearest_seed relies on.
    slack = (_POWER_WEIGHT * g) ** 2 * rng.random(grid)
    seed_z, seed_y, seed_x, slack = (
        a.astype(np.float32) for a in (seed_z, seed_y, seed_x, slack)
    )
    seed_id = np.arange(seed_z.size, dtype=np.int32).reshape(grid)

    # In-plane warp fields, smooth in y/x and slower still along z.
    warp_spacing = (
        _WARP_SCALE * _CELL_ELONGATION / anisotropy,
        _WARP_SCALE,
        _WARP_SCALE,
    )
    warp_y = coarse_noise(rng, shape, warp_spacing)
    warp_x = coarse_noise(rng, shape, warp_spacing)

    ys = (np.arange(py, dtype=np.float32) - m).reshape(nby, g)
    xs = (np.arange(px, dtype=np.float32) - m).reshape(nbx, g)
    yy = np.arange(ny, dtype=np.float32)[:, None]
    xx = np.arange(nx, dtype=np.float32)[None, :]
    cells = np.empty(shape, dtype=np.int32)
    step = max(1, _LABEL_CHUNK_VOXELS // (py * px))
    for bz in range(nbz):
        layer_end = min((bz + 1) * gz, nz)
        for z0 in range(bz * gz, layer_end, step):
            z1 = min(z0 + step, layer_end)
            zs = np.arange(z0, z1, dtype=np.float32) * np.float32(z_scale)
            nearest = _nearest_seed(
                zs, ys, xs, bz + 1, seed_z, seed_y, seed_x, slack, seed_id
            ).reshape(z1 - z0, py, px)
            # Look the partition up at displaced positions; the margin keeps
            # most lookups inside the computed region, clipping handles the rest.
            wy = sample_noise(warp_y, warp_spacing, z0, z1, ny, nx)
            wx = sample_noise(warp_x, warp_spacing, z0, z1, ny, nx)
            iy = np.rint(wy * _WARP_AMPLITUDE + (yy + m)).astype(np.intp)
            ix = np.rint(wx * _WARP_AMPLITUDE + (xx + m)).astype(np.intp)
            np.clip(iy, 0, py - 1, out=iy)
            np.clip(ix, 0, px - 1, out=ix)
            iz = np.arange(z1 - z0)[:, None, None]
            cells[z0:z1] = nearest[iz, iy, ix]
    return cells, seed_id.size


def _nearest_seed(
    zs: np.ndarray,
    ys: np.ndarray,
    xs: np.ndarray,
    pz: int,
    seed_z: np.ndarray,
    seed_y: np.ndarray,
    seed_x: np.ndarray,
    slack: np.ndarray,
    seed_id: np.ndarray,
) -> np.ndarray:
    """Nearest-seed index for sections ``zs`` of block layer ``pz``.

    ``ys``/``xs`` are the voxel coordinates reshaped to (blocks, block size),
    so a voxel's candidate seeds (the 27 blocks around its own) are shared by
    its whole block, and each squared distance is a sum of three small
    broadcast terms. Returns an array shaped (z, nby, g, nbx, g).
    """
    nby, gy = ys.shape
    nbx, gx = xs.shape
    out_shape = (zs.size, nby, gy, nbx, gx)
    best = np.full(out_shape, np.iinfo(np.int32).max, dtype=np.int32)
    dist = np.empty(out_shape, dtype=np.float32)
    bits = dist.view(np.int32)
    candidates = []
    for k, (dz, dy, dx) in enumerate(np.ndindex(3, 3, 3)):
        sel = (pz + dz - 1, slice(dy, dy + nby), slice(dx, dx + nbx))
        sz, sy, sx = seed_z[sel], seed_y[sel], seed_x[sel]
        # Power distance |v - s|^2 + slack, split into per-axis terms.
        tz = (zs[:, None, None] - sz) ** 2 + slack[sel]  # (z, nby, nbx)
        ty = (ys[:, :, None] - sy[:, None, :]) ** 2  # (nby, g, nbx)
        tx = (xs[None, :, :] - sx[:, :, None]) ** 2  # (nby, nbx, g)
        tzy = tz[:, :, None, :, None] + ty[None, :, :, :, None]
        np.add(tzy, tx[None, :, None, :, :], out=dist)
        # Non-negative floats order like their int32 bit patterns. Writing the
        # candidate number into the 5 lowest mantissa bits (a 4e-6 relative
        # change) lets one integer minimum track distance and argmin together.
        np.bitwise_and(bits, ~31, out=bits)
        np.bitwise_or(bits, k, out=bits)
        np.minimum(best, bits, out=best)
        candidates.append(seed_id[sel])
    winner = np.bitwise_and(best, 31, out=best)
    block_y = np.arange(nby)[None, :, None, None, None]
    block_x = np.arange(nbx)[None, None, None, :, None]
    return np.stack(candidates)[winner, block_y, block_x]
