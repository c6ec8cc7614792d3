/* AVX2 code beside the baseline, chosen at run time, so that wheels stay portable.
 *
 * EMF_AVX2 compiles one function for AVX2 alone (hand-written AVX2; the rest of the file keeps the baseline
 * target). EMF_AVX2_BUILD gives a whole kernel an AVX2 build: a wrapper `EMF_AVX2_BUILD int work_avx2(args)
 * { return work(args); }` has everything it calls inlined into it and compiled for AVX2, which suits loops
 * bound by arithmetic rather than memory (blending's products and divisions). It exists only where the baseline
 * does its floating-point arithmetic in SSE2 too (x86-64; not 32-bit x87 code, which rounds through 80 bits):
 * then both builds give the same bits, since vector and scalar IEEE operations round alike and no multiply and
 * add are fused (-ffp-contract=off; AVX2 has no FMA).
 *
 * Each module keeps an Avx2Switch: its entry points run the AVX2 code where used() says so, and its Python
 * module calls allow() once, at import, from the environment variable EMFAST_NO_AVX2 (the kernels never read
 * the environment).
 */
#ifndef EMFAST_VECTOR_H
#define EMFAST_VECTOR_H

#include <atomic>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define EMF_HAVE_AVX2 1
#define EMF_AVX2 __attribute__((target("avx2")))
#if defined(__x86_64__) || defined(__SSE2_MATH__)
#define EMF_HAVE_AVX2_BUILD 1
#define EMF_AVX2_BUILD __attribute__((target("avx2"), flatten))
#endif
#endif

namespace emf_vector {

class Avx2Switch {
  public:
    void allow(int allowed) { allowed_.store(allowed != 0, std::memory_order_relaxed); }

    /* Whether the AVX2 code runs: compiled in, allowed, and supported by this CPU. */
    bool used() const {
#ifdef EMF_HAVE_AVX2
        return allowed_.load(std::memory_order_relaxed) && __builtin_cpu_supports("avx2");
#else
        return false;
#endif
    }

  private:
    std::atomic<int> allowed_{1};
};

}  // namespace emf_vector

#endif
