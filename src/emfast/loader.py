"""The loader: producer threads fill a ring of pre-allocated batch slots; the consumer iterates over batches.

Producers compute each batch's plan (pure function of seed, epoch and batch index), read windows and call the
GIL-releasing kernels, so ``threads=N`` uses N cores. The consumer gets batches in order. A yielded batch is
valid until the next one is requested, :meth:`Batch.release` is called, or the loader closes; see
:class:`Batch` for what happens to arrays kept longer.
"""
from __future__ import annotations

import numbers
import sys
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from . import augment as _augment
from .gather import DEFAULT_NORMALIZATION, Field, Gatherer
from .plan import BatchPlan, Planner, window_extents
from .profile import Profile, ProfileReport
from .ring import Ring, RingClosed
from .transfer import Copier, resolve_device
from .rng import check_seed
from .sampling import Sampler, Uniform
from .volumes import LABEL_DTYPES, RAW_DTYPES, Volume, as_volume

OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


class BatchReleasedError(RuntimeError):
    """A batch was used after it was released (its slot may already hold a newer batch)."""


class Batch(Mapping):
    """One batch: a mapping of field name to array of shape (B, C, Z, Y, X), plus where it came from.

    The arrays live in the loader's ring and are valid until the next batch is requested, :meth:`release` is
    called, or the loader closes; afterwards indexing the batch raises :class:`BatchReleasedError`. Arrays you
    obtained from it and still hold at release are never overwritten: the loader detects them and gives that
    slot fresh memory (with a one-time warning, as it costs an allocation). Use :meth:`copy` to keep data.

    Attributes
    ----------
    epoch, index : int
        Epoch number and batch index within the epoch.
    number : int
        Position in the whole stream, counting across epochs.
    positions : ndarray, (B, 3) int64
        Low corner (z, y, x) of each example's source window in raw voxel coordinates.
    extents : ndarray, (B, 3) int64
        Source window size along z, y, x (the patch, permuted for transposed examples).
    perms, flips : ndarray, (B, 3)
        Each example's transform: output = ``transpose(flip(window, flips[n]), perms[n])``.
    """

    def __init__(self, owner: "Loader", number: int, arrays: Dict[str, np.ndarray], plan: BatchPlan) -> None:
        self._owner = owner
        self._arrays: Optional[Dict[str, np.ndarray]] = dict(arrays)
        self.number = number
        self.epoch = plan.epoch
        self.index = plan.index
        self.positions = plan.corners
        self.extents = plan.extents
        self.perms = plan.params.perms
        self.flips = plan.params.flips

    @property
    def released(self) -> bool:
        return self._arrays is None

    def _live(self) -> Dict[str, np.ndarray]:
        if self._arrays is None:
            raise BatchReleasedError(f"batch {self.number} (epoch {self.epoch}, index {self.index}) was released; "
                                     "copy what you need to keep with batch.copy() before requesting the next")
        return self._arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self._live()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def copy(self) -> Dict[str, np.ndarray]:
        """Return host copies of all arrays (CPU loaders only; they stay valid forever)."""
        arrays = self._live()
        if not all(isinstance(array, np.ndarray) for array in arrays.values()):
            raise TypeError("batch.copy() copies host arrays; for a device batch use batch.torch() or "
                            "batch.cupy() and clone the tensors you keep")
        return {name: array.copy() for name, array in arrays.items()}

    def torch(self) -> Dict[str, "torch.Tensor"]:
        """The arrays as PyTorch tensors without copying: CPU tensors, or CUDA tensors for a device loader.

        They share the batch's memory, so the validity rules of the batch apply (clone what you keep).
        """
        try:
            import torch
        except ImportError as error:
            raise ImportError("batch.torch() needs PyTorch (pip install torch)") from error
        return {name: torch.from_numpy(array) if isinstance(array, np.ndarray)
                else torch.as_tensor(array, device=array.device) for name, array in self._live().items()}

    def cupy(self) -> Dict[str, "cupy.ndarray"]:
        """The arrays as CuPy arrays: zero-copy for a device loader; copied to the GPU for a CPU loader."""
        try:
            import cupy
        except ImportError as error:
            raise ImportError("batch.cupy() needs CuPy (pip install cupy-cuda12x or similar)") from error
        return {name: cupy.asarray(array) for name, array in self._live().items()}

    def release(self) -> None:
        """Hand the slot back to the producers now (idempotent)."""
        self._owner._release(self)

    def _detach(self) -> None:
        self._arrays = None

    def __repr__(self) -> str:
        if self._arrays is None:
            return f"<Batch {self.number} (released)>"
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self._arrays.items())
        return f"<Batch {self.number} epoch={self.epoch} index={self.index} {fields}>"


