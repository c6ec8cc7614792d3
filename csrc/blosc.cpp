/* Decoding many blosc frames in one call without the GIL; contract in blosc.h. */
#include "blosc.h"

void emf_decode_blosc(const emf_blosc_library *library, int64_t n, const char *const *sources, const int64_t *sizes,
                      char *const *destinations, const int64_t *capacities, uint8_t *decoded) {
    for (int64_t i = 0; i < n; ++i) {
        size_t stated = 0;
        // validate: the header's compressed size is the frame's; a frame that states another decoded size is
        // refused before decoding, so a destination is never written past its end
        decoded[i] = library->validate(sources[i], (size_t)sizes[i], &stated) == 0 &&
                     stated == (size_t)capacities[i] &&
                     library->decompress(sources[i], destinations[i], (size_t)capacities[i], 1) ==
                         (int)capacities[i];
    }
}
