"""The pipelines a benchmark times on the built-in volume: emfast's loader, the NumPy reference, a PyTorch
``DataLoader`` and the memory-copy floor, each streamed for a fixed time into a :class:`Measurement`."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Sequence

import numpy as np

from ..augment import Intensity, Mirror, Transpose
from ..io import LABELS_DATASET, RAW_DATASET, Volume, demo_volume_path, hdf5
from ..pipeline import Loader
from ..targets import Affinities
from . import _reference as reference
from ._settings import SEED


@dataclass
class Volumes:
    """The built-in volume, loaded: emfast volumes and their 3-D arrays (for the reference)."""

    path: str
    raw: Volume
    labels: Volume

    @property
    def raw_array(self) -> np.ndarray:
        return self.raw.array[0]

    @property
    def labels_array(self) -> np.ndarray:
        return self.labels.array[0]

    @property
    def shape(self) -> tuple:
        return tuple(self.raw.shape)

    def close(self) -> None:
        self.raw.close()
        self.labels.close()


def load_volumes(shape: Sequence[int], cache_dir=None) -> Volumes:
    """The built-in volume of ``shape`` (generated and cached on first use), loaded into memory."""
    path = demo_volume_path(cache_dir=cache_dir, shape=tuple(shape))
    raw = hdf5(path, RAW_DATASET, in_memory=True)
    try:
        labels = hdf5(path, LABELS_DATASET, in_memory=True)
    except BaseException:
        raw.close()
        raise
    return Volumes(str(path), raw, labels)


def augmentations() -> list:
    """The standard task's augmentations."""
    return [Mirror(), Transpose(), Intensity(*reference.INTENSITY)]


def emfast_loader(volumes: Volumes, patch, batch_size: int, threads: int, buffers: Optional[int] = None,
                  seed: int = SEED) -> Loader:
    """The emfast loader of the standard task."""
    return Loader(volumes.raw, volumes.labels, patch=tuple(patch), batch_size=batch_size, augment=augmentations(),
                  targets=[Affinities(offsets=reference.NEAREST_NEIGHBOURS)], keep_labels=False, threads=threads,
                  buffers=buffers, seed=seed)


@dataclass
class Measurement:
    """One timed stretch of a pipeline: ``batches`` batches in ``seconds`` after the warm-up."""

    batches: int
    seconds: float
    cpu_seconds: float
    profile_ms: Optional[Dict[str, float]] = None

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds

    @property
    def ms_per_batch(self) -> float:
        return 1e3 * self.seconds / self.batches

    @property
    def cpu_cores(self) -> float:
        """Cores this process kept busy (worker processes not included)."""
        return self.cpu_seconds / self.seconds


def stream(produce: Callable[[], object], seconds: float, warmup: int = 2, min_batches: int = 3) -> Measurement:
    """Call ``produce`` ``warmup`` times untimed, then for ``seconds`` (at least ``min_batches`` times).
    Returns a :class:`Measurement`."""
    for _ in range(warmup):
        produce()
    clock = time.perf_counter
    count, cpu, start = 0, time.process_time(), clock()
    while True:
        produce()
        count += 1
        elapsed = clock() - start
        if elapsed >= seconds and count >= min_batches:
            return Measurement(count, elapsed, time.process_time() - cpu)


def stage_ms(before, after, batches: int) -> Dict[str, float]:
    return {stage: 1e3 * (after.seconds[stage] - before.seconds[stage]) / batches for stage in after.seconds}


def measure_emfast(volumes: Volumes, patch, batch_size: int, threads: int, seconds: float,
                   seed: int = SEED) -> Measurement:
    """Batches/s of a running emfast loader (start-up and warm-up excluded), with its per-stage profile."""
    with emfast_loader(volumes, patch, batch_size, threads, seed=seed) as loader:
        loader.next_batch()  # the warm-up, outside the profile's window as outside the timing's
        before = loader.profile
        result = stream(loader.next_batch, seconds, warmup=0)
        result.profile_ms = stage_ms(before, loader.profile, result.batches)
    return result


def measure_numpy(volumes: Volumes, patch, batch_size: int, seconds: float, seed: int = SEED) -> Measurement:
    """Batches/s of the single-threaded NumPy reference."""
    rng = np.random.default_rng(seed)
    raw, labels = volumes.raw_array, volumes.labels_array

    def produce():
        return reference.reference_batch(raw, labels, reference.draw_examples(rng, batch_size, patch, raw.shape),
                                         patch)

    return stream(produce, seconds, warmup=1)


@contextmanager
def torch_batches(volumes: Volumes, patch, batch_size: int, workers: int, seed: int = SEED) -> Iterator:
    """A running PyTorch ``DataLoader`` over :class:`~emfast.bench._reference.ReferenceDataset`; yields a function
    returning the next batch. Its worker processes are shut down on leaving, whatever the reason."""
    from torch.utils.data import DataLoader

    dataset = reference.ReferenceDataset(volumes.raw_array, volumes.labels_array, patch,
                                         length=batch_size * 10**7, seed=seed)
    iterator = iter(DataLoader(dataset, batch_size=batch_size, num_workers=workers, drop_last=True))
    try:
        yield lambda: next(iterator)
    finally:
        # Joins the workers now, rather than when the iterator happens to be collected (a traceback being
        # handled keeps it alive).
        iterator._shutdown_workers()


def measure_torch(volumes: Volumes, patch, batch_size: int, workers: int, seconds: float,
                  seed: int = SEED) -> Measurement:
    """Batches/s of a PyTorch ``DataLoader`` with ``workers`` worker processes (start-up excluded)."""
    with torch_batches(volumes, patch, batch_size, workers, seed) as produce:
        return stream(produce, seconds, warmup=workers + 1)


def measure_copy(nbytes: int, seconds: float) -> Measurement:
    """Copies/s of ``np.copyto`` between two buffers of ``nbytes`` (pages mapped before timing)."""
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.zeros(nbytes, dtype=np.uint8)
    return stream(lambda: np.copyto(target, source), seconds)
