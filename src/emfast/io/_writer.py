"""The one writer of emfast's outputs (``emfast convert`` and ``emfast.predict``): a zarr array (v2 or v3) or an
HDF5 dataset, created with its record and its geometry, or reopened to resume.

What both commands share lives here once:

* **Options.** ``compression`` (one of :data:`COMPRESSIONS`; zstd for zarr, gzip for HDF5 by default);
  ``compressor`` is its deprecated name (:func:`compression_option`).
* **Resume.** An existing output is reused only if it carries the command's record (``emfast_convert`` or
  ``emfast_predict``), was made from the same input (same path and dataset, and the same fingerprint: a
  rewritten input is refused) and with the same settings (every record entry but the ones the caller names as
  progress or provenance); otherwise it is refused, naming what differs, unless ``overwrite`` is given, and even
  then only an array emfast wrote is replaced (:mod:`emfast.io._outputs`). zarr's half-written ``*.partial`` files
  of a killed run are removed when resuming.
* **Metadata.** zarr outputs carry funlib/gunpowder ``voxel_size``, ``offset``, ``axis_names``, ``units`` and
  ``resolution``, zarr v3 ``dimension_names``, and an OME-NGFF image (0.4 in a v2 store, 0.5 in v3) on the parent
  group; HDF5 outputs carry ``resolution`` and ``offset`` in (z, y, x) nm as gunpowder reads them. An existing
  store keeps its zarr format.
"""
from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import Executor
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Tuple, Type

import h5py
import numpy as np

from ._chunkfiles import chunk_files
from ._hdf5 import TRANSLATION_ATTRIBUTE, open_hdf5
from ._open import split_path
from ._outputs import (LOCK_SUFFIX, NotOwnOutputError, OutputBusyError, OutputLock, add_ome_multiscales,
                       check_file_size_limit, check_zarr_container, given,
                       image_paths, input_changed, open_hdf5_for_writing, option, refuse_hdf5_in_use, remove_folder,
                       refresh_consolidated, remove_hdf5_output, remove_leftovers, remove_partial_files,
                       remove_zarr_output, set_aside, zarr_geometry, zarr_store_format)
from ._remote import is_url

#: Output codecs, for zarr; HDF5 takes gzip and none.
COMPRESSIONS = ("zstd", "blosc", "gzip", "none")
#: The codec of each output format when none is given (HDF5 has no zstd without plugins).
DEFAULT_COMPRESSIONS = {"zarr": "zstd", "hdf5": "gzip"}
#: Stand-in record of an existing node that carries no record of the command writing it.
NOT_EMFAST = {"written by": "something other than emfast"}


#: The most bytes of one name in a path on common file systems (ext4, XFS, btrfs, APFS).
NAME_MAX = 255


def parse_output(out, name: str = "out", companions: Sequence[str] = ()) -> Tuple[Path, str, str]:
    """(container, dataset, "zarr" or "hdf5") of ``out`` (``pred.zarr/affinities`` or ``pred.h5/affinities``);
    ValueError naming the argument ``name`` otherwise, or where a file name emfast makes for it would be longer
    than a file system takes (its lock file beside the container; a zarr dataset's names, and its name with each
    of ``companions``' suffixes, such as predict's ``.blocks``): the lock's "File name too long" asked to move
    away a link that did not exist, and a dataset's companion failed once the output was made."""
    if not isinstance(out, (str, os.PathLike)):  # an open array: the hints for an input's would mislead
        raise TypeError(f"{name} must be the path of the output, a dataset in a .zarr or .h5 container (e.g. "
                        f"pred.zarr/p), got a {type(out).__module__}.{type(out).__name__}: emfast creates the "
                        "output itself")
    if is_url(out):  # split as a path, "s3://b/o.zarr/x" was the local folder "s3:"
        raise ValueError(f"{name}={out} is a URL: emfast writes outputs to local (or mounted) paths and reads remote "
                         "stores only; write it locally, e.g. out.zarr/raw, then upload it")
    container, dataset, kind = split_path(out)
    if kind not in ("zarr", "hdf5") or not dataset:
        raise ValueError(f"{name} must name a dataset in a .zarr or .h5 container, e.g. out.zarr/raw; got {out}")
    names = [(f".{container.name}{LOCK_SUFFIX}", "emfast's lock file beside the container")]
    if kind == "zarr":
        *groups, last = dataset.split("/")
        names += [(group, "a group of the dataset") for group in groups]
        names += [(last + suffix, f"the dataset's companion {suffix}" if suffix else "the dataset")
                  for suffix in ("", *companions)]
    for file_name, what in names:
        if len(os.fsencode(file_name)) > NAME_MAX:
            raise ValueError(f"{name}={out}: {what} would be named {file_name[:24]}...{file_name[-24:]}, "
                             f"{len(os.fsencode(file_name))} bytes, more than the {NAME_MAX} a file name may have; "
                             "choose a shorter name")
    return container, dataset, kind


