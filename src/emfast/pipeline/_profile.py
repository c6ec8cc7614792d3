"""Per-stage timing of a loader: where the time of each batch goes."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Optional

from ..io import plural

#: Stage name -> what it measures.
STAGES = {
    "sample": "drawing window positions and transforms (producer)",
    "read": "reading windows of lazy volumes into buffers: warped, or mixed with in-memory volumes (producer)",
    "cache": "finding and pinning the cached chunks of lazy windows (producer)",
    "fetch": "moving the bytes of chunks missing from the cache: file reads, network requests (producer)",
    "decode": "decoding and checking the chunks fetched (producer)",
    "pending": "waiting for chunks another thread is reading: read-ahead or a producer (producer)",
    "ahead": "reading the chunks of the next batches ahead of the producers (read-ahead thread)",
    "kernel": "crop + transform + convert kernels (producer)",
    "augment": "pixel-wise augmentations: noise, blur, section defects (producer)",
    "targets": "targets computed from the labels (producer)",
    "copy": "host-to-device copies, issue to completion (copier thread; GPU only)",
    "stall": "producers (or the copier) waiting for a free slot: the consumer is slower, or holds every slot",
    "wait": "consumer waiting for a batch (producers are slower)",
}


@dataclass(frozen=True)
class ProfileReport:
    """A snapshot of a loader's timings.

    Attributes
    ----------
    seconds : dict
        Total seconds per stage, summed over all producer threads (so producer stages can exceed wall time).
    batches : int
        Batches handed to the consumer.
    elapsed : float
        Wall-clock seconds from the loader's start to now, or to its close (0 before it starts).
    """

    seconds: Dict[str, float]
    batches: int
    elapsed: float
    threads: int = 1
    stages: Dict[str, str] = field(default_factory=lambda: dict(STAGES))

    def per_batch_ms(self, stage: str) -> float:
        return 1e3 * self.seconds[stage] / self.batches if self.batches else 0.0

    def as_dict(self) -> dict:
        return {"batches": self.batches, "elapsed_s": self.elapsed, "threads": self.threads,
                "seconds": dict(self.seconds),
                "per_batch_ms": {s: self.per_batch_ms(s) for s in self.seconds}}

    def __str__(self) -> str:
        rate = self.batches / self.elapsed if self.elapsed > 0 else 0.0
        lines = [f"{self.batches} {plural(self.batches, 'batch')} in {self.elapsed:.2f} s ({rate:.1f} batches/s, "
                 f"{self.threads} {plural(self.threads, 'producer thread')})",
                 f"{'stage':<8} {'total s':>9} {'ms/batch':>9}  meaning"]
        for stage, meaning in self.stages.items():
            lines.append(f"{stage:<8} {self.seconds[stage]:>9.3f} {self.per_batch_ms(stage):>9.2f}  {meaning}")
        return "\n".join(lines)


class Profile:
    """Thread-safe accumulator of stage times."""

    def __init__(self, threads: int) -> None:
        self._lock = threading.Lock()
        self._seconds = {stage: 0.0 for stage in STAGES}
        self._batches = 0
        self._threads = threads
        self._start: Optional[float] = None
        self._stop: Optional[float] = None

    def start(self) -> None:
        """The loader started: the wall clock runs from here (a loader is often built long before its first
        batch, as a model is set up meanwhile)."""
        with self._lock:
            if self._start is None:
                self._start = time.perf_counter()

    def stop(self) -> None:
        """The loader closed: the wall clock stops (the rate of a closed loader fell as time went by)."""
        with self._lock:
            if self._start is not None and self._stop is None:
                self._stop = time.perf_counter()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._seconds[stage] += seconds

    def count_batch(self) -> None:
        with self._lock:
            self._batches += 1

    def timer(self, stage: str) -> "_Timer":
        """Context manager adding the time spent inside it to ``stage``."""
        return _Timer(self, stage)

    def report(self) -> ProfileReport:
        with self._lock:
            end = time.perf_counter() if self._stop is None else self._stop
            elapsed = 0.0 if self._start is None else end - self._start
            return ProfileReport(seconds=dict(self._seconds), batches=self._batches, elapsed=elapsed,
                                 threads=self._threads)


class _Timer:
    __slots__ = ("_profile", "_stage", "_start")

    def __init__(self, profile: Profile, stage: str) -> None:
        self._profile = profile
        self._stage = stage

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self._profile.add(self._stage, time.perf_counter() - self._start)
