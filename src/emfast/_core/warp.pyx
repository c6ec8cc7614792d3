# cython: language_level=3
"""Thin typed wrappers around the warp kernels in csrc/warp.cpp (contract in csrc/warp.h).

Each function checks its arguments (types, dtypes, shapes, layouts, value ranges) and calls its kernel once per
batch with the GIL released; the kernels assume valid input, all checking is here. The user-facing functions,
with the defaults and the documentation, are in :mod:`emfast.augment._resample`.
"""
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

import os

import numpy as np

cimport numpy as cnp
from emfast._core.common cimport check_status, dtype_code, emf_dtype, plain_array, writeable_array

from emfast._core.common import FLOAT_DTYPES, RAW_DTYPES

cnp.import_array()


cdef extern from "warp.h" nogil:
    ctypedef struct emf_warp_example:
        const char *data
        int64_t shape[4]
        int64_t strides[4]
        double centre[3]
        double matrix[9]
        const float *grid
        float scale
        float shift

    ctypedef struct emf_warp_grid:
        int64_t shape[3]
        double spacing[3]
        double origin[3]

    int emf_warp_convert(const emf_warp_example *examples, int64_t count, const int64_t *shape,
                         const emf_warp_grid *grid, emf_dtype src_dtype, emf_dtype out_dtype, float fill,
                         void *out, uint8_t *valid, int allow_gather)
    int emf_warp_copy(const emf_warp_example *examples, int64_t count, const int64_t *shape,
                      const emf_warp_grid *grid, int itemsize, const void *fill, void *out, uint8_t *valid,
                      int allow_gather)
    int emf_warp_coordinates(const emf_warp_example *examples, int64_t count, const int64_t *shape,
                             const emf_warp_grid *grid, double *out)
    void emf_warp_allow_avx2(int allowed)
    int emf_warp_uses_avx2()


#: Value limits that keep every float-to-integer conversion in the kernels in range (see csrc/warp.h).
MAX_CENTRE = 2.0 ** 40
MAX_MATRIX = 1024.0
MAX_DISPLACEMENT = 2.0 ** 20


