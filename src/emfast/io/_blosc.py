"""blosc chunks decoded many at a time without the GIL, by c-blosc's own decoder.

numcodecs decodes each blosc frame in a call of its own, and each call first asks which process and thread it runs
in (to choose between blosc's global, locked context and a private one) and checks its buffers in Python. For the
64 KiB lz4 chunks of an EM volume that costs more than the decoding: 4.6 against 3.9 ms for 256 chunks, most of
a box's read being elsewhere (``benchmarks/lazy_cold.py``). :func:`decode_frames` hands a box's frames to one
compiled call (``emfast._core.files.decode_blosc``) that decodes them with ``blosc_decompress_ctx``, c-blosc's
thread-safe decoder.

c-blosc is not linked: the one numcodecs ships (its extension module exports c-blosc's functions), else the
system's libblosc, is found at run time (ctypes), from version 1.16 on (``blosc_cbuffer_validate``; its decoder is
safe on damaged input). Where there is none, :func:`decode_frames` returns None and numcodecs decodes as before.
``EMFAST_NATIVE_BLOSC=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import List, Optional, Sequence

import numpy as np

from ._native import FoundOnce


def _candidates() -> list:
    """Libraries that may hold c-blosc: numcodecs' extension module, then the system's."""
    names = []
    try:
        from numcodecs import blosc
        names.append(blosc.__file__)
    except ImportError:
        pass
    return names + [ctypes.util.find_library("blosc"), "libblosc.so.1", "libblosc.dylib", "blosc.dll"]


def _load():
    """A library with c-blosc 1.16 or later, bound to the compiled decoder, or False."""
    if os.environ.get("EMFAST_NATIVE_BLOSC", "1") == "0":
        return False
    for name in filter(None, _candidates()):
        try:
            library = ctypes.CDLL(name)
            addresses = [ctypes.cast(getattr(library, function), ctypes.c_void_p).value
                         for function in ("blosc_cbuffer_validate", "blosc_decompress_ctx")]
        except (OSError, AttributeError):
            continue
        from .._core.files import bind_blosc

        bind_blosc(*addresses)
        return library
    return False


_CBLOSC = FoundOnce(_load)


def native_blosc() -> bool:
    """Whether :func:`decode_frames` decodes (a usable c-blosc was found; looked for once)."""
    return _CBLOSC.found()


def decode_frames(frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
    """Decode blosc frames ``frames[i]`` (bytes-like) into ``outs[i]`` (writeable C-contiguous) without the GIL.

    Returns
    -------
    numpy.ndarray or None
        bool per frame: True where it decoded to exactly ``outs[i].nbytes`` bytes; the others (damaged, or
        another size) are the caller's to decode another way, which names what is wrong. None if there is no
        usable c-blosc: decode them all another way.
    """
    if not native_blosc():
        return None
    from .._core.files import decode_blosc

    return decode_blosc(list(frames), outs).astype(bool)
