"""The levels of a multiscale pyramid (``emfast convert --levels N``): which axes each level halves, the
downsampling rules, and each level's voxel size and offset.

Which axes: from one level to the next, an axis is halved while its voxel size is less than twice the smallest
voxel size of that level, which brings anisotropic EM volumes towards isotropic voxels: an anisotropic (40, 4, 4) nm volume is halved
in y and x only, (40, 8, 8), (40, 16, 16), (40, 32, 32), until z is within a factor 2 of the others, (80, 64, 64).
A volume without a voxel size is taken as isotropic.

How: ``mean`` (intensities) averages each 2 x 2 (x 2) block, in float64 (64-bit integers in integers, which
float64 does not hold exactly), rounded half to even for integer types; ``mode`` (labels) takes each block's most frequent value, ties going to the lowest value, so that
downsampled labels only hold ids of the level below. A block cut by the volume's far border (an odd size) uses
the voxels it has. Level k's shape is the ceiling of level k-1's over the factors.

Where: a level's voxel is centred on the block it summarises, so its OME-NGFF translation (the centre of its
first voxel) moves by (factor - 1) / 2 voxels of the level below: half a voxel for a halved axis. This is where
ome-zarr-py's own pyramids put their levels (ome/ome-zarr-py#403, #590) and what neuroglancer expects of averaged
levels (google/neuroglancer#440); the tests compare with ome-zarr-py. The level's funlib ``offset`` is the corner
of its first voxel (funlib's and emfast's meaning), which stays where level 0 starts; :func:`level_geometry` gives
the translation.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

DOWNSAMPLING = ("mean", "mode")


def default_downsampling(dtype) -> str:
    """``mode`` for 32- and 64-bit integers (label ids), ``mean`` for everything else (intensities)."""
    dtype = np.dtype(dtype)
    return "mode" if dtype.kind in "iu" and dtype.itemsize >= 4 else "mean"


def level_factors(shape: Sequence[int], resolution: Optional[Sequence[float]], levels: int,
                  name: str) -> List[Tuple[int, int, int]]:
    """The (z, y, x) factor of each level beyond the first over the one below it; ValueError naming ``name`` and
    the level if a level would halve an axis of one voxel."""
    size = [float(r) for r in (resolution or (1.0, 1.0, 1.0))]
    shape = [int(s) for s in shape]
    factors = []
    for level in range(1, levels):
        smallest = min(size)
        factor = tuple(2 if s < 2 * smallest else 1 for s in size)
        flat = [axis for axis, f in zip("zyx", factor) if f == 2 and shape["zyx".index(axis)] < 2]
        if flat:
            raise ValueError(f"levels={levels} is too many for {name}: level {level} would halve the axis "
                             f"{', '.join(flat)} of level {level - 1}, which is {shape['zyx'.index(flat[0])]} voxel "
                             f"wide (shape {tuple(shape)}); at most {level} levels")
        factors.append(factor)
        size = [s * f for s, f in zip(size, factor)]
        shape = [-(-s // f) for s, f in zip(shape, factor)]
    return factors


def level_geometry(resolution: Optional[Sequence[float]], offset: Optional[Sequence[float]], factor) -> tuple:
    """The voxel size and OME-NGFF translation (z, y, x nm) of the level made from one of ``resolution`` and
    translation ``offset`` by ``factor``; a source without a voxel size counts as 1 per axis."""
    size = [float(r) for r in (resolution or (1.0, 1.0, 1.0))]
    start = [float(o) for o in (offset or (0.0, 0.0, 0.0))]
    return ([s * f for s, f in zip(size, factor)], [o + (f - 1) / 2 * s for o, s, f in zip(start, size, factor)])


#: Bytes of the source downsampled at once (see :func:`downsample`): its temporaries take about 7 times as many.
DOWNSAMPLE_SLAB_BYTES = 4 * 2 ** 20


def downsample(data: np.ndarray, factor, rule: str) -> np.ndarray:
    """``data`` (its last three axes z, y, x) downsampled by ``factor`` with ``rule`` (``mean`` or ``mode``), a few
    output sections at a time: done whole, a 256 MiB tile's padded copy, masks and blocks took 1.8 GiB more (a
    pyramid's conversion peaked at 8 times ``tile_bytes``). Each output voxel depends on its own block alone, so
    the sections are what the whole would give."""
    factor = tuple(int(f) for f in factor)
    out_shape = tuple(-(-s // f) for s, f in zip(data.shape[-3:], factor))
    plane = max(1, data[..., :factor[0], :, :].nbytes)  # the source of one output section
    step = max(1, DOWNSAMPLE_SLAB_BYTES // plane)
    if step >= out_shape[0]:
        return _downsampled(data, factor, rule)
    out = np.empty(data.shape[:-3] + out_shape, data.dtype)
    for z in range(0, out_shape[0], step):
        out[..., z:z + step, :, :] = _downsampled(data[..., z * factor[0]:(z + step) * factor[0], :, :], factor, rule)
    return out


def _downsampled(data: np.ndarray, factor: Tuple[int, ...], rule: str) -> np.ndarray:
    """:func:`downsample` of ``data`` whole."""
    lead = data.shape[:-3]
    out_shape = tuple(-(-s // f) for s, f in zip(data.shape[-3:], factor))
    padded = np.zeros(lead + tuple(o * f for o, f in zip(out_shape, factor)), data.dtype)
    valid = np.zeros(padded.shape[-3:], bool)
    box = tuple(slice(0, s) for s in data.shape[-3:])
    padded[(...,) + box] = data
    valid[box] = True
    # (lead..., Z, fz, Y, fy, X, fx) -> (lead..., Z, Y, X, fz * fy * fx): each output voxel's block on one axis
    split = lead + tuple(x for o, f in zip(out_shape, factor) for x in (o, f))
    n = len(lead)
    order = tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3, n + 5)
    blocks = padded.reshape(split).transpose(order).reshape(lead + out_shape + (-1,))
    mask = valid.reshape(split[n:]).transpose(0, 2, 4, 1, 3, 5).reshape(out_shape + (-1,))
    if rule == "mean" and data.dtype.kind in "iu" and data.dtype.itemsize == 8:
        return _exact_mean(blocks, mask, data.dtype)
    if rule == "mean":
        total = np.where(mask, blocks, 0).sum(axis=-1, dtype=np.float64)
        mean = total / mask.sum(axis=-1)
        if data.dtype.kind in "iub":
            mean = np.rint(mean)
        return mean.astype(data.dtype)
    # mode: count each entry's value among the block's valid entries; the most frequent, ties to the lowest
    same = (blocks[..., :, None] == blocks[..., None, :]) & mask[..., None, :]
    counts = np.where(mask, same.sum(axis=-1), -1)
    best = counts == counts.max(axis=-1, keepdims=True)
    highest = np.iinfo(data.dtype).max if data.dtype.kind in "iu" else np.inf
    return np.where(best, blocks, np.array(highest, data.dtype)).min(axis=-1).astype(data.dtype)


def _exact_mean(blocks: np.ndarray, mask: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The mean of each block's valid entries (last axis), rounded half to even, for 64-bit integers, which float64
    holds only to 53 bits (2**64 - 1 averaged to 0): each value is split as q * n + r (0 <= r < n, n the block's
    count), so that the sums stay in the dtype's range: mean = sum(q) + sum(r) / n."""
    count = np.maximum(mask.sum(axis=-1), 1).astype(dtype)  # every block holds one voxel at least
    quotient = np.where(mask, blocks // count[..., None], 0).sum(axis=-1, dtype=dtype)
    remainder = np.where(mask, blocks % count[..., None], 0).sum(axis=-1, dtype=dtype)
    mean = quotient + remainder // count
    left = remainder % count  # the fraction left / count, rounded half to even
    up = (2 * left > count) | ((2 * left == count) & (mean % 2 == 1))
    return (mean + up.astype(dtype)).astype(dtype)
