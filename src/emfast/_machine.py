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
    """Memory available to new allocations: the least of the machine's (MemAvailable), what the process's cgroup
    leaves of its limit (a container's, a batch job's) and what ``RLIMIT_AS`` (``ulimit -v``) leaves of the address
    space; None where none is known. MemAvailable alone let a loader needing 5 GiB be built in a process limited to
    1.3 GiB, which then failed with NumPy's MemoryError naming none of its settings."""
    value = read_proc_field("/proc/meminfo", "MemAvailable")
    known = [int(value.split()[0]) * 1024] if value else []
    known += [left for left in (cgroup_memory_left(), address_space_left()) if left is not None]
    return min(known) if known else None


#: Limits above this are "none" (cgroup v1 writes 2**63 rounded down to a page for no limit).
NO_LIMIT = 1 << 60


def cgroup_memory_left(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[int]:
    """Bytes the process's memory cgroups leave: the least, over its cgroup and those above it (Slurm and systemd
    set the limit on a job or slice above the process's own), of the limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) less the usage (``memory.current``, ``memory.usage_in_bytes``) without the file
    cache, which the kernel reclaims (``memory.stat``'s file pages: a container that has read its data holds its
    limit in cache); None without a limit. A container that mounts its own cgroup at the root is read there."""
    try:
        with open(cgroups) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for fields in lines:
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: the unified hierarchy
            base, files = Path(root), ("memory.max", "memory.current", ("active_file", "inactive_file"))
        elif "memory" in controllers.split(","):  # v1
            base, files = Path(root) / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                  ("total_active_file", "total_inactive_file"))
        else:
            continue
        folder = base / path.strip("/")
        folders = [folder, *folder.parents[:len(folder.parents) - len(base.parents)]] if folder.is_dir() else [base]
        left = [n for n in (_cgroup_left(f, *files) for f in folders) if n is not None]
        return min(left) if left else None
    return None


def _cgroup_left(folder: Path, limit_file: str, usage_file: str, cached) -> Optional[int]:
    """What one cgroup folder's limit leaves (see :func:`cgroup_memory_left`), None without a limit there."""
    try:
        limit = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= NO_LIMIT:
        return None
    return max(0, int(limit) - usage + _file_cache(folder / "memory.stat", cached))


def _file_cache(stat: Path, keys) -> int:
    """The bytes of file pages a cgroup's ``memory.stat`` lists under ``keys`` (0 where it cannot be read)."""
    try:
        fields = dict(line.split() for line in stat.read_text().splitlines() if len(line.split()) == 2)
        return sum(int(fields.get(key, 0)) for key in keys)
    except (OSError, ValueError):
        return 0


def address_space_left() -> Optional[int]:
    """Bytes of address space ``RLIMIT_AS`` leaves this process (its soft limit less VmSize), or None without one."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    size = read_proc_field("/proc/self/status", "VmSize")
    return max(0, soft - int(size.split()[0]) * 1024) if size else None


def cache_directory(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where emfast caches what it derives (the demo volume, statistics): ``cache_dir``, else ``$EMFAST_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/emfast``, else ``~/.cache/emfast``."""
    if cache_dir is not None:
        if not os.fspath(cache_dir):  # "" is the working folder to Path: the volume landed there unasked
            raise ValueError("cache_dir (--cache-dir) is empty: give a folder, or leave it out for the default")
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
