# cython: language_level=3
"""Thin typed wrappers around the blending kernels in csrc/blend.cpp (contract in csrc/blend.h): checks here, the
loops without the GIL there."""
from libc.stdint cimport int64_t

import numpy as np

cimport numpy as cnp

from emfast._core.common cimport check_status, dtype_code, emf_dtype, plain_array, writeable_array

cnp.import_array()

#: Dtypes a prediction may have.
PREDICTION_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: Dtypes a blended output may have.
BLEND_OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8))


cdef extern from "blend.h" nogil:
    int emf_blend_add(double *sums, const int64_t *sums_strides, const double *wz, const double *wy,
                      const double *wx, const void *prediction, emf_dtype pred_dtype, const int64_t *pred_strides,
                      int64_t channels, const int64_t *shape, const int64_t *first_low, const int64_t *first_high)
    int emf_blend_finish(const double *sums, const double *tz, const double *ty, const double *tx, double count,
                         int64_t channels, const int64_t *shape, emf_dtype out_dtype, void *out)


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
    sums = plain_array(sums, "sums")
    if sums.dtype != np.float64 or sums.ndim != 4 or not sums.flags.writeable:
        raise TypeError(f"sums must be a writeable 4-D float64 array, got {sums.ndim}-D {sums.dtype}")
    prediction = plain_array(prediction, "prediction")
    cdef emf_dtype c_pred = dtype_code(prediction.dtype, "prediction", PREDICTION_DTYPES)
    if prediction.shape != sums.shape:
        raise ValueError(f"shapes differ: sums {sums.shape}, prediction {prediction.shape}")
    wz, wy, wx = _axis_weights(weights, sums.shape[1:], "weights")
    low, high = first
    cdef int64_t first_low[3]
    cdef int64_t first_high[3]
    cdef int j
    for j in range(3):
        first_low[j] = min(max(int(low[j]), 0), sums.shape[1 + j])
        first_high[j] = min(max(int(high[j]), first_low[j]), sums.shape[1 + j])
    if 0 in sums.shape:
        return
    cdef int64_t ss[4]
    cdef int64_t ps[4]
    cdef int64_t shape[3]
    for j in range(4):
        ss[j] = sums.strides[j]
        ps[j] = prediction.strides[j]
    for j in range(3):
        shape[j] = sums.shape[1 + j]
    cdef int64_t channels = sums.shape[0]
    cdef double *c_sums = <double *> cnp.PyArray_DATA(<cnp.ndarray> sums)
    cdef const double *c_wz = <const double *> cnp.PyArray_DATA(<cnp.ndarray> wz)
    cdef const double *c_wy = <const double *> cnp.PyArray_DATA(<cnp.ndarray> wy)
    cdef const double *c_wx = <const double *> cnp.PyArray_DATA(<cnp.ndarray> wx)
    cdef const void *c_prediction = cnp.PyArray_DATA(<cnp.ndarray> prediction)
    cdef int status
    with nogil:
        status = emf_blend_add(c_sums, ss, c_wz, c_wy, c_wx, c_prediction, c_pred, ps, channels, shape, first_low,
                               first_high)
    check_status(status, "blend_add")


def blend_finish(sums, totals, double count, out):
    """``out = sums / (count * tz * ty * tx)`` (``totals`` = (tz, ty, tx), multiplied in that order) converted to
    ``out.dtype``: float32, float16 (rounded through float32), or uint8 (``rint(clip(x, 0, 1) * 255)``, NaN to 0);
    C-contiguous (C, z, y, x) sums and out."""
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
    with nogil:
        status = emf_blend_finish(c_sums, c_tz, c_ty, c_tx, count, channels, shape, c_dtype, c_out)
    check_status(status, "blend_finish")
    return out
