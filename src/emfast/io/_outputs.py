"""What keeps the outputs of ``emfast convert`` and ``emfast.predict`` safe: the rule of where an output may be
written, the rule of what overwriting may remove, the lock of one writer per output, the fingerprint that tells
whether an input changed between a run and its resume, the check of free space, and how messages name options.

Both writers follow the same rules, so they live here once:

* An output is never the input, inside it, or above it (symlinks resolved), and never in the input's HDF5 file.
* Overwriting removes only an array (dataset) that carries an emfast record (or one a killed emfast run was
  creating, while it holds no data), never a group, a link, or anything else.
* One run at a time writes a container: a lock file ``.NAME.emfast-lock`` beside it is held (``fcntl.flock``)
  for the run; the operating system releases it when the process ends, however it ends. It also says which
  dataset a run is creating, so a run killed before the output held its record leaves an output that is still
  known as emfast's.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import uuid
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ._progress import plural
from ._remote import RemoteStamp
from ._source import unlistable

#: Why a store's folder that cannot be listed stops its fingerprint: the chunk files it hides could change unseen
#: (a resume mixing old and new data, statistics of the old data).
_UNLISTED = "; emfast notices changes to a store by listing its chunk files (give the folder read permission)"

#: Attributes naming an array as written by emfast (the records of convert and predict, and predict's flags).
RECORDS = ("emfast_convert", "emfast_predict", "emfast_predict_blocks")
#: Left free beyond a write's own bytes: file-system and HDF5 metadata, compression's worst-case growth.
SPACE_MARGIN = 1 << 20
#: zarr writes every file as ``NAME.<32 hex digits>.partial`` first, then renames it; a killed run leaves these.
PARTIAL_FILE = re.compile(r"\.[0-9a-f]{32}\.partial$")

#: Whether messages are for the command line; process-wide rather than a context variable, because writer
#: threads build messages too.
_command_line = [False]


class OutputLocationError(ValueError):
    """An output would be the input, inside it, or contain it."""


class OutputBusyError(OSError):
    """Another emfast run is writing the output."""


class OutputSpaceError(OSError):
    """The output's file system has too little free space for what remains to be written, or the process's
    file-size limit lets its HDF5 file grow by too little (``errno`` ENOSPC or EFBIG)."""


class NotOwnOutputError(FileExistsError):
    """Overwriting was asked for something emfast did not write."""


class InputChangedError(OSError):
    """The input's files changed while a run read them: its output may mix both versions, and is left
    unfinished."""


def check_input_unchanged(stamp, started: Optional[dict], output: str, again: str) -> None:
    """Raise :class:`InputChangedError` if the input of ``stamp`` no longer has the fingerprint ``started`` (its
    ``data_only`` one) taken when the run that wrote ``output`` from it began (a chunk rewritten in place, a file
    replaced; not its attributes rewritten; a remote input: its array metadata read again): checked before the
    output is recorded complete, as a lazily read input's change is seen only by its metadata while it is read.
    ``again`` says what to do (a resume is refused: the input is another now)."""
    if stamp is None or started is None:
        return
    if isinstance(stamp, RemoteStamp):  # its stamp holds the metadata as opened: read again (one request)
        now = stamp.store.stamp(stamp.dataset, stamp.marker)
        if _remote_fingerprint(now.marker, now.size, now.digest) != started:
            raise InputChangedError(f"{stamp.path}/{stamp.dataset} changed while {output} was written from it (its "
                                    f"array metadata {stamp.marker} differs from when the run began): the output "
                                    f"may mix both versions and is left unfinished; {again}")
        return
    try:
        now = fingerprint(stamp, data_only=True)
    except FileNotFoundError as error:  # the input, or a file of it, deleted or moved meanwhile
        raise InputChangedError(f"{stamp.path}/{stamp.dataset} changed while {output} was written from it "
                                f"({error.filename or stamp.path} no longer exists): the output may mix both "
                                f"versions and is left unfinished; {again}") from None
    if now != started:
        raise InputChangedError(f"{stamp.path}/{stamp.dataset} changed while {output} was written from it (the "
                                "sizes or modification times of its files differ from when the run began): the "
                                f"output may mix both versions and is left unfinished; {again}")


class UnfinishedOutputWarning(UserWarning):
    """A volume opened is an output emfast has not finished writing: what was not written reads as the fill
    value."""


#: The record each command leaves on its output, and how to finish an output it left unfinished.
FINISHED_BY = {"emfast_convert": "run the same emfast convert again (it resumes)",
               "emfast_predict": "run the same prediction again with resume=True (emfast predict CONFIG --resume)"}


def unfinished(attributes: dict) -> Optional[str]:
    """How to finish the array whose attributes are ``attributes``, where its emfast record says it is not
    complete (a run stopped or killed); None for a complete output and for any other array."""
    for key, finish in FINISHED_BY.items():
        record = attributes.get(key)
        if isinstance(record, (str, bytes)):  # HDF5 attributes hold the record as JSON text
            try:
                record = json.loads(record)
            except ValueError:
                continue
        if isinstance(record, dict) and record.get("complete") is False:
            return finish
    return None


def warn_if_unfinished(source, name: str) -> None:
    """Warn (:class:`UnfinishedOutputWarning`) that the volume ``name`` being opened from ``source`` is an output
    emfast has not finished writing (a run stopped or killed, or one still running); ``source`` is closed if that
    raises (warnings as errors)."""
    try:
        finish = unfinished(source.attributes())
        if finish is not None:
            warnings.warn(UnfinishedOutputWarning(
                f"{name} is an emfast output not finished writing (its record says complete: false): what was not "
                f"written reads as the fill value; to finish it, {finish}"), stacklevel=3)
    except BaseException:
        source.close()
        raise


def refuse_if_unfinished(source, name: str, consequence: str, error: type) -> None:
    """Raise ``error`` (``source`` closed first) if the volume ``name`` opened from ``source`` is an output emfast
    has not finished writing, as :func:`warn_if_unfinished` warns: for a command that would make of it what looks
    finished, ``consequence`` saying what."""
    finish = unfinished(source.attributes())
    if finish is not None:
        source.close()
        raise error(f"{name} is an emfast output not finished writing (its record says complete: false): "
                    f"{consequence}; {finish} first")


def option(name: str) -> str:
    """How messages name the option ``name``: ``name=True`` for Python callers, ``--name`` on the command line."""
    return f"--{name.replace('_', '-')}" if _command_line[0] else f"{name}=True"


def given(name: str, value) -> str:
    """How messages show the setting ``name`` given as ``value``: ``name='value'`` for Python callers, ``--name
    value`` on the command line."""
    return f"--{name.replace('_', '-')} {value}" if _command_line[0] else f"{name}={value!r}"


@contextmanager
def command_line_options() -> Iterator[None]:
    """Within this block, messages name options as command-line flags (``--resume``, ``--overwrite``)."""
    before = _command_line[0]
    _command_line[0] = True
    try:
        yield
    finally:
        _command_line[0] = before


def filesystem_path(container: Path, dataset: str, kind: str) -> Path:
    """The file or directory that holds an output, symlinks resolved: the HDF5 file, or the zarr array's folder."""
    return (container if kind == "hdf5" else container / dataset).resolve()


