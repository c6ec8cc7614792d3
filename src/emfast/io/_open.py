"""``emfast.open``: one entry point for every format, which it detects from the container."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import h5py

from ._hdf5 import Hdf5Source
from ._n5 import N5Source, is_n5
from ._precomputed import PrecomputedSource, is_precomputed
from ._remote import RemoteStore, is_url
from ._source import VolumeSource, require_kind
from ._volume import Volume
from ._zarr import GROUP_MARKERS, ZarrSource

#: Container suffixes and their formats; a path may go on past the container into the dataset inside it.
SUFFIXES = {".zarr": "zarr", ".n5": "n5", ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5"}
FORMATS = ("hdf5", "zarr", "n5", "precomputed")


def split_path(path: Union[str, os.PathLike], dataset: Optional[str] = None) -> Tuple[Path, str, Optional[str]]:
    """(container, dataset inside it, format or None) of ``path``, which may name the dataset after the container
    (``sample.zarr/volumes/raw``), with ``dataset`` appended."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        kind = SUFFIXES.get(Path(part).suffix.lower())
        if kind is not None:
            container, inner = Path(*parts[:i + 1]), "/".join(parts[i + 1:])
            break
    else:
        container, inner, kind = Path(path), "", None
    dataset = "/".join(p.strip("/") for p in (inner, dataset or "") if p.strip("/"))
    return container, dataset, kind


def split_url(url: str, dataset: Optional[str] = None) -> Tuple[str, str, Optional[str]]:
    """:func:`split_path` for a remote store's URL (``s3://bucket/sample.zarr/volumes/raw``)."""
    scheme, rest = url.split("://", 1)
    parts = rest.rstrip("/").split("/")
    for i, part in enumerate(parts[1:], start=1):  # parts[0] is the bucket or host
        kind = SUFFIXES.get(Path(part).suffix.lower())
        if kind is not None:
            container, inner = "/".join(parts[:i + 1]), "/".join(parts[i + 1:])
            break
    else:
        container, inner, kind = "/".join(parts), "", None
    dataset = "/".join(p.strip("/") for p in (inner, dataset or "") if p.strip("/"))
    return f"{scheme}://{container}", dataset, kind


def detect_remote(store: RemoteStore, dataset: str) -> str:
    """The format of a remote store without a telling suffix, from the metadata files it holds."""
    attributes = store.get("attributes.json")
    if attributes is not None and b'"n5"' in attributes:
        return "n5"
    node = store / dataset
    if any(node.get(marker) is not None for marker in GROUP_MARKERS + (".zarray",)):
        return "zarr"
    if store.get("info") is not None:
        return "precomputed"
    raise ValueError(f"{store}: cannot tell its format (no zarr.json/.zarray/.zgroup, N5 attributes.json or "
                     f"precomputed info there, or the server refuses them); name the container with a suffix "
                     f"{sorted(SUFFIXES)} or pass format=")


def detect(container: Path) -> str:
    """The format of a container without a telling suffix, from what it holds."""
    if container.exists() and not container.is_dir():
        require_kind(container, "file", "a volume's file")  # a FIFO or device: refused before anything opens it
    if container.is_file():
        if h5py.is_hdf5(str(container)):
            return "hdf5"
        raise ValueError(f"{container} is neither an HDF5 file nor a zarr, N5 or precomputed directory")
    if not container.exists():
        raise FileNotFoundError(f"no such file or store: {container}")
    if is_n5(container):
        return "n5"
    if any((container / marker).is_file() for marker in GROUP_MARKERS + (".zarray",)):
        return "zarr"
    if is_precomputed(container):
        return "precomputed"
    raise ValueError(f"{container}: cannot tell its format (no zarr.json/.zarray/.zgroup, N5 attributes.json or "
                     f"precomputed info); name the container with a suffix {sorted(SUFFIXES)} or pass format=")


def open_source(path: Union[str, os.PathLike], dataset: Optional[str] = None, *, format: Optional[str] = None,
                level: Optional[int] = None, resolution: Optional[Sequence[float]] = None,
                storage_options: Optional[dict] = None) -> VolumeSource:
    """The :class:`~emfast.io._source.VolumeSource` for ``path`` and ``dataset`` (see :func:`open_volume`)."""
    if is_url(path):
        return _open_remote(path, dataset, format, level, resolution, storage_options)
    if storage_options is not None:
        raise ValueError(f"{path}: storage_options apply to remote stores (s3://, gs://, http(s)://), not to a "
                         "local path")
    container, inner, kind = split_path(path, dataset)
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        kind = format
    if kind is None:
        kind = detect(container)
    if kind not in ("zarr", "precomputed") and (level is not None or resolution is not None):
        raise ValueError(f"{container}: level and resolution choose a level of a multiscale image (OME-Zarr or "
                         f"precomputed), not of {kind}")
    if kind == "hdf5":
        if not inner:
            raise ValueError(f"{container}: name the dataset, e.g. {container}/volumes/raw")
        return Hdf5Source(container, inner)
    if kind == "zarr":
        return ZarrSource(container, inner, level=level, resolution=resolution)
    if kind == "n5":
        return N5Source(container, inner)
    return PrecomputedSource(container, scale=level, resolution=resolution)


