"""Per-example intensity augmentations (gamma, contrast, noise, blur) against NumPy/SciPy references."""
import numpy as np
import pytest
from scipy import ndimage, stats

import emfast as ef
import emfast.augment as ei
from emfast._core import intensity as _intensity
from emfast.augment import Params, Patches, resolve
from reference import assert_releases_gil

RAW_DTYPES = [np.float32, np.float16]
SHAPE = (5, 2, 3, 9, 37)  # odd extents; x long enough for vector loops and their tails


def random_raw(rng, dtype, shape=SHAPE):
    """Normalised raw with some values outside [0, 1] (as after x * scale + shift with a [-1, 1] range)."""
    return (rng.random(shape, dtype=np.float32) * 1.4 - 0.2).astype(dtype)


def run(augmentation, raw, uniforms, valid=None):
    """apply() then process() on a copy of raw; returns (output, record)."""
    record = augmentation.apply(uniforms, Params.identity(len(uniforms)))
    out = raw.copy()
    augmentation.process(record, Patches(raw=out, valid=len(raw) if valid is None else valid))
    return out, record


def touched(record, valid):
    return np.flatnonzero(record.fired[:valid])


def assert_untouched(out, raw, examples):
    """Examples not listed are bit for bit the input."""
    keep = np.setdiff1d(np.arange(len(raw)), examples)
    np.testing.assert_array_equal(out[keep].view(np.uint8), raw[keep].view(np.uint8))


def lane_mean(x):
    """The kernels' block mean: four interleaved lanes summed in order in float64, (s0 + s1) + (s2 + s3)."""
    flat = x.astype(np.float32).ravel().astype(np.float64)
    padded = np.concatenate([flat, np.zeros(-len(flat) % 4)]).reshape(-1, 4)
    s = np.cumsum(padded, axis=0)[-1]
    return np.float32(((s[0] + s[1]) + (s[2] + s[3])) / len(flat))


@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_gamma_matches_numpy_within_one_ulp(rng, dtype):
    raw = random_raw(rng, dtype)
    gamma = ei.Gamma(range=(0.5, 2.0), p=0.6)
    uniforms = rng.random((len(raw), gamma.draws))
    out, record = run(gamma, raw, uniforms, valid=4)
    examples = touched(record, 4)
    assert 0 < len(examples) < len(raw)
    for n in examples:
        x = raw[n].astype(np.float32)
        expected = (np.sign(x) * np.abs(x) ** np.float32(record.value[n])).astype(dtype)
        np.testing.assert_array_max_ulp(out[n], expected, maxulp=1)
    assert_untouched(out, raw, examples)


@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_contrast_is_exact(rng, dtype):
    raw = random_raw(rng, dtype)
    contrast = ei.Contrast(range=(0.5, 1.5), p=0.6)
    out, record = run(contrast, raw, rng.random((len(raw), contrast.draws)))
    examples = touched(record, len(raw))
    assert 0 < len(examples) < len(raw)
    for n in examples:
        x = raw[n].astype(np.float32)
        mean, factor = lane_mean(x), np.float32(record.value[n])
        np.testing.assert_array_equal(out[n], ((x - mean) * factor + mean).astype(dtype))
    assert_untouched(out, raw, examples)


def test_contrast_mean_is_the_window_mean(rng):
    raw = random_raw(rng, np.float32)
    out, record = run(ei.Contrast(range=(0.3, 0.3), p=1.0), raw, rng.random((len(raw), 2)))
    np.testing.assert_allclose(out.mean(axis=(1, 2, 3, 4)), raw.mean(axis=(1, 2, 3, 4)), atol=1e-6)
    np.testing.assert_allclose(out.std(axis=(1, 2, 3, 4)), 0.3 * raw.std(axis=(1, 2, 3, 4)), rtol=1e-5)


