"""``emfast bench``: emfast against a NumPy pipeline, a PyTorch ``DataLoader`` and the memory-bandwidth floor.

The standard task, on the built-in volume (:func:`emfast.io.demo_volume_path`, held in memory): batches
of 8 windows of (32, 128, 128) at uniformly random positions, each mirrored along z, y, x (p = 0.5 each) and
transposed y<->x (p = 0.5); uint8 raw -> float32 in [0, 1] with a random intensity gain (1 +- 0.1) and bias
(+- 0.1); uint64 labels -> 3 nearest-neighbour affinities (``emfast.Affinities()``) and their mask. Rows:

* emfast ``Loader(..., targets=[Affinities()])`` with ``threads=1`` and ``threads=N`` (N = all cores);
* the NumPy reference (:mod:`emfast.bench._reference`), one thread;
* a PyTorch ``DataLoader`` with ``num_workers=N`` over the same NumPy code as a ``Dataset`` (if torch is there);
* the memory-bandwidth floor: one ``np.copyto`` of as many bytes as the task's outputs (raw, affinities, mask).

Every row streams batches for a fixed time; the rows run in interleaved rounds (the order rotates every round)
and each row's best round counts, so drifts on a shared machine hit all rows alike. Ratios are times per batch
divided by emfast's (threads=N) from the same run. Then curves: emfast throughput against threads, cubic patch
size and batch size, and peak RSS against the number of ring slots.

Nothing is left running: loaders are closed and ``DataLoader`` workers shut down on every exit path, Ctrl-C
included.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .. import __version__
from .._checks import integer, triple
from .._machine import available_bytes, cores, read_proc_field
from ..augment import Intensity, Mirror, Transpose
from ..io import LABELS_DATASET, RAW_DATASET, Volume, demo_volume_path, hdf5
from ..pipeline import Loader
from ..pipeline._profile import STAGES
from ..pipeline._rng import check_seed
from ..targets import Affinities
from . import _reference as reference

SCHEMA = "emfast-bench/1"
MiB = 2**20
GiB = 2**30

#: The built-in volume of the benchmark: deep enough in z for the 128^3 point of the patch curve.
VOLUME_SHAPE = (144, 384, 384)
PATCH = (32, 128, 128)
BATCH = 8
#: emfast (threads = N) must be at least this many times faster than the PyTorch DataLoader and NumPy rows...
TARGET_SPEEDUP = 5.0
#: ... and take at most this many times the copy floor's time per batch.
TARGET_FLOOR_RATIO = 2.0
SEED = 0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the machine -------------------------------------------------------------------------------------------------

def rss_bytes() -> int:
    """Resident set size of this process now (VmRSS), in bytes."""
    value = read_proc_field("/proc/self/status", "VmRSS")
    if value is not None:
        return int(value.split()[0]) * 1024
    import resource  # fallback: peak RSS only (kB on Linux), better than nothing
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def machine_info() -> dict:
    """CPU model, cores, memory, load and software versions: the header of every benchmark report."""

    mem = read_proc_field("/proc/meminfo", "MemTotal")
    try:
        load = tuple(round(v, 2) for v in os.getloadavg())
    except OSError:
        load = None
    return {
        "cpu": read_proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": cores(),
        "memory_gib": round(int(mem.split()[0]) / 2**20, 1) if mem else None,
        "load_average": load,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "emfast": __version__,
        "platform": sys.platform,
    }


def _torch_version() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def _child_pids() -> List[int]:
    """Live child processes of this process."""
    pids = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
    except OSError:
        pids.update(child.pid for child in multiprocessing.active_children())
    return sorted(pids)


def leftovers(threads_before: Sequence[threading.Thread], children_before: Sequence[int]) -> dict:
    """Threads and child processes started since ``threads_before`` and ``children_before`` were taken and still
    alive (should be none). Only what started since counts: a process the caller had running before, such as
    multiprocessing's resource tracker, is not the benchmark's."""
    threads = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    return {"threads": threads, "processes": [pid for pid in _child_pids() if pid not in children_before]}


# -- settings and their checks -----------------------------------------------------------------------------------

@dataclass
class Settings:
    """What one ``emfast bench`` run measures. Build with :func:`settings`, which checks every value.

    Attributes
    ----------
    patch, batch_size, threads, volume_shape
        The main rows' task and emfast threads / DataLoader workers.
    seconds, rounds
        Time per row and round, and interleaved rounds of the comparison.
    curve_seconds, curves
        Time per curve point (split over two passes), and whether to measure the curves at all.
    thread_curve, patch_curve, batch_curve, slot_curve
        The curves' points: thread counts, cubic patch edges, batch sizes, ring slots.
    quick, seed, cache_dir, json, plot
        Smoke-run defaults, seed of every draw, built-in volume cache, and the output files (None: none).
    """

    patch: tuple
    batch_size: int
    threads: int
    volume_shape: tuple
    seconds: float
    rounds: int
    curve_seconds: float
    curves: bool
    thread_curve: tuple
    patch_curve: tuple
    batch_curve: tuple
    slot_curve: tuple
    quick: bool
    seed: int
    cache_dir: Optional[str]
    json: Optional[str]
    plot: Optional[str]


#: --quick: a small volume, small batches and short measurements, for tests and CI (seconds, not minutes).
QUICK = {"patch": (16, 48, 48), "batch_size": 4, "volume_shape": (40, 96, 96), "seconds": 0.15, "rounds": 1,
         "curve_seconds": 0.1}


def _check_output(path: Optional[str], option: str, suffix: Optional[str] = None) -> Optional[str]:
    """Fail now, not after minutes of measuring, if ``path`` cannot be written."""
    if path is None:
        return None
    target = Path(path)
    if not str(path).strip() or target.is_dir():
        raise ValueError(f"{option}: needs a file path, got {path!r}")
    if suffix is not None and target.suffix.lower() != suffix:
        raise ValueError(f"{option}: the file name must end in {suffix}, got {path!r}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as error:
        raise ValueError(f"{option}: cannot write to the folder {str(target.parent)!r}: {error}") from None
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{option}: {path!r} is not writable")
    return str(target)


def slot_bytes(patch: Sequence[int], batch_size: int) -> int:
    """Bytes of one batch of the standard task as the loader delivers it (``keep_labels=False``): raw float32,
    3 affinities float32 and their uint8 mask."""
    return output_bytes(patch, batch_size)


def output_bytes(patch: Sequence[int], batch_size: int) -> int:
    """Bytes of the standard task's outputs per batch (raw float32, 3 affinities float32, 3 mask uint8): what
    every row produces, and what the copy floor copies."""
    return batch_size * int(np.prod(patch)) * (4 + 3 * 4 + 3 * 1)


def _run_bytes(patch: Sequence[int], batch_size: int, threads: int) -> int:
    """Memory a measurement of this size needs on top of the volumes: the loader's slots (the default
    ``threads + 2``) and per-thread label scratch, or the reference's batch and the copy floor's two buffers,
    whichever is larger."""
    slots = (threads + 2) * slot_bytes(patch, batch_size)
    grown = tuple(p + 2 * m for p, m in zip(patch, reference.MARGIN))
    scratch = threads * batch_size * int(np.prod(grown)) * 8
    return max(slots + scratch, 2 * output_bytes(patch, batch_size) + batch_size * int(np.prod(grown)) * 8)


def _fits(patch: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a window and its label margin fit the volume for every transform (y and x may swap)."""
    m = 2 * max(reference.MARGIN)
    return patch[0] + m <= shape[0] and max(patch[1], patch[2]) + m <= min(shape[1], shape[2])


