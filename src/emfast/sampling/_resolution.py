"""Fields stored at other voxel sizes than raw: where their voxels lie on raw's grid, and a view that reads them
resampled onto raw's grid.

A field's voxel size may be an integer multiple or an integer divisor of raw's along each axis. Offsets are in
world units (nm); the two grids must nest: the field's offset relative to raw is a whole number of the finer of the
two voxel sizes. Voxel i of a volume at offset o and voxel size v covers the world interval [o + i v, o + (i + 1) v)
(the funlib/gunpowder convention).

Delivered on raw's grid, raw voxel i takes:

* nearest (labels, masks): the field voxel that contains raw voxel i's centre (half-open intervals; for a finer
  field of even ratio the centre lies on a boundary and the voxel above it is taken). A coarser field's voxel
  holds whole raw voxels, so this is gunpowder's upsampling by repetition.
* linear (extra channels): the field interpolated linearly at raw voxel i's centre, field voxel j sitting at its
  own centre, clamped to the volume's first and last voxel at its edges.

A raw voxel belongs to the field's footprint on raw's grid when its centre lies inside the field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Tuple

import numpy as np

from .._core import rescale as _rescale
from ..io import Volume

#: How a field's voxel size may relate to raw's along an axis.
RATIO_RULE = "an integer multiple or divisor of raw's per axis"


def _exact(value: float) -> Fraction:
    """A metadata number (a float such as 4.0 or 0.5) as the fraction it stands for."""
    return Fraction(value).limit_denominator(1_000_000)


def _numbers(values) -> str:
    return "(" + ", ".join(f"{float(v):g}" for v in values) + ")"


@dataclass(frozen=True)
class FieldGrid:
    """A field's grid relative to raw's, per axis (z, y, x), in units of the finer of the two voxel sizes.

    Attributes
    ----------
    raw_step, field_step : tuple of int
        Raw's and the field's voxel sizes in those units; along each axis one of them is 1.
    shift : tuple of int
        The field's voxel 0 relative to raw's voxel 0, in those units.
    """

    raw_step: Tuple[int, int, int]
    field_step: Tuple[int, int, int]
    shift: Tuple[int, int, int]

    @classmethod
    def between(cls, raw: Volume, field: Volume, what: str) -> Optional["FieldGrid"]:
        """The grid of ``field`` (named ``what`` in messages) relative to ``raw``; None where the voxel sizes are
        equal (the caller places it in whole raw voxels as before).

        Raises
        ------
        ValueError
            A voxel-size ratio that is not an integer or the inverse of one, or an offset that puts the field's
            voxels off raw's (or raw's off the field's), each naming the field, the axis and the numbers.
        """
        raw_size = [_exact(v) for v in raw.resolution]
        field_size = [_exact(v) for v in field.resolution]
        if raw_size == field_size:
            return None
        shift = [_exact(f) - _exact(r) for f, r in zip(field.offset or (0, 0, 0), raw.offset or (0, 0, 0))]
        raw_step, field_step, units = [], [], []
        for axis, (r, f, d) in enumerate(zip(raw_size, field_size, shift)):
            ratio = f / r
            if ratio.denominator != 1 and ratio.numerator != 1:
                raise ValueError(
                    f"{what} ({field.name}) has voxel size {_numbers(field.resolution)} and raw ({raw.name}) "
                    f"{_numbers(raw.resolution)}: along {'zyx'[axis]} the ratio {float(ratio):g} is not "
                    f"{RATIO_RULE}")
            unit = min(r, f)
            if (d / unit).denominator != 1:
                raise ValueError(
                    f"{what} ({field.name}, offset {_numbers(field.offset or (0, 0, 0))}, voxel size "
                    f"{_numbers(field.resolution)}) lies {float(d):g} from raw ({raw.name}, offset "
                    f"{_numbers(raw.offset or (0, 0, 0))}, voxel size {_numbers(raw.resolution)}) along "
                    f"{'zyx'[axis]}: not a multiple of {float(unit):g}, so its voxels do not line up with raw's")
            raw_step.append(int(r / unit))
            field_step.append(int(f / unit))
            units.append(int(d / unit))
        return cls(tuple(raw_step), tuple(field_step), tuple(units))

    @classmethod
    def identity(cls, origin=(0, 0, 0)) -> "FieldGrid":
        """The grid of a field at raw's voxel size whose voxel 0 lies at raw voxel ``origin``."""
        return cls((1, 1, 1), (1, 1, 1), tuple(int(o) for o in origin))

    @property
    def coarser(self) -> Tuple[int, int, int]:
        """Raw voxels per field voxel along each axis (1 where the field is as fine or finer)."""
        return self.field_step

    @property
    def finer(self) -> Tuple[int, int, int]:
        """Field voxels per raw voxel along each axis (1 where the field is as coarse or coarser)."""
        return self.raw_step

    def ratio(self) -> Tuple[Fraction, Fraction, Fraction]:
        """Field voxel size over raw's, per axis."""
        return tuple(Fraction(f, r) for f, r in zip(self.field_step, self.raw_step))

    def footprint(self, shape) -> Tuple[np.ndarray, np.ndarray]:
        """(first, end) raw voxels whose centre lies inside a field of ``shape``."""
        first, end = [], []
        for a, b, d, n in zip(self.raw_step, self.field_step, self.shift, shape):
            # centre of raw voxel i, doubled: (2i + 1) a; inside when 2d <= (2i + 1) a < 2 (d + n b)
            first.append(-((a - 2 * d) // (2 * a)))
            end.append(-((a - 2 * (d + n * b)) // (2 * a)))
        return np.asarray(first, dtype=np.int64), np.asarray(end, dtype=np.int64)

    def inside(self, shape) -> Tuple[np.ndarray, np.ndarray]:
        """(first, end) raw voxels lying wholly inside a field of ``shape`` (where windows read at the field's own
        voxel size may reach)."""
        a, b, d = (np.asarray(v, dtype=np.int64) for v in (self.raw_step, self.field_step, self.shift))
        return -((-d) // a), (d + np.asarray(shape, dtype=np.int64) * b) // a

    def nearest(self, axis: int, raw_voxels: np.ndarray) -> np.ndarray:
        """The field voxel containing the centre of each raw voxel (raw voxel coordinates) along ``axis``."""
        a, b, d = self.raw_step[axis], self.field_step[axis], self.shift[axis]
        return ((2 * raw_voxels + 1) * a - 2 * d) // (2 * b)

    def linear(self, axis: int, raw_voxels: np.ndarray, size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo, hi, weight of hi) field voxels interpolating each raw voxel's centre along ``axis``, clamped to
        [0, size)."""
        a, b, d = self.raw_step[axis], self.field_step[axis], self.shift[axis]
        numerator = (2 * raw_voxels + 1) * a - 2 * d - b  # position in field voxels, times 2b
        lo = numerator // (2 * b)
        weight = (numerator - lo * 2 * b) / (2 * b)
        return np.clip(lo, 0, size - 1), np.clip(lo + 1, 0, size - 1), weight

    def own_corner(self, raw_corner: np.ndarray) -> np.ndarray:
        """The field voxel starting where raw voxel ``raw_corner`` (3,) starts, which must lie on the field's grid."""
        a = np.asarray(self.raw_step, dtype=np.int64)
        b = np.asarray(self.field_step, dtype=np.int64)
        return (np.asarray(raw_corner, dtype=np.int64) * a - np.asarray(self.shift, dtype=np.int64)) // b


class OnRawGrid:
    """A field stored at another voxel size, read as if it lay on raw's grid (the part of raw's grid inside it).

    Looks like a one-channel :class:`~emfast.io.Volume` to the gatherer and the samplers: ``shape``, ``dtype``,
    ``channels``, ``name``, ``in_memory`` (False), ``chunk_cache`` (None) and :meth:`read_box`, which reads the
    field's voxels covering the box and resamples them in a kernel that releases the GIL.

    Parameters
    ----------
    volume : Volume
        The field as stored.
    grid : FieldGrid
        Its grid relative to raw's.
    linear : bool
        Interpolate linearly into float32 (extra channels); else nearest neighbour, bit for bit in the volume's
        dtype (labels, masks).
    """

    in_memory = False
    chunk_cache = None

    def __init__(self, volume: Volume, grid: FieldGrid, linear: bool) -> None:
        self.volume = volume
        self.grid = grid
        self.linear = linear
        self.name = volume.name
        self.channels = volume.channels
        self.dtype = np.dtype(np.float32) if linear else volume.dtype
        first, end = grid.footprint(volume.shape)
        #: Raw voxel coordinates of this view's voxel (0, 0, 0).
        self.origin = first
        self.shape = tuple(int(n) for n in np.maximum(end - first, 0))

    def read_box(self, corner, extent, out: np.ndarray, *, timings=None) -> np.ndarray:
        """Read the box ``[corner, corner + extent)`` of this view (raw voxels from :attr:`origin`) into ``out``
        (``(channels, *extent)`` of :attr:`dtype`); ``timings`` as :meth:`emfast.Volume.read_box` takes it."""
        corner = tuple(int(c) for c in corner)
        extent = tuple(int(e) for e in extent)
        if min(corner) < 0 or min(extent) < 1 or any(c + e > s for c, e, s in zip(corner, extent, self.shape)):
            raise ValueError(f"{self.name}: box at {corner} of extent {extent} is not inside its footprint on raw's "
                             f"grid, of shape {self.shape}")
        tables, start, stop = self._tables(corner, extent)
        source = self._read(start, stop, timings)
        if self.linear:
            _rescale.rescale_linear(source, [(lo - s, hi - s, w) for (lo, hi, w), s in zip(tables, start)], out)
        else:
            _rescale.rescale_nearest(source, *(t - s for t, s in zip(tables, start)), out)
        return out

    def read_transformed(self, corner, extent, perm, flips, out: np.ndarray) -> np.ndarray:
        """Read the box ``[corner, corner + extent)`` (source axes) mirrored by ``flips`` (source axes) and
        transposed so that output axis j runs along source axis ``perm[j]``, straight into ``out`` (C-contiguous
        ``(channels, *output extent)``): the permutation and mirrors go into the kernel's tables and strides, so
        the window is written once (nearest neighbour only)."""
        tables, start, stop = self._tables(corner, extent)
        source = self._read(start, stop)
        tables = [t[::-1] - s if flip else t - s for t, s, flip in zip(tables, start, flips)]
        perm = [int(a) for a in perm]
        _rescale.rescale_nearest(source.transpose(0, *(1 + a for a in perm)), *(tables[a] for a in perm), out)
        return out

    @property
    def stored_cache(self):
        """The chunk cache of the stored field (None in memory), for read-ahead."""
        return self.volume.chunk_cache

    def stored_box(self, corner, extent) -> Tuple[np.ndarray, np.ndarray]:
        """(start, stop) of the stored field's voxels that :meth:`read_box` reads for this box."""
        return self._tables(corner, extent)[1:]

    def _tables(self, corner, extent) -> tuple:
        """Per axis the source positions of each raw voxel of the box, and the stored box [start, stop) they span."""
        raw_voxels = [self.origin[a] + np.arange(int(corner[a]), int(corner[a]) + int(extent[a]), dtype=np.int64)
                      for a in range(3)]
        if self.linear:
            tables = [self.grid.linear(a, raw_voxels[a], self.volume.shape[a]) for a in range(3)]
            return tables, np.asarray([lo.min() for lo, _, _ in tables]), \
                np.asarray([hi.max() + 1 for _, hi, _ in tables])
        tables = [self.grid.nearest(a, raw_voxels[a]) for a in range(3)]
        return tables, np.asarray([t[0] for t in tables]), np.asarray([t[-1] + 1 for t in tables])

    def _read(self, start: np.ndarray, stop: np.ndarray, timings=None) -> np.ndarray:
        """The stored field's box [start, stop): a view in memory, else read through its chunk cache."""
        if self.volume.in_memory:
            return self.volume.array[(slice(None),) + tuple(slice(int(a), int(b)) for a, b in zip(start, stop))]
        window = np.empty((self.channels,) + tuple(int(n) for n in stop - start), dtype=self.volume.dtype)
        return self.volume.read_box(start, stop - start, window, timings=timings)

    def __repr__(self) -> str:
        how = "linearly" if self.linear else "by nearest neighbour"
        return f"OnRawGrid({self.name!r}, shape {self.shape} on raw's grid, resampled {how})"


def lcm_phase(constraints, what: str) -> Tuple[int, int]:
    """The least (step, phase) with phase % k == r % k for every (k, r, name) of ``constraints`` along one axis:
    the common grid of coarser fields delivered at their own voxel size.

    Raises
    ------
    ValueError
        Two fields whose grids never meet (naming them, ``what`` says where).
    """
    step = math.lcm(1, *(k for k, _, _ in constraints))
    for phase in range(step):
        if all(phase % k == r % k for k, r, _ in constraints):
            return step, phase
    described = ", ".join(f"{name} every {k} raw voxels from {r}" for k, r, name in constraints)
    raise ValueError(f"{what}: the grids of the fields delivered at their own voxel size never meet ({described}), "
                     "so no window can start on all of them; deliver one of them on raw's grid")
