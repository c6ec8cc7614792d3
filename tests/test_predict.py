"""emfast.predict (emfast.inference): tiles, padding, blending and test-time augmentation against a whole-volume NumPy reference;
resumed, failed and distributed runs against uninterrupted ones, byte for byte."""
import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast.inference import BlockWriteError, ModelOutputError, OutputExistsError, TilePlan
from emfast.inference._store import OutputStore
from emfast.inference._tta import variants

zarr = pytest.importorskip("zarr", reason="prediction outputs in these tests are zarr (pip install 'emfast[zarr]')")

PATCH_IN = (10, 20, 20)
PATCH_OUT = (6, 12, 12)
CONTEXT = (2, 4, 4)


def crop(batch):
    """The identity network: the input's central patch_out."""
    return batch[:, :, 2:-2, 4:-4, 4:-4]


def lopsided(batch):
    """A network that is not mirror-symmetric (a ramp along x, a square): test-time variants differ."""
    centre = crop(batch)
    ramp = np.linspace(0.5, 1.5, centre.shape[-1], dtype=np.float32)
    return np.concatenate([centre * ramp, centre ** 2], axis=1)


def normalized(volume):
    """The network's input: uint8 scaled to [0, 1] as the kernels do it (by the float32 1/255)."""
    return volume.astype(np.float32) * np.float32(1 / 255)


@pytest.fixture(scope="module")
def volume():
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (23, 41, 37), dtype=np.uint8)  # no axis a multiple of a tile or a chunk


def _read(path):
    """The output array, read with zarr-python or h5py (float16 is not an input dtype of emfast.open)."""
    container, dataset = str(path).split(".zarr/") if ".zarr/" in str(path) else str(path).split(".h5/")
    if ".zarr/" in str(path):
        return zarr.open_array(container + ".zarr", path=dataset, mode="r")[...]
    with h5py.File(container + ".h5", "r") as f:
        return f[dataset][...]


def _tile_weights(plan, blend, tile):
    """The documented weights of ``tile``: per axis the profile rounded to multiples of 1/256 (at least 1/256),
    their product over the tile; with "none", ones over the box between the cuts the tile owns. Returns (weights,
    box low, box high)."""
    if blend == "none":
        index = [int(np.searchsorted(s, t)) for s, t in zip(plan.starts, tile)]
        low = [int(c[i]) for c, i in zip(plan.cuts, index)]
        high = [int(c[i + 1]) for c, i in zip(plan.cuts, index)]
        return np.ones([h - lo for lo, h in zip(low, high)]), low, high
    axes = []
    for size in plan.patch_out:
        t = (np.arange(size) + 0.5) / size
        shape = np.exp(-0.5 * ((t - 0.5) * 8.0) ** 2) if blend == "gaussian" else np.exp(4.0 - 1.0 / (t * (1 - t)))
        axes.append(np.maximum(1.0, np.rint(shape * 256)) / 256)
    weights = axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]
    return weights, list(tile), [t + p for t, p in zip(tile, plan.patch_out)]


def _reference(model, volume, roi, overlap, blend, tta, pad):
    """Whole-volume prediction written the plain way: np.pad, every tile and variant, one float64 accumulator."""
    plan = TilePlan(volume.shape, PATCH_IN, PATCH_OUT, overlap, (1, 1, 1), roi, crop=blend == "none")
    margin = 40
    padded = np.pad(normalized(volume), margin, mode=pad)
    sums = weights_sum = None
    for tile in np.stack(np.meshgrid(*plan.starts, indexing="ij"), -1).reshape(-1, 3):
        window = padded[tuple(slice(t - c + margin, t - c + margin + p) for t, c, p in zip(tile, CONTEXT, PATCH_IN))]
        for perm, flips in variants(tta, PATCH_IN, PATCH_OUT):
            seen = np.flip(window, [a for a in range(3) if flips[a]]) if any(flips) else window
            seen = np.transpose(seen, perm)
            prediction = model(np.ascontiguousarray(seen)[None, None])[0]
            back = np.transpose(prediction, (0,) + tuple(1 + perm.index(a) for a in range(3)))
            back = np.flip(back, [1 + a for a in range(3) if flips[a]]) if any(flips) else back
            if sums is None:
                sums = np.zeros((back.shape[0],) + volume.shape)
                weights_sum = np.zeros(volume.shape)
            w, low, high = _tile_weights(plan, blend, tuple(int(t) for t in tile))
            box = tuple(slice(lo, min(hi, s)) for lo, hi, s in zip(low, high, volume.shape))
            w = w[tuple(slice(0, b.stop - b.start) for b in box)]
            inside = tuple(slice(b.start - t, b.stop - t) for b, t in zip(box, tile))
            sums[(slice(None),) + box] += w * back[(slice(None),) + inside]
            weights_sum[box] += w
    result = np.zeros_like(sums)
    region = tuple(slice(a, b) for a, b in zip(*plan.roi))
    result[(slice(None),) + region] = sums[(slice(None),) + region] / weights_sum[region]
    return result


@pytest.mark.parametrize("blend", ["gaussian", "bump", "none"])
@pytest.mark.parametrize("tta", [0, 8, 16])
def test_identity_reproduces_the_input_exactly(tmp_path, volume, blend, tta):
    result = ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                        overlap=(2, 5, 3), blend=blend, tta=tta, chunks=(8, 16, 16), block=(8, 16, 16),
                        batch_size=3)
    assert result.blocks == 3 * 3 * 3 and result.computed == result.blocks
    np.testing.assert_array_equal(_read(tmp_path / "p.zarr/pred")[0], normalized(volume))


def length_dependent(batch):
    """The identity crop with last bits that follow the batch's length, as a framework's kernels may (torch's CPU
    convolutions give a tile other bits in a batch of one than of two)."""
    return crop(batch) * np.float32(1 + 2 ** -23 * (batch.shape[0] - 1))


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_the_bytes_do_not_depend_on_the_blocks_or_a_resume_whatever_the_model(tmp_path, volume, batch_size):
    """A review: with batch_size 2, a torch conv net on CPU gave 344 to 2608 values other last bits after a resume
    or with another memory budget, since the blocks and a resume decided which tiles shared a call, and short
    calls had other bits. Every call now holds batch_size tiles."""
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=(2, 4, 4), chunks=(8, 16, 16),
                    batch_size=batch_size)
    for n, block in enumerate([(8, 16, 16), (16, 32, 32)]):
        ef.predict(length_dependent, volume, tmp_path / f"{n}.zarr/pred", block=block, **settings)
    with pytest.raises(RuntimeError):
        ef.predict(_interrupting(length_dependent, 60 // batch_size, RuntimeError("stopped")), volume,
                   tmp_path / "2.zarr/pred", block=(8, 16, 16), **settings)
    resumed = ef.predict(length_dependent, volume, tmp_path / "2.zarr/pred", resume=True, block=(8, 16, 16),
                         **settings)
    assert 0 < resumed.computed < resumed.blocks
    outputs = [_read(tmp_path / f"{n}.zarr/pred").tobytes() for n in range(3)]
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_torch_conv_net_on_cpu_gives_the_same_bytes_for_any_blocks(tmp_path, volume):
    """The case the review found: torch's CPU convolutions, batch_size 2, two block sizes."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv3d(1, 8, 3), torch.nn.ReLU(), torch.nn.Conv3d(8, 2, 3)).eval()
    settings = dict(patch_in=(12, 24, 24), patch_out=(8, 20, 20), chunks=(8, 16, 16), blend="none", batch_size=2,
                    device="cpu")
    for n, block in enumerate([(8, 16, 16), (24, 48, 48)]):
        ef.predict(net, volume, tmp_path / f"{n}.zarr/pred", block=block, **settings)
    assert _read(tmp_path / "0.zarr/pred").tobytes() == _read(tmp_path / "1.zarr/pred").tobytes()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("scripted", [False, True])
def test_a_torch_model_left_in_training_mode_is_warned_about(tmp_path, volume, scripted):
    """predict never sets a module's mode (documented); a network fresh from training, its BatchNorm and Dropout
    in training mode, gave batch-dependent predictions and had its running statistics changed, silently (a
    review). It is warned about, naming the modules; in eval mode, or without such modules, nothing is said."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 3), torch.nn.BatchNorm3d(2), torch.nn.Dropout(0.5))
    # training mode, but nothing that depends on it (a Dropout of p=0 drops nothing: warned about, a review)
    plain = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 3), torch.nn.Dropout(0.0))
    if scripted:
        net, plain = torch.jit.script(net), torch.jit.script(plain)
    settings = dict(patch_in=(12, 24, 24), patch_out=(10, 22, 22), chunks=(8, 16, 16), blend="none", device="cpu")
    with pytest.warns(ef.TrainingModeWarning, match=r"2 module\(s\) in training mode, such as 1 \(BatchNorm3d\), "
                                                    r"2 \(Dropout\).*call model.eval\(\)"):
        ef.predict(net, volume, tmp_path / "train.zarr/pred", **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ef.TrainingModeWarning)
        ef.predict(net.eval(), volume, tmp_path / "eval.zarr/pred", **settings)
        ef.predict(plain, volume, tmp_path / "plain.zarr/pred", **settings)


@pytest.mark.parametrize("blend", ["gaussian", "none"])
def test_identity_reproduces_a_float_input_bit_for_bit_negative_zeros_too(tmp_path, blend):
    """The kernels' x * 1.0 + 0.0 turned every -0.0 of a float input into +0.0 (a helper's check, bit for bit,
    of "floats unchanged"); the Loader's batches too."""
    rng = np.random.default_rng(3)
    floats = rng.standard_normal((23, 41, 37)).astype(np.float32)
    floats[rng.random(floats.shape) < 0.2] = -0.0
    ef.predict(crop, floats, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, blend=blend, tta=8,
               chunks=(8, 16, 16), block=(8, 16, 16))
    assert _read(tmp_path / "p.zarr/pred")[0].tobytes() == floats.tobytes()
    with ef.Loader(floats, patch=floats.shape, batch_size=1, augment=()) as loader:
        assert loader.next_batch()["raw"][0, 0].tobytes() == floats.tobytes()


@pytest.mark.parametrize("pad", ["reflect", "edge", "constant"])
def test_identity_over_a_roi_at_the_border_with_every_pad(tmp_path, volume, pad):
    roi = ((0, 30, 5), (9, 41, 37))  # touches the border on five sides, smaller than a tile in y
    ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, roi=roi, pad=pad,
               chunks=(4, 8, 8))
    expected = np.zeros((1,) + volume.shape, np.float32)
    box = (slice(None),) + tuple(slice(a, b) for a, b in zip(*roi))
    expected[box] = normalized(volume[box[1:]])
    np.testing.assert_array_equal(_read(tmp_path / "p.zarr/pred"), expected)


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_identity_in_every_output_dtype(tmp_path, volume, dtype):
    ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, dtype=dtype,
               tta=4)
    output = _read(tmp_path / "p.zarr/pred")[0]
    assert output.dtype == np.dtype(dtype)
    expected = volume if dtype == "uint8" else (normalized(volume)).astype(np.float16)
    np.testing.assert_array_equal(output, expected)


@pytest.mark.parametrize("blend, tta, pad", [("gaussian", 16, "reflect"), ("bump", 8, "edge"),
                                             ("none", 4, "constant"), ("gaussian", 0, "reflect")])
def test_blending_and_tta_match_a_whole_volume_reference(tmp_path, volume, blend, tta, pad):
    roi = ((3, 0, 2), (23, 35, 37))
    ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
               overlap=(3, 4, 5), roi=roi, blend=blend, tta=tta, pad=pad, chunks=(8, 8, 16), block=(8, 16, 16),
               batch_size=5)
    expected = _reference(lopsided, volume, roi, (3, 4, 5), blend, tta, pad)
    np.testing.assert_allclose(_read(tmp_path / "p.zarr/pred"), expected, rtol=2e-6, atol=1e-7)


def test_no_blend_gives_each_voxel_its_nearest_tile(tmp_path):
    tiles = []

    def which_tile(batch):
        tiles.append(len(tiles))
        return np.full((len(batch), 1) + PATCH_OUT, float(len(tiles)), np.float32)

    flat = np.zeros((6, 40, 12), np.uint8)
    ef.predict(which_tile, flat, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
               overlap=(0, 4, 0), blend="none", channels=1)
    # Along y the tiles start at 0, 8, 16, 24 and 28 (moved back to end at 40); each overlap is cut in its middle.
    owners = _read(tmp_path / "p.zarr/pred")[0, 0, :, 0]
    assert [int(np.argmax(owners == v)) for v in np.unique(owners)] == [0, 10, 18, 26, 32]


@pytest.mark.parametrize("size, patch_out, overlap, ties", [(40, 8, 4, False), (41, 9, 3, True), (37, 10, 5, True),
                                                             (23, 7, 2, False)])
