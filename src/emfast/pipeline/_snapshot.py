"""Snapshots: what the network is fed, written where viewers can look at it.

:func:`write_snapshot` takes the next batches of a loader and writes every field of every example (raw, labels,
each target and mask) to a zarr store laid out for viewers::

    snapshot.zarr/batch_0000/example_00/raw/s0
                                       /labels/s0
                                       /affinities/s0 ...

Each field group is an OME-NGFF image of one level (0.4, zarr v2, which neuroglancer, napari and ome-zarr-py all
read) whose translation is the world position (nm) of that field's window in its sample: raw and extra channels
include the network's context, labels the targets' margin, so the layers of one example overlay voxel for voxel on
each other and on the source (a field delivered at its own voxel size, ``own_resolution``, covers the world box of
its window on raw's grid, at that voxel size, and its translation, the centre of its first voxel, moves as a
pyramid level's does: see :mod:`emfast.io._pyramid`). The arrays also carry the funlib/gunpowder attributes
(``voxel_size``, ``offset``, ``axis_names``). An example whose window was mirrored, transposed or warped is shown
as the network sees it, at its window's box (a transposed window whose output extents differ, centred on it). A
single channel is written as a (z, y, x) array, several as (c, z, y, x).

:func:`montage` renders the central z-section of every field of every example of one batch into one PNG: raw in
grey, labels as one colour per id (0 black), three or more float channels (affinities, LSDs) as RGB, one float or
uint8 channel in grey.
"""
from __future__ import annotations

import errno
import os
import shutil
import struct
import zlib
from pathlib import Path
from typing import Dict, List

import numpy as np

from ..io import add_ome_multiscales, format_of_suffix, import_zarr, level_geometry, settling_store, zarr_geometry
from ._windows import window_extents

#: The level written in each field group (the OME-NGFF image's one dataset).
LEVEL = "s0"
#: Pixels between the cells of a montage.
GAP = 4


def write_snapshot(loader, path, batches: int = 1, png=None) -> Path:
    """Write the loader's next ``batches`` batches to the zarr store ``path`` (see the module docstring).

    The batches are taken from the loader's stream, as a training loop would take them; the loader delivers to the
    CPU. ``path`` must not exist: a snapshot never replaces anything. With ``png``, the first batch's montage is
    also written there.
    """
    if isinstance(batches, bool) or not isinstance(batches, (int, np.integer)) or batches < 1:
        raise ValueError(f"snapshot: batches must be an integer >= 1, got {batches!r}")
    if loader.device != "cpu":
        raise ValueError(f"snapshot: the loader delivers batches to {loader.device}; snapshots are written from a "
                         "loader with device='cpu' (build one with the same arguments)")
    path = Path(os.fspath(path)).expanduser()  # as every other path emfast takes (a review found a folder '~')
    named = format_of_suffix(path.name)
    if named not in (None, "zarr"):  # written as zarr anyway, the store was taken for an HDF5 file by every reader
        raise ValueError(f"snapshot: {path} ends as {named} containers do ({path.suffix}), but a snapshot is a "
                         "zarr store; give a path ending in .zarr")
    png = None if png is None else Path(os.fspath(png)).expanduser()
    for target in (path, png):
        if target is not None and (target.exists() or target.is_symlink()):  # a dangling link too
            raise FileExistsError(f"snapshot: {target} exists; a snapshot never replaces a file or store, choose "
                                  "another path")
    if png is not None and not png.absolute().parent.is_dir():  # checked before the store is written
        raise FileNotFoundError(f"snapshot: the folder of png={str(png)!r} does not exist")
    zarr = import_zarr("writing")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # the folder claimed at once: two processes writing one path mixed their batches into one store
        path.mkdir()
    except FileExistsError:
        raise FileExistsError(f"snapshot: {path} exists; a snapshot never replaces a file or store, choose another "
                              "path") from None
    store = settling_store(path)
    try:
        root = zarr.open_group(store, mode="w-", zarr_format=2)
        root.attrs.update(emfast_snapshot={"batches": int(batches), "patch_out": list(loader.patch_out)})
        first = None
        for k in range(int(batches)):
            batch = loader.next_batch()
            arrays = {name: np.array(batch[name]) for name in batch}
            _write_batch(root, f"batch_{k:04d}", loader, batch, arrays)
            if first is None:
                first = arrays
            batch.release()
        if png is not None:
            write_png(png, montage(first))
    except OSError as error:
        _remove(store, path)
        if png is not None and error.filename == str(png):
            raise
        raise OSError(error.errno, f"snapshot: cannot write {path}: {error.strerror or error}", str(path)) \
            from error  # zarr's own errors of a full disk name no file
    except BaseException:
        _remove(store, path)
        raise
    return path


