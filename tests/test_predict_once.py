"""emfast.predict computes each tile (and each test-time variant of it) once, whatever the chunks and blocks, and
still writes the same bytes as a whole-volume reference, across block sizes, engines and resumes; memory follows a
budget, not the input's chunks."""
import os
import threading
import time

import numpy as np
import pytest

import emfast as ef
from emfast.inference import TilePlan
from emfast.inference._tta import variants

from test_predict import PATCH_IN, PATCH_OUT, _read, _reference, lopsided

zarr = pytest.importorskip("zarr", reason="prediction outputs in these tests are zarr (pip install 'emfast[zarr]')")


class Counting:
    """``lopsided``, counting the tiles it is given, those all zero (the filling of a short batch: the volumes here
    have no zero tile) and which others (by their bytes) it saw twice; it fails on call ``fail_at``, if given."""

    def __init__(self, fail_at=None):
        self.tiles = self.calls = self.zero_tiles = 0
        self.seen = {}
        self.fail_at = fail_at

    def __call__(self, batch):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("model failed")
        self.tiles += len(batch)
        for tile in batch:
            if not tile.any():
                self.zero_tiles += 1
                continue
            key = tile.tobytes()
            self.seen[key] = self.seen.get(key, 0) + 1
        return lopsided(batch)

    @property
    def repeats(self):
        return sum(n - 1 for n in self.seen.values())


@pytest.fixture(scope="module")
def volume():
    rng = np.random.default_rng(11)
    return rng.integers(0, 256, (23, 41, 37), dtype=np.uint8)


def _plan_tiles(volume, overlap, blend, roi=None):
    return TilePlan(volume.shape, PATCH_IN, PATCH_OUT, overlap, (1, 1, 1), roi, crop=blend == "none").tile_count


@pytest.mark.parametrize("blend, overlap, tta, chunks, block", [
    ("gaussian", (2, 4, 4), 0, (4, 8, 8), (8, 8, 8)), ("none", (0, 0, 0), 4, (4, 8, 8), (4, 16, 8)),
    ("bump", (3, 4, 5), 4, (1, 41, 37), (1, 41, 37)), ("gaussian", (2, 4, 4), 4, (8, 8, 8), (8, 16, 8)),
    ("none", (0, 0, 0), 0, (1, 41, 37), (2, 41, 37))])
def test_each_tile_is_computed_once_and_matches_the_reference(tmp_path, volume, blend, overlap, tta, chunks,
                                                              block):
    model = Counting()
    result = ef.predict(model, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                        overlap=overlap, blend=blend, tta=tta, chunks=chunks, block=block, batch_size=3)
    count = len(variants(tta, PATCH_IN, PATCH_OUT))
    assert result.blocks > 1
    assert model.tiles - model.zero_tiles == _plan_tiles(volume, overlap, blend) * count == result.tiles_computed
    assert model.zero_tiles == result.tiles_padded
    assert model.repeats == 0
    expected = _reference(lopsided, volume, None, overlap, blend, tta, "reflect")
    np.testing.assert_allclose(_read(tmp_path / "p.zarr/pred"), expected, rtol=2e-6, atol=1e-7)


class Sizes(Counting):
    """``Counting``, recording the size of every batch."""

    def __init__(self, fail_at=None):
        super().__init__(fail_at)
        self.sizes = []

    def __call__(self, batch):
        self.sizes.append(len(batch))
        return super().__call__(batch)


@pytest.mark.parametrize("tta, chunks, block, batch_size", [(0, (6, 12, 12), (12, 24, 24), 3),
                                                           (4, (6, 12, 12), (6, 24, 24), 5)])
def test_batches_span_blocks_so_only_the_last_is_partial(tmp_path, volume, tta, chunks, block, batch_size):
    """A device computes a whole batch whatever it holds, and every call holds batch_size tiles: a block's last
    tiles fill their batch with the next block's first ones, so only the probe's batch and the last are filled
    with zero tiles (blocks whose tile counts are not multiples of the batch size), and the bytes are those of one
    block."""
    model = Sizes()
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, blend="none", overlap=(0, 0, 0), tta=tta, chunks=chunks,
                    batch_size=batch_size)
    result = ef.predict(model, volume, tmp_path / "p.zarr/pred", block=block, **settings)
    assert result.blocks > 4 and model.repeats == 0
    assert model.sizes == [batch_size] * len(model.sizes)
    assert model.zero_tiles == result.tiles_padded == batch_size - 1 + (-result.tiles_computed + 1) % batch_size
    ef.predict(lopsided, volume, tmp_path / "one.zarr/pred", block=(24, 48, 48), **settings)
    np.testing.assert_array_equal(_read(tmp_path / "p.zarr/pred"), _read(tmp_path / "one.zarr/pred"))