def test_cropped_tiles_own_the_voxels_nearest_their_middle_and_ties_go_to_the_later_tile(size, patch_out, overlap,
                                                                                         ties):
    plan = TilePlan((size, 8, 8), (patch_out, 8, 8), (patch_out, 8, 8), (overlap, 0, 0), (1, 1, 1), crop=True)
    starts = plan.starts[0]
    voxels = np.arange(size) + 0.5
    distance = np.abs(voxels[:, None] - (starts[None, :] + patch_out / 2))  # to each tile's middle
    inside = (voxels[:, None] >= starts[None, :]) & (voxels[:, None] < starts[None, :] + patch_out)
    distance[~inside] = np.inf
    # The last of the nearest tiles: argmin over the tiles in reverse order.
    expected = len(starts) - 1 - np.argmin(distance[:, ::-1], axis=1)
    owner = np.searchsorted(plan.cuts[0], np.arange(size), side="right") - 1
    assert np.array_equal(owner, expected)
    assert any(np.count_nonzero(row == row.min()) > 1 for row in distance) == ties


def test_tile_plan_covers_the_roi_and_blocks_own_whole_chunks():
    plan = TilePlan((50, 60, 70), (12, 20, 20), (8, 16, 16), (2, 4, 4), (8, 16, 16), ((3, 5, 0), (50, 60, 33)),
                    block=(16, 32, 32))
    for axis in range(3):
        starts = plan.starts[axis]
        assert starts[0] == plan.roi[0][axis] and starts[-1] + plan.patch_out[axis] == plan.roi[1][axis]
        assert np.all(np.diff(starts) <= plan.stride[axis])
    covered = np.zeros((50, 60, 70), int)
    for block in plan.blocks():
        assert all(a % b == 0 or a == r for a, b, r in zip(block.start, plan.block, plan.roi[0]))
        covered[tuple(slice(a, b) for a, b in zip(block.start, block.stop))] += 1
    roi = tuple(slice(a, b) for a, b in zip(*plan.roi))
    assert covered[roi].min() == 1 and covered.sum() == covered[roi].size


def test_a_small_roi_of_a_huge_volume_is_planned_and_resumed_by_its_own_blocks(tmp_path, monkeypatch):
    """A 490k-voxel roi far out in a (7000, 250000, 250000) volume: planning walked every block of the volume
    (4.2e8, about 21 minutes) and a resume of the finished output listed them all; both now go by the roi's.
    The volume is a zarr array with only the roi's chunks written."""
    shape, roi = (7000, 250000, 250000), ((5989, 199879, 239939), (6034, 199972, 240056))
    plan = TilePlan(shape, (16, 40, 40), (8, 24, 24), (2, 6, 6), (64, 128, 128), roi)
    visited = []
    monkeypatch.setattr(np, "ndindex", lambda *grid: visited.append(grid) or iter(()))  # the whole grid's walk
    blocks = plan.blocks()
    monkeypatch.undo()
    assert not visited and len(blocks) == 2 * 2 * 2 and np.prod(plan.grid) > 4e8
    covered = sum(int(np.prod(np.subtract(b.stop, b.start))) for b in blocks)
    assert covered == int(np.prod(np.subtract(roi[1], roi[0])))
    volume = zarr.create_array(str(tmp_path / "in.zarr"), shape=shape, chunks=(64, 128, 128), dtype=np.uint8,
                               fill_value=0)
    data = np.random.default_rng(1).integers(0, 256, (64, 256, 256), dtype=np.uint8)
    volume[5952:6016 + 64, 199808:199808 + 256, 239872:239872 + 256] = np.concatenate([data, data])
    settings = dict(patch_in=(16, 40, 40), patch_out=(8, 24, 24), roi=roi, chunks=(64, 128, 128), blend="none")
    first = ef.predict(crop_model(16, 40, 40, 8, 24, 24), str(tmp_path / "in.zarr"), tmp_path / "out.zarr/p",
                       **settings)
    again = ef.predict(crop_model(16, 40, 40, 8, 24, 24), str(tmp_path / "in.zarr"), tmp_path / "out.zarr/p",
                       resume=True, **settings)
    assert (first.blocks, first.computed, again.computed) == (8, 8, 0)
    written = zarr.open_array(str(tmp_path / "out.zarr/p"))[(0,) + tuple(slice(a, b) for a, b in zip(*roi))]
    expected = volume[tuple(slice(a, b) for a, b in zip(*roi))].astype(np.float32) * np.float32(1 / 255)
    np.testing.assert_array_equal(written, expected)


def crop_model(*shapes):
    """The centre patch_out of each patch_in tile: a network of valid convolutions' shapes."""
    pin, pout = shapes[:3], shapes[3:]
    cut = tuple(slice((i - o) // 2, (i - o) // 2 + o) for i, o in zip(pin, pout))
    return lambda batch: batch[(slice(None), slice(None)) + cut]


def test_no_dask_task_writes_after_predict_has_raised(tmp_path, volume):
    """A task failing while another computes its block: predict raised and let go of the output's lock while the
    other task went on to write and flag its block (a helper's rerun with overwrite=True then ended 'complete'
    with 11232 stale voxels). Running tasks are now waited for, and write nothing once the run has ended."""
    import threading as threads
    distributed = pytest.importorskip("distributed")
    slow = []  # the thread of the first task: its first call takes long, and its block completes

    def model(batch):
        if not slow:
            slow.append(threads.get_ident())
            time.sleep(1.5)  # this block is still computing when the other task fails
        if threads.get_ident() != slow[0]:
            raise RuntimeError("model failed")
        return crop(batch)

    path = tmp_path / "p.zarr/pred"
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16), channels=1,
                    batch_size=64)  # a block in one call: the slow task calls the model no more after the failure
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(RuntimeError, match="model failed"):
            ef.predict(model, volume, path, client=client, **settings)
        written = sorted(str(p) for p in path.rglob("*") if p.is_file())
        time.sleep(2.5)  # the slow task has long finished its block
        assert sorted(str(p) for p in path.rglob("*") if p.is_file()) == written
        flags = path.parent / "pred.blocks"
        assert not [p for p in flags.rglob("*") if p.is_file() and p.name != "zarr.json"]


def test_a_running_dask_task_stops_at_its_next_model_call_once_the_run_ended(tmp_path, volume, monkeypatch):
    """An error (or Ctrl-C) on Dask waited for every running task to compute its whole block, to throw it away:
    12 s against 0.5 s locally in a review's run. A task now asks, before each model call, whether the run has
    ended (here at every call)."""
    import threading as threads
    distributed = pytest.importorskip("distributed")
    from emfast.inference import _dask
    monkeypatch.setattr(_dask, "ENDED_POLL_S", 0.0)
    slow, failed, calls_after = [], [], []

    def model(batch):
        if not slow:
            slow.append(threads.get_ident())
        if threads.get_ident() != slow[0]:
            failed.append(True)
            raise RuntimeError("model failed")
        calls_after.append(bool(failed))
        time.sleep(0.05)  # this task's block takes many calls: most come after the other task failed
        return crop(batch)

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16), channels=1,
                    tta=4)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(RuntimeError, match="model failed"):
            ef.predict(model, volume, tmp_path / "p.zarr/pred", client=client, **settings)
    assert failed and calls_after.count(True) <= 1, calls_after  # at most the call under way


def test_no_dask_task_writes_its_block_after_the_user_closed_the_client(tmp_path, volume):
    """The user's client closed mid-run: the run could no longer reach its tasks, and those computing went on
    to write and flag their blocks after predict had raised. The run's event is set through its own client."""
    import threading as threads
    distributed = pytest.importorskip("distributed")

    def model(batch):
        time.sleep(1.0)  # every block is still computing when the client closes
        return crop(batch)

    path = tmp_path / "p.zarr/pred"
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16), channels=1,
                    batch_size=64)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster:
        client = distributed.Client(cluster)
        client.wait_for_workers(2)
        threads.Timer(1.0, client.close).start()
        with pytest.raises(Exception):
            ef.predict(model, volume, path, client=client, **settings)
        time.sleep(2.0)  # the tasks computing have long finished
        assert not [p for p in path.rglob("*") if p.is_file() and p.name != "zarr.json"]
        assert not [p for p in (path.parent / "pred.blocks").rglob("*") if p.is_file() and p.name != "zarr.json"]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_model_returning_the_same_buffer_every_call_predicts_right(tmp_path, volume, kind):
    """A model writing into one output array it returns every call (an out= buffer; a compiled graph's static
    output): emfast blends a prediction after the model's next calls, and 77380 of 98304 voxels of a helper's
    identity network came out wrong, silently. Predictions the model owns are copied before the next call."""
    if kind == "torch":
        torch = pytest.importorskip("torch")

    class Reusing:
        def __init__(self):
            self.out = None

        def __call__(self, batch):
            centre = crop(batch)
            if kind == "torch":
                centre = centre.numpy()
            if self.out is None or self.out.shape != centre.shape:
                self.out = np.empty(centre.shape, np.float32)
            self.out[...] = centre
            return torch.from_numpy(self.out) if kind == "torch" else self.out

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16), batch_size=2,
                    blend="none", device="cpu" if kind == "torch" else None)
    written = _read(ef.predict(Reusing(), volume, tmp_path / "p.zarr/reused", **settings).path)
    np.testing.assert_array_equal(written[0], volume.astype(np.float32) * np.float32(1 / 255))


def test_a_torch_output_numpy_has_no_dtype_for_is_a_model_output_error(tmp_path, volume):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    from emfast.inference import ModelOutputError
    with pytest.raises(ModelOutputError, match=r"returned a torch.float8_e4m3fn tensor NumPy cannot take \(.*"
                                               r"Float8_e4m3fn\); expected a dense tensor of one of float16, "
                                               r"float32, float64"):
        ef.predict(lambda batch: crop(batch).to(torch.float8_e4m3fn), volume, tmp_path / "p.zarr/f8",
                   patch_in=PATCH_IN, patch_out=PATCH_OUT, device="cpu")


def test_a_model_dask_cannot_pickle_is_named_before_anything_is_written(tmp_path, volume):
    """It failed at the first task naming emfast's BlockPredictor, after the output and its kept-tile folder
    were made (a rerun was then refused as "exists")."""
    import threading as threads
    distributed = pytest.importorskip("distributed")

    class Locked:
        def __init__(self):
            self.lock = threads.Lock()

        def __call__(self, batch):
            return crop(batch)

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster) as client:  # tcp: what goes to a worker is pickled, as to processes
        with pytest.raises(TypeError, match=r"client=: the model .*Locked cannot be sent to the Dask workers, "
                                            r"which need it pickled \(TypeError: cannot pickle '_thread.lock'"):
            ef.predict(Locked(), volume, tmp_path / "p.zarr/pred", client=client, patch_in=PATCH_IN,
                       patch_out=PATCH_OUT)
        from emfast.cli import user_error
        with pytest.raises(TypeError) as refused:
            ef.predict(Locked(), volume, tmp_path / "p.zarr/pred", client=client, patch_in=PATCH_IN,
                       patch_out=PATCH_OUT)
        assert user_error(refused.value)  # the command: one line, exit 2 (it was "a bug in emfast", exit 1)
    assert not [p for p in tmp_path.iterdir() if "lock" not in p.name]


def test_a_level_is_chosen_for_a_path_only(tmp_path, volume):
    """level and resolution choose a level of an image given as a path; an array or a Volume is read as it is, and
    saying otherwise is refused before anything is written."""
    for given in (volume, ef.Volume.from_array(volume)):
        with pytest.raises(TypeError, match=r"level and resolution choose the level of an input given as a path, "
                                            rf"not of a {type(given).__name__}"):
            ef.predict(crop, given, tmp_path / "p.zarr/pred", level=1, patch_in=PATCH_IN, patch_out=PATCH_OUT)
    assert not (tmp_path / "p.zarr").exists()


FAILING_MODELS = '''\
import threading


class HoldingALock(RuntimeError):
    """An exception that cannot be pickled, as some libraries' are (a lock, a handle, a device context)."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class Plain(ValueError):
    """An exception that pickles, unlike what it may be raised from."""


class TwoArguments(RuntimeError):
    """An exception built from several arguments (plain pickling calls it with one): tblib rebuilds it."""

    def __init__(self, layer, what):
        super().__init__(f"layer {layer}: {what}")


def with_a_lock(batch):
    raise HoldingALock("out of memory in layer 3")


def while_handling_a_lock(batch):
    try:
        raise HoldingALock("out of memory in layer 3")
    except HoldingALock:
        raise Plain("could not recover")


def with_two_arguments(batch):
    raise TwoArguments(3, "bad shape")
'''


@pytest.mark.parametrize("model, expected, words", [
    ("with_a_lock", "ModelError", r"^HoldingALock: out of memory in layer 3 \(sent from the Dask worker in words: "
                                  r"TypeError: cannot pickle '_thread.lock' object\)"),
    ("while_handling_a_lock", "ModelError", r"^Plain: could not recover \(sent from the Dask worker in words: "
                                            r"TypeError: cannot pickle '_thread.lock' object\)"),
    ("with_two_arguments", "TwoArguments", r"^layer 3: bad shape")])
