/* Boundary growing; see grow.h for the contract. Two ways to find the voxels that see another label within the
 * ball of `steps` steps (the cross added to itself `steps` times): a small ball is walked offset by offset, one pass
 * over the patch each, marking the voxels whose neighbour there differs; a larger one spreads the lowest and
 * highest known label of each voxel's cross `steps` times (passes that do not grow with the ball), in place with
 * copies of the two planes a pass still needs, and a voxel whose lowest or highest differs from its own label sees
 * another. */
#include "grow.h"
#include "vector.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

namespace {

/* Balls of at most this many offsets are walked pair by pair (steps up to 3 in 3-D, 6 in plane); larger ones are
 * spread. Measured on a (32, 128, 128) window: a pair costs about 0.16 ms (0.32 without AVX2), spreading about
 * 3 + 1.2 ms per step (5.5 + 1.6); walking 3-D steps 4 (64 pairs) costs about as much as spreading. */
constexpr size_t kLargestWalkedBall = 96;

using Offset = std::array<int64_t, 3>;

/* Offsets d != 0 with |dz| + |dy| + |dx| <= steps (dz = 0 in plane). */
std::vector<Offset> ball(int64_t steps, bool in_plane) {
    std::vector<Offset> offsets;
    const int64_t reach_z = in_plane ? 0 : steps;
    for (int64_t dz = -reach_z; dz <= reach_z; ++dz)
        for (int64_t dy = -steps; dy <= steps; ++dy)
            for (int64_t dx = -steps; dx <= steps; ++dx)
                if ((dz || dy || dx) && std::llabs(dz) + std::llabs(dy) + std::llabs(dx) <= steps)
                    offsets.push_back({dz, dy, dx});
    return offsets;
}

/* seen[v] = 1 where a known voxel v + d, d in `offsets`, inside the patch has another label than v. The ball is
 * symmetric: each pair (v, v + d) is compared once, for the offsets d after 0 in (z, y, x) order, and marks both. */
template <typename T>
void walk_ball(const T *labels, const uint8_t *known, const int64_t n[3], const std::vector<Offset> &offsets,
               uint8_t *seen) {
    const int64_t plane = n[1] * n[2];
    std::fill(seen, seen + n[0] * plane, uint8_t(0));
    for (const Offset &d : offsets) {
        if (d < Offset{0, 0, 0}) continue;  /* its pair is compared from the other end */
        const int64_t step = d[0] * plane + d[1] * n[2] + d[2];
        const int64_t z0 = std::max<int64_t>(0, -d[0]), z1 = std::min(n[0], n[0] - d[0]);
        const int64_t y0 = std::max<int64_t>(0, -d[1]), y1 = std::min(n[1], n[1] - d[1]);
        const int64_t x0 = std::max<int64_t>(0, -d[2]), x1 = std::min(n[2], n[2] - d[2]);
        for (int64_t z = z0; z < z1; ++z) {
            for (int64_t y = y0; y < y1; ++y) {
                const int64_t row = z * plane + y * n[2];
                const T *here = labels + row, *there = labels + row + step;
                uint8_t *mark = seen + row, *mark_there = seen + row + step;
                if (known == nullptr) {
                    for (int64_t x = x0; x < x1; ++x) {
                        const uint8_t other = static_cast<uint8_t>(here[x] != there[x]);
                        mark[x] |= other;
                        mark_there[x] |= other;
                    }
                } else {
                    const uint8_t *counts = known + row, *counts_there = known + row + step;
                    for (int64_t x = x0; x < x1; ++x) {
                        const uint8_t other = static_cast<uint8_t>(here[x] != there[x]);
                        mark[x] |= other & static_cast<uint8_t>(counts_there[x] != 0);
                        mark_there[x] |= other & static_cast<uint8_t>(counts[x] != 0);
                    }
                }
            }
        }
    }
}

/* Scratch of one patch for spreading: the lowest and highest labels seen, and copies of their previous and current
 * planes. */
template <typename T>
struct Spread {
    std::vector<T> low, high, planes;

