"""Batch lifetime as training loops really hold batches: the previous batch alive until reassigned, batches kept,
dropped loaders. On the CPU and on the fake device, which enforces the rules of a real GPU."""
import dataclasses
import gc
import os
import pickle
import select
import subprocess
import sys
import hashlib
import tempfile
import threading
import time
import warnings

import numpy as np
import pytest

import emfast as ef
from emfast import BackPressureWarning, SlotsExhaustedError
from emfast.transfer._fake import FakeDevice
from threads import threads_end

try:
    from torch.utils.data import IterableDataset
except ImportError:  # the DataLoader tests skip
    IterableDataset = object

PATCH = (4, 16, 12)
DEVICES = ["cpu", "fake"]


@pytest.fixture
def volumes(rng):
    return (rng.integers(0, 256, (12, 40, 36), dtype=np.uint8),
            rng.integers(0, 2**40, (12, 40, 36), dtype=np.uint64))


def make_loader(volumes, device, **kwargs):
    raw, labels = volumes
    backend = FakeDevice(max_delay=0.0005) if device == "fake" else "cpu"
    arguments = dict(patch=PATCH, batch_size=3, seed=5, threads=2, device=backend)
    arguments.update(kwargs)
    return ef.Loader(raw, labels, **arguments), backend


def digest(*arrays):
    hasher = hashlib.sha256()
    for array in arrays:
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()


def careful_stream(volumes, device, count):
    """Digests of ``count`` batches, every reference dropped before the next request."""
    loader, _ = make_loader(volumes, device)
    with loader:
        return [digest(batch["raw"], batch["labels"]) for _, batch in zip(range(count), loader)]


def assert_rules_kept(backend):
    if isinstance(backend, FakeDevice):
        assert backend.violations == []


@pytest.mark.parametrize("device", DEVICES)
def test_natural_loop_allocates_nothing_per_batch_and_never_touches_held_arrays(volumes, device):
    count = 2000
    loader, backend = make_loader(volumes, device)
    digests, held = [], None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all in steady state
        with loader:
            for _, batch in zip(range(count), loader):
                if held is not None:  # the previous batch is still referenced here: it must be unchanged
                    assert digest(*held[:2]) == held[2]
                # as a training step keeps them: x and y live until this line runs again
                x, y = batch["raw"], batch["labels"][:, :, 1:]
                held = (x, y, digest(x, y))
                digests.append(digest(batch["raw"], batch["labels"]))
    assert loader.slots_allocated <= loader.buffers + 1
    assert_rules_kept(backend)
    assert digests == careful_stream(volumes, device, count)


@pytest.mark.parametrize("device", DEVICES)
def test_kept_batches_stay_intact_within_max_buffers(volumes, device):
    loader, backend = make_loader(volumes, device, buffers=2, max_buffers=24)
    kept = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with loader:
            for _, batch in zip(range(20), loader):
                kept.append((batch["raw"], batch["labels"][1:3]))
                kept[-1] += (digest(*kept[-1]),)
    assert [digest(a, b) for a, b, _ in kept] == [d for *_, d in kept]  # also after close
    assert_rules_kept(backend)
    careful = []
    with make_loader(volumes, device)[0] as again:
        for _, batch in zip(range(20), again):
            careful.append(digest(batch["raw"], batch["labels"][1:3]))
    assert [d for *_, d in kept] == careful
    del kept
    if isinstance(backend, FakeDevice):
        assert backend.live == 0 and backend.violations == []  # the slots kept past close were freed in context


@pytest.mark.parametrize("device", DEVICES)
def test_holding_every_slot_warns_once_then_fails_clearly_instead_of_hanging(volumes, device):
    loader, backend = make_loader(volumes, device, buffers=2, max_buffers=3)
    kept = []
    started = time.monotonic()
    with pytest.warns(BackPressureWarning, match="max_buffers") as caught:
        with pytest.raises(SlotsExhaustedError, match="all 3 batch slots"):
            with loader:
                for batch in loader:
                    kept.append(batch["raw"])
    assert time.monotonic() - started < 20
    assert sum(issubclass(w.category, BackPressureWarning) for w in caught) == 1
    assert len(kept) == 3
    del kept, batch
    assert_rules_kept(backend)
    if isinstance(backend, FakeDevice):
        assert backend.live == 0


@pytest.mark.parametrize("device", DEVICES)
def test_another_thread_dropping_batches_later_is_waited_for(volumes, device):
    """A consumer that hands batches to another thread: at the cap the loader waits, it does not fail."""
    loader, backend = make_loader(volumes, device, buffers=2, max_buffers=3)
    handed = []
    lock = threading.Lock()

    def drop_later():
        time.sleep(0.3)
        with lock:
            handed.clear()

    droppers = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackPressureWarning)
        with loader:
            for _, batch in zip(range(8), loader):
                with lock:
                    handed.append(batch["raw"])
                droppers.append(threading.Thread(target=drop_later))
                droppers[-1].start()
    for thread in droppers:
        thread.join()
    assert loader.profile.seconds["stall"] > 0
    assert_rules_kept(backend)


