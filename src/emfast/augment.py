"""Augmentation specifications and their per-example parameter draws (no pixel work happens here).

An augmentation turns uniform draws into transform parameters for a whole batch at once. The geometric ones
(:class:`Mirror`, :class:`Transpose`) compose into one of the 48 axis permutations/mirrors per example, which the
gather kernel applies while cropping; :class:`Intensity` composes into the per-example scale and shift the kernel
applies while converting. Raw and labels share the geometry; only raw gets the intensity change.
"""
from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass, field
from typing import ClassVar, Iterable, Optional, Sequence, Union

import numpy as np

from .names import instantiate

AXES = "zyx"


@dataclass
class Params:
    """Per-example transform parameters of one batch.

    The output of example n is ``transpose(flip(window, flips[n]), perms[n])``, its raw intensities then mapped
    as ``x * gain[n] + bias[n]`` after normalisation. ``flips`` are in source axes (z, y, x); output axis j
    reads source axis ``perms[n][j]``. ``matrix`` (B, 3, 3) holds the rotation/scale of the warp augmentations
    and ``elastic`` their control grid (B, 3, gz, gy, gx) float32, or None; see :mod:`emfast.warp`
    (``full_matrix`` composes them with perms/flips).
    """

    perms: np.ndarray
    flips: np.ndarray
    gain: np.ndarray
    bias: np.ndarray
    matrix: Optional[np.ndarray] = None
    elastic: Optional[np.ndarray] = None

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
        raise ValueError(f"{owner}: axes must be distinct letters from 'zyx', got {axes!r}")
    return tuple(AXES.index(a) for a in axes)


def _require_isotropic(owner: str, axes: str, isotropic: bool, effect: str) -> None:
    """Refuse an augmentation over ``axes`` that include z on anisotropic data; ``effect`` says what it would do."""
    if "z" in axes and not isotropic:
        raise ValueError(f"{owner}(axes={axes!r}) {effect}; pass isotropic=True to the Loader if z has the same "
                         "resolution as y and x")


