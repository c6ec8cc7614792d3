/* Batched warp kernels; see warp.h for the contract.
 *
 * Each example is walked row by row (output z, then y). The elastic displacement is evaluated separably: the
 * control grid is contracted along z once per output plane, along y once per row, and along x into the row's
 * displacement one segment of x at a time (within a segment the four control points are fixed, so the loop
 * over x is four contiguous multiply-adds, vectorisable). The source
 * coordinate is then affine in x plus that displacement: it is produced in runs of kRun voxels, in float64 at
 * the start of a run and in float32 relative to the run's integer base voxel within it, split into integer
 * voxel and fraction by vectorisable loops, and finally sampled voxel by voxel. Where the CPU has AVX2 (checked
 * at run time), the AVX2 samplers below split, address and gather eight voxels at a time instead, with the
 * same float32 arithmetic and so the same bits.
 */
#include "warp.h"
#include "gather.h"
#include "half.h"
#include "vector.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define EMF_HAVE_SSE2 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define EMF_INLINE inline __attribute__((always_inline))
#else
#define EMF_INLINE inline
#endif

namespace {

constexpr int kRun = 16;

/* Cubic B-spline weights along one output axis of `length` voxels for a grid of `points` control points.
 * Output index i uses control points index[4 i + tap] (clamped into the grid) with weight[4 i + tap]. With
 * `segments`, the weights are also laid out per tap, by_tap[tap * length + i], and the axis is cut into
 * segments [begin, end) of output indices that share their four control points. */
struct AxisSpline {
    std::vector<int64_t> index;
    std::vector<float> weight;
    struct Segment {
        int64_t begin, end, index[4];
    };
    std::vector<float> by_tap;
    std::vector<Segment> segments;

    void build(int64_t length, int64_t points, double spacing, double origin, bool with_segments) {
        index.resize(4 * length);
        weight.resize(4 * length);
        const double centre = (length - 1) / 2.0;
        for (int64_t i = 0; i < length; ++i) {
            const double t = (i - centre - origin) / spacing;
            const double k = std::floor(t);
            const double f = t - k, g = 1.0 - f;
            const double w[4] = {g * g * g / 6.0, (3.0 * f * f * f - 6.0 * f * f + 4.0) / 6.0,
                                 (-3.0 * f * f * f + 3.0 * f * f + 3.0 * f + 1.0) / 6.0, f * f * f / 6.0};
            for (int tap = 0; tap < 4; ++tap) {
                /* Clamped in double: t may lie far outside the grid. */
                const double j = std::min(std::max(k - 1.0 + tap, 0.0), static_cast<double>(points - 1));
                index[4 * i + tap] = static_cast<int64_t>(j);
                weight[4 * i + tap] = static_cast<float>(w[tap]);
            }
        }
        if (!with_segments) return;
        by_tap.resize(4 * length);
        segments.clear();
        for (int64_t i = 0; i < length; ++i) {
            for (int tap = 0; tap < 4; ++tap) by_tap[tap * length + i] = weight[4 * i + tap];
            if (segments.empty() || !std::equal(index.begin() + 4 * i, index.begin() + 4 * i + 4,
                                                segments.back().index)) {
                segments.push_back({i, i, {index[4 * i], index[4 * i + 1], index[4 * i + 2], index[4 * i + 3]}});
            }
            segments.back().end = i + 1;
        }
    }
};

/* What every example of one call shares: the output geometry and the spline tables of the control grid. */
struct OutputGeometry {
    int64_t shape[3];
    double centre[3]; /* (shape - 1) / 2 */
    const emf_warp_grid *grid;
    AxisSpline axis[3];

