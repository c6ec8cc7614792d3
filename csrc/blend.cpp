/* Blending kernels; see blend.h for the contract. */
#include "blend.h"
#include "half.h"
#include "vector.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

template <typename T>
inline double load(const char *p) {
    T value;
    std::memcpy(&value, p, sizeof value);
    return static_cast<double>(value);
}

template <>
inline double load<uint16_t>(const char *p) { /* float16 bits */
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return static_cast<double>(emf_half::half_to_float(bits));
}

inline char *at(void *base, int64_t offset) { return static_cast<char *>(base) + offset; }
inline const char *at(const void *base, int64_t offset) { return static_cast<const char *>(base) + offset; }

template <typename P>
inline double value(const P *p, int64_t x) { return static_cast<double>(p[x]); }

template <>
inline double value<uint16_t>(const uint16_t *p, int64_t x) {
    return static_cast<double>(emf_half::half_to_float(p[x]));
}

/* Contiguous rows, loops the compiler vectorises: assigned in [from, to) or added. */
template <typename P>
inline void add_row(double *__restrict s, double wzy, const double *__restrict wx, const P *__restrict p,
                    int64_t from, int64_t to) {
    for (int64_t x = from; x < to; ++x) s[x] += (wzy * wx[x]) * value(p, x);
}

template <typename P>
inline void set_row(double *__restrict s, double wzy, const double *__restrict wx, const P *__restrict p,
                    int64_t from, int64_t to) {
    for (int64_t x = from; x < to; ++x) s[x] = (wzy * wx[x]) * value(p, x);
}

/* Rows y with (row + y) % parts == part only (row: the block row of y = 0), so that threads may share a block. */
template <typename P>
void add(const emf_blend_tile &t, int64_t part, int64_t parts) {
    const int64_t *ss = t.sums_strides, *ps = t.pred_strides, *n = t.shape, *low = t.first_low, *high = t.first_high;
    const double *wz = t.wz, *wy = t.wy, *wx = t.wx;
    const bool rows = ss[3] == sizeof(double) && ps[3] == sizeof(P);
    const int64_t first_row = ((part - t.row) % parts + parts) % parts;
    for (int64_t z = 0; z < n[0]; ++z) {
        const bool first_z = z >= low[0] && z < high[0];
        for (int64_t y = first_row; y < n[1]; y += parts) {
            const double wzy = wz[z] * wy[y];
            const bool first = first_z && y >= low[1] && y < high[1] && low[2] < high[2];
            const int64_t from = first ? low[2] : n[2], to = first ? high[2] : n[2];  /* assigned in [from, to) */
            for (int64_t c = 0; c < t.channels; ++c) {
                char *s = at(t.sums, c * ss[0] + z * ss[1] + y * ss[2]);
                const char *p = at(t.prediction, c * ps[0] + z * ps[1] + y * ps[2]);
                if (rows) {
                    double *sums_row = reinterpret_cast<double *>(s);
                    const P *values = reinterpret_cast<const P *>(p);
                    add_row(sums_row, wzy, wx, values, 0, from);
                    set_row(sums_row, wzy, wx, values, from, to);
                    add_row(sums_row, wzy, wx, values, to, n[2]);
                    continue;
                }
                for (int64_t x = 0; x < n[2]; ++x) {
                    double *target = reinterpret_cast<double *>(s + x * ss[3]);
                    const double term = (wzy * wx[x]) * load<P>(p + x * ps[3]);
                    *target = (x >= from && x < to) ? term : *target + term;
                }
            }
        }
    }
}

/* keep[c, z, y, x] = kept_from[c, z, y, x] for the rows y % parts == part of the tile: contiguous rows by memcpy. */
void copy_rows(const emf_blend_tile &t, int64_t part, int64_t parts) {
    const int64_t *n = t.keep_shape, *ks = t.keep_strides, *fs = t.from_strides;
    const bool rows = ks[3] == t.item_size && fs[3] == t.item_size;
    for (int64_t c = 0; c < n[0]; ++c) {
        for (int64_t z = 0; z < n[1]; ++z) {
            for (int64_t y = part; y < n[2]; y += parts) {
                char *to = at(t.keep, c * ks[0] + z * ks[1] + y * ks[2]);
                const char *from = at(t.kept_from, c * fs[0] + z * fs[1] + y * fs[2]);
                if (rows) {
                    std::memcpy(to, from, static_cast<size_t>(n[3] * t.item_size));
                    continue;
                }
                for (int64_t x = 0; x < n[3]; ++x) std::memcpy(to + x * ks[3], from + x * fs[3], t.item_size);
            }
        }
    }
}

