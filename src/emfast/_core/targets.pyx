# cython: language_level=3
"""Thin typed wrappers around the label -> target kernels in csrc/targets.cpp and csrc/lsd.cpp.

Every function takes a batch of label patches ``labels`` (B, 1, Zi, Yi, Xi), C-contiguous uint32, uint64, int64 or
int32 (compared as their bits: a negative id is an ordinary id), and a ``margin`` (mz, my, mx): output voxel
(z, y, x) is label voxel (z + mz, y + my, x + mx), so outputs have shape (B, K, Zi - 2 mz, Yi - 2 my, Xi - 2 mx).
Label voxels outside the patch are unknown. Each function checks its arguments and calls its kernel once per batch
with the GIL released; kernels assume valid input, all checking is here. The user-facing specifications are in
:mod:`emfast.targets`.
"""
import numbers
import operator
import os

from libc.stdint cimport int64_t, uint8_t, uint64_t

import numpy as np

cimport numpy as cnp
from emfast._core.common cimport (check_aligned, check_reach, check_status, dtype_code, emf_dtype, plain_array,
                                  writeable_array)

from emfast._checks import refusal as _refusal
from emfast._core.common import LABEL_DTYPES

cnp.import_array()


cdef extern from "targets.h" nogil:
    ctypedef struct emf_labels:
        const void *data
        int64_t count
        int64_t shape[3]
        int64_t margin[3]
        int itemsize

    ctypedef struct emf_mask_ids:
        int has_ignore
        int has_unlabelled
        uint64_t ignore
        uint64_t unlabelled

    int emf_affinities(const emf_labels *labels, const int64_t *offsets, int64_t channels, int has_background,
                       uint64_t background, const emf_mask_ids *ids, emf_dtype out_dtype, void *out, uint8_t *mask)
    int emf_boundaries(const emf_labels *labels, int64_t thickness, int in_plane, uint8_t *out)
    int emf_classes(const emf_labels *labels, int64_t thickness, int in_plane, int has_background,
                    uint64_t background, const int64_t *values, emf_dtype out_dtype, void *out)
    int emf_foreground(const emf_labels *labels, uint64_t background, uint8_t *out)
    int emf_balance(const void *values, emf_dtype dtype, const uint8_t *mask, int64_t slabs, int64_t slab_size,
                    int64_t classes, double clip_min, double clip_max, float *out, int64_t *bad)

cdef extern from "grow.h" nogil:
    int EMF_GROW_MAX_STEPS
    int emf_grow_boundary(void *labels, int itemsize, const uint8_t *known, int64_t count, const int64_t *shape,
                          int64_t steps, int in_plane, uint64_t background)
    void emf_grow_allow_avx2(int allowed)
    int emf_grow_uses_avx2()

cdef extern from "lsd.h" nogil:
    int emf_lsd(const emf_labels *labels, const double *sigma, const int64_t *radius,
                const double *variance_floor, int has_background, uint64_t background, int has_ignore,
                uint64_t ignore, int planar, float *out, uint8_t *mask)


_AXES = "zyx"


def _integer(value, what):
    """``value`` as a Python int, refusing bools, floats and other non-integers (a setting: ValueError, as
    :mod:`emfast._checks` refuses settings)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise _refusal(f"{what} must be an integer, got {value!r}", what)
    return operator.index(value)


cdef object _plain_labels(labels):
    """A base-class view of ``labels`` after checking it: an ndarray subclass cannot misreport its geometry, and
    the caller's reference keeps the array alive while the kernel runs without the GIL."""
    if not isinstance(labels, np.ndarray):
        raise TypeError(f"labels must be a NumPy array, got {type(labels).__name__}")
    labels = np.asarray(labels)
    if labels.dtype not in LABEL_DTYPES or not labels.dtype.isnative:
        raise TypeError(f"labels have dtype {labels.dtype}; supported: uint32, uint64, int64, int32 (native-endian)")
    check_aligned(labels, "labels")
    if labels.ndim != 5 or labels.shape[1] != 1:
        raise ValueError(f"labels must have shape (B, 1, Z, Y, X), got {labels.shape}")
    if not labels.flags.c_contiguous:
        raise ValueError("labels must be C-contiguous")
    return labels


