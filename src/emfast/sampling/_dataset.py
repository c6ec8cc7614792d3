"""Training sets of several volumes: raw, labels, masks and extra channels, aligned and checked up front.

A :class:`Sample` is one annotated volume; a :class:`Dataset` is a list of them with sampling weights. All the
checking (dtypes, alignment, resolution, overlap) happens when they are built, so a mistake is reported before
any thread starts.
"""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._checks import triple
from .._core.common import LABEL_DTYPES, RAW_DTYPES
from ..io import Volume, as_volume
from ._resolution import FieldGrid, OnRawGrid

#: Mask dtypes: non-zero marks usable voxels.
MASK_DTYPES = (np.dtype(np.uint8), np.dtype(bool))


def _positioned(volume: Volume) -> bool:
    """Whether ``volume`` says where it lies in the world: it has a resolution (a missing offset then reads as 0)."""
    return volume.resolution is not None


def _offset_text(volume: Volume) -> str:
    """The volume's offset as its metadata give it (a resolution without an offset places it at 0)."""
    if volume.offset is None:
        return "no offset (read as 0)"
    if _positioned(volume) and not any(volume.offset):  # a resolution without an offset reads as this too
        return f"offset {volume.offset} (an 'offset' attribute of 0, or none beside its 'resolution')"
    return f"offset {volume.offset}" + ("" if _positioned(volume) else " and no resolution")


def _origin_from_attributes(raw: Volume, other: Volume) -> Optional[np.ndarray]:
    """``other``'s voxel (0, 0, 0) in raw voxels from the ``offset``/``resolution`` attributes, or None where
    neither volume has an ``offset`` attribute (their relative position is then unknown).

    A volume with a resolution but no offset lies at the world origin: gunpowder, funlib and the CREMI files read
    a missing offset as 0 (CREMI raw has none; its labels have one). An offset that cannot be converted to raw
    voxels is refused rather than ignored.
    """
    if raw.offset is None and other.offset is None:
        return None
    unplaced = [volume for volume in (raw, other) if not _positioned(volume)]
    if unplaced:
        with_offset = other if other.offset is not None else raw
        lacking = "" if unplaced[0] is with_offset else f"{unplaced[0].name} has no 'resolution'"
        raise ValueError(f"{with_offset.name} has {_offset_text(with_offset)}"
                         + (f" but {lacking}" if lacking else "")
                         + ", so the offset cannot be converted to voxels; give both datasets a 'resolution' "
                         "attribute, or the offset in raw voxels explicitly (label_offset= or mask_offset=; "
                         "(0, 0, 0) where the two start at the same voxel)")
    offsets = [np.asarray(v.offset or (0, 0, 0), dtype=np.float64) for v in (other, raw)]
    resolution = np.asarray(raw.resolution, dtype=np.float64)
    voxels = (offsets[0] - offsets[1]) / resolution
    rounded = all(_float32_values(v) for v in offsets + [resolution])  # stored as float32, it seems
    reach = (np.abs(offsets[0]) + np.abs(offsets[1])) / resolution + np.abs(voxels)
    if not np.allclose(voxels, np.round(voxels), rtol=0, atol=_whole_voxel_tolerance(reach if rounded else 0)):
        raise ValueError(f"{other.name} ({_offset_text(other)}) is offset by {tuple(float(v) for v in voxels)} "
                         f"voxels from {raw.name} ({_offset_text(raw)}, resolution {raw.resolution}), not a whole "
                         "number of voxels")
    return np.round(voxels).astype(np.int64)


#: Relative rounding of a float32 value: each offset and the voxel size stored as float32 are off by up to this.
FLOAT32_ROUNDING = 2.0 ** -24


def _float32_values(values: np.ndarray) -> bool:
    """Whether every value is a float32 (as metadata stored in float32 reads): float64 values beyond it are exact
    to far better than a voxel."""
    return bool(np.all(values.astype(np.float32).astype(np.float64) == values))


def _whole_voxel_tolerance(reach) -> np.ndarray:
    """How far from a whole number of voxels a count may be: a thousandth of a voxel, plus the float32 rounding of
    offsets and voxel size ``reach`` voxels in size (0 for metadata that is no float32), never a quarter voxel
    (np.allclose's relative 1e-5 let half a voxel pass 50,000 voxels away)."""
    return np.minimum(0.25, 1e-3 + 2 * FLOAT32_ROUNDING * np.asarray(reach))


