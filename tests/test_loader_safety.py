"""The loader refuses sizes that cannot fit, never hands one batch to two consumers, and leaves no thread behind
when its start is interrupted."""
import os
import random
import signal
import textwrap
import threading
import time

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast._machine import available_bytes
from emfast.cli import main
from emfast.pipeline import InsufficientMemoryError
from emfast.transfer._fake import FakeDevice
from threads import emfast_threads, threads_end

PATCH = (4, 16, 16)


@pytest.fixture
def raw():
    return np.random.default_rng(0).integers(0, 256, (12, 48, 48), dtype=np.uint8)


def _gib(nbytes):
    return f"{nbytes / 2**30:,.2f} GiB"


# -- sizes ------------------------------------------------------------------------------------------------------


def test_a_batch_size_whose_bytes_overflow_int64_is_refused_with_the_exact_numbers(raw):
    batch_size = 2**62
    slot = batch_size * 4 * 16 * 16 * 4  # float32 raw: 2**76 bytes, beyond int64
    with pytest.raises(InsufficientMemoryError) as caught:
        ef.Loader(raw, patch=PATCH, batch_size=batch_size, threads=1, buffers=2)
    message = str(caught.value)
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, ValueError)
    assert f"the loader needs {_gib(3 * slot)} but only" in message, message
    assert f"3 batch slots (buffers=2, plus one per producer thread) of {_gib(slot)} each" in message
    assert f"batch_size={batch_size} x patch_in {PATCH}" in message


def test_sizes_beyond_available_memory_are_refused_and_those_within_accepted(raw):
    available = available_bytes()
    if available is None:
        pytest.skip("this system does not report available memory (/proc/meminfo MemAvailable)")
    example = 4 * 16 * 16 * 4
    too_many = 2 * available // example  # two slots of this alone exceed what is available
    with pytest.raises(MemoryError, match=f"batch_size={too_many} x patch_in"):
        ef.Loader(raw, patch=PATCH, batch_size=too_many)
    assert ef.Loader(raw, patch=PATCH, batch_size=64).slot_bytes == 64 * example


_LIMITED = """
import resource, sys
import numpy as np
import emfast as ef
from emfast._machine import read_proc_field
size = int(read_proc_field("/proc/self/status", "VmSize").split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
try:
    ef.Loader(np.zeros((40, 300, 300), np.uint8), patch=(32, 256, 256), batch_size=48)
    print("built")
except ef.pipeline.InsufficientMemoryError as error:
    print(error)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmSize from /proc/self/status")
def test_a_loader_beyond_the_address_space_limit_is_refused_when_built(tmp_path):
    """Under ``ulimit -v`` (RLIMIT_AS, a cluster node's limit) a loader needing 5.6 GiB of slots was built, then
    failed in start() with NumPy's MemoryError naming none of its settings: the check saw only MemAvailable."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _LIMITED], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    assert "the loader needs" in done.stdout and "batch_size=48 x patch_in (32, 256, 256)" in done.stdout, done.stdout


_LIMITED_LAZY = """
import resource, sys
import h5py, numpy as np
import emfast as ef
from emfast._machine import read_proc_field
with h5py.File(sys.argv[1], "w") as f:  # 1 GiB that HDF5 stores as nothing: no chunk is written
    f.create_dataset("raw", shape=(64, 4096, 4096), dtype=np.uint8, chunks=(16, 256, 256))
volume = ef.open(sys.argv[1], "raw", in_memory=False, cache_bytes=1 << 30)
size = int(read_proc_field("/proc/self/status", "VmSize").split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
try:
    ef.Loader(volume, patch=(16, 128, 128), batch_size=2)
    print("built")
except ef.pipeline.InsufficientMemoryError as error:
    print(error)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmSize from /proc/self/status")
def test_a_lazy_loader_whose_caches_exceed_the_address_space_limit_is_refused_when_built(tmp_path):
    """The memory check counted slots and scratch only: a lazy loader whose chunk cache would outgrow ``ulimit -v``
    was built, and failed reading its first batches (a review). Its cache's budget (or its volume's bytes, where
    fewer) is counted now, and the refusal names cache_bytes."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _LIMITED_LAZY, str(tmp_path / "v.h5")], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    assert "the loader needs" in done.stdout and "1.00 GiB of the lazy volumes' chunk caches" in done.stdout, \
        done.stdout
    assert "smaller cache_bytes" in done.stdout


