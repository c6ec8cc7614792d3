"""Read-ahead: background threads read the chunks of the batches the producers will make next.

A batch's plan is a pure function of its number, so the blocks its lazy windows need are known before a producer
claims it. The readers stay at most ``depth`` batches ahead of the newest claimed batch, where ``depth`` is what
the chunk caches' budgets hold besides the batches in flight (where they hold part of one more, one reader
reads the blocks of the next batch's first windows that fit); they read only missing blocks (a producer that needs
a block being read waits for that read instead of starting another) and pin nothing, so they never hold memory
beyond the budgets. A block they fail to read is left to the producer that needs it, which reads it again and
reports the error in batch order.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..io import abandoned_when
from ._gather import Gatherer
from ._profile import Profile
from ._ring import Ring, RingClosed


def read_ahead_depth(gatherer: Gatherer, first_plan, threads: int) -> Tuple[int, Optional[Dict[object, int]]]:
    """(batches to read ahead, None) where every cache holds whole batches besides ``threads`` batches in flight
    (0: none). Where one holds less than one more batch but more than those in flight: (1, the blocks each cache
    may read of that batch), so that a cold cache too small to read a batch ahead still decodes its next chunks
    beside a lone producer."""
    blocks: Dict[object, int] = {}
    for cache, boxes in gatherer.chunk_boxes(first_plan):
        blocks[cache] = blocks.get(cache, 0) + sum(_blocks_of(boxes))
    if not blocks:
        return 0, None
    spare = {cache: cache.blocks_budget // max(1, cache.block_bytes) - threads * needed
             for cache, needed in blocks.items()}
    depth = min(spare[cache] // max(1, needed) for cache, needed in blocks.items())
    if depth > 0:
        return min(depth, threads + 1), None
    return (1, spare) if any(room > 0 for room in spare.values()) else (0, None)


def _blocks_of(boxes) -> list:
    """The number of blocks of each box (first and last block indices, from ``ChunkCache.boxes``)."""
    return [int((box[1] - box[0] + 1).prod()) for box in boxes]


def _first_within(boxes: np.ndarray, room: int) -> Tuple[np.ndarray, int]:
    """The first of ``boxes`` whose blocks (counted once per box) number ``room`` at most, and that number."""
    counts = np.cumsum(_blocks_of(boxes))
    taken = int(np.searchsorted(counts, room, side="right"))
    return boxes[:taken], int(counts[taken - 1]) if taken else 0


#: While the chunks of the batches looked at are all cached, read-ahead looks at no fewer than one batch in this many.
MAX_STRIDE = 16


class ReadAhead:
    """The read-ahead threads of one loader's pipeline: started with the producers, ended by closing the ring.

    One thread per batch read ahead (``depth`` of them), each taking the next batch number not yet taken, so
    the reads of several batches overlap: a store with latency (object storage) is read in parallel, and the
    decoders, which release the GIL, run side by side.

    Parameters
    ----------
    ring : Ring
        The producers' ring: its claims say how far the producers are; closing it ends the threads.
    plan : callable
        Batch number -> its plan.
    gatherer : Gatherer
        Says which blocks a plan needs.
    depth : int
        Batches read ahead of the newest claimed one.
    profile : Profile
        Where the threads' reads are timed ("ahead").
    room : dict, optional
        Per cache, the most blocks of a batch read ahead (its first windows'); None: every block.
    """

    def __init__(self, ring: Ring, plan: Callable[[int], object], gatherer: Gatherer, depth: int,
                 profile: Profile, room: Optional[Dict[object, int]] = None) -> None:
        self._ring = ring
        self._plan = plan
        self._gatherer = gatherer
        self._depth = depth
        self._profile = profile
        self._room = room
        self._lock = threading.Lock()
        self._next = ring.next_claim
        self._plans: Dict[int, object] = {}  # batch number -> its plan, for the producer that claims it
        self._stride = 1
        self.threads = [threading.Thread(target=self._run, name=f"emfast-read-ahead-{i}", daemon=True)
                        for i in range(depth)]

    def _run(self) -> None:
        try:
            with abandoned_when(lambda: self._ring.closed):  # a remote read stops waiting when the loader closes
                while True:
                    number = self._take()
                    self._ring.wait_claimed(number - self._depth)
                    self._pace(self._read(number))
        except RingClosed:
            return

    def _take(self) -> int:
        """The next batch number to read ahead: the first neither taken nor claimed by a producer yet, then every
        ``stride``-th (see :meth:`_pace`)."""
        with self._lock:
            self._next = number = max(self._next, self._ring.next_claim)
            self._next += self._stride
            return number

    def _pace(self, missed: bool) -> None:
        """Look at every batch while batches miss chunks; while they find every chunk cached, at every second,
        fourth, ... up to every MAX_STRIDE-th batch (the producers plan and pin the others themselves), so a warm
        cache costs the producers no read-ahead work they would not do anyway."""
        with self._lock:
            self._stride = 1 if missed else min(MAX_STRIDE, 2 * self._stride)

    def plan(self, number: int):
        """The plan of batch ``number``, computed here if read-ahead has not (plans are pure: the same either way)."""
        with self._lock:
            plan = self._plans.pop(number, None)
        return self._plan(number) if plan is None else plan

    def _read(self, number: int) -> bool:
        """Read the missing chunks of batch ``number``; whether it missed any (or its reading failed)."""
        with self._profile.timer("ahead"):
            try:
                plan = self._plan(number)
                work = self._gatherer.chunk_boxes(plan)
                self._keep(number, plan)
                missed = 0
                left = None if self._room is None else dict(self._room)
                for cache, boxes in work:
                    if self._ring.closed:
                        break
                    if left is not None:  # part of the batch: its first windows whose blocks fit
                        boxes, blocks = _first_within(boxes, max(0, left.get(cache, 0)))
                        left[cache] = left.get(cache, 0) - blocks
                    missed += cache.prefetch(boxes) if len(boxes) else 0
                return missed > 0
            except Exception:  # noqa: BLE001 - the producer that needs the block reads it again and reports it
                return True

    def _keep(self, number: int, plan) -> None:
        """Keep ``plan`` for its producer, which then need not compute it again; plans of batches already claimed
        are dropped (their producers computed them)."""
        with self._lock:
            claimed = self._ring.next_claim
            for old in [n for n in self._plans if n < claimed]:
                del self._plans[old]
            if number >= claimed:
                self._plans[number] = plan
