"""A bounded, thread-safe LRU cache of decoded chunks, for volumes read lazily.

A lazy :class:`~emfast.io.Volume` reads every window through a :class:`ChunkCache`. The cache splits the
volume into *blocks*: the store's own chunks (all channels of a 4-D volume together, since a window always
reads every channel), or :data:`CONTIGUOUS_BLOCK` voxels for data stored without chunking. A window is
assembled from the blocks it overlaps; a missing block is read from its
:class:`~emfast.io._source.VolumeSource` once and kept until the memory budget needs its room, least recently
used first. The source decodes: HDF5, zarr and N5 all decode chunks outside the GIL, so several producer threads
decode in parallel.

Concurrency
-----------
One lock guards the cache's bookkeeping only; no file read happens under it. A thread that misses a block
registers a future for it and reads it; other threads that want the same block wait on that future instead of
reading it again, while misses on other blocks proceed in parallel.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

#: Block shape (z, y, x) for datasets stored contiguously (no HDF5 chunks), clipped to the volume.
CONTIGUOUS_BLOCK = (64, 64, 64)

#: Default budget when the user gives none: 1 GiB, or an eighth of physical memory if that is smaller.
DEFAULT_BUDGET_CAP = 1 << 30

#: Most buffers of evicted blocks kept for reuse (outside the budget; in steady state one or two are used).
SPARE_BUFFERS = 4


Key = Tuple[int, int, int]


def default_budget() -> int:
    """The default cache budget in bytes: ``min(1 GiB, physical memory / 8)``."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or the value is unknown
        return DEFAULT_BUDGET_CAP
    return int(min(DEFAULT_BUDGET_CAP, physical // 8))


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of a :class:`ChunkCache`'s counters.

    Attributes
    ----------
    hits : int
        Block lookups served from the cache.
    misses : int
        Blocks read from the file.
    shared : int
        Lookups that waited for another thread's read of the same block instead of reading it again.
    bytes_held : int
        Bytes of the blocks held now; never more than ``budget_bytes``.
    blocks_held : int
        Number of blocks held now.
    budget_bytes : int
        The memory budget.
    block_shape : tuple of int
        Block shape (z, y, x); each block holds every channel.
    """

    hits: int
    misses: int
    shared: int
    bytes_held: int
    blocks_held: int
    budget_bytes: int
    block_shape: Tuple[int, int, int]


def check_budget(budget, name: str) -> int:
    """Return ``budget`` as an int of bytes, or raise TypeError/ValueError naming the volume."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise TypeError(f"{name}: cache_bytes must be an integer number of bytes, got {budget!r}")
    if budget <= 0:
        raise ValueError(f"{name}: cache_bytes must be positive, got {budget}")
    return int(budget)


class ChunkCache:
    """Read boxes of a volume source through an LRU cache of its blocks, within a budget in bytes.

    Parameters
    ----------
    source : VolumeSource
        A 3-D (z, y, x) or 4-D (c, z, y, x) stored volume.
    dtype : numpy.dtype
        The native dtype blocks are held in.
    budget_bytes : int
        Most bytes of blocks held at once.
    name : str
        The volume's name, for error messages.

    Raises
    ------
    ValueError
        One block is larger than the whole budget.
    """

    def __init__(self, source, dtype: np.dtype, budget_bytes: int, name: str) -> None:
        self._source = source
        self._dtype = np.dtype(dtype)
        self._name = name
        shape = tuple(int(s) for s in source.full_shape)
        self._channels = shape[0] if len(shape) == 4 else 1
        self._shape = shape[-3:]
        block = source.chunks if source.chunks is not None else CONTIGUOUS_BLOCK
        self.block_shape = tuple(min(int(b), s) for b, s in zip(block, self._shape))
        self.budget_bytes = int(budget_bytes)
        block_bytes = self._channels * int(np.prod(self.block_shape)) * self._dtype.itemsize
        if block_bytes > self.budget_bytes:
            raise ValueError(f"{name}: one cache block ({self._channels} channel(s) x {self.block_shape} "
                             f"{self._dtype}) is {block_bytes} bytes, more than cache_bytes={self.budget_bytes}; "
                             f"give a budget of at least {block_bytes} bytes (a few hundred blocks is typical)")
        self._lock = threading.Lock()
        self._blocks: "OrderedDict[Key, np.ndarray]" = OrderedDict()
        self._pending: Dict[Key, Future] = {}
        self._bytes_held = 0
        self._hits = self._misses = self._shared = 0
        # Buffers of evicted full-size blocks. Reusing them instead of freeing and allocating keeps the process
        # at budget + in-flight reads: with malloc, blocks freed into one producer thread's heap and allocated
        # from another's leave freed memory resident, and glibc's adaptive mmap threshold soon sends every
        # block to those heaps.
        self._full_bytes = block_bytes
        self._spare: list = []
        _CACHES.add(self)

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._shared, self._bytes_held, len(self._blocks),
                              self.budget_bytes, self.block_shape)

    def clear(self) -> None:
        """Drop every cached block (reads in flight still complete)."""
        with self._lock:
            self._blocks.clear()
            self._spare.clear()
            self._bytes_held = 0

    def read_box(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray) -> None:
        """Copy the box ``[corner, corner + extent)`` (z, y, x, inside the volume) of every channel into ``out``."""
        stop = [c + e for c, e in zip(corner, extent)]
        ranges = [range(c // b, (s - 1) // b + 1) for c, s, b in zip(corner, stop, self.block_shape)]
        for key in itertools.product(*ranges):
            block = self._get(key)
            origin = [k * b for k, b in zip(key, self.block_shape)]
            lo = [max(c, o) for c, o in zip(corner, origin)]
            hi = [min(s, o + n) for s, o, n in zip(stop, origin, block.shape[1:])]
            target = (slice(None),) + tuple(slice(a - c, b - c) for a, b, c in zip(lo, hi, corner))
            source = (slice(None),) + tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin))
            np.copyto(out[target], block[source])

    def _get(self, key: Key) -> np.ndarray:
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
                self._hits += 1
                return block
            waiting = self._pending.get(key)
            if waiting is not None:
                self._shared += 1
            else:
                self._misses += 1
                pending = self._pending[key] = Future()
        if waiting is not None:  # another thread is reading this block: wait for it (or its exception)
            return waiting.result()
        try:
            block = self._fetch(key)
        except BaseException as exc:
            with self._lock:
                del self._pending[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            while self._blocks and self._bytes_held + block.nbytes > self.budget_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self._bytes_held -= evicted.nbytes
                if evicted.nbytes == self._full_bytes and len(self._spare) < SPARE_BUFFERS:
                    self._spare.append(evicted.base)
            self._blocks[key] = block
            self._bytes_held += block.nbytes
            del self._pending[key]
        pending.set_result(block)
        return block

    def _buffer(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer for a block of ``nbytes``: an evicted block's that no reader still uses, else new."""
        if nbytes == self._full_bytes:
            with self._lock:
                while self._spare:
                    buffer = self._spare.pop()
                    # references: `buffer` and getrefcount's argument; any more are views a reader still copies from
                    if sys.getrefcount(buffer) == 2:
                        return buffer
        return np.empty(nbytes, np.uint8)

    def _fetch(self, key: Key) -> np.ndarray:
        """Read block ``key`` from the source, as a read-only (c, z, y, x) array."""
        origin = [k * b for k, b in zip(key, self.block_shape)]
        stop = [min(o + b, s) for o, b, s in zip(origin, self.block_shape, self._shape)]
        shape = (self._channels,) + tuple(b - a for a, b in zip(origin, stop))
        block = self._buffer(int(np.prod(shape)) * self._dtype.itemsize).view(self._dtype).reshape(shape)
        self._source.read(origin, shape[1:], block)
        block.flags.writeable = False
        return block

    def _after_fork(self) -> None:
        """In a child process: a read in flight in the parent at fork() never completes here."""
        self._lock = threading.Lock()
        self._pending.clear()


#: Every chunk cache of this process, for the fork handler below.
_CACHES: "weakref.WeakSet[ChunkCache]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_CACHES):
        cache._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
