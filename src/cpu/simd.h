/* What the SIMD kernel files (qmatvec.c, kvquant.c) share: whether x86
 * intrinsics are available, and the inlining/unrolling they rely on. */
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

#endif
