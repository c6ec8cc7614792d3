"""Compiled decoders of many frames at once, bound at run time to a shared library found with ctypes (libzstd,
c-blosc, libdeflate).

emfast links none of them: the wheels stay self-contained, and where a library is missing the chunks are decoded
the general way (numcodecs, zlib). A :class:`CompiledDecoder` looks for its library on first use, once per process,
gives the compiled call (``emfast._core.files.decode_frames``) its functions' addresses, and decodes a box's frames
in one call without the GIL.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref
from typing import Callable, Iterable, List, Optional, Sequence

import numpy as np


#: Every decoder, whose lock a fork may copy held (the parent looking its library up meanwhile).
_DECODERS: "weakref.WeakSet[CompiledDecoder]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for decoder in list(_DECODERS):
        # the thread holding it in the parent does not exist here; a lookup it left unfinished is made afresh
        decoder._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class CompiledDecoder:
    """One codec's compiled decoder, bound to the first usable library of ``names``.

    Parameters
    ----------
    codec : str
        The codec as ``emfast._core.files`` names it ("zstd", "blosc", "deflate").
    switch : str
        The environment variable that turns it off when "0".
    names : callable
        Library names or paths to try, in order (None entries are skipped).
    functions : sequence of str
        The functions whose addresses ``emfast._core.files.bind_<codec>`` takes, in its order.
    usable : callable, optional
        ``usable(library)``: False for a library found but not to be used (too old).
    """

    def __init__(self, codec: str, switch: str, names: Callable[[], Iterable[Optional[str]]],
                 functions: Sequence[str], usable: Callable[[ctypes.CDLL], bool] = lambda library: True) -> None:
        self.codec, self._switch, self._names = codec, switch, names
        self._functions, self._usable = tuple(functions), usable
        self._lock = threading.Lock()
        self._library: Optional[object] = None  # kept: its functions stay loaded for the life of the process
        _DECODERS.add(self)

    def found(self) -> bool:
        """Whether a usable library was found (looked for on the first call)."""
        if self._library is None:
            with self._lock:
                if self._library is None:
                    self._library = self._find()
        return self._library is not False

    def decode(self, frames: Sequence, outs: List[np.ndarray]) -> Optional[np.ndarray]:
        """Decode ``frames[i]`` (bytes-like) into ``outs[i]`` (writeable C-contiguous) without the GIL.

        Returns
        -------
        numpy.ndarray or None
            bool per frame: True where it decoded to exactly ``outs[i].nbytes`` bytes; the others (damaged, or
            another size) are the caller's to decode another way, which names what is wrong. None if there is no
            usable library: decode them all another way.
        """
        if not self.found():
            return None
        from .._core.files import decode_frames

        return decode_frames(self.codec, list(frames), outs).astype(bool)

    def _find(self):
        """The first usable library, bound to the compiled decoder, or False."""
        if os.environ.get(self._switch, "1") == "0":
            return False
        for name in filter(None, self._names()):
            try:
                library = ctypes.CDLL(name)
                if not self._usable(library):
                    continue
                addresses = [ctypes.cast(getattr(library, function), ctypes.c_void_p).value
                             for function in self._functions]
            except (OSError, AttributeError):
                continue
            from .._core import files

            getattr(files, f"bind_{self.codec}")(*addresses)
            return library
        return False