@pytest.mark.parametrize("device", DEVICES)
def test_arrays_outlive_release_and_close(volumes, device):
    loader, backend = make_loader(volumes, device)
    with loader:
        batch = loader.next_batch()
        x = batch["raw"][:, :, 1:3]
        expected = x.copy()
        batch.release()
        with pytest.raises(ef.BatchReleasedError):
            batch["raw"]
        for _ in range(10):
            loader.next_batch()
        np.testing.assert_array_equal(x, expected)
    np.testing.assert_array_equal(x, expected)
    if isinstance(backend, FakeDevice):
        assert backend.live == 1  # only x's slot is left, until x goes
        del x
        assert backend.live == 0
    assert_rules_kept(backend)


def test_device_slot_waits_for_the_stream_current_where_it_was_given_back(volumes):
    loader, device = make_loader(volumes, "fake", buffers=2)
    with loader:
        iterator = iter(loader)
        for _ in range(12):
            with device.stream("training"):  # as under torch.cuda.stream(s): the last reference dies here
                batch = next(iterator)
                x = batch["raw"]
                del x
    streams = {stream for _, stream in device.guards}
    assert streams == {"training"} and len(device.guards) >= 8
    assert device.violations == []


def test_a_dropped_loader_stops_without_the_cycle_collector(volumes):
    """No reference cycle keeps a loader alive: it stops as soon as it is unreachable, even while the program
    still holds its last batch and arrays."""
    gc.disable()
    try:
        kept = []
        for _ in range(100):
            loader, _ = make_loader(volumes, "cpu", threads=1)
            batch = loader.next_batch()
            kept.append((batch, batch["raw"]))
            del loader, batch
        assert threads_end()
        batch, raw = kept[-1]
        assert raw.shape == (3, 1) + PATCH and batch.release() is None
    finally:
        gc.enable()


def test_finalizer_running_on_a_producer_thread_does_not_join_itself(volumes, monkeypatch):
    """A collection can run an abandoned loader's finalizer on one of its own producer threads."""
    loader, _ = make_loader(volumes, "cpu", threads=2)
    errors = []
    plan = type(loader._planner).plan

    def plan_then_finalize(epoch, index):
        if index == 3:
            try:
                loader._finalizer()
            except BaseException as error:  # noqa: BLE001 - recorded for the assertion
                errors.append(error)
        return plan(loader._planner, epoch, index)

    monkeypatch.setattr(loader._planner, "plan", plan_then_finalize)
    with pytest.raises(RuntimeError, match="closed"):
        with loader:
            for _ in loader:
                pass
    assert errors == []
    assert threads_end()


@pytest.mark.parametrize("device", DEVICES)
def test_a_loader_in_a_cycle_collected_on_any_thread_stops(volumes, device):
    """Collected by whichever thread's allocation triggers the collection, maybe one holding a ring's lock: the
    finalizer must not block there."""
    thresholds = gc.get_threshold()
    try:
        for _ in range(3):
            loader, _ = make_loader(volumes, device)
            for _ in range(3):
                loader.next_batch()
            loader.cycle = loader
            gc.set_threshold(1, 1, 1)  # collections everywhere, on every thread
            del loader
            assert threads_end()
            gc.set_threshold(*thresholds)
    finally:
        gc.set_threshold(*thresholds)


@pytest.mark.parametrize("device", DEVICES)
def test_a_loader_dropped_after_a_producer_error_stops(volumes, device, monkeypatch):
    loader, backend = make_loader(volumes, device)
    plan = type(loader._planner).plan

    def failing(epoch, index):
        if index == 2:
            raise ZeroDivisionError("producer failed")
        return plan(loader._planner, epoch, index)

    monkeypatch.setattr(loader._planner, "plan", failing)
    with pytest.raises(ZeroDivisionError):
        for _ in range(5):
            loader.next_batch()
    with pytest.raises(ZeroDivisionError):  # raised again, as often as asked
        loader.next_batch()
    del loader, failing
    assert threads_end()  # the stored error holds no frame of the consumer, so nothing keeps the loader
    if isinstance(backend, FakeDevice):
        assert backend.live == 0 and backend.violations == []


@pytest.mark.parametrize("device", DEVICES)
def test_a_resumed_stream_is_byte_identical(volumes, device):
    import json

    def fresh(**kwargs):
        return make_loader(volumes, device, epoch_size=5, augment=["mirror", "transpose", "intensity"], **kwargs)[0]

    with fresh() as whole:
        expected = [(batch.epoch, batch.index, digest(batch["raw"], batch["labels"]))
                    for batch in (whole.next_batch() for _ in range(14))]
    with fresh() as first:
        for _ in range(7):
            first.next_batch()
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint would store it
    resumed = fresh(threads=1, buffers=3)  # producer count and buffers do not change the stream
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    with resumed:
        rest_of_epoch = [(b.epoch, b.index, digest(b["raw"], b["labels"])) for b in resumed]
        later = [(b.epoch, b.index, digest(b["raw"], b["labels"])) for _, b in zip(range(4), resumed)]
    assert rest_of_epoch + later == expected[7:]


