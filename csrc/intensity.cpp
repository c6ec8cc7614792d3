/* Pixel-wise augmentation kernels; see intensity.h for the contract.
 *
 * Every kernel walks its blocks in order and works on float32 runs: float32 blocks in place, float16 blocks
 * through a float32 buffer of kChunk elements. Inner loops are written without branches so that they vectorise
 * (SSE2 at -O3): Box-Muller uses polynomial log/sin/cos instead of libm calls, and the blur accumulates whole
 * rows (y and z passes) or a padded copy of one row (x pass).
 */
#include "intensity.h"
#include "half.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "philox.h"

#if defined(__SSE__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 1)
#include <xmmintrin.h>
#define EMF_HAVE_SSE 1
#endif

namespace {

using emf_half::bits_to_float;
using emf_half::float_to_bits;
using emf_half::float_to_half;
using emf_half::half_to_float;

/* Elements per float32 run of a float16 block; a multiple of 8, so that noise runs start on a Philox block. */
constexpr int64_t kChunk = 4096;
/* Normals made per step of the noise kernel: a multiple of 8 dividing kChunk. */
constexpr int64_t kBatch = 512;
constexpr int64_t kPairs = kBatch / 2;

/* Calls op(run, n, offset) on float32 runs covering block b, offset = position of the run in the block. Runs
 * never cross a multiple of `row` elements (a whole float32 block is one run when row = size); float16 runs are
 * at most kChunk long, start at multiples of kChunk within a row, and with writeback are rounded back into the
 * block afterwards. */
template <typename Op>
void for_runs(const emf_blocks &blocks, int64_t b, int64_t row, bool writeback, Op op) {
    const int64_t start = blocks.index[b] * blocks.size;
    if (blocks.dtype == EMF_FLOAT32) {
        float *data = static_cast<float *>(blocks.data) + start;
        for (int64_t offset = 0; offset < blocks.size; offset += row) op(data + offset, row, offset);
        return;
    }
    uint16_t *half = static_cast<uint16_t *>(blocks.data) + start;
    float run[kChunk];
    for (int64_t row_start = 0; row_start < blocks.size; row_start += row) {
        for (int64_t offset = row_start; offset < row_start + row; offset += kChunk) {
            const int64_t n = std::min(kChunk, row_start + row - offset);
            for (int64_t i = 0; i < n; ++i) run[i] = half_to_float(half[offset + i]);
            op(run, n, offset);
            if (writeback)
                for (int64_t i = 0; i < n; ++i) half[offset + i] = float_to_half(run[i]);
        }
    }
}

/* ln(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t), t = (m - 1) / (m + 1). */
inline float log_unit(float u) {
    const uint32_t bits = float_to_bits(u);
    int32_t e = static_cast<int32_t>(bits >> 23) - 127;
    float m = bits_to_float((bits & 0x7fffffu) | 0x3f800000u);
    const int32_t high = m > 1.41421356f;
    m *= bits_to_float(0x3f800000u - (static_cast<uint32_t>(high) << 23)); /* 1 or 1/2 */
    e += high;
    const float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    const float series = 1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9))));
    return static_cast<float>(e) * 0.693147181f + 2.0f * t * series;
}

/* x[i] = sqrt(x[i]) for the kPairs elements x[i] >= 0: SSE's sqrtps where available, as the compiler will not
 * vectorise std::sqrt (it may have to set errno). */
