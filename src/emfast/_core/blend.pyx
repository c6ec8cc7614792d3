# cython: language_level=3
"""Thin typed wrappers around the blending kernels in csrc/blend.cpp (contract in csrc/blend.h): checks here, the
loops without the GIL there."""
from libc.stdint cimport int64_t
from libc.stdlib cimport free, realloc

import os

import numpy as np

cimport numpy as cnp

from emfast._core.common cimport check_status, dtype_code, emf_dtype, plain_array, writeable_array

cnp.import_array()

#: Dtypes a prediction may have.
PREDICTION_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: Dtypes a blended output may have.
BLEND_OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8))
#: The most parts a group of tiles is run in (threads); with rows below 2**62, the kernel's row arithmetic
#: cannot overflow.
MAX_PARTS = 1 << 16


cdef extern from "blend.h" nogil:
    ctypedef struct emf_blend_tile:
        double *sums
        int64_t sums_strides[4]
        const double *wz
        const double *wy
        const double *wx
        const void *prediction
        emf_dtype pred_dtype
        int64_t pred_strides[4]
        int64_t channels
        int64_t shape[3]
        int64_t first_low[3]
        int64_t first_high[3]
        int64_t row
        void *keep
        const void *kept_from
        int64_t keep_strides[4]
        int64_t from_strides[4]
        int64_t keep_shape[4]
        int64_t item_size
    int emf_blend_tiles(const emf_blend_tile *tiles, int64_t count, int64_t part, int64_t parts)
    int emf_blend_finish(const double *sums, const double *tz, const double *ty, const double *tx, double count,
                         int64_t channels, const int64_t *shape, emf_dtype out_dtype, void *out,
                         int64_t *non_finite)
    void emf_blend_allow_avx2(int allowed)
    int emf_blend_uses_avx2()


cdef tuple _axis_weights(weights, tuple shape, str name):
    """The three per-axis float64 arrays of ``weights``, contiguous, of lengths ``shape``."""
    try:
        axes = tuple(np.ascontiguousarray(w, np.float64) for w in weights)
    except TypeError:
        raise TypeError(f"{name} must be three 1-D arrays (z, y, x), got {type(weights).__name__}") from None
    if len(axes) != 3 or any(w.ndim != 1 or w.shape[0] != n for w, n in zip(axes, shape)):
        raise ValueError(f"{name} must be three 1-D arrays of lengths {shape}, got shapes "
                         f"{[np.shape(w) for w in axes]}")
    return axes


def blend_add(sums, weights, prediction, first=((0, 0, 0), (0, 0, 0))):
    """``sums += w * prediction`` over channels, where ``w[z, y, x] = wz[z] * wy[y] * wx[x]`` (``weights`` =
    (wz, wy, wx)); inside the box ``first`` = (low, high) the sums are set (``=``) instead: the voxels no earlier
    tile touched. One pass without the GIL.

    ``sums`` (C, z, y, x) float64 is a writeable view (any strides), ``prediction`` (C, z, y, x) float16/32/64
    with any strides (e.g. the inverse of a flip or transpose). Element by element the same as NumPy's
    ``(w[z, y, x] * prediction.astype(float64))`` added to (or stored in) ``sums``, with ``w`` multiplied in the
    order ``(wz * wy) * wx``.
    """
    tile = TileBlends()
    tile.add(sums, weights, prediction, first)
    tile.run()