def test_a_state_from_another_stream_or_after_start_is_refused(volumes):
    loader, _ = make_loader(volumes, "cpu")
    state = loader.state_dict()
    other, _ = make_loader(volumes, "cpu", seed=6, batch_size=4)
    with pytest.raises(ValueError, match=r"another stream: seed 5 \(this loader: 6\), batch_size 3"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="not an emfast loader state"):
        loader.load_state_dict({"next_batch": -1, "version": 1})
    with loader:
        loader.next_batch()
        with pytest.raises(RuntimeError, match="before the loader starts"):
            loader.load_state_dict(state)


def test_torch_dataloader_workers_draw_disjoint_shards(volumes, monkeypatch):
    """Inside a torch DataLoader worker (as get_worker_info() reports it), each worker's loader draws its own
    shard, like rank/world_size; worker_sharding=False opts out."""
    import types

    current = {"info": None}
    data = types.SimpleNamespace(get_worker_info=lambda: current["info"])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(utils=types.SimpleNamespace(data=data)))

    def stream(worker, **kwargs):
        current["info"] = None if worker is None else types.SimpleNamespace(id=worker, num_workers=2)
        try:
            loader, _ = make_loader(volumes, "cpu", **kwargs)
            with loader:
                return [digest(b["raw"], b["labels"]) for b in (loader.next_batch() for _ in range(6))]
        finally:
            current["info"] = None

    workers = [stream(0), stream(1)]
    assert not set(workers[0]) & set(workers[1])
    assert workers == [stream(None, rank=0, world_size=2), stream(None, rank=1, world_size=2)]
    assert stream(0, worker_sharding=False) == stream(1, worker_sharding=False) == stream(None)
    assert stream(1, rank=1, world_size=3) == stream(None, rank=3, world_size=6)
    # built in the main process and handed to the workers (fork or pickle): the shard is the one it starts in
    built_in_parent, _ = make_loader(volumes, "cpu")
    current["info"] = types.SimpleNamespace(id=1, num_workers=2)
    with built_in_parent:
        started_in_worker = [digest(b["raw"], b["labels"]) for b in (built_in_parent.next_batch() for _ in range(6))]
    current["info"] = None
    assert started_in_worker == workers[1] and built_in_parent.shard == (1, 2)


@dataclasses.dataclass(eq=False, repr=False)
class RecordedMasked(ef.sampling.Masked):
    """Masked, appending the pid of each process that builds an index to the file ``builds`` (a spawned worker
    imports this class from here)."""

    builds: str = ""

    def _index(self, *args):
        with open(self.builds, "a") as out:
            out.write(f"{os.getpid()}\n")
        return super()._index(*args)


@dataclasses.dataclass(eq=False, repr=False)
class RecordedBalanced(ef.sampling.Balanced):
    """Balanced, recording its index builds as :class:`RecordedMasked` does."""

    builds: str = ""

    def _count(self, *args):
        with open(self.builds, "a") as out:
            out.write(f"{os.getpid()}\n")
        return super()._count(*args)


def recorded(sampler: str, builds) -> ef.sampling.Sampler:
    """The sampler named, recording its index builds in the file ``builds``."""
    if sampler == "balanced":
        return RecordedBalanced("boundary", builds=str(builds))
    return RecordedMasked(0.5, source="labels", unlabelled=0, builds=str(builds))


def builders(builds) -> list:
    """The pid of each index build recorded in ``builds``."""
    return builds.read_text().split() if builds.exists() else []


