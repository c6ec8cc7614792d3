/* Boundary growing; see grow.h for the contract. One pass per offset of the ball, over whole rows, marks the voxels
 * that see another label; a last pass sets them to background. */
#include "grow.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

namespace {

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

template <typename T>
void grow_patch(T *labels, const uint8_t *known, const int64_t n[3], const std::vector<Offset> &offsets,
                T background, std::vector<uint8_t> &seen) {
    const int64_t plane = n[1] * n[2], size = n[0] * plane;
    std::fill(seen.begin(), seen.end(), 0);
    for (const Offset &d : offsets) {
        const int64_t step = d[0] * plane + d[1] * n[2] + d[2];
        const int64_t z0 = std::max<int64_t>(0, -d[0]), z1 = std::min(n[0], n[0] - d[0]);
        const int64_t y0 = std::max<int64_t>(0, -d[1]), y1 = std::min(n[1], n[1] - d[1]);
        const int64_t x0 = std::max<int64_t>(0, -d[2]), x1 = std::min(n[2], n[2] - d[2]);
        for (int64_t z = z0; z < z1; ++z) {
            for (int64_t y = y0; y < y1; ++y) {
                const int64_t row = z * plane + y * n[2];
                const T *here = labels + row, *there = labels + row + step;
                uint8_t *mark = seen.data() + row;
                if (known == nullptr) {
                    for (int64_t x = x0; x < x1; ++x) mark[x] |= static_cast<uint8_t>(here[x] != there[x]);
                } else {
                    const uint8_t *counts = known + row + step;
                    for (int64_t x = x0; x < x1; ++x)
                        mark[x] |= static_cast<uint8_t>((here[x] != there[x]) & (counts[x] != 0));
                }
            }
        }
    }
    for (int64_t i = 0; i < size; ++i)
        if (seen[static_cast<size_t>(i)] && (known == nullptr || known[i])) labels[i] = background;
}

template <typename T>
int grow_typed(T *labels, const uint8_t *known, int64_t count, const int64_t shape[3], int64_t steps, bool in_plane,
               T background) {
    const int64_t size = shape[0] * shape[1] * shape[2];
    try {
        const std::vector<Offset> offsets = ball(steps, in_plane);
        std::vector<uint8_t> seen(static_cast<size_t>(size));
        for (int64_t n = 0; n < count; ++n)
            grow_patch(labels + n * size, known == nullptr ? nullptr : known + n * size, shape, offsets, background,
                       seen);
    } catch (const std::bad_alloc &) {
        return EMF_NO_MEMORY;
    }
    return EMF_OK;
}

}  // namespace

extern "C" {

int emf_grow_boundary(void *labels, int itemsize, const uint8_t *known, int64_t count, const int64_t shape[3],
                      int64_t steps, int in_plane, uint64_t background) {
    switch (itemsize) {
        case 4:
            return grow_typed(static_cast<uint32_t *>(labels), known, count, shape, steps, in_plane != 0,
                              static_cast<uint32_t>(background));
        case 8:
            return grow_typed(static_cast<uint64_t *>(labels), known, count, shape, steps, in_plane != 0,
                              static_cast<uint64_t>(background));
        default: return EMF_BAD_DTYPE;
    }
}

}  // extern "C"