    OutputGeometry(const int64_t shape_[3], const emf_warp_grid *grid_) : grid(grid_) {
        for (int a = 0; a < 3; ++a) {
            shape[a] = shape_[a];
            centre[a] = (shape[a] - 1) / 2.0;
            if (grid) axis[a].build(shape[a], grid->shape[a], grid->spacing[a], grid->origin[a], a == 2);
        }
    }
};

/* One output row: the source coordinates of its X voxels, in runs of kRun voxels, each relative to the run's
 * integer base voxel: voxel x reads base[3 (x / kRun) + c] + s[c * stride + x] along source axis c, where
 * s = start[3 (x / kRun) + c] + (x % kRun) step[c] + disp[c * stride + x], in float32 in that order. The stride
 * rounds X up to whole runs, so that every loop over a run has the constant trip count kRun. s itself is only
 * filled for visitors that read it (reads_s); the others evaluate the same expression as they go. */
struct Row {
    int64_t stride;
    std::vector<int64_t> base;
    std::vector<float> start;
    float step[3];
    const float *disp;
    std::vector<float> s;
};

inline int64_t whole_runs(int64_t length) { return (length + kRun - 1) / kRun * kRun; }

/* Per-thread work buffers for the displacement of one example. */
struct Scratch {
    std::vector<float> plane; /* (3, gy, gx): the grid contracted along z for the current output plane */
    std::vector<float> line;  /* (3, gx): contracted along z and y for the current row */
    std::vector<float> disp;  /* (3, whole_runs(X)): the current row's displacement */
    Row row;
};

/* s[i] = r + i a + d[i] for the kRun voxels of a run (spelled out in SSE2, which compilers do not always find). */
inline void run_coordinates(float r, float a, const float *__restrict d, float *__restrict s) {
#ifdef EMF_HAVE_SSE2
    const __m128 start = _mm_set1_ps(r), step = _mm_set1_ps(a);
    for (int i = 0; i < kRun; i += 4) {
        const __m128 ramp = _mm_setr_ps(static_cast<float>(i), static_cast<float>(i + 1), static_cast<float>(i + 2),
                                        static_cast<float>(i + 3));
        _mm_storeu_ps(s + i, _mm_add_ps(_mm_add_ps(start, _mm_mul_ps(ramp, step)), _mm_loadu_ps(d + i)));
    }
#else
    for (int i = 0; i < kRun; ++i) s[i] = r + static_cast<float>(i) * a + d[i];
#endif
}

/* Calls visit.row(row, offset) for every output row of example `ex` in order, offset being the row's first
 * voxel in (Z, Y, X), then visit.end(). */
template <typename Visit>
EMF_INLINE void walk(const emf_warp_example &ex, const OutputGeometry &field, Scratch &scratch, Visit &visit) {
    const int64_t Z = field.shape[0], Y = field.shape[1], X = field.shape[2];
    const double *A = ex.matrix;
    bool moving[3] = {false, false, false}; /* components with a non-zero control value */
    int64_t gy = 0, gx = 0, cells = 0;
    if (ex.grid) {
        gy = field.grid->shape[1];
        gx = field.grid->shape[2];
        cells = field.grid->shape[0] * gy * gx;
        for (int c = 0; c < 3; ++c) {
            const float *g = ex.grid + c * cells;
            moving[c] = std::any_of(g, g + cells, [](float v) { return v != 0.0f; });
        }
        scratch.plane.resize(3 * gy * gx);
        scratch.line.resize(3 * gx);
    }
    const int64_t stride = whole_runs(X);
    scratch.disp.assign(3 * stride, 0.0f);
    Row &row = scratch.row;
    row.stride = stride;
    row.base.resize(3 * (stride / kRun));
    row.start.resize(3 * (stride / kRun));
    row.disp = scratch.disp.data();
    if (Visit::reads_s) row.s.resize(3 * stride);
    const AxisSpline &sz = field.axis[0], &sy = field.axis[1], &sx = field.axis[2];
    for (int c = 0; c < 3; ++c) row.step[c] = static_cast<float>(A[3 * c + 2]);
    for (int64_t z = 0; z < Z; ++z) {
        for (int c = 0; c < 3; ++c) {
            if (!moving[c]) continue;
            float *plane = scratch.plane.data() + c * gy * gx;
            std::fill(plane, plane + gy * gx, 0.0f);
            for (int tap = 0; tap < 4; ++tap) {
                const float w = sz.weight[4 * z + tap];
                const float *src = ex.grid + c * cells + sz.index[4 * z + tap] * gy * gx;
                for (int64_t i = 0; i < gy * gx; ++i) plane[i] += w * src[i];
            }
        }
        for (int64_t y = 0; y < Y; ++y) {
            for (int c = 0; c < 3; ++c) {
                if (!moving[c]) continue;
                float *__restrict line = scratch.line.data() + c * gx;
                const float *plane = scratch.plane.data() + c * gy * gx;
                const float *__restrict p0 = plane + sy.index[4 * y] * gx, *__restrict p1 = plane + sy.index[4 * y + 1] * gx,
                                        *__restrict p2 = plane + sy.index[4 * y + 2] * gx,
                                        *__restrict p3 = plane + sy.index[4 * y + 3] * gx;
                const float v0 = sy.weight[4 * y], v1 = sy.weight[4 * y + 1], v2 = sy.weight[4 * y + 2],
                            v3 = sy.weight[4 * y + 3];
                /* Summed from 0 in tap order in a register (not through memory), the same bits as tap by tap. */
                for (int64_t k = 0; k < gx; ++k) {
                    float sum = 0.0f;
                    sum += v0 * p0[k];
                    sum += v1 * p1[k];
                    sum += v2 * p2[k];
                    sum += v3 * p3[k];
                    line[k] = sum;
                }
                float *__restrict disp = scratch.disp.data() + c * stride;
                const float *__restrict w0 = sx.by_tap.data(), *__restrict w1 = w0 + X, *__restrict w2 = w1 + X,
                                        *__restrict w3 = w2 + X;
                for (const AxisSpline::Segment &segment : sx.segments) {
                    const float g0 = line[segment.index[0]], g1 = line[segment.index[1]],
                                g2 = line[segment.index[2]], g3 = line[segment.index[3]];
                    const int64_t begin = segment.begin, end = segment.end;
                    for (int64_t x = begin; x < end; ++x) disp[x] = w0[x] * g0 + w1[x] * g1 + w2[x] * g2 + w3[x] * g3;
                }
            }
            for (int c = 0; c < 3; ++c) {
                const double start = ex.centre[c] + A[3 * c] * (z - field.centre[0]) +
                                     A[3 * c + 1] * (y - field.centre[1]) - A[3 * c + 2] * field.centre[2];
                for (int64_t x0 = 0; x0 < X; x0 += kRun) {
                    const double first = start + A[3 * c + 2] * x0;
                    const double base = std::floor(first);
                    row.base[3 * (x0 / kRun) + c] = static_cast<int64_t>(base);
                    const float r = static_cast<float>(first - base);
                    row.start[3 * (x0 / kRun) + c] = r;
                    if (Visit::reads_s)
                        run_coordinates(r, row.step[c], row.disp + c * stride + x0, row.s.data() + c * stride + x0);
                }
            }
            visit.row(row, (z * Y + y) * X);
        }
    }
    visit.end();
}

inline void prefetch(const char *p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p);
#else
    (void)p;
#endif
}

/* For the kRun coordinates s of one axis of a run: t = floor(s), f = s - t (exact), inside &= lo <= s <= hi (as
 * all-ones masks). With nearest sampling t becomes floor(s + 0.5), computed exactly as floor(s) + (f >= 0.5),
 * and f is not written. */
template <bool Linear>
inline void split_axis(const float *s, float lo, float hi, int32_t *t, float *f, int32_t *inside) {
#ifdef EMF_HAVE_SSE2
    const __m128 low = _mm_set1_ps(lo), high = _mm_set1_ps(hi), half = _mm_set1_ps(0.5f);
    for (int i = 0; i < kRun; i += 4) {
        const __m128 v = _mm_loadu_ps(s + i);
        __m128i ti = _mm_cvttps_epi32(v);
        /* Truncation rounded negative non-integers up: add the all-ones (-1) comparison mask. */
        ti = _mm_add_epi32(ti, _mm_castps_si128(_mm_cmplt_ps(v, _mm_cvtepi32_ps(ti))));
        const __m128 fi = _mm_sub_ps(v, _mm_cvtepi32_ps(ti));
        if (Linear)
            _mm_storeu_ps(f + i, fi);
        else
            ti = _mm_sub_epi32(ti, _mm_castps_si128(_mm_cmpge_ps(fi, half)));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(t + i), ti);
        const __m128i in = _mm_castps_si128(_mm_and_ps(_mm_cmpge_ps(v, low), _mm_cmple_ps(v, high)));
        __m128i *mask = reinterpret_cast<__m128i *>(inside + i);
        _mm_storeu_si128(mask, _mm_and_si128(_mm_loadu_si128(mask), in));
    }
