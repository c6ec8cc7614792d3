"""One geometry model for every store: which stored axis is t, c, z, y or x, and the (z, y, x) voxel size and
offset in nanometres, from whatever convention wrote the store.

Conventions read (each defined by the tool or document named):

- gunpowder / funlib.persistence / daisy (``funlib/persistence/arrays/metadata.py``): array attributes
  ``voxel_size`` (or gunpowder's older ``resolution``), ``offset`` (world units, the position of voxel 0),
  ``axis_names`` (a name ending in ``^`` is a channel axis; funlib's default names are ``d0, d1, ...``), ``units``
  (one per spatial axis; ``""`` when not set) and ``types`` (``space``, ``channel``, ``time``). Spatial values
  are listed in the order of the spatial axes as stored, so ``axis_names=["x", "y", "z"]`` lists them (x, y, z).
- CREMI HDF5 and gunpowder's HDF5 (``cremi/io/CremiFile.py``): ``resolution`` and ``offset`` in nm, (z, y, x).
- zarr v3 (the zarr v3 core specification, "dimension_names"): one name (or null) per dimension. tensorstore's
  N5 driver (and neuroglancer's N5 source) name the dimensions the same way in an N5 dataset's ``axes``.
- N5 (``saalfeldlab/n5``, README "file-system specification"): every list is stored in (x, y, z) order, so it is
  reversed here; ``pixelResolution`` (BigDataViewer, n5-viewer) as ``{"dimensions": [...], "unit": "nm"}`` or a
  plain list; tensorstore's N5 driver writes ``resolution`` and ``units`` (one per dimension).
- tensorstore's zarr3 driver (its schema's ``dimension_units``): the array attribute ``dimension_units``, one
  entry per dimension, each a length as ``"<multiplier> <unit>"`` (``"4 nm"``, ``"4nm"``, ``"nm"``) or null for
  a dimension without one (a channel axis).
- OME-NGFF 0.4 and 0.5 (https://ngff.openmicroscopy.org): ``axes`` with ``name``, ``type`` and ``unit``, each
  level's ``coordinateTransformations`` (``scale``, then an optional ``translation``) composed with the
  multiscale's own; 0.5 nests everything under ``ome``.
- neuroglancer precomputed (``neuroglancer/src/datasource/precomputed/volume.md``): ``resolution`` in nm and
  ``voxel_offset`` in voxels, (x, y, z); read by :mod:`emfast.io._precomputed`.

A unit that is not stated (absent, ``""`` or null) is a nanometre, the unit every EM tool above assumes. A missing
offset beside a stated voxel size is 0, the field's convention; where neither is stated both are None. Two
sources of the same value that disagree (``resolution`` and ``voxel_size``, ``pixelResolution``, an OME scale
and the level's own ``voxel_size``), an unknown unit, or axes that cannot be told apart are a
:class:`~emfast.io._source.StoreMetadataError` naming the store, the array and the values.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._checks import is_integer, triple
from ._metadata import bad_metadata
from ._source import LevelChoiceError, StoreMetadataError

Triple = Tuple[float, float, float]
SPATIAL = ("z", "y", "x")
#: The order emfast reads every volume in: channels first, then (z, y, x); a time axis is read at index 0.
CANONICAL = ("t", "c") + SPATIAL

#: The attributes the gunpowder, funlib, CREMI and N5 conventions describe an array's geometry with.
GEOMETRY_KEYS = ("resolution", "voxel_size", "pixelResolution", "dimension_units", "offset", "axis_names", "units",
                 "types")

_SI_PREFIXES = {"yotta": 1e24, "zetta": 1e21, "exa": 1e18, "peta": 1e15, "tera": 1e12, "giga": 1e9, "mega": 1e6,
                "kilo": 1e3, "hecto": 1e2, "deca": 1e1, "": 1.0, "deci": 1e-1, "centi": 1e-2, "milli": 1e-3,
                "micro": 1e-6, "nano": 1e-9, "pico": 1e-12, "femto": 1e-15, "atto": 1e-18, "zepto": 1e-21,
                "yocto": 1e-24}
#: Nanometres per unit, by every name the tools write: OME-NGFF's unit names (UDUNITS-2, both spellings of
#: metre), the SI symbols, and the ways people write micrometre and angstrom.
NANOMETRES: Dict[str, float] = {
    **{f"{prefix}{metre}": factor * 1e9 for prefix, factor in _SI_PREFIXES.items() for metre in ("meter", "metre")},
    "nm": 1.0, "um": 1e3, "\u00b5m": 1e3, "\u03bcm": 1e3, "micron": 1e3, "mm": 1e6, "cm": 1e7, "m": 1e9,
    "pm": 1e-3, "km": 1e12, "angstrom": 0.1, "\u00e5": 0.1, "\u212b": 0.1,
    "inch": 2.54e7, "foot": 3.048e8, "yard": 9.144e8, "mile": 1.609344e12, "parsec": 3.0856775814913673e25,
}


def nanometres_per(unit: Any, where: str, key: str) -> float:
    """How many nanometres one ``unit`` is; an unstated unit (None, ``""``) is a nanometre.

    Raises
    ------
    StoreMetadataError
        An unknown unit, naming ``where``, ``key`` and the unit.
    """
    if unit is None or (isinstance(unit, str) and not unit.strip()):
        return 1.0
    factor = NANOMETRES.get(unit.strip().lower()) if isinstance(unit, str) else None
    if factor is None:
        raise bad_metadata(where, key, unit, "a length unit such as nm, nanometer, um, micrometer, mm or angstrom")
    return factor


@dataclass(frozen=True)
class Geometry:
    """Where an array's voxels lie in the world.

    Attributes
    ----------
    axes : tuple of str
        The role of each stored axis, in stored order: ``t``, ``c``, ``z``, ``y`` or ``x``.
    resolution, offset : (z, y, x) floats in nm, or None where the store states no voxel size (the offset is 0
        where only it is missing).
    """

    axes: Tuple[str, ...]
    resolution: Optional[Triple]
    offset: Optional[Triple]

    @property
    def canonical(self) -> bool:
        """True if the stored axes are already in emfast's order (t, c, z, y, x), so no axis is permuted."""
        return list(self.axes) == [a for a in CANONICAL if a in self.axes]

    def require_canonical(self, where: str, how: str = "", listed: Optional[str] = None) -> None:
        """Refuse a permuted store, for readers that read only in stored order; ``how``: how to store it so;
        ``listed``: the axes as the metadata lists them, where that order is not the stored one (N5's)."""
        if not self.canonical:
            axes = listed or f"in the order it stores them, ({', '.join(self.axes)})"
            raise StoreMetadataError(f"{where}: its axes are {axes}; this format is read only with its axes in the "
                                     f"order (c, z, y, x){how}")


