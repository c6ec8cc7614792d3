"""The memory of a chunk cache's blocks: slots cut from slabs of huge pages, reused as blocks are evicted.

A cache of small chunks (64 KiB for (16, 64, 64) uint8) holds thousands of blocks. Allocated one by one, each lies
on 4 KiB pages: a cold read faults in 16 pages per block as it decodes into it (a fifth of the time to decode a
zstd chunk of EM, ``benchmarks/lazy_cold.py``), and a gather reading a window across 27 blocks misses the TLB
where an in-memory volume, one large array that NumPy asks to be on 2 MiB pages, does not (the chunked kernels ran
at 0.85 of the in-memory ones from blocks on small pages, 0.90 from slabs; 0.93 and 1.0 for per-section chunks).
:class:`BlockSlots` cuts whole blocks from anonymous memory maps of :data:`SLAB_BYTES`, advised to the kernel as
transparent huge pages (``madvise(MADV_HUGEPAGE)``, Linux), and keeps the slots of evicted blocks for the blocks
read next. Blocks of more than half a slab, and blocks clipped by the volume's edge, are allocated alone.

Memory stays within the cache's budget: a slot is freed into the cache's free list only by an eviction, which
happens only when the blocks held fill the budget, and a new slot is cut only where none is free; the process holds
at most the blocks the budget holds, plus the rest of one slab. A slot is a uint8 array on its part of the slab
through a :class:`memoryview`, so that NumPy takes the slot, not the slab, as the ``base`` of every view of a block
on it (it collapses a view's base only through arrays): a slot still used by a reader (a view of an evicted block)
is recognised by its reference count and not reused.
"""
from __future__ import annotations

import mmap
import sys
from typing import List, Optional

import numpy as np

#: Bytes of one slab: two huge pages.
SLAB_BYTES = 4 << 20
#: The huge pages' size (x86-64, and arm64 with 4 KiB pages). A slab is mapped with this much more and starts on
#: a boundary inside, so that all of it can be on huge pages; the bytes around it are never touched, so never
#: resident.
HUGE_PAGE = 2 << 20


class BlockSlots:
    """Buffers for one cache's whole blocks of ``block_bytes`` bytes. Not thread-safe: the cache calls it under
    its lock."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = int(block_bytes)
        #: Slots per slab; 0 where blocks are allocated alone.
        self.per_slab = SLAB_BYTES // self.block_bytes if 2 * self.block_bytes <= SLAB_BYTES else 0
        self._free: List[np.ndarray] = []
        self._slab: Optional[memoryview] = None
        self._cut = 0  # slots of the current slab handed out

    def take(self) -> np.ndarray:
        """A slot no block uses: a freed one, else one cut from the current slab (a new slab if it is used up).
        A freed slot that a reader still uses stays free for a later call."""
        for i in range(len(self._free) - 1, -1, -1):
            # references: the list's and getrefcount's argument; any more are arrays a reader still copies from
            if sys.getrefcount(self._free[i]) == 2:
                return self._free.pop(i)
        if not self.per_slab:
            return np.empty(self.block_bytes, np.uint8)
        if self._slab is None or self._cut == self.per_slab:
            self._slab, self._cut = _new_slab(), 0
        start = self._cut * self.block_bytes
        self._cut += 1
        return np.frombuffer(self._slab[start:start + self.block_bytes], np.uint8)

    def give(self, slot: np.ndarray, keep: int) -> None:
        """Keep the slot of an evicted whole block for the next block: every one where slabs are cut (their memory
        is freed only with the whole slab), else while fewer than ``keep`` are kept (the others are freed)."""
        if self.per_slab or len(self._free) < keep:
            self._free.append(slot)

    def trim(self, keep: int) -> None:
        """Free the kept slots of blocks allocated alone beyond ``keep``."""
        if not self.per_slab:
            del self._free[keep:]

    def drop(self) -> None:
        """Forget every free slot and the current slab: their memory is freed once no block uses it."""
        self._free.clear()
        self._slab, self._cut = None, 0



def block_on(slot: np.ndarray, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` on the uint8 array ``slot``, which is its ``base``."""
    return slot.view(dtype).reshape(shape)


def _new_slab() -> memoryview:
    """:data:`SLAB_BYTES` of fresh memory starting on a huge page's boundary, advised as huge pages where the system
    has them. It is unmapped once nothing uses it (the map object lives as long as views of it)."""
    size = SLAB_BYTES + HUGE_PAGE
    if hasattr(mmap, "MAP_PRIVATE"):  # private like the heap: shared anonymous memory is not on huge pages by default
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    else:  # Windows
        memory = mmap.mmap(-1, size)
    start = -np.frombuffer(memory, np.uint8, count=1).ctypes.data % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE, start, SLAB_BYTES)
    return memoryview(memory)[start:start + SLAB_BYTES]