class Digests(IterableDataset):
    """(shard, batch index, digest of raw) for each batch of a loader, as a torch dataset (module level: a spawned
    DataLoader worker imports it from here)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield tuple(self.loader.shard), batch.index, digest(batch["raw"])


class Resuming(IterableDataset):
    """Each batch of a loader as (worker, digest of raw, the loader's state after it), the loader first continued
    from ``states[worker]`` and stopped after ``stop`` batches (module level: spawned workers import it)."""

    def __init__(self, loader, states=None, stop=None):
        self.loader, self.states, self.stop = loader, states, stop

    def __iter__(self):
        import torch
        worker = torch.utils.data.get_worker_info().id
        if self.states:
            self.loader.load_state_dict(self.states[worker])
        with self.loader:
            for n, batch in enumerate(self.loader, start=1):
                yield worker, digest(batch["raw"]), self.loader.state_dict()
                if n == self.stop:
                    return


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_continue_from_the_states_they_saved(volumes, context):
    """A loader handed to DataLoader workers took its worker's shard only when it started: a worker restoring the
    state it saved (load_state_dict before the start, as it must be) was refused as another stream, and len()
    there gave the main process's epoch (a helper's trial). Each worker now continues its own stream."""
    torch = pytest.importorskip("torch")

    def rows(dataset):
        return list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                                multiprocessing_context=context))

    def loader():
        return make_loader(volumes, "cpu", epoch_size=6, threads=1)[0]

    whole, begun = rows(Resuming(loader())), rows(Resuming(loader(), stop=2))
    states = {int(worker): state for worker, _, state in begun}  # each worker's last
    rest = rows(Resuming(loader(), states=states))
    def of(table, worker):
        return [batch for w, batch, _ in table if int(w) == worker]

    for worker in range(2):
        assert of(begun, worker) + of(rest, worker) == of(whole, worker) and len(of(whole, worker)) == 6


def test_a_loader_handed_to_a_worker_answers_for_the_workers_share_before_it_starts(volumes, monkeypatch):
    """shard and len() of a loader built in the main process, asked in a DataLoader worker before it starts, are
    the worker's (a Tiled sampler's epoch is that worker's tiles; together about the main process's len())."""
    from emfast.pipeline import _loader

    whole = len(make_loader(volumes, "cpu", sampler=ef.Tiled(), augment=())[0])
    shares = []
    for worker in range(2):
        loader = make_loader(volumes, "cpu", sampler=ef.Tiled(), augment=())[0]
        monkeypatch.setattr(_loader, "torch_worker", lambda: (worker, 2))
        assert loader.shard == (worker, 2)
        shares.append(len(loader))
        with loader:
            assert len(list(loader)) == shares[-1]
        monkeypatch.setattr(_loader, "torch_worker", lambda: None)
    assert whole <= sum(shares) <= whole + 2  # as the README counts a DataLoader epoch


def test_a_tiled_loader_in_a_worker_restores_its_state_and_reports_its_position_in_its_own_epochs(volumes,
                                                                                                 monkeypatch):
    """A worker's copy read its epoch size before taking its shard: with a Tiled sampler (a worker's epochs are
    its share), load_state_dict as the first call refused the state the worker saved, and after set_epoch the
    position it reported before starting was counted in the main process's epochs (a second review)."""
    from emfast.pipeline import _loader

    def tiled():
        return make_loader(volumes, "cpu", sampler=ef.Tiled(), augment=())[0]

    saving, restoring, epoch_set = tiled(), tiled(), tiled()  # built in the main process
    epoch_set.set_epoch(1)
    monkeypatch.setattr(_loader, "torch_worker", lambda: (1, 2))  # then handed to worker 1 of 2
    with saving:
        for _ in range(2):
            saving.next_batch()
        state = saving.state_dict()
        rest = [digest(batch["raw"]) for batch in saving]
    restoring.load_state_dict(state)
    with restoring:
        assert [digest(batch["raw"]) for batch in restoring] == rest
    told = epoch_set.state_dict()
    assert told["next_batch"] == len(epoch_set) == told["epoch_size"]
    with epoch_set:
        assert epoch_set.state_dict()["next_batch"] == told["next_batch"]


