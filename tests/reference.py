"""NumPy references shared by the tests: what the kernels and the loader must reproduce bit for bit."""
import itertools

import numpy as np

ALL_PERMS = [list(p) for p in itertools.permutations(range(3))]
ALL_FLIPS = [list(f) for f in itertools.product([False, True], repeat=3)]
#: The 16 transforms of anisotropic EM data: mirrors along z, y, x and the y<->x transpose.
ANISOTROPIC = [(p, f) for p in ([0, 1, 2], [0, 2, 1]) for f in ALL_FLIPS]
#: All 48 axis permutations with mirrors (isotropic data).
ISOTROPIC = [(p, f) for p in ALL_PERMS for f in ALL_FLIPS]


def extent_of(patch, perm):
    extent = [0, 0, 0]
    for j, axis in enumerate(perm):
        extent[axis] = patch[j]
    return extent


def window(source, corner, patch, perm, flips):
    """transpose(flip(crop)) of a 4-D (c, z, y, x) source: output axis j reads source axis perm[j]."""
    extent = extent_of(patch, perm)
    crop = source[(slice(None),) + tuple(slice(c, c + e) for c, e in zip(corner, extent))]
    crop = np.flip(crop, [1 + a for a in range(3) if flips[a]])
    return crop.transpose(0, *(1 + p for p in perm))


def converted(source, corner, patch, perm, flips, scale, shift, dtype):
    """The raw pipeline: window, float32, x * scale + shift in float32, cast to dtype."""
    crop = window(source, corner, patch, perm, flips)
    return (crop.astype(np.float32) * np.float32(scale) + np.float32(shift)).astype(dtype)


def random_corner(rng, shape, extent):
    return [int(rng.integers(0, s - e + 1)) for s, e in zip(shape, extent)]


def random_volume(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.random(shape) * 1000 - 200).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
