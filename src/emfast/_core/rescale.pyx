# cython: language_level=3
"""Thin typed wrappers around the resampling kernels in csrc/rescale.cpp (contract in csrc/rescale.h): a field stored
at another voxel size brought onto raw's grid through per-axis index tables. Checks here, the loops without the GIL
there."""
from libc.stdint cimport int64_t

import numpy as np

cimport numpy as cnp

from emfast._core.common cimport check_status, dtype_code, emf_dtype, plain_array, writeable_array

cnp.import_array()

#: Dtypes the linear kernel interpolates from.
LINEAR_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64),
                 np.dtype(np.int64), np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


cdef extern from "rescale.h" nogil:
    int emf_rescale_nearest(const void *src, const int64_t *src_strides, int64_t elem_size, int64_t channels,
                            const int64_t *index_z, const int64_t *index_y, const int64_t *index_x,
                            const int64_t *shape, void *out)
    int emf_rescale_linear(const void *src, emf_dtype src_dtype, const int64_t *src_strides, int64_t channels,
                           const int64_t *lo_z, const int64_t *hi_z, const double *w_z,
                           const int64_t *lo_y, const int64_t *hi_y, const double *w_y,
                           const int64_t *lo_x, const int64_t *hi_x, const double *w_x,
                           const int64_t *shape, float *out)


cdef object _source(src):
    src = plain_array(src, "src")
    if src.ndim != 4:
        raise ValueError(f"src must be 4-D (c, z, y, x), got shape {src.shape}")
    return src


cdef object _index(table, int64_t size, int64_t length, str name):
    """``table`` as a contiguous int64 array of ``length`` entries, each in [0, size)."""
    table = np.ascontiguousarray(table, dtype=np.int64)
    if table.ndim != 1 or table.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got shape {table.shape}")
    if length and (table.min() < 0 or table.max() >= size):
        raise ValueError(f"{name} indexes outside the source's {size} positions: [{table.min()}, {table.max()}]")
    return table


cdef object _weights(table, int64_t length, str name):
    table = np.ascontiguousarray(table, dtype=np.float64)
    if table.ndim != 1 or table.shape[0] != length or (length and not (np.all(table >= 0) and np.all(table <= 1))):
        raise ValueError(f"{name} must be {length} weights in [0, 1]")
    return table


cdef void _walk(src, tuple shape, int64_t *strides, int64_t *extent):
    """The kernels' walk: ``src``'s byte strides (c, z, y, x) and the output's extent (z, y, x) of ``shape``."""
    cdef int j
    for j in range(4):
        strides[j] = src.strides[j]
    for j in range(3):
        extent[j] = shape[1 + j]


def rescale_nearest(src, index_z, index_y, index_x, out):
    """``out[c, z, y, x] = src[c, index_z[z], index_y[y], index_x[x]]`` without the GIL, bit for bit.

    ``src`` (c, z, y, x) of any strides and element size 1, 2, 4 or 8 bytes; ``out`` C-contiguous
    ``(c, len(index_z), len(index_y), len(index_x))`` of src's dtype. The same as NumPy's
    ``src[:, index_z][:, :, index_y][:, :, :, index_x]``.
    """
    src = _source(src)
    out = writeable_array(out, "out")
    shape = (src.shape[0], len(index_z), len(index_y), len(index_x))
    if out.dtype != src.dtype or out.shape != shape:
        raise ValueError(f"out must be a {src.dtype} array of shape {shape}, got {out.dtype} {out.shape}")
    if src.dtype.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"src has dtype {src.dtype}; elements of 1, 2, 4 or 8 bytes only")
    tables = [_index(t, src.shape[1 + a], shape[1 + a], f"index_{'zyx'[a]}")
              for a, t in enumerate((index_z, index_y, index_x))]
    if out.size == 0:
        return out
    cdef int64_t strides[4]
    cdef int64_t extent[3]
    _walk(src, shape, strides, extent)
    cdef const int64_t *iz = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> tables[0])
    cdef const int64_t *iy = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> tables[1])
    cdef const int64_t *ix = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> tables[2])
    cdef const void *c_src = cnp.PyArray_DATA(<cnp.ndarray> src)
    cdef void *c_out = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int64_t size = src.dtype.itemsize
    cdef int64_t channels = src.shape[0]
    cdef int status
    with nogil:
        status = emf_rescale_nearest(c_src, strides, size, channels, iz, iy, ix, extent, c_out)
    check_status(status, "rescale_nearest")
    return out


def rescale_linear(src, tables, out):
    """Trilinear interpolation of ``src`` into the float32 ``out`` without the GIL.

    ``tables`` holds per axis (z, y, x) a triple ``(lo, hi, w)``: output position i along that axis blends source
    positions ``lo[i]`` and ``hi[i]`` as ``(1 - w[i]) * src[lo[i]] + w[i] * src[hi[i]]``, computed in float64
    and rounded once to float32. ``src`` (c, z, y, x) of any strides and a dtype of :data:`LINEAR_DTYPES`;
    ``out`` C-contiguous ``(c, len(z table), len(y table), len(x table))``.
    """
    src = _source(src)
    cdef emf_dtype c_dtype = dtype_code(src.dtype, "src", LINEAR_DTYPES)
    out = writeable_array(out, "out")
    if len(tables) != 3:
        raise ValueError(f"tables must hold one (lo, hi, w) triple per axis, got {len(tables)}")
    lengths = [len(table[0]) for table in tables]
    shape = (src.shape[0],) + tuple(lengths)
    if out.dtype != np.float32 or out.shape != shape:
        raise ValueError(f"out must be a float32 array of shape {shape}, got {out.dtype} {out.shape}")
    checked = []
    for a, (lo, hi, w) in enumerate(tables):
        name = "zyx"[a]
        checked += [_index(lo, src.shape[1 + a], lengths[a], f"lo_{name}"),
                    _index(hi, src.shape[1 + a], lengths[a], f"hi_{name}"),
                    _weights(w, lengths[a], f"w_{name}")]
    if out.size == 0:
        return out
    cdef int64_t strides[4]
    cdef int64_t extent[3]
    _walk(src, shape, strides, extent)
    cdef const int64_t *lz = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> checked[0])
    cdef const int64_t *hz = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> checked[1])
    cdef const double *wz = <const double *> cnp.PyArray_DATA(<cnp.ndarray> checked[2])
    cdef const int64_t *ly = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> checked[3])
    cdef const int64_t *hy = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> checked[4])
    cdef const double *wy = <const double *> cnp.PyArray_DATA(<cnp.ndarray> checked[5])
    cdef const int64_t *lx = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> checked[6])
    cdef const int64_t *hx = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> checked[7])
    cdef const double *wx = <const double *> cnp.PyArray_DATA(<cnp.ndarray> checked[8])
    cdef const void *c_src = cnp.PyArray_DATA(<cnp.ndarray> src)
    cdef float *c_out = <float *> cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int64_t channels = src.shape[0]
    cdef int status
    with nogil:
        status = emf_rescale_linear(c_src, c_dtype, strides, channels, lz, hz, wz, ly, hy, wy, lx, hx, wx, extent,
                                    c_out)
    check_status(status, "rescale_linear")
    return out