cdef tuple _margin(margin, tuple shape):
    """The margin as three ints, checked to leave at least one output voxel along each axis."""
    try:
        values = tuple(margin)
    except TypeError:
        values = ()
    if len(values) != 3:
        raise _refusal(f"margin must be three integers (z, y, x), got {margin!r}", "margin")
    values = tuple(_integer(m, "margin") for m in values)
    for axis in range(3):
        if values[axis] < 0:
            raise _refusal(f"margin must be >= 0 along each axis, got {values}", "margin")
        if 2 * values[axis] >= shape[axis]:
            raise ValueError(
                f"margin {values} leaves no output voxel along axis {_AXES[axis]}: the label patch has extent "
                f"{shape[axis]} there, which must exceed 2 * {values[axis]}")
    return values


cdef uint64_t _label_bits(value, labels_dtype, what) except? 0:
    """An id (background, ignore) as the bits of a label of ``labels_dtype``; it must be representable."""
    value = _integer(value, what)
    info = np.iinfo(labels_dtype)
    if not info.min <= value <= info.max:
        raise _refusal(f"{what} {value} cannot occur in {labels_dtype} labels (range [{info.min}, {info.max}])",
                      what)
    return <uint64_t> (value & 0xFFFFFFFFFFFFFFFF)


cdef object _plain_out(out, name, tuple shape, dtypes, labels):
    """A base-class view of the output ``out`` after checking shape, dtype, layout and overlap with the labels."""
    out = writeable_array(out, name)
    dtype_code(out.dtype, name, dtypes)
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {out.shape}")
    if np.may_share_memory(out, labels):
        raise ValueError(f"{name} must not overlap the labels")
    return out


cdef object _one_channel_out(labels, tuple margin, out, tuple dtypes, emf_labels *desc):
    """``out`` (B, 1, Zo, Yo, Xo) checked against the labels, with ``desc`` filled in for the kernel; None when
    the batch is empty and there is nothing to compute."""
    out = _plain_out(out, "out", _out_shape(labels, margin, 1), dtypes, labels)
    if out.size == 0:
        return None
    _describe(labels, margin, desc)
    return out


cdef void _describe(labels, tuple margin, emf_labels *desc):
    desc.data = cnp.PyArray_DATA(<cnp.ndarray> labels)
    desc.count = labels.shape[0]
    desc.itemsize = labels.itemsize
    for axis in range(3):
        desc.shape[axis] = labels.shape[2 + axis]
        desc.margin[axis] = margin[axis]


cdef tuple _out_shape(labels, tuple margin, Py_ssize_t channels):
    return (labels.shape[0], channels) + tuple(labels.shape[2 + a] - 2 * margin[a] for a in range(3))


cdef int64_t _thickness(thickness, tuple shape) except -1:
    thickness = _integer(thickness, "thickness")
    if thickness < 1:
        raise _refusal(f"thickness must be >= 1, got {thickness}", "thickness")
    return min(thickness, max(shape))  # a step of the patch extent or more never reaches a voxel inside


def output_shape(labels, margin, Py_ssize_t channels):
    """The shape (B, channels, Zo, Yo, Xo) of a target of ``labels`` cut with ``margin``, after the checks every
    kernel wrapper makes of these two arguments."""
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}")
    labels = _plain_labels(labels)
    return _out_shape(labels, _margin(margin, labels.shape[2:]), channels)


