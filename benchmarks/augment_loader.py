#!/usr/bin/env python
"""Issue 4's loader target: the full default augmentation list scales with producer threads.

    python benchmarks/augment_loader.py [--batches N] [--rounds R] [--json PATH] [--quick]

The loader runs the standard task (8 x (32, 128, 128) from a (96, 384, 384) uint8 volume with uint64 labels,
3 nearest-neighbour affinities) with ``augment=emfast.augment.FULL`` (mirror, transpose, rotation, elastic,
intensity, gamma, contrast, noise, blur, missing sections, low contrast, slips), with threads=1 and threads=2
alternating over several rounds; the ratio of their throughputs is reported with the per-stage profile.
Target: threads=2 >= 1.7x threads=1 on this 2-core machine.
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
from emfast.augment import FULL  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

TARGET = 1.7


def throughput(raw, labels, patch, threads, batches):
    """Batches per second of a loader with the full augmentation list, after the ring has filled once."""
    with ef.Loader(raw, labels, patch=patch, batch_size=8, threads=threads, seed=0, augment=FULL,
                   targets=[ef.Affinities()]) as loader:
        for _ in range(loader.buffers):
            loader.next_batch()
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        rate = batches / (time.perf_counter() - start)
        return rate, loader.profile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--batches", type=int, default=12, help="timed batches per measurement (default 12)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating threads=1/2 rounds (default 3; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="small patch, one round (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    rounds = count_option(args.rounds, 3, 1, args.quick)
    if args.batches < 1 or rounds < 1:
        parser.error("--batches and --rounds must be >= 1")
    shape, patch = ((48, 160, 160), (16, 64, 64)) if args.quick else ((96, 384, 384), (32, 128, 128))
    raw, labels = make_em_volume(shape, seed=0)
    labels = labels.astype(np.uint64)

    rates = {1: [], 2: []}
    profiles = {}
    for round_ in range(rounds):
        for threads in (1, 2) if round_ % 2 == 0 else (2, 1):  # the same augmentations, in turn first
            rate, profiles[threads] = throughput(raw, labels, patch, threads, args.batches)
            rates[threads].append(rate)
    ratio = statistics.median(rates[2]) / statistics.median(rates[1])
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"machine: {machine_info()}")
    print(f"volume {shape}, batch 8 x {patch}, augment={list(FULL)}")
    for threads in (1, 2):
        print(f"threads={threads}: {statistics.median(rates[threads]):.2f} batches/s "
              f"(rounds: {', '.join(f'{r:.2f}' for r in rates[threads])})")
    print(f"threads=2 / threads=1: {ratio:.2f} (target >= {TARGET}): {verdict}")
    print(f"profile, threads=1:\n{profiles[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "shape": shape, "patch": patch, "augment": list(FULL),
                       "batches_per_s": {str(k): v for k, v in rates.items()}, "ratio": ratio, "target": TARGET,
                       "verdict": verdict, "profile_threads_1": profiles[1].as_dict()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