def _default_curves(threads: int, quick: bool) -> dict:
    if quick:
        return {"thread_curve": tuple(sorted({1, threads})), "patch_curve": (8, 16),
                "batch_curve": (1, 2), "slot_curve": (2, 3)}
    if threads <= 4:  # every count up to twice the cores: the knee and the oversubscribed plateau
        thread_points = set(range(1, 2 * threads + 1))
    else:
        thread_points = {2 ** k for k in range(int(math.log2(2 * threads)) + 1)} | {threads}
    return {"thread_curve": tuple(sorted(thread_points)), "patch_curve": (16, 32, 64, 128),
            "batch_curve": (1, 2, 4, 8, 16, 32), "slot_curve": (2, 3, 4, 6, 8)}


def settings(*, patch=None, batch_size=None, threads=None, volume_shape=None, seconds=None, rounds=None,
             curves: bool = True, quick: bool = False, seed: int = SEED, cache_dir=None, json_path=None,
             plot=None) -> Settings:
    """Checked settings of a run: every size positive, the patch (with the affinities' margin) inside the
    volume, the run's memory available, the output paths writable, matplotlib there for a plot.

    Values left None take the standard task's (or, with ``quick``, the quick run's) defaults.

    Raises
    ------
    ValueError
        Naming the offending option.
    """
    defaults = QUICK if quick else {}
    patch = triple(patch if patch is not None else defaults.get("patch", PATCH), "--patch", minimum=1)
    batch_size = integer(batch_size if batch_size is not None else defaults.get("batch_size", BATCH), "--batch-size")
    threads = integer(threads if threads is not None else cores(), "--threads")
    shape = triple(volume_shape if volume_shape is not None else defaults.get("volume_shape", VOLUME_SHAPE),
                   "--volume-shape", minimum=8)
    seconds = float(seconds if seconds is not None else defaults.get("seconds", 1.5))
    if not 0 < seconds <= 600:
        raise ValueError(f"--seconds must be in (0, 600], got {seconds}")
    rounds = integer(rounds if rounds is not None else defaults.get("rounds", 3), "--rounds")
    seed = check_seed(seed)
    if not _fits(patch, shape):
        raise ValueError(f"--patch {patch} plus the affinities' margin of {max(reference.MARGIN)} voxel on each "
                         f"side does not fit in the volume {shape} (y and x may be transposed, so both must fit "
                         f"min(Y, X) = {min(shape[1:])})")
    need = _run_bytes(patch, batch_size, threads) + int(np.prod(shape)) * 9
    available = available_bytes()
    if available is not None and need > 0.8 * available:
        raise ValueError(f"--patch {patch} with --batch-size {batch_size} and --threads {threads} needs about "
                         f"{need / GiB:.1f} GiB (ring slots, volumes, reference batches), more than the "
                         f"{available / GiB:.1f} GiB available")
    json_path = _check_output(json_path, "--json")
    if plot is not None:
        plot = _check_output(plot, "--plot", ".png")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                             "(or emfast[plot])") from None
    return Settings(patch=patch, batch_size=batch_size, threads=threads, volume_shape=shape, seconds=seconds,
                    rounds=rounds, curve_seconds=defaults.get("curve_seconds", max(0.3, seconds / 2)),
                    curves=curves, quick=quick, seed=seed, cache_dir=cache_dir, json=json_path, plot=plot,
                    **_default_curves(threads, quick))


