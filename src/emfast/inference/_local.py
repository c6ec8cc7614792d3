"""The local engine: reader threads fetch blocks' inputs ahead, the calling thread runs the network and blends,
and :data:`WRITERS` writer threads write finished blocks while the next is computed. Shared tiles are kept until
the last block needing them is computed.

Memory stays bounded by the blocks in flight: ``threads`` inputs read ahead, one block being computed, and at
most :data:`WRITES_IN_FLIGHT` being written, whose output buffers are reused once written. Every thread is joined
before :func:`run_local` returns or raises; a block being written when an error or Ctrl-C arrives is finished and
recorded first.
"""
from __future__ import annotations

from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional

import numpy as np

from ..io._outputs import check_free_space, option
from ._block import BlockPredictor
from ._store import BlockWriteError, OutputStore
from ._tiling import Block

#: Finished blocks that may wait for the writers.
WRITES_IN_FLIGHT = 2
#: Writer threads: compression releases the GIL, and two blocks written at once keep both cores of a small machine
#: busy while the network runs (each block writes its own chunks; HDF5 writes are serialised by h5py).
WRITERS = 2


def write_block(store: OutputStore, block: Block, result, grid) -> int:
    """Write a block's chunks, then flag it finished; a failure leaves it unflagged and raises BlockWriteError
    (or OutputSpaceError, before writing, when the file system has less free space than the block's bytes)."""
    # Checked before the write: HDF5 cannot recover from a full disk (its file can no longer be closed, and the
    # process crashes at exit). A block never needs more than its raw bytes; the writers write WRITERS at once.
    check_free_space(store.container, result.nbytes * WRITERS, f"writing block {block.index}",
                     f"run again with {option('resume')} to continue")
    try:
        store.write(block.start, result)
        store.mark(block.index, grid)
    except Exception as error:
        raise BlockWriteError(f"writing block {block.index} (voxels {block.start}..{block.stop}) to {store.path} "
                              f"failed: {error}. The blocks written before it are recorded; run again with "
                              f"{option('resume')} to continue") from error
    return block.index


def _discard_blended(predictor: BlockPredictor, block: Block, sharers: Counter) -> None:
    """Drop the kept tiles that no block left to compute needs (a crash before the block is written costs their
    recomputation on resume, nothing else)."""
    for key in predictor.shared_keys(block):
        sharers[key] -= 1
        if not sharers[key]:
            predictor.cache.discard(key)


def run_local(predictor: BlockPredictor, store: OutputStore, blocks: List[Block], threads: int,
              progress: Optional[Callable[[Block], None]]) -> None:
    """Compute and write ``blocks`` in order; ``progress(block)`` after each is written. A kept tile is
    discarded once the last of these blocks that shares it is computed."""
    grid = predictor.plan.grid
    readers = ThreadPoolExecutor(threads, thread_name_prefix="emfast-predict-read")
    writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="emfast-predict-write")
    reads: deque = deque()
    writes: deque = deque()  # (future, the output buffer it writes from, the block)
    sharers = Counter(key for block in blocks for key in predictor.shared_keys(block))
    spare: List[np.ndarray] = []  # output buffers whose write finished, reused: no page faults
    upcoming = iter(blocks)

    def finish_write() -> None:
        future, buffer, block = writes.popleft()
        future.result()
        spare.append(buffer)
        if progress is not None:
            progress(block)

    try:
        for block in upcoming:
            reads.append((block, readers.submit(predictor.read, block)))
            if len(reads) > threads:
                break
        while reads:
            block, region = reads.popleft()
            for following in upcoming:
                reads.append((following, readers.submit(predictor.read, following)))
                break
            while len(writes) >= WRITES_IN_FLIGHT:
                finish_write()
            buffer = spare.pop() if spare else None
            result = predictor.compute(block, region.result(), buffer)
            _discard_blended(predictor, block, sharers)
            if buffer is None or not np.shares_memory(result, buffer):  # a new, larger buffer
                buffer = result.reshape(-1)
            writes.append((writers.submit(write_block, store, block, result, grid), buffer, block))
        while writes:
            finish_write()
    finally:
        readers.shutdown(wait=True, cancel_futures=True)
        writers.shutdown(wait=True)