@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_noise_statistics(dtype):
    raw = np.zeros((2, 1, 16, 128, 128), dtype)
    sigmas, keys = [0.1, 0.03], [12345, 2**63 + 7]
    _intensity.noise(raw, [0, 1], raw[0].size, sigmas, keys)
    for n, sigma in enumerate(sigmas):
        g = raw[n].astype(np.float64).ravel() / sigma
        assert abs(g.mean()) < 5 / np.sqrt(g.size)
        assert abs(g.std() - 1) < (0.01 if dtype == np.float32 else 0.02)
        if dtype == np.float32:
            assert stats.kstest(g[:100000], "norm").pvalue > 1e-3
            assert abs(np.corrcoef(g[:-1], g[1:])[0, 1]) < 0.01  # neighbours independent
            assert abs(np.corrcoef(g[:-256], g[256:])[0, 1]) < 0.01  # the cosine/sine halves of a group


def test_noise_depends_only_on_the_key(rng):
    raw = random_raw(rng, np.float32, (3, 1, 4, 16, 40))
    noise = ei.Noise(sigma=(0.05, 0.1), p=1.0)
    uniforms = rng.random((3, noise.draws))
    first, record = run(noise, raw, uniforms)
    again, _ = run(noise, raw, uniforms)
    np.testing.assert_array_equal(first, again)
    assert len(set(record.keys.tolist())) == 3
    # the same key on another example slot and another batch gives the same noise
    alone = raw[2:3].copy()
    _intensity.noise(alone, [0], alone.size, record.value[2:3], record.keys[2:3])
    np.testing.assert_array_equal(alone[0], first[2])
    other = raw[2:3].copy()
    _intensity.noise(other, [0], other.size, record.value[2:3], record.keys[2:3] + np.uint64(1))
    assert np.abs(other - first[2:3]).mean() > 0.01


def test_noise_float16_is_float32_noise_rounded(rng):
    raw = random_raw(rng, np.float16, (1, 1, 3, 40, 70))
    wide = raw.astype(np.float32)
    _intensity.noise(raw, [0], raw.size, [0.1], [99])
    _intensity.noise(wide, [0], wide.size, [0.1], [99])
    np.testing.assert_array_equal(raw, wide.astype(np.float16))


@pytest.mark.parametrize("per_section", [True, False])
@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_blur_matches_scipy(rng, per_section, dtype):
    raw = random_raw(rng, dtype)
    blur = ei.Blur(sigma=(0.2, 2.0), p=0.7, per_section=per_section)
    out, record = run(blur, raw, rng.random((len(raw), blur.draws)))
    examples = touched(record, len(raw))
    assert 0 < len(examples) < len(raw)
    for n in examples:
        s = record.value[n]
        for c in range(raw.shape[1]):
            expected = ndimage.gaussian_filter(raw[n, c].astype(np.float32), (0 if per_section else s, s, s),
                                               mode="reflect", truncate=3.0)
            # float16 rounds the float32 result once: at most half an ulp of 2**-11 for values below 2
            np.testing.assert_allclose(out[n, c].astype(np.float32), expected, rtol=0,
                                       atol=1e-5 if dtype == np.float32 else 6e-4)
    assert_untouched(out, raw, examples)


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 2), (3, 1, 7), (1, 5, 1)])
def test_blur_reflects_short_lines_like_scipy(rng, shape):
    """Lines shorter than the kernel radius are mirrored again and again (period 2n), as in SciPy."""
    raw = random_raw(rng, np.float32, (1, 1) + shape)
    for sigma in (0.1, 0.8, 2.5):
        out = raw.copy()
        _intensity.blur(out, [0], shape, [sigma], False, 3.0)
        expected = ndimage.gaussian_filter(raw[0, 0], sigma, mode="reflect", truncate=3.0)
        np.testing.assert_allclose(out[0, 0], expected, rtol=0, atol=1e-5)


