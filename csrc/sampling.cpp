/* Index kernels of the samplers; see sampling.h for the contract.
 *
 * Classes are computed one label row (z, y) at a time into a byte buffer: a boundary voxel is found by comparing
 * the row with itself shifted along x and with each neighbouring row along y and z that lies in the view, one
 * branch-free pass per neighbour. Window sums are separable running
 * sums: along x per row, along y per plane, and along z by adding the plane entering the window and subtracting
 * the one leaving it (recomputed, so scratch memory is a few planes whatever the window depth).
 */
#include "sampling.h"

#include <algorithm>
#include <bitset>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace {

template <typename T>
inline T load(const char *p) {
    T v;
    std::memcpy(&v, p, sizeof(T)); /* views may be unaligned (any byte strides) */
    return v;
}

/* Classes of voxels x0 <= x < x1 of row (z, y) into out[0 .. x1 - x0). */
template <typename T>
void classify_row(const emf_label_view &view, const emf_class_rule &rule, int64_t z, int64_t y, int64_t x0,
                  int64_t x1, uint8_t *out) {
    const int64_t sx = view.strides[2];
    const char *row = view.data + z * view.strides[0] + y * view.strides[1];
    if (rule.mode == EMF_CLASSES_MAP) {
        bool cached = false;
        T last = 0;
        uint8_t last_class = EMF_NO_CLASS;
        const uint64_t *ids_end = rule.ids + rule.n_ids;
        for (int64_t x = x0; x < x1; ++x) {
            const T v = load<T>(row + x * sx);
            if (!cached || v != last) { /* labels come in runs: look an id up once per run */
                const uint64_t *found = std::lower_bound(rule.ids, ids_end, static_cast<uint64_t>(v));
                last_class = (found != ids_end && *found == static_cast<uint64_t>(v))
                                 ? rule.id_classes[found - rule.ids]
                                 : static_cast<uint8_t>(EMF_NO_CLASS);
                last = v;
                cached = true;
            }
            out[x - x0] = last_class;
        }
        return;
    }
    /* A voxel is a boundary voxel (out = 1 for now) where a neighbour differs: one pass per neighbour row along
     * y and z, and per shift along x, each a plain compare-and-or loop the compiler can vectorise. */
    std::fill(out, out + (x1 - x0), uint8_t{0});
    const auto compare = [&](const char *other, int64_t begin, int64_t end, int64_t shift) {
        if (sx == static_cast<int64_t>(sizeof(T))) { /* contiguous rows: a constant stride lets this vectorise */
            for (int64_t x = begin; x < end; ++x) {
                out[x - x0] |= load<T>(other + (x + shift) * sizeof(T)) != load<T>(row + x * sizeof(T));
            }
            return;
        }
        for (int64_t x = begin; x < end; ++x) {
            out[x - x0] |= load<T>(other + (x + shift) * sx) != load<T>(row + x * sx);
        }
    };
    const int64_t width = view.shape[2];
    /* a step of the view's longest extent or more reaches no voxel in it: a huge thickness must not loop */
    const int64_t reach = std::min(rule.thickness, std::max({view.shape[0], view.shape[1], width}));
    for (int64_t t = 1; t <= reach; ++t) {
        if (y - t >= 0) compare(row - t * view.strides[1], x0, x1, 0);
        if (y + t < view.shape[1]) compare(row + t * view.strides[1], x0, x1, 0);
        if (!rule.in_plane) {
            if (z - t >= 0) compare(row - t * view.strides[0], x0, x1, 0);
            if (z + t < view.shape[0]) compare(row + t * view.strides[0], x0, x1, 0);
        }
        compare(row, std::max(x0, t), x1, -t);
        compare(row, x0, std::min(x1, width - t), t);
    }
    for (int64_t x = x0; x < x1; ++x) out[x - x0] ^= 1; /* class 0 boundary, class 1 interior */
}

void classify(const emf_label_view &view, const emf_class_rule &rule, int64_t z, int64_t y, int64_t x0, int64_t x1,
              uint8_t *out) {
    if (view.itemsize == 4) {
        classify_row<uint32_t>(view, rule, z, y, x0, x1, out);
    } else {
        classify_row<uint64_t>(view, rule, z, y, x0, x1, out);
    }
}

inline int popcount(uint64_t w) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_popcountll(w);
#else
    return static_cast<int>(std::bitset<64>(w).count());
#endif
}

/* Window sums along x then y of coverage plane z: out is (shape[1] - extent[1] + 1, px), rows is scratch
 * (shape[1], px). */
void plane_sums(const uint8_t *coverage, const int64_t shape[3], const int64_t extent[3], int64_t z, int32_t *rows,
                int32_t *out) {
    const int64_t ny = shape[1], nx = shape[2];
    const int64_t ey = extent[1], ex = extent[2];
    const int64_t py = ny - ey + 1, px = nx - ex + 1;
    for (int64_t y = 0; y < ny; ++y) {
        const uint8_t *r = coverage + (z * ny + y) * nx;
        int32_t *q = rows + y * px;
        int32_t s = 0;
        for (int64_t x = 0; x < ex; ++x) s += r[x];
        q[0] = s;
        for (int64_t x = 1; x < px; ++x) {
            s += static_cast<int32_t>(r[x + ex - 1]) - static_cast<int32_t>(r[x - 1]);
            q[x] = s;
        }
    }
    std::fill(out, out + px, 0);
    for (int64_t y = 0; y < ey; ++y) {
        const int32_t *q = rows + y * px;
        for (int64_t x = 0; x < px; ++x) out[x] += q[x];
    }
    for (int64_t y = 1; y < py; ++y) {
        const int32_t *previous = out + (y - 1) * px;
        const int32_t *entering = rows + (y + ey - 1) * px;
        const int32_t *leaving = rows + (y - 1) * px;
        int32_t *o = out + y * px;
        for (int64_t x = 0; x < px; ++x) o[x] = previous[x] + entering[x] - leaving[x];
    }
}

}  // namespace

