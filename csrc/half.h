/* binary16 <-> binary32 conversions shared by the kernels, bit-exact with NumPy's float16.
 *
 * Branch-free (selects as bit masks, not ?:, which GCC turns into branches), so that loops over them vectorise
 * without F16C. */
#ifndef EMFAST_HALF_H
#define EMFAST_HALF_H

#include <cstdint>
#include <cstring>

namespace emf_half {

inline float bits_to_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

inline uint32_t float_to_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* binary32 -> binary16, round to nearest even (as NumPy). Subnormal halves use the float adder to round:
 * |x| + 0.5 has an ulp of 2^-24, the half's unit. */
inline uint16_t float_to_half(float value) {
    const uint32_t bits = float_to_bits(value);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const int32_t magnitude = static_cast<int32_t>(bits & 0x7fffffffu);
    const uint32_t mag = static_cast<uint32_t>(magnitude);
    const uint32_t subnormal = float_to_bits(bits_to_float(mag) + 0.5f) - 0x3f000000u;
    /* Rebias the exponent (127 -> 15) and round on the 13 dropped bits: adding 0xfff plus the kept lsb carries
     * exactly when the remainder is above half, or at half with an odd lsb. */
    const uint32_t normal = (mag - 0x38000000u + 0xfffu + ((mag >> 13) & 1u)) >> 13;
    /* A NaN keeps its top payload bits, or becomes 0x7c01 if those are all zero, so that it stays a NaN. */
    const uint32_t payload = (mag >> 13) & 0x3ffu;
    const uint32_t nan = 0x7c00u | payload | static_cast<uint32_t>(payload == 0);
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < 0x38800000);
    const uint32_t is_infinite = 0u - static_cast<uint32_t>(magnitude >= 0x47800000);
    const uint32_t is_nan = 0u - static_cast<uint32_t>(magnitude > 0x7f800000);
    uint32_t half = (subnormal & is_subnormal) | (normal & ~is_subnormal);
    half = (0x7c00u & is_infinite) | (half & ~is_infinite);
    half = (nan & is_nan) | (half & ~is_nan);
    return static_cast<uint16_t>(sign | half);
}

/* binary64 -> binary16, rounded once (as NumPy): the double is first rounded to float32 to odd (toward zero, the
 * last bit set when anything was dropped), which keeps the information a later rounding to 11 bits needs, then
 * rounded to half. Rounding to float32 to nearest instead can land exactly on a half's tie and break it the
 * wrong way. */
inline uint16_t double_to_half(double value) {
    const float nearest = static_cast<float>(value);
    uint32_t bits = float_to_bits(nearest);
    const double back = static_cast<double>(nearest);
    /* inexact (NaN compares unequal too, and stays as it is): step back toward zero if rounded away, mark odd */
    const uint32_t inexact = 0u - static_cast<uint32_t>(back != value && value == value);
    const uint32_t away = 0u - static_cast<uint32_t>((back > value) == (value > 0.0));
    bits -= 1u & inexact & away;
    bits |= 1u & inexact;
    return float_to_half(bits_to_float(bits));
}

/* binary16 -> binary32, exact. */
inline float half_to_float(uint16_t half) {
    const uint32_t h = half;
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t magnitude = h & 0x7fffu;
    const uint32_t exponent = h & 0x7c00u;
    /* normal: rebias the exponent 15 -> 127; infinity / NaN: exponent all ones */
    uint32_t bits = (magnitude << 13) + 0x38000000u;
    const uint32_t is_special = 0u - static_cast<uint32_t>(exponent == 0x7c00u);
    bits += 0x38000000u & is_special;
    /* subnormal or zero: mantissa * 2^-24, exact in float32 */
    const uint32_t tiny = float_to_bits(static_cast<float>(magnitude & 0x3ffu) * 5.9604644775390625e-8f);
    const uint32_t is_tiny = 0u - static_cast<uint32_t>(exponent == 0);
    return bits_to_float(sign | (tiny & is_tiny) | (bits & ~is_tiny));
}

/* A float16 element as the kernels read it from a source: its bits, converted to float32 exactly. */
struct Half {
    uint16_t bits;
    explicit operator float() const { return half_to_float(bits); }
};

}  // namespace emf_half

#endif
