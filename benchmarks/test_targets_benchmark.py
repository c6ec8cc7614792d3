"""pytest-benchmark suite of the label -> target kernels.

Run (timings):            python -m pytest benchmarks/test_targets_benchmark.py -q --benchmark-enable
Run (correctness only):   python -m pytest benchmarks/test_targets_benchmark.py -q       (each benchmark body runs once)

Task: nearest-neighbour affinities (offsets (1, 0, 0), (0, 1, 0), (0, 0, 1)) with their mask, float32, of a batch
of 8 uint64 label patches of (34, 130, 130) cut with margin (1, 1, 1), i.e. outputs of 8 x 3 x (32, 128, 128).
Labels are blocks of 4 voxels of random ids with some background, like a neuron segmentation at low resolution.

* ``targets``: emfast ``_targets.affinities`` | the NumPy reference of tests/reference.py
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from emfast._core import targets as _targets

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

from reference import affinities_reference  # noqa: E402

SHAPE = (8, 1, 34, 130, 130)
MARGIN = (1, 1, 1)
OFFSETS = [(1, 0, 0), (0, 1, 0), (0, 0, 1)]


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 1 << 40, size=(SHAPE[0], 1) + tuple(-(-s // 4) for s in SHAPE[2:]), dtype=np.uint64)
    coarse[rng.random(coarse.shape) < 0.1] = 0  # background
    blocks = coarse.repeat(4, 2).repeat(4, 3).repeat(4, 4)
    return np.ascontiguousarray(blocks[(slice(None), slice(None)) + tuple(slice(s) for s in SHAPE[2:])])


def out_shape() -> tuple:
    return (SHAPE[0], len(OFFSETS)) + tuple(s - 2 * m for s, m in zip(SHAPE[2:], MARGIN))


@pytest.mark.benchmark(group="targets")
def test_affinities_emfast(benchmark, labels):
    out, mask = np.zeros(out_shape(), np.float32), np.zeros(out_shape(), np.uint8)  # pages mapped before timing
    _targets.affinities(labels, OFFSETS, MARGIN, 0, None, out, mask)
    expected, expected_mask = affinities_reference(labels, OFFSETS, MARGIN, 0, None, np.float32)
    np.testing.assert_array_equal(out, expected)  # never time a broken kernel
    np.testing.assert_array_equal(mask, expected_mask)
    benchmark(_targets.affinities, labels, OFFSETS, MARGIN, 0, None, out, mask)


@pytest.mark.benchmark(group="targets")
def test_affinities_numpy_reference(benchmark, labels):
    out, mask = benchmark(affinities_reference, labels, OFFSETS, MARGIN, 0, None, np.float32)
    assert out.shape == out_shape() and out.dtype == np.float32 and mask.dtype == np.uint8
