"""The network on a device: batches of tiles go to it through a transfer backend (:mod:`emfast.transfer`), from
page-locked host slots with asynchronous copies, and predictions come back the same way.

Every backend call happens on one thread, the device thread (a backend's device work belongs to the thread that
opened it). The local engine calls the model there (:meth:`DeviceRunner.calls`), while reading, gathering,
blending and writing go on in other threads: a batch is handed over once, from the feeding thread, and its
prediction once, to the blender. A call is launched (the batch copied to one of two device slots, the network's
work queued, the copy of its prediction back started) before the previous call's copy back is waited for, so
that the device goes from one batch to the next without waiting for the host.

Tiles are gathered straight into the page-locked slots (:meth:`DeviceRunner.host_slots` lends them to the
predictor's pool). A batch's prediction comes back into page-locked memory paired with its slot, so it stays valid
as long as the batch does: the pool reuses a batch only once its predictions are blended. A batch in ordinary
memory (the probe, or one gathered while every slot was in use) is staged through a slot kept for that, and its
prediction copied out of the staging memory (two staging outputs: two calls may be under way).
"""
from __future__ import annotations

import functools
import threading
import time
import traceback
from collections import deque
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, List, Optional

import numpy as np

from .._threads import shutdown_pool
from ..transfer import DeviceArray, TransferBackend, cuda_ordinal, cuda_unavailable, resolve_device
from ._block import BATCHES_AHEAD
from ._graphs import CapturedNetwork
from ._model import ModelOutputError, called, root_array, widened

#: The stages of a call on the device: starting the copy of the batch there (waiting for it only where the device
#: cannot order the network after it), calling the network (which, on an asynchronous device, only launches its
#: work), and waiting for the device to finish and copy the prediction back.
DEVICE_STAGES = ("to device", "network", "from device")

#: Page-locked batch slots lent to the predictor: the batches a block being fed and the block being finished hold
#: at most (one more is kept for staging).
HOST_SLOTS = 2 * (BATCHES_AHEAD + 1)

#: Device slots: a batch is copied into one while the network computes on the other; at most this many calls are
#: under way.
DEVICE_SLOTS = 2


