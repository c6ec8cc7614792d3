"""The one progress bar of emfast's commands (demo, convert, predict).

On a terminal it redraws one line in place, at most every :data:`REDRAW_SECONDS`, cut to the terminal's width (a
longer line wraps, and the carriage return then goes back to its last row only: a new row per redraw); on anything
else (a log file, a pipe) it writes plain lines, one per :data:`LINE_FRACTION` of the work or per
:data:`LINE_SECONDS`, so logs hold no carriage returns and stay short. The time left is "estimating" until the first
unit is done.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Optional, TextIO

REDRAW_SECONDS = 0.1
LINE_FRACTION = 0.1
LINE_SECONDS = 60.0
WIDTH = 24


def plural(count: int, unit: str) -> str:
    """``unit`` as counted ``count`` times, without the count: "tile" for 1, "tiles" for 2."""
    return unit if count == 1 else unit + ("es" if unit.endswith(("s", "ch", "sh", "x")) else "s")


class ProgressBar:
    """Progress of ``total`` units of work, drawn on ``stream`` (default: standard error).

    Parameters
    ----------
    total : int
        Units in all (a later :meth:`update` may give another total).
    voxels_per_unit : int, optional
        With it, the line shows units/s and Mvoxel/s instead of the time left.
    stream : text stream, optional
    unit : str
        What is counted, singular ("batch", "tile", "block").

    Call it as ``bar(done, total)`` (the ``progress`` callback of convert and predict) or ``bar.update(done)``;
    :meth:`finish` ends a line redrawn in place.
    """

    def __init__(self, total: int, voxels_per_unit: Optional[int] = None, stream: Optional[TextIO] = None,
                 unit: str = "batch") -> None:
        self.total, self.voxels_per_unit, self.unit = total, voxels_per_unit, unit
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty())
        self.start = time.monotonic()
        self._first_done: Optional[tuple] = None  # (units done, time) when counting began: resumed work is not timed
        self._drawn_at = -float("inf")
        self._line_done = None
        self._open_line = False
        self._drawn_width = 0  # of the line last drawn in place

    def __call__(self, done: int, total: int) -> None:
        self.update(done, total)

    def line(self, done: int) -> str:
        """The progress line for ``done`` units."""
        filled = int(WIDTH * done / self.total) if self.total else WIDTH
        text = f"[{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{self.total} {plural(self.total, self.unit)}"
        return text + ", " + (self._rates(done) if self.voxels_per_unit else self._time_left(done))

    def _rates(self, done: int) -> str:
        rate = done / max(time.monotonic() - self.start, 1e-9)
        return f"{rate:7.1f} {plural(2, self.unit)}/s  {rate * self.voxels_per_unit / 1e6:8.1f} Mvoxel/s"

    def _time_left(self, done: int) -> str:
        if done >= self.total:
            return f"done in {time.monotonic() - self.start:.0f} s"
        start_done, start_time = self._first_done
        if done <= start_done:
            return "estimating the time left"
        seconds = (time.monotonic() - start_time) / (done - start_done) * (self.total - done)
        return f"about {seconds:.0f} s left"

    def update(self, done: int, total: Optional[int] = None) -> None:
        """Show ``done`` units (of ``total``, if given) finished."""
        if total is not None:
            self.total = total
        now = time.monotonic()
        if self._first_done is None:
            self._first_done = (done, now)
        finished = done >= self.total
        if self.interactive:
            if finished or now - self._drawn_at >= REDRAW_SECONDS:
                # within the width less one column (a character in the last one wraps on many terminals), padded
                # over what a longer line before it left on the screen
                line = self.line(done)[:max(1, self._columns() - 2)]
                self.stream.write("\r" + line.ljust(self._drawn_width) + " ")
                self._drawn_width = len(line)
                self._open_line = True
                self._drawn_at = now
                if finished:
                    self.finish()
        elif self._line_due(done, now, finished):
            self.stream.write(self.line(done) + "\n")
            self._line_done, self._drawn_at = done, now
        self.stream.flush()

    def _columns(self) -> int:
        """The width of the terminal the bar writes to (``COLUMNS`` if set): shutil asks standard output's, which
        ``emfast predict ... > log`` sends to a file (80 columns then assumed, where the bar's terminal may be 60)."""
        if os.environ.get("COLUMNS", "").isdigit() and int(os.environ["COLUMNS"]) > 0:
            return int(os.environ["COLUMNS"])
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # no descriptor (a StringIO), or none of a terminal
            columns = 0
        return columns if columns > 0 else shutil.get_terminal_size().columns  # 0: a terminal never sized

    def _line_due(self, done: int, now: float, finished: bool) -> bool:
        if self._line_done is None:
            return True
        if done == self._line_done:
            return False
        return finished or done - self._line_done >= LINE_FRACTION * self.total or now - self._drawn_at >= LINE_SECONDS

    def finish(self) -> None:
        """End the line redrawn in place (nothing to do for plain lines)."""
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False


def progress_bar(stream: Optional[TextIO] = None, unit: str = "tile") -> ProgressBar:
    """A :class:`ProgressBar` counting ``unit`` with the time left, as a ``progress(done, total)`` callback."""
    return ProgressBar(0, stream=stream, unit=unit)
