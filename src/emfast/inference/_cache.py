"""Predictions of shared tiles, kept for the other blocks that blend them.

A tile whose output reaches into more than one block is computed by the first of those blocks to run; its
predictions (every test-time variant, as the model returned them) are saved here, and the other blocks load them
instead of calling the model again. The folder lies beside the output's container, named
``.<container>+<dataset>.emfast-tiles`` ('%', '/' and '+' of the dataset percent-encoded, so that no two outputs
share a name: with '/' written as '.', ``s.zarr/h5/p`` and ``s.zarr.h5/p``, under two locks, did; a dataset whose
name would make it longer than a file name may be, by its digest), holds one ``.npy`` file per tile (written under a
temporary name, then renamed, so a reader never sees half a file) and the prediction's record (``record.json``):
tiles are used only by a run with the same record, so a folder left by another prediction is emptied, never read.
The folder lives as long as the prediction is unfinished (a resume uses what it holds) and is removed when it
completes.

In the local engine the tiles are kept in memory first, up to a share of the budget (``memory_limit``), and
only those beyond it go to the folder: most are blended again a block or a row of blocks later. A copy sent to
another process (a Dask worker) keeps its tiles in the folder only.

A tile missing from the folder (never saved, removed, or not savable on a full disk) is computed again: that costs
time, never correctness, since a tile's prediction does not depend on which block asked for it.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from ..io import REMOVING_TAIL, remove_folder, remove_leftovers, unique_beside

#: The file in the folder holding the record of the prediction its tiles belong to.
RECORD_FILE = "record.json"
#: The most bytes of a file name on common file systems (ext4, XFS, APFS, NTFS in UTF-16 units).
NAME_MAX = 255
#: What a folder of kept tiles is renamed with to be deleted (then a unique tail, see ``remove_folder``).
REMOVING = ".emfast-removing"


class TileCache:
    """The folder of kept tiles of one prediction (picklable: Dask workers reopen it by path)."""

    def __init__(self, folder: Path, memory_limit: int = 0) -> None:
        self.folder = Path(folder)
        self.memory_limit = memory_limit
        self._held: Dict[tuple, np.ndarray] = {}
        self._held_bytes = 0
        self._lock = threading.Lock()
        self._warned = False
        #: The names of the tile files in the folder, known where this process alone writes it (see :meth:`open`):
        #: asking the folder for each shared tile (a stat) cost a prediction's feeding thread 13.6 ms of GIL waits
        #: (48 shared tiles of the identity benchmark).
        #: None: ask the folder (a Dask worker's copy, beside other workers writing it).
        self._files: Optional[set] = None
        #: Where earlier versions of emfast kept this output's tiles (see :meth:`beside`): removed with the folder;
        #: an unfinished run's tiles there are computed again, not read.
        self.legacy: Optional[Path] = None

    def __getstate__(self) -> dict:
        return {"folder": self.folder.absolute(), "memory_limit": 0, "_warned": False}  # workers run elsewhere

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"], state["memory_limit"])

    @classmethod
    def beside(cls, container: Path, dataset: str, memory_limit: int = 0) -> "TileCache":
        escaped = dataset.replace("%", "%25").replace("/", "%2F").replace("+", "%2B")
        name = f".{container.name}+{escaped}.emfast-tiles"
        if not _fits(name):  # a long (or long non-ASCII) name: the output's digest instead
            name = f".{hashlib.sha256(f'{container.name}/{dataset}'.encode()).hexdigest()[:32]}.emfast-tiles"
        cache = cls(container.parent / name, memory_limit)
        legacy = f".{container.name}.{dataset.replace('/', '.')}.emfast-tiles"
        # none could be made; one with a '+' may be another output's folder now, in use by a run of its own
        cache.legacy = container.parent / legacy if _fits(legacy) and "+" not in legacy else None
        return cache

    def open(self, record: dict, resume: bool) -> None:
        """Start using the folder for the prediction with ``record``: kept tiles are reused when resuming the
        same prediction, and removed otherwise."""
        wanted = json.dumps(record, sort_keys=True)
        if resume and self._record() == wanted:
            self._files = {path.name for path in self.folder.iterdir()}
            return
        self.remove()
        if self.folder.exists():  # an earlier prediction's, which could not be removed: never taken for this one's
            raise FileExistsError(f"{self.folder} holds the kept tiles of an earlier prediction and could not be "
                                  "removed; delete it yourself")
        # made whole under a name of its own, then renamed into place: a run killed before the rename leaves a
        # folder the next run deletes as a removal's leftover (made in place, a kill between the folder and its
        # record left one no run would touch, and every later run was refused)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        made = unique_beside(self.folder.parent / f"{self.folder.name}{REMOVING}")
        made.mkdir()
        (made / RECORD_FILE).write_text(wanted)
        os.rename(made, self.folder)
        self._files = set()

    def _record(self) -> Optional[str]:
        try:
            return (self.folder / RECORD_FILE).read_text()
        except OSError:
            return None

    def _path(self, key) -> Path:
        return self.folder / ("_".join(map(str, key)) + ".npy")

    def has(self, key) -> bool:
        if key in self._held:
            return True
        path = self._path(key)
        return path.is_file() if self._files is None else path.name in self._files

    def load(self, key) -> Optional[np.ndarray]:
        """The predictions kept for tile ``key``, shape (variants, channels, z, y, x); None if there are none."""
        held = self._held.get(key)
        if held is not None:
            return held
        try:
            return np.load(self._path(key), allow_pickle=False)
        except FileNotFoundError:
            return None

    def save(self, key, predictions: np.ndarray) -> bool:
        """Keep ``predictions`` for tile ``key``: in memory while within ``memory_limit``, else in the folder; a
        failure to write (a full disk) only means it will be computed again. Returns whether the array itself is
        held (else its memory may be reused)."""
        with self._lock:
            if self._held_bytes + predictions.nbytes <= self.memory_limit:
                self._held[key] = predictions
                self._held_bytes += predictions.nbytes
                return True
        self._write(key, predictions)
        return False

    def spill(self) -> None:
        """Write the tiles held in memory to the folder (a run that stops early: its resume reads them)."""
        with self._lock:
            held, self._held, self._held_bytes = self._held, {}, 0
        for key, predictions in held.items():
            self._write(key, predictions)

    def _write(self, key, predictions: np.ndarray) -> None:
        path = self._path(key)
        temporary = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.partial")
        try:
            with open(temporary, "wb") as stream:
                np.save(stream, predictions, allow_pickle=False)
            os.replace(temporary, path)
            if self._files is not None:
                self._files.add(path.name)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            if not self._warned:
                self._warned = True
                warnings.warn(f"could not keep a shared tile's prediction in {self.folder} ({error}); the blocks "
                              "that share it compute it again", RuntimeWarning, stacklevel=2)

    def discard(self, key) -> Optional[np.ndarray]:
        """Drop tile ``key``: every block that shares it has blended it. Returns its predictions if they were held
        in memory (no block reads them any more: their memory may be reused)."""
        with self._lock:
            held = self._held.pop(key, None)
            if held is not None:
                self._held_bytes -= held.nbytes
                return held
        path = self._path(key)
        path.unlink(missing_ok=True)
        if self._files is not None:
            self._files.discard(path.name)
        return None

    def remove(self) -> None:
        """Delete the folder (and an earlier version's, :attr:`legacy`), if it is one of emfast's (it holds the
        record file), and forget the tiles held."""
        with self._lock:
            self._held.clear()
            self._held_bytes = 0
            if self._files is not None:
                self._files.clear()
        if self.legacy is not None:
            _remove_kept(self.legacy)
        if not _remove_kept(self.folder, empty_is_ours=True) and (self.folder.exists() or self.folder.is_symlink()):
            raise FileExistsError(f"{self.folder} exists and was not made by emfast predict; emfast keeps shared "
                                  "tiles there: move it away")


def _fits(name: str) -> bool:
    """Whether a folder of kept tiles may be named ``name``, and moved aside to be deleted (see
    :func:`_remove_kept`), within a file name's bytes."""
    return len(os.fsencode(f"{name}{REMOVING}{REMOVING_TAIL}")) <= NAME_MAX


def _remove_kept(folder: Path, empty_is_ours: bool = False) -> bool:
    """Delete ``folder`` if it is a folder of kept tiles (it holds the record file; ``empty_is_ours``: or nothing);
    whether it was one. A failure is a warning: kept tiles are scratch, so what cannot be deleted loses nothing."""
    aside = folder.parent / f"{folder.name}{REMOVING}"
    remove_leftovers(aside)
    if not (folder.is_dir() and not folder.is_symlink()):
        return False
    if not (folder / RECORD_FILE).is_file():
        if not empty_is_ours:
            return False
        try:  # not emfast's, unless empty: as a run killed between making it and its record left it before
            folder.rmdir()
        except OSError:
            return False
        return True
    try:
        remove_folder(folder, aside)  # whole or not at all: half of it would not be known for emfast's
    except OSError as error:
        warnings.warn(f"could not remove the kept tiles of {folder.name} ({error}); delete it yourself",
                      stacklevel=3)
    return True
