#!/usr/bin/env python
"""The targets for emfast.predict, each a ratio against a baseline from the same run.

    python benchmarks/predict.py [--rounds R] [--json PATH] [--quick] [--no-dask] [--previous JSON]

- once: the README's valid-convolution network (in (36, 188, 188), out (16, 100, 100); a centre crop stands in)
  over a (60, 320, 320) zarr input chunked (16, 64, 64), (64, 64, 64) or (1, 1024, 1024), default settings: tiles
  the model computed / tiles in the plan (target <= 1.05; the volume is more than one block).
- memory: the same network over a 64 MiB (64, 1024, 1024) zarr input chunked per section (1, 1024, 1024) or
  (64, 64, 64), each in a fresh process, peak RSS (target: per-section <= 1.2x the cubes', both within the 1 GiB
  default budget plus the interpreter).
- overhead: a compute-bound NumPy network (elementwise passes over each tile, as many as take MODEL_SECONDS_PER_TILE
  on this machine) over a (64, 256, 256) volume: predict (threads=2) against the same network called on the same
  batches of tiles (target <= 1.10x).

- write: an identity network over the built-in (96, 384, 384) uint8 volume, tiles (32, 128, 128) with the default
  overlap (a quarter: 8, 32, 32) and gaussian blending, written as float32 to zarr v3 (zstd level 3, chunks
  (32, 128, 128)), against writing the same float32 array with zarr-python directly, same chunks and codec
  (target >= 0.8x). Both replace the previous round's array (predict with overwrite=True; zarr-python opening the
  group with mode="w", creating the array, writing it), so both pay for removing it and creating metadata; the
  zarr write alone (``array[...] = data``, timed inside the same call) is printed beside, as "zarr write only",
  with predict's ratios against it. Also blend="none" (tiles cropped, no overlap), the cheapest tiling.
- dask: a compute-bound NumPy network (elementwise passes over each tile) on a (64, 256, 256) volume in 8 blocks
  of (32, 128, 128), on a LocalCluster of 2 worker processes against 1 (target >= 1.6x on 2 cores). Cluster start-up
  is not timed.
Rounds alternate between the contenders; overhead and write report the best of the rounds for both contenders
(the machine is shared: the fastest round is the one least disturbed) and the medians beside them; the others
report medians. The median of each round's own ratio (the two contenders run back to back) is printed too. The
load average before and after is printed.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

CHUNKS = (32, 128, 128)
TILE = (32, 128, 128)
TARGET_WRITE, TARGET_DASK, TARGET_ONCE, TARGET_RSS, TARGET_OVERHEAD = 0.8, 1.6, 1.05, 1.2, 1.10
#: The README's network: valid convolutions shrink (36, 188, 188) to (16, 100, 100).
README_IN, README_OUT = (36, 188, 188), (16, 100, 100)
#: The compute-bound network's time per (16, 128, 128) tile: what its 24 elementwise passes took on the machine the
#: target was set on (0.77 s for 45 tiles). Its passes are calibrated to this on each machine (tanh costs about
#: 5x less on some), so that the network stays compute-bound: the target is about a network whose time dominates.
MODEL_SECONDS_PER_TILE = 0.017


def identity(batch):
    return batch


class ComputeBound:
    """A stand-in for a network on the CPU: ``passes`` elementwise passes over the tile, in place. (Temporaries
    would measure Dask's worker setting MALLOC_TRIM_THRESHOLD_=65536 instead: every large free is returned to the
    system and faulted in again, which makes such code about 5x slower in a worker than in the client.) An
    instance pickles with its passes, so Dask workers run the same network."""

    def __init__(self, passes: int) -> None:
        self.passes = passes

    def __call__(self, batch):
        out = batch.copy()
        for _ in range(self.passes):
            np.multiply(out, np.float32(1.01), out=out)
            np.tanh(out, out=out)
        return out

    @classmethod
    def calibrated(cls) -> "ComputeBound":
        """The network whose call takes about MODEL_SECONDS_PER_TILE per (16, 128, 128) tile here. Timed at two
        pass counts: a call's copy of its tile is paid once, not per pass (timing one pass counted it as a pass,
        and the calibrated network ran 10-14 ms a tile on a host whose copies are slow)."""
        tile = np.random.default_rng(0).random((1, 1, 16, 128, 128), dtype=np.float32)
        few, many = 8, 64
        seconds = {n: min(_timed(cls(n), tile) for _ in range(5)) for n in (few, many)}
        per_pass = (seconds[many] - seconds[few]) / (many - few)
        fixed = max(0.0, seconds[few] - few * per_pass)
        return cls(max(1, round((MODEL_SECONDS_PER_TILE - fixed) / per_pass)))


def _timed(call, *args) -> float:
    start = time.perf_counter()
    call(*args)
    return time.perf_counter() - start


def valid_crop(batch):
    """The README network's shapes without its arithmetic: the centre (16, 100, 100) of each tile."""
    return batch[:, :, 10:-10, 44:-44, 44:-44]


