"""Shared libraries that compiled decoders call, found at run time with ctypes (libzstd, c-blosc).

emfast links none of them: the wheels stay self-contained, and where a library is missing the chunks are decoded
the general way (numcodecs). A :class:`FoundOnce` looks for its library on first use, once per process.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional


class FoundOnce:
    """The result of ``find`` (a loaded library, bound to its compiled decoder, or False where there is none usable),
    called once, on the first :meth:`found`."""

    def __init__(self, find: Callable[[], object]) -> None:
        self._find = find
        self._lock = threading.Lock()
        self._library: Optional[object] = None  # kept: its functions stay loaded for the life of the process

    def found(self) -> bool:
        """Whether a usable library was found (looked for on the first call)."""
        if self._library is None:
            with self._lock:
                if self._library is None:
                    self._library = self._find()
        return self._library is not False
