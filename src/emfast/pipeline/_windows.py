"""Window geometry, one place for the loader, the planner, the gatherer and ``emfast check``: the input and output
windows from the loader's patch arguments, window vectors of transposed examples in source axes, and the box of
each sample where output windows fit with every field's window inside its volume.

Vectors given per output axis (a patch, a context, a margin, a field's offset) lie along source axis
``perms[n, j]`` for example n; every function here works in source axes (z, y, x) of the sample's raw volume.
"""
from __future__ import annotations

from fractions import Fraction
from typing import List, Sequence, Tuple

import numpy as np

from .._checks import patch_window
from ..sampling import Region

#: The loader arguments the windows may be given by, in the order an error about them names the first one given.
PATCH_KEYS = ("patch", "patch_in", "patch_out")


def window_extents(patch: Sequence[int], perms: np.ndarray) -> np.ndarray:
    """Per-example vectors in source axes: output axis j of length patch[j] lies along source axis perms[n, j].

    Serves for window extents and for any per-output-axis vector (context, margins) alike.
    """
    extents = np.empty(perms.shape, dtype=np.int64)
    extents[np.arange(len(perms))[:, None], perms] = np.asarray(patch, dtype=np.int64)
    return extents


def patch_windows(patch, patch_in, patch_out) -> tuple:
    """(patch_in, patch_out) from the loader's arguments."""
    if patch is not None:
        if patch_in is not None or patch_out is not None:
            raise ValueError("give either patch, or patch_in and/or patch_out, not both")
        patch_in = patch_out = patch_window(patch, "patch")
    elif patch_in is None and patch_out is None:
        raise ValueError("patch (or patch_in and patch_out) is required")
    else:
        patch_in = patch_window(patch_in if patch_in is not None else patch_out, "patch_in")
        patch_out = patch_window(patch_out if patch_out is not None else patch_in, "patch_out")
    difference = np.subtract(patch_in, patch_out)
    if np.any(difference < 0) or np.any(difference % 2):
        raise ValueError(f"patch_in {patch_in} must exceed patch_out {patch_out} by an even number of voxels along "
                         "each axis, so that the output window is centred in the input window")
    return patch_in, patch_out


def field_bounds(sample, index: int, lo: np.ndarray, hi: np.ndarray, context: np.ndarray, own: Sequence,
                 patch_out: Sequence[int], perms: np.ndarray, grid) -> Tuple[np.ndarray, np.ndarray]:
    """The box [lo, hi) of output-window corners of sample ``index`` narrowed for its fields at other voxel sizes:
    extra channels on raw's grid within their footprint (with ``context``, source axes), fields at their own voxel
    size (``own``, gatherer fields) wholly inside their voxels, and ``lo`` raised onto the common ``grid`` (step,
    phases)."""
    for placed in sample.placed_extra.values():
        if placed.grid is not None:
            lo, hi = np.maximum(lo, placed.origin + context), np.minimum(hi, placed.end - context)
    for f in own:
        first, end = f.grids[index].inside(f.sources[index].volume.shape)
        raw_patch = [int(Fraction(p) * r) for p, r in zip(f.patch, f.grids[index].ratio())]
        before = -np.asarray(f.offset, dtype=np.int64)
        after = np.asarray(raw_patch, dtype=np.int64) - np.asarray(patch_out, dtype=np.int64) - before
        lo = np.maximum(lo, first + window_extents(before, perms).max(axis=0))
        hi = np.minimum(hi, end - window_extents(after, perms).max(axis=0))
    if grid is not None:
        step, phases = grid
        lo = lo + (phases[index] - lo) % step
    return lo, hi


def fitting_regions(samples: Sequence, patch_in: tuple, patch_out: tuple, margin: tuple, perms: np.ndarray,
                    own: Sequence, grid, margins: Sequence[Tuple[str, tuple]] = (),
                    mask_margin: bool = False) -> List[Region]:
    """Per sample, the box where output windows fit with every field's window inside its volume.

    ``margin`` is the labels' margin (the targets', plus the reach of augmentations changing the labels), ``own``
    the fields at their own voxel size and ``grid`` the common grid output windows snap to (see
    :func:`field_bounds`); ``margins``, (name, margin) of each target or augmentation needing one, for the refusal
    of a sample too small; ``mask_margin``: the mask is cut with the label margin too.
    """
    context = window_extents([(i - o) // 2 for i, o in zip(patch_in, patch_out)], perms).max(axis=0)
    label_margin = window_extents(margin, perms).max(axis=0)
    extents = window_extents(patch_out, perms)
    regions = []
    for index, sample in enumerate(samples):
        lo, hi = context.copy(), np.asarray(sample.raw.shape, dtype=np.int64) - context
        labels, mask = sample.placed_labels, sample.placed_mask
        if labels is not None:
            lo, hi = np.maximum(lo, labels.origin + label_margin), np.minimum(hi, labels.end - label_margin)
        if mask is not None:
            reach = label_margin if mask_margin else 0
            lo, hi = np.maximum(lo, mask.origin + reach), np.minimum(hi, mask.end - reach)
        lo, hi = field_bounds(sample, index, lo, hi, context, own, patch_out, perms, grid)
        for perm, extent in zip(perms, extents):
            if np.any(hi - lo < extent):
                raise ValueError(_not_fitting(sample, perm, extent, patch_in, patch_out, margin, margins))
        regions.append(Region(sample.name, sample.weight, lo, hi,
                              labels=None if labels is None else labels.on_raw,
                              labels_origin=None if labels is None else labels.origin,
                              mask=None if mask is None else mask.on_raw,
                              mask_origin=None if mask is None else mask.origin))
    return regions


def _not_fitting(sample, perm, extent, patch_in: tuple, patch_out: tuple, margin: tuple,
                 margins: Sequence[Tuple[str, tuple]]) -> str:
    """Why the output window of ``perm`` (``extent`` in source axes) does not fit in ``sample``."""
    labels = sample.placed_labels
    patch_name = "patch" if patch_in == patch_out else "patch_out"
    transposed = "" if tuple(perm) == (0, 1, 2) else \
        f" (window {tuple(int(e) for e in extent)} in source axes for transposed examples)"
    grown = f", grown to patch_in {patch_in} by the network's context" if patch_in != patch_out else ""
    # named: an LSD's sigma along z was an unexplained margin on 2-D data
    owners = f" of {margins[0][0]}" if len(margins) == 1 else \
        f" ({', '.join(f'{name} {need}' for name, need in margins)})" if margins else ""
    margin_note = (f"{' and' if grown else ', grown'} by the labels' margin {margin}{owners}") \
        if any(margin) else ""
    return (f"sample {sample.name!r}: {patch_name} {patch_out}{transposed}{grown}{margin_note} does "
            f"not fit in its data (raw {sample.raw.shape}" +
            (f", labels {labels.volume.shape} at {tuple(int(v) for v in labels.origin)}"
             if labels is not None else "") + ")")
