"""Labels, masks and extra channels at other voxel sizes than raw (issue 24, item 2).

Fields are written as real stores (funlib.persistence zarr arrays, an OME-Zarr image by ome-zarr-py), read through
emfast.open, and every delivered window is checked against a NumPy reference built from world coordinates alone:
raw holds each voxel's own index (float32), so the delivered raw window tells, voxel by voxel, which raw voxel an
output voxel shows; the reference then finds the field's value at that raw voxel's centre in nm (nearest: the
field voxel containing it; linear: scipy's map_coordinates at that point, edges clamped).
"""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import zarr
from scipy import ndimage

import emfast as ef
from emfast._core import rescale as _rescale
from emfast.sampling import OnRawGrid
from emfast.config import ConfigError, close_volumes, dump_config, load_config
from reference import lift_voxel_size_check

persistence = pytest.importorskip("funlib.persistence")

RAW_VOXEL = (8, 4, 4)
RAW_OFFSET = (16, 12, 8)
RAW_SHAPE = (24, 48, 48)

# name: (voxel size, offset) in nm; shapes are chosen to cover raw
LABELS_COARSE = ((16, 8, 8), (32, 16, 8))           # 2x coarser, raw voxels (2, 1, 0) in: not on its own grid
MASK_COARSE = ((32, 16, 16), (0, 0, 16))            # 4x coarser, starting before raw
LABELS_FINE = ((4, 2, 2), (20, 14, 10))             # 2x finer, half a raw voxel in along every axis
EXTRA_COARSE = ((16, 8, 8), (0, 4, 0))              # 2x coarser, for linear interpolation


