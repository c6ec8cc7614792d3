"""A bounded, thread-safe LRU cache of decoded chunks, for volumes read lazily.

A lazy :class:`~emfast.io.Volume` reads every window through a :class:`ChunkCache`. The cache splits the
volume into *blocks*: the store's own chunks (all channels of a 4-D volume together, since a window always
reads every channel), or :data:`CONTIGUOUS_BLOCK` voxels for data stored without chunking. A window is
assembled from the blocks it overlaps; a missing block is read from its
:class:`~emfast.io._source.VolumeSource` once and kept until the memory budget needs its room, least recently
used first. The source decodes: HDF5, zarr and N5 all decode chunks outside the GIL, so the missing blocks of a
batch's windows are read together, through the source's ``read_many`` where it has one (its files read in one
call, decoded side by side by the decode helpers of :mod:`emfast.io._decode`), else block by block, side by side
where the source says that pays (:attr:`~emfast.io._source.VolumeSource.parallel_reads`).

The gather kernels read windows straight from the held blocks (:attr:`ChunkCache.grid`, the address of each
block): a window pins its blocks (:meth:`ChunkCache.pin`) while a kernel reads them, so they are neither evicted
nor reused meanwhile.

Concurrency
-----------
One lock guards the cache's bookkeeping only; no file read happens under it. A thread that misses a block
registers a future for it (one for all the blocks a ``read_many`` call reads) and reads it; other threads that
want the same block wait on that future instead of reading it again, while misses on other blocks proceed in
parallel.
"""
from __future__ import annotations

import functools
import itertools
import math
import os
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .._core.files import data_addresses
from .._core.gather import ChunkGrid, gather_chunked_copy
from ._blockslots import BlockSlots, block_on
from ._decode import run_all
from ._source import CorruptChunkError, transfer_time


class CacheBudgetError(ValueError):
    """A chunk cache's budget is smaller than one of its blocks (``block_bytes``) of the volume ``name``."""

    def __init__(self, message: str, name: str, block_bytes: int) -> None:
        super().__init__(message)
        self.name, self.block_bytes = name, block_bytes

    def __reduce__(self):  # across processes (Dask, multiprocessing) with its attributes
        return type(self), (str(self), self.name, self.block_bytes)


#: Block shape (z, y, x) for datasets stored contiguously (no HDF5 chunks), clipped to the volume.
CONTIGUOUS_BLOCK = (64, 64, 64)

#: Default budget when the user gives none: 1 GiB, or an eighth of physical memory if that is smaller.
DEFAULT_BUDGET_CAP = 1 << 30

#: Bytes of bookkeeping per block of the volume: address, pins, last use, NaN flag.
GRID_BYTES_PER_BLOCK = 8 + 4 + 8 + 1

#: Most buffers of evicted blocks allocated alone (more than half a slab each, or every block of a cache smaller
#: than a slab, see ``_blockslots``) kept for reuse, outside the budget; in steady state one or two are used.
SPARE_BUFFERS = 4
#: A box's missing blocks are read in waves of at most 1/WAVES_PER_BUDGET of the budget, or WAVE_BYTES where that
#: is more and at most 1/WAVE_SHARE_MAX of the budget, or WAVE_BLOCKS blocks if that is more: a wave's encoded bytes
#: and new blocks are in memory at once, and with several threads reading (producers, read-ahead, decode helpers)
#: whole batches of large blocks left the process 10 to 25 % above its budget (``benchmarks/lazy_memory.py``: 64
#: blocks of 512 KiB against a 64 MiB budget). Each wave costs bookkeeping under the GIL (eviction, pending reads,
#: slots) whatever its size: waves of 2 MiB rather than of 12 blocks of 64 KiB make a loader over a volume 4x its
#: cache 15-25 % faster at threads=1 (``benchmarks/lazy_cold.py``, small cache); its peak RSS did not change
#: (``benchmarks/lazy_memory.py``). A wave's encoded bytes are read at most ``_filebatch.BATCH_BYTES`` per call.
WAVES_PER_BUDGET = 32
WAVE_BYTES = 2 << 20
WAVE_SHARE_MAX = 8
WAVE_BLOCKS = 8
#: Of a budget above READING_FREE bytes, the blocks get all but an eighth (READING_SHARE), at most READING_BYTES
#: kept back, and never less than READING_FREE: the rest is for what reading them needs beside them (file buffers
#: kept for the next reads, decode helpers' threads and decoder contexts), about 12 MiB on 2 cores, which left a
#: 64 MiB cache's process 19 % above its budget (``benchmarks/lazy_memory.py``, zarr zstd). Smaller budgets keep
#: every block (a cache of a few blocks, as tests make, would lose a large part of them).
READING_SHARE, READING_BYTES, READING_FREE = 8, 16 << 20, 14 << 20


