"""The compiled kernels against NumPy references on random data."""

import numpy as np
import pytest

import emfast as ef

from emfast._core import gather as _kernels
from emfast._core import random as _random
from reference import ANISOTROPIC, assert_releases_gil, ISOTROPIC, converted, extent_of, random_corner, random_volume, window

PATCH = (5, 19, 23)  # odd, unequal sizes catch axis mix-ups and SIMD tail handling
RAW_DTYPES = [np.uint8, np.uint16, np.float32, np.int8, np.int16, np.uint32, np.float16, np.float64]
LABEL_DTYPES = [np.uint8, np.uint16, np.uint32, np.uint64, np.int64, np.int32]


def draw_batch(rng, source_shape, transforms, patch=PATCH):
    perms, flips, corners = [], [], []
    for perm, flip in transforms:
        perms.append(perm)
        flips.append(flip)
        corners.append(random_corner(rng, source_shape, extent_of(patch, perm)))
    return corners, perms, flips


@pytest.mark.parametrize("src_dtype", RAW_DTYPES)
@pytest.mark.parametrize("out_dtype", [np.float32, np.float16])
def test_convert_matches_numpy_for_all_48_transforms(rng, src_dtype, out_dtype):
    source = random_volume(rng, (2, 30, 40, 36), src_dtype)
    corners, perms, flips = draw_batch(rng, source.shape[1:], ISOTROPIC)
    count = len(ISOTROPIC)
    scale = rng.normal(size=count).astype(np.float32) / 100
    shift = rng.normal(size=count).astype(np.float32)
    out = np.empty((count, 2) + PATCH, dtype=out_dtype)
    _kernels.gather_convert([source] * count, corners, perms, flips, scale, shift, out)
    for n in range(count):
        expected = converted(source, corners[n], PATCH, perms[n], flips[n], scale[n], shift[n], out_dtype)
        bits = f"u{out.itemsize}"  # compare bits, so that -0.0 != 0.0 and NaN payloads count
        np.testing.assert_array_equal(out[n].view(bits), expected.view(bits), err_msg=f"example {n}")


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
def test_copy_matches_numpy_for_all_48_transforms(rng, dtype):
    source = random_volume(rng, (1, 30, 40, 36), dtype)
    corners, perms, flips = draw_batch(rng, source.shape[1:], ISOTROPIC)
    out = np.empty((len(ISOTROPIC), 1) + PATCH, dtype=dtype)
    _kernels.gather_copy([source] * len(ISOTROPIC), corners, perms, flips, out)
    for n in range(len(ISOTROPIC)):
        np.testing.assert_array_equal(out[n], window(source, corners[n], PATCH, perms[n], flips[n]))


@pytest.mark.parametrize("patch", [(4, 128, 128), (3, 70, 65), (2, 1, 33), (2, 33, 1)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint64])
def test_simd_block_sizes_and_tails(rng, patch, dtype):
    """Sizes around the 16-byte and cache-line blocks of the transposer and reverser, for 1- and 8-byte data."""
    source = random_volume(rng, (1, 8, 150, 140), dtype)
    corners, perms, flips = draw_batch(rng, source.shape[1:], ANISOTROPIC, patch)
    out = np.empty((len(ANISOTROPIC), 1) + patch, dtype=np.float32 if dtype == np.uint8 else dtype)
    if dtype == np.uint8:
        ones, zeros = np.ones(len(ANISOTROPIC), np.float32), np.zeros(len(ANISOTROPIC), np.float32)
        _kernels.gather_convert([source] * len(ANISOTROPIC), corners, perms, flips, ones, zeros, out)
    else:
        _kernels.gather_copy([source] * len(ANISOTROPIC), corners, perms, flips, out)
    for n in range(len(ANISOTROPIC)):
        expected = window(source, corners[n], patch, perms[n], flips[n])
        np.testing.assert_array_equal(out[n], expected.astype(out.dtype))


def test_sources_with_any_strides_and_one_per_example(rng):
    """Views with negative, non-contiguous strides, Fortran order and different sources per example."""
    base = random_volume(rng, (2, 40, 50, 60), np.uint16)
    sources = [base[:, ::-1, 5:, :], np.asfortranarray(base), base[:, ::2, :, ::-2],
               random_volume(rng, (2, 30, 30, 30), np.uint16)]
    transforms = ANISOTROPIC[::4]
    corners, perms, flips = [], [], []
    for source, (perm, flip) in zip(sources, transforms):
        perms.append(perm)
        flips.append(flip)
        corners.append(random_corner(rng, source.shape[1:], extent_of(PATCH, perm)))
    out = np.empty((4, 2) + PATCH, dtype=np.uint16)
    _kernels.gather_copy(sources, corners, perms, flips, out)
    for n in range(4):
        np.testing.assert_array_equal(out[n], window(sources[n], corners[n], PATCH, perms[n], flips[n]))