def axis_roles(names: Optional[Sequence[Any]], ndim: int, where: str, key: str,
               types: Optional[Sequence[Any]] = None) -> Tuple[str, ...]:
    """The role (t, c, z, y, x) of each of ``ndim`` stored axes named ``names`` (None: 3-D is (z, y, x), 4-D is
    (c, z, y, x)).

    A name z, y or x is that axis; ``c``, ``channel(s)`` or a name ending in ``^`` (funlib) is the channel axis,
    ``t``/``time`` the time axis (or their ``types``). Other names (funlib's ``d0``, null) are positional: the last
    three are (z, y, x) when no axis is named z, y or x, and one axis left before them is the channel axis.

    Raises
    ------
    StoreMetadataError
        Names of another length, repeated, or that leave z, y or x unknown, naming ``where``, ``key`` and them.
    """
    if names is None:
        check_dimensions(ndim, where)
        return ("c",) * (ndim - 3) + SPATIAL
    if not isinstance(names, (list, tuple)) or len(names) != ndim:
        raise bad_metadata(where, key, names, f"a list of {ndim} axis names")
    kinds = list(types) if isinstance(types, (list, tuple)) and len(types) == ndim else [None] * ndim
    roles: List[Optional[str]] = [_named_role(name, kind) for name, kind in zip(names, kinds)]
    unnamed = [i for i, role in enumerate(roles) if role is None]
    if not unnamed and "z" not in roles and roles.count("y") == 1 and roles.count("x") == 1:  # y and x, no z: 2-D
        raise StoreMetadataError(f"{where}: {key} = {list(names)}, an image without a z axis; emfast reads "
                                 f"volumes (z, y, x){ONE_SECTION}")
    if not any(role in SPATIAL for role in roles) and len(unnamed) >= 3:
        for i, axis in zip(unnamed[-3:], SPATIAL):
            roles[i] = axis
        unnamed = unnamed[:-3]
    if len(unnamed) == 1 and "c" not in roles:
        roles[unnamed[0]] = "c"
        unnamed = []
    if unnamed or sorted(r for r in roles if r in SPATIAL) != sorted(SPATIAL) or len(set(roles)) != len(roles):
        raise bad_metadata(where, key, list(names), "names that map each axis to one of t, c, z, y, x, with z, y and "
                           "x each once (e.g. [\"z\", \"y\", \"x\"] or [\"c^\", \"z\", \"y\", \"x\"])")
    return tuple(roles)


