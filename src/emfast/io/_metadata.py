"""Voxel size and offset from the metadata conventions EM tools write, and OME-NGFF multiscale images.

- gunpowder / funlib / daisy / DaCapo: array attributes ``resolution`` (or ``voxel_size``) and ``offset`` (world
  units, e.g. nm), in (z, y, x) order; in N5 containers funlib writes them reversed, in N5's (x, y, z) order.
- N5 viewers (BigDataViewer, n5-viewer): ``pixelResolution`` as ``{"dimensions": [x, y, z], "unit": "nm"}`` or a
  plain list, in (x, y, z) order.
- OME-NGFF 0.4 (zarr v2, ``multiscales`` in the group's attributes) and 0.5 (zarr v3, under ``ome``): each
  level's ``coordinateTransformations`` (``scale``, then an optional ``translation``), composed with the
  multiscale's own, over ``axes`` named and ordered as the spec requires (t, c, z, y, x).

Also the checks every format's metadata parsing uses, so that malformed metadata of any format raises one error,
:class:`~emfast.io._source.StoreMetadataError`, naming the store, the array, the key and the value.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._checks import triple
from ._source import StoreMetadataError

#: Longest value repr quoted in a metadata error.
_QUOTED = 120


def bad_metadata(where: str, key: str, value: Any, expected: str) -> StoreMetadataError:
    """The error for metadata key ``key`` of ``where`` (store:array and file) holding ``value``."""
    quoted = repr(value)
    quoted = quoted if len(quoted) <= _QUOTED else quoted[:_QUOTED] + "..."
    return StoreMetadataError(f"{where}: malformed metadata: {key} = {quoted}; expected {expected}")


def metadata_key(meta: Any, key: str, where: str, parent: str = "") -> Any:
    """``meta[key]``, or a StoreMetadataError if ``meta`` is not a JSON object or has no ``key``."""
    name = f"{parent}.{key}" if parent else key
    if not isinstance(meta, Mapping):
        raise bad_metadata(where, parent or "the metadata", meta, "a JSON object")
    if key not in meta:
        raise StoreMetadataError(f"{where}: malformed metadata: {name} is missing")
    return meta[key]


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def int_list(value: Any, key: str, where: str, *, minimum: Optional[int], length: Optional[int] = None,
             lengths: Sequence[int] = ()) -> Tuple[int, ...]:
    """``value`` as a tuple of ints >= ``minimum`` (of ``length``, or one of ``lengths``), else StoreMetadataError."""
    sizes = (length,) if length is not None else tuple(lengths)
    low = -2 ** 62 if minimum is None else minimum
    ok = (isinstance(value, (list, tuple)) and (not sizes or len(value) in sizes)
          and all(_is_int(v) and low <= v < 2 ** 62 for v in value))
    if not ok:
        count = " or ".join(str(n) for n in sizes) + " " if sizes else ""
        at_least = "" if minimum is None else f" >= {minimum}"
        raise bad_metadata(where, key, value, f"a list of {count}integers{at_least}")
    return tuple(int(v) for v in value)


def number_list(value: Any, key: str, where: str, *, length: int, positive: bool = False) -> Tuple[float, ...]:
    """``value`` as a tuple of ``length`` finite numbers (> 0 with ``positive``), else StoreMetadataError."""
    ok = (isinstance(value, (list, tuple)) and len(value) == length
          and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                  and np.isfinite(v) and (v > 0 or not positive) for v in value))
    if not ok:
        raise bad_metadata(where, key, value, f"a list of {length} finite {'positive ' if positive else ''}numbers")
    return tuple(float(v) for v in value)


@contextlib.contextmanager
def parsing(where: str) -> Iterator[None]:
    """Turn any error that parsing metadata raises (a key missing deeper down, a value of the wrong type) into a
    StoreMetadataError naming ``where``; the named checks above catch the common cases with a better message."""
    try:
        yield
    except StoreMetadataError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as error:
        detail = f"key {error} is missing" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        raise StoreMetadataError(f"{where}: malformed metadata: {detail}") from error

Triple = Tuple[float, float, float]


def voxel_metadata(attrs: Mapping, name: str, reversed_order: bool) -> Tuple[Optional[Triple], Optional[Triple]]:
    """(resolution, offset) in (z, y, x) from gunpowder/funlib attributes or N5 ``pixelResolution``; None where
    absent. ``reversed_order``: the container stores (x, y, z) (N5).

    Raises
    ------
    StoreMetadataError
        An attribute that is not 3 finite numbers, naming ``name``, the attribute and its value.
    """
    where = f"{name} (attributes)"

    def spatial(value, what):
        if value is None:
            return None
        shown = value.tolist() if isinstance(value, np.ndarray) else value
        if isinstance(value, Mapping):  # pixelResolution as {"dimensions": [...], "unit": ...}
            value = value.get("dimensions")
        items = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
        if items is None or len(items) != 3:
            raise bad_metadata(where, what, shown, "3 numbers")
        try:
            return triple(items[::-1] if reversed_order else items, f"{name}: {what}", integer=False)
        except ValueError:
            raise bad_metadata(where, what, shown, "3 finite numbers") from None

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
