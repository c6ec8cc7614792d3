/* Label -> target kernels; see targets.h for the contract.
 *
 * Every target is produced one output row (fixed patch, z, y) at a time, all channels of a row before the next
 * row, so each label row is read from memory once. A neighbour at a fixed offset is the row at a fixed element
 * distance, so each comparison runs over two contiguous runs; which part of a row has its neighbour inside the
 * patch is worked out once per row and channel (affinities) or shift (boundaries), never per voxel.
 *
 * Row loops compare 16 labels per step in SSE2 registers: equality of 64-bit labels is the AND of the equality
 * of their two 32-bit halves, and per-label results are narrowed to 32-bit lanes (float 0 / 1 outputs) or packed
 * to bytes (uint8 outputs). Without SSE2, and for the tail of each row, plain loops do the same.
 */
#include "targets.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define EMF_HAVE_SSE2 1
#endif

namespace {

/* Geometry of one batch: label strides and output extent. */
struct Geometry {
    int64_t shape[3], margin[3], out[3];
    int64_t stride_z, stride_y;   /* label elements per z and y step */
    int64_t patch_size, out_size; /* elements of one label patch, of one output channel */

    explicit Geometry(const emf_labels &labels) {
        for (int a = 0; a < 3; ++a) {
            shape[a] = labels.shape[a];
            margin[a] = labels.margin[a];
            out[a] = shape[a] - 2 * margin[a];
        }
        stride_y = shape[2];
        stride_z = shape[1] * shape[2];
        patch_size = shape[0] * stride_z;
        out_size = out[0] * out[1] * out[2];
    }

    /* Label element of output voxel (z, y, 0) of a patch. */
    int64_t row(int64_t z, int64_t y) const {
        return (z + margin[0]) * stride_z + (y + margin[1]) * stride_y + margin[2];
    }
};

/* Labels per SIMD step of the row loops. */
constexpr int64_t kStep = 16;

#ifdef EMF_HAVE_SSE2
/* Four consecutive labels in registers; eq() gives one all-ones / all-zeros 32-bit lane per label. */
template <typename T>
struct Four;

template <>
struct Four<uint32_t> {
    __m128i v;
    static Four load(const uint32_t *p) { return {_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))}; }
    static Four splat(uint32_t x) { return {_mm_set1_epi32(static_cast<int>(x))}; }
    __m128i eq(const Four &o) const { return _mm_cmpeq_epi32(v, o.v); }
};

template <>
struct Four<uint64_t> {
    __m128i lo, hi; /* labels 0, 1 and 2, 3 */
    static Four load(const uint64_t *p) {
        return {_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)),
                _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 2))};
    }
    static Four splat(uint64_t x) {
        const __m128i v = _mm_set1_epi64x(static_cast<long long>(x));
        return {v, v};
    }
    __m128i eq(const Four &o) const {
        /* 32-bit halves equal -> even and odd lanes of each label, gathered from both registers and ANDed */
        const __m128 a = _mm_castsi128_ps(_mm_cmpeq_epi32(lo, o.lo));
        const __m128 b = _mm_castsi128_ps(_mm_cmpeq_epi32(hi, o.hi));
        return _mm_castps_si128(_mm_and_ps(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                           _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
    }
};

/* 16 lanes of all-ones / zeros (four registers of four) -> 16 bytes of 0 / 1. */
inline __m128i bytes_of(const __m128i lanes[4]) {
    const __m128i packed = _mm_packs_epi16(_mm_packs_epi32(lanes[0], lanes[1]), _mm_packs_epi32(lanes[2], lanes[3]));
    return _mm_and_si128(packed, _mm_set1_epi8(1));
}

inline void store_bytes(uint8_t *out, const __m128i lanes[4]) {
    _mm_storeu_si128(reinterpret_cast<__m128i *>(out), bytes_of(lanes));
}

/* 16 lanes -> float 0.0f / 1.0f, or bytes 0 / 1. (Plain stores: streaming ones, as gather.cpp uses, measured
 * 3x slower here, where the rows of several channels and the mask are written in turn.) */
inline void store_lanes(float *out, const __m128i lanes[4]) {
    const __m128i one = _mm_set1_epi32(0x3f800000);
    for (int j = 0; j < 4; ++j)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + 4 * j), _mm_and_si128(lanes[j], one));
}

