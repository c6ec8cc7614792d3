"""The iterator ``iter(loader)`` returns: the batches to the end of an epoch, as an object rather than a generator.

A generator is finished for good once an exception leaves it: after a Ctrl-C in a notebook cell, or a
``SlotsExhaustedError``, ``next(it)`` raised a bare ``StopIteration`` on an endless loader (a review). This iterator
stays usable after any exception raised by one ``next``, as a torch ``DataLoader``'s does: the next call takes the
next batch of the stream (the loader loses and repeats none).
"""
from __future__ import annotations

import threading
from typing import Optional

from ..io import ProgressBar
from ._batch import Batch


class EpochIterator:
    """Batches of ``loader`` to the end of the epoch the first one belongs to (forever without ``epoch_size``),
    with the loader's progress bar of that epoch."""

    def __init__(self, loader) -> None:  # the Loader, whose module imports this one
        self._loader = loader
        self._epoch: Optional[int] = None
        self._ended = False
        self._bar: Optional[ProgressBar] = None
        self._started = False

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> Batch:
        loader = self._loader
        if self._ended:
            self._end()
        if not self._started:
            loader.start()
            if loader.progress and loader.epoch_size is not None:
                self._bar = ProgressBar(loader.epoch_size)
            self._started = True
        if self._epoch is not None and loader._epoch_ended.get(threading.get_ident()) == self._epoch:
            self._end()  # this thread took the epoch's last batch outside the loop (snapshot(), next_batch())
        try:
            batch = loader.next_batch()
        except BaseException:
            if self._bar is not None:
                self._bar.finish()  # the traceback on a line of its own; the bar goes on at the next batch
            raise
        self._epoch = batch.epoch if self._epoch is None else self._epoch
        if self._bar is not None:
            self._bar.update(batch.index + 1)
        if loader.epoch_size is not None and batch.index == loader.epoch_size - 1:
            self._ended = True  # the next call ends the iteration
        return batch

    def _end(self) -> None:
        self._ended = True
        self.close()
        raise StopIteration

    def close(self) -> None:
        """End the progress bar's line (a loop left early, or the iterator dropped)."""
        if self._bar is not None:
            self._bar.finish()

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, ValueError):  # standard error closed at the interpreter's exit
            pass
