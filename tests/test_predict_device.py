"""emfast.predict on a device through the loader's transfer backend: the fake device (host memory that enforces a
GPU's rules: copies complete late, results are copied back only into page-locked memory and read as poison until
waited for, device slots are never overwritten while viewed) against the CPU path, byte for byte; a real GPU with
torch where there is one."""
import threading
import time

import numpy as np
import pytest

import emfast as ef
from emfast.inference import ModelOutputError
from emfast.transfer._fake import FakeDevice, RuleBroken

zarr = pytest.importorskip("zarr", reason="prediction outputs in these tests are zarr (pip install 'emfast[zarr]')")

PATCH_IN = (10, 20, 20)
PATCH_OUT = (6, 12, 12)


def lopsided(batch):
    """Not mirror-symmetric, two channels, a fresh array: test-time variants differ, and nothing aliases the input."""
    centre = np.asarray(batch)[:, :, 2:-2, 4:-4, 4:-4]
    ramp = np.linspace(0.5, 1.5, centre.shape[-1], dtype=np.float32)
    return np.concatenate([centre * ramp, centre ** 2], axis=1)


def crop(batch):
    """The identity network, returning a view of its (device) input."""
    return batch[:, :, 2:-2, 4:-4, 4:-4]


@pytest.fixture(scope="module")
def volume():
    return np.random.default_rng(11).integers(0, 256, (23, 41, 37), dtype=np.uint8)


def _predict(model, volume, out, **settings):
    settings = dict(dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16)),
                    **settings)
    result = ef.predict(model, volume, out, **settings)
    return result, zarr.open_array(str(out).split(".zarr/")[0] + ".zarr", path="pred", mode="r")[...]


@pytest.mark.parametrize("model, tta, batch_size, blend", [(lopsided, 16, 5, "gaussian"), (crop, 0, 3, "none"),
                                                           (lopsided, 4, 1, "bump")])
def test_the_fake_device_writes_what_the_cpu_path_writes(tmp_path, volume, model, tta, batch_size, blend):
    settings = dict(tta=tta, batch_size=batch_size, blend=blend)
    _, cpu = _predict(model, volume, tmp_path / "cpu.zarr/pred", **settings)
    device = FakeDevice(seed=batch_size, max_delay=0.002)
    seen = []

    def on_device(batch):
        seen.append((threading.current_thread().name, type(batch)))
        return model(batch)

    from emfast.inference import _block, _device
    predictors, pooled_at_close = [], []
    lend, close = _block.BlockPredictor.lend_batches, _device.DeviceRunner.close

    def lending(predictor, slots):
        predictors.append(predictor)
        lend(predictor, slots)

    def closing(runner, quiet=False):  # the predictor must hold none of the page-locked slots by now: pycuda
        pooled_at_close.append(sum(len(free) for p in predictors for free in p._pool._free.values()))
        close(runner, quiet)  # frees page-locked memory dying after its context is detached never

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_block.BlockPredictor, "lend_batches", lending)
        patch.setattr(_device.DeviceRunner, "close", closing)
        result, written = _predict(on_device, volume, tmp_path / "dev.zarr/pred", device=device, **settings)
    np.testing.assert_array_equal(written, cpu)
    assert device.violations == []
    assert device.closed and device.live == 0
    assert predictors and pooled_at_close == [0]
    # every batch went over as a copy into device memory, and every prediction came back the same way
    assert device.copies == len(seen) and device.copies_back == len(seen)
    assert {name for name, _ in seen} == {"emfast-predict-device_0"}
    assert result.tiles_computed == result.tiles * max(tta, 1)


