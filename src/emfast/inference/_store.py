"""The prediction's output: a zarr array or an HDF5 dataset of shape (channels, z, y, x), and beside it a record
of which blocks are finished, so that an interrupted run resumes where it stopped.

The output's attributes hold ``emfast_predict``: the input as it was, every setting that decides the result, the
model's name, the emfast version, and ``complete``; the output is created with it. Finished blocks are flagged
in a small uint8 array named ``<dataset>.blocks``, one element per block and, in zarr, one chunk per element, so
that concurrent workers never write the same chunk. A block's flag is set only after all its chunks were written
(in HDF5: flushed to the file); the flag array is deleted when every block is done.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
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
#: The names of the dtypes a prediction may be written as (``predict(dtype=...)``); the loader's batch dtypes
#: (``OUTPUT_DTYPES`` in ``emfast.pipeline._loader``) are another list, of NumPy dtypes.
PREDICT_OUTPUT_DTYPE_NAMES = ("float32", "float16", "uint8")
__all__ = ["COMPRESSIONS", "PREDICT_OUTPUT_DTYPE_NAMES", "BlockWriteError", "OpeningCancelled", "OutputExistsError",
           "OutputOpening", "OutputStore", "check_compression", "parse_output"]


class OutputExistsError(FileExistsError):
    """The output exists and may not be replaced, or it is a prediction with other settings."""


class BlockWriteError(OSError):
    """Writing a block failed (a full disk, a lost mount); the store is left resumable."""


class OutputStore:
    """A prediction output opened for writing: the output array (written by the shared
    :class:`~emfast.io.OutputWriter`) and its finished-block flags. Build one with :meth:`prepare`; reopen it in
    another process with :meth:`reopen` (what Dask workers do)."""

    def __init__(self, container: Path, dataset: str, kind: str) -> None:
        self.container, self.dataset, self.kind = container, dataset, kind
        self.flags_name = dataset + ".blocks"
        self._writer = OutputWriter(container, dataset, kind, RECORD, refused=OutputExistsError)
        self._flags = None
        self._flag_files = False  # zarr: the ChunkFiles writing the flags' chunks (None: zarr-python); unknown yet
        #: Whether :meth:`prepare` opened an existing output to resume it (rather than creating it).
        self.resumed = False

    @property
    def path(self) -> str:
        return f"{self.container}/{self.dataset}"

    @classmethod
    def prepare(cls, out, shape, dtype: str, chunks, compression: str, grid, record: dict, attributes: dict,
                resume: bool, overwrite: bool, lock: OutputLock) -> Tuple["OutputStore", Set[int]]:
        """Create the output, or open it to resume; returns the store and the blocks already finished. The
        caller holds ``lock``, the output's :class:`~emfast.io._outputs.OutputLock`. ``attributes`` may hold the
        input's ``resolution`` and ``offset`` (z, y, x nm), written in every convention the field reads.

        Raises
        ------
        OutputExistsError
            The output exists and neither ``resume`` (with the same record and input) nor ``overwrite`` was given,
            or ``overwrite`` was given for something emfast did not write (another program's array, a group, a
            link).
        """
        container, dataset, kind = parse_output(out)
        compression = check_compression(compression, kind)
        store = cls(container, dataset, kind)
        store._writer.open()
        try:
            attributes = dict(attributes)
            previous = store._writer.prepare(
                lock, dict(record, complete=False), resume=resume, overwrite=overwrite, input_key="input",
                what="prediction", unchecked=PROVENANCE, companions=(store.flags_name,),
                create=lambda: store._create_flags(grid), shape=shape, dtype=dtype, chunks=chunks,
                compression=compression, resolution=attributes.pop("resolution", None),
                offset=attributes.pop("offset", None), attributes=attributes)
            if previous is None:
                return store, set()
            store.resumed = True
            return store, store._finished(grid, previous.get("complete", False))
        except BaseException:
            store.close()
            raise

    def _create_flags(self, grid) -> None:
        self._flags = self._writer.create_companion(self.flags_name, tuple(grid), np.uint8, {FLAGS_RECORD: True})

    @classmethod
    def reopen(cls, container: Path, dataset: str, kind: str) -> "OutputStore":
        store = cls(container, dataset, kind)
        store._writer.open()
        store._writer.array = store._writer.node(dataset)
        store._flags = store._writer.node(store.flags_name)
        return store

    def _finished(self, grid, complete: bool) -> Set[int]:
        self._flags = self._writer.node(self.flags_name)
        if complete:
            return set(range(int(np.prod(grid))))
        if self._flags is None:
            raise OutputExistsError(f"{self.path} is an unfinished prediction without its record of finished "
                                    f"blocks ({self.flags_name}); pass {option('overwrite')} to start again")
        return set(int(i) for i in np.flatnonzero(self._flags[...]))

    def write(self, start, data: np.ndarray) -> None:
        """Write ``data`` (channels, z, y, x) with its first voxel at ``start``; in HDF5, flushed to the file
        before returning, so that a block is flagged only once its data is on disk."""
        self._writer.write(start, data)

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
        """Record the prediction as complete and drop the flags (nothing to do if it was complete already)."""
        if self._flags is None:
            return
        self._writer.set_record(dict(self._writer.record(), complete=True))
        self._writer.delete(self.flags_name)
        self._flags, self._flag_files = None, False

    def close(self) -> None:
        self._writer.close()
        self._flags, self._flag_files = None, False


class OpeningCancelled(Exception):
    """The run ended before its output was opened: the opening stopped before changing anything."""


class OutputOpening:
    """The output being opened by ``open_output(proceed)``, which returns the :class:`OutputStore` and the blocks
    already finished, and calls ``proceed()`` before each step that changes the output or the tile folder. With
    ``concurrently``, it runs on a thread of its own while the first blocks are computed: hashing the input for the
    record and creating the arrays take tens of milliseconds, in which the network can already run, and nothing
    is written before the first block is finished. Without, it runs here (a resume needs the finished blocks
    before choosing what to compute), and its error is raised here.

    Always :meth:`close` it, under the output's lock: a run that failed stops the opening at its next step (an
    output being replaced is then left as it was), and the thread is waited for, through Ctrl-C too, so that it
    never outlives the lock; then the store is closed if it was opened."""

    def __init__(self, open_output: Callable[[Callable[[], None]], Tuple[OutputStore, Set[int]]],
                 concurrently: bool) -> None:
        self._opened: Future = Future()
        self._cancelled = threading.Event()
        self._traceback = None
        self._thread: Optional[threading.Thread] = None
        self._ended = threading.Event()
        if not concurrently:
            self._opened.set_result(open_output(self._proceed))
            self._ended.set()
            return

        def run() -> None:
            try:
                self._opened.set_result(open_output(self._proceed))
            except BaseException as error:  # raised by whoever asks for the store
                self._traceback = error.__traceback__
                self._opened.set_exception(error)
            finally:
                self._ended.set()

        self._thread = threading.Thread(target=run, name="emfast-predict-open", daemon=True)
        self._thread.start()

    def _proceed(self) -> None:
        if self._cancelled.is_set():
            raise OpeningCancelled("the run ended before its output was opened")

    def _error(self) -> Optional[BaseException]:
        """The opening's error (once it ended) with the opening's own traceback: it is raised on several threads,
        and each raise would add its frames to the last one's."""
        error = self._opened.exception()
        return None if error is None else error.with_traceback(self._traceback)

    def store(self) -> OutputStore:
        """The store, once opened; raises the error that kept it from opening."""
        error = self._error()
        if error is not None:
            raise error
        return self._opened.result()[0]

    def finished(self) -> Set[int]:
        """The blocks a resumed output holds already (waits for the opening; raises its error)."""
        self.store()
        return self._opened.result()[1]

    def raise_if_failed(self) -> None:
        """Raise the opening's error if it has failed already; do not wait."""
        if self._opened.done():
            self.store()

    def failure(self) -> Optional[BaseException]:
        """For a run that failed: stop the opening at its next step, wait for it, and return the error that kept it
        from opening (None if it opened, or stopped as asked)."""
        self._cancelled.set()
        self._join()
        error = self._error()
        return None if isinstance(error, OpeningCancelled) else error

    def close(self) -> None:
        self._cancelled.set()  # a run that succeeded has its store: this stops nothing
        self._join()
        if self._opened.exception() is None:
            self._opened.result()[0].close()

    def _join(self) -> None:
        """Wait for the thread, a Ctrl-C meanwhile raised once it has ended. (On an event: Python 3.11's
        ``Thread.join``, interrupted, marks the thread ended while it still runs.)"""
        interrupted = None
        while not self._ended.is_set():
            try:
                self._ended.wait()
            except KeyboardInterrupt as error:
                interrupted = error
        if self._thread is not None:
            self._thread.join()  # it has set the event: its last step
        if interrupted is not None:
            raise interrupted
