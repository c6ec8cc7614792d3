"""``emfast.open``: one entry point for every registered format (:mod:`emfast.io._formats`), which it detects from
the path, the URL or what the container holds."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

from . import _format_entries  # noqa: F401  (registers the built-in formats)
from ._formats import (Contents, Listed, UnknownFormatError, detect, detect_remote, format_named, format_of_suffix,
                       formats)
from ._outputs import warn_if_unfinished
from ._remote import RemoteStore, is_url
from ._source import DatasetNotFoundError, LevelChoiceError, VolumeSource, local_path, refuse_unread_scheme
from ._volume import Volume


def split_path(path: Union[str, os.PathLike], dataset: Optional[str] = None) -> Tuple[Path, str, Optional[str]]:
    """(container, dataset inside it, format or None) of ``path``, which may name the dataset after the container
    (``sample.zarr/volumes/raw``, or after a file without a known suffix), with ``dataset`` appended. ``~`` is the
    home folder and a ``file://`` URL its local path, as configs, shells, cloud-volume and tensorstore read them."""
    path = local_path(path, dataset)
    parts = path.parts
    for i, part in enumerate(parts):
        kind = format_of_suffix(part)
        if kind is not None:
            container, inner = Path(*parts[:i + 1]), "/".join(parts[i + 1:])
            break
    else:
        container, inner, kind = path, "", None
        if not path.exists():  # a file followed by the dataset inside it
            for i in range(len(parts) - 1, 0, -1):
                if Path(*parts[:i]).is_file():
                    container, inner = Path(*parts[:i]), "/".join(parts[i:])
                    break
    return container, _dataset_of(path, inner, dataset), kind


def _dataset_of(path, inner: str, dataset: Optional[str]) -> str:
    """The dataset ``inner`` (from the path) then ``dataset``, its '.' names dropped (as a path's are); ValueError
    for '..' among them, which the formats take differently (zarr refuses it once the output's container is made,
    HDF5 makes a group named '..'): a dataset is named from its container down."""
    if dataset is not None and not isinstance(dataset, str):
        raise TypeError(f"{path}: dataset must be a string (its path inside the container), got {dataset!r}")
    names = [name for part in (inner, dataset or "") for name in part.split("/") if name not in ("", ".")]
    if ".." in names:
        raise ValueError(f"{path}{'' if dataset is None else f' (dataset {dataset!r})'}: '..' cannot name a dataset "
                         f"inside a container; give the container's own path, then the dataset from its top (e.g. "
                         f"other.zarr/raw)")
    return "/".join(names)


def resolved_above_container(path: Path) -> Path:
    """``path`` with the folders above its container resolved (links followed, '..' applied) and the container's
    name and what follows kept as written: a store reached through a link (``fast.zarr`` to scratch space) keeps
    the suffix that tells its format. Without a known suffix, all of it resolved."""
    parts = path.parts
    for i, part in enumerate(parts):
        if format_of_suffix(part) is not None:
            return Path(*parts[:i]).resolve() / Path(*parts[i:]) if i else path
    return path.resolve()


def split_url(url: str, dataset: Optional[str] = None) -> Tuple[str, str, Optional[str]]:
    """:func:`split_path` for a remote store's URL (``s3://bucket/sample.zarr/volumes/raw``)."""
    scheme, rest = url.split("://", 1)
    if scheme.lower() in ("http", "https") and ("#" in rest or "?" in rest):  # s3 and gs keys may hold both
        raise ValueError(f"{url}: in an http(s) URL, '#' starts a fragment and '?' a query, which name no object "
                         "(glued to every key read, the metadata read as malformed); write them as %23 and %3F "
                         "where they are part of a name (signed URLs are not taken: give headers in "
                         "storage_options)")
    parts = rest.rstrip("/").split("/")
    for i, part in enumerate(parts[1:], start=1):  # parts[0] is the bucket or host
        kind = format_of_suffix(part)
        if kind is not None:
            container, inner = "/".join(parts[:i + 1]), "/".join(parts[i + 1:])
            break
    else:
        container, inner, kind = "/".join(parts), "", None
    return f"{scheme}://{container}", _dataset_of(url, inner, dataset), kind