def _predict_in_a_thread(*args, **kwargs):
    """``ef.predict(*args, **kwargs)`` on a thread: what it raised, or fail the test if it has not returned in
    60 s (a blending left waiting for a batch never submitted)."""
    raised = []

    def run():
        try:
            ef.predict(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "predict hung"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("emfast-predict")]
    return raised


@pytest.mark.parametrize("where, seconds", [("model", 0), ("model", 0.01), ("reading", 0), ("submitting", 0)])
def test_a_failure_while_a_batch_spans_blocks_ends_the_run(tmp_path, volume, monkeypatch, where, seconds):
    """The model failing once a batch two blocks share is submitted (also a slow model, whose first failure is
    an earlier block's batch), or a block's input failing to read while the previous block's partial batch waits
    for it, or Ctrl-C while a shared batch is submitted: that error is raised (not a cancellation), no thread is
    left, nothing hangs."""
    from emfast.inference import _block, _local

    left, spanning = [], []

    class Watched(_block.Carry):
        def submit(self, shared, run_model):
            spanning.append(shared.count)
            if where == "submitting":
                def interrupted(*arguments):
                    raise KeyboardInterrupt

                return super().submit(shared, interrupted)
            return super().submit(shared, run_model)

        def abandon(self):
            left.append(len(self._unsubmitted))
            return super().abandon()

    def model(batch):
        time.sleep(seconds)
        if where == "model" and spanning:
            raise RuntimeError("model failed")
        return lopsided(batch)

    monkeypatch.setattr(_local, "Carry", Watched)
    if where == "reading":
        read, reads = _block.BlockPredictor.read, []

        def failing(self, block):
            reads.append(block)
            if len(reads) == 4:
                raise OSError("the disk went away")
            return read(self, block)

        monkeypatch.setattr(_block.BlockPredictor, "read", failing)
    raised = _predict_in_a_thread(model, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                                  blend="none", overlap=(0, 0, 0), chunks=(6, 12, 12), block=(12, 24, 24),
                                  batch_size=3)
    assert [type(error) for error in raised] == [{"model": RuntimeError, "reading": OSError,
                                                  "submitting": KeyboardInterrupt}[where]]
    if where == "reading":
        assert left[-1] == 1  # a block's partial batch was waiting for the block that failed to read


def test_the_same_bytes_whatever_the_block_size(tmp_path, volume):
    outputs = []
    for block in [(4, 16, 8), (24, 48, 40)]:
        path = tmp_path / f"b{block[0]}.zarr/pred"
        ef.predict(lopsided, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=(3, 4, 5), tta=4,
                   chunks=(4, 8, 8), block=block, batch_size=2)
        outputs.append(_read(path))
    for other in outputs[1:]:
        np.testing.assert_array_equal(other, outputs[0])


@pytest.mark.parametrize("blend, overlap, tta", [("gaussian", (3, 4, 5), 4), ("bump", (2, 5, 4), 0),
                                                 ("none", (0, 0, 0), 4)])
def test_the_same_bytes_whatever_the_threads_blending(tmp_path, volume, monkeypatch, blend, overlap, tta):
    """A machine of 8 or 16 cores blends a block's rows on 2 to 4 threads; each voxel still gets its tiles in the
    same order, so the bytes are those one thread writes (transposed test-time variants included)."""
    from emfast.inference import _block, _local

    threads = set()

    class Recording(_block.TileBlends):
        def run(self, *part):
            threads.add(threading.current_thread().name.rpartition("_")[0])
            return super().run(*part)

    monkeypatch.setattr(_block, "TileBlends", Recording)
    outputs = []
    for parts in (1, 2, 3, 4):
        monkeypatch.setattr(_local, "blend_parts", lambda: parts)
        path = tmp_path / f"parts{parts}.zarr/pred"
        ef.predict(lopsided, volume, path, patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=overlap, blend=blend,
                   tta=tta, chunks=(4, 8, 8), block=(8, 16, 16), batch_size=2)
        outputs.append(_read(path))
    assert threads == {"emfast-predict-blend", "emfast-predict-blend-rows"}
    for other in outputs[1:]:
        np.testing.assert_array_equal(other, outputs[0])