def _named_role(name: Any, kind: Any) -> Optional[str]:
    text = name.strip().lower() if isinstance(name, str) else ""
    if text in SPATIAL:
        return text
    if text in ("c", "channel", "channels") or text.endswith("^") or kind == "channel":
        return "c"
    if text in ("t", "time") or kind == "time":
        return "t"
    return None


#: Told to a stored 2-D array: how it becomes a volume.
ONE_SECTION = "; a 2-D image is one section: store it with a z axis of 1, (1, y, x)"

def check_dimensions(ndim: int, where: str) -> None:
    """StoreMetadataError naming ``where`` unless a stored array of ``ndim`` axes is 3-D (z, y, x) or 4-D (c, z,
    y, x); a 2-D image is told how to be one section."""
    if ndim not in (3, 4):
        raise StoreMetadataError(f"{where}: expected a 3-D (z, y, x) or 4-D (c, z, y, x) array, got {ndim}-D"
                                 + (ONE_SECTION if ndim == 2 else ""))


def ilastik_axes(axistags: Any) -> Optional[List[str]]:
    """The axis keys of ilastik's ``axistags`` attribute (a JSON document ``{"axes": [{"key": "z", ...}, ...]}``,
    in stored order: its exports are channel-last, (z, y, x, c)), or None where it is absent or not such."""
    if isinstance(axistags, bytes):
        axistags = axistags.decode("utf-8", "replace")
    try:
        axes = json.loads(axistags)["axes"] if isinstance(axistags, str) else None
        keys = [axis["key"] for axis in axes] if isinstance(axes, list) else None
    except (ValueError, KeyError, TypeError):
        return None
    return keys if keys and all(isinstance(key, str) for key in keys) else None


def xarray_axes(names: Any, ndim: int) -> Optional[List[Any]]:
    """xarray's ``_ARRAY_DIMENSIONS`` of a zarr v2 array where they name its axes, each mapping to one role; None
    where they only number them (xarray's ``dim_0``), use names of their own (``band``) or cannot be mapped: the
    array's other metadata (funlib's ``axis_names``, an OME-NGFF image's axes) or the default order then place it."""
    if not isinstance(names, list) or not any(_named_role(name, None) for name in names):
        return None
    try:
        axis_roles(names, ndim, "", "")
    except StoreMetadataError:
        return None
    return names


