"""Samplers (Uniform, Masked, Balanced, Tiled) and their index kernels, against NumPy references."""
import dataclasses
import inspect
import itertools

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast import sampling
from emfast.sampling import _base
from emfast._core import sampling as _sampling
from emfast._registry import registered
from emfast.sampling import Balanced, Masked, Region, Sampler, Tiled, Uniform
from emfast.io import Volume, hdf5
from reference import assert_releases_gil, boundaries_reference

LABEL_DTYPES = [np.uint32, np.uint64, np.int64, np.int32]


def region(name="a", weight=1.0, lo=(0, 0, 0), hi=None, labels=None, labels_origin=(0, 0, 0), mask=None,
           mask_origin=(0, 0, 0)):
    volume = labels if labels is not None else mask
    hi = volume.shape if hi is None else hi
    return Region(name, weight, np.asarray(lo, np.int64), np.asarray(hi, np.int64),
                  labels=None if labels is None else Volume.from_array(labels),
                  labels_origin=np.asarray(labels_origin, np.int64),
                  mask=None if mask is None else Volume.from_array(mask),
                  mask_origin=np.asarray(mask_origin, np.int64))


def blocky_labels(rng, shape, ids=(1, 2, 3, 4), size=(3, 4, 4), dtype=np.uint64):
    """Piecewise-constant labels (boxes of ``size``), so that both boundary and interior voxels occur."""
    coarse = rng.integers(0, len(ids), tuple(-(-s // b) for s, b in zip(shape, size)))
    full = coarse.repeat(size[0], 0).repeat(size[1], 1).repeat(size[2], 2)
    return np.asarray(ids, dtype=dtype)[full[:shape[0], :shape[1], :shape[2]]]


def within(count, n, p, sigmas=4.0):
    """``count`` successes of ``n`` draws are within ``sigmas`` standard deviations of probability ``p``."""
    return abs(count - n * p) <= sigmas * np.sqrt(n * p * (1 - p)) + 1e-9


def lazy(tmp_path, array, name="data"):
    path = tmp_path / f"{name}.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=array, chunks=tuple(min(4, s) for s in array.shape))
    return hdf5(path, name, in_memory=False)


# -- kernels ----------------------------------------------------------------------------------------------------

def window_sums(coverage, extent):
    """Sum of every window of ``extent`` (NumPy: a summed-area table)."""
    table = np.pad(coverage.astype(np.int64), [(1, 0)] * 3).cumsum(0).cumsum(1).cumsum(2)
    ez, ey, ex = extent
    return (table[ez:, ey:, ex:] - table[:-ez, ey:, ex:] - table[ez:, :-ey, ex:] - table[ez:, ey:, :-ex]
            + table[:-ez, :-ey, ex:] + table[:-ez, ey:, :-ex] + table[ez:, :-ey, :-ex] - table[:-ez, :-ey, :-ex])


@pytest.mark.parametrize("extent", [(1, 1, 1), (2, 3, 5), (6, 9, 70)])
def test_window_bits_match_numpy(rng, extent):
    coverage = (rng.random((6, 9, 130)) < 0.7).astype(np.uint8)
    sums = window_sums(coverage, extent)
    threshold = int(np.median(sums))
    rows = sums.shape[0] * sums.shape[1]
    bits = np.full((rows, _sampling.words_per_row(sums.shape[2])), 0xAB, np.uint64)  # every word is rewritten
    counts = np.full(rows, -1, np.int64)
    best = _sampling.window_bits(coverage, extent, threshold, bits, counts)
    expected = (sums >= threshold).reshape(rows, -1)
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little").astype(bool)
    np.testing.assert_array_equal(unpacked[:, :sums.shape[2]], expected)
    assert not unpacked[:, sums.shape[2]:].any()
    np.testing.assert_array_equal(counts, expected.sum(axis=1))
    assert best == sums.max()
    ranks = rng.integers(0, 80, rows)
    picked = _sampling.select_bits(bits, np.arange(rows), ranks)
    for row in range(rows):
        ones = np.flatnonzero(expected[row])
        assert picked[row] == (ones[ranks[row]] if ranks[row] < len(ones) else -1)


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
@pytest.mark.parametrize("thickness,in_plane", [(1, False), (2, True), (3, False)])
def test_count_and_select_boundary_classes_match_numpy(rng, dtype, thickness, in_plane):
    labels = blocky_labels(rng, (13, 22, 40), ids=(0, 5, np.iinfo(dtype).max, 7), size=(2, 3, 5), dtype=dtype)
    view = labels[:, ::-1, 1:]  # a negative stride and an offset: the kernel follows any layout
    boundary = boundaries_reference(view[None, None], thickness=thickness, in_plane=in_plane)[0, 0]
    classes = 1 - boundary.astype(np.int64)  # class 0 boundary, class 1 interior
    rule = _sampling.ClassRule(2, thickness=thickness, in_plane=in_plane)
    lo, hi, block = (1, 2, 3), (12, 21, 38), (4, 5, 16)
    grid = _sampling.grid_shape(lo, hi, block)
    counts = np.full(grid + (2,), 99, np.uint32)
    _sampling.count_classes(view, rule, lo, hi, block, counts)
    box = classes[1:12, 2:21, 3:38]
    for b in itertools.product(*(range(g) for g in grid)):
        cell = box[tuple(slice(i * s, (i + 1) * s) for i, s in zip(b, block))]
        assert counts[b].tolist() == [(cell == 0).sum(), (cell == 1).sum()], b
    for cls in (0, 1):
        voxels = np.argwhere(box == cls)
        for rank in [0, len(voxels) // 3, len(voxels) - 1]:
            found = _sampling.select_class(view, rule, lo, hi, cls, rank)
            assert found == tuple(int(v) for v in voxels[rank] + lo)
        assert _sampling.select_class(view, rule, lo, hi, cls, len(voxels)) is None


def test_a_boundary_thickness_beyond_the_labels_counts_as_their_longest_extent(rng):
    """Balanced(thickness=2**62) was accepted and never finished building its index: the kernel stepped through
    every thickness, though steps beyond the labels reach no voxel."""
    labels = blocky_labels(rng, (9, 14, 23), ids=(0, 5, 7), size=(2, 3, 5), dtype=np.uint32)
    grid = _sampling.grid_shape((0, 0, 0), labels.shape, (4, 5, 6))
    counts = {}
    for thickness in (23, 2**62):
        counts[thickness] = np.empty(grid + (2,), np.uint32)
        _sampling.count_classes(labels, _sampling.ClassRule(2, thickness=thickness), (0, 0, 0), labels.shape,
                                (4, 5, 6), counts[thickness])
    np.testing.assert_array_equal(counts[2**62], counts[23])
    assert _sampling.select_class(labels, _sampling.ClassRule(2, thickness=2**62), (0, 0, 0), labels.shape, 0, 0) \
        == _sampling.select_class(labels, _sampling.ClassRule(2, thickness=23), (0, 0, 0), labels.shape, 0, 0)
    with pytest.warns(UserWarning, match="class 'interior' is absent"):  # every voxel is near another label
        loader = ef.Loader(np.zeros(labels.shape, np.uint8), labels=labels, patch=(4, 8, 8), batch_size=2,
                           threads=1, sampler=Balanced("boundary", thickness=2**62))
    with loader:
        assert next(iter(loader))["raw"].shape == (2, 1, 4, 8, 8)


@pytest.mark.parametrize("kind", ["balanced", "masked"])
def test_a_sampler_bound_again_keeps_no_earlier_region_and_follows_its_settings(rng, kind):
    """A sampler keeps its index for a later bind to the same regions (a DataLoader worker's); bound to other
    regions it kept the earlier ones' volumes alive (256 MiB of labels in a review) until its next bind, and a
    class setting changed between binds (Balanced.block) reused an index built for the old one."""
    import gc
    import weakref

    def region(shape):
        labels = Volume(blocky_labels(rng, shape, ids=(1, 2, 3), size=(2, 3, 5), dtype=np.uint32), name="labels")
        return Region(name="r", lo=(0, 0, 0), hi=shape, labels=labels, mask=None, weight=1.0), labels

    sampler = Balanced("boundary") if kind == "balanced" else Masked(0.5, source="labels", unlabelled=0)
    big, labels = region((16, 48, 48))
    sampler.bind([big], np.asarray([(4, 8, 8)]), 2)
    gone = weakref.ref(labels)
    del big, labels
    small, _ = region((8, 24, 24))
    sampler.bind([small], np.asarray([(4, 8, 8)]), 2)
    gc.collect()
    assert gone() is None
    if kind == "balanced":
        before = sampler._classes[0]
        sampler.block = (4, 8, 8)
        sampler.bind([small], np.asarray([(4, 8, 8)]), 2)
        assert sampler._classes[0] is not before and sampler._classes[0].grid == (2, 3, 3)
        draw = sampler.sample(rng.random((2, sampler.draws)), np.asarray([(4, 8, 8)] * 2), 0, 0)
        assert draw.corners.shape == (2, 3)


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
def test_count_map_classes_match_numpy(rng, dtype):
    ids = [0, 3, int(np.iinfo(dtype).max), 9]
    labels = np.asarray(ids, dtype=dtype)[rng.integers(0, 4, (5, 7, 33))]
    bits = [i & 0xFFFFFFFFFFFFFFFF for i in ids]
    rule = _sampling.ClassRule(2, ids=[bits[2], bits[1], bits[0]], id_classes=[1, 0, 1])  # id 9: no class
    counts = np.empty((1, 1, 1, 2), np.uint32)
    _sampling.count_classes(labels, rule, (0, 0, 0), labels.shape, labels.shape, counts)
    assert counts.ravel().tolist() == [(labels == ids[1]).sum(), np.isin(labels, [ids[0], ids[2]]).sum()]
    voxels = np.argwhere(labels == ids[1])
    assert _sampling.select_class(labels, rule, (0, 0, 0), labels.shape, 0, 5) == tuple(voxels[5])


def test_index_kernels_release_the_gil():
    labels = np.random.default_rng(0).integers(0, 3, (64, 256, 256), dtype=np.uint64)
    rule = _sampling.ClassRule(2, thickness=1)
    counts = np.empty(_sampling.grid_shape((0, 0, 0), labels.shape, (8, 16, 16)) + (2,), np.uint32)
    assert_releases_gil(_sampling.count_classes, labels, rule, (0, 0, 0), labels.shape, (8, 16, 16), counts)
    coverage = (labels < 2).astype(np.uint8)
    extent = (8, 32, 32)
    rows = (64 - 7) * (256 - 31)
    assert_releases_gil(_sampling.window_bits, coverage, extent, 1000, np.empty((rows, 4), np.uint64),
                        np.empty(rows, np.int64))


def test_kernel_wrappers_reject_bad_input():
    labels = np.zeros((4, 4, 4), np.uint64)
    rule = _sampling.ClassRule(2)
    with pytest.raises(TypeError, match="dtype"):
        _sampling.count_classes(labels.astype(np.int8), rule, (0, 0, 0), (4, 4, 4), (2, 2, 2),
                                np.empty((2, 2, 2, 2), np.uint32))
    with pytest.raises(ValueError, match="outside"):
        _sampling.select_class(labels, rule, (0, 0, 0), (5, 4, 4), 0, 0)
    with pytest.raises(ValueError, match="counts"):
        _sampling.count_classes(labels, rule, (0, 0, 0), (4, 4, 4), (2, 2, 2), np.empty((2, 2, 2, 2), np.int64))
    with pytest.raises(ValueError, match="thickness"):
        _sampling.ClassRule(2, thickness=0)
    with pytest.raises(ValueError, match="extent"):
        _sampling.window_bits(np.zeros((2, 2, 2), np.uint8), (3, 1, 1), 1, np.empty((0, 1), np.uint64),
                              np.empty(0, np.int64))


# -- Uniform ----------------------------------------------------------------------------------------------------

def test_uniform_windows_inside_regions_and_weights_respected(rng):
    regions = [region("a", 1.0, lo=(2, 3, 4), hi=(10, 20, 30), mask=np.ones((12, 24, 34), np.uint8)),
               region("b", 3.0, lo=(0, 0, 0), hi=(6, 9, 9), mask=np.ones((6, 9, 9), np.uint8))]
    sampler = Uniform()
    extents = np.array([[3, 5, 7]])
    sampler.bind(regions, extents, 8)
    n = 4000
    draw = sampler.sample(rng.random((n, sampler.draws)), np.repeat(extents, n, 0), 0, 0)
    lo = np.stack([regions[v].lo for v in draw.volumes])
    hi = np.stack([regions[v].hi for v in draw.volumes])
    assert np.all(draw.corners >= lo) and np.all(draw.corners + extents <= hi)
    assert within((draw.volumes == 1).sum(), n, 0.75)
    a = draw.corners[draw.volumes == 0]
    assert {tuple(c) for c in a[:, :1]} == {(z,) for z in range(2, 8)}  # every position along z reached


# -- Masked -----------------------------------------------------------------------------------------------------

def valid_corners(covered, lo, hi, extent, fraction):
    """Every corner in [lo, hi - extent] whose window has covered / voxels >= fraction."""
    sums = window_sums(covered[tuple(slice(a, b) for a, b in zip(lo, hi))], extent)
    return {tuple(int(v) for v in c + lo) for c in np.argwhere(sums / np.prod(extent) >= fraction)}


def test_masked_draws_only_and_all_valid_windows(rng):
    mask = (rng.random((9, 12, 75)) < 0.55).astype(np.uint8) * 7
    origin = np.array([1, 2, 3])
    regions = [region("a", lo=(0, 1, 0), hi=(11, 15, 80), mask=mask, mask_origin=origin)]
    extents = np.array([[3, 4, 5], [3, 5, 4]])
    sampler = Masked(min_fraction=0.6)
    sampler.bind(regions, extents, 8)
    covered = np.zeros((11, 15, 80), bool)
    covered[1:10, 2:14, 3:78] = mask != 0  # voxels outside the mask are not covered
    for extent in extents:
        expected = valid_corners(covered, regions[0].lo, regions[0].hi, extent, 0.6)
        assert 100 < len(expected) < 2000
        n = 12 * len(expected)  # each corner missed with probability e^-12
        draw = sampler.sample(rng.random((n, 2)), np.repeat(extent[None], n, 0), 0, 0)
        assert set(map(tuple, draw.corners.tolist())) == expected


def test_masked_by_labels_lazy_equals_in_memory(rng, tmp_path, monkeypatch):
    monkeypatch.setattr(_base, "TILE_BYTES", 9 * 3 * 8 * 30)  # tiles of corner planes and rows: seams tested
    labels = blocky_labels(rng, (10, 20, 30), ids=(0, 0, 3, 4), size=(2, 3, 3), dtype=np.int64)
    extents = np.array([[2, 6, 6]])
    memory = Masked(0.7, source="labels", unlabelled=0)
    memory.bind([region(labels=labels)], extents, 4)
    on_disk = Masked(0.7, source="labels", unlabelled=0)
    on_disk.bind([Region("a", 1.0, np.zeros(3, np.int64), np.array(labels.shape), labels=lazy(tmp_path, labels),
                         labels_origin=np.zeros(3, np.int64))], extents, 4)
    uniforms = rng.random((500, 2))
    a = memory.sample(uniforms, np.repeat(extents, 500, 0), 0, 0)
    b = on_disk.sample(uniforms, np.repeat(extents, 500, 0), 0, 0)
    np.testing.assert_array_equal(a.corners, b.corners)
    expected = valid_corners(labels != 0, np.zeros(3, int), np.array(labels.shape), extents[0], 0.7)
    assert set(map(tuple, a.corners.tolist())) <= expected


@pytest.mark.parametrize("tile_bytes", [1, 2 * 40 * 50, 2 * 5 * 40 * 50, 2 * 9 * 12 * 50, 2 * 30 * 20 * 50])
def test_a_masked_index_built_in_tiles_equals_one_built_whole(rng, tmp_path, monkeypatch, tile_bytes):
    """Planes too wide for the tile bytes were read one corner plane at a time: each plane extent z times, and each
    slab as large as extent z whole planes (1.2 G voxels for planes of 6144 x 6144, a review). Tiles now span
    several corner planes and part of the rows; the index is the same, from a lazy volume too."""
    mask = (rng.random((12, 40, 50)) < 0.8).astype(np.uint8)
    extent = np.array([3, 5, 4])
    whole = Masked(0.7)._index(region(mask=mask), extent)
    monkeypatch.setattr(_base, "TILE_BYTES", tile_bytes)
    reads = []
    volume = lazy(tmp_path, mask)
    read_box = volume.read_box
    monkeypatch.setattr(volume, "read_box", lambda corner, shape, out: (reads.append(np.prod(shape)),
                                                                        read_box(corner, shape, out)))
    for mask_region in (region(mask=mask), Region("a", 1.0, np.zeros(3, np.int64), np.array(mask.shape),
                                                  mask=volume, mask_origin=np.zeros(3, np.int64))):
        tiled = Masked(0.7)._index(mask_region, extent)
        np.testing.assert_array_equal(tiled.bits, whole.bits)
        np.testing.assert_array_equal(tiled.cumulative, whole.cumulative)
        assert (tiled.rows_y, tiled.best) == (whole.rows_y, whole.best)
    if tile_bytes >= 2 * extent[0] * extent[1] * 50:  # a window's rows fit
        assert max(reads) * 2 <= tile_bytes
        assert sum(reads) < 5 * mask.size  # each voxel read a few times at most, not extent z times per tile row
    else:  # one corner plane, several windows' rows (tiles of one corner row read each voxel 15 times here)
        assert sum(reads) <= 2 * extent[0] * mask.size


def test_masked_skips_regions_without_valid_windows_and_errors_when_none_has_one(rng):
    good = np.ones((6, 10, 10), np.uint8)
    poor = (rng.random((6, 10, 10)) < 0.2).astype(np.uint8)
    sampler = Masked(0.9)
    regions = [region("poor", 5.0, mask=poor), region("good", 1.0, mask=good)]
    with pytest.warns(UserWarning, match="'poor' has no window"):
        sampler.bind(regions, np.array([[3, 3, 3]]), 8)
    draw = sampler.sample(rng.random((200, 2)), np.repeat([[3, 3, 3]], 200, 0), 0, 0)
    assert np.all(draw.volumes == 1)
    with pytest.raises(ValueError, match=r"'poor'.*best covered fraction is 0\.\d+ \(region 'poor'\)"):
        Masked(0.9).bind([regions[0]], np.array([[3, 3, 3]]), 8)
    with pytest.raises(ValueError, match="has no mask"):
        Masked().bind([region(labels=np.ones((4, 4, 4), np.uint64))], np.array([[2, 2, 2]]), 8)


@pytest.mark.parametrize("kwargs,match", [(dict(min_fraction=0), "min_fraction"),
                                          (dict(min_fraction=1.5), "min_fraction"),
                                          (dict(min_fraction="half"), "min_fraction"),
                                          (dict(source="raw"), "source"),
                                          (dict(unlabelled=0.5), "unlabelled")])
def test_masked_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Masked(**kwargs)


def test_masked_threshold_is_exact():
    sampler = Masked(0.1)
    for voxels in [10, 30, 49, 1000, 3 * 7 * 11]:
        needed = sampler.threshold(voxels)
        assert needed / voxels >= 0.1 > (needed - 1) / voxels


# -- Balanced ---------------------------------------------------------------------------------------------------

def test_balanced_reaches_class_priors_at_the_window_centre(rng):
    labels = blocky_labels(rng, (20, 40, 40), size=(4, 8, 8))
    origin = np.array([2, 1, 0])
    regions = [region("a", 1.0, lo=(0, 0, 0), hi=(24, 44, 40), labels=labels, labels_origin=origin)]
    extents = np.array([[5, 8, 6], [5, 6, 8]])
    sampler = Balanced(priors={"boundary": 1, "interior": 4}, thickness=2, in_plane=True)
    sampler.bind(regions, extents, 8)
    boundary = boundaries_reference(labels[None, None], thickness=2, in_plane=True)[0, 0].astype(bool)
    n = 4000
    for extent in extents:
        draw = sampler.sample(rng.random((n, 3)), np.repeat(extent[None], n, 0), 0, 0)
        assert np.all(draw.corners >= regions[0].lo) and np.all(draw.corners + extent <= regions[0].hi)
        centres = draw.corners + (extent - 1) // 2 - origin
        assert np.all(centres >= 0) and np.all(centres < labels.shape)
        assert within(boundary[tuple(centres.T)].sum(), n, 0.2)


def test_balanced_reaches_every_voxel_of_a_class_uniformly(rng):
    labels = blocky_labels(rng, (6, 12, 12), size=(3, 4, 4))
    sampler = Balanced(priors={"boundary": 1})
    extents = np.array([[1, 3, 3]])
    sampler.bind([region(labels=labels)], extents, 8)
    boundary = boundaries_reference(labels[None, None])[0, 0].astype(bool)
    boundary[:, [0, -1], :] = False  # centres of 3 x 3 windows never lie on the y/x border
    boundary[:, :, [0, -1]] = False
    expected = {tuple(v) for v in np.argwhere(boundary)}
    assert len(expected) > 100
    n = 12 * len(expected)
    draw = sampler.sample(rng.random((n, 3)), np.repeat(extents, n, 0), 0, 0)
    centres = [tuple(c) for c in (draw.corners + 1 - [1, 0, 0]).tolist()]
    assert set(centres) == expected
    counts = np.unique(centres, axis=0, return_counts=True)[1]
    assert counts.std() / counts.mean() < 0.5  # uniform: Poisson(12) spread is 0.29


@pytest.mark.parametrize("tile_bytes", [4 * 44 * 44 * 12, 4 * 12 * 44 * 20])  # a block row; part of one
@pytest.mark.parametrize("in_plane", [False, True])
def test_balanced_lazy_equals_in_memory(rng, tmp_path, monkeypatch, in_plane, tile_bytes):
    """Read in tiles of one block row (halos at the seams along z), or of part of one (along y too: whole planes
    of 6144 x 6144 labels took 2 GB a tile, a review)."""
    monkeypatch.setattr(_base, "TILE_BYTES", tile_bytes)
    labels = blocky_labels(rng, (30, 40, 40), size=(3, 2, 7), dtype=np.uint32)
    extents = np.array([[4, 9, 9]])
    samplers, reads = [], []
    on_disk = lazy(tmp_path, labels)
    read_box = on_disk.read_box
    monkeypatch.setattr(on_disk, "read_box", lambda corner, shape, out: (reads.append(4 * np.prod(shape)),
                                                                         read_box(corner, shape, out)))
    for volume in (Volume.from_array(labels), on_disk):
        sampler = Balanced(thickness=2, in_plane=in_plane)
        sampler.bind([Region("a", 1.0, np.array([0, 2, 1]), np.array([28, 40, 40]), labels=volume,
                             labels_origin=np.zeros(3, np.int64))], extents, 8)
        samplers.append(sampler)
    boundary = boundaries_reference(labels[None, None], thickness=2, in_plane=in_plane)[0, 0]
    box = boundary[1:26, 6:36, 5:36]  # centres of 4 x 9 x 9 windows in [lo, hi)
    expected = {"a": {"boundary": int(box.sum()), "interior": int((1 - box).sum())}}
    assert samplers[0].class_counts() == samplers[1].class_counts() == expected
    assert max(reads) <= tile_bytes  # the tiles as read, halos included
    uniforms = rng.random((300, 3))
    a, b = (s.sample(uniforms, np.repeat(extents, 300, 0), 0, 0) for s in samplers)
    np.testing.assert_array_equal(a.corners, b.corners)


def test_balanced_semantic_classes_and_region_weights(rng, tmp_path):
    a = rng.integers(0, 4, (8, 16, 16)).astype(np.uint32)
    b = rng.integers(0, 4, (8, 16, 16)).astype(np.uint32)
    b[b == 3] = 2  # class "c" only in region a
    regions = [region("a", 1.0, labels=a),
               Region("b", 3.0, np.zeros(3, np.int64), np.array(b.shape), labels=lazy(tmp_path, b),
                      labels_origin=np.zeros(3, np.int64))]
    sampler = Balanced(classes={1: "x", 2: "y", 3: "c"}, priors={"x": 1, "y": 1, "c": 2})
    with pytest.warns(UserWarning, match=r"class 'c' is absent from region\(s\) 'b'"):
        sampler.bind(regions, np.array([[3, 3, 3]]), 8)
    n = 3000
    draw = sampler.sample(rng.random((n, 3)), np.full((n, 3), 3), 0, 0)
    assert within((draw.volumes == 1).sum(), n, 0.75)
    centre = [(a, b)[v][tuple(c + 1)] for v, c in zip(draw.volumes, draw.corners)]
    centre = np.asarray(centre)
    in_a, in_b = centre[draw.volumes == 0], centre[draw.volumes == 1]
    assert within((in_a == 3).sum(), len(in_a), 0.5) and within((in_a == 1).sum(), len(in_a), 0.25)
    assert not np.isin(centre, [0]).any()  # unmapped ids are never centres
    assert within((in_b == 1).sum(), len(in_b), 0.5)  # c's prior redistributed to x and y equally
    assert sampler.class_counts()["b"]["c"] == 0


def test_balanced_errors(rng):
    with pytest.raises(ValueError, match=r"class 'edge'.*'boundary', 'interior'"):
        Balanced(priors={"edge": 1})
    with pytest.raises(ValueError, match="prior of class 'interior'"):
        Balanced(priors={"interior": -1})
    with pytest.raises(ValueError, match="positive sum"):
        Balanced(priors={"interior": 0, "boundary": 0})
    with pytest.raises(ValueError, match="classes"):
        Balanced(classes="semantic")
    with pytest.raises(ValueError, match="thickness"):
        Balanced(thickness=0)
    with pytest.raises(ValueError, match="in_plane"):
        Balanced(in_plane=1)
    uniform = np.full((4, 4, 4), 5, np.uint64)  # no boundary anywhere
    with pytest.raises(ValueError, match="no region has a voxel"):
        Balanced(priors={"boundary": 1}).bind([region(labels=uniform)], np.array([[2, 2, 2]]), 8)
    with pytest.raises(ValueError, match="has no labels"):
        Balanced().bind([region(mask=np.ones((4, 4, 4), np.uint8))], np.array([[2, 2, 2]]), 8)


# -- Tiled ------------------------------------------------------------------------------------------------------

def tiled_draws(sampler, batch):
    return [sampler.sample(np.empty((batch, 0)), np.repeat(sampler._extent[None], batch, 0), 0, i)
            for i in range(sampler.batches_per_epoch())]


@pytest.mark.parametrize("stride", [None, 3, (2, 5, 4)])
def test_tiled_covers_every_voxel_of_every_region(stride):
    regions = [region("a", lo=(1, 2, 3), hi=(9, 17, 20), mask=np.ones((10, 20, 20), np.uint8)),
               region("b", lo=(0, 0, 0), hi=(4, 6, 6), mask=np.ones((4, 6, 6), np.uint8))]
    extent = np.array([4, 6, 5])
    sampler = Tiled(stride=stride)
    sampler.bind(regions, extent[None], 4)
    seen = [np.zeros((10, 20, 20), bool), np.zeros((4, 6, 6), bool)]
    for draw in tiled_draws(sampler, 4):
        for v, c in zip(draw.volumes[:draw.valid], draw.corners[:draw.valid]):
            assert np.all(c >= regions[v].lo) and np.all(c + extent <= regions[v].hi)
            seen[v][tuple(slice(a, a + e) for a, e in zip(c, extent))] = True
    assert seen[0][1:9, 2:17, 3:20].all() and seen[0].sum() == 8 * 15 * 17
    assert seen[1].all()


@pytest.mark.parametrize("last", ["keep", "drop", "roll"])
@pytest.mark.parametrize("world_size", [1, 3, 7])
def test_tiled_last_batch_and_shards(last, world_size):
    """Every shard makes as many batches as the largest (``keep``, ``roll``) or the smallest (``drop``) shard
    makes, as torch's DistributedSampler gives every rank as many samples: ranks running collective operations
    per batch (DistributedDataParallel's forward) wait forever for a rank that ran out. 30 tiles over 7 shards:
    5 or 4 tiles each, 2 or 1 batches of 4."""
    regions = [region(lo=(0, 0, 0), hi=(2, 10, 12), mask=np.ones((2, 10, 12), np.uint8))]
    extent = np.array([[2, 2, 2]])  # 30 tiles
    batch = 4
    most, least = -(-30 // world_size), 30 // world_size
    shards = []
    for rank in range(world_size):
        sampler = Tiled(last=last)
        sampler.bind(regions, extent, batch, rank, world_size)
        n = len(range(rank, 30, world_size))
        draws = tiled_draws(sampler, batch)
        assert len(draws) == {"keep": -(-most // batch), "drop": least // batch, "roll": -(-most // batch)}[last]
        assert sampler.batches_per_epoch() == len(draws)
        tiles = [sampler.tile(i)[1].tolist() for i in range(rank, 30, world_size)]
        delivered = [c.tolist() for d in draws for c in d.corners[:d.valid]]
        if last == "keep":
            assert delivered == tiles
            assert [d.valid for d in draws] == [min(batch, max(0, n - i * batch)) for i in range(len(draws))]
            assert all((d.corners[d.valid:] == tiles[-1]).all() for d in draws)
        elif last == "drop":
            assert delivered == tiles[:len(draws) * batch] and all(d.valid == batch for d in draws)
        else:
            assert delivered == [tiles[p % n] for p in range(len(draws) * batch)]
        shards.append({tuple(t) for t in tiles})
    assert sum(len(s) for s in shards) == 30 and len(set.union(*shards)) == 30


def test_a_rank_without_tiles_makes_its_batches_of_none_as_the_others_expect():
    """One tile over two ranks (a small validation set on many GPUs): rank 1 refused to build ("1 tiles leave
    none for rank 1 of 2"), where the docs promise every rank as many batches, the short one's of valid = 0."""
    regions = [region(lo=(0, 0, 0), hi=(2, 2, 2), mask=np.ones((2, 2, 2), np.uint8))]
    for rank in range(3):
        sampler = Tiled()
        sampler.bind(regions, np.array([[2, 2, 2]]), 4, rank, 3)
        (draw,) = tiled_draws(sampler, 4)
        assert draw.valid == (1 if rank == 0 else 0) and (draw.corners == 0).all() and (draw.volumes == 0).all()
    with pytest.raises(ValueError, match="leave none for rank 1 of 3 to roll through"):
        Tiled(last="roll").bind(regions, np.array([[2, 2, 2]]), 4, 1, 3)
    raw = np.random.default_rng(0).integers(0, 256, (2, 8, 8), dtype=np.uint8)
    with ef.Loader(raw, patch=(2, 8, 8), batch_size=2, sampler="tiled", augment=(), rank=1, world_size=2) as loader:
        batches = list(loader)
        assert len(batches) == 1 and batches[0].valid == 0


def test_tiled_errors():
    regions = [region(mask=np.ones((4, 8, 8), np.uint8))]
    with pytest.raises(ValueError, match="same extent"):
        Tiled().bind(regions, np.array([[2, 4, 2], [2, 2, 4]]), 4)
    with pytest.raises(ValueError, match="gaps"):
        Tiled(stride=3).bind(regions, np.array([[2, 2, 2]]), 4)
    with pytest.raises(ValueError, match="leaves no batch"):
        Tiled(last="drop").bind(regions, np.array([[4, 8, 8]]), 4)
    for stride in [0, -1, (1, 2), (1, 2, 0), "2", 1.5]:
        with pytest.raises(ValueError, match="stride"):
            Tiled(stride=stride)
    with pytest.raises(ValueError, match="last"):
        Tiled(last="wrap")


def test_tiled_roll_with_fewer_tiles_than_a_batch_cycles_through_them():
    """The docstring's example: 3 tiles, batch 8."""
    sampler = Tiled(last="roll")
    sampler.bind([region(lo=(0, 0, 0), hi=(2, 2, 6), mask=np.ones((2, 2, 6), np.uint8))], np.array([[2, 2, 2]]), 8)
    tiles = [sampler.tile(i)[1].tolist() for i in range(3)]
    (draw,) = tiled_draws(sampler, 8)
    assert draw.valid == 8 and [c.tolist() for c in draw.corners] == [tiles[i] for i in (0, 1, 2, 0, 1, 2, 0, 1)]


def test_reprs():
    assert repr(Masked(0.25)) == "Masked(min_fraction=0.25, source='mask')"
    assert repr(Tiled(2, "roll")) == "Tiled(stride=(2, 2, 2), last='roll')"
    assert repr(Balanced(priors={"boundary": 2})) == \
        "Balanced(classes='boundary', priors={'boundary': 2.0, 'interior': 0.0}, thickness=1, in_plane=False)"
    assert repr(Uniform()) == "Uniform()"


# -- one idiom for every registered component --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["augmentation", "target", "sampler"])
def test_registered_components_are_dataclasses_of_their_parameters(kind):
    """Augmentations, targets and samplers are written alike: a dataclass whose fields are its parameters."""
    for name, cls in registered(kind).items():
        assert dataclasses.is_dataclass(cls), name
        fields = [field.name for field in dataclasses.fields(cls) if field.init]
        assert fields == list(inspect.signature(cls).parameters), name


def test_sampler_signatures_are_kept():
    def signature(cls):
        return [(p.name, p.default, p.kind) for p in inspect.signature(cls).parameters.values()]

    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert signature(Uniform) == []
    assert signature(Masked) == [("min_fraction", 0.5, keyword), ("source", "mask", keyword),
                                 ("unlabelled", 0, keyword)]
    assert signature(Balanced) == [("classes", "boundary", keyword), ("priors", None, keyword),
                                   ("thickness", 1, keyword), ("in_plane", False, keyword)]
    assert signature(Tiled) == [("stride", None, keyword), ("last", "keep", keyword)]
    assert {name: cls for name, cls in registered("sampler").items()} == \
        {"balanced": Balanced, "masked": Masked, "tiled": Tiled, "uniform": Uniform}


def test_samplers_answer_the_report_through_the_protocol(rng):
    """``emfast check`` asks every sampler for its class counts and index bytes; one that keeps neither (a user's
    subclass of Sampler) answers None and 0."""
    class Plain(Sampler):
        def sample(self, uniforms, extents, epoch, index):
            raise AssertionError("not drawn")

    labels = blocky_labels(rng, (12, 20, 20))
    regions = [region("a", labels=labels, mask=(labels > 1).astype(np.uint8))]
    extents = np.asarray([[4, 6, 6]])
    for sampler in (Plain(), Uniform(), Tiled()):
        sampler.bind(regions, extents, 2)
        assert sampler.class_counts() is None and sampler.index_nbytes == 0
    masked = Masked(0.25)
    masked.bind(regions, extents, 2)
    assert masked.class_counts() is None and masked.index_nbytes > 0
    balanced = Balanced()
    balanced.bind(regions, extents, 2)
    counts = balanced.class_counts()["a"]
    assert set(counts) == {"boundary", "interior"} and balanced.index_nbytes > 0
    half = (extents[0] - 1) // 2
    centres = labels[half[0]:labels.shape[0] - extents[0, 0] + half[0] + 1,
                     half[1]:labels.shape[1] - extents[0, 1] + half[1] + 1,
                     half[2]:labels.shape[2] - extents[0, 2] + half[2] + 1]
    assert sum(counts.values()) == centres.size


def test_sampler_warnings_point_at_the_users_loader_call(rng):
    """They pointed at emfast's own pipeline/_loader.py, where no user can find or filter them."""
    raw = rng.integers(0, 256, (8, 16, 16), dtype=np.uint8)
    labels = np.ones((8, 16, 16), np.uint64)  # one id: no boundary anywhere
    with pytest.warns(UserWarning, match="class 'boundary' is absent") as caught:
        ef.Loader(raw, labels, patch=(4, 8, 8), sampler=Balanced("boundary")).close()
    assert [record.filename for record in caught] == [__file__]
