"""The loader: producer threads fill a ring of pre-allocated batch slots; the consumer iterates over batches.

Producers compute each batch's plan (pure function of seed, epoch and batch index), read windows and call the
GIL-releasing kernels, so ``threads=N`` uses N cores. The consumer gets batches in order. A batch's memory
comes from a :class:`~emfast.pipeline._pool.SlotPool` and goes back to it when the last array or tensor viewing it dies
(see :class:`Batch`), so a loop that keeps the previous batch until it reassigns its variables allocates nothing.
"""
from __future__ import annotations

import copy
import numbers
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from .. import augment as _augment
from .. import targets as _targets
from .._checks import check_threads, concerning, refusal
from .._threads import ctrl_c_held, run_every
from ..augment import Windows
from ..io import Volume
from ..sampling import Placed, Sampler, as_dataset
from ..transfer import resolve_device
from ._batch import Batch, host_arrays
from ._copier import Copier
from ._fields import check_own, common_grid, own_field, raw_grid_sources
from ._gather import Field, Gatherer
from ._iteration import EpochIterator
from ._normalize import normalization
from ._options import (buffer_counts, check_memory, checked_epoch_size, chunk_cache_bytes,
                       loader_sampler, rank_and_world, setting, torch_worker)
from ._plan import Planner
from ._pool import SlotPool
from ._producers import STARTED, ExhaustionCheck, Pipeline, Producers, close_at_exit, stop_abandoned
from ._profile import Profile, ProfileReport
from ._ring import Ring
from ._snapshot import write_snapshot
from ._windows import PATCH_KEYS, fitting_regions, patch_windows, window_extents

#: The batch fields a loader delivers itself, whose names neither a target nor an extra channel may take.
BUILT_IN_FIELDS = ("raw", "labels", "mask", "labels_valid")


