"""The HDF5 files that lazily read volumes hold open, bounded in number.

A lazily read HDF5 volume reads through its open file. Each open file takes a descriptor and about 0.7 MB of
HDF5's own memory, so a training set of 1500 lazily read cutouts failed at the descriptor limit (``ulimit -n``,
256 by default on macOS) and held 1.1 GB beside its chunk caches. The process keeps at most :func:`most_open`
of them open: beyond it, the files of the volumes read least recently, and not being read, are closed ("parked")
and opened again at their volume's next read. Reopened, a file must be the one opened first (same device, inode,
size and modification time), else the read fails as for a file changed since it was opened; a parked file removed
or renamed away cannot be read again, where an open one would read on through its descriptor.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from typing import Callable, List

from ._filebatch import descriptor_limit

#: Bounds of the number of lazily read HDF5 files held open: a quarter of the descriptor limit, within these.
FEWEST_OPEN, MOST_OPEN = 16, 256


def most_open() -> int:
    """The most lazily read HDF5 files the process holds open at once: a quarter of its descriptor limit (the rest
    is for chunk files, sockets, DataLoader pipes), at least :data:`FEWEST_OPEN`, at most :data:`MOST_OPEN`."""
    limit = descriptor_limit()
    return MOST_OPEN if limit is None else max(FEWEST_OPEN, min(MOST_OPEN, limit // 4))


class OpenFiles:
    """The open files of lazily read HDF5 sources, least recently used first, parked beyond :func:`most_open`.

    A source takes part through ``_users`` (an int, changed only under this object's lock), ``_parkable`` and
    ``_user_closed`` (bools), ``_reopen_lock`` (made anew in a forked child), ``_open_again()`` (reopen a parked
    file, under that lock) and ``_park()`` (hand over its open files, which the caller closes, and forget them).
    Sources are held weakly: one dropped unclosed is forgotten (its entry purged when found dead; no callback, which
    a garbage collection could run while this thread holds the lock).
    """

    def __init__(self, most: Callable[[], int] = most_open) -> None:
        self._most = most
        self._lock = threading.Lock()
        self._open: "OrderedDict[int, weakref.ref]" = OrderedDict()
        self._sources: "weakref.WeakSet" = weakref.WeakSet()  # every source, parked or not (for fork)

    def add(self, source) -> None:
        """A new source, its file open."""
        with self._lock:
            self._sources.add(source)
        self.opened(source)

    def use(self, source) -> None:
        """Before a read of ``source``: its file open (reopened if parked), kept open until :meth:`done`, and the
        files of others parked beyond the bound. Raises what reopening raises."""
        self.hold(source)
        try:
            source._open_again()
        except BaseException:
            self.done(source)
            raise
        self.opened(source)

    def hold(self, source) -> None:
        """Keep ``source``'s file as it is (open, or parked) until :meth:`done`: not parked meanwhile, so that its
        descriptor is not closed and given to another file while it is looked at."""
        with self._lock:
            source._users += 1

    def done(self, source) -> None:
        """After a read of ``source`` (one per :meth:`use` or :meth:`hold`)."""
        with self._lock:
            source._users -= 1

    def opened(self, source) -> None:
        """Mark ``source`` (its file open) as the one used last, and park the least recently used idle files
        beyond the bound (closed outside the lock). A source whose file cannot be told again when reopened
        (``_parkable`` false) keeps its file open; a closed one is not listed again."""
        if not source._parkable:
            return
        key = id(source)
        with self._lock:
            if source._user_closed:  # closed by another thread since this one reopened it
                return
            ref = self._open.get(key)
            if ref is None or ref() is not source:
                self._open[key] = weakref.ref(source)
            self._open.move_to_end(key)
            # the bound is never below FEWEST_OPEN: below it, no need to ask for the descriptor limit
            files = self._park_beyond(self._most()) if len(self._open) > FEWEST_OPEN else []
        close_files(files)

    def _park_beyond(self, most: int) -> List:
        """Under the lock: park idle sources, least recently used first, until at most ``most`` files are open;
        their files, to be closed."""
        files: list = []
        for key in list(self._open):
            if len(self._open) <= most:
                break
            source = self._open[key]()
            if source is None:
                del self._open[key]
            elif source._users == 0:
                del self._open[key]
                files += source._park()
        return files

    def forget(self, source) -> None:
        """``source`` closed its files itself (its volume was closed)."""
        with self._lock:
            ref = self._open.get(id(source))
            if ref is not None and ref() is source:
                del self._open[id(source)]

    @property
    def count(self) -> int:
        """Files of lazily read HDF5 sources open now."""
        with self._lock:
            return sum(ref() is not None for ref in self._open.values())

    def after_fork(self) -> None:
        """In a child process: a read or a reopen in flight in the parent at fork() never ends here."""
        self._lock = threading.Lock()
        for source in list(self._sources):
            source._users = 0
            source._reopen_lock = threading.Lock()


def close_files(files: List) -> None:
    """Close h5py files, each still open: a volume's file, then the one holding its data (an external link's, which
    closing the linking one leaves open, and which may be another volume's too)."""
    for file in files:
        if file.id.valid:
            file.close()


#: The process's open files of lazily read HDF5 volumes.
OPEN_FILES = OpenFiles()
os.register_at_fork(after_in_child=OPEN_FILES.after_fork)


def open_identity(status: os.stat_result) -> tuple:
    """What a reopened file must match: (device, inode, size, modification time in ns)."""
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns
