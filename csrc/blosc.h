/* Decoding many blosc frames in one call without the GIL: the chunks a lazy volume misses for a box, once their
 * files are read (files.h). numcodecs decodes each frame in a call of its own, behind the interpreter's
 * bookkeeping (and asks which process and thread it runs in, every time): for the 64 KiB chunks of an EM volume
 * stored with lz4, that bookkeeping costs more than the decoding.
 *
 * The decoder is c-blosc (1.16 or later, whose decoder is safe on damaged input), found at run time by the Python
 * side (io/_blosc.py), which passes its functions' addresses: emfast does not link it.
 */
#ifndef EMFAST_BLOSC_H
#define EMFAST_BLOSC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* c-blosc's functions, as blosc.h declares them. */
typedef int (*emf_blosc_validate_fn)(const void *source, size_t size, size_t *decoded_size);
typedef int (*emf_blosc_decompress_fn)(const void *source, void *destination, size_t capacity, int threads);

typedef struct {
    emf_blosc_validate_fn validate;
    emf_blosc_decompress_fn decompress;
} emf_blosc_library;

/* Decode frame i (sources[i], sizes[i] bytes) into destinations[i] (capacities[i] bytes), for i < n, each on this
 * thread alone: decoded[i] = 1 where the frame's header agrees with its size and states exactly capacities[i]
 * decoded bytes, and it decoded, else 0 (the caller decodes it the way that names what is wrong; the destination's
 * bytes are then undefined). */
void emf_decode_blosc(const emf_blosc_library *library, int64_t n, const char *const *sources, const int64_t *sizes,
                      char *const *destinations, const int64_t *capacities, uint8_t *decoded);

#ifdef __cplusplus
}
#endif

#endif