def field_shape(voxel, offset, margin=1):
    """A shape reaching past raw's far end by ``margin`` field voxels."""
    end = [o + n * v for o, n, v in zip(RAW_OFFSET, RAW_SHAPE, RAW_VOXEL)]
    return tuple(int(-(-(e - o) // v)) + margin for e, o, v in zip(end, offset, voxel))


def write_funlib(path, name, data, voxel, offset, in_memory):
    array = persistence.prepare_ds(str(path / name), shape=data.shape, offset=offset, voxel_size=voxel,
                                   dtype=data.dtype, chunk_shape=(8, 16, 16))
    array[array.roi] = data
    return ef.open(path / name, in_memory=in_memory)


@pytest.fixture(params=[True, False], ids=["in_memory", "lazy"])
def stores(tmp_path, rng, request):
    """raw (index-encoded float32) and fields at other voxel sizes, written by funlib.persistence and ome-zarr-py,
    opened in memory or lazily; returns (opened volumes, their data)."""
    in_memory = request.param
    path = tmp_path / "sample.zarr"
    raw_data = np.arange(np.prod(RAW_SHAPE), dtype=np.float32).reshape(RAW_SHAPE)
    data = {
        "raw": (raw_data, RAW_VOXEL, RAW_OFFSET),
        "labels_coarse": (rng.integers(1, 2**40, field_shape(*LABELS_COARSE), dtype=np.uint64),) + LABELS_COARSE,
        "mask_coarse": (rng.integers(1, 256, field_shape(*MASK_COARSE), dtype=np.uint8),) + MASK_COARSE,
        "labels_fine": (rng.integers(1, 2**31, field_shape(*LABELS_FINE), dtype=np.uint32),) + LABELS_FINE,
    }
    volumes = {name: write_funlib(path, name, *value, in_memory) for name, value in data.items()}
    writer = pytest.importorskip("ome_zarr.writer")
    from ome_zarr.format import FormatV04
    extra = rng.random(field_shape(*EXTRA_COARSE)).astype(np.float32) * 100
    group = zarr.open_group(str(tmp_path / "extra.zarr"), mode="w", zarr_format=2)
    group.create_array("0", data=extra, chunks=(8, 16, 16))
    transforms = [{"type": "scale", "scale": list(map(float, EXTRA_COARSE[0]))},
                  {"type": "translation", "translation": list(map(float, EXTRA_COARSE[1]))}]
    writer.write_multiscales_metadata(group, [{"path": "0", "coordinateTransformations": transforms}], FormatV04(),
                                      axes=[{"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"])
    volumes["extra_coarse"] = ef.open(tmp_path / "extra.zarr", in_memory=in_memory)
    data["extra_coarse"] = (extra,) + EXTRA_COARSE
    assert volumes["extra_coarse"].resolution == tuple(map(float, EXTRA_COARSE[0]))
    assert volumes["extra_coarse"].offset == tuple(map(float, EXTRA_COARSE[1]))
    yield volumes, data
    for volume in volumes.values():
        volume.close()


# -- the NumPy reference: world coordinates only -------------------------------------------------------------------

def raw_positions(raw_window: np.ndarray) -> np.ndarray:
    """(..., 3) raw voxel of each delivered raw value (raw holds its voxel index)."""
    index = raw_window.astype(np.int64)
    assert np.array_equal(index, raw_window)  # the window shows whole raw voxels
    return np.stack(np.unravel_index(index, RAW_SHAPE), axis=-1)


def centres_nm(positions: np.ndarray) -> np.ndarray:
    return np.asarray(RAW_OFFSET) + (positions + 0.5) * np.asarray(RAW_VOXEL)


def nearest_reference(field, voxel, offset, positions):
    index = np.floor((centres_nm(positions) - np.asarray(offset)) / np.asarray(voxel)).astype(np.int64)
    assert np.all(index >= 0) and np.all(index < np.asarray(field.shape))
    return field[index[..., 0], index[..., 1], index[..., 2]]


def linear_reference(field, voxel, offset, positions):
    coordinates = (centres_nm(positions) - np.asarray(offset)) / np.asarray(voxel) - 0.5
    flat = coordinates.reshape(-1, 3).T
    values = ndimage.map_coordinates(field.astype(np.float64), flat, order=1, mode="nearest")
    return values.reshape(positions.shape[:-1])


# -- on raw's grid -----------------------------------------------------------------------------------------------

PERMUTING = [(), ("mirror",), ("transpose",), ("mirror", "transpose")]


@pytest.mark.parametrize("augment", PERMUTING)
@pytest.mark.parametrize("labels_name", ["labels_coarse", "labels_fine"])
def test_fields_on_raw_grid_match_world_reference(stores, augment, labels_name):
    volumes, data = stores
    sample = ef.Sample(volumes["raw"], volumes[labels_name], volumes["mask_coarse"],
                       extra={"extra": volumes["extra_coarse"]})
    checked = 0
    with ef.Loader(sample, patch=(6, 12, 10), batch_size=4, epoch_size=6, augment=augment, isotropic=True,
                   seed=3) as loader:
        for batch in loader:
            positions = raw_positions(np.asarray(batch["raw"])[:, 0])
            assert np.array_equal(np.asarray(batch["labels"])[:, 0],
                                  nearest_reference(data[labels_name][0], *data[labels_name][1:], positions))
            assert np.array_equal(np.asarray(batch["mask"])[:, 0],
                                  nearest_reference(data["mask_coarse"][0], *data["mask_coarse"][1:], positions))
            np.testing.assert_allclose(np.asarray(batch["extra"])[:, 0],
                                       linear_reference(data["extra_coarse"][0], *data["extra_coarse"][1:],
                                                        positions), rtol=1e-6, atol=1e-4)
            checked += 1
    assert checked == 6


WARPS = {"rotate": lambda: [ef.Rotate(axes="yx")], "elastic": lambda: [ef.Elastic()],
         "rotate3d+dihedral": lambda: [ef.Rotate(axes="zyx"), ef.Mirror(), ef.Transpose(axes="zyx")]}


def test_coarse_labels_on_raw_grid_feed_targets_with_a_margin(stores):
    """Labels cut with the targets' margin (an intermediate, not delivered as cut) resample like delivered ones;
    the affinities are computed from them."""
    volumes, data = stores
    sample = ef.Sample(volumes["raw"], volumes["labels_coarse"])
    with ef.Loader(sample, patch=(6, 12, 10), batch_size=2, epoch_size=2, augment=("mirror", "transpose"),
                   targets=[ef.Affinities(offsets=((-1, 0, 0), (0, -1, 0), (0, 0, -1)))], seed=4) as loader:
        for batch in loader:
            positions = raw_positions(np.asarray(batch["raw"])[:, 0])
            labels = nearest_reference(data["labels_coarse"][0], *data["labels_coarse"][1:], positions)
            assert np.array_equal(np.asarray(batch["labels"])[:, 0], labels)
            # along each axis, inside the window, affinity 1 exactly where the label equals its predecessor's
            affinities = np.asarray(batch["affinities"])
            for k in range(3):
                inner = [slice(None)] * 4
                inner[k + 1] = slice(1, None)
                before = [slice(None)] * 4
                before[k + 1] = slice(None, -1)
                same = labels[tuple(inner)] == labels[tuple(before)]
                assert np.array_equal(affinities[:, k][tuple(inner)] > 0.5, same)


@pytest.mark.parametrize("source", ["mask", "labels"])
def test_samplers_read_coarse_fields_on_raw_grid(stores, source):
    """Masked and Balanced look at a coarse mask or labels as they lie on raw's grid: windows drawn as fully
    covered are fully covered in the world-coordinate reference, and balanced centres sit on their class."""
    volumes, data = stores
    mask_data, voxel, offset = data["mask_coarse"]
    half = (mask_data * (np.arange(mask_data.shape[2]) % 3 != 0)).astype(np.uint8)  # every third column empty
    mask = ef.Volume.from_array(half, name="half mask", resolution=voxel, offset=offset)
    labels_data = data["labels_coarse"][0] * (np.arange(data["labels_coarse"][0].shape[1]) % 4 != 0)[:, None]
    labels = ef.Volume.from_array(labels_data, name="half labels", resolution=data["labels_coarse"][1],
                                  offset=data["labels_coarse"][2])
    sampler = ef.Masked(min_fraction=1.0, source=source)
    with ef.Loader(ef.Sample(volumes["raw"], labels, mask), patch=(4, 6, 6), batch_size=4, epoch_size=3,
                   sampler=sampler, augment=(), seed=8) as loader:
        for batch in loader:
            positions = raw_positions(np.asarray(batch["raw"])[:, 0])
            if source == "mask":
                assert np.all(nearest_reference(half, voxel, offset, positions) != 0)
            else:
                assert np.all(nearest_reference(labels_data, *data["labels_coarse"][1:], positions) != 0)


def test_samples_with_fields_at_raw_and_other_voxel_sizes_mix_in_one_dataset(stores, rng):
    """One sample's labels and extra channel at raw's voxel size, another's coarser: every window matches its own
    sample's reference."""
    volumes, data = stores
    same_labels = rng.integers(1, 2**40, RAW_SHAPE, dtype=np.uint64)
    same_extra = rng.random(RAW_SHAPE).astype(np.float32)
    at_raw = {"resolution": RAW_VOXEL, "offset": RAW_OFFSET}
    plain = ef.Sample(ef.Volume.from_array(data["raw"][0], name="raw 2", **at_raw),
                      ef.Volume.from_array(same_labels, name="labels 2", **at_raw),
                      extra={"extra": ef.Volume.from_array(same_extra, name="extra 2", **at_raw)}, name="plain")
    coarse = ef.Sample(volumes["raw"], volumes["labels_coarse"], extra={"extra": volumes["extra_coarse"]},
                       name="coarse")
    seen = set()
    with ef.Loader(ef.Dataset([plain, coarse]), patch=(6, 12, 10), batch_size=4, epoch_size=4,
                   augment=("mirror", "transpose"), seed=2) as loader:
        for batch in loader:
            positions = raw_positions(np.asarray(batch["raw"])[:, 0])
            labels = np.asarray(batch["labels"])[:, 0]
            extra = np.asarray(batch["extra"])[:, 0]
            for n in range(4):
                expected_plain = same_labels[tuple(np.moveaxis(positions[n], -1, 0))]
                if np.array_equal(labels[n], expected_plain):
                    seen.add("plain")
                    np.testing.assert_array_equal(extra[n], same_extra[tuple(np.moveaxis(positions[n], -1, 0))])
                else:
                    seen.add("coarse")
                    assert np.array_equal(labels[n], nearest_reference(data["labels_coarse"][0],
                                                                       *data["labels_coarse"][1:], positions[n]))
                    np.testing.assert_allclose(extra[n], linear_reference(data["extra_coarse"][0],
                                                                          *data["extra_coarse"][1:], positions[n]),
                                               rtol=1e-6, atol=1e-4)
    assert seen == {"plain", "coarse"}


@pytest.mark.parametrize("warp", sorted(WARPS))
@pytest.mark.parametrize("mask_name", ["mask_coarse", "labels_fine"])
def test_warped_fields_stay_aligned_with_raw(stores, warp, mask_name, monkeypatch):
    """Under rotation and elastic deformation, labels at raw's voxel size hold each voxel's index, so they say
    which raw voxel every output voxel was sampled from (nearest); a mask at another voxel size sampled through
    the same warp must show its value at that voxel's centre. The kernels' geometry: rotations out of plane of
    raw's (8, 4, 4) nm voxels, which the Loader refuses, are let through (``lift_voxel_size_check``)."""
    lift_voxel_size_check(monkeypatch)
    volumes, data = stores
    index_labels = ef.Volume.from_array(np.arange(1, np.prod(RAW_SHAPE) + 1, dtype=np.uint32).reshape(RAW_SHAPE),
                                        name="index", resolution=RAW_VOXEL, offset=RAW_OFFSET)
    field, voxel, offset = data[mask_name]
    if mask_name != "mask_coarse":  # the 2x finer field, as a mask (uint8)
        field = (field % 251 + 1).astype(np.uint8)
    mask = ef.Volume.from_array(field, name=mask_name, resolution=voxel, offset=offset)
    compared = 0
    extra = data["extra_coarse"][0]
    with ef.Loader(ef.Sample(volumes["raw"], index_labels, mask, extra={"extra": volumes["extra_coarse"]}),
                   patch=(6, 14, 14), batch_size=4, epoch_size=4, augment=WARPS[warp](), isotropic=True,
                   seed=5) as loader:
        for batch in loader:
            # the extra channel, interpolated onto raw's grid and then warped, stays within the field's values
            interpolated = np.asarray(batch["extra"])
            assert interpolated.min() >= min(0, extra.min()) - 1e-3 and interpolated.max() <= extra.max() + 1e-3
            labels = np.asarray(batch["labels"])[:, 0].astype(np.int64)
            known = (labels > 0) & (np.asarray(batch["labels_valid"])[:, 0] > 0)
            positions = np.stack(np.unravel_index(labels[known] - 1, RAW_SHAPE), axis=-1)
            index = np.floor((centres_nm(positions) - np.asarray(offset)) / np.asarray(voxel)).astype(np.int64)
            inside = np.all((index >= 0) & (index < np.asarray(field.shape)), axis=-1)
            got = np.asarray(batch["mask"])[:, 0][known]
            sampled = got != 0  # the field's values are 1..255; 0 is the warp's outside
            assert np.all(inside[sampled])
            assert np.array_equal(got[sampled], field[tuple(index[sampled].T)])
            # the warp kernels take a field's outer half voxel as outside: inside it, only the edge of its
            # footprint on raw's grid reads 0
            assert np.all(_at_footprint_edge(positions[~sampled & inside], voxel, offset, field.shape))
            compared += int(sampled.sum())
    assert compared > 1000


def _at_footprint_edge(positions, voxel, offset, shape):
    """Whether raw voxels are the first or last whose centre lies inside the field, along some axis."""
    centres = np.asarray(RAW_OFFSET) + (np.arange(max(RAW_SHAPE))[:, None] + 0.5) * np.asarray(RAW_VOXEL)
    end = np.asarray(offset) + np.asarray(shape) * np.asarray(voxel)
    inside = (centres >= np.asarray(offset)) & (centres < end)
    first = inside.argmax(axis=0)
    last = len(inside) - 1 - inside[::-1].argmax(axis=0)
    return np.any((positions == first) | (positions == last), axis=-1)


# -- at their own voxel size ----------------------------------------------------------------------------------------

def _own_positions_coarse(positions, ratio):
    """For an own-resolution window of a coarser field: the raw voxel under raw output voxel (z, y, x) * ratio,
    whose field voxel own output voxel (z, y, x) shows (all raw voxels of that block lie in it)."""
    return positions[:, ::ratio[0], ::ratio[1], ::ratio[2]]


def _own_expected_fine(field, voxel, offset, positions, k):
    """Own-resolution window of a finer field (k field voxels per raw voxel along every axis): which of the k**3
    field voxels inside a raw output voxel an own output voxel shows follows from the direction each output axis
    runs in raw (read from the delivered raw positions)."""
    batch, nz, ny, nx = positions.shape[:4]
    out = np.empty((batch, nz * k, ny * k, nx * k), dtype=field.dtype)
    for n in range(batch):
        p = positions[n]
        steps = [p[1, 0, 0] - p[0, 0, 0], p[0, 1, 0] - p[0, 0, 0], p[0, 0, 1] - p[0, 0, 0]]
        source_axis = [int(np.flatnonzero(s)[0]) for s in steps]
        sign = [int(s[a]) for s, a in zip(steps, source_axis)]
        lower_nm = np.asarray(RAW_OFFSET) + p * np.asarray(RAW_VOXEL)  # raw voxels' lower corners
        first = np.rint((lower_nm - np.asarray(offset)) / np.asarray(voxel)).astype(np.int64)
        for z in range(nz * k):
            for y in range(ny * k):
                for x in range(nx * k):
                    own = (z, y, x)
                    index = first[z // k, y // k, x // k].copy()
                    for j in range(3):
                        sub = own[j] % k
                        index[source_axis[j]] += sub if sign[j] > 0 else k - 1 - sub
                    out[n, z, y, x] = field[tuple(index)]
    return out


@pytest.mark.parametrize("augment", PERMUTING)
def test_fields_at_own_voxel_size_match_world_reference(stores, augment):
    volumes, data = stores
    fine = data["labels_fine"]
    fine_extra = ef.Volume.from_array(fine[0].astype(np.float32), name="fine extra", resolution=fine[1],
                                      offset=fine[2])
    sample = ef.Sample(volumes["raw"], volumes["labels_coarse"], volumes["mask_coarse"],
                       extra={"fine": fine_extra}, own_resolution=["labels", "mask", "fine"])
    with ef.Loader(sample, patch=(4, 8, 8), batch_size=3, epoch_size=4, augment=augment, isotropic=True,
                   seed=11) as loader:
        assert loader.fields["mask"][0] == (3, 1, 1, 2, 2)
        assert loader.fields["labels"][0] == (3, 1, 2, 4, 4)
        assert loader.fields["fine"][0] == (3, 1, 8, 16, 16)
        for batch in loader:
            positions = raw_positions(np.asarray(batch["raw"])[:, 0])
            for name, key, ratio in (("labels", "labels_coarse", (2, 2, 2)), ("mask", "mask_coarse", (4, 4, 4))):
                field, voxel, offset = data[key]
                corners = _own_positions_coarse(positions, ratio)
                expected = nearest_reference(field, voxel, offset, corners)
                assert np.array_equal(np.asarray(batch[name])[:, 0], expected), name
                # the window is whole field voxels: every raw voxel of a block lies in the same field voxel
                blocks = nearest_reference(field, voxel, offset, positions)
                assert np.array_equal(blocks, np.repeat(np.repeat(np.repeat(expected, ratio[0], 1), ratio[1], 2),
                                                        ratio[2], 3))
            expected = _own_expected_fine(fine[0], fine[1], fine[2], positions, 2)
            assert np.array_equal(np.asarray(batch["fine"])[:, 0], expected.astype(np.float32))


def test_own_voxel_size_windows_start_on_the_common_grid(stores):
    volumes, _ = stores
    sample = ef.Sample(volumes["raw"], volumes["labels_coarse"], volumes["mask_coarse"],
                       own_resolution=["labels", "mask"])
    loader = ef.Loader(sample, patch=(4, 8, 8), batch_size=8, epoch_size=5, augment=("mirror",))
    # mask voxels start at raw voxel -2, -3, 2 (every 4), labels' at 2, 1, 0 (every 2): windows start at 2, 1, 2
    # modulo 4 in raw voxels
    for index in range(5):
        corners = loader._planner.plan(0, index).corners
        assert np.all(corners % 4 == np.asarray([2, 1, 2]))


@pytest.mark.parametrize("seed", range(6))
def test_views_on_raw_grid_match_world_reference_for_mixed_ratios(seed):
    """Per-axis ratios 1/3 to 3 (finer along one axis, coarser along another) and random nested offsets: every raw
    voxel of the view's footprint takes the field's value at its centre, by nearest neighbour and linearly."""
    local = np.random.default_rng(seed)
    raw_shape = (20, 18, 16)
    ratios = [local.choice([1 / 3, 1 / 2, 2, 3]) for _ in range(3)]
    voxel = np.asarray([int(12 * r) if r >= 1 else 12 // int(round(1 / r)) for r in ratios])  # raw's is 12 nm
    raw = ef.Volume.from_array(np.zeros(raw_shape, np.uint8), name="raw", resolution=(12, 12, 12),
                               offset=tuple(int(o) for o in 12 * local.integers(-3, 4, 3)))
    finer = np.minimum(voxel, 12)
    offset = np.asarray(raw.offset, dtype=np.int64) + finer * local.integers(-4, 5, 3)
    shape = tuple(int(n) for n in local.integers(3, 12, 3) * np.maximum(1, 12 // voxel))
    field = local.integers(1, 2**31, shape).astype(np.uint32)
    volume = ef.Volume.from_array(field, name="field", resolution=tuple(int(v) for v in voxel),
                                  offset=tuple(int(o) for o in offset))
    sample = ef.Sample(raw, volume)
    placed = sample.placed_labels
    view = placed.on_raw
    out = np.empty((1,) + view.shape, np.uint32)
    view.read_box((0, 0, 0), view.shape, out)
    positions = placed.origin + np.stack(np.meshgrid(*(np.arange(n) for n in view.shape), indexing="ij"), axis=-1)
    centres = np.asarray(raw.offset) + (positions + 0.5) * 12
    index = np.floor((centres - offset) / voxel).astype(np.int64)
    assert np.all(index >= 0) and np.all(index < np.asarray(shape))  # the footprint is exactly where centres fall
    assert np.array_equal(out[0], field[tuple(np.moveaxis(index, -1, 0))])
    outside = [placed.origin - 1, placed.end]  # the raw voxels just beyond the footprint have centres outside
    for a in range(3):
        for i in (outside[0][a], outside[1][a]):
            centre = raw.offset[a] + (i + 0.5) * 12
            assert not offset[a] <= centre < offset[a] + shape[a] * voxel[a]
    linear = OnRawGrid(volume, placed.grid, linear=True)
    interpolated = np.empty((1,) + view.shape, np.float32)
    linear.read_box((0, 0, 0), view.shape, interpolated)
    coordinates = ((centres - offset) / voxel - 0.5).reshape(-1, 3).T
    expected = ndimage.map_coordinates(field.astype(np.float64), coordinates, order=1, mode="nearest")
    np.testing.assert_allclose(interpolated[0].ravel(), expected, rtol=1e-6)


# -- the kernels against NumPy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int64, np.float32])
def test_rescale_nearest_is_numpy_fancy_indexing(rng, dtype):
    src = rng.integers(0, 200, (2, 7, 9, 11)).astype(dtype)[:, ::-1, :, ::2]  # negative and non-unit strides
    random = [rng.integers(0, n, m) for n, m in zip(src.shape[1:], (5, 12, 4))]
    repeated = [np.repeat(np.arange(n), k)[:m] for n, k, m in zip(src.shape[1:], (2, 4, 3), (7, 13, 5))]  # coarse
    for tables in (random, repeated):
        out = np.empty((2,) + tuple(len(t) for t in tables), dtype=dtype)
        _rescale.rescale_nearest(src, *tables, out)
        assert np.array_equal(out, src[:, tables[0]][:, :, tables[1]][:, :, :, tables[2]])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float16, np.float32, np.float64])
def test_rescale_linear_is_separable_interpolation(rng, dtype):
    src = (rng.random((1, 6, 7, 8)) * 250).astype(dtype)
    tables = []
    for n, m in zip(src.shape[1:], (4, 9, 5)):
        lo = rng.integers(0, n, m)
        hi = np.minimum(lo + 1, n - 1)
        w = rng.random(m)
        tables.append((lo, hi, w))
    out = np.empty((1, 4, 9, 5), dtype=np.float32)
    _rescale.rescale_linear(src, tables, out)
    value = src.astype(np.float64)
    for axis, (lo, hi, w) in enumerate(tables):
        shape = [1, 1, 1, 1]
        shape[axis + 1] = -1
        value = np.take(value, lo, axis=axis + 1) * (1 - w.reshape(shape)) + \
            np.take(value, hi, axis=axis + 1) * w.reshape(shape)
    np.testing.assert_allclose(out, value, rtol=1e-6)


def test_rescale_kernels_run_concurrently_from_a_thread_pool(rng):
    """The kernels release the GIL: calls from several threads at once each give NumPy's answer."""
    from concurrent.futures import ThreadPoolExecutor
    src = rng.integers(0, 2**60, (1, 24, 40, 40), dtype=np.uint64)
    tables = [np.repeat(np.arange(n), 2) for n in src.shape[1:]]
    expected = src[:, tables[0]][:, :, tables[1]][:, :, :, tables[2]]
    linear_tables = [(t, np.minimum(t + 1, n - 1), np.tile([0.25, 0.75], n)) for t, n in zip(tables, src.shape[1:])]
    floats = src.astype(np.float32)

    def call(_):
        out = np.empty(expected.shape, np.uint64)
        _rescale.rescale_nearest(src, *tables, out)
        interpolated = np.empty(expected.shape, np.float32)
        _rescale.rescale_linear(floats, linear_tables, interpolated)
        return np.array_equal(out, expected) and np.isfinite(interpolated).all()

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, range(16)))


def test_rescale_refuses_tables_outside_the_source(rng):
    src = np.zeros((1, 3, 3, 3), np.uint8)
    with pytest.raises(ValueError, match=r"index_y indexes outside the source's 3 positions"):
        _rescale.rescale_nearest(src, [0], [3], [0], np.empty((1, 1, 1, 1), np.uint8))


# -- bad input ------------------------------------------------------------------------------------------------

def _volume(shape, voxel, offset, dtype=np.uint64, name="field"):
    return ef.Volume.from_array(np.ones(shape, dtype), name=name, resolution=voxel, offset=offset)


def _raw():
    return ef.Volume.from_array(np.zeros(RAW_SHAPE, np.uint8), name="raw", resolution=RAW_VOXEL, offset=RAW_OFFSET)


def test_a_ratio_that_is_not_an_integer_is_refused_naming_the_numbers():
    with pytest.raises(ValueError, match=r"labels \(coarse\) has voxel size \(8, 6, 4\) and raw \(raw\) \(8, 4, 4\): "
                                         r"along y the ratio 1.5 is not an integer multiple or divisor"):
        ef.Sample(_raw(), _volume((4, 4, 4), (8, 6, 4), RAW_OFFSET, name="coarse"))


def test_an_offset_off_the_grids_is_refused_naming_the_numbers():
    with pytest.raises(ValueError, match=r"mask \(m, offset \(16, 14, 8\), voxel size \(16, 8, 8\)\) lies 2 from raw "
                                         r".* along y: not a multiple of 4"):
        ef.Sample(_raw(), mask=_volume((4, 4, 4), (16, 8, 8), (16, 14, 8), np.uint8, name="m"))


def test_a_field_outside_raw_is_refused():
    with pytest.raises(ValueError, match=r"far .*does not overlap raw"):
        ef.Sample(_raw(), _volume((2, 2, 2), (16, 8, 8), (1600, 0, 0), name="far"))


def test_a_field_too_small_for_any_window_is_refused(stores):
    small = _volume((2, 3, 3), (16, 8, 8), RAW_OFFSET, name="small")
    with pytest.raises(ValueError, match=r"does not fit in its data"):
        ef.Loader(ef.Sample(_raw(), small), patch=(4, 8, 8))


def test_an_offset_in_raw_voxels_cannot_place_a_field_at_another_voxel_size():
    with pytest.raises(ValueError, match=r"label_offset \(in raw voxels\) cannot place field"):
        ef.Sample(_raw(), _volume((4, 4, 4), (16, 8, 8), RAW_OFFSET), label_offset=(0, 0, 0))


def test_own_voxel_size_refuses_warps_targets_and_ragged_patches(stores):
    volumes, _ = stores
    sample = ef.Sample(volumes["raw"], volumes["labels_coarse"], volumes["mask_coarse"],
                       own_resolution=["labels", "mask"])
    with pytest.raises(ValueError, match=r"rotate resamples off the voxel grid, which fields delivered at their own "
                                         r"voxel size \(own_resolution: \['labels', 'mask'\]\)"):
        ef.Loader(sample, patch=(4, 8, 8), augment=["rotate"])
    with pytest.raises(ValueError, match=r"targets \['affinities'\] are computed on raw's grid"):
        ef.Loader(ef.Sample(volumes["raw"], volumes["labels_coarse"], own_resolution=["labels"]), patch=(4, 8, 8),
                  targets=["affinities"])
    with pytest.raises(ValueError, match=r"mask is delivered at its own voxel size \(own_resolution\), \(4, 4, 4\) "
                                         r"times raw's, but its window \(4, 6, 8\)"):
        ef.Loader(sample, patch=(4, 6, 8))
    with pytest.raises(ValueError, match=r"own_resolution names 'extra', which is not a field of this sample"):
        ef.Sample(volumes["raw"], volumes["labels_coarse"], own_resolution=["extra"])


def test_own_voxel_size_refuses_transposes_between_axes_of_different_ratio(monkeypatch):
    lift_voxel_size_check(monkeypatch)  # else raw's own (8, 4, 4) nm voxels refuse the z transpose first
    raw = _raw()
    mask = _volume((12, 12, 12), (16, 16, 16), RAW_OFFSET, np.uint8, name="m")  # ratio (2, 4, 4)
    with pytest.raises(ValueError, match=r"a transpose augmentation swaps axes of different ratio"):
        ef.Loader(ef.Sample(raw, mask=mask, own_resolution="mask"), patch=(4, 8, 8),
                  augment=[ef.Transpose(axes="zyx")], isotropic=True)
    ef.Loader(ef.Sample(raw, mask=mask, own_resolution="mask"), patch=(4, 8, 8), augment=("transpose",))  # y <-> x


def test_grids_that_never_meet_are_refused():
    raw = _raw()
    labels = _volume((12, 24, 24), (16, 8, 8), RAW_OFFSET, name="l")  # starts at raw voxel 0
    mask = _volume((12, 24, 24), (16, 8, 8), (24, 12, 8), np.uint8, name="m")  # raw voxel 1 in z
    with pytest.raises(ValueError, match=r"axis z: the grids of the fields delivered at their own voxel size never "
                                         r"meet \(labels every 2 raw voxels from 0, mask every 2 raw voxels from 1\)"):
        ef.Loader(ef.Sample(raw, labels, mask, own_resolution=["labels", "mask"]), patch=(4, 8, 8))


# -- configs ------------------------------------------------------------------------------------------------------

def test_config_delivers_fields_at_own_voxel_size(tmp_path, stores):
    path = tmp_path / "sample.zarr"
    config = tmp_path / "train.yaml"
    config.write_text(f"""
data:
  samples:
    - file: {path}
      raw: raw
      labels: labels_coarse
      mask: mask_coarse
      own_resolution: [mask]
loader:
  patch: [4, 8, 8]
  batch_size: 2
  epoch_size: 1
augment: [mirror]
""")
    loaded = load_config(config)
    assert loaded.samples[0].own_resolution == ("mask",)
    assert load_config(dump_config(loaded)) == loaded
    loader = loaded.loader()
    try:
        with loader:
            batch = next(iter(loader))
            assert batch["mask"].shape == (2, 1, 1, 2, 2)
            assert batch["labels"].shape == (2, 1, 4, 8, 8)
    finally:
        close_volumes(loader.dataset)
    config.write_text(config.read_text().replace("own_resolution: [mask]", "own_resolution: [extra]"))
    with pytest.raises(ConfigError, match=r"own_resolution.*'extra' is not a field of this sample"):
        load_config(config)


def test_config_reads_a_coarser_level_of_an_ome_zarr_image(tmp_path):
    """A config could name an image group (its finest level) or a level's path (without the image's voxel size,
    refused): a coarser level of a mask pyramid could not be used. ``level`` and ``resolution`` choose it."""
    from emfast.io import convert
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("raw", data=np.zeros((8, 32, 32), np.uint8)).attrs["resolution"] = (40, 4, 4)
        mask = np.zeros((8, 32, 32), np.uint8)
        mask[:, :, 16:] = 1
        f.create_dataset("mask", data=mask).attrs["resolution"] = (40, 4, 4)
    convert(str(tmp_path / "in.h5/mask"), tmp_path / "s.zarr/mask", levels=2)
    text = f"""
data:
  samples:
    - {{file: {tmp_path / 'in.h5'}, raw: raw, mask: {{file: {tmp_path / 's.zarr'}, dataset: mask, CHOICE}}}}
loader: {{patch: [4, 8, 8], batch_size: 2, epoch_size: 1}}
"""
    for choice in ("level: 1", "resolution: [40, 8, 8]", "level: 1, resolution: null"):  # null: not given
        loaded = load_config(text.replace("CHOICE", choice))
        assert load_config(dump_config(loaded)) == loaded
        dataset = loaded.dataset()
        try:
            mask = dataset.samples[0].mask
            assert mask.resolution == (40, 8, 8) and mask.offset == (0, 0, 0) and mask.shape == (8, 16, 16)
        finally:
            close_volumes(dataset)
    for choice, key, message in (("level: 2", "level", r"level must be an index in \[0, 2\), got 2"),
                                 ("resolution: [40, 2, 2]", "resolution", r"no level has resolution"),
                                 ("level: -1", "level", r"expected an integer >= 0"),
                                 ("level: 1, resolution: [40, 8, 8]", "resolution", "give level or resolution")):
        with pytest.raises(ConfigError, match=rf"data.samples\[0\].mask.{key}: .*{message}"):
            load_config(text.replace("CHOICE", choice)).dataset()


def test_read_ahead_covers_the_stored_windows_of_resampled_lazy_fields(tmp_path, rng):
    """Fields read onto raw's grid from lazy stores name the blocks of the stored windows they will read, so the
    read-ahead threads fetch them before the producer needs them."""
    raw = write_funlib(tmp_path, "raw", rng.integers(0, 255, RAW_SHAPE, dtype=np.uint8), RAW_VOXEL, RAW_OFFSET,
                       in_memory=False)
    labels = write_funlib(tmp_path, "labels", rng.integers(0, 9, field_shape(*LABELS_COARSE), dtype=np.uint64),
                          *LABELS_COARSE, in_memory=False)
    loader = ef.Loader(ef.Sample(raw, labels), patch=(4, 8, 8), batch_size=2)
    plan = loader._planner.plan(0, 0)
    stored = dict(loader._gatherer.chunk_boxes(plan))[labels.chunk_cache]
    block = np.asarray(labels.chunk_cache.block_shape)
    view = loader._gatherer.fields[1].sources[0].volume
    for n in range(2):
        start, stop = view.stored_box(plan.corners[n] - view.origin, plan.extents[n])
        assert np.array_equal(stored[n], np.stack([start // block, (stop - 1) // block]))
        assert np.all(start >= 0) and np.all(stop <= np.asarray(labels.shape))
    raw.close()
    labels.close()
