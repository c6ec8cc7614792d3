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

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from .._checks import integer as _integer, refusal
from .._checks import is_integer as _is_integer
from .._checks import label_id as _label_id
from .._checks import triple as _triple
from .._core import targets as _targets
from .._core.common import LABEL_DTYPES
from .._registry import instantiate, register

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
        is known) cut like the labels. Default: nothing, the target has no mask; the output keeps the labels'
        value there."""

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


@register("target")
@dataclass
class Affinities(Target):
    """Affinities to neighbours at fixed offsets, with a mask of where they are known.

    Convention of gunpowder's ``seg_to_affgraph``, exactly: channel k at voxel v is the affinity between v and
    its neighbour ``v + offsets[k]``, so the usual nearest-neighbour set is ``(-1, 0, 0), (0, -1, 0),
    (0, 0, -1)`` (the default), and neighbourhoods copied from gunpowder or lsd configs mean the same here. It is
    1 where both have the same label and that label is not ``background``, else 0. Only ``background`` is
    background: gunpowder also treats negative ids (int32, int64 labels) as background, emfast treats them as ordinary
    objects; map them to ``background`` first if you rely on that. The mask (field ``name + "_mask"``) is 0 where the neighbour lies outside the label patch (unknown;
    the affinity is 0 there too) or where either voxel is labelled ``ignore``, else 1.

    Parameters
    ----------
    offsets : sequence of (int, int, int)
        One (dz, dy, dx) per channel, any sign, not all zero, e.g. ``((-1, 0, 0), (0, -1, 0), (0, 0, -1))`` for
        the nearest neighbours and ``(0, 0, -9)`` for a long-range one. An offset as long as the patch along an axis is
        legal: its channel is then entirely masked.
    background : int or None
        Label id that never has affinity, not even to itself; None for no background.
    ignore : int or None
        Label id of unlabelled voxels: every affinity touching one is masked; None for none.
    dtype : {"float32", "uint8"}
        Affinity dtype (values 0 and 1). The mask is always uint8.
    name : str
        Field name of the affinities; the mask is ``name + "_mask"``.
    """

    offsets: Sequence[Sequence[int]] = ((-1, 0, 0), (0, -1, 0), (0, 0, -1))
    background: Optional[int] = 0
    ignore: Optional[int] = None
    dtype: str = "float32"
    name: str = "affinities"
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
        self.dtype = _check_dtype(self.dtype, ("float32", "uint8"), owner)
        self.name = _check_name(self.name, owner)

    @property
    def channels(self) -> int:
        return len(self.offsets)

    @property
    def mask_name(self) -> str:
        return self.name + "_mask"

    def margin(self) -> Margin:
        """The longest step along each axis: max |offset| per axis."""
        return tuple(max(abs(offset[axis]) for offset in self.offsets) for axis in range(3))

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (self.channels, np.dtype(self.dtype)), self.mask_name: (self.channels, np.dtype(np.uint8))}

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background, "ignore": self.ignore}, "Affinities")

    def mask_unknown(self, valid: np.ndarray, margin: Sequence[int], out: Dict[str, np.ndarray]) -> None:
        """Mask every affinity whose voxel or neighbour is unknown (moved in from outside the data)."""
        m = margin
        inner = valid[:, 0, m[0]:valid.shape[2] - m[0], m[1]:valid.shape[3] - m[1], m[2]:valid.shape[4] - m[2]]
        mask = out[self.mask_name]
        for k, offset in enumerate(self.offsets):
            neighbour = valid[:, 0, m[0] - offset[0]:valid.shape[2] - m[0] - offset[0],
                              m[1] - offset[1]:valid.shape[3] - m[1] - offset[1],
                              m[2] - offset[2]:valid.shape[4] - m[2] - offset[2]]
            np.bitwise_and(mask[:, k], inner, out=mask[:, k])
            np.bitwise_and(mask[:, k], neighbour, out=mask[:, k])

    def compute(self, labels, margin, out) -> None:
        affinities, mask = self._arrays(out)
        _targets.affinities(labels, self.offsets, margin, self.background, self.ignore, affinities, mask)


@register("target")
@dataclass
class Boundaries(Target):
    """Boundary map (uint8): 1 on voxels near a change of label, else 0.

    A voxel is a boundary voxel where some voxel ``t`` steps away along one axis (+z, -z, +y, -y, +x or -x),
    ``1 <= t <= thickness``, has a different label: the neighbourhood is an axis-aligned cross of radius
    ``thickness``, not a ball. Background is a label like any other, so both sides of an object's outline are
    boundary. Voxels outside the label patch do not count (cut labels with :meth:`margin` to avoid that at the
    output border).

    Parameters
    ----------
    thickness : int
        Reach of the comparison in voxels, >= 1; boundaries are ``2 * thickness`` voxels thick.
    in_plane : bool
        Compare along y and x only (anisotropic EM, where z sections are far apart).
    name : str
        Field name.
    """

    thickness: int = 1
    in_plane: bool = False
    name: str = "boundaries"
    kind: ClassVar[str] = "boundaries"

    def __post_init__(self) -> None:
        self.thickness = _check_thickness(self.thickness, "Boundaries")
        self.in_plane = _check_flag(self.in_plane, "in_plane", "Boundaries")
        self.name = _check_name(self.name, "Boundaries")

    def margin(self) -> Margin:
        return (0 if self.in_plane else self.thickness, self.thickness, self.thickness)

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (1, np.dtype(np.uint8))}

    def compute(self, labels, margin, out) -> None:
        (boundaries,) = self._arrays(out)
        _targets.boundaries(labels, margin, self.thickness, self.in_plane, boundaries)


@register("target")
@dataclass
class Classes(Target):
    """Class map: background, boundary or inside, one class id per voxel.

    ``values[0]`` where the label is ``background``; else ``values[1]`` on boundary voxels (as in
    :class:`Boundaries` with the same ``thickness`` and ``in_plane``); else ``values[2]``.

    Parameters
    ----------
    background : int or None
        Label id of the background class; None if no voxel is background.
    thickness, in_plane
        As in :class:`Boundaries`.
    values : (int, int, int)
        Class ids of (background, boundary, inside); they must fit ``dtype``.
    dtype : {"int64", "uint8"}
        Output dtype (int64 suits ``torch.nn.CrossEntropyLoss``).
    name : str
        Field name.
    """

    background: Optional[int] = 0
    thickness: int = 1
    in_plane: bool = False
    values: Sequence[int] = (0, 1, 2)
    dtype: str = "int64"
    name: str = "classes"
    kind: ClassVar[str] = "classes"

    def __post_init__(self) -> None:
        owner = "Classes"
        self.background = _check_id(self.background, "background", owner, optional=True)
        self.thickness = _check_thickness(self.thickness, owner)
        self.in_plane = _check_flag(self.in_plane, "in_plane", owner)
        self.dtype = _check_dtype(self.dtype, ("int64", "uint8"), owner)
        if isinstance(self.values, (str, bytes)) or not isinstance(self.values, (Sequence, np.ndarray)) \
                or len(self.values) != 3 or not all(_is_integer(v) for v in self.values):
            raise refusal(f"{owner}: values must be three integer class ids (background, boundary, inside), "
                          f"got {self.values!r}", "values")
        self.values = tuple(int(v) for v in self.values)
        info = np.iinfo(self.dtype)
        if not all(info.min <= v <= info.max for v in self.values):
            raise ValueError(f"{owner}: values {self.values} do not fit dtype {self.dtype}")
        self.name = _check_name(self.name, owner)

    def margin(self) -> Margin:
        return (0 if self.in_plane else self.thickness, self.thickness, self.thickness)

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (1, np.dtype(self.dtype))}

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background}, "Classes")

    def compute(self, labels, margin, out) -> None:
        (classes,) = self._arrays(out)
        _targets.classes(labels, margin, self.thickness, self.in_plane, self.background, self.values, classes)


@register("target")
@dataclass
class Foreground(Target):
    """Foreground mask (uint8): 1 where the label is not ``background``, else 0.

    Parameters
    ----------
    background : int
        Label id of the background.
    name : str
        Field name.
    """

    background: int = 0
    name: str = "foreground"
    kind: ClassVar[str] = "foreground"

    def __post_init__(self) -> None:
        self.background = _check_id(self.background, "background", "Foreground", optional=False)
        self.name = _check_name(self.name, "Foreground")

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (1, np.dtype(np.uint8))}

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background}, "Foreground")

    def compute(self, labels, margin, out) -> None:
        (foreground,) = self._arrays(out)
        _targets.foreground(labels, margin, self.background, foreground)


def _check_voxel_size(value, what: str) -> Tuple[float, float, float]:
    """Three finite numbers > 0 (z, y, x) in world units; a single number means the same along each axis."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        value = (value,) * 3
    return _triple(value, what, integer=False, minimum=0, strict=True)


