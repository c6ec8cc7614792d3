"""Snapshots (loader.snapshot, emfast snapshot) and the epoch progress bar."""
import itertools
import zlib

import numpy as np
import pytest
import zarr

import emfast as ef
from emfast.cli import main
from emfast.config import load_config
from emfast.pipeline._snapshot import montage, render

VOXEL = (40.0, 8.0, 4.0)
#: Transposes and rotations of y with x are refused on voxels of two sizes there; mirrors are not.
MIRRORS = ("mirror",)
OFFSET = (400.0, 80.0, 120.0)
PATCH_IN, PATCH_OUT = (6, 20, 24), (4, 16, 16)


@pytest.fixture
def volumes(rng):
    raw = rng.integers(0, 256, (20, 60, 70), dtype=np.uint8)
    labels = rng.integers(-3, 4, (20, 60, 70)).astype(np.int32)  # negative ids too, as signed labels may hold
    return (ef.Volume.from_array(raw, name="raw", resolution=VOXEL, offset=OFFSET),
            ef.Volume.from_array(labels, name="labels", resolution=VOXEL, offset=OFFSET), raw, labels)


def images(path):
    """(group path, OME metadata, data) of every OME-NGFF image ome-zarr-py finds in the store."""
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    found = {}
    for group in sorted(zarr.open_group(str(path), mode="r").members(max_depth=None)):
        name, node = group
        if isinstance(node, zarr.Group) and "multiscales" in node.attrs:
            nodes = [n for n in Reader(parse_url(str(path / name)))() if n.load(Multiscales)]
            found[name] = (nodes[0].metadata, np.asarray(nodes[0].data[0]))
    return found


def test_snapshot_layers_sit_at_their_windows_world_boxes(tmp_path, volumes):
    raw_volume, label_volume, raw, labels = volumes
    loader = ef.Loader(raw_volume, label_volume, patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=3, augment=(),
                       targets=[ef.Affinities()], seed=4)
    with loader:
        loader.snapshot(tmp_path / "snap.zarr", batches=2)
    found = images(tmp_path / "snap.zarr")
    for batch in range(2):
        for n in range(3):
            group = f"batch_{batch:04d}/example_{n:02d}"
            assert {name.rsplit("/", 1)[1] for name in found if name.startswith(group + "/")} == {
                "raw", "labels", "affinities", "affinities_mask"}
            for field, source, expected_shape in (("raw", raw, PATCH_IN), ("labels", labels, None)):
                metadata, data = found[f"{group}/{field}"]
                scale, translation = metadata["coordinateTransformations"][0]
                assert scale["scale"] == list(VOXEL)
                corner = (np.asarray(translation["translation"]) - OFFSET) / VOXEL
                assert np.array_equal(corner, corner.round())
                box = tuple(slice(int(c), int(c) + s) for c, s in zip(corner, data.shape))
                if field == "raw":
                    assert data.shape == expected_shape
                    np.testing.assert_array_equal(data, source[box].astype(np.float32) * np.float32(1 / 255))
                else:
                    np.testing.assert_array_equal(data, source[box])
            # every layer of one example is centred on the same output window
            centres = set()
            for field in ("raw", "labels", "affinities", "affinities_mask"):
                metadata, data = found[f"{group}/{field}"]
                translation = np.asarray(metadata["coordinateTransformations"][0][1]["translation"])[-3:]
                centres.add(tuple(translation + np.asarray(data.shape[-3:]) * VOXEL / 2))
            assert len(centres) == 1
    # the arrays carry funlib's attributes too
    stored = zarr.open_array(str(tmp_path / "snap.zarr/batch_0000/example_00/raw/s0"), mode="r")
    assert stored.attrs["voxel_size"] == list(VOXEL)


