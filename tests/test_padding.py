"""Padded gathers: windows reaching past the source read it as np.pad would, under every transform."""
import numpy as np
import pytest

from emfast._core.common import RAW_DTYPES
from emfast._core.gather import PAD_MODES, gather_convert, gather_copy, pad_indices

MARGIN = 24  # wider than any window below reaches past its source, so np.pad's reference covers it


def _reference(src, corner, extent, perm, flip, mode, fill):
    padded = np.pad(src, ((0, 0),) + ((MARGIN, MARGIN),) * 3, mode=mode,
                    **({"constant_values": fill} if mode == "constant" else {}))
    window = padded[(slice(None),) + tuple(slice(c + MARGIN, c + MARGIN + e) for c, e in zip(corner, extent))]
    for axis in range(3):
        if flip[axis]:
            window = np.flip(window, 1 + axis)
    return np.transpose(window, [0] + [1 + p for p in perm])


@pytest.mark.parametrize("mode", PAD_MODES)
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.uint64, np.int8, np.int16, np.uint32, np.float16,
                                   np.float64, np.int32])
def test_padded_gather_matches_numpy_pad(mode, dtype):
    rng = np.random.default_rng(abs(hash((mode, np.dtype(dtype).str))) % 2**32)
    for _ in range(40):
        shape = tuple(int(s) for s in rng.integers(1, 8, 3))
        src = rng.integers(0, 200, (2,) + shape).astype(dtype)
        extents = [tuple(int(e) for e in rng.integers(1, 10, 3)) for _ in range(3)]
        perms = [rng.permutation(3) for _ in range(3)]
        flips = [rng.integers(0, 2, 3).astype(bool) for _ in range(3)]
        # One extent for the batch in output axes; each example's source extent is its permutation of it.
        out_extent = extents[0]
        corners = []
        for perm in perms:
            source_extent = [0, 0, 0]
            for j in range(3):
                source_extent[perm[j]] = out_extent[j]
            corners.append(tuple(int(rng.integers(-c - 6, s + 6)) for c, s in zip(source_extent, shape)))
        references = []
        for corner, perm, flip in zip(corners, perms, flips):
            source_extent = [0, 0, 0]
            for j in range(3):
                source_extent[perm[j]] = out_extent[j]
            references.append(_reference(src, corner, source_extent, perm, flip, mode, 9))
        out = np.empty((3, 2) + out_extent, dtype)
        gather_copy([src] * 3, corners, perms, flips, out, pad=mode, fill=9)
        np.testing.assert_array_equal(out, np.stack(references))
        if np.dtype(dtype) in RAW_DTYPES:
            converted = np.empty((3, 2) + out_extent, np.float32)
            gather_convert([src] * 3, corners, perms, flips, [0.5, 2.0, -1.0], [1.0, 0.0, 3.0], converted,
                           pad=mode, fill=9)
            expected = [r.astype(np.float32) * np.float32(s) + np.float32(t)
                        for r, s, t in zip(references, (0.5, 2.0, -1.0), (1.0, 0.0, 3.0))]
            np.testing.assert_array_equal(converted, np.stack(expected))