def test_a_model_error_that_cannot_be_pickled_reaches_the_client_as_the_models(tmp_path, volume, monkeypatch, model,
                                                                             expected, words):
    """Dask sent it back as a bare Exception of its repr, without the mark that says it is the model's, and the
    command called it a bug in emfast (exit 1); so it did where the exception pickles but what it was raised from
    does not (Dask sends the chain). Now it comes as a ModelError naming its type and message, marked as the
    model's; an exception that Dask does send (through tblib, which rebuilds one of several arguments) comes as
    itself (found by a helper reviewing the first fix). The models' module is imported after Dask, as a user's
    is: Dask registers the exception classes that exist when it is imported with tblib, not those made later."""
    import importlib
    distributed = pytest.importorskip("distributed")
    from emfast.inference._model import model_blamed

    folder = tmp_path / f"models_{model}"
    folder.mkdir()
    (folder / f"failing_{model}.py").write_text(FAILING_MODELS)
    monkeypatch.syspath_prepend(str(folder))
    network = getattr(importlib.import_module(f"failing_{model}"), model)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=None, silence_logs=50) as cluster, \
            distributed.Client(cluster) as client:  # tcp: what comes back from a worker is pickled
        with pytest.raises(Exception, match=words) as raised:
            ef.predict(network, volume, tmp_path / "p.zarr/pred", client=client, channels=1, patch_in=PATCH_IN,
                       patch_out=PATCH_OUT)
    assert type(raised.value).__name__ == expected
    assert model_blamed(raised.value) == f"failing_{model}:{model}"


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), StopIteration()])
def test_a_models_keyboard_interrupt_on_a_dask_worker_ends_the_run_with_its_name(tmp_path, volume, error):
    """Raised by the model's own code on a task's thread (a worker's signals reach its main thread), it is no
    Exception, which a Dask task ends with: an in-process worker waited for the task forever, a worker process
    died and the client's error, "FutureCancelledError", named nothing (a helper's). A StopIteration ends no task
    either: the client got "RuntimeError: coroutine raised StopIteration", unmarked. Each comes as a ModelError
    marked as the model's."""
    distributed = pytest.importorskip("distributed")
    from emfast.inference._model import ModelError, model_blamed

    def stopping(batch):
        raise error

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(ModelError, match=rf"^{type(error).__name__}\b.* \(sent from the Dask worker in words: "
                                             r"a Dask task cannot end with it\)") as raised:
            ef.predict(stopping, volume, tmp_path / "p.zarr/pred", client=client, channels=1, patch_in=PATCH_IN,
                       patch_out=PATCH_OUT)
    assert model_blamed(raised.value).endswith("stopping")
    # the note a user sees, as every other error of the model's has (a review: no name in sight)
    assert any("stopping, called by emfast.predict)" in note for note in raised.value.__notes__)


def test_a_model_ending_its_dask_workers_process_is_named_among_the_causes(tmp_path, volume):
    """Every worker that ran the block died, losing the run's data sent to it once: the error blamed lost workers
    or scheduler only, though the model had ended them (a review)."""
    distributed = pytest.importorskip("distributed")

    def crashing(batch):
        os._exit(3)

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as client:
        # Dask's KilledWorker (the other branch) needs more retries than the two workers' data outlives
        with pytest.raises(ef.DaskRunLostError, match="a model that ends its worker's process .* loses them too|"
                                                      "ended the process of every worker that ran it"):
            ef.predict(crashing, volume, tmp_path / "p.zarr/pred", client=client, channels=1, patch_in=PATCH_IN,
                       patch_out=PATCH_OUT)


CTRL_C_TO_THE_GROUP = """
import os, signal, sys, threading, time
import numpy as np, distributed
import emfast as ef

def slow(batch):
    time.sleep(0.2)
    return batch[:, :, 2:-2, 4:-4, 4:-4]

if __name__ == "__main__":
    volume = np.random.default_rng(0).integers(0, 256, (48, 80, 80), np.uint8)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(2)
        threading.Timer(2.0, os.killpg, (os.getpgrp(), signal.SIGINT)).start()  # as a terminal's Ctrl-C
        try:
            ef.predict(slow, volume, sys.argv[1], client=client, patch_in=(10, 20, 20), patch_out=(6, 12, 12),
                       chunks=(8, 16, 16), block=(8, 16, 16), channels=1)
        except BaseException as error:
            print("raised", type(error).__name__)
"""


def test_ctrl_c_in_a_terminal_during_a_dask_prediction_is_an_interruption(tmp_path):
    """A terminal's Ctrl-C reaches its whole process group, the Dask worker processes too: their running tasks'
    futures were cancelled, and waiting for them after the interruption raised FuturesCancelledError in its place
    (4 runs in 5 of a helper's)."""
    pytest.importorskip("distributed")
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_TO_THE_GROUP)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "p.zarr/pred")], capture_output=True,
                         text=True, timeout=120, start_new_session=True)  # a group of its own, as a terminal's
    assert "raised KeyboardInterrupt" in run.stdout, run.stdout + run.stderr[-3000:]


def test_a_model_whose_module_the_dask_workers_cannot_import_is_named_before_anything_is_written(tmp_path, volume,
                                                                                                   monkeypatch):
    """Pickled by reference, a model of a module only the client can import failed at the first task with a bare
    Exception ("No module named 'mynets'"), naming no model, the output and its kept tiles begun (a helper's)."""
    import importlib
    distributed = pytest.importorskip("distributed")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mynets.py").write_text("def crop(batch):\n    return batch[:, :, 2:-2, 4:-4, 4:-4]\n")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        monkeypatch.syspath_prepend(str(tmp_path / "mine"))  # the client's path only, once the workers run
        mynets = importlib.import_module("mynets")
        with pytest.raises(TypeError, match=r"the model mynets:crop cannot be loaded by 1 of the Dask workers: they "
                                            r"cannot import its module 'mynets'"):
            ef.predict(mynets.crop, volume, tmp_path / "p.zarr/pred", client=client, patch_in=PATCH_IN,
                       patch_out=PATCH_OUT)
    assert not [p for p in tmp_path.iterdir() if p.name != "mine" and "lock" not in p.name]


def _interrupting(model, calls, error):
    count = [0]

    def wrapped(batch):
        count[0] += 1
        if count[0] == calls:
            raise error
        return model(batch)

    return wrapped


SETTINGS = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=(2, 4, 4), tta=4, chunks=(8, 16, 16),
                block=(8, 16, 16), batch_size=2)


@pytest.mark.parametrize("error", [RuntimeError("model failed"), KeyboardInterrupt()])
@pytest.mark.parametrize("container", ["p.zarr", "p.h5"])
def test_a_resumed_run_equals_an_uninterrupted_one_byte_for_byte(tmp_path, volume, error, container):
    whole = ef.predict(lopsided, volume, tmp_path / f"whole_{container}/pred", **SETTINGS)
    path = tmp_path / container / "pred"
    with pytest.raises(type(error)):
        ef.predict(_interrupting(lopsided, 40, error), volume, path, **SETTINGS)
    assert not [t for t in threading.enumerate() if t.name.startswith("emfast-predict")]
    with pytest.raises(OutputExistsError, match="resume=True"):
        ef.predict(lopsided, volume, path, **SETTINGS)
    resumed = ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    assert 0 < resumed.computed < whole.computed
    np.testing.assert_array_equal(_read(path), _read(tmp_path / f"whole_{container}/pred"))
    again = ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    assert again.computed == 0


@pytest.mark.parametrize("error", [RuntimeError("model failed"), KeyboardInterrupt()])
@pytest.mark.parametrize("device", [None, "cpu"])
def test_no_batch_is_run_after_the_model_raised(tmp_path, volume, error, device):
    """The batches queued behind a failed call are not run: but a KeyboardInterrupt a torch module raised itself
    (not an Exception) left them queued, and the module was called twice or three times more (a review)."""
    calls = [0]

    def failing_at_40(batch):
        calls[0] += 1
        if calls[0] >= 40:
            raise error
        return crop(batch)

    model = failing_at_40
    if device is not None:
        torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
        model = type("Failing", (torch.nn.Module,), {"forward": lambda self, batch: failing_at_40(batch)})()
    with pytest.raises(type(error)):
        ef.predict(model, volume, tmp_path / "p.zarr/pred", device=device, **SETTINGS)
    assert calls[0] == 40


def test_a_resume_keeps_the_blocks_its_output_was_begun_in_whatever_the_memory(tmp_path):
    """The default block follows memory=: resumed with more memory (after running out, say), a run was refused as
    one with "other settings" (its block), and overwrite=True, the only advice, threw the finished blocks away."""
    volume = np.random.default_rng(3).integers(0, 256, (16, 140, 140), dtype=np.uint8)
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT)
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", memory="64MiB", **settings)
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(_interrupting(lopsided, 600, RuntimeError("model failed")), volume, path, memory="6MiB",
                   **settings)
    resumed = ef.predict(lopsided, volume, path, memory="64MiB", resume=True, **settings)
    assert 0 < resumed.computed < resumed.blocks == 9  # the (16, 64, 64) blocks of 6 MiB, not 4 of (16, 128, 128)
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "whole.zarr/pred"))
    begun = tmp_path / "q.zarr/pred"
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(_interrupting(lopsided, 600, RuntimeError("model failed")), volume, begun, memory="64MiB",
                   **settings)
    with pytest.raises(ValueError, match=r"q.zarr/pred was begun in blocks of \(16, 128, 128\) \(the default block of "
                                         r"that run's memory and settings\), which a resume keeps; such a block needs "
                                         r"about \d+ bytes .* resume with more memory, or pass overwrite=True") as error:
        ef.predict(lopsided, volume, begun, memory="6MiB", resume=True, **settings)
    assert error.value.emfast_setting == "memory"


def test_a_resume_with_other_weights_of_a_torch_network_is_refused(tmp_path, volume):
    """A retrained checkpoint keeps the class's name, which a resume did not compare either: an output begun with
    one network was finished by another and recorded complete, a mix of both. A torch module's state is recorded
    as a digest; the same weights in another instance, or the module wrapped in a function, resume."""
    torch = pytest.importorskip("torch")

    def network(gain):
        net = torch.nn.Conv3d(1, 2, kernel_size=(5, 9, 9), bias=False)  # (10, 20, 20) -> (6, 12, 12)
        with torch.no_grad():
            net.weight.copy_(torch.from_numpy(np.random.default_rng(0).random(net.weight.shape, np.float32)) * gain)
        return net

    def failing(net, calls):  # the module itself fails (a hook is no part of its state)
        count = [0]

        def hook(module, inputs):
            count[0] += 1
            if count[0] == calls:
                raise RuntimeError("model failed")

        net.register_forward_pre_hook(hook)
        return net

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16), device="cpu")
    whole = ef.predict(network(1.0), volume, tmp_path / "whole.zarr/pred", **settings)
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(failing(network(1.0), 20), volume, path, **settings)
    with pytest.raises(OutputExistsError, match=r"another input or other settings \(network: '[0-9a-f]{64}' there, "
                                                r"'[0-9a-f]{64}' now\)"):
        ef.predict(network(2.0), volume, path, resume=True, **settings)
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(failing(network(1.0), 10), volume, path, resume=True, **settings)
    with pytest.raises(RuntimeError, match="model failed"):  # torch's wrappers hold the same network
        ef.predict(torch.nn.DataParallel(failing(network(1.0), 10)), volume, path, resume=True, **settings)
    same = network(1.0)
    resumed = ef.predict(lambda batch: same(batch), volume, path, resume=True, **settings)
    assert 0 < resumed.computed < whole.blocks
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "whole.zarr/pred"))


def test_a_run_over_another_roi_is_told_how_to_split_a_prediction_and_what_overwrite_deletes(tmp_path, volume):
    """Jobs splitting one prediction by roi into one output were told to pass overwrite, which deleted each
    earlier job's part: the refusal says where the parts go instead (a review)."""
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT)
    path = tmp_path / "p.zarr/pred"
    ef.predict(crop, volume, path, roi=((0, 0, 0), (12, 41, 37)), **settings)
    with pytest.raises(OutputExistsError, match=r"other settings \(roi: \[\[0, 0, 0\], \[12, 41, 37\]\] there, "
                                                r"\[\[12, 0, 0\], \[23, 41, 37\]\] now\); pass overwrite=True to "
                                                r"replace it \(which deletes that run's roi\). An output holds one "
                                                r"run's roi: .* give each roi an output of its own"):
        ef.predict(crop, volume, path, roi=((12, 0, 0), (23, 41, 37)), resume=True, **settings)
    with pytest.raises(OutputExistsError, match=r"p.zarr/pred exists and holds a prediction over another roi "
                                                r"\(\[\[0, 0, 0\], \[12, 41, 37\]\] there, \[\[12, 0, 0\], "
                                                r"\[23, 41, 37\]\] now\); pass overwrite=True to replace it \(which "
                                                r"deletes that run's roi\)"):  # a job's plain call, before the model
        ef.predict(crop, volume, path, roi=((12, 0, 0), (23, 41, 37)), **settings)
    with pytest.raises(OutputExistsError, match=r"p.zarr/pred exists; pass resume=True"):  # the same roi
        ef.predict(crop, volume, path, roi=((0, 0, 0), (12, 41, 37)), **settings)
    with pytest.raises(OutputExistsError) as other:  # another setting alone: no word of rois
        ef.predict(crop, volume, path, roi=((0, 0, 0), (12, 41, 37)), resume=True, dtype="float16", **settings)
    assert str(other.value).endswith("(dtype: 'float32' there, 'float16' now); pass overwrite=True to replace it")


