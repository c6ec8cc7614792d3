"""A transfer backend for machines without a GPU (tests, CI), which enforces the rules a real device imposes.

"Device" memory is host memory; each copy completes on its own thread after a random delay, and completion
events are threading primitives. It drives the same copier, pool and ring logic as the pycuda backend and
records every breach of the rules that make pycuda leak or corrupt memory on real hardware:

- memory is freed only on the thread that opened the device, or inside ``activate()`` (the context pushed);
  a free anywhere else is a leak on a real GPU (pycuda cannot free out of its context), and so is a free after
  ``close()`` let the context go;
- ``close(slots_outstanding)`` must be told exactly how many slots are still allocated;
- the stream a slot is ordered after is the one current where its last view died, noted then;
- a copy into a slot that any exported array (or view, or tensor of it) still reaches is an error;
- results are copied back only into page-locked memory (a host slot or ``pinned()``), from a C-contiguous array
  of the destination's shape and dtype; until ``wait_back()`` of that copy the destination holds poison;
- a host slot is not written while its copy to the device is under way (the DMA reads it until ``wait()``);
- every driver call (allocation, copies, waits, frees) is made on the thread that opened the device, or inside
  ``activate()``;
- live allocations are counted, so a test can bound them.
"""
import contextlib
import random
import threading
import time
import weakref

import numpy as np

from ._backend import TransferBackend

POISON = 0xAB


class RuleBroken(AssertionError):
    """The code under test did something the real device would punish."""


class _Memory:
    """One fake device slot: arrays per field, the exports handed out, the stream it was last guarded on."""

    def __init__(self, fields):
        self.arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in fields.items()}
        self.exports = []  # weak references to the objects that keep exported arrays alive
        self.done = threading.Event()
        self.done.set()
        self.freed = False
        self.released_on = None  # the stream current where the last view died
        self.tampered = None  # how its host slot was written while a copy read it (raised by the next wait)


class _Export:
    __slots__ = ("__array_interface__", "_memory", "_owner", "__weakref__")

    def __init__(self, array, owner):
        self.__array_interface__ = array.__array_interface__
        self._memory = array
        self._owner = owner