# -- the pipelines -------------------------------------------------------------------------------------------------

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


def _stream(produce: Callable[[], object], seconds: float, warmup: int = 2, min_batches: int = 3) -> Measurement:
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


def _stage_ms(before, after, batches: int) -> Dict[str, float]:
    return {stage: 1e3 * (after.seconds[stage] - before.seconds[stage]) / batches for stage in after.seconds}


def measure_emfast(volumes: Volumes, patch, batch_size: int, threads: int, seconds: float,
                   seed: int = SEED) -> Measurement:
    """Batches/s of a running emfast loader (start-up and warm-up excluded), with its per-stage profile."""
    with emfast_loader(volumes, patch, batch_size, threads, seed=seed) as loader:
        loader.next_batch()
        before = loader.profile
        result = _stream(loader.next_batch, seconds, warmup=1)
        result.profile_ms = _stage_ms(before, loader.profile, result.batches)
    return result


def measure_numpy(volumes: Volumes, patch, batch_size: int, seconds: float, seed: int = SEED) -> Measurement:
    """Batches/s of the single-threaded NumPy reference."""
    rng = np.random.default_rng(seed)
    raw, labels = volumes.raw_array, volumes.labels_array

    def produce():
        return reference.reference_batch(raw, labels, reference.draw_examples(rng, batch_size, patch, raw.shape),
                                         patch)

    return _stream(produce, seconds, warmup=1)


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
        return _stream(produce, seconds, warmup=workers + 1)


def measure_copy(nbytes: int, seconds: float) -> Measurement:
    """Copies/s of ``np.copyto`` between two buffers of ``nbytes`` (pages mapped before timing)."""
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.zeros(nbytes, dtype=np.uint8)
    return _stream(lambda: np.copyto(target, source), seconds)


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# -- the comparison ----------------------------------------------------------------------------------------------

def _rows(config: Settings) -> Dict[str, dict]:
    n = config.threads
    rows = {
        "emfast": {"label": f"emfast, threads={n}", "method": "emfast", "threads": n},
        "emfast_1": {"label": "emfast, threads=1", "method": "emfast", "threads": 1},
        "numpy": {"label": "NumPy reference, 1 thread", "method": "numpy", "threads": 1},
        "torch": {"label": f"PyTorch DataLoader, num_workers={n}", "method": "torch", "threads": n},
        "copy": {"label": f"copy floor: np.copyto {output_bytes(config.patch, config.batch_size) / MiB:.1f} MiB",
                 "method": "copy", "threads": 1},
    }
    if n == 1:
        del rows["emfast_1"]
    return rows