cdef class TileBlends:
    """A group of tiles to blend into one block's sums, checked once (with the GIL) and then blended by
    :meth:`run`, in parts that threads run at once, each in a single call without the GIL: per tile,
    :func:`blend_add`'s work on that part's rows, after copying that part's rows of the tile, if asked, to an array
    kept for later blocks."""
    cdef emf_blend_tile *tiles
    cdef Py_ssize_t count, capacity
    cdef list arrays  # every array a pointer in ``tiles`` points into

    def __init__(self):
        free(self.tiles)  # NULL unless __init__ runs again
        self.tiles = NULL
        self.count = self.capacity = 0
        self.arrays = []

    def __dealloc__(self):
        free(self.tiles)

    def __len__(self):
        return self.count

    def add(self, sums, weights, prediction, first=((0, 0, 0), (0, 0, 0)), Py_ssize_t row=0, keep=None,
            kept_from=None):
        """Blend ``prediction`` into ``sums`` as :func:`blend_add` does (the same arguments), ``row`` being the
        block row of the view's first row (parts split the block's rows); first copy ``kept_from`` (a whole tile)
        to ``keep``, of the same shape and dtype, if given."""
        if not 0 <= row < (1 << 62):
            raise ValueError(f"row must be in [0, 2**62), got {row}")
        sums = plain_array(sums, "sums")
        if sums.dtype != np.float64 or sums.ndim != 4 or not sums.flags.writeable:
            raise TypeError(f"sums must be a writeable 4-D float64 array, got {sums.ndim}-D {sums.dtype}")
        prediction = plain_array(prediction, "prediction")
        cdef emf_dtype c_pred = dtype_code(prediction.dtype, "prediction", PREDICTION_DTYPES)
        if prediction.shape != sums.shape:
            raise ValueError(f"shapes differ: sums {sums.shape}, prediction {prediction.shape}")
        axes = _axis_weights(weights, sums.shape[1:], "weights")
        if keep is not None:
            keep = plain_array(keep, "keep")
            kept_from = plain_array(kept_from, "kept_from")
            if (keep.shape != kept_from.shape or keep.dtype != kept_from.dtype or keep.ndim != 4
                    or not keep.flags.writeable):
                raise ValueError(f"keep must be a writeable 4-D array of kept_from's shape and dtype, got "
                                 f"{keep.shape} {keep.dtype} for {kept_from.shape} {kept_from.dtype}")
        if self.count == self.capacity:
            self._grow()
        cdef emf_blend_tile *tile = &self.tiles[self.count]
        cdef int j
        low, high = first
        for j in range(3):
            tile.shape[j] = sums.shape[1 + j]
            tile.first_low[j] = min(max(int(low[j]), 0), tile.shape[j])
            tile.first_high[j] = min(max(int(high[j]), tile.first_low[j]), tile.shape[j])
        for j in range(4):
            tile.sums_strides[j] = sums.strides[j]
            tile.pred_strides[j] = prediction.strides[j]
        tile.channels = sums.shape[0]
        if 0 in sums.shape:  # nothing to blend: an empty shape makes the loops skip it
            tile.shape[0] = 0
        tile.sums = <double *> cnp.PyArray_DATA(<cnp.ndarray> sums)
        tile.wz = <const double *> cnp.PyArray_DATA(<cnp.ndarray> axes[0])
        tile.wy = <const double *> cnp.PyArray_DATA(<cnp.ndarray> axes[1])
        tile.wx = <const double *> cnp.PyArray_DATA(<cnp.ndarray> axes[2])
        tile.prediction = cnp.PyArray_DATA(<cnp.ndarray> prediction)
        tile.pred_dtype = c_pred
        tile.row = row
        tile.keep = NULL
        tile.kept_from = NULL
        tile.item_size = 0
        if keep is not None:
            tile.keep = cnp.PyArray_DATA(<cnp.ndarray> keep)
            tile.kept_from = cnp.PyArray_DATA(<cnp.ndarray> kept_from)
            tile.item_size = keep.itemsize
            for j in range(4):
                tile.keep_strides[j] = keep.strides[j]
                tile.from_strides[j] = kept_from.strides[j]
                tile.keep_shape[j] = keep.shape[j]
        self.arrays.append((sums, axes, prediction, keep, kept_from))
        self.count += 1

    cdef _grow(self):
        cdef Py_ssize_t capacity = max(8, 2 * self.capacity)
        cdef emf_blend_tile *grown = <emf_blend_tile *> realloc(self.tiles, capacity * sizeof(emf_blend_tile))
        if grown == NULL:
            raise MemoryError()
        self.tiles = grown
        self.capacity = capacity

    def run(self, Py_ssize_t part=0, Py_ssize_t parts=1):
        """Blend every tile, in the order added, on the rows of ``part`` (of ``parts``): those whose block row
        ``r`` has ``r % parts == part``, and copy the kept tiles' rows ``y % parts == part``. The parts of one
        group write disjoint rows, so threads may run them at once."""
        if not 0 <= part < parts <= MAX_PARTS:  # parts far beyond any row count would overflow the row steps
            raise ValueError(f"part must be in [0, parts), parts at most {MAX_PARTS}, got part {part} of {parts}")
        cdef int status
        with nogil:
            status = emf_blend_tiles(self.tiles, self.count, part, parts)
        check_status(status, "blend")


def blend_finish(sums, totals, double count, out):
    """``out = sums / (count * tz * ty * tx)`` (``totals`` = (tz, ty, tx), multiplied in that order) converted to
    ``out.dtype``: float32, float16 (rounded once, as NumPy rounds float64), or uint8 (``rint(clip(x, 0, 1) * 255)``,
    NaN to 0); C-contiguous (C, z, y, x) sums and out. Returns how many of the values were NaN or infinite (0 for
    uint8)."""
    sums = writeable_array(sums, "sums")
    out = writeable_array(out, "out")
    if sums.dtype != np.float64 or sums.ndim != 4 or out.shape != sums.shape:
        raise ValueError(f"need C-contiguous float64 sums (C, z, y, x) and out of their shape; got sums {sums.shape} "
                         f"{sums.dtype}, out {out.shape}")
    tz, ty, tx = _axis_weights(totals, sums.shape[1:], "totals")
    cdef emf_dtype c_dtype = dtype_code(out.dtype, "out", BLEND_OUTPUT_DTYPES)
    cdef int64_t channels = sums.shape[0]
    cdef int64_t shape[3]
    cdef int j
    for j in range(3):
        shape[j] = sums.shape[1 + j]
    cdef const double *c_sums = <const double *> cnp.PyArray_DATA(<cnp.ndarray> sums)
    cdef const double *c_tz = <const double *> cnp.PyArray_DATA(<cnp.ndarray> tz)
    cdef const double *c_ty = <const double *> cnp.PyArray_DATA(<cnp.ndarray> ty)
    cdef const double *c_tx = <const double *> cnp.PyArray_DATA(<cnp.ndarray> tx)
    cdef void *c_out = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int status
    cdef int64_t non_finite = 0
    with nogil:
        status = emf_blend_finish(c_sums, c_tz, c_ty, c_tx, count, channels, shape, c_dtype, c_out, &non_finite)
    check_status(status, "blend_finish")
    return non_finite


def uses_avx2():
    """Whether the blending kernels run their AVX2 build here (the same bits; compiled in, supported by this CPU,
    and the environment variable ``EMFAST_NO_AVX2`` unset when this module was imported)."""
    return bool(emf_blend_uses_avx2())


# Read once, here, as the warp module does: the kernels never look at the environment.
emf_blend_allow_avx2(0 if "EMFAST_NO_AVX2" in os.environ else 1)
