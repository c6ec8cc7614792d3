/* Training targets derived from a batch of label patches: affinities, boundaries, class maps, foreground.
 *
 * Input: `count` label patches stored contiguous as (count, 1, shape[0], shape[1], shape[2]), 4- or 8-byte
 * integers compared for equality only (so int64 labels are passed as their uint64 bits). Output voxel
 * (z, y, x) of every target is label voxel (z + margin[0], y + margin[1], x + margin[2]); outputs are
 * contiguous (count, channels, shape[0] - 2 margin[0], shape[1] - 2 margin[1], shape[2] - 2 margin[2]).
 * Label voxels outside the patch are unknown: they are never compared with.
 *
 * The caller (the Cython wrapper) checks dtypes, shapes, margins (0 <= 2 margin < shape), that outputs do
 * not overlap the labels and that offsets fit in [-shape, shape] per axis; these functions assume valid input
 * and never touch Python, so they run without the GIL.
 */
#ifndef EMFAST_TARGETS_H
#define EMFAST_TARGETS_H

#include <stdint.h>

#include "common.h" /* emf_dtype, emf_status */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const void *data;  /* first label of patch 0 */
    int64_t count;     /* patches in the batch */
    int64_t shape[3];  /* label patch extent (z, y, x) */
    int64_t margin[3]; /* output covers label voxels [margin, shape - margin) per axis */
    int itemsize;      /* 4 or 8 bytes per label */
} emf_labels;

/* The ids that mask affinities: `ignore` (either voxel), `unlabelled` (both voxels), each where has_ is set. */
typedef struct {
    int has_ignore, has_unlabelled;
    uint64_t ignore, unlabelled;
} emf_mask_ids;

/* Affinities for `channels` offsets (offsets[3 k + axis], any sign, not all zero), after gunpowder's
 * seg_to_affgraph: at output voxel v (label voxel u = v + margin), with w = u + offset_k,
 *     out[n, k, v]  = label[u] == label[w] and (no background or label[u] != background)
 *     mask[n, k, v] = w inside the patch and neither label is ids->ignore and not both are ids->unlabelled
 * with out forced to 0 where the neighbour is outside the patch. out_dtype: uint8 or float32 (0 / 1). */
int emf_affinities(const emf_labels *labels, const int64_t *offsets, int64_t channels, int has_background,
                   uint64_t background, const emf_mask_ids *ids, emf_dtype out_dtype, void *out, uint8_t *mask);

/* Boundaries (one channel, uint8): out[n, 0, v] = 1 where some label voxel u + t e, e one of +-z, +-y, +-x (not
 * +-z if in_plane), 1 <= t <= thickness, lies inside the patch and has a label other than label[u]. */
int emf_boundaries(const emf_labels *labels, int64_t thickness, int in_plane, uint8_t *out);

/* Class map (one channel): values[0] where label[u] == background (if has_background), else values[1] where u
 * is a boundary voxel as in emf_boundaries, else values[2]. out_dtype: uint8 or int64. */
int emf_classes(const emf_labels *labels, int64_t thickness, int in_plane, int has_background, uint64_t background,
                const int64_t values[3], emf_dtype out_dtype, void *out);

/* Foreground (one channel, uint8): out[n, 0, v] = label[u] != background. */
int emf_foreground(const emf_labels *labels, uint64_t background, uint8_t *out);

/* Loss weights balancing the classes of a target, after gunpowder's BalanceLabels. `values` holds `slabs`
 * contiguous slabs of `slab_size` class ids (dtype uint8, int64 or float32 holding integers), `mask` as many
 * uint8 (NULL: every voxel counts). Per slab, among its voxels whose mask is non-zero, the fraction f_c of each
 * class c, clipped to [clip_min, clip_max] (NaN bounds: no clipping on that side), gives
 *     out[i] = (mask[i] != 0) * (1 / classes) / f_{values[i]}    (float32; 0 where the mask is 0)
 * computed in double from exact counts. Every value must be an integer in [0, classes): otherwise nothing is
 * certain to be written, *bad is the index of the first one found and the return is EMF_OK; *bad = -1 if all are. */
int emf_balance(const void *values, emf_dtype dtype, const uint8_t *mask, int64_t slabs, int64_t slab_size,
                int64_t classes, double clip_min, double clip_max, float *out, int64_t *bad);

#ifdef __cplusplus
}
#endif

#endif
