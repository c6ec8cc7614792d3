"""The ``emfast`` command: ``emfast demo`` streams batches from a built-in volume; ``emfast info`` lists a file;
``emfast check`` validates a YAML config (see :mod:`emfast.config`); ``emfast convert`` copies a volume between
formats; ``emfast predict`` runs a network over a whole volume (see :mod:`emfast.inference`); ``emfast bench``
compares emfast with NumPy, PyTorch and the memory-bandwidth floor (see :mod:`emfast.bench`)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from importlib import metadata
from typing import List, Optional

import numpy as np

from . import __version__
from . import bench as _bench
from . import config as _config
from ._checks import triple
from ._machine import add_cache_dir_option, cores
from ._threads import Terminated, sigterm_interrupts
from .augment import Intensity, Mirror, Transpose
from .io import (LABELS_DATASET, RAW_DATASET, Volume, contents, demo_volume_path, hdf5, unfinished, volume_statistics,
                 world_box)
from .io import COMPRESSIONS
from .io import DOWNSAMPLING
from .io import convert as convert_volume
from .io import command_line_options, compression_option
from .io import ProgressBar, plural, progress_bar
from .inference import model_blamed
from .pipeline import Loader

#: The demo's progress bar (batches/s and Mvoxel/s): the one bar of every command.
Progress = ProgressBar


def _triple(text: List[int]) -> tuple:
    return tuple(int(v) for v in text)


def _volume_shape(args: argparse.Namespace) -> tuple:
    """``--volume-shape``, refused as ``emfast bench`` refuses it (the built-in volume is at least 8 a side)."""
    return triple(args.volume_shape, "--volume-shape", minimum=8)


def _stand_in(shape: tuple, dtype, name: str) -> Volume:
    """A volume of ``shape`` that allocates nothing (every voxel is one shared zero), for checking arguments."""
    return Volume.from_array(np.broadcast_to(np.zeros((), dtype), shape), name=name)


def demo(args: argparse.Namespace) -> int:
    """Build (once) the built-in volume and stream batches through the full loader."""
    if args.batches < 1:
        raise ValueError(f"--batches must be at least 1, got {args.batches}")
    if args.config is not None:
        return _config_demo(args)
    shape = _volume_shape(args)
    augment = [Mirror(), Transpose(), Intensity(scale=0.1, shift=0.1)]
    settings = dict(patch=_triple(args.patch), batch_size=args.batch_size, augment=augment, threads=args.threads,
                    seed=args.seed, dtype=args.dtype, epoch_size=args.batches)
    # Every check (patch against the volume, memory, threads) before the volume is built and cached: a stand-in
    # of its shape and dtypes costs no memory.
    Loader(_stand_in(shape, np.uint8, f"the built-in volume {shape}"), _stand_in(shape, np.uint64, "labels"),
           **settings)
    print(f"emfast {__version__}: preparing the built-in EM volume {shape} ...", file=sys.stderr)
    path = demo_volume_path(cache_dir=args.cache_dir, shape=shape)
    raw = hdf5(path, RAW_DATASET, in_memory=not args.lazy)
    labels = hdf5(path, LABELS_DATASET, in_memory=not args.lazy)
    loader = Loader(raw, labels, **settings)
    print(f"volume: {path}\n  raw {raw.shape} {raw.dtype}, labels {labels.dtype}"
          f"{' (read lazily)' if args.lazy else ''}\n"
          f"batches of {args.batch_size} x {loader.patch}, {args.threads} producer thread(s), "
          f"augment: {', '.join(a.name for a in augment)}", file=sys.stderr)
    progress = Progress(args.batches, args.batch_size * int(np.prod(loader.patch)), sys.stderr)
    try:
        with loader:
            for done, _ in enumerate(loader, start=1):
                progress.update(done)
    finally:
        progress.finish()
        raw.close()
        labels.close()
    print(loader.profile)
    return 0


def _config_demo(args: argparse.Namespace) -> int:
    """Stream ``--batches`` batches from the training loader of a config (the built-in one without a FILE)."""
    source = args.config or _config.BUILTIN_CONFIG
    config = _config.load_config(source)
    print(f"emfast {__version__}: building the loader of {source} ...", file=sys.stderr)
    loader = config.loader("train", cache_dir=args.cache_dir, demo_shape=_volume_shape(args))
    print(f"samples: {', '.join(loader.dataset.names)}\n"
          f"batches of {loader.batch_size} x {loader.patch}, {loader.threads} producer thread(s), "
          f"augment: {', '.join(a.name for a in loader.augmentations) or 'none'}, "
          f"targets: {', '.join(t.name for t in loader.targets) or 'none'}, sampler: {loader.sampler.name}",
          file=sys.stderr)
    progress = Progress(args.batches, loader.batch_size * int(np.prod(loader.patch)), sys.stderr)
    try:
        with loader:
            for done in range(1, args.batches + 1):
                loader.next_batch()
                progress.update(done)
    finally:
        progress.finish()
        loader.close()  # closes the files the config opened, also when start() failed
    print(loader.profile)
    return 0


def config_path(value: str) -> str:
    """A config argument: an empty one is refused here (an unset shell variable, ``emfast predict "$CFG"``), not
    read as the text of an empty config."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the config path is empty (an unset shell variable?)")
    return value