def test_the_profile_holds_the_seconds_in_model_calls(tmp_path, volume):
    """``Prediction.profile["model"]``: every call's time (the probe's too), within the prediction's own; no device
    stages without a device."""
    asleep = []

    def slow(batch):
        asleep.append(0.003)
        time.sleep(0.003)
        return lopsided(batch)

    result = ef.predict(slow, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                        chunks=(8, 8, 8), block=(8, 16, 16), batch_size=2)
    assert set(result.profile) == {"model"}
    assert sum(asleep) <= result.profile["model"] <= result.seconds


def _scratch(path):
    """The tile scratch folders beside the container of ``path``."""
    return sorted(p.name for p in path.parent.parent.iterdir() if p.name.endswith(".emfast-tiles"))


SETTINGS = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=(2, 4, 4), tta=4, chunks=(8, 8, 8),
                block=(8, 8, 8), batch_size=2)


def test_a_resume_uses_the_tiles_kept_and_writes_the_same_bytes(tmp_path, volume):
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **SETTINGS)
    path = tmp_path / "p.zarr/pred"
    first = Counting(fail_at=60)
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(first, volume, path, **SETTINGS)
    assert _scratch(path)  # tiles shared with blocks not yet written are kept for the resume
    model = Counting()
    ef.predict(model, volume, path, resume=True, **SETTINGS)
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "whole.zarr/pred"))
    # Only the tiles of the block that failed half way are computed twice, nothing a finished block kept.
    plan = TilePlan(volume.shape, PATCH_IN, PATCH_OUT, (2, 4, 4), (8, 8, 8), block=(8, 8, 8))
    most = max(len(block.tiles) for block in plan.blocks())
    assert model.repeats == 0 and first.tiles + model.tiles <= (plan.tile_count + most) * 4
    assert not _scratch(path)  # removed with the finished prediction


def test_a_run_killed_while_removing_the_kept_tiles_leaves_none_for_the_next(tmp_path, volume, monkeypatch):
    """Killed while deleting the kept tiles (their record file gone first, the tiles not yet): the folder was
    no longer known for emfast's, and every later run to that output was refused ("move it away")."""
    import shutil
    from pathlib import Path
    from emfast.io import _outputs

    rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):
        if not (Path(path) / "record.json").is_file():  # the output replaced, before the tiles
            return rmtree(path, *args, **kwargs)
        (Path(path) / "record.json").unlink()
        raise KeyboardInterrupt

    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(Counting(fail_at=60), volume, path, **SETTINGS)
    assert _scratch(path)
    monkeypatch.setattr(_outputs.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ef.predict(lopsided, volume, path, overwrite=True, **SETTINGS)
    monkeypatch.setattr(_outputs.shutil, "rmtree", rmtree)
    ef.predict(lopsided, volume, path, overwrite=True, **SETTINGS)
    assert [p.name for p in tmp_path.iterdir() if "lock" not in p.name] == ["p.zarr"]


def test_a_resume_under_another_model_name_still_uses_the_tiles_kept(tmp_path, volume):
    """The output accepts a resume whatever the model is called (its name is provenance), but the kept tiles were
    thrown away when it differed, and computed again."""
    class Renamed(Counting):
        pass

    path = tmp_path / "p.zarr/pred"
    first = Counting(fail_at=60)
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(first, volume, path, **SETTINGS)
    model = Renamed()
    ef.predict(model, volume, path, resume=True, **SETTINGS)
    # computed twice: a few batches in flight when the model failed (92 of 116 before, the kept ones thrown away)
    assert len(set(first.seen) & set(model.seen)) <= 4 * SETTINGS["batch_size"] * 4


def test_tiles_kept_by_another_prediction_are_never_used(tmp_path, volume):
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(Counting(fail_at=60), volume, path, **SETTINGS)
    assert _scratch(path)

    def doubled(batch):
        return lopsided(batch) * np.float32(2)

    ef.predict(doubled, volume, path, overwrite=True, **SETTINGS)
    expected = _reference(doubled, volume, None, (2, 4, 4), "gaussian", 4, "reflect")
    np.testing.assert_allclose(_read(path), expected, rtol=2e-6, atol=1e-7)


def test_a_resume_without_the_kept_tiles_computes_them_again(tmp_path, volume):
    import shutil
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **SETTINGS)
    path = tmp_path / "p.zarr/pred"
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(Counting(fail_at=60), volume, path, **SETTINGS)
    for name in _scratch(path):
        shutil.rmtree(tmp_path / name)
    ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    np.testing.assert_array_equal(_read(path), _read(tmp_path / "whole.zarr/pred"))


