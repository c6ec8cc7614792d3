/* Philox4x64-10 counter-based random numbers (Salmon et al., SC'11), the generator NumPy ships as
 * numpy.random.Philox: every block of four 64-bit outputs is a pure function of a 128-bit key and a 256-bit
 * counter, so any draw can be computed independently of all others, from any thread. */
#ifndef EMFAST_PHILOX_H
#define EMFAST_PHILOX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = Philox4x64-10(key, counter). */
void emf_philox4x64(const uint64_t key[2], const uint64_t counter[4], uint64_t out[4]);

/* out[n * draws + d], n < examples, d < draws: uniform doubles in [0, 1), 53 random bits each, from the block
 * Philox(key, counter = {d / 4, n, batch, stream_word}) element d % 4. */
void emf_uniform_batch(const uint64_t key[2], uint64_t batch, uint64_t stream_word, int64_t examples,
                       int64_t draws, double *out);

#ifdef __cplusplus
}
#endif

#endif
