"""The blending kernels (emfast._core.blend) against NumPy on random data: contiguous rows (the vectorised loops)
and strided views (flips, transposes, sub-boxes of a block), every prediction dtype; and the exactness the
per-axis weights promise: predictions that agree blend to themselves bit for bit."""
import numpy as np
import pytest

from emfast._core.blend import TileBlends, blend_add, blend_finish


def _weights(rng, shape):
    """Per-axis weights as predict uses them: multiples of 1/256 in [1/256, 1]."""
    return [rng.integers(1, 257, n) / 256 for n in shape]


def _product(axes):
    wz, wy, wx = axes
    return (wz[:, None, None] * wy[None, :, None]) * wx[None, None, :]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("first", [((0, 0, 0), (0, 0, 0)), ((1, 2, 4), (5, 7, 9)), ((0, 0, 0), (5, 9, 13))])
def test_blend_add_matches_numpy(dtype, layout, first):
    rng = np.random.default_rng(3)
    shape = (5, 9, 13)
    sums = rng.random((2, 7, 11, 17))
    prediction = rng.random((2,) + shape).astype(dtype)
    axes = _weights(rng, shape)
    box = (slice(1, 6), slice(2, 11), slice(3, 16))
    if layout == "strided":  # a flipped, transposed prediction and weights read through a stride
        prediction = np.ascontiguousarray(prediction.transpose(0, 3, 2, 1)[..., ::-1]).transpose(0, 3, 2, 1)[
            :, :, ::-1]
        axes = [np.repeat(w, 2)[::2] for w in axes]
    expected = sums.copy()
    term = _product(axes) * prediction.astype(np.float64)
    expected[(slice(None),) + box] += term
    (z0, y0, x0), (z1, y1, x1) = first
    target = expected[(slice(None),) + box]
    target[:, z0:z1, y0:y1, x0:x1] = term[:, z0:z1, y0:y1, x0:x1]
    blend_add(sums[(slice(None),) + box], axes, prediction, first)
    np.testing.assert_array_equal(sums, expected)


def test_blend_add_refuses_weights_of_the_wrong_length():
    sums = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"weights must be three 1-D arrays of lengths \(2, 3, 4\)"):
        blend_add(sums, [np.ones(2), np.ones(3), np.ones(5)], np.zeros((1, 2, 3, 4), np.float32))


def _group(rng, dtype, transposed=False):
    """Overlapping tiles of a block as (sums box, weights, prediction, first box, whole tile to keep or None)."""
    tiles = []
    for start in [(0, 1, 2), (2, 3, 0), (1, 0, 5), (3, 6, 4)]:
        shape = (4, 5, 6)
        box = tuple(slice(s, s + n) for s, n in zip(start, shape))
        whole = rng.random((2, 4, 8, 7)).astype(dtype)  # the tile the model returned, larger than its box here
        prediction = whole[:, :, 1:6, :6]
        if transposed:
            prediction = np.ascontiguousarray(whole[:, :, :6, :5].transpose(0, 1, 3, 2))[..., ::-1]
        first = ((1, 0, 2), (3, 5, 6)) if start[1] % 2 else ((0, 0, 0), (0, 0, 0))
        tiles.append((box, _weights(rng, shape), prediction, first, whole if start[0] != 1 else None))
    return tiles


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("transposed", [False, True])
def test_tile_blends_in_parts_equal_numpy_tile_by_tile(dtype, parts, transposed):
    """Each part blends its rows of every tile, in order; together they make NumPy's bytes for the tiles blended
    one after another, whatever ``parts``, and the kept copies equal the tiles."""
    rng = np.random.default_rng(parts)
    group = _group(rng, dtype, transposed)
    start = rng.random((2, 8, 13, 12))
    expected, sums = start.copy(), start.copy()
    for box, axes, prediction, first, _ in group:  # NumPy, tile by tile
        term = _product(axes) * prediction.astype(np.float64)
        target = expected[(slice(None),) + box]
        target += term
        (z0, y0, x0), (z1, y1, x1) = first
        target[:, z0:z1, y0:y1, x0:x1] = term[:, z0:z1, y0:y1, x0:x1]
    tiles = TileBlends()
    keeps = []
    for box, axes, prediction, first, whole in group:
        keep = None if whole is None else np.full_like(whole, np.nan)
        keeps.append(keep)
        tiles.add(sums[(slice(None),) + box], axes, prediction, first, box[1].start, keep, whole)
    assert len(tiles) == len(group)
    for part in reversed(range(parts)):  # any order: the parts write disjoint rows
        tiles.run(part, parts)
    np.testing.assert_array_equal(sums, expected)
    for (*_, whole), keep in zip(group, keeps):
        if whole is not None:
            np.testing.assert_array_equal(keep, whole)