#else
    for (int i = 0; i < kRun; ++i) {
        int32_t ti = static_cast<int32_t>(s[i]);
        ti -= static_cast<int32_t>(s[i] < static_cast<float>(ti));
        const float fi = s[i] - static_cast<float>(ti);
        if (Linear)
            f[i] = fi;
        else
            ti += static_cast<int32_t>(fi >= 0.5f);
        t[i] = ti;
        inside[i] &= -static_cast<int32_t>(s[i] >= lo && s[i] <= hi);
    }
#endif
}

/* Source voxels of one row, ready to sample: each voxel's address (NULL when outside) and, for linear
 * sampling, its fractions and which +1 neighbours lie past the last voxel (bits 0, 1, 2 for z, y, x). */
struct Prepared {
    std::vector<const char *> at;
    std::vector<float> f; /* (3, X) */
    std::vector<uint8_t> edge;
    int64_t offset = -1; /* the row's first voxel in (Z, Y, X); -1 when nothing is pending */
};

/* What every sampler shares: the current example, where its output goes, and a two-row pipeline. A row is
 * prepared (addresses computed and their cache lines prefetched) one row before it is sampled, so that the
 * source reads, which follow the warp rather than memory order, mostly find their lines in cache. */
template <typename Out, bool Linear>
struct VoxelSampler {
    static constexpr bool reads_s = true;
    Out *all; /* the whole output batch */
    Out fill;
    const emf_warp_example *ex;
    int64_t extent[3], channels, plane, length;
    Out *out;
    uint8_t *valid;
    Prepared pending[2];
    int next = 0;

    void begin(const emf_warp_example &example, int64_t n, const int64_t shape[4], uint8_t *valid_n) {
        ex = &example;
        for (int a = 0; a < 3; ++a) extent[a] = example.shape[1 + a];
        channels = shape[0];
        plane = shape[1] * shape[2] * shape[3];
        length = shape[3];
        out = all + n * channels * plane;
        valid = valid_n;
        for (Prepared &p : pending) {
            p.at.resize(length);
            p.f.resize(3 * whole_runs(length)); /* unused by nearest sampling */
            p.edge.resize(Linear ? length : 0);
            p.offset = -1;
        }
    }

    /* Addresses (and, for linear sampling, fractions and edges) of one row's voxels, prefetched. */
    void prepare(const Row &row, Prepared &p) {
        const int64_t stz = ex->strides[1], sty = ex->strides[2], stx = ex->strides[3];
        for (int64_t x0 = 0; x0 < length; x0 += kRun) {
            const int n = static_cast<int>(std::min<int64_t>(kRun, length - x0));
            const int64_t *base = row.base.data() + 3 * (x0 / kRun);
            alignas(16) int32_t t[3][kRun];
            alignas(16) int32_t inside[kRun];
            for (int i = 0; i < kRun; ++i) inside[i] = -1;
            for (int c = 0; c < 3; ++c) {
                /* Exact wherever s can be near them (|s| < 2^21, so a bound beyond 2^24 never decides). */
                const float lo = static_cast<float>(-static_cast<double>(base[c]));
                const float hi = static_cast<float>(static_cast<double>(extent[c] - 1 - base[c]));
                split_axis<Linear>(row.s.data() + c * row.stride + x0, lo, hi, t[c], p.f.data() + c * row.stride + x0,
                                   inside);
            }
            const int64_t origin = base[0] * stz + base[1] * sty + base[2] * stx;
            for (int i = 0; i < n; ++i) {
                if (!inside[i]) {
                    p.at[x0 + i] = nullptr;
                    continue;
                }
                const char *at = ex->data + (origin + t[0][i] * stz + t[1][i] * sty + t[2][i] * stx);
                p.at[x0 + i] = at;
                prefetch(at);
                if (Linear) {
                    const uint8_t edge = static_cast<uint8_t>((base[0] + t[0][i] == extent[0] - 1) |
                                                              (base[1] + t[1][i] == extent[1] - 1) << 1 |
                                                              (base[2] + t[2][i] == extent[2] - 1) << 2);
                    p.edge[x0 + i] = edge;
                    if (!(edge & 2)) prefetch(at + sty);
                }
            }
        }
    }

    template <typename Emit>
    void advance(const Row *row, int64_t offset, Emit &&emit) {
        Prepared &current = pending[next];
        if (row) {
            current.offset = offset;
            prepare(*row, current);
        }
        Prepared &previous = pending[next ^ 1];
        if (previous.offset >= 0) {
            if (valid)
                for (int64_t x = 0; x < length; ++x) valid[previous.offset + x] = previous.at[x] != nullptr;
            emit(previous);
            previous.offset = -1;
        }
        next ^= 1;
    }
};

template <typename T>
inline float load_float(const char *p) {
    T value;
    std::memcpy(&value, p, sizeof value);
    return static_cast<float>(value);
}

inline float lerp(float a, float b, float f) { return a + f * (b - a); }

/* Trilinear sample at `at` with the byte offsets of the +1 neighbours (0 for one past the last voxel, whose
 * weight is 0). A voxel whose z fraction is 0 (any warp that keeps z on the sections) reads only its own
 * plane: the other plane has weight 0. */
template <typename Src>
inline float trilinear(const char *at, int64_t dz, int64_t dy, int64_t dx, float fz, float fy, float fx) {
    float v = lerp(lerp(load_float<Src>(at), load_float<Src>(at + dx), fx),
                   lerp(load_float<Src>(at + dy), load_float<Src>(at + dy + dx), fx), fy);
    if (fz != 0.0f) {
        const char *up = at + dz;
        const float w = lerp(lerp(load_float<Src>(up), load_float<Src>(up + dx), fx),
                             lerp(load_float<Src>(up + dy), load_float<Src>(up + dy + dx), fx), fy);
        v = lerp(v, w, fz);
    }
    return v;
}

