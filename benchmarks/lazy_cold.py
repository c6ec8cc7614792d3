#!/usr/bin/env python
"""Cold lazy reads (first touch, decoding) against tensorstore reading the same boxes, per store format.

    python benchmarks/lazy_cold.py [--boxes N] [--batches N] [--rounds R] [--json PATH] [--quick]

Data: a uint8 (96, 512, 512) volume with EM-like content (smoothed noise with thin dark membranes and grain:
compressible, neither random nor constant), written by the formats' own tools as zarr v2 blosc-lz4 (zarr-python,
chunks (16, 64, 64)), zarr v3 zstd (same chunks), zarr v3 sharded (shards (32, 256, 256) of (16, 64, 64) zstd
chunks), neuroglancer precomputed, raw encoding (cloud-volume, uncompressed, chunks (16, 64, 64)), the same
sharded with gzip (tensorstore; emfast reads it through tensorstore), and N5 gzip (tensorstore; N5's default
compression, blocks (16, 64, 64)). The last two are extra formats, not among the issue's targets.

Measured per format, each measurement on a freshly opened store (emfast: a new lazy volume, whose chunk cache is
empty; tensorstore: a new handle with a fresh cache pool of the same budget), alternating over rounds:

- boxes: the same ``--boxes`` random (32, 128, 128) boxes read one after another, by ``Volume.read_box`` and by
  ``ts.open(...)[box].read().result()``;
- loader: a lazy ``Loader`` (patch (32, 128, 128), batch 8, no augmentation, float32 out) at threads 1 and 2,
  ``--batches`` batches from start; the peer is tensorstore reading the boxes of those same batches (their
  ``positions``), the 8 reads of a batch issued at once (tensorstore's own thread pool decodes them in parallel);
- boxes CPU time: the process's CPU time (every thread's) of the box reads, which other processes' load hardly
  changes: how much work each reader spends per box;
- ablation (zarr v3 zstd): the boxes read with a box's missing chunks read in one batch (one compiled call for
  their files, decoded in parts side by side where that pays) or chunk by chunk, with decode helpers allowed or
  not;
- decoders: every chunk of the volume read alone, one after another (file read and decode of one chunk), by
  emfast's store reader and by tensorstore, to compare the decode routes per codec;
- whole volume: ``ef.open(path)`` (read into memory, opening included) against tensorstore opening the store and
  reading the whole array. Not a target of the issue (it is about lazy reads), recorded beside them;
- small cache (zarr v2 blosc-lz4 and v3 zstd, ``--small-cache`` batches): a (96, 1024, 1024) volume read by a lazy
  loader whose cache holds a quarter of it (``SMALL_CACHE_SHARE``), as a volume larger than memory is: after the
  first batches most chunks a batch needs are read and decoded again, read-ahead included. The peer is tensorstore
  with a cache pool of the same budget reading the same batches' boxes, 8 at once. A cold rate kept up, not only
  the first touch; counted in the target.

Reported: medians and emfast / tensorstore ratios (target >= 1.0 for cold reads); the load average at start and
end, since other processes share the cores.
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

CHUNKS, SHARDS, PATCH, BATCH = (16, 64, 64), (32, 256, 256), (32, 128, 128), 8
BUDGET = 1 << 30
TARGET = 1.0
#: The small-cache rows: their volume, and the share of it the caches of both readers hold.
SMALL_CACHE_SHAPE, SMALL_CACHE_SHARE = (96, 1024, 1024), 4
SMALL_CACHE_FORMATS = ("zarr v2 blosc-lz4", "zarr v3 zstd")
#: Formats measured beside the targets' four.
EXTRA_FORMATS = ("precomputed sharded gzip", "n5 gzip")


def em_like(shape, seed: int = 0) -> np.ndarray:
    """uint8 volume looking like EM: blurred blobs (cells), thin dark walls between them, grain."""
    from scipy import ndimage
    rng = np.random.default_rng(seed)
    coarse = ndimage.zoom(rng.standard_normal([max(2, s // 8) for s in shape]).astype(np.float32),
                          [s / max(2, s // 8) for s in shape], order=1)[:shape[0], :shape[1], :shape[2]]
    walls = np.exp(-(coarse * 6.0) ** 2)  # thin sheets where the field crosses zero
    grain = ndimage.uniform_filter(rng.normal(0, 4, shape).astype(np.float32), 2)
    image = 150 + 40 * np.tanh(coarse) - 90 * walls + grain
    return np.clip(image, 0, 255).astype(np.uint8)


def write_stores(directory: str, data: np.ndarray, formats=None) -> dict:
    """Each format's path and tensorstore spec (without context); only ``formats`` where given (the zarr ones)."""
    import numcodecs
    import zarr
    stores = {}
    path = os.path.join(directory, "v2-blosc-lz4.zarr")
    zarr.create_array(path, shape=data.shape, chunks=CHUNKS, dtype=data.dtype, zarr_format=2,
                      compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE))[...] = data
    stores["zarr v2 blosc-lz4"] = (path, {"driver": "zarr", "kvstore": {"driver": "file", "path": path}})
    path = os.path.join(directory, "v3-zstd.zarr")
    zarr.create_array(path, shape=data.shape, chunks=CHUNKS, dtype=data.dtype,
                      compressors=zarr.codecs.ZstdCodec(level=3))[...] = data
    stores["zarr v3 zstd"] = (path, {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}})
    if formats is not None:
        return {name: stores[name] for name in formats}
    path = os.path.join(directory, "v3-sharded.zarr")
    zarr.create_array(path, shape=data.shape, chunks=CHUNKS, shards=SHARDS, dtype=data.dtype,
                      compressors=zarr.codecs.ZstdCodec(level=3))[...] = data
    stores["zarr v3 sharded zstd"] = (path, {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}})
    path = os.path.join(directory, "precomputed")
    from cloudvolume import CloudVolume
    info = CloudVolume.create_new_info(num_channels=1, layer_type="image", data_type="uint8", encoding="raw",
                                       resolution=[4, 4, 40], voxel_offset=[0, 0, 0],
                                       chunk_size=list(CHUNKS[::-1]), volume_size=list(data.shape[::-1]))
    volume = CloudVolume(f"file://{path}", info=info, compress=False, progress=False)
    volume.commit_info()
    volume[:, :, :] = np.ascontiguousarray(data.transpose(2, 1, 0))
    stores["precomputed raw"] = (path, {"driver": "neuroglancer_precomputed",
                                        "kvstore": {"driver": "file", "path": path}})
    path = os.path.join(directory, "precomputed-sharded")
    spec = {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": path}}
    import tensorstore as ts
    scale = {"resolution": [4, 4, 40], "voxel_offset": [0, 0, 0], "size": list(data.shape[::-1]),
             "chunk_size": list(CHUNKS[::-1]), "encoding": "raw",
             "sharding": {"@type": "neuroglancer_uint64_sharded_v1", "preshift_bits": 3, "hash": "identity",
                          "minishard_bits": 3, "shard_bits": 2, "minishard_index_encoding": "gzip",
                          "data_encoding": "gzip"}}
    ts.open({**spec, "multiscale_metadata": {"type": "image", "data_type": "uint8", "num_channels": 1},
             "scale_metadata": scale, "create": True}).result()[...] = data.T[..., np.newaxis]
    stores["precomputed sharded gzip"] = (path, spec)
    path = os.path.join(directory, "gzip.n5", "raw")
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": path}}
    ts.open({**spec, "metadata": {"dimensions": list(data.shape[::-1]), "blockSize": list(CHUNKS[::-1]),
                                  "dataType": "uint8", "compression": {"type": "gzip"}}, "create": True}
            ).result()[...] = data.T
    stores["n5 gzip"] = (path, spec)
    return stores


def ts_open(spec: dict, budget: int = BUDGET):
    """A fresh tensorstore handle (a new cache pool of the same budget as emfast's), indexed (z, y, x)."""
    import tensorstore as ts
    store = ts.open(spec, read=True, context=ts.Context({"cache_pool": {"total_bytes_limit": budget}})).result()
    if spec["driver"] == "neuroglancer_precomputed":
        store = store[..., 0].T  # (x, y, z, c) -> (z, y, x), the order emfast gives
    elif spec["driver"] == "n5":
        store = store.T  # N5 lists x first
    return store


def boxes_emfast(path: str, corners) -> float:
    volume = ef.open(path, in_memory=False, cache_bytes=BUDGET)
    out = np.empty((1,) + PATCH, np.uint8)
    start, cpu = time.perf_counter(), time.process_time()
    for corner in corners:
        volume.read_box(corner, PATCH, out)
    elapsed = time.perf_counter() - start, time.process_time() - cpu
    volume.close()
    return elapsed


def boxes_tensorstore(spec: dict, corners) -> float:
    store = ts_open(spec)
    start, cpu = time.perf_counter(), time.process_time()
    for z, y, x in corners:
        store[z:z + PATCH[0], y:y + PATCH[1], x:x + PATCH[2]].read().result()
    return time.perf_counter() - start, time.process_time() - cpu


def loader_emfast(path: str, batches: int, threads: int, seed: int, budget: int = BUDGET) -> tuple:
    """(seconds for ``batches`` batches of a cold lazy loader, the batches' corners)."""
    volume = ef.open(path, in_memory=False, cache_bytes=budget)
    corners = []
    start = time.perf_counter()
    with ef.Loader(volume, patch=PATCH, batch_size=BATCH, threads=threads, augment=(), seed=seed) as loader:
        for _ in range(batches):
            batch = loader.next_batch()
            corners.append(np.asarray(batch.positions).reshape(-1, 3).tolist())
            batch.release()
        elapsed = time.perf_counter() - start
    volume.close()
    return elapsed, corners


def loader_tensorstore(spec: dict, batches, budget: int = BUDGET) -> float:
    store = ts_open(spec, budget)
    start = time.perf_counter()
    for corners in batches:
        futures = [store[z:z + PATCH[0], y:y + PATCH[1], x:x + PATCH[2]].read() for z, y, x in corners]
        for future in futures:
            future.result()
    return time.perf_counter() - start


def whole_emfast(path: str) -> float:
    start = time.perf_counter()
    ef.open(path)
    return time.perf_counter() - start


def whole_tensorstore(spec: dict) -> float:
    start = time.perf_counter()
    ts_open(spec).read().result()
    return time.perf_counter() - start


def decoders(path: str, spec: dict, shape) -> dict:
    """Seconds to read every chunk alone, one after another: emfast's store reader, tensorstore."""
    source = ef.open(path, in_memory=False).chunk_cache._source
    store = ts_open(spec)
    keys = [(z, y, x) for z in range(0, shape[0], CHUNKS[0]) for y in range(0, shape[1], CHUNKS[1])
            for x in range(0, shape[2], CHUNKS[2])]
    out = np.empty((1,) + CHUNKS, np.uint8)
    start = time.perf_counter()
    for key in keys:
        source.read(key, CHUNKS, out)
    emfast_s = time.perf_counter() - start
    start = time.perf_counter()
    for z, y, x in keys:
        store[z:z + CHUNKS[0], y:y + CHUNKS[1], x:x + CHUNKS[2]].read().result()
    return {"emfast": emfast_s, "tensorstore": time.perf_counter() - start, "chunks": len(keys)}


def ablation(path: str, spec: dict, corners, rounds: int) -> dict:
    """Median (wall, CPU) seconds of the boxes read by emfast with a box's missing chunks read in one batch (one
    compiled call for the files, decoded in parts side by side where that pays) or chunk by chunk (one Python file
    read and decode per chunk, on decode helpers where cores are idle), each with helpers allowed or not, against
    tensorstore, alternating in one run."""
    from emfast.io import _decode
    from emfast.io._zarr import ZarrSource
    idle, batched = _decode._idle_cores, ZarrSource.read_many
    results = {}
    try:
        for _ in range(rounds):
            for batch in (True, False):
                ZarrSource.read_many = batched if batch else property(lambda self: None)
                for helpers in (True, False):
                    _decode._idle_cores = idle if helpers else (lambda: 0)
                    volume = ef.open(path, in_memory=False, cache_bytes=BUDGET)
                    out = np.empty((1,) + PATCH, np.uint8)
                    start, cpu = time.perf_counter(), time.process_time()
                    for corner in corners:
                        volume.read_box(corner, PATCH, out)
                    key = f"{'batched' if batch else 'chunk by chunk'}, helpers {'allowed' if helpers else 'off'}"
                    results.setdefault(key, []).append((time.perf_counter() - start, time.process_time() - cpu))
                    volume.close()
            results.setdefault("tensorstore", []).append(boxes_tensorstore(spec, corners))
    finally:
        _decode._idle_cores, ZarrSource.read_many = idle, batched
    return {k: [statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)]
            for k, values in results.items()}


