#!/usr/bin/env python
"""Remote stores: a lazy loader over HTTP and S3 with latency, against the same store read from local disk.

    python benchmarks/remote.py [--latency-ms 30] [--batches N] [--rounds R] [--json PATH]

Data: a random uint8 (256, 1024, 1024) volume (256 MiB) written as zarr v3 (zstd level 1, chunks (16, 64, 64)).
Served from a separate process (so the servers do not share the loader's GIL) on 127.0.0.1: Python's
``http.server`` and moto's S3 server, each waiting ``--latency-ms`` before answering every request. Task: raw only,
patch (32, 128, 128), batch 8, threads=2, no augmentation, a chunk cache of 64 MiB (a quarter of the volume).
Each measurement opens the volume afresh (cold cache) and times ``--batches`` batches after the first; local,
HTTP and S3 alternate over rounds. Reported: median rates, the remote / local ratios (target >= 0.5), the
profile's fetch / decode / pending / ahead milliseconds per batch, and the requests/s emfast gets from each server
against a plain client's (64 threads of boto3 / urllib3): both servers answer in Python (moto slowly), which bounds
any client on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import emfast as ef  # noqa: E402
from _workload import machine_info  # noqa: E402

SHAPE, CHUNKS, PATCH, BATCH, THREADS = (256, 1024, 1024), (16, 64, 64), (32, 128, 128), 8, 2
CACHE_BYTES = 64 << 20
BUCKET = "emfast-bench"
STAGES = ("fetch", "decode", "pending", "ahead", "cache", "kernel")


def serve(kind: str, directory: str, latency: float):
    """A server process (tests/remote_servers.py) and the URL it prints."""
    script = os.path.join(HERE, os.pardir, "tests", "remote_servers.py")
    process = subprocess.Popen([sys.executable, script, kind, directory, str(latency), BUCKET],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    url = process.stdout.readline().strip()
    if not url:
        process.kill()
        raise RuntimeError(f"the {kind} server did not start")
    return process, url


def plain_client_rate(kind: str, url: str, keys, endpoint=None) -> float:
    """Requests per second a plain client (64 threads of boto3 or urllib3, not emfast) gets from the server for
    ``keys``: what the server and this machine allow a Python client."""
    from concurrent.futures import ThreadPoolExecutor
    if kind == "s3":
        import boto3
        import botocore.config
        client = boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(max_pool_connections=64))
        get = lambda key: client.get_object(Bucket=BUCKET, Key=f"raw.zarr/{key}")["Body"].read()  # noqa: E731
    else:
        import urllib3
        pool = urllib3.PoolManager(maxsize=64)
        get = lambda key: pool.request("GET", f"{url}/{key}").data  # noqa: E731
    with ThreadPoolExecutor(64) as executor:
        start = time.perf_counter()
        list(executor.map(get, keys))
        return len(keys) / (time.perf_counter() - start)


def rate(url: str, batches: int, storage_options=None) -> tuple:
    """(batches/s, profile ms per batch, chunks read per second) of a loader over a freshly opened, cold lazy
    volume: every chunk it read (read-ahead included) over the time from its first batch's request to its last
    batch, the rate the server served it."""
    volume = ef.open(url, in_memory=False, cache_bytes=CACHE_BYTES, storage_options=storage_options)
    try:
        with ef.Loader(volume, patch=PATCH, batch_size=BATCH, threads=THREADS, augment=(), seed=1) as loader:
            first = time.perf_counter()
            loader.next_batch()
            start = time.perf_counter()
            for _ in range(batches):
                loader.next_batch()
            elapsed = time.perf_counter() - start
            read = volume.cache_stats.misses / (time.perf_counter() - first)
            profile = loader.profile.as_dict()["per_batch_ms"]
    finally:
        volume.close()
    return batches / elapsed, {stage: profile[stage] for stage in STAGES}, read


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--latency-ms", type=float, default=30.0, help="added to every request (default 30)")
    parser.add_argument("--batches", type=int, default=10, help="timed batches per measurement (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    import zarr
    load_start = os.getloadavg()
    rates = {"local": [], "http": [], "s3": []}
    profiles = {kind: [] for kind in rates}
    chunks = {kind: [] for kind in rates}  # chunks read per second by the loader
    plain = {"http": [], "s3": []}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "raw.zarr")
        array = zarr.create_array(path, shape=SHAPE, chunks=CHUNKS, dtype=np.uint8,
                                  compressors=zarr.codecs.ZstdCodec(level=1))
        rng = np.random.default_rng(0)
        for z in range(0, SHAPE[0], CHUNKS[0]):
            array[z:z + CHUNKS[0]] = rng.integers(0, 256, (CHUNKS[0],) + SHAPE[1:], dtype=np.uint8)
        latency = args.latency_ms / 1e3
        http, http_url = serve("http", directory, latency)
        s3, endpoint = serve("s3", directory, latency)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        urls = {"local": (path, None), "http": (f"{http_url}/raw.zarr", None),
                "s3": (f"s3://{BUCKET}/raw.zarr", {"endpoint_url": endpoint})}
        try:
            for _ in range(args.rounds):
                for kind, (url, options) in urls.items():
                    batches_per_s, profile, chunks_per_s = rate(url, args.batches, options)
                    rates[kind].append(batches_per_s)
                    profiles[kind].append(profile)
                    chunks[kind].append(chunks_per_s)
                keys = [f"c/{z}/{y}/{x}" for z in range(2) for y in range(10) for x in range(10)]
                plain["http"].append(plain_client_rate("http", urls["http"][0], keys))
                plain["s3"].append(plain_client_rate("s3", None, keys, endpoint))
        finally:
            for process in (http, s3):
                process.stdin.close()
                process.wait(30)
    median = statistics.median
    lines = [f"remote benchmark: zarr v3 {SHAPE} uint8 zstd, chunks {CHUNKS}, patch {PATCH}, batch {BATCH}, "
             f"threads={THREADS}, cache {CACHE_BYTES >> 20} MiB (volume {np.prod(SHAPE) >> 20} MiB), cold, "
             f"{args.latency_ms:g} ms added to every HTTP and S3 request, servers in another process, "
             f"{args.rounds} round(s) of {args.batches} batches, alternating",
             f"  load average (1, 5, 15 min) at start {load_start}, at end {os.getloadavg()}"]
    for kind in rates:
        stages = {stage: median(p[stage] for p in profiles[kind]) for stage in STAGES}
        lines.append(f"  {kind:<5}: {median(rates[kind]):6.2f} batches/s; ms/batch "
                     + ", ".join(f"{stage} {ms:.1f}" for stage, ms in stages.items()))
    ratios = {kind: median(rates[kind]) / median(rates["local"]) for kind in ("http", "s3")}
    lines += [f"  {kind} / local cold: {ratio:.2f}x (target >= 0.5)" for kind, ratio in ratios.items()]
    lines.append("  requests/s from each server (every chunk the loader read, read-ahead included, from its first "
                 "batch's request to its last batch), emfast's loader vs a plain client (64 threads of boto3 / urllib3 "
                 "reading 200 chunks):")
    lines += [f"    {kind}: emfast {median(chunks[kind]):.0f}, plain client {median(p):.0f} "
              f"({median(chunks[kind]) / median(p):.2f}x)" for kind, p in plain.items()]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "latency_ms": args.latency_ms, "rates": rates,
                       "profiles_ms_per_batch": profiles, "ratios": ratios, "chunks_read_per_s": chunks,
                       "plain_client_requests_per_s": plain}, file, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
