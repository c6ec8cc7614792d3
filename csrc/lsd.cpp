/* Local shape descriptors; see lsd.h for the contract.
 *
 * The gaussian moments of an object are separable: with t = (q - u) / sigma per axis, each of the ten sums
 * sum_q G(q) t_z^i t_y^j t_x^k (i + j + k <= 2) is the object's indicator filtered by the 1-D kernels
 * g(d) (d / sigma)^n along each axis. So one object costs three 1-D passes (x: orders 0-2, y: the six
 * products of order <= 2, z: the ten), all restricted to the object's bounding box: the indicator is 0 outside
 * it, and only the object's own voxels need a descriptor. Moments are taken about each voxel itself, so no
 * large coordinates cancel (lsds subtracts squares of absolute coordinates in float32).
 *
 * The x pass reads the indicator as runs of the object along a row: a run [s, e) adds the difference of the
 * kernel's cumulative sums at its two ends, so a row costs (output voxels x runs), not (voxels x taps). The y and
 * z passes are plain weighted sums of whole rows, which the compiler vectorises along x. Rows with no object
 * voxel within reach are skipped.
 */
#include "lsd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <unordered_map>
#include <vector>

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

/* One object of a patch: its id and the bounding box of its voxels. */
struct Object {
    uint64_t id;
    Box box;
};

/* Every object of one patch (ids other than background and ignore), found run by run along x. */
template <typename T>
std::vector<Object> find_objects(const T *labels, const int64_t shape[3], int has_background, T background,
                                 int has_ignore, T ignore) {
    std::vector<Object> objects;
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
                    found = index.emplace(static_cast<uint64_t>(id), objects.size()).first;
                    objects.push_back({static_cast<uint64_t>(id), {{z, y, start}, {z + 1, y + 1, x}}});
                    continue;
                }
                Box &box = objects[found->second].box;
                box.hi[0] = z + 1;
                box.lo[1] = std::min(box.lo[1], y);
                box.hi[1] = std::max(box.hi[1], y + 1);
                box.lo[2] = std::min(box.lo[2], start);
                box.hi[2] = std::max(box.hi[2], x);
            }
        }
    }
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

/* Scratch buffers of one call, grown to the largest object and reused for the next. */
struct Scratch {
    std::vector<float> xs, ys, moments;
    std::vector<uint8_t> x_rows, y_rows, need_y;
    std::vector<std::pair<int64_t, int64_t>> runs;
};

/* Patch-wide settings of one call. */
struct Settings {
    int64_t shape[3], margin[3], out[3];
    double variance_floor[3];
};

inline float unit(double value) { return static_cast<float>(std::min(1.0, std::max(0.0, value))); }

/* The ten descriptor channels of one voxel from its moments, written with channel stride `channel`. */
inline void finish_voxel(const double m[kMoments], const double floor[3], float *out, int64_t channel) {
    const double inv = 1.0 / m[M0];
    const double mean[3] = {m[MZ] * inv, m[MY] * inv, m[MX] * inv};
    const double var[3] = {std::max(m[MZZ] * inv - mean[0] * mean[0], floor[0]),
                           std::max(m[MYY] * inv - mean[1] * mean[1], floor[1]),
                           std::max(m[MXX] * inv - mean[2] * mean[2], floor[2])};
    const double cov[3] = {m[MZY] * inv - mean[0] * mean[1], m[MZX] * inv - mean[0] * mean[2],
                           m[MYX] * inv - mean[1] * mean[2]};
    const double pearson[3] = {cov[0] / std::sqrt(var[0] * var[1]), cov[1] / std::sqrt(var[0] * var[2]),
                               cov[2] / std::sqrt(var[1] * var[2])};
    for (int a = 0; a < 3; ++a) {
        out[a * channel] = unit(0.5 * mean[a] + 0.5);
        out[(3 + a) * channel] = unit(var[a]);
        out[(6 + a) * channel] = unit(0.5 * pearson[a] + 0.5);
    }
    out[9 * channel] = unit(m[M0]);
}

