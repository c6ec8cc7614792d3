"""A remote chunk whose bytes change between two reads, noticed.

A lazy volume reads a chunk again once its cache has dropped it. A store written meanwhile (a pipeline still
exporting the volume, a bucket synced under the run) would give batches that mix its old and new contents, and
nothing else says so: object stores keep no modification time that one request returns with the bytes, and the
metadata stays the same. So each chunk read is remembered by its length and the first 8 bytes of its SHA-256, in a
table of fixed size indexed by a hash of its path; a read whose bytes differ from the remembered ones is reported.
(Not CRC-32: a gzip member of incompressible data holds the data and its CRC-32, and the CRC-32 of data followed by
its own CRC-32 is the same for all data: every such N5 block of one size has the same CRC-32.)

The table holds :data:`SLOTS` chunks (24 bytes each: 6 MiB, of which only the slots used take memory). A chunk
whose slot another chunk took since it was read is remembered anew, unchecked: over more chunks than that, a
change may go unnoticed. A slot keeps its chunk's 64-bit path hash, so no chunk is taken for another.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Optional

import numpy as np

#: Chunks remembered at once (see the module's notes).
SLOTS = 1 << 18


def _described(size: int) -> str:
    """A remembered size (the length + 1, 0 for a missing chunk) in words."""
    return "absent" if size == 0 else f"{size - 1} bytes"


class ChunkDigests:
    """The digests of the chunks a remote store read (thread-safe), see the module's notes."""

    def __init__(self, slots: int = SLOTS) -> None:
        self._paths = np.zeros(slots, np.int64)  # the path's hash, 0 for an empty slot
        self._sizes = np.zeros(slots, np.int64)  # the length + 1, 0 for a missing chunk
        self._digests = np.zeros(slots, np.int64)
        self._lock = threading.Lock()

    def changed(self, path: str, data) -> Optional[str]:
        """Remember ``data`` (bytes-like, or None where the store has no such key) as ``path``'s bytes; if ``path``
        was read before with other bytes, keep those and return how the two reads differ."""
        size = 0 if data is None else len(data) + 1
        digest = 0 if data is None else int.from_bytes(hashlib.sha256(data).digest()[:8], "little", signed=True)
        key = hash(path) or 1
        slot = key % len(self._paths)
        with self._lock:
            if self._paths[slot] != key:
                self._paths[slot], self._sizes[slot], self._digests[slot] = key, size, digest
                return None
            before, same = int(self._sizes[slot]), int(self._digests[slot]) == digest
        if before == size and same:
            return None
        now = "other bytes, as many" if before == size else _described(size)
        return f"{_described(before)} when read before, {now} now"
