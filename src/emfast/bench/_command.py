"""The ``emfast bench`` command line: its options, and the run with its report, JSON record and plot."""
from __future__ import annotations

import argparse

from .._machine import add_cache_dir_option, cores
from ._host import log
from ._record import Record
from ._report import plot
from ._runs import run
from ._settings import SEED, settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``emfast bench``."""
    parser.add_argument("--patch", type=int, nargs=3, metavar=("Z", "Y", "X"),
                        help="patch size (default: 32 128 128; 16 48 48 with --quick)")
    parser.add_argument("--batch-size", type=int, help="examples per batch (default: 8; 4 with --quick)")
    parser.add_argument("--threads", type=int, help=f"emfast threads and DataLoader workers of the main rows "
                                                    f"(default: all cores, {cores()} here)")
    parser.add_argument("--seconds", type=float, help="time per row and round (default: 1.5; 0.15 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the comparison (default: 3; 1 with "
                                                   "--quick)")
    parser.add_argument("--no-curves", action="store_true", help="only the comparison table")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: small volume, patch and batch, short measurements")
    parser.add_argument("--json", metavar="FILE", help="also write every number to this JSON file")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the comparison and the curves (needs matplotlib)")
    add_cache_dir_option(parser)
    parser.add_argument("--volume-shape", type=int, nargs=3, metavar=("Z", "Y", "X"),
                        help="shape of the built-in volume (default: 144 384 384; 40 96 96 with --quick)")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed (default: %(default)s)")


def command(args: argparse.Namespace) -> int:
    """``emfast bench``: run, print the report, write the JSON and the plot if asked."""
    config = settings(patch=args.patch, batch_size=args.batch_size, threads=args.threads,
                      volume_shape=args.volume_shape, seconds=args.seconds, rounds=args.rounds,
                      curves=not args.no_curves, quick=args.quick, seed=args.seed, cache_dir=args.cache_dir,
                      json_path=args.json, plot=args.plot)
    record = Record(config.json)
    try:
        result = run(config, record)
    except BaseException:
        kept = record.partial_report()
        if kept:
            print("\n".join(kept), flush=True)
        raise
    print("\n".join(result["report"]))
    left = result["leftovers"]
    if left["threads"] or left["processes"]:
        print(f"WARNING: still running after the benchmark: threads {left['threads']}, processes "
              f"{left['processes']}")
    if config.json:
        log(f"wrote {config.json}")
    if config.plot:
        plot(config.plot, config, result["rows"], result["curves"])
        log(f"wrote {config.plot}")
    return 0