def _positive_int(value, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _integer_triple(value, what: str) -> tuple:
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    if len(items) != 3 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items):
        raise ValueError(f"{what} must be 3 integers (z, y, x), got {value!r}")
    if max(abs(int(v)) for v in items) >= 1 << 62:
        raise ValueError(f"{what} is out of range: {value!r}")
    return tuple(int(v) for v in items)


def _positive_triple(value, what: str) -> tuple:
    items = _integer_triple(value, what)
    if min(items) < 1:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return items


def _pair(value) -> tuple:
    """(scale, shift) as two finite floats."""
    try:
        pair = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or not all(np.isfinite(pair)):
        raise ValueError(f"normalize must be (scale, shift), two finite numbers, got {value!r}")
    return pair


def _label_origin(raw: Volume, labels: Volume, label_offset) -> np.ndarray:
    """Position of the labels' voxel (0, 0, 0) in raw voxel coordinates."""
    if raw.resolution is not None and labels.resolution is not None and not np.allclose(raw.resolution,
                                                                                          labels.resolution):
        raise ValueError(f"resolution mismatch: {raw.name} has {raw.resolution}, {labels.name} has "
                         f"{labels.resolution}")
    if label_offset is not None:
        return np.asarray(_integer_triple(label_offset, "label_offset"), dtype=np.int64)
    if raw.offset is not None and labels.offset is not None:
        if raw.resolution is None or labels.resolution is None:
            raise ValueError(f"{raw.name} and {labels.name} have 'offset' attributes but not both a "
                             "'resolution'; pass label_offset=(z, y, x) in voxels")
        voxels = (np.asarray(labels.offset) - np.asarray(raw.offset)) / np.asarray(raw.resolution)
        if not np.allclose(voxels, np.round(voxels)):
            raise ValueError(f"{labels.name} is offset by {tuple(voxels)} voxels from {raw.name}, "
                             "not a whole number of voxels")
        return np.round(voxels).astype(np.int64)
    if raw.shape != labels.shape:
        raise ValueError(f"{raw.name} has shape {raw.shape} but {labels.name} has {labels.shape}; pass "
                         "label_offset=(z, y, x) (labels' first voxel in raw voxels) or give both datasets "
                         "'offset' and 'resolution' attributes")
    return np.zeros(3, dtype=np.int64)


