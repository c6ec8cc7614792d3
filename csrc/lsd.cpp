/* Local shape descriptors; see lsd.h for the contract.
 *
 * The gaussian moments of an object are separable: with t = (q - u) / sigma per axis, each of the ten sums
 * sum_q G(q) t_z^i t_y^j t_x^k (i + j + k <= 2) is the object's indicator filtered by the 1-D kernels
 * g(d) (d / sigma)^n along each axis. So one object costs three 1-D passes (x: orders 0-2, y: the six
 * products of order <= 2, z: the ten) inside the object's bounding box: the indicator is 0 outside it, and only
 * the object's own voxels need a descriptor. Moments are taken about each voxel itself, so no large coordinates
 * cancel (lsds subtracts squares of absolute coordinates in float32).
 *
 * One scan of the labels finds every object's runs along x (find_objects); the passes read those runs, never the
 * labels again. Work follows what the last pass reads. The z pass reads a section's y channels only at the rows and columns
 * where the object lies in some section within the z kernel's reach (find_sections records them); the y pass
 * computes exactly those, from the rows holding the object within the y kernel's reach; the x pass computes those
 * rows at those columns. The x pass reads the indicator as runs of the object along a row: a run [s, e) adds the
 * difference of the kernel's cumulative sums at its two ends, so a row costs (columns x runs), not
 * (columns x taps). The y and z passes walk their source rows with every channel's sums for four columns held in
 * SSE2 registers.
 */
#include "lsd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <unordered_map>
#include <vector>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define EMF_HAVE_SSE2 1
#endif

namespace {

/* A half-open box [lo, hi) per axis (z, y, x). */
struct Box {
    int64_t lo[3], hi[3];

    bool empty() const { return lo[0] >= hi[0] || lo[1] >= hi[1] || lo[2] >= hi[2]; }
    int64_t extent(int a) const { return hi[a] - lo[a]; }
};

/* The truncated gaussian of one axis and its first two moments: weight[n][d + radius] = g(d) (d / sigma)^n,
 * and cumulative[n][i] = sum of weight[n][0 .. i) (for the run-based x pass). */
struct Kernel1d {
    int64_t radius;
    std::vector<float> weight[3];
    std::vector<double> cumulative[3];

