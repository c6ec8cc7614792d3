"""Neuroglancer precomputed volumes as volume sources, through tensorstore (the optional extra
``emfast[tensorstore]``), read-only.

The ``info`` file lists scales; each has a ``resolution`` and a ``voxel_offset`` in (x, y, z) order, and
tensorstore's domain is (x, y, z, channel). emfast reads (c, z, y, x) with voxel (0, 0, 0) at the scale's voxel
offset, whose world position (nm) becomes the volume's ``offset``. tensorstore decodes with its own thread pool.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ._source import Stamp, VolumeSource


def tensorstore_missing() -> Optional[str]:
    """Why precomputed volumes cannot be read here, or None if they can."""
    try:
        import tensorstore  # noqa: F401
    except ImportError as error:
        return f"reading neuroglancer precomputed needs tensorstore ({error}); pip install 'emfast[tensorstore]'"
    return None


def is_precomputed(path: Path) -> bool:
    """True for a directory with a precomputed ``info`` file."""
    try:
        return (path / "info").is_file() and "scales" in json.loads((path / "info").read_text())
    except (OSError, ValueError):
        return False


class PrecomputedSource(VolumeSource):
    """One scale of a precomputed volume: ``scale`` by index (default 0, the finest), or by its (z, y, x)
    ``resolution``."""

    def __init__(self, path: Union[str, os.PathLike], scale: Optional[int] = None,
                 resolution: Optional[Sequence[float]] = None) -> None:
        reason = tensorstore_missing()
        if reason is not None:
            raise ImportError(reason)
        import tensorstore as ts
        path = Path(path)
        self.name = str(path)
        if not is_precomputed(path):
            raise FileNotFoundError(f"no neuroglancer precomputed volume at {path} (no info file with scales)")
        info = json.loads((path / "info").read_text())
        scales = info["scales"]
        if resolution is not None:
            wanted = [float(r) for r in resolution][::-1]
            matches = [i for i, s in enumerate(scales) if np.allclose(s["resolution"], wanted)]
            if not matches:
                raise ValueError(f"{self.name}: no scale has resolution {tuple(resolution)}; scales (z, y, x): "
                                 + ", ".join(str(tuple(s["resolution"][::-1])) for s in scales))
            scale = matches[0]
        index = 0 if scale is None else scale
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(scales):
            raise ValueError(f"{self.name}: scale must be an index in [0, {len(scales)}), got {scale!r}")
        chosen = scales[index]
        try:
            self._store = ts.open({"driver": "neuroglancer_precomputed",
                                   "kvstore": {"driver": "file", "path": str(path.resolve())},
                                   "scale_index": index}, read=True, write=False).result()
        except Exception as error:
            raise OSError(f"{self.name}: tensorstore cannot open scale {index}: {error}") from error
        self._origin = [int(o) for o in self._store.domain.inclusive_min[:3]]  # x, y, z
        x, y, z, c = (int(n) for n in self._store.domain.shape)
        self.full_shape = (c, z, y, x) if c > 1 else (z, y, x)
        self.dtype = np.dtype(self._store.dtype.numpy_dtype)
        self.chunks = tuple(int(n) for n in chosen["chunk_sizes"][0][::-1])
        self.resolution = tuple(float(r) for r in chosen["resolution"][::-1])
        self.offset = tuple(float(o) * r for o, r in zip(chosen["voxel_offset"][::-1], self.resolution))
        self._path, self._scale = path, index
        self.stamp = Stamp.of(path, f"scale {index}", path / "info")

    def read(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        z, y, x = (int(c) for c in corner)
        dz, dy, dx = (int(e) for e in extent)
        ox, oy, oz = self._origin
        try:
            data = self._store[ox + x:ox + x + dx, oy + y:oy + y + dy, oz + z:oz + z + dz].read().result()
        except Exception as error:
            raise OSError(f"{self.name}: cannot read the box at (z, y, x) = {tuple(corner)}: {error}") from error
        np.copyto(out, np.transpose(data, (3, 2, 1, 0)))

    def reopen_arguments(self) -> tuple:
        return str(self._path), self._scale
