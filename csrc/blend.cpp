/* Blending kernels; see blend.h for the contract. */
#include "blend.h"
#include "half.h"

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
inline void add_row(double *__restrict s, const float *__restrict w, const P *__restrict p, int64_t n) {
    for (int64_t x = 0; x < n; ++x) s[x] += static_cast<double>(w[x]) * static_cast<double>(p[x]);
}

template <>
inline void add_row<uint16_t>(double *__restrict s, const float *__restrict w, const uint16_t *__restrict p,
                              int64_t n) {
    for (int64_t x = 0; x < n; ++x)
        s[x] += static_cast<double>(w[x]) * static_cast<double>(emf_half::half_to_float(p[x]));
}

inline void add_weights(float *__restrict t, const float *__restrict w, int64_t n) {
    for (int64_t x = 0; x < n; ++x) t[x] += w[x];
}

/* A row of constant weight (a broadcast 1 where tiles are cropped, not blended). */
template <typename P>
inline void add_row_constant(double *__restrict s, double w, const P *__restrict p, int64_t n) {
    for (int64_t x = 0; x < n; ++x) s[x] += w * static_cast<double>(p[x]);
}

template <>
inline void add_row_constant<uint16_t>(double *__restrict s, double w, const uint16_t *__restrict p, int64_t n) {
    for (int64_t x = 0; x < n; ++x) s[x] += w * static_cast<double>(emf_half::half_to_float(p[x]));
}

template <typename P>
void add(double *sums, const int64_t ss[4], float *totals, const int64_t ts[3], const float *weight,
         const int64_t ws[3], const void *prediction, const int64_t ps[4], int64_t channels, const int64_t n[3]) {
    const bool rows = ss[3] == sizeof(double) && ps[3] == sizeof(P);
    const bool contiguous = rows && ws[2] == sizeof(float), constant = rows && ws[2] == 0;
    for (int64_t z = 0; z < n[0]; ++z) {
        for (int64_t y = 0; y < n[1]; ++y) {
            const char *w = at(weight, z * ws[0] + y * ws[1]);
            char *t = at(totals, z * ts[0] + y * ts[1]);
            if (ts[2] == sizeof(float) && ws[2] == sizeof(float)) /* the usual rows: vectorised */
                add_weights(reinterpret_cast<float *>(t), reinterpret_cast<const float *>(w), n[2]);
            else
                for (int64_t x = 0; x < n[2]; ++x)
                    *reinterpret_cast<float *>(t + x * ts[2]) += static_cast<float>(load<float>(w + x * ws[2]));
            for (int64_t c = 0; c < channels; ++c) {
                char *s = at(sums, c * ss[0] + z * ss[1] + y * ss[2]);
                const char *p = at(prediction, c * ps[0] + z * ps[1] + y * ps[2]);
                if (contiguous) /* the usual rows: loops the compiler vectorises */
                    add_row(reinterpret_cast<double *>(s), reinterpret_cast<const float *>(w),
                            reinterpret_cast<const P *>(p), n[2]);
                else if (constant)
                    add_row_constant(reinterpret_cast<double *>(s), load<float>(w), reinterpret_cast<const P *>(p),
                                     n[2]);
                else
                    for (int64_t x = 0; x < n[2]; ++x)
                        *reinterpret_cast<double *>(s + x * ss[3]) +=
                            load<float>(w + x * ws[2]) * load<P>(p + x * ps[3]);
            }
        }
    }
}

template <typename Out, typename Convert>
void finish(const double *sums, const float *totals, int64_t channels, int64_t voxels, Out *out,
            Convert convert) {
    for (int64_t c = 0; c < channels; ++c, sums += voxels, out += voxels)
        for (int64_t v = 0; v < voxels; ++v) out[v] = convert(sums[v] / static_cast<double>(totals[v]));
}

}  // namespace

extern "C" {

int emf_blend_add(double *sums, const int64_t sums_strides[4], float *totals, const int64_t totals_strides[3],
                  const float *weight, const int64_t weight_strides[3], const void *prediction,
                  emf_dtype pred_dtype, const int64_t pred_strides[4], int64_t channels, const int64_t shape[3]) {
    switch (pred_dtype) {
        case EMF_FLOAT16:
            add<uint16_t>(sums, sums_strides, totals, totals_strides, weight, weight_strides, prediction,
                          pred_strides, channels, shape);
            return EMF_OK;
        case EMF_FLOAT32:
            add<float>(sums, sums_strides, totals, totals_strides, weight, weight_strides, prediction,
                       pred_strides, channels, shape);
            return EMF_OK;
        case EMF_FLOAT64:
            add<double>(sums, sums_strides, totals, totals_strides, weight, weight_strides, prediction,
                        pred_strides, channels, shape);
            return EMF_OK;
        default:
            return EMF_BAD_DTYPE;
    }
}

int emf_blend_finish(const double *sums, const float *totals, int64_t channels, int64_t voxels,
                     emf_dtype out_dtype, void *out) {
    switch (out_dtype) {
        case EMF_FLOAT32:
            finish(sums, totals, channels, voxels, static_cast<float *>(out),
                   [](double v) { return static_cast<float>(v); });
            return EMF_OK;
        case EMF_FLOAT16:
            finish(sums, totals, channels, voxels, static_cast<uint16_t *>(out),
                   [](double v) { return emf_half::float_to_half(static_cast<float>(v)); });
            return EMF_OK;
        case EMF_UINT8:
            finish(sums, totals, channels, voxels, static_cast<uint8_t *>(out), [](double v) {
                const double clipped = v > 1.0 ? 1.0 : (v >= 0.0 ? v : 0.0); /* NaN -> 0 */
                return static_cast<uint8_t>(std::nearbyint(clipped * 255.0));
            });
            return EMF_OK;
        default:
            return EMF_BAD_DTYPE;
    }
}

}  // extern "C"
