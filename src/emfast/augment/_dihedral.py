"""The 48 axis transforms: :class:`Mirror` and :class:`Transpose` compose into one axis permutation and mirror per
example, which the gather kernel applies while cropping (no voxel is resampled)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .._registry import register
from ._base import Augmentation, Params, _check_probability, _parse_axes, _require_isotropic


@register("augmentation")
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


@register("augmentation")
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

    def exchanged_axes(self) -> str:
        return self.axes

    def apply(self, uniforms: np.ndarray, params: Params) -> None:
        orders = np.asarray(self._orders, dtype=np.int64)
        choice = np.minimum((uniforms[:, 0] * len(orders)).astype(np.int64), len(orders) - 1)
        params.perms[:] = np.take_along_axis(params.perms, orders[choice], axis=1)

    def permutations(self) -> list[tuple[int, ...]]:
        return [tuple(p) for p in self._orders]
