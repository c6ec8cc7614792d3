"""What every sampler shares: the protocol (:class:`Sampler`), what it is bound to (:class:`Region`), what it
answers (:class:`Draw`), and the helpers of the samplers that build an index from a volume.

The loader describes each volume of the dataset by a :class:`Region`: the box where *output* windows may lie
(already shrunk so that the input context and the label margin of every window stay inside the data), plus the
volumes a sampler may look at (labels, mask). A sampler is bound once to the regions, before any thread starts,
and builds whatever index it needs then; afterwards :meth:`Sampler.sample` is a pure function of its uniforms and
the batch position, called from several producer threads at once.

One module per sampler family: ``_uniform`` (:class:`Uniform`), ``_masked`` (:class:`Masked`), ``_balanced``
(:class:`Balanced`), ``_tiled`` (:class:`Tiled`). Their indexes are built by the kernels of
:mod:`emfast._core.sampling`, tile by tile for lazy volumes (:data:`TILE_BYTES`), so their transient memory stays
bounded.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Callable, ClassVar, Dict, Optional, Sequence, Tuple

import numpy as np

from ..io import Volume

#: Bytes of a tile of a lazy mask or labels (and, for the masked sampler, its coverage) read at once while an index
#: is built tile by tile: the transient memory of an index's building.
TILE_BYTES = 1 << 28


@dataclass(frozen=True)
class Region:
    """One volume of the dataset, as a sampler sees it.

    Attributes
    ----------
    name : str
        The sample's name (for messages).
    weight : float
        Relative probability of drawing an example from this volume (> 0).
    lo, hi : ndarray, (3,) int64
        Output windows must lie inside ``[lo, hi)``, in the volume's raw voxel coordinates (z, y, x).
    labels : Volume or None
        The label volume, its voxel (0, 0, 0) at ``labels_origin`` in raw voxel coordinates.
    mask : Volume or None
        The mask volume (non-zero = usable), its voxel (0, 0, 0) at ``mask_origin``.
    """

    name: str
    weight: float
    lo: np.ndarray
    hi: np.ndarray
    labels: Optional[Volume] = None
    labels_origin: Optional[np.ndarray] = None
    mask: Optional[Volume] = None
    mask_origin: Optional[np.ndarray] = None


def region_signature(region: Region) -> tuple:
    """What an index of ``region`` depends on, comparable across processes: its name and bounds, and its labels'
    and mask's placement, shape, dtype and :class:`~emfast.io.Stamp` (where a file's data came from and how its
    marker looked when opened: an HDF5 file, a zarr or N5 array's metadata file; a volume reopened after they
    were rewritten has another). Chunks rewritten in place under unchanged metadata are not told apart, as a
    forked worker sharing the index does not tell them. An in-memory array without a stamp travels to the other
    process with its data, so its geometry stands for it."""
    def described(volume: Optional[Volume]) -> Optional[tuple]:
        return None if volume is None else (volume.name, volume.shape, volume.channels, str(volume.dtype),
                                            volume.resolution, volume.offset, volume.stamp)

    def plain(array: Optional[np.ndarray]) -> Optional[tuple]:
        return None if array is None else tuple(np.ravel(array).tolist())

    return (region.name, plain(region.lo), plain(region.hi), described(region.labels), plain(region.labels_origin),
            described(region.mask), plain(region.mask_origin))


class CarriedIndexes(Mapping):
    """A sampler's indexes in a file, as :meth:`Sampler.carry_indexes` sends them to another process: pickled as the
    file's path, read there when a bind first asks. A file gone (the sampler that wrote it was dropped) reads as no
    indexes: they are built again."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._read: Optional[dict] = None

    @classmethod
    def written(cls, indexes: dict, owner: object) -> Optional["CarriedIndexes"]:
        """``indexes`` written to a new temporary file, removed when ``owner`` is garbage collected in this process
        (a forked child's copy of ``owner`` leaves it be); None where they cannot be written (a full disk, an index
        of a custom sampler that does not pickle): the other process builds them, as it did before they were
        carried."""
        try:
            descriptor, path = tempfile.mkstemp(prefix="emfast-sampler-indexes-", suffix=".pickle")
        except OSError:
            return None
        finalizer = weakref.finalize(owner, _remove_quietly, path, os.getpid())
        try:
            with os.fdopen(descriptor, "wb") as file:
                pickle.dump(indexes, file, protocol=pickle.HIGHEST_PROTOCOL)
        except (OSError, pickle.PicklingError, AttributeError, TypeError):
            finalizer()
            return None
        except BaseException:
            finalizer()
            raise
        return cls(path)

    def _indexes(self) -> dict:
        if self._read is None:
            try:
                with open(self.path, "rb") as file:
                    self._read = pickle.load(file)
            except OSError:
                self._read = {}
        return self._read

    def __getitem__(self, key):
        return self._indexes()[key]

    def __iter__(self):
        return iter(self._indexes())

    def __len__(self) -> int:
        return len(self._indexes())

    def __reduce__(self):
        return CarriedIndexes, (self.path,)


