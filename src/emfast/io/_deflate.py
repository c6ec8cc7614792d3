"""gzip and zlib chunks inflated many at a time without the GIL, by the system's libdeflate where there is one.

gzip is N5's default compression (N5-Java, z5py, tensorstore, BigDataViewer and Paintera write it) and one of
zarr's. Python's zlib inflates a 64 KiB chunk of EM in about 0.43 ms, libdeflate in 0.20 ms (256 chunks of
``benchmarks/lazy_cold.py``'s volume: 108 against 51 ms): tensorstore inflates faster than zlib too.
:func:`decode_frames` hands a box's streams to one compiled call (``emfast._core.files.decode_deflate``) that
inflates them with one decompressor, straight into their blocks.

emfast does not link libdeflate: it looks for the shared library at run time (ctypes; the ``_ex`` functions, which
report the bytes consumed, are in every release since 1.5) and gives the compiled call their addresses. Where
there is none, :func:`decode_frames` returns None and zlib inflates as before. ``EMFAST_SYSTEM_DEFLATE=0`` turns it
off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import List, Optional, Sequence

import numpy as np

from ._native import FoundOnce


def _load():
    """The process's libdeflate, bound to the compiled decoder, or False."""
    if os.environ.get("EMFAST_SYSTEM_DEFLATE", "1") == "0":
        return False
    names = [ctypes.util.find_library("deflate"), "libdeflate.so.0", "libdeflate.0.dylib", "libdeflate.dll"]
    for name in filter(None, names):
        try:
            library = ctypes.CDLL(name)
            addresses = [ctypes.cast(getattr(library, function), ctypes.c_void_p).value for function in
                         ("libdeflate_alloc_decompressor", "libdeflate_free_decompressor",
                          "libdeflate_gzip_decompress_ex", "libdeflate_zlib_decompress_ex")]
        except (OSError, AttributeError):
            continue
        from .._core.files import bind_deflate

        bind_deflate(*addresses)
        return library
    return False


_LIBDEFLATE = FoundOnce(_load)


def system_deflate() -> bool:
    """Whether :func:`decode_frames` decodes (a usable libdeflate was found; looked for once)."""
    return _LIBDEFLATE.found()


def decode_frames(frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
    """Inflate gzip or zlib streams ``frames[i]`` (bytes-like) into ``outs[i]`` (writeable C-contiguous) without the
    GIL.

    Returns
    -------
    numpy.ndarray or None
        bool per stream: True where it is one whole stream that inflated to exactly ``outs[i].nbytes`` bytes; the
        others (damaged, another size, several gzip members) are the caller's to inflate another way, which names
        what is wrong. None if there is no usable libdeflate: inflate them all another way.
    """
    if not system_deflate():
        return None
    from .._core.files import decode_deflate

    return decode_deflate(list(frames), outs).astype(bool)