def storage_options(value: str) -> dict:
    """A ``--storage-options`` argument: a JSON object (fsspec's options of a URL, and emfast's ``timeout`` and
    ``retries``)."""
    try:
        options = json.loads(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}); e.g. '{{\"timeout\": 10}}'") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of options, e.g. '{{\"timeout\": 10}}', got {value}")
    return options


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-options", type=storage_options, default=None, metavar="JSON",
                        help="for a URL (s3://, gs://, http(s)://): fsspec's options of its protocol as a JSON "
                             "object, e.g. for s3:// '{\"endpoint_url\": \"http://127.0.0.1:9000\", \"anon\": true}', "
                             "and emfast's \"timeout\" (seconds per request) and \"retries\"")


def check(args: argparse.Namespace) -> int:
    """Validate a config (training sections, a predict section, or both) without streaming or calling the model;
    print what it would read."""
    print(_config.check_config(args.config, cache_dir=args.cache_dir))
    return 0


def snapshot(args: argparse.Namespace) -> int:
    """Write the next batches of a config's training loader to a zarr store (and a PNG montage) to look at."""
    config = _config.load_config(args.config)
    loader = config.loader(args.split, cache_dir=args.cache_dir)
    try:
        with loader:
            path = loader.snapshot(args.out, batches=args.batches, png=args.png)
    finally:
        loader.close()  # closes the files the config opened, also when start() failed
    montage = f" and a montage to {args.png}" if args.png else ""
    print(f"wrote {args.batches} {plural(args.batches, 'batch')} to {path}{montage}")
    return 0


def _format_attrs(attrs: dict) -> str:
    items = []
    for key, value in attrs.items():
        value = value.tolist() if isinstance(value, np.ndarray) else value
        items.append(f"{key}={value}")
    # a lone surrogate (valid JSON: "\ud800") cannot be printed as UTF-8, and info stopped after its first line
    return ", ".join(items).encode("utf-8", "backslashreplace").decode("utf-8")


def installation() -> List[str]:
    """What this installation of emfast is and can use: version, CPU features, GPU."""
    from ._core import blend as _blend
    from ._core import targets as _targets
    from ._core import warp as _warp
    from .transfer import cuda_unavailable

    builds = (("warp samplers", _warp.uses_avx2), ("blending", _blend.uses_avx2),
              ("boundary growing", _targets.grow_uses_avx2))
    avx2 = [kernels for kernels, used in builds if used()]
    gpu = cuda_unavailable()
    h5py = metadata.version("h5py")
    return [f"emfast {__version__} (Python {sys.version.split()[0]}, NumPy {np.__version__}, h5py {h5py})",
            "CPU: SSE2 kernels; AVX2 " + (_listed(avx2) + " in use" if avx2 else
                                          _listed([kernels for kernels, _ in builds]) + " not used (CPU without "
                                          "AVX2, or EMFAST_NO_AVX2 set)"),
            f"cores: {cores()} usable",
            "GPU: " + ("usable through pycuda (device='cuda')" if gpu is None else f"not available: {gpu}")]


def _listed(names: list) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


#: ``emfast info`` summarises values from at most this many chunks and bytes of each volume, spread over it.
INFO_SAMPLE_CHUNKS = 16
INFO_SAMPLE_BYTES = 64 << 20
#: The boxes sampled from an unchunked (contiguous) dataset, in voxels (z, y, x).
_INFO_BLOCK = (32, 256, 256)
#: Words in a dataset's name that say it holds labels (with an integer dtype).
_LABEL_WORDS = ("label", "seg", "ids")


