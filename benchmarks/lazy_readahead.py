#!/usr/bin/env python
"""Read-ahead keeps the producers busy on a cold store with latency.

    python benchmarks/lazy_readahead.py [--latency-ms 5] [--batches N] [--rounds R] [--json PATH]

Data: a random uint8 (64, 512, 512) volume written as zarr v3 (zstd, chunks (16, 64, 64)); every chunk read waits
``--latency-ms`` first, as a read from object storage does (the store's own read and decode follow). Task: raw
only, patch (32, 128, 128), batch 8, threads=2, no augmentation. Each measurement opens the volume afresh (cold
cache, default budget) and times ``--batches`` batches after the first; with read-ahead (the default) against
without it (its depth forced to 0, the loader otherwise the same), alternating over rounds. Reported: the median
rates, their ratio, and the profile's fetch / decode / pending / ahead milliseconds per batch. The latency wrapper
reads chunk by chunk (it offers no batched ``read_many``, as a remote store's reads do not), and the profile counts
its waits in ``decode``, the stage timing the source's reads of single chunks.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.pipeline import _producers  # noqa: E402
from _workload import machine_info  # noqa: E402

CHUNKS, PATCH = (16, 64, 64), (32, 128, 128)


class Latency:
    """A volume source whose every read waits ``seconds`` first (sleeping, like a network wait)."""

    def __init__(self, source, seconds: float) -> None:
        self._source, self._seconds = source, seconds

    def read(self, corner, extent, out) -> None:
        threading.Event().wait(self._seconds)
        self._source.read(corner, extent, out)


def rate(path: str, latency: float, batches: int, read_ahead: bool) -> tuple:
    """(batches/s, profile ms per batch) of a loader over a freshly opened, cold lazy volume."""
    volume = ef.open(path, in_memory=False)
    cache = volume.chunk_cache
    cache._source = Latency(cache._source, latency)
    depth = _producers.read_ahead_depth
    if not read_ahead:
        _producers.read_ahead_depth = lambda *args: (0, None)
    try:
        with ef.Loader(volume, patch=PATCH, batch_size=8, threads=2, augment=()) as loader:
            loader.next_batch()
            start = time.perf_counter()
            for _ in range(batches):
                loader.next_batch()
            elapsed = time.perf_counter() - start
            profile = loader.profile.as_dict()["per_batch_ms"]
    finally:
        _producers.read_ahead_depth = depth
        volume.close()
    return batches / elapsed, {stage: profile[stage] for stage in ("cache", "fetch", "decode", "pending", "ahead", "kernel")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--latency-ms", type=float, default=5.0, help="wait before every chunk read (default 5)")
    parser.add_argument("--batches", type=int, default=12, help="timed batches per measurement (default 12)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    import zarr
    raw = np.random.default_rng(0).integers(0, 256, (64, 512, 512), dtype=np.uint8)
    results = {True: [], False: []}
    profiles = {True: [], False: []}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "raw.zarr")
        zarr.create_array(path, shape=raw.shape, chunks=CHUNKS, dtype=raw.dtype,
                          compressors=zarr.codecs.ZstdCodec(level=1))[...] = raw
        for _ in range(args.rounds):
            for read_ahead in (True, False):
                batches_per_s, profile = rate(path, args.latency_ms / 1e3, args.batches, read_ahead)
                results[read_ahead].append(batches_per_s)
                profiles[read_ahead].append(profile)
    median = statistics.median
    lines = [f"read-ahead benchmark: zarr v3 {raw.shape} uint8, chunks {CHUNKS}, {args.latency_ms:g} ms latency per "
             f"chunk read, patch {PATCH}, batch 8, threads=2, cold cache, {args.rounds} round(s) of {args.batches} "
             "batches, alternating",
             f"  load average (1, 5, 15 min) at start {load_start}, at end {os.getloadavg()}"]
    for read_ahead in (True, False):
        stages = {stage: median(p[stage] for p in profiles[read_ahead]) for stage in profiles[read_ahead][0]}
        lines.append(f"  read-ahead {'on ' if read_ahead else 'off'}: {median(results[read_ahead]):6.2f} batches/s; "
                     "ms/batch " + ", ".join(f"{stage} {ms:.1f}" for stage, ms in stages.items()))
    ratio = median(results[True]) / median(results[False])
    lines.append(f"  read-ahead on / off: {ratio:.2f}x")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "latency_ms": args.latency_ms, "rates": results,
                       "profiles_ms_per_batch": profiles, "ratio": ratio}, file, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
