#!/usr/bin/env python
"""Which library moves remote chunk bytes fastest: the measurement behind emfast's choice of fsspec.

    python benchmarks/remote_transport.py [--latency-ms 30] [--chunks 400] [--rounds 3] [--json PATH]

Data: ``--chunks`` files of 64 KiB (a (16, 64, 64) uint8 chunk), served from another process on 127.0.0.1 by
Python's ``http.server`` and by moto's S3 server, each adding ``--latency-ms`` to every request. Each client reads
every file once, all requested at once, and the rate in requests/s is reported (median over alternating rounds):
emfast's RemoteStore (fsspec: aiohttp for HTTP, s3fs for S3), tensorstore's kvstores (``http``, ``s3``), and a
thread pool of 64 plain clients (urllib3, boto3). The servers, in Python, bound every client on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workload import machine_info  # noqa: E402
from remote import BUCKET, serve  # noqa: E402
from emfast.io import RemoteStore  # noqa: E402


def emfast_rate(url, keys, options=None) -> float:
    store = RemoteStore(url, options)
    start = time.perf_counter()
    store.will_get(keys)
    for key in keys:
        assert store.get(key) is not None
    return len(keys) / (time.perf_counter() - start)


def tensorstore_rate(spec, keys) -> float:
    import tensorstore as ts
    store = ts.KvStore.open(spec).result()
    start = time.perf_counter()
    futures = [store.read(key) for key in keys]
    for future in futures:
        assert future.result().state == "value"
    return len(keys) / (time.perf_counter() - start)


def threads_rate(get, keys) -> float:
    with ThreadPoolExecutor(64) as executor:
        start = time.perf_counter()
        list(executor.map(get, keys))
        return len(keys) / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--chunks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    import boto3
    import botocore.config
    import urllib3
    keys = [f"c/{n}" for n in range(args.chunks)]
    rates = {}
    with tempfile.TemporaryDirectory() as directory:
        os.makedirs(os.path.join(directory, "raw.zarr", "c"))
        for key in keys:
            with open(os.path.join(directory, "raw.zarr", key), "wb") as file:
                file.write(os.urandom(64 << 10))
        http, http_url = serve("http", directory, args.latency_ms / 1e3)
        s3, endpoint = serve("s3", directory, args.latency_ms / 1e3)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        pool = urllib3.PoolManager(maxsize=64)
        client = boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(max_pool_connections=64))
        base = f"{http_url}/raw.zarr"
        clients = {
            "http emfast (fsspec/aiohttp)": lambda: emfast_rate(base, keys),
            "http tensorstore kvstore": lambda: tensorstore_rate({"driver": "http", "base_url": base + "/"}, keys),
            "http urllib3, 64 threads": lambda: threads_rate(lambda k: pool.request("GET", f"{base}/{k}").data, keys),
            "s3 emfast (fsspec/s3fs)": lambda: emfast_rate(f"s3://{BUCKET}/raw.zarr", keys,
                                                           {"endpoint_url": endpoint}),
            "s3 tensorstore kvstore": lambda: tensorstore_rate(
                {"driver": "s3", "bucket": BUCKET, "path": "raw.zarr/", "endpoint": endpoint,
                 "aws_region": "us-east-1"}, keys),
            "s3 boto3, 64 threads": lambda: threads_rate(
                lambda k: client.get_object(Bucket=BUCKET, Key=f"raw.zarr/{k}")["Body"].read(), keys),
        }
        try:
            for _ in range(args.rounds):
                for name, measure in clients.items():
                    try:
                        rates.setdefault(name, []).append(measure())
                    except Exception as error:  # noqa: BLE001 - a client that cannot read is reported, not fatal
                        rates.setdefault(name, []).append(f"failed: {type(error).__name__}: {error}")
        finally:
            for process in (http, s3):
                process.stdin.close()
                process.wait(30)
    lines = [f"remote transport: {args.chunks} chunks of 64 KiB, {args.latency_ms:g} ms added per request, all "
             f"requested at once, servers in another process, {args.rounds} alternating round(s); requests/s",
             f"  load average (1, 5, 15 min) at end {os.getloadavg()}"]
    for name, values in rates.items():
        numbers = [v for v in values if isinstance(v, float)]
        shown = f"{statistics.median(numbers):7.0f}" if numbers else f"  {values[0]}"
        lines.append(f"  {name:<30} {shown}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine_info(), "latency_ms": args.latency_ms, "chunks": args.chunks,
                       "requests_per_s": rates}, file, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