def _sample(volume: Volume) -> tuple:
    """Values of up to :data:`INFO_SAMPLE_CHUNKS` chunks (at most :data:`INFO_SAMPLE_BYTES`) spread evenly over
    the volume in grid order, flattened; and how many chunks that is of how many."""
    chunk = tuple(volume.chunks[-3:]) if volume.chunks else _INFO_BLOCK
    chunk = tuple(min(c, s) for c, s in zip(chunk, volume.shape))
    box = list(chunk)
    while volume.channels * int(np.prod(box)) * volume.dtype.itemsize > INFO_SAMPLE_BYTES:
        box[int(np.argmax(box))] = -(-max(box) // 2)  # a chunk beyond the budget: read its first part
    grid = tuple(-(-s // c) for s, c in zip(volume.shape, chunk))
    total = int(np.prod(grid))
    box_bytes = volume.channels * int(np.prod(box)) * volume.dtype.itemsize
    count = max(1, min(INFO_SAMPLE_CHUNKS, total, INFO_SAMPLE_BYTES // box_bytes))
    values = []
    for flat in np.unique(np.linspace(0, total - 1, count).round().astype(np.int64)):
        corner = tuple(int(i) * c for i, c in zip(np.unravel_index(flat, grid), chunk))
        extent = tuple(min(b, s - c) for b, s, c in zip(box, volume.shape, corner))
        values.append(volume.read_box(corner, extent, np.empty((volume.channels,) + extent, volume.dtype)).ravel())
    return np.concatenate(values), count, total


def _values_line(volume: Volume, name: str) -> str:
    """``emfast info``'s summary of a volume's values from a bounded sample: min/max/mean/std of raw data, the
    number of ids and the highest ids of labels."""
    values, count, total = _sample(volume)
    where = (f"all {total} {plural(total, 'chunk')}" if count == total else
             f"{count} of {total} chunks, spread over the volume")
    head = (f"    values from {where} ({values.nbytes / 2 ** 20:.3g} MiB; at most {INFO_SAMPLE_CHUNKS} chunks or "
            f"{INFO_SAMPLE_BYTES >> 20} MiB are read): ")
    labels = volume.dtype.kind in "ui" and (volume.dtype.itemsize >= 4 or
                                            any(word in name.lower() for word in _LABEL_WORDS))
    if labels:
        ids = np.unique(values)
        ids = ids[ids != 0]  # background
        highest = ", ".join(str(i) for i in ids[::-1][:5]) or "none"
        background = np.count_nonzero(values == 0) / values.size
        return head + (f"{ids.size} {plural(ids.size, 'label')} besides 0 (background: {background:.1%} of "
                       f"voxels), highest: {highest}")
    try:
        stats = volume_statistics(Volume.from_array(values.reshape(1, 1, -1), name=volume.name), cache=False)
    except ValueError as error:  # NaN or infinity in a float volume
        return head + str(error).split(": ", 1)[-1]
    return head + f"min={stats.min:.6g} max={stats.max:.6g} mean={stats.mean:.6g} std={stats.std:.6g}"


def _geometry_text(volume) -> str:
    """A volume's voxel size and offset as emfast reads them, and its world box: (z, y, x) nm."""
    box = world_box(volume.shape, volume.resolution, volume.offset)
    world = "" if box is None else f" world=[{box[0]}, {box[1]}) nm"
    return f" resolution={volume.resolution} offset={volume.offset}{world}"


def info(args: argparse.Namespace) -> int:
    """Without a file: the installation. With one: its datasets with shape, dtype, chunks and attributes, and
    their values summarised from a bounded sample of chunks (see :func:`_values_line`)."""
    if args.file is None:
        if args.storage_options is not None:
            raise ValueError("--storage-options apply to a URL; name one (emfast info URL --storage-options ...)")
        print("\n".join(installation()))
        return 0
    found = contents(args.file, args.storage_options)
    print(f"{args.file}" + (f"  [{_format_attrs(found.attributes)}]" if found.attributes else ""))
    listed, unreadable = False, 0
    for dataset in found.datasets:
        listed = True
        attrs = f"  [{_format_attrs(dataset.attributes)}]" if dataset.attributes else ""
        finish = unfinished(dataset.attributes)
        if finish is not None:
            attrs = f"  (an unfinished emfast output: {finish}){attrs}"
        if dataset.volume is None:
            print(f"  {dataset.name}: {dataset.summary}{attrs}")
            continue
        with dataset.volume as volume:
            print(f"  {dataset.name or '.'}: {dataset.summary}{_geometry_text(volume)}{attrs}")
            try:
                print(_values_line(volume, dataset.name))
            except OSError as error:  # a corrupt chunk: said, and the file's other datasets still listed
                unreadable += 1
                print(f"    values not read: {error}")
    if not listed:
        print(f"  {found.nothing}")
    if unreadable:
        print(f"emfast: error: the values of {unreadable} {plural(unreadable, 'dataset')} could not be read (above)",
              file=sys.stderr)
        return 2
    return 0


def convert(args: argparse.Namespace) -> int:
    """Convert a volume between formats, resumably (run the same command again after an interruption)."""
    if args.compressor is not None:  # said here, once, as the command's warning: not a Python warning, which
        # -W error (or PYTHONWARNINGS=error) turned into an "internal error"
        print("emfast: warning: --compressor is deprecated; use --compression (the same values)", file=sys.stderr)
    with warnings.catch_warnings(), command_line_options():
        warnings.simplefilter("ignore", DeprecationWarning)
        compression = compression_option(args.compression, args.compressor)
    bar = progress_bar()
    try:
        with command_line_options():
            result = convert_volume(args.source, args.destination, chunks=args.chunks, compression=compression,
                                    zarr_format=args.zarr_format, overwrite=args.overwrite, progress=bar,
                                    levels=args.levels, downsampling=args.downsampling,
                                    level=args.level, resolution=args.resolution,
                                    storage_options=args.storage_options)
    finally:
        bar.finish()  # an error's message starts on a line of its own
    if result.written == 0:
        print(f"{args.destination} is already complete ({result.tiles} {plural(result.tiles, 'tile')}); nothing "
              "to do")
    else:
        print(f"wrote {args.destination} ({result.written} of {result.tiles} {plural(result.tiles, 'tile')})")
    return 0


def predict(args: argparse.Namespace) -> int:
    """Run the predict section of a config, with a progress bar; resumable with --resume."""
    spec = _config.load_predict_config(args.config)
    with command_line_options():
        result = spec.run(resume=args.resume, overwrite=args.overwrite, progress=True, cache_dir=args.cache_dir)
    channels, *spatial = result.shape
    blocks = f"{result.computed} of {result.blocks} {plural(result.blocks, 'block')}"
    print(f"wrote {result.path}: {channels} {plural(channels, 'channel')} x {' x '.join(map(str, spatial))} "
          f"{result.dtype}; {blocks} computed in {result.seconds:.1f} s{_model_share(result)}")
    return 0


def _model_share(result) -> str:
    """How much of a prediction's time the model was busy: near all of it, the network set the pace."""
    if not result.seconds or not result.profile.get("model"):
        return ""
    return f", the model busy {min(1.0, result.profile['model'] / result.seconds):.0%} of it"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that help, usage and version text that cannot be written is an error: argparse
    drops it without a word, and ``emfast --version >/dev/full`` said it was done (exit 0)."""

    def _print_message(self, message, file=None) -> None:
        if message:
            (file or sys.stderr).write(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="emfast", description="Fast 3-D patch loading from EM volumes.")
    parser.add_argument("--version", action="version", version=f"emfast {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("demo", help="stream augmented batches from a built-in EM-like volume",
                              description="Stream augmented batches from a built-in EM-like volume (generated "
                                          "and cached on first use) and print the per-stage profile.")
    run.add_argument("--batches", type=int, default=300, help="batches to stream (default: %(default)s)")
    run.add_argument("--batch-size", type=int, default=8, help="examples per batch (default: %(default)s)")
    run.add_argument("--patch", type=int, nargs=3, default=[32, 128, 128], metavar=("Z", "Y", "X"),
                     help="patch size (default: 32 128 128)")
    run.add_argument("--threads", type=int, default=cores(), help="producer threads (default: all cores, "
                                                                   "%(default)s here)")
    run.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    run.add_argument("--dtype", choices=["float32", "float16"], default="float32", help="raw output type")
    run.add_argument("--lazy", action="store_true", help="read windows from the HDF5 file instead of memory")
    add_cache_dir_option(run)
    run.add_argument("--volume-shape", type=int, nargs=3, default=[96, 384, 384], metavar=("Z", "Y", "X"),
                     help="shape of the built-in volume (default: 96 384 384)")
    run.add_argument("--config", nargs="?", const="", default=None, metavar="FILE",
                     help="stream from the training loader of a YAML config (without FILE: the built-in one on the "
                          "built-in volume); the config sets patch, batch size, threads, seed, dtype and laziness, "
                          "while --batches, --cache-dir and --volume-shape still apply")
    run.set_defaults(handler=demo)

    validate = commands.add_parser("check", help="validate a YAML config and summarise its data",
                                   description="Validate a YAML config without streaming: open every volume, build "
                                               "the loaders (and the sampler's index), and print per sample the "
                                               "volumes, alignment, label classes and usable windows, and the "
                                               "memory estimate. A predict section (alone or beside them): import "
                                               "the model factory without calling it, match model_args to it, check "
                                               "the device, open the input and lay the tiles. Exit status 0 if "
                                               "valid, 2 with the error (file, line, key) if not.")
    validate.add_argument("config", help="a YAML config (see docs/CONFIG.md)", type=config_path)
    add_cache_dir_option(validate)
    validate.set_defaults(handler=check)

    show = commands.add_parser("info", help="this installation, or the datasets of a file or store",
                               description="Without FILE: the version, the CPU features the kernels use, and "
                                           "whether pycuda and a GPU are available. With FILE: every dataset of "
                                           "the HDF5 file, zarr or N5 store (or precomputed volume) with shape, "
                                           "dtype, chunks and metadata, and its values from a sample of at most "
                                           f"{INFO_SAMPLE_CHUNKS} chunks or {INFO_SAMPLE_BYTES >> 20} MiB: min, "
                                           "max, mean and std of raw data, the number of ids and the highest ids "
                                           "of labels; a path inside a store names one array or group.")
    show.add_argument("file", nargs="?", help="an HDF5 file, a zarr/N5 store or a precomputed volume")
    add_storage_options(show)
    show.set_defaults(handler=info)

    look = commands.add_parser("snapshot", help="write batches of a config's loader to zarr (and PNG) to look at",
                               description="Take the next batches of a config's loader and write every field (raw, "
                                           "labels, targets, masks) of every example to a new zarr store, each as "
                                           "an OME-NGFF image at its window's world position, so that neuroglancer, "
                                           "napari or ome-zarr-py show the fields as aligned layers; --png also "
                                           "renders the central sections of the first batch.")
    look.add_argument("config", help="a YAML config (see docs/CONFIG.md)", type=config_path)
    look.add_argument("--out", required=True, help="the zarr store to create (must not exist)")
    look.add_argument("--batches", type=int, default=1, help="batches to write (default: %(default)s)")
    look.add_argument("--png", default=None, metavar="FILE", help="also write a montage of the first batch here")
    look.add_argument("--split", choices=["train", "validation"], default="train", help="which loader")
    add_cache_dir_option(look)
    look.set_defaults(handler=snapshot)

    change = commands.add_parser("convert", help="convert a volume between formats (HDF5, zarr, N5, precomputed "
                                                 "to zarr or HDF5)",
                                 description="Copy SOURCE (any path emfast.open takes, e.g. in.h5/volumes/raw) to "
                                             "DESTINATION (out.zarr/raw or out.h5/raw) chunk tile by tile, with its "
                                             "attributes, resolution and offset. Interrupted? Run the same command "
                                             "again: it resumes after the last finished tile. An existing output "
                                             "that is not an unfinished conversion of SOURCE is refused without "
                                             "--overwrite. SOURCE is never written.")
    change.add_argument("source", help="the volume to read")
    change.add_argument("destination", help="the dataset to write, inside a .zarr or .h5 container")
    change.add_argument("--chunks", type=int, nargs=3, metavar=("Z", "Y", "X"),
                        help="output chunks (default: the source's, else 64 64 64)")
    change.add_argument("--compression", choices=COMPRESSIONS, default=None,
                        help="zarr: zstd (default), blosc, gzip or none; HDF5: gzip (default) or none")
    change.add_argument("--compressor", choices=COMPRESSIONS, default=None, help="deprecated name of --compression")
    change.add_argument("--levels", type=int, default=1,
                        help="levels of a multiscale pyramid (zarr; default 1): DESTINATION becomes an OME-NGFF "
                             "image of s0, s1, ..., each halving the axes whose voxel size is < 2x the smallest")
    change.add_argument("--downsampling", choices=DOWNSAMPLING, default=None,
                        help="mean (intensities) or mode (labels: most frequent id, ties to the lowest); default "
                             "mode for 32/64-bit integers, else mean")
    change.add_argument("--zarr-format", type=int, choices=[2, 3], default=3,
                        help="zarr format of a new store (default 3); an existing store keeps its own")
    which = change.add_mutually_exclusive_group()
    which.add_argument("--level", type=int, default=None,
                       help="an OME-Zarr image's level (a precomputed volume's scale) to convert, by index (default 0)")
    which.add_argument("--resolution", type=float, nargs=3, metavar=("Z", "Y", "X"), default=None,
                       help="the level to convert by its voxel size in nm")
    change.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_storage_options(change)
    change.set_defaults(handler=convert)

    infer = commands.add_parser("predict", help="run a network over a whole volume and write the result",
                                description="Run the predict section of CONFIG (see docs/CONFIG.md): the model "
                                            "factory (module:function) over the input in overlapping tiles, "
                                            "blended and written block by block to the output, with a progress "
                                            "bar. Interrupted? Run it again with --resume: finished blocks are "
                                            "skipped and the result is the same, byte for byte. An existing "
                                            "output is refused without --resume or --overwrite.")
    infer.add_argument("config", help="a YAML config with a predict section", type=config_path)
    infer.add_argument("--resume", action="store_true", help="continue an unfinished prediction")
    infer.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_cache_dir_option(infer)
    infer.set_defaults(handler=predict)

    measure = commands.add_parser("bench", help="compare emfast with NumPy, PyTorch and the copy floor",
                                  description="Time the standard task (batch 8 x (32, 128, 128), uint8 raw -> "
                                              "float32, uint64 labels -> 3 affinities, mirror/transpose + "
                                              "intensity) on the built-in volume: emfast, a NumPy reference, a "
                                              "PyTorch DataLoader and np.copyto of the outputs, as ratios from "
                                              "one run, plus scaling curves.")
    _bench.add_arguments(measure)
    measure.set_defaults(handler=_bench.command)
    return parser


def user_error(error: BaseException) -> bool:
    """Whether ``error`` is about the user's input or environment, to be told in one line; anything else is a bug
    of emfast, whose traceback must be seen.

    One line: ``ValueError`` and its subclasses (bad values, config errors naming file, line and key), ``OSError``
    (missing or unreadable files, full disks: the machine's state, never a logic error), an ``ImportError`` of an
    optional package, and the errors emfast declares itself (such as ``DatasetNotFoundError``, a ``KeyError``).
    A ``TypeError``, a plain ``KeyError``, an ``AttributeError``, a ``RuntimeError`` and the like are bugs.
    """
    if isinstance(error, (ValueError, OSError)):
        return True
    if isinstance(error, ImportError):  # emfast's own modules failing to import is a bug, a missing extra is not
        return not (error.name or "").startswith("emfast")
    return type(error).__module__.startswith("emfast.")


def _one_line_warnings() -> None:
    """Warnings told in one line each, ``Category: message``, as the command's errors are, not with the file, line
    and source line of the frame a warning names (emfast's, the console script's, or another package's: told by
    its category, never passed off as emfast's own)."""
    warnings.formatwarning = lambda message, category, filename, lineno, line=None: \
        f"{category.__name__}: {message}\n"


class StandardOutputError(OSError):
    """Standard output could not be written (a full device, a file system gone): what emfast printed is lost."""


class _Diagnostics:
    """Standard error as a command's diagnostics need it: a write that fails (``2>/dev/full``, a terminal gone)
    loses the text, never the work. Everything else is the stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed under it
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _Output(_Diagnostics):
    """Standard output, whose failure is said as such: a full device's ENOSPC read as if the output's disk were
    full. A reader gone (BrokenPipeError) is left to :func:`main`."""

    def write(self, text: str) -> int:
        return self._said(self._stream.write, text)

    def flush(self) -> None:
        self._said(self._stream.flush)

    @staticmethod
    def _said(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as error:
            raise StandardOutputError(error.errno, f"cannot write to standard output ({error.strerror}): what "
                                                   "emfast printed there is lost") from None


def _fill_closed_standard_streams() -> None:
    """Give a closed standard input, output or error (``2>&-``) /dev/null, and standard output or error opened
    only to read (what a closed one is once the shell or a launcher opened a file there): the first diagnostic
    written to a closed standard error failed, and the command with it (a conversion never made, exit 1 without
    a word); and the next file opened would take the free descriptor, so that what is printed would go into it."""
    try:
        import fcntl
    except ImportError:  # Windows: no descriptors of this kind
        return
    for descriptor, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            mode = fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE
            usable = descriptor == 0 or mode in (os.O_WRONLY, os.O_RDWR)
        except OSError:
            usable = False
        if usable:
            continue
        null = os.open(os.devnull, os.O_RDWR)
        if null != descriptor:
            os.dup2(null, descriptor)
            os.close(null)
        if getattr(sys, name) is None:  # Python found it closed at start: print(file=None) writes to stdout
            setattr(sys, name, open(descriptor, "r" if descriptor == 0 else "w", closefd=False))


def _ignore_interrupts() -> None:
    """The command has stopped and says so: another Ctrl-C or SIGTERM (a second press, a scheduler's repeat) until
    the process exits must not turn the exit status into death by the signal, nor print a traceback from the
    interpreter's shutdown. (A caller of :func:`main` with arguments keeps its handlers.)"""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _quiet_abandoned_reads() -> None:
    """After an error or an interruption the command has told in its one line, the reads and writes zarr-python's
    event loop still had pending for the run (a remote store gone mid-conversion, a second Ctrl-C mid-write) are
    destroyed at exit: asyncio would log "Task was destroyed but it is pending!" or "Task exception was never
    retrieved" for each, Python warn of coroutines never awaited and report the errors of their finalisation
    ("Exception ignored in"), a screen of noise after the one line. Only for the process's last moments."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    sys.unraisablehook = lambda unraisable: None


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``emfast`` console script; returns the exit status: 0 done, 2 a user error (told in one
    line), 1 a bug (its traceback and a request to report it), 130 interrupted (Ctrl-C), 143 terminated
    (SIGTERM, as Slurm, ``timeout`` and ``docker stop`` send: the same clean-up as Ctrl-C, a resumable output), 141
    the reader of its output went away (``emfast info ... | head``: quietly, as a command killed by SIGPIPE)."""
    _fill_closed_standard_streams()
    if argv is None:  # the command's own streams and warnings (a caller's, in Python, are the caller's)
        sys.stdout, sys.stderr = _Output(sys.stdout), _Diagnostics(sys.stderr)
        _one_line_warnings()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # here: its help written to a full standard output is an error too
        with sigterm_interrupts():
            return args.handler(args)
    except KeyboardInterrupt as interrupt:
        while argv is None:  # the command: the process ends next
            try:
                _ignore_interrupts()
                _quiet_abandoned_reads()
                break
            except KeyboardInterrupt as again:  # one more arrived before they were ignored (Ctrl-C held down)
                interrupt = interrupt if isinstance(interrupt, Terminated) else again
        if isinstance(interrupt, Terminated):
            print("\nemfast: terminated (SIGTERM)", file=sys.stderr)
            return 143  # 128 + SIGTERM (15), as shells and schedulers report a command the signal ended
        print("\nemfast: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # what is left in stdout's buffer goes nowhere, so that Python's flush at exit does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE (13), as a shell reports a command the signal ended
    except Exception as error:
        model = model_blamed(error)
        if model is not None:  # the user's code: its traceback is theirs to read, the error theirs to fix
            traceback.print_exc()
            hints = [note for note in getattr(error, "__notes__", ()) if isinstance(note, str)
                     and not note.startswith("(raised by the model")]  # emfast's own notes: the cause's hints
            print(f"emfast: error: the model {model} raised {type(error).__name__}: {error}"
                  + "".join(f" ({hint})" for hint in hints), file=sys.stderr)
            return 2
        if user_error(error):
            if argv is None:  # the command: the process ends next
                _quiet_abandoned_reads()
            notes = [note for note in getattr(error, "__notes__", ()) if isinstance(note, str)]  # what to do next
            print(f"emfast: error: {error}" + "".join(f" ({note})" for note in notes), file=sys.stderr)
            return 2
        traceback.print_exc()
        print(f"emfast {__version__}: internal error ({type(error).__name__}): this is a bug in emfast, not in your "
              f"input; please report it with the command you ran and the traceback above", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
