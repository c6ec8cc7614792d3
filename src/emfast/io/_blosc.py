"""blosc chunks decoded many at a time without the GIL, by c-blosc's own decoder.

numcodecs decodes each blosc frame in a call of its own, and each call first asks which process and thread it runs
in (to choose between blosc's global, locked context and a private one) and checks its buffers in Python. For the
64 KiB lz4 chunks of an EM volume that costs more than the decoding: 4.6 against 3.9 ms for 256 chunks, most of
a box's read being elsewhere (``benchmarks/lazy_cold.py``). :func:`decode_frames` hands a box's frames to one
compiled call (``emfast._core.files.decode_frames``) that decodes them with ``blosc_decompress_ctx``, c-blosc's
thread-safe decoder.

c-blosc is not linked: the one numcodecs ships (its extension module exports c-blosc's functions), else the
system's libblosc, is found at run time (ctypes), from version 1.16 on (``blosc_cbuffer_validate``; its decoder is
safe on damaged input). Where there is none, :func:`decode_frames` returns None and numcodecs decodes as before.
``EMFAST_NATIVE_BLOSC=0`` turns it off.
"""
from __future__ import annotations

import ctypes.util
from typing import List, Optional, Sequence

import numpy as np

from ._native import CompiledDecoder


def _candidates() -> list:
    """Libraries that may hold c-blosc: numcodecs' extension module, then the system's."""
    names = []
    try:
        from numcodecs import blosc
        names.append(blosc.__file__)
    except ImportError:
        pass
    return names + [ctypes.util.find_library("blosc"), "libblosc.so.1", "libblosc.dylib", "blosc.dll"]


#: c-blosc 1.16 or later: blosc_cbuffer_validate came with the decoder safe on damaged input.
_CBLOSC = CompiledDecoder("blosc", "EMFAST_NATIVE_BLOSC", _candidates,
                          ("blosc_cbuffer_validate", "blosc_decompress_ctx"))


def native_blosc() -> bool:
    """Whether :func:`decode_frames` decodes (a usable c-blosc was found; looked for once)."""
    return _CBLOSC.found()


def decode_frames(frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
    """Decode blosc frames ``frames[i]`` into ``outs[i]`` in one call without the GIL, by c-blosc
    (:meth:`CompiledDecoder.decode <emfast.io._native.CompiledDecoder.decode>`: None where there is none); a frame
    whose header states another size than ``outs[i]`` or than its own length is refused."""
    return _CBLOSC.decode(frames, outs)
