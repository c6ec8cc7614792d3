#!/usr/bin/env python
"""GrowBoundary: emfast's kernel against gunpowder's node, and what growing costs a training batch.

    python benchmarks/grow_boundary.py [--gunpowder-python PATH] [--rounds R] [--json PATH] [--quick]

1. One example, one thread: the labels of one (32, 128, 128) window of the demo volume (serial-section EM
   neurites), grown by 1, 2, 4 and 8 steps in 3-D and in plane; best of ``rounds``. With ``--gunpowder-python``
   (a Python with gunpowder, which pins zarr 2: its own virtual environment), gunpowder's ``GrowBoundary`` erosion
   runs on the same array in a subprocess with one BLAS/OpenMP thread, and its output is compared with emfast's.
2. A training batch: ``Loader(threads=2, batch_size=8, patch=(32, 128, 128))`` on the (96, 384, 384) demo volume,
   mirror and transpose, ``[Affinities()]``, without and with ``GrowBoundary(steps)``: batches/s, the loaders in
   turn for ``rounds`` rounds, the best of each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import emfast as ef  # noqa: E402
from emfast._core import targets as _targets  # noqa: E402
from emfast.io._demo import make_em_volume  # noqa: E402
from _workload import count_option, machine_info  # noqa: E402

STEPS = (1, 2, 4, 8)
WINDOW = (32, 128, 128)

#: Run by gunpowder's Python: time its GrowBoundary erosion on the saved labels (best of the rounds).
GUNPOWDER_TIMER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from gunpowder.nodes.grow_boundary import GrowBoundary
    labels_path, steps, in_plane, rounds, out_path = (sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1",
                                                      int(sys.argv[4]), sys.argv[5])
    labels = np.load(labels_path)
    node = GrowBoundary(None, steps=steps, background=0, only_xy=in_plane)
    best = float("inf")
    for _ in range(rounds):
        grown = labels.copy()
        start = time.perf_counter()
        node._GrowBoundary__grow(grown, None, in_plane)
        best = min(best, time.perf_counter() - start)
    print(best)
    np.save(out_path, grown)
""")


def time_gunpowder(python, labels, steps, in_plane, rounds):
    """gunpowder's best seconds for ``labels`` and its grown labels."""
    with tempfile.TemporaryDirectory() as folder:
        labels_path, out_path = os.path.join(folder, "labels.npy"), os.path.join(folder, "grown.npy")
        np.save(labels_path, labels)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        result = subprocess.run([python, "-c", GUNPOWDER_TIMER, labels_path, str(steps), str(int(in_plane)),
                                 str(rounds), out_path], capture_output=True, text=True, env=env, check=True)
        return float(result.stdout.strip().splitlines()[-1]), np.load(out_path)


def time_emfast(labels, steps, in_plane, rounds):
    """emfast's best seconds for ``labels`` (one kernel call, this thread) and its grown labels."""
    best = float("inf")
    for _ in range(rounds):
        grown = labels[np.newaxis, np.newaxis].copy()
        start = time.perf_counter()
        _targets.grow_boundary(grown, None, steps, in_plane, 0)
        best = min(best, time.perf_counter() - start)
    return best, grown[0, 0]


def loader_rate(raw, labels, augment, batches):
    """Batches/s of a two-thread loader with ``augment`` and affinities, after a first batch."""
    with ef.Loader(ef.Sample(raw, labels), patch=WINDOW, batch_size=8, threads=2, seed=0, augment=augment,
                   targets=[ef.Affinities()]) as loader:
        loader.next_batch()
        start = time.perf_counter()
        for _ in range(batches):
            loader.next_batch()
        return batches / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gunpowder-python", default=None, help="a Python with gunpowder installed")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per measurement (default 5; --quick: 2)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and batches")
    args = parser.parse_args(argv)
    rounds = count_option(args.rounds, 5, 2, args.quick)
    raw, labels = make_em_volume((96, 384, 384), seed=0)
    window = np.ascontiguousarray(labels[:WINDOW[0], :WINDOW[1], :WINDOW[2]])
    kernel = []
    print(f"machine: {machine_info()}")
    print(f"one {WINDOW} window, one thread, best of {rounds}:")
    for steps in STEPS:
        for in_plane in (False, True):
            seconds, grown = time_emfast(window, steps, in_plane, rounds)
            row = {"steps": steps, "in_plane": in_plane, "emfast_s": seconds}
            line = f"  steps {steps} {'in plane' if in_plane else '3-D     '}: emfast {seconds * 1e3:8.2f} ms"
            if args.gunpowder_python:
                theirs, their_grown = time_gunpowder(args.gunpowder_python, window, steps, in_plane, rounds)
                row.update(gunpowder_s=theirs, ratio=theirs / seconds, equal=bool(np.array_equal(grown, their_grown)))
                line += (f", gunpowder {theirs * 1e3:8.2f} ms: {row['ratio']:6.1f}x faster, "
                         f"{'equal' if row['equal'] else 'DIFFERENT'}")
            kernel.append(row)
            print(line, flush=True)
    batches = 5 if args.quick else 20
    configs = {"none": ["mirror", "transpose"]}
    configs.update({steps: ["mirror", "transpose", ef.GrowBoundary(steps=steps)] for steps in STEPS})
    rates = {name: 0.0 for name in configs}
    for _ in range(rounds):  # the configurations in turn, each round: the best of its rounds
        for name, augment in configs.items():
            rates[name] = max(rates[name], loader_rate(raw, labels, augment, batches))
    print(f"Loader(threads=2, batch_size=8, patch={WINDOW}), mirror and transpose, affinities, {batches} batches, "
          f"best of {rounds}:")
    for name, rate in rates.items():
        label = "without GrowBoundary" if name == "none" else f"GrowBoundary(steps={name})"
        print(f"  {label:22s} {rate:6.2f} batches/s ({rate / rates['none']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "rounds": rounds, "kernel": kernel,
                       "loader_batches_per_s": {str(k): v for k, v in rates.items()}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
