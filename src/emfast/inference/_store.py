"""The prediction's output: a zarr array or an HDF5 dataset of shape (channels, z, y, x), and beside it a record
of which blocks are finished, so that an interrupted run resumes where it stopped.

The output's attributes hold ``emfast_predict``: the input as it was, every setting that decides the result, the
model's name, the emfast version, and ``complete``; the output is created with it. Finished blocks are flagged
in a small uint8 array named ``<dataset>.blocks``, one element per block and, in zarr, one chunk per element, so
that concurrent workers never write the same chunk. A block's flag is set only after all its chunks were written
(in HDF5: flushed to the file); the flag array is deleted when every block is done.
"""
from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import Callable, Optional, Set, Tuple

import numpy as np

from ..io import COMPRESSIONS, OutputWriter, check_compression, parse_output
from ..io import OutputLock, option
from ..io._chunkfiles import chunk_files

RECORD = "emfast_predict"
#: Record entries kept for provenance and not compared when resuming: a retrained model keeps its name, a wrapped
#: one changes it, and neither tells whether the result would differ.
PROVENANCE = ("model", "emfast", "complete")
#: The attribute marking the flags array as emfast's (so overwriting may remove it).
FLAGS_RECORD = "emfast_predict_blocks"
#: The flags array's name: the output's with this after it.
FLAGS_SUFFIX = ".blocks"
#: The names of the dtypes a prediction may be written as (``predict(dtype=...)``); the loader's batch dtypes
#: (``OUTPUT_DTYPES`` in ``emfast.pipeline._loader``) are another list, of NumPy dtypes.
PREDICT_OUTPUT_DTYPE_NAMES = ("float32", "float16", "uint8")
__all__ = ["COMPRESSIONS", "PREDICT_OUTPUT_DTYPE_NAMES", "BlockWriteError", "OutputExistsError", "OutputStore",
           "check_compression", "parse_output"]


class OutputExistsError(FileExistsError):
    """The output exists and may not be replaced, or it is a prediction with other settings."""


class BlockWriteError(OSError):
    """Writing a block failed (a full disk, a lost mount); the store is left resumable."""


