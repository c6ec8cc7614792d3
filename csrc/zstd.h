/* Decoding many zstd frames in one call without the GIL: the chunks a lazy volume misses for a box, once their
 * files are read (files.h). Each frame through numcodecs costs a decoding context made afresh and the
 * interpreter's bookkeeping, about a fifth of the decoding itself for a 64 KiB chunk; here one context decodes
 * them all.
 *
 * The decoder is the system's libzstd, found at run time by the Python side (io/_zstd.py), which passes its
 * functions' addresses: emfast does not link it, and reads zstd through numcodecs where it is missing.
 */
#ifndef EMFAST_ZSTD_H
#define EMFAST_ZSTD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libzstd's functions, as zstd.h declares them (contexts are opaque). */
typedef void *(*emf_zstd_create_fn)(void);
typedef size_t (*emf_zstd_free_fn)(void *context);
typedef size_t (*emf_zstd_decompress_fn)(void *context, void *destination, size_t capacity, const void *source,
                                         size_t size);
typedef unsigned (*emf_zstd_is_error_fn)(size_t code);

typedef struct {
    emf_zstd_create_fn create;
    emf_zstd_free_fn free;
    emf_zstd_decompress_fn decompress;
    emf_zstd_is_error_fn is_error;
} emf_zstd_library;

/* Decode frame i (sources[i], sizes[i] bytes) into destinations[i] (capacities[i] bytes), for i < n, one context
 * for all (this thread's, kept for its next calls: kept_context.h): decoded[i] = 1 where the frames (one or more,
 * back to back) decoded to exactly capacities[i] bytes, else 0 (a damaged frame, or another size: the caller decodes it the way that names what is wrong; the
 * destination's bytes are then undefined). Returns 0, or -1 if no context could be made (nothing decoded). */
int emf_decode_zstd(const emf_zstd_library *library, int64_t n, const char *const *sources, const int64_t *sizes,
                    char *const *destinations, const int64_t *capacities, uint8_t *decoded);

#ifdef __cplusplus
}
#endif

#endif
