/* Blending overlapping predictions: weighted sums in float64, then one division and a conversion per voxel.
 * Weights and their totals are float32: they are multiples of 1/256, which float32 sums exactly (up to 65536).
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

/* For c < channels and every (z, y, x) < shape:
 *     sums[c, z, y, x] += weight[z, y, x] * prediction[c, z, y, x];  totals[z, y, x] += weight[z, y, x]
 * (totals once per voxel, not per channel). sums are float64, totals and weight float32; prediction is float16,
 * float32 or float64 (pred_dtype). Strides are in bytes: 4 for sums and prediction (c, z, y, x), 3 for totals and
 * weight. */
int emf_blend_add(double *sums, const int64_t sums_strides[4], float *totals, const int64_t totals_strides[3],
                  const float *weight, const int64_t weight_strides[3], const void *prediction,
                  emf_dtype pred_dtype, const int64_t pred_strides[4], int64_t channels, const int64_t shape[3]);

/* out[c, v] = convert(sums[c, v] / totals[v]) for contiguous sums (channels, voxels) and totals (voxels), into a
 * contiguous out of out_dtype: float32, float16 (rounded through float32) or uint8 (rint(clip(x, 0, 1) * 255), NaN to 0). */
int emf_blend_finish(const double *sums, const float *totals, int64_t channels, int64_t voxels,
                     emf_dtype out_dtype, void *out);

#ifdef __cplusplus
}
#endif

#endif
