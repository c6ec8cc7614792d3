#!/usr/bin/env python
"""Lazy volumes larger than the chunk cache: peak memory stays within the cache budget.

    python benchmarks/lazy_memory.py [--budget-mib 64] [--volume-mib 256] [--format hdf5|zarr]
                                     [--compression none|gzip|zstd] [--boxes 300] [--batches 50] [--json [PATH]]
                                     [--chunks Z Y X] [--patch Z Y X] [--batch-size 8]

Writes a chunked uint8 HDF5 volume (or a zarr v3 array, ``--format zarr``) four times larger than the cache
budget (default 256 MiB, (256, 1024, 1024), chunks (32, 128, 128), random data) into a temporary folder. Then,
each in a fresh subprocess so that its peak RSS (VmHWM) is its own:

* ``boxes``: opens the volume with ``emfast.open(path, in_memory=False, cache_bytes=budget)`` and reads
  (32, 128, 128) boxes with ``Volume.read_box``: first at random corners anywhere (the cache's worst case: the
  volume is 4x the budget, so most blocks miss, and a box needs up to 8 whole chunks), then at random corners
  inside a "hot" slab of half the budget (the working set fits: mostly hits). Then, as the same-run speed
  baseline, the same boxes with h5py's ``Dataset.read_direct`` (the uncached read that lazy volumes used before
  the cache), or zarr-python's ``Array[box]``.
* ``loader``: streams ``--batches`` batches from ``emfast.Loader(volume, patch=(32, 128, 128), batch_size=8,
  threads=2)`` over the lazy volume.

``--chunks``, ``--patch`` and ``--batch-size`` change the chunks written and the boxes and windows read (small chunks
mean many blocks, reader threads and waves per batch: ``--chunks 16 64 64 --patch 16 64 64 --batch-size 4``).

Each reports its baseline RSS (after imports and opening the volume), its peak RSS, and the allowance
``budget + slots`` (slots = ``loader.slot_bytes * loader.buffers``; none for ``boxes``). Target: peak - baseline
<= 1.10 x (budget + slots). Also reported: boxes/s through the cache vs the uncached baseline, and the cache hit
rates. The loader gathers lazy windows in place from the cache's chunks: it has no per-thread read buffers. The cache
may exceed its budget only while the windows in flight pin more chunks than it holds (not here: 2 threads x 8
windows x at most 8 chunks of 512 KiB is the 64 MiB budget).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workload import _read_field, machine_info  # noqa: E402

MiB = 2**20
BOX = (32, 128, 128)
CHUNKS = (32, 128, 128)
SECTION = (1024, 1024)
TOLERANCE = 0.10
UNCACHED = {"hdf5": "h5py read_direct", "zarr": "zarr-python"}


def kib_field(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS: now, VmHWM: peak)."""
    value = _read_field("/proc/self/status", key)
    if value is None:
        import resource  # no /proc: the peak is all getrusage knows (kB on Linux)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return int(value.split()[0]) * 1024


def write_volume(path: Path, volume_mib: int, compression: str, chunks=CHUNKS) -> tuple:
    """The volume at ``path`` (``.h5``: HDF5 dataset ``raw``; ``.zarr``: a zarr v3 array); its shape."""
    sections = volume_mib * MiB // (SECTION[0] * SECTION[1])
    shape = (sections,) + SECTION
    rng = np.random.default_rng(0)
    if path.suffix == ".zarr":
        import zarr
        codecs = {"none": None, "gzip": zarr.codecs.GzipCodec(level=1), "zstd": zarr.codecs.ZstdCodec(level=3)}
        dataset = zarr.create_array(str(path), shape=shape, dtype=np.uint8, chunks=chunks,
                                    compressors=codecs[compression])
    else:
        import h5py
        options = dict(compression="gzip", compression_opts=1, shuffle=True) if compression == "gzip" else {}
        dataset = h5py.File(path, "w").create_dataset("raw", shape=shape, dtype=np.uint8, chunks=chunks,
                                                      **options)
    for z in range(0, sections, chunks[0]):  # a slab at a time: the parent stays small too
        # noisy grey levels around 128, like EM: barely compressible, as raw EM is
        slab = rng.normal(128, 30, (min(chunks[0], sections - z),) + SECTION).clip(0, 255)
        dataset[z:z + slab.shape[0]] = slab.astype(np.uint8)
    if path.suffix != ".zarr":
        dataset.file.close()
    return shape