def array_geometry(attrs: Mapping, ndim: int, where: str, *, dimension_names: Optional[Sequence[Any]] = None,
                   names_key: str = "zarr dimension_names", reversed_order: bool = False,
                   known_axes: Optional[Sequence[str]] = None) -> Geometry:
    """The geometry of one array from its attributes (gunpowder, funlib, CREMI, N5 conventions) and, for zarr v3,
    its ``dimension_names``.

    Parameters
    ----------
    attrs : mapping
        The array's attributes.
    ndim : int
        Its number of dimensions.
    where : str
        ``store:array (attributes)``, for messages.
    dimension_names : sequence, optional
        One name (or None) per dimension as the store lists them: zarr v3 ``dimension_names``, an N5 dataset's
        ``axes`` (reversed, as every N5 list).
    names_key : str
        What ``dimension_names`` is called in the store, for messages.
    reversed_order : bool
        The container lists every axis in reverse (N5's (x, y, z)).
    known_axes : sequence of str, optional
        The axes' roles as another source states them (an OME-NGFF image's ``axes``), which the array's own names
        must agree with.

    Raises
    ------
    StoreMetadataError
        Malformed, contradictory or unmappable metadata, naming ``where``, the keys and the values.
    """
    def stored(key):
        value = attrs.get(key)
        value = value.tolist() if isinstance(value, np.ndarray) else value
        return value[::-1] if reversed_order and isinstance(value, (list, tuple)) else value

    names = stored("axis_names")
    roles = axis_roles(names, ndim, where, "axis_names", stored("types")) if names is not None else None
    if dimension_names is not None and any(n is not None for n in dimension_names):
        listed = list(dimension_names)
        from_dimensions = axis_roles(listed[::-1] if reversed_order else listed, ndim, where, names_key)
        if roles is not None and roles != from_dimensions:
            as_stored = names[::-1] if reversed_order else names
            raise StoreMetadataError(f"{where}: contradictory metadata: axis_names {list(as_stored)} but the "
                                     f"{names_key} {listed}")
        roles = from_dimensions
    if known_axes is not None and roles is not None and roles != tuple(known_axes):
        raise StoreMetadataError(f"{where}: contradictory metadata: the array's axes {list(roles)} but the "
                                 f"OME-NGFF axes {list(known_axes)}")
    roles = roles or (tuple(known_axes) if known_axes is not None else axis_roles(None, ndim, where, "axis_names"))
    spatial = [a for a in roles if a in SPATIAL]
    units = _units(stored("units"), roles, where)
    candidates = []
    for key in ("resolution", "voxel_size", "pixelResolution"):
        value, key_units = stored(key), units
        if isinstance(attrs.get(key), Mapping):  # pixelResolution as {"dimensions": [...], "unit": "nm"}
            if attrs[key].get("dimensions") is None:  # {"z": 40, ...} was skipped, the voxel size lost unsaid
                raise bad_metadata(where, key, attrs[key], "a list of one number per spatial axis, or "
                                   "{\"dimensions\": [...], \"unit\": ...} as N5's pixelResolution")
            key_units = [attrs[key].get("unit")] * 3
            value = attrs[key].get("dimensions")
            value = value[::-1] if reversed_order and isinstance(value, list) else value
        if value is not None:
            shown = attrs[key]
            candidates.append((key, shown, _spatial(value, key, roles, spatial, key_units, where, shown)))
    if stored("dimension_units") is not None:
        shown = attrs["dimension_units"]
        lengths = _dimension_units(stored("dimension_units"), roles, where, shown)
        if lengths is not None:
            multipliers, lengths_units = lengths
            candidates.append(("dimension_units", shown, _spatial(multipliers, "dimension_units", roles, spatial,
                                                                  lengths_units, where, shown)))
    resolution = _agreed(candidates, where)
    offset = stored("offset")
    if offset is not None:
        offset = _spatial(offset, "offset", roles, spatial, units, where, attrs["offset"])
    elif resolution is not None:
        offset = (0.0, 0.0, 0.0)  # the field's convention (gunpowder, funlib, CREMI): voxel 0 at the origin
    return Geometry(roles, resolution, offset)


