"""gzip and zlib chunks inflated many at a time without the GIL, by the system's libdeflate where there is one.

gzip is N5's default compression (N5-Java, z5py, tensorstore, BigDataViewer and Paintera write it) and one of
zarr's. Python's zlib inflates a 64 KiB chunk of EM in about 0.43 ms, libdeflate in 0.20 ms (256 chunks of
``benchmarks/lazy_cold.py``'s volume: 108 against 51 ms): tensorstore inflates faster than zlib too.
:func:`decode_frames` hands a box's streams to one compiled call (``emfast._core.files.decode_frames``) that
inflates them with one decompressor, straight into their blocks.

emfast does not link libdeflate: it looks for the shared library at run time (ctypes; the ``_ex`` functions, which
report the bytes consumed, are in every release since 1.5) and gives the compiled call their addresses. Where
there is none, :func:`decode_frames` returns None and zlib inflates as before. ``EMFAST_SYSTEM_DEFLATE=0`` turns it
off.
"""
from __future__ import annotations

import ctypes.util
import zlib
from typing import List, Optional, Sequence

import numpy as np

from ._native import CompiledDecoder

_LIBDEFLATE = CompiledDecoder(
    "deflate", "EMFAST_SYSTEM_DEFLATE",
    lambda: [ctypes.util.find_library("deflate"), "libdeflate.so.0", "libdeflate.0.dylib", "libdeflate.dll"],
    ("libdeflate_alloc_decompressor", "libdeflate_free_decompressor", "libdeflate_gzip_decompress_ex",
     "libdeflate_zlib_decompress_ex"))


def system_deflate() -> bool:
    """Whether :func:`decode_frames` decodes (a usable libdeflate was found; looked for once)."""
    return _LIBDEFLATE.found()


def decode_frames(frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
    """Inflate gzip or zlib streams ``frames[i]`` (gzip where they start with its magic bytes) into ``outs[i]`` in
    one call without the GIL, by the system's libdeflate (:meth:`CompiledDecoder.decode
    <emfast.io._native.CompiledDecoder.decode>`: None where there is none); a stream that is not exactly one whole
    stream (several gzip members, bytes after it) is refused."""
    return _LIBDEFLATE.decode(frames, outs)


def inflate(data, size: int) -> Optional[np.ndarray]:
    """``data``, one whole gzip or zlib stream, inflated to exactly ``size`` bytes (uint8) by libdeflate; None where
    there is none or it refuses the stream: the caller inflates it with zlib, whose error says what is wrong."""
    out = np.empty(size, np.uint8)
    decoded = decode_frames([data], [out])
    return out if decoded is not None and decoded[0] else None


def inflated(data, size: int, wbits: int = zlib.MAX_WBITS):
    """``data`` inflated to its ``size`` bytes: by libdeflate where there is one (:func:`inflate`), else, or where
    it refuses the stream, by zlib with ``wbits`` (15: zlib, 47: gzip or zlib), whose ``zlib.error`` says what is
    wrong (the caller names the chunk)."""
    out = inflate(data, size)
    return out if out is not None else zlib.decompress(data, wbits, size)  # sized once: no growing copies
