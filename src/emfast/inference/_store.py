"""The prediction's output: a zarr array or an HDF5 dataset of shape (channels, z, y, x), and beside it a record
of which blocks are finished, so that an interrupted run resumes where it stopped.

The output's attributes hold ``emfast_predict``: the input as it was, every setting that decides the result, the
model's name, the emfast version, and ``complete``; the output is created with it. Finished blocks are flagged
in a small uint8 array named ``<dataset>.blocks``, one element per block and, in zarr, one chunk per element, so
that concurrent workers never write the same chunk. A block's flag is set only after all its chunks were written
(in HDF5: flushed to the file); the flag array is deleted when every block is done.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Set, Tuple

import numpy as np

from ..io import COMPRESSORS, import_zarr, split_path, zarr_compressor
from ..io._outputs import (NotOwnOutputError, OutputLock, add_ome_multiscales, check_zarr_container, input_changed,
                           open_hdf5_for_writing, option, remove_hdf5_output, remove_partial_files,
                           remove_zarr_output, zarr_geometry, zarr_store_format)

RECORD = "emfast_predict"
#: Record entries kept for provenance and not compared when resuming: a retrained model keeps its name, a wrapped
#: one changes it, and neither tells whether the result would differ.
PROVENANCE = ("model", "emfast", "complete")
#: The attribute marking the flags array as emfast's (so overwriting may remove it).
FLAGS_RECORD = "emfast_predict_blocks"
#: Output codecs: those of emfast convert.
COMPRESSIONS = COMPRESSORS
OUTPUT_DTYPES = ("float32", "float16", "uint8")


class OutputExistsError(FileExistsError):
    """The output exists and may not be replaced, or it is a prediction with other settings."""


class BlockWriteError(OSError):
    """Writing a block failed (a full disk, a lost mount); the store is left resumable."""


def parse_output(out) -> Tuple[Path, str, str]:
    """(container, dataset, "zarr" or "hdf5") of ``out`` (``pred.zarr/affinities`` or ``pred.h5/affinities``)."""
    container, dataset, kind = split_path(out)
    if kind not in ("zarr", "hdf5") or not dataset:
        raise ValueError(f"out must name a dataset in a .zarr or .h5 container, e.g. pred.zarr/affinities; got "
                         f"{out}")
    return container, dataset, kind


def check_compression(compression: str, kind: str) -> None:
    """ValueError unless ``compression`` applies to a ``kind`` ("zarr" or "hdf5") output."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
    if kind == "hdf5" and compression not in ("gzip", "none"):
        raise ValueError(f"HDF5 outputs support the compressions gzip and none, not {compression}")