def _open_remote(url: str, dataset, format, level, resolution, storage_options) -> VolumeSource:
    container, inner, kind = split_url(url, dataset)
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        kind = format
    store = RemoteStore(container, storage_options)
    if kind is None:
        kind = detect_remote(store, inner)
    if kind not in ("zarr", "precomputed") and (level is not None or resolution is not None):
        raise ValueError(f"{container}: level and resolution choose a level of a multiscale image (OME-Zarr or "
                         f"precomputed), not of {kind}")
    if kind == "hdf5":
        raise ValueError(f"{container}: HDF5 is not read remotely; copy the file, or convert it to zarr "
                         "(emfast convert)")
    if kind == "zarr":
        return ZarrSource(store, inner, level=level, resolution=resolution)
    if kind == "n5":
        return N5Source(store, inner)
    return PrecomputedSource(store, scale=level, resolution=resolution)


def open_volume(path: Union[str, os.PathLike], dataset: Optional[str] = None, *, in_memory: bool = True,
                cache_bytes: Optional[int] = None, format: Optional[str] = None, level: Optional[int] = None,
                resolution: Optional[Sequence[float]] = None, storage_options: Optional[dict] = None) -> Volume:
    """Open a volume from HDF5, zarr (v2, v3, sharded), OME-Zarr, N5 or neuroglancer precomputed, read-only.

    The format comes from the container's suffix (``.zarr``, ``.n5``, ``.h5``/``.hdf5``/``.hdf``) or, without
    one, from what the path holds (an HDF5 file; ``zarr.json``/``.zarray``/``.zgroup``; an N5 ``attributes.json``;
    a precomputed ``info``). The dataset may follow the container in ``path``:
    ``open("sample.zarr/volumes/raw")`` and ``open("sample.zarr", "volumes/raw")`` are the same.

    Remote stores are named by URL: ``s3://bucket/sample.zarr/raw``, ``gs://...``, ``https://host/sample.n5/raw``
    (zarr, OME-Zarr, N5 and precomputed; not HDF5), read through fsspec (``emfast[remote]``) with retries on
    transient failures; see :mod:`emfast.io._remote` for credentials and options.

    Parameters
    ----------
    path : str or path-like
        The file or store, optionally followed by the dataset inside it.
    dataset : str, optional
        The dataset (array) inside the container, or an OME-Zarr image group.
    in_memory : bool
        Read the whole volume into memory (fastest), or lazily through a bounded cache of the store's chunks.
    cache_bytes : int, optional
        Lazy volumes only: the chunk cache's budget (see :func:`emfast.hdf5`).
    format : {"hdf5", "zarr", "n5", "precomputed"}, optional
        Skip detection.
    level, resolution : optional
        For an OME-Zarr multiscale image or a precomputed volume: the level (scale) by index, or by its (z, y, x)
        voxel size. Default: level 0, the finest.
    storage_options : dict, optional
        Remote stores only: fsspec's options for the protocol (S3: ``endpoint_url``, ``anon``, ``key``,
        ``secret``, ``client_kwargs``; HTTP: ``headers``...), plus ``retries`` (attempts after the first on a
        transient failure, default 5) and ``timeout`` (seconds per request, default 30). S3 credentials otherwise
        come from the ``AWS_*`` environment variables and ``~/.aws``; ``AWS_ENDPOINT_URL`` names an
        S3-compatible server.

    Returns
    -------
    Volume
        In (z, y, x) order, with ``resolution`` and ``offset`` in nanometres from the metadata (see
        :mod:`emfast.io._geometry`): gunpowder/funlib ``resolution``/``voxel_size``, ``offset``, ``axis_names`` and
        ``units`` (reversed in N5), zarr v3 ``dimension_names``, N5 ``pixelResolution`` and tensorstore's
        ``units``, OME-NGFF axes units and ``coordinateTransformations``, precomputed scales. An array stored
        (x, y, z) is read as (z, y, x); units convert to nm; a missing offset is 0. Samples align raw, labels and
        masks with them, as for HDF5.

    Raises
    ------
    FileNotFoundError
        No such file or store, or a source file of an HDF5 virtual dataset is missing.
    IsADirectoryError, NotADirectoryError, OSError
        A directory where a file belongs or the reverse; a FIFO, device or socket (refused, never opened).
    DatasetNotFoundError
        No such dataset; the message lists those there are.
    StoreMetadataError
        Malformed, contradictory (``resolution`` vs ``voxel_size``, an OME scale vs the level's ``voxel_size``) or
        unmappable metadata (an unknown unit, axes that are not t, c, z, y, x; HDF5 and N5 axes in another order),
        or a chunk only in a form emfast cannot decode (a ValueError): the message names the store, the array, the
        key and the values.
    CorruptChunkError
        A chunk (block) that cannot be decoded or decodes to another size than the metadata promise (an
        OSError); lazy volumes raise it when the chunk is read.
    VolumeTooLargeError
        ``in_memory=True`` for a volume larger than the memory available (a ValueError and a MemoryError).
    RemoteReadError
        A remote store's metadata or chunk cannot be read: access denied, or a failure still there after the
        retries (an OSError naming the URL and the key); lazy volumes raise it when the chunk is read.
    ImportError
        zarr (``emfast[zarr]``), tensorstore (``emfast[tensorstore]``) or fsspec (``emfast[remote]``) is needed
        and missing.
    TypeError, ValueError
        An unsupported dtype or shape, bad arguments.
    """
    source = open_source(path, dataset, format=format, level=level, resolution=resolution,
                         storage_options=storage_options)
    return Volume.open(source, in_memory=in_memory, cache_bytes=cache_bytes)