def _per_spatial_axis(value, roles) -> Optional[list]:
    """The spatial entries, in stored order, of a list given per spatial axis, per physical (space and time: funlib)
    axis, or per axis (tensorstore); None for a list of another length."""
    if not isinstance(value, (list, tuple)):
        return None
    for axes in (roles, [r for r in roles if r != "c"]):
        if len(value) == len(axes) != 3:
            return [v for v, role in zip(value, axes) if role in SPATIAL]
    return list(value) if len(value) == 3 else None


#: A tensorstore unit: an optional multiplier, then the base unit (``"4 nm"``, ``"4nm"``, ``"1e-3 um"``, ``"nm"``).
_UNIT = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)?\s*(.*?)\s*")


def _dimension_units(value, roles, where: str, shown) -> Optional[Tuple[list, list]]:
    """(multipliers, units) per spatial axis, in stored order, from tensorstore's ``dimension_units``; None where
    no spatial axis states one."""
    entries = _per_spatial_axis(value, roles)
    if entries is None or not all(e is None or isinstance(e, str) for e in entries):
        raise bad_metadata(where, "dimension_units", _shown(shown), "one unit (a string such as \"4 nm\", or null) per "
                           "dimension")
    if all(e is None or not e.strip() for e in entries):
        return None
    parsed = [_UNIT.fullmatch(e or "") for e in entries]
    if not all(m and m.group(2) for m in parsed):
        raise bad_metadata(where, "dimension_units", _shown(shown), "a length (such as \"4 nm\") for each of z, y "
                           "and x")
    return [float(m.group(1) or 1) for m in parsed], [m.group(2) for m in parsed]


def _units(value, roles, where: str) -> List[Any]:
    """One unit per spatial axis, in stored spatial order, from a ``units`` entry (one unit, or a list)."""
    if value is None or isinstance(value, str):
        return [value] * 3
    units = _per_spatial_axis(value, roles)
    if units is None:
        raise bad_metadata(where, "units", value, "a list of one unit per spatial axis")
    return units


def _spatial(value, key: str, roles, spatial, units, where: str, shown) -> Triple:
    """A per-spatial-axis list (or one per axis) in stored order, as (z, y, x) nanometres; ``shown`` is the value
    as the store holds it, for messages."""
    items = _per_spatial_axis(value, roles)
    ok = items is not None and all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) and np.isfinite(v)
        for v in items)
    if not ok:
        raise bad_metadata(where, key, _shown(shown), "3 numbers (finite, one per spatial axis)")
    if key != "offset" and any(v <= 0 for v in items):
        raise bad_metadata(where, key, _shown(shown), "3 positive numbers")
    unit_key = {"pixelResolution": f"{key}.unit", "dimension_units": key}.get(key, "units")
    nm = [float(v) * nanometres_per(u, where, unit_key)
          for v, u in zip(items, units)]
    return tuple(nm[spatial.index(a)] for a in SPATIAL)


#: How closely two statements of one value must agree: float32 rounding (a value stored as float32 beside its
#: float64 statement, micrometres converted to nm), not more: 1e-6 let offsets 4 nm apart agree at 4 mm.
AGREEMENT = 2.5e-7


def _agreed(candidates, where: str) -> Optional[Triple]:
    """The one voxel size several attributes state, or an error naming those that disagree."""
    if not candidates:
        return None
    first_key, first_raw, first = candidates[0]
    for key, raw, value in candidates[1:]:
        if not np.allclose(value, first, rtol=AGREEMENT, atol=1e-9):
            raise StoreMetadataError(f"{where}: contradictory metadata: {first_key} = {_shown(first_raw)} but {key} = "
                                     f"{_shown(raw)} ((z, y, x) nm: {first} vs {value})")
    return first


def _shown(value):
    return value.tolist() if isinstance(value, np.ndarray) else value


