"""Reading several chunks side by side: the helper threads that decode a box's missing chunks in parallel.

A box of a lazy volume usually misses several chunks at once (8 to 27 for a window over cubic chunks). Their
decoders (numcodecs' zstd, blosc and lz4, zlib, the kernel's file reads) release the GIL, so reading them on
several threads runs them on several cores, as tensorstore does with its own thread pool. :func:`run_all` runs
a list of calls on the calling thread and on helper threads, one per idle core, and returns when every call has
ended; :class:`SideBySide` decides, per reader and by measurement, whether a list gains from helpers. A helper
waits :data:`HELPER_IDLE_SECONDS` for the next request, so a read loop's next box pays no thread start, then ends:
no helper outlives the reads that needed it by more (a loader's close() leaves none behind for longer).

:func:`zstd_content_size` and :func:`blosc_content_size` read the decoded size a frame's header states, so that a
chunk known to decode to exactly its block's size can be decoded straight into the block; :func:`checked_blosc`
refuses a truncated blosc frame, which numcodecs would decode.
"""
from __future__ import annotations

import collections
import functools
import math
import os
import threading
import time
from typing import Callable, List, Optional, Sequence

from .._threads import ctrl_c_held

#: Calls per helper thread at least: fewer are read on the calling thread alone, as starting a thread (about
#: 0.1 ms) would cost more than it saves.
CALLS_PER_HELPER = 2


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


#: Linux's load figures; its fourth field is "runnable threads/all threads" at this instant.
LOADAVG = "/proc/loadavg"


def _idle_cores() -> int:
    """Cores no thread is using now: the cores less the threads runnable on this machine at this instant (Linux:
    /proc/loadavg's count, which includes the caller; a thread waiting for the GIL sleeps and is not counted),
    else by the 1-minute load average (which counts this process's busy threads too, and lags by seconds)."""
    try:
        with open(LOADAVG, "rb") as file:
            return max(0, _cores() - int(file.read().split()[3].split(b"/")[0]))
    except (OSError, IndexError, ValueError):
        pass
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return _cores()
    return max(0, _cores() - math.ceil(load))


class _Calls:
    """One :func:`run_all` request: calls taken in order by whichever thread asks first."""

    def __init__(self, calls: Sequence[Callable[[], None]]) -> None:
        self._calls = list(calls)
        self._next = 0
        self._lock = threading.Lock()
        self.errors: List[BaseException] = []

    def work(self) -> None:
        """Run calls until none is left to start."""
        while True:
            with self._lock:
                if self._next == len(self._calls):
                    return
                call = self._calls[self._next]
                self._next += 1
            try:
                call()
            except BaseException as error:  # noqa: BLE001 - raised by run_all once every call has ended
                with self._lock:
                    self.errors.append(error)


#: Seconds an idle helper thread waits for more work before it ends: long enough to serve the next box of a read
#: loop without a thread's start (0.1 to 0.2 ms on a 2-core virtual machine), short enough that no helper outlives
#: the reads that needed it by more.
HELPER_IDLE_SECONDS = 0.05


class _Task:
    """One helper's share of a :func:`run_all` request."""

    __slots__ = ("run", "done")

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run
        self.done = threading.Event()