def test_the_weights_digest_sees_through_torchs_wrappers_only(tmp_path):
    """DataParallel and torch.compile hold the same network; a module of the user's with a child named _orig_mod is
    no wrapper (a second review: its other weights were left out of the digest)."""
    torch = pytest.importorskip("torch")
    from emfast.inference._model import weights_digest
    net = torch.nn.Conv3d(1, 2, 3)
    assert weights_digest(torch.nn.DataParallel(net)) == weights_digest(torch.compile(net)) == weights_digest(net)

    class Holder(torch.nn.Module):
        def __init__(self, gain):
            super().__init__()
            self._orig_mod = torch.nn.Conv3d(1, 2, 3)
            self.head = torch.nn.Conv3d(2, 2, 1)
            torch.nn.init.constant_(self.head.weight, gain)

    torch.manual_seed(0)
    first = Holder(1.0)
    torch.manual_seed(0)
    assert weights_digest(first) != weights_digest(Holder(2.0))


def _wait_for_a_finished_block(container, seconds=30.0):
    """The block flags once at least one block is recorded (the writer thread trails the model)."""
    deadline = time.monotonic() + seconds
    while True:
        flags = zarr.open_array(str(container), path="pred.blocks", mode="r")[...]
        if flags.sum() or time.monotonic() > deadline:
            return flags
        time.sleep(0.05)


def test_a_killed_process_resumes_to_the_same_bytes(tmp_path, volume):
    np.save(tmp_path / "volume.npy", volume)
    script = textwrap.dedent(f"""
        import sys, time
        import numpy as np
        import emfast as ef
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_predict import lopsided, SETTINGS
        calls = [0]
        def slow(batch):
            calls[0] += 1
            if calls[0] == 30:
                print("half way", flush=True)
                time.sleep(60)
            return lopsided(batch)
        ef.predict(slow, np.load(sys.argv[1]), sys.argv[2], **SETTINGS)
        """)
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "volume.npy"),
                                str(tmp_path / "p.zarr/pred")], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "half way"
        flags = _wait_for_a_finished_block(tmp_path / "p.zarr")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert 0 < flags.sum() < flags.size
    ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", resume=True, **SETTINGS)
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **SETTINGS)
    np.testing.assert_array_equal(_read(tmp_path / "p.zarr/pred"), _read(tmp_path / "whole.zarr/pred"))


def _slow_writes(monkeypatch) -> list:
    """Blocks written half a second late (a slow disk); returns the list of the times their writes ended."""
    from emfast.io import _chunkfiles

    written, write = [], _chunkfiles.ChunkFiles.write

    def slow_write(self, corner, data, *encoding):
        time.sleep(0.5)
        write(self, corner, data, *encoding)
        written.append(time.monotonic())

    monkeypatch.setattr(_chunkfiles.ChunkFiles, "write", slow_write)
    return written


def test_ctrl_c_twice_writes_nothing_after_predict_has_raised(tmp_path, volume, monkeypatch):
    """One Ctrl-C stops the run; a second, while predict waits for the blocks being written (a slow disk), must
    not leave writer threads behind that write after predict raised (and released the output's lock): Python
    3.11 reports a thread whose join was interrupted as ended."""
    written = _slow_writes(monkeypatch)
    calls = [0]

    def model(batch):
        calls[0] += 1
        if calls[0] == 6:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # the second, during the clean-up
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return lopsided(batch)

    with pytest.raises(KeyboardInterrupt):
        ef.predict(model, volume, tmp_path / "p.zarr/pred", **dict(SETTINGS, tta=0))
    raised = time.monotonic()
    assert not [t for t in threading.enumerate() if t.name.startswith("emfast-")]
    time.sleep(0.6)
    assert written and max(written) < raised


def test_sigterm_twice_stops_predict_as_ctrl_c_does(tmp_path, volume, monkeypatch):
    """SIGTERM (Slurm, timeout, docker stop), taken as the CLI takes it: the run stops as on Ctrl-C, and a second
    during the clean-up is held back as Ctrl-C is, so no writer writes after predict has raised. Before, SIGTERM
    ended the process at once: no message, the kept tiles held in memory lost (a helper's resume computed 152
    tiles where Ctrl-C's computed 130)."""
    from emfast._threads import Terminated, sigterm_interrupts
    written = _slow_writes(monkeypatch)
    calls, timers, late = [0], [], []

    def model(batch):
        calls[0] += 1
        if calls[0] == 6:
            timers.append(threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)))  # during the clean-up
            timers[0].start()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return lopsided(batch)

    def too_late(signum, frame):  # a loaded machine's timer after predict: this test's, never pytest's death
        late.append(signum)

    outside = signal.signal(signal.SIGTERM, too_late)
    try:
        with pytest.raises(Terminated), sigterm_interrupts():
            ef.predict(model, volume, tmp_path / "p.zarr/pred", **dict(SETTINGS, tta=0))
        raised = time.monotonic()
        assert signal.getsignal(signal.SIGTERM) is too_late  # given back
        timers[0].join()
    finally:
        signal.signal(signal.SIGTERM, outside)
    assert not [t for t in threading.enumerate() if t.name.startswith("emfast-")]
    time.sleep(0.6)
    assert written and max(written) < raised
    monkeypatch.undo()
    assert ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", resume=True, **dict(SETTINGS, tta=0)).computed


@pytest.mark.parametrize("container", ["p.zarr", "p.h5"])
def test_opening_a_prediction_stopped_half_way_warns_until_it_is_resumed(tmp_path, volume, container):
    """An output a stopped run left was read as any other (its unwritten blocks as zeros, without a word); its
    record says it is not complete, and opening it says so and how to finish it."""
    path = tmp_path / container / "pred"
    with pytest.raises(RuntimeError):
        ef.predict(_interrupting(lopsided, 40, RuntimeError("stop")), volume, path, **SETTINGS)
    with pytest.warns(ef.UnfinishedOutputWarning, match="resume=True"):
        ef.open(path).close()
    if container == "p.h5":
        with pytest.warns(ef.UnfinishedOutputWarning):
            ef.hdf5(tmp_path / container, "pred").close()
    ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ef.open(path).close()


def _failing_write(monkeypatch, nth: int, error: Exception) -> list:
    """Make the ``nth`` block write raise ``error`` (undo with ``monkeypatch.undo()``); returns the list the
    starts of the blocks written go to."""
    original, lock, calls, written = OutputStore.write, threading.Lock(), [0], []

    def failing(self, start, data, *encoding):
        with lock:  # two writer threads
            calls[0] += 1
            fail = calls[0] == nth
        if fail:
            raise error
        original(self, start, data, *encoding)
        written.append(tuple(start))

    monkeypatch.setattr(OutputStore, "write", failing)
    return written


def test_a_failed_write_leaves_a_resumable_store(tmp_path, volume, monkeypatch):
    _failing_write(monkeypatch, 5, OSError(errno.ENOSPC, "No space left on device"))
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(BlockWriteError, match=r"writing block \d+ .* No space left on device.*resume=True"):
        ef.predict(lopsided, volume, path, **SETTINGS)
    monkeypatch.undo()
    ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **SETTINGS)
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "whole.zarr/pred"))


def test_finished_blocks_are_flagged_in_files_zarr_reads(tmp_path, volume, monkeypatch):
    """A block's flag is its one-element chunk file, written without zarr-python's write path (an event-loop round
    trip that held a writer for milliseconds per block); zarr-python reads exactly the blocks written."""
    original_setitem = zarr.Array.__setitem__

    def no_flags_through_zarr(array, selection, value):
        assert not array.path.endswith(".blocks"), "a flag was written through zarr-python"
        original_setitem(array, selection, value)

    written = _failing_write(monkeypatch, 5, OSError(errno.ENOSPC, "No space left on device"))
    monkeypatch.setattr(zarr.Array, "__setitem__", no_flags_through_zarr)
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(BlockWriteError):
        ef.predict(lopsided, volume, path, **SETTINGS)
    flags = zarr.open_array(str(tmp_path / "p.zarr"), path="pred.blocks", mode="r")[...]
    assert flags.dtype == np.uint8 and set(np.unique(flags)) <= {0, 1}
    assert 0 < int(flags.sum()) == len(written) < flags.size
    monkeypatch.undo()
    resumed = ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    assert resumed.computed == flags.size - len(written)


def test_an_output_started_with_the_old_blend_weights_is_not_resumed(tmp_path, volume, monkeypatch):
    """Outputs started before the weights were per axis (their record has no "weights") would mix blocks that
    differ in the last bits: resume refuses them, naming the setting."""
    path = tmp_path / "p.zarr/pred"
    _failing_write(monkeypatch, 3, OSError(errno.EIO, "Input/output error"))
    with pytest.raises(BlockWriteError):
        ef.predict(lopsided, volume, path, **SETTINGS)
    monkeypatch.undo()
    array = zarr.open_array(str(tmp_path / "p.zarr"), path="pred", mode="r+")
    record = dict(array.attrs["emfast_predict"])
    assert record.pop("weights") == "per-axis, 1/256"
    array.attrs["emfast_predict"] = record
    with pytest.raises(OutputExistsError, match=r"weights: None there, 'per-axis, 1/256' now.*overwrite=True"):
        ef.predict(lopsided, volume, path, resume=True, **SETTINGS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own CPU priority is Linux's")
def test_background_threads_yield_the_cpu_to_the_model(tmp_path, volume):
    """Readers, finisher and writers run at a lower CPU priority than the model's and the blender's threads (and
    the caller's), so on busy cores the network, and the blending the caller waits for, do not wait for them."""
    from emfast.inference._local import BACKGROUND_NICE

    seen = {}
    pools = ("emfast-predict-model", "emfast-predict-read", "emfast-predict-blend", "emfast-predict-finish",
             "emfast-predict-write")

    def model(batch):
        for thread in threading.enumerate():
            pool = thread.name.rsplit("_", 1)[0]
            if pool in pools and thread.native_id is not None:
                try:
                    seen[pool] = os.getpriority(os.PRIO_PROCESS, thread.native_id)
                except OSError:  # it ended meanwhile
                    pass
        return crop(batch)

    ef.predict(model, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16),
               block=(8, 16, 16), batch_size=2)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    background = min(caller + BACKGROUND_NICE, 19)
    assert seen == {"emfast-predict-model": caller, "emfast-predict-blend": caller,
                    "emfast-predict-read": background, "emfast-predict-finish": background,
                    "emfast-predict-write": background}


def test_existing_outputs_are_refused_replaced_or_resumed_only_with_the_same_settings(tmp_path, volume):
    path = tmp_path / "p.zarr/pred"
    root = zarr.open_group(str(tmp_path / "p.zarr"), mode="w")
    root.create_array("pred", shape=(3,), dtype="uint8")[...] = [1, 2, 3]
    for options in ({}, {"resume": True}, {"overwrite": True}):  # another program's array is never replaced
        with pytest.raises(OutputExistsError, match="exists and was not written by emfast"):
            ef.predict(crop, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, **options)
    assert list(zarr.open_array(str(tmp_path / "p.zarr"), path="pred", mode="r")[...]) == [1, 2, 3]
    path = tmp_path / "p.zarr/mine"
    ef.predict(crop, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, tta=4)
    with pytest.raises(OutputExistsError, match="exists; pass resume=True .* or overwrite=True"):
        ef.predict(crop, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT)
    with pytest.raises(OutputExistsError, match=r"tta: 4 there, 0 now"):
        ef.predict(crop, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, resume=True)
    ef.predict(crop, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, overwrite=True)
    assert _read(path).shape == (1,) + volume.shape
    with pytest.raises(OutputExistsError, match=r"tta: 0 there, 4 now"):
        ef.predict(crop, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, tta=4, resume=True)


def test_wrong_model_outputs_are_named(tmp_path, volume):
    def arguments(model):
        return dict(model=model, volume=volume, out=tmp_path / "p.zarr/pred", patch_in=PATCH_IN,
                    patch_out=PATCH_OUT, overwrite=True)

    with pytest.raises(ModelOutputError, match=r"returned shape \(1, 1, 10, 20, 20\) .* expected \(1, C, 6, 12, 12\)"):
        ef.predict(**arguments(lambda batch: batch))
    with pytest.raises(ModelOutputError, match="returned dtype int32; expected one of float16, float32, float64"):
        ef.predict(**arguments(lambda batch: crop(batch).astype(np.int32)))
    with pytest.raises(ModelOutputError, match=r"returned dtype >f4 \(the other byte order\); expected one of float16, "
                                               r"float32, float64 in the byte order of this machine"):
        ef.predict(**arguments(lambda batch: crop(batch).astype(">f4")))
    with pytest.raises(ModelOutputError, match="returned a list"):
        ef.predict(**arguments(lambda batch: [crop(batch)]))
    changing = [1]

    def more_channels(batch):
        changing[0] += 1
        return np.repeat(crop(batch), changing[0], axis=1)

    with pytest.raises(ModelOutputError, match=r"expected \(1, 2, 6, 12, 12\)"):
        ef.predict(**arguments(more_channels))


