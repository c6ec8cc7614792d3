"""The blending kernels (emfast._core.blend) against NumPy on random data: contiguous rows (the vectorised loops)
and strided views (flips, transposes, sub-boxes of a block), every prediction dtype."""
import numpy as np
import pytest

from emfast._core.blend import blend_add, blend_finish


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "constant weight"])
def test_blend_add_matches_numpy(dtype, layout):
    rng = np.random.default_rng(3)
    shape = (5, 9, 13)
    sums = rng.random((2, 7, 11, 17))
    totals = rng.random((7, 11, 17)).astype(np.float32)
    prediction = rng.random((2,) + shape).astype(dtype)
    weight = (np.rint(rng.random(shape) * 256) / 256).astype(np.float32)
    box = (slice(1, 6), slice(2, 11), slice(3, 16))
    if layout == "strided":  # a flipped prediction, weights read from a transposed array, totals every other x
        prediction = np.ascontiguousarray(prediction[..., ::-1])[..., ::-1]
        weight = np.ascontiguousarray(weight.transpose(2, 1, 0)).transpose(2, 1, 0)
        totals = rng.random((7, 11, 34)).astype(np.float32)[..., ::2]
    elif layout == "constant weight":
        weight = np.broadcast_to(np.float32(0.75), shape)
    expected_sums, expected_totals = sums.copy(), totals.copy()
    expected_sums[(slice(None),) + box] += weight.astype(np.float64) * prediction.astype(np.float64)
    expected_totals[box] += weight
    blend_add(sums[(slice(None),) + box], totals[box], weight, prediction)
    np.testing.assert_array_equal(sums, expected_sums)
    np.testing.assert_array_equal(totals, expected_totals)


def test_blend_finish_divides_and_converts():
    rng = np.random.default_rng(4)
    sums, totals = rng.random((3, 4, 5, 6)), (rng.random((4, 5, 6)) + 0.5).astype(np.float32)
    out = np.empty(sums.shape, np.float32)
    expected = (sums / totals.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(blend_finish(sums, totals, out), expected)
