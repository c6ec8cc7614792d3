"""Section defects of serial-section EM, drawn per z-section: missing sections, low-contrast sections, slips
(misaligned sections) and artifacts blended in from a volume of real ones.

Each is a pixel-wise :class:`~emfast.augment.Augmentation`. :meth:`apply` draws one 64-bit Philox key per
example during planning (from two of the example's uniforms); :meth:`process` derives from that key, for raw
section z of the cropped window, the section's own draws (Philox counter (d // 4, z, 0, 0)), so whether and how
a section is hit depends only on (seed, epoch, batch, example, z), never on threads or the window's depth.
:meth:`events` lists those hits; the changes run in the compiled kernels of :mod:`emfast._core.intensity`.

Each section is hit independently with probability ``p`` (section z of the raw window; labels follow through
``patches.labels_offset``). Only real examples (``patches.valid``) are touched.

Example::

    augment = [ef.Mirror(), ef.Transpose(), MissingSection(p=0.02), LowContrast(), Slip(mode="step")]
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import ClassVar, Optional, Sequence, Tuple

import numpy as np

from .._checks import real, refusal
from .._core import intensity as _intensity
from .._registry import register
from ..io import as_volume
from ._base import Augmentation, Params, Patches, Windows, _check_probability
from ._intensity import check_range, check_record, checked_raw, keys_from_uniforms

#: The largest move of ``Slip`` along y or x, in voxels (far beyond any section).
MAX_SHIFT = 1 << 20


def _tag(text: str) -> int:
    """A Philox key word from a short ASCII name, so that each defect reads its own stream of a key."""
    return int.from_bytes(text.encode("ascii"), "big")


@dataclass(frozen=True)
class SectionKeys:
    """What a section defect drew for one batch (returned by ``apply``): one Philox key per example.

    Attributes
    ----------
    keys : ndarray, (B,) uint64
    """

    keys: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Events:
    """The sections a defect hits in one batch, one row per hit, ordered by example then section.

    Attributes
    ----------
    example, section : ndarray, (M,) int64
        Example and raw z-section of each hit.
    values : ndarray, (M, K) float64
        The hit's parameters; their meaning is given by each defect's ``events``.
    """

    example: np.ndarray
    section: np.ndarray
    values: np.ndarray


class _SectionDefect(Augmentation):
    """Draws one key per example; ``_DRAWS`` uniforms per section from it, the first deciding (< p) a hit.

    A defect that changes only the hit sections of raw implements ``_change``; one that does more (Slip) its
    own ``process``."""

    draws: ClassVar[int] = 2
    pixelwise: ClassVar[bool] = True
    #: Why the defect means nothing in a raw window of one section (None: it means as much there).
    _ALONE: ClassVar[Optional[str]] = None
    _DRAWS: ClassVar[int]
    _TAG: ClassVar[int]

    def bind_windows(self, windows: Windows) -> None:
        """Refuse a defect between sections where a raw window has one section (2-D patches): accepted, a missing
        section blanked whole inputs beside their full targets, and slips moved whole patches (a review)."""
        if self._ALONE is not None and windows.raw_sections == 1:
            between = tuple(kind.name for kind in _SectionDefect.__subclasses__() if kind._ALONE is not None)
            raise ValueError(f"{type(self).__name__}: the raw window is 1 section deep, and {self._ALONE}. Leave "
                             f"{self.name} out for 2-D patches (ef.augment.FULL lists the defects between sections "
                             f"{', '.join(between)}: pass its other names)")

    def apply(self, uniforms: np.ndarray, params: Params) -> SectionKeys:
        return SectionKeys(keys=keys_from_uniforms(uniforms[:, 0], uniforms[:, 1]))

    def _hits(self, record: SectionKeys, sections: int, valid: int, first: int = 0):
        """(example, section, section uniforms) of every hit among sections [first, sections)."""
        uniforms = _intensity.section_uniforms(record.keys[:valid], sections, self._DRAWS, self._TAG)
        hit = uniforms[:, :, 0] < self.p
        hit[:, :first] = False
        example, section = np.nonzero(hit)
        return example, section, uniforms[example, section]

    def _start(self, record, patches: Patches) -> tuple:
        owner = type(self).__name__
        raw = checked_raw(patches, owner)
        return raw, check_record(record, SectionKeys, raw.shape[0], owner)

    def events(self, record: SectionKeys, shape: Sequence[int], valid: int) -> Events:
        """The hits of a batch whose raw has shape ``shape`` (B, C, Z, Y, X) and ``valid`` real examples."""
        raise NotImplementedError

    def process(self, record: SectionKeys, patches: Patches) -> None:
        raw, record = self._start(record, patches)
        hits = self.events(record, raw.shape, patches.valid)
        if hits.example.size:
            self._change(raw, hits, _plane_index(hits.example, hits.section, raw.shape[1], raw.shape[2]))

    def _change(self, raw: np.ndarray, hits: Events, planes: np.ndarray) -> None:
        """Change the raw ``planes`` of ``hits``: for each hit, its section in every channel, hit-major."""
        raise NotImplementedError


def _plane_index(example: np.ndarray, section: np.ndarray, channels: int, depth: int) -> np.ndarray:
    """Index of plane (example, channel, section) of a (B, channels, depth, Y, X) array for each (example,
    section) pair and every channel, pair-major: (M * channels,)."""
    return ((example[:, None] * channels + np.arange(channels)) * depth + section[:, None]).ravel()


@register("augmentation")
@dataclass
class MissingSection(_SectionDefect):
    """Whole z-sections of raw replaced by ``fill`` (a lost or unusable section). Labels are left as they are:
    the network learns to fill the gap from the neighbouring sections.

    Parameters
    ----------
    p : float
        Probability of each section being missing.
    fill : float
        Value of a missing section in normalised raw units.
    """

    p: float = 0.05
    fill: float = 0.0
    name: ClassVar[str] = "missing_section"
    _ALONE: ClassVar[Optional[str]] = ("a missing section would blank the whole input beside its full targets: "
                                       "the network learns to fill a gap from neighbouring sections, and there are "
                                       "none")
    _DRAWS: ClassVar[int] = 1
    _TAG: ClassVar[int] = _tag("missing")

    def __post_init__(self) -> None:
        self.p = _check_probability(self.p, "MissingSection")
        real(self.fill, "MissingSection: fill")

    def events(self, record: SectionKeys, shape: Sequence[int], valid: int) -> Events:
        """Hits with no parameters (``values`` has 0 columns)."""
        example, section, _ = self._hits(record, shape[2], valid)
        return Events(example, section, np.empty((example.size, 0)))

    def _change(self, raw: np.ndarray, hits: Events, planes: np.ndarray) -> None:
        _intensity.fill_planes(raw, planes, self.fill, "raw")


@register("augmentation")
@dataclass
class LowContrast(_SectionDefect):
    """z-sections of raw with reduced contrast around their own mean: ``x -> (x - m) * f + m``, m the mean of the
    (channel, section) plane in float32, f drawn per section from ``factor``.

    Parameters
    ----------
    p : float
        Probability of each section having low contrast.
    factor : (float, float)
        Interval of the contrast factor, in [0, 1].
    """

    p: float = 0.05
    factor: Sequence[float] = (0.2, 0.5)
    name: ClassVar[str] = "low_contrast"
    _DRAWS: ClassVar[int] = 2
    _TAG: ClassVar[int] = _tag("contrast")

    def __post_init__(self) -> None:
        self.p = _check_probability(self.p, "LowContrast")
        self._factor = check_range(self.factor, "factor", "LowContrast", 0.0, 1.0)

    def events(self, record: SectionKeys, shape: Sequence[int], valid: int) -> Events:
        """Hits with ``values[:, 0]`` = the contrast factor."""
        example, section, uniforms = self._hits(record, shape[2], valid)
        lo, hi = self._factor
        return Events(example, section, (lo + (hi - lo) * uniforms[:, 1])[:, None])

    def _change(self, raw: np.ndarray, hits: Events, planes: np.ndarray) -> None:
        _intensity.contrast(raw, planes, raw.shape[3] * raw.shape[4], np.repeat(hits.values[:, 0], raw.shape[1]))


#: Which sections a slip moves.
SLIP_MODES = ("slip", "step")
#: What happens to the labels of moved sections.
SLIP_LABELS = ("shift", "mask")


@register("augmentation")
@dataclass
class Slip(_SectionDefect):
    """Misaligned z-sections: a section's content moved by a random whole-voxel (dy, dx).

    Two kinds, as in gunpowder's ``ElasticAugment`` (``prob_slip`` / ``prob_shift``) and pytorch-connectomics'
    ``MisAlignment`` (``"slip"`` / ``"translation"``):

    * ``mode="slip"``: only the hit section moves (a section slipped during imaging); any section may be hit.
    * ``mode="step"``: the hit section and every section after it move (an alignment error between two
      stacks); sections 1 and later may be hit, and the moves of several hits add up.

    Raw voxels whose source lies outside the raw window get ``fill``. Extra input channels move with raw, by the
    same vector, and get ``fill`` as raw does. Labels, when present, are handled by ``labels``:

    * ``"shift"``: labels (and ``labels_valid``, and the training mask that gates them) move by the same vector
      in their own array, so a label stays on its raw voxel; label section zl moves as raw section
      ``zl + labels_offset[0]`` (in step mode, label sections beyond the raw window move with its last section).
      Labels whose source lies outside the label window become 0 and, if ``patches.labels_valid`` is tracked,
      invalid; the mask there becomes 0. A label window larger than raw (target context) keeps its real labels
      next to raw ``fill``: the labels are still known there.
    * ``"mask"``: labels stay, and ``patches.labels_valid`` (required) is set to 0 on every moved label section,
      so the misaligned sections do not count in the loss.

    Parameters
    ----------
    p : float
        Probability of each section being hit.
    max_shift : (int, int)
        Largest move along y and x in voxels, each in [0, 2**20]: dy, dx are drawn uniformly from [-max, max].
    mode : str
        ``"slip"`` or ``"step"``.
    labels : str
        ``"shift"`` or ``"mask"``.
    fill : float
        Raw (and extra channels') value of voxels moved in from outside the window, in normalised units.
    """

    p: float = 0.05
    max_shift: Sequence[int] = (8, 8)
    mode: str = "slip"
    labels: str = "shift"
    fill: float = 0.0
    name: ClassVar[str] = "slip"
    _ALONE: ClassVar[Optional[str]] = ("a slip moves a section against its neighbours, of which it has none (the "
                                       "whole patch would move, and a step never happens)")
    unknown_voxels: ClassVar[bool] = True  # a slipped section shifts in voxels from beside the window
    moves_sections: ClassVar[bool] = True
    _DRAWS: ClassVar[int] = 3
    _TAG: ClassVar[int] = _tag("slip")

    @property
    def moves_labels(self) -> bool:
        return self.labels == "shift"  # "mask" leaves them and marks the moved sections unknown

    def __post_init__(self) -> None:
        self.p = _check_probability(self.p, "Slip")
        try:
            shift = tuple(self.max_shift)
        except TypeError:
            shift = ()
        if len(shift) != 2 or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s <= MAX_SHIFT
                                  for s in shift):  # beyond, the draws' float64 arithmetic loses whole voxels
            raise refusal(f"Slip: max_shift must be two integers in [0, {MAX_SHIFT}] (y, x), got {self.max_shift!r}",
                          "max_shift")
        self._max_shift = tuple(int(s) for s in shift)
        if self.mode not in SLIP_MODES:
            raise refusal(f"Slip: mode must be one of {SLIP_MODES}, got {self.mode!r}", "mode")
        if self.labels not in SLIP_LABELS:
            raise refusal(f"Slip: labels must be one of {SLIP_LABELS}, got {self.labels!r}", "labels")
        real(self.fill, "Slip: fill")

    def events(self, record: SectionKeys, shape: Sequence[int], valid: int) -> Events:
        """Hits with ``values[:, :2]`` = (dy, dx) of the hit (whole numbers)."""
        first = 1 if self.mode == "step" else 0
        example, section, uniforms = self._hits(record, shape[2], valid, first)
        extent = 2 * np.asarray(self._max_shift) + 1
        moves = np.minimum(np.floor(uniforms[:, 1:3] * extent), extent - 1) - np.asarray(self._max_shift)
        return Events(example, section, moves)

    def shifts(self, record: SectionKeys, shape: Sequence[int], valid: int) -> np.ndarray:
        """(valid, Z + 1, 2) int64: the move (dy, dx) of raw section z of each real example; row Z is the move
        of label sections beyond the raw window."""
        hits = self.events(record, shape, valid)
        table = np.zeros((valid, shape[2] + 1, 2), dtype=np.int64)
        table[hits.example, hits.section] = hits.values.astype(np.int64)
        if self.mode == "step":
            table = np.cumsum(table, axis=1)
        else:
            table[:, -1] = 0
        return table

    def process(self, record: SectionKeys, patches: Patches) -> None:
        raw, record = self._start(record, patches)
        label_arrays = self._label_arrays(patches, raw)
        valid, sections = patches.valid, raw.shape[2]
        table = self.shifts(record, raw.shape, valid)
        example, section = np.nonzero(table[:, :sections].any(axis=2))
        for extra in patches.extras:
            if not isinstance(extra, np.ndarray) or extra.ndim != 5 \
                    or extra.shape[:1] + extra.shape[2:] != raw.shape[:1] + raw.shape[2:]:
                raise ValueError(f"Slip: patches.extras must be arrays shaped like raw {raw.shape} but for their "
                                 f"channels, got {getattr(extra, 'shape', type(extra).__name__)}")
        if example.size:
            for array, name in [(raw, "raw")] + [(extra, "extra channel") for extra in patches.extras]:
                channels = array.shape[1]
                _intensity.shift_planes(array, _plane_index(example, section, channels, sections),
                                        np.repeat(table[example, section], channels, axis=0), self.fill, name)
        if not label_arrays:
            return
        labels = next(a for a in label_arrays if a is not None)
        planes, vectors = _moved_planes(table, labels.shape, patches.labels_offset[0], sections)
        if planes.size and self.labels == "mask":
            _intensity.fill_planes(patches.labels_valid, planes, 0, "labels_valid")
        if not planes.size or self.labels == "mask":
            return  # the mask gates the labels where they are: it stays with them
        for array, name in zip(label_arrays, ("labels", "labels_valid")):
            if array is not None:
                _intensity.shift_planes(array, planes, vectors, 0, name)
        if patches.mask is not None:
            planes, vectors = _moved_planes(table, patches.mask.shape, patches.mask_offset[0], sections)
            if planes.size:
                _intensity.shift_planes(patches.mask, planes, vectors, 0, "mask")

    def _label_arrays(self, patches: Patches, raw: np.ndarray) -> list:
        """[labels, labels_valid] to change (either may be None), checked; [] when there are no labels."""
        labels, mask = patches.labels, patches.labels_valid
        if labels is None and mask is None:
            return []
        for array, name in ((labels, "labels"), (mask, "labels_valid")):
            if array is not None and (not isinstance(array, np.ndarray) or array.ndim != 5
                                      or array.shape[0] != raw.shape[0]):
                raise ValueError(f"Slip: patches.{name} must be a (B, C, Z, Y, X) array with B = {raw.shape[0]}")
        if labels is not None and mask is not None and labels.shape != mask.shape:
            raise ValueError(f"Slip: patches.labels_valid has shape {mask.shape}, labels {labels.shape}")
        if mask is not None and mask.dtype != np.uint8:
            raise TypeError(f"Slip: patches.labels_valid must be uint8, got {mask.dtype}")
        if self.labels == "mask" and mask is None:
            raise ValueError("Slip(labels='mask') needs patches.labels_valid to mark the moved label sections")
        offset = patches.labels_offset
        if len(offset) != 3 or any(isinstance(o, bool) or not isinstance(o, numbers.Integral) for o in offset):
            raise ValueError(f"Slip: patches.labels_offset must be three integers, got {offset!r}")
        return [labels, mask]


def _moved_planes(table: np.ndarray, shape: Sequence[int], offset: int, sections: int) -> Tuple[np.ndarray, np.ndarray]:
    """The planes of a (B, C, Z, Y, X) label-like array whose section zl moves as raw section ``zl + offset``
    (none before the raw window, row Z of ``table`` beyond it), and their (dy, dx) moves, one per plane."""
    channels, depth = shape[1], shape[2]
    source = np.arange(depth) + int(offset)
    moves = table[:, np.clip(source, 0, sections)]  # (valid, depth, 2)
    moves[:, source < 0] = 0
    example, section = np.nonzero(moves.any(axis=2))
    planes = _plane_index(example, section, channels, depth)
    return planes, np.repeat(moves[example, section], channels, axis=0)


@register("augmentation")
@dataclass(eq=False)
class Artifacts(_SectionDefect):
    """Artifacts of real EM (dust, folds, stains) blended into z-sections of raw:
    ``x -> x * (1 - alpha) + a * alpha``, ``a`` a (Y, X) box cut at a random section and position of ``volume``
    and normalised as ``a = v * scale + shift``, alpha drawn per section from ``alpha``. The same box goes into
    every channel. Labels are left as they are.

    Parameters
    ----------
    volume : emfast.Volume or ndarray
        3-D (z, y, x) uint8 or float32 artifact sections, held in memory, at least as large in y and x as a raw
        window's section (checked when a batch is processed).
    p : float
        Probability of each section getting an artifact.
    alpha : (float, float)
        Interval of the blending weight, in [0, 1].
    scale, shift : float or None
        Normalisation of the artifact values to raw units. By default uint8 maps to [0, 1] (scale 1/255) and
        float32 is used as it is (scale 1); shift defaults to 0.
    """

    volume: object = None
    p: float = 0.05
    alpha: Sequence[float] = (0.5, 1.0)
    scale: Optional[float] = None
    shift: Optional[float] = 0.0
    name: ClassVar[str] = "artifacts"
    _DRAWS: ClassVar[int] = 5
    _TAG: ClassVar[int] = _tag("artifact")
    _source: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.volume is None:
            raise ValueError("Artifacts: needs a volume of artifact sections (Artifacts(volume=...))")
        volume = as_volume(self.volume, "Artifacts volume")
        if volume.dtype not in (np.dtype(np.uint8), np.dtype(np.float32)):
            raise ValueError(f"Artifacts: {volume.name} has dtype {volume.dtype}; supported: uint8, float32")
        if volume.channels != 1:
            raise ValueError(f"Artifacts: {volume.name} has {volume.channels} channels; expected a 3-D volume")
        if not volume.in_memory:
            raise ValueError(f"Artifacts: {volume.name} is read lazily; open it with in_memory=True")
        volume.check_finite()
        self._source = volume.array[0]
        self._name = volume.name
        self.p = _check_probability(self.p, "Artifacts")
        self._alpha = check_range(self.alpha, "alpha", "Artifacts", 0.0, 1.0)
        for what, value in (("scale", self.scale), ("shift", self.shift)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not np.isfinite(value)):
                raise refusal(f"Artifacts: {what} must be a finite number or None, got {value!r}", what)
        # Defaults resolved here, not written back: a copy with another volume (dataclasses.replace) keeps None
        # and gets that volume's default.
        self._scale = (1.0 / 255.0 if volume.dtype == np.uint8 else 1.0) if self.scale is None else self.scale
        self._shift = 0.0 if self.shift is None else self.shift

    def bind_windows(self, windows: Windows) -> None:
        """Refuse artifact sections smaller than a raw section can be."""
        self.check_section(*windows.raw_section)

    def check_section(self, height: int, width: int) -> None:
        """Raise ValueError if the artifact sections are smaller than a raw section of (height, width)."""
        if self._source.shape[1] < height or self._source.shape[2] < width:
            raise ValueError(f"Artifacts: {self._name} has sections of {self._source.shape[1:]}, smaller than the "
                             f"raw window's sections of ({height}, {width})")

    def events(self, record: SectionKeys, shape: Sequence[int], valid: int) -> Events:
        """Hits with ``values[:, 0]`` = alpha and ``values[:, 1:4]`` = (z, y, x) corner of the artifact box."""
        self.check_section(shape[3], shape[4])
        example, section, uniforms = self._hits(record, shape[2], valid)
        lo, hi = self._alpha
        room = np.array([self._source.shape[0], self._source.shape[1] - shape[3] + 1,
                         self._source.shape[2] - shape[4] + 1])
        corners = np.minimum(np.floor(uniforms[:, 2:5] * room), room - 1)
        return Events(example, section, np.column_stack([lo + (hi - lo) * uniforms[:, 1], corners]))

    def _change(self, raw: np.ndarray, hits: Events, planes: np.ndarray) -> None:
        channels = raw.shape[1]
        corners = np.repeat(hits.values[:, 1:4].astype(np.int64), channels, axis=0)
        _intensity.blend(raw, planes, raw.shape[3:], self._source, corners, np.repeat(hits.values[:, 0], channels),
                         self._scale, self._shift)