def test_float_to_half_matches_numpy_rounding(rng):
    bits = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x7F801000,
                        0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x38800000, 0x387FFFFF, 0x33000000,
                        0x33000001, 0x32FFFFFF, 0x00000001, 0x3F800000], dtype=np.uint32)
    # every halfway case of the normal and subnormal ranges
    halfway = ((np.arange(0x3880, 0x4780, dtype=np.uint32) << 16) | 0x1000)
    values = np.concatenate([bits, special, halfway]).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = values.astype(np.float16)
    np.testing.assert_array_equal(_kernels.float_to_half(values).view(np.uint16), expected.view(np.uint16))


def test_out_of_bounds_window_is_refused(rng):
    source = random_volume(rng, (1, 10, 20, 20), np.uint8)
    out = np.empty((1, 1, 4, 8, 8), np.float32)
    with pytest.raises(IndexError, match="axis y"):
        _kernels.gather_convert([source], [[0, 15, 0]], [[0, 1, 2]], [[0, 0, 0]], [1], [0], out)
    with pytest.raises(IndexError, match="axis z"):
        _kernels.gather_convert([source], [[-1, 0, 0]], [[0, 1, 2]], [[0, 0, 0]], [1], [0], out)
    # a transposed window is checked with its permuted extent: output y (16) reads source x (12)
    narrow = random_volume(rng, (1, 10, 20, 12), np.uint8)
    tall = np.empty((1, 1, 4, 16, 4), np.float32)
    _kernels.gather_convert([narrow], [[0, 0, 0]], [[0, 1, 2]], [[0, 0, 0]], [1], [0], tall)
    with pytest.raises(IndexError, match="axis x"):
        _kernels.gather_convert([narrow], [[0, 0, 0]], [[0, 2, 1]], [[0, 0, 0]], [1], [0], tall)


def test_bad_arguments_are_refused(rng):
    source = random_volume(rng, (1, 10, 20, 20), np.uint8)
    out = np.empty((1, 1, 4, 8, 8), np.float32)
    ok = dict(corners=[[0, 0, 0]], perms=[[0, 1, 2]], flips=[[0, 0, 0]])
    with pytest.raises(ValueError, match="permutation"):
        _kernels.gather_convert([source], ok["corners"], [[0, 0, 2]], ok["flips"], [1], [0], out)
    with pytest.raises(ValueError, match="4-D"):
        _kernels.gather_convert([source[0]], **ok, scale=[1], shift=[0], out=out)
    with pytest.raises(TypeError, match="dtype int64; supported: uint8, uint16, float32"):
        _kernels.gather_convert([source.astype(np.int64)], **ok, scale=[1], shift=[0], out=out)
    with pytest.raises(TypeError, match="out has dtype float64; supported: float32, float16"):
        _kernels.gather_convert([source], **ok, scale=[1], shift=[0], out=out.astype(np.float64))
    with pytest.raises(TypeError, match="output dtype"):
        _kernels.gather_copy([source], **ok, out=out)
    with pytest.raises(ValueError, match="C-contiguous"):
        _kernels.gather_copy([source], **ok, out=np.empty((1, 1, 4, 8, 16), np.uint8)[..., ::2])
    with pytest.raises(ValueError, match=r"shape \(1, 3\)"):
        _kernels.gather_copy([source], [[0, 0]], ok["perms"], ok["flips"], np.empty((1, 1, 4, 8, 8), np.uint8))


def test_kernel_releases_the_gil(rng):
    """While one thread runs a long kernel, another keeps running Python code."""
    source = random_volume(rng, (1, 64, 256, 256), np.uint8)
    count = 64
    out = np.empty((count, 1, 32, 128, 128), np.float32)
    args = ([source] * count, [[0, 0, 0]] * count, [[0, 2, 1]] * count, [[1, 1, 1]] * count,
            np.ones(count, np.float32), np.zeros(count, np.float32), out)
    assert_releases_gil(_kernels.gather_convert, *args)


def test_philox_matches_numpy():
    key = np.array([2**64 - 1, 12345], dtype=np.uint64)
    for counter in ([0, 0, 0, 0], [5, 6, 7, 8], [2**64 - 1, 3, 0, 1]):
        counter = np.array(counter, dtype=np.uint64)
        expected = np.random.Philox(key=key, counter=counter).random_raw(4)
        # NumPy increments the counter before producing its first block
        bumped = [int(c) for c in counter]
        for i in range(4):
            bumped[i] = (bumped[i] + 1) % 2**64
            if bumped[i] != 0:
                break
        np.testing.assert_array_equal(_random.philox4x64([int(k) for k in key], bumped), expected)


