/* What every kernel shares: element types and return codes. Each is defined here once; the Cython side declares
 * them in src/emfast/_core/common.pxd.
 */
#ifndef EMFAST_COMMON_H
#define EMFAST_COMMON_H

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of arrays the kernels read or write (float16 is IEEE binary16 stored as uint16). */
typedef enum {
    EMF_UINT8 = 0,
    EMF_UINT16 = 1,
    EMF_UINT32 = 2,
    EMF_UINT64 = 3,
    EMF_FLOAT32 = 4,
    EMF_FLOAT16 = 5,
    EMF_INT64 = 6,
    EMF_FLOAT64 = 7,
    EMF_INT8 = 8,
    EMF_INT16 = 9,
    EMF_INT32 = 10,
} emf_dtype;

/* Return codes of every kernel. */
typedef enum {
    EMF_OK = 0,
    EMF_BAD_DTYPE = 1,
    EMF_NO_MEMORY = 2,
} emf_status;

#ifdef __cplusplus
}
#endif

#endif
