"""The augmentation protocol: per-example parameters (:class:`Params`), the arrays pixel-wise augmentations change
(:class:`Patches`), the :class:`Augmentation` base class with its capabilities, and name resolution.

An augmentation turns uniform draws into transform parameters for a whole batch at once. The geometric ones
compose into one of the 48 axis permutations/mirrors per example (which the gather kernel applies while
cropping) or into a warp; linear intensity changes compose into the per-example scale and shift the kernel
applies while converting. Raw and labels share the geometry; only raw gets the intensity change.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import ClassVar, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from .._checks import concerning, refusal
from .._registry import instantiate

AXES = "zyx"


@dataclass
class Params:
    """Per-example transform parameters of one batch.

    The output of example n is ``transpose(flip(window, flips[n]), perms[n])``, its raw intensities then mapped
    as ``x * gain[n] + bias[n]`` after normalisation. ``flips`` are in source axes (z, y, x); output axis j
    reads source axis ``perms[n][j]``. ``matrix`` (B, 3, 3) holds the rotation/scale of the warp augmentations
    and ``elastic`` their control grid (B, 3, gz, gy, gx) float32 with ``elastic_spacing`` (output voxels between
    control points), or None; see :mod:`emfast.augment._geometry` (``full_matrix`` composes them with
    perms/flips).
    """

    perms: np.ndarray
    flips: np.ndarray
    gain: np.ndarray
    bias: np.ndarray
    matrix: Optional[np.ndarray] = None
    elastic: Optional[np.ndarray] = None
    elastic_spacing: Optional[tuple] = None

    def __post_init__(self) -> None:
        if self.matrix is None:
            self.matrix = np.tile(np.eye(3), (len(self.perms), 1, 1))

    @classmethod
    def identity(cls, examples: int) -> "Params":
        return cls(
            perms=np.tile(np.arange(3, dtype=np.int64), (examples, 1)),
            flips=np.zeros((examples, 3), dtype=bool),
            gain=np.ones(examples),
            bias=np.zeros(examples),
        )


def _parse_axes(axes: str, owner: str) -> tuple[int, ...]:
    if not isinstance(axes, str) or not axes or any(a not in AXES for a in axes) or len(set(axes)) != len(axes):
        raise refusal(f"{owner}: axes must be distinct letters from 'zyx', got {axes!r}", "axes")
    return tuple(AXES.index(a) for a in axes)


def _require_isotropic(owner: str, axes: str, isotropic: bool, effect: str) -> None:
    """Refuse an augmentation over ``axes`` that include z on anisotropic data; ``effect`` says what it would do."""
    if "z" in axes and not isotropic:
        raise ValueError(f"{owner}(axes={axes!r}) {effect}; pass isotropic=True to the Loader if z has the same "
                         "resolution as y and x")


def _check_probability(p: float, owner: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise refusal(f"{owner}: probability p must be in [0, 1], got {p!r}", "p")
    return float(p)


@dataclass
class Patches:
    """The arrays of one batch that pixel-wise augmentations change, after the geometry has been applied.

    Attributes
    ----------
    raw : ndarray, (B, C, Z, Y, X) float32 or float16
        The converted, normalised raw input windows.
    labels : ndarray or None, (B, 1, Zl, Yl, Xl)
        The label windows (before targets are computed from them).
    labels_offset : (int, int, int)
        Position of ``labels[:, :, 0, 0, 0]`` in the raw window's output coordinates (negative when the label
        window, cut with a target margin, reaches beyond the raw window). Section z of labels is section
        ``z + labels_offset[0]`` of raw.
    labels_valid : ndarray or None, uint8, shaped like ``labels``
        1 where the label is known, 0 where it is not (e.g. shifted in from outside); None when not tracked.
    valid : int
        Examples at the front of the batch that are real.
    mask : ndarray or None, (B, 1, Zm, Ym, Xm)
        The training mask's windows, which gate the labels: an augmentation that moves labels moves it too.
    mask_offset : (int, int, int)
        Position of ``mask[:, :, 0, 0, 0]`` in the raw window's output coordinates, as ``labels_offset``.
    extras : tuple of ndarray
        The extra input channels' windows on raw's grid, (B, Ce, Z, Y, X) each, cut like raw: an augmentation
        that moves raw's sections moves them too.
    """

    raw: np.ndarray
    labels: Optional[np.ndarray] = None
    labels_offset: tuple = (0, 0, 0)
    labels_valid: Optional[np.ndarray] = None
    valid: int = 0
    mask: Optional[np.ndarray] = None
    mask_offset: tuple = (0, 0, 0)
    extras: tuple = ()


@dataclass(frozen=True)
class Windows:
    """The window sizes an augmentation may have to fit (see :meth:`Augmentation.bind_windows`).

    Attributes
    ----------
    largest : (int, int, int)
        The largest window of any field of an example (z, y, x), e.g. raw with its context.
    raw_section : (int, int)
        The (y, x) extent of a raw window's section as the batch holds it (a transpose changes what is read into
        it, not its shape).
    raw_sections : int
        The sections (z extent) of a raw window as the batch holds it.
    """

    largest: Tuple[int, int, int]
    raw_section: Tuple[int, int]
    raw_sections: int


class Augmentation:
    """Base class: ``draws`` uniforms per example in, parameters updated in place.

    Geometric and linear-intensity augmentations fold into :class:`Params` in :meth:`apply`, which the gather
    kernels apply while cropping. Pixel-wise augmentations (noise, blur, section defects) also return a record
    of their draws from :meth:`apply`; the loader then calls :meth:`process` with that record on the cropped
    batch, in the order the augmentations were listed.

    The pipeline never asks which class an augmentation is, only its capabilities:

    - ``pixelwise``: it changes the cropped batch in :meth:`process`;
    - ``moves_voxels``: it resamples off the voxel grid (rotation, scaling, elastic), so a batch it moved is
      sampled through the warp kernels, not cut by the gather kernels; Mirror and Transpose only permute the
      grid and fold into the gather kernels' steps;
    - ``unknown_voxels``: it can bring voxels from outside the data into a window, so the loader tracks which
      labels are known (``labels_valid``) and masks affinities that touch unknown ones;
    - ``moves_sections``: it moves whole z-sections of raw in y and x, and every field on raw's grid with them
      (extra channels, labels and mask), which fields delivered at their own voxel size cannot follow;
    - ``changes_labels``: it changes the labels from their neighbours up to :meth:`label_reach` away, so the
      loader needs labels and cuts them larger by that reach (with the mask, where ``labels_mask`` is set);
    - :meth:`bind_windows`: what it must size or check against the windows before drawing.
    """

    name: ClassVar[str]
    draws: ClassVar[int]
    pixelwise: ClassVar[bool] = False
    moves_voxels: ClassVar[bool] = False
    unknown_voxels: ClassVar[bool] = False
    moves_sections: ClassVar[bool] = False
    changes_labels: ClassVar[bool] = False
    #: Whether it reads the sample's mask wherever it reads the labels (the mask is then cut like them).
    labels_mask: bool = False

    def check(self, isotropic: bool) -> None:
        """Raise if this augmentation is not allowed for the data (anisotropic unless ``isotropic``)."""

    def exchanged_axes(self) -> str:
        """The axes whose voxels this augmentation moves onto each other (permutes, rotates among), which must be
        of one size in the world (default: none)."""
        return ""

    def isotropic_axes(self) -> str:
        """The axes whose voxels must be of one size in the world for this augmentation (default: those it
        exchanges, :meth:`exchanged_axes`)."""
        return self.exchanged_axes()

    @property
    def moves_labels(self) -> bool:
        """Whether it moves labels from one voxel to another (a section mover that keeps the labels in place and
        marks them unknown does not)."""
        return self.moves_sections

    def label_reach(self) -> tuple[int, int, int]:
        """How far (z, y, x) the labels it changes depend on their neighbours (default: not at all)."""
        return (0, 0, 0)

    def check_labels(self, dtype) -> None:
        """Raise if it cannot change labels of ``dtype`` (e.g. an id out of its range; default: nothing)."""

    def bind_windows(self, windows: Windows) -> None:
        """Size what depends on the windows, or raise if the windows do not suit it (default: nothing)."""

    def apply(self, uniforms: np.ndarray, params: Params):
        """Draw this batch's parameters from ``uniforms`` (B, draws); fold them into ``params`` and/or return a
        record for :meth:`process`."""
        raise NotImplementedError

    def process(self, record, patches: Patches) -> None:
        """Change ``patches`` in place according to ``record`` (pixel-wise augmentations only)."""
        raise NotImplementedError(f"{type(self).__name__} is not a pixel-wise augmentation")

    def permutations(self) -> list[tuple[int, ...]]:
        """Axis orders this augmentation can produce from the identity (for sizing windows)."""
        return [(0, 1, 2)]


AugmentationLike = Union[Augmentation, str]


def resolve(items: Iterable[AugmentationLike], isotropic: bool) -> list[Augmentation]:
    """Turn a list of augmentations or their registered names into checked augmentation objects.

    Raises
    ------
    ValueError
        For an unknown name (with the closest known one), or an augmentation the data does not allow.
    TypeError
        For an item that is neither a name nor an :class:`Augmentation`.
    """
    resolved = instantiate(items, "augmentation", Augmentation)
    for augmentation in resolved:
        augmentation.check(isotropic)
    return resolved


#: How much voxel sizes along exchanged axes may differ, relatively (metadata rounded to a few digits).
VOXEL_SIZE_TOLERANCE = 0.01


def check_voxel_sizes(augmentations: Sequence[Augmentation], resolution, where: str) -> None:
    """Refuse an augmentation that moves voxels of different sizes onto each other (:meth:`Augmentation.
    isotropic_axes`) where ``where`` is a sample whose raw has voxel size ``resolution`` (z, y, x; None: not
    known, nothing checked): the kernels work in voxels, so swapping or rotating voxels 4 nm and 8 nm wide
    distorts every window in the world. The Loader's ``isotropic=True`` allows mixing z with y and x, but not
    where the data's own voxel size says z differs (a review: (40, 4, 4) nm windows were transposed)."""
    if resolution is None:
        return
    sizes = dict(zip(AXES, (float(v) for v in resolution)))
    for index, augmentation in enumerate(augmentations):
        with concerning(item=(index, augmentation.name)):
            _check_voxel_sizes(augmentation, sizes, resolution, where)