def test_uniform_batch_is_keyed_and_uniform():
    a = _random.uniform_batch(1, 2, 3, 4, 8, 7)
    assert a.shape == (8, 7) and a.min() >= 0 and a.max() < 1
    np.testing.assert_array_equal(a, _random.uniform_batch(1, 2, 3, 4, 8, 7))
    # a prefix of draws and of examples is the same whatever the total asked for
    np.testing.assert_array_equal(a[:3, :5], _random.uniform_batch(1, 2, 3, 4, 3, 5))
    for changed in [(9, 2, 3, 4), (1, 9, 3, 4), (1, 2, 9, 4), (1, 2, 3, 9)]:
        assert not np.array_equal(a, _random.uniform_batch(*changed, 8, 7))
    big = _random.uniform_batch(7, 7, 7, 7, 1000, 100).ravel()
    histogram = np.histogram(big, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(histogram - 10000) < 500)  # ~5 sigma


def test_huge_corner_does_not_overflow_the_bounds_check(rng):
    source = random_volume(rng, (1, 4, 4, 4), np.uint8)
    out = np.empty((1, 1, 4, 4, 4), np.float32)
    with pytest.raises(IndexError, match=r"spans \[9223372036854775806, 9223372036854775810\) along axis x"):
        _kernels.gather_convert([source], [[0, 0, 2**63 - 2]], [[0, 1, 2]], [[0, 0, 0]], [1], [0], out)


def test_object_and_byte_swapped_arrays_are_refused():
    objects = np.empty((1, 2, 2, 2), dtype=object)
    with pytest.raises(TypeError, match="object"):
        _kernels.gather_copy([objects], [[0, 0, 0]], [[0, 1, 2]], [[0, 0, 0]], np.empty((1, 1, 2, 2, 2), object))
    swapped = np.zeros((1, 2, 2, 2), dtype=">u2")
    with pytest.raises(TypeError, match="native-endian"):
        _kernels.gather_copy([swapped], [[0, 0, 0]], [[0, 1, 2]], [[0, 0, 0]], np.empty((1, 1, 2, 2, 2), ">u2"))


def test_arrays_not_aligned_to_their_elements_are_refused():
    """A float32 view at an odd byte offset reached the kernels, which load whole elements (undefined behaviour,
    reported by UBSan)."""
    odd = np.frombuffer(np.zeros(4 * 64 + 1, np.uint8).data, np.float32, count=64, offset=1).reshape(1, 4, 4, 4)
    assert not odd.flags.aligned
    with pytest.raises(TypeError, match="not aligned to its 4-byte elements"):
        _kernels.gather_convert([odd], [[0, 0, 0]], [[0, 1, 2]], [[0, 0, 0]], [1], [0],
                                np.empty((1, 1, 4, 4, 4), np.float32))
    with pytest.raises(TypeError, match="not aligned to its 4-byte elements.*np.array"):
        ef.Volume.from_array(odd[0], name="odd")
    with pytest.raises(TypeError, match="not aligned to its 4-byte elements"):
        ef.Loader(odd[0], patch=(2, 2, 2), batch_size=1, threads=1)
    labels = np.frombuffer(np.zeros(8 * 64 + 1, np.uint8).data, np.uint64, count=64, offset=1).reshape(1, 1, 4, 4, 4)
    for target in (ef.targets.Affinities(), ef.targets.Boundaries(), ef.targets.Foreground()):
        with pytest.raises(TypeError, match="labels is not aligned to its 8-byte elements"):
            ef.targets.compute_targets(labels, [target])


class Liar(np.ndarray):
    """An ndarray subclass that misreports its shape."""

    @property
    def shape(self):
        return (1, 4096, 4096, 4096)


def test_subclasses_cannot_misreport_their_geometry(rng):
    source = random_volume(rng, (1, 4, 4, 4), np.uint8).view(Liar)
    out = np.empty((1, 1, 2, 2, 2), np.uint8)
    with pytest.raises(IndexError):
        _kernels.gather_copy([source], [[4000, 0, 0]], [[0, 1, 2]], [[0, 0, 0]], out)
    _kernels.gather_copy([source], [[2, 2, 2]], [[0, 1, 2]], [[0, 0, 0]], out)
    np.testing.assert_array_equal(out[0], np.asarray(source)[:, 2:, 2:, 2:])
