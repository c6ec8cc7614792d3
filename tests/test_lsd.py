"""Local shape descriptors: agreement with funkelab's lsds (fixtures made by tests/reference_lsds/make_fixtures.py),
geometry (margins, masks), the loader, configs and bad input."""
import pathlib

import h5py
import numpy as np
import pytest

import emfast as ef
from emfast._core import targets as _targets
from emfast.config import load_config
from emfast.targets import LSD, compute_targets, required_margin, resolve
from reference import assert_releases_gil

FIXTURES = sorted((pathlib.Path(__file__).parent / "reference_lsds").glob("*.npz"))
#: The issue's bound on |emfast - lsds| per channel value (values lie in [0, 1]).
TOLERANCE = 0.01


def load_fixture(path):
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def descriptors(segmentation, sigma, voxel_size, margin=(0, 0, 0), **kwargs):
    """emfast's LSD and mask of one (Z, Y, X) segmentation."""
    target = LSD(sigma=tuple(sigma), voxel_size=tuple(voxel_size), **kwargs)
    out = compute_targets(segmentation[None, None], [target], margin)
    return out[target.name][0], out[target.mask_name][0, 0]


def test_fixtures_cover_random_and_anisotropic_segmentations_and_several_sigmas():
    cases = [load_fixture(path) for path in FIXTURES]
    assert len(cases) >= 5
    assert len({tuple(case["sigma"]) for case in cases}) >= 4
    assert any(case["voxel_size"][0] >= 10 * case["voxel_size"][1] for case in cases)


@pytest.mark.parametrize("path", FIXTURES, ids=[path.stem for path in FIXTURES])
def test_lsd_agrees_with_lsds(path):
    case = load_fixture(path)
    ours, mask = descriptors(case["segmentation"], case["sigma"], case["voxel_size"])
    expected = case["lsds"].astype(np.float32)
    assert ours.shape == expected.shape == (10,) + case["segmentation"].shape
    error = np.abs(ours - expected).max(axis=(1, 2, 3))
    assert np.all(error <= TOLERANCE), f"largest error per channel: {np.round(error, 4)}"
    np.testing.assert_array_equal(mask[ours[9] == 0], 0)  # only background has no size


PLANAR = sorted((pathlib.Path(__file__).parent / "reference_lsds" / "planar").glob("*.npz"))


@pytest.mark.parametrize("path", PLANAR, ids=[path.stem for path in PLANAR])
def test_lsd_in_plane_agrees_with_lsds_2d_descriptors_of_each_section(path):
    """lsds describes a 2-D segmentation with six channels; LSD(in_plane=True) gives them for every section."""
    case = load_fixture(path)
    voxel_size, sigma = tuple(case["voxel_size"]), tuple(case["sigma"])
    ours, mask = descriptors(case["segmentation"], (voxel_size[0] / 2,) + sigma, voxel_size, in_plane=True)
    expected = case["lsds"].astype(np.float32)
    assert ours.shape == expected.shape == (6,) + case["segmentation"].shape
    error = np.abs(ours - expected).max(axis=(1, 2, 3))
    assert np.all(error <= TOLERANCE), f"largest error per channel: {np.round(error, 4)}"
    np.testing.assert_array_equal(mask[ours[5] == 0], 0)  # only background has no size


def test_lsd_in_plane_needs_no_margin_along_z_and_cuts_like_the_whole_volume():
    case = load_fixture(PLANAR[0].with_name("planar_random.npz"))
    segmentation, voxel_size = case["segmentation"], tuple(case["voxel_size"])
    spec = LSD(sigma=(1.0,) + tuple(case["sigma"]), voxel_size=voxel_size, in_plane=True)
    margin = spec.margin()
    assert margin == (0, 6, 5) and spec.outputs()["lsd"][0] == 6
    whole = compute_targets(segmentation[None, None], [spec])["lsd"][0]
    window = (slice(1, 4), slice(6, 8), slice(5, 12))
    cut = segmentation[tuple(slice(w.start - m, w.stop + m) for w, m in zip(window, margin))]
    ours = compute_targets(cut[None, None], [spec], margin)["lsd"][0]
    np.testing.assert_array_equal(ours, whole[(slice(None),) + window])