inline void sqrt_pairs(float *x) {
    static_assert(kPairs % 4 == 0, "whole SSE registers");
#ifdef EMF_HAVE_SSE
    for (int64_t i = 0; i < kPairs; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#else
    for (int64_t i = 0; i < kPairs; ++i) x[i] = std::sqrt(x[i]);
#endif
}

/* kBatch standard normals by Box-Muller from kPairs pairs of 32-bit words: out[p] (cosine) and out[kPairs + p]
 * (sine) from (a[p], b[p]). The angle's top two bits pick a quarter turn q, the next 22 a point t in
 * [-pi/4, pi/4) where sine and cosine are short series; (cos, sin)(q pi/2 + t) is then a swap and sign flips.
 * Branch-free, so that the loops vectorise. */
void normals(const uint32_t *a, const uint32_t *b, float *out) {
    alignas(16) float radius[kPairs];
    for (int64_t p = 0; p < kPairs; ++p) {
        const float u = 1.0f - static_cast<float>(a[p] >> 8) * 5.9604644775390625e-8f; /* (0, 1] */
        radius[p] = -2.0f * log_unit(u);
    }
    sqrt_pairs(radius);
    for (int64_t p = 0; p < kPairs; ++p) {
        const float t =
            (static_cast<float>((b[p] >> 8) & 0x3fffffu) * 2.384185791015625e-7f - 0.5f) * 1.57079633f;
        const float t2 = t * t;
        const float sin_t = t * (1.0f - t2 / 6 * (1.0f - t2 / 20 * (1.0f - t2 / 42 * (1.0f - t2 / 72))));
        const float cos_t = 1.0f - t2 / 2 * (1.0f - t2 / 12 * (1.0f - t2 / 30 * (1.0f - t2 / 56)));
        const uint32_t q = b[p] >> 30;
        const uint32_t swap = 0u - (q & 1u);
        const uint32_t c = float_to_bits(cos_t), s = float_to_bits(sin_t);
        const uint32_t first = (s & swap) | (c & ~swap), second = (c & swap) | (s & ~swap);
        /* q = 1, 2: the first is negated; q = 2, 3: the second */
        const uint32_t sign_first = ((q ^ (q >> 1)) & 1u) << 31, sign_second = (q >> 1) << 31;
        out[p] = radius[p] * bits_to_float(first ^ sign_first);
        out[kPairs + p] = radius[p] * bits_to_float(second ^ sign_second);
    }
}

/* scipy.ndimage's mode "reflect": index i of a line of n, mirrored about the outer faces, period 2n. */
inline int64_t reflect(int64_t i, int64_t n) {
    const int64_t period = 2 * n;
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - 1 - i;
}

/* out[x] = w[0] c[x] + sum_k w[k] (lo_k[x] + hi_k[x]): one output row of a y or z pass from whole input rows. */
inline void combine_rows(float *out, const float *const *lo, const float *const *hi, const float *centre,
                         const float *w, int64_t radius, int64_t n) {
    for (int64_t x = 0; x < n; ++x) out[x] = w[0] * centre[x];
    for (int64_t k = 1; k <= radius; ++k) {
        const float wk = w[k];
        const float *a = lo[k], *b = hi[k];
        for (int64_t x = 0; x < n; ++x) out[x] += wk * (a[x] + b[x]);
    }
}

/* The blur of one float32 volume of shape (nz, ny, nx), in place. tmp holds nz * ny * nx floats if z is
 * filtered, else ny * nx; pad holds nx + 2 radius; lo/hi hold radius + 1 pointers. */
void blur_volume(float *vol, const int64_t shape[3], const float *w, int64_t radius, bool along_z, float *tmp,
                 float *pad, const float **lo, const float **hi) {
    const int64_t nz = shape[0], ny = shape[1], nx = shape[2], plane = ny * nx;
    if (along_z) {
        std::memcpy(tmp, vol, sizeof(float) * nz * plane);
        for (int64_t z = 0; z < nz; ++z) {
            for (int64_t k = 1; k <= radius; ++k) {
                lo[k] = tmp + reflect(z - k, nz) * plane;
                hi[k] = tmp + reflect(z + k, nz) * plane;
            }
            combine_rows(vol + z * plane, lo, hi, tmp + z * plane, w, radius, plane);
        }
    }
    for (int64_t z = 0; z < nz; ++z) {
        float *section = vol + z * plane;
        std::memcpy(tmp, section, sizeof(float) * plane);
        for (int64_t y = 0; y < ny; ++y) {
            for (int64_t k = 1; k <= radius; ++k) {
                lo[k] = tmp + reflect(y - k, ny) * nx;
                hi[k] = tmp + reflect(y + k, ny) * nx;
            }
            combine_rows(section + y * nx, lo, hi, tmp + y * nx, w, radius, nx);
        }
        for (int64_t y = 0; y < ny; ++y) {
            float *row = section + y * nx;
            for (int64_t i = 0; i < nx + 2 * radius; ++i) pad[i] = row[reflect(i - radius, nx)];
            const float *centre = pad + radius;
            for (int64_t x = 0; x < nx; ++x) row[x] = w[0] * centre[x];
            for (int64_t k = 1; k <= radius; ++k) {
                const float wk = w[k];
                for (int64_t x = 0; x < nx; ++x) row[x] += wk * (centre[x - k] + centre[x + k]);
            }
        }
    }
}

/* One run of emf_blend; a contiguous source row (step 1, the usual case) gets its own loop, which vectorises. */
template <typename T>
inline void blend_run(float *x, int64_t n, const T *in, int64_t step, const emf_source &src, float keep, float a) {
    if (step == 1) {
        for (int64_t i = 0; i < n; ++i) x[i] = x[i] * keep + (static_cast<float>(in[i]) * src.scale + src.shift) * a;
    } else {
        for (int64_t i = 0; i < n; ++i)
            x[i] = x[i] * keep + (static_cast<float>(in[i * step]) * src.scale + src.shift) * a;
    }
}

template <typename T>
void fill_planes(const emf_planes &planes, T fill) {
    const int64_t size = planes.height * planes.width;
    T *data = static_cast<T *>(planes.data);
    for (int64_t p = 0; p < planes.count; ++p) std::fill_n(data + planes.index[p] * size, size, fill);
}

template <typename T>
void shift_planes(const emf_planes &planes, const int64_t *shift, T fill) {
    const int64_t h = planes.height, w = planes.width, size = h * w;
    T *data = static_cast<T *>(planes.data);
    for (int64_t p = 0; p < planes.count; ++p) {
        T *plane = data + planes.index[p] * size;
        const int64_t dy = shift[2 * p], dx = shift[2 * p + 1];
        /* destination columns [x0, x1) read source columns [x0 - dx, x1 - dx) */
        const int64_t x0 = std::min(w, std::max<int64_t>(0, dx)), x1 = std::max(x0, std::min(w, w + dx));
        /* rows are visited so that a source row is read before it is overwritten */
        for (int64_t step = 0; step < h; ++step) {
            const int64_t y = dy > 0 ? h - 1 - step : step;
            T *row = plane + y * w;
            const int64_t source = y - dy;
            if (source < 0 || source >= h) {
                std::fill_n(row, w, fill);
                continue;
            }
            std::memmove(row + x0, plane + source * w + x0 - dx, sizeof(T) * static_cast<size_t>(x1 - x0));
            std::fill_n(row, x0, fill);
            std::fill_n(row + x1, w - x1, fill);
        }
    }
}

}  // namespace