class DeviceRunner:
    """Runs a model on ``backend``'s device, on a thread of its own.

    Parameters
    ----------
    backend : TransferBackend
        The device; opened on first use, closed by :meth:`close`.
    batch_elements : int
        float32 elements of the largest batch (``batch_size * channels * prod(patch_in)``).
    torch_device : str, optional
        Give the model torch tensors on this device (zero-copy views of the device slot), in inference mode; None:
        the device arrays as the backend exports them.
    cuda_graphs : bool
        With ``torch_device``: replay the network's calls from CUDA graphs captured once per device slot
        (:mod:`._graphs`).
    """

    def __init__(self, backend: TransferBackend, batch_elements: int, torch_device: Optional[str] = None,
                 cuda_graphs: bool = False) -> None:
        self.backend = backend
        self.torch_device = torch_device
        self._elements = int(batch_elements)
        self.graphs = CapturedNetwork() if cuda_graphs and torch_device is not None else None
        self._device_thread: Optional[int] = None  # its identity, from its start
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="emfast-predict-device",
                                          initializer=self._mark_device_thread)
        self._slots: List[np.ndarray] = []  # flat float32 page-locked slots; the last one stages
        # flat page-locked memory of a slot's prediction, by slot index (-1 and -2: the staged calls')
        self._outputs: Dict[int, np.ndarray] = {}
        self._memories: list = []  # the device slots
        self._launches = 0
        self._opened = False
        #: Seconds per stage of the calls (see :attr:`~emfast.inference.Prediction.profile`).
        self.stages: Dict[str, float] = dict.fromkeys(DEVICE_STAGES, 0.0)

    @property
    def name(self) -> str:
        return self.backend.name

    def host_bytes(self, output_elements: int) -> int:
        """The page-locked host memory this runner holds at most: its batch slots, and one prediction of
        ``output_elements`` per lent slot and per staged call under way (counted at 8 bytes an element, the widest
        a model returns)."""
        return (HOST_SLOTS + 1) * 4 * self._elements + (HOST_SLOTS + DEVICE_SLOTS) * 8 * int(output_elements)

    def host_slots(self) -> List[np.ndarray]:
        """The page-locked batch slots to gather into (flat float32); opens the device."""
        self._on_device(self._open)
        return self._slots[:-1]

    def __call__(self, model, batch: np.ndarray) -> np.ndarray:
        """``model``'s prediction of ``batch`` (float32, (B, C, z, y, x)) as a NumPy array."""
        return self.launch(model, batch)()

    def launch(self, model, batch: np.ndarray) -> Callable[[], np.ndarray]:
        """Copy ``batch`` to a device slot, call ``model`` on it (on an asynchronous device that only queues its
        work) and start copying the prediction back; the function returned waits for the prediction. Wait for
        every call but the last before launching another (at most :data:`DEVICE_SLOTS` are under way)."""
        return functools.partial(self._on_device, self._finish, self._on_device(self._launch, model, batch))

    def calls(self) -> "DeviceCalls":
        """An executor running calls on the device thread (the model's calls, so that a batch is handed over once,
        not from a model thread to this one and back)."""
        return DeviceCalls(self._thread)

    def close(self, quiet: bool = False) -> None:
        """Free the device memory and end the device thread (idempotent); ``quiet``: after another error, which a
        failure to free (the model kept a view of its input) must not hide."""
        try:
            if self._opened:
                self._on_device(self._close)
        except Exception:
            if not quiet:
                raise
        finally:
            shutdown_pool(self._thread)

    def _on_device(self, function, *arguments):
        if threading.get_ident() == self._device_thread:  # called by a call of calls()
            return function(*arguments)
        return self._thread.submit(function, *arguments).result()

    def _mark_device_thread(self) -> None:
        self._device_thread = threading.get_ident()

    def _open(self) -> None:
        if self._opened:
            return
        fields = {"batch": ((self._elements,), np.dtype(np.float32))}
        slots = self.backend.open(fields, HOST_SLOTS + 1)
        self._opened = True
        self._slots = [slot["batch"] for slot in slots]
        while len(self._memories) < DEVICE_SLOTS:
            self._memories.append(self.backend.allocate())

    def _close(self) -> None:
        self._opened = False
        self._slots, self._outputs = [], {}
        if self.graphs is not None:
            self.graphs.clear()  # their pools go back to torch before the slots they read are freed
        errors = []
        for memory in self._memories:
            try:
                self.backend.free(memory)
            except BaseException as error:  # still viewed: left to the backend's own rules
                errors.append(error)
        self._memories = []
        self.backend.close(len(errors))
        if errors:
            raise errors[0]

    def _slot_of(self, batch: np.ndarray) -> Optional[int]:
        root = root_array(batch)
        return next((i for i, slot in enumerate(self._slots[:-1]) if root is slot), None)

    def _launch(self, model, batch: np.ndarray) -> "_Launched":
        self._open()
        backend, memory = self.backend, self._memories[self._launches % DEVICE_SLOTS]
        index = self._slot_of(batch)
        staged = index is None
        if staged:
            index = len(self._slots) - 1
            np.copyto(self._slots[index][:batch.size].reshape(batch.shape), batch)
        output = -1 - self._launches % DEVICE_SLOTS if staged else index
        self._launches += 1
        source = result = None
        stages, start = self.stages, time.perf_counter()
        try:
            backend.guard(memory)
            backend.copy({"batch": self._slots[index]}, memory)
            if staged:  # the next staged call overwrites the staging slot
                backend.wait(memory)
            else:  # the network's work waits for the copy on the device, not here
                backend.order(memory)
            exported = backend.export(memory, memory)["batch"]
            source = _view(exported, batch.shape)
            copied = time.perf_counter()
            stages["to device"] += copied - start
            result = self._run(model, source, exported)
            source = exported = None
            called = time.perf_counter()
            stages["network"] += called - copied
            host = self._output(output, result)
            launched = _Launched(host, backend.copy_back(result, host), result, staged)
            stages["from device"] += time.perf_counter() - called
        except BaseException as error:
            source = exported = result = None
            traceback.clear_frames(error.__traceback__)  # no view of the device slot outlives the call
            raise
        backend.given_back(memory)
        return launched

    def _finish(self, launched: "_Launched") -> np.ndarray:
        start = time.perf_counter()
        try:
            self.backend.wait_back(launched.copy)
        finally:
            launched.result = None  # the prediction on the device, kept until copied
            self.stages["from device"] += time.perf_counter() - start
        return launched.host.copy() if launched.staged else launched.host

    def _run(self, model, source, slot):
        """The model's output for the device batch ``source`` (at the start of the flat device array ``slot``):
        C-contiguous, on the device, in memory of its own. The copy back runs on a stream of its own while the
        next call computes: a model that returns the same buffer every call (an output binding of its own, an
        ``out=`` array) would overwrite it meanwhile, so the model's output is copied on the device first (a
        fraction of the network's time), in stream order before the next call's work."""
        if self.torch_device is None:
            result = called(model, source)
            return np.array(result, order="C") if isinstance(result, np.ndarray) else result
        import torch

        with torch.inference_mode():
            replayed = self.graphs is not None and self.graphs.refused is None
            if self.graphs is None:
                result = called(model, torch.as_tensor(source, device=self.torch_device))
            else:
                tile = int(np.prod(source.shape[1:]))
                whole = _view(slot, (self._elements // tile,) + tuple(source.shape[1:]))
                result = self.graphs(torch, model, torch.as_tensor(whole, device=self.torch_device),
                                     source.shape[0])
                replayed = replayed and self.graphs.refused is None
            if isinstance(result, torch.Tensor):
                result = widened(result).detach()
                # a graph's output is its slot's own: the next call replays the other slot's graph
                result = result.contiguous() if replayed else result.clone(memory_format=torch.contiguous_format)
        return result

    def _output(self, index: int, result) -> np.ndarray:
        """Page-locked memory of the slot's prediction (negative ``index``: a staged call's), shaped as
        ``result``."""
        try:
            shape, dtype = tuple(int(n) for n in result.shape), _numpy_dtype(result.dtype)
        except (AttributeError, TypeError) as error:
            raise ModelOutputError(f"model returned a {type(result).__name__} ({error}); expected an array on "
                                   f"{self.name} of shape (B, C, z, y, x)") from None
        size = int(np.prod(shape))
        flat = self._outputs.get(index)
        if flat is None or flat.dtype != dtype or flat.size < size:
            flat = self._outputs[index] = self.backend.pinned((size,), dtype)
        return flat[:size].reshape(shape)


class _Launched:
    """A call whose prediction is being copied back into ``host`` (``copy``: the backend's token for it)."""

    __slots__ = ("host", "copy", "result", "staged")

    def __init__(self, host: np.ndarray, copy, result, staged: bool) -> None:
        self.host, self.copy, self.result, self.staged = host, copy, result, staged


class DeviceCalls:
    """Submits calls to the device thread for one prediction, as a thread pool's ``submit`` would, but each call is
    launched before the previous call's prediction is waited for when the next batch is already queued.

    ``submit(caller, *arguments)`` runs ``caller.launch(*arguments)``, which returns the function that waits for
    the prediction; the future returned resolves to what that function returns. :meth:`shutdown` cancels the calls
    not launched and waits for the others; the thread stays the runner's.
    """

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self._executor = executor
        self._calls: "deque[tuple]" = deque()  # (the launch's task, the call's future)
        self._waiting: Optional[tuple] = None  # (future, wait) of the call launched last; on the device thread

    def submit(self, caller, *arguments) -> Future:
        while self._calls and self._calls[0][1].done():
            self._calls.popleft()
        future: Future = Future()
        self._calls.append((self._executor.submit(self._launch, future, caller, arguments), future))
        return future

    def _launch(self, future: Future, caller, arguments: tuple) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            wait = caller.launch(*arguments)
        except BaseException as error:
            self._wait_for_last()
            future.set_exception(error)
            return
        self._wait_for_last()  # its copy back overlapped this launch
        self._waiting = (future, wait)
        # Queued behind the launches submitted meanwhile: when the next batch is ready, it is launched first.
        self._executor.submit(self._wait_for, future)

    def _wait_for(self, future: Future) -> None:
        if self._waiting is not None and self._waiting[0] is future:
            self._wait_for_last()

    def _wait_for_last(self) -> None:
        if self._waiting is None:
            return
        (future, wait), self._waiting = self._waiting, None
        try:
            future.set_result(wait())
        except BaseException as error:
            future.set_exception(error)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for task, future in self._calls:
                if task.cancel():
                    future.cancel()
                    future.set_running_or_notify_cancel()  # what its task would have done: now it counts as done
        if wait:
            futures.wait([future for _, future in self._calls])
        self._calls.clear()


def _view(exported, shape: tuple):
    """The first ``prod(shape)`` elements of a flat exported device array, shaped ``shape``."""
    if isinstance(exported, DeviceArray):
        return DeviceArray(exported.ptr, shape, exported.dtype, exported.device, exported)
    return exported[:int(np.prod(shape))].reshape(shape)


def _numpy_dtype(dtype) -> np.dtype:
    """NumPy's dtype for a NumPy, CuPy or torch dtype (torch.float32 -> float32)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return np.dtype(str(dtype).replace("torch.", ""))


def device_runner(device, batch_elements: int, cuda_graphs: bool = False) -> Optional[DeviceRunner]:
    """The runner for :func:`~emfast.predict`'s ``device``: a :class:`TransferBackend` given as the device (the
    model gets the device arrays it exports), or for ``"cuda[:N]"`` pycuda's backend when pycuda can use the
    device (the model gets torch tensors, from CUDA graphs' replays with ``cuda_graphs``); None otherwise (no
    device, ``"cpu"``, or CUDA without pycuda, where torch moves the batches itself)."""
    if isinstance(device, TransferBackend):
        return DeviceRunner(device, batch_elements)
    ordinal = cuda_ordinal(device)
    if ordinal is None or cuda_unavailable(ordinal) is not None:
        return None
    return DeviceRunner(resolve_device(f"cuda:{ordinal}"), batch_elements, torch_device=f"cuda:{ordinal}",
                        cuda_graphs=cuda_graphs)