def test_a_loader_delivers_lsds_in_plane_on_two_dimensional_patches(tmp_path):
    case = load_fixture(PLANAR[0].with_name("planar_random.npz"))
    segmentation, voxel_size = case["segmentation"], tuple(case["voxel_size"])
    raw = ef.Volume.from_array(np.zeros(segmentation.shape, np.uint8), resolution=voxel_size)
    labels = ef.Volume.from_array(segmentation, resolution=voxel_size)
    spec = LSD(sigma=(1.0,) + tuple(case["sigma"]), in_plane=True)
    with ef.Loader(ef.Sample(raw, labels), patch=(1, 2, 6), batch_size=4, seed=1, augment=[],
                   targets=[spec]) as loader:
        batch = loader.next_batch()
        assert batch["lsd"].shape == (4, 6, 1, 2, 6) and batch["lsd_mask"].any()
        expected = case["lsds"].astype(np.float32)
        for b, corner in enumerate(batch.positions):
            window = (slice(None),) + tuple(slice(c, c + n) for c, n in zip(corner, (1, 2, 6)))
            known = batch["lsd_mask"][b, 0].astype(bool)
            assert np.abs(batch["lsd"][b][:, known] - expected[window][:, known]).max() <= TOLERANCE


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64, np.int64, np.int32])
def test_lsd_depends_on_ids_only_through_equality(dtype):
    case = load_fixture(FIXTURES[0].with_name("random_isotropic.npz"))
    segmentation = case["segmentation"]
    present, index = np.unique(segmentation, return_inverse=True)
    assert present[0] == 0  # background stays background below
    extremes = {np.uint32: [0, 2**32 - 1, 2**31], np.uint64: [0, 2**64 - 1, 2**63], np.int64: [0, -1, -(2**63)],
                np.int32: [0, -1, -(2**31)]}
    ids = extremes[dtype] + [1000 + k for k in range(len(present) - 3)]
    relabelled = np.asarray(ids, dtype=dtype)[index.reshape(segmentation.shape)]
    ours, mask = descriptors(relabelled, case["sigma"], case["voxel_size"])
    reference, reference_mask = descriptors(segmentation, case["sigma"], case["voxel_size"])
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(mask, reference_mask)


def test_a_gaussian_reaching_beyond_any_volume_is_refused_not_aborted():
    """compute_targets(labels, [LSD(sigma=1e18)]) aborted the process (std::length_error out of the kernel)."""
    labels = np.ones((1, 1, 8, 32, 32), np.uint32)
    for sigma in (1e7, 1e18, 1e200, 1e308):  # beyond 1e154, sigma ** 2 and 3 * sigma overflowed (OverflowError)
        with pytest.raises(ValueError, match="lsd: a sigma of .* voxels reaches .* beyond the"):
            compute_targets(labels, [LSD(sigma=sigma, voxel_size=(1, 1, 1))])
    assert compute_targets(labels, [LSD(sigma=3, voxel_size=(1, 1, 1))])["lsd"].shape == (1, 10, 8, 32, 32)


def test_labels_cut_with_the_margin_give_the_whole_volumes_descriptors():
    case = load_fixture(FIXTURES[0].with_name("neurites_sigma120.npz"))
    segmentation, sigma, voxel_size = case["segmentation"], case["sigma"], case["voxel_size"]
    whole, _ = descriptors(segmentation, sigma, voxel_size)
    margin = LSD(sigma=tuple(sigma), voxel_size=tuple(voxel_size)).margin()
    window = (slice(4, 6), slice(3, 20), slice(5, 12))
    assert any(w.start < m or w.stop + m > s for w, m, s in zip(window, margin, segmentation.shape))
    cut = np.zeros(tuple(w.stop - w.start + 2 * m for w, m in zip(window, margin)), dtype=segmentation.dtype)
    # the window grown by the margin, zero (background) where it leaves the volume, as lsds pads
    source = tuple(slice(max(0, w.start - m), min(s, w.stop + m)) for w, m, s in zip(window, margin,
                                                                                       segmentation.shape))
    target = tuple(slice(src.start - (w.start - m), src.stop - (w.start - m)) for src, w, m in zip(source, window,
                                                                                                    margin))
    cut[target] = segmentation[source]
    ours, mask = descriptors(cut, sigma, voxel_size, margin=margin)
    np.testing.assert_array_equal(ours, whole[(slice(None),) + window])
    np.testing.assert_array_equal(mask, segmentation[window] != 0)


