/* Decoding many zstd frames in one call without the GIL; contract in zstd.h. */
#include "zstd.h"

#include "kept_context.h"

/* instantiated here: GCC otherwise leaves the destructor that the thread-local object's exit registers undefined */
template class emf_kept::Context<emf_zstd_create_fn, emf_zstd_free_fn>;

namespace {
thread_local emf_kept::Context<emf_zstd_create_fn, emf_zstd_free_fn> kept;
}

int emf_decode_zstd(const emf_zstd_library *library, int64_t n, const char *const *sources, const int64_t *sizes,
                    char *const *destinations, const int64_t *capacities, uint8_t *decoded) {
    void *context = kept.get(library->create, library->free);
    if (context == nullptr)
        return -1;
    for (int64_t i = 0; i < n; ++i) {
        size_t written = library->decompress(context, destinations[i], (size_t)capacities[i], sources[i],
                                             (size_t)sizes[i]);
        decoded[i] = !library->is_error(written) && written == (size_t)capacities[i];
    }
    return 0;
}
