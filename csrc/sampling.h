/* Index kernels of the samplers (emfast.sampling): which output windows a mask covers well enough, and which
 * voxels of a label volume belong to which class.
 *
 * Every function assumes valid input (checked by the Cython wrapper, src/emfast/_core/sampling.pyx), never touches
 * Python and returns 0, or EMF_NO_MEMORY when a scratch buffer cannot be allocated, so it runs without
 * the GIL.
 */
#ifndef EMFAST_SAMPLING_H
#define EMFAST_SAMPLING_H

#include <stdint.h>

#include "common.h" /* emf_status */

#ifdef __cplusplus
extern "C" {
#endif

/* Class index meaning "this voxel belongs to no class" (a label id missing from a class map). */
#define EMF_NO_CLASS 255

/* A 3-D block of labels: voxel (z, y, x) at data + z strides[0] + y strides[1] + x strides[2] bytes, for
 * 0 <= (z, y, x) < shape. Labels are 4- or 8-byte integers compared as bits (int64 passed as uint64). */
typedef struct {
    const char *data;
    int64_t shape[3];
    int64_t strides[3];
    int itemsize;
} emf_label_view;

typedef enum {
    /* class 0 ("boundary") where some voxel t steps away along +-z, +-y or +-x (not z if in_plane),
     * 1 <= t <= thickness, lies inside the view and has another label; class 1 ("interior") elsewhere */
    EMF_CLASSES_BOUNDARY = 0,
    /* class id_classes[i] where the label equals ids[i] (ids sorted ascending, distinct), EMF_NO_CLASS elsewhere */
    EMF_CLASSES_MAP = 1,
} emf_class_mode;

typedef struct {
    emf_class_mode mode;
    int64_t thickness;
    int in_plane;
    const uint64_t *ids;
    const uint8_t *id_classes;
    int64_t n_ids;
    int n_classes; /* < EMF_NO_CLASS */
} emf_class_rule;

/* Voxels of each class per block, for the blocks of extent `block` tiling the box [lo, hi) of the view (block
 * (0, 0, 0) starts at lo; blocks at the high end may be partial). counts is (gz, gy, gx, n_classes) in C order,
 * g = ceil((hi - lo) / block), and is overwritten. Neighbours are looked up anywhere in the view, so the view
 * must hold the box plus `thickness` voxels around it wherever the volume has them. */
int emf_count_classes(const emf_label_view *labels, const emf_class_rule *rule, const int64_t lo[3],
                      const int64_t hi[3], const int64_t block[3], uint32_t *counts);

/* The rank-th voxel (0-based, raster order z, y, x) of class `cls` in the box [lo, hi) of the view, written to
 * out (view coordinates); out is (-1, -1, -1) if the box holds rank or fewer voxels of that class. */
int emf_select_class(const emf_label_view *labels, const emf_class_rule *rule, const int64_t lo[3],
                     const int64_t hi[3], int cls, int64_t rank, int64_t out[3]);

/* Window coverage of a slab of 0 / 1 bytes, contiguous (shape[0], shape[1], shape[2]): for every window corner c
 * with c + extent <= shape, bit c[2] of corner row (c[0], c[1]) is set where the window holds >= threshold ones.
 * Corner rows are words_per_row uint64 words (bit j of word w is x = 64 w + j), (shape[0] - extent[0] + 1) *
 * (shape[1] - extent[1] + 1) of them in C order, all overwritten; row_counts gets the set bits per row and
 * *max_count the largest window sum. Scratch memory: three int32 planes of the slab's (y, x) size. */
int emf_window_bits(const uint8_t *coverage, const int64_t shape[3], const int64_t extent[3], int64_t threshold,
                    uint64_t *bits, int64_t words_per_row, int64_t *row_counts, int64_t *max_count);

/* For each of n queries, the x of the ranks[i]-th set bit (0-based) of corner row rows[i] of a bitmap laid out as
 * in emf_window_bits; -1 where the row has too few set bits. */
void emf_select_bits(const uint64_t *bits, int64_t words_per_row, const int64_t *rows, const int64_t *ranks,
                     int64_t n, int64_t *out);

#ifdef __cplusplus
}
#endif

#endif
