# cython: language_level=3
"""Thin typed wrappers around the C++ kernels in csrc/.

Each public function checks its arguments (types, dtypes, shapes, bounds), translates them into plain pointers and
byte steps, and calls the kernel once per batch with the GIL released. Kernels assume valid input; all checking is
here.
"""
from libc.stdint cimport int64_t, uint16_t, uint64_t
from libc.stdlib cimport free, malloc

import numpy as np

cimport numpy as cnp

cnp.import_array()


cdef extern from "gather.h" nogil:
    ctypedef enum emf_dtype:
        EMF_UINT8
        EMF_UINT16
        EMF_UINT32
        EMF_UINT64
        EMF_FLOAT32
        EMF_FLOAT16

    ctypedef struct emf_window:
        const char *origin
        int64_t steps[4]
        float scale
        float shift

    int emf_gather_convert(const emf_window *windows, int64_t count, const int64_t *shape,
                           emf_dtype src_dtype, emf_dtype out_dtype, void *out)
    int emf_gather_copy(const emf_window *windows, int64_t count, const int64_t *shape, int itemsize, void *out)
    uint16_t emf_float_to_half(float value)


_CONVERT_SOURCES = {np.dtype(np.uint8): EMF_UINT8, np.dtype(np.uint16): EMF_UINT16,
                    np.dtype(np.float32): EMF_FLOAT32}
_CONVERT_OUTPUTS = {np.dtype(np.float32): EMF_FLOAT32, np.dtype(np.float16): EMF_FLOAT16}


cdef emf_window *_windows(tuple sources, corners, perms, flips, tuple out_shape) except NULL:
    """Validate B windows and describe each as an origin pointer plus signed byte steps (caller frees)."""
    cdef Py_ssize_t count = len(sources)
    cdef Py_ssize_t n, j, axis
    cdef int64_t extent[3]
    cdef int64_t corner, stride
    cdef const char *origin
    corners = np.asarray(corners, dtype=np.int64)
    perms = np.asarray(perms, dtype=np.int64)
    flips = np.asarray(flips, dtype=bool)
    for name, arr in (("corners", corners), ("perms", perms), ("flips", flips)):
        if arr.shape != (count, 3):
            raise ValueError(f"{name} must have shape ({count}, 3), got {arr.shape}")
    cdef emf_window *windows = <emf_window *> malloc(max(count, 1) * sizeof(emf_window))
    if windows == NULL:
        raise MemoryError("cannot allocate the window table")
    try:
        for n in range(count):
            src = sources[n]
            if src.ndim != 4 or src.shape[0] != out_shape[0]:
                raise ValueError(f"source {n} must be 4-D (C, Z, Y, X) with C={out_shape[0]}, "
                                 f"got shape {src.shape}")
            if sorted(perms[n]) != [0, 1, 2]:
                raise ValueError(f"perms[{n}] = {perms[n].tolist()} is not a permutation of (0, 1, 2)")
            for j in range(3):
                extent[perms[n, j]] = out_shape[1 + j]
            origin = <const char *> cnp.PyArray_DATA(<cnp.ndarray> src)
            windows[n].steps[0] = src.strides[0]
            for axis in range(3):
                corner = corners[n, axis]
                if corner < 0 or corner > src.shape[1 + axis] - extent[axis]:  # no overflow for huge corners
                    raise IndexError(
                        f"window {n} spans [{corner}, {corner + extent[axis]}) along axis {'zyx'[axis]}, "
                        f"outside the source extent {src.shape[1 + axis]}")
                origin += corner * src.strides[1 + axis]
            for j in range(3):
                axis = perms[n, j]
                stride = src.strides[1 + axis]
                if flips[n, axis]:
                    origin += stride * (extent[axis] - 1)
                    stride = -stride
                windows[n].steps[1 + j] = stride
            windows[n].origin = origin
    except BaseException:
        free(windows)
        raise
    return windows


cdef tuple _plain_sources(sources):
    """Base-class views of the sources: an ndarray subclass cannot misreport shape, strides or dtype, and the
    tuple keeps every source alive while the kernel runs without the GIL."""
    plain = []
    for n, src in enumerate(sources):
        if not isinstance(src, np.ndarray):
            raise TypeError(f"source {n} is a {type(src).__name__}, not a NumPy array")
        if src.dtype.hasobject or not src.dtype.isnative:
            raise TypeError(f"source {n} has dtype {src.dtype}; the kernels read native-endian numbers only")
        plain.append(np.asarray(src))
    return tuple(plain)


