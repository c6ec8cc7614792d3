"""Batch memory whose lifetime follows the consumer's references: a pool of slots, each lent out as a lease.

The consumer gets a batch's arrays as views that keep a :class:`Lease` alive (through NumPy's ``base``, a device
array's owner, and so on to every tensor made from them). When the last view dies, the lease gives its slot back
to the pool, on whatever thread that happens; the thread that owns the memory (a producer, or the copier for device
memory) takes it from there. A training loop that keeps the previous batch until it reassigns its variables thus
costs one extra slot, not an allocation per batch. The pool grows on demand up to ``capacity`` slots; past it, the
taker waits for a slot to come back and a :class:`BackPressureWarning` says why, once.

Giving back never takes a lock before the pool is closed and never frees: it may run inside a garbage collection
on any thread. Memory is freed only by the owning thread at :meth:`SlotPool.close`, or, for slots still lent out
then, by the thread that gives them back later, inside the owner's ``activate()`` (for CUDA memory: with its
context pushed).
"""
from __future__ import annotations

import contextlib
import queue
import sys
import threading
import warnings
from typing import Any, Callable, ContextManager, List, Optional

from ._ring import POLL_SECONDS, RingClosed


class BackPressureWarning(UserWarning):
    """Every batch slot is in use because the program still holds earlier batches; producers wait."""


class SlotsExhaustedError(RuntimeError):
    """The next batch cannot be made: the program itself holds every batch slot while it waits for the batch."""


class Slot:
    """One batch's memory, and whether it is lent out."""

    __slots__ = ("memory", "leased")

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.leased = False


class Lease:
    """Keeps ``slot`` out of its pool while any view of its memory lives; gives it back when collected."""

    __slots__ = ("_pool", "slot")

    def __init__(self, pool, slot: Slot) -> None:
        self._pool = pool
        self.slot = slot

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        # A view kept to the end of a script (the README's loop) dies as the interpreter tears its modules down:
        # nothing is left to give back to then, and the modules giving back needs may be gone.
        if not _finalizing():
            self._pool._give_back(self.slot)


class FixedSlots:
    """Slot k % S for batch k: for memory the consumer never sees, where the ring's window keeps it free.

    Parameters
    ----------
    memory : list
        The slots' memory, allocated by the caller.
    """

    def __init__(self, memory: List[Any]) -> None:
        self._slots = [Slot(m) for m in memory]

    def acquire(self, number: int, cancelled: Callable[[], bool] = lambda: False) -> Slot:
        return self._slots[number % len(self._slots)]

    def lease(self, slot: Slot) -> Lease:
        return Lease(self, slot)

    def _give_back(self, slot: Slot) -> None:
        """Nothing to do: the slot is reused when the ring lets batch k + S start."""

    def close(self) -> None:
        for slot in self._slots:  # a producer's traceback may still hold a slot: it must not hold the memory
            slot.memory = None
        self._slots = []