def world_box(shape: Sequence[int], resolution: Optional[Triple], offset: Optional[Triple]
              ) -> Optional[Tuple[Triple, Triple]]:
    """The (z, y, x) box in nm that a volume of ``shape`` covers, [first voxel's corner, last voxel's far corner),
    or None without a voxel size."""
    if resolution is None:
        return None
    low = tuple(float(o) for o in (offset or (0.0, 0.0, 0.0)))
    return low, tuple(lo + n * r for lo, n, r in zip(low, shape, resolution))


def require_agreement(where: str, what: str, stated: Optional[Triple], other: str, derived: Optional[Triple]) -> None:
    """Refuse two voxel sizes (or offsets) of the same array that differ, naming both."""
    if stated is not None and derived is not None and not np.allclose(stated, derived, rtol=AGREEMENT, atol=1e-9):
        raise StoreMetadataError(f"{where}: contradictory metadata: {what} (z, y, x) = {stated} nm but {other} = "
                                 f"{derived} nm")


@dataclass(frozen=True)
class Level:
    """One level of an OME-NGFF multiscale image: its path, the role of each axis, (z, y, x) nm.

    ``translation`` is the level's OME-NGFF translation as stated; ``offset`` is where its voxel (0, 0, 0) starts
    as emfast (and funlib) place voxels, the corner: a level translated from level 0 by half the difference of
    their voxel sizes (OME-NGFF's convention for binned levels, whose translation is the centre of their first
    voxel: ome-zarr-py's pyramids, emfast's own) starts where level 0 starts; any other translation is taken as
    the corner, as level 0's is.
    """

    path: str
    axes: Tuple[str, ...]
    resolution: Triple
    offset: Triple
    translation: Triple


def multiscale_levels(attrs: Mapping, name: str) -> Optional[Sequence[Level]]:
    """The levels of the first OME-NGFF multiscale image in a group's attributes, or None if there is none.

    Raises
    ------
    StoreMetadataError
        Metadata that breaks the spec in a way that matters here: axes that cannot be mapped, an unknown unit, a
        transform of another kind or length (naming ``name``).
    """
    attrs = attrs.get("ome", attrs)  # 0.5 nests everything under "ome"
    multiscales = attrs.get("multiscales")
    if not multiscales:
        return None
    image = multiscales[0]
    where = f"{name} (OME-NGFF multiscales)"
    axes = list(image.get("axes", ()))
    names = [a.get("name") if isinstance(a, Mapping) else str(a) for a in axes]
    kinds = [a.get("type") if isinstance(a, Mapping) else None for a in axes]
    roles = axis_roles(names, len(names), where, "axes", kinds)
    factors = np.array([nanometres_per(a.get("unit") if isinstance(a, Mapping) else None, where,
                                       f"axes[{i}].unit") if role in SPATIAL else 1.0
                        for i, (a, role) in enumerate(zip(axes, roles))])
    outer_scale, outer_shift = _transform(image.get("coordinateTransformations", ()), len(axes), where, "multiscale")
    levels = []
    for dataset in image.get("datasets", ()):
        if "path" not in dataset:
            raise StoreMetadataError(f"{where}: a dataset entry has no path: {dataset!r}")
        scale, shift = _transform(dataset.get("coordinateTransformations", ()), len(axes), where, dataset["path"])
        scale, shift = scale * outer_scale * factors, (shift * outer_scale + outer_shift) * factors
        resolution = tuple(float(scale[roles.index(a)]) for a in SPATIAL)
        if not all(r > 0 for r in resolution):  # emfast's own output would refuse it, after the work was done
            raise StoreMetadataError(f"{where}: the scale of {dataset['path']} must be positive along z, y and x, "
                                     f"got {resolution} nm")
        translation = tuple(float(shift[roles.index(a)]) for a in SPATIAL)
        levels.append(Level(str(dataset["path"]), roles, resolution, translation, translation))
    if not levels:
        raise StoreMetadataError(f"{where}: the multiscale lists no datasets")
    first = levels[0]
    return [dataclasses.replace(level, offset=_corner(level, first)) for level in levels]