cdef object _plain_out(out, Py_ssize_t count):
    """A base-class view of ``out`` after checking it (see _plain_sources)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a NumPy array, got {type(out).__name__}")
    out = np.asarray(out)
    if out.ndim != 5 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous ndarray of shape (B, C, Z, Y, X)")
    if out.dtype.hasobject or not out.dtype.isnative:
        raise TypeError(f"out has dtype {out.dtype}; the kernels write native-endian numbers only")
    if out.shape[0] != count:
        raise ValueError(f"out holds {out.shape[0]} windows but {count} sources were given")
    return out


def gather_convert(sources, corners, perms, flips, scale, shift, out):
    """Crop, transform and convert B windows into ``out`` (B, C, Z, Y, X) in one pass, without the GIL.

    ``out[n] = transpose(flip(src_n[:, window_n], flips[n]), perms[n]).astype(float32) * scale[n] + shift[n]``,
    cast to ``out.dtype`` (float32 or float16). The window of example n starts at ``corners[n]`` (z, y, x) in
    source axes; its extent along source axis ``perms[n][j]`` is ``out.shape[2 + j]``. Sources (4-D, any strides)
    share one dtype: uint8, uint16 or float32.
    """
    sources = _plain_sources(sources)
    cdef Py_ssize_t count = len(sources)
    result = out
    out = _plain_out(out, count)
    shape = out.shape[1:]
    if count == 0:
        return result
    src_dtype = sources[0].dtype
    if any(s.dtype != src_dtype for s in sources):
        raise TypeError("all sources of one gather must share a dtype")
    if src_dtype not in _CONVERT_SOURCES:
        raise TypeError(f"cannot convert from {src_dtype}; supported: uint8, uint16, float32")
    if out.dtype not in _CONVERT_OUTPUTS:
        raise TypeError(f"cannot convert to {out.dtype}; supported: float32, float16")
    scale = np.asarray(scale, dtype=np.float32)
    shift = np.asarray(shift, dtype=np.float32)
    if scale.shape != (count,) or shift.shape != (count,):
        raise ValueError(f"scale and shift must have shape ({count},)")
    cdef int64_t c_shape[4]
    for j in range(4):
        c_shape[j] = shape[j]
    cdef emf_dtype c_src = _CONVERT_SOURCES[src_dtype]
    cdef emf_dtype c_out = _CONVERT_OUTPUTS[out.dtype]
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef emf_window *windows = _windows(sources, corners, perms, flips, shape)
    cdef Py_ssize_t n
    cdef int status
    for n in range(count):
        windows[n].scale = scale[n]
        windows[n].shift = shift[n]
    with nogil:
        status = emf_gather_convert(windows, count, c_shape, c_src, c_out, c_data)
    free(windows)
    if status != 0:
        raise RuntimeError(f"gather_convert kernel failed with status {status}")
    return result


def gather_copy(sources, corners, perms, flips, out):
    """Crop and transform B windows into ``out`` (B, C, Z, Y, X) bit for bit, without the GIL.

    Same geometry as :func:`gather_convert`; ``out`` must have the sources' dtype (any of 1, 2, 4 or 8 bytes,
    e.g. labels of uint32, uint64 or int64, or uint8 masks).
    """
    sources = _plain_sources(sources)
    cdef Py_ssize_t count = len(sources)
    result = out
    out = _plain_out(out, count)
    shape = out.shape[1:]
    if count == 0:
        return result
    if any(s.dtype != out.dtype for s in sources):
        raise TypeError(f"gather_copy needs sources of the output dtype {out.dtype}, "
                        f"got {sorted({str(s.dtype) for s in sources})}")
    if out.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"cannot copy elements of {out.itemsize} bytes")
    cdef int64_t c_shape[4]
    for j in range(4):
        c_shape[j] = shape[j]
    cdef int itemsize = out.itemsize
    cdef void *c_data = cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef emf_window *windows = _windows(sources, corners, perms, flips, shape)
    cdef int status
    with nogil:
        status = emf_gather_copy(windows, count, c_shape, itemsize, c_data)
    free(windows)
    if status != 0:
        raise RuntimeError(f"gather_copy kernel failed with status {status}")
    return result


def float_to_half(values):
    """Convert float32 values to float16 with the kernels' rounding (for testing against NumPy)."""
    cdef float[::1] src = np.ascontiguousarray(values, dtype=np.float32).ravel()
    result = np.empty(src.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] dst = result
    cdef Py_ssize_t i
    with nogil:
        for i in range(src.shape[0]):
            dst[i] = emf_float_to_half(src[i])
    return result.view(np.float16).reshape(np.shape(values))


cdef extern from "philox.h" nogil:
    void emf_philox4x64(const uint64_t *key, const uint64_t *counter, uint64_t *out)
    void emf_uniform_batch(const uint64_t *key, uint64_t batch, uint64_t stream_word, int64_t examples,
                           int64_t draws, double *out)


def philox4x64(key, counter):
    """One Philox4x64-10 block: four uint64 from a 2-word key and a 4-word counter (for testing)."""
    cdef uint64_t c_key[2]
    cdef uint64_t c_counter[4]
    cdef uint64_t c_out[4]
    for i in range(2):
        c_key[i] = key[i]
    for i in range(4):
        c_counter[i] = counter[i]
    emf_philox4x64(c_key, c_counter, c_out)
    return np.array([c_out[0], c_out[1], c_out[2], c_out[3]], dtype=np.uint64)


def uniform_batch(uint64_t key0, uint64_t key1, uint64_t batch, uint64_t stream_word, Py_ssize_t examples,
                  Py_ssize_t draws):
    """Uniform doubles in [0, 1) of shape (examples, draws); see ``emf_uniform_batch`` in csrc/philox.h."""
    if examples < 0 or draws < 0:
        raise ValueError("examples and draws must be >= 0")
    result = np.empty((examples, draws), dtype=np.float64)
    cdef double[:, ::1] view = result
    cdef uint64_t c_key[2]
    c_key[0] = key0
    c_key[1] = key1
    if examples and draws:
        with nogil:
            emf_uniform_batch(c_key, batch, stream_word, examples, draws, &view[0, 0])
    return result