def affinities(labels, offsets, margin, background, ignore, out, mask, unlabelled=None):
    """Affinities of a label batch for K offsets, into ``out`` and ``mask`` (B, K, Zo, Yo, Xo), without the GIL.

    Convention of gunpowder's ``seg_to_affgraph``: channel k at output voxel v (label voxel u = v + margin) links
    u with its neighbour u + offsets[k]. ``out`` is 1 where both labels are equal and label[u] is not
    ``background``, else 0, and 0 where the neighbour lies outside the patch. ``mask`` is 0 where the neighbour
    lies outside the patch, where either label equals ``ignore`` or where both equal ``unlabelled``, else 1.

    Parameters
    ----------
    labels : ndarray
        (B, 1, Zi, Yi, Xi) uint32, int32, uint64 or int64, C-contiguous.
    offsets : sequence of (int, int, int)
        K >= 1 offsets (dz, dy, dx), any sign, none all zero. An offset as long as the patch along some axis is
        legal: its channel is then all 0 and fully masked.
    margin : (int, int, int)
        Label voxels on each side of the output region, >= 0, with 2 * margin < label extent.
    background, ignore : int or None
        Label ids (None: no such id); each must be representable in the labels' dtype.
    out : ndarray
        (B, K, Zo, Yo, Xo) float32 or uint8, C-contiguous, written.
    mask : ndarray
        (B, K, Zo, Yo, Xo) uint8, C-contiguous, written.
    unlabelled : int or None
        Label id (None: none), representable in the labels' dtype.

    Returns
    -------
    (out, mask)
    """
    labels = _plain_labels(labels)
    shape = labels.shape[2:]
    cdef tuple m = _margin(margin, shape)
    try:
        rows = list(offsets)
    except TypeError:
        raise _refusal(f"offsets must be a sequence of (dz, dy, dx) triples, got {offsets!r}", "offsets") from None
    if not rows:
        raise _refusal("offsets must hold at least one (dz, dy, dx) triple", "offsets")
    table = np.empty((len(rows), 3), dtype=np.int64)
    for k, row in enumerate(rows):
        try:
            row = tuple(row)
        except TypeError:
            row = (row,)
        if len(row) != 3:
            raise _refusal(f"offset {k} must be a (dz, dy, dx) triple, got {row!r}", "offsets")
        row = tuple(_integer(d, f"offset {k}") for d in row)
        if row == (0, 0, 0):
            raise ValueError(f"offset {k} is (0, 0, 0); an affinity needs a neighbour at a non-zero offset")
        for axis in range(3):  # steps beyond the patch all land outside it: clamping changes nothing
            table[k, axis] = max(-shape[axis], min(row[axis], shape[axis]))
    cdef int has_background = background is not None
    cdef uint64_t c_background = _label_bits(background, labels.dtype, "background") if has_background else 0
    cdef emf_mask_ids ids
    ids.has_ignore = ignore is not None
    ids.ignore = _label_bits(ignore, labels.dtype, "ignore") if ids.has_ignore else 0
    ids.has_unlabelled = unlabelled is not None
    ids.unlabelled = _label_bits(unlabelled, labels.dtype, "unlabelled") if ids.has_unlabelled else 0
    out_shape = _out_shape(labels, m, len(rows))
    result = (out, mask)
    out = _plain_out(out, "out", out_shape, (np.dtype(np.float32), np.dtype(np.uint8)), labels)
    mask = _plain_out(mask, "mask", out_shape, (np.dtype(np.uint8),), labels)
    if np.may_share_memory(out, mask):
        raise ValueError("out and mask must not overlap")
    if out.size == 0:
        return result
    cdef emf_labels desc
    _describe(labels, m, &desc)
    cdef int64_t[:, ::1] c_offsets = table
    cdef int64_t channels = len(rows)
    cdef emf_dtype c_dtype = dtype_code(out.dtype, "out", (out.dtype,))
    cdef void *c_out = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef uint8_t *c_mask = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> mask)
    cdef int status
    with nogil:
        status = emf_affinities(&desc, &c_offsets[0, 0], channels, has_background, c_background, &ids, c_dtype,
                                c_out, c_mask)
    check_status(status, "affinities")
    return result


