"""The memory budget of a prediction, and the block shape it allows.

What a prediction holds grows with its blocks: the inputs read ahead (with the tiles' context), a block's float64
sums, the finished blocks waiting for the writers, and a batch. Blocks are whole output chunks, grown one chunk at
a time (along the shortest axis first) while that estimate stays within the budget, up to :data:`BLOCK_EDGE`
voxels per axis: what is left after the model's last batch is one block's blending and writing, so smaller blocks
end sooner, and each tile is computed once whatever the blocks. The input's own chunks do not enter: a lazy input
that predict opens reads through a chunk cache of a quarter of the budget, and shared tiles are held in memory up
to what the blocks leave of it, at least an eighth (then on disk).
"""
from __future__ import annotations

import math
import re
from typing import Callable, Optional, Tuple

import numpy as np

from .._checks import refusal
from ._block import BATCHES_AHEAD
from ._local import WRITES_IN_FLIGHT

#: Default budget of :func:`emfast.predict` (``memory=``), in bytes.
DEFAULT_MEMORY = 1 << 30
#: Largest block edge (voxels) chosen by default, rounded up to whole chunks.
BLOCK_EDGE = 128
#: The share of the budget given to the chunk cache of an input predict opens itself (1 / CACHE_SHARE).
CACHE_SHARE = 4
#: The least share of the budget for shared tiles held in memory (1 / TILES_SHARE; beyond it they go to disk).
TILES_SHARE = 8

_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def input_cache_refusal(error, memory: int) -> ValueError:
    """The refusal of a ``memory`` whose share for the input's chunk cache is smaller than one of its blocks
    (``error``, a :class:`~emfast.io.CacheBudgetError`), naming the memory it needs."""
    return refusal(f"memory={memory} bytes is too small for the input's chunk cache: it gets 1/{CACHE_SHARE} of "
                   f"memory, {memory // CACHE_SHARE} bytes, less than one block of {error.name} ({error.block_bytes} "
                   f"bytes); give memory of at least {CACHE_SHARE * error.block_bytes} bytes", "memory")


def parse_memory(value) -> int:
    """``value`` in bytes: an integer (a whole float too, as YAML reads ``1e9``), or a string such as "512MiB",
    "2 GiB" or "1.5GB"."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and value.is_integer() and value > 0:
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if match and match.group(2).lower() in _UNITS and float(match.group(1)) > 0:
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise ValueError(f"memory must be a positive number of bytes or a size such as '512MiB' or '2GiB', got "
                     f"{value!r}")


def block_bytes(block, patch_in, patch_out, channels_in: int, itemsize_in: int, channels_out: int,
                itemsize_out: int, readers: int, batch_size: int, variants: int) -> int:
    """An upper bound on the bytes a prediction holds with blocks of ``block`` voxels (local engine)."""
    voxels = int(np.prod(block))
    # Tiles writing into a block start up to patch_out before it; each reads its context around it.
    input_voxels = int(np.prod([b + i + o for b, i, o in zip(block, patch_in, patch_out)]))
    inputs = (readers + 1) * channels_in * itemsize_in * input_voxels
    blending = 2 * (channels_out * 8 + 4) * voxels  # one block fed, the previous one finished
    outputs = (WRITES_IN_FLIGHT + 1) * channels_out * itemsize_out * voxels
    tile_out = channels_out * 8 * int(np.prod(patch_out))
    batches = ((BATCHES_AHEAD + 2) * batch_size * (channels_in * 4 * int(np.prod(patch_in)) + tile_out)
               + variants * tile_out)
    return inputs + blending + outputs + batches


def block_estimate(plan, channels_in: int, itemsize_in: int, channels: int, dtype, threads: int, batch_size: int,
                   variant_count: int) -> Callable[[tuple], int]:
    """``estimate(block)``: :func:`block_bytes` for ``plan``'s tiles over an input of ``channels_in`` channels of
    ``itemsize_in`` bytes, to an output of ``channels`` channels of ``dtype``."""
    def estimate(block) -> int:
        return block_bytes(block, plan.patch_in, plan.patch_out, channels_in, itemsize_in, channels,
                           np.dtype(dtype).itemsize, threads, batch_size, variant_count)

    return estimate


def choose_block(budget: int, chunks, roi, estimate, given: int) -> Tuple[int, int, int]:
    """The block (whole ``chunks``) that ``estimate(block)`` bytes keep within ``budget`` (the part of the
    user's ``given`` budget left for blocks): grown from one chunk along the shortest axis that still fits, up to
    :data:`BLOCK_EDGE` and the roi's extent.

    Raises
    ------
    ValueError
        One chunk already needs more than ``budget``.
    """
    block = list(chunks)
    if estimate(block) > budget:
        raise refusal(f"memory={given} bytes is too small for a block of one output chunk {tuple(chunks)} "
                      f"(about {estimate(block)} bytes with its inputs, sums and outputs, of the {budget} left "
                      "beside the input's chunk cache and the shared tiles); give more memory or smaller chunks",
                      "memory")
    limits = [c * max(1, -(-min(BLOCK_EDGE, b - a) // c)) for c, a, b in zip(chunks, *roi)]
    while True:
        growable = sorted((block[a], a) for a in range(3) if block[a] < limits[a])
        for _, axis in growable:
            trial = list(block)
            trial[axis] += chunks[axis]
            if estimate(trial) <= budget:
                block = trial
                break
        else:
            return tuple(block)


def budget_block(plan, estimate, budget: int, reserved: int) -> Tuple[int, int, int]:
    """The block :func:`choose_block` lays for ``plan`` within what ``budget`` leaves beside ``reserved`` bytes
    (the input's chunk cache, device slots) and the shared tiles: predict's, and ``emfast check``'s, which
    printed the blocks of no budget (1 block where predict ran 15)."""
    return choose_block(_left_for_blocks(budget, reserved), plan.chunks, plan.roi, estimate, budget)


def _left_for_blocks(budget: int, reserved: int) -> int:
    """What ``budget`` leaves for blocks beside ``reserved`` bytes and the shared tiles' share."""
    return budget - budget // TILES_SHARE - reserved


def too_large_block(block, estimate, budget: int, reserved: int, resumed: Optional[str] = None
                    ) -> Optional[ValueError]:
    """The refusal (at ``block``) of a given block whose ``estimate(block)`` bytes exceed what ``budget`` leaves
    for blocks beside ``reserved`` bytes (the input's chunk cache, device slots) and the shared tiles; None if
    it fits. ``resumed``: the output whose unfinished run's blocks these are (the refusal is then at ``memory``)."""
    left = _left_for_blocks(budget, reserved)
    needed = estimate(block)
    if needed <= left:
        return None
    needs = (f"needs about {needed} bytes with its inputs, sums and outputs, more than the {left} of memory={budget} "
             "left beside the input's chunk cache and the shared tiles")
    if resumed is not None:
        return refusal(f"{resumed} was begun in blocks of {tuple(block)} (the default block of that run's memory and "
                       f"settings), which a resume keeps; such a block {needs}: resume with more memory, or pass "
                       "overwrite=True to start again in blocks that fit", "memory")
    return refusal(f"block={tuple(block)} {needs}; give a smaller block or more memory, or leave block out to have "
                   "one chosen within memory", "block")