def test_a_cache_budget_beyond_its_volume_counts_the_volume_once(tmp_path):
    """A cutout's 1 GiB default budget is never filled, and a volume in two samples shares one cache."""
    from emfast.pipeline import chunk_cache_bytes
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 64, 64), np.uint16), chunks=(8, 32, 32))
    volume = ef.open(tmp_path / "v.h5", "raw", in_memory=False, cache_bytes=1 << 30)
    assert chunk_cache_bytes([volume, volume, ef.Volume.from_array(np.zeros((4, 4, 4), np.uint8))]) == 8 * 64 * 64 * 2


@pytest.mark.parametrize("version", [1, 2])
def test_a_cgroups_memory_limit_counts_without_its_file_cache(tmp_path, version):
    from emfast._machine import cgroup_memory_left
    (tmp_path / "proc").write_text("0::/job\n" if version == 2 else "12:memory:/job\n4:cpu,cpuacct:/job\n")
    folder = tmp_path / "root" / ("job" if version == 2 else "memory/job")
    folder.mkdir(parents=True)
    names = ("memory.max", "memory.current", "active_file", "inactive_file") if version == 2 else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_active_file", "total_inactive_file")
    (folder / names[0]).write_text(f"{8 << 30}\n")
    (folder / names[1]).write_text(f"{7 << 30}\n")  # of which 5 GiB file cache, which the kernel reclaims
    (folder / "memory.stat").write_text(f"anon {2 << 30}\n{names[2]} {3 << 30}\n{names[3]} {2 << 30}\n")
    assert cgroup_memory_left(str(tmp_path / "proc"), str(tmp_path / "root")) == 6 << 30
    unlimited = "max\n" if version == 2 else f"{(1 << 63) - 4096}\n"
    (folder / names[0]).write_text(unlimited)  # no limit here...
    assert cgroup_memory_left(str(tmp_path / "proc"), str(tmp_path / "root")) is None
    (folder / "task").mkdir()  # ...but on the job above the process's own cgroup, as Slurm sets it (a review)
    for file, text in ((names[0], unlimited), (names[1], f"{1 << 30}\n"), ("memory.stat", "")):
        (folder / "task" / file).write_text(text)
    (folder / names[0]).write_text(f"{8 << 30}\n")
    (tmp_path / "proc").write_text("0::/job/task\n" if version == 2 else "12:memory:/job/task\n")
    assert cgroup_memory_left(str(tmp_path / "proc"), str(tmp_path / "root")) == 6 << 30
    (tmp_path / "proc").write_text("0::/elsewhere\n" if version == 2 else "12:memory:/docker/abc\n")
    mount = tmp_path / "root" / ("" if version == 2 else "memory")  # a container mounts its own cgroup there
    for file, text in ((names[0], f"{2 << 30}\n"), (names[1], f"{1 << 30}\n"), ("memory.stat", "")):
        (mount / file).write_text(text)
    assert cgroup_memory_left(str(tmp_path / "proc"), str(tmp_path / "root")) == 1 << 30


def test_lazy_fields_count_each_threads_scratch(tmp_path, raw):
    path = tmp_path / "raw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=raw, chunks=(4, 16, 16))
    volume = ef.hdf5(path, "raw", in_memory=False)
    loader = ef.Loader(volume, patch=PATCH, batch_size=8, threads=3)
    assert loader._gatherer.scratch_bytes() == 0  # lazy windows are gathered in place from the chunk cache
    mixed = ef.Loader(ef.Dataset([ef.Sample(volume), ef.Sample(raw)]), patch=PATCH, batch_size=8, threads=3)
    assert mixed._gatherer.scratch_bytes() == 8 * 4 * 16 * 16  # lazy and in memory: one read buffer per example
    volume.close()


