"""A remote chunk whose bytes change between two reads, noticed.

A lazy volume reads a chunk again once its cache has dropped it. A store written meanwhile (a pipeline still
exporting the volume, a bucket synced under the run) would give batches that mix its old and new contents, and
nothing else says so: object stores keep no modification time that one request returns with the bytes, and the
metadata stays the same. So each chunk read is remembered by its length and the first 8 bytes of its SHA-256, in a
table of fixed size indexed by a hash of its path; a read whose bytes differ from the remembered ones is reported.
(Not CRC-32: a gzip member of incompressible data holds the data and its CRC-32, and the CRC-32 of data followed by
its own CRC-32 is the same for all data: every such N5 block of one size has the same CRC-32.)

The table starts with :data:`FIRST_SLOTS` slots of 24 bytes and doubles while more than half of them are taken, up
to :data:`SLOTS` (6 MiB): hashed paths touch every page of it, so its size follows the chunks read (a volume read
through a few thousand chunks, in each DataLoader worker, keeps a fraction of a MiB). A chunk whose slot another
chunk took since it was read (or lost it as the table grew) is remembered anew, unchecked: over more chunks than
the table holds, a change may go unnoticed. A slot keeps its chunk's 64-bit path hash, so no chunk is taken for
another.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Optional

import numpy as np

#: Slots of a new table, and the most it grows to (see the module's notes).
FIRST_SLOTS, SLOTS = 1 << 12, 1 << 18


def _described(size: int) -> str:
    """A remembered size (the length + 1, 0 for a missing chunk) in words."""
    return "absent" if size == 0 else f"{size - 1} bytes"


class ChunkDigests:
    """The digests of the chunks a remote store read (thread-safe), see the module's notes."""

    def __init__(self, most_slots: int = SLOTS) -> None:
        self._most = most_slots
        self._paths, self._sizes, self._digests = self._table(min(FIRST_SLOTS, most_slots))
        self._taken = 0
        self._lock = threading.Lock()

    @staticmethod
    def _table(slots: int) -> tuple:
        """(paths' hashes, 0 for an empty slot; lengths + 1, 0 for a missing chunk; digests), ``slots`` each."""
        return np.zeros(slots, np.int64), np.zeros(slots, np.int64), np.zeros(slots, np.int64)

    def changed(self, path: str, data) -> Optional[str]:
        """Remember ``data`` (bytes-like, or None where the store has no such key) as ``path``'s bytes; if ``path``
        was read before with other bytes, keep those and return how the two reads differ."""
        size = 0 if data is None else len(data) + 1
        digest = 0 if data is None else int.from_bytes(hashlib.sha256(data).digest()[:8], "little", signed=True)
        key = hash(path) or 1
        with self._lock:
            slot = key % len(self._paths)
            if self._paths[slot] != key:
                self._taken += self._paths[slot] == 0
                self._paths[slot], self._sizes[slot], self._digests[slot] = key, size, digest
                if 2 * self._taken > len(self._paths) and len(self._paths) < self._most:
                    self._grow()
                return None
            before, same = int(self._sizes[slot]), int(self._digests[slot]) == digest
        if before == size and same:
            return None
        now = "other bytes, as many" if before == size else _described(size)
        return f"{_described(before)} when read before, {now} now"

    def _grow(self) -> None:
        """Double the table (under the lock), each remembered chunk in its new slot (of two that land in one, the
        later is kept)."""
        taken = np.flatnonzero(self._paths)
        tables = self._table(min(2 * len(self._paths), self._most))
        slots = self._paths[taken] % len(tables[0])
        for new, old in zip(tables, (self._paths, self._sizes, self._digests)):
            new[slots] = old[taken]
        self._paths, self._sizes, self._digests = tables
        self._taken = int(np.count_nonzero(self._paths))