def _made(record) -> dict:
    """``record``, or what it returns if it is a callable (see :meth:`OutputWriter.prepare`)."""
    return record() if callable(record) else record


def check_compression(compression: str, kind: str) -> str:
    """``compression`` (the format's default for None), ValueError unless it applies to a ``kind`` ("zarr" or
    "hdf5") output."""
    compression = DEFAULT_COMPRESSIONS[kind] if compression is None else compression  # False meant none: refused
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
    if kind == "hdf5" and compression not in ("gzip", "none"):
        raise ValueError(f"HDF5 outputs support the compressions gzip and none, not {compression}")
    return compression


def compression_option(compression: Optional[str], compressor: Optional[str], stacklevel: int = 3) -> Optional[str]:
    """The ``compression`` asked for, given also the deprecated name ``compressor`` (DeprecationWarning; ValueError
    if both are given and differ)."""
    if compressor is None:
        return compression
    warnings.warn(f"{option('compressor').split('=')[0]} is deprecated; use {option('compression').split('=')[0]}"
                  " (the same values)", DeprecationWarning, stacklevel=stacklevel)
    if compression is not None and compression != compressor:
        raise ValueError(f"{given('compression', compression)} and its deprecated name "
                         f"{given('compressor', compressor)} disagree; give only {option('compression').split('=')[0]}")
    return compressor


def zarr_compressor(name: str, zarr_format: int, zarr):
    """The codec object for ``name``: numcodecs for zarr v2 metadata, zarr's own codecs for v3; None for none."""
    if name == "none":
        return None
    if zarr_format == 2:
        import numcodecs
        return {"zstd": lambda: numcodecs.Zstd(level=3), "blosc": numcodecs.Blosc, "gzip": numcodecs.GZip}[name]()
    return {"zstd": lambda: zarr.codecs.ZstdCodec(level=3), "blosc": zarr.codecs.BloscCodec,
            "gzip": zarr.codecs.GzipCodec}[name]()


def _compared(record: dict, key: str, input_key: str):
    """``record[key]`` as a resume compares it: the input's ``name`` is how it was named (through a link, or, by
    earlier versions, relative to a working folder), not what it holds, which its resolved ``path``, ``dataset``
    and fingerprint say."""
    value = record.get(key)
    if key == input_key and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "name"}
    return value


def compared_record(record: dict, unchecked: Iterable[str], input_key: str) -> dict:
    """What of ``record`` decides whether an output may be resumed: every entry as :meth:`OutputWriter.prepare`
    compares it, those in ``unchecked`` left out."""
    return {key: _compared(record, key, input_key) for key in record if key not in set(unchecked)}



