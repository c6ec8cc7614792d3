"""Section defects: only the claimed sections change, labels follow slips exactly, draws are reproducible."""
import dataclasses

import numpy as np
import pytest

import emfast as ef
from emfast._core import intensity as _intensity
from emfast.augment import Params, Patches, resolve
from emfast.augment import Artifacts, LowContrast, MissingSection, Slip
from reference import assert_releases_gil

RAW_DTYPES = [np.float32, np.float16]
SHAPE = (4, 2, 9, 12, 21)  # (B, C, Z, Y, X)


def random_raw(rng, dtype, shape=SHAPE):
    return rng.random(shape, dtype=np.float32).astype(dtype)


def draw(augmentation, rng, batch):
    return augmentation.apply(rng.random((batch, augmentation.draws)), Params.identity(batch))


def hit_planes(events, shape):
    """Boolean (B, Z): the sections the events claim."""
    hit = np.zeros((shape[0], shape[2]), bool)
    hit[events.example, events.section] = True
    return hit


def assert_only_sections_changed(out, raw, hit):
    """Sections not hit are bit for bit the input (every channel)."""
    keep = ~hit
    bits = np.uint32 if raw.dtype == np.float32 else np.uint16
    np.testing.assert_array_equal(out.view(bits).transpose(0, 2, 1, 3, 4)[keep],
                                  raw.view(bits).transpose(0, 2, 1, 3, 4)[keep])


def lane_mean(x):
    flat = x.astype(np.float32).ravel().astype(np.float64)
    padded = np.concatenate([flat, np.zeros(-len(flat) % 4)]).reshape(-1, 4)
    s = np.cumsum(padded, axis=0)[-1]
    return np.float32(((s[0] + s[1]) + (s[2] + s[3])) / len(flat))


def shifted(plane, dy, dx, fill):
    """Reference move: new[y, x] = old[y - dy, x - dx] inside the plane, else fill (by padding and slicing)."""
    h, w = plane.shape
    pad = max(h, w) + max(abs(dy), abs(dx))
    big = np.pad(plane, pad, constant_values=fill)
    return big[pad - dy:pad - dy + h, pad - dx:pad - dx + w]


@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_missing_sections_are_filled_and_nothing_else_changes(rng, dtype):
    raw = random_raw(rng, dtype)
    missing = MissingSection(p=0.2, fill=0.25)
    record = draw(missing, rng, len(raw))
    out = raw.copy()
    missing.process(record, Patches(raw=out, valid=3))
    events = missing.events(record, raw.shape, 3)
    hit = hit_planes(events, raw.shape)
    assert hit.any() and not hit[3:].any()
    assert (out.transpose(0, 2, 1, 3, 4)[hit] == dtype(0.25)).all()
    assert_only_sections_changed(out, raw, hit)


@pytest.mark.parametrize("dtype", RAW_DTYPES)
def test_low_contrast_sections_match_numpy_exactly(rng, dtype):
    raw = random_raw(rng, dtype)
    low = LowContrast(p=0.2, factor=(0.2, 0.5))
    record = draw(low, rng, len(raw))
    out = raw.copy()
    low.process(record, Patches(raw=out, valid=len(raw)))
    events = low.events(record, raw.shape, len(raw))
    assert len(events.example) > 2
    for n, z, factor in zip(events.example, events.section, events.values[:, 0]):
        assert 0.2 <= factor <= 0.5
        for c in range(raw.shape[1]):
            x = raw[n, c, z].astype(np.float32)
            mean = lane_mean(x)
            np.testing.assert_array_equal(out[n, c, z], ((x - mean) * np.float32(factor) + mean).astype(dtype))
    assert_only_sections_changed(out, raw, hit_planes(events, raw.shape))


