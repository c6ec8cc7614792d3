"""Affinities: for each offset, whether a voxel and its neighbour there carry the same label (gunpowder's
``seg_to_affgraph`` convention).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Sequence, Tuple

import numpy as np

from .._checks import refusal
from .._checks import is_integer as _is_integer
from .._core import targets as _targets
from .._registry import register
from ._base import Margin, Target, _check_dtype, _check_flag, _check_id, _check_label_dtype, _check_name


@register("target")
@dataclass
class Affinities(Target):
    """Affinities to neighbours at fixed offsets, with a mask of where they are known.

    Convention of gunpowder's ``seg_to_affgraph``, exactly: channel k at voxel v is the affinity between v and
    its neighbour ``v + offsets[k]``, so the usual nearest-neighbour set is ``(-1, 0, 0), (0, -1, 0),
    (0, 0, -1)`` (the default), and neighbourhoods copied from gunpowder or lsd configs mean the same here. It is
    1 where both have the same label and that label is not ``background``, else 0. Only ``background`` is
    background: gunpowder also treats negative ids (int32, int64 labels) as background, emfast treats them as ordinary
    objects; map them to ``background`` first if you rely on that. gunpowder's ``AddAffinities`` also casts labels
    to int32, so there uint32/uint64 ids from 2**31 up wrap to negative ids (background) and ids equal modulo 2**32
    merge; emfast compares the ids as stored. The mask (field ``name + "_mask"``) is 0 where the neighbour lies
    outside the label patch (unknown; the affinity is 0 there too), where either voxel is labelled ``ignore`` or
    both ``unlabelled``, else 1.

    Parameters
    ----------
    offsets : sequence of (int, int, int)
        One (dz, dy, dx) per channel, any sign, not all zero, e.g. ``((-1, 0, 0), (0, -1, 0), (0, 0, -1))`` for
        the nearest neighbours and ``(0, 0, -9)`` for a long-range one. An offset as long as the patch along an axis is
        legal: where the labels carry no margin beyond the patch (:func:`compute_targets` on a bare patch), its
        channel is then entirely masked; a loader's labels carry the offsets' margin, which it is computed from.
    background : int or None
        Label id that never has affinity, not even to itself; None for no background.
    ignore : int or None
        Label id of voxels to leave out: every affinity touching one is masked; None for none.
    dtype : {"float32", "uint8"}
        Affinity dtype (values 0 and 1). The mask is always uint8.
    name : str
        Field name of the affinities; the mask is ``name + "_mask"``.
    labels_mask : bool
        The sample's mask (``Sample(mask=...)``) says where the labels may be used, as gunpowder's
        ``AddAffinities(labels_mask=...)`` with a binary mask (it compares mask values as ids): every affinity
        touching a voxel where it is 0 is masked too. The loader then cuts the mask with the labels' margin, as
        it cuts the labels (windows fit inside the mask with that margin), and still delivers it on the output
        window; :func:`compute_targets` takes it as ``mask=``.
    unlabelled : int or None
        Label id of the region nobody annotated, as gunpowder's ``AddAffinities(unlabelled=...)`` (with its array
        0 where the labels hold this id; lsd's sparse training sets use ``unlabelled=0``): affinities between two
        such voxels are masked, while those from an object into it stay 0 and are trained on (an object ends there).
        The region is the labels' before a :class:`~emfast.GrowBoundary` (gunpowder's unlabelled array is apart from
        the labels it grows): voxels grown into background are still annotated. None for none.
    """

    offsets: Sequence[Sequence[int]] = ((-1, 0, 0), (0, -1, 0), (0, 0, -1))
    background: Optional[int] = 0
    ignore: Optional[int] = None
    dtype: str = "float32"
    name: str = "affinities"
    labels_mask: bool = False
    unlabelled: Optional[int] = None
    kind: ClassVar[str] = "affinities"

    def __post_init__(self) -> None:
        owner = "Affinities"
        if isinstance(self.offsets, (str, bytes)) or not isinstance(self.offsets, (Sequence, np.ndarray)):
            raise refusal(f"{owner}: offsets must be a sequence of (dz, dy, dx) triples, got {self.offsets!r}",
                          "offsets")
        if len(self.offsets) == 3 and all(_is_integer(d) for d in self.offsets):
            raise refusal(f"{owner}: offsets must be a sequence of (dz, dy, dx) triples; for the single offset "
                          f"{tuple(self.offsets)!r} write ({tuple(self.offsets)!r},)", "offsets")
        offsets = []
        for offset in self.offsets:
            if isinstance(offset, (str, bytes)) or not isinstance(offset, (Sequence, np.ndarray)) \
                    or len(offset) != 3:
                raise ValueError(f"{owner}: offset {offset!r} is not a (dz, dy, dx) triple of integers")
            if not all(_is_integer(d) for d in offset):
                raise ValueError(f"{owner}: offset {tuple(offset)!r} must hold integers")
            offset = tuple(int(d) for d in offset)
            if offset == (0, 0, 0):
                raise ValueError(f"{owner}: offset (0, 0, 0) links a voxel with itself; "
                                 "every offset needs a non-zero step along some axis")
            offsets.append(offset)
        if not offsets:
            raise refusal(f"{owner}: offsets must hold at least one (dz, dy, dx) triple", "offsets")
        self.offsets = tuple(offsets)
        self.background = _check_id(self.background, "background", owner, optional=True)
        self.ignore = _check_id(self.ignore, "ignore", owner, optional=True)
        self.unlabelled = _check_id(self.unlabelled, "unlabelled", owner, optional=True)
        self.dtype = _check_dtype(self.dtype, ("float32", "uint8"), owner)
        self.name = _check_name(self.name, owner)
        self.labels_mask = _check_flag(self.labels_mask, "labels_mask", owner)

    @property
    def channels(self) -> int:
        return len(self.offsets)

    @property
    def mask_name(self) -> str:
        return self.name + "_mask"

    def class_ids(self) -> Tuple[int, ...]:
        return (0, 1)

    def mask_field(self) -> str:
        return self.mask_name

    def margin(self) -> Margin:
        """The longest step along each axis: max |offset| per axis."""
        return tuple(max(abs(offset[axis]) for offset in self.offsets) for axis in range(3))

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (self.channels, np.dtype(self.dtype)), self.mask_name: (self.channels, np.dtype(np.uint8))}

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background, "ignore": self.ignore,
                                         "unlabelled": self.unlabelled}, "Affinities")

    def mask_unknown(self, valid: np.ndarray, margin: Sequence[int], out: Dict[str, np.ndarray]) -> None:
        """Mask every affinity whose voxel or neighbour is unknown (moved in from outside the data)."""
        mask = out[self.mask_name]
        for k, inner, neighbour in self._pairs(valid, margin):
            np.bitwise_and(mask[:, k], inner, out=mask[:, k])
            np.bitwise_and(mask[:, k], neighbour, out=mask[:, k])

    def compute(self, labels, margin, out, unlabelled: Optional[np.ndarray] = None) -> None:
        """As :meth:`Target.compute`; ``unlabelled`` (uint8 0/1, shaped like the labels), where given, is the
        unannotated region instead of the voxels labelled :attr:`unlabelled`."""
        affinities, mask = self._arrays(out)
        _targets.affinities(labels, self.offsets, margin, self.background, self.ignore, affinities, mask,
                            self.unlabelled if unlabelled is None else None)
        if unlabelled is not None:
            self._mask_pairs(unlabelled, margin, mask)

    def _mask_pairs(self, region: np.ndarray, margin: Sequence[int], mask: np.ndarray) -> None:
        """Mask the affinities whose voxel and neighbour both lie in ``region`` (B, 1, Zi, Yi, Xi) uint8 0/1."""
        for k, inner, neighbour in self._pairs(region, margin):
            mask[:, k] &= ~(inner & neighbour) & 1

    def _pairs(self, flags: np.ndarray, margin: Sequence[int]):
        """Per channel k, (k, flags at each output voxel, flags at its neighbour v + offsets[k], as the kernel
        compares them) for ``flags`` (B, 1, Zi, Yi, Xi) cut like the labels. A neighbour past the patch reads 0:
        its affinity is masked already (steps beyond the patch land outside it, as the kernel clamps them)."""
        extent = flags.shape[2:]
        offsets = [tuple(max(-n, min(d, n)) for d, n in zip(offset, extent)) for offset in self.offsets]
        reach = [max(0, max(abs(o[axis]) for o in offsets) - int(margin[axis])) for axis in range(3)]
        if any(reach):
            flags = np.pad(flags, [(0, 0), (0, 0)] + [(r, r) for r in reach])
        m = [int(a) + r for a, r in zip(margin, reach)]
        shape = flags.shape[2:]
        inner = flags[:, 0, m[0]:shape[0] - m[0], m[1]:shape[1] - m[1], m[2]:shape[2] - m[2]]
        for k, offset in enumerate(offsets):
            yield k, inner, flags[:, 0, m[0] + offset[0]:shape[0] - m[0] + offset[0],
                                  m[1] + offset[1]:shape[1] - m[1] + offset[1],
                                  m[2] + offset[2]:shape[2] - m[2] + offset[2]]