inline void store_lanes(uint8_t *out, const __m128i lanes[4]) { store_bytes(out, lanes); }
#endif

/* ---------------------------------------------------------------------------------------------------------- */
/* Affinities */

/* Output voxels of one channel whose neighbour u + offset is inside the patch: [lo, hi) along each axis. */
struct Overlap {
    int64_t lo[3], hi[3];

    Overlap(const Geometry &g, const int64_t offset[3]) {
        for (int a = 0; a < 3; ++a) {
            /* 0 <= v + margin + offset < shape  <=>  -offset - margin <= v < shape - margin - offset */
            lo[a] = std::min(std::max<int64_t>(-offset[a] - g.margin[a], 0), g.out[a]);
            hi[a] = std::max(std::min(g.shape[a] - g.margin[a] - offset[a], g.out[a]), lo[a]);
        }
    }
};

/* The ids that mask an affinity: any voxel labelled `ignore`, or both labelled `unlabelled`. */
template <typename T>
struct MaskIds {
    T ignore, unlabelled;
};

/* out[i] = a[i] == b[i] (and a[i] != background), mask[i] = neither is ignore (kIgnore) and not both are unlabelled
 * (kUnlabelled); mask untouched without either. */
template <typename T, typename Out, bool kBackground, bool kIgnore, bool kUnlabelled>
void affinity_row(const T *a, const T *b, int64_t n, T background, const MaskIds<T> &ids, Out *out, uint8_t *mask) {
    constexpr bool kMask = kIgnore || kUnlabelled;
    int64_t i = 0;
#ifdef EMF_HAVE_SSE2
    const Four<T> bg = Four<T>::splat(background), ig = Four<T>::splat(ids.ignore),
                  un = Four<T>::splat(ids.unlabelled);
    const __m128i ones = _mm_set1_epi32(-1);
    for (; i + kStep <= n; i += kStep) {
        __m128i same[4], known[4];
        for (int j = 0; j < 4; ++j) {
            const Four<T> x = Four<T>::load(a + i + 4 * j), y = Four<T>::load(b + i + 4 * j);
            same[j] = x.eq(y);
            if (kBackground) same[j] = _mm_andnot_si128(x.eq(bg), same[j]);
            __m128i masked = _mm_setzero_si128();
            if (kIgnore) masked = _mm_or_si128(x.eq(ig), y.eq(ig));
            if (kUnlabelled) masked = _mm_or_si128(masked, _mm_and_si128(x.eq(un), y.eq(un)));
            if (kMask) known[j] = _mm_xor_si128(masked, ones);
        }
        store_lanes(out + i, same);
        if (kMask) store_bytes(mask + i, known);
    }
#endif
    for (; i < n; ++i) {
        const T x = a[i], y = b[i];
        bool same = x == y;
        if (kBackground) same = same & (x != background);
        out[i] = static_cast<Out>(same);
        bool masked = false;
        if (kIgnore) masked = (x == ids.ignore) | (y == ids.ignore);
        if (kUnlabelled) masked = masked | ((x == ids.unlabelled) & (y == ids.unlabelled));
        if (kMask) mask[i] = static_cast<uint8_t>(!masked);
    }
}