    Spread(int64_t size, int64_t plane)
        : low(static_cast<size_t>(size)), high(static_cast<size_t>(size)), planes(static_cast<size_t>(4 * plane)) {}
};

/* The rows a voxel's cross reaches, as pointers to its element x: an absent neighbour row (outside the patch, or
 * across z in plane) is the voxel's own row again, which changes no minimum or maximum. */
template <typename T>
struct CrossRows {
    const T *here, *up, *down, *before, *after;
};

/* out[x] = the extreme (min with kLow, else max) of a row's cross at x: one loop, every neighbour read once. */
template <typename T, bool kLow>
inline void extreme_row(const CrossRows<T> &r, int64_t nx, T *__restrict out) {
    auto pick = [](T a, T b) { return kLow ? std::min(a, b) : std::max(a, b); };
    auto column = [&](int64_t x) {
        return pick(pick(pick(r.here[x], r.up[x]), pick(r.down[x], r.before[x])), r.after[x]);
    };
    if (nx == 1) {
        out[0] = column(0);
        return;
    }
    out[0] = pick(column(0), r.here[1]);
    for (int64_t x = 1; x + 1 < nx; ++x) out[x] = pick(column(x), pick(r.here[x - 1], r.here[x + 1]));
    out[nx - 1] = pick(column(nx - 1), r.here[nx - 2]);
}

/* One pass: low[v] = min of low over v and its cross neighbours inside the patch (in plane: y and x only), high
 * likewise with max, from the values before the pass. Planes z - 1 and z are read from copies; plane z + 1 is
 * read where it lies, not yet changed. */
template <typename T>
void spread_once(Spread<T> &s, const int64_t n[3], bool in_plane) {
    const int64_t plane = n[1] * n[2], nx = n[2];
    T *before_low = s.planes.data(), *here_low = before_low + plane;
    T *before_high = here_low + plane, *here_high = before_high + plane;
    for (int64_t z = 0; z < n[0]; ++z) {
        T *low = s.low.data() + z * plane, *high = s.high.data() + z * plane;
        std::memcpy(here_low, low, static_cast<size_t>(plane) * sizeof(T));
        std::memcpy(here_high, high, static_cast<size_t>(plane) * sizeof(T));
        const bool has_before = !in_plane && z > 0, has_after = !in_plane && z + 1 < n[0];
        for (int64_t y = 0; y < n[1]; ++y) {
            const int64_t row = y * nx, up = y > 0 ? row - nx : row, down = y + 1 < n[1] ? row + nx : row;
            const CrossRows<T> lows{here_low + row, here_low + up, here_low + down,
                                    has_before ? before_low + row : here_low + row,
                                    has_after ? low + plane + row : here_low + row};
            const CrossRows<T> highs{here_high + row, here_high + up, here_high + down,
                                     has_before ? before_high + row : here_high + row,
                                     has_after ? high + plane + row : here_high + row};
            extreme_row<T, true>(lows, nx, low + row);
            extreme_row<T, false>(highs, nx, high + row);
        }
        std::swap(before_low, here_low);
        std::swap(before_high, here_high);
    }
}

/* seen[v] = 1 where a known voxel within `steps` steps of v has another label than v, by spreading. */
template <typename T>
void spread(const T *labels, const uint8_t *known, const int64_t n[3], int64_t steps, bool in_plane, Spread<T> &s,
            uint8_t *seen) {
    const int64_t size = n[0] * n[1] * n[2];
    for (int64_t i = 0; i < size; ++i) { /* an unknown voxel offers nothing: the identity of min and of max */
        const bool counted = known == nullptr || known[i];
        s.low[static_cast<size_t>(i)] = counted ? labels[i] : std::numeric_limits<T>::max();
        s.high[static_cast<size_t>(i)] = counted ? labels[i] : T(0);
    }
    for (int64_t step = 0; step < steps; ++step) spread_once(s, n, in_plane);
    for (int64_t i = 0; i < size; ++i)
        seen[i] = static_cast<uint8_t>(s.low[static_cast<size_t>(i)] != labels[i] ||
                                       s.high[static_cast<size_t>(i)] != labels[i]);
}

template <typename T>
int grow_typed(T *labels, const uint8_t *known, int64_t count, const int64_t shape[3], int64_t steps, bool in_plane,
               T background) {
    const int64_t size = shape[0] * shape[1] * shape[2];
    try {
        const std::vector<Offset> offsets = ball(steps, in_plane);
        const bool walked = offsets.size() <= kLargestWalkedBall;
        std::vector<uint8_t> seen(static_cast<size_t>(size));
        Spread<T> scratch(walked ? 0 : size, walked ? 0 : shape[1] * shape[2]);
        for (int64_t n = 0; n < count; ++n) {
            T *patch = labels + n * size;
            const uint8_t *counted = known == nullptr ? nullptr : known + n * size;
            if (walked)
                walk_ball(patch, counted, shape, offsets, seen.data());
            else
                spread(patch, counted, shape, steps, in_plane, scratch, seen.data());
            for (int64_t i = 0; i < size; ++i)
                if (seen[static_cast<size_t>(i)] && (counted == nullptr || counted[i])) patch[i] = background;
        }
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

/* The comparisons of 64-bit labels vectorise with AVX2 (a 64-bit compare SSE2 lacks): 1.5x on a demo window. */
emf_vector::Avx2Switch avx2_switch;

#ifdef EMF_HAVE_AVX2_BUILD
template <typename T>
EMF_AVX2_BUILD int grow_avx2(T *labels, const uint8_t *known, int64_t count, const int64_t shape[3], int64_t steps,
                             bool in_plane, T background) {
    return grow_typed(labels, known, count, shape, steps, in_plane, background);
}
#endif

template <typename T>
int grow_chosen(T *labels, const uint8_t *known, int64_t count, const int64_t shape[3], int64_t steps, bool in_plane,
                T background) {
#ifdef EMF_HAVE_AVX2_BUILD
    if (avx2_switch.used()) return grow_avx2(labels, known, count, shape, steps, in_plane, background);
#endif
    return grow_typed(labels, known, count, shape, steps, in_plane, background);
}

}  // namespace

extern "C" {

void emf_grow_allow_avx2(int allowed) { avx2_switch.allow(allowed); }

int emf_grow_uses_avx2(void) {
#ifdef EMF_HAVE_AVX2_BUILD
    return avx2_switch.used();
#else
    return 0;
#endif
}

int emf_grow_boundary(void *labels, int itemsize, const uint8_t *known, int64_t count, const int64_t shape[3],
                      int64_t steps, int in_plane, uint64_t background) {
    switch (itemsize) {
        case 4:
            return grow_chosen(static_cast<uint32_t *>(labels), known, count, shape, steps, in_plane != 0,
                               static_cast<uint32_t>(background));
        case 8:
            return grow_chosen(static_cast<uint64_t *>(labels), known, count, shape, steps, in_plane != 0,
                               static_cast<uint64_t>(background));
        default: return EMF_BAD_DTYPE;
    }
}

}  // extern "C"
