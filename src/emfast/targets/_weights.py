"""Loss weights that balance the classes of another target (gunpowder's ``BalanceLabels``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Sequence, Tuple

import numpy as np

from .._checks import is_integer, refusal
from .._core import targets as _targets
from .._registry import register
from ._base import Target, _check_flag, _check_name

#: How the voxels are grouped for balancing.
PER = ("example", "channel")


@register("target")
@dataclass
class ClassWeights(Target):
    """Per-voxel loss weights (float32) that balance the classes of another target, as gunpowder's
    ``BalanceLabels`` does.

    Within each example (or each channel of each example, ``per="channel"``), among the voxels the target's mask
    lets through, the fraction f_c of each class c is counted, clipped to ``clip``, and each such voxel of class c
    weighs ``1 / (classes * f_c)``; voxels outside the mask weigh 0. So each class present adds the same total
    weight to the loss, e.g. ``(weights * (prediction - affinities) ** 2).mean()``. A class absent from the mask
    weighs 0. Counts are exact (gunpowder sums the mask in float32). The weights follow whatever the loader did to
    the mask: affinities that touch voxels moved in from outside the data weigh 0, and are not counted.

    List it after the target it balances, e.g. ``targets=[Affinities(), ClassWeights("affinities")]`` (YAML:
    ``- class_weights: {of: affinities}``), for gunpowder's ``AddAffinities(...)`` followed by
    ``BalanceLabels(affinities, scales, mask=affinities_mask)``.

    Parameters
    ----------
    of : str
        The field to balance, written by a target listed before this one whose values are class ids:
        :class:`Affinities`, :class:`Boundaries`, :class:`Foreground` or :class:`Classes` (not :class:`LSD`).
    classes : int or None
        Values lie in [0, classes) (gunpowder's ``num_classes``). None: one more than the largest value the target
        writes (2 for affinities, boundaries and foreground; ``max(values) + 1`` for classes).
    mask : bool
        Count and weigh only the voxels where the target's mask (``affinities_mask``) is 1, as gunpowder's
        ``mask=affinities_mask``; for a target without a mask, the voxels whose label is known (in a loader,
        ``labels_valid``; :func:`compute_targets` without ``valid``: every voxel). False: every voxel counted.
    clip : (float or None, float or None) or None
        Bounds of the class fractions before they are inverted, in [0, 1] (gunpowder's ``clipmin`` and ``clipmax``,
        (0.05, 0.95) as there); None on a side, or ``clip=None``, leaves it unbounded.
    per : {"example", "channel"}
        Balance each example (gunpowder balances each request: one example) or each channel of each example on
        its own (gunpowder's ``slab=(1, -1, -1, -1)``).
    name : str or None
        Field name; None: ``of + "_weights"``.
    """

    of: str = "affinities"
    classes: Optional[int] = None
    mask: bool = True
    clip: Optional[Sequence[Optional[float]]] = (0.05, 0.95)
    per: str = "example"
    name: Optional[str] = None
    kind: ClassVar[str] = "class_weights"
    reads_valid: ClassVar[bool] = True

    def __post_init__(self) -> None:
        owner = "ClassWeights"
        self.of = _check_name(self.of, owner + " (of)")
        if self.classes is not None:
            if not is_integer(self.classes) or not 1 <= int(self.classes) <= _targets.MAX_BALANCED_CLASSES:
                raise refusal(f"{owner}: classes must be an integer in [1, {_targets.MAX_BALANCED_CLASSES}] or "
                              f"None, got {self.classes!r}", "classes")
            self.classes = int(self.classes)
        self.mask = _check_flag(self.mask, "mask", owner)
        self.clip = _check_clip(self.clip, owner)
        if self.per not in PER:
            raise refusal(f"{owner}: per must be one of {', '.join(map(repr, PER))}, got {self.per!r}", "per")
        self.name = _check_name(self.of + "_weights" if self.name is None else self.name, owner)
        self._source: Optional[Target] = None

    def bind_sources(self, writers: Dict[str, Target]) -> None:
        if self.of not in writers:
            raise refusal(f"ClassWeights: no target listed before it writes the field {self.of!r} it balances "
                          f"(fields before it: {', '.join(map(repr, writers)) or 'none'})", "of")
        source = writers[self.of]
        values = source.class_ids()
        if values is None or self.of != source.name:
            raise refusal(f"ClassWeights: the field {self.of!r} (written by {type(source).__name__}) does not hold "
                          "class ids; balance affinities, boundaries, foreground or classes", "of")
        if min(values) < 0:
            raise refusal(f"ClassWeights: {self.of!r} holds the negative class ids "
                          f"{sorted(v for v in set(values) if v < 0)}; the weights balance ids from 0 (give "
                          f"{type(source).__name__} values from 0)", "of")
        if self.count(source) > _targets.MAX_BALANCED_CLASSES:
            raise refusal(f"ClassWeights: {self.of!r} holds class ids up to {max(values)}, more classes than the "
                          f"{_targets.MAX_BALANCED_CLASSES} it counts; give {type(source).__name__} smaller values",
                          "of")
        if max(values) >= self.count(source):
            raise refusal(f"ClassWeights: {self.of!r} holds the classes {sorted(set(values))}, not all in [0, "
                          f"{self.count(source)}); classes= must exceed the largest", "classes")
        self._source = source

    def count(self, source: Target) -> int:
        """The number of classes: as given, or one more than the largest id ``source`` writes."""
        return self.classes if self.classes is not None else max(source.class_ids()) + 1

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (self._bound().outputs()[self.of][0], np.dtype(np.float32))}

    def _bound(self) -> Target:
        """The target balanced; raises before the targets were resolved (it has its channels and classes)."""
        if self._source is None:
            raise ValueError(f"ClassWeights: not yet bound to the target writing {self.of!r}; list it after that "
                             "target in a Loader's or compute_targets' targets (or emfast.targets.resolve)")
        return self._source

    @property
    def channels(self) -> int:
        return self.outputs()[self.name][0]

    def compute(self, labels, margin, out, valid: Optional[np.ndarray] = None) -> None:
        """As :meth:`Target.compute`; ``valid`` (uint8 0/1 shaped like the labels, where the loader tracks unknown
        labels) leaves the unknown voxels out where the balanced target has no mask of its own (boundaries,
        classes, foreground): they are not counted and weigh 0. A target's own mask already leaves them out."""
        mask_field = self._bound().mask_field() if self.mask else None
        if mask_field is not None:
            self._weigh(out, out[mask_field])
        elif self.mask and valid is not None:
            m = margin
            known = valid[:, :, m[0]:valid.shape[2] - m[0], m[1]:valid.shape[3] - m[1], m[2]:valid.shape[4] - m[2]]
            self._weigh(out, np.ascontiguousarray(known))
        else:
            self._weigh(out, None)

    def _weigh(self, out: Dict[str, np.ndarray], mask: Optional[np.ndarray]) -> None:
        (weights,) = self._arrays(out)
        low, high = self.clip if self.clip is not None else (None, None)
        _targets.balance(out[self.of], mask, self.count(self._bound()), low, high, self.per == "channel", weights)


def _check_clip(clip, owner: str):
    """``clip`` as (low or None, high or None) with 0 <= low <= high <= 1, or None."""
    if clip is None:
        return None
    if isinstance(clip, (str, bytes)) or not isinstance(clip, (Sequence, np.ndarray)) or len(clip) != 2:
        raise refusal(f"{owner}: clip must be (low, high), each a fraction or None, or None; got {clip!r}", "clip")
    bounds = []
    for bound in clip:
        if bound is None:
            bounds.append(None)
            continue
        if isinstance(bound, (bool, np.bool_)) or not isinstance(bound, (int, float, np.integer, np.floating)) \
                or not 0.0 <= float(bound) <= 1.0:
            raise refusal(f"{owner}: clip bounds must be fractions in [0, 1] or None, got {clip!r}", "clip")
        bounds.append(float(bound))
    if bounds[1] == 0.0:  # every fraction would become 0, every weight infinite
        raise refusal(f"{owner}: clip's high bound must be above 0, got {clip!r}", "clip")
    if None not in bounds and bounds[0] > bounds[1]:
        raise refusal(f"{owner}: clip's low bound {bounds[0]} exceeds its high bound {bounds[1]}", "clip")
    return tuple(bounds)