def check_output_location(container: Path, dataset: str, kind: str, stamp, role: str) -> None:
    """OutputLocationError if the output would be the input described by ``stamp`` (a :class:`Stamp`, or None for
    an in-memory input), lie inside it, or contain it; ``role`` names the input in the message ("source", "input").
    """
    if stamp is None or isinstance(stamp, RemoteStamp):  # in memory, or remote: never where a local output goes
        return
    output = filesystem_path(container, dataset, kind)
    if stamp.path.is_file():  # HDF5: one file holds the input and whatever else is written into it
        if output == stamp.path or (output.exists() and os.path.samefile(output, stamp.path)):  # hard links too
            raise OutputLocationError(
                f"{container}/{dataset} is in the {role}'s HDF5 file {stamp.path}; a writer killed mid-write can "
                "corrupt a whole HDF5 file, so emfast never writes into one it reads: write to another .h5 file "
                "or a .zarr")
        return
    data = input_folder(stamp)
    where = ("the " + role + " itself" if output == data else
             "inside the " + role if data in output.parents else
             "a folder containing the " + role if output in data.parents else None)
    if where is not None:
        named = stamp.path / stamp.dataset
        resolved = "" if named == data else f" ({data})"
        raise OutputLocationError(f"{container}/{dataset} is {where} {named}{resolved}; write the output beside it")


def check_zarr_container(container: Path) -> None:
    """OutputLocationError if ``container`` is a zarr array: an output's group metadata written into its folder
    (``zarr.json``, or ``.zgroup`` beside ``.zarray``) hides the array from every reader."""
    metadata = _zarr_metadata(container) if container.is_dir() else None
    if metadata is not None and metadata.get("node_type") == "array":
        raise OutputLocationError(f"{container} is a zarr array, not a group: an output inside it would hide it; "
                                  "write the output beside it")


def input_folder(stamp) -> Path:
    """The folder holding an input array's data: the array's own folder in a store, else the store."""
    folder = (stamp.path / stamp.dataset).resolve() if stamp.dataset else stamp.path
    return folder if folder.is_dir() else stamp.path


#: Files of a store array that hold only its attributes (zarr v2), which viewers and annotation tools rewrite:
#: left out of :func:`fingerprint` with ``data_only``.
ATTRIBUTE_FILES = frozenset({".zattrs"})


def recordable(text: str) -> str:
    """``text`` (a path or dataset name) as an output's record can hold it: a file name's bytes that are not UTF-8
    (an old file server's Latin-1, decoded by Python as lone surrogates) as backslash escapes. A record holding
    them is no JSON file: zarr's metadata check left the whole record out, and a killed run's output passed for
    a finished one. The same name always gives the same text, so a resume compares them still."""
    return os.fsencode(text).decode("utf-8", "backslashreplace") if isinstance(text, str) else text


def fingerprint(stamp, data_only: bool = False) -> Optional[dict]:
    """What the input's data looks like on disk: the count, total size and a digest of the names, sizes and
    modification times of every file holding it (the HDF5 file and those its external links and virtual datasets
    read; a store array's chunk files; ``data_only``: not :data:`ATTRIBUTE_FILES`), or None for an in-memory
    input. Rewriting any chunk in place changes it. Costs one ``stat`` per file.

    A remote input (a :class:`~emfast.io._remote.RemoteStamp`) is known by its array metadata: the size and
    digest of the document read when it was opened. Object stores offer no listing over HTTP and no modification
    times emfast relies on, so a chunk rewritten under unchanged metadata is not seen."""
    return fingerprints(stamp)[1 if data_only else 0]


def fingerprints(stamp) -> Tuple[Optional[dict], Optional[dict]]:
    """:func:`fingerprint` of ``stamp`` whole and ``data_only``, from one listing of its files."""
    if stamp is None:
        return None, None
    if isinstance(stamp, RemoteStamp):
        remote = _remote_fingerprint(stamp.marker, stamp.size, stamp.digest)
        return remote, remote
    if stored_in_file(stamp):  # an HDF5 file, and the files its links and virtual datasets read
        entries = [_entry(stamp.path, stamp.path.parent)] + _now(stamp.data_files)
    else:
        folder = input_folder(stamp)
        entries = sorted(_entry(Path(root) / name, folder)
                         for root, _, names in os.walk(folder, onerror=unlistable(_UNLISTED)) for name in names)
    data = [entry for entry in entries if Path(entry[0]).name not in ATTRIBUTE_FILES]
    return _digest_of(entries), _digest_of(data)


