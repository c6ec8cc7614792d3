"""Read-ahead: background threads read the chunks of the batches the producers will make next.

A batch's plan is a pure function of its number, so the blocks its lazy windows need are known before a producer
claims it. The readers stay at most ``depth`` batches ahead of the newest claimed batch, where ``depth`` is what
the chunk caches' budgets hold besides the batches in flight; they read only missing blocks (a producer that needs
a block being read waits for that read instead of starting another) and pin nothing, so they never hold memory
beyond the budgets. A block they fail to read is left to the producer that needs it, which reads it again and
reports the error in batch order.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional

from ..io import abandoned_when
from ._gather import Gatherer
from ._profile import Profile
from ._ring import Ring, RingClosed


def read_ahead_depth(gatherer: Gatherer, first_plan, threads: int) -> int:
    """Batches to read ahead: as many as every cache holds besides ``threads`` batches in flight (0: none)."""
    depth: Optional[int] = None
    for cache, boxes in gatherer.chunk_boxes(first_plan):
        blocks = sum(int((box[1] - box[0] + 1).prod()) for box in boxes)
        fits = cache.blocks_budget // max(1, blocks * cache.block_bytes) - threads
        depth = fits if depth is None else min(depth, fits)
    return max(0, min(depth or 0, threads + 1))


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
    """

    def __init__(self, ring: Ring, plan: Callable[[int], object], gatherer: Gatherer, depth: int,
                 profile: Profile) -> None:
        self._ring = ring
        self._plan = plan
        self._gatherer = gatherer
        self._depth = depth
        self._profile = profile
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
                for cache, boxes in work:
                    if self._ring.closed:
                        break
                    missed += cache.prefetch(boxes)
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