@pytest.mark.parametrize("dtype", RAW_DTYPES)
@pytest.mark.parametrize("source_dtype", [np.uint8, np.float32])
def test_artifacts_blend_matches_numpy_exactly(rng, dtype, source_dtype):
    source = (rng.integers(0, 256, (5, 20, 30)).astype(source_dtype) if source_dtype == np.uint8
              else rng.random((5, 20, 30), dtype=np.float32))
    artifacts = Artifacts(ef.Volume.from_array(source), p=0.2, alpha=(0.5, 1.0))
    raw = random_raw(rng, dtype)
    record = draw(artifacts, rng, len(raw))
    out = raw.copy()
    artifacts.process(record, Patches(raw=out, valid=len(raw)))
    events = artifacts.events(record, raw.shape, len(raw))
    assert len(events.example) > 2
    scale = np.float32(1 / 255 if source_dtype == np.uint8 else 1.0)
    h, w = raw.shape[3:]
    for n, z, (alpha, az, ay, ax) in zip(events.example, events.section, events.values):
        assert 0.5 <= alpha <= 1.0
        box = source[int(az), int(ay):int(ay) + h, int(ax):int(ax) + w].astype(np.float32) * scale + np.float32(0)
        a = np.float32(alpha)
        for c in range(raw.shape[1]):
            expected = raw[n, c, z].astype(np.float32) * (np.float32(1) - a) + box * a
            np.testing.assert_array_equal(out[n, c, z], expected.astype(dtype))
    assert_only_sections_changed(out, raw, hit_planes(events, raw.shape))


def test_artifacts_refuse_bad_volumes(rng):
    with pytest.raises(ValueError, match="dtype uint16"):
        Artifacts(np.zeros((2, 30, 30), np.uint16))
    with pytest.raises(ValueError, match="channels"):
        Artifacts(np.zeros((2, 3, 30, 30), np.uint8))
    with pytest.raises(ValueError, match="needs a volume"):
        Artifacts()
    with pytest.raises(ValueError, match="NaN"):
        Artifacts(np.full((2, 30, 30), np.nan, np.float32))
    with pytest.raises(ValueError, match="alpha"):
        Artifacts(np.zeros((2, 30, 30), np.uint8), alpha=(0.5, 1.5))
    small = Artifacts(ef.Volume.from_array(np.zeros((2, 30, 10), np.uint8), name="dust.h5:artifacts"), p=1.0)
    with pytest.raises(ValueError, match=r"dust.h5:artifacts has sections of \(30, 10\), smaller"):
        small.process(draw(small, rng, 2), Patches(raw=np.zeros((2, 1, 3, 12, 21), np.float32), valid=2))


def code(z, y, x):
    """A distinct positive id of raw coordinate (z, y, x), also for coordinates outside the window; exact in
    float32."""
    return 1 + ((z + 4) * 100 + (y + 20)) * 100 + (x + 20)


def coordinate_batch(batch, channels, raw_shape, labels_shape, offset):
    """raw (float32) and labels (uint64) holding the code of each voxel's raw coordinate."""
    z, y, x = np.meshgrid(*[np.arange(s) for s in raw_shape], indexing="ij")
    raw = np.broadcast_to(code(z, y, x).astype(np.float32), (batch, channels) + tuple(raw_shape)).copy()
    z, y, x = np.meshgrid(*[np.arange(s) + o for s, o in zip(labels_shape, offset)], indexing="ij")
    labels = np.broadcast_to(code(z, y, x).astype(np.uint64), (batch, 1) + tuple(labels_shape)).copy()
    return raw, labels


GEOMETRIES = {
    "same": ((7, 16, 18), (0, 0, 0)),
    "labels-with-margin": ((11, 22, 20), (-2, -3, -1)),  # labels reach beyond raw (target context)
    "labels-inside": ((4, 10, 12), (2, 3, 4)),  # raw has context around the labels
}