/* Descriptors of one object of one patch, written at its voxels in the output region. */
template <typename T>
void object_descriptors(const T *labels, const Object &object, const Settings &s, const Kernel1d kernel[3],
                        Scratch &scratch, float *out) {
    const T id = static_cast<T>(object.id);
    Box inside, reach; /* output voxels to write; label voxels they depend on */
    for (int a = 0; a < 3; ++a) {
        inside.lo[a] = std::max(object.box.lo[a], s.margin[a]);
        inside.hi[a] = std::min(object.box.hi[a], s.shape[a] - s.margin[a]);
        reach.lo[a] = std::max(object.box.lo[a], inside.lo[a] - kernel[a].radius);
        reach.hi[a] = std::min(object.box.hi[a], inside.hi[a] + kernel[a].radius);
    }
    if (inside.empty()) return;
    const int64_t nz = reach.extent(0), ny = reach.extent(1), nx = inside.extent(2), ny_in = inside.extent(1);
    const int64_t stride_y = s.shape[2], stride_z = s.shape[1] * s.shape[2];

    /* x pass: moments 0-2 along x of each row of the reach, at the inside x positions. */
    scratch.xs.resize(3 * nz * ny * nx);
    scratch.x_rows.assign(nz * ny, 0);
    scratch.need_y.assign(ny_in, 0);
    const Kernel1d &kx = kernel[2];
    for (int64_t z = 0; z < nz; ++z) {
        for (int64_t y = 0; y < ny; ++y) {
            const T *row = labels + (reach.lo[0] + z) * stride_z + (reach.lo[1] + y) * stride_y;
            scratch.runs.clear();
            for (int64_t x = reach.lo[2]; x < reach.hi[2];) {
                if (row[x] != id) {
                    ++x;
                    continue;
                }
                const int64_t start = x;
                while (x < reach.hi[2] && row[x] == id) ++x;
                scratch.runs.emplace_back(start, x);
            }
            if (scratch.runs.empty()) continue;
            scratch.x_rows[z * ny + y] = 1;
            const int64_t y_inside = reach.lo[1] + y - inside.lo[1];
            if (y_inside >= 0 && y_inside < ny_in) scratch.need_y[y_inside] = 1;
            float *moment[3];
            for (int n = 0; n < 3; ++n) moment[n] = scratch.xs.data() + ((n * nz + z) * ny + y) * nx;
            for (int64_t i = 0; i < nx; ++i) {
                const int64_t x = inside.lo[2] + i;
                double sum[3] = {0.0, 0.0, 0.0};
                for (const auto &run : scratch.runs) {
                    const int64_t lo = std::max(run.first, x - kx.radius), hi = std::min(run.second, x + kx.radius + 1);
                    if (lo >= hi) continue;
                    for (int n = 0; n < 3; ++n)
                        sum[n] += kx.cumulative[n][hi - x + kx.radius] - kx.cumulative[n][lo - x + kx.radius];
                }
                for (int n = 0; n < 3; ++n) moment[n][i] = static_cast<float>(sum[n]);
            }
        }
    }

    /* y pass: the six products of order <= 2 at the inside y positions, for every z of the reach. */
    scratch.ys.resize(kYChannels * nz * ny_in * nx);
    scratch.y_rows.assign(nz * ny_in, 0);
    const Kernel1d &ky = kernel[1];
    for (int64_t z = 0; z < nz; ++z) {
        for (int64_t j = 0; j < ny_in; ++j) {
            if (!scratch.need_y[j]) continue;
            float *sum[kYChannels];
            for (int c = 0; c < kYChannels; ++c) {
                sum[c] = scratch.ys.data() + ((c * nz + z) * ny_in + j) * nx;
                std::fill(sum[c], sum[c] + nx, 0.0f);
            }
            const int64_t y = inside.lo[1] + j - reach.lo[1]; /* in reach rows */
            const int64_t first = std::max<int64_t>(0, y - ky.radius), last = std::min(ny, y + ky.radius + 1);
            for (int64_t source = first; source < last; ++source) {
                if (!scratch.x_rows[z * ny + source]) continue;
                scratch.y_rows[z * ny_in + j] = 1;
                const int64_t tap = source - y + ky.radius;
                for (int c = 0; c < kYChannels; ++c) {
                    const float w = ky.weight[kYOrder[c]][tap];
                    const float *from = scratch.xs.data() + ((kYFromX[c] * nz + z) * ny + source) * nx;
                    float *to = sum[c];
                    for (int64_t i = 0; i < nx; ++i) to[i] += w * from[i];
                }
            }
        }
    }

    /* z pass: the ten moments at the object's inside voxels, then their descriptors. */
    scratch.moments.resize(kMoments * nx);
    const Kernel1d &kz = kernel[0];
    const int64_t channel = s.out[0] * s.out[1] * s.out[2];
    for (int64_t z = inside.lo[0]; z < inside.hi[0]; ++z) {
        for (int64_t y = inside.lo[1]; y < inside.hi[1]; ++y) {
            const int64_t j = y - inside.lo[1];
            if (!scratch.need_y[j]) continue;
            const T *row = labels + z * stride_z + y * stride_y + inside.lo[2];
            if (std::find(row, row + nx, id) == row + nx) continue;
            std::fill(scratch.moments.begin(), scratch.moments.end(), 0.0f);
            const int64_t zr = z - reach.lo[0];
            const int64_t first = std::max<int64_t>(0, zr - kz.radius), last = std::min(nz, zr + kz.radius + 1);
            for (int64_t source = first; source < last; ++source) {
                if (!scratch.y_rows[source * ny_in + j]) continue;
                const int64_t tap = source - zr + kz.radius;
                for (int c = 0; c < kMoments; ++c) {
                    const float w = kz.weight[kZOrder[c]][tap];
                    const float *from = scratch.ys.data() + ((kZFromY[c] * nz + source) * ny_in + j) * nx;
                    float *to = scratch.moments.data() + c * nx;
                    for (int64_t i = 0; i < nx; ++i) to[i] += w * from[i];
                }
            }
            float *target = out + (z - s.margin[0]) * s.out[1] * s.out[2] + (y - s.margin[1]) * s.out[2] +
                            (inside.lo[2] - s.margin[2]);
            for (int64_t i = 0; i < nx; ++i) {
                if (row[i] != id) continue;
                double m[kMoments];
                for (int c = 0; c < kMoments; ++c) m[c] = scratch.moments[c * nx + i];
                finish_voxel(m, s.variance_floor, target + i, channel);
            }
        }
    }
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
        float *patch_out = out + n * 10 * out_size;
        std::fill(patch_out, patch_out + 10 * out_size, 0.0f);
        const std::vector<Object> objects =
            find_objects(patch_labels, s.shape, has_background, background, has_ignore, ignore);
        for (const Object &object : objects)
            object_descriptors(patch_labels, object, s, kernel, scratch, patch_out);
        object_mask(patch_labels, s, has_background, background, has_ignore, ignore, mask + n * out_size);
    }
}

}  // namespace

extern "C" {

int emf_lsd(const emf_labels *labels, const double sigma[3], const int64_t radius[3],
            const double variance_floor[3], int has_background, uint64_t background, int has_ignore,
            uint64_t ignore, float *out, uint8_t *mask) {
    Settings s;
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
