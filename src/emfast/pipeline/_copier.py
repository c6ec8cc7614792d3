"""The copier thread of a GPU loader: it owns the transfer backend and moves batch k from host slot k % S into a
device slot, in order (see :mod:`emfast.transfer._backend` for the rules it keeps)."""
from __future__ import annotations

import threading
from typing import Callable, Optional


from .._threads import join_all, start_thread
from ..transfer import Fields, TransferBackend
from ._pool import FixedSlots, SlotPool
from ._profile import Profile
from ._ring import Ring, RingClosed


class Copier:
    """The thread that owns the backend and moves batch k from host slot k % S into a device slot, in order.

    Parameters
    ----------
    backend : TransferBackend
        Does the device work; only this thread calls it (see :class:`TransferBackend` for the exceptions).
    fields : dict
        Field name -> (shape, dtype) of a batch.
    slots : int
        Host slots, and batches in flight on the device side.
    capacity : int
        Most device slots; more than ``slots`` lets the consumer keep earlier batches without waits.
    profile : Profile
        Copy time goes to the ``copy`` stage, waits for a device slot to ``stall``.
    first : int
        Number of the first batch.
    """

    def __init__(self, backend: TransferBackend, fields: Fields, slots: int, capacity: int, profile: Profile,
                 first: int = 0) -> None:
        self.backend = backend
        self.fields = fields
        self.slots = slots
        self.capacity = capacity
        self.profile = profile
        self.first = first
        self.host_slots: Optional[FixedSlots] = None
        self.host_ring = Ring(slots, first)
        self.device_ring = Ring(slots, first)
        self.device_pool: Optional[SlotPool] = None
        self._producers_alive: Callable[[], bool] = lambda: False
        self._opened = threading.Event()
        self._go = threading.Event()
        self._producers_done = threading.Event()
        self._open_error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="emfast-copier", daemon=True)

    def open(self) -> None:
        """Start the thread and wait until it has allocated everything; raise its error if it could not."""
        start_thread(self.thread)
        self._opened.wait()
        if self._open_error is not None:
            join_all([self.thread])
            raise self._open_error

    def run(self, producers_alive: Callable[[], bool]) -> None:
        """Start copying, once the producers run."""
        self._producers_alive = producers_alive
        self._go.set()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def finish(self) -> None:
        """After the rings are closed and the producers joined: free everything in the thread and join it."""
        self._producers_done.set()
        self._go.set()
        if self.thread.ident is not None and self.thread is not threading.current_thread():
            join_all([self.thread])

    def _run(self) -> None:
        try:
            self.host_slots = FixedSlots(self.backend.open(self.fields, self.slots))
            self.device_pool = SlotPool(self.backend.allocate, self.backend.free, self.capacity,
                                        self.backend.given_back, self.backend.activate, self.first)
            self.device_pool.prefill(self.slots)
        except BaseException as error:
            self._open_error = error
            if self.host_slots is not None:
                self.host_slots.close()
            if self.device_pool is not None:
                self._close_device()
            self._opened.set()
            return
        self._opened.set()
        try:
            self._go.wait()
            self._copy_all()
        finally:
            self.host_ring.close()  # stops the producers if the copier stopped first (an error)
            self._producers_done.wait()  # set by finish(), after the consumer closed the device ring
            self.host_slots.close()
            self._close_device()

    def _close_device(self) -> None:
        try:
            self.device_pool.close()
        finally:
            self.backend.close(self.device_pool.live)

    def _copy_all(self) -> None:
        number = self.first
        while not self._producers_done.is_set():
            try:
                host, plan = self.host_ring.take(number, self._producers_alive)
            except RingClosed:
                return
            except BaseException as error:  # a producer's error travels on to the consumer
                self.device_ring.fail(number, error)
                return
            try:
                with self.profile.timer("stall"):
                    self.device_ring.wait_turn(number)
                    slot = self.device_pool.acquire(number, lambda: self.device_ring.closed)
                with self.profile.timer("copy"):
                    self.backend.guard(slot.memory)
                    self.backend.copy(host.slot.memory, slot.memory)
                    self.backend.wait(slot.memory)
                del host
                self.host_ring.release(number)
                self.device_ring.publish(number, (self.device_pool.lease(slot), plan))
            except RingClosed:
                return
            except BaseException as error:
                self.device_ring.fail(number, error)
                return
            number += 1