def _check_voxel_sizes(augmentation: Augmentation, sizes: dict, resolution, where: str) -> None:
    axes = augmentation.isotropic_axes()
    unequal = [(a, b) for a in axes for b in axes
               if sizes[a] > sizes[b] * (1 + VOXEL_SIZE_TOLERANCE)]
    if not unequal:
        return
    owner = f"{type(augmentation).__name__}(axes={axes!r})"
    exchanged = augmentation.exchanged_axes()
    if "y" in exchanged and "x" in exchanged and (("y", "x") in unequal or ("x", "y") in unequal):
        raise refusal(f"{owner} moves y and x voxels onto each other, but {where} has voxel size "
                      f"{tuple(resolution)} nm, {sizes['y']:g} nm along y and {sizes['x']:g} along x: its "
                      "windows would be distorted; leave it out of augment (the Loader's default holds "
                      "'transpose': augment=['mirror'] keeps the mirrors), or resample the data to square "
                      "sections", "axes")
    effect = "mixes z with y/x" if "z" in exchanged else "resamples z with y/x"
    raise refusal(f"{owner} {effect}, which isotropic=True allows for data of one voxel size along every axis, "
                  f"but {where} has voxel size {tuple(resolution)} nm: its windows would be distorted; leave z "
                  "out of the augmentation's axes", "axes")


def check_fills(augmentations: Sequence[Augmentation], dtype) -> None:
    """Refuse a section defect's ``fill`` that the batches' ``dtype`` holds only as infinity: 1e300 in float32
    batches became inf, silently (a review)."""
    for index, augmentation in enumerate(augmentations):
        with concerning(item=(index, augmentation.name)):
            _check_fill(augmentation, np.dtype(dtype))


def _check_fill(augmentation: Augmentation, dtype: np.dtype) -> None:
    fill = getattr(augmentation, "fill", None)
    if fill is None:
        return
    with np.errstate(over="ignore"):
        stored = dtype.type(fill)
    if not np.isfinite(stored):
        raise refusal(f"{type(augmentation).__name__}: fill {fill!r} is beyond the range of the batches' dtype "
                      f"{dtype.name} (at most {float(np.finfo(dtype).max):g} in magnitude)", "fill")


def reachable_permutations(augmentations: Sequence[Augmentation]) -> set[tuple[int, ...]]:
    """All axis orders the augmentations can produce together."""
    perms = {(0, 1, 2)}
    for augmentation in augmentations:
        perms = {tuple(p[i] for i in q) for p in perms for q in augmentation.permutations()}
    return perms
