"""pytest-benchmark suite of the pixel-wise augmentations: emfast's kernels against NumPy/SciPy, same batch.

Run (timings):            python -m pytest benchmarks/test_intensity_benchmark.py -q --benchmark-enable
Run (correctness only):   python -m pytest benchmarks/test_intensity_benchmark.py -q   (each body runs once)

Task: one batch of 8 x (1, 32, 128, 128) float32 raw in [0, 1] (random data), changed in place by one
augmentation. Per-example augmentations fire on every example (p = 1); section defects hit each section with
p = 0.2 (about 51 of the 256 sections), with the same hits for both rows of a group. Every round starts from a
fresh copy of the batch (the copy is not timed).

Groups (compare the two rows of a group; the ratio is the figure, not the times):

* ``gamma``, ``contrast``, ``noise``, ``blur-2d`` (per section), ``blur-3d``: emfast ``process`` | NumPy:
  ``sign(x) * |x| ** g``, ``(x - mean) * c + mean``, ``x + sigma * Generator.standard_normal``, and
  ``scipy.ndimage.gaussian_filter(mode="reflect", truncate=3)`` per example.
* ``missing-section``, ``low-contrast``, ``slip``, ``artifacts``: emfast ``process`` | the same hits with NumPy
  slicing, one section at a time.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from emfast.augment import Params, Patches
from emfast.augment import Artifacts, LowContrast, MissingSection, Slip
from emfast.augment import Blur, Contrast, Gamma, Noise

SHAPE = (8, 1, 32, 128, 128)
ROUNDS = 10


@pytest.fixture(scope="module")
def raw() -> np.ndarray:
    return np.random.default_rng(0).random(SHAPE, dtype=np.float32)


@pytest.fixture(scope="module")
def artifact_source() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (16, 160, 160), dtype=np.uint8)


def augmentations(source):
    return {
        "gamma": Gamma(p=1.0),
        "contrast": Contrast(p=1.0),
        "noise": Noise(sigma=(0.05, 0.1), p=1.0),
        "blur-2d": Blur(sigma=(1.0, 1.5), p=1.0),
        "blur-3d": Blur(sigma=(1.0, 1.5), p=1.0, per_section=False),
        "missing-section": MissingSection(p=0.2),
        "low-contrast": LowContrast(p=0.2),
        "slip": Slip(p=0.2, mode="step"),
        "artifacts": Artifacts(source, p=0.2),
    }


def record_of(augmentation):
    uniforms = np.random.default_rng(2).random((SHAPE[0], augmentation.draws))
    return augmentation.apply(uniforms, Params.identity(SHAPE[0]))


def numpy_reference(name, augmentation, record, x):
    """The same change as ``augmentation.process(record, ...)`` in NumPy/SciPy, in place on ``x``."""
    if name == "gamma":
        for n in range(len(x)):
            x[n] = np.sign(x[n]) * np.abs(x[n]) ** np.float32(record.value[n])
    elif name == "contrast":
        for n in range(len(x)):
            mean = x[n].mean()
            x[n] = (x[n] - mean) * np.float32(record.value[n]) + mean
    elif name == "noise":
        rng = np.random.default_rng(3)
        for n in range(len(x)):
            x[n] += np.float32(record.value[n]) * rng.standard_normal(x[n].shape, dtype=np.float32)
    elif name.startswith("blur"):
        for n in range(len(x)):
            s = record.value[n]
            x[n, 0] = ndimage.gaussian_filter(x[n, 0], (0 if augmentation.per_section else s, s, s),
                                              mode="reflect", truncate=3.0)
    elif name == "missing-section":
        events = augmentation.events(record, x.shape, len(x))
        for n, z in zip(events.example, events.section):
            x[n, :, z] = augmentation.fill
    elif name == "low-contrast":
        events = augmentation.events(record, x.shape, len(x))
        for n, z, (factor,) in zip(events.example, events.section, events.values):
            mean = x[n, 0, z].mean()
            x[n, 0, z] = (x[n, 0, z] - mean) * np.float32(factor) + mean
    elif name == "slip":
        table = augmentation.shifts(record, x.shape, len(x))
        h, w = x.shape[3:]
        for n in range(len(x)):
            for z in range(x.shape[2]):
                dy, dx = (int(v) for v in table[n, z])
                if dy or dx:
                    moved = np.full((h, w), augmentation.fill, np.float32)
                    moved[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
                        x[n, 0, z, max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
                    x[n, 0, z] = moved
    elif name == "artifacts":
        events = augmentation.events(record, x.shape, len(x))
        h, w = x.shape[3:]
        for n, z, (alpha, az, ay, ax) in zip(events.example, events.section, events.values):
            box = augmentation._source[int(az), int(ay):int(ay) + h, int(ax):int(ax) + w]
            a, scale = np.float32(alpha), np.float32(1 / 255)  # the documented default for uint8 sections
            x[n, 0, z] = x[n, 0, z] * (np.float32(1) - a) + (box.astype(np.float32) * scale) * a


NAMES = ["gamma", "contrast", "noise", "blur-2d", "blur-3d", "missing-section", "low-contrast", "slip", "artifacts"]


@pytest.mark.parametrize("name", NAMES)
def test_emfast(benchmark, raw, artifact_source, name):
    augmentation = augmentations(artifact_source)[name]
    record = record_of(augmentation)
    out, expected = raw.copy(), raw.copy()
    augmentation.process(record, Patches(raw=out, valid=len(out)))
    numpy_reference(name, augmentation, record, expected)
    if name != "noise":  # never time a broken kernel (noise: different generators, compared by its tests)
        np.testing.assert_allclose(out, expected, rtol=0, atol=2e-5)
    benchmark.group = name
    benchmark.pedantic(lambda x: augmentation.process(record, Patches(raw=x, valid=len(x))),
                       setup=lambda: ((raw.copy(),), {}), rounds=ROUNDS)


@pytest.mark.parametrize("name", NAMES)
def test_numpy_reference(benchmark, raw, artifact_source, name):
    augmentation = augmentations(artifact_source)[name]
    record = record_of(augmentation)
    benchmark.group = name
    benchmark.pedantic(lambda x: numpy_reference(name, augmentation, record, x),
                       setup=lambda: ((raw.copy(),), {}), rounds=ROUNDS)
