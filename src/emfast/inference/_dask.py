"""The Dask engine: the same blocks as Dask tasks. Each task reads its block's input with its context, runs the
network, blends and writes its own chunks of the output, then flags the block finished, so a real cluster
needs only another client. Tasks reopen the output store where they run; the predictor (volume, model and
plan) is sent to each worker once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional

import numpy as np

from ._block import BlockPredictor
from ._local import write_block
from ._store import OutputStore
from ._tiling import Block


def dask_missing() -> Optional[str]:
    """Why Dask cannot run predictions here, or None."""
    try:
        import distributed  # noqa: F401  (only whether it imports)
    except ImportError as error:
        return f"client= needs dask.distributed ({error}); install it with pip install 'emfast[dask]'"
    return None


def _run_block(block: Block, predictor: BlockPredictor, container: str, dataset: str, kind: str) -> tuple:
    """One Dask task: compute, write and flag ``block``; returns the tiles it computed, the values it computed,
    those it clipped and the NaN among them, and those NaN or infinite in a float output.

    The task counts on its own copy of the worker's predictor (which shares its kept tiles, model and volume):
    tasks running at once on one worker's threads each counted the others' tiles too."""
    task = object.__new__(BlockPredictor)  # not copy.copy: that would pickle its way to a new, empty _Pool
    task.__dict__.update(predictor.__dict__, tiles_computed=0, values=0, clipped=0, nans=0,
                         non_finite=0)
    result = task.compute(block, task.read(block))
    store = OutputStore.reopen(Path(container), dataset, kind)
    try:
        write_block(store, block, result, task.plan.grid)
    finally:
        store.close()
    return task.tiles_computed, task.values, task.clipped, task.nans, task.non_finite


def _phase(block: Block, grid) -> tuple:
    """The block's parity along each axis, then its index: blocks of one phase touch no other block of it, not
    even diagonally, so the tasks running at once rarely need the same tile (all of one phase are submitted first,
    and the next phases find the tiles they share with it kept)."""
    position = np.unravel_index(block.index, tuple(grid))
    return tuple(int(p) % 2 for p in position) + (block.index,)


def run_dask(client, predictor: BlockPredictor, store: OutputStore, blocks: List[Block],
             progress: Optional[Callable[[Block], None]]) -> None:
    """Run ``blocks`` as tasks on ``client``'s cluster; the first failed task cancels the rest and is raised.
    The tasks' counts of tiles computed and of clipped or non-finite values are added to ``predictor``'s. Kept tiles stay until
    the prediction completes (a tile two blocks need at the same moment is computed by both, which the order of
    the tasks makes rare)."""
    from distributed import as_completed

    shared = client.scatter(predictor, broadcast=True)
    blocks = sorted(blocks, key=lambda block: _phase(block, predictor.plan.grid))
    futures = client.map(_run_block, blocks, predictor=shared, container=str(store.container),
                         dataset=store.dataset, kind=store.kind, pure=False)
    by_key = {future.key: block for future, block in zip(futures, blocks)}
    try:
        for future in as_completed(futures):
            tiles, values, clipped, nans, non_finite = future.result()
            predictor.tiles_computed += tiles
            predictor.values += values
            predictor.clipped += clipped
            predictor.nans += nans
            predictor.non_finite += non_finite
            if progress is not None:
                progress(by_key[future.key])
    finally:
        client.cancel(futures)
