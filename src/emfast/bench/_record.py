"""The :class:`Record` of a run: every measurement kept, logged and written as it is taken."""
from __future__ import annotations

import json
import os
from typing import List, Optional

import numpy as np

from ._host import log
from ._settings import SCHEMA, MiB


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def measurement_line(entry: dict) -> str:
    """One measurement of :class:`Record` as a line of text, as it is logged and as a failed run reports it."""
    if entry["stage"] == "comparison":
        return f"  round {entry['round']}: {entry['label']:<40} {entry['batches_per_s']:8.1f} batches/s"
    if entry["curve"] == "slots":
        return f"  curve slots={entry['slots']}: peak RSS {entry['peak_rss'] / MiB:.1f} MiB"
    where = f"batch {entry['batch_size']} x {tuple(entry['patch'])}"
    threads = f", threads={entry['threads']}" if "threads" in entry else ""
    pass_ = f", pass {entry['pass']}" if "pass" in entry else ""
    return f"  curve {entry['curve']}: {where}{threads}{pass_}: {entry['batches_per_s']:.1f} batches/s"


class Record:
    """The result of a run as it grows: every measurement is added, logged and (with a JSON path) written the
    moment it is taken, so that a run which fails or is interrupted late still leaves every number it measured.

    The JSON file is rewritten whole after each measurement (through a temporary file beside it, so it is never
    half written). ``"complete"`` stays false until the run ends; a failed run adds ``"error"``.

    Parameters
    ----------
    path : str, optional
        The ``--json`` file.
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self.result: dict = {"schema": SCHEMA, "complete": False, "measurements": []}

    def update(self, **values) -> None:
        """Set top-level entries of the result."""
        self.result.update(_jsonable(values))
        self.save()

    def measured(self, entry: dict) -> None:
        """One measurement, just taken."""
        self.result["measurements"].append(_jsonable(entry))
        log(measurement_line(entry))
        self.save()

    def failed(self, error: BaseException) -> None:
        """Note what stopped the run, keeping what was measured before."""
        self.update(error=f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)

    def save(self) -> None:
        if self.path is None:
            return
        temporary = f"{self.path}.partial"
        with open(temporary, "w") as f:
            json.dump(self.result, f, indent=1)
        os.replace(temporary, self.path)

    def partial_report(self) -> List[str]:
        """What a run that did not finish measured, and what stopped it (nothing where it measured nothing: the
        error is told on its own)."""
        measurements = self.result["measurements"]
        if not measurements:
            return []
        lines = [f"emfast bench stopped ({self.result.get('error', 'interrupted')}); "
                 f"{len(measurements)} measurement(s) taken before:"]
        lines.extend(measurement_line(entry) for entry in measurements)
        if self.path is not None:
            lines.append(f"every one of them is in {self.path}")
        return lines