def test_mask_is_zero_on_background_ignore_and_where_the_gaussian_leaves_the_patch():
    rng = np.random.default_rng(3)
    segmentation = rng.integers(0, 4, size=(20, 30, 40)).astype(np.uint64)
    target = LSD(sigma=(2.0, 3.0, 4.0), voxel_size=(1.0, 1.0, 1.0), ignore=3)
    reach = target.margin()
    assert reach == (6, 9, 12)
    out = compute_targets(segmentation[None, None], [target], (2, 4, 5))
    inner = segmentation[2:-2, 4:-4, 5:-5]
    mask, lsd = out["lsd_mask"][0, 0], out["lsd"][0]
    expected = (inner != 0) & (inner != 3)
    for axis, (r, m) in enumerate(zip(reach, (2, 4, 5))):
        lost = r - m  # output voxels within this distance of the patch border see past it
        index = np.arange(inner.shape[axis])
        near = (index < lost) | (index >= inner.shape[axis] - lost)
        expected &= ~near.reshape([-1 if a == axis else 1 for a in range(3)])
    np.testing.assert_array_equal(mask, expected)
    assert np.all(lsd[:, (inner == 0) | (inner == 3)] == 0)
    assert np.all(lsd[9][(inner == 1) | (inner == 2)] > 0)


def test_descriptors_of_simple_shapes():
    """A slab along x: no mean offset inside it, the x variance of a uniform line under the gaussian, zero
    correlations (pearson 1/2); a voxel near the slab's end sees the object on one side only."""
    labels = np.zeros((5, 5, 41), dtype=np.uint32)
    labels[2, 2, 5:36] = 1
    lsd, mask = descriptors(labels, (1.0, 1.0, 3.0), (1.0, 1.0, 1.0))
    centre = lsd[:, 2, 2, 20]
    np.testing.assert_allclose(centre[[0, 1, 2]], 0.5, atol=1e-6)
    g = np.exp(-0.5 * (np.arange(-9, 10) / 3.0) ** 2)
    g /= g.sum()
    np.testing.assert_allclose(centre[5], (g * (np.arange(-9, 10) / 3.0) ** 2).sum(), rtol=1e-5)
    np.testing.assert_allclose(centre[[6, 7, 8]], 0.5, atol=1e-6)
    weight = np.exp(-0.5 * np.arange(-3, 4) ** 2)
    np.testing.assert_allclose(centre[9], (weight[3] / weight.sum()) ** 2, rtol=1e-5)
    assert lsd[2, 2, 2, 6] > 0.5 and lsd[2, 2, 2, 34] < 0.5  # the slab lies ahead, then behind
    assert lsd[:, labels == 0].max() == 0 and mask.sum() == 0  # every gaussian leaves this small patch


def test_kernel_releases_the_gil():
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 6, size=(2, 1, 16, 32, 32)).repeat(2, axis=3).repeat(2, axis=4).astype(np.uint64)
    out = np.empty((2, 10, 16, 64, 64), np.float32)
    mask = np.empty((2, 1, 16, 64, 64), np.uint8)
    assert_releases_gil(_targets.lsd, labels, (0, 0, 0), (2.0, 4.0, 4.0), (0, 0, 0), 0, None, out, mask)


# -- specification and bad input ----------------------------------------------------------------------------------

def test_sigma_below_the_voxel_size_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"LSD: sigma \(30.0, 80.0, 80.0\) is below the voxel size "
                                         r"\(40.0, 4.0, 4.0\) along z \(30 < 40\)"):
        LSD(sigma=(30, 80, 80), voxel_size=(40, 4, 4))
    with pytest.raises(ValueError, match=r"along x \(3 < 4\)"):
        LSD(sigma=(40, 8, 3), voxel_size=(40, 4, 4))
    assert LSD(sigma=(40, 4, 4), voxel_size=(40, 4, 4)).margin() == (3, 3, 3)  # exactly one voxel is fine
    assert LSD(sigma=(1, 8, 8), voxel_size=(40, 4, 4), in_plane=True).margin() == (0, 6, 6)  # z unused in plane
    assert LSD(sigma=(8, 12), voxel_size=(40, 4, 4), in_plane=True).margin() == (0, 6, 9)  # (y, x) alone
    assert LSD(sigma=np.array([8, 12]), voxel_size=(40, 4, 4), in_plane=np.True_).margin() == (0, 6, 9)


