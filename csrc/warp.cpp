/* Batched warp kernels; see warp.h for the contract.
 *
 * Each example is walked row by row (output z, then y). The elastic displacement is evaluated separably: the
 * control grid is contracted along z once per output plane, along y once per row, and along x into the row's
 * displacement one segment of x at a time (within a segment the four control points are fixed, so the loop
 * over x is four contiguous multiply-adds, vectorisable). The source
 * coordinate is then affine in x plus that displacement: it is produced in runs of kRun voxels, in float64 at
 * the start of a run and in float32 relative to the run's integer base voxel within it, split into integer
 * voxel and fraction by vectorisable loops, and finally sampled voxel by voxel.
 */
#include "warp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define EMF_HAVE_SSE2 1
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
struct Field {
    int64_t shape[3];
    double centre[3]; /* (shape - 1) / 2 */
    const emf_warp_grid *grid;
    AxisSpline axis[3];

    Field(const int64_t shape_[3], const emf_warp_grid *grid_) : grid(grid_) {
        for (int a = 0; a < 3; ++a) {
            shape[a] = shape_[a];
            centre[a] = (shape[a] - 1) / 2.0;
            if (grid) axis[a].build(shape[a], grid->shape[a], grid->spacing[a], grid->origin[a], a == 2);
        }
    }
};

/* One output row: the source coordinates of its X voxels, in runs of kRun voxels, each relative to the run's
 * integer base voxel: voxel x reads base[3 (x / kRun) + c] + s[c * stride + x] along source axis c. The stride
 * rounds X up to whole runs, so that every loop over a run has the constant trip count kRun. */
struct Row {
    int64_t stride;
    std::vector<int64_t> base;
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

/* Calls visit.row(row, offset) for every output row of example `ex` in order, offset being the row's first
 * voxel in (Z, Y, X), then visit.end(). */
template <typename Visit>
void walk(const emf_warp_example &ex, const Field &field, Scratch &scratch, Visit &visit) {
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
    row.s.resize(3 * stride);
    const AxisSpline &sz = field.axis[0], &sy = field.axis[1], &sx = field.axis[2];
    float step[3];
    for (int c = 0; c < 3; ++c) step[c] = static_cast<float>(A[3 * c + 2]);
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
                float *line = scratch.line.data() + c * gx;
                std::fill(line, line + gx, 0.0f);
                for (int tap = 0; tap < 4; ++tap) {
                    const float w = sy.weight[4 * y + tap];
                    const float *src = scratch.plane.data() + c * gy * gx + sy.index[4 * y + tap] * gx;
                    for (int64_t k = 0; k < gx; ++k) line[k] += w * src[k];
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
                const float a = step[c];
                for (int64_t x0 = 0; x0 < X; x0 += kRun) {
                    const double first = start + A[3 * c + 2] * x0;
                    const double base = std::floor(first);
                    row.base[3 * (x0 / kRun) + c] = static_cast<int64_t>(base);
                    const float r = static_cast<float>(first - base);
                    const float *__restrict d = scratch.disp.data() + c * stride + x0;
                    float *__restrict s = row.s.data() + c * stride + x0;
                    for (int i = 0; i < kRun; ++i) s[i] = r + static_cast<float>(i) * a + d[i];
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
struct Sampler {
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

/* Raw: trilinear samples of every channel, converted as value * scale + shift. A voxel whose z fraction is 0
 * (any warp that keeps z on the sections) reads only its own plane: the other plane has weight 0. */
template <typename Src, typename Out>
struct Linear : Sampler<Out, true> {
    using Base = Sampler<Out, true>;

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
            const int64_t dy = edge & 2 ? 0 : sty, dx = edge & 4 ? 0 : stx;
            for (int64_t ch = 0; ch < Base::channels; ++ch, at += stc) {
                float v = lerp(lerp(load_float<Src>(at), load_float<Src>(at + dx), fx[x]),
                               lerp(load_float<Src>(at + dy), load_float<Src>(at + dy + dx), fx[x]), fy[x]);
                if (fz[x] != 0.0f) {
                    const char *up = at + (edge & 1 ? 0 : stz);
                    const float w = lerp(lerp(load_float<Src>(up), load_float<Src>(up + dx), fx[x]),
                                         lerp(load_float<Src>(up + dy), load_float<Src>(up + dy + dx), fx[x]), fy[x]);
                    v = lerp(v, w, fz[x]);
                }
                dst[ch * plane + x] = Store<Out>::from(v * scale + shift);
            }
        }
    }
};

/* Labels: the nearest voxel of every channel, bit for bit. */
template <typename T>
struct Nearest : Sampler<T, false> {
    using Base = Sampler<T, false>;

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

/* The coordinates themselves, as float64. */
struct Coordinates {
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

/* Runs `sampler` over every example, except those the gather path takes (`gather(window, n)`). */
template <typename Sampler, typename Gather>
int warp_batch(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
               int allow_gather, uint8_t *valid, Sampler &sampler, const Gather &gather) {
    try {
        const Field field(shape + 1, grid);
        Scratch scratch;
        const int64_t plane = shape[1] * shape[2] * shape[3];
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
            sampler.begin(ex, n, shape, valid_n);
            walk(ex, field, scratch, sampler);
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

template <typename Src, typename Out>
int convert(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
            emf_dtype src_dtype, emf_dtype out_dtype, float fill, void *out, uint8_t *valid, int allow_gather) {
    Linear<Src, Out> sampler{};
    sampler.all = static_cast<Out *>(out);
    sampler.fill = Store<Out>::from(fill);
    const int64_t example_size = shape[0] * shape[1] * shape[2] * shape[3];
    auto gather = [&](const emf_window &window, int64_t n) {
        return emf_gather_convert(&window, 1, shape, src_dtype, out_dtype, static_cast<Out *>(out) + n * example_size);
    };
    return warp_batch(examples, count, shape, grid, allow_gather, valid, sampler, gather);
}

template <typename T>
int copy(const emf_warp_example *examples, int64_t count, const int64_t shape[4], const emf_warp_grid *grid,
         const void *fill, void *out, uint8_t *valid, int allow_gather) {
    Nearest<T> sampler{};
    sampler.all = static_cast<T *>(out);
    std::memcpy(&sampler.fill, fill, sizeof(T));
    const int64_t example_size = shape[0] * shape[1] * shape[2] * shape[3];
    auto gather = [&](const emf_window &window, int64_t n) {
        return emf_gather_copy(&window, 1, shape, sizeof(T), static_cast<T *>(out) + n * example_size);
    };
    return warp_batch(examples, count, shape, grid, allow_gather, valid, sampler, gather);
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

extern "C" int emf_warp_coordinates(const emf_warp_example *examples, int64_t count, const int64_t shape[3],
                                    const emf_warp_grid *grid, double *out) {
    try {
        const Field field(shape, grid);
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