def open_source(path: Union[str, os.PathLike], dataset: Optional[str] = None, *, format: Optional[str] = None,
                level: Optional[int] = None, resolution: Optional[Sequence[float]] = None,
                storage_options: Optional[dict] = None) -> VolumeSource:
    """The :class:`~emfast.io._source.VolumeSource` for ``path`` and ``dataset`` (see :func:`open_volume`)."""
    remote = is_url(path)
    if not remote:
        _refuse_options_of(path, storage_options)
    container, inner, kind = split_url(path, dataset) if remote else split_path(path, dataset)
    if not remote:  # read lazily after the working folder changed, a relative path found no chunk: all fill value
        container = container.absolute()
    if format is not None:
        kind = format_named(format).name
    where = RemoteStore(container, storage_options) if remote else container
    # remotely, each metadata file requested once: detection, emfast's checks and zarr-python read them over again
    with where.remembering() if remote else contextlib.nullcontext():
        try:
            if kind is None:
                kind = detect_remote(where, inner) if remote else detect(container)
            chosen = format_named(kind)
            if not chosen.multiscale and (level is not None or resolution is not None):
                multiscale = " or ".join(f.name for f in formats() if f.multiscale)
                raise LevelChoiceError(f"{container}: level and resolution choose a level of a multiscale image "
                                       f"({multiscale}), not of {kind}")
            source = chosen.open(where, inner, level, resolution)
        except (FileNotFoundError, DatasetNotFoundError, UnknownFormatError) as error:
            if remote:  # metadata denied rather than missing: credentials, most likely
                where.refuse_denied(error)
            raise
        if remote:
            try:
                where.refuse_denied_attributes(source.attribute_keys())
            except BaseException:
                source.close()
                raise
        return source


def _refuse_options_of(path, storage_options: Optional[dict]) -> None:
    """Refuse ``storage_options`` given with ``path``, which is not a URL."""
    if storage_options is not None:
        refuse_unread_scheme(path)  # named as such, not as a local path
        raise ValueError(f"{path}: storage_options apply to remote stores (s3://, gs://, http(s)://), not to a "
                         "local path")


def contents(path: Union[str, os.PathLike], storage_options: Optional[dict] = None) -> Contents:
    """What ``emfast info`` lists of a local file or store: its attributes and its datasets (or the one that
    ``path`` names inside it), each opened lazily as a volume where emfast reads it as one. A URL names one
    remote volume (object stores are not listed): that volume alone, opened lazily, with ``storage_options`` (see
    :func:`open_volume`; refused for a local path).

    Returns
    -------
    Contents
        ``attributes`` (the container's), ``datasets`` (an iterator of :class:`~emfast.io._formats.Listed`, whose
        volumes the caller closes) and ``nothing`` (the line for no datasets).

    Raises
    ------
    FileNotFoundError, DatasetNotFoundError, ValueError
        No such container, no such dataset or group (the message lists what is there), no known format, or
        ``storage_options`` with a local path.
    """
    if is_url(path):
        source = open_source(str(path), None, storage_options=storage_options)
        listed = Listed("", source.describe(), source.attributes(), Volume.open(source, in_memory=False))
        return Contents({}, iter([listed]))
    _refuse_options_of(path, storage_options)
    container, inner, kind = split_path(path)
    return format_named(kind or detect(container)).contents(container, inner)


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
    format : str, optional
        A registered format's name (built in: "hdf5", "zarr", "n5", "precomputed"; see
        :func:`emfast.io.formats`): skip detection.
    level, resolution : optional
        For an OME-Zarr multiscale image or a precomputed volume (its scales): the level by index, or by its
        (z, y, x) voxel size. Default: level 0, the finest.
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
        ``units`` (reversed in N5), zarr v3 ``dimension_names``, N5 ``pixelResolution``, tensorstore's ``units``,
        ``dimension_units`` (zarr3) and N5 ``axes``, OME-NGFF axes units and ``coordinateTransformations``,
        precomputed scales. An array stored (x, y, z) is read as (z, y, x); units convert to nm; a missing offset is
        0. Samples align raw, labels and masks with them, as for HDF5.

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
    warn_if_unfinished(source, str(path) if dataset is None else f"{path}/{dataset}")
    return Volume.open(source, in_memory=in_memory, cache_bytes=cache_bytes)
