/* Resampling a window of a field stored at another voxel size onto raw's grid, separably: each output axis reads
 * the source through a table of source indices (nearest neighbour) or of index pairs and weights (linear). The
 * tables carry all the geometry (voxel-size ratio, offsets, clamping at the volume's edges); they are built and
 * checked by the Cython wrapper, so these functions assume valid input and never touch Python.
 */
#ifndef EMFAST_RESCALE_H
#define EMFAST_RESCALE_H

#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[c, z, y, x] = src[c, index_z[z], index_y[y], index_x[x]] for c < channels and (z, y, x) < shape, elements
 * of elem_size bytes (1, 2, 4 or 8; copied bit for bit). src has byte strides src_strides (c, z, y, x); out is
 * C-contiguous. */
int emf_rescale_nearest(const void *src, const int64_t src_strides[4], int64_t elem_size, int64_t channels,
                        const int64_t *index_z, const int64_t *index_y, const int64_t *index_x,
                        const int64_t shape[3], void *out);

/* Trilinear interpolation into a C-contiguous float32 out: along each axis a, output position i blends source
 * positions lo_a[i] and hi_a[i] as (1 - w_a[i]) * lo + w_a[i] * hi, in double, z outermost, then x innermost
 * last rounded once to float32. src is of src_dtype with byte strides src_strides (c, z, y, x). */
int emf_rescale_linear(const void *src, emf_dtype src_dtype, const int64_t src_strides[4], int64_t channels,
                       const int64_t *lo_z, const int64_t *hi_z, const double *w_z,
                       const int64_t *lo_y, const int64_t *hi_y, const double *w_y,
                       const int64_t *lo_x, const int64_t *hi_x, const double *w_x,
                       const int64_t shape[3], float *out);

#ifdef __cplusplus
}
#endif

#endif