@register("target")
@dataclass
class LSD(Target):
    """Local shape descriptors (Sheridan et al., Nature Methods 2023): ten float32 channels describing, around
    each voxel, the shape of the object it belongs to, with a mask of the voxels whose descriptor is defined.

    The gaussian mode of funkelab's ``lsds`` package (``get_local_shape_descriptors``), in its channel order and
    value range: each object (the voxels of one id) is weighted by a gaussian of standard deviation ``sigma``
    (world units) around the voxel, truncated at 3 sigma, and

    ========  ===========================================================================================
    0, 1, 2   mean offset (z, y, x) from the voxel to the object's weighted centre, / sigma / 2 + 1/2
    3, 4, 5   variance (z, y, x) of the object's weighted positions, / sigma**2 (floored at 1e-3 units**2)
    6, 7, 8   pearson correlation (zy, zx, yx) of those positions, / 2 + 1/2
    9         size: the share of the gaussian's weight that the object holds
    ========  ===========================================================================================

    every channel clipped to [0, 1], 0 on ``background`` and ``ignore`` voxels. Label voxels outside the patch
    belong to no object (lsds' zero padding), so values agree with ``lsds`` run on the label patch. Differences
    from ``lsds``: moments are taken about each voxel in float32/float64 rather than from absolute coordinates in
    float32, so where an object is one voxel thick along an axis (variance near 0) the pearson channels are exact
    here and rounding noise there; ``downsample`` and the ``sphere`` mode are not offered; ``background`` and
    ``ignore`` may be any ids (lsds: 0 only).

    The mask (field ``name + "_mask"``, one uint8 channel, broadcast over the ten) is 0 on ``background`` and
    ``ignore`` voxels, on voxels whose gaussian reaches past the label patch (their descriptor depends on labels
    the patch does not hold, as at the border of :func:`compute_targets` with a margin below :meth:`margin`),
    and inside a loader on voxels whose gaussian reaches an unknown label (moved in by a warp); else 1.

    Inside a loader, sigma is converted with raw's resolution along (z, y, x); a ``Transpose`` of y and x on data
    whose y and x resolutions differ swaps the labels' axes but not sigma's (as it distorts raw).

    Parameters
    ----------
    sigma : float or (float, float, float)
        Standard deviation of the gaussian (z, y, x) in world units (nm, like the voxel size), at least the
        voxel size along each axis; lsds' ``sigma``. One number means the same along each axis.
    voxel_size : (float, float, float), optional
        World units per voxel (z, y, x). Inside a :class:`~emfast.Loader` it comes from raw's resolution (and
        must match it if given); :func:`compute_targets` on bare arrays needs it.
    background : int or None
        Label id without a descriptor (lsds: 0); None for none.
    ignore : int or None
        Label id of unlabelled voxels: no descriptor, masked; the objects around them are described as if those
        voxels were not theirs. None for none.
    name : str
        Field name of the descriptors; the mask is ``name + "_mask"``.
    """

    sigma: Optional[Union[float, Sequence[float]]] = None
    voxel_size: Optional[Union[float, Sequence[float]]] = None
    background: Optional[int] = 0
    ignore: Optional[int] = None
    name: str = "lsd"
    kind: ClassVar[str] = "lsd"

    def __post_init__(self) -> None:
        owner = "LSD"
        if self.sigma is None:
            raise refusal(f"{owner}: sigma is required: the gaussian's standard deviation (z, y, x) in world "
                          "units, e.g. LSD(sigma=(80, 80, 80)) for 80 nm", "sigma")
        self.sigma = _check_voxel_size(self.sigma, f"{owner}: sigma")
        if self.voxel_size is not None:
            self.voxel_size = _check_voxel_size(self.voxel_size, f"{owner}: voxel_size")
            self._check_sigma_covers_voxels(self.voxel_size, "voxel size")
        self.background = _check_id(self.background, "background", owner, optional=True)
        self.ignore = _check_id(self.ignore, "ignore", owner, optional=True)
        self.name = _check_name(self.name, owner)

    def _check_sigma_covers_voxels(self, voxel_size: Tuple[float, float, float], what: str) -> None:
        """A gaussian narrower than a voxel sees only the voxel itself: refuse it, naming the axis and numbers."""
        for axis, (sigma, voxel) in enumerate(zip(self.sigma, voxel_size)):
            if sigma < voxel:
                raise ValueError(f"LSD: sigma {self.sigma} is below the {what} {voxel_size} along {'zyx'[axis]} "
                                 f"({sigma:g} < {voxel:g}); sigma must be at least one voxel along each axis")

    @property
    def channels(self) -> int:
        return _targets.LSD_CHANNELS

    @property
    def mask_name(self) -> str:
        return self.name + "_mask"

    def with_voxel_size(self, voxel_size, source: str) -> "LSD":
        """A copy for labels of ``voxel_size`` (raw's resolution, from ``source``); itself where its own
        ``voxel_size`` already says so."""
        if voxel_size is None:
            if self.voxel_size is None:
                raise ValueError(f"LSD: {source} states no voxel size (resolution); give LSD(voxel_size=(z, y, x)) "
                                 "in the units of sigma")
            return self
        voxel_size = _check_voxel_size(voxel_size, f"LSD: resolution of {source}")
        if self.voxel_size is not None:
            if not np.allclose(self.voxel_size, voxel_size):
                raise ValueError(f"LSD: voxel_size {self.voxel_size} does not match the resolution {voxel_size} of "
                                 f"{source}; one LSD target serves one voxel size")
            return self
        self._check_sigma_covers_voxels(voxel_size, f"resolution of {source}")
        return dataclasses.replace(self, voxel_size=voxel_size)

    def _voxel_size(self) -> Tuple[float, float, float]:
        if self.voxel_size is None:
            raise ValueError("LSD: the voxel size is unknown: give LSD(voxel_size=(z, y, x)) to compute it on bare "
                             "arrays (a Loader takes it from raw's resolution)")
        return self.voxel_size

    def sigma_voxels(self) -> Tuple[float, float, float]:
        """Sigma in voxels along (z, y, x)."""
        return tuple(s / v for s, v in zip(self.sigma, self._voxel_size()))

    def margin(self) -> Margin:
        """The gaussian's reach in voxels, int(3 sigma + 0.5) per axis (scipy's truncation, which lsds uses)."""
        return _targets.lsd_radius(self.sigma_voxels())

    def outputs(self) -> Dict[str, Tuple[int, np.dtype]]:
        return {self.name: (self.channels, np.dtype(np.float32)), self.mask_name: (1, np.dtype(np.uint8))}

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background, "ignore": self.ignore}, "LSD")

    def compute(self, labels, margin, out) -> None:
        descriptors, mask = self._arrays(out)
        # lsds floors variances at 1e-3 world units squared; the kernel works in units of sigma.
        floor = tuple(1e-3 / s ** 2 for s in self.sigma)
        _targets.lsd(labels, margin, self.sigma_voxels(), floor, self.background, self.ignore, descriptors, mask)
        reach = self.margin()
        for axis in range(3):  # voxels whose gaussian leaves the patch: their descriptor is not fully known
            cut = max(0, reach[axis] - int(margin[axis]))
            if cut:
                _along(mask, axis, slice(0, cut))[...] = 0
                _along(mask, axis, slice(mask.shape[2 + axis] - cut, None))[...] = 0

    def mask_unknown(self, valid: np.ndarray, margin: Sequence[int], out: Dict[str, np.ndarray]) -> None:
        """Mask every descriptor whose gaussian reaches an unknown label voxel."""
        reach = self.margin()
        unknown = _box_any(valid[:, 0] == 0, reach)
        m = margin
        inner = unknown[:, m[0]:valid.shape[2] - m[0], m[1]:valid.shape[3] - m[1], m[2]:valid.shape[4] - m[2]]
        mask = out[self.mask_name][:, 0]
        mask[inner] = 0