def open_lazy(path: str, budget: int):
    import emfast
    return emfast.open(path if path.endswith(".zarr") else f"{path}/raw", in_memory=False, cache_bytes=budget)


# -- children: one measurement each, in a fresh process ----------------------------------------------------------

def child_boxes(path: str, budget: int, boxes: int, patch=BOX, batch_size: int = 8) -> dict:
    volume = open_lazy(path, budget)
    out = np.empty((1,) + tuple(patch), np.uint8)
    out.fill(0)
    rng = np.random.default_rng(1)
    hot_sections = max(patch[0] + 1, budget // 2 // (volume.shape[1] * volume.shape[2]))
    workloads = {"random": volume.shape, "hot": (min(hot_sections, volume.shape[0]),) + volume.shape[1:]}
    corners = {name: [[int(rng.integers(0, s - b + 1)) for s, b in zip(region, patch)] for _ in range(boxes)]
               for name, region in workloads.items()}
    baseline = kib_field("VmRSS")
    result = {"baseline_rss": baseline, "slots": 0, "boxes": boxes}
    for name in workloads:
        before = volume.cache_stats
        started = time.perf_counter()
        for corner in corners[name]:
            volume.read_box(corner, patch, out)
        result[f"{name}_boxes_per_s"] = boxes / (time.perf_counter() - started)
        after = volume.cache_stats
        hits, misses = after.hits + after.shared - before.hits - before.shared, after.misses - before.misses
        result[f"{name}_hit_rate"] = hits / (hits + misses)
    result["peak_rss"] = kib_field("VmHWM")
    result["bytes_held"] = volume.cache_stats.bytes_held
    volume.close()
    for name in workloads:  # the same-run baseline: uncached reads of the same boxes
        with uncached_reader(path) as read:
            started = time.perf_counter()
            for corner in corners[name]:
                read(tuple(slice(c, c + b) for c, b in zip(corner, patch)), out[0])
            result[f"{name}_uncached_boxes_per_s"] = boxes / (time.perf_counter() - started)
    return result


@contextlib.contextmanager
def uncached_reader(path: str):
    """read(box, out) with the format's own library: h5py's read_direct, zarr-python's selection."""
    if path.endswith(".zarr"):
        import zarr
        array = zarr.open_array(path, mode="r")
        def read(box, out):
            out[...] = array[box]
        yield read
        return
    import h5py
    with h5py.File(path, "r") as f:
        dataset = f["raw"]
        yield lambda box, out: dataset.read_direct(out, source_sel=box)


def child_loader(path: str, budget: int, batches: int, patch=BOX, batch_size: int = 8) -> dict:
    import emfast
    volume = open_lazy(path, budget)
    loader = emfast.Loader(volume, patch=tuple(patch), batch_size=batch_size, threads=2, epoch_size=batches)
    baseline = kib_field("VmRSS")
    started = time.perf_counter()
    with loader:
        count = sum(1 for _ in loader)
    elapsed = time.perf_counter() - started
    peak = kib_field("VmHWM")
    stats = volume.cache_stats
    volume.close()
    return {"baseline_rss": baseline, "peak_rss": peak, "slots": loader.slot_bytes * loader.buffers,
            "threads": loader.threads, "buffers": loader.buffers,
            "batches": count, "batches_per_s": count / elapsed, "bytes_held": stats.bytes_held,
            "hit_rate": (stats.hits + stats.shared) / max(1, stats.hits + stats.misses + stats.shared)}


def run_child(phase: str, path: Path, budget: int, count: int, patch=BOX, batch_size: int = 8) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", phase, str(path), str(budget), str(count),
               ",".join(map(str, patch)), str(batch_size)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {phase} subprocess failed:\n{done.stderr}")
    result = json.loads(done.stdout)
    allowance = TOLERANCE * (budget + result["slots"]) + budget + result["slots"]
    result["growth"] = result["peak_rss"] - result["baseline_rss"]
    result["allowance"] = allowance
    result["ok"] = result["growth"] <= allowance
    return result


def report(results: dict, args, shape) -> str:
    lines = [f"lazy {args.format} volume {shape} uint8 ({args.volume_mib} MiB, chunks {tuple(args.chunks)}, "
             f"compression {args.compression})"
             f", cache budget {args.budget_mib} MiB; machine: {results['machine']['cpu']}, "
             f"{results['machine']['usable_cores']} cores"]
    for phase, r in results["phases"].items():
        lines.append(f"{phase:>6}: baseline RSS {r['baseline_rss'] / MiB:7.1f} MiB, peak {r['peak_rss'] / MiB:7.1f} "
                     f"MiB, growth {r['growth'] / MiB:6.1f} MiB <= budget {args.budget_mib} + slots "
                     f"{r['slots'] / MiB:.1f} + 10% = {r['allowance'] / MiB:.1f} MiB: "
                     f"{'OK' if r['ok'] else 'EXCEEDED'} (cache held {r['bytes_held'] / MiB:.1f} MiB)")
    boxes = results["phases"]["boxes"]
    for name, where in (("random", "anywhere"), ("hot", "in a slab of half the budget")):
        cached, uncached = boxes[f"{name}_boxes_per_s"], boxes[f"{name}_uncached_boxes_per_s"]
        lines.append(f" speed, boxes {where}: {cached:.0f} boxes/s through the cache (hit rate "
                     f"{boxes[f'{name}_hit_rate']:.0%}) vs {uncached:.0f} uncached ({UNCACHED[args.format]}): "
                     f"ratio {cached / uncached:.2f}")
    loader = results["phases"]["loader"]
    lines.append(f"loader: {loader['batches']} batches of {args.batch_size} x {tuple(args.patch)} at "
                 f"{loader['batches_per_s']:.1f} batches/s "
                 f"(threads={loader['threads']}, buffers={loader['buffers']}, hit rate {loader['hit_rate']:.0%})")
    lines.append("verdict: " + ("peak RSS within budget + slots + 10%" if results["ok"] else
                                "peak RSS EXCEEDS budget + slots + 10%"))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        phase, path, budget, count = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        patch, batch_size = tuple(int(n) for n in sys.argv[6].split(",")), int(sys.argv[7])
        print(json.dumps((child_boxes if phase == "boxes" else child_loader)(path, budget, count, patch,
                                                                             batch_size)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=int, default=64, help="chunk cache budget (default 64)")
    parser.add_argument("--volume-mib", type=int, default=256, help="volume size; whole sections of 1 MiB "
                        "(default 256, 4x the budget)")
    parser.add_argument("--format", choices=["hdf5", "zarr"], default="hdf5")
    parser.add_argument("--compression", choices=["none", "gzip", "zstd"], default="none",
                        help="zstd: zarr only")
    parser.add_argument("--boxes", type=int, default=300, help="random boxes read in the boxes phase")
    parser.add_argument("--batches", type=int, default=50, help="batches streamed in the loader phase")
    parser.add_argument("--chunks", type=int, nargs=3, default=list(CHUNKS), metavar=("Z", "Y", "X"),
                        help=f"chunks written (default {CHUNKS})")
    parser.add_argument("--patch", type=int, nargs=3, default=list(BOX), metavar=("Z", "Y", "X"),
                        help=f"boxes read and loader windows (default {BOX})")
    parser.add_argument("--batch-size", type=int, default=8, help="loader batch size (default 8)")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="print the results as JSON (to PATH if given, else instead of the text report)")
    args = parser.parse_args()
    if args.budget_mib < 1 or args.volume_mib < CHUNKS[0] or args.boxes < 1 or args.batches < 1:
        parser.error("--budget-mib, --boxes and --batches must be positive, --volume-mib at least 32")
    if args.compression == "zstd" and args.format != "zarr":
        parser.error("--compression zstd is for --format zarr")
    budget = args.budget_mib * MiB
    with tempfile.TemporaryDirectory(prefix="emfast-lazy-") as folder:
        path = Path(folder) / ("volume.zarr" if args.format == "zarr" else "volume.h5")
        shape = write_volume(path, args.volume_mib, args.compression, tuple(args.chunks))
        phases = {phase: run_child(phase, path, budget, count, args.patch, args.batch_size)
                  for phase, count in (("boxes", args.boxes), ("loader", args.batches))}
    results = {"machine": machine_info(), "volume_shape": shape, "chunks": args.chunks, "patch": args.patch,
               "batch_size": args.batch_size, "format": args.format,
               "compression": args.compression,
               "budget_bytes": budget, "tolerance": TOLERANCE, "phases": phases,
               "ok": all(p["ok"] for p in phases.values())}
    if args.json == "-":
        print(json.dumps(results, indent=2))
    else:
        print(report(results, args, shape))
        if args.json is not None:
            Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
