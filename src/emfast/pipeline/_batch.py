"""A batch as the consumer gets it: a mapping of field name to array, valid until it is released, whose arrays keep
their slot leased for as long as any of them (or a view, tensor or CuPy array made from one) lives.
"""
from __future__ import annotations

import difflib
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Dict, Iterator, Optional, Sequence

import numpy as np

from .._registry import registered
from ._plan import BatchPlan
from ._pool import Lease

if TYPE_CHECKING:  # the optional libraries' types, for the annotations only
    import cupy
    import torch


class MissingFieldError(KeyError):
    """A batch has no field of that name: the message lists the fields it has and the option that adds it."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError would show the message quoted, as a repr


def _missing_field_message(name: str, fields: Sequence[str], loader: Optional[object]) -> str:
    if not isinstance(name, str):  # batch[0], as if it were a sequence of samples
        return (f"a batch's fields are named by strings; got {name!r}: a batch is a mapping of fields "
                f"({', '.join(map(repr, fields))}), each holding every sample, e.g. batch['raw'][0]")
    close = difflib.get_close_matches(name, fields, n=1)
    typo = f" Did you mean {close[0]!r}?" if close else ""
    return (f"the batch has no field {name!r}; it has {', '.join(map(repr, fields))}.{typo} "
            f"{_field_source(name, loader)}")


def _field_source(name: str, loader: Optional[object]) -> str:
    """Which option makes a batch deliver the field ``name``."""
    for kind, target in registered("target").items():
        try:
            default = target()
        except (TypeError, ValueError):  # a target without defaults: nothing to suggest by default name
            continue
        try:
            defaults, where = default.outputs(), ""
        except ValueError:  # it reads the field of a target listed before it (ClassWeights)
            defaults, where = {default.name: None}, ", after the target it reads"
        if name in defaults:
            return (f"Add it with targets=[ef.{target.__name__}(...)]{where} (in a config: targets: [{kind}]); a "
                    "target's name= renames its fields")
    if name == "mask":
        return "Add it with a mask: Sample(raw, labels, mask=...) (in a config: the sample's mask:)"
    if name == "labels":
        if loader is not None and loader.dataset.has_labels:
            return "This loader was built with keep_labels=False; keep_labels=True delivers them"
        return "Add them with Loader(raw, labels) or Sample(raw, labels) (in a config: the sample's labels:)"
    if name == "labels_valid":
        return ("It comes with augmentations that move voxels from outside the data into the window (rotation, "
                "scaling, elastic deformation)")
    return f"Extra input channels are added with Sample(raw, ..., extra={{{name!r}: volume}}) (in a config: extra:)"


class BatchReleasedError(RuntimeError):
    """A batch was used after it was released (its slot may already hold a newer batch)."""


class Batch(Mapping):
    """One batch: a mapping of field name to array of shape (B, C, Z, Y, X), plus where it came from.

    The mapping is valid until the thread that got it requests the next batch (or ends), :meth:`release` is
    called, or the loader closes; afterwards indexing the batch raises :class:`BatchReleasedError`. The arrays
    (and views, tensors or CuPy arrays made from them) stay valid for as long as you hold them: their slot goes
    back to the loader only when the last of them dies. Holding the previous batch until the next step
    reassigns it costs one extra slot, no allocation per batch; holding many batches makes the loader wait once
    its ``max_buffers`` slots are in use. Several threads may take batches from one loader: each batch goes to one
    of them.

    Attributes
    ----------
    epoch, index : int
        Epoch number and batch index within the epoch.
    number : int
        Position in the whole stream, counting across epochs.
    volumes : ndarray, (B,) int64
        Index of each example's sample in the loader's dataset; ``names`` holds the sample names.
    positions : ndarray, (B, 3) int64
        Low corner (z, y, x) of each example's output window (``patch_out``) in its sample's raw voxel
        coordinates. The raw input window (``patch_in``) is centred on it.
    extents : ndarray, (B, 3) int64
        Output window size along the source axes z, y, x (``patch_out``, permuted for transposed examples).
    perms, flips : ndarray, (B, 3)
        Each example's transform: output = ``transpose(flip(window, flips[n]), perms[n])``.
    valid : int
        Real examples at the front of the batch; fewer than B only in the last batches of a
        :class:`~emfast.sampling.Tiled` epoch that keeps its incomplete batch (the rest repeat the last window),
        and 0 in the last batch of a shard one tile short of the largest, which makes as many batches.
    """

    def __init__(self, owner, number: int, arrays: Dict[str, np.ndarray], plan: BatchPlan) -> None:
        self._owner = weakref.ref(owner)  # a batch must not keep an abandoned loader (and its threads) alive
        self._arrays: Optional[Dict[str, np.ndarray]] = arrays
        self.number = int(number)
        self.epoch = int(plan.epoch)
        self.index = int(plan.index)
        self.volumes = plan.volumes
        self.names = [owner.dataset.names[v] for v in plan.volumes]
        self.positions = plan.corners
        self.extents = plan.extents
        self.perms = plan.params.perms
        self.flips = plan.params.flips
        self.valid = int(plan.valid)

    @property
    def released(self) -> bool:
        return self._arrays is None

    def _live(self) -> Dict[str, np.ndarray]:
        if self._arrays is None:
            raise BatchReleasedError(f"batch {self.number} (epoch {self.epoch}, index {self.index}) was released; "
                                     "copy what you need to keep with batch.copy() before requesting the next (a "
                                     "torch DataLoader collating batches requests several first: give it "
                                     "batch_size=None)")
        return self._arrays

    def __getitem__(self, name: str) -> np.ndarray:
        arrays = self._live()
        try:
            return arrays[name]
        except KeyError:
            raise MissingFieldError(_missing_field_message(name, list(arrays), self._owner())) from None

    def __contains__(self, name: object) -> bool:
        return name in self._live()  # not through __getitem__: a missing field's message is built for people

    def get(self, name: str, default=None):
        return self._live().get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def copy(self) -> Dict[str, np.ndarray]:
        """Return host copies of all arrays (CPU loaders only), detached from the loader's memory."""
        arrays = self._live()
        if not all(isinstance(array, np.ndarray) for array in arrays.values()):
            raise TypeError("batch.copy() copies host arrays; for a device batch use batch.torch() or "
                            "batch.cupy() and clone the tensors you keep")
        return {name: array.copy() for name, array in arrays.items()}

    def torch(self) -> Dict[str, "torch.Tensor"]:
        """The arrays as PyTorch tensors without copying: CPU tensors, or CUDA tensors for a device loader.

        They share the batch's memory, which stays theirs for as long as they live.
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

    def __reduce__(self):
        raise TypeError("a Batch lives in its loader's memory and cannot be pickled; pickle batch.copy() (a dict "
                        "of arrays) and the attributes you need")

    def release(self) -> None:
        """Let the producers start another batch now, and drop the mapping (idempotent).

        The slot itself goes back once no array taken from the batch is alive.
        """
        owner = self._owner()
        if owner is not None:
            owner._release(self)
        else:
            self._detach()

    def _detach(self) -> None:
        self._arrays = None

    def __repr__(self) -> str:
        if self._arrays is None:
            return f"<Batch {self.number} (released)>"
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self._arrays.items())
        return f"<Batch {self.number} epoch={self.epoch} index={self.index} {fields}>"



class _HostView:
    """Exports one slot array to NumPy (``__array_interface__``) so that every view made keeps the lease."""

    __slots__ = ("__array_interface__", "_array", "_lease")

    def __init__(self, array: np.ndarray, lease: Lease) -> None:
        self.__array_interface__ = array.__array_interface__
        self._array = array
        self._lease = lease


def host_arrays(lease: Lease) -> Dict[str, np.ndarray]:
    return {name: np.asarray(_HostView(array, lease)) for name, array in lease.slot.memory.items()}
