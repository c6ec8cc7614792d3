/* Decoding many gzip or zlib streams in one call without the GIL; contract in deflate.h. */
#include "deflate.h"

#include "kept_context.h"

/* instantiated here: GCC otherwise leaves the destructor that the thread-local object's exit registers undefined */
template class emf_kept::Context<emf_deflate_alloc_fn, emf_deflate_free_fn>;

namespace {
thread_local emf_kept::Context<emf_deflate_alloc_fn, emf_deflate_free_fn> kept;
}

int emf_decode_deflate(const emf_deflate_library *library, int64_t n, const char *const *sources,
                       const int64_t *sizes, char *const *destinations, const int64_t *capacities, uint8_t *decoded) {
    void *decompressor = kept.get(library->alloc, library->free);
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
    return 0;
}