cdef object _finite(values, dtype, tuple shape, str name, double limit):
    """``values`` as a C-contiguous array of ``dtype`` and ``shape``, finite and within [-limit, limit]."""
    try:
        array = np.ascontiguousarray(values, dtype=dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array of numbers, got {type(values).__name__}") from None
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    if array.size and np.max(np.abs(array)) > limit:
        raise ValueError(f"{name} must lie within [-{limit:g}, {limit:g}], got a value of "
                         f"{np.max(np.abs(array)):g}")
    return array


cdef tuple _plain_sources(sources, Py_ssize_t channels):
    """Base-class views of the 4-D sources: an ndarray subclass cannot misreport its geometry, and the tuple keeps
    every source alive while the kernel runs without the GIL."""
    if isinstance(sources, np.ndarray) or not isinstance(sources, (list, tuple)):
        raise TypeError(f"sources must be a list of B arrays (one per example), got {type(sources).__name__}")
    plain = []
    for n, src in enumerate(sources):
        src = plain_array(src, f"source {n}")
        if src.ndim != 4 or src.shape[0] != channels or 0 in src.shape:
            raise ValueError(f"source {n} must be a non-empty 4-D array (C, Z, Y, X) with C={channels}, "
                             f"got shape {src.shape}")
        plain.append(src)
    return tuple(plain)


cdef object _plain_out(out, str name, dtypes):
    """A base-class view of the output after checking its type, dtype and layout."""
    out = writeable_array(out, name)
    if out.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {out.dtype}; supported: {', '.join(str(d) for d in dtypes)}")
    if out.ndim != 5:
        raise ValueError(f"{name} must be a writeable C-contiguous array of shape (B, C, Z, Y, X), "
                         f"got shape {out.shape}")
    return out


cdef object _plain_valid(valid, tuple shape, tuple sources, out):
    if valid is None:
        return None
    valid = _plain_out(valid, "valid", (np.dtype(np.uint8),))
    expected = (shape[0], 1) + shape[2:]
    if valid.shape != expected:
        raise ValueError(f"valid must have shape {expected}, got {valid.shape}")
    if np.may_share_memory(valid, out) or any(np.may_share_memory(valid, src) for src in sources):
        raise ValueError("valid must not overlap out or the sources")
    return valid


cdef class _Batch:
    """The kernel's view of one batch: example records, grid geometry, and the arrays they point into."""
    cdef emf_warp_example *examples
    cdef emf_warp_grid grid_desc
    cdef bint has_grid
    cdef Py_ssize_t count
    cdef object keep

    def __cinit__(self):
        self.examples = NULL

    def __dealloc__(self):
        free(self.examples)

    cdef void setup(self, tuple sources, Py_ssize_t count, tuple shape, centres, matrices, grid, spacing,
                    origin) except *:
        """Check the geometry of ``count`` examples with output extent ``shape`` (Z, Y, X) and fill the records."""
        cdef Py_ssize_t n, a
        cdef emf_warp_example *ex
        cdef double[:, ::1] c_centres
        cdef double[:, :, ::1] c_matrices
        self.count = count
        centres = _finite(centres, np.float64, (count, 3), "centres", MAX_CENTRE)
        matrices = _finite(matrices, np.float64, (count, 3, 3), "matrices", MAX_MATRIX)
        self.has_grid = grid is not None
        if self.has_grid:
            if not isinstance(grid, np.ndarray) or grid.dtype != np.float32:
                raise TypeError(f"grid must be a float32 array, got "
                                f"{getattr(grid, 'dtype', type(grid).__name__)}")
            if grid.ndim != 5 or grid.shape[0] != count or grid.shape[1] != 3 or 0 in grid.shape:
                raise ValueError(f"grid must have shape ({count}, 3, gz, gy, gx) with gz, gy, gx >= 1, "
                                 f"got {grid.shape}")
            grid = _finite(grid, np.float32, grid.shape, "grid", MAX_DISPLACEMENT)
            spacing = _finite(spacing, np.float64, (3,), "grid_spacing", 1e9)
            if np.any(spacing <= 0):
                raise ValueError(f"grid_spacing must be > 0 along each axis, got {spacing.tolist()}")
            origin = _finite(origin, np.float64, (3,), "grid_origin", 1e9)
            for a in range(3):
                self.grid_desc.shape[a] = grid.shape[2 + a]
                self.grid_desc.spacing[a] = spacing[a]
                self.grid_desc.origin[a] = origin[a]
        self.keep = (sources, centres, matrices, grid)
        self.examples = <emf_warp_example *> malloc(max(count, 1) * sizeof(emf_warp_example))
        if self.examples == NULL:
            raise MemoryError("cannot allocate the example table")
        cdef Py_ssize_t cells = 3 * grid.shape[2] * grid.shape[3] * grid.shape[4] if self.has_grid else 0
        c_centres = centres
        c_matrices = matrices
        for n in range(count):
            ex = &self.examples[n]
            if sources:
                src = sources[n]
                ex.data = <const char *> cnp.PyArray_DATA(<cnp.ndarray> src)
                for a in range(4):
                    ex.shape[a] = src.shape[a]
                    ex.strides[a] = src.strides[a]
            else:
                ex.data = NULL
            for a in range(3):
                ex.centre[a] = c_centres[n, a]
            for a in range(9):
                ex.matrix[a] = c_matrices[n, a // 3, a % 3]
            ex.grid = <const float *> cnp.PyArray_DATA(<cnp.ndarray> grid) + n * cells if self.has_grid else NULL
            ex.scale = 1.0
            ex.shift = 0.0


cdef _Batch _batch(sources, out, centres, matrices, grid, spacing, origin):
    if out.shape[0] != len(sources):
        raise ValueError(f"out holds {out.shape[0]} examples but {len(sources)} sources were given")
    for n, src in enumerate(sources):
        if np.may_share_memory(out, src):
            raise ValueError(f"out must not overlap source {n}")
    batch = _Batch()
    batch.setup(sources, len(sources), out.shape[2:], centres, matrices, grid, spacing, origin)
    return batch


def warp_convert(sources, centres, matrices, grid, spacing, origin, scale, shift, fill, out, valid=None,
                 bint gather_path=True):
    """Raw: trilinear warp of B sources into ``out`` (B, C, Z, Y, X) float32/float16 as ``value * scale + shift``.

    See :func:`emfast.augment._resample.warp_raw`. ``gather_path=False`` makes every example take the general path (for tests
    and benchmarks: the result is the same for finite sources).
    """
    out = _plain_out(out, "out", FLOAT_DTYPES)
    sources = _plain_sources(sources, out.shape[1])
    cdef Py_ssize_t count = len(sources)
    valid = _plain_valid(valid, out.shape, sources, out)
    cdef _Batch batch = _batch(sources, out, centres, matrices, grid, spacing, origin)
    if count == 0:
        return out
    src_dtype = sources[0].dtype
    if any(s.dtype != src_dtype for s in sources):
        raise TypeError(f"all sources must share a dtype, got {sorted({str(s.dtype) for s in sources})}")
    cdef emf_dtype c_src = dtype_code(src_dtype, "raw sources", RAW_DTYPES)
    scale = _finite(scale, np.float32, (count,), "scale", np.inf)
    shift = _finite(shift, np.float32, (count,), "shift", np.inf)
    try:
        fill = float(fill)
    except (TypeError, ValueError):
        raise TypeError(f"fill must be a number, got {fill!r}") from None
    cdef Py_ssize_t n
    for n in range(count):
        batch.examples[n].scale = scale[n]
        batch.examples[n].shift = shift[n]
    cdef int64_t c_shape[4]
    for n in range(4):
        c_shape[n] = out.shape[1 + n]
    cdef emf_dtype c_out = dtype_code(out.dtype, "out", FLOAT_DTYPES)
    cdef float c_fill = fill
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef uint8_t *c_valid = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> valid) if valid is not None else NULL
    cdef const emf_warp_grid *c_grid = &batch.grid_desc if batch.has_grid else NULL
    cdef int status
    with nogil:
        status = emf_warp_convert(batch.examples, count, c_shape, c_grid, c_src, c_out, c_fill, c_data, c_valid,
                                  gather_path)
    check_status(status, "warp_convert")
    return out


def warp_copy(sources, centres, matrices, grid, spacing, origin, fill, out, valid=None, bint gather_path=True):
    """Labels: nearest-voxel warp of B sources into ``out`` (B, C, Z, Y, X), bit for bit.

    See :func:`emfast.augment._resample.warp_labels`; ``gather_path`` as in :func:`warp_convert`.
    """
    out = _plain_out(out, "out", [np.dtype(c) for c in "bBhHiIlLqQ"])
    sources = _plain_sources(sources, out.shape[1])
    cdef Py_ssize_t count = len(sources)
    valid = _plain_valid(valid, out.shape, sources, out)
    cdef _Batch batch = _batch(sources, out, centres, matrices, grid, spacing, origin)
    if count == 0:
        return out
    if any(s.dtype != out.dtype for s in sources):
        raise TypeError(f"labels need sources of the output dtype {out.dtype}, "
                        f"got {sorted({str(s.dtype) for s in sources})}")
    if isinstance(fill, (bool, np.bool_)) or not isinstance(fill, (int, np.integer)):
        raise TypeError(f"fill must be an integer, got {fill!r}")
    info = np.iinfo(out.dtype)
    if not info.min <= int(fill) <= info.max:
        raise ValueError(f"fill {fill} cannot be stored in {out.dtype} labels (range [{info.min}, {info.max}])")
    fill_value = np.array(int(fill), dtype=out.dtype)
    cdef int64_t c_shape[4]
    cdef Py_ssize_t n
    for n in range(4):
        c_shape[n] = out.shape[1 + n]
    cdef int itemsize = out.itemsize
    cdef const void *c_fill = cnp.PyArray_DATA(<cnp.ndarray> fill_value)
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef uint8_t *c_valid = <uint8_t *> cnp.PyArray_DATA(<cnp.ndarray> valid) if valid is not None else NULL
    cdef const emf_warp_grid *c_grid = &batch.grid_desc if batch.has_grid else NULL
    cdef int status
    with nogil:
        status = emf_warp_copy(batch.examples, count, c_shape, c_grid, itemsize, c_fill, c_data, c_valid,
                               gather_path)
    check_status(status, "warp_copy")
    return out


def warp_coordinates(shape, centres, matrices, grid, spacing, origin):
    """The source coordinates (B, 3, Z, Y, X) float64 the samplers use for an output of extent ``shape``."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be three extents >= 1 (Z, Y, X), got {shape}")
    cdef Py_ssize_t count = np.shape(centres)[0] if np.ndim(centres) == 2 else -1
    if count < 0:
        raise ValueError(f"centres must have shape (B, 3), got {np.shape(centres)}")
    cdef _Batch batch = _Batch()
    batch.setup((), count, shape, centres, matrices, grid, spacing, origin)
    result = np.empty((count, 3) + shape, dtype=np.float64)
    cdef int64_t c_shape[3]
    for n in range(3):
        c_shape[n] = shape[n]
    cdef double *c_data = <double *> cnp.PyArray_DATA(<cnp.ndarray> result)
    cdef const emf_warp_grid *c_grid = &batch.grid_desc if batch.has_grid else NULL
    cdef int status
    with nogil:
        status = emf_warp_coordinates(batch.examples, count, c_shape, c_grid, c_data)
    check_status(status, "warp_coordinates")
    return result


def uses_avx2():
    """Whether the warp samplers run their AVX2 path here (compiled in, supported by this CPU, and the
    environment variable ``EMFAST_NO_AVX2`` unset when this module was imported)."""
    return bool(emf_warp_uses_avx2())


# Read once, here: the kernels never look at the environment (a lookup per call cost time and could change the
# path in the middle of a run).
emf_warp_allow_avx2(0 if "EMFAST_NO_AVX2" in os.environ else 1)
