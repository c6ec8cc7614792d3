"""Test-time augmentation: the dihedral variants of a tile that keep z the section axis (mirrors of z, y and x,
and the y/x transpose), each predicted and transformed back before blending.

A variant is a (perm, flips) pair in the gather kernels' convention: the network sees
``transpose(flip(window, flips), perm)``; its output is undone by the inverse transpose, then the same flips.
"""
from __future__ import annotations

import itertools
from typing import List, Tuple

import numpy as np

TTA_COUNTS = (0, 4, 8, 16)
IDENTITY = ((0, 1, 2), (False, False, False))

Variant = Tuple[Tuple[int, int, int], Tuple[bool, bool, bool]]


def variants(count: int, patch_in, patch_out) -> List[Variant]:
    """The ``count`` variants, identity first: 0 (none), 4 (mirrors of y and x), 8 (mirrors of z, y and x) or 16
    (those, with and without the y/x transpose, which needs square tiles in y and x)."""
    if count not in TTA_COUNTS:
        raise ValueError(f"tta must be one of {', '.join(map(str, TTA_COUNTS))}, got {count!r}")
    if count == 0:
        return [IDENTITY]
    axes = (1, 2) if count == 4 else (0, 1, 2)
    flips = [tuple(axis in chosen for axis in range(3))
             for n in range(len(axes) + 1) for chosen in itertools.combinations(axes, n)]
    perms = [(0, 1, 2)]
    if count == 16:
        if patch_in[1] != patch_in[2] or patch_out[1] != patch_out[2]:
            raise ValueError(f"tta=16 transposes y and x, which needs patch_in and patch_out square in y and x; "
                             f"got patch_in {tuple(patch_in)}, patch_out {tuple(patch_out)}")
        perms.append((0, 2, 1))
    return [(perm, flip) for perm in perms for flip in flips]


def undo(prediction: np.ndarray, variant: Variant) -> np.ndarray:
    """The (C, z, y, x) prediction of a variant, in the volume's axes (a view)."""
    perm, flips = variant
    restored = np.transpose(prediction, (0,) + tuple(1 + perm.index(axis) for axis in range(3)))
    mirrored = tuple(1 + axis for axis in range(3) if flips[axis])
    return np.flip(restored, mirrored) if mirrored else restored
