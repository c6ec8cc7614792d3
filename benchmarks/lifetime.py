#!/usr/bin/env python
"""Issue 10's targets: the training loop as users write it costs nothing against one that drops every reference.

    python benchmarks/lifetime.py [--batches N] [--rounds R] [--threads T] [--json PATH] [--quick]

Task: batch 8 x (32, 128, 128) from a (96, 384, 384) uint8 volume (-> float32) with uint64 labels, mirror and
transpose, ``threads`` producers (default: all cores). Two consumer loops, alternating over several rounds in
one run:

- careful: every reference to a batch is gone before the next request;
- natural: ``x, y = batch["raw"], batch["labels"]`` stay alive until the next iteration reassigns them, as a
  training step's tensors do.

CPU: natural / careful batches/s (target >= 0.9), slots allocated per 1,000 timed batches, and the slots a
loader holds at the end (target: at most ``buffers + 1``; the pool grows once, when the loop first keeps a batch
while producers need a slot, and never again). With a CUDA GPU, pycuda and PyTorch it also measures, on the device loader: a small 3-D conv net's
training steps/s under the natural loop against the same steps on a resident tensor (target >= 0.97), device
memory growth per 1,000 batches (target 0), and device against host-only delivery at the same thread count.
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
from emfast.transfer import cuda_unavailable  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

CPU_TARGET, STEP_TARGET = 0.9, 0.97


def touch(array):
    """Read one element of a host array; a device array is only held (reading it would time a copy back)."""
    if isinstance(array, np.ndarray):
        float(array[0, 0, 0, 0, 0])


def careful(loader, batches):
    for _, batch in zip(range(batches), loader):
        touch(batch["raw"])


def natural(loader, batches):
    x = y = None
    for _, batch in zip(range(batches), loader):
        x, y = batch["raw"], batch["labels"]  # the previous batch's arrays die only here
        touch(x)
    del x, y


def measure(loop, make, batches):
    """(batches/s, slots allocated during the timed part, slots in the end) of ``loop`` on a fresh loader, after
    a warm-up."""
    with make() as loader:
        loop(loader, 2 * loader.buffers)
        allocated = loader.slots_allocated
        start = time.perf_counter()
        loop(loader, batches)
        rate = batches / (time.perf_counter() - start)
        return rate, loader.slots_allocated - allocated, loader.slots_allocated


def cpu_rows(make, batches, rounds):
    rates = {"careful": [], "natural": []}
    allocations = {"careful": 0, "natural": 0}
    slots = {"careful": 0, "natural": 0}
    for _ in range(rounds):
        for name, loop in (("careful", careful), ("natural", natural)):
            rate, allocated, held = measure(loop, make, batches)
            rates[name].append(rate)
            allocations[name] += allocated
            slots[name] = max(slots[name], held)
    per_1000 = {name: 1000 * count / (batches * rounds) for name, count in allocations.items()}
    return rates, per_1000, slots


def gpu_rows(raw, labels, patch, threads, batches):
    """Training steps/s natural vs resident, device memory growth, device vs host delivery (needs torch)."""
    import torch

    net = torch.nn.Sequential(torch.nn.Conv3d(1, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv3d(8, 1, 3, padding=1)).cuda()
    optimiser = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step(x):
        optimiser.zero_grad(set_to_none=True)
        loss = net(x).square().mean()
        loss.backward()
        optimiser.step()
        return loss

    def loader(device):
        return ef.Loader(raw, labels, patch=patch, batch_size=8, threads=threads, seed=1, device=device)

    with loader("cuda") as device_loader:
        iterator = iter(device_loader)
        resident = next(iterator).torch()["raw"].clone()
        for _ in range(10):
            step(resident)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(batches):
            step(resident)
        torch.cuda.synchronize()
        resident_rate = batches / (time.perf_counter() - start)

        for _ in range(100):
            tensors = next(iterator).torch()  # the natural loop: the previous tensors live until reassigned
            step(tensors["raw"])
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        start = time.perf_counter()
        for _ in range(batches):
            tensors = next(iterator).torch()
            step(tensors["raw"])
        torch.cuda.synchronize()
        natural_rate = batches / (time.perf_counter() - start)
        growth = (free_before - torch.cuda.mem_get_info()[0]) * 1000 / batches
        del tensors
        device_slots = device_loader.slots_allocated

    delivery = {}
    for device in ("cpu", "cuda"):
        delivery[device] = measure(natural, lambda: loader(device), batches)[0]
    return {"resident_steps_per_s": resident_rate, "natural_steps_per_s": natural_rate,
            "step_ratio": natural_rate / resident_rate, "device_bytes_per_1000_batches": growth,
            "device_slots": device_slots, "delivery_batches_per_s": delivery,
            "device_over_host": delivery["cuda"] / delivery["cpu"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--batches", type=int, default=None,
                        help="timed batches per measurement (default 300; --quick: 50)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating careful/natural rounds (default 5; --quick: 2)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="producer threads (default: cores)")
    parser.add_argument("--quick", action="store_true", help="small patch, few batches (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    batches, rounds = count_option(args.batches, 300, 50, args.quick), count_option(args.rounds, 5, 2, args.quick)
    if batches < 1 or rounds < 1 or args.threads < 1:
        parser.error("--batches, --rounds and --threads must be >= 1")
    shape, patch = ((32, 96, 96), (8, 32, 32)) if args.quick else ((96, 384, 384), (32, 128, 128))
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, shape, dtype=np.uint8)
    labels = rng.integers(0, 2**40, shape, dtype=np.uint64)

    def make():
        return ef.Loader(raw, labels, patch=patch, batch_size=8, threads=args.threads, seed=1)

    buffers = make().buffers
    rates, per_1000, slots = cpu_rows(make, batches, rounds)
    ratio = statistics.median(rates["natural"]) / statistics.median(rates["careful"])
    verdict = "PASS" if ratio >= CPU_TARGET and slots["natural"] <= buffers + 1 else "MISS"
    report = {"machine": machine_info(), "shape": shape, "patch": patch, "threads": args.threads,
              "batches": batches, "rounds": rounds, "batches_per_s": rates, "allocations_per_1000": per_1000,
              "buffers": buffers, "slots_at_end": slots, "ratio": ratio, "target": CPU_TARGET, "verdict": verdict}
    print(f"machine: {report['machine']}")
    print(f"volume {shape}, batch 8 x {patch}, threads={args.threads}, {batches} timed batches x {rounds} rounds")
    for name in ("careful", "natural"):
        print(f"{name:8s}: {statistics.median(rates[name]):8.1f} batches/s (rounds: "
              f"{', '.join(f'{r:.1f}' for r in rates[name])}), {per_1000[name]:.1f} slot allocations / 1000 timed "
              f"batches, {slots[name]} slots at the end")
    print(f"natural / careful: {ratio:.3f} (target >= {CPU_TARGET}, at most buffers + 1 = {buffers + 1} slots): "
          f"{verdict}")

    reason = cuda_unavailable()
    if reason is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            reason = "PyTorch is not installed"
    if reason is None:
        gpu = gpu_rows(raw, labels, patch, args.threads, batches)
        gpu["verdict"] = "PASS" if gpu["step_ratio"] >= STEP_TARGET and gpu["device_bytes_per_1000_batches"] <= 0 \
            else "MISS"
        report["gpu"] = gpu
        print(f"GPU: natural-loop steps/s {gpu['natural_steps_per_s']:.1f} vs resident {gpu['resident_steps_per_s']:.1f}"
              f" = {gpu['step_ratio']:.3f} (target >= {STEP_TARGET}); device memory "
              f"{gpu['device_bytes_per_1000_batches'] / 2**20:+.1f} MiB / 1000 batches (target 0); "
              f"{gpu['device_slots']} device slots; device / host delivery {gpu['device_over_host']:.2f}: "
              f"{gpu['verdict']}")
    else:
        report["gpu"] = {"skipped": reason}
        print(f"GPU rows skipped: {reason}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
