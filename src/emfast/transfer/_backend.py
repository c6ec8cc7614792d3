"""Where batches live when the consumer gets them: host memory, or a CUDA device through pycuda.

``device="cpu"``: the producers' slots are the batches. ``device="cuda[:N]"``: producers fill page-locked host
slots; one copier thread, which creates and uses every CUDA object, copies each filled slot into a device slot
from a slot pool on a non-blocking stream and hands the device batch to the consumer once the
copy has completed (so a batch's ``__cuda_array_interface__`` can say ``stream: None`` truthfully).

A device slot returns to the pool when the last array or tensor viewing it dies, on whatever thread that is; an
event is recorded there on the current stream (PyTorch's, else CuPy's, else the legacy default stream), and
before the slot is overwritten the copy stream waits for that event, so the work queued until then that reads
the batch finishes first. Device memory is freed by the copier thread at close, or, for slots still held then, by the
thread that drops the last reference, with the primary context pushed: never out of its context.

A :class:`TransferBackend` does the device work: ``_pycuda.PycudaBackend`` is the real one, ``_fake.FakeDevice``
a host-memory device that enforces these rules, so that the copier (:mod:`emfast.pipeline._copier`) is tested
without a GPU.
"""
from __future__ import annotations

from typing import Any, ContextManager, Dict, List, Optional, Tuple

import numpy as np

Fields = Dict[str, Tuple[tuple, np.dtype]]

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
    """Device memory and copies. A backend selectable by ``device=`` registers with ``@register("backend")``
    (:mod:`emfast._registry`) under its :attr:`kind`, and is built as ``Backend(ordinal)``.

    The copier thread (for a prediction, its device thread) calls every method except :meth:`given_back` (called
    where a device slot is given back) and :meth:`free` inside :meth:`activate` (called by a thread that gives a
    slot back after :meth:`close`).
    """

    name = "device"
    #: The ``device=`` kind a registered backend answers to (``"cuda"`` for ``"cuda"`` and ``"cuda:N"``).
    kind = ""
    #: Whether ``device="auto"`` tries it (in registration order) before falling back to the CPU.
    auto = False

    @classmethod
    def unavailable(cls, ordinal: int) -> Optional[str]:
        """Why device ``ordinal`` of this kind cannot be used, or None if it can (checked before construction)."""
        return None

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

    def order(self, memory: Any) -> None:
        """Order the work the calling thread queues next on its current stream after the copy into ``memory``,
        without waiting here if the device can (by default it waits: :meth:`wait`)."""
        self.wait(memory)

    def pinned(self, shape: tuple, dtype) -> np.ndarray:
        """Page-locked host memory that :meth:`copy_back` copies results into (prediction's outputs); freed at
        :meth:`close`."""
        raise NotImplementedError

    def copy_back(self, source: Any, host: np.ndarray) -> Any:
        """Start copying ``source``, a C-contiguous device array (``__cuda_array_interface__``) of ``host``'s shape
        and dtype, into ``host`` (a host slot or :meth:`pinned` memory), after the work queued on the calling
        thread's current stream (the work that computed ``source``). Returns the copy's token for
        :meth:`wait_back`."""
        raise NotImplementedError

    def wait_back(self, copy: Any) -> None:
        """Block until the copy back whose token is ``copy`` has completed (each token is waited for once)."""
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