def _config(folder, batch_size):
    with h5py.File(folder / "a.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((12, 48, 48), np.uint8))
    path = folder / "train.yaml"
    path.write_text(textwrap.dedent(f"""\
        data:
          samples:
            - {{file: a.h5, raw: raw}}
        loader: {{patch: [4, 16, 16], batch_size: {batch_size}}}
        """))
    return path


@pytest.mark.parametrize("batch_size", [2**62, 2**40])
def test_check_refuses_a_huge_batch_size_with_exit_2_and_one_line(tmp_path, capsys, batch_size):
    assert main(["check", str(_config(tmp_path, batch_size))]) == 2
    captured = capsys.readouterr()
    assert "valid" not in captured.out
    error = captured.err.strip()
    assert f"batch_size={batch_size} x patch_in" in error and "of memory is available" in error, error


def test_demo_refuses_a_huge_batch_size_with_exit_2(tmp_path, capsys):
    arguments = ["demo", "--batch-size", str(2**40), "--volume-shape", "8", "40", "40", "--patch", "4", "16", "16",
                 "--batches", "1", "--threads", "1", "--cache-dir", str(tmp_path)]
    assert main(arguments) == 2
    assert f"batch_size={2**40} x patch_in" in capsys.readouterr().err


# -- one consumer -----------------------------------------------------------------------------------------------


def _consume(loader, barrier, taken, errors):
    barrier.wait()
    try:
        for batch in loader:
            total = float(batch["raw"].sum())
            time.sleep(0.001)  # meanwhile the other thread takes batches: this one must stay this thread's
            assert float(batch["raw"].sum()) == total
            taken.append((batch.number, total))
    except Exception as error:  # noqa: BLE001 - recorded for the test's assertions
        errors.append(error)


@pytest.mark.parametrize("trial", range(3))
def test_two_threads_iterating_one_loader_each_get_distinct_batches_and_end(raw, trial):
    arguments = dict(patch=PATCH, batch_size=2, epoch_size=20, threads=2, seed=trial)
    loader = ef.Loader(raw, **arguments)
    taken, errors = [], []
    barrier = threading.Barrier(2)
    consumers = [threading.Thread(target=_consume, args=(loader, barrier, taken, errors), name=f"consumer-{i}")
                 for i in range(2)]
    try:
        for thread in consumers:
            thread.start()
        for thread in consumers:
            thread.join(timeout=20)
        hung = [thread.name for thread in consumers if thread.is_alive()]
    finally:
        loader.close()  # wakes a consumer that waits forever, so that a regression fails instead of hanging
        for thread in consumers:
            thread.join(timeout=5)
    assert not hung, f"{hung} still waiting for a batch"
    assert not errors, errors
    numbers = sorted(number for number, _ in taken)
    assert numbers == list(range(40)), f"batches shared or skipped: {numbers}"  # each loop ends at its epoch's end
    with ef.Loader(raw, **arguments) as alone:  # the very batches one consumer would have got
        expected = [float(alone.next_batch()["raw"].sum()) for _ in range(40)]
    assert [total for _, total in sorted(taken)] == expected


def test_a_thread_taking_a_batch_leaves_the_batch_another_thread_holds_alive(raw):
    with ef.Loader(raw, patch=PATCH, batch_size=2, threads=1) as loader:
        held = loader.next_batch()
        other = {}
        worker = threading.Thread(target=lambda: other.update(number=loader.next_batch().number), name="validation")
        worker.start()
        worker.join(timeout=10)
        assert other["number"] == 1
        assert held["raw"].shape == (2, 1) + PATCH  # not released by the other thread's request
        assert loader.next_batch().number == 2  # the worker ended: its batch was released, the stream goes on
        with pytest.raises(ef.BatchReleasedError):
            held["raw"]


# -- Ctrl-C while starting ----------------------------------------------------------------------------------------


def _sigint_after(delay, after_first_producer):
    """A thread that sends this process a real SIGINT ``delay`` seconds after it starts, or after the first
    producer thread exists (then ``delay`` lands inside the loop that starts the producers)."""
    def send():
        if after_first_producer:
            deadline = time.monotonic() + 2
            while not any(name.startswith("emfast-producer") for name in emfast_threads()):
                if time.monotonic() > deadline:
                    return
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)

    return threading.Thread(target=send, name="sigint-sender")


def _interrupted_in_start(error):
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return "start" in frames


def _interrupt_starts(make_loader, trials):
    """Ctrl-C ``trials`` loaders at random moments of their start; return (loaders, interrupts inside start())."""
    randomness = random.Random(2024)
    in_start = 0
    loaders = []  # kept alive, as a user's variable keeps them: their finalizers must not be what stops the threads
    for trial in range(trials):
        loader = make_loader(trial)
        loaders.append(loader)
        after_first_producer = trial % 2 == 1
        sender = _sigint_after(randomness.uniform(0, 0.002 if after_first_producer else 0.01), after_first_producer)
        try:
            sender.start()
            with loader:
                time.sleep(1)  # the interrupt arrives before this ends
            pytest.fail("no SIGINT arrived")
        except KeyboardInterrupt as error:
            in_start += _interrupted_in_start(error)
        finally:
            sender.join()
        assert threads_end(seconds=2), f"trial {trial}: threads still running after Ctrl-C: {emfast_threads()}"
    return loaders, in_start


MAIN_THREAD_ONLY = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                      reason="SIGINT reaches the main thread")


@MAIN_THREAD_ONLY
def test_ctrl_c_at_random_moments_of_start_leaves_no_thread_running(raw):
    loaders, in_start = _interrupt_starts(
        lambda trial: ef.Loader(raw, patch=PATCH, batch_size=8, threads=12, buffers=24, seed=trial), 16)
    assert in_start >= 4, f"only {in_start} of 16 interrupts landed inside start(); the test lost its aim"
    for loader in loaders:
        loader.close()