def test_on_a_device_the_model_is_called_on_the_device_thread_alone(tmp_path, volume):
    """No model thread relays the batches to the device thread (each hand-over waits for the GIL and a wake-up);
    a failing call cancels the batches queued behind it, and every thread ends."""
    from emfast.inference._block import BATCHES_AHEAD

    relays, calls = [], []

    def failing(batch):
        calls.append(1)
        relays.extend(t.name for t in threading.enumerate() if t.name.startswith("emfast-predict-model"))
        if len(calls) == 6:
            raise RuntimeError("model failed")
        return lopsided(batch)

    device = FakeDevice(seed=2)
    with pytest.raises(RuntimeError, match="model failed"):
        _predict(failing, volume, tmp_path / "dev.zarr/pred", device=device, batch_size=2)
    assert relays == []
    # the call under way when the error reached the feeding thread ran; those queued behind it were cancelled
    assert len(calls) <= 6 + BATCHES_AHEAD
    assert device.closed and device.live == 0
    assert not [t.name for t in threading.enumerate() if t.name.startswith("emfast-predict")]


def test_a_call_on_the_device_thread_before_the_device_is_opened_does_not_wait_for_itself():
    """A call submitted through ``calls()`` runs the runner on the device thread; the runner must recognise that
    thread from its start (not from the opening), or it would queue its work behind itself."""
    from emfast.inference._device import DeviceRunner

    runner = DeviceRunner(FakeDevice(), batch_elements=10)
    future = runner.calls().submit(runner, lambda batch: batch * 2, np.ones((1, 1, 1, 2, 5), np.float32))
    try:
        result = future.result(timeout=10)
    except TimeoutError:
        runner._thread.shutdown(wait=False, cancel_futures=True)  # frees the device thread waiting for itself
        pytest.fail("a call on the device thread waited for the device thread")
    finally:
        runner.close()
    np.testing.assert_array_equal(result, np.full((1, 1, 1, 2, 5), 2, np.float32))


class _Recorder:
    """A caller for DeviceCalls that records launches and waits; its first launch waits for ``go``."""

    def __init__(self):
        self.events, self.go = [], threading.Event()

    def launch(self, number):
        if not self.events:
            assert self.go.wait(10)
        self.events.append(("launch", number))

        def wait():
            self.events.append(("wait", number))
            return number * 10

        return wait


def _device_calls():
    from concurrent.futures import ThreadPoolExecutor

    from emfast.inference._device import DeviceCalls

    executor = ThreadPoolExecutor(1)
    return executor, DeviceCalls(executor)


def test_a_call_is_launched_before_the_previous_one_is_waited_for_when_its_batch_is_queued():
    """The device goes from one batch to the next without waiting for the host: with three batches queued, each
    is launched before the prediction of the one before it is waited for; a call alone is still waited for."""
    executor, calls = _device_calls()
    recorder = _Recorder()
    try:
        queued = [calls.submit(recorder, number) for number in range(3)]
        recorder.go.set()
        assert [future.result(timeout=10) for future in queued] == [0, 10, 20]
        assert recorder.events == [("launch", 0), ("launch", 1), ("wait", 0), ("launch", 2), ("wait", 1),
                                   ("wait", 2)]
        assert calls.submit(recorder, 3).result(timeout=10) == 30  # nothing queued behind it: not left waiting
    finally:
        calls.shutdown()
        executor.shutdown()


def test_shutting_the_device_calls_down_cancels_the_calls_not_launched_and_waits_for_the_others():
    executor, calls = _device_calls()
    recorder = _Recorder()
    try:
        queued = [calls.submit(recorder, number) for number in range(4)]
        threading.Timer(0.05, recorder.go.set).start()
        calls.shutdown(wait=True, cancel_futures=True)
        assert queued[0].result(timeout=0) == 0  # launched before the cancel: its prediction was waited for
        assert all(future.cancelled() for future in queued[1:])
        assert recorder.events == [("launch", 0), ("wait", 0)]
    finally:
        executor.shutdown()