class Loader:
    """Streams batches of augmented 3-D patches from EM volumes, produced by background threads.

    Parameters
    ----------
    data : Dataset, Sample, list of Sample, Volume or ndarray
        What to draw from: a :class:`~emfast.Dataset` of several annotated volumes, or a single raw volume
        ((z, y, x) or (c, z, y, x), uint8, uint16, int8, int16, uint32, float16, float32 or float64), converted
        to ``dtype`` and normalised.
    labels : Volume or ndarray, default None
        With a single raw volume: its labels (uint32, uint64, int64 or int32), cut with the same geometry and
        copied bit for bit.
    patch : (int, int, int), default None
        Window (z, y, x) of input and output alike; or give ``patch_in`` and ``patch_out``.
    patch_in, patch_out : (int, int, int), default None
        Input (raw, extra channels) and output (labels, mask, targets) windows, for networks with valid
        convolutions: ``patch_in`` exceeds ``patch_out`` by an even number per axis and the output window is
        centred in it; either defaults to the other. 2.5-D: ``patch_in=(5, 256, 256),
        patch_out=(1, 256, 256)``.
    batch_size : int, default 8
        Examples per batch.
    augment : sequence of Augmentation or str, default ('mirror', 'transpose')
        Augmentations, e.g. ``[Mirror(), Transpose(), Intensity()]`` or ``["mirror", "transpose"]``.
    targets : sequence of Target or str, default ()
        Targets computed from the augmented labels, e.g. ``[Affinities(), Boundaries()]``; each adds its
        fields to the batch. Labels are cut larger by the targets' margin, so targets are exact up to the border.
    sampler : Sampler or str, default None
        Where windows are cut. None: :class:`~emfast.Uniform`; or a mask-aware, label-balanced or tiled sampler
        from :mod:`emfast.sampling`, or its registered name (``"masked"``, with default parameters), as in
        configs. The loader works on its own copy.
    epoch_size : int, default None
        Batches per epoch, also ``len(loader)``: each ``for batch in loader`` runs to the end of the current epoch.
        None: endless (``len(loader)`` then raises TypeError), unless the sampler has epochs of its own (tiled).
    threads : int, default 1
        Producer threads. The kernels release the GIL, so throughput scales with cores.
    buffers : int, default None
        Batches in flight: being made, ready, or current. None: ``threads + 2`` (at least 2).
    max_buffers : int, default None
        Most batch slots in memory (None: ``2 * buffers``; host memory for a CPU loader, device memory for a
        GPU loader). A slot is in use from when a producer starts a batch until the last array or tensor of
        that batch dies, so slots beyond ``buffers`` hold batches your program keeps. The loader starts with
        ``buffers`` slots and grows only when you keep batches; at ``max_buffers`` producers wait (``stall``)
        with one :class:`~emfast.BackPressureWarning`, and a :class:`~emfast.SlotsExhaustedError`
        ends the wait if the program holds every slot while it waits for the next batch.
    seed : int, default 0
        Seed in [0, 2**64). Batches are a pure function of (seed, epoch, batch index, rank): the same whatever
        ``threads`` and ``buffers``.
    dtype : str, default 'float32'
        Raw output type, ``"float32"`` or ``"float16"``. A normalised value beyond float16's range (±65504)
        becomes infinity: normalise to a small range (the defaults, ``"volume"``, ``"minmax"``) for float16.
    normalize : (float, float), dict, str, default None
        Raw and extra channels: ``(scale, shift)`` (output = ``x * scale + shift``), ``{"mean": m, "std": s}``,
        ``"volume"`` (each volume to zero mean, unit variance from its statistics) or ``"minmax"`` (each
        volume's range to [0, 1]); per-volume statistics are computed once and cached under
        ``~/.cache/emfast`` (``EMFAST_CACHE_DIR``, ``XDG_CACHE_HOME``), never in the data's files. None: integers
        to [0, 1], float unchanged.
    isotropic : bool, default False
        Allow transforms that swap z with y/x (only for data of equal resolution along all axes). A transform
        mixing axes whose voxels the data's resolution gives different sizes is refused: y with x, and z with
        them whatever this flag says.
    label_offset : (int, int, int), default None
        With a single raw volume: position of the labels' first voxel in raw voxels, when labels cover only part
        of raw. Otherwise taken from the datasets' ``offset``/``resolution`` attributes (a dataset with a
        resolution but no offset lies at 0, as in gunpowder, funlib and CREMI files), or, where neither has an
        offset or a resolution, the shapes must be equal. Labels without attributes (an array) beside raw that
        has a resolution need it given (``(0, 0, 0)`` where they start together). An offset contradicting the
        attributes is refused (see :class:`~emfast.Sample`).
    keep_labels : bool, default True
        Deliver ``batch["labels"]``. With targets you may not need them: False saves their copy (and, on a GPU,
        their transfer).
    rank, world_size : int, default 0 and 1
        Shard of the stream for distributed training (the ``torch.distributed`` convention): each rank draws a
        disjoint, deterministic set of batches.
    worker_sharding : bool, default True
        A loader created inside a PyTorch ``DataLoader`` worker shards the stream further by the worker's id and
        the number of workers (as ``rank``/``world_size`` do), so that workers never deliver the same batches.
        False: every worker draws the whole stream of its rank.
    device : str, default 'cpu'
        Where batches are delivered: ``"cpu"`` (NumPy arrays), ``"cuda"`` / ``"cuda:N"`` (device arrays with
        ``__cuda_array_interface__``, copied asynchronously from page-locked memory; needs pycuda), or
        ``"auto"`` (CUDA if usable, else the CPU with a notice). See :mod:`emfast.transfer`.
    progress : bool, default False
        Draw a progress bar of each epoch (``for batch in loader``) on standard error, emfast's one bar: redrawn in
        place on a terminal, a few plain lines in a log. Only when an epoch has a size (``len(loader)``); an
        endless stream draws none.
    close_data : bool, default False
        Close the files of the data's lazy volumes when the loader closes: for a loader that opened them itself,
        as one built from a config (:meth:`emfast.config.Config.loader`) does. Volumes a caller passes in stay
        theirs to close.

    Notes
    -----
    Lazy volumes (``emfast.open(..., in_memory=False)``): the kernels read each window in place from the chunk
    cache's decoded chunks, pinned while they are read, so a batch whose chunks are cached costs what an
    in-memory batch costs. A cache may hold more than its ``cache_bytes`` only while the windows being made pin
    more chunks than it holds (at most ``threads x batch_size`` windows' chunks); give it room for those. Where
    the budget also holds the next batches' chunks, ``emfast-read-ahead`` threads read them ahead of the
    producers (up to ``threads + 1`` batches, one thread each; the ``ahead`` stage of :attr:`profile`); ``fetch`` and ``pending``
    in :attr:`profile` show the producers' own reads and their waits for chunks being read, ``decode`` the
    decoding of what they read. Remote stores (``s3://``, ``gs://``, ``http(s)://``) are read the same way.
    A batch that a warp moved (``Rotate``, ``Scale``, ``Elastic``) reads each example's source window of a lazy
    volume into a buffer of its own first, outside the budget: per producer thread, ``batch_size`` windows in the
    volume's dtype, each the output window enlarged to hold its rotation (up to twice its (y, x) area for a
    rotation about z), on top of ``cache_bytes`` and the batch slots.

    Examples
    --------
    >>> with Loader(raw, labels, patch=(32, 128, 128), batch_size=8, epoch_size=100, threads=2) as loader:
    ...     for batch in loader:
    ...         train_step(batch["raw"], batch["labels"])
    """

    def __init__(self, data, labels=None, *, patch: Optional[Sequence[int]] = None,
                 patch_in: Optional[Sequence[int]] = None, patch_out: Optional[Sequence[int]] = None,
                 batch_size: int = 8, augment: Sequence = ("mirror", "transpose"), targets: Sequence = (),
                 sampler: Optional[Union[Sampler, str]] = None, epoch_size: Optional[int] = None, threads: int = 1,
                 buffers: Optional[int] = None, max_buffers: Optional[int] = None, seed: int = 0, dtype="float32",
                 normalize=None,
                 isotropic: bool = False, label_offset=None, keep_labels: bool = True, rank: int = 0,
                 world_size: int = 1, worker_sharding: bool = True, device="cpu", progress: bool = False,
                 close_data: bool = False) -> None:
        # Every argument as given, first thing: an unstarted loader pickles as them (see __reduce__).
        self._arguments = {name: value for name, value in locals().items() if name != "self"}
        with concerning(setting=PATCH_KEYS):
            self.patch_in, self.patch_out = patch_windows(patch, patch_in, patch_out)
        self.batch_size = setting("batch_size", batch_size)
        self.threads = setting("threads", threads)
        self.buffers, self.max_buffers = buffer_counts(self.threads, buffers, max_buffers)
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.worker_sharding = setting("worker_sharding", worker_sharding)
        self._shard = self._current_shard()  # see the shard property
        self.seed = setting("seed", seed)
        self.dtype = setting("dtype", dtype)
        # Copies: binding an augmentation to this loader's window sizes must not change the caller's object.
        # Errors raised by the components are marked with their section, so a config names its key.
        with concerning(section="augment"):
            self.augmentations = [copy.copy(a) for a in _augment.resolve(() if augment is None else augment,
                                                                         setting("isotropic", isotropic))]
        with concerning(section="targets"):
            self.targets = _targets.resolve(targets) if targets else []
        with concerning(section="sampler"):
            self.sampler = loader_sampler(sampler)
        self.dataset = as_dataset(data, labels, label_offset)
        with concerning(section="augment"):
            _augment.check_fills(self.augmentations, self.dtype)
            for sample in self.dataset.samples:
                _augment.check_voxel_sizes(self.augmentations, sample.raw.resolution, f"sample {sample.name!r}")
        changing = [(index, a) for index, a in enumerate(self.augmentations) if a.changes_labels]
        _check_moves_after_changes(self.augmentations, self.targets)
        for index, augmentation in changing:
            with concerning(section="augment", item=(index, augmentation.name)):
                if not self.dataset.has_labels:
                    raise ValueError(f"{type(augmentation).__name__} changes the labels, but the data has none")
                augmentation.check_labels(self.dataset.samples[0].placed_labels.volume.dtype)
        with concerning(section="targets"):
            if self.targets and not self.dataset.has_labels:
                raise ValueError(f"targets {[t.name for t in self.targets]} need labels, but the data has none")
            for sample in self.dataset.samples:  # targets in world units (LSD) take each raw's voxel size
                self.targets = [_of_item(index, t.kind, t.with_voxel_size, sample.raw.resolution,
                                         f"sample {sample.name!r}") for index, t in enumerate(self.targets)]
            _targets.outputs(self.targets)  # targets reading others' fields (ClassWeights) take the copies
            for index, target in enumerate(self.targets):  # Foreground(name="mask") replaced the training mask
                _of_item(index, target.kind, target.check, self.dataset.samples[0].placed_labels.volume.dtype)
                _of_item(index, target.kind, _check_target_fields, target)
            margin = _targets.required_margin(self.targets) if self.targets else (0, 0, 0)
        # labels changed from their neighbours (GrowBoundary) are cut larger by each change's reach, the changes
        # adding up, so that those the targets and the batch see equal the whole volume's
        self._label_reaches = [(type(a).__name__, a.label_reach()) for _, a in changing]
        self.margin = tuple(m + sum(r[axis] for _, r in self._label_reaches) for axis, m in enumerate(margin))
        self.keep_labels = setting("keep_labels", keep_labels)
        self.progress = setting("progress", progress)
        self.close_data = setting("close_data", close_data)
        with concerning(setting="device"):
            self._backend = resolve_device(device)
        self.device = "cpu" if self._backend is None else self._backend.name

        check_own(self.dataset.samples[0].own_resolution, self.augmentations, self.targets)
        self._mask_with_labels = self._mask_cut_like_labels()
        fields = self._fields(normalize)
        self._own_fields = [f for f in fields if f.grids is not None]
        self._common_grid = common_grid(fields, self.dataset.names)
        with concerning(section="augment"):
            self._bind_augmentations(fields)
        with concerning(setting=PATCH_KEYS):
            margins = [(type(t).__name__, tuple(int(m) for m in t.margin())) for t in self.targets if any(t.margin())]
            margins += [(name, tuple(reach)) for name, reach in self._label_reaches]
            self.regions = fitting_regions(self.dataset.samples, self.patch_in, self.patch_out, self.margin,
                                           np.asarray(self._perms), self._own_fields, self._common_grid, margins,
                                           mask_margin=self._mask_with_labels)
        self._extents = np.unique(window_extents(self.patch_out, np.asarray(self._perms)), axis=0)
        with concerning(section="sampler"):
            self._bind_stream()

        pixelwise = [(i, a) for i, a in enumerate(self.augmentations) if a.pixelwise]
        warps = any(a.moves_voxels for a in self.augmentations)
        track_valid = any(a.unknown_voxels for a in self.augmentations)
        self._gatherer = Gatherer(fields, self.batch_size, self.patch_out, pixelwise, self.targets, self.margin,
                                  warps, self.keep_labels, track_valid)
        self._check_resources()
        self._profile = Profile(self.threads)
        self._pipeline: Optional[Pipeline] = None
        self._finalizer: Optional[weakref.finalize] = None
        #: Thread id -> the batch that thread got last and has not released (its mapping is live).
        self._held: Dict[int, Batch] = {}
        #: Per thread, the last epoch whose last batch it took (a ``for batch in loader`` there ends at it).
        self._epoch_ended: Dict[int, int] = {}
        self._holding = threading.Lock()  # guards _held; never held while waiting
        self._consuming = threading.Lock()  # held while a thread takes the next batch
        self._lifecycle = threading.RLock()  # start() from two threads must not build two pipelines
        self._consumed = 0
        self._start_epoch: Optional[int] = None  # set_epoch's, applied at start in the shard the loader runs in
        self._closed = False
        self._forked_from: Optional[int] = None

    @property
    def patch(self) -> tuple:
        """The output window (z, y, x) (``patch_out``)."""
        return self.patch_out

    @property
    def _perms(self) -> List[tuple]:
        return sorted(_augment.reachable_permutations(self.augmentations))

    def _fields(self, normalize) -> List[Field]:
        """The windows each example is cut into: raw and extra channels with context, labels with the target
        margin, the mask."""
        samples = self.dataset.samples
        origin = np.zeros(3, dtype=np.int64)
        context = tuple(-((i - o) // 2) for i, o in zip(self.patch_in, self.patch_out))

        def scales(volumes: List[Volume]) -> np.ndarray:
            with concerning(setting="normalize"):  # a config names the key
                return np.asarray([normalization(v, normalize) for v in volumes], dtype=np.float64)

        def converted(name: str, volumes: List[Volume], intensity: bool) -> Field:
            return Field(name, [Placed(v, origin) for v in volumes], self.dtype, self.patch_in, context,
                         normalization=scales(volumes), intensity=intensity)

        def placed_field(name: str, placed: List[Placed], dtype, patch, offset, **options) -> Field:
            """On raw's grid, or at the field's own voxel size where the samples ask for it."""
            if name in samples[0].own_resolution:
                return own_field(name, placed, dtype, patch, offset, self._perms, **options)
            return Field(name, raw_grid_sources(placed), dtype, patch, offset, **options)

        fields = [converted("raw", [s.raw for s in samples], intensity=True)]
        for name in samples[0].extra:
            if name in BUILT_IN_FIELDS or name in _targets.outputs(self.targets):
                raise ValueError(f"extra channel name {name!r} collides with a batch field; rename it")
            placed = [s.placed_extra[name] for s in samples]
            fields.append(placed_field(name, placed, self.dtype, self.patch_in, context,
                                       normalization=scales([p.volume for p in placed])))
        if self.dataset.has_labels:
            label_patch = tuple(p + 2 * m for p, m in zip(self.patch_out, self.margin))
            placed = [s.placed_labels for s in samples]
            fields.append(placed_field("labels", placed, placed[0].volume.dtype, label_patch,
                                       tuple(-m for m in self.margin),
                                       delivered=self.keep_labels and not any(self.margin)))
        if self._mask_with_labels:  # cut like the labels, delivered on the output window
            placed = [s.placed_mask for s in samples]
            fields.append(placed_field("mask", placed, placed[0].volume.dtype, label_patch,
                                       tuple(-m for m in self.margin), delivered=not any(self.margin)))
        elif self.dataset.has_mask:
            placed = [s.placed_mask for s in samples]
            fields.append(placed_field("mask", placed, placed[0].volume.dtype, self.patch_out, (0, 0, 0)))
        return fields

    def _mask_cut_like_labels(self) -> bool:
        """Whether a target or an augmentation reads the sample's mask with the labels (``labels_mask``); refused
        without a mask, or with one delivered at its own voxel size."""
        masking = [("targets", index, t.kind, t) for index, t in enumerate(self.targets) if t.labels_mask] + \
            [("augment", index, a.name, a) for index, a in enumerate(self.augmentations) if a.labels_mask]
        if not masking:
            return False
        section, index, name, user = masking[0]
        with concerning(section=section, item=(index, name), setting="labels_mask"):
            if not self.dataset.has_mask:
                raise ValueError(f"{type(user).__name__}(labels_mask=True) masks with the sample's mask, but the "
                                 "data has none: give the samples a mask (Sample(raw, labels, mask=...); in a "
                                 "config, the sample's mask:)")
            if "mask" in self.dataset.samples[0].own_resolution:
                raise ValueError(f"{type(user).__name__}(labels_mask=True) needs the mask on raw's grid, but it is "
                                 "delivered at its own voxel size (own_resolution): deliver it on raw's grid")
        return True

    def _bind_augmentations(self, fields: List[Field]) -> None:
        """Let each augmentation fit the windows (an elastic grid covers the largest; artifact sections must cover a
        raw section of the batch)."""
        largest = tuple(int(n) for n in np.max([f.patch for f in fields if f.grids is None], axis=0))
        windows = Windows(largest, (self.patch_in[1], self.patch_in[2]), self.patch_in[0])
        for index, augmentation in enumerate(self.augmentations):
            with concerning(item=(index, augmentation.name)):
                augmentation.bind_windows(windows)

    def _current_shard(self) -> tuple:
        worker = torch_worker() if self.worker_sharding else None
        return (self.rank, self.world_size) if worker is None else \
            (self.rank * worker[1] + worker[0], self.world_size * worker[1])

    def _bind_stream(self) -> None:
        """Bind the sampler to this loader's shard, and plan batches from it. In a DataLoader worker's shard, a
        sampler with epochs of its own, such as Tiled, has that shard's: the ``epoch_size`` given, the whole's
        (checked against it where the loader was built in the main process), is not theirs; a copy made in the
        worker (pickled, deep-copied) was refused there for it."""
        self.sampler.bind(self.regions, self._extents, self.batch_size, *self._shard)
        given = self._arguments["epoch_size"]
        worker = self._shard != (self.rank, self.world_size)
        self.epoch_size = checked_epoch_size(None if worker and self.sampler.batches_per_epoch() is not None
                                             else given, self.sampler)
        self._planner = Planner(patch=self.patch_out, batch_size=self.batch_size, sampler=self.sampler,
                                augmentations=self.augmentations, seed=self.seed, rank=self._shard[0],
                                world_size=self._shard[1], common_grid=self._common_grid)

    def _check_resources(self) -> None:
        """Refuse thread counts far beyond the cores, and slots that do not fit in memory, before allocating."""
        check_threads(self.threads)
        check_memory(buffers=self.buffers, threads=self.threads, slot_bytes=self.slot_bytes,
                     scratch_bytes=self.scratch_bytes, batch_size=self.batch_size, patch_in=self.patch_in,
                     cache_bytes=chunk_cache_bytes(v for sample in self.dataset.samples for v in sample.volumes))

    # -- life cycle -------------------------------------------------------------------------------------------

    def start(self) -> "Loader":
        """Allocate the slots and start the producer threads (done by ``with`` and by iteration).

        Thread-safe and idempotent. If it is interrupted (Ctrl-C) or fails, every thread it started is stopped and
        joined and its memory freed before the exception propagates: ``with loader:`` never runs ``__exit__`` then.
        """
        with self._lifecycle:
            if self._forked_from is not None:
                raise RuntimeError(
                    f"this Loader was started in process {self._forked_from} before it forked; its threads do not "
                    "exist in this child process. Create the Loader in the child, e.g. in the Dataset's __iter__ of "
                    "a torch DataLoader worker (each worker then draws its own shard), and start it there")
            if self._closed:
                raise RuntimeError("this loader is closed; create a new Loader")
            self._follow_worker()
            if self._pipeline is None:
                self._launch()
        return self

    @property
    def shard(self) -> tuple:
        """(rank, world size) of this loader's share of the stream: ``rank``/``world_size``, refined by the PyTorch
        DataLoader worker this loader was created, started or first asked in (a loader built in the main process
        and handed to the workers takes its worker's share there, before ``state_dict``, ``load_state_dict`` or
        ``len`` answer for it)."""
        self._follow_worker()
        return self._shard

    def _follow_worker(self) -> None:
        """Built in the main process and used, not yet started, in a torch DataLoader worker: draw this worker's
        shard (its sampler bound to it, its epochs). It was taken at start only: a worker restoring the state its
        own copy saved was refused as another stream, and ``len`` gave the whole stream's epoch."""
        with self._lifecycle:
            shard = self._current_shard()
            if self._pipeline is None and not self._closed and shard != self._shard:
                before = self._shard
                self._shard = shard  # what the bind reads
                try:
                    self._bind_stream()
                except BaseException:  # interrupted (Ctrl-C while an index builds): asked again, it binds again
                    self._shard = before
                    raise
                if self._start_epoch is not None:  # set_epoch's epoch, in this shard's epochs
                    self._consumed = self._start_epoch * self.epoch_size

    def _launch(self) -> None:
        """Build the pipeline and start its threads; undo all of it if anything interrupts or fails."""
        pool = copier = None
        try:
            if self._backend is None:
                pool = host_slots = SlotPool(self._gatherer.allocate, lambda memory: None, self.max_buffers,
                                             first=self._consumed)
                # One slot now: a lack of memory fails at start. The producers allocate the others as they need
                # them: each slot's pages are filled in (16 MiB of float32 windows: 2 to 4 ms), and the first batch
                # need not wait for all of them.
                pool.prefill(1)
                host_ring = consumer_ring = Ring(self.buffers, self._consumed)
                export = host_arrays
            else:
                copier = Copier(self._backend, self.fields, self.buffers, self.max_buffers, self._profile,
                                self._consumed)
                copier.open()
                pool, host_slots = copier.device_pool, copier.host_slots
                host_ring, consumer_ring = copier.host_ring, copier.device_ring
                backend = self._backend
                export = lambda lease: backend.export(lease.slot.memory, lease)  # noqa: E731
            producers = Producers(host_ring, host_slots, self._planner, self._gatherer, self._profile,
                                   self.epoch_size, self.threads)
            pipeline = Pipeline(producers, consumer_ring, pool, copier, export)
            self._finalizer = weakref.finalize(self, stop_abandoned, pipeline,
                                               self.dataset.close if self.close_data else None)
            self._pipeline = pipeline
            STARTED.add(self)
            close_at_exit()
            self._profile.start()
            producers.start()
            if copier is not None:
                copier.run(producers.alive)
        except BaseException:
            self._undo_launch(pool, copier)
            raise

    def _undo_launch(self, pool: Optional[SlotPool], copier: Optional[Copier]) -> None:
        """Stop, join and free what an interrupted :meth:`_launch` made, leaving the loader unstarted (a Ctrl-C
        meanwhile is raised at the end)."""
        with ctrl_c_held():
            if self._finalizer is not None:
                self._finalizer.detach()
            if self._pipeline is not None:
                pipeline, self._pipeline = self._pipeline, None
                STARTED.discard(self)
                pipeline.stop()
            elif copier is not None:  # its thread may run already: closed rings and finish() end it
                run_every([copier.host_ring.close, copier.device_ring.close, copier.finish])
            elif pool is not None:
                pool.close()

    def close(self) -> None:
        """Stop and join every producer thread (idempotent; also after errors and Ctrl-C). Called from another
        thread, the one waiting for a batch meanwhile gets a RuntimeError saying the loader is closed."""
        if self._forked_from is not None:  # the threads are the parent's; its locks may be held forever here
            self._closed = True
            return
        # A Ctrl-C is raised once everything has stopped and the files are closed. From another thread: after a
        # start() in progress, so that its threads stop too.
        with ctrl_c_held(), self._lifecycle:
            with self._holding:
                held, self._held = list(self._held.values()), {}
            for batch in held:
                batch._detach()
            self._closed = True
            self._profile.stop()
            if self._pipeline is not None:
                self._pipeline.stop()  # idempotent: a close() after an interrupted one (Ctrl-C twice) stops again
                self._finalizer.detach()
            if self.close_data:  # after the threads that read them stopped
                self.dataset.close()

    def __reduce__(self):
        """An unstarted loader pickles as its arguments and stream position (for spawned processes), its sampler
        with the indexes built for it (reused where their volumes reopen unchanged)."""
        if self._pipeline is not None or self._closed:
            raise TypeError("a started or closed Loader cannot be pickled: its threads and memory stay in this "
                            "process. Pickle it before it starts (it travels as its arguments and position) and "
                            "start it where it is unpickled")
        # The sampler travels with the indexes it built here: rebuilding them in every spawned worker and epoch
        # would read the labels again (seconds per sample).
        sampler = self.sampler.carry_indexes(loader_sampler(self._arguments["sampler"]))
        arguments = dict(self._arguments, sampler=sampler)
        return _unpickled_loader, (arguments, self.state_dict(), self._start_epoch)

    def __enter__(self) -> "Loader":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- consuming --------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """Batches to the end of the current epoch (forever without ``epoch_size``). The iterator stays usable
        after an exception raised by one ``next`` (Ctrl-C, :class:`~emfast.SlotsExhaustedError`): the next call
        takes the stream's next batch.

        Iterators share the loader's one stream: each batch goes to one of them. Two threads calling ``next`` on
        one iterator split the epoch between them; two threads each running ``for batch in loader`` end their
        loops at the end of the epoch each of them is in, so the one still going when the other took the epoch's
        last batch runs through the next epoch (two epochs in all)."""
        return EpochIterator(self)

    def __len__(self) -> int:
        """Batches per epoch, ``len(loader)``: ``epoch_size``, or the epoch of a tiled sampler (this shard's share).

        A ``for batch in loader`` started at the beginning of an epoch yields this many batches; one started
        mid-epoch yields the rest of that epoch.

        Raises
        ------
        TypeError
            The stream is endless (no ``epoch_size`` and a sampler without epochs), so it has no length.
        """
        self._follow_worker()
        if self.epoch_size is None:
            raise TypeError(f"len(loader): the stream of {self.sampler!r} is endless (no epoch_size), so it has no "
                            "length; pass epoch_size=N for epochs of N batches")
        return self.epoch_size

    def next_batch(self) -> Batch:
        """Release this thread's previous batch and return the next one, waiting for it if needed.

        Thread-safe: several threads may take batches from one loader; each batch goes to exactly one of them, in
        stream order, and a thread's request releases only the batch that thread got before.

        Raises the exception of a failed producer, with its original traceback.
        """
        with self._consuming:  # one taker at a time: two would take the same batch, then one would wait forever
            return self._next_batch()

    def _next_batch(self) -> Batch:
        if self._forked_from is not None:
            self.start()  # raises: the threads stayed in the parent
        if self._closed:
            raise RuntimeError("this loader is closed; create a new Loader")
        self.start()
        previous = self._held.get(threading.get_ident())
        if previous is not None:
            self._release(previous)
        if self._held:  # other threads' batches: those of threads that have ended are released
            alive = {thread.ident for thread in threading.enumerate()}
            for ident, batch in list(self._held.items()):
                if ident not in alive:
                    self._release(batch)
        number = self._consumed
        pipeline = self._pipeline
        with self._profile.timer("wait"):
            lease, plan = pipeline.consumer_ring.take(number, pipeline.alive, ExhaustionCheck(pipeline, number))
        # An interruption before these two assignments leaves the batch (and its lease) in the ring to be taken
        # again; after them, it is held and is released by the next request. Either way no slot is lost.
        batch = Batch(self, number, pipeline.export(lease), plan)
        del lease
        self._held[threading.get_ident()], self._consumed = batch, number + 1
        if self.epoch_size and (number + 1) % self.epoch_size == 0:
            self._epoch_ended[threading.get_ident()] = number // self.epoch_size
        self._profile.count_batch()
        return batch

    def _release(self, batch: Batch) -> None:
        if self._forked_from is not None:  # a parent's thread may have held the lock at the fork: never take it
            batch._detach()
            return
        with self._holding:
            thread = next((key for key, held in self._held.items() if held is batch), None)
            if thread is not None:
                del self._held[thread]
        batch._detach()
        if thread is not None:
            # also marks released any lower-numbered batch another thread holds: its arrays keep its slot leased
            self._pipeline.consumer_ring.release(batch.number)

    def _forked(self) -> None:
        """In a child process after fork(): the threads stayed in the parent; refuse to be used here."""
        self._forked_from = os.getppid()
        self._finalizer.detach()
        self._pipeline.pool._on_give_back = None  # no device calls from the child for batches dropped here

    # -- resuming ---------------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, object]:
        """Where the stream stands: the next batch to deliver, and what the stream depends on.

        Save it with your checkpoint; :meth:`load_state_dict` on a new loader built with the same arguments
        continues with the very batches this one would have delivered next, bit for bit. A batch counts as
        delivered once :meth:`next_batch` (or iteration) returned it.
        """
        identity = self._stream_identity()  # first: a worker's copy takes its shard, and its position in it
        return {"version": 1, "next_batch": self._consumed, **identity}

    def load_state_dict(self, state: Mapping) -> None:
        """Continue the stream from ``state`` (see :meth:`state_dict`); call it before the loader starts.

        Raises
        ------
        ValueError
            If the state is malformed or was saved by a loader whose stream differs (seed, batch size, epoch size,
            patch, shard); the message names the differing keys.
        RuntimeError
            If this loader has started already.
        """
        if self._pipeline is not None or self._closed:
            raise RuntimeError("load_state_dict() must be called before the loader starts")
        if not isinstance(state, Mapping) or state.get("version") != 1 or \
                not isinstance(state.get("next_batch"), numbers.Integral) or state["next_batch"] < 0:
            raise ValueError(f"not an emfast loader state (from Loader.state_dict()): {state!r}")
        identity = self._stream_identity()
        differing = [key for key in identity if _plain(state.get(key)) != identity[key]]
        if differing:
            details = ", ".join(f"{key} {state.get(key)!r} (this loader: {identity[key]!r})" for key in differing)
            raise ValueError(f"the state was saved by a loader with another stream: {details}")
        self._consumed = int(state["next_batch"])
        self._start_epoch = None  # the state says where the stream stands

    def set_epoch(self, epoch: int) -> None:
        """Start at the first batch of epoch ``epoch``; call it before the loader starts.

        For a torch ``DataLoader`` whose workers are not persistent: each epoch it starts new workers with fresh
        copies of this loader, which would all begin at epoch 0 and deliver the same batches every epoch. Call
        ``loader.set_epoch(epoch)`` in the main process before each epoch (as ``DistributedSampler.set_epoch``),
        and the copies begin there, each in its worker's shard. Persistent workers go on from where they are.

        Raises
        ------
        ValueError
            If ``epoch`` is not an integer >= 0, or the loader has no ``epoch_size`` (its stream is one endless
            epoch).
        RuntimeError
            If this loader has started already.
        """
        if self._pipeline is not None or self._closed:
            raise RuntimeError("set_epoch() must be called before the loader starts")
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if not self.epoch_size:
            raise ValueError("set_epoch() needs epoch_size: without it the stream is one endless epoch")
        self._start_epoch = int(epoch)
        self._consumed = self._start_epoch * self.epoch_size

    def _stream_identity(self) -> Dict[str, object]:
        self._follow_worker()  # first: a worker's shard has its own epochs
        return {"seed": self.seed, "batch_size": self.batch_size, "epoch_size": self.epoch_size,
                "patch_in": list(self.patch_in), "patch_out": list(self.patch_out), "shard": list(self._shard)}

    # -- information ------------------------------------------------------------------------------------------

    def snapshot(self, path, batches: int = 1, png=None):
        """Write the next ``batches`` batches (every field, at the windows' world positions) to a new zarr store
        that neuroglancer, napari and ome-zarr-py open as aligned layers; with ``png``, a montage of the first
        batch's central sections too. See :mod:`emfast.pipeline._snapshot` for the layout.

        Parameters
        ----------
        path : str or path-like
            The zarr store to create (``~`` expanded); it must not exist.
        batches : int
            Batches to take from the loader's stream and write.
        png : str or path-like, optional
            Where to write the montage of the first batch (must not exist; its folder must).

        Returns
        -------
        pathlib.Path
            The store's path.
        """
        return write_snapshot(self, path, batches, png)

    @property
    def profile(self) -> ProfileReport:
        """Per-stage times so far (see :class:`emfast.ProfileReport`)."""
        return self._profile.report()

    @property
    def epoch(self) -> int:
        """Epoch of the next batch."""
        return self._consumed // self.epoch_size if self.epoch_size else 0

    @property
    def fields(self) -> Dict[str, tuple]:
        """Field name -> (shape, dtype) of the batch arrays."""
        return self._gatherer.output_fields()

    @property
    def slot_bytes(self) -> int:
        """Bytes of one batch slot (``buffers`` of them at start, at most ``max_buffers``)."""
        return self._gatherer.slot_bytes()

    @property
    def scratch_bytes(self) -> int:
        """Bytes of one producer thread's scratch buffers (read buffers of staged fields, intermediate fields)."""
        return self._gatherer.scratch_bytes()

    @property
    def slots_allocated(self) -> int:
        """Batch slots allocated so far (0 before start): ``buffers``, plus one per batch the program kept
        alive beyond them at the busiest moment, at most ``max_buffers``."""
        return 0 if self._pipeline is None else self._pipeline.pool.allocations

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._pipeline is not None else "not started"
        return (f"Loader(patch={self.patch}, batch_size={self.batch_size}, threads={self.threads}, "
                f"buffers={self.buffers}, max_buffers={self.max_buffers}, fields={list(self.fields)}, "
                f"device={self.device!r}, {state})")


def _check_target_fields(target) -> None:
    """Refuse a target whose field takes the name of a batch field emfast delivers."""
    for name in target.outputs():
        if name in BUILT_IN_FIELDS:
            raise refusal(f"target field {name!r} collides with the batch field of that name; give the target "
                          "another name=", "name")


def _check_moves_after_changes(augmentations: list, targets: list) -> None:
    """Refuse an augmentation that moves labels (Slip) after one that changes them (GrowBoundary) where
    a target reads its unlabelled region from the labels as they were before the change: that region is kept
    apart from the labels, and would not move with them."""
    if not any(t.unlabelled is not None for t in targets):
        return
    changed = None
    for index, augmentation in enumerate(augmentations):
        if augmentation.changes_labels and changed is None:
            changed = augmentation
        elif augmentation.moves_labels and changed is not None:
            with concerning(section="augment", item=(index, augmentation.name)):
                raise ValueError(f"{type(augmentation).__name__} moves labels after {type(changed).__name__} "
                                 "changed the labels, but the targets' unlabelled region is taken from the labels "
                                 f"before {type(changed).__name__} and would not move with them: list "
                                 f"{type(augmentation).__name__} before {type(changed).__name__}")


def _of_item(index: int, name: str, call: Callable, *args):
    """``call(*args)``, an error it raises marked as coming from entry ``index`` (named ``name``) of a list of
    augmentations or targets, which a config names by its line."""
    with concerning(item=(index, name)):
        return call(*args)


def _unpickled_loader(arguments: Dict[str, object], state: Dict[str, object],
                      start_epoch: Optional[int] = None) -> Loader:
    loader = Loader(**arguments)
    loader.load_state_dict(state)
    if start_epoch is not None:  # set_epoch's epoch, counted in the shard the copy starts in (a spawned worker's)
        loader.set_epoch(start_epoch)
    return loader


def _plain(value):
    """Tuples as lists, so that a state that went through JSON compares equal."""
    return list(value) if isinstance(value, tuple) else value
