/* Growing the boundaries between the objects of a label batch (gunpowder's GrowBoundary).
 *
 * The caller (the Cython wrapper) checks dtypes, shapes and that `steps` is at most EMF_GROW_MAX_STEPS; the
 * kernel assumes valid input and never touches Python, so it runs without the GIL.
 */
#ifndef EMFAST_GROW_H
#define EMFAST_GROW_H

#include <stdint.h>

#include "common.h" /* emf_status */

#ifdef __cplusplus
extern "C" {
#endif

/* The longest reach (each step is a pass over the patch). */
#define EMF_GROW_MAX_STEPS 64

/* In `count` contiguous patches of shape[0] x shape[1] x shape[2] ids (itemsize 4 or 8, compared as bits), sets to
 * `background` every voxel whose label is not `background` where a voxel at most `steps` steps away along the axes
 * (|dz| + |dy| + |dx| <= steps, dz = 0 if in_plane), inside its patch, has another label: binary erosion of each
 * object by the axis-aligned cross, `steps` times, with the patch's outside counted as the object. Voxels where
 * `known` (as many uint8, or NULL for all) is 0 are neither changed nor compared with, as if of every label. Labels
 * are compared before any is changed. Scratch: two arrays of a patch's labels. */
int emf_grow_boundary(void *labels, int itemsize, const uint8_t *known, int64_t count, const int64_t shape[3],
                      int64_t steps, int in_plane, uint64_t background);

/* The AVX2 build of the kernel, where compiled in and the CPU has it, unless not allowed (see vector.h). */
void emf_grow_allow_avx2(int allowed);
int emf_grow_uses_avx2(void);

#ifdef __cplusplus
}
#endif

#endif