def test_snapshot_refuses_an_existing_path_and_bad_batches(tmp_path, volumes):
    raw_volume = volumes[0]
    (tmp_path / "there.zarr").mkdir()
    (tmp_path / "there.zarr" / "keep.txt").write_text("mine")
    with ef.Loader(raw_volume, patch=(4, 16, 16), batch_size=1, augment=MIRRORS) as loader:
        with pytest.raises(FileExistsError, match="there.zarr"):
            loader.snapshot(tmp_path / "there.zarr")
        with pytest.raises(ValueError, match="batches must be an integer >= 1"):
            loader.snapshot(tmp_path / "new.zarr", batches=0)
        # a missing folder for the montage is found before the store is written (it was found after, and the
        # store left behind refused the next try)
        with pytest.raises(FileNotFoundError, match="the folder of png='.*no_folder/m.png' does not exist"):
            loader.snapshot(tmp_path / "new.zarr", png=tmp_path / "no_folder" / "m.png")
        assert not (tmp_path / "new.zarr").exists()
    assert (tmp_path / "there.zarr" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("name", ["snap.h5", "snap.HDF5", "snap.n5"])
def test_snapshot_refuses_a_path_named_as_another_format(tmp_path, volumes, name):
    """snap.h5 was written as a zarr folder named .h5, which every reader then took for a missing HDF5 file."""
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=MIRRORS) as loader:
        with pytest.raises(ValueError, match=rf"{name} ends as .* containers do .* give a path ending in \.zarr"):
            loader.snapshot(tmp_path / name)
        loader.snapshot(tmp_path / "snap")  # no suffix: a zarr store, as before
    assert not (tmp_path / name).exists() and (tmp_path / "snap" / ".zgroup").is_file()


def test_a_snapshot_claims_its_path_so_a_second_writer_is_refused_untouched(tmp_path, volumes, monkeypatch):
    """Two ranks snapshotting to one path both passed the check that it did not exist and mixed their batches
    into one store, which one of them reported written (a helper's); the folder is now claimed at once. A
    snapshot that fails half way is removed: half a snapshot is none."""
    import pathlib

    other = tmp_path / "snap.zarr"
    other.mkdir()
    (other / ".zgroup").write_text('{"zarr_format": 2}')  # the other rank's, made after this one looked
    real_exists = pathlib.Path.exists
    monkeypatch.setattr(pathlib.Path, "exists", lambda self: False if self == other else real_exists(self))
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=MIRRORS) as loader:
        with pytest.raises(FileExistsError, match="snap.zarr exists; a snapshot never replaces"):
            loader.snapshot(other)
        assert sorted(p.name for p in other.iterdir()) == [".zgroup"]
        monkeypatch.undo()

        def broken(*args, **kwargs):
            raise OSError("disk gone")

        monkeypatch.setattr(type(loader), "next_batch", broken)
        with pytest.raises(OSError, match="disk gone"):
            loader.snapshot(tmp_path / "half.zarr")
    assert not (tmp_path / "half.zarr").exists()


def decode_png(path):
    """Width, height and RGB pixels of an 8-bit RGB PNG without interlacing, filters decoded (all five)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, idat = 8, b""
    while position < len(data):
        length = int.from_bytes(data[position:position + 4], "big")
        kind, body = data[position + 4:position + 8], data[position + 8:position + 8 + length]
        assert zlib.crc32(kind + body) == int.from_bytes(data[position + 8 + length:position + 12 + length], "big")
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            assert body[8:10] == bytes([8, 2])
        elif kind == b"IDAT":
            idat += body
        position += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + 3 * width)
    assert (rows[:, 0] == 0).all()  # our writer uses no filter
    return width, height, rows[:, 1:].reshape(height, width, 3)


def test_png_montage_has_a_cell_per_example_and_field_and_a_colour_per_label(tmp_path, volumes):
    raw_volume, label_volume = volumes[:2]
    with ef.Loader(raw_volume, label_volume, patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=2, augment=(),
                   targets=[ef.Affinities()]) as loader:
        loader.snapshot(tmp_path / "snap.zarr", png=tmp_path / "montage.png")
    width, height, pixels = decode_png(tmp_path / "montage.png")
    cell_h, cell_w, gap = PATCH_IN[1], PATCH_IN[2], 4  # raw (with context) is the largest section
    assert (height, width) == (2 * cell_h + gap, 4 * cell_w + 3 * gap)
    from PIL import Image  # an independent decoder (Pillow comes with matplotlib)
    with Image.open(tmp_path / "montage.png") as image:
        assert image.size == (width, height) and np.array_equal(np.asarray(image.convert("RGB")), pixels)
    labels = np.array([[[[0, 1, 2, -3, 2**31 - 1]]]], np.int32)  # (c, z, y, x)
    colours = render(labels)[0]
    assert (colours[0] == 0).all()  # background black
    assert len({tuple(c) for c in colours}) == 5  # every id its own colour
    assert np.array_equal(render(labels)[0, 2], render(np.array([[[[2]]]], np.int32))[0, 0])  # stable per id


FULL = """
import resource, sys
import numpy as np
import emfast as ef
import emfast.pipeline._snapshot as snapshot
where, png, size, limit = sys.argv[1:]
raw = ef.Volume.from_array(np.random.default_rng(0).integers(0, 256, (20, 60, 70), dtype=np.uint8))
if size == "big":  # a PNG of about 3 MiB that no zlib shrinks, beyond the limit; the store's files within it
    snapshot.montage = lambda arrays: np.random.default_rng(1).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