/* Output element from the float32 result: float32 itself, or float16 bits. */
template <typename Out>
struct Store;
template <>
struct Store<float> {
    static float from(float v) { return v; }
};
template <>
struct Store<uint16_t> {
    static uint16_t from(float v) { return emf_float_to_half(v); }
};

/* Raw: trilinear samples of every channel, converted as value * scale + shift. */
template <typename Src, typename Out>
struct Linear : VoxelSampler<Out, true> {
    using Base = VoxelSampler<Out, true>;

    void row(const Row &row, int64_t offset) { Base::advance(&row, offset, [this](const Prepared &p) { emit(p); }); }
    void end() { Base::advance(nullptr, 0, [this](const Prepared &p) { emit(p); }); }

    void emit(const Prepared &p) {
        const emf_warp_example *ex = Base::ex;
        const int64_t stz = ex->strides[1], sty = ex->strides[2], stx = ex->strides[3], stc = ex->strides[0];
        const int64_t length = Base::length, plane = Base::plane;
        const float scale = ex->scale, shift = ex->shift;
        Out *dst = Base::out + p.offset;
        const int64_t stride = whole_runs(length);
        const float *fz = p.f.data(), *fy = fz + stride, *fx = fy + stride;
        for (int64_t x = 0; x < length; ++x) {
            const char *at = p.at[x];
            if (!at) {
                for (int64_t ch = 0; ch < Base::channels; ++ch) dst[ch * plane + x] = Base::fill;
                continue;
            }
            /* A neighbour past the last voxel has weight 0 (s <= extent - 1): read the voxel itself instead. */
            const uint8_t edge = p.edge[x];
            const int64_t dz = edge & 1 ? 0 : stz, dy = edge & 2 ? 0 : sty, dx = edge & 4 ? 0 : stx;
            for (int64_t ch = 0; ch < Base::channels; ++ch, at += stc)
                dst[ch * plane + x] =
                    Store<Out>::from(trilinear<Src>(at, dz, dy, dx, fz[x], fy[x], fx[x]) * scale + shift);
        }
    }
};

/* Labels: the nearest voxel of every channel, bit for bit. */
template <typename T>
struct Nearest : VoxelSampler<T, false> {
    using Base = VoxelSampler<T, false>;

    void row(const Row &row, int64_t offset) { Base::advance(&row, offset, [this](const Prepared &p) { emit(p); }); }
    void end() { Base::advance(nullptr, 0, [this](const Prepared &p) { emit(p); }); }

    void emit(const Prepared &p) {
        const int64_t stc = Base::ex->strides[0], length = Base::length, plane = Base::plane;
        T *dst = Base::out + p.offset;
        for (int64_t x = 0; x < length; ++x) {
            const char *at = p.at[x];
            if (!at) {
                for (int64_t ch = 0; ch < Base::channels; ++ch) dst[ch * plane + x] = Base::fill;
                continue;
            }
            for (int64_t ch = 0; ch < Base::channels; ++ch, at += stc) std::memcpy(dst + ch * plane + x, at, sizeof(T));
        }
    }
};

#ifdef EMF_HAVE_AVX2
/* AVX2 samplers, used where the CPU has AVX2 and the example's source spans less than 2^31 bytes, so that a
 * voxel's byte offset from the source's first element fits in int32 (gather indices). Eight voxels at a time:
 * integer voxel, fractions and inside mask from the same float32 operations as split_axis, offsets in int32
 * (computed modulo 2^32 from the run's base voxel: exact, since every offset used lies inside the source),
 * source values by gathers. The arithmetic on values is the scalar samplers', operation for operation (no
 * fused multiply-add: the target is AVX2 alone), so both give the same bits. */

/* One row of source voxels for the AVX2 samplers, laid out like Row (whole runs): the byte offset of each
 * voxel (0 when outside), the inside mask (all ones or 0), and for linear sampling the fractions and the byte
 * offsets of the +1 neighbours (0 past the last voxel, whose weight is 0). */
struct Lanes {
    std::vector<int32_t> at, inside, dz, dy, dx;
    std::vector<float> f; /* (3, stride) */
    int64_t offset = -1;  /* the row's first voxel in (Z, Y, X); -1 when nothing is pending */
};

/* The highest byte offset of a source element over (Z, Y, X), or -1 when the elements' offsets do not fit in
 * int32 with room to spare for a 4-byte read. */
inline int64_t int32_reach(const emf_warp_example &ex) {
    int64_t low = 0, high = 0;
    for (int a = 1; a < 4; ++a) {
        const int64_t reach = (ex.shape[a] - 1) * ex.strides[a];
        (reach < 0 ? low : high) += reach;
    }
    const int64_t room = (int64_t{1} << 31) - 64;
    return low >= -room && high <= room ? high : -1;
}

/* The two-row pipeline of VoxelSampler, with Lanes in place of Prepared. */
template <typename Out, bool Linear>
struct WideSampler {
    static constexpr bool reads_s = false;
    Out *all; /* the whole output batch */
    Out fill;
    const emf_warp_example *ex;
    int64_t extent[3], channels, plane, length, stride;
    int64_t item;  /* source element bytes */
    int64_t last;  /* the highest byte offset from which a 4-byte read stays inside the source */
    Out *out;
    uint8_t *valid;
    Lanes pending[2];
    int next = 0;

    static bool accepts(const emf_warp_example &example) { return int32_reach(example) >= 0; }

    void begin(const emf_warp_example &example, int64_t n, const int64_t shape[4], uint8_t *valid_n) {
        ex = &example;
        for (int a = 0; a < 3; ++a) extent[a] = example.shape[1 + a];
        channels = shape[0];
        plane = shape[1] * shape[2] * shape[3];
        length = shape[3];
        stride = whole_runs(length);
        last = int32_reach(example) + item - 4;
        out = all + n * channels * plane;
        valid = valid_n;
        for (Lanes &p : pending) {
            for (std::vector<int32_t> *v : {&p.at, &p.inside}) v->resize(stride);
            for (std::vector<int32_t> *v : {&p.dz, &p.dy, &p.dx}) v->resize(Linear ? stride : 0);
            p.f.resize(Linear ? 3 * stride : 0);
            p.offset = -1;
        }
    }