def test_two_staged_calls_under_way_keep_their_own_predictions():
    """Batches not gathered into a lent slot are staged; two may be under way at once (one launched while the
    other's prediction comes back), so each has its own page-locked output: one shared would be overwritten."""
    from emfast.inference._device import DeviceRunner

    device = FakeDevice(seed=4, max_delay=0.005)
    runner = DeviceRunner(device, batch_elements=2 * int(np.prod(PATCH_IN)))
    rng = np.random.default_rng(5)
    batches = [rng.random((2, 1) + PATCH_IN, dtype=np.float32) for _ in range(3)]
    try:
        first = runner.launch(lopsided, batches[0])
        second = runner.launch(lopsided, batches[1])
        np.testing.assert_array_equal(first(), lopsided(batches[0]))
        third = runner.launch(lopsided, batches[2])
        np.testing.assert_array_equal(second(), lopsided(batches[1]))
        np.testing.assert_array_equal(third(), lopsided(batches[2]))
    finally:
        runner.close()
    assert device.violations == [] and device.live == 0


def test_cuda_graphs_need_a_cuda_device(tmp_path, volume):
    for device in (None, "cpu", FakeDevice()):
        with pytest.raises(ValueError, match="cuda_graphs=True needs device='cuda'"):
            _predict(lopsided, volume, tmp_path / "p.zarr/pred", device=device, cuda_graphs=True)


def test_the_profile_splits_the_model_calls_into_device_stages(tmp_path, volume):
    """``Prediction.profile``: the seconds of the model's calls, and within them the copies to the device, the
    network's call and the wait for the copy back; the network's share holds its own time."""
    asleep = []

    def slow(batch):
        asleep.append(0.004)
        time.sleep(0.004)
        return lopsided(batch)

    result, _ = _predict(slow, volume, tmp_path / "dev.zarr/pred", device=FakeDevice(seed=1, max_delay=0.002),
                         batch_size=4)
    profile = result.profile
    assert set(profile) == {"model", "to device", "network", "from device"}
    assert all(seconds >= 0 for seconds in profile.values())
    assert profile["network"] >= sum(asleep)
    assert profile["to device"] + profile["network"] + profile["from device"] <= profile["model"] <= result.seconds


class OneOutputBuffer:
    """``lopsided`` into the same output array every call, as a network with output bindings of its own returns
    them (a review: on the fake device, 21618 values of a prediction differed at batch_size 1)."""

    def __init__(self):
        self.out = None

    def __call__(self, batch):
        result = lopsided(batch)
        if self.out is None or self.out.shape != result.shape:
            self.out = np.empty_like(result)
        np.copyto(self.out, result)
        return self.out


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_model_returning_one_buffer_every_call_gets_each_calls_prediction_back(tmp_path, volume, batch_size):
    """The copy back of a call runs while the next call computes; a model writing every prediction into one
    buffer overwrote the one being copied."""
    _, cpu = _predict(lopsided, volume, tmp_path / "cpu.zarr/pred", batch_size=batch_size)
    _, device = _predict(OneOutputBuffer(), volume, tmp_path / "dev.zarr/pred", batch_size=batch_size,
                         device=FakeDevice(seed=batch_size, max_delay=0.002))
    assert device.tobytes() == cpu.tobytes()


def test_batches_are_gathered_into_page_locked_slots(tmp_path, volume, monkeypatch):
    """Apart from the probe, no batch is staged through an extra copy: the pool lends the device's host slots."""
    from emfast.inference import _device

    staged = []
    original = _device.DeviceRunner._slot_of

    def slot_of(self, batch):
        index = original(self, batch)
        staged.append(index is None)
        return index

    monkeypatch.setattr(_device.DeviceRunner, "_slot_of", slot_of)
    _predict(lopsided, volume, tmp_path / "dev.zarr/pred", device=FakeDevice(), tta=4, batch_size=2)
    assert staged[0] and not any(staged[1:])  # the probe (channels unknown) only