    Kernel1d(double sigma, int64_t radius_) : radius(radius_) {
        const int64_t taps = 2 * radius + 1;
        std::vector<double> g(taps);
        double total = 0.0;
        for (int64_t i = 0; i < taps; ++i) {
            const double t = static_cast<double>(i - radius) / sigma;
            g[i] = std::exp(-0.5 * t * t);
            total += g[i];
        }
        for (int n = 0; n < 3; ++n) {
            weight[n].resize(taps);
            cumulative[n].assign(taps + 1, 0.0);
        }
        for (int64_t i = 0; i < taps; ++i) {
            const double t = static_cast<double>(i - radius) / sigma;
            const double w[3] = {g[i] / total, g[i] / total * t, g[i] / total * t * t};
            for (int n = 0; n < 3; ++n) {
                weight[n][i] = static_cast<float>(w[n]);
                cumulative[n][i + 1] = cumulative[n][i] + w[n];
            }
        }
    }
};

/* A run of one object's voxels along x: columns [start, end) of row (z, y) of the patch. */
struct Run {
    int64_t z, y, start, end;
};

/* One object of a patch: its id, the bounding box of its voxels, and its runs [first, last) in Objects::runs. */
struct Object {
    uint64_t id;
    Box box;
    size_t first, last;
};

/* Every object of one patch (ids other than background and ignore) with its runs in scan order (z, y, x): the one
 * pass over the labels; the passes of each object then read its runs only. */
struct Objects {
    std::vector<Object> list;
    std::vector<Run> runs;
};

template <typename T>
Objects find_objects(const T *labels, const int64_t shape[3], int has_background, T background, int has_ignore,
                     T ignore) {
    Objects objects;
    std::vector<std::pair<size_t, Run>> found_runs; /* (object, run) in scan order */
    std::unordered_map<uint64_t, size_t> index;
    for (int64_t z = 0; z < shape[0]; ++z) {
        for (int64_t y = 0; y < shape[1]; ++y) {
            const T *row = labels + (z * shape[1] + y) * shape[2];
            int64_t x = 0;
            while (x < shape[2]) {
                const T id = row[x];
                const int64_t start = x;
                while (x < shape[2] && row[x] == id) ++x;
                if ((has_background && id == background) || (has_ignore && id == ignore)) continue;
                auto found = index.find(static_cast<uint64_t>(id));
                if (found == index.end()) {
                    found = index.emplace(static_cast<uint64_t>(id), objects.list.size()).first;
                    objects.list.push_back({static_cast<uint64_t>(id), {{z, y, start}, {z + 1, y + 1, x}}, 0, 0});
                } else {
                    Box &box = objects.list[found->second].box;
                    box.hi[0] = z + 1;
                    box.lo[1] = std::min(box.lo[1], y);
                    box.hi[1] = std::max(box.hi[1], y + 1);
                    box.lo[2] = std::min(box.lo[2], start);
                    box.hi[2] = std::max(box.hi[2], x);
                }
                ++objects.list[found->second].last; /* counts runs for now */
                found_runs.push_back({found->second, Run{z, y, start, x}});
            }
        }
    }
    /* group the runs by object, keeping scan order within each (a counting sort) */
    size_t offset = 0;
    for (Object &object : objects.list) {
        object.first = offset;
        offset += object.last;
        object.last = object.first;
    }
    objects.runs.resize(found_runs.size());
    for (const auto &entry : found_runs) objects.runs[objects.list[entry.first].last++] = entry.second;
    return objects;
}

/* Channels of the y pass: the x moment (0-2) each one filters, and the order of its y kernel. */
constexpr int kYChannels = 6;
constexpr int kYFromX[kYChannels] = {0, 0, 0, 1, 1, 2};
constexpr int kYOrder[kYChannels] = {0, 1, 2, 0, 1, 0};

/* Channels of the z pass (the ten moments): the y channel each one filters, and the order of its z kernel. */
enum Moment { M0, MZ, MY, MX, MZZ, MYY, MXX, MZY, MZX, MYX, kMoments };
constexpr int kZFromY[kMoments] = {0, 0, 1, 3, 0, 2, 5, 1, 3, 4};
constexpr int kZOrder[kMoments] = {0, 1, 0, 0, 2, 0, 0, 1, 1, 0};

/* One source row of the y pass: the x moments 0-2 of one row (at the first column filtered), and the y kernel's
 * weights of orders 0-2 at its distance. */
struct YSource {
    const float *row[3];
    float weight[3];
};

/* One source row of the z pass: the six y channels of one section's row (at column 0), and the z kernel's
 * weights of orders 0-2 at its distance. */
struct ZSource {
    const float *row[kYChannels];
    float weight[3];
};

/* Arithmetic on one column (float) or, with SSE2, four columns (__m128) at a time. */
struct OneColumn {
    using V = float;
    static constexpr int64_t kWidth = 1;
    static V zero() { return 0.0f; }
    static V load(const float *p) { return *p; }
    static void store(float *p, V v) { *p = v; }
    static V splat(float w) { return w; }
    static V add(V a, V b) { return a + b; }
    static V mul(V a, V b) { return a * b; }
};

#ifdef EMF_HAVE_SSE2
struct FourColumns {
    using V = __m128;
    static constexpr int64_t kWidth = 4;
    static V zero() { return _mm_setzero_ps(); }
    static V load(const float *p) { return _mm_loadu_ps(p); }
    static void store(float *p, V v) { _mm_storeu_ps(p, v); }
    static V splat(float w) { return _mm_set1_ps(w); }
    static V add(V a, V b) { return _mm_add_ps(a, b); }
    static V mul(V a, V b) { return _mm_mul_ps(a, b); }
};
#endif

/* The y pass's step: sum[c] += weight[kYOrder[c]] * row[kYFromX[c]] at column i, for the six y channels. */
struct YStep {
    using Source = YSource;
    static constexpr int kChannels = kYChannels;