def compare(volumes: Volumes, config: Settings, record: "Record") -> dict:
    """The table: every row measured ``rounds`` times, interleaved; each row's best round counts. Every round
    goes to ``record`` as soon as it is measured."""
    rows = _rows(config)
    skipped = {}
    if not torch_available():
        skipped["torch"] = "skipped: torch not installed"
    patch, batch = config.patch, config.batch_size
    measures = {
        "emfast": lambda: measure_emfast(volumes, patch, batch, config.threads, config.seconds, seed=config.seed),
        "emfast_1": lambda: measure_emfast(volumes, patch, batch, 1, config.seconds, seed=config.seed),
        "numpy": lambda: measure_numpy(volumes, patch, batch, config.seconds, seed=config.seed),
        "torch": lambda: measure_torch(volumes, patch, batch, config.threads, config.seconds, seed=config.seed),
        "copy": lambda: measure_copy(output_bytes(patch, batch), config.seconds),
    }
    names = [name for name in rows if name not in skipped]
    runs: Dict[str, List[Measurement]] = {name: [] for name in names}
    for round_ in range(config.rounds):
        shift = round_ % len(names)  # rotate the order so drifts and neighbours hit every row alike
        for name in names[shift:] + names[:shift]:
            result = measures[name]()
            runs[name].append(result)
            record.measured({"stage": "comparison", "row": name, "label": rows[name]["label"],
                             "round": round_ + 1, "batches": result.batches, "seconds": result.seconds,
                             "batches_per_s": result.batches_per_s})
    voxels = batch * int(np.prod(patch))
    best_emfast = max(runs["emfast"], key=lambda m: m.batches_per_s)
    for name, row in rows.items():
        if name in skipped:
            row.update(skipped=skipped[name], batches_per_s=None, voxels_per_s=None, ms_per_batch=None,
                       ratio_to_emfast=None, rounds=[])
            continue
        best = max(runs[name], key=lambda m: m.batches_per_s)
        row.update(skipped=None, batches=best.batches, seconds=best.seconds, cpu_cores=best.cpu_cores,
                   batches_per_s=best.batches_per_s,
                   voxels_per_s=best.batches_per_s * voxels, ms_per_batch=best.ms_per_batch,
                   # time per batch of this row / emfast's: > 1 means emfast is faster
                   ratio_to_emfast=best.ms_per_batch / best_emfast.ms_per_batch,
                   rounds=[{"batches": m.batches, "seconds": m.seconds} for m in runs[name]])
        if best.profile_ms is not None:
            row["profile_ms_per_batch"] = best.profile_ms
    return rows


def targets(rows: Dict[str, dict], config: Settings) -> List[dict]:
    """The issue's targets, each PASS, MISS or SKIP."""
    n = config.threads
    result = []
    for name, what in (("torch", f"PyTorch DataLoader ({n} workers)"), ("numpy", "the NumPy reference")):
        ratio = rows[name]["ratio_to_emfast"]
        result.append({"name": f"emfast ({n} threads) speed-up vs {what}", "measured": ratio,
                       "target": f">= {TARGET_SPEEDUP:g}x",
                       "result": "SKIP" if ratio is None else "PASS" if ratio >= TARGET_SPEEDUP else "MISS"})
    floor = 1.0 / rows["copy"]["ratio_to_emfast"]
    result.append({"name": f"emfast ({n} threads) time / copy floor", "measured": floor,
                   "target": f"<= {TARGET_FLOOR_RATIO:g}",
                   "result": "PASS" if floor <= TARGET_FLOOR_RATIO else "MISS"})
    return result


# -- the curves ----------------------------------------------------------------------------------------------------

def _peak_reset() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return read_proc_field("/proc/self/status", "VmHWM") is not None


def _rss_probe(request: dict) -> dict:
    """In a fresh process: load the volume, then run a loader with ``request["slots"]`` slots; peak RSS."""
    volumes = load_volumes(request["volume_shape"], request["cache_dir"])
    try:
        baseline = rss_bytes()
        exact = _peak_reset()
        sampled = [baseline]
        with emfast_loader(volumes, request["patch"], request["batch_size"], request["threads"],
                           buffers=request["slots"], seed=request["seed"]) as loader:
            count, start = 0, time.perf_counter()
            while count < 3 or time.perf_counter() - start < request["seconds"]:
                loader.next_batch()
                sampled.append(rss_bytes())
                count += 1
            slots_total = loader.buffers * loader.slot_bytes
    finally:
        volumes.close()
    peak = int(read_proc_field("/proc/self/status", "VmHWM").split()[0]) * 1024 if exact else max(sampled)
    return {"slots": request["slots"], "threads": request["threads"], "patch": list(request["patch"]),
            "batch_size": request["batch_size"], "batches": count, "rss_before": baseline, "peak_rss": peak,
            "peak_growth": peak - baseline, "slot_bytes_total": slots_total,
            "peak_from": "VmHWM" if exact else "VmRSS sampled after every batch"}


#: What the fresh process of :func:`rss_point` runs: the probe imported from this very module, so that a move or
#: rename cannot break it unseen.
PROBE_CODE = (f"import json, sys; from {__name__} import _rss_probe; "
              "print(json.dumps(_rss_probe(json.loads(sys.argv[1]))))")


