#!/usr/bin/env python
"""emfast foundation benchmark: the issue's performance targets, measured as ratios in one run.

    python benchmarks/foundation.py [--json PATH] [--quick] [--reps N] [--strict]

Every target is a ratio against a baseline measured in the same process, interleaved with it, so the numbers
hold on a shared, noisy machine:

* gather kernel (raw, one thread) vs the NumPy reference pipeline ........ speed-up >= 4x
* gather kernel (raw) vs np.copyto of the float32 output (bandwidth floor)  ratio <= 1.25
  (informational: labels kernel vs copyto of the uint64 output; raw + labels vs both copies)
* Loader batches/s with threads=2 vs threads=1 ............................ >= 1.7
* RSS growth of a running loader between batch 1,000 and 10,000 .......... < 1% of volumes + slots, or < 4 MiB

Standard task (see _workload.py): batch of 8 windows of (32, 128, 128) from a (96, 384, 384) in-memory volume,
random corners, the 16 anisotropic transforms (Mirror() + Transpose()), uint8 raw -> float32, uint64 labels.
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
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast  # noqa: E402
from _workload import (BATCH, PATCH, SCALE, SHIFT, VOLUME_SHAPE, Workload, machine_info, rss_bytes,  # noqa: E402
                       transform_codes, uniform_plan)

MiB = 2**20
TARGET_SPEEDUP = 4.0
TARGET_COPY_RATIO = 1.25
TARGET_SCALING = 1.7
TARGET_GROWTH_FRACTION = 0.01
TARGET_GROWTH_BYTES = 4 * MiB
MEMORY_PATCH = (16, 64, 64)
MEMORY_CHECKPOINT = 1000


# -- helpers ----------------------------------------------------------------------------------------------------

def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary(seconds) -> dict:
    """Median, quartiles and min of a list of times, in ms."""
    ms = sorted(1e3 * s for s in seconds)
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "p25_ms": q[0], "p75_ms": q[2], "min_ms": ms[0], "n": len(ms)}


def make_loader(workload: Workload, threads: int, patch=PATCH) -> emfast.Loader:
    return emfast.Loader(workload.raw[0], workload.labels[0], patch=patch, batch_size=workload.batch,
                         augment=[emfast.Mirror(), emfast.Transpose()], threads=threads, seed=0,
                         normalize=(SCALE, SHIFT))


# -- 1. kernels vs NumPy reference vs memory copy -----------------------------------------------------------------

def bench_kernels(workload: Workload, reps: int) -> dict:
    raw_out, labels_out = workload.new_raw_out(), workload.new_labels_out()
    raw_src, raw_dst = workload.new_raw_out(), workload.new_raw_out()
    labels_src, labels_dst = workload.new_labels_out(), workload.new_labels_out()

    for plan in workload.plans:  # never time a broken kernel
        np.testing.assert_array_equal(workload.kernel_raw(plan, raw_out), workload.reference_raw(plan),
                                      err_msg="gather_convert differs from the NumPy reference")
        np.testing.assert_array_equal(workload.kernel_labels(plan, labels_out), workload.reference_labels(plan),
                                      err_msg="gather_copy differs from the NumPy reference")

    methods = {
        "raw_kernel": lambda plan: workload.kernel_raw(plan, raw_out),
        "raw_numpy": workload.reference_raw,
        "raw_copyto": lambda plan: np.copyto(raw_dst, raw_src),
        "labels_kernel": lambda plan: workload.kernel_labels(plan, labels_out),
        "labels_numpy": workload.reference_labels,
        "labels_copyto": lambda plan: np.copyto(labels_dst, labels_src),
    }
    names = list(methods)
    times = {name: [] for name in names}
    clock = time.perf_counter
    for rep in range(-1, reps):  # rep -1 is an untimed warm-up
        plan = workload.plans[rep % len(workload.plans)]
        shift = rep % len(names)  # rotate the order so drifts and neighbours hit every method alike
        for name in names[shift:] + names[:shift]:
            fn = methods[name]
            t0 = clock()
            fn(plan)
            t1 = clock()
            if rep >= 0:
                times[name].append(t1 - t0)
    times["both_kernel"] = [a + b for a, b in zip(times["raw_kernel"], times["labels_kernel"])]
    times["both_copyto"] = [a + b for a, b in zip(times["raw_copyto"], times["labels_copyto"])]
    stats = {name: summary(t) for name, t in times.items()}
    med = {name: s["median_ms"] for name, s in stats.items()}
    return {
        "reps": reps,
        "plans": len(workload.plans),
        "distinct_transforms": len(transform_codes(workload.plans)),
        "times": stats,
        "raw_speedup_vs_numpy": med["raw_numpy"] / med["raw_kernel"],
        "raw_vs_copyto": med["raw_kernel"] / med["raw_copyto"],
        "labels_speedup_vs_numpy": med["labels_numpy"] / med["labels_kernel"],
        "labels_vs_copyto": med["labels_kernel"] / med["labels_copyto"],
        "both_vs_copyto": med["both_kernel"] / med["both_copyto"],
    }


TRANSFORMS = {  # (perm, flips in source axes z, y, x), the same for every example of the batch
    "identity": ((0, 1, 2), (False, False, False)),
    "mirror z": ((0, 1, 2), (True, False, False)),
    "mirror y": ((0, 1, 2), (False, True, False)),
    "mirror x": ((0, 1, 2), (False, False, True)),
    "mirror zyx": ((0, 1, 2), (True, True, True)),
    "transpose yx": ((0, 2, 1), (False, False, False)),
    "transpose yx + mirror y": ((0, 2, 1), (False, True, False)),
    "transpose yx + mirror zyx": ((0, 2, 1), (True, True, True)),
}
FLUSH_BYTES = 96 * MiB  # larger than any L3 we run on: evicts the volume windows and outputs between calls


def bench_transforms(workload: Workload, reps: int) -> dict:
    """Informational: kernel time per transform class, each call on a cold cache, against np.copyto on a cold
    cache (where the kernel time goes; the mixed-transform timings above sit between these)."""
    raw_out, labels_out = workload.new_raw_out(), workload.new_labels_out()
    raw_src, labels_src = workload.new_raw_out(), workload.new_labels_out()
    junk_src = np.ones(FLUSH_BYTES, dtype=np.uint8)
    junk_dst = np.zeros(FLUSH_BYTES, dtype=np.uint8)
    plans = {name: [uniform_plan(p, perm, flips, workload.patch, workload.raw.shape[1:])
                    for p in workload.plans[:4]] for name, (perm, flips) in TRANSFORMS.items()}
    calls = {}
    for name in TRANSFORMS:
        calls[(name, "raw")] = lambda rep, name=name: workload.kernel_raw(plans[name][rep % 4], raw_out)
        calls[(name, "labels")] = lambda rep, name=name: workload.kernel_labels(plans[name][rep % 4], labels_out)
    calls[("copyto", "raw")] = lambda rep: np.copyto(raw_out, raw_src)
    calls[("copyto", "labels")] = lambda rep: np.copyto(labels_out, labels_src)
    identity = plans["identity"]
    calls[("numpy crop", "raw")] = lambda rep: _crop_copy(workload.raw, identity[rep % 4], raw_out)
    calls[("numpy crop", "labels")] = lambda rep: _crop_copy(workload.labels, identity[rep % 4], labels_out)
    keys = list(calls)
    times = {key: [] for key in keys}
    for rep in range(-1, reps):
        shift = rep % len(keys)
        for key in keys[shift:] + keys[:shift]:
            np.copyto(junk_dst, junk_src)
            t0 = time.perf_counter()
            calls[key](rep)
            t1 = time.perf_counter()
            if rep >= 0:
                times[key].append(t1 - t0)
    result = {}
    for (name, kind), t in times.items():
        result.setdefault(name, {})[kind] = statistics.median(t) * 1e3
    return result


def _crop_copy(volume: np.ndarray, plan, out: np.ndarray) -> None:
    """np.copyto of each untransformed window into the output: the floor for a strided crop (no transform)."""
    for n, (corner, extent) in enumerate(zip(plan.corners, plan.extents)):
        box = tuple(slice(int(c), int(c) + int(e)) for c, e in zip(corner, extent))
        np.copyto(out[n], volume[(slice(None),) + box], casting="unsafe")


# -- 2. loader scaling --------------------------------------------------------------------------------------------

def run_loader(workload: Workload, threads: int, batches: int, warmup: int) -> dict:
    with make_loader(workload, threads) as loader:
        for _ in range(warmup):
            loader.next_batch()
        before = loader.profile
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        after = loader.profile
    per_batch = {stage: 1e3 * (after.seconds[stage] - before.seconds[stage]) / batches for stage in after.seconds}
    # Cores this process kept busy: well under `threads` means the producers did not get the CPU they wanted
    # (another process on the machine, or the GIL), and the scaling figure is not the loader's alone.
    return {"seconds": elapsed, "batches_per_s": batches / elapsed, "cpu_cores_used": cpu / elapsed,
            "profile_ms_per_batch": per_batch}


def bench_loader(workload: Workload, reps: int, batches: int, warmup: int) -> dict:
    runs = {1: [], 2: []}
    for rep in range(reps):
        for threads in ((1, 2) if rep % 2 == 0 else (2, 1)):  # alternate so noise hits both settings
            runs[threads].append(run_loader(workload, threads, batches, warmup))
    best = {t: max(r, key=lambda run: run["batches_per_s"]) for t, r in runs.items()}
    return {
        "reps": reps, "batches": batches, "warmup": warmup,
        "batches_per_s": {t: [r["batches_per_s"] for r in rs] for t, rs in runs.items()},
        "best_batches_per_s": {t: b["batches_per_s"] for t, b in best.items()},
        "best_profile_ms_per_batch": {t: b["profile_ms_per_batch"] for t, b in best.items()},
        "best_cpu_cores_used": {t: b["cpu_cores_used"] for t, b in best.items()},
        "scaling": best[2]["batches_per_s"] / best[1]["batches_per_s"],
    }


def run_kernels_threaded(workload: Workload, threads: int, batches: int) -> float:
    """Batches/s of raw + labels kernels called directly from ``threads`` threads (no loader), each thread
    doing ``batches / threads`` batches into its own outputs: the hardware's own scaling."""
    outputs = [(workload.new_raw_out(), workload.new_labels_out()) for _ in range(threads)]
    per_thread = batches // threads
    barrier = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        raw_out, labels_out = outputs[k]
        barrier.wait()
        for i in range(per_thread):
            plan = workload.plans[(k * per_thread + i) % len(workload.plans)]
            workload.kernel_raw(plan, raw_out)
            workload.kernel_labels(plan, labels_out)

    workers = [threading.Thread(target=work, args=(k,), name=f"bench-kernel-{k}") for k in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    t0 = time.perf_counter()
    for worker in workers:
        worker.join()
    return per_thread * threads / (time.perf_counter() - t0)


def bench_kernel_scaling(workload: Workload, reps: int, batches: int) -> dict:
    rates = {1: [], 2: []}
    for rep in range(reps):
        for threads in ((1, 2) if rep % 2 == 0 else (2, 1)):
            rates[threads].append(run_kernels_threaded(workload, threads, batches))
    return {"batches_per_s": rates, "scaling": max(rates[2]) / max(rates[1])}


# -- 3. memory ----------------------------------------------------------------------------------------------------

def bench_memory(workload: Workload, batches: int) -> dict:
    checkpoint = min(MEMORY_CHECKPOINT, batches // 2)
    volume_bytes = workload.raw.nbytes + workload.labels.nbytes
    rss_before = rss_bytes()
    samples = {}
    t0 = time.perf_counter()
    with make_loader(workload, threads=2, patch=MEMORY_PATCH) as loader:
        slot_bytes = loader.slot_bytes * loader.buffers
        for number in range(1, batches + 1):
            batch = loader.next_batch()
            float(batch["raw"][0, 0, 0, 0, 0])  # touch it, as a consumer would
            if number in (1, checkpoint, batches) or number % 1000 == 0:
                samples[number] = rss_bytes()
        del batch
    elapsed = time.perf_counter() - t0
    growth = samples[batches] - samples[checkpoint]
    limit = max(TARGET_GROWTH_FRACTION * (volume_bytes + slot_bytes), TARGET_GROWTH_BYTES)
    return {
        "patch": MEMORY_PATCH, "batch": workload.batch, "threads": 2, "batches": batches, "checkpoint": checkpoint,
        "seconds": elapsed,
        "volume_bytes": volume_bytes, "slot_bytes": slot_bytes,
        "rss_before_loader": rss_before, "rss_by_batch": samples,
        "rss_after_warmup": samples[1], "growth_bytes": growth,
        "growth_fraction": growth / (volume_bytes + slot_bytes), "growth_limit_bytes": limit,
    }


# -- report -------------------------------------------------------------------------------------------------------

def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(info: dict, kernels: dict, transforms: dict, loader: dict, kernel_scaling: dict, memory: dict) -> tuple:
    t = kernels["times"]
    growth, limit = memory["growth_bytes"], memory["growth_limit_bytes"]
    rows = [  # (name, measured, target, result, value)
        ("gather raw: speed-up vs NumPy reference", f"{kernels['raw_speedup_vs_numpy']:.2f}x",
         f">= {TARGET_SPEEDUP:g}x", verdict(kernels["raw_speedup_vs_numpy"] >= TARGET_SPEEDUP),
         kernels["raw_speedup_vs_numpy"]),
        ("gather raw / np.copyto float32 output", f"{kernels['raw_vs_copyto']:.2f}",
         f"<= {TARGET_COPY_RATIO:g}", verdict(kernels["raw_vs_copyto"] <= TARGET_COPY_RATIO),
         kernels["raw_vs_copyto"]),
        ("gather labels / np.copyto uint64 output", f"{kernels['labels_vs_copyto']:.2f}", "(info)", "",
         kernels["labels_vs_copyto"]),
        ("gather labels: speed-up vs NumPy reference", f"{kernels['labels_speedup_vs_numpy']:.2f}x", "(info)", "",
         kernels["labels_speedup_vs_numpy"]),
        ("gather raw+labels / both copies", f"{kernels['both_vs_copyto']:.2f}", "(info)", "",
         kernels["both_vs_copyto"]),
        ("loader batches/s threads=2 / threads=1", f"{loader['scaling']:.2f}", f">= {TARGET_SCALING:g}",
         verdict(loader["scaling"] >= TARGET_SCALING), loader["scaling"]),
        (f"memory: RSS growth batch {memory['checkpoint']:,}->{memory['batches']:,}", f"{growth / MiB:+.2f} MiB",
         f"< {limit / MiB:.2f} MiB", verdict(growth < limit), growth),
    ]
    lines = []
    out = lines.append
    out(f"machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"{info['memory_gib']} GiB, load average {info['load_average']}")
    out(f"software: Python {info['python']}, NumPy {info['numpy']}, emfast {info['emfast']}")
    out(f"task: batch {BATCH} x {PATCH} from {VOLUME_SHAPE}, uint8 raw -> float32, uint64 labels, "
        f"{kernels['plans']} fixed plans ({kernels['distinct_transforms']} distinct transforms)")
    out("")
    out(f"{'target':<46} {'measured':>12} {'target':>12}  result")
    out("-" * 80)
    for name, measured, target, result, _ in rows:
        out(f"{name:<46} {measured:>12} {target:>12}  {result}")
    out("")
    out(f"kernel timings, ms per batch (median [p25, p75] of {kernels['reps']} interleaved reps):")
    labels = {"raw_kernel": "raw    emfast gather_convert", "raw_numpy": "raw    NumPy reference",
              "raw_copyto": "raw    np.copyto float32 output", "labels_kernel": "labels emfast gather_copy",
              "labels_numpy": "labels NumPy reference", "labels_copyto": "labels np.copyto uint64 output",
              "both_kernel": "both   emfast kernels", "both_copyto": "both   np.copyto outputs"}
    for key, label in labels.items():
        s = t[key]
        out(f"  {label:<34} {s['median_ms']:8.3f}  [{s['p25_ms']:.3f}, {s['p75_ms']:.3f}]")
    out("")
    raw_copy, labels_copy = transforms["copyto"]["raw"], transforms["copyto"]["labels"]
    out("kernel time per transform, cold cache (same transform for all 8 examples; median ms and / np.copyto")
    out(f"of the output on a cold cache: raw {raw_copy:.3f} ms, labels {labels_copy:.3f} ms):")
    for name, ms in transforms.items():
        if name == "copyto":
            continue
        if name == "numpy crop":
            name = "(np.copyto of the crops)"
        out(f"  {name:<28} raw {ms['raw']:7.3f} ({ms['raw'] / raw_copy:4.2f})   "
            f"labels {ms['labels']:7.3f} ({ms['labels'] / labels_copy:4.2f})")
    out("")
    best = loader["best_batches_per_s"]
    out(f"loader: best of {loader['reps']} x {loader['batches']} batches (after {loader['warmup']} warm-up): "
        f"threads=1 {best[1]:.1f} batches/s, threads=2 {best[2]:.1f} batches/s")
    for threads, runs in loader["batches_per_s"].items():
        prof = loader["best_profile_ms_per_batch"][threads]
        out(f"  threads={threads}: runs {', '.join(f'{r:.1f}' for r in runs)} batches/s; ms/batch (summed over "
            f"threads): sample {prof['sample']:.2f}, kernel {prof['kernel']:.2f}, stall {prof['stall']:.2f}, "
            f"consumer wait {prof['wait']:.2f}; {loader['best_cpu_cores_used'][threads]:.2f} cores busy")
    ks = kernel_scaling["batches_per_s"]
    out(f"  kernels alone (raw + labels called from plain threads, no loader): threads=1 {max(ks[1]):.1f}, "
        f"threads=2 {max(ks[2]):.1f} batches/s, scaling {kernel_scaling['scaling']:.2f} (the hardware's ceiling)")
    busy = loader["best_cpu_cores_used"][2]
    if busy < 1.6 and (info["usable_cores"] or 0) >= 2:
        out(f"  WARNING: the threads=2 run kept only {busy:.2f} cores busy; if other processes were running "
            f"(load average {info['load_average']}), repeat on a quiet machine before trusting the scaling")
    out("")
    by = memory["rss_by_batch"]
    out(f"memory: batch {memory['batch']} x {memory['patch']}, threads=2, {memory['batches']:,} batches in "
        f"{memory['seconds']:.1f} s; volumes {memory['volume_bytes'] / MiB:.1f} MiB + slots "
        f"{memory['slot_bytes'] / MiB:.1f} MiB")
    out(f"  RSS before loader {memory['rss_before_loader'] / MiB:.1f} MiB, after batch 1 "
        f"{memory['rss_after_warmup'] / MiB:.1f} MiB, batch {memory['checkpoint']:,} "
        f"{by[memory['checkpoint']] / MiB:.1f} MiB, batch {memory['batches']:,} {by[memory['batches']] / MiB:.1f} MiB "
        f"(growth {100 * memory['growth_fraction']:+.3f}% of volumes + slots; limit: "
        f"{100 * TARGET_GROWTH_FRACTION:g}% or {TARGET_GROWTH_BYTES / MiB:g} MiB)")
    return lines, rows


# -- main ---------------------------------------------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python benchmarks/foundation.py",
        description="Measure emfast's foundation performance targets (ratios against same-run baselines).")
    parser.add_argument("--json", metavar="PATH", help="also write every number to this JSON file")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions and 2,000 batches for the memory part (a smoke run)")
    parser.add_argument("--reps", type=int, metavar="N",
                        help="interleaved repetitions of the kernel comparison (default 60, 20 with --quick)")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 if a target is missed")
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 5:
        parser.error(f"--reps must be at least 5, got {args.reps}")
    if args.json is not None:
        path = Path(args.json)
        if args.json.strip() == "" or path.is_dir():
            parser.error(f"--json needs a file path, got {args.json!r}")
        try:  # fail now, not after the measurements
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            parser.error(f"--json: cannot create the folder {str(path.parent)!r}: {error}")
        try:
            with tempfile.TemporaryFile(dir=path.parent):
                pass
        except OSError as error:
            parser.error(f"--json: cannot write in {str(path.parent)!r}: {error}")
        if path.exists() and not os.access(path, os.W_OK):
            parser.error(f"--json: {args.json!r} is not writable")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    kernel_reps = args.reps or (20 if args.quick else 60)
    transform_reps = 8 if args.quick else 20
    loader_reps, loader_batches, loader_warmup = (2, 60, 3) if args.quick else (3, 150, 5)
    memory_batches = 2000 if args.quick else 10000

    info = machine_info()
    log("building the workload ...")
    workload = Workload.create()
    started = time.perf_counter()
    log(f"kernels: {kernel_reps} interleaved reps ...")
    kernels = bench_kernels(workload, kernel_reps)
    transforms = bench_transforms(workload, transform_reps)
    log(f"loader: {loader_reps} x {loader_batches} batches per setting ...")
    loader = bench_loader(workload, loader_reps, loader_batches, loader_warmup)
    kernel_scaling = bench_kernel_scaling(workload, loader_reps, loader_batches)
    log(f"memory: {memory_batches:,} batches ...")
    memory = bench_memory(workload, memory_batches)
    lines, rows = report(info, kernels, transforms, loader, kernel_scaling, memory)
    print("\n".join(lines))
    leftover = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if leftover:
        print(f"WARNING: threads still running: {leftover}")

    missed = [row[0] for row in rows if row[3] == "MISS"]
    if args.json:
        result = {"machine": info, "quick": args.quick, "seconds": time.perf_counter() - started,
                  "task": {"batch": BATCH, "patch": PATCH, "volume": VOLUME_SHAPE, "raw": "uint8 -> float32",
                           "labels": "uint64", "scale": SCALE, "shift": SHIFT},
                  "targets": {name: {"value": value, "measured": measured, "target": target,
                                     "result": res or "info"} for name, measured, target, res, value in rows},
                  "kernels": kernels, "transforms_ms": transforms, "loader": loader,
                  "kernel_scaling": kernel_scaling, "memory": memory,
                  "missed": missed, "leftover_threads": leftover}
        path = Path(args.json)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
        except OSError as error:
            print(f"error: cannot write {path}: {error}", file=sys.stderr)
            return 2
        log(f"wrote {path}")
    return 1 if (args.strict and missed) else 0


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