    /* Offsets, masks and fractions of one row's voxels; their cache lines prefetched. Unlike VoxelSampler, not the
     * lines of the +1 neighbours in y too: measured, that cost more than it saved. */
    EMF_AVX2 void prepare(const Row &row, Lanes &p) {
        __m256i bytes[3]; /* the strides, modulo 2^32 */
        for (int c = 0; c < 3; ++c)
            bytes[c] = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(ex->strides[1 + c])));
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
        static_assert(kRun == 16, "a run is two vectors");
        const __m256 ramp[2] = {_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15)};
        const __m256 step[3] = {_mm256_set1_ps(row.step[0]), _mm256_set1_ps(row.step[1]), _mm256_set1_ps(row.step[2])};
        for (int64_t x0 = 0; x0 < length; x0 += kRun) {
            const int64_t *base = row.base.data() + 3 * (x0 / kRun);
            uint64_t origin = 0;
            __m256 lo[3], hi[3], start[3];
            for (int c = 0; c < 3; ++c) {
                start[c] = _mm256_set1_ps(row.start[3 * (x0 / kRun) + c]);
                origin += static_cast<uint64_t>(base[c]) * static_cast<uint64_t>(ex->strides[1 + c]);
                /* As in VoxelSampler::prepare. */
                lo[c] = _mm256_set1_ps(static_cast<float>(-static_cast<double>(base[c])));
                hi[c] = _mm256_set1_ps(static_cast<float>(static_cast<double>(extent[c] - 1 - base[c])));
            }
            for (int h = 0; h < 2; ++h) {
                const int64_t x = x0 + 8 * h;
                __m256i inside = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(std::min<int64_t>(
                                                        length - x, 8))),
                                                    lane);
                __m256i at = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(origin)));
                __m256i next[3];
                for (int c = 0; c < 3; ++c) {
                    const __m256 s = _mm256_add_ps(
                        _mm256_add_ps(start[c], _mm256_mul_ps(ramp[h], step[c])),
                        _mm256_loadu_ps(row.disp + c * row.stride + x));
                    __m256 t = _mm256_floor_ps(s);
                    const __m256 f = _mm256_sub_ps(s, t);
                    inside = _mm256_and_si256(inside, _mm256_castps_si256(_mm256_and_ps(
                                                          _mm256_cmp_ps(s, lo[c], _CMP_GE_OQ),
                                                          _mm256_cmp_ps(s, hi[c], _CMP_LE_OQ))));
                    if (Linear) {
                        _mm256_storeu_ps(p.f.data() + c * stride + x, f);
                        next[c] = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(t, hi[c], _CMP_EQ_OQ)),
                                                      bytes[c]);
                    } else {
                        t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, half, _CMP_GE_OQ), one));
                    }
                    at = _mm256_add_epi32(at, _mm256_mullo_epi32(_mm256_cvttps_epi32(t), bytes[c]));
                }
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(p.at.data() + x), _mm256_and_si256(at, inside));
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(p.inside.data() + x), inside);
                if (Linear) {
                    int32_t *d[3] = {p.dz.data(), p.dy.data(), p.dx.data()};
                    for (int c = 0; c < 3; ++c)
                        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d[c] + x), _mm256_and_si256(next[c], inside));
                }
            }
        }
        const int32_t *at = p.at.data();
        for (int64_t x = 0; x < length; ++x) prefetch(ex->data + at[x]);
    }

    /* Prepares `row` (if any) and returns the previous row, with its valid bytes written (NULL if none). */
    EMF_AVX2 Lanes *advance(const Row *row, int64_t offset) {
        Lanes &current = pending[next];
        if (row) {
            current.offset = offset;
            prepare(*row, current);
        }
        next ^= 1;
        Lanes &previous = pending[next];
        if (previous.offset < 0) return nullptr;
        if (valid)
            for (int64_t x = 0; x < length; ++x)
                valid[previous.offset + x] = static_cast<uint8_t>(previous.inside[x] & 1);
        return &previous;
    }

};

/* Source values of one gather as float32: the element at each offset, or (second) the one after it, which a
 * 4-byte read of a 1- or 2-byte element also holds. Signed elements are sign-extended by an arithmetic shift. */
template <typename Src>
EMF_AVX2 inline __m256 first(__m256i g) {
    if (std::is_same<Src, int8_t>::value) return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(g, 24), 24));
    if (std::is_same<Src, int16_t>::value) return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(g, 16), 16));
    if (sizeof(Src) == 1) return _mm256_cvtepi32_ps(_mm256_and_si256(g, _mm256_set1_epi32(0xff)));
    if (sizeof(Src) == 2) return _mm256_cvtepi32_ps(_mm256_and_si256(g, _mm256_set1_epi32(0xffff)));
    return _mm256_castsi256_ps(g);
}

template <typename Src>
EMF_AVX2 inline __m256 second(__m256i g) {
    if (std::is_same<Src, int8_t>::value) return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(g, 16), 24));
    if (std::is_same<Src, int16_t>::value) return _mm256_cvtepi32_ps(_mm256_srai_epi32(g, 16));
    if (sizeof(Src) == 1) return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(g, 8), _mm256_set1_epi32(0xff)));
    return _mm256_cvtepi32_ps(_mm256_srli_epi32(g, 16));
}

EMF_AVX2 inline __m256 lerp8(__m256 a, __m256 b, __m256 f) { return _mm256_add_ps(a, _mm256_mul_ps(f, _mm256_sub_ps(b, a))); }

EMF_AVX2 inline __m256i gather(const char *p, __m256i at) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int *>(p), at, 1);
}

/* Bilinear sample of one plane: x neighbours from one 4-byte read each (Pair: the source is contiguous along
 * x in 1- or 2-byte elements) or from two gathers. */
