#!/usr/bin/env python
"""Lazy volumes with every chunk cached come as fast as in-memory volumes, and scale with producer threads.

    python benchmarks/lazy_warm.py [--batches N] [--rounds R] [--augment mirror,transpose] [--json PATH] [--quick]

Data: a random uint8 (96, 512, 512) volume written as zarr v3 (zstd) twice, with cubic chunks (16, 64, 64) and
per-section chunks (1, 256, 256). Task: raw only, patch (32, 128, 128), batch 8, no augmentation (or the
``--augment`` list: with "transpose", half the windows read across source rows), float32 output.
For each chunk layout and threads in (1, 2), alternating over rounds: batches/s of a loader over the lazy volume
after every chunk was read into its cache (the default budget holds the whole volume), and of the same loader over
the volume in memory. Reported: the medians, lazy / in memory per (layout, threads) (target >= 0.9x), and lazy
threads=2 / threads=1 (target >= 1.7x on 2 cores); also the process's CPU time per batch, lazy against in memory, which
other processes' load hardly changes, and the host's own scaling: NumPy converting uint8 to float32 on one thread
and on two (a streaming kernel of the loader's shape), the most a second producer can gain on this host's memory.
Every ratio is against a baseline from the same run; the load average at start and end is recorded, since other
processes share the cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

LAYOUTS = {"cubic (16, 64, 64)": (16, 64, 64), "per-section (1, 256, 256)": (1, 256, 256)}
TARGET_MEMORY, TARGET_THREADS = 0.9, 1.7


def write_zarr(path: str, data: np.ndarray, chunks) -> None:
    import zarr
    zarr.create_array(path, shape=data.shape, chunks=chunks, dtype=data.dtype,
                      compressors=zarr.codecs.ZstdCodec(level=1))[...] = data


def rate(loader, batches: int) -> tuple:
    """(batches per second, CPU milliseconds of the whole process per batch) of a started loader; the batches
    it made ahead while idle are taken first. CPU time per batch barely depends on other processes' load."""
    for _ in range(loader.buffers):
        loader.next_batch()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        loader.next_batch()
    return batches / (time.perf_counter() - start), 1e3 * (time.process_time() - cpu) / batches


def streaming_scaling(rounds: int = 7) -> tuple:
    """(GB/s written by one thread, by two, their ratio; bests of ``rounds``) of NumPy converting uint8 to float32
    into 64 MiB of float32 per thread (np.copyto releases the GIL): how far a second core speeds up a kernel of
    the loader's shape (it reads a quarter of what it writes) on this host's memory, whatever emfast does."""
    import threading
    sources = [np.random.default_rng(k).integers(0, 256, 16 << 20, dtype=np.uint8) for k in range(2)]
    targets = [np.zeros(16 << 20, np.float32) for _ in range(2)]

    def convert(k: int, times: int) -> None:
        for _ in range(times):
            np.copyto(targets[k], sources[k], casting="unsafe")

    def written(threads: int, times: int = 20) -> float:
        workers = [threading.Thread(target=convert, args=(k, times)) for k in range(threads)]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return threads * times * targets[0].nbytes / (time.perf_counter() - start) / 1e9

    one, two = [], []
    for _ in range(rounds):
        one.append(written(1))
        two.append(written(2))
    return max(one), max(two), max(two) / max(one)


