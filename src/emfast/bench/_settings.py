"""What one ``emfast bench`` run measures (:class:`Settings`, built and checked by :func:`settings`), the standard
task's defaults and targets, and the memory the task's batches take."""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .._checks import check_seed, integer, triple
from .._machine import available_bytes, cores
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
    if target.exists() and not _written_by_bench(target):  # --json in.h5 replaced the user's data file
        raise ValueError(f"{option}: {path!r} exists and is not recognised as emfast bench's (a results JSON, or a "
                         "plot marked as bench's: plots drawn before bench marked them carry no mark); emfast bench "
                         "replaces only its own results: give another name or move it away")
    return str(target)


#: The PNG text emfast bench writes into its plots (``Software``), by which it knows them again.
PLOT_SOFTWARE = "emfast bench"


def _written_by_bench(path: Path) -> bool:
    """Whether ``path`` is an earlier emfast bench JSON (its ``schema``) or plot (its PNG ``Software`` text)."""
    try:
        with open(path, "rb") as file:  # the start only: the file may be a data file of many GB
            head = file.read(1 << 16)
            whole = len(head) < (1 << 16) or (head.lstrip()[:1] == b"{" and file.seek(0, os.SEEK_END) < (64 << 20))
    except OSError:
        return False
    if head.startswith(b"\x89PNG"):
        return b"Software\x00" + PLOT_SOFTWARE.encode() in head
    if not whole:  # results JSON are small; anything else large is not ours
        return False
    try:
        schema = json.loads(path.read_text(encoding="utf-8")).get("schema", "")
    except (ValueError, AttributeError, UnicodeDecodeError, OSError, RecursionError):
        return False
    return isinstance(schema, str) and schema.startswith("emfast-bench/")


def slot_bytes(patch: Sequence[int], batch_size: int) -> int:
    """Bytes of one batch of the standard task as the loader delivers it (``keep_labels=False``): raw float32,
    3 affinities float32 and their uint8 mask."""
    return output_bytes(patch, batch_size)


def output_bytes(patch: Sequence[int], batch_size: int) -> int:
    """Bytes of the standard task's outputs per batch (raw float32, 3 affinities float32, 3 mask uint8): what
    every row produces, and what the copy floor copies."""
    return batch_size * int(np.prod(patch)) * (4 + 3 * 4 + 3 * 1)


def run_bytes(patch: Sequence[int], batch_size: int, threads: int) -> int:
    """Memory a measurement of this size needs on top of the volumes: the loader's slots (the default
    ``threads + 2``) and per-thread label scratch, or the reference's batch and the copy floor's two buffers,
    whichever is larger."""
    slots = (threads + 2) * slot_bytes(patch, batch_size)
    grown = tuple(p + 2 * m for p, m in zip(patch, reference.MARGIN))
    scratch = threads * batch_size * int(np.prod(grown)) * 8
    return max(slots + scratch, 2 * output_bytes(patch, batch_size) + batch_size * int(np.prod(grown)) * 8)


def fits(patch: Sequence[int], shape: Sequence[int]) -> bool:
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
    if not fits(patch, shape):
        raise ValueError(f"--patch {patch} plus the affinities' margin of {max(reference.MARGIN)} voxel on each "
                         f"side does not fit in the volume {shape} (y and x may be transposed, so both must fit "
                         f"min(Y, X) = {min(shape[1:])})")
    need = run_bytes(patch, batch_size, threads) + int(np.prod(shape)) * 9
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
