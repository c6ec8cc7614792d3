"""The ordered hand-off of numbered batches between producer threads and the consumer.

Batches are numbered 0, 1, 2, ... across epochs. Batch k may be started once the consumer has released batch
k - S (S = ``size``): at most S batches are in flight, back-pressure instead of an unbounded queue, and batches
come out in order however many producers make them. Where a batch's memory comes from is the caller's choice
(a fixed slot k % S, or a :class:`~emfast.pipeline._pool.SlotPool`). A producer's exception is kept with the batch it was
making; the consumer raises it when it reaches that batch, after every earlier batch, and no producer starts a
later one.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

#: Seconds between checks while blocked, so that Ctrl-C and close() are noticed promptly.
POLL_SECONDS = 0.1


class RingClosed(RuntimeError):
    """The ring was closed while a thread was waiting on it."""

    def __init__(self) -> None:
        super().__init__("the loader was closed")

    def __reduce__(self):  # its message is not an argument
        return type(self), (), self.__dict__


class Ring:
    """Ordered hand-off of numbered batches, at most ``size`` in flight.

    Parameters
    ----------
    size : int
        Batches that may be in flight (being made, ready, or held by the consumer before release).
    first : int
        Number of the first batch (a resumed stream starts where it stopped).
    """

    def __init__(self, size: int, first: int = 0) -> None:
        if size < 2:
            raise ValueError("a ring needs at least 2 slots")
        self.size = size
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # Read-ahead waits for claims on a condition of its own, woken only when a claim reaches the earliest
        # batch it waits for: waking it (or the producers) on every claim costs GIL hand-offs.
        self._claims = threading.Condition(lock)
        self._claim_targets: List[int] = []
        self._next_claim = first
        self._released = first  # batches < _released are released by the consumer
        self._ready: Dict[int, Any] = {}
        self._errors: Dict[int, tuple] = {}  # batch number -> (exception, its original traceback)
        self._limit: Optional[int] = None  # no batch >= _limit is started (set by the first failure)
        self._closed = False

    def claim(self) -> Optional[int]:
        """Next batch number for a producer, or None when producers should stop."""
        with self._cond:
            if self._closed or (self._limit is not None and self._next_claim >= self._limit):
                return None
            number = self._next_claim
            self._next_claim += 1
            if self._claim_targets and self._next_claim > min(self._claim_targets):
                self._claims.notify_all()
            return number

    def wait_claimed(self, number: int) -> None:
        """Block until a producer claimed batch ``number``. Raises RingClosed on close."""
        with self._cond:
            while self._next_claim <= number:
                if self._closed:
                    raise RingClosed()
                self._claim_targets.append(number)
                try:
                    self._claims.wait(POLL_SECONDS)
                finally:
                    self._claim_targets.remove(number)
            if self._closed:
                raise RingClosed()

    @property
    def next_claim(self) -> int:
        """The batch number the next producer will claim."""
        return self._next_claim

    def wait_turn(self, number: int) -> None:
        """Block until batch ``number`` may be started (batch number - size released). Raises RingClosed on close."""
        self._wait(lambda: self._released > number - self.size)

    def publish(self, number: int, payload: Any) -> None:
        """Mark batch ``number`` made; ``payload`` goes to the consumer with it (dropped once closed)."""
        with self._cond:
            if self._closed:
                return
            self._ready[number] = payload
            self._cond.notify_all()

    def fail(self, number: int, error: BaseException) -> None:
        """Record that making batch ``number`` raised ``error``."""
        with self._cond:
            self._errors[number] = (error, error.__traceback__)
            self._limit = number if self._limit is None else min(self._limit, number)
            self._cond.notify_all()

    def take(self, number: int, producers_alive: Callable[[], bool], check: Callable[[], None] = lambda: None):
        """Consumer: wait for batch ``number``; return its payload or raise the producer's error.

        ``check`` is called while waiting and may raise to end the wait. The batch stays available until
        :meth:`release`, so taking it again (after an interruption) is safe.
        """
        def arrived() -> bool:
            return number in self._ready or number in self._errors or not producers_alive()

        self._wait(arrived, check)
        with self._cond:
            if number in self._errors:
                error, original = self._errors[number]
                raise _fresh(error).with_traceback(original)  # the producer's traceback, each time
            if number not in self._ready:
                raise RuntimeError("the producer threads stopped without delivering batch "
                                   f"{number} and without an error")
            return self._ready[number]

    def release(self, number: int) -> None:
        """Consumer: batch ``number`` (and every earlier one) is no longer used; its slot can be refilled."""
        with self._cond:
            # every earlier batch too: one left by an interrupted release must not hold its slot until close
            dropped = [self._ready.pop(n) for n in [n for n in self._ready if n <= number]]
            self._released = max(self._released, number + 1)
            self._cond.notify_all()
        del dropped  # outside the lock: dropping a batch may give its slot back

    def close(self) -> None:
        """Wake every waiting thread; producers stop, later waits raise RingClosed. Batches not taken are
        dropped, so that their memory goes back to where it came from."""
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, {}
            self._cond.notify_all()
            self._claims.notify_all()
        del ready  # outside the lock: dropping a batch may run a finalizer

    @property
    def closed(self) -> bool:
        return self._closed

    def _wait(self, predicate: Callable[[], bool], check: Optional[Callable[[], None]] = None) -> None:
        """Wait until ``predicate()`` (checked under the lock); ``check()`` runs between waits, outside it."""
        while True:
            with self._cond:
                if self._closed:
                    raise RingClosed()
                if predicate():
                    return
                self._cond.wait(POLL_SECONDS)
                if self._closed:
                    raise RingClosed()
                if predicate():
                    return
            if check is not None:
                check()


def _fresh(error: BaseException) -> BaseException:
    """A copy of ``error`` to raise: a raised exception collects the frames it passes (the consumer's, holding
    the loader), and the stored original must not, or the ring would keep an abandoned loader alive."""
    try:  # __new__ without __init__: an __init__ that formats its message would format it twice
        fresh = type(error).__new__(type(error), *error.args)
        fresh.args = error.args  # some built-in types (MemoryError) drop them in __new__
        fresh.__dict__.update(error.__dict__)
        for name in ("filename", "filename2"):  # an OSError keeps these outside __dict__ and args
            if getattr(error, name, None) is not None:
                setattr(fresh, name, getattr(error, name))
        if str(fresh) != str(error):  # state kept elsewhere (UnicodeDecodeError): the original says it right
            return error
    except Exception:  # noqa: BLE001 - an exception that cannot be rebuilt is raised itself
        return error
    fresh.__cause__, fresh.__context__ = error.__cause__, error.__context__
    fresh.__suppress_context__ = error.__suppress_context__
    return fresh