def test_a_blur_far_wider_than_the_window_is_refused_and_the_kernel_bounds_its_reach():
    """Blur(sigma=(1e18, 1e18)) was accepted and aborted the process (std::length_error out of the kernel); a
    kernel longer than a small window is fine (FULL's blur on (4, 4) sections)."""
    raw = np.zeros((16, 64, 64), np.uint8)
    with pytest.raises(ValueError, match=r"Blur: sigma up to 1e\+18 voxels reaches .* more than 4 times the longest "
                                         r"side of the raw section \(32, 32\).* below 42\.8333"):
        ef.Loader(raw, patch=(8, 32, 32), batch_size=1, threads=1, augment=[ei.Blur(sigma=(1e18, 1e18))])
    with pytest.raises(ValueError, match=r"raw window \(8, 32, 32\)"):
        ef.Loader(raw, patch=(8, 32, 32), batch_size=1, threads=1,
                  augment=[ei.Blur(sigma=(0, 42.84), per_section=False)])
    for sigma in (42.83, 1.5):  # the largest accepted (reach 128 = 4 * 32), and the default on a small window
        ef.Loader(raw, patch=(8, 32, 32) if sigma > 2 else (8, 4, 4), batch_size=1, threads=1,
                  augment=[ei.Blur(sigma=(0, sigma))]).close()
    ef.Loader(raw, patch=(8, 4, 4), batch_size=1, threads=1, augment=list(ei.FULL)).close()
    with pytest.raises(ValueError, match=r"sigma up to 1e\+308 voxels reaches inf voxels"):  # 3 x 1e308: not an int
        ef.Loader(raw, patch=(8, 32, 32), batch_size=1, threads=1, augment=[ei.Blur(sigma=(0, 1e308))])
    out = np.zeros((1, 1, 2, 4, 4), np.float32)
    for sigma in (1e7, 1e18, 1e300, 1e308):
        with pytest.raises(ValueError, match="blur: a sigma of .* voxels reaches"):
            _intensity.blur(out, [0], (2, 4, 4), [sigma], False, 3.0)
    with pytest.raises(ValueError, match="finite"):
        _intensity.blur(out, [0], (2, 4, 4), [float("inf")], False, 3.0)


def test_same_uniforms_same_output(rng):
    raw = random_raw(rng, np.float32)
    for augmentation in (ei.Gamma(p=0.5), ei.Contrast(p=0.5), ei.Noise(p=0.5), ei.Blur(p=0.5)):
        uniforms = rng.random((len(raw), augmentation.draws))
        first, _ = run(augmentation, raw, uniforms)
        second, _ = run(augmentation, raw, uniforms.copy())
        np.testing.assert_array_equal(first, second)
        assert not np.array_equal(first, raw)


def test_padding_examples_are_never_touched(rng):
    raw = random_raw(rng, np.float32)
    for augmentation in (ei.Gamma(p=1.0), ei.Contrast(p=1.0), ei.Noise(p=1.0), ei.Blur(sigma=(1, 1), p=1.0)):
        out, _ = run(augmentation, raw, rng.random((len(raw), augmentation.draws)), valid=2)
        assert_untouched(out, raw, [0, 1])
        assert not np.array_equal(out[:2], raw[:2])


@pytest.mark.parametrize("kernel", ["gamma", "noise", "blur"])
def test_kernels_release_the_gil(kernel):
    raw = np.random.default_rng(0).random((4, 1, 32, 128, 128), dtype=np.float32)
    size, blocks = raw[0].size, np.arange(4)
    calls = {
        "gamma": (_intensity.gamma, raw, blocks, size, [0.7] * 4),
        "noise": (_intensity.noise, raw, blocks, size, [0.1] * 4, [1, 2, 3, 4]),
        "blur": (_intensity.blur, raw, blocks, raw.shape[2:], [1.5] * 4, False),
    }
    assert_releases_gil(*calls[kernel])


