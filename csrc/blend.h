/* Blending overlapping predictions: weighted sums in float64, then one division and a conversion per voxel.
 *
 * A tile's weight at a voxel is the product of three per-axis weights (wz[z] * wy[y] * wx[x]), each a multiple of
 * 1/256 in (0, 1]. The product (27 bits) and its product with a float32 or float16 prediction (51 bits) are exact
 * in float64, and so are the sums of such products of one value; the weights' totals over a block are products
 * of per-axis totals, also exact. So where all overlapping predictions agree, the blended value is that
 * prediction bit for bit.
 *
 * Arrays are described by a base pointer and signed byte strides per axis, so a prediction can be read through
 * the inverse of a test-time transform (permuted and negative strides) without a copy. The Cython wrapper
 * checks shapes, dtypes and bounds; these functions assume valid input and never touch Python.
 */
#ifndef EMFAST_BLEND_H
#define EMFAST_BLEND_H

#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tile of a group blended by emf_blend_tiles. For c < channels and every (z, y, x) < shape, with
 * w = wz[z] * wy[y] * wx[x] (in that order):
 *     sums[c, z, y, x] = w * prediction[c, z, y, x]    inside the box [first_low, first_high),
 *     sums[c, z, y, x] += w * prediction[c, z, y, x]   elsewhere.
 * The box holds the voxels no tile blended before touched, so a block's sums need no clearing. sums and the
 * weights are float64; prediction is float16, float32 or float64 (pred_dtype). Strides are in bytes (c, z, y, x).
 * ``row`` is the block row of the tile's y = 0: a part blends the rows with (row + y) % parts == part. Where keep
 * is not NULL, a copy of the whole tile is made first: keep[c, z, y, x] = kept_from[c, z, y, x] over keep_shape,
 * item_size bytes per element, by the tile's own rows (y % parts == part). */
typedef struct {
    double *sums;
    int64_t sums_strides[4];
    const double *wz, *wy, *wx;
    const void *prediction;
    emf_dtype pred_dtype;
    int64_t pred_strides[4];
    int64_t channels;
    int64_t shape[3];
    int64_t first_low[3], first_high[3];
    int64_t row;
    void *keep;
    const void *kept_from;
    int64_t keep_strides[4], from_strides[4], keep_shape[4];
    int64_t item_size;
} emf_blend_tile;
/* Blends count tiles in order, each on its rows of part ``part`` of ``parts`` (0 <= part <
 * parts): threads blending the parts of one group at once write disjoint rows, and each voxel gets its tiles in the
 * same order whatever ``parts``. */
int emf_blend_tiles(const emf_blend_tile *tiles, int64_t count, int64_t part, int64_t parts);
/* out[c, z, y, x] = convert(sums[c, z, y, x] / (((count * tz[z]) * ty[y]) * tx[x])) for contiguous sums and out
 * (channels, shape), into out_dtype: float32, float16 (rounded once, as NumPy rounds float64) or uint8
 * (rint(clip(x, 0, 1) * 255), NaN to 0). tz, ty and tx are the per-axis totals of the weights, count the
 * predictions per tile. *non_finite is set to how many blended values were NaN or infinite (before the
 * conversion; 0 for uint8). */
int emf_blend_finish(const double *sums, const double *tz, const double *ty, const double *tx, double count,
                     int64_t channels, const int64_t shape[3], emf_dtype out_dtype, void *out, int64_t *non_finite);
/* Both kernels run their AVX2 build (the same bits, faster; see vector.h) where the CPU has AVX2, unless
 * emf_blend_allow_avx2(0) was called; emf_blend_uses_avx2 says whether they do. */
void emf_blend_allow_avx2(int allowed);
int emf_blend_uses_avx2(void);

#ifdef __cplusplus
}
#endif

#endif