def _zarr_input(tmp_path, volume, chunks):
    path = tmp_path / f"in_{'_'.join(map(str, chunks))}.zarr"
    root = zarr.open_group(str(path), mode="w")
    root.create_array("raw", data=volume, chunks=chunks)
    return path / "raw"


def test_no_two_outputs_share_a_kept_tiles_folder():
    """'/' written as '.' gave ``s.zarr/h5/p`` and ``s.zarr.h5/p`` (two containers, two locks: two runs at once)
    one folder, which each removed and refilled under its own record."""
    from pathlib import Path
    from emfast.inference._cache import TileCache
    outputs = [("s.zarr", "h5/p"), ("s.zarr.h5", "p"), ("s.zarr", "a/b"), ("s.zarr", "a.b"), ("s.zarr", "a%2Fb"),
               ("s+x.zarr", "p"), ("s.zarr", "x+p"), ("d/s.zarr", "p")]
    outputs += [("s.zarr", "予測" * 15), ("s.zarr", "a" * 300), ("s.zarr", "a" * 299 + "b")]  # a review: too long
    folders = [TileCache.beside(Path(container), dataset).folder for container, dataset in outputs]
    assert len(set(folders)) == len(outputs)
    assert all(f.name.startswith(".") and f.name.endswith(".emfast-tiles") and f.parent == Path(c).parent
               and len(os.fsencode(f.name)) <= 255 for f, (c, _) in zip(folders, outputs))


def test_a_long_non_ascii_dataset_name_predicts_and_an_earlier_versions_tiles_folder_is_removed(tmp_path, volume):
    """Percent-encoding made a 30-character CJK dataset name's tiles folder longer than a file name may be
    (ENAMETOOLONG on every multi-block run); a folder of tiles an earlier version kept for the output, under its
    old name, was left for ever; one of that name that emfast did not make stays."""
    import json
    dataset = "予測" * 15
    legacy = tmp_path / f".p.zarr.{dataset}.emfast-tiles"
    legacy.mkdir()
    (legacy / "record.json").write_text(json.dumps({"an": "earlier run"}))
    ef.predict(lopsided, volume, tmp_path / "p.zarr" / dataset, **SETTINGS)
    assert not legacy.exists() and _scratch(tmp_path / "p.zarr" / dataset) == []
    theirs = tmp_path / ".q.zarr.pred.emfast-tiles"
    theirs.mkdir()
    ef.predict(lopsided, volume, tmp_path / "q.zarr/pred", **SETTINGS)
    assert theirs.is_dir()


def test_output_chunks_and_blocks_do_not_follow_the_input_chunks(tmp_path, volume):
    results = []
    for chunks in [(1, 41, 37), (8, 8, 8)]:
        source = _zarr_input(tmp_path, volume, chunks)
        out = tmp_path / f"p{chunks[0]}.zarr/pred"
        result = ef.predict(lopsided, source, out, patch_in=PATCH_IN, patch_out=PATCH_OUT, memory="64MiB")
        results.append((zarr.open_array(str(out.parent), path="pred", mode="r").chunks, result.blocks))
    assert results[0] == results[1]
    np.testing.assert_array_equal(_read(tmp_path / "p1.zarr/pred"), _read(tmp_path / "p8.zarr/pred"))


def test_memory_is_checked_and_named(tmp_path, volume):
    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, chunks=(8, 16, 16))
    for value in ["lots", -5, "12 parsecs", True]:
        with pytest.raises(ValueError, match=f"memory must be a positive number of bytes .*got {value!r}"):
            ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", memory=value, **settings)
    with pytest.raises(ValueError, match=r"memory=100000 bytes is too small for a block of one output chunk "
                                         r"\(8, 16, 16\) \(about [0-9]+ bytes .*smaller chunks"):
        ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", memory=100_000, **settings)
    assert not (tmp_path / "p.zarr").exists()