class SlotPool:
    """Slots of batch memory lent to the consumer and recycled when the consumer's last view of them dies.

    Parameters
    ----------
    allocate : callable
        ``allocate() -> memory`` for one new slot; called on the taking thread.
    free : callable
        ``free(memory)``; called on the owning thread, or inside ``activate()`` on a thread giving a slot back
        after :meth:`close`.
    capacity : int
        Most slots allocated at once.
    on_give_back : callable, optional
        ``on_give_back(memory)``, called where a slot is given back before the pool is closed (for device memory:
        record what the next writer must wait for). The slot is given back even if it raises.
    activate : callable, optional
        Context manager that lets a thread other than the owner free memory.
    first : int
        Number of the first batch that will ask for a slot.
    """

    def __init__(self, allocate: Callable[[], Any], free: Callable[[Any], None], capacity: int,
                 on_give_back: Optional[Callable[[Any], None]] = None,
                 activate: Callable[[], ContextManager] = contextlib.nullcontext, first: int = 0) -> None:
        self.capacity = capacity
        self._allocate = allocate
        self._free = free
        self._on_give_back = on_give_back
        self._activate = activate
        self._returned: "queue.SimpleQueue[Slot]" = queue.SimpleQueue()  # put() is safe inside a finalizer
        self._lock = threading.RLock()  # re-entrant: a collection may give a slot back while it is held
        self._slots: List[Slot] = []
        self._waiting: set = set()  # batch numbers whose taker waits for a slot
        self._turn = threading.Condition(threading.Lock())
        self._next_number = first  # the batch whose turn it is to get a slot
        self._warned = False
        self._closed = False
        self._live = 0  # slots whose memory is allocated and not yet freed
        self.allocations = 0

    def acquire(self, number: int, cancelled: Callable[[], bool] = lambda: False) -> Slot:
        """A free slot for batch ``number``: a returned one, a new one below capacity, or wait for one.

        Batches get their slots in order (batch 0, 1, 2, ... each once), so that when slots are short the earliest
        batch, which the consumer waits for first, is served first. Raises RingClosed when the pool is closed,
        or ``cancelled()`` becomes true, while waiting.
        """
        with self._turn:
            while self._next_number < number:
                if cancelled() or self._closed:
                    raise RingClosed()
                self._turn.wait(POLL_SECONDS)
        slot = self._acquire(number, cancelled)
        with self._turn:
            self._next_number = max(self._next_number, number + 1)
            self._turn.notify_all()
        return slot

    def _acquire(self, number: int, cancelled: Callable[[], bool]) -> Slot:
        while True:
            if cancelled():
                raise RingClosed()
            slot = self._next_returned(block=False)
            if slot is None:
                slot = self._grow()
            if slot is not None:
                return slot
            self._warn_once()
            with self._lock:
                self._waiting.add(number)
            try:
                slot = self._next_returned(block=True)
            finally:
                with self._lock:
                    self._waiting.discard(number)
            if slot is not None:
                return slot

    def _grow(self) -> Optional[Slot]:
        """A newly allocated slot, or None at capacity. Raises RingClosed once closed."""
        with self._lock:
            if self._closed:
                raise RingClosed()
            if len(self._slots) >= self.capacity:
                return None
            slot = Slot(None)
            self._slots.append(slot)
        try:
            slot.memory = self._allocate()
        except BaseException:
            with self._lock:
                self._slots.remove(slot)
            raise
        with self._lock:
            self._live += 1
        self.allocations += 1
        return slot

    def prefill(self, count: int) -> None:
        """Allocate ``count`` slots now (so that a lack of memory fails at start), up to ``capacity``."""
        for _ in range(count):
            slot = self._grow()
            if slot is None:
                return
            self._returned.put(slot)

    def lease(self, slot: Slot) -> Lease:
        """Lend ``slot`` out until the returned lease (and everything holding it) is collected."""
        slot.leased = True
        return Lease(self, slot)

    def starved(self, number: int) -> bool:
        """Whether batch ``number`` waits for a slot and none can come from the pool itself."""
        with self._lock:
            return number in self._waiting and len(self._slots) >= self.capacity and self._returned.empty()

    @property
    def live(self) -> int:
        """Slots whose memory is allocated and not yet freed (after close: being freed, or still lent out)."""
        with self._lock:
            return self._live

    def close(self) -> None:
        """Owning thread, after its takers stopped: free every slot not lent out (all of them, even if one free
        fails; the first error is raised at the end). Slots lent out are freed by whichever thread gives them
        back, inside ``activate()``; :attr:`live` counts them until then.
        """
        with self._lock:
            self._closed = True
        while self._next_returned(block=False) is not None:
            pass
        errors = []
        for slot in self._slots:
            if not slot.leased:
                memory = self._take_memory(slot)
                if memory is not None:
                    try:
                        self._free_memory(memory, activate=False)
                    except BaseException as error:  # noqa: BLE001 - keep freeing; raised below
                        errors.append(error)
        if errors:
            raise errors[0]

    def _next_returned(self, block: bool) -> Optional[Slot]:
        try:
            slot = self._returned.get(timeout=POLL_SECONDS) if block else self._returned.get_nowait()
        except queue.Empty:
            return None
        slot.leased = False
        return slot

    def _give_back(self, slot: Slot) -> None:
        try:
            if self._on_give_back is not None and not self._closed:
                self._on_give_back(slot.memory)
        finally:  # even on an error or Ctrl-C there: a slot never given back is lost for good
            self._returned.put(slot)
            # Checked after the put: if close() ran before this read, it either drained the slot or left it to us.
            if self._closed:
                self._drain_returned()

    def _drain_returned(self) -> None:
        """After close: free the slots given back since (each is taken from the queue by exactly one thread)."""
        while True:
            slot = self._next_returned(block=False)
            if slot is None:
                return
            memory = self._take_memory(slot)
            if memory is not None:
                self._free_memory(memory, activate=True)

    def _free_memory(self, memory: Any, activate: bool) -> None:
        try:
            if activate:
                with self._activate():
                    self._free(memory)
            else:
                self._free(memory)
        finally:  # counted as freed only now, so that the owner keeps what freeing needs until then
            with self._lock:
                self._live -= 1

    def _take_memory(self, slot: Slot) -> Any:
        """Detach a slot's memory so that exactly one thread frees it."""
        with self._lock:
            memory, slot.memory = slot.memory, None
        return memory

    def _warn_once(self) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"emfast: all {self.capacity} batch slots (max_buffers) are in use because the program still holds "
            "arrays or tensors of earlier batches; the loader waits until they are dropped (counted as 'stall' "
            "in loader.profile). Drop references to old batches, keep copies (batch.copy(), tensor.clone()), or "
            "raise max_buffers.", BackPressureWarning, stacklevel=2)