template <typename T, typename Out, bool kBackground, bool kIgnore, bool kUnlabelled>
void affinities_all(const emf_labels &labels, const int64_t *offsets, int64_t channels, T background,
                    const MaskIds<T> &ids, Out *out, uint8_t *mask) {
    const Geometry g(labels);
    const T *data = static_cast<const T *>(labels.data);
    std::vector<Overlap> boxes;
    std::vector<int64_t> steps; /* element distance u -> u + offset */
    for (int64_t k = 0; k < channels; ++k) {
        const int64_t *d = offsets + 3 * k;
        boxes.emplace_back(g, d);
        steps.push_back(d[0] * g.stride_z + d[1] * g.stride_y + d[2]);
    }
    const int64_t nx = g.out[2];
    for (int64_t n = 0; n < labels.count; ++n) {
        const T *patch = data + n * g.patch_size;
        for (int64_t z = 0; z < g.out[0]; ++z) {
            for (int64_t y = 0; y < g.out[1]; ++y) {
                const T *center = patch + g.row(z, y);
                for (int64_t k = 0; k < channels; ++k) {
                    const int64_t at = (n * channels + k) * g.out_size + (z * g.out[1] + y) * nx;
                    Out *o = out + at;
                    uint8_t *m = mask + at;
                    const Overlap &box = boxes[k];
                    const bool inside = z >= box.lo[0] && z < box.hi[0] && y >= box.lo[1] && y < box.hi[1];
                    const int64_t x0 = inside ? box.lo[2] : nx, x1 = inside ? box.hi[2] : nx;
                    std::memset(o, 0, static_cast<size_t>(x0) * sizeof(Out));
                    std::memset(m, 0, static_cast<size_t>(x0));
                    std::memset(o + x1, 0, static_cast<size_t>(nx - x1) * sizeof(Out));
                    std::memset(m + x1, 0, static_cast<size_t>(nx - x1));
                    if (x0 == x1) continue;
                    if (!kIgnore && !kUnlabelled) std::memset(m + x0, 1, static_cast<size_t>(x1 - x0));
                    affinity_row<T, Out, kBackground, kIgnore, kUnlabelled>(center + x0, center + x0 + steps[k],
                                                                            x1 - x0, background, ids, o + x0, m + x0);
                }
            }
        }
    }
}

/* affinities_all for the masking ids used, each a compile-time case: the row loops test only those. */
template <typename T, typename Out, bool kBackground>
void affinities_masked(const emf_labels &labels, const int64_t *offsets, int64_t channels, T background,
                       const emf_mask_ids &mask_ids, Out *out, uint8_t *mask) {
    const MaskIds<T> ids{static_cast<T>(mask_ids.ignore), static_cast<T>(mask_ids.unlabelled)};
    if (mask_ids.has_ignore && mask_ids.has_unlabelled)
        affinities_all<T, Out, kBackground, true, true>(labels, offsets, channels, background, ids, out, mask);
    else if (mask_ids.has_ignore)
        affinities_all<T, Out, kBackground, true, false>(labels, offsets, channels, background, ids, out, mask);
    else if (mask_ids.has_unlabelled)
        affinities_all<T, Out, kBackground, false, true>(labels, offsets, channels, background, ids, out, mask);
    else
        affinities_all<T, Out, kBackground, false, false>(labels, offsets, channels, background, ids, out, mask);
}