def _remove_quietly(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # a forked child ends with the parent's finalizers: the file is the parent's
        with contextlib.suppress(OSError):
            os.remove(path)


@dataclass(frozen=True)
class Draw:
    """A sampler's answer for one batch.

    Attributes
    ----------
    volumes : ndarray, (B,) int64
        Index of each example's region.
    corners : ndarray, (B, 3) int64
        Low corner of each example's output window, in that region's raw voxel coordinates.
    valid : int
        Examples at the front of the batch that are real; the rest repeat the last one (only a tiled sampler's
        final, incomplete batch has ``valid < B``).
    """

    volumes: np.ndarray
    corners: np.ndarray
    valid: int


class Sampler:
    """Base class of the samplers.

    A sampler is a dataclass whose fields are its constructor's parameters (checked in ``__post_init__``),
    registered with ``@register("sampler")`` under its ``name``; it sets ``draws`` (uniforms per example), may
    override :meth:`bind` to build an index, and implements :meth:`sample`. ``emfast check`` reads it only
    through :meth:`describe`, :meth:`class_counts` and :attr:`index_nbytes`.
    """

    name: ClassVar[str] = "sampler"
    draws: ClassVar[int] = 0

    def bind(self, regions: Sequence[Region], extents: np.ndarray, batch_size: int, rank: int = 0,
             world_size: int = 1) -> None:
        """Prepare for ``regions``; called once by the loader before streaming.

        Parameters
        ----------
        regions : sequence of Region
            The dataset's volumes, in order.
        extents : ndarray, (K, 3) int64
            Every output-window extent in source axes that :meth:`sample` may be asked for (one per reachable
            axis order of the augmentations).
        batch_size : int
            Examples per batch.
        rank, world_size : int
            This process's shard of the stream (``torch.distributed`` convention). Random samplers get disjoint
            streams from the loader; deterministic samplers split their sequence themselves.

        Raises
        ------
        ValueError
            If no window qualifies in any region.
        """
        self.regions = list(regions)
        weights = np.asarray([region.weight for region in self.regions], dtype=np.float64)
        self._cumulative_weights = np.cumsum(weights) / weights.sum()
        # the indexes of the previous bind, for _indexed: copied, as a copy of the sampler shares the dict
        self._previous_indexes = dict(getattr(self, "_indexes", {}))
        self._indexes: Dict[tuple, tuple] = {}
        self._carried = None  # this bind's indexes, once written for another process (carry_indexes)

    def _indexed(self, region: Region, key: tuple, build: Callable[[], object]) -> object:
        """``build()``, an index of ``region`` (``key``: what else it depends on besides the sampler's settings),
        or the same index from this sampler's previous bind: a loader binds again in each torch DataLoader worker
        to draw that worker's shard, which had every worker, every epoch, read the labels again and recount them
        (seconds per sample). The previous bind's index is reused for the same region object, or, where it came
        from another process (:meth:`carry_indexes`), for a region of the same :func:`region_signature`. Call
        :meth:`_forget_previous_indexes` once the bind has its indexes."""
        # keyed by the region's place among those bound, which a copy in another process shares; a region a
        # subclass made itself (not one of them) by the object
        place = next((("bound", n) for n, bound in enumerate(self.regions) if bound is region), ("object", id(region)))
        full = (place, self._settings(), key)
        kept = self._previous_indexes.pop(full, None)  # taken: what is left over is not kept long
        if kept is None:
            index = build()
        elif isinstance(kept[0], Region):
            index = kept[1] if kept[0] is region else build()
        else:
            index = kept[1] if kept[0] == region_signature(region) else build()
        self._indexes[full] = (region, index)
        return index

    def carry_indexes(self, into: "Sampler") -> "Sampler":
        """``into`` (an unbound copy of the sampler this one was copied from) holding this bind's indexes, each
        with its region's signature in place of the region: pickled to another process (a spawned torch
        DataLoader worker, which gets the loader pickled), it binds there to regions reopened from the same files
        and reuses the indexes of those whose signature is unchanged, instead of reading the labels again.

        The indexes travel in a file (:class:`CarriedIndexes`), written once and removed with this sampler: a
        spawned process's pickle goes through a pipe that holds the parent until the child has imported its
        modules, so carried in the pickle, megabytes of index made the workers of each epoch start one after
        another instead of side by side."""
        indexes = getattr(self, "_indexes", {})
        carried = getattr(self, "_carried", None)
        if indexes and carried is None:
            carried = self._carried = CarriedIndexes.written(
                {full: (region_signature(region), index) for full, (region, index) in indexes.items()}, self)
        # "is None", not "or": a CarriedIndexes' truth is its length, which reads its whole file back here
        into._indexes = {} if carried is None else carried  # none written: the other process builds them
        return into

    def _forget_previous_indexes(self) -> None:
        """Drop the previous bind's indexes not reused, and the regions (volumes) they hold."""
        self._previous_indexes = {}

    def _settings(self) -> str:
        """What an index may depend on besides its region: the sampler's fields and class settings (a
        ``Balanced.block`` set on the object)."""
        names = [f.name for f in fields(self)] if is_dataclass(self) else []
        settings = {name: value for name, value in inspect.getmembers(type(self))
                    if not name.startswith("_") and isinstance(value, (int, float, str, tuple))}
        return repr(([getattr(self, name) for name in names], {name: getattr(self, name) for name in settings}))

    def sample(self, uniforms: np.ndarray, extents: np.ndarray, epoch: int, index: int) -> Draw:
        """Windows for one batch from ``uniforms`` (B, draws) in [0, 1), for output windows of ``extents`` (B, 3).

        ``index`` is the batch index within ``epoch`` for this shard.
        """
        raise NotImplementedError

    def describe(self, index: int, extent: Tuple[int, int, int]) -> Optional[str]:
        """A line for ``emfast check`` on how region ``index`` serves windows of ``extent`` (None: nothing to add)."""
        return None

    def batches_per_epoch(self) -> Optional[int]:
        """Batches in an epoch, for samplers with a finite sequence (None: the loader's ``epoch_size`` decides)."""
        return None

    def class_counts(self) -> Optional[Dict[str, Dict[str, int]]]:
        """Indexed voxels per region and class, ``{region name: {class name: count}}``, for a sampler that draws
        by class (after :meth:`bind`); None for the others."""
        return None

    @property
    def index_nbytes(self) -> int:
        """Bytes held by the sampler's index after :meth:`bind` (0: it keeps none)."""
        return 0

    def choose_regions(self, uniforms: np.ndarray) -> np.ndarray:
        """Region index per example, drawn by the regions' weights from one uniform each."""
        return pick(self._cumulative_weights, uniforms)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def uniform_offsets(uniforms: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Integers uniformly in ``[0, positions)`` from uniforms in [0, 1), elementwise."""
    return np.minimum((uniforms * positions).astype(np.int64), positions - 1)



def as_triple(value) -> Tuple[int, int, int]:
    """A (z, y, x) array or sequence as a tuple of ints, for messages and dictionary keys."""
    return tuple(int(v) for v in value)


def read_box(volume: Volume, corner: Sequence[int], extent: Sequence[int]) -> np.ndarray:
    """The box [corner, corner + extent) of a one-channel volume as a 3-D array: a view of an in-memory volume,
    a fresh buffer read from a lazy one."""
    box = tuple(slice(int(c), int(c) + int(e)) for c, e in zip(corner, extent))
    if volume.in_memory:
        return volume.array[0][box]
    out = np.empty((volume.channels,) + tuple(int(e) for e in extent), dtype=volume.dtype)
    volume.read_box(corner, extent, out)
    return out[0]


def one_channel(volume: Volume, what: str, region: Region, owner: str) -> None:
    """Refuse a ``what`` volume (labels or mask) of ``region`` with more than one channel."""
    if volume.channels != 1:
        raise ValueError(f"{owner}: region {region.name!r} has {what} with {volume.channels} channels; "
                         f"a {what} volume must have one")


def cumulative_shares(weights: np.ndarray) -> np.ndarray:
    """Normalised cumulative weights, for :func:`pick`."""
    return np.cumsum(weights) / weights.sum()


def pick(cumulative: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Index per uniform into the categories of ``cumulative`` (normalised cumulative weights), never one of
    weight zero."""
    chosen = np.searchsorted(cumulative, uniforms, side="right")
    return np.minimum(chosen, len(cumulative) - 1).astype(np.int64)


def label_origin(region: Region) -> np.ndarray:
    """Where the region's label voxel (0, 0, 0) lies in raw voxels."""
    return np.zeros(3, np.int64) if region.labels_origin is None else np.asarray(region.labels_origin, np.int64)


def redistributed(weights: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """``weights`` with those of unusable regions set to 0 (normalising gives theirs to the others)."""
    return np.where(usable, weights, 0.0)