def test_a_worker_copy_interrupted_while_it_takes_its_shard_takes_it_when_asked_again(volumes, monkeypatch):
    """The shard was recorded before the sampler was bound to it: interrupted there (Ctrl-C while an index
    builds), the copy reported the worker's shard and streamed the whole (a second review)."""
    from emfast.pipeline import _loader

    loader = make_loader(volumes, "cpu", epoch_size=3)[0]
    monkeypatch.setattr(_loader, "torch_worker", lambda: (1, 2))
    bind, calls = loader.sampler.bind, []

    def interrupted_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return bind(*args)

    monkeypatch.setattr(loader.sampler, "bind", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        len(loader)
    assert loader.shard == (1, 2) and len(calls) == 2
    reference = make_loader(volumes, "cpu", epoch_size=3, rank=1, world_size=2, worker_sharding=False)[0]
    with loader, reference:
        assert [digest(b["raw"]) for b in loader] == [digest(b["raw"]) for b in reference]


@pytest.mark.parametrize("sampler,context", [("balanced", "fork"), ("masked", "fork"), ("masked", "spawn")])
def test_dataloader_workers_reuse_the_index_their_loader_was_built_with(volumes, tmp_path, sampler, context):
    """Each torch DataLoader worker binds its copy of the loader again to draw its shard, and rebuilt the
    sampler's index there: every worker, every epoch, read the labels and recounted them (15 s per worker and
    epoch before the first batch, for one CREMI-sized sample). A spawned worker (macOS's and Windows' default,
    Python 3.14's forkserver on Linux) gets the loader pickled, the index with it. The workers' batches are their
    shards'."""
    torch = pytest.importorskip("torch")
    builds = tmp_path / "builds"
    chosen = recorded(sampler, builds)
    loader, _ = make_loader(volumes, "cpu", epoch_size=2, sampler=chosen)
    built = builders(builds)
    assert built and set(built) == {str(os.getpid())}  # one index per window extent, here
    rows = sorted(torch.utils.data.DataLoader(Digests(loader), batch_size=None, num_workers=2,
                                              multiprocessing_context=context))
    assert builders(builds) == built
    for worker in range(2):
        reference, _ = make_loader(volumes, "cpu", epoch_size=2, sampler=chosen, rank=worker, world_size=2)
        with reference:
            assert [tuple(row[1:]) for row in rows if tuple(row[0]) == (worker, 2)] == \
                [(batch.index, digest(batch["raw"])) for batch in reference]


def _lazy_sample(directory, labels):
    import zarr

    rng = np.random.default_rng(3)
    raw = zarr.create_array(directory / "raw.zarr", shape=labels.shape, chunks=(4, 16, 16), dtype=np.uint8)
    raw[:] = rng.integers(0, 256, labels.shape, dtype=np.uint8)
    zarr.create_array(directory / "labels.zarr", shape=labels.shape, chunks=(4, 16, 16), dtype=labels.dtype)[:] = labels
    return ef.Sample(ef.open(directory / "raw.zarr", in_memory=False),
                     labels=ef.open(directory / "labels.zarr", in_memory=False))


@pytest.mark.parametrize("sampler", ["balanced", "masked"])
@pytest.mark.parametrize("lazy", [False, True])
def test_a_pickled_loader_reuses_its_samplers_index_where_its_volumes_reopen_unchanged(volumes, tmp_path, sampler,
                                                                                     lazy):
    """A spawned DataLoader worker (the default start method on macOS and Windows, and Python 3.14's forkserver on
    Linux) gets the loader pickled, as its arguments: it rebuilt the sampler's index from the labels, in every
    worker and epoch. The index travels with the loader; batches are those of the loader it was built for."""
    builds = tmp_path / "builds"
    chosen = recorded(sampler, builds)
    labels = np.where(volumes[1] % 3 == 0, 0, volumes[1] % 7).astype(np.uint64)  # background and a few ids
    data = (_lazy_sample(tmp_path, labels),) if lazy else (volumes[0], labels)
    loader = ef.Loader(*data, patch=PATCH, batch_size=3, seed=5, threads=2, sampler=chosen, epoch_size=4)
    built = builders(builds)
    assert built
    worker = pickle.loads(pickle.dumps(loader))  # as a spawned worker gets it
    assert builders(builds) == built
    with loader, worker:
        assert [digest(b["raw"], b["labels"]) for b in worker] == [digest(b["raw"], b["labels"]) for b in loader]


def test_a_pickled_loader_builds_the_index_again_where_the_labels_changed_on_disk(volumes, tmp_path):
    """The index is reused only for volumes that reopen as they were: labels rewritten between pickling and
    unpickling (their stamp changed) are indexed again, and the windows follow the new labels."""
    import zarr

    builds = tmp_path / "builds"
    chosen = recorded("masked", builds)
    labels = np.zeros(volumes[1].shape, np.uint64)
    labels[:6] = 1  # labelled windows only in the lower half of z
    loader = ef.Loader(_lazy_sample(tmp_path, labels), patch=PATCH, batch_size=3, seed=5, sampler=chosen,
                       epoch_size=4, augment=())
    carried = pickle.dumps(loader)
    built = len(builders(builds))
    time.sleep(0.01)  # a distinct modification time
    zarr.create_array(tmp_path / "labels.zarr", shape=labels.shape, chunks=(4, 16, 16), dtype=labels.dtype,
                      overwrite=True)[:] = labels[::-1]  # now only the upper half
    worker = pickle.loads(carried)
    assert len(builders(builds)) > built
    with worker:
        corners = np.concatenate([np.asarray(b.positions).reshape(-1, 3) for b in worker])
    def covered(labelled, corner):  # the share of a window's voxels that are labelled
        z, y, x = corner
        return (labelled[z:z + PATCH[0], y:y + PATCH[1], x:x + PATCH[2]] != 0).mean()

    assert len(corners) == 12 and all(covered(labels[::-1], corner) >= 0.5 for corner in corners)
    assert not all(covered(labels, corner) >= 0.5 for corner in corners)


def test_a_pickled_loader_stays_small_whatever_its_samplers_index(tmp_path):
    """A spawned worker's pickle goes through a pipe (64 KiB) that holds the parent until the worker has imported
    its modules: carried in the pickle, a masked sampler's 19 MB index made the two workers of each epoch start
    one after the other (1.3 s later here). The index travels in a file, removed with the loader that wrote it;
    a copy unpickled after that builds it again."""
    builds = tmp_path / "builds"
    labels = np.random.default_rng(4).integers(0, 3, (32, 192, 192)).astype(np.uint64)
    loader = ef.Loader(_lazy_sample(tmp_path, labels), patch=PATCH, batch_size=3, seed=5, epoch_size=2,
                       sampler=recorded("masked", builds), augment=())
    assert loader.sampler.index_nbytes > 1 << 16
    carried = pickle.dumps(loader)
    assert len(carried) < 1 << 16
    built = len(builders(builds))
    with pickle.loads(carried) as worker, loader:
        assert len(builders(builds)) == built
        assert [digest(b["raw"]) for b in worker] == [digest(b["raw"]) for b in loader]
    path = loader.sampler._carried.path
    assert os.path.exists(path)
    del loader
    gc.collect()
    assert not os.path.exists(path)
    with pickle.loads(carried) as late:
        assert len(builders(builds)) > built and len(list(late)) == 2


def test_the_index_file_outlives_a_forked_childs_copy_and_its_exit(volumes, tmp_path):
    """A forked child inherits the finalizer that removes the file: dropping its copy of the loader, or exiting,
    removed the parent's file, and later spawned workers silently built the index again (a second review)."""
    labels = np.where(volumes[1] % 3 == 0, 0, 1).astype(np.uint64)
    loader = ef.Loader(_lazy_sample(tmp_path, labels), patch=PATCH, batch_size=3, epoch_size=2,
                       sampler=ef.sampling.Masked(0.5, source="labels", unlabelled=0))
    pickle.dumps(loader)
    path = loader.sampler._carried.path
    pid = os.fork()
    if pid == 0:
        try:
            del loader
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.path.exists(path)


def test_indexes_that_cannot_be_written_are_built_again_where_the_loader_is_unpickled(volumes, tmp_path,
                                                                                     monkeypatch):
    """A full temporary disk (or a custom sampler's index that does not pickle) made pickling the loader fail,
    where it pickled as its arguments before (a second review): the copy builds the index, as it did then."""
    from emfast.sampling import _base

    builds = tmp_path / "builds"
    labels = np.where(volumes[1] % 3 == 0, 0, 1).astype(np.uint64)
    loader = ef.Loader(_lazy_sample(tmp_path, labels), patch=PATCH, batch_size=3, epoch_size=2,
                       sampler=recorded("masked", builds), augment=())
    built = len(builders(builds))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    def index_files():
        return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("emfast-sampler-indexes-")}

    before = index_files()
    monkeypatch.setattr(_base.pickle, "dump", full_disk)
    carried = pickle.dumps(loader)
    monkeypatch.undo()
    assert index_files() == before  # the file begun is removed
    with pickle.loads(carried) as worker, loader:
        assert len(builders(builds)) > built
        assert [digest(b["raw"]) for b in worker] == [digest(b["raw"]) for b in loader]