RSS_SCRIPT = """
import resource, sys
import numpy as np
import emfast as ef
def identity(batch):
    return batch[:, :, 4:-4, 8:-8, 8:-8]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ef.predict(identity, sys.argv[1], sys.argv[2], patch_in=(24, 144, 144), patch_out=(16, 128, 128), blend="none",
           memory="192MiB")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_peak_memory_follows_the_budget_not_the_input_chunks(tmp_path):
    """A volume chunked per section (as many EM stacks are) used to give blocks of whole sections: here 24 MiB of
    uint8 took ~400 MiB more; now either chunking stays within the budget, and about the same."""
    import subprocess
    import sys

    data = np.random.default_rng(3).integers(0, 256, (48, 512, 512), dtype=np.uint8)
    peaks = {}
    for chunks in [(1, 512, 512), (64, 64, 64)]:
        source = _zarr_input(tmp_path, data, chunks)
        run = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(source), str(tmp_path / f"o{chunks[0]}.zarr/p")],
                             capture_output=True, text=True, check=True)
        peaks[chunks[0]] = int(run.stdout.split()[-1]) * 1024  # ru_maxrss is in KiB on Linux
    assert max(peaks.values()) < 192 * 2 ** 20, peaks
    assert peaks[1] <= 1.2 * peaks[64] + 16 * 2 ** 20, peaks  # 16 MiB: the allocator's noise on small peaks


def test_the_next_batch_is_ready_while_the_model_runs(tmp_path, volume, monkeypatch):
    """Each model call (after the probe's) waits (up to 5 s) for the batch after it to be gathered: a pipeline
    where reading, batching and blending wait for the model passes at once; one where the model waits for them
    never does."""
    import threading

    from emfast.inference import _block

    gathered = [0]
    changed = threading.Condition()
    original = _block.gather_convert

    def counting(*args):
        result = original(*args)
        with changed:
            gathered[0] += 1
            changed.notify_all()
        return result

    monkeypatch.setattr(_block, "gather_convert", counting)
    waits, calls = [], [0]
    large = np.random.default_rng(5).integers(0, 256, (24, 96, 96), dtype=np.uint8)
    total = _plan_tiles(large, (0, 0, 0), "none") - 1  # the probe's tile is computed before

    def model(batch):
        calls[0] += 1
        if calls[0] > 1 and all(waits):  # after the probe; after one wait timed out, the test failed
            with changed:
                waits.append(changed.wait_for(lambda: gathered[0] > calls[0] or calls[0] == total + 1, timeout=5))
        return lopsided(batch)

    ef.predict(model, large, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, blend="none",
               chunks=(12, 48, 48), block=(12, 48, 48))
    assert len(waits) == total and all(waits)


def test_predictions_are_blended_on_the_finisher_thread_not_the_feeding_one(tmp_path, volume, monkeypatch):
    """The calling thread only gathers batches for the model (at the caller's CPU priority); every tile is blended
    on the finisher thread (at a lower one), and the result is the same as blending on one thread."""
    import threading

    from emfast.inference import _block

    threads = set()

    class Recording(_block.TileBlends):
        def run(self, *part):
            threads.add(threading.current_thread().name.rsplit("_", 1)[0])
            return super().run(*part)

    monkeypatch.setattr(_block, "TileBlends", Recording)
    settings = dict(SETTINGS, tta=4, block=(8, 16, 16))
    ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", **settings)
    assert threads == {"emfast-predict-blend"}
    expected = _reference(lopsided, volume, None, settings["overlap"], "gaussian", 4, "reflect")
    np.testing.assert_allclose(_read(tmp_path / "p.zarr/pred"), expected, rtol=2e-6, atol=1e-7)


def _kept_on_disk(tmp_path, volume, memory):
    """Predict with small blocks and ``memory``: (the counting model, the kept tiles on disk at each model call,
    the Prediction)."""
    on_disk = []
    counting = Counting()

    def model(batch):
        on_disk.append(len(list(tmp_path.glob(".p.zarr+pred.emfast-tiles/*.npy"))))
        return counting(batch)

    result = ef.predict(model, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT,
                        overlap=(2, 4, 4), tta=4, chunks=(4, 8, 8), block=(4, 8, 8), memory=memory)
    return counting, on_disk, result


def test_shared_tiles_beyond_the_memory_share_go_to_disk_and_back(tmp_path, volume):
    """With a small budget most shared tiles cannot stay in memory: they are written beside the output, read by
    the blocks that share them, and still computed once."""
    counting, on_disk, result = _kept_on_disk(tmp_path, volume, "1MiB")
    assert max(on_disk) > 10 and not _scratch(tmp_path / "p.zarr/pred")
    assert counting.tiles == result.tiles * 4 and counting.repeats == 0
    expected = _reference(lopsided, volume, None, (2, 4, 4), "gaussian", 4, "reflect")
    np.testing.assert_allclose(_read(tmp_path / "p.zarr/pred"), expected, rtol=2e-6, atol=1e-7)


def test_a_config_takes_memory_and_names_a_bad_one(tmp_path):
    from emfast.config import ConfigError, load_predict_config

    from test_predict import _predict_config

    body = """
        predict:
          model: nets:load
          input: in.h5/raw
          output: out.zarr/pred
          patch_in: [10, 20, 20]
          memory: 512MiB
        """
    assert load_predict_config(_predict_config(tmp_path, body)).options["memory"] == 512 * 2 ** 20
    with pytest.raises(ConfigError, match=r"line 7: predict\.memory: memory must be a positive number of bytes .*"
                                          r"got '512 apples'"):
        load_predict_config(_predict_config(tmp_path, body.replace("512MiB", "512 apples")))


def test_the_memory_of_discarded_shared_tiles_is_reused_with_the_same_bytes(tmp_path, volume, monkeypatch):
    """A shared tile discarded (every block sharing it is done) lends its memory to the next tile kept: fewer
    allocations than tiles kept, and the same bytes as the whole-volume reference."""
    from emfast.inference import _block

    kept, fresh = [], []
    take = _block._Pool.take

    def counting_take(self, name, shape, dtype):
        array = take(self, name, shape, dtype)
        if name == _block.KEPT:
            root = array
            while isinstance(root.base, np.ndarray):
                root = root.base
            kept.append(id(root))
            if all(root is not other for other in fresh):
                fresh.append(root)
        return array

    monkeypatch.setattr(_block._Pool, "take", counting_take)
    settings = dict(SETTINGS, tta=0, block=(8, 8, 8))
    ef.predict(lopsided, volume, tmp_path / "p.zarr/pred", **settings)
    assert len(kept) > 2 * len(fresh) > 0
    expected = _reference(lopsided, volume, None, settings["overlap"], "gaussian", 0, "reflect")
    np.testing.assert_allclose(_read(tmp_path / "p.zarr/pred"), expected, rtol=2e-6, atol=1e-7)


def _slab_of(array: np.ndarray) -> np.ndarray:
    """The allocation under an array of a pool (through the memoryview its slab's arrays view it by)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base.obj if isinstance(array.base, memoryview) else array


def test_arrays_cut_from_one_slab_never_share_memory_and_free_it_together():
    """Fresh arrays of a pool are cut from larger slabs (huge pages): whatever is taken and given back in any
    order, two arrays held at once never overlap, an array given back is reused alone (not its whole slab), and
    the slab is freed once none of its arrays is left."""
    import gc
    import weakref

    from emfast.inference import _block

    pool = _block._Pool()
    shape = (1, 16, 128, 128)  # 1 MiB: a slab holds SLAB_ARRAYS of them
    held = [pool.take(_block.KEPT, shape, np.float32) for _ in range(_block.SLAB_ARRAYS)]
    slab = weakref.ref(_slab_of(held[0]))
    assert all(_slab_of(array) is slab() for array in held)
    for number, array in enumerate(held):
        array[...] = number
    for array in held[::2]:
        pool.give(_block.KEPT, array)
    again = [pool.take(_block.KEPT, (1, 8, 128, 128), np.float32) for _ in held[::2]]
    assert all(_slab_of(array) is slab() for array in again)  # the arrays given back, not new ones
    held = held[1::2] + again
    for first in range(len(held)):
        assert not any(np.shares_memory(held[first], other) for other in held[first + 1:])
    assert [int(array.max()) for array in held[:len(again)]] == list(range(1, _block.SLAB_ARRAYS, 2))
    del held, again, array
    pool = None
    gc.collect()
    assert slab() is None


def test_a_shared_tile_written_to_disk_lends_its_memory_to_the_next_one(tmp_path, monkeypatch):
    """A kept tile beyond the memory share goes to the folder, and its array back to the pool: the next tile kept
    is copied into it. Dropped instead, a slab's array stayed resident beside its siblings, each never reused (a
    helper measured 8x the kept tiles' share). The bytes equal a run that keeps every tile in memory."""
    from emfast.inference import _block, _cache

    taken, written = set(), []
    take, write = _block._Pool.take, _cache.TileCache._write

    def noting_take(self, name, shape, dtype):
        array = take(self, name, shape, dtype)
        if name == _block.KEPT:
            taken.add(array.__array_interface__["data"][0])
        return array

    def noting_write(self, key, predictions):
        written.append(key)
        write(self, key, predictions)

    def model(batch):  # two channels: kept tiles of 2 MiB (4 variants), cut from slabs
        crop = batch[:, :, 2:-2, 4:-4, 4:-4]
        return np.concatenate([crop, crop * crop], axis=1)

    data = np.random.default_rng(0).integers(0, 256, (48, 192, 192), dtype=np.uint8)
    settings = dict(patch_in=(20, 72, 72), patch_out=(16, 64, 64), overlap=(4, 16, 16), tta=4, chunks=(16, 64, 64),
                    block=(16, 64, 64), batch_size=4)
    ef.predict(model, data, tmp_path / "memory.zarr/p", memory="1GiB", **settings)
    monkeypatch.setattr(_block._Pool, "take", noting_take)
    monkeypatch.setattr(_cache.TileCache, "_write", noting_write)
    ef.predict(model, data, tmp_path / "disk.zarr/p", memory="48MiB", **settings)
    assert len(written) > 20 and len(taken) < len(written) / 2
    np.testing.assert_array_equal(_read(tmp_path / "disk.zarr/p"), _read(tmp_path / "memory.zarr/p"))


def test_shared_tiles_stay_in_memory_while_the_blocks_leave_room(tmp_path, volume):
    """Kept tiles get the budget the blocks do not use, not only their eighth: here they need more than an eighth
    of 6 MiB and far less than the blocks leave, so none goes to disk (each disk write and read back is the
    blender's, one after another)."""
    counting, on_disk, result = _kept_on_disk(tmp_path, volume, "6MiB")
    assert max(on_disk) == 0
    assert counting.tiles == result.tiles * 4 and counting.repeats == 0


def test_the_model_has_its_next_batches_while_kept_tiles_wait_to_be_blended(tmp_path, volume, monkeypatch):
    """While the model computes a batch, the feeding thread has gathered the next ones (BATCHES_AHEAD queued and
    one more), also where groups of kept tiles, which hold no batch, are queued between them: counting those
    groups left the model waiting for its next batch on a GPU. Each call here waits for the feeding thread to get
    that far, and notes when it did not within half a second."""
    import threading

    from emfast.inference import _block

    gathered = []
    progress = threading.Condition()
    gather = _block.BlockPredictor.gather

    def counting_gather(self, *args):
        shape = gather(self, *args)
        with progress:
            gathered.append(len(args[2]))
            progress.notify_all()
        return shape

    monkeypatch.setattr(_block.BlockPredictor, "gather", counting_gather)
    calls, waited = [0], []

    def model(batch):
        calls[0] += 1
        with progress:
            if not progress.wait_for(lambda: len(gathered) > calls[0] + _block.BATCHES_AHEAD, timeout=0.5):
                waited.append(calls[0])
        return lopsided(batch)

    ef.predict(model, volume, tmp_path / "p.zarr/pred", patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=(2, 4, 4),
               chunks=(4, 8, 8), block=(16, 24, 24), batch_size=1, channels=2)
    # only the last calls may wait: no batches are left to gather after them
    assert [call for call in waited if call + _block.BATCHES_AHEAD < len(gathered)] == []
    assert len(waited) <= _block.BATCHES_AHEAD + 1


def test_a_resume_naming_the_input_otherwise_still_uses_the_tiles_kept(tmp_path, volume, monkeypatch):
    """in.zarr/raw, then its absolute path: the output accepted the resume, the kept tiles were thrown away."""
    zarr = pytest.importorskip("zarr")
    zarr.create_array(str(tmp_path / "in.zarr"), shape=volume.shape, chunks=(8, 16, 16), dtype=volume.dtype)[...] = \
        volume
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "p.zarr/pred"
    first = Counting(fail_at=60)
    with pytest.raises(RuntimeError, match="model failed"):
        ef.predict(first, "in.zarr", path, **SETTINGS)
    model = Counting()
    ef.predict(model, str(tmp_path / "in.zarr"), path, resume=True, **SETTINGS)
    assert len(set(first.seen) & set(model.seen)) <= 4 * SETTINGS["batch_size"] * 4


def test_a_run_killed_while_making_its_tiles_folder_does_not_block_the_next(tmp_path, volume, monkeypatch):
    """A kill between making the kept-tiles folder and writing its record left an empty folder that every later
    run refused as "not made by emfast predict" (found by a helper killing runs at each step). The folder is now
    made whole and renamed into place, and an empty one, as older versions left, is removed."""
    from pathlib import Path
    reference = ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **SETTINGS)
    expected = zarr.open_array(str(tmp_path / "whole.zarr"), path="pred", mode="r")[...]
    path = tmp_path / "p.zarr/pred"
    write_text = Path.write_text

    def killed(self, *args, **kwargs):
        if self.name == "record.json":
            raise KeyboardInterrupt  # where a kill would stop the run
        return write_text(self, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        ef.predict(lopsided, volume, path, **SETTINGS)
    monkeypatch.undo()
    result = ef.predict(lopsided, volume, path, resume=True, **SETTINGS)
    assert result.blocks == reference.blocks
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "p.zarr"), path="pred", mode="r")[...], expected)
    assert _scratch(path) == [] and not [p for p in tmp_path.iterdir() if "emfast-removing" in p.name]
    (tmp_path / ".p.zarr+pred.emfast-tiles").mkdir()  # as a kill left it before
    ef.predict(lopsided, volume, path, overwrite=True, **SETTINGS)
    assert _scratch(path) == []