def boundaries(labels, margin, thickness, in_plane, out):
    """Boundary map of a label batch into ``out`` (B, 1, Zo, Yo, Xo) uint8, without the GIL.

    Output voxel v (label voxel u = v + margin) is 1 where some label voxel u + t e, with e one of the six unit
    steps +-z, +-y, +-x (only +-y, +-x if ``in_plane``) and 1 <= t <= ``thickness``, lies inside the patch and
    has a label other than label[u]; else 0. Voxels outside the patch do not count.
    """
    labels = _plain_labels(labels)
    shape = labels.shape[2:]
    cdef tuple m = _margin(margin, shape)
    cdef int64_t c_thickness = _thickness(thickness, shape)
    cdef int c_in_plane = bool(in_plane)
    cdef emf_labels desc
    checked = _one_channel_out(labels, m, out, (np.dtype(np.uint8),), &desc)
    if checked is None:
        return out
    cdef uint8_t *c_out = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> checked)
    cdef int status
    with nogil:
        status = emf_boundaries(&desc, c_thickness, c_in_plane, c_out)
    check_status(status, "boundaries")
    return out


def classes(labels, margin, thickness, in_plane, background, values, out):
    """Class map of a label batch into ``out`` (B, 1, Zo, Yo, Xo) int64 or uint8, without the GIL.

    ``values[0]`` where the label is ``background`` (never if None), else ``values[1]`` on boundary voxels (as in
    :func:`boundaries` with ``thickness`` and ``in_plane``), else ``values[2]``. Values must fit ``out.dtype``.
    """
    labels = _plain_labels(labels)
    shape = labels.shape[2:]
    cdef tuple m = _margin(margin, shape)
    cdef int64_t c_thickness = _thickness(thickness, shape)
    cdef int c_in_plane = bool(in_plane)
    cdef int has_background = background is not None
    cdef uint64_t c_background = _label_bits(background, labels.dtype, "background") if has_background else 0
    cdef emf_labels desc
    checked = _one_channel_out(labels, m, out, (np.dtype(np.int64), np.dtype(np.uint8)), &desc)
    try:
        given = tuple(values)
    except TypeError:
        given = ()
    if len(given) != 3 or not all(isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, bool)
                                  for v in given):
        raise _refusal(f"values must be three integer class ids (background, boundary, inside), got {values!r}",
                      "values")
    values = tuple(operator.index(v) for v in given)
    info = np.iinfo(out.dtype)
    if not all(info.min <= v <= info.max for v in values):
        raise _refusal(f"values {values} do not fit dtype {out.dtype}", "values")
    cdef int64_t c_values[3]
    for j in range(3):
        c_values[j] = values[j]
    if checked is None:
        return out
    cdef emf_dtype c_dtype = dtype_code(checked.dtype, "out", (checked.dtype,))
    cdef void *c_out = cnp.PyArray_DATA(<cnp.ndarray> checked)
    cdef int status
    with nogil:
        status = emf_classes(&desc, c_thickness, c_in_plane, has_background, c_background, c_values, c_dtype,
                             c_out)
    check_status(status, "classes")
    return out


def foreground(labels, margin, background, out):
    """Foreground mask of a label batch into ``out`` (B, 1, Zo, Yo, Xo) uint8: 1 where label != ``background``."""
    labels = _plain_labels(labels)
    shape = labels.shape[2:]
    cdef tuple m = _margin(margin, shape)
    cdef uint64_t c_background = _label_bits(background, labels.dtype, "background")
    cdef emf_labels desc
    checked = _one_channel_out(labels, m, out, (np.dtype(np.uint8),), &desc)
    if checked is None:
        return out
    cdef uint8_t *c_out = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> checked)
    cdef int status
    with nogil:
        status = emf_foreground(&desc, c_background, c_out)
    check_status(status, "foreground")
    return out


#: The longest reach of :func:`grow_boundary`, in steps along the axes (each a pass over the labels).
MAX_GROW_STEPS = EMF_GROW_MAX_STEPS


