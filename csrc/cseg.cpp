/* Decoding neuroglancer's compressed_segmentation chunk encoding; contract in cseg.h. */
#include "cseg.h"

#include <cstring>

namespace {

/* Word `index` of the chunk, whatever its alignment in memory (a file's bytes, a decompressed buffer). */
inline uint32_t word_at(const unsigned char *data, int64_t index) {
    const unsigned char *p = data + 4 * index;
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
           static_cast<uint32_t>(p[3]) << 24;
}

inline bool valid_bits(uint32_t bits) {
    return bits == 0 || bits == 1 || bits == 2 || bits == 4 || bits == 8 || bits == 16 || bits == 32;
}

/* One block's voxels inside the chunk, from origin (x, y, z) with extent[3] voxels, into the channel's output. */
template <typename Value>
emf_cseg_status decode_block(const unsigned char *data, int64_t words, int64_t base, int64_t header,
                             const int64_t origin[3], const int64_t extent[3], const int64_t size[3],
                             const int64_t block[3], Value *out) {
    constexpr int64_t kValueWords = sizeof(Value) / 4;
    const uint32_t first = word_at(data, header), second = word_at(data, header + 1);
    const int64_t table = base + (first & 0xffffffu), values = base + second;
    const uint32_t bits = first >> 24;
    if (!valid_bits(bits))
        return EMF_CSEG_BITS;
    const uint32_t mask = bits == 32 ? 0xffffffffu : (1u << bits) - 1u;
    /* the last value word these voxels read and the table's first entry, checked once; each table index as read */
    const int64_t last_position = (extent[0] - 1) + block[0] * ((extent[1] - 1) + block[1] * (extent[2] - 1));
    if ((bits != 0 && values + (static_cast<int64_t>(bits) * last_position + bits + 31) / 32 > words) ||
        table + kValueWords > words)
        return EMF_CSEG_OUTSIDE;
    const int64_t entries = (words - table) / kValueWords;
    for (int64_t z = 0; z < extent[2]; ++z) {
        for (int64_t y = 0; y < extent[1]; ++y) {
            Value *row = out + ((origin[2] + z) * size[1] + origin[1] + y) * size[0] + origin[0];
            const int64_t position = block[0] * (y + block[1] * z);
            for (int64_t x = 0; x < extent[0]; ++x) {
                uint32_t index = 0;
                if (bits != 0) {
                    const int64_t bit = static_cast<int64_t>(bits) * (position + x);
                    index = (word_at(data, values + bit / 32) >> (bit % 32)) & mask;
                }
                if (index >= entries)
                    return EMF_CSEG_OUTSIDE;
                const int64_t entry = table + static_cast<int64_t>(index) * kValueWords;
                Value value = word_at(data, entry);
                if constexpr (kValueWords == 2)
                    value |= static_cast<Value>(word_at(data, entry + 1)) << 32;
                row[x] = value;
            }
        }
    }
    return EMF_CSEG_OK;
}

template <typename Value>
emf_cseg_status decode(const unsigned char *data, int64_t words, const int64_t size[3], const int64_t block[3],
                       int64_t channels, Value *out, int64_t *channel, int64_t *block_index) {
    *channel = 0;
    *block_index = -1;
    /* hostile sizes would overflow the positions and bit offsets below: refused first */
    for (int a = 0; a < 3; ++a)
        if (size[a] < 1 || block[a] < 1 || size[a] > EMF_CSEG_MAX_EDGE || block[a] > EMF_CSEG_MAX_EDGE)
            return EMF_CSEG_SIZE;
    if (block[0] * block[1] > (int64_t{1} << 32) / block[2])
        return EMF_CSEG_SIZE;
    int64_t grid[3];
    for (int a = 0; a < 3; ++a) grid[a] = (size[a] + block[a] - 1) / block[a];
    const int64_t blocks = grid[0] * grid[1] * grid[2], voxels = size[0] * size[1] * size[2];
    if (channels < 1 || channels > words)
        return EMF_CSEG_OUTSIDE;
    for (int64_t c = 0; c < channels; ++c) {
        *channel = c;
        *block_index = -1;
        const int64_t base = word_at(data, c);
        if (base > words || blocks > (words - base) / 2)
            return EMF_CSEG_OUTSIDE;
        int64_t origin[3], extent[3];
        for (int64_t gz = 0; gz < grid[2]; ++gz) {
            for (int64_t gy = 0; gy < grid[1]; ++gy) {
                for (int64_t gx = 0; gx < grid[0]; ++gx) {
                    const int64_t index = gx + grid[0] * (gy + grid[1] * gz), at[3] = {gx, gy, gz};
                    for (int a = 0; a < 3; ++a) {
                        origin[a] = at[a] * block[a];
                        extent[a] = size[a] - origin[a] < block[a] ? size[a] - origin[a] : block[a];
                    }
                    *block_index = index;
                    const emf_cseg_status status = decode_block(data, words, base, base + 2 * index, origin, extent,
                                                                size, block, out + c * voxels);
                    if (status != EMF_CSEG_OK)
                        return status;
                }
            }
        }
    }
    return EMF_CSEG_OK;
}

}  // namespace

extern "C" emf_cseg_status emf_decode_cseg(const void *data, int64_t words, const int64_t size[3],
                                           const int64_t block[3], int64_t channels, int value_words, void *out,
                                           int64_t *channel, int64_t *block_index) {
    const unsigned char *bytes = static_cast<const unsigned char *>(data);
    if (value_words == 2)
        return decode(bytes, words, size, block, channels, static_cast<uint64_t *>(out), channel, block_index);
    return decode(bytes, words, size, block, channels, static_cast<uint32_t *>(out), channel, block_index);
}
