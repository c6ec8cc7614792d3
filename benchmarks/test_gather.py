"""pytest-benchmark suite of the gather kernels and the loader on the standard task.

Run (timings):            python -m pytest benchmarks -q --benchmark-enable
Run (correctness only):   python -m pytest benchmarks -q        (each benchmark body runs once)

Standard task: a batch of 8 windows of (32, 128, 128) from a (96, 384, 384) in-memory volume, random corners,
each with one of the 16 anisotropic transforms; uint8 raw -> float32 (``x * scale + shift``), uint64 labels.
Rows of one group do the same work, so compare them within the group:

* ``gather-raw``:    emfast ``gather_convert`` | NumPy reference | ``np.copyto`` of the float32 output (floor)
* ``gather-labels``: emfast ``gather_copy``    | NumPy reference | ``np.copyto`` of the uint64 output (floor)
* ``loader``:        20 batches from a running ``Loader(threads=1)`` | the same with ``threads=2``
"""
from __future__ import annotations

import numpy as np
import pytest

import emfast

LOADER_BATCHES = 20  # batches pulled per timed round


# -- gather-raw -------------------------------------------------------------------------------------------------

@pytest.mark.benchmark(group="gather-raw")
def test_raw_emfast(benchmark, workload, next_plan):
    out = workload.new_raw_out()
    for plan in workload.plans[:2]:  # never time a broken kernel
        np.testing.assert_array_equal(workload.kernel_raw(plan, out), workload.reference_raw(plan))
    benchmark(lambda: workload.kernel_raw(next_plan(), out))


@pytest.mark.benchmark(group="gather-raw")
def test_raw_numpy_reference(benchmark, workload, next_plan):
    result = benchmark(lambda: workload.reference_raw(next_plan()))
    assert result.shape == workload.out_shape and result.dtype == np.float32


@pytest.mark.benchmark(group="gather-raw")
def test_raw_copyto_floor(benchmark, workload):
    src, dst = workload.new_raw_out(), workload.new_raw_out()
    benchmark(np.copyto, dst, src)


# -- gather-labels ----------------------------------------------------------------------------------------------

@pytest.mark.benchmark(group="gather-labels")
def test_labels_emfast(benchmark, workload, next_plan):
    out = workload.new_labels_out()
    for plan in workload.plans[:2]:
        np.testing.assert_array_equal(workload.kernel_labels(plan, out), workload.reference_labels(plan))
    benchmark(lambda: workload.kernel_labels(next_plan(), out))


@pytest.mark.benchmark(group="gather-labels")
def test_labels_numpy_reference(benchmark, workload, next_plan):
    result = benchmark(lambda: workload.reference_labels(next_plan()))
    assert result.shape == workload.out_shape and result.dtype == np.uint64


@pytest.mark.benchmark(group="gather-labels")
def test_labels_copyto_floor(benchmark, workload):
    src, dst = workload.new_labels_out(), workload.new_labels_out()
    benchmark(np.copyto, dst, src)


# -- loader -----------------------------------------------------------------------------------------------------

@pytest.mark.benchmark(group="loader")
@pytest.mark.parametrize("threads", [1, 2])
def test_loader(benchmark, workload, threads):
    raw, labels = workload.raw[0], workload.labels[0]
    with emfast.Loader(raw, labels, patch=workload.patch, batch_size=workload.batch,
                       augment=[emfast.Mirror(), emfast.Transpose()], threads=threads, seed=0,
                       normalize=(2.0 / 255.0, -1.0)) as loader:
        first = loader.next_batch()  # started and producing before the clock runs
        assert first["raw"].shape == workload.out_shape and first["raw"].dtype == np.float32
        assert first["labels"].dtype == np.uint64

        def pull():
            for _ in range(LOADER_BATCHES):
                loader.next_batch()

        benchmark.pedantic(pull, rounds=6, iterations=1, warmup_rounds=1)
        if benchmark.stats is not None:  # None when run with --benchmark-disable
            benchmark.extra_info["batches_per_round"] = LOADER_BATCHES
            benchmark.extra_info["batches_per_s"] = LOADER_BATCHES / benchmark.stats.stats.median