def origin_in(raw: Volume, other: Volume, offset, offset_name: str = "offset") -> np.ndarray:
    """Position of ``other``'s voxel (0, 0, 0) in ``raw``'s voxel coordinates.

    From the explicit ``offset`` (voxels) if given, else from the volumes' ``offset``/``resolution`` attributes
    (physical units; a volume with a resolution but no offset lies at 0, as gunpowder, funlib and CREMI read it),
    else, where neither has an offset or a resolution, the shapes must be equal and the origin is 0.

    Raises
    ------
    ValueError
        Different resolutions; an explicit ``offset`` that contradicts the attributes (both are named); an
        offset attribute that cannot be converted to whole raw voxels; different shapes with no offset at all.
    """
    if raw.resolution is not None and other.resolution is not None and not np.allclose(raw.resolution,
                                                                                        other.resolution):
        raise ValueError(f"resolution mismatch: {raw.name} has {raw.resolution}, {other.name} has "
                         f"{other.resolution}")
    explicit = None if offset is None else np.asarray(triple(offset, f"{offset_name} of {other.name}"),
                                                      dtype=np.int64)
    if explicit is not None and raw.offset is None and other.offset is None:
        return explicit  # nothing in the files to contradict it
    if explicit is not None and not (_positioned(raw) and _positioned(other)):
        _refuse_unreadable_contradiction(raw, other, explicit, offset_name)
        return explicit
    derived = _origin_from_attributes(raw, other)
    if explicit is not None:
        if not np.array_equal(explicit, derived):
            raise ValueError(
                f"{offset_name}={_ints(explicit)} contradicts the datasets' attributes: {other.name} has "
                f"{_offset_text(other)} and {raw.name} has {_offset_text(raw)} at resolution {raw.resolution}, "
                f"which place it at {_ints(derived)} in raw voxels; leave {offset_name} out or correct the "
                "'offset' attribute")
        return explicit
    if derived is not None:
        return derived
    if raw.shape != other.shape:
        raise ValueError(f"{raw.name} has shape {raw.shape} but {other.name} has {other.shape}; pass "
                         f"{offset_name}=(z, y, x) (its first voxel in raw voxels), or give the datasets 'offset' "
                         "and 'resolution' attributes")
    return np.zeros(3, dtype=np.int64)


def _refuse_unreadable_contradiction(raw: Volume, other: Volume, explicit: np.ndarray, offset_name: str) -> None:
    """Refuse an explicit offset that no reading of the attributes allows, where a volume has an offset but one
    lacks a resolution (the attributes alone are refused then): its unit unknown, an offset is read in nm at the
    resolution one of them states (they must share it), or in raw voxels."""
    known = raw.resolution if _positioned(raw) else other.resolution
    if known is None:
        return  # no voxel size states the offset's unit: any offset in voxels may be what it means
    apart = np.asarray(other.offset or (0, 0, 0), np.float64) - np.asarray(raw.offset or (0, 0, 0), np.float64)
    readings = [apart, apart / np.asarray(known, np.float64)]
    if any(np.allclose(explicit, reading, rtol=0, atol=1e-3) for reading in readings):
        return
    raise ValueError(f"{offset_name}={_ints(explicit)} contradicts the datasets' attributes: {other.name} has "
                     f"{_offset_text(other)} and {raw.name} has {_offset_text(raw)}, which place it at "
                     + " or ".join(f"{tuple(float(v) for v in r)}" for r in readings[::-1])
                     + " in raw voxels (read in nm at the resolution given, or in voxels); leave "
                     f"{offset_name} out and give both datasets a 'resolution', or correct the 'offset' attribute")


def _ints(values) -> tuple:
    """Plain Python ints for messages and reprs (NumPy 2 shows ``np.int64(3)`` inside tuples)."""
    return tuple(int(v) for v in values)


