"""Synthetic serial-section EM volumes for demos and tests.

:func:`make_em_volume` builds an image that looks like serial-section electron
microscopy of neural tissue, together with its ground-truth neuron labels, from
numpy alone. :func:`demo_volume_path` caches one such volume as an HDF5 file so
that ``emfast demo`` runs without any user data.

How the volume is made
----------------------
* Cells are a power-weighted Voronoi partition of jittered grid seeds. The
  distance metric shrinks z so that cells are several times longer along z
  (neurites run through many sections) than across, in physical units.
  Each voxel only looks at the seeds of the 27 grid blocks around it, and the
  block layout makes the squared distance separable, so the search costs a
  few array passes per candidate block.
* The partition is then warped in-plane by a smooth random displacement, which
  turns the straight Voronoi facets into curved membranes.
* Intensity: a mean grey level per cell, smooth cytoplasm texture, dark
  membranes where the label changes between in-plane neighbours (fainter where
  it changes between sections, as oblique membranes look in thick sections),
  dark organelle-like blobs, a slight blur, per-section brightness changes and
  Gaussian noise.
"""

from __future__ import annotations

import math
import numbers
import os
import secrets
from pathlib import Path

import h5py
import numpy as np

from .._machine import cache_directory

__all__ = [
    "DEMO_FORMAT_VERSION",
    "LABELS_DATASET",
    "RAW_DATASET",
    "XY_RESOLUTION_NM",
    "demo_volume_path",
    "make_em_volume",
]

#: Dataset holding the uint8 EM image in the demo file.
RAW_DATASET = "volumes/raw"
#: Dataset holding the uint64 neuron ids in the demo file.
LABELS_DATASET = "volumes/labels/neuron_ids"
#: Bumped whenever the generator or file layout changes, so stale caches are
#: never picked up (it is part of the cache file name).
DEMO_FORMAT_VERSION = 1
#: In-plane voxel size, in nanometres, written to the ``resolution`` attribute.
XY_RESOLUTION_NM = 8.0

_DEFAULT_SHAPE = (96, 384, 384)
_DEFAULT_ANISOTROPY = 5.0
_MIN_DIM = 8
_CHUNKS = (16, 128, 128)

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

# Grey levels (0-255) and their spread.
_CELL_MEAN, _CELL_MEAN_SD = 165.0, 16.0
_MEMBRANE_LEVEL = 55.0
_Z_MEMBRANE_STRENGTH = 0.35  # oblique membranes are smeared over a section, so fainter
_TEXTURE_COARSE, _TEXTURE_FINE = 9.0, 5.0
_BLOB_LEVEL = 75.0
_BLOB_DENSITY = 2e-4  # blobs per voxel: a few per cell profile
_NOISE_SD = 9.0
_SECTION_GAIN_SD, _SECTION_OFFSET_SD = 0.04, 4.0

# Work sizes that bound temporary memory independently of the volume size.
_LABEL_CHUNK_VOXELS = 1 << 18
_RAW_SLAB_SECTIONS = 8