def binned_corner(offset: Sequence[float], translation: Sequence[float], resolution: Sequence[float]) -> bool:
    """Whether ``offset`` is the corner of level 0 of an image whose level of voxel size ``resolution`` has the
    OME-NGFF ``translation``: along each axis the translation is the offset, or lies (f - 1) / 2 voxels of level 0
    past it for a binning factor f of at least :data:`LEAST_BINNING` (it need not be whole: ome-zarr-py's scales
    follow the shapes, 30 voxels to 7 a factor of 4.29, 30 to 16 of 1.875), which is less than half a voxel; with
    some axis binned. Only an image's first level is placed by it (see ``_placed_levels`` in
    :mod:`emfast.io._zarr`): the levels binned from it must agree."""
    binned = False
    for o, t, v in zip(offset, translation, resolution):
        shift = t - o
        if math.isclose(shift, 0.0, abs_tol=1e-6 * v):
            continue
        if not 0 < shift < v / 2 or v / (v - 2 * shift) < LEAST_BINNING:  # shift = (f - 1) / 2 * v / f
            return False
        binned = True
    return binned


#: The least binning factor :func:`binned_corner` takes: halving an axis whose size is odd rounds up, 15 voxels to
#: 8 a factor of 1.875; a smaller shift of the offset is a disagreement, not a binned level.
LEAST_BINNING = 1.75


def _corner(level: Level, first: Level) -> Triple:
    """``level``'s offset as a corner, per axis: level 0's where the translation moved by half the voxel size
    difference (a binned level's centre), else the translation."""
    corner = []
    for t, v, t0, v0 in zip(level.translation, level.resolution, first.translation, first.resolution):
        centred = math.isclose(t, t0 + (v - v0) / 2, rel_tol=0, abs_tol=1e-6 * v0)
        corner.append(t0 if centred else t)
    return tuple(corner)


def choose_level(resolutions: Sequence[Sequence[float]], level, resolution, name: str) -> int:
    """The index of the level at index ``level``, or of the one whose (z, y, x) voxel size is ``resolution``
    (``resolutions``: the levels' voxel sizes); level 0 by default. NumPy's integers are indexes too (an argmin over
    the voxel sizes, say); anything else is a :class:`LevelChoiceError` naming ``name``."""
    if level is not None and resolution is not None:
        raise LevelChoiceError(f"{name}: give level or resolution, not both")
    if resolution is not None:
        wanted = triple(resolution, "resolution", integer=False)
        for index, candidate in enumerate(resolutions):
            if np.allclose(candidate, wanted, rtol=1e-6):
                return index
        raise LevelChoiceError(f"{name}: no level has resolution {wanted}; levels: "
                               + ", ".join(f"{i}: {tuple(r)}" for i, r in enumerate(resolutions)))
    index = 0 if level is None else level
    if not is_integer(index) or not 0 <= index < len(resolutions):
        raise LevelChoiceError(f"{name}: level must be an index in [0, {len(resolutions)}), got {level!r}")
    return int(index)


def _transform(transforms, ndim: int, where: str, level: str) -> Tuple[np.ndarray, np.ndarray]:
    scale, shift = np.ones(ndim), np.zeros(ndim)
    for transform in transforms:
        kind = transform.get("type")
        if kind == "identity":
            continue
        if kind not in ("scale", "translation"):
            raise StoreMetadataError(f"{where}: transform {kind!r} of {level} is not supported (scale, translation)")
        values = transform.get(kind)
        if values is None or len(values) != ndim:
            raise StoreMetadataError(f"{where}: the {kind} of {level} must hold {ndim} numbers (one per axis), got "
                                     f"{values!r}")
        try:
            numbers = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            numbers = np.full(ndim, np.nan)
        if not np.isfinite(numbers).all():
            raise StoreMetadataError(f"{where}: the {kind} of {level} must hold {ndim} finite numbers, got {values!r}")
        if kind == "scale":
            scale = scale * numbers
        else:
            shift = shift + numbers
    return scale, shift