class _Helpers:
    """The process's helper threads: started when a task finds none idle, ended after
    :data:`HELPER_IDLE_SECONDS` without a task."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start afresh, with no helper: in a child process after fork(), where the parent's do not exist."""
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._tasks: "collections.deque[_Task]" = collections.deque()
        self._idle = 0
        self._started = 0

    def submit(self, run: Callable[[], None]) -> Optional[_Task]:
        """Queue ``run`` for a helper: an idle one, else a new one; None if no thread could be started (no memory,
        a thread limit), and the caller runs it: left queued, a later helper ran it after its request had failed
        and handed its buffers on, writing into another read's blocks."""
        task = _Task(run)
        with self._lock:
            self._tasks.append(task)
            if self._idle >= len(self._tasks):
                self._ready.notify()
                return task
            self._started += 1
            name = f"emfast-decode-{self._started}"
        try:
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        except RuntimeError:  # "can't start new thread"
            with self._lock:
                try:
                    self._tasks.remove(task)
                except ValueError:  # an idle helper took it meanwhile: it runs
                    return task
            return None
        return task

    def finish(self, task: _Task) -> None:
        """Return once ``task`` has run, or at once if no helper took it yet (it is dropped: the caller did its
        work)."""
        with self._lock:
            try:
                self._tasks.remove(task)
                return
            except ValueError:
                pass  # taken by a helper
        task.done.wait()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
                deadline = time.monotonic() + HELPER_IDLE_SECONDS
                while not self._tasks:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._idle -= 1
                        return
                    self._ready.wait(left)
                self._idle -= 1
                task = self._tasks.popleft()
            try:
                task.run()
            finally:
                task.done.set()
                # let go of the request while idle: its calls hold the buffers they filled (a chunk cache's blocks,
                # whose memory is reused once nothing else refers to it)
                del task


_HELPERS = _Helpers()
os.register_at_fork(after_in_child=_HELPERS.forget)


