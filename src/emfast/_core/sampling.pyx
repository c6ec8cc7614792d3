# cython: language_level=3
"""Thin typed wrappers around the sampler index kernels in csrc/sampling.cpp.

Each function checks its arguments and calls its kernel with the GIL released; kernels assume valid input, all
checking is here. The samplers that use them are in :mod:`emfast.sampling`.
"""
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

import numpy as np

cimport numpy as cnp
from emfast._core.common cimport check_aligned, check_status

from emfast._core.common import LABEL_DTYPES

cnp.import_array()


cdef extern from "sampling.h" nogil:
    int EMF_NO_CLASS

    ctypedef struct emf_label_view:
        const char *data
        int64_t shape[3]
        int64_t strides[3]
        int itemsize

    ctypedef enum emf_class_mode:
        EMF_CLASSES_BOUNDARY
        EMF_CLASSES_MAP

    ctypedef struct emf_class_rule:
        emf_class_mode mode
        int64_t thickness
        int in_plane
        const uint64_t *ids
        const uint8_t *id_classes
        int64_t n_ids
        int n_classes

    int emf_count_classes(const emf_label_view *labels, const emf_class_rule *rule, const int64_t *lo,
                          const int64_t *hi, const int64_t *block, uint32_t *counts)
    int emf_select_class(const emf_label_view *labels, const emf_class_rule *rule, const int64_t *lo,
                         const int64_t *hi, int cls, int64_t rank, int64_t *out)
    int emf_window_bits(const uint8_t *coverage, const int64_t *shape, const int64_t *extent, int64_t threshold,
                        uint64_t *bits, int64_t words_per_row, int64_t *row_counts, int64_t *max_count)
    void emf_select_bits(const uint64_t *bits, int64_t words_per_row, const int64_t *rows, const int64_t *ranks,
                         int64_t n, int64_t *out)


#: Class index of voxels that belong to no class.
NO_CLASS = EMF_NO_CLASS
#: Largest window volume (voxels) emf_window_bits can sum (int32 sums).
MAX_WINDOW_VOXELS = 2**31 - 1


cdef class ClassRule:
    """How the class kernels assign a class to a label voxel.

    Parameters
    ----------
    n_classes : int
        Number of classes, in [1, 255).
    thickness : int
        Boundary rule: reach of the comparison, >= 1; unused with a map.
    in_plane : bool
        Boundary rule: compare along y and x only.
    ids, id_classes : ndarray or None
        Map rule: distinct label ids as uint64 bits (sorted here) and the class index of each; None for the
        boundary rule (class 0 boundary, class 1 interior).
    """

    cdef emf_class_rule rule
    cdef readonly object ids, id_classes

    def __init__(self, int n_classes, thickness=1, in_plane=False, ids=None, id_classes=None):
        if not 1 <= n_classes < EMF_NO_CLASS:
            raise ValueError(f"n_classes must be in [1, {EMF_NO_CLASS}), got {n_classes}")
        self.rule.n_classes = n_classes
        self.rule.in_plane = bool(in_plane)
        self.rule.ids = NULL
        self.rule.id_classes = NULL
        self.rule.n_ids = 0
        if ids is None:
            if n_classes != 2:
                raise ValueError(f"the boundary rule has 2 classes, got n_classes={n_classes}")
            if thickness < 1:
                raise ValueError(f"thickness must be >= 1, got {thickness}")
            self.rule.mode = EMF_CLASSES_BOUNDARY
            self.rule.thickness = thickness
            return
        ids = np.asarray(ids, dtype=np.uint64)
        id_classes = np.asarray(id_classes, dtype=np.uint8)
        if ids.ndim != 1 or ids.shape != id_classes.shape:
            raise ValueError("ids and id_classes must be 1-D arrays of the same length")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("ids must be distinct")
        if len(id_classes) and id_classes.max() >= n_classes:
            raise ValueError(f"id_classes must be < n_classes={n_classes}")
        order = np.argsort(ids)
        self.ids = np.ascontiguousarray(ids[order])
        self.id_classes = np.ascontiguousarray(id_classes[order])
        self.rule.mode = EMF_CLASSES_MAP
        self.rule.thickness = 0
        self.rule.n_ids = len(ids)
        if len(ids):
            self.rule.ids = <const uint64_t *> cnp.PyArray_DATA(<cnp.ndarray> self.ids)
            self.rule.id_classes = <const uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> self.id_classes)

    @property
    def n_classes(self):
        return self.rule.n_classes