class OutputStore:
    """A prediction output opened for writing. Build one with :meth:`prepare`; reopen it in another process with
    :meth:`reopen` (what Dask workers do)."""

    def __init__(self, container: Path, dataset: str, kind: str) -> None:
        self.container, self.dataset, self.kind = container, dataset, kind
        self.flags_name = dataset + ".blocks"
        self._file = None
        self._array = None
        self._flags = None
        #: Whether :meth:`prepare` opened an existing output to resume it (rather than creating it).
        self.resumed = False

    @property
    def path(self) -> str:
        return f"{self.container}/{self.dataset}"

    @classmethod
    def prepare(cls, out, shape, dtype: str, chunks, compression: str, grid, record: dict, attributes: dict,
                resume: bool, overwrite: bool, lock: OutputLock) -> Tuple["OutputStore", Set[int]]:
        """Create the output, or open it to resume; returns the store and the blocks already finished. The
        caller holds ``lock``, the output's :class:`~emfast.io._outputs.OutputLock`.

        Raises
        ------
        OutputExistsError
            The output exists and neither ``resume`` (with the same record and input) nor ``overwrite`` was given,
            or ``overwrite`` was given for something emfast did not write (another program's array, a group, a
            link).
        """
        container, dataset, kind = parse_output(out)
        check_compression(compression, kind)
        store = cls(container, dataset, kind)
        store._open_container()
        try:
            previous = store._existing_record()
            half_made = lock.was_creating(dataset)  # a run killed while creating it: nothing was finished
            if previous is not None and not overwrite and not half_made:
                store._check_resumable(previous, record, resume)
                if kind == "zarr":
                    for name in (dataset, store.flags_name):
                        remove_partial_files(container / name)
                store.resumed = True
                return store, store._finished(grid, previous.get("complete", False))
            store._remove(lock)
            with lock.creating(dataset):
                store._create(shape, dtype, chunks, compression, grid, dict(record, complete=False), attributes)
            return store, set()
        except BaseException:
            store.close()
            raise

    def _check_resumable(self, previous: dict, record: dict, resume: bool) -> None:
        """OutputExistsError unless the existing output may be resumed with ``record``."""
        if "written by" in previous:
            raise OutputExistsError(f"{self.path} exists and was not written by emfast; choose another output "
                                    "(emfast never replaces what it did not write)")
        if not resume:
            raise OutputExistsError(f"{self.path} exists; pass {option('resume')} to continue an unfinished "
                                    f"prediction with the same settings, or {option('overwrite')} to replace it")
        old, new = previous.get("input", {}), record["input"]
        if (old.get("path"), old.get("dataset")) == (new.get("path"), new.get("dataset")):
            name = "the input array" if new.get("path") is None else f"the input {new['path']}/{new['dataset']}"
            changed = input_changed(old.get("fingerprint"), new.get("fingerprint"), name)
            if changed:
                raise OutputExistsError(f"cannot resume {self.path}: {changed}; pass {option('overwrite')} to "
                                        "predict it again")
        differing = sorted(k for k in set(record) | set(previous)
                           if k not in PROVENANCE and previous.get(k) != record.get(k))
        if differing:
            raise OutputExistsError(f"{self.path} is a prediction with other settings ("
                                    + "; ".join(f"{k}: {previous.get(k)!r} there, {record.get(k)!r} now"
                                                for k in differing)
                                    + f"); pass {option('overwrite')} to replace it")

    def _remove(self, lock: OutputLock) -> None:
        """Delete the output and its flags, where they exist and emfast wrote them (NotOwnOutputError if not)."""
        for name in (self.dataset, self.flags_name):
            try:
                if self.kind == "hdf5":
                    remove_hdf5_output(self._file, name, lock)
                else:
                    remove_zarr_output(self.container, name, lock)
            except NotOwnOutputError as error:
                raise OutputExistsError(str(error)) from None

    @classmethod
    def reopen(cls, container: Path, dataset: str, kind: str) -> "OutputStore":
        store = cls(container, dataset, kind)
        store._open_container()
        store._array = store._node(dataset)
        store._flags = store._node(store.flags_name)
        return store

    def _open_container(self) -> None:
        if self.kind == "hdf5":
            self._file = open_hdf5_for_writing(self.container)
        else:
            check_zarr_container(self.container)
            # an existing store keeps its format: a v3 root over a v2 store would hide the store's arrays
            self._file = import_zarr().open_group(str(self.container), mode="a",
                                                  zarr_format=zarr_store_format(self.container) or 3)

    def _node(self, name: str):
        if self.kind == "hdf5":
            return self._file.get(name)
        try:
            return self._file[name]
        except KeyError:
            return None

    def _existing_record(self) -> Optional[dict]:
        node = self._node(self.dataset)
        if node is None:
            return None
        record = node.attrs.get(RECORD)
        if isinstance(record, str):
            record = json.loads(record)
        return record if isinstance(record, dict) else {"written by": "something other than emfast predict"}

    def _finished(self, grid, complete: bool) -> Set[int]:
        self._array = self._node(self.dataset)
        self._flags = self._node(self.flags_name)
        if complete:
            return set(range(int(np.prod(grid))))
        if self._flags is None:
            raise OutputExistsError(f"{self.path} is an unfinished prediction without its record of finished "
                                    f"blocks ({self.flags_name}); pass {option('overwrite')} to start again")
        return set(int(i) for i in np.flatnonzero(self._flags[...]))

    def _create(self, shape, dtype, chunks, compression, grid, record, attributes) -> None:
        """The output with its record from the start, and its flags (marked as emfast's)."""
        chunks = (shape[0],) + tuple(chunks)
        if self.kind == "hdf5":
            self._array = self._file.create_dataset(self.dataset, shape=shape, dtype=dtype, chunks=chunks,
                                                    compression=None if compression == "none" else "gzip")
            for key, value in attributes.items():
                self._array.attrs[key] = value
            self._array.attrs[RECORD] = json.dumps(record)
            self._flags = self._file.create_dataset(self.flags_name, shape=tuple(grid), dtype=np.uint8)
            self._flags.attrs[FLAGS_RECORD] = True
            self._file.flush()
            return
        zarr = import_zarr()
        zarr_format = self._file.metadata.zarr_format
        geometry, dimension_names = zarr_geometry(len(shape), attributes.get("resolution"),
                                                  attributes.get("offset"), zarr_format)
        self._array = self._file.create_array(self.dataset, shape=shape, chunks=chunks, dtype=dtype,
                                              compressors=zarr_compressor(compression, zarr_format, zarr),
                                              dimension_names=dimension_names, fill_value=0,
                                              attributes=dict(attributes, **geometry, **{RECORD: record}))
        add_ome_multiscales(self._file, self.dataset, len(shape), attributes.get("resolution"),
                            attributes.get("offset"))
        self._flags = self._file.create_array(self.flags_name, shape=tuple(grid), chunks=(1,) * len(grid),
                                              dtype=np.uint8, compressors=None, fill_value=0,
                                              attributes={FLAGS_RECORD: True})

    def write(self, start, data: np.ndarray) -> None:
        """Write ``data`` (channels, z, y, x) with its first voxel at ``start``; in HDF5, flushed to the file
        before returning, so that a block is flagged only once its data is on disk."""
        box = tuple(slice(s, s + n) for s, n in zip(start, data.shape[1:]))
        self._array[(slice(None),) + box] = data
        if self.kind == "hdf5":
            self._file.flush()

    def mark(self, index: int, grid) -> None:
        """Record block ``index`` (numbered in C order of ``grid``) as finished."""
        self._flags[np.unravel_index(index, tuple(grid))] = 1
        if self.kind == "hdf5":
            self._file.flush()

    def finish(self) -> None:
        """Record the prediction as complete and drop the flags (nothing to do if it was complete already)."""
        if self._flags is None:
            return
        record = self._existing_record()
        record["complete"] = True
        if self.kind == "hdf5":
            self._array.attrs[RECORD] = json.dumps(record)
            del self._file[self.flags_name]
            self._file.flush()
        else:
            self._array.attrs[RECORD] = record
            del self._file[self.flags_name]
        self._flags = None

    def close(self) -> None:
        if self.kind == "hdf5" and self._file is not None:
            self._file.close()
        self._file = self._array = self._flags = None
