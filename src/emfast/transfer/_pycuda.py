"""The real device: page-locked host slots, device slots and two non-blocking copy streams through pycuda, with the
copies and the driver calls pycuda lacks made through ctypes (the rules are in :mod:`emfast.transfer._backend`)."""
from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import Any, Dict, List, Optional

import numpy as np

from .._registry import register
from ._backend import DeviceArray, Fields, TransferBackend, cuda_unavailable

#: cuStreamCreate flag CU_STREAM_NON_BLOCKING: no implicit synchronisation with the legacy default stream.
_CU_STREAM_NON_BLOCKING = 1
#: cuEventCreate flag CU_EVENT_DISABLE_TIMING: the cheapest event, for ordering only.
_CU_EVENT_DISABLE_TIMING = 2


class _Driver:
    """The CUDA driver calls pycuda lacks (recording an event on a stream that another library created), and the
    asynchronous copies and event calls, made without giving up the GIL.

    pycuda releases the GIL around every call, even one that only queues work and returns in microseconds; taking
    it back can wait a whole switch interval (5 ms) behind a thread running Python, several times a batch. Only
    :meth:`synchronize`, which waits for the device, releases it here.
    """

    def __init__(self) -> None:
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
            try:
                quick = ctypes.PyDLL(name)  # keeps the GIL during the call
            except OSError:
                continue
            blocking = ctypes.CDLL(name)
            break
        else:
            raise OSError("the CUDA driver library (libcuda) cannot be loaded")
        handle, pointer, size = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t
        self._calls = {}
        for library, call, arguments in ((quick, "cuEventCreate", [pointer, ctypes.c_uint]),
                                         (quick, "cuEventRecord", [handle, handle]),
                                         (quick, "cuStreamWaitEvent", [handle, handle, ctypes.c_uint]),
                                         (quick, "cuEventDestroy_v2", [handle]),
                                         (quick, "cuMemcpyHtoDAsync_v2", [ctypes.c_uint64, handle, size, handle]),
                                         (quick, "cuMemcpyDtoHAsync_v2", [handle, ctypes.c_uint64, size, handle]),
                                         (blocking, "cuEventSynchronize", [handle])):
            function = getattr(library, call)
            function.argtypes, function.restype = arguments, ctypes.c_int
            self._calls[call] = function

    def _call(self, call: str, *arguments) -> None:
        status = self._calls[call](*arguments)
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")

    def event(self) -> int:
        event = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(event), _CU_EVENT_DISABLE_TIMING)
        return event.value

    def record(self, event: int, stream: int) -> None:
        self._call("cuEventRecord", event, stream)

    def wait(self, stream: int, event: int) -> None:
        """Make ``stream`` wait for ``event``'s work."""
        self._call("cuStreamWaitEvent", stream, event, 0)

    def destroy(self, event: int) -> None:
        self._call("cuEventDestroy_v2", event)

    def synchronize(self, event: int) -> None:
        """Wait for ``event``'s work, the GIL released."""
        self._call("cuEventSynchronize", event)

    def to_device(self, device: int, host: np.ndarray, stream: int) -> None:
        """Queue a copy of the C-contiguous (page-locked) ``host`` to ``device`` on ``stream``."""
        self._call("cuMemcpyHtoDAsync_v2", device, host.ctypes.data, host.nbytes, stream)

    def to_host(self, host: np.ndarray, device: int, stream: int) -> None:
        """Queue a copy of ``host.nbytes`` from ``device`` into the C-contiguous (page-locked) ``host``."""
        self._call("cuMemcpyDtoHAsync_v2", host.ctypes.data, device, host.nbytes, stream)


class _DeviceSlot:
    """One batch's device memory: an allocation per field, and the events that order copies into it."""

    __slots__ = ("allocations", "copied", "released", "recorded", "unordered")

    def __init__(self, allocations: Dict[str, Any], copied: int, released: int) -> None:
        self.allocations = allocations
        self.copied = copied  # recorded on the copy stream after the copy
        self.released = released  # recorded on the consumer's stream where the slot was given back
        self.recorded = False  # `released` holds the consumer's work to wait for
        self.unordered = False  # giving back could not record it: synchronise the device before the next copy


