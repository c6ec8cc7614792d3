"""Label maps with one channel: boundaries, class maps and foreground masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Sequence, Tuple

import numpy as np

from .._checks import refusal
from .._checks import is_integer as _is_integer
from .._core import targets as _targets
from .._registry import register
from ._base import (Margin, Target, _check_dtype, _check_flag, _check_id, _check_label_dtype, _check_name,
                    _check_thickness)


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

    def class_ids(self) -> Tuple[int, ...]:
        return (0, 1)

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

    def class_ids(self) -> Tuple[int, ...]:
        return self.values

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

    def class_ids(self) -> Tuple[int, ...]:
        return (0, 1)

    def check(self, label_dtype) -> None:
        _check_label_dtype(label_dtype, {"background": self.background}, "Foreground")

    def compute(self, labels, margin, out) -> None:
        (foreground,) = self._arrays(out)
        _targets.foreground(labels, margin, self.background, foreground)


