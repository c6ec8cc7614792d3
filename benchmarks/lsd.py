#!/usr/bin/env python
"""Local shape descriptors: emfast's LSD target against funkelab's lsds, and what LSDs cost a training batch.

    python benchmarks/lsd.py [--lsds-python PATH] [--batches N] [--json PATH] [--quick]

1. One example, one thread: the labels of one (32, 128, 128) window of the demo volume (serial-section EM
   neurites, voxel size (40, 8, 8) nm), LSDs for sigma = 80 and 160 nm. ``lsds``' ``get_local_shape_descriptors``
   runs in its own virtual environment (it needs gunpowder and zarr 2; see tests/reference_lsds/make_fixtures.py),
   in a subprocess of this run with one BLAS/OpenMP thread, on the same array; emfast's ``compute_targets`` computes
   the same (32, 128, 128) descriptors on this thread. Reported: seconds per example, the ratio (target >= 100x),
   the largest difference between the two and the voxels that differ by more than 0.01 (pearson channels where
   an object is one voxel thick along an axis: lsds' float32 rounding noise there, see emfast.LSD).
2. A training batch: the CPU time (this thread's, so other load on the machine inflates it less than wall time)
   of the LSDs of 8 random (32, 128, 128) windows cut with the loader's label margin; then
   ``Loader(threads=2, batch_size=8, patch=(32, 128, 128))`` on the (96, 384, 384) demo volume, default
   augmentations, with ``[Affinities()]`` and with ``[Affinities(), LSD(sigma=80 nm)]``: batches/s and the
   producers' per-stage profile.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.io._demo import XY_RESOLUTION_NM, make_em_volume  # noqa: E402
from _workload import machine_info  # noqa: E402

TARGET = 100.0
VOXEL_SIZE = (5 * XY_RESOLUTION_NM, XY_RESOLUTION_NM, XY_RESOLUTION_NM)
SIGMAS = (80.0, 160.0)

#: Run by the lsds environment's Python: time get_local_shape_descriptors on the saved segmentation.
LSDS_TIMER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from lsd.train.local_shape_descriptor import get_local_shape_descriptors
    segmentation_path, sigma, voxel_size, out_path = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    voxel_size = tuple(float(v) for v in voxel_size.split(","))
    segmentation = np.load(segmentation_path)
    start = time.perf_counter()
    lsds = get_local_shape_descriptors(segmentation, (sigma,) * 3, voxel_size=voxel_size)
    print(time.perf_counter() - start)
    np.save(out_path, lsds)
""")


def time_lsds(python, segmentation, sigma):
    """Seconds lsds takes for ``segmentation`` (one run, one thread) and its descriptors."""
    with tempfile.TemporaryDirectory() as folder:
        seg_path, out_path = os.path.join(folder, "segmentation.npy"), os.path.join(folder, "lsds.npy")
        np.save(seg_path, segmentation)
        one_thread = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        result = subprocess.run([python, "-c", LSDS_TIMER, seg_path, str(sigma), ",".join(map(str, VOXEL_SIZE)),
                                 out_path], capture_output=True, text=True, env=one_thread, check=True)
        return float(result.stdout.strip().splitlines()[-1]), np.load(out_path)


def time_emfast(segmentation, sigma, repeats):
    """Best seconds of ``repeats`` emfast LSD computations of ``segmentation`` on this thread, and the result."""
    target = ef.LSD(sigma=sigma, voxel_size=VOXEL_SIZE)
    labels = np.ascontiguousarray(segmentation[None, None])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = ef.compute_targets(labels, [target])
        best = min(best, time.perf_counter() - start)
    return best, out["lsd"][0]


def batch_cpu_seconds(labels, target, window, repeats=3):
    """Best CPU seconds of this thread for ``target`` on 8 random windows of ``labels`` cut with its margin."""
    margin = target.margin()
    grown = tuple(w + 2 * m for w, m in zip(window, margin))
    rng = np.random.default_rng(0)
    batch = np.empty((8, 1) + grown, dtype=labels.dtype)
    for n in range(8):
        corner = [int(rng.integers(0, s - g + 1)) for s, g in zip(labels.shape, grown)]
        batch[n, 0] = labels[tuple(slice(c, c + g) for c, g in zip(corner, grown))]
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        ef.compute_targets(batch, [target], margin)
        best = min(best, time.thread_time() - start)
    return best


