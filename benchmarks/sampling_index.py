"""How fast the samplers build their indexes, against NumPy baselines timed in the same run.

    python benchmarks/sampling_index.py [--size MVOXELS] [--reps N] [--json PATH]

Data: a uint64 label volume of ``--size`` Mi voxels (2**20; default 256; 1024 is the 1-gigavoxel, 8 GiB case and
needs about 10 GB of free memory), shaped (z, 1024, 1024), held in memory and made of random ids in boxes of
(4, 24, 24) voxels, so that both classes are common (about 57 % of the voxels are boundary voxels).

Measured, interleaved, ``--reps`` times each (the median is reported):

- ``balanced``: ``Balanced()`` (boundary vs interior, thickness 1) bound to the whole volume (window extent 1, so
  every voxel is indexed): one compiled pass without the GIL.
- ``numpy_balanced``: the same index (boundary classes, counts per 8 x 16 x 16 block, cumulative sums) in NumPy,
  slab by slab (32 sections), as a user would write it; its counts must equal emfast's.
- ``read_floor``: one NumPy reduction (``max``) over the labels: the cost of reading them once.
- ``masked``: ``Masked(0.5)`` on a uint8 mask of the same shape (a third of its voxels zero), window
  (8, 64, 64); with ``numpy_masked``, the same bitmap's window sums by a NumPy summed-area table per slab.

Times are reported per 100 million voxels, with ratios against the NumPy baselines, and the index size in bytes
per indexed voxel.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from _workload import machine_info

from emfast.sampling import Balanced, Masked, Region
from emfast.io import Volume

BOX = (4, 24, 24)
PLANE = (1024, 1024)
SLAB = 32
MASK_WINDOW = (8, 64, 64)


def make_labels(sections: int, seed: int = 0) -> np.ndarray:
    """Random ids in boxes of BOX, written slab by slab into one array (no full-size temporary)."""
    rng = np.random.default_rng(seed)
    labels = np.empty((sections,) + PLANE, dtype=np.uint64)
    for z in range(0, sections, BOX[0]):
        coarse = rng.integers(1, 2**40, (1, -(-PLANE[0] // BOX[1]), -(-PLANE[1] // BOX[2])), dtype=np.uint64)
        plane = coarse.repeat(BOX[1], 1).repeat(BOX[2], 2)[:, :PLANE[0], :PLANE[1]]
        labels[z:z + BOX[0]] = plane
    return labels


def make_mask(labels: np.ndarray) -> np.ndarray:
    mask = np.empty(labels.shape, dtype=np.uint8)
    for z in range(0, len(labels), SLAB):
        np.not_equal(labels[z:z + SLAB] % np.uint64(3), 0, out=mask[z:z + SLAB].view(bool))
    return mask


def region(labels=None, mask=None) -> Region:
    shape = (labels if labels is not None else mask).shape
    zero = np.zeros(3, np.int64)
    return Region("bench", 1.0, zero, np.asarray(shape, np.int64),
                  labels=None if labels is None else Volume.from_array(labels), labels_origin=zero,
                  mask=None if mask is None else Volume.from_array(mask), mask_origin=zero)


def emfast_balanced(labels: np.ndarray) -> Balanced:
    sampler = Balanced()
    sampler.bind([region(labels=labels)], np.ones((1, 3), np.int64), 8)
    return sampler


def numpy_balanced(labels: np.ndarray) -> np.ndarray:
    """Boundary-vs-interior counts per block, (2, blocks) cumulative, in NumPy slab by slab."""
    bz, by, bx = Balanced.block
    z_blocks, y_blocks, x_blocks = len(labels) // bz, labels.shape[1] // by, labels.shape[2] // bx
    counts = np.empty((z_blocks, y_blocks, x_blocks), dtype=np.int64)
    for z in range(0, len(labels), SLAB):
        stop = min(z + SLAB, len(labels))
        core = labels[z:stop]
        boundary = np.zeros(core.shape, dtype=bool)
        boundary[:, :, 1:] |= core[:, :, 1:] != core[:, :, :-1]
        boundary[:, :, :-1] |= core[:, :, :-1] != core[:, :, 1:]
        boundary[:, 1:] |= core[:, 1:] != core[:, :-1]
        boundary[:, :-1] |= core[:, :-1] != core[:, 1:]
        boundary[1:] |= core[1:] != core[:-1]
        boundary[:-1] |= core[:-1] != core[1:]
        if z > 0:
            boundary[0] |= core[0] != labels[z - 1]
        if stop < len(labels):
            boundary[-1] |= core[-1] != labels[stop]
        blocks = boundary.reshape(-1, bz, y_blocks, by, x_blocks, bx).sum(axis=(1, 3, 5))
        counts[z // bz:stop // bz] = blocks
    per_block = np.stack([counts.ravel(), bz * by * bx - counts.ravel()])
    return np.cumsum(per_block, axis=1)


def read_floor(labels: np.ndarray) -> int:
    return int(labels.max())


def emfast_masked(mask: np.ndarray) -> Masked:
    sampler = Masked(0.5)
    sampler.bind([region(mask=mask)], np.asarray([MASK_WINDOW]), 8)
    return sampler


def numpy_masked(mask: np.ndarray) -> np.ndarray:
    """Set bits per corner row of the same bitmap, from a summed-area table per slab of corner planes."""
    ez, ey, ex = MASK_WINDOW
    threshold = Masked(0.5).threshold(ez * ey * ex)
    rows = []
    for z in range(0, len(mask) - ez + 1, SLAB):
        stop = min(z + SLAB, len(mask) - ez + 1)
        table = np.pad(mask[z:stop + ez - 1].astype(np.int32), [(1, 0)] * 3).cumsum(0).cumsum(1).cumsum(2)
        sums = (table[ez:, ey:, ex:] - table[:-ez, ey:, ex:] - table[ez:, :-ey, ex:] - table[ez:, ey:, :-ex]
                + table[:-ez, :-ey, ex:] + table[:-ez, ey:, :-ex] + table[ez:, :-ey, :-ex]
                - table[:-ez, :-ey, :-ex])
        rows.append((sums >= threshold).sum(axis=2).ravel())
    return np.concatenate(rows)


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256, metavar="MVOXELS",
                        help="label volume size in units of 2**20 voxels (multiple of 8; default 256)")
    parser.add_argument("--reps", type=int, default=3, metavar="N", help="interleaved repetitions (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write every number to this JSON file")
    args = parser.parse_args()
    if args.size < 8 or args.size % 8:
        parser.error(f"--size must be a positive multiple of 8, got {args.size}")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")

    sections = args.size * 2**20 // (PLANE[0] * PLANE[1])
    labels = make_labels(sections)
    mask = make_mask(labels)
    voxels = labels.size
    print(f"labels {labels.shape} uint64 ({labels.nbytes / 2**30:.1f} GiB), mask uint8, "
          f"{voxels / 1e6:.0f} Mvoxel")

    times = {name: [] for name in ("balanced", "numpy_balanced", "read_floor", "masked", "numpy_masked")}
    for _ in range(args.reps):
        elapsed, balanced = timed(emfast_balanced, labels)
        times["balanced"].append(elapsed)
        elapsed, reference = timed(numpy_balanced, labels)
        times["numpy_balanced"].append(elapsed)
        times["read_floor"].append(timed(read_floor, labels)[0])
        elapsed, masked = timed(emfast_masked, mask)
        times["masked"].append(elapsed)
        elapsed, masked_reference = timed(numpy_masked, mask)
        times["numpy_masked"].append(elapsed)
        if not np.array_equal(balanced._classes[0].cumulative, reference):
            raise SystemExit("Balanced index differs from the NumPy reference")
        corners = masked._corners[0][0]
        if not np.array_equal(np.diff(corners.cumulative, prepend=0), masked_reference):
            raise SystemExit("Masked index differs from the NumPy reference")

    median = {name: statistics.median(values) for name, values in times.items()}
    per_100m = {name: value * 1e8 / voxels for name, value in median.items()}
    corner_count = int(np.prod([s - e + 1 for s, e in zip(mask.shape, MASK_WINDOW)]))
    result = {
        "machine": machine_info(),
        "voxels": voxels,
        "reps": args.reps,
        "seconds": times,
        "seconds_per_100_mvoxel": per_100m,
        "balanced_vs_numpy": median["numpy_balanced"] / median["balanced"],
        "balanced_vs_read_floor": median["balanced"] / median["read_floor"],
        "masked_vs_numpy": median["numpy_masked"] / median["masked"],
        "balanced_index_bytes_per_voxel": balanced.index_nbytes / voxels,
        "masked_index_bytes_per_corner": masked.index_nbytes / corner_count,
        "balanced_class_fractions": {name: count / voxels
                                     for name, count in balanced.class_counts()["bench"].items()},
    }
    print(f"Balanced index: {per_100m['balanced']:.3f} s per 100 Mvoxel "
          f"(NumPy {per_100m['numpy_balanced']:.3f} s: emfast {result['balanced_vs_numpy']:.1f}x faster; "
          f"{result['balanced_vs_read_floor']:.2f}x the time of one read pass, "
          f"{per_100m['read_floor']:.3f} s); index {result['balanced_index_bytes_per_voxel']:.4f} bytes/voxel")
    print(f"Masked index (window {MASK_WINDOW}): {per_100m['masked']:.3f} s per 100 Mvoxel "
          f"(NumPy {per_100m['numpy_masked']:.3f} s: emfast {result['masked_vs_numpy']:.1f}x faster); "
          f"index {result['masked_index_bytes_per_corner']:.4f} bytes/window position")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