with ef.Loader(raw, patch=(4, 32, 32), batch_size=2, augment=()) as loader:
    try:
        loader.snapshot(where, png=png)
    except OSError as error:
        print(type(error).__name__, error)
"""


@pytest.mark.parametrize("what", ["png", "store"])
def test_a_snapshot_that_cannot_be_written_names_the_file_and_leaves_nothing(tmp_path, what):
    """A full disk (here a file-size limit, EFBIG) raised "[Errno 28] No space left on device", naming nothing,
    and left the PNG cut short, which refused every retry as existing (a review)."""
    import os
    import subprocess
    import sys
    store, png = tmp_path / "s.zarr", tmp_path / "m.png"
    script = tmp_path / "full.py"
    script.write_text(FULL)
    limit = 1 << 20 if what == "png" else 256
    done = subprocess.run([sys.executable, str(script), str(store), str(png), "big" if what == "png" else "small",
                           str(limit)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr[-2000:]
    culprit = f"cannot write png={str(png)!r}" if what == "png" else f"cannot write {store}"
    assert done.stdout.startswith("OSError [Errno 27] snapshot: " + culprit), done.stdout
    assert not store.exists() and not png.exists()


def test_a_failed_snapshot_waits_for_its_own_writes_in_flight_and_for_no_others(tmp_path, monkeypatch):
    """zarr writes an array's metadata files together and raised at the first failure while the others ran on:
    they landed after the snapshot had removed its store (a CI run under load). Waiting for every task on zarr's
    event loop instead waited for other volumes' remote reads too (10 s, a second review)."""
    import asyncio
    import errno
    import time

    from zarr.core.sync import _get_loop
    from zarr.storage import _local

    real_put = _local._put
    failed = []

    def slow_or_full(path, value, exclusive=False):
        if path.name == ".zattrs" and "example_00" in str(path):
            time.sleep(0.3)  # the sibling still running when the first write fails
        elif path.name == ".zarray" and not failed:
            failed.append(path)
            raise OSError(errno.EFBIG, "File too large")
        return real_put(path, value, exclusive=exclusive)

    monkeypatch.setattr(_local, "_put", slow_or_full)
    unrelated = asyncio.run_coroutine_threadsafe(asyncio.sleep(60), _get_loop())  # another volume's remote read
    raw = np.random.default_rng(0).integers(0, 256, (8, 40, 40), dtype=np.uint8)
    try:
        with ef.Loader(raw, patch=(4, 16, 16), batch_size=2, augment=()) as loader:
            with pytest.raises(OSError, match=r"snapshot: cannot write .*s.zarr: File too large"):
                loader.snapshot(tmp_path / "s.zarr")
        assert failed and not unrelated.done()
        time.sleep(0.5)  # a write the snapshot had not waited for lands by now
        assert not (tmp_path / "s.zarr").exists()
    finally:
        unrelated.cancel()