cdef object _view(labels, emf_label_view *view):
    """Describe a 3-D label array (any strides) for the kernels; returns the array, which the caller keeps."""
    if not isinstance(labels, np.ndarray):
        raise TypeError(f"labels must be a NumPy array, got {type(labels).__name__}")
    labels = np.asarray(labels)
    if labels.dtype not in LABEL_DTYPES or not labels.dtype.isnative:
        raise TypeError(f"labels have dtype {labels.dtype}; supported: uint32, uint64, int64, int32 (native-endian)")
    check_aligned(labels, "labels")
    if labels.ndim != 3:
        raise ValueError(f"labels must be 3-D (z, y, x), got shape {labels.shape}")
    view.data = <const char *> cnp.PyArray_DATA(<cnp.ndarray> labels)
    view.itemsize = labels.itemsize
    for axis in range(3):
        view.shape[axis] = labels.shape[axis]
        view.strides[axis] = labels.strides[axis]
    return labels


cdef void _box(lo, hi, tuple shape, int64_t *c_lo, int64_t *c_hi) except *:
    lo = [int(v) for v in lo]
    hi = [int(v) for v in hi]
    if len(lo) != 3 or len(hi) != 3:
        raise ValueError(f"lo and hi must be three integers (z, y, x), got {lo}, {hi}")
    for axis in range(3):
        if not 0 <= lo[axis] < hi[axis] <= shape[axis]:
            raise ValueError(f"box [{lo}, {hi}) is empty or outside the labels of shape {shape}")
        c_lo[axis] = lo[axis]
        c_hi[axis] = hi[axis]


