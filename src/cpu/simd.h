/* What the SIMD kernel files (qmatvec.c, kvquant.c) share: whether x86
 * intrinsics are available, the per-function target attributes of each
 * instruction set (the build has no -march flag), the inlining/unrolling
 * they rely on, and small helpers. */
#ifndef TERN_CPU_SIMD_H
#define TERN_CPU_SIMD_H

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define TERN_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define TERN_X86 0
#endif

#define INLINE static inline __attribute__((always_inline))
/* Full unrolling of the loops over tokens / queries is what lets the
 * per-token accumulator arrays live in registers; -O2 alone leaves loops
 * of 5..8 iterations rolled and the arrays on the stack. */
#define UNROLL _Pragma("GCC unroll 8")

#if TERN_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* The sum of 8 lanes (AVX-512 has _mm512_reduce_add_ps for 16). */
AVX2 INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