def test_bad_arguments_are_named(tmp_path, volume):
    out = tmp_path / "p.zarr/pred"
    for kwargs, message in [(dict(patch_out=(7, 12, 12)), "must exceed patch_out .* by an even number"),
                            (dict(overlap=6), "overlap .* must be smaller than patch_out"),
                            (dict(blend="linear"), "blend must be one of gaussian, bump, none"),
                            (dict(tta=2), "tta must be one of 0, 4, 8, 16"),
                            (dict(pad="wrap"), "pad must be one of reflect, edge, constant"),
                            (dict(dtype="int8"), "dtype must be one of float32, float16, uint8"),
                            (dict(roi=((0, 0, 0), (30, 10, 10))), "roi .* inside the volume"),
                            (dict(block=(10, 16, 16), chunks=(8, 16, 16)), "multiple of the output chunks"),
                            (dict(patch_in=(10, 20, 24), patch_out=(6, 12, 16), tta=16), "square in y and x")]:
        settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT)
        settings.update(kwargs)
        with pytest.raises(ValueError, match=message):
            ef.predict(crop, volume, out, **settings)
    with pytest.raises(ValueError, match="out must name a dataset in a .zarr or .h5 container"):
        ef.predict(crop, volume, tmp_path / "p.txt", patch_in=PATCH_IN, patch_out=PATCH_OUT)


def test_output_records_its_origin_and_keeps_resolution_and_offset(tmp_path, volume):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        dataset = f.create_dataset("raw", data=volume, chunks=(8, 16, 16))
        dataset.attrs["resolution"] = (40.0, 4.0, 4.0)
        dataset.attrs["offset"] = (400.0, 0.0, 8.0)
    ef.predict(crop, str(tmp_path / "in.h5/raw"), tmp_path / "out.h5/pred", patch_in=PATCH_IN,
               patch_out=PATCH_OUT, dtype="uint8")
    output = ef.open(tmp_path / "out.h5/pred")
    assert output.resolution == (40.0, 4.0, 4.0) and output.offset == (400.0, 0.0, 8.0)
    assert output.chunks == volume.shape  # chunks of 64 clipped to the volume, not the input's (8, 16, 16)
    np.testing.assert_array_equal(output.array[0], volume)
    with h5py.File(tmp_path / "out.h5", "r") as f:
        record = json.loads(f["pred"].attrs["emfast_predict"])
        assert "pred.blocks" not in f and f["pred"].compression == "gzip"
    assert record["complete"] and record["input"]["dataset"] == "raw" and record["model"].endswith(":crop")
    before = (tmp_path / "in.h5").read_bytes()
    with pytest.raises(ValueError, match="in the input's HDF5 file"):
        ef.predict(crop, str(tmp_path / "in.h5/raw"), tmp_path / "in.h5/pred", patch_in=PATCH_IN,
                   patch_out=PATCH_OUT)
    assert (tmp_path / "in.h5").read_bytes() == before


def test_zarr_outputs_go_beside_the_input_but_never_over_it(tmp_path, volume):
    root = zarr.open_group(str(tmp_path / "data.zarr"), mode="w")
    root.create_array("raw", data=volume, chunks=(8, 16, 16))
    ef.predict(crop, str(tmp_path / "data.zarr/raw"), tmp_path / "data.zarr/pred", patch_in=PATCH_IN,
               patch_out=PATCH_OUT)
    np.testing.assert_array_equal(_read(tmp_path / "data.zarr/pred")[0], normalized(volume))
    with pytest.raises(ValueError, match="is the input itself"):
        ef.predict(crop, str(tmp_path / "data.zarr/raw"), tmp_path / "data.zarr/raw", patch_in=PATCH_IN,
                   patch_out=PATCH_OUT, overwrite=True)
    np.testing.assert_array_equal(_read(tmp_path / "data.zarr/raw"), volume)


def test_progress_counts_blocks_tiles_and_voxels(tmp_path, volume):
    seen = []
    result = ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, tta=4,
                        chunks=(8, 16, 16), block=(8, 16, 16), progress=seen.append)
    assert [(s.blocks, s.blocks_total) for s in seen] == [(n, 27) for n in range(28)]
    assert seen[-1].voxels == seen[-1].voxels_total == volume.size and seen[0].voxels == 0
    assert seen[0].tiles == 1 and seen[-1].tiles == result.tiles * 4 == result.tiles_computed  # 1: the probe
    assert [s.seconds for s in seen] == sorted(s.seconds for s in seen)
    assert seen[-1].tiles_per_second > 0 and seen[-1].voxels_per_second > 0 and seen[-1].seconds_left == 0
    assert seen[0].seconds_left is None


def test_a_block_written_is_reported_before_the_run_has_fed_its_last_blocks(tmp_path):
    """Blocks were reported only once WRITES_IN_FLIGHT more were out: a run of four blocks showed "0/4" until
    its last block was fed (a review: 38 of 39 s), then every block at once."""
    calls, reported = [], []

    def slow(batch):  # a network that takes its time, so that a block is written while the next ones are fed
        time.sleep(0.01)
        calls.append(len(reported))
        return batch

    raw = np.random.default_rng(0).integers(0, 255, (48, 160, 160), dtype=np.uint8)
    ef.predict(slow, raw, tmp_path / "p.zarr/pred", patch_in=(16, 64, 64), chunks=(16, 80, 80), block=(48, 80, 80),
               tta=4, progress=lambda p: reported.append(p.blocks))
    assert reported[-1] == 4
    # block 1 was reported when block 3 was fed (it was written meanwhile), not when block 4 was: 67 against 89 %
    first = next(index for index, done in enumerate(calls) if done >= 2)  # reports: the start (0 blocks), block 1
    assert first < 0.8 * len(calls), (first, len(calls))


def test_the_progress_clock_counts_the_call_that_learns_the_channels(tmp_path, volume):
    """That call (the first tile) was counted in tiles but made before the clock started: the first report said
    0.000 s and 522,739 tiles/s, and the time left was short by the call's time."""
    def slow(batch):
        time.sleep(0.2)
        return crop(batch)

    seen = []
    ef.predict(slow, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16),
               block=(24, 48, 48), batch_size=64, progress=seen.append)
    assert seen[0].tiles == 1 and seen[0].seconds >= 0.2


def test_the_progress_clock_leaves_out_the_outputs_preparation(tmp_path, volume, monkeypatch):
    """Started before the probe, the clock counted what follows it too (an earlier output removed, a stored
    input's files listed): rates understated, time left overstated (a reviewer's case)."""
    from emfast.inference._store import OutputStore

    prepare = OutputStore.prepare.__func__

    def slow_prepare(cls, *args, **kwargs):
        time.sleep(1.0)
        return prepare(cls, *args, **kwargs)

    monkeypatch.setattr(OutputStore, "prepare", classmethod(slow_prepare))
    seen = []
    ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16),
               block=(24, 48, 48), channels=1, progress=seen.append)
    assert seen[0].tiles == 0 and seen[0].seconds < 1.0


def test_every_call_of_the_model_is_on_emfasts_threads(tmp_path, volume):
    """The call that learns the channels ran on the calling thread, every other on emfast's model thread: a mode
    that is per thread (torch's autocast and no_grad) set around predict reached the first tile alone, and its
    values depended on whether channels= was given."""
    mode = threading.local()
    mode.scale = 2.0  # set around predict, on this thread only
    threads = []

    def by_mode(batch):
        threads.append(threading.current_thread())
        return crop(batch) * np.float32(getattr(mode, "scale", 1.0))

    learned = _read(ef.predict(by_mode, volume, tmp_path / "p.zarr/learned", **SETTINGS).path)
    given = _read(ef.predict(by_mode, volume, tmp_path / "p.zarr/given", channels=1, **SETTINGS).path)
    assert threading.current_thread() not in threads
    np.testing.assert_array_equal(learned, given)


def test_a_progress_callback_written_for_0_2_still_gets_done_and_total_with_a_deprecation_warning(tmp_path, volume):
    seen = []
    with pytest.warns(DeprecationWarning, match=r"f\(done, total\) is deprecated"):
        ef.predict(crop, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                   chunks=(8, 16, 16), block=(8, 16, 16), progress=lambda done, total: seen.append((done, total)))
    assert seen == [(n, 27) for n in range(28)]


def test_a_torch_module_on_the_cpu(tmp_path, volume):
    torch = pytest.importorskip("torch", reason="torch is not installed")

    class Crop(torch.nn.Module):
        def forward(self, batch):
            assert isinstance(batch, torch.Tensor)
            return batch[:, :, 2:-2, 4:-4, 4:-4] * 2

    ef.predict(Crop(), volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, device="cpu",
               tta=4, batch_size=4)
    np.testing.assert_array_equal(_read(tmp_path / "p.zarr/pred")[0],
                                  normalized(volume) * 2)


def test_a_torch_module_in_bfloat16_is_widened_to_float32(tmp_path, volume):
    """A network run in mixed precision returns bfloat16, which NumPy cannot hold (a bare TypeError from torch):
    it is widened to float32, exactly, and blended as any float32 prediction."""
    torch = pytest.importorskip("torch", reason="torch is not installed")

    class Crop(torch.nn.Module):
        def forward(self, batch):
            return (batch[:, :, 2:-2, 4:-4, 4:-4] * 3).to(torch.bfloat16)

    ef.predict(Crop(), volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, device="cpu")
    expected = torch.from_numpy(normalized(volume) * 3).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(_read(tmp_path / "p.zarr/pred")[0], expected)


def test_dask_with_two_workers_equals_one_process(tmp_path, volume):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed "
                                                            "(pip install 'emfast[dask]')")
    ef.predict(lopsided, volume, tmp_path / "local.zarr/pred", **SETTINGS)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        result = ef.predict(lopsided, volume, tmp_path / "dask.zarr/pred", client=client, **SETTINGS)
        workers = client.run(os.getpid)
    assert len(set(workers.values())) == 2 and result.computed == result.blocks
    # Each tile once, but for a tile two workers needed at the same moment (the tasks' order makes that rare).
    assert result.tiles * 4 <= result.tiles_computed <= 1.05 * result.tiles * 4
    np.testing.assert_array_equal(_read(tmp_path / "dask.zarr/pred"), _read(tmp_path / "local.zarr/pred"))


def test_dask_tasks_on_one_workers_threads_count_their_own_tiles_and_values(tmp_path, volume):
    """Tasks running at once on one worker's two threads share its predictor: each counted the other's tiles and
    values too (tiles_computed 3905 for 2016 model calls; 51054 values written of 25641), and the NaN count was
    dropped from the uint8 warning."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed "
                                                            "(pip install 'emfast[dask]')")
    from emfast.inference import SaturationWarning

    calls, lock = [0], threading.Lock()

    def counted(batch):
        with lock:
            calls[0] += len(batch)
        out = lopsided(batch).copy()
        out[:, :, 0] = np.nan
        return out

    settings = dict(SETTINGS, dtype="uint8")
    with pytest.warns(SaturationWarning) as local:
        ef.predict(counted, volume, tmp_path / "local.zarr/pred", **settings)
    local_calls, calls[0] = calls[0], 0
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        with pytest.warns(SaturationWarning) as on_dask:
            result = ef.predict(counted, volume, tmp_path / "dask.zarr/pred", client=client, **settings)
    assert result.tiles_computed + result.tiles_padded == calls[0] and local_calls <= calls[0] <= 1.05 * local_calls
    counts = re.compile(r"\((\d+) of (\d+), (\d+) of them NaN")
    (clipped, values, nans), = counts.findall(str(on_dask[0].message))
    assert int(values) == np.prod(result.shape) and int(nans) > 0
    assert counts.findall(str(local[0].message)) == [(clipped, values, nans)]  # the blocks' values, as written


def test_dask_with_its_client_closed_midway_says_so_and_resumes(tmp_path, volume):
    """The client closed while tasks ran (or the workers holding the run's data lost) ended predict in Dask's
    "FutureCancelledError: _run_block-...-24 cancelled for reason: unknown.", naming emfast's task key and no cause
    (a review). It names the block, the cause and resume=True, and the resume completes the output."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed "
                                                            "(pip install 'emfast[dask]')")
    DaskRunLostError = ef.DaskRunLostError  # public, as the docstring's Raises names it (a review)

    ef.predict(lopsided, volume, tmp_path / "local.zarr/pred", **SETTINGS)
    path = tmp_path / "dask.zarr/pred"
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster:
        client = distributed.Client(cluster)

        def closing(state):
            if state.blocks == 2:
                client.close()

        with pytest.raises(DaskRunLostError, match=r"predict on Dask: block \d+ \(voxels .*\) was cancelled \(.*\): "
                                                   r"the client was closed while it ran; the blocks written are "
                                                   r"recorded: run again with resume=True"):
            ef.predict(lopsided, volume, path, client=client, progress=closing, **SETTINGS)
    with pytest.warns(ef.UnfinishedOutputWarning):
        ef.open(path).close()
    ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "local.zarr/pred"))


def test_dask_refuses_an_hdf5_output_before_replacing_the_one_there(tmp_path, volume):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed "
                                                            "(pip install 'emfast[dask]')")
    path = tmp_path / "p.h5/pred"
    ef.predict(lopsided, volume, path, **SETTINGS)
    before = _read(path)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        with pytest.raises(ValueError, match=r"client= writes from many processes at once, which HDF5 does not "
                                             r"allow; write .*p.h5/pred as a .zarr output"):
            ef.predict(crop, volume, path, client=client, overwrite=True, **SETTINGS)
    np.testing.assert_array_equal(_read(path), before)


NETS = '''
import numpy as np

def load(gain=1.0):
    def network(batch):
        return batch[:, :, 2:-2, 4:-4, 4:-4] * np.float32(gain)
    return network
'''


def _predict_config(tmp_path, body):
    (tmp_path / "nets.py").write_text(NETS)
    (tmp_path / "predict.yaml").write_text(textwrap.dedent(body))
    return tmp_path / "predict.yaml"