    template <typename Ops>
    static void add(typename Ops::V sum[kChannels], const YSource &source, int64_t i) {
        using V = typename Ops::V;
        const V w0 = Ops::splat(source.weight[0]), w1 = Ops::splat(source.weight[1]);
        const V w2 = Ops::splat(source.weight[2]);
        const V x0 = Ops::load(source.row[0] + i), x1 = Ops::load(source.row[1] + i);
        const V x2 = Ops::load(source.row[2] + i);
        sum[0] = Ops::add(sum[0], Ops::mul(w0, x0));
        sum[1] = Ops::add(sum[1], Ops::mul(w1, x0));
        sum[2] = Ops::add(sum[2], Ops::mul(w2, x0));
        sum[3] = Ops::add(sum[3], Ops::mul(w0, x1));
        sum[4] = Ops::add(sum[4], Ops::mul(w1, x1));
        sum[5] = Ops::add(sum[5], Ops::mul(w0, x2));
    }
};

/* The z pass's step: sum[m] += weight[kZOrder[m]] * row[kZFromY[m]] at column i, for the ten moments (one y
 * channel loaded at a time, so the ten sums stay in registers). */
struct ZStep {
    using Source = ZSource;
    static constexpr int kChannels = kMoments;

    template <typename Ops>
    static void add(typename Ops::V sum[kChannels], const ZSource &source, int64_t i) {
        using V = typename Ops::V;
        const V w0 = Ops::splat(source.weight[0]), w1 = Ops::splat(source.weight[1]);
        const V w2 = Ops::splat(source.weight[2]);
        V y = Ops::load(source.row[0] + i);
        sum[M0] = Ops::add(sum[M0], Ops::mul(w0, y));
        sum[MZ] = Ops::add(sum[MZ], Ops::mul(w1, y));
        sum[MZZ] = Ops::add(sum[MZZ], Ops::mul(w2, y));
        y = Ops::load(source.row[1] + i);
        sum[MY] = Ops::add(sum[MY], Ops::mul(w0, y));
        sum[MZY] = Ops::add(sum[MZY], Ops::mul(w1, y));
        y = Ops::load(source.row[2] + i);
        sum[MYY] = Ops::add(sum[MYY], Ops::mul(w0, y));
        y = Ops::load(source.row[3] + i);
        sum[MX] = Ops::add(sum[MX], Ops::mul(w0, y));
        sum[MZX] = Ops::add(sum[MZX], Ops::mul(w1, y));
        y = Ops::load(source.row[4] + i);
        sum[MYX] = Ops::add(sum[MYX], Ops::mul(w0, y));
        y = Ops::load(source.row[5] + i);
        sum[MXX] = Ops::add(sum[MXX], Ops::mul(w0, y));
    }
};

/* Columns [i, hi) in steps of Ops::kWidth, as far as whole steps go; returns the first column left. */
template <typename Step, typename Ops>
int64_t filter_columns(const std::vector<typename Step::Source> &sources, int64_t i, int64_t hi,
                       float *const to[Step::kChannels]) {
    for (; i + Ops::kWidth <= hi; i += Ops::kWidth) {
        typename Ops::V sum[Step::kChannels];
        for (int c = 0; c < Step::kChannels; ++c) sum[c] = Ops::zero();
        for (const auto &source : sources) Step::template add<Ops>(sum, source, i);
        for (int c = 0; c < Step::kChannels; ++c) Ops::store(to[c] + i, sum[c]);
    }
    return i;
}

/* One filter pass over columns [lo, hi): to[c][i] = the sum over `sources` of what Step adds, with every
 * channel's sums in registers while the sources are walked, so each source value is read once. Four columns at
 * a time with SSE2, the rest one at a time, adding in the same order (so both give the same bits). */
template <typename Step>
void filter(const std::vector<typename Step::Source> &sources, int64_t lo, int64_t hi,
            float *const to[Step::kChannels]) {
    int64_t i = lo;
#ifdef EMF_HAVE_SSE2
    i = filter_columns<Step, FourColumns>(sources, i, hi, to);
#endif
    filter_columns<Step, OneColumn>(sources, i, hi, to);
}

/* One section (z) of an object's reach: where the object lies in it, and where its y-pass channels are needed:
 * the inside rows and columns holding the object in some inside section within the z kernel's reach (the only
 * places the z pass reads). Rows are reach rows or inside rows (j) as noted, columns are inside columns; a range
 * is empty where lo >= hi. */
struct Section {
    int64_t rows_lo, rows_hi;           /* rows holding the object */
    int64_t need_lo, need_hi;           /* inside rows (j) whose y-pass channels are needed */
    int64_t written_lo, written_hi;     /* inside columns of the x and y passes */
    int64_t columns_lo, columns_hi;     /* inside columns holding the object within the inside rows */
    int64_t inside_lo, inside_hi;       /* inside rows (j) holding the object */
};

/* Scratch buffers of one call, grown to the largest object and reused for the next. */
struct Scratch {
    std::vector<float> xs, ys, moments;
    std::vector<uint8_t> y_rows;
    std::vector<Section> sections;
    std::vector<std::pair<size_t, size_t>> row_runs; /* per reach row (z, y): its runs [first, last) */
    std::vector<YSource> y_sources;
    std::vector<ZSource> z_sources;
};

/* Patch-wide settings of one call. */
struct Settings {
    int64_t shape[3], margin[3], out[3];
    double variance_floor[3];
    bool planar; /* each section on its own: the six channels of (y, x) */
};

/* Channels written per voxel. */
inline int64_t channels_of(const Settings &s) { return s.planar ? 6 : 10; }

inline float unit(double value) { return static_cast<float>(std::min(1.0, std::max(0.0, value))); }

/* The descriptor channels of one voxel from its moments, written with channel stride `channel`: the ten, or in
 * plane the six of y and x (lsds' 2-D order: mean offset y, x; variance y, x; pearson yx; size). */
inline void finish_voxel(const double m[kMoments], const double floor[3], bool planar, float *out, int64_t channel) {
    const double inv = 1.0 / m[M0];
    const double mean[3] = {m[MZ] * inv, m[MY] * inv, m[MX] * inv};
    const double var[3] = {std::max(m[MZZ] * inv - mean[0] * mean[0], floor[0]),
                           std::max(m[MYY] * inv - mean[1] * mean[1], floor[1]),
                           std::max(m[MXX] * inv - mean[2] * mean[2], floor[2])};
    const double cov[3] = {m[MZY] * inv - mean[0] * mean[1], m[MZX] * inv - mean[0] * mean[2],
                           m[MYX] * inv - mean[1] * mean[2]};
    const double pearson[3] = {cov[0] / std::sqrt(var[0] * var[1]), cov[1] / std::sqrt(var[0] * var[2]),
                               cov[2] / std::sqrt(var[1] * var[2])};
    if (planar) {
        for (int a = 0; a < 2; ++a) {
            out[a * channel] = unit(0.5 * mean[1 + a] + 0.5);
            out[(2 + a) * channel] = unit(var[1 + a]);
        }
        out[4 * channel] = unit(0.5 * pearson[2] + 0.5);
        out[5 * channel] = unit(m[M0]);
        return;
    }
    for (int a = 0; a < 3; ++a) {
        out[a * channel] = unit(0.5 * mean[a] + 0.5);
        out[(3 + a) * channel] = unit(var[a]);
        out[(6 + a) * channel] = unit(0.5 * pearson[a] + 0.5);
    }
    out[9 * channel] = unit(m[M0]);
}

/* One object's geometry in a patch: the output voxels to write and the label voxels they depend on. */
struct Extent {
    Box inside, reach;
    int64_t nz, ny, nx, ny_in; /* reach sections and rows; inside columns and rows */
    int64_t radius_z;          /* reach of the z kernel */
};

/* Where the object lies in each section of the reach (rows, and the inside rows and columns it holds), and
 * which runs each reach row holds. */
void find_sections(const Objects &objects, const Object &object, const Extent &e, Scratch &scratch) {
    scratch.row_runs.assign(e.nz * e.ny, {0, 0});
    scratch.sections.assign(e.nz, Section{INT64_MAX, INT64_MIN, 0, 0, 0, 0, INT64_MAX, INT64_MIN, INT64_MAX,
                                          INT64_MIN});
    const int64_t row_offset = e.inside.lo[1] - e.reach.lo[1];
    for (size_t k = object.first; k < object.last; ++k) {
        const Run &run = objects.runs[k];
        const int64_t z = run.z - e.reach.lo[0], y = run.y - e.reach.lo[1];
        if (z < 0 || z >= e.nz || y < 0 || y >= e.ny) continue;
        auto &span = scratch.row_runs[z * e.ny + y];
        if (span.first == span.second) span.first = k;
        span.second = k + 1;
        Section &section = scratch.sections[z];
        section.rows_lo = std::min(section.rows_lo, y);
        section.rows_hi = y + 1;
        const int64_t j = y - row_offset;
        const int64_t first = std::max(run.start, e.inside.lo[2]) - e.inside.lo[2];
        const int64_t last = std::min(run.end, e.inside.hi[2]) - e.inside.lo[2];
        if (j < 0 || j >= e.ny_in || first >= last) continue;
        section.inside_lo = std::min(section.inside_lo, j);
        section.inside_hi = j + 1;
        section.columns_lo = std::min(section.columns_lo, first);
        section.columns_hi = std::max(section.columns_hi, last);
    }
    /* the z pass at an inside section reads the y channels of every section within the z kernel's reach */
    for (int64_t z = 0; z < e.nz; ++z) {
        Section &section = scratch.sections[z];
        int64_t need_lo = INT64_MAX, need_hi = INT64_MIN, written_lo = INT64_MAX, written_hi = INT64_MIN;
        const int64_t first = std::max<int64_t>(e.inside.lo[0] - e.reach.lo[0], z - e.radius_z);
        const int64_t last = std::min<int64_t>(e.inside.hi[0] - e.reach.lo[0], z + e.radius_z + 1);
        for (int64_t other = first; other < last; ++other) {
            const Section &seen = scratch.sections[other];
            if (seen.inside_lo >= seen.inside_hi || seen.columns_lo >= seen.columns_hi) continue;
            need_lo = std::min(need_lo, seen.inside_lo);
            need_hi = std::max(need_hi, seen.inside_hi);
            written_lo = std::min(written_lo, seen.columns_lo);
            written_hi = std::max(written_hi, seen.columns_hi);
        }
        section.need_lo = need_lo;
        section.need_hi = need_hi;
        section.written_lo = written_lo;
        section.written_hi = written_hi;
    }
}

/* x pass: moments 0-2 along x, at the section's written columns, of every reach row holding the object within the
 * y kernel's reach of the rows needed. */
void pass_x(const Objects &objects, const Extent &e, const Kernel1d &kx, const Kernel1d &ky, Scratch &scratch) {
    scratch.xs.resize(3 * e.nz * e.ny * e.nx);
    const int64_t row_offset = e.inside.lo[1] - e.reach.lo[1];
    for (int64_t z = 0; z < e.nz; ++z) {
        const Section &section = scratch.sections[z];
        if (section.need_lo >= section.need_hi || section.rows_lo >= section.rows_hi) continue;
        const int64_t first = std::max(section.rows_lo, section.need_lo + row_offset - ky.radius);
        const int64_t last = std::min(section.rows_hi, section.need_hi + row_offset + ky.radius);
        for (int64_t y = first; y < last; ++y) {
            const auto span = scratch.row_runs[z * e.ny + y];
            if (span.first == span.second) continue;
            float *moment[3];
            for (int n = 0; n < 3; ++n) moment[n] = scratch.xs.data() + ((n * e.nz + z) * e.ny + y) * e.nx;
            for (int64_t i = section.written_lo; i < section.written_hi; ++i) {
                const int64_t x = e.inside.lo[2] + i;
                double sum[3] = {0.0, 0.0, 0.0};
                for (size_t k = span.first; k < span.second; ++k) {
                    const int64_t lo = std::max(objects.runs[k].start, x - kx.radius);
                    const int64_t hi = std::min(objects.runs[k].end, x + kx.radius + 1);
                    if (lo >= hi) continue;
                    for (int n = 0; n < 3; ++n)
                        sum[n] += kx.cumulative[n][hi - x + kx.radius] - kx.cumulative[n][lo - x + kx.radius];
                }
                for (int n = 0; n < 3; ++n) moment[n][i] = static_cast<float>(sum[n]);
            }
        }
    }
}

/* y pass: the six products of order <= 2 at each section's needed rows and written columns. */
void pass_y(const Extent &e, const Kernel1d &ky, Scratch &scratch) {
    scratch.ys.resize(kYChannels * e.nz * e.ny_in * e.nx);
    scratch.y_rows.assign(e.nz * e.ny_in, 0);
    const int64_t row_offset = e.inside.lo[1] - e.reach.lo[1]; /* reach row of inside row 0 */
    for (int64_t z = 0; z < e.nz; ++z) {
        const Section &section = scratch.sections[z];
        if (section.need_lo >= section.need_hi || section.rows_lo >= section.rows_hi) continue;
        const int64_t columns = section.written_hi - section.written_lo;
        for (int64_t j = section.need_lo; j < section.need_hi; ++j) {
            const int64_t y = j + row_offset;
            scratch.y_sources.clear();
            const int64_t first = std::max(section.rows_lo, y - ky.radius);
            const int64_t last = std::min(section.rows_hi, y + ky.radius + 1);
            for (int64_t source = first; source < last; ++source) {
                const auto span = scratch.row_runs[z * e.ny + source];
                if (span.first == span.second) continue;
                YSource entry;
                for (int n = 0; n < 3; ++n) {
                    entry.row[n] = scratch.xs.data() + ((n * e.nz + z) * e.ny + source) * e.nx + section.written_lo;
                    entry.weight[n] = ky.weight[n][source - y + ky.radius];
                }
                scratch.y_sources.push_back(entry);
            }
            if (scratch.y_sources.empty()) continue;
            scratch.y_rows[z * e.ny_in + j] = 1;
            float *to[kYChannels];
            for (int c = 0; c < kYChannels; ++c)
                to[c] = scratch.ys.data() + ((c * e.nz + z) * e.ny_in + j) * e.nx + section.written_lo;
            filter<YStep>(scratch.y_sources, 0, columns, to);
        }
    }
}

/* z pass: the ten moments along each inside row holding the object, over the columns from its first to its last
 * voxel, then the descriptors of its voxels. */
void pass_z(const Objects &objects, const Extent &e, const Settings &s, const Kernel1d &kz, Scratch &scratch,
            float *out) {
    scratch.moments.resize(kMoments * e.nx);
    const int64_t channel = s.out[0] * s.out[1] * s.out[2];
    const int64_t row_offset = e.inside.lo[1] - e.reach.lo[1];
    for (int64_t zr = e.inside.lo[0] - e.reach.lo[0]; zr < e.inside.hi[0] - e.reach.lo[0]; ++zr) {
        for (int64_t j = 0; j < e.ny_in; ++j) {
            const auto span = scratch.row_runs[zr * e.ny + j + row_offset];
            /* the row's runs, clipped to the inside columns (relative to the first) */
            int64_t lo = INT64_MAX, hi = INT64_MIN;
            for (size_t k = span.first; k < span.second; ++k) {
                lo = std::min(lo, std::max(objects.runs[k].start, e.inside.lo[2]) - e.inside.lo[2]);
                hi = std::max(hi, std::min(objects.runs[k].end, e.inside.hi[2]) - e.inside.lo[2]);
            }
            if (lo >= hi) continue;
            scratch.z_sources.clear();
            const int64_t first = std::max<int64_t>(0, zr - kz.radius), last = std::min(e.nz, zr + kz.radius + 1);
            for (int64_t source = first; source < last; ++source) {
                /* a written row covers [lo, hi): find_sections grew its columns by this section's; an unwritten
                 * one has no object voxel within the y kernel's reach, so it adds 0 */
                if (!scratch.y_rows[source * e.ny_in + j]) continue;
                ZSource entry;
                for (int c = 0; c < kYChannels; ++c)
                    entry.row[c] = scratch.ys.data() + ((c * e.nz + source) * e.ny_in + j) * e.nx;
                for (int n = 0; n < 3; ++n) entry.weight[n] = kz.weight[n][source - zr + kz.radius];
                scratch.z_sources.push_back(entry);
            }
            float *moments[kMoments];
            for (int m = 0; m < kMoments; ++m) moments[m] = scratch.moments.data() + m * e.nx;
            filter<ZStep>(scratch.z_sources, lo, hi, moments);
            float *target = out + (e.reach.lo[0] + zr - s.margin[0]) * s.out[1] * s.out[2] +
                            (e.inside.lo[1] + j - s.margin[1]) * s.out[2] + (e.inside.lo[2] - s.margin[2]);
            for (size_t k = span.first; k < span.second; ++k) {
                const int64_t start = std::max(objects.runs[k].start, e.inside.lo[2]) - e.inside.lo[2];
                const int64_t end = std::min(objects.runs[k].end, e.inside.hi[2]) - e.inside.lo[2];
                for (int64_t i = start; i < end; ++i) {
                    double m[kMoments];
                    for (int c = 0; c < kMoments; ++c) m[c] = moments[c][i];
                    finish_voxel(m, s.variance_floor, s.planar, target + i, channel);
                }
            }
        }
    }
}

/* Descriptors of one object of one patch, written at its voxels in the output region. */
void object_descriptors(const Objects &objects, const Object &object, const Settings &s, const Kernel1d kernel[3],
                        Scratch &scratch, float *out) {
    Extent e;
    for (int a = 0; a < 3; ++a) {
        e.inside.lo[a] = std::max(object.box.lo[a], s.margin[a]);
        e.inside.hi[a] = std::min(object.box.hi[a], s.shape[a] - s.margin[a]);
        e.reach.lo[a] = std::max(object.box.lo[a], e.inside.lo[a] - kernel[a].radius);
        e.reach.hi[a] = std::min(object.box.hi[a], e.inside.hi[a] + kernel[a].radius);
    }
    if (e.inside.empty()) return;
    e.nz = e.reach.extent(0);
    e.ny = e.reach.extent(1);
    e.nx = e.inside.extent(2);
    e.ny_in = e.inside.extent(1);
    e.radius_z = kernel[0].radius;
    find_sections(objects, object, e, scratch);
    pass_x(objects, e, kernel[2], kernel[1], scratch);
    pass_y(e, kernel[1], scratch);
    pass_z(objects, e, s, kernel[0], scratch, out);
}

/* The mask of one patch: 1 on object voxels, 0 on background and ignore voxels. */
template <typename T>
void object_mask(const T *labels, const Settings &s, int has_background, T background, int has_ignore, T ignore,
                 uint8_t *mask) {
    for (int64_t z = 0; z < s.out[0]; ++z) {
        for (int64_t y = 0; y < s.out[1]; ++y) {
            const T *row = labels + ((z + s.margin[0]) * s.shape[1] + y + s.margin[1]) * s.shape[2] + s.margin[2];
            uint8_t *to = mask + (z * s.out[1] + y) * s.out[2];
            for (int64_t x = 0; x < s.out[2]; ++x)
                to[x] = !((has_background && row[x] == background) || (has_ignore && row[x] == ignore));
        }
    }
}

template <typename T>
void lsd_typed(const emf_labels &labels, const Settings &s, const Kernel1d kernel[3], int has_background,
               T background, int has_ignore, T ignore, float *out, uint8_t *mask) {
    const int64_t patch = s.shape[0] * s.shape[1] * s.shape[2];
    const int64_t out_size = s.out[0] * s.out[1] * s.out[2];
    Scratch scratch;
    for (int64_t n = 0; n < labels.count; ++n) {
        const T *patch_labels = static_cast<const T *>(labels.data) + n * patch;
        float *patch_out = out + n * channels_of(s) * out_size;
        std::fill(patch_out, patch_out + channels_of(s) * out_size, 0.0f);
        const Objects objects = find_objects(patch_labels, s.shape, has_background, background, has_ignore, ignore);
        for (const Object &object : objects.list) object_descriptors(objects, object, s, kernel, scratch, patch_out);
        object_mask(patch_labels, s, has_background, background, has_ignore, ignore, mask + n * out_size);
    }
}

}  // namespace