def stored_in_file(stamp) -> bool:
    """Whether the input of ``stamp`` is a dataset stored in a file (HDF5), fingerprinted by that file and those
    its external links and virtual datasets read, rather than a store's folder (or an array, or a remote store)."""
    return stamp is not None and not isinstance(stamp, RemoteStamp) and stamp.path.is_file()


def placement(stamp) -> dict:
    """``{"placement": ...}`` for an input's record where its stamp says where it was placed (a zarr array: an
    OME-NGFF level's voxel size and offset come from its image's metadata, outside the files fingerprinted; that
    file's time alone would change as a pyramid written there gains levels), else ``{}``."""
    text = getattr(stamp, "placement", "")
    return {"placement": text} if text else {}


def _remote_fingerprint(marker: str, size: int, digest: str) -> dict:
    return {"metadata": marker, "bytes": size, "digest": digest}


def _digest_of(entries) -> dict:
    # surrogateescape: a file name's bytes that are not UTF-8 (they decode so) hash as the bytes they are
    digest = hashlib.sha256("\n".join(f"{name} {size} {mtime}" for name, size, mtime in entries)
                            .encode("utf-8", "surrogateescape"))
    return {"files": len(entries), "bytes": sum(e[1] for e in entries), "digest": digest.hexdigest()}


#: The most bytes of a non-contiguous input copied at once to be hashed.
HASHED_SLAB_BYTES = 1 << 20


def array_fingerprint(array) -> dict:
    """The size and the SHA-256 of an in-memory input's bytes (C order). SHA-256 runs on the CPU's SHA
    instructions where it has them: 1.4 GB/s here, against BLAKE2b's 0.8, and the prediction waits for it. A
    view that is not C-contiguous (a flipped or transposed memmap) is copied a slab at a time, never whole."""
    digest = hashlib.sha256()
    for slab in _c_order_slabs(array):
        digest.update(np.ascontiguousarray(slab).view(np.uint8).reshape(-1))
    return {"bytes": int(array.nbytes), "sha256": digest.hexdigest()}


def _c_order_slabs(array) -> Iterator[np.ndarray]:
    """``array`` as consecutive pieces in C order: itself if contiguous, else slabs along its first axes of at
    most :data:`HASHED_SLAB_BYTES` (or one row of the last axis, if that is larger)."""
    if array.flags.c_contiguous or array.ndim <= 1 or array.nbytes <= HASHED_SLAB_BYTES:
        yield array
        return
    step = max(1, HASHED_SLAB_BYTES // max(1, array[0].nbytes))
    for start in range(0, len(array), step):
        slab = array[start:start + step]
        if slab.nbytes <= HASHED_SLAB_BYTES:
            yield slab
        else:
            for row in slab:
                yield from _c_order_slabs(row)


def _now(files) -> list:
    """(path, size, modification time) now of each of ``files`` ((path, size, mtime) as opened); a file that is
    gone has size and time -1."""
    now = []
    for file, _, _ in files:
        try:
            status = os.stat(file)
            now.append((str(file), status.st_size, status.st_mtime_ns))
        except OSError:
            now.append((str(file), -1, -1))
    return now


def _entry(path: Path, root: Path):
    status = path.stat()
    return str(path.relative_to(root)), status.st_size, status.st_mtime_ns


def input_changed(previous: Optional[dict], now: Optional[dict], name: str, in_file: bool = False) -> Optional[str]:
    """Why the input (``name``: "the input PATH") is not what it was when the output was started (fingerprints
    ``previous`` and ``now``), or None if it is the same; ``in_file``: a dataset stored in a file (HDF5), known by
    that file and those its external links and virtual datasets read, whose other datasets' writes change them."""
    if previous == now:
        return None
    if previous is None or now is None:
        return f"{name} is not the one this output was started from"
    if "metadata" in previous and "metadata" in now:
        return (f"{name} has other array metadata ({now['metadata']}) than when this output was started; resuming "
                "would mix old and new data")
    if "files" not in previous or "files" not in now:
        return (f"{name} holds other data than when this output was started (its digest differs); "
                "resuming would mix old and new data")
    files = previous["files"]
    then, now = (f"{f['files']} {plural(f['files'], 'file')} of {f['bytes']} bytes" for f in (previous, now))
    how = (f"{now} now, {then} then" if now != then else
           f"{now} now and then, but {'it was' if files == 1 else 'some were'} rewritten (modification times differ)")
    if in_file:  # the files, not the dataset: "changed" alone was untrue of a raw beside which labels were added
        return (f"a file holding {name} changed since this output was started (its file, or one its external "
                f"links or virtual datasets read): {how}; emfast knows an input stored in a file by the sizes and "
                "modification times of those files, so a write to any dataset of them counts (it may have rewritten "
                "this one too), and resuming could mix old and new data")
    return f"{name} changed since this output was started: {how}; resuming would mix old and new data"


def check_free_space(container: Path, needed: int, what: str, then: str) -> None:
    """OutputSpaceError naming the output unless the file system of ``container`` has ``needed`` bytes free
    (plus a margin), and, where ``container`` is a file (HDF5) or will be one, the process's file-size limit lets
    it grow by as much. ``what`` says what the bytes are for, ``then`` how to continue once there is room."""
    if not container.is_dir():
        check_file_size_limit(container, needed, what, then)
    folder = container if container.is_dir() else container.parent
    while not folder.exists():
        folder = folder.parent
    status = os.statvfs(folder)
    free = status.f_bavail * status.f_frsize
    if free < needed + SPACE_MARGIN:
        raise OutputSpaceError(errno.ENOSPC, f"not enough space for {container}: {what} needs {_mib(needed)} "
                                             f"(and {_mib(SPACE_MARGIN)} to spare), {_mib(free)} is free on its "
                                             f"file system; free some space, then {then}", str(container))


def check_file_size_limit(path: Path, needed: int, what: str, then: str) -> None:
    """OutputSpaceError unless the file ``path`` may grow by ``needed`` bytes (plus the margin) within the
    process's file-size limit (``ulimit -f``; a batch scheduler's ``h_fsize``), which ``statvfs`` does not show:
    a write past it fails with EFBIG, and HDF5 cannot recover from a failed write (a review: the file, the user's
    other datasets in it too, was left cut at the limit, unreadable)."""
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):  # Windows: no such limit
        return
    if limit == resource.RLIM_INFINITY:
        return
    try:
        size = path.stat().st_size
    except OSError:  # not written yet
        size = 0
    if size + needed + SPACE_MARGIN > limit:
        raise OutputSpaceError(errno.EFBIG, f"not enough room for {path}: {what} would grow it from {_mib(size)} "
                                            f"by up to {_mib(needed)} (and {_mib(SPACE_MARGIN)} to spare), past "
                                            f"the process's file-size limit of {_mib(limit)} (ulimit -f, or a "
                                            f"batch scheduler's file-size limit); raise the limit, then {then}",
                               str(path))


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


