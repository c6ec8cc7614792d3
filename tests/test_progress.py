"""The one progress bar of emfast's commands: plain lines at a modest rate in a log, one line redrawn in place on
a terminal, counts in the right number, and no time left promised before anything was timed."""
import io
import re

from emfast.io import _progress, progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_plain_lines_at_a_modest_rate():
    log = io.StringIO()
    bar = progress_bar(log, unit="tile")
    for done in range(1001):
        bar(done, 1000)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert 2 <= len(lines) <= 12  # every tenth of the work, not every tile
    assert lines[0].endswith("0/1000 tiles, estimating the time left")  # not "0 s left" before any tile
    assert re.search(r"\] 100/1000 tiles, about \d+ s left$", lines[1])
    assert lines[-1].startswith("[########################] 1000/1000 tiles, done in")


def test_one_unit_is_singular():
    log = io.StringIO()
    bar = progress_bar(log, unit="block")
    bar(0, 1)
    bar(1, 1)
    assert log.getvalue().splitlines() == ["[........................] 0/1 block, estimating the time left",
                                           "[########################] 1/1 block, done in 0 s"]


def test_a_terminal_gets_one_line_redrawn_in_place(monkeypatch):
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 60.0)  # however slow the machine, these calls are quick
    terminal = Terminal()
    bar = progress_bar(terminal, unit="tile")
    for done in range(4):
        bar(done, 3)
    text = terminal.getvalue()
    assert text.startswith("\r[") and text.endswith("\n") and text.count("\n") == 1
    assert text.rstrip().endswith("3/3 tiles, done in 0 s")
    assert text.count("\r") == 2  # redrawn at most every REDRAW_SECONDS: the first and the last call


def _screen(text: str) -> str:
    """What a terminal shows of ``text``: each carriage return goes back to the line's start, overwriting."""
    shown = ""
    for part in text.split("\r"):
        shown = part + shown[len(part):]
    return shown


def test_a_shorter_line_redrawn_in_place_covers_the_longer_one_before_it(monkeypatch):
    """'estimating the time left' then 'done in 1 s' showed as '... done in 1 s he time left'."""
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 0.0)
    terminal = Terminal()
    bar = progress_bar(terminal, unit="tile")
    bar(0, 1)
    bar(1, 1)
    assert _screen(terminal.getvalue().rstrip("\n")).rstrip() == "[########################] 1/1 tile, done in 0 s"


def test_a_line_redrawn_in_place_fits_the_terminals_width(monkeypatch):
    """predict's line (83 characters) wrapped on an 80-column terminal, where the carriage return goes back to
    its last row only: a new row per redraw (15 rows in 26 s, a helper saw under tmux)."""
    from emfast.io._progress import ProgressBar
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 0.0)
    for columns in (80, 40, 20):
        monkeypatch.setenv("COLUMNS", str(columns))
        terminal = Terminal()
        bar = ProgressBar(16, voxels_per_unit=10 ** 6, stream=terminal, unit="block")
        for done in range(17):
            bar.update(done)
        drawn = terminal.getvalue().rstrip("\n").split("\r")[1:]
        assert drawn and all(len(part) <= columns - 1 for part in drawn), (columns, max(map(len, drawn)))
        assert drawn[-1].startswith("[########################] 16/16 blocks"[:columns - 2])


def test_the_width_is_that_of_the_terminal_the_bar_writes_to(monkeypatch):
    """shutil asks standard output's terminal, which ``emfast predict ... > log`` makes a file: the bar on a
    60-column terminal was cut to 78 (a review)."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    from emfast.io._progress import ProgressBar
    monkeypatch.delenv("COLUMNS", raising=False)
    main, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
    with open(follower, "w", closefd=True) as terminal:
        assert ProgressBar(16, stream=terminal)._columns() == 60
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))  # never sized (CI, containers)
        assert ProgressBar(16, stream=terminal)._columns() > 20  # not cut to one character (a review)
        monkeypatch.setenv("COLUMNS", "0")
        assert ProgressBar(16, stream=terminal)._columns() > 20
    os.close(main)
