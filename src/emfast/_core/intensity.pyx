# cython: language_level=3
"""Thin typed wrappers around the pixel-wise augmentation kernels in csrc/intensity.cpp.

Raw kernels work in place on a C-contiguous, writeable float32 or float16 array, seen as ``raw.size // size``
blocks of ``size`` consecutive elements; ``blocks`` lists the blocks to change (distinct, in range) and each
parameter array has one value per listed block. Plane kernels work on the (height, width) planes of any
C-contiguous array whose last two axes are (height, width). Each function checks its arguments, then calls its
kernel once with the GIL released; kernels assume valid input. The user-facing augmentations are in
:mod:`emfast.augment._intensity` and :mod:`emfast.augment._defects`.
"""
from libc.stdint cimport int64_t, uint64_t

import numpy as np

cimport numpy as cnp
from emfast._core.common cimport check_aligned, check_reach, check_status, dtype_code, emf_dtype, writeable_array

from emfast._core.common import FLOAT_DTYPES

cnp.import_array()


cdef extern from "intensity.h" nogil:
    ctypedef struct emf_blocks:
        void *data
        emf_dtype dtype
        int64_t size
        const int64_t *index
        int64_t count

    ctypedef struct emf_source:
        const void *data
        int is_uint8
        int64_t steps[2]
        float scale
        float shift

    ctypedef struct emf_planes:
        void *data
        int itemsize
        int64_t height
        int64_t width
        const int64_t *index
        int64_t count

    void emf_gamma(const emf_blocks *blocks, const float *gamma)
    void emf_contrast(const emf_blocks *blocks, const float *factor)
    void emf_noise(const emf_blocks *blocks, const float *sigma, const uint64_t *keys)
    int emf_blur(const emf_blocks *blocks, const int64_t *shape, const double *sigma, int per_section,
                 double truncate)
    void emf_blend(const emf_blocks *blocks, int64_t width, const emf_source *source, const int64_t *origin,
                   const float *alpha)
    void emf_fill_planes(const emf_planes *planes, uint64_t fill)
    void emf_shift_planes(const emf_planes *planes, const int64_t *shift, uint64_t fill)
    void emf_section_uniforms(const uint64_t *keys, int64_t count, int64_t sections, int64_t draws, uint64_t tag,
                              double *out)
    uint64_t EMF_NOISE_TAG


#: Key word 1 of the noise kernel's Philox stream.
NOISE_TAG = EMF_NOISE_TAG
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


cdef object _raw(raw):
    raw = writeable_array(raw, "raw")
    dtype_code(raw.dtype, "raw", FLOAT_DTYPES)
    return raw


cdef object _index(blocks, Py_ssize_t available, name):
    """``blocks`` as a contiguous int64 array of distinct indices in [0, available)."""
    index = np.ascontiguousarray(blocks, dtype=np.int64)
    if index.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of indices, got shape {index.shape}")
    if index.size and (index.min() < 0 or index.max() >= available):
        raise ValueError(f"{name} must lie in [0, {available}), got {index.min()}..{index.max()}")
    if np.unique(index).size != index.size:
        raise ValueError(f"{name} must not repeat an index")
    return index


