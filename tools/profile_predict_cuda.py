#!/usr/bin/env python
"""A torch.profiler trace (CPU ops of every thread, CUDA kernels and copies) of one ``emfast.predict`` of
benchmarks/predict_cuda.py's U-Net on a lent GPU, to see where the device waits: its tables go to stdout, the
gzipped Chrome trace to $OUT.

    python tools/profile_predict_cuda.py [--eager] [--volume Z Y X]
"""
import argparse
import gzip
import os
import shutil
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import emfast as ef  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from predict_cuda import PATCH_IN, PATCH_OUT, unet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eager", action="store_true", help="without cuda_graphs")
    parser.add_argument("--volume", type=int, nargs=3, default=(100, 600, 600))
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    net = unet(torch).cuda().eval()
    raw, _ = make_em_volume(tuple(args.volume), seed=0)
    directory = tempfile.mkdtemp()
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=4, device="cuda",
                    cuda_graphs=not args.eager, overwrite=True)
    try:
        ef.predict(net, raw, os.path.join(directory, "warm.zarr/p"), **settings)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
            result = ef.predict(net, raw, os.path.join(directory, "p.zarr/p"), **settings)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{result.tiles_computed} tiles in {result.seconds:.2f} s; profile (ms per tile): "
          + ", ".join(f"{k} {1e3 * v / result.tiles_computed:.2f}" for k, v in result.profile.items()))
    path = os.path.join(os.environ.get("OUT", "."), "predict-trace.json")
    trace.export_chrome_trace(path)
    with open(path, "rb") as source, gzip.open(path + ".gz", "wb") as target:
        shutil.copyfileobj(source, target)
    os.remove(path)
    averages = trace.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=50))
    print(averages.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=50))


if __name__ == "__main__":
    main()
