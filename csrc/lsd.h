/* Local shape descriptors (LSDs) of a batch of label patches, after funkelab's lsds package, gaussian mode.
 *
 * Input: `count` label patches as in targets.h (emf_labels: contiguous, 4- or 8-byte ids compared for equality
 * only, output voxel v is label voxel u = v + margin). For every object (the voxels of one id, other than the
 * background and ignore ids), around each of its voxels u:
 *     G(q) = g_z(q_z - u_z) g_y(q_y - u_y) g_x(q_x - u_x), summed over the object's voxels q inside the patch,
 * with g_a the gaussian of standard deviation sigma[a] voxels truncated at radius[a] and normalised to sum 1 over
 * [-radius, radius] (scipy.ndimage.gaussian_filter with truncate=3; voxels outside the patch are not the object).
 * With t = (q - u) / sigma per axis (so world units cancel), the ten channels at v are
 *     0-2  mean offset   E[t_a] / 2 + 1/2                                  (a = z, y, x)
 *     3-5  variance      max(E[t_a^2] - E[t_a]^2, variance_floor[a])
 *     6-8  pearson       cov(t_a, t_b) / sqrt(var_a var_b) / 2 + 1/2         (ab = zy, zx, yx; floored variances)
 *     9    size          sum of G (the gaussian weight the object holds)
 * with E the G-weighted mean, every channel clipped to [0, 1]; 0 on background and ignore voxels.
 * mask (one channel) is 1 where the voxel belongs to an object, 0 on background and ignore voxels.
 *
 * The caller checks shapes, margins (0 <= 2 margin < shape), sigma >= 1, radius = int(3 sigma + 0.5) and
 * that outputs do not overlap the labels; these functions assume valid input and never touch Python.
 */
#ifndef EMFAST_LSD_H
#define EMFAST_LSD_H

#include <stdint.h>

#include "common.h"  /* emf_status */
#include "targets.h" /* emf_labels */

#ifdef __cplusplus
extern "C" {
#endif

/* out: contiguous float32 (count, 10, Zo, Yo, Xo); mask: contiguous uint8 (count, 1, Zo, Yo, Xo). With
 * `planar`, each section on its own (the caller passes radius[0] = 0, so the z kernel is the section itself): out
 * holds lsds' six 2-D channels (count, 6, Zo, Yo, Xo), channels 1, 2, 4, 5, 8, 9 of the ten. */
int emf_lsd(const emf_labels *labels, const double sigma[3], const int64_t radius[3],
            const double variance_floor[3], int has_background, uint64_t background, int has_ignore,
            uint64_t ignore, int planar, float *out, uint8_t *mask);

#ifdef __cplusplus
}
#endif

#endif
