"""The local engine, a pipeline in which the network never waits: reader threads fetch blocks' inputs ahead; the
calling thread feeds a block (gathers and normalises batches of tiles); one model thread (on a device, the
device's thread) runs the network on them in order; one blender thread blends the predictions as they come back
(every block's, in the plan's order; on a machine of 8 cores or more, with helpers blending rows of the block
beside it, see :func:`blend_parts`); one finisher thread converts each block once blended; :data:`WRITERS` writer
threads write finished blocks, their zarr chunks encoded on a pool of one thread per core. Shared tiles are kept
until the last block needing them is computed.

The readers, the finisher, the writers and the encoders run at a lower CPU priority (:data:`BACKGROUND_NICE`, on
Linux) than the calling thread, the model's and the blender's: on a machine whose cores are all busy, the network
is not the one kept waiting.

Memory stays bounded by the blocks in flight: ``threads`` inputs read ahead, one block being fed and one being
blended or finished (their sums; the calling thread feeds no further ahead), a few batches, and at most
:data:`WRITES_IN_FLIGHT` blocks being written, whose output buffers are reused once written. Every thread is
joined before :func:`run_local` returns or raises (batches queued for the model are cancelled, and reads of a
remote input in flight abandoned); a block being written when an error or Ctrl-C arrives is finished and
recorded first.
"""
from __future__ import annotations

import os
import threading
from collections import Counter, deque
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Callable, List, Optional

import numpy as np

from .._machine import cores
from .._threads import ctrl_c_held, shutdown_pool
from ..io import ReadAbandoned, abandoned_when, check_free_space, option
from ._block import BlendHelpers, BlockPredictor, Carry
from ._store import BlockWriteError, OutputStore
from ._tiling import Block

#: Finished blocks that may wait for the writers.
WRITES_IN_FLIGHT = 2
#: How much lower the CPU priority of the readers, finisher and writers is (a nice increment: raising it needs no
#: privilege, and it applies to each thread alone, and to the threads it starts).
BACKGROUND_NICE = 5
#: Writer threads: two blocks written at once keep the encoders busy while the next block is finished (each block
#: writes its own chunks; HDF5 writes, which compress on the writer's thread, are serialised by h5py).
WRITERS = 2