def test_an_interrupted_wait_still_removes_the_failed_snapshot(tmp_path, monkeypatch):
    from emfast.pipeline import _snapshot

    def interrupted(store, path):
        real_remove(_Interrupting(), path)

    class _Interrupting:
        def settle(self):
            raise KeyboardInterrupt  # a second Ctrl-C while the writes in flight are waited for

    real_remove = _snapshot._remove
    monkeypatch.setattr(_snapshot, "_remove", interrupted)
    raw = np.random.default_rng(0).integers(0, 256, (8, 40, 40), dtype=np.uint8)
    with ef.Loader(raw, patch=(4, 16, 16), batch_size=2, augment=()) as loader:
        monkeypatch.setattr(loader, "next_batch", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            loader.snapshot(tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()


def test_a_png_path_that_is_a_dangling_link_is_refused_as_existing(tmp_path, volumes):
    """open(..., "xb") refuses a dangling link: the error was wrapped again as the store's, errno None."""
    (tmp_path / "m.png").symlink_to(tmp_path / "nowhere.png")
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=()) as loader:
        with pytest.raises(FileExistsError, match=r"m\.png exists; a snapshot never replaces"):
            loader.snapshot(tmp_path / "s.zarr", png=tmp_path / "m.png")
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "nowhere.png").exists()


def test_render_shows_affinities_as_rgb_and_raw_in_grey():
    affinities = np.zeros((3, 1, 2, 2), np.float32)
    affinities[0, 0, 0, 0] = affinities[1, 0, 0, 1] = affinities[2, 0, 1, 0] = 1
    picture = render(affinities)
    assert picture[0, 0].tolist() == [255, 0, 0] and picture[0, 1].tolist() == [0, 255, 0]
    assert picture[1, 0].tolist() == [0, 0, 255] and picture[1, 1].tolist() == [0, 0, 0]
    raw = np.array([[[[0.0, 0.5, 1.0]]]], np.float32)
    assert render(raw)[0].tolist() == [[0, 0, 0], [128, 128, 128], [255, 255, 255]]
    image = montage({"raw": raw[None], "affinities": affinities[None]})
    assert image.shape == (2, 3 + 4 + 3, 3)  # cells of the largest section (2 x 3), 4 pixels apart


def test_render_shows_masks_white_where_valid_even_when_all_are():
    """A mask valid everywhere (a constant 1) was drawn black, as one masked everywhere."""
    for dtype in (np.uint8, bool):
        assert (render(np.ones((1, 1, 2, 3), dtype)) == 255).all()
        assert (render(np.zeros((1, 1, 2, 3), dtype)) == 0).all()
        half = np.zeros((3, 1, 1, 2), dtype)  # affinities_mask: uint8, one channel per offset
        half[:, 0, 0, 1] = 1
        assert render(half)[0].tolist() == [[0, 0, 0], [255, 255, 255]]