def make_em_volume(
    shape: tuple[int, int, int] = _DEFAULT_SHAPE,
    seed: int = 0,
    anisotropy: float = _DEFAULT_ANISOTROPY,
) -> tuple[np.ndarray, np.ndarray]:
    """Make a synthetic serial-section EM volume and its neuron labels.

    Parameters
    ----------
    shape : tuple of int
        Volume shape ``(z, y, x)``; three integers, each at least 8.
    seed : int
        Seed for :func:`numpy.random.default_rng`; the same seed (and the same
        other arguments) gives identical arrays.
    anisotropy : float
        Size of one z step relative to the in-plane voxel size (5.0 matches
        40 nm sections imaged at 8 nm). Cells are elongated along z in
        physical units, so they span fewer voxels in z than in y and x.

    Returns
    -------
    raw : numpy.ndarray
        ``uint8`` array of ``shape``: the EM-like image, with bright cells,
        dark membranes and organelles.
    labels : numpy.ndarray
        ``uint64`` array of ``shape``: neuron id of every voxel, consecutive
        from 1 (there is no background).

    Raises
    ------
    ValueError
        If ``shape`` is not three integers each >= 8, or ``anisotropy`` is not
        a finite positive number.

    Notes
    -----
    The default shape takes about 2 s on one core. Besides the returned
    arrays (9 bytes per voxel), work memory is 4 bytes per voxel plus
    per-slab buffers of a few tens of megabytes for 384 x 384 sections.
    """
    shape = _validate_shape(shape)
    anisotropy = _validate_anisotropy(anisotropy)
    rng = np.random.default_rng(seed)
    # Seed indices of the Voronoi cells; int32 halves memory against uint64
    # while the intensity pass runs.
    cells, n_cells = _voronoi_cells(rng, shape, anisotropy)
    raw = _render_raw(rng, cells, n_cells, anisotropy)
    # Warping and clipping hide some cells entirely; renumber the visible
    # ones 1..n so ids carry no gaps.
    present = np.bincount(cells.ravel(), minlength=n_cells) > 0
    lut = np.zeros(n_cells, dtype=np.uint64)
    lut[present] = np.arange(1, int(present.sum()) + 1, dtype=np.uint64)
    labels = lut[cells]
    return raw, labels


def demo_volume_path(
    cache_dir: str | os.PathLike[str] | None = None,
    shape: tuple[int, int, int] = _DEFAULT_SHAPE,
    seed: int = 0,
) -> Path:
    """Return the path of a cached HDF5 demo volume, writing it if missing.

    The file holds :data:`RAW_DATASET` (``uint8``) and
    :data:`LABELS_DATASET` (``uint64``), made by :func:`make_em_volume` with
    the default anisotropy. Both datasets carry ``resolution`` (z, y, x in
    nanometres, float64) and ``offset`` (float64 zeros) attributes.

    Parameters
    ----------
    cache_dir : str or os.PathLike, optional
        Directory for the file. Defaults to ``$EMFAST_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/emfast``, else ``~/.cache/emfast``. Created if
        missing.
    shape : tuple of int
        Volume shape ``(z, y, x)``, each at least 8.
    seed : int
        Seed of the volume.

    Returns
    -------
    pathlib.Path
        Path of the HDF5 file. Its name encodes the format version, the shape
        and the seed, e.g. ``demo-v1-96x384x384-s0.h5``, so different volumes
        never collide.

    Raises
    ------
    ValueError
        If ``shape`` or ``seed`` is invalid.
    OSError
        If the cache directory cannot be created or written to.

    Notes
    -----
    The file is written to a temporary name in the same directory and moved
    into place with :func:`os.replace`, so an interrupted run never leaves a
    partial file under the final name, and concurrent callers are safe.
    """
    shape = _validate_shape(shape)
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    directory = cache_directory(cache_dir)
    name = f"demo-v{DEMO_FORMAT_VERSION}-{'x'.join(map(str, shape))}-s{seed}.h5"
    path = directory / name
    if path.is_file():
        return path

    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Hidden, unique temporary name: concurrent writers never clash and a
        # leftover from a killed run is never mistaken for the cache file.
        tmp = directory / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        open(tmp, "xb").close()
    except OSError as err:
        raise OSError(
            f"cannot write the emfast demo volume to cache directory "
            f"'{directory}' ({err.strerror or err}); set EMFAST_CACHE_DIR to a "
            f"writable directory"
        ) from err

    try:
        raw, labels = make_em_volume(shape, seed)
        _write_demo_file(tmp, raw, labels, seed)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_demo_file(tmp: Path, raw: np.ndarray, labels: np.ndarray, seed: int) -> None:
    """Write the demo datasets to ``tmp`` and flush them to disk."""
    resolution = np.array(
        [XY_RESOLUTION_NM * _DEFAULT_ANISOTROPY, XY_RESOLUTION_NM, XY_RESOLUTION_NM],
        dtype=np.float64,
    )
    offset = np.zeros(3, dtype=np.float64)
    # HDF5 refuses chunks larger than a fixed-size dataset.
    chunks = tuple(min(c, s) for c, s in zip(_CHUNKS, raw.shape))
    with h5py.File(tmp, "w") as f:
        f.attrs["emfast_demo_version"] = DEMO_FORMAT_VERSION
        f.attrs["seed"] = seed
        # Raw EM is noise-dominated and barely compresses; keep it fast to read.
        dsets = [
            f.create_dataset(RAW_DATASET, data=raw, chunks=chunks),
            # Labels are piecewise constant: shuffle + gzip-1 shrinks them
            # ~50x and still decodes quickly with any HDF5 reader.
            f.create_dataset(
                LABELS_DATASET,
                data=labels,
                chunks=chunks,
                compression="gzip",
                compression_opts=1,
                shuffle=True,
            ),
        ]
        for dset in dsets:
            dset.attrs["resolution"] = resolution
            dset.attrs["offset"] = offset
    # Make the data durable before the rename publishes it.
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())


