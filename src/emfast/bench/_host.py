"""The machine a benchmark runs on: its description for every report, this process's memory, and what it left
running (threads, child processes)."""
from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import threading
from typing import List, Optional, Sequence

import numpy as np

from .. import __version__
from .._machine import cores, read_proc_field


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    """Resident set size of this process now (VmRSS), in bytes."""
    value = read_proc_field("/proc/self/status", "VmRSS")
    if value is not None:
        return int(value.split()[0]) * 1024
    import resource  # fallback: peak RSS only (kB on Linux), better than nothing
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def machine_info() -> dict:
    """CPU model, cores, memory, load and software versions: the header of every benchmark report."""

    mem = read_proc_field("/proc/meminfo", "MemTotal")
    try:
        load = tuple(round(v, 2) for v in os.getloadavg())
    except OSError:
        load = None
    return {
        "cpu": read_proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": cores(),
        "memory_gib": round(int(mem.split()[0]) / 2**20, 1) if mem else None,
        "load_average": load,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "emfast": __version__,
        "platform": sys.platform,
    }


def torch_version() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def child_pids() -> List[int]:
    """Live child processes of this process."""
    pids = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
    except OSError:
        pids.update(child.pid for child in multiprocessing.active_children())
    return sorted(pids)


def leftovers(threads_before: Sequence[threading.Thread], children_before: Sequence[int]) -> dict:
    """Threads and child processes started since ``threads_before`` and ``children_before`` were taken and still
    alive (should be none). Only what started since counts: a process the caller had running before, such as
    multiprocessing's resource tracker, is not the benchmark's."""
    threads = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    return {"threads": threads, "processes": [pid for pid in child_pids() if pid not in children_before]}


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