def blend_parts() -> int:
    """Threads blending a block, the blender included: one per four usable cores, from one to four (blending is
    bound by memory bandwidth, which a few cores use up)."""
    return max(1, min(4, cores() // 4))


def write_block(store: OutputStore, block: Block, result, grid, encoding: Optional[Executor] = None) -> int:
    """Write a block's chunks (encoded on ``encoding``, a pool the writers share, where given), then flag it
    finished; a failure leaves it unflagged and raises BlockWriteError (or OutputSpaceError, before writing, when
    the file system has less free space than the block's bytes)."""
    # Checked before the write: HDF5 cannot recover from a full disk (its file can no longer be closed, and the
    # process crashes at exit). A block never needs more than its raw bytes; the writers write WRITERS at once.
    check_free_space(store.container, result.nbytes * WRITERS, f"writing block {block.index}",
                     f"run again with {option('resume')} to continue")
    try:
        store.write(block.start, result, encoding)
        store.mark(block.index, grid)
    except Exception as error:
        raise BlockWriteError(f"writing block {block.index} (voxels {block.start}..{block.stop}) to {store.path} "
                              f"failed: {error}. The blocks written before it are recorded; run again with "
                              f"{option('resume')} to continue") from error
    return block.index


def _written(finishing) -> bool:
    """Whether a block's finishing (a future of (its write's future, its result)) and its write have ended,
    failed included: :func:`run_local`'s ``finish_write`` then takes it without waiting."""
    return finishing.done() and (finishing.cancelled() or finishing.exception() is not None
                                 or finishing.result()[0].done())


def _caller_nice() -> Optional[int]:
    """The calling thread's nice value (Linux: each thread has its own), or None where there is none."""
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


def _at_nice(nice: Optional[int]) -> None:
    """Give this thread the nice value ``nice`` (set whole: a pool's threads start as whichever thread submits first,
    which may be a background one); None, or refused (lowering it needs a privilege): left as it is."""
    if nice is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        pass


def _discard_blended(predictor: BlockPredictor, block: Block, sharers: Counter) -> None:
    """Drop the kept tiles that no block left to compute needs (a crash before the block is written costs their
    recomputation on resume, nothing else); their memory is reused for the next kept tiles (fresh memory costs
    its page faults)."""
    for key in predictor.shared_keys(block):
        sharers[key] -= 1
        if not sharers[key]:
            predictor.give_back_kept(predictor.cache.discard(key))


def run_local(predictor: BlockPredictor, store: OutputStore, blocks: List[Block], threads: int,
              progress: Optional[Callable[[Block], None]]) -> None:
    """Compute and write ``blocks`` in order; ``progress(block)`` after each is written. A kept tile is
    discarded once the last of these blocks that shares it is computed."""
    grid = predictor.plan.grid
    nice = _caller_nice()
    background = (None if nice is None else nice + BACKGROUND_NICE,)
    readers = ThreadPoolExecutor(threads, thread_name_prefix="emfast-predict-read", initializer=_at_nice,
                                 initargs=background)
    # On a device the model is called on the device's own thread: a batch is handed over once, not twice.
    model = ThreadPoolExecutor(1, thread_name_prefix="emfast-predict-model", initializer=_at_nice, initargs=(nice,)) \
        if predictor.model.runner is None else predictor.model.runner.calls()
    # Blending runs at the caller's priority: the calling thread waits for it once BATCHES_AHEAD groups are queued.
    blender = ThreadPoolExecutor(1, thread_name_prefix="emfast-predict-blend", initializer=_at_nice,
                                 initargs=(nice,))
    parts = blend_parts()
    helpers = ThreadPoolExecutor(parts - 1, thread_name_prefix="emfast-predict-blend-rows", initializer=_at_nice,
                                 initargs=(nice,)) if parts > 1 else None
    finisher = ThreadPoolExecutor(1, thread_name_prefix="emfast-predict-finish", initializer=_at_nice,
                                  initargs=background)
    writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="emfast-predict-write", initializer=_at_nice,
                                 initargs=background)
    # The writers' zarr chunks, encoded one per task on as many threads as cores: the blocks written at once share
    # them, and no core idles at the end while one writer works through the rest of its block.
    encoding = ThreadPoolExecutor(cores(), thread_name_prefix="emfast-predict-encode", initializer=_at_nice,
                                  initargs=background)
    reads: deque = deque()
    writes: deque = deque()  # (future of the block's finishing, the output buffer it was given, the block)
    sharers = Counter(key for block in blocks for key in predictor.shared_keys(block))
    spare: List[np.ndarray] = []  # output buffers whose write finished, reused: no page faults
    upcoming = iter(blocks)
    carry = Carry()  # a block's last, partial batch is filled by the next block's first tiles
    ending = threading.Event()  # set on the way out: a remote read in flight is abandoned, not waited for

    def read(block: Block) -> np.ndarray:
        with abandoned_when(ending.is_set):
            return predictor.read(block)

    def run_model(batch: np.ndarray, out_shape: tuple):
        future = model.submit(predictor.model, batch, out_shape, predictor.channels)
        future.add_done_callback(end_on_failure)
        return future

    def end_on_failure(future) -> None:
        """The model's error ends the run: reads in flight are abandoned now, not when the feeding thread learns
        of it (it may be waiting for a read the store holds)."""
        if not future.cancelled() and future.exception() is not None:
            ending.set()

    def input_of(region) -> np.ndarray:
        try:
            return region.result()
        except ReadAbandoned:  # the model failed meanwhile: its error, not the read's, ends the run
            if predictor.model.failure is not None:
                raise predictor.model.failure from None
            raise

    def finish(run, buffer, block: Block):
        result = run.finish(buffer)
        _discard_blended(predictor, block, sharers)
        return writers.submit(write_block, store, block, result, grid, encoding), result

    def finish_write() -> None:
        finishing, buffer, block = writes.popleft()
        write, result = finishing.result()
        write.result()
        if buffer is None or not np.shares_memory(result, buffer):  # a new, larger buffer
            buffer = result.reshape(-1)
        spare.append(buffer)
        if progress is not None:
            progress(block)

    try:
        for block in upcoming:
            reads.append((block, readers.submit(read, block)))
            if len(reads) > threads:
                break
        while reads:
            if len(writes) > 1:  # fed ahead of the blending by one block at most: the memory budget's count
                writes[-2][0].result()
            block, region = reads.popleft()
            for following in upcoming:
                reads.append((following, readers.submit(read, following)))
                break
            while len(writes) > WRITES_IN_FLIGHT:  # one block being finished, WRITES_IN_FLIGHT written
                finish_write()
            while writes and _written(writes[0][0]):  # reported now, not when WRITES_IN_FLIGHT more are out
                finish_write()
            buffer = spare.pop() if spare else None
            # Fed here while the blender blends what the model returned and the finisher converts the previous
            # block: this thread only gathers, so the model always has its next batch.
            run = predictor.feed(block, input_of(region), run_model, blender=blender,
                                 helpers=None if helpers is None else BlendHelpers(parts, helpers), carry=carry)
            finishing = finisher.submit(finish, run, buffer, block)
            writes.append((finishing, buffer, block))
        carry.flush(run_model)
        while writes:
            finish_write()
    finally:
        with ctrl_c_held():  # first: until every pool below has ended, no Ctrl-C cuts this short
            ending.set()
            carry.abandon()  # a blending waiting for a batch never submitted sees it cancelled
            # In this order, each pool's threads end before the next is shut down (the finisher submits writes):
            # no writer outlives the run and its output's lock.
            shutdown_pool(readers, cancel_futures=True)
            shutdown_pool(model, cancel_futures=True)  # a blending waiting for a batch sees it cancelled
            shutdown_pool(blender)
            if helpers is not None:
                shutdown_pool(helpers)
            shutdown_pool(finisher)
            shutdown_pool(writers)
            shutdown_pool(encoding)  # after the writers, which wait for their chunks
