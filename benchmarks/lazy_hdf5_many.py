#!/usr/bin/env python
"""Many lazily read HDF5 files: what parking their files beyond the descriptor bound costs.

    python benchmarks/lazy_hdf5_many.py [--files 1500] [--batches 200] [--rounds 3] [--json PATH]

A training set of ``--files`` small HDF5 cutouts ((8, 32, 32) uint8, gzip, chunks (8, 16, 16)), each opened lazily
(``ef.open(..., in_memory=False)``), read by a Loader (patch (8, 16, 16), batch 8, threads 2, no augmentation)
for ``--batches`` batches, in a fresh subprocess per run so that each has its own descriptors and peak RSS:

- parked: the process's descriptor limit is 256 (macOS's default), so at most 64 of the files are held open
  (``emfast.io._hdf5files.most_open``) and the others are closed and opened again as they are read;
- all open (the baseline, same run): the limit raised to the files' number x 4 + 256, so that every file stays open
  (up to 256 files; more files than that are parked in both runs and the comparison says so).

Reported per run: batches/s, peak RSS (VmHWM), descriptors open at the end, and the ratio parked / all open.
Before parking, the parked run failed at its 251st file ("Too many open files").
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workload import machine_info  # noqa: E402

RUN = r"""
import os, resource, sys, time, json
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
                                            resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import emfast as ef
from emfast.io._hdf5files import OPEN_FILES, most_open
folder, files, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[4])
volumes = [ef.open(os.path.join(folder, f"{i}.h5"), "raw", in_memory=False) for i in range(files)]
dataset = ef.Dataset([ef.Sample(v, name=str(i)) for i, v in enumerate(volumes)])
with ef.Loader(dataset, patch=(8, 16, 16), batch_size=8, threads=2, augment=(), seed=1) as loader:
    loader.next_batch().release()  # threads started, first files read
    start = time.perf_counter()
    for _ in range(batches):
        loader.next_batch().release()
    seconds = time.perf_counter() - start
peak = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
print(json.dumps({"rate": batches / seconds, "peak_mib": peak / 1024, "descriptors": len(os.listdir("/proc/self/fd")),
                  "bound": most_open(), "open_files": OPEN_FILES.count}))
"""


def write_files(folder: str, count: int) -> None:
    import h5py
    import numpy as np
    rng = np.random.default_rng(0)
    for i in range(count):
        with h5py.File(os.path.join(folder, f"{i}.h5"), "w") as f:
            f.create_dataset("raw", data=rng.integers(0, 255, (8, 32, 32), dtype=np.uint8), chunks=(8, 16, 16),
                             compression="gzip")


def run(folder: str, files: int, limit: int, batches: int) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, folder, str(files), str(limit), str(batches)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1500)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    results = {"parked": [], "all open": []}
    with tempfile.TemporaryDirectory() as folder:
        write_files(folder, args.files)
        for _ in range(args.rounds):  # alternating, so that the machine's load falls on both alike
            results["parked"].append(run(folder, args.files, 256, args.batches))
            results["all open"].append(run(folder, args.files, 4 * args.files + 256, args.batches))
    lines = [f"{args.files} lazily read HDF5 cutouts, Loader threads=2, {args.batches} batches, {args.rounds} rounds "
             f"alternating ({machine_info()})"]
    for name, rows in results.items():
        rates = ", ".join(f"{r['rate']:.1f}" for r in rows)
        lines.append(f"  {name:8}: {statistics.median(r['rate'] for r in rows):7.1f} batches/s (median; "
                     f"{rates}), peak RSS "
                     f"{statistics.median(r['peak_mib'] for r in rows):.0f} MiB, bound {rows[0]['bound']} files, "
                     f"{rows[0]['open_files']} open at the end, {rows[0]['descriptors']} descriptors")
    ratio = statistics.median(r["rate"] for r in results["parked"]) / \
        statistics.median(r["rate"] for r in results["all open"])
    lines.append(f"  parked / all open: {ratio:.2f}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "ratio": ratio, "files": args.files}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
