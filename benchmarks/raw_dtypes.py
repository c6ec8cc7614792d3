#!/usr/bin/env python
"""What each raw dtype costs a batch, against uint8 in the same run.

    python benchmarks/raw_dtypes.py [--batches N] [--rounds R] [--json PATH]

One producer thread, batches of 8 windows of (32, 128, 128) from a (64, 256, 256) random in-memory volume of each
raw dtype, converted to float32 with the dtype's default normalisation, uint64 labels copied. Two loaders per
dtype: the gather path (``Mirror()`` + ``Transpose()``) and the warp path (``Rotate(angle=20)``: trilinear raw;
the AVX2 lanes serve 1- and 2-byte integers and float32, uint32, float16 and float64 take the scalar sampler). Rounds interleave the
dtypes, so load on the machine spreads over all of them; reported: the median seconds per batch and its ratio to
uint8's of the same path.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from _workload import machine_info  # noqa: E402

DTYPES = ["uint8", "uint16", "float32", "int8", "int16", "uint32", "float16", "float64"]
PATHS = {"gather": lambda: [ef.Mirror(), ef.Transpose()], "warp": lambda: [ef.Rotate(angle=20)]}


def volume(rng, dtype, shape=(64, 256, 256)):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.random(shape, dtype=np.float32) * 1000).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def seconds_per_batch(raw, labels, augment, batches):
    with ef.Loader(raw, labels, patch=(32, 128, 128), batch_size=8, threads=1, augment=augment, seed=1) as loader:
        loader.next_batch()  # the pipeline is warm
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        return (time.perf_counter() - start) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 50, (64, 256, 256), dtype=np.uint64)
    raws = {d: volume(rng, d) for d in DTYPES}
    times = {(p, d): [] for p in PATHS for d in DTYPES}
    for _ in range(args.rounds):
        for path, augment in PATHS.items():
            for dtype in DTYPES:
                times[path, dtype].append(seconds_per_batch(raws[dtype], labels, augment(), args.batches))
    lines = [f"raw dtypes: seconds per batch of 8 x (32, 128, 128), 1 thread; {machine_info()}",
             f"{'path':8s} {'dtype':8s} {'s/batch':>9s} {'vs uint8':>9s}"]
    record = {"machine": machine_info(), "batches": args.batches, "rounds": args.rounds, "results": []}
    for path in PATHS:
        base = statistics.median(times[path, "uint8"])
        for dtype in DTYPES:
            median = statistics.median(times[path, dtype])
            lines.append(f"{path:8s} {dtype:8s} {median:9.4f} {median / base:8.2f}x")
            record["results"].append({"path": path, "dtype": dtype, "seconds_per_batch": median,
                                      "ratio_to_uint8": median / base, "runs": times[path, dtype]})
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
