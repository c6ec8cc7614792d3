#!/usr/bin/env python
"""Issue 14's targets for emfast.predict, each a ratio against a baseline from the same run.

    python benchmarks/predict.py [--rounds R] [--json PATH] [--quick]

- write: an identity network over the built-in (96, 384, 384) uint8 volume, tiles (32, 128, 128) with the default
  overlap (a quarter: 8, 32, 32) and gaussian blending, written as float32 to zarr v3 (zstd level 3, chunks
  (32, 128, 128)), against writing the same float32 array with zarr-python directly, same chunks and codec
  (target >= 0.7x). Also blend="none" (tiles cropped, no overlap), the cheapest tiling.
- dask: a compute-bound NumPy network (elementwise passes over each tile) on a (64, 256, 256) volume in 8 blocks
  of (32, 128, 128), on a LocalCluster of 2 worker processes against 1 (target >= 1.6x on 2 cores). Cluster start-up
  is not timed.
Rounds alternate between the contenders; medians are reported.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import machine_info  # noqa: E402

CHUNKS = (32, 128, 128)
TILE = (32, 128, 128)
TARGET_WRITE, TARGET_DASK = 0.7, 1.6
#: Elementwise passes of the compute-bound network.
PASSES = 24


def identity(batch):
    return batch


def compute_bound(batch):
    """A stand-in for a network on the CPU: PASSES elementwise passes over the tile, in place. (Temporaries would
    measure Dask's worker setting MALLOC_TRIM_THRESHOLD_=65536 instead: every large free is returned to the
    system and faulted in again, which makes such code about 5x slower in a worker than in the client.)"""
    out = batch.copy()
    for _ in range(PASSES):
        np.multiply(out, np.float32(1.01), out=out)
        np.tanh(out, out=out)
    return out


def direct_write(path, data):
    import zarr
    root = zarr.open_group(path, mode="w")
    array = root.create_array("p", shape=data.shape, chunks=(data.shape[0],) + CHUNKS, dtype=data.dtype,
                              compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0)
    start = time.perf_counter()
    array[...] = data
    return time.perf_counter() - start


def timed_predict(model, volume, out, **kwargs):
    start = time.perf_counter()
    result = ef.predict(model, volume, out, chunks=CHUNKS, compression="zstd", overwrite=True, channels=1,
                        **kwargs)
    return time.perf_counter() - start, result


def bench_write(directory, raw, rounds):
    normalized = (raw.astype(np.float32) * np.float32(1 / 255))[np.newaxis]
    times = {"zarr direct": [], "predict gaussian": [], "predict none": []}
    for _ in range(rounds):
        times["zarr direct"].append(direct_write(os.path.join(directory, "direct.zarr"), normalized))
        times["predict gaussian"].append(timed_predict(identity, raw, os.path.join(directory, "g.zarr/p"),
                                                       patch_in=TILE, blend="gaussian")[0])
        times["predict none"].append(timed_predict(identity, raw, os.path.join(directory, "n.zarr/p"),
                                                   patch_in=TILE, blend="none")[0])
    import zarr
    written = zarr.open_array(os.path.join(directory, "g.zarr"), path="p", mode="r")[...]
    assert np.array_equal(written, normalized), "the identity network must reproduce its input"
    medians = {name: statistics.median(values) for name, values in times.items()}
    megabytes = normalized.nbytes / 1e6
    return {name: {"seconds": medians[name], "MB_per_s": megabytes / medians[name],
                   "ratio": medians["zarr direct"] / medians[name]} for name in medians}


def bench_dask(directory, raw, rounds):
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    block = tuple(s // 2 for s in raw.shape)  # 8 blocks
    settings = dict(patch_in=(16, 64, 64), block=block, blend="gaussian")
    times = {1: [], 2: []}
    clusters = {n: LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                silence_logs=40) for n in (1, 2)}
    try:
        clients = {n: Client(cluster) for n, cluster in clusters.items()}
        for n, client in clients.items():  # warm-up: workers import emfast and numpy once
            timed_predict(compute_bound, raw, os.path.join(directory, f"warm{n}.zarr/p"), client=client,
                          **settings)
        for _ in range(rounds):
            for n, client in clients.items():
                seconds, result = timed_predict(compute_bound, raw, os.path.join(directory, f"dask{n}.zarr/p"),
                                                client=client, **settings)
                times[n].append(seconds)
        for client in clients.values():
            client.close()
    finally:
        for cluster in clusters.values():
            cluster.close()
    local, _ = timed_predict(compute_bound, raw, os.path.join(directory, "local.zarr/p"), **settings)
    import zarr
    one, two = (zarr.open_array(os.path.join(directory, f"dask{n}.zarr"), path="p", mode="r")[...] for n in (1, 2))
    assert np.array_equal(one, two), "1 and 2 workers must write the same bytes"
    medians = {n: statistics.median(v) for n, v in times.items()}
    return {"blocks": result.blocks, "seconds_1_worker": medians[1], "seconds_2_workers": medians[2],
            "seconds_local_engine": local, "speedup": medians[1] / medians[2]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="smaller volumes, 2 rounds")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    raw, _ = make_em_volume((48, 256, 256) if args.quick else (96, 384, 384), seed=0)
    small, _ = make_em_volume((32, 128, 128) if args.quick else (64, 256, 256), seed=1)
    directory = tempfile.mkdtemp(prefix="emfast-bench-predict-")
    try:
        write = bench_write(directory, raw, rounds)
        dask = bench_dask(directory, small, rounds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"machine: {machine_info()}")
    print(f"identity network over {raw.shape} uint8 -> float32 zarr (zstd 3, chunks {CHUNKS}), tiles {TILE}, "
          f"median of {rounds}:")
    for name, row in write.items():
        print(f"  {name:18s} {row['seconds']:7.3f} s  {row['MB_per_s']:7.1f} MB/s  {row['ratio']:.2f}x of direct")
    print(f"  target: predict gaussian >= {TARGET_WRITE}x -> "
          f"{'met' if write['predict gaussian']['ratio'] >= TARGET_WRITE else 'NOT met'}")
    print(f"compute-bound network over {small.shape}, {dask['blocks']} blocks, median of {rounds}:")
    print(f"  1 worker {dask['seconds_1_worker']:.2f} s, 2 workers {dask['seconds_2_workers']:.2f} s: "
          f"{dask['speedup']:.2f}x (target >= {TARGET_DASK}x -> "
          f"{'met' if dask['speedup'] >= TARGET_DASK else 'NOT met'}); local engine {dask['seconds_local_engine']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "rounds": rounds, "write": write, "dask": dask}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