def remove_partial_files(folder: Path) -> int:
    """Delete the ``*.<hex>.partial`` files a killed zarr write left under ``folder`` (an output emfast wrote);
    returns how many."""
    removed = 0
    if Path(folder).is_symlink():  # os.walk would follow it into what emfast did not write
        return removed
    for root, _, names in os.walk(folder):
        for name in names:
            if PARTIAL_FILE.search(name):
                os.unlink(os.path.join(root, name))
                removed += 1
    return removed


def owned_by_emfast(attributes, lock: "OutputLock", dataset: str, holds_data: Callable[[], bool]) -> bool:
    """Whether an existing array with these attributes is emfast's to replace: it carries an emfast record, or
    a run killed while creating ``dataset`` left it (the lock file says so) and it holds no data yet. One that
    holds data without a record is someone's own, even under that name: a user may have written it after the
    kill (``holds_data()`` is asked only then)."""
    if any(key in attributes for key in RECORDS):
        return True
    return lock.was_creating(dataset) and not holds_data()


#: The files of a zarr node that describe it; any other file below an array's folder is its data.
ZARR_METADATA_FILES = {"zarr.json", ".zarray", ".zattrs", ".zgroup"}


def _zarr_holds_data(folder: Path) -> bool:
    """Whether a zarr array's folder holds a chunk or shard file (anything besides its metadata and the
    ``*.partial`` temporaries a killed write leaves, such as zarr-python's of ``.zattrs``)."""
    return any(name not in ZARR_METADATA_FILES and not name.endswith(".partial")
               for _, _, files in os.walk(folder) for name in files)


def remove_zarr_output(container: Path, dataset: str, lock: "OutputLock", delete: bool = True) -> None:
    """Delete the zarr array ``container/dataset`` if it is emfast's to replace (``delete`` False: only check that
    it is); NotOwnOutputError otherwise."""
    folder = container / dataset
    if folder.is_symlink():
        raise NotOwnOutputError(f"{folder} is a symbolic link; emfast replaces only arrays it wrote, never links")
    if delete:
        remove_leftovers(set_aside(container, dataset))
    if not folder.exists():
        return
    metadata = _zarr_metadata(folder)
    if metadata is None or metadata.get("node_type", "array") != "array":
        kind = "a zarr group" if metadata is not None else "not a zarr array"
        raise NotOwnOutputError(f"{folder} is {kind}; emfast replaces only arrays it wrote: delete it yourself "
                                "or choose another output")
    if not owned_by_emfast(metadata.get("attributes", {}), lock, dataset, lambda: _zarr_holds_data(folder)):
        raise NotOwnOutputError(f"{folder} exists and was not written by emfast (it has no emfast record); emfast "
                                "replaces only its own outputs: delete it yourself or choose another output")
    if delete:
        remove_folder(folder, set_aside(container, dataset))


#: The unique tail :func:`remove_folder` adds to the name it moves a folder to: "-" and this many hex digits.
REMOVING_TAIL_DIGITS = 12
#: Characters that tail adds (for checks of names' lengths).
REMOVING_TAIL = "-" + "0" * REMOVING_TAIL_DIGITS


def remove_folder(folder: Path, aside: Path) -> None:
    """Delete ``folder`` so that a kill leaves it whole or gone, never half of it (which could no longer be told
    for emfast's): renamed beside ``aside`` first (``aside`` plus a unique suffix; outside any zarr group, where
    readers would list it: see :func:`set_aside`), then deleted; what a killed deletion left there goes with the
    next call, or :func:`remove_leftovers`. Where the rename cannot be made (``aside`` on another file system)
    the folder is deleted in place. An OSError names what is left."""
    remove_leftovers(aside)
    moved = unique_beside(aside)
    try:
        os.rename(folder, moved)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        moved = folder
    try:
        shutil.rmtree(moved)
    except OSError as error:
        raise OSError(error.errno, f"could not delete {moved}: {error.strerror or error}") from error


def unique_beside(aside: Path) -> Path:
    """``aside`` with a unique tail (:data:`REMOVING_TAIL`): what :func:`remove_leftovers` deletes, named so."""
    return aside.with_name(f"{aside.name}-{uuid.uuid4().hex[:REMOVING_TAIL_DIGITS]}")


