"""Label -> target kernels and their specifications, against the NumPy references in reference.py."""

import numpy as np
import pytest

import emfast
from emfast._core import targets as _targets
from emfast.targets import (Affinities, Boundaries, Classes, Foreground, Target, compute_targets, outputs,
                            required_margin, resolve)
from reference import (affinities_reference, assert_releases_gil, boundaries_reference, classes_reference,
                       foreground_reference, random_volume, seg_to_affgraph)

LABEL_DTYPES = [np.uint32, np.uint64, np.int64, np.int32]
#: Four ids per dtype, including the extremes of its range (compared as bits, so signs and top bits matter).
IDS = {
    np.uint32: [0, 7, 2**32 - 1, 2**31],
    np.uint64: [0, 2**63 + 3, 2**64 - 1, 1],
    np.int64: [0, -1, -(2**63), 2**63 - 1],
    np.int32: [0, -1, -(2**31), 2**31 - 1],
}
SHAPE = (3, 1, 7, 12, 37)  # odd, unequal extents; x long enough for vector loops and their tails
MARGINS = [(0, 0, 0), (1, 1, 1), (3, 2, 5)]
OFFSETS = {
    "nearest": [(1, 0, 0), (0, 1, 0), (0, 0, 1)],
    "negative": [(-1, 0, 0), (0, -2, 1), (2, -3, -1)],
    "long-range": [(0, 0, 9), (0, 9, 0), (3, 0, 0), (-4, -9, 9)],
    "beyond-patch": [(0, 0, 40), (-7, 0, 0), (0, 12, 0), (0, 0, -36), (1, 0, 0)],
}


