/* Decoding many gzip or zlib streams in one call without the GIL: the chunks a lazy volume misses for a box, once
 * their files are read (files.h). gzip is N5's default compression and one of zarr's; Python's zlib inflates a
 * 64 KiB chunk of EM in about 0.43 ms, libdeflate in 0.20 ms, one decompressor reused for all.
 *
 * The decoder is the system's libdeflate, found at run time by the Python side (io/_deflate.py), which passes its
 * functions' addresses: emfast does not link it, and inflates through zlib where it is missing.
 */
#ifndef EMFAST_DEFLATE_H
#define EMFAST_DEFLATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libdeflate's functions, as libdeflate.h declares them (the decompressor is opaque; results: 0 is success). */
typedef void *(*emf_deflate_alloc_fn)(void);
typedef void (*emf_deflate_free_fn)(void *decompressor);
typedef int (*emf_deflate_decompress_fn)(void *decompressor, const void *source, size_t size, void *destination,
                                         size_t capacity, size_t *consumed, size_t *written);

typedef struct {
    emf_deflate_alloc_fn alloc;
    emf_deflate_free_fn free;
    emf_deflate_decompress_fn gzip;  /* libdeflate_gzip_decompress_ex */
    emf_deflate_decompress_fn zlib;  /* libdeflate_zlib_decompress_ex */
} emf_deflate_library;

/* Inflate stream i (sources[i], sizes[i] bytes: gzip where it starts with gzip's magic bytes, else zlib) into
 * destinations[i] (capacities[i] bytes), for i < n, one decompressor for all (this thread's, kept for its next
 * calls: kept_context.h): decoded[i] = 1 where the stream is exactly the source's bytes (one gzip member, nothing
 * after it) and inflates to exactly capacities[i] bytes,
 * else 0 (damaged, another size, or several gzip members: the caller inflates it the way that names what is
 * wrong; the destination's bytes are then undefined). Returns 0, or -1 if no decompressor could be made. */
int emf_decode_deflate(const emf_deflate_library *library, int64_t n, const char *const *sources,
                       const int64_t *sizes, char *const *destinations, const int64_t *capacities, uint8_t *decoded);

#ifdef __cplusplus
}
#endif

#endif