@pytest.mark.parametrize("make, message", [
    (lambda: ei.Gamma(p=1.5), "probability"),
    (lambda: ei.Gamma(p=-0.1), "probability"),
    (lambda: ei.Gamma(range=(0.0, 1.0)), "range must be > 0"),
    (lambda: ei.Gamma(range=(2.0, 1.0)), "low <= high"),
    (lambda: ei.Gamma(range=1.5), "pair"),
    (lambda: ei.Contrast(range=(-0.5, 1.0)), "range"),
    (lambda: ei.Noise(sigma=(-0.1, 0.1)), "sigma"),
    (lambda: ei.Noise(sigma=(0.0, float("nan"))), "finite"),
    (lambda: ei.Blur(sigma=(-1.0, 1.0)), "sigma"),
    (lambda: ei.Blur(per_section="yes"), "per_section"),
])
def test_bad_parameters_are_refused(make, message):
    with pytest.raises(ValueError, match=message) as caught:
        make()
    # A config points at the key from the refusal's setting (one refusal lacked it: "gamma", not "gamma.range").
    assert caught.value.emfast_setting in caught.value.args[0]


def test_bad_batches_are_refused(rng):
    gamma = ei.Gamma(p=1.0)
    record = gamma.apply(rng.random((2, 2)), Params.identity(2))
    with pytest.raises(TypeError, match="float64"):
        gamma.process(record, Patches(raw=np.zeros((2, 1, 2, 3, 4)), valid=2))
    with pytest.raises(ValueError, match="drawn for 2 examples"):
        gamma.process(record, Patches(raw=np.zeros((3, 1, 2, 3, 4), np.float32), valid=3))
    with pytest.raises(ValueError, match="shape"):
        gamma.process(record, Patches(raw=np.zeros((2, 2, 3, 4), np.float32), valid=2))
    with pytest.raises(ValueError, match="valid"):
        gamma.process(record, Patches(raw=np.zeros((2, 1, 2, 3, 4), np.float32), valid=3))
    with pytest.raises(ValueError, match="C-contiguous"):
        gamma.process(record, Patches(raw=np.zeros((2, 1, 2, 3, 8), np.float32)[..., ::2], valid=2))
    with pytest.raises(TypeError, match="Draws"):
        gamma.process(None, Patches(raw=np.zeros((2, 1, 2, 3, 4), np.float32), valid=2))
    with pytest.raises(ValueError, match="blocks"):
        _intensity.gamma(np.zeros((2, 4), np.float32), [2], 4, [1.0])
    with pytest.raises(ValueError, match="repeat"):
        _intensity.gamma(np.zeros((2, 4), np.float32), [1, 1], 4, [1.0, 1.0])


def test_names_resolve_for_config_files():
    resolved = resolve(["gamma", "contrast", "noise", "blur"], isotropic=False)
    assert [type(a) for a in resolved] == [ei.Gamma, ei.Contrast, ei.Noise, ei.Blur]
    assert all(a.pixelwise for a in resolved)


def test_intensity_comes_first_wherever_it_is_in_the_list():
    """README: pixel-wise augmentations run in list order, except Intensity, folded into the crop's
    normalisation: a missing section is at its fill value, not scaled and shifted, whichever comes first in the
    list (the draws differ with the order)."""
    import emfast as ef
    raw = np.random.default_rng(3).integers(0, 256, (16, 32, 32), dtype=np.uint8)
    for augment in ([ef.Intensity(0.5, 0.5), ef.MissingSection(p=0.5, fill=0.25)],
                    [ef.MissingSection(p=0.5, fill=0.25), ef.Intensity(0.5, 0.5)]):
        with ef.Loader(raw, patch=(8, 16, 16), batch_size=8, augment=augment, seed=4) as loader:
            batch = loader.next_batch()["raw"]
            filled = (batch == np.float32(0.25)).all(axis=(-2, -1))
            assert filled.any() and not filled.all()  # some sections were filled, at the fill value itself