def test_a_region_a_custom_sampler_made_itself_is_indexed_by_the_object():
    """A subclass indexing a region that is not one of those bound (a dataclasses.replace copy) met a bare
    StopIteration from the lookup of its place (a second review)."""
    import dataclasses

    region = ef.sampling.Region("a", 1.0, np.zeros(3, np.int64), np.full(3, 8, np.int64))
    sampler = ef.Uniform()
    sampler.bind([region], np.asarray([[2, 2, 2]]), 1)
    copy = dataclasses.replace(region)
    assert sampler._indexed(copy, ("key",), lambda: "built") == "built"
    sampler._previous_indexes = dict(sampler._indexes)
    assert sampler._indexed(copy, ("key",), lambda: "again") == "built"


def test_set_epoch_moves_fresh_dataloader_workers_to_that_epoch(volumes):
    """A torch DataLoader without persistent workers hands each epoch's new workers fresh copies of the loader,
    which all began at epoch 0: every epoch delivered the same batches. set_epoch(e), called in the main process
    before each epoch, starts the copies at epoch e, each in its worker's shard: the batches a loader of that
    shard delivers in epoch e."""
    torch = pytest.importorskip("torch")

    class Digests(torch.utils.data.IterableDataset):
        """Each batch of the loader as (shard, epoch, index, digest of raw)."""

        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            for batch in self.loader:
                yield tuple(self.loader.shard), batch.epoch, batch.index, digest(batch["raw"])

    loader, _ = make_loader(volumes, "cpu", epoch_size=3)
    data = torch.utils.data.DataLoader(Digests(loader), batch_size=None, num_workers=2, persistent_workers=False)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append(sorted(data))
    assert {row[1] for row in epochs[0]} == {0} and {row[1] for row in epochs[1]} == {1}
    assert not {row[3] for row in epochs[0]} & {row[3] for row in epochs[1]}
    for worker in range(2):
        reference, _ = make_loader(volumes, "cpu", epoch_size=3, rank=worker, world_size=2)
        with reference:
            expected = [(epoch, batch.index, digest(batch["raw"])) for epoch in range(2) for batch in reference]
        assert [tuple(row[1:]) for rows in epochs for row in rows if tuple(row[0]) == (worker, 2)] == expected
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        loader.set_epoch(-1)
    endless, _ = make_loader(volumes, "cpu")
    with pytest.raises(ValueError, match="set_epoch\\(\\) needs epoch_size"):
        endless.set_epoch(1)
    with endless, pytest.raises(RuntimeError, match="before the loader starts"):
        endless.set_epoch(0)


def test_a_dataloader_collating_batches_is_told_to_use_batch_size_none(volumes):
    """torch's default collation requests batch_size batches before it reads the first, which by then is
    released: the error said only to copy before requesting the next, which the user never did."""
    torch = pytest.importorskip("torch")

    class Batches(torch.utils.data.IterableDataset):
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            return iter(self.loader)

    loader, _ = make_loader(volumes, "cpu", epoch_size=4)
    with loader, pytest.raises(ef.BatchReleasedError, match=r"give it batch_size=None"):
        next(iter(torch.utils.data.DataLoader(Batches(loader), batch_size=2)))


def test_set_epoch_travels_with_a_pickled_loader_to_its_workers_shard(volumes, monkeypatch):
    """A spawned worker gets the loader pickled: it carried the position (epoch x the main process's epoch size)
    but not the epoch, so a worker whose shard has shorter epochs (a tiled sampler) began mid-way through
    another epoch. The epoch travels, and is counted in the worker's shard."""
    from emfast.pipeline import _loader

    def tiled(**kwargs):
        return make_loader(volumes, "cpu", sampler=ef.Tiled(), augment=(), **kwargs)[0]

    loader = tiled()
    loader.set_epoch(1)
    worker = pickle.loads(pickle.dumps(loader))  # as a spawned worker gets it, before its worker info is set
    monkeypatch.setattr(_loader, "torch_worker", lambda: (1, 2))  # then started in worker 1 of 2
    with worker:
        got = [(batch.epoch, batch.index, digest(batch["raw"])) for batch in worker]
    monkeypatch.setattr(_loader, "torch_worker", lambda: None)
    with tiled(rank=1, world_size=2) as reference:
        expected = [(batch.epoch, batch.index, digest(batch["raw"])) for epoch in range(2) for batch in reference]
    assert worker.epoch_size < loader.epoch_size and got == expected[len(got):]