template <typename Src, bool Pair>
EMF_AVX2 inline __m256 bilinear8(const char *p, __m256i at, __m256i dy, __m256i dx, __m256 fy, __m256 fx) {
    const __m256i below = _mm256_add_epi32(at, dy);
    const __m256i g0 = gather(p, at), g1 = gather(p, below);
    if (Pair) return lerp8(lerp8(first<Src>(g0), second<Src>(g0), fx), lerp8(first<Src>(g1), second<Src>(g1), fx), fy);
    return lerp8(lerp8(first<Src>(g0), first<Src>(gather(p, _mm256_add_epi32(at, dx))), fx),
                 lerp8(first<Src>(g1), first<Src>(gather(p, _mm256_add_epi32(below, dx))), fx), fy);
}

template <typename Src, typename Out>
struct WideLinear : WideSampler<Out, true> {
    using Base = WideSampler<Out, true>;
    float fill_float; /* fill before conversion to Out */

    /* The lanes read 1- and 2-byte integers and float32; other sources take the scalar sampler. */
    static bool accepts(const emf_warp_example &example) {
        constexpr bool lanes_read = sizeof(Src) <= 2 ? !std::is_same<Src, emf_half::Half>::value
                                                     : std::is_same<Src, float>::value;
        return lanes_read && Base::accepts(example);
    }

    EMF_AVX2 void row(const Row &row, int64_t offset) {
        if (Lanes *p = Base::advance(&row, offset)) emit(*p);
    }
    EMF_AVX2 void end() {
        if (Lanes *p = Base::advance(nullptr, 0)) emit(*p);
    }

    EMF_AVX2 void emit(const Lanes &p) {
        if (sizeof(Src) < 4 && Base::ex->strides[3] == static_cast<int64_t>(sizeof(Src)))
            emit_as<true>(p);
        else
            emit_as<false>(p);
    }

    template <bool Pair>
    EMF_AVX2 void emit_as(const Lanes &p) {
        const emf_warp_example *ex = Base::ex;
        const int64_t length = Base::length, plane = Base::plane, stride = Base::stride, stc = ex->strides[0];
        const __m256 scale = _mm256_set1_ps(ex->scale), shift = _mm256_set1_ps(ex->shift), zero = _mm256_setzero_ps();
        const __m256 fill = _mm256_set1_ps(fill_float);
        const __m256i last = _mm256_set1_epi32(static_cast<int32_t>(std::max<int64_t>(Base::last, -1)));
        Out *dst = Base::out + p.offset;
        for (int64_t x = 0; x < length; x += 8) {
            const int n = static_cast<int>(std::min<int64_t>(8, length - x));
            const __m256i at = load(p.at, x), inside = load(p.inside, x), dz = load(p.dz, x), dy = load(p.dy, x),
                          dx = load(p.dx, x);
            if (sizeof(Src) < 4) {
                /* A 4-byte read of a 1- or 2-byte element near the end of the source would pass its end. */
                __m256i reach = _mm256_max_epi32(at, _mm256_add_epi32(at, dy));
                reach = _mm256_max_epi32(reach, _mm256_add_epi32(reach, dz));
                if (!Pair) reach = _mm256_max_epi32(reach, _mm256_add_epi32(reach, dx));
                if (!_mm256_testz_si256(_mm256_cmpgt_epi32(reach, last), _mm256_cmpgt_epi32(reach, last))) {
                    emit_scalar(p, x, n, dst);
                    continue;
                }
            }
            const __m256 fz = _mm256_loadu_ps(p.f.data() + x), fy = _mm256_loadu_ps(p.f.data() + stride + x),
                         fx = _mm256_loadu_ps(p.f.data() + 2 * stride + x);
            const __m256 moving = _mm256_cmp_ps(fz, zero, _CMP_NEQ_UQ);
            const bool upper = !_mm256_testz_ps(moving, moving);
            const char *src = ex->data;
            for (int64_t ch = 0; ch < Base::channels; ++ch, src += stc) {
                __m256 v = bilinear8<Src, Pair>(src, at, dy, dx, fy, fx);
                if (upper) {
                    const __m256 w = bilinear8<Src, Pair>(src, _mm256_add_epi32(at, dz), dy, dx, fy, fx);
                    v = _mm256_blendv_ps(v, lerp8(v, w, fz), moving);
                }
                v = _mm256_blendv_ps(fill, _mm256_add_ps(_mm256_mul_ps(v, scale), shift), _mm256_castsi256_ps(inside));
                put(dst + ch * plane + x, v, n);
            }
        }
    }

    /* The same voxels through the scalar arithmetic. */
    void emit_scalar(const Lanes &p, int64_t x, int n, Out *dst) {
        const emf_warp_example *ex = Base::ex;
        const int64_t stride = Base::stride;
        for (int64_t i = x; i < x + n; ++i) {
            const char *at = ex->data + p.at[i];
            for (int64_t ch = 0; ch < Base::channels; ++ch, at += ex->strides[0])
                dst[ch * Base::plane + i] =
                    p.inside[i] ? Store<Out>::from(trilinear<Src>(at, p.dz[i], p.dy[i], p.dx[i], p.f[i],
                                                                  p.f[stride + i], p.f[2 * stride + i]) *
                                                       ex->scale +
                                                   ex->shift)
                                : Base::fill;
        }
    }

    static EMF_AVX2 __m256i load(const std::vector<int32_t> &v, int64_t x) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(v.data() + x));
    }

    static EMF_AVX2 void put(Out *dst, __m256 v, int n) {
        if (std::is_same<Out, float>::value && n == 8) {
            _mm256_storeu_ps(reinterpret_cast<float *>(dst), v);
            return;
        }
        alignas(32) float values[8];
        _mm256_store_ps(values, v);
        Out converted[8];
        for (int i = 0; i < n; ++i) converted[i] = Store<Out>::from(values[i]);
        std::memcpy(dst, converted, n * sizeof(Out));
    }
};

/* Labels: the nearest voxel of every channel, gathered with the fill in outside lanes. */
template <typename T>
struct WideNearest : WideSampler<T, false> {
    using Base = WideSampler<T, false>;

    EMF_AVX2 void row(const Row &row, int64_t offset) {
        if (Lanes *p = Base::advance(&row, offset)) emit(*p);
    }
    EMF_AVX2 void end() {
        if (Lanes *p = Base::advance(nullptr, 0)) emit(*p);
    }

