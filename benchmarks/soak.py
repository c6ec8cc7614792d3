#!/usr/bin/env python
"""Soak: a long run of the natural training loop; memory, threads and throughput must stay flat.

    python benchmarks/soak.py --batches 100000 [--threads T] [--device cpu|fake] [--json PATH]

The loader (batch 8 x (16, 64, 64) from a (64, 256, 256) uint8 volume with uint64 labels, mirror, transpose,
intensity, 3 affinities) runs the loop users write: the previous batch's arrays stay alive until reassigned.
Every ``--every`` batches it samples RSS, the number of emfast threads and the batch rate. Reported: the RSS slope
from a least-squares fit after the first 10% (bytes per 1,000 batches; target: under 16 KiB, where keeping one
small object per batch would add megabytes), the thread counts seen (target: one value), and the rate of the last
tenth against the first tenth after warm-up (target: >= 0.9).
``--device fake`` drives the copier with the test suite's fake device (memory-only), to soak the device path.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.bench import rss_bytes  # noqa: E402
from _workload import machine_info  # noqa: E402

SLOPE_TARGET = 16 * 1024  # bytes per 1,000 batches: 16 bytes a batch; keeping any per-batch object costs far more
RATE_TARGET = 0.9


def soak(batches: int, threads: int = 2, device: str = "cpu", every: int = 500, shape=(64, 256, 256),
         patch=(16, 64, 64)) -> dict:
    """Run the natural loop for ``batches`` batches; return the samples and the figures of merit."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, shape, dtype=np.uint8)
    labels = rng.integers(0, 50, shape, dtype=np.uint64)
    backend = device
    if device == "fake":
        from emfast.transfer._fake import FakeDevice
        backend = FakeDevice(max_delay=0.0)
    samples = []
    with ef.Loader(raw, labels, patch=patch, batch_size=8, threads=threads, seed=0, device=backend,
                   augment=["mirror", "transpose", "intensity"], targets=[ef.Affinities()]) as loader:
        x = y = None
        start = time.perf_counter()
        for number in range(1, batches + 1):
            batch = loader.next_batch()
            x, y = batch["raw"], batch["affinities"]  # alive until the next iteration, as a training step's
            if number % every == 0:
                samples.append({"batch": number, "seconds": time.perf_counter() - start, "rss": rss_bytes(),
                                "threads": sum(t.name.startswith("emfast-") for t in threading.enumerate()), "slots": loader.slots_allocated})
        del x, y, batch
    return {"samples": samples, **figures(samples)}


def figures(samples) -> dict:
    steady = samples[len(samples) // 10:] or samples
    batches = np.array([s["batch"] for s in steady], dtype=np.float64)
    rss = np.array([s["rss"] for s in steady], dtype=np.float64)
    slope = float(np.polyfit(batches, rss, 1)[0] * 1000) if len(steady) > 1 else 0.0
    tenth = max(1, len(steady) // 10)

    def rate(part):
        if len(part) < 2:
            return float("nan")
        return (part[-1]["batch"] - part[0]["batch"]) / (part[-1]["seconds"] - part[0]["seconds"])

    first, last = rate(steady[:tenth + 1]), rate(steady[-tenth - 1:])
    return {"rss_slope_bytes_per_1000": slope, "thread_counts": sorted({s["threads"] for s in samples}),
            "slots": sorted({s["slots"] for s in samples}), "rate_first": first, "rate_last": last,
            "rate_ratio": last / first if first else float("nan")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--batches", type=int, default=100_000, help="batches to run (default 100,000)")
    parser.add_argument("--threads", type=int, default=2, help="producer threads (default 2)")
    parser.add_argument("--device", choices=["cpu", "fake"], default="cpu", help="cpu, or the fake device")
    parser.add_argument("--every", type=int, default=500, help="batches between samples (default 500)")
    parser.add_argument("--json", metavar="PATH", help="also write the samples and figures as JSON")
    args = parser.parse_args(argv)
    if args.batches < 10 * args.every or args.every < 1 or args.threads < 1:
        parser.error("--batches must be at least 10 x --every; --every and --threads >= 1")
    result = soak(args.batches, args.threads, args.device, args.every)
    verdict = "PASS" if (result["rss_slope_bytes_per_1000"] < SLOPE_TARGET and len(result["thread_counts"]) == 1
                         and result["rate_ratio"] >= RATE_TARGET) else "MISS"
    print(f"machine: {machine_info()}")
    print(f"{args.batches} batches, threads={args.threads}, device={args.device}, sampled every {args.every}")
    print(f"RSS slope after warm-up: {result['rss_slope_bytes_per_1000']:+.0f} bytes / 1000 batches "
          f"(target < {SLOPE_TARGET}); RSS {result['samples'][0]['rss'] / 2**20:.1f} -> "
          f"{result['samples'][-1]['rss'] / 2**20:.1f} MiB")
    print(f"threads seen: {result['thread_counts']}; slots: {result['slots']}")
    print(f"rate: first tenth {result['rate_first']:.1f}, last tenth {result['rate_last']:.1f} batches/s "
          f"(ratio {result['rate_ratio']:.2f}, target >= {RATE_TARGET}): {verdict}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "args": vars(args), "verdict": verdict, **result}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
