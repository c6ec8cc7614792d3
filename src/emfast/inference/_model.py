"""The network as emfast calls it: a batch of float32 inputs (B, C, z, y, x) as a NumPy array, or as a torch
tensor on a device, and a checked NumPy prediction back."""
from __future__ import annotations

import hashlib
import re
import sys
import time
from typing import Callable, List, Optional

import numpy as np

#: Prediction dtypes a model may return; they are blended in float64.
PREDICTION_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def widened(tensor):
    """A torch tensor NumPy can hold: bfloat16 (a network run in mixed precision) as float32, which holds every
    bfloat16 value exactly; any other dtype as it is (those NumPy has no dtype for are named by the check)."""
    import torch

    return tensor.float() if tensor.dtype == torch.bfloat16 else tensor


class ModelOutputError(ValueError):
    """The model returned something of the wrong type, shape or dtype."""


#: The classes torch gives every scripted or traced network and function.
TORCHSCRIPT_TYPES = ("RecursiveScriptModule", "TopLevelTracedModule", "ScriptFunction")


def model_name(model) -> str:
    """``module:qualname`` of the model (its class for callable objects), recorded with its output; a TorchScript
    module, whose class is torch's own for every network, by the class it was made from (``torch.jit:UNet``)."""
    if type(model).__module__.startswith("torch"):  # a scripted module keeps its class's name, a function its own
        original = getattr(model, "original_name", None) or getattr(model, "name", None)
        if isinstance(original, str) and type(model).__name__ in TORCHSCRIPT_TYPES:
            return f"torch.jit:{original}"
    target = model if hasattr(model, "__qualname__") else type(model)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


#: Kinds of torch modules that act otherwise in training mode: Dropout drops, BatchNorm normalises by the batch's
#: statistics and updates its running ones (the user's model changes as it predicts).
TRAINING_MODE_KINDS = re.compile(r"BatchNorm|Dropout")


def modules_in_training(model) -> List[str]:
    """The submodules of a torch module (scripted too) in training mode whose output depends on it, as
    "name (Kind)"; empty for any other model."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(model, torch.nn.Module):
        return []
    found = []
    for name, module in model.named_modules():
        kind = getattr(module, "original_name", None) or type(module).__name__  # a scripted module's class
        if module.training and isinstance(kind, str) and TRAINING_MODE_KINDS.search(kind) \
                and getattr(module, "p", None) != 0:  # a Dropout that drops nothing acts alike in both modes
            found.append(f"{name or 'the model'} ({kind})")
    return found


def weights_digest(model) -> Optional[str]:
    """SHA-256 of a torch module's state (each parameter's and buffer's name, dtype, shape and bytes), recorded with
    its output and compared when resuming: a retrained or another checkpoint keeps the class's name, and an output
    must not mix two networks' predictions. None for any other model, whose weights emfast cannot see, and for a
    state it cannot read as bytes (quantized, sparse)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(model, torch.nn.Module):
        return None
    # the network inside torch's wrappers, whose state names carry a prefix ("module.", "_orig_mod."): a resume
    # through DataParallel or torch.compile is the same network
    parallel = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while isinstance(model, parallel) or type(model).__name__ == "OptimizedModule":  # torch.compile's wrapper
        model = model.module if isinstance(model, parallel) else model._orig_mod
    digest = hashlib.sha256()
    try:
        for name, tensor in model.state_dict().items():
            if not isinstance(tensor, torch.Tensor):  # a module's extra state: whatever it is, not weights
                continue
            data = tensor.detach().to("cpu").contiguous()
            digest.update(f"{name} {data.dtype} {tuple(data.shape)}\n".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy())
    except (RuntimeError, TypeError):
        return None
    return digest.hexdigest()


def check_torch_device(device: str, here: bool = True) -> str:
    """A description of the torch device named ``device``; ValueError naming it if it is no torch device or (with
    ``here``: it is used in this process, not on Dask workers) is a GPU this machine lacks; ImportError without
    PyTorch."""
    require_torch(device)
    import torch
    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"device {device!r} is not a torch device ('cpu', 'cuda', 'cuda:1'): {error}") from None
    if kind.type != "cuda" or not here:
        return f"{device} (PyTorch {torch.__version__})"
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no usable NVIDIA GPU here (PyTorch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda or 'none'}, finds none: no GPU, no driver, or CUDA_VISIBLE_DEVICES "
                         "hides them); use device 'cpu' or run where there is one")
    if kind.index is not None and kind.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1}")
    return f"{device}: {torch.cuda.get_device_name(kind.index or 0)}"