@pytest.mark.parametrize("pickled", [False, True])
def test_a_tiled_loader_given_its_own_epoch_size_starts_in_a_worker_with_the_workers_share(volumes, monkeypatch,
                                                                                            pickled):
    """epoch_size equal to a Tiled sampler's epoch was accepted when the loader was built, then refused in every
    DataLoader worker: the worker's shard has fewer tiles, and the check ran again against them."""
    from emfast.pipeline import _loader

    def tiled(**kwargs):
        return make_loader(volumes, "cpu", sampler=ef.Tiled(), augment=(), **kwargs)[0]

    whole = tiled().epoch_size
    loader = tiled(epoch_size=whole)
    worker = pickle.loads(pickle.dumps(loader)) if pickled else loader  # spawned, or forked, worker
    monkeypatch.setattr(_loader, "torch_worker", lambda: (1, 2))
    with worker:
        got = [(batch.index, digest(batch["raw"])) for batch in worker]
    monkeypatch.setattr(_loader, "torch_worker", lambda: None)
    with tiled(rank=1, world_size=2) as reference:
        expected = [(batch.index, digest(batch["raw"])) for batch in reference]
    assert worker.epoch_size == reference.epoch_size < whole and got == expected
    with pytest.raises(ValueError, match=rf"epoch_size={whole + 1}, but Tiled.* has {whole} batches per epoch"):
        tiled(epoch_size=whole + 1)  # still checked when the loader is built
    # a copy made in the worker (pickled, deep-copied) was refused there: its given epoch_size is the whole's
    monkeypatch.setattr(_loader, "torch_worker", lambda: (1, 2))
    for copied in (pickle.loads(pickle.dumps(tiled(epoch_size=whole))), tiled(epoch_size=whole)):
        assert len(copied) == reference.epoch_size


def test_a_loader_started_before_fork_fails_clearly_in_the_child(volumes):
    loader, _ = make_loader(volumes, "cpu")
    with loader:
        before = digest(loader.next_batch()["raw"])
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what happens, then leave without running the parent's cleanup
            try:
                try:
                    loader.next_batch()
                    message = "no error"
                except RuntimeError as error:
                    message = str(error)
                loader.close()
                again, _ = make_loader(volumes, "cpu", threads=1)
                with again:
                    message += "|" + digest(again.next_batch()["raw"])
            except BaseException as error:  # noqa: BLE001 - any failure goes to the parent's assertion
                message = f"child failed: {error!r}"
            os.write(writer, message.encode())
            os._exit(0)
        os.close(writer)
        answered = select.select([reader], [], [], 60)[0]  # a child that hangs fails the test, it cannot hang it
        if not answered:
            os.kill(pid, 9)
        assert answered, "the forked child did not answer within 60 s"
        with os.fdopen(reader) as pipe:
            message = pipe.read()
        os.waitpid(pid, 0)
        loader.next_batch()  # the parent's loader is unaffected
    error, child_digest = message.split("|")
    assert "before it forked" in error and "Create the Loader in the child" in error
    assert child_digest == before


def _first_digests(loader, count=3):
    """Runs in a spawned process: the loader arrives pickled, unstarted."""
    with loader:
        return [digest(b["raw"], b["labels"]) for b in (loader.next_batch() for _ in range(count))]


def test_an_unstarted_loader_pickles_for_spawned_processes_with_lazy_volumes(tmp_path):
    import multiprocessing
    import pickle

    import h5py

    rng = np.random.default_rng(8)
    path = tmp_path / "sample.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=rng.integers(0, 256, (12, 40, 36), dtype=np.uint8), chunks=(4, 16, 16))
        f.create_dataset("labels", data=rng.integers(0, 9, (12, 40, 36), dtype=np.uint64), chunks=(4, 16, 16))
    sample = ef.Sample(ef.hdf5(path, "raw", in_memory=False), labels=ef.hdf5(path, "labels", in_memory=False))
    loader = ef.Loader(sample, patch=PATCH, batch_size=3, seed=5, augment=["mirror", "intensity"],
                       targets=[ef.Affinities()])
    loader.load_state_dict({**loader.state_dict(), "next_batch": 4})  # the position travels too
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawned = pool.apply(_first_digests, (loader,))
    assert spawned == _first_digests(pickle.loads(pickle.dumps(loader)))
    twin = ef.Loader(sample, patch=PATCH, batch_size=3, seed=5, augment=["mirror", "intensity"],
                     targets=[ef.Affinities()])
    with twin:
        for _ in range(4):
            twin.next_batch()
        assert [digest(b["raw"], b["labels"]) for b in (twin.next_batch() for _ in range(3))] == spawned
    with loader:
        with pytest.raises(TypeError, match="started or closed Loader cannot be pickled"):
            pickle.dumps(loader)
        with pytest.raises(TypeError, match=r"pickle batch.copy\(\)"):
            pickle.dumps(loader.next_batch())


