"""The threads behind a started loader and their life cycle: the producer threads that fill batch slots, the
pipeline that stops, joins and frees them (with the copier of a GPU loader), the finalizer of an abandoned loader,
the consumer's way out when the program itself holds every slot, and the loaders a fork leaves without threads.

Nothing here holds a reference to the Loader, so an abandoned loader can be collected and its finalizer stop its
threads.
"""
from __future__ import annotations

import atexit
import functools
import gc
import os
import threading
import time
import weakref
from typing import Callable, Optional

from .._threads import join_all, run_every, start_thread
from ..io import abandoned_when
from ._copier import Copier
from ._gather import Gatherer
from ._plan import BatchPlan, Planner
from ._pool import SlotPool, SlotsExhaustedError
from ._profile import Profile
from ._readahead import ReadAhead, read_ahead_depth
from ._ring import Ring, RingClosed


#: Seconds the consumer waits while the program itself holds every slot, before it collects cycles once and then
#: raises SlotsExhaustedError (another thread of the program may still drop its references meanwhile).
EXHAUSTED_GRACE_SECONDS = 2.0


def stream_position(number: int, epoch_size: Optional[int]) -> tuple:
    """(epoch, batch in epoch) of batch ``number`` of the stream."""
    return divmod(number, epoch_size) if epoch_size else (0, number)


def _plan_of(planner: Planner, epoch_size: Optional[int], number: int) -> BatchPlan:
    return planner.plan(*stream_position(number, epoch_size))


class Producers:
    """The producer threads. Holds no reference to the Loader, so an abandoned loader can be collected.

    ``slots`` gives each batch its memory (``acquire(number)``) and wraps it for the ring (``lease(slot)``).
    """

    def __init__(self, ring: Ring, slots, planner: Planner, gatherer: Gatherer, profile: Profile,
                 epoch_size: Optional[int], threads: int) -> None:
        self.ring = ring
        self.slots = slots
        self.planner = planner
        self.gatherer = gatherer
        self.profile = profile
        self.epoch_size = epoch_size
        self.threads = [threading.Thread(target=self._run_abandoning_reads, name=f"emfast-producer-{i}", daemon=True)
                        for i in range(threads)]
        depth, room = self._read_ahead_depth(threads)
        self.read_ahead = ReadAhead(ring, functools.partial(_plan_of, planner, epoch_size), gatherer, depth,
                                    profile, room) if depth else None

    def _read_ahead_depth(self, threads: int) -> tuple:
        """Batches to read ahead and the blocks of each read (see :func:`read_ahead_depth`); none without lazy
        windows, or when the first plan fails (its producer reports it)."""
        if not any(f.chunked for f in self.gatherer.fields):
            return 0, None
        try:
            first = self.planner.plan(*self.position(self.ring.next_claim))
        except Exception:  # noqa: BLE001 - raised again, in order, by the producer of that batch
            return 0, None
        return read_ahead_depth(self.gatherer, first, threads)

    def start(self) -> None:
        for thread in self.threads:
            start_thread(thread)
        for thread in self.read_ahead.threads if self.read_ahead is not None else ():
            start_thread(thread)

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def stop(self) -> None:
        self.ring.close()
        # A collection on a producer thread may run the loader's finalizer there: it cannot join itself.
        threads = self.threads + (self.read_ahead.threads if self.read_ahead is not None else [])
        join_all([t for t in threads if t.ident is not None and t is not threading.current_thread()])

    def position(self, number: int) -> tuple:
        return stream_position(number, self.epoch_size)

    def _run_abandoning_reads(self) -> None:
        with abandoned_when(lambda: self.ring.closed):  # a remote read stops waiting when the loader closes
            self._run()

    def _run(self) -> None:
        scratch = None
        while True:
            number = self.ring.claim()
            if number is None:
                return
            try:
                if scratch is None:
                    scratch = self.gatherer.new_scratch()
                with self.profile.timer("stall"):
                    self.ring.wait_turn(number)
                    slot = self.slots.acquire(number, lambda: self.ring.closed)
                with self.profile.timer("sample"):
                    plan = self.read_ahead.plan(number) if self.read_ahead is not None else \
                        self.planner.plan(*self.position(number))
                self.gatherer.fill(slot.memory, plan, scratch, self.profile)
                self.ring.publish(number, (self.slots.lease(slot), plan))
                del slot
            except RingClosed:
                return
            except BaseException as error:  # handed to the consumer, who re-raises it with its traceback
                self.ring.fail(number, error)
                return