@MAIN_THREAD_ONLY
def test_ctrl_c_during_start_of_a_device_loader_stops_the_copier_and_frees_the_device(raw):
    devices, loaders, in_start = [], [], 0
    for _ in range(4):  # rounds of 8 until 2 interrupts landed inside start() (1 of 8 once, on another machine)
        made = [FakeDevice(seed=len(devices) + trial) for trial in range(8)]
        devices += made
        kept, landed = _interrupt_starts(
            lambda trial: ef.Loader(raw, patch=PATCH, batch_size=8, threads=8, buffers=8, device=made[trial]), 8)
        loaders += kept
        in_start += landed
        if in_start >= 2:
            break
    assert in_start >= 2, f"only {in_start} of {len(devices)} interrupts landed inside start(); the test lost its aim"
    # On a loaded machine the interrupt may land before the copier thread opened its device: nothing to free then.
    opened = [device for device in devices if device.owner is not None]
    assert len(opened) >= 2
    assert all(device.closed and device.live == 0 for device in opened), [(d.closed, d.live) for d in opened]
    for loader in loaders:
        loader.close()


def test_a_thread_that_cannot_be_started_stops_those_already_started(raw, monkeypatch):
    """The operating system refuses threads at its limit ("can't start new thread"): the third producer here."""
    loader = ef.Loader(raw, patch=PATCH, batch_size=2, threads=4)
    original, started = threading.Thread.start, []

    def start_or_fail(thread):
        if thread.name.startswith("emfast-producer") and len(started) == 2:
            raise RuntimeError("can't start new thread")
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", start_or_fail)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        with loader:
            pass
    assert started == ["emfast-producer-0", "emfast-producer-1"]
    assert threads_end(seconds=2), emfast_threads()
    monkeypatch.undo()
    with loader:  # left unstarted, not broken: it starts again
        assert loader.next_batch()["raw"].shape == (2, 1) + PATCH


def test_where_available_memory_is_unknown_sizes_beyond_the_address_space_are_still_refused(raw, monkeypatch):
    monkeypatch.setattr("emfast.pipeline._options.available_bytes", lambda: None)  # as on a system without /proc
    with pytest.raises(InsufficientMemoryError, match=r"GiB can be addressed: 3 batch slots"):
        ef.Loader(raw, patch=PATCH, batch_size=2**62, buffers=2)
    assert ef.Loader(raw, patch=PATCH, batch_size=2**20, buffers=2).slot_bytes == 2**20 * 4 * 16 * 16 * 4


@pytest.fixture
def own_signal_handlers():
    """The test's SIGINT and SIGTERM handlers are given back whatever it does."""
    import signal
    kept = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in kept.items():
        signal.signal(number, handler)


def test_a_held_sigterm_reaches_its_handler_before_a_held_ctrl_c(own_signal_handlers):
    """Ctrl-C then SIGTERM during a held wait (a join): re-delivering Ctrl-C first raised, and the program's
    SIGTERM handler never ran (a review: a scheduler's SIGTERM turned into exit 130)."""
    import signal
    from emfast._threads import ctrl_c_held
    for order in ((signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)):
        ran = []
        signal.signal(signal.SIGTERM, lambda number, frame: ran.append("SIGTERM"))
        with pytest.raises(KeyboardInterrupt):
            with ctrl_c_held():
                for number in order:
                    os.kill(os.getpid(), number)
                assert not ran  # held
        assert ran == ["SIGTERM"]


def test_a_signal_while_handlers_are_being_swapped_leaves_the_callers(own_signal_handlers, monkeypatch):
    """A SIGTERM taken as an interrupt, arriving after ctrl_c_held swapped SIGINT's handler and before SIGTERM's,
    left SIGINT bound to the hold's recorder for good (a review)."""
    import signal
    import types
    import emfast._threads as threads_module
    from emfast._threads import Terminated, ctrl_c_held, sigterm_interrupts
    real, swaps = signal.signal, []

    def swap(number, handler):
        previous = real(number, handler)
        swaps.append(number)
        if number == signal.SIGINT and handler.__name__ == "_record":  # the hold's first swap: SIGTERM lands now
            os.kill(os.getpid(), signal.SIGTERM)
        return previous
    patched = types.SimpleNamespace(**{k: getattr(signal, k) for k in dir(signal) if not k.startswith("__")})
    patched.signal = swap
    monkeypatch.setattr(threads_module, "signal", patched)
    mine = lambda number, frame: None  # noqa: E731
    real(signal.SIGINT, mine)
    with pytest.raises(Terminated):
        with sigterm_interrupts():
            with ctrl_c_held():
                pass
    assert signal.getsignal(signal.SIGINT) is mine