def _as_role_volume(source, what: str, dtypes, role: Optional[str] = None) -> Volume:
    """``source`` as a Volume whose dtype suits its role; the message lists that role's dtypes only."""
    role = role or what
    dtype = getattr(source, "dtype", None)
    if isinstance(source, np.ndarray) and dtype.newbyteorder("=") not in dtypes:  # before Volume's generic check
        raise TypeError(f"{what}: {role} must be {_dtype_list(dtypes)}, not {dtype}")
    volume = as_volume(source, what)
    stored = volume.stored_dtype  # a bool mask reads as uint8: not raw intensities
    if volume.dtype not in dtypes or (stored == bool and bool not in dtypes):
        raise TypeError(f"{volume.name}: {role} must be {_dtype_list(dtypes)}, not {stored}")
    return volume


def _dtype_list(dtypes) -> str:
    names = [str(np.dtype(d)) for d in dtypes]
    return ", ".join(names[:-1]) + " or " + names[-1]


@dataclass
class Placed:
    """A volume and the position of its voxel (0, 0, 0) in raw voxel coordinates.

    A volume at another voxel size than raw has a ``grid`` (how its voxels lie on raw's); ``origin`` and ``end``
    are then those of its footprint on raw's grid (:attr:`on_raw`), read by nearest neighbour, or linearly where
    ``linear``.
    """

    volume: Volume
    origin: np.ndarray
    grid: Optional[FieldGrid] = None
    linear: bool = False

    @functools.cached_property
    def on_raw(self):
        """What the windows on raw's grid are read from: the volume, or its :class:`OnRawGrid` view."""
        return self.volume if self.grid is None else OnRawGrid(self.volume, self.grid, self.linear)

    @property
    def end(self) -> np.ndarray:
        return self.origin + np.asarray(self.on_raw.shape, dtype=np.int64)


def _check_overlap(raw: Volume, placed: Placed) -> None:
    lo = np.maximum(0, placed.origin)
    hi = np.minimum(np.asarray(raw.shape), placed.end)
    if np.any(hi <= lo):
        footprint = "" if placed.grid is None else \
            f", voxel size {placed.volume.resolution}: raw voxels [{_ints(placed.origin)}, {_ints(placed.end)})"
        raise ValueError(f"{placed.volume.name} (at {_ints(placed.origin)}, shape "
                         f"{placed.volume.shape}{footprint}) does not overlap {raw.name} (shape {raw.shape})")


def _grid(raw: Volume, volume: Volume, what: str, offset, offset_name: str) -> Optional[FieldGrid]:
    """The grid of a volume at another voxel size than raw (None at the same voxel size, or where either has none)."""
    if raw.resolution is None or volume.resolution is None:
        return None
    grid = FieldGrid.between(raw, volume, what)
    if grid is not None and offset is not None:
        raise ValueError(f"{offset_name} (in raw voxels) cannot place {volume.name}, whose voxel size "
                         f"{volume.resolution} differs from raw's {raw.resolution}; give it an 'offset' attribute "
                         "in world units instead")
    return grid