extern "C" int emf_count_classes(const emf_label_view *labels, const emf_class_rule *rule, const int64_t lo[3],
                                 const int64_t hi[3], const int64_t block[3], uint32_t *counts) {
    int64_t grid[3];
    for (int a = 0; a < 3; ++a) grid[a] = (hi[a] - lo[a] + block[a] - 1) / block[a];
    const int64_t n_classes = rule->n_classes;
    std::fill(counts, counts + grid[0] * grid[1] * grid[2] * n_classes, 0u);
    std::vector<uint8_t> classes;
    try {
        classes.resize(static_cast<size_t>(hi[2] - lo[2]));
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    for (int64_t z = lo[0]; z < hi[0]; ++z) {
        const int64_t bz = (z - lo[0]) / block[0];
        for (int64_t y = lo[1]; y < hi[1]; ++y) {
            const int64_t by = (y - lo[1]) / block[1];
            classify(*labels, *rule, z, y, lo[2], hi[2], classes.data());
            uint32_t *row = counts + (bz * grid[1] + by) * grid[2] * n_classes;
            for (int64_t bx = 0; bx < grid[2]; ++bx) {
                uint32_t *cell = row + bx * n_classes;
                const int64_t begin = bx * block[2], end = std::min((bx + 1) * block[2], hi[2] - lo[2]);
                if (rule->mode == EMF_CLASSES_BOUNDARY) { /* classes are 0 / 1: their sum counts class 1 */
                    uint32_t interior = 0;
                    for (int64_t x = begin; x < end; ++x) interior += classes[x];
                    cell[0] += static_cast<uint32_t>(end - begin) - interior;
                    cell[1] += interior;
                    continue;
                }
                for (int64_t x = begin; x < end; ++x) {
                    const uint8_t c = classes[x];
                    if (c != EMF_NO_CLASS) ++cell[c];
                }
            }
        }
    }
    return EMF_OK;
}

extern "C" int emf_select_class(const emf_label_view *labels, const emf_class_rule *rule, const int64_t lo[3],
                                const int64_t hi[3], int cls, int64_t rank, int64_t out[3]) {
    out[0] = out[1] = out[2] = -1;
    std::vector<uint8_t> classes;
    try {
        classes.resize(static_cast<size_t>(hi[2] - lo[2]));
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    for (int64_t z = lo[0]; z < hi[0]; ++z) {
        for (int64_t y = lo[1]; y < hi[1]; ++y) {
            classify(*labels, *rule, z, y, lo[2], hi[2], classes.data());
            for (int64_t x = lo[2]; x < hi[2]; ++x) {
                if (classes[x - lo[2]] == cls && rank-- == 0) {
                    out[0] = z;
                    out[1] = y;
                    out[2] = x;
                    return EMF_OK;
                }
            }
        }
    }
    return EMF_OK;
}

extern "C" int emf_window_bits(const uint8_t *coverage, const int64_t shape[3], const int64_t extent[3],
                               int64_t threshold, uint64_t *bits, int64_t words_per_row, int64_t *row_counts,
                               int64_t *max_count) {
    const int64_t pz = shape[0] - extent[0] + 1, py = shape[1] - extent[1] + 1, px = shape[2] - extent[2] + 1;
    std::vector<int32_t> rows, plane, window;
    try {
        rows.resize(static_cast<size_t>(shape[1] * px));
        plane.resize(static_cast<size_t>(py * px));
        window.resize(static_cast<size_t>(py * px), 0);
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    const auto add = [&](int64_t z, int32_t sign) {
        plane_sums(coverage, shape, extent, z, rows.data(), plane.data());
        for (int64_t i = 0; i < py * px; ++i) window[i] += sign * plane[i];
    };
    for (int64_t z = 0; z < extent[0]; ++z) add(z, 1);
    int64_t best = 0;
    for (int64_t cz = 0; cz < pz; ++cz) {
        if (cz > 0) {
            add(cz - 1, -1);
            add(cz + extent[0] - 1, 1);
        }
        for (int64_t y = 0; y < py; ++y) {
            const int64_t row = cz * py + y;
            uint64_t *words = bits + row * words_per_row;
            std::fill(words, words + words_per_row, uint64_t{0});
            const int32_t *sums = window.data() + y * px;
            int64_t count = 0;
            for (int64_t x = 0; x < px; ++x) {
                const int64_t sum = sums[x];
                best = std::max(best, sum);
                if (sum >= threshold) {
                    words[x >> 6] |= uint64_t{1} << (x & 63);
                    ++count;
                }
            }
            row_counts[row] = count;
        }
    }
    *max_count = best;
    return EMF_OK;
}

extern "C" void emf_select_bits(const uint64_t *bits, int64_t words_per_row, const int64_t *rows,
                                const int64_t *ranks, int64_t n, int64_t *out) {
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t *words = bits + rows[i] * words_per_row;
        int64_t rank = ranks[i];
        out[i] = -1;
        for (int64_t w = 0; w < words_per_row; ++w) {
            const int ones = popcount(words[w]);
            if (rank >= ones) {
                rank -= ones;
                continue;
            }
            uint64_t word = words[w];
            for (int64_t k = 0; k < rank; ++k) word &= word - 1; /* drop the lowest set bits before ours */
            int bit = 0;
            while (!((word >> bit) & 1)) ++bit;
            out[i] = w * 64 + bit;
            break;
        }
    }
}