def grow_boundary(labels, known, steps, bint in_plane, background):
    """Grow the boundaries between the objects of a label batch in place, without the GIL (gunpowder's
    ``GrowBoundary``): every voxel not labelled ``background`` becomes ``background`` where a voxel at most
    ``steps`` steps away along the axes (``|dz| + |dy| + |dx| <= steps``; dz = 0 with ``in_plane``), inside its patch,
    has another label. Voxels where ``known`` is 0 are left as they are and count as every label.

    Parameters
    ----------
    labels : ndarray
        (B, 1, Z, Y, X) uint32, uint64, int64 or int32, C-contiguous, writeable; changed in place.
    known : ndarray or None
        Like ``labels``, uint8 (0: masked out or unknown); None: every voxel known.
    steps : int
        In [1, :data:`MAX_GROW_STEPS`].
    in_plane : bool
        Grow in (y, x) only, each section on its own.
    background : int
        The id boundaries are set to; it must fit the labels' dtype.

    Returns
    -------
    labels
    """
    labels = _plain_labels(labels)
    if not labels.flags.writeable:
        raise ValueError("labels must be writeable: they are grown in place")
    steps = _integer(steps, "steps")
    if not 1 <= steps <= MAX_GROW_STEPS:
        raise _refusal(f"steps must be in [1, {MAX_GROW_STEPS}], got {steps}", "steps")
    cdef uint64_t c_background = _label_bits(background, labels.dtype, "background")
    if known is not None:
        known = plain_array(known, "known")
        dtype_code(known.dtype, "known", (np.dtype(np.uint8),))
        if known.shape != labels.shape:
            raise ValueError(f"known must be shaped like the labels {labels.shape}, got {known.shape}")
        if not known.flags.c_contiguous:
            raise ValueError("known must be C-contiguous")
        if np.may_share_memory(known, labels):
            raise ValueError("known must not overlap the labels")
    if labels.size == 0:
        return labels
    cdef int64_t shape[3]
    for axis in range(3):
        shape[axis] = labels.shape[2 + axis]
    cdef void *c_labels = cnp.PyArray_DATA(<cnp.ndarray> labels)
    cdef uint8_t *c_known = NULL
    if known is not None:
        c_known = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> known)
    cdef int itemsize = labels.itemsize
    cdef int64_t count = labels.shape[0], c_steps = steps
    cdef int status
    with nogil:
        status = emf_grow_boundary(c_labels, itemsize, c_known, count, shape, c_steps, in_plane, c_background)
    check_status(status, "grow_boundary")
    return labels

#: Dtypes of the targets whose classes :func:`balance` weighs: binary maps, affinities and class maps.
BALANCED_DTYPES = (np.dtype(np.uint8), np.dtype(np.int64), np.dtype(np.float32))
#: The most classes :func:`balance` counts (a count and a weight per class, per call).
MAX_BALANCED_CLASSES = 1 << 20


