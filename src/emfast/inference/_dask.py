"""The Dask engine: the same blocks as Dask tasks. Each task reads its block's input with its context, runs the
network, blends and writes its own chunks of the output, then flags the block finished, so a real cluster
needs only another client. Tasks reopen the output store where they run; the predictor (volume, model and
plan) is sent to each worker once.
"""
from __future__ import annotations

import copy
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np

from .._threads import ctrl_c_held
from ..io import option
from ._block import BlockPredictor
from ._local import write_block
from ._model import model_name, sendable
from ._store import OutputStore
from ._tiling import Block


def dask_missing() -> Optional[str]:
    """Why Dask cannot run predictions here, or None."""
    try:
        import distributed  # noqa: F401  (only whether it imports)
    except ImportError as error:
        return f"client= needs dask.distributed ({error}); install it with pip install 'emfast[dask]'"
    return None


class ModelNotSendableError(TypeError):
    """The model cannot be pickled for the Dask workers: the user's model, not a bug of emfast's (the command
    says it in one line)."""


def check_model_pickles(model, client) -> None:
    """:class:`ModelNotSendableError` (a TypeError) naming the model if it cannot be sent to ``client``'s workers
    (as Dask pickles it: pickle, else cloudpickle), before anything is written: otherwise the run failed at its
    first task with an error naming emfast's BlockPredictor, and left the output begun. Workers in this process
    (``inproc://``) share objects unpickled."""
    from distributed.protocol import pickle as dask_pickle
    if str(getattr(client.scheduler, "address", "")).startswith("inproc://"):
        return
    try:
        dask_pickle.dumps(model)
    except Exception as error:  # noqa: BLE001 - whatever pickling raises is the reason
        raise ModelNotSendableError(f"client=: the model {model_name(model)} cannot be sent to the Dask workers, "
                                    f"which need it pickled ({type(error).__name__}: {error}); make it picklable, or "
                                    "predict without client=") from None
    # pickled by reference, its module must import there: else the first task failed with a bare Exception
    # ("No module named 'mynets'"), naming no model, the output begun
    module = getattr(model, "__module__", None) or type(model).__module__
    if isinstance(module, str) and module != "__main__":  # __main__'s travel by value
        lacking = [worker for worker, found in client.run(_importable, module).items() if not found]
        if lacking:
            raise ModelNotSendableError(f"client=: the model {model_name(model)} cannot be loaded by {len(lacking)} "
                                        f"of the Dask workers: they cannot import its module {module!r}; install "
                                        "it where they run (or start them where it is importable), or predict "
                                        "without client=")


class DaskRunLostError(OSError):
    """A block's task on Dask was cancelled or killed its workers: the client closed, the workers holding the run's
    data or the scheduler lost, or a model that ends its worker's process. The blocks written are recorded."""


def _lost(error: BaseException, killed: bool, block: Block, client) -> DaskRunLostError:
    """The error telling why ``block``'s task ended in ``error`` (Dask's cancellation, or its KilledWorker where
    ``killed``, which named only emfast's task key) and that a resume continues."""
    where = f"predict on Dask: block {block.index} (voxels {block.start}..{block.stop})"
    resume = f"the blocks written are recorded: run again with {option('resume')}"
    if killed:
        return DaskRunLostError(f"{where} ended the process of every worker that ran it ({error}): the model may "
                                f"need more memory than a worker has, or crash its process; {resume} (with more "
                                "memory per worker, or fewer threads)")
    if getattr(client, "status", "running") != "running":
        cause = "the client was closed while it ran"
    else:  # sent once to each worker (scattered), the run's data cannot be made again by Dask once they are gone
        cause = ("the workers holding the run's model, volume and plan (sent to each once, which Dask cannot make "
                 "again) were lost, or the scheduler was: a model that ends its worker's process (out of memory, a "
                 "crash in native code) loses them too, each worker that retries the block")
    return DaskRunLostError(f"{where} was cancelled ({error}): {cause}; {resume}")


#: How often (seconds) a running task asks the scheduler whether the run has ended, before a model call: an error
#: or Ctrl-C ends a long block within a call or so, not after its last one (the answer is thrown away then).
ENDED_POLL_S = 1.0


class _Ended(Exception):
    """The run ended while this task computed its block: it stops before its next model call."""


def _stopping(call_now: Callable, run_ended) -> Callable:
    """``call_now``, which first raises _Ended once ``run_ended`` (a Dask event) is set, asked at most every
    :data:`ENDED_POLL_S` (one request to the scheduler each)."""
    asked = [time.monotonic()]

    def call(batch, out_shape):
        now = time.monotonic()
        if now - asked[0] >= ENDED_POLL_S:
            asked[0] = now
            if run_ended.is_set():
                raise _Ended
        return call_now(batch, out_shape)

    return call