cdef object _values(values, dtype, Py_ssize_t count, name):
    """One finite parameter per listed block, as a contiguous array of ``dtype``."""
    array = np.ascontiguousarray(values, dtype=dtype)
    if array.shape != (count,):
        raise ValueError(f"{name} must hold one value per block ({count}), got shape {array.shape}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValueError(f"{name} must be finite")
    return array


cdef object _blocks(raw, blocks, Py_ssize_t size, emf_blocks *desc):
    """Fill ``desc`` for the blocks of ``size`` elements of ``raw``; returns the index array (keep it alive)."""
    if size < 1 or raw.size % size:
        raise ValueError(f"block size {size} does not divide the {raw.size} elements of raw")
    index = _index(blocks, raw.size // size, "blocks")
    desc.data = cnp.PyArray_DATA(<cnp.ndarray> raw)
    desc.dtype = dtype_code(raw.dtype, "raw", FLOAT_DTYPES)
    desc.size = size
    desc.index = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> index)
    desc.count = index.size
    return index


def gamma(raw, blocks, Py_ssize_t size, gammas):
    """Sign-safe gamma in place: ``x -> sign(x) * |x| ** gammas[k]`` on block ``blocks[k]`` (float32 ``powf``)."""
    raw = _raw(raw)
    cdef emf_blocks desc
    index = _blocks(raw, blocks, size, &desc)
    values = _values(gammas, np.float32, index.size, "gammas")
    cdef const float *c_values = <const float *> cnp.PyArray_DATA(<cnp.ndarray> values)
    with nogil:
        emf_gamma(&desc, c_values)
    return raw


def contrast(raw, blocks, Py_ssize_t size, factors):
    """Contrast around the block mean in place: ``x -> (x - m) * factors[k] + m`` on block ``blocks[k]``.

    ``m`` is the block mean in float32: four interleaved lanes (element offsets modulo 4) summed in order in
    float64, combined as (s0 + s1) + (s2 + s3), divided by ``size``, rounded to float32.
    """
    raw = _raw(raw)
    cdef emf_blocks desc
    index = _blocks(raw, blocks, size, &desc)
    values = _values(factors, np.float32, index.size, "factors")
    cdef const float *c_values = <const float *> cnp.PyArray_DATA(<cnp.ndarray> values)
    with nogil:
        emf_contrast(&desc, c_values)
    return raw


def noise(raw, blocks, Py_ssize_t size, sigmas, keys):
    """Additive Gaussian noise in place: ``x -> x + sigmas[k] * g`` on block ``blocks[k]``, ``g`` standard
    normal draws that depend only on ``keys[k]`` (uint64) and the element's offset in its block."""
    raw = _raw(raw)
    cdef emf_blocks desc
    index = _blocks(raw, blocks, size, &desc)
    values = _values(sigmas, np.float32, index.size, "sigmas")
    if (values < 0).any():
        raise ValueError("sigmas must be >= 0")
    key_array = _values(keys, np.uint64, index.size, "keys")
    cdef const float *c_values = <const float *> cnp.PyArray_DATA(<cnp.ndarray> values)
    cdef const uint64_t *c_keys = <const uint64_t *> cnp.PyArray_DATA(<cnp.ndarray> key_array)
    with nogil:
        emf_noise(&desc, c_values, c_keys)
    return raw


def blur(raw, blocks, shape, sigmas, bint per_section, double truncate=3.0):
    """Gaussian blur in place of the (z, y, x) = ``shape`` volumes ``blocks`` of raw, like
    ``scipy.ndimage.gaussian_filter(volume, (0 if per_section else s, s, s), mode="reflect",
    truncate=truncate)`` with ``s = sigmas[k]``, up to float32 rounding."""
    raw = _raw(raw)
    dims = tuple(int(s) for s in shape)
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"shape must be three positive extents (z, y, x), got {shape!r}")
    if not 0 < truncate < float("inf"):
        raise ValueError(f"truncate must be finite and > 0, got {truncate}")
    cdef emf_blocks desc
    index = _blocks(raw, blocks, dims[0] * dims[1] * dims[2], &desc)
    values = _values(sigmas, np.float64, index.size, "sigmas")
    if not ((values >= 0) & (values < float("inf"))).all():
        raise ValueError("sigmas must be finite and >= 0")
    if values.size:
        check_reach(truncate * float(values.max()) + 0.5, float(values.max()), "blur")
    cdef int64_t c_shape[3]
    for axis in range(3):
        c_shape[axis] = dims[axis]
    cdef const double *c_values = <const double *> cnp.PyArray_DATA(<cnp.ndarray> values)
    cdef int status
    with nogil:
        status = emf_blur(&desc, c_shape, c_values, per_section, truncate)
    check_status(status, "blur")
    return raw


def blend(raw, blocks, shape, source, origins, alphas, double scale, double shift):
    """Blend sections of ``source`` into the (height, width) = ``shape`` planes ``blocks`` of raw, in place:
    ``x -> x * (1 - a) + (float32(s) * scale + shift) * a`` in float32, with ``a = alphas[k]`` and ``s`` the
    (height, width) box of the 3-D uint8 or float32 array ``source`` at (z, y, x) = ``origins[k]``."""
    raw = _raw(raw)
    height, width = (int(s) for s in shape)
    if height < 1 or width < 1:
        raise ValueError(f"shape must be two positive extents (height, width), got {shape!r}")
    cdef emf_blocks desc
    index = _blocks(raw, blocks, height * width, &desc)
    if not isinstance(source, np.ndarray) or source.ndim != 3:
        raise TypeError("source must be a 3-D NumPy array")
    if source.dtype not in (np.dtype(np.uint8), np.dtype(np.float32)) or not source.dtype.isnative:
        raise TypeError(f"source has dtype {source.dtype}; supported: uint8, float32")
    check_aligned(source, "source")
    corners = np.ascontiguousarray(origins, dtype=np.int64)
    if corners.shape != (index.size, 3):
        raise ValueError(f"origins must be one (z, y, x) per block, shape ({index.size}, 3), got {corners.shape}")
    limits = np.array([source.shape[0] - 1, source.shape[1] - height, source.shape[2] - width])
    if corners.size and ((corners < 0).any() or (corners > limits).any()):
        raise ValueError(f"origins must keep each ({height}, {width}) box inside the source of shape "
                         f"{source.shape}")
    values = _values(alphas, np.float32, index.size, "alphas")
    steps = [s // source.itemsize for s in source.strides]
    offsets = np.ascontiguousarray(corners @ np.array(steps, dtype=np.int64), dtype=np.int64)
    cdef emf_source src
    src.data = cnp.PyArray_DATA(<cnp.ndarray> source)
    src.is_uint8 = source.dtype == np.uint8
    src.steps[0] = steps[1]
    src.steps[1] = steps[2]
    src.scale = scale
    src.shift = shift
    cdef const int64_t *c_offsets = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> offsets)
    cdef const float *c_values = <const float *> cnp.PyArray_DATA(<cnp.ndarray> values)
    cdef int64_t c_width = width
    with nogil:
        emf_blend(&desc, c_width, &src, c_offsets, c_values)
    return raw