def torch_device_name(device) -> str:
    """The name of a ``torch.device`` or a GPU index as torch gives it ("cuda:0"); TypeError for anything else."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return f"cuda:{int(device)}"  # torch's reading of a bare index
    if type(device).__module__ == "torch":
        return str(device)
    raise TypeError(f"device must be a torch device ('cpu', 'cuda:0', torch.device(...)) or a transfer backend, got "
                    f"{device!r}")


def require_torch(device) -> None:
    """Raise an ImportError saying so where ``device`` (a torch device name) needs PyTorch and it is missing."""
    if not isinstance(device, str):
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError(f"device {device!r} feeds the model torch tensors, but PyTorch is not installed (pip "
                          "install torch); leave device out to feed it NumPy arrays") from None


def called(model: Callable, argument):
    """``model(argument)``; an exception it raises is marked as the model's (:func:`model_blamed`) and raised as
    it is. Only the call itself: what emfast does around it (device copies, output checks) is emfast's."""
    try:
        return model(argument)
    except Exception as error:
        _blame(error, model)
        raise


def _blame(error: BaseException, model: Callable) -> None:
    """Mark ``error`` as raised by ``model``, with a note its traceback shows. An exception that takes no
    attribute or note (frozen, or notes that are not a list) stays unmarked rather than replaced."""
    if model_blamed(error) is not None:
        return
    _mark(error, model_name(model))


def _mark(error: BaseException, name: str) -> None:
    """:func:`_blame`'s mark and note, for the model called ``name``."""
    try:
        setattr(error, _BLAMED, name)
        error.add_note(f"(raised by the model {name}, called by emfast.predict)")
    except Exception:
        pass


def model_blamed(error: BaseException) -> Optional[str]:
    """The name of the model that raised ``error`` in a prediction, or None if the error is not known to be the
    model's. The mark travels to Dask's client with exceptions that pickle their attributes (most do)."""
    return getattr(error, _BLAMED, None)


#: The attribute that :func:`called` sets on an exception its model raised.
_BLAMED = "emfast_model"


def _chained(error: BaseException) -> list:
    """The causes and contexts of ``error``, and theirs."""
    found, pending = [], [error.__cause__, error.__context__]
    while pending:
        linked = pending.pop()
        if linked is not None and all(linked is not known for known in found) and linked is not error:
            found.append(linked)
            pending += [linked.__cause__, linked.__context__]
    return found


class ModelError(RuntimeError):
    """What a Dask worker sends back for an exception of the model's that cannot travel as itself (an attribute
    that does not pickle, say): its type and message in words, marked as the model's, with its notes."""


def sendable(error: BaseException, model: str) -> BaseException:
    """What a Dask task of ``model`` (its name) raises for ``error``: ``error`` itself, or a :class:`ModelError`
    in its place where it is the model's and would not reach Dask's client as itself, its mark included (Dask
    sent such an exception as a bare ``Exception`` of its repr, and the command called the model's error a bug in
    emfast). A KeyboardInterrupt or SystemExit on a task's thread is the model's own (a worker's signals reach its
    main thread): Dask ends a task on an Exception only, and an in-process worker waited for it forever, a worker
    process died (the client's error, "FutureCancelledError", named nothing). A StopIteration ends no task either
    (the client got "RuntimeError: coroutine raised StopIteration")."""
    if not isinstance(error, Exception) or isinstance(error, StopIteration):
        return _stand_in(error, model, "a Dask task cannot end with it")
    name = model_blamed(error)
    if name is None:
        return error
    import tblib.pickling_support
    from distributed.protocol import pickle as dask_pickle

    # as Dask sends it: its class and those of its causes and contexts registered with tblib, so that the chain
    # goes along (a context that does not pickle fails it) and classes that need several arguments rebuild
    tblib.pickling_support.install(error, *_chained(error))
    try:
        if model_blamed(dask_pickle.loads(dask_pickle.dumps(error))) == name:
            return error
        why = "its mark of the model's was lost"
    except Exception as failure:  # noqa: BLE001 - whatever pickling raises is the reason
        why = f"{type(failure).__name__}: {failure}"
    return _stand_in(error, name, why)


