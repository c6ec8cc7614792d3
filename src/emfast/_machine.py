"""What this machine offers: usable cores, available memory and the cache directory, for limits, caches and
benchmark reports."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def read_proc_field(path: str, key: str) -> Optional[str]:
    """The value of the line starting with ``key`` in a ``/proc`` file such as ``/proc/meminfo``, or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_bytes() -> Optional[int]:
    """Memory available to new allocations (MemAvailable), or None where unknown."""
    value = read_proc_field("/proc/meminfo", "MemAvailable")
    return int(value.split()[0]) * 1024 if value else None


def cache_directory(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where emfast caches what it derives (the demo volume, statistics): ``cache_dir``, else ``$EMFAST_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/emfast``, else ``~/.cache/emfast``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("EMFAST_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "emfast"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no HOME, and no home in the user database (a container run as --user N)
        raise FileNotFoundError("emfast has no folder to cache in: HOME is not set and this user has no home "
                                "directory; set EMFAST_CACHE_DIR (or pass --cache-dir)") from None
    return home / ".cache" / "emfast"


def add_cache_dir_option(parser) -> None:
    """Give an ``argparse`` parser the ``--cache-dir`` option every command that builds the built-in volume shares
    (read with :func:`cache_directory`)."""
    parser.add_argument("--cache-dir", default=None,
                        help="where the built-in volume is cached (default: $EMFAST_CACHE_DIR, else "
                             "$XDG_CACHE_HOME/emfast, else ~/.cache/emfast)")