def _check_probability(p: float, owner: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{owner}: probability p must be in [0, 1], got {p!r}")
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
    """

    raw: np.ndarray
    labels: Optional[np.ndarray] = None
    labels_offset: tuple = (0, 0, 0)
    labels_valid: Optional[np.ndarray] = None
    valid: int = 0


class Augmentation:
    """Base class: ``draws`` uniforms per example in, parameters updated in place.

    Geometric and linear-intensity augmentations fold into :class:`Params` in :meth:`apply`, which the gather
    kernels apply while cropping. Pixel-wise augmentations (noise, blur, section defects) also return a record
    of their draws from :meth:`apply` and set ``pixelwise = True``; the loader then calls :meth:`process` with
    that record on the cropped batch, in the order the augmentations were listed.
    """

    name: ClassVar[str]
    draws: ClassVar[int]
    pixelwise: ClassVar[bool] = False

    def check(self, isotropic: bool) -> None:
        """Raise if this augmentation is not allowed for the data (anisotropic unless ``isotropic``)."""

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


@dataclass
class Mirror(Augmentation):
    """Mirror each of ``axes`` independently with probability ``p``.

    Parameters
    ----------
    axes : str
        Output axes that may be mirrored, letters of ``"zyx"``. Mirroring z is safe for anisotropic data.
    p : float
        Probability of mirroring each axis; 0.5 makes all mirror combinations equally likely.
    """

    axes: str = "zyx"
    p: float = 0.5
    name: ClassVar[str] = "mirror"
    draws: ClassVar[int] = 3

    def __post_init__(self) -> None:
        self._axes = _parse_axes(self.axes, "Mirror")
        self.p = _check_probability(self.p, "Mirror")

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        rows = np.arange(len(uniforms))
        for i, out_axis in enumerate(self._axes):
            source_axis = params.perms[:, out_axis]
            params.flips[rows, source_axis] ^= uniforms[:, i] < self.p


@dataclass
class Transpose(Augmentation):
    """Permute ``axes`` with a uniformly drawn order (all ``len(axes)!`` orders equally likely).

    Parameters
    ----------
    axes : str
        Output axes to permute among themselves: ``"yx"`` (the default, safe for anisotropic EM) or, for
        isotropic data (``Loader(isotropic=True)``), any set including z such as ``"zyx"``.
    """

    axes: str = "yx"
    name: ClassVar[str] = "transpose"
    draws: ClassVar[int] = 1
    _orders: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        positions = _parse_axes(self.axes, "Transpose")
        if len(positions) < 2:
            raise ValueError(f"Transpose: needs at least two axes, got {self.axes!r}")
        self._orders = []
        for order in itertools.permutations(positions):
            perm = list(range(3))
            for slot, axis in zip(sorted(positions), order):
                perm[slot] = axis
            self._orders.append(perm)

    def check(self, isotropic: bool) -> None:
        _require_isotropic("Transpose", self.axes, isotropic, "swaps z with y/x, which distorts anisotropic EM data")

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        orders = np.asarray(self._orders, dtype=np.int64)
        choice = np.minimum((uniforms[:, 0] * len(orders)).astype(np.int64), len(orders) - 1)
        params.perms[:] = np.take_along_axis(params.perms, orders[choice], axis=1)

    def permutations(self) -> list[tuple[int, ...]]:
        return [tuple(p) for p in self._orders]


@dataclass
class Intensity(Augmentation):
    """Per-example random contrast and brightness of raw: ``x * a + b`` after normalisation.

    Parameters
    ----------
    scale : float
        ``a`` is drawn uniformly from ``[1 - scale, 1 + scale]``; must be in [0, 1).
    shift : float
        ``b`` is drawn uniformly from ``[-shift, shift]``; must be >= 0.
    """

    scale: float = 0.1
    shift: float = 0.1
    name: ClassVar[str] = "intensity"
    draws: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if not isinstance(self.scale, numbers.Real) or not 0.0 <= self.scale < 1.0:
            raise ValueError(f"Intensity: scale must be in [0, 1), got {self.scale!r}")
        if not isinstance(self.shift, numbers.Real) or not 0.0 <= self.shift < float("inf"):
            raise ValueError(f"Intensity: shift must be a finite number >= 0, got {self.shift!r}")

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        a = 1.0 + self.scale * (2.0 * uniforms[:, 0] - 1.0)
        b = self.shift * (2.0 * uniforms[:, 1] - 1.0)
        params.gain *= a
        params.bias = params.bias * a + b


REGISTRY = {cls.name: cls for cls in (Mirror, Transpose, Intensity)}
AugmentationLike = Union[Augmentation, str]


def resolve(items: Iterable[AugmentationLike], isotropic: bool) -> list[Augmentation]:
    """Turn a list of augmentations or their names into checked augmentation objects.

    Raises
    ------
    ValueError
        For an unknown name (with the closest known one), or an augmentation the data does not allow.
    TypeError
        For an item that is neither a name nor an :class:`Augmentation`.
    """
    resolved = instantiate(items, REGISTRY, Augmentation, "augmentation")
    for augmentation in resolved:
        augmentation.check(isotropic)
    return resolved


def reachable_permutations(augmentations: Sequence[Augmentation]) -> set[tuple[int, ...]]:
    """All axis orders the augmentations can produce together."""
    perms = {(0, 1, 2)}
    for augmentation in augmentations:
        perms = {tuple(p[i] for i in q) for p in perms for q in augmentation.permutations()}
    return perms


# The pixel-wise augmentations live in modules that import this one, so they register once it is complete.
from .defects import Artifacts, LowContrast, MissingSection, Slip  # noqa: E402
from .intensity import Blur, Contrast, Gamma, Noise  # noqa: E402

REGISTRY.update({cls.name: cls for cls in (Gamma, Contrast, Noise, Blur, MissingSection, LowContrast, Slip, Artifacts)})

from .warp import Elastic, Rotate, Scale  # noqa: E402

REGISTRY.update({cls.name: cls for cls in (Rotate, Scale, Elastic)})

#: The full default augmentation list for anisotropic EM training, by name (each with its default parameters):
#: geometry (dihedral, rotation about z, elastic), intensity, and section defects. ``Loader(augment=FULL)``.
FULL = ("mirror", "transpose", "rotate", "elastic", "intensity", "gamma", "contrast", "noise", "blur",
        "missing_section", "low_contrast", "slip")