def run_all(calls: Sequence[Callable[[], None]], helpers: Optional[int] = None) -> None:
    """Run every call, side by side on this thread and helper threads, and return when all have ended.

    ``helpers`` (default: one per idle core, and one per :data:`CALLS_PER_HELPER` calls): helpers run only on
    idle cores, since where every core is busy (other producers, other processes), threads of one process contend
    for the GIL and the cores, and cost CPU time without shortening the reads (measured on a loaded 2-core
    machine: about 20 % more CPU time per box and no faster, ``benchmarks/lazy_cold.py``). A helper's share that
    no helper has taken when this thread ran out of calls is dropped, not waited for.

    Raises
    ------
    BaseException
        The first exception a call raised, after every call has ended (the others' are dropped).
    """
    if helpers is None:  # the idle cores asked only where the calls are enough for a helper (a file read)
        helpers = min(_cores() - 1, (len(calls) - 1) // CALLS_PER_HELPER)
        helpers = min(helpers, _idle_cores()) if helpers > 0 else 0
    work = _Calls(calls)
    tasks = [task for task in (_HELPERS.submit(work.work) for _ in range(helpers)) if task is not None]
    try:
        work.work()
    finally:
        if tasks:  # (none: nothing to wait for, and the main thread's signal handlers are left alone)
            with ctrl_c_held():  # the helpers write into the caller's buffers: all have ended before it goes on
                for task in tasks:
                    _HELPERS.finish(task)
    if work.errors:
        errors = work.errors
        try:
            raise errors[0]
        finally:  # the error's traceback holds the calls' frames, and through them this request: no cycle back
            errors.clear()
            del errors, work, tasks, calls


#: Seconds of work a list must promise (its length times the measured seconds per item) to be cut into parts run
#: side by side: a helper costs a wake-up or a thread's start (0.05 to 0.2 ms on a 2-core machine) and GIL
#: hand-overs, and file reads side by side slow each other (a box's 13 blosc-lz4 chunks, 0.5 to 0.7 ms of reading
#: and decoding: 4.5 ms of file reads per 24 boxes alone, 7.4 ms in two parts). Measured on 2 cores,
#: ``benchmarks/lazy_cold.py``: such boxes read 10 % slower with helpers, boxes of zstd chunks (1.8 ms) 9 % faster.
SIDE_BY_SIDE_SECONDS = 1.0e-3

#: Every ``SideBySide.of`` kind's measurements.
_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()

#: Every this many lists, a reader runs one the other way (alone where helpers were not paying, and the reverse),
#: so that its choice follows the machine's load.
EXPLORE_EVERY = 16


class SideBySide:
    """Runs one reader's work on the parts of a list (the reads and decodes of a box's chunks) side by side where
    that pays, else all on the calling thread.

    Whether it pays is measured, not assumed: the reader keeps the seconds per item of its lists run alone and run
    in parts, and cuts a list into parts while that was faster, the list promises enough work
    (:data:`SIDE_BY_SIDE_SECONDS`) and cores are idle. Decoding zstd chunks gains from helpers; reading raw chunks
    into fresh memory does not on a 2-core virtual machine, whose page faults contend (measured,
    ``benchmarks/lazy_cold.py``). The list is cut into one contiguous part per thread, so a helper takes no lock
    per item."""

    def __init__(self) -> None:
        self._alone = 0.0  # seconds per item, alone: unknown until measured, the first lists run alone
        self._in_parts: Optional[float] = None  # seconds per item in parts: unknown until tried
        self._lists = 0

    @classmethod
    def of(cls, *kind) -> "SideBySide":
        """The process's measurements for readers of one ``kind`` (a format, its codec, its chunks' bytes): shared,
        so that a store opened again, as every epoch or worker may, does not measure and explore afresh (its
        first lists, in parts or not, are the slowest)."""
        with _SHARED_LOCK:
            return _SHARED.setdefault(kind, cls())

    def run(self, items: Sequence, work: Callable[[Sequence], None], most: Optional[int] = None) -> None:
        """Call ``work`` on parts of ``items`` (every item in exactly one part, at most ``most`` items in a part),
        side by side where that pays.

        Raises
        ------
        BaseException
            The first exception a part raised, after every part has ended.
        """
        if not items:
            return
        self._lists += 1
        helpers = 0
        if self._alone * len(items) >= SIDE_BY_SIDE_SECONDS:
            paying = self._in_parts is None or self._in_parts < self._alone
            if paying != (self._lists % EXPLORE_EVERY == 0):
                helpers = min(_cores() - 1, _idle_cores(), (len(items) - 1) // CALLS_PER_HELPER)
        count = max(helpers + 1, -(-len(items) // most) if most else 1)
        bounds = [len(items) * n // count for n in range(count + 1)]
        parts = [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        start = time.perf_counter()
        run_all([functools.partial(work, part) for part in parts], helpers)
        per_item = (time.perf_counter() - start) / len(items)
        if helpers:
            self._in_parts = per_item if self._in_parts is None else self._in_parts + 0.25 * (per_item - self._in_parts)
        else:
            self._alone += 0.25 * (per_item - self._alone) if self._alone else per_item


def zstd_content_size(frame) -> Optional[int]:
    """The decoded size a zstd frame's header states (RFC 8878, 3.1.1.1), or None if it states none or ``frame``
    is no zstd frame. The decoder checks the content against this size, so a damaged frame cannot pass it."""
    header = bytes(memoryview(frame)[:18])
    if len(header) < 6 or header[:4] != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = header[4]
    single_segment = bool(descriptor & 0x20)
    start = 5 + (not single_segment) + (0, 1, 2, 4)[descriptor & 0x03]
    size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    if size == 0 or len(header) < start + size:
        return None
    return int.from_bytes(header[start:start + size], "little") + (256 if size == 2 else 0)


def _blosc_size(frame, at: int) -> Optional[int]:
    """The size at byte ``at`` of a blosc frame's 16-byte header (4: decoded, 12: the frame's own), or None if
    ``frame`` is too short to be one."""
    header = bytes(memoryview(frame).cast("B")[:16])
    return int.from_bytes(header[at:at + 4], "little") if len(header) == 16 else None


def blosc_content_size(frame) -> Optional[int]:
    """The decoded size a blosc frame's header states, or None if ``frame`` is too short to be one."""
    return _blosc_size(frame, 4)


def checked_blosc(codec) -> Callable:
    """``codec.decode`` (a numcodecs ``Blosc``) refusing a frame whose header states another length than it has:
    numcodecs (0.16) decodes a truncated frame without an error, into bytes read past its end.

    Raises
    ------
    ValueError
        The frame is shorter or longer than its header says (the caller names the chunk).
    """
    def decode(data, out=None):
        length, stated = memoryview(data).nbytes, _blosc_size(data, 12)
        if stated != length:
            raise ValueError(f"a blosc frame of {length} bytes whose header states {stated}: truncated or damaged")
        return codec.decode(data, out)
    return decode
