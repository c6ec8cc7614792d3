"""The Loader's options checked and normalised, with one wording for each refusal: counts, flags, the output
dtype, the sampler, the epoch size, the shard of the stream, and the thread count and batch memory the machine
can take (refused before anything is allocated).
"""
from __future__ import annotations

import copy
import functools
import sys
from typing import Any, Callable, Dict, Optional

import numpy as np

from .._checks import check_seed, flag, integer, patch_window, refusal
from .._machine import available_bytes
from .._registry import instantiate
from ..io import plural
from ..sampling import Sampler, Uniform

OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


class InsufficientMemoryError(MemoryError, ValueError):
    """The loader's batch slots would not fit in the memory available: refused before anything is allocated.

    A ValueError too, since the cause is an argument (batch size, patch, buffers, threads).
    """


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"


def output_dtype(dtype) -> np.dtype:
    """The raw output type: float32 or float16."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved not in OUTPUT_DTYPES:
        raise refusal(f"dtype must be 'float32' or 'float16', got {dtype!r}", "dtype")
    return resolved


#: The check of each Loader setting that needs no data, from its value alone. The Loader checks its arguments
#: with these, and a config's loader section its values before any volume is opened: one declaration, one
#: wording. (Settings that depend on others or on the data are checked where those meet: rank < world_size,
#: buffers <= max_buffers, the windows against the volumes, the device on this machine.)
LOADER_SETTINGS: Dict[str, Callable[[Any], Any]] = {
    **{name: functools.partial(patch_window, what=name) for name in ("patch", "patch_in", "patch_out")},
    **{name: functools.partial(integer, what=name) for name in ("batch_size", "threads", "world_size")},
    "rank": functools.partial(integer, what="rank", minimum=0),
    **{name: (lambda value, name=name: None if value is None else integer(value, name, 2))
       for name in ("buffers", "max_buffers")},
    "epoch_size": lambda value: None if value is None else integer(value, "epoch_size"),
    "seed": check_seed,
    "dtype": output_dtype,
    **{name: functools.partial(flag, name=name)
       for name in ("isotropic", "keep_labels", "worker_sharding", "progress", "close_data")},
}


def setting(name: str, value):
    """``value`` of the Loader setting ``name``, checked and normalised by :data:`LOADER_SETTINGS`."""
    return LOADER_SETTINGS[name](value)


def buffer_counts(threads: int, buffers: Optional[int], max_buffers: Optional[int]) -> tuple:
    """(buffers, max_buffers): batches in flight (None: ``threads + 2``, at least 2) and most slots (None: twice)."""
    buffers = max(2, threads + 2) if buffers is None else setting("buffers", buffers)
    max_buffers = 2 * buffers if max_buffers is None else setting("max_buffers", max_buffers)
    if max_buffers < buffers:
        raise refusal(f"max_buffers ({max_buffers}) must be at least buffers ({buffers})", "max_buffers")
    return buffers, max_buffers


def rank_and_world(rank, world_size) -> tuple:
    """(rank, world_size) of a distributed run, rank in [0, world_size)."""
    world_size = setting("world_size", world_size)
    checked = setting("rank", rank)
    if checked >= world_size:
        raise refusal(f"rank must be in [0, world_size) = [0, {world_size}), got {rank}", "rank")
    return checked, world_size


def loader_sampler(sampler) -> Sampler:
    """A copy of the sampler (or of the registered one named), so that one object can serve several loaders (bind()
    stores the regions); None: :class:`~emfast.Uniform`."""
    if isinstance(sampler, (list, tuple)):
        raise TypeError(f"sampler must be one sampler (an emfast sampler such as emfast.Uniform(), or its "
                        f"name), got {sampler!r}")
    return copy.copy(instantiate(sampler, "sampler", Sampler)[0]) if sampler is not None else Uniform()


def checked_epoch_size(epoch_size: Optional[int], sampler: Sampler) -> Optional[int]:
    """Batches per epoch: ``epoch_size``, or the epochs of a sampler that has its own (which it must then equal)."""
    finite = sampler.batches_per_epoch()
    if epoch_size is not None:
        epoch_size = setting("epoch_size", epoch_size)
        if finite is not None and epoch_size != finite:
            raise refusal(f"epoch_size={epoch_size}, but {sampler!r} has {finite} {plural(finite, 'batch')} per "
                          "epoch; leave epoch_size out", "epoch_size", section="loader")
    return finite if epoch_size is None else epoch_size


def torch_worker() -> Optional[tuple]:
    """(worker id, number of workers) when called inside a PyTorch DataLoader worker, else None."""
    torch = sys.modules.get("torch")  # never imported here: a process without torch has no torch workers
    if torch is None:
        return None
    info = torch.utils.data.get_worker_info()
    return None if info is None else (int(info.id), int(info.num_workers))


def check_memory(*, buffers: int, threads: int, slot_bytes: int, scratch_bytes: int, batch_size: int,
                 patch_in: tuple, cache_bytes: int = 0) -> None:
    """Refuse batch slots, scratch and the lazy volumes' chunk caches (``cache_bytes``, see
    :func:`chunk_cache_bytes`) beyond the memory available (or, where unknown, the address space)."""
    available = available_bytes()
    limit, where = (available, "of memory is available") if available is not None else \
        (sys.maxsize, "can be addressed")
    # slots at start plus one growth per producer, and each producer's scratch buffers; Python ints throughout
    count = buffers + threads
    scratch = threads * scratch_bytes
    needed = count * slot_bytes + scratch + cache_bytes
    if needed > limit:
        caches = f", plus {_gib(cache_bytes)} of the lazy volumes' chunk caches (cache_bytes)" if cache_bytes else ""
        raise InsufficientMemoryError(
            f"the loader needs {_gib(needed)} but only {_gib(limit)} {where}: {count} batch "
            f"slots (buffers={buffers}, plus one per producer thread) of {_gib(slot_bytes)} each "
            f"(batch_size={batch_size} x patch_in {patch_in}), plus {_gib(scratch)} of per-thread "
            f"scratch{caches}; use a smaller batch_size or patch, or fewer buffers or threads"
            + (", or smaller cache_bytes" if cache_bytes else ""))


def chunk_cache_bytes(volumes) -> int:
    """Bytes the chunk caches of the lazy ones of ``volumes`` fill up to as they are read: each cache's budget,
    or its volume's bytes where that is less (a small cutout never holds its 1 GiB default), each cache once
    (a volume in several samples shares its cache). Counted up front, as a lazy loader under ``ulimit -v`` was
    built and then failed reading its first batch (a review)."""
    seen = {}
    for volume in volumes:
        cache = volume.chunk_cache
        if cache is not None:
            seen[id(cache)] = min(cache.budget_bytes, volume.nbytes)
    return sum(seen.values())