#: Said where a run's roi differs from the output's: jobs splitting one prediction by roi each replaced the last
#: one's work with overwrite, as the refusal offered (a review).
_OTHER_ROI = (" (which deletes that run's roi). An output holds one run's roi: to split a prediction into jobs, give "
              "each roi an output of its own (another container; jobs writing other containers run at once), or "
              "predict the whole roi in one run, spread over a Dask cluster (client=, or a config's engine: dask)")


class OutputWriter:
    """One output dataset (``container/dataset``) and its container, opened for writing.

    Parameters
    ----------
    container, dataset, kind
        As :func:`parse_output` returns them.
    record_key : str
        The attribute holding the writing command's record (``emfast_convert``, ``emfast_predict``).
    refused : exception class
        Raised when the output may be neither resumed nor replaced (the command's own error type).
    zarr_format : {2, 3}
        Format of a new zarr store; an existing store keeps its own.
    """

    def __init__(self, container: Path, dataset: str, kind: str, record_key: str,
                 refused: Type[Exception] = FileExistsError, zarr_format: int = 3) -> None:
        self.container, self.dataset, self.kind = Path(container), dataset, kind
        self.record_key, self.refused = record_key, refused
        self.zarr_format = zarr_format
        self.root = None  # the h5py File or zarr Group
        self.array = None
        self._chunk_files = False  # zarr: the ChunkFiles writing whole chunks, None if zarr-python must; unknown yet

    @property
    def path(self) -> str:
        return f"{self.container}/{self.dataset}"

    def open_to_check(self) -> "OutputWriter":
        """Open the container read-only, or not at all where it does not exist: :meth:`prepare` decides whether
        the output may be written before anything is (a refused run leaves an HDF5 file's modification time and a
        store's metadata as they were), then opens it to write."""
        self.close()
        if self.kind == "hdf5" and self.container.is_file():
            refuse_hdf5_in_use(self.container)  # another program's reader: known now, not only once writing
            try:
                self.root = open_hdf5(self.container)
            except BlockingIOError as error:  # a writer came meanwhile: this run's own lock is not the cause
                raise OutputBusyError(f"cannot write {self.container}: another program has it open to write "
                                      f"({error.__cause__ or error}); close it there, then run again") from None
        self._refuse_array_above()
        return self

    def _refuse_array_above(self) -> None:
        """Refuse an output below anything but a group (only groups hold arrays), before anything is opened to
        write: h5py failed creating it with a TypeError (below a dataset or a named datatype) or a KeyError (below
        a link to nothing), after opening the file to write had rewritten part of it. Damaged zarr metadata above
        is named."""
        from ._zarr import check_metadata_json, is_zarr_array
        parts = [part for part in self.dataset.split("/") if part][:-1]
        if self.kind == "zarr" and self.container.is_dir():  # the root group is above every output
            check_metadata_json(self.container, str(self.container))
        for n in range(1, len(parts) + 1):
            parent = "/".join(parts[:n])
            if self.kind == "hdf5":
                if self.root is None or self.root.get(parent, getlink=True) is None:
                    return  # created with the output
                node = self.root.get(parent)
                what = None if isinstance(node, h5py.Group) else "a link to nothing" if node is None else \
                    "a dataset" if isinstance(node, h5py.Dataset) else "no group"
            else:
                folder = self.container / parent
                if folder.exists() and not folder.is_dir():
                    what = "a file, no group"
                else:
                    check_metadata_json(folder, f"{self.container}:{parent}")
                    what = "an array" if is_zarr_array(folder) else None
            if what is not None:
                raise self.refused(f"{self.path}: {parent} in {self.container} is {what}, and only groups hold "
                                   "arrays; choose another output")

    def open(self) -> "OutputWriter":
        """Open the container to write (created if absent); a zarr store keeps its existing format."""
        self.close()
        if self.kind == "hdf5":
            # opening to write and creating datasets write metadata at the file's end: a file at or near the
            # file-size limit (ulimit -f) was left with a broken entry no later run could open (a review)
            check_file_size_limit(self.container, 0, "opening it to write", "run again")
            self.root = open_hdf5_for_writing(self.container)
        else:
            from ._zarr import import_zarr, local_store
            if self.container.is_symlink() and not self.container.exists():  # zarr's mkdir said "File exists"
                raise FileNotFoundError(f"{self.container} is a symbolic link to {os.readlink(self.container)}, "
                                        "which does not exist: create what it points to, or choose another output")
            check_zarr_container(self.container)
            # a root of the other format over an existing store would hide the store's arrays
            self.zarr_format = zarr_store_format(self.container) or self.zarr_format
            # not through consolidated metadata, which shows the store as it was when consolidated
            self.root = import_zarr("writing").open_group(local_store(self.container, writable=True), mode="a",
                                                          zarr_format=self.zarr_format, use_consolidated=False)
        return self

    def node(self, name: str):
        """The array (or group) ``name`` in the container, or None."""
        if self.kind == "hdf5":
            return None if self.root is None else self.root.get(name)
        if self.root is None:  # opened to check: read-only, and no root group made where the store has none
            from ._zarr import ARRAY_MARKERS, GROUP_MARKERS, check_metadata_json, import_zarr, local_store
            if not any((self.container / name / marker).is_file() for marker in ARRAY_MARKERS + GROUP_MARKERS):
                return None
            # damaged metadata is named (zarr-python's JSON or attribute errors named no file)
            check_metadata_json(self.container / name, f"{self.container}:{name}")
            return import_zarr().open(store=local_store(self.container), path=name, mode="r")
        try:
            return self.root[name]
        except KeyError:
            return None

    def record(self, name: Optional[str] = None) -> Optional[dict]:
        """The record of the node ``name`` (default the output): None if there is no node, :data:`NOT_EMFAST` if
        the node carries no record of this command. The output opened to write is not looked up again: its
        record is what this run wrote (it holds the output's lock)."""
        node = self.array if name is None and self.array is not None else self.node(name or self.dataset)
        if node is None:
            return None
        record = node.attrs.get(self.record_key)
        if isinstance(record, str):
            record = json.loads(record)
        return record if isinstance(record, dict) else NOT_EMFAST

    def prepare(self, lock: OutputLock, record, *, resume: bool, overwrite: bool, input_key: str,
                what: str, unchecked: Iterable[str] = (), companions: Sequence[str] = (),
                create: Optional[Callable[[], None]] = None, check_resume: Optional[Callable[[dict], None]] = None,
                input_in_file: bool = False, **layout) -> Optional[dict]:
        """Reopen the output to resume it (returns its record) or create it (returns None). The caller holds
        ``lock``, the container's :class:`~emfast.io._outputs.OutputLock`.

        Parameters
        ----------
        lock : OutputLock
            The container's lock, held by the caller; it marks the output as being created while it is made.
        record : dict or callable
            This run's record (what decides the result); ``record[input_key]`` holds the input's ``path``,
            ``dataset`` and ``fingerprint``. A callable returning it is called only once the record is needed: a
            new output's after an earlier one was removed (an input's digest is computed meanwhile).
        resume : bool
            Whether an existing output with the same record may be continued (else it is refused).
        overwrite : bool
            Replace an existing output that emfast wrote.
        input_key : str
            The entry of ``record`` that describes the input ("input" for predictions, "source" for conversions).
        what : str
            What the command makes ("conversion", "prediction"), for messages.
        unchecked : iterable of str
            Record entries that do not decide the result (progress, provenance): not compared.
        companions : sequence of str
            Other arrays of the output (predict's finished-block flags): removed with it, their ``.partial`` files
            cleared on a resume.
        create : callable, optional
            Called after the output was created, while the lock still marks it as being created (to add the
            companions).
        check_resume : callable, optional
            Called with the existing record before a resume opens the output to write; raises to refuse it. A
            complete output is not opened to write at all: a rerun leaves it as it is.
        input_in_file : bool
            The input is a dataset stored in a file (HDF5): known by that file, for messages.
        **layout
            :meth:`create`'s arguments.
        """
        previous = self.record()
        half_made = lock.was_creating(self.dataset)  # a run killed while creating it: nothing was finished
        if previous is not None and not overwrite and not half_made:
            self._check_resumable(previous, _made(record), resume, input_key, what, set(unchecked), input_in_file)
            if check_resume is not None:
                check_resume(previous)
            if self.kind == "zarr":  # what a run killed while deleting a companion left aside (not the output)
                for name in (self.dataset, *companions):
                    remove_leftovers(set_aside(self.container, name))
            if previous.get("complete"):  # nothing is left to write: the output stays exactly as it is
                self.array = self.node(self.dataset)
                return previous
            self._writable()
            if self.kind == "zarr":
                for name in (self.dataset, *companions):
                    remove_partial_files(self.container / name)
            self.array = self.node(self.dataset)
            self._chunk_files = False
            return previous
        for delete in (False, True):  # every output checked before anything is written
            if delete:
                if self.kind == "zarr":  # after the checks of whose it is: another program's level is refused so
                    self._refuse_misplaced_level(len(layout["shape"]), layout.get("resolution"), layout.get("offset"))
                self._writable()
            for name in (self.dataset, *companions):
                try:
                    if self.kind == "hdf5":
                        if self.root is not None:
                            remove_hdf5_output(self.root, name, lock, delete)
                    else:
                        remove_zarr_output(self.container, name, lock, delete)
                except NotOwnOutputError as error:
                    raise self.refused(str(error)) from None
        with lock.creating(self.dataset):  # the record is in the array's first metadata: never one without it
            self.create(attributes={**layout.pop("attributes", {}), self.record_key: _made(record)}, **layout)
            if create is not None:
                create()
        return None

    def _refuse_misplaced_level(self, ndim: int, resolution, offset) -> None:
        """Refuse to write a level of an OME-NGFF image of several levels (emfast's pyramid) with other axes, or
        placed elsewhere, than the image gives it: the image's axes are every level's (a prediction's 4-D output
        at a level of a 3-D pyramid made it unreadable), and its coarser levels are placed from its first one, so a
        level moved alone was unreadable, or made the others so (reviews)."""
        from ._zarr import level_above
        parent = self.dataset.rpartition("/")[0]  # "": the store's root group (ome-zarr-py's images are there)
        image = self.container / parent if parent else self.container
        if len(image_paths(image) or ()) < 2:
            return  # no image of several levels above it (one of this output alone follows it, see _outputs)
        level = level_above(self.container, self.dataset)
        if level is None:
            return
        where = f"{self.path} is level {level.path} of the OME-NGFF image {image}"
        if ndim != len(level.axes):
            raise self.refused(f"{where}, whose levels have the axes ({', '.join(level.axes)}); this output has "
                               f"{ndim} axes: choose another output")
        if resolution is None:
            return  # placed by the image
        placed = (tuple(float(r) for r in resolution), tuple(float(o) for o in (offset or (0.0, 0.0, 0.0))))
        if not (np.allclose(placed[0], level.resolution, rtol=1e-6) and
                np.allclose(placed[1], level.offset, rtol=0, atol=1e-6 * min(level.resolution))):
            raise self.refused(
                f"{where}, which places it at voxel size {level.resolution} nm, offset {level.offset} nm; the input "
                f"is at voxel size {placed[0]} nm, offset {placed[1]} nm: write the whole pyramid again into "
                f"{image} (convert with levels and {option('overwrite')}), or choose another output")

    def _writable(self) -> None:
        """Open the container to write, if it was opened to check."""
        if self.kind == "zarr" and self.root is None or self.kind == "hdf5" and (
                self.root is None or self.root.mode == "r"):
            self.open()

    def refuse_untouchable(self, lock: OutputLock, resume: bool, overwrite: bool, what: str,
                           known: Optional[dict] = None) -> Optional[dict]:
        """Refuse an existing output that :meth:`prepare` would refuse whatever this run's record (another
        program's, or emfast's without ``resume`` or ``overwrite``); the caller holds ``lock``. ``known``: the
        entries of this run's record known now (its roi), for the refusal's words. Returns the record of an
        output ``resume`` may continue (:meth:`prepare` compares it with this run's), else None."""
        if overwrite:  # whether what is there is emfast's is checked when it is replaced
            return None
        previous = self.record()
        if previous is None or lock.was_creating(self.dataset):
            return None
        if previous is NOT_EMFAST or not resume:
            self._check_resumable(previous, dict(known or {}), resume, "input", what, set())
        return previous

    def _check_resumable(self, previous: dict, record: dict, resume: bool, input_key: str, what: str,
                         unchecked: set, in_file: bool = False) -> None:
        """``refused`` unless the existing output (its record ``previous``) may be continued with ``record``."""
        if previous is NOT_EMFAST:
            levels = image_paths(self.container / self.dataset) if self.kind == "zarr" else None
            if levels:  # a pyramid (emfast's, say): a group, which no command writing one array replaces
                raise self.refused(f"{self.path} is a multiscale image (levels {', '.join(levels)}), not an array; "
                                   "choose another output (a command writing one array never replaces a group)")
            raise self.refused(f"{self.path} exists and was not written by emfast; choose another output (emfast "
                               "never replaces what it did not write)")
        if not resume:
            if "roi" in record and previous.get("roi") not in (None, record["roi"]):  # a job splitting a prediction
                raise self.refused(f"{self.path} exists and holds a {what} over another roi ({previous['roi']} "
                                   f"there, {record['roi']} now); pass {option('overwrite')} to replace it"
                                   + _OTHER_ROI)
            raise self.refused(f"{self.path} exists; pass {option('resume')} to continue an unfinished {what} "
                               f"with the same settings, or {option('overwrite')} to replace it")
        if "compressor" in previous and "compression" not in previous:  # recorded by emfast before 0.x renamed it
            previous = {("compression" if k == "compressor" else k): v for k, v in previous.items()}
        old, new = previous.get(input_key) or {}, record.get(input_key) or {}
        if "placement" in new and "placement" not in old:  # recorded by an emfast that recorded none
            new = {key: value for key, value in new.items() if key != "placement"}
            record = dict(record, **{input_key: new})
        if (old.get("path"), old.get("dataset")) == (new.get("path"), new.get("dataset")):
            name = "the input array" if new.get("path") is None else f"the input {new['path']}/{new['dataset']}"
            changed = input_changed(old.get("fingerprint"), new.get("fingerprint"), name, in_file)
            if changed is None and old.get("placement") != new.get("placement"):
                changed = (f"{name} is placed otherwise than when this output was started (voxel size and offset "
                           f"{new.get('placement')} now, {old.get('placement')} then: the metadata placing it "
                           "changed)")
            if changed:
                raise self.refused(f"cannot resume {self.path}: {changed}; pass {option('overwrite')} to start "
                                   "again")
        differing = sorted(k for k in set(record) | set(previous) if k not in unchecked
                           and _compared(previous, k, input_key) != _compared(record, k, input_key))
        if differing:
            role = "source" if input_key == "source" else "input"
            raise self.refused(f"{self.path} exists and it is a {what} with another {role} or other settings ("
                               + "; ".join(f"{k}: {previous.get(k)!r} there, {record.get(k)!r} now"
                                           for k in differing)
                               + f"); pass {option('overwrite')} to replace it"
                               + (_OTHER_ROI if "roi" in differing else ""))

    def create(self, *, shape, dtype, chunks, compression: str, resolution=None, offset=None, translation=None,
               attributes: Optional[dict] = None, fill_value=0) -> None:
        """Create the output array with its geometry (``resolution`` and ``offset`` in (z, y, x) nm, or None;
        ``translation``: the OME-NGFF translation of a binned level, where it differs from ``offset``) and
        ``attributes``; ``chunks`` cover the array's last three axes, its leading axes are whole in every chunk."""
        shape = tuple(int(s) for s in shape)
        chunks = shape[:-3] + tuple(int(c) for c in chunks)
        dtype = np.dtype(dtype).newbyteorder("=")
        attributes = dict(attributes or {})
        self._chunk_files = False
        if self.kind == "hdf5":  # HDF5 refuses chunks larger than the array, which zarr takes: cut to it
            chunks = tuple(min(c, s) for c, s in zip(chunks, shape))
            self.array = self.root.create_dataset(self.dataset, shape=shape, dtype=dtype, chunks=chunks,
                                                  compression=None if compression == "none" else "gzip",
                                                  fillvalue=fill_value)
            geometry = {}
            if resolution is not None:
                geometry["resolution"] = [float(r) for r in resolution]
            if offset is not None:
                geometry["offset"] = [float(o) for o in offset]
            if translation is not None:  # a binned level's, which no HDF5 convention holds (see _hdf5)
                geometry[TRANSLATION_ATTRIBUTE] = [float(t) for t in translation]
            for key, value in dict(attributes, **geometry).items():
                try:
                    self.array.attrs[key] = json.dumps(value) if isinstance(value, dict) else value
                except (TypeError, ValueError, RuntimeError):  # nested or ragged lists, mixed types, embedded NULs
                    try:  # kept as JSON text
                        self.array.attrs[key] = json.dumps(value)
                    except (TypeError, ValueError, RuntimeError) as error:  # a name HDF5 takes none of ("")
                        warnings.warn(f"{self.path}: the attribute {key!r} cannot be written to HDF5 ({error}); "
                                      "it is left out", RuntimeWarning, stacklevel=2)
            self.root.flush()
            return
        from ._zarr import import_zarr
        zarr = import_zarr("writing")
        geometry, dimension_names = zarr_geometry(len(shape), resolution, offset, self.zarr_format)
        self.array = self.root.create_array(self.dataset, shape=shape, chunks=chunks, dtype=dtype,
                                            compressors=zarr_compressor(compression, self.zarr_format, zarr),
                                            dimension_names=dimension_names, fill_value=fill_value,
                                            attributes=dict(self._standard_json(attributes), **geometry))
        add_ome_multiscales(self.root, self.dataset, len(shape), resolution, offset if translation is None else
                            translation)
        self._refresh_consolidated()  # a run killed from now on leaves the new array listed, not the one replaced

    def _standard_json(self, attributes: dict) -> dict:
        """The attributes standard JSON holds, the others left out with a warning: zarr wrote a NaN as a bare
        NaN, and tensorstore and neuroglancer refused to read the array's zarr.json (HDF5 holds NaN itself)."""
        kept = {}
        for key, value in attributes.items():
            try:  # UTF-8 too: a lone surrogate ("\ud800", valid in Python's JSON) is no UTF-8, and no JSON file
                json.dumps({key: value}, allow_nan=False, ensure_ascii=False).encode("utf-8")
            except (TypeError, ValueError) as error:
                warnings.warn(f"{self.path}: the attribute {key!r} is not standard JSON ({error}); it is left out",
                              RuntimeWarning, stacklevel=2)
                continue
            kept[key] = value
        return kept

    def create_companion(self, name: str, shape, dtype, attributes: dict) -> object:
        """A small uncompressed array beside the output (one element per chunk in zarr, so that concurrent writers
        never share a chunk), without geometry."""
        if self.kind == "hdf5":
            # Chunked, each chunk filled with 0 when first written to: HDF5 hands out the space of deleted
            # datasets again (a file that keeps its free space, see open_hdf5_for_writing) without clearing it,
            # and stale flags would mark blocks finished that never were. Unwritten chunks take no space (a small
            # roi of a huge grid flags a few).
            allocated = h5py.h5p.create(h5py.h5p.DATASET_CREATE)  # fill_time= is h5py 3.12's: 3.8 is supported
            allocated.set_fill_time(h5py.h5d.FILL_TIME_ALLOC)
            node = self.root.create_dataset(name, shape=tuple(shape), dtype=dtype, fillvalue=0, dcpl=allocated,
                                            chunks=tuple(min(int(s), 64) for s in shape))
            for key, value in attributes.items():
                node.attrs[key] = value
            self.root.flush()
            return node
        # dimensions named as its own, as xarray needs of every array of a group it opens (v2 _ARRAY_DIMENSIONS,
        # v3 dimension_names): listed in consolidated metadata while a run is unfinished, it failed xr.open_zarr
        base = name.rpartition("/")[2]
        dimensions = [f"{base}_{axis}" for axis in ("z", "y", "x")] if len(shape) == 3 else \
            [f"{base}_{axis}" for axis in range(len(shape))]
        if self.zarr_format == 2:
            attributes = dict(attributes, _ARRAY_DIMENSIONS=dimensions)
        array = self.root.create_array(name, shape=tuple(shape), chunks=(1,) * len(shape), dtype=dtype,
                                       compressors=None, fill_value=0, attributes=attributes,
                                       dimension_names=None if self.zarr_format == 2 else dimensions)
        self._refresh_consolidated()
        return array

    def write(self, corner, data: np.ndarray, encoding: Optional[Executor] = None) -> None:
        """Write ``data`` (its last three axes spatial) with its first voxel at ``corner`` (z, y, x); in HDF5,
        flushed to the file before returning, so that a record saying it was written is never ahead of it.
        ``encoding``: a pool that encodes whole zarr chunks (see :meth:`~emfast.io._chunkfiles.ChunkFiles.write`)."""
        lead = data.ndim - 3
        if self.kind == "zarr":
            if self._chunk_files is False:
                self._chunk_files = chunk_files(self.array)
            whole = (0,) * lead + tuple(corner)
            if self._chunk_files is not None and data.shape[:lead] == tuple(self.array.shape)[:lead] \
                    and data.ndim == len(self.array.shape) and self._chunk_files.covers(whole, data.shape):
                self._chunk_files.write(whole, data, encoding)
                return
        box = tuple(slice(c, c + e) for c, e in zip(corner, data.shape[-3:]))
        self.array[(slice(None),) * lead + box] = data
        if self.kind == "hdf5":
            self.root.flush()

    def set_record(self, record: dict) -> None:
        """Replace the output's record (zarr rewrites its metadata file whole: written aside, then renamed)."""
        self.array.attrs[self.record_key] = json.dumps(record) if self.kind == "hdf5" else record
        if self.kind == "hdf5":
            self.root.flush()

    def delete(self, name: str) -> None:
        """Delete the companion ``name`` (zarr: whole or not at all, see :func:`remove_folder`), opening the
        container to write if it was opened to check."""
        if self.kind == "zarr":
            remove_folder(self.container / name, set_aside(self.container, name))
            self._refresh_consolidated()
            return
        self._writable()
        del self.root[name]
        self.root.flush()

    def close(self) -> None:
        """Close the container; a zarr store opened to write has its consolidated metadata, if any, made again
        (:func:`refresh_consolidated`)."""
        if self.kind == "hdf5" and self.root is not None:
            self.root.close()
        elif self.root is not None:
            self._refresh_consolidated()
        self.root = self.array = None
        self._chunk_files = False

    def _refresh_consolidated(self) -> None:
        """Consolidate again the groups above the output that hold consolidated metadata (zarr)."""
        if self.kind == "zarr":
            refresh_consolidated(self.container, self.dataset.rpartition("/")[0])