def test_emfast_predict_runs_a_config_and_resumes(tmp_path, volume, capsys):
    from emfast.cli import main

    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=volume, chunks=(8, 16, 16))
    config = _predict_config(tmp_path, """
        predict:
          model: nets:load
          model_args: {gain: 2.0}
          input: {file: in.h5, dataset: raw}
          output: out.zarr/pred
          patch_in: [10, 20, 20]
          patch_out: [6, 12, 12]
          overlap: [2, 4, 4]
          blend: bump
          tta: 8
          dtype: float32
          batch_size: 4
        """)
    assert main(["predict", str(config)]) == 0
    out = capsys.readouterr()
    assert "wrote" in out.out and "1 channel x" in out.out and "1 of 1 block computed" in out.out
    assert re.search(r"computed in [0-9.]+ s, the model busy [0-9]+% of it$", out.out.strip())
    lines = out.err.splitlines()  # no \r in a log
    assert lines[0] == "[........................] 0/1 block, estimating the time left" and len(lines) == 2
    assert re.fullmatch(r"\[#{24}\] 1/1 block, [0-9.]+ tiles/s, [0-9.]+ Mvoxel/s, done in [0-9]+ s", lines[1])
    np.testing.assert_array_equal(_read(tmp_path / "out.zarr/pred")[0], normalized(volume) * np.float32(2))
    assert main(["predict", str(config)]) == 2
    assert "exists; pass --resume to continue an unfinished prediction with the same settings, or --overwrite" \
        in capsys.readouterr().err
    assert main(["predict", str(config), "--resume"]) == 0
    assert "0 of 1 block computed" in capsys.readouterr().out


def test_predict_config_errors_name_the_key_and_line(tmp_path):
    from emfast.config import ConfigError, load_config, load_predict_config

    config = _predict_config(tmp_path, """
        predict:
          model: nets:load
          input: in.h5/raw
          output: out.zarr/pred
          patch_in: [10, 20, 20]
          tta: 3
        """)
    with pytest.raises(ConfigError, match=r"line 7: predict\.tta: expected one of 0, 4, 8, 16, got the integer 3"):
        load_predict_config(config)
    config.write_text(config.read_text().replace("tta: 3", "blending: gaussian"))
    with pytest.raises(ConfigError, match="unknown key 'blending'; did you mean 'blend'"):
        load_predict_config(config)
    config.write_text(config.read_text().replace("blending:", "blend:").replace("nets:load", "nets.load"))
    with pytest.raises(ConfigError, match="expected module:function"):
        load_predict_config(config)
    with pytest.raises(ConfigError, match="no predict section"):
        load_predict_config("data: {}\n")
    training = textwrap.dedent("""
        data: {samples: [{file: {builtin: demo}, raw: volumes/raw}]}
        loader: {patch: [8, 16, 16]}
        predict: {model: nets:load, input: in.h5/raw, output: out.zarr/pred, patch_in: [10, 20, 20], pad: wrap}
        """)
    with pytest.raises(ConfigError, match=r"predict\.pad.*expected one of reflect, edge, constant"):
        load_config(training)
    spec = load_predict_config(training.replace("pad: wrap", "engine: {dask: {workers: 2}}"))
    assert spec.engine == {"workers": 2} and spec.options["patch_in"] == (10, 20, 20)


def test_resuming_after_the_input_changed_is_refused(tmp_path, volume):
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=volume, chunks=(8, 16, 16))
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError):
        ef.predict(_interrupting(lopsided, 20, RuntimeError("stop")), str(tmp_path / "in.h5/raw"), path,
                   **SETTINGS)
    with h5py.File(tmp_path / "in.h5", "a") as f:  # the input is rewritten between the runs
        f["raw"][0] = 255 - f["raw"][0]
    os.utime(tmp_path / "in.h5", ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(OutputExistsError, match=r"cannot resume .*: a file holding the input .*in.h5/raw changed "
                                                 r"since this output was started \(.*\): 1 file of \d+ bytes now and "
                                                 r"then, but it was rewritten"):
        ef.predict(lopsided, str(tmp_path / "in.h5/raw"), path, resume=True, **SETTINGS)


def test_an_input_named_another_way_resumes(tmp_path, volume, monkeypatch):
    """The input named relatively, then absolutely, then through a link to its folder, is the same input: the
    resume goes on (it was refused as "another input", the record holding the path as typed)."""
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=volume, chunks=(8, 16, 16))
    (tmp_path / "link").symlink_to(tmp_path)
    whole = ef.predict(lopsided, str(tmp_path / "in.h5/raw"), tmp_path / "whole.zarr/pred", **SETTINGS)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "p.zarr/pred"
    resumed = 0
    for calls, spelled in ((10, "in.h5/raw"), (30, str(tmp_path / "in.h5/raw")), (None, "link/in.h5/raw")):
        try:
            resumed += ef.predict(lopsided if calls is None else _interrupting(lopsided, calls, RuntimeError("stop")),
                                  spelled, path, resume=calls != 10, **SETTINGS).computed
        except RuntimeError:
            continue
    assert 0 < resumed < whole.computed
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "whole.zarr/pred"))


def test_uint8_outputs_warn_once_with_the_fraction_clipped(tmp_path, volume):
    from emfast.inference import SaturationWarning

    def logits(batch):  # a network without its final sigmoid: values far outside [0, 1]
        return crop(batch) * 20 - 10

    with pytest.warns(SaturationWarning) as warned:
        ef.predict(logits, volume, tmp_path / "p.zarr/logits", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                   dtype="uint8", chunks=(8, 16, 16), block=(8, 16, 16))
    values = normalized(volume).astype(np.float64) * 20 - 10  # those rounding outside 0..255 are clipped
    clipped = np.count_nonzero((values < -0.5 / 255) | (values > 1 + 0.5 / 255)) / volume.size
    assert len(warned) == 1  # once per run, not once per block
    assert f"{clipped:.1%} of the values written to" in str(warned[0].message)
    assert "apply a sigmoid" in str(warned[0].message) and "dtype='float32'" in str(warned[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in [0, 1]: no warning
        ef.predict(crop, volume, tmp_path / "p.zarr/fine", patch_in=PATCH_IN, patch_out=PATCH_OUT, dtype="uint8")


def test_uint8_outputs_count_nan_among_the_values_clipped(tmp_path, volume):
    """NaN from the model is written as 0 in uint8: counted and named in the warning (it went unsaid)."""
    from emfast.inference import SaturationWarning

    def with_nan(batch):
        out = crop(batch).copy()
        out[:, :, 0] = np.nan  # the first section of every tile
        return out

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16))
    with pytest.warns(SaturationWarning, match=r"of them NaN, written as 0") as warned:
        ef.predict(with_nan, volume, tmp_path / "p.zarr/nan", dtype="uint8", **settings)
    with pytest.warns(ef.NonFiniteWarning):  # the same NaN in a float output
        nan = np.isnan(_read(ef.predict(with_nan, volume, tmp_path / "p.zarr/float", **settings).path))
    assert nan.any() and (_read(tmp_path / "p.zarr/nan")[nan] == 0).all()
    counted = int(re.search(r"\(\d+ of \d+, (\d+) of them NaN", str(warned[0].message)).group(1))
    assert counted == nan.sum()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("engine", ["local", "dask"])
def test_float_outputs_with_nan_or_infinity_from_the_model_warn_once(tmp_path, volume, dtype, engine):
    """NaN and infinity from the model are written as they are, and one NonFiniteWarning counts them (they went
    unsaid); a float16 overflow of a finite value (documented as infinity) is not the model's."""
    import contextlib
    from emfast.inference import NonFiniteWarning

    def with_non_finite(batch):
        out = crop(batch).copy()
        out[:, :, 0, 0] = np.nan
        out[:, :, 0, 1] = np.inf
        out[:, :, 1] *= 70000  # past float16's range, finite
        return out

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16), block=(8, 16, 16))
    with pytest.warns(NonFiniteWarning):
        expected = np.count_nonzero(~np.isfinite(_read(ef.predict(with_non_finite, volume, tmp_path / "p.zarr/f32",
                                                                  **settings).path)))
    with contextlib.ExitStack() as stack:
        client = None
        if engine == "dask":
            distributed = pytest.importorskip("distributed")
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None, silence_logs=40))
            client = stack.enter_context(distributed.Client(cluster))
        with pytest.warns(NonFiniteWarning) as warned:
            ef.predict(with_non_finite, volume, tmp_path / "p.zarr/p", client=client, dtype=dtype, **settings)
    assert len([w for w in warned if w.category is NonFiniteWarning]) == 1  # once per run, not once per block
    assert 0 < expected < volume.size and str(warned[0].message) == (
        f"{expected} of the {volume.size} values written to {tmp_path / 'p.zarr/p'} are NaN or infinite: the model "
        "returned them; they were written as they are")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finite: no warning
        ef.predict(crop, volume, tmp_path / "p.zarr/fine", dtype=dtype, **settings)


def test_nan_in_a_float_input_is_named_as_a_source_of_nan_in_the_output(tmp_path):
    """An identity network passing on the input's NaN was said to have returned it; the Loader refuses the same
    input, naming where the NaN is. The input is named only where the tiles read it: a NaN outside the roi and its
    context is not where an output's NaN came from."""
    import h5py
    from emfast.inference import NonFiniteWarning

    raw = np.random.default_rng(9).random((16, 32, 32)).astype(np.float32)
    raw[10, 30, 7] = np.nan
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = raw
    settings = dict(patch_in=(8, 16, 16), blend="none", normalize=(1.0, 0.0))
    with pytest.warns(NonFiniteWarning) as held:
        ef.predict(lambda batch: batch, raw, tmp_path / "p.zarr/memory", **settings)
    assert str(held[0].message).endswith(
        "are NaN or infinite: the model returned them, or passed on the input's: the region the tiles read holds "
        "NaN or infinity, first at (c, z, y, x) = (0, 10, 30, 7); they were written as they are")
    with pytest.warns(NonFiniteWarning) as lazy:
        ef.predict(lambda batch: batch, str(tmp_path / "in.h5/raw"), tmp_path / "p.zarr/lazy", **settings)
    assert "the model returned them, or passed on the float input's (read lazily, it was not scanned);" in \
        str(lazy[0].message)

    def makes_nan(batch):
        out = batch.copy()
        out[:, :, 0, 0, 0] = np.nan
        return out

    with pytest.warns(NonFiniteWarning) as elsewhere:  # the input's NaN at z 10, the roi's tiles read z 0..8
        ef.predict(makes_nan, raw, tmp_path / "p.zarr/roi", roi=((0, 0, 0), (8, 16, 16)), **settings)
    assert str(elsewhere[0].message).endswith("NaN or infinite: the model returned them; they were written as they are")
    with pytest.warns(NonFiniteWarning) as beyond:  # a roi smaller than the tile: its tile reads z 0..12, past it
        ef.predict(makes_nan, raw, tmp_path / "p.zarr/small", roi=((0, 0, 0), (4, 16, 16)),
                   **dict(settings, patch_in=(12, 16, 16)))
    assert "first at (c, z, y, x) = (0, 10, 30, 7)" not in str(beyond[0].message)  # y 30 is past the tile's 16
    with pytest.warns(NonFiniteWarning) as reached:
        ef.predict(makes_nan, raw, tmp_path / "p.zarr/reached", roi=((0, 24, 0), (4, 32, 16)),
                   **dict(settings, patch_in=(12, 8, 16)))
    assert str(reached[0].message).endswith("holds NaN or infinity, first at (c, z, y, x) = (0, 10, 30, 7); they "
                                            "were written as they are")


def test_resuming_with_an_array_input_that_changed_is_refused(tmp_path, volume):
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError):
        ef.predict(_interrupting(lopsided, 20, RuntimeError("stop")), volume, path, **SETTINGS)
    record = zarr.open_array(str(tmp_path / "p.zarr"), path="pred", mode="r").attrs["emfast_predict"]
    assert record["input"]["fingerprint"] == {"bytes": volume.nbytes,
                                              "sha256": hashlib.sha256(volume.tobytes()).hexdigest()}
    changed = volume.copy()
    changed[5, 5, 5] ^= 1  # one voxel
    with pytest.raises(OutputExistsError, match="cannot resume .*: the input array holds other data than "
                                                "when this output was started"):
        ef.predict(lopsided, changed, path, resume=True, **SETTINGS)
    ef.predict(lopsided, volume, path, resume=True, **SETTINGS)


