"""NumPy references shared by the tests: what the kernels and the loader must reproduce bit for bit."""
import itertools

import numpy as np

# The crop reference is emfast bench's, so that tests and bench compare against one definition.
from emfast.bench._reference import source_extent, window  # noqa: F401 (window is used by the tests)

ALL_PERMS = [list(p) for p in itertools.permutations(range(3))]
ALL_FLIPS = [list(f) for f in itertools.product([False, True], repeat=3)]
#: The 16 transforms of anisotropic EM data: mirrors along z, y, x and the y<->x transpose.
ANISOTROPIC = [(p, f) for p in ([0, 1, 2], [0, 2, 1]) for f in ALL_FLIPS]
#: All 48 axis permutations with mirrors (isotropic data).
ISOTROPIC = [(p, f) for p in ALL_PERMS for f in ALL_FLIPS]


def extent_of(patch, perm):
    return list(source_extent(patch, perm))


def converted(source, corner, patch, perm, flips, scale, shift, dtype):
    """The raw pipeline: window, float32, x * scale + shift in float32, cast to dtype."""
    crop = window(source, corner, patch, perm, flips)
    return (crop.astype(np.float32) * np.float32(scale) + np.float32(shift)).astype(dtype)


def random_corner(rng, shape, extent):
    return [int(rng.integers(0, s - e + 1)) for s, e in zip(shape, extent)]


def random_volume(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.random(shape) * 1000 - 200).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


# -- label -> target references (emfast.targets) ----------------------------------------------------------------

def _inner(labels, margin):
    """The output region of a (B, 1, Z, Y, X) label batch: label voxels [margin, shape - margin) per axis."""
    return labels[(slice(None), 0) + tuple(slice(m, s - m) for m, s in zip(margin, labels.shape[2:]))]


def _neighbours(labels, margin, offset):
    """(neighbour labels, neighbour inside the patch) of every output voxel u, for the neighbour u + offset.

    Pads the patch with unknown voxels and slices the padded arrays, so it shares no bounds logic with the kernels.
    """
    shape = labels.shape[2:]
    out = [s - 2 * m for s, m in zip(shape, margin)]
    if any(abs(d) >= s for d, s in zip(offset, shape)):  # every neighbour is outside the patch
        return np.zeros((labels.shape[0],) + tuple(out), labels.dtype), np.zeros((1,) + tuple(out), bool)
    pad = [abs(d) for d in offset]
    padded = np.pad(labels[:, 0], [(0, 0)] + [(p, p) for p in pad])
    known = np.pad(np.ones((1,) + tuple(shape), bool), [(0, 0)] + [(p, p) for p in pad])
    box = tuple(slice(p + m + d, p + m + d + o) for p, m, d, o in zip(pad, margin, offset, out))
    return padded[(slice(None),) + box], known[(slice(None),) + box]


def affinities_reference(labels, offsets, margin=(0, 0, 0), background=0, ignore=None, dtype=np.float32):
    """gunpowder's seg_to_affgraph convention: channel k links u with u + offsets[k].

    Returns (affinities, mask) of shape (B, K, Z - 2 mz, Y - 2 my, X - 2 mx).
    """
    inner = _inner(labels, margin)
    affinities, masks = [], []
    for offset in offsets:
        neighbour, known = _neighbours(labels, margin, offset)
        same = (inner == neighbour) & known
        if background is not None:
            same &= inner != background
        mask = np.broadcast_to(known, inner.shape)
        if ignore is not None:
            mask = mask & (inner != ignore) & (neighbour != ignore)
        affinities.append(same.astype(dtype))
        masks.append(mask.astype(np.uint8))
    return np.stack(affinities, axis=1), np.stack(masks, axis=1)


def boundaries_reference(labels, margin=(0, 0, 0), thickness=1, in_plane=False):
    """1 where a voxel up to ``thickness`` steps away along +-z, +-y or +-x (not z if ``in_plane``), inside the
    patch, has another label. Shape (B, 1, Z - 2 mz, Y - 2 my, X - 2 mx), uint8."""
    inner = _inner(labels, margin)
    boundary = np.zeros(inner.shape, bool)
    for axis in range(1 if in_plane else 0, 3):
        for t in range(1, thickness + 1):
            for sign in (1, -1):
                offset = [0, 0, 0]
                offset[axis] = sign * t
                neighbour, known = _neighbours(labels, margin, offset)
                boundary |= known & (neighbour != inner)
    return boundary.astype(np.uint8)[:, np.newaxis]


def classes_reference(labels, margin=(0, 0, 0), background=0, thickness=1, in_plane=False, values=(0, 1, 2),
                      dtype=np.int64):
    """values[0] on background, values[1] on boundary voxels, values[2] inside."""
    boundary = boundaries_reference(labels, margin, thickness, in_plane)[:, 0].astype(bool)
    inner = _inner(labels, margin)
    classes = np.where(boundary, values[1], values[2])
    if background is not None:
        classes = np.where(inner == background, values[0], classes)
    return classes.astype(dtype)[:, np.newaxis]


def foreground_reference(labels, margin=(0, 0, 0), background=0):
    """1 where the label is not ``background``."""
    return (_inner(labels, margin) != background).astype(np.uint8)[:, np.newaxis]


