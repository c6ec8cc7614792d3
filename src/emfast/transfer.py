"""Where batches live when the consumer gets them: host memory, or a CUDA device through pycuda.

``device="cpu"``: the producers' slots are the batches. ``device="cuda[:N]"``: producers fill page-locked host
slots; one copier thread, which creates, uses and frees every CUDA object, copies each filled slot to a device
slot on a non-blocking stream and hands the device batch to the consumer once the copy has completed (so a
batch's ``__cuda_array_interface__`` can say ``stream: None`` truthfully). Before a device slot is overwritten,
the copy stream waits for an event recorded on the legacy default stream after the consumer released the slot,
so work the consumer queued on PyTorch's default stream (or any blocking stream) that reads the batch finishes
first.

A :class:`TransferBackend` does the device work; :class:`PycudaBackend` is the real one, and the tests drive the
same copier logic with a fake whose copies complete on timer threads.
"""
from __future__ import annotations

import re
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .profile import Profile
from .ring import Ring, RingClosed

Fields = Dict[str, Tuple[tuple, np.dtype]]

#: cuStreamCreate flag CU_STREAM_NON_BLOCKING: no implicit synchronisation with the legacy default stream.
_CU_STREAM_NON_BLOCKING = 1


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
    """Device memory and copies. The copier thread is the only caller of every method."""

    name = "device"

    def open(self, fields: Fields, host_slots: int, device_slots: int) -> List[Dict[str, np.ndarray]]:
        """Allocate everything; return the host slots. On failure, leave nothing allocated and raise."""
        raise NotImplementedError

    def device_batch(self, index: int) -> Dict[str, Any]:
        """The consumer-facing arrays of device slot ``index`` (fresh objects)."""
        raise NotImplementedError

    def reallocate(self, index: int) -> None:
        """Give device slot ``index`` new memory; the old stays with arrays the consumer kept."""
        raise NotImplementedError

    def guard(self, index: int) -> None:
        """Order the next copy into slot ``index`` after the work the consumer has queued so far."""
        raise NotImplementedError

    def copy(self, host: Dict[str, np.ndarray], index: int) -> None:
        """Start copying the host slot's arrays into device slot ``index``."""
        raise NotImplementedError

    def wait(self, index: int) -> None:
        """Block until the copy into device slot ``index`` has completed."""
        raise NotImplementedError

    def close(self) -> None:
        """Free everything (idempotent)."""
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
        self._device: List[Dict[str, Any]] = []
        self._fields: Fields = {}

    def open(self, fields: Fields, host_slots: int, device_slots: int) -> List[Dict[str, np.ndarray]]:
        import pycuda.driver as cuda

        self._cuda = cuda
        self._fields = dict(fields)
        cuda.init()
        self._context = cuda.Device(self.ordinal).retain_primary_context()
        self._context.push()
        slot_bytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in fields.values())
        try:
            self._stream = cuda.Stream(flags=_CU_STREAM_NON_BLOCKING)
            self._host = [{name: cuda.pagelocked_empty(shape, dtype) for name, (shape, dtype) in fields.items()}
                          for _ in range(host_slots)]
            self._device = [self._allocate() for _ in range(device_slots)]
            self._copied = [cuda.Event() for _ in range(device_slots)]
            self._released = [cuda.Event() for _ in range(device_slots)]
        except (cuda.Error, MemoryError) as error:
            self.close()
            raise MemoryError(f"cannot allocate {host_slots} page-locked host slots and {device_slots} slots on "
                              f"{self.name} of {slot_bytes / 2**20:.1f} MiB each: {error}") from error
        return self._host

    def _allocate(self) -> Dict[str, Any]:
        return {name: self._cuda.mem_alloc(int(np.prod(shape)) * np.dtype(dtype).itemsize)
                for name, (shape, dtype) in self._fields.items()}

    def device_batch(self, index: int) -> Dict[str, Any]:
        return {name: DeviceArray(int(memory), self._fields[name][0], self._fields[name][1], self.name, memory)
                for name, memory in self._device[index].items()}

    def reallocate(self, index: int) -> None:
        self._device[index] = self._allocate()

    def guard(self, index: int) -> None:
        self._released[index].record()  # the legacy default stream: after everything the consumer queued
        self._stream.wait_for_event(self._released[index])

    def copy(self, host: Dict[str, np.ndarray], index: int) -> None:
        for name, memory in self._device[index].items():
            self._cuda.memcpy_htod_async(memory, host[name], self._stream)
        self._copied[index].record(self._stream)

    def wait(self, index: int) -> None:
        self._copied[index].synchronize()

    def close(self) -> None:
        if self._context is None:
            return
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.synchronize()
        # Dropping the last references frees memory, events and the stream here, in the context's thread;
        # device arrays a consumer still holds keep their allocation until they go.
        self._host, self._device, self._copied, self._released, self._stream = [], [], [], [], None
        self._cuda.Context.pop()
        self._context.detach()
        self._context = None