@pytest.mark.parametrize("make, match", [
    (lambda: LSD(), r"LSD: sigma is required"),
    (lambda: resolve(["lsd"]), r"LSD: sigma is required"),
    (lambda: LSD(sigma=(1, 2)), r"LSD: sigma must be 3 finite numbers > 0"),
    (lambda: LSD(sigma=(0, 2, 2)), r"LSD: sigma must be 3 finite numbers > 0"),
    (lambda: LSD(sigma=80, voxel_size=(40, -4, 4)), r"LSD: voxel_size must be 3 finite numbers > 0"),
    (lambda: LSD(sigma=80, voxel_size="40"), r"LSD: voxel_size must be 3 finite numbers"),
    (lambda: LSD(sigma=80, background=1.5), r"LSD: background must be an integer label id or None"),
    (lambda: LSD(sigma=80, name="my lsd"), r"LSD: name must be a non-empty identifier"),
    (lambda: LSD(sigma=80, in_plane="yes"), r"LSD: in_plane must be True or False"),
])
def test_bad_specifications_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bare_arrays_need_a_voxel_size():
    labels = np.ones((1, 1, 8, 8, 8), np.uint64)
    with pytest.raises(ValueError, match=r"LSD: the voxel size is unknown: give LSD\(voxel_size="):
        compute_targets(labels, [LSD(sigma=2)])
    assert LSD(sigma=2).outputs() == {"lsd": (10, np.dtype(np.float32)), "lsd_mask": (1, np.dtype(np.uint8))}


def test_kernel_refuses_bad_arguments():
    labels = np.ones((1, 1, 8, 8, 8), np.uint64)
    out, mask = np.empty((1, 10, 8, 8, 8), np.float32), np.empty((1, 1, 8, 8, 8), np.uint8)
    with pytest.raises(ValueError, match=r"sigma must be >= 1 voxel along each axis, got \(1.0, 0.5, 1.0\)"):
        _targets.lsd(labels, (0, 0, 0), (1.0, 0.5, 1.0), (0, 0, 0), 0, None, out, mask)
    with pytest.raises(ValueError, match=r"out must have shape \(1, 10, 8, 8, 8\)"):
        _targets.lsd(labels, (0, 0, 0), (1, 1, 1), (0, 0, 0), 0, None, out[:, :9], mask)
    with pytest.raises(ValueError, match=r"ignore -1 cannot occur in uint64 labels"):
        _targets.lsd(labels, (0, 0, 0), (1, 1, 1), (0, 0, 0), 0, -1, out, mask)


# -- loader and configs -------------------------------------------------------------------------------------------

def write_sample(path, resolution):
    """An HDF5 file as gunpowder writes one: raw and neuron ids with resolution/offset attributes (nm)."""
    rng = np.random.default_rng(7)
    coarse = rng.integers(0, 6, size=(10, 12, 12)).astype(np.uint64)
    labels = coarse.repeat(2, 0).repeat(4, 1).repeat(4, 2)
    with h5py.File(path, "w") as f:
        for key, data in (("volumes/raw", rng.integers(0, 256, labels.shape, dtype=np.uint8)),
                          ("volumes/labels/neuron_ids", labels)):
            dataset = f.create_dataset(key, data=data, chunks=(4, 16, 16))
            if resolution is not None:
                dataset.attrs["resolution"] = resolution
                dataset.attrs["offset"] = (0.0, 0.0, 0.0)
    return labels


def test_loader_takes_the_voxel_size_from_raw(tmp_path):
    labels = write_sample(tmp_path / "sample.h5", (40.0, 8.0, 8.0))
    target = LSD(sigma=(40, 16, 16))
    sample = ef.Sample(raw=ef.open(tmp_path / "sample.h5", "volumes/raw"),
                       labels=ef.open(tmp_path / "sample.h5", "volumes/labels/neuron_ids"))
    with ef.Loader(sample, patch=(4, 12, 12), batch_size=3, augment=(), targets=[target], epoch_size=2,
                   threads=2, seed=4) as loader:
        assert target.voxel_size is None  # the loader bound a copy
        assert loader.margin == (3, 6, 6)
        whole, _ = descriptors(labels, (40, 16, 16), (40, 8, 8))
        for batch in loader:
            for n, corner in enumerate(batch.positions):
                window = tuple(slice(c, c + p) for c, p in zip(corner, (4, 12, 12)))
                np.testing.assert_array_equal(batch["lsd"][n], whole[(slice(None),) + window])
                np.testing.assert_array_equal(batch["lsd_mask"][n, 0], labels[window] != 0)