def blocks_budget(budget: int, block_bytes: int) -> int:
    """The bytes of blocks a cache of ``budget`` bytes holds (see :data:`READING_SHARE`), at least one block; it
    never falls as the budget grows."""
    reading = min(budget // READING_SHARE, READING_BYTES, max(0, budget - READING_FREE))
    return max(block_bytes, budget - reading)


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
    read_ahead : int
        Of the misses, blocks read ahead of need (:meth:`ChunkCache.prefetch`, a loader's read-ahead).
    bytes_held : int
        Bytes of the blocks held now: at most the budget less what reading needs beside them (of a budget above
        14 MiB an eighth, at most 16 MiB, leaving the blocks at least 14 MiB and one block), more only while
        windows being gathered pin more.
    blocks_held : int
        Number of blocks held now.
    budget_bytes : int
        The memory budget (``cache_bytes``): the blocks held and what reading them takes.
    block_shape : tuple of int
        Block shape (z, y, x); each block holds every channel.
    """

    hits: int
    misses: int
    shared: int
    read_ahead: int
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
        The memory of the blocks held and of reading them: blocks take at most :attr:`blocks_budget` of it
        (exceeded only while pinned blocks need more, see :meth:`pin`).
    name : str
        The volume's name, for error messages.

    Raises
    ------
    ValueError
        One block is larger than the whole budget.

    Notes
    -----
    Bookkeeping is one array per fact over the block grid: the address of each held block's data (0 where none is
    held, read by the chunked gather kernels through :attr:`grid`), how many windows being gathered pin it, when
    it was last used, and whether it holds NaN or infinity. A batch pins, stamps and checks the boxes of blocks of
    its windows in one typed loop (:meth:`ChunkGrid.pin <emfast._core.gather.ChunkGrid.pin>`), so a hit costs no
    Python work per block. The arrays take 21 bytes per block of the volume (a 1 TB uint8 volume in 64**3
    chunks: about 84 MiB of address space, resident only where windows go), outside the budget.
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
            raise CacheBudgetError(
                f"{name}: one cache block ({self._channels} channel(s) x {self.block_shape} {self._dtype}) is "
                f"{block_bytes} bytes, more than cache_bytes={self.budget_bytes}; give a budget of at least "
                f"{block_bytes} bytes (a few hundred blocks is typical)", name, block_bytes)
        #: Bytes of blocks held at most (beyond it only while windows in flight pin more): the budget less what
        #: reading takes beside them, see :func:`blocks_budget`.
        self.blocks_budget = blocks_budget(self.budget_bytes, block_bytes)
        self._lock = threading.Lock()
        grid_shape = tuple(-(-s // b) for s, b in zip(self._shape, self.block_shape))
        try:  # zeroed pages: the operating system maps only those of the grid's regions that windows touch
            self._addresses = np.zeros(grid_shape, np.int64)
            self._nonfinite = np.zeros(grid_shape, bool)
            #: The blocks as the chunked gather kernels read them (addresses updated in place), with their pins
            #: and last-use stamps.
            self.grid = ChunkGrid(self._addresses, self.block_shape, self._shape, self._channels, self._dtype)
        except (ValueError, MemoryError):  # NumPy: "array is too big" beyond the address space
            count = math.prod(grid_shape)
            raise MemoryError(f"{name}: the table of its {count} chunks (grid {grid_shape} of {self.block_shape}) "
                              f"needs {GRID_BYTES_PER_BLOCK * count} bytes of address space, more than this "
                              "process can map") from None
        self._clock = 0
        self._pins, self._stamps = self.grid.pins, self.grid.stamps
        self._blocks: Dict[int, np.ndarray] = {}  # flat grid index -> block: the owners of the memory
        self._pending: Dict[Key, Future] = {}
        self._bytes_held = 0
        self._incoming = 0  # bytes of blocks being read by read_many calls, not held yet
        self._hits = self._misses = self._shared = self._read_ahead = 0
        self._changed: Optional[str] = None  # why the source's files are no longer those opened (_check_unchanged)
        self._closed = False  # set by close(): a missing block is an error, whatever the source still reads
        #: Bytes of one whole block (every channel).
        self.block_bytes = block_bytes
        # Whole blocks live in slots of huge-page slabs (a cache smaller than a slab: alone), those of evicted
        # blocks reused. Reusing them instead of freeing and allocating also keeps the process at budget +
        # in-flight reads: with malloc, blocks freed into one producer thread's heap and allocated from
        # another's leave freed memory resident.
        self._slots = BlockSlots(block_bytes, min(self.blocks_budget, self._channels * math.prod(self._shape)
                                                  * self._dtype.itemsize))
        _CACHES.add(self)

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._shared, self._read_ahead, self._bytes_held,
                              len(self._blocks), self.budget_bytes, self.block_shape)

    def close(self) -> None:
        """Drop the blocks (as :meth:`clear`) and refuse every later read of a missing one: the volume was closed
        (a store's reader may still be able to read, but its volume's reads fail after close, as an HDF5 file's
        do)."""
        with self._lock:
            self._closed = True
        self.clear()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ValueError(f"{self._name}: the volume was closed; open it again to read it")

    def clear(self) -> None:
        """Drop every cached block, except those pinned by a gather in flight (dropped when it unpins them)."""
        with self._lock:
            self._evict_unpinned(self._bytes_held)
            self._slots.drop()

    def boxes(self, corners: np.ndarray, extents: np.ndarray) -> np.ndarray:
        """The blocks of each box ``[corner, corner + extent)`` (voxels, (n, 3) each): (n, 2, 3) first and last
        block indices (inclusive)."""
        block = np.asarray(self.block_shape, np.int64)
        first = np.asarray(corners, np.int64) // block
        last = (np.asarray(corners, np.int64) + np.asarray(extents, np.int64) - 1) // block
        return np.stack([first, last], axis=1)

    def pin(self, boxes: np.ndarray, timings=None) -> None:
        """Hold every block of ``boxes`` (from :meth:`boxes`) until :meth:`unpin`: read the missing ones, and keep
        them all from eviction. ``timings`` (an object with ``add(stage, seconds)``, e.g. a loader's profile) is
        given the seconds spent moving the bytes of missed blocks ("fetch": file reads, network requests), decoding
        them ("decode") and waiting for blocks other threads are reading ("pending"). Sources that fetch and decode
        in one call of another library (zarr-python, tensorstore) count it all as "fetch".

        Pinned blocks are never evicted; while the boxes pinned by all threads need more than the budget, the
        cache holds more than the budget (at most those boxes' blocks), and comes back under it as they unpin.
        A failed read unpins the boxes before its exception propagates.
        """
        with self._lock:
            self._clock += 1
            held, missing = self.grid.pin(boxes, self._clock)
            self._hits += held
        try:
            if self._changed is not None:
                raise CorruptChunkError(self._changed)
            self._read_missing(boxes[missing], timings)
        except BaseException:
            self.unpin(boxes)
            raise

    def prefetch(self, boxes: np.ndarray, timings=None) -> int:
        """Read the missing blocks of ``boxes`` (from :meth:`boxes`) into the cache without pinning them, and mark
        every block of them as just used, so that they are evicted after the blocks used before. Returns how many
        boxes had a block missing."""
        with self._lock:  # pinned and unpinned at once: stamped, and the boxes with a missing block listed
            self._clock += 1
            _, missing = self.grid.pin(boxes, self._clock)
            self.grid.unpin(boxes)
        self._read_missing(boxes[missing], timings, ahead=True)
        return len(missing)

    def unpin(self, boxes: np.ndarray) -> None:
        """Let the blocks of ``boxes`` be evicted again (pinned once per :meth:`pin`)."""
        with self._lock:
            self.grid.unpin(boxes)
            if self._bytes_held > self.blocks_budget:
                self._evict_unpinned(self._bytes_held - self.blocks_budget)

    def _read_missing(self, boxes: np.ndarray, timings, ahead: bool = False) -> None:
        """Read the blocks of ``boxes`` (from :meth:`boxes`) that are not held (``ahead``: for :meth:`prefetch`).

        They are read in waves of calls of the source's ``read_many`` where it has one (:meth:`_read_together`).
        Else the source is told every block first (``will_read``, where it has one): a remote source then requests
        them all at once, and the blocks wait for one round trip, not one each; then they are read side by side on
        this thread and the decode helpers where the source's reads gain from it, else one after another. The
        first failure is raised once every read ended."""
        if not len(boxes):  # every block held: the usual case of a warm cache
            return
        self._read_keys(boxes, timings, ahead)
        self._check_unchanged()

    def _check_unchanged(self) -> None:
        """Refuse to go on once the source's files are no longer those opened (the store was recreated, rewritten
        or removed; the HDF5 file overwritten): the blocks just read may come from another array than those cached,
        and nothing else tells (a store recreated with chunks of the same byte size decodes without an error, a
        removed one reads as its fill value). Asked after every read of missing blocks that succeeded (a failed
        one says why itself): one ``stat``, and one per other file an HDF5 dataset's data lives in (external raw
        storage; a virtual dataset's sources are looked at by the reads that overlap them), see
        :meth:`VolumeSource.changed_since_opened`."""
        changed = getattr(self._source, "changed_since_opened", None)  # a source of another kind may have none
        if self._changed is None and changed is not None and changed():
            self._changed = (f"{self._name}: its files changed since it was opened (the store was replaced, "
                             "rewritten or removed, or the file overwritten or written to by another program, such as "
                             "an HDF5 file appended to where file locking is off): what is read now may mix the old "
                             "data and the new; open it again")
        if self._changed is not None:
            raise CorruptChunkError(self._changed)

    def _read_keys(self, boxes: np.ndarray, timings, ahead: bool) -> None:
        self._refuse_if_closed()
        keys: Dict[Key, None] = {}
        for box in boxes:
            missing = np.argwhere(self._addresses[_box_slices(box)] == 0) + box[0]
            keys.update(dict.fromkeys(map(tuple, missing.tolist())))
        read_many = getattr(self._source, "read_many", None)
        if read_many is not None and len(keys) > 1:
            left = list(keys)
            wave = self._wave_blocks()
            while left:
                left = self._read_together(left[:wave], read_many, timings, ahead) + left[wave:]
            return
        announce = getattr(self._source, "will_read", None)
        if announce is not None and len(keys) > 1:
            with self._lock:
                wanted = [key for key in keys if key not in self._pending]
            announce([self._block_box(key) for key in wanted])
        calls = [functools.partial(self._get, key, timings, ahead) for key in keys]
        if getattr(self._source, "parallel_reads", False):
            run_all(calls)
            return
        for call in calls:
            call()

    def nonfinite(self, boxes: np.ndarray) -> np.ndarray:
        """Per box (pinned), whether one of its blocks holds NaN or infinity (always False for integer dtypes)."""
        return np.array([self._nonfinite[_box_slices(box)].any() for box in boxes], bool)

    def read_box(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray, timings=None) -> None:
        """Copy the box ``[corner, corner + extent)`` (z, y, x, inside the volume) of every channel into ``out``;
        ``timings`` (as :meth:`pin` takes it) is told the seconds of the blocks' reads."""
        boxes = self.boxes([corner], [extent])
        blocks = int(np.prod(boxes[0, 1] - boxes[0, 0] + 1))
        if blocks * self.block_bytes > self.blocks_budget or not out.flags.c_contiguous:
            self._read_box_by_block(corner, extent, out, timings)
            return
        self.pin(boxes, timings)
        try:
            gather_chunked_copy([self.grid], [corner], [(0, 1, 2)], [(False, False, False)], out[np.newaxis])
        finally:
            self.unpin(boxes)

    def _read_box_by_block(self, corner: Sequence[int], extent: Sequence[int], out: np.ndarray,
                           timings=None) -> None:
        """read_box one block at a time: for boxes whose blocks exceed the budget, or a strided ``out``."""
        stop = [c + e for c, e in zip(corner, extent)]
        ranges = [range(c // b, (s - 1) // b + 1) for c, s, b in zip(corner, stop, self.block_shape)]
        for key in itertools.product(*ranges):
            block = self._get(key, timings)
            origin = [k * b for k, b in zip(key, self.block_shape)]
            lo = [max(c, o) for c, o in zip(corner, origin)]
            hi = [min(s, o + n) for s, o, n in zip(stop, origin, block.shape[1:])]
            target = (slice(None),) + tuple(slice(a - c, b - c) for a, b, c in zip(lo, hi, corner))
            source = (slice(None),) + tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin))
            np.copyto(out[target], block[source])
        self._check_unchanged()

    def _get(self, key: Key, timings=None, ahead: bool = False) -> np.ndarray:
        with self._lock:
            block = self._blocks.get(self._flat(key))
            if block is not None:
                self._clock += 1
                self._stamps[key] = self._clock
                self._hits += 1
                return block
            waiting = self._pending.get(key)
            if waiting is not None:
                self._shared += 1
            else:
                self._misses += 1
                self._read_ahead += ahead
                pending = self._pending[key] = Future()
        start = time.perf_counter()
        if waiting is not None:  # another thread is reading this block: wait for it (or its exception)
            try:
                waiting.result()
            finally:
                if timings is not None:
                    timings.add("pending", time.perf_counter() - start)
            with self._lock:
                block = self._blocks.get(self._flat(key))
            return block if block is not None else self._get(key, timings, ahead)  # else evicted meanwhile
        moved = transfer_time()
        try:
            block = self._fetch(key)
            if timings is not None:  # the bytes' transfer, then the rest of the read: decoding and checking
                moved = transfer_time() - moved
                timings.add("fetch", moved)
                timings.add("decode", max(0.0, time.perf_counter() - start - moved))
        except BaseException as exc:
            with self._lock:
                del self._pending[key]
            pending.set_exception(exc)
            pending = None  # else this frame, in the exception's traceback, holds it through its future: a cycle
            raise
        with self._lock:
            self._evict_unpinned(self._bytes_held + block.nbytes - self.blocks_budget)
            self._blocks[self._flat(key)] = block
            self._addresses[key] = block.ctypes.data
            self._clock += 1
            self._stamps[key] = self._clock
            self._bytes_held += block.nbytes
            del self._pending[key]
        pending.set_result(None)  # the block is in the cache: its waiters take it from there
        return block

    def _wave_blocks(self) -> int:
        """Blocks read in one wave (see :data:`WAVES_PER_BUDGET`)."""
        wave_bytes = max(self.blocks_budget // WAVES_PER_BUDGET, min(WAVE_BYTES, self.blocks_budget // WAVE_SHARE_MAX))
        return max(WAVE_BLOCKS, wave_bytes // self.block_bytes)

    def _read_together(self, keys, read_many, timings, ahead: bool) -> list:
        """Read the blocks ``keys`` not held by one call of the source's ``read_many`` (which reads them all at
        once, e.g. tensorstore's concurrent reads), after waiting for those another thread is reading already.
        The blocks of one call share one future: a thread needing one of them waits for the whole call.

        Room for the blocks is made before they are allocated, counting those other threads are reading. Where
        it cannot be made (the blocks held are pinned by windows in flight), only as many as fit are read, at
        least one, and the others are returned for a later call: a batch's misses add at most one block to what
        pinning holds, not the whole batch (64 blocks of read-ahead would be half a 64 MiB budget)."""
        mine, theirs, shared = [], {}, 0
        ours: Future = Future()
        with self._lock:
            for key in keys:
                if self._addresses[key]:
                    continue  # read by another thread meanwhile
                waiting = self._pending.get(key)
                if waiting is not None:
                    theirs[id(waiting)] = waiting
                    shared += 1
                else:
                    self._pending[key] = ours
                    mine.append(key)
            self._shared += shared
            # the evicted blocks' buffers are the new blocks' (_empty_blocks)
            self._evict_unpinned(self._bytes_held + self._incoming + len(mine) * self.block_bytes
                                 - self.blocks_budget, spares=SPARE_BUFFERS + len(mine))
            over = self._bytes_held + self._incoming + len(mine) * self.block_bytes - self.blocks_budget
            later = mine[max(1, len(mine) - -(-over // self.block_bytes)):] if over > 0 else []
            for key in later:
                del self._pending[key]
            mine = mine[:len(mine) - len(later)]
            incoming = len(mine) * self.block_bytes
            self._incoming += incoming
            self._misses += len(mine)
            self._read_ahead += ahead * len(mine)
        start, moved = time.perf_counter(), transfer_time()
        empty: list = []
        try:
            empty = self._empty_blocks(mine)
            read_many([(origin, block.shape[1:], block) for origin, block in empty])
            blocks = [self._finished(key, block) for key, (_, block) in zip(mine, empty)]
        except BaseException as exc:
            with self._lock:
                self._incoming -= incoming
                for key in mine:
                    del self._pending[key]
            self._give_back([block.base for _, block in empty])
            ours.set_exception(exc)
            ours, empty = None, []  # no cycle through this frame (see _get), nor the failed blocks held by it
            raise
        if timings is not None:  # as in _get: the bytes' transfer, then the rest
            moved = transfer_time() - moved
            timings.add("fetch", moved)
            timings.add("decode", max(0.0, time.perf_counter() - start - moved))
        arriving = sum(block.nbytes for block in blocks)
        with self._lock:
            self._incoming -= incoming
            self._evict_unpinned(self._bytes_held + self._incoming + arriving - self.blocks_budget)
            self._clock += 1
            if mine:  # a wave's blocks entered at once: no Python work per block beyond its pending entry
                where = tuple(np.array(mine).T)
                self._blocks.update(zip(np.ravel_multi_index(where, self._addresses.shape).tolist(), blocks))
                self._addresses[where] = data_addresses(blocks)
                self._stamps[where] = self._clock
                self._bytes_held += arriving
                for key in mine:
                    del self._pending[key]
        ours.set_result(None)
        start = time.perf_counter()
        for waiting in theirs.values():
            waiting.result()  # another thread's read: its exception, if it failed, is raised here too
        if theirs and timings is not None:
            timings.add("pending", time.perf_counter() - start)
        return later

    def _flat(self, key: Key) -> int:
        return (key[0] * self._addresses.shape[1] + key[1]) * self._addresses.shape[2] + key[2]

    def _evict_unpinned(self, nbytes: int, spares: int = SPARE_BUFFERS) -> None:
        """Under the lock: free at least ``nbytes`` by evicting unpinned blocks, least recently used first (fewer
        if too few are unpinned), keeping their slots for blocks read next (up to ``spares`` of those allocated
        alone)."""
        if nbytes <= 0 or not self._blocks:
            return
        held = np.fromiter(self._blocks, np.int64, len(self._blocks))
        held = held[self._pins.flat[held] == 0]
        for flat in held[np.argsort(self._stamps.flat[held], kind="stable")]:
            if nbytes <= 0:
                break
            evicted = self._blocks.pop(int(flat))
            self._addresses.flat[flat] = 0
            self._bytes_held -= evicted.nbytes
            nbytes -= evicted.nbytes
            self._slots.give(evicted.base, spares)

    def _block_box(self, key: Key) -> Tuple[list, tuple]:
        """(corner, extent) of block ``key`` in voxels, clipped to the volume."""
        origin = [k * b for k, b in zip(key, self.block_shape)]
        stop = [min(o + b, s) for o, b, s in zip(origin, self.block_shape, self._shape)]
        return origin, tuple(b - a for a, b in zip(origin, stop))

    def _fetch(self, key: Key) -> np.ndarray:
        """Read block ``key`` from the source, as a read-only (c, z, y, x) array."""
        self._refuse_if_closed()
        (origin, block), = self._empty_blocks([key])
        try:
            self._source.read(origin, block.shape[1:], block)
            return self._finished(key, block)
        except BaseException:
            slot = block.base
            del block  # this frame stays in the exception's traceback: the slot must not be held there
            self._give_back([slot])  # a failed read's slot serves the next block, whatever it wrote
            raise

    def _give_back(self, slots) -> None:
        """Return the slots (``block.base``) of blocks never cached, their read failed, for the next blocks."""
        with self._lock:
            for slot in slots:
                self._slots.give(slot, SPARE_BUFFERS)

    def _empty_blocks(self, keys) -> list:
        """(origin (z, y, x) in voxels, an unfilled (c, z, y, x) block) of each of ``keys``, the slots of the whole
        blocks taken under one lock."""
        (bz, by, bx), (sz, sy, sx) = self.block_shape, self._shape
        boxes = [((z * bz, y * by, x * bx), (min(bz, sz - z * bz), min(by, sy - y * by), min(bx, sx - x * bx)))
                 for z, y, x in keys]  # _block_box inlined: a wave's blocks are hundreds
        whole = (self._channels,) + self.block_shape
        shapes = [(self._channels,) + extent for _, extent in boxes]
        slots: list = []
        with self._lock:
            try:
                slots.extend(self._slots.take() for shape in shapes if shape == whole)
            except BaseException as error:  # no memory for a new slab: the slots taken serve the next blocks
                for slot in slots:
                    self._slots.give(slot, SPARE_BUFFERS)
                if isinstance(error, MemoryError):
                    raise self._no_memory(error) from None
                raise
            self._slots.trim(SPARE_BUFFERS)  # those evicted for this batch beyond its needs are freed
        blocks = []
        try:
            for (origin, _), shape in zip(boxes, shapes):
                slot = slots.pop() if shape == whole else np.empty(math.prod(shape) * self._dtype.itemsize,
                                                                   np.uint8)
                blocks.append((origin, block_on(slot, self._dtype, shape)))
        except BaseException as error:  # out of memory for an edge block: the whole blocks' slots serve the next
            self._give_back([block.base for _, block in blocks] + slots)
            if isinstance(error, MemoryError):
                raise self._no_memory(error) from None
            raise
        return blocks

    def _no_memory(self, error: MemoryError) -> MemoryError:
        return MemoryError(f"{self._name}: no memory for more of its chunk cache ({self._bytes_held} bytes held of "
                           f"cache_bytes={self.budget_bytes}): {error}; give it a smaller cache_bytes")

    def _finished(self, key: Key, block: np.ndarray) -> np.ndarray:
        """``block``, filled, made read-only, its NaN flag set."""
        block.flags.writeable = False
        if self._dtype.kind == "f":
            self._nonfinite[key] = not np.isfinite(block).all()
        return block

    def _after_fork(self) -> None:
        """In a child process: a read or a gather in flight in the parent at fork() never completes here."""
        self._lock = threading.Lock()
        self._pending.clear()
        self._incoming = 0
        self._pins[...] = 0


def _box_slices(box: np.ndarray) -> tuple:
    """Grid slices of one (2, 3) box of first and last block indices."""
    return tuple(slice(int(a), int(b) + 1) for a, b in zip(box[0], box[1]))


#: Every chunk cache of this process, for the fork handler below.
_CACHES: "weakref.WeakSet[ChunkCache]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_CACHES):
        cache._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
