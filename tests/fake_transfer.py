"""A transfer backend for machines without a GPU: "device" memory is host memory, each copy completes on its own
thread after a random delay, and completion events are threading primitives. It drives the same copier and ring
logic as the pycuda backend, and records which threads called it."""
import random
import threading
import time

import numpy as np

from emfast.transfer import TransferBackend

POISON = 0xAB


class FakeDevice(TransferBackend):
    name = "fake:0"

    def __init__(self, seed=0, max_delay=0.003, fail_copy_at=None, fail_open=False):
        self.random = random.Random(seed)
        self.max_delay = max_delay
        self.fail_copy_at = fail_copy_at
        self.fail_open = fail_open
        self.callers = set()
        self.copies = 0
        self.reallocations = 0
        self.closed = False
        self._copiers = []

    def _called(self):
        self.callers.add(threading.current_thread().name)

    def _allocate(self):
        return {name: np.zeros(shape, dtype) for name, (shape, dtype) in self.fields.items()}

    def open(self, fields, host_slots, device_slots):
        self._called()
        if self.fail_open:
            raise MemoryError(f"fake device: cannot allocate {device_slots} device slots")
        self.fields = fields
        self.device = [self._allocate() for _ in range(device_slots)]
        self.done = [threading.Event() for _ in range(device_slots)]
        for event in self.done:
            event.set()
        return [self._allocate() for _ in range(host_slots)]

    def device_batch(self, index):
        self._called()
        return dict(self.device[index])

    def reallocate(self, index):
        self._called()
        self.reallocations += 1
        self.device[index] = self._allocate()

    def guard(self, index):
        self._called()
        for array in self.device[index].values():  # whatever still reads this slot now sees poison
            array.view(np.uint8).fill(POISON)

    def copy(self, host, index):
        self._called()
        if self.copies == self.fail_copy_at:
            raise RuntimeError(f"fake device: copy {self.copies} failed")
        self.copies += 1
        delay = self.random.uniform(0, self.max_delay)
        target = self.device[index]
        self.done[index].clear()

        def transfer():
            time.sleep(delay)
            for name, array in host.items():
                np.copyto(target[name], array)
            self.done[index].set()

        thread = threading.Thread(target=transfer, name="fake-dma")
        thread.start()
        self._copiers.append(thread)

    def wait(self, index):
        self._called()
        self.done[index].wait()
        self._copiers = [t for t in self._copiers if t.is_alive()]

    def close(self):
        self._called()
        for thread in self._copiers:
            thread.join()
        self.closed = True