def grid_shape(lo, hi, block):
    """Blocks of ``block`` tiling [lo, hi) along each axis: ceil((hi - lo) / block)."""
    return tuple(-(-(int(h) - int(l)) // int(b)) for l, h, b in zip(lo, hi, block))


def count_classes(labels, ClassRule rule not None, lo, hi, block, counts):
    """Voxels of each class per block of ``block`` tiling the box [lo, hi) of ``labels``, into ``counts``.

    ``counts`` is a C-contiguous uint32 array of shape ``grid_shape(lo, hi, block) + (rule.n_classes,)``,
    overwritten. Neighbours (boundary rule) are read anywhere in ``labels``; voxels outside it do not count.
    """
    cdef emf_label_view view
    labels = _view(labels, &view)
    cdef int64_t c_lo[3]
    cdef int64_t c_hi[3]
    cdef int64_t c_block[3]
    _box(lo, hi, labels.shape, c_lo, c_hi)
    block = [int(b) for b in block]
    if len(block) != 3 or min(block) < 1:
        raise ValueError(f"block must be three integers >= 1, got {block}")
    for axis in range(3):
        c_block[axis] = block[axis]
    shape = grid_shape(lo, hi, block) + (rule.rule.n_classes,)
    if not isinstance(counts, np.ndarray) or counts.dtype != np.uint32 or counts.shape != shape \
            or not counts.flags.c_contiguous or not counts.flags.writeable:
        raise ValueError(f"counts must be a writeable C-contiguous uint32 array of shape {shape}")
    cdef uint32_t *c_counts = <uint32_t *> cnp.PyArray_DATA(<cnp.ndarray> counts)
    cdef int status
    with nogil:
        status = emf_count_classes(&view, &rule.rule, c_lo, c_hi, c_block, c_counts)
    check_status(status, "count_classes")
    return counts


def select_class(labels, ClassRule rule not None, lo, hi, int cls, int64_t rank):
    """The ``rank``-th voxel (0-based, raster order) of class ``cls`` in the box [lo, hi) of ``labels``, as a
    (z, y, x) tuple in ``labels`` coordinates, or None if the box holds too few voxels of that class."""
    cdef emf_label_view view
    labels = _view(labels, &view)
    cdef int64_t c_lo[3]
    cdef int64_t c_hi[3]
    cdef int64_t out[3]
    _box(lo, hi, labels.shape, c_lo, c_hi)
    if not 0 <= cls < rule.rule.n_classes:
        raise ValueError(f"cls must be in [0, {rule.rule.n_classes}), got {cls}")
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    cdef int status
    with nogil:
        status = emf_select_class(&view, &rule.rule, c_lo, c_hi, cls, rank, out)
    check_status(status, "select_class")
    if out[0] < 0:
        return None
    return (out[0], out[1], out[2])


def words_per_row(int64_t corners_x):
    """uint64 words of one bitmap row holding ``corners_x`` bits."""
    return (corners_x + 63) // 64


def window_bits(coverage, extent, int64_t threshold, bits, row_counts):
    """Bitmap of the windows of ``extent`` holding at least ``threshold`` ones of ``coverage``.

    Parameters
    ----------
    coverage : ndarray
        (Z, Y, X) uint8 of 0 / 1, C-contiguous.
    extent : (int, int, int)
        Window extent, at most (Z, Y, X), with at most MAX_WINDOW_VOXELS voxels.
    threshold : int
        Ones a window needs.
    bits : ndarray
        (Pz * Py, words_per_row(Px)) uint64, C-contiguous, P = (Z, Y, X) - extent + 1; overwritten: bit x of
        row (cz, cy) is set where the window at corner (cz, cy, x) qualifies.
    row_counts : ndarray
        (Pz * Py,) int64, C-contiguous; overwritten with the set bits per row.

    Returns
    -------
    int
        The largest window sum in the slab.
    """
    if not isinstance(coverage, np.ndarray) or coverage.dtype != np.uint8 or coverage.ndim != 3 \
            or not coverage.flags.c_contiguous:
        raise ValueError("coverage must be a C-contiguous 3-D uint8 array")
    extent = [int(e) for e in extent]
    if len(extent) != 3 or any(not 1 <= e <= s for e, s in zip(extent, coverage.shape)):
        raise ValueError(f"extent {extent} must be >= 1 and fit the coverage of shape {coverage.shape}")
    if extent[0] * extent[1] * extent[2] > MAX_WINDOW_VOXELS:
        raise ValueError(f"window extent {extent} holds more than {MAX_WINDOW_VOXELS} voxels")
    corners = [s - e + 1 for s, e in zip(coverage.shape, extent)]
    words = words_per_row(corners[2])
    rows = corners[0] * corners[1]
    if not isinstance(bits, np.ndarray) or bits.dtype != np.uint64 or bits.shape != (rows, words) \
            or not bits.flags.c_contiguous or not bits.flags.writeable:
        raise ValueError(f"bits must be a writeable C-contiguous uint64 array of shape {(rows, words)}")
    if not isinstance(row_counts, np.ndarray) or row_counts.dtype != np.int64 or row_counts.shape != (rows,) \
            or not row_counts.flags.c_contiguous or not row_counts.flags.writeable:
        raise ValueError(f"row_counts must be a writeable C-contiguous int64 array of shape {(rows,)}")
    cdef int64_t c_shape[3]
    cdef int64_t c_extent[3]
    for axis in range(3):
        c_shape[axis] = coverage.shape[axis]
        c_extent[axis] = extent[axis]
    cdef const uint8_t *c_coverage = <const uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> coverage)
    cdef uint64_t *c_bits = <uint64_t *> cnp.PyArray_DATA(<cnp.ndarray> bits)
    cdef int64_t *c_counts = <int64_t *> cnp.PyArray_DATA(<cnp.ndarray> row_counts)
    cdef int64_t c_words = words
    cdef int64_t best = 0
    cdef int status
    with nogil:
        status = emf_window_bits(c_coverage, c_shape, c_extent, threshold, c_bits, c_words, c_counts, &best)
    check_status(status, "window_bits")
    return best


def select_bits(bits, rows, ranks):
    """For each query i, the x of the ``ranks[i]``-th set bit of row ``rows[i]`` of a :func:`window_bits`
    bitmap (-1 where that row has too few set bits)."""
    if not isinstance(bits, np.ndarray) or bits.dtype != np.uint64 or bits.ndim != 2 \
            or not bits.flags.c_contiguous:
        raise ValueError("bits must be a C-contiguous 2-D uint64 array")
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    ranks = np.ascontiguousarray(ranks, dtype=np.int64)
    if rows.ndim != 1 or rows.shape != ranks.shape:
        raise ValueError("rows and ranks must be 1-D arrays of the same length")
    if len(rows) and (rows.min() < 0 or rows.max() >= bits.shape[0] or ranks.min() < 0):
        raise ValueError(f"rows must be in [0, {bits.shape[0]}) and ranks >= 0")
    out = np.empty(len(rows), dtype=np.int64)
    if len(rows) == 0 or bits.shape[1] == 0:
        out.fill(-1)
        return out
    cdef const uint64_t *c_bits = <const uint64_t *> cnp.PyArray_DATA(<cnp.ndarray> bits)
    cdef const int64_t *c_rows = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> rows)
    cdef const int64_t *c_ranks = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> ranks)
    cdef int64_t *c_out = <int64_t *> cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int64_t n = len(rows)
    cdef int64_t c_words = bits.shape[1]
    with nogil:
        emf_select_bits(c_bits, c_words, c_rows, c_ranks, n, c_out)
    return out
