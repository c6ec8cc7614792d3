/* Batched warp: any linear map plus a smooth elastic displacement, sampled from per-example sources.
 *
 * Output voxel o = (z, y, x) of example n, in an output of shape (count, C, Z, Y, X), reads the source at
 *     s = centre[n] + A[n] @ (o - (shape - 1) / 2) + d_n(o)        (source voxel coordinates, z, y, x)
 * where d_n is a cubic B-spline of the example's control grid (3, gz, gy, gx): control point (i, j, k) sits at
 * the centred output coordinate origin + (i, j, k) * spacing, and grid indices outside the grid repeat the
 * nearest control point. The weights are non-negative and sum to one, so |d_n| <= max |grid| per component.
 *
 * Inside rule (the same for every sampler, and the same as scipy.ndimage.map_coordinates(mode="constant")):
 * a voxel is inside when 0 <= s <= extent - 1 along each source axis; outside voxels get `fill` and valid = 0.
 * Raw is sampled trilinearly (a neighbour beyond the last voxel has weight 0 and is never read), labels take
 * the nearest voxel floor(s + 0.5) and are copied bit for bit.
 *
 * Precision: coordinates are computed in float64 at the start of each run of 16 output voxels along x and in
 * float32 relative to that run's integer base voxel within it, so the error in s is a few float32 ulps of
 * (16 |A[:, x]| + |d| + 1), below 1e-5 voxel for |A| <= 2 and |d| <= 16. Integer coordinates stay exact.
 * An example with a signed permutation matrix, no grid, an integer source coordinate of output voxel 0 and
 * every voxel inside is handed to the gather kernel (gather.h) when allow_gather is non-zero; the general path
 * gives the same bits for finite sources (allow_gather = 0 lets tests and benchmarks check that).
 * On CPUs with AVX2 (checked at run time) examples whose source spans less than 2^31 bytes are sampled eight
 * voxels at a time; that path computes the same coordinates and values, bit for bit, as the portable one.
 *
 * The caller (the Cython wrapper) checks dtypes, shapes and value ranges (finite; |A| <= 1024, |grid| <= 2^20,
 * |centre| <= 2^40, so no float-to-integer conversion overflows); these functions assume valid input and never
 * touch Python, so they run without the GIL.
 */
#ifndef EMFAST_WARP_H
#define EMFAST_WARP_H

#include <stdint.h>

#include "common.h" /* emf_dtype, emf_status */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *data;   /* source element (0, 0, 0, 0) */
    int64_t shape[4];   /* source extent (C, Z, Y, X) */
    int64_t strides[4]; /* source byte strides, any sign */
    double centre[3];   /* source coordinate of the output window's centre (z, y, x) */
    double matrix[9];   /* A, row-major: source axis i gets sum_j A[3 i + j] * (o_j - (shape_j - 1) / 2) */
    const float *grid;  /* C-contiguous (3, gz, gy, gx) displacements in source voxels (z, y, x), or NULL */
    float scale;        /* raw only: out = value * scale + shift in float32 */
    float shift;
} emf_warp_example;

typedef struct {
    int64_t shape[3];   /* control points per axis (gz, gy, gx), each >= 1 */
    double spacing[3];  /* output voxels between control points, > 0 */
    double origin[3];   /* centred output coordinate of control point (0, 0, 0) */
} emf_warp_grid;

/* Raw: out[n, c, o] = trilinear(src_n[c], s) * scale + shift, or fill outside. src_dtype: uint8, uint16 or
 * float32; out_dtype: float32 or float16 (rounded to nearest even). valid, if not NULL, is (count, 1, Z, Y, X).
 * grid may be NULL when no example has one. shape = (C, Z, Y, X) of one example of out. */
int emf_warp_convert(const emf_warp_example *examples, int64_t count, const int64_t shape[4],
                     const emf_warp_grid *grid, emf_dtype src_dtype, emf_dtype out_dtype, float fill, void *out,
                     uint8_t *valid, int allow_gather);

/* Labels: out[n, c, o] = src_n[c, floor(s + 0.5)], bit for bit, or the itemsize bytes at `fill` outside.
 * itemsize: 1, 2, 4 or 8. */
int emf_warp_copy(const emf_warp_example *examples, int64_t count, const int64_t shape[4],
                  const emf_warp_grid *grid, int itemsize, const void *fill, void *out, uint8_t *valid,
                  int allow_gather);

/* The coordinates the samplers use: out (count, 3, Z, Y, X) float64 holds s (exactly, as the samplers see it)
 * for shape = (Z, Y, X). Sources are not read (data, shape and strides are ignored). */
int emf_warp_coordinates(const emf_warp_example *examples, int64_t count, const int64_t shape[3],
                         const emf_warp_grid *grid, double *out);

/* Allow (1, the default) or forbid (0) the samplers' AVX2 path, for every later call; thread-safe. */
void emf_warp_allow_avx2(int allowed);

/* 1 if the warp samplers run their AVX2 path on this CPU (compiled in, supported, allowed), else 0. */
int emf_warp_uses_avx2(void);

#ifdef __cplusplus
}
#endif

#endif