class _Producers:
    """The producer threads. Holds no reference to the Loader, so an abandoned loader can be collected."""

    def __init__(self, ring: Ring, planner: Planner, gatherer: Gatherer, profile: Profile,
                 epoch_size: Optional[int], threads: int) -> None:
        self.ring = ring
        self.planner = planner
        self.gatherer = gatherer
        self.profile = profile
        self.epoch_size = epoch_size
        self.threads = [threading.Thread(target=self._run, name=f"emfast-producer-{i}", daemon=True)
                        for i in range(threads)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def stop(self) -> None:
        self.ring.close()
        for thread in self.threads:
            if thread.ident is not None:
                thread.join()

    def position(self, number: int) -> tuple:
        return divmod(number, self.epoch_size) if self.epoch_size else (0, number)

    def _run(self) -> None:
        scratch = None
        while True:
            number = self.ring.claim()
            if number is None:
                return
            try:
                if scratch is None:
                    scratch = self.gatherer.new_scratch()
                with self.profile.timer("stall"):
                    arrays = self.ring.wait_free(number)
                with self.profile.timer("sample"):
                    plan = self.planner.plan(*self.position(number))
                self.gatherer.fill(arrays, plan, scratch, self.profile)
                del arrays  # no reference to the slot may outlive its publication (see Loader._release)
                self.ring.publish(number, plan)
            except RingClosed:
                return
            except BaseException as error:  # handed to the consumer, who re-raises it with its traceback
                self.ring.fail(number, error)
                return


def _references(arrays: Dict[str, object]) -> List[int]:
    return [sys.getrefcount(array) for array in arrays.values()]


class _Pipeline:
    """Everything with a thread: producers, and for a device the copier. Holds no reference to the Loader."""

    def __init__(self, producers: _Producers, consumer_ring: Ring, copier: Optional[Copier]) -> None:
        self.producers = producers
        self.consumer_ring = consumer_ring
        self.copier = copier

    def alive(self) -> bool:
        """Whether anything can still deliver a batch to the consumer."""
        return self.copier.alive() if self.copier is not None else self.producers.alive()

    def stop(self) -> None:
        self.consumer_ring.close()
        self.producers.stop()  # closes the host ring
        if self.copier is not None:
            self.copier.finish()


class Loader:
    """Streams batches of augmented 3-D patches from EM volumes, produced by background threads.

    Parameters
    ----------
    raw : Volume or ndarray
        The image: (z, y, x) or (c, z, y, x), uint8, uint16 or float32. Converted to ``dtype`` and normalised.
    labels : Volume or ndarray, optional
        Labels (uint32, uint64 or int64), cut with the same geometry and copied bit for bit.
    patch : (int, int, int)
        Output window (z, y, x).
    batch_size : int
        Examples per batch.
    augment : sequence of Augmentation or str
        Augmentations, e.g. ``[Mirror(), Transpose(), Intensity()]`` or ``["mirror", "transpose"]``.
    sampler : Uniform, optional
        Where windows are cut (uniform over the volume by default).
    epoch_size : int, optional
        Batches per epoch: each ``for batch in loader`` runs to the end of the current epoch. None: endless.
    threads : int
        Producer threads. The kernels release the GIL, so throughput scales with cores.
    buffers : int, optional
        Batch slots in the ring (default ``threads + 2``, at least 2). Memory = volumes + slots.
    seed : int
        Seed in [0, 2**64). Batches are a pure function of (seed, epoch, batch index): the same whatever
        ``threads`` and ``buffers``.
    dtype : str
        Raw output type, ``"float32"`` or ``"float16"``.
    normalize : (float, float), optional
        Raw ``(scale, shift)``: output = ``x * scale + shift``. Default: integers to [0, 1], float unchanged.
    isotropic : bool
        Allow transforms that swap z with y/x (only for data of equal resolution along all axes).
    label_offset : (int, int, int), optional
        Position of the labels' first voxel in raw voxels, when labels cover only part of raw. Otherwise taken
        from the datasets' ``offset``/``resolution`` attributes, or the shapes must be equal.
    device : str
        Where batches are delivered: ``"cpu"`` (NumPy arrays), ``"cuda"`` / ``"cuda:N"`` (device arrays with
        ``__cuda_array_interface__``, copied asynchronously from page-locked memory; needs pycuda), or
        ``"auto"`` (CUDA if usable, else the CPU with a notice). See :mod:`emfast.transfer`.

    Examples
    --------
    >>> with Loader(raw, labels, patch=(32, 128, 128), batch_size=8, epoch_size=100, threads=2) as loader:
    ...     for batch in loader:
    ...         train_step(batch["raw"], batch["labels"])
    """

    def __init__(self, raw, labels=None, *, patch: Sequence[int], batch_size: int = 8,
                 augment: Sequence = ("mirror", "transpose"), sampler=None, epoch_size: Optional[int] = None,
                 threads: int = 1, buffers: Optional[int] = None, seed: int = 0, dtype="float32",
                 normalize=None, isotropic: bool = False, label_offset=None, device="cpu") -> None:
        self.patch = _positive_triple(patch, "patch")
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.epoch_size = None if epoch_size is None else _positive_int(epoch_size, "epoch_size")
        self.threads = _positive_int(threads, "threads")
        self.buffers = max(2, self.threads + 2) if buffers is None else _positive_int(buffers, "buffers", 2)
        self.seed = check_seed(seed)
        self.dtype = self._output_dtype(dtype)
        self.augmentations = _augment.resolve(() if augment is None else augment, isotropic)
        self.sampler = Uniform() if sampler is None else sampler
        self._backend = resolve_device(device)
        self.device = "cpu" if self._backend is None else self._backend.name
        if not isinstance(self.sampler, Sampler):
            raise TypeError(f"sampler must be an emfast sampler such as emfast.Uniform(), got {sampler!r}")

        raw_volume = as_volume(raw, "raw")
        if raw_volume.dtype not in RAW_DTYPES:
            raise TypeError(f"{raw_volume.name}: raw must be uint8, uint16 or float32, not {raw_volume.dtype}")
        raw_volume.check_finite()
        fields = [Field("raw", raw_volume, np.zeros(3, dtype=np.int64), self.dtype, convert=True)]
        lo, hi = np.zeros(3, dtype=np.int64), np.asarray(raw_volume.shape, dtype=np.int64)
        if labels is not None:
            label_volume = as_volume(labels, "labels")
            if label_volume.dtype not in LABEL_DTYPES:
                raise TypeError(f"{label_volume.name}: labels must be uint32, uint64 or int64, "
                                f"not {label_volume.dtype}")
            origin = _label_origin(raw_volume, label_volume, label_offset)
            fields.append(Field("labels", label_volume, origin, label_volume.dtype, convert=False))
            lo = np.maximum(lo, origin)
            hi = np.minimum(hi, origin + np.asarray(label_volume.shape))
            if np.any(hi <= lo):
                raise ValueError(f"{label_volume.name} (at {tuple(origin)}, shape {label_volume.shape}) does "
                                 f"not overlap {raw_volume.name} (shape {raw_volume.shape})")
        elif label_offset is not None:
            raise ValueError("label_offset was given but no labels")
        self._check_fits(lo, hi, [f.volume.name for f in fields])
        self.region = (tuple(int(v) for v in lo), tuple(int(v) for v in hi))

        normalization = DEFAULT_NORMALIZATION[raw_volume.dtype] if normalize is None else _pair(normalize)
        self._gatherer = Gatherer(fields, self.patch, self.batch_size, normalization)
        self._planner = Planner(patch=self.patch, batch_size=self.batch_size, sampler=self.sampler,
                                augmentations=self.augmentations, lo=lo, hi=hi, seed=self.seed)
        self._profile = Profile(self.threads)
        self._pipeline: Optional[_Pipeline] = None
        self._baseline: Dict[int, tuple] = {}  # slot index -> (its arrays, their reference counts when taken)
        self._current: Optional[Batch] = None
        self._consumed = 0
        self._closed = False
        self._warned_escape = False

    @staticmethod
    def _output_dtype(dtype) -> np.dtype:
        try:
            resolved = np.dtype(dtype)
        except TypeError:
            resolved = None
        if resolved not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
        return resolved

    def _check_fits(self, lo: np.ndarray, hi: np.ndarray, names: List[str]) -> None:
        available = hi - lo
        for perm in sorted(_augment.reachable_permutations(self.augmentations)):
            extent = window_extents(self.patch, np.asarray([perm]))[0]
            if np.any(extent > available):
                transposed = "" if perm == (0, 1, 2) else f" (source window {tuple(int(e) for e in extent)} " \
                                                          f"for transposed examples)"
                raise ValueError(f"patch {self.patch}{transposed} does not fit in the sampling region of shape "
                                 f"{tuple(int(a) for a in available)} of {' and '.join(names)}")

    # -- life cycle -------------------------------------------------------------------------------------------

    def start(self) -> "Loader":
        """Allocate the slots and start the producer threads (done by ``with`` and by iteration)."""
        if self._closed:
            raise RuntimeError("this loader is closed; create a new Loader")
        if self._pipeline is None:
            copier = None
            if self._backend is None:
                host_ring = consumer_ring = Ring([self._gatherer.allocate() for _ in range(self.buffers)])
            else:
                copier = Copier(self._backend, self.fields, self.buffers, self._profile)
                copier.open()
                host_ring, consumer_ring = copier.host_ring, copier.device_ring
            producers = _Producers(host_ring, self._planner, self._gatherer, self._profile, self.epoch_size,
                                   self.threads)
            self._pipeline = _Pipeline(producers, consumer_ring, copier)
            self._finalizer = weakref.finalize(self, self._pipeline.stop)
            producers.start()
            if copier is not None:
                copier.run(producers.alive)
        return self

    def close(self) -> None:
        """Stop and join every producer thread (idempotent; also after errors and Ctrl-C)."""
        if self._current is not None:
            self._current._detach()
            self._current = None
        self._closed = True
        if self._pipeline is not None:
            self._finalizer()

    def __enter__(self) -> "Loader":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- consuming --------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """Yield batches to the end of the current epoch (forever without ``epoch_size``)."""
        self.start()
        while True:
            batch = self.next_batch()
            yield batch
            if self.epoch_size is not None and batch.index == self.epoch_size - 1:
                return

    def next_batch(self) -> Batch:
        """Release the previous batch and return the next one, waiting for it if needed.

        Raises the exception of a failed producer, with its original traceback.
        """
        if self._closed:
            raise RuntimeError("this loader is closed; create a new Loader")
        self.start()
        if self._current is not None:
            self._release(self._current)
        number = self._consumed
        ring = self._pipeline.consumer_ring
        with self._profile.timer("wait"):
            arrays, plan = ring.take(number, self._pipeline.alive)
        index = number % ring.size
        if self._baseline.get(index, (None,))[0] is not arrays:  # a new slot: count its references unleased
            self._baseline[index] = (arrays, _references(arrays))
        # An interruption before these two assignments leaves the batch in the ring to be taken again; after
        # them, it is current and is released by the next request. Either way no slot is left leased.
        batch = Batch(self, number, arrays, plan)
        self._current, self._consumed = batch, number + 1
        self._profile.count_batch()
        return batch

    def _release(self, batch: Batch) -> None:
        if batch is not self._current:
            return
        self._current = None
        batch._detach()
        ring = self._pipeline.consumer_ring
        index = batch.number % ring.size
        arrays, counts = self._baseline[index]
        if _references(arrays) != counts:
            # The consumer still holds arrays of this slot: leave them to it and give the slot new memory.
            if self._pipeline.copier is not None:
                self._pipeline.copier.reallocate(index)
            else:
                ring.slots[index] = self._gatherer.allocate()
            if not self._warned_escape:
                self._warned_escape = True
                warnings.warn("emfast: arrays of a released batch are still referenced; they stay intact, but "
                              "the loader had to allocate a new slot. Use batch.copy() to keep data.",
                              ResourceWarning, stacklevel=3)
        del arrays
        ring.release(batch.number)

    # -- information ------------------------------------------------------------------------------------------

    @property
    def profile(self) -> ProfileReport:
        """Per-stage times so far (see :class:`emfast.profile.ProfileReport`)."""
        return self._profile.report()

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._consumed // self.epoch_size if self.epoch_size else 0

    @property
    def fields(self) -> Dict[str, tuple]:
        """Field name -> (shape, dtype) of the batch arrays."""
        return {f.name: (f.shape(self.batch_size, self.patch), np.dtype(f.dtype)) for f in self._gatherer.fields}

    @property
    def slot_bytes(self) -> int:
        """Bytes of one batch slot (the ring holds ``buffers`` of them)."""
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.fields.values())

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._pipeline is not None else "not started"
        return (f"Loader(patch={self.patch}, batch_size={self.batch_size}, threads={self.threads}, "
                f"buffers={self.buffers}, fields={list(self.fields)}, device={self.device!r}, {state})")