def _remove(store, path: Path) -> None:
    """Remove the snapshot ``path`` this call made (half a snapshot is none), once the writes of ``store`` still
    in flight have ended (zarr's other writes of a failed one run on); removed even if that wait is interrupted."""
    try:
        store.settle()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write_batch(root, name: str, loader, batch, arrays: Dict[str, np.ndarray]) -> None:
    patch_out = np.asarray(loader.patch_out, dtype=np.int64)
    for n in range(batch.valid):
        sample = loader.dataset.samples[int(batch.volumes[n])]
        resolution = np.asarray(sample.raw.resolution or (1.0, 1.0, 1.0), dtype=np.float64)
        origin = np.asarray(sample.raw.offset or (0.0, 0.0, 0.0), dtype=np.float64)
        group = f"{name}/example_{n:02d}"
        root.require_group(group).attrs.update(
            sample=batch.names[n], corner=[int(c) for c in batch.positions[n]],
            perm=[int(p) for p in batch.perms[n]], flips=[bool(f) for f in batch.flips[n]])
        for field, array in arrays.items():
            data = array[n]
            ratio = _own_ratio(sample, field)
            # the window's extent in raw voxels: a field at its own voxel size covers the box its window on raw's
            # grid would (transposes swap only axes of equal ratio, so the ratio needs no permuting)
            extent = np.asarray(data.shape[1:], dtype=np.int64) * ratio
            grow = (extent.astype(np.int64) - patch_out) // 2  # context or margin, per side, along output axes
            # the data lies along the output axes: its output window is centred on the window's box in the source
            # (the box itself where a transpose swapped axes of equal extent), its context around it
            window = window_extents(patch_out, batch.perms[n:n + 1])[0]
            corner = batch.positions[n] + (window - patch_out) // 2 - grow
            offset = origin + corner * resolution
            data = data[0] if data.shape[0] == 1 else data
            dataset = f"{group}/{field}/{LEVEL}"
            attributes, names = zarr_geometry(data.ndim, resolution * ratio, offset, 2)
            stored = root.create_array(dataset, shape=data.shape, dtype=data.dtype, chunks=data.shape,
                                       dimension_names=names)
            stored[...] = data
            stored.attrs.update(attributes)
            # OME-NGFF places voxel centres: a field at its own voxel size starts where raw's grid would, so its
            # first voxel's centre moves as a pyramid level's does
            _, translation = level_geometry(resolution.tolist(), offset.tolist(), ratio)
            add_ome_multiscales(root, dataset, data.ndim, resolution * ratio, translation)


def _own_ratio(sample, field: str) -> np.ndarray:
    """Per axis, the voxel size of ``field`` over raw's: 1 but for a field the sample delivers at its own voxel
    size (``own_resolution``)."""
    placed = sample.placed(field) if field in sample.own_resolution else None
    if placed is None or placed.grid is None:
        return np.ones(3)
    return np.asarray([float(r) for r in placed.grid.ratio()])


# -- the montage --------------------------------------------------------------------------------------------------

def _label_colours(ids: np.ndarray) -> np.ndarray:
    """One RGB colour per id, from a 64-bit mix of its bits (splitmix64's finaliser); id 0 is black."""
    x = ids.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    rgb = np.stack([(x >> np.uint64(s)) & np.uint64(0xFF) for s in (0, 8, 16)], axis=-1).astype(np.uint8)
    rgb |= np.uint8(0x40)  # never near black, which is background's
    rgb[ids == 0] = 0
    return rgb


def _grey(section: np.ndarray) -> np.ndarray:
    """Grey levels from the section's own range; masks (integers 0 and 1) on a fixed one: 1 white, 0 black."""
    mask = section.dtype.kind in "bu" and section.max() <= 1
    section = section.astype(np.float64)
    low, high = (0.0, 1.0) if mask else (np.nanmin(section), np.nanmax(section))
    scaled = (section - low) / (high - low) if high > low else np.zeros_like(section)
    return np.repeat((np.nan_to_num(scaled) * 255).round().astype(np.uint8)[..., None], 3, axis=-1)


def render(data: np.ndarray) -> np.ndarray:
    """The (y, x, 3) uint8 picture of the central z-section of one example's field ``data`` (c, z, y, x)."""
    section = data[:, data.shape[1] // 2]
    if data.dtype.kind in "iu" and data.dtype.itemsize >= 4:  # label ids
        return _label_colours(section[0])
    if data.dtype.kind == "f" and section.shape[0] >= 3:  # affinities, LSDs: the first three channels
        return (np.clip(np.nan_to_num(section[:3].astype(np.float64)), 0, 1) * 255).round().astype(
            np.uint8).transpose(1, 2, 0)
    return _grey(section[0])


def montage(arrays: Dict[str, np.ndarray]) -> np.ndarray:
    """One batch's fields as an (H, W, 3) uint8 image: a row per example, a column per field, each cell the
    central z-section of that field, top-left aligned in cells of the largest section, ``GAP`` pixels apart."""
    fields = list(arrays)
    count = len(next(iter(arrays.values())))
    cells: List[List[np.ndarray]] = [[render(arrays[f][n]) for f in fields] for n in range(count)]
    height = max(c.shape[0] for row in cells for c in row)
    width = max(c.shape[1] for row in cells for c in row)
    image = np.full((count * (height + GAP) - GAP, len(fields) * (width + GAP) - GAP, 3), 32, np.uint8)
    for n, row in enumerate(cells):
        for j, cell in enumerate(row):
            y, x = n * (height + GAP), j * (width + GAP)
            image[y:y + cell.shape[0], x:x + cell.shape[1]] = cell
    return image


def write_png(path, image: np.ndarray) -> None:
    """Write an (H, W, 3) uint8 image as an 8-bit RGB PNG (no filter, zlib-compressed)."""
    height, width, _ = image.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
            + chunk(b"IEND", b""))
    target, created = Path(os.fspath(path)), False
    try:
        with open(target, "xb") as file:  # never over a file another process made meanwhile
            created = True
            file.write(data)
    except FileExistsError:  # made meanwhile by another process
        raise FileExistsError(errno.EEXIST, f"snapshot: {target} exists; a snapshot never replaces a file or store, "
                              "choose another path", str(target)) from None
    except OSError as error:  # a full disk: a PNG cut short would block every retry, named by nothing
        if created:
            target.unlink(missing_ok=True)
        raise OSError(error.errno, f"snapshot: cannot write png={str(target)!r}: {error.strerror or error}",
                      str(target)) from error