def small_cache(directory: str, batches: int, rounds: int) -> dict:
    """Seconds and CPU seconds of ``batches`` batches per reader, format and loader threads (lists over rounds,
    alternating emfast and tensorstore), with caches of a quarter of a larger volume (see the module's
    docstring)."""
    data = em_like(SMALL_CACHE_SHAPE, seed=2)
    budget = data.nbytes // SMALL_CACHE_SHARE
    with tempfile.TemporaryDirectory(dir=directory) as inside:
        stores = write_stores(inside, data, SMALL_CACHE_FORMATS)
        results = {}
        for name, (path, spec) in stores.items():
            check_same(path, spec, data)
            for round_ in range(rounds):
                for threads in (1, 2):
                    row = results.setdefault(f"{name} threads={threads}", {"emfast": [], "tensorstore": [],
                                                                          "emfast CPU": [], "tensorstore CPU": []})
                    cpu = time.process_time()
                    elapsed, corners = loader_emfast(path, batches, threads, seed=100 + round_, budget=budget)
                    row["emfast"].append(elapsed)
                    row["emfast CPU"].append(time.process_time() - cpu)
                    cpu = time.process_time()
                    row["tensorstore"].append(loader_tensorstore(spec, corners, budget))
                    row["tensorstore CPU"].append(time.process_time() - cpu)
    return results


