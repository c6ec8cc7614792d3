"""zstd chunks decoded many at a time without the GIL, by the system's libzstd where there is one.

numcodecs decodes each zstd frame in a call of its own, which sets up a decoding context every time (zstd's manual
advises one context reused for many frames), behind the interpreter's bookkeeping: for the 64 KiB chunks of an EM
volume that is about a fifth of the decoding itself (23.6 against 19.0 ms for 256 chunks, ``benchmarks/lazy_cold.py``'s
store). :func:`decode_frames` hands a box's frames to one compiled call
(``emfast._core.files.decode_zstd``) that decodes them all with one context, so the reader threads of a box decode
side by side without waiting for the GIL between chunks.

emfast does not link libzstd: it looks for the shared library at run time (ctypes) and gives the compiled call
its functions' addresses. Where there is none (or one older than :data:`OLDEST`), :func:`decode_frames` returns
None and the chunks are decoded through numcodecs as before. ``EMFAST_SYSTEM_ZSTD=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import List, Optional, Sequence

import numpy as np

from ._native import FoundOnce

#: The oldest libzstd used (1.4.0, 2019): older ones decode too, but are not tested.
OLDEST = 10400


def _load():
    """The process's libzstd, bound to the compiled decoder, or False."""
    if os.environ.get("EMFAST_SYSTEM_ZSTD", "1") == "0":
        return False
    names = [ctypes.util.find_library("zstd"), "libzstd.so.1", "libzstd.dylib", "zstd.dll"]
    for name in filter(None, names):
        try:
            library = ctypes.CDLL(name)
            library.ZSTD_versionNumber.restype = ctypes.c_uint
            if library.ZSTD_versionNumber() < OLDEST:
                continue
            addresses = [ctypes.cast(getattr(library, function), ctypes.c_void_p).value for function in
                         ("ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_decompressDCtx", "ZSTD_isError")]
        except (OSError, AttributeError):
            continue
        from .._core.files import bind_zstd

        bind_zstd(*addresses)
        return library
    return False


_LIBZSTD = FoundOnce(_load)


def system_zstd() -> bool:
    """Whether :func:`decode_frames` decodes (a usable libzstd was found; looked for once)."""
    return _LIBZSTD.found()


def decode_frames(frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
    """Decode zstd frames ``frames[i]`` (bytes-like) into ``outs[i]`` (writeable C-contiguous) without the GIL.

    Returns
    -------
    numpy.ndarray or None
        bool per frame: True where it decoded to exactly ``outs[i].nbytes`` bytes; the others (damaged, or
        another size) are the caller's to decode another way, which names what is wrong. None if there is no
        usable libzstd: decode them all another way.
    """
    if not system_zstd():
        return None
    from .._core.files import decode_zstd

    return decode_zstd(list(frames), outs).astype(bool)