def warmed(path: str):
    """The lazy volume at ``path`` with every chunk read into its cache."""
    volume = ef.open(path, in_memory=False)
    volume.read_box((0, 0, 0), volume.shape, np.empty((volume.channels,) + volume.shape, volume.dtype))
    return volume


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--batches", type=int, default=15, help="timed batches per measurement (default 15)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 9; --quick: 1)")
    parser.add_argument("--augment", default="", help="comma-separated augmentations (default: none)")
    parser.add_argument("--quick", action="store_true", help="small volume and patch, one round (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    shape, patch = ((32, 256, 256), (16, 64, 64)) if args.quick else ((96, 512, 512), (32, 128, 128))
    rounds = count_option(args.rounds, 9, 1, args.quick)
    augment = tuple(name for name in args.augment.split(",") if name)
    raw = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    results = {layout: {kind: {1: [], 2: []} for kind in ("lazy", "memory")} for layout in LAYOUTS}
    cpu_ms = {layout: {kind: {1: [], 2: []} for kind in ("lazy", "memory")} for layout in LAYOUTS}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        memory = ef.Volume.from_array(raw, name="raw")
        lazy = {}
        for layout, chunks in LAYOUTS.items():
            path = os.path.join(directory, f"{chunks[0]}x{chunks[1]}x{chunks[2]}.zarr")
            write_zarr(path, raw, chunks)
            lazy[layout] = warmed(path)
        warm_misses = {layout: volume.cache_stats.misses for layout, volume in lazy.items()}
        # Every loader stays open; one not being measured has filled its slots and waits, using no CPU, so
        # lazy and in-memory measurements alternate closely and share the same background load.
        loaders = {(kind, layout, threads): ef.Loader(lazy[layout] if kind == "lazy" else memory, patch=patch,
                                                      batch_size=8, threads=threads, seed=threads,
                                                      augment=augment)
                   for layout in LAYOUTS for threads in (1, 2) for kind in ("lazy", "memory")}
        try:
            for loader in loaders.values():
                loader.start()
            for _ in range(rounds):
                for (kind, layout, threads), loader in loaders.items():
                    batches_per_s, ms = rate(loader, args.batches)
                    results[layout][kind][threads].append(batches_per_s)
                    cpu_ms[layout][kind][threads].append(ms)
        finally:
            for loader in loaders.values():
                loader.close()
        misses = {layout: volume.cache_stats.misses - warm_misses[layout] for layout, volume in lazy.items()}
        for volume in lazy.values():
            volume.close()
    load_end = os.getloadavg()
    median = statistics.median
    lines = [f"lazy warm benchmark: zarr v3 {shape} uint8, patch {patch}, batch 8, "
             f"augment {', '.join(augment) or 'none'}, float32 out, "
             f"{rounds} round(s) of {args.batches} batches, lazy and in memory alternating, loaders kept open",
             f"  load average (1, 5, 15 min) at start {load_start}, at end {load_end}"]
    summary = {}
    passed = True
    for layout in LAYOUTS:
        lazy_rates = {t: median(results[layout]["lazy"][t]) for t in (1, 2)}
        memory_rates = {t: median(results[layout]["memory"][t]) for t in (1, 2)}
        for threads in (1, 2):
            ratio = lazy_rates[threads] / memory_rates[threads]
            summary[f"{layout} threads={threads} lazy / in memory"] = ratio
            passed &= ratio >= TARGET_MEMORY
            cpu = {kind: median(cpu_ms[layout][kind][threads]) for kind in ("lazy", "memory")}
            summary[f"{layout} threads={threads} CPU per batch in memory / lazy"] = cpu["memory"] / cpu["lazy"]
            lines.append(f"  {layout:26} threads={threads}: lazy {lazy_rates[threads]:7.1f} b/s, in memory "
                         f"{memory_rates[threads]:7.1f} b/s, ratio {ratio:.2f}; CPU ms/batch lazy "
                         f"{cpu['lazy']:.2f}, in memory {cpu['memory']:.2f}, ratio {cpu['memory'] / cpu['lazy']:.2f}")
        scaling = lazy_rates[2] / lazy_rates[1]
        summary[f"{layout} lazy threads=2 / threads=1"] = scaling
        passed &= scaling >= TARGET_THREADS
        lines.append(f"  {layout:26} lazy threads=2 / threads=1: {scaling:.2f}x "
                     f"(in memory {memory_rates[2] / memory_rates[1]:.2f}x)")
    host = streaming_scaling(3 if args.quick else 7)
    summary["host streaming threads=2 / threads=1"] = host[2]
    lines.append(f"  chunk misses while timing (after warming): {misses}")
    lines.append(f"  this host's memory, same run: NumPy's uint8 -> float32 conversion writes {host[0]:.1f} GB/s on "
                 f"one thread, {host[1]:.1f} GB/s on two: {host[2]:.2f}x (the most two producers of a kernel of "
                 "this shape can gain here)")
    lines.append(f"  targets (lazy / in memory >= {TARGET_MEMORY}, threads=2 / threads=1 >= {TARGET_THREADS}): "
                 f"{'PASS' if passed else 'MISS'}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "shape": shape, "patch": patch, "augment": augment,
                       "load": [load_start, load_end],
                       "raw": results, "cpu_ms_per_batch": cpu_ms, "summary": summary}, file, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
