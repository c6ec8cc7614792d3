"""Targets by name, their batch fields and margin, and :func:`compute_targets`.
"""
from __future__ import annotations

import copy
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from .._core import targets as _targets
from .._checks import concerning
from .._registry import instantiate
from ._base import Margin, Target


TargetLike = Union[Target, str]


def resolve(items: Union[TargetLike, Iterable[TargetLike]]) -> list:
    """Turn targets or their names (``"affinities"``, ``"boundaries"``, ``"classes"``, ``"foreground"``,
    ``"class_weights"`` (of affinities), with default parameters; ``"lsd"`` needs its ``sigma``) into a list of
    :class:`Target` objects with distinct field names: copies, bound to the targets listed before them (so an
    object given to two lists, or to two loaders, serves each with its own).

    Raises
    ------
    ValueError
        For an unknown name (with the closest known one), or two targets writing the same field.
    TypeError
        For an item that is neither a name nor a :class:`Target`.
    """
    resolved = [copy.copy(target) for target in instantiate(items, "target", Target)]
    outputs(resolved)  # distinct field names; binds the copies
    return resolved


def outputs(targets: Sequence[Target]) -> Dict[str, Tuple[int, np.dtype]]:
    """All fields the targets write, {field name: (channels, dtype)}, in order; raises on a repeated name. Each
    target is bound to the targets listed before it (:meth:`Target.bind_sources`), which refuses a field to read
    that none of them writes."""
    fields: Dict[str, Tuple[int, np.dtype]] = {}
    writers: Dict[str, Target] = {}
    for index, target in enumerate(targets):
        with concerning(item=(index, target.kind)):
            target.bind_sources(dict(writers))
        for field, spec in target.outputs().items():
            if field in fields:
                raise ValueError(f"two targets write the field {field!r}; give one of them another name=")
            fields[field] = spec
            writers[field] = target
    return fields


def required_margin(targets: Sequence[Target]) -> Margin:
    """The margin to cut labels with so that every target is exact up to the output border: the largest
    :meth:`Target.margin` of the targets along each axis ((0, 0, 0) for no targets)."""
    margins = [target.margin() for target in targets]
    return tuple(max((m[axis] for m in margins), default=0) for axis in range(3))


def compute_targets(labels: np.ndarray, targets: Union[TargetLike, Iterable[TargetLike]],
                    margin: Sequence[int] = (0, 0, 0),
                    out: Optional[Dict[str, np.ndarray]] = None,
                    valid: Optional[np.ndarray] = None, mask: Optional[np.ndarray] = None,
                    unlabelled: Optional[Dict[int, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """Compute ``targets`` for a label batch, each with one kernel call that releases the GIL.

    Parameters
    ----------
    labels : ndarray
        (B, 1, Zi, Yi, Xi) uint32, uint64, int64 or int32, C-contiguous; the already cropped and augmented labels.
    targets : Target, str, or a sequence of them
        What to compute, as the Loader takes them (names with default parameters, see :func:`resolve`); field
        names must be distinct.
    margin : (int, int, int)
        The margin the labels were cut with: output voxel (z, y, x) is label voxel (z + mz, y + my, x + mx).
        Each margin must leave at least one output voxel (2 * margin < label extent). A margin smaller than
        :func:`required_margin` is legal: neighbours outside the patch are then unknown (masked for
        affinities, not counted for boundaries).
    out : dict of ndarray, optional
        Pre-allocated C-contiguous arrays (B, channels, Zi - 2 mz, Yi - 2 my, Xi - 2 mx) of each field's dtype;
        missing fields are allocated.
    valid : ndarray, optional
        (B, 1, Zi, Yi, Xi) uint8 like the labels, 1 where the label is known and 0 where it is not (moved in from
        outside the data): each target with a mask masks what depends on an unknown label, before the targets
        listed after it (:class:`ClassWeights`) read it.
    mask : ndarray, optional
        (B, 1, Zi, Yi, Xi) like the labels, any dtype, non-zero where the labels may be used (the sample's mask, cut
        like them): the targets with ``labels_mask=True`` mask what touches a voxel where it is 0.
    unlabelled : dict of int to ndarray, optional
        {id: (B, 1, Zi, Yi, Xi), non-zero where the labels held that id before they were changed (a loader's
        :class:`~emfast.GrowBoundary` turns objects' edges into background)}: the targets with ``unlabelled=id``
        take the unlabelled region from here, as gunpowder's separate unlabelled array, not from ``labels``.

    Returns
    -------
    dict of ndarray
        One array per field of :func:`outputs`.
    """
    targets = resolve(targets)
    fields = outputs(targets)
    if out is not None and not isinstance(out, dict):
        raise TypeError(f"compute_targets: out must be a dict of field name to array, got {type(out).__name__}")
    unknown = sorted(map(str, set(out or ()) - set(fields)))
    if unknown:  # they were returned as given, as if computed (a review)
        raise ValueError(f"compute_targets: out holds {unknown}, which no target writes; the fields are "
                         f"{list(fields)}")
    if valid is not None:
        valid = _like_labels(valid, labels, "valid")
    masked = [target for target in targets if target.labels_mask]
    if masked and mask is None:
        raise ValueError(f"{type(masked[0]).__name__}(labels_mask=True) needs the labels' mask: pass mask=")
    if masked:
        mask = _like_labels(mask, labels, "mask")
    result = dict(out) if out is not None else {}
    for field, (channels, dtype) in fields.items():
        if field not in result:
            result[field] = np.empty(_targets.output_shape(labels, margin, channels), dtype=dtype)
    for target in targets:
        region = None if unlabelled is None or target.unlabelled is None else unlabelled.get(target.unlabelled)
        extra = {} if region is None else {"unlabelled": _like_labels(region, labels, "unlabelled")}
        if target.reads_valid:
            extra["valid"] = valid
        target.compute(labels, margin, result, **extra)
        if valid is not None and not target.reads_valid:
            target.mask_unknown(valid, margin, result)
        if target.labels_mask:
            target.mask_unknown(mask, margin, result)
    return result


def _like_labels(array, labels, name: str) -> np.ndarray:
    """``array`` (``valid`` or ``mask``, shaped like the labels, non-zero where known) as uint8 0 and 1."""
    array = np.asarray(array)
    if array.shape != np.shape(labels):
        raise ValueError(f"compute_targets: {name} must be shaped like the labels {np.shape(labels)} (B, 1, Zi, Yi, "
                         f"Xi), non-zero where they are known; got {array.shape}")
    return np.not_equal(array, 0).view(np.uint8)
