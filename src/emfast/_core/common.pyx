# cython: language_level=3
"""What the kernel wrappers share: NumPy dtypes as the kernels' element codes, the dtypes each kind of array may
have, kernel status checks, and the checks that make an argument a plain, native-endian ndarray.

Every constant is defined once, here or in csrc/common.h.
"""
import numpy as np

#: Label dtypes the kernels read. Labels are compared for equality only, as their bits (int32 as uint32, int64 as
#: uint64), so a negative id is an ordinary id.
LABEL_DTYPES = (np.dtype(np.uint32), np.dtype(np.uint64), np.dtype(np.int64), np.dtype(np.int32))
#: Raw dtypes the kernels convert from (to float32 as float32(x) * scale + shift).
RAW_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32), np.dtype(np.int8),
              np.dtype(np.int16), np.dtype(np.uint32), np.dtype(np.float16), np.dtype(np.float64))
#: Dtypes of converted (normalised) windows, and of the raw batches the pixel-wise kernels change in place.
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))

_CODES = {
    np.dtype(np.uint8): EMF_UINT8,
    np.dtype(np.uint16): EMF_UINT16,
    np.dtype(np.uint32): EMF_UINT32,
    np.dtype(np.uint64): EMF_UINT64,
    np.dtype(np.float32): EMF_FLOAT32,
    np.dtype(np.float16): EMF_FLOAT16,
    np.dtype(np.int64): EMF_INT64,
    np.dtype(np.float64): EMF_FLOAT64,
    np.dtype(np.int8): EMF_INT8,
    np.dtype(np.int16): EMF_INT16,
    np.dtype(np.int32): EMF_INT32,
}


cdef emf_dtype dtype_code(dtype, str name, tuple allowed) except *:
    """The kernels' code for ``dtype``, which must be one of ``allowed`` (TypeError naming ``name`` otherwise)."""
    dtype = np.dtype(dtype)
    if dtype not in allowed or not dtype.isnative:
        raise TypeError(f"{name} has dtype {dtype}; supported: {', '.join(str(d) for d in allowed)}")
    return _CODES[dtype]


cdef object check_status(int status, str name):
    """Raise for a kernel's non-zero return code."""
    if status == EMF_NO_MEMORY:
        raise MemoryError(f"{name}: out of memory for the kernel's scratch buffers")
    if status != EMF_OK:
        raise RuntimeError(f"{name} kernel failed with status {status}")


cdef object plain_array(array, str name):
    """A base-class view of ``array`` after checking it is a NumPy array of native-endian numbers: a subclass
    cannot misreport shape, strides or dtype, and the caller's reference keeps it alive while a kernel runs
    without the GIL."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} is a {type(array).__name__}, not a NumPy array")
    if array.dtype.hasobject or not array.dtype.isnative:
        raise TypeError(f"{name} has dtype {array.dtype}; the kernels read and write native-endian numbers only")
    check_aligned(array, name)
    return np.asarray(array)


cdef object check_aligned(array, str name):
    """Raise TypeError if ``array``'s data is not aligned to its elements: the kernels load whole elements, which
    is undefined behaviour at an odd address."""
    if not array.flags.aligned:
        raise TypeError(f"{name} is not aligned to its {array.dtype.itemsize}-byte elements (a view at an odd "
                        "offset into a buffer or file); copy it with np.array(...)")


#: The longest reach (voxels) of a gaussian kernel (blur, LSD): its taps are allocated and computed once per call, so a
#: sigma of 1e18 aborted the process (a length_error from the vector) and one of 1e7 took seconds.
MAX_KERNEL_REACH = 1 << 20


cdef object check_reach(reach, sigma, str name):
    """Raise if a gaussian of ``sigma`` voxels truncated at ``reach`` voxels (a float: 3 x 1e308 is infinite)
    reaches beyond :data:`MAX_KERNEL_REACH`."""
    if not reach <= MAX_KERNEL_REACH:
        raise ValueError(f"{name}: a sigma of {sigma:g} voxels reaches {reach:.4g} voxels, beyond the "
                         f"{MAX_KERNEL_REACH} a kernel may reach")


cdef object writeable_array(array, str name):
    """:func:`plain_array`, also writeable and C-contiguous (what the kernels write into)."""
    array = plain_array(array, name)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"{name} must be a writeable C-contiguous array, got shape {array.shape}")
    return array