def test_a_part_writes_only_its_rows_of_the_block():
    """Part 1 of 3 touches the block rows r with r % 3 == 1 (counted from the block's start, not the tile's), and
    copies the kept tile's own rows y % 3 == 1."""
    rng = np.random.default_rng(7)
    sums = np.zeros((1, 3, 10, 4))
    whole = rng.random((1, 3, 6, 4)).astype(np.float32)
    keep = np.zeros_like(whole)
    tiles = TileBlends()
    tiles.add(sums[:, :, 2:8], _weights(rng, (3, 6, 4)), whole, row=2, keep=keep, kept_from=whole)
    tiles.run(1, 3)
    assert set(np.flatnonzero(sums.any(axis=(0, 1, 3)))) == {4, 7}
    assert set(np.flatnonzero(keep.any(axis=(0, 1, 3)))) == {1, 4}


def test_tile_blends_refuse_bad_input():
    tiles = TileBlends()
    sums, prediction = np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4), np.float32)
    ones = [np.ones(2), np.ones(3), np.ones(4)]
    with pytest.raises(ValueError, match="keep must be a writeable 4-D array of kept_from's shape and dtype"):
        tiles.add(sums, ones, prediction, keep=np.zeros((1, 2, 3, 4), np.float64), kept_from=prediction)
    with pytest.raises(ValueError, match="shapes differ"):
        tiles.add(sums, ones, prediction[:, :1])
    with pytest.raises(TypeError, match="sums must be a writeable 4-D float64 array"):
        tiles.add(sums.astype(np.float32), ones, prediction)
    with pytest.raises(ValueError, match=r"part must be in \[0, parts\), parts at most 65536, got part 3 of 3"):
        tiles.run(3, 3)
    with pytest.raises(ValueError, match=r"parts at most 65536, got part 0 of 9223372036854775807"):
        tiles.run(0, 2**63 - 1)  # the kernel's row steps overflowed: reads and writes outside the tile
    with pytest.raises(ValueError, match=r"row must be in \[0, 2\*\*62\), got -1"):
        tiles.add(sums, ones, prediction, row=-1)
    assert len(tiles) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8])
def test_blend_finish_divides_by_the_product_of_the_totals_and_converts(dtype):
    rng = np.random.default_rng(4)
    sums = rng.random((3, 4, 5, 6))
    totals = [rng.random(n) + 0.5 for n in (4, 5, 6)]
    out = np.empty(sums.shape, dtype)
    divided = sums / _product([3 * totals[0], totals[1], totals[2]])
    if dtype == np.uint8:
        expected = np.rint(np.clip(divided, 0, 1) * 255).astype(np.uint8)
    else:
        expected = divided.astype(np.float32).astype(dtype)
    assert blend_finish(sums, totals, 3, out) == 0
    np.testing.assert_array_equal(out, expected)


