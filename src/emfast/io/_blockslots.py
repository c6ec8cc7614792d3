"""The memory of a chunk cache's blocks: slots cut from slabs of huge pages, reused as blocks are evicted.

A cache of small chunks (64 KiB for (16, 64, 64) uint8) holds thousands of blocks. Allocated one by one, each lies
on 4 KiB pages: a cold read faults in 16 pages per block as it decodes into it (a fifth of the time to decode a
zstd chunk of EM, ``benchmarks/lazy_cold.py``), and a gather reading a window across 27 blocks misses the TLB
where an in-memory volume, one large array that NumPy asks to be on 2 MiB pages, does not (the chunked kernels ran
at about 0.85 of the in-memory ones from blocks on small pages, 0.87 from slabs; 0.90 and 0.97 for per-section
chunks, ``benchmarks/results/lazy-slabs-ab-cpu-2core.txt``).
:class:`BlockSlots` cuts whole blocks from anonymous memory maps of :data:`SLAB_BYTES`, advised to the kernel as
transparent huge pages (``madvise(MADV_HUGEPAGE)``, Linux), and keeps the slots of evicted blocks for the blocks
read next. Blocks of more than half a slab, blocks clipped by the volume's edge, and every block of a cache that
can never hold a slab's worth (its budget or its whole volume smaller than a slab) are allocated alone: a training
set of hundreds of small lazy volumes cost a huge page each, 2 MiB per volume of 45 KiB.

A cache that is cleared or closed hands the slabs none of whose blocks is still read to the next caches (up to
:data:`KEPT_SLAB_BYTES` in the process): fresh memory costs its zeroing again, about 3 ms per 16 MiB of blocks, a
seventh of reading the 24 boxes of blosc-lz4 chunks that fill them, where blocks allocated one by one reused the
heap memory their predecessors freed (a store opened afresh every epoch or worker, ``benchmarks/lazy_cold.py``).

Memory stays within the cache's budget: a slot is freed into the cache's free list only by an eviction, which
happens only when the blocks held fill the budget, and a new slot is cut only where none is free; the process holds
at most the blocks the budget holds, plus the rest of one slab. A slot is a uint8 array on its part of the slab
through a :class:`memoryview`, so that NumPy takes the slot, not the slab, as the ``base`` of every view of a block
on it (it collapses a view's base only through arrays): a slot still used by a reader (a view of an evicted block)
is recognised by its reference count and not reused.
"""
from __future__ import annotations

import bisect
import errno
import math
import mmap
import os
import sys
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

#: Bytes of one slab: two huge pages.
SLAB_BYTES = 4 << 20
#: The huge pages' size (x86-64, and arm64 with 4 KiB pages). A slab is mapped with this much more and starts on
#: a boundary inside, so that all of it can be on huge pages; the bytes around it are never touched, so never
#: resident.
HUGE_PAGE = 2 << 20
#: Most bytes of free slabs the process keeps for the next caches.
KEPT_SLAB_BYTES = 64 << 20


class BlockSlots:
    """Buffers for one cache's whole blocks of ``block_bytes`` bytes, of which it holds at most ``most_bytes`` (its
    budget, or its volume's bytes if fewer). Not thread-safe: the cache calls it under its lock."""

    def __init__(self, block_bytes: int, most_bytes: int) -> None:
        self.block_bytes = int(block_bytes)
        #: Slots per slab; 0 where blocks are allocated alone (large blocks, or at most ``most_bytes`` of blocks,
        #: fewer than a slab holds).
        self.per_slab = (SLAB_BYTES // self.block_bytes
                         if 2 * self.block_bytes <= SLAB_BYTES and most_bytes >= SLAB_BYTES else 0)
        self._free: List[np.ndarray] = []
        self._slab: Optional[memoryview] = None
        self._cut = 0  # slots of the current slab handed out
        self._slabs: List[Tuple[memoryview, int]] = []  # every slab cut from, with its address

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
            self._slabs.append((self._slab, _address(self._slab)))
        start = self._cut * self.block_bytes
        self._cut += 1
        return np.frombuffer(self._slab[start:start + self.block_bytes], np.uint8)

    def give(self, slot: np.ndarray, keep: int) -> None:
        """Keep the slot (``block.base``) of a block evicted or never cached for the next block: every one where
        slabs are cut (their memory is freed only with the whole slab), else while fewer than ``keep`` are kept (the
        others are freed). The memory of edge blocks, allocated alone and smaller, is freed."""
        if slot.nbytes == self.block_bytes and (self.per_slab or len(self._free) < keep):
            self._free.append(slot)

    def trim(self, keep: int) -> None:
        """Free the kept slots of blocks allocated alone beyond ``keep``."""
        if not self.per_slab:
            del self._free[keep:]

    def drop(self) -> None:
        """Forget every free slot and slab: slabs whose every cut slot is free and unread go to the next caches
        (see :data:`KEPT_SLAB_BYTES`), the others are freed once no block uses them."""
        unread: Dict[int, int] = {}  # slab index -> its free slots no reader holds
        order = sorted(range(len(self._slabs)), key=lambda index: self._slabs[index][1])
        starts = [self._slabs[index][1] for index in order]
        for i in range(len(self._free)):
            if sys.getrefcount(self._free[i]) != 2:  # the list's reference and the argument's, as in take()
                continue
            address = _address(self._free[i])
            place = bisect.bisect_right(starts, address) - 1
            # slots allocated alone, and slots of slabs an earlier drop() forgot (their blocks were pinned then),
            # belong to none of the slabs listed
            if place >= 0 and address < starts[place] + SLAB_BYTES:
                unread[order[place]] = unread.get(order[place], 0) + 1
        self._free.clear()
        for index, (slab, _) in enumerate(self._slabs):
            cut = self._cut if slab is self._slab else self.per_slab
            if unread.get(index, 0) == cut:
                _keep(slab)
        self._slabs.clear()
        self._slab, self._cut = None, 0