@pytest.mark.parametrize("mode", ["slip", "step"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_labels_follow_slips_exactly(rng, mode, geometry):
    labels_shape, offset = GEOMETRIES[geometry]
    raw_shape = (7, 16, 18)
    raw, labels = coordinate_batch(3, 2, raw_shape, labels_shape, offset)
    valid_mask = np.ones(labels.shape, np.uint8)
    slip = Slip(p=0.3, max_shift=(5, 6), mode=mode, labels="shift", fill=0.0)
    record = draw(slip, rng, 3)
    out, out_labels, out_valid = raw.copy(), labels.copy(), valid_mask.copy()
    slip.process(record, Patches(raw=out, labels=out_labels, labels_offset=offset, labels_valid=out_valid,
                                 valid=3))
    table = slip.shifts(record, raw.shape, 3)
    assert np.abs(table).sum() > 0
    moved_somewhere, compared = False, 0
    for n in range(3):
        for z in range(raw_shape[0]):  # raw: each section moved by its table entry, fill outside
            dy, dx = table[n, z]
            for c in range(2):
                np.testing.assert_array_equal(out[n, c, z], shifted(raw[n, c, z], dy, dx, 0))
        for zl in range(labels_shape[0]):  # labels: moved as their raw section, 0 / invalid outside
            s = zl + offset[0]
            dy, dx = (0, 0) if s < 0 else table[n, min(s, raw_shape[0])]
            np.testing.assert_array_equal(out_labels[n, 0, zl], shifted(labels[n, 0, zl], dy, dx, 0))
            np.testing.assert_array_equal(out_valid[n, 0, zl], shifted(valid_mask[n, 0, zl], dy, dx, 0))
            moved_somewhere |= bool(dy or dx)
        # alignment: wherever raw and labels both hold content, they hold the same coordinate's content
        for zl in range(labels_shape[0]):
            zr = zl + offset[0]
            if not 0 <= zr < raw_shape[0]:
                continue
            ys = np.arange(labels_shape[1]) + offset[1]
            xs = np.arange(labels_shape[2]) + offset[2]
            inside = ((ys >= 0) & (ys < raw_shape[1]))[:, None] & ((xs >= 0) & (xs < raw_shape[2]))[None, :]
            r = out[n, 0, zr][np.clip(ys, 0, raw_shape[1] - 1)][:, np.clip(xs, 0, raw_shape[2] - 1)]
            lab = out_labels[n, 0, zl]
            both = inside & (r != 0) & (lab != 0)
            np.testing.assert_array_equal(r[both].astype(np.uint64), lab[both])
            compared += int(both.sum())
            assert (out_valid[n, 0, zl][lab == 0] == 0).all()
    assert moved_somewhere and compared > 0
    if mode == "step":  # a step moves every later section by the accumulated vector
        assert (np.diff(table[:, :raw_shape[0]], axis=1) != 0).any()
        assert (table[:, raw_shape[0]] == table[:, raw_shape[0] - 1]).all()


def test_slip_moves_single_sections_and_step_the_rest(rng):
    raw = random_raw(rng, np.float32, (64, 1, 6, 8, 8))
    for mode in ("slip", "step"):
        slip = Slip(p=0.2, max_shift=(3, 3), mode=mode)
        record = draw(slip, rng, len(raw))
        events = slip.events(record, raw.shape, len(raw))
        table = slip.shifts(record, raw.shape, len(raw))
        moved = table[:, :6].any(axis=2)
        if mode == "slip":
            expected = np.zeros_like(moved)
            expected[events.example, events.section] = events.values.any(axis=1)
            np.testing.assert_array_equal(moved, expected)
        else:
            assert not (events.section == 0).any()
            np.testing.assert_array_equal(table[:, 0], 0)
            np.testing.assert_array_equal(np.diff(table[:, :6], axis=1)[events.example, events.section - 1],
                                          events.values.astype(np.int64))
        assert np.abs(events.values).max() <= 3


def test_slip_mask_mode_leaves_labels_and_masks_moved_sections(rng):
    raw, labels = coordinate_batch(3, 1, (7, 16, 18), (11, 22, 20), (-2, -3, -1))
    valid_mask = np.ones(labels.shape, np.uint8)
    slip = Slip(p=0.3, mode="step", labels="mask")
    record = draw(slip, rng, 3)
    out_labels, out_valid = labels.copy(), valid_mask.copy()
    slip.process(record, Patches(raw=raw.copy(), labels=out_labels, labels_offset=(-2, -3, -1),
                                 labels_valid=out_valid, valid=3))
    np.testing.assert_array_equal(out_labels, labels)
    table = slip.shifts(record, raw.shape, 3)
    source = np.arange(11) - 2
    moved = table[:, np.clip(source, 0, 7)].any(axis=2) & (source >= 0)
    assert moved.any()
    np.testing.assert_array_equal(out_valid[:, 0].any(axis=(2, 3)), ~moved)
    np.testing.assert_array_equal(out_valid[:, 0].all(axis=(2, 3)), ~moved)
    with pytest.raises(ValueError, match="labels_valid"):
        slip.process(record, Patches(raw=raw.copy(), labels=labels.copy(), valid=3))


@pytest.mark.parametrize("mode", ["slip", "step"])
def test_extra_channels_move_with_raw_in_the_loader(mode):
    """An extra channel holding raw's own volume stays equal to raw, voxel for voxel, under slips (it stayed in
    place before, so half its voxels were misaligned)."""
    volume = np.random.default_rng(5).integers(0, 255, (40, 80, 80), dtype=np.uint8)
    sample = ef.Sample(volume, extra={"em2": volume.copy()})
    slip = Slip(p=0.5, max_shift=(4, 4), mode=mode, fill=-3.0)
    with ef.Loader(sample, patch=(8, 32, 32), batch_size=4, threads=1, augment=[slip], seed=1) as loader:
        for _ in range(3):
            batch = loader.next_batch()
            assert (batch["raw"] == -3.0).any()
            np.testing.assert_array_equal(batch["em2"], batch["raw"])


def test_extra_channels_at_their_own_voxel_size_refuse_slips():
    raw = ef.Volume(np.zeros((16, 32, 32), np.uint8), resolution=(8, 8, 8), name="raw")
    coarse = ef.Volume(np.zeros((8, 16, 16), np.float32), resolution=(16, 16, 16), name="coarse")
    sample = ef.Sample(raw, extra={"coarse": coarse}, own_resolution=["coarse"])
    with pytest.raises(ValueError, match=r"\['slip'\] move raw's sections.*own_resolution: \['coarse'\]"):
        ef.Loader(sample, patch=(4, 8, 8), augment=[Slip()])
    ef.Loader(sample, patch=(4, 8, 8), augment=["mirror"]).close()


def test_section_draws_depend_only_on_key_and_section(rng):
    """A deeper window keeps the hits of the shallower one's sections: draws are keyed by (example, z)."""
    for defect in (MissingSection(p=0.3), LowContrast(p=0.3), Slip(p=0.3)):
        record = draw(defect, rng, 5)
        short = defect.events(record, (5, 1, 6, 8, 8), 5)
        deep = defect.events(record, (5, 1, 20, 8, 8), 5)
        keep = deep.section < 6
        np.testing.assert_array_equal(short.example, deep.example[keep])
        np.testing.assert_array_equal(short.section, deep.section[keep])
        np.testing.assert_array_equal(short.values, deep.values[keep])


def test_hit_rate_is_p(rng):
    missing = MissingSection(p=0.1)
    events = missing.events(draw(missing, rng, 200), (200, 1, 50, 4, 4), 200)
    assert abs(len(events.example) / (200 * 50) - 0.1) < 0.01


@pytest.mark.parametrize("make", [
    lambda v: MissingSection(p=0.2),
    lambda v: LowContrast(p=0.2),
    lambda v: Slip(p=0.2, mode="step"),
    lambda v: Artifacts(v, p=0.2),
])
def test_same_uniforms_same_output(rng, make):
    defect = make(rng.integers(0, 256, (3, 30, 30), dtype=np.uint8))
    raw = random_raw(rng, np.float16)
    uniforms = rng.random((len(raw), defect.draws))
    outputs = []
    for _ in range(2):
        out = raw.copy()
        defect.process(defect.apply(uniforms.copy(), Params.identity(len(raw))), Patches(raw=out, valid=len(raw)))
        outputs.append(out)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert not np.array_equal(outputs[0], raw)


@pytest.mark.parametrize("make, message", [
    (lambda: MissingSection(p=1.2), "probability"),
    (lambda: MissingSection(fill=float("inf")), "fill"),
    (lambda: LowContrast(factor=(0.5, 1.5)), "factor"),
    (lambda: LowContrast(p=-1), "probability"),
    (lambda: Slip(max_shift=(-1, 3)), "max_shift"),
    (lambda: Slip(max_shift=8), "max_shift"),
    (lambda: Slip(mode="translate"), "mode"),
    (lambda: Slip(labels="drop"), "labels"),
    (lambda: Artifacts(np.zeros((2, 8, 8), np.uint8), p=2), "probability"),
])
def test_bad_parameters_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_plane_kernels_release_the_gil():
    array = np.zeros((4, 1, 32, 256, 256), np.float32)
    planes = np.arange(4 * 32)
    assert_releases_gil(_intensity.shift_planes, array, planes, np.tile([3, -5], (len(planes), 1)), 0.0)


def test_names_resolve_for_config_files():
    resolved = resolve(["missing_section", "low_contrast", "slip"], isotropic=False)
    assert [type(a) for a in resolved] == [MissingSection, LowContrast, Slip]
    with pytest.raises(ValueError, match="needs a volume"):
        resolve(["artifacts"], isotropic=False)


def test_artifacts_read_strided_volumes(rng):
    """A view with steps in x (here every second column, mirrored) blends like its contiguous copy."""
    source = rng.integers(0, 256, (3, 24, 60), dtype=np.uint8)[:, ::-1, ::-2]
    raw = random_raw(rng, np.float32, (2, 1, 5, 12, 21))
    outputs = []
    for volume in (source, np.ascontiguousarray(source)):
        artifacts = Artifacts(volume, p=0.5)
        record = artifacts.apply(np.linspace(0.1, 0.9, 4).reshape(2, 2), Params.identity(2))
        out = raw.copy()
        artifacts.process(record, Patches(raw=out, valid=2))
        outputs.append(out)
    assert not np.array_equal(outputs[0], raw)
    np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize("make, owner", [(MissingSection, "MissingSection"), (Slip, "Slip")])
@pytest.mark.parametrize("fill", ["0", np.inf, True, None])
def test_a_fill_that_is_not_a_finite_number_is_refused_naming_it(make, owner, fill):
    with pytest.raises(ValueError) as error:
        make(fill=fill)
    assert str(error.value) == f"{owner}: fill must be a finite number, got {fill!r}"


def test_artifact_sections_as_large_as_the_window_serve_transposed_batches_too():
    """A transpose changes what a window reads, not the batch's (Y, X): artifacts of (16, 40) sections for a
    (8, 16, 40) patch were refused with Transpose, as smaller than a (40, 40) section no batch has."""
    raw = np.random.default_rng(3).integers(0, 256, (16, 48, 48), dtype=np.uint8)
    artifacts = np.random.default_rng(4).integers(0, 256, (3, 16, 40), dtype=np.uint8)
    with ef.Loader(raw, patch=(8, 16, 40), batch_size=4, augment=[ef.Transpose(), Artifacts(artifacts, p=1.0)],
                   seed=1) as loader:
        assert loader.next_batch()["raw"].shape == (4, 1, 8, 16, 40)
    with pytest.raises(ValueError, match=r"sections of \(16, 39\), smaller than the raw window's sections of "
                                         r"\(16, 40\)"):
        ef.Loader(raw, patch=(8, 16, 40), augment=[Artifacts(artifacts[:, :, :39])])


def test_defects_between_sections_are_refused_for_2d_patches_and_the_others_run():
    """On 1-section patches a missing section blanked whole inputs beside their full targets, and slips moved
    whole patches (or never happened, as steps): accepted silently, also through FULL (a review of 2-D use)."""
    raw = np.random.default_rng(3).integers(0, 256, (6, 48, 48), dtype=np.uint8)
    labels = np.ones(raw.shape, np.uint32)
    for augmentation, name in ((MissingSection(p=0.5), "missing_section"), (Slip(p=0.5), "slip"),
                               ("missing_section", "missing_section")):
        with pytest.raises(ValueError, match=rf"the raw window is 1 section deep, .* Leave {name} out for 2-D "
                                             r"patches \(ef.augment.FULL lists the defects between sections "
                                             r"missing_section, slip: pass its other names\)"):
            ef.Loader(ef.Sample(raw=raw, labels=labels), patch=(1, 32, 32), augment=[augmentation])
    others = [name for name in ef.augment.FULL if name not in ("missing_section", "slip")]
    artifacts = Artifacts(raw[:2], p=1.0)
    with ef.Loader(ef.Sample(raw=raw, labels=labels), patch=(1, 32, 32), batch_size=4, seed=0,
                   augment=others + [artifacts]) as loader:
        assert loader.next_batch()["raw"].shape == (4, 1, 1, 32, 32)
    with ef.Loader(ef.Sample(raw=raw, labels=labels), patch=(2, 32, 32), batch_size=4, seed=0,
                   augment=list(ef.augment.FULL)) as loader:  # two sections: every defect applies
        assert loader.next_batch()["raw"].shape == (4, 1, 2, 32, 32)


def test_artifacts_defaults_follow_the_volume(rng):
    """scale and shift of None take the volume's defaults (uint8: 1/255, float32: 1; shift 0), and a copy with
    another volume takes that volume's: the defaults are not written back into the fields."""
    uint8 = ef.Volume.from_array(rng.integers(0, 256, (3, 20, 30)).astype(np.uint8))
    floats = ef.Volume.from_array(rng.random((3, 20, 30), dtype=np.float32))
    given = Artifacts(uint8, p=1.0, shift=None)
    copy = dataclasses.replace(given, volume=floats)
    assert given.scale is None and given.shift is None and copy.scale is None
    raw = random_raw(rng, np.float32)
    for artifacts, source, scale in ((given, uint8.array[0], np.float32(1 / 255)), (copy, floats.array[0], 1.0)):
        record = draw(artifacts, rng, len(raw))
        out = raw.copy()
        artifacts.process(record, Patches(raw=out, valid=len(raw)))
        events = artifacts.events(record, raw.shape, len(raw))
        h, w = raw.shape[3:]
        n, z, (alpha, az, ay, ax) = events.example[0], events.section[0], events.values[0]
        box = source[int(az), int(ay):int(ay) + h, int(ax):int(ax) + w].astype(np.float32) * np.float32(scale)
        a = np.float32(alpha)
        np.testing.assert_array_equal(out[n, 0, z], raw[n, 0, z] * (np.float32(1) - a) + box * a)


@pytest.mark.parametrize("setting, value", [("scale", float("nan")), ("shift", "0.1")])
def test_artifacts_refusals_name_their_setting(setting, value):
    with pytest.raises(ValueError, match=f"Artifacts: {setting} must be a finite number") as caught:
        Artifacts(np.zeros((2, 30, 30), np.uint8), **{setting: value})
    assert caught.value.emfast_setting == setting