@pytest.mark.parametrize("ending", ["referenced", "unreferenced", "unreferenced, owning its file"])
def test_a_script_ending_without_close_on_a_lazy_hdf5_loader_exits(tmp_path, ending):
    """Python's exit waited forever on h5py's lock, held by a producer frozen mid-read (7 of 8 runs): the loader
    was still referenced at exit, or unreferenced with a thread of its finalizer still stopping it."""
    import subprocess
    from pathlib import Path

    import h5py
    data = np.random.default_rng(2).integers(0, 256, (64, 256, 256), dtype=np.uint8)
    with h5py.File(tmp_path / "raw.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=(16, 64, 64), compression="gzip")
    script = (f"import emfast as ef\n"
              f"volume = ef.hdf5({str(tmp_path / 'raw.h5')!r}, 'raw', in_memory=False, cache_bytes=2**20)\n"
              f"loader = ef.Loader(volume, patch=(16, 64, 64), batch_size=4, threads=2, seed=9, epoch_size=100, "
              f"close_data={'owning' in ending})\n"
              f"for batch in loader:\n    break\n"
              + ("del loader, batch\n" if ending.startswith("unreferenced") else ""))
    source = str(Path(ef.__file__).resolve().parents[1])
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=source),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_the_readmes_loop_keeping_its_last_tensor_at_module_level_exits_quietly(tmp_path):
    """The README's loop at a script's top level: the last batch's tensor lives until the interpreter tears its
    modules down, and giving its slot back then printed "Exception ignored in: Lease.__del__ ... TypeError"
    (the queue module was already gone)."""
    import subprocess
    from pathlib import Path

    import h5py
    pytest.importorskip("torch")
    data = np.random.default_rng(2).integers(0, 256, (32, 128, 128), dtype=np.uint8)
    with h5py.File(tmp_path / "raw.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=(16, 64, 64))
    script = (f"import torch\nimport emfast as ef\n"
              f"raw = ef.hdf5({str(tmp_path / 'raw.h5')!r}, 'raw', in_memory=False)\n"
              f"loader = ef.Loader(raw, patch=(16, 64, 64), batch_size=4, threads=2, epoch_size=10, seed=0)\n"
              f"with loader:\n    for batch in loader:\n        x = batch.torch()['raw']\n        float(x.mean())\n")
    source = str(Path(ef.__file__).resolve().parents[1])
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=source),
                              capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_a_decoder_library_is_looked_up_leaves_the_child_able_to_decode(monkeypatch):
    """DataLoader workers forked while the parent's first compressed read looked up libdeflate (35 ms, its lock
    held) waited for that lock forever."""
    from emfast.io import _deflate
    decoder = _deflate._LIBDEFLATE
    monkeypatch.setattr(decoder, "_library", None)  # not looked up yet, whatever ran before in this process
    with decoder._lock:  # the parent's lookup in progress on another thread
        pid = os.fork()
        if pid == 0:  # the child: the lookup must not wait for a thread that does not exist here
            code = 0
            try:
                decoder.found()
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child waited for the decoder's lock, held by a thread of its parent")


def test_cpu_batch_slots_are_mappings_of_their_own(volumes):
    """A CPU batch's arrays each lie in a mapping of their own, unmapped once the slot and its views are gone: as
    malloc's, loader after loader (one per epoch) raised glibc's threshold for mapping them, and the freed slots
    stayed in the heap (peaks 1.6x one loader's budget; a review)."""
    import mmap
    loader, _ = make_loader(volumes, "cpu")
    with loader:
        x = loader.next_batch()["raw"]
    root = x
    while root is not None and not isinstance(root, mmap.mmap):  # through the views and the slot's lease holder
        root = (root.base if isinstance(root, np.ndarray) else root.obj if isinstance(root, memoryview)
                else getattr(root, "_array", None))
    assert isinstance(root, mmap.mmap)


_LOADERS_ONE_AFTER_ANOTHER = """
import sys
import numpy as np, emfast as ef
def peak():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
raw = np.zeros((40, 256, 256), np.uint8)
peaks = []
for i in range(int(sys.argv[1])):
    open("/proc/self/clear_refs", "w").write("5")  # the high-water mark from here
    with ef.Loader(raw, patch=(16, 128, 128), batch_size=8, threads=2, augment=[ef.Rotate()], seed=i) as loader:
        for _ in range(6):
            loader.next_batch()
    peaks.append(peak())
print(peaks[0], max(peaks[1:]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="resets the peak RSS through /proc (Linux)")
def test_loaders_one_after_another_peak_no_higher_than_the_first(tmp_path):
    """A process building a loader per epoch: each peaks as high as the first (a review measured up to 1.6x one
    loader's budget after a few dozen, the slots freed into malloc's heap and kept)."""
    script = tmp_path / "loaders.py"
    script.write_text(_LOADERS_ONE_AFTER_ANOTHER)
    done = subprocess.run([sys.executable, str(script), "25"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    first, later = (float(v) for v in done.stdout.split())
    # A raw slot is 8 MiB (8 x 16 x 128 x 128 float32), and a loader allocates one more or less as its consumer
    # keeps up: the first peaks at 82 or 90 MiB. With malloc's slots later loaders peaked 24-32 MiB higher.
    assert later <= first + 12, (first, later)