def check_same(path: str, spec: dict, data: np.ndarray) -> None:
    """Both readers give the written data (a benchmark of wrong reads would mean nothing)."""
    volume = ef.open(path, in_memory=False)
    corner = (40, 200, 300)  # inside every volume written here
    out = np.empty((1,) + PATCH, np.uint8)
    volume.read_box(corner, PATCH, out)
    want = data[tuple(slice(c, c + p) for c, p in zip(corner, PATCH))]
    got_ts = ts_open(spec)[tuple(slice(c, c + p) for c, p in zip(corner, PATCH))].read().result()
    assert np.array_equal(out[0], want) and np.array_equal(got_ts, want), path
    volume.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--boxes", type=int, default=None, help="boxes per box measurement (default 24; --quick: 6)")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches per loader measurement (default 6; --quick: 2)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --quick: 1)")
    parser.add_argument("--formats", default="", help="comma-separated subset of the formats (default: all)")
    parser.add_argument("--quick", action="store_true", help="one round, few boxes (a smoke test)")
    parser.add_argument("--ablation", type=int, default=5, metavar="ROUNDS",
                        help="rounds of the zarr v3 zstd ablation (batched reads, decode helpers; 0: none)")
    parser.add_argument("--small-cache", type=int, default=None, metavar="BATCHES",
                        help="batches per small-cache measurement (default 40; --quick: 4; 0: none)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    rounds = count_option(args.rounds, 3, 1, args.quick)
    n_boxes, n_batches = count_option(args.boxes, 24, 6, args.quick), count_option(args.batches, 6, 2, args.quick)
    shape = (96, 512, 512)
    data = em_like(shape)
    rng = np.random.default_rng(1)
    corners = [tuple(int(rng.integers(0, s - p + 1)) for s, p in zip(shape, PATCH)) for _ in range(n_boxes)]
    load_start = os.getloadavg()
    raw = {}
    with tempfile.TemporaryDirectory() as directory:
        stores = write_stores(directory, data)
        wanted = [f for f in args.formats.split(",") if f] or list(stores)
        sizes = {name: sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(stores[name][0]) for f in fs)
                 for name in wanted}
        for name in wanted:
            path, spec = stores[name]
            check_same(path, spec, data)
            result = raw[name] = {"boxes": {"emfast": [], "tensorstore": []}, "decoders": [],
                                  "boxes CPU": {"emfast": [], "tensorstore": []},
                                  "whole volume": {"emfast": [], "tensorstore": []},
                                  **{f"loader threads={t}": {"emfast": [], "tensorstore": []} for t in (1, 2)}}
            for round_ in range(rounds):
                for reader, measure in (("emfast", boxes_emfast), ("tensorstore", boxes_tensorstore)):
                    elapsed, cpu = measure(path if reader == "emfast" else spec, corners)
                    result["boxes"][reader].append(elapsed)
                    result["boxes CPU"][reader].append(cpu)
                for threads in (1, 2):
                    elapsed, batches = loader_emfast(path, n_batches, threads, seed=round_)
                    result[f"loader threads={threads}"]["emfast"].append(elapsed)
                    result[f"loader threads={threads}"]["tensorstore"].append(loader_tensorstore(spec, batches))
                result["decoders"].append(decoders(path, spec, shape))
                result["whole volume"]["emfast"].append(whole_emfast(path))
                result["whole volume"]["tensorstore"].append(whole_tensorstore(spec))
        if "zarr v3 zstd" in wanted and args.ablation and not args.quick:
            raw["ablation zarr v3 zstd"] = ablation(*stores["zarr v3 zstd"], corners, args.ablation)
        small_batches = count_option(args.small_cache, 40, 4, args.quick)
        if small_batches:
            raw["small cache"] = small_cache(directory, small_batches, rounds)
    load_end = os.getloadavg()
    median = statistics.median
    lines = [f"lazy cold benchmark: {shape} uint8 EM-like, patch {PATCH}, chunks {CHUNKS}, {rounds} round(s) of "
             f"{n_boxes} boxes and {n_batches} loader batches (batch {BATCH}, float32 out), each on a fresh store "
             "handle; emfast / tensorstore alternating",
             f"  load average (1, 5, 15 min) at start {load_start}, at end {load_end}"]
    summary = {}
    for name in wanted:
        result = raw[name]
        lines.append(f"  {name} ({sizes[name] / data.nbytes:.2f} of raw size on disk):")
        for task in ("boxes", "loader threads=1", "loader threads=2"):
            e, t = median(result[task]["emfast"]), median(result[task]["tensorstore"])
            summary[f"{name} {task} emfast / tensorstore"] = t / e
            unit = n_boxes if task == "boxes" else n_batches
            lines.append(f"    {task:17}: emfast {unit / e:7.1f}, tensorstore {unit / t:7.1f} "
                         f"{'boxes' if task == 'boxes' else 'batches'}/s, ratio {t / e:.2f}")
        e, t = median(result["boxes CPU"]["emfast"]), median(result["boxes CPU"]["tensorstore"])
        summary[f"{name} boxes CPU time tensorstore / emfast"] = t / e
        lines.append(f"    boxes CPU time   : emfast {1e3 * e / n_boxes:7.2f}, tensorstore {1e3 * t / n_boxes:7.2f} ms "
                     f"per box (all threads), ratio {t / e:.2f}")
        d = {k: median(r[k] for r in result["decoders"]) for k in ("emfast", "tensorstore")}
        chunks = result["decoders"][0]["chunks"]
        summary[f"{name} decoder emfast / tensorstore"] = d["tensorstore"] / d["emfast"]
        lines.append(f"    one chunk alone  : emfast {1e6 * d['emfast'] / chunks:7.0f} us, tensorstore "
                     f"{1e6 * d['tensorstore'] / chunks:7.0f} us per chunk, ratio {d['tensorstore'] / d['emfast']:.2f}")
        e, t = median(result["whole volume"]["emfast"]), median(result["whole volume"]["tensorstore"])
        summary[f"{name} whole volume emfast / tensorstore"] = t / e
        lines.append(f"    whole volume     : emfast {1e3 * e:7.1f} ms (in-memory open), tensorstore {1e3 * t:7.1f} ms "
                     f"(whole read), ratio {t / e:.2f}")
    if "ablation zarr v3 zstd" in raw:
        lines.append(f"  zarr v3 zstd boxes, ablation ({args.ablation} rounds alternating; ms for the {n_boxes} "
                     "boxes):")
        for key, (wall, cpu) in raw["ablation zarr v3 zstd"].items():
            lines.append(f"    {key:45}: wall {1e3 * wall:6.1f}, CPU {1e3 * cpu:6.1f}")
    if "small cache" in raw:
        lines.append(f"  small cache: {SMALL_CACHE_SHAPE} uint8 EM-like ({np.prod(SMALL_CACHE_SHAPE) >> 20} MiB), "
                     f"caches of 1/{SMALL_CACHE_SHARE} of it, {small_batches} loader batches from start, tensorstore "
                     "reading the same batches' boxes (medians over rounds):")
        for key, row in raw["small cache"].items():
            e, t = median(row["emfast"]), median(row["tensorstore"])
            cpu = {reader: 1e3 * median(row[f"{reader} CPU"]) / small_batches for reader in ("emfast", "tensorstore")}
            summary[f"small cache {key} emfast / tensorstore"] = t / e
            lines.append(f"    {key:27}: emfast {small_batches / e:6.1f}, tensorstore {small_batches / t:6.1f} "
                         f"batches/s, ratio {t / e:.2f}; CPU ms per batch emfast {cpu['emfast']:.2f}, tensorstore "
                         f"{cpu['tensorstore']:.2f}")
    passed = all(v >= TARGET for k, v in summary.items()
                 if "decoder" not in k and "CPU" not in k and "whole" not in k and not k.startswith(EXTRA_FORMATS))
    lines.append(f"  target (cold emfast / tensorstore >= {TARGET}): {'PASS' if passed else 'MISS'}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "shape": shape, "patch": PATCH, "chunks": CHUNKS, "shards": SHARDS,
                       "load": [load_start, load_end], "raw_seconds": raw, "summary": summary}, file, indent=1,
                      default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