def test_a_snapshot_path_starting_with_a_tilde_is_in_the_home_folder(tmp_path, volumes, monkeypatch):
    """'~/s.zarr' made a folder named '~' in the working folder (every other path emfast takes expands it), one
    that ``rm -rf ~`` would be typed to clean up (a review)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=MIRRORS) as loader:
        assert loader.snapshot("~/s.zarr") == home / "s.zarr"
    assert (home / "s.zarr" / ".zgroup").is_file() and not (work / "~").exists()


def test_emfast_snapshot_command_writes_the_store_and_png(tmp_path, volumes, capsys):
    raw, labels = volumes[2], volumes[3]
    import h5py
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["raw"], f["labels"] = raw, labels
        for key in ("raw", "labels"):
            f[key].attrs["resolution"], f[key].attrs["offset"] = VOXEL, OFFSET
    (tmp_path / "train.yaml").write_text(
        "data:\n  samples:\n    - file: data.h5\n      raw: raw\n      labels: labels\n"
        "loader: {patch: [4, 16, 16], batch_size: 2}\naugment: []\ntargets: [affinities]\n")
    assert main(["snapshot", str(tmp_path / "train.yaml"), "--out", str(tmp_path / "s.zarr"), "--batches", "2",
                 "--png", str(tmp_path / "s.png")]) == 0
    assert "wrote 2 batches" in capsys.readouterr().out
    found = images(tmp_path / "s.zarr")
    assert len(found) == 2 * 2 * 4  # batches x examples x (raw, labels, affinities, affinities_mask)
    assert decode_png(tmp_path / "s.png")[:2] == (4 * 16 + 3 * 4, 2 * 16 + 4)
    assert main(["snapshot", str(tmp_path / "train.yaml"), "--out", str(tmp_path / "s.zarr")]) == 2
    assert "exists" in capsys.readouterr().err


# -- the epoch progress bar ---------------------------------------------------------------------------------------

def test_progress_draws_one_bar_per_epoch_when_the_epoch_has_a_size(capsys, volumes):
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=MIRRORS, epoch_size=5, progress=True) as loader:
        assert len(list(loader)) == 5
        first = capsys.readouterr().err
        assert len(list(loader)) == 5
        second = capsys.readouterr().err
    for text in (first, second):
        assert text.splitlines()[0].startswith("[") and "1/5 batches" in text.splitlines()[0]
        assert "5/5 batches" in text.splitlines()[-1]


def test_no_bar_without_progress_or_for_an_endless_stream(capsys, volumes):
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=MIRRORS, progress=True) as loader:
        assert len(list(itertools.islice(loader, 4))) == 4
    with ef.Loader(volumes[0], patch=(4, 16, 16), batch_size=1, augment=MIRRORS, epoch_size=3) as loader:
        assert len(list(loader)) == 3
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match="progress must be True or False"):
        ef.Loader(volumes[0], patch=(4, 16, 16), augment=MIRRORS, progress="yes")


def test_progress_from_a_yaml_config(tmp_path, volumes):
    import h5py
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["raw"] = volumes[2]
    (tmp_path / "c.yaml").write_text("data:\n  samples:\n    - file: data.h5\n      raw: raw\n"
                                     "loader: {patch: [4, 16, 16], epoch_size: 2, progress: true}\n")
    loader = load_config(tmp_path / "c.yaml").loader("train")
    assert loader.progress is True
    (tmp_path / "bad.yaml").write_text("data:\n  samples:\n    - file: data.h5\n      raw: raw\n"
                                       "loader: {patch: [4, 16, 16], progress: 3}\n")
    with pytest.raises(ValueError, match="progress"):
        load_config(tmp_path / "bad.yaml")


def test_a_field_at_its_own_voxel_size_sits_at_its_world_box_with_its_voxel_size(tmp_path, volumes, rng):
    """A mask delivered at its own voxel size (``own_resolution``) was written with raw's voxel size and a corner
    computed from its shape in its own voxels (found by a helper reading snapshots with funlib and ome-zarr-py):
    shown at half its size, shifted. It covers the labels' world box, at its own voxel size, for funlib and for
    OME-NGFF readers."""
    raw_volume, label_volume, _, _ = volumes
    mask_voxel = (40.0, 16.0, 8.0)  # twice raw's in y and x
    mask = rng.integers(0, 2, (20, 30, 35), dtype=np.uint8)
    mask_volume = ef.Volume.from_array(mask, name="mask", resolution=mask_voxel, offset=OFFSET)
    sample = ef.Sample(raw_volume, labels=label_volume, mask=mask_volume, own_resolution=["mask"])
    loader = ef.Loader(ef.Dataset([sample]), patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=2, augment=(),
                       seed=5)
    with loader:
        loader.snapshot(tmp_path / "snap.zarr")
    for n in range(2):
        group = zarr.open_group(str(tmp_path / f"snap.zarr/batch_0000/example_{n:02d}"), mode="r")
        labels, stored = group["labels/s0"], group["mask/s0"]
        assert stored.attrs["voxel_size"] == list(mask_voxel)
        assert stored.attrs["offset"] == labels.attrs["offset"]  # the same world box (no margin here)
        # OME-NGFF viewers centre voxel i at translation + i * scale: the mask's voxels must span the labels'
        # world box there too (its translation was the labels' corner, half a voxel of raw off; a helper in napari)
        boxes = []
        for field, array in (("labels", labels), ("mask", stored)):
            scale, translation = (np.asarray(t[key]) for t, key in zip(
                group[field].attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"],
                ("scale", "translation")))
            boxes.append((translation - scale / 2, translation + (np.asarray(array.shape) - 0.5) * scale))
        assert scale.tolist() == list(mask_voxel)
        np.testing.assert_allclose(boxes[1], boxes[0])
        corner = (np.asarray(stored.attrs["offset"]) - OFFSET) / mask_voxel
        assert np.array_equal(corner, corner.round())
        box = tuple(slice(int(c), int(c) + s) for c, s in zip(corner, stored.shape))
        np.testing.assert_array_equal(stored[...], mask[box])
        assert np.asarray(stored.shape) @ np.asarray(mask_voxel) == np.asarray(labels.shape) @ np.asarray(VOXEL)


def test_a_snapshot_taking_an_epochs_last_batch_ends_the_loop_at_the_epoch(tmp_path, volumes):
    """`for batch in loader` stopped only at a batch it yielded itself: a snapshot inside the loop that took the
    epoch's last batch made the loop run through the next epoch too (found by a helper checking reproducible
    streams)."""
    raw_volume, label_volume, _, _ = volumes
    loader = ef.Loader(raw_volume, label_volume, patch_in=PATCH_IN, patch_out=PATCH_OUT, batch_size=2, augment=(),
                       epoch_size=4, threads=1, seed=2)
    with loader:
        seen = []
        for batch in loader:
            seen.append((batch.epoch, batch.index))
            if batch.index == 2:
                loader.snapshot(tmp_path / "snap.zarr")  # takes (0, 3), the epoch's last
        assert seen == [(0, 0), (0, 1), (0, 2)] and loader.epoch == 1
        assert [(b.epoch, b.index) for b in loader] == [(1, 0), (1, 1), (1, 2), (1, 3)]


@pytest.mark.parametrize("patch_in,patch_out", [((6, 20, 28), (4, 16, 16)), ((6, 20, 30), (4, 16, 18))])
def test_transposed_examples_are_centred_on_their_windows_like_the_other_layers(tmp_path, rng, patch_in, patch_out):
    """With context differing between y and x, raw's layer of an example whose y and x were swapped was shifted off
    the other layers (by the difference of the two contexts): the context was placed along the source axes while
    the data, as the network sees it, lies along the output axes."""
    from emfast.pipeline._windows import window_extents

    voxel = (40.0, 4.0, 4.0)
    raw = rng.integers(0, 256, (20, 60, 70), dtype=np.uint8)
    labels = rng.integers(0, 5, (20, 60, 70)).astype(np.uint32)
    loader = ef.Loader(ef.Volume.from_array(raw, resolution=voxel, offset=OFFSET),
                       ef.Volume.from_array(labels, resolution=voxel, offset=OFFSET), patch_in=patch_in,
                       patch_out=patch_out, batch_size=4, augment=[ef.Mirror(), ef.Transpose()],
                       targets=[ef.Affinities()], seed=5)
    with loader:
        loader.snapshot(tmp_path / "snap.zarr", batches=2)
    found, root = images(tmp_path / "snap.zarr"), zarr.open_group(str(tmp_path / "snap.zarr"), mode="r")
    perms = []
    for group in (f"batch_{b:04d}/example_{n:02d}" for b in range(2) for n in range(4)):
        attrs = root[group].attrs
        perm, flips, position = np.asarray([attrs["perm"]]), attrs["flips"], np.asarray(attrs["corner"])
        perms.append(tuple(attrs["perm"]))
        centre = np.asarray(OFFSET) + (position + window_extents(patch_out, perm)[0] / 2) * voxel
        for field in ("raw", "labels", "affinities", "affinities_mask"):
            metadata, data = found[f"{group}/{field}"]
            translation = np.asarray(metadata["coordinateTransformations"][0][1]["translation"])[-3:]
            np.testing.assert_allclose(translation + np.asarray(data.shape[-3:]) * voxel / 2, centre)
        grow = window_extents((np.asarray(patch_in) - patch_out) // 2, perm)[0]
        box = tuple(slice(c, c + e) for c, e in zip(position - grow, window_extents(patch_in, perm)[0]))
        seen = np.transpose(np.flip(raw[box], [a for a in range(3) if flips[a]]), perm[0])
        np.testing.assert_array_equal(found[f"{group}/raw"][1], seen.astype(np.float32) * np.float32(1 / 255))
    assert (0, 2, 1) in perms and (0, 1, 2) in perms