def loader_rate(raw, labels, targets, batches):
    """Batches per second of a 2-thread loader with ``targets``, after its ring has filled once."""
    with ef.Loader(raw, labels, patch=(32, 128, 128), batch_size=8, threads=2, seed=1, targets=targets) as loader:
        for _ in range(loader.buffers):
            loader.next_batch()
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        return batches / (time.perf_counter() - start), loader.profile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--lsds-python", default="/tmp/lsdvenv/bin/python",
                        help="Python of a virtual environment with lsds installed (default /tmp/lsdvenv/bin/python)")
    parser.add_argument("--batches", type=int, default=12, help="timed loader batches (default 12)")
    parser.add_argument("--quick", action="store_true", help="small example and volume (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    shape, window = ((48, 192, 192), (16, 64, 64)) if args.quick else ((96, 384, 384), (32, 128, 128))
    raw, labels = make_em_volume(shape, seed=0)
    labels = labels.astype(np.uint64)
    corner = tuple((s - w) // 2 for s, w in zip(shape, window))
    example = np.ascontiguousarray(labels[tuple(slice(c, c + w) for c, w in zip(corner, window))])
    ids = len(np.unique(example))
    print(f"machine: {machine_info()}")
    print(f"example: labels {window} of the demo volume, {ids} ids, voxel size {VOXEL_SIZE} nm")
    results = {"machine": machine_info(), "window": window, "ids": ids, "voxel_size": VOXEL_SIZE, "examples": []}
    if not os.path.isfile(args.lsds_python):  # the comparison needs lsds; the batch rows below do not
        print(f"lsds: no Python at {args.lsds_python} (--lsds-python; see tests/reference_lsds/make_fixtures.py "
              "for the environment): the comparison with lsds is skipped")
    for sigma in SIGMAS if os.path.isfile(args.lsds_python) else ():
        lsds_s, expected = time_lsds(args.lsds_python, example, sigma)
        emfast_s, ours = time_emfast(example, sigma, repeats=5)
        difference = np.abs(ours - expected)
        error, beyond = float(difference.max()), int((difference > 0.01).any(axis=0).sum())
        ratio = lsds_s / emfast_s
        verdict = "PASS" if ratio >= TARGET else "MISS"
        print(f"sigma {sigma:g} nm: lsds {lsds_s:.2f} s, emfast {emfast_s * 1e3:.1f} ms: {ratio:.0f}x "
              f"(target >= {TARGET:.0f}x): {verdict}; largest |difference| {error:.4f}, "
              f"{beyond} of {example.size} voxels differ by > 0.01")
        results["examples"].append({"sigma": sigma, "lsds_s": lsds_s, "emfast_s": emfast_s, "ratio": ratio,
                                    "verdict": verdict, "max_abs_difference": error,
                                    "voxels_beyond_0.01": beyond})
    lsd = ef.LSD(sigma=SIGMAS[0], voxel_size=VOXEL_SIZE)
    print(f"training batch: Loader(threads=2, batch_size=8, patch=(32, 128, 128)), volume {shape}, "
          f"default augmentations, labels margin for {lsd}: {lsd.margin()}")
    cpu = batch_cpu_seconds(labels, lsd, window)
    print(f"LSDs of one batch of 8 windows with that margin: {cpu:.2f} s of CPU time on one thread "
          f"({cpu / 8 * 1e3:.0f} ms per example)")
    results["lsd_batch_cpu_s"] = cpu
    rates = {}
    for name, targets in (("affinities", [ef.Affinities()]), ("affinities + lsd", [ef.Affinities(), lsd])):
        rate, profile = loader_rate(raw, labels, targets, args.batches)
        rates[name] = rate
        print(f"{name}: {rate:.2f} batches/s\n{profile}")
    cost = 1 / rates["affinities + lsd"] - 1 / rates["affinities"]
    print(f"LSDs add {cost * 1e3:.0f} ms per batch of 8 with 2 threads "
          f"({rates['affinities + lsd'] / rates['affinities']:.2f}x the throughput without them)")
    results["batches_per_s"] = rates
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
