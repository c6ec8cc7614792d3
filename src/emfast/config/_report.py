"""The summary ``emfast check`` prints: each sample's volumes, placement, label census, where windows lie, and the
sampler's view of each region."""
from __future__ import annotations

import math
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..io import Volume, world_box
from ..pipeline import Loader, chunk_cache_bytes
from ..io import plural
from ._config import Config


# -- the summary of `emfast check` --------------------------------------------------------------------------------

#: Most label voxels looked at per sample for the label census of :func:`describe`.
CENSUS_VOXELS = 1 << 20


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _voxels(shape) -> int:
    """Voxels of a box, in Python ints (a NumPy product overflows int64 silently)."""
    return math.prod(int(n) for n in shape)


def _tuple(values) -> str:
    return "(" + ", ".join(f"{v:g}" if isinstance(v, float) else str(int(v)) for v in values) + ")"


def _volume_line(role: str, volume: Volume) -> str:
    parts = [f"  {role:<8} {volume.name}", f"shape {_tuple(volume.shape)}", str(volume.dtype)]
    if volume.channels > 1:
        parts.append(f"{volume.channels} channels")
    parts.append(f"chunks {_tuple(volume.chunks)}" if volume.chunks else "contiguous")
    box = world_box(volume.shape, volume.resolution, volume.offset)
    if box is not None:
        parts.append(f"resolution {_tuple(volume.resolution)}, world [{_tuple(box[0])}, {_tuple(box[1])}) nm")
    if volume.in_memory:
        parts.append(f"in memory {_size(volume.nbytes)}")
    else:
        parts.append(f"lazy, chunk cache {_size(volume.cache_stats.budget_bytes)}")
    return ", ".join(parts)


def _placement(raw: Volume, placed) -> str:
    lo = np.maximum(placed.origin, 0)
    hi = np.minimum(placed.end, np.asarray(raw.shape))
    overlap = np.maximum(hi - lo, 0)
    fraction = _voxels(overlap) / _voxels(raw.shape)
    inside = _voxels(overlap) / _voxels(placed.end - placed.origin)  # on raw's grid, at any voxel size
    partly = "" if inside == 1.0 else f"; only partly overlapping: {100 * inside:.1f}% of its voxels lie in raw"
    return (f"           origin {_tuple(placed.origin)} in raw voxels; overlap with raw {_tuple(overlap)} "
            f"= {100 * fraction:.1f}% of raw; raw voxels [{_tuple(placed.origin)}, {_tuple(placed.end)}){partly}")


def _label_census(labels: Volume) -> str:
    """Background fraction and distinct ids from a strided subsample (in memory) or the central box (lazy)."""
    shape = np.asarray(labels.shape)
    if labels.in_memory:
        step = max(1, math.ceil((_voxels(shape) / CENSUS_VOXELS) ** (1 / 3)))
        data = labels.array[0][::step, ::step, ::step]
        how = f"a subsample with step {step} along each axis" if step > 1 else "every voxel"
    else:
        extent = np.minimum(shape, [32, 128, 128])
        corner = (shape - extent) // 2
        out = np.empty((labels.channels,) + tuple(int(e) for e in extent), labels.dtype)
        data = labels.read_box(corner, extent, out)[0]
        how = f"the central box {_tuple(extent)}"
    background = float(np.count_nonzero(data == 0)) / data.size
    ids = len(np.unique(data))
    return f"background (id 0) {100 * background:.1f}%, {ids} distinct ids ({data.size:,} voxels: {how})"


def _windows(loader: Loader, index: int) -> str:
    region = loader.regions[index]
    raw = loader.dataset.samples[index].raw
    lo, hi = np.asarray(region.lo), np.asarray(region.hi)
    box = _voxels(hi - lo) / _voxels(raw.shape)
    text = f"output windows lie in [{_tuple(lo)}, {_tuple(hi)}) = {100 * box:.1f}% of raw"
    detail = loader.sampler.describe(index, tuple(int(e) for e in loader.patch_out))
    return text if detail is None else f"{text}; {detail}"


def _class_line(loader: Loader, index: int) -> Optional[str]:
    counts = loader.sampler.class_counts()
    if counts is None:
        return None
    row = counts[loader.dataset.samples[index].name]
    total = sum(row.values())
    shares = ", ".join(f"{name} {100 * count / total:.1f}%" if total else f"{name} 0" for name, count in row.items())
    return f"  classes  {shares} of {total:,} indexed centre voxels ({type(loader.sampler).__name__} sampler)"