def _along(array: np.ndarray, axis: int, part: slice) -> np.ndarray:
    """The view of a (B, C, Z, Y, X) array restricted to ``part`` along spatial ``axis`` (0, 1, 2 = z, y, x)."""
    index = [slice(None)] * array.ndim
    index[2 + axis] = part
    return array[tuple(index)]


def _box_any(flags: np.ndarray, reach: Sequence[int]) -> np.ndarray:
    """Where any of ``flags`` (B, Z, Y, X) bool lies within ``reach`` voxels along each axis (a box, as the
    separable gaussian's support is): a running count along each axis in turn."""
    counts = flags.astype(np.int64)
    for axis, r in enumerate(reach):
        axis += 1
        extent = counts.shape[axis]
        total = np.cumsum(counts, axis=axis)
        padded = np.concatenate([np.zeros_like(np.take(total, [0], axis=axis)), total], axis=axis)
        hi = np.minimum(np.arange(extent) + r + 1, extent)
        lo = np.maximum(np.arange(extent) - r, 0)
        counts = np.take(padded, hi, axis=axis) - np.take(padded, lo, axis=axis)
    return counts > 0


TargetLike = Union[Target, str]


def resolve(items: Union[TargetLike, Iterable[TargetLike]]) -> list:
    """Turn targets or their names (``"affinities"``, ``"boundaries"``, ``"classes"``, ``"foreground"``, with
    default parameters; ``"lsd"`` needs its ``sigma``) into a list of :class:`Target` objects with distinct field
    names.

    Raises
    ------
    ValueError
        For an unknown name (with the closest known one), or two targets writing the same field.
    TypeError
        For an item that is neither a name nor a :class:`Target`.
    """
    resolved = instantiate(items, "target", Target)
    outputs(resolved)  # distinct field names
    return resolved