@pytest.mark.parametrize("view", ["transposed", "flipped", "strided", "contiguous"])
def test_an_array_inputs_fingerprint_is_taken_without_copying_the_array(view):
    """The resume record's SHA-256 of an in-memory input is of its bytes in C order; a view (a memmap flipped or
    transposed) is hashed a slab at a time, not copied whole (a copy the size of the input, outside ``memory=``)."""
    import tracemalloc
    from emfast.io import array_fingerprint
    base = np.random.default_rng(5).integers(0, 256, (64, 256, 512), dtype=np.uint8)  # 8 MiB
    array = {"transposed": base.transpose(2, 1, 0), "flipped": base[:, :, ::-1], "strided": base[:, ::2],
             "contiguous": base}[view]
    tracemalloc.start()
    try:
        fingerprint = array_fingerprint(array)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fingerprint == {"bytes": array.nbytes, "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
    assert peak < base.nbytes // 4


def test_the_old_name_of_the_prediction_dtype_names_warns_and_gives_the_new_list():
    import emfast.inference as inference
    assert inference.PREDICT_OUTPUT_DTYPE_NAMES == ("float32", "float16", "uint8")
    assert "OUTPUT_DTYPES" not in inference.__all__
    with pytest.warns(DeprecationWarning, match="PREDICT_OUTPUT_DTYPE_NAMES"):
        assert inference.OUTPUT_DTYPES is inference.PREDICT_OUTPUT_DTYPE_NAMES
    with pytest.raises(AttributeError, match="no attribute 'NO_SUCH_NAME'"):
        inference.NO_SUCH_NAME


def test_a_device_without_pytorch_is_refused_before_anything_runs(tmp_path, volume, monkeypatch):
    """It was a bare "No module named 'torch'" raised from the model's thread, once the run had started."""
    monkeypatch.setitem(sys.modules, "torch", None)  # as if PyTorch were not installed
    with pytest.raises(ImportError, match=r"device 'cpu' feeds the model torch tensors, but PyTorch is not "
                                          r"installed \(pip install torch\); leave device out"):
        ef.predict(lambda batch: batch, volume, tmp_path / "p.zarr/p", patch_in=(8, 16, 16), device="cpu")
    assert not (tmp_path / "p.zarr").exists()


def test_a_block_beyond_the_memory_given_is_refused(tmp_path, volume):
    """memory= was checked only for blocks predict chose: a block given with it ran at 14 times the budget."""
    with pytest.raises(ValueError, match=r"block=\(23, 41, 37\) needs about \d+ bytes .* more than the \d+ of "
                                         r"memory=1048576 left"):
        ef.predict(lambda batch: batch, volume, tmp_path / "p.zarr/p", patch_in=(8, 16, 16), memory=2**20,
                   block=(23, 41, 37))
    assert not (tmp_path / "p.zarr/p").exists()
    ef.predict(lambda batch: batch, volume, tmp_path / "q.zarr/p", patch_in=(8, 16, 16), block=(23, 41, 37))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_overwriting_with_an_input_without_geometry_drops_the_earlier_ome_description(tmp_path, volume, zarr_format):
    """The group kept the first output's OME scale and translation, which ome-zarr-py read for the new array while
    funlib read it without geometry."""
    zarr = pytest.importorskip("zarr")
    placed = ef.Volume.from_array(volume, resolution=(40, 4, 4), offset=(400, 40, 80))
    group = zarr.open_group(str(tmp_path / "p.zarr"), mode="w", zarr_format=zarr_format)
    ef.predict(lambda batch: batch, placed, tmp_path / "p.zarr/p", patch_in=(8, 16, 16))

    def described():
        attributes = dict(zarr.open_group(str(tmp_path / "p.zarr"), mode="r").attrs)
        return attributes.get("ome", attributes).get("multiscales")

    assert described() is not None and group is not None
    ef.predict(lambda batch: batch, volume, tmp_path / "p.zarr/p", patch_in=(8, 16, 16), overwrite=True)
    assert described() is None
    assert "ome" not in zarr.open_group(str(tmp_path / "p.zarr"), mode="r").attrs  # no bare {"version": "0.5"}
    assert "resolution" not in zarr.open_array(str(tmp_path / "p.zarr/p"), mode="r").attrs


def test_a_new_output_store_is_written_in_the_zarr_format_asked_for(tmp_path, volume):
    """Every new store was zarr 3: readers on zarr-python 2 (gunpowder 1.4, funlib.persistence 0.6 pin it) found
    nothing at the path (a review of porting from gunpowder). An existing store keeps its own format."""
    placed = ef.Volume.from_array(volume, resolution=(40, 4, 4), offset=(400, 40, 80))
    ef.predict(crop, placed, tmp_path / "v2.zarr/p", patch_in=PATCH_IN, patch_out=PATCH_OUT, zarr_format=2)
    assert (tmp_path / "v2.zarr/.zgroup").is_file() and (tmp_path / "v2.zarr/p/.zarray").is_file()
    assert not list(tmp_path.glob("v2.zarr/**/zarr.json"))
    array = zarr.open_array(str(tmp_path / "v2.zarr"), path="p", mode="r", zarr_format=2)
    np.testing.assert_array_equal(array[0], normalized(volume))
    assert list(array.attrs["voxel_size"]) == [40, 4, 4] and list(array.attrs["offset"]) == [400, 40, 80]
    ef.predict(crop, placed, tmp_path / "v2.zarr/q", patch_in=PATCH_IN, patch_out=PATCH_OUT)  # the store's own
    assert (tmp_path / "v2.zarr/q/.zarray").is_file()
    ef.predict(crop, placed, tmp_path / "v3.zarr/p", patch_in=PATCH_IN, patch_out=PATCH_OUT)
    assert (tmp_path / "v3.zarr/p/zarr.json").is_file()
    for bad in (4, True, "2"):
        with pytest.raises(ValueError, match=rf"zarr_format must be 2 or 3, got {bad!r}"):
            ef.predict(crop, placed, tmp_path / "bad.zarr/p", patch_in=PATCH_IN, patch_out=PATCH_OUT, zarr_format=bad)
    assert not (tmp_path / "bad.zarr").exists()


def test_a_memory_too_small_for_the_inputs_chunk_cache_says_how_much_memory_it_needs(tmp_path, volume):
    """The message was the chunk cache's: "give a budget of at least B bytes", B below the memory given."""
    zarr = pytest.importorskip("zarr")
    zarr.create_array(str(tmp_path / "in.zarr"), shape=volume.shape, chunks=volume.shape, dtype=volume.dtype)[...] = \
        volume
    block = volume.nbytes
    with pytest.raises(ValueError, match=rf"memory={2 * block} bytes is too small for the input's chunk cache: it "
                                         rf"gets 1/4 of memory, {block // 2} bytes, less than one block of .* "
                                         rf"\({block} bytes\); give memory of at least {4 * block} bytes"):
        ef.predict(lambda batch: batch, str(tmp_path / "in.zarr"), tmp_path / "p.zarr/p", patch_in=(8, 16, 16),
                   memory=2 * block)


def test_chunks_larger_than_the_volume_are_cut_to_it_in_hdf5(tmp_path, volume):
    """zarr takes chunks larger than the array; h5py refuses them ("Chunk shape must not be greater than data
    shape"), which left an empty file behind. An HDF5 output's chunks are cut to the array: the same values."""
    settings = dict(SETTINGS, chunks=(30, 16, 50), block=None)
    expected = _read(ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", **settings).path)
    path = ef.predict(lopsided, volume, tmp_path / "p.h5/pred", **settings).path
    np.testing.assert_array_equal(_read(path), expected)
    with h5py.File(tmp_path / "p.h5", "r") as f:
        assert f["pred"].chunks == (2, 23, 16, 37)


@pytest.mark.parametrize("output", ["p.zarr/pred", "p.h5/pred"])
def test_after_the_models_first_error_it_is_not_called_again_and_that_error_is_raised(tmp_path, volume, output):
    """A model that fails from its call N on (a CUDA error leaves the device broken, and what follows fails
    too): the batches queued behind the failed one are not run, and the error raised is the first, which names
    the cause. Before, the next batches were run, and 2 of 8 runs raised the error of call N + 2."""
    for attempt in range(6):
        calls = []

        def failing(batch):
            calls.append(len(calls) + 1)
            if len(calls) >= 9:
                raise RuntimeError(f"failed at call {len(calls)}")
            return lopsided(batch)

        with pytest.raises(RuntimeError, match=r"^failed at call 9(\n|$)"):  # pytest matches the notes too
            ef.predict(failing, volume, tmp_path / f"{attempt}{output}", **dict(SETTINGS, batch_size=3, blend="none"))
        assert len(calls) == 9


@pytest.mark.parametrize("given", ["array", "hdf5 path"])
def test_a_boolean_input_is_refused_as_the_loader_refuses_it(tmp_path, given):
    """A bool array reads as uint8 (False 0, True 1), whose default scaling made every True 1/255 in the output
    without a word, where the Loader refuses the same array as raw."""
    mask = np.zeros((16, 32, 32), bool)
    mask[4:12] = True
    source = mask
    if given == "hdf5 path":
        with h5py.File(tmp_path / "in.h5", "w") as file:
            file["mask"] = mask
        source = tmp_path / "in.h5/mask"
    with pytest.raises(TypeError, match=r"predict's input must be intensities \(integers or floats\), not bool"):
        ef.predict(lambda batch: batch, source, tmp_path / "p.zarr/p", patch_in=(8, 16, 16))
    assert not (tmp_path / "p.zarr").exists()


def test_an_output_that_may_not_be_written_is_refused_before_the_model_is_called(tmp_path, volume, monkeypatch):
    """With ``channels`` left out the model is called once to learn them; an output that exists (without resume
    or overwrite), that another run writes, or beside which nothing can be written (a read-only mount) was
    refused only after that call, which loads and runs a network for nothing."""
    import errno
    from emfast.io import OutputLock
    from emfast.io import _outputs

    calls = []

    def counted(batch):
        calls.append(len(batch))
        return crop(batch)

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT)
    ef.predict(crop, volume, tmp_path / "p.zarr/pred", **settings)
    with pytest.raises(OutputExistsError, match=r"p.zarr/pred exists; pass resume=True to continue"):
        ef.predict(counted, volume, tmp_path / "p.zarr/pred", **settings)
    with OutputLock(tmp_path / "busy.zarr"):
        with pytest.raises(_outputs.OutputBusyError, match="is writing"):
            ef.predict(counted, volume, tmp_path / "busy.zarr/pred", **settings)
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".emfast-lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    import h5py
    import subprocess
    import sys
    with h5py.File(tmp_path / "viewed.h5", "w") as f:
        f["other"] = np.zeros(4)
    viewer = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time; f = h5py.File(sys.argv[1], 'r'); "
                               "print('open', flush=True); time.sleep(60)", str(tmp_path / "viewed.h5")],
                              stdout=subprocess.PIPE, text=True)
    try:  # a viewer holds the HDF5 output open: refused before the model is called, not once it has run
        assert viewer.stdout.readline().strip() == "open"
        with pytest.raises(_outputs.OutputBusyError, match=r"cannot write .*viewed.h5: another program has it open"):
            ef.predict(counted, volume, tmp_path / "viewed.h5/pred", **settings)
        for unlocked in ("FALSE", "0"):  # HDF5 (which reads it once per process) takes no lock, and writes it
            run = subprocess.run([sys.executable, "-c", "import sys, numpy as np, emfast as ef; ef.predict(lambda b: b, "
                                  "np.zeros((8, 16, 16), np.uint8), sys.argv[1], patch_in=(8, 16, 16))",
                                  f"{tmp_path}/viewed.h5/pred{unlocked}"], capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, HDF5_USE_FILE_LOCKING=unlocked,
                                          PYTHONPATH=os.pathsep.join(sys.path)))
            assert run.returncode == 0, run.stderr
    finally:
        viewer.kill()
        viewer.wait()
    with h5py.File(tmp_path / "mine.h5", "a") as mine:  # this process's own file open to write: HDF5 shares it
        mine["meta"] = np.zeros(3)
        ef.predict(crop, volume, tmp_path / "mine.h5/pred", **settings)
        assert "pred" in mine
    monkeypatch.setattr(_outputs.os, "open", read_only)
    with pytest.raises(OSError, match=r"cannot write beside the output .*ro.zarr: Read-only file system \(emfast "
                                      r"keeps its lock file .ro.zarr.emfast-lock there\); write the output to a "
                                      r"folder you can write to"):
        ef.predict(counted, volume, tmp_path / "ro.zarr/pred", **settings)
    assert calls == []


def sleepy(batch):
    time.sleep(0.01)
    return lopsided(batch)


def test_dask_reports_the_seconds_of_the_models_calls_on_the_workers(tmp_path, volume):
    """``Prediction.profile["model"]`` counted only the calls in this process on Dask (with worker processes,
    0.05 s of a run whose model slept 2.4 s), so ``emfast predict`` printed "the model busy 0% of it"."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed "
                                                            "(pip install 'emfast[dask]')")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        result = ef.predict(sleepy, volume, tmp_path / "dask.zarr/pred", client=client, channels=2, **SETTINGS)
    calls = -(-result.tiles_computed // SETTINGS["batch_size"])  # at least: a batch holds batch_size tiles at most
    assert calls > 10 and result.profile["model"] >= 0.01 * calls


def test_an_hdf5_output_replaced_after_interruptions_reuses_the_partial_outputs_space(tmp_path):
    """HDF5 forgets a deleted dataset's space when the file closes: each interrupted prediction replaced with
    overwrite=True left its partial output's space unused in the file (1.27 MiB to 8.15 MiB after 40 cycles in a
    helper's run). An output file emfast creates keeps its free space across openings, and reuses it: what
    still grows is a few KiB of HDF5's own metadata per cycle."""
    raw = np.random.default_rng(8).integers(0, 256, (48, 128, 128), dtype=np.uint8)
    settings = dict(patch_in=(16, 64, 64), patch_out=(8, 48, 48), batch_size=2, chunks=(8, 32, 32),
                    block=(16, 64, 64))

    def network(batch):
        return batch[:, :, 4:-4, 8:-8, 8:-8] * np.float32(0.5)

    out = tmp_path / "o.h5/pred"
    sizes = []
    for cycle in range(5):
        with pytest.raises(RuntimeError, match="stop"):
            ef.predict(_interrupting(network, 5, RuntimeError("stop")), raw, out, overwrite=cycle > 0, **settings)
        ef.predict(network, raw, out, overwrite=True, **settings)
        sizes.append(os.path.getsize(tmp_path / "o.h5"))
    assert sizes[-1] <= 1.1 * sizes[0], sizes  # before: 2.19 times after 5 cycles
    ef.predict(network, raw, tmp_path / "reference.zarr/pred", **settings)
    with h5py.File(tmp_path / "o.h5", "r") as file:  # an ordinary HDF5 file, holding the whole prediction
        np.testing.assert_array_equal(file["pred"][...], _read(tmp_path / "reference.zarr/pred"))