@pytest.mark.parametrize("mode", PAD_MODES)
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.uint16])
def test_long_rows_reaching_past_the_source_match_numpy_pad(mode, dtype):
    """Rows long enough for the vector loops: each row's interior is read as one run, its padding looked up."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 250, (1, 5, 6, 40)).astype(dtype)
    for corner_x, extent_x in [(-9, 64), (-1, 41), (0, 40), (3, 45), (-20, 23), (-6, 16), (30, 33)]:
        corners = [(-2, -1, corner_x), (1, 2, corner_x)]
        extent = (4, 5, extent_x)
        identity, forward = [np.arange(3)] * 2, [np.zeros(3, bool)] * 2
        references = np.stack([_reference(src, c, extent, [0, 1, 2], [False] * 3, mode, 9) for c in corners])
        out = np.empty((2, 1) + extent, dtype)
        gather_copy([src] * 2, corners, identity, forward, out, pad=mode, fill=9)
        np.testing.assert_array_equal(out, references, err_msg=f"x from {corner_x}, {extent_x} long")
        converted = np.empty((2, 1) + extent, np.float32)
        gather_convert([src] * 2, corners, identity, forward, [0.5, 2.0], [1.0, -3.0], converted, pad=mode, fill=9)
        expected = references.astype(np.float32) * np.float32([0.5, 2.0])[:, None, None, None, None] \
            + np.float32([1.0, -3.0])[:, None, None, None, None]
        np.testing.assert_array_equal(converted, expected, err_msg=f"x from {corner_x}, {extent_x} long")


def test_windows_inside_the_source_are_the_same_padded_or_not():
    rng = np.random.default_rng(5)
    src = rng.integers(0, 255, (1, 9, 10, 11), dtype=np.uint8)
    corners = [(1, 2, 3), (0, 0, 0)]
    perms = [(0, 2, 1), (2, 1, 0)]
    flips = [(True, False, True), (False, True, False)]
    plain = np.empty((2, 1, 5, 5, 5), np.uint8)
    padded = np.empty_like(plain)
    gather_copy([src, src], corners, perms, flips, plain)
    gather_copy([src, src], corners, perms, flips, padded, pad="reflect")
    np.testing.assert_array_equal(plain, padded)


def test_out_of_bounds_windows_are_refused_without_padding():
    src = np.zeros((1, 4, 4, 4), np.uint8)
    with pytest.raises(IndexError, match="outside the source extent 4"):
        gather_copy([src], [(-1, 0, 0)], [(0, 1, 2)], [(False,) * 3], np.empty((1, 1, 2, 2, 2), np.uint8))


def test_bad_pad_mode_and_fill_are_named():
    src = np.zeros((1, 4, 4, 4), np.uint8)
    out = np.empty((1, 1, 2, 2, 2), np.uint8)
    with pytest.raises(ValueError, match="pad must be one of reflect, edge, constant or None, got 'wrap'"):
        gather_copy([src], [(-1, 0, 0)], [(0, 1, 2)], [(False,) * 3], out, pad="wrap")
    with pytest.raises(ValueError, match="fill 300 is not a single value representable in out's dtype uint8"):
        gather_copy([src], [(-1, 0, 0)], [(0, 1, 2)], [(False,) * 3], out, pad="constant", fill=300)


def test_pad_indices_fold_any_distance():
    # Reflection is periodic with period 2 (n - 1); far indices fold back in.
    np.testing.assert_array_equal(pad_indices([-7, -1, 0, 3, 4, 9], 4, "reflect"), [1, 1, 0, 3, 2, 3])
    np.testing.assert_array_equal(pad_indices([-7, 9], 4, "edge"), [0, 3])
    np.testing.assert_array_equal(pad_indices([-1, 0, 4], 4, "constant"), [-1, 0, -1])
    np.testing.assert_array_equal(pad_indices([-3, 5], 1, "reflect"), [0, 0])


@pytest.mark.parametrize("mode", PAD_MODES)
def test_volume_reads_past_its_border_like_numpy_pad(tmp_path, mode):
    import h5py

    from emfast.io import hdf5

    rng = np.random.default_rng(11)
    data = rng.integers(0, 255, (13, 9, 17), dtype=np.uint8)
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_dataset("raw", data=data, chunks=(4, 4, 4))
    padded = np.pad(data[np.newaxis], ((0, 0),) + ((MARGIN, MARGIN),) * 3, mode=mode,
                    **({"constant_values": 3} if mode == "constant" else {}))
    for volume in (hdf5(tmp_path / "v.h5", "raw", in_memory=False), hdf5(tmp_path / "v.h5", "raw")):
        for _ in range(30):
            corner = tuple(int(rng.integers(-20, s + 5)) for s in data.shape)
            extent = tuple(int(rng.integers(1, 20)) for _ in range(3))
            out = np.empty((1,) + extent, np.uint8)
            volume.read_padded(corner, extent, out, mode, fill=3)
            expected = padded[(slice(None),) + tuple(slice(c + MARGIN, c + MARGIN + e)
                                                     for c, e in zip(corner, extent))]
            np.testing.assert_array_equal(out, expected, err_msg=f"{volume} {corner} {extent}")