class Copier:
    """The thread that owns the backend and moves batch k from host slot k % S to device slot k % S, in order.

    Parameters
    ----------
    backend : TransferBackend
        Does the device work; only this thread calls it.
    fields : dict
        Field name -> (shape, dtype) of a batch.
    slots : int
        Host slots and device slots (as many of each).
    profile : Profile
        Copy time goes to the ``copy`` stage.
    """

    def __init__(self, backend: TransferBackend, fields: Fields, slots: int, profile: Profile) -> None:
        self.backend = backend
        self.fields = fields
        self.slots = slots
        self.profile = profile
        self.host_ring: Optional[Ring] = None
        self.device_ring: Optional[Ring] = None
        self._producers_alive: Callable[[], bool] = lambda: False
        self._opened = threading.Event()
        self._go = threading.Event()
        self._producers_done = threading.Event()
        self._open_error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._reallocate: set = set()
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

    def reallocate(self, index: int) -> None:
        """Consumer: device slot ``index`` was kept past release; give it new memory before its next use."""
        with self._lock:
            self._reallocate.add(index)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def finish(self) -> None:
        """After the rings are closed and the producers joined: free everything in the thread and join it."""
        self._producers_done.set()
        self._go.set()
        if self.thread.ident is not None:
            self.thread.join()

    def _run(self) -> None:
        try:
            host = self.backend.open(self.fields, self.slots, self.slots)
            self.host_ring = Ring(host)
            self.device_ring = Ring([self.backend.device_batch(i) for i in range(self.slots)])
        except BaseException as error:
            self._open_error = error
            self._opened.set()
            return
        self._opened.set()
        try:
            self._go.wait()
            self._copy_all()
        finally:
            self.host_ring.close()  # stops the producers if the copier stopped first (an error)
            self._producers_done.wait()
            self.host_ring.slots = []
            self.backend.close()

    def _copy_all(self) -> None:
        number = 0
        while not self._producers_done.is_set():
            try:
                host, plan = self.host_ring.take(number, self._producers_alive)
            except RingClosed:
                return
            except BaseException as error:  # a producer's error travels on to the consumer
                self.device_ring.fail(number, error)
                return
            try:
                self.device_ring.wait_free(number)
                index = number % self.slots
                with self._lock:
                    renew = index in self._reallocate
                    self._reallocate.discard(index)
                if renew:
                    self.backend.reallocate(index)
                    self.device_ring.slots[index] = self.backend.device_batch(index)
                with self.profile.timer("copy"):
                    self.backend.guard(index)
                    self.backend.copy(host, index)
                    self.backend.wait(index)
                del host
                self.host_ring.release(number)
                self.device_ring.publish(number, plan)
            except RingClosed:
                return
            except BaseException as error:
                self.device_ring.fail(number, error)
                return
            number += 1
