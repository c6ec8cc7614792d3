"""Voxel size and offset from the metadata conventions EM tools write, and OME-NGFF multiscale images.

- gunpowder / funlib / daisy / DaCapo: array attributes ``resolution`` (or ``voxel_size``) and ``offset`` (world
  units, e.g. nm), in (z, y, x) order; in N5 containers funlib writes them reversed, in N5's (x, y, z) order.
- N5 viewers (BigDataViewer, n5-viewer): ``pixelResolution`` as ``{"dimensions": [x, y, z], "unit": "nm"}`` or a
  plain list, in (x, y, z) order.
- OME-NGFF 0.4 (zarr v2, ``multiscales`` in the group's attributes) and 0.5 (zarr v3, under ``ome``): each
  level's ``coordinateTransformations`` (``scale``, then an optional ``translation``), composed with the
  multiscale's own, over ``axes`` named and ordered as the spec requires (t, c, z, y, x).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np

from .._checks import triple

Triple = Tuple[float, float, float]


def voxel_metadata(attrs: Mapping, name: str, reversed_order: bool) -> Tuple[Optional[Triple], Optional[Triple]]:
    """(resolution, offset) in (z, y, x) from gunpowder/funlib attributes or N5 ``pixelResolution``; None where
    absent. ``reversed_order``: the container stores (x, y, z) (N5)."""
    def spatial(value, what):
        if value is None:
            return None
        if isinstance(value, Mapping):  # pixelResolution as {"dimensions": [...], "unit": ...}
            value = value.get("dimensions")
        items = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
        if items is None or len(items) != 3:
            raise ValueError(f"{name}: the {what} attribute must hold 3 numbers, got {value!r}")
        return triple(items[::-1] if reversed_order else items, f"{name}: {what}", integer=False)

    resolution = attrs.get("resolution", attrs.get("voxel_size"))
    what = "resolution" if "resolution" in attrs else "voxel_size"
    if resolution is None and "pixelResolution" in attrs:
        resolution, what = attrs["pixelResolution"], "pixelResolution"
    return spatial(resolution, what), spatial(attrs.get("offset"), "offset")


@dataclass(frozen=True)
class Level:
    """One level of an OME-NGFF multiscale image."""

    path: str
    axes: Tuple[str, ...]
    resolution: Triple
    offset: Triple


def multiscale_levels(attrs: Mapping, name: str) -> Optional[Sequence[Level]]:
    """The levels of the first OME-NGFF multiscale image in a group's attributes, or None if there is none.

    Raises
    ------
    ValueError
        Metadata that breaks the spec in a way that matters here (naming ``name``).
    """
    attrs = attrs.get("ome", attrs)  # 0.5 nests everything under "ome"
    multiscales = attrs.get("multiscales")
    if not multiscales:
        return None
    image = multiscales[0]
    axes = tuple(a["name"] if isinstance(a, Mapping) else str(a) for a in image.get("axes", ()))
    spatial = [i for i, a in enumerate(axes) if a in ("z", "y", "x")]
    if [axes[i] for i in spatial] != ["z", "y", "x"]:
        raise ValueError(f"{name}: OME-NGFF axes {list(axes)} must include z, y and x in that order for a 3-D volume")
    if set(axes) - {"t", "c", "z", "y", "x"}:
        raise ValueError(f"{name}: OME-NGFF axes {list(axes)}: only t, c, z, y and x are supported")
    outer_scale, outer_shift = _transform(image.get("coordinateTransformations", ()), len(axes), name, "multiscale")
    levels = []
    for dataset in image.get("datasets", ()):
        if "path" not in dataset:
            raise ValueError(f"{name}: an OME-NGFF dataset entry has no path: {dataset!r}")
        scale, shift = _transform(dataset.get("coordinateTransformations", ()), len(axes), name, dataset["path"])
        scale, shift = scale * outer_scale, shift * outer_scale + outer_shift
        levels.append(Level(str(dataset["path"]), axes, tuple(float(scale[i]) for i in spatial),
                            tuple(float(shift[i]) for i in spatial)))
    if not levels:
        raise ValueError(f"{name}: the OME-NGFF multiscale lists no datasets")
    return levels


def choose_level(levels: Sequence[Level], level, resolution, name: str) -> Level:
    """The level at index ``level``, or the one whose (z, y, x) voxel size is ``resolution``; level 0 by default."""
    if level is not None and resolution is not None:
        raise ValueError(f"{name}: give level or resolution, not both")
    if resolution is not None:
        wanted = triple(resolution, "resolution", integer=False)
        for candidate in levels:
            if np.allclose(candidate.resolution, wanted, rtol=1e-6):
                return candidate
        raise ValueError(f"{name}: no level has resolution {wanted}; levels: "
                         + ", ".join(f"{i}: {c.resolution}" for i, c in enumerate(levels)))
    index = 0 if level is None else level
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(levels):
        raise ValueError(f"{name}: level must be an index in [0, {len(levels)}), got {level!r}")
    return levels[index]


def _transform(transforms, ndim: int, name: str, where: str) -> Tuple[np.ndarray, np.ndarray]:
    scale, shift = np.ones(ndim), np.zeros(ndim)
    for transform in transforms:
        kind = transform.get("type")
        if kind == "identity":
            continue
        if kind not in ("scale", "translation"):
            raise ValueError(f"{name}: OME-NGFF transform {kind!r} of {where} is not supported (scale, translation)")
        values = transform.get(kind)
        if values is None or len(values) != ndim:
            raise ValueError(f"{name}: the {kind} of {where} must hold {ndim} numbers (one per axis), got {values!r}")
        if kind == "scale":
            scale = scale * np.asarray(values, dtype=np.float64)
        else:
            shift = shift + np.asarray(values, dtype=np.float64)
    return scale, shift
