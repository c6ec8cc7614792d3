"""Read-ahead: a background thread reads the chunks of the batches the producers will make next.

A batch's plan is a pure function of its number, so the blocks its lazy windows need are known before a producer
claims it. The reader stays at most ``depth`` batches ahead of the newest claimed batch, where ``depth`` is what
the chunk caches' budgets hold besides the batches in flight; it reads only missing blocks (a producer that needs
a block being read waits for that read instead of starting another) and pins nothing, so it never holds memory
beyond the budgets. A block it fails to read is left to the producer that needs it, which reads it again and
reports the error in batch order.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from ._gather import Gatherer
from ._profile import Profile
from ._ring import Ring, RingClosed


def read_ahead_depth(gatherer: Gatherer, first_plan, threads: int) -> int:
    """Batches to read ahead: as many as every cache holds besides ``threads`` batches in flight (0: none)."""
    depth: Optional[int] = None
    for cache, boxes in gatherer.chunk_boxes(first_plan):
        blocks = sum(int((box[1] - box[0] + 1).prod()) for box in boxes)
        fits = cache.budget_bytes // max(1, blocks * cache.block_bytes) - threads
        depth = fits if depth is None else min(depth, fits)
    return max(0, min(depth or 0, threads + 1))


class ReadAhead:
    """The read-ahead thread of one loader's pipeline: started with the producers, ended by closing the ring.

    Parameters
    ----------
    ring : Ring
        The producers' ring: its claims say how far the producers are; closing it ends the thread.
    plan : callable
        Batch number -> its plan.
    gatherer : Gatherer
        Says which blocks a plan needs.
    depth : int
        Batches read ahead of the newest claimed one.
    profile : Profile
        Where the thread's reads are timed ("ahead").
    """

    def __init__(self, ring: Ring, plan: Callable[[int], object], gatherer: Gatherer, depth: int,
                 profile: Profile) -> None:
        self._ring = ring
        self._plan = plan
        self._gatherer = gatherer
        self._depth = depth
        self._profile = profile
        self.thread = threading.Thread(target=self._run, name="emfast-read-ahead", daemon=True)

    def _run(self) -> None:
        number = self._ring.next_claim
        try:
            while True:
                self._ring.wait_claimed(number - self._depth)
                number = max(number, self._ring.next_claim)
                self._read(number)
                number += 1
        except RingClosed:
            return

    def _read(self, number: int) -> None:
        with self._profile.timer("ahead"):
            try:
                for cache, boxes in self._gatherer.chunk_boxes(self._plan(number)):
                    if self._ring.closed:
                        return
                    cache.prefetch(boxes)
            except Exception:  # noqa: BLE001 - the producer that needs the block reads it again and reports it
                return