def test_loader_refuses_an_lsd_it_cannot_place_in_world_units(tmp_path):
    write_sample(tmp_path / "bare.h5", None)
    write_sample(tmp_path / "coarse.h5", (40.0, 8.0, 8.0))

    def loader(name, target):
        sample = ef.Sample(raw=ef.open(tmp_path / name, "volumes/raw"),
                           labels=ef.open(tmp_path / name, "volumes/labels/neuron_ids"), name=name)
        return ef.Loader(sample, patch=(4, 12, 12), augment=(), targets=[target])

    with pytest.raises(ValueError, match=r"LSD: sample 'bare.h5' states no voxel size \(resolution\); give "
                                         r"LSD\(voxel_size=\(z, y, x\)\)"):
        loader("bare.h5", LSD(sigma=40))
    with loader("bare.h5", LSD(sigma=40, voxel_size=(40, 8, 8))) as ok:
        assert ok.margin == (3, 15, 15)
    with pytest.raises(ValueError, match=r"LSD: sigma \(40.0, 6.0, 6.0\) is below the resolution of sample "
                                         r"'coarse.h5' \(40.0, 8.0, 8.0\) along y \(6 < 8\)"):
        loader("coarse.h5", LSD(sigma=(40, 6, 6)))
    with pytest.raises(ValueError, match=r"LSD: voxel_size \(40.0, 4.0, 4.0\) does not match the resolution "
                                         r"\(40.0, 8.0, 8.0\) of sample 'coarse.h5'"):
        loader("coarse.h5", LSD(sigma=40, voxel_size=(40, 4, 4)))


def test_loader_refuses_samples_of_different_voxel_sizes_for_one_lsd(tmp_path):
    write_sample(tmp_path / "fine.h5", (40.0, 4.0, 4.0))
    write_sample(tmp_path / "coarse.h5", (40.0, 8.0, 8.0))
    samples = [ef.Sample(raw=ef.open(tmp_path / name, "volumes/raw"),
                         labels=ef.open(tmp_path / name, "volumes/labels/neuron_ids"), name=name)
               for name in ("fine.h5", "coarse.h5")]
    with pytest.raises(ValueError, match=r"LSD: voxel_size \(40.0, 4.0, 4.0\) does not match the resolution "
                                         r"\(40.0, 8.0, 8.0\) of sample 'coarse.h5'; one LSD target serves one"):
        ef.Loader(ef.Dataset(samples), patch=(4, 12, 12), augment=(), targets=[LSD(sigma=40)])


def test_config_names_lsd(tmp_path):
    write_sample(tmp_path / "sample.h5", (40.0, 8.0, 8.0))
    text = f"""
data:
  samples:
    - {{file: {tmp_path / 'sample.h5'}, raw: volumes/raw, labels: volumes/labels/neuron_ids}}
loader: {{patch: [4, 12, 12], batch_size: 1}}
targets:
  - lsd: {{sigma: [80, 16, 16], name: descriptors}}
"""
    config = load_config(text)
    assert config.loader_kwargs()["targets"] == [LSD(sigma=(80, 16, 16), name="descriptors")]


def test_required_margin_and_unknown_labels():
    target = LSD(sigma=(80, 40, 40), voxel_size=(40, 4, 4))
    assert required_margin([target, ef.Affinities()]) == (6, 30, 30)
    valid = np.ones((1, 1, 14, 62, 64), np.uint8)
    valid[0, 0, 0, 0, 63] = 0  # one unknown label voxel at a corner
    out = {"lsd_mask": np.ones((1, 1, 2, 2, 4), np.uint8)}
    target.mask_unknown(valid, (6, 30, 30), out)
    # output voxel (z, y, x) is label voxel (z + 6, y + 30, x + 30): within reach of (0, 0, 63) iff z + 6 <= 6,
    # y + 30 <= 30 and x + 30 >= 33
    expected = np.ones((2, 2, 4), np.uint8)
    expected[0, 0, 3:] = 0
    np.testing.assert_array_equal(out["lsd_mask"][0, 0], expected)


def test_a_sample_too_thin_for_the_lsd_margin_names_the_lsd():
    """On one section, an LSD's margin along z (its sigma is at least a voxel) was refused as "the targets' label
    margin (3, 30, 30)", naming no target (a review of 2-D use)."""
    volume = ef.Volume.from_array(np.zeros((1, 200, 200), np.uint8), resolution=(40, 4, 4))
    labels = ef.Volume.from_array(np.ones((1, 200, 200), np.uint32), resolution=(40, 4, 4))
    with pytest.raises(ValueError, match=r"grown by the labels' margin \(3, 30, 30\) \(LSD \(3, 30, 30\), "
                                         r"Affinities \(0, 1, 1\)\) does not fit"):
        ef.Loader(ef.Sample(raw=volume, labels=labels), patch=(1, 64, 64),
                  targets=[ef.LSD(sigma=(40, 40, 40)), ef.Affinities(offsets=((0, -1, 0), (0, 0, -1)))])