@dataclass
class Sample:
    """One annotated volume: raw plus optional labels, mask and extra aligned input channels.

    Parameters
    ----------
    raw : Volume or ndarray
        The image, (z, y, x) or (c, z, y, x): uint8, int8, uint16, int16, uint32, float16, float32 or float64.
    labels : Volume or ndarray, optional
        Label ids (uint32, int32, uint64 or int64). May cover only part of raw (see ``label_offset``).
    mask : Volume or ndarray, optional
        uint8 or bool, non-zero where the data may be used; delivered as the batch field ``"mask"`` and used by
        :class:`~emfast.sampling.Masked`.
    extra : dict of str to Volume or ndarray, optional
        Further input channels (e.g. a second imaging channel); each is converted like raw and delivered as its
        own batch field under its name. At raw's voxel size it must lie on raw voxel for voxel (same shape and
        offset); at another voxel size it is placed by its offset and interpolated linearly.
    name : str, optional
        Name for messages and hold-out (default: the raw volume's name).
    weight : float
        Relative probability of drawing an example from this sample (> 0).
    label_offset, mask_offset : (int, int, int), optional
        Position of the labels' / mask's first voxel in raw voxels. Otherwise taken from the datasets'
        ``offset``/``resolution`` attributes (a resolution without an offset lies at 0), or, where neither
        dataset has an ``offset`` or a ``resolution``, the shapes must be equal; an array without attributes
        beside a dataset with a resolution needs it given (``(0, 0, 0)`` where they start together). An explicit
        offset that contradicts the attributes is refused, naming both. Not for volumes at another voxel size
        than raw: those are placed by their offset attributes.
    own_resolution : sequence of str
        Fields (``"labels"``, ``"mask"``, extra channel names) delivered at their own voxel size: the same world
        box as the output window (or raw's, for extra channels), with the shape that box has at that voxel size.
        Every other field at another voxel size is delivered on raw's grid: labels and masks by nearest
        neighbour, extra channels interpolated linearly (see :mod:`emfast.sampling._resolution`). With a field
        coarser than raw delivered at its own voxel size, output windows snap down onto the fields' common grid
        after the sampler drew them (a ``Masked`` sampler's coverage and a ``Tiled`` sampler's tiles refer to
        the drawn corners); only mirrors and transposes between axes of equal ratio apply to such fields.

    Notes
    -----
    Offsets are in world units (e.g. nm), resolutions in world units per voxel. A dataset with a ``resolution``
    but no ``offset`` lies at offset 0, as gunpowder, funlib and the CREMI reader read it: CREMI's padded raw has
    no offset and its ``neuron_ids`` have one, so the labels start ``offset / resolution`` voxels into raw.

    Labels, masks and extra channels may have a voxel size that is an integer multiple or divisor of raw's along
    each axis (e.g. a mask at (160, 32, 32) nm for raw at (40, 8, 8) nm). Their offset relative to raw's must be a
    whole number of the finer voxel size along each axis, so that the grids nest; otherwise, and for any other
    ratio, the Sample is refused with the numbers.
    """

    raw: Union[Volume, np.ndarray]
    labels: Optional[Union[Volume, np.ndarray]] = None
    mask: Optional[Union[Volume, np.ndarray]] = None
    extra: Dict[str, Union[Volume, np.ndarray]] = field(default_factory=dict)
    name: Optional[str] = None
    weight: float = 1.0
    label_offset: Optional[Sequence[int]] = None
    mask_offset: Optional[Sequence[int]] = None
    own_resolution: Sequence[str] = ()

    def __post_init__(self) -> None:
        self.raw = _as_role_volume(self.raw, "raw", RAW_DTYPES)
        self.raw.check_finite()
        self.name = self.raw.name if self.name is None else str(self.name)
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) \
                or not 0 < self.weight < float("inf"):
            raise ValueError(f"sample {self.name}: weight must be a positive number, got {self.weight!r}")
        self.weight = float(self.weight)
        self.placed_labels = self._place(self.labels, "labels", LABEL_DTYPES, self.label_offset)
        self.placed_mask = self._place(self.mask, "mask", MASK_DTYPES, self.mask_offset)
        if self.label_offset is not None and self.labels is None:
            raise ValueError(f"sample {self.name}: label_offset was given but no labels")
        if self.mask_offset is not None and self.mask is None:
            raise ValueError(f"sample {self.name}: mask_offset was given but no mask")
        if not isinstance(self.extra, dict):
            raise TypeError(f"sample {self.name}: extra must be a dict of name to volume, got "
                            f"{type(self.extra).__name__}")
        extra, self.placed_extra = {}, {}
        for key in self.extra:  # str(key) merged 1 and "1" into one field, silently (a review)
            if not isinstance(key, str) or not key:
                raise TypeError(f"sample {self.name}: extra names must be non-empty strings (the batch's field "
                                f"names), got {key!r}")
        for key, source in self.extra.items():
            volume = _as_role_volume(source, f"extra {key!r}", RAW_DTYPES, role="extra channels")
            grid = _grid(self.raw, volume, f"extra {key!r}", None, "")
            if grid is None:
                self._check_on_raw(volume)
                placed = Placed(volume, np.zeros(3, dtype=np.int64), linear=True)
            else:
                placed = Placed(volume, OnRawGrid(volume, grid, linear=True).origin, grid, linear=True)
                _check_overlap(self.raw, placed)
            volume.check_finite()
            extra[key] = volume
            self.placed_extra[key] = placed
        self.extra = extra
        self.own_resolution = self._own_resolution()

    def _own_resolution(self) -> Tuple[str, ...]:
        names = (self.own_resolution,) if isinstance(self.own_resolution, str) else tuple(self.own_resolution)
        known = {"labels": self.placed_labels, "mask": self.placed_mask, **self.placed_extra}
        for name in names:
            if not isinstance(name, str) or known.get(name) is None:
                fields = sorted(key for key, placed in known.items() if placed is not None)
                raise ValueError(f"sample {self.name}: own_resolution names {name!r}, which is not a field of this "
                                 f"sample (its fields: {fields})")
        return tuple(dict.fromkeys(names))

    def placed(self, name: str) -> Optional[Placed]:
        """The placed field ``name`` (``"labels"``, ``"mask"`` or an extra channel), or None."""
        return {"labels": self.placed_labels, "mask": self.placed_mask}.get(name, self.placed_extra.get(name))

    def _place(self, source, what: str, dtypes, offset) -> Optional[Placed]:
        if source is None:
            return None
        volume = _as_role_volume(source, what, dtypes)
        if volume.channels != 1:
            raise ValueError(f"{volume.name}: {what} must have one channel, got {volume.channels}")
        offset_name = f"{what.rstrip('s')}_offset"
        grid = _grid(self.raw, volume, what, offset, offset_name)
        if grid is None:
            placed = Placed(volume, origin_in(self.raw, volume, offset, offset_name))
        else:
            placed = Placed(volume, OnRawGrid(volume, grid, linear=False).origin, grid)
        _check_overlap(self.raw, placed)
        return placed

    def _check_on_raw(self, volume: Volume) -> None:
        """An extra channel is cut with raw's windows: it must cover raw exactly, by shape and by offset."""
        if volume.shape != self.raw.shape:
            raise ValueError(f"{volume.name} has shape {volume.shape} but {self.raw.name} has "
                             f"{self.raw.shape}; extra channels must be aligned with raw voxel for voxel")
        origin = origin_in(self.raw, volume, None)
        if np.any(origin != 0):
            raise ValueError(f"{volume.name} ({_offset_text(volume)}) lies at {_ints(origin)} in the voxels of "
                             f"{self.raw.name} ({_offset_text(self.raw)}); extra channels must be aligned with raw "
                             "voxel for voxel")

    def __repr__(self) -> str:
        parts = [f"raw={self.raw.shape}"]
        if self.placed_labels is not None:
            parts.append(f"labels={self.placed_labels.volume.shape} at {_ints(self.placed_labels.origin)}")
        if self.placed_mask is not None:
            parts.append(f"mask={self.placed_mask.volume.shape} at {_ints(self.placed_mask.origin)}")
        parts += [f"{key}={volume.shape}" for key, volume in self.extra.items()]
        return f"Sample({self.name!r}, {', '.join(parts)}, weight={self.weight})"

    @property
    def volumes(self) -> List[Volume]:
        """The sample's volumes: raw, extra channels, labels and mask (those it has)."""
        return [self.raw, *self.extra.values()] + [placed.volume for placed in (self.placed_labels, self.placed_mask)
                                                   if placed is not None]

    def close(self) -> None:
        """Close the files of the sample's lazy volumes (raw, labels, mask, extra channels); idempotent."""
        for volume in self.volumes:
            volume.close()