@register("backend")
class PycudaBackend(TransferBackend):
    """Page-locked host slots, device slots and two non-blocking copy streams (to the device, and back: a copy back
    waits for the work computing it, and must not hold up the next copy in) in the device's primary context.

    The primary context is the one PyTorch and CuPy use, so their tensors and these buffers live in the same
    context. It is pushed in the copier thread for the thread's lifetime and popped at :meth:`close`.
    """

    kind = "cuda"
    auto = True

    @classmethod
    def unavailable(cls, ordinal: int) -> Optional[str]:
        return cuda_unavailable(ordinal)

    def __init__(self, ordinal: int = 0) -> None:
        self.ordinal = ordinal
        self.name = f"cuda:{ordinal}"
        self._context = None
        self._host: List[Dict[str, np.ndarray]] = []
        self._fields: Fields = {}

    def open(self, fields: Fields, host_slots: int) -> List[Dict[str, np.ndarray]]:
        import pycuda.driver as cuda

        self._cuda = cuda
        self._fields = dict(fields)
        cuda.init()
        self._driver = _Driver()
        self._context = cuda.Device(self.ordinal).retain_primary_context()
        self._context.push()
        try:
            self._stream = cuda.Stream(flags=_CU_STREAM_NON_BLOCKING)
            self._back_stream = cuda.Stream(flags=_CU_STREAM_NON_BLOCKING)
            self._pinned: List[np.ndarray] = []
            self._computed = self._driver.event()  # the consumer's work that computed a result copied back
            self._back_events: List[int] = []  # the events of copies back, destroyed at close
            self._copies_back: List[int] = []  # those of copies already waited for, reused
            self._host = [{name: cuda.pagelocked_empty(shape, dtype) for name, (shape, dtype) in fields.items()}
                          for _ in range(host_slots)]
        except (cuda.Error, MemoryError) as error:
            self.close(0)
            raise MemoryError(f"cannot allocate {host_slots} page-locked host slots of "
                              f"{sum(self._field_bytes().values()) / 2**20:.1f} MiB each: {error}") from error
        return self._host

    def allocate(self) -> _DeviceSlot:
        cuda = self._cuda
        sizes = self._field_bytes()
        try:
            allocations = {name: cuda.mem_alloc(size) for name, size in sizes.items()}
        except cuda.Error as error:
            raise MemoryError(f"cannot allocate a batch slot of {sum(sizes.values()) / 2**20:.1f} MiB on "
                              f"{self.name}: {error}") from error
        return _DeviceSlot(allocations, self._driver.event(), self._driver.event())

    def _field_bytes(self) -> Dict[str, int]:
        return {name: int(np.prod(shape)) * np.dtype(dtype).itemsize for name, (shape, dtype) in self._fields.items()}

    def free(self, memory: _DeviceSlot) -> None:
        errors = []
        for allocation in memory.allocations.values():
            try:
                allocation.free()
            except Exception as error:  # noqa: BLE001 - free the rest; raised below
                errors.append(error)
        try:
            self._driver.destroy(memory.released)
            self._driver.destroy(memory.copied)
        finally:
            memory.allocations = {}
        if errors:
            raise errors[0]

    def export(self, memory: _DeviceSlot, owner: Any) -> Dict[str, Any]:
        return {name: DeviceArray(int(allocation), self._fields[name][0], self._fields[name][1], self.name, owner)
                for name, allocation in memory.allocations.items()}

    def _current_stream(self) -> int:
        """PyTorch's current stream if PyTorch uses CUDA, else CuPy's if CuPy is loaded, else the legacy one (0)."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_stream(self.ordinal).cuda_stream)
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            with cupy.cuda.Device(self.ordinal):
                return int(cupy.cuda.get_current_stream().ptr)
        return 0

    def given_back(self, memory: _DeviceSlot) -> None:
        memory.unordered = True  # until the event is recorded: an error or interrupt here means synchronise
        stream = self._current_stream()
        with self.activate():
            self._driver.record(memory.released, stream)
        memory.recorded, memory.unordered = True, False

    @contextlib.contextmanager
    def activate(self):
        self._context.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def guard(self, memory: _DeviceSlot) -> None:
        if memory.unordered:
            self._cuda.Context.synchronize()
        elif memory.recorded:
            self._driver.wait(self._stream.handle, memory.released)
        memory.recorded = memory.unordered = False

    def copy(self, host: Dict[str, np.ndarray], memory: _DeviceSlot) -> None:
        stream = self._stream.handle
        for name, allocation in memory.allocations.items():
            self._driver.to_device(int(allocation), host[name], stream)
        self._driver.record(memory.copied, stream)

    def wait(self, memory: _DeviceSlot) -> None:
        self._driver.synchronize(memory.copied)

    def order(self, memory: _DeviceSlot) -> None:
        self._driver.wait(self._current_stream(), memory.copied)

    def pinned(self, shape: tuple, dtype) -> np.ndarray:
        array = self._cuda.pagelocked_empty(shape, dtype)
        self._pinned.append(array)  # freed at close, in the context
        return array

    def copy_back(self, source: Any, host: np.ndarray) -> None:
        interface = source.__cuda_array_interface__
        shape, dtype = tuple(interface["shape"]), np.dtype(interface["typestr"])
        strides = interface.get("strides")
        contiguous = strides is None or tuple(strides) == tuple(np.empty(shape, dtype).strides)
        if shape != host.shape or dtype != host.dtype or not contiguous:
            raise ValueError(f"cannot copy a {dtype}{list(shape)} device array (C-contiguous: {contiguous}) back "
                             f"into {host.dtype}{list(host.shape)}")
        # The copy stream waits for the stream the result was computed on (the producer's, else the current one).
        producer = interface.get("stream") or self._current_stream()
        self._driver.record(self._computed, producer)
        stream = self._back_stream.handle
        self._driver.wait(stream, self._computed)
        self._driver.to_host(host, interface["data"][0], stream)
        if not self._copies_back:
            self._back_events.append(self._driver.event())
            self._copies_back.append(self._back_events[-1])
        copied = self._copies_back.pop()
        self._driver.record(copied, stream)
        return copied

    def wait_back(self, copy: int) -> None:
        self._driver.synchronize(copy)
        self._copies_back.append(copy)

    def close(self, slots_outstanding: int) -> None:
        if self._context is None:
            return
        streams = [getattr(self, name, None) for name in ("_stream", "_back_stream")]
        try:
            for stream in streams:
                if stream is not None:
                    stream.synchronize()
        finally:  # even after a CUDA error: a thread that ends with a context pushed aborts the process
            # Dropping the last references frees the host slots and the streams here, in the context's thread.
            self._host, self._stream, self._back_stream, self._pinned = [], None, None, []
            events = [getattr(self, "_computed", None)] + getattr(self, "_back_events", [])
            self._computed, self._back_events, self._copies_back = None, [], []
            for event in events:
                if event is not None:
                    self._driver.destroy(event)
            self._cuda.Context.pop()
            if slots_outstanding == 0:
                self._context.detach()
                self._context = None
            # Otherwise the context object stays: threads that give the held slots back push it to free them.
            # Its retain of the primary context (which PyTorch holds anyway) is then released only if pycuda
            # destroys the object on a thread where that is allowed.
