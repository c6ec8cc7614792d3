/* Philox4x64-10; see philox.h. */
#include "philox.h"

#if defined(_MSC_VER) && defined(_M_X64)
#include <intrin.h>
#endif

namespace {

const uint64_t kMultiplier0 = 0xD2E7470EE14C6C93ULL;
const uint64_t kMultiplier1 = 0xCA5A826395121157ULL;
const uint64_t kWeyl0 = 0x9E3779B97F4A7C15ULL; /* golden ratio */
const uint64_t kWeyl1 = 0xBB67AE8584CAA73BULL; /* sqrt(3) - 1 */

/* Full 64 x 64 -> 128-bit product: returns the high half, stores the low half. */
inline uint64_t multiply_high(uint64_t a, uint64_t b, uint64_t *low) {
#if defined(__SIZEOF_INT128__)
    const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
    *low = static_cast<uint64_t>(product);
    return static_cast<uint64_t>(product >> 64);
#elif defined(_MSC_VER) && defined(_M_X64)
    uint64_t high;
    *low = _umul128(a, b, &high);
    return high;
#else
    const uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
    const uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
    const uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
    *low = (middle << 32) | (lo_lo & 0xffffffffu);
    return hi_hi + (hi_lo >> 32) + (middle >> 32);
#endif
}

}  // namespace

extern "C" {

void emf_philox4x64(const uint64_t key[2], const uint64_t counter[4], uint64_t out[4]) {
    uint64_t x0 = counter[0], x1 = counter[1], x2 = counter[2], x3 = counter[3];
    uint64_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += kWeyl0;
            k1 += kWeyl1;
        }
        uint64_t low0, low1;
        const uint64_t high0 = multiply_high(kMultiplier0, x0, &low0);
        const uint64_t high1 = multiply_high(kMultiplier1, x2, &low1);
        x0 = high1 ^ x1 ^ k0;
        x1 = low1;
        x2 = high0 ^ x3 ^ k1;
        x3 = low0;
    }
    out[0] = x0;
    out[1] = x1;
    out[2] = x2;
    out[3] = x3;
}

void emf_uniform_batch(const uint64_t key[2], uint64_t batch, uint64_t stream_word, int64_t examples,
                       int64_t draws, double *out) {
    for (int64_t n = 0; n < examples; ++n) {
        for (int64_t d = 0; d < draws; d += 4) {
            const uint64_t counter[4] = {static_cast<uint64_t>(d / 4), static_cast<uint64_t>(n), batch,
                                         stream_word};
            uint64_t block[4];
            emf_philox4x64(key, counter, block);
            for (int64_t i = 0; i < 4 && d + i < draws; ++i)
                out[n * draws + d + i] = static_cast<double>(block[i] >> 11) * (1.0 / 9007199254740992.0);
        }
    }
}

}  // extern "C"
