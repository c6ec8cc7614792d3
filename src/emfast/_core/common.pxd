# cython: language_level=3
# Declarations every wrapper of the compiled core shares: the element types and return codes of csrc/common.h, and
# the argument checks that turn NumPy arrays into what the kernels take (implemented in common.pyx).

cdef extern from "common.h" nogil:
    ctypedef enum emf_dtype:
        EMF_UINT8
        EMF_UINT16
        EMF_UINT32
        EMF_UINT64
        EMF_FLOAT32
        EMF_FLOAT16
        EMF_INT64
        EMF_FLOAT64
        EMF_INT8
        EMF_INT16
        EMF_INT32

    ctypedef enum emf_status:
        EMF_OK
        EMF_BAD_DTYPE
        EMF_NO_MEMORY


cdef emf_dtype dtype_code(dtype, str name, tuple allowed) except *
cdef object check_status(int status, str name)
cdef object plain_array(array, str name)
cdef object writeable_array(array, str name)
cdef object check_reach(reach, sigma, str name)
cdef object check_aligned(array, str name)
