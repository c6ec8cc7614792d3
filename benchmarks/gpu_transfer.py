"""GPU transfer benchmark (needs an NVIDIA GPU and pycuda; PyTorch for the overlap part).

    python benchmarks/gpu_transfer.py [--json PATH] [--seconds S]

Measured in one run, on the standard task (batch 8 x (32, 128, 128), uint8 raw -> float32, uint64 labels):
1. H2D bandwidth of the loader's copies (bytes per batch / copy stage time) vs a plain pinned
   ``memcpy_htod`` of the same size, and vs pageable memory (target: ring >= 85% of pinned);
2. overlap: a synthetic training step (a PyTorch matmul loop of T ms) fed by the loader vs the same loop on an
   already-resident tensor (target: <= 1.05x whenever the loader's capacity exceeds the demand);
3. end-to-end batches/s delivered on the device.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import emfast as ef
from emfast.transfer import cuda_unavailable

PATCH, BATCH, VOLUME = (32, 128, 128), 8, (96, 384, 384)


def bandwidth(nbytes: int, repeats: int) -> dict:
    """GB/s of pinned and pageable host-to-device copies of ``nbytes``."""
    import pycuda.driver as cuda

    context = cuda.Device(0).retain_primary_context()
    context.push()
    try:
        device = cuda.mem_alloc(nbytes)
        result = {}
        for kind, host in (("pinned", cuda.pagelocked_empty(nbytes, np.uint8)), ("pageable", np.empty(nbytes, np.uint8))):
            host.fill(1)
            cuda.memcpy_htod(device, host)
            start = time.perf_counter()
            for _ in range(repeats):
                cuda.memcpy_htod(device, host)
            cuda.Context.synchronize()
            result[kind] = nbytes * repeats / (time.perf_counter() - start) / 1e9
        return result
    finally:
        cuda.Context.pop()
        context.detach()


def loader_run(raw, labels, seconds: float, step=None) -> dict:
    """Batches/s on the device (with an optional training step per batch) and the copy bandwidth."""
    with ef.Loader(raw, labels, patch=PATCH, batch_size=BATCH, threads=2, device="cuda", seed=0) as loader:
        for _, _ in zip(range(5), loader):
            pass
        before = loader.profile
        count, start = 0, time.perf_counter()
        for batch in loader:
            if step is not None:
                step(batch)
            count += 1
            if time.perf_counter() - start > seconds:
                break
        elapsed = time.perf_counter() - start
        after = loader.profile
        copy_seconds = after.seconds["copy"] - before.seconds["copy"]
        return {"batches_per_s": count / elapsed, "copy_gb_per_s": loader.slot_bytes * count / copy_seconds / 1e9,
                "profile": after.as_dict()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per loader measurement")
    args = parser.parse_args(argv)
    reason = cuda_unavailable()
    if reason is not None:
        print(f"gpu_transfer: {reason}", file=sys.stderr)
        return 2
    import pycuda.driver as cuda

    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, VOLUME, dtype=np.uint8)
    labels = rng.integers(0, 2**40, VOLUME, dtype=np.uint64)
    slot_bytes = BATCH * int(np.prod(PATCH)) * (4 + 8)
    report = {"device": cuda.Device(0).name(), "slot_bytes": slot_bytes}
    report["plain"] = bandwidth(slot_bytes, repeats=50)
    report["loader"] = loader_run(raw, labels, args.seconds)
    report["ring_vs_pinned"] = report["loader"]["copy_gb_per_s"] / report["plain"]["pinned"]
    try:
        import torch
    except ImportError:
        report["overlap"] = "skipped: PyTorch is not installed"
    else:
        weights = torch.randn(4096, 4096, device="cuda")
        resident = torch.randn(BATCH, 1, *PATCH, device="cuda")

        def step(batch=None):
            x = batch.torch()["raw"] if batch is not None else resident
            y = weights
            for _ in range(8):
                y = y @ weights
            return x.sum() + y[0, 0]

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            step()
            torch.cuda.synchronize()
            count += 1
        alone = (time.perf_counter() - start) / count

        def fed(batch):
            step(batch)
            torch.cuda.synchronize()

        with_loader = 1.0 / loader_run(raw, labels, args.seconds, step=fed)["batches_per_s"]
        report["overlap"] = {"step_ms_resident": alone * 1e3, "step_ms_with_loader": with_loader * 1e3,
                             "ratio": with_loader / alone}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