class Dataset:
    """Several samples that batches are drawn from, checked to be consistent with each other.

    Parameters
    ----------
    samples : sequence of Sample
        At least one. All have the same raw dtype and channel count, and either all or none have labels
        (of one dtype), masks, and the same extra channels.

    Examples
    --------
    >>> dataset = Dataset([Sample(raw_a, labels_a, name="A"), Sample(raw_b, labels_b, name="B", weight=2)])
    >>> train, validation = dataset.split(hold_out=["B"])
    """

    def __init__(self, samples: Iterable[Sample]) -> None:
        if isinstance(samples, Sample):
            samples = [samples]
        if isinstance(samples, (str, bytes)) or not isinstance(samples, Iterable):
            raise TypeError(f"a Dataset takes a Sample or a list of them, got {type(samples).__name__}")
        self.samples: List[Sample] = list(samples)
        if not self.samples:
            raise ValueError("a Dataset needs at least one Sample")
        for sample in self.samples:
            if not isinstance(sample, Sample):
                raise TypeError(f"Dataset items must be emfast.Sample, got {type(sample).__name__}")
        names = [sample.name for sample in self.samples]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"sample names must be unique; repeated: {duplicates} (pass name=... to Sample)")
        self._check_consistent()

    def close(self) -> None:
        """Close the files of every sample's lazy volumes (see :meth:`Sample.close`)."""
        for sample in self.samples:
            sample.close()

    def _check_consistent(self) -> None:
        first = self.samples[0]

        def describe(sample: Sample) -> tuple:
            labels = sample.placed_labels.volume.dtype if sample.placed_labels is not None else None
            own = tuple(sorted((name, _ratio_text(sample.placed(name))) for name in sample.own_resolution))
            return (sample.raw.dtype, sample.raw.channels, labels, sample.placed_mask is not None,
                    tuple(sorted((key, volume.dtype, volume.channels) for key, volume in sample.extra.items())), own)

        what = ("raw dtype", "raw channels", "labels dtype (or no labels)", "having a mask",
                "extra channels (names, dtypes, channels)",
                "fields delivered at their own voxel size (names, voxel size over raw's), whose shapes must agree")
        reference = describe(first)
        for sample in self.samples[1:]:
            for name, a, b in zip(what, reference, describe(sample)):
                if a != b:
                    raise ValueError(f"samples {first.name!r} and {sample.name!r} differ in {name}: {a} vs {b}")

    @property
    def names(self) -> List[str]:
        return [sample.name for sample in self.samples]

    @property
    def has_labels(self) -> bool:
        return self.samples[0].placed_labels is not None

    @property
    def has_mask(self) -> bool:
        return self.samples[0].placed_mask is not None

    def split(self, hold_out: Iterable[str]) -> Tuple["Dataset", "Dataset"]:
        """Split into (training, held-out) datasets by sample name, for cross-validation.

        Parameters
        ----------
        hold_out : str or iterable of str
            Names of the samples to hold out (see :class:`~emfast.Sample`'s ``name``).

        Returns
        -------
        (Dataset, Dataset)
            The other samples, then the held-out ones, each in this dataset's order.

        Raises
        ------
        ValueError
            A name that matches no sample, or holding out every sample (or none).
        """
        if isinstance(hold_out, str):
            hold_out = [hold_out]
        if hold_out is None:
            raise ValueError(f"hold_out=None holds out no sample: name at least one of {self.names}")
        if not isinstance(hold_out, Iterable):
            raise TypeError(f"hold_out must be a sample's name or a list of names, got {hold_out!r}")
        held = list(hold_out)
        unknown = [name for name in held if name not in self.names]
        if unknown:
            raise ValueError(f"hold-out name(s) {unknown} match no sample; samples: {self.names}")
        if not held or len(set(held)) == len(self.samples):
            raise ValueError(f"hold out at least one and at most {len(self.samples) - 1} of {self.names}")
        train = [sample for sample in self.samples if sample.name not in held]
        validation = [sample for sample in self.samples if sample.name in held]
        return Dataset(train), Dataset(validation)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self):
        return iter(self.samples)

    def __repr__(self) -> str:
        return "Dataset([" + ", ".join(repr(sample) for sample in self.samples) + "])"


def _ratio_text(placed: Placed) -> str:
    ratio = (1, 1, 1) if placed.grid is None else placed.grid.ratio()
    return "(" + ", ".join(str(r) for r in ratio) + ")"


def as_dataset(data, labels=None, label_offset=None) -> Dataset:
    """Accept a Dataset, a Sample, a list of Samples, or raw (Volume/ndarray) with optional labels."""
    if isinstance(data, Dataset):
        extra = [name for name, value in (("labels", labels), ("label_offset", label_offset)) if value is not None]
        if extra:
            raise ValueError(f"{' and '.join(extra)} cannot be combined with a Dataset; put them in its Samples")
        return data
    if isinstance(data, Sample) or (isinstance(data, (list, tuple)) and data and
                                    all(isinstance(item, Sample) for item in data)):
        return as_dataset(Dataset(data), labels, label_offset)
    return Dataset([Sample(data, labels, label_offset=label_offset)])