def rss_point(config: Settings, slots: int) -> dict:
    """Peak RSS of a fresh process that loads the volume and streams from a loader with ``slots`` slots (the
    run's patch, batch size and threads), and its growth over the same process before the loader started. A
    fresh process, because memory freed by earlier measurements and kept by the allocator would blur the figures."""
    request = {"volume_shape": list(config.volume_shape), "cache_dir": config.cache_dir, "patch": list(config.patch),
               "batch_size": config.batch_size, "threads": config.threads, "slots": slots,
               "seconds": config.curve_seconds, "seed": config.seed}
    seconds = config.curve_seconds
    # run() kills the child on any exception here, Ctrl-C included
    done = subprocess.run([sys.executable, "-c", PROBE_CODE, json.dumps(request)], capture_output=True, text=True,
                          timeout=120 + 10 * seconds)
    if done.returncode != 0:
        raise RuntimeError(f"the RSS measurement with {slots} slots failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def curves(volumes: Volumes, config: Settings, record: "Record") -> dict:
    """emfast batches/s and voxels/s against threads, patch size and batch size; peak RSS against slots. Every
    point of every pass goes to ``record`` as soon as it is measured.

    Each throughput curve is measured in two passes, forwards and backwards, of half the time per point; a
    point's better pass counts, so a busy moment of the machine does not bend one curve's shape.
    """
    seconds, patch, batch, n = config.curve_seconds / 2, config.patch, config.batch_size, config.threads
    available = available_bytes()

    def skip_reason(patch_, batch_, threads) -> Optional[str]:
        if not _fits(patch_, volumes.shape):
            return f"patch {tuple(patch_)} with its margin does not fit the volume {volumes.shape}"
        need = _run_bytes(patch_, batch_, threads)
        if available is not None and need > 0.5 * available:
            return f"needs {need / GiB:.1f} GiB, {available / GiB:.1f} GiB available"
        return None

    def curve(name: str, settings_: List[tuple], floor: bool) -> List[dict]:
        entries = [{"patch": list(p), "batch_size": b, "threads": t} for p, b, t in settings_]
        for entry in entries:
            reason = skip_reason(entry["patch"], entry["batch_size"], entry["threads"])
            if reason:
                entry["skipped"] = reason
        live = [entry for entry in entries if "skipped" not in entry]
        for pass_, entry in [(1, e) for e in live] + [(2, e) for e in live[::-1]]:
            m = measure_emfast(volumes, entry["patch"], entry["batch_size"], entry["threads"], seconds,
                               seed=config.seed)
            record.measured({"stage": "curve", "curve": name, "pass": pass_, "patch": entry["patch"],
                             "batch_size": entry["batch_size"], "threads": entry["threads"],
                             "batches_per_s": m.batches_per_s})
            if m.batches_per_s > entry.get("batches_per_s", 0.0):
                voxels = entry["batch_size"] * int(np.prod(entry["patch"]))
                entry.update(batches_per_s=m.batches_per_s, voxels_per_s=m.batches_per_s * voxels,
                             ms_per_batch=m.ms_per_batch)
        if floor:
            for entry in live:
                c = measure_copy(output_bytes(entry["patch"], entry["batch_size"]), seconds)
                record.measured({"stage": "curve", "curve": f"{name} copy floor", "patch": entry["patch"],
                                 "batch_size": entry["batch_size"], "batches_per_s": c.batches_per_s})
                entry.update(copy_voxels_per_s=c.batches_per_s * entry["voxels_per_s"] / entry["batches_per_s"],
                             vs_copy=entry["ms_per_batch"] / c.ms_per_batch)
        return entries

    result = {}
    log(f"curve: threads {list(config.thread_curve)}")
    result["threads"] = curve("threads", [(patch, batch, t) for t in config.thread_curve], floor=False)
    log(f"curve: cubic patches {list(config.patch_curve)}")
    result["patch"] = curve("patch", [((s, s, s), batch, n) for s in config.patch_curve], floor=True)
    log(f"curve: batch sizes {list(config.batch_curve)}")
    result["batch_size"] = curve("batch_size", [(patch, b, n) for b in config.batch_curve], floor=True)
    log(f"curve: ring slots {list(config.slot_curve)} (one fresh process each)")
    result["slots"] = []
    for slots in config.slot_curve:
        result["slots"].append(rss_point(config, slots))
        record.measured({"stage": "curve", "curve": "slots", **result["slots"][-1]})
    return result


# -- the report ----------------------------------------------------------------------------------------------------

def _fmt_ratio(ratio: Optional[float]) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


def explain(rows: Dict[str, dict], config: Settings, load_average) -> List[str]:
    """Where emfast's time goes: its per-stage profile (``loader.profile``) against the copy floor."""
    emfast = rows["emfast"]
    profile = dict(emfast["profile_ms_per_batch"])
    n, wall = config.threads, emfast["ms_per_batch"]
    wait = profile.pop("wait")
    profile.pop("ahead", None)  # read-ahead threads' time, not the producers': it has no share of n x wall
    # Producers are busy all the time when the consumer only takes batches: n threads x wall time per batch is
    # spent in the stages or between them (Python, handing batches over).
    other = max(0.0, n * wall - sum(profile.values()))
    lines = [f"where the time goes: emfast threads={n}, {wall:.2f} ms per batch, {emfast['cpu_cores']:.2f} cores "
             f"busy; loader.profile in ms per batch, summed over the {n} producer thread(s):"]
    for stage, ms in sorted(profile.items(), key=lambda item: -item[1]):
        if ms >= 0.005:
            lines.append(f"  {stage:<8} {ms:8.2f}  {STAGES[stage]}")
    lines.append(f"  {'other':<8} {other:8.2f}  outside the stages: Python, handing batches over")
    lines.append(f"  {'wait':<8} {wait:8.2f}  {STAGES['wait']}")
    copy_ms = rows["copy"]["ms_per_batch"]
    work = n * wall - profile.get("stall", 0.0)
    lines.append(f"  the producers work {work:.2f} ms per batch ({n} x {wall:.2f} ms, less stalls); one np.copyto of "
                 f"the task's outputs takes {copy_ms:.2f} ms.")
    if emfast["cpu_cores"] < 0.8 * min(n, cores()):
        lines.append(f"  WARNING: emfast's {n} threads kept only {emfast['cpu_cores']:.2f} cores busy (load average "
                     f"{load_average}): other processes held the CPU, repeat on a quiet machine")
    return lines


def tables(rows: Dict[str, dict], goals: List[dict]) -> List[str]:
    """The comparison table and the targets table of the report, from the ``rows`` and ``targets`` of a run's
    result (or of its JSON record: the README's tables are checked against the recorded run this way)."""
    lines = [f"{'row':<42} {'batches/s':>10} {'Mvoxel/s':>10} {'ms/batch':>10} {'/ emfast':>9}", "-" * 85]
    for row in rows.values():
        if row["skipped"]:
            lines.append(f"{row['label']:<42} {row['skipped']}")
            continue
        lines.append(f"{row['label']:<42} {row['batches_per_s']:10.1f} {row['voxels_per_s'] / 1e6:10.1f} "
                     f"{row['ms_per_batch']:10.2f} {_fmt_ratio(row['ratio_to_emfast']):>9}")
    lines += ["", f"{'target (same run)':<62} {'measured':>9} {'target':>8}  result", "-" * 89]
    for goal in goals:
        measured = "" if goal["measured"] is None else (f"{goal['measured']:.2f}x" if "speed-up" in goal["name"]
                                                        else f"{goal['measured']:.2f}")
        lines.append(f"{goal['name']:<62} {measured:>9} {goal['target']:>8}  {goal['result']}")
    return lines


def report(info: dict, config: Settings, volumes_path: str, rows: Dict[str, dict], goals: List[dict],
           curve: Optional[dict]) -> List[str]:
    """The text report."""
    lines: List[str] = []
    out = lines.append
    n = config.threads
    out(f"emfast bench{' --quick' if config.quick else ''}: the standard task")
    out(f"  volume: built-in {tuple(config.volume_shape)} uint8 raw + uint64 labels, in memory ({volumes_path})")
    out(f"  batch {config.batch_size} x {tuple(config.patch)}; random windows, mirror z/y/x + transpose y<->x; "
        f"raw uint8 -> float32 (x/255, gain 1+-{reference.INTENSITY[0]:g}, bias +-{reference.INTENSITY[1]:g}); "
        f"labels -> 3 nearest-neighbour affinities + mask")
    out(f"machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), {info['memory_gib']} GiB, "
        f"load average {info['load_average']}")
    out(f"software: Python {info['python']}, NumPy {info['numpy']}, PyTorch {info['torch'] or 'not installed'}, "
        f"emfast {info['emfast']}")
    out(f"timing: {config.rounds} interleaved round(s) of ~{config.seconds:g} s per row; best round per row; "
        f"ratio = time per batch / emfast's (threads={n})")
    out("")
    lines.extend(tables(rows, goals))
    missed = [goal["name"] for goal in goals if goal["result"] == "MISS"]
    out("")
    if missed:
        out(f"MISSED: {'; '.join(missed)}")
    lines.extend(explain(rows, config, info["load_average"]))
    if curve is not None:
        out("")
        out(f"scaling (emfast; best of two passes of ~{config.curve_seconds / 2:g} s per point):")
        out(f"  threads (batch {config.batch_size} x {tuple(config.patch)}):")
        for p in curve["threads"]:
            out(f"    threads={p['threads']:<3} {_point(p)}")
        out(f"  cubic patch (batch {config.batch_size}, threads={n}; copy = np.copyto of the outputs):")
        for p in curve["patch"]:
            out(f"    {p['patch'][0]:>4}^3      {_point(p)}")
        out(f"  batch size ({tuple(config.patch)}, threads={n}):")
        for p in curve["batch_size"]:
            out(f"    batch={p['batch_size']:<4}  {_point(p)}")
        out(f"  peak RSS against ring slots (batch {config.batch_size} x {tuple(config.patch)}, threads={n}):")
        for p in curve["slots"]:
            out(f"    slots={p['slots']:<3}  peak RSS {p['peak_rss'] / MiB:8.1f} MiB, +{p['peak_growth'] / MiB:7.1f} "
                f"MiB over the loader-less process (slots hold {p['slot_bytes_total'] / MiB:.1f} MiB)")
    return lines


def _point(p: dict) -> str:
    if "skipped" in p:
        return f"skipped: {p['skipped']}"
    text = f"{p['batches_per_s']:8.1f} batches/s {p['voxels_per_s'] / 1e6:8.1f} Mvoxel/s"
    if "vs_copy" in p:
        text += f"   time / copy {p['vs_copy']:.2f}"
    return text


def plot(path: str, config: Settings, rows: Dict[str, dict], curve: Optional[dict]) -> None:
    """The comparison bars and, if measured, the four scaling curves, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 5 if curve is not None else 1
    columns = min(panels, 3)
    figure, axes = plt.subplots((panels + columns - 1) // columns, columns, figsize=(5.2 * columns,
                                                                                       4.2 * ((panels + 2) // 3)),
                                squeeze=False)
    axes = axes.ravel()
    measured = [row for row in rows.values() if not row["skipped"]]
    ax = axes[0]
    values = [row["voxels_per_s"] / 1e6 for row in measured]
    colours = ["tab:blue" if row["method"] == "emfast" else "tab:grey" if row["method"] == "copy" else "tab:orange"
               for row in measured]
    bars = ax.barh([row["label"] for row in measured], values, color=colours)
    for bar, row in zip(bars, measured):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {row['ratio_to_emfast']:.2f}x time",
                va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Mvoxel/s (higher is better)")
    ax.set_title(f"batch {config.batch_size} x {tuple(config.patch)}")
    if curve is not None:
        def series(points, key):
            kept = [p for p in points if "skipped" not in p]
            return [p[key] for p in kept], kept

        xs, kept = series(curve["threads"], "threads")
        axes[1].plot(xs, [p["batches_per_s"] for p in kept], "o-")
        axes[1].set(xlabel="producer threads", ylabel="batches/s", title="emfast vs threads", xticks=xs)
        for ax, key, title, xlabel in ((axes[2], "patch", "vs cubic patch size", "patch edge (voxels)"),
                                       (axes[3], "batch_size", "vs batch size", "batch size")):
            points = [p for p in curve[key] if "skipped" not in p]
            xs = [p["patch"][0] if key == "patch" else p["batch_size"] for p in points]
            ax.plot(xs, [p["voxels_per_s"] / 1e6 for p in points], "o-", label="emfast")
            ax.plot(xs, [p["copy_voxels_per_s"] / 1e6 for p in points], "s--", color="tab:grey",
                    label="np.copyto of the outputs")
            ax.set_xscale("log", base=2)
            ax.set(xlabel=xlabel, ylabel="Mvoxel/s", title=f"emfast {title}")
            ax.legend(fontsize=8)
        slots = curve["slots"]
        axes[4].plot([p["slots"] for p in slots], [p["peak_growth"] / MiB for p in slots], "o-", label="peak RSS growth")
        axes[4].plot([p["slots"] for p in slots], [p["slot_bytes_total"] / MiB for p in slots], "s--",
                     color="tab:grey", label="slots x slot size")
        axes[4].set(xlabel="ring slots (buffers)", ylabel="MiB", title="peak RSS vs slots",
                    xticks=[p["slots"] for p in slots])
        axes[4].legend(fontsize=8)
    for ax in axes[1:panels]:
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[panels:]:
        ax.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def measurement_line(entry: dict) -> str:
    """One measurement of :class:`Record` as a line of text, as it is logged and as a failed run reports it."""
    if entry["stage"] == "comparison":
        return f"  round {entry['round']}: {entry['label']:<40} {entry['batches_per_s']:8.1f} batches/s"
    if entry["curve"] == "slots":
        return f"  curve slots={entry['slots']}: peak RSS {entry['peak_rss'] / MiB:.1f} MiB"
    where = f"batch {entry['batch_size']} x {tuple(entry['patch'])}"
    threads = f", threads={entry['threads']}" if "threads" in entry else ""
    pass_ = f", pass {entry['pass']}" if "pass" in entry else ""
    return f"  curve {entry['curve']}: {where}{threads}{pass_}: {entry['batches_per_s']:.1f} batches/s"


class Record:
    """The result of a run as it grows: every measurement is added, logged and (with a JSON path) written the
    moment it is taken, so that a run which fails or is interrupted late still leaves every number it measured.

    The JSON file is rewritten whole after each measurement (through a temporary file beside it, so it is never
    half written). ``"complete"`` stays false until the run ends; a failed run adds ``"error"``.

    Parameters
    ----------
    path : str, optional
        The ``--json`` file.
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self.result: dict = {"schema": SCHEMA, "complete": False, "measurements": []}

    def update(self, **values) -> None:
        """Set top-level entries of the result."""
        self.result.update(_jsonable(values))
        self.save()

    def measured(self, entry: dict) -> None:
        """One measurement, just taken."""
        self.result["measurements"].append(_jsonable(entry))
        log(measurement_line(entry))
        self.save()

    def failed(self, error: BaseException) -> None:
        """Note what stopped the run, keeping what was measured before."""
        self.update(error=f"{type(error).__name__}: {error}".strip())

    def save(self) -> None:
        if self.path is None:
            return
        temporary = f"{self.path}.partial"
        with open(temporary, "w") as f:
            json.dump(self.result, f, indent=1)
        os.replace(temporary, self.path)

    def partial_report(self) -> List[str]:
        """What a run that did not finish measured, and what stopped it."""
        measurements = self.result["measurements"]
        lines = [f"emfast bench stopped ({self.result.get('error', 'interrupted')}); "
                 f"{len(measurements)} measurement(s) taken before:"]
        lines.extend(measurement_line(entry) for entry in measurements)
        if self.path is not None:
            lines.append(f"every one of them is in {self.path}")
        return lines


def run(config: Settings, record: Optional[Record] = None) -> dict:
    """Measure everything ``config`` asks for; returns the result that ``--json`` writes.

    Each measurement goes to ``record`` as soon as it is taken; if the run fails, ``record`` keeps them and the
    error, and the exception is raised on.
    """
    record = record if record is not None else Record()
    threads_before, children_before = threading.enumerate(), _child_pids()
    info = machine_info()
    info["torch"] = _torch_version()
    record.update(machine=info, settings={key: value for key, value in asdict(config).items()
                                          if key not in ("json", "plot")})
    try:
        log(f"emfast bench: preparing the built-in volume {tuple(config.volume_shape)} ...")
        volumes = load_volumes(config.volume_shape, config.cache_dir)
        try:
            record.update(task=_task(volumes.path, config))
            started = time.perf_counter()
            log(f"comparison: {config.rounds} round(s) of ~{config.seconds:g} s per row ...")
            rows = compare(volumes, config, record)
            goals = targets(rows, config)
            record.update(rows=rows, targets=goals)
            curve = curves(volumes, config, record) if config.curves else None
            seconds = time.perf_counter() - started
        finally:
            volumes.close()
    except BaseException as error:
        record.failed(error)
        raise
    record.update(curves=curve, seconds=seconds, leftovers=leftovers(threads_before, children_before),
                  report=report(info, config, volumes.path, rows, goals, curve), complete=True)
    return record.result


def _task(volume_path: str, config: Settings) -> dict:
    """The standard task as the JSON record states it."""
    return {"volume": volume_path, "volume_shape": list(config.volume_shape), "patch": list(config.patch),
            "batch_size": config.batch_size, "raw": "uint8 -> float32, x/255, intensity gain/bias",
            "labels": "uint64 -> affinities (1,0,0) (0,1,0) (0,0,1) float32 + uint8 mask",
            "augment": "mirror z/y/x p=0.5, transpose y<->x p=0.5, intensity",
            "output_bytes": output_bytes(config.patch, config.batch_size)}


# -- the command line ----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``emfast bench``."""
    parser.add_argument("--patch", type=int, nargs=3, metavar=("Z", "Y", "X"),
                        help="patch size (default: 32 128 128; 16 48 48 with --quick)")
    parser.add_argument("--batch-size", type=int, help="examples per batch (default: 8; 4 with --quick)")
    parser.add_argument("--threads", type=int, help=f"emfast threads and DataLoader workers of the main rows "
                                                    f"(default: all cores, {cores()} here)")
    parser.add_argument("--seconds", type=float, help="time per row and round (default: 1.5; 0.15 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the comparison (default: 3; 1 with "
                                                   "--quick)")
    parser.add_argument("--no-curves", action="store_true", help="only the comparison table")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: small volume, patch and batch, short measurements")
    parser.add_argument("--json", metavar="FILE", help="also write every number to this JSON file")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the comparison and the curves (needs matplotlib)")
    parser.add_argument("--cache-dir", default=None,
                        help="where the built-in volume is cached (default: $EMFAST_CACHE_DIR or ~/.cache/emfast)")
    parser.add_argument("--volume-shape", type=int, nargs=3, metavar=("Z", "Y", "X"),
                        help="shape of the built-in volume (default: 144 384 384; 40 96 96 with --quick)")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed (default: %(default)s)")


def command(args: argparse.Namespace) -> int:
    """``emfast bench``: run, print the report, write the JSON and the plot if asked."""
    config = settings(patch=args.patch, batch_size=args.batch_size, threads=args.threads,
                      volume_shape=args.volume_shape, seconds=args.seconds, rounds=args.rounds,
                      curves=not args.no_curves, quick=args.quick, seed=args.seed, cache_dir=args.cache_dir,
                      json_path=args.json, plot=args.plot)
    record = Record(config.json)
    try:
        result = run(config, record)
    except BaseException:
        print("\n".join(record.partial_report()), flush=True)
        raise
    print("\n".join(result["report"]))
    left = result["leftovers"]
    if left["threads"] or left["processes"]:
        print(f"WARNING: still running after the benchmark: threads {left['threads']}, processes "
              f"{left['processes']}")
    if config.json:
        log(f"wrote {config.json}")
    if config.plot:
        plot(config.plot, config, result["rows"], result["curves"])
        log(f"wrote {config.plot}")
    return 0
