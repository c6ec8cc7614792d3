"""Fields at other voxel sizes than raw, for the loader: their sources on raw's grid, the fields delivered at their
own voxel size, the combinations refused, and the common grid windows snap to.

On raw's grid a field at another voxel size is read through its :class:`~emfast.sampling.OnRawGrid` view and then
goes through the same gather or warp kernels as raw, so every augmentation keeps it aligned with raw.

At its own voxel size a field's window is the same world box as its window on raw's grid would be, cut from the
stored volume: each window edge must lie on the field's grid, so the patch (and its offset from the output window)
must be whole field voxels, and output windows start on the common grid of every such field (the least common
multiple of their voxel sizes, relative to their offsets, in raw voxels), as gunpowder snaps requests. Mirrors and
transposes are then exact; transposes may only swap axes of equal voxel-size ratio (else the shape would depend on
the example). Rotations, scaling and elastic deformation are refused for such fields.
"""
from __future__ import annotations

from fractions import Fraction
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .._checks import concerning
from ..sampling import FieldGrid, Placed, lcm_phase
from ._gather import Field

#: The option's name in messages (``Sample(own_resolution=...)``, YAML ``own_resolution:``).
OPTION = "own_resolution"


def raw_grid_sources(placed: Sequence[Placed]) -> List[Placed]:
    """Per sample, what a field on raw's grid is read from: the volume, or its view resampled onto raw's grid.

    Where some samples' field is resampled and others' is not, every sample's is read through a view (at raw's
    voxel size an exact one): linear views give one dtype (float32) to convert from, nearest views are written by
    the one kernel that resamples and transposes.
    """
    if any(p.grid is not None for p in placed):
        placed = [p if p.grid is not None else Placed(p.volume, p.origin, FieldGrid.identity(p.origin), p.linear)
                  for p in placed]
    return [Placed(p.on_raw, p.origin) for p in placed]


def own_field(name: str, placed: Sequence[Placed], dtype, patch: Sequence[int], offset: Sequence[int],
              perms: Sequence[Sequence[int]], **options) -> Field:
    """A field delivered at its own voxel size: its raw-grid window (``patch`` and ``offset`` in raw voxels, output
    axes) expressed in its own voxels.

    Raises
    ------
    ValueError
        A patch or offset that is not whole field voxels, or a transpose between axes of different voxel-size
        ratios, naming the field and the numbers.
    """
    grids = [p.grid if p.grid is not None else FieldGrid.identity(p.origin) for p in placed]
    ratio = grids[0].ratio()
    for perm in perms:
        if any(ratio[perm[j]] != ratio[j] for j in range(3)):
            raise ValueError(f"{name} is delivered at its own voxel size ({OPTION}), {_text(ratio)} times raw's, but "
                             f"a transpose augmentation swaps axes of different ratio (axis order {tuple(perm)}), "
                             "so its shape would differ between examples; deliver it on raw's grid or drop the "
                             "transpose")
    for what, values in (("window", patch), ("offset from the output window", offset)):
        whole = [Fraction(int(v)) / r for v, r in zip(values, ratio)]
        if any(w.denominator != 1 for w in whole):
            raise ValueError(f"{name} is delivered at its own voxel size ({OPTION}), {_text(ratio)} times raw's, but "
                             f"its {what} {tuple(int(v) for v in values)} in raw voxels is not a whole number of its "
                             "voxels; choose patch sizes (and the context or target margin around them) that are "
                             "multiples of the ratio")
    own_patch = tuple(int(Fraction(int(v)) / r) for v, r in zip(patch, ratio))
    sources = [Placed(p.volume, np.zeros(3, dtype=np.int64), g) for p, g in zip(placed, grids)]
    return Field(name, sources, dtype, own_patch, tuple(int(o) for o in offset), grids=grids, **options)


def check_own(own: Sequence[str], augmentations, targets) -> None:
    """Refuse what the fields ``own`` (delivered at their own voxel size) cannot do: warps, moved sections, and
    labels feeding targets or validity tracking (both on raw's grid)."""
    own = list(own)
    if not own:
        return
    # Each refusal is marked with the section of a config that names what it refuses.
    for augmentation in augmentations:
        if augmentation.moves_voxels:
            with concerning(section="augment"):
                raise ValueError(f"{augmentation.name} resamples off the voxel grid, which fields delivered at their "
                                 f"own voxel size ({OPTION}: {own}) do not support; deliver them on raw's grid (the "
                                 "default), or drop the augmentation")
    moving = [a.name for a in augmentations if a.moves_sections]
    if moving and set(own) - {"labels"}:  # labels are refused below, with what they cannot follow
        with concerning(section="augment"):
            raise ValueError(f"{moving} move raw's sections, and every field on raw's grid with them; fields delivered "
                             f"at their own voxel size ({OPTION}: {own}) cannot follow: deliver them on raw's grid, "
                             "or drop the augmentation")
    if "labels" in own:
        if targets:
            with concerning(section="targets"):
                raise ValueError(f"targets {[t.name for t in targets]} are computed on raw's grid; labels delivered "
                                 f"at their own voxel size ({OPTION}) cannot feed them: deliver the labels on raw's "
                                 "grid")
        moving = [a.name for a in augmentations if a.unknown_voxels]
        if moving:
            with concerning(section="augment"):
                raise ValueError(f"{moving} track which labels are known on raw's grid; labels delivered at their own "
                                 f"voxel size ({OPTION}) cannot follow them: deliver the labels on raw's grid")
        changing = [a.name for a in augmentations if a.changes_labels]
        if changing:
            with concerning(section="augment"):
                raise ValueError(f"{changing} change the labels on raw's grid; labels delivered at their own voxel "
                                 f"size ({OPTION}) cannot follow them: deliver the labels on raw's grid")


def common_grid(fields: Sequence[Field], sample_names: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(step (3,), phases (S, 3)): output windows of sample s start at raw voxels ``phases[s] + n * step`` so that
    every field at its own voxel size starts on its grid; None where nothing needs snapping."""
    own = [f for f in fields if f.grids is not None and any(max(g.coarser) > 1 for g in f.grids)]
    if not own:
        return None
    steps, phases = np.ones(3, dtype=np.int64), np.zeros((len(sample_names), 3), dtype=np.int64)
    for s, sample in enumerate(sample_names):
        for axis in range(3):
            constraints = [(f.grids[s].coarser[axis], f.grids[s].shift[axis], f.name) for f in own]
            steps[axis], phases[s, axis] = lcm_phase(constraints, f"sample {sample!r}, axis {'zyx'[axis]}")
    return steps, phases


def _text(ratio) -> str:
    return "(" + ", ".join(str(r) for r in ratio) + ")"