    EMF_AVX2 void emit(const Lanes &p) {
        const emf_warp_example *ex = Base::ex;
        const int64_t length = Base::length, plane = Base::plane, stc = ex->strides[0];
        uint64_t fill_bits = 0;
        std::memcpy(&fill_bits, &this->fill, sizeof(T));
        const __m256i last = _mm256_set1_epi32(static_cast<int32_t>(std::max<int64_t>(Base::last, -1)));
        T *dst = Base::out + p.offset;
        for (int64_t x = 0; x < length; x += 8) {
            const int n = static_cast<int>(std::min<int64_t>(8, length - x));
            const __m256i at = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p.at.data() + x));
            const __m256i inside = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p.inside.data() + x));
            const char *src = ex->data;
            if (sizeof(T) == 8) {
                const __m256i fill = _mm256_set1_epi64x(static_cast<long long>(fill_bits));
                const __m128i at0 = _mm256_castsi256_si128(at), at1 = _mm256_extracti128_si256(at, 1);
                const __m256i in0 = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(inside)),
                              in1 = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(inside, 1));
                for (int64_t ch = 0; ch < Base::channels; ++ch, src += stc) {
                    const long long *base = reinterpret_cast<const long long *>(src);
                    const __m256i g0 = _mm256_mask_i32gather_epi64(fill, base, at0, in0, 1),
                                  g1 = _mm256_mask_i32gather_epi64(fill, base, at1, in1, 1);
                    T *d = dst + ch * plane + x;
                    if (n == 8) {
                        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d), g0);
                        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + 4), g1);
                    } else {
                        alignas(32) T values[8];
                        _mm256_store_si256(reinterpret_cast<__m256i *>(values), g0);
                        _mm256_store_si256(reinterpret_cast<__m256i *>(values + 4), g1);
                        std::memcpy(d, values, n * sizeof(T));
                    }
                }
                continue;
            }
            /* A 4-byte read of a 1- or 2-byte element near the end of the source would pass its end. */
            const __m256i past = _mm256_and_si256(_mm256_cmpgt_epi32(at, last), inside);
            const bool guarded = sizeof(T) < 4 && !_mm256_testz_si256(past, past);
            const __m256i fill = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(fill_bits)));
            for (int64_t ch = 0; ch < Base::channels; ++ch, src += stc) {
                T *d = dst + ch * plane + x;
                if (guarded) {
                    for (int i = 0; i < n; ++i)
                        if (p.inside[x + i])
                            std::memcpy(d + i, src + p.at[x + i], sizeof(T));
                        else
                            d[i] = Base::fill;
                    continue;
                }
                const __m256i g = _mm256_mask_i32gather_epi32(fill, reinterpret_cast<const int *>(src), at, inside, 1);
                alignas(32) uint32_t values[8];
                _mm256_store_si256(reinterpret_cast<__m256i *>(values), g);
                if (sizeof(T) == 4 && n == 8) {
                    _mm256_storeu_si256(reinterpret_cast<__m256i *>(d), g);
                    continue;
                }
                for (int i = 0; i < n; ++i) d[i] = static_cast<T>(values[i]);
            }
        }
    }
};
#endif

/* The coordinates themselves, as float64. */
struct Coordinates {
    static constexpr bool reads_s = true;
    int64_t plane, length;
    double *out;

    void row(const Row &row, int64_t offset) {
        for (int c = 0; c < 3; ++c)
            for (int64_t x = 0; x < length; ++x)
                out[c * plane + offset + x] =
                    static_cast<double>(row.base[3 * (x / kRun) + c]) + static_cast<double>(row.s[c * row.stride + x]);
    }
    void end() {}
};

/* A gather window when example `ex` is a signed permutation with no grid, an integer source coordinate of
 * output voxel 0 and every voxel inside its source; false otherwise. */
bool as_window(const emf_warp_example &ex, const int64_t shape[4], emf_window *window) {
    if (ex.grid) return false;
    int row_of[3];
    bool used[3] = {false, false, false};
    for (int j = 0; j < 3; ++j) {
        row_of[j] = -1;
        for (int i = 0; i < 3; ++i) {
            const double a = ex.matrix[3 * i + j];
            if (a == 0.0) continue;
            if ((a != 1.0 && a != -1.0) || row_of[j] >= 0) return false;
            row_of[j] = i;
        }
        if (row_of[j] < 0 || used[row_of[j]]) return false;
        used[row_of[j]] = true;
    }
    const char *origin = ex.data;
    for (int j = 0; j < 3; ++j) {
        const int i = row_of[j];
        const double sign = ex.matrix[3 * i + j];
        const double first = ex.centre[i] - sign * (shape[1 + j] - 1) / 2.0; /* exact: |centre| <= 2^40 */
        const double last = first + sign * (shape[1 + j] - 1);
        if (first != std::floor(first) || std::min(first, last) < 0 ||
            std::max(first, last) > static_cast<double>(ex.shape[1 + i] - 1))
            return false;
        origin += static_cast<int64_t>(first) * ex.strides[1 + i];
        window->steps[1 + j] = sign > 0 ? ex.strides[1 + i] : -ex.strides[1 + i];
    }
    window->origin = origin;
    window->steps[0] = ex.strides[0];
    window->scale = ex.scale;
    window->shift = ex.shift;
    return true;
}

#ifdef EMF_HAVE_AVX2
/* walk compiled for AVX2 (its loops over x vectorise 8 wide), for the AVX2 samplers. */
template <typename Visit>
EMF_AVX2 void walk_avx2(const emf_warp_example &ex, const OutputGeometry &field, Scratch &scratch, Visit &visit) {
    walk(ex, field, scratch, visit);
}
#endif

/* Runs `sampler` over every example, except those the gather path takes (`gather(window, n)`) and those `wide`
 * accepts (the AVX2 sampler, when the CPU has AVX2). */