cdef object _planes(array, planes, name, emf_planes *desc):
    """Fill ``desc`` for the (height, width) planes of ``array`` (its last two axes) listed in ``planes``."""
    array = writeable_array(array, name)
    if array.ndim < 2 or array.size == 0:
        raise ValueError(f"{name} must have at least two axes and no empty one, got shape {array.shape}")
    if array.itemsize not in _UNSIGNED:
        raise TypeError(f"{name} has dtype {array.dtype}; elements of 1, 2, 4 or 8 bytes are supported")
    desc.height = array.shape[array.ndim - 2]
    desc.width = array.shape[array.ndim - 1]
    index = _index(planes, array.size // (desc.height * desc.width), "planes")
    desc.data = cnp.PyArray_DATA(<cnp.ndarray> array)
    desc.itemsize = array.itemsize
    desc.index = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> index)
    desc.count = index.size
    return index


cdef uint64_t _fill_bits(array, fill, name) except? 0:
    """The bits of ``fill`` as an element of ``array``; it must be representable."""
    try:
        value = np.array(fill, dtype=array.dtype)
    except (OverflowError, ValueError, TypeError):
        raise ValueError(f"fill {fill!r} cannot be stored in {name} of dtype {array.dtype}") from None
    if value.ndim != 0 or (array.dtype.kind in "iu" and value != fill):
        raise ValueError(f"fill {fill!r} cannot be stored in {name} of dtype {array.dtype}")
    return int(value.view(_UNSIGNED[array.itemsize]))


def fill_planes(array, planes, fill, name="array"):
    """Set every element of the listed (height, width) planes of ``array`` (its last two axes) to ``fill``."""
    array = writeable_array(array, name)
    cdef emf_planes desc
    index = _planes(array, planes, name, &desc)
    cdef uint64_t bits = _fill_bits(array, fill, name)
    with nogil:
        emf_fill_planes(&desc, bits)
    return array


def shift_planes(array, planes, shifts, fill, name="array"):
    """Move plane ``planes[k]`` of ``array`` by ``shifts[k]`` = (dy, dx): ``new[y, x] = old[y - dy, x - dx]``
    where that lies inside the plane, else ``fill``."""
    array = writeable_array(array, name)
    cdef emf_planes desc
    index = _planes(array, planes, name, &desc)
    moves = np.ascontiguousarray(shifts, dtype=np.int64)
    if moves.shape != (index.size, 2):
        raise ValueError(f"shifts must be one (dy, dx) per plane, shape ({index.size}, 2), got {moves.shape}")
    # a move of the plane's extent or more empties it; clamping changes nothing and keeps arithmetic small
    limit = np.array([desc.height, desc.width])
    moves = np.ascontiguousarray(np.clip(moves, -limit, limit))
    cdef uint64_t bits = _fill_bits(array, fill, name)
    cdef const int64_t *c_moves = <const int64_t *> cnp.PyArray_DATA(<cnp.ndarray> moves)
    with nogil:
        emf_shift_planes(&desc, c_moves, bits)
    return array


def section_uniforms(keys, Py_ssize_t sections, Py_ssize_t draws, uint64_t tag):
    """(len(keys), sections, draws) float64 uniforms in [0, 1): element (n, s, d) is word d % 4 of
    Philox4x64-10 with key (keys[n], tag) and counter (d // 4, s, 0, 0), its top 53 bits."""
    key_array = np.ascontiguousarray(keys, dtype=np.uint64)
    if key_array.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {key_array.shape}")
    if sections < 0 or draws < 0:
        raise ValueError(f"sections and draws must be >= 0, got {sections}, {draws}")
    out = np.empty((key_array.size, sections, draws), dtype=np.float64)
    cdef const uint64_t *c_keys = <const uint64_t *> cnp.PyArray_DATA(<cnp.ndarray> key_array)
    cdef double *c_out = <double *> cnp.PyArray_DATA(<cnp.ndarray> out)
    cdef int64_t count = key_array.size
    with nogil:
        emf_section_uniforms(c_keys, count, sections, draws, tag, c_out)
    return out
