#!/usr/bin/env python
"""Issue 24 item 2: what fields at other voxel sizes cost against fields at raw's voxel size, in the same run.

    python benchmarks/fields_resolution.py [--batches N] [--json PATH] [--quick]

One EM-like volume (raw uint8 at (40, 4, 4) nm, uint64 labels, uint8 mask), batches of 8 x (32, 128, 128) with
mirror + transpose, labels delivered (no targets), one producer thread and two. Contenders:

* ``same``: labels and mask at raw's voxel size (the baseline);
* ``raw grid``: labels 2x coarser and the mask 4x coarser along every axis (the same data subsampled, offsets
  in nm), delivered on raw's grid: each window read at the field's voxel size and resampled by the rescale kernel
  (nearest), then gathered like raw;
* ``own``: the same coarse fields delivered at their own voxel size (windows snapped to their common grid).

The contenders alternate, in ``--rounds`` rounds; each is reported by its fastest round (the machine is shared,
so the minimum is the least disturbed figure) with the slowest beside it, and ratios are against the fastest
``same`` round. Also lazily read (zarr stores, chunk cache), where the coarse fields' chunks go through the cache:
every chunk is read once before the rounds, so all lazy rows are warm-cache figures (the cost of resampling
through the cache, not of reading the store; otherwise the first contender alone paid the cold reads).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import zarr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

PATCH = (32, 128, 128)
BATCH = 8
SHAPE = (64, 384, 384)
VOXEL = (40, 4, 4)


def make_fields(shape):
    """raw, and labels / mask at raw's voxel size and coarser: (array, voxel size, offset) each."""
    raw, labels = make_em_volume(shape, seed=0)
    labels = labels.astype(np.uint64)
    mask = (labels % 7 != 0).astype(np.uint8)
    coarse = lambda k: tuple(v * k for v in VOXEL)  # noqa: E731
    return {
        "raw": (raw, VOXEL, (0, 0, 0)),
        "labels": (labels, VOXEL, (0, 0, 0)),
        "mask": (mask, VOXEL, (0, 0, 0)),
        "labels_2x": (np.ascontiguousarray(labels[::2, ::2, ::2]), coarse(2), (0, 0, 0)),
        "mask_4x": (np.ascontiguousarray(mask[::4, ::4, ::4]), coarse(4), (0, 0, 0)),
    }


def volumes(fields, lazy, folder):
    if not lazy:
        return {name: ef.Volume.from_array(data, name=name, resolution=voxel, offset=offset)
                for name, (data, voxel, offset) in fields.items()}
    opened = {}
    for name, (data, voxel, offset) in fields.items():
        array = zarr.open_array(os.path.join(folder, f"{name}.zarr"), mode="w", shape=data.shape, dtype=data.dtype,
                                chunks=(16, 64, 64), zarr_format=2)
        array[...] = data
        array.attrs.update(resolution=list(voxel), offset=list(offset))
        opened[name] = ef.open(os.path.join(folder, f"{name}.zarr"), in_memory=False)
        opened[name][:]  # every chunk into the cache: the contenders all time warm reads
    return opened


def sample(v, contender):
    if contender == "same":
        return ef.Sample(v["raw"], v["labels"], v["mask"])
    own = ["labels", "mask"] if contender == "own" else []
    return ef.Sample(v["raw"], v["labels_2x"], v["mask_4x"], own_resolution=own)


def time_loader(v, contender, threads, batches):
    loader = ef.Loader(sample(v, contender), patch=PATCH, batch_size=BATCH, threads=threads, seed=0,
                       augment=["mirror", "transpose"])
    with loader:
        for _ in range(2 * threads + 2):  # fill the ring once
            loader.next_batch()
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        seconds = (time.perf_counter() - start) / batches
        profile = loader.profile.as_dict()["per_batch_ms"]
    return seconds, {stage: round(ms, 3) for stage, ms in profile.items() if ms > 0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--batches", type=int, default=None,
                        help="timed batches per contender and round (default 20; --quick: 3)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of all contenders (default 3; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="a small volume and few batches (a smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    batches = count_option(args.batches, 20, 3, args.quick)
    rounds = count_option(args.rounds, 3, 1, args.quick)
    shape = (48, 160, 160) if args.quick else SHAPE
    fields = make_fields(shape)
    results, lines = [], []
    with tempfile.TemporaryDirectory() as folder:
        for lazy in (False, True):
            v = volumes(fields, lazy, folder)
            for threads in (1, 2):
                runs = {contender: [] for contender in ("same", "raw grid", "own")}
                for _ in range(rounds):
                    for contender, timings in runs.items():
                        timings.append(time_loader(v, contender, threads, batches))
                baseline = min(seconds for seconds, _ in runs["same"])
                for contender, timings in runs.items():
                    seconds, profile = min(timings, key=lambda timing: timing[0])
                    slowest = max(s for s, _ in timings)
                    row = {"lazy": lazy, "threads": threads, "contender": contender, "ms_per_batch": 1e3 * seconds,
                           "slowest_round_ms": 1e3 * slowest, "ratio_to_same": seconds / baseline,
                           "stages_ms": profile}
                    results.append(row)
                    lines.append(f"{'lazy' if lazy else 'in memory':<10} {threads:>7} {contender:<9} "
                                 f"{1e3 * seconds:>9.1f} {1e3 * slowest:>8.1f} {seconds / baseline:>7.2f}x  "
                                 + ", ".join(f"{k} {ms:.1f}" for k, ms in profile.items()))
            for volume in v.values():
                volume.close()
    print(f"machine: {machine_info()}")
    print(f"volume {shape} raw uint8 at {VOXEL} nm; labels uint64 and mask uint8 at raw's voxel size (same), or "
          f"2x / 4x coarser (raw grid: resampled onto raw's grid; own: at their own voxel size); batch {BATCH} x "
          f"{PATCH}, mirror + transpose, {batches} timed batches per round, {rounds} rounds")
    print(f"{'reads':<10} {'threads':>7} {'contender':<9} {'ms/batch':>9} {'slowest':>8} {'vs same':>8}  "
          "per-stage ms/batch (fastest round)")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "shape": shape, "voxel": VOXEL, "batch": BATCH, "patch": PATCH,
                       "batches": batches, "rounds": rounds, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