def _stand_in(error: BaseException, model: str, why: str) -> ModelError:
    """A :class:`ModelError` saying ``error``'s type and message, and ``why`` it is sent in words, marked as
    ``model``'s, with ``error``'s notes."""
    words = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    stand_in = ModelError(f"{words} (sent from the Dask worker in words: {why})")
    for note in getattr(error, "__notes__", ()):
        if isinstance(note, str):
            stand_in.add_note(note)
    if model_blamed(error) is None:  # a KeyboardInterrupt or SystemExit, which called() lets pass unmarked
        _mark(stand_in, model)
    else:
        setattr(stand_in, _BLAMED, model)
    return stand_in


def root_array(array: np.ndarray) -> np.ndarray:
    """The array ``array`` was cut from: its bases followed to one that owns its memory, or that views memory no
    array owns (a slab's memoryview, so that each array cut from a slab stays its own root)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class ModelCaller:
    """Calls ``model`` on NumPy batches (``device=None``) or on torch tensors on ``device``, and checks that the
    prediction has shape (B, channels, *patch_out) (``channels`` None: any) and a float dtype.

    With a :class:`~emfast.inference._device.DeviceRunner` (``runner``), batches go to the device through its
    transfer backend (page-locked slots, asynchronous copies both ways) instead.

    Every call holds ``batch_size`` tiles: a shorter batch (the run's last, the probe's) is filled with zero tiles,
    whose predictions are dropped. A framework may compute a tile's last bits differently for another batch length
    (torch's CPU convolutions do), and which tiles end up in a short batch depends on the blocks and on a resume.

    Picklable when the model is, so Dask workers get their own (never with a runner: its thread stays here).
    """

    def __init__(self, model: Callable, device: Optional[str] = None, batch_size: int = 1) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable (a function or a torch module), got {type(model).__name__}")
        require_torch(device)  # here, not at the first call on a thread of its own
        self.model = model
        self.device = device
        self.runner = None  # set by predict for a device with a transfer backend
        self.name = model_name(model)
        self.batch_size = batch_size
        #: Zero tiles added to short batches (the model computed them too).
        self.tiles_padded = 0
        #: Seconds spent in calls of the model here (device copies included); calls come one at a time.
        self.seconds = 0.0
        #: The first error of a call (the model's, or its prediction's check; a KeyboardInterrupt the model raised
        #: too): later calls raise it unrun.
        self.failure: Optional[BaseException] = None

    def __getstate__(self) -> dict:
        return dict(self.__dict__, runner=None)

    def __call__(self, batch: np.ndarray, out_shape: tuple, channels: Optional[int]) -> np.ndarray:
        return self.launch(batch, out_shape, channels)()

    def launch(self, batch: np.ndarray, out_shape: tuple, channels: Optional[int]) -> Callable[[], np.ndarray]:
        """Start the call on ``batch``; the function returned waits for the prediction and checks it. With a
        runner the device computes meanwhile
        (:meth:`~emfast.inference._device.DeviceRunner.launch`); otherwise the model is called here."""
        # The batches queued behind a failed one are not run: on a device, what follows an error fails too, and
        # the first error is the one that names the cause.
        if self.failure is not None:
            raise self.failure
        count = batch.shape[0]
        if count < self.batch_size:
            batch = self._filled(batch)
        start = time.perf_counter()
        try:
            if self.runner is not None:
                wait = self.runner.launch(self.model, batch)
            else:
                prediction = called(self.model, batch) if self.device is None else self._torch(batch)
                wait = lambda: prediction  # noqa: E731
        except BaseException as error:
            self.failure = error
            self._hint_device(error)
            raise
        finally:
            self.seconds += time.perf_counter() - start

        def checked() -> np.ndarray:
            start = time.perf_counter()
            try:
                try:
                    prediction = wait()
                finally:
                    self.seconds += time.perf_counter() - start
                prediction = self._checked(prediction, batch.shape[0], out_shape, channels)
                if self.runner is None and not np.may_share_memory(prediction, batch):
                    # Blended only after the next calls: a model returning the same buffer every call (an out=
                    # array, a compiled graph's static output) would have overwritten it. A view of the batch is
                    # emfast's own until blended.
                    prediction = np.array(prediction, copy=True, order="K")
                return prediction[:count]
            except BaseException as error:
                self.failure = self.failure or error
                raise

        return checked

    def _filled(self, batch: np.ndarray) -> np.ndarray:
        """``batch`` followed by zero tiles up to ``batch_size``: in place where the array ``batch`` was cut from
        holds a whole batch (a pooled batch, a device's page-locked slot, which is then not staged)."""
        count = batch.shape[0]
        shape = (self.batch_size,) + batch.shape[1:]
        size = int(np.prod(shape))
        root = root_array(batch)
        if root.ndim == 1 and root.dtype == batch.dtype and root.size >= size and batch.flags.c_contiguous \
                and batch.ctypes.data == root.ctypes.data:
            filled = root[:size].reshape(shape)
        else:
            filled = np.empty(shape, batch.dtype)
            filled[:count] = batch
        filled[count:] = 0
        self.tiles_padded += self.batch_size - count
        return filled

    def _hint_device(self, error: BaseException) -> None:
        """A torch module fed NumPy batches (no ``device``) that fails on one (torch's TypeError names neither the
        model nor the setting): a note on ``error``, which stays the model's, saying to pass a device."""
        torch = sys.modules.get("torch")  # a torch module exists only where torch was imported
        if self.device is not None or torch is None or not isinstance(self.model, torch.nn.Module) \
                or not isinstance(error, TypeError) or "ndarray" not in str(error):
            return
        try:
            error.add_note(f"model {self.name} is a torch module fed NumPy batches: give predict a device, 'cpu' "
                           "or 'cuda' (device= in Python, device: in a config), to feed it torch tensors")
        except Exception:  # noqa: BLE001 - an exception that takes no note keeps its own message
            pass

    def _torch(self, batch: np.ndarray):
        import torch

        with torch.inference_mode():
            source = torch.from_numpy(batch)
            if torch.device(self.device).type == "cuda":
                source = source.pin_memory()
            result = called(self.model, source.to(self.device, non_blocking=True))
            if not isinstance(result, torch.Tensor):
                return result
            result = widened(result).detach().cpu()
            try:
                return result.numpy()
            except (TypeError, RuntimeError) as error:  # no NumPy dtype (float8), a sparse layout, a conj bit...
                raise ModelOutputError(f"model {self.name} returned a {result.dtype} tensor NumPy cannot take "
                                       f"({error}); expected a dense tensor of one of "
                                       f"{', '.join(str(d) for d in PREDICTION_DTYPES)} (or torch.bfloat16, "
                                       "widened exactly)") from None

    def _checked(self, prediction, count: int, out_shape: tuple, channels: Optional[int]) -> np.ndarray:
        if not isinstance(prediction, np.ndarray):
            raise ModelOutputError(f"model {self.name} returned a {type(prediction).__name__}; expected a NumPy "
                                   f"array{' (or a torch tensor)' if self.device else ''} of shape "
                                   f"({count}, C, {', '.join(map(str, out_shape))})")
        shape_ok = (prediction.ndim == 5 and prediction.shape[0] == count and prediction.shape[2:] == out_shape
                    and (channels is None or prediction.shape[1] == channels))
        if not shape_ok:
            wanted = f"({count}, {'C' if channels is None else channels}, {', '.join(map(str, out_shape))})"
            raise ModelOutputError(f"model {self.name} returned shape {prediction.shape} for an input of "
                                   f"{count} tiles; expected {wanted}: the batch, the channels and patch_out")
        if prediction.dtype not in PREDICTION_DTYPES:
            swapped = prediction.dtype.newbyteorder("=") in PREDICTION_DTYPES  # ">f4" is float32, not this byte order
            raise ModelOutputError(f"model {self.name} returned dtype {prediction.dtype}"
                                   f"{' (the other byte order)' if swapped else ''}; expected one of "
                                   f"{', '.join(str(d) for d in PREDICTION_DTYPES)}"
                                   f"{' in the byte order of this machine' if swapped else ''}")
        return prediction