def block_on(slot: np.ndarray, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` on the uint8 array ``slot``, which is its ``base``."""
    return slot.view(dtype).reshape(shape)


_kept: List[memoryview] = []  # free slabs for the next caches
_kept_lock = threading.Lock()


def _forget_kept_lock() -> None:
    """In a child process after fork(): a lock held by a parent's thread at that moment is never released."""
    global _kept_lock
    _kept_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_kept_lock)


def _keep(slab: memoryview) -> None:
    """Keep a slab none of whose slots is in use for the next cache, while the kept ones stay within
    :data:`KEPT_SLAB_BYTES` (else it is freed with its last view)."""
    with _kept_lock:
        if (len(_kept) + 1) * SLAB_BYTES <= KEPT_SLAB_BYTES:
            _kept.append(slab)


def _address(buffer) -> int:
    """The address of a buffer's first byte."""
    return np.frombuffer(buffer, np.uint8, count=1).ctypes.data


def private_map(size: int, what: str) -> mmap.mmap:
    """``size`` bytes of anonymous memory mapped privately, as the heap is: a forked child (a DataLoader worker)
    gets its own copy on write (Python maps anonymous memory shared by default: parent and children read chunk
    files into the same pages, a review), and shared anonymous memory is never on huge pages.

    Raises
    ------
    MemoryError
        No memory (ENOMEM, ``ulimit -v``), as NumPy's allocations say it, naming ``what`` the memory is for.
    """
    try:
        if hasattr(mmap, "MAP_PRIVATE"):
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        return mmap.mmap(-1, size)  # Windows: private to the process, which is never forked
    except OSError as error:
        if error.errno != errno.ENOMEM:
            raise
        raise MemoryError(f"cannot map {size >> 20} MiB for {what} ({error.strerror})") from None


#: The size from which NumPy asks the kernel for huge pages for an array.
HUGE_PAGES_FROM = 4 << 20


def mapped_empty(shape, dtype, what: str) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` in memory of its own mapping (see :func:`private_map`), given back to the
    system once the array and its views are gone. Large arrays made and freed over and over through malloc (a
    loader's batch slots, loader after loader) raise glibc's threshold for mapping them, after which they come from
    a heap that keeps what is freed: a process building a loader per epoch held half as much again as one loader's
    budget (a review). Zero-filled, as anonymous memory is; no page is touched yet. Advised as huge pages from
    :data:`HUGE_PAGES_FROM` bytes, as NumPy advises its own allocations."""
    dtype = np.dtype(dtype)
    size = math.prod(int(n) for n in shape) * dtype.itemsize
    if size == 0:
        return np.empty(shape, dtype)
    memory = private_map(size, what)
    if size >= HUGE_PAGES_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages
            pass
    return np.frombuffer(memory, dtype).reshape(shape)


def _new_slab() -> memoryview:
    """A slab another cache freed, else :data:`SLAB_BYTES` of fresh memory starting on a huge page's boundary,
    advised as huge pages where the system has them. It is unmapped once nothing uses it (the map object lives as
    long as views of it)."""
    with _kept_lock:
        if _kept:
            return _kept.pop()
    size = SLAB_BYTES + HUGE_PAGE
    memory = private_map(size, "chunk-cache blocks")
    start = -_address(memory) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE, start, SLAB_BYTES)
        except OSError:  # a kernel built without transparent huge pages (EINVAL): small pages, as malloc's
            pass
    return memoryview(memory)[start:start + SLAB_BYTES]