def seg_to_affgraph(seg, nhood):
    """gunpowder's documented definition (``gunpowder.nodes.add_affinities.seg_to_affgraph``), restated: for
    edge e with offset d, the voxels v with v and v + d both inside get ``seg[v] == seg[v + d]`` and both > 0;
    every other voxel gets 0."""
    aff = np.zeros((len(nhood),) + seg.shape, dtype=np.int32)
    for e, d in enumerate(nhood):
        here = tuple(slice(max(0, -k), min(n, n - k)) for k, n in zip(d, seg.shape))
        there = tuple(slice(max(0, k), min(n, n + k)) for k, n in zip(d, seg.shape))
        aff[(e,) + here] = (seg[here] == seg[there]) & (seg[here] > 0) & (seg[there] > 0)
    return aff


def grow_boundary_reference(labels, known=None, steps=1, in_plane=False, background=0):
    """gunpowder's ``GrowBoundary`` as documented, per patch of a (B, 1, Z, Y, X) batch: each object is eroded
    ``steps`` times by the axis-aligned cross (in (y, x) only with ``in_plane``), the patch's outside and the voxels
    where ``known`` is 0 counted as part of it; its voxels no erosion keeps become ``background``. Voxels where
    ``known`` is 0 stay as they are."""
    out = np.array(labels)
    axes = (1, 2) if in_plane else (0, 1, 2)
    for b in range(out.shape[0]):
        patch = labels[b, 0]
        counted = np.ones(patch.shape, bool) if known is None else known[b, 0] != 0
        kept = np.zeros(patch.shape, bool)
        for label in np.unique(patch[counted]):
            if label == background:
                continue
            region = (patch == label) | ~counted
            for _ in range(steps):
                padded = np.pad(region, 1, constant_values=True)
                eroded = region.copy()
                for axis in axes:
                    for shift in (-1, 1):
                        eroded &= np.roll(padded, shift, axis=axis)[1:-1, 1:-1, 1:-1]
                region = eroded
            kept |= region & (patch == label)
        out[b, 0][counted & (patch != background) & ~kept] = background
    return out


def class_weights_reference(values, mask=None, classes=2, clip=(0.05, 0.95), per_channel=False):
    """gunpowder's ``BalanceLabels`` as its documentation defines it, per example (or per channel of each): the
    voxels a mask of 0 leaves out weigh 0; among the others, each class's fraction, clipped to ``clip`` (None: not
    on that side), gives each of its voxels the weight 1 / classes / fraction; a class absent weighs 0."""
    values = np.asarray(values)
    counted = np.ones(values.shape, bool) if mask is None else np.asarray(mask) != 0
    low, high = clip if clip is not None else (None, None)
    weights = np.zeros(values.shape, np.float32)
    slabs = [(b, c) for b in range(values.shape[0]) for c in range(values.shape[1])] if per_channel \
        else [(b, slice(None)) for b in range(values.shape[0])]
    for where in slabs:
        ids, inside = values[where].astype(np.int64), counted[where]
        for c in np.unique(ids[inside]):
            fraction = np.count_nonzero(ids[inside] == c) / np.count_nonzero(inside)
            fraction = max(fraction, low) if low is not None else fraction
            fraction = min(fraction, high) if high is not None else fraction
            weights[where][(ids == c) & inside] = 1.0 / classes / fraction
    return weights


def assert_releases_gil(kernel, *args):
    """While one thread runs ``kernel(*args)``, this one keeps running Python code.

    Only the loop's iterations timed in the first half of the kernel call count: with the GIL held for the whole
    call, none can fall there (before the call, this loop ran while the worker waited to start; after it, while
    the worker ended); released, the loop spins for the whole call. Best of three: a loaded 2-core machine can
    deschedule this thread for a whole short call (CI once saw none).
    """
    import threading
    import time

    started = time.perf_counter()
    kernel(*args)
    one_call = time.perf_counter() - started
    most = 0
    for _ in range(3):
        span = []

        def run():
            begun = time.perf_counter()
            kernel(*args)
            span.extend((begun, time.perf_counter()))

        stamps = []
        worker = threading.Thread(target=run)
        worker.start()
        while worker.is_alive():
            stamps.append(time.perf_counter())
        worker.join()
        # the first half of the call: when a kernel holding the GIL returns, this loop takes the GIL it has waited
        # for (for a switch interval, 5 ms) before the worker can time the call's end
        times, middle = np.asarray(stamps), span[0] + (span[1] - span[0]) / 2
        most = max(most, int(np.count_nonzero((times > span[0]) & (times < middle))))
        if most > 1000:
            break
    assert most > 1000, f"only {most} Python iterations ran during a {one_call * 1e3:.0f} ms kernel call, best of 3"


def lift_voxel_size_check(monkeypatch) -> None:
    """Let augmentations mix z with y and x of anisotropic voxels (the Loader refuses isotropic=True where the
    voxel size says z differs), to test the kernels' geometry on data that has a voxel size."""
    from emfast.augment import _base
    monkeypatch.setattr(_base, "VOXEL_SIZE_TOLERANCE", 10.0)