def test_agreeing_predictions_blend_to_themselves_bit_for_bit():
    """Tiles at random offsets with random per-axis weights, and two variants each, over one float32 value
    field: sums set where each voxel is first reached, then divided by the product of the per-axis totals."""
    rng = np.random.default_rng(5)
    shape, size = (12, 14, 16), (6, 7, 8)
    field = (rng.random((1,) + shape) * rng.choice([1e-6, 1.0, 300.0], (1,) + shape)).astype(np.float32)
    sums = np.full((1,) + shape, np.nan)
    profiles = _weights(rng, size)
    starts = [np.append(np.arange(0, n - s, s // 2), n - s) for n, s in zip(shape, size)]  # as TilePlan
    totals = [np.zeros(n) for n in shape]
    for axis in range(3):
        for start in starts[axis]:
            totals[axis][start:start + size[axis]] += profiles[axis]
    for tile in np.stack(np.meshgrid(*starts, indexing="ij"), -1).reshape(-1, 3):
        box = tuple(slice(t, t + s) for t, s in zip(tile, size))
        previous = [s[np.searchsorted(s, t) - 1] + n if t > s[0] else t for s, t, n in zip(starts, tile, size)]
        first = ([p - t for p, t in zip(previous, tile)], list(size))
        for variant in range(2):
            blend_add(sums[(slice(None),) + box], profiles, field[(slice(None),) + box],
                      first if variant == 0 else ((0, 0, 0), (0, 0, 0)))
    assert not np.isnan(sums).any()
    np.testing.assert_array_equal(sums, field * _product([2 * totals[0], totals[1], totals[2]]))  # no rounding
    out = np.empty(sums.shape, np.float32)
    blend_finish(sums, totals, 2, out)
    np.testing.assert_array_equal(out, field)


def test_blend_finish_rounds_float16_once_as_numpy_does():
    """Values just past a float16 rounding tie, by less than float32 resolves: rounding through float32 lands on
    the tie and breaks it to even, one float16 step from NumPy's single rounding of the float64 value."""
    rng = np.random.default_rng(11)
    below = rng.uniform(-60000, 60000, 4000).astype(np.float16)
    above = np.nextafter(below, np.where(below < 0, np.float16(-np.inf), np.float16(np.inf)))
    ties = (below.astype(np.float64) + above.astype(np.float64)) / 2
    nudged = ties * (1 + np.sign(rng.random(ties.size) - 0.5) * 2.0 ** -40)
    values = np.concatenate([nudged, rng.uniform(-70000, 70000, 4000), rng.uniform(-1e-4, 1e-4, 4000),
                             [np.nan, np.inf, -np.inf, 0.0, -0.0, 65520.0, 65519.99999, 2.0 ** -25,
                              2.0 ** -25 * (1 + 2.0 ** -40)]])
    sums = values.reshape(1, 1, 1, -1)
    totals = [np.ones(1), np.ones(1), np.ones(values.size)]
    out = np.empty(sums.shape, np.float16)
    assert blend_finish(sums, totals, 1, out) == 3  # NaN and the two infinities
    with np.errstate(over="ignore"):  # beyond float16's range: infinity, as the kernel gives
        expected = values.astype(np.float16).reshape(sums.shape)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def _through_every_path():
    """Blends and conversions of random data through each path of the kernels (prediction and output dtypes, first
    boxes, copies of kept tiles, rows in parts, strided predictions; NaN, infinities, values outside [0, 1] and
    near float16's rounding ties), as a dict of arrays."""
    rng = np.random.default_rng(17)
    results = {}
    for dtype in (np.float16, np.float32, np.float64):
        for transposed in (False, True):
            for parts in (1, 3):
                group = _group(rng, dtype, transposed)
                sums = rng.random((2, 8, 13, 12))
                tiles, keeps = TileBlends(), []
                for box, axes, prediction, first, whole in group:
                    keeps.append(None if whole is None else np.zeros_like(whole))
                    tiles.add(sums[(slice(None),) + box], axes, prediction, first, box[1].start, keeps[-1], whole)
                for part in range(parts):
                    tiles.run(part, parts)
                name = f"{np.dtype(dtype).name} transposed={transposed} parts={parts}"
                results[f"sums {name}"] = sums
                results.update({f"kept {i} {name}": keep for i, keep in enumerate(keeps) if keep is not None})
    values = np.concatenate([rng.uniform(-2, 3, 3000), rng.uniform(-70000, 70000, 3000), [np.nan, np.inf, -np.inf]])
    sums = np.resize(values * rng.choice([1e-3, 1.0, 1e4], values.size), (2, 3, 41, 37))
    totals = [rng.integers(1, 257, n) / 256 for n in sums.shape[1:]]
    for dtype in (np.float32, np.float16, np.uint8):
        out = np.empty(sums.shape, dtype)
        results[f"finish {np.dtype(dtype).name}"] = out
        results[f"non-finite {np.dtype(dtype).name}"] = np.array(blend_finish(sums, totals, 3, out))
    return results


def test_the_avx2_build_and_the_baseline_give_the_same_bits(tmp_path):
    """The kernels run their AVX2 build where the CPU has it; EMFAST_NO_AVX2 (here in a process of its own, read
    when the module is imported) keeps the baseline. Both must write the same bytes on every path."""
    import os
    import subprocess
    import sys

    from emfast._core import blend, warp

    here = os.path.dirname(os.path.abspath(__file__))
    path = tmp_path / "baseline.npz"
    script = (f"import sys; sys.path.insert(0, {here!r}); import numpy as np; from emfast._core import blend; "
              f"from test_blend_kernel import _through_every_path; assert not blend.uses_avx2(); "
              f"np.savez({str(path)!r}, **_through_every_path())")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, env=dict(os.environ, EMFAST_NO_AVX2="1"))
    results = _through_every_path()
    with np.load(path) as baseline:
        assert sorted(baseline.files) == sorted(results)
        for name, array in results.items():
            assert array.tobytes() == baseline[name].tobytes(), name
    # the same switch as the warp samplers' (the CPU, and EMFAST_NO_AVX2 at import); a 32-bit build whose
    # arithmetic is x87's (80 bits) has no AVX2 build of the blending
    assert blend.uses_avx2() == warp.uses_avx2() if sys.maxsize > 2 ** 32 else warp.uses_avx2() or not blend.uses_avx2()
