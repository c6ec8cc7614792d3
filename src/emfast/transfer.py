"""Where batches live when the consumer gets them: host memory, or a CUDA device through pycuda.

``device="cpu"``: the producers' slots are the batches. ``device="cuda[:N]"``: producers fill page-locked host
slots; one copier thread, which creates and uses every CUDA object, copies each filled slot into a device slot
from a :class:`~emfast.pool.SlotPool` on a non-blocking stream and hands the device batch to the consumer once the
copy has completed (so a batch's ``__cuda_array_interface__`` can say ``stream: None`` truthfully).

A device slot returns to the pool when the last array or tensor viewing it dies, on whatever thread that is; an
event is recorded there on the current stream (PyTorch's, else CuPy's, else the legacy default stream), and
before the slot is overwritten the copy stream waits for that event, so the work queued until then that reads
the batch finishes first. Device memory is freed by the copier thread at close, or, for slots still held then, by the
thread that drops the last reference, with the primary context pushed: never out of its context.

A :class:`TransferBackend` does the device work; :class:`PycudaBackend` is the real one, and the tests drive the
same copier logic with a fake device that enforces these rules.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
import sys
import threading
import warnings
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import numpy as np

from .pool import FixedSlots, SlotPool
from .profile import Profile
from .ring import Ring, RingClosed, join_all

Fields = Dict[str, Tuple[tuple, np.dtype]]

#: cuStreamCreate flag CU_STREAM_NON_BLOCKING: no implicit synchronisation with the legacy default stream.
_CU_STREAM_NON_BLOCKING = 1
#: cuEventCreate flag CU_EVENT_DISABLE_TIMING: the cheapest event, for ordering only.
_CU_EVENT_DISABLE_TIMING = 2


class DeviceNotice(UserWarning):
    """``device="auto"`` fell back to the CPU (the message says why)."""


class DeviceArray:
    """A batch array in device memory, zero-copy to PyTorch and CuPy through ``__cuda_array_interface__`` v3.

    ``torch.as_tensor(array, device="cuda")`` and ``cupy.asarray(array)`` wrap the memory without copying. The
    copy into it has completed when the batch is handed out, hence ``stream: None``.
    """

    __slots__ = ("ptr", "shape", "dtype", "device", "_owner")

    def __init__(self, ptr: int, shape: tuple, dtype, device: str, owner: Any) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self._owner = owner  # the allocation: memory stays valid while this array (or a view of it) lives

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype}{list(self.shape)} on {self.device} at {self.ptr:#x})"


class TransferBackend:
    """Device memory and copies.

    The copier thread calls every method except :meth:`given_back` (called where a device slot is given back)
    and :meth:`free` inside :meth:`activate` (called by a thread that gives a slot back after :meth:`close`).
    """

    name = "device"

    def open(self, fields: Fields, host_slots: int) -> List[Dict[str, np.ndarray]]:
        """Prepare the device and return the page-locked host slots. On failure, leave nothing and raise."""
        raise NotImplementedError

    def allocate(self) -> Any:
        """Memory for one device slot (every field of a batch)."""
        raise NotImplementedError

    def free(self, memory: Any) -> None:
        """Free one device slot's memory; the caller is the copier thread or inside :meth:`activate`."""
        raise NotImplementedError

    def export(self, memory: Any, owner: Any) -> Dict[str, Any]:
        """The consumer-facing arrays of a device slot; each keeps ``owner`` alive."""
        raise NotImplementedError

    def given_back(self, memory: Any) -> None:
        """On the thread that dropped the last view of ``memory``: note the work queued on its current stream,
        for :meth:`guard`. Must not block."""
        raise NotImplementedError

    def activate(self) -> ContextManager:
        """Make the device's context current on the calling thread for the duration (to free memory there)."""
        raise NotImplementedError

    def guard(self, memory: Any) -> None:
        """Order the next copy into ``memory`` after the work noted by :meth:`given_back`."""
        raise NotImplementedError

    def copy(self, host: Dict[str, np.ndarray], memory: Any) -> None:
        """Start copying the host slot's arrays into the device slot ``memory``."""
        raise NotImplementedError

    def wait(self, memory: Any) -> None:
        """Block until the copy into ``memory`` has completed."""
        raise NotImplementedError

    def close(self, slots_outstanding: int) -> None:
        """Free everything but the device slots still held (``slots_outstanding`` of them); idempotent."""
        raise NotImplementedError