template <typename T, typename Out>
int affinities_for(const emf_labels &labels, const int64_t *offsets, int64_t channels, int has_background,
                   uint64_t background, const emf_mask_ids &ids, void *out, uint8_t *mask) {
    const T bg = static_cast<T>(background);
    Out *o = static_cast<Out *>(out);
    try {
        if (has_background)
            affinities_masked<T, Out, true>(labels, offsets, channels, bg, ids, o, mask);
        else
            affinities_masked<T, Out, false>(labels, offsets, channels, bg, ids, o, mask);
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

template <typename T>
int affinities_typed(const emf_labels &labels, const int64_t *offsets, int64_t channels, int has_background,
                     uint64_t background, const emf_mask_ids &ids, emf_dtype out_dtype, void *out, uint8_t *mask) {
    switch (out_dtype) {
        case EMF_UINT8:
            return affinities_for<T, uint8_t>(labels, offsets, channels, has_background, background, ids, out, mask);
        case EMF_FLOAT32:
            return affinities_for<T, float>(labels, offsets, channels, has_background, background, ids, out, mask);
        default: return EMF_BAD_DTYPE;
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Boundaries and classes */

/* acc[i] |= a[i] != b[i] (acc holds 0 / 1). */
template <typename T>
void mark_differences(const T *a, const T *b, int64_t n, uint8_t *acc) {
    int64_t i = 0;
#ifdef EMF_HAVE_SSE2
    for (; i + kStep <= n; i += kStep) {
        __m128i same[4];
        for (int j = 0; j < 4; ++j) same[j] = Four<T>::load(a + i + 4 * j).eq(Four<T>::load(b + i + 4 * j));
        __m128i *dst = reinterpret_cast<__m128i *>(acc + i);
        const __m128i differ = _mm_xor_si128(bytes_of(same), _mm_set1_epi8(1));
        _mm_storeu_si128(dst, _mm_or_si128(_mm_loadu_si128(dst), differ));
    }
#endif
    for (; i < n; ++i) acc[i] |= static_cast<uint8_t>(a[i] != b[i]);
}

/* acc[x] = 1 where output voxel (z, y, x) of `patch` is a boundary voxel, else 0. */
template <typename T>
void boundary_row(const Geometry &g, const T *patch, int64_t z, int64_t y, int64_t thickness, bool in_plane,
                  uint8_t *acc) {
    const int64_t nx = g.out[2];
    const T *center = patch + g.row(z, y);
    std::memset(acc, 0, static_cast<size_t>(nx));
    const int64_t zl = z + g.margin[0], yl = y + g.margin[1], xl = g.margin[2];
    for (int64_t t = 1; t <= thickness; ++t) {
        /* along x: the neighbour x + t exists for x < shape - margin - t, x - t for x >= t - margin */
        const int64_t right = std::min(nx, g.shape[2] - xl - t);
        if (right > 0) mark_differences(center, center + t, right, acc);
        const int64_t left = std::max<int64_t>(t - xl, 0);
        if (left < nx) mark_differences(center + left, center + left - t, nx - left, acc + left);
        if (yl + t < g.shape[1]) mark_differences(center, center + t * g.stride_y, nx, acc);
        if (yl - t >= 0) mark_differences(center, center - t * g.stride_y, nx, acc);
        if (!in_plane) {
            if (zl + t < g.shape[0]) mark_differences(center, center + t * g.stride_z, nx, acc);
            if (zl - t >= 0) mark_differences(center, center - t * g.stride_z, nx, acc);
        }
    }
}

template <typename T>
void boundaries_typed(const emf_labels &labels, int64_t thickness, bool in_plane, uint8_t *out) {
    const Geometry g(labels);
    const T *data = static_cast<const T *>(labels.data);
    for (int64_t n = 0; n < labels.count; ++n)
        for (int64_t z = 0; z < g.out[0]; ++z)
            for (int64_t y = 0; y < g.out[1]; ++y, out += g.out[2])
                boundary_row(g, data + n * g.patch_size, z, y, thickness, in_plane, out);
}

template <typename T, typename Out, bool kBackground>
void class_row(const T *center, const uint8_t *boundary, int64_t n, T background, Out outside, Out edge,
               Out inside, Out *out) {
    for (int64_t i = 0; i < n; ++i) {
        Out value = boundary[i] ? edge : inside;
        if (kBackground) value = center[i] == background ? outside : value;
        out[i] = value;
    }
}

template <typename T, typename Out, bool kBackground>
int classes_all(const emf_labels &labels, int64_t thickness, bool in_plane, T background, const int64_t values[3],
                Out *out) {
    const Geometry g(labels);
    const T *data = static_cast<const T *>(labels.data);
    const Out outside = static_cast<Out>(values[0]), edge = static_cast<Out>(values[1]),
              inside = static_cast<Out>(values[2]);
    try {
        std::vector<uint8_t> boundary(static_cast<size_t>(g.out[2]));
        for (int64_t n = 0; n < labels.count; ++n) {
            const T *patch = data + n * g.patch_size;
            for (int64_t z = 0; z < g.out[0]; ++z) {
                for (int64_t y = 0; y < g.out[1]; ++y, out += g.out[2]) {
                    boundary_row(g, patch, z, y, thickness, in_plane, boundary.data());
                    class_row<T, Out, kBackground>(patch + g.row(z, y), boundary.data(), g.out[2], background,
                                                   outside, edge, inside, out);
                }
            }
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

template <typename T, typename Out>
int classes_for(const emf_labels &labels, int64_t thickness, bool in_plane, int has_background, uint64_t background,
                const int64_t values[3], void *out) {
    if (has_background)
        return classes_all<T, Out, true>(labels, thickness, in_plane, static_cast<T>(background), values,
                                         static_cast<Out *>(out));
    return classes_all<T, Out, false>(labels, thickness, in_plane, static_cast<T>(background), values,
                                      static_cast<Out *>(out));
}

template <typename T>
int classes_typed(const emf_labels &labels, int64_t thickness, bool in_plane, int has_background,
                  uint64_t background, const int64_t values[3], emf_dtype out_dtype, void *out) {
    switch (out_dtype) {
        case EMF_UINT8:
            return classes_for<T, uint8_t>(labels, thickness, in_plane, has_background, background, values, out);
        case EMF_INT64:
            return classes_for<T, int64_t>(labels, thickness, in_plane, has_background, background, values, out);
        default: return EMF_BAD_DTYPE;
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Foreground */

template <typename T>
void foreground_row(const T *a, int64_t n, T background, uint8_t *out) {
    int64_t i = 0;
#ifdef EMF_HAVE_SSE2
    const Four<T> bg = Four<T>::splat(background);
    for (; i + kStep <= n; i += kStep) {
        __m128i is_background[4];
        for (int j = 0; j < 4; ++j) is_background[j] = Four<T>::load(a + i + 4 * j).eq(bg);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i),
                         _mm_xor_si128(bytes_of(is_background), _mm_set1_epi8(1)));
    }
#endif
    for (; i < n; ++i) out[i] = static_cast<uint8_t>(a[i] != background);
}

template <typename T>
void foreground_typed(const emf_labels &labels, T background, uint8_t *out) {
    const Geometry g(labels);
    const T *data = static_cast<const T *>(labels.data);
    for (int64_t n = 0; n < labels.count; ++n)
        for (int64_t z = 0; z < g.out[0]; ++z)
            for (int64_t y = 0; y < g.out[1]; ++y, out += g.out[2])
                foreground_row(data + n * g.patch_size + g.row(z, y), g.out[2], background, out);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Balanced loss weights */

/* The class of a value, or -1 if it is not an integer in [0, classes). */
inline int64_t class_of(uint8_t v, int64_t classes) { return v < classes ? v : -1; }
inline int64_t class_of(int64_t v, int64_t classes) { return v >= 0 && v < classes ? v : -1; }
inline int64_t class_of(float v, int64_t classes) {
    /* NaN fails both comparisons */
    if (!(v >= 0.0f && v < static_cast<float>(classes))) return -1;
    const int64_t c = static_cast<int64_t>(v);
    return static_cast<float>(c) == v ? c : -1;
}

/* One slab: count the classes under the mask, then write the weights. Returns the index of the first value that is
 * not a class, or -1. */
template <typename T>
int64_t balance_slab(const T *values, const uint8_t *mask, int64_t n, int64_t classes, double clip_min,
                     double clip_max, std::vector<int64_t> &counts, std::vector<double> &weights, float *out) {
    std::fill(counts.begin(), counts.end(), 0);
    int64_t counted = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t c = class_of(values[i], classes);
        if (c < 0) return i;
        const int64_t in = mask == nullptr ? 1 : static_cast<int64_t>(mask[i] != 0);
        counts[static_cast<size_t>(c)] += in;
        counted += in;
    }
    for (int64_t c = 0; c < classes; ++c) {
        double fraction = static_cast<double>(counts[static_cast<size_t>(c)]) / static_cast<double>(counted);
        if (fraction < clip_min) fraction = clip_min; /* false for NaN bounds */
        if (fraction > clip_max) fraction = clip_max;
        /* a class absent from the mask weighs nothing: no voxel it weighs is counted */
        weights[static_cast<size_t>(c)] = counts[static_cast<size_t>(c)] ? 1.0 / static_cast<double>(classes) / fraction
                                                                          : 0.0;
    }
    for (int64_t i = 0; i < n; ++i) {
        const bool in = mask == nullptr || mask[i] != 0;
        out[i] = in ? static_cast<float>(weights[static_cast<size_t>(class_of(values[i], classes))]) : 0.0f;
    }
    return -1;
}

template <typename T>
int balance_typed(const T *values, const uint8_t *mask, int64_t slabs, int64_t slab_size, int64_t classes,
                  double clip_min, double clip_max, float *out, int64_t *bad) {
    *bad = -1;
    try {
        std::vector<int64_t> counts(static_cast<size_t>(classes));
        std::vector<double> weights(static_cast<size_t>(classes));
        for (int64_t s = 0; s < slabs; ++s) {
            const int64_t at = s * slab_size;
            const int64_t found = balance_slab(values + at, mask == nullptr ? nullptr : mask + at, slab_size, classes,
                                               clip_min, clip_max, counts, weights, out + at);
            if (found >= 0) {
                *bad = at + found;
                return EMF_OK;
            }
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

}  // namespace

extern "C" {

int emf_affinities(const emf_labels *labels, const int64_t *offsets, int64_t channels, int has_background,
                   uint64_t background, const emf_mask_ids *ids, emf_dtype out_dtype, void *out, uint8_t *mask) {
    switch (labels->itemsize) {
        case 4:
            return affinities_typed<uint32_t>(*labels, offsets, channels, has_background, background, *ids, out_dtype,
                                              out, mask);
        case 8:
            return affinities_typed<uint64_t>(*labels, offsets, channels, has_background, background, *ids, out_dtype,
                                              out, mask);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_boundaries(const emf_labels *labels, int64_t thickness, int in_plane, uint8_t *out) {
    switch (labels->itemsize) {
        case 4: boundaries_typed<uint32_t>(*labels, thickness, in_plane != 0, out); return EMF_OK;
        case 8: boundaries_typed<uint64_t>(*labels, thickness, in_plane != 0, out); return EMF_OK;
        default: return EMF_BAD_DTYPE;
    }
}

int emf_classes(const emf_labels *labels, int64_t thickness, int in_plane, int has_background, uint64_t background,
                const int64_t values[3], emf_dtype out_dtype, void *out) {
    switch (labels->itemsize) {
        case 4:
            return classes_typed<uint32_t>(*labels, thickness, in_plane != 0, has_background, background, values,
                                           out_dtype, out);
        case 8:
            return classes_typed<uint64_t>(*labels, thickness, in_plane != 0, has_background, background, values,
                                           out_dtype, out);
        default: return EMF_BAD_DTYPE;
    }
}

int emf_foreground(const emf_labels *labels, uint64_t background, uint8_t *out) {
    switch (labels->itemsize) {
        case 4: foreground_typed<uint32_t>(*labels, static_cast<uint32_t>(background), out); return EMF_OK;
        case 8: foreground_typed<uint64_t>(*labels, static_cast<uint64_t>(background), out); return EMF_OK;
        default: return EMF_BAD_DTYPE;
    }
}

int emf_balance(const void *values, emf_dtype dtype, const uint8_t *mask, int64_t slabs, int64_t slab_size,
                int64_t classes, double clip_min, double clip_max, float *out, int64_t *bad) {
    switch (dtype) {
        case EMF_UINT8:
            return balance_typed(static_cast<const uint8_t *>(values), mask, slabs, slab_size, classes, clip_min,
                                 clip_max, out, bad);
        case EMF_INT64:
            return balance_typed(static_cast<const int64_t *>(values), mask, slabs, slab_size, classes, clip_min,
                                 clip_max, out, bad);
        case EMF_FLOAT32:
            return balance_typed(static_cast<const float *>(values), mask, slabs, slab_size, classes, clip_min,
                                 clip_max, out, bad);
        default: return EMF_BAD_DTYPE;
    }
}

}  // extern "C"