class Pipeline:
    """Everything with a thread: producers, and for a device the copier. Holds no reference to the Loader.

    ``pool`` is where the consumer's batches come from: the host pool, or the copier's device pool.
    """

    def __init__(self, producers: Producers, consumer_ring: Ring, pool: SlotPool, copier: Optional[Copier],
                 export) -> None:
        self.producers = producers
        self.consumer_ring = consumer_ring
        self.pool = pool
        self.copier = copier
        self.export = export

    def alive(self) -> bool:
        """Whether anything can still deliver a batch to the consumer."""
        return self.copier.alive() if self.copier is not None else self.producers.alive()

    def stop(self) -> None:
        """Close, join and free everything; every step runs even if Ctrl-C interrupts one, then it is raised."""
        finish = self.copier.finish if self.copier is not None else self.pool.close  # the copier frees its pool
        run_every([self.consumer_ring.close, self.producers.stop, finish])

    def exhausted(self, number: int) -> Optional[str]:
        """Why batch ``number`` cannot be made while the consumer waits for it, or None."""
        if not self.pool.starved(number):
            return None
        return (f"batch {number} cannot be made: all {self.pool.capacity} batch slots (max_buffers) are in use and "
                "the program, waiting for the batch, still holds arrays or tensors of the others. Drop references "
                "to old batches, keep copies (batch.copy(), tensor.clone()), or raise max_buffers.")



#: Stopper threads of unreachable loaders, by the pipeline they stop: at exit they are waited for (the files a
#: loader owns are closed by its stopper thread, after the pipeline).
STOPPING: dict = {}
#: How long the exit waits for one stopper thread.
STOPPER_EXIT_SECONDS = 60.0
#: Set at interpreter exit (before weakref's finalizers run): a finalizer stops its pipeline then and there.
_exiting = False


def stop_abandoned(pipeline: Pipeline, then: Optional[Callable[[], None]] = None) -> None:
    """Finalizer of an unreachable loader. It may run inside a garbage collection on any thread, even one that
    holds a lock the pipeline's threads wait for, so it must not block: a new thread stops the pipeline, then
    calls ``then`` (closing the files the loader opened). At interpreter exit it stops them itself: a thread
    started then may be frozen by the finalization before it has."""
    def stop() -> None:
        try:
            pipeline.stop()
            if then is not None:
                then()
        finally:
            STOPPING.pop(pipeline, None)

    if _exiting:
        stop()
        return
    stopper = threading.Thread(target=stop, name="emfast-stopper", daemon=True)
    STOPPING[pipeline] = stopper
    try:
        stopper.start()
    except RuntimeError:  # no new threads at interpreter shutdown: nothing can hold the locks any more
        stop()



#: Loaders whose threads run in this process; after a fork their threads do not exist in the child.
STARTED: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for loader in list(STARTED):
        try:
            loader._forked()
        except Exception:  # noqa: BLE001 - one loader caught mid-start must not spare the others
            pass
    STARTED.clear()
    STOPPING.clear()  # the parent's stopper threads do not exist here


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_started_at_exit() -> None:
    """Stop every loader's threads while the interpreter still runs them, reachable or not: a producer left running
    into its finalization, frozen mid-read, may hold h5py's lock, which the finalization then waits for forever."""
    global _exiting
    _exiting = True
    for loader in list(STARTED):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - one loader that fails to close must not spare the others
            pass
    for stopper in list(STOPPING.values()):  # they stop their pipeline, then close the files it read
        stopper.join(STOPPER_EXIT_SECONDS)


_exit_hook_registered = False


def close_at_exit() -> None:
    """Have every started loader closed at interpreter exit. Registered after a loader's ``weakref.finalize``
    exists, so that atexit (last in, first out) runs it before the finalizers' own exit function, which stops an
    unreachable loader's threads from a daemon thread only, without waiting."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_close_started_at_exit)
        _exit_hook_registered = True


class ExhaustionCheck:
    """Ends the consumer's wait with SlotsExhaustedError when the program itself holds every slot.

    That wait could otherwise never end: the batch waited for needs a slot only the waiting program can free.
    Reference cycles are collected once first, and another thread of the program gets a grace period.
    """

    def __init__(self, pipeline: Pipeline, number: int) -> None:
        self.pipeline = pipeline
        self.number = number
        self.since: Optional[float] = None
        self.collected = False

    def __call__(self) -> None:
        reason = self.pipeline.exhausted(self.number)
        if reason is None:
            self.since = None
            return
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif not self.collected:
            self.collected = True
            gc.collect()
        elif now - self.since > EXHAUSTED_GRACE_SECONDS:
            raise SlotsExhaustedError(reason)