def cuda_unavailable(ordinal: int = 0) -> Optional[str]:
    """Why ``cuda:ordinal`` cannot be used, or None if it can."""
    try:
        import pycuda.driver as cuda
    except (ImportError, OSError) as error:
        return (f"pycuda cannot be imported ({error}); install it with pip install 'emfast[gpu]', which needs "
                "the CUDA toolkit to build")
    try:
        cuda.init()
        count = cuda.Device.count()
    except cuda.Error as error:
        return f"the CUDA driver could not be initialised ({error})"
    if count == 0:
        return "no CUDA device was found"
    if ordinal >= count:
        return f"this machine has {count} CUDA device{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1})"
    return None


def resolve_device(device) -> Optional[TransferBackend]:
    """The backend for ``device`` (None for the CPU).

    Parameters
    ----------
    device : str or TransferBackend
        ``"cpu"``, ``"cuda"`` (device 0), ``"cuda:N"``, ``"auto"`` (CUDA device 0 if usable, else the CPU with a
        :class:`DeviceNotice`), or a backend object.

    Raises
    ------
    ValueError
        For a string that names no device.
    RuntimeError
        For a CUDA device that cannot be used; the message says what is missing.
    """
    if isinstance(device, TransferBackend):
        return device
    match = re.fullmatch(r"(cpu|auto|cuda)(?::(\d+))?", device) if isinstance(device, str) else None
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    kind, ordinal = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return None
    reason = cuda_unavailable(ordinal)
    if kind == "auto":
        if reason is not None:
            warnings.warn(f"emfast: device='auto' uses the CPU: {reason}", DeviceNotice, stacklevel=3)
            return None
        return PycudaBackend(0)
    if reason is not None:
        raise RuntimeError(f"device={device!r} cannot be used: {reason}")
    return PycudaBackend(ordinal)


class _Driver:
    """The CUDA driver calls pycuda lacks: recording an event on a stream that another library created."""

    def __init__(self) -> None:
        library = None
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
            try:
                library = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if library is None:
            raise OSError("the CUDA driver library (libcuda) cannot be loaded")
        handle, pointer = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        self._calls = {}
        for call, arguments in (("cuEventCreate", [pointer, ctypes.c_uint]),
                                ("cuEventRecord", [handle, handle]),
                                ("cuStreamWaitEvent", [handle, handle, ctypes.c_uint]),
                                ("cuEventDestroy_v2", [handle])):
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


class _DeviceSlot:
    """One batch's device memory: an allocation per field, and the events that order copies into it."""

    __slots__ = ("allocations", "copied", "released", "recorded", "unordered")

    def __init__(self, allocations: Dict[str, Any], copied: Any, released: int) -> None:
        self.allocations = allocations
        self.copied = copied  # recorded on the copy stream after the copy
        self.released = released  # recorded on the consumer's stream where the slot was given back
        self.recorded = False  # `released` holds the consumer's work to wait for
        self.unordered = False  # giving back could not record it: synchronise the device before the next copy


class PycudaBackend(TransferBackend):
    """Page-locked host slots, device slots and one non-blocking copy stream in the device's primary context.

    The primary context is the one PyTorch and CuPy use, so their tensors and these buffers live in the same
    context. It is pushed in the copier thread for the thread's lifetime and popped at :meth:`close`.
    """

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
        return _DeviceSlot(allocations, cuda.Event(), self._driver.event())

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
        finally:
            memory.allocations, memory.copied = {}, None  # the copy event goes here too, in this context
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
        for name, allocation in memory.allocations.items():
            self._cuda.memcpy_htod_async(allocation, host[name], self._stream)
        memory.copied.record(self._stream)

    def wait(self, memory: _DeviceSlot) -> None:
        memory.copied.synchronize()

    def close(self, slots_outstanding: int) -> None:
        if self._context is None:
            return
        stream = getattr(self, "_stream", None)
        try:
            if stream is not None:
                stream.synchronize()
        finally:  # even after a CUDA error: a thread that ends with a context pushed aborts the process
            # Dropping the last references frees the host slots and the stream here, in the context's thread.
            self._host, self._stream = [], None
            self._cuda.Context.pop()
            if slots_outstanding == 0:
                self._context.detach()
                self._context = None
            # Otherwise the context object stays: threads that give the held slots back push it to free them.
            # Its retain of the primary context (which PyTorch holds anyway) is then released only if pycuda
            # destroys the object on a thread where that is allowed.


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
        self.thread.start()
        self._opened.wait()
        if self._open_error is not None:
            self.thread.join()
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
