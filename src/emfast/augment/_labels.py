"""Changes of the labels themselves before targets are computed from them: :class:`GrowBoundary`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from .._checks import is_integer, refusal
from .._core import targets as _targets
from .._registry import register
from ._base import Augmentation, Params, Patches


@register("augmentation")
@dataclass
class GrowBoundary(Augmentation):
    """Grow the boundaries between objects by setting their outer ``steps`` voxels to ``background``, as
    gunpowder's ``GrowBoundary`` does: every voxel not labelled ``background`` becomes ``background`` where a
    voxel at most ``steps`` steps away along the axes (``|dz| + |dy| + |dx| <= steps``: each object eroded ``steps``
    times by the axis-aligned cross) has another label, background included. Networks trained on the grown
    labels learn thicker boundaries, which split touching objects more reliably.

    It changes the labels of every example (no draws) after the geometric augmentations, in the batch's axes
    (as gunpowder's after ``SimpleAugment``: with a transpose that moves z, ``in_plane`` grows the window's y and
    x), where it is listed among the pixel-wise ones, before the targets are computed. The loader cuts the labels
    larger by ``steps`` (z: 0 with ``in_plane``; several entries add up), so that the labels it delivers, and the
    targets, equal those of the whole volume grown; windows keep that far from the labels' edge. Voxels whose
    label is unknown (``labels_valid`` 0: moved in from outside the data, or marked by an earlier
    ``Slip(labels="mask")``) are not compared with, and stay as they are.

    Parameters
    ----------
    steps : int
        How far boundaries grow into each object, in voxels along the axes, in [1, 64].
    in_plane : bool
        Grow in y and x only, each section on its own (gunpowder's ``only_xy``), for anisotropic EM.
    background : int
        The label id boundaries are set to.
    labels_mask : bool
        The sample's mask says where the labels may be used (gunpowder's ``mask``): voxels where it is 0 are not
        compared with and stay as they are, so objects do not shrink at the mask's edge. The loader then cuts the
        mask like the labels.
    """

    steps: int = 1
    in_plane: bool = False
    background: int = 0
    labels_mask: bool = False
    name: ClassVar[str] = "grow_boundary"
    draws: ClassVar[int] = 0
    pixelwise: ClassVar[bool] = True
    changes_labels: ClassVar[bool] = True

    def __post_init__(self) -> None:
        owner = "GrowBoundary"
        if not is_integer(self.steps) or not 1 <= int(self.steps) <= _targets.MAX_GROW_STEPS:
            raise refusal(f"{owner}: steps must be an integer in [1, {_targets.MAX_GROW_STEPS}], got "
                          f"{self.steps!r}", "steps")
        self.steps = int(self.steps)
        for flag in ("in_plane", "labels_mask"):
            if not isinstance(getattr(self, flag), (bool, np.bool_)):
                raise refusal(f"{owner}: {flag} must be True or False, got {getattr(self, flag)!r}", flag)
            setattr(self, flag, bool(getattr(self, flag)))
        if not is_integer(self.background):
            raise refusal(f"{owner}: background must be an integer label id, got {self.background!r}", "background")
        self.background = int(self.background)

    def label_reach(self) -> tuple[int, int, int]:
        return (0 if self.in_plane else self.steps, self.steps, self.steps)

    def check_labels(self, dtype) -> None:
        info = np.iinfo(dtype)
        if not info.min <= self.background <= info.max:
            raise refusal(f"GrowBoundary: background {self.background} cannot occur in {np.dtype(dtype)} labels "
                          f"(range [{info.min}, {info.max}])", "background")

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        return None

    def process(self, record, patches: Patches) -> None:
        labels = patches.labels
        if labels is None:
            raise ValueError("GrowBoundary: the batch has no labels to grow")
        known = patches.labels_valid
        if self.labels_mask:
            known = _within_mask(patches, known)
        _targets.grow_boundary(labels[:patches.valid], None if known is None else known[:patches.valid],
                               self.steps, self.in_plane, self.background)


def _within_mask(patches: Patches, known: Optional[np.ndarray]) -> np.ndarray:
    """1 where the label is known and the sample's mask is non-zero (the mask cut like the labels)."""
    mask = patches.mask
    if mask is None or mask.shape != patches.labels.shape or tuple(patches.mask_offset) != \
            tuple(patches.labels_offset):
        raise ValueError("GrowBoundary(labels_mask=True): the batch's mask is not cut like its labels")
    inside = np.not_equal(mask, 0).view(np.uint8)
    return inside if known is None else inside & known
