"""Turning a batch plan into output arrays: window reads for lazy volumes, then one kernel call per field."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

from . import _kernels
from .plan import BatchPlan
from .profile import Profile
from .volumes import Volume

#: Default normalisation (scale, shift) per raw dtype: integers to [0, 1], floats unchanged.
DEFAULT_NORMALIZATION = {
    np.dtype(np.uint8): (1.0 / 255.0, 0.0),
    np.dtype(np.uint16): (1.0 / 65535.0, 0.0),
    np.dtype(np.float32): (1.0, 0.0),
}


@dataclass
class Field:
    """One named output of a batch, cut from one volume.

    ``origin`` is the position of the volume's voxel (0, 0, 0) in raw coordinates; ``convert`` selects the
    converting kernel (raw) rather than the bit-exact copy (labels).
    """

    name: str
    volume: Volume
    origin: np.ndarray
    dtype: np.dtype
    convert: bool

    def shape(self, batch_size: int, patch: Sequence[int]) -> tuple:
        return (batch_size, self.volume.channels) + tuple(patch)


class Gatherer:
    """Fills a slot's arrays with the windows of a plan.

    Parameters
    ----------
    fields : list of Field
        What a batch holds, in order.
    patch : tuple of int
        Output window (z, y, x).
    batch_size : int
        Examples per batch.
    normalization : (float, float)
        Raw ``scale`` and ``shift``: converted raw = ``x * scale + shift``, before intensity augmentation.
    """

    def __init__(self, fields: List[Field], patch, batch_size: int, normalization) -> None:
        self.fields = fields
        self.patch = tuple(patch)
        self.batch_size = batch_size
        self.scale, self.shift = (float(v) for v in normalization)
        self._window_elements = int(np.prod(self.patch))

    def allocate(self) -> Dict[str, np.ndarray]:
        """New output arrays for one slot, with their pages already mapped (no first-touch cost mid-stream)."""
        arrays = {f.name: np.empty(f.shape(self.batch_size, self.patch), dtype=f.dtype) for f in self.fields}
        for array in arrays.values():
            array.fill(0)
        return arrays

    def new_scratch(self) -> Dict[str, List[np.ndarray]]:
        """Per-thread read buffers, one flat buffer per example, for each lazily read field."""
        size = self._window_elements
        return {f.name: [np.empty(f.volume.channels * size, dtype=f.volume.dtype) for _ in range(self.batch_size)]
                for f in self.fields if not f.volume.in_memory}

    def fill(self, arrays: Dict[str, np.ndarray], plan: BatchPlan, scratch: Dict[str, List[np.ndarray]],
             profile: Profile) -> None:
        """Write the batch of ``plan`` into ``arrays``, timing reads and kernels in ``profile``."""
        params = plan.params
        for f in self.fields:
            corners = plan.corners - f.origin
            if f.volume.in_memory:
                sources = [f.volume.array] * self.batch_size
            else:
                with profile.timer("read"):
                    sources = self._read(f, corners, plan.extents, scratch[f.name])
                corners = np.zeros_like(corners)
            with profile.timer("kernel"):
                if f.convert:
                    scale = (self.scale * params.gain).astype(np.float32)
                    shift = (self.shift * params.gain + params.bias).astype(np.float32)
                    _kernels.gather_convert(sources, corners, params.perms, params.flips, scale, shift,
                                            arrays[f.name])
                else:
                    _kernels.gather_copy(sources, corners, params.perms, params.flips, arrays[f.name])

    def _read(self, f: Field, corners: np.ndarray, extents: np.ndarray, buffers: List[np.ndarray]):
        sources = []
        for corner, extent, buffer in zip(corners, extents, buffers):
            window = buffer.reshape((f.volume.channels,) + tuple(int(e) for e in extent))
            f.volume.read_box(corner, extent, window)
            if f.convert and f.volume.dtype.kind == "f" and not np.isfinite(window).all():
                raise ValueError(f"{f.volume.name}: NaN or infinity in the window at (z, y, x) = "
                                 f"{tuple(int(c) for c in corner)}")
            sources.append(window)
        return sources
