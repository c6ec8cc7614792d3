"""The device path: device selection, and the copier/ring logic driven by a fake device without a GPU."""
import time
import traceback

import numpy as np
import pytest

import emfast as ef
from emfast.transfer import DeviceArray, DeviceNotice, cuda_unavailable, resolve_device
from emfast.transfer._fake import POISON, FakeDevice, RuleBroken
from threads import emfast_threads

PATCH = (4, 16, 12)


@pytest.fixture
def volumes(rng):
    return (rng.integers(0, 256, (12, 40, 36), dtype=np.uint8),
            rng.integers(0, 2**40, (12, 40, 36), dtype=np.uint64))


def stream(raw, labels, count, **kwargs):
    with ef.Loader(raw, labels, patch=PATCH, batch_size=3, seed=5, **kwargs) as loader:
        return [batch.copy() for _, batch in zip(range(count), loader)]


@pytest.mark.parametrize("threads,buffers", [(1, 2), (2, 3), (3, 6)])
def test_device_batches_equal_cpu_batches_in_order(volumes, threads, buffers):
    raw, labels = volumes
    expected = stream(raw, labels, 25)
    device = FakeDevice(seed=threads)
    got = stream(raw, labels, 25, threads=threads, buffers=buffers, device=device)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a["raw"], b["raw"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
    assert device.closed and device.violations == [] and device.live == 0
    assert device.callers == {"emfast-copier"}  # every device call, allocation and free in one thread


def test_no_slot_is_overwritten_while_leased(volumes):
    raw, labels = volumes
    expected = stream(raw, labels, 30)
    hold = np.random.default_rng(1)
    with ef.Loader(raw, labels, patch=PATCH, batch_size=3, seed=5, threads=3, buffers=3,
                   device=FakeDevice(max_delay=0.002)) as loader:
        for n, batch in zip(range(30), loader):
            checksum = {name: array.tobytes() for name, array in batch.items()}
            time.sleep(hold.uniform(0, 0.004))  # producers and copies keep running meanwhile
            assert {name: array.tobytes() for name, array in batch.items()} == checksum
            np.testing.assert_array_equal(batch["raw"], expected[n]["raw"])
            assert not (batch["labels"].view(np.uint8) == POISON).all()


def failing_plan(planner, epoch, index):
    if index == 4:
        raise ZeroDivisionError("producer failed")
    return type(planner).plan(planner, epoch, index)


def test_producer_error_travels_through_the_copier(volumes, monkeypatch):
    raw, labels = volumes
    loader = ef.Loader(raw, labels, patch=PATCH, threads=2, device=FakeDevice())
    monkeypatch.setattr(loader._planner, "plan", lambda e, i: failing_plan(loader._planner, e, i))
    seen = []
    with pytest.raises(ZeroDivisionError) as info:
        with loader:
            for batch in loader:
                seen.append(batch.index)
    assert seen == [0, 1, 2, 3]
    assert "failing_plan" in "".join(traceback.format_tb(info.value.__traceback__))


def test_copy_error_reaches_the_consumer_after_earlier_batches(volumes):
    raw, labels = volumes
    device = FakeDevice(fail_copy_at=3)
    seen = []
    with pytest.raises(RuntimeError, match="copy 3 failed"):
        with ef.Loader(raw, labels, patch=PATCH, threads=2, device=device) as loader:
            for batch in loader:
                seen.append(batch.number)
    assert seen == [0, 1, 2] and device.closed


def test_allocation_failure_fails_start_and_leaves_no_thread(volumes):
    raw, labels = volumes
    loader = ef.Loader(raw, labels, patch=PATCH, device=FakeDevice(fail_open=True))
    with pytest.raises(MemoryError, match="cannot allocate"):
        loader.start()
    assert not emfast_threads()


def test_ctrl_c_with_a_device_joins_producers_and_copier(volumes):
    raw, labels = volumes
    device = FakeDevice()
    with pytest.raises(KeyboardInterrupt):
        with ef.Loader(raw, labels, patch=PATCH, threads=2, device=device) as loader:
            for n, _ in enumerate(loader):
                if n == 3:
                    raise KeyboardInterrupt
    assert device.closed


def test_profile_counts_copies(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, epoch_size=5, device=FakeDevice()) as loader:
        for _ in loader:
            pass
    assert loader.profile.seconds["copy"] > 0 and loader.device == "fake:0"


def test_device_names():
    assert resolve_device("cpu") is None
    for bad in ["gpu", "cpu:1", "cuda:", "cuda:x", "auto:0", 0, None]:
        with pytest.raises(ValueError, match="device must be"):
            resolve_device(bad)


@pytest.mark.skipif(cuda_unavailable() is None, reason="a usable CUDA device is present")
def test_without_cuda_auto_falls_back_with_a_notice_and_cuda_fails_clearly(volumes):
    raw, _ = volumes
    reason = cuda_unavailable()
    with pytest.warns(DeviceNotice, match="uses the CPU"):
        loader = ef.Loader(raw, patch=PATCH, device="auto")
    assert loader.device == "cpu"
    for device in ("cuda", "cuda:7"):
        with pytest.raises(RuntimeError, match="cannot be used") as info:
            ef.Loader(raw, patch=PATCH, device=device)
        assert reason.split(" (")[0] in str(info.value) or "device" in str(info.value)


def test_device_array_interface():
    owner = object()
    array = DeviceArray(0x7F0000001000, (2, 1, 4, 8, 8), np.float16, "cuda:0", owner)
    interface = array.__cuda_array_interface__
    assert interface == {"shape": (2, 1, 4, 8, 8), "typestr": "<f2", "data": (0x7F0000001000, False),
                         "version": 3, "strides": None, "stream": None}
    assert array.nbytes == 2 * 4 * 8 * 8 * 2 and "cuda:0" in repr(array)


def test_cuda_ordinal_reads_cuda_names_only():
    from emfast.transfer import cuda_ordinal

    assert [cuda_ordinal(name) for name in ("cuda", "cuda:0", "cuda:3")] == [0, 0, 3]
    assert [cuda_ordinal(name) for name in ("cpu", "auto", "cuda:", "cuda:x", "fake:0", None, 1)] == [None] * 7


def test_the_fake_device_refuses_what_pycuda_would_punish_silently():
    """Two of pycuda's rules the fake did not enforce (a review of the fake against pycuda): a host slot written
    while its asynchronous copy reads it (on a GPU the device gets a mix of both), and a driver call from a
    thread that neither opened the device nor pushed its context (pycuda raises, or works on another context)."""
    import threading
    device = FakeDevice(max_delay=0.05)
    slots = device.open({"raw": ((4, 4), np.float32)}, host_slots=1)
    memory = device.allocate()
    slots[0]["raw"][...] = 1
    device.copy(slots[0], memory)
    slots[0]["raw"][...] = 2  # a producer refilling the slot before the copy is waited for
    with pytest.raises(RuleBroken, match="written while its copy to the device was under way"):
        device.wait(memory)
    device.copy(slots[0], memory)
    device.wait(memory)  # left alone while under way: no complaint
    broken = []

    def elsewhere():
        try:
            device.copy(slots[0], memory)
        except RuleBroken as error:
            broken.append(str(error))
    thread = threading.Thread(target=elsewhere, name="not-the-device")
    thread.start()
    thread.join()
    assert broken and "not-the-device, not the device's thread" in broken[0]
    with device.activate():  # a context pushed: allowed
        device.wait(memory)
    device.free(memory)
    device.close(0)
    opened_again, broken_before = [], len(device.violations)  # a device opened again, on another thread, is
    # that thread's (a review: it was refused)

    def reopen():
        device.open({"raw": ((4, 4), np.float32)}, host_slots=1)
        opened_again.append(device.allocate())
        device.free(opened_again[0])
        device.close(0)
    thread = threading.Thread(target=reopen, name="next-run")
    thread.start()
    thread.join()
    assert opened_again and len(device.violations) == broken_before