def test_resuming_takes_the_channels_from_the_record_and_a_complete_output_never_calls_the_model(tmp_path, volume):
    """Without ``channels`` the model was called once to learn them, even to resume an output already complete
    (a workflow rerun with --resume loaded and ran the network for nothing)."""
    out = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError, match="stop"):
        ef.predict(_interrupting(lopsided, 20, RuntimeError("stop")), volume, out, **SETTINGS)
    calls = []

    def counted(batch):
        calls.append(len(batch))
        return lopsided(batch)

    ef.predict(counted, volume, out, resume=True, **SETTINGS)
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **SETTINGS)
    np.testing.assert_array_equal(_read(out), _read(tmp_path / "whole.zarr/pred"))
    assert calls  # the unfinished blocks were computed

    def never(batch):
        raise AssertionError("the model was called to resume a complete output")

    result = ef.predict(never, volume, out, resume=True, **SETTINGS)
    assert result.computed == 0 and result.tiles_computed == 0
    partial = tmp_path / "q.zarr/pred"
    with pytest.raises(RuntimeError, match="stop"):
        ef.predict(_interrupting(lopsided, 20, RuntimeError("stop")), volume, partial, **SETTINGS)
    with pytest.raises(ModelOutputError, match=r"returned shape \(2, 3, 6, 12, 12\) .* expected \(2, 2, "):
        ef.predict(lambda batch: np.repeat(lopsided(batch)[:, :1], 3, axis=1), volume, partial, resume=True,
                   **SETTINGS)  # the record's channels are the model's: one that changed is told so


@pytest.mark.parametrize("case", ["beside a finished output", "replacing a finished output"])
def test_an_hdf5_resume_never_takes_stale_flags_for_finished_blocks(tmp_path, case):
    """HDF5 hands out the space of a deleted dataset again without clearing it: the finished-block flags of a new
    output (contiguous, never written) read the 1s of an earlier run's flags, so a resume after an interruption
    computed nothing and left half the output wrong (563039 of 1048576 values). Found by a review: after
    replacing a finished output with overwrite=True in the same session, and, once HDF5 files kept their free
    space, beside a finished output in the same file."""
    raw = np.random.default_rng(0).integers(0, 256, (64, 128, 128), dtype=np.uint8)
    settings = dict(patch_in=(16, 48, 48), patch_out=(8, 32, 32), batch_size=4, chunks=(8, 32, 32),
                    block=(8, 32, 32))

    def network(batch):
        return batch[:, :, 4:-4, 8:-8, 8:-8] * np.float32(0.5)

    ef.predict(network, raw, tmp_path / "reference.zarr/pred", **settings)
    if case == "beside a finished output":
        ef.predict(network, raw, tmp_path / "o.h5/keep", **settings)
        stopped = dict()
    else:
        ef.predict(network, raw, tmp_path / "o.h5/pred", **settings)
        stopped = dict(overwrite=True)
    with pytest.raises(RuntimeError, match="stop"):
        ef.predict(_interrupting(network, 40, RuntimeError("stop")), raw, tmp_path / "o.h5/pred", **settings,
                   **stopped)
    result = ef.predict(network, raw, tmp_path / "o.h5/pred", resume=True, **settings)
    assert 0 < result.computed < result.blocks
    np.testing.assert_array_equal(_read(tmp_path / "o.h5/pred"), _read(tmp_path / "reference.zarr/pred"))


def test_predicts_arguments_are_checked_before_anything_is_written(tmp_path, volume):
    """Found by a helper misusing the API: ``overwrite="no"`` (a str, so true) replaced the output and
    ``resume="no"`` resumed; ``progress="yes"`` failed at the first block, after the output and the lock were made
    and the model had run; ``tta=np.int64(8)`` failed writing the record; ``chunks`` and ``block`` as arrays
    raised NumPy's "truth value is ambiguous"; label ids (uint64) as input raised KeyError from the scaling."""
    calls = []

    def counted(batch):
        calls.append(len(batch))
        return crop(batch)

    out = tmp_path / "p.zarr/pred"
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT)
    for bad, message in [(dict(overwrite="no"), "overwrite must be True or False, got 'no'"),
                         (dict(resume="no"), "resume must be True or False, got 'no'"),
                         (dict(progress="yes"), "progress must be True, False or a callable taking a "
                                                "PredictProgress, got 'yes'"),
                         (dict(cuda_graphs="no"), "cuda_graphs must be True or False, got 'no'")]:
        with pytest.raises(TypeError, match=re.escape(message)):
            ef.predict(counted, volume, out, **settings, **bad)
    with pytest.raises(ValueError, match="compression must be one of .*, got False"):  # zstd was written
        ef.predict(counted, volume, out, **settings, compression=False)
    with pytest.raises(ef.InputDtypeError, match=r"input must be intensities, one of uint8, .*, not uint64 "
                                                 r"\(label ids\?\)"):
        ef.predict(counted, volume.astype(np.uint64), out, **settings)
    assert calls == [] and not (tmp_path / "p.zarr").exists()
    result = ef.predict(counted, volume, out, **settings, tta=np.int64(4), chunks=np.array([8, 16, 16]),
                        block=np.array([8, 16, 16]), overwrite=np.False_, progress=None)
    assert result.computed == result.blocks
    np.testing.assert_array_equal(_read(out), _read(_crop_reference(tmp_path, volume, settings)))
    # what a review found refused by the first version of these checks, and worked before: NumPy bools, progress
    # None, a whole float or False for tta (the config check takes them too), a torch.device
    ef.predict(counted, volume, out, **settings, tta=4.0, chunks=(8, 16, 16), block=(8, 16, 16), resume=np.True_)
    ef.predict(counted, volume, tmp_path / "q.zarr/pred", **settings, tta=False)
    torch = pytest.importorskip("torch")
    ef.predict(crop, volume, tmp_path / "t.zarr/pred", **settings, device=torch.device("cpu"))


def _crop_reference(tmp_path, volume, settings):
    path = tmp_path / "reference.zarr/pred"
    ef.predict(crop, volume, path, **settings, tta=4, chunks=(8, 16, 16), block=(8, 16, 16))
    return path


def test_a_device_that_is_no_torch_device_or_no_gpu_here_is_named(tmp_path, volume):
    """torch's own errors came through with no setting named ("Expected one of cpu, cuda, ipu, ..." for "gpu",
    "Cannot access accelerator device" for "cuda:9"), and device=[0] reached torch; the config's check already
    said it well, and now predict shares it. A bare index is a GPU's, as torch reads it."""
    torch = pytest.importorskip("torch")
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT)
    with pytest.raises(ValueError, match=r"device 'gpu' is not a torch device \('cpu', 'cuda', 'cuda:1'\)"):
        ef.predict(crop, volume, tmp_path / "a.zarr/p", device="gpu", **settings)
    with pytest.raises(TypeError, match=r"device must be a torch device \('cpu', 'cuda:0', torch.device\(...\)\) or a "
                                        r"transfer backend, got \[0\]"):
        ef.predict(crop, volume, tmp_path / "b.zarr/p", device=[0], **settings)
    wanted = torch.cuda.device_count() + 3
    for device in (f"cuda:{wanted}", wanted):
        with pytest.raises(ValueError, match=rf"device 'cuda:{wanted}': (no usable NVIDIA GPU here|this machine has)"):
            ef.predict(crop, volume, tmp_path / "c.zarr/p", device=device, **settings)
    assert not any(tmp_path.iterdir())  # refused before the output or its lock was made


def test_a_torch_module_fed_numpy_batches_is_told_to_pass_a_device(tmp_path, volume):
    """Without ``device``, a torch module got NumPy batches and torch's conv3d raised a TypeError naming neither
    the model nor the setting (found by a helper). The error stays the model's, with a note saying what to pass;
    a module that takes NumPy itself and fails for its own reasons gets no such note (a review)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from emfast.inference import model_blamed
    with pytest.raises(TypeError) as raised:
        ef.predict(torch.nn.Conv3d(1, 1, 3), volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN,
                   patch_out=(8, 18, 18))
    assert any("Conv3d is a torch module fed NumPy batches: give predict a device, 'cpu'" in note
               for note in raised.value.__notes__)
    assert model_blamed(raised.value) is not None  # the model's error, as the CLI reports it

    class OwnMistake(torch.nn.Module):
        def forward(self, batch):
            tensor = torch.as_tensor(batch)
            return torch.cat(tensor, tensor)  # its own TypeError
    with pytest.raises(TypeError) as raised:
        ef.predict(OwnMistake(), volume, tmp_path / "q.zarr/pred", patch_in=PATCH_IN, patch_out=(8, 18, 18))
    assert not any("device=" in note for note in getattr(raised.value, "__notes__", []))


def test_an_input_deleted_while_predict_reads_it_ends_in_input_changed_error(tmp_path, volume):
    """An HDF5 input deleted mid-run is still read through its open file, and the final check of its fingerprint
    raised FileNotFoundError ("cannot list ...: give the folder read permission") where callers catch
    InputChangedError (a helper's review)."""
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["raw"] = volume
    calls = [0]

    def deleting(batch):
        calls[0] += 1
        if calls[0] == 2:
            os.remove(tmp_path / "in.h5")
        return lopsided(batch)

    path = tmp_path / "p.zarr/pred"
    with pytest.raises(ef.InputChangedError, match=r"in.h5/raw changed while .*p.zarr/pred was written from it "
                                                   r"\(.*in.h5 no longer exists\)"):
        ef.predict(deleting, ef.open(tmp_path / "in.h5/raw", in_memory=False), path, **SETTINGS)
    with pytest.warns(ef.UnfinishedOutputWarning):
        ef.open(path).close()


@pytest.mark.parametrize("rewritten_at", [1, 3])
def test_an_input_rewritten_while_predict_reads_it_leaves_the_output_unfinished(tmp_path, volume, rewritten_at):
    """A lazy zarr input whose chunks another process rewrote mid-run (metadata untouched) gave an output that
    mixed both versions, recorded complete with the first version's fingerprint (found by a helper changing
    stores under running reads). The fingerprint is taken again before the output is recorded complete. Call 1
    is the probe of the model's channels, which read the input before the first fingerprint was taken (a
    review): a rewrite while it ran went unseen."""
    zarr = pytest.importorskip("zarr")
    data = volume
    array = zarr.create_array(str(tmp_path / "in.zarr"), shape=data.shape, chunks=(8, 16, 16), dtype=data.dtype)
    array[...] = data
    calls = [0]

    def rewriting(batch):
        calls[0] += 1
        if calls[0] == rewritten_at:  # as another process would: whole chunk files replaced
            array[...] = 255 - data
        return lopsided(batch)

    path = tmp_path / "p.zarr/pred"
    with pytest.raises(ef.InputChangedError, match=r"in.zarr.* changed while .*p.zarr/pred was written from it"):
        ef.predict(rewriting, ef.open(tmp_path / "in.zarr", in_memory=False), path, **SETTINGS)
    with pytest.warns(ef.UnfinishedOutputWarning):
        ef.open(path).close()
    with pytest.raises(OutputExistsError, match="changed"):  # a resume is refused: the input is another now
        ef.predict(lopsided, ef.open(tmp_path / "in.zarr", in_memory=False), path, resume=True, **SETTINGS)
    ef.predict(lopsided, ef.open(tmp_path / "in.zarr", in_memory=False), path, overwrite=True, **SETTINGS)


def test_an_input_whose_attributes_a_viewer_rewrites_meanwhile_is_not_called_changed(tmp_path, volume):
    """A viewer writing a zarr v2 input's .zattrs back unchanged mid-run ended the run in InputChangedError, its
    work lost (a review of the check taken again at the end): attributes are not the data."""
    zarr = pytest.importorskip("zarr")
    array = zarr.create_array(str(tmp_path / "in.zarr"), shape=volume.shape, chunks=(8, 16, 16),
                              dtype=volume.dtype, zarr_format=2)
    array[...] = volume
    array.attrs["note"] = "by a viewer"
    attributes = tmp_path / "in.zarr" / ".zattrs"
    calls = [0]

    def viewing(batch):
        calls[0] += 1
        if calls[0] == 3:
            time.sleep(0.01)  # a modification time of its own
            attributes.write_text(attributes.read_text())
        return lopsided(batch)

    ef.predict(viewing, ef.open(tmp_path / "in.zarr", in_memory=False), tmp_path / "p.zarr/pred", **SETTINGS)
