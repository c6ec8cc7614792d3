"""The built-in volume formats' registry entries (:class:`~emfast.io._formats.VolumeFormat`): HDF5, zarr with
OME-Zarr, N5 and neuroglancer precomputed; each says how it is detected, opened and listed by ``emfast info``."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Set

import h5py

from .._registry import register
from ._formats import Contents, Listed, VolumeFormat
from ._hdf5 import Hdf5Source, dataset_summary, list_datasets, open_hdf5
from ._n5 import N5Source, is_n5, list_n5_datasets
from ._precomputed import PrecomputedSource, is_precomputed
from ._remote import RemoteStore
from ._source import DatasetNotFoundError, StoreMetadataError, read_regular_file, unlistable
from ._volume import UnsupportedDtypeError, Volume
from ._zarr import (GROUP_MARKERS, ZarrSource, arrays_on_disk, check_metadata_json, import_zarr, local_store,
                    refuse_special_metadata, refused_metadata)


def not_found(container, inner: str, members: Callable[[str], Optional[List[str]]]) -> DatasetNotFoundError:
    """The error for ``container/inner`` where ``inner`` does not exist: it names the deepest group on the way
    that does, and what that group holds (``members(group)``: None where ``group`` is no group)."""
    parts = [p for p in inner.split("/") if p]
    for depth in range(len(parts) - 1, -1, -1):
        parent = "/".join(parts[:depth])
        found = members(parent)
        if found is not None:
            where = f"{parent!r}" if parent else "the root"
            return DatasetNotFoundError(f"{container} has no dataset or group {inner!r}; {where} holds: "
                                        f"{', '.join(found) or 'nothing'}")
    return DatasetNotFoundError(f"{container} has no dataset or group {inner!r}")


def _volumes(fmt, container: Path, names: List[str], named: Optional[str] = None) -> Iterator[Listed]:
    """Each array of ``names`` opened lazily as a volume, described by its source; one that is no volume (metadata
    emfast refuses, an empty shape, a dtype volumes do not hold) is listed with the reason, as the HDF5 listing
    does (it ended the listing of a group, the arrays after it never shown), unless it is the array ``named``
    itself (the path given names it) whose metadata is refused: that is an error."""
    for name in names:
        try:
            source = fmt.open(container, name, None, None)
        except StoreMetadataError as error:
            if name == named:
                raise
            yield Listed(name, f"not read as a volume: {error}", {}, None)
            continue
        summary, attributes = source.describe(), source.attributes()
        try:
            volume = Volume.open(source, in_memory=False)  # closes the source if it fails
        except (UnsupportedDtypeError, ValueError) as error:  # empty, or complex, strings...
            yield Listed(name, f"{summary} (not read as a volume: {error})", attributes, None)
            continue
        yield Listed(name, summary, attributes, volume)


@register("format")
class Hdf5Format(VolumeFormat):
    name = "hdf5"
    suffixes = (".h5", ".hdf5", ".hdf")
    rank = 0

    @classmethod
    def detect(cls, container: Path) -> bool:
        return container.is_file() and h5py.is_hdf5(str(container))

    @classmethod
    def open(cls, where, dataset, level, resolution):
        if isinstance(where, RemoteStore):
            raise ValueError(f"{where}: HDF5 is not read remotely; copy the file, or convert it to zarr "
                             "(emfast convert)")
        if not dataset:
            if not Path(where).exists():  # say what is wrong first: a dataset in no file would not help
                raise FileNotFoundError(f"HDF5 file not found: {where}")
            raise ValueError(f"{where}: name the dataset, e.g. {where}/volumes/raw")
        return Hdf5Source(where, dataset)

    @classmethod
    def contents(cls, container: Path, inner: str) -> Contents:
        file = open_hdf5(container)
        try:
            top = file.get(inner) if inner else file
            if top is None:
                raise not_found(container, inner, lambda group: _hdf5_members(file, group))
            names = [inner] if isinstance(top, h5py.Dataset) else \
                [f"{inner}/{name}" if inner else name for name in list_datasets(top)]
            attributes = dict(top.attrs if isinstance(top, h5py.Group) else file.attrs)
        except BaseException:
            file.close()
            raise
        return Contents(attributes, _hdf5_datasets(file, container, names, inner), "(no datasets)")


def _hdf5_datasets(file: h5py.File, container: Path, names: List[str], named: str) -> Iterator[Listed]:
    """Every dataset of ``names``, a volume where emfast reads it as one (3-D/4-D of a supported dtype), else with
    the reason where it is 3-D/4-D (a table's rank goes unsaid); the dataset ``named`` by the path, if it has
    malformed geometry, is an error, as in the other formats."""
    with file:
        for name in names:
            node = file[name]
            summary, stored = dataset_summary(node), None
            try:
                source = Hdf5Source(container, name)
                stored = source.stored_axes
                volume = Volume.open(source, in_memory=False)
            except (TypeError, ValueError) as error:  # malformed geometry, a dtype volumes do not hold, a table
                if name == named and isinstance(error, StoreMetadataError):
                    raise
                volume = None
                if node.ndim in (3, 4):
                    summary += f" (not read as a volume: {error})"
            if volume is not None and stored is not None:  # axes stored in another order: read transposed
                read = ((volume.channels,) if node.ndim == 4 else ()) + tuple(volume.shape)
                summary += (f" (axes stored ({', '.join(stored)}), read as ({'c, ' if node.ndim == 4 else ''}z, y, "
                            f"x) {read})")
            yield Listed(name, summary, dict(node.attrs), volume)


def _hdf5_members(file: h5py.File, group: str):
    node = file.get(group) if group else file
    return sorted(node.keys()) if isinstance(node, h5py.Group) else None


@register("format")
class N5Format(VolumeFormat):
    name = "n5"
    suffixes = (".n5",)
    rank = 10

    @classmethod
    def detect(cls, container: Path) -> bool:
        return is_n5(container)

    @classmethod
    def detect_remote(cls, store: RemoteStore, dataset: str) -> bool:
        attributes = store.get("attributes.json")
        return attributes is not None and b'"n5"' in attributes

    @classmethod
    def open(cls, where, dataset, level, resolution):
        return N5Source(where, dataset)

    @classmethod
    def contents(cls, container: Path, inner: str) -> Contents:
        if not container.is_dir():  # a path named .n5 that is not there listed "(no arrays)", with status 0
            if container.exists():
                raise NotADirectoryError(errno.ENOTDIR, f"{container} is a file, not an N5 container (a folder)")
            raise FileNotFoundError(errno.ENOENT, f"cannot list {container}: no N5 container there")
        if inner and not _holds_n5(container / inner):
            raise not_found(container, inner, lambda group: _n5_members(container, group))
        names = [f"{inner}/{name}".strip("/.") if name != "." else inner
                 for name in list_n5_datasets(container / inner)]
        return Contents({}, _volumes(cls, container, names, inner))


def _n5_members(container: Path, group: str):
    directory = container / group
    if not directory.is_dir() or "dimensions" in _n5_attributes(directory):
        return None
    return sorted(d.name for d in directory.iterdir() if _holds_n5(d))


def _holds_n5(directory: Path) -> bool:
    """Whether ``directory`` is an N5 group or dataset: it, or a folder below it, holds an attributes.json
    (z5py and n5-java write none for a group without attributes). Stops at the first one found."""
    if not directory.is_dir():
        return False
    if (directory / "attributes.json").is_file():  # found without listing the folder
        return True
    return any("attributes.json" in files for _, _, files in os.walk(directory, onerror=unlistable()))



def _n5_attributes(directory: Path) -> dict:
    try:
        return json.loads(read_regular_file(directory / "attributes.json", "attributes.json") or b"{}")
    except (OSError, ValueError):
        return {}


@register("format")
class ZarrFormat(VolumeFormat):
    name = "zarr"
    suffixes = (".zarr",)
    rank = 20
    multiscale = True

    @classmethod
    def detect(cls, container: Path) -> bool:
        return any((container / marker).is_file() for marker in GROUP_MARKERS + (".zarray",))

    @classmethod
    def detect_remote(cls, store: RemoteStore, dataset: str) -> bool:
        node = store / dataset
        return any(node.get(marker) is not None for marker in GROUP_MARKERS + (".zarray",))

    @classmethod
    def open(cls, where, dataset, level, resolution):
        return ZarrSource(where, dataset, level=level, resolution=resolution)

    @classmethod
    def contents(cls, container: Path, inner: str) -> Contents:
        return Contents({}, _volumes(cls, container, _zarr_arrays(container, inner), inner))


def _zarr_arrays(container: Path, inner: str) -> List[str]:
    """The array named, an OME-Zarr image group named, or every array below the named group."""
    zarr = import_zarr()
    refuse_special_metadata(container, inner)
    names = arrays_on_disk(container, inner) if (container / inner).is_dir() else []
    if not any((container / m).is_file() for m in GROUP_MARKERS):  # no root group: tensorstore's, funlib's
        if names:
            return [f"{inner}/{name}".strip("/.") if name != "." else inner for name in names]
        # zarr-python would say "No group found ... at path ''", naming the store's root, not the path given
        found = arrays_on_disk(container)
        raise DatasetNotFoundError(f"{container} has no array {inner!r}; its arrays: {', '.join(found) or 'none'}"
                                   if inner else f"{container} holds no zarr array or group")
    check_metadata_json(container / inner, f"{container}:{inner}" if inner else str(container))  # zarr-python's
    root = zarr.open(store=local_store(container), mode="r")  # bare JSONDecodeError named no file
    try:
        node = root[inner] if inner else root
    except KeyError:
        raise not_found(container, inner, lambda group: _zarr_members(root, group)) from None
    except (ValueError, TypeError) as error:  # metadata zarr-python refuses in words that name no file
        raise refused_metadata(f"{container}:{inner}" if inner else str(container), container / inner,
                               error) from None
    if isinstance(node, zarr.Array):
        return [inner]
    return _images_for_levels(root, inner, names)


def _images_for_levels(root, inner: str, names: List[str]) -> List[str]:
    """``names`` (arrays below ``inner``) with the levels of each OME-Zarr image replaced by the image's group,
    listed once, where its first level was; arrays beside an image (another array a later write put in its group,
    OME-NGFF's ``labels`` images inside it) stay listed."""
    levels: Dict[str, Set[str]] = {}

    def levels_of(group: str) -> Set[str]:
        if group not in levels:
            try:
                attributes = (root[group] if group else root).attrs
            except (KeyError, ValueError, TypeError):  # a folder with no group metadata (arrays written below it
                levels[group] = set()  # alone), or metadata zarr-python cannot read (listed as such): no image
                return levels[group]
            multiscales = attributes.get("ome", attributes).get("multiscales") or []
            levels[group] = {d.get("path") for m in multiscales if isinstance(m, dict)
                             for d in m.get("datasets") or [] if isinstance(d, dict)}
        return levels[group]

    def joined(*parts: str) -> str:
        return "/".join(p for p in parts if p and p != ".")

    listed: List[str] = []
    for name in names:
        parts = [] if name == "." else name.split("/")
        shown = joined(inner, name)
        for depth in range(len(parts)):
            if "/".join(parts[depth:]) in levels_of(joined(inner, *parts[:depth])):
                shown = joined(inner, *parts[:depth])
                break
        if shown not in listed:
            listed.append(shown)
    return listed


def _zarr_members(root, group: str):
    zarr = import_zarr()
    try:
        node = root[group] if group else root
    except KeyError:
        return None
    return sorted(name for name, _ in node.members()) if isinstance(node, zarr.Group) else None


@register("format")
class PrecomputedFormat(VolumeFormat):
    name = "precomputed"
    rank = 30
    multiscale = True

    @classmethod
    def detect(cls, container: Path) -> bool:
        return is_precomputed(container)

    @classmethod
    def detect_remote(cls, store: RemoteStore, dataset: str) -> bool:
        return store.get("info") is not None

    @classmethod
    def open(cls, where, dataset, level, resolution):
        return PrecomputedSource(where, level=level, resolution=resolution)

    @classmethod
    def contents(cls, container: Path, inner: str) -> Contents:
        return Contents({}, _volumes(cls, container, [""], ""))
