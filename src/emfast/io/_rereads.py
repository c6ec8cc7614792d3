"""A remote chunk whose bytes change between two reads, noticed.

A lazy volume reads a chunk again once its cache has dropped it. A store written meanwhile (a pipeline still
exporting the volume, a bucket synced under the run) would give batches that mix its old and new contents, and
nothing else says so: object stores keep no modification time that one request returns with the bytes, and the
metadata stays the same. So each chunk read is remembered by its length and the first 8 bytes of its SHA-256, in a
table indexed by a hash of its path; a read whose bytes differ from the remembered ones is reported. (Not CRC-32: a
gzip member of incompressible data holds the data and its CRC-32, and the CRC-32 of data followed by its own CRC-32
is the same for all data: every such N5 block of one size has the same CRC-32.)

The table is a row of buckets of :data:`WAYS` slots (24 bytes each); a path goes to the bucket its hash picks, into
a free slot, or in place of one of the bucket's chunks when all are taken (that chunk is forgotten: read again, it
is remembered anew, unchecked). It starts with :data:`FIRST_SLOTS` slots and doubles while more than half of them
are taken, up to :data:`SLOTS` (6 MiB): hashed paths touch every page of it, so its size follows the chunks read
(a volume read through a few thousand chunks, in each DataLoader worker, keeps a fraction of a MiB). Doubling
splits each bucket in two and loses no chunk. Over more chunks than the table holds, a change may go unnoticed; a
slot keeps its chunk's 64-bit path hash, so no chunk is taken for another. (One slot per bucket forgot a chunk
whenever two of a few dozen shared a slot: 1.4 % of the runs of a test of 60 chunks.)
"""
from __future__ import annotations

import hashlib
import threading
from typing import Optional

import numpy as np

#: Slots of a new table, the most it grows to, and the slots of a bucket (see the module's notes).
FIRST_SLOTS, SLOTS, WAYS = 1 << 12, 1 << 18, 4


def _described(size: int) -> str:
    """A remembered size (the length + 1, 0 for a missing chunk) in words."""
    return "absent" if size == 0 else f"{size - 1} bytes"


class ChunkDigests:
    """The digests of the chunks a remote store read (thread-safe), see the module's notes."""

    def __init__(self, most_slots: int = SLOTS) -> None:
        self._most = max(1, most_slots // WAYS)  # buckets
        self._paths, self._sizes, self._digests = self._table(max(1, min(FIRST_SLOTS, most_slots) // WAYS))
        self._taken = 0
        self._lock = threading.Lock()

    @staticmethod
    def _table(buckets: int) -> tuple:
        """(paths' hashes, 0 for an empty slot; lengths + 1, 0 for a missing chunk; digests), (buckets, WAYS)
        each."""
        return tuple(np.zeros((buckets, WAYS), np.int64) for _ in range(3))

    def changed(self, path: str, data) -> Optional[str]:
        """Remember ``data`` (bytes-like, or None where the store has no such key) as ``path``'s bytes; if ``path``
        was read before with other bytes, keep those and return how the two reads differ."""
        size = 0 if data is None else len(data) + 1
        digest = 0 if data is None else int.from_bytes(hashlib.sha256(data).digest()[:8], "little", signed=True)
        key = hash(path) or 1
        with self._lock:
            buckets = len(self._paths)
            bucket = key % buckets
            ways = self._paths[bucket]
            found = np.flatnonzero(ways == key)
            if not len(found):
                free = np.flatnonzero(ways == 0)
                way = int(free[0]) if len(free) else key // buckets % WAYS  # else one of the bucket's is forgotten
                self._taken += len(free) > 0
                self._paths[bucket, way], self._sizes[bucket, way], self._digests[bucket, way] = key, size, digest
                if 2 * self._taken > self._paths.size and buckets < self._most:
                    self._grow()
                return None
            before, same = int(self._sizes[bucket, found[0]]), int(self._digests[bucket, found[0]]) == digest
        if before == size and same:
            return None
        now = "other bytes, as many" if before == size else _described(size)
        return f"{_described(before)} when read before, {now} now"

    def _grow(self) -> None:
        """Double the buckets (under the lock): bucket b's chunks go to bucket b or b + its old count, in the
        same slot, so none is lost."""
        buckets, ways = np.nonzero(self._paths)
        tables = self._table(min(2 * len(self._paths), self._most))
        moved = self._paths[buckets, ways] % len(tables[0])
        for new, old in zip(tables, (self._paths, self._sizes, self._digests)):
            new[moved, ways] = old[buckets, ways]
        self._paths, self._sizes, self._digests = tables