template <typename VoxelSampler, typename Wide, typename Gather>
int warp_batch(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
               int allow_gather, uint8_t *valid, VoxelSampler &sampler, Wide &wide, const Gather &gather) {
    try {
        const OutputGeometry field(shape + 1, grid);
        Scratch scratch;
        const int64_t plane = shape[1] * shape[2] * shape[3];
#ifdef EMF_HAVE_AVX2
        const bool avx2 = emf_warp_uses_avx2() != 0;
#endif
        for (int64_t n = 0; n < count; ++n) {
            const emf_warp_example &ex = examples[n];
            uint8_t *valid_n = valid ? valid + n * plane : nullptr;
            emf_window window;
            if (allow_gather && as_window(ex, shape, &window)) {
                const int status = gather(window, n);
                if (status != EMF_OK) return status;
                if (valid_n) std::memset(valid_n, 1, plane);
                continue;
            }
#ifdef EMF_HAVE_AVX2
            if (avx2 && wide.accepts(ex)) {
                wide.begin(ex, n, shape, valid_n);
                walk_avx2(ex, field, scratch, wide);
                continue;
            }
#else
            (void)wide;
#endif
            sampler.begin(ex, n, shape, valid_n);
            walk(ex, field, scratch, sampler);
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

#ifndef EMF_HAVE_AVX2
/* Stands in for the AVX2 samplers where they are not compiled. */
struct WideNone {};
#endif

template <typename Src, typename Out>
int convert(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
            emf_dtype src_dtype, emf_dtype out_dtype, float fill, void *out, uint8_t *valid, int allow_gather) {
    Linear<Src, Out> sampler{};
    sampler.all = static_cast<Out *>(out);
    sampler.fill = Store<Out>::from(fill);
#ifdef EMF_HAVE_AVX2
    WideLinear<Src, Out> wide{};
    wide.all = sampler.all;
    wide.fill = sampler.fill;
    wide.fill_float = fill;
    wide.item = sizeof(Src);
#else
    WideNone wide;
#endif
    const int64_t example_size = shape[0] * shape[1] * shape[2] * shape[3];
    auto gather = [&](const emf_window &window, int64_t n) {
        return emf_gather_convert(&window, 1, shape, src_dtype, out_dtype, static_cast<Out *>(out) + n * example_size);
    };
    return warp_batch(examples, count, shape, grid, allow_gather, valid, sampler, wide, gather);
}

template <typename T>
int copy(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
         const void *fill, void *out, uint8_t *valid, int allow_gather) {
    Nearest<T> sampler{};
    sampler.all = static_cast<T *>(out);
    std::memcpy(&sampler.fill, fill, sizeof(T));
#ifdef EMF_HAVE_AVX2
    WideNearest<T> wide{};
    wide.all = sampler.all;
    wide.fill = sampler.fill;
    wide.item = sizeof(T);
#else
    WideNone wide;
#endif
    const int64_t example_size = shape[0] * shape[1] * shape[2] * shape[3];
    auto gather = [&](const emf_window &window, int64_t n) {
        return emf_gather_copy(&window, 1, shape, sizeof(T), static_cast<T *>(out) + n * example_size);
    };
    return warp_batch(examples, count, shape, grid, allow_gather, valid, sampler, wide, gather);
}

template <typename Out>
int convert_from(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
                 emf_dtype src_dtype, emf_dtype out_dtype, float fill, void *out, uint8_t *valid, int allow_gather) {
    switch (src_dtype) {
        case EMF_UINT8:
            return convert<uint8_t, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                         allow_gather);
        case EMF_UINT16:
            return convert<uint16_t, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                          allow_gather);
        case EMF_FLOAT32:
            return convert<float, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                       allow_gather);
        case EMF_INT8:
            return convert<int8_t, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                    allow_gather);
        case EMF_INT16:
            return convert<int16_t, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                    allow_gather);
        case EMF_UINT32:
            return convert<uint32_t, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                    allow_gather);
        case EMF_FLOAT16:
            return convert<emf_half::Half, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                    allow_gather);
        case EMF_FLOAT64:
            return convert<double, Out>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                    allow_gather);
        default:
            return EMF_BAD_DTYPE;
    }
}

}  // namespace

extern "C" int emf_warp_convert(const emf_warp_example *examples, int64_t count, const int64_t shape[4],
                                const emf_warp_grid *grid, emf_dtype src_dtype, emf_dtype out_dtype, float fill,
                                void *out, uint8_t *valid, int allow_gather) {
    switch (out_dtype) {
        case EMF_FLOAT32:
            return convert_from<float>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                       allow_gather);
        case EMF_FLOAT16:
            return convert_from<uint16_t>(examples, count, shape, grid, src_dtype, out_dtype, fill, out, valid,
                                          allow_gather);
        default:
            return EMF_BAD_DTYPE;
    }
}

extern "C" int emf_warp_copy(const emf_warp_example *examples, int64_t count, const int64_t shape[4],
                             const emf_warp_grid *grid, int itemsize, const void *fill, void *out, uint8_t *valid,
                             int allow_gather) {
    switch (itemsize) {
        case 1: return copy<uint8_t>(examples, count, shape, grid, fill, out, valid, allow_gather);
        case 2: return copy<uint16_t>(examples, count, shape, grid, fill, out, valid, allow_gather);
        case 4: return copy<uint32_t>(examples, count, shape, grid, fill, out, valid, allow_gather);
        case 8: return copy<uint64_t>(examples, count, shape, grid, fill, out, valid, allow_gather);
        default: return EMF_BAD_DTYPE;
    }
}

static emf_vector::Avx2Switch avx2_switch;

extern "C" void emf_warp_allow_avx2(int allowed) { avx2_switch.allow(allowed); }

extern "C" int emf_warp_uses_avx2(void) { return avx2_switch.used(); }

extern "C" int emf_warp_coordinates(const emf_warp_example *examples, int64_t count, const int64_t shape[3],
                                    const emf_warp_grid *grid, double *out) {
    try {
        const OutputGeometry field(shape, grid);
        Scratch scratch;
        const int64_t plane = shape[0] * shape[1] * shape[2];
        for (int64_t n = 0; n < count; ++n) {
            Coordinates visit{plane, shape[2], out + n * 3 * plane};
            walk(examples[n], field, scratch, visit);
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}