def balance(values, mask, Py_ssize_t classes, clip_min, clip_max, bint per_channel, out):
    """Loss weights that balance the classes of ``values`` into ``out``, without the GIL (gunpowder's
    ``BalanceLabels``).

    Per example (or per channel of each example with ``per_channel``), among the voxels where ``mask`` is non-zero,
    the fraction f_c of each class c is clipped to [``clip_min``, ``clip_max``] (None: not clipped on that side),
    and ``out`` is ``1 / classes / f_c`` at a voxel of class c inside the mask, 0 outside it. A class absent from
    the mask weighs 0.

    Parameters
    ----------
    values : ndarray
        (B, C, Z, Y, X) uint8, int64 or float32, C-contiguous, integers in [0, ``classes``).
    mask : ndarray or None
        Like ``values``, uint8 (non-zero: counted and weighted); None: every voxel.
    classes : int
        In [1, :data:`MAX_BALANCED_CLASSES`].
    clip_min, clip_max : float or None
        Bounds of the class fractions, in [0, 1].
    per_channel : bool
        Balance each channel of each example on its own.
    out : ndarray
        Like ``values``, float32, written.

    Returns
    -------
    out

    Raises
    ------
    ValueError
        If a value is not an integer in [0, ``classes``), naming it and its position.
    """
    values = plain_array(values, "values")
    cdef emf_dtype code = dtype_code(values.dtype, "values", BALANCED_DTYPES)
    if values.ndim != 5 or not values.flags.c_contiguous:
        raise ValueError(f"values must be a C-contiguous (B, C, Z, Y, X) array, got shape {values.shape}")
    out = _plain_out(out, "out", values.shape, (np.dtype(np.float32),), values)
    if mask is not None:
        mask = plain_array(mask, "mask")
        dtype_code(mask.dtype, "mask", (np.dtype(np.uint8),))
        if mask.shape != values.shape or not mask.flags.c_contiguous:
            raise ValueError(f"mask must be C-contiguous and shaped like the values {values.shape}, got {mask.shape}")
        if np.may_share_memory(out, mask):
            raise ValueError("out must not overlap the mask")
    if not 1 <= classes <= MAX_BALANCED_CLASSES:
        raise ValueError(f"classes must be in [1, {MAX_BALANCED_CLASSES}], got {classes}")
    cdef double low = float("nan") if clip_min is None else float(clip_min)
    cdef double high = float("nan") if clip_max is None else float(clip_max)
    if values.size == 0:
        return out
    cdef int64_t slabs = values.shape[0] * (values.shape[1] if per_channel else 1)
    cdef int64_t slab_size = values.size // slabs
    cdef void *c_values = cnp.PyArray_DATA(<cnp.ndarray> values)
    cdef uint8_t *c_mask = NULL
    if mask is not None:
        c_mask = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> mask)
    cdef float *c_out = <float *> cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int64_t bad = -1
    cdef int status
    with nogil:
        status = emf_balance(c_values, code, c_mask, slabs, slab_size, classes, low, high, c_out, &bad)
    check_status(status, "balance")
    if bad >= 0:
        where = tuple(int(i) for i in np.unravel_index(bad, values.shape))
        raise ValueError(f"value {values[where].item()!r} at {where} is not a class in [0, {classes}): "
                         "the weights balance integer class ids")
    return out

#: Channels of a local shape descriptor: mean offset (z, y, x), variance (z, y, x), pearson (zy, zx, yx), size.
LSD_CHANNELS = 10
#: Channels of one described in plane (lsds' 2-D): mean offset (y, x), variance (y, x), pearson (yx), size.
LSD_PLANAR_CHANNELS = 6


def _three_numbers(values, what):
    """``values`` as a tuple of three floats (z, y, x)."""
    try:
        numbers_given = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        numbers_given = ()
    if len(numbers_given) != 3:
        raise _refusal(f"{what} must be three numbers (z, y, x), got {values!r}", what)
    return numbers_given


def lsd_radius(sigma):
    """The reach (voxels, per axis) of the truncated gaussians of ``sigma`` (voxels): scipy.ndimage's
    ``int(3 * sigma + 0.5)``, as lsds uses; ValueError beyond :data:`~emfast._core.common.MAX_KERNEL_REACH`."""
    for s in sigma:
        check_reach(3.0 * float(s) + 0.5, float(s), "lsd")
    return tuple(int(3.0 * float(s) + 0.5) for s in sigma)