class FakeDevice(TransferBackend):
    name = "fake:0"

    def __init__(self, seed=0, max_delay=0.003, fail_copy_at=None, fail_open=False):
        self.random = random.Random(seed)
        self.max_delay = max_delay
        self.fail_copy_at = fail_copy_at
        self.fail_open = fail_open
        self.callers = set()
        self.copies = 0
        self.allocations = 0
        self.live = 0
        self.peak = 0
        self.violations = []
        self.guards = []  # (slot id, stream) per guarded copy into a slot that had been lent out
        self.closed = False
        self.context_kept = True
        self.owner = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._copiers = []
        self._copies_back = []  # copies back not yet waited for
        self._pinned = []  # page-locked host memory: the host slots and pinned() arrays
        self.copies_back = 0

    def _called(self, driver=True):
        thread = threading.current_thread()
        self.callers.add(thread.name)
        if driver and self.owner is not None and thread is not self.owner and not getattr(self._local, "active",
                                                                                        False):
            self._broken(f"a driver call on {thread.name}, not the device's thread nor inside activate()")

    def _broken(self, message):
        self.violations.append(message)
        raise RuleBroken(message)

    # -- the stream a test runs "device work" on -------------------------------------------------------------

    @contextlib.contextmanager
    def stream(self, name):
        """Make ``name`` the current stream of the calling thread (as torch.cuda.stream(s) would)."""
        previous = getattr(self._local, "stream", "default")
        self._local.stream = name
        try:
            yield
        finally:
            self._local.stream = previous

    def given_back(self, memory):
        memory.released_on = getattr(self._local, "stream", "default")

    # -- the backend -----------------------------------------------------------------------------------------

    def open(self, fields, host_slots):
        self._called(driver=False)  # it makes this thread the device's (again, after close())
        self.owner = threading.current_thread()
        if self.fail_open:
            raise MemoryError(f"fake device: cannot allocate {host_slots} page-locked host slots")
        self.fields = fields
        self.closed = False  # a device may be opened again after close()
        slots = [{name: np.zeros(shape, dtype) for name, (shape, dtype) in fields.items()}
                 for _ in range(host_slots)]
        self._pinned = [array for slot in slots for array in slot.values()]
        return slots

    def allocate(self):
        self._called()
        if threading.current_thread() is not self.owner:
            self._broken(f"allocation on {threading.current_thread().name}, not the device's thread")
        with self._lock:
            self.allocations += 1
            self.live += 1
            self.peak = max(self.peak, self.live)
        return _Memory(self.fields)

    def free(self, memory):
        thread = threading.current_thread()
        if thread is not self.owner and not getattr(self._local, "active", False):
            self._broken(f"device memory freed on {thread.name} without its context (a leak on a real GPU)")
        if self.closed and not self.context_kept:
            self._broken("device memory freed after close() released the context (a leak on a real GPU)")
        if memory.freed:
            self._broken("device memory freed twice")
        if any(export() is not None for export in memory.exports):
            self._broken("device memory freed while arrays of it are alive")
        memory.freed = True
        with self._lock:
            self.live -= 1

    @contextlib.contextmanager
    def activate(self):
        self._local.active = True
        try:
            yield
        finally:
            self._local.active = False

    def export(self, memory, owner):
        exports = {name: _Export(array, owner) for name, array in memory.arrays.items()}
        memory.exports = [weakref.ref(e) for e in exports.values()]
        return {name: np.asarray(e) for name, e in exports.items()}

    def guard(self, memory):
        self._called()
        if memory.released_on is not None:
            self.guards.append((id(memory), memory.released_on))
            memory.released_on = None
        for array in memory.arrays.values():  # whatever still reads this slot now sees poison
            array.view(np.uint8).fill(POISON)

    def copy(self, host, memory):
        self._called()
        if memory.freed:
            self._broken("copy into freed device memory")
        if any(export() is not None for export in memory.exports):
            self._broken("copy into a device slot that the consumer still views")
        if self.copies == self.fail_copy_at:
            raise RuntimeError(f"fake device: copy {self.copies} failed")
        self.copies += 1
        delay = self.random.uniform(0, self.max_delay)
        memory.done.clear()
        sent = {name: array.copy() for name, array in host.items()}  # what the DMA must find when it reads

        def transfer():
            time.sleep(delay)
            for name, array in host.items():
                if not np.array_equal(array, sent[name], equal_nan=array.dtype.kind == "f"):
                    memory.tampered = (f"host slot field {name!r} written while its copy to the device was under "
                                       "way")
                np.copyto(memory.arrays[name], array)
            memory.done.set()

        thread = threading.Thread(target=transfer, name="fake-dma")
        thread.start()
        self._copiers.append(thread)

    def wait(self, memory):
        self._called()
        memory.done.wait()
        self._copiers = [t for t in self._copiers if t.is_alive()]
        tampered, memory.tampered = memory.tampered, None
        if tampered is not None:
            self._broken(tampered)

    def pinned(self, shape, dtype):
        self._called()
        if threading.current_thread() is not self.owner or self.closed:
            self._broken(f"page-locked memory asked for on {threading.current_thread().name}, not the device's "
                         "thread, or after close()")
        array = np.zeros(shape, dtype)
        self._pinned.append(array)
        return array

    def copy_back(self, source, host):
        self._called()
        if threading.current_thread() is not self.owner:
            self._broken(f"copy back on {threading.current_thread().name}, not the device's thread")
        root = host
        while isinstance(root.base, np.ndarray):
            root = root.base
        if not any(root is pinned for pinned in self._pinned):
            self._broken("copy back into pageable host memory (only page-locked memory copies asynchronously)")
        source = np.asarray(source)
        if source.shape != host.shape or source.dtype != host.dtype or not source.flags.c_contiguous:
            self._broken(f"copy back from a {source.dtype}{list(source.shape)} array (C-contiguous: "
                         f"{source.flags.c_contiguous}) into {host.dtype}{list(host.shape)}")
        self.copies_back += 1
        host.view(np.uint8).fill(POISON)  # what reads it before wait_back() sees poison
        delay = self.random.uniform(0, self.max_delay)

        def transfer():
            time.sleep(delay)
            np.copyto(host, source)

        thread = threading.Thread(target=transfer, name="fake-dma-back")
        thread.start()
        self._copies_back.append(thread)
        return thread

    def wait_back(self, copy):
        self._called()
        if copy not in self._copies_back:
            self._broken("wait_back() given a copy that is not under way (waited for twice, or not a copy back)")
        copy.join()
        self._copies_back.remove(copy)

    def close(self, slots_outstanding):
        self._called()
        for thread in self._copiers + self._copies_back:
            thread.join()
        self._copies_back = []
        if slots_outstanding != self.live:
            self._broken(f"close() told {slots_outstanding} slots are outstanding, but {self.live} are allocated")
        self.outstanding_at_close = slots_outstanding
        self.context_kept = slots_outstanding > 0
        self.closed = True