def outputs(targets: Sequence[Target]) -> Dict[str, Tuple[int, np.dtype]]:
    """All fields the targets write, {field name: (channels, dtype)}, in order; raises on a repeated name."""
    fields: Dict[str, Tuple[int, np.dtype]] = {}
    for target in targets:
        for field, spec in target.outputs().items():
            if field in fields:
                raise ValueError(f"two targets write the field {field!r}; give one of them another name=")
            fields[field] = spec
    return fields


def required_margin(targets: Sequence[Target]) -> Margin:
    """The margin to cut labels with so that every target is exact up to the output border: the largest
    :meth:`Target.margin` of the targets along each axis ((0, 0, 0) for no targets)."""
    margins = [target.margin() for target in targets]
    return tuple(max((m[axis] for m in margins), default=0) for axis in range(3))


def compute_targets(labels: np.ndarray, targets: Sequence[Target], margin: Sequence[int] = (0, 0, 0),
                    out: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """Compute ``targets`` for a label batch, each with one kernel call that releases the GIL.

    Parameters
    ----------
    labels : ndarray
        (B, 1, Zi, Yi, Xi) uint32, uint64, int64 or int32, C-contiguous; the already cropped and augmented labels.
    targets : sequence of Target
        What to compute; field names must be distinct.
    margin : (int, int, int)
        The margin the labels were cut with: output voxel (z, y, x) is label voxel (z + mz, y + my, x + mx).
        Each margin must leave at least one output voxel (2 * margin < label extent). A margin smaller than
        :func:`required_margin` is legal: neighbours outside the patch are then unknown (masked for
        affinities, not counted for boundaries).
    out : dict of ndarray, optional
        Pre-allocated C-contiguous arrays (B, channels, Zi - 2 mz, Yi - 2 my, Xi - 2 mx) of each field's dtype;
        missing fields are allocated.

    Returns
    -------
    dict of ndarray
        One array per field of :func:`outputs`.
    """
    fields = outputs(targets)
    result = dict(out) if out is not None else {}
    for field, (channels, dtype) in fields.items():
        if field not in result:
            result[field] = np.empty(_targets.output_shape(labels, margin, channels), dtype=dtype)
    for target in targets:
        target.compute(labels, margin, result)
    return result