def test_a_model_keeping_a_view_of_its_device_input_is_caught(tmp_path, volume):
    kept = []

    def hoarding(batch):
        kept.append(batch)  # the next copy into the device slot would overwrite what it holds
        return lopsided(batch)

    device = FakeDevice()
    with pytest.raises(RuleBroken, match="still views"):
        _predict(hoarding, volume, tmp_path / "dev.zarr/pred", device=device, channels=2)
    kept.clear()


def test_wrong_outputs_on_the_device_are_named_and_the_device_is_closed(tmp_path, volume):
    device = FakeDevice()
    with pytest.raises(ModelOutputError, match="returned a str"):
        _predict(lambda batch: "not an array", volume, tmp_path / "a.zarr/pred", device=device)
    assert device.closed and device.live == 0 and device.violations == []
    device = FakeDevice()
    with pytest.raises(ModelOutputError, match="returned shape"):
        _predict(lambda batch: np.asarray(batch), volume, tmp_path / "b.zarr/pred", device=device)
    assert device.closed and device.live == 0


def test_a_device_object_is_refused_with_dask(tmp_path, volume):
    pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install 'emfast[dask]')")
    with pytest.raises(ValueError, match="fake:0.*client="):
        ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                   device=FakeDevice(), client=object())


def test_a_torch_module_gets_tensors_in_inference_mode_on_the_fake_device(tmp_path, volume):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from emfast.inference._device import DeviceRunner

    class Crop(torch.nn.Module):
        def forward(self, batch):
            assert isinstance(batch, torch.Tensor) and torch.is_inference_mode_enabled()
            return batch[:, :, 2:-2, 4:-4, 4:-4] * 2

    device = FakeDevice()
    runner = DeviceRunner(device, 2 * 1 * int(np.prod(PATCH_IN)), torch_device="cpu")
    try:
        batch = np.random.default_rng(0).random((2, 1) + PATCH_IN, dtype=np.float32)
        np.testing.assert_array_equal(runner(Crop(), batch), batch[:, :, 2:-2, 4:-4, 4:-4] * 2)
    finally:
        runner.close()
    assert device.violations == [] and device.live == 0


@pytest.mark.gpu
def test_cuda_with_torch_writes_what_the_cpu_writes(tmp_path, volume):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from emfast.transfer import cuda_unavailable

    reason = cuda_unavailable()
    if reason is not None or not torch.cuda.is_available():
        pytest.skip(f"no usable CUDA device: {reason or 'torch sees none'}")

    class Crop(torch.nn.Module):
        def forward(self, batch):
            assert batch.is_cuda and torch.is_inference_mode_enabled()
            return batch[:, :, 2:-2, 4:-4, 4:-4] * 2

    _, cpu = _predict(lambda b: crop(b) * 2, volume, tmp_path / "cpu.zarr/pred", tta=4, batch_size=3)
    _, gpu = _predict(Crop(), volume, tmp_path / "gpu.zarr/pred", tta=4, batch_size=3, device="cuda")
    np.testing.assert_array_equal(gpu, cpu)


def _cuda_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from emfast.transfer import cuda_unavailable

    reason = cuda_unavailable()
    if reason is not None or not torch.cuda.is_available():
        pytest.skip(f"no usable CUDA device: {reason or 'torch sees none'}")
    return torch