extern "C" {

int emf_lsd(const emf_labels *labels, const double sigma[3], const int64_t radius[3],
            const double variance_floor[3], int has_background, uint64_t background, int has_ignore,
            uint64_t ignore, int planar, float *out, uint8_t *mask) {
    Settings s;
    s.planar = planar != 0;
    for (int a = 0; a < 3; ++a) {
        s.shape[a] = labels->shape[a];
        s.margin[a] = labels->margin[a];
        s.out[a] = s.shape[a] - 2 * s.margin[a];
        s.variance_floor[a] = variance_floor[a];
    }
    try {
        const Kernel1d kernel[3] = {Kernel1d(sigma[0], radius[0]), Kernel1d(sigma[1], radius[1]),
                                    Kernel1d(sigma[2], radius[2])};
        switch (labels->itemsize) {
            case 4:
                lsd_typed<uint32_t>(*labels, s, kernel, has_background, static_cast<uint32_t>(background),
                                    has_ignore, static_cast<uint32_t>(ignore), out, mask);
                return EMF_OK;
            case 8:
                lsd_typed<uint64_t>(*labels, s, kernel, has_background, background, has_ignore, ignore, out,
                                    mask);
                return EMF_OK;
            default:
                return EMF_BAD_DTYPE;
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
}

}  // extern "C"
