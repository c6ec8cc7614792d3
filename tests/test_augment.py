"""Augmentation specs: names, checks and the distribution of the transforms they draw."""
import collections
import re

import numpy as np
import pytest

import emfast as ef
from emfast.augment import Params, reachable_permutations, resolve
from emfast.pipeline._plan import Planner
from emfast.sampling import Region


def draw(augmentations, batches=200, batch_size=16):
    sampler = ef.Uniform()
    sampler.bind([Region("cube", 1.0, np.zeros(3, np.int64), np.full(3, 16, np.int64))], np.array([[4, 8, 8]]),
                 batch_size)
    planner = Planner(patch=(4, 8, 8), batch_size=batch_size, sampler=sampler,
                      augmentations=resolve(augmentations, isotropic=True), seed=3)
    return [planner.plan(0, k) for k in range(batches)]


def test_mirror_and_transpose_cover_the_16_anisotropic_transforms_evenly():
    counts = collections.Counter()
    for plan in draw([ef.Mirror(), ef.Transpose()]):
        for perm, flips in zip(plan.params.perms, plan.params.flips):
            counts[(tuple(perm), tuple(flips))] += 1
    assert len(counts) == 16
    expected = sum(counts.values()) / 16
    assert all(abs(c - expected) < 0.25 * expected for c in counts.values()), counts


def test_isotropic_transpose_reaches_all_48():
    seen = {(tuple(p), tuple(f)) for plan in draw([ef.Mirror(), ef.Transpose("zyx")])
            for p, f in zip(plan.params.perms, plan.params.flips)}
    assert len(seen) == 48


def test_mirror_probability_is_respected():
    flips = np.concatenate([p.params.flips for p in draw([ef.Mirror(axes="x", p=0.2)])])
    assert not flips[:, :2].any()
    assert abs(flips[:, 2].mean() - 0.2) < 0.03


def test_intensity_gain_and_bias_ranges():
    params = [p.params for p in draw([ef.Intensity(scale=0.3, shift=0.2)])]
    gain = np.concatenate([p.gain for p in params])
    bias = np.concatenate([p.bias for p in params])
    assert 0.7 <= gain.min() < 0.75 and 1.25 < gain.max() <= 1.3
    assert -0.2 <= bias.min() < -0.15 and 0.15 < bias.max() <= 0.2


def test_mirror_after_transpose_flips_the_output_axis():
    params = Params.identity(1)
    ef.Transpose().apply(np.array([[0.9]]), params)  # the swapped order
    assert params.perms.tolist() == [[0, 2, 1]]
    ef.Mirror(axes="x", p=1.0).apply(np.zeros((1, 3)), params)
    assert params.flips.tolist() == [[False, True, False]]  # output x reads source y


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ValueError, match="did you mean 'transpose'"):
        resolve(["mirror", "transpos"], isotropic=False)


def test_transpose_across_z_needs_isotropic_opt_in():
    with pytest.raises(ValueError, match="isotropic=True"):
        resolve([ef.Transpose(axes="zyx")], isotropic=False)
    assert reachable_permutations(resolve([ef.Transpose(axes="zx")], isotropic=True)) == {(0, 1, 2), (2, 1, 0)}


@pytest.mark.parametrize("resolution, augment, isotropic, refused", [
    ((40, 4, 8), [ef.Transpose()], False, "Transpose(axes='yx') moves y and x voxels onto each other"),
    ((40, 8, 4), [ef.Rotate(angle=10)], False, "Rotate(axes='yx') moves y and x voxels onto each other"),
    ((4, 4, 8), [ef.Transpose(axes="zyx")], True, "(4.0, 4.0, 8.0) nm, 4 nm along y and 8 along x"),
    # isotropic=True where the data's voxel size says z differs: 13 of 32 windows carried z along y or x (a review)
    ((40, 4, 4), [ef.Transpose(axes="zyx")], True, "Transpose(axes='zyx') mixes z with y/x, which isotropic=True"),
    ((40, 4, 4), [ef.Rotate(axes="zyx")], True, "Rotate(axes='zyx') mixes z with y/x"),
    ((40, 4, 4), [ef.Scale(axes="zyx")], True, "Scale(axes='zyx') resamples z with y/x"),
    ((4, 4, 8), [ef.Scale(axes="zyx")], True, "Scale(axes='zyx') resamples z with y/x, which isotropic=True"),
    ((40, 4, 8), [ef.Scale(axes="yx", isotropic_xy=False)], False, None),  # zoomed, never moved onto each other
    ((40, 4, 4), list(ef.augment.FULL), False, None),  # the anisotropic default: y and x alike
    ((40, 4, 4.02), [ef.Transpose(), ef.Rotate()], False, None),  # within metadata's rounding
    ((8, 8, 8), [ef.Transpose(axes="zyx"), ef.Rotate(axes="zyx")], True, None),
    (None, [ef.Transpose(axes="zyx")], True, None),  # no voxel size known: the flag is the user's word
])
def test_augmentations_exchanging_axes_of_unequal_voxels_are_refused(resolution, augment, isotropic, refused):
    """Transposing or rotating y with x where their voxels differ in size distorted every window, silently: the
    kernels work in voxels (a review). Mixing z with them is the isotropic flag's to allow, where the data's voxel
    size is unknown or agrees."""
    raw = ef.Volume.from_array(np.zeros((20, 64, 64), np.uint8), name="raw", resolution=resolution)
    if refused is None:
        ef.Loader(raw, patch=(4, 16, 16), augment=augment, isotropic=isotropic).close()
        return
    with pytest.raises(ValueError, match=re.escape(refused)) as caught:
        ef.Loader(raw, patch=(4, 16, 16), augment=augment, isotropic=isotropic)
    assert "sample 'raw' has voxel size" in str(caught.value) and caught.value.emfast_setting == "axes"
    assert caught.value.emfast_section == "augment"


@pytest.mark.parametrize("make", [lambda: ef.Mirror(axes="w"), lambda: ef.Mirror(axes="xx"),
                                  lambda: ef.Mirror(p=1.5), lambda: ef.Transpose(axes="x"),
                                  lambda: ef.Intensity(scale=-0.1), lambda: ef.Intensity(shift=float("nan"))])
def test_bad_parameters(make):
    with pytest.raises(ValueError):
        make()


def test_not_an_augmentation():
    with pytest.raises(TypeError, match="names or Augmentation"):
        resolve([42], isotropic=False)


def test_every_augmentation_repr_builds_the_same_augmentation():
    """``Elastic``'s repr showed ``grid=None``, a field bound at run time, so ``eval(repr(Elastic()))`` raised
    TypeError; a repr is what a user copies into a config or a script."""
    from emfast._registry import registered
    namespace = {name: getattr(ef, name) for name in ef.__all__}
    for cls in set(registered("augmentation").values()):
        try:
            augmentation = cls()
        except (TypeError, ValueError):  # needs an argument (Artifacts: a volume)
            continue
        assert eval(repr(augmentation), namespace) == augmentation, repr(augmentation)