extern "C" {

void emf_gamma(const emf_blocks *blocks, const float *gamma) {
    for (int64_t b = 0; b < blocks->count; ++b) {
        const float g = gamma[b];
        for_runs(*blocks, b, blocks->size, true, [g](float *x, int64_t n, int64_t) {
            for (int64_t i = 0; i < n; ++i) x[i] = std::copysign(std::pow(std::fabs(x[i]), g), x[i]);
        });
    }
}

void emf_contrast(const emf_blocks *blocks, const float *factor) {
    for (int64_t b = 0; b < blocks->count; ++b) {
        double lane[4] = {0.0, 0.0, 0.0, 0.0};
        for_runs(*blocks, b, blocks->size, false, [&lane](float *x, int64_t n, int64_t offset) {
            /* runs start at multiples of kChunk (or 0), so element i of a run is in lane (offset + i) % 4 = i % 4 */
            (void)offset;
            int64_t i = 0;
            for (; i + 4 <= n; i += 4)
                for (int j = 0; j < 4; ++j) lane[j] += static_cast<double>(x[i + j]);
            for (int j = 0; i < n; ++i, ++j) lane[j] += static_cast<double>(x[i]);
        });
        const float mean = static_cast<float>(((lane[0] + lane[1]) + (lane[2] + lane[3])) /
                                              static_cast<double>(blocks->size));
        const float f = factor[b];
        for_runs(*blocks, b, blocks->size, true, [mean, f](float *x, int64_t n, int64_t) {
            for (int64_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * f + mean;
        });
    }
}

void emf_noise(const emf_blocks *blocks, const float *sigma, const uint64_t *keys) {
    constexpr int64_t kCounters = kBatch / 8;
    for (int64_t b = 0; b < blocks->count; ++b) {
        const uint64_t key[2] = {keys[b], EMF_NOISE_TAG};
        const float s = sigma[b];
        for_runs(*blocks, b, blocks->size, true, [&key, s](float *x, int64_t n, int64_t offset) {
            alignas(16) uint32_t lo[kPairs], hi[kPairs];
            alignas(16) float g[kBatch];
            for (int64_t start = 0; start < n; start += kBatch) {
                const uint64_t group = static_cast<uint64_t>((offset + start) / kBatch);
                for (int64_t j = 0; j < kCounters; ++j) {
                    const uint64_t counter[4] = {group * kCounters + j, 0, 0, 0};
                    uint64_t block[4];
                    emf_philox4x64(key, counter, block);
                    for (int q = 0; q < 4; ++q) {
                        lo[4 * j + q] = static_cast<uint32_t>(block[q]);
                        hi[4 * j + q] = static_cast<uint32_t>(block[q] >> 32);
                    }
                }
                normals(lo, hi, g);
                const int64_t m = std::min(kBatch, n - start);
                float *out = x + start;
                for (int64_t i = 0; i < m; ++i) out[i] += s * g[i];
            }
        });
    }
}

int emf_blur(const emf_blocks *blocks, const int64_t shape[3], const double *sigma, int per_section,
             double truncate) {
    const int64_t plane = shape[1] * shape[2], volume = shape[0] * plane;
    try {
        std::vector<float> work, tmp, pad, weights;
        std::vector<const float *> lo, hi;
        for (int64_t b = 0; b < blocks->count; ++b) {
            const double s = sigma[b];
            const int64_t radius = static_cast<int64_t>(truncate * s + 0.5);
            if (radius == 0) continue; /* the kernel is [1]: scipy returns the input */
            std::vector<double> phi(radius + 1);
            double total = 0.0;
            for (int64_t k = 0; k <= radius; ++k) {
                phi[k] = std::exp(-0.5 / (s * s) * static_cast<double>(k * k));
                total += k == 0 ? phi[k] : 2.0 * phi[k];
            }
            weights.resize(radius + 1);
            for (int64_t k = 0; k <= radius; ++k) weights[k] = static_cast<float>(phi[k] / total);
            const bool along_z = !per_section && shape[0] > 1;
            tmp.resize(along_z ? volume : plane);
            pad.resize(shape[2] + 2 * radius);
            lo.resize(radius + 1);
            hi.resize(radius + 1);
            float *vol;
            uint16_t *half = nullptr;
            if (blocks->dtype == EMF_FLOAT32) {
                vol = static_cast<float *>(blocks->data) + blocks->index[b] * volume;
            } else {
                half = static_cast<uint16_t *>(blocks->data) + blocks->index[b] * volume;
                work.resize(volume);
                for (int64_t i = 0; i < volume; ++i) work[i] = half_to_float(half[i]);
                vol = work.data();
            }
            blur_volume(vol, shape, weights.data(), radius, along_z, tmp.data(), pad.data(), lo.data(), hi.data());
            if (half != nullptr)
                for (int64_t i = 0; i < volume; ++i) half[i] = float_to_half(work[i]);
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

void emf_blend(const emf_blocks *blocks, int64_t width, const emf_source *source, const int64_t *origin,
               const float *alpha) {
    const emf_source src = *source;
    for (int64_t b = 0; b < blocks->count; ++b) {
        const float a = alpha[b], keep = 1.0f - a;
        for_runs(*blocks, b, width, true, [&](float *x, int64_t n, int64_t offset) {
            const int64_t first = origin[b] + (offset / width) * src.steps[0] + (offset % width) * src.steps[1];
            if (src.is_uint8)
                blend_run(x, n, static_cast<const uint8_t *>(src.data) + first, src.steps[1], src, keep, a);
            else
                blend_run(x, n, static_cast<const float *>(src.data) + first, src.steps[1], src, keep, a);
        });
    }
}

void emf_fill_planes(const emf_planes *planes, uint64_t fill) {
    switch (planes->itemsize) {
        case 1: fill_planes(*planes, static_cast<uint8_t>(fill)); break;
        case 2: fill_planes(*planes, static_cast<uint16_t>(fill)); break;
        case 4: fill_planes(*planes, static_cast<uint32_t>(fill)); break;
        default: fill_planes(*planes, fill); break;
    }
}

void emf_shift_planes(const emf_planes *planes, const int64_t *shift, uint64_t fill) {
    switch (planes->itemsize) {
        case 1: shift_planes(*planes, shift, static_cast<uint8_t>(fill)); break;
        case 2: shift_planes(*planes, shift, static_cast<uint16_t>(fill)); break;
        case 4: shift_planes(*planes, shift, static_cast<uint32_t>(fill)); break;
        default: shift_planes(*planes, shift, fill); break;
    }
}

void emf_section_uniforms(const uint64_t *keys, int64_t count, int64_t sections, int64_t draws, uint64_t tag,
                          double *out) {
    for (int64_t n = 0; n < count; ++n) {
        const uint64_t key[2] = {keys[n], tag};
        for (int64_t s = 0; s < sections; ++s) {
            for (int64_t d = 0; d < draws; d += 4) {
                const uint64_t counter[4] = {static_cast<uint64_t>(d / 4), static_cast<uint64_t>(s), 0, 0};
                uint64_t block[4];
                emf_philox4x64(key, counter, block);
                for (int64_t i = 0; i < 4 && d + i < draws; ++i)
                    out[(n * sections + s) * draws + d + i] =
                        static_cast<double>(block[i] >> 11) * (1.0 / 9007199254740992.0);
            }
        }
    }
}

}  // extern "C"
