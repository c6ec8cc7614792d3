"""Starting and waiting for threads through Ctrl-C, for every stage that runs threads.

Ctrl-C raises KeyboardInterrupt in the main thread wherever it is, and two waits must not be cut short by it:

- ``Thread.start``: CPython registers a thread as starting before it creates it and undoes that only for an
  ``Exception``: a KeyboardInterrupt then leaves a thread that never runs and never leaves ``threading.enumerate()``.
- ``Thread.join`` (and a thread pool's ``shutdown(wait=True)``): in Python 3.11, a join or ``is_alive`` that
  KeyboardInterrupt interrupts releases the lock the running thread holds (bpo-45274's clean-up), so every later
  join says the thread has ended while it still runs, and whatever it uses gets freed or closed under it.

So these run with Ctrl-C held back (:func:`ctrl_c_held`): a signal then runs a handler that only records it, the
wait resumes, and the interrupt is delivered once the wait is over. SIGTERM is held back too where the program
handles it in Python: the CLI takes it as an interrupt (:func:`sigterm_interrupts`), with the same clean-up.
"""
from __future__ import annotations

import signal
import threading
from typing import Optional, Sequence


#: The thread signals are delivered to.
_MAIN = threading.main_thread()


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by Slurm, ``timeout``, ``docker stop`` and ``kill``), raised where the program asked for it
    (:func:`sigterm_interrupts`): an interrupt, so every clean-up that Ctrl-C gets runs for it too."""


def raise_terminated(signum, frame) -> None:
    """The SIGTERM handler of :func:`sigterm_interrupts`."""
    raise Terminated()


class sigterm_interrupts:  # noqa: N801 - used as a function: ``with sigterm_interrupts():``
    """For the ``with`` block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere nothing changes:
    signals reach the main thread only)."""

    __slots__ = ("_previous",)

    def __enter__(self) -> None:
        main = threading.current_thread() is _MAIN
        self._previous = signal.signal(signal.SIGTERM, raise_terminated) if main else None

    def __exit__(self, *exception) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class ctrl_c_held:  # noqa: N801 - used as a function: ``with ctrl_c_held():``
    """Hold Ctrl-C back in the main thread for the ``with`` block, then deliver it (to the program's own handler)
    as if it arrived at the block's end; SIGTERM too while a Python handler takes it (:func:`sigterm_interrupts`).
    Elsewhere, or where a handler installed outside Python cannot be restored, nothing is held (signals reach the
    main thread only). Its set-up is a few steps, since a Ctrl-C before the handler is in place still interrupts:
    put it first in a clean-up."""

    __slots__ = ("_previous", "_received")

    def __enter__(self) -> None:
        self._received: list = []
        self._previous: dict = {}
        if threading.current_thread() is not _MAIN:
            return
        interrupt, terminate = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        try:
            if interrupt is not None:
                self._previous[signal.SIGINT] = interrupt
                signal.signal(signal.SIGINT, self._record)
            if callable(terminate):  # the default action (the process ends) is not an interrupt to hold
                self._previous[signal.SIGTERM] = terminate
                signal.signal(signal.SIGTERM, self._record)
        except BaseException:  # a signal's handler raised before both were in place: the caller's are kept
            self._restore()
            raise

    def _record(self, signum, frame) -> None:
        if signum not in self._received:
            self._received.append(signum)

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def __exit__(self, *exception) -> None:
        self._restore()
        # SIGTERM first: the interrupt a handler raises ends the delivery, and SIGTERM's handler must run
        for signum in sorted(self._received, key=lambda number: number != signal.SIGTERM):
            signal.raise_signal(signum)


def join_all(threads: Sequence[threading.Thread]) -> None:
    """Wait until every thread has ended, Ctrl-C held back meanwhile (then raised)."""
    with ctrl_c_held():
        for thread in threads:
            thread.join()


def shutdown_pool(pool, cancel_futures: bool = False) -> None:
    """``pool.shutdown(wait=True, cancel_futures=...)`` with Ctrl-C held back meanwhile (then raised)."""
    with ctrl_c_held():
        pool.shutdown(wait=True, cancel_futures=cancel_futures)


def run_every(steps) -> None:
    """Run every step, with Ctrl-C held back, even if one raises KeyboardInterrupt; then raise the first
    interrupt."""
    interrupted: Optional[KeyboardInterrupt] = None
    with ctrl_c_held():
        for step in steps:
            try:
                step()
            except KeyboardInterrupt as error:
                interrupted = interrupted or error
    if interrupted is not None:
        raise interrupted


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``, with Ctrl-C held back until it returns, where the caller can stop the threads it
    started."""
    with ctrl_c_held():
        thread.start()