def _sample_lines(loader: Loader, split: str, index: int) -> Tuple[List[str], List[Volume]]:
    """The summary of sample ``index`` of ``loader``, and its volumes (for the memory estimate)."""
    sample = loader.dataset.samples[index]
    lines = [f"sample {sample.name!r} ({split}, weight {sample.weight:g})", _volume_line("raw", sample.raw)]
    for role, placed in (("labels", sample.placed_labels), ("mask", sample.placed_mask)):
        if placed is not None:
            lines += [_volume_line(role, placed.volume), _placement(sample.raw, placed)]
    for key, volume in sample.extra.items():
        lines.append(_volume_line(key, volume))
    classes = _class_line(loader, index)
    if classes is not None:
        lines.append(classes)
    elif sample.placed_labels is not None:
        lines.append("  labels   " + _label_census(sample.placed_labels.volume))
    lines.append("  windows  " + _windows(loader, index))
    return lines, sample.volumes


def _loader_lines(loader: Loader, split: str) -> List[str]:
    """The summary of ``loader``: batch geometry, threads and buffers, components, fields, device slots."""
    epoch = f"{loader.epoch_size} {plural(loader.epoch_size, 'batch')} per epoch" if loader.epoch_size else "endless"
    geometry = f"patch {_tuple(loader.patch_out)}" if loader.patch_in == loader.patch_out else \
        f"patch_in {_tuple(loader.patch_in)} -> patch_out {_tuple(loader.patch_out)}"
    lines = [f"loader ({split}): batch {loader.batch_size} x {geometry}, {loader.threads} thread(s), "
             f"{loader.buffers} buffers (at most {loader.max_buffers}), {epoch}, seed {loader.seed}, "
             f"device {loader.device}",
             "  augment  " + (", ".join(map(repr, loader.augmentations)) or "none"),
             "  targets  " + (", ".join(map(repr, loader.targets)) or "none"),
             f"  sampler  {loader.sampler!r}",
             "  fields   " + ", ".join(f"{name} {_tuple(shape)} {dtype}"
                                       for name, (shape, dtype) in loader.fields.items())]
    if loader.device != "cpu":
        lines.append(f"  device   at most {_size(loader.max_buffers * loader.slot_bytes)} of device slots "
                     "besides the page-locked host slots")
    return lines


def _host_slot_bytes(loader: Loader) -> int:
    """Most bytes of batch slots in host memory: every slot the pool may grow to on the CPU, the page-locked ring
    of a GPU loader (its device slots are on the GPU)."""
    return (loader.max_buffers if loader.device == "cpu" else loader.buffers) * loader.slot_bytes


def _loaders(config: Config, cache_dir, demo_shape) -> Tuple[Dict[str, Loader], list]:
    """The training loader (and the validation one, if there is a validation set), and the warnings building them
    raised; nothing is left open if one fails."""
    splits = ["train"] + (["validation"] if config.hold_out else [])
    loaders: Dict[str, Loader] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for split in splits:
                loaders[split] = config.loader(split, cache_dir=cache_dir, demo_shape=demo_shape)
        except BaseException:
            for loader in loaders.values():
                loader.close()  # closes the files the config opened
            raise
    return loaders, caught


def describe(config: Config, *, cache_dir=None, demo_shape=None) -> str:
    """Build every loader of ``config`` without streaming and summarise what it would read.

    Per sample: the volumes (file:dataset, shape, dtype, chunking, resolution, in memory or lazy), where labels
    and mask lie in raw voxels and how much of raw they cover, a label census (the sampler's class counts for a
    balanced sampler, else the background fraction and distinct ids of a subsample of at most
    :data:`CENSUS_VOXELS` voxels), and where windows can lie (for a masked sampler: the share of window positions
    its index accepts). Per loader: batch geometry, fields and components. Then the memory estimate: volumes in
    memory, batch slots, chunk-cache budgets and sampler indexes.

    Raises
    ------
    ConfigError
        Whatever :meth:`Config.loader` raises.
    """
    loaders, caught = _loaders(config, cache_dir, demo_shape)
    lines = [f"config {config.source}"]
    in_memory = slots = caches = indexes = scratch = 0
    try:
        for split, loader in loaders.items():
            for index in range(len(loader.dataset.samples)):
                sample_lines, volumes = _sample_lines(loader, split, index)
                lines += sample_lines
                in_memory += sum(v.nbytes for v in volumes if v.in_memory)
                caches += chunk_cache_bytes(volumes)  # a budget beyond its volume's bytes is never filled
            lines += _loader_lines(loader, split)
            slots += _host_slot_bytes(loader)
            indexes += loader.sampler.index_nbytes
            scratch += loader.threads * loader.scratch_bytes  # counted by the Loader's own check, omitted here
        total = in_memory + slots + caches + indexes + scratch
        lines.append(f"memory: volumes in memory {_size(in_memory)}, batch slots {_size(slots)}, chunk-cache "
                     f"budgets {_size(caches)}, sampler indexes {_size(indexes)}, producers' scratch "
                     f"{_size(scratch)}; total at most {_size(total)}")
        lines += [f"warning: {w.message}" for w in caught]
        lines.append("valid")
        return "\n".join(lines)
    finally:
        for loader in loaders.values():
            loader.close()
