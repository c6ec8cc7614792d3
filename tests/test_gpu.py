"""Checks on a real NVIDIA GPU with pycuda; skipped, with the reason, everywhere else."""
import time

import numpy as np
import pytest

import emfast as ef
from emfast.transfer import DeviceArray, cuda_unavailable

REASON = cuda_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA GPU: {REASON}")]
PATCH = (8, 64, 64)


@pytest.fixture
def volumes(rng):
    return (rng.integers(0, 256, (24, 160, 160), dtype=np.uint8),
            rng.integers(0, 2**40, (24, 160, 160), dtype=np.uint64))


def read_back(array: DeviceArray) -> np.ndarray:
    """Copy a device array to the host with pycuda, in the device's primary context."""
    import pycuda.driver as cuda

    context = cuda.Device(int(array.device.split(":")[1])).retain_primary_context()
    context.push()
    try:
        host = np.empty(array.shape, array.dtype)
        cuda.memcpy_dtoh(host, array.ptr)
        return host
    finally:
        cuda.Context.pop()
        context.detach()


def test_device_batches_equal_cpu_batches_bit_for_bit(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, seed=3) as cpu, \
            ef.Loader(raw, labels, patch=PATCH, seed=3, threads=2, device="cuda") as gpu:
        for _, a, b in zip(range(20), cpu, gpu):
            assert isinstance(b["raw"], DeviceArray) and b["raw"].__cuda_array_interface__["stream"] is None
            np.testing.assert_array_equal(a["raw"], read_back(b["raw"]))
            np.testing.assert_array_equal(a["labels"], read_back(b["labels"]))


def test_torch_and_cupy_hand_off_is_zero_copy(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, device="cuda") as loader:
        batch = loader.next_batch()
        torch = pytest.importorskip("torch")
        tensors = batch.torch()
        assert tensors["raw"].data_ptr() == batch["raw"].ptr and tensors["raw"].is_cuda
        np.testing.assert_array_equal(tensors["labels"].cpu().numpy(), read_back(batch["labels"]))
        cupy = pytest.importorskip("cupy")
        assert cupy.asarray(batch["raw"]).data.ptr == batch["raw"].ptr
        del tensors, torch


def test_slow_consumer_never_sees_a_half_written_buffer(volumes):
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, seed=4) as cpu, \
            ef.Loader(raw, labels, patch=PATCH, seed=4, threads=3, buffers=3, device="cuda") as gpu:
        for _, a, b in zip(range(10), cpu, gpu):
            first = read_back(b["raw"])
            time.sleep(0.05)  # producers and the copier run ahead meanwhile
            np.testing.assert_array_equal(first, read_back(b["raw"]))
            np.testing.assert_array_equal(first, a["raw"])


def test_missing_device_is_a_clear_error(volumes):
    raw, _ = volumes
    with pytest.raises(RuntimeError, match="cuda:64' cannot be used"):
        ef.Loader(raw, patch=PATCH, device="cuda:64")


def test_natural_torch_loop_keeps_device_memory_flat(volumes):
    """The loop users write: the previous batch's tensors live until reassigned. No device slot per batch, no
    memory lost, and tensors held past close stay readable, then are freed in context."""
    torch = pytest.importorskip("torch")
    raw, labels = volumes
    with ef.Loader(raw, labels, patch=PATCH, seed=6, threads=2, device="cuda") as loader, \
            ef.Loader(raw, labels, patch=PATCH, seed=6) as cpu:
        iterator, expected = iter(loader), iter(cpu)
        for _ in range(50):  # the step's kernels run here first: CUDA loads their modules into device memory
            tensors = next(iterator).torch()
            torch.testing.assert_close(tensors["raw"].cpu(), torch.from_numpy(next(expected)["raw"]))
            tensors["raw"].mul(2).sum().item()
        torch.cuda.synchronize()
        free, cached = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
        for _ in range(1000):
            tensors = next(iterator).torch()
            tensors["raw"].mul(2).sum().item()
        torch.cuda.synchronize()
        # what the device lost, less what PyTorch's caching allocator took for itself
        assert free - torch.cuda.mem_get_info()[0] - (torch.cuda.memory_reserved() - cached) <= 2**20
        assert loader.slots_allocated <= loader.buffers + 1
        kept = tensors["labels"].clone()
    torch.testing.assert_close(tensors["labels"], kept)  # still valid after close
    del tensors
    torch.cuda.synchronize()