def _importable(module: str) -> bool:
    """On a worker: whether ``module`` imports there (found, not executed)."""
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def _run_block(block: Block, predictor: BlockPredictor, container: str, dataset: str, kind: str,
               ended: str) -> Optional[tuple]:
    """One Dask task: compute, write and flag ``block``; returns the tiles it computed, the zero tiles that filled
    its short batches, the values it computed, those it clipped and the NaN among them, those NaN or infinite in
    a float output, and the seconds spent in the model's calls; None, having written nothing, once the run has
    ended (the Dask event named ``ended`` is set).

    The task counts on its own copy of the worker's predictor (which shares its kept tiles, model and volume)
    and of its model caller: tasks running at once on one worker's threads each counted the others' too."""
    from distributed import Event
    run_ended = Event(ended)
    if run_ended.is_set():
        return None
    task = object.__new__(BlockPredictor)  # not copy.copy: that would pickle its way to a new, empty _Pool
    caller = copy.copy(predictor.model)
    caller.seconds, caller.tiles_padded = 0.0, 0
    task.__dict__.update(predictor.__dict__, model=caller, tiles_computed=0, values=0, clipped=0, nans=0,
                         non_finite=0)
    task.call_now = _stopping(task.call_now, run_ended)
    stand_in = None
    try:
        result = task.compute(block, task.read(block))
    except _Ended:
        return None
    except BaseException as error:
        stand_in = sendable(error, caller.name)
        if stand_in is error:
            raise
    if stand_in is not None:  # raised here, not while handling: Dask pickles an exception's context with it
        raise stand_in
    if run_ended.is_set():  # set before this task's write began: the run waits only for writes begun before
        return None
    store = OutputStore.reopen(Path(container), dataset, kind)
    try:
        write_block(store, block, result, task.plan.grid)
    finally:
        store.close()
    return (task.tiles_computed, caller.tiles_padded, task.values, task.clipped, task.nans, task.non_finite,
            caller.seconds)


def _phase(block: Block, grid) -> tuple:
    """The block's parity along each axis, then its index: blocks of one phase touch no other block of it, not
    even diagonally, so the tasks running at once rarely need the same tile (all of one phase are submitted first,
    and the next phases find the tiles they share with it kept)."""
    position = np.unravel_index(block.index, tuple(grid))
    return tuple(int(p) % 2 for p in position) + (block.index,)


def run_dask(client, predictor: BlockPredictor, store: OutputStore, blocks: List[Block],
             progress: Optional[Callable[[Block], None]]) -> None:
    """Run ``blocks`` as tasks on ``client``'s cluster; the first failed task cancels the rest and is raised.
    The tasks' counts of tiles computed and of clipped or non-finite values, and their seconds in the model, are
    added to ``predictor``'s. Kept tiles stay until the prediction completes (a tile two blocks need at the same
    moment is computed by both, which the order of the tasks makes rare)."""
    from concurrent.futures import CancelledError

    from distributed import Event, as_completed
    from distributed.scheduler import KilledWorker

    shared = client.scatter(predictor, broadcast=True)
    blocks = sorted(blocks, key=lambda block: _phase(block, predictor.plan.grid))
    ended = Event(f"emfast-predict-ended-{uuid.uuid4().hex}", client=client)
    address = client.scheduler.address  # gone once the user closes the client
    futures = client.map(_run_block, blocks, predictor=shared, container=str(Path(store.container).absolute()),
                         dataset=store.dataset, kind=store.kind, ended=ended.name, pure=False)
    by_key = {future.key: block for future, block in zip(futures, blocks)}
    try:
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except (CancelledError, KilledWorker) as error:  # Dask's words name only emfast's task
                raise _lost(error, isinstance(error, KilledWorker), by_key[future.key], client) from error
            tiles, padded, values, clipped, nans, non_finite, seconds = outcome
            predictor.model.seconds += seconds  # the workers' calls, as Prediction.profile["model"] reports them
            predictor.model.tiles_padded += padded
            predictor.tiles_computed += tiles
            predictor.values += values
            predictor.clipped += clipped
            predictor.nans += nans
            predictor.non_finite += non_finite
            if progress is not None:
                progress(by_key[future.key])
    finally:
        with ctrl_c_held():
            _end_tasks(client, futures, ended, address)


def _end_tasks(client, futures, ended, address: str) -> None:
    """After the run (an error or Ctrl-C included): no task writes once this returns. The tasks not yet running
    are cancelled; the ones running (a cancelled task runs on, and would write after predict has raised and
    let go of the output's lock) are waited for: once ``ended`` is set they stop before their next model call
    (within :data:`ENDED_POLL_S`) and write nothing, except a write begun before. With the user's client closed,
    ``ended`` is set through a client of the run's own (at the scheduler's ``address``): the tasks not yet writing
    write nothing, and a write begun cannot be waited for."""
    from concurrent.futures import CancelledError  # distributed's FuturesCancelledError (2024.7 on) is one

    from distributed import Client, Event, wait
    try:
        ended.set()
        running = set(client.run_on_scheduler(_running, keys=[future.key for future in futures]))
    except Exception:  # noqa: BLE001 - the user's client is closed (or the cluster gone)
        try:
            with Client(address, timeout=10, set_as_default=False) as own:
                Event(ended.name, client=own).set()
        except Exception:  # noqa: BLE001 - the cluster is gone: so are its tasks
            pass
        return
    client.cancel([future for future in futures if future.key not in running])
    try:
        wait([future for future in futures if future.key in running])
    except CancelledError:  # their workers ended too (a terminal's Ctrl-C reaches its whole process group)
        pass


def _running(keys, dask_scheduler=None) -> list:
    """On the scheduler: which of ``keys`` are being computed."""
    states = {key: dask_scheduler.tasks.get(key) for key in keys}
    return [key for key, task in states.items() if task is not None and task.state == "processing"]