class CountingCrop:
    def __init__(self):
        self.tiles = 0

    def __call__(self, batch):
        self.tiles += len(batch)
        return valid_crop(batch)


def zarr_input(path, data, chunks):
    import zarr
    root = zarr.open_group(path, mode="w")
    root.create_array("raw", data=data, chunks=chunks)
    return os.path.join(path, "raw")


def bench_once(directory, quick):
    shape = (60, 320, 320)
    data = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    rows = {}
    for chunks in [(16, 64, 64), (64, 64, 64), (1, 1024, 1024)]:
        source = zarr_input(os.path.join(directory, f"once{chunks[0]}.zarr"), data, chunks)
        model = CountingCrop()
        result = ef.predict(model, source, os.path.join(directory, f"once{chunks[0]}-out.zarr/p"),
                            patch_in=README_IN, patch_out=README_OUT)
        rows[str(chunks)] = {"blocks": result.blocks, "plan_tiles": result.tiles, "model_tiles": model.tiles,
                             "ratio": model.tiles / result.tiles, "seconds": result.seconds}
    return rows


RSS_SCRIPT = """
import resource, sys
import emfast as ef
def valid_crop(batch):
    return batch[:, :, 10:-10, 44:-44, 44:-44]
ef.predict(valid_crop, sys.argv[1], sys.argv[2], patch_in=(36, 188, 188), patch_out=(16, 100, 100))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def bench_memory(directory, rounds, quick):
    import subprocess
    shape = (16, 1024, 1024) if quick else (64, 1024, 1024)
    data = np.random.default_rng(4).integers(0, 256, shape, dtype=np.uint8)
    sources = {name: zarr_input(os.path.join(directory, f"rss-{name}.zarr"), data, chunks)
               for name, chunks in [("sections", (1, 1024, 1024)), ("cubes", (64, 64, 64))]}
    del data
    peaks = {name: [] for name in sources}
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for _ in range(rounds):
        for name, source in sources.items():
            out = os.path.join(directory, f"rss-{name}-out.zarr/p")
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
            run = subprocess.run([sys.executable, "-c", RSS_SCRIPT, source, out], capture_output=True, text=True,
                                 check=True, env=environment)
            peaks[name].append(int(run.stdout.split()[-1]))
    medians = {name: statistics.median(v) for name, v in peaks.items()}
    return {"input_shape": list(shape), "peak_rss_bytes": medians, "ratio": medians["sections"] / medians["cubes"]}


def bench_overhead(directory, rounds, quick, network):
    raw, _ = make_em_volume((32, 256, 256) if quick else (64, 256, 256), seed=3)
    settings = dict(patch_in=(24, 144, 144), patch_out=(16, 128, 128), channels=1, threads=2)
    batches = []
    crop_bound = CropBound(network)

    def recording(batch):
        batches.append(batch.copy())
        return crop_bound(batch)

    ef.predict(recording, raw, os.path.join(directory, "record.zarr/p"), **settings)
    times = {"model alone": [], "predict": []}
    waits = []
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            crop_bound(batch)
        times["model alone"].append(time.perf_counter() - start)
        calls = []

        def timed(batch):
            begin, cpu = time.perf_counter(), time.thread_time()
            result = crop_bound(batch)
            calls.append((begin, time.perf_counter(), time.thread_time() - cpu))
            return result

        start, cpu = time.perf_counter(), time.process_time()
        seconds = timed_predict(timed, raw, os.path.join(directory, "overhead.zarr/p"), **settings)[0]
        cpu = time.process_time() - cpu
        times["predict"].append(seconds)
        model_cpu = sum(c for _, _, c in calls)
        waits.append({"before first call": calls[0][0] - start,
                      "between calls": sum(b[0] - a[1] for a, b in zip(calls, calls[1:])),
                      "after last call": start + seconds - calls[-1][1],
                      "in model calls": sum(b - a for a, b, _ in calls),
                      "CPU in model calls": model_cpu, "CPU around the model": cpu - model_cpu})
    return {"tiles": len(batches), "passes": network.passes,
            **_best_and_median(times, "model alone", "predict", inverse=True),
            "model_waits_best_round": waits[times["predict"].index(min(times["predict"]))]}


def _best_and_median(times, baseline, contender, inverse=False):
    """Best-of-N and median seconds of each, and the ratios contender / baseline (``inverse``: baseline /
    contender) of the bests and of the medians."""
    best = {name: min(v) for name, v in times.items()}
    medians = {name: statistics.median(v) for name, v in times.items()}

    def ratio(values):
        return values[contender] / values[baseline] if inverse else values[baseline] / values[contender]

    paired = [ratio({baseline: b, contender: c}) for b, c in zip(times[baseline], times[contender])]
    return {"seconds": best, "seconds_median": medians, "all_seconds": times, "ratio": ratio(best),
            "ratio_median": ratio(medians), "ratio_paired_median": statistics.median(paired)}


class CropBound:
    """``network`` (a :class:`ComputeBound`) on the centre (16, 128, 128) of a (24, 144, 144) tile."""

    def __init__(self, network: ComputeBound) -> None:
        self.network = network

    def __call__(self, batch):
        return self.network(np.ascontiguousarray(batch[:, :, 4:-4, 8:-8, 8:-8]))


def direct_write(path, data):
    """Seconds to replace the array at ``path`` with ``data`` through zarr-python: (all of it, the write alone)."""
    import zarr
    start = time.perf_counter()
    root = zarr.open_group(path, mode="w")  # removes the previous round's array, as predict's overwrite does
    array = root.create_array("p", shape=data.shape, chunks=(data.shape[0],) + CHUNKS, dtype=data.dtype,
                              compressors=zarr.codecs.ZstdCodec(level=3), fill_value=0)
    written = time.perf_counter()
    array[...] = data
    end = time.perf_counter()
    return end - start, end - written


def timed_predict(model, volume, out, **kwargs):
    start = time.perf_counter()
    kwargs = dict(dict(chunks=CHUNKS, compression="zstd", channels=1), **kwargs)
    result = ef.predict(model, volume, out, overwrite=True, **kwargs)
    return time.perf_counter() - start, result


def bench_write(directory, raw, rounds):
    normalized = (raw.astype(np.float32) * np.float32(1 / 255))[np.newaxis]
    times = {"zarr direct": [], "zarr write only": [], "predict gaussian": [], "predict none": []}
    cpu = {name: [] for name in times}

    def run(name, call):
        started = time.process_time()
        times[name].append(call())
        cpu[name].append(time.process_time() - started)

    for _ in range(rounds):
        run("zarr direct", lambda: direct_write(os.path.join(directory, "direct.zarr"), normalized))
        times["zarr direct"][-1], write_only = times["zarr direct"][-1]
        times["zarr write only"].append(write_only)
        cpu["zarr write only"].append(cpu["zarr direct"][-1])  # not separable: the whole call's
        run("predict gaussian", lambda: timed_predict(identity, raw, os.path.join(directory, "g.zarr/p"),
                                                      patch_in=TILE, blend="gaussian")[0])
        run("predict none", lambda: timed_predict(identity, raw, os.path.join(directory, "n.zarr/p"),
                                                  patch_in=TILE, blend="none")[0])
    import zarr
    written = zarr.open_array(os.path.join(directory, "g.zarr"), path="p", mode="r")[...]
    assert np.array_equal(written, normalized), "the identity network must reproduce its input"
    best = {name: min(values) for name, values in times.items()}
    medians = {name: statistics.median(values) for name, values in times.items()}
    megabytes = normalized.nbytes / 1e6
    return {name: {"seconds": best[name], "seconds_median": medians[name], "all_seconds": times[name],
                   "cpu_seconds_best": min(cpu[name]), "MB_per_s": megabytes / best[name],
                   "ratio": best["zarr direct"] / best[name], "ratio_median": medians["zarr direct"] / medians[name],
                   "ratio_paired_median": statistics.median(d / t for d, t in zip(times["zarr direct"], times[name])),
                   "ratio_to_write_only": best["zarr write only"] / best[name]}
            for name in best}


def bench_dask(directory, raw, rounds, network):
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    block = tuple(s // 2 for s in raw.shape)  # 8 blocks
    settings = dict(patch_in=(16, 64, 64), block=block, blend="gaussian")
    times = {1: [], 2: []}
    clusters = {n: LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                silence_logs=40) for n in (1, 2)}
    try:
        clients = {n: Client(cluster) for n, cluster in clusters.items()}
        for n, client in clients.items():  # warm-up: workers import emfast and numpy once
            timed_predict(network, raw, os.path.join(directory, f"warm{n}.zarr/p"), client=client,
                          **settings)
        for _ in range(rounds):
            for n, client in clients.items():
                seconds, result = timed_predict(network, raw, os.path.join(directory, f"dask{n}.zarr/p"),
                                                client=client, **settings)
                times[n].append(seconds)
        for client in clients.values():
            client.close()
    finally:
        for cluster in clusters.values():
            cluster.close()
    local, _ = timed_predict(network, raw, os.path.join(directory, "local.zarr/p"), **settings)
    import zarr
    one, two = (zarr.open_array(os.path.join(directory, f"dask{n}.zarr"), path="p", mode="r")[...] for n in (1, 2))
    assert np.array_equal(one, two), "1 and 2 workers must write the same bytes"
    medians = {n: statistics.median(v) for n, v in times.items()}
    return {"blocks": result.blocks, "seconds_1_worker": medians[1], "seconds_2_workers": medians[2],
            "seconds_local_engine": local, "speedup": medians[1] / medians[2]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each measurement (default 5; --quick: 2)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="smaller volumes, 2 rounds")
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask comparison")
    parser.add_argument("--previous", default=None, help="a JSON of an earlier run: its ratios are printed beside")
    args = parser.parse_args(argv)
    rounds = count_option(args.rounds, 5, 2, args.quick)
    raw, _ = make_em_volume((48, 256, 256) if args.quick else (96, 384, 384), seed=0)
    small, _ = make_em_volume((32, 128, 128) if args.quick else (64, 256, 256), seed=1)
    directory = tempfile.mkdtemp(prefix="emfast-bench-predict-")
    load_before = os.getloadavg()
    try:
        once = bench_once(directory, args.quick)
        memory = bench_memory(directory, rounds, args.quick)
        network = ComputeBound.calibrated()
        overhead = bench_overhead(directory, rounds, args.quick, network)
        write = bench_write(directory, raw, rounds)
        dask = None if args.no_dask else bench_dask(directory, small, rounds, network)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    load = {"before": load_before, "after": os.getloadavg()}
    print(f"machine: {machine_info()}")
    print(f"load average (1, 5, 15 min): before {load_before}, after {load['after']}")
    print(f"tiles computed / tiles in the plan, network in {README_IN} out {README_OUT} over (60, 320, 320), "
          f"default settings (target <= {TARGET_ONCE}):")
    for chunks, row in once.items():
        print(f"  input chunks {chunks:16s} {row['blocks']} blocks, {row['model_tiles']} of {row['plan_tiles']} "
              f"tiles: {row['ratio']:.3f} -> {'met' if row['ratio'] <= TARGET_ONCE else 'NOT met'}")
    rss = memory["peak_rss_bytes"]
    print(f"peak RSS over a {tuple(memory['input_shape'])} uint8 input, median of {rounds}: per-section chunks "
          f"{rss['sections'] / 2 ** 20:.0f} MiB, (64, 64, 64) chunks {rss['cubes'] / 2 ** 20:.0f} MiB: "
          f"{memory['ratio']:.2f}x (target <= {TARGET_RSS}x -> "
          f"{'met' if memory['ratio'] <= TARGET_RSS else 'NOT met'})")
    print(f"compute-bound network ({overhead['passes']} passes, calibrated to {MODEL_SECONDS_PER_TILE * 1000:.0f} ms "
          f"per tile), {overhead['tiles']} tiles, best of {rounds} (median): model alone "
          f"{overhead['seconds']['model alone']:.2f} s ({overhead['seconds_median']['model alone']:.2f}), predict "
          f"{overhead['seconds']['predict']:.2f} s ({overhead['seconds_median']['predict']:.2f}): "
          f"{overhead['ratio']:.3f}x ({overhead['ratio_median']:.3f}x; median of the rounds' own ratios "
          f"{overhead['ratio_paired_median']:.3f}x) (target <= {TARGET_OVERHEAD}x -> "
          f"{'met' if overhead['ratio'] <= TARGET_OVERHEAD else 'NOT met'})")
    print("  the model in the best predict round: " + ", ".join(
        f"{name} {value:.3f} s" for name, value in overhead["model_waits_best_round"].items()))
    print(f"identity network over {raw.shape} uint8 -> float32 zarr (zstd 3, chunks {CHUNKS}), tiles {TILE}, "
          f"best of {rounds} (median), CPU seconds of the best round:")
    for name, row in write.items():
        print(f"  {name:18s} {row['seconds']:7.3f} s ({row['seconds_median']:.3f})  {row['MB_per_s']:7.1f} MB/s  "
              f"{row['ratio']:.2f}x ({row['ratio_median']:.2f}x; rounds' own {row['ratio_paired_median']:.2f}x) of "
              f"direct, {row['ratio_to_write_only']:.2f}x of the write only  CPU {row['cpu_seconds_best']:.2f} s")
    print(f"  target: predict gaussian >= {TARGET_WRITE}x -> "
          f"{'met' if write['predict gaussian']['ratio'] >= TARGET_WRITE else 'NOT met'}")
    if dask is not None:
        print(f"compute-bound network over {small.shape}, {dask['blocks']} blocks, median of {rounds}:")
        print(f"  1 worker {dask['seconds_1_worker']:.2f} s, 2 workers {dask['seconds_2_workers']:.2f} s: "
              f"{dask['speedup']:.2f}x (target >= {TARGET_DASK}x -> "
              f"{'met' if dask['speedup'] >= TARGET_DASK else 'NOT met'}); local engine "
              f"{dask['seconds_local_engine']:.2f} s")
    print("the CUDA target (a torch 3-D U-Net on a GPU against its own throughput on resident tensors) is "
          "benchmarks/predict_cuda.py")
    previous = None
    if args.previous:
        with open(args.previous) as f:
            previous = json.load(f)
        _print_previous(previous, overhead, write, dask)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "rounds": rounds, "load": load, "once": once, "memory": memory,
                       "overhead": overhead, "write": write, "dask": dask, "cuda": "benchmarks/predict_cuda.py",
                       "previous": previous},
                      f, indent=2)
    return 0


def _print_previous(previous, overhead, write, dask):
    """The earlier run's ratios beside this run's (each against its own run's baseline)."""
    print(f"against the earlier run (--previous; its load average after: {previous['load']['after']}):")
    print(f"  compute-bound predict / model alone: {previous['overhead']['ratio']:.3f}x then, "
          f"{overhead['ratio']:.3f}x now (best of rounds), {overhead['ratio_median']:.3f}x now (median)")
    for name, row in write.items():
        if name in previous["write"] and name != "zarr direct":
            print(f"  identity {name} / zarr direct: {previous['write'][name]['ratio']:.2f}x then, "
                  f"{row['ratio']:.2f}x now (best), {row['ratio_median']:.2f}x now (median)")
    if dask is not None and previous.get("dask"):
        print(f"  Dask 2 workers / 1: {previous['dask']['speedup']:.2f}x then, {dask['speedup']:.2f}x now")


if __name__ == "__main__":
    sys.exit(main())
