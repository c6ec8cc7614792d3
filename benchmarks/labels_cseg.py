#!/usr/bin/env python
"""Labels in neuroglancer's compressed_segmentation encoding, as cloud-volume writes them: emfast's decoder against
tensorstore's on the same chunks.

    python benchmarks/labels_cseg.py [--rounds R] [--json PATH] [--quick]

Data: the built-in EM volume's uint64 labels, (64, 256, 256) (--quick: (32, 128, 128)), written by cloud-volume as
an unsharded precomputed scale with chunks (64, 64, 64) and blocks (8, 8, 8), twice: uncompressed chunk files
(which tensorstore and emfast both read) and gzipped ones (cloud-volume's default; tensorstore reads no compressed
chunk file from a local store). Measured, alternating over rounds (best, median beside): the whole volume read in
memory, and the lazily read boxes of 64 random (32, 128, 128) windows, by emfast and by tensorstore, each through a
fresh cache of CACHE_BYTES per round (emfast decodes this encoding on the calling thread; tensorstore on its own
thread pool, all cores). Reported: emfast / tensorstore rates on the uncompressed files, and
emfast's rate on the gzipped ones. Every ratio is against a baseline from the same run.
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
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

CHUNK, BLOCK, WINDOW = (64, 64, 64), (8, 8, 8), (32, 128, 128)
#: The chunk cache of both readers of the boxes (decoded chunks).
CACHE_BYTES = 64 << 20


def write(path: str, labels: np.ndarray, compress) -> None:
    from cloudvolume import CloudVolume
    info = CloudVolume.create_new_info(
        num_channels=1, layer_type="segmentation", data_type="uint64", encoding="compressed_segmentation",
        resolution=[4, 4, 40], voxel_offset=[0, 0, 0], chunk_size=list(CHUNK[::-1]),
        volume_size=list(labels.shape[::-1]), compressed_segmentation_block_size=list(BLOCK))
    volume = CloudVolume(f"file://{path}", info=info, compress=compress, progress=False)
    volume.commit_info()
    volume[:, :, :] = labels.T[..., np.newaxis]


def emfast_whole(path: str) -> np.ndarray:
    return ef.open(path, format="precomputed").array[0]


def emfast_boxes(path: str, corners) -> None:
    volume = ef.open(path, format="precomputed", in_memory=False, cache_bytes=CACHE_BYTES)
    out = np.empty((1,) + WINDOW, np.uint64)
    for corner in corners:
        volume.read_box(corner, WINDOW, out)
    volume.close()


def tensorstore_store(path: str, cache_bytes: int = 0):
    import tensorstore as ts
    return ts.open({"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": path},
                    "context": {"cache_pool": {"total_bytes_limit": cache_bytes}}, "recheck_cached_data": False},
                   read=True).result()


def tensorstore_whole(path: str) -> np.ndarray:
    return tensorstore_store(path)[..., 0].read().result().T


def tensorstore_boxes(path: str, corners) -> None:
    store = tensorstore_store(path, CACHE_BYTES)
    for z, y, x in corners:
        store[x:x + WINDOW[2], y:y + WINDOW[1], z:z + WINDOW[0], 0].read().result()


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5; --quick: 2)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a smaller volume, 2 rounds")
    args = parser.parse_args(argv)
    rounds = count_option(args.rounds, 5, 2, args.quick)
    shape = (32, 128, 128) if args.quick else (64, 256, 256)
    _, labels = make_em_volume(shape, seed=0)
    labels = labels.astype(np.uint64)
    rng = np.random.default_rng(1)
    corners = [tuple(int(rng.integers(0, s - w + 1)) for s, w in zip(shape, WINDOW)) for _ in range(64)]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        plain, gzipped = os.path.join(directory, "plain"), os.path.join(directory, "gzipped")
        write(plain, labels, False)
        write(gzipped, labels, None)
        assert np.array_equal(emfast_whole(plain), labels) and np.array_equal(tensorstore_whole(plain), labels)
        assert np.array_equal(emfast_whole(gzipped), labels)
        calls = {"whole": {"emfast": lambda: emfast_whole(plain), "tensorstore": lambda: tensorstore_whole(plain),
                           "emfast .gz": lambda: emfast_whole(gzipped)},
                 "boxes": {"emfast": lambda: emfast_boxes(plain, corners),
                           "tensorstore": lambda: tensorstore_boxes(plain, corners),
                           "emfast .gz": lambda: emfast_boxes(gzipped, corners)}}
        seconds = {task: {name: [] for name in row} for task, row in calls.items()}
        for _ in range(rounds):
            for task, row in calls.items():
                for name, call in row.items():
                    seconds[task][name].append(timed(call))
    load_after = os.getloadavg()
    megabytes = labels.nbytes / 1e6
    lines = [f"compressed_segmentation labels {shape} uint64 (chunks {CHUNK}, blocks {BLOCK}), written by "
             f"cloud-volume, best of {rounds} rounds (median); emfast one thread, tensorstore its pool",
             f"  load average (1, 5, 15 min): before {load_before}, after {load_after}"]
    summary = {}
    for task, row in seconds.items():
        best = {name: min(values) for name, values in row.items()}
        median = {name: statistics.median(values) for name, values in row.items()}
        what = "whole volume in memory" if task == "whole" else f"{len(corners)} boxes {WINDOW}, lazily"
        ratio = best["tensorstore"] / best["emfast"]
        summary[task] = {"seconds": best, "seconds_median": median, "emfast / tensorstore": ratio}
        lines.append(f"  {what}: emfast {best['emfast'] * 1e3:.1f} ms ({median['emfast'] * 1e3:.1f}), tensorstore "
                     f"{best['tensorstore'] * 1e3:.1f} ms ({median['tensorstore'] * 1e3:.1f}): emfast / tensorstore "
                     f"{ratio:.2f}x; emfast on the .gz files {best['emfast .gz'] * 1e3:.1f} ms "
                     f"({median['emfast .gz'] * 1e3:.1f})" + (f", {megabytes / best['emfast .gz']:.0f} MB/s of labels"
                                                              if task == "whole" else ""))
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "shape": shape, "load": [load_before, load_after],
                       "raw": seconds, "summary": summary}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