def test_an_earlier_versions_tiles_name_that_is_another_outputs_folder_is_left_alone(tmp_path):
    """The tiles folder of output (a.zarr, dataset s.zarr.x) is named as an earlier version named that of output
    (a.zarr+s.zarr, x): opening the second output's cache deleted the first run's live folder (a review; the
    two outputs have different locks, so both can run at once)."""
    from emfast.inference._cache import TileCache
    first = TileCache.beside(tmp_path / "a.zarr", "s.zarr.x")
    first.open({"run": 1}, resume=False)
    first.save((0, 0, 0), np.zeros((1, 1, 2, 2, 2), np.float32))
    first.spill()
    second = TileCache.beside(tmp_path / "a.zarr+s.zarr", "x")
    assert second.legacy is None or second.legacy != first.folder
    second.open({"run": 2}, resume=False)
    assert first.folder.is_dir() and first.has((0, 0, 0))
    second.remove()
    first.remove()


def test_a_model_with_a_fixed_batch_size_gets_it_on_every_call(tmp_path, volume):
    """Networks exported with a fixed batch dimension (ONNX, TensorRT engines) refuse a batch of another length:
    the probe's call and the run's last used to hold fewer tiles."""
    def fixed(batch):
        if len(batch) != 4:
            raise ValueError(f"this network takes 4 tiles, got {len(batch)}")
        return lopsided(batch)

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, tta=4, chunks=(8, 16, 16))
    result = ef.predict(fixed, volume, tmp_path / "fixed.zarr/pred", batch_size=4, **settings)
    ef.predict(lopsided, volume, tmp_path / "one.zarr/pred", **settings)
    assert result.tiles_padded > 0
    np.testing.assert_array_equal(_read(tmp_path / "fixed.zarr/pred"), _read(tmp_path / "one.zarr/pred"))


def test_kept_tiles_that_cannot_be_loaded_are_computed_again_in_whole_batches(tmp_path, volume, monkeypatch):
    """A kept tile missing from its folder (a full disk) is computed again, every variant: one call per variant
    filled each call with zero tiles (a review: 15119 zero tiles against 5376 real ones at batch_size 5, tta 16)."""
    from emfast.inference._cache import TileCache

    settings = dict(patch_in=PATCH_IN, patch_out=PATCH_OUT, overlap=(2, 4, 4), tta=4, chunks=(4, 8, 8),
                    block=(8, 8, 8), batch_size=4)
    ef.predict(lopsided, volume, tmp_path / "whole.zarr/pred", **settings)
    monkeypatch.setattr(TileCache, "load", lambda self, key: None)
    model = Sizes()
    result = ef.predict(model, volume, tmp_path / "lost.zarr/pred", **settings)
    assert result.tiles_computed > _plan_tiles(volume, (2, 4, 4), "gaussian") * 4  # kept tiles computed again
    assert model.sizes == [4] * len(model.sizes) and result.tiles_padded == model.zero_tiles < 2 * 4
    np.testing.assert_array_equal(_read(tmp_path / "lost.zarr/pred"), _read(tmp_path / "whole.zarr/pred"))
