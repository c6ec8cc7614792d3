"""Training targets computed from label patches: affinities, boundaries, class maps, foreground masks and local
shape descriptors.

A target is a specification (no pixel work happens here); :func:`compute_targets` and each target's
:meth:`~Target.compute` run the compiled kernels of :mod:`emfast._core.targets`, which release the GIL. Targets are
computed from the already cropped and augmented label batch, so offsets and axes refer to output axes.

Geometry. Labels come as a batch (B, 1, Zi, Yi, Xi) of uint32, uint64, int64 or int32, cut with a ``margin``
(mz, my, mx) of extra voxels on each side: output voxel (z, y, x) is label voxel (z + mz, y + my, x + mx), and
every output has shape (B, channels, Zi - 2 mz, Yi - 2 my, Xi - 2 mx). Label voxels outside the patch are
unknown. A target's :meth:`~Target.margin` is the margin at which no output voxel needs an unknown neighbour;
cut labels with :func:`required_margin` of all targets to get targets that are exact up to the output border.

Example::

    targets = [Affinities(offsets=((-1, 0, 0), (0, -1, 0), (0, 0, -1))), Foreground()]
    margin = required_margin(targets)                      # (1, 1, 1)
    labels = ...                                           # (8, 1, 34, 130, 130) uint64, cut with that margin
    out = compute_targets(labels, targets, margin)         # {"affinities": (8, 3, 32, 128, 128) float32,
                                                           #  "affinities_mask": ..., "foreground": ...}
"""
from __future__ import annotations

from typing import ClassVar, Dict, Optional, Sequence, Tuple

import numpy as np

from .._checks import integer as _integer, refusal
from .._checks import label_id as _label_id
from .._core.common import LABEL_DTYPES

Margin = Tuple[int, int, int]


def _check_id(value, what: str, owner: str, optional: bool):
    """A label id (background, ignore): an integer any label dtype could hold, or None where allowed."""
    return _label_id(value, f"{owner}: {what}", optional)


def _check_thickness(value, owner: str) -> int:
    return _integer(value, f"{owner}: thickness")


def _check_flag(value, what: str, owner: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise refusal(f"{owner}: {what} must be True or False, got {value!r}", what)
    return bool(value)


def _check_dtype(value, allowed: Sequence[str], owner: str) -> str:
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in allowed:
        raise ValueError(f"{owner}: dtype must be one of {', '.join(allowed)}, got {value!r}")
    return dtype.name


def _check_name(value, owner: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ValueError(f"{owner}: name must be a non-empty identifier (it names the batch field), got {value!r}")
    return value


def _check_label_dtype(dtype, ids: Dict[str, Optional[int]], owner: str) -> None:
    dtype = np.dtype(dtype)
    if dtype not in LABEL_DTYPES:
        raise TypeError(f"{owner}: labels have dtype {dtype}; supported: "
                        f"{', '.join(str(d) for d in LABEL_DTYPES)}")
    info = np.iinfo(dtype)
    for what, value in ids.items():
        if value is not None and not info.min <= value <= info.max:
            raise refusal(f"{owner}: {what} {value} cannot occur in {dtype} labels "
                          f"(range [{info.min}, {info.max}])", what)


class Target:
    """Base class of the label-derived targets.

    Attributes
    ----------
    name : str
        The batch field the target is written to (affinities also write ``name + "_mask"``).
    channels : int
        Channels of the target's main output.
    """

    kind: ClassVar[str]
    name: str
    #: Whether the sample's mask, cut like the labels, masks this target too (see :meth:`mask_unknown`).
    labels_mask: bool = False
    #: The label id of the unannotated region, for targets that mask it (its :meth:`compute` then also takes
    #: ``unlabelled=``, the region given apart from the labels).
    unlabelled: Optional[int] = None
    #: Whether :meth:`compute` takes ``valid=`` (which labels are known) itself, in place of :meth:`mask_unknown`.
    reads_valid: ClassVar[bool] = False

    @property
    def channels(self) -> int:
        return 1

    def margin(self) -> Margin:
        """Label voxels needed on each side of the output, (mz, my, mx), so that no output voxel depends on a
        label voxel outside the patch."""
        return (0, 0, 0)

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        """The batch fields this target writes: {field name: (channels, dtype)}."""
        raise NotImplementedError

    def check(self, label_dtype) -> None:
        """Raise if the target cannot be computed from labels of ``label_dtype`` (e.g. an id out of its range)."""
        _check_label_dtype(label_dtype, {}, type(self).__name__)

    def compute(self, labels: np.ndarray, margin: Sequence[int], out: Dict[str, np.ndarray]) -> None:
        """Write the target of ``labels`` (B, 1, Zi, Yi, Xi), cut with ``margin``, into the pre-allocated arrays
        ``out[field]`` of shape (B, channels, Zi - 2 mz, Yi - 2 my, Xi - 2 mx), one per field of
        :meth:`outputs`. Runs the kernel without the GIL."""
        raise NotImplementedError

    def mask_unknown(self, valid: np.ndarray, margin: Sequence[int], out: Dict[str, np.ndarray]) -> None:
        """Mark outputs that depend on unknown labels, given ``valid`` (B, 1, Zi, Yi, Xi) uint8 (1 where the label
        is known) cut like the labels; with :attr:`labels_mask`, also called with the sample's mask as 0 and 1.
        Default: nothing, the target has no mask; the output keeps the labels' value there."""

    def bind_sources(self, writers: Dict[str, "Target"]) -> None:
        """Take the targets listed before this one ({field: the target writing it}) whose fields :meth:`compute`
        reads; raise if a field it needs is not among them or does not suit. Default: nothing, the target reads
        the labels only."""

    def class_ids(self) -> Optional[Tuple[int, ...]]:
        """The values the main output can hold where they are class ids (a binary map's 0 and 1), else None."""
        return None

    def mask_field(self) -> Optional[str]:
        """The field of the mask of where the main output is known, or None if it has none."""
        return None

    def with_voxel_size(self, voxel_size: Optional[Sequence[float]], source: str) -> "Target":
        """This target for labels of ``voxel_size`` (world units per voxel, (z, y, x); None where ``source``, the
        volume it comes from, states none). The loader calls it with each sample's raw resolution before it asks
        for the :meth:`margin`. Default: the target itself, which does not depend on the voxel size."""
        return self

    def _arrays(self, out: Dict[str, np.ndarray]) -> list:
        missing = [field for field in self.outputs() if field not in out]
        if missing:
            raise KeyError(f"{type(self).__name__}: no output array for field(s) {missing}")
        return [out[field] for field in self.outputs()]

