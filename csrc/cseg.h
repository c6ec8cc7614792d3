/* Decoding neuroglancer's compressed_segmentation chunk encoding: the encoding of precomputed segmentations that
 * cloud-volume writes (gzipped, by default, into <chunk>.gz files, which tensorstore does not read locally).
 *
 * The format (neuroglancer's sliceview/compressed_segmentation/README.md, multi-channel as precomputed stores it):
 * the chunk starts with one little-endian uint32 per channel, the offset of that channel's data in 32-bit words from
 * the chunk's start. A channel's data begins with a 64-bit header per block of the block grid (x fastest): 24 bits
 * lookup table offset, 8 bits encoded bits (0, 1, 2, 4, 8, 16 or 32), 32 bits encoded values offset, both offsets in
 * words from the channel's start. A voxel's table index is `encoded bits` wide, at bit encodedBits * (x + bx * (y +
 * by * z)) of the block's values (little-endian words, blocks padded to the whole block size); the table holds
 * uint32 values, or uint64 ones as two words (low first).
 */
#ifndef EMFAST_CSEG_H
#define EMFAST_CSEG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What emf_decode_cseg found wrong with a chunk. */
typedef enum {
    EMF_CSEG_OK = 0,
    EMF_CSEG_OUTSIDE = 1, /* an offset, header, value or table entry lies beyond the chunk's words */
    EMF_CSEG_BITS = 2,    /* a block's encoded bits are not 0, 1, 2, 4, 8, 16 or 32 */
    EMF_CSEG_SIZE = 3     /* a size or block edge above EMF_CSEG_MAX_EDGE, or a block of more than 2^32 voxels */
} emf_cseg_status;

/* The largest chunk or block edge decoded: positions, bit offsets and the block grid then fit in 64 bits. */
#define EMF_CSEG_MAX_EDGE (1 << 21)

/* Decode the chunk of `words` 32-bit words at `data` (any alignment; little-endian) holding `channels` channels of
 * size[0] x size[1] x size[2] voxels (x, y, z) in blocks of block[0] x block[1] x block[2], into `out`: channels *
 * size[2] * size[1] * size[0] values (c, z, y, x order, x fastest), uint32 where value_words is 1, uint64 where 2.
 * Every offset and index is checked against `words` before it is read, and sizes before anything is decoded. On a
 * status other than EMF_CSEG_OK, `out` holds undefined values and *channel and *block_index say where (the
 * block's index in its channel's grid; -1 for the channel's header or sizes). */
emf_cseg_status emf_decode_cseg(const void *data, int64_t words, const int64_t size[3], const int64_t block[3],
                                int64_t channels, int value_words, void *out, int64_t *channel, int64_t *block_index);

#ifdef __cplusplus
}
#endif

#endif
