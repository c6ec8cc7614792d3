/* Batched window gather: crop + dihedral transform + dtype conversion, written contiguous.
 *
 * A window is described by the address of the source element that lands at output index (0, 0, 0, 0) and a
 * signed byte step per output axis (channel, z, y, x). Mirrors are negative steps and axis permutations are
 * permuted steps, so one strided loop serves all 48 transforms. The caller (the Cython wrapper) checks that
 * every addressed element lies inside its source array; these functions assume valid input and never touch
 * Python, so they run without the GIL.
 */
#ifndef EMFAST_GATHER_H
#define EMFAST_GATHER_H

#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *origin; /* source element written to output (0, 0, 0, 0) */
    int64_t steps[4];   /* byte step in the source per output step along (c, z, y, x) */
    float scale;        /* conversion only: out = float(src) * scale + shift */
    float shift;
} emf_window;

/* out[n, c, z, y, x] = convert(src_n[c, z, y, x]) for n < count, with out contiguous of shape
 * (count, shape[0], shape[1], shape[2], shape[3]). src_dtype: uint8, uint16, float32, int8, int16, uint32, float16 or
 * float64 (float16 as its bits); out_dtype: float32 or float16 (IEEE binary16 stored as uint16, rounded to nearest
 * even like NumPy). Arithmetic is float32 without fused multiply-add, so results are bit-identical to NumPy's
 * (x.astype(float32) * scale + shift).astype(out). */
int emf_gather_convert(const emf_window *windows, int64_t count, const int64_t shape[4],
                       emf_dtype src_dtype, emf_dtype out_dtype, void *out);

/* The same geometry without conversion: elements of itemsize 1, 2, 4 or 8 bytes are copied bit for bit. */
int emf_gather_copy(const emf_window *windows, int64_t count, const int64_t shape[4], int itemsize, void *out);

/* Byte offset marking an output index that takes the fill value instead of a source element. */
#define EMF_PAD_FILL INT64_MIN

/* A window that may reach past its source (padding): output index i along z, y or x reads the source element at
 * byte offset offsets[axis][i] from origin (the first element of channel 0), or takes the fill value where that
 * offset is EMF_PAD_FILL. Mirrors, permutations and the padding rule (reflect, edge) are all in the tables,
 * which the caller computes and checks. */
typedef struct {
    const char *origin;
    int64_t channel_step;      /* byte step in the source per output channel */
    const int64_t *offsets[3]; /* per output axis (z, y, x): one byte offset per output index */
    float scale;               /* conversion only, as in emf_window */
    float shift;
} emf_padded_window;

/* emf_gather_convert for padded windows; fill points to one source element (of src_dtype), converted like the
 * rest. */
int emf_gather_padded_convert(const emf_padded_window *windows, int64_t count, const int64_t shape[4],
                              emf_dtype src_dtype, emf_dtype out_dtype, const void *fill, void *out);

/* emf_gather_copy for padded windows; fill points to one element of itemsize bytes. */
int emf_gather_padded_copy(const emf_padded_window *windows, int64_t count, const int64_t shape[4], int itemsize,
                           const void *fill, void *out);

/* A window read from a chunked volume: the volume is a grid of chunks, each held as its own C-contiguous
 * (channel, z, y, x) array (chunks on the far edges are smaller: the volume's shape clips them). The window is
 * the box [corner, corner + extent) in volume axes, extent[perm[j]] being the output's extent along axis j + 1;
 * output axis j (z, y, x) reads volume axis perm[j], backwards where flip[perm[j]]. The caller checks that the
 * box lies inside the volume and that every chunk it touches is held (a nonzero address). */
typedef struct {
    const int64_t *chunks; /* address of each chunk's data, row-major over the grid (z, y, x) */
    int64_t grid[3];       /* chunks along each volume axis */
    int64_t chunk[3];      /* chunk shape (z, y, x) */
    int64_t volume[3];     /* volume shape (z, y, x) */
    int64_t corner[3];     /* first voxel of the window (z, y, x) */
    int32_t perm[3];
    int32_t flip[3];       /* per volume axis */
    float scale;           /* conversion only, as in emf_window */
    float shift;
} emf_chunked_window;

/* emf_gather_convert for windows of chunked volumes: each element is read in place from its chunk. */
int emf_gather_chunked_convert(const emf_chunked_window *windows, int64_t count, const int64_t shape[4],
                               emf_dtype src_dtype, emf_dtype out_dtype, void *out);

/* emf_gather_copy for windows of chunked volumes. */
int emf_gather_chunked_copy(const emf_chunked_window *windows, int64_t count, const int64_t shape[4], int itemsize,
                            void *out);

/* IEEE binary32 -> binary16 bits, round to nearest even, NaN kept NaN, overflow to infinity. */
uint16_t emf_float_to_half(float value);

#ifdef __cplusplus
}
#endif

#endif
