/* Decoding many gzip or zlib streams in one call without the GIL; contract in deflate.h. */
#include "deflate.h"

int emf_decode_deflate(const emf_deflate_library *library, int64_t n, const char *const *sources,
                       const int64_t *sizes, char *const *destinations, const int64_t *capacities, uint8_t *decoded) {
    void *decompressor = library->alloc();
    if (decompressor == nullptr)
        return -1;
    for (int64_t i = 0; i < n; ++i) {
        const unsigned char *source = (const unsigned char *)sources[i];
        bool gzip = sizes[i] >= 2 && source[0] == 0x1f && source[1] == 0x8b;
        size_t consumed = 0, written = 0;
        int result = (gzip ? library->gzip : library->zlib)(decompressor, source, (size_t)sizes[i], destinations[i],
                                                           (size_t)capacities[i], &consumed, &written);
        decoded[i] = result == 0 && consumed == (size_t)sizes[i] && written == (size_t)capacities[i];
    }
    library->free(decompressor);
    return 0;
}
