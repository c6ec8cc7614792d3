"""How long torch DataLoader workers wait for their first batch, against building the loader, in the same run.

    python benchmarks/dataloader_workers.py [--shape Z Y X] [--workers N] [--epochs N] [--context fork|spawn]
                                            [--json PATH]

Data: a lazy zarr v3 sample (raw uint8 and uint64 labels of ``--shape``, default (125, 1250, 1250), the size of a
CREMI volume; labels in boxes of (25, 50, 50) voxels), written once to a temporary folder.

For each sampler (``Uniform()``, which builds no index: the floor of the workers' start, then
``Balanced("boundary")`` and ``Masked(0.5, source="labels")``) the loader is built in the main
process (its sampler reads the labels and builds its index), then iterated through a ``torch.utils.data.DataLoader``
with ``--workers`` workers started by ``--context`` (forked by default; spawned ones get the loader pickled) and no
persistent workers, for ``--epochs`` epochs. Reported: the seconds to build the loader (the baseline), and per
epoch the seconds from the start of the epoch to its first batch. A worker draws its own shard, so it binds its
copy of the loader again: a worker that rebuilt the index waited about as long as the build.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _workload import machine_info

import emfast as ef


def write_sample(folder: Path, shape) -> Path:
    import zarr
    rng = np.random.default_rng(0)
    box = (25, 50, 50)
    cells = rng.integers(1, 5000, tuple(s // b + 1 for s, b in zip(shape, box))).astype(np.uint64)
    labels = cells.repeat(box[0], 0).repeat(box[1], 1).repeat(box[2], 2)[:shape[0], :shape[1], :shape[2]]
    group = zarr.open_group(folder / "sample.zarr", mode="w")
    group.create_array("raw", data=(labels % 251).astype(np.uint8), chunks=(32, 256, 256))
    group.create_array("labels", data=np.ascontiguousarray(labels), chunks=(32, 256, 256))
    return folder / "sample.zarr"


class RawBatches(torch.utils.data.IterableDataset):
    """The DataLoader's dataset: each batch's raw, copied out of the loader's slot (module level: spawned workers
    import it)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield batch["raw"].copy()


def measure(store: Path, sampler, workers: int, epochs: int, context: str) -> dict:
    start = time.perf_counter()
    sample = ef.Sample(ef.open(store / "raw", in_memory=False), labels=ef.open(store / "labels", in_memory=False))
    loader = ef.Loader(sample, patch=(16, 128, 128), batch_size=2, sampler=sampler, threads=1, epoch_size=4,
                       close_data=True)
    built = time.perf_counter() - start
    data = torch.utils.data.DataLoader(RawBatches(loader), batch_size=None, num_workers=workers,
                                       persistent_workers=False, multiprocessing_context=context)
    first = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        for index, _ in enumerate(data):
            if index == 0:
                first.append(time.perf_counter() - start)
    loader.close()
    return {"build_s": built, "first_batch_s": first}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=(125, 1250, 1250))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--context", choices=("fork", "spawn", "forkserver"), default="fork",
                        help="how the workers start (default fork; spawn on macOS and Windows)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = {"machine": machine_info(), "shape": list(args.shape), "workers": args.workers,
               "context": args.context, "samplers": {}}
    print(f"machine: {results['machine']}")
    with tempfile.TemporaryDirectory() as folder:
        store = write_sample(Path(folder), tuple(args.shape))
        samplers = {"uniform": ef.Uniform(), "balanced": ef.sampling.Balanced("boundary"),
                    "masked": ef.sampling.Masked(0.5, source="labels", unlabelled=0)}
        for name, sampler in samplers.items():
            row = measure(store, sampler, args.workers, args.epochs, args.context)
            results["samplers"][name] = row
            epochs = ", ".join(f"{s:.2f}" for s in row["first_batch_s"])
            print(f"{name:9}: loader built in {row['build_s']:.2f} s; first batch of each epoch after {epochs} s "
                  f"({args.workers} {args.context} workers; ratio to the build "
                  f"{max(row['first_batch_s']) / row['build_s']:.2f} at most)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
