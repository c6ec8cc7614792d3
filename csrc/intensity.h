/* Pixel-wise augmentations of a raw batch, in place: gamma, contrast, Gaussian noise, Gaussian blur, and the EM
 * section defects (filled, low-contrast, shifted and blended sections).
 *
 * Raw is a contiguous batch of float32 or float16 (IEEE binary16 stored as uint16) elements. Each kernel changes
 * a list of equal-sized contiguous blocks of it (an example, an (example, channel) volume or an (example,
 * channel, z) section), each with its own parameter; float16 blocks are converted to float32 a row at a time,
 * processed in float32 and rounded back to nearest even, like NumPy's astype. Arithmetic is float32 without
 * fused multiply-add (the build passes -ffp-contract=off), so results are reproducible bit for bit.
 *
 * The caller (the Cython wrapper) checks dtypes, that every block lies inside its array and that blocks do not
 * repeat; these functions assume valid input and never touch Python, so they run without the GIL.
 */
#ifndef EMFAST_INTENSITY_H
#define EMFAST_INTENSITY_H

#include <stdint.h>

#include "common.h" /* emf_dtype, emf_status */

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks index[0..count) of `size` elements each of a raw batch: block b starts at element index[b] * size. */
typedef struct {
    void *data;
    emf_dtype dtype; /* EMF_FLOAT32 or EMF_FLOAT16 */
    int64_t size;
    const int64_t *index;
    int64_t count;
} emf_blocks;

/* Gamma, sign-safe: x -> copysign(powf(|x|, gamma[b]), x) (powf of the C library). */
void emf_gamma(const emf_blocks *blocks, const float *gamma);

/* Contrast around each block's mean: x -> (x - m) * factor[b] + m, with m the block mean rounded to float32.
 * The mean is computed in double as (s0 + s1) + (s2 + s3), where lane s_j sums, in order, the elements whose
 * offset in the block is j modulo 4. */
void emf_contrast(const emf_blocks *blocks, const float *factor);

/* Additive Gaussian noise: x -> x + sigma[b] * g, g a standard normal draw that depends only on the key
 * (keys[b], EMF_NOISE_TAG) and the element's offset i in its block. Elements come in groups of 512: group k uses
 * Philox4x64-10 counters (64 k + j, 0, 0, 0), j < 64, whose output word q gives pair p = 4 j + q (its low and
 * high 32 bits); Box-Muller turns pair p into elements 512 k + p and 512 k + 256 + p (polynomial logarithm, sine
 * and cosine, accurate to about 1e-7). */
void emf_noise(const emf_blocks *blocks, const float *sigma, const uint64_t *keys);

/* Gaussian blur of volumes of shape (z, y, x) = shape[0..3) (the blocks, size = z * y * x) with standard
 * deviation sigma[b] voxels along y and x, and also along z unless per_section. Matches
 * scipy.ndimage.gaussian_filter(mode="reflect", truncate=truncate) up to float32 rounding: separable passes
 * z, y, x with weights exp(-k^2 / (2 sigma^2)) normalised to sum 1, |k| <= int(truncate * sigma + 0.5), edges
 * mirrored about the outer voxel faces (d c b a | a b c d | d c b a, repeated as often as the radius needs).
 * Returns EMF_NO_MEMORY if a work buffer cannot be allocated. */
int emf_blur(const emf_blocks *blocks, const int64_t shape[3], const double *sigma, int per_section,
             double truncate);

/* Artifact sections blended into raw planes of `width` columns (the blocks, size = rows * width):
 * x -> x * (1 - alpha[b]) + a * alpha[b], a = float(source[origin[b] + y * steps[0] + x * steps[1]]) * scale +
 * shift, all in float32. The source holds uint8 (is_uint8 != 0) or float32 elements; origin and steps count
 * elements. */
typedef struct {
    const void *data;
    int is_uint8;
    int64_t steps[2];
    float scale, shift;
} emf_source;

void emf_blend(const emf_blocks *blocks, int64_t width, const emf_source *source, const int64_t *origin,
               const float *alpha);

/* Planes of `height` x `width` elements of 1, 2, 4 or 8 bytes (any array: raw, labels, masks), plane p
 * starting at element index[p] * height * width. */
typedef struct {
    void *data;
    int itemsize;
    int64_t height, width;
    const int64_t *index;
    int64_t count;
} emf_planes;

/* Every element of the planes set to the low `itemsize` bytes of fill (native byte order). */
void emf_fill_planes(const emf_planes *planes, uint64_t fill);

/* Plane p moved by (shift[2p], shift[2p + 1]) along (y, x): new[y, x] = old[y - dy, x - dx] where that lies
 * inside the plane, else fill. */
void emf_shift_planes(const emf_planes *planes, const int64_t *shift, uint64_t fill);

/* Key word 1 of the Philox streams of the kernels and of emf_section_uniforms. */
#define EMF_NOISE_TAG 0x6E6F697365ULL /* "noise" */

/* out[(n * sections + s) * draws + d]: uniform doubles in [0, 1), 53 bits, from Philox4x64-10 with key
 * (keys[n], tag) and counter (d / 4, s, 0, 0), element d % 4. */
void emf_section_uniforms(const uint64_t *keys, int64_t count, int64_t sections, int64_t draws, uint64_t tag,
                          double *out);

#ifdef __cplusplus
}
#endif

#endif