def lsd(labels, margin, sigma, variance_floor, background, ignore, out, mask, bint planar=False):
    """Local shape descriptors of a label batch into ``out`` (B, 10, Zo, Yo, Xo) float32 (``planar``: lsds' six
    2-D channels of each section, (B, 6, Zo, Yo, Xo)) and ``mask`` (B, 1, Zo, Yo, Xo) uint8, without the GIL.

    The gaussian mode of funkelab's lsds, per object (voxels of one id other than ``background`` and
    ``ignore``), with gaussians of standard deviation ``sigma`` voxels truncated at :func:`lsd_radius`; label
    voxels outside the patch belong to no object. See csrc/lsd.h for the channels. ``mask`` is 1 on object voxels,
    0 on ``background`` and ``ignore`` voxels (whose descriptor is 0).

    Parameters
    ----------
    labels : ndarray
        (B, 1, Zi, Yi, Xi) uint32, int32, uint64 or int64, C-contiguous.
    margin : (int, int, int)
        Label voxels on each side of the output region, >= 0, with 2 * margin < label extent.
    sigma : (float, float, float)
        Standard deviation of the gaussian per axis in voxels, >= 1 (z: unused with ``planar``).
    variance_floor : (float, float, float)
        Smallest variance per axis, in units of sigma squared (lsds floors variances at 1e-3 world units squared).
    background, ignore : int or None
        Label ids without a descriptor (None: no such id); each must be representable in the labels' dtype.
    out : ndarray
        (B, 10, Zo, Yo, Xo) float32 (``planar``: 6 channels), C-contiguous, written.
    mask : ndarray
        (B, 1, Zo, Yo, Xo) uint8, C-contiguous, written.
    planar : bool
        Each section on its own, as lsds describes a 2-D segmentation.

    Returns
    -------
    (out, mask)
    """
    labels = _plain_labels(labels)
    shape = labels.shape[2:]
    cdef tuple m = _margin(margin, shape)
    sigma = _three_numbers(sigma, "sigma")
    if planar:  # the z kernel is the section itself
        sigma = (1.0,) + sigma[1:]
    variance_floor = _three_numbers(variance_floor, "variance_floor")
    if not all(1.0 <= v < float("inf") for v in sigma):
        raise _refusal(f"sigma must be >= 1 voxel along each axis, got {sigma}", "sigma")
    if not all(0.0 <= v < float("inf") for v in variance_floor):
        raise _refusal(f"variance_floor must be finite and >= 0, got {variance_floor}", "variance_floor")
    cdef double c_sigma[3]
    cdef double c_floor[3]
    cdef int64_t c_radius[3]
    for axis, reach in enumerate(lsd_radius(sigma)):
        c_sigma[axis] = sigma[axis]
        c_radius[axis] = 0 if planar and axis == 0 else reach
        c_floor[axis] = variance_floor[axis]
    cdef int has_background = background is not None
    cdef int has_ignore = ignore is not None
    cdef uint64_t c_background = _label_bits(background, labels.dtype, "background") if has_background else 0
    cdef uint64_t c_ignore = _label_bits(ignore, labels.dtype, "ignore") if has_ignore else 0
    result = (out, mask)
    out = _plain_out(out, "out", _out_shape(labels, m, LSD_PLANAR_CHANNELS if planar else LSD_CHANNELS),
                     (np.dtype(np.float32),), labels)
    mask = _plain_out(mask, "mask", _out_shape(labels, m, 1), (np.dtype(np.uint8),), labels)
    if np.may_share_memory(out, mask):
        raise ValueError("out and mask must not overlap")
    if out.size == 0:
        return result
    cdef emf_labels desc
    _describe(labels, m, &desc)
    cdef float *c_out = <float *> cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef uint8_t *c_mask = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> mask)
    cdef int status
    with nogil:
        status = emf_lsd(&desc, c_sigma, c_radius, c_floor, has_background, c_background, has_ignore, c_ignore,
                         planar, c_out, c_mask)
    check_status(status, "lsd")
    return result


def grow_uses_avx2():
    """Whether :func:`grow_boundary` runs its AVX2 build here (the same labels; compiled in, supported by this
    CPU, and the environment variable ``EMFAST_NO_AVX2`` unset when this module was imported)."""
    return bool(emf_grow_uses_avx2())


emf_grow_allow_avx2(0 if "EMFAST_NO_AVX2" in os.environ else 1)