/* Whether a double is NaN or infinite: its exponent bits all set. */
inline bool is_special(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

/* Whether a converted row may hold a NaN or an infinity, from its elements' exponent bits (a test that
 * vectorises, on the row just written): float32 and float16 keep both; a float16 infinity may also be a finite
 * value beyond its range. uint8 holds neither (NaN is written as 0): never. */
inline bool may_be_special(const float *o, int64_t n) {
    uint32_t found = 0;
    for (int64_t x = 0; x < n; ++x) {
        uint32_t bits;
        std::memcpy(&bits, o + x, sizeof bits);
        found |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    return found != 0;
}

inline bool may_be_special(const uint16_t *o, int64_t n) {
    uint32_t found = 0;
    for (int64_t x = 0; x < n; ++x) found |= static_cast<uint32_t>((o[x] & 0x7c00u) == 0x7c00u);
    return found != 0;
}

inline bool may_be_special(const uint8_t *, int64_t) { return false; }

/* Converts a row; returns how many of its blended values are NaN or infinite (what the model returned: the
 * weights are finite and positive), counted on the doubles only in a row whose output may hold one. uint8
 * outputs count nothing here (their NaN are counted with the values clipped). */
template <typename Out, typename Convert>
inline int64_t finish_row(const double *__restrict s, double tzy, const double *__restrict tx, Out *__restrict o,
                          int64_t n, Convert convert) {
    for (int64_t x = 0; x < n; ++x) o[x] = convert(s[x] / (tzy * tx[x]));
    if (!may_be_special(o, n)) return 0;
    int64_t count = 0;
    for (int64_t x = 0; x < n; ++x) count += static_cast<int64_t>(is_special(s[x] / (tzy * tx[x])));
    return count;
}

template <typename Out, typename Convert>
int64_t finish(const double *sums, const double *tz, const double *ty, const double *tx, double count,
               int64_t channels, const int64_t n[3], Out *out, Convert convert) {
    const int64_t plane = n[1] * n[2], voxels = n[0] * plane;
    int64_t non_finite = 0;
    for (int64_t z = 0; z < n[0]; ++z) {
        for (int64_t y = 0; y < n[1]; ++y) {
            const double tzy = (count * tz[z]) * ty[y];
            for (int64_t c = 0; c < channels; ++c) {
                const int64_t row = c * voxels + z * plane + y * n[2];
                non_finite += finish_row(sums + row, tzy, tx, out + row, n[2], convert);
            }
        }
    }
    return non_finite;
}

int blend_tiles(const emf_blend_tile *tiles, int64_t count, int64_t part, int64_t parts) {
    for (int64_t i = 0; i < count; ++i) {
        const emf_blend_tile &t = tiles[i];
        if (t.keep != nullptr) copy_rows(t, part, parts);
        switch (t.pred_dtype) {
            case EMF_FLOAT16:
                add<uint16_t>(t, part, parts);
                break;
            case EMF_FLOAT32:
                add<float>(t, part, parts);
                break;
            case EMF_FLOAT64:
                add<double>(t, part, parts);
                break;
            default:
                return EMF_BAD_DTYPE;
        }
    }
    return EMF_OK;
}

int blend_finish(const double *sums, const double *tz, const double *ty, const double *tx, double count,
                 int64_t channels, const int64_t shape[3], emf_dtype out_dtype, void *out, int64_t *non_finite) {
    switch (out_dtype) {
        case EMF_FLOAT32:
            *non_finite = finish(sums, tz, ty, tx, count, channels, shape, static_cast<float *>(out),
                   [](double v) { return static_cast<float>(v); });
            return EMF_OK;
        case EMF_FLOAT16:
            *non_finite = finish(sums, tz, ty, tx, count, channels, shape, static_cast<uint16_t *>(out),
                   [](double v) { return emf_half::double_to_half(v); });
            return EMF_OK;
        case EMF_UINT8:
            *non_finite = finish(sums, tz, ty, tx, count, channels, shape, static_cast<uint8_t *>(out), [](double v) {
                const double clipped = v > 1.0 ? 1.0 : (v >= 0.0 ? v : 0.0); /* NaN -> 0 */
                return static_cast<uint8_t>(std::nearbyint(clipped * 255.0));
            });
            return EMF_OK;
        default:
            return EMF_BAD_DTYPE;
    }
}

emf_vector::Avx2Switch avx2_switch;

#ifdef EMF_HAVE_AVX2_BUILD
EMF_AVX2_BUILD int blend_tiles_avx2(const emf_blend_tile *tiles, int64_t count, int64_t part, int64_t parts) {
    return blend_tiles(tiles, count, part, parts);
}

EMF_AVX2_BUILD int blend_finish_avx2(const double *sums, const double *tz, const double *ty, const double *tx,
                                     double count, int64_t channels, const int64_t shape[3], emf_dtype out_dtype,
                                     void *out, int64_t *non_finite) {
    return blend_finish(sums, tz, ty, tx, count, channels, shape, out_dtype, out, non_finite);
}
#endif

}  // namespace

extern "C" {

void emf_blend_allow_avx2(int allowed) { avx2_switch.allow(allowed); }

int emf_blend_uses_avx2(void) {
#ifdef EMF_HAVE_AVX2_BUILD
    return avx2_switch.used();
#else
    return 0;
#endif
}

int emf_blend_tiles(const emf_blend_tile *tiles, int64_t count, int64_t part, int64_t parts) {
#ifdef EMF_HAVE_AVX2_BUILD
    if (avx2_switch.used()) return blend_tiles_avx2(tiles, count, part, parts);
#endif
    return blend_tiles(tiles, count, part, parts);
}

int emf_blend_finish(const double *sums, const double *tz, const double *ty, const double *tx, double count,
                     int64_t channels, const int64_t shape[3], emf_dtype out_dtype, void *out, int64_t *non_finite) {
#ifdef EMF_HAVE_AVX2_BUILD
    if (avx2_switch.used())
        return blend_finish_avx2(sums, tz, ty, tx, count, channels, shape, out_dtype, out, non_finite);
#endif
    return blend_finish(sums, tz, ty, tx, count, channels, shape, out_dtype, out, non_finite);
}

}  // extern "C"
