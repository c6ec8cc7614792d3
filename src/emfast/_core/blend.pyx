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
    int emf_blend_add(double *sums, const int64_t *sums_strides, float *totals, const int64_t *totals_strides,
                      const float *weight, const int64_t *weight_strides, const void *prediction,
                      emf_dtype pred_dtype, const int64_t *pred_strides, int64_t channels, const int64_t *shape)
    int emf_blend_finish(const double *sums, const float *totals, int64_t channels, int64_t voxels,
                         emf_dtype out_dtype, void *out)


cdef object _float_view(array, str name, dtype, int ndim, bint writeable):
    array = plain_array(array, name)
    if array.dtype != dtype or array.ndim != ndim or (writeable and not array.flags.writeable):
        raise TypeError(f"{name} must be a {'writeable ' if writeable else ''}{ndim}-D {np.dtype(dtype)} array, "
                        f"got {array.ndim}-D {array.dtype}")
    return array


def blend_add(sums, totals, weight, prediction):
    """``sums += weight * prediction`` (over channels) and ``totals += weight``, in one pass without the GIL.

    ``sums`` (C, z, y, x) float64 and ``totals`` (z, y, x) float32 are writeable views (any strides), ``weight``
    (z, y, x) float32, ``prediction`` (C, z, y, x) float16/32/64 with any strides (e.g. the inverse of a flip or
    transpose). Element by element the same as NumPy's ``sums += weight.astype(float64) *
    prediction.astype(float64)`` and ``totals += weight``.
    """
    sums = _float_view(sums, "sums", np.float64, 4, True)
    totals = _float_view(totals, "totals", np.float32, 3, True)
    weight = _float_view(weight, "weight", np.float32, 3, False)
    prediction = plain_array(prediction, "prediction")
    cdef emf_dtype c_pred = dtype_code(prediction.dtype, "prediction", PREDICTION_DTYPES)
    if prediction.shape != sums.shape or totals.shape != sums.shape[1:] or weight.shape != sums.shape[1:]:
        raise ValueError(f"shapes differ: sums {sums.shape}, totals {totals.shape}, weight {weight.shape}, "
                         f"prediction {prediction.shape}")
    if 0 in sums.shape:
        return
    cdef int64_t ss[4]
    cdef int64_t ps[4]
    cdef int64_t ts[3]
    cdef int64_t ws[3]
    cdef int64_t shape[3]
    cdef int j
    for j in range(4):
        ss[j] = sums.strides[j]
        ps[j] = prediction.strides[j]
    for j in range(3):
        ts[j] = totals.strides[j]
        ws[j] = weight.strides[j]
        shape[j] = sums.shape[1 + j]
    cdef int64_t channels = sums.shape[0]
    cdef double *c_sums = <double *> cnp.PyArray_DATA(<cnp.ndarray> sums)
    cdef float *c_totals = <float *> cnp.PyArray_DATA(<cnp.ndarray> totals)
    cdef const float *c_weight = <const float *> cnp.PyArray_DATA(<cnp.ndarray> weight)
    cdef const void *c_prediction = cnp.PyArray_DATA(<cnp.ndarray> prediction)
    cdef int status
    with nogil:
        status = emf_blend_add(c_sums, ss, c_totals, ts, c_weight, ws, c_prediction, c_pred, ps, channels, shape)
    check_status(status, "blend_add")


def blend_finish(sums, totals, out):
    """``out = sums / totals`` converted to ``out.dtype``: float32, float16 (rounded through float32), or uint8
    (``rint(clip(x, 0, 1) * 255)``, NaN to 0); C-contiguous (C, z, y, x) sums and out, (z, y, x) totals."""
    sums = writeable_array(sums, "sums")
    totals = writeable_array(totals, "totals")
    out = writeable_array(out, "out")
    if sums.dtype != np.float64 or totals.dtype != np.float32 or sums.ndim != 4 or totals.shape != sums.shape[1:] \
            or out.shape != sums.shape:
        raise ValueError(f"need float64 sums (C, z, y, x), float32 totals (z, y, x) and out of the sums' shape; got sums "
                         f"{sums.shape} {sums.dtype}, totals {totals.shape} {totals.dtype}, out {out.shape}")
    cdef emf_dtype c_dtype = dtype_code(out.dtype, "out", BLEND_OUTPUT_DTYPES)
    cdef int64_t channels = sums.shape[0]
    cdef int64_t voxels = totals.size
    cdef const double *c_sums = <const double *> cnp.PyArray_DATA(<cnp.ndarray> sums)
    cdef const float *c_totals = <const float *> cnp.PyArray_DATA(<cnp.ndarray> totals)
    cdef void *c_out = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int status
    with nogil:
        status = emf_blend_finish(c_sums, c_totals, channels, voxels, c_dtype, c_out)
    check_status(status, "blend_finish")
    return out