class OutputStore:
    """A prediction output opened for writing: the output array (written by the shared
    :class:`~emfast.io.OutputWriter`) and its finished-block flags. Build one with :meth:`prepare`; reopen it in
    another process with :meth:`reopen` (what Dask workers do)."""

    def __init__(self, container: Path, dataset: str, kind: str, zarr_format: int = 3) -> None:
        self.container, self.dataset, self.kind = container, dataset, kind
        self.flags_name = dataset + FLAGS_SUFFIX
        self._writer = OutputWriter(container, dataset, kind, RECORD, refused=OutputExistsError,
                                    zarr_format=zarr_format)
        self._flags = None
        self._flag_files = False  # zarr: the ChunkFiles writing the flags' chunks (None: zarr-python); unknown yet
        #: Whether :meth:`prepare` opened an existing output to resume it (rather than creating it).
        self.resumed = False

    @property
    def path(self) -> str:
        return f"{self.container}/{self.dataset}"

    @classmethod
    def prepare(cls, out, shape, dtype: str, chunks, compression: str, grid, record: Callable[[], dict],
                attributes: dict, resume: bool, overwrite: bool, lock: OutputLock,
                box, input_in_file: bool = False, zarr_format: int = 3) -> Tuple["OutputStore", Set[int]]:
        """Create the output, or open it to resume; returns the store and the blocks already finished among
        those of ``box``, the (first, end) grid positions of the blocks the prediction covers. ``record()``
        returns the run's record, called once it is needed (a new output's after an earlier one was removed: the
        input's digest is computed meanwhile). The caller holds ``lock``, the output's
        :class:`~emfast.io._outputs.OutputLock`. ``attributes`` may hold the input's
        ``resolution`` and ``offset`` (z, y, x nm), written in every convention the field reads, and the
        OME-NGFF ``translation`` of a binned level (see :attr:`~emfast.io.Volume.translation`);
        ``input_in_file``: the input is a dataset stored in a file (HDF5), for messages; ``zarr_format``: of a
        new zarr store (an existing one keeps its own).

        Raises
        ------
        OutputExistsError
            The output exists and neither ``resume`` (with the same record and input) nor ``overwrite`` was given,
            or ``overwrite`` was given for something emfast did not write (another program's array, a group, a
            link).
        """
        container, dataset, kind = parse_output(out, companions=(FLAGS_SUFFIX,))
        compression = check_compression(compression, kind)
        store = cls(container, dataset, kind, zarr_format)
        store._writer.open_to_check()
        try:
            attributes = dict(attributes)
            previous = store._writer.prepare(
                lock, lambda: dict(record(), complete=False), resume=resume, overwrite=overwrite, input_key="input",
                what="prediction", unchecked=PROVENANCE, companions=(store.flags_name,),
                create=lambda: store._create_flags(grid), check_resume=store._check_flags,
                input_in_file=input_in_file, shape=shape,
                dtype=dtype, chunks=chunks,
                compression=compression, resolution=attributes.pop("resolution", None),
                offset=attributes.pop("offset", None), translation=attributes.pop("translation", None),
                attributes=attributes)
            if previous is None:
                return store, set()
            store.resumed = True
            return store, store._finished(grid, previous.get("complete", False), box)
        except BaseException:
            store.close()
            raise

    @classmethod
    def refuse_early(cls, out, resume: bool, overwrite: bool, lock: OutputLock, roi) -> Optional[dict]:
        """Raise the OutputExistsError that :meth:`prepare` would for an output that neither ``resume`` nor
        ``overwrite`` lets this run touch, before the model is first called (:meth:`prepare` needs the model's
        channels); ``roi``, this run's, for its words. The caller holds ``lock``. Returns the record of an output
        ``resume`` may continue."""
        container, dataset, kind = parse_output(out, companions=(FLAGS_SUFFIX,))
        store = cls(container, dataset, kind)
        try:
            store._writer.open_to_check()
            return store._writer.refuse_untouchable(lock, resume, overwrite, "prediction",
                                                    {"roi": [list(corner) for corner in roi]})
        finally:
            store.close()

    def _create_flags(self, grid) -> None:
        self._flags = self._writer.create_companion(self.flags_name, tuple(grid), np.uint8, {FLAGS_RECORD: True})

    @classmethod
    def reopen(cls, container: Path, dataset: str, kind: str) -> "OutputStore":
        store = cls(container, dataset, kind)
        store._writer.open()
        store._writer.array = store._writer.node(dataset)
        store._flags = store._writer.node(store.flags_name)
        return store

    def _check_flags(self, previous: dict) -> None:
        """Refuse to resume an unfinished prediction whose finished-block flags are gone."""
        if not previous.get("complete", False) and self._writer.node(self.flags_name) is None:
            raise OutputExistsError(f"{self.path} is an unfinished prediction without its record of finished "
                                    f"blocks ({self.flags_name}); pass {option('overwrite')} to start again")

    def _finished(self, grid, complete: bool, box) -> Set[int]:
        """The blocks of ``box`` finished: their flags are read, not the whole grid's (a small roi of a huge
        volume has few of its 10^8 blocks)."""
        self._flags = self._writer.node(self.flags_name)
        first, end = (np.asarray(corner) for corner in box)
        positions = np.stack(np.meshgrid(*(np.arange(a, b) for a, b in zip(first, end)), indexing="ij"), axis=-1)
        if not complete:
            positions = positions[self._flags[tuple(slice(a, b) for a, b in zip(first, end))].astype(bool)]
        return set(np.ravel_multi_index(positions.reshape(-1, 3).T, tuple(grid)).tolist())

    def write(self, start, data: np.ndarray, encoding: Optional[Executor] = None) -> None:
        """Write ``data`` (channels, z, y, x) with its first voxel at ``start``; in HDF5, flushed to the file
        before returning, so that a block is flagged only once its data is on disk. ``encoding``: a pool the
        zarr chunks are encoded on (see :meth:`~emfast.io.OutputWriter.write`)."""
        self._writer.write(start, data, encoding)

    def mark(self, index: int, grid) -> None:
        """Record block ``index`` (numbered in C order of ``grid``) as finished."""
        position = tuple(int(i) for i in np.unravel_index(index, tuple(grid)))
        if self.kind == "hdf5":
            self._flags[position] = 1
            self._writer.root.flush()
            return
        # The flag's one-element chunk written as a file: through zarr-python, an event-loop round trip that held
        # a writer thread for milliseconds per block.
        if self._flag_files is False:
            self._flag_files = chunk_files(self._flags)
        if self._flag_files is None:
            self._flags[position] = 1
        else:
            self._flag_files.write(position, np.ones((1,) * len(position), np.uint8))

    def finish(self) -> None:
        """Record the prediction as complete and drop the flags (nothing to do if it was complete already; only
        the flags to drop if a run was killed between the two)."""
        if self._flags is None:
            return
        record = self._writer.record()
        if not record.get("complete", False):
            self._writer.set_record(dict(record, complete=True))
        self._writer.delete(self.flags_name)
        self._flags, self._flag_files = None, False

    def close(self) -> None:
        self._writer.close()
        self._flags, self._flag_files = None, False


def prediction_complete(out) -> bool:
    """Whether ``out`` holds a prediction emfast finished (its record says complete, and no killed run's mark
    says it was being made): a rerun with ``resume`` leaves it as it is and never calls the model. A look, without
    the output's lock (taking it would consume a killed run's mark, which the run itself must find): the run
    checks again under the lock, with the rerun's settings and input."""
    container, dataset, kind = parse_output(out, companions=(FLAGS_SUFFIX,))
    if not container.exists() or OutputLock(container).marked_creating() == dataset:
        return False
    store = OutputStore(container, dataset, kind)
    try:
        store._writer.open_to_check()
        record = store._writer.record()
    finally:
        store.close()
    return isinstance(record, dict) and record.get("complete") is True