def remove_leftovers(aside: Path) -> None:
    """Delete what killed :func:`remove_folder` calls left beside ``aside``, as far as they can be (what cannot be
    stays, in nobody's way: each removal moves its folder to a name of its own)."""
    prefix = f"{aside.name}-"
    try:
        entries = list(aside.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(prefix) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def set_aside(container: Path, dataset: str) -> Path:
    """Where :func:`remove_folder` moves the zarr array ``container/dataset`` before deleting it: beside the
    container, as ``.CONTAINER.DATASET.emfast-removing`` (inside it, zarr and ``emfast info`` would list it), or,
    where that name (with the tail a removal adds) would pass a file name's 255 bytes (a dataset of two long
    names: 'File name too long' once its output was to be replaced), as ``.DIGEST.emfast-removing``."""
    name = f".{container.name}.{dataset.strip('/').replace('/', '.')}.emfast-removing"
    if len(os.fsencode(name + REMOVING_TAIL)) > 255:
        name = f".{hashlib.sha256(f'{container.name}/{dataset}'.encode()).hexdigest()[:32]}.emfast-removing"
    return container.parent / name


def _zarr_metadata(folder: Path) -> Optional[dict]:
    """The metadata of a zarr node folder (v3 ``zarr.json``; v2 ``.zarray``/``.zgroup`` with ``.zattrs``)."""
    if (folder / "zarr.json").is_file():
        return json.loads((folder / "zarr.json").read_text())
    for marker, node_type in ((".zarray", "array"), (".zgroup", "group")):
        if (folder / marker).is_file():
            attributes = folder / ".zattrs"
            return {"node_type": node_type,
                    "attributes": json.loads(attributes.read_text()) if attributes.is_file() else {}}
    return None


#: Axis names of emfast's outputs, by number of dimensions: funlib marks a channel axis with a trailing ``^``.
OUTPUT_AXES = {3: ["z", "y", "x"], 4: ["c^", "z", "y", "x"]}


def zarr_geometry(ndim: int, resolution: Optional[Sequence[float]], offset: Optional[Sequence[float]],
                  zarr_format: int) -> Tuple[dict, Optional[list]]:
    """The geometry attributes of a zarr output of ``ndim`` dimensions ((c,) z, y, x) with ``resolution`` and
    ``offset`` in nm (z, y, x), and its zarr v3 ``dimension_names`` (None for v2, which has none).

    Written in every convention the field reads: ``voxel_size``, ``offset``, ``axis_names`` and ``units`` for
    funlib.persistence and daisy, ``resolution`` for gunpowder, ``dimension_names`` for zarr v3 readers
    (tensorstore, napari), and in v2 xarray's ``_ARRAY_DIMENSIONS`` (the names it reads a v2 array's dimensions
    by). A stated voxel size without an offset gets offset 0, the field's default.
    """
    names = OUTPUT_AXES.get(ndim)
    attributes = {} if names is None else {"axis_names": list(names)}
    if names is not None and zarr_format == 2:
        attributes["_ARRAY_DIMENSIONS"] = [n.rstrip("^") for n in names]
    if resolution is not None:
        size = [float(r) for r in resolution]
        attributes.update(voxel_size=size, resolution=size, units=["nm"] * 3,
                          offset=[float(o) for o in offset] if offset is not None else [0.0] * 3)
    elif offset is not None:
        attributes["offset"] = [float(o) for o in offset]
    return attributes, (None if zarr_format == 2 or names is None else [n.rstrip("^") for n in names])


def add_ome_multiscales(root, dataset: str, ndim: int, resolution: Optional[Sequence[float]],
                        offset: Optional[Sequence[float]]) -> None:
    """Describe the zarr output ``dataset`` of the open group ``root`` as an OME-NGFF image of one level on its
    parent group (0.4 in zarr v2, 0.5 in v3), so that OME readers (ome-zarr-py, napari-ome-zarr) find it with its
    axes, voxel size and offset in nm. Only with a known voxel size, and only where the output is the parent's
    one member (OME readers would take a group holding other arrays for that one image, and hide the others), or
    where the parent describes this one dataset already (an earlier output of this name, described while it was
    alone: left as it was, it would place the new data where the old was); never over another image's metadata:
    a parent that already describes an image of other datasets keeps it.
    """
    if ndim not in OUTPUT_AXES:
        return
    parent, _, name = dataset.rpartition("/")
    group = root[parent] if parent else root
    if resolution is None:  # an earlier output of that name may have left its description: it would place this one
        _forget_image(group, [name])
        return
    with warnings.catch_warnings():  # zarr-python warns of folders that are no node (tensorstore's implicit ones)
        warnings.simplefilter("ignore")
        members = set(group.keys())
    if members - {name, f"{name}.blocks"} and _described_paths(group) != [name]:
        return  # described as an image, the group's others would be hidden (a level of one is placed as it is)
    _describe_image(group, name, ndim, [(name, resolution, offset)])


def _transforms(ndim: int, resolution, offset) -> list:
    """A level's OME-NGFF coordinateTransformations: its voxel size, then its offset (0 where it has none), with
    1 and 0 on the channel axis of a 4-D output."""
    lead = ndim - 3
    return [{"type": "scale", "scale": [1.0] * lead + [float(r) for r in resolution]},
            {"type": "translation",
             "translation": [0.0] * lead + [float(o) for o in ((0.0,) * 3 if offset is None else offset)]}]


def _multiscales_holder(attributes: dict) -> dict:
    """Where a group's ``attributes`` hold OME-NGFF multiscales: under ``ome`` (0.5), else at the top (0.4)."""
    ome = attributes.get("ome")
    return ome if isinstance(ome, dict) and "multiscales" in ome else attributes


def _described_paths(group) -> Optional[list]:
    """The dataset paths of the OME-NGFF image ``group`` describes (0.4 or 0.5), [] if none, None if its
    description is malformed (another program's, left as it is)."""
    try:
        return _listed_paths(_multiscales_holder(dict(group.attrs)).get("multiscales"))
    except (AttributeError, TypeError):  # not a list of images, each a mapping listing mappings
        return None


def _forget_image(group, paths: list) -> None:
    """Remove ``group``'s OME-NGFF multiscales where they describe exactly the datasets ``paths`` (emfast's own
    description of an earlier output there); another image's stays."""
    if _described_paths(group) != paths:
        return
    attributes = dict(group.attrs)
    holder = _multiscales_holder(attributes)
    if holder is attributes:
        del group.attrs["multiscales"]
    elif set(holder) <= {"multiscales", "version"}:  # nothing but the image was described
        del group.attrs["ome"]
    else:
        group.attrs["ome"] = {key: value for key, value in holder.items() if key != "multiscales"}


def add_ome_pyramid(container: Path, dataset: str, ndim: int, levels: Sequence[tuple], replace: bool = False
                    ) -> None:
    """Describe the zarr group ``container/dataset`` as an OME-NGFF multiscale image of ``levels`` (path, voxel
    size, offset in nm, finest first), unless it describes an image of other datasets already (``replace``:
    whatever it describes)."""
    from ._zarr import import_zarr, local_store

    if ndim not in OUTPUT_AXES:
        return
    group = import_zarr("writing").open_group(local_store(container, writable=True), path=dataset, mode="r+",
                                              use_consolidated=False)
    _describe_image(group, dataset.rpartition("/")[2], ndim, levels, replace)
    refresh_consolidated(container, dataset)


def refresh_consolidated(container: Path, group: str) -> None:
    """Consolidate again the metadata of ``group`` and the groups above it in the zarr store ``container`` that hold
    consolidated metadata (v2: ``.zmetadata``; v3: a group's ``consolidated_metadata``), deepest first: written by
    xarray or a pipeline, it lists the hierarchy as it was, and zarr-python reads a group through it by default,
    so an output written into such a store was invisible there, and one overwritten with another shape
    unreadable (a review). Groups without consolidated metadata get none."""
    from ._zarr import import_zarr, local_store

    parts = [part for part in group.split("/") if part]
    for depth in range(len(parts), -1, -1):
        path = "/".join(parts[:depth])
        version = _consolidated_format(container / path if path else container)
        if version is not None:
            with warnings.catch_warnings():  # v3's (not in the specification): the store's owner chose it
                warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
                import_zarr("writing").consolidate_metadata(local_store(container, writable=True),
                                                            path=path or None, zarr_format=version)


def _consolidated_format(folder: Path) -> Optional[int]:
    """The zarr format of the group ``folder`` if it holds consolidated metadata, else None."""
    if (folder / ".zmetadata").is_file():
        return 2
    metadata = _zarr_metadata(folder)
    if metadata is not None and metadata.get("node_type") == "group" and metadata.get("consolidated_metadata"):
        return 3
    return None


def forget_ome_pyramid(container: Path, dataset: str, levels: List[str]) -> None:
    """Remove the OME-NGFF description of the zarr group ``container/dataset`` where it describes exactly the
    pyramid ``levels`` (emfast's, about to be replaced: left, its voxel size and offset contradict the new levels
    as they are written, and reading one to make the next failed)."""
    from ._zarr import import_zarr, local_store

    _forget_image(import_zarr("writing").open_group(local_store(container, writable=True), path=dataset, mode="r+",
                                                    use_consolidated=False), levels)


def image_paths(folder: Path) -> Optional[List[str]]:
    """The dataset paths of the OME-NGFF image the zarr group ``folder`` describes, None if it describes none (or
    its description is malformed: another program's)."""
    metadata = _zarr_metadata(folder)
    if metadata is None or metadata.get("node_type") != "group":
        return None
    try:
        images = _multiscales_holder(metadata.get("attributes", {})).get("multiscales")
        return [str(path) for path in _listed_paths(images)] if images else None
    except (AttributeError, TypeError):  # not a list of images, each a mapping listing mappings
        return None


def _listed_paths(images) -> list:
    """The dataset paths OME-NGFF ``multiscales`` (a list of images; None: none) list, in order."""
    return [dataset.get("path") for image in images or () for dataset in image.get("datasets", ())]


def _describe_image(group, name: str, ndim: int, levels: Sequence[tuple], replace: bool = False) -> None:
    """Write the OME-NGFF multiscales of ``levels`` on ``group``: 0.4 in zarr v2, 0.5 in v3. An image whose
    datasets are not all among these levels (another program's) is kept, unless ``replace``."""
    version = "0.4" if group.metadata.zarr_format == 2 else "0.5"
    attributes = dict(group.attrs)
    existing = (attributes.get("ome", attributes) if version == "0.5" else attributes).get("multiscales")
    paths = [path for path, _, _ in levels]
    if existing and not replace and not set(_listed_paths(existing)) <= set(paths):
        return
    lead = ndim - 3
    axes = [{"name": "c", "type": "channel"}] * lead + [{"name": a, "type": "space", "unit": "nanometer"}
                                                        for a in ("z", "y", "x")]
    datasets = [{"path": path, "coordinateTransformations": _transforms(ndim, resolution, offset)}
                for path, resolution, offset in levels]
    image = {"axes": axes, "datasets": datasets, "name": name}
    if version == "0.4":
        wanted = {"multiscales": [dict(image, version="0.4")]}
    else:
        wanted = {"ome": {**attributes.get("ome", {}), "version": "0.5", "multiscales": [image]}}
    if any(attributes.get(key) != value for key, value in wanted.items()):  # a rerun rewrites nothing
        group.attrs.update(wanted)


def zarr_store_format(container: Path) -> Optional[int]:
    """The zarr format (2 or 3) of the existing store ``container``, or None if it holds no zarr node yet.

    Its root's metadata decides; a root without any (tensorstore writes only its arrays' metadata) takes the
    format of the first node found below it, so that writing into it never adds a root of the other format,
    behind which zarr-python would no longer see the store's arrays.
    """
    for root, folders, names in os.walk(container):
        if "zarr.json" in names:
            return 3
        if ".zgroup" in names or ".zarray" in names:
            return 2
        folders.sort()
    return None


def open_hdf5_for_writing(path: Path):
    """The HDF5 file ``path`` opened to append, or an OSError naming it: HDF5's own message for a file another
    process has open ("unable to lock file") does not say which file.

    A file created here keeps track of its free space across openings (HDF5 1.10.1 and later read it): by default
    HDF5 forgets the space of a deleted dataset when the file is closed, so each interrupted prediction replaced
    with ``overwrite`` grew the file by the space its partial output had taken."""
    import h5py

    try:
        if not os.path.lexists(path):
            try:
                return h5py.File(path, "w-", fs_strategy="fsm", fs_persist=True)
            except FileExistsError:  # made meanwhile by another program: opened as it is
                pass
        return h5py.File(path, "a")
    except BlockingIOError as error:
        raise OutputBusyError(f"cannot write {path}: another program has it open ({error}); close it there, "
                              "then run again") from None
    except OSError as error:
        raise OSError(error.errno, f"cannot open {path} for writing: {error}") from None


def refuse_hdf5_in_use(path: Path) -> None:
    """OutputBusyError if another program has the HDF5 file ``path`` open where HDF5 locks files (the default):
    the lock a reader holds refuses :func:`open_hdf5_for_writing`, and this asks it without opening the file as
    HDF5, so that the refusal comes before the model's first call. A file this process has open is told apart
    (its own lock would be taken for another program's): open to write, HDF5 shares it, and it is left to that
    opening; open only to read, HDF5 refuses to open it to write, and so does this, naming this process."""
    here = _open_in_this_process(path)
    if here == "write":
        return
    if here == "read":
        raise OutputBusyError(f"cannot write {path}: this process has it open to read only (an emfast volume read "
                              "lazily, or an h5py.File opened with 'r'); close it, then run again")
    if os.environ.get("HDF5_USE_FILE_LOCKING") in ("FALSE", "0"):  # as HDF5 reads it (not "false")
        return  # HDF5 takes no lock: the file opens for writing whoever reads it
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return  # what cannot be opened is named by the opening itself
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # HDF5 holds LOCK_SH to read, LOCK_EX to write
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError as error:
        raise OutputBusyError(f"cannot write {path}: another program has it open ({error}); close it there, "
                              "then run again") from None
    except OSError:
        pass  # a file system without locks: HDF5's best-effort locking takes none either
    finally:
        os.close(fd)


def _open_in_this_process(path: Path) -> Optional[str]:
    """How HDF5 has the file ``path`` open in this process (through h5py, or emfast's own volumes): "write" if
    any opening may write, "read" if only read, None if not open here."""
    import h5py

    intents = set()
    for file in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
        try:
            if os.path.samefile(os.fsdecode(file.name), path):
                intents.add(file.get_intent())
        except OSError:  # a file since removed or renamed: not this one
            continue
    if not intents:
        return None
    return "write" if any(intent & h5py.h5f.ACC_RDWR for intent in intents) else "read"  # SWMR readers: read


def remove_hdf5_output(file, dataset: str, lock: "OutputLock", delete: bool = True) -> None:
    """Delete the dataset ``dataset`` of the open h5py ``file`` if it is emfast's (``delete`` False: only check
    that it is, on a file open read-only); NotOwnOutputError otherwise."""
    import h5py

    link = file.get(dataset, getlink=True)
    if link is None:
        return
    if not isinstance(link, h5py.HardLink):
        raise NotOwnOutputError(f"{file.filename}/{dataset} is a link; emfast replaces only datasets it wrote")
    node = file[dataset]
    if not isinstance(node, h5py.Dataset):
        raise NotOwnOutputError(f"{file.filename}/{dataset} is a group; emfast replaces only datasets it wrote: "
                                "delete it yourself or choose another output")
    if not owned_by_emfast(node.attrs, lock, dataset, lambda: node.is_virtual or node.id.get_storage_size() > 0):
        raise NotOwnOutputError(f"{file.filename}/{dataset} exists and was not written by emfast (it has no "
                                "emfast record); emfast replaces only its own outputs: delete it yourself or choose "
                                "another output")
    if delete:
        del file[dataset]


def _open_lock_file(path: Path) -> int:
    """The lock file ``path`` opened to read and write, made if missing; never through a link (it is truncated and
    rewritten). The umask decides a new file's mode, as for the output's files: 0o644 locked a shared group
    folder's members out of each other's containers (a review). An existing file is opened without O_CREAT: in a
    sticky world-writable folder, Linux's protected_regular refuses O_CREAT on another user's file even at 0o666."""
    for _ in range(LOCK_OPEN_TRIES):  # a file made or removed between two opens: asked again
        try:
            return os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except FileExistsError:  # made meanwhile by another run (or a link there: refused by the next open)
            continue
    return os.open(path, os.O_RDWR | os.O_NOFOLLOW)


#: Rounds of :func:`_open_lock_file` before a lock file made and removed as fast as it is opened is given up on.
LOCK_OPEN_TRIES = 8


def _user_name(uid: int) -> str:
    """The login name of ``uid``, else ``uid N`` (a container's user may have none)."""
    import pwd
    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


#: The end of a lock file's name: ``.NAME.emfast-lock`` beside the container NAME.
LOCK_SUFFIX = ".emfast-lock"


class OutputLock:
    """The lock of one writer per output container, held from :meth:`acquire` to :meth:`release`.

    The lock file ``.NAME.emfast-lock`` beside the container holds the writer's pid and, while it creates a
    dataset, that dataset's name. It stays when released: deleting it would let two runs lock two different files.
    """

    def __init__(self, container: Path) -> None:
        container = Path(container).resolve()  # one lock however the output is reached (links in its path)
        self.container = container
        self.path = container.parent / f".{container.name}{LOCK_SUFFIX}"
        self._fd: Optional[int] = None
        self._creating_before: Optional[str] = None

    def acquire(self) -> "OutputLock":
        """Take the lock; OutputBusyError naming the other run's pid if another process holds it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OSError(error.errno, f"cannot create the folder {self.path.parent} of the output "
                                       f"{self.container}: {error.strerror}") from None
        try:
            fd = _open_lock_file(self.path)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM) and self.path.is_file():
                raise OSError(error.errno, self._unwritable(error)) from None
            if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise OSError(error.errno, f"cannot write beside the output {self.container}: {error.strerror} "
                                           f"(emfast keeps its lock file {self.path.name} there); write the output "
                                           "to a folder you can write to") from None
            raise OSError(error.errno, f"cannot use the lock file {self.path}: {error.strerror} (emfast keeps its "
                                       "lock there; a link or folder of that name must be moved away)") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"cannot use the lock file {self.path}: it is not a regular file; move it away")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_state(fd).get("pid", "unknown")
            os.close(fd)
            # flock locks belong to open files: a run in another thread of this process holds its own (asked of
            # the locks this process holds, not by pid: two containers sharing a folder may both run as pid 1)
            who = "another emfast run in this process (another thread)" if self._held_here() else \
                f"another emfast run (pid {holder})"
            raise OutputBusyError(f"{who} is writing {self.container}; wait for it to finish, or stop it, then run "
                                  "again") from None
        self._fd = fd
        _HELD.add(self)
        # Only this run may act on a killed run's half-made dataset: the mark is consumed here, so a dataset that
        # appears under that name later (the user's own) is never taken for emfast's.
        self._creating_before = _read_state(fd).get("creating")
        self._write({"pid": os.getpid()})
        return self

    def _unwritable(self, error: OSError) -> str:
        """Why the existing lock file cannot be opened to write, naming its owner and what to ask of them."""
        try:
            info = self.path.stat()
        except OSError:  # gone meanwhile: its owner is unknown
            owner, mode = "another user", "unknown"
        else:
            owner, mode = _user_name(info.st_uid), stat.filemode(info.st_mode)
        return (f"cannot write {self.container}: its lock file {self.path} is not writable by this user "
                f"({error.strerror}; it belongs to {owner}, mode {mode}). Every run that writes the output takes "
                "that lock: ask its owner to make it writable to you (chmod g+w for a shared group folder), or "
                "remove it while no emfast run writes the output")

    def was_creating(self, dataset: str) -> bool:
        """Whether a run killed before the output held its record was creating ``dataset``."""
        return self._creating_before == dataset

    def marked_creating(self) -> Optional[str]:
        """The dataset the lock file marks as being created, read without taking the lock and without consuming
        the mark (which only the run that takes the lock may act on): None where there is no mark or no file."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            return _read_state(fd).get("creating")
        finally:
            os.close(fd)

    def _held_here(self) -> bool:
        """Whether a lock of this process holds this lock's file."""
        return any(lock.path == self.path and lock._fd is not None for lock in list(_HELD))

    def holder(self) -> Optional[str]:
        """The pid of another emfast run holding this lock now (``"unknown"`` where its file does not say, or
        cannot be read), None where none does or this process holds it; asked without taking it (a shared lock is
        refused while a run holds its exclusive one). Not asked of a lock this process holds: flock would refuse
        its own, and on file systems emulating flock with POSIX locks closing the probe would release it."""
        if self._held_here():
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError:  # there, but unreadable (another user's, made under umask 077): a run may hold it
            return "unknown"
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return str(_read_state(fd).get("pid", "unknown"))
        except OSError:  # a file system without locks: no run is known to hold it
            return None
        finally:
            os.close(fd)
        return None

    @contextmanager
    def creating(self, dataset: str) -> Iterator[None]:
        """Mark ``dataset`` as being created until its record is written. The mark outlives only a killed run:
        a creation that fails with an error clears it (what it left has no record, so it is never replaced)."""
        self._write({"pid": os.getpid(), "creating": dataset}, durable=True)
        try:
            yield
        finally:
            self._write({"pid": os.getpid()})
            self._creating_before = None

    def _write(self, state: dict, durable: bool = False) -> None:
        """Replace the file's content; ``durable``: flushed to disk, for the mark of a dataset being created (a
        machine that crashes after the dataset was made still finds the mark, and the next run replaces what it
        left). The mark's clearing is not flushed: emfast does not flush the dataset's record either, and a
        cleared mark on disk beside a record that is not would leave a dataset no run may replace. A mark that
        outlives a crash has the next run take the dataset for half made: replaced, whatever that run's
        settings, as a dataset a killed run left (work lost, never the input). A pid needs no flush (a lock is
        released by its holder's end, whatever the file says), and on network file systems each flush costs
        milliseconds."""
        data = json.dumps(state).encode()
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, data)
        os.ftruncate(self._fd, len(data))
        if durable:
            os.fsync(self._fd)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        _HELD.discard(self)

    def _forget_in_child(self) -> None:
        """In a child process after fork(): close its copy of the lock's descriptor, never unlocking (that would
        unlock the parent's too). A child outliving a killed parent (the model's helper process) held the lock
        for as long as it ran, and the next run was told a dead pid was writing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *_) -> None:
        self.release()


#: The locks this process holds, closed in its forked children.
_HELD: "weakref.WeakSet[OutputLock]" = weakref.WeakSet()


def _forget_locks_in_child() -> None:
    for lock in list(_HELD):
        lock._forget_in_child()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


def _read_state(fd: int) -> dict:
    """The lock file's content (empty, or cut short by a killed write: nothing known)."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        state = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}
