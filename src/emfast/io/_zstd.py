"""zstd chunks decoded many at a time without the GIL, by the system's libzstd where there is one.

numcodecs decodes each zstd frame in a call of its own, which sets up a decoding context every time (zstd's manual
advises one context reused for many frames), behind the interpreter's bookkeeping: for the 64 KiB chunks of an EM
volume that is about a fifth of the decoding itself (23.6 against 19.0 ms for 256 chunks, ``benchmarks/lazy_cold.py``'s
store). :func:`decode_frames` hands a box's frames to one compiled call
(``emfast._core.files.decode_frames``) that decodes them all with one context, so the reader threads of a box decode
side by side without waiting for the GIL between chunks.

emfast does not link libzstd: it looks for the shared library at run time (ctypes) and gives the compiled call
its functions' addresses. Where there is none (or one older than :data:`OLDEST`), :func:`decode_frames` returns
None and the chunks are decoded through numcodecs as before. ``EMFAST_SYSTEM_ZSTD=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import List, Optional, Sequence

import numpy as np

from ._native import CompiledDecoder

#: The oldest libzstd used (1.4.0, 2019): older ones decode too, but are not tested.
OLDEST = 10400


def _recent(library) -> bool:
    library.ZSTD_versionNumber.restype = ctypes.c_uint
    return library.ZSTD_versionNumber() >= OLDEST


_LIBZSTD = CompiledDecoder(
    "zstd", "EMFAST_SYSTEM_ZSTD",
    lambda: [ctypes.util.find_library("zstd"), "libzstd.so.1", "libzstd.dylib", "zstd.dll"],
    ("ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_decompressDCtx", "ZSTD_isError"), _recent)


def system_zstd() -> bool:
    """Whether :func:`decode_frames` decodes (a usable libzstd was found; looked for once)."""
    return _LIBZSTD.found()


def decode_frames(frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
    """Decode zstd frames ``frames[i]`` into ``outs[i]`` in one call without the GIL, by the system's libzstd
    (:meth:`CompiledDecoder.decode <emfast.io._native.CompiledDecoder.decode>`: None where there is none)."""
    return _LIBZSTD.decode(frames, outs)