def random_labels(rng, dtype, shape=SHAPE):
    """Labels from IDS[dtype]: half the patches noise, half blocks of 2 voxels (so regions and boundaries both
    occur)."""
    ids = np.array(IDS[dtype], dtype=dtype)
    noise = rng.integers(0, len(ids), size=shape)
    coarse = rng.integers(0, len(ids), size=(shape[0], 1) + tuple((s + 1) // 2 for s in shape[2:]))
    blocks = coarse.repeat(2, 2).repeat(2, 3).repeat(2, 4)
    blocks = blocks[(slice(None), slice(None)) + tuple(slice(s) for s in shape[2:])]
    choice = np.where(np.arange(shape[0])[:, None, None, None, None] % 2 == 0, noise, blocks)
    return ids[choice]


def out_shape(labels, margin, channels):
    return (labels.shape[0], channels) + tuple(s - 2 * m for s, m in zip(labels.shape[2:], margin))


# -- affinities -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LABEL_DTYPES)
@pytest.mark.parametrize("margin", MARGINS)
@pytest.mark.parametrize("offsets", list(OFFSETS), ids=list(OFFSETS))
def test_affinities_match_numpy(rng, dtype, margin, offsets):
    offsets = OFFSETS[offsets]
    labels = random_labels(rng, dtype)
    ids = [int(i) for i in IDS[dtype]]
    shape = out_shape(labels, margin, len(offsets))
    for background, ignore in [(0, None), (None, None), (ids[2], ids[1]), (ids[1], ids[1]), (None, ids[3])]:
        for out_dtype in (np.float32, np.uint8):
            out, mask = np.full(shape, 7, out_dtype), np.full(shape, 7, np.uint8)  # every voxel must be written
            _targets.affinities(labels, offsets, margin, background, ignore, out, mask)
            expected, expected_mask = affinities_reference(labels, offsets, margin, background, ignore, out_dtype)
            where = f"background={background}, ignore={ignore}, {np.dtype(out_dtype)}"
            np.testing.assert_array_equal(out, expected, err_msg=where)
            np.testing.assert_array_equal(mask, expected_mask, err_msg=where)


@pytest.mark.parametrize("offsets", ["nearest", "negative", "long-range"])
def test_unknown_voxels_mask_every_affinity_that_compares_them(rng, offsets):
    """Channel k compares voxel v with v + offsets[k]: where either is unknown (moved in by a warp or a slip), its
    affinity is masked. The neighbour on the other side, v - offsets[k], was checked instead, leaving affinities
    with an unknown neighbour trained on (a loader with Rotate: hundreds per batch)."""
    target = Affinities(offsets=OFFSETS[offsets])
    margin = target.margin()
    out_size = (3, 4, 5)
    shape = (2, 1) + tuple(n + 2 * m for n, m in zip(out_size, margin))
    labels = rng.integers(1, 3, size=shape).astype(np.uint64)
    valid = (rng.random(shape) > 0.3).astype(np.uint8)
    out = compute_targets(labels, [target], margin)
    before = out[target.mask_name].copy()
    target.mask_unknown(valid, margin, out)
    for k, offset in enumerate(target.offsets):
        for b, z, y, x in np.ndindex(shape[0], *out_size):
            voxel = tuple(c + m for c, m in zip((z, y, x), margin))
            neighbour = tuple(c + o for c, o in zip(voxel, offset))
            expected = before[b, k, z, y, x] and valid[(b, 0) + voxel] and valid[(b, 0) + neighbour]
            assert out[target.mask_name][b, k, z, y, x] == expected, (k, offset, (b, z, y, x))


def test_affinities_follow_gunpowder_convention():
    """Channel k at v links v with v + offset: by hand on one row."""
    labels = np.array([1, 1, 2, 2, 0, 0, 3], dtype=np.uint64).reshape(1, 1, 1, 1, 7)
    out, mask = np.empty((1, 2, 1, 1, 7), np.float32), np.empty((1, 2, 1, 1, 7), np.uint8)
    _targets.affinities(labels, [(0, 0, -1), (0, 0, 2)], (0, 0, 0), 0, 3, out, mask)
    np.testing.assert_array_equal(out[0, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0])  # label[x] == label[x - 1] != 0
    np.testing.assert_array_equal(mask[0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 0])  # x - 1 outside; 3 is ignored
    np.testing.assert_array_equal(out[0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0])  # label[x] == label[x + 2]
    np.testing.assert_array_equal(mask[0, 1, 0, 0], [1, 1, 1, 1, 0, 0, 0])


@pytest.mark.parametrize("nhood", [
    [(-1, 0, 0), (0, -1, 0), (0, 0, -1)],                       # gunpowder's usual nearest neighbours
    [(1, 0, 0), (0, 1, 0), (0, 0, 1)],
    [(-1, 0, 0), (0, -3, 0), (0, 0, -9), (0, 9, 0), (-2, 4, -5)],  # long range and mixed signs (lsd configs)
])
def test_affinities_equal_gunpowder_seg_to_affgraph(rng, nhood):
    seg = rng.integers(0, 4, (7, 22, 23)).astype(np.uint64)  # few ids and background 0: many equal neighbours
    out = np.empty((1, len(nhood)) + seg.shape, np.float32)
    mask = np.empty(out.shape, np.uint8)
    _targets.affinities(seg[None, None], nhood, (0, 0, 0), 0, None, out, mask)
    np.testing.assert_array_equal(out[0], seg_to_affgraph(seg, nhood))
    # and through the public target, cut from a larger label window: the same where the neighbour is known
    target = Affinities(offsets=nhood)
    margin = target.margin()
    outputs = {name: np.empty((1, channels) + tuple(s - 2 * m for s, m in zip(seg.shape, margin)), dtype)
               for name, (channels, dtype) in target.outputs().items()}
    target.compute(seg[None, None], margin, outputs)
    inner = tuple(slice(m, s - m) for m, s in zip(margin, seg.shape))
    np.testing.assert_array_equal(outputs["affinities"][0], seg_to_affgraph(seg, nhood)[(slice(None),) + inner])
    assert outputs["affinities_mask"].all()


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
@pytest.mark.parametrize("margin", MARGINS)
@pytest.mark.parametrize("offsets", ["negative", "long-range"])
def test_unlabelled_masks_the_affinities_between_two_unlabelled_voxels_as_gunpowder(rng, dtype, margin, offsets):
    """gunpowder's AddAffinities(unlabelled=...): its mask times 1 - seg_to_affgraph(1 - unlabelled), here with
    the unlabelled region given by an id."""
    offsets = OFFSETS[offsets]
    labels = random_labels(rng, dtype)
    ids = [int(i) for i in IDS[dtype]]
    inner = (slice(None), slice(None)) + tuple(slice(m, s - m) for m, s in zip(margin, labels.shape[2:]))
    for background, ignore, unlabelled in [(ids[0], None, ids[0]), (ids[0], ids[1], ids[2]), (None, None, ids[3]),
                                           (ids[1], ids[2], ids[2])]:
        shape = out_shape(labels, margin, len(offsets))
        out, mask = np.full(shape, 7, np.float32), np.full(shape, 7, np.uint8)
        _targets.affinities(labels, offsets, margin, background, ignore, out, mask, unlabelled)
        expected, known = affinities_reference(labels, offsets, margin, background, ignore)
        both = np.stack([seg_to_affgraph((patch[0] == unlabelled).astype(np.int32), offsets)
                         for patch in labels])[inner]
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(mask, known * (1 - both))
        assert both.any()


@pytest.mark.parametrize("margin", MARGINS)
@pytest.mark.parametrize("offsets", ["negative", "long-range"])  # gunpowder's own definition fails beyond the patch
def test_an_unlabelled_region_given_apart_from_the_labels_masks_as_gunpowders_array(rng, margin, offsets):
    """compute_targets(unlabelled={id: region}): the region where the labels held the id before they changed (a
    GrowBoundary), as gunpowder's separate unlabelled array: its mask times 1 - seg_to_affgraph(region)."""
    offsets = OFFSETS[offsets]
    labels = random_labels(rng, np.uint64)
    region = (rng.random(labels.shape) < 0.4).astype(np.uint8)
    inner = (slice(None), slice(None)) + tuple(slice(m, s - m) for m, s in zip(margin, labels.shape[2:]))
    out = compute_targets(labels, [Affinities(offsets=offsets, unlabelled=0)], margin, unlabelled={0: region})
    expected, known = affinities_reference(labels, offsets, margin)
    both = np.stack([seg_to_affgraph(patch[0].astype(np.int32), offsets) for patch in region])[inner]
    np.testing.assert_array_equal(out["affinities"], expected)
    np.testing.assert_array_equal(out["affinities_mask"], known * (1 - both))


def test_an_object_next_to_the_unlabelled_region_ends_there():
    labels = np.array([0, 0, 5, 5, 5, 0, 0], np.uint32).reshape(1, 1, 1, 1, 7)
    out = compute_targets(labels, [Affinities(offsets=[(0, 0, -1)], unlabelled=0)])
    assert out["affinities"].reshape(-1).tolist() == [0, 0, 0, 1, 1, 0, 0]
    assert out["affinities_mask"].reshape(-1).tolist() == [0, 0, 1, 1, 1, 1, 0]  # 0-0 pairs (and the edge) left out
    with pytest.raises(ValueError, match=r"unlabelled -1 cannot occur in uint32 labels"):
        compute_targets(labels, [Affinities(unlabelled=-1)])


def test_default_affinities_are_gunpowders_nearest_neighbours():
    assert Affinities().offsets == ((-1, 0, 0), (0, -1, 0), (0, 0, -1))


def test_huge_offsets_give_a_masked_channel(rng):
    labels = random_labels(rng, np.uint64)
    shape = out_shape(labels, (1, 1, 1), 2)
    out, mask = np.full(shape, 7, np.float32), np.full(shape, 7, np.uint8)
    _targets.affinities(labels, [(0, 0, 2**70), (1, 0, 0)], (1, 1, 1), 0, None, out, mask)
    assert not out[:, 0].any() and not mask[:, 0].any()
    expected, expected_mask = affinities_reference(labels, [(1, 0, 0)], (1, 1, 1))
    np.testing.assert_array_equal(out[:, 1:], expected)
    np.testing.assert_array_equal(mask[:, 1:], expected_mask)


# -- boundaries, classes, foreground ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LABEL_DTYPES)
@pytest.mark.parametrize("margin", MARGINS)
def test_boundaries_match_numpy(rng, dtype, margin):
    labels = random_labels(rng, dtype)
    for thickness in (1, 2, 4, 50):
        for in_plane in (False, True):
            out = np.full(out_shape(labels, margin, 1), 7, np.uint8)
            _targets.boundaries(labels, margin, thickness, in_plane, out)
            np.testing.assert_array_equal(out, boundaries_reference(labels, margin, thickness, in_plane),
                                          err_msg=f"thickness={thickness}, in_plane={in_plane}")


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
@pytest.mark.parametrize("margin", MARGINS)
def test_classes_match_numpy(rng, dtype, margin):
    labels = random_labels(rng, dtype)
    ids = [int(i) for i in IDS[dtype]]
    cases = [(0, 1, False, (0, 1, 2)), (ids[2], 2, True, (5, 200, 9)), (None, 1, False, (0, 1, 2)),
             (ids[1], 3, False, (2, 1, 0))]
    for background, thickness, in_plane, values in cases:
        for out_dtype in (np.int64, np.uint8):
            out = np.full(out_shape(labels, margin, 1), 7, out_dtype)
            _targets.classes(labels, margin, thickness, in_plane, background, values, out)
            expected = classes_reference(labels, margin, background, thickness, in_plane, values, out_dtype)
            np.testing.assert_array_equal(out, expected, err_msg=f"{background}, {thickness}, {in_plane}")


@pytest.mark.parametrize("dtype", LABEL_DTYPES)
@pytest.mark.parametrize("margin", MARGINS)
def test_foreground_matches_numpy(rng, dtype, margin):
    labels = random_labels(rng, dtype)
    for background in IDS[dtype]:
        out = np.full(out_shape(labels, margin, 1), 7, np.uint8)
        _targets.foreground(labels, margin, int(background), out)
        np.testing.assert_array_equal(out, foreground_reference(labels, margin, background))


def test_classes_by_hand():
    labels = np.array([0, 0, 4, 4, 4, 4, 4, 5], dtype=np.int64).reshape(1, 1, 1, 1, 8)
    out = np.empty((1, 1, 1, 1, 8), np.int64)
    _targets.classes(labels, (0, 0, 0), 1, False, 0, (0, 1, 2), out)
    np.testing.assert_array_equal(out.ravel(), [0, 0, 1, 2, 2, 2, 1, 1])


# -- margin semantics -------------------------------------------------------------------------------------------

def test_targets_cut_with_the_required_margin_equal_the_full_volume_targets(rng):
    """A patch cut with required_margin gives exactly the targets of the whole volume at the patch's place."""
    volume = random_labels(rng, np.uint64, (1, 1, 14, 30, 33))
    targets = [Affinities(offsets=((1, 0, 0), (0, -3, 0), (0, 2, 9))), Boundaries(thickness=2),
               Classes(thickness=2, in_plane=True, name="cls"), Foreground()]
    margin = required_margin(targets)
    assert margin == (2, 3, 9)
    full = compute_targets(volume, targets)
    corner, patch = (4, 6, 11), (5, 9, 4)
    lo = [c - m for c, m in zip(corner, margin)]
    labels = np.ascontiguousarray(volume[(slice(None), slice(None)) + tuple(
        slice(l, c + p + m) for l, c, p, m in zip(lo, corner, patch, margin))])
    cut = compute_targets(labels, targets, margin)
    inside = (slice(None), slice(None)) + tuple(slice(c, c + p) for c, p in zip(corner, patch))
    assert set(cut) == {"affinities", "affinities_mask", "boundaries", "cls", "foreground"}
    for field, array in cut.items():
        assert array.shape == (1, array.shape[1]) + patch
        np.testing.assert_array_equal(array, full[field][inside], err_msg=field)
    assert cut["affinities_mask"].all()  # no neighbour unknown


# -- specifications ---------------------------------------------------------------------------------------------

def test_specifications_describe_their_outputs():
    a = Affinities(offsets=[(1, 0, 0), (0, -2, 0), np.array([0, 0, 9])], dtype=np.uint8)
    assert a.offsets == ((1, 0, 0), (0, -2, 0), (0, 0, 9)) and a.channels == 3 and a.margin() == (1, 2, 9)
    assert a.outputs() == {"affinities": (3, np.dtype(np.uint8)), "affinities_mask": (3, np.dtype(np.uint8))}
    assert Boundaries(thickness=2, in_plane=True).margin() == (0, 2, 2)
    assert Classes(thickness=3).margin() == (3, 3, 3)
    assert Classes().outputs() == {"classes": (1, np.dtype(np.int64))}
    assert Foreground().margin() == (0, 0, 0) and Foreground().channels == 1
    assert required_margin([]) == (0, 0, 0)
    assert [t.name for t in resolve(["affinities", "foreground"])] == ["affinities", "foreground"]
    assert list(outputs([Affinities(), Affinities(offsets=((0, 0, 9),), name="long")])) == [
        "affinities", "affinities_mask", "long", "long_mask"]


def test_compute_writes_into_given_arrays(rng):
    labels = random_labels(rng, np.uint32)
    target = Affinities(offsets=((0, 0, 3), (2, 0, 0)), background=None, ignore=2**31, dtype="uint8")
    given = {field: np.empty(out_shape(labels, (1, 0, 3), channels), dtype)
             for field, (channels, dtype) in target.outputs().items()}
    result = compute_targets(labels, [target], (1, 0, 3), out=given)
    assert result["affinities"] is given["affinities"] and result["affinities_mask"] is given["affinities_mask"]
    expected = affinities_reference(labels, target.offsets, (1, 0, 3), None, 2**31, np.uint8)
    np.testing.assert_array_equal(given["affinities"], expected[0])
    np.testing.assert_array_equal(given["affinities_mask"], expected[1])


@pytest.mark.parametrize("make, match", [
    (lambda: Affinities(offsets=((0, 0, 0),)), r"Affinities: offset \(0, 0, 0\)"),
    (lambda: Affinities(offsets=()), "at least one"),
    (lambda: Affinities(offsets=((1, 0),)), r"Affinities: offset \(1, 0\) is not a \(dz, dy, dx\) triple"),
    (lambda: Affinities(offsets=(1, 0, 0)), r"write \(\(1, 0, 0\),\)"),
    (lambda: Affinities(offsets=((1.5, 0, 0),)), "must hold integers"),
    (lambda: Affinities(offsets="zyx"), "sequence of"),
    (lambda: Affinities(background=1.0), "Affinities: background"),
    (lambda: Affinities(ignore=2**64), "Affinities: ignore"),
    (lambda: Affinities(dtype="float64"), "Affinities: dtype"),
    (lambda: Affinities(name=""), "Affinities: name"),
    (lambda: Boundaries(thickness=0), "Boundaries: thickness"),
    (lambda: Boundaries(in_plane="yes"), "Boundaries: in_plane"),
    (lambda: Classes(values=(0, 1)), "Classes: values"),
    (lambda: Classes(values=(0, 1, 256), dtype="uint8"), r"Classes: values \(0, 1, 256\) do not fit"),
    (lambda: Classes(dtype="float32"), "Classes: dtype"),
    (lambda: Foreground(background=None), "Foreground: background"),
])
def test_bad_specifications_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_target_lists_and_dtypes_are_refused():
    with pytest.raises(ValueError, match="did you mean 'affinities'"):
        resolve(["afinities"])
    with pytest.raises(TypeError, match="names or Target"):
        resolve([3])
    with pytest.raises(ValueError, match="field 'affinities'"):
        resolve([Affinities(), Affinities()])
    with pytest.raises(ValueError, match="Affinities: ignore -1 cannot occur in uint64"):
        Affinities(ignore=-1).check(np.uint64)
    with pytest.raises(TypeError, match="Foreground: labels have dtype uint8"):
        Foreground().check(np.uint8)
    Classes(background=-5).check(np.int64)
    with pytest.raises(KeyError, match="affinities_mask"):
        Affinities().compute(np.zeros((1, 1, 3, 3, 3), np.uint64), (0, 0, 0),
                             {"affinities": np.zeros((1, 3, 3, 3, 3), np.float32)})


# -- argument checks of the wrappers ----------------------------------------------------------------------------

def test_bad_kernel_arguments_are_refused(rng):
    labels = random_labels(rng, np.uint64, (2, 1, 6, 8, 10))
    shape = out_shape(labels, (1, 1, 1), 1)
    aff, mask = np.empty(shape, np.float32), np.empty(shape, np.uint8)
    ok = dict(offsets=[(1, 0, 0)], margin=(1, 1, 1), background=0, ignore=None, out=aff, mask=mask)

    def affinities(**changes):
        _targets.affinities(**{**dict(labels=labels), **ok, **changes})

    affinities()
    with pytest.raises(TypeError, match="labels have dtype uint8"):
        affinities(labels=labels.astype(np.uint8))
    with pytest.raises(TypeError, match="labels have dtype >u8"):
        affinities(labels=labels.astype(">u8"))
    with pytest.raises(TypeError, match="NumPy array"):
        affinities(labels=labels.tolist())
    with pytest.raises(ValueError, match=r"shape \(B, 1, Z, Y, X\)"):
        affinities(labels=labels[:, 0])
    with pytest.raises(ValueError, match="C-contiguous"):
        affinities(labels=np.asfortranarray(labels))
    with pytest.raises(ValueError, match="no output voxel along axis z"):
        affinities(margin=(3, 1, 1))
    with pytest.raises(ValueError, match=">= 0"):
        affinities(margin=(1, -1, 1))
    with pytest.raises(ValueError, match="three integers"):
        affinities(margin=(1, 1))
    with pytest.raises(ValueError, match="margin must be an integer"):
        affinities(margin=(1, 1, 1.0))
    with pytest.raises(ValueError, match="at least one"):
        affinities(offsets=[])
    with pytest.raises(ValueError, match=r"offset 1 is \(0, 0, 0\)"):
        affinities(offsets=[(1, 0, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match="offset 0 must be a"):
        affinities(offsets=[(1, 0)])
    with pytest.raises(ValueError, match="offset 0 must be an integer"):
        affinities(offsets=[(True, 0, 0)])
    with pytest.raises(ValueError, match="background -1 cannot occur in uint64"):
        affinities(background=-1)
    with pytest.raises(ValueError, match="ignore 18446744073709551616 cannot occur"):
        affinities(ignore=2**64)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 1, 4, 6, 8\)"):
        affinities(offsets=[(1, 0, 0)], out=np.empty((2, 2, 4, 6, 8), np.float32))
    with pytest.raises(TypeError, match="out has dtype float64"):
        affinities(out=aff.astype(np.float64))
    with pytest.raises(TypeError, match="mask has dtype float32"):
        affinities(mask=aff)
    with pytest.raises(ValueError, match="writeable C-contiguous"):
        affinities(out=np.empty(shape[:-1] + (16,), np.float32)[..., ::2])
    readonly = np.empty(shape, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        affinities(mask=readonly)
    with pytest.raises(ValueError, match="out and mask must not overlap"):
        affinities(out=mask)
    overlapping = np.zeros((2, 1, 6, 8, 10), np.uint64)
    with pytest.raises(ValueError, match="must not overlap the labels"):
        bytes_of_labels = overlapping.view(np.uint8).reshape(-1)[:960].reshape(2, 1, 6, 8, 10)
        _targets.foreground(overlapping, (0, 0, 0), 0, bytes_of_labels)

    with pytest.raises(ValueError, match="thickness must be >= 1"):
        _targets.boundaries(labels, (1, 1, 1), 0, False, mask)
    with pytest.raises(TypeError, match="out has dtype float32"):
        _targets.boundaries(labels, (1, 1, 1), 1, False, aff)
    with pytest.raises(ValueError, match="values .* do not fit dtype uint8"):
        _targets.classes(labels, (1, 1, 1), 1, False, 0, (0, 1, 300), mask)
    with pytest.raises(ValueError, match="three integer class ids"):
        _targets.classes(labels, (1, 1, 1), 1, False, 0, (0, 1), mask)
    with pytest.raises(ValueError, match="background must be an integer"):
        _targets.foreground(labels, (1, 1, 1), None, mask)
    with pytest.raises(ValueError, match="background 4294967296 cannot occur in uint32"):
        _targets.foreground(labels.astype(np.uint32), (1, 1, 1), 2**32, mask)
    with pytest.raises(ValueError, match="no output voxel along axis x"):
        compute_targets(labels, [Foreground()], (0, 0, 5))


def test_empty_batch_is_a_no_op():
    labels = np.zeros((0, 1, 4, 4, 4), np.int64)
    result = compute_targets(labels, [Affinities(), Boundaries(), Classes(), Foreground()], (1, 1, 1))
    assert all(array.shape[0] == 0 for array in result.values())


def test_subclasses_cannot_misreport_their_geometry(rng):
    class Liar(np.ndarray):
        @property
        def shape(self):
            return (1, 1, 4096, 4096, 4096)

    labels = random_labels(rng, np.uint64, (1, 1, 4, 4, 4)).view(Liar)
    with pytest.raises(ValueError, match=r"out must have shape \(1, 1, 4, 4, 4\)"):
        _targets.foreground(labels, (0, 0, 0), 0, np.empty((1, 1, 8, 8, 8), np.uint8))
    out = np.empty((1, 1, 4, 4, 4), np.uint8)
    _targets.foreground(labels, (0, 0, 0), 0, out)
    np.testing.assert_array_equal(out, foreground_reference(np.asarray(labels)))


def test_targets_are_instances_of_the_base_class():
    assert all(isinstance(t, Target) for t in (Affinities(), Boundaries(), Classes(), Foreground()))


# -- threads ----------------------------------------------------------------------------------------------------

def test_kernels_release_the_gil(rng):
    """While one thread runs a long kernel, another keeps running Python code."""
    labels = random_volume(rng, (16, 1, 34, 130, 130), np.uint32) & np.uint32(7)
    offsets = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 0, 9)]
    shape = out_shape(labels, (1, 1, 1), len(offsets))
    out, mask = np.empty(shape, np.float32), np.empty(shape, np.uint8)
    args = (labels, offsets, (1, 1, 1), 0, 3, out, mask)
    assert_releases_gil(_targets.affinities, *args)


@pytest.mark.parametrize("spec, kernel", [
    (lambda: Classes(values=(0, 1)), lambda labels, out: _targets.classes(labels, (0, 0, 0), 1, False, 0, (0, 1), out)),
    (lambda: Affinities(offsets=[]), lambda labels, out: _targets.affinities(labels, [], (0, 0, 0), None, None, out,
                                                                              out.copy())),
    (lambda: Foreground(background=-1).check(np.dtype(np.uint64)),
     lambda labels, out: _targets.foreground(labels, (0, 0, 0), -1, out)),
])
def test_a_bad_setting_is_refused_in_the_same_words_by_the_target_and_its_kernel(rng, spec, kernel):
    """The kernel wrappers follow emfast._checks' rule: a refused setting is a ValueError naming it, in the words
    of the public target (which adds its name in front)."""
    labels = random_labels(rng, np.uint64, (1, 1, 4, 4, 4))
    with pytest.raises(ValueError) as public:
        spec()
    with pytest.raises(ValueError) as private:
        kernel(labels, np.empty((1, 1, 4, 4, 4), np.uint8))
    assert str(public.value).split(": ", 1)[1] == str(private.value)
    assert public.value.emfast_setting == private.value.emfast_setting


@pytest.mark.parametrize("target", [Foreground(name="mask"), Foreground(name="labels"), Affinities(name="labels"),
                                    Foreground(name="labels_valid"), Foreground(name="raw")], ids=repr)
def test_a_target_named_as_a_batch_field_is_refused_when_the_loader_is_built(target):
    """``Foreground(name="mask")`` silently replaced the sample's training mask, ``name="labels"`` the labels, and
    ``name="labels_valid"`` with a rotation dropped the target; ``name="raw"`` failed at the first batch from a
    kernel ("out has dtype uint8")."""
    raw = np.zeros((16, 32, 32), np.uint8)
    labels = np.ones((16, 32, 32), np.uint64)
    with pytest.raises(ValueError, match="collides with the batch field of that name; give the target another "
                                         "name="):
        emfast.Loader(raw, labels, patch=(8, 16, 16), targets=[target])


@pytest.mark.parametrize("given", ["affinities", ["affinities", "boundaries"], "one Affinities"])
def test_compute_targets_takes_targets_as_the_loader_does(given):
    """Names, and a single target, as Loader(targets=...) takes them: they failed deep inside ('str' object has
    no attribute 'outputs'; 'Affinities' object is not iterable)."""
    labels = np.random.default_rng(5).integers(0, 4, (2, 1, 6, 10, 10)).astype(np.uint64)
    if given == "one Affinities":
        given, objects = emfast.Affinities(), [emfast.Affinities()]
    else:
        objects = [emfast.Affinities() if name == "affinities" else emfast.Boundaries()
                   for name in ([given] if isinstance(given, str) else given)]
    ours, reference = emfast.compute_targets(labels, given), emfast.compute_targets(labels, objects)
    assert ours.keys() == reference.keys() and all(np.array_equal(ours[k], reference[k]) for k in ours)
    with pytest.raises(ValueError, match="affinitys"):
        emfast.compute_targets(labels, "affinitys")