@pytest.mark.gpu
def test_cuda_graphs_replay_the_network_and_write_what_the_cpu_writes(tmp_path, volume):
    """With cuda_graphs=True the network's Python runs only to capture (warm-up calls, then one capture per device
    slot); every batch, partial ones too, is a replay, and the output is eager torch's."""
    torch = _cuda_torch()
    from emfast.inference._graphs import WARMUP_CALLS

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv3d(1, 2, 3)
            self.forwards = []

        def forward(self, batch):
            self.forwards.append(batch.shape[0])
            return torch.sigmoid(self.conv(batch))[:, :, 1:-1, 3:-3, 3:-3]

    net = Conv().cuda().eval()
    torch.backends.cudnn.deterministic = True
    try:
        _, eager = _predict(net, volume, tmp_path / "eager.zarr/pred", tta=4, batch_size=3, device="cuda")
        eager_forwards = list(net.forwards)
        net.forwards.clear()
        _, graphs = _predict(net, volume, tmp_path / "graphs.zarr/pred", tta=4, batch_size=3, device="cuda",
                             cuda_graphs=True)
    finally:
        torch.backends.cudnn.deterministic = False
    np.testing.assert_allclose(graphs, eager, rtol=0, atol=1e-6)
    assert any(size != 3 for size in eager_forwards)  # there were partial batches
    assert len(eager_forwards) > 4 * (1 + WARMUP_CALLS + 2)
    assert len(net.forwards) <= 1 + WARMUP_CALLS + 2  # the probe, the warm-up, a capture per device slot


@pytest.mark.gpu
def test_a_network_that_cannot_be_captured_is_called_eagerly_with_a_notice(tmp_path, volume):
    torch = _cuda_torch()

    class Syncing(torch.nn.Module):
        def forward(self, batch):
            scale = float(batch.max().item() > -1)  # a value read on the host: not capturable
            return batch[:, :, 2:-2, 4:-4, 4:-4] * 2 * scale

    _, cpu = _predict(lambda b: crop(b) * 2, volume, tmp_path / "cpu.zarr/pred", batch_size=3)
    with pytest.warns(ef.DeviceNotice, match="could not be captured"):
        _, gpu = _predict(Syncing(), volume, tmp_path / "gpu.zarr/pred", batch_size=3, device="cuda",
                          cuda_graphs=True)
    np.testing.assert_array_equal(gpu, cpu)


def test_the_device_slots_are_counted_in_the_memory_budget(tmp_path, volume):
    """The page-locked batch and result slots come out of memory=: with the same budget, the device path takes
    smaller blocks than the CPU path (here one block against several), writes the same bytes, and its pinned
    memory stays within what it counted."""
    big = np.random.default_rng(3).integers(0, 256, (16, 96, 96), dtype=np.uint8)
    settings = dict(patch_in=(8, 32, 32), chunks=(8, 16, 16), blend="none", batch_size=8, memory="12MiB")
    cpu = ef.predict(crop_to_self, big, str(tmp_path / "cpu.zarr/pred"), **settings)
    device = FakeDevice(seed=1)
    on_device = ef.predict(crop_to_self, big, str(tmp_path / "dev.zarr/pred"), device=device, **settings)
    assert on_device.blocks > cpu.blocks
    read = [zarr.open_array(str(tmp_path / f"{n}.zarr"), path="pred", mode="r")[...] for n in ("cpu", "dev")]
    np.testing.assert_array_equal(read[0], read[1])
    from emfast.inference._device import HOST_SLOTS
    pinned = sum(array.nbytes for array in device._pinned)
    batch = 8 * 8 * 32 * 32  # batch_size * prod(patch_in); the output of a tile is its input here
    assert pinned <= (HOST_SLOTS + 1) * 4 * batch + (HOST_SLOTS + 2) * 8 * batch


def crop_to_self(batch):
    return np.array(batch)


class _FakeCuda:
    """torch.cuda's graph API over CPU tensors, enough to check CapturedNetwork's bookkeeping: a network called
    while a graph is captured registers its computation there (``capturing``), and a replay runs that again into
    the captured output, as a CUDA graph's kernels do."""

    def __init__(self, torch, fail_capture=False):
        import contextlib
        import types

        self.fail_capture, self.captures, self.replays, self.capturing = fail_capture, 0, 0, None
        fake = self

        class Graph:
            def replay(self):
                fake.replays += 1
                self.output.copy_(self.call())

        @contextlib.contextmanager
        def graph(captured, capture_error_mode):
            assert capture_error_mode == "thread_local"
            fake.capturing = captured
            yield
            fake.capturing = None
            if fake.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            fake.captures += 1

        stream = types.SimpleNamespace(wait_stream=lambda other: None)
        self.cuda = types.SimpleNamespace(device=lambda device: contextlib.nullcontext(),
                                          current_stream=lambda: stream, Stream=lambda: stream,
                                          stream=lambda stream: contextlib.nullcontext(), CUDAGraph=Graph,
                                          graph=graph)
        self.Tensor = torch.Tensor


