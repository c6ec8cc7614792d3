"""Synthetic serial-section EM volumes for demos and tests.

:func:`make_em_volume` builds an image that looks like serial-section electron
microscopy of neural tissue, together with its ground-truth neuron labels, from
numpy alone. :func:`demo_volume_path` caches one such volume as an HDF5 file so
that ``emfast demo`` runs without any user data. The generator's parts:
``_demo_cells`` (the labels), ``_demo_image`` (the raw image) and
``_demo_noise`` (smooth random fields and box filters both use).

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
from ._demo_cells import voronoi_cells
from ._demo_image import render_raw
from ._outputs import check_free_space

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
    cells, n_cells = voronoi_cells(rng, shape, anisotropy)
    raw = render_raw(rng, cells, n_cells, anisotropy)
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
            f"'{directory}' ({err.strerror or err}); "
            + ("give cache_dir (--cache-dir) a writable directory" if cache_dir is not None
               else "set EMFAST_CACHE_DIR to a writable directory")
        ) from err

    try:
        # Checked first: HDF5 cannot recover from a full disk (h5py then crashes the process, exit 139). Raw is
        # stored as it is, the labels compressed about 50 times: a byte per voxel covers them.
        check_free_space(path, 2 * math.prod(shape), f"the built-in volume {shape}",
                         "run again, or cache it elsewhere (--cache-dir, or $EMFAST_CACHE_DIR)")
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
