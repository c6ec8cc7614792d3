"""A whole volume read from its store: for in-memory opens and ``np.asarray`` of a lazy volume.

Read in one call, a store goes through its library's general path: zarr-python for zarr, whose pipeline read a
(96, 512, 512) uint8 zstd array in 172 ms where tensorstore takes 30. Where the source reads chunks itself faster
(:attr:`~emfast.io._source.VolumeSource.whole_by_chunks`: the compiled file reads and decoders, decode helpers
where cores are idle), :func:`read_whole` reads the volume through its ``read_many``, in waves of whole chunks
decoded into chunk buffers, each then copied into place: 42 ms for that array, blosc-lz4 24 ms against 147,
sharded 67 against 120, N5 gzip 74 against 108, HDF5 gzip 100 against 185, raw precomputed 17 against 26 (gzipped
56 against 205).
"""
from __future__ import annotations

import itertools
import math
from typing import Dict, List

import numpy as np

#: Most bytes of chunk buffers at once: a wave's chunks are decoded before they are copied into place.
WAVE_BYTES = 32 << 20


def read_whole(source, out: np.ndarray) -> None:
    """Fill ``out`` (c, z, y, x) with the whole volume of ``source`` (a VolumeSource): chunk by chunk through its
    ``read_many`` where that is faster (``whole_by_chunks``), else in one ``read``."""
    read_many = getattr(source, "read_many", None)
    if read_many is None or source.chunks is None or not source.whole_by_chunks:
        source.read((0, 0, 0), out.shape[1:], out)
        return
    shape, chunk = out.shape[1:], tuple(int(c) for c in source.chunks)
    corners = list(itertools.product(*(range(0, s, c) for s, c in zip(shape, chunk))))
    per_wave = max(1, WAVE_BYTES // (out.shape[0] * math.prod(chunk) * out.dtype.itemsize))
    spare: Dict[tuple, List[np.ndarray]] = {}  # extent -> the previous wave's buffers, reused (no fresh pages)
    for first in range(0, len(corners), per_wave):
        requests = []
        for corner in corners[first:first + per_wave]:
            extent = tuple(min(c, s - o) for o, c, s in zip(corner, chunk, shape))
            kept = spare.get(extent)
            requests.append((corner, extent, kept.pop() if kept else np.empty((out.shape[0],) + extent, out.dtype)))
        read_many(requests)
        spare = {}
        for corner, extent, buffer in requests:
            out[(slice(None),) + tuple(slice(o, o + e) for o, e in zip(corner, extent))] = buffer
            spare.setdefault(extent, []).append(buffer)
