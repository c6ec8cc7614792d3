"""Benchmark of the warp kernels (emfast.augment._resample) against scipy.ndimage.map_coordinates.

Run (timings):            python -m pytest benchmarks/test_warp_benchmark.py -q --benchmark-enable
Run (correctness only):   python -m pytest benchmarks/test_warp_benchmark.py -q      (each benchmark body runs once)
Run (the 128^3 numbers):  python benchmarks/test_warp_benchmark.py [--reps N]

Task: one (128, 128, 128) output patch, rotated about z by a random angle (``Rotate()``) and deformed elastically
(``Elastic()``: control points every (4, 32, 32) voxels, jitter sigma (0, 2, 2)), read from a (160, 224, 224)
in-memory volume: uint8 raw -> float32 (``x * scale + shift``, trilinear) and uint64 labels (nearest voxel), one
thread. The baseline samples the very same coordinates (the kernel's own, from ``warp_coordinates``) with
``map_coordinates(order=1)`` for raw and ``order=0`` for labels; computing those coordinates is not timed for
scipy, so the ratio flatters scipy.

* ``warp-raw``:    emfast ``warp_raw``    | scipy ``map_coordinates(order=1)``
* ``warp-labels``: emfast ``warp_labels`` | scipy ``map_coordinates(order=0)``
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pytest
from scipy import ndimage

import emfast as ef
from emfast.augment import Params, _geometry, _resample

VOLUME = (160, 224, 224)
PATCH = (128, 128, 128)
SCALE, SHIFT = 2.0 / 255.0, -1.0
TARGET_MS, TARGET_RATIO = 20.0, 10.0


class WarpTask:
    """The volumes, one drawn warp, its coordinates and output buffers (pages touched before timing)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.raw = rng.integers(0, 256, (1,) + VOLUME, dtype=np.uint8)
        self.labels = rng.integers(0, 2 ** 40, (1,) + VOLUME, dtype=np.uint64)  # exact in scipy's float64
        augmentations = [ef.Rotate(), ef.Elastic().bind(PATCH)]
        params = Params.identity(1)
        for augmentation in augmentations:
            augmentation.apply(rng.random((1, augmentation.draws)), params)
        self.plan = _geometry.WarpPlan.from_params(params)
        self.centres = (np.array(VOLUME, dtype=np.float64)[None] - 1) / 2.0
        self.grid_args = dict(grid=self.plan.grid, grid_spacing=self.plan.grid_spacing,
                              grid_origin=self.plan.grid_origin)
        self.coordinates = _resample.warp_coordinates(PATCH, self.centres, self.plan.matrices, **self.grid_args)[0]
        self.raw_out = np.zeros((1, 1) + PATCH, np.float32)
        self.labels_out = np.zeros((1, 1) + PATCH, np.uint64)

    def emfast_raw(self) -> np.ndarray:
        return _resample.warp_raw([self.raw], self.centres, self.plan.matrices, self.raw_out, scale=[SCALE],
                             shift=[SHIFT], **self.grid_args)

    def emfast_labels(self) -> np.ndarray:
        return _resample.warp_labels([self.labels], self.centres, self.plan.matrices, self.labels_out, **self.grid_args)

    def scipy_raw(self) -> np.ndarray:
        sampled = ndimage.map_coordinates(self.raw[0], self.coordinates, order=1, output=np.float32,
                                          mode="constant")
        return sampled * np.float32(SCALE) + np.float32(SHIFT)

    def scipy_labels(self) -> np.ndarray:
        return ndimage.map_coordinates(self.labels[0], self.coordinates, order=0, mode="constant")


@pytest.fixture(scope="module")
def task() -> WarpTask:
    return WarpTask()


@pytest.mark.benchmark(group="warp-raw")
def test_warp_raw_emfast(benchmark, task):
    # scipy interpolates in float64 and rounds to float32 once; the kernel works in float32 throughout.
    np.testing.assert_allclose(task.emfast_raw()[0, 0], task.scipy_raw(), rtol=0, atol=1e-5)
    benchmark(task.emfast_raw)


@pytest.mark.benchmark(group="warp-raw")
def test_warp_raw_scipy(benchmark, task):
    benchmark(task.scipy_raw)


@pytest.mark.benchmark(group="warp-labels")
def test_warp_labels_emfast(benchmark, task):
    np.testing.assert_array_equal(task.emfast_labels()[0, 0], task.scipy_labels())
    benchmark(task.emfast_labels)


@pytest.mark.benchmark(group="warp-labels")
def test_warp_labels_scipy(benchmark, task):
    benchmark(task.scipy_labels)


def measure(task: WarpTask, reps: int) -> dict:
    """Median milliseconds per patch of each method over ``reps`` interleaved rounds (the order rotates)."""
    methods = {"emfast raw": task.emfast_raw, "emfast labels": task.emfast_labels,
               "scipy raw": task.scipy_raw, "scipy labels": task.scipy_labels}
    times = {name: [] for name in methods}
    names = list(methods)
    for method in methods.values():  # warm-up
        method()
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            started = time.perf_counter()
            methods[name]()
            times[name].append((time.perf_counter() - started) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15, help="interleaved rounds (default 15)")
    args = parser.parse_args()
    from emfast.bench import machine_info

    info = machine_info()
    print(f"machine: {info.get('cpu')}, {info.get('cores')} cores, load {info.get('load_average')}; "
          f"NumPy {np.__version__}")
    task = WarpTask()
    ms = measure(task, args.reps)
    emfast_ms = ms["emfast raw"] + ms["emfast labels"]
    scipy_ms = ms["scipy raw"] + ms["scipy labels"]
    print(f"128^3 rotation + elastic, one thread, median of {args.reps} interleaved rounds (ms per patch):")
    for part in ("raw", "labels"):
        print(f"  {part:<7} emfast {ms['emfast ' + part]:8.2f}   scipy {ms['scipy ' + part]:8.2f}   "
              f"ratio {ms['scipy ' + part] / ms['emfast ' + part]:6.1f}x")
    ratio = scipy_ms / emfast_ms
    print(f"  both    emfast {emfast_ms:8.2f}   scipy {scipy_ms:8.2f}   ratio {ratio:6.1f}x")
    print(f"target: emfast <= {TARGET_MS:g} ms: {'PASS' if emfast_ms <= TARGET_MS else 'MISS'}; "
          f">= {TARGET_RATIO:g}x scipy: {'PASS' if ratio >= TARGET_RATIO else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