def _validate_shape(shape: object) -> tuple[int, int, int]:
    """Return ``shape`` as three ints >= 8, or raise ValueError naming it."""
    try:
        dims = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"shape must be a sequence of 3 integers, got {shape!r}"
        ) from None
    if len(dims) != 3 or not all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims
    ):
        raise ValueError(f"shape must be a sequence of 3 integers, got {shape!r}")
    if any(d < _MIN_DIM for d in dims):
        raise ValueError(
            f"every dimension of shape must be >= {_MIN_DIM}, got {shape!r}"
        )
    return (int(dims[0]), int(dims[1]), int(dims[2]))


def _validate_anisotropy(anisotropy: object) -> float:
    """Return ``anisotropy`` as a finite positive float, or raise ValueError."""
    if isinstance(anisotropy, bool) or not isinstance(anisotropy, numbers.Real):
        raise ValueError(f"anisotropy must be a positive number, got {anisotropy!r}")
    value = float(anisotropy)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"anisotropy must be a positive number, got {anisotropy!r}")
    return value


def _voronoi_cells(
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
    warp_y = _coarse_noise(rng, shape, warp_spacing)
    warp_x = _coarse_noise(rng, shape, warp_spacing)

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
            wy = _sample_noise(warp_y, warp_spacing, z0, z1, ny, nx)
            wx = _sample_noise(warp_x, warp_spacing, z0, z1, ny, nx)
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


def _render_raw(
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
    coarse_tex = _coarse_noise(rng, cells.shape, coarse_spacing)
    fine_tex = _coarse_noise(rng, cells.shape, fine_spacing)
    gain = 1.0 + _SECTION_GAIN_SD * rng.standard_normal(nz)
    offset = _SECTION_OFFSET_SD * rng.standard_normal(nz)
    blobs = _make_blobs(rng, cells.shape, anisotropy)

    raw = np.empty(cells.shape, dtype=np.uint8)
    for z0 in range(0, nz, _RAW_SLAB_SECTIONS):
        z1 = min(z0 + _RAW_SLAB_SECTIONS, nz)
        lab = cells[z0:z1]
        img = cell_mean[lab]
        texture = _TEXTURE_COARSE * _sample_noise(
            coarse_tex, coarse_spacing, z0, z1, ny, nx
        )
        texture += _TEXTURE_FINE * _sample_noise(fine_tex, fine_spacing, z0, z1, ny, nx)
        texture *= cell_texture[lab]
        img += texture
        membrane = _membrane_strength(cells, z0, z1)
        img += (_MEMBRANE_LEVEL - img) * membrane
        _draw_blobs(img, lab, blobs, z0, z1)
        # Slight in-plane blur with the [1, 2, 1] / 4 kernel.
        for axis in (1, 2):
            img = 0.25 * img + 0.75 * _box_filter(img, 3, axis)
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
        soft = _box_filter(soft, 3, axis)
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


def _coarse_noise(
    rng: np.random.Generator,
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
) -> np.ndarray:
    """White noise on a grid ``spacing`` voxels apart that covers ``shape``."""
    coarse = tuple(int((n - 1) / s) + 2 for n, s in zip(shape, spacing))
    return rng.standard_normal(coarse, dtype=np.float32)


def _sample_noise(
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


def _box_filter(a: np.ndarray, size: int, axis: int) -> np.ndarray:
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