def _doubling(fake, calls):
    def network(batch):
        calls.append(batch.shape[0])
        output = batch[:, :, 1:-1] * 2
        if fake.capturing is not None:
            fake.capturing.call, fake.capturing.output = (lambda: batch[:, :, 1:-1] * 2), output
        return output

    return network


def test_captured_network_replays_a_graph_per_slot_and_cuts_partial_batches_out_of_it():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from emfast.inference._graphs import WARMUP_CALLS, CapturedNetwork

    fake, calls = _FakeCuda(torch), []
    network, captured = _doubling(fake, calls), CapturedNetwork()
    slots = [torch.zeros((4, 1, 5, 3, 3)), torch.zeros((4, 1, 5, 3, 3))]
    rng = np.random.default_rng(0)
    for number, count in enumerate([4, 4, 3, 4, 1, 2]):
        slot = slots[number % 2]
        slot.copy_(torch.from_numpy(rng.random(slot.shape, dtype=np.float32)))
        torch.testing.assert_close(captured(fake, network, slot, count), slot[:count, :, 1:-1] * 2, rtol=0,
                                   atol=0)
    assert captured.captured == 2 and fake.captures == 2 and fake.replays == 6
    assert calls == [4] * (WARMUP_CALLS + 2)  # one warm-up, a capture per slot, on whole slots; then replays


def test_a_network_that_fails_its_capture_is_called_eagerly_from_then_on():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from emfast.inference._graphs import WARMUP_CALLS, CapturedNetwork

    fake, calls = _FakeCuda(torch, fail_capture=True), []
    network, captured = _doubling(fake, calls), CapturedNetwork()
    slot = torch.ones((4, 1, 5, 2, 2))
    with pytest.warns(ef.DeviceNotice, match="could not be captured.*stream is capturing"):
        result = captured(fake, network, slot, 3)
    torch.testing.assert_close(result, slot[:3, :, 1:-1] * 2)
    assert captured.refused is not None and captured.captured == 0
    assert calls == [4] * (WARMUP_CALLS + 1) + [3]
    fake.fail_capture = False
    torch.testing.assert_close(captured(fake, network, slot, 2), slot[:2, :, 1:-1] * 2)
    assert calls[-1] == 2 and fake.captures == 0  # eager from then on, the batch alone


@pytest.mark.parametrize("error", [RuntimeError("model failed"), KeyboardInterrupt()])
def test_an_interrupted_device_run_leaves_no_thread_and_resumes_to_the_cpus_bytes(tmp_path, volume, error):
    """Ctrl-C (or an error) in the network while calls are under way on the device: raised in the caller, the
    device closed, every thread ended; the resumed run writes what the CPU path writes."""
    settings = dict(overlap=(2, 4, 4), tta=4, batch_size=2)
    _, cpu = _predict(lopsided, volume, tmp_path / "cpu.zarr/pred", **settings)
    calls = [0]

    def interrupted(batch):
        calls[0] += 1
        if calls[0] == 25:
            raise error
        return lopsided(batch)

    device = FakeDevice(seed=7, max_delay=0.003)
    with pytest.raises(type(error)):
        _predict(interrupted, volume, tmp_path / "dev.zarr/pred", device=device, **settings)
    assert device.closed and device.live == 0 and device.violations == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("emfast-predict")]
    _, resumed = _predict(lopsided, volume, tmp_path / "dev.zarr/pred", device=FakeDevice(seed=8), resume=True,
                          **settings)
    np.testing.assert_array_equal(resumed, cpu)
