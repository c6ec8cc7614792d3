#!/usr/bin/env python
"""Issue 13's targets: lazy zarr reads scale with producer threads and come close to in-memory speed.

    python benchmarks/formats.py [--batches N] [--rounds R] [--json PATH] [--quick]

The standard task (8 x (32, 128, 128) from a (96, 384, 384) uint8 EM volume with uint64 labels, mirror and
transpose, 3 nearest-neighbour affinities) read lazily from a zarr v3 store (zstd, chunks (32, 128, 128)):

- cold: a chunk cache of 4 blocks, so most windows decode chunks; threads=2 against threads=1, alternating over
  rounds (target >= 1.7x on 2 cores), with lazy HDF5 (gzip, same chunks) for comparison;
- warm: the default budget, after every block was read once; against the same task in memory (target >= 0.7x);
- cold reads: the boxes of the same windows read by emfast's lazy volume (a fresh 4-block cache per round), by
  zarr-python directly (``array[box]``) and by tensorstore's zarr driver (cache off), one thread each.
Every ratio is against a baseline from the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

CHUNKS = (32, 128, 128)
#: Blocks the cold chunk caches hold: fewer than one batch's windows touch, so most windows decode chunks.
COLD_BLOCKS = 4
TARGET_THREADS, TARGET_WARM = 1.7, 0.7


def write_stores(directory, raw, labels):
    import zarr
    root = zarr.open_group(os.path.join(directory, "s.zarr"), mode="w")
    for name, data in (("raw", raw), ("labels", labels)):
        root.create_array(name, shape=data.shape, chunks=CHUNKS, dtype=data.dtype,
                          compressors=zarr.codecs.ZstdCodec(level=3))[...] = data
    with h5py.File(os.path.join(directory, "s.h5"), "w") as f:
        for name, data in (("raw", raw), ("labels", labels)):
            f.create_dataset(name, data=data, chunks=CHUNKS, compression="gzip", compression_opts=1)


def rate(volumes, patch, threads, batches, warm=False):
    """Batches per second after the ring filled once (and, ``warm``, after every block was read once)."""
    with ef.Loader(*volumes, patch=patch, batch_size=8, threads=threads, seed=threads,
                   targets=[ef.Affinities()]) as loader:
        if warm:
            for volume in volumes:
                for _ in volume.slabs():
                    pass
                box = np.empty((volume.channels,) + volume.shape, volume.dtype)
                volume.read_box((0, 0, 0), volume.shape, box)
        for _ in range(loader.buffers):
            loader.next_batch()
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        return batches / (time.perf_counter() - start)


def boxes(shape, patch, count, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(rng.integers(0, s - p + 1)) for s, p in zip(shape, patch)) for _ in range(count)]


def cold_reads(path, patch, corners):
    """Seconds to read the raw windows at ``corners``: emfast lazy, zarr-python, tensorstore (if installed)."""
    import zarr
    result = {}
    volume = ef.open(path, "raw", in_memory=False, cache_bytes=COLD_BLOCKS * int(np.prod(CHUNKS)))
    out = np.empty((1,) + tuple(patch), np.uint8)
    start = time.perf_counter()
    for corner in corners:
        volume.read_box(corner, patch, out)
    result["emfast"] = time.perf_counter() - start
    volume.close()
    array = zarr.open_array(os.path.join(path, "raw"), mode="r")
    start = time.perf_counter()
    for corner in corners:
        out[0] = array[tuple(slice(c, c + p) for c, p in zip(corner, patch))]
    result["zarr-python"] = time.perf_counter() - start
    try:
        import tensorstore as ts
    except ImportError:
        return result
    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(path, "raw")},
                     "context": {"cache_pool": {"total_bytes_limit": 0}}}, read=True).result()
    start = time.perf_counter()
    for corner in corners:
        out[0] = store[tuple(slice(c, c + p) for c, p in zip(corner, patch))].read().result()
    result["tensorstore"] = time.perf_counter() - start
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--batches", type=int, default=12, help="timed batches per measurement (default 12)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="small volume and patch, one round (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    shape, patch = ((48, 256, 256), (16, 64, 64)) if args.quick else ((96, 384, 384), (32, 128, 128))
    rounds = count_option(args.rounds, 3, 1, args.quick)
    raw, labels = make_em_volume(shape, seed=0)
    labels = labels.astype(np.uint64)
    block = int(np.prod(CHUNKS))
    results = {"cold": {"zarr": {1: [], 2: []}, "hdf5": {1: [], 2: []}}, "warm": {"lazy": [], "memory": []},
               "reads": []}
    with tempfile.TemporaryDirectory() as directory:
        write_stores(directory, raw, labels)
        zarr_path, h5_path = os.path.join(directory, "s.zarr"), os.path.join(directory, "s.h5")
        in_memory = [ef.Volume.from_array(raw, name="raw"), ef.Volume.from_array(labels, name="labels")]
        corners = boxes(shape, patch, 64)
        for _ in range(rounds):
            for threads in (1, 2):
                for kind, path in (("zarr", zarr_path), ("hdf5", h5_path)):
                    volumes = [ef.open(path, name, in_memory=False, cache_bytes=COLD_BLOCKS * block * itemsize)
                               for name, itemsize in (("raw", 1), ("labels", 8))]
                    results["cold"][kind][threads].append(rate(volumes, patch, threads, args.batches))
                    for volume in volumes:
                        volume.close()
            volumes = [ef.open(zarr_path, name, in_memory=False) for name in ("raw", "labels")]
            results["warm"]["lazy"].append(rate(volumes, patch, 2, args.batches, warm=True))
            results["warm"]["memory"].append(rate(in_memory, patch, 2, args.batches))
            results["reads"].append(cold_reads(zarr_path, patch, corners))
    median = statistics.median
    summary = {
        "zarr threads=2 / threads=1 (cold)": median(results["cold"]["zarr"][2]) / median(results["cold"]["zarr"][1]),
        "hdf5 threads=2 / threads=1 (cold)": median(results["cold"]["hdf5"][2]) / median(results["cold"]["hdf5"][1]),
        "zarr warm lazy / in memory (threads=2)": median(results["warm"]["lazy"]) / median(results["warm"]["memory"]),
    }
    reads = {name: median(r[name] for r in results["reads"]) for name in results["reads"][0]}
    lines = [f"formats benchmark: {shape} uint8 + uint64 labels, patch {patch}, batch 8, zarr v3 zstd / HDF5 gzip, "
             f"chunks {CHUNKS}, {rounds} round(s) of {args.batches} batches"]
    for kind in ("zarr", "hdf5"):
        for threads in (1, 2):
            lines.append(f"  cold {kind:4} threads={threads}: {median(results['cold'][kind][threads]):7.2f} "
                         "batches/s")
    lines.append(f"  warm zarr threads=2: {median(results['warm']['lazy']):7.2f} batches/s; in memory "
                 f"{median(results['warm']['memory']):7.2f}")
    for name, ratio in summary.items():
        lines.append(f"  {name}: {ratio:.2f}x")
    lines.append(f"  cold reads of {len(corners)} raw windows, one thread: " + ", ".join(
        f"{name} {seconds * 1000 / len(corners):.2f} ms/window" for name, seconds in reads.items()))
    lines.append(f"  targets: threads {'PASS' if summary['zarr threads=2 / threads=1 (cold)'] >= TARGET_THREADS else 'MISS'}"
                 f" (>= {TARGET_THREADS}x), warm {'PASS' if summary['zarr warm lazy / in memory (threads=2)'] >= TARGET_WARM else 'MISS'}"
                 f" (>= {TARGET_WARM}x)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "shape": shape, "patch": patch, "raw": results,
                       "summary": summary, "cold_read_seconds": reads}, file, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
