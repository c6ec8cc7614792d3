"""Starting and waiting for threads through Ctrl-C, for every stage that runs threads.

Ctrl-C raises KeyboardInterrupt in the main thread, wherever it is, and two places need care:

- ``Thread.start``: CPython registers a thread as starting before it creates it and undoes that only for an
  ``Exception``; :func:`start_thread` holds Ctrl-C back until it returns.
- ``Thread.join``: in Python 3.11, a join interrupted by a signal marks the thread ended while it still runs
  (bpo-45274's clean-up releases the lock the running thread holds), so every later ``join`` or ``is_alive``
  says it has ended, and whatever it uses is freed under it. :func:`join_all` therefore waits in the main thread
  by checking ``is_alive`` (a lock taken without blocking, which nothing interrupts) between short sleeps.
"""
from __future__ import annotations

import signal
import threading
import time
from typing import List, Optional, Sequence

#: Seconds between checks while the main thread waits for a thread to end.
POLL_SECONDS = 0.002


def join_all(threads: Sequence[threading.Thread]) -> None:
    """Wait until every thread has ended, even if Ctrl-C arrives meanwhile (again and again); then raise the
    interrupt."""
    interrupted: Optional[KeyboardInterrupt] = None
    in_main = threading.current_thread() is threading.main_thread()
    for thread in threads:
        while thread.is_alive():
            try:
                if in_main:
                    time.sleep(POLL_SECONDS)
                else:  # signals reach the main thread only
                    thread.join()
            except KeyboardInterrupt as error:
                interrupted = error
    if interrupted is not None:
        raise interrupted


def shut_down(pool, cancel_futures: bool = False) -> None:
    """``pool.shutdown(wait=True, cancel_futures=...)`` for a ``ThreadPoolExecutor`` (or an executor like one),
    waiting for its threads with :func:`join_all`: a Ctrl-C meanwhile is raised once they have ended."""
    pool.shutdown(wait=False, cancel_futures=cancel_futures)
    interrupted: Optional[KeyboardInterrupt] = None
    try:
        join_all(list(getattr(pool, "_threads", ())))  # a ThreadPoolExecutor's threads, kept there since 3.2
    except KeyboardInterrupt as error:
        interrupted = error
    while True:  # the threads have ended: this returns at once (another executor waits here)
        try:
            pool.shutdown(wait=True)
            break
        except KeyboardInterrupt as error:
            interrupted = error
    if interrupted is not None:
        raise interrupted


def run_every(steps) -> None:
    """Run every step even if Ctrl-C interrupts one (again and again), then raise the interrupt."""
    interrupted: Optional[KeyboardInterrupt] = None
    for step in steps:
        try:
            step()
        except KeyboardInterrupt as error:
            interrupted = error
    if interrupted is not None:
        raise interrupted


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``, with Ctrl-C held back until it returns (in the main thread, where Ctrl-C arrives).

    CPython registers a thread as starting before it creates it and undoes that only for an ``Exception``: a
    KeyboardInterrupt at that moment leaves a thread that never runs and never leaves ``threading.enumerate()``.
    Held back, the interrupt is raised right after, where the caller can stop the threads it started.
    """
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None:  # not the main thread, or a handler installed outside Python that could not be restored
        thread.start()
        return
    received: List[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        thread.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        signal.raise_signal(signal.SIGINT)  # as if it arrived now, to whatever handler the program has
