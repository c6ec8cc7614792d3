/* Resampling kernels for fields at other voxel sizes; see rescale.h for the contract. */
#include "rescale.h"
#include "half.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline const char *at(const void *base, int64_t offset) { return static_cast<const char *>(base) + offset; }

/* Nearest neighbour for elements of type T (an unsigned integer of the element's size: bits are copied). A plane
 * or row reading the same source plane or row as the one before (a coarser field repeats each of its voxels) is a
 * copy of the output just written. */
template <typename T>
void nearest(const void *src, const int64_t s[4], int64_t channels, const int64_t *iz, const int64_t *iy,
             const int64_t *ix, const int64_t n[3], void *out) {
    T *o = static_cast<T *>(out);
    const int64_t row_size = n[2], plane_size = n[1] * n[2];
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t z = 0; z < n[0]; ++z) {
            if (z > 0 && iz[z] == iz[z - 1]) {
                std::memcpy(o, o - plane_size, static_cast<size_t>(plane_size) * sizeof(T));
                o += plane_size;
                continue;
            }
            for (int64_t y = 0; y < n[1]; ++y) {
                if (y > 0 && iy[y] == iy[y - 1]) {
                    std::memcpy(o, o - row_size, static_cast<size_t>(row_size) * sizeof(T));
                    o += row_size;
                    continue;
                }
                const char *row = at(src, c * s[0] + iz[z] * s[1] + iy[y] * s[2]);
                for (int64_t x = 0; x < n[2]; ++x) {
                    T value;
                    std::memcpy(&value, row + ix[x] * s[3], sizeof value);
                    *o++ = value;
                }
            }
        }
}

template <typename T>
inline double load(const char *p) {
    T value;
    std::memcpy(&value, p, sizeof value);
    return static_cast<double>(value);
}

/* Tags for the two 16-bit element types, whose bits a uint16_t cannot tell apart. */
struct Half {};
template <>
inline double load<Half>(const char *p) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return static_cast<double>(emf_half::half_to_float(bits));
}

struct U16 {};
template <>
inline double load<U16>(const char *p) {
    uint16_t value;
    std::memcpy(&value, p, sizeof value);
    return static_cast<double>(value);
}

/* One source row blended along z and y into a double row, then interpolated along x. */
template <typename T>
void linear(const void *src, const int64_t s[4], int64_t channels, const int64_t *lz, const int64_t *hz,
            const double *wz, const int64_t *ly, const int64_t *hy, const double *wy, const int64_t *lx,
            const int64_t *hx, const double *wx, const int64_t n[3], float *out, int64_t source_x) {
    std::vector<double> row(static_cast<size_t>(source_x));
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t z = 0; z < n[0]; ++z)
            for (int64_t y = 0; y < n[1]; ++y) {
                const char *r[4] = {at(src, c * s[0] + lz[z] * s[1] + ly[y] * s[2]),
                                    at(src, c * s[0] + lz[z] * s[1] + hy[y] * s[2]),
                                    at(src, c * s[0] + hz[z] * s[1] + ly[y] * s[2]),
                                    at(src, c * s[0] + hz[z] * s[1] + hy[y] * s[2])};
                const double a = wz[z], b = wy[y];
                for (int64_t x = 0; x < source_x; ++x) {
                    const int64_t step = x * s[3];
                    const double low = (1.0 - b) * load<T>(r[0] + step) + b * load<T>(r[1] + step);
                    const double high = (1.0 - b) * load<T>(r[2] + step) + b * load<T>(r[3] + step);
                    row[static_cast<size_t>(x)] = (1.0 - a) * low + a * high;
                }
                for (int64_t x = 0; x < n[2]; ++x)
                    *out++ = static_cast<float>((1.0 - wx[x]) * row[static_cast<size_t>(lx[x])] +
                                                wx[x] * row[static_cast<size_t>(hx[x])]);
            }
}

}  // namespace

extern "C" int emf_rescale_nearest(const void *src, const int64_t src_strides[4], int64_t elem_size,
                                   int64_t channels, const int64_t *index_z, const int64_t *index_y,
                                   const int64_t *index_x, const int64_t shape[3], void *out) {
    switch (elem_size) {
        case 1: nearest<uint8_t>(src, src_strides, channels, index_z, index_y, index_x, shape, out); break;
        case 2: nearest<uint16_t>(src, src_strides, channels, index_z, index_y, index_x, shape, out); break;
        case 4: nearest<uint32_t>(src, src_strides, channels, index_z, index_y, index_x, shape, out); break;
        case 8: nearest<uint64_t>(src, src_strides, channels, index_z, index_y, index_x, shape, out); break;
        default: return EMF_BAD_DTYPE;
    }
    return EMF_OK;
}

extern "C" int emf_rescale_linear(const void *src, emf_dtype src_dtype, const int64_t src_strides[4],
                                  int64_t channels, const int64_t *lo_z, const int64_t *hi_z, const double *w_z,
                                  const int64_t *lo_y, const int64_t *hi_y, const double *w_y,
                                  const int64_t *lo_x, const int64_t *hi_x, const double *w_x,
                                  const int64_t shape[3], float *out) {
    if (shape[2] == 0) return EMF_OK;
    /* The x extent of source the tables reach: rows are blended along z and y up to there. */
    int64_t source_x = 0;
    for (int64_t x = 0; x < shape[2]; ++x) source_x = hi_x[x] + 1 > source_x ? hi_x[x] + 1 : source_x;
    for (int64_t x = 0; x < shape[2]; ++x) source_x = lo_x[x] + 1 > source_x ? lo_x[x] + 1 : source_x;
    try {
        switch (src_dtype) {
#define EMF_LINEAR(T) linear<T>(src, src_strides, channels, lo_z, hi_z, w_z, lo_y, hi_y, w_y, lo_x, hi_x, w_x, \
                                shape, out, source_x)
            case EMF_UINT8: EMF_LINEAR(uint8_t); break;
            case EMF_UINT16: EMF_LINEAR(U16); break;
            case EMF_UINT32: EMF_LINEAR(uint32_t); break;
            case EMF_UINT64: EMF_LINEAR(uint64_t); break;
            case EMF_INT64: EMF_LINEAR(int64_t); break;
            case EMF_FLOAT16: EMF_LINEAR(Half); break;
            case EMF_FLOAT32: EMF_LINEAR(float); break;
            case EMF_FLOAT64: EMF_LINEAR(double); break;
#undef EMF_LINEAR
            default: return EMF_BAD_DTYPE;
        }
    } catch (...) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}
